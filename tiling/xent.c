/* SPDX-License-Identifier: Apache-2.0 */
/* A vocabulary-tiled output projection with a streaming softmax
 * cross-entropy, on the same walker as the tiled linear: the proof that the
 * mechanism is not Linear-only.
 *
 * E [vocab, hidden] is cut into tiles of whole rows. Forward, per tile k:
 * logits_k = h E_k^T (GEMM into one of two device logits tiles), copied to
 * the host, where the online softmax folds it into each row's running max
 * m and sum s of exp(z - m) (and picks the label's logit when it falls in
 * the tile), while tile k+1's GEMM runs. Only two logits tiles exist at a
 * time; the loss is mean(m + log s - z_label).
 *
 * Backward needs the final normalizer of every row, so it walks the tiles a
 * second time: logits_k again, dlogits_k = (softmax - onehot) / batch on the
 * host (in the weight dtype: the GEMMs take both operands in one type),
 * back to the device, dh (+)= dlogits_k E_k and dE_k = dlogits_k^T h, handed
 * to the sink. That per-tile round trip is synchronous; the walker still
 * reads the next tiles from NVMe meanwhile. The second walk goes from the
 * last tile to the first, starting with the tile the first walk ended with
 * (kept, not read again), as the tiled linear's backward does.
 *
 * On the host backend tiles already in host memory are read in place (the
 * pinned home; an NVMe tile's pool slot when a tile fits one), unless
 * copy_tiles asks for the copy a GPU makes.
 *
 * Working memory per vocabulary row of a tile:
 *   2 * hidden * esz (staging; 0 in place or with a device home)
 *   + 2 * batch * 4 (logits) + batch * esz (dlogits) + 2 * hidden * 4 (dE). */
#define ZO_MODULE "tiling"
#include "tiling/tiling_internal.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/mem.h>
#include <zoffload/vec.h>

struct zo_tiled_xent {
    zo_store *store;
    zo_dev *dev;
    zo_tiled_xent_config cfg;
    char name[ZO_TENSOR_NAME_MAX + 1];
    zo_tile_grid grid;
    zo_tensor **tiles;
    zo_tensor **rtiles;  /* reversed: the second walk starts where the first ended */
    unsigned ntiles;
    zo_tile_walk *walk;
    float *logits[2];    /* device, batch x tile rows */
    void *dlogits;       /* device, batch x tile rows, dtype */
    zo_event *logits_ready[2];
    zo__sinkq sq;
    int sq_init;
    /* host: two logits tiles and a dlogits tile in one pinned block */
    void *hbuf;
    float *hlogits[2];
    uint8_t *hdlogits;
    double *m, *s, *zlab;
    zo_errbuf err;
};

/* resident (device home) or in place (host backend): no staging buffers */
static uint64_t per_row(uint64_t batch, uint64_t hidden, zo_dtype t, int no_staging)
{
    uint64_t esz = zo_dtype_size(t);
    return (no_staging ? 0 : 2 * hidden * esz) + 2 * batch * sizeof(float) + batch * esz + 2 * hidden * sizeof(float);
}

ZO_API void zo_tiled_xent_config_default(zo_tiled_xent_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->name = "xent";
    cfg->dtype = ZO_DTYPE_F32;
    cfg->home = ZO_TIER_NVME;
}

