/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The partitioned engine (include/zoffload/part.h): ZeRO-1/2's layout over
 * the single-rank engine. Each rank's inner zo_optim holds one tensor per
 * group, its shard of the group's flat element space; this layer owns the
 * full flat device params (the all-gather runs in place over them), the
 * gradient buckets and their reduce-scatters, the fp32 host buffer the
 * averaged shard gradients land in, and the three collectives of a step.
 * It uses only the public API of zo_optim and zo_dev.
 */
#include "optim_internal.h"

#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zoffload/part.h>
#include <zoffload/swap.h>
#include <zoffload/vec.h>

#define PART_FORMAT 1
#define PART_MIN_BUCKET 4096u

/* A gradient bucket: tensors [t0, t1] of one group, the group-local flat
 * range [lo, hi) they cover (a piece of one tensor when it is larger than
 * a bucket), and each rank's chunk of that range. */
typedef struct pbucket {
    unsigned group, t0, t1;
    uint64_t lo, hi;
    uint64_t *counts; /* [world], into zo_part.bcounts */
    unsigned have;    /* tensors handed over in this micro-step */
} pbucket;

struct zo_part {
    zo_errbuf err;
    zo_comm comm;
    zo_dev *dev;
    int host; /* host backend: device memory is host memory */
    zo_dtype pdt, gdt;
    size_t pes, ges;
    unsigned accum;
    /* groups */
    unsigned ngroups;
    uint64_t *gnumel, *goff; /* elements; offset in the flat buffer */
    uint64_t *gshard;        /* S: the shard size of the group */
    uint64_t *slo, *sn;      /* this rank's shard: group-local start, length */
    uint64_t *sgoff;         /* its offset in sgrad */
    uint64_t *gcounts;       /* [ngroups * world] shard lengths (all-gather counts) */
    int *ginner;             /* inner group (= inner tensor) index, -1: this rank owns nothing of it */
    unsigned *gneed, *ghave; /* buckets with a chunk of this rank's shard; reduced this micro-step */
    /* tensors (the template's, global index) */
    unsigned nt;
    uint64_t *tnumel, *toff; /* group-local offset */
    unsigned *tgroup, *tb0, *tb1;
    void **tdev;
    const void **tgrad;
    unsigned char *tin;
    /* buckets */
    pbucket *b;
    unsigned nb, next, fin; /* buckets [fin, next) are started and not finished (in flight) */
    unsigned nbuf;          /* bucket buffers: 2 with an asynchronous comm (one fills while one moves), else 1 */
    int async;              /* the comm's start/wait callbacks are used */
    void *req[2];           /* the in-flight reduce-scatters' handles, by buffer */
    uint64_t *bcounts;
    uint64_t bmax; /* elements of the largest bucket */
    /* buffers */
    void *flat, *bucket[2], *stage;
    float *sgrad;
    uint64_t shard_numel, own_host_bytes, device_bytes;
    zo_stream *st;
    zo_optim *inner;
    zo_optim_footprint fp;
    uint64_t layout_fp, numel, micro;
    char *names;             /* the template's tensor names, each NUL-terminated, in order (layout_fp()) */
    uint64_t *gsg;           /* [ngroups] the group's sub-group size (a resharded load finds old sub-groups) */
    int broken; /* a collective or an update failed: the ranks are out of step */
    int dpu;    /* the template's delayed parameter update: the inner engine's update runs into the next step */
    uint64_t n_rs, n_rs_grad, n_ag;
};

/* The model's layout fingerprint as `world` ranks record it in their
 * checkpoints: the world size, the groups, each tensor's name and size. A
 * resharded load checks an old world's record with the old size. */
static uint64_t layout_fp(const zo_part *p, unsigned world)
{
    unsigned G = p->ngroups;
    uint64_t h = zo__fnv1a(0xcbf29ce484222325ull, &world, sizeof(world));
    h = zo__fnv1a(h, &G, sizeof(G));
    const char *nm = p->names;
    for (unsigned t = 0; t < p->nt; t++) {
        size_t l = strlen(nm) + 1;
        h = zo__fnv1a(h, nm, l);
        h = zo__fnv1a(h, &p->tnumel[t], 8);
        nm += l;
    }
    return h;
}

void zo_comm_default(zo_comm *c)
{
    if (!c)
        return;
    memset(c, 0, sizeof(*c));
    c->struct_size = sizeof(*c);
    c->world = 1;
}

void zo_part_config_default(zo_part_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->bucket_bytes = (uint64_t)25 << 20; /* DeepSpeed's reduce_bucket_size (5e8 elements is its own default;
                                               25 MiB is DDP's bucket_cap_mb) */
}

const char *zo_part_errmsg(const zo_part *p)
{
    static _Thread_local char tls[ZO_ERRMSG_LEN];
    return zo__errbuf_tls(p ? &p->err : NULL, tls);
}

zo_optim *zo_part_optim(zo_part *p)
{
    return p ? p->inner : NULL;
}

static void enter(zo_part *p)
{
    if (p)
        zo__errbuf_set(&p->err, "");
}

/* ---- collectives ------------------------------------------------------------------- */

static void window_reset(zo_part *p);

/* A collective or an update failed: this rank's sequence of collectives may
 * no longer match the others'. The micro-step's gradients are dropped. */
static void broke(zo_part *p)
{
    p->broken = 1;
    window_reset(p);
    zo_optim_discard_grads(p->inner); /* its own failure, if any, is the engine's to report next */
}

static int comm_failed(zo_part *p, int r, const char *fn, const char *what)
{
    if (r > 0)
        r = -EPROTO; /* a callback returned a positive value: not an error code */
    broke(p);
    return ZO_FAIL(&p->err, r,
                   "%s: comm %s failed on rank %u of %u: %s (the ranks are out of step: zo_part_load() or "
                   "zo_part_init_from_device() on every rank to go on)",
                   fn, what, p->comm.rank, p->comm.world, zo_strerror(r));
}

static int all_reduce(zo_part *p, double *v, unsigned n, int op, const char *fn, const char *what)
{
    if (!p->comm.all_reduce)
        return 0; /* world 1 */
    int r = p->comm.all_reduce(p->comm.user, v, n, op);
    return r ? comm_failed(p, r, fn, what) : 0;
}

static int check_usable(zo_part *p, const char *fn)
{
    if (p->broken)
        return ZO_FAIL(&p->err, ZO_ESTATE,
                       "%s: an earlier collective or update failed and the ranks are out of step: "
                       "zo_part_load() or zo_part_init_from_device() (on every rank) first", fn);
    return 0;
}

static int dev_failed(zo_part *p, int r, const char *fn, const char *what)
{
    broke(p);
    return ZO_FAIL(&p->err, r, "%s: %s: %s (%s)", fn, what, zo_strerror(r), zo_dev_errmsg(p->dev));
}

/* ---- gradient buckets ------------------------------------------------------------- */

/* Start bucket `bi`'s reduce-scatter: copy its gradients (zeros for tensors
 * without one) into its bucket buffer and start the collective (with a
 * synchronous comm: run it). finish_bucket() takes the result. */
static int start_bucket(zo_part *p, unsigned bi, int in_grad, const char *fn)
{
    pbucket *bk = &p->b[bi];
    void *buf = p->bucket[bi % p->nbuf];
    /* the host backend copies here, in the caller's thread: a stream's
     * worker would cost two thread hand-offs per bucket (the sync first:
     * the gradients' ready events were queued on the stream) */
    int r = p->host ? zo_stream_sync(p->st) : 0;
    if (r < 0)
        return dev_failed(p, r, fn, "waiting for the gradients' ready events");
    for (unsigned t = bk->t0; t <= bk->t1; t++) {
        uint64_t a = ZO_MAX(bk->lo, p->toff[t]), e = ZO_MIN(bk->hi, p->toff[t] + p->tnumel[t]);
        char *dst = (char *)buf + (a - bk->lo) * p->ges;
        const char *src = p->tgrad[t] ? (const char *)p->tgrad[t] + (a - p->toff[t]) * p->ges : NULL;
        if (p->host && src)
            memcpy(dst, src, (e - a) * p->ges);
        else if (p->host)
            memset(dst, 0, (e - a) * p->ges);
        else if (src)
            r = zo_memcpy_async(p->st, dst, src, (e - a) * p->ges, ZO_COPY_D2D);
        else
            r = zo_memset_async(p->st, dst, 0, (e - a) * p->ges);
        if (r < 0)
            return dev_failed(p, r, fn, "copying gradients into the bucket");
    }
    if (!p->host && (r = zo_stream_sync(p->st)) < 0)
        return dev_failed(p, r, fn, "copying gradients into the bucket");
    if (p->async) {
        p->req[bi % p->nbuf] = NULL;
        if ((r = p->comm.reduce_scatter_start(p->comm.user, buf, bk->counts, p->gdt, &p->req[bi % p->nbuf])) != 0)
            return comm_failed(p, r, fn, "reduce_scatter_start (a gradient bucket)");
    } else if (p->comm.reduce_scatter && (r = p->comm.reduce_scatter(p->comm.user, buf, bk->counts, p->gdt)) != 0) {
        return comm_failed(p, r, fn, "reduce_scatter (a gradient bucket)");
    }
    p->next++; /* started: from here on it is waited exactly once */
    p->n_rs++;
    p->n_rs_grad += in_grad != 0;
    return 0;
}

/* Finish the oldest started bucket (p->fin): wait for its reduce-scatter,
 * average this rank's chunk into the fp32 shard gradients, and hand a
 * group's shard to the inner engine once all its buckets are in. */
