/* SPDX-License-Identifier: Apache-2.0 */
/* cpuadam kernels for Advanced SIMD (NEON): the template's vector layer on
 * 4 fp32 lanes. Compiled with the NEON flag set only (the aarch64 base).
 *
 * Bit-identity with the reference: FMLA/FMLS are fused like fmaf(), FDIV
 * and FSQRT are correctly rounded, and Linux starts a process with
 * round-to-nearest and no flush to zero. Two spots need care: FMAX gives
 * +0 for max(+0, -0) where the reference keeps -0 (so max0 is a select),
 * and bf16 rounds in integer arithmetic (core/arm/neon_cvt.h).
 *
 * Partial vectors go through a small stack buffer (NEON has no masked
 * loads), so tails get the same vector arithmetic as the body. The
 * streaming-store hint is not used: AArch64's only form is STNP (a
 * hint to the memory system, no intrinsic in GCC), and whether it beats a
 * plain store is core-specific; that waits for measurements on hardware. */
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "core/arm/neon_cvt.h"
#include "core/vec_ref.h"
#include "cpuadam/cpuadam_internal.h"

#define W 4u
typedef float32x4_t VF;

#define LAI static inline __attribute__((always_inline))

LAI VF vf_set1(float x) { return vdupq_n_f32(x); }
LAI VF vf_zero(void) { return vdupq_n_f32(0.0f); }
LAI VF vf_add(VF a, VF b) { return vaddq_f32(a, b); }
LAI VF vf_sub(VF a, VF b) { return vsubq_f32(a, b); }
LAI VF vf_mul(VF a, VF b) { return vmulq_f32(a, b); }
LAI VF vf_div(VF a, VF b) { return vdivq_f32(a, b); }
LAI VF vf_fma(VF a, VF b, VF c) { return vfmaq_f32(c, a, b); }
LAI VF vf_fnma(VF a, VF b, VF c) { return vfmsq_f32(c, a, b); }
LAI VF vf_sqrt(VF a) { return vsqrtq_f32(a); }
/* a < 0 ? 0 : a, as the reference writes it: -0 and NaN stay. */
LAI VF vf_max0(VF a) { return vbslq_f32(vcltzq_f32(a), vf_zero(), a); }

/* -1/0/+1 with NaN kept; -0 gives +0 like the reference's sign_nan(). */
LAI VF vf_sign_nan(VF c)
{
    uint32x4_t nz = vmvnq_u32(vceqzq_f32(c)); /* NaN counts as nonzero */
    uint32x4_t nan = vmvnq_u32(vceqq_f32(c, c));
    VF s = vbslq_f32(vdupq_n_u32(0x80000000u), c, vdupq_n_f32(1.0f)); /* copysign(1, c) */
    VF r = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(s), nz));
    return vbslq_f32(nan, c, r);
}

LAI VF ldv(const void *base, int t, size_t i)
{
    if (t == ZO__T_F32)
        return vld1q_f32((const float *)base + i);
    uint16x4_t h = vld1_u16((const uint16_t *)base + i);
    return t == ZO__T_F16 ? zo__neon_f16_to_f32(h) : zo__neon_bf16_to_f32(h);
}

LAI void stv(void *base, int t, size_t i, VF x, int nt)
{
    (void)nt; /* plain stores: see the top of the file */
    if (t == ZO__T_F32) {
        vst1q_f32((float *)base + i, x);
        return;
    }
    uint16x4_t h = t == ZO__T_F16 ? zo__neon_f32_to_f16(x) : zo__neon_bf16_rne(vreinterpretq_u32_f32(x));
    vst1_u16((uint16_t *)base + i, h);
}

LAI void kt_fence(void) {}

/* ---- gradient statistics (the template's stats_range) -------------------- */
typedef float64x2_t SD;
typedef uint32x4_t SC;
LAI SD sd_zero(void) { return vdupq_n_f64(0.0); }
LAI SC sc_zero(void) { return vdupq_n_u32(0); }

/* Squares of fp32 values are exact in double, so FMLA adds them as the
 * reference's multiply and add do. */
LAI void stats_vec(VF x, SD *a0, SD *a1, SC *cnt)
{
    float64x2_t lo = vcvt_f64_f32(vget_low_f32(x)), hi = vcvt_high_f64_f32(x);
    *a0 = vfmaq_f64(*a0, lo, lo);
    *a1 = vfmaq_f64(*a1, hi, hi);
    *cnt = vaddq_u32(*cnt, zo__neon_nonfinite_f32(x));
}

LAI uint64_t sc_sum(SC c) { return vaddlvq_u32(c); }

LAI double sd_sum4(SD a0, SD a1, SD a2, SD a3)
{
    return vaddvq_f64(vaddq_f64(vaddq_f64(a0, a1), vaddq_f64(a2, a3)));
}

#define KT_PART_BY_BUFFER
#include "cpuadam/kernel_tmpl.h"

/* Data only: generic code (kernels_ref.c) picks it after checking the CPU. */
const zo_cpuadam_dsp zo__cpuadam_neon = {
    .name = "neon",
    .step = kt_step,
    .rollback = kt_rollback,
    .grad_stats = kt_grad_stats,
    .stream_bound = kt_stream_bound,
};
