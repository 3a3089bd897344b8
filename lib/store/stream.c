/* SPDX-License-Identifier: Apache-2.0 */
/* Streams: a tensor walked in slot-sized pieces through reserved pool
 * slots, with read-ahead and write-behind. The store's own copy-in/out
 * (zo_store_read/zo_store_write), checkpoint and restore are built on them.
 *
 * Slots: a stream reserves `quota` slots at open (depth + 1, + 1 with
 * WRITE); transfers may only use the slots nobody reserved, and one slot is
 * always left to them, so a stream below its quota always finds a free slot
 * once the transfers that were over the new limit hand theirs back. */
#include "store/store_internal.h"

#include <stdlib.h>
#include <string.h>

static zo__spiece *ring_find(zo_store_stream *st, uint64_t off)
{
    for (unsigned i = 0; i < st->quota; i++)
        if (st->ring[i].state != SP_FREE && st->ring[i].off == off)
            return &st->ring[i];
    return NULL;
}

static void stream_pump(zo_store *s, zo_store_stream *st)
{
    while (st->next_load < st->r1 && st->using_ < st->quota && !st->err) {
        unsigned ahead = 0, idx = st->quota;
        for (unsigned i = 0; i < st->quota; i++) {
            int state = st->ring[i].state;
            if (state == SP_LOADING || state == SP_READY)
                ahead++;
            if (state == SP_FREE && idx == st->quota)
                idx = i;
        }
        if (ahead >= st->depth || idx == st->quota)
            return;
        int slot = zo__slot_take(s);
        if (slot < 0)
            return; /* slots_pump calls back when one comes free */
        zo__spiece *e = &st->ring[idx];
        e->slot = slot;
        e->off = st->next_load;
        e->len = (size_t)ZO_MIN((uint64_t)st->piece, st->r1 - st->next_load);
        e->err = 0;
        st->using_++;
        st->next_load += e->len;
        if (!(st->mode & ZO_STREAM_READ)) {
            e->state = SP_READY;
            continue;
        }
        zo__job *j = zo__job_new(s, JOB_STREAM, st->t);
        if (!j) {
            e->state = SP_READY;
            e->err = -ENOMEM;
            st->err = -ENOMEM;
            snprintf(st->detail, sizeof(st->detail), "out of memory");
            continue;
        }
        e->state = SP_LOADING;
        st->busy++;
        j->stream = st;
        j->spiece = idx;
        j->from = zo__store_ep(s, st->t, st->src);
        j->to = (zo__ep){.kind = EP_HOST, .p = zo__slot_ptr(s, slot), .fixed = 1};
        j->r0 = j->next_off = e->off;
        j->r1 = e->off + e->len;
        j->piece = e->len;
        j->max_inflight = 1;
        zo__job_pump(s, j);
    }
}

void zo__streams_pump(zo_store *s)
{
    for (zo_store_stream *st = s->streams; st; st = st->snext)
        stream_pump(s, st);
    zo__sweeps_pump(s);
}

void zo__stream_piece_done(zo_store *s, zo__job *j)
{
    zo_store_stream *st = j->stream;
    zo__spiece *e = &st->ring[j->spiece];
    st->busy--;
    if (j->err) {
        e->err = j->err;
        if (!st->err) {
            st->err = j->err;
            snprintf(st->detail, sizeof(st->detail), "stream over '%s' at offset %llu: %s", st->t->name,
                     (unsigned long long)e->off, j->detail);
        }
    }
    if (e->state == SP_LOADING) {
        e->state = SP_READY;
        s->st.moved[st->src][ZO_TIER_HOST] += e->len;
    } else if (e->state == SP_WRITING) {
        s->st.moved[ZO_TIER_HOST][st->t->home] += e->len;
        zo__slot_put(s, e->slot);
        st->using_--;
        e->state = SP_FREE;
    }
    pthread_cond_broadcast(&s->cond);
}

