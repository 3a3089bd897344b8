/* SPDX-License-Identifier: Apache-2.0 */
/* The tile walker: the one mechanism every tiled operator uses. It streams
 * a list of store tensors through two device buffers, so tile k+1 travels
 * (copy stream) while tile k's work runs (compute stream).
 *
 * Per tile k, on the calling thread:
 *   A. begin fetching k+1: an acquire (device or host home: a future) or a
 *      store stream (NVMe home: its read-ahead starts loading pieces into
 *      pool slots in the background);
 *   B. the compute stream waits until tile k is in its buffer; fn(k)
 *      queues the work that reads it; an event marks the end of that work;
 *   C. finish fetching k+1: the copy stream waits for the end of tile k-1's
 *      work (its buffer is the one k+1 goes to), then the tile's bytes are
 *      copied in (host: one copy from the pinned home; NVMe: piece by piece
 *      from the pool slots, each slot handed back once its copy is done).
 * So the disk reads of k+1 run during fn(k) and its work, the copy of k+1
 * during tile k's work, and at most two tiles are ever in device memory.
 *
 * In-place NVMe tiles (host backend) read further ahead: step A begins up
 * to w->ahead of them (ahead_fill), each a one-slot stream, so the disk
 * has several reads in flight when tiles are small.
 *
 * Between runs the walker may hold one of two things: the last tile of a
 * run with ZO_TILE_RUN_KEEP_LAST (still in its slot) or a fetch begun by
 * zo_tile_walk_prefetch(). The next run takes it as tile 0 when it is
 * tiles[0], and drops it otherwise; so a backward walking a forward's
 * tiles in reverse order starts without a read, and a pass's first tile
 * can travel while the caller does other work. */
#define ZO_MODULE "tiling"
#include "tiling/tiling_internal.h"

#include <stdlib.h>
#include <string.h>

/* A fetch under way (step A to C). */
typedef struct fetch {
    zo_tensor *t;
    zo_tier home;
    uint64_t bytes;
    zo_store_req *req;       /* device/host home */
    zo_store_stream *sst;    /* NVMe home */
    int in_place;            /* used where it is (no copy into a buffer) */
} fetch;

struct zo_tile_walk {
    zo_store *store;
    zo_dev *dev;
    uint64_t buf_bytes;
    void *buf[2];
    zo_stream *copy, *compute;
    zo_event *loaded[2], *used[2];
    int used_rec[2];       /* used[i] recorded in this run */
    zo_tensor *held[2];    /* tile whose reference backs slot i (device home: in place; host: the copy's source) */
    zo_tier held_tier[2];
    int held_in_place[2];  /* slot i's tile is read where it is until used[i] (no loaded[i] copy) */
    zo_store_stream *held_sst[2]; /* NVMe tile used in place from its pool slot: the stream and piece */
    zo_store_piece held_pc[2];
    int in_place;          /* ZO_TILE_WALK_IN_PLACE on a host backend */
    uint64_t slot_size;    /* the store's pool slot size (in-place NVMe tiles fit one) */
    unsigned ahead;        /* most in-place NVMe tiles begun ahead of the one in use */
    unsigned ahead_auto;   /* what the pool allows (the default) */
    const void *ptr[2];    /* where slot i's tile is in device memory */
    /* Between runs: the last tile of a run with ZO_TILE_RUN_KEEP_LAST, still
     * in slot kept_slot (its reference / stream / buffer held), and a fetch
     * begun by zo_tile_walk_prefetch() (pre.t NULL: none; held here, not
     * allocated per prefetch). The next run takes over whichever is its
     * first tile and drops the other. */
    zo_tensor *kept;
    int kept_slot;
    fetch pre;
    zo_tile_walk_stats st;
    zo_errbuf err;
};


static void fetch_abort(zo_tile_walk *w, fetch *f);
static int release_slot(zo_tile_walk *w, int i);

