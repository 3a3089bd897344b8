/* SPDX-License-Identifier: Apache-2.0 */
/* vec kernels for AVX2 + FMA + F16C. Compiled with those flags only. */
#include <immintrin.h>

#include "core/vec_ref.h"

/* f32 -> bf16 in integer arithmetic: bit-identical to the reference. */
static inline __m256i bf16_round8(__m256i x)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    return _mm256_srli_epi32(_mm256_blendv_epi8(r, _mm256_slli_epi32(q, 16), is_nan), 16);
}

static void avx2_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m256i b = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i + 8)));
        /* packus works within 128-bit lanes: fix the order afterwards */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), p);
    }
    for (; i < n; i++)
        dst[i] = zo__ref_f32_to_bf16(src[i]);
}

static void avx2_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = zo__ref_f32_to_f16(src[i]);
}

static void avx2_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; i++)
        dst[i] = zo__ref_bf16_to_f32(src[i]);
}

static void avx2_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = zo__ref_f16_to_f32(src[i]);
}

/* Squares in double are exact; four accumulators hide the FMA latency. */
static inline __m256d sq_acc(__m256d acc, __m128 x)
{
    __m256d d = _mm256_cvtps_pd(x);
    return _mm256_fmadd_pd(d, d, acc);
}

static inline double hsum4(__m256d a)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

#define SUMSQ_BODY(LOAD8)                                                         \
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;                  \
    size_t i = 0;                                                                 \
    for (; i + 16 <= n; i += 16) {                                                \
        __m256 x = LOAD8(i), y = LOAD8(i + 8);                                    \
        a0 = sq_acc(a0, _mm256_castps256_ps128(x));                               \
        a1 = sq_acc(a1, _mm256_extractf128_ps(x, 1));                             \
        a2 = sq_acc(a2, _mm256_castps256_ps128(y));                               \
        a3 = sq_acc(a3, _mm256_extractf128_ps(y, 1));                             \
    }                                                                             \
    double s = hsum4(_mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));

#define LOAD_F32(k) _mm256_loadu_ps(src + (k))
#define LOAD_BF16(k) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + (k)))), 16))
#define LOAD_F16(k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + (k))))

static double avx2_sumsq_f32(const float *src, size_t n)
{
    SUMSQ_BODY(LOAD_F32)
    for (; i < n; i++)
        s += (double)src[i] * (double)src[i];
    return s;
}

static double avx2_sumsq_bf16(const uint16_t *src, size_t n)
{
    SUMSQ_BODY(LOAD_BF16)
    for (; i < n; i++) {
        double v = zo__ref_bf16_to_f32(src[i]);
        s += v * v;
    }
    return s;
}

static double avx2_sumsq_f16(const uint16_t *src, size_t n)
{
    SUMSQ_BODY(LOAD_F16)
    for (; i < n; i++) {
        double v = zo__ref_f16_to_f32(src[i]);
        s += v * v;
    }
    return s;
}

static size_t avx2_nonfinite_f32(const float *src, size_t n)
{
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    size_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(src + i)), e);
        c += (size_t)__builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x, e))));
    }
    for (; i < n; i++)
        c += (zo__f32_bits(src[i]) & 0x7f800000u) == 0x7f800000u;
    return c;
}

static size_t avx2_nonfinite_16(const uint16_t *src, size_t n, uint16_t exp_mask)
{
    const __m256i e = _mm256_set1_epi16((short)exp_mask);
    size_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i x = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(src + i)), e);
        /* movemask_epi8 gives two bits per 16-bit lane */
        c += (size_t)__builtin_popcount((unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi16(x, e))) / 2;
    }
    for (; i < n; i++)
        c += (src[i] & exp_mask) == exp_mask;
    return c;
}

/* Data only: generic code picks this table after checking the CPU. */
const zo_vec_dsp zo__vec_avx2 = {
    .name = "avx2",
    .f32_to_bf16 = avx2_f32_to_bf16,
    .f32_to_f16 = avx2_f32_to_f16,
    .bf16_to_f32 = avx2_bf16_to_f32,
    .f16_to_f32 = avx2_f16_to_f32,
    .sumsq_f32 = avx2_sumsq_f32,
    .sumsq_bf16 = avx2_sumsq_bf16,
    .sumsq_f16 = avx2_sumsq_f16,
    .nonfinite_f32 = avx2_nonfinite_f32,
    .nonfinite_16 = avx2_nonfinite_16,
};
