/* SPDX-License-Identifier: Apache-2.0 */
/* vec kernels that use AVX512-BF16's VCVTNEPS2BF16. It rounds to nearest
 * even and quiets NaN exactly as the reference does, but treats fp32
 * subnormal inputs as zero (documented in vec.h; the test allows exactly
 * that difference). Everything else stays on the avx512 versions. */
#include <immintrin.h>

#include "core/vec_ref.h"

static void bf16i_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512(dst + i, (__m512i)h);
    }
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)h);
    }
}

/* Data only; the NULL entries keep the avx512 kernels (vec.c). */
const zo_vec_dsp zo__vec_avx512bf16 = {
    .name = "avx512bf16",
    .f32_to_bf16 = bf16i_f32_to_bf16,
};
