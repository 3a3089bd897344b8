/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file cpuadam.h
 * @brief CPU optimizers (AdamW, Adam, Adagrad, Lion) on host memory, at
 *        memory-bandwidth speed: run-time dispatched scalar / AVX2+FMA+F16C /
 *        AVX-512 / AVX-512+BF16 kernels, OpenMP threads, fused gradient
 *        unscale + clip, fused low-precision copy of the updated parameters,
 *        a gradient statistics pass, and a rollback of one Adam(W) step.
 *
 * The kernels work on one flat slice at a time: `n` fp32 master parameters,
 * their gradients (fp32, fp16 or bf16), their optimizer states (fp32 or
 * bf16) and, optionally, a separate buffer that receives the updated
 * parameters as bf16 or fp16 (the copy that goes back to the GPU) in the
 * same pass. A ZeRO-Offload step calls them once per sub-group slice.
 *
 * No hidden state: hyperparameters and the step number travel with every
 * call in a ::zo_cpuadam_hparams, the tensors in a ::zo_cpuadam_tensors. Any
 * number of independent optimizers can share the library; every function is
 * thread-safe and may run concurrently on disjoint tensors.
 *
 * Two ways to call:
 *  - plain functions (zo_cpuadam_step(), zo_cpuadam_rollback(),
 *    zo_cpuadam_grad_stats()) take the thread count per call and use the
 *    fastest variant the CPU flags allow (zo_cpu_flags(), so ZO_CPU_MASK and
 *    zo_cpu_set_mask() lower it);
 *  - a ::zo_cpuadam_team handle fixes the thread count, optionally pins the
 *    OpenMP team to CPUs (zo_topo_bind_omp()), and can pin a variant by name.
 *
 * Numerics (see docs/cpuadam.md for the full statement):
 *  - AdamW follows torch.optim.AdamW: decoupled decay p *= 1 - lr*wd, bias
 *    correction 1 - beta^step, eps added outside the square root after the
 *    bias correction. Adam (L2 mode) adds wd*p to the gradient. Adagrad
 *    follows torch.optim.Adagrad (weight decay added to the gradient; the
 *    caller passes the already-decayed learning rate). Lion follows the
 *    paper / lion-pytorch / DeepSpeed: sign(beta1*m + (1-beta1)*g).
 *  - Every variant gives bit-identical fp32 results (parameters and fp32
 *    states) to the C reference: the reference uses a fused multiply-add
 *    (fmaf) at exactly the five places the SIMD kernels do, and every other
 *    operation is correctly rounded in both (::ZO_CPUADAM_ULP_BOUND is 0).
 *    Against torch's own fp32 arithmetic, which rounds every operation,
 *    results differ by a few ulps (docs/cpuadam.md states and tests it).
 *  - bf16/fp16 outputs and bf16 states are rounded to nearest, ties to even;
 *    NaN stays NaN, inf stays inf, fp16 overflow gives inf. The avx512bf16
 *    variant converts with VCVTNEPS2BF16, which flushes fp32 subnormal
 *    inputs (|x| < 2^-126) to a zero of the same sign (as zo_vec_cast()).
 *  - inf/NaN in a gradient propagate into the element's states. Adam,
 *    AdamW and Adagrad make the parameter NaN or inf too. Lion moves the
 *    parameter by sign(update) * lr, as torch's sign() does: a +/-inf
 *    gradient makes exp_avg +/-inf but moves the parameter by -/+lr only (it
 *    stays finite, and so do later steps until exp_avg meets an inf of the
 *    other sign), while a NaN gradient makes the parameter NaN. Every variant
 *    does the same, bit for bit. Check first with zo_cpuadam_grad_stats().
 *
 * Threads: OpenMP (when built with it); each thread owns one contiguous,
 * 64-element-aligned range and walks it in tiles. Slices too small to
 * repay a fork run in the calling thread. Called from inside an OpenMP
 * parallel region, a call runs with the team OpenMP gives it (one thread
 * unless nested parallelism is enabled).
 */
