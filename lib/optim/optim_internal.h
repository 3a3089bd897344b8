/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal state of the offload optimizer engine (include/zoffload/optim.h).
 *
 * Threads: the caller's thread drives the engine (one at a time, the API's
 * contract); one worker thread runs the updates. Ownership between them:
 *  - the caller thread owns the intake window `win` (acc[win], arrivals[win],
 *    the d2h stream) and the counters only it changes (micro, boundaries);
 *  - while a job is queued or running, the worker owns acc[job.win],
 *    arrivals[job.win], pbuf[job.pbuf], the store tensors, the team, the h2d
 *    stream, and the counters the update changes (step, scaler...), which it
 *    publishes under `lock` when it finishes.
 */
#ifndef ZO_OPTIM_INTERNAL_H
#define ZO_OPTIM_INTERNAL_H

#define ZO_MODULE "optim"
#include "core/internal.h"

#include <pthread.h>
#include <stdatomic.h>

#include <zoffload/dev.h>
#include <zoffload/optim.h>
#include <zoffload/store.h>
#include <zoffload/swap.h>

#define ZO_OPTIM_NAME_MAX 200

/* FNV-1a over n bytes, continuing from h (the config fingerprints of optim.c and part.c). */
uint64_t zo__fnv1a(uint64_t h, const void *p, size_t n);

/* One tensor as the framework declared it: a range of the flat element space. */
typedef struct zo__ot {
    char *name;
    uint64_t numel;
    uint64_t off;   /* global flat element offset */
    unsigned group;
    void *dev;      /* device params the framework reads now (devb[dcur]), or NULL; caller's thread */
    /* the device param buffers: [0] the framework's (dev_params); [1] the
     * engine's second buffer under dpu_double_buffer, else [0] again. A job
     * writes devb[job.dbuf]; only the caller's thread reads `dev`. */
    void *devb[2];
} zo__ot;

/* A sub-group: the unit of the step; its states are store tensors. */
typedef struct zo__sg {
    unsigned group;
    uint64_t off; /* global flat element offset */
    uint64_t n;
    zo_tensor *t[ZO_OPTIM_STATE_COUNT]; /* NULL for a state the optimizer does not use */
} zo__sg;

typedef struct zo__og {
    zo_cpuadam_hparams hp;      /* what the update in flight uses (the worker's) */
    zo_cpuadam_hparams hp_next; /* set between steps; becomes hp when the next update starts */
    zo_optim_placement place;
    uint64_t sgsize;
    zo_dtype sdt;
    /* quantized m and v (zo_optim_group.state_bits): 0, 8 or 4; qblock
     * elements per scale. Each sub-group's state is then one U8 store
     * tensor: its codes, then (at zo__q_scale_off) its fp32 block scales,
     * so a sub-group's state is one extent (one read, one write). */
    int qbits;
    size_t qblock;
    zo_qmap qmap[ZO_OPTIM_STATE_COUNT]; /* with qbits: the code map of m and v (zo__q_default_maps(), or
                                           zo_optim_config's state_map_m / state_map_v) */
    unsigned first_tensor, ntensors;
    unsigned first_sg, nsg;
    uint64_t off, numel;
    int has_dev;
    int used[ZO_OPTIM_STATE_COUNT];
} zo__og;

/* A quantized state of n elements: code bytes, where its scales start
 * (64-byte aligned, for the kernel and for cache lines), its scales, and
 * the store tensor's bytes. */
