/* SPDX-License-Identifier: Apache-2.0 */
/* The tiled linear: y = x W^T + b with W a grid of store tiles streamed by
 * the walker. Every product is a zo_gemm_async() on the walker's compute
 * stream; the bias broadcast (y = 1 b^T) and db (dy^T 1) are GEMMs with a
 * ones vector too, so the operator needs no kernel beyond GEMM and runs the
 * same on every backend.
 *
 * Row-major shapes, tile (r, c) = W[o0 : o0+rows, i0 : i0+cols]:
 *   forward   y[:, o0:]  (+)= x[:, i0:] . tile^T     (m=B, n=rows, k=cols)
 *   backward  dx[:, i0:] (+)= dy[:, o0:] . tile      (m=B, n=cols, k=rows)
 *             dW tile      = dy[:, o0:]^T . x[:, i0:] (m=rows, n=cols, k=B)
 * Tiles are walked row by row (r outer), so a y block is complete after its
 * tile row and dx's first tile row overwrites (beta 0). */
#define ZO_MODULE "tiling"
#include "tiling/tiling_internal.h"

#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/vec.h>


struct zo_tiled_linear {
    zo_store *store;
    zo_dev *dev;
    zo_tiled_linear_config cfg;
    char name[ZO_TENSOR_NAME_MAX + 1];
    zo_tile_grid grid;
    zo_tensor **tiles;
    zo_tensor **rtiles;        /* the tiles in reverse order (backward's walk) */
    unsigned ntiles;
    zo_tile_walk *walk;
    void *ones_f32, *ones_t;   /* batch ones: f32 (bias) and dtype (db) */
    zo_stream *aux;            /* fills the ones vectors */
    zo__sinkq sq;              /* dW tiles (train) */
    int sq_init;
    zo_errbuf err;
};

ZO_API void zo_tiled_linear_config_default(zo_tiled_linear_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->name = "linear";
    cfg->dtype = ZO_DTYPE_F32;
    cfg->home = ZO_TIER_NVME;
    cfg->train = 1;
}

/* Fill n elements of device memory at p with 1.0 of type t (through a host
 * buffer: done once at create). */
static int fill_ones(zo_dev *dev, zo_stream *s, void *p, zo_dtype t, size_t n)
{
    size_t esz = zo_dtype_size(t);
    uint8_t *h = malloc(n * esz);
    if (!h)
        return -ENOMEM;
    float one = 1.0f;
    for (size_t i = 0; i < n; i++)
        zo_vec_cast(h + i * esz, t, &one, ZO_DTYPE_F32, 1);
    int r = zo_memcpy_async(s, p, h, n * esz, ZO_COPY_H2D);
    int r2 = zo_stream_sync(s);
    free(h);
    (void)dev;
    return r < 0 ? r : r2;
}

/* The grid for config c with plan flags `flags`. With ZO_TILE_IN_PLACE and
 * an NVMe home (slot > 0) every tile must fit one pool slot to be read in
 * place: a budget-planned grid is cut down to that (fewer bytes, so still
 * within the budget); a given tile larger than a slot returns 1 (plan again
 * without in place: it is copied). */
static int plan(const zo_tiled_linear_config *c, unsigned flags, uint64_t slot, zo_tile_grid *g)
{
    int r;
    if (c->budget)
        r = zo_tile_plan(c->max_batch, c->out_features, c->in_features, c->dtype, c->budget, flags, g);
    else
        r = zo_tile_grid_make(c->max_batch, c->out_features, c->in_features, c->dtype, c->tile_out, c->tile_in,
                              flags, g);
    if (r < 0 || !slot || g->tile_bytes <= slot)
        return r;
    if (!c->budget || zo__tile_cap(g, slot) < 0)
        return 1;
    return 0;
}

static int dev_alloc(zo_tiled_linear *tl, void **p, uint64_t n, const char *what)
{
    int r = zo_dev_malloc(tl->dev, p, (size_t)n);
    if (r < 0)
        return ZO_FAIL(&tl->err, r, "zo_tiled_linear_create: %s (%llu bytes): %s", what, (unsigned long long)n,
                       zo_dev_errmsg(tl->dev));
    return 0;
}

