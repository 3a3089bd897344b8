/* SPDX-License-Identifier: Apache-2.0 */
/* Trace-driven prefetch: the order of acquires in one iteration is
 * recorded; later iterations are followed through it (`pos` is the next
 * entry expected) and the next `lookahead` entries are loaded ahead, within
 * the prefetch byte cap. Every iteration is recorded too; one whose order
 * differed from the trace replaces it at zo_store_step(). The distance to a
 * tensor's next use in the trace drives eviction (Belady's rule). Each
 * entry also records how long its tensor stayed referenced (releases), so
 * placement knows which tensors are held together (space.c, plan_space). */
#include "store/store_internal.h"

#include <stdlib.h>
#include <string.h>

#define TRACE_MAX (1u << 22)

static void clear_positions(zo_store *s)
{
    for (zo_tensor *t = s->tensors; t; t = t->next)
        t->ntpos = 0;
}

static void adopt(zo_store *s)
{
    /* the old trace buffer becomes the record buffer */
    zo__trace_ent *old = s->trace;
    size_t oldcap = s->captrace;
    s->trace = s->rec;
    s->captrace = s->caprec;
    s->ntrace = s->nrec;
    s->rec = old;
    s->caprec = oldcap;
    s->nrec = 0;
    clear_positions(s);
    for (size_t i = 0; i < s->ntrace; i++) {
        zo_tensor *t = s->trace[i].t;
        if (s->trace[i].end & ZO__END_LINK)
            s->trace[i].end = 0; /* still held: to the end of the iteration */
        if (t->ntpos == t->captpos) {
            size_t c = t->captpos ? t->captpos * 2 : 4;
            uint32_t *p = realloc(t->tpos, c * sizeof(*p));
            if (!p) { /* without positions the tensor just looks unused */
                continue;
            }
            t->tpos = p;
            t->captpos = c;
        }
        t->tpos[t->ntpos++] = (uint32_t)i;
    }
    s->st.trace_records++;
}

void zo__trace_note(zo_store *s, zo_tensor *t, zo_tier x)
{
    if (s->trace_mode != ZO_TRACE_AUTO)
        return;
    zo__copy *c = &t->c[x];
    int starts = !c->refs || c->hold_epoch != s->trace_epoch; /* a new hold (or one from before the epoch) */
    uint32_t ri = ZO__TPOS_NONE;
    if (s->nrec < TRACE_MAX) {
        if (s->nrec == s->caprec) {
            size_t cap = s->caprec ? s->caprec * 2 : 64;
            zo__trace_ent *p = realloc(s->rec, cap * sizeof(*p));
            if (p) {
                s->rec = p;
                s->caprec = cap;
            }
        }
        if (s->nrec < s->caprec) {
            /* while the hold lasts, end links this acquire to the hold's
             * previous one: its release walks just the hold's acquires */
            uint32_t link = !starts && c->rec_last != ZO__TPOS_NONE ? ZO__END_LINK | c->rec_last : 0;
            ri = (uint32_t)s->nrec;
            s->rec[s->nrec++] = (zo__trace_ent){t, x, link};
        }
    }
    if (starts) {
        c->hold_epoch = s->trace_epoch;
        c->hold_tpos = ZO__TPOS_NONE;
    }
    c->rec_last = ri;
    if (s->recording || !s->ntrace)
        return;
    size_t n = s->ntrace, q = s->pos;
    if (s->trace[q].t != t || s->trace[q].tier != x) {
        /* out of order: look a little ahead (an access skipped), else stay */
        s->iter_mismatch++;
        size_t window = ZO_MIN(n, (size_t)ZO_MAX(8u, 2 * s->cfg.lookahead));
        size_t k;
        for (k = 1; k < window; k++) {
            q = (s->pos + k) % n;
            if (s->trace[q].t == t && s->trace[q].tier == x)
                break;
        }
        if (k == window)
            return;
    }
    s->pos = (q + 1) % n;
    if (starts)
        c->hold_tpos = (uint32_t)q;
}

