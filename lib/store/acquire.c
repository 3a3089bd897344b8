/* SPDX-License-Identifier: Apache-2.0 */
/* Requests (zo_store_req) and what completes them: the waiters of a copy
 * settled as loads and write-backs land (zo__store_settle(),
 * zo__store_job_done()), acquires parked for space; the public acquire /
 * wait / test / release / prefetch / flush and the statistics. Apart from
 * the copies and the search for room: this is the caller's side of the
 * store. */
#include "store/store_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- requests ------------------------------------------------------------------------ */
static void req_wait_on(zo__copy *c, zo_store_req *r)
{
    zo_list_add_tail(&c->wq, &r->link);
    c->waiters++;
}

static void req_unlink(zo__copy *c, zo_store_req *r)
{
    if (!zo_list_linked(&r->link))
        return;
    zo_list_del(&r->link);
    if (r->parked) {
        r->parked = 0;
        c->parked--;
    } else {
        c->waiters--;
    }
}

static void req_complete(zo_store *s, zo_store_req *r, int err, const char *detail)
{
    zo__copy *c = &r->t->c[r->tier];
    req_unlink(c, r);
    r->done = 1;
    r->err = err;
    if (err < 0) {
        snprintf(r->detail, sizeof(r->detail), "%s", detail ? detail : zo_strerror(err));
        c->refs--;
        if (!c->refs) {
            c->write_held = 0;
            zo__trace_hold_end(s, r->t, r->tier);
        }
    } else {
        r->ptr = c->ptr;
    }
    pthread_cond_broadcast(&s->cond);
}

/* A write acquire takes effect: this copy becomes the only current one. */
static void make_writer(zo_store *s, zo_tensor *t, zo_tier x)
{
    t->cur_ver++;
    t->c[x].ver = t->cur_ver;
    t->c[x].wb_fail = 0; /* new data: its write-back has not failed yet */
    if (t->c[x].prefetched) {
        s->tier[x].prefetched_bytes -= t->c[x].len;
        t->c[x].prefetched = 0;
    }
    for (int y = 0; y < ZO__NTIERS; y++)
        if (y != (int)x)
            zo__store_maybe_free(s, t, (zo_tier)y);
}

/* O(1): to the tail of the tier's space queue. */
static void park(zo_store *s, zo_store_req *r)
{
    zo__copy *c = &r->t->c[r->tier];
    req_unlink(c, r);
    r->parked = 1;
    c->parked++;
    zo_list_add_tail(&s->tier[r->tier].parked, &r->link);
}

/* Move the waiters of t's copy in tier x forward: complete those whose copy
 * is ready, start the load the others need, park them if space must be
 * freed first. Only the waiter at hand leaves the list meanwhile. */
void zo__store_settle(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    /* Each waiter once: what runs for one (a load whose job fails at once
     * settles this copy again) may take others off the list, so the walk
     * starts over from the head after each, skipping those seen. */
    uint64_t gen = ++s->settle_gen;
    for (zo_list *pos = c->wq.next; pos != &c->wq;) {
        zo_store_req *r = zo_list_entry(pos, zo_store_req, link);
        if (r->visit == gen) {
            pos = pos->next;
            continue;
        }
        r->visit = gen;
    again:
        if (zo__store_current(t, x)) {
            if (!(r->flags & ZO_ACQ_WRITE)) {
                req_complete(s, r, 0, NULL);
            } else if (!c->readers && c->state == ZO__CS_RESIDENT) {
                make_writer(s, t, x);
                req_complete(s, r, 0, NULL);
            }
        } else if (!zo__copy_in_flight(c)) {
            int e;
            if (r->flags & ZO_ACQ_DISCARD) {
                e = zo__store_space(s, t, x, 0, 0);
                if (e == 0) {
                    zo__copy_to(s, t, x, ZO__CS_RESIDENT);
                    c->ver = t->cur_ver;
                    goto again; /* completes now */
                }
            } else {
                e = zo__store_start_load(s, t, x, 0, 0);
                if (e == 0) {
                    s->st.misses += r->demand ? 0 : 1;
                    r->demand = 1;
                }
            }
            if (e == -EAGAIN)
                park(s, r);
            else if (e < 0)
                req_complete(s, r, e, zo_store_errmsg(s));
        }
        pos = c->wq.next;
    }
}

void zo__store_retry_parked(zo_store *s)
{
    for (int x = 0; x < ZO__NTIERS; x++) {
        zo__tier *tr = &s->tier[x];
        if (zo_list_empty(&tr->parked))
            continue;
        /* detached, so the first to retry finds the queue empty and the
         * others park behind it again in their order */
        zo_list list;
        zo_list_init(&list);
        for (zo_list *n; (n = zo_list_pop_head(&tr->parked));)
            zo_list_add_tail(&list, n);
        for (zo_list *n; (n = zo_list_pop_head(&list));) {
            zo_store_req *r = zo_list_entry(n, zo_store_req, link);
            zo__copy *c = &r->t->c[r->tier];
            r->parked = 0;
            c->parked--;
            req_wait_on(c, r);
            zo__store_settle(s, r->t, r->tier);
        }
    }
}