ZO_API int zo_tile_walk_create(zo_tile_walk **out, zo_store *store, zo_dev *dev, uint64_t max_tile_bytes)
{
    return zo_tile_walk_create_ex(out, store, dev, max_tile_bytes, 0);
}

ZO_API int zo_tile_walk_create_ex(zo_tile_walk **out, zo_store *store, zo_dev *dev, uint64_t max_tile_bytes,
                                  unsigned flags)
{
    if (!out || !store || !dev)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_walk_create: NULL argument");
    *out = NULL;
    if (flags & ~ZO_TILE_WALK_IN_PLACE)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_walk_create: unknown flags 0x%x", flags);
    zo_tile_walk *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->store = store;
    w->dev = dev;
    w->buf_bytes = max_tile_bytes;
    w->in_place = zo__tile_in_place_ok(dev, flags & ZO_TILE_WALK_IN_PLACE);
    zo_store_stats ss;
    zo_store_get_stats(store, &ss);
    w->slot_size = ss.pool_slots >= ZO_TILE_IN_PLACE_SLOTS ? ss.pool_slot_size : 0;
    /* each tile read ahead in place holds a stream's two slots: the
     * minimum pool (ZO_TILE_IN_PLACE_SLOTS) reads one ahead, every two
     * slots more one deeper */
    w->ahead = w->in_place && w->slot_size ? (unsigned)ZO_MIN((ss.pool_slots - ZO_TILE_IN_PLACE_SLOTS) / 2 + 1,
                                               (size_t)ZO_TILE_AHEAD_MAX)
                            : 1;
    w->ahead_auto = w->ahead;
    int r = 0;
    for (int i = 0; i < 2 && max_tile_bytes; i++) {
        if (max_tile_bytes > SIZE_MAX) {
            r = ZO_FAIL(NULL, -ENOMEM, "zo_tile_walk_create: tile of %llu bytes", (unsigned long long)max_tile_bytes);
            goto fail;
        }
        r = zo_dev_malloc(dev, &w->buf[i], (size_t)max_tile_bytes);
        if (r < 0) {
            ZO_FAIL(NULL, r, "zo_tile_walk_create: device buffer of %llu bytes: %s",
                    (unsigned long long)max_tile_bytes, zo_dev_errmsg(dev));
            goto fail;
        }
    }
    ZO_CHECK_GOTO(zo_stream_create(dev, &w->copy), r, fail);
    ZO_CHECK_GOTO(zo_stream_create(dev, &w->compute), r, fail);
    for (int i = 0; i < 2; i++) {
        ZO_CHECK_GOTO(zo_event_create(dev, &w->loaded[i]), r, fail);
        ZO_CHECK_GOTO(zo_event_create(dev, &w->used[i]), r, fail);
    }
    *out = w;
    return 0;
fail:
    zo_tile_walk_destroy(&w);
    return r;
}

ZO_API void zo_tile_walk_destroy(zo_tile_walk **wp)
{
    if (!wp || !*wp)
        return;
    zo_tile_walk *w = *wp;
    if (w->copy)
        zo_stream_sync(w->copy);
    if (w->compute)
        zo_stream_sync(w->compute);
    zo_tile_walk_drop(w);
    for (int i = 0; i < 2; i++) {
        zo_event_destroy(&w->loaded[i]);
        zo_event_destroy(&w->used[i]);
    }
    zo_stream_destroy(&w->copy);
    zo_stream_destroy(&w->compute);
    for (int i = 0; i < 2; i++)
        if (w->buf[i])
            zo_dev_free(w->dev, w->buf[i]);
    free(w);
    *wp = NULL;
}

ZO_API zo_stream *zo_tile_walk_stream(zo_tile_walk *w)
{
    return w ? w->compute : NULL;
}

ZO_API int zo_tile_walk_in_place(const zo_tile_walk *w)
{
    return w ? w->in_place : 0;
}