const char *zo__stream_claim_busy(zo_store *s, zo_tensor *t, unsigned mode, int *settling)
{
    const char *busy = NULL;
    *settling = 0;
    if (t->stream_write)
        busy = "a write stream is open on it";
    else if (t->dying)
        busy = "it is being unregistered";
    else if ((mode & ZO_STREAM_WRITE) && s->ckpt_active)
        busy = "a checkpoint is being written";
    for (int x = 0; !busy && x < ZO__NTIERS; x++)
        if (t->c[x].write_held)
            busy = "it is held for writing";
    /* a write stream waits for transfers of the tensor to finish */
    *settling = !busy && (mode & ZO_STREAM_WRITE) && zo__tensor_busy(t);
    if (*settling && (t->streams || t->c[ZO_TIER_DEVICE].refs || t->c[ZO_TIER_HOST].refs))
        busy = "it is referenced or streamed";
    return busy;
}

/* Open a stream over [r0, r1) (piece aligned). Lock held. wait: block until
 * slots and the tensor are free instead of returning -EBUSY. need_home: the
 * home copy must be current once nothing is in flight (a write of part of
 * the tensor keeps the rest from there); -EAGAIN, no error recorded, if a
 * newer copy appeared since the caller's flush. */
static int stream_open_locked(zo_store *s, zo_tensor *t, unsigned mode, unsigned depth, uint64_t r0, uint64_t r1,
                              int wait, int need_home, zo_store_stream **out)
{
    unsigned quota = depth + 1 + ((mode & ZO_STREAM_WRITE) ? 1 : 0);
    if (!s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "store stream: the store has no pool slots");
    if (quota > s->nslots - 1)
        return ZO_FAIL(&s->err, -EBUSY,
                       "store stream: depth %u needs %u slots; the pool has %u (one is kept for transfers)", depth,
                       quota, s->nslots);
    for (;;) {
        int slots = 0, settling;
        const char *busy = zo__stream_claim_busy(s, t, mode, &settling);
        if (!busy && !settling && s->reserved + quota > s->nslots - 1) {
            busy = "not enough unreserved pool slots (other streams hold them)";
            slots = 1;
        }
        if (!busy && !settling)
            break;
        /* only slots and in-flight transfers are worth waiting for: they
         * come free by themselves; references are the caller's */
        if (!wait || (busy && !slots))
            return ZO_FAIL(&s->err, -EBUSY, "store stream over '%s': %s", t->name,
                           busy ? busy : "transfers of it are in flight");
        pthread_cond_wait(&s->cond, &s->lock);
    }
    if (need_home && !zo__store_current(t, t->home))
        return -EAGAIN;
    zo_store_stream *st = calloc(1, sizeof(*st));
    if (!st || !(st->ring = calloc(quota, sizeof(*st->ring)))) {
        free(st);
        return -ENOMEM;
    }
    st->s = s;
    st->t = t;
    st->mode = mode;
    st->depth = depth;
    st->quota = quota;
    st->r0 = st->next_load = st->next_hand = r0;
    st->r1 = r1;
    st->piece = s->slot_size;
    if (mode & ZO_STREAM_READ) {
        if (zo__store_freshest(t, &st->src) < 0) {
            free(st->ring);
            free(st);
            return ZO_FAIL(&s->err, ZO_EINTERNAL, "store stream: '%s' has no current copy", t->name);
        }
        st->src_ver = t->cur_ver;
        t->c[st->src].readers++;
    }
    t->streams++;
    if (mode & ZO_STREAM_WRITE)
        t->stream_write = 1;
    s->reserved += quota;
    st->snext = s->streams;
    s->streams = st;
    stream_pump(s, st);
    *out = st;
    return 0;
}

ZO_API int zo_store_stream_open(zo_store *s, zo_tensor *t, unsigned mode, unsigned depth, zo_store_stream **out)
{
    if (!s || !t || !out)
        return ZO_FAIL(s ? &s->err : NULL, -EINVAL, "zo_store_stream_open: NULL argument");
    *out = NULL;
    if (!mode || (mode & ~(ZO_STREAM_READ | ZO_STREAM_WRITE)) || depth == 0 || depth > 1024)
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_stream_open: mode 0x%x / depth %u invalid", mode, depth);
    pthread_mutex_lock(&s->lock);
    int r = stream_open_locked(s, t, mode, depth, 0, t->bytes, 0, 0, out);
    pthread_mutex_unlock(&s->lock);
    return r;
}

