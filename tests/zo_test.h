/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared helpers for the Check-based test programs: skipping, temporary
 * directories on a real filesystem, a seeded RNG, dropping CAP_IPC_LOCK so
 * RLIMIT_MEMLOCK applies even to root, and running a suite.
 */
#ifndef ZO_TEST_H
#define ZO_TEST_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ZO_TEST_SKIP_CODE 77

/* Check records a "mark point" on every ck_assert (a write to a pipe in
 * fork mode), which makes per-element asserts in big loops very slow. In
 * element loops use ZO_EXPECT: a plain compare, Check only on failure. */
#define ZO_EXPECT(cond, ...)               \
    do {                                   \
        if (__builtin_expect(!(cond), 0))  \
            ck_abort_msg(__VA_ARGS__);     \
    } while (0)

/* Monotonic seconds, for tests that check overlap or a duration. */
static inline double zo_test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Skip the whole program (meson counts exit 77 as SKIP); say why. */
#define ZO_TEST_SKIP(...)                                   \
    do {                                                    \
        fprintf(stderr, "SKIP: ");                          \
        fprintf(stderr, __VA_ARGS__);                       \
        fprintf(stderr, "\n");                              \
        exit(ZO_TEST_SKIP_CODE);                            \
    } while (0)

/* xorshift64*: reproducible; ZO_TEST_SEED overrides the seed. */
typedef struct zo_test_rng {
    uint64_t s;
} zo_test_rng;

static inline uint64_t zo_test_seed(void)
{
    const char *e = getenv("ZO_TEST_SEED");
    return e ? strtoull(e, NULL, 0) : 0x9e3779b97f4a7c15ull;
}

static inline uint64_t zo_test_next(zo_test_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

static inline double zo_test_uniform(zo_test_rng *r) /* [0, 1) */
{
    return (double)(zo_test_next(r) >> 11) * 0x1p-53;
}

static inline void zo_test_fill_bytes(zo_test_rng *r, void *p, size_t n)
{
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = zo_test_next(r);
        memcpy(b + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = zo_test_next(r);
        memcpy(b + i, &v, n - i);
    }
}

/* A fresh directory under $ZO_TEST_DIR (default /var/tmp, a disk-backed
 * filesystem where O_DIRECT works; /tmp may be tmpfs). */
static inline void zo_test_mkdtemp(char *buf, size_t len)
{
    const char *base = getenv("ZO_TEST_DIR");
    if (!base || !*base)
        base = "/var/tmp";
    snprintf(buf, len, "%s/zo-test-XXXXXX", base);
    if (!mkdtemp(buf)) {
        fprintf(stderr, "mkdtemp(%s): %s\n", buf, strerror(errno));
        exit(1);
    }
}

/* Make directory <base>/<name> (0700) and its path in buf. */
static inline void zo_test_subdir(char *buf, size_t len, const char *base, const char *name)
{
    snprintf(buf, len, "%s/%s", base, name);
    if (mkdir(buf, 0700) != 0) {
        fprintf(stderr, "mkdir(%s): %s\n", buf, strerror(errno));
        exit(1);
    }
}

static inline void zo_test_rmtree(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf -- '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Checkpoint `ck`'s manifest.json under `root`, read whole and
 * NUL-terminated (*len bytes; the caller frees it), or NULL. */
static inline char *zo_test_manifest_read(const char *root, const char *ck, size_t *len)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/%s/manifest.json", root, ck);
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    char *text = malloc(1 << 20);
    *len = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (text)
        text[*len] = 0;
    return text;
}

/* Flip one byte at `off` of tensor `name`'s data in checkpoint `ck`: the
 * data file lays tensors out in order, each at the "offset" its manifest
 * entry gives. 0, or -1 (the tensor or the file is missing). */
static inline int zo_test_ckpt_corrupt(const char *root, const char *ck, const char *name, uint64_t off)
{
    size_t len;
    char *text = zo_test_manifest_read(root, ck, &len);
    char key[300];
    snprintf(key, sizeof(key), "\"name\":\t\"%s\"", name);
    char *at = text ? strstr(text, key) : NULL;
    at = at ? strstr(at, "\"offset\":") : NULL;
    unsigned long long base = at ? strtoull(at + strlen("\"offset\":"), NULL, 10) : 0;
    free(text);
    if (!at)
        return -1;
    char p[4200];
    snprintf(p, sizeof(p), "%s/%s/tensors.bin", root, ck);
    int fd = open(p, O_RDWR), r = -1;
    unsigned char v;
    if (fd >= 0 && pread(fd, &v, 1, (off_t)(base + off)) == 1) {
        v ^= 0x20;
        r = pwrite(fd, &v, 1, (off_t)(base + off)) == 1 ? 0 : -1;
    }
    if (fd >= 0)
        close(fd);
    return r;
}

/* Drop CAP_IPC_LOCK from this process so RLIMIT_MEMLOCK binds (root
 * otherwise ignores it). Returns 0 or -errno. */
static inline int zo_test_drop_ipc_lock(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof(d));
    if (syscall(SYS_capget, &h, d) != 0)
        return -errno;
    d[0].effective &= ~(1u << CAP_IPC_LOCK);
    d[0].permitted &= ~(1u << CAP_IPC_LOCK);
    d[0].inheritable &= ~(1u << CAP_IPC_LOCK);
    if (syscall(SYS_capset, &h, d) != 0)
        return -errno;
    return 0;
}

/* Lower RLIMIT_MEMLOCK to `bytes` and drop CAP_IPC_LOCK. */
static inline int zo_test_limit_memlock(uint64_t bytes)
{
    struct rlimit rl = {.rlim_cur = bytes, .rlim_max = bytes};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return -errno;
    return zo_test_drop_ipc_lock();
}

/* A suite `name` with one test case of that name and `timeout` seconds,
 * added to it (*tc: add the tests there). */
static inline Suite *zo_test_suite1(const char *name, TCase **tc, double timeout)
{
    Suite *s = suite_create(name);
    *tc = tcase_create(name);
    tcase_set_timeout(*tc, timeout);
    suite_add_tcase(s, *tc);
    return s;
}

/* Run a suite; returns the process exit code. CK_FORK stays as configured
 * (CK_FORK=no in the environment helps debugging). */
static inline int zo_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif /* ZO_TEST_H */