#ifndef ZOFFLOAD_CPUADAM_H
#define ZOFFLOAD_CPUADAM_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The optimizers. */
typedef enum zo_optim_kind {
    ZO_OPTIM_ADAMW = 0,   /**< Adam with decoupled weight decay (torch.optim.AdamW) */
    ZO_OPTIM_ADAM = 1,    /**< Adam, weight decay as L2 on the gradient (torch.optim.Adam) */
    ZO_OPTIM_ADAGRAD = 2, /**< Adagrad (torch.optim.Adagrad, lr_decay folded into lr) */
    ZO_OPTIM_LION = 3,    /**< Lion (Chen et al. 2023) */
    ZO_OPTIM_KIND_COUNT
} zo_optim_kind;

/**
 * Largest difference, in units in the last place, between any variant and
 * the C reference for fp32 results (parameters and fp32 states): 0, they
 * are bit-identical (NaN payloads aside). bf16 states and bf16 outputs of
 * the avx512bf16 variant differ only where VCVTNEPS2BF16 flushes an fp32
 * subnormal to zero. The tests enforce it.
 */
#define ZO_CPUADAM_ULP_BOUND 0

/**
 * Hyperparameters of one step. Fill with zo_cpuadam_hparams_default(), then
 * change what you need; pass it on every call (the library keeps nothing).
 *
 * Per element, with g = grad * grad_scale * clip_coef (one fp32 multiplier)
 * and t = step:
 *  - AdamW:   p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
 *             p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
 *  - Adam:    g += wd*p, then as AdamW without the decoupled decay
 *  - Adagrad: g += wd*p; v += g*g; p -= lr * g / (sqrt(v) + eps)
 *             (v is the "state sum"; m is not used)
 *  - Lion:    c = b1*m + (1-b1)*g; p *= 1 - lr*wd; p -= lr * sign(c);
 *             m = b2*m + (1-b2)*g   (v is not used; sign(0) = 0)
 * Without bias correction the 1 - b^t factors are 1.
 *
 * The values are doubles, as callers from Python hold them: the per-step
 * scalars (1 - beta, lr / (1 - beta1^t), 1 - lr*wd, grad_scale * clip_coef,
 * ...) are computed in double and rounded to fp32 once, as torch does.
 * (With fp32 betas, 1 - 0.999f would differ from torch's 0.001 by 1.3e-5.)
 */
typedef struct zo_cpuadam_hparams {
    size_t struct_size;     /**< sizeof(zo_cpuadam_hparams), set by the default function */
    zo_optim_kind kind;     /**< which optimizer */
    double lr;              /**< learning rate, finite, >= 0 */
    double beta1;           /**< Adam/AdamW: first-moment decay in [0, 1); Lion: interpolation in [0, 1] */
    double beta2;           /**< Adam/AdamW: second-moment decay in [0, 1); Lion: momentum decay in [0, 1] */
    double eps;             /**< added to the denominator, finite, >= 0 (Adam/AdamW/Adagrad) */
    double weight_decay;    /**< finite, >= 0; meaning depends on kind (see above) */
    int bias_correction;    /**< Adam/AdamW: 1 (default) applies 1 - beta^step, 0 does not */
    int64_t step;           /**< 1-based number of this update; >= 1 */
    double grad_scale;      /**< gradient pre-scale, typically 1 / loss_scale; finite, > 0 */
    double clip_coef;       /**< gradient clip coefficient, min(1, max_norm / norm); finite, > 0 */
} zo_cpuadam_hparams;

/**
 * Fill `hp` with the defaults of `kind` (the torch / DeepSpeed defaults):
 *  - AdamW: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2;
 *  - Adam: the same with weight_decay 0;
 *  - Adagrad: lr 1e-2, eps 1e-10, weight_decay 0;
 *  - Lion: lr 1e-4, betas (0.9, 0.99), weight_decay 0;
 * and bias_correction 1, step 1, grad_scale 1, clip_coef 1.
 * @return 0, or -EINVAL (hp NULL, unknown kind).
 */
ZO_API int zo_cpuadam_hparams_default(zo_cpuadam_hparams *hp, zo_optim_kind kind);

