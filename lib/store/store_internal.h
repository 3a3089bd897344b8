/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tiered store internals. One mutex (zo_store.lock) guards every field
 * below except the event queue; completion callbacks (aio engine threads,
 * device stream threads) only push events, and the mover thread applies
 * them under the lock. Not installed.
 *
 * Copies and versions: a tensor's data has a version (cur_ver, bumped by
 * every write acquire and every write stream). A copy holds the version it
 * was loaded or written with; it is *current* when resident with
 * ver == cur_ver. The home copy always exists; a non-home copy newer than
 * the home copy is dirty and is written back before its space is reused.
 */
#ifndef ZO_STORE_INTERNAL_H
#define ZO_STORE_INTERNAL_H

#ifndef ZO_MODULE
#define ZO_MODULE "store"
#endif

#include <pthread.h>
#include <stdbool.h>

#include "core/internal.h"
#include "core/extent.h"
#include "core/list.h"
#include "dev/fence.h"

#include <zoffload/dev.h>
#include <zoffload/store.h>
#include <zoffload/swap.h>

#define ZO__NTIERS ZO_TIER_COUNT
#define ZO__DIRECT_PIECE (16u << 20) /* piece of a transfer that needs no slot */
#define ZO__DIRECT_INFLIGHT 4u       /* such pieces in flight per transfer */
#define ZO__DIST_INF UINT64_MAX
/* Prefetch loads in flight per tier: the nearest entry first gets the
 * disk's bandwidth, the next one queued behind it keeps the device busy. */
#define ZO__PREFETCH_INFLIGHT (8u << 20)

typedef struct zo__job zo__job;
typedef struct zo__piece zo__piece;

/* The copy state machine (docs/store.md, "Copy states"). A copy's state
 * changes in one place, zo__copy_to(), which checks the transition against
 * this table and counts an illegal one (zo_store.bad_transitions, which the
 * tests require to stay 0):
 *
 *   from \ to   ABSENT  LOADING  RESIDENT  WRITEBACK  RECEIVING
 *   ABSENT        -       load     discard      .          .
 *   LOADING     failed     .       landed       .          .
 *   RESIDENT    freed  reload(1)  rewrite(2)  wb start  wb lands (home)
 *   WRITEBACK     .        .      wb done       .          .
 *   RECEIVING     .        .      wb done       .          .
 *
 * (1) a stale copy's space is reused for a load of the current version;
 * (2) a discard acquire or a write takes the copy in place (new version).
 * ABSENT: no data (it may hold space for a moment, between zo__store_space
 * and the next transition). LOADING: a load fills it with version `ver`;
 * nothing reads it. RESIDENT: holds version `ver`, readable. WRITEBACK: a
 * non-home copy being written home: readable, not freed, not rewritten.
 * RECEIVING: the home copy a write-back lands in: not readable until it
 * lands. Counters beside the state: refs (acquires), readers (transfers and
 * streams reading it, a write-back included), waiters / parked (acquires
 * not complete yet); flags: write_held, wb_wanted, drop_after, prefetched. */
typedef enum zo__copy_state {
    ZO__CS_ABSENT = 0,
    ZO__CS_LOADING,
    ZO__CS_RESIDENT,
    ZO__CS_WRITEBACK,
    ZO__CS_RECEIVING,
    ZO__CS_COUNT
} zo__copy_state;

