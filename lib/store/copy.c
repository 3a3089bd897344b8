/* SPDX-License-Identifier: Apache-2.0 */
/* Copies of a tensor in the tiers: the copy state machine (zo__copy_to(),
 * the one place a state changes), which copy is current, the tiers' LRU
 * lists, freeing and evicting a copy, and starting the loads and
 * write-backs that fill a copy or bring it home (mover.c runs them). Apart
 * from store.c so the rules of a copy's life read in one place; finding
 * room for a copy is space.c, the acquires waiting on one acquire.c. */
#include "store/store_internal.h"

/* ---- copies ------------------------------------------------------------------------ */
static const char *const copy_state_names[ZO__CS_COUNT] = {"absent", "loading", "resident", "writeback",
                                                             "receiving"};

/* Legal transitions: the table in store_internal.h. */
static const unsigned char copy_legal[ZO__CS_COUNT][ZO__CS_COUNT] = {
    [ZO__CS_ABSENT] = {[ZO__CS_LOADING] = 1, [ZO__CS_RESIDENT] = 1},
    [ZO__CS_LOADING] = {[ZO__CS_ABSENT] = 1, [ZO__CS_RESIDENT] = 1},
    [ZO__CS_RESIDENT] = {[ZO__CS_ABSENT] = 1, [ZO__CS_LOADING] = 1, [ZO__CS_RESIDENT] = 1, [ZO__CS_WRITEBACK] = 1,
                         [ZO__CS_RECEIVING] = 1},
    [ZO__CS_WRITEBACK] = {[ZO__CS_RESIDENT] = 1},
    [ZO__CS_RECEIVING] = {[ZO__CS_RESIDENT] = 1},
};

void zo__copy_to(zo_store *s, zo_tensor *t, zo_tier x, zo__copy_state to)
{
    zo__copy *c = &t->c[x];
    zo__copy_state from = c->state;
    /* what else each state needs: only a home copy receives, only a
     * non-home copy is written back, a reload only replaces stale data,
     * nothing is freed under a reader */
    int ok = copy_legal[from][to] && (to != ZO__CS_RECEIVING || x == t->home) &&
             (to != ZO__CS_WRITEBACK || x != t->home) &&
             (!(from == ZO__CS_RESIDENT && to == ZO__CS_LOADING) || c->ver != t->cur_ver) &&
             (to != ZO__CS_ABSENT || !c->readers);
    if (!ok) {
        /* a bug in the store: say so loudly, count it (tests), go on */
        s->bad_transitions++;
        ZO_LOGE("store: illegal copy transition %s -> %s ('%s', %s tier, %u readers)", copy_state_names[from],
                copy_state_names[to], t->name, zo_tier_name(x), c->readers);
    }
    c->state = to;
}

int zo__store_current(const zo_tensor *t, zo_tier x)
{
    return zo__copy_has_data(&t->c[x]) && t->c[x].ver == t->cur_ver;
}

/* The only current copy: freeing it would lose the data. */
int zo__store_sole_current(const zo_tensor *t, zo_tier x)
{
    if (!zo__store_current(t, x))
        return 0;
    for (int y = 0; y < ZO__NTIERS; y++)
        if (y != (int)x && zo__store_current(t, (zo_tier)y))
            return 0;
    return 1;
}

/* Current copy to load tier x from: the nearest one. */
static int pick_source(const zo_tensor *t, zo_tier x, zo_tier *src)
{
    static const zo_tier pref[ZO__NTIERS][ZO__NTIERS - 1] = {
        [ZO_TIER_DEVICE] = {ZO_TIER_HOST, ZO_TIER_NVME},
        [ZO_TIER_HOST] = {ZO_TIER_DEVICE, ZO_TIER_NVME},
        [ZO_TIER_NVME] = {ZO_TIER_HOST, ZO_TIER_DEVICE},
    };
    /* a copy held for writing is changing under the caller's hands: never
     * a source */
    int held = 0;
    for (int i = 0; i < ZO__NTIERS - 1; i++)
        if (zo__store_current(t, pref[x][i])) {
            if (t->c[pref[x][i]].write_held) {
                held = 1;
                continue;
            }
            *src = pref[x][i];
            return 0;
        }
    return held ? -EBUSY : -ENOENT;
}

int zo__store_freshest(const zo_tensor *t, zo_tier *out)
{
    static const zo_tier order[ZO__NTIERS] = {ZO_TIER_HOST, ZO_TIER_DEVICE, ZO_TIER_NVME};
    for (int i = 0; i < ZO__NTIERS; i++)
        if (zo__store_current(t, order[i])) {
            *out = order[i];
            return 0;
        }
    return -ENOENT;
}

zo__ep zo__store_ep(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__ep e = {0};
    if (x == ZO_TIER_NVME) {
        e.kind = EP_NVME;
        e.sid = t->sid;
    } else {
        e.kind = x == ZO_TIER_DEVICE ? EP_DEV : EP_HOST;
        e.p = t->c[x].ptr;
    }
    return e;
}

static void lru_unlink(zo__tier *tr, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    if (zo_list_linked(&c->lnode)) {
        zo_list_del(&c->lnode);
        tr->ncopies--;
    }
}

/* Append at the tail (most recent); O(1). */
void zo__store_lru_append(zo__tier *tr, zo_tensor *t, zo_tier x)
{
    zo_list_add_tail(&tr->lru, &t->c[x].lnode);
    tr->ncopies++;
}