ZO_API int zo_store_stream_next(zo_store_stream *st, zo_store_piece *p)
{
    if (!st || !p)
        return -EINVAL;
    zo_store *s = st->s;
    memset(p, 0, sizeof(*p));
    pthread_mutex_lock(&s->lock);
    int r = 0;
    zo__spiece *e = NULL;
    if (st->err) {
        r = ZO_FAIL(&s->err, st->err, "%s", st->detail);
        goto out;
    }
    if (st->held >= st->depth) {
        r = ZO_FAIL(&s->err, ZO_ESTATE, "zo_store_stream_next: %u pieces held (depth %u): call "
                    "zo_store_stream_done() first", st->held, st->depth);
        goto out;
    }
    if (st->next_hand >= st->r1)
        goto out;
    e = ring_find(st, st->next_hand);
    if (!e || e->state == SP_LOADING) {
        uint64_t t0 = zo__now_ns();
        while ((!(e = ring_find(st, st->next_hand)) || e->state == SP_LOADING) && !st->err)
            pthread_cond_wait(&s->cond, &s->lock);
        s->st.stalls++;
        s->st.stall_ns += zo__now_ns() - t0;
        if (st->err) {
            r = ZO_FAIL(&s->err, st->err, "%s", st->detail);
            goto out;
        }
    }
    e->state = SP_HELD;
    st->held++;
    p->host = zo__slot_ptr(s, e->slot);
    p->off = e->off;
    p->len = e->len;
    p->index = (unsigned)((e->off - st->r0) / st->piece);
    st->next_hand += e->len;
    stream_pump(s, st);
out:
    pthread_mutex_unlock(&s->lock);
    return r;
}

ZO_API int zo_store_stream_done(zo_store_stream *st, const zo_store_piece *p)
{
    if (!st || !p)
        return -EINVAL;
    zo_store *s = st->s;
    pthread_mutex_lock(&s->lock);
    zo__spiece *e = ring_find(st, p->off);
    if (!e || e->state != SP_HELD) {
        pthread_mutex_unlock(&s->lock);
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_stream_done: no piece at offset %llu is held",
                       (unsigned long long)p->off);
    }
    st->held--;
    zo__job *j = (st->mode & ZO_STREAM_WRITE) && !st->err ? zo__job_new(s, JOB_STREAM, st->t) : NULL;
    if (j) {
        e->state = SP_WRITING;
        st->busy++;
        j->stream = st;
        j->spiece = (unsigned)(e - st->ring);
        j->from = (zo__ep){.kind = EP_HOST, .p = zo__slot_ptr(s, e->slot), .fixed = 1};
        j->to = zo__store_ep(s, st->t, st->t->home);
        j->r0 = j->next_off = e->off;
        j->r1 = e->off + e->len;
        j->piece = e->len;
        j->max_inflight = 1;
        zo__job_pump(s, j);
    } else {
        if ((st->mode & ZO_STREAM_WRITE) && !st->err) {
            st->err = -ENOMEM;
            snprintf(st->detail, sizeof(st->detail), "out of memory queueing a write-behind");
        }
        zo__slot_put(s, e->slot);
        st->using_--;
        e->state = SP_FREE;
    }
    stream_pump(s, st);
    zo__slots_pump(s);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