/* A load or write-back finished (mover thread, lock held). */
void zo__store_job_done(zo_store *s, zo__job *j)
{
    zo_tensor *t = j->t;
    zo__copy *src = &t->c[j->src], *dst = &t->c[j->dst];
    src->readers--;
    s->tier[j->dst].prefetch_inflight -= j->pf_bytes;
    if (j->kind == JOB_LOAD) {
        if (j->err) {
            ZO_FAIL(&s->err, j->err, "store: loading '%s' into the %s tier from %s failed: %s", t->name,
                    zo_tier_name(j->dst), zo_tier_name(j->src), j->detail);
            if (dst->prefetched) {
                s->tier[j->dst].prefetched_bytes -= dst->len;
                dst->prefetched = 0;
            }
            zo__store_copy_free(s, t, j->dst);
            if (j->ver != t->cur_ver) {
                /* it loaded a version replaced meanwhile: its failure is
                 * not theirs; the waiters load the current data */
                zo__store_settle(s, t, j->dst);
            } else {
                for (zo_list *n; (n = zo_list_first(&dst->wq));)
                    req_complete(s, zo_list_entry(n, zo_store_req, link), j->err, zo_store_errmsg(s));
            }
        } else {
            zo__copy_to(s, t, j->dst, ZO__CS_RESIDENT);
            s->st.moved[j->src][j->dst] += t->bytes;
            if (j->prefetch)
                s->st.prefetch_bytes += t->bytes;
            else
                s->st.demand_bytes += t->bytes;
            zo__store_settle(s, t, j->dst);
            zo__store_maybe_free(s, t, j->dst); /* loaded a version already replaced */
        }
    } else {
        zo__copy_to(s, t, j->src, ZO__CS_RESIDENT);
        zo__copy_to(s, t, j->dst, ZO__CS_RESIDENT);
        t->wb_count--;
        if (j->err) {
            src->drop_after = 0; /* the only current copy: keep it */
            src->wb_fail = j->err;
            src->wb_fail_round = s->tier[j->src].space_round;
            snprintf(t->wb_fail_detail, sizeof(t->wb_fail_detail), "writing '%s' back to %s failed: %s", t->name,
                     zo_tier_name(j->dst), j->detail);
            if (!t->wb_err) {
                t->wb_err = j->err;
                snprintf(t->wb_detail, sizeof(t->wb_detail), "writing '%s' back to %s failed: %s", t->name,
                         zo_tier_name(j->dst), j->detail);
            }
            ZO_FAIL(&s->err, j->err, "store: %s", t->wb_detail);
        } else {
            if (j->ver > dst->ver)
                dst->ver = j->ver;
            src->wb_fail = 0;
            s->st.moved[j->src][j->dst] += t->bytes;
            s->st.writebacks++;
            s->st.writeback_bytes += t->bytes;
        }
    }
    zo__store_maybe_free(s, t, j->src);
    zo__store_settle(s, t, j->src);
    if (j->kind == JOB_WRITEBACK)
        zo__store_settle(s, t, j->dst);
    /* write-backs that waited for this one, or for a load reading the home
     * copy */
    zo__copy *home = &t->c[t->home];
    if (!zo__copy_in_flight(home) && !home->readers)
        for (int y = 0; y < ZO__NTIERS; y++)
            if (t->c[y].wb_wanted && !t->c[y].write_held)
                zo__store_start_writeback(s, t, (zo_tier)y, t->c[y].drop_after);
    pthread_cond_broadcast(&s->cond);
}

/* ---- acquire / release / prefetch ----------------------------------------------------------- */
static int check_tier(zo_store *s, zo_tier x, const char *fn)
{
    if ((unsigned)x >= ZO__NTIERS)
        return ZO_FAIL(&s->err, -EINVAL, "%s: invalid tier %d", fn, (int)x);
    if (x == ZO_TIER_NVME)
        return ZO_FAIL(&s->err, -EINVAL, "%s: the NVMe tier has no address; use the device or host tier, or a stream",
                       fn);
    if (!s->have[x])
        return ZO_FAIL(&s->err, ZO_ECONFIG, "%s: the %s tier is not configured", fn, zo_tier_name(x));
    return 0;
}