/**
 * The tensors of one slice. Fill with zo_cpuadam_tensors_default(), then
 * set pointers, types and n.
 *
 * Buffers need the natural alignment of their element type only (4 bytes
 * for fp32, 2 for 16-bit types); 64-byte alignment is faster. They must
 * not overlap each other. The caller owns every buffer; the call reads and
 * writes them only while it runs.
 */
typedef struct zo_cpuadam_tensors {
    size_t struct_size;     /**< sizeof(zo_cpuadam_tensors) */
    size_t n;               /**< elements, >= 1 */
    float *param;           /**< fp32 master parameters, updated in place */
    const void *grad;       /**< gradients, read only */
    zo_dtype grad_dtype;    /**< ZO_DTYPE_F32, ZO_DTYPE_F16 or ZO_DTYPE_BF16 */
    void *exp_avg;          /**< m: Adam/AdamW/Lion first moment; unused (may be NULL) for Adagrad */
    void *exp_avg_sq;       /**< v: Adam/AdamW second moment, Adagrad state sum; unused for Lion */
    zo_dtype state_dtype;   /**< ZO_DTYPE_F32 or ZO_DTYPE_BF16, for both states */
    void *param_out;        /**< NULL, or receives the updated parameters as out_dtype */
    zo_dtype out_dtype;     /**< ZO_DTYPE_BF16 or ZO_DTYPE_F16 (or ZO_DTYPE_F32) when param_out is set */
} zo_cpuadam_tensors;

/**
 * Fill `t` with empty pointers, n = 0, fp32 gradients and states, and
 * bf16 output type (used only when param_out is set).
 * @return 0, or -EINVAL (t NULL).
 */
ZO_API int zo_cpuadam_tensors_default(zo_cpuadam_tensors *t);

/** Result of zo_cpuadam_grad_stats(). */
typedef struct zo_grad_stats {
    double sumsq;       /**< sum of grad[i]^2 in double (inf/NaN when an element is non-finite) */
    uint64_t nonfinite; /**< number of elements that are inf or NaN */
} zo_grad_stats;

/**
 * One optimizer step on one slice, with `nthreads` OpenMP threads and the
 * variant zo_cpu_flags() selects.
 *
 * @param hp        hyperparameters and step number (see ::zo_cpuadam_hparams)
 * @param t         the slice (see ::zo_cpuadam_tensors)
 * @param nthreads  threads to use, >= 1 (fewer are used for small slices)
 * @return 0; -EINVAL (NULL hp/t/param/grad/needed state, n = 0 or
 *         > SIZE_MAX / 8, nthreads < 1 or > 1024, struct_size not that of
 *         zo_cpuadam_tensors_default(), misaligned or overlapping buffers);
 *         ZO_ECONFIG (a hyperparameter out of range: the detail names it);
 *         ZO_ENOTSUP (unsupported dtype combination).
 * Thread-safe; blocks until the slice is done.
 */
ZO_API int zo_cpuadam_step(const zo_cpuadam_hparams *hp, const zo_cpuadam_tensors *t, int nthreads);

/**
 * Undo one Adam or AdamW step: given the parameters and states after step
 * `hp->step` and the same gradients and hyperparameters that step used,
 * restore the parameters and states from before it (and rewrite
 * param_out, if set, from the restored parameters). For speculative
 * steps that must be taken back (overflow or clipping discovered late).
 *
 * Numerical limits: the restore is exact in real arithmetic but not in
 * floating point. m and v are recovered by dividing by beta1 and beta2,
 * which amplifies the rounding of the forward step: m comes back within a
 * few ulps of max(|m|, (1-beta1)|g|) / beta1, v within a few ulps of
 * max(v, (1-beta2) g^2) / beta2 (clamped at 0), so a v much smaller than
 * (1-beta2) g^2 (early steps) comes back with a large relative error.
 * With beta1 = 0 (or beta2 = 0) the old state is irrelevant to any later
 * step and is set to 0. Parameters come back within a few ulps of
 * max(|p|, |update|) / (1 - lr*wd). A step whose gradient or result was
 * non-finite cannot be undone. fp32 states only.
 *
 * @return as zo_cpuadam_step(), plus ZO_ENOTSUP (Adagrad, Lion, bf16
 *         states) and ZO_ECONFIG (AdamW with lr*wd >= 1: the decay lost
 *         the parameters).
 */