ZO_API int zo_tile_plan_vocab(uint64_t batch, uint64_t vocab, uint64_t hidden, zo_dtype dtype, uint64_t budget,
                              uint32_t tile_vocab, unsigned flags, zo_tile_grid *grid)
{
    if (!grid)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_plan_vocab: grid is NULL");
    if (flags & ~(ZO_TILE_RESIDENT | ZO_TILE_IN_PLACE))
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_plan_vocab: unknown flags 0x%x", flags);
    if (batch == 0 || batch > INT_MAX || hidden == 0 || hidden > INT_MAX || vocab == 0 || vocab > INT_MAX)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_plan_vocab: batch %llu, vocab %llu, hidden %llu: each must be in "
                       "1..INT_MAX", (unsigned long long)batch, (unsigned long long)vocab,
                       (unsigned long long)hidden);
    if (dtype != ZO_DTYPE_F32 && dtype != ZO_DTYPE_BF16)
        return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_tile_plan_vocab: dtype %s not supported (f32, bf16)",
                       zo_dtype_name(dtype));
    uint64_t pr = per_row(batch, hidden, dtype, flags & (ZO_TILE_RESIDENT | ZO_TILE_IN_PLACE));
    if (budget) {
        if (budget < pr)
            return ZO_FAIL(NULL, ZO_EBUDGET, "zo_tile_plan_vocab: budget %llu bytes is below one vocabulary row, "
                           "%llu bytes", (unsigned long long)budget, (unsigned long long)pr);
        /* as many rows as fit, balanced over the fewest tiles */
        uint64_t rows = ZO_MIN(budget / pr, vocab);
        uint64_t parts = (vocab + rows - 1) / rows;
        tile_vocab = (uint32_t)((vocab + parts - 1) / parts);
    }
    ZO_CHECK(zo_tile_grid_make(batch, vocab, hidden, dtype, tile_vocab, (uint32_t)hidden, flags | ZO_TILE_TRAIN,
                               grid));
    grid->work_bytes = (uint64_t)grid->tile_out * pr;
    return 0;
}

/* The grid for the config with plan flags `flags`. With ZO_TILE_IN_PLACE
 * and an NVMe home (slot > 0) a tile must fit one pool slot to be read in
 * place: a budget-planned grid is cut to balanced tiles of at most a slot
 * (fewer rows: still within the budget); a given tile_vocab larger than a
 * slot, or a row larger than a slot, returns 1 (plan again without in
 * place: copied), as the tiled linear does. */
static int plan(zo_tiled_xent *x, unsigned flags, uint64_t slot)
{
    zo_tiled_xent_config *c = &x->cfg;
    int r = zo_tile_plan_vocab(c->max_batch, c->vocab, c->hidden, c->dtype, c->budget, c->tile_vocab, flags,
                               &x->grid);
    if (r < 0)
        return zo__tile_keep(&x->err, r);
    if (!slot || x->grid.tile_bytes <= slot)
        return 0;
    uint64_t row = c->hidden * zo_dtype_size(c->dtype), rows = slot / row;
    if (!c->budget || rows == 0)
        return 1;
    uint64_t parts = (c->vocab + rows - 1) / rows;
    r = zo_tile_plan_vocab(c->max_batch, c->vocab, c->hidden, c->dtype, 0, (uint32_t)((c->vocab + parts - 1) / parts),
                           flags, &x->grid);
    return r < 0 ? zo__tile_keep(&x->err, r) : 0;
}

