/* The head of the folding CRC32C kernels (crc32c_vpclmul*.c): crc32 byte
 * and quadword steps until p is `align`-byte aligned, so that no vector
 * load splits a cache line. For files built with SSE4.2 or more only. */
#ifndef ZO_NVME_X86_CRC32C_ALIGN_H
#define ZO_NVME_X86_CRC32C_ALIGN_H

#include <nmmintrin.h>
#include <stdint.h>
#include <string.h>

/* Returns the register; at most 7 crc32b and align/8 - 1 crc32q. The caller
 * has checked that n is at least ZO__CRC_VPCLMUL_MIN > align. */
static inline uint64_t zo__crc_align_head(uint32_t reg, const uint8_t **pp, size_t *np, uintptr_t align)
{
    const uint8_t *p = *pp;
    size_t n = *np;
    while ((uintptr_t)p & 7) {
        reg = _mm_crc32_u8(reg, *p++);
        n--;
    }
    uint64_t r = reg;
    while ((uintptr_t)p & (align - 1)) {
        uint64_t w;
        memcpy(&w, p, 8);
        r = _mm_crc32_u64(r, w);
        p += 8;
        n -= 8;
    }
    *pp = p;
    *np = n;
    return r;
}

#endif
