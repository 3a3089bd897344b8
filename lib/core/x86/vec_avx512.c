/* SPDX-License-Identifier: Apache-2.0 */
/* vec kernels for AVX-512 F/BW/VL/DQ. Compiled with those flags only. */
#include <immintrin.h>

#include "core/vec_ref.h"

/* f32 -> bf16 in integer arithmetic: bit-identical to the reference. */
static inline __m256i bf16_round16(__m512i x)
{
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000);
    __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, is_nan, q));
}

static void avx512_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), bf16_round16(_mm512_loadu_si512(src + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m256i h = bf16_round16(_mm512_maskz_loadu_epi32(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

static void avx512_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

static void avx512_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(w, 16));
    }
}

static void avx512_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

static inline __m512d sq_acc(__m512d acc, __m256 x)
{
    __m512d d = _mm512_cvtps_pd(x);
    return _mm512_fmadd_pd(d, d, acc);
}

/* Masked-off lanes load as zero and add nothing, so the tail needs no
 * scalar loop. */
#define SUMSQ_BODY(LOAD16, MLOAD16)                                                   \
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;                      \
    size_t i = 0;                                                                     \
    for (; i + 32 <= n; i += 32) {                                                    \
        __m512 x = LOAD16(i), y = LOAD16(i + 16);                                     \
        a0 = sq_acc(a0, _mm512_castps512_ps256(x));                                   \
        a1 = sq_acc(a1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))); \
        a2 = sq_acc(a2, _mm512_castps512_ps256(y));                                   \
        a3 = sq_acc(a3, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))); \
    }                                                                                 \
    for (; i < n; i += 16) {                                                          \
        size_t left = n - i;                                                          \
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); \
        __m512 x = MLOAD16(m, i);                                                     \
        a0 = sq_acc(a0, _mm512_castps512_ps256(x));                                   \
        a1 = sq_acc(a1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))); \
    }                                                                                 \
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));

#define LOAD_F32(k) _mm512_loadu_ps(src + (k))
#define MLOAD_F32(m, k) _mm512_maskz_loadu_ps((m), src + (k))
#define LOAD_BF16(k) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + (k)))), 16))
#define MLOAD_BF16(m, k) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((m), src + (k))), 16))
#define LOAD_F16(k) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + (k))))
#define MLOAD_F16(m, k) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((m), src + (k)))

static double avx512_sumsq_f32(const float *src, size_t n) { SUMSQ_BODY(LOAD_F32, MLOAD_F32) }
static double avx512_sumsq_bf16(const uint16_t *src, size_t n) { SUMSQ_BODY(LOAD_BF16, MLOAD_BF16) }
static double avx512_sumsq_f16(const uint16_t *src, size_t n) { SUMSQ_BODY(LOAD_F16, MLOAD_F16) }

static size_t avx512_nonfinite_f32(const float *src, size_t n)
{
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    size_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_loadu_si512(src + i);
        c += (size_t)__builtin_popcount((unsigned)_mm512_cmpeq_epi32_mask(_mm512_and_si512(x, e), e));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512i x = _mm512_maskz_loadu_epi32(m, src + i);
        c += (size_t)__builtin_popcount((unsigned)_mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(x, e), e));
    }
    return c;
}

static size_t avx512_nonfinite_16(const uint16_t *src, size_t n, uint16_t exp_mask)
{
    const __m512i e = _mm512_set1_epi16((short)exp_mask);
    size_t c = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i x = _mm512_loadu_si512(src + i);
        c += (size_t)__builtin_popcount(_mm512_cmpeq_epi16_mask(_mm512_and_si512(x, e), e));
    }
    if (i < n) {
        __mmask32 m = (__mmask32)((1ull << (n - i)) - 1);
        __m512i x = _mm512_maskz_loadu_epi16(m, src + i);
        c += (size_t)__builtin_popcount(_mm512_mask_cmpeq_epi16_mask(m, _mm512_and_si512(x, e), e));
    }
    return c;
}

/* Data only: generic code picks this table after checking the CPU. */
const zo_vec_dsp zo__vec_avx512 = {
    .name = "avx512",
    .f32_to_bf16 = avx512_f32_to_bf16,
    .f32_to_f16 = avx512_f32_to_f16,
    .bf16_to_f32 = avx512_bf16_to_f32,
    .f16_to_f32 = avx512_f16_to_f32,
    .sumsq_f32 = avx512_sumsq_f32,
    .sumsq_bf16 = avx512_sumsq_bf16,
    .sumsq_f16 = avx512_sumsq_f16,
    .nonfinite_f32 = avx512_nonfinite_f32,
    .nonfinite_16 = avx512_nonfinite_16,
};