static inline uint64_t zo__q_code_bytes(uint64_t n, int bits)
{
    return bits == 4 ? (n + 1) / 2 : n;
}
static inline uint64_t zo__q_scale_off(uint64_t n, int bits)
{
    return (zo__q_code_bytes(n, bits) + 63) & ~(uint64_t)63;
}
static inline uint64_t zo__q_nscales(uint64_t n, size_t block)
{
    return (n + block - 1) / block;
}
static inline uint64_t zo__q_bytes(uint64_t n, int bits, size_t block)
{
    return zo__q_scale_off(n, bits) + 4 * zo__q_nscales(n, block);
}
/* The code maps of m and v for `bits`. m: the signed dynamic map. v: for
 * q4 the unsigned dynamic map without its zero (Li et al. 2023's fix of
 * the "zero-point problem": with only 14 nonzero levels, the dynamic map
 * rounds every v below 0.16% of its block's absmax to exactly 0, and the
 * update of those weights is then rebuilt from one gradient; the finetune
 * run diverged from it, docs/cpuadam.md). Dynamic without zero rather than
 * linear without zero ((k + 1) / 16): both fixed the divergence; the
 * dynamic one keeps small v's precision, which cost nothing on finetune
 * and was closer to fp32 states on zo-train's two models, where (k + 1) /
 * 16 cost the small one 2.5% (docs/benchmarks.md). For q8 the unsigned dynamic map, whose
 * first level (3.25e-7 of absmax) leaves almost nothing at 0 (measured
 * too). `legacy`: the maps every quantized state used before (both
 * dynamic): what a checkpoint record without maps means. */
static inline void zo__q_default_maps(int bits, int legacy, zo_qmap map[ZO_OPTIM_STATE_COUNT])
{
    map[ZO_OPTIM_STATE_MASTER] = ZO_QMAP_COUNT; /* not quantized */
    map[ZO_OPTIM_STATE_EXP_AVG] = ZO_QMAP_DYNAMIC_SIGNED;
    map[ZO_OPTIM_STATE_EXP_AVG_SQ] = bits == 4 && !legacy ? ZO_QMAP_DYNAMIC_UNSIGNED_NZ : ZO_QMAP_DYNAMIC_UNSIGNED;
}

/* Which states zo_optim_config's state_map_m / state_map_v apply to: bit
 * 1 << ZO_OPTIM_STATE_EXP_AVG when a group with state_bits keeps m, 1 <<
 * ZO_OPTIM_STATE_EXP_AVG_SQ when one keeps v (Lion keeps no v). */
unsigned zo__q_map_users(const zo_optim_config *cfg);

/* cfg's state_map_m / state_map_v: in range, of their state's sign, and
 * set only where a quantized group uses them; else ZO_ECONFIG naming `fn`.
 * Also the partitioned engine's, on the whole model: a rank may own only
 * unquantized groups. */
int zo__optim_check_maps(const zo_optim_config *cfg, zo_errbuf *eb, const char *fn);

/* whether og's maps are the legacy ones (the record and the config
 * fingerprint then leave them out, as before maps could differ) */
static inline int zo__q_legacy_maps(const zo__og *og)
{
    return og->qmap[ZO_OPTIM_STATE_EXP_AVG] == ZO_QMAP_DYNAMIC_SIGNED &&
           og->qmap[ZO_OPTIM_STATE_EXP_AVG_SQ] == ZO_QMAP_DYNAMIC_UNSIGNED;
}

/* the code map of state k of group og */
static inline zo_qmap zo__q_map(const zo__og *og, int k)
{
    return og->qmap[k];
}

/* Test hook: 1 makes zo_optim_create() give quantized groups the legacy
 * maps, as a library before the zero-free v map did, so tests can write
 * checkpoints of the old format. */
extern int zo__optim_legacy_qmaps;

/* Test hook: the elements a resharded load of zo_part assembles at a time
 * (default 2^20; a multiple of ZO_QBLOCK_MAX, else the default), so tests
 * can split sub-groups into several tiles. */
extern uint64_t zo__part_reshard_tile;

/* Bytes of state k of n elements of group og (its store tensor). */
static inline uint64_t zo__state_bytes(const zo__og *og, int k, uint64_t n)
{
    if (k == ZO_OPTIM_STATE_MASTER)
        return n * 4;
    return og->qbits ? zo__q_bytes(n, og->qbits, og->qblock) : n * zo_dtype_size(og->sdt);
}

