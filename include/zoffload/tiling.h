/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file tiling.h
 * @brief Memory-centric tiling of operators too large for device memory:
 *        weights kept in the tiered store as a grid of tiles, streamed
 *        through two device buffers (tile k+1 is fetched while tile k
 *        computes), within a device working-memory budget that is enforced.
 *
 * Three layers, each usable alone:
 *  - the planner, zo_tile_plan(): shapes + budget -> tile grid and the exact
 *    device bytes the tiled operator will allocate (for zo-plan and
 *    framework integration: it needs no device and no store);
 *  - the walker, zo_tile_walk: the generic mechanism. It streams any list
 *    of store tensors through its double buffer and calls a function per
 *    tile that queues work on the compute stream (zo_tiled_xent and
 *    zo_tiled_linear are both built on it);
 *  - operators: zo_tiled_linear (y = x W^T + b, forward and backward, dW
 *    handed tile by tile to a sink) and zo_tiled_xent (an output projection
 *    over a huge vocabulary with a streaming softmax cross-entropy: the
 *    full logits never exist).
 *
 * Device memory: every buffer an operator needs is allocated once at create
 * (zo_dev_malloc) and is exactly zo_tile_grid.work_bytes; nothing is
 * allocated per call, so the budget bounds the peak. The caller's tensors
 * (x, y, dy, dx, bias) are the caller's and not counted. The weight tiles'
 * home copies live in the store (a device home uses the store's device
 * tier, not the budget).
 *
 * Calls that run an operator block until its results are complete, and
 * read inputs the caller has finished writing (synchronize your streams
 * first). They use the operator's own streams. An operator handle is used
 * by one thread at a time.
 */
#ifndef ZOFFLOAD_TILING_H
#define ZOFFLOAD_TILING_H

#include "common.h"
#include "dev.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- planning ------------------------------------------------------------------- */
/** Plan flags. */
#define ZO_TILE_TRAIN (1u << 0)    /**< room for backward: two f32 dW tile buffers and a ones vector in dtype */
#define ZO_TILE_RESIDENT (1u << 1) /**< weight tiles homed on the device: no staging buffers */
/** Weight tiles read in place from host memory (the host backend's in-place
 *  fetch, see zo_tile_walk_create_ex()): no staging buffers, like RESIDENT. */
#define ZO_TILE_IN_PLACE (1u << 2)

/** Smallest tile the planner accepts: one weight row of min(in, this) columns. */
#define ZO_TILE_MIN_COLS 64u

/** A tile grid over W [out, in] and what it costs. Tiles are row-major
 *  [tile_out, tile_in] blocks; the last row/column of tiles may be smaller. */
typedef struct zo_tile_grid {
    uint64_t batch;        /**< rows of x planned for */
    uint64_t out_features; /**< rows of W */
    uint64_t in_features;  /**< columns of W */
    zo_dtype dtype;        /**< weight (and activation) type */
    unsigned flags;        /**< ZO_TILE_* used */
    uint32_t tile_out;     /**< rows per tile */
    uint32_t tile_in;      /**< columns per tile */
    uint32_t tiles_out;    /**< tiles down */
    uint32_t tiles_in;     /**< tiles across */
    uint64_t tile_bytes;   /**< bytes of the largest weight tile */
    uint64_t work_bytes;   /**< device bytes the operator allocates with this grid */
} zo_tile_grid;

/**
 * Choose the tile grid for W [out, in] (x [batch, in]) that fits `budget`
 * device bytes: full-width tiles (whole rows: each y column block is
 * written once, tiles are contiguous in W) with as many rows as fit,
 * balanced so all tiles are nearly equal; only when one whole row does not
 * fit are rows cut as well. See docs/tiling.md for the cost model.
 * @param dtype  ZO_DTYPE_F32 or ZO_DTYPE_BF16.
 * @return 0; -EINVAL (grid NULL, a dimension 0 or above INT_MAX, unknown
 *         flags); ZO_ENOTSUP (dtype); ZO_EBUDGET (budget below the smallest
 *         plan: the ones vectors plus a tile of one row of
 *         min(in, ZO_TILE_MIN_COLS) columns; detail says how much is
 *         needed). Pure computation, thread-safe.
 */
