/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model zo-train trains: a stack of L square linear layers (width W,
 * weights W x W plus a bias) with ReLU between them, regressing the output
 * of a fixed random "teacher" network of the same shape under a mean
 * squared error. The teacher's weights are bf16 values, so a student with
 * the same shape can represent it exactly: the loss floor is 0.
 *
 * All the math is here, in fp32 on a zo_dev: GEMMs through zo_gemm_async()
 * on the model's compute stream (OpenBLAS on the host backend, cuBLAS on
 * CUDA). The parameters and gradients the optimizer engine sees live in
 * device buffers in the engine's param / grad dtypes; the model widens a
 * layer's weights to fp32 into a device scratch buffer when it needs them
 * (zo_dev_cast) and narrows each gradient into its device buffer as soon as
 * backward has produced it, recording an event the engine's copy waits for.
 *
 * Not part of the library: a tool helper.
 */
#ifndef ZO_TRAIN_MODEL_H
#define ZO_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <zoffload/common.h>
#include <zoffload/dev.h>
#include <zoffload/store.h>
#include <zoffload/tiling.h>

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

/* Device memory the model's forward/backward needs besides params and
 * grads: the saved layer inputs, the output, two batch-sized scratch
 * matrices, two W x W fp32 scratch matrices (the widened weight and the fp32
 * gradient) and the ones vector. */
uint64_t train_shape_activation_bytes(const train_shape *s);

/* FLOPs of one micro-step: forward 2BP, backward 4BP (plus the teacher's 2BP). */
double train_shape_flops(const train_shape *s);

/*
 * C = alpha * op(A) * op(B) + beta * C on the host, row-major fp32 (OpenBLAS).
 * Only the teacher uses it: it generates the data, it is not the model.
 */
void train_host_gemm(int trans_a, int trans_b, size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                     const float *b, size_t ldb, float beta, float *c, size_t ldc);

/* Device bytes of the model besides its weights when every layer is tiled:
 * activations and scratch (as above, without the W x W matrices), the
 * fp32 bias scratch, and the biases' params and grads. The tiled layers'
 * working memory (zo_tile_grid.work_bytes each) comes on top. */
uint64_t train_shape_tiled_rest_bytes(const train_shape *s);

/* Where backward hands each gradient (see train_backward()). */
typedef int (*train_grad_ready_fn)(void *user, unsigned tensor, const void *dev_grad, zo_event *ready,
                                   const void *host_grad);

/* Device bytes of the untiled model: params, grads, activations and scratch. */
uint64_t train_shape_device_bytes(const train_shape *s);

/*
 * The tiling rule zo-train follows and zo-plan predicts: a model whose
 * untiled device bytes exceed `budget` gets every layer tiled; what is left
 * of the budget after train_shape_tiled_rest_bytes() is split evenly over
 * the layers, and each layer's grid is zo_tile_plan(batch, W, W, f32,
 * layer budget, ZO_TILE_TRAIN).
 * @return 0 (fits untiled: nothing set), 1 (tiled: *layer_budget and
 *         *grid set), ZO_EBUDGET (not even tiled: the rest alone is over
 *         the budget, or zo_tile_plan() refused; *layer_budget set), or
 *         another error of zo_tile_plan().
 */
int train_plan_tiles(const train_shape *s, uint64_t budget, uint64_t *layer_budget, zo_tile_grid *grid);

/* Tiled layers (docs/tiling.md "In zo-train"): every layer's weight homed
 * in a store as a grid of fp32 tiles and streamed through a
 * zo_tiled_linear within `budget` device bytes of working memory per layer.
 * Each tile is a tensor of its own for the optimizer engine. */
typedef struct train_tiling {
    zo_store *store;
    zo_tier home;         /* ZO_TIER_HOST (pinned) or ZO_TIER_NVME */
    uint64_t layer_budget; /* device working memory of one layer (zo_tile_plan) */
    const char *prefix;   /* store names "<prefix><l>": tiles "<prefix><l>.w.<r>.<c>" */
} train_tiling;

/* A model instance on a device. The device tensors of parameters and
 * gradients (in the configured dtypes) are owned by the caller (allocated on
 * the same zo_dev); the activations, the fp32 scratch and the compute stream
 * are the model's. Every GEMM is a zo_gemm_async() on the compute stream;
 * the dtype conversions are zo_dev_cast(); the bias add and its gradient are
 * GEMMs with a ones vector, the ReLU and its backward zo_dev_relu_mask().
 * The loss and its gradient run on the host through a staging copy (the
 * output D2H into a registered host buffer, which the loss needs on the
 * host anyway; the gradient H2D back), in stream order. */
