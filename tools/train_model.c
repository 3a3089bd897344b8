/*
 * zo-train's model: an MLP regressing a random teacher (see train_model.h).
 * The student runs on a zo_dev (GEMMs on its compute stream); the teacher,
 * which only generates the data, on the host with OpenBLAS.
 */
#include "train_model.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
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

double train_shape_flops(const train_shape *s)
{
    double p = (double)s->layers * (double)s->width * (double)s->width;
    return 2.0 * (double)s->batch * p * 4.0; /* student forward 2BP + backward 4BP, teacher 2BP */
}

/* ---- the student ------------------------------------------------------------------------- */

static int dev_alloc(train_model *m, void *pp, size_t n)
{
    int r = zo_dev_malloc(m->dev, (void **)pp, n);
    if (r == 0)
        m->dev_bytes += n;
    return r;
}

int train_model_init(train_model *m, zo_dev *dev, const train_shape *s)
{
    memset(m, 0, sizeof(*m));
    m->shape = *s;
    m->dev = dev;
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
    if (r == 0)
        r = dev_alloc(m, &m->wf32, ww);
    if (r == 0)
        r = dev_alloc(m, &m->gf32, ww);
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
    if (r < 0)
        train_model_free(m);
    return r;
}

void train_model_free(train_model *m)
{
    if (m->s)
        zo_stream_sync(m->s); /* nothing queued may still use what is freed below */
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
    size_t ww = s->width * s->width, pes = zo_dtype_size(s->param_dtype);
    float a = sqrtf(6.0f / (float)s->width); /* He-uniform: variance 2 / W, ReLU keeps the scale */
    float *w = malloc(ww * sizeof(float));
    void *p = malloc(ww * pes);
    int r = w && p ? 0 : -ENOMEM;
    for (unsigned l = 0; l < s->layers && r == 0; l++) {
        for (size_t i = 0; i < ww; i++)
            w[i] = uniform(s->seed, (uint64_t)l * ww + i, a);
        zo_vec_cast(p, s->param_dtype, w, ZO_DTYPE_F32, ww);
        /* synchronous: the host buffers are reused by the next layer */
        if ((r = zo_memcpy_async(m->s, m->weight[l], p, ww * pes, ZO_COPY_H2D)) == 0 &&
            (r = zo_stream_sync(m->s)) == 0) {
            memset(w, 0, s->width * sizeof(float));
            zo_vec_cast(p, s->param_dtype, w, ZO_DTYPE_F32, s->width);
            if ((r = zo_memcpy_async(m->s, m->bias[l], p, s->width * pes, ZO_COPY_H2D)) == 0)
                r = zo_stream_sync(m->s);
        }
    }
    free(w);
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

/* ---- the elementwise parts: on the host through the staging buffers ---------------------- */
/* Each runs as a host function queued on the compute stream between a D2H
 * copy into ha/hb and an H2D copy back, so it stays in stream order. */

static void relu_fn(void *arg)
{
    train_model *m = arg;
    size_t n = m->shape.batch * m->shape.width;
    for (size_t i = 0; i < n; i++)
        m->ha[i] = m->ha[i] > 0.0f ? m->ha[i] : 0.0f;
}

/* hb = ha > 0 ? hb : 0 (ha: the layer's saved input, the output of the ReLU below) */
static void relu_backward_fn(void *arg)
{
    train_model *m = arg;
    size_t n = m->shape.batch * m->shape.width;
    for (size_t i = 0; i < n; i++)
        m->hb[i] = m->ha[i] > 0.0f ? m->hb[i] : 0.0f;
}

static int relu(train_model *m, float *x)
{
    size_t bytes = m->shape.batch * m->shape.width * sizeof(float);
    int r = zo_memcpy_async(m->s, m->ha, x, bytes, ZO_COPY_D2H);
    if (r == 0)
        r = zo_stream_host_fn(m->s, relu_fn, m);
    if (r == 0)
        r = zo_memcpy_async(m->s, x, m->ha, bytes, ZO_COPY_H2D);
    return r;
}

int train_forward(train_model *m, const float *x, const float *y, double *loss)
{
    const train_shape *s = &m->shape;
    size_t W = s->width, bw = s->batch * W;
    float *bias = m->gf32; /* the widened bias borrows the gradient scratch (free during forward) */
    int r = zo_memcpy_async(m->s, m->act[0], x, bw * sizeof(float), ZO_COPY_H2D);
    for (unsigned l = 0; l < s->layers && r == 0; l++) {
        int last = l + 1 == s->layers;
        float *dst = last ? m->out : m->act[l + 1];
        if ((r = zo_dev_cast(m->s, m->wf32, ZO_DTYPE_F32, m->weight[l], s->param_dtype, W * W)) == 0 &&
            (r = zo_dev_cast(m->s, bias, ZO_DTYPE_F32, m->bias[l], s->param_dtype, W)) == 0)
            r = linear(m, m->act[l], m->wf32, bias, dst);
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
static int hand_over(train_model *m, unsigned t, void *dev_grad, size_t n, train_grad_ready_fn ready, void *user)
{
    int r = zo_dev_cast(m->s, dev_grad, m->shape.grad_dtype, m->gf32, ZO_DTYPE_F32, n);
    if (r == 0)
        r = zo_event_record(m->ev[t], m->s);
    return r < 0 ? r : ready(user, t, dev_grad, m->ev[t]);
}

static int backward(train_model *m, const float *y, double loss_scale, train_grad_ready_fn ready, void *user)
{
    const train_shape *s = &m->shape;
    size_t W = s->width, B = s->batch, bw = B * W;
    /* d loss / d out = (out - y) / (B W), times the loss scale; ha holds the
     * output since forward's synchronized loss */
    float k = (float)(loss_scale / (double)bw);
    for (size_t i = 0; i < bw; i++)
        m->hb[i] = (m->ha[i] - y[i]) * k;
    int r = zo_memcpy_async(m->s, m->dy, m->hb, bw * sizeof(float), ZO_COPY_H2D);
    for (unsigned l = s->layers; l-- > 0 && r == 0;) {
        /* dW = dy^T x (W x W): the weight's gradient, handed over at once */
        TRY(zo_gemm_async(m->s, ZO_GEMM_T, ZO_GEMM_N, W, W, B, 1.0f, m->dy, W, m->act[l], W, ZO_DTYPE_F32, 0.0f,
                               m->gf32, W));
        TRY(hand_over(m, l, m->gweight[l], W * W, ready, user));
        /* db = column sums of dy = dy^T ones */
        TRY(zo_gemm_async(m->s, ZO_GEMM_T, ZO_GEMM_N, W, 1, B, 1.0f, m->dy, W, m->ones, 1, ZO_DTYPE_F32, 0.0f,
                               m->gf32, 1));
        TRY(hand_over(m, s->layers + l, m->gbias[l], W, ready, user));
        if (l == 0)
            break; /* no gradient for the inputs */
        /* dx = dy W, then through the ReLU of the layer below (its output is act[l]) */
        TRY(zo_dev_cast(m->s, m->wf32, ZO_DTYPE_F32, m->weight[l], s->param_dtype, W * W));
        TRY(zo_gemm_async(m->s, ZO_GEMM_N, ZO_GEMM_N, B, W, W, 1.0f, m->dy, W, m->wf32, W, ZO_DTYPE_F32, 0.0f,
                               m->dx, W));
        TRY(zo_memcpy_async(m->s, m->ha, m->act[l], bw * sizeof(float), ZO_COPY_D2H));
        TRY(zo_memcpy_async(m->s, m->hb, m->dx, bw * sizeof(float), ZO_COPY_D2H));
        TRY(zo_stream_host_fn(m->s, relu_backward_fn, m));
        r = zo_memcpy_async(m->s, m->dy, m->hb, bw * sizeof(float), ZO_COPY_H2D);
    }
    return r;
}

int train_backward(train_model *m, const float *y, double loss_scale, train_grad_ready_fn ready, void *user)
{
    int r = backward(m, y, loss_scale, ready, user);
    int r2 = zo_stream_sync(m->s); /* also on an error: nothing queued outlives this call */
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
