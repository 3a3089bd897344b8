/* SPDX-License-Identifier: Apache-2.0 */
/* cpuadam kernels for AVX-512 F/BW/VL/DQ. Compiled with those flags only.
 * bf16 outputs and states round in integer arithmetic, bit-identical to the
 * C reference conversion. */
#define ZO_KT_CVT_BF16(x) bf16_rne_int(x)
#include "cpuadam/x86/avx512_layer.h"

#include <string.h>

/* ---- quantized states: block dequantize / quantize -------------------------
 * The same operations as zo__q_dequant_ref / zo__q_quant_ref (one multiply
 * per element out; one multiply (zo__qquot) and a code search in), 16 lanes, masked
 * for the block's tail. The avx512bf16 variant inherits these.
 *  - 8 bits: dequantize with one gather of the value table; quantize with
 *    one gather of the packed buckets (zo__qcode_packed(), which the map
 *    builder checks against zo__qcode()). The reference's two dependent
 *    gathers (bucket byte, then midpoint) took twice as long on Emerald
 *    Rapids: 0.78 against 0.40 ns per element (docs/cpuadam.md).
 *  - 4 bits: no gathers. The 16 values and the 15 midpoints (+inf after
 *    the last) each fit one register: a value is one VPERMPS, a code a
 *    4-step binary search for #{k : x > mid[k]} whose candidates come from
 *    the midpoint register by VPERMPS. Nibbles are (un)packed 16 codes at
 *    a time. */

/* The 16 4-bit codes of codes[0 .. (k+1)/2) as 32-bit lanes (lane 2j the
 * low nibble of byte j), lanes k and up 0. */
LAI __m512i q4_codes16(const uint8_t *codes, unsigned k)
{
    __m128i b = _mm_maskz_loadu_epi8((__mmask16)((1u << ((k + 1) / 2)) - 1u), codes);
    __m512i w = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b)); /* each byte twice */
    w = _mm512_srlv_epi32(w, _mm512_set4_epi32(4, 0, 4, 0));
    return _mm512_maskz_and_epi32(kmask(k), w, _mm512_set1_epi32(15));
}

static void q_dequant(const uint8_t *codes, int bits, const zo__qmap_tab *t, float absmax, float *x,
                      size_t len)
{
    const VF s = _mm512_set1_ps(absmax);
    if (bits == 8) {
        size_t i = 0;
        for (; i + 16 <= len; i += 16) { /* unmasked: masks cost ~15% here */
            __m512i k = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i)));
            _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_i32gather_ps(k, t->value, 4), s));
        }
        if (i < len) {
            __mmask16 m = kmask((unsigned)(len - i));
            __m512i k = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, codes + i));
            VF v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, k, t->value, 4);
            _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(v, s));
        }
        return;
    }
    const VF tv = _mm512_load_ps(t->value);
    for (size_t i = 0; i < len; i += 16) { /* i even: whole bytes */
        unsigned k = len - i >= 16 ? 16u : (unsigned)(len - i);
        VF v = _mm512_permutexvar_ps(q4_codes16(codes + i / 2, k), tv);
        _mm512_mask_storeu_ps(x + i, kmask(k), _mm512_mul_ps(v, s));
    }
}

/* The packed-bucket constants of a map, loaded once per block. */
typedef struct q8keys {
    const int *pb;
    __m128i shift;
    __m512i kbias, kmax, nmag, lowmask;
} q8keys;

LAI q8keys q8keys_load(const zo__qmap_tab *t)
{
    q8keys q;
    q.pb = (const int *)t->pbucket;
    q.shift = _mm_cvtsi32_si128((int)t->shift);
    q.kbias = _mm512_set1_epi32(t->kbias);
    q.kmax = _mm512_set1_epi32(t->nmag - 1);
    q.nmag = _mm512_set1_epi32(t->nmag);
    q.lowmask = _mm512_set1_epi32((int)t->lowmask);
    return q;
}

/* 8-bit codes of 16 quotients (zo__qcode_packed()): one gather. Masked-off
 * lanes gather nothing. */
