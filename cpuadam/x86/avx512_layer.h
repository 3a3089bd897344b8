/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The AVX-512 (F/BW/VL/DQ) vector layer for kernel_tmpl.h, shared by the
 * avx512 and avx512bf16 variants. The includer defines
 * ZO_KT_CVT_BF16(x): 16 floats -> 16 bf16 (__m256i), nearest even.
 * Partial vectors use masked loads and stores: no scalar tails.
 */
#ifndef ZO_CPUADAM_AVX512_LAYER_H
#define ZO_CPUADAM_AVX512_LAYER_H

#include <immintrin.h>
#include <stdint.h>

#include "core/vec_ref.h"
#include "cpuadam/cpuadam_internal.h"

#define W 16u
typedef __m512 VF;

#define LAI static inline __attribute__((always_inline))

LAI VF vf_set1(float x) { return _mm512_set1_ps(x); }
LAI VF vf_zero(void) { return _mm512_setzero_ps(); }
LAI VF vf_add(VF a, VF b) { return _mm512_add_ps(a, b); }
LAI VF vf_sub(VF a, VF b) { return _mm512_sub_ps(a, b); }
LAI VF vf_mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
LAI VF vf_div(VF a, VF b) { return _mm512_div_ps(a, b); }
LAI VF vf_fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
LAI VF vf_fnma(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
LAI VF vf_sqrt(VF a) { return _mm512_sqrt_ps(a); }
/* MAXPS returns its second operand when either is NaN: NaN stays. */
LAI VF vf_max0(VF a) { return _mm512_max_ps(_mm512_setzero_ps(), a); }

LAI VF vf_sign_nan(VF c)
{
    __mmask16 nz = _mm512_cmp_ps_mask(c, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    __mmask16 nan = _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
    VF s = _mm512_or_ps(_mm512_and_ps(c, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(nz, s), nan, c);
}

/* f32 -> bf16 in integer arithmetic, bit-identical to the reference
 * (round to nearest even, NaN quieted keeping sign and upper payload). */
LAI __m256i bf16_rne_int(VF xf)
{
    __m512i x = _mm512_castps_si512(xf);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __m512i q = _mm512_or_si512(x, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_mask_mov_epi32(r, nan, q), 16));
}

LAI __mmask16 kmask(unsigned k) { return (__mmask16)((1u << k) - 1u); }

LAI VF cvt_in(__m256i h, int t)
{
    if (t == ZO__T_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

LAI __m256i cvt_out(VF x, int t)
{
    if (t == ZO__T_F16)
        return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return ZO_KT_CVT_BF16(x);
}

LAI VF ldv(const void *base, int t, size_t i)
{
    if (t == ZO__T_F32)
        return _mm512_loadu_ps((const float *)base + i);
    return cvt_in(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)), t);
}

LAI VF ldv_part(const void *base, int t, size_t i, unsigned k)
{
    if (t == ZO__T_F32)
        return _mm512_maskz_loadu_ps(kmask(k), (const float *)base + i);
    return cvt_in(_mm256_maskz_loadu_epi16(kmask(k), (const uint16_t *)base + i), t);
}

LAI void stv(void *base, int t, size_t i, VF x, int nt)
{
    if (t == ZO__T_F32) {
        float *f = (float *)base + i;
        if (nt)
            _mm512_stream_ps(f, x);
        else
            _mm512_storeu_ps(f, x);
        return;
    }
    __m256i *h = (__m256i *)((uint16_t *)base + i);
    if (nt)
        _mm256_stream_si256(h, cvt_out(x, t));
    else
        _mm256_storeu_si256(h, cvt_out(x, t));
}

LAI void stv_part(void *base, int t, size_t i, VF x, unsigned k)
{
    if (t == ZO__T_F32)
        _mm512_mask_storeu_ps((float *)base + i, kmask(k), x);
    else
        _mm256_mask_storeu_epi16((uint16_t *)base + i, kmask(k), cvt_out(x, t));
}

LAI void kt_fence(void) { _mm_sfence(); }

/* ---- gradient statistics (the template's stats_range) -------------------- */
typedef __m512d SD;
typedef __m512i SC;
LAI SD sd_zero(void) { return _mm512_setzero_pd(); }
LAI SC sc_zero(void) { return _mm512_setzero_si512(); }

LAI __m512d sq_acc(__m512d acc, __m256 x)
{
    __m512d d = _mm512_cvtps_pd(x);
    return _mm512_fmadd_pd(d, d, acc);
}

/* masked-off lanes of a partial vector load as zero: they add nothing and
 * are finite */
LAI void stats_vec(VF x, SD *a0, SD *a1, SC *cnt)
{
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    *a0 = sq_acc(*a0, _mm512_castps512_ps256(x));
    *a1 = sq_acc(*a1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    __mmask16 bad = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), e), e);
    *cnt = _mm512_mask_sub_epi32(*cnt, bad, *cnt, _mm512_set1_epi32(-1));
}

LAI uint64_t sc_sum(SC c)
{
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(
        _mm512_cvtepu32_epi64(_mm512_castsi512_si256(c)), _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(c, 1))));
}

LAI double sd_sum4(SD a0, SD a1, SD a2, SD a3)
{
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
}

#include "cpuadam/kernel_tmpl.h"

#endif /* ZO_CPUADAM_AVX512_LAYER_H */
