/* SPDX-License-Identifier: Apache-2.0 */
/* nvme: CRC32C (every variant against a bitwise reference) and the swap
 * store on real files: exact bytes, striping, arena files (mode, removal), directory
 * checks, budgets and fragmentation, corruption detection, thousands of
 * random swaps checked byte for byte, and, with `diskfull` as argument, a
 * full disk on a size-limited tmpfs mounted in a private mount namespace. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "zo_test.h"

#include "core/internal.h"
#include "nvme/nvme_internal.h"

#include <zoffload/zoffload.h>

/* ---- CRC32C ---------------------------------------------------------------- */
static uint32_t crc_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
    }
    return ~crc;
}

START_TEST(test_crc_vectors)
{
    uint8_t b[48];
    ck_assert_uint_eq(zo_crc32c(0, "123456789", 9), 0xe3069283u);
    memset(b, 0, 32);
    ck_assert_uint_eq(zo_crc32c(0, b, 32), 0x8a9136aau); /* RFC 3720 B.4 */
    memset(b, 0xff, 32);
    ck_assert_uint_eq(zo_crc32c(0, b, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    ck_assert_uint_eq(zo_crc32c(0, b, 32), 0x46dd794eu);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    ck_assert_uint_eq(zo_crc32c(0, b, 32), 0x113fdb5cu);
    ck_assert_uint_eq(zo_crc32c(0x1234, NULL, 0), 0x1234);
    /* continuation */
    uint32_t whole = zo_crc32c(0, "hello, world", 12);
    ck_assert_uint_eq(zo_crc32c(zo_crc32c(0, "hello", 5), ", world", 7), whole);
    uint64_t v;
    ck_assert_int_eq(zo_checksum(ZO_CSUM_CRC32C, "123456789", 9, &v), 0);
    ck_assert_uint_eq(v, 0xe3069283u);
    ck_assert_int_eq(zo_checksum(ZO_CSUM_NONE, "x", 1, &v), 0);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(zo_checksum(ZO_CSUM_CRC32C, NULL, 1, &v), -EINVAL);
    ck_assert_int_eq(zo_checksum((zo_csum_kind)9, "x", 1, &v), -EINVAL);
    if (zo_csum_available(ZO_CSUM_XXH3)) {
        uint64_t a, c;
        ck_assert_int_eq(zo_checksum(ZO_CSUM_XXH3, "abc", 3, &a), 0);
        ck_assert_int_eq(zo_checksum(ZO_CSUM_XXH3, "abd", 3, &c), 0);
        ck_assert_uint_ne(a, c);
        ck_assert_uint_eq(a, 0x78af5f94892f3950ull); /* XXH3_64bits("abc"), seed 0 */
    } else {
        ck_assert_int_eq(zo_checksum(ZO_CSUM_XXH3, "abc", 3, &v), ZO_ENOTSUP);
    }
    zo_csum_kind k;
    ck_assert_int_eq(zo_csum_parse("crc32c", &k), 0);
    ck_assert_int_eq(k, ZO_CSUM_CRC32C);
    ck_assert_int_eq(zo_csum_parse("md5", &k), -EINVAL);
    ck_assert_str_eq(zo_csum_name(ZO_CSUM_XXH3), "xxh3");
}
END_TEST

/* The raw register form of crc_bitwise (no inversions), as kernels take it. */
static uint32_t crc_raw(uint32_t reg, const uint8_t *p, size_t n)
{
    return ~crc_bitwise(~reg, p, n);
}

static const struct {
    unsigned flags;
    const char *name;
} crc_variants[] = {
    {0, "scalar"},
#if defined(__x86_64__)
    {ZO_CPU_SSE42, "sse42"},
    {ZO__CRC_VPCLMUL256_NEEDS, "vpclmul256"},
    {ZO__CRC_VPCLMUL512_NEEDS, "vpclmul512"},
#elif defined(__aarch64__)
    {ZO__CRC_ARMV8_NEEDS, "armv8"},
    {ZO__CRC_PMULL_NEEDS, "pmull"},
#endif
};

static const char *crc_variant_for(unsigned flags)
{
    const char *name = "scalar";
    for (size_t v = 0; v < ZO_ARRAY_LEN(crc_variants); v++)
        if ((flags & crc_variants[v].flags) == crc_variants[v].flags)
            name = crc_variants[v].name;
    return name;
}

START_TEST(test_crc_variants)
{
    size_t big = 3 * ZO__CRC_LONG * 3 + 3 * ZO__CRC_SHORT * 2 + 77;
    uint8_t *buf = aligned_alloc(64, (big + 128 + 63) & ~(size_t)63); /* a multiple of the alignment */
    ck_assert_ptr_nonnull(buf);
    zo_test_rng rng = {zo_test_seed()};
    zo_test_fill_bytes(&rng, buf, big + 128);
    /* Every length 0..4096 at every start alignment 0..63 against the
     * bitwise reference, advanced a byte at a time (its own code, no
     * tables); from a nonzero register so the register's entry is checked. */
    enum { MAXN = 4096, MIS = 64 };
    uint32_t *want = malloc((MAXN + 1) * MIS * sizeof(*want));
    for (size_t mis = 0; mis < MIS; mis++) {
        uint32_t r = 0xa5c3e1f7u;
        want[mis * (MAXN + 1)] = r;
        for (size_t n = 1; n <= MAXN; n++)
            want[mis * (MAXN + 1) + n] = r = crc_raw(r, buf + mis + n - 1, 1);
    }
    size_t ran = 0;
    for (size_t f = 0; f < ZO_ARRAY_LEN(crc_variants); f++) {
        if ((zo_cpu_detected() & crc_variants[f].flags) != crc_variants[f].flags)
            continue;
        ran++;
        const zo__crc_dsp *d = zo__crc_dsp_for(crc_variants[f].flags);
        ck_assert_str_eq(d->name, crc_variants[f].name);
        for (size_t mis = 0; mis < MIS; mis++)
            for (size_t n = 0; n <= MAXN; n++) {
                uint32_t got = d->crc32c(0xa5c3e1f7u, buf + mis, n);
                if (got != want[mis * (MAXN + 1) + n])
                    ck_abort_msg("%s: n=%zu mis=%zu: 0x%08x != 0x%08x", d->name, n, mis, got,
                                 want[mis * (MAXN + 1) + n]);
            }
        /* lengths around the lane blocks, and random ones */
        size_t lens[] = {3 * ZO__CRC_SHORT - 1, 3 * ZO__CRC_SHORT, 3 * ZO__CRC_SHORT + 1, 3 * ZO__CRC_LONG - 1,
                         3 * ZO__CRC_LONG,      3 * ZO__CRC_LONG + 8, 3 * ZO__CRC_LONG + 3 * ZO__CRC_SHORT + 5, big};
        for (size_t i = 0; i < ZO_ARRAY_LEN(lens); i++)
            for (size_t mis = 0; mis < 3; mis++) {
                uint32_t w = crc_bitwise(0, buf + mis, lens[i]);
                ZO_EXPECT(~d->crc32c(~0u, buf + mis, lens[i]) == w, "%s: n=%zu", d->name, lens[i]);
            }
        for (int i = 0; i < 200; i++) {
            size_t n = zo_test_next(&rng) % big, mis = zo_test_next(&rng) % 64;
            if (n + mis > big + 64)
                n = big + 64 - mis;
            uint32_t w = zo__crc32c_ref(0xffffffffu, buf + mis, n);
            ZO_EXPECT(d->crc32c(0xffffffffu, buf + mis, n) == w, "%s: random n=%zu mis=%zu", d->name, n, mis);
        }
        /* chained: the register after A continues over B as over A || B,
         * split anywhere (unaligned ends on both sides, short and long parts) */
        for (int i = 0; i < 300; i++) {
            size_t n = zo_test_next(&rng) % big, a = n ? zo_test_next(&rng) % (n + 1) : 0;
            size_t mis = zo_test_next(&rng) % 64;
            if (n + mis > big + 64)
                n = a = 0;
            uint32_t whole = d->crc32c(0x12345678u, buf + mis, n);
            uint32_t part = d->crc32c(d->crc32c(0x12345678u, buf + mis, a), buf + mis + a, n - a);
            ZO_EXPECT(part == whole && whole == zo__crc32c_ref(0x12345678u, buf + mis, n),
                      "%s: chained n=%zu split %zu mis=%zu", d->name, n, a, mis);
        }
        ck_assert_uint_eq(crc_bitwise(0, buf, big), ~zo__crc32c_ref(~0u, buf, big));
    }
    ck_assert_uint_gt(ran, 0);
    free(want);
    free(buf);
    ck_assert_str_eq(zo_crc32c_variant(), crc_variant_for(zo_cpu_flags()));
}
END_TEST

/* Several MiB at odd lengths and offsets, every variant against the
 * reference, and through the public call as the store makes it. */
START_TEST(test_crc_long_buffers)
{
    size_t cap = (7u << 20) + 4096 + 64; /* the longest length at the largest offset (35) */
    uint8_t *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    zo_test_rng rng = {zo_test_seed()};
    zo_test_fill_bytes(&rng, buf, cap);
    (void)zo__crc_dsp_for(0); /* builds the reference's tables */
    const size_t lens[] = {(5u << 20) + 13, (3u << 20) - 1, (7u << 20) + 4093, (1u << 20) + 255};
    for (size_t i = 0; i < ZO_ARRAY_LEN(lens); i++) {
        size_t mis = (size_t)(zo_test_next(&rng) % 3) * 17 + (i & 1);
        uint32_t want = zo__crc32c_ref(0xffffffffu, buf + mis, lens[i]);
        for (size_t f = 0; f < ZO_ARRAY_LEN(crc_variants); f++) {
            if ((zo_cpu_detected() & crc_variants[f].flags) != crc_variants[f].flags)
                continue;
            const zo__crc_dsp *d = zo__crc_dsp_for(crc_variants[f].flags);
            ZO_EXPECT(d->crc32c(0xffffffffu, buf + mis, lens[i]) == want, "%s: n=%zu mis=%zu", d->name, lens[i],
                      mis);
        }
        ck_assert_uint_eq(zo_crc32c(0, buf + mis, lens[i]), ~want);
    }
    free(buf);
}
END_TEST

/* The folding constants, checked apart from the kernel with a software
 * carry-less multiply: for a 16-byte block T and a distance D, the folded
 * 16 bytes R = clmul(T_hi, k.lo) ^ clmul(T_lo, k.hi) must leave the same
 * CRC as T followed by D/8 zero bytes. */
static void clmul64(uint64_t a, uint64_t b, uint64_t out[2])
{
    out[0] = out[1] = 0;
    for (int i = 0; i < 64; i++)
        if (b >> i & 1) {
            out[0] ^= a << i;
            out[1] ^= i ? a >> (64 - i) : 0;
        }
}

START_TEST(test_crc_fold_constants)
{
    (void)zo__crc_dsp_for(0); /* builds the tables */
    const zo__crc_fold *K = &zo__crc_fold_k;
    const struct {
        const uint64_t *k;
        unsigned d;
    } pairs[] = {{K->d2048, 2048}, {K->d1536, 1536}, {K->d1024, 1024}, {K->d768, 768}, {K->d512, 512},
                 {K->lanes, 384},  {K->lanes + 2, 256}, {K->lanes + 4, 128}};
    ck_assert(K->lanes[6] == 0 && K->lanes[7] == 0);
    zo_test_rng rng = {zo_test_seed()};
    uint8_t msg[16 + 256];
    for (size_t i = 0; i < ZO_ARRAY_LEN(pairs); i++) {
        ck_assert(pairs[i].k[0] == zo__crc_fold_const(pairs[i].d + 64) && pairs[i].k[1] == zo__crc_fold_const(pairs[i].d));
        ck_assert_uint_eq(pairs[i].k[0] >> 32, 0);
        for (int t = 0; t < 50; t++) {
            uint64_t th = zo_test_next(&rng), tl = zo_test_next(&rng), p0[2], p1[2];
            memset(msg, 0, sizeof(msg));
            memcpy(msg, &th, 8);
            memcpy(msg + 8, &tl, 8);
            uint32_t want = crc_raw(0, msg, 16 + pairs[i].d / 8);
            clmul64(th, pairs[i].k[0], p0);
            clmul64(tl, pairs[i].k[1], p1);
            uint64_t r[2] = {p0[0] ^ p1[0], p0[1] ^ p1[1]};
            ZO_EXPECT(crc_raw(0, (const uint8_t *)r, 16) == want, "fold by %u bits", pairs[i].d);
        }
    }
}
END_TEST

/* ---- swap store helpers -------------------------------------------------------- */
/* ZO_TEST_AIO_BACKEND=threads runs the swap store on the thread-pool
 * engine (the io_uring one is the default). */
static zo_aio_config test_aio_cfg;

static void set_backend(zo_swap_config *c)
{
    zo_aio_config_default(&test_aio_cfg);
    const char *b = getenv("ZO_TEST_AIO_BACKEND");
    if (b && !strcmp(b, "threads"))
        test_aio_cfg.backend = ZO_AIO_THREADS;
    c->aio_cfg = &test_aio_cfg;
}

static zo_swap *make_swap(const char *const *dirs, unsigned n, size_t chunk, uint64_t arena, zo_csum_kind ck)
{
    zo_swap_config c;
    zo_swap_config_default(&c);
    set_backend(&c);
    c.dirs = dirs;
    c.ndirs = n;
    c.chunk_size = chunk;
    c.arena_size = arena;
    c.checksum = ck;
    const char *ct = getenv("ZO_TEST_CSUM_THREADS"); /* 0: checksums inline */
    if (ct)
        c.csum_threads = (unsigned)atoi(ct);
    zo_swap *s = NULL;
    int r = zo_swap_create(&s, &c);
    ck_assert_msg(r == 0, "zo_swap_create: %s (%s)", zo_strerror(r), zo_last_error_detail());
    if (c.aio_cfg->backend == ZO_AIO_THREADS)
        ck_assert_int_eq(zo_aio_get_backend(zo_swap_get_aio(s)), ZO_AIO_THREADS);
    return s;
}

/* A store on one fresh directory (its path in dir). */
static zo_swap *make_swap_tmp(char *dir, size_t dlen, size_t chunk, uint64_t arena, zo_csum_kind ck)
{
    zo_test_mkdtemp(dir, dlen);
    const char *dirs[] = {dir};
    return make_swap(dirs, 1, chunk, arena, ck);
}

static int count_arenas(const char *dir, uint64_t *bytes, int check_mode)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "zo-swap.", 8) != 0)
            continue;
        char p[4400];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        struct stat st;
        ck_assert_int_eq(lstat(p, &st), 0);
        ck_assert(S_ISREG(st.st_mode));
        if (check_mode)
            ck_assert_msg((st.st_mode & 0777) == 0600, "%s has mode %o", p, st.st_mode & 0777);
        if (bytes)
            *bytes += (uint64_t)st.st_size;
        n++;
    }
    closedir(d);
    return n;
}

