/* SPDX-License-Identifier: Apache-2.0 */
/* vec kernels for Advanced SIMD (NEON). Compiled with the NEON flag set
 * only (the aarch64 base). Conversions are bit-identical to the reference
 * (core/arm/neon_cvt.h says why); tails use the reference.
 *
 * Each kernel is written once over the 16-bit type (T_F16 or T_BF16, or
 * T_F32 for the sums) and inlined with the type as a constant. */
#include <arm_neon.h>

#include "core/arm/neon_cvt.h"
#include "core/vec_ref.h"

#define AI static inline __attribute__((always_inline))

enum { T_F32, T_F16, T_BF16 };

AI uint16x4_t narrow4(float32x4_t x, int t)
{
    return t == T_F16 ? zo__neon_f32_to_f16(x) : zo__neon_bf16_rne(vreinterpretq_u32_f32(x));
}

AI float32x4_t widen4(uint16x4_t h, int t)
{
    return t == T_F16 ? zo__neon_f16_to_f32(h) : zo__neon_bf16_to_f32(h);
}

/* The reference's element i of src, of type t, as a float. */
AI float ref_elem(const void *src, int t, size_t i)
{
    if (t == T_F32)
        return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    return t == T_F16 ? zo__ref_f16_to_f32(h) : zo__ref_bf16_to_f32(h);
}

AI void to16(uint16_t *dst, const float *src, size_t n, int t)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        vst1q_u16(dst + i, vcombine_u16(narrow4(vld1q_f32(src + i), t), narrow4(vld1q_f32(src + i + 4), t)));
    for (; i < n; i++)
        dst[i] = t == T_F16 ? zo__ref_f32_to_f16(src[i]) : zo__ref_f32_to_bf16(src[i]);
}

AI void from16(float *dst, const uint16_t *src, size_t n, int t)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t h = vld1q_u16(src + i);
        vst1q_f32(dst + i, widen4(vget_low_u16(h), t));
        vst1q_f32(dst + i + 4, widen4(vget_high_u16(h), t));
    }
    for (; i < n; i++)
        dst[i] = ref_elem(src, t, i);
}

AI float32x4_t load4(const void *src, int t, size_t i)
{
    if (t == T_F32)
        return vld1q_f32((const float *)src + i);
    return widen4(vld1_u16((const uint16_t *)src + i), t);
}

AI float64x2_t sq_acc(float64x2_t acc, float64x2_t d)
{
    return vfmaq_f64(acc, d, d);
}

/* Squares in double are exact, so FMLA adds them as the reference's
 * multiply and add do; four accumulators hide its latency. */
AI double sumsq(const void *src, size_t n, int t)
{
    float64x2_t a0 = vdupq_n_f64(0.0), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t x = load4(src, t, i), y = load4(src, t, i + 4);
        a0 = sq_acc(a0, vcvt_f64_f32(vget_low_f32(x)));
        a1 = sq_acc(a1, vcvt_high_f64_f32(x));
        a2 = sq_acc(a2, vcvt_f64_f32(vget_low_f32(y)));
        a3 = sq_acc(a3, vcvt_high_f64_f32(y));
    }
    double s = vaddvq_f64(vaddq_f64(vaddq_f64(a0, a1), vaddq_f64(a2, a3)));
    for (; i < n; i++) {
        double v = ref_elem(src, t, i);
        s += v * v;
    }
    return s;
}

static void neon_f32_to_bf16(uint16_t *dst, const float *src, size_t n) { to16(dst, src, n, T_BF16); }
static void neon_f32_to_f16(uint16_t *dst, const float *src, size_t n) { to16(dst, src, n, T_F16); }
static void neon_bf16_to_f32(float *dst, const uint16_t *src, size_t n) { from16(dst, src, n, T_BF16); }
static void neon_f16_to_f32(float *dst, const uint16_t *src, size_t n) { from16(dst, src, n, T_F16); }
static double neon_sumsq_f32(const float *src, size_t n) { return sumsq(src, n, T_F32); }
static double neon_sumsq_bf16(const uint16_t *src, size_t n) { return sumsq(src, n, T_BF16); }
static double neon_sumsq_f16(const uint16_t *src, size_t n) { return sumsq(src, n, T_F16); }

/* Lane counters are 32-bit: a block adds at most 2^28 to a lane. */
#define COUNT_BLOCK ((size_t)1 << 30)

static size_t neon_nonfinite_f32(const float *src, size_t n)
{
    size_t c = 0, i = 0;
    while (i + 4 <= n) {
        size_t stop = n - i > COUNT_BLOCK ? i + COUNT_BLOCK : n;
        uint32x4_t acc = vdupq_n_u32(0);
        for (; i + 4 <= stop; i += 4)
            acc = vaddq_u32(acc, zo__neon_nonfinite_f32(vld1q_f32(src + i)));
        c += vaddlvq_u32(acc);
    }
    for (; i < n; i++)
        c += (zo__f32_bits(src[i]) & 0x7f800000u) == 0x7f800000u;
    return c;
}

static size_t neon_nonfinite_16(const uint16_t *src, size_t n, uint16_t exp_mask)
{
    const uint16x8_t e = vdupq_n_u16(exp_mask);
    size_t c = 0, i = 0;
    while (i + 8 <= n) {
        size_t stop = n - i > COUNT_BLOCK ? i + COUNT_BLOCK : n;
        uint32x4_t acc = vdupq_n_u32(0);
        for (; i + 8 <= stop; i += 8) {
            uint16x8_t bad = vceqq_u16(vandq_u16(vld1q_u16(src + i), e), e);
            acc = vpadalq_u16(acc, vshrq_n_u16(bad, 15)); /* pairs of 0/1 into 32-bit lanes */
        }
        c += vaddlvq_u32(acc);
    }
    for (; i < n; i++)
        c += (src[i] & exp_mask) == exp_mask;
    return c;
}

/* Data only: generic code picks this table after checking the CPU. */
const zo_vec_dsp zo__vec_neon = {
    .name = "neon",
    .f32_to_bf16 = neon_f32_to_bf16,
    .f32_to_f16 = neon_f32_to_f16,
    .bf16_to_f32 = neon_bf16_to_f32,
    .f16_to_f32 = neon_f16_to_f32,
    .sumsq_f32 = neon_sumsq_f32,
    .sumsq_bf16 = neon_sumsq_bf16,
    .sumsq_f16 = neon_sumsq_f16,
    .nonfinite_f32 = neon_nonfinite_f32,
    .nonfinite_16 = neon_nonfinite_16,
};