/* Worker state machine: one transition function, zo__wstate_set(). */
typedef enum zo__wstate {
    ZO__W_IDLE = 0,    /* no job; result (if any) collected */
    ZO__W_QUEUED = 1,  /* a job waits for the worker */
    ZO__W_RUNNING = 2, /* the worker runs it */
    ZO__W_DONE = 3,    /* finished; result not yet collected */
    ZO__W_EXIT = 4,    /* destroy asked the worker to leave */
} zo__wstate;

typedef struct zo__job {
    unsigned win;           /* accumulator window holding the gradients */
    unsigned pbuf;          /* parameter buffer the update writes */
    unsigned dbuf;          /* device param buffer (zo__ot.devb) the update writes */
    int delayed;            /* DPU: the update runs while the device computes the next step */
    int eager;              /* speculative, started by the last micro-step's first gradient */
    double scale;           /* loss scale the window's gradients carry */
    zo_optim_step_opts opts;
    uint64_t t_call;        /* when the boundary's step call came */
} zo__job;

/* Gradient statistics taken at intake, one set per accumulator window.
 * When every tensor overlapping a sub-group has got (and landed) its
 * gradient of the window's last micro-step, the sub-group's sum of squares
 * and inf/NaN count are computed at once, while the data is hot (and, with
 * a device, while backward goes on), with a team of the same thread count
 * and variant as the worker's: the same bits the step's own pass would
 * give, so the step reads them instead of re-reading the accumulators.
 * Sub-groups not complete at the step (a tensor got no gradient, or a
 * second one in the last micro-step) are computed by the step as before.
 * Under `lock`; landings are serial (the d2h stream's host functions, or
 * the caller's thread after it synced that stream). Reset by the worker
 * when it finishes the window (it owns the window then), by load, and at
 * create. The eager speculative step waits on `left` too. */
typedef struct zo__gst {
    uint32_t *tpend; /* per tensor: pieces of its last-micro-step gradient still landing */
    uint8_t *tfin;   /* per tensor: it got its last-micro-step gradient */
    unsigned *left;  /* per sub-group: overlapping tensors whose last gradient has not landed */
    uint8_t *ok;     /* per sub-group: sum / nf hold its statistics */
    uint8_t *bad;    /* per sub-group: a tensor got a second last-micro-step gradient: not cached */
    double *sum;
    uint64_t *nf;
    unsigned *done;  /* sub-groups in the order their last gradient landed (ndone of them) */
    unsigned ndone;
} zo__gst;

/* DeepSpeed's DynamicLossScaler state. */
typedef struct zo__scaler {
    int dynamic;
    double scale;
    int64_t cur_iter, last_overflow_iter;
    unsigned cur_hysteresis;
} zo__scaler;

struct zo_optim {
    zo_optim_config cfg; /* caller's config; groups/nvme_path pointers cleared */
    char *nvme_path;
    /* The detail of the driving thread's latest call: cleared as each call
     * of the driving thread begins (zo__enter), so a call that succeeds
     * leaves "" (zo_optim_errmsg()). The worker writes its own (werr); the
     * detail of a failed update is kept with its error (job_msg, under
     * lock) and becomes err's when the call that collects the error
     * returns it. */
    zo_errbuf err;
    zo_errbuf werr;
    char job_msg[ZO_ERRMSG_LEN];
    zo_dev *dev;
    zo_dtype pdt, gdt;
    size_t pes, ges;

    zo__og *groups;
    unsigned ngroups;
    zo__ot *tensors;
    unsigned nt;
    zo__sg *sgs;
    unsigned nsg;
    uint64_t numel;
    uint64_t fingerprint;
    uint64_t layout_fingerprint; /* the same without the state types: what a load across them checks */

    zo_swap *swap;
    int own_swap;
    zo_store *store;
    zo_cpuadam_team *team;
    zo_cpuadam_team *iteam; /* intake statistics: same thread count and variant as team */