ZO_API int zo_tile_plan(uint64_t batch, uint64_t out, uint64_t in, zo_dtype dtype, uint64_t budget, unsigned flags,
                        zo_tile_grid *grid);

/**
 * The grid of given tile dimensions (clamped to W) and its work_bytes.
 * @return 0; -EINVAL (as zo_tile_plan(), or a tile dimension 0); ZO_ENOTSUP.
 */
ZO_API int zo_tile_grid_make(uint64_t batch, uint64_t out, uint64_t in, zo_dtype dtype, uint32_t tile_out,
                             uint32_t tile_in, unsigned flags, zo_tile_grid *grid);

/* ---- the walker: the generic mechanism -------------------------------------------- */
typedef struct zo_tile_walk zo_tile_walk;

/**
 * Called once per tile, on the thread running zo_tile_walk_run(), when the
 * tile's bytes are (or will be, in stream order) at `tile` in device
 * memory: queue the work that reads it on `compute`. The buffer is reused
 * two tiles later, after the work queued here is done. Return 0 or a
 * negative error that stops the walk.
 */
typedef int (*zo_tile_fn)(void *ctx, unsigned index, const void *tile, zo_stream *compute);

/**
 * Create a walker for tiles of at most max_tile_bytes: two device buffers
 * of that size (none when every tile it walks is homed on the device; pass
 * max_tile_bytes 0 for that), a copy stream, a compute stream.
 * @param dev  the store's device.
 * @return 0; -EINVAL (NULL); -ENOMEM (device memory: the budget);
 *         ZO_ECUDA; errors of zo_stream_create().
 */
ZO_API int zo_tile_walk_create(zo_tile_walk **out, zo_store *store, zo_dev *dev, uint64_t max_tile_bytes);

/** zo_tile_walk_create_ex() flag: on the host backend, hand tiles already in
 *  host memory to fn where they are instead of copying them into a buffer. */
#define ZO_TILE_WALK_IN_PLACE (1u << 0)

/**
 * zo_tile_walk_create() with flags. ZO_TILE_WALK_IN_PLACE: on the host
 * backend (where "device memory" is host memory and a copy into a buffer
 * is a CPU memcpy that takes a core from the GEMMs) a host-homed tile is
 * handed to fn at its pinned home address, and an NVMe-homed tile that
 * fits one store pool slot (and the pool has >= 5 slots) at the slot it is
 * read into; the reference (or the slot) is held until the work fn queued
 * is done. Such tiles need no buffer: max_tile_bytes need only cover the
 * tiles still copied (device-homed tiles are always in place; NVMe tiles
 * larger than a slot are copied). On another backend the flag is ignored
 * (a GPU reads its tiles from device memory: the copy is DMA).
 * zo_tile_walk_in_place() says whether it took effect.
 * @return as zo_tile_walk_create(); -EINVAL also for unknown flags.
 */
ZO_API int zo_tile_walk_create_ex(zo_tile_walk **out, zo_store *store, zo_dev *dev, uint64_t max_tile_bytes,
                                  unsigned flags);
/** 1 if w hands host-memory tiles over in place (ZO_TILE_WALK_IN_PLACE on
 *  the host backend), else 0 (also for NULL). */
ZO_API int zo_tile_walk_in_place(const zo_tile_walk *w);
/**
 * Most tiles read ahead of the one in use. Only in-place NVMe tiles go
 * deeper than one (each a pool slot's read: one read in flight leaves a
 * disk idle between small tiles). The default (tiles 0 restores it) is
 * what the store's pool allows: (pool slots - 5) / 2 + 1, at most 8, and a walk
 * stops going deeper once 128 MiB are on their way. 1: the next tile only.
 * @return the depth now in effect (capped at the default); -EINVAL (NULL).
 */
ZO_API int zo_tile_walk_set_read_ahead(zo_tile_walk *w, unsigned tiles);
/** Wait for queued work, free the buffers. NULL ok; clears *w. Blocks. */
ZO_API void zo_tile_walk_destroy(zo_tile_walk **w);
/** The compute stream fn gets (to queue work before or after a walk); owned
 *  by the walker. NULL if w is NULL. */