ZO_API int zo_tiled_xent_create(zo_tiled_xent **out, zo_store *store, zo_dev *dev, const zo_tiled_xent_config *cfg)
{
    if (!out || !store || !dev || !cfg)
        return ZO_FAIL(NULL, -EINVAL, "zo_tiled_xent_create: NULL argument");
    *out = NULL;
    zo_tiled_xent *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    zo_tiled_xent_config_default(&x->cfg);
    /* the first published version ended before copy_tiles (defaults to 0: in place) */
    int r = ZO_STRUCT_IN(&x->cfg, cfg, offsetof(zo_tiled_xent_config, copy_tiles), &x->err, "zo_tiled_xent_create");
    if (r < 0) {
        free(x);
        return r;
    }
    zo_tiled_xent_config *c = &x->cfg;
    x->store = store;
    x->dev = dev;
    ZO_CHECK_GOTO(zo__tile_name_home(&c->name, x->name, c->home, &x->err, "zo_tiled_xent_create"), r, fail);
    /* the host backend reads tiles in host memory in place, as the tiled
     * linear does (see zo_tiled_linear_config.copy_tiles) */
    unsigned flags = c->home == ZO_TIER_DEVICE ? ZO_TILE_RESIDENT : 0;
    uint64_t slot;
    int in_place = zo__tile_in_place_home(store, dev, c->home, c->copy_tiles, &slot);
    r = plan(x, in_place ? flags | ZO_TILE_IN_PLACE : flags, slot);
    if (r == 1) /* NVMe tiles larger than a pool slot: copied */
        r = plan(x, flags, 0);
    if (r < 0)
        goto fail;
    zo_tile_grid *g = &x->grid;
    x->ntiles = g->tiles_out;
    ZO_CHECK_GOTO(zo__tile_setup(store, dev, x->name, "e", g, c->home, 1, &x->tiles, &x->rtiles, &x->walk, &x->err),
                  r, fail);
    size_t esz = zo_dtype_size(c->dtype), tile_elems = (size_t)g->batch * g->tile_out;
    for (int i = 0; i < 2; i++) {
        r = zo_dev_malloc(dev, (void **)&x->logits[i], tile_elems * sizeof(float));
        if (r < 0) {
            ZO_FAIL(&x->err, r, "zo_tiled_xent_create: logits tile: %s", zo_dev_errmsg(dev));
            goto fail;
        }
        ZO_CHECK_GOTO(zo_event_create(dev, &x->logits_ready[i]), r, fail);
    }
    /* the host side of the round trips: pinned and registered with the
     * device, so the copies are truly asynchronous (zo_pinned_alloc falls
     * back to pageable memory, and says so, where locking is refused) */
    zo_pin_opts po;
    zo_pin_opts_default(&po);
    po.flags = 0;
    po.dev = dev;
    r = zo_pinned_alloc(&x->hbuf, tile_elems * (2 * sizeof(float) + esz), &po);
    if (r < 0) {
        ZO_FAIL(&x->err, r, "zo_tiled_xent_create: host logits buffers: %s", zo_strerror(r));
        goto fail;
    }
    x->hlogits[0] = x->hbuf;
    x->hlogits[1] = x->hlogits[0] + tile_elems;
    x->hdlogits = (uint8_t *)(x->hlogits[1] + tile_elems);
    r = zo_dev_malloc(dev, &x->dlogits, tile_elems * esz);
    if (r < 0) {
        ZO_FAIL(&x->err, r, "zo_tiled_xent_create: dlogits tile: %s", zo_dev_errmsg(dev));
        goto fail;
    }
    x->sq_init = 1;
    ZO_CHECK_GOTO(zo__sinkq_init(&x->sq, dev, (uint64_t)g->tile_out * g->in_features * sizeof(float), c->de_sink,
                                 c->de_sink_ctx, &x->err),
                  r, fail);
    x->m = calloc(g->batch, sizeof(double));
    x->s = calloc(g->batch, sizeof(double));
    x->zlab = calloc(g->batch, sizeof(double));
    if (!x->m || !x->s || !x->zlab) {
        r = -ENOMEM;
        goto fail;
    }
    *out = x;
    return 0;
fail:
    zo_tiled_xent_destroy(&x);
    return r;
}

ZO_API void zo_tiled_xent_destroy(zo_tiled_xent **xp)
{
    if (!xp || !*xp)
        return;
    zo_tiled_xent *x = *xp;
    zo_tile_walk_destroy(&x->walk);
    if (x->sq_init)
        zo__sinkq_fini(&x->sq);
    for (int i = 0; i < 2; i++) {
        if (x->logits[i])
            zo_dev_free(x->dev, x->logits[i]);
        zo_event_destroy(&x->logits_ready[i]);
    }
    zo_pinned_free(x->hbuf);
    if (x->dlogits)
        zo_dev_free(x->dev, x->dlogits);
    free(x->m);
    free(x->s);
    free(x->zlab);
    free(x->rtiles);
    zo__tile_unregister(x->store, &x->tiles, x->ntiles);
    free(x);
    *xp = NULL;
}

ZO_API int zo_tiled_xent_grid(const zo_tiled_xent *x, zo_tile_grid *grid)
{
    if (!x || !grid)
        return -EINVAL;
    *grid = x->grid;
    return 0;
}

ZO_API const char *zo_tiled_xent_errmsg(const zo_tiled_xent *x)
{
    static _Thread_local char copy[ZO_ERRMSG_LEN];
    return zo__errbuf_tls(x ? &x->err : NULL, copy);
}

ZO_API int zo_tiled_xent_set_weight(zo_tiled_xent *x, const void *e, uint64_t ld)
{
    if (!x)
        return ZO_FAIL(NULL, -EINVAL, "zo_tiled_xent_set_weight: NULL handle");
    zo_tile_walk_drop(x->walk); /* nothing is held between runs; for certain */
    return zo__tile_weight_io(x->store, x->tiles, &x->grid, (void *)e, ld, 1, &x->err);
}