ZO_API int zo_cpuadam_rollback(const zo_cpuadam_hparams *hp, const zo_cpuadam_tensors *t, int nthreads);

/**
 * Sum of squares and inf/NaN count of a gradient slice in one
 * multi-threaded pass (for global-norm clipping and overflow checks).
 * Sum the `sumsq` of all slices, then norm = sqrt(sum) * grad_scale.
 * Squares are exact in double and summed in double lanes; the result is
 * deterministic for a given n, thread count and variant.
 * @return 0; -EINVAL (NULL, n = 0 or > SIZE_MAX / 8 or running past the end
 *         of the address space, nthreads < 1 or > 1024, misaligned); ZO_ENOTSUP (type);
 *         -ENOMEM (more than 8 threads and no memory for their partial sums).
 * Thread-safe; blocks.
 */
ZO_API int zo_cpuadam_grad_stats(const void *grad, zo_dtype type, size_t n, int nthreads,
                                 zo_grad_stats *out);

/**
 * The in-place streaming bound kernel: a[i] += alpha*d[i], b[i] +=
 * alpha*d[i], c[i] += alpha*d[i] (reads 4 fp32 arrays, writes 3 in place:
 * 28 bytes per element, the traffic of an fp32 AdamW step) with the same
 * threading and tiling as the optimizer kernels. zo-adam-bench runs it on
 * the optimizer's own arrays to measure the bound the step is held to.
 * @return 0, -EINVAL (NULL, n = 0 or > SIZE_MAX / 8, nthreads < 1 or > 1024,
 *         misaligned, overlap).
 */
ZO_API int zo_cpuadam_stream_bound(float *a, float *b, float *c, const float *d, float alpha,
                                   size_t n, int nthreads);

/** Name of the variant zo_cpu_flags() selects now: "scalar", "avx2",
 *  "avx512" or "avx512bf16" on x86-64, "scalar" or "neon" on aarch64.
 *  Thread-safe. */
ZO_API const char *zo_cpuadam_variant(void);

/**
 * Whether variant `name` ("scalar", "avx2", "avx512", "avx512bf16", "neon")
 * can run on this CPU under the current mask. Every name is known on every
 * architecture: one built only for another architecture answers 0.
 * @return 1 yes, 0 no (CPU, mask or architecture lacks it), -EINVAL
 *         (unknown name).
 */
ZO_API int zo_cpuadam_variant_available(const char *name);

/**
 * The i-th cpuadam variant built into this library, slowest first (0 is
 * "scalar"); `needs` (if not NULL) gets the ZO_CPU_* flags it needs.
 * @return its name, or NULL when i is past the last. Thread-safe.
 */
ZO_API const char *zo_cpuadam_variant_at(unsigned i, unsigned *needs);

/* ------------------------------------------------------------------------ */
/** @name Low-bit optimizer states (q8, q4): block-wise quantized moments */
/**@{*/