ZO_API int zo_tile_walk_set_read_ahead(zo_tile_walk *w, unsigned tiles)
{
    if (!w)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_walk_set_read_ahead: NULL walker");
    if (tiles == 0)
        tiles = w->ahead_auto;
    w->ahead = ZO_MIN(tiles, w->ahead_auto);
    return (int)w->ahead;
}

ZO_API void zo_tile_walk_get_stats(const zo_tile_walk *w, zo_tile_walk_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof(*st));
    if (w)
        *st = w->st;
}

static unsigned stream_depth(zo_store *s, uint64_t bytes)
{
    zo_store_stats ss;
    zo_store_get_stats(s, &ss);
    if (ss.pool_slots < 3 || ss.pool_slot_size == 0)
        return 0;
    uint64_t pieces = (bytes + ss.pool_slot_size - 1) / ss.pool_slot_size;
    /* a stream takes depth + 1 slots and the store keeps one for itself;
     * leave one more for other users of the pool */
    uint64_t d = ZO_MIN((uint64_t)ss.pool_slots - 2, (uint64_t)4);
    d = ZO_MIN(d, pieces);
    return d ? (unsigned)d : 1;
}

/* Step A. */
static int fetch_begin(zo_tile_walk *w, zo_tensor *t, fetch *f)
{
    memset(f, 0, sizeof(*f));
    zo_tensor_info ti;
    ZO_CHECK(zo_store_tensor_info(w->store, t, &ti));
    f->t = t;
    f->home = ti.home;
    f->bytes = ti.bytes;
    /* in place: a device home always; on a host backend with IN_PLACE a
     * host home (its pinned home copy) and an NVMe home that fits one pool
     * slot (the slot it is read into) */
    f->in_place = ti.home == ZO_TIER_DEVICE ||
                  (w->in_place && (ti.home == ZO_TIER_HOST || (ti.bytes <= w->slot_size && ti.bytes > 0)));
    if (!f->in_place && ti.bytes > w->buf_bytes)
        return ZO_FAIL(&w->err, -EINVAL, "zo_tile_walk_run: tile '%s' has %llu bytes, the buffers %llu", ti.name,
                       (unsigned long long)ti.bytes, (unsigned long long)w->buf_bytes);
    uint64_t t0 = zo__now_ns();
    int r;
    if (ti.home == ZO_TIER_NVME && f->in_place) {
        /* one piece, held until the work that reads it is done */
        r = zo_store_stream_open(w->store, t, ZO_STREAM_READ, 1, &f->sst);
        if (r < 0)
            ZO_FAIL(&w->err, r, "zo_tile_walk_run: stream over '%s': %s", ti.name, zo_store_errmsg(w->store));
    } else if (ti.home == ZO_TIER_NVME) {
        unsigned depth = stream_depth(w->store, ti.bytes);
        if (!depth)
            return ZO_FAIL(&w->err, ZO_ECONFIG, "zo_tile_walk_run: NVMe tile '%s' needs a store pool of >= 3 slots",
                           ti.name);
        r = zo_store_stream_open(w->store, t, ZO_STREAM_READ, depth, &f->sst);
        /* other streams hold pool slots: read ahead less rather than fail */
        while (r == -EBUSY && depth > 1)
            r = zo_store_stream_open(w->store, t, ZO_STREAM_READ, --depth, &f->sst);
        if (r < 0)
            ZO_FAIL(&w->err, r, "zo_tile_walk_run: stream over '%s': %s", ti.name, zo_store_errmsg(w->store));
    } else {
        r = zo_store_acquire(w->store, t, ti.home, 0, &f->req);
        if (r < 0)
            ZO_FAIL(&w->err, r, "zo_tile_walk_run: acquire '%s': %s", ti.name, zo_store_errmsg(w->store));
    }
    w->st.fetch_ns += zo__now_ns() - t0;
    if (r == 0)
        w->st.reads++;
    return r;
}