ZO_API int zo_tiled_linear_create(zo_tiled_linear **out, zo_store *store, zo_dev *dev,
                                  const zo_tiled_linear_config *cfg)
{
    if (!out || !store || !dev || !cfg)
        return ZO_FAIL(NULL, -EINVAL, "zo_tiled_linear_create: NULL argument");
    *out = NULL;
    zo_tiled_linear *tl = calloc(1, sizeof(*tl));
    if (!tl)
        return -ENOMEM;
    zo_tiled_linear_config_default(&tl->cfg);
    /* the first published version ended before copy_tiles (defaults to 0: in place) */
    int r = ZO_STRUCT_IN(&tl->cfg, cfg, offsetof(zo_tiled_linear_config, copy_tiles), &tl->err,
                         "zo_tiled_linear_create");
    if (r < 0) {
        free(tl);
        return r;
    }
    zo_tiled_linear_config *c = &tl->cfg;
    tl->store = store;
    tl->dev = dev;
    ZO_CHECK_GOTO(zo__tile_name_home(&c->name, tl->name, c->home, &tl->err, "zo_tiled_linear_create"), r, fail);
    unsigned flags = (c->train ? ZO_TILE_TRAIN : 0) | (c->home == ZO_TIER_DEVICE ? ZO_TILE_RESIDENT : 0);
    /* the host backend's in-place fetch (zo__tile_in_place_home) */
    uint64_t slot;
    int in_place = zo__tile_in_place_home(store, dev, c->home, c->copy_tiles, &slot);
    r = plan(c, in_place ? flags | ZO_TILE_IN_PLACE : flags, slot, &tl->grid);
    if (r == 1) /* NVMe tiles given larger than a pool slot: those are copied */
        r = plan(c, flags, 0, &tl->grid);
    if (r < 0) {
        zo__tile_keep(&tl->err, r);
        goto fail;
    }
    zo_tile_grid *g = &tl->grid;
    tl->ntiles = g->tiles_out * g->tiles_in;
    /* the working memory: exactly grid.work_bytes (zo__tile_linear_work) */
    ZO_CHECK_GOTO(zo__tile_setup(store, dev, tl->name, "w", g, c->home, 0, &tl->tiles, &tl->rtiles, &tl->walk,
                                 &tl->err), r, fail);
    zo_tile_walk_set_read_ahead(tl->walk, c->read_ahead);
    size_t esz = zo_dtype_size(c->dtype);
    ZO_CHECK_GOTO(dev_alloc(tl, &tl->ones_f32, g->batch * sizeof(float), "ones vector"), r, fail);
    ZO_CHECK_GOTO(zo_stream_create(dev, &tl->aux), r, fail);
    ZO_CHECK_GOTO(fill_ones(dev, tl->aux, tl->ones_f32, ZO_DTYPE_F32, g->batch), r, fail);
    if (c->train) {
        ZO_CHECK_GOTO(dev_alloc(tl, &tl->ones_t, g->batch * esz, "ones vector"), r, fail);
        ZO_CHECK_GOTO(fill_ones(dev, tl->aux, tl->ones_t, c->dtype, g->batch), r, fail);
        tl->sq_init = 1;
        ZO_CHECK_GOTO(zo__sinkq_init(&tl->sq, dev, (uint64_t)g->tile_out * g->tile_in * sizeof(float), c->dw_sink,
                                     c->dw_sink_ctx, &tl->err),
                      r, fail);
    }
    *out = tl;
    return 0;
fail:
    zo_tiled_linear_destroy(&tl);
    return r;
}

ZO_API void zo_tiled_linear_destroy(zo_tiled_linear **tlp)
{
    if (!tlp || !*tlp)
        return;
    zo_tiled_linear *tl = *tlp;
    zo_tile_walk_destroy(&tl->walk);
    if (tl->sq_init)
        zo__sinkq_fini(&tl->sq);
    zo_stream_destroy(&tl->aux);
    if (tl->ones_f32)
        zo_dev_free(tl->dev, tl->ones_f32);
    if (tl->ones_t)
        zo_dev_free(tl->dev, tl->ones_t);
    free(tl->rtiles);
    zo__tile_unregister(tl->store, &tl->tiles, tl->ntiles);
    free(tl);
    *tlp = NULL;
}