static void swap_io(zo_swap *s, int write, zo_swap_id id, uint64_t off, void *buf, size_t len)
{
    zo_swap_io *io;
    int r = write ? zo_swap_write(s, id, off, buf, len, NULL, NULL, &io) : zo_swap_read(s, id, off, buf, len, NULL,
                                                                                        NULL, &io);
    ck_assert_msg(r == 0, "queue: %s (%s)", zo_strerror(r), zo_last_error_detail());
    r = zo_swap_wait(s, io);
    ck_assert_msg(r == 0, "%s: %s (%s)", write ? "write" : "read", zo_strerror(r), zo_last_error_detail());
}

START_TEST(test_swap_basic)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    const size_t chunk = 64 * 1024;
    zo_swap *s = make_swap(dirs, 1, chunk, 1 << 20, ZO_CSUM_CRC32C);
    zo_swap_info info;
    ck_assert_int_eq(zo_swap_get_info(s, &info), 0);
    ck_assert_uint_eq(info.chunk_size, chunk);
    ck_assert_uint_ge(info.io_align, 4096);
    uint64_t sizes[] = {1, 4095, 4096, chunk, chunk + 1, 3 * chunk + chunk / 2, 2 << 20};
    zo_swap_id ids[7];
    uint8_t *src[7], *dst;
    zo_test_rng rng = {zo_test_seed() ^ 2};
    ck_assert_int_eq(zo_aligned_alloc((void **)&dst, 3 << 20, 4096), 0);
    for (int i = 0; i < 7; i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "t%d", i);
        ck_assert_int_eq(zo_swap_alloc(s, sizes[i], nm, &ids[i]), 0);
        ck_assert_uint_ne(ids[i], 0);
        ck_assert_uint_eq(zo_swap_size(s, ids[i]), sizes[i]);
        src[i] = malloc(sizes[i]);
        zo_test_fill_bytes(&rng, src[i], sizes[i]);
        /* never written: zeros, without I/O */
        memset(dst, 0xee, sizes[i]);
        swap_io(s, 0, ids[i], 0, dst, sizes[i]);
        for (uint64_t k = 0; k < sizes[i]; k++)
            ZO_EXPECT(dst[k] == 0, "unwritten byte %llu of t%d is %u", (unsigned long long)k, i, dst[k]);
    }
    for (int i = 0; i < 7; i++)
        swap_io(s, 1, ids[i], 0, src[i], sizes[i]);
    for (int i = 6; i >= 0; i--) {
        memset(dst, 0, sizes[i]);
        swap_io(s, 0, ids[i], 0, dst, sizes[i]);
        ck_assert_msg(memcmp(dst, src[i], sizes[i]) == 0, "t%d differs", i);
    }
    /* ranges: chunk-aligned pieces, unaligned buffers */
    uint8_t *odd = malloc(2 * chunk + 1);
    swap_io(s, 0, ids[5], chunk, odd + 1, 2 * chunk);
    ck_assert(memcmp(odd + 1, src[5] + chunk, 2 * chunk) == 0);
    swap_io(s, 0, ids[5], 3 * chunk, odd + 1, chunk / 2); /* the tail */
    ck_assert(memcmp(odd + 1, src[5] + 3 * chunk, chunk / 2) == 0);
    zo_test_fill_bytes(&rng, src[5] + chunk, chunk);
    swap_io(s, 1, ids[5], chunk, src[5] + chunk, chunk);
    swap_io(s, 0, ids[5], 0, dst, sizes[5]);
    ck_assert(memcmp(dst, src[5], sizes[5]) == 0);
    free(odd);
    /* range rules */
    zo_swap_io *io;
    ck_assert_int_eq(zo_swap_read(s, ids[5], 1, dst, chunk, NULL, NULL, &io), -EINVAL);
    ck_assert_ptr_null(io);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "'t5'"));
    ck_assert_int_eq(zo_swap_read(s, ids[5], 0, dst, chunk + 1, NULL, NULL, &io), -EINVAL);
    ck_assert_int_eq(zo_swap_read(s, ids[5], 0, dst, sizes[5] + 1, NULL, NULL, &io), -EINVAL);
    ck_assert_int_eq(zo_swap_read(s, ids[5], 0, dst, 0, NULL, NULL, &io), -EINVAL);
    ck_assert_int_eq(zo_swap_read(s, ids[5], 0, NULL, 10, NULL, NULL, &io), -EINVAL);
    ck_assert_int_eq(zo_swap_read(s, 0, 0, dst, 10, NULL, NULL, &io), -ENOENT);
    ck_assert_int_eq(zo_swap_alloc(s, 0, "x", &ids[0]) , -EINVAL);
    /* stats */
    zo_swap_stats st;
    zo_swap_get_stats(s, &st);
    ck_assert_uint_eq(st.allocations, 7);
    ck_assert_uint_eq(st.corrupt, 0);
    ck_assert_uint_gt(st.chunks_verified, 0);
    ck_assert_uint_gt(st.chunks_zero, 0);
    ck_assert_uint_ge(st.arena_bytes, st.allocated_bytes);
    /* free, stale handle, reuse of the space */
    uint64_t arena_before = st.arena_bytes;
    zo_swap_id old = ids[6];
    ck_assert_int_eq(zo_swap_free(s, ids[6]), 0);
    ck_assert_int_eq(zo_swap_free(s, old), -ENOENT);
    ck_assert_int_eq(zo_swap_read(s, old, 0, dst, 10, NULL, NULL, &io), -ENOENT);
    ck_assert_int_eq(zo_swap_alloc(s, 2 << 20, "again", &ids[6]), 0);
    ck_assert_uint_ne(ids[6], old);
    zo_swap_get_stats(s, &st);
    ck_assert_uint_eq(st.arena_bytes, arena_before); /* reused, not grown */
    /* freshly allocated over old data: reads zeros, not the old bytes */
    swap_io(s, 0, ids[6], 0, dst, 2 << 20);
    for (uint64_t k = 0; k < (2 << 20); k += 4093)
        ZO_EXPECT(dst[k] == 0, "reused space leaked old byte at %llu", (unsigned long long)k);
    uint64_t fb = 0;
    int nfiles = count_arenas(dir, &fb, 1);
    ck_assert_int_ge(nfiles, 1);
    ck_assert_uint_eq(fb, st.arena_bytes);
    zo_swap_destroy(&s);
    ck_assert_ptr_null(s);
    zo_swap_destroy(&s);
    ck_assert_int_eq(count_arenas(dir, NULL, 0), 0);
    for (int i = 0; i < 7; i++)
        free(src[i]);
    zo_aligned_free(dst);
    zo_test_rmtree(dir);
}
END_TEST