/* Undo a begun fetch on an error path. */
static void fetch_abort(zo_tile_walk *w, fetch *f)
{
    if (f->sst)
        zo_store_stream_close(&f->sst);
    if (f->req) {
        void *p;
        if (zo_store_wait(w->store, f->req, &p) == 0)
            zo_store_release(w->store, f->t, f->home, 0);
        f->req = NULL;
    }
}

/* Drop the reference behind slot i once nothing reads through it any more:
 * a host home once its copy into the buffer is done, a device home once
 * the work that used it in place is done. */
static int release_slot(zo_tile_walk *w, int i)
{
    int r = 0;
    if (w->held_sst[i]) {
        /* an NVMe tile read in place from its pool slot */
        if (w->used_rec[i])
            r = zo_event_sync(w->used[i]);
        zo_store_stream_done(w->held_sst[i], &w->held_pc[i]);
        int r2 = zo_store_stream_close(&w->held_sst[i]);
        if (r == 0 && r2 < 0)
            r = ZO_FAIL(&w->err, r2, "zo_tile_walk_run: closing a tile's stream: %s", zo_store_errmsg(w->store));
        return r;
    }
    if (!w->held[i])
        return 0;
    if (!w->held_in_place[i])
        r = zo_event_sync(w->loaded[i]);
    else if (w->used_rec[i])
        r = zo_event_sync(w->used[i]);
    zo_store_release(w->store, w->held[i], w->held_tier[i], 0);
    w->held[i] = NULL;
    return r;
}

/* Slot i holds an NVMe tile in place: its stream keeps pool slots reserved. */
static int holds_stream(const zo_tile_walk *w, int i)
{
    return w->held_sst[i] != NULL;
}

/* Step C: the tile's bytes into buf[i] (or in place for a device home),
 * loaded[i] recorded after them. Consumes f on every path. */
static int fetch_finish(zo_tile_walk *w, fetch *f, int i)
{
    int r = 0;
    uint64_t t0 = zo__now_ns();
    ZO_CHECK_GOTO(release_slot(w, i), r, fail);
    /* the buffer still feeds tile k-1's work until used[i] */
    if (!f->in_place && w->used_rec[i])
        ZO_CHECK_GOTO(zo_stream_wait_event(w->copy, w->used[i]), r, fail);
    if (f->home == ZO_TIER_NVME && f->in_place) {
        zo_store_piece pc;
        r = zo_store_stream_next(f->sst, &pc);
        if (r < 0) {
            ZO_FAIL(&w->err, r, "zo_tile_walk_run: reading a tile from NVMe: %s", zo_store_errmsg(w->store));
            goto fail;
        }
        if (pc.len != f->bytes) {
            zo_store_stream_done(f->sst, &pc);
            r = ZO_FAIL(&w->err, ZO_EINTERNAL, "zo_tile_walk_run: a one-slot tile came as a piece of %zu bytes, "
                        "not %llu", pc.len, (unsigned long long)f->bytes);
            goto fail;
        }
        w->held_sst[i] = f->sst;
        w->held_pc[i] = pc;
        f->sst = NULL;
        w->ptr[i] = pc.host;
        w->st.in_place_tiles++;
    } else if (f->home != ZO_TIER_NVME) {
        void *p = NULL;
        zo_store_req *q = f->req;
        f->req = NULL;
        r = zo_store_wait(w->store, q, &p);
        if (r < 0) {
            ZO_FAIL(&w->err, r, "zo_tile_walk_run: loading a tile: %s", zo_store_errmsg(w->store));
            goto fail;
        }
        w->held[i] = f->t;
        w->held_tier[i] = f->home;
        w->held_in_place[i] = f->in_place;
        if (f->in_place) {
            w->ptr[i] = p;
            if (f->home != ZO_TIER_DEVICE)
                w->st.in_place_tiles++;
        } else {
            ZO_CHECK_GOTO(zo_memcpy_async(w->copy, w->buf[i], p, (size_t)f->bytes, ZO_COPY_H2D), r, fail);
            w->ptr[i] = w->buf[i];
            w->st.fetch_bytes += f->bytes;
        }
    } else {
        for (;;) {
            zo_store_piece pc;
            r = zo_store_stream_next(f->sst, &pc);
            if (r < 0) {
                ZO_FAIL(&w->err, r, "zo_tile_walk_run: reading a tile from NVMe: %s", zo_store_errmsg(w->store));
                goto fail;
            }
            if (pc.len == 0)
                break;
            r = zo_memcpy_async(w->copy, (uint8_t *)w->buf[i] + pc.off, pc.host, pc.len, ZO_COPY_H2D);
            /* the slot goes back to the pool only once the copy has read it */
            int r2 = r < 0 ? r : zo_stream_sync(w->copy);
            zo_store_stream_done(f->sst, &pc);
            if (r2 < 0) {
                r = r2;
                goto fail;
            }
        }
        r = zo_store_stream_close(&f->sst);
        if (r < 0)
            goto fail;
        w->ptr[i] = w->buf[i];
        w->st.fetch_bytes += f->bytes;
    }
    if (!f->in_place)
        ZO_CHECK_GOTO(zo_event_record(w->loaded[i], w->copy), r, fail);
    w->st.fetch_ns += zo__now_ns() - t0;
    return 0;
fail:
    fetch_abort(w, f);
    w->st.fetch_ns += zo__now_ns() - t0;
    return r;
}