typedef struct zo__copy {
    zo__copy_state state; /* change only through zo__copy_to() */
    uint64_t off, len;   /* extent in the tier arena (device/host tiers) */
    uint8_t *ptr;        /* arena base + off */
    uint64_t ver;        /* version held (RESIDENT, WRITEBACK), being loaded (LOADING) or replaced (RECEIVING) */
    unsigned refs;       /* references taken by acquires */
    unsigned readers;    /* transfers reading this copy */
    int write_held;      /* acquired with WRITE; until the last reference goes */
    int wb_wanted;       /* write back once the write hold ends */
    int drop_after;      /* free once unreferenced and no longer read */
    int prefetched;      /* loaded by prefetch and not used yet */
    int wb_fail;         /* the last write-back from this copy failed with this error (0: none) */
    uint64_t wb_fail_round; /* tier's space round of that failure: eviction skips it in that round */
    uint64_t lru;        /* tick of the last acquire */
    /* The current hold (refs > 0) in the trace (trace.c): the record
     * entry of its latest acquire (the entries link back to the hold's
     * earlier ones), and the trace position its first acquire matched;
     * valid while hold_epoch == zo_store.trace_epoch */
    uint32_t rec_last, hold_tpos;
    uint64_t hold_epoch;
    unsigned waiters;    /* acquires waiting on this copy (on wq), not parked */
    unsigned parked;     /* acquires of this copy parked in the tier's space queue */
    zo_list wq;          /* those waiting on it (zo_store_req.link), in arrival order */
    zo_list lnode;       /* on the tier's list of non-home copies (zo__tier.lru) */
    struct zo_tensor *owner;
} zo__copy;

struct zo_tensor {
    char *name;
    zo_tensor_desc desc;
    uint64_t bytes;
    zo_tier home;
    zo__copy c[ZO__NTIERS];
    zo_swap_id sid;      /* home NVMe allocation */
    uint64_t nvme_len;   /* bytes charged to the NVMe budget */
    uint64_t cur_ver;
    unsigned streams;    /* streams open on it */
    int stream_write;    /* a write stream is open */
    int dying;           /* being unregistered: no new transfers */
    unsigned ckpt_pins;  /* in a checkpoint being written: unregister refuses it (-EBUSY) */
    int restoring;       /* in a restore: unregister refuses it, a checkpoint too */
    unsigned wb_count;   /* write-backs in flight (flush waits) */
    int wb_err;          /* first write-back error since the last flush */
    char wb_detail[ZO_ERRMSG_LEN];
    char wb_fail_detail[ZO_ERRMSG_LEN]; /* why the last write-back failed (copy's wb_fail) */
    uint64_t plan_mark;  /* placement planning: counted once (space.c, coheld_need) */
    uint32_t *tpos;      /* positions in the trace, ascending */
    size_t ntpos, captpos;
    struct zo_tensor *prev, *next; /* all tensors */
    struct zo_tensor *hnext; /* zo_store.htab chain */
    int listed;          /* registered (on zo_store.tensors), not just claimed */
};

/* An acquire (the public zo_store_req). */
struct zo_store_req {
    zo_tensor *t;
    zo_tier tier;
    unsigned flags;
    int done, err;
    void *ptr;
    int parked;          /* waiting for space in the tier */
    int demand;          /* counted as a miss that loads */
    zo_list link;        /* on its copy's wq, or parked on the tier's space queue */
    uint64_t visit;      /* zo__store_settle's pass that saw it last */
    char detail[ZO_ERRMSG_LEN];
};

/* Endpoint of a move. */
enum { EP_NVME = 0, EP_HOST = 1, EP_DEV = 2 };
typedef struct zo__ep {
    int kind;
    uint8_t *p;          /* host or device base */
    zo_swap_id sid;      /* NVMe */
    int fixed;           /* a slot: offsets do not apply */
} zo__ep;

enum { JOB_LOAD = 0, JOB_WRITEBACK = 1, JOB_STREAM = 2, JOB_SWEEP = 3 };

