/* SPDX-License-Identifier: Apache-2.0 */
/* Advanced SIMD (NEON) conversions between fp32 and the 16-bit types,
 * bit-identical to the scalar reference (core/vec_ref.h). Shared by the
 * files built for NEON: core/arm/vec_neon.c and cpuadam/arm/adam_neon.c.
 *
 * f16 uses the FCVT instructions: with the FPCR as Linux starts a process
 * (round to nearest even, no flush to zero for fp32 or fp16, DN and AHP
 * clear) they round, keep subnormals and quiet NaN exactly as the
 * reference does (sign and top payload bits kept, quiet bit set). bf16
 * has no conversion instruction before ARMv8.6 (BFCVT), so it rounds in
 * integer arithmetic, as the reference does. */
#ifndef ZO_CORE_ARM_NEON_CVT_H
#define ZO_CORE_ARM_NEON_CVT_H

#include <arm_neon.h>
#include <stdint.h>

/* 4 x fp32 bits -> bf16, nearest even; NaN quieted keeping sign and the
 * upper payload (zo__ref_f32_to_bf16). */
static inline __attribute__((always_inline)) uint16x4_t zo__neon_bf16_rne(uint32x4_t x)
{
    uint32x4_t nan = vcgtq_u32(vandq_u32(x, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(x, vaddq_u32(lsb, vdupq_n_u32(0x7fffu)));
    uint32x4_t q = vorrq_u32(x, vdupq_n_u32(0x400000u));
    return vshrn_n_u32(vbslq_u32(nan, q, r), 16);
}

static inline __attribute__((always_inline)) float32x4_t zo__neon_bf16_to_f32(uint16x4_t h)
{
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

static inline __attribute__((always_inline)) uint16x4_t zo__neon_f32_to_f16(float32x4_t x)
{
    return vreinterpret_u16_f16(vcvt_f16_f32(x));
}

static inline __attribute__((always_inline)) float32x4_t zo__neon_f16_to_f32(uint16x4_t h)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* 1 where the exponent bits of a lane are all set (inf or NaN), else 0. */
static inline __attribute__((always_inline)) uint32x4_t zo__neon_nonfinite_f32(float32x4_t x)
{
    const uint32x4_t e = vdupq_n_u32(0x7f800000u);
    return vshrq_n_u32(vceqq_u32(vandq_u32(vreinterpretq_u32_f32(x), e), e), 31);
}

#endif /* ZO_CORE_ARM_NEON_CVT_H */