/* The fetches begun ahead of the tile the walk is at: tiles
 * base, base+1, ... in order (f[0] is the next one). */
typedef struct ahead_q {
    fetch f[ZO_TILE_AHEAD_MAX];
    unsigned n;
} ahead_q;

static fetch ahead_pop(ahead_q *q)
{
    fetch f = q->f[0];
    memmove(q->f, q->f + 1, (q->n - 1) * sizeof(fetch));
    q->n--;
    return f;
}

/* Read ahead deeper than one tile (in-place NVMe tiles on the host
 * backend: each is one pool slot's read, and with one read in flight a
 * disk idles between small tiles): begin fetching tiles base + q->n, ...
 * while fewer than w->ahead are begun, their bytes are below
 * ZO_TILE_AHEAD_BYTES and the pool has slots (-EBUSY: stop, no error).
 * Only tiles read in place from NVMe go this deep: the others have nothing
 * to wait for (pinned home, device home) or need a buffer (copied). */
static int ahead_fill(zo_tile_walk *w, zo_tensor *const *tiles, unsigned n, unsigned base, ahead_q *q)
{
    uint64_t bytes = 0;
    for (unsigned j = 0; j < q->n; j++) {
        if (q->f[j].home != ZO_TIER_NVME || !q->f[j].in_place)
            return 0;
        bytes += q->f[j].bytes;
    }
    while (q->n && q->n < w->ahead && base + q->n < n && bytes < ZO_TILE_AHEAD_BYTES) {
        zo_tensor_info ti;
        int r = zo_store_tensor_info(w->store, tiles[base + q->n], &ti);
        if (r < 0 || ti.home != ZO_TIER_NVME || ti.bytes > w->slot_size)
            return 0; /* fetched the usual way when its turn comes */
        fetch *f = &q->f[q->n];
        r = fetch_begin(w, tiles[base + q->n], f);
        if (r < 0) {
            fetch_abort(w, f);
            if (r != -EBUSY)
                return r;
            zo__errbuf_set(&w->err, "");
            return 0;
        }
        bytes += f->bytes;
        q->n++;
        if (q->n > w->st.ahead_peak)
            w->st.ahead_peak = q->n;
    }
    return 0;
}

/* Exchange slots 0 and 1 (every per-slot field: the buffers are the same
 * size, so which one is "0" does not matter between runs). */
