/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Gradient statistics at intake (zo__gst in optim_internal.h): each
 * sub-group's sum of squares and inf/NaN count, computed when the last
 * micro-step's gradients of all its tensors have landed, so the step does
 * not re-read the gradient window for the norm / overflow check.
 *
 * Bit-identity: the step sums the per-sub-group sums in sub-group order
 * whether they came from here or from its own pass, and each one is
 * zo_cpuadam_team_grad_stats() over the same range with a team of the
 * same thread count and variant (the result is deterministic for a given
 * n, thread count and variant).
 */
#include "optim_internal.h"

#include <stdlib.h>
#include <string.h>

#include <zoffload/mem.h>

void zo__tensor_sgs(const zo_optim *o, unsigned t, unsigned *a, unsigned *b)
{
    const zo__ot *ot = &o->tensors[t];
    const zo__og *og = &o->groups[ot->group];
    *a = og->first_sg + (unsigned)((ot->off - og->off) / og->sgsize);
    *b = og->first_sg + (unsigned)((ot->off + ot->numel - 1 - og->off) / og->sgsize) + 1;
}

int zo__gst_alloc(zo_optim *o)
{
    for (unsigned w = 0; w < o->nwin; w++) {
        zo__gst *g = &o->gst[w];
        g->tpend = calloc(o->nt, sizeof(*g->tpend));
        g->tfin = calloc(o->nt, 1);
        g->left = calloc(o->nsg, sizeof(*g->left));
        g->ok = calloc(o->nsg, 1);
        g->bad = calloc(o->nsg, 1);
        g->sum = calloc(o->nsg, sizeof(*g->sum));
        g->nf = calloc(o->nsg, sizeof(*g->nf));
        g->done = calloc(o->nsg, sizeof(*g->done));
        if (!g->tpend || !g->tfin || !g->left || !g->ok || !g->bad || !g->sum || !g->nf || !g->done)
            return -ENOMEM;
        zo__gst_reset(o, w);
    }
    return 0;
}

void zo__gst_free(zo_optim *o)
{
    for (unsigned w = 0; w < 2; w++) {
        zo__gst *g = &o->gst[w];
        free(g->tpend);
        free(g->tfin);
        free(g->left);
        free(g->ok);
        free(g->bad);
        free(g->sum);
        free(g->nf);
        free(g->done);
        memset(g, 0, sizeof(*g));
    }
}

/* A new accumulation starts in window w: nothing landed, nothing cached. */
void zo__gst_reset(zo_optim *o, unsigned w)
{
    zo__gst *g = &o->gst[w];
    pthread_mutex_lock(&o->lock);
    memset(g->tpend, 0, o->nt * sizeof(*g->tpend));
    memset(g->tfin, 0, o->nt);
    memcpy(g->left, o->sg_ntens, o->nsg * sizeof(*g->left));
    memset(g->ok, 0, o->nsg);
    memset(g->bad, 0, o->nsg);
    g->ndone = 0;
    pthread_mutex_unlock(&o->lock);
}

/* The window w is finished: when its last micro-step completed every
 * sub-group, that completion order becomes the eager walk's order (the
 * order backward produces the gradients, learned rather than assumed).
 * The window's owner (the worker), before zo__gst_reset(). */
void zo__gst_keep_order(zo_optim *o, unsigned w)
{
    zo__gst *g = &o->gst[w];
    pthread_mutex_lock(&o->lock);
    if (o->eager_order && g->ndone == o->nsg) {
        memcpy(o->eager_order, g->done, o->nsg * sizeof(*g->done));
        o->have_order = 1;
    }
    pthread_mutex_unlock(&o->lock);
}

/* sub-group i's last gradient landed (under lock) */
static void sg_complete(zo__gst *g, unsigned i)
{
    g->done[g->ndone++] = i;
}

/* Tensor t's gradient is being handed over into window w in `pieces`
 * copies. In the window's last micro-step, its landing is tracked (returns
 * 1: report each piece with zo__gst_landed()); a second gradient of the
 * same tensor in that micro-step makes its sub-groups' statistics
 * uncacheable (an error in eager mode, where they may be in use already). */
int zo__gst_track(zo_optim *o, unsigned w, unsigned t, uint32_t pieces)
{
    if ((o->micro + 1) % o->cfg.grad_accum_steps)
        return 0;
    zo__gst *g = &o->gst[w];
    pthread_mutex_lock(&o->lock);
    if (g->tfin[t]) {
        if (!o->eager) {
            unsigned a, b;
            zo__tensor_sgs(o, t, &a, &b);
            for (unsigned i = a; i < b; i++) {
                g->bad[i] = 1;
                g->ok[i] = 0;
            }
        }
        pthread_mutex_unlock(&o->lock);
        if (o->eager)
            return ZO_FAIL(zo__eb(o), ZO_ESTATE,
                           "zo_optim_grad: tensor '%s' got a second gradient in the last micro-step: the speculative "
                           "step may already have used the first (hand each gradient over once)",
                           o->tensors[t].name);
        return 0;
    }
    g->tfin[t] = 1;
    g->tpend[t] += pieces;
    pthread_mutex_unlock(&o->lock);
    return 1;
}

/* One tracked piece of tensor t's last gradient has landed in window w.
 * When it was the last piece, every sub-group it completes gets its
 * statistics now; `left` reaches 0 only after they are stored, so an eager
 * step waiting on it finds them. */
void zo__gst_landed(zo_optim *o, unsigned w, unsigned t)
{
    zo__gst *g = &o->gst[w];
    pthread_mutex_lock(&o->lock);
    int done = --g->tpend[t] == 0;
    pthread_mutex_unlock(&o->lock);
    if (!done)
        return;
    unsigned a, b;
    zo__tensor_sgs(o, t, &a, &b);
    for (unsigned i = a; i < b; i++) {
        pthread_mutex_lock(&o->lock);
        int compute = g->left[i] == 1 && !g->bad[i];
        if (!compute) {
            if (--g->left[i] == 0)
                sg_complete(g, i);
            pthread_cond_broadcast(&o->cond);
        }
        pthread_mutex_unlock(&o->lock);
        if (!compute)
            continue;
        const zo__sg *sg = &o->sgs[i];
        zo_grad_stats gs;
        /* a failure only means the step computes it itself */
        const void *gp;
        zo_dtype gdt;
        float *tmp;
        int r = zo__win_range(o, w, sg->off, sg->n, &gp, &gdt, &tmp);
        if (r == 0)
            r = zo_cpuadam_team_grad_stats(o->iteam, gp, gdt, (size_t)sg->n, &gs);
        zo_aligned_free(tmp);
        pthread_mutex_lock(&o->lock);
        if (r == 0 && !g->bad[i]) {
            g->sum[i] = gs.sumsq;
            g->nf[i] = gs.nonfinite;
            g->ok[i] = 1;
        }
        g->left[i] = 0;
        sg_complete(g, i);
        pthread_cond_broadcast(&o->cond);
        pthread_mutex_unlock(&o->lock);
    }
}

/* Sub-group i's cached statistics in window w: 1 (gs filled) or 0 (none). */
int zo__gst_get(zo_optim *o, unsigned w, unsigned i, zo_grad_stats *gs)
{
    zo__gst *g = &o->gst[w];
    pthread_mutex_lock(&o->lock);
    int ok = g->ok[i] && !g->bad[i];
    if (ok) {
        gs->sumsq = g->sum[i];
        gs->nonfinite = g->nf[i];
    }
    pthread_mutex_unlock(&o->lock);
    return ok;
}