ZO_API int zo_store_stream_close(zo_store_stream **stp)
{
    if (!stp || !*stp)
        return 0;
    zo_store_stream *st = *stp;
    zo_store *s = st->s;
    zo_tensor *t = st->t;
    pthread_mutex_lock(&s->lock);
    while (st->busy)
        pthread_cond_wait(&s->cond, &s->lock);
    for (unsigned i = 0; i < st->quota; i++)
        if (st->ring[i].state != SP_FREE) {
            zo__slot_put(s, st->ring[i].slot);
            st->ring[i].state = SP_FREE;
        }
    s->reserved -= st->quota;
    for (zo_store_stream **pp = &s->streams; *pp; pp = &(*pp)->snext)
        if (*pp == st) {
            *pp = st->snext;
            break;
        }
    t->streams--;
    if (st->mode & ZO_STREAM_READ) {
        t->c[st->src].readers--;
        zo__store_maybe_free(s, t, st->src);
        zo__store_settle(s, t, st->src);
    }
    if (st->mode & ZO_STREAM_WRITE) {
        /* the home copy now holds the new contents; cached copies are stale */
        t->stream_write = 0;
        t->cur_ver++;
        t->c[t->home].ver = t->cur_ver;
        for (int y = 0; y < ZO__NTIERS; y++)
            if (y != (int)t->home) {
                t->c[y].wb_wanted = 0; /* stale now: nothing to write back */
                zo__store_maybe_free(s, t, (zo_tier)y);
            }
    }
    int err = st->err;
    if (err)
        ZO_FAIL(&s->err, err, "%s", st->detail);
    zo__slots_pump(s);
    zo__store_retry_parked(s);
    zo__trace_pump(s);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    free(st->ring);
    free(st);
    *stp = NULL;
    return err;
}

/* The read-ahead depth the store's own streams (copies, checkpoints,
 * restores) use: 2 where the pool has room, 1 in a small pool. A stream
 * holds depth + 1 slots, one more to write behind, and one slot is kept for
 * transfers; 0 (ZO_ECONFIG recorded) when not even depth 1 fits. Before,
 * checkpoint and restore asked for depth 2 whatever the pool, and a restore
 * in a 4-slot pool failed with -EBUSY (found by the CUDA store test). */
static int own_depth(zo_store *s, int writing, const char *fn, unsigned *depth)
{
    int room = (int)s->nslots - 2 - (writing ? 1 : 0);
    *depth = room >= 2 ? 2u : room == 1 ? 1u : 0u;
    if (*depth == 0)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "%s: the pool has too few slots (%u) to stream", fn, s->nslots);
    return 0;
}

/* ---- copies to and from user memory ------------------------------------------------------- */
static int range_check(zo_store *s, zo_tensor *t, uint64_t off, const void *buf, size_t len, const char *fn)
{
    if (!s || !t || (!buf && len))
        return ZO_FAIL(s ? &s->err : NULL, -EINVAL, "%s: NULL argument", fn);
    if (off > t->bytes || len > t->bytes - off)
        return ZO_FAIL(&s->err, -EINVAL, "%s: [%llu, +%zu) is outside '%s' (%llu bytes)", fn,
                       (unsigned long long)off, len, t->name, (unsigned long long)t->bytes);
    if (!s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "%s: the store has no pool slots", fn);
    return 0;
}

static int copy_range(zo_store *s, zo_tensor *t, uint64_t off, void *dst, const void *src, size_t len)
{
    uint64_t piece = s->slot_size;
    uint64_t r0 = off / piece * piece, r1 = ZO_MIN(t->bytes, (off + len + piece - 1) / piece * piece);
    int writing = src != NULL;
    unsigned mode = ZO_STREAM_READ;
    if (writing) {
        int partial = (off % piece) || ((off + len) % piece && off + len != t->bytes);
        mode = ZO_STREAM_WRITE | (partial ? ZO_STREAM_READ : 0);
    }
    unsigned depth;
    int r = own_depth(s, writing, writing ? "zo_store_write" : "zo_store_read", &depth);
    if (r < 0)
        return r;
    /* a write of part of the tensor keeps the rest: the home copy must be
     * current when the stream opens. Flushed first; a writer that slipped
     * in between (an acquire with WRITE, released dirty) makes the open
     * refuse, and the flush runs again. Once open, the write stream keeps
     * every acquire out. */
    int need_home = writing && (off != 0 || len != t->bytes);
    zo_store_stream *st;
    do {
        if (writing && (r = zo_store_flush(s, t)) < 0)
            return r;
        if (writing && s->write_hook)
            s->write_hook(s, t, s->write_hook_user);
        pthread_mutex_lock(&s->lock);
        if (writing && t->c[ZO_TIER_DEVICE].refs + t->c[ZO_TIER_HOST].refs) {
            r = ZO_FAIL(&s->err, -EBUSY, "zo_store_write: '%s' is referenced", t->name);
        } else {
            r = stream_open_locked(s, t, mode, depth, r0, r1, 1, need_home, &st);
            if (r == 0)
                st->internal = 1;
        }
        pthread_mutex_unlock(&s->lock);
    } while (r == -EAGAIN);
    if (r < 0)
        return r;
    zo_store_piece p;
    while ((r = zo_store_stream_next(st, &p)) == 0 && p.len) {
        uint64_t a = ZO_MAX(off, p.off), b = ZO_MIN(off + len, p.off + p.len);
        if (writing)
            memcpy((uint8_t *)p.host + (a - p.off), (const uint8_t *)src + (a - off), b - a);
        else
            memcpy((uint8_t *)dst + (a - off), (const uint8_t *)p.host + (a - p.off), b - a);
        if ((r = zo_store_stream_done(st, &p)) < 0)
            break;
    }
    int rc = zo_store_stream_close(&st);
    return r < 0 ? r : rc;
}

