/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scalar float conversions: the one copy every path rounds with. C
 * code gets them through core/vec_ref.h (the reference kernels, every SIMD
 * variant's tail, the public zo_f32_to_bf16() and friends); the CUDA
 * kernels (lib/dev/cuda_kernels.cu) include this file directly, so a GPU
 * cast gives the host's bits. Before, the CUDA file had its own copies,
 * and its f16 -> f32 of a signalling NaN left it signalling where the host
 * quiets it (issue 21: one bf16 rounding helper, not seven).
 *
 * Integer arithmetic only (no intrinsics): round to nearest even, NaN
 * quieted with sign and payload kept, as the x86 and Arm instructions do.
 */
#ifndef ZO_CORE_FP_CONVERT_H
#define ZO_CORE_FP_CONVERT_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define ZO_FP_FN static __host__ __device__ __forceinline__
#else
#define ZO_FP_FN static inline
#endif

ZO_FP_FN uint32_t zo__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

ZO_FP_FN float zo__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN quieted with sign and upper payload kept. */
ZO_FP_FN uint16_t zo__ref_f32_to_bf16(float f)
{
    uint32_t u = zo__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

ZO_FP_FN float zo__ref_bf16_to_f32(uint16_t h)
{
    return zo__bits_f32((uint32_t)h << 16);
}

/* IEEE binary16, round to nearest even, exact subnormals, overflow to inf,
 * NaN quieted keeping sign and the top 10 payload bits (as F16C does). */
ZO_FP_FN uint16_t zo__ref_f32_to_f16(float f)
{
    uint32_t x = zo__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) /* >= 65520: rounds to inf (65504 is odd, tie goes up) */
        return (uint16_t)(sign | 0x7c00u);
    if (x >= 0x38800000u) { /* normal half: rebias the exponent 127 -> 15 */
        uint32_t r = x - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    uint32_t e = x >> 23;
    if (e < 102) /* below 2^-25: rounds to zero */
        return sign;
    /* subnormal half: value / 2^-24 rounded to an integer, ties to even */
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

ZO_FP_FN float zo__ref_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        return sign ? -v : v;
    }
    if (e == 31) /* inf; NaN comes back quiet, payload kept, as F16C's VCVTPH2PS does */
        return zo__bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    return zo__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif /* ZO_CORE_FP_CONVERT_H */