/**
 * A code map: the sorted fp32 values a 4- or 8-bit code stands for, scaled
 * by its block's absmax (Dettmers et al., "8-bit Optimizers via Block-wise
 * Quantization"). The first moment m needs a signed map, the second moment
 * v (never negative) an unsigned one.
 *
 *  - DYNAMIC: bitsandbytes' create_dynamic_map() (max_exponent_bits 7 for
 *    8 bits; 3 for 4 bits, as torchao's 4-bit optimizers): a decimal
 *    exponent and a linear fraction, so small values keep relative
 *    precision. Signed: 127 negative values, 0, 127 positive values and
 *    1.0 (8 bits); 7, 0, 7 and 1.0 (4 bits). Unsigned: 0, 254 (14) positive
 *    values and 1.0.
 *  - LINEAR: evenly spaced. Signed: (k - 127) / 127 for k = 0..254 (code
 *    255 is not produced and reads as 1.0); 4 bits: (k - 7) / 7, k = 0..14.
 *    Unsigned: k / 255 (k / 15).
 *  - The zero-free unsigned maps, for v (Li et al., "Memory Efficient
 *    Optimizers with 4-bit States", NeurIPS 2023, the "zero-point
 *    problem"): a v that a map with a 0 rounds to 0 in a block with a large
 *    absmax makes m / (sqrt(v) + eps) huge; without a 0 every v reads at
 *    least the smallest entry times absmax. DYNAMIC_UNSIGNED_NZ: the
 *    DYNAMIC_UNSIGNED values without the 0 (255 codes for 8 bits, 15 for
 *    4; the last code is not produced and reads as 1.0). LINEAR_UNSIGNED_NZ:
 *    (k + 1) / 256 for k = 0..255 ((k + 1) / 16, k = 0..15): 1/16 at the
 *    bottom for 4 bits. A zero still quantizes to the smallest code, and a
 *    block of zeros (absmax 0) still reads 0.
 *
 * The tables are computed in double and rounded once to fp32
 * (docs/cpuadam.md, "Low-bit states", gives the formulas; the Python test
 * rebuilds them independently).
 */
typedef enum zo_qmap {
    ZO_QMAP_DYNAMIC_SIGNED = 0,   /**< default for m */
    ZO_QMAP_DYNAMIC_UNSIGNED = 1, /**< default for v */
    ZO_QMAP_LINEAR_SIGNED = 2,
    ZO_QMAP_LINEAR_UNSIGNED = 3,
    ZO_QMAP_DYNAMIC_UNSIGNED_NZ = 4, /**< unsigned, no zero */
    ZO_QMAP_LINEAR_UNSIGNED_NZ = 5,  /**< unsigned, no zero: (k + 1) / 2^bits */
    ZO_QMAP_COUNT
} zo_qmap;

/** Largest block size (elements per absmax scale) the kernels accept. */
#define ZO_QBLOCK_MAX 4096

/**
 * The tensors of one slice with quantized moments. Fill with
 * zo_cpuadam_qtensors_default(), then set pointers and n.
 *
 * Layout of one moment of n elements with block size B:
 *  - codes: 8 bits: n bytes, code i in byte i; 4 bits: (n + 1) / 2 bytes,
 *    code i in the low nibble of byte i / 2 when i is even, the high nibble
 *    when odd (an odd n leaves the last high nibble 0);
 *  - absmax: ceil(n / B) floats, block b covering elements [b*B, b*B + B):
 *    value i = map[code i] * absmax[i / B].
 *
 * Fresh moments: every code 0 and every absmax 0 (any code times 0 reads
 * 0), or zo_cpuadam_quantize() of zeros.
 */
typedef struct zo_cpuadam_qtensors {
    size_t struct_size;     /**< sizeof(zo_cpuadam_qtensors) */
    size_t n;               /**< elements, >= 1 */
    float *param;           /**< fp32 master parameters, updated in place */
    const void *grad;       /**< gradients: ZO_DTYPE_F32, F16 or BF16 */
    zo_dtype grad_dtype;    /**< default ZO_DTYPE_F32 */
    int bits;               /**< 8 (default) or 4 */
    size_t block;           /**< elements per scale: a multiple of 64 in [64, ZO_QBLOCK_MAX]; 0 (default): 256 for 8 bits, 128 for 4 */
    zo_qmap map_m;          /**< m's map, signed (default ZO_QMAP_DYNAMIC_SIGNED) */
    zo_qmap map_v;          /**< v's map, unsigned (default ZO_QMAP_DYNAMIC_UNSIGNED) */
    uint8_t *m_codes;       /**< m codes (Adam, AdamW, Lion) */
    float *m_absmax;        /**< m scales */
    uint8_t *v_codes;       /**< v codes (Adam, AdamW; unused by Lion) */
    float *v_absmax;        /**< v scales */
    void *param_out;        /**< NULL, or receives the updated parameters as out_dtype */
    zo_dtype out_dtype;     /**< ZO_DTYPE_BF16 (default), F16 or F32 */
} zo_cpuadam_qtensors;