struct zo__job {
    zo_store *s;
    int kind;
    zo_tensor *t;
    zo_tier src, dst;    /* LOAD / WRITEBACK */
    uint64_t ver;
    zo__ep from, to;
    uint64_t r0, r1;     /* byte range of the tensor */
    uint64_t next_off;   /* next piece to start */
    size_t piece;        /* piece size */
    unsigned inflight, max_inflight;
    int via_slot;        /* two stages through a pool slot */
    int prefetch;
    uint64_t pf_bytes;   /* counted in the tier's prefetch_inflight */
    int err;
    char detail[ZO_ERRMSG_LEN];
    struct zo_store_stream *stream; /* JOB_STREAM */
    struct zo_store_sweep *sweep;   /* JOB_SWEEP (spiece: the frame) */
    unsigned spiece;     /* JOB_STREAM: index in the stream ring */
    int queued;          /* in a slot wait queue */
    zo_list qlink;       /* on zo_store.slotq[] */
};

struct zo__piece {
    zo__job *j;
    uint64_t off;
    size_t len;
    int slot;            /* -1: none */
    int stage, nstages;
    int err;
    zo_qnode qn;         /* on the mover's event, host-copy or fence queue (one at a time) */
    zo__fence *fence;    /* device move: done when this is */
    uint8_t *hdst;       /* host -> host move, run by the mover outside the store lock */
    const uint8_t *hsrc;
    size_t hlen;
    char detail[ZO_ERRMSG_LEN];
};

/* Stream ring entry */
enum { SP_FREE = 0, SP_LOADING, SP_READY, SP_HELD, SP_WRITING };
typedef struct zo__spiece {
    int state;
    int slot;
    uint64_t off;
    size_t len;
    int err;
} zo__spiece;

struct zo_store_stream {
    zo_store *s;
    zo_tensor *t;
    unsigned mode, depth, quota, using_;
    uint64_t r0, r1;
    size_t piece;
    zo_tier src;         /* READ source tier (current copy at open) */
    uint64_t src_ver;
    zo__spiece *ring;    /* quota entries */
    uint64_t next_load;  /* offset of the next piece to load */
    uint64_t next_hand;  /* offset of the next piece to hand out */
    unsigned held;
    unsigned busy;       /* pieces loading or writing */
    int err;
    char detail[ZO_ERRMSG_LEN];
    int internal;        /* opened by the store itself (read/write/checkpoint) */
    struct zo_store_stream *snext; /* the store's open streams */
};

typedef struct zo__tier {
    uint64_t budget, used, peak;
    zo__extalloc ext;     /* device/host: offsets into base */
    uint8_t *base;
    zo_list lru;          /* non-home copies with space, most recent last (zo__copy.lnode) */
    size_t ncopies;       /* on that list */
    zo_list parked;       /* acquires waiting for space, first come first served (zo_store_req.link) */
    uint64_t home_bytes;  /* held by home copies */
    uint64_t prefetched_bytes; /* copies loaded/loading by prefetch, unused */
    uint64_t prefetch_inflight; /* bytes of prefetch loads in flight */
    /* Bumped by every acquire and registration in the tier: a copy whose
     * write-back failed in the current round is not an eviction victim, so
     * a persistent I/O error fails the acquires waiting for space instead
     * of starting write-backs in a loop; the next caller tries once more. */
    uint64_t space_round;
} zo__tier;

/* An acquire of the trace, and how long the tensor stayed referenced: end
 * is the number of acquires recorded when its last reference went (the
 * entries in (this one, end) were acquired while it was held); 0: held
 * past the end of the iteration. While the hold lasts (record only), 0 or
 * ZO__END_LINK | the record entry of the hold's previous acquire. */
typedef struct zo__trace_ent {
    zo_tensor *t;
    zo_tier tier;
    uint32_t end;
} zo__trace_ent;
#define ZO__TPOS_NONE UINT32_MAX
#define ZO__END_LINK (UINT32_C(1) << 31) /* entries stay below it (TRACE_MAX) */

struct zo_store {
    zo_store_config cfg;
    pthread_mutex_t lock;
    pthread_cond_t cond;  /* requests done, stream progress, space, write-backs */
    zo_errbuf err;