ZO_API int zo_store_read(zo_store *s, zo_tensor *t, uint64_t off, void *dst, size_t len)
{
    int r = range_check(s, t, off, dst, len, "zo_store_read");
    if (r < 0 || len == 0)
        return r;
    return copy_range(s, t, off, dst, NULL, len);
}

ZO_API int zo_store_write(zo_store *s, zo_tensor *t, uint64_t off, const void *src, size_t len)
{
    int r = range_check(s, t, off, src, len, "zo_store_write");
    if (r < 0 || len == 0)
        return r;
    return copy_range(s, t, off, NULL, src, len);
}

void zo__store_set_write_hook(zo_store *s, void (*fn)(zo_store *s, zo_tensor *t, void *user), void *user)
{
    pthread_mutex_lock(&s->lock);
    s->write_hook = fn;
    s->write_hook_user = user;
    pthread_mutex_unlock(&s->lock);
}

/* ---- checkpoints ------------------------------------------------------------------------ */
static size_t ckpt_chunk(size_t slot)
{
    size_t low = slot & (~slot + 1); /* largest power of two dividing slot */
    return ZO_MIN(low, (size_t)1 << 20);
}

/* Pins keep tensors registered while a checkpoint or a restore uses them
 * with the lock dropped: zo_store_unregister() refuses a pinned tensor
 * with -EBUSY. Lock held. */
static void pins_take(zo_tensor **list, unsigned n, int restore)
{
    for (unsigned i = 0; i < n; i++) {
        if (restore)
            list[i]->restoring = 1;
        else
            list[i]->ckpt_pins++;
    }
}

static void pins_drop(zo_store *s, zo_tensor **list, unsigned n, int restore)
{
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < n; i++) {
        if (restore)
            list[i]->restoring = 0;
        else
            list[i]->ckpt_pins--;
    }
    if (!restore)
        s->ckpt_active = 0;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* Record err in the store with `what` and the calling thread's last detail
 * (copied first: it is also the buffer the new detail is formatted into). */
static int fail_detail(zo_store *s, int err, const char *what, const char *after)
{
    char why[ZO_ERRMSG_LEN];
    snprintf(why, sizeof(why), "%s", zo_last_error_detail());
    return ZO_FAIL(&s->err, err, "%s: %s%s", what, why, after ? after : "");
}

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (zo_tensor *const *)a, y = (uintptr_t) * (zo_tensor *const *)b;
    return x < y ? -1 : x > y;
}

/* Are the n handles of ts all tensors of this store? Compared by pointer,
 * never dereferenced before they are found: a caller's stale handle is
 * refused, not used. O((N + n) log n): a model has 1e5 tensors. Lock held.
 * 0, -EINVAL (detail: the first stranger's index) or -ENOMEM. */
