/* SPDX-License-Identifier: Apache-2.0 */
/* cpuadam kernels for AVX-512 F/BW/VL/DQ. Compiled with those flags only.
 * bf16 outputs and states round in integer arithmetic, bit-identical to the
 * C reference conversion. */
#define ZO_KT_CVT_BF16(x) bf16_rne_int(x)
#include "cpuadam/x86/avx512_layer.h"

#include <string.h>

/* ---- quantized states: block dequantize / quantize -------------------------
 * The same operations as zo__q_dequant_ref / zo__q_quant_ref (one multiply
 * per element out; one division and zo__qcode()'s bucket lookup in), 16
 * lanes with gathers, masked for the block's tail. The byte table is read
 * by 32-bit gathers and masked (4 bytes of padding keep them inside). The
 * avx512bf16 variant inherits these. */
static void q_dequant(const uint8_t *codes, int bits, const zo__qmap_tab *t, float absmax, float *x,
                      size_t len)
{
    uint8_t buf[ZO__QBLOCK_MAX];
    const uint8_t *c = zo__qunpack(codes, len, bits, buf);
    const VF s = _mm512_set1_ps(absmax);
    for (size_t i = 0; i < len; i += 16) {
        __mmask16 m = len - i >= 16 ? (__mmask16)0xffff : kmask((unsigned)(len - i));
        __m512i k = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, c + i));
        VF v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, k, t->value, 4);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(v, s));
    }
}

static void q_quant(const float *x, size_t len, const zo__qmap_tab *t, int bits, uint8_t *codes, float *absmax)
{
    __m512i am = _mm512_setzero_si512();
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    for (size_t i = 0; i < len; i += 16) { /* unsigned max of |x| bits: NaN > inf > finite */
        __mmask16 m = len - i >= 16 ? (__mmask16)0xffff : kmask((unsigned)(len - i));
        am = _mm512_max_epu32(am, _mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + i), abs));
    }
    uint32_t amax = (uint32_t)_mm512_reduce_max_epu32(am);
    _Alignas(64) uint8_t c[ZO__QBLOCK_MAX];
    uint8_t *dst = bits == 8 ? codes : c; /* 8 bits: codes go straight out */
    unsigned z = 0;
    if (!zo__qscale(t, amax, absmax, &z)) {
        memset(dst, (int)z, len);
    } else {
        const VF s = _mm512_set1_ps(*absmax);
        const __m128i sh = _mm_cvtsi32_si128((int)t->shift);
        const __m512i kb = _mm512_set1_epi32(t->kbias), top = _mm512_set1_epi32(t->nmag - 1),
                      nm = _mm512_set1_epi32(t->nmag);
        for (size_t i = 0; i < len; i += 16) {
            __mmask16 m = len - i >= 16 ? (__mmask16)0xffff : kmask((unsigned)(len - i));
            VF v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), s);
            __m512i b = _mm512_castps_si512(v);
            __m512i k = _mm512_sub_epi32(_mm512_srl_epi32(_mm512_and_si512(b, abs), sh), kb);
            k = _mm512_min_epi32(_mm512_max_epi32(k, _mm512_setzero_si512()), top);
            k = _mm512_add_epi32(k, _mm512_and_si512(_mm512_srai_epi32(b, 31), nm));
            __m512i base = _mm512_and_si512(_mm512_i32gather_epi32(k, (const int *)t->bucket, 1),
                                            _mm512_set1_epi32(0xff));
            VF mid = _mm512_i32gather_ps(base, t->mid, 4);
            __mmask16 up = _mm512_cmp_ps_mask(v, mid, _CMP_GT_OQ);
            __m512i q = _mm512_mask_add_epi32(base, up, base, _mm512_set1_epi32(1));
            _mm_mask_storeu_epi8(dst + i, m, _mm512_cvtepi32_epi8(q));
        }
    }
    if (bits != 8)
        zo__qpack(c, len, bits, codes);
}

/* Data only: generic code (kernels_ref.c) picks it after checking the CPU. */
const zo_cpuadam_dsp zo__cpuadam_avx512 = {
    .name = "avx512",
    .step = kt_step,
    .rollback = kt_rollback,
    .grad_stats = kt_grad_stats,
    .stream_bound = kt_stream_bound,
    .qdequant = q_dequant,
    .qquant = q_quant,
};