ZO_API int zo_tiled_linear_grid(const zo_tiled_linear *tl, zo_tile_grid *grid)
{
    if (!tl || !grid)
        return -EINVAL;
    *grid = tl->grid;
    return 0;
}

ZO_API int zo_tiled_linear_tile(const zo_tiled_linear *tl, uint32_t r, uint32_t c, zo_tensor **out)
{
    if (!tl || !out || r >= tl->grid.tiles_out || c >= tl->grid.tiles_in)
        return ZO_FAIL(tl ? (zo_errbuf *)&tl->err : NULL, -EINVAL, "zo_tiled_linear_tile: (%u, %u) outside the grid",
                       r, c);
    *out = tl->tiles[(size_t)r * tl->grid.tiles_in + c];
    return 0;
}

ZO_API const char *zo_tiled_linear_errmsg(const zo_tiled_linear *tl)
{
    static _Thread_local char copy[ZO_ERRMSG_LEN];
    return zo__errbuf_tls(tl ? &tl->err : NULL, copy);
}

ZO_API int zo_tiled_linear_set_weight(zo_tiled_linear *tl, const void *w, uint64_t ld)
{
    if (!tl)
        return ZO_FAIL(NULL, -EINVAL, "zo_tiled_linear_set_weight: NULL handle");
    zo_tile_walk_drop(tl->walk); /* a kept or prefetched tile would be stale (or block the write) */
    return zo__tile_weight_io(tl->store, tl->tiles, &tl->grid, (void *)w, ld, 1, &tl->err);
}

ZO_API int zo_tiled_linear_get_weight(zo_tiled_linear *tl, void *w, uint64_t ld)
{
    if (!tl)
        return ZO_FAIL(NULL, -EINVAL, "zo_tiled_linear_get_weight: NULL handle");
    return zo__tile_weight_io(tl->store, tl->tiles, &tl->grid, w, ld, 0, &tl->err);
}

/* Whether backward walks the tiles last to first. */
static int bwd_reversed(const zo_tiled_linear *tl)
{
    return !tl->cfg.backward_in_order;
}

ZO_API int zo_tiled_linear_prefetch(zo_tiled_linear *tl, zo_tile_pass pass)
{
    if (!tl || (pass != ZO_TILE_PASS_FORWARD && pass != ZO_TILE_PASS_BACKWARD))
        return ZO_FAIL(tl ? &tl->err : NULL, -EINVAL, "zo_tiled_linear_prefetch: NULL handle or pass %d", (int)pass);
    if (pass == ZO_TILE_PASS_BACKWARD && !tl->cfg.train)
        return ZO_FAIL(&tl->err, ZO_ESTATE, "zo_tiled_linear_prefetch: backward of a layer created with train = 0");
    zo_tensor *first = pass == ZO_TILE_PASS_FORWARD || !bwd_reversed(tl) ? tl->tiles[0] : tl->rtiles[0];
    int r = zo_tile_walk_prefetch(tl->walk, first);
    return r < 0 ? zo__tile_keep(&tl->err, r) : 0;
}

ZO_API void zo_tiled_linear_drop(zo_tiled_linear *tl)
{
    if (tl)
        zo_tile_walk_drop(tl->walk);
}

ZO_API void zo_tiled_linear_get_stats(const zo_tiled_linear *tl, zo_tile_walk_stats *st)
{
    zo_tile_walk_get_stats(tl ? tl->walk : NULL, st);
}

/* ---- forward ------------------------------------------------------------------------ */
typedef struct pass {
    zo_tiled_linear *tl;
    uint64_t batch;
    const uint8_t *x, *dy;
    const float *bias;
    float *y, *dx, *db;
} pass;

/* Where tile k of the row-major walk lies in W. */
typedef struct tile_at {
    uint32_t r, c;
    uint64_t o0, i0;
    size_t rows, cols, esz;
} tile_at;

static tile_at locate(const zo_tile_grid *g, unsigned k)
{
    tile_at t = {.r = k / g->tiles_in, .c = k % g->tiles_in, .esz = zo_dtype_size(g->dtype)};
    t.o0 = (uint64_t)t.r * g->tile_out;
    t.i0 = (uint64_t)t.c * g->tile_in;
    t.rows = zo__tile_rows(g, t.r);
    t.cols = zo__tile_cols(g, t.c);
    return t;
}