LAI __m512i q_codes8(const q8keys *q, VF x, __mmask16 m)
{
    __m512i b = _mm512_castps_si512(x);
    __m512i k = _mm512_sub_epi32(_mm512_srl_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)), q->shift),
                                 q->kbias);
    k = _mm512_min_epi32(_mm512_max_epi32(k, _mm512_setzero_si512()), q->kmax);
    __m512i neg = _mm512_srai_epi32(b, 31);
    k = _mm512_add_epi32(k, _mm512_and_si512(neg, q->nmag));
    __m512i e = m == 0xffff ? _mm512_i32gather_epi32(k, q->pb, 4)
                            : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, k, q->pb, 4);
    __m512i low = _mm512_and_si512(_mm512_xor_si512(b, neg), q->lowmask);
    __mmask16 up = _mm512_cmpgt_epu32_mask(low, _mm512_srli_epi32(e, 8));
    return _mm512_mask_add_epi32(_mm512_and_si512(e, _mm512_set1_epi32(0xff)), up,
                                 _mm512_and_si512(e, _mm512_set1_epi32(0xff)), _mm512_set1_epi32(1));
}

/* zo__qquot() of 16 lanes: s is zo__qdiv's s broadcast. (Masked-off lanes
 * are 0: 0 / absmax is no fault.) */
LAI VF qquot(zo__qdiv d, VF x, VF s)
{
    return d.recip ? _mm512_mul_ps(x, s) : _mm512_div_ps(x, s);
}

/* #{k : x > mid[k]} over the sorted mid[0..15] (mid[15] and up are +inf),
 * as c += s where x > mid[c + s - 1] for s = 8, 4, 2, 1. x is finite (a
 * block with inf or NaN takes zo__qscale()'s path). */
LAI __m512i q_codes4(VF mids, VF x)
{
    __m512i c = _mm512_setzero_si512();
    for (int s = 8; s; s >>= 1) {
        VF mid = _mm512_permutexvar_ps(_mm512_add_epi32(c, _mm512_set1_epi32(s - 1)), mids);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(x, mid, _CMP_GT_OQ), c, _mm512_set1_epi32(s));
    }
    return c;
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
    unsigned z = 0;
    if (!zo__qscale(t, amax, absmax, &z)) {
        memset(codes, bits == 8 ? (int)z : (int)(z | z << 4), bits == 8 ? len : len / 2);
        if (bits != 8 && len % 2)
            codes[len / 2] = (uint8_t)z; /* an odd tail's high nibble is 0 */
        return;
    }
    const zo__qdiv d = zo__qdiv_of(*absmax);
    const VF s = _mm512_set1_ps(d.s);
    if (bits == 8) {
        const q8keys q = q8keys_load(t);
        size_t i = 0;
        for (; i + 16 <= len; i += 16) {
            __m512i c = q_codes8(&q, qquot(d, _mm512_loadu_ps(x + i), s), (__mmask16)0xffff);
            _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(c));
        }
        if (i < len) {
            __mmask16 m = kmask((unsigned)(len - i));
            __m512i c = q_codes8(&q, qquot(d, _mm512_maskz_loadu_ps(m, x + i), s), m);
            _mm_mask_storeu_epi8(codes + i, m, _mm512_cvtepi32_epi8(c));
        }
        return;
    }
    const VF mids = _mm512_load_ps(t->mid);
    for (size_t i = 0; i < len; i += 16) { /* i even: whole bytes */
        unsigned k = len - i >= 16 ? 16u : (unsigned)(len - i);
        __m512i c = _mm512_maskz_mov_epi32(kmask(k), q_codes4(mids, qquot(d, _mm512_maskz_loadu_ps(kmask(k), x + i), s)));
        /* lane pair (2j, 2j+1) -> byte j = c[2j] | c[2j+1] << 4 */
        __m512i p = _mm512_or_si512(c, _mm512_srli_epi64(c, 28));
        _mm_mask_storeu_epi8(codes + i / 2, (__mmask16)((1u << ((k + 1) / 2)) - 1u), _mm512_cvtepi64_epi8(p));
    }
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
