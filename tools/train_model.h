/*
 * The model zo-train trains: a stack of L square linear layers (width W,
 * weights W x W plus a bias) with ReLU between them, regressing the output
 * of a fixed random "teacher" network of the same shape under a mean
 * squared error. The teacher's weights are bf16 values, so a student with
 * the same shape can represent it exactly: the loss floor is 0.
 *
 * All the math is here, in fp32 on top of one GEMM function
 * (train_gemm()), so that moving it onto a device backend's GEMM
 * (zo_gemm_async() on a stream) changes one function. The parameters and
 * gradients the optimizer engine sees live in "device" buffers in the
 * engine's param / grad dtypes; the model widens a layer's weights to fp32
 * into a scratch buffer when it needs them and narrows each gradient into
 * its device buffer as soon as backward has produced it.
 *
 * Not part of the library: a tool helper.
 */
#ifndef ZO_TRAIN_MODEL_H
#define ZO_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <zoffload/common.h>

/* Shape and precisions of the model. */
typedef struct train_shape {
    unsigned layers;      /* L >= 1 */
    size_t width;         /* W >= 1: every layer is W -> W */
    size_t batch;         /* samples per micro-step */
    zo_dtype param_dtype; /* device parameters: bf16, f16 or f32 */
    zo_dtype grad_dtype;  /* device gradients: bf16, f16 or f32 */
    uint64_t seed;        /* student init; the teacher and the data use seed + 1, seed + 2 */
} train_shape;

/* Parameters of one model: per layer a weight (W*W) and a bias (W). */
static inline uint64_t train_shape_params(const train_shape *s)
{
    return (uint64_t)s->layers * ((uint64_t)s->width * s->width + s->width);
}

/* Host memory the model's forward/backward needs besides params and grads:
 * the saved layer inputs, two batch-sized scratch matrices and two W x W
 * fp32 scratch matrices (the widened weight and the fp32 gradient). */
uint64_t train_shape_activation_bytes(const train_shape *s);

/* FLOPs of one micro-step: forward 2BP, backward 4BP (plus the teacher's 2BP). */
double train_shape_flops(const train_shape *s);

/*
 * C = alpha * op(A) * op(B) + beta * C, row-major fp32, op(A) m x k, op(B)
 * k x n (the argument order of zo_gemm_async()). The one place the model
 * calls a GEMM.
 */
void train_gemm(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                const float *b, size_t ldb, float beta, float *c, size_t ldc);

/* A model instance: the "device" tensors (parameters and gradients, in the
 * configured dtypes) are owned by the caller (allocated on its zo_dev), the
 * rest by the model. */
typedef struct train_model {
    train_shape shape;
    void **weight, **bias;           /* [layers] device params (caller's) */
    void **gweight, **gbias;         /* [layers] device grads (caller's) */
    float **act;                     /* [layers] saved input of each layer, batch x W */
    float *dy, *dx;                  /* batch x W backward scratch */
    float *wf32, *gf32;              /* W x W: widened weight, fp32 gradient */
    float *out;                      /* batch x W: model output */
} train_model;

/* Allocate the model's own scratch. The device pointer arrays must be set by
 * the caller. @return 0 or -ENOMEM. */
int train_model_init(train_model *m, const train_shape *s);
void train_model_free(train_model *m);

/* Write the student's initial parameters into the device params (He-uniform
 * weights, zero biases), rounded to param_dtype. Deterministic in seed. */
void train_model_init_params(train_model *m);

/* The teacher: the same stack with its own weights (bf16-exact fp32) and the
 * inputs of each micro-step, generated from the step index. */
typedef struct train_teacher {
    train_shape shape;
    float *weight;  /* layers * W * W, bf16-exact */
    float *bias;    /* layers * W */
    float *scratch; /* batch x W */
} train_teacher;

int train_teacher_init(train_teacher *t, const train_shape *s);
void train_teacher_free(train_teacher *t);
/* The batch of micro-step `micro` (0-based, global): inputs x (batch x W,
 * uniform with unit variance) and targets y = teacher(x). */
void train_teacher_batch(train_teacher *t, uint64_t micro, float *x, float *y);

/* Forward from x (batch x W; copied into the first saved input), returns the
 * loss 0.5 * mean((out - y)^2) over batch * W elements. */
double train_forward(train_model *m, const float *x, const float *y);

/* Called by train_backward() as soon as one tensor's gradient is in its
 * device buffer: `tensor` is the model's tensor index (weights 0..L-1, then
 * biases L..2L-1). Returning < 0 stops backward with that error. */
typedef int (*train_grad_ready_fn)(void *user, unsigned tensor, const void *dev_grad);

/* Backward of the last forward against targets y, with the loss multiplied
 * by loss_scale (fp16 loss scaling). Goes from the last layer to the first;
 * each gradient is narrowed into its device buffer and announced through
 * ready() at once, so the optimizer can start moving it while backward goes
 * on with the layers below. @return 0 or ready()'s error. */
int train_backward(train_model *m, const float *y, double loss_scale, train_grad_ready_fn ready, void *user);

#endif