ZO_API int zo_store_acquire(zo_store *s, zo_tensor *t, zo_tier x, unsigned flags, zo_store_req **out)
{
    if (!s || !t || !out)
        return ZO_FAIL(s ? &s->err : NULL, -EINVAL, "zo_store_acquire: NULL argument");
    *out = NULL;
    int r = check_tier(s, x, "zo_store_acquire");
    if (r < 0)
        return r;
    if (flags & ~(ZO_ACQ_WRITE | ZO_ACQ_DISCARD))
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_acquire: unknown flags 0x%x", flags);
    if (flags & ZO_ACQ_DISCARD)
        flags |= ZO_ACQ_WRITE;
    zo_store_req *req = calloc(1, sizeof(*req));
    if (!req)
        return -ENOMEM;
    pthread_mutex_lock(&s->lock);
    zo__copy *c = &t->c[x];
    const char *busy = NULL;
    if (t->stream_write)
        busy = "a write stream is open on it";
    else if (t->dying)
        busy = "it is being unregistered";
    else if ((flags & ZO_ACQ_WRITE) && t->streams)
        busy = "a stream is open on it";
    else if ((flags & ZO_ACQ_WRITE) && s->ckpt_active)
        busy = "a checkpoint is being written";
    for (int y = 0; !busy && y < ZO__NTIERS; y++) {
        if (y == (int)x)
            continue;
        if (t->c[y].write_held)
            busy = "it is held for writing in another tier";
        else if ((flags & ZO_ACQ_WRITE) && t->c[y].refs)
            busy = "another tier holds references (they would read stale data)";
    }
    if (busy) {
        pthread_mutex_unlock(&s->lock);
        free(req);
        return ZO_FAIL(&s->err, -EBUSY, "zo_store_acquire: '%s' in the %s tier: %s", t->name, zo_tier_name(x), busy);
    }
    uint64_t need = zo__ext_round(&s->tier[x].ext, t->bytes);
    if (x != t->home && !c->len && need > s->tier[x].budget - s->tier[x].home_bytes) {
        pthread_mutex_unlock(&s->lock);
        free(req);
        return ZO_FAIL(&s->err, ZO_EBUDGET,
                       "zo_store_acquire: '%s' (%llu bytes) cannot fit in the %s tier (budget %llu, home copies %llu)",
                       t->name, (unsigned long long)t->bytes, zo_tier_name(x),
                       (unsigned long long)s->tier[x].budget, (unsigned long long)s->tier[x].home_bytes);
    }
    req->t = t;
    req->tier = x;
    req->flags = flags;
    s->tier[x].space_round++;
    zo__trace_note(s, t, x);
    c->refs++;
    if (flags & ZO_ACQ_WRITE)
        c->write_held = 1;
    c->drop_after = 0;
    c->lru = ++s->tick;
    if (x != t->home && c->len)
        zo_list_move_tail(&s->tier[x].lru, &c->lnode);
    int hit = zo__copy_current_or_loading(t, x);
    if (hit) {
        s->st.hits++;
        if (c->prefetched) {
            s->tier[x].prefetched_bytes -= c->len;
            c->prefetched = 0;
            s->st.prefetch_used++;
        }
    } else {
        s->st.misses++;
        req->demand = 1;
    }
    zo_list_init(&req->link);
    req_wait_on(c, req);
    zo__store_settle(s, t, x);
    zo__trace_pump(s);
    pthread_mutex_unlock(&s->lock);
    *out = req;
    return 0;
}

static int req_finish(zo_store *s, zo_store_req *r, void **ptr)
{
    int err = r->err;
    if (ptr)
        *ptr = err ? NULL : r->ptr;
    if (err < 0)
        ZO_FAIL(&s->err, err, "%s", r->detail);
    free(r);
    return err;
}

ZO_API int zo_store_wait(zo_store *s, zo_store_req *r, void **ptr)
{
    if (!s || !r)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    if (!r->done) {
        uint64_t t0 = zo__now_ns();
        while (!r->done)
            pthread_cond_wait(&s->cond, &s->lock);
        s->st.stalls++;
        s->st.stall_ns += zo__now_ns() - t0;
    }
    pthread_mutex_unlock(&s->lock);
    return req_finish(s, r, ptr);
}

ZO_API int zo_store_test(zo_store *s, zo_store_req *r, void **ptr)
{
    if (!s || !r)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    int done = r->done;
    pthread_mutex_unlock(&s->lock);
    if (!done) {
        if (ptr)
            *ptr = NULL;
        return ZO_PENDING; /* positive: never one of the completion's errors */
    }
    return req_finish(s, r, ptr);
}