ZO_API zo_stream *zo_tile_walk_stream(zo_tile_walk *w);

/**
 * Walk tiles[0..n) in order: tile k+1 is fetched (copy stream) while tile
 * k's work runs (compute stream). Device-homed tiles are used in place,
 * host-homed ones are copied from their pinned home, NVMe-homed ones
 * stream through the store's pinned pool slots (zo_store_stream_open)
 * straight into the device buffer (with ZO_TILE_WALK_IN_PLACE on the host
 * backend, see zo_tile_walk_create_ex(), host-homed and one-slot NVMe
 * tiles are not copied). Blocks until all queued work is done.
 * @return 0; -EINVAL (NULL, n 0, a tile larger than the buffers); the
 *         first error of fn, of the store (acquire/stream: ZO_ECORRUPT,
 *         -EIO, -EBUSY...) or of the streams. References taken are
 *         released on every path.
 */
ZO_API int zo_tile_walk_run(zo_tile_walk *w, zo_tensor *const *tiles, unsigned n, zo_tile_fn fn, void *ctx);

/** zo_tile_walk_run_ex() flag: keep the last tile where it is after the run
 *  (its device buffer, its pinned home reference or its NVMe pool slot),
 *  so that a next run starting with the same tile uses it without fetching
 *  it again (a backward walking a forward's tiles in reverse order). */
#define ZO_TILE_RUN_KEEP_LAST (1u << 0)

/**
 * zo_tile_walk_run() with flags (0 or ZO_TILE_RUN_KEEP_LAST). Every run
 * first looks at what the walker holds from before: a kept last tile or a
 * prefetch (zo_tile_walk_prefetch()) that is tiles[0] is used as tile 0;
 * one that is not is dropped first. A kept tile must not be written in
 * the store before the run that uses it (the run would see the old bytes,
 * or the write would be refused while an NVMe tile's stream is open):
 * call zo_tile_walk_drop() before writing it.
 * @return as zo_tile_walk_run(); -EINVAL also for unknown flags. On an
 *         error nothing is kept.
 */
ZO_API int zo_tile_walk_run_ex(zo_tile_walk *w, zo_tensor *const *tiles, unsigned n, zo_tile_fn fn, void *ctx,
                               unsigned flags);

/**
 * Begin fetching t ahead of the run that starts with it: an acquire of its
 * home copy, or for an NVMe home a store stream whose read-ahead loads it
 * into pool slots in the background, while the caller does other work.
 * The next zo_tile_walk_run*() with tiles[0] == t finishes it; a run
 * starting with another tile, another prefetch, zo_tile_walk_drop() or
 * destroy undo it. No device memory beyond the walker's own buffers (an
 * NVMe tile holds its stream's pool slots until used or dropped). A no-op
 * if t is kept or already prefetched. Does not block on the transfer.
 * @return 0 (also when the store pool has no free slot now: then nothing
 *         is begun and stats.prefetch_skipped counts it); -EINVAL (NULL,
 *         a tile larger than the walker's buffers that is not read in
 *         place); other errors of zo_store_tensor_info(), zo_store_acquire()
 *         and zo_store_stream_open().
 */
ZO_API int zo_tile_walk_prefetch(zo_tile_walk *w, zo_tensor *t);

/** Release what w holds between runs (a kept last tile, a prefetch).
 *  NULL ok. Blocks until an undone prefetch's transfer has ended. */
ZO_API void zo_tile_walk_drop(zo_tile_walk *w);