    /* gradient intake */
    unsigned nwin;      /* 2 under DPU, else 1 */
    unsigned win;       /* window receiving gradients */
    /* the windows (window.c): wdt elements per param, fp32 or the gradients'
     * own bf16/fp16 without accumulation; spill[w][t]: tensor t's fp32
     * gradient when it did not fit a narrow window (NULL normally) */
    zo_dtype wdt;
    size_t wes;
    void *acc[2];
    int acc_pinned[2]; /* pinned: first gradients are copied into it by the device */
    float **spill[2];
    _Atomic unsigned nspill[2];
    _Atomic uint64_t spill_bytes;
    uint64_t win_bytes;  /* the windows' bytes (all of them) */
    uint32_t *arrivals[2];
    double win_scale[2];
    void *staging;
    size_t staging_bytes;
    int staging_pinned;
    /* Gradient copies are double-buffered: staging is two halves; chunk k
     * is copied into half k % 2 on d2h while chunk k - 1 is accumulated from
     * the other half on `land` (copied[b]: the copy into half b is done;
     * freed[b]: its accumulate is done, the half may be overwritten). */
    size_t stage_half;  /* bytes per half */
    unsigned stage_next; /* half the next chunk uses (caller thread) */
    uint64_t land_end;   /* when the latest accumulate ended (land stream only) */
    zo_stream *d2h, *land, *h2d;
    zo_event *ev_copied[2], *ev_freed[2], *ev_tail;
    zo_event *ev_direct; /* a direct piece copied (d2h), for the land stream to wait on */
    zo_event *ev_win[2];  /* recorded on `land` at the step call: every gradient of the window landed */
    _Atomic uint64_t d2h_ns[2], d2h_bytes[2];
    _Atomic uint64_t d2h_direct_bytes; /* since create: pieces the device copied into a pinned window */
    zo__gst gst[2];

    /* parameter buffers (param dtype, flat layout) */
    void *pbuf[2];
    int pbuf_pinned[2];
    unsigned npbuf;
    unsigned pcur;       /* buffer holding the latest applied update */
    /* host backend without DPU: "device" params are host memory, so the
     * fused kernel writes them itself instead of writing pbuf and copying
     * (the copy was 4 B/param of extra traffic on the same cores). pbuf is
     * then stale for tensors with device params until zo__pbuf_fresh(). */
    int direct;
    /* host backend: gradients are accumulated straight from "device"
     * memory (host memory) on the land stream, without the staging copy */
    int host_grads;
    /* per parameter buffer: the kernel wrote the device params instead
     * (direct); the worker sets pbuf_stale[job.pbuf], the caller reads the
     * one of a finished update */
    int pbuf_stale[2];
    int push_pending;    /* DPU (single buffer): pbuf[pcur] not yet copied to the device */
    /* dpu_double_buffer: the device params are double-buffered. An update
     * writes the buffer the device does not read (dcur ^ 1) as each piece
     * finishes, overlapped with the device's compute; collecting it makes
     * that buffer current (dcur flips, zo__ot.dev follows). */
    int dbl;
    unsigned dcur;       /* device buffer the next forward reads (caller's thread) */
    zo_event *ev_pdone[2]; /* recorded on h2d after the copies of the update that wrote devb[b] */
    int pdone_rec[2];
    int own_devb;        /* devb[1] are the engine's zo_dev_malloc() buffers */
    _Atomic int params_current;

    /* worker */
    pthread_t worker;
    int worker_started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    zo__wstate ws;
    zo__job job;
    int job_err;
    zo_optim_step_result job_res;
    int efd;

    /* counters (published under lock by the worker) */
    int64_t step;
    /* per tensor: updates applied to it (ZO_OPTIM_NO_GRAD_SKIP; under ZERO
     * every tensor has `step`, and this is not read). The worker changes it
     * at the end of an update; the caller's thread only between updates. */
    int64_t *tstep;
    uint64_t micro, boundaries, skipped, rollbacks;
    zo__scaler scaler;
    zo_optim_step_result last_res;
    int have_res;
    zo_optim_timeline tl;
    int have_tl;