START_TEST(test_swap_keep_files)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    zo_swap_config c;
    zo_swap_config_default(&c);
    c.dirs = dirs;
    c.ndirs = 1;
    c.arena_size = 1 << 20;
    c.reserve = 3 << 20;
    c.keep_files = 1;
    zo_swap *s = NULL;
    ck_assert_int_eq(zo_swap_create(&s, &c), 0);
    uint64_t b = 0;
    ck_assert_int_eq(count_arenas(dir, &b, 1), 1);
    ck_assert_uint_eq(b, 3 << 20); /* reserved up front */
    zo_swap_destroy(&s);
    ck_assert_int_eq(count_arenas(dir, NULL, 0), 1);
    zo_test_rmtree(dir);
}
END_TEST

START_TEST(test_swap_stripe)
{
    char d[3][256];
    const char *dirs[3];
    for (int i = 0; i < 3; i++) {
        zo_test_mkdtemp(d[i], sizeof(d[i]));
        dirs[i] = d[i];
    }
    const size_t chunk = 16384;
    zo_swap *s = make_swap(dirs, 3, chunk, 256 * 1024, ZO_CSUM_CRC32C);
    zo_test_rng rng = {zo_test_seed() ^ 3};
    size_t n = 10 * chunk + 100;
    uint8_t *a = malloc(n), *b = malloc(n);
    zo_test_fill_bytes(&rng, a, n);
    zo_swap_id id, id2;
    ck_assert_int_eq(zo_swap_alloc(s, n, "striped", &id), 0);
    ck_assert_int_eq(zo_swap_alloc(s, chunk, "single", &id2), 0);
    swap_io(s, 1, id, 0, a, n);
    swap_io(s, 1, id2, 0, a, chunk);
    swap_io(s, 0, id, 0, b, n);
    ck_assert(memcmp(a, b, n) == 0);
    swap_io(s, 0, id2, 0, b, chunk);
    ck_assert(memcmp(a, b, chunk) == 0);
    /* 11 chunks over 3 directories: every directory got arena space and
     * holds some of the tensor's chunks (find chunk k's bytes in a file) */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_ge(count_arenas(d[i], NULL, 1), 1);
        int found = 0;
        DIR *dd = opendir(d[i]);
        struct dirent *de;
        uint8_t *fb = malloc(256 * 1024);
        while ((de = readdir(dd))) {
            if (strncmp(de->d_name, "zo-swap.", 8) != 0)
                continue;
            char p[4400];
            snprintf(p, sizeof(p), "%s/%s", d[i], de->d_name);
            int fd = open(p, O_RDONLY);
            ssize_t got = pread(fd, fb, 256 * 1024, 0);
            close(fd);
            for (int k = 0; k < 11 && got > 0; k++)
                for (ssize_t o = 0; o + 64 <= got; o += 4096)
                    if (memcmp(fb + o, a + (size_t)k * chunk, 64) == 0)
                        found |= 1 << k;
        }
        closedir(dd);
        free(fb);
        ck_assert_msg(found != 0, "directory %d holds no chunk of the tensor", i);
        ck_assert_msg(__builtin_popcount(found) >= 3, "directory %d holds only chunks 0x%x", i, found);
    }
    zo_swap_destroy(&s);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(count_arenas(d[i], NULL, 0), 0);
        zo_test_rmtree(d[i]);
    }
    free(a);
    free(b);
}
END_TEST

START_TEST(test_swap_dirs)
{
    char dir[256], p[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    zo_swap_config c;
    zo_swap_config_default(&c);
    zo_swap *s = (zo_swap *)1;
    const char *dirs[2];
    c.dirs = dirs;
    c.ndirs = 1;
    snprintf(p, sizeof(p), "%s/missing", dir);
    dirs[0] = p;
    ck_assert_int_eq(zo_swap_create(&s, &c), -ENOENT);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "missing"));
    snprintf(p, sizeof(p), "%s/file", dir);
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    close(fd);
    ck_assert_int_eq(zo_swap_create(&s, &c), -ENOTDIR);
    char real[400];
    snprintf(real, sizeof(real), "%s/real", dir);
    ck_assert_int_eq(mkdir(real, 0700), 0);
    snprintf(p, sizeof(p), "%s/link", dir);
    ck_assert_int_eq(symlink(real, p), 0);
    ck_assert_int_eq(zo_swap_create(&s, &c), -ELOOP);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "symbolic link"));
    snprintf(p, sizeof(p), "%s/open", dir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    ck_assert_int_eq(chmod(p, 0777), 0);
    ck_assert_int_eq(zo_swap_create(&s, &c), -EPERM);
    ck_assert_int_eq(chmod(p, 01777), 0); /* like /tmp: fine */
    ck_assert_int_eq(zo_swap_create(&s, &c), 0);
    zo_swap_destroy(&s);
    dirs[0] = real;
    dirs[1] = real;
    c.ndirs = 2;
    ck_assert_int_eq(zo_swap_create(&s, &c), ZO_ECONFIG);
    c.ndirs = 1;
    c.chunk_size = 3000;
    ck_assert_int_eq(zo_swap_create(&s, &c), ZO_ECONFIG);
    c.chunk_size = 1 << 20;
    c.checksum = (zo_csum_kind)7;
    ck_assert_int_eq(zo_swap_create(&s, &c), ZO_ECONFIG);
    c.checksum = ZO_CSUM_CRC32C;
    c.csum_threads = 65;
    ck_assert_int_eq(zo_swap_create(&s, &c), ZO_ECONFIG);
    c.csum_threads = 1;
    c.ndirs = 0;
    ck_assert_int_eq(zo_swap_create(&s, &c), -EINVAL);
    ck_assert_int_eq(zo_swap_create(&s, NULL), -EINVAL);
    c.ndirs = 1;
    c.struct_size = 3;
    ck_assert_int_eq(zo_swap_create(&s, &c), -EINVAL);
    zo_test_rmtree(dir);
}
END_TEST

START_TEST(test_swap_budget_fragmented)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    const size_t chunk = 65536;
    zo_swap_config c;
    zo_swap_config_default(&c);
    c.dirs = dirs;
    c.ndirs = 1;
    c.chunk_size = chunk;
    c.arena_size = 4 * chunk;
    c.max_bytes = 4 * chunk;
    zo_swap *s = NULL;
    ck_assert_int_eq(zo_swap_create(&s, &c), 0);
    zo_swap_id a, b, cc, d, e;
    ck_assert_int_eq(zo_swap_alloc(s, chunk, "a", &a), 0);
    ck_assert_int_eq(zo_swap_alloc(s, chunk, "b", &b), 0);
    ck_assert_int_eq(zo_swap_alloc(s, chunk, "c", &cc), 0);
    ck_assert_int_eq(zo_swap_alloc(s, 2 * chunk, "too-big", &e), ZO_EBUDGET);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "too-big"));
    ck_assert_int_eq(zo_swap_free(s, a), 0);
    ck_assert_int_eq(zo_swap_free(s, cc), 0);
    /* free: chunks 0 and 2 (+3): no contiguous 3 chunks, but 3 in pieces */
    ck_assert_int_eq(zo_swap_alloc(s, 3 * chunk, "pieces", &d), 0);
    zo_test_rng rng = {zo_test_seed() ^ 4};
    uint8_t *x = malloc(3 * chunk), *y = malloc(3 * chunk), *bb = malloc(chunk), *by = malloc(chunk);
    zo_test_fill_bytes(&rng, x, 3 * chunk);
    zo_test_fill_bytes(&rng, bb, chunk);
    swap_io(s, 1, b, 0, bb, chunk);
    swap_io(s, 1, d, 0, x, 3 * chunk);
    swap_io(s, 0, d, 0, y, 3 * chunk);
    ck_assert(memcmp(x, y, 3 * chunk) == 0);
    swap_io(s, 0, b, 0, by, chunk);
    ck_assert(memcmp(bb, by, chunk) == 0);
    ck_assert_int_eq(zo_swap_alloc(s, 1, "full", &e), ZO_EBUDGET);
    zo_swap_stats st;
    zo_swap_get_stats(s, &st);
    ck_assert_uint_eq(st.arena_bytes, 4 * chunk);
    zo_swap_destroy(&s);
    free(x);
    free(y);
    free(bb);
    free(by);
    zo_test_rmtree(dir);
}
END_TEST

/* Past max_bytes, pieces are carved from free space that does not start on
 * a chunk boundary: holes of 68 KiB at 4 KiB and 76 KiB hold a 132 KiB
 * allocation (a chunk in each, the 4 KiB tail after one of them) although
 * neither holds a chunk-aligned chunk. Then a single hole that holds all of
 * an allocation but starts off a chunk boundary. */