static int finish_bucket(zo_part *p, const char *fn)
{
    unsigned bi = p->fin++;
    pbucket *bk = &p->b[bi];
    const void *buf = p->bucket[bi % p->nbuf];
    int r;
    if (p->async && (r = p->comm.wait(p->comm.user, p->req[bi % p->nbuf])) != 0)
        return comm_failed(p, r, fn, "wait (a gradient bucket's reduce_scatter)");
    unsigned g = bk->group, me = p->comm.rank;
    uint64_t c = bk->counts[me];
    if (!c)
        return 0;
    uint64_t off = 0;
    for (unsigned k = 0; k < me; k++)
        off += bk->counts[k];
    const void *src = (const char *)buf + off * p->ges;
    if (!p->host) {
        if ((r = zo_memcpy_async(p->st, p->stage, src, c * p->ges, ZO_COPY_D2H)) < 0 ||
            (r = zo_stream_sync(p->st)) < 0)
            return dev_failed(p, r, fn, "copying the reduced chunk to the host");
        src = p->stage;
    }
    /* the mean: the sum divided by world in fp32 (one rounding after the
     * sum; exact for a power-of-two world). For a power of two, 1/world is
     * exact and s * (1/world) is the same real number as s / world, rounded
     * once either way: the same bits, at a multiply's cost instead of a
     * scalar division's (this loop runs over the whole shard every step) */
    float *d = p->sgrad + p->sgoff[g] + (bk->lo + off - p->slo[g]);
    float w = (float)p->comm.world;
    const float *s = src;
    if (p->gdt != ZO_DTYPE_F32) {
        zo_vec_cast(d, ZO_DTYPE_F32, src, p->gdt, (size_t)c);
        s = d;
    }
    if ((p->comm.world & (p->comm.world - 1)) == 0) {
        float inv = 1.0f / w;
        for (uint64_t i = 0; i < c; i++)
            d[i] = s[i] * inv;
    } else {
        for (uint64_t i = 0; i < c; i++)
            d[i] = s[i] / w;
    }
    if (++p->ghave[g] == p->gneed[g]) {
        r = zo_optim_grad_host(p->inner, (unsigned)p->ginner[g], p->sgrad + p->sgoff[g], ZO_DTYPE_F32);
        if (r < 0) {
            broke(p);
            return ZO_FAIL(&p->err, r, "%s: handing group %u's shard gradient to the engine: %s", fn, g,
                           zo_optim_errmsg(p->inner));
        }
    }
    return 0;
}

/* Wait for every bucket in flight, results unused (a failure, a reset):
 * each started request is waited exactly once, errors ignored. */
static void drain_quiet(zo_part *p)
{
    for (; p->fin < p->next; p->fin++)
        if (p->async)
            (void)p->comm.wait(p->comm.user, p->req[p->fin % p->nbuf]);
}

/* Reduce the buckets that are complete, in bucket order (the same
 * sequence of collectives on every rank). */
static int advance(zo_part *p, int in_grad, const char *fn)
{
    int r;
    while (p->next < p->nb && p->b[p->next].have == p->b[p->next].t1 - p->b[p->next].t0 + 1) {
        /* a buffer for it: the oldest in flight finishes first */
        if (p->next - p->fin == p->nbuf && (r = finish_bucket(p, fn)) < 0)
            return r;
        if ((r = start_bucket(p, p->next, in_grad, fn)) < 0)
            return r;
        if (!p->async && (r = finish_bucket(p, fn)) < 0)
            return r;
    }
    return 0;
}

/* Finish every bucket in flight (the end of a micro-step's reduction). */
static int drain(zo_part *p, const char *fn)
{
    while (p->fin < p->next) {
        int r = finish_bucket(p, fn);
        if (r < 0)
            return r;
    }
    return 0;
}

static void window_reset(zo_part *p)
{
    drain_quiet(p);
    for (unsigned i = 0; i < p->nt; i++) {
        p->tin[i] = 0;
        p->tgrad[i] = NULL;
    }
    for (unsigned i = 0; i < p->nb; i++)
        p->b[i].have = 0;
    for (unsigned g = 0; g < p->ngroups; g++)
        p->ghave[g] = 0;
    p->next = p->fin = 0;
}

static int any_in(const zo_part *p)
{
    for (unsigned i = 0; i < p->nt; i++)
        if (p->tin[i])
            return 1;
    return 0;
}

int zo_part_grad(zo_part *p, unsigned index, const void *dev_grad, zo_event *ready)
{
    static const char fn[] = "zo_part_grad";
    enter(p);
    if (!p || !dev_grad || index >= p->nt)
        return ZO_FAIL(p ? &p->err : NULL, -EINVAL, "%s: NULL argument or tensor index %u out of range", fn, index);
    int r = check_usable(p, fn);
    if (r < 0)
        return r;
    if (p->tin[index])
        return ZO_FAIL(&p->err, ZO_ESTATE,
                       "%s: tensor %u was already handed over in this micro-step (its bucket may be reduced: add "
                       "the gradients up before handing them over)", fn, index);
    if (ready && (r = zo_stream_wait_event(p->st, ready)) < 0)
        return ZO_FAIL(&p->err, r, "%s: waiting on the ready event: %s", fn, zo_dev_errmsg(p->dev));
    p->tin[index] = 1;
    p->tgrad[index] = dev_grad;
    for (unsigned b = p->tb0[index]; b <= p->tb1[index]; b++)
        p->b[b].have++;
    return advance(p, 1, fn);
}

/* ---- params: all-gather and copy-back ---------------------------------------------- */

static int gather_params(zo_part *p, const char *fn)
{
    int r;
    if (p->async) {
        /* the groups' gathers over their disjoint parts of flat, up to two
         * in flight; every started one is waited, also after a failure */
        void *rq[2];
        unsigned started = 0, waited = 0;
        int first = 0;
        const char *what = NULL;
        for (unsigned g = 0; g < p->ngroups || waited < started;) {
            if (g < p->ngroups && started - waited < 2 && !first) {
                rq[started % 2] = NULL;
                r = p->comm.all_gather_start(p->comm.user, (char *)p->flat + p->goff[g] * p->pes,
                                             p->gcounts + (size_t)g * p->comm.world, p->pdt, &rq[started % 2]);
                if (r) {
                    first = r;
                    what = "all_gather_start (the updated params)";
                } else {
                    started++;
                    p->n_ag++;
                }
                g++;
                continue;
            }
            if (waited == started)
                break; /* a start failed: nothing left in flight */
            r = p->comm.wait(p->comm.user, rq[waited++ % 2]);
            if (r && !first) {
                first = r;
                what = "wait (an all_gather of the updated params)";
            }
        }
        if (first)
            return comm_failed(p, first, fn, what);
    }
    for (unsigned g = 0; g < p->ngroups && p->comm.all_gather && !p->async; g++) {
        r = p->comm.all_gather(p->comm.user, (char *)p->flat + p->goff[g] * p->pes,
                               p->gcounts + (size_t)g * p->comm.world, p->pdt);
        if (r)
            return comm_failed(p, r, fn, "all_gather (the updated params)");
        p->n_ag++;
    }
    if (p->host && (r = zo_stream_sync(p->st)) < 0) /* nothing of ours may be queued behind the copies */
        return dev_failed(p, r, fn, "copying params to dev_params");
    for (unsigned i = 0; i < p->nt; i++) {
        const char *src = (const char *)p->flat + (p->goff[p->tgroup[i]] + p->toff[i]) * p->pes;
        if (p->host) /* in this thread, as the gradients (start_bucket) */
            memcpy(p->tdev[i], src, p->tnumel[i] * p->pes);
        else if ((r = zo_memcpy_async(p->st, p->tdev[i], src, p->tnumel[i] * p->pes, ZO_COPY_D2D)) < 0)
            return dev_failed(p, r, fn, "copying params to dev_params");
    }
    if (!p->host && (r = zo_stream_sync(p->st)) < 0)
        return dev_failed(p, r, fn, "copying params to dev_params");
    return 0;
}

int zo_part_init_from_device(zo_part *p)
{
    static const char fn[] = "zo_part_init_from_device";
    enter(p);
    if (!p)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL", fn);
    if (any_in(p))
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: gradients were handed over in this micro-step", fn);
    int r;
    if (p->dpu)
        (void)zo_optim_wait(p->inner, NULL); /* an update in flight is overwritten by what follows */
    if (p->micro % p->accum && (r = zo_optim_discard_grads(p->inner)) < 0)
        return ZO_FAIL(&p->err, r, "%s: %s", fn, zo_optim_errmsg(p->inner));
    for (unsigned i = 0; i < p->nt; i++) {
        char *dst = (char *)p->flat + (p->goff[p->tgroup[i]] + p->toff[i]) * p->pes;
        if ((r = zo_memcpy_async(p->st, dst, p->tdev[i], p->tnumel[i] * p->pes, ZO_COPY_D2D)) < 0)
            return dev_failed(p, r, fn, "copying dev_params into the flat params");
    }
    if ((r = zo_stream_sync(p->st)) < 0)
        return dev_failed(p, r, fn, "copying dev_params into the flat params");
    p->broken = 1; /* until the collective below has been made */
    if ((r = zo_optim_init_from_device(p->inner)) < 0)
        return ZO_FAIL(&p->err, r, "%s: %s", fn, zo_optim_errmsg(p->inner));
    if ((r = gather_params(p, fn)) < 0)
        return r;
    window_reset(p);
    p->micro = 0;
    p->broken = 0;
    return 0;
}

/* ---- the step --------------------------------------------------------------------- */

/* The checks a step call makes first: NULL, res's struct_size, usable. */
static int step_call_ok(zo_part *p, zo_optim_step_result *res, const char *fn)
{
    if (!p)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL", fn);
    int r;
    if (res && (r = ZO_STRUCT_OUT(res, (const zo_optim_step_result *)NULL, ZO_OPTIM_STEP_RESULT_SIZE_V1, &p->err,
                                  fn)) < 0)
        return r;
    return check_usable(p, fn);
}

/* After this rank's update ended with ur (its detail in lmsg): whether any
 * rank's failed, agreed (one all-reduce) before the all-gather so that no
 * rank waits for another; then res, and ur's own failure. 0: gather. */
static int agree_update(zo_part *p, int ur, const char *lmsg, const zo_optim_step_result *lr,
                        zo_optim_step_result *res, const char *fn)
{
    /* ZO_ENONFINITE is decided by the global flag: the same on every rank */
    double f[1] = {ur < 0 && ur != ZO_ENONFINITE ? 1.0 : 0.0};
    int r = all_reduce(p, f, 1, ZO_COMM_MAX, fn, "all_reduce (update status)");
    if (r < 0)
        return r;
    if (f[0] > 0) {
        broke(p);
        if (ur < 0)
            return ZO_FAIL(&p->err, ur, "%s: the update of this rank's shard: %s", fn, lmsg);
        return ZO_FAIL(&p->err, ZO_ESTATE,
                       "%s: another rank's update failed (this rank's shard was updated, the params were not "
                       "gathered)", fn);
    }
    if (res)
        ZO_STRUCT_OUT(res, lr, ZO_OPTIM_STEP_RESULT_SIZE_V1, &p->err, fn);
    if (ur < 0)
        return ZO_FAIL(&p->err, ur, "%s: %s", fn, lmsg);
    return 0;
}