typedef struct train_model {
    train_shape shape;
    zo_dev *dev;
    zo_stream *s;                    /* the compute stream */
    zo_event **ev;                   /* [2 layers] gradient-ready events, one per tensor */
    void **weight, **bias;           /* [layers] device params (caller's) */
    void **gweight, **gbias;         /* [layers] device grads (caller's) */
    float **act;                     /* [layers] device: saved input of each layer, batch x W */
    float *dy, *dx;                  /* device: batch x W backward scratch */
    float *wf32, *gf32;              /* device: W x W widened weight, fp32 gradient */
    float *out;                      /* device: batch x W model output */
    float *ones;                     /* device: batch ones (bias broadcast, bias gradient) */
    float *ha, *hb;                  /* host staging, batch x W each (registered with dev) */
    uint64_t dev_bytes;              /* device bytes the model allocated (tiled layers included) */
    /* tiled layers (NULL tl: every weight is one device tensor, tiles 1) */
    zo_store *store;
    zo_tiled_linear **tl;            /* [layers] */
    zo_tile_grid grid;               /* the grid of every layer (all are W x W) */
    unsigned tiles;                  /* weight tensors per layer: 1, or the grid's tiles */
    struct train_tile_sink *sinks;   /* [layers] dW sink contexts */
    float *htile;                    /* host: one fp32 tile (dW staging, weight refresh) */
    void *htile_g;                   /* host: one tile in grad_dtype */
    train_grad_ready_fn ready;      /* during backward: where gradients go */
    void *ready_user;
} train_model;

/* The model's tensors: weights (per layer one, or its tiles in row-major
 * order) 0..layers*tiles-1, then the biases. */
static inline unsigned train_model_ntensors(const train_model *m)
{
    return m->shape.layers * m->tiles + m->shape.layers;
}
/* Elements of tensor t. */
uint64_t train_model_numel(const train_model *m, unsigned t);
/* The student's initial value of tensor t, rounded to param_dtype, into dst. */
void train_model_initial(const train_model *m, unsigned t, void *dst);
/* Tiled weight tensor t (t < layers * tiles): write its tile from param
 * values (param_dtype, widened to fp32 in the store) / read it back as
 * fp32. Blocks. @return 0 or a store error. */
int train_model_tile_set(train_model *m, unsigned t, const void *param);
int train_model_tile_get(train_model *m, unsigned t, float *dst);

/* Allocate the model's own device scratch, staging and stream on dev, and
 * with `tiling` (NULL: none) its tiled layers. The parameter / gradient
 * pointer arrays must be set by the caller (tiled: biases only).
 * @return 0, -ENOMEM (also: device memory), a device error, or an error
 *         of zo_tiled_linear_create() (ZO_EBUDGET...; detail printed). */
int train_model_init(train_model *m, zo_dev *dev, const train_shape *s, const train_tiling *tiling);
void train_model_free(train_model *m);

/* Write the student's initial parameters into the device params (He-uniform
 * weights, zero biases), rounded to param_dtype. Deterministic in seed.
 * Blocks. @return 0, -ENOMEM or a device error. */
int train_model_init_params(train_model *m);

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

/* Forward from x (host, batch x W; copied into the first saved input):
 * *loss = 0.5 * mean((out - y)^2) over batch * W elements (y: host). Blocks
 * until the loss is known. @return 0 or a device error. */
int train_forward(train_model *m, const float *x, const float *y, double *loss);

/* train_grad_ready_fn: called by train_backward() as soon as one tensor's gradient is queued
 * into its device buffer: `tensor` is the model's tensor index (see
 * train_model_ntensors()); the gradient is valid once `ready` (an
 * event on the compute stream) completes. A tiled weight's tile comes
 * instead as host_grad (dev_grad and ready NULL): grad_dtype host memory,
 * valid during the call only (staged from the tile's dW as the tiled
 * backward produces it). Returning < 0 stops backward. */

/* Backward of the last forward against targets y, with the loss multiplied
 * by loss_scale (fp16 loss scaling). Goes from the last layer to the first;
 * each gradient is narrowed into its device buffer and announced through
 * ready() at once with its event, so the optimizer can start moving it
 * while backward goes on with the layers below. Returns once the work is
 * queued and the stream synchronized. @return 0, ready()'s error or a
 * device error. */
int train_backward(train_model *m, const float *y, double loss_scale, train_grad_ready_fn ready, void *user);

#endif
