/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C by carry-less folding with PMULL (64 x 64-bit polynomial
 * multiply, the AES extension's), the ends with the CRC32C instructions.
 * Compiled with +crc+crypto only; called only when the CPU has both
 * (ZO__CRC_PMULL_NEEDS).
 *
 * Why: the CRC32C instruction kernel is bound by one CRC32CX a cycle (8
 * bytes), while folding 16 bytes costs two PMULL and two EOR, and cores
 * such as Neoverse V1/V2 issue several of those a cycle. Which kernel wins
 * on a given core is for zo-store-bench / zo-info on that hardware to say
 * (ZO_CPU_MASK=-pmull pins the other one).
 *
 * How: the algebra of the VPCLMULQDQ kernels on 128-bit registers (the
 * constants are in nvme_internal.h, next to zo__crc_fold; PMULL's product
 * is PCLMULQDQ's, bit for bit). The CRC register is XORed into the first
 * four message bytes, eight accumulators take 128 bytes a step (distance
 * 1024 bits), the first four are carried onto the last four (512 bits),
 * those onto the last one (384, 256, 128 bits), single 16-byte steps
 * follow (128 bits), and the CRC of the one block left (two CRC32CX from
 * zero) is the CRC of the prefix. The tail (< 16 bytes) goes through the
 * CRC32C instructions again. */
#include <arm_neon.h>

#include "nvme/arm/crc32c_arm.h"

static inline uint64x2_t pair(const uint64_t k[2])
{
    return vld1q_u64(k);
}

/* acc * x^D ^ data: the low qword times the low constant, the high one
 * times the high one, all three XORed. */
static inline uint64x2_t fold(uint64x2_t acc, uint64x2_t k, uint64x2_t data)
{
    poly128_t lo = vmull_p64((poly64_t)vgetq_lane_u64(acc, 0), (poly64_t)vgetq_lane_u64(k, 0));
    poly128_t hi = vmull_high_p64(vreinterpretq_p64_u64(acc), vreinterpretq_p64_u64(k));
    return veorq_u64(veorq_u64(vreinterpretq_u64_p128(lo), vreinterpretq_u64_p128(hi)), data);
}

static inline uint64x2_t load(const uint8_t *p)
{
    return vreinterpretq_u64_u8(vld1q_u8(p)); /* 16-byte aligned here */
}

static uint32_t pmull_crc32c(uint32_t reg, const uint8_t *p, size_t n)
{
    if (n < ZO__CRC_PMULL_MIN)
        return zo__crc32c_armv8(reg, p, n);
    uint64_t r = zo__crc_align_head(reg, &p, &n, 16);

    const zo__crc_fold *K = &zo__crc_fold_k;
    uint64x2_t a[8];
    for (int i = 0; i < 8; i++)
        a[i] = load(p + 16 * i);
    a[0] = veorq_u64(a[0], vsetq_lane_u64(r, vdupq_n_u64(0), 0));
    p += 128;
    n -= 128;
    uint64x2_t k = pair(K->d1024);
    while (n >= 128) {
        for (int i = 0; i < 8; i++)
            a[i] = fold(a[i], k, load(p + 16 * i));
        p += 128;
        n -= 128;
    }
    /* a[i] sits 64 bytes before a[i + 4]; then a[4..6] 48, 32 and 16 bytes
     * before a[7]. */
    k = pair(K->d512);
    for (int i = 0; i < 4; i++)
        a[i + 4] = fold(a[i], k, a[i + 4]);
    uint64x2_t x = fold(a[4], pair(K->lanes), a[7]); /* 384 bits */
    x = fold(a[5], pair(K->lanes + 2), x);           /* 256 */
    x = fold(a[6], pair(K->lanes + 4), x);           /* 128 */
    k = pair(K->lanes + 4);
    while (n >= 16) {
        x = fold(x, k, load(p));
        p += 16;
        n -= 16;
    }
    r = __crc32cd(0, vgetq_lane_u64(x, 0));
    r = __crc32cd((uint32_t)r, vgetq_lane_u64(x, 1));
    return zo__crc32c_armv8((uint32_t)r, p, n);
}

/* Data only: checksum.c picks it after checking the CPU. */
const zo__crc_dsp zo__crc_pmull = {
    .name = "pmull",
    .crc32c = pmull_crc32c,
};