    uint64_t pinned_bytes, host_bytes;
    /* the states are undefined (a ZO__FAILED_* reason, 0: they are not)
     * until a load or init_from_device succeeds: every call that would read
     * or build on them refuses with ZO_ESTATE (zo__failed_check) */
    _Atomic int failed;
    /* The masters start at zero, and a step on zero masters would write
     * updates of zero over the framework's parameters: per tensor, the
     * master elements set so far (saturating at numel) by
     * zo_optim_state_import(); init_from_device() and load set them all.
     * masters_unset counts the tensors not yet covered (caller's thread). */
    uint64_t *master_set;
    unsigned masters_unset;

    /* speculative step state (per sub-group) */
    unsigned *sg_list;       /* walk order scratch (worker) */
    double *sg_sumsq;        /* statistics per sub-group (worker) */
    uint64_t *sg_nf;
    uint8_t *sg_stats, *sg_updated;
    /* eager speculative step (speculative without DPU): sub-groups are
     * updated as the last micro-step's gradients complete them (gst[win].left
     * reaches 0). Under lock: closed, abort. */
    int eager;               /* the mode is on */
    int eager_open;          /* caller: an eager job runs, the window is not closed */
    unsigned *sg_ntens;      /* tensors overlapping each sub-group */
    int closed;              /* the step call closed the window */
    int abort;               /* destroy: stop waiting */
    int landed;              /* worker: the closed window's copies were waited for */
    _Atomic uint64_t eager_updates; /* sub-group updates finished before their window closed */
    /* the eager walk's order: the sub-groups in the order the last window
     * that completed all of them completed them (worker, at finish_window) */
    unsigned *eager_order;
    int have_order;
    /* quantized states: the block scales of the piece being updated, per
     * state (worker; step.c q_piece()) */
    float *qscale[ZO_OPTIM_STATE_COUNT];
    /* cumulative counters (worker, under lock) */
    uint64_t updates_done, nvme_read_total, nvme_write_total;
};

/* The error buffer of the calling thread: the worker's own, or the driving
 * thread's (also the streams' threads, whose errors surface through the
 * driving thread's calls). */
static inline zo_errbuf *zo__eb(zo_optim *o)
{
    return o->worker_started && pthread_equal(pthread_self(), o->worker) ? &o->werr : &o->err;
}

/* A call of the driving thread begins: the previous call's detail goes. */
static inline void zo__enter(zo_optim *o)
{
    if (o)
        zo__errbuf_set(&o->err, "");
}

/* step.c */
void *zo__optim_worker(void *arg);
int zo__wstate_set(zo_optim *o, zo__wstate to);
void zo__scaler_init(zo__scaler *sc, const zo_optim_config *cfg, zo_dtype pdt);
void zo__scaler_update(zo__scaler *sc, const zo_optim_config *cfg, int overflow);
int zo__push_range(zo_optim *o, unsigned pb, unsigned db, uint64_t lo, uint64_t hi);
int zo__pbuf_fresh(zo_optim *o, unsigned b);
int zo__pbuf_need(zo_optim *o, unsigned b);
/* the update of a job copies (or writes) its params to the device as it goes */
static inline int zo__push_now(const zo_optim *o, const zo__job *job)
{
    return !job->delayed || o->dbl;
}
/* Test hook: nonzero makes engines created afterwards use the parameter
 * buffer, the staging and copies even on the host backend (the path a GPU
 * takes). */
extern int zo__optim_force_copy;
int zo__sg_stats(zo_optim *o, unsigned win, double *sumsq, uint64_t *nonfinite, uint64_t *ns);

/* gstats.c: intake-time gradient statistics (zo__gst) */
int zo__gst_alloc(zo_optim *o);
void zo__gst_free(zo_optim *o);
void zo__gst_reset(zo_optim *o, unsigned w);
int zo__gst_track(zo_optim *o, unsigned w, unsigned t, uint32_t pieces);
void zo__gst_landed(zo_optim *o, unsigned w, unsigned t);
int zo__gst_get(zo_optim *o, unsigned w, unsigned i, zo_grad_stats *gs);
void zo__tensor_sgs(const zo_optim *o, unsigned t, unsigned *a, unsigned *b);
void zo__gst_keep_order(zo_optim *o, unsigned w);

