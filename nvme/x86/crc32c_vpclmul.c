/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C by carry-less folding on 512-bit registers (AVX-512F + VPCLMULQDQ),
 * the ends with the SSE4.2 crc32 instruction. Compiled with those flags
 * only; called only when the CPU has them (ZO__CRC_VPCLMUL512_NEEDS).
 *
 * Why: the crc32q kernel is bound by one crc32 a cycle (8 bytes). A
 * VPCLMULQDQ on a zmm register multiplies four 128-bit blocks at once, so
 * folding 64 bytes costs two multiplies and one three-way XOR, and four
 * independent accumulators hide the multiply's latency: fewer core cycles
 * per byte, which is what matters when the checksum shares two cores with
 * the I/O it guards.
 *
 * How (the algebra and the constants are in nvme_internal.h, next to
 * zo__crc_fold): the CRC register is XORed into the first four message
 * bytes (the instruction's own definition of a running CRC), then every
 * 128-bit lane of the accumulators is carried forward over the data with
 * multiplies by x^D mod P, lanes are joined the same way into one 128-bit
 * block that is congruent mod P to everything read so far, and the CRC of
 * that block (two crc32q from zero) is the CRC of the prefix. The tail
 * (< 64 bytes) goes through crc32q again. */
#include <immintrin.h>
#include <string.h>

#include "nvme/nvme_internal.h"
#include "nvme/x86/crc32c_x86.h"

static inline __m512i broadcast_pair(const uint64_t k[2])
{
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)k));
}

/* acc * x^D ^ data for each 128-bit lane: low qwords times the low
 * constant, high qwords times the high one, all three XORed (0x96). */
static inline __m512i fold(__m512i acc, __m512i k, __m512i data)
{
    __m512i lo = _mm512_clmulepi64_epi128(acc, k, 0x00);
    __m512i hi = _mm512_clmulepi64_epi128(acc, k, 0x11);
    return _mm512_ternarylogic_epi64(lo, hi, data, 0x96);
}

static inline __m512i load(const uint8_t *p)
{
    return _mm512_load_si512((const void *)p); /* p is 64-byte aligned here */
}

static uint32_t vpclmul_crc32c(uint32_t reg, const uint8_t *p, size_t n)
{
    if (n < ZO__CRC_VPCLMUL_MIN)
        return zo__crc32c_sse42(reg, p, n);
    uint64_t r = zo__crc_align_head(reg, &p, &n, 64);
    if (n < ZO__CRC_VPCLMUL_MIN)
        return zo__crc32c_sse42((uint32_t)r, p, n);

    const zo__crc_fold *K = &zo__crc_fold_k;
    __m512i a0 = _mm512_xor_si512(load(p), _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, (long long)r));
    __m512i a1 = load(p + 64), a2 = load(p + 128), a3 = load(p + 192);
    p += 256;
    n -= 256;
    __m512i k = broadcast_pair(K->d2048);
    while (n >= 256) {
        a0 = fold(a0, k, load(p));
        a1 = fold(a1, k, load(p + 64));
        a2 = fold(a2, k, load(p + 128));
        a3 = fold(a3, k, load(p + 192));
        p += 256;
        n -= 256;
    }
    /* a0..a3 sit 192, 128, 64 and 0 bytes before the end of what was read:
     * carry each onto a3's place. The three folds are independent. */
    a3 = fold(a2, broadcast_pair(K->d512), a3);
    a3 = fold(a1, broadcast_pair(K->d1024), a3);
    a3 = fold(a0, broadcast_pair(K->d1536), a3);
    k = broadcast_pair(K->d512);
    while (n >= 64) {
        a3 = fold(a3, k, load(p));
        p += 64;
        n -= 64;
    }
    /* Lanes 0..2 onto lane 3 (its constant pair is zero, so the product
     * leaves lane 3 at zero and it is XORed in as it is). */
    __m512i t = fold(a3, _mm512_loadu_si512((const void *)K->lanes), _mm512_setzero_si512());
    __m128i x = _mm_xor_si128(_mm512_extracti32x4_epi32(a3, 3), _mm512_castsi512_si128(t));
    x = _mm_xor_si128(x, _mm_xor_si128(_mm512_extracti32x4_epi32(t, 1), _mm512_extracti32x4_epi32(t, 2)));
    r = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    r = _mm_crc32_u64(r, (uint64_t)_mm_extract_epi64(x, 1));
    return zo__crc32c_sse42((uint32_t)r, p, n);
}

/* Data only: checksum.c picks it after checking the CPU. */
const zo__crc_dsp zo__crc_vpclmul512 = {
    .name = "vpclmul512",
    .crc32c = vpclmul_crc32c,
};
