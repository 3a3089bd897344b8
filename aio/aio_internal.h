/* SPDX-License-Identifier: Apache-2.0 */
/*
 * aio internals shared by the engine front (engine.c), the files (file.c)
 * and the two backends (uring.c, threads.c). Not installed. Tests reach the
 * fault-injection hook through zoffload_static_dep.
 *
 * The unit of I/O is a "piece": one contiguous part of a request that is
 * either fully direct (offset, length and buffer aligned for O_DIRECT) or
 * fully buffered. A request is cut into pieces at absolute block_size
 * boundaries; on a direct file an unaligned head and tail become pieces of
 * their own (shorter than the alignment). Pieces are claimed by the I/O
 * threads from one queue, run, and resumed until done or failed.
 */
#ifndef ZO_AIO_INTERNAL_H
#define ZO_AIO_INTERNAL_H

#ifndef ZO_MODULE
#define ZO_MODULE "aio"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/internal.h"
#include "core/list.h"

#include <zoffload/aio.h>

/* ---- files ---------------------------------------------------------------- */
struct zo_file {
    int fd;                 /* O_DIRECT descriptor when direct, else == bfd */
    int bfd;                /* buffered descriptor of the same open file */
    int direct;
    int readable, writable;
    uint32_t offset_align;  /* 1 when not direct */
    uint32_t mem_align;     /* 1 when not direct */
    uint64_t id;            /* unique for the process lifetime, never reused */
    char fallback[128];
    char path[];
};

/* Is [buf, buf+len) at off eligible for the O_DIRECT descriptor? */
static inline bool zo__file_direct_ok(const zo_file *f, uint64_t off, uint64_t len, const void *buf)
{
    return f->direct && (off & (f->offset_align - 1)) == 0 && (len & (f->offset_align - 1)) == 0 &&
           ((uintptr_t)buf & (f->mem_align - 1)) == 0;
}

/* engine.c: tell every live engine to drop f from its rings (file close). */
void zo__aio_forget_file(uint64_t file_id);

/* ---- requests ------------------------------------------------------------- */
enum { ZO__OP_READ = 0, ZO__OP_WRITE = 1 };

/* futex states of zo_aio_req.state */
enum { ZO__REQ_INFLIGHT = 0, ZO__REQ_WAITED = 1, ZO__REQ_DONE = 2 };

typedef struct zo__aio_region zo__aio_region;

struct zo_aio_req {
    zo_aio *a;
    zo_file *f;
    uint8_t *buf;
    uint64_t off, len;
    int op;
    int waitable;
    zo_aio_cb cb;
    void *user;
    zo__aio_region *region; /* fixed-buffer region holding the whole buffer, or NULL */
    uint64_t seq;           /* submission number */
    /* piece geometry (see zo__req_piece) */
    uint64_t head_end, body_end, body_base;
    uint64_t nhead, nbody, npieces;
    uint64_t next_piece;    /* next piece to claim; under a->qlock. On a->runq iff < npieces */
    zo_list qlink;          /* on a->runq (then a claimer's local drop list); under a->qlock */
    zo_list hlink;          /* on a->held (waitable requests); under a->qlock */
    _Atomic uint64_t pending; /* pieces not finished yet */
    _Atomic int error;        /* first error (0 = none); the winner writes detail */
    _Atomic int cancel;       /* zo_aio_cancel() was called */
    _Atomic uint32_t state;   /* ZO__REQ_* (futex word) */
    int64_t result;           /* valid once state == DONE */
    char detail[200];
};

/* One piece: what a backend runs. `done` grows as partial transfers land. */
typedef struct zo__aio_piece {
    zo_aio_req *req;
    uint64_t off;      /* file offset of the piece */
    uint8_t *buf;      /* buffer address of the piece */
    uint32_t len;      /* piece length */
    uint32_t done;     /* bytes transferred so far */
    uint32_t attempt;  /* submissions so far (0 before the first) */
    uint32_t eagain;   /* -EAGAIN results so far */
    uint32_t zero;     /* zero-byte write results so far */
    /* filled by zo__aio_piece_next() for the next attempt */
    int fd;            /* descriptor to use */
    int direct;        /* fd is the O_DIRECT one */
    uint32_t cur_len;  /* bytes to ask for in this attempt */
    int64_t forced;    /* fault injection: complete this attempt with this result (no I/O) when < 0 */
} zo__aio_piece;