/** Walker counters. */
typedef struct zo_tile_walk_stats {
    uint64_t tiles;        /**< tiles walked */
    uint64_t fetch_bytes;  /**< bytes copied into the device buffers */
    uint64_t fetch_ns;     /**< time the calling thread spent fetching (NVMe reads, acquires) */
    uint64_t wait_ns;      /**< time it waited for work to finish */
    uint64_t in_place_tiles; /**< tiles not homed on the device handed over in place (no copy) */
    uint64_t runs;         /**< walks (zo_tile_walk_run() calls that started) */
    uint64_t reads;        /**< tiles fetched from their home (acquires and NVMe streams begun) */
    uint64_t reused;       /**< runs whose first tile was the previous run's kept last tile (no fetch) */
    uint64_t prefetched;   /**< fetches begun by zo_tile_walk_prefetch() (counted in reads too) */
    uint64_t prefetch_skipped; /**< prefetches not begun: the store pool was busy (-EBUSY) */
    uint64_t first_ns;     /**< time the calling thread spent getting each run's first tile ready
                                (nothing else of the run overlaps it: the start stall; near 0 when
                                the tile was kept or prefetched early enough) */
    uint64_t ahead_peak;   /**< most tiles being read ahead of the one in use at once, the next one
                                included, when a walk read ahead deeper than one tile (in-place
                                NVMe tiles: see ZO_TILE_WALK_IN_PLACE); 0: never deeper */
} zo_tile_walk_stats;
/** Copy the counters (zeros for w NULL; st NULL ignored). Not synchronized
 *  with a walk running on another thread. */
ZO_API void zo_tile_walk_get_stats(const zo_tile_walk *w, zo_tile_walk_stats *st);

/* ---- dW consumers ------------------------------------------------------------------- */
/** One finished gradient tile. */
typedef struct zo_tile_grad {
    uint32_t row, col;   /**< tile index in the grid */
    uint64_t out0, in0;  /**< first row / column of the tile in W */
    uint32_t rows, cols; /**< tile shape */
    const float *dw;     /**< device memory, rows x cols, row stride cols, f32 */
    zo_stream *stream;   /**< a stream of the operator's for the sink's own work */
} zo_tile_grad;

/**
 * A dW consumer: called on the thread running the backward, once g->dw is
 * complete. It may read g->dw synchronously, or queue work reading it on
 * g->stream: the operator waits for that stream before reusing the buffer
 * (two tiles later). It must not keep the pointer. 0, or a negative error
 * that stops the backward (returned by it).
 */
typedef int (*zo_tile_sink_fn)(void *ctx, const zo_tile_grad *g);

/** Context of zo_tile_sink_host(): a dense host matrix to receive dW. */
typedef struct zo_tile_host_sink {
    float *dw;       /**< host memory, out x in */
    uint64_t ld;     /**< row stride of dw in elements (>= in) */
    int accumulate;  /**< 1: dw += tile; 0: dw = tile */
} zo_tile_host_sink;

/** A ready-made sink: copies each tile to ctx (a zo_tile_host_sink *).
 *  @return 0; -EINVAL (ctx NULL); -ENOMEM; stream errors. Blocks. */
ZO_API int zo_tile_sink_host(void *ctx, const zo_tile_grad *g);

/** Context of zo_tile_sink_store(): one store tensor per gradient tile. */
typedef struct zo_tile_store_sink {
    zo_store *store;
    zo_tensor *const *grads; /**< tiles_out x tiles_in tensors, row-major, each rows x cols f32 bytes */
    uint32_t tiles_in;       /**< the grid's tiles_in */
} zo_tile_store_sink;

/** A ready-made sink: writes each tile into its store tensor (any home
 *  tier; zo_store_write()), overwriting it.
 *  @return 0; -EINVAL (ctx/store/grads NULL, a tensor whose size is not the
 *  tile's); -ENOMEM; stream errors; errors of zo_store_write(). Blocks. */
ZO_API int zo_tile_sink_store(void *ctx, const zo_tile_grad *g);

/* ---- tiled linear ------------------------------------------------------------------ */
typedef struct zo_tiled_linear zo_tiled_linear;