int zo_part_step(zo_part *p, zo_optim_step_result *res)
{
    static const char fn[] = "zo_part_step";
    enter(p);
    int r = step_call_ok(p, res, fn);
    if (r < 0)
        return r;
    /* the buckets not yet reduced (tensors without a gradient: zeros) */
    for (unsigned i = 0; i < p->nb; i++)
        p->b[i].have = p->b[i].t1 - p->b[i].t0 + 1;
    r = advance(p, 0, fn);
    if (r == 0)
        r = drain(p, fn);
    window_reset(p);
    if (r < 0)
        return r;
    zo_optim_step_result lr = {.struct_size = sizeof(lr)};
    p->micro++;
    if (p->micro % p->accum) {
        /* under DPU a wait here would end the delay of the update in
         * flight (the single-rank schedule never waits mid-window) */
        if ((r = p->dpu ? zo_optim_step_async(p->inner, NULL) : zo_optim_step(p->inner, NULL, &lr)) < 0) {
            broke(p);
            return ZO_FAIL(&p->err, r, "%s: %s", fn, zo_optim_errmsg(p->inner));
        }
        if (res)
            ZO_STRUCT_OUT(res, &lr, ZO_OPTIM_STEP_RESULT_SIZE_V1, &p->err, fn);
        return 0;
    }
    /* boundary: the global norm and overflow. A local failure still takes
     * part in the collectives (as a flag) so that no rank waits for it. */
    double sumsq = 0;
    uint64_t nf = 0;
    int lerr = zo_optim_grads_done(p->inner);
    if (lerr == 0)
        lerr = zo_optim_grad_norm_partial(p->inner, &sumsq, &nf);
    char lmsg[ZO_ERRMSG_LEN] = "";
    if (lerr < 0)
        snprintf(lmsg, sizeof(lmsg), "%s", zo_optim_errmsg(p->inner));
    /* one all-reduce (a round trip saved): the flags are summed too, and
     * "some rank" is a sum above 0; the sum of squares is summed as alone */
    double s[3] = {sumsq, nf ? 1.0 : 0.0, lerr < 0 ? 1.0 : 0.0};
    if ((r = all_reduce(p, s, 3, ZO_COMM_SUM, fn, "all_reduce (sum of squares, overflow, errors)")) < 0)
        return r;
    if (s[2] > 0) {
        broke(p);
        if (lerr < 0)
            return ZO_FAIL(&p->err, lerr, "%s: gradients of this rank: %s", fn, lmsg);
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: another rank failed before the update (nothing was updated)", fn);
    }
    zo_optim_step_opts so;
    zo_optim_step_opts_default(&so);
    so.global_sumsq = isnan(s[0]) ? INFINITY : s[0];
    so.global_nonfinite = s[1] > 0;
    int ur, delayed = 0;
    if (p->dpu) {
        /* DPU: the inner engine finishes the previous update (its params
         * into this rank's shard of flat) and queues this one, which runs
         * while the framework's next forward and backward do; in the
         * warm-up it finishes this one now. Every rank is in the same
         * phase (the same calls, the same warm-up). */
        ur = zo_optim_step_async(p->inner, &so);
        zo_optim_info oi = {.struct_size = sizeof(oi)};
        zo_optim_get_info(p->inner, &oi);
        delayed = oi.dpu_active;
        if (ur == 0 && !delayed) {
            /* a warm-up boundary: step_async collected the update itself, so
             * the wait finds nothing in flight (boundary 0, no norm, never
             * skipped); the update's own result is the last one */
            if ((ur = zo_optim_wait(p->inner, &lr)) == 0)
                (void)zo_optim_last_result(p->inner, &lr);
        } else if (zo_optim_last_result(p->inner, &lr) < 0)
            lr.step = oi.step; /* no update finished yet: nothing to report but the count */
        lr.boundary = 1;
    } else {
        ur = zo_optim_step(p->inner, &so, &lr);
    }
    if (ur < 0)
        snprintf(lmsg, sizeof(lmsg), "%s", zo_optim_errmsg(p->inner));
    if ((r = agree_update(p, ur, lmsg, &lr, res, fn)) < 0)
        return r;
    if (lr.skipped && !delayed)
        return 0; /* every rank skipped: nothing to gather (under DPU the previous update's params are new) */
    return gather_params(p, fn);
}

int zo_part_wait(zo_part *p, zo_optim_step_result *res)
{
    static const char fn[] = "zo_part_wait";
    enter(p);
    int r = step_call_ok(p, res, fn);
    if (r < 0)
        return r;
    zo_optim_step_result lr = {.struct_size = sizeof(lr)};
    int ur = zo_optim_wait(p->inner, &lr);
    char lmsg[ZO_ERRMSG_LEN] = "";
    if (ur < 0)
        snprintf(lmsg, sizeof(lmsg), "%s", zo_optim_errmsg(p->inner));
    if (!p->dpu) {
        /* nothing is ever left in flight (zo_part_step() finished it): not collective */
        if (res)
            ZO_STRUCT_OUT(res, &lr, ZO_OPTIM_STEP_RESULT_SIZE_V1, &p->err, fn);
        return ur < 0 ? ZO_FAIL(&p->err, ur, "%s: %s", fn, lmsg) : 0;
    }
    if ((r = agree_update(p, ur, lmsg, &lr, res, fn)) < 0)
        return r;
    /* the finished update's params are in this rank's shard: every rank's, everywhere */
    return gather_params(p, fn);
}

int zo_part_push_params(zo_part *p)
{
    static const char fn[] = "zo_part_push_params";
    enter(p);
    if (!p)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL", fn);
    int r = check_usable(p, fn);
    if (r < 0)
        return r;
    if (any_in(p))
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: gradients were handed over in this micro-step", fn);
    if (p->dpu && (r = zo_part_wait(p, NULL)) < 0) /* the update in flight first (collective) */
        return r;
    int lerr = zo_optim_push_params(p->inner);
    char lmsg[ZO_ERRMSG_LEN] = "";
    if (lerr < 0)
        snprintf(lmsg, sizeof(lmsg), "%s", zo_optim_errmsg(p->inner));
    double f[1] = {lerr < 0 ? 1.0 : 0.0};
    if ((r = all_reduce(p, f, 1, ZO_COMM_MAX, fn, "all_reduce (push status)")) < 0)
        return r;
    if (lerr < 0)
        return ZO_FAIL(&p->err, lerr, "%s: %s", fn, lmsg);
    if (f[0] > 0)
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: another rank's push failed (the params were not gathered)", fn);
    return gather_params(p, fn);
}

int zo_part_set_dev_param(zo_part *p, unsigned index, void *dev_param)
{
    enter(p);
    if (!p || !dev_param || index >= p->nt)
        return ZO_FAIL(p ? &p->err : NULL, -EINVAL, "zo_part_set_dev_param: %s",
                       !p || !dev_param ? "NULL argument" : "tensor index out of range");
    /* read only by gather_params() and zo_part_init_from_device(), both in
     * the caller's thread: the inner engine's update in flight writes the
     * flat shard, never these */
    p->tdev[index] = dev_param;
    return 0;
}

int zo_part_set_lr(zo_part *p, unsigned group, double lr)
{
    enter(p);
    if (!p || group >= p->ngroups)
        return ZO_FAIL(p ? &p->err : NULL, -EINVAL, "zo_part_set_lr: NULL or group %u out of range", group);
    if (!(lr >= 0) || !isfinite(lr))
        return ZO_FAIL(&p->err, ZO_ECONFIG, "zo_part_set_lr: lr %g (finite, >= 0)", lr);
    if (p->ginner[group] < 0)
        return 0; /* this rank owns nothing of the group */
    int r = zo_optim_set_lr(p->inner, (unsigned)p->ginner[group], lr);
    return r < 0 ? ZO_FAIL(&p->err, r, "zo_part_set_lr: %s", zo_optim_errmsg(p->inner)) : 0;
}

double zo_part_loss_scale(const zo_part *p)
{
    return p ? zo_optim_loss_scale(p->inner) : 0;
}

/* ---- save / load ------------------------------------------------------------------- */

static int rank_dir(char *buf, size_t len, const char *root, unsigned rank)
{
    int n = snprintf(buf, len, "%s/rank%u", root, rank);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

#define WORLD_FILE "world.json"

/* Rank 0's half of a save: <root>/world.json names checkpoint `name` as
 * the world's latest, written to a temporary file, flushed, renamed over
 * the old one and the directory flushed: a crash leaves the old or the new
 * file, never a torn one. */
static int world_commit(zo_part *p, const char *root, const char *name, const char *fn)
{
    char tmp[4200], dst[4200];
    if (snprintf(dst, sizeof(dst), "%s/" WORLD_FILE, root) >= (int)sizeof(dst) ||
        snprintf(tmp, sizeof(tmp), "%s/.%s.%ld.tmp", root, WORLD_FILE, (long)getpid()) >= (int)sizeof(tmp))
        return ZO_FAIL(&p->err, -ENAMETOOLONG, "%s: root too long", fn);
    char js[512];
    int n = snprintf(js, sizeof(js), "{\"name\":\"%s\",\"world\":%u,\"layout\":\"%016" PRIx64 "\"}\n", name,
                     p->comm.world, p->layout_fp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    int r = fd < 0 ? -errno : 0;
    if (r == 0 && write(fd, js, (size_t)n) != n)
        r = errno ? -errno : -EIO;
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (fd >= 0 && close(fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, dst) < 0)
        r = -errno;
    if (r < 0) {
        unlink(tmp);
        return ZO_FAIL(&p->err, r, "%s: committing %s in %s: %s", fn, name, dst, zo_strerror(r));
    }
    int dfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) < 0)
        r = -errno;
    if (dfd >= 0)
        close(dfd);
    return r < 0 ? ZO_FAIL(&p->err, r, "%s: flushing %s: %s", fn, root, zo_strerror(r)) : 0;
}

