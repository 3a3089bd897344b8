/* SPDX-License-Identifier: Apache-2.0 */
/* Checksums: CRC32C (C reference; SSE4.2 and VPCLMULQDQ kernels on x86-64,
 * CRC32C instruction and PMULL kernels on aarch64; picked at run time) and
 * XXH3 through libxxhash when the build has it. */
#define ZO_MODULE "nvme"
#include "core/internal.h"
#include "core/dispatch.h"
#include "nvme/nvme_internal.h"

#include <pthread.h>
#include <string.h>

#include <zoffload/cpu.h>

#if ZO_HAVE_XXHASH
#include <xxhash.h>
#endif

#define CRC32C_POLY 0x82f63b78u /* Castagnoli, reflected */

/* slicing-by-8 tables: crc_tab[0] is the byte-at-a-time table */
static uint32_t crc_tab[8][256];
zo__crc_shift zo__crc_shift_long, zo__crc_shift_short;
zo__crc_fold zo__crc_fold_k;

static uint32_t crc_zero_bytes(uint32_t reg, size_t n)
{
    while (n--)
        reg = (reg >> 8) ^ crc_tab[0][reg & 0xff];
    return reg;
}

/* The operator "feed n zero bytes" is linear over GF(2): find its image of
 * each of the 32 basis vectors, then tabulate it a byte of input at a time. */
static void build_shift(zo__crc_shift *s, size_t n)
{
    uint32_t basis[32];
    for (int b = 0; b < 32; b++)
        basis[b] = crc_zero_bytes(1u << b, n);
    for (int k = 0; k < 4; k++)
        for (unsigned v = 0; v < 256; v++) {
            uint32_t x = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1u << b))
                    x ^= basis[8 * k + b];
            s->t[k][v] = x;
        }
}

/* x^n mod P in the register's reflected form (bit i is the power 31 - i):
 * x^0 is the top bit, and multiplying by x is a right shift that reduces
 * x^32 to P's low terms, i.e. feeding zero bits. */
static uint32_t xpow_mod(unsigned n)
{
    uint32_t v = 0x80000000u;
    while (n--)
        v = (v >> 1) ^ (CRC32C_POLY & (0u - (v & 1)));
    return v;
}

uint64_t zo__crc_fold_const(unsigned e)
{
    return xpow_mod(e - 33);
}

static void fold_pair(uint64_t k[2], unsigned d)
{
    k[0] = zo__crc_fold_const(d + 64);
    k[1] = zo__crc_fold_const(d);
}

static void crc_fold_init(zo__crc_fold *f)
{
    fold_pair(f->d2048, 2048);
    fold_pair(f->d1536, 1536);
    fold_pair(f->d1024, 1024);
    fold_pair(f->d512, 512);
    fold_pair(f->d768, 768);
    fold_pair(f->lanes, 384);
    fold_pair(f->lanes + 2, 256);
    fold_pair(f->lanes + 4, 128);
    f->lanes[6] = f->lanes[7] = 0;
}

static void crc_tables_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
        crc_tab[0][i] = c;
    }
    for (unsigned i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
    build_shift(&zo__crc_shift_long, ZO__CRC_LONG);
    build_shift(&zo__crc_shift_short, ZO__CRC_SHORT);
    crc_fold_init(&zo__crc_fold_k);
}