START_TEST(test_swap_budget_unaligned_holes)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    const size_t chunk = 65536, K = 1024;
    zo_swap_config c;
    zo_swap_config_default(&c);
    set_backend(&c);
    c.dirs = dirs;
    c.ndirs = 1;
    c.chunk_size = chunk;
    c.arena_size = 4 * chunk;
    c.max_bytes = 4 * chunk;
    zo_swap *s = NULL;
    ck_assert_int_eq(zo_swap_create(&s, &c), 0);
    /* sub-chunk allocations are packed at the granule: [0,4K) [4K,64K)
     * [64K,72K) [72K,76K) [76K,136K) [136K,144K) [144K,204K) [204K,256K) */
    static const size_t sizes[] = {4 * K, 60 * K, 8 * K, 4 * K, 60 * K, 8 * K, 60 * K, 52 * K};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    zo_swap_id ids[N];
    uint8_t *keep[N] = {0};
    zo_test_rng rng = {zo_test_seed() ^ 5};
    for (unsigned i = 0; i < N; i++) {
        ck_assert_msg(zo_swap_alloc(s, sizes[i], "small", &ids[i]) == 0, "alloc %u: %s", i, zo_last_error_detail());
        keep[i] = malloc(sizes[i]);
        zo_test_fill_bytes(&rng, keep[i], sizes[i]);
        swap_io(s, 1, ids[i], 0, keep[i], sizes[i]);
    }
    /* holes [4K,72K) and [76K,144K): 68 KiB each, none chunk-aligned */
    static const unsigned holes[] = {1, 2, 4, 5};
    for (unsigned h = 0; h < 4; h++) {
        ck_assert_int_eq(zo_swap_free(s, ids[holes[h]]), 0);
        free(keep[holes[h]]);
        keep[holes[h]] = NULL;
    }
    const size_t big = 2 * chunk + 4 * K;
    zo_swap_id d;
    int r = zo_swap_alloc(s, big, "pieces", &d);
    ck_assert_msg(r == 0, "alloc in unaligned holes: %s (%s)", zo_strerror(r), zo_last_error_detail());
    uint8_t *x = malloc(big), *y = malloc(big);
    zo_test_fill_bytes(&rng, x, big);
    swap_io(s, 1, d, 0, x, big);
    swap_io(s, 0, d, 0, y, big);
    ck_assert(memcmp(x, y, big) == 0);
    for (unsigned i = 0; i < N; i++) {
        if (!keep[i])
            continue;
        uint8_t *z = malloc(sizes[i]);
        swap_io(s, 0, ids[i], 0, z, sizes[i]);
        ck_assert_msg(memcmp(z, keep[i], sizes[i]) == 0, "allocation %u overwritten", i);
        free(z);
    }
    zo_swap_stats st;
    zo_swap_get_stats(s, &st);
    ck_assert_uint_eq(st.arena_bytes, 4 * chunk);
    ck_assert_int_eq(zo_swap_free(s, d), 0);
    /* one hole [4K,256K): 252 KiB, all of a 3-chunk + 60 KiB allocation,
     * starting off a chunk boundary */
    for (unsigned i = 1; i < N; i++)
        if (keep[i]) {
            ck_assert_int_eq(zo_swap_free(s, ids[i]), 0);
            free(keep[i]);
            keep[i] = NULL;
        }
    const size_t whole = 3 * chunk + 60 * K;
    r = zo_swap_alloc(s, whole, "one-piece", &d);
    ck_assert_msg(r == 0, "alloc in one unaligned hole: %s (%s)", zo_strerror(r), zo_last_error_detail());
    uint8_t *w = malloc(whole), *v = malloc(whole);
    zo_test_fill_bytes(&rng, w, whole);
    swap_io(s, 1, d, 0, w, whole);
    swap_io(s, 0, d, 0, v, whole);
    ck_assert(memcmp(w, v, whole) == 0);
    uint8_t *z = malloc(sizes[0]);
    swap_io(s, 0, ids[0], 0, z, sizes[0]);
    ck_assert(memcmp(z, keep[0], sizes[0]) == 0);
    ck_assert_int_eq(zo_swap_alloc(s, 1, "full", &d), ZO_EBUDGET);
    zo_swap_destroy(&s);
    free(z);
    free(keep[0]);
    free(x);
    free(y);
    free(w);
    free(v);
    zo_test_rmtree(dir);
}
END_TEST

static _Atomic int64_t qfault_chunk = -1;

static int qfault_write(void *user, int write, uint64_t idx)
{
    (void)user;
    return write && (int64_t)idx == atomic_load(&qfault_chunk) ? -EAGAIN : 0;
}

/* Wait for a swap I/O, expecting err; returns the detail. */
static int swap_io_rc(zo_swap *s, int write, zo_swap_id id, uint64_t off, void *buf, size_t len)
{
    zo_swap_io *io;
    int r = write ? zo_swap_write(s, id, off, buf, len, NULL, NULL, &io) : zo_swap_read(s, id, off, buf, len, NULL,
                                                                                        NULL, &io);
    ck_assert_msg(r == 0, "queue: %s (%s)", zo_strerror(r), zo_last_error_detail());
    return zo_swap_wait(s, io);
}

static void on_err(void *user, int err)
{
    atomic_store((_Atomic int *)user, err == 0 ? 1 : err);
}

/* A chunk write the engine refuses to queue wrote nothing. The caller gets
 * the error; if it was the write's first chunk, the range is unchanged and
 * reads back its old contents; if earlier chunks were queued, every chunk
 * not queued reads as ZO_ESTATE, never as the old version next to new. */
START_TEST(test_swap_queue_failure)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    const size_t chunk = 16384, n = 4 * chunk;
    zo_swap *s = make_swap(dirs, 1, chunk, 64 * chunk, ZO_CSUM_CRC32C);
    zo_swap_id id;
    ck_assert_int_eq(zo_swap_alloc(s, n, "t", &id), 0);
    zo_test_rng rng = {zo_test_seed() ^ 6};
    uint8_t *a = malloc(n), *b = malloc(n), *y = malloc(n);
    zo_test_fill_bytes(&rng, a, n);
    zo_test_fill_bytes(&rng, b, n);
    swap_io(s, 1, id, 0, a, n);
    zo__swap_set_queue_fault(s, qfault_write, NULL);

    /* the first chunk refused: nothing changed */
    atomic_store(&qfault_chunk, 0);
    ck_assert_int_eq(swap_io_rc(s, 1, id, 0, b, n), -EAGAIN);
    ck_assert_ptr_nonnull(strstr(zo_swap_errmsg(s), "could not queue"));
    int r = swap_io_rc(s, 0, id, 0, y, n);
    ck_assert_msg(r == 0, "read after a write that queued nothing: %s (%s)", zo_strerror(r), zo_swap_errmsg(s));
    ck_assert(memcmp(a, y, n) == 0);
    /* same through a callback */
    _Atomic int got = 0;
    ck_assert_int_eq(zo_swap_write(s, id, 0, b, n, on_err, (void *)&got, NULL), 0);
    ck_assert_int_eq(zo_swap_wait_all(s), 0);
    ck_assert_int_eq(atomic_load(&got), -EAGAIN);
    ck_assert_int_eq(swap_io_rc(s, 0, id, 0, y, n), 0);
    ck_assert(memcmp(a, y, n) == 0);

    /* the third chunk refused after two were queued: the new chunks read
     * back, the refused one and the one after it do not */
    atomic_store(&qfault_chunk, 2);
    ck_assert_int_eq(swap_io_rc(s, 1, id, 0, b, n), -EAGAIN);
    ck_assert_int_eq(swap_io_rc(s, 0, id, 0, y, 2 * chunk), 0);
    ck_assert(memcmp(b, y, 2 * chunk) == 0);
    ck_assert_int_eq(swap_io_rc(s, 0, id, 2 * chunk, y, chunk), ZO_ESTATE);
    ck_assert_int_eq(swap_io_rc(s, 0, id, 3 * chunk, y, chunk), ZO_ESTATE);
    ck_assert_int_eq(swap_io_rc(s, 0, id, 0, y, n), ZO_ESTATE);

    /* a full rewrite makes it readable again */
    atomic_store(&qfault_chunk, -1);
    swap_io(s, 1, id, 0, b, n);
    swap_io(s, 0, id, 0, y, n);
    ck_assert(memcmp(b, y, n) == 0);
    zo__swap_set_queue_fault(s, NULL, NULL);
    zo_swap_destroy(&s);
    free(a);
    free(b);
    free(y);
    zo_test_rmtree(dir);
}
END_TEST

/* Find `pat` (64 bytes) in the arena files of dir; returns path and offset. */
static int find_in_arenas(const char *dir, const uint8_t *pat, char *path, size_t plen, off_t *where)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int found = 0;
    uint8_t *b = malloc(1 << 20);
    while (!found && (de = readdir(d))) {
        if (strncmp(de->d_name, "zo-swap.", 8) != 0)
            continue;
        snprintf(path, plen, "%s/%s", dir, de->d_name);
        int fd = open(path, O_RDONLY);
        off_t base = 0;
        ssize_t got;
        while (!found && (got = pread(fd, b, 1 << 20, base)) > 0) {
            for (ssize_t o = 0; o + 64 <= got; o += 512)
                if (memcmp(b + o, pat, 64) == 0) {
                    *where = base + o;
                    found = 1;
                    break;
                }
            base += got;
        }
        close(fd);
    }
    closedir(d);
    free(b);
    return found;
}

