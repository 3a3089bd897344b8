/* SPDX-License-Identifier: Apache-2.0 */
/* Room for a copy in a tier's arena (zo__store_space()): which copies may be
 * evicted for it, the cheapest window of the arena (window_space), and, with
 * the trace on, placement planned for the tensors held together with it
 * (plan_space). Apart from the copies because it is the store's largest
 * single policy: the two searches share their span items and victim rules
 * and are read together. */
#include "store/store_internal.h"

#include <stdlib.h>

/* Walk the non-home copies of tier x, least recently used first: v is the
 * tensor. The body must not unlink the current copy. */
#define lru_for_each(pos, v, tr) \
    for ((pos) = (tr)->lru.next; (pos) != &(tr)->lru && ((v) = zo_list_entry(pos, zo__copy, lnode)->owner, 1); \
         (pos) = (pos)->next)

/* ---- space ------------------------------------------------------------------------- */
/* Is v's copy in tier x a possible eviction victim for for_t? 1: yes
 * (*score set: higher is a better victim; UINT64_MAX for a stale copy,
 * which costs nothing); 0: no; -1: no, but a transfer in flight will free
 * or settle it (worth waiting for). A prefetch only takes copies needed
 * later than its own target (dist) and, without a trace, never another
 * hint. A dirty copy whose write-back failed in this round is passed over
 * and reported in *failed (the first one). */
static int victim_ok(zo_store *s, zo_tier x, zo_tensor *v, const zo_tensor *for_t, int prefetch, uint64_t dist,
                     int have_trace, uint64_t *score, zo_tensor **failed)
{
    zo__copy *c = &v->c[x];
    zo__tier *tr = &s->tier[x];
    /* busy, or a write-back that has to wait for another one */
    if (zo__copy_in_flight(c) || c->readers || c->wb_wanted || v->stream_write ||
        (zo__store_sole_current(v, x) && v->c[v->home].state == ZO__CS_RECEIVING))
        return c->refs ? 0 : -1;
    if (v == for_t || c->state != ZO__CS_RESIDENT || c->refs || c->waiters || c->parked)
        return 0;
    if (c->wb_fail && c->wb_fail_round == tr->space_round && zo__store_sole_current(v, x)) {
        /* writing it back again now would most likely fail the same way:
         * retried from the next round (or by a flush) */
        if (failed && !*failed)
            *failed = v;
        return 0;
    }
    if (c->ver != v->cur_ver) {
        *score = UINT64_MAX; /* stale: free, costs nothing */
        return 1;
    }
    if (have_trace) {
        uint64_t d = zo__trace_dist(s, v);
        if (prefetch && d != ZO__DIST_INF && d <= dist)
            return 0;
        *score = d == ZO__DIST_INF ? UINT64_MAX - 1 : d + 1;
    } else {
        if (prefetch && c->prefetched)
            return 0; /* a hint does not push out another hint */
        *score = UINT64_MAX - 1 - c->lru; /* older is better */
    }
    return 1;
}

static int have_trace(const zo_store *s)
{
    return s->trace_mode == ZO_TRACE_AUTO && !s->recording && s->ntrace;
}

static uint64_t pinned_bytes(zo_store *s, zo_tier x)
{
    zo__tier *tr = &s->tier[x];
    uint64_t b = tr->home_bytes;
    zo_list *pos;
    zo_tensor *v;
    lru_for_each(pos, v, tr)
        if (v->c[x].refs)
            b += v->c[x].len;
    return b;
}

/* t's copy in tier x gets [off, off+need) of the arena. */
static void copy_place(zo_store *s, zo_tensor *t, zo_tier x, uint64_t off, uint64_t need)
{
    zo__copy *c = &t->c[x];
    zo__tier *tr = &s->tier[x];
    c->off = off;
    c->len = need;
    c->ptr = tr->base + off;
    tr->used += need;
    if (tr->used > tr->peak)
        tr->peak = tr->used;
    if (x == t->home)
        tr->home_bytes += need;
    else
        zo__store_lru_append(tr, t, x);
}

