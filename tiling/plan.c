/* SPDX-License-Identifier: Apache-2.0 */
/* The tile planner and the tile bookkeeping shared by the operators:
 * registering a grid of tiles in the store and moving a whole weight
 * matrix in and out of it.
 *
 * Cost model (device bytes the tiled linear allocates, = work_bytes):
 *   staging  2 * tile_out * tile_in * esz     (the walker's double buffer;
 *                                               0 with ZO_TILE_RESIDENT or
 *                                               ZO_TILE_IN_PLACE)
 *   dW       2 * tile_out * tile_in * 4       (ZO_TILE_TRAIN: double-buffered
 *                                               f32 gradient tiles)
 *   ones     batch * 4 (+ batch * esz with ZO_TILE_TRAIN)
 *                                              (bias broadcast and db as GEMMs)
 * The planner solves it for the largest tile that fits. */
#define ZO_MODULE "tiling"
#include "tiling/tiling_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define KNOWN_FLAGS (ZO_TILE_TRAIN | ZO_TILE_RESIDENT | ZO_TILE_IN_PLACE)

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t per_elem(zo_dtype t, unsigned flags)
{
    uint64_t esz = zo_dtype_size(t);
    return ((flags & (ZO_TILE_RESIDENT | ZO_TILE_IN_PLACE)) ? 0 : 2 * esz) + ((flags & ZO_TILE_TRAIN) ? 2 * sizeof(float) : 0);
}

static uint64_t fixed_bytes(uint64_t batch, zo_dtype t, unsigned flags)
{
    return sat_mul(batch, sizeof(float) + ((flags & ZO_TILE_TRAIN) ? zo_dtype_size(t) : 0));
}

uint64_t zo__tile_linear_work(const zo_tile_grid *g)
{
    uint64_t elems = sat_mul(g->tile_out, g->tile_in);
    return sat_add(sat_mul(elems, per_elem(g->dtype, g->flags)), fixed_bytes(g->batch, g->dtype, g->flags));
}

static int check_args(uint64_t batch, uint64_t out, uint64_t in, zo_dtype dtype, unsigned flags, zo_tile_grid *grid,
                      const char *fn)
{
    if (!grid)
        return ZO_FAIL(NULL, -EINVAL, "%s: grid is NULL", fn);
    if (batch == 0 || out == 0 || in == 0 || batch > INT_MAX || out > INT_MAX || in > INT_MAX)
        return ZO_FAIL(NULL, -EINVAL, "%s: batch %llu, out %llu, in %llu: each must be in 1..INT_MAX", fn,
                       (unsigned long long)batch, (unsigned long long)out, (unsigned long long)in);
    if (flags & ~KNOWN_FLAGS)
        return ZO_FAIL(NULL, -EINVAL, "%s: unknown flags 0x%x", fn, flags);
    if (dtype != ZO_DTYPE_F32 && dtype != ZO_DTYPE_BF16)
        return ZO_FAIL(NULL, ZO_ENOTSUP, "%s: dtype %s not supported (f32, bf16)", fn, zo_dtype_name(dtype));
    return 0;
}

static void finish(zo_tile_grid *g)
{
    g->tiles_out = (uint32_t)((g->out_features + g->tile_out - 1) / g->tile_out);
    g->tiles_in = (uint32_t)((g->in_features + g->tile_in - 1) / g->tile_in);
    g->tile_bytes = (uint64_t)g->tile_out * g->tile_in * zo_dtype_size(g->dtype);
    g->work_bytes = zo__tile_linear_work(g);
}