START_TEST(test_swap_corruption)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    const size_t chunk = 65536;
    zo_csum_kind kinds[] = {ZO_CSUM_CRC32C, ZO_CSUM_XXH3};
    for (int ki = 0; ki < 2; ki++) {
        if (!zo_csum_available(kinds[ki]))
            continue;
        zo_swap *s = make_swap(dirs, 1, chunk, 1 << 20, kinds[ki]);
        size_t n = 4 * chunk;
        uint8_t *a = malloc(n), *b = malloc(n);
        zo_test_rng rng = {zo_test_seed() ^ 5};
        zo_test_fill_bytes(&rng, a, n);
        zo_swap_id id;
        ck_assert_int_eq(zo_swap_alloc(s, n, "layer3.m", &id), 0);
        swap_io(s, 1, id, 0, a, n);
        /* flip one byte of chunk 2 in the arena file */
        uint64_t victim = 2 * chunk + 777;
        char path[4400];
        off_t base;
        ck_assert(find_in_arenas(dir, a + 2 * chunk, path, sizeof(path), &base));
        int fd = open(path, O_RDWR);
        uint8_t v;
        ck_assert_int_eq(pread(fd, &v, 1, base + 777), 1);
        ck_assert_uint_eq(v, a[victim]);
        v ^= 0x10;
        ck_assert_int_eq(pwrite(fd, &v, 1, base + 777), 1);
        fsync(fd);
        close(fd);
        zo_swap_io *io;
        ck_assert_int_eq(zo_swap_read(s, id, 0, b, n, NULL, NULL, &io), 0);
        ck_assert_int_eq(zo_swap_wait(s, io), ZO_ECORRUPT);
        const char *msg = zo_last_error_detail();
        ck_assert_msg(strstr(msg, "'layer3.m'") && strstr(msg, "offset 131072") && strstr(msg, path),
                      "detail: %s", msg);
        ck_assert_str_eq(zo_swap_errmsg(s), msg);
        /* the chunks around it are fine */
        swap_io(s, 0, id, 0, b, 2 * chunk);
        ck_assert(memcmp(a, b, 2 * chunk) == 0);
        swap_io(s, 0, id, 3 * chunk, b, chunk);
        ck_assert(memcmp(a + 3 * chunk, b, chunk) == 0);
        zo_swap_stats st;
        zo_swap_get_stats(s, &st);
        ck_assert_uint_eq(st.corrupt, 1);
        /* rewriting the chunk heals it */
        swap_io(s, 1, id, 2 * chunk, a + 2 * chunk, chunk);
        swap_io(s, 0, id, 0, b, n);
        ck_assert(memcmp(a, b, n) == 0);
        zo_swap_destroy(&s);
        free(a);
        free(b);
    }
    zo_test_rmtree(dir);
}
END_TEST

/* Thousands of random swaps (writes of random ranges with new contents,
 * reads checked byte-exact, frees and re-allocations) across two
 * directories, with a shadow copy as the reference. */
START_TEST(test_swap_random_integrity)
{
    char d0[256], d1[256];
    zo_test_mkdtemp(d0, sizeof(d0));
    zo_test_mkdtemp(d1, sizeof(d1));
    const char *dirs[] = {d0, d1};
    const size_t chunk = 8192;
    zo_swap *s = make_swap(dirs, 2, chunk, 512 * 1024, ZO_CSUM_CRC32C);
    enum { NT = 24, OPS = 4000 };
    zo_swap_id id[NT];
    uint8_t *shadow[NT];
    uint64_t size[NT];
    zo_test_rng rng = {zo_test_seed() ^ 6};
    for (int i = 0; i < NT; i++) {
        size[i] = 1 + zo_test_next(&rng) % (10 * chunk);
        shadow[i] = calloc(1, size[i]);
        char nm[16];
        snprintf(nm, sizeof(nm), "r%d", i);
        ck_assert_int_eq(zo_swap_alloc(s, size[i], nm, &id[i]), 0);
    }
    uint8_t *buf;
    ck_assert_int_eq(zo_aligned_alloc((void **)&buf, 12 * chunk, 4096), 0);
    unsigned writes = 0, reads = 0, reallocs = 0;
    for (int op = 0; op < OPS; op++) {
        int i = (int)(zo_test_next(&rng) % NT);
        uint64_t nch = (size[i] + chunk - 1) / chunk;
        uint64_t c0 = zo_test_next(&rng) % nch, c1 = c0 + 1 + zo_test_next(&rng) % (nch - c0);
        uint64_t off = c0 * chunk, len = ZO_MIN(c1 * chunk, size[i]) - off;
        unsigned kind = (unsigned)(zo_test_next(&rng) % 100);
        size_t mis = (zo_test_next(&rng) & 1) ? 0 : (zo_test_next(&rng) % 64);
        if (kind < 45) {
            zo_test_fill_bytes(&rng, shadow[i] + off, len);
            memcpy(buf + mis, shadow[i] + off, len);
            swap_io(s, 1, id[i], off, buf + mis, len);
            writes++;
        } else if (kind < 95) {
            swap_io(s, 0, id[i], off, buf + mis, len);
            ZO_EXPECT(memcmp(buf + mis, shadow[i] + off, len) == 0, "op %d: r%d [%llu, +%llu) differs", op, i,
                      (unsigned long long)off, (unsigned long long)len);
            reads++;
        } else {
            ck_assert_int_eq(zo_swap_free(s, id[i]), 0);
            free(shadow[i]);
            size[i] = 1 + zo_test_next(&rng) % (10 * chunk);
            shadow[i] = calloc(1, size[i]);
            ck_assert_int_eq(zo_swap_alloc(s, size[i], "re", &id[i]), 0);
            reallocs++;
        }
    }
    for (int i = 0; i < NT; i++) {
        uint8_t *all = malloc(size[i]);
        swap_io(s, 0, id[i], 0, all, size[i]);
        ck_assert_msg(memcmp(all, shadow[i], size[i]) == 0, "final r%d differs", i);
        free(all);
        free(shadow[i]);
    }
    ck_assert_uint_gt(writes, 1000);
    ck_assert_uint_gt(reads, 1000);
    ck_assert_uint_gt(reallocs, 50);
    zo_swap_stats st;
    zo_swap_get_stats(s, &st);
    ck_assert_uint_eq(st.corrupt, 0);
    ck_assert_uint_eq(st.io_errors, 0);
    zo_swap_destroy(&s);
    zo_aligned_free(buf);
    zo_test_rmtree(d0);
    zo_test_rmtree(d1);
}
END_TEST

/* Async completion: callbacks, wait_all, test, and two threads at once. */
typedef struct cb_state {
    _Atomic int calls;
    _Atomic int errs;
} cb_state;

static void on_done(void *user, int err)
{
    cb_state *c = user;
    if (err)
        atomic_fetch_add(&c->errs, 1);
    atomic_fetch_add(&c->calls, 1);
}

typedef struct thr_arg {
    zo_swap *s;
    int seed;
    int bad;
} thr_arg;

static void *thr_main(void *p)
{
    thr_arg *a = p;
    const size_t n = 200000;
    uint8_t *x = malloc(n), *y = malloc(n);
    zo_test_rng rng = {zo_test_seed() ^ (uint64_t)a->seed};
    for (int k = 0; k < 40; k++) {
        zo_swap_id id;
        if (zo_swap_alloc(a->s, n, "thr", &id) < 0) {
            a->bad++;
            break;
        }
        zo_test_fill_bytes(&rng, x, n);
        zo_swap_io *io;
        if (zo_swap_write(a->s, id, 0, x, n, NULL, NULL, &io) < 0 || zo_swap_wait(a->s, io) < 0 ||
            zo_swap_read(a->s, id, 0, y, n, NULL, NULL, &io) < 0 || zo_swap_wait(a->s, io) < 0 ||
            memcmp(x, y, n) != 0)
            a->bad++;
        zo_swap_free(a->s, id);
    }
    free(x);
    free(y);
    return NULL;
}

START_TEST(test_swap_async)
{
    char dir[256];
    const size_t chunk = 65536;
    zo_swap *s = make_swap_tmp(dir, sizeof(dir), chunk, 4 << 20, ZO_CSUM_CRC32C);
    enum { N = 32 };
    zo_swap_id id[N];
    uint8_t *x[N];
    cb_state cs = {0, 0};
    zo_test_rng rng = {zo_test_seed() ^ 7};
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(zo_swap_alloc(s, 3 * chunk + 5, "cb", &id[i]), 0);
        x[i] = malloc(3 * chunk + 5);
        zo_test_fill_bytes(&rng, x[i], 3 * chunk + 5);
        ck_assert_int_eq(zo_swap_write(s, id[i], 0, x[i], 3 * chunk + 5, on_done, &cs, NULL), 0);
    }
    /* in flight: freeing must be refused, or the io already completed */
    int fr = zo_swap_free(s, id[N - 1]);
    ck_assert(fr == -EBUSY || fr == 0);
    if (fr == 0)
        ck_assert_int_eq(zo_swap_alloc(s, 3 * chunk + 5, "cb", &id[N - 1]), 0);
    ck_assert_int_eq(zo_swap_wait_all(s), 0);
    ck_assert_int_eq(atomic_load(&cs.calls), N);
    ck_assert_int_eq(atomic_load(&cs.errs), 0);
    if (fr == 0)
        ck_assert_int_eq(zo_swap_write(s, id[N - 1], 0, x[N - 1], 3 * chunk + 5, NULL, NULL, NULL), 0);
    ck_assert_int_eq(zo_swap_wait_all(s), 0);
    uint8_t *y = malloc(3 * chunk + 5);
    for (int i = 0; i < N; i++) {
        zo_swap_io *io;
        ck_assert_int_eq(zo_swap_read(s, id[i], 0, y, 3 * chunk + 5, NULL, NULL, &io), 0);
        int r;
        while ((r = zo_swap_test(s, io)) == ZO_PENDING)
            sched_yield();
        ck_assert_int_eq(r, 0);
        ck_assert(memcmp(x[i], y, 3 * chunk + 5) == 0);
    }
    /* an unwaited failing read is reported by wait_all */
    {
        char path[4400];
        off_t base;
        ck_assert(find_in_arenas(dir, x[3], path, sizeof(path), &base));
        int fd = open(path, O_RDWR);
        uint8_t v = (uint8_t)~x[3][0];
        ck_assert_int_eq(pwrite(fd, &v, 1, base), 1);
        close(fd);
        ck_assert_int_eq(zo_swap_read(s, id[3], 0, y, chunk, NULL, NULL, NULL), 0);
        ck_assert_int_eq(zo_swap_wait_all(s), ZO_ECORRUPT);
        ck_assert_int_eq(zo_swap_wait_all(s), 0);
    }
    thr_arg ta[2] = {{s, 11, 0}, {s, 12, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, thr_main, &ta[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_eq(ta[0].bad + ta[1].bad, 0);
    for (int i = 0; i < N; i++)
        free(x[i]);
    free(y);
    zo_swap_destroy(&s);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- zo_swap_test: ZO_PENDING, never an error code, for "not finished" ------- */
/* It used to return -EBUSY while an io was in flight, which is also a
 * possible completion error: a finished io that failed with -EBUSY looked
 * pending forever to a polling caller. The queue-fault hook holds a write
 * open (its submission guard keeps it in flight) and then fails it with
 * -EBUSY. */
typedef struct gate {
    pthread_mutex_t m;
    pthread_cond_t c;
    int entered, release;
    int ret;            /* what the hook returns once released */
    zo_swap_io *io;     /* the io being submitted (set before the hook runs) */
    zo_swap *s;
    zo_swap_id id;
    uint8_t *buf;
    size_t len;
    int rc;
} gate;

static void gate_init(gate *g)
{
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->m, NULL);
    pthread_cond_init(&g->c, NULL);
}

static void gate_fini(gate *g)
{
    pthread_mutex_destroy(&g->m);
    pthread_cond_destroy(&g->c);
}

/* block until released; 1 if entered within `sec` seconds */
static int gate_hold(gate *g)
{
    pthread_mutex_lock(&g->m);
    g->entered = 1;
    pthread_cond_broadcast(&g->c);
    while (!g->release)
        pthread_cond_wait(&g->c, &g->m);
    int r = g->ret;
    pthread_mutex_unlock(&g->m);
    return r;
}

static int gate_wait_entered(gate *g, int sec)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += sec;
    pthread_mutex_lock(&g->m);
    while (!g->entered)
        if (pthread_cond_timedwait(&g->c, &g->m, &dl) != 0)
            break;
    int e = g->entered;
    pthread_mutex_unlock(&g->m);
    return e;
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->m);
    g->release = 1;
    pthread_cond_broadcast(&g->c);
    pthread_mutex_unlock(&g->m);
}