/* ---- registered regions -------------------------------------------------------- */
#define ZO__AIO_MAX_REGIONS 256
#define ZO__AIO_BUF_SLOTS 1024            /* fixed-buffer table entries per ring */
#define ZO__AIO_BUF_SLOT_BYTES (1ull << 30) /* the kernel's limit per fixed buffer */

struct zo__aio_region {
    uint8_t *base;
    size_t len;
    unsigned slot0, nslots;   /* fixed-buffer table indices [slot0, slot0+nslots) */
    _Atomic unsigned refs;    /* requests using it (futex word) */
    unsigned rings_ok;        /* rings that registered it */
    uint8_t *ok;              /* per I/O thread: 1 if registered in its ring */
};

/* Fixed-buffer index for [buf, buf+len) inside region r as seen by ring
 * `ring`, or -1 (not registered there, or straddles two 1 GiB slots). */
static inline int zo__region_slot(const zo__aio_region *r, unsigned ring, const uint8_t *buf, uint32_t len)
{
    if (!r || !r->ok[ring])
        return -1;
    uint64_t a = (uint64_t)(buf - r->base), b = a + len - 1;
    if (a / ZO__AIO_BUF_SLOT_BYTES != b / ZO__AIO_BUF_SLOT_BYTES)
        return -1;
    return (int)(r->slot0 + a / ZO__AIO_BUF_SLOT_BYTES);
}

/* ---- fault injection (tests) ------------------------------------------------------ */
typedef struct zo__aio_fault_site {
    int op;                 /* ZO__OP_READ / ZO__OP_WRITE */
    const zo_file *file;
    uint64_t req_off, req_len; /* the whole request */
    uint64_t off;           /* this attempt: file offset */
    uint32_t len;           /* this attempt: length */
    uint32_t attempt;       /* 0 for a piece's first submission, then 1, 2... */
    int direct;             /* the attempt would go O_DIRECT */
} zo__aio_fault_site;

/* Called before every submission of every piece, on an I/O thread, by both
 * backends. Return 0 for no fault; 0 < n < len to make the attempt a real
 * transfer of only n bytes (a short result the engine must resume); a
 * negative error to complete the attempt with that result without any I/O
 * (io_uring still posts a real CQE, from a NOP). Must be thread-safe. */
typedef int64_t (*zo__aio_fault_fn)(void *user, const zo__aio_fault_site *s);

/* Install (fn NULL removes) the hook. Call while nothing is in flight. */
void zo__aio_set_fault(zo_aio *a, zo__aio_fault_fn fn, void *user);

/* Force "io_uring unusable" for engines created after this call (tests of
 * the AUTO fallback): reason NULL restores probing. */
void zo__aio_force_uring_unusable(const char *reason);

/* ---- backends ----------------------------------------------------------------------- */
typedef struct zo__aio_ops {
    const char *name;
    /* Start the I/O threads. On failure write why into a->info.fallback /
     * detail and return ZO_ENODEV (backend unusable) or another error. */
    int (*start)(zo_aio *a);
    /* n new pieces were queued: wake up to n idle threads. */
    void (*kick)(zo_aio *a, uint64_t n);
    /* Register r with every ring (sets r->ok[], r->rings_ok); returns the
     * first ring's error (0 if every ring took it). Blocks. */
    int (*register_region)(zo_aio *a, zo__aio_region *r);
    /* Drop r from every ring. Blocks. */
    void (*unregister_region)(zo_aio *a, zo__aio_region *r);
    /* Drop a closed file from every ring. May return before it is done. */
    void (*forget_file)(zo_aio *a, uint64_t file_id);
    /* Cancel what is in flight for requests with cancel set. */
    void (*cancel)(zo_aio *a);
    /* Stop: cancel everything, drain, join the threads, free the backend. */
    void (*stop)(zo_aio *a);
    /* Is the calling thread one of a's I/O threads? */
    int (*is_io_thread)(zo_aio *a);
} zo__aio_ops;