ZO_API int zo_tile_grid_make(uint64_t batch, uint64_t out, uint64_t in, zo_dtype dtype, uint32_t tile_out,
                             uint32_t tile_in, unsigned flags, zo_tile_grid *grid)
{
    ZO_CHECK(check_args(batch, out, in, dtype, flags, grid, "zo_tile_grid_make"));
    if (tile_out == 0 || tile_in == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_tile_grid_make: tile %u x %u has a zero dimension", tile_out, tile_in);
    memset(grid, 0, sizeof(*grid));
    *grid = (zo_tile_grid){.batch = batch, .out_features = out, .in_features = in, .dtype = dtype, .flags = flags,
                           .tile_out = (uint32_t)ZO_MIN((uint64_t)tile_out, out),
                           .tile_in = (uint32_t)ZO_MIN((uint64_t)tile_in, in)};
    finish(grid);
    return 0;
}

/* The fewest equal parts of n no larger than cap, and their size. */
static uint64_t balance(uint64_t n, uint64_t cap)
{
    uint64_t parts = (n + cap - 1) / cap;
    return (n + parts - 1) / parts;
}

ZO_API int zo_tile_plan(uint64_t batch, uint64_t out, uint64_t in, zo_dtype dtype, uint64_t budget, unsigned flags,
                        zo_tile_grid *grid)
{
    ZO_CHECK(check_args(batch, out, in, dtype, flags, grid, "zo_tile_plan"));
    memset(grid, 0, sizeof(*grid));
    *grid = (zo_tile_grid){.batch = batch, .out_features = out, .in_features = in, .dtype = dtype, .flags = flags};
    uint64_t pe = per_elem(dtype, flags), fixed = fixed_bytes(batch, dtype, flags);
    uint64_t min_cols = ZO_MIN(in, (uint64_t)ZO_TILE_MIN_COLS);
    uint64_t need = sat_add(fixed, sat_mul(pe, min_cols));
    if (budget < need)
        return ZO_FAIL(NULL, ZO_EBUDGET,
                       "zo_tile_plan: budget %llu bytes is below the smallest plan, %llu bytes (ones vectors %llu + "
                       "a tile of one row of %llu columns at %llu bytes per element)",
                       (unsigned long long)budget, (unsigned long long)need, (unsigned long long)fixed,
                       (unsigned long long)min_cols, (unsigned long long)pe);
    /* elements per tile the budget allows (no per-element cost: weights
     * resident and no backward, the whole matrix is one tile) */
    uint64_t cap = pe ? (budget - fixed) / pe : UINT64_MAX;
    if (cap >= in) {
        /* whole rows: contiguous tiles, y blocks written once */
        grid->tile_in = (uint32_t)in;
        grid->tile_out = (uint32_t)balance(out, ZO_MIN(out, cap / in));
    } else {
        /* a row does not fit: cut rows too, one row per tile (a taller
         * tile would have to be narrower by as much) */
        grid->tile_in = (uint32_t)balance(in, cap);
        grid->tile_out = 1;
    }
    finish(grid);
    return 0;
}

int zo__tile_cap(zo_tile_grid *g, uint64_t max_bytes)
{
    uint64_t esz = zo_dtype_size(g->dtype), cap = max_bytes / esz;
    if (g->tile_bytes <= max_bytes)
        return 0;
    if (cap < ZO_MIN(g->in_features, (uint64_t)ZO_TILE_MIN_COLS))
        return -EINVAL;
    if (cap >= g->in_features) {
        g->tile_in = (uint32_t)g->in_features;
        g->tile_out = (uint32_t)balance(g->out_features, ZO_MIN(g->tile_out, cap / g->in_features));
    } else {
        g->tile_in = (uint32_t)balance(g->in_features, ZO_MIN(g->tile_in, cap));
        g->tile_out = 1;
    }
    finish(g);
    return 0;
}

/* ---- tiles in the store ---------------------------------------------------------- */
int zo__tile_in_place_home(zo_store *st, zo_dev *dev, zo_tier home, int copy_tiles, uint64_t *slot)
{
    *slot = 0;
    if (home == ZO_TIER_DEVICE || !zo__tile_in_place_ok(dev, !copy_tiles))
        return 0;
    if (home != ZO_TIER_NVME)
        return 1;
    zo_store_stats ss;
    zo_store_get_stats(st, &ss);
    *slot = ss.pool_slots >= ZO_TILE_IN_PLACE_SLOTS ? ss.pool_slot_size : 0;
    return *slot > 0;
}

zo_tensor **zo__tile_reversed(zo_tensor *const *tiles, unsigned n)
{
    zo_tensor **r = malloc((n ? n : 1) * sizeof(*r));
    for (unsigned k = 0; r && k < n; k++)
        r[k] = tiles[n - 1 - k];
    return r;
}

int zo__tile_name_home(const char **name, char *copy, zo_tier home, zo_errbuf *eb, const char *fn)
{
    /* room for ".w.<r>.<c>" with two 32-bit numbers */
    if (!*name || !**name || strlen(*name) > ZO_TENSOR_NAME_MAX - 24)
        return ZO_FAIL(eb, -EINVAL, "%s: name empty or longer than %d bytes", fn, ZO_TENSOR_NAME_MAX - 24);
    snprintf(copy, ZO_TENSOR_NAME_MAX + 1, "%s", *name);
    *name = copy;
    if ((unsigned)home >= ZO_TIER_COUNT)
        return ZO_FAIL(eb, -EINVAL, "%s: unknown home tier %d", fn, (int)home);
    return 0;
}

int zo__tile_register(zo_store *st, const char *prefix, const zo_tile_grid *g, zo_tier home, int one_dim,
                      zo_tensor ***out, zo_errbuf *eb)
{
    uint64_t n64 = (uint64_t)g->tiles_out * g->tiles_in;
    if (n64 > UINT_MAX / 2)
        return ZO_FAIL(eb, -EINVAL, "%s: %llu tiles are too many", prefix, (unsigned long long)n64);
    unsigned n = (unsigned)n64;
    zo_tensor **t = calloc(n, sizeof(*t));
    if (!t)
        return -ENOMEM;
    int r = 0;
    for (uint32_t i = 0; i < g->tiles_out; i++) {
        for (uint32_t j = 0; j < g->tiles_in; j++) {
            char name[ZO_TENSOR_NAME_MAX + 2];
            int len = one_dim ? snprintf(name, sizeof(name), "%s.%u", prefix, i)
                              : snprintf(name, sizeof(name), "%s.%u.%u", prefix, i, j);
            if (len < 0 || len > ZO_TENSOR_NAME_MAX) {
                r = ZO_FAIL(eb, -EINVAL, "tile name '%s...' longer than %d bytes", prefix, ZO_TENSOR_NAME_MAX);
                goto fail;
            }
            zo_tensor_desc d;
            zo_tensor_desc_default(&d);
            d.name = name;
            d.dtype = g->dtype;
            d.ndim = 2;
            d.shape[0] = zo__tile_rows(g, i);
            d.shape[1] = zo__tile_cols(g, j);
            d.home = home;
            r = zo_store_register(st, &d, &t[(size_t)i * g->tiles_in + j]);
            if (r < 0) {
                ZO_FAIL(eb, r, "registering tile '%s' (%s home): %s", name, zo_tier_name(home), zo_store_errmsg(st));
                goto fail;
            }
        }
    }
    *out = t;
    return 0;
fail:
    zo__tile_unregister(st, &t, n);
    return r;
}

int zo__tile_setup(zo_store *st, zo_dev *dev, const char *name, const char *kind, const zo_tile_grid *g,
                   zo_tier home, int one_dim, zo_tensor ***tiles, zo_tensor ***rtiles, zo_tile_walk **walk,
                   zo_errbuf *eb)
{
    char prefix[ZO_TENSOR_NAME_MAX + 1];
    snprintf(prefix, sizeof(prefix), "%s.%s", name, kind);
    int r = zo__tile_register(st, prefix, g, home, one_dim, tiles, eb);
    if (r < 0)
        return r;
    if (!(*rtiles = zo__tile_reversed(*tiles, (unsigned)((uint64_t)g->tiles_out * g->tiles_in))))
        return -ENOMEM;
    int in_place = (g->flags & ZO_TILE_IN_PLACE) != 0;
    r = zo_tile_walk_create_ex(walk, st, dev, (g->flags & (ZO_TILE_RESIDENT | ZO_TILE_IN_PLACE)) ? 0 : g->tile_bytes,
                               in_place ? ZO_TILE_WALK_IN_PLACE : 0);
    return r < 0 ? zo__tile_keep(eb, r) : 0;
}

void zo__tile_unregister(zo_store *st, zo_tensor ***tiles, unsigned n)
{
    if (!*tiles)
        return;
    for (unsigned k = 0; k < n; k++) {
        if ((*tiles)[k]) {
            int r = zo_store_unregister(st, &(*tiles)[k]);
            if (r < 0)
                ZO_LOGW("unregistering a tile: %s (%s)", zo_strerror(r), zo_store_errmsg(st));
        }
    }
    free(*tiles);
    *tiles = NULL;
}

int zo__tile_weight_io(zo_store *st, zo_tensor **tiles, const zo_tile_grid *g, void *w, uint64_t ld, int write,
                       zo_errbuf *eb)
{
    if (!w || ld < g->in_features)
        return ZO_FAIL(eb, -EINVAL, "weight %s: NULL matrix or row stride %llu below %llu", write ? "write" : "read",
                       (unsigned long long)ld, (unsigned long long)g->in_features);
    size_t esz = zo_dtype_size(g->dtype);
    uint8_t *stage = malloc((size_t)g->tile_bytes);
    if (!stage)
        return -ENOMEM;
    int r = 0;
    for (uint32_t i = 0; i < g->tiles_out && r == 0; i++) {
        for (uint32_t j = 0; j < g->tiles_in && r == 0; j++) {
            uint32_t rows = zo__tile_rows(g, i), cols = zo__tile_cols(g, j);
            uint8_t *base = (uint8_t *)w + ((uint64_t)i * g->tile_out * ld + (uint64_t)j * g->tile_in) * esz;
            size_t bytes = (size_t)rows * cols * esz;
            zo_tensor *t = tiles[(size_t)i * g->tiles_in + j];
            if (write) {
                for (uint32_t q = 0; q < rows; q++)
                    memcpy(stage + (size_t)q * cols * esz, base + (uint64_t)q * ld * esz, (size_t)cols * esz);
                r = zo_store_write(st, t, 0, stage, bytes);
            } else {
                r = zo_store_read(st, t, 0, stage, bytes);
                if (r == 0)
                    for (uint32_t q = 0; q < rows; q++)
                        memcpy(base + (uint64_t)q * ld * esz, stage + (size_t)q * cols * esz, (size_t)cols * esz);
            }
            if (r < 0)
                ZO_FAIL(eb, r, "weight %s of tile (%u, %u): %s", write ? "write" : "read", i, j, zo_store_errmsg(st));
        }
    }
    free(stage);
    return r;
}