/* The world's latest checkpoint (world.json) into name[len]: 0, -ENOENT
 * (none: saved before world commits, or never), ZO_EFORMAT. */
static int world_latest(const char *root, char *name, size_t len)
{
    char path[4200], js[512];
    if (snprintf(path, sizeof(path), "%s/" WORLD_FILE, root) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    size_t n = fread(js, 1, sizeof(js) - 1, f);
    fclose(f);
    js[n] = 0;
    const char *q = strstr(js, "\"name\":\"");
    const char *e = q ? strchr(q + 8, '"') : NULL;
    if (!q || !e || (size_t)(e - (q + 8)) >= len || e == q + 8)
        return ZO_EFORMAT;
    memcpy(name, q + 8, (size_t)(e - (q + 8)));
    name[e - (q + 8)] = 0;
    return 0;
}

int zo_part_save(zo_part *p, const char *root, const char *name, unsigned keep_last, const char *user_json)
{
    static const char fn[] = "zo_part_save";
    enter(p);
    if (!p || !root || !name)
        return ZO_FAIL(p ? &p->err : NULL, -EINVAL, "%s: NULL argument", fn);
    int r = check_usable(p, fn);
    if (r < 0)
        return r;
    if (any_in(p) || p->micro % p->accum)
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: mid accumulation window (save at a step boundary)", fn);
    if (keep_last == 1)
        return ZO_FAIL(&p->err, -EINVAL, "%s: keep_last 1 would delete a rank's previous shard before every rank "
                       "has saved the new one (a crash then leaves no whole checkpoint): give 0 (keep all) or >= 2",
                       fn);
    /* DPU: the update in flight belongs to this checkpoint (collective) */
    if (p->dpu && (r = zo_part_wait(p, NULL)) < 0)
        return r;
    char dir[4096];
    if (rank_dir(dir, sizeof(dir), root, p->comm.rank) < 0)
        return ZO_FAIL(&p->err, -ENAMETOOLONG, "%s: root too long", fn);
    if (mkdir(root, 0700) != 0 && errno != EEXIST) {
        int e = -errno;
        return ZO_FAIL(&p->err, e, "%s: mkdir %s: %s", fn, root, zo_strerror(e));
    }
    size_t cap = 256 + (user_json ? strlen(user_json) : 4);
    char *js = malloc(cap);
    if (!js)
        return -ENOMEM;
    snprintf(js, cap, "{\"zo_part\":{\"format\":%d,\"rank\":%u,\"world\":%u,\"layout\":\"%016" PRIx64 "\"},\"user\":%s}",
             PART_FORMAT, p->comm.rank, p->comm.world, p->layout_fp, user_json ? user_json : "null");
    r = zo_optim_save(p->inner, dir, name, keep_last, js);
    free(js);
    if (r < 0)
        ZO_FAIL(&p->err, r, "%s: rank %u: %s", fn, p->comm.rank, zo_optim_errmsg(p->inner));
    /* the world commit: once every rank's shard is durable, rank 0 names
     * the checkpoint in <root>/world.json (atomically); until then a load
     * of the latest takes the previous one, whatever rank died where */
    double failed = r < 0;
    int cr = all_reduce(p, &failed, 1, ZO_COMM_MAX, fn, "all_reduce (is every shard saved)");
    if (cr < 0 || r < 0)
        return cr < 0 ? cr : r;
    if (failed > 0)
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: another rank's shard of %s was not saved: not committed (the latest "
                       "checkpoint stays the previous one)", fn, name);
    if (p->comm.rank == 0 && (r = world_commit(p, root, name, fn)) < 0)
        failed = 1;
    if ((cr = all_reduce(p, &failed, 1, ZO_COMM_MAX, fn, "all_reduce (is the checkpoint committed)")) < 0 || r < 0)
        return cr < 0 ? cr : r;
    if (failed > 0)
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: rank 0 could not commit %s (the latest checkpoint stays the previous "
                       "one)", fn, name);
    return 0;
}

/* The unsigned or string value of "key" after `from` (whitespace as cJSON prints it). */
static const char *json_at(const char *from, const char *key)
{
    char pat[48];
    snprintf(pat, sizeof(pat), "\"%s\"", key);
    const char *q = strstr(from, pat);
    if (!q)
        return NULL;
    q += strlen(pat);
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r' || *q == ':')
        q++;
    return q;
}

/* The zo_part record of a checkpoint's user JSON: rank, world, layout. */
static int parse_record(const char *js, unsigned *rank, unsigned *world, uint64_t *layout)
{
    const char *rec = js ? strstr(js, "\"zo_part\"") : NULL;
    const char *q;
    if (!rec || !(q = json_at(rec, "rank")) || sscanf(q, "%u", rank) != 1 || !(q = json_at(rec, "world")) ||
        sscanf(q, "%u", world) != 1 || !(q = json_at(rec, "layout")) || sscanf(q, "\"%" SCNx64 "\"", layout) != 1)
        return ZO_EFORMAT;
    return 0;
}

/* Check checkpoint `name` of <root>/rank<rank> against this engine before
 * anything is read. Saved at another world size: *old_world gets it and
 * cname the checkpoint's name (a resharded load, checked there). */
static int check_ckpt(zo_part *p, const char *root, const char *name, const char *fn, unsigned *old_world,
                      char *cname_out, size_t cname_len)
{
    char dir[4096];
    if (rank_dir(dir, sizeof(dir), root, p->comm.rank) < 0)
        return ZO_FAIL(&p->err, -ENAMETOOLONG, "%s: root too long", fn);
    zo_ckpt_reader *rd = NULL;
    int r = zo_ckpt_open(&rd, dir, name);
    int mine = r == 0;
    if (r == -ENOENT) {
        /* not this rank's: what did rank 0 save? (another world size, likely) */
        char d0[4096];
        rank_dir(d0, sizeof(d0), root, 0);
        if (zo_ckpt_open(&rd, d0, name) < 0)
            return ZO_FAIL(&p->err, -ENOENT, "%s: no checkpoint %s in %s (nor for rank 0)", fn, name ? name : "(latest)",
                           dir);
    } else if (r < 0) {
        return ZO_FAIL(&p->err, r, "%s: %s: %s", fn, dir, zo_last_error_detail());
    }
    unsigned rank = 0, world = 0;
    uint64_t layout = 0;
    r = parse_record(zo_ckpt_user_json(rd), &rank, &world, &layout);
    char cname[ZO_CKPT_NAME_MAX + 1];
    snprintf(cname, sizeof(cname), "%s", zo_ckpt_name(rd));
    zo_ckpt_close(&rd);
    if (r < 0)
        return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: checkpoint %s is not a partitioned engine's (no zo_part record)", fn,
                       cname);
    *old_world = world;
    snprintf(cname_out, cname_len, "%s", cname);
    if (world != p->comm.world) {
        if (world == 0 || layout != layout_fp(p, world))
            return ZO_FAIL(&p->err, ZO_EFORMAT,
                           "%s: checkpoint %s (saved by %u ranks) holds another model (tensors, sizes or names differ)",
                           fn, cname, world);
        return 0; /* resharded: reshard_load() checks every old rank's shard */
    }
    if (!mine)
        return ZO_FAIL(&p->err, -ENOENT, "%s: no checkpoint %s for rank %u in %s (rank 0 has one: a save of this "
                       "rank is missing)", fn, cname, p->comm.rank, dir);
    if (rank != p->comm.rank)
        return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: checkpoint %s in %s was saved by rank %u, not %u", fn, cname, dir,
                       rank, p->comm.rank);
    if (layout != p->layout_fp)
        return ZO_FAIL(&p->err, ZO_EFORMAT,
                       "%s: checkpoint %s holds another model (layout fingerprint %016" PRIx64 ", this one %016" PRIx64
                       ": tensors, sizes or names differ)", fn, cname, layout, p->layout_fp);
    return 0;
}

/* The caller's JSON out of {"zo_part":{...},"user":X} (as printed back). */
static void user_out(const char *js, char *out, size_t len)
{
    if (!out || !len)
        return;
    out[0] = 0;
    const char *rec = strstr(js, "\"zo_part\"");
    const char *close = rec ? strchr(rec, '}') : NULL; /* the record has no nested object */
    const char *q = close ? json_at(close, "user") : NULL;
    if (!q)
        return;
    size_t n = strlen(q);
    while (n && (q[n - 1] == ' ' || q[n - 1] == '\t' || q[n - 1] == '\n' || q[n - 1] == '\r'))
        n--;
    if (n && q[n - 1] == '}') /* the wrapper's own brace */
        n--;
    while (n && (q[n - 1] == ' ' || q[n - 1] == '\t' || q[n - 1] == '\n' || q[n - 1] == '\r'))
        n--;
    n = ZO_MIN(n, len - 1);
    memcpy(out, q, n);
    out[n] = 0;
}

/* ---- a resharded load -------------------------------------------------------------- */

/* The end of a load: the params all-gathered to every tensor, the micro
 * count of the inner engine, an empty window; usable again. */
static int loaded(zo_part *p, const char *fn)
{
    int r = gather_params(p, fn);
    if (r < 0)
        return r;
    zo_optim_info oi = {.struct_size = sizeof(oi)};
    zo_optim_get_info(p->inner, &oi);
    p->micro = oi.micro_steps;
    window_reset(p);
    p->broken = 0;
    return 0;
}

/* Old rank r's shard of group g at world ow: [*lo, *lo + *n). */
static void old_shard(const zo_part *p, unsigned g, unsigned r, unsigned ow, uint64_t *lo, uint64_t *n)
{
    uint64_t N = p->gnumel[g], S = (N + ow - 1) / ow;
    S += S & 1;
    *lo = ZO_MIN((uint64_t)r * S, N);
    *n = ZO_MIN((uint64_t)(r + 1) * S, N) - *lo;
}

/* Elements of the new shard a resharded load assembles at a time (fp32):
 * a multiple of every quantization block (powers of two up to
 * ZO_QBLOCK_MAX). A test hook (optim_internal.h) makes it smaller, so that
 * tiles split the test's sub-groups as they split real ones. */
uint64_t zo__part_reshard_tile = (uint64_t)1 << 20;

/* A growing read buffer of the resharded load. */
typedef struct rbuf {
    char *p;
    size_t cap;
} rbuf;