    zo__tier tier[ZO__NTIERS];
    int have[ZO__NTIERS];
    zo_dev *dev;
    zo_stream *h2d, *d2h;
    /* Registration zeroes device-homed copies on a stream of its own: on
     * h2d its sync waited for every transfer queued there and could take
     * (and lose) the error of another piece's copy. One at a time. */
    zo_stream *zero;
    pthread_mutex_t zero_lock;
    zo_swap *swap;
    size_t chunk;         /* swap chunk size (0: no NVMe) */

    /* pool */
    uint8_t *pool;
    size_t slot_size;
    unsigned nslots, nfree, reserved, jobs_using;
    unsigned *free_slots;
    unsigned pool_peak, pool_in_use;
    zo_list slotq[2];     /* jobs waiting for a slot: demand, prefetch (zo__job.qlink) */
    struct zo_store_stream *streams; /* open streams */
    struct zo_store_sweep *sweeps;   /* open group sweeps (sweep.c) */

    /* tensors */
    zo_tensor *tensors;
    zo_tensor **htab;     /* names claimed, registered or being registered (registry.c) */
    size_t hcap, hcount;
    size_t ntensors;
    uint64_t tick;
    uint64_t settle_gen;  /* zo__store_settle passes */
    uint64_t bad_transitions; /* illegal copy state changes seen (tests: must stay 0) */
    int ckpt_active;
    /* tests: called by zo_store_write between its flush and its stream
     * open, without the lock (the window another writer can land in) */
    void (*write_hook)(zo_store *s, zo_tensor *t, void *user);
    void *write_hook_user;

    /* trace */
    zo_trace_mode trace_mode;
    zo__trace_ent *trace, *rec;
    size_t ntrace, nrec, caprec, captrace;
    size_t pos;
    int recording;
    uint64_t iter_mismatch;
    uint64_t trace_epoch; /* bumped when rec or pos start over (zo__copy.hold_epoch) */
    uint64_t plan_gen;    /* placement planning passes (zo_tensor.plan_mark) */

    /* jobs */
    unsigned jobs_active;

    /* mover */
    pthread_t mover;
    int mover_started, stop;
    pthread_mutex_t evlock;  /* guards the three queues and dev_ready */
    pthread_cond_t evcond;
    zo_queue evq;            /* pieces whose move completed (callbacks push them) */
    zo_queue hostq;          /* host -> host moves for the mover to run, unlocked */
    zo_queue devq[2];        /* device moves in flight, in stream order: h2d, d2h */
    int dev_ready;           /* a fence's notify: poll the fence queues now */

    zo_store_stats st;
};

/* copy.c: copy states, current copies, LRU lists, loads and write-backs */
/* The one place a copy changes state (table above). */
void zo__copy_to(zo_store *s, zo_tensor *t, zo_tier x, zo__copy_state to);
/* A transfer fills, reads or writes it (LOADING, WRITEBACK, RECEIVING). */
static inline int zo__copy_in_flight(const zo__copy *c)
{
    return c->state == ZO__CS_LOADING || c->state == ZO__CS_WRITEBACK || c->state == ZO__CS_RECEIVING;
}
/* Holds readable data of version c->ver. */
static inline int zo__copy_has_data(const zo__copy *c)
{
    return c->state == ZO__CS_RESIDENT || c->state == ZO__CS_WRITEBACK;
}
/* Anything keeps it: a transfer, a reference, a reader, an acquire pending. */
static inline int zo__copy_busy(const zo__copy *c)
{
    return zo__copy_in_flight(c) || c->refs || c->readers || c->waiters || c->parked;
}
/* Current data, or a load of the current data on its way. */
static inline int zo__copy_current_or_loading(const zo_tensor *t, zo_tier x)
{
    const zo__copy *c = &t->c[x];
    return (zo__copy_has_data(c) || c->state == ZO__CS_LOADING) && c->ver == t->cur_ver;
}
void zo__store_copy_free(zo_store *s, zo_tensor *t, zo_tier x);
int zo__store_current(const zo_tensor *t, zo_tier x);
/* The only current copy: freeing it would lose the data. */
int zo__store_sole_current(const zo_tensor *t, zo_tier x);
int zo__store_freshest(const zo_tensor *t, zo_tier *out);
/* t's copy in tier x goes to the tail (most recent) of the tier's LRU list. */
void zo__store_lru_append(zo__tier *tr, zo_tensor *t, zo_tier x);
/* Evict v's copy in tier x to make room (counted; a wasted prefetch too). */
void zo__store_evict(zo_store *s, zo_tensor *v, zo_tier x);
void zo__store_maybe_free(zo_store *s, zo_tensor *t, zo_tier x);
int zo__store_start_load(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, uint64_t dist);
int zo__store_start_writeback(zo_store *s, zo_tensor *t, zo_tier x, int drop);
zo__ep zo__store_ep(zo_store *s, zo_tensor *t, zo_tier x);

