/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C with a CPU's CRC32C instructions, written once for every ISA that
 * has them (SSE4.2's crc32, ARMv8's CRC32C*). The includer, a file built
 * with that ISA's flags, defines
 *   ZO_CRC_U8(reg, byte)    one byte into the 32-bit register
 *   ZO_CRC_U64(reg, word)   eight bytes (a little-endian load) into it
 * and gets the three-lane kernel and the head of the folding kernels.
 *
 * Three lanes: one crc32 on 8 bytes has a latency of two (Arm) or three
 * (x86) cycles but a throughput of one per cycle, so a single dependency
 * chain runs well below the possible speed. The buffer is cut into blocks
 * of three lanes hashed as three independent chains; the lanes are then
 * joined with
 *     crc(A || B) = shift_|B|(crc(A)) ^ crc0(B)
 * where shift_n feeds n zero bytes to the register (a linear map, applied
 * with four table lookups, tables built in checksum.c). */
#ifndef ZO_NVME_CRC32C_HW_H
#define ZO_NVME_CRC32C_HW_H

#include <stdint.h>
#include <string.h>

#include "nvme/nvme_internal.h"

static inline uint64_t zo__crc_load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

#define ZO__CRC_LANES3(L, SHIFT)                                                   \
    while (n >= 3 * (size_t)(L)) {                                                 \
        uint64_t b = 0, c = 0;                                                     \
        const uint8_t *pb = p + (L), *pc = p + 2 * (L);                            \
        for (size_t i = 0; i < (L); i += 8) {                                      \
            a = ZO_CRC_U64(a, zo__crc_load64(p + i));                              \
            b = ZO_CRC_U64(b, zo__crc_load64(pb + i));                             \
            c = ZO_CRC_U64(c, zo__crc_load64(pc + i));                             \
        }                                                                          \
        a = zo__crc_shift_apply((SHIFT), (uint32_t)a) ^ (uint32_t)b;               \
        a = zo__crc_shift_apply((SHIFT), (uint32_t)a) ^ (uint32_t)c;               \
        p += 3 * (size_t)(L);                                                      \
        n -= 3 * (size_t)(L);                                                      \
    }

/* The raw register over p[0..n): byte steps to 8-byte alignment, three
 * lanes of 4096 then of 256 bytes, single 8-byte steps, bytes. */
static inline uint32_t zo__crc_lanes3(uint32_t reg, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        reg = ZO_CRC_U8(reg, *p++);
        n--;
    }
    uint64_t a = reg;
    ZO__CRC_LANES3(ZO__CRC_LONG, &zo__crc_shift_long)
    ZO__CRC_LANES3(ZO__CRC_SHORT, &zo__crc_shift_short)
    while (n >= 8) {
        a = ZO_CRC_U64(a, zo__crc_load64(p));
        p += 8;
        n -= 8;
    }
    reg = (uint32_t)a;
    while (n--)
        reg = ZO_CRC_U8(reg, *p++);
    return reg;
}

/* The head of the folding kernels: byte and 8-byte steps until p is
 * `align`-byte aligned, so that no vector load splits a cache line.
 * Returns the register; at most 7 byte and align/8 - 1 word steps. The
 * caller has checked that n is larger than align + 8. */
static inline uint64_t zo__crc_align_head(uint32_t reg, const uint8_t **pp, size_t *np, uintptr_t align)
{
    const uint8_t *p = *pp;
    size_t n = *np;
    while ((uintptr_t)p & 7) {
        reg = ZO_CRC_U8(reg, *p++);
        n--;
    }
    uint64_t r = reg;
    while ((uintptr_t)p & (align - 1)) {
        r = ZO_CRC_U64(r, zo__crc_load64(p));
        p += 8;
        n -= 8;
    }
    *pp = p;
    *np = n;
    return r;
}

#endif /* ZO_NVME_CRC32C_HW_H */