/* Bytes [from, to) of checkpoint tensor ti, read as whole chunks
 * (zo_ckpt_read verifies each) into rb: *at points at byte `from`. */
static int ck_range(zo_part *p, zo_ckpt_reader *rd, unsigned ti, uint64_t from, uint64_t to, uint64_t bytes,
                    rbuf *rb, const char **at, const char *tn, const char *fn)
{
    size_t chunk = zo_ckpt_chunk_size(rd);
    uint64_t ra = from / chunk * chunk, rbe = ZO_MIN((to + chunk - 1) / chunk * chunk, bytes);
    if (rbe - ra > rb->cap) {
        char *q = realloc(rb->p, (size_t)(rbe - ra));
        if (!q)
            return ZO_FAIL(&p->err, -ENOMEM, "%s: %" PRIu64 " bytes to read %s", fn, rbe - ra, tn);
        rb->p = q;
        rb->cap = (size_t)(rbe - ra);
    }
    int r = zo_ckpt_read(rd, ti, ra, rb->p, (size_t)(rbe - ra));
    if (r < 0)
        return ZO_FAIL(&p->err, r, "%s: reading %s of %s: %s", fn, tn, zo_ckpt_name(rd), zo_last_error_detail());
    *at = rb->p + (from - ra);
    return 0;
}

/* The state type of the idx-th group of checkpoint `rd`'s engine record
 * (its "states": "f32", "bf16", "q8/256/0/5"...) into ck. */
static int old_state_type(zo_part *p, zo_ckpt_reader *rd, unsigned idx, zo__og *ck, const char *fn)
{
    const char *js = zo_ckpt_user_json(rd);
    const char *rec = js ? strstr(js, "{\"zo_optim\":{") : NULL;
    const char *end = rec ? strstr(rec, "]},\"user\":") : NULL;
    const char *q = end ? strstr(rec, "\"states\":[") : NULL;
    if (!q || q > end)
        return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: the record of %s has no state types", fn, zo_ckpt_name(rd));
    q += strlen("\"states\":[");
    char nm[32];
    for (unsigned i = 0;; i++) {
        int used = 0;
        if (sscanf(q, i ? ",\"%31[^\"]\"%n" : "\"%31[^\"]\"%n", nm, &used) != 1 || !used || q + used > end)
            return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: the record of %s lacks the state type of its group %u", fn,
                           zo_ckpt_name(rd), idx);
        q += used;
        if (i == idx)
            break;
    }
    memset(ck, 0, sizeof(*ck));
    if (zo__state_type_parse(nm, ck) < 0)
        return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: the record of %s: state type '%s' unknown", fn, zo_ckpt_name(rd), nm);
    return 0;
}

/* One old rank's shard of group g, as a resharded load reads it. */
typedef struct oshard {
    zo_ckpt_reader *rd;
    unsigned base; /* its store's index of the shard's first sub-group (optim.sg<base>) */
    uint64_t lo, n; /* the shard, group-local */
    zo__og ty;      /* its state type (sdt, qbits, qblock, qmap) */
} oshard;

/* Old part [a, b) (group-local) of state k of group g, from old shard `os`,
 * into x[0, b - a) as fp32: the old inner engine cut its shard into
 * sub-groups of gsg[g] elements named optim.sg<base + j>.<state>. A
 * quantized state (U8: the sub-group's codes, then its fp32 block scales at
 * zo__q_scale_off) is dequantized with the old group's bits, block and
 * maps, a block at a time from the sub-group's start, as its engine did.
 * *absent: the checkpoint has no such state (Lion's v, Adagrad's m). */
static int reshard_read(zo_part *p, const oshard *os, unsigned g, uint64_t a, uint64_t b, int k, float *x,
                        float *deq, rbuf *rb, rbuf *rs, int *absent, const char *fn)
{
    static const char *const suffix[ZO_OPTIM_STATE_COUNT] = {"master", "exp_avg", "exp_avg_sq"};
    uint64_t sg = p->gsg[g];
    int quant = k != ZO_OPTIM_STATE_MASTER && os->ty.qbits;
    *absent = 0;
    for (uint64_t e = a; e < b;) {
        uint64_t j = (e - os->lo) / sg, qa = (e - os->lo) - j * sg;
        uint64_t n = ZO_MIN(sg, os->n - j * sg), qb = ZO_MIN(n, qa + (b - e));
        char tn[64];
        unsigned ti;
        zo_ckpt_entry ce;
        const char *src;
        snprintf(tn, sizeof(tn), "optim.sg%" PRIu64 ".%s", os->base + j, suffix[k]);
        int r = zo_ckpt_find(os->rd, tn, &ti);
        if (r == -ENOENT && k != ZO_OPTIM_STATE_MASTER) {
            *absent = 1;
            return 0;
        }
        if (r < 0 || (r = zo_ckpt_get_entry(os->rd, ti, &ce)) < 0)
            return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: checkpoint %s lacks %s", fn, zo_ckpt_name(os->rd), tn);
        if (quant) {
            int bits = os->ty.qbits;
            size_t B = os->ty.qblock;
            uint64_t t0 = qa / B * B, t1 = ZO_MIN((qb + B - 1) / B * B, n);
            uint64_t coff = zo__q_code_bytes(t0, bits), cb = zo__q_code_bytes(t1 - t0, bits);
            uint64_t soff = zo__q_scale_off(n, bits) + 4 * (t0 / B), sb = 4 * zo__q_nscales(t1 - t0, B);
            const char *sc;
            if (ce.dtype != ZO_DTYPE_U8 || ce.bytes != zo__q_bytes(n, bits, B))
                return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: %s is %" PRIu64 " bytes of %s; its record's q%d states of %"
                               PRIu64 " elements are %" PRIu64 " bytes of u8", fn, tn, ce.bytes,
                               zo_dtype_name(ce.dtype), bits, n, zo__q_bytes(n, bits, B));
            if ((r = ck_range(p, os->rd, ti, coff, coff + cb, ce.bytes, rb, &src, tn, fn)) < 0 ||
                (r = ck_range(p, os->rd, ti, soff, soff + sb, ce.bytes, rs, &sc, tn, fn)) < 0)
                return r;
            /* the scales start 4-aligned in the read buffer (a chunk and zo__q_scale_off are) */
            if ((r = zo_cpuadam_dequantize((const uint8_t *)src, (const float *)(const void *)sc, (size_t)(t1 - t0),
                                           zo__q_map(&os->ty, k), bits, B, deq)) < 0)
                return ZO_FAIL(&p->err, r, "%s: dequantizing %s: %s", fn, tn, zo_last_error_detail());
            memcpy(x + (e - a), deq + (qa - t0), (size_t)(qb - qa) * 4);
        } else {
            size_t es = zo_dtype_size(ce.dtype);
            if (ce.dtype != ZO_DTYPE_F32 && ce.dtype != ZO_DTYPE_BF16)
                return ZO_FAIL(&p->err, ZO_ENOTSUP, "%s: %s is %s, its record says %s: a resharded load takes fp32, "
                               "bf16, q8 or q4 states", fn, tn, zo_dtype_name(ce.dtype),
                               k == ZO_OPTIM_STATE_MASTER ? "f32" : zo_dtype_name(os->ty.sdt));
            if (qb * es > ce.bytes)
                return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: %s holds %" PRIu64 " bytes, the layout needs %" PRIu64, fn,
                               tn, ce.bytes, qb * es);
            if ((r = ck_range(p, os->rd, ti, qa * es, qb * es, ce.bytes, rb, &src, tn, fn)) < 0)
                return r;
            if ((r = zo_vec_cast(x + (e - a), ZO_DTYPE_F32, src, ce.dtype, (size_t)(qb - qa))) < 0)
                return ZO_FAIL(&p->err, r, "%s: widening %s: %s", fn, tn, zo_last_error_detail());
        }
        e += qb - qa;
    }
    return 0;
}

/* Checkpoint `cname` saved by ow ranks, loaded by this world: every old
 * rank's record is checked first; then this rank's shard of each group is
 * gathered from the old shards it overlaps (reshard_read(): fp32, bf16,
 * q8 or q4 states, widened or dequantized to fp32, and imported into this
 * engine's state types a tile of whole new blocks at a time), the step, counters, loss scaler and
 * hyperparameters taken from old rank 0's record, and the flat params
 * rebuilt from the masters and all-gathered. */
