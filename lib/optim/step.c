/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The update, on the engine's worker thread: gradient statistics, overflow
 * policy and loss scaler, the fused cpuadam pass per sub-group (two-pass or
 * speculative with rollback), and the copy of each finished sub-group's
 * parameters to the device.
 */
#include "optim_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zoffload/mem.h>
#include <zoffload/vec.h>

/* ---- worker state machine --------------------------------------------------------- */

int zo__wstate_set(zo_optim *o, zo__wstate to)
{
    pthread_mutex_lock(&o->lock);
    zo__wstate from = o->ws;
    int ok;
    switch (to) {
    case ZO__W_QUEUED: ok = from == ZO__W_IDLE; break;
    case ZO__W_RUNNING: ok = from == ZO__W_QUEUED; break;
    case ZO__W_DONE: ok = from == ZO__W_RUNNING; break;
    case ZO__W_IDLE: ok = from == ZO__W_DONE; break;
    case ZO__W_EXIT: ok = from == ZO__W_IDLE || from == ZO__W_DONE; break;
    default: ok = 0;
    }
    if (ok)
        o->ws = to;
    pthread_cond_broadcast(&o->cond);
    pthread_mutex_unlock(&o->lock);
    if (!ok) {
        ZO_LOGE("optim worker: illegal transition %d -> %d", (int)from, (int)to);
        return ZO_EINTERNAL;
    }
    return 0;
}

/* ---- DeepSpeed's DynamicLossScaler -------------------------------------------------- */

void zo__scaler_init(zo__scaler *sc, const zo_optim_config *cfg, zo_dtype pdt)
{
    memset(sc, 0, sizeof(*sc));
    sc->last_overflow_iter = -1;
    sc->cur_hysteresis = cfg->hysteresis;
    if (pdt != ZO_DTYPE_F16) {
        sc->scale = 1.0; /* bf16 / fp32: no scaling */
    } else if (cfg->loss_scale > 0) {
        sc->scale = cfg->loss_scale; /* static */
    } else {
        sc->dynamic = 1;
        sc->scale = ldexp(1.0, cfg->initial_scale_power);
    }
}

/* deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale,
 * scale_factor 2 */
void zo__scaler_update(zo__scaler *sc, const zo_optim_config *cfg, int overflow)
{
    if (!sc->dynamic)
        return;
    if (overflow) {
        if (cfg->hysteresis == 1 || sc->cur_hysteresis == 1)
            sc->scale = fmax(sc->scale / 2.0, cfg->min_loss_scale);
        else
            sc->cur_hysteresis--;
        sc->last_overflow_iter = sc->cur_iter;
    } else {
        if (cfg->consecutive_hysteresis)
            sc->cur_hysteresis = cfg->hysteresis;
        if ((sc->cur_iter - sc->last_overflow_iter) % cfg->loss_scale_window == 0) {
            if (!cfg->consecutive_hysteresis)
                sc->cur_hysteresis = cfg->hysteresis;
            sc->scale *= 2.0;
        }
    }
    sc->cur_iter++;
}

/* ---- pieces ------------------------------------------------------------------------ */

/* Queue the copy of params [lo, hi) (flat elements) from pbuf[pb] to
 * device param buffer db of the tensors they belong to. */