static int qfault_gate(void *user, int write, uint64_t idx)
{
    return write && idx == 1 ? gate_hold(user) : 0;
}

static void *gate_writer(void *p)
{
    gate *g = p;
    g->rc = zo_swap_write(g->s, g->id, 0, g->buf, g->len, NULL, NULL, &g->io);
    return NULL;
}

START_TEST(test_swap_test_pending)
{
    char dir[256];
    const size_t chunk = 16384;
    zo_swap *s = make_swap_tmp(dir, sizeof(dir), chunk, 64 * chunk, ZO_CSUM_CRC32C);
    gate g;
    gate_init(&g);
    g.s = s;
    g.len = 2 * chunk;
    g.buf = calloc(1, g.len);
    g.ret = -EBUSY;
    ck_assert_int_eq(zo_swap_alloc(s, g.len, "pending", &g.id), 0);
    zo__swap_set_queue_fault(s, qfault_gate, &g);
    pthread_t th;
    pthread_create(&th, NULL, gate_writer, &g);
    ck_assert_msg(gate_wait_entered(&g, 30), "the write never reached its second chunk");
    pthread_mutex_lock(&g.m);
    zo_swap_io *io = g.io;
    pthread_mutex_unlock(&g.m);
    ck_assert_ptr_nonnull(io);
    /* in flight: pending, and the io stays valid */
    ck_assert_int_eq(zo_swap_test(s, io), ZO_PENDING);
    ck_assert_int_eq(zo_swap_test(s, io), ZO_PENDING);
    gate_open(&g);
    pthread_join(th, NULL);
    ck_assert_int_eq(g.rc, 0);
    int r;
    while ((r = zo_swap_test(s, io)) == ZO_PENDING)
        sched_yield();
    /* finished with -EBUSY: told apart from "not yet" */
    ck_assert_int_eq(r, -EBUSY);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "could not queue"));
    zo__swap_set_queue_fault(s, NULL, NULL);
    ck_assert_int_eq(zo_swap_wait_all(s), 0);
    zo_swap_destroy(&s);
    free(g.buf);
    gate_fini(&g);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- the store's error message under concurrent failures ----------------------- */
/* Two threads fail at once with messages of different lengths; the store's
 * message must always be one of them whole. Before the message was copied
 * under a lock, two memcpy()s into it could interleave and leave a mix.
 * The race is a timing one: this test shows it often, not on every run. */
typedef struct errthr {
    zo_swap *s;
    zo_swap_id id;
    int rounds;
    pthread_barrier_t *bar;
} errthr;

static void *err_main(void *p)
{
    errthr *e = p;
    uint8_t b[16];
    for (int i = 0; i < e->rounds; i++) {
        pthread_barrier_wait(e->bar);
        zo_swap_io *io;
        zo_swap_read(e->s, e->id, 1, b, sizeof(b), NULL, NULL, &io); /* -EINVAL, names the allocation */
        pthread_barrier_wait(e->bar);
        pthread_barrier_wait(e->bar); /* main checks */
    }
    return NULL;
}