static int reshard_load(zo_part *p, const char *root, const char *cname, unsigned ow, char *user_json, size_t len,
                        const char *fn)
{
    zo_ckpt_reader **rd = calloc(ow, sizeof(*rd));
    unsigned *map = calloc(p->ngroups, sizeof(*map)), nrec = 0;
    size_t buf_bytes = (size_t)8 << 20;
    char *buf = NULL;
    float *mst = NULL;
    oshard *os = calloc(ow, sizeof(*os));
    uint64_t rtile = zo__part_reshard_tile;
    if (!rtile || rtile % ZO_QBLOCK_MAX)
        rtile = (uint64_t)1 << 20;
    float *x = malloc(rtile * 4), *deq = malloc((rtile + 2 * ZO_QBLOCK_MAX) * 4);
    rbuf rb = {0}, rs = {0};
    int r = rd && map && os && x && deq ? 0 : -ENOMEM;
    for (unsigned k = 0; k < ow && r == 0; k++) {
        char dir[4096];
        unsigned rk = 0, wk = 0;
        uint64_t lk = 0;
        if (rank_dir(dir, sizeof(dir), root, k) < 0)
            r = ZO_FAIL(&p->err, -ENAMETOOLONG, "%s: root too long", fn);
        else if ((r = zo_ckpt_open(&rd[k], dir, cname)) < 0)
            r = ZO_FAIL(&p->err, r, "%s: checkpoint %s was saved by %u ranks, but rank %u's shard cannot be opened "
                        "(%s)", fn, cname, ow, k, zo_last_error_detail());
        else if (parse_record(zo_ckpt_user_json(rd[k]), &rk, &wk, &lk) < 0 || rk != k || wk != ow ||
                 lk != layout_fp(p, ow))
            r = ZO_FAIL(&p->err, ZO_EFORMAT, "%s: %s/%s is not rank %u of %u's shard of this model", fn, dir, cname,
                        k, ow);
    }
    /* old rank 0 owns a piece of every group: its record lists them all */
    for (unsigned g = 0; g < p->ngroups && r == 0; g++) {
        uint64_t lo, n;
        old_shard(p, g, 0, ow, &lo, &n);
        if (n)
            nrec++;
        if (p->ginner[g] >= 0)
            map[p->ginner[g]] = nrec - 1;
    }
    if (r == 0 && !(buf = malloc(buf_bytes)))
        r = -ENOMEM;
    if (r == 0)
        p->broken = 1; /* overwriting the shard: until the collective below has been made */
    for (unsigned g = 0; g < p->ngroups && r == 0; g++) {
        if (p->ginner[g] < 0)
            continue;
        uint64_t nlo = p->slo[g], nhi = nlo + p->sn[g], sg = p->gsg[g];
        unsigned nos = 0;
        for (unsigned k = 0; k < ow && r == 0; k++) {
            /* old rank k's sub-groups of groups before g come first in its
             * store, and its record lists the groups it holds a piece of */
            unsigned base = 0, idx = 0;
            for (unsigned h = 0; h < g; h++) {
                uint64_t l, n;
                old_shard(p, h, k, ow, &l, &n);
                base += (unsigned)((n + p->gsg[h] - 1) / p->gsg[h]);
                idx += n > 0;
            }
            oshard *o = &os[nos];
            old_shard(p, g, k, ow, &o->lo, &o->n);
            if (ZO_MAX(nlo, o->lo) >= ZO_MIN(nhi, o->lo + o->n))
                continue;
            o->rd = rd[k];
            o->base = base;
            if ((r = old_state_type(p, rd[k], idx, &o->ty, fn)) == 0)
                nos++;
        }
        /* Tiles of the new shard, each whole blocks of the new layout
         * (`rtile` is a multiple of every block size, and a tile ends
         * at its sub-group's end at the latest), filled from every old
         * shard they overlap and imported once: zo_optim_state_import()
         * into a quantized state requantizes the whole blocks it touches,
         * so a block imported in two pieces would be quantized twice, its
         * first piece with a scale that is not the block's. */
        for (uint64_t e = nlo; e < nhi && r == 0;) {
            uint64_t j = (e - nlo) / sg, te = ZO_MIN(ZO_MIN(e + rtile, nlo + (j + 1) * sg), nhi);
            for (int s = 0; s < ZO_OPTIM_STATE_COUNT && r == 0; s++) {
                uint64_t got = 0, none = 0;
                for (unsigned i = 0; i < nos && r == 0; i++) {
                    uint64_t a = ZO_MAX(e, os[i].lo), b = ZO_MIN(te, os[i].lo + os[i].n);
                    int absent = 0;
                    if (a >= b)
                        continue;
                    r = reshard_read(p, &os[i], g, a, b, s, x + (a - e), deq, &rb, &rs, &absent, fn);
                    *(absent ? &none : &got) += b - a;
                }
                if (r < 0 || got == 0)
                    continue; /* a state the optimizer does not keep */
                if (none)
                    r = ZO_FAIL(&p->err, ZO_EFORMAT, "%s: checkpoint %s: some old ranks lack state %d of group %u",
                                fn, cname, s, g);
                else if ((r = zo_optim_state_import(p->inner, (unsigned)p->ginner[g], (zo_optim_state)s, x,
                                                    ZO_DTYPE_F32, e - nlo, te - e)) < 0)
                    r = ZO_FAIL(&p->err, r, "%s: %s", fn, zo_optim_errmsg(p->inner));
            }
            e = te;
        }
    }
    if (r == 0 && (r = zo__optim_adopt_record(p->inner, zo_ckpt_user_json(rd[0]), nrec, map)) < 0)
        r = ZO_FAIL(&p->err, r, "%s: the record of %s: %s", fn, cname, zo_optim_errmsg(p->inner));
    /* this rank's params: its masters rounded (what the old run's update wrote) */
    for (unsigned g = 0; g < p->ngroups && r == 0; g++) {
        if (p->ginner[g] < 0)
            continue;
        uint64_t n = p->sn[g], tile = buf_bytes / 4;
        mst = mst ? mst : malloc(buf_bytes);
        void *dst = (char *)p->flat + (p->goff[g] + p->slo[g]) * p->pes;
        for (uint64_t e = 0; e < n && r == 0 && mst; e += tile) {
            size_t c = (size_t)ZO_MIN(n - e, tile);
            if ((r = zo_optim_state_export(p->inner, (unsigned)p->ginner[g], ZO_OPTIM_STATE_MASTER, mst, ZO_DTYPE_F32,
                                           e, c)) < 0 ||
                (r = zo_vec_cast(buf, p->pdt, mst, ZO_DTYPE_F32, c)) < 0)
                break;
            if (p->host)
                memcpy((char *)dst + e * p->pes, buf, c * p->pes);
            else if ((r = zo_memcpy_async(p->st, (char *)dst + e * p->pes, buf, c * p->pes, ZO_COPY_H2D)) < 0 ||
                     (r = zo_stream_sync(p->st)) < 0)
                break;
        }
        if (!mst)
            r = -ENOMEM;
        if (r < 0 && !zo_part_errmsg(p)[0])
            r = ZO_FAIL(&p->err, r, "%s: rebuilding the params: %s", fn, zo_optim_errmsg(p->inner));
    }
    if (r == 0 && user_json && len) {
        /* the zo_part wrapper, as zo_optim_load() hands it back: the
         * record's "user" value without the record's closing brace */
        const char *u = strstr(zo_ckpt_user_json(rd[0]), "]},\"user\":");
        char *w = u ? strdup(u + strlen("]},\"user\":")) : NULL;
        size_t wl = w ? strlen(w) : 0;
        if (wl && w[wl - 1] == '}')
            w[wl - 1] = 0;
        user_out(w ? w : "", user_json, len);
        free(w);
    }
    for (unsigned k = 0; rd && k < ow; k++)
        zo_ckpt_close(&rd[k]);
    free(rd);
    free(map);
    free(buf);
    free(mst);
    free(os);
    free(x);
    free(deq);
    free(rb.p);
    free(rs.p);
    /* every rank's shard must be in before the params are shared: a rank
     * that failed says so in this all-reduce instead of leaving the others
     * in the all-gather */
    double failed = r < 0;
    int cr = p->comm.all_reduce ? p->comm.all_reduce(p->comm.user, &failed, 1, ZO_COMM_MAX) : 0;
    if (cr)
        return comm_failed(p, cr, fn, "all_reduce (did every rank load its shard)");
    if (r < 0)
        return r;
    if (failed > 0)
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: another rank could not load its shard of %s", fn, cname);
    return loaded(p, fn);
}

int zo_part_load(zo_part *p, const char *root, const char *name, char *user_json, size_t len)
{
    static const char fn[] = "zo_part_load";
    enter(p);
    if (!p || !root)
        return ZO_FAIL(p ? &p->err : NULL, -EINVAL, "%s: NULL argument", fn);
    if (any_in(p))
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: gradients were handed over in this micro-step", fn);
    if (p->dpu)
        (void)zo_optim_wait(p->inner, NULL); /* an update in flight is replaced by the checkpoint */
    unsigned ow = 0;
    char cname[ZO_CKPT_NAME_MAX + 1], wname[ZO_CKPT_NAME_MAX + 1];
    int r = 0;
    cname[0] = 0;
    if (!name) {
        /* the latest the world committed; a root without world.json (saved
         * before commits existed) falls back to each rank's latest */
        r = world_latest(root, wname, sizeof(wname));
        if (r == 0)
            name = wname;
        else if (r == -ENOENT)
            r = 0;
        else
            r = ZO_FAIL(&p->err, r, "%s: %s/" WORLD_FILE ": %s", fn, root,
                        r == ZO_EFORMAT ? "no checkpoint name in it" : zo_strerror(r));
    }
    if (r == 0)
        r = check_ckpt(p, root, name, fn, &ow, cname, sizeof(cname));
    /* Every rank's verdict before anything is read: a rank that cannot
     * load says so here instead of leaving the others in a collective,
     * and the ranks must have found the same checkpoint (each rank's own
     * latest, for a root without world.json, may differ after a crash).
     * The name's hash below 2^52 is exact in a double: max of h and of -h. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = cname; r == 0 && *c; c++)
        h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    double v[3] = {r < 0, r < 0 ? 0 : (double)(h >> 12), r < 0 ? 0 : -(double)(h >> 12)};
    int cr = all_reduce(p, v, 3, ZO_COMM_MAX, fn, "all_reduce (can every rank load)");
    if (cr < 0 || r < 0)
        return cr < 0 ? cr : r;
    if (v[0] > 0)
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: another rank cannot load checkpoint %s (its error is on that rank); "
                       "nothing was read", fn, cname);
    if (v[1] != -v[2])
        return ZO_FAIL(&p->err, ZO_EFORMAT, "%s: the ranks' latest checkpoints under %s differ (rank %u's is %s; a "
                       "save was interrupted before world commits existed): name the checkpoint to load", fn, root,
                       p->comm.rank, cname);
    if (ow != p->comm.world)
        return reshard_load(p, root, cname, ow, user_json, len, fn);
    char dir[4096];
    rank_dir(dir, sizeof(dir), root, p->comm.rank);
    size_t cap = (user_json ? len : 0) + 1024;
    char *js = malloc(cap);
    if (!js)
        return -ENOMEM;
    p->broken = 1; /* until the collective below has been made */
    r = zo_optim_load(p->inner, dir, cname, js, cap);
    if (r < 0)
        ZO_FAIL(&p->err, r, "%s: rank %u: %s", fn, p->comm.rank, zo_optim_errmsg(p->inner));
    else
        user_out(js, user_json, len);
    free(js);
    /* as above: a rank whose data failed must not leave the others in the all-gather */
    double failed = r < 0;
    if ((cr = all_reduce(p, &failed, 1, ZO_COMM_MAX, fn, "all_reduce (did every rank load)")) < 0 || r < 0)
        return cr < 0 ? cr : r;
    if (failed > 0)
        return ZO_FAIL(&p->err, ZO_ESTATE, "%s: another rank could not load its shard of %s", fn, cname);
    return loaded(p, fn);
}