typedef struct zo_tiled_linear_config {
    size_t struct_size;      /**< sizeof(zo_tiled_linear_config), set by the defaults function */
    const char *name;        /**< store tensor prefix: tiles are "<name>.w.<r>.<c>"; default "linear" */
    uint64_t in_features;    /**< columns of W (required) */
    uint64_t out_features;   /**< rows of W (required) */
    uint64_t max_batch;      /**< most rows of x per call (required) */
    zo_dtype dtype;          /**< W, x and dy: ZO_DTYPE_F32 (default) or ZO_DTYPE_BF16 */
    zo_tier home;            /**< home tier of the weight tiles; default ZO_TIER_NVME */
    uint64_t budget;         /**< device working-memory budget in bytes; 0: tile_out/tile_in given */
    uint32_t tile_out;       /**< with budget 0: rows per tile */
    uint32_t tile_in;        /**< with budget 0: columns per tile */
    int train;               /**< 1 (default): backward supported (dW buffers allocated) */
    zo_tile_sink_fn dw_sink; /**< dW consumer; NULL: backward computes dx / db only */
    void *dw_sink_ctx;
    /** 0 (default): on the host backend, weight tiles already in host memory
     *  (host home; NVMe home when a tile fits one pool slot) are read by the
     *  GEMMs in place, and the budget holds no staging buffer for them (the
     *  plan uses ZO_TILE_IN_PLACE; an NVMe-homed grid is cut to tiles of at
     *  most one pool slot). 1: always copy tiles into the two device
     *  buffers, as on a GPU. Ignored on other backends (always copied). */
    int copy_tiles;
    /** 0 (default): backward walks the tiles last to first, so that it
     *  starts with the tile forward ended with (see keep_last). dW tiles and
     *  db are the same bits either way; dx sums its tile rows in the
     *  opposite order (bit-identical when the grid has one tile row, else
     *  within rounding). 1: first to last, as forward. */
    int backward_in_order;
    /** 1: a train layer's forward keeps its last tile where it is (pool
     *  slot, pinned reference or device buffer) for the backward to start
     *  with, without fetching it again; held until the next walk, prefetch,
     *  zo_tiled_linear_drop(), set_weight or destroy (so W must not be
     *  written through the store in between). An NVMe tile read in place
     *  holds its stream's two pool slots meanwhile (a copied one is in the
     *  walker's buffer and holds none): with many tiled layers whose
     *  forwards all run before their backwards, set it only where the pool
     *  has room (zo-train: the last layer). 0 (default): nothing is held. */
    int keep_last;
    /** Most weight tiles read ahead of the one in use (see
     *  zo_tile_walk_set_read_ahead(): deeper than one only for NVMe tiles
     *  read in place); 0 (default): what the store's pool allows. */
    unsigned read_ahead;
} zo_tiled_linear_config;

/** Fill *cfg with the defaults above. NULL is ignored. */
ZO_API void zo_tiled_linear_config_default(zo_tiled_linear_config *cfg);

/**
 * Plan the grid, register the weight tiles in the store (contents zero),
 * allocate the working memory (exactly grid.work_bytes of device memory).
 * @param dev  the store's device.
 * @return 0; -EINVAL (NULL, struct_size, missing dimension, name too long);
 *         ZO_ENOTSUP (dtype); ZO_EBUDGET (budget too small, or a store
 *         tier full); ZO_ECONFIG (home tier not configured in the store);
 *         -EEXIST (a tile name is taken); -ENOMEM (device memory:
 *         the device has less than work_bytes free); other errors of
 *         zo_store_register() and the device. Blocks.
 */
ZO_API int zo_tiled_linear_create(zo_tiled_linear **out, zo_store *store, zo_dev *dev,
                                  const zo_tiled_linear_config *cfg);
/** Unregister the tiles, free the working memory. NULL ok; clears *tl. */
ZO_API void zo_tiled_linear_destroy(zo_tiled_linear **tl);
/** The grid in use. @return 0; -EINVAL. */
ZO_API int zo_tiled_linear_grid(const zo_tiled_linear *tl, zo_tile_grid *grid);
/** The store tensor of tile (r, c) (for an optimizer). @return 0; -EINVAL (out of the grid). */
ZO_API int zo_tiled_linear_tile(const zo_tiled_linear *tl, uint32_t r, uint32_t c, zo_tensor **out);
/** Last error detail ("" if none). */
ZO_API const char *zo_tiled_linear_errmsg(const zo_tiled_linear *tl);

/**
 * Store W (host memory, out x in in the config's dtype, row stride ld
 * elements) into the tiles. Blocks.
 * @return 0; -EINVAL (NULL, ld < in); errors of zo_store_write().
 */
ZO_API int zo_tiled_linear_set_weight(zo_tiled_linear *tl, const void *w, uint64_t ld);
/** Read W back into host memory (as set_weight). @return as zo_store_read(). */
ZO_API int zo_tiled_linear_get_weight(zo_tiled_linear *tl, void *w, uint64_t ld);