extern const zo__aio_ops zo__aio_uring_ops;  /* uring.c (ZO_HAVE_LIBURING) */
extern const zo__aio_ops zo__aio_threads_ops; /* threads.c */

/* Is io_uring usable here? 0, or ZO_ENODEV with why (uring.c). */
int zo__uring_probe(char *why, size_t len);

/* ---- the engine ------------------------------------------------------------------ */
struct zo_topo;

/* Name the calling I/O thread ("zo-<kind>-<idx>") and bind it to the
 * configured NUMA node. */
void zo__aio_thread_setup(zo_aio *a, unsigned idx, const char *kind);

typedef struct zo__aio_counters {
    _Atomic uint64_t reads, writes, bytes_read, bytes_written;
    _Atomic uint64_t chunks, fixed_chunks, direct_chunks, buffered_chunks;
    _Atomic uint64_t short_resumed, eagain_retried, errors, cancelled;
    _Atomic uint64_t regions_fallback;
} zo__aio_counters;

struct zo_aio {
    zo_aio_config cfg;
    const zo__aio_ops *ops;
    void *backend;           /* the backend's state */
    zo_aio_info info;

    /* run queue: requests with pieces not yet claimed */
    pthread_mutex_t qlock;
    zo_list runq;            /* zo_aio_req by qlink, in submission order */
    zo_list held;            /* zo_aio_req by hlink: waitable requests not yet released */
    _Atomic uint64_t queued; /* pieces not yet claimed (hint for sleepers) */
    _Atomic int stopping;
    uint64_t seq;            /* under qlock */

    /* requests in flight (futex word for zo_aio_wait_all) */
    _Atomic uint32_t outstanding;
    _Atomic uint32_t all_waiters;

    /* regions, sorted by base */
    pthread_rwlock_t rlock;
    zo__aio_region *regions[ZO__AIO_MAX_REGIONS];
    _Atomic unsigned nregions; /* written under rlock; peeked without it */
    uint8_t slot_used[ZO__AIO_BUF_SLOTS];
    pthread_mutex_t reg_serial; /* one register/unregister at a time */

    /* fire-and-forget errors, reported by zo_aio_wait_all() (eb has its own lock) */
    pthread_mutex_t elock;
    int ff_error;
    char ff_detail[ZO_ERRMSG_LEN];

    zo_errbuf eb;
    zo__aio_counters st;

    zo__aio_fault_fn fault;
    void *fault_user;
    struct zo_topo *topo;    /* only when cfg.numa_node >= 0 */

    zo_list live_link;       /* on the process-wide list of live engines */
};

/* Claim up to n pieces (into *out[0..n-1]); returns how many. Pieces of failed or cancelled requests are dropped (and their
 * requests completed) instead of being returned. */
unsigned zo__aio_claim(zo_aio *a, zo__aio_piece **out, unsigned n);

/* Prepare the next attempt of p: choose the descriptor (direct or
 * buffered) and length for what is left, run the fault hook (p->forced). */
void zo__aio_piece_next(zo_aio *a, zo__aio_piece *p);

/* Account the result of one attempt (bytes >= 0 or -errno). Returns 1 when
 * p must be submitted again (short transfer, -EAGAIN within bounds), 0 when
 * p is finished (done or failed): then call zo__aio_piece_finish(). */
int zo__aio_piece_result(zo_aio *a, zo__aio_piece *p, int64_t res);

/* The piece is finished: completes its request when it was the last. */
void zo__aio_piece_finish(zo_aio *a, zo__aio_piece *p);

/* Record err as p's request's error (first one wins) with a detail naming
 * file, offset and length. */
void zo__aio_piece_fail(zo_aio *a, zo__aio_piece *p, int err, const char *why);

/* Futex helpers. */
void zo__futex_wait(_Atomic uint32_t *w, uint32_t val);
void zo__futex_wake(_Atomic uint32_t *w, int n);

#endif /* ZO_AIO_INTERNAL_H */