ZO_API void zo_tiled_xent_get_stats(const zo_tiled_xent *x, zo_tile_walk_stats *st)
{
    zo_tile_walk_get_stats(x ? x->walk : NULL, st);
}

/* ---- the passes ------------------------------------------------------------------------ */
typedef struct xpass {
    zo_tiled_xent *x;
    const uint8_t *h;
    uint64_t batch;
    const int32_t *labels;
    float *dh;
    int pending; /* forward: tile index + 1 whose logits wait to be folded */
} xpass;

/* logits of tile k into logits[k & 1] and its host copy; logits_ready marks both. */
static int queue_logits(xpass *p, unsigned k, const void *tile, zo_stream *s, uint32_t rows)
{
    zo_tiled_xent *x = p->x;
    int i = (int)(k & 1);
    ZO_CHECK(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_T, p->batch, rows, x->grid.in_features, 1.0f, p->h,
                           x->grid.in_features, tile, x->grid.in_features, x->grid.dtype, 0.0f, x->logits[i], rows));
    ZO_CHECK(zo_memcpy_async(s, x->hlogits[i], x->logits[i], (size_t)p->batch * rows * sizeof(float), ZO_COPY_D2H));
    return zo_event_record(x->logits_ready[i], s);
}

/* The online softmax: fold tile k's logits into (m, s) and the label's logit. */
static int fold(xpass *p, unsigned k)
{
    zo_tiled_xent *x = p->x;
    int i = (int)(k & 1);
    ZO_CHECK(zo_event_sync(x->logits_ready[i]));
    uint32_t rows = zo__tile_rows(&x->grid, k);
    uint64_t v0 = (uint64_t)k * x->grid.tile_out;
    for (uint64_t b = 0; b < p->batch; b++) {
        const float *z = x->hlogits[i] + b * rows;
        double mx = -INFINITY;
        for (uint32_t j = 0; j < rows; j++)
            mx = z[j] > mx ? z[j] : mx;
        double m = x->m[b] > mx ? x->m[b] : mx, sum = 0;
        for (uint32_t j = 0; j < rows; j++)
            sum += exp((double)z[j] - m);
        x->s[b] = x->s[b] * exp(x->m[b] - m) + sum;
        x->m[b] = m;
        uint64_t lab = (uint64_t)p->labels[b];
        if (lab >= v0 && lab < v0 + rows)
            x->zlab[b] = z[lab - v0];
    }
    return 0;
}

static int fwd_tile(void *ctx, unsigned k, const void *tile, zo_stream *s)
{
    xpass *p = ctx;
    ZO_CHECK(queue_logits(p, k, tile, s, zo__tile_rows(&p->x->grid, k)));
    if (p->pending)
        ZO_CHECK(fold(p, (unsigned)p->pending - 1));
    p->pending = (int)k + 1;
    return 0;
}

