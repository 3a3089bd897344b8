/* SPDX-License-Identifier: Apache-2.0 */
/* cpuadam kernels for AVX2 + FMA + F16C. Compiled with those flags only.
 * Partial vectors go through a small stack buffer (AVX2 has no 16-bit
 * masked loads), so tails get the same vector arithmetic as the body. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "core/vec_ref.h"
#include "cpuadam/cpuadam_internal.h"

#define W 8u
typedef __m256 VF;

#define LAI static inline __attribute__((always_inline))

LAI VF vf_set1(float x) { return _mm256_set1_ps(x); }
LAI VF vf_zero(void) { return _mm256_setzero_ps(); }
LAI VF vf_add(VF a, VF b) { return _mm256_add_ps(a, b); }
LAI VF vf_sub(VF a, VF b) { return _mm256_sub_ps(a, b); }
LAI VF vf_mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
LAI VF vf_div(VF a, VF b) { return _mm256_div_ps(a, b); }
LAI VF vf_fma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
LAI VF vf_fnma(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
LAI VF vf_sqrt(VF a) { return _mm256_sqrt_ps(a); }
/* MAXPS returns its second operand when either is NaN: NaN stays. */
LAI VF vf_max0(VF a) { return _mm256_max_ps(_mm256_setzero_ps(), a); }

LAI VF vf_sign_nan(VF c)
{
    VF nz = _mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    VF nan = _mm256_cmp_ps(c, c, _CMP_UNORD_Q);
    VF s = _mm256_or_ps(_mm256_and_ps(c, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
    return _mm256_blendv_ps(_mm256_and_ps(s, nz), c, nan);
}

/* f32 -> bf16 in integer arithmetic, bit-identical to the reference. */
LAI __m128i bf16_rne8(VF xf)
{
    __m256i x = _mm256_castps_si256(xf);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i q = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));
    r = _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

LAI VF cvt_in(__m128i h, int t)
{
    if (t == ZO__T_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

LAI __m128i cvt_out(VF x, int t)
{
    if (t == ZO__T_F16)
        return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return bf16_rne8(x);
}

LAI VF ldv(const void *base, int t, size_t i)
{
    if (t == ZO__T_F32)
        return _mm256_loadu_ps((const float *)base + i);
    return cvt_in(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)), t);
}

LAI void stv(void *base, int t, size_t i, VF x, int nt)
{
    if (t == ZO__T_F32) {
        float *f = (float *)base + i;
        if (nt)
            _mm256_stream_ps(f, x);
        else
            _mm256_storeu_ps(f, x);
        return;
    }
    __m128i *h = (__m128i *)((uint16_t *)base + i);
    if (nt)
        _mm_stream_si128(h, cvt_out(x, t));
    else
        _mm_storeu_si128(h, cvt_out(x, t));
}

LAI void kt_fence(void) { _mm_sfence(); }

/* Software prefetch, KT_PF_DIST elements ahead, of the four input streams
 * when a gradient or state stream is 16-bit. Why: on Zen 3 the step's
 * sqrt/div chains fill the reorder window, and with a half-rate bf16 stream
 * among them the hardware prefetchers leave too few loads in flight: the
 * fused bf16 step (bf16 grads in, bf16 params out) ran at 0.89x the
 * in-place bound without it and at 0.98-1.04x with it. With four fp32
 * streams the hardware prefetchers do the job and the extra instructions
 * cost: 0.94-0.97x with the prefetch, 0.98-0.99x without (docs/benchmarks.md,
 * issue 20). G and S are constants in each instantiation, so the test folds.
 * 1024 elements is 4 KiB ahead per fp32 stream: inside L1, far enough for
 * DRAM latency at this bandwidth. */
#define KT_PF_DIST 1024
#define KT_PREFETCH(j, i, G, S)                                                              \
    do {                                                                                     \
        if ((G) == ZO__T_F32 && (S) == ZO__T_F32)                                            \
            break;                                                                           \
        _mm_prefetch((const char *)((j)->p + (i) + KT_PF_DIST), _MM_HINT_T0);                \
        _mm_prefetch((const char *)(j)->g + ((i) + KT_PF_DIST) * tsize(G), _MM_HINT_T0);     \
        _mm_prefetch((const char *)(j)->m + ((i) + KT_PF_DIST) * tsize(S), _MM_HINT_T0);     \
        _mm_prefetch((const char *)(j)->v + ((i) + KT_PF_DIST) * tsize(S), _MM_HINT_T0);     \
    } while (0)

typedef __m256d SD;
typedef __m256i SC;
LAI SD sd_zero(void) { return _mm256_setzero_pd(); }
LAI SC sc_zero(void) { return _mm256_setzero_si256(); }

LAI void stats_vec(VF x, SD *a0, SD *a1, SC *cnt)
{
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    *a0 = _mm256_fmadd_pd(lo, lo, *a0);
    *a1 = _mm256_fmadd_pd(hi, hi, *a1);
    __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), e), e);
    *cnt = _mm256_sub_epi32(*cnt, bad); /* bad lanes are -1 */
}

