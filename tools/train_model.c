/*
 * zo-train's model: an MLP regressing a random teacher (see train_model.h).
 * Every matrix product goes through train_gemm(); everything else is a
 * simple loop over a batch x W matrix.
 */
#include "train_model.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/mem.h>
#include <zoffload/vec.h>

/* ---- the GEMM: the one function to move onto a device ------------------------------ */

void train_gemm(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                const float *b, size_t ldb, float beta, float *c, size_t ldc)
{
    /* Host backend: OpenBLAS. With zo_gemm_async() (branch tiling) this
     * becomes one call queued on the compute stream:
     *   zo_gemm_async(s, trans_a ? ZO_GEMM_T : ZO_GEMM_N, ..., ZO_DTYPE_F32, beta, c, ldc); */
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
    /* saved inputs of every layer, output, dy, dx; widened weight and fp32 gradient */
    return bw * ((uint64_t)s->layers + 3) + 2ull * s->width * s->width * 4;
}

double train_shape_flops(const train_shape *s)
{
    double p = (double)s->layers * (double)s->width * (double)s->width;
    return 2.0 * (double)s->batch * p * 4.0; /* student forward 2BP + backward 4BP, teacher 2BP */
}

/* ---- the student ------------------------------------------------------------------------- */

int train_model_init(train_model *m, const train_shape *s)
{
    memset(m, 0, sizeof(*m));
    m->shape = *s;
    size_t bw = s->batch * s->width * sizeof(float), ww = s->width * s->width * sizeof(float);
    m->act = calloc(s->layers, sizeof(float *));
    if (!m->act)
        return -ENOMEM;
    int r = 0;
    for (unsigned l = 0; l < s->layers && r == 0; l++)
        r = zo_aligned_alloc((void **)&m->act[l], bw, 64);
    if (r == 0)
        r = zo_aligned_alloc((void **)&m->dy, bw, 64);
    if (r == 0)
        r = zo_aligned_alloc((void **)&m->dx, bw, 64);
    if (r == 0)
        r = zo_aligned_alloc((void **)&m->out, bw, 64);
    if (r == 0)
        r = zo_aligned_alloc((void **)&m->wf32, ww, 64);
    if (r == 0)
        r = zo_aligned_alloc((void **)&m->gf32, ww, 64);
    if (r < 0) {
        train_model_free(m);
        return -ENOMEM;
    }
    return 0;
}

void train_model_free(train_model *m)
{
    if (m->act)
        for (unsigned l = 0; l < m->shape.layers; l++)
            zo_aligned_free(m->act[l]);
    free(m->act);
    zo_aligned_free(m->dy);
    zo_aligned_free(m->dx);
    zo_aligned_free(m->out);
    zo_aligned_free(m->wf32);
    zo_aligned_free(m->gf32);
    memset(m, 0, sizeof(*m));
}

void train_model_init_params(train_model *m)
{
    const train_shape *s = &m->shape;
    size_t ww = s->width * s->width;
    float a = sqrtf(6.0f / (float)s->width); /* He-uniform: variance 2 / W, ReLU keeps the scale */
    for (unsigned l = 0; l < s->layers; l++) {
        for (size_t i = 0; i < ww; i++)
            m->wf32[i] = uniform(s->seed, (uint64_t)l * ww + i, a);
        zo_vec_cast(m->weight[l], s->param_dtype, m->wf32, ZO_DTYPE_F32, ww);
        memset(m->gf32, 0, s->width * sizeof(float));
        zo_vec_cast(m->bias[l], s->param_dtype, m->gf32, ZO_DTYPE_F32, s->width);
    }
}

/* out[b][j] = sum_i in[b][i] * w[j][i] + bias[j]: one linear layer, W x W weight in
 * PyTorch's (out, in) layout */
static void linear(size_t batch, size_t width, const float *in, const float *w, const float *bias, float *out)
{
    for (size_t b = 0; b < batch; b++)
        memcpy(out + b * width, bias, width * sizeof(float));
    train_gemm(0, 1, batch, width, width, 1.0f, in, width, w, width, 1.0f, out, width);
}

static void relu(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

double train_forward(train_model *m, const float *x, const float *y)
{
    const train_shape *s = &m->shape;
    size_t bw = s->batch * s->width;
    float *bias = m->gf32; /* the widened bias borrows the gradient scratch (free during forward) */
    memcpy(m->act[0], x, bw * sizeof(float));
    for (unsigned l = 0; l < s->layers; l++) {
        zo_vec_cast(m->wf32, ZO_DTYPE_F32, m->weight[l], s->param_dtype, s->width * s->width);
        zo_vec_cast(bias, ZO_DTYPE_F32, m->bias[l], s->param_dtype, s->width);
        int last = l + 1 == s->layers;
        float *dst = last ? m->out : m->act[l + 1];
        linear(s->batch, s->width, m->act[l], m->wf32, bias, dst);
        if (!last)
            relu(dst, bw);
    }
    double sum = 0;
    for (size_t i = 0; i < bw; i++) {
        double d = (double)m->out[i] - (double)y[i];
        sum += d * d;
    }
    return 0.5 * sum / (double)bw;
}

int train_backward(train_model *m, const float *y, double loss_scale, train_grad_ready_fn ready, void *user)
{
    const train_shape *s = &m->shape;
    size_t W = s->width, B = s->batch, bw = B * W;
    /* d loss / d out = (out - y) / (B W), times the loss scale */
    float k = (float)(loss_scale / (double)bw);
    for (size_t i = 0; i < bw; i++)
        m->dy[i] = (m->out[i] - y[i]) * k;
    for (unsigned l = s->layers; l-- > 0;) {
        /* dW = dy^T x (W x W): the weight's gradient, handed over at once */
        train_gemm(1, 0, W, W, B, 1.0f, m->dy, W, m->act[l], W, 0.0f, m->gf32, W);
        zo_vec_cast(m->gweight[l], s->grad_dtype, m->gf32, ZO_DTYPE_F32, W * W);
        int r = ready(user, l, m->gweight[l]);
        if (r < 0)
            return r;
        /* db = column sums of dy */
        for (size_t j = 0; j < W; j++)
            m->gf32[j] = 0.0f;
        for (size_t b = 0; b < B; b++)
            for (size_t j = 0; j < W; j++)
                m->gf32[j] += m->dy[b * W + j];
        zo_vec_cast(m->gbias[l], s->grad_dtype, m->gf32, ZO_DTYPE_F32, W);
        if ((r = ready(user, s->layers + l, m->gbias[l])) < 0)
            return r;
        if (l == 0)
            break; /* no gradient for the inputs */
        /* dx = dy W, then through the ReLU of the layer below (its output is act[l]) */
        zo_vec_cast(m->wf32, ZO_DTYPE_F32, m->weight[l], s->param_dtype, W * W);
        train_gemm(0, 0, B, W, W, 1.0f, m->dy, W, m->wf32, W, 0.0f, m->dx, W);
        for (size_t i = 0; i < bw; i++)
            m->dy[i] = m->act[l][i] > 0.0f ? m->dx[i] : 0.0f;
    }
    return 0;
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
        linear(s->batch, W, in, t->weight + (size_t)l * W * W, t->bias + (size_t)l * W, dst);
        if (!last)
            relu(dst, bw);
        in = dst;
    }
}