/**
 * Fill `t`: NULL pointers, n = 0, fp32 gradients, 8 bits, block 0 (the
 * default), dynamic maps, bf16 out type.
 * @return 0, or -EINVAL (t NULL).
 */
ZO_API int zo_cpuadam_qtensors_default(zo_cpuadam_qtensors *t);

/**
 * One Adam, AdamW or Lion step on a slice with quantized moments, in one
 * pass: per block, dequantize m (and v), apply exactly the fp32 kernel's
 * update (same unscale, clip, bias correction, fused out copy), then take
 * the new block absmax and requantize. Each block is done whole by one
 * thread, so results are the same bits for every thread count and every
 * variant.
 *
 * Quantizing x in a block with absmax s: code = the number of the map's
 * fp32 midpoints mid_k = fp32((map[k] + map[k+1]) / 2) with q > mid_k,
 * q = fl(x * fl(1 / s)) (fl(x / s) where 1 / s is not a normal number:
 * s < 2^-126 or s >= 2^125) (nearest code; a quotient exactly on a
 * midpoint takes the lower code).
 * A block whose new moment holds inf or NaN gets absmax NaN and the codes
 * of 0: every element of it then reads as NaN (skip steps on overflow with
 * zo_cpuadam_grad_stats()); an all-zero block gets absmax 0.
 *
 * @return 0; -EINVAL (NULL hp/t/param/grad/needed codes or scales, n = 0
 *         or > SIZE_MAX / 8, bits not 8 or 4, a bad block size, nthreads
 *         < 1 or > 1024, struct_size unknown, misaligned or overlapping
 *         buffers, a signed map for v or an unknown map);
 *         ZO_ECONFIG (a hyperparameter out of range); ZO_ENOTSUP (Adagrad,
 *         grad or out type); ZO_EINTERNAL (the code maps failed their
 *         self-check when first built: a bug).
 * Thread-safe on disjoint tensors; blocks until the slice is done.
 */
ZO_API int zo_cpuadam_qstep(const zo_cpuadam_hparams *hp, const zo_cpuadam_qtensors *t, int nthreads);

/**
 * Quantize n fp32 values block-wise (the step's own rule): `codes` gets
 * the layout of ::zo_cpuadam_qtensors, `absmax` ceil(n / block) scales.
 * For tests, fresh states and checkpoint conversion. Single-threaded,
 * scalar (the same bits as every step variant).
 * @return 0, -EINVAL (NULL, n = 0, bits not 8 or 4, block not a multiple
 *         of 64 in [64, ZO_QBLOCK_MAX], unknown map).
 */
ZO_API int zo_cpuadam_quantize(const float *x, size_t n, zo_qmap map, int bits, size_t block,
                               uint8_t *codes, float *absmax);

/**
 * The inverse map: x[i] = map[code i] * absmax[i / block].
 * @return as zo_cpuadam_quantize().
 */
ZO_API int zo_cpuadam_dequantize(const uint8_t *codes, const float *absmax, size_t n, zo_qmap map,
                                 int bits, size_t block, float *x);

/**
 * The code map's table: `values` (may be NULL) gets 256 (8 bits) or 16
 * (4 bits) floats, sorted (entries no code produces read as the largest).
 * @return the number of entries, or -EINVAL (unknown map, bits not 8 or 4).
 */
ZO_API int zo_cpuadam_qmap_values(zo_qmap map, int bits, float *values);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Teams: a thread count, CPU pinning and a variant kept in a handle */
/**@{*/

/** A small immutable handle; see zo_cpuadam_team_create(). */
typedef struct zo_cpuadam_team zo_cpuadam_team;

/** Streaming (non-temporal) stores for the param_out copy. */
typedef enum zo_cpuadam_nt {
    ZO_CPUADAM_NT_AUTO = 0, /**< the library's choice (measured; see docs/cpuadam.md) */
    ZO_CPUADAM_NT_ON = 1,   /**< always stream the out copy (AVX2/AVX-512 variants) */
    ZO_CPUADAM_NT_OFF = 2,  /**< never */
} zo_cpuadam_nt;

