/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Scalar reference conversions and the vec DSP table. Every SIMD variant
 * handles its tail with these, so tails are exact by construction.
 */
#ifndef ZO_CORE_VEC_REF_H
#define ZO_CORE_VEC_REF_H

#include <stddef.h>
#include <stdint.h>

#include "core/fp_convert.h"

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