int zo_part_get_info(zo_part *p, zo_part_info *info)
{
    if (!p || !info)
        return ZO_FAIL(p ? &p->err : NULL, -EINVAL, "zo_part_get_info: NULL");
    int r = ZO_STRUCT_OUT(info, (const zo_part_info *)NULL, ZO_PART_INFO_SIZE_V1, &p->err, "zo_part_get_info");
    if (r < 0)
        return r;
    zo_optim_info oi = {.struct_size = sizeof(oi)};
    zo_optim_get_info(p->inner, &oi);
    zo_part_info pi = {.struct_size = sizeof(pi)};
    pi.rank = p->comm.rank;
    pi.world = p->comm.world;
    pi.ntensors = p->nt;
    pi.nbuckets = p->nb;
    pi.numel = p->numel;
    pi.shard_numel = p->shard_numel;
    pi.state_host_bytes = p->fp.host_state_bytes;
    pi.state_nvme_bytes = p->fp.nvme_state_bytes;
    pi.pinned_bytes = oi.pinned_bytes;
    pi.host_bytes = oi.host_bytes + p->own_host_bytes;
    pi.device_bytes = p->device_bytes;
    pi.step = oi.step;
    pi.reduce_scatters = p->n_rs;
    pi.buckets_in_grad = p->n_rs_grad;
    pi.all_gathers = p->n_ag;
    return ZO_STRUCT_OUT(info, &pi, ZO_PART_INFO_SIZE_V1, &p->err, "zo_part_get_info");
}

/* ---- create / destroy --------------------------------------------------------------- */

void zo_part_destroy(zo_part **pp)
{
    if (!pp || !*pp)
        return;
    zo_part *p = *pp;
    *pp = NULL;
    drain_quiet(p); /* requests still in flight are the comm's to release */
    zo_optim_destroy(&p->inner);
    if (p->st)
        zo_stream_destroy(&p->st);
    if (p->dev) {
        if (p->flat)
            zo_dev_free(p->dev, p->flat);
        for (unsigned i = 0; i < 2; i++)
            if (p->bucket[i])
                zo_dev_free(p->dev, p->bucket[i]);
    }
    free(p->stage);
    free(p->sgrad);
    free(p->gnumel);
    free(p->goff);
    free(p->gshard);
    free(p->gsg);
    free(p->names);
    free(p->slo);
    free(p->sn);
    free(p->sgoff);
    free(p->gcounts);
    free(p->ginner);
    free(p->gneed);
    free(p->ghave);
    free(p->tnumel);
    free(p->toff);
    free(p->tgroup);
    free(p->tb0);
    free(p->tb1);
    free(p->tdev);
    free(p->tgrad);
    free(p->tin);
    free(p->b);
    free(p->bcounts);
    free(p);
}

static int add_bucket(zo_part *p, unsigned *cap, unsigned g, unsigned t0, unsigned t1, uint64_t lo, uint64_t hi)
{
    if (p->nb == *cap) {
        unsigned nc = *cap ? *cap * 2 : 16;
        pbucket *nbk = realloc(p->b, nc * sizeof(*nbk));
        if (!nbk)
            return -ENOMEM;
        p->b = nbk;
        *cap = nc;
    }
    p->b[p->nb++] = (pbucket){.group = g, .t0 = t0, .t1 = t1, .lo = lo, .hi = hi};
    p->bmax = ZO_MAX(p->bmax, hi - lo);
    return 0;
}

/* Buckets in backward order: groups last to first, tensors last to first,
 * at most `cap` elements; a larger tensor is cut into pieces, its last
 * piece first. */
static int make_buckets(zo_part *p, const zo_optim_config *oc, uint64_t cap)
{
    unsigned bcap = 0, first = p->nt;
    for (unsigned g = oc->ngroups; g-- > 0;) {
        first -= oc->groups[g].ntensors;
        unsigned t = first + oc->groups[g].ntensors;
        while (t-- > first) {
            int r;
            if (p->tnumel[t] > cap) {
                uint64_t pieces = (p->tnumel[t] + cap - 1) / cap;
                for (uint64_t k = pieces; k-- > 0;) {
                    uint64_t lo = p->toff[t] + k * cap, hi = ZO_MIN(lo + cap, p->toff[t] + p->tnumel[t]);
                    if ((r = add_bucket(p, &bcap, g, t, t, lo, hi)) < 0)
                        return r;
                }
                continue;
            }
            unsigned t1 = t;
            uint64_t acc = p->tnumel[t];
            while (t > first && acc + p->tnumel[t - 1] <= cap)
                acc += p->tnumel[--t];
            if ((r = add_bucket(p, &bcap, g, t, t1, p->toff[t], p->toff[t1] + p->tnumel[t1])) < 0)
                return r;
        }
    }
    unsigned w = p->comm.world, me = p->comm.rank;
    p->bcounts = calloc((size_t)p->nb * w, sizeof(*p->bcounts));
    p->tb0 = calloc(p->nt, sizeof(*p->tb0));
    p->tb1 = calloc(p->nt, sizeof(*p->tb1));
    if (!p->bcounts || !p->tb0 || !p->tb1)
        return -ENOMEM;
    for (unsigned i = 0; i < p->nt; i++)
        p->tb0[i] = UINT32_MAX;
    for (unsigned bi = 0; bi < p->nb; bi++) {
        pbucket *bk = &p->b[bi];
        bk->counts = p->bcounts + (size_t)bi * w;
        uint64_t S = p->gshard[bk->group], N = p->gnumel[bk->group];
        for (unsigned r = 0; r < w; r++) {
            uint64_t a = ZO_MAX(bk->lo, ZO_MIN((uint64_t)r * S, N)), e = ZO_MIN(bk->hi, ZO_MIN((uint64_t)(r + 1) * S, N));
            bk->counts[r] = e > a ? e - a : 0;
        }
        if (bk->counts[me])
            p->gneed[bk->group]++;
        for (unsigned t = bk->t0; t <= bk->t1; t++) {
            p->tb0[t] = ZO_MIN(p->tb0[t], bi);
            p->tb1[t] = ZO_MAX(p->tb1[t], bi);
        }
    }
    return 0;
}

static int check_cfg(zo_part *p, const zo_part_config *cfg, const zo_optim_config *oc)
{
    static const char fn[] = "zo_part_create";
    const zo_comm *c = &p->comm;
    if (c->world == 0 || c->rank >= c->world)
        return ZO_FAIL(&p->err, ZO_ECONFIG, "%s: comm rank %u of world %u (world >= 1, rank < world)", fn, c->rank,
                       c->world);
    if (c->world > 1 && (!c->reduce_scatter || !c->all_gather || !c->all_reduce))
        return ZO_FAIL(&p->err, ZO_ECONFIG, "%s: comm callbacks missing (%s%s%s): every one is needed with world %u",
                       fn, c->reduce_scatter ? "" : "reduce_scatter ", c->all_gather ? "" : "all_gather ",
                       c->all_reduce ? "" : "all_reduce", c->world);
    int na = !!c->reduce_scatter_start + !!c->all_gather_start + !!c->wait;
    if (na != 0 && na != 3)
        return ZO_FAIL(&p->err, ZO_ECONFIG, "%s: comm: the asynchronous callbacks come together (missing: %s%s%s)",
                       fn, c->reduce_scatter_start ? "" : "reduce_scatter_start ",
                       c->all_gather_start ? "" : "all_gather_start ", c->wait ? "" : "wait");
    if (cfg->bucket_bytes < PART_MIN_BUCKET)
        return ZO_FAIL(&p->err, ZO_ECONFIG, "%s: bucket_bytes %" PRIu64 " (>= %u)", fn, cfg->bucket_bytes,
                       PART_MIN_BUCKET);
    if (!oc->dev || !oc->groups || !oc->ngroups)
        return ZO_FAIL(&p->err, -EINVAL, "%s: the template has no device or no groups", fn);
    if (oc->dpu && oc->dpu_double_buffer)
        return ZO_FAIL(&p->err, ZO_ENOTSUP, "%s: dpu_double_buffer is not supported with partitioning (the "
                       "all-gather runs in place over the engine's one copy of the params): leave it 0", fn);
    if (oc->clip_mode == ZO_OPTIM_CLIP_SPECULATIVE)
        return ZO_FAIL(&p->err, ZO_ENOTSUP, "%s: the speculative clip mode is not supported with partitioning "
                       "(the global norm is known only after every rank's gradients): use ZO_OPTIM_CLIP_TWO_PASS", fn);
    if (oc->no_grad == ZO_OPTIM_NO_GRAD_SKIP)
        return ZO_FAIL(&p->err, ZO_ENOTSUP, "%s: ZO_OPTIM_NO_GRAD_SKIP is not supported with partitioning (a shard "
                       "holds pieces of many tensors, updated together)", fn);
    if (oc->param_dtype == ZO_DTYPE_COUNT || zo_dtype_size(oc->param_dtype) == 0)
        return ZO_FAIL(&p->err, ZO_ECONFIG, "%s: param_dtype is not set", fn);
    for (unsigned g = 0; g < oc->ngroups; g++) {
        const zo_optim_group *ug = &oc->groups[g];
        if (ug->struct_size != sizeof(zo_optim_group) || !ug->ntensors || !ug->numel)
            return ZO_FAIL(&p->err, -EINVAL, "%s: group %u not filled by zo_optim_group_default() or has no tensors",
                           fn, g);
        if (!ug->dev_params)
            return ZO_FAIL(&p->err, ZO_ECONFIG, "%s: group %u has no dev_params: the engine all-gathers the "
                           "updated params into them", fn, g);
        for (unsigned i = 0; i < ug->ntensors; i++)
            if (!ug->numel[i] || !ug->dev_params[i])
                return ZO_FAIL(&p->err, -EINVAL, "%s: group %u tensor %u: numel 0 or dev_params NULL", fn, g, i);
    }
    /* on the whole model (the groups checked above): a rank's engine may
     * hold only unquantized groups, and make_inner() then leaves the maps
     * out of its config */
    return zo__optim_check_maps(oc, &p->err, fn);
}

/* The inner engine: one tensor per group of which this rank owns a shard,
 * its device params inside the flat buffer; fp32 gradients (the averaged
 * shard gradients, handed over from the host). */