LAI uint64_t sc_sum(SC c)
{
    _Alignas(32) uint32_t l[8];
    _mm256_store_si256((__m256i *)l, c);
    uint64_t s = 0;
    for (int k = 0; k < 8; k++)
        s += l[k];
    return s;
}

LAI double sd_sum4(SD a0, SD a1, SD a2, SD a3)
{
    __m256d s = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

#define KT_PART_BY_BUFFER
#include "cpuadam/kernel_tmpl.h"

/* ---- quantized states: block dequantize / quantize -------------------------
 * The same operations as zo__q_dequant_ref / zo__q_quant_ref: one multiply
 * per element out, one multiply (zo__qquot) and a code search in, the code found
 * without searching linearly. Why not the reference's two dependent
 * gathers: on Zen 3 an 8-lane gather costs about 13 cycles, more than the
 * rest of the per-element work together (docs/cpuadam.md).
 *  - 8 bits: dequantize with one lookup of the value table; quantize with
 *    one lookup of the packed buckets (zo__qcode_packed(), which the map
 *    builder checks against zo__qcode()). A lookup is eight scalar loads
 *    inserted into a vector (lut8_bytes(), lut8_idx()), not VGATHERDPS.
 *  - 4 bits: no gathers. The 16 values and the 15 midpoints (+inf after
 *    the last) live in registers: a value is two VPERMPS over the halves
 *    and a blend on bit 3; a code is a 4-step binary search for
 *    #{k : x > mid[k]}, each step's candidates few enough for one
 *    register (1, 2, 4, 8 of them). Nibbles are (un)packed 16 codes at a
 *    time.
 * Tails of fewer than 8 elements run the scalar definition. */

/* Eight 32-bit table entries t[i0..i7] by scalar loads into one vector
 * (moved as bits). Why not VGATHERDPS: on Zen 3 an 8-lane gather from an
 * L1 table took 0.55-0.89 ns per element in a loop of nothing else, eight
 * loads folded into VINSERTPS 0.29-0.52 ns (docs/cpuadam.md); the loads
 * use the three load ports, the inserts a shuffle port the step hardly
 * uses. */
LAI VF lut8(const void *tab, uint64_t i0, uint64_t i1, uint64_t i2, uint64_t i3, uint64_t i4, uint64_t i5,
            uint64_t i6, uint64_t i7)
{
    const float *t = (const float *)tab;
    __m128 a = _mm_load_ss(t + i0);
    a = _mm_insert_ps(a, _mm_load_ss(t + i1), 0x10);
    a = _mm_insert_ps(a, _mm_load_ss(t + i2), 0x20);
    a = _mm_insert_ps(a, _mm_load_ss(t + i3), 0x30);
    __m128 b = _mm_load_ss(t + i4);
    b = _mm_insert_ps(b, _mm_load_ss(t + i5), 0x10);
    b = _mm_insert_ps(b, _mm_load_ss(t + i6), 0x20);
    b = _mm_insert_ps(b, _mm_load_ss(t + i7), 0x30);
    return _mm256_set_m128(b, a);
}

/* t[code] for the eight byte codes of c (byte 0 first). */
LAI VF lut8_bytes(const float *t, uint64_t c)
{
    return lut8(t, c & 255, (c >> 8) & 255, (c >> 16) & 255, (c >> 24) & 255, (c >> 32) & 255, (c >> 40) & 255,
                (c >> 48) & 255, c >> 56);
}

/* t[k] for the eight 32-bit indices of k. */
LAI __m256i lut8_idx(const uint32_t *t, __m256i k)
{
    __m128i lo = _mm256_castsi256_si128(k), hi = _mm256_extracti128_si256(k, 1);
    uint64_t a0 = (uint64_t)_mm_cvtsi128_si64(lo), a1 = (uint64_t)_mm_extract_epi64(lo, 1);
    uint64_t b0 = (uint64_t)_mm_cvtsi128_si64(hi), b1 = (uint64_t)_mm_extract_epi64(hi, 1);
    return _mm256_castps_si256(lut8(t, (uint32_t)a0, a0 >> 32, (uint32_t)a1, a1 >> 32, (uint32_t)b0, b0 >> 32,
                                    (uint32_t)b1, b1 >> 32));
}

/* 4-bit codes of x[i] -> per-element bytes, len even or odd. */
static void q4_unpack(const uint8_t *codes, size_t len, uint8_t *c)
{
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        /* 8 bytes -> 8 words b; byte 2k = b & 15, byte 2k+1 = b >> 4 */
        __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(codes + i / 2)));
        w = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0f)),
                         _mm_and_si128(_mm_slli_epi16(w, 4), _mm_set1_epi16(0x0f00)));
        _mm_storeu_si128((__m128i *)(c + i), w);
    }
    for (; i < len; i++)
        c[i] = (codes[i / 2] >> (4 * (i & 1))) & 15;
}