void zo__store_copy_free(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    zo__tier *tr = &s->tier[x];
    if (!c->len)
        return;
    if (c->prefetched) {
        tr->prefetched_bytes -= c->len;
        c->prefetched = 0;
    }
    zo__ext_free(&tr->ext, c->off, c->len);
    tr->used -= c->len;
    if (x == t->home)
        tr->home_bytes -= c->len;
    else
        lru_unlink(tr, t, x);
    zo__copy_to(s, t, x, ZO__CS_ABSENT);
    c->len = c->off = 0;
    c->ptr = NULL;
    c->drop_after = 0;
    c->wb_wanted = 0;
    c->wb_fail = 0;
}

/* Evict v's copy in tier x to make room. A prefetched copy evicted before
 * its use is a wasted prefetch (the thrash counter); one freed because its
 * data was replaced, its load failed or its tensor went away is not. */
void zo__store_evict(zo_store *s, zo_tensor *v, zo_tier x)
{
    s->st.evictions++;
    if (v->c[x].prefetched && v->c[x].ver == v->cur_ver)
        s->st.prefetch_wasted++;
    zo__store_copy_free(s, v, x);
}

/* Free a non-home copy nobody needs: stale, or asked to be dropped and not
 * the only current copy. */
void zo__store_maybe_free(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    if (x == t->home || c->state != ZO__CS_RESIDENT || zo__copy_busy(c))
        return;
    if (c->ver != t->cur_ver || (c->drop_after && !zo__store_sole_current(t, x))) {
        s->st.evictions++;
        zo__store_copy_free(s, t, x);
    }
}

/* ---- transfers ---------------------------------------------------------------------- */
static void set_job_path(zo_store *s, zo__job *j)
{
    j->from = zo__store_ep(s, j->t, j->src);
    j->to = zo__store_ep(s, j->t, j->dst);
    j->r0 = 0;
    j->r1 = j->t->bytes;
    j->next_off = 0;
    j->via_slot = (j->src == ZO_TIER_NVME && j->dst == ZO_TIER_DEVICE) ||
                  (j->src == ZO_TIER_DEVICE && j->dst == ZO_TIER_NVME);
    if (j->via_slot) {
        unsigned quota = s->nslots - s->reserved;
        j->piece = s->slot_size;
        j->max_inflight = ZO_MAX(2u, quota / 2);
    } else {
        j->piece = s->slot_size ? ZO_ALIGN_UP((size_t)ZO__DIRECT_PIECE, s->slot_size) : ZO__DIRECT_PIECE;
        j->max_inflight = ZO__DIRECT_INFLIGHT;
    }
}

int zo__store_start_load(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, uint64_t dist)
{
    zo__copy *c = &t->c[x];
    zo_tier src;
    int ps = pick_source(t, x, &src);
    if (ps == -EBUSY)
        return prefetch ? -EBUSY
                        : ZO_FAIL(&s->err, -EBUSY, "store: '%s' is held for writing in another tier", t->name);
    if (ps < 0)
        return ZO_FAIL(&s->err, ZO_EINTERNAL, "store: '%s' has no current copy to load from", t->name);
    if (src == ZO_TIER_NVME && x == ZO_TIER_DEVICE && !s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "store: NVMe to device needs pool slots (slots = 0)");
    int r = zo__store_space(s, t, x, prefetch, dist);
    if (r < 0)
        return r;
    zo__job *j = zo__job_new(s, JOB_LOAD, t);
    if (!j)
        return -ENOMEM;
    if (c->prefetched) {
        /* a stale copy loaded by a hint and never used: its space is
         * reused now, so it stops counting against the prefetch cap (not
         * wasted by the store: its data was replaced) */
        s->tier[x].prefetched_bytes -= c->len;
    }
    zo__copy_to(s, t, x, ZO__CS_LOADING);
    c->ver = t->cur_ver;
    c->prefetched = prefetch;
    if (prefetch) {
        s->tier[x].prefetched_bytes += c->len;
        s->st.prefetch_issued++;
    }
    t->c[src].readers++;
    j->src = src;
    j->dst = x;
    j->ver = t->cur_ver;
    j->prefetch = prefetch;
    if (prefetch) {
        j->pf_bytes = c->len;
        s->tier[x].prefetch_inflight += c->len;
    }
    set_job_path(s, j);
    zo__job_pump(s, j);
    return 0;
}

int zo__store_start_writeback(zo_store *s, zo_tensor *t, zo_tier x, int drop)
{
    zo__copy *c = &t->c[x];
    if (x == t->home || !zo__store_current(t, x) || zo__store_current(t, t->home)) {
        c->wb_wanted = 0;
        return 0;
    }
    zo__copy *home = &t->c[t->home];
    if (c->write_held || t->stream_write || zo__copy_in_flight(home) || home->readers) {
        /* still being modified, another write-back is landing in the home
         * copy (or a load fills it), or a load of an older version still
         * reads it (writing under it would tear what it reads, and fail it
         * with a checksum error): start when that ends */
        c->wb_wanted = 1;
        c->drop_after |= drop;
        return 0;
    }
    if (c->state == ZO__CS_WRITEBACK) {
        c->drop_after |= drop;
        return 0;
    }
    if (x == ZO_TIER_DEVICE && t->home == ZO_TIER_NVME && !s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "store: device to NVMe needs pool slots (slots = 0)");
    zo__job *j = zo__job_new(s, JOB_WRITEBACK, t);
    if (!j)
        return -ENOMEM;
    c->readers++;
    zo__copy_to(s, t, x, ZO__CS_WRITEBACK);
    c->wb_wanted = 0;
    c->drop_after |= drop;
    zo__copy_to(s, t, t->home, ZO__CS_RECEIVING);
    t->wb_count++;
    j->src = x;
    j->dst = t->home;
    j->ver = c->ver;
    set_job_path(s, j);
    zo__job_pump(s, j);
    return 0;
}
