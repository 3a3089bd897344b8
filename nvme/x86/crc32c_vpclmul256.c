/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C by carry-less folding on 256-bit registers (AVX2 + VPCLMULQDQ, no
 * AVX-512: Zen 3, Alder Lake and later client cores), the ends with the
 * SSE4.2 crc32 instruction. Compiled with those flags only; called only
 * when the CPU has them (ZO__CRC_VPCLMUL256_NEEDS).
 *
 * The same algebra as the 512-bit kernel (crc32c_vpclmul.c, constants in
 * nvme_internal.h) on half the width: four 256-bit accumulators take 128
 * bytes a step (distance 1024 bits), are joined onto the last one (768,
 * 512, 256 bits), single 32-byte steps follow (256 bits), and the two
 * 128-bit lanes are joined (128 bits) into one block whose CRC, two crc32q
 * from zero, is the CRC of the prefix. Why not the crc32q kernel: it is
 * bound by one crc32 a cycle (8 bytes), while two VPCLMULQDQ on a ymm
 * register fold 32 bytes. */
#include <immintrin.h>
#include <string.h>

#include "nvme/nvme_internal.h"
#include "nvme/x86/crc32c_x86.h"

static inline __m256i pair(const uint64_t k[2])
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)k));
}

/* acc * x^D ^ data for each 128-bit lane (see crc32c_vpclmul.c). */
static inline __m256i fold(__m256i acc, __m256i k, __m256i data)
{
    __m256i lo = _mm256_clmulepi64_epi128(acc, k, 0x00);
    __m256i hi = _mm256_clmulepi64_epi128(acc, k, 0x11);
    return _mm256_xor_si256(_mm256_xor_si256(lo, hi), data);
}

static inline __m256i load(const uint8_t *p)
{
    return _mm256_load_si256((const __m256i *)(const void *)p); /* 32-byte aligned here */
}

static uint32_t vpclmul256_crc32c(uint32_t reg, const uint8_t *p, size_t n)
{
    if (n < ZO__CRC_VPCLMUL_MIN)
        return zo__crc32c_sse42(reg, p, n);
    uint64_t r = zo__crc_align_head(reg, &p, &n, 32);
    if (n < ZO__CRC_VPCLMUL_MIN)
        return zo__crc32c_sse42((uint32_t)r, p, n);

    const zo__crc_fold *K = &zo__crc_fold_k;
    __m256i a0 = _mm256_xor_si256(load(p), _mm256_set_epi64x(0, 0, 0, (long long)r));
    __m256i a1 = load(p + 32), a2 = load(p + 64), a3 = load(p + 96);
    p += 128;
    n -= 128;
    __m256i k = pair(K->d1024);
    while (n >= 128) {
        a0 = fold(a0, k, load(p));
        a1 = fold(a1, k, load(p + 32));
        a2 = fold(a2, k, load(p + 64));
        a3 = fold(a3, k, load(p + 96));
        p += 128;
        n -= 128;
    }
    /* a0..a2 sit 96, 64 and 32 bytes before a3: carry each onto it. */
    a3 = fold(a2, pair(K->lanes + 2), a3); /* 256 bits */
    a3 = fold(a1, pair(K->d512), a3);
    a3 = fold(a0, pair(K->d768), a3);
    k = pair(K->lanes + 2);
    while (n >= 32) {
        a3 = fold(a3, k, load(p));
        p += 32;
        n -= 32;
    }
    /* lane 0 onto lane 1 (128 bits); lane 1 of t is not used */
    __m256i t = fold(a3, pair(K->lanes + 4), _mm256_setzero_si256());
    __m128i x = _mm_xor_si128(_mm256_extracti128_si256(a3, 1), _mm256_castsi256_si128(t));
    r = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    r = _mm_crc32_u64(r, (uint64_t)_mm_extract_epi64(x, 1));
    return zo__crc32c_sse42((uint32_t)r, p, n);
}

/* Data only: checksum.c picks it after checking the CPU. */
const zo__crc_dsp zo__crc_vpclmul256 = {
    .name = "vpclmul256",
    .crc32c = vpclmul256_crc32c,
};