/* A stretch of a tier's arena a prefetch could use: free space (v NULL)
 * or a copy it may evict. */
typedef struct span_item {
    uint64_t off, len;
    uint64_t cost;       /* of evicting it (0: free space, a stale copy) */
    zo_tensor *v;
    int dirty;
    int later;           /* plan_space: usable only later (in flight, or held until before the load's use) */
} span_item;

static int span_cmp(const void *a, const void *b)
{
    const span_item *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Take the place chosen for t's copy in tier x at `at`, items it[a..b]
 * covering it: with dirty victims among them their write-backs start (each
 * freed once home) and the caller tries again (-EAGAIN; a prefetch gets
 * ZO_EBUDGET); otherwise the victims are evicted and the copy placed (0). */
static int take_place(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, const span_item *it, size_t a, size_t b,
                      uint64_t dirty, uint64_t at)
{
    zo__tier *tr = &s->tier[x];
    uint64_t need = zo__ext_round(&tr->ext, t->bytes);
    int r;
    if (dirty) {
        for (size_t i = a; i <= b; i++)
            if (it[i].dirty && (r = zo__store_start_writeback(s, it[i].v, x, 1)) < 0)
                return r;
        return prefetch ? ZO_EBUDGET : -EAGAIN;
    }
    for (size_t i = a; i <= b; i++)
        if (it[i].v)
            zo__store_evict(s, it[i].v, x);
    if ((r = zo__ext_claim(&tr->ext, at, need)) == 0)
        copy_place(s, t, x, at, need);
    else if (r != -ENOMEM)
        r = ZO_FAIL(&s->err, ZO_EINTERNAL, "%s tier: the place [%llu, +%llu) chosen for '%s' is not free",
                    zo_tier_name(x), (unsigned long long)at, (unsigned long long)need, t->name);
    return r;
}

/* Choose where t's copy goes in tier x before anything is evicted (issue
 * 9: a prefetch that evicted victims and then found it still did not fit
 * gave up, and the next pump reloaded what it had evicted into the space
 * just freed, over and over). The arena is seen as its free extents plus
 * the copies this load may evict (victim_ok: for a prefetch only those
 * needed later than its target); the cheapest contiguous window of them
 * that holds the copy is chosen: fewest dirty victims, then the least
 * cost (the bytes of victims needed soon: the trace needs them within the
 * lookahead, or, without a trace, a hint loaded them and they are not used
 * yet; other victims cost nothing, so the place decides among them), then
 * place: prefetched copies go to the top of the arena,
 * demand loads to the bottom, so a copy loaded ahead does not split the
 * free space the copies in use now leave behind.
 * 0: placed (the window's victims evicted). ZO_EBUDGET: no window (nothing
 * evicted); *inflight counts copies a transfer in flight will settle.
 * -EAGAIN: the window holds dirty victims: their write-backs started (each
 * freed once home), try again then (a prefetch gets ZO_EBUDGET). */
static int window_space(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, uint64_t dist, int *inflight,
                        zo_tensor **failed)
{
    zo__tier *tr = &s->tier[x];
    uint64_t need = zo__ext_round(&tr->ext, t->bytes);
    size_t cap = tr->ext.nfree + tr->ncopies, n = 0;
    span_item *it = malloc((cap ? cap : 1) * sizeof(*it));
    if (!it)
        return -ENOMEM;
    for (size_t i = 0; i < tr->ext.nfree; i++)
        it[n++] = (span_item){tr->ext.free[i].off, tr->ext.free[i].len, 0, NULL, 0, 0};
    int ht = have_trace(s);
    zo_list *pos;
    zo_tensor *v;
    lru_for_each(pos, v, tr) {
        uint64_t score = 0;
        if (n == cap)
            break;
        int ok = victim_ok(s, x, v, t, prefetch, dist, ht, &score, failed);
        if (ok < 0)
            (*inflight)++;
        if (ok <= 0)
            continue;
        /* needed soon: within the lookahead of the trace; without one, a
         * copy a hint loaded and nobody used yet (evicting it wastes it) */
        int stale = score == UINT64_MAX,
            near = !stale && (ht ? score - 1 <= s->cfg.lookahead : v->c[x].prefetched);
        it[n++] = (span_item){v->c[x].off, v->c[x].len, near ? v->c[x].len : 0, v, !stale && zo__store_sole_current(v, x), 0};
    }
    qsort(it, n, sizeof(*it), span_cmp);
    /* two pointers over each run of adjacent items */
    size_t best_a = SIZE_MAX, best_b = 0;
    uint64_t best_dirty = 0, best_cost = 0, best_at = 0;
    size_t a = 0;
    uint64_t sum = 0, cost = 0, dirty = 0;
    for (size_t b = 0; b < n; b++) {
        if (b > a && it[b - 1].off + it[b - 1].len != it[b].off) {
            a = b; /* a gap (a copy that stays): a new run */
            sum = cost = dirty = 0;
        }
        sum += it[b].len;
        cost += it[b].cost;
        dirty += it[b].dirty;
        /* shrink from the left while the window still holds the copy */
        while (a < b && sum - it[a].len >= need) {
            sum -= it[a].len;
            cost -= it[a].cost;
            dirty -= it[a].dirty;
            a++;
        }
        if (sum < need)
            continue;
        /* where the copy would start: the window's top end for a prefetch,
         * its bottom for a demand load */
        uint64_t at = prefetch ? it[b].off + it[b].len - need : it[a].off;
        int better = best_a == SIZE_MAX || dirty < best_dirty || (dirty == best_dirty && cost < best_cost) ||
                     (dirty == best_dirty && cost == best_cost && (prefetch ? at > best_at : at < best_at));
        if (better) {
            best_a = a;
            best_b = b;
            best_dirty = dirty;
            best_cost = cost;
            best_at = at;
        }
    }
    int r = best_a == SIZE_MAX ? ZO_EBUDGET /* does not fit: evict nothing */
                               : take_place(s, t, x, prefetch, it, best_a, best_b, best_dirty, best_at);
    free(it);
    return r;
}

/* ---- placement for what is held together (issue 9, item 3) ------------------------------ */
/* Copies never move once placed, so where a copy goes decides whether the
 * tensors held with it later still find room. The case that failed: a
 * host cache a little larger than one (master, m, v) group; while a group
 * was held, the next group's first members were loaded ahead, pressed
 * against the held copies; once those were released the early members sat
 * in the middle of the cache, and the group's last member, loaded on
 * demand, found the free space cut in two by its own group's referenced
 * copies: ZO_EBUDGET although the cache held the group.
 *
 * With the trace on (ZO_TRACE_AUTO) placement therefore plans for the
 * group: the trace records how long each acquire stays referenced, so a
 * copy for tensor t knows its *co-held set* (the tensors the trace acquires
 * while t is held). The arena is seen as runs of space that is, or will be,
 * free when t's group is in use: free extents, copies evictable now
 * (victim_ok), and copies usable *later* (a transfer in flight settles
 * them; for a prefetch also copies held or needed only until before t's
 * acquire). What stays while t is held (referenced then, or acquired while
 * t is held) bounds the runs. t goes at one edge of a window of such a run
 * that holds t and the co-held tensors without a copy yet, on space usable
 * now: the others then find their room beside it. Without the co-held set
 * (the recording iteration, a tensor the trace does not know) t goes at an
 * edge of a run, which never splits one. A demand load that only fits (or
 * fits more cheaply: fewer bytes evicted that are needed soon) on space a
 * transfer in flight will free waits for it; a prefetch that does not fit
 * now is not issued. ZO_TRACE_OFF places as before (window_space). */
#define ZO__NOPLAN 1 /* plan_space found no room, not even later */
enum { PL_WALL = 0, PL_NOW, PL_LATER };

/* A hold on the trace's timeline, where the next expected entry (pos) is
 * at 0: [a, e). */
typedef struct hold_span {
    int known;
    int64_t a, e;
} hold_span;

/* The hold c is in now (referenced), from the trace entry its first
 * acquire matched. */
static int cur_hold(const zo_store *s, const zo__copy *c, hold_span *h, size_t *qout)
{
    if (c->hold_epoch != s->trace_epoch || c->hold_tpos >= s->ntrace)
        return 0;
    size_t q = c->hold_tpos;
    int64_t n = (int64_t)s->ntrace, pos = (int64_t)s->pos;
    h->a = (int64_t)q < pos ? (int64_t)q - pos : (int64_t)q - pos - n;
    h->e = h->a + (int64_t)zo__trace_hold_len(s, q);
    h->known = 1;
    *qout = q;
    return 1;
}

/* The hold of v's next acquire in the trace. */
static int next_hold(zo_store *s, const zo_tensor *v, hold_span *h, size_t *qout)
{
    uint64_t d = zo__trace_dist(s, v);
    if (d == ZO__DIST_INF)
        return 0;
    size_t q = (size_t)((s->pos + d) % s->ntrace);
    h->a = (int64_t)d;
    h->e = h->a + (int64_t)zo__trace_hold_len(s, q);
    h->known = 1;
    *qout = q;
    return 1;
}

/* Bytes that the tensors acquired while t is held (trace entry qt) need in
 * tier x and have no copy there yet. */
static uint64_t coheld_need(zo_store *s, const zo_tensor *t, zo_tier x, size_t qt)
{
    zo__tier *tr = &s->tier[x];
    uint64_t sum = 0, len = zo__trace_hold_len(s, qt), mark = ++s->plan_gen;
    for (uint64_t k = 1; k < len && k < 4096; k++) {
        const zo__trace_ent *e = &s->trace[(qt + k) % s->ntrace];
        zo_tensor *u = e->t;
        if (e->tier != x || u == t || u->home == x || u->c[x].len || u->plan_mark == mark)
            continue;
        u->plan_mark = mark;
        sum += zo__ext_round(&tr->ext, u->bytes);
    }
    return sum;
}

/* Evicting v's copy wastes work: a copy the trace needs within the
 * lookahead, or without a trace one a hint loaded and nobody used yet. */
static uint64_t plan_cost(zo_store *s, zo_tensor *v, zo_tier x)
{
    const zo__copy *c = &v->c[x];
    if (c->ver != v->cur_ver)
        return 0;
    if (have_trace(s)) {
        uint64_t d = zo__trace_dist(s, v);
        return d != ZO__DIST_INF && d <= s->cfg.lookahead ? c->len : 0;
    }
    return c->prefetched ? c->len : 0;
}

/* What v's copy in tier x is to the placement of t's copy there (th: t's
 * hold, if the trace knows it). */
static int plan_class(zo_store *s, zo_tier x, zo_tensor *v, const zo_tensor *t, int prefetch, uint64_t dist,
                      const hold_span *th, zo_tensor **failed, int *inflight)
{
    zo__copy *c = &v->c[x];
    hold_span h = {0};
    size_t q;
    if (c->refs) {
        if (!prefetch)
            return PL_WALL;
        /* a hint: what is held now is taken to be released before the
         * hinted tensor is used (the next group is hinted while this one
         * is held); with the trace, when its hold ends says so */
        if (!th->known)
            return PL_LATER;
        return cur_hold(s, c, &h, &q) && h.e <= th->a ? PL_LATER : PL_WALL;
    }
    if (th->known && next_hold(s, v, &h, &q) && h.a < th->e && h.e > th->a)
        return PL_WALL; /* acquired while t is held */
    /* without t's co-held set, a copy loaded ahead for use soon is taken as
     * held with t: a run's edge next to it, not it, is t's place (if no
     * run fits, the plain window may still evict it) */
    if (!th->known && !prefetch && plan_cost(s, v, x))
        return PL_WALL;
    uint64_t score = 0;
    int ok = victim_ok(s, x, v, t, prefetch, dist, have_trace(s), &score, failed);
    if (ok > 0)
        return PL_NOW;
    if (ok < 0) {
        /* a stream keeps it (its caller may be the thread that waits for
         * this load): not worth waiting for; transfers end by themselves */
        if (v->streams)
            return PL_WALL;
        (*inflight)++;
        return PL_LATER;
    }
    /* a prefetch may not evict what the trace needs sooner than t; used
     * and done with before t's acquire, it is room for t's group later */
    if (prefetch && h.known && h.e <= th->a && c->state == ZO__CS_RESIDENT &&
        !(c->wb_fail && c->wb_fail_round == s->tier[x].space_round))
        return PL_LATER;
    return PL_WALL;
}

typedef struct plan_cand {
    int ok;
    size_t a, b;         /* items covered */
    uint64_t at, dirty, cost;
} plan_cand;

static int plan_better(const plan_cand *c, const plan_cand *b, int prefetch)
{
    if (!b->ok)
        return 1;
    if (c->dirty != b->dirty)
        return c->dirty < b->dirty;
    if (c->cost != b->cost)
        return c->cost < b->cost;
    return prefetch ? c->at > b->at : c->at < b->at;
}

/* The best place for a copy of `need` bytes in the runs of items it (sorted,
 * prefix sums pl: bytes usable only later, pd: dirty victims, pc: cost): at
 * one edge of a window of `win` bytes inside a run (edge: of the run
 * itself). *now: usable now; *ev: usable now or later. */
static void plan_search(const span_item *it, size_t n, const uint64_t *pl, const uint64_t *pd, const uint64_t *pc,
                        uint64_t win, uint64_t need, int edge, int prefetch, plan_cand *now, plan_cand *ev)
{
    for (size_t i0 = 0; i0 < n;) {
        size_t i1 = i0;
        while (i1 + 1 < n && it[i1].off + it[i1].len == it[i1 + 1].off)
            i1++;
        uint64_t rs = it[i0].off, re = it[i1].off + it[i1].len;
        for (size_t k = i0; re - rs >= win && k <= i1; k++) {
            /* t at the bottom of a window starting at item k, or at the top
             * of one ending with it (in edge mode: the run's own ends) */
            for (int top = 0; top < 2; top++) {
                uint64_t at;
                if (!top) {
                    if ((edge && k != i0) || it[k].off + win > re)
                        continue;
                    at = it[k].off;
                } else {
                    uint64_t end = it[k].off + it[k].len;
                    if ((edge && k != i1) || end < rs + win)
                        continue;
                    at = end - need;
                }
                /* the items [at, at + need) covers (binary searches: the
                 * items of a run are adjacent, in order) */
                size_t a = top ? i0 : k, b = top ? k : i1;
                if (top) {
                    size_t hi = k; /* first item ending after at */
                    while (a < hi) {
                        size_t mid = a + (hi - a) / 2;
                        if (it[mid].off + it[mid].len <= at)
                            a = mid + 1;
                        else
                            hi = mid;
                    }
                } else {
                    size_t lo = k; /* last item starting before at + need */
                    while (lo < b) {
                        size_t mid = lo + (b - lo + 1) / 2;
                        if (it[mid].off < at + need)
                            lo = mid;
                        else
                            b = mid - 1;
                    }
                }
                plan_cand cd = {1, a, b, at, pd[b + 1] - pd[a], pc[b + 1] - pc[a]};
                if (plan_better(&cd, ev, prefetch))
                    *ev = cd;
                if (pl[b + 1] == pl[a] && plan_better(&cd, now, prefetch))
                    *now = cd;
            }
        }
        i0 = i1 + 1;
    }
}

/* 0: placed; -EAGAIN: wait (dirty victims' write-backs started, or room
 * comes once transfers in flight end); ZO_EBUDGET: a prefetch that does
 * not fit now (nothing evicted); ZO__NOPLAN: no room even later (nothing
 * evicted; the caller places as without a trace). */
static int plan_space(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, uint64_t dist, int *inflight,
                      zo_tensor **failed)
{
    zo__tier *tr = &s->tier[x];
    uint64_t need = zo__ext_round(&tr->ext, t->bytes);
    hold_span th = {0};
    size_t qt = 0;
    if (have_trace(s))
        th.known = prefetch ? next_hold(s, t, &th, &qt) : cur_hold(s, &t->c[x], &th, &qt);
    uint64_t win = need;
    if (th.known) {
        win += coheld_need(s, t, x, qt);
        if (win > tr->budget - tr->home_bytes)
            win = need; /* they never fit together: plan for t alone */
    }
    int edge = !th.known;
    size_t cap = tr->ext.nfree + tr->ncopies, n = 0;
    span_item *it = malloc((cap ? cap : 1) * sizeof(*it));
    uint64_t *pre = malloc(3 * (cap + 1) * sizeof(*pre));
    int r = -ENOMEM;
    if (!it || !pre)
        goto out;
    for (size_t i = 0; i < tr->ext.nfree; i++)
        it[n++] = (span_item){tr->ext.free[i].off, tr->ext.free[i].len, 0, NULL, 0, 0};
    zo_list *pos;
    zo_tensor *v;
    lru_for_each(pos, v, tr) {
        if (n == cap)
            break;
        int cls = plan_class(s, x, v, t, prefetch, dist, &th, failed, inflight);
        if (cls == PL_WALL)
            continue;
        zo__copy *c = &v->c[x];
        int dirty = cls == PL_NOW && c->ver == v->cur_ver && zo__store_sole_current(v, x);
        it[n++] = (span_item){c->off, c->len, plan_cost(s, v, x), v, dirty, cls == PL_LATER};
    }
    qsort(it, n, sizeof(*it), span_cmp);
    /* prefix sums: bytes usable only later, dirty victims, cost */
    uint64_t *pl = pre, *pd = pre + cap + 1, *pc = pre + 2 * (cap + 1);
    pl[0] = pd[0] = pc[0] = 0;
    for (size_t i = 0; i < n; i++) {
        pl[i + 1] = pl[i] + (it[i].later ? it[i].len : 0);
        pd[i + 1] = pd[i] + (uint64_t)it[i].dirty;
        pc[i + 1] = pc[i] + it[i].cost;
    }
    plan_cand now = {0}, ev = {0};
    plan_search(it, n, pl, pd, pc, win, need, edge, prefetch, &now, &ev);
    if (!ev.ok && win > need) /* the group never fits together here: plan for t alone */
        plan_search(it, n, pl, pd, pc, need, need, edge, prefetch, &now, &ev);
    if (!ev.ok) {
        r = ZO__NOPLAN;
        goto out;
    }
    /* nothing now, or only by evicting more of what is needed soon than
     * waiting would: a prefetch is not issued, a demand load waits */
    if (!now.ok || (!prefetch && ev.cost < now.cost)) {
        r = prefetch ? ZO_EBUDGET : -EAGAIN;
        goto out;
    }
    r = take_place(s, t, x, prefetch, it, now.a, now.b, now.dirty, now.at);
out:
    free(pre);
    free(it);
    return r;
}

/* Placement plans for what is held together in trace mode, for copies
 * other than home copies; ZO_TRACE_OFF keeps window_space alone. */
static int plan_applies(const zo_store *s, const zo_tensor *t, zo_tier x)
{
    return s->trace_mode == ZO_TRACE_AUTO && x != t->home;
}

/* A prefetch's space: never evicts unless it then fits (window_space). */
static int prefetch_space(zo_store *s, zo_tensor *t, zo_tier x, uint64_t dist)
{
    zo__tier *tr = &s->tier[x];
    /* Demand first: an acquire waiting for space in the tier gets what
     * frees up. A prefetch taking it made the acquire evict more, the pump
     * reload that, and so on (the same thrash, on the demand side). */
    if (!zo_list_empty(&tr->parked))
        return ZO_EBUDGET;
    /* Nearest first: no room is taken while an entry the trace needs
     * sooner in this tier has no copy yet (the trace pump stops at such an
     * entry; an explicit hint obeys the same rule). Loading the later
     * members of a group around the first one's future place split the
     * free space, and the first one's acquire failed for fragmentation. */
    if (have_trace(s) && dist != ZO__DIST_INF) {
        size_t n = s->ntrace, lim = ZO_MIN((size_t)dist, (size_t)64);
        for (size_t k = 0; k < lim; k++) {
            const zo__trace_ent *e = &s->trace[(s->pos + k) % n];
            if (e->tier != x || e->t == t || e->t->dying || e->t->stream_write)
                continue;
            if (!zo__copy_current_or_loading(e->t, x))
                return ZO_EBUDGET;
        }
    }
    int inflight = 0;
    if (plan_applies(s, t, x)) {
        int r = plan_space(s, t, x, 1, dist, &inflight, NULL);
        return r == ZO__NOPLAN ? ZO_EBUDGET : r;
    }
    return window_space(s, t, x, 1, dist, &inflight, NULL);
}

/* Give t a copy's worth of space in tier x (device/host). 0: c->off/len/ptr
 * set (state unchanged); -EAGAIN: transfers in flight will free some, wait;
 * ZO_EBUDGET: it cannot fit (detail set), or a prefetch found no room. */
int zo__store_space(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, uint64_t dist)
{
    zo__copy *c = &t->c[x];
    zo__tier *tr = &s->tier[x];
    /* A stale copy's space: reuse once no transfer reads or fills it. A
     * load of an older version still landing in it counts: a second load
     * beside it would race it into the same buffer, and whichever finished
     * first would mark the copy resident while the other still wrote. */
    if (c->len)
        return c->readers || zo__copy_in_flight(c) ? -EAGAIN : 0;
    if (prefetch)
        return prefetch_space(s, t, x, dist);
    /* First come, first served: while an acquire waits for space in the
     * tier, later ones queue behind it. Jumping the queue, the next members
     * of a group took the holes the first one was waiting to merge, and it
     * failed for fragmentation. The head always resolves (it waits only for
     * transfers in flight), so the queue moves. */
    if (!zo_list_empty(&tr->parked))
        return -EAGAIN;
    uint64_t need = zo__ext_round(&tr->ext, t->bytes);
    zo_tensor *failed = NULL;
    int inflight = 0;
    if (plan_applies(s, t, x)) {
        int r = plan_space(s, t, x, 0, 0, &inflight, &failed);
        if (r != ZO__NOPLAN)
            return r;
        inflight = 0;
        failed = NULL;
    }
    int r = window_space(s, t, x, 0, 0, &inflight, &failed);
    if (r != ZO_EBUDGET)
        return r;
    if (inflight)
        return -EAGAIN;
    uint64_t pinned = pinned_bytes(s, x);
    if (pinned + need > tr->budget)
        return ZO_FAIL(&s->err, ZO_EBUDGET,
                       "%s tier: '%s' needs %llu bytes; %llu of the %llu-byte budget are held by home copies and "
                       "referenced copies",
                       zo_tier_name(x), t->name, (unsigned long long)need, (unsigned long long)pinned,
                       (unsigned long long)tr->budget);
    if (failed)
        /* the room is held by a copy that cannot be written back: the
         * acquire gets that error rather than waiting for it forever */
        return ZO_FAIL(&s->err, failed->c[x].wb_fail, "%s tier: no room for '%s': %s (that copy stays, dirty)",
                       zo_tier_name(x), t->name, failed->wb_fail_detail);
    s->st.frag_failures++;
    return ZO_FAIL(&s->err, ZO_EBUDGET,
                   "%s tier: no contiguous %llu bytes for '%s' (largest free %llu; the free space is fragmented "
                   "between referenced copies)",
                   zo_tier_name(x), (unsigned long long)need, t->name,
                   (unsigned long long)zo__ext_largest(&tr->ext));
}