static void q4_pack(const uint8_t *c, size_t len, uint8_t *codes)
{
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        /* word k = c[2k] | c[2k+1] << 8 -> c[2k] | c[2k+1] << 4 */
        __m128i w = _mm_loadu_si128((const __m128i *)(c + i));
        w = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0f)),
                         _mm_and_si128(_mm_srli_epi16(w, 4), _mm_set1_epi16(0xf0)));
        _mm_storel_epi64((__m128i *)(codes + i / 2), _mm_packus_epi16(w, w));
    }
    zo__qpack(c + i, len - i, 4, codes + i / 2); /* i is even */
}

static void q_dequant(const uint8_t *codes, int bits, const zo__qmap_tab *t, float absmax, float *x,
                      size_t len)
{
    _Alignas(32) uint8_t buf[ZO__QBLOCK_MAX];
    const VF s = _mm256_set1_ps(absmax);
    size_t i = 0;
    if (bits == 8) {
        for (; i + 8 <= len; i += 8) {
            uint64_t c;
            memcpy(&c, codes + i, 8);
            _mm256_storeu_ps(x + i, _mm256_mul_ps(lut8_bytes(t->value, c), s));
        }
        zo__qvalues(t, codes, i, len, absmax, x);
        return;
    }
    q4_unpack(codes, len, buf);
    const VF lo = _mm256_load_ps(t->value), hi = _mm256_load_ps(t->value + 8);
    for (; i + 8 <= len; i += 8) {
        __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(buf + i)));
        VF v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, k), _mm256_permutevar8x32_ps(hi, k),
                                _mm256_castsi256_ps(_mm256_slli_epi32(k, 28)));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(v, s));
    }
    zo__qvalues(t, buf, i, len, absmax, x);
}

/* The packed-bucket constants of a map, loaded once per block: the code
 * stores are bytes, which may alias the table, so the compiler would
 * otherwise reload them for every vector. */
typedef struct q8keys {
    const int *pb;
    __m128i shift;
    __m256i kbias, kmax, nmag, lowmask;
} q8keys;

LAI q8keys q8keys_load(const zo__qmap_tab *t)
{
    q8keys q;
    q.pb = (const int *)t->pbucket;
    q.shift = _mm_cvtsi32_si128((int)t->shift);
    q.kbias = _mm256_set1_epi32(t->kbias);
    q.kmax = _mm256_set1_epi32(t->nmag - 1);
    q.nmag = _mm256_set1_epi32(t->nmag);
    q.lowmask = _mm256_set1_epi32((int)t->lowmask);
    return q;
}

/* 8-bit codes of 8 quotients (zo__qcode_packed()): one gather. */
LAI __m256i q_codes8(const q8keys *q, VF x)
{
    __m256i b = _mm256_castps_si256(x);
    __m256i k = _mm256_sub_epi32(_mm256_srl_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), q->shift),
                                 q->kbias);
    k = _mm256_min_epi32(_mm256_max_epi32(k, _mm256_setzero_si256()), q->kmax);
    __m256i neg = _mm256_srai_epi32(b, 31);
    k = _mm256_add_epi32(k, _mm256_and_si256(neg, q->nmag));
    __m256i e = lut8_idx((const uint32_t *)q->pb, k);
    __m256i low = _mm256_and_si256(_mm256_xor_si256(b, neg), q->lowmask);
    /* the compare gives -1 where low > thr: subtracting adds 1 */
    return _mm256_sub_epi32(_mm256_and_si256(e, _mm256_set1_epi32(0xff)),
                            _mm256_cmpgt_epi32(low, _mm256_srli_epi32(e, 8)));
}

/* The midpoints a 4-bit binary search compares with at each step. */
typedef struct q4mids {
    VF m7, m3, m11, m_c1, m_c0; /* m_c1[c/4] = mid[c+1], m_c0[c/2] = mid[c] */
} q4mids;