START_TEST(test_swap_errmsg_threads)
{
    char dir[256];
    const size_t chunk = 16384;
    zo_swap *s = make_swap_tmp(dir, sizeof(dir), chunk, 64 * chunk, ZO_CSUM_NONE);
    char nm[2][200];
    memset(nm[0], 'a', 20);
    nm[0][20] = 0;
    memset(nm[1], 'b', 190);
    nm[1][190] = 0;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 3);
    errthr e[2];
    pthread_t th[2];
    const int rounds = 2000;
    for (int i = 0; i < 2; i++) {
        e[i] = (errthr){s, 0, rounds, &bar};
        ck_assert_int_eq(zo_swap_alloc(s, chunk, nm[i], &e[i].id), 0);
        pthread_create(&th[i], NULL, err_main, &e[i]);
    }
    char want[2][ZO_ERRMSG_LEN];
    for (int i = 0; i < 2; i++) {
        zo_swap_io *io;
        uint8_t b[16];
        ck_assert_int_eq(zo_swap_read(s, e[i].id, 1, b, sizeof(b), NULL, NULL, &io), -EINVAL);
        snprintf(want[i], sizeof(want[i]), "%s", zo_swap_errmsg(s));
    }
    ck_assert_str_ne(want[0], want[1]);
    int mixed = 0;
    for (int i = 0; i < rounds; i++) {
        pthread_barrier_wait(&bar);
        pthread_barrier_wait(&bar);
        const char *m = zo_swap_errmsg(s);
        if (strcmp(m, want[0]) != 0 && strcmp(m, want[1]) != 0)
            mixed++;
        pthread_barrier_wait(&bar);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    ck_assert_msg(mixed == 0, "%d of %d rounds left a message that is neither failure's", mixed, rounds);
    zo_swap_destroy(&s);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- arenas grow without the store's lock held ----------------------------------- */
/* zo_swap_alloc() used to create and fallocate a new arena (a second or more
 * per GiB) holding the store's lock, which every completion, wait, read,
 * write, free and stats call needs. The grow hook holds one growth open
 * (where the fallocate runs) while this thread does all of those on an
 * allocation that already has space; before the fix (the hook then ran,
 * as fallocate did, under the lock) they would block until the deadline. */
static int grow_gate(void *user, const char *path)
{
    (void)path;
    return gate_hold(user);
}

typedef struct grower {
    zo_swap *s;
    uint64_t bytes;
    zo_swap_id id;
    int rc;
} grower;

static void *grow_main(void *p)
{
    grower *g = p;
    g->rc = zo_swap_alloc(g->s, g->bytes, "grower", &g->id);
    return NULL;
}

typedef struct busy {
    zo_swap *s;
    zo_swap_id id;
    size_t len;
    _Atomic int done;
    int bad;
} busy;

static void *busy_main(void *p)
{
    busy *b = p;
    uint8_t *x = malloc(b->len), *y = malloc(b->len);
    zo_test_rng rng = {zo_test_seed() ^ 21};
    for (int k = 0; k < 20; k++) {
        zo_test_fill_bytes(&rng, x, b->len);
        zo_swap_io *io;
        int r;
        if (zo_swap_write(b->s, b->id, 0, x, b->len, NULL, NULL, &io) < 0 || zo_swap_wait(b->s, io) < 0 ||
            zo_swap_read(b->s, b->id, 0, y, b->len, NULL, NULL, &io) < 0)
            b->bad++;
        else {
            while ((r = zo_swap_test(b->s, io)) == ZO_PENDING)
                sched_yield();
            if (r < 0 || memcmp(x, y, b->len) != 0)
                b->bad++;
        }
        zo_swap_stats st;
        zo_swap_get_stats(b->s, &st);
        zo_swap_id t;
        /* a small allocation fits the existing arena: no growth, no wait */
        if (zo_swap_alloc(b->s, 4096, "small", &t) < 0 || zo_swap_free(b->s, t) < 0)
            b->bad++;
    }
    if (zo_swap_wait_all(b->s) < 0)
        b->bad++;
    free(x);
    free(y);
    atomic_store(&b->done, 1);
    return NULL;
}

START_TEST(test_swap_grow_unlocked)
{
    char dir[256];
    const size_t chunk = 65536;
    zo_swap *s = make_swap_tmp(dir, sizeof(dir), chunk, 8 * chunk, ZO_CSUM_CRC32C);
    busy b = {s, 0, 4 * chunk, 0, 0};
    ck_assert_int_eq(zo_swap_alloc(s, b.len, "busy", &b.id), 0); /* first arena, 4 chunks left */
    gate g;
    gate_init(&g);
    g.ret = 0;
    zo__swap_set_grow_hook(s, grow_gate, &g);
    grower gr = {s, 6 * chunk, 0, -1}; /* does not fit: grows */
    pthread_t tg, tb;
    pthread_create(&tg, NULL, grow_main, &gr);
    ck_assert_msg(gate_wait_entered(&g, 30), "the allocation never grew the store");
    pthread_create(&tb, NULL, busy_main, &b);
    /* the store keeps working while the growth is held open */
    uint64_t t0 = zo__now_ns();
    while (!atomic_load(&b.done) && zo__now_ns() - t0 < 20000000000ull)
        usleep(1000);
    int finished = atomic_load(&b.done);
    gate_open(&g);
    pthread_join(tg, NULL);
    pthread_join(tb, NULL);
    ck_assert_msg(finished, "I/O, stats and small allocations blocked while an arena was being created");
    ck_assert_int_eq(b.bad, 0);
    ck_assert_msg(gr.rc == 0, "growing alloc: %s", zo_strerror(gr.rc));
    zo_swap_stats st;
    zo_swap_get_stats(s, &st);
    ck_assert_uint_eq(st.arena_files, 2);
    /* a failed growth (as a failed fallocate) leaves nothing behind and the
     * store usable */
    g.entered = g.release = 0;
    g.ret = -ENOSPC;
    gate_open(&g);
    zo_swap_id id;
    ck_assert_int_eq(zo_swap_alloc(s, 16 * chunk, "nospace", &id), -ENOSPC);
    ck_assert_ptr_nonnull(strstr(zo_swap_errmsg(s), "nospace"));
    zo_swap_get_stats(s, &st);
    ck_assert_uint_eq(st.arena_files, 2);
    ck_assert_int_eq(count_arenas(dir, NULL, 1), 2);
    zo__swap_set_grow_hook(s, NULL, NULL);
    ck_assert_int_eq(zo_swap_alloc(s, 16 * chunk, "fits", &id), 0);
    zo_swap_destroy(&s);
    gate_fini(&g);
    zo_test_rmtree(dir);
}
END_TEST

/* Many threads allocating at once, each allocation growing the store now
 * and then with the lock dropped: every allocation keeps its own bytes
 * (written and read back while the others run), max_bytes holds, and the
 * growths of one directory do not pile up (one thread grows it, the others
 * wait for that arena). Arenas of 8 chunks, allocations of 1..5 chunks. */
typedef struct churn {
    zo_swap *s;
    int seed;
    int bad, budget;
} churn;

static void *churn_main(void *p)
{
    churn *c = p;
    const size_t chunk = 16384;
    zo_test_rng rng = {zo_test_seed() ^ (uint64_t)c->seed};
    enum { LIVE = 6 };
    zo_swap_id ids[LIVE] = {0};
    uint8_t *data[LIVE] = {0};
    size_t lens[LIVE] = {0};
    uint8_t *y = malloc(5 * chunk);
    for (int k = 0; k < 150; k++) {
        unsigned i = (unsigned)(zo_test_next(&rng) % LIVE);
        if (ids[i]) {
            zo_swap_io *io;
            if (zo_swap_read(c->s, ids[i], 0, y, lens[i], NULL, NULL, &io) < 0 || zo_swap_wait(c->s, io) < 0 ||
                memcmp(y, data[i], lens[i]) != 0)
                c->bad++;
            if (zo_swap_free(c->s, ids[i]) < 0)
                c->bad++;
            ids[i] = 0;
            free(data[i]);
            data[i] = NULL;
            continue;
        }
        lens[i] = chunk * (1 + zo_test_next(&rng) % 5) - (zo_test_next(&rng) % 2) * 100;
        int r = zo_swap_alloc(c->s, lens[i], "churn", &ids[i]);
        if (r == ZO_EBUDGET) {
            c->budget++;
            ids[i] = 0;
            continue;
        }
        if (r < 0) {
            c->bad++;
            ids[i] = 0;
            continue;
        }
        data[i] = malloc(lens[i]);
        zo_test_fill_bytes(&rng, data[i], lens[i]);
        zo_swap_io *io;
        if (zo_swap_write(c->s, ids[i], 0, data[i], lens[i], NULL, NULL, &io) < 0 || zo_swap_wait(c->s, io) < 0)
            c->bad++;
    }
    for (unsigned i = 0; i < LIVE; i++)
        if (ids[i]) {
            zo_swap_io *io;
            if (zo_swap_read(c->s, ids[i], 0, y, lens[i], NULL, NULL, &io) < 0 || zo_swap_wait(c->s, io) < 0 ||
                memcmp(y, data[i], lens[i]) != 0)
                c->bad++;
            free(data[i]);
        }
    free(y);
    return NULL;
}

START_TEST(test_swap_grow_concurrent)
{
    char d[2][256];
    const char *dirs[2];
    for (int i = 0; i < 2; i++) {
        zo_test_mkdtemp(d[i], sizeof(d[i]));
        dirs[i] = d[i];
    }
    const size_t chunk = 16384;
    zo_swap_config c;
    zo_swap_config_default(&c);
    set_backend(&c);
    c.dirs = dirs;
    c.ndirs = 2;
    c.chunk_size = chunk;
    c.arena_size = 8 * chunk;
    c.max_bytes = 40 * 8 * chunk;
    zo_swap *s = NULL;
    ck_assert_int_eq(zo_swap_create(&s, &c), 0);
    enum { T = 6 };
    churn ch[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        ch[i] = (churn){s, 100 + i, 0, 0};
        pthread_create(&th[i], NULL, churn_main, &ch[i]);
    }
    int bad = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        bad += ch[i].bad;
    }
    ck_assert_int_eq(bad, 0);
    zo_swap_stats st;
    zo_swap_get_stats(s, &st);
    ck_assert_uint_le(st.arena_bytes, c.max_bytes);
    uint64_t fb = 0;
    int files = count_arenas(d[0], &fb, 1) + count_arenas(d[1], &fb, 1);
    ck_assert_uint_eq((uint64_t)files, st.arena_files);
    ck_assert_uint_eq(fb, st.arena_bytes);
    zo_swap_destroy(&s);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(count_arenas(d[i], NULL, 0), 0);
        zo_test_rmtree(d[i]);
    }
}
END_TEST

/* ---- stale arenas of dead processes; live ones of other processes --------------- */
/* A store's arena files of a killed process stayed forever (1 GiB each),
 * and a restarted process with the same pid (pid 1 in every container)
 * could not create its arenas (-EEXIST). Each arena is now held with a
 * lock for its life; nobody holding it means its store is gone. */

/* names of the arena files in dir, newline-separated, into buf */
static int arena_names(const char *dir, char *buf, size_t len)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    int n = 0;
    buf[0] = 0;
    while ((de = readdir(d)))
        if (strncmp(de->d_name, "zo-swap.", 8) == 0) {
            size_t l = strlen(buf);
            snprintf(buf + l, len - l, "%s\n", de->d_name);
            n++;
        }
    closedir(d);
    return n;
}

/* A child that creates a store with one reserved arena in dir, writes a
 * pattern, tells the parent (one byte on `up`), and then, on a byte from
 * `down`, reads the pattern back and exits 0 if it is intact. With
 * die_now, it kills itself with SIGKILL after telling the parent instead. */
static void child_store(const char *dir, int up, int down, int die_now)
{
    const char *dirs[] = {dir};
    zo_swap_config c;
    zo_swap_config_default(&c);
    c.dirs = dirs;
    c.ndirs = 1;
    c.chunk_size = 16384;
    c.arena_size = 64 * 16384;
    c.reserve = 64 * 16384;
    zo_swap *s = NULL;
    zo_swap_id id;
    static uint8_t x[65536], y[65536];
    for (size_t i = 0; i < sizeof(x); i++)
        x[i] = (uint8_t)(i * 7 + 3);
    zo_swap_io *io;
    if (zo_swap_create(&s, &c) < 0 || zo_swap_alloc(s, sizeof(x), "child", &id) < 0 ||
        zo_swap_write(s, id, 0, x, sizeof(x), NULL, NULL, &io) < 0 || zo_swap_wait(s, io) < 0)
        _exit(2);
    char b = 1;
    if (write(up, &b, 1) != 1)
        _exit(3);
    if (die_now)
        kill(getpid(), SIGKILL);
    if (read(down, &b, 1) != 1)
        _exit(4);
    if (zo_swap_read(s, id, 0, y, sizeof(y), NULL, NULL, &io) < 0 || zo_swap_wait(s, io) < 0)
        _exit(5);
    int same = memcmp(x, y, sizeof(x)) == 0;
    zo_swap_destroy(&s);
    _exit(same ? 0 : 6);
}

