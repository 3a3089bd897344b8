/* CRC32C with the SSE4.2 crc32 instruction. Compiled with -msse4.2 only.
 *
 * One crc32q has a latency of three cycles but a throughput of one per
 * cycle, so a single dependency chain runs at a third of the possible
 * speed. The buffer is cut into blocks of three lanes that are hashed as
 * three independent chains; the lanes are then joined with
 *     crc(A || B) = shift_|B|(crc(A)) ^ crc0(B)
 * where shift_n feeds n zero bytes to the register (a linear map, applied
 * with four table lookups, tables built in checksum.c). */
#include <nmmintrin.h>
#include <string.h>

#include "nvme/nvme_internal.h"

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

#define LANES3(L, SHIFT)                                                           \
    while (n >= 3 * (size_t)(L)) {                                                 \
        uint64_t b = 0, c = 0;                                                     \
        const uint8_t *pb = p + (L), *pc = p + 2 * (L);                            \
        for (size_t i = 0; i < (L); i += 8) {                                      \
            a = _mm_crc32_u64(a, load64(p + i));                                   \
            b = _mm_crc32_u64(b, load64(pb + i));                                  \
            c = _mm_crc32_u64(c, load64(pc + i));                                  \
        }                                                                          \
        a = zo__crc_shift_apply((SHIFT), (uint32_t)a) ^ (uint32_t)b;               \
        a = zo__crc_shift_apply((SHIFT), (uint32_t)a) ^ (uint32_t)c;               \
        p += 3 * (size_t)(L);                                                      \
        n -= 3 * (size_t)(L);                                                      \
    }

uint32_t zo__crc32c_sse42(uint32_t reg, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        reg = _mm_crc32_u8(reg, *p++);
        n--;
    }
    uint64_t a = reg;
    LANES3(ZO__CRC_LONG, &zo__crc_shift_long)
    LANES3(ZO__CRC_SHORT, &zo__crc_shift_short)
    while (n >= 8) {
        a = _mm_crc32_u64(a, load64(p));
        p += 8;
        n -= 8;
    }
    reg = (uint32_t)a;
    while (n--)
        reg = _mm_crc32_u8(reg, *p++);
    return reg;
}

/* Data only: checksum.c picks it after checking the CPU. */
const zo__crc_dsp zo__crc_sse42 = {
    .name = "sse42",
    .crc32c = zo__crc32c_sse42,
};