static int all_registered_locked(zo_store *s, zo_tensor *const *ts, unsigned n)
{
    zo_tensor **sorted = malloc((size_t)n * sizeof(*sorted));
    uint8_t *seen = calloc(n, 1);
    int r = 0;
    if (!sorted || !seen) {
        r = -ENOMEM;
        goto out;
    }
    memcpy(sorted, ts, (size_t)n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), ptr_cmp);
    for (zo_tensor *u = s->tensors; u; u = u->next) {
        zo_tensor **at = bsearch(&u, sorted, n, sizeof(*sorted), ptr_cmp);
        if (!at)
            continue;
        /* duplicates sit next to each other */
        size_t lo = (size_t)(at - sorted), hi = lo;
        while (lo > 0 && sorted[lo - 1] == u)
            lo--;
        while (hi + 1 < n && sorted[hi + 1] == u)
            hi++;
        memset(seen + lo, 1, hi - lo + 1);
    }
    for (unsigned i = 0; i < n && r == 0; i++)
        if (!seen[i])
            for (unsigned k = 0; k < n; k++)
                if (ts[k] == sorted[i]) {
                    r = ZO_FAIL(&s->err, -EINVAL, "zo_store_checkpoint: ts[%u] is not a tensor of this store", k);
                    break;
                }
out:
    free(sorted);
    free(seen);
    return r;
}

ZO_API int zo_store_checkpoint(zo_store *s, const char *root, const char *name, zo_tensor *const *ts, unsigned n,
                               unsigned keep_last, const char *user_json)
{
    if (!s || !root || !name || (n && !ts))
        return ZO_FAIL(s ? &s->err : NULL, -EINVAL, "zo_store_checkpoint: NULL argument");
    if (!s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "zo_store_checkpoint: the store has no pool slots");
    pthread_mutex_lock(&s->lock);
    if (s->ckpt_active) {
        pthread_mutex_unlock(&s->lock);
        return ZO_FAIL(&s->err, -EBUSY, "zo_store_checkpoint: another checkpoint is being written");
    }
    unsigned cnt = n ? n : (unsigned)s->ntensors;
    zo_tensor **list = calloc(cnt ? cnt : 1, sizeof(*list));
    if (!list) {
        pthread_mutex_unlock(&s->lock);
        return -ENOMEM;
    }
    unsigned k = 0;
    if (n)
        for (; k < n; k++)
            list[k] = ts[k];
    else
        for (zo_tensor *t = s->tensors; t; t = t->next)
            list[k++] = t;
    /* registration order, oldest first, for a stable layout */
    if (!n)
        for (unsigned a = 0, b = cnt ? cnt - 1 : 0; a < b; a++, b--) {
            zo_tensor *tmp = list[a];
            list[a] = list[b];
            list[b] = tmp;
        }
    int r = n ? all_registered_locked(s, ts, n) : 0;
    for (unsigned i = 0; i < cnt && r == 0; i++) {
        zo_tensor *t = list[i];
        int held = t->stream_write;
        for (int x = 0; x < ZO__NTIERS; x++)
            held |= t->c[x].write_held;
        if (held || t->dying || t->restoring)
            r = ZO_FAIL(&s->err, -EBUSY, "zo_store_checkpoint: '%s' is %s", t->name,
                        held ? "held for writing" : t->dying ? "being unregistered" : "being restored");
    }
    if (r < 0) {
        pthread_mutex_unlock(&s->lock);
        free(list);
        return r;
    }
    pins_take(list, cnt, 0);
    s->ckpt_active = 1; /* keeps writers out: the snapshot is consistent */
    pthread_mutex_unlock(&s->lock);

    zo_ckpt_options o;
    zo_ckpt_options_default(&o);
    o.chunk_size = ckpt_chunk(s->slot_size);
    o.keep_last = keep_last;
    o.user_json = user_json;
    o.aio = s->swap ? zo_swap_get_aio(s->swap) : NULL;
    zo_ckpt_writer *w = NULL;
    r = zo_ckpt_begin(&w, root, name, &o);
    if (r < 0) /* its detail went to this thread's only: the store's would stay empty */
        fail_detail(s, r, "zo_store_checkpoint", NULL);
    for (unsigned i = 0; i < cnt && r == 0; i++) {
        zo_ckpt_entry e = {.name = list[i]->name, .dtype = list[i]->desc.dtype, .ndim = list[i]->desc.ndim,
                           .bytes = list[i]->bytes};
        memcpy(e.shape, list[i]->desc.shape, sizeof(e.shape));
        r = zo_ckpt_add(w, &e, NULL);
    }
    for (unsigned i = 0; i < cnt && r == 0; i++) {
        zo_store_stream *st;
        unsigned depth;
        if ((r = own_depth(s, 0, "zo_store_checkpoint", &depth)) < 0)
            break;
        pthread_mutex_lock(&s->lock);
        r = stream_open_locked(s, list[i], ZO_STREAM_READ, depth, 0, list[i]->bytes, 1, 0, &st);
        pthread_mutex_unlock(&s->lock);
        if (r < 0)
            break;
        zo_store_piece p;
        while ((r = zo_store_stream_next(st, &p)) == 0 && p.len) {
            if ((r = zo_ckpt_put(w, i, p.off, p.host, p.len)) < 0)
                break;
            if ((r = zo_store_stream_done(st, &p)) < 0)
                break;
        }
        int rc = zo_store_stream_close(&st);
        if (r == 0)
            r = rc;
    }
    if (r == 0) {
        if ((r = zo_ckpt_commit(&w)) < 0)
            fail_detail(s, r, "zo_store_checkpoint", NULL);
    } else if (w) {
        char why[ZO_ERRMSG_LEN];
        snprintf(why, sizeof(why), "%s", zo_last_error_detail());
        zo_ckpt_abort(&w);
        ZO_FAIL(&s->err, r, "zo_store_checkpoint %s: %s", name, why);
    }
    pins_drop(s, list, cnt, 0);
    free(list);
    return r;
}