START_TEST(test_swap_stale_arenas)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    char names[4096], before[4096];
    /* 1. a live store of another process is never touched */
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    pid_t live = fork();
    ck_assert_int_ge(live, 0);
    if (live == 0) {
        close(up[0]);
        close(down[1]);
        child_store(dir, up[1], down[0], 0);
    }
    close(up[1]);
    close(down[0]);
    char b;
    ck_assert_int_eq(read(up[0], &b, 1), 1);
    ck_assert_int_eq(arena_names(dir, before, sizeof(before)), 1);
    zo_swap *s = make_swap(dirs, 1, 16384, 64 * 16384, ZO_CSUM_CRC32C);
    zo_swap_id id;
    ck_assert_int_eq(zo_swap_alloc(s, 16384, "parent", &id), 0);
    ck_assert_int_eq(arena_names(dir, names, sizeof(names)), 2);
    ck_assert_msg(strstr(names, before) != NULL, "the live child's arena %s was removed", before);
    zo_swap_destroy(&s);
    ck_assert_int_eq(write(down[1], &b, 1), 1);
    int st;
    ck_assert_int_eq(waitpid(live, &st, 0), live);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child store lost its data (status 0x%x)", st);
    ck_assert_int_eq(count_arenas(dir, NULL, 0), 0);
    close(up[0]);
    close(down[1]);

    /* 2. a killed process's arena is reclaimed by the next store */
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    pid_t dead = fork();
    ck_assert_int_ge(dead, 0);
    if (dead == 0) {
        close(up[0]);
        child_store(dir, up[1], down[0], 1);
    }
    close(up[1]);
    ck_assert_int_eq(read(up[0], &b, 1), 1);
    ck_assert_int_eq(waitpid(dead, &st, 0), dead);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    close(up[0]);
    close(down[0]);
    close(down[1]);
    uint64_t bytes = 0;
    ck_assert_int_eq(count_arenas(dir, &bytes, 0), 1);
    ck_assert_uint_eq(bytes, 64 * 16384);
    s = make_swap(dirs, 1, 16384, 8 * 16384, ZO_CSUM_CRC32C);
    ck_assert_msg(count_arenas(dir, NULL, 0) == 0, "the dead process's arena was left behind");

    /* 3. our own next name taken (a restarted container gets the pid of
     * its dead predecessor): a stale file is reclaimed and its name reused;
     * an empty one, a live one or a symlink make us take the next name,
     * and the symlink is never followed */
    ck_assert_int_eq(zo_swap_alloc(s, 16384, "first", &id), 0);
    ck_assert_int_eq(arena_names(dir, names, sizeof(names)), 1);
    long pid;
    unsigned inst, seq;
    ck_assert_int_eq(sscanf(names, "zo-swap.%ld.%u.%u", &pid, &inst, &seq), 3);
    ck_assert_int_eq(pid, (long)getpid());
    char p[600], target[600];
    snprintf(p, sizeof(p), "%s/zo-swap.%ld.%u.%u", dir, pid, inst, seq + 1);
    int fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 65536), 0); /* stale: has space, nobody holds it */
    close(fd);
    zo_swap_id big;
    int r = zo_swap_alloc(s, 8 * 16384, "grow1", &big);
    ck_assert_msg(r == 0, "alloc over a stale arena of our own name: %s (%s)", zo_strerror(r),
                  zo_last_error_detail());
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_uint_eq(sb.st_size, 8 * 16384); /* ours now, reserved anew */
    snprintf(p, sizeof(p), "%s/zo-swap.%ld.%u.%u", dir, pid, inst, seq + 2);
    fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0600); /* empty leftover */
    ck_assert_int_ge(fd, 0);
    close(fd);
    snprintf(target, sizeof(target), "%s/target", dir);
    fd = open(target, O_CREAT | O_EXCL | O_WRONLY, 0600);
    ck_assert_int_eq(write(fd, "keep", 4), 4);
    close(fd);
    snprintf(p, sizeof(p), "%s/zo-swap.%ld.%u.%u", dir, pid, inst, seq + 3);
    ck_assert_int_eq(symlink(target, p), 0);
    zo_swap_id big2;
    r = zo_swap_alloc(s, 8 * 16384, "grow2", &big2);
    ck_assert_msg(r == 0, "alloc past taken names: %s (%s)", zo_strerror(r), zo_last_error_detail());
    ck_assert_int_eq(stat(target, &sb), 0);
    ck_assert_uint_eq(sb.st_size, 4);
    ck_assert_int_eq(lstat(p, &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    zo_swap_stats sst;
    zo_swap_get_stats(s, &sst);
    ck_assert_uint_eq(sst.arena_files, 3);
    zo_swap_destroy(&s);
    /* left: the symlink (untouched), its target, the empty file; no arena */
    snprintf(p, sizeof(p), "%s/zo-swap.%ld.%u.%u", dir, pid, inst, seq + 3);
    ck_assert_int_eq(lstat(p, &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    ck_assert_int_eq(unlink(p), 0);
    uint64_t left = 0;
    ck_assert_int_eq(count_arenas(dir, &left, 0), 1);
    ck_assert_uint_eq(left, 0);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- a small arena for a small run -------------------------------------------- */
/* Tools size arena_size from the run; a value below the chunk size is
 * taken as one chunk, so a tiny run reserves a tiny file, not 1 GiB. */
START_TEST(test_swap_small_arena)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[] = {dir};
    zo_swap_config c;
    zo_swap_config_default(&c);
    set_backend(&c);
    c.dirs = dirs;
    c.ndirs = 1;
    c.chunk_size = 65536;
    c.arena_size = 5000; /* below one chunk */
    zo_swap *s = NULL;
    ck_assert_int_eq(zo_swap_create(&s, &c), 0);
    zo_swap_id id;
    uint8_t x[5000], y[5000];
    memset(x, 0x5a, sizeof(x));
    ck_assert_int_eq(zo_swap_alloc(s, sizeof(x), "tiny", &id), 0);
    swap_io(s, 1, id, 0, x, sizeof(x));
    swap_io(s, 0, id, 0, y, sizeof(y));
    ck_assert(memcmp(x, y, sizeof(x)) == 0);
    uint64_t b = 0;
    ck_assert_int_eq(count_arenas(dir, &b, 1), 1);
    ck_assert_uint_eq(b, 65536);
    zo_swap_destroy(&s);
    c.arena_size = 0;
    ck_assert_int_eq(zo_swap_create(&s, &c), ZO_ECONFIG);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "arena_size"));
    zo_test_rmtree(dir);
}
END_TEST

/* ---- full disk (tmpfs of 8 MiB in a private mount namespace) ------------------ */
static char full_dir[256];

static int mount_small(const char *dir, const char *size)
{
    if (unshare(CLONE_NEWNS) != 0)
        return -errno;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return -errno;
    char opt[64];
    snprintf(opt, sizeof(opt), "size=%s,mode=0700", size);
    if (mount("tmpfs", dir, "tmpfs", 0, opt) != 0)
        return -errno;
    return 0;
}

START_TEST(test_swap_disk_full)
{
    int r = mount_small(full_dir, "8m");
    ck_assert_msg(r == 0, "mount: %s", strerror(-r)); /* probed by main before */
    const char *dirs[] = {full_dir};
    zo_swap_config c;
    zo_swap_config_default(&c);
    c.dirs = dirs;
    c.ndirs = 1;
    c.chunk_size = 65536;
    c.arena_size = 2 << 20;
    /* reserving more than the disk holds fails at create, leaving nothing */
    c.reserve = 16 << 20;
    zo_swap *s = NULL;
    ck_assert_int_eq(zo_swap_create(&s, &c), -ENOSPC);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "cannot reserve"));
    ck_assert_int_eq(count_arenas(full_dir, NULL, 0), 0);
    c.reserve = 0;
    ck_assert_int_eq(zo_swap_create(&s, &c), 0);
    zo_swap_info info;
    zo_swap_id a, b, d;
    ck_assert_int_eq(zo_swap_alloc(s, 3 << 20, "fits", &a), 0);
    zo_swap_get_info(s, &info);
    /* tmpfs takes O_DIRECT since Linux 6.6; before, the store runs buffered
     * and says why: both must work */
    ck_assert(info.direct || info.fallback[0]);
    size_t n = 3 << 20;
    uint8_t *x = malloc(n), *y = malloc(n);
    zo_test_rng rng = {zo_test_seed() ^ 8};
    zo_test_fill_bytes(&rng, x, n);
    swap_io(s, 1, a, 0, x, n);
    /* the disk cannot hold another 6 MiB: the allocation fails up front */
    r = zo_swap_alloc(s, 6 << 20, "too-much", &b);
    ck_assert_int_eq(r, -ENOSPC);
    ck_assert_msg(strstr(zo_last_error_detail(), "too-much") != NULL, "%s", zo_last_error_detail());
    /* what was there is intact, and smaller allocations still work */
    swap_io(s, 0, a, 0, y, n);
    ck_assert(memcmp(x, y, n) == 0);
    ck_assert_int_eq(zo_swap_alloc(s, 1 << 20, "small", &d), 0);
    swap_io(s, 1, d, 0, x, 1 << 20);
    swap_io(s, 0, d, 0, y, 1 << 20);
    ck_assert(memcmp(x, y, 1 << 20) == 0);
    zo_swap_destroy(&s);
    ck_assert_int_eq(count_arenas(full_dir, NULL, 0), 0);
    free(x);
    free(y);
}
END_TEST

static int can_mount_small(char *why, size_t len)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(mount_small(full_dir, "1m") == 0 ? 0 : 1);
    int st;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 1;
    snprintf(why, len, "cannot mount a size-limited tmpfs in a private mount namespace (needs root or "
                       "CAP_SYS_ADMIN); the disk-full test needs one");
    return 0;
}

int main(int argc, char **argv)
{
    zo_log_set_level(ZO_LOG_ERROR);
    if (argc > 1 && strcmp(argv[1], "diskfull") == 0) {
        zo_test_mkdtemp(full_dir, sizeof(full_dir));
        char why[256];
        if (!can_mount_small(why, sizeof(why))) {
            zo_test_rmtree(full_dir);
            ZO_TEST_SKIP("%s", why);
        }
        Suite *s = suite_create("swap-diskfull");
        TCase *tc = tcase_create("diskfull");
        tcase_add_test(tc, test_swap_disk_full);
        suite_add_tcase(s, tc);
        int rc = zo_test_run(s);
        zo_test_rmtree(full_dir);
        return rc;
    }
    Suite *s = suite_create("swap");
    TCase *tc = tcase_create("crc");
    tcase_add_test(tc, test_crc_vectors);
    tcase_add_test(tc, test_crc_variants);
    tcase_add_test(tc, test_crc_long_buffers);
    tcase_add_test(tc, test_crc_fold_constants);
    suite_add_tcase(s, tc);
    tc = tcase_create("swap");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_swap_basic);
    tcase_add_test(tc, test_swap_keep_files);
    tcase_add_test(tc, test_swap_stripe);
    tcase_add_test(tc, test_swap_dirs);
    tcase_add_test(tc, test_swap_budget_fragmented);
    tcase_add_test(tc, test_swap_budget_unaligned_holes);
    tcase_add_test(tc, test_swap_queue_failure);
    tcase_add_test(tc, test_swap_corruption);
    tcase_add_test(tc, test_swap_random_integrity);
    tcase_add_test(tc, test_swap_async);
    tcase_add_test(tc, test_swap_test_pending);
    tcase_add_test(tc, test_swap_errmsg_threads);
    tcase_add_test(tc, test_swap_grow_unlocked);
    tcase_add_test(tc, test_swap_grow_concurrent);
    tcase_add_test(tc, test_swap_stale_arenas);
    tcase_add_test(tc, test_swap_small_arena);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
