/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Scalar reference conversions and the vec DSP table. Every SIMD variant
 * handles its tail with these, so tails are exact by construction.
 */
#ifndef ZO_CORE_VEC_REF_H
#define ZO_CORE_VEC_REF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t zo__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float zo__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN quieted with sign and upper payload kept. */
static inline uint16_t zo__ref_f32_to_bf16(float f)
{
    uint32_t u = zo__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float zo__ref_bf16_to_f32(uint16_t h)
{
    return zo__bits_f32((uint32_t)h << 16);
}

/* IEEE binary16, round to nearest even, exact subnormals, overflow to inf,
 * NaN quieted keeping sign and the top 10 payload bits (as F16C does). */
static inline uint16_t zo__ref_f32_to_f16(float f)
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

static inline float zo__ref_f16_to_f32(uint16_t h)
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

/* The vec DSP table: one per variant. */
typedef struct zo_vec_dsp {
    const char *name;
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
    double (*sumsq_f32)(const float *src, size_t n);
    double (*sumsq_bf16)(const uint16_t *src, size_t n);
    double (*sumsq_f16)(const uint16_t *src, size_t n);
    size_t (*nonfinite_f32)(const float *src, size_t n);
    /* 16-bit types: an element is non-finite when all its exponent bits
     * (exp_mask: 0x7f80 for bf16, 0x7c00 for f16) are set. */
    size_t (*nonfinite_16)(const uint16_t *src, size_t n, uint16_t exp_mask);
} zo_vec_dsp;

/*
 * The dispatch rule (docs/architecture.md, "CPU dispatch"): a file compiled
 * with ISA flags holds kernels and one constant table of their addresses,
 * and no function of it runs until generic code (vec.c, built for the
 * baseline) has checked the CPU. The compiler may use the ISA's
 * instructions anywhere in such a file, even to fill a struct, so there is
 * no init function to call. A NULL entry keeps the level below's kernel.
 */
#if defined(__x86_64__)
extern const zo_vec_dsp zo__vec_avx2;       /* x86/vec_avx2.c */
extern const zo_vec_dsp zo__vec_avx512;     /* x86/vec_avx512.c */
extern const zo_vec_dsp zo__vec_avx512bf16; /* x86/vec_avx512bf16.c */
#elif defined(__aarch64__)
extern const zo_vec_dsp zo__vec_neon; /* arm/vec_neon.c */
#endif

/* The table for the current zo_cpu_flags(); never NULL. */
const zo_vec_dsp *zo__vec_dsp(void);
/* The table for explicit flags (tests use it to pin a variant). */
const zo_vec_dsp *zo__vec_dsp_for(unsigned flags);

#endif /* ZO_CORE_VEC_REF_H */
