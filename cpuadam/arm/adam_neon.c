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

/* ---- quantized states: block dequantize / quantize -------------------------
 * The same operations as zo__q_dequant_ref / zo__q_quant_ref: one multiply
 * per element out; one multiply (zo__qquot) and zo__qcode()'s bucket lookup in. NEON
 * has no gather, so the two table reads per lane are lane loads; the
 * quotient, key arithmetic and compare are vector. Tails of fewer than 4
 * elements run the scalar definition. */
LAI VF q_lookup4(const float *tab, uint32x4_t k)
{
    VF v = vdupq_n_f32(tab[vgetq_lane_u32(k, 0)]);
    v = vsetq_lane_f32(tab[vgetq_lane_u32(k, 1)], v, 1);
    v = vsetq_lane_f32(tab[vgetq_lane_u32(k, 2)], v, 2);
    return vsetq_lane_f32(tab[vgetq_lane_u32(k, 3)], v, 3);
}

static void q_dequant(const uint8_t *codes, int bits, const zo__qmap_tab *t, float absmax, float *x,
                      size_t len)
{
    uint8_t buf[ZO__QBLOCK_MAX];
    const uint8_t *c = zo__qunpack(codes, len, bits, buf);
    const VF s = vdupq_n_f32(absmax);
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
        uint32x4_t k = {c[i], c[i + 1], c[i + 2], c[i + 3]};
        vst1q_f32(x + i, vmulq_f32(q_lookup4(t->value, k), s));
    }
    zo__qvalues(t, c, i, len, absmax, x);
}

static void q_quant(const float *x, size_t len, const zo__qmap_tab *t, int bits, uint8_t *codes, float *absmax)
{
    uint32x4_t am = vdupq_n_u32(0);
    const uint32x4_t abs = vdupq_n_u32(0x7fffffffu);
    size_t i = 0;
    for (; i + 4 <= len; i += 4) /* unsigned max of |x| bits: NaN > inf > finite */
        am = vmaxq_u32(am, vandq_u32(vld1q_u32((const uint32_t *)(x + i)), abs));
    uint32_t amax = vmaxvq_u32(am);
    amax = zo__qamax(x, i, len, amax);
    uint8_t c[ZO__QBLOCK_MAX];
    uint8_t *dst = bits == 8 ? codes : c; /* 8 bits: codes go straight out */
    unsigned z = 0;
    if (!zo__qscale(t, amax, absmax, &z)) {
        memset(dst, (int)z, len);
    } else {
        const zo__qdiv d = zo__qdiv_of(*absmax);
        const VF s = vdupq_n_f32(d.s);
        const int32x4_t sh = vdupq_n_s32(-(int32_t)t->shift), kb = vdupq_n_s32(t->kbias),
                        top = vdupq_n_s32(t->nmag - 1), nm = vdupq_n_s32(t->nmag);
        for (i = 0; i + 4 <= len; i += 4) {
            VF v = d.recip ? vmulq_f32(vld1q_f32(x + i), s) : vdivq_f32(vld1q_f32(x + i), s);
            uint32x4_t b = vreinterpretq_u32_f32(v);
            int32x4_t k = vsubq_s32(vreinterpretq_s32_u32(vshlq_u32(vandq_u32(b, abs), sh)), kb);
            k = vminq_s32(vmaxq_s32(k, vdupq_n_s32(0)), top);
            k = vaddq_s32(k, vandq_s32(vshrq_n_s32(vreinterpretq_s32_u32(b), 31), nm));
            uint32x4_t kk = vreinterpretq_u32_s32(k);
            uint32x4_t base = {t->bucket[vgetq_lane_u32(kk, 0)], t->bucket[vgetq_lane_u32(kk, 1)],
                               t->bucket[vgetq_lane_u32(kk, 2)], t->bucket[vgetq_lane_u32(kk, 3)]};
            /* the compare gives all ones where x > mid: subtracting adds 1 */
            uint32x4_t q = vsubq_u32(base, vcgtq_f32(v, q_lookup4(t->mid, base)));
            uint16x4_t h = vmovn_u32(q);
            uint8x8_t bq = vmovn_u16(vcombine_u16(h, h));
            uint32_t w = vget_lane_u32(vreinterpret_u32_u8(bq), 0);
            memcpy(dst + i, &w, 4); /* codes need no alignment */
        }
        zo__qcodes(t, x, i, len, d, dst);
    }
    if (bits != 8)
        zo__qpack(c, len, bits, codes);
}

/* Data only: generic code (kernels_ref.c) picks it after checking the CPU. */
const zo_cpuadam_dsp zo__cpuadam_neon = {
    .name = "neon",
    .step = kt_step,
    .rollback = kt_rollback,
    .grad_stats = kt_grad_stats,
    .stream_bound = kt_stream_bound,
    .qdequant = q_dequant,
    .qquant = q_quant,
};
