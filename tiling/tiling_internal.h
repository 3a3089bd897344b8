/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tiling internals shared by the walker, the planner and the operators.
 */
#ifndef ZO_TILING_INTERNAL_H
#define ZO_TILING_INTERNAL_H

#include "core/internal.h"

#include <zoffload/tiling.h>

/* Keep the calling thread's last error detail as eb's (a callee's detail
 * becomes the handle's), return err. */
static inline int zo__tile_keep(zo_errbuf *eb, int err)
{
    zo__errbuf_set(eb, zo_last_error_detail());
    return err;
}

/* Whether eb holds a message (a callee already said why). */
static inline int zo__tile_has_msg(const zo_errbuf *eb)
{
    char c[2];
    return zo__errbuf_get(eb, c, sizeof(c))[0] != '\0';
}

/* Pool slots an in-place NVMe walk needs: two tiles' one-piece streams of
 * depth 1 (two slots each) and the slot the store keeps for itself. */
#define ZO_TILE_IN_PLACE_SLOTS 5u

/* In-place NVMe tiles read ahead of the one in use: at most this many
 * (each holds two pool slots; fewer when the pool is smaller, see walk.c),
 * and no more once this many bytes are queued. The pool bounds the depth
 * anyway; the byte cap only keeps a huge pool from reading a whole layer
 * ahead. With tiles of 29 MiB (batch 16, 8192 x 8192 fp32, 32 MiB slots)
 * a 32 MiB cap went two ahead and left the disk idle at each tile
 * boundary: on a quiet machine (alternating runs, 5-7 pairs each) the
 * NVMe step / bound was 1.087, 1.236, 1.164, 1.089 with 32 MiB, 1.161
 * with 64 MiB and 0.992, 1.199, 1.002 with 128 MiB (four or five ahead);
 * the disk's own drift is as large, but deeper was never worse. (A
 * nice'd run under load earlier saw no gain from 64 MiB.) */
#define ZO_TILE_AHEAD_MAX 8u
#define ZO_TILE_AHEAD_BYTES (128ull << 20)

/* Whether in-place fetching applies: asked for, on the host backend (its
 * device memory is host memory; a GPU's GEMMs read device memory). */
static inline int zo__tile_in_place_ok(zo_dev *dev, int asked)
{
    return asked && zo_dev_get_kind(dev) == ZO_DEV_HOST;
}

/* Whether an operator over tiles homed in `home` reads them in place
 * (host backend, copy_tiles 0; for an NVMe home only with a pool of >=
 * ZO_TILE_IN_PLACE_SLOTS slots); *slot: the pool slot size an NVMe tile
 * must fit for that, else 0. */
int zo__tile_in_place_home(zo_store *st, zo_dev *dev, zo_tier home, int copy_tiles, uint64_t *slot);

/* tiles[n-1], ..., tiles[0] in a new array (free()), NULL on ENOMEM. */
zo_tensor **zo__tile_reversed(zo_tensor *const *tiles, unsigned n);

/* Reshape g (planned from a budget) so that no tile exceeds max_bytes:
 * whole rows while one fits, else one row cut in balanced parts; work_bytes
 * recomputed (it only shrinks). -EINVAL if even ZO_TILE_MIN_COLS elements do
 * not fit. */
int zo__tile_cap(zo_tile_grid *g, uint64_t max_bytes);

/* Device bytes of the buffers the tiled linear allocates for `g`
 * (g's tile fields set); -EOVERFLOW-safe: UINT64_MAX on overflow. */
uint64_t zo__tile_linear_work(const zo_tile_grid *g);

/* Check a config's tensor-name prefix and home tier; copy the name into
 * copy (ZO_TENSOR_NAME_MAX + 1 bytes) and point *name at it. */
int zo__tile_name_home(const char **name, char *copy, zo_tier home, zo_errbuf *eb, const char *fn);

/* Register tiles rows x cols of `dtype` named "<prefix>.<r>.<c>" (or
 * "<prefix>.<r>" when cols_grid is 1 and one_dim) in `home`. */
int zo__tile_register(zo_store *st, const char *prefix, const zo_tile_grid *g, zo_tier home, int one_dim,
                      zo_tensor ***out, zo_errbuf *eb);
void zo__tile_unregister(zo_store *st, zo_tensor ***tiles, unsigned n);

/* What a tiled operator builds from its planned grid g: the tiles, named
 * "<name>.<kind>..." in home (zo__tile_register), the same tiles last to
 * first for its backward walks, and its walker, which stages tiles only
 * when g neither keeps them resident nor reads them in place. Each output is
 * set as soon as it exists, so the operator's destroy frees a partial set. */
int zo__tile_setup(zo_store *st, zo_dev *dev, const char *name, const char *kind, const zo_tile_grid *g,
                   zo_tier home, int one_dim, zo_tensor ***tiles, zo_tensor ***rtiles, zo_tile_walk **walk,
                   zo_errbuf *eb);

/* Copy W (host, ld) into / out of the tiles of g through the store. */
int zo__tile_weight_io(zo_store *st, zo_tensor **tiles, const zo_tile_grid *g, void *w, uint64_t ld, int write,
                       zo_errbuf *eb);

static inline uint32_t zo__tile_rows(const zo_tile_grid *g, uint32_t r)
{
    uint64_t o0 = (uint64_t)r * g->tile_out;
    return (uint32_t)ZO_MIN((uint64_t)g->tile_out, g->out_features - o0);
}

static inline uint32_t zo__tile_cols(const zo_tile_grid *g, uint32_t c)
{
    uint64_t i0 = (uint64_t)c * g->tile_in;
    return (uint32_t)ZO_MIN((uint64_t)g->tile_in, g->in_features - i0);
}

/* ---- the dW sink pipeline (sinkq.c) -------------------------------------------------
 * Two f32 gradient tile buffers: tile k's gradient is computed into
 * buf[k & 1] on the compute stream; it is handed to the sink while tile
 * k+1 computes; the buffer is reused for tile k+2 once the work the sink
 * queued on its stream is done. */
typedef struct zo__sinkq {
    zo_tile_sink_fn fn;
    void *ctx;
    zo_dev *dev;
    zo_stream *stream;
    float *buf[2];
    zo_event *done[2], *sunk[2];
    int sunk_rec[2];
    int has_pending;
    unsigned pending_k;
    zo_tile_grad pending;
} zo__sinkq;

int zo__sinkq_init(zo__sinkq *q, zo_dev *dev, uint64_t buf_bytes, zo_tile_sink_fn fn, void *ctx, zo_errbuf *eb);
void zo__sinkq_fini(zo__sinkq *q);
void zo__sinkq_reset(zo__sinkq *q);
/* The buffer for tile k, after making s wait until the sink is done with
 * it; NULL on error (detail set). */
float *zo__sinkq_buf(zo__sinkq *q, zo_stream *s, unsigned k, int *err);
/* Tile k's gradient (g: position and shape) is queued on s: hand the
 * previous one to the sink. */
int zo__sinkq_queued(zo__sinkq *q, zo_stream *s, unsigned k, const zo_tile_grad *g, zo_errbuf *eb);
/* After the walk: hand the last tile over (deliver: the walk succeeded),
 * wait for the sink's work. */
int zo__sinkq_flush(zo__sinkq *q, int deliver, zo_errbuf *eb);

#endif /* ZO_TILING_INTERNAL_H */