uint32_t zo__crc32c_ref(uint32_t reg, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        reg = (reg >> 8) ^ crc_tab[0][(reg ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= reg; /* little-endian: the register meets the first four bytes */
        reg = crc_tab[7][w & 0xff] ^ crc_tab[6][(w >> 8) & 0xff] ^ crc_tab[5][(w >> 16) & 0xff] ^
              crc_tab[4][(w >> 24) & 0xff] ^ crc_tab[3][(w >> 32) & 0xff] ^ crc_tab[2][(w >> 40) & 0xff] ^
              crc_tab[1][(w >> 48) & 0xff] ^ crc_tab[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        reg = (reg >> 8) ^ crc_tab[0][(reg ^ *p++) & 0xff];
    return reg;
}

static const zo__crc_dsp crc_ref = {"scalar", zo__crc32c_ref};

/* The variants from slowest to fastest, each needing what its predecessors
 * need; a variant is a whole kernel, so there is nothing to lay over. */
ZO_DISPATCH_TABLE_CHECK(zo__crc_dsp);
static const zo__variant variants[] = {
    {0, &crc_ref},
#if defined(__x86_64__)
    {ZO_CPU_SSE42, &zo__crc_sse42},
    {ZO__CRC_VPCLMUL256_NEEDS, &zo__crc_vpclmul256},
    {ZO__CRC_VPCLMUL512_NEEDS, &zo__crc_vpclmul512},
#elif defined(__aarch64__)
    {ZO__CRC_ARMV8_NEEDS, &zo__crc_armv8},
    {ZO__CRC_PMULL_NEEDS, &zo__crc_pmull},
#endif
};
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* The kernels read the lookup and folding tables; they are built here, in
 * plain C, before any kernel can be handed out. */
const zo__crc_dsp *zo__crc_dsp_for(unsigned flags)
{
    pthread_once(&tables_once, crc_tables_init);
    return (const zo__crc_dsp *)variants[zo__variant_pick(variants, ZO_ARRAY_LEN(variants), flags)].table;
}

const zo__crc_dsp *zo__crc_dsp_cur(void)
{
    return zo__crc_dsp_for(zo_cpu_flags());
}

ZO_API uint32_t zo_crc32c(uint32_t crc, const void *buf, size_t n)
{
    if (n == 0)
        return crc;
    return ~zo__crc_dsp_cur()->crc32c(~crc, buf, n);
}

ZO_API const char *zo_crc32c_variant_at(unsigned i, unsigned *needs)
{
    if (i >= ZO_ARRAY_LEN(variants))
        return NULL;
    if (needs)
        *needs = variants[i].need;
    return zo__variant_name(&variants[i]);
}

ZO_API const char *zo_crc32c_variant(void)
{
    return zo__crc_dsp_cur()->name;
}

uint64_t zo__csum(zo_csum_kind kind, const void *p, size_t n)
{
    switch (kind) {
    case ZO_CSUM_CRC32C:
        return zo_crc32c(0, p, n);
#if ZO_HAVE_XXHASH
    case ZO_CSUM_XXH3:
        return (uint64_t)XXH3_64bits(p, n);
#endif
    default:
        return 0;
    }
}

ZO_API int zo_csum_available(zo_csum_kind kind)
{
    switch (kind) {
    case ZO_CSUM_NONE:
    case ZO_CSUM_CRC32C:
        return 1;
    case ZO_CSUM_XXH3:
        return ZO_HAVE_XXHASH;
    default:
        return 0;
    }
}

ZO_API int zo_checksum(zo_csum_kind kind, const void *buf, size_t n, uint64_t *out)
{
    if (!out || (!buf && n))
        return ZO_FAIL(NULL, -EINVAL, "zo_checksum: NULL %s", out ? "buffer" : "out");
    if (kind != ZO_CSUM_NONE && kind != ZO_CSUM_CRC32C && kind != ZO_CSUM_XXH3)
        return ZO_FAIL(NULL, -EINVAL, "zo_checksum: unknown kind %d", (int)kind);
    if (!zo_csum_available(kind))
        return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_checksum: %s not built in (libxxhash missing)", zo_csum_name(kind));
    *out = zo__csum(kind, n ? buf : "", n);
    return 0;
}

ZO_API const char *zo_csum_name(zo_csum_kind kind)
{
    switch (kind) {
    case ZO_CSUM_NONE:
        return "none";
    case ZO_CSUM_CRC32C:
        return "crc32c";
    case ZO_CSUM_XXH3:
        return "xxh3";
    default:
        return "?";
    }
}

ZO_API int zo_csum_parse(const char *s, zo_csum_kind *out)
{
    static const zo_csum_kind kinds[] = {ZO_CSUM_NONE, ZO_CSUM_CRC32C, ZO_CSUM_XXH3};
    if (!s || !out)
        return -EINVAL;
    for (size_t i = 0; i < ZO_ARRAY_LEN(kinds); i++)
        if (strcmp(s, zo_csum_name(kinds[i])) == 0) {
            *out = kinds[i];
            return 0;
        }
    return ZO_FAIL(NULL, -EINVAL, "unknown checksum '%s' (none, crc32c, xxh3)", s);
}
