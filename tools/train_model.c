/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-train's model: an MLP regressing a random teacher (see train_model.h).
 * The student runs on a zo_dev (GEMMs on its compute stream); the teacher,
 * which only generates the data, on the host with OpenBLAS.
 */
#include "train_model.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/dev.h>
#include <zoffload/mem.h>
#include <zoffload/vec.h>

/* Return a negative result at once (device calls queue work: the caller syncs). */
#define TRY(expr)                                                                                                    \
    do {                                                                                                             \
        int try_r_ = (expr);                                                                                         \
        if (try_r_ < 0)                                                                                              \
            return try_r_;                                                                                           \
    } while (0)

/* ---- the teacher's GEMM (host: the data generator, not the model) -------------------- */

void train_host_gemm(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                     const float *b, size_t ldb, float beta, float *c, size_t ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m,
                (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* ---- deterministic random numbers ----------------------------------------------------- */

/* A counter-based generator: element i of stream `seed` is a hash of both,
 * so any element can be produced independently and every run, resumed or
 * not, sees the same numbers. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* uniform in [-a, a) */
static float uniform(uint64_t seed, uint64_t i, float a)
{
    uint64_t h = mix64(mix64(seed) ^ i);
    double u = (double)(h >> 11) * 0x1.0p-53; /* [0, 1) */
    return (float)((2.0 * u - 1.0) * a);
}

/* ---- sizes ------------------------------------------------------------------------------ */

uint64_t train_shape_activation_bytes(const train_shape *s)
{
    uint64_t bw = (uint64_t)s->batch * s->width * 4;
    /* saved inputs of every layer, output, dy, dx; widened weight and fp32 gradient; ones */
    return bw * ((uint64_t)s->layers + 3) + 2ull * s->width * s->width * 4 + (uint64_t)s->batch * 4;
}

uint64_t train_shape_tiled_rest_bytes(const train_shape *s)
{
    uint64_t bw = (uint64_t)s->batch * s->width * 4;
    uint64_t biases = (uint64_t)s->layers * s->width * (zo_dtype_size(s->param_dtype) + zo_dtype_size(s->grad_dtype));
    /* saved inputs, output, dy, dx; the fp32 bias scratch; ones; biases */
    return bw * ((uint64_t)s->layers + 3) + (uint64_t)s->width * 4 + (uint64_t)s->batch * 4 + biases;
}

uint64_t train_shape_device_bytes(const train_shape *s)
{
    return train_shape_params(s) * (zo_dtype_size(s->param_dtype) + zo_dtype_size(s->grad_dtype)) +
           train_shape_activation_bytes(s);
}

int train_plan_tiles(const train_shape *s, uint64_t budget, uint64_t *layer_budget, zo_tile_grid *grid)
{
    *layer_budget = 0;
    if (train_shape_device_bytes(s) <= budget)
        return 0;
    uint64_t rest = train_shape_tiled_rest_bytes(s);
    if (rest >= budget)
        return ZO_EBUDGET;
    *layer_budget = (budget - rest) / s->layers;
    int r = zo_tile_plan(s->batch, s->width, s->width, ZO_DTYPE_F32, *layer_budget, ZO_TILE_TRAIN, grid);
    return r < 0 ? r : 1;
}

double train_shape_flops(const train_shape *s)
{
    double p = (double)s->layers * (double)s->width * (double)s->width;
    return 2.0 * (double)s->batch * p * 4.0; /* student forward 2BP + backward 4BP, teacher 2BP */
}

/* ---- the student ------------------------------------------------------------------------- */

/* A tiled layer's dW sink context. */
struct train_tile_sink {
    train_model *m;
    unsigned layer;
};

static int dev_alloc(train_model *m, void *pp, size_t n)
{
    int r = zo_dev_malloc(m->dev, (void **)pp, n);
    if (r == 0)
        m->dev_bytes += n;
    return r;
}

/* Where weight tensor t (tiled) lies: layer, tile row / column, first row / column, shape. */
typedef struct tile_pos {
    unsigned layer, r, c;
    uint64_t o0, i0, rows, cols;
} tile_pos;

static tile_pos tile_of(const train_model *m, unsigned t)
{
    const zo_tile_grid *g = &m->grid;
    tile_pos p = {.layer = t / m->tiles};
    unsigned k = t % m->tiles;
    p.r = k / g->tiles_in;
    p.c = k % g->tiles_in;
    p.o0 = (uint64_t)p.r * g->tile_out;
    p.i0 = (uint64_t)p.c * g->tile_in;
    p.rows = g->out_features - p.o0 < g->tile_out ? g->out_features - p.o0 : g->tile_out;
    p.cols = g->in_features - p.i0 < g->tile_in ? g->in_features - p.i0 : g->tile_in;
    return p;
}

uint64_t train_model_numel(const train_model *m, unsigned t)
{
    const train_shape *s = &m->shape;
    if (t >= s->layers * m->tiles)
        return s->width; /* a bias */
    if (!m->tl)
        return (uint64_t)s->width * s->width;
    tile_pos p = tile_of(m, t);
    return p.rows * p.cols;
}

/* The student's initial weight element (row j, column i) of layer l: He-uniform,
 * variance 2 / W (ReLU keeps the scale). */
static float initial_weight(const train_shape *s, unsigned l, uint64_t j, uint64_t i)
{
    uint64_t ww = (uint64_t)s->width * s->width;
    return uniform(s->seed, (uint64_t)l * ww + j * s->width + i, sqrtf(6.0f / (float)s->width));
}

void train_model_initial(const train_model *m, unsigned t, void *dst)
{
    const train_shape *s = &m->shape;
    size_t pes = zo_dtype_size(s->param_dtype);
    float v;
    if (t >= s->layers * m->tiles) { /* biases start at zero */
        v = 0.0f;
        for (size_t i = 0; i < s->width; i++)
            zo_vec_cast((char *)dst + i * pes, s->param_dtype, &v, ZO_DTYPE_F32, 1);
        return;
    }
    tile_pos p = m->tl ? tile_of(m, t) : (tile_pos){.layer = t, .rows = s->width, .cols = s->width};
    for (uint64_t j = 0; j < p.rows; j++)
        for (uint64_t i = 0; i < p.cols; i++) {
            v = initial_weight(s, p.layer, p.o0 + j, p.i0 + i);
            zo_vec_cast((char *)dst + (j * p.cols + i) * pes, s->param_dtype, &v, ZO_DTYPE_F32, 1);
        }
}

int train_model_tile_set(train_model *m, unsigned t, const void *param)
{
    tile_pos p = tile_of(m, t);
    size_t n = (size_t)(p.rows * p.cols);
    zo_vec_cast(m->htile, ZO_DTYPE_F32, param, m->shape.param_dtype, n); /* exact */
    zo_tensor *tt;
    /* a tile kept or prefetched by the layer's walker would be stale */
    zo_tiled_linear_drop(m->tl[p.layer]);
    int r = zo_tiled_linear_tile(m->tl[p.layer], p.r, p.c, &tt);
    if (r == 0 && (r = zo_store_write(m->store, tt, 0, m->htile, n * sizeof(float))) < 0)
        fprintf(stderr, "zo-train: writing weight tile %u: %s (%s)\n", t, zo_strerror(r), zo_store_errmsg(m->store));
    return r;
}

int train_model_tile_get(train_model *m, unsigned t, float *dst)
{
    tile_pos p = tile_of(m, t);
    zo_tensor *tt;
    int r = zo_tiled_linear_tile(m->tl[p.layer], p.r, p.c, &tt);
    return r < 0 ? r : zo_store_read(m->store, tt, 0, dst, (size_t)(p.rows * p.cols) * sizeof(float));
}

/* A dW tile of a tiled layer: staged to the host, narrowed to grad_dtype
 * (as zo_dev_cast would on the device) and handed over. */
static int tile_sink(void *ctx, const zo_tile_grad *g)
{
    struct train_tile_sink *k = ctx;
    train_model *m = k->m;
    size_t n = (size_t)g->rows * g->cols;
    int r = zo_memcpy_async(g->stream, m->htile, g->dw, n * sizeof(float), ZO_COPY_D2H);
    int r2 = zo_stream_sync(g->stream);
    if (r < 0 || r2 < 0)
        return r < 0 ? r : r2;
    zo_vec_cast(m->htile_g, m->shape.grad_dtype, m->htile, ZO_DTYPE_F32, n);
    unsigned t = k->layer * m->tiles + g->row * m->grid.tiles_in + g->col;
    return m->ready(m->ready_user, t, NULL, NULL, m->htile_g);
}

static int create_tiled(train_model *m, const train_tiling *t)
{
    const train_shape *s = &m->shape;
    m->store = t->store;
    m->tl = calloc(s->layers, sizeof(*m->tl));
    m->sinks = calloc(s->layers, sizeof(*m->sinks));
    if (!m->tl || !m->sinks)
        return -ENOMEM;
    for (unsigned l = 0; l < s->layers; l++) {
        char name[64];
        snprintf(name, sizeof(name), "%s%u", t->prefix, l);
        m->sinks[l] = (struct train_tile_sink){.m = m, .layer = l};
        zo_tiled_linear_config c;
        zo_tiled_linear_config_default(&c);
        c.name = name;
        c.in_features = c.out_features = s->width;
        c.max_batch = s->batch;
        c.dtype = ZO_DTYPE_F32; /* as the untiled layers compute: fp32 weights and activations */
        c.home = t->home;
        c.budget = t->layer_budget;
        c.dw_sink = tile_sink;
        c.dw_sink_ctx = &m->sinks[l];
        /* the grid zo-plan predicts (train_plan_tiles: the copy plan, as on
         * a GPU), not the host backend's in-place one */
        c.copy_tiles = 1;
        /* the last layer's backward follows its forward at once: it starts
         * with the tile forward ended with, not read again (the others'
         * would hold it through every later layer) */
        c.keep_last = l + 1 == s->layers;
        int r = zo_tiled_linear_create(&m->tl[l], t->store, m->dev, &c);
        if (r < 0) {
            fprintf(stderr, "zo-train: tiled layer %u: %s: %s\n", l, zo_strerror(r), zo_last_error_detail());
            return r;
        }
        zo_tiled_linear_grid(m->tl[l], &m->grid);
        m->dev_bytes += m->grid.work_bytes;
    }
    m->tiles = m->grid.tiles_out * m->grid.tiles_in;
    size_t tb = (size_t)m->grid.tile_out * m->grid.tile_in;
    if (zo_aligned_alloc((void **)&m->htile, tb * sizeof(float), 64) < 0 ||
        zo_aligned_alloc(&m->htile_g, tb * zo_dtype_size(s->grad_dtype), 64) < 0)
        return -ENOMEM;
    return 0;
}

int train_model_init(train_model *m, zo_dev *dev, const train_shape *s, const train_tiling *tiling)
{
    memset(m, 0, sizeof(*m));
    m->shape = *s;
    m->dev = dev;
    m->tiles = 1;
    size_t bw = s->batch * s->width * sizeof(float), ww = s->width * s->width * sizeof(float);
    m->act = calloc(s->layers, sizeof(float *));
    m->ev = calloc(2 * (size_t)s->layers, sizeof(zo_event *));
    if (!m->act || !m->ev) {
        train_model_free(m);
        return -ENOMEM;
    }
    int r = zo_stream_create(dev, &m->s);
    for (unsigned i = 0; i < 2 * s->layers && r == 0; i++)
        r = zo_event_create(dev, &m->ev[i]);
    for (unsigned l = 0; l < s->layers && r == 0; l++)
        r = dev_alloc(m, &m->act[l], bw);
    if (r == 0)
        r = dev_alloc(m, &m->dy, bw);
    if (r == 0)
        r = dev_alloc(m, &m->dx, bw);
    if (r == 0)
        r = dev_alloc(m, &m->out, bw);
    /* tiled: no W x W matrix on the device; gf32 holds a bias (and db) only */
    if (r == 0 && !tiling)
        r = dev_alloc(m, &m->wf32, ww);
    if (r == 0)
        r = dev_alloc(m, &m->gf32, tiling ? s->width * sizeof(float) : ww);
    if (r == 0)
        r = dev_alloc(m, &m->ones, s->batch * sizeof(float));
    if (r == 0 && (zo_aligned_alloc((void **)&m->ha, bw, 64) < 0 || zo_aligned_alloc((void **)&m->hb, bw, 64) < 0))
        r = -ENOMEM;
    /* registered: a CUDA copy from/to them is truly asynchronous */
    if (r == 0 && (r = zo_dev_host_register(dev, m->ha, bw)) < 0)
        zo_aligned_free(m->ha), m->ha = NULL;
    if (r == 0 && (r = zo_dev_host_register(dev, m->hb, bw)) < 0)
        zo_aligned_free(m->hb), m->hb = NULL;
    if (r == 0) {
        for (size_t i = 0; i < s->batch; i++)
            m->ha[i] = 1.0f;
        if ((r = zo_memcpy_async(m->s, m->ones, m->ha, s->batch * sizeof(float), ZO_COPY_H2D)) == 0)
            r = zo_stream_sync(m->s);
    }
    if (r == 0 && tiling)
        r = create_tiled(m, tiling);
    if (r < 0)
        train_model_free(m);
    return r;
}

void train_model_free(train_model *m)
{
    if (m->s)
        zo_stream_sync(m->s); /* nothing queued may still use what is freed below */
    if (m->tl)
        for (unsigned l = 0; l < m->shape.layers; l++)
            zo_tiled_linear_destroy(&m->tl[l]);
    free(m->tl);
    free(m->sinks);
    zo_aligned_free(m->htile);
    zo_aligned_free(m->htile_g);
    zo_stream_destroy(&m->s);
    if (m->ev)
        for (unsigned i = 0; i < 2 * m->shape.layers; i++)
            zo_event_destroy(&m->ev[i]);
    free(m->ev);
    if (m->act)
        for (unsigned l = 0; l < m->shape.layers; l++)
            zo_dev_free(m->dev, m->act[l]);
    free(m->act);
    if (m->dev) {
        zo_dev_free(m->dev, m->dy);
        zo_dev_free(m->dev, m->dx);
        zo_dev_free(m->dev, m->out);
        zo_dev_free(m->dev, m->wf32);
        zo_dev_free(m->dev, m->gf32);
        zo_dev_free(m->dev, m->ones);
    }
    if (m->ha) {
        zo_dev_host_unregister(m->dev, m->ha);
        zo_aligned_free(m->ha);
    }
    if (m->hb) {
        zo_dev_host_unregister(m->dev, m->hb);
        zo_aligned_free(m->hb);
    }
    memset(m, 0, sizeof(*m));
}

int train_model_init_params(train_model *m)
{
    const train_shape *s = &m->shape;
    size_t pes = zo_dtype_size(s->param_dtype);
    void *p = malloc((size_t)train_model_numel(m, 0) * pes);
    int r = p ? 0 : -ENOMEM;
    unsigned nw = s->layers * m->tiles;
    for (unsigned t = 0; t < train_model_ntensors(m) && r == 0; t++) {
        train_model_initial(m, t, p);
        if (t < nw && m->tl) {
            r = train_model_tile_set(m, t, p);
            continue;
        }
        void *dst = t < nw ? m->weight[t] : m->bias[t - nw];
        /* synchronous: the host buffer is reused by the next tensor */
        if ((r = zo_memcpy_async(m->s, dst, p, (size_t)train_model_numel(m, t) * pes, ZO_COPY_H2D)) == 0)
            r = zo_stream_sync(m->s);
    }
    free(p);
    return r;
}

/* out[b][j] = sum_i in[b][i] * w[j][i] + bias[j]: one linear layer, W x W weight in
 * PyTorch's (out, in) layout; the bias broadcast is the rank-1 GEMM ones x bias^T */
static int linear(train_model *m, const float *in, const float *w, const float *bias, float *out)
{
    size_t B = m->shape.batch, W = m->shape.width;
    int r = zo_gemm_async(m->s, ZO_GEMM_N, ZO_GEMM_N, B, W, 1, 1.0f, m->ones, 1, bias, W, ZO_DTYPE_F32, 0.0f, out, W);
    if (r == 0)
        r = zo_gemm_async(m->s, ZO_GEMM_N, ZO_GEMM_T, B, W, W, 1.0f, in, W, w, W, ZO_DTYPE_F32, 1.0f, out, W);
    return r;
}

/* ---- the ReLU: a device kernel (zo_dev_relu_mask), in place ------------------------------ */

static int relu(train_model *m, float *x)
{
    return zo_dev_relu_mask(m->s, x, x, x, m->shape.batch * m->shape.width);
}

/* Layer l forward into dst (bias widened into gf32 first). A tiled layer
 * runs on its operator's own streams and blocks: the compute stream is
 * synchronized before it (its inputs) and the work after it queues behind. */
static int layer_forward(train_model *m, unsigned l, float *dst)
{
    const train_shape *s = &m->shape;
    size_t W = s->width;
    float *bias = m->gf32; /* the widened bias borrows the gradient scratch (free during forward) */
    TRY(zo_dev_cast(m->s, bias, ZO_DTYPE_F32, m->bias[l], s->param_dtype, W));
    if (m->tl) {
        TRY(zo_stream_sync(m->s));
        /* the next layer's first tile travels while this one computes */
        if (l + 1 < s->layers)
            TRY(zo_tiled_linear_prefetch(m->tl[l + 1], ZO_TILE_PASS_FORWARD));
        return zo_tiled_linear_forward(m->tl[l], m->act[l], s->batch, bias, dst);
    }
    TRY(zo_dev_cast(m->s, m->wf32, ZO_DTYPE_F32, m->weight[l], s->param_dtype, W * W));
    return linear(m, m->act[l], m->wf32, bias, dst);
}

int train_forward(train_model *m, const float *x, const float *y, double *loss)
{
    const train_shape *s = &m->shape;
    size_t bw = s->batch * s->width;
    int r = zo_memcpy_async(m->s, m->act[0], x, bw * sizeof(float), ZO_COPY_H2D);
    for (unsigned l = 0; l < s->layers && r == 0; l++) {
        int last = l + 1 == s->layers;
        float *dst = last ? m->out : m->act[l + 1];
        r = layer_forward(m, l, dst);
        if (r == 0 && !last)
            r = relu(m, dst);
    }
    /* the loss on the host: the output through the staging buffer (ha keeps
     * it for backward's dy) */
    if (r == 0)
        r = zo_memcpy_async(m->s, m->ha, m->out, bw * sizeof(float), ZO_COPY_D2H);
    int r2 = zo_stream_sync(m->s);
    if (r < 0 || r2 < 0)
        return r < 0 ? r : r2;
    double sum = 0;
    for (size_t i = 0; i < bw; i++) {
        double d = (double)m->ha[i] - (double)y[i];
        sum += d * d;
    }
    *loss = 0.5 * sum / (double)bw;
    return 0;
}

/* Narrow the fp32 gradient scratch into tensor t's device gradient, mark it, hand it over. */
static int hand_over(train_model *m, unsigned t, void *dev_grad, size_t n)
{
    unsigned e = t < m->shape.layers * m->tiles ? t : m->shape.layers + (t - m->shape.layers * m->tiles);
    int r = zo_dev_cast(m->s, dev_grad, m->shape.grad_dtype, m->gf32, ZO_DTYPE_F32, n);
    if (r == 0)
        r = zo_event_record(m->ev[e], m->s);
    return r < 0 ? r : m->ready(m->ready_user, t, dev_grad, m->ev[e], NULL);
}

static int backward(train_model *m, const float *y, double loss_scale)
{
    const train_shape *s = &m->shape;
    size_t W = s->width, B = s->batch, bw = B * W;
    unsigned nw = s->layers * m->tiles;
    /* d loss / d out = (out - y) / (B W), times the loss scale; ha holds the
     * output since forward's synchronized loss */
    float k = (float)(loss_scale / (double)bw);
    for (size_t i = 0; i < bw; i++)
        m->hb[i] = (m->ha[i] - y[i]) * k;
    TRY(zo_memcpy_async(m->s, m->dy, m->hb, bw * sizeof(float), ZO_COPY_H2D));
    for (unsigned l = s->layers; l-- > 0;) {
        if (m->tl) {
            /* dW tile by tile to tile_sink() (each handed over as it exists),
             * db into gf32, dx (not for the first layer's input) */
            TRY(zo_stream_sync(m->s));
            if (l > 0) /* the next layer backward's first tile, as in forward */
                TRY(zo_tiled_linear_prefetch(m->tl[l - 1], ZO_TILE_PASS_BACKWARD));
            TRY(zo_tiled_linear_backward(m->tl[l], m->act[l], m->dy, B, l ? m->dx : NULL, m->gf32));
        } else {
            /* dW = dy^T x (W x W): the weight's gradient, handed over at once */
            TRY(zo_gemm_async(m->s, ZO_GEMM_T, ZO_GEMM_N, W, W, B, 1.0f, m->dy, W, m->act[l], W, ZO_DTYPE_F32, 0.0f,
                              m->gf32, W));
            TRY(hand_over(m, l, m->gweight[l], W * W));
            /* db = column sums of dy = dy^T ones */
            TRY(zo_gemm_async(m->s, ZO_GEMM_T, ZO_GEMM_N, W, 1, B, 1.0f, m->dy, W, m->ones, 1, ZO_DTYPE_F32, 0.0f,
                              m->gf32, 1));
        }
        TRY(hand_over(m, nw + l, m->gbias[l], W));
        if (l == 0)
            break; /* no gradient for the inputs */
        if (!m->tl) {
            /* dx = dy W */
            TRY(zo_dev_cast(m->s, m->wf32, ZO_DTYPE_F32, m->weight[l], s->param_dtype, W * W));
            TRY(zo_gemm_async(m->s, ZO_GEMM_N, ZO_GEMM_N, B, W, W, 1.0f, m->dy, W, m->wf32, W, ZO_DTYPE_F32, 0.0f,
                              m->dx, W));
        }
        /* dy = dx through the ReLU of the layer below (its output is act[l]) */
        TRY(zo_dev_relu_mask(m->s, m->dy, m->dx, m->act[l], bw));
    }
    return 0;
}

int train_backward(train_model *m, const float *y, double loss_scale, train_grad_ready_fn ready, void *user)
{
    m->ready = ready;
    m->ready_user = user;
    int r = backward(m, y, loss_scale);
    int r2 = zo_stream_sync(m->s); /* also on an error: nothing queued outlives this call */
    m->ready = NULL;
    return r < 0 ? r : r2;
}

/* ---- the teacher ---------------------------------------------------------------------------- */

int train_teacher_init(train_teacher *t, const train_shape *s)
{
    memset(t, 0, sizeof(*t));
    t->shape = *s;
    size_t ww = s->width * s->width;
    if (zo_aligned_alloc((void **)&t->weight, (size_t)s->layers * ww * sizeof(float), 64) < 0 ||
        zo_aligned_alloc((void **)&t->bias, (size_t)s->layers * s->width * sizeof(float), 64) < 0 ||
        zo_aligned_alloc((void **)&t->scratch, s->batch * s->width * sizeof(float), 64) < 0) {
        train_teacher_free(t);
        return -ENOMEM;
    }
    float a = sqrtf(6.0f / (float)s->width);
    for (size_t i = 0; i < (size_t)s->layers * ww; i++)
        t->weight[i] = zo_bf16_to_f32(zo_f32_to_bf16(uniform(s->seed + 1, i, a)));
    for (size_t i = 0; i < (size_t)s->layers * s->width; i++)
        t->bias[i] = zo_bf16_to_f32(zo_f32_to_bf16(uniform(s->seed + 1, ~(uint64_t)i, 0.1f)));
    return 0;
}

void train_teacher_free(train_teacher *t)
{
    zo_aligned_free(t->weight);
    zo_aligned_free(t->bias);
    zo_aligned_free(t->scratch);
    memset(t, 0, sizeof(*t));
}

void train_teacher_batch(train_teacher *t, uint64_t micro, float *x, float *y)
{
    const train_shape *s = &t->shape;
    size_t W = s->width, bw = s->batch * W;
    const float a = 1.7320508f; /* sqrt(3): unit variance */
    for (size_t i = 0; i < bw; i++)
        x[i] = uniform(s->seed + 2, micro * bw + i, a);
    const float *in = x;
    for (unsigned l = 0; l < s->layers; l++) {
        int last = l + 1 == s->layers;
        /* alternate between scratch and y so the last layer lands in y */
        float *dst = ((s->layers - 1 - l) % 2 == 0) ? y : t->scratch;
        for (size_t b = 0; b < s->batch; b++)
            memcpy(dst + b * W, t->bias + (size_t)l * W, W * sizeof(float));
        train_host_gemm(0, 1, s->batch, W, W, 1.0f, in, W, t->weight + (size_t)l * W * W, W, 1.0f, dst, W);
        if (!last)
            for (size_t i = 0; i < bw; i++)
                dst[i] = dst[i] > 0.0f ? dst[i] : 0.0f;
        in = dst;
    }
}