static int make_inner(zo_part *p, const zo_optim_config *oc, unsigned ninner)
{
    unsigned me = p->comm.rank, w = p->comm.world;
    zo_optim_group *ig = calloc(ninner, sizeof(*ig));
    uint64_t *inumel = calloc(ninner, sizeof(*inumel));
    char *iname = calloc(ninner, 64);
    const char **inp = calloc(ninner, sizeof(*inp));
    void **idev = calloc(ninner, sizeof(*idev));
    int r = -ENOMEM;
    if (!ig || !inumel || !iname || !inp || !idev)
        goto out;
    for (unsigned g = 0; g < p->ngroups; g++) {
        int k = p->ginner[g];
        if (k < 0)
            continue;
        ig[k] = oc->groups[g];
        inumel[k] = p->sn[g];
        snprintf(iname + (size_t)k * 64, 64, "g%u.shard.r%uof%u", g, me, w);
        inp[k] = iname + (size_t)k * 64;
        idev[k] = (char *)p->flat + (p->goff[g] + p->slo[g]) * p->pes;
        ig[k].ntensors = 1;
        ig[k].numel = &inumel[k];
        ig[k].names = &inp[k];
        ig[k].dev_params = &idev[k];
    }
    zo_optim_config ic = *oc;
    ic.groups = ig;
    ic.ngroups = ninner;
    ic.grad_dtype = ZO_DTYPE_F32;
    /* the maps reach every rank's quantized groups; a rank that owns no
     * shard of them would refuse a map it does not use (checked on the
     * whole model in check_cfg()) */
    unsigned users = zo__q_map_users(&ic);
    if (!(users & 1u << ZO_OPTIM_STATE_EXP_AVG))
        ic.state_map_m = ZO_QMAP_COUNT;
    if (!(users & 1u << ZO_OPTIM_STATE_EXP_AVG_SQ))
        ic.state_map_v = ZO_QMAP_COUNT;
    p->fp.struct_size = sizeof(p->fp);
    zo_optim_estimate(&ic, 0, &p->fp); /* create reports what it refuses */
    if ((r = zo_optim_create(&p->inner, &ic)) < 0)
        r = ZO_FAIL(&p->err, r, "zo_part_create: rank %u's engine: %s", me, zo_last_error_detail());
out:
    free(ig);
    free(inumel);
    free(iname);
    free(inp);
    free(idev);
    return r;
}

int zo_part_create(zo_part **out, const zo_part_config *ucfg)
{
    static const char fn[] = "zo_part_create";
    if (out)
        *out = NULL;
    if (!out || !ucfg)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL %s", fn, out ? "cfg" : "out");
    zo_part *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    zo_part_config cfg;
    zo_part_config_default(&cfg);
    zo_optim_config oc;
    zo_optim_config_default(&oc);
    int r = ZO_STRUCT_IN(&cfg, ucfg, sizeof(zo_part_config), &p->err, fn);
    if (r < 0)
        goto fail;
    if (!cfg.optim || !cfg.comm) {
        r = ZO_FAIL(&p->err, -EINVAL, "%s: no %s", fn, cfg.optim ? "comm" : "optim template");
        goto fail;
    }
    zo_comm_default(&p->comm);
    if ((r = ZO_STRUCT_IN(&p->comm, cfg.comm, offsetof(zo_comm, reduce_scatter_start), &p->err, fn)) < 0 ||
        (r = ZO_STRUCT_IN(&oc, cfg.optim, offsetof(zo_optim_config, no_grad), &p->err, fn)) < 0 ||
        (r = check_cfg(p, &cfg, &oc)) < 0)
        goto fail;
    unsigned w = p->comm.world, me = p->comm.rank;
    p->dev = oc.dev;
    p->host = zo_dev_get_kind(p->dev) == ZO_DEV_HOST;
    p->pdt = oc.param_dtype;
    p->gdt = oc.grad_dtype == ZO_DTYPE_COUNT ? oc.param_dtype : oc.grad_dtype;
    p->pes = zo_dtype_size(p->pdt);
    p->dpu = oc.dpu;
    p->ges = zo_dtype_size(p->gdt);
    if (!p->ges) {
        r = ZO_FAIL(&p->err, ZO_ECONFIG, "%s: grad_dtype %d", fn, (int)oc.grad_dtype);
        goto fail;
    }
    p->accum = oc.grad_accum_steps ? oc.grad_accum_steps : 1;
    p->ngroups = oc.ngroups;
    for (unsigned g = 0; g < oc.ngroups; g++)
        p->nt += oc.groups[g].ntensors;
    unsigned G = p->ngroups, T = p->nt;
    p->gnumel = calloc(G, 8);
    p->goff = calloc(G, 8);
    p->gshard = calloc(G, 8);
    p->gsg = calloc(G, 8);
    p->slo = calloc(G, 8);
    p->sn = calloc(G, 8);
    p->sgoff = calloc(G, 8);
    p->gcounts = calloc((size_t)G * w, 8);
    p->ginner = calloc(G, sizeof(int));
    p->gneed = calloc(G, sizeof(unsigned));
    p->ghave = calloc(G, sizeof(unsigned));
    p->tnumel = calloc(T, 8);
    p->toff = calloc(T, 8);
    p->tgroup = calloc(T, sizeof(unsigned));
    p->tdev = calloc(T, sizeof(void *));
    p->tgrad = calloc(T, sizeof(void *));
    p->tin = calloc(T, 1);
    if (!p->gnumel || !p->goff || !p->gshard || !p->gsg || !p->slo || !p->sn || !p->sgoff || !p->gcounts || !p->ginner ||
        !p->gneed || !p->ghave || !p->tnumel || !p->toff || !p->tgroup || !p->tdev || !p->tgrad || !p->tin) {
        r = -ENOMEM;
        goto fail;
    }
    /* layout: each group flat, cut into world shards of S (even) elements */
    uint64_t flat = 0;
    size_t nlen = 0, ncap = 0;
    unsigned ti = 0, ninner = 0;
    for (unsigned g = 0; g < G; g++) {
        const zo_optim_group *ug = &oc.groups[g];
        uint64_t n = 0;
        p->gsg[g] = ug->sub_group_size ? ug->sub_group_size : oc.sub_group_size;
        for (unsigned i = 0; i < ug->ntensors; i++, ti++) {
            p->tnumel[ti] = ug->numel[i];
            p->toff[ti] = n;
            p->tgroup[ti] = g;
            p->tdev[ti] = ug->dev_params[i];
            n += ug->numel[i];
            char nm[48];
            const char *name = ug->names && ug->names[i] ? ug->names[i] : nm;
            if (name == nm)
                snprintf(nm, sizeof(nm), "g%u.t%u", g, i);
            size_t l = strlen(name) + 1;
            if (nlen + l > ncap) {
                size_t nc = ZO_MAX(ncap * 2, nlen + l + 256);
                char *nb = realloc(p->names, nc);
                if (!nb) {
                    r = -ENOMEM;
                    goto fail;
                }
                p->names = nb;
                ncap = nc;
            }
            memcpy(p->names + nlen, name, l);
            nlen += l;
        }
        p->gnumel[g] = n;
        p->goff[g] = flat;
        flat += n;
        uint64_t S = (n + w - 1) / w;
        S += S & 1;
        p->gshard[g] = S;
        for (unsigned k = 0; k < w; k++) {
            uint64_t a = ZO_MIN((uint64_t)k * S, n), e = ZO_MIN((uint64_t)(k + 1) * S, n);
            p->gcounts[(size_t)g * w + k] = e - a;
        }
        p->slo[g] = ZO_MIN((uint64_t)me * S, n);
        p->sn[g] = p->gcounts[(size_t)g * w + me];
        p->sgoff[g] = p->shard_numel;
        p->shard_numel += p->sn[g];
        p->ginner[g] = p->sn[g] ? (int)ninner++ : -1;
    }
    p->numel = flat;
    p->layout_fp = layout_fp(p, w);
    /* every rank must own something (the last rank owns the least of every group) */
    uint64_t last = 0;
    for (unsigned g = 0; g < G; g++)
        last += p->gcounts[(size_t)g * w + w - 1];
    if (!last) {
        r = ZO_FAIL(&p->err, ZO_ECONFIG, "%s: the model (%" PRIu64 " elements) is too small for %u ranks: rank %u "
                    "would own nothing", fn, flat, w, w - 1);
        goto fail;
    }
    if ((r = zo_dev_malloc(p->dev, &p->flat, (size_t)(flat * p->pes))) < 0) {
        p->flat = NULL;
        r = ZO_FAIL(&p->err, r, "%s: flat params (%" PRIu64 " bytes): %s", fn, flat * p->pes, zo_dev_errmsg(p->dev));
        goto fail;
    }
    if ((r = make_buckets(p, &oc, ZO_MAX(cfg.bucket_bytes / p->ges, (uint64_t)1))) < 0)
        goto fail;
    /* an asynchronous comm: two buckets, one filling while one moves */
    p->async = w > 1 && p->comm.reduce_scatter_start;
    p->nbuf = p->async ? 2 : 1;
    for (unsigned i = 0; i < p->nbuf; i++)
        if ((r = zo_dev_malloc(p->dev, &p->bucket[i], (size_t)(p->bmax * p->ges))) < 0) {
            p->bucket[i] = NULL;
            r = ZO_FAIL(&p->err, r, "%s: gradient bucket (%" PRIu64 " bytes): %s", fn, p->bmax * p->ges,
                        zo_dev_errmsg(p->dev));
            goto fail;
        }
    p->device_bytes = flat * p->pes + p->nbuf * p->bmax * p->ges;
    p->sgrad = calloc(p->shard_numel, sizeof(float));
    if (!p->sgrad || (!p->host && !(p->stage = malloc((size_t)(p->bmax * p->ges))))) {
        r = -ENOMEM;
        goto fail;
    }
    p->own_host_bytes = p->shard_numel * 4 + (p->host ? 0 : p->bmax * p->ges);
    if ((r = zo_stream_create(p->dev, &p->st)) < 0) {
        r = ZO_FAIL(&p->err, r, "%s: stream: %s", fn, zo_dev_errmsg(p->dev));
        goto fail;
    }
    if ((r = make_inner(p, &oc, ninner)) < 0)
        goto fail;
    *out = p;
    return 0;
fail:
    zo_part_destroy(&p);
    return r;
}