typedef struct zo_cpuadam_team_config {
    size_t struct_size;     /**< sizeof(zo_cpuadam_team_config) */
    int nthreads;           /**< threads per call, >= 1 (default: CPUs this process may use) */
    int pin;                /**< 1: bind the OpenMP team, thread i to CPU i of `numa_node` (default 0) */
    int numa_node;          /**< node whose CPUs the team is pinned to; -1 (default): all CPUs */
    const char *variant;    /**< NULL or "auto" (default): follow zo_cpu_flags(); or a variant name */
    zo_cpuadam_nt nt_stores; /**< streaming stores for param_out (default AUTO) */
    size_t tile_elems;      /**< elements per tile, a multiple of 64 >= 1024 (default 16384) */
} zo_cpuadam_team_config;

/** Fill `cfg` with the defaults above. @return 0 or -EINVAL (NULL). */
ZO_API int zo_cpuadam_team_config_default(zo_cpuadam_team_config *cfg);

/**
 * Create a team. With `pin`, the OpenMP thread pool of each thread that
 * calls the team is bound before its first call (and again when that
 * thread last ran a different team): OpenMP thread i, the calling thread
 * being thread 0, is bound to CPU i mod k of the node's k CPUs. This
 * changes the calling thread's own CPU affinity.
 * @return 0; -EINVAL (out NULL, nthreads < 1, bad tile size, struct_size
 *         not that of a known zo_cpuadam_team_config);
 *         ZO_ECONFIG (unknown variant name, node not present);
 *         ZO_ENOTSUP (variant not runnable on this CPU, or pin without
 *         OpenMP); -ENOMEM; -errno from topology discovery.
 */
ZO_API int zo_cpuadam_team_create(zo_cpuadam_team **out, const zo_cpuadam_team_config *cfg);

/** Destroy; NULL (or *team NULL) is fine; clears *team. Not while calls on it run. */
ZO_API void zo_cpuadam_team_destroy(zo_cpuadam_team **team);

/* The team calls return as the plain ones, plus -EINVAL (team NULL) and,
 * for a team created with pin, the error of zo_topo_bind_omp() when the
 * calling thread's OpenMP team cannot be pinned. */
/** zo_cpuadam_step() with the team's threads, pinning and variant. */
ZO_API int zo_cpuadam_team_step(zo_cpuadam_team *team, const zo_cpuadam_hparams *hp,
                                const zo_cpuadam_tensors *t);
/** zo_cpuadam_rollback() with the team's threads, pinning and variant. */
ZO_API int zo_cpuadam_team_rollback(zo_cpuadam_team *team, const zo_cpuadam_hparams *hp,
                                    const zo_cpuadam_tensors *t);
/** zo_cpuadam_grad_stats() with the team's threads, pinning and variant. */
ZO_API int zo_cpuadam_team_grad_stats(zo_cpuadam_team *team, const void *grad, zo_dtype type,
                                      size_t n, zo_grad_stats *out);
/** zo_cpuadam_stream_bound() with the team's threads and pinning. */
ZO_API int zo_cpuadam_team_stream_bound(zo_cpuadam_team *team, float *a, float *b, float *c,
                                        const float *d, float alpha, size_t n);

/** zo_cpuadam_qstep() with the team's threads, pinning and variant. */
ZO_API int zo_cpuadam_team_qstep(zo_cpuadam_team *team, const zo_cpuadam_hparams *hp,
                                 const zo_cpuadam_qtensors *t);
/** The variant the team's calls use now (its pinned one, or the current auto choice). */
ZO_API const char *zo_cpuadam_team_variant(const zo_cpuadam_team *team);
/** The team's thread count; -EINVAL (NULL). */
ZO_API int zo_cpuadam_team_threads(const zo_cpuadam_team *team);
/** The team's last failure detail ("" if none). Last writer wins across threads. */
ZO_API const char *zo_cpuadam_team_errmsg(const zo_cpuadam_team *team);
/**@}*/

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_CPUADAM_H */