ZO_API int zo_store_release(zo_store *s, zo_tensor *t, zo_tier x, unsigned flags)
{
    if (!s || !t)
        return -EINVAL;
    int r = check_tier(s, x, "zo_store_release");
    if (r < 0)
        return r;
    if (flags & ~(ZO_REL_WRITEBACK | ZO_REL_DROP))
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_release: unknown flags 0x%x", flags);
    pthread_mutex_lock(&s->lock);
    zo__copy *c = &t->c[x];
    /* references of acquires still waiting are not the caller's to drop */
    if (c->refs <= c->waiters + c->parked) {
        pthread_mutex_unlock(&s->lock);
        return ZO_FAIL(&s->err, ZO_ESTATE, "zo_store_release: '%s' holds no completed reference in the %s tier",
                       t->name, zo_tier_name(x));
    }
    c->refs--;
    if (!c->refs) {
        c->write_held = 0;
        zo__trace_hold_end(s, t, x);
    }
    if (flags & ZO_REL_DROP)
        c->drop_after = 1;
    if (flags & (ZO_REL_WRITEBACK | ZO_REL_DROP))
        c->wb_wanted = 1;
    if (c->wb_wanted && !c->write_held) {
        c->wb_wanted = 0;
        if (x != t->home && zo__store_sole_current(t, x))
            r = zo__store_start_writeback(s, t, x, c->drop_after);
    }
    zo__store_maybe_free(s, t, x);
    if (!c->refs)
        zo__store_retry_parked(s);
    zo__trace_pump(s);
    pthread_mutex_unlock(&s->lock);
    return r;
}

ZO_API int zo_store_prefetch(zo_store *s, zo_tensor *t, zo_tier x)
{
    if (!s || !t)
        return -EINVAL;
    int r = check_tier(s, x, "zo_store_prefetch");
    if (r < 0)
        return r;
    pthread_mutex_lock(&s->lock);
    if (!t->stream_write && !t->dying && !zo__copy_current_or_loading(t, x)) {
        uint64_t dist = zo__trace_dist(s, t);
        if (zo__store_start_load(s, t, x, 1, dist == ZO__DIST_INF ? 0 : dist) < 0)
            s->st.prefetch_dropped++;
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}

ZO_API int zo_store_flush(zo_store *s, zo_tensor *only)
{
    if (!s)
        return -EINVAL;
    int err = 0;
    char detail[ZO_ERRMSG_LEN] = "";
    pthread_mutex_lock(&s->lock);
    /* until no copy (not held for writing) is newer than its home copy;
     * a write-back may wait for another landing in the same home copy */
    for (;;) {
        int pending = 0;
        for (zo_tensor *t = s->tensors; t; t = t->next) {
            if (only && t != only)
                continue;
            if (t->wb_err) {
                if (!err) {
                    err = t->wb_err;
                    snprintf(detail, sizeof(detail), "%s", t->wb_detail);
                }
                t->wb_err = 0;
                continue;
            }
            pending |= t->wb_count != 0;
            if (zo__store_current(t, t->home) || t->stream_write)
                continue;
            for (int x = 0; x < ZO__NTIERS; x++) {
                zo__copy *c = &t->c[x];
                if (x == (int)t->home || !zo__store_current(t, (zo_tier)x) || c->write_held)
                    continue;
                pending = 1;
                if (c->state != ZO__CS_WRITEBACK && !c->wb_wanted) {
                    int r = zo__store_start_writeback(s, t, (zo_tier)x, 0);
                    if (r < 0 && !err) {
                        err = r;
                        zo__errbuf_get(&s->err, detail, sizeof(detail));
                    }
                    if (r < 0)
                        pending = 0;
                }
            }
        }
        if (!pending || err)
            break;
        pthread_cond_wait(&s->cond, &s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    if (err < 0)
        return ZO_FAIL(&s->err, err, "zo_store_flush: %s", detail);
    return 0;
}

ZO_API void zo_store_get_stats(zo_store *s, zo_store_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof(*st));
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    *st = s->st;
    for (int x = 0; x < ZO__NTIERS; x++) {
        st->budget[x] = s->have[x] ? s->tier[x].budget : 0;
        st->used[x] = s->tier[x].used;
        st->peak[x] = s->tier[x].peak;
    }
    st->pool_slots = s->nslots;
    st->pool_slot_size = s->slot_size;
    st->pool_in_use = s->pool_in_use;
    st->pool_peak = s->pool_peak;
    st->trace_len = s->ntrace;
    pthread_mutex_unlock(&s->lock);
}

ZO_API void zo_store_reset_stats(zo_store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    zo_store_stats keep = s->st;
    memset(&s->st, 0, sizeof(s->st));
    s->st.pinned_bytes = keep.pinned_bytes;
    s->st.pool_locked = keep.pool_locked;
    s->st.pool_aio_fixed = keep.pool_aio_fixed;
    s->st.pool_dev_registered = keep.pool_dev_registered;
    s->pool_peak = s->pool_in_use;
    for (int x = 0; x < ZO__NTIERS; x++)
        s->tier[x].peak = s->tier[x].used;
    pthread_mutex_unlock(&s->lock);
}