/**
 * y = x W^T + b. x: device, batch x in, dtype; bias: device, out f32, or
 * NULL; y: device, batch x out, f32. Tiles are walked row by row; each y
 * column block is finished by its tile row. Blocks.
 * @return 0; -EINVAL (NULL, batch 0 or above max_batch); errors of the
 *         walk (store, device).
 */
ZO_API int zo_tiled_linear_forward(zo_tiled_linear *tl, const void *x, uint64_t batch, const float *bias, float *y);

/**
 * Backward of forward(): dx = dy W (f32, batch x in; NULL: not wanted),
 * db = column sums of dy (f32, out; NULL: not wanted), and dW = dy^T x
 * handed to the config's sink tile by tile as each is computed (f32,
 * overwritten: the sink accumulates if it wants to). x and dy in dtype.
 * Blocks.
 * @return 0; -EINVAL (NULL x/dy, batch 0 or above max_batch); ZO_ESTATE
 *         (created with train 0); the sink's error; errors of the walk.
 */
ZO_API int zo_tiled_linear_backward(zo_tiled_linear *tl, const void *x, const void *dy, uint64_t batch, float *dx,
                                    float *db);

/** A pass of the tiled linear, for zo_tiled_linear_prefetch(). */
typedef enum zo_tile_pass {
    ZO_TILE_PASS_FORWARD = 0,
    ZO_TILE_PASS_BACKWARD = 1,
} zo_tile_pass;

/**
 * Begin fetching the first tile the next `pass` walks (forward: tile
 * (0, 0); backward: the last tile, or (0, 0) with backward_in_order), so
 * that its read overlaps the caller's other work (the previous layer, the
 * rest of the step) instead of stalling the pass's start. See
 * zo_tile_walk_prefetch(): no device memory beyond the working memory; the
 * tile must not be written in the store before that pass (call
 * zo_tiled_linear_drop() first). A no-op if that tile is already kept or
 * prefetched. Does not block on the transfer.
 * @return 0 (also when the store pool is busy: nothing begun); -EINVAL
 *         (NULL, unknown pass); ZO_ESTATE (backward of a train = 0 layer);
 *         errors of zo_tile_walk_prefetch().
 */
ZO_API int zo_tiled_linear_prefetch(zo_tiled_linear *tl, zo_tile_pass pass);
/** Release a kept or prefetched tile (zo_tile_walk_drop()). NULL ok. */
ZO_API void zo_tiled_linear_drop(zo_tiled_linear *tl);

/** Counters of the walks so far (as zo_tile_walk_get_stats()). */
ZO_API void zo_tiled_linear_get_stats(const zo_tiled_linear *tl, zo_tile_walk_stats *st);

/* ---- tiled output projection + cross-entropy --------------------------------------- */
typedef struct zo_tiled_xent zo_tiled_xent;

typedef struct zo_tiled_xent_config {
    size_t struct_size;   /**< sizeof(zo_tiled_xent_config), set by the defaults function */
    const char *name;     /**< store tensor prefix: "<name>.e.<v>"; default "xent" */
    uint64_t vocab;       /**< rows of E (required) */
    uint64_t hidden;      /**< columns of E = width of h (required) */
    uint64_t max_batch;   /**< most rows of h per call (required) */
    zo_dtype dtype;       /**< E and h: f32 (default) or bf16 */
    zo_tier home;         /**< home of E's tiles; default ZO_TIER_NVME */
    uint64_t budget;      /**< device working-memory budget; 0: tile_vocab given */
    uint32_t tile_vocab;  /**< with budget 0: vocabulary rows per tile */
    zo_tile_sink_fn de_sink; /**< dE consumer (tiles are whole rows); NULL: none */
    void *de_sink_ctx;
    /** 0 (default): on the host backend, E's tiles already in host memory
     *  (host home; NVMe home when a tile fits one pool slot: a budget-planned
     *  grid is cut to that) are read by the GEMMs in place, without staging
     *  buffers (ZO_TILE_IN_PLACE plan). 1: copied into two device buffers,
     *  as on a GPU. Ignored on other backends (always copied). */
    int copy_tiles;
} zo_tiled_xent_config;