ZO_API void zo_store_restore_options_default(zo_store_restore_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->struct_size = sizeof(*o);
}

/* Match the checkpoint's tensors with registered ones and pin them, all
 * under one hold of the lock: what the caller holds is refused before any
 * tensor is touched. */
static int restore_claim(zo_store *s, zo_ckpt_reader *rd, zo_tensor **list, unsigned n)
{
    int r = 0;
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < n && r == 0; i++) {
        zo_ckpt_entry e;
        zo_ckpt_get_entry(rd, i, &e);
        zo_tensor *t = s->tensors;
        while (t && strcmp(t->name, e.name) != 0)
            t = t->next;
        if (!t) {
            r = ZO_FAIL(&s->err, -ENOENT, "zo_store_restore: checkpoint %s holds '%s', which is not registered",
                        zo_ckpt_name(rd), e.name);
        } else if (t->bytes != e.bytes || t->desc.dtype != e.dtype) {
            r = ZO_FAIL(&s->err, ZO_EFORMAT,
                        "zo_store_restore: '%s' is %llu bytes of %s here, %llu bytes of %s in checkpoint %s", e.name,
                        (unsigned long long)t->bytes, zo_dtype_name(t->desc.dtype), (unsigned long long)e.bytes,
                        zo_dtype_name(e.dtype), zo_ckpt_name(rd));
        } else if (t->streams || s->ckpt_active || t->c[ZO_TIER_DEVICE].refs || t->c[ZO_TIER_HOST].refs ||
                   t->dying || t->restoring) {
            r = ZO_FAIL(&s->err, -EBUSY, "zo_store_restore: '%s' is %s", t->name,
                        s->ckpt_active ? "in a checkpoint being written"
                        : t->dying     ? "being unregistered"
                        : t->restoring ? "being restored by another call"
                                       : "referenced or streamed");
        }
        list[i] = t;
    }
    if (r == 0)
        pins_take(list, n, 1);
    pthread_mutex_unlock(&s->lock);
    return r;
}