static int fwd_tile(void *ctx, unsigned k, const void *tile, zo_stream *s)
{
    pass *p = ctx;
    const zo_tile_grid *g = &p->tl->grid;
    tile_at t = locate(g, k);
    float beta = 1.0f;
    if (t.c == 0) {
        if (p->bias)
            ZO_CHECK(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, p->batch, t.rows, 1, 1.0f, p->tl->ones_f32, 1,
                                   p->bias + t.o0, t.rows, ZO_DTYPE_F32, 0.0f, p->y + t.o0, g->out_features));
        else
            beta = 0.0f;
    }
    return zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_T, p->batch, t.rows, t.cols, 1.0f, p->x + t.i0 * t.esz,
                         g->in_features, tile, t.cols, g->dtype, beta, p->y + t.o0, g->out_features);
}

static int check_batch(zo_tiled_linear *tl, uint64_t batch, const char *fn)
{
    if (batch == 0 || batch > tl->grid.batch)
        return ZO_FAIL(&tl->err, -EINVAL, "%s: batch %llu outside 1..%llu (max_batch)", fn,
                       (unsigned long long)batch, (unsigned long long)tl->grid.batch);
    return 0;
}

static int walk(zo_tiled_linear *tl, zo_tile_fn fn, pass *p, int reversed, unsigned flags)
{
    int r = zo_tile_walk_run_ex(tl->walk, reversed ? tl->rtiles : tl->tiles, tl->ntiles, fn, p, flags);
    /* a sink's failure already wrote tl->err; else the walk's detail */
    if (r < 0 && !zo__tile_has_msg(&tl->err))
        zo__tile_keep(&tl->err, r);
    return r;
}

ZO_API int zo_tiled_linear_forward(zo_tiled_linear *tl, const void *x, uint64_t batch, const float *bias, float *y)
{
    if (!tl || !x || !y)
        return ZO_FAIL(tl ? &tl->err : NULL, -EINVAL, "zo_tiled_linear_forward: NULL argument");
    ZO_CHECK(check_batch(tl, batch, "zo_tiled_linear_forward"));
    zo__errbuf_set(&tl->err, "");
    pass p = {.tl = tl, .batch = batch, .x = x, .bias = bias, .y = y};
    /* a train layer's backward starts with forward's last tile (reversed
     * walk): keep it where it is when asked to */
    unsigned fl = tl->cfg.train && tl->cfg.keep_last && bwd_reversed(tl) ? ZO_TILE_RUN_KEEP_LAST : 0;
    return walk(tl, fwd_tile, &p, 0, fl);
}

/* ---- backward ----------------------------------------------------------------------- */
static int bwd_tile(void *ctx, unsigned k, const void *tile, zo_stream *s)
{
    pass *p = ctx;
    zo_tiled_linear *tl = p->tl;
    const zo_tile_grid *g = &tl->grid;
    /* k is the position in the walk (the sink pipeline's buffer parity);
     * reversed, tile n-1-k, and a dx column block starts at the last tile row */
    int rev = bwd_reversed(tl);
    tile_at t = locate(g, rev ? tl->ntiles - 1 - k : k);
    int first_row = rev ? t.r + 1 == g->tiles_out : t.r == 0;
    const uint8_t *dy = p->dy + t.o0 * t.esz;
    if (p->dx)
        ZO_CHECK(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, p->batch, t.cols, t.rows, 1.0f, dy, g->out_features, tile,
                               t.cols, g->dtype, first_row ? 0.0f : 1.0f, p->dx + t.i0, g->in_features));
    if (p->db && t.c == 0)
        ZO_CHECK(zo_gemm_async(s, ZO_GEMM_T, ZO_GEMM_N, t.rows, 1, p->batch, 1.0f, dy, g->out_features, tl->ones_t, 1,
                               g->dtype, 0.0f, p->db + t.o0, 1));
    if (!tl->cfg.dw_sink)
        return 0;
    int err;
    float *dw = zo__sinkq_buf(&tl->sq, s, k, &err);
    if (!dw)
        return err;
    ZO_CHECK(zo_gemm_async(s, ZO_GEMM_T, ZO_GEMM_N, t.rows, t.cols, p->batch, 1.0f, dy, g->out_features,
                           p->x + t.i0 * t.esz, g->in_features, g->dtype, 0.0f, dw, t.cols));
    zo_tile_grad gr = {.row = t.r, .col = t.c, .out0 = t.o0, .in0 = t.i0, .rows = (uint32_t)t.rows,
                       .cols = (uint32_t)t.cols};
    return zo__sinkq_queued(&tl->sq, s, k, &gr, &tl->err);
}