/** Fill *cfg with the defaults above. NULL is ignored. */
ZO_API void zo_tiled_xent_config_default(zo_tiled_xent_config *cfg);

/**
 * The grid zo_tiled_xent_create() uses: tiles of whole rows of E [vocab,
 * hidden], as many rows as `budget` allows (balanced), or tile_vocab rows
 * when budget is 0; work_bytes is the device memory it allocates (see
 * below). flags: 0, ZO_TILE_RESIDENT (E homed on the device) or
 * ZO_TILE_IN_PLACE (tiles read in place: no staging buffers).
 * @return 0; -EINVAL (grid NULL, a dimension 0 or above INT_MAX, tile_vocab
 *         0 with budget 0, unknown flags); ZO_ENOTSUP (dtype); ZO_EBUDGET
 *         (budget below one vocabulary row). Pure computation, thread-safe.
 */
ZO_API int zo_tile_plan_vocab(uint64_t batch, uint64_t vocab, uint64_t hidden, zo_dtype dtype, uint64_t budget,
                              uint32_t tile_vocab, unsigned flags, zo_tile_grid *grid);

/**
 * An output projection logits = h E^T over a vocabulary cut into tiles of
 * whole rows of E, with a streaming (online) softmax cross-entropy: each
 * logits tile [batch, tile_vocab] lives in device memory only while its
 * running max and sum-of-exponentials are folded into the rows' state
 * (on the host: the only device kernels needed are GEMMs and copies), so
 * the full [batch, vocab] logits never exist anywhere.
 * Working memory (zo_tile_grid.work_bytes, allocated once) per vocabulary
 * row of a tile: 2 hidden esz (staging; 0 with a device home or tiles read
 * in place, see copy_tiles) + 2 batch 4
 * (logits) + batch esz (dlogits) + 2 hidden 4 (dE tiles). A pinned host
 * buffer of two logits tiles and one dlogits tile is allocated too
 * (zo_pinned_alloc, registered with dev).
 * @return as zo_tiled_linear_create() (ZO_EBUDGET: the budget is below one
 *         vocabulary row).
 */
ZO_API int zo_tiled_xent_create(zo_tiled_xent **out, zo_store *store, zo_dev *dev, const zo_tiled_xent_config *cfg);
/** Unregister E's tiles, free the working memory. NULL ok; clears *x. Blocks. */
ZO_API void zo_tiled_xent_destroy(zo_tiled_xent **x);
/** The grid in use (tiles_in is 1: whole rows of E). @return 0; -EINVAL (NULL). */
ZO_API int zo_tiled_xent_grid(const zo_tiled_xent *x, zo_tile_grid *grid);
/** Last error detail ("" if none). */
ZO_API const char *zo_tiled_xent_errmsg(const zo_tiled_xent *x);
/** Store E (host, vocab x hidden, dtype, row stride ld). @return as zo_tiled_linear_set_weight(). */
ZO_API int zo_tiled_xent_set_weight(zo_tiled_xent *x, const void *e, uint64_t ld);

/** Counters of the walks so far (as zo_tile_walk_get_stats()). */
ZO_API void zo_tiled_xent_get_stats(const zo_tiled_xent *x, zo_tile_walk_stats *st);

/**
 * Mean cross-entropy of softmax(h E^T) against labels, and optionally its
 * gradients: dh = dlogits E (device, batch x hidden, f32; NULL: not
 * wanted) and dE tiles to the sink, with dlogits = (softmax - onehot) /
 * batch. h: device, batch x hidden, dtype. labels: host, batch entries in
 * [0, vocab). *loss: host. With gradients the tiles are walked twice (the
 * second walk needs the final normalizers), the second from the last tile
 * to the first, starting with the tile the first ended with (kept between
 * the walks, not read again); dh sums its tiles in that order. Blocks.
 * @return 0; -EINVAL (NULL, batch 0 or above max_batch, a label out of
 *         range); the sink's error; errors of the walk.
 */
ZO_API int zo_tiled_xent_run(zo_tiled_xent *x, const void *h, uint64_t batch, const int32_t *labels, double *loss,
                             float *dh);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_TILING_H */