static void swap_slots(zo_tile_walk *w)
{
#define ZO__SWAP(a)                                                                                                   \
    do {                                                                                                              \
        __typeof__(a[0]) t_ = a[0];                                                                                   \
        a[0] = a[1];                                                                                                  \
        a[1] = t_;                                                                                                    \
    } while (0)
    ZO__SWAP(w->buf);
    ZO__SWAP(w->loaded);
    ZO__SWAP(w->used);
    ZO__SWAP(w->used_rec);
    ZO__SWAP(w->held);
    ZO__SWAP(w->held_tier);
    ZO__SWAP(w->held_in_place);
    ZO__SWAP(w->held_sst);
    ZO__SWAP(w->held_pc);
    ZO__SWAP(w->ptr);
#undef ZO__SWAP
}

ZO_API void zo_tile_walk_drop(zo_tile_walk *w)
{
    if (!w)
        return;
    if (w->pre.t) {
        fetch_abort(w, &w->pre);
        memset(&w->pre, 0, sizeof(w->pre));
    }
    if (w->kept) {
        /* its work is done (the run synced the compute stream) */
        (void)release_slot(w, 0);
        (void)release_slot(w, 1);
        w->kept = NULL;
    }
}

ZO_API int zo_tile_walk_prefetch(zo_tile_walk *w, zo_tensor *t)
{
    if (!w || !t)
        return ZO_FAIL(w ? &w->err : NULL, -EINVAL, "zo_tile_walk_prefetch: NULL argument");
    if (w->kept == t || w->pre.t == t)
        return 0; /* already there or on its way */
    zo_tile_walk_drop(w);
    fetch f;
    int r = fetch_begin(w, t, &f);
    if (r < 0) {
        fetch_abort(w, &f);
        /* the pool is busy with other streams: no prefetch, the run fetches
         * the tile itself */
        if (r == -EBUSY) {
            zo__errbuf_set(&w->err, "");
            w->st.prefetch_skipped++;
            return 0;
        }
        return r;
    }
    w->pre = f;
    w->st.prefetched++;
    return 0;
}

ZO_API int zo_tile_walk_run(zo_tile_walk *w, zo_tensor *const *tiles, unsigned n, zo_tile_fn fn, void *ctx)
{
    return zo_tile_walk_run_ex(w, tiles, n, fn, ctx, 0);
}