/* space.c: room for a copy in a tier (eviction windows, placement plans) */
int zo__store_space(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, uint64_t dist);

/* acquire.c: requests and what completes them; acquire / release / prefetch */
void zo__store_settle(zo_store *s, zo_tensor *t, zo_tier x);
void zo__store_retry_parked(zo_store *s);
void zo__store_job_done(zo_store *s, zo__job *j);

/* registry.c: the tensor registry */
/* Referenced, streamed, or a transfer of it in flight. */
int zo__tensor_busy(const zo_tensor *t);
/* Frees what zo_store_register allocated for t (NULL: nothing). */
void zo__tensor_free(zo_tensor *t);

/* mover.c */
int zo__mover_start(zo_store *s);
int zo__move(zo_store *s, zo__piece *p, const zo__ep *from, uint64_t foff, const zo__ep *to, uint64_t toff,
             size_t len);
void zo__mover_stop(zo_store *s);
zo__job *zo__job_new(zo_store *s, int kind, zo_tensor *t);
void zo__job_pump(zo_store *s, zo__job *j);
void zo__slots_pump(zo_store *s);
int zo__slot_take(zo_store *s);
void zo__slot_put(zo_store *s, int slot);
static inline uint8_t *zo__slot_ptr(zo_store *s, int slot)
{
    return s->pool + (size_t)slot * s->slot_size;
}

/* trace.c */
/* An acquire of t in tier x, before it takes its reference. */
void zo__trace_note(zo_store *s, zo_tensor *t, zo_tier x);
/* t's copy in tier x lost its last reference: the hold's entries end. */
void zo__trace_hold_end(zo_store *s, zo_tensor *t, zo_tier x);
/* How many entries trace entry q's tensor stays held from q on (>= 1). */
uint64_t zo__trace_hold_len(const zo_store *s, size_t q);
void zo__trace_pump(zo_store *s);
uint64_t zo__trace_dist(zo_store *s, const zo_tensor *t);
void zo__trace_forget_tensor(zo_store *s, zo_tensor *t);
void zo__trace_free(zo_store *s);

/* stream.c */
void zo__stream_piece_done(zo_store *s, zo__job *j);
void zo__streams_pump(zo_store *s);
/* Why t cannot be streamed with `mode` now (NULL: it can). *settling: a
 * write would have to wait for transfers of it in flight first. */
const char *zo__stream_claim_busy(zo_store *s, zo_tensor *t, unsigned mode, int *settling);
/* tests: see zo_store.write_hook (NULL: none) */
void zo__store_set_write_hook(zo_store *s, void (*fn)(zo_store *s, zo_tensor *t, void *user), void *user);

/* sweep.c */
void zo__sweep_piece_done(zo_store *s, zo__job *j);
void zo__sweeps_pump(zo_store *s);
/* Allocation granules of the tier arenas (zo_store_create) */
#define ZO__DEV_GRANULE 256u
#define ZO__HOST_GRANULE 4096u

#endif /* ZO_STORE_INTERNAL_H */