ZO_API int zo_tiled_linear_backward(zo_tiled_linear *tl, const void *x, const void *dy, uint64_t batch, float *dx,
                                    float *db)
{
    if (!tl || !x || !dy)
        return ZO_FAIL(tl ? &tl->err : NULL, -EINVAL, "zo_tiled_linear_backward: NULL x or dy");
    if (!tl->cfg.train)
        return ZO_FAIL(&tl->err, ZO_ESTATE, "zo_tiled_linear_backward: created with train = 0");
    ZO_CHECK(check_batch(tl, batch, "zo_tiled_linear_backward"));
    zo__errbuf_set(&tl->err, "");
    zo__sinkq_reset(&tl->sq);
    pass p = {.tl = tl, .batch = batch, .x = x, .dy = dy, .dx = dx, .db = db};
    int r = walk(tl, bwd_tile, &p, bwd_reversed(tl), 0);
    int r2 = zo__sinkq_flush(&tl->sq, r == 0, &tl->err);
    return r < 0 ? r : r2;
}

/* ---- ready-made sinks ---------------------------------------------------------------- */
/* The tile in host memory, or NULL with *err. On the host backend that is
 * g->dw itself (its "device memory" is host memory: no staging copy, which
 * would take a pass over every dW tile); else a malloc'd copy. *owned: the
 * caller frees it. */
static float *tile_to_host(const zo_tile_grad *g, int *err, int *owned)
{
    *owned = 0;
    *err = 0;
    if (zo_dev_get_kind(zo_stream_device(g->stream)) == ZO_DEV_HOST)
        return (float *)g->dw;
    *owned = 1;
    size_t n = (size_t)g->rows * g->cols;
    float *t = malloc(n * sizeof(float));
    if (!t) {
        *err = -ENOMEM;
        return NULL;
    }
    int r = zo_memcpy_async(g->stream, t, g->dw, n * sizeof(float), ZO_COPY_D2H);
    int r2 = zo_stream_sync(g->stream);
    *err = r < 0 ? r : r2;
    if (*err < 0) {
        free(t);
        return NULL;
    }
    return t;
}

ZO_API int zo_tile_sink_host(void *ctx, const zo_tile_grad *g)
{
    zo_tile_host_sink *hs = ctx;
    if (!hs || !g || !hs->dw)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_sink_host: NULL context or matrix");
    int r, owned;
    float *t = tile_to_host(g, &r, &owned);
    if (!t)
        return r;
    for (uint32_t i = 0; i < g->rows; i++) {
        float *dst = hs->dw + (g->out0 + i) * hs->ld + g->in0;
        const float *src = t + (size_t)i * g->cols;
        if (hs->accumulate)
            for (uint32_t j = 0; j < g->cols; j++)
                dst[j] += src[j];
        else
            memcpy(dst, src, g->cols * sizeof(float));
    }
    if (owned)
        free(t);
    return 0;
}

ZO_API int zo_tile_sink_store(void *ctx, const zo_tile_grad *g)
{
    zo_tile_store_sink *ss = ctx;
    if (!ss || !g || !ss->store || !ss->grads || g->col >= ss->tiles_in)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_sink_store: NULL context, store or tensors, or column %u outside "
                       "tiles_in", g ? g->col : 0);
    zo_tensor *t = ss->grads[(size_t)g->row * ss->tiles_in + g->col];
    zo_tensor_info ti;
    size_t bytes = (size_t)g->rows * g->cols * sizeof(float);
    if (!t || zo_store_tensor_info(ss->store, t, &ti) < 0 || ti.bytes != bytes)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_sink_store: tensor of tile (%u, %u) missing or not %zu bytes", g->row,
                       g->col, bytes);
    int r, owned;
    float *h = tile_to_host(g, &r, &owned);
    if (!h)
        return r;
    r = zo_store_write(ss->store, t, 0, h, bytes);
    if (owned)
        free(h);
    return r;
}
