/* Trace-driven prefetch: the order of acquires in one iteration is
 * recorded; later iterations are followed through it (`pos` is the next
 * entry expected) and the next `lookahead` entries are loaded ahead, within
 * the prefetch byte cap. Every iteration is recorded too; one whose order
 * differed from the trace replaces it at zo_store_step(). The distance to a
 * tensor's next use in the trace drives eviction (Belady's rule). */
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
    if (s->nrec < TRACE_MAX) {
        if (s->nrec == s->caprec) {
            size_t c = s->caprec ? s->caprec * 2 : 64;
            zo__trace_ent *p = realloc(s->rec, c * sizeof(*p));
            if (p) {
                s->rec = p;
                s->caprec = c;
            }
        }
        if (s->nrec < s->caprec)
            s->rec[s->nrec++] = (zo__trace_ent){t, x};
    }
    if (s->recording || !s->ntrace)
        return;
    size_t n = s->ntrace;
    if (s->trace[s->pos].t == t && s->trace[s->pos].tier == x) {
        s->pos = (s->pos + 1) % n;
        return;
    }
    /* out of order: look a little ahead (an access skipped), else stay */
    s->iter_mismatch++;
    size_t window = ZO_MIN(n, (size_t)ZO_MAX(8u, 2 * s->cfg.lookahead));
    for (size_t k = 1; k < window; k++) {
        size_t q = (s->pos + k) % n;
        if (s->trace[q].t == t && s->trace[q].tier == x) {
            s->pos = (q + 1) % n;
            return;
        }
    }
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