void zo__trace_hold_end(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    if (s->trace_mode != ZO_TRACE_AUTO || c->hold_epoch != s->trace_epoch || c->rec_last == ZO__TPOS_NONE ||
        c->rec_last >= s->nrec)
        return;
    /* every acquire of this hold, latest first along the links (the
     * entries after each were acquired while the tensor was held); an
     * acquire the record missed ends the chain, and the ones before it
     * stay open (adopt: held to the end), as if never released */
    for (uint32_t i = c->rec_last;;) {
        uint32_t link = s->rec[i].end;
        s->rec[i].end = (uint32_t)s->nrec;
        if (!(link & ZO__END_LINK) || (link & ~ZO__END_LINK) >= i)
            break;
        i = link & ~ZO__END_LINK;
    }
    c->rec_last = ZO__TPOS_NONE;
}

uint64_t zo__trace_hold_len(const zo_store *s, size_t q)
{
    uint32_t end = s->trace[q].end;
    return (end > q ? end : s->ntrace) - q;
}

uint64_t zo__trace_dist(zo_store *s, const zo_tensor *t)
{
    if (s->trace_mode != ZO_TRACE_AUTO || s->recording || !s->ntrace || !t->ntpos)
        return ZO__DIST_INF;
    size_t lo = 0, hi = t->ntpos;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->tpos[mid] < s->pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->ntpos)
        return t->tpos[lo] - s->pos;
    return t->tpos[0] + s->ntrace - s->pos;
}

static uint64_t prefetch_cap(zo_store *s, zo_tier x)
{
    return s->cfg.prefetch_bytes ? s->cfg.prefetch_bytes : s->tier[x].budget / 2;
}

void zo__trace_pump(zo_store *s)
{
    if (s->trace_mode != ZO_TRACE_AUTO || s->recording || !s->ntrace || s->stop)
        return;
    size_t n = s->ntrace, ahead = ZO_MIN((size_t)s->cfg.lookahead, n);
    for (size_t k = 0; k < ahead; k++) {
        zo__trace_ent *e = &s->trace[(s->pos + k) % n];
        zo_tensor *t = e->t;
        zo__copy *c = &t->c[e->tier];
        if (!s->have[e->tier] || t->stream_write || t->dying)
            continue;
        if (zo__copy_current_or_loading(t, e->tier))
            continue;
        if (c->waiters)
            continue; /* a demand load is being arranged */
        zo__tier *tr = &s->tier[e->tier];
        if (tr->prefetched_bytes + zo__ext_round(&tr->ext, t->bytes) > prefetch_cap(s, e->tier))
            break;
        if (tr->prefetch_inflight >= ZO__PREFETCH_INFLIGHT)
            break; /* nearest first: the rest when these land */
        if (zo__store_start_load(s, t, e->tier, 1, k) == ZO_EBUDGET)
            break; /* no room for it: a farther entry would take the room its demand load needs */
    }
}

ZO_API int zo_store_step(zo_store *s)
{
    if (!s)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    if (s->trace_mode == ZO_TRACE_AUTO) {
        if (s->recording) {
            if (s->nrec) {
                adopt(s);
                s->recording = 0;
            }
        } else if (s->nrec && (s->iter_mismatch || s->nrec != s->ntrace)) {
            s->st.trace_mismatches += s->iter_mismatch ? s->iter_mismatch : 1;
            adopt(s);
        }
        s->nrec = 0;
        s->pos = 0;
        s->iter_mismatch = 0;
        s->trace_epoch++;
        zo__trace_pump(s);
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static void reset(zo_store *s)
{
    s->ntrace = s->nrec = 0;
    s->pos = 0;
    s->iter_mismatch = 0;
    s->recording = 1;
    s->trace_epoch++;
    clear_positions(s);
}

ZO_API int zo_store_set_trace(zo_store *s, zo_trace_mode mode)
{
    if (!s || (mode != ZO_TRACE_OFF && mode != ZO_TRACE_AUTO))
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    s->trace_mode = mode;
    reset(s);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

void zo__trace_forget_tensor(zo_store *s, zo_tensor *t)
{
    int used = 0;
    for (size_t i = 0; i < s->ntrace && !used; i++)
        used = s->trace[i].t == t;
    for (size_t i = 0; i < s->nrec && !used; i++)
        used = s->rec[i].t == t;
    if (used)
        reset(s);
}

void zo__trace_free(zo_store *s)
{
    free(s->trace);
    free(s->rec);
    s->trace = s->rec = NULL;
    s->ntrace = s->nrec = s->caprec = s->captrace = 0;
}