int zo__push_range(zo_optim *o, unsigned pb, unsigned db, uint64_t lo, uint64_t hi)
{
    for (unsigned i = zo__tensor_at(o, lo); i < o->nt && o->tensors[i].off < hi; i++) {
        zo__ot *t = &o->tensors[i];
        if (!t->devb[db])
            continue;
        uint64_t s = ZO_MAX(lo, t->off), e = ZO_MIN(hi, t->off + t->numel);
        int r = zo_memcpy_async(o->h2d, (char *)t->devb[db] + (s - t->off) * o->pes,
                                (const char *)o->pbuf[pb] + s * o->pes, (size_t)(e - s) * o->pes, ZO_COPY_H2D);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Sum of squares and inf/NaN count of sub-group i's accumulated gradients
 * in window w: the ones taken at intake when they are complete (gstats.c),
 * else one zo_cpuadam_team_grad_stats() now, over the window in its dtype.
 * All give the same bits. */
static int one_sg_stats(zo_optim *o, unsigned w, unsigned i, zo_grad_stats *gs, uint64_t *ns)
{
    if (zo__gst_get(o, w, i, gs))
        return 0;
    const zo__sg *sg = &o->sgs[i];
    uint64_t t0 = zo__now_ns();
    const void *g;
    zo_dtype gdt;
    float *tmp;
    int r = zo__win_range(o, w, sg->off, sg->n, &g, &gdt, &tmp);
    if (r < 0)
        return r;
    r = zo_cpuadam_team_grad_stats(o->team, g, gdt, (size_t)sg->n, gs);
    zo_aligned_free(tmp);
    if (ns)
        *ns += zo__now_ns() - t0;
    if (r < 0)
        return ZO_FAIL(zo__eb(o), r, "zo_optim: gradient statistics: %s", zo_cpuadam_team_errmsg(o->team));
    return 0;
}

/* The statistics of all sub-groups, summed in sub-group order: the same
 * order in both step modes (and in zo_optim_grad_norm_partial()), so they
 * agree on the norm to the bit. *ns (if set) gets the time of the ones
 * computed here (not taken at intake). */
int zo__sg_stats(zo_optim *o, unsigned w, double *sumsq, uint64_t *nonfinite, uint64_t *ns)
{
    double s = 0;
    uint64_t nf = 0;
    for (unsigned i = 0; i < o->nsg; i++) {
        zo_grad_stats gs;
        int r = one_sg_stats(o, w, i, &gs, ns);
        if (r < 0)
            return r;
        s += gs.sumsq;
        nf += gs.nonfinite;
    }
    *sumsq = s;
    *nonfinite = nf;
    return 0;
}

static double clip_coef(const zo_optim *o, double norm)
{
    if (o->cfg.max_grad_norm <= 0)
        return 1.0;
    double c = o->cfg.max_grad_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

/* Parameter buffer b (that of a finished update) again holds every
 * tensor's params: after direct steps (the kernel wrote device buffer b,
 * which is host memory) they are copied back from the device. Caller's
 * thread; a job may run, but it writes the other buffers. */
int zo__pbuf_fresh(zo_optim *o, unsigned b)
{
    int r = zo__pbuf_need(o, b);
    if (r < 0 || !o->pbuf_stale[b])
        return r;
    for (unsigned i = 0; i < o->nt && r == 0; i++) {
        zo__ot *t = &o->tensors[i];
        if (t->devb[b])
            r = zo_memcpy_async(o->h2d, (char *)o->pbuf[b] + t->off * o->pes, t->devb[b], t->numel * o->pes,
                                ZO_COPY_D2H);
    }
    if (r == 0)
        r = zo_stream_sync(o->h2d);
    if (r < 0)
        return ZO_FAIL(zo__eb(o), r, "zo_optim: reading the parameters back: %s", zo_dev_errmsg(o->dev));
    o->pbuf_stale[b] = 0;
    return 0;
}

/* One fused kernel call (or its rollback) over n elements of a sub-group:
 * states at st, gradients at g (in the window's dtype gdt, or fp32), the
 * param-dtype copy written to `out`; `step` updates applied so far. */
static int kernel_call(zo_optim *o, const zo__sg *sg, void *const st[ZO_OPTIM_STATE_COUNT], uint64_t n,
                       const void *g, zo_dtype gdt, void *out, double scale, double coef, int rollback, int64_t step)
{
    const zo__og *og = &o->groups[sg->group];
    zo_cpuadam_hparams hp = og->hp;
    hp.step = step + 1;
    hp.grad_scale = 1.0 / scale;
    hp.clip_coef = coef;
    if (og->qbits) {
        /* st[m], st[v]: the piece's codes; the scales follow the codes of
         * the whole sub-group (the piece's first block: see q_piece()) */
        zo_cpuadam_qtensors d;
        zo_cpuadam_qtensors_default(&d);
        const zo_cpuadam_qtensors q = {
            .struct_size = d.struct_size, .n = (size_t)n, .param = st[ZO_OPTIM_STATE_MASTER], .grad = g,
            .grad_dtype = gdt, .bits = og->qbits, .block = og->qblock, .map_m = zo__q_map(og, ZO_OPTIM_STATE_EXP_AVG),
            .map_v = zo__q_map(og, ZO_OPTIM_STATE_EXP_AVG_SQ),
            .m_codes = st[ZO_OPTIM_STATE_EXP_AVG], .m_absmax = o->qscale[ZO_OPTIM_STATE_EXP_AVG],
            .v_codes = st[ZO_OPTIM_STATE_EXP_AVG_SQ], .v_absmax = o->qscale[ZO_OPTIM_STATE_EXP_AVG_SQ],
            .param_out = out, .out_dtype = o->pdt};
        int r = zo_cpuadam_team_qstep(o->team, &hp, &q);
        if (r < 0)
            return ZO_FAIL(zo__eb(o), r, "zo_optim: update of sub-group %u (q%d states): %s", (unsigned)(sg - o->sgs),
                           og->qbits, zo_cpuadam_team_errmsg(o->team));
        return 0;
    }
    zo_cpuadam_tensors t;
    zo_cpuadam_tensors_default(&t);
    t.n = (size_t)n;
    t.param = st[ZO_OPTIM_STATE_MASTER];
    t.grad = g;
    t.grad_dtype = gdt;
    t.exp_avg = st[ZO_OPTIM_STATE_EXP_AVG];
    t.exp_avg_sq = st[ZO_OPTIM_STATE_EXP_AVG_SQ];
    t.state_dtype = og->sdt;
    t.param_out = out;
    t.out_dtype = o->pdt;
    int r = rollback ? zo_cpuadam_team_rollback(o->team, &hp, &t) : zo_cpuadam_team_step(o->team, &hp, &t);
    if (r < 0)
        return ZO_FAIL(zo__eb(o), r, "zo_optim: %s of sub-group %u: %s", rollback ? "rollback" : "update",
                       (unsigned)(sg - o->sgs), zo_cpuadam_team_errmsg(o->team));
    return 0;
}

/* Whether tensor t is updated by window w's boundary: every tensor, or
 * under ZO_OPTIM_NO_GRAD_SKIP those that got a gradient in the window. */
static int tensor_updated(const zo_optim *o, unsigned w, unsigned t)
{
    return o->cfg.no_grad != ZO_OPTIM_NO_GRAD_SKIP || o->arrivals[w][t] > 0;
}

/* The fused kernel (or its rollback) over one piece of a sub-group. The
 * params go to the parameter buffer pb, or in direct mode straight into
 * device param buffer db of the tensors that have them (one call per tensor
 * the piece crosses: the update is elementwise, so the bits are the same).
 * Under ZO_OPTIM_NO_GRAD_SKIP the piece is cut where the tensors' step
 * counts or fates differ: a tensor without a gradient is not computed, and
 * where the buffer the update writes does not already hold its params (the
 * other buffer of a DPU pair) they are cast from its master there. */
static int piece_kernel(zo_optim *o, const zo__sg *sg, void *const st[ZO_OPTIM_STATE_COUNT], uint64_t elem_off,
                        uint64_t n, unsigned w, unsigned pb, unsigned db, double scale, double coef,
                        int rollback)
{
    uint64_t lo = sg->off + elem_off, hi = lo + n, lo0 = lo;
    const void *g;
    zo_dtype gdt;
    float *tmp;
    int skip = o->cfg.no_grad == ZO_OPTIM_NO_GRAD_SKIP;
    int r = zo__win_range(o, w, lo, n, &g, &gdt, &tmp);
    if (r < 0)
        return r;
    size_t ges = zo_dtype_size(gdt);
    const zo__og *og = &o->groups[sg->group];
    if (og->qbits && o->direct) {
        /* A block is updated whole, so the piece is one call; its params
         * go straight out when one destination takes them all, else they
         * are cast from the new masters per tensor (the same rounding). */
        unsigned i = zo__tensor_at(o, lo);
        const zo__ot *t = &o->tensors[i];
        int one = t->off + t->numel >= hi;
        void *out = !one ? NULL
                    : t->devb[db] ? (char *)t->devb[db] + (lo - t->off) * o->pes
                                  : (char *)o->pbuf[pb] + lo * o->pes;
        o->pbuf_stale[pb] = 1;
        r = kernel_call(o, sg, st, n, g, gdt, out, scale, coef, rollback, o->step);
        for (const float *m = st[ZO_OPTIM_STATE_MASTER]; r == 0 && !one && lo < hi; i++) {
            t = &o->tensors[i];
            uint64_t e = ZO_MIN(hi, t->off + t->numel);
            out = t->devb[db] ? (char *)t->devb[db] + (lo - t->off) * o->pes : (char *)o->pbuf[pb] + lo * o->pes;
            r = zo_vec_cast(out, o->pdt, m + (lo - lo0), ZO_DTYPE_F32, (size_t)(e - lo));
            lo = e;
        }
        zo_aligned_free(tmp);
        return r;
    }
    if (!o->direct && !skip) {
        r = kernel_call(o, sg, st, n, g, gdt, (char *)o->pbuf[pb] + lo * o->pes, scale, coef, rollback, o->step);
        zo_aligned_free(tmp);
        return r;
    }
    if (o->direct)
        o->pbuf_stale[pb] = 1;
    size_t sz[ZO_OPTIM_STATE_COUNT];
    for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
        sz[k] = k == ZO_OPTIM_STATE_MASTER ? 4 : zo_dtype_size(og->sdt);
    /* runs of tensors that go to pbuf with the same count and fate take one call */
    for (unsigned i = zo__tensor_at(o, lo); lo < hi;) {
        const zo__ot *t = &o->tensors[i];
        int to_dev = o->direct && t->devb[db];
        int upd = tensor_updated(o, w, i);
        int64_t step = skip ? o->tstep[i] : o->step;
        uint64_t e = ZO_MIN(hi, t->off + t->numel);
        if (!to_dev)
            while (i + 1 < o->nt && e < hi && !(o->direct && o->tensors[i + 1].devb[db]) &&
                   tensor_updated(o, w, i + 1) == upd && (!skip || o->tstep[i + 1] == step)) {
                i++;
                e = ZO_MIN(hi, o->tensors[i].off + o->tensors[i].numel);
            }
        void *s2[ZO_OPTIM_STATE_COUNT];
        for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
            s2[k] = st[k] ? (char *)st[k] + (lo - sg->off - elem_off) * sz[k] : NULL;
        void *out = to_dev ? (char *)t->devb[db] + (lo - t->off) * o->pes : (char *)o->pbuf[pb] + lo * o->pes;
        if (upd)
            r = kernel_call(o, sg, s2, e - lo, (const char *)g + (lo - lo0) * ges, gdt, out, scale, coef, rollback,
                            step);
        else if (!rollback && (to_dev ? o->dbl : o->npbuf > 1))
            r = zo_vec_cast(out, o->pdt, s2[ZO_OPTIM_STATE_MASTER], ZO_DTYPE_F32, (size_t)(e - lo));
        if (r < 0)
            break;
        lo = e;
        i++;
    }
    zo_aligned_free(tmp);
    return r;
}

/* What one walk over a list of sub-groups does. */
typedef struct walk {
    const zo__job *job;
    double coef;
    int rollback;        /* take back the update instead of applying it */
    int speculative;     /* check each sub-group's gradients before updating it; stop at an overflow */
    int eager;           /* wait for each sub-group's gradients of the last micro-step (speculative) */
    const unsigned *list; /* sub-group indices, in walk order */
    unsigned n;
    int stopped;         /* an overflow stopped the walk */
} walk;

/* Eager speculative step: once the window is closed by the step call,
 * wait for every copy (errors surface here) and zero the tensors that got
 * no gradient. */
static int eager_land(zo_optim *o, const zo__job *job)
{
    if (o->landed)
        return 0;
    int r = zo_event_sync(o->ev_win[job->win]);
    if (r < 0)
        return ZO_FAIL(zo__eb(o), r, "zo_optim: a gradient copy failed: %s", zo_dev_errmsg(o->dev));
    zo__win_zero_missing(o, job->win);
    o->landed = 1;
    return 0;
}

/* Block until sub-group i's gradients are complete (every tensor it holds
 * got its last micro-step's gradient) or the window is closed; i = -1:
 * until the window is closed. */
static int eager_wait(zo_optim *o, long i, const zo__job *job, zo_optim_timeline *tl)
{
    uint64_t t0 = zo__now_ns();
    pthread_mutex_lock(&o->lock);
    while ((i < 0 || o->gst[job->win].left[i]) && !o->closed && !o->abort)
        pthread_cond_wait(&o->cond, &o->lock);
    int closed = o->closed, abort = o->abort;
    pthread_mutex_unlock(&o->lock);
    tl->stall_ns += zo__now_ns() - t0;
    if (abort)
        return ZO_FAIL(zo__eb(o), ZO_ESTATE, "zo_optim: the engine is being destroyed");
    return closed ? eager_land(o, job) : 0;
}

/* Quantized states (state_bits) are not in the sweep: their codes and
 * scales do not step with the masters' elements. Each sub-group's are
 * taken whole from the host tier as its first piece comes (the home copy
 * under host placement; under NVMe placement one read per state, the next
 * sub-group's prefetched meanwhile) and given back after its last piece,
 * starting their write-back (one write per state). */
static int q_take(zo_optim *o, const zo__sg *sg, uint8_t *base[ZO_OPTIM_STATE_COUNT])
{
    int r = 0, k;
    for (k = 1; k < ZO_OPTIM_STATE_COUNT && r == 0; k++) {
        zo_store_req *rq = NULL;
        void *p = NULL;
        base[k] = NULL;
        if (!sg->t[k])
            continue;
        if ((r = zo_store_acquire(o->store, sg->t[k], ZO_TIER_HOST, ZO_ACQ_WRITE, &rq)) == 0 &&
            (r = zo_store_wait(o->store, rq, &p)) == 0)
            base[k] = p;
    }
    if (r < 0) {
        ZO_FAIL(zo__eb(o), r, "zo_optim: loading the quantized states of sub-group %u: %s", (unsigned)(sg - o->sgs),
                zo_store_errmsg(o->store));
        for (k = 1; k < ZO_OPTIM_STATE_COUNT; k++)
            if (base[k])
                zo_store_release(o->store, sg->t[k], ZO_TIER_HOST, 0);
    }
    return r;
}

static int q_give(zo_optim *o, const zo__sg *sg, uint8_t *base[ZO_OPTIM_STATE_COUNT])
{
    unsigned fl = o->groups[sg->group].place == ZO_OPTIM_PLACE_NVME ? ZO_REL_WRITEBACK | ZO_REL_DROP : 0;
    int r = 0;
    for (int k = 1; k < ZO_OPTIM_STATE_COUNT; k++) {
        int r2 = base[k] ? zo_store_release(o->store, sg->t[k], ZO_TIER_HOST, fl) : 0;
        if (r == 0 && r2 < 0)
            r = ZO_FAIL(zo__eb(o), r2, "zo_optim: writing the quantized states of sub-group %u back: %s",
                        (unsigned)(sg - o->sgs), zo_store_errmsg(o->store));
        base[k] = NULL;
    }
    return r;
}

/* Point st[m], st[v] and o->qscale at the piece's first block (elem_off
 * is a multiple of the block: pieces start on swap chunks, powers of two). */
static int q_piece(zo_optim *o, const zo__sg *sg, uint8_t *const base[ZO_OPTIM_STATE_COUNT], uint64_t elem_off,
                   void *st[ZO_OPTIM_STATE_COUNT])
{
    const zo__og *og = &o->groups[sg->group];
    if (elem_off % og->qblock)
        return ZO_FAIL(zo__eb(o), ZO_EINTERNAL, "zo_optim: sweep piece at element %llu of sub-group %u is not on a "
                       "%zu-element block of its quantized states (pool slots too small for the block?)",
                       (unsigned long long)elem_off, (unsigned)(sg - o->sgs), og->qblock);
    for (int k = 1; k < ZO_OPTIM_STATE_COUNT; k++) {
        st[k] = base[k] ? base[k] + zo__q_code_bytes(elem_off, og->qbits) : NULL;
        o->qscale[k] = base[k] ? (float *)(void *)(base[k] + zo__q_scale_off(sg->n, og->qbits)) + elem_off / og->qblock
                               : NULL;
    }
    return 0;
}

/* Walk sub-groups list[0..n) (all of engine group g) through one store
 * sweep: master, m, v in element lockstep, `buffer_count - 2` pieces read
 * ahead, each piece updated in place and written behind, its new params
 * queued to the device. Host-homed states are walked in place, NVMe ones
 * through the pool: the same loop serves both placements. */
static int walk_group(zo_optim *o, unsigned g, const unsigned *list, unsigned n, walk *w, zo_optim_timeline *tl)
{
    zo__og *og = &o->groups[g];
    int pos[ZO_OPTIM_STATE_COUNT], nt = 0;
    for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
        pos[k] = og->used[k] && !(og->qbits && k != ZO_OPTIM_STATE_MASTER) ? nt++ : -1;
    uint8_t *qb[ZO_OPTIM_STATE_COUNT] = {NULL};
    const zo__sg *qsg = NULL; /* the sub-group whose quantized states are held */
    zo_tensor **ts = malloc((size_t)n * (size_t)nt * sizeof(*ts));
    if (!ts)
        return -ENOMEM;
    for (unsigned i = 0; i < n; i++)
        for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
            if (pos[k] >= 0)
                ts[(size_t)i * (size_t)nt + (size_t)pos[k]] = o->sgs[list[i]].t[k];
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = (unsigned)nt;
    for (int k = 0; k < nt; k++)
        d.mode[k] = ZO_STREAM_READ | ZO_STREAM_WRITE;
    d.ngroups = n;
    d.tensors = ts;
    d.depth = o->cfg.buffer_count - 2;
    if (og->qbits) {
        /* the sweep carries the masters alone (4 bytes an element of the 6
         * that move with q8 states): count its depth in the bytes an fp32
         * master + m + v sweep carries, so as many bytes are queued at the
         * disk as there. At the plain depth the disk saw 4-8 requests and
         * moved 0.8 GB/s each way between the sub-groups' state bursts
         * (docs/benchmarks.md, eleventh stop). */
        unsigned eb = 4;
        for (int k = 1; k < ZO_OPTIM_STATE_COUNT; k++)
            eb += og->used[k] ? 4u : 0u;
        d.depth_elem_bytes = eb;
    }
    zo_store_sweep *sw = NULL;
    int r = zo_store_sweep_open(o->store, &d, &sw);
    free(ts);
    if (r < 0)
        return ZO_FAIL(zo__eb(o), r, "zo_optim: opening the sweep of group %u: %s", g, zo_store_errmsg(o->store));
    const zo__job *job = w->job;
    for (;;) {
        zo_store_sweep_piece pc;
        uint64_t t0 = zo__now_ns();
        r = zo_store_sweep_next(sw, &pc);
        tl->nvme_read_ns += zo__now_ns() - t0;
        if (r < 0) {
            ZO_FAIL(zo__eb(o), r, "zo_optim: loading group %u: %s", g, zo_store_errmsg(o->store));
            break;
        }
        if (pc.nelem == 0)
            break;
        unsigned si = list[pc.group];
        const zo__sg *sg = &o->sgs[si];
        if (w->speculative && pc.elem_off == 0) {
            if (w->eager && (r = eager_wait(o, si, job, tl)) < 0) {
                zo_store_sweep_done(sw, &pc);
                break;
            }
            zo_grad_stats gs;
            r = one_sg_stats(o, job->win, si, &gs, &tl->norm_ns);
            if (r == 0) {
                o->sg_sumsq[si] = gs.sumsq;
                o->sg_nf[si] = gs.nonfinite;
                o->sg_stats[si] = 1;
                w->stopped = gs.nonfinite != 0; /* an overflow: nothing from here on is updated */
            }
            if (r < 0 || w->stopped) {
                zo_store_sweep_done(sw, &pc);
                break;
            }
        }
        void *st[ZO_OPTIM_STATE_COUNT];
        for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
            st[k] = pos[k] >= 0 ? pc.ptr[pos[k]] : NULL;
        if (og->qbits) {
            if (pc.elem_off == 0) {
                t0 = zo__now_ns();
                r = q_take(o, sg, qb);
                tl->nvme_read_ns += zo__now_ns() - t0;
                qsg = r == 0 ? sg : NULL;
                for (int k = 1; k < ZO_OPTIM_STATE_COUNT && r == 0 && pc.group + 1 < n; k++)
                    if (o->sgs[list[pc.group + 1]].t[k] && o->groups[o->sgs[list[pc.group + 1]].group].place ==
                                                               ZO_OPTIM_PLACE_NVME)
                        zo_store_prefetch(o->store, o->sgs[list[pc.group + 1]].t[k], ZO_TIER_HOST);
            }
            if (r == 0)
                r = q_piece(o, sg, qb, pc.elem_off, st);
            if (r < 0) {
                zo_store_sweep_done(sw, &pc);
                break;
            }
        }
        t0 = zo__now_ns();
        r = piece_kernel(o, sg, st, pc.elem_off, pc.nelem, job->win, job->pbuf, job->dbuf, job->scale, w->coef,
                         w->rollback);
        tl->compute_ns += zo__now_ns() - t0;
        int r2 = zo_store_sweep_done(sw, &pc);
        if (r == 0 && r2 < 0)
            r = ZO_FAIL(zo__eb(o), r2, "zo_optim: %s", zo_store_errmsg(o->store));
        if (r == 0 && qsg && pc.group_last) {
            r = q_give(o, qsg, qb);
            qsg = NULL;
        }
        if (r < 0)
            break;
        if (zo__push_now(o, job) && !w->rollback && !o->direct &&
            (r = zo__push_range(o, job->pbuf, job->dbuf, sg->off + pc.elem_off, sg->off + pc.elem_off + pc.nelem)) <
                0) {
            ZO_FAIL(zo__eb(o), r, "zo_optim: queueing the parameter copy: %s", zo_dev_errmsg(o->dev));
            break;
        }
        if (pc.group_last && w->speculative) {
            o->sg_updated[si] = 1;
            pthread_mutex_lock(&o->lock);
            if (w->eager && !o->closed)
                o->eager_updates++;
            pthread_mutex_unlock(&o->lock);
        }
    }
    if (qsg) /* a failure left them held: the error is r's */
        q_give(o, qsg, qb);
    uint64_t t0 = zo__now_ns();
    int rc = zo_store_sweep_close(&sw);
    /* the quantized states' write-backs: their errors are this step's */
    for (unsigned i = 0; og->qbits && og->place == ZO_OPTIM_PLACE_NVME && i < n && rc == 0; i++)
        for (int k = 1; k < ZO_OPTIM_STATE_COUNT && rc == 0; k++)
            if (o->sgs[list[i]].t[k])
                rc = zo_store_flush(o->store, o->sgs[list[i]].t[k]);
    tl->nvme_write_ns += zo__now_ns() - t0;
    if (r == 0 && rc < 0)
        r = ZO_FAIL(zo__eb(o), rc, "zo_optim: writing group %u back: %s", g, zo_store_errmsg(o->store));
    return r;
}

/* Sub-groups of groups a and b can share one store sweep: the same states
 * (the sweep walks them in lockstep), of the same dtypes and home; the
 * kernel takes each piece's hyperparameters from its own group. */
static int sweep_compatible(const zo_optim *o, unsigned a, unsigned b)
{
    const zo__og *x = &o->groups[a], *y = &o->groups[b];
    return a == b || (x->sdt == y->sdt && x->qbits == y->qbits && x->qblock == y->qblock && x->place == y->place &&
                      !memcmp(x->used, y->used, sizeof(x->used)));
}

/* Walk the list, one sweep per run of sub-groups whose groups can share one
 * (a new sweep drains the previous one's write-backs first: the eager step's
 * arrival order may interleave groups). */
static int walk_list(zo_optim *o, walk *w, zo_optim_timeline *tl)
{
    for (unsigned a = 0; a < w->n;) {
        unsigned g = o->sgs[w->list[a]].group, b = a + 1;
        while (b < w->n && sweep_compatible(o, g, o->sgs[w->list[b]].group))
            b++;
        int r = walk_group(o, g, w->list + a, b - a, w, tl);
        if (r < 0 || w->stopped)
            return r;
        a = b;
    }
    return 0;
}

/* The sub-groups, in order, or for the eager step in the order their
 * gradients completed in the last window that completed them all (the
 * order backward produces them: whatever the declaration order and the
 * param groups), reversed before one is known (backward produces the last
 * layers' gradients first). */
static void order(zo_optim *o, unsigned *list, int eager)
{
    if (eager && o->have_order) {
        memcpy(list, o->eager_order, o->nsg * sizeof(*list));
        return;
    }
    for (unsigned i = 0; i < o->nsg; i++)
        list[i] = eager ? o->nsg - 1 - i : i;
}

/* The speculative step: check and update each sub-group at once with
 * coefficient 1 (eagerly, as its gradients complete, when the job was
 * started by the last micro-step's first gradient); roll back what the
 * global norm or an overflow invalidates. */
static int run_speculative(zo_optim *o, const zo__job *job, zo_optim_step_result *res,
                           zo_optim_timeline *tl, int *overflow)
{
    unsigned *list = o->sg_list;
    memset(o->sg_stats, 0, o->nsg);
    memset(o->sg_updated, 0, o->nsg);
    order(o, list, job->eager);
    walk w = {.job = job, .coef = 1.0, .speculative = 1, .eager = job->eager, .list = list, .n = o->nsg};
    int r = walk_list(o, &w, tl);
    if (r == 0 && job->eager)
        r = eager_wait(o, -1, job, tl); /* the step call closes the window */
    if (r < 0)
        return r;
    /* statistics of the sub-groups an overflow kept the walk from; the sum
     * in sub-group order, as the two-pass step sums it */
    double sumsq = 0;
    uint64_t nf = 0;
    for (unsigned i = 0; i < o->nsg; i++) {
        if (!o->sg_stats[i]) {
            zo_grad_stats gs;
            if ((r = one_sg_stats(o, job->win, i, &gs, &tl->norm_ns)) < 0)
                return r;
            o->sg_sumsq[i] = gs.sumsq;
            o->sg_nf[i] = gs.nonfinite;
        }
        sumsq += o->sg_sumsq[i];
        nf += o->sg_nf[i];
    }
    pthread_mutex_lock(&o->lock);
    zo_optim_step_opts opts = o->job.opts; /* the step call's, given at close */
    pthread_mutex_unlock(&o->lock);
    if (opts.global_sumsq >= 0)
        sumsq = opts.global_sumsq;
    int ovf = nf != 0 || opts.global_nonfinite == 1;
    double norm = sqrt(sumsq) / job->scale;
    res->grad_norm = ovf ? (double)INFINITY : norm;
    res->nonfinite = nf;
    *overflow = ovf;
    double coef = ovf ? 1.0 : clip_coef(o, norm);
    unsigned nupd = 0;
    for (unsigned i = 0; i < o->nsg; i++)
        if (o->sg_updated[i])
            list[nupd++] = i;
    if ((ovf || coef < 1.0) && nupd) {
        if (zo__push_now(o, job) && (r = zo_stream_sync(o->h2d)) < 0) /* those copies read what the rollback rewrites */
            return ZO_FAIL(zo__eb(o), r, "zo_optim: parameter copy to the device failed: %s", zo_dev_errmsg(o->dev));
        walk rb = {.job = job, .coef = 1.0, .rollback = 1, .list = list, .n = nupd};
        if ((r = walk_list(o, &rb, tl)) < 0)
            return r;
        res->rolled_back = 1;
        pthread_mutex_lock(&o->lock);
        o->rollbacks++;
        pthread_mutex_unlock(&o->lock);
        if (zo__push_now(o, job) && !o->direct && ovf)
            for (unsigned k = 0; k < nupd && r == 0; k++)
                r = zo__push_range(o, job->pbuf, job->dbuf, o->sgs[list[k]].off,
                                   o->sgs[list[k]].off + o->sgs[list[k]].n);
        if (r < 0)
            return r;
    }
    if (ovf)
        return 0;
    res->clip_coef = coef;
    res->clipped = coef < 1.0;
    if (coef < 1.0) {
        order(o, list, 0);
        walk redo = {.job = job, .coef = coef, .list = list, .n = o->nsg};
        return walk_list(o, &redo, tl);
    }
    return 0;
}

/* ZO_OPTIM_NO_GRAD_SKIP: the tensors window w's applied update changed
 * count it (before the window is finished: it tells which had a gradient). */
static void count_tensor_steps(zo_optim *o, unsigned w)
{
    pthread_mutex_lock(&o->lock);
    for (unsigned t = 0; t < o->nt; t++)
        if (o->arrivals[w][t])
            o->tstep[t]++;
    pthread_mutex_unlock(&o->lock);
}

static void finish_window(zo_optim *o, unsigned w)
{
    zo__gst_keep_order(o, w);
    memset(o->arrivals[w], 0, o->nt * sizeof(uint32_t));
    zo__win_reset(o, w);
    zo__gst_reset(o, w);
}

/* *t_upd: when the update proper started (the window's gradients landed;
 * an eager job's own start, its waits for gradients being its overlap
 * with backward). */
static int run_job(zo_optim *o, const zo__job *job, zo_optim_step_result *res, zo_optim_timeline *tl,
                   uint64_t *t_upd)
{
    unsigned w = job->win;
    uint64_t t0;
    int r = 0;
    *t_upd = zo__now_ns();
    if (!job->eager) {
        t0 = zo__now_ns();
        r = zo_event_sync(o->ev_win[w]);
        tl->stall_ns += zo__now_ns() - t0;
        if (r < 0) {
            finish_window(o, w);
            return ZO_FAIL(zo__eb(o), r, "zo_optim: a gradient copy failed; the window's gradients are dropped: %s",
                           zo_dev_errmsg(o->dev));
        }
        *t_upd = zo__now_ns();
        zo__win_zero_missing(o, w);
    }
    res->loss_scale = job->scale;
    res->clip_coef = 1.0;
    zo_store_stats sa, sb;
    zo_store_get_stats(o->store, &sa);
    int overflow = 0;
    int speculative = job->eager || (o->cfg.clip_mode == ZO_OPTIM_CLIP_SPECULATIVE && job->opts.global_sumsq < 0 &&
                                     job->opts.global_nonfinite < 0);
    if (speculative) {
        r = run_speculative(o, job, res, tl, &overflow);
    } else {
        double sumsq = 0;
        uint64_t nf = 0;
        if (job->opts.global_sumsq < 0 || job->opts.global_nonfinite < 0)
            r = zo__sg_stats(o, w, &sumsq, &nf, &tl->norm_ns);
        if (job->opts.global_sumsq >= 0)
            sumsq = job->opts.global_sumsq;
        if (job->opts.global_nonfinite >= 0)
            overflow = job->opts.global_nonfinite;
        else
            overflow = nf != 0;
        res->nonfinite = nf;
        double norm = sqrt(sumsq) / job->scale;
        res->grad_norm = overflow ? (double)INFINITY : norm;
        if (r == 0 && !overflow) {
            double coef = clip_coef(o, norm);
            res->clip_coef = coef;
            res->clipped = coef < 1.0;
            order(o, o->sg_list, 0);
            walk wk = {.job = job, .coef = coef, .list = o->sg_list, .n = o->nsg};
            r = walk_list(o, &wk, tl);
        }
    }
    if (r == 0 && !overflow && o->cfg.no_grad == ZO_OPTIM_NO_GRAD_SKIP)
        count_tensor_steps(o, w);
    finish_window(o, w);
    tl->d2h_ns = atomic_exchange(&o->d2h_ns[w], 0);
    tl->d2h_bytes = atomic_exchange(&o->d2h_bytes[w], 0);
    zo_store_get_stats(o->store, &sb);
    tl->nvme_read_bytes = sb.moved[ZO_TIER_NVME][ZO_TIER_HOST] - sa.moved[ZO_TIER_NVME][ZO_TIER_HOST];
    tl->nvme_write_bytes = sb.moved[ZO_TIER_HOST][ZO_TIER_NVME] - sa.moved[ZO_TIER_HOST][ZO_TIER_NVME];
    tl->stall_ns += sb.stall_ns - sa.stall_ns;
    if (r < 0) {
        /* sub-groups before the failure hold the new states, the failed piece
         * is undefined, the rest the old ones: refuse to go on until a load.
         * The copies already queued read the parameter buffer a load
         * rewrites: let them finish first. */
        o->failed = ZO__FAILED_STEP;
        if (zo__push_now(o, job))
            zo_stream_sync(o->h2d);
        return r;
    }
    if (zo__push_now(o, job)) {
        t0 = zo__now_ns();
        /* double-buffered: the event a framework's stream waits on before
         * it reads this buffer (complete by the time the switch is made,
         * as the worker waits for the copies here) */
        r = o->dbl && !o->direct ? zo_event_record(o->ev_pdone[job->dbuf], o->h2d) : 0;
        int r2 = zo_stream_sync(o->h2d);
        tl->h2d_ns += zo__now_ns() - t0;
        if (r == 0)
            r = r2;
        if (r < 0)
            return ZO_FAIL(zo__eb(o), r, "zo_optim: parameter copy to the device failed: %s", zo_dev_errmsg(o->dev));
        if (o->dbl && !o->direct)
            o->pdone_rec[job->dbuf] = 1;
    }
    if (overflow) {
        int policy_skip = o->scaler.dynamic || o->cfg.nonfinite == ZO_OPTIM_NONFINITE_SKIP;
        pthread_mutex_lock(&o->lock);
        zo__scaler_update(&o->scaler, &o->cfg, 1);
        o->skipped++;
        pthread_mutex_unlock(&o->lock);
        res->skipped = 1;
        if (!policy_skip)
            return ZO_FAIL(zo__eb(o), ZO_ENONFINITE,
                           "zo_optim: %llu inf/NaN gradient elements; the step was not applied",
                           (unsigned long long)res->nonfinite);
        return 0;
    }
    pthread_mutex_lock(&o->lock);
    zo__scaler_update(&o->scaler, &o->cfg, 0);
    o->step++;
    o->pcur = job->pbuf;
    if (!zo__push_now(o, job))
        o->push_pending = 1;
    pthread_mutex_unlock(&o->lock);
    if (zo__push_now(o, job))
        tl->h2d_bytes = o->numel * o->pes;
    return 0;
}

void *zo__optim_worker(void *arg)
{
    zo_optim *o = arg;
    for (;;) {
        pthread_mutex_lock(&o->lock);
        while (o->ws != ZO__W_QUEUED && o->ws != ZO__W_EXIT)
            pthread_cond_wait(&o->cond, &o->lock);
        zo__wstate st = o->ws;
        zo__job job = o->job;
        pthread_mutex_unlock(&o->lock);
        if (st == ZO__W_EXIT)
            break;
        zo__wstate_set(o, ZO__W_RUNNING);
        zo_optim_step_result res;
        memset(&res, 0, sizeof(res));
        zo_optim_timeline tl;
        memset(&tl, 0, sizeof(tl));
        res.boundary = 1;
        uint64_t t0;
        int r = run_job(o, &job, &res, &tl, &t0);
        uint64_t t1 = zo__now_ns();
        tl.update_ns = t1 - t0;
        tl.total_ns = t1 - job.t_call;
        pthread_mutex_lock(&o->lock);
        o->updates_done++;
        o->nvme_read_total += tl.nvme_read_bytes;
        o->nvme_write_total += tl.nvme_write_bytes;
        res.step = o->step;
        tl.step = o->step;
        o->job_err = r;
        if (r < 0) /* kept with the error for the call that collects it */
            zo__errbuf_get(&o->werr, o->job_msg, sizeof(o->job_msg));
        o->job_res = res; /* last_res when collected (collect()): not before, so it never races the caller */
        o->tl = tl;
        o->have_tl = 1;
        pthread_mutex_unlock(&o->lock);
        zo__wstate_set(o, ZO__W_DONE);
        uint64_t one = 1;
        if (write(o->efd, &one, sizeof(one)) < 0) {
            /* the counter is only full after 2^64-1 unread completions */
        }
    }
    return NULL;
}