ZO_API int zo_tile_walk_run_ex(zo_tile_walk *w, zo_tensor *const *tiles, unsigned n, zo_tile_fn fn, void *ctx,
                               unsigned flags)
{
    if (!w || !tiles || !fn || n == 0)
        return ZO_FAIL(w ? &w->err : NULL, -EINVAL, "zo_tile_walk_run: NULL argument or no tiles");
    if (flags & ~ZO_TILE_RUN_KEEP_LAST)
        return ZO_FAIL(&w->err, -EINVAL, "zo_tile_walk_run: unknown flags 0x%x", flags);
    for (unsigned k = 0; k < n; k++)
        if (!tiles[k])
            return ZO_FAIL(&w->err, -EINVAL, "zo_tile_walk_run: tile %u is NULL", k);
    int r = 0;
    ahead_q rq;
    rq.n = 0;
    uint64_t t0 = zo__now_ns();
    /* the previous run synced its streams: its events are all past */
    w->used_rec[0] = w->used_rec[1] = 0;
    /* tile 0: the previous run's kept last tile, or a prefetched one, or
     * fetched now (the compute stream idles meanwhile: first_ns) */
    if (w->kept && w->kept == tiles[0]) {
        if (w->kept_slot == 1)
            swap_slots(w);
        w->kept = NULL;
        w->st.reused++;
    } else {
        fetch f0 = w->pre;
        memset(&w->pre, 0, sizeof(w->pre));
        if (f0.t && f0.t != tiles[0]) {
            fetch_abort(w, &f0);
            f0.t = NULL;
        }
        zo_tile_walk_drop(w); /* a kept tile not wanted now */
        int early = f0.t != NULL;
        if (!early)
            r = fetch_begin(w, tiles[0], &f0);
        if (r == 0 && n > 1 && early) {
            /* tile 0 was prefetched (its read ran while the caller did
             * other work): the reads after it start now, not after it is
             * in. Not when tile 0's read starts only now: reads in flight
             * share the disk, and every one begun beside it would delay
             * the tile the whole pass waits for. */
            fetch *f1 = &rq.f[0];
            int r1 = fetch_begin(w, tiles[1], f1);
            if (r1 == 0)
                rq.n = 1;
            else
                fetch_abort(w, f1); /* the walk fetches it in its turn */
            zo__errbuf_set(&w->err, "");
            r = ahead_fill(w, tiles, n, 1, &rq);
        }
        if (r == 0)
            r = fetch_finish(w, &f0, 0);
        else
            fetch_abort(w, &f0);
    }
    w->st.first_ns += zo__now_ns() - t0;
    w->st.runs++;
    for (unsigned k = 0; k < n && r == 0; k++) {
        int i = (int)(k & 1);
        fetch nf;
        memset(&nf, 0, sizeof(nf));
        int have_next = k + 1 < n, deferred = 0;
        if (have_next && rq.n == 0) {
            r = fetch_begin(w, tiles[k + 1], &nf);
            if (r == -EBUSY && holds_stream(w, 1 - i)) {
                /* the pool is short of slots while tile k-1's in-place
                 * stream still holds its own: wait for its work, retry */
                fetch_abort(w, &nf);
                r = release_slot(w, 1 - i);
                if (r == 0)
                    r = fetch_begin(w, tiles[k + 1], &nf);
            }
            if (r == -EBUSY && holds_stream(w, i)) {
                /* still short (another user holds slots): fetch k+1 only
                 * once tile k's work is done and its slot is back; no
                 * overlap for this tile, but no failure either */
                fetch_abort(w, &nf);
                deferred = 1;
                r = 0;
            }
            if (r < 0) {
                fetch_abort(w, &nf);
                break;
            }
            zo__errbuf_set(&w->err, "");
            if (!deferred)
                rq.f[rq.n++] = nf;
        }
        /* and deeper, while the pool and the byte target allow */
        if (have_next && !deferred && (r = ahead_fill(w, tiles, n, k + 1, &rq)) < 0)
            break;
        r = zo_stream_wait_event(w->compute, w->loaded[i]);
        if (r == 0)
            r = fn(ctx, k, w->ptr[i], w->compute);
        int r2 = zo_event_record(w->used[i], w->compute);
        if (r2 == 0)
            w->used_rec[i] = 1;
        if (r == 0)
            r = r2;
        w->st.tiles++;
        if (!have_next || r < 0)
            break;
        if (deferred) {
            r = release_slot(w, i);
            if (r == 0)
                r = fetch_begin(w, tiles[k + 1], &nf);
            if (r < 0) {
                fetch_abort(w, &nf);
                break;
            }
        } else {
            nf = ahead_pop(&rq);
        }
        r = fetch_finish(w, &nf, 1 - i);
    }
    while (rq.n) { /* an error stopped the walk early */
        fetch f = ahead_pop(&rq);
        fetch_abort(w, &f);
    }
    t0 = zo__now_ns();
    int rc = zo_stream_sync(w->compute), rp = zo_stream_sync(w->copy);
    w->st.wait_ns += zo__now_ns() - t0;
    if (r == 0)
        r = rc < 0 ? rc : rp;
    int last = (int)((n - 1) & 1);
    int r0 = release_slot(w, 1 - last), r1 = 0;
    if (r == 0 && r0 == 0 && (flags & ZO_TILE_RUN_KEEP_LAST)) {
        /* the last tile stays where it is, for the next run to start with */
        w->kept = tiles[n - 1];
        w->kept_slot = last;
    } else {
        r1 = release_slot(w, last);
    }
    if (r == 0)
        r = r0 < 0 ? r0 : r1;
    return r;
}
