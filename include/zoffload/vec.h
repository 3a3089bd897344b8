/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file vec.h
 * @brief Vector primitives on host memory: precision casts, sum of squares,
 *        inf/NaN detection. Single-threaded; run-time dispatched (scalar,
 *        AVX2+F16C, AVX-512, AVX-512+BF16) through zo_cpu_flags().
 *
 * Numerics (every variant; tests hold them to it):
 *  - fp32 -> bf16 and fp32 -> fp16 round to nearest, ties to even. NaN stays
 *    NaN (quieted, sign and upper payload kept); +-inf stays inf; values too
 *    large for fp16 become inf; fp16 subnormals are produced exactly.
 *    Exception: the avx512bf16 variant uses VCVTNEPS2BF16, which flushes
 *    fp32 subnormal inputs (|x| < 2^-126) to a zero of the same sign; all
 *    other inputs give the same bits as the reference.
 *  - bf16/fp16 -> fp32 is exact, except that an fp16 signaling NaN comes
 *    back quiet (payload and sign kept), as F16C's VCVTPH2PS makes it.
 *  - zo_vec_sumsq() squares each element exactly in double (a float's
 *    24-bit significand squared fits in 53 bits) and sums in double lanes;
 *    the relative error against the exact sum is below n * 2^-53 (tested
 *    against a long double reference). inf or NaN input gives inf or NaN.
 *
 * Pointers need no alignment. Buffers must not overlap (except dst == src
 * for same-size casts, which are a no-op).
 */
#ifndef ZOFFLOAD_VEC_H
#define ZOFFLOAD_VEC_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * dst[i] = (dst_type) src[i] for i < n. Supported pairs: f32 -> bf16, f32 ->
 * f16, bf16 -> f32, f16 -> f32, and any type to itself (a copy).
 * @return 0, -EINVAL (NULL with n > 0, invalid type), ZO_ENOTSUP (pair).
 */
ZO_API int zo_vec_cast(void *dst, zo_dtype dst_type, const void *src, zo_dtype src_type, size_t n);

/**
 * *out = sum of src[i]^2 (f32, f16 or bf16 input).
 * @return 0, -EINVAL, ZO_ENOTSUP (type).
 */
ZO_API int zo_vec_sumsq(const void *src, zo_dtype type, size_t n, double *out);

/**
 * *count = number of inf or NaN elements in src (f32, f16 or bf16).
 * @return 0, -EINVAL, ZO_ENOTSUP (type).
 */
ZO_API int zo_vec_nonfinite(const void *src, zo_dtype type, size_t n, size_t *count);

/** Name of the variant the current CPU flags select: "scalar", "avx2",
 *  "avx512" or "avx512bf16" on x86-64, "scalar" or "neon" on aarch64. */
ZO_API const char *zo_vec_variant(void);

/**
 * The i-th vec variant built into this library, slowest first (0 is
 * "scalar"), for listing what dispatch can choose from (zo-info does).
 * @param needs  if not NULL, gets the ZO_CPU_* flags the variant needs; it
 *               may run when (zo_cpu_flags() & needs) == needs.
 * @return its name, or NULL when i is past the last. Thread-safe.
 */
ZO_API const char *zo_vec_variant_at(unsigned i, unsigned *needs);

/** Scalar conversions, exact reference semantics (see the file comment). */
ZO_API uint16_t zo_f32_to_bf16(float f);
ZO_API float zo_bf16_to_f32(uint16_t h);
ZO_API uint16_t zo_f32_to_f16(float f);
ZO_API float zo_f16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_VEC_H */