LAI q4mids q4mids_load(const zo__qmap_tab *t)
{
    q4mids q;
    const float *m = t->mid;
    q.m7 = _mm256_set1_ps(m[7]);
    q.m3 = _mm256_set1_ps(m[3]);
    q.m11 = _mm256_set1_ps(m[11]);
    q.m_c1 = _mm256_setr_ps(m[1], m[5], m[9], m[13], m[1], m[5], m[9], m[13]);
    q.m_c0 = _mm256_setr_ps(m[0], m[2], m[4], m[6], m[8], m[10], m[12], m[14]);
    return q;
}

/* #{k : x > mid[k]} over the sorted mid[0..15] (mid[15] and up are +inf),
 * as c += s where x > mid[c + s - 1] for s = 8, 4, 2, 1. */
LAI __m256i q_codes4(const q4mids *q, VF x)
{
    VF gt = _mm256_cmp_ps(x, q->m7, _CMP_GT_OQ);
    __m256i c = _mm256_and_si256(_mm256_castps_si256(gt), _mm256_set1_epi32(8));
    gt = _mm256_cmp_ps(x, _mm256_blendv_ps(q->m3, q->m11, gt), _CMP_GT_OQ);
    c = _mm256_add_epi32(c, _mm256_and_si256(_mm256_castps_si256(gt), _mm256_set1_epi32(4)));
    gt = _mm256_cmp_ps(x, _mm256_permutevar8x32_ps(q->m_c1, _mm256_srli_epi32(c, 2)), _CMP_GT_OQ);
    c = _mm256_add_epi32(c, _mm256_and_si256(_mm256_castps_si256(gt), _mm256_set1_epi32(2)));
    gt = _mm256_cmp_ps(x, _mm256_permutevar8x32_ps(q->m_c0, _mm256_srli_epi32(c, 1)), _CMP_GT_OQ);
    return _mm256_sub_epi32(c, _mm256_castps_si256(gt));
}

/* zo__qquot() of 8 lanes: s is zo__qdiv's s broadcast. */
LAI VF qquot(zo__qdiv d, VF x, VF s)
{
    return d.recip ? _mm256_mul_ps(x, s) : _mm256_div_ps(x, s);
}

/* 8 x 32-bit codes (< 256) -> 8 bytes at dst */
LAI void q_store8(uint8_t *dst, __m256i q)
{
    q = _mm256_packus_epi16(_mm256_packus_epi32(q, q), _mm256_setzero_si256());
    q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
    _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(q));
}

static void q_quant(const float *x, size_t len, const zo__qmap_tab *t, int bits, uint8_t *codes, float *absmax)
{
    __m256i am = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= len; i += 8) /* unsigned max of |x| bits: NaN > inf > finite */
        am = _mm256_max_epu32(am, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)),
                                                   _mm256_set1_epi32(0x7fffffff)));
    _Alignas(32) uint32_t l[8];
    _mm256_store_si256((__m256i *)l, am);
    uint32_t amax = 0;
    for (int k = 0; k < 8; k++)
        amax = l[k] > amax ? l[k] : amax;
    amax = zo__qamax(x, i, len, amax);
    _Alignas(32) uint8_t c[ZO__QBLOCK_MAX];
    uint8_t *dst = bits == 8 ? codes : c; /* 8 bits: codes go straight out */
    unsigned z = 0;
    if (!zo__qscale(t, amax, absmax, &z)) {
        memset(dst, (int)z, len);
    } else if (bits == 8) {
        const zo__qdiv d = zo__qdiv_of(*absmax);
        const VF s = _mm256_set1_ps(d.s);
        const q8keys q = q8keys_load(t);
        for (i = 0; i + 8 <= len; i += 8)
            q_store8(dst + i, q_codes8(&q, qquot(d, _mm256_loadu_ps(x + i), s)));
        zo__qcodes(t, x, i, len, d, dst);
    } else {
        const zo__qdiv d = zo__qdiv_of(*absmax);
        const VF s = _mm256_set1_ps(d.s);
        const q4mids q = q4mids_load(t);
        for (i = 0; i + 8 <= len; i += 8)
            q_store8(dst + i, q_codes4(&q, qquot(d, _mm256_loadu_ps(x + i), s)));
        zo__qcodes(t, x, i, len, d, dst);
    }
    if (bits != 8)
        q4_pack(c, len, codes);
}

/* Data only: generic code (kernels_ref.c) picks it after checking the CPU. */
const zo_cpuadam_dsp zo__cpuadam_avx2 = {
    .name = "avx2",
    .step = kt_step,
    .rollback = kt_rollback,
    .grad_stats = kt_grad_stats,
    .stream_bound = kt_stream_bound,
    .qdequant = q_dequant,
    .qquant = q_quant,
};