/* window.c: the gradient windows (acc[], spill[]) */
unsigned zo__tensor_at(const zo_optim *o, uint64_t lo);
/* the window dtype an engine with this config and gradient dtype gets */
zo_dtype zo__win_dtype(const zo_optim_config *cfg, zo_dtype gdt);
int zo__win_alloc(zo_optim *o, uint64_t *bytes);
void zo__win_free(zo_optim *o);
void zo__win_reset(zo_optim *o, unsigned w);
void zo__win_zero_missing(zo_optim *o, unsigned w);
/* tensor t's next gradient (src dtype dt) in window w needs an fp32 spill first */
int zo__win_needs_spill(const zo_optim *o, unsigned w, unsigned t, zo_dtype dt);
int zo__win_spill(zo_optim *o, unsigned w, unsigned t, float **spill);
/* widen what landed narrow of tensor t into its new spill (before adding to it) */
void zo__win_spill_widen(zo_optim *o, unsigned w, unsigned t);
/* gradient piece [e, e + n) of tensor t (src in dt) lands in window w, or
 * in `spill` (the tensor's spill when it had one as the piece was handed
 * over: decided then, not at landing, which may run after a later spill) */
void zo__win_land(zo_optim *o, unsigned w, unsigned t, float *spill, uint64_t e, const void *src, zo_dtype dt,
                  size_t n, int first);
/* flat elements [lo, lo + n) of window w's gradients: *g, *dt; when spilled
 * tensors are in the range, an fp32 copy the caller frees (*tmp) */
int zo__win_range(zo_optim *o, unsigned w, uint64_t lo, uint64_t n, const void **g, zo_dtype *dt, float **tmp);

/* why the states are undefined (zo_optim.failed) */
enum {
    ZO__FAILED_STEP = 1, /* a step failed while writing states */
    ZO__FAILED_LOAD = 2, /* zo_optim_load() failed after it began to overwrite them */
    ZO__FAILED_INIT = 3, /* zo_optim_init_from_device() failed after it began to overwrite them */
};

/* optim.c */
/* the fingerprint a checkpoint must carry: of the layout, and with
 * `states` of the state types (types[ngroups], or NULL: the engine's) */
uint64_t zo__config_fingerprint(const zo_optim *o, int states, const zo__og *types);
int zo__optim_quiesce(zo_optim *o, int for_load);
/* 0, or ZO_ESTATE naming fn and why the states are undefined */
int zo__failed_check(zo_optim *o, const char *fn);
/* the masters of every tensor are set (after init_from_device or a load) */
void zo__masters_all_set(zo_optim *o);
/* zo_part's resharded load (part.c): take the engine record of checkpoint
 * JSON js saved by an engine of another layout (a shard at another world
 * size): step, counters, loss scaler, and each group g's hyperparameters
 * from the record's group map[g] (of nrec); every tensor at the step. The
 * caller imports the masters and states. @return 0, ZO_EFORMAT, -ENOMEM. */
int zo__optim_adopt_record(zo_optim *o, const char *js, unsigned nrec, const unsigned *map);
/* One group's state type as a checkpoint record writes it ("f32", "bf16",
 * "q8/256/0/5", legacy "q4/128") into ck's sdt, qbits, qblock and qmap.
 * 0; -1: unknown type; -2: a q type with unknown code maps. */
int zo__state_type_parse(const char *nm, zo__og *ck);
/* an import set n master elements of tensor t */
void zo__masters_add(zo_optim *o, unsigned t, uint64_t n);
/* 0, or ZO_ESTATE naming fn and the first tensor whose masters were never set */
int zo__masters_check(zo_optim *o, const char *fn);
void zo__acc_add(float *dst, const void *src, zo_dtype dt, size_t n, int first);

#endif /* ZO_OPTIM_INTERNAL_H */