ZO_API int zo_store_restore2(zo_store *s, const char *root, const char *name, const zo_store_restore_options *uo,
                             char **user_json)
{
    if (user_json)
        *user_json = NULL;
    if (!s || !root)
        return ZO_FAIL(s ? &s->err : NULL, -EINVAL, "zo_store_restore: NULL argument");
    zo_store_restore_options o;
    zo_store_restore_options_default(&o);
    int r;
    if (uo && (r = ZO_STRUCT_IN(&o, uo, offsetof(zo_store_restore_options, flags) + sizeof(o.flags), &s->err,
                                "zo_store_restore2")) < 0)
        return r;
    if (o.flags & ~ZO_RESTORE_VERIFY_FIRST)
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_restore2: unknown flags 0x%x", o.flags);
    if (!s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "zo_store_restore: the store has no pool slots");
    zo_ckpt_reader *rd;
    if ((r = zo_ckpt_open(&rd, root, name)) < 0)
        return fail_detail(s, r, "zo_store_restore", NULL);
    unsigned n = zo_ckpt_count(rd);
    size_t chunk = zo_ckpt_chunk_size(rd);
    char *uj = NULL;
    zo_tensor **list = calloc(n ? n : 1, sizeof(*list));
    if (!list || (user_json && !(uj = strdup(zo_ckpt_user_json(rd))))) {
        free(list);
        zo_ckpt_close(&rd);
        return -ENOMEM;
    }
    if (s->slot_size % chunk) {
        r = ZO_FAIL(&s->err, ZO_ECONFIG, "zo_store_restore: checkpoint chunk %zu does not divide the slot size %zu",
                    chunk, s->slot_size);
        goto out;
    }
    if ((r = restore_claim(s, rd, list, n)) < 0)
        goto out;
    /* on request, every checksum before any tensor is written (a second
     * read of the checkpoint) */
    if ((o.flags & ZO_RESTORE_VERIFY_FIRST) && (r = zo_ckpt_verify(rd)) < 0) {
        fail_detail(s, r, "zo_store_restore", " (no tensor was changed)");
        goto unpin;
    }
    /* One read: each piece is read into the stream's slot and its chunks'
     * checksums verified there (zo_ckpt_read) before it is handed back to
     * be written home; a piece that fails is never written. */
    for (unsigned i = 0; i < n && r == 0; i++) {
        zo_store_stream *st;
        unsigned depth;
        if ((r = own_depth(s, 1, "zo_store_restore", &depth)) == 0) {
            pthread_mutex_lock(&s->lock);
            /* waits for background transfers of it (a write-back, a prefetch)
             * and for pool slots: they come free by themselves */
            r = stream_open_locked(s, list[i], ZO_STREAM_WRITE, depth, 0, list[i]->bytes, 1, 0, &st);
            pthread_mutex_unlock(&s->lock);
        }
        if (r < 0) {
            char after[ZO_TENSOR_NAME_MAX + 128];
            snprintf(after, sizeof(after), " (tensor %u of %u, '%s': the ones before it are restored, it and the rest "
                     "untouched)", i + 1, n, list[i]->name);
            fail_detail(s, r, "zo_store_restore", after);
            break;
        }
        zo_store_piece p;
        while ((r = zo_store_stream_next(st, &p)) == 0 && p.len) {
            if ((r = zo_ckpt_read(rd, i, p.off, p.host, p.len)) < 0)
                break; /* the piece stays held: close drops it unwritten */
            if ((r = zo_store_stream_done(st, &p)) < 0)
                break;
        }
        char why[ZO_ERRMSG_LEN];
        snprintf(why, sizeof(why), "%s", zo_last_error_detail());
        int rc = zo_store_stream_close(&st);
        if (r == 0 && rc < 0) {
            r = rc;
            snprintf(why, sizeof(why), "%s", zo_store_errmsg(s));
        }
        if (r < 0)
            ZO_FAIL(&s->err, r, "zo_store_restore: %s (tensor %u of %u, '%s', is partly loaded, its contents "
                    "undefined; the ones before it are restored, the rest untouched)", why, i + 1, n, list[i]->name);
    }
unpin:
    pins_drop(s, list, n, 1);
out:
    free(list);
    zo_ckpt_close(&rd);
    if (r == 0 && user_json) {
        *user_json = uj;
        uj = NULL;
    }
    free(uj);
    return r;
}

ZO_API int zo_store_restore(zo_store *s, const char *root, const char *name)
{
    return zo_store_restore2(s, root, name, NULL, NULL);
}