static int bwd_tile(void *ctx, unsigned k, const void *tile, zo_stream *s)
{
    xpass *p = ctx;
    zo_tiled_xent *x = p->x;
    const zo_tile_grid *g = &x->grid;
    /* the second walk goes last tile to first: k is the position in the
     * walk (buffer parity, the first dh term), v the vocabulary tile */
    unsigned v = x->ntiles - 1 - k;
    uint32_t rows = zo__tile_rows(g, v);
    uint64_t v0 = (uint64_t)v * g->tile_out;
    int i = (int)(k & 1);
    ZO_CHECK(queue_logits(p, k, tile, s, rows));
    ZO_CHECK(zo_event_sync(x->logits_ready[i]));
    /* dlogits = (softmax - onehot) / batch, with the final normalizers */
    size_t esz = zo_dtype_size(g->dtype);
    float *row = malloc(rows * sizeof(float));
    if (!row)
        return -ENOMEM;
    double inv_b = 1.0 / (double)p->batch;
    for (uint64_t b = 0; b < p->batch; b++) {
        const float *z = x->hlogits[i] + b * rows;
        double lse = x->m[b] + log(x->s[b]);
        for (uint32_t j = 0; j < rows; j++)
            row[j] = (float)((exp((double)z[j] - lse) - ((uint64_t)p->labels[b] == v0 + j ? 1.0 : 0.0)) * inv_b);
        zo_vec_cast(x->hdlogits + b * rows * esz, g->dtype, row, ZO_DTYPE_F32, rows);
    }
    free(row);
    /* the host buffer is rewritten only after the next tile's sync, by
     * which time this copy (queued before it on s) is done */
    ZO_CHECK(zo_memcpy_async(s, x->dlogits, x->hdlogits, (size_t)p->batch * rows * esz, ZO_COPY_H2D));
    if (p->dh)
        ZO_CHECK(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, p->batch, g->in_features, rows, 1.0f, x->dlogits, rows, tile,
                               g->in_features, g->dtype, k == 0 ? 0.0f : 1.0f, p->dh, g->in_features));
    if (!x->cfg.de_sink)
        return 0;
    int err;
    float *de = zo__sinkq_buf(&x->sq, s, k, &err);
    if (!de)
        return err;
    ZO_CHECK(zo_gemm_async(s, ZO_GEMM_T, ZO_GEMM_N, rows, g->in_features, p->batch, 1.0f, x->dlogits, rows, p->h,
                           g->in_features, g->dtype, 0.0f, de, g->in_features));
    zo_tile_grad gr = {.row = v, .out0 = v0, .rows = rows, .cols = (uint32_t)g->in_features};
    return zo__sinkq_queued(&x->sq, s, k, &gr, &x->err);
}

ZO_API int zo_tiled_xent_run(zo_tiled_xent *x, const void *h, uint64_t batch, const int32_t *labels, double *loss,
                             float *dh)
{
    if (!x || !h || !labels || !loss)
        return ZO_FAIL(x ? &x->err : NULL, -EINVAL, "zo_tiled_xent_run: NULL argument");
    if (batch == 0 || batch > x->grid.batch)
        return ZO_FAIL(&x->err, -EINVAL, "zo_tiled_xent_run: batch %llu outside 1..%llu (max_batch)",
                       (unsigned long long)batch, (unsigned long long)x->grid.batch);
    for (uint64_t b = 0; b < batch; b++)
        if (labels[b] < 0 || (uint64_t)labels[b] >= x->grid.out_features)
            return ZO_FAIL(&x->err, -EINVAL, "zo_tiled_xent_run: label %d of row %llu outside 0..%llu", labels[b],
                           (unsigned long long)b, (unsigned long long)x->grid.out_features - 1);
    zo__errbuf_set(&x->err, "");
    for (uint64_t b = 0; b < batch; b++) {
        x->m[b] = -INFINITY;
        x->s[b] = 0;
        x->zlab[b] = 0;
    }
    xpass p = {.x = x, .h = h, .batch = batch, .labels = labels, .dh = dh};
    int grads = dh || x->cfg.de_sink;
    /* with a second walk, the first keeps its last tile for it (released
     * at the second walk's start otherwise: see below) */
    int r = zo_tile_walk_run_ex(x->walk, x->tiles, x->ntiles, fwd_tile, &p, grads ? ZO_TILE_RUN_KEEP_LAST : 0);
    if (r == 0 && p.pending)
        r = fold(&p, (unsigned)p.pending - 1);
    if (r < 0) {
        zo_tile_walk_drop(x->walk);
        if (!zo__tile_has_msg(&x->err))
            zo__tile_keep(&x->err, r);
        return r;
    }
    double sum = 0;
    for (uint64_t b = 0; b < batch; b++)
        sum += x->m[b] + log(x->s[b]) - x->zlab[b];
    *loss = sum / (double)batch;
    if (!grads)
        return 0;
    zo__sinkq_reset(&x->sq);
    r = zo_tile_walk_run(x->walk, x->rtiles, x->ntiles, bwd_tile, &p);
    int r2 = zo__sinkq_flush(&x->sq, r == 0, &x->err);
    if (r < 0 && !zo__tile_has_msg(&x->err))
        zo__tile_keep(&x->err, r);
    return r < 0 ? r : r2;
}
