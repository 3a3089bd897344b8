/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints: the format and its validation (manifest, checksums, latest,
 * versions, names), pruning and cleanup, and the crash test: a child
 * process writing checkpoints in a loop is SIGKILLed at a random moment,
 * 60 times; after every kill `latest` must name a complete checkpoint (the
 * previous or a newer one) whose every byte is what was saved, and every
 * checkpoint directory visible under its final name must be complete. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "zo_test.h"

#include <zoffload/zoffload.h>

#include "nvme/nvme_internal.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

static void pattern(uint8_t *p, size_t n, uint64_t a, uint64_t b)
{
    zo_test_rng r = {(a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full) ^ 0x1234567u};
    zo_test_next(&r);
    zo_test_fill_bytes(&r, p, n);
}

/* The tensors of checkpoint k: three, sizes depending on k. */
enum { NT = 3 };
static const char *tnames[NT] = {"layer0.w", "layer0.exp_avg", "layer0.exp_avg_sq"};
static uint64_t tsize(unsigned i, uint64_t k)
{
    return 300 * KiB + i * 77777 + (k % 5) * 4099;
}

static int save_k(const char *root, uint64_t k, unsigned keep)
{
    zo_ckpt_entry e[NT];
    uint8_t *d[NT];
    for (unsigned i = 0; i < NT; i++) {
        memset(&e[i], 0, sizeof(e[i]));
        e[i].name = tnames[i];
        e[i].dtype = ZO_DTYPE_U8;
        e[i].ndim = 1;
        e[i].shape[0] = tsize(i, k);
        e[i].bytes = tsize(i, k);
        d[i] = malloc(e[i].bytes);
        pattern(d[i], e[i].bytes, k, i);
    }
    char name[64], user[64];
    snprintf(name, sizeof(name), "step-%06llu", (unsigned long long)k);
    snprintf(user, sizeof(user), "{\"k\":%llu}", (unsigned long long)k);
    zo_ckpt_options o;
    zo_ckpt_options_default(&o);
    o.chunk_size = 64 * KiB;
    o.keep_last = keep;
    o.user_json = user;
    int r = zo_ckpt_save(root, name, e, (const void *const *)d, NT, &o);
    for (unsigned i = 0; i < NT; i++)
        free(d[i]);
    return r;
}

/* Open `name` (NULL: latest), check every byte against pattern k. Returns
 * k, or -1 if there is no checkpoint. Fails the test on anything else. */
static long long check_ckpt(const char *root, const char *name)
{
    zo_ckpt_reader *r;
    int rc = zo_ckpt_open(&r, root, name);
    if (rc == -ENOENT && !name)
        return -1;
    ck_assert_msg(rc == 0, "open %s: %s (%s)", name ? name : "latest", zo_strerror(rc), zo_last_error_detail());
    const char *u = zo_ckpt_user_json(r);
    unsigned long long k;
    ck_assert_msg(sscanf(u, "{\"k\":%llu}", &k) == 1, "user json %s", u);
    char want[64];
    snprintf(want, sizeof(want), "step-%06llu", k);
    ck_assert_str_eq(zo_ckpt_name(r), want);
    ck_assert_uint_eq(zo_ckpt_count(r), NT);
    ck_assert_int_eq(zo_ckpt_verify(r), 0);
    for (unsigned i = 0; i < NT; i++) {
        zo_ckpt_entry e;
        unsigned idx;
        ck_assert_int_eq(zo_ckpt_find(r, tnames[i], &idx), 0);
        ck_assert_int_eq(zo_ckpt_get_entry(r, idx, &e), 0);
        ck_assert_uint_eq(e.bytes, tsize(i, k));
        uint8_t *got = malloc(e.bytes), *exp = malloc(e.bytes);
        ck_assert_int_eq(zo_ckpt_read(r, idx, 0, got, e.bytes), 0);
        pattern(exp, e.bytes, k, i);
        ck_assert_msg(memcmp(got, exp, e.bytes) == 0, "checkpoint %s tensor %s differs", want, tnames[i]);
        free(got);
        free(exp);
    }
    zo_ckpt_close(&r);
    return (long long)k;
}

START_TEST(test_ckpt_roundtrip)
{
    char root[300], dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    char nm[64];
    ck_assert_int_eq(zo_ckpt_latest(root, nm, sizeof(nm)), -ENOENT);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    ck_assert_int_eq(zo_ckpt_latest(root, nm, sizeof(nm)), 0);
    ck_assert_str_eq(nm, "step-000001");
    ck_assert_int_eq(check_ckpt(root, NULL), 1);
    ck_assert_int_eq(save_k(root, 2, 0), 0);
    ck_assert_int_eq(check_ckpt(root, NULL), 2);
    ck_assert_int_eq(check_ckpt(root, "step-000001"), 1);
    ck_assert_int_eq(save_k(root, 2, 0), -EEXIST);
    /* shape, dtype, library version come back */
    zo_ckpt_reader *r;
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000002"), 0);
    zo_ckpt_entry e;
    ck_assert_int_eq(zo_ckpt_get_entry(r, 1, &e), 0);
    ck_assert_str_eq(e.name, tnames[1]);
    ck_assert_uint_eq(e.ndim, 1);
    ck_assert_uint_eq(e.shape[0], tsize(1, 2));
    ck_assert_int_eq(e.dtype, ZO_DTYPE_U8);
    ck_assert_str_eq(zo_ckpt_library_version(r), zo_version_string());
    ck_assert_uint_eq(zo_ckpt_chunk_size(r), 64 * KiB);
    uint8_t buf[16];
    ck_assert_int_eq(zo_ckpt_read(r, 0, 1, buf, 10), -EINVAL); /* not chunk aligned */
    ck_assert_int_eq(zo_ckpt_find(r, "nope", NULL), -ENOENT);
    ck_assert_int_eq(zo_ckpt_get_entry(r, 3, &e), -EINVAL);
    zo_ckpt_close(&r);
    ck_assert_ptr_null(r);
    /* writer rules */
    zo_ckpt_writer *w;
    ck_assert_int_eq(zo_ckpt_begin(&w, root, ".hidden", NULL), -EINVAL);
    ck_assert_int_eq(zo_ckpt_begin(&w, root, "a/b", NULL), -EINVAL);
    ck_assert_int_eq(zo_ckpt_begin(&w, root, "latest", NULL), -EINVAL);
    zo_ckpt_options o;
    zo_ckpt_options_default(&o);
    o.user_json = "{not json";
    ck_assert_int_eq(zo_ckpt_begin(&w, root, "x", &o), ZO_EFORMAT);
    o.user_json = "{\"a\":1} trailing";
    ck_assert_int_eq(zo_ckpt_begin(&w, root, "x", &o), ZO_EFORMAT);
    ck_assert_int_eq(zo_ckpt_begin(&w, root, "x", NULL), 0);
    zo_ckpt_entry a = {.name = "t", .dtype = ZO_DTYPE_F32, .bytes = 100};
    ck_assert_int_eq(zo_ckpt_add(w, &a, NULL), 0);
    ck_assert_int_eq(zo_ckpt_add(w, &a, NULL), -EEXIST);
    zo_ckpt_entry bad = {.name = "z", .dtype = ZO_DTYPE_F32, .bytes = 0};
    ck_assert_int_eq(zo_ckpt_add(w, &bad, NULL), -EINVAL);
    float f[25] = {0};
    ck_assert_int_eq(zo_ckpt_put(w, 0, 0, f, 99), -EINVAL);
    ck_assert_int_eq(zo_ckpt_put(w, 1, 0, f, 100), -EINVAL);
    /* incomplete: nothing is published */
    zo_ckpt_entry b = {.name = "u", .dtype = ZO_DTYPE_F32, .bytes = 8};
    ck_assert_int_eq(zo_ckpt_add(w, &b, NULL), 0);
    ck_assert_int_eq(zo_ckpt_put(w, 0, 0, f, 100), 0);
    ck_assert_int_eq(zo_ckpt_add(w, &b, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_ckpt_put(w, 0, 0, f, 100), ZO_ESTATE); /* twice */
    ck_assert_int_eq(zo_ckpt_commit(&w), ZO_ESTATE);
    ck_assert_ptr_null(w);
    ck_assert_int_eq(check_ckpt(root, NULL), 2);
    char p[400];
    snprintf(p, sizeof(p), "%s/x", root);
    ck_assert_int_ne(access(p, F_OK), 0);
    /* abort leaves nothing */
    ck_assert_int_eq(zo_ckpt_begin(&w, root, "y", NULL), 0);
    zo_ckpt_abort(&w);
    ck_assert_ptr_null(w);
    DIR *d = opendir(root);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(strncmp(de->d_name, ".tmp-", 5) != 0, "left %s", de->d_name);
    closedir(d);
    zo_test_rmtree(dir);
}
END_TEST

static void rewrite_file(const char *path, const char *from, const char *to)
{
    int fd = open(path, O_RDONLY);
    char *b = malloc(1 << 20);
    ssize_t n = read(fd, b, (1 << 20) - 1);
    close(fd);
    b[n] = 0;
    char *at = strstr(b, from);
    ck_assert_ptr_nonnull(at);
    char *out = malloc((size_t)n + strlen(to) + 1);
    size_t pre = (size_t)(at - b);
    memcpy(out, b, pre);
    strcpy(out + pre, to);
    strcat(out, at + strlen(from));
    fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_eq(write(fd, out, strlen(out)), (ssize_t)strlen(out));
    close(fd);
    free(b);
    free(out);
}

/* Manifests may use chunks up to 1 GiB; verification of small tensors then
 * reads each tensor whole with a buffer of its size (not a 1 GiB one) and
 * still finds a flipped byte. */
START_TEST(test_ckpt_verify_big_chunk)
{
    char root[300], dir[256], p[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    zo_ckpt_entry e[2];
    uint8_t *d[2];
    const size_t sz[2] = {5000, 13522};
    for (unsigned i = 0; i < 2; i++) {
        memset(&e[i], 0, sizeof(e[i]));
        e[i].name = i ? "b" : "a";
        e[i].dtype = ZO_DTYPE_U8;
        e[i].ndim = 1;
        e[i].shape[0] = e[i].bytes = sz[i];
        d[i] = malloc(sz[i]);
        memset(d[i], i ? 0xab : 0x11, sz[i]);
    }
    zo_ckpt_options o;
    zo_ckpt_options_default(&o);
    o.chunk_size = (size_t)1 << 30;
    ck_assert_int_eq(zo_ckpt_save(root, "s1", e, (const void *const *)d, 2, &o), 0);
    zo_ckpt_reader *r;
    ck_assert_int_eq(zo_ckpt_open(&r, root, NULL), 0);
    ck_assert_int_eq(zo_ckpt_verify(r), 0);
    zo_ckpt_close(&r);
    /* flip one byte inside tensor b: find its run of 0xab in the data file */
    snprintf(p, sizeof(p), "%s/s1/tensors.bin", root);
    int fd = open(p, O_RDWR);
    ck_assert_int_ge(fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    uint8_t *all = malloc((size_t)st.st_size);
    ck_assert_int_eq(pread(fd, all, (size_t)st.st_size, 0), st.st_size);
    uint8_t *at = memchr(all, 0xab, (size_t)st.st_size);
    ck_assert_ptr_nonnull(at);
    off_t where = (at - all) + 7000;
    uint8_t v = all[where] ^ 0x40;
    ck_assert_int_eq(pwrite(fd, &v, 1, where), 1);
    close(fd);
    free(all);
    ck_assert_int_eq(zo_ckpt_open(&r, root, NULL), 0);
    ck_assert_int_eq(zo_ckpt_verify(r), ZO_ECORRUPT);
    ck_assert_msg(strstr(zo_last_error_detail(), "'b'"), "detail: %s", zo_last_error_detail());
    zo_ckpt_close(&r);
    for (unsigned i = 0; i < 2; i++)
        free(d[i]);
    zo_test_rmtree(dir);
}
END_TEST

START_TEST(test_ckpt_validation)
{
    char root[300], dir[256], p[400], q[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    ck_assert_int_eq(save_k(root, 5, 0), 0);
    zo_ckpt_reader *r;
    /* a flipped data byte: ZO_ECORRUPT naming tensor and offset */
    snprintf(p, sizeof(p), "%s/step-000005/tensors.bin", root);
    int fd = open(p, O_RDWR);
    uint8_t v;
    off_t where = 4096 * 75 + 64 * 1024 + 10; /* tensor 0 ends at ~300 KiB: its chunk 1 */
    (void)where;
    ck_assert_int_eq(pread(fd, &v, 1, 64 * 1024 + 10), 1);
    v ^= 1;
    ck_assert_int_eq(pwrite(fd, &v, 1, 64 * 1024 + 10), 1);
    close(fd);
    ck_assert_int_eq(zo_ckpt_open(&r, root, NULL), 0);
    ck_assert_int_eq(zo_ckpt_verify(r), ZO_ECORRUPT);
    const char *msg = zo_last_error_detail();
    ck_assert_msg(strstr(msg, "'layer0.w'") && strstr(msg, "offset 65536"), "detail: %s", msg);
    zo_ckpt_close(&r);
    fd = open(p, O_RDWR);
    v ^= 1;
    ck_assert_int_eq(pwrite(fd, &v, 1, 64 * 1024 + 10), 1);
    close(fd);
    ck_assert_int_eq(check_ckpt(root, NULL), 5);
    /* a truncated data file */
    ck_assert_int_eq(truncate(p, 100000), 0);
    ck_assert_int_eq(zo_ckpt_open(&r, root, NULL), ZO_ETRUNC);
    /* manifest edits: through latest the manifest crc catches them */
    ck_assert_int_eq(save_k(root, 6, 0), 0);
    snprintf(q, sizeof(q), "%s/step-000006/manifest.json", root);
    rewrite_file(q, "\"format_version\":\t1", "\"format_version\":\t99");
    ck_assert_int_eq(zo_ckpt_open(&r, root, NULL), ZO_ECORRUPT);
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000006"), ZO_EVERSION);
    rewrite_file(q, "\"format_version\":\t99", "\"format_version\":\t\"one\"");
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000006"), ZO_EFORMAT);
    rewrite_file(q, "\"format_version\":\t\"one\"", "\"format_version\":\t1");
    ck_assert_int_eq(check_ckpt(root, "step-000006"), 6);
    rewrite_file(q, "\"dtype\":\t\"u8\"", "\"dtype\":\t\"u9\"");
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000006"), ZO_EFORMAT);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "u9"));
    rewrite_file(q, "\"dtype\":\t\"u9\"", "\"dtype\":\t\"u8\"");
    rewrite_file(q, "\"tensors\":", "\"tensorz\":");
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000006"), ZO_EFORMAT);
    rewrite_file(q, "\"tensorz\":", "\"tensors\":");
    ck_assert_int_eq(check_ckpt(root, "step-000006"), 6);
    /* garbage after the manifest's object is malformed too, not ignored */
    fd = open(q, O_WRONLY | O_APPEND);
    ck_assert_int_eq(write(fd, "{\"x\":1}", 7), 7);
    close(fd);
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000006"), ZO_EFORMAT);
    ck_assert_int_eq(truncate(q, 50), 0);
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000006"), ZO_EFORMAT);
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000042"), -ENOENT);
    /* a malformed latest */
    snprintf(p, sizeof(p), "%s/latest", root);
    fd = open(p, O_WRONLY | O_TRUNC);
    ck_assert_int_eq(write(fd, "garbage", 7), 7);
    close(fd);
    ck_assert_int_eq(zo_ckpt_open(&r, root, NULL), ZO_EFORMAT);
    char nm[64];
    ck_assert_int_eq(zo_ckpt_latest(root, nm, sizeof(nm)), ZO_EFORMAT);
    zo_test_rmtree(dir);
}
END_TEST

START_TEST(test_ckpt_prune_and_stale)
{
    char root[300], dir[256], p[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    for (uint64_t k = 1; k <= 5; k++)
        ck_assert_int_eq(save_k(root, k, 2), 0);
    int n = 0;
    DIR *d = opendir(root);
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && strcmp(de->d_name, "latest"))
            n++;
    closedir(d);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(check_ckpt(root, NULL), 5);
    ck_assert_int_eq(check_ckpt(root, "step-000004"), 4);
    /* leftovers of a writer of this host that died (pid 0x7ffffffe is
     * never alive) */
    snprintf(p, sizeof(p), "%s/.tmp-step-000009.%s.%d", root, zo__ckpt_host(), 0x7ffffffe);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    char f[500];
    snprintf(f, sizeof(f), "%s/tensors.bin", p);
    int fd = open(f, O_CREAT | O_WRONLY, 0600);
    close(fd);
    /* ... and of a live one (this process) stay */
    char live[400];
    snprintf(live, sizeof(live), "%s/.tmp-other.%s.%ld", root, zo__ckpt_host(), (long)getpid());
    ck_assert_int_eq(mkdir(live, 0700), 0);
    ck_assert_int_eq(save_k(root, 6, 2), 0);
    ck_assert_int_ne(access(p, F_OK), 0);
    ck_assert_int_eq(access(live, F_OK), 0);
    /* a root that is a symlink is refused */
    char link[400];
    snprintf(link, sizeof(link), "%s/ln", dir);
    ck_assert_int_eq(symlink(root, link), 0);
    zo_ckpt_writer *w;
    ck_assert_int_eq(zo_ckpt_begin(&w, link, "z", NULL), -ELOOP);
    zo_test_rmtree(dir);
}
END_TEST

/* A leftover name that is a symlink (planted, or left by anything but us) is
 * removed as a link: clean-up must never follow it and empty the directory
 * it points to. Same for the writer's own temporary name. */
START_TEST(test_ckpt_stale_symlink)
{
    char root[300], dir[256], victim[300], precious[400], p[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    ck_assert_int_eq(mkdir(victim, 0700), 0);
    snprintf(precious, sizeof(precious), "%s/precious", victim);
    int fd = open(precious, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "keep", 4), 4);
    close(fd);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    /* a "stale" temporary directory of a dead writer that is a symlink */
    snprintf(p, sizeof(p), "%s/.tmp-step-000009.%s.%d", root, zo__ckpt_host(), 0x7ffffffe);
    ck_assert_int_eq(symlink(victim, p), 0);
    ck_assert_int_eq(save_k(root, 2, 0), 0);
    ck_assert_msg(access(precious, F_OK) == 0, "clean-up followed a symlink and removed %s", precious);
    struct stat st;
    ck_assert_int_ne(lstat(p, &st), 0); /* the link itself is gone */
    /* the writer's own temporary name taken by a symlink */
    snprintf(p, sizeof(p), "%s/.tmp-step-000003.%s.%ld", root, zo__ckpt_host(), (long)getpid());
    ck_assert_int_eq(symlink(victim, p), 0);
    ck_assert_int_eq(save_k(root, 3, 0), 0);
    ck_assert_msg(access(precious, F_OK) == 0, "begin followed a symlink and removed %s", precious);
    ck_assert_int_eq(check_ckpt(root, NULL), 3);
    /* pruning a checkpoint whose name is a symlink drops the link only */
    char elsewhere[300], link[400];
    snprintf(elsewhere, sizeof(elsewhere), "%s/elsewhere", dir);
    snprintf(p, sizeof(p), "%s/step-000001", root);
    ck_assert_int_eq(rename(p, elsewhere), 0);
    snprintf(link, sizeof(link), "%s/step-000001", root);
    ck_assert_int_eq(symlink(elsewhere, link), 0);
    ck_assert_int_eq(save_k(root, 4, 1), 0);
    ck_assert_int_ne(lstat(link, &st), 0);
    snprintf(p, sizeof(p), "%s/manifest.json", elsewhere);
    ck_assert_msg(access(p, F_OK) == 0, "prune followed a symlink into %s", elsewhere);
    ck_assert_int_eq(check_ckpt(root, NULL), 4);
    zo_test_rmtree(dir);
}
END_TEST

/* A checkpoint written through a shared engine (zo_store_checkpoint passes
 * the swap store's) must not swallow the fire-and-forget error of another
 * user of that engine: zo_aio_wait_all() still reports it afterwards. */
static int check_one(const char *root)
{
    zo_ckpt_reader *r = NULL;
    int rc = zo_ckpt_open(&r, root, NULL);
    if (rc == 0)
        rc = zo_ckpt_verify(r);
    zo_ckpt_close(&r);
    return rc;
}

START_TEST(test_ckpt_shared_engine_errors)
{
    char root[300], dir[256], path[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    snprintf(path, sizeof(path), "%s/short.dat", dir);
    zo_aio *a = NULL;
    ck_assert_int_eq(zo_aio_create(&a, NULL), 0);
    zo_file *f = NULL;
    ck_assert_int_eq(zo_file_open(&f, path, ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_CREATE), 0);
    static uint8_t b[8192];
    /* another user's fire-and-forget read past the end of an empty file */
    ck_assert_int_eq(zo_aio_read(a, f, b, sizeof(b), 0, NULL, NULL, NULL), 0);
    for (;;) { /* let it complete without collecting its error */
        zo_aio_stats st;
        zo_aio_get_stats(a, &st);
        if (st.errors == 1 && st.inflight == 0)
            break;
        usleep(1000);
    }
    zo_ckpt_entry e = {.name = "t", .dtype = ZO_DTYPE_U8, .ndim = 1, .shape = {5000}, .bytes = 5000};
    const void *d[1] = {b};
    zo_ckpt_options o;
    zo_ckpt_options_default(&o);
    o.aio = a;
    ck_assert_int_eq(zo_ckpt_save(root, "one", &e, d, 1, &o), 0);
    /* the failed writer path too (abort) */
    zo_ckpt_writer *w = NULL;
    ck_assert_int_eq(zo_ckpt_begin(&w, root, "two", &o), 0);
    zo_ckpt_abort(&w);
    ck_assert_int_eq(zo_aio_wait_all(a), ZO_ETRUNC);
    ck_assert_int_eq(zo_aio_wait_all(a), 0);
    zo_file_close(&f);
    zo_aio_destroy(&a);
    ck_assert_int_eq(check_one(root), 0);
    zo_test_rmtree(dir);
}
END_TEST

/* Two writers of one name in one process share the temporary directory
 * name: the second must be refused, not delete the first one's data file
 * (the first commit then published its manifest over the second's data,
 * and `latest` named a checkpoint that cannot be loaded). */
START_TEST(test_ckpt_same_name_writers)
{
    char root[300], dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    static uint8_t b[70000];
    for (size_t i = 0; i < sizeof(b); i++)
        b[i] = (uint8_t)(i * 7 + 1);
    zo_ckpt_entry e = {.name = "t", .dtype = ZO_DTYPE_U8, .ndim = 1, .shape = {sizeof(b)}, .bytes = sizeof(b)};
    zo_ckpt_writer *w1 = NULL, *w2 = NULL;
    ck_assert_int_eq(zo_ckpt_begin(&w1, root, "x", NULL), 0);
    int rc = zo_ckpt_begin(&w2, root, "x", NULL);
    ck_assert_msg(rc == -EBUSY, "second writer of the same name: %d (%s)", rc, zo_last_error_detail());
    ck_assert_ptr_null(w2);
    ck_assert_int_eq(zo_ckpt_add(w1, &e, NULL), 0);
    ck_assert_int_eq(zo_ckpt_put(w1, 0, 0, b, sizeof(b)), 0);
    ck_assert_int_eq(zo_ckpt_commit(&w1), 0);
    zo_ckpt_reader *r = NULL;
    ck_assert_int_eq(zo_ckpt_open(&r, root, NULL), 0);
    ck_assert_str_eq(zo_ckpt_name(r), "x");
    ck_assert_int_eq(zo_ckpt_verify(r), 0);
    zo_ckpt_close(&r);
    /* once the first is done, the name is free again (here: it exists) */
    ck_assert_int_eq(zo_ckpt_begin(&w2, root, "x", NULL), -EEXIST);
    ck_assert_int_eq(zo_ckpt_begin(&w2, root, "y", NULL), 0);
    zo_ckpt_abort(&w2);
    zo_test_rmtree(dir);
}
END_TEST

/* Garbage in place of the small files: a FIFO as `latest` or as
 * manifest.json is an error at once, not a wait for a writer (SIGALRM
 * fails the test if it hangs). */
START_TEST(test_ckpt_fifo_files)
{
    char root[300], dir[256], p[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    alarm(20);
    snprintf(p, sizeof(p), "%s/step-000001/manifest.json", root);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    zo_ckpt_reader *r = NULL;
    ck_assert_int_lt(zo_ckpt_open(&r, root, "step-000001"), 0);
    ck_assert_ptr_null(r);
    snprintf(p, sizeof(p), "%s/latest", root);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    ck_assert_int_lt(zo_ckpt_open(&r, root, NULL), 0);
    char nm[64];
    ck_assert_int_lt(zo_ckpt_latest(root, nm, sizeof(nm)), 0);
    /* a new checkpoint still works (and replaces latest) */
    ck_assert_int_eq(save_k(root, 2, 0), 0);
    alarm(0);
    ck_assert_int_eq(check_ckpt(root, NULL), 2);
    zo_test_rmtree(dir);
}
END_TEST

/* Manifests that fail late in a tensor's parse (duplicate name, a non-hex
 * crc digit) are refused without leaking what was parsed of that tensor
 * (the sanitizer build's leak check catches it). */
START_TEST(test_ckpt_bad_tensor_no_leak)
{
    char root[300], dir[256], q[400];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    snprintf(q, sizeof(q), "%s/step-000001/manifest.json", root);
    zo_ckpt_reader *r = NULL;
    rewrite_file(q, "\"name\":\t\"layer0.exp_avg\"", "\"name\":\t\"layer0.w\"");
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000001"), ZO_EFORMAT);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "duplicate"));
    rewrite_file(q, "\"name\":\t\"layer0.w\"", "\"name\":\t\"layer0.exp_avg\"");
    rewrite_file(q, "\"name\":\t\"layer0.w\"", "\"name\":\t\"layer0.exp_avg\""); /* second one back */
    rewrite_file(q, "\"name\":\t\"layer0.exp_avg\"", "\"name\":\t\"layer0.w\""); /* first one back */
    ck_assert_int_eq(check_ckpt(root, "step-000001"), 1);
    /* a non-hex digit in the last tensor's crc32c */
    int fd = open(q, O_RDWR);
    char b[1 << 16];
    ssize_t n = read(fd, b, sizeof(b) - 1);
    ck_assert_int_gt(n, 0);
    b[n] = 0;
    char *last = NULL, *at = b;
    while ((at = strstr(at, "\"crc32c\":\t\"")))
        last = at++;
    ck_assert_ptr_nonnull(last);
    last[strlen("\"crc32c\":\t\"")] = 'z';
    ck_assert_int_eq(pwrite(fd, b, (size_t)n, 0), n);
    close(fd);
    ck_assert_int_eq(zo_ckpt_open(&r, root, "step-000001"), ZO_EFORMAT);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "non-hex"));
    ck_assert_ptr_null(r);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- commit failures: a failed commit publishes nothing -------------------------------- */
static const char *const step_names[ZO__CKPT_F_NSTEPS] = {
    "data fdatasync", "manifest", "tmpdir fsync", "rename", "root fsync", "latest write", "latest rename",
    "latest fsync", "undo latest", "undo rename"};

typedef struct fault_plan {
    int fail[ZO__CKPT_F_NSTEPS]; /* error to fail each step with (0: none) */
    int seen[ZO__CKPT_F_NSTEPS];
} fault_plan;

static int plan_hook(void *user, int step)
{
    fault_plan *fp = user;
    ck_assert(step >= 0 && step < ZO__CKPT_F_NSTEPS);
    fp->seen[step]++;
    return fp->fail[step];
}

static int exists(const char *root, const char *name)
{
    char p[600];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", root, name);
    return lstat(p, &st) == 0;
}

/* nothing left of a writer of this process: no temporary directory, no
 * .latest.*, no trash */
static void assert_no_leftovers(const char *root)
{
    DIR *d = opendir(root);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(strncmp(de->d_name, ".tmp-", 5) != 0 && strncmp(de->d_name, ".trash-", 7) != 0 &&
                          strncmp(de->d_name, ".latest.", 8) != 0,
                      "left behind: %s", de->d_name);
    closedir(d);
}

/* Each step of the commit fails in turn (with a checkpoint before it, and
 * as the root's first): the commit returns the step's error, `latest` and
 * the directory are as before (no step-000002, latest still names
 * step-000001 or still does not exist), and a retry of the same name
 * succeeds. Failures after the rename used to leave step-000002 in place
 * and the retry got -EEXIST. */
START_TEST(test_ckpt_commit_fault)
{
    int step = _i / 2, first = _i % 2;
    char root[300], dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    if (!first)
        ck_assert_int_eq(save_k(root, 1, 0), 0);
    fault_plan fp = {0};
    fp.fail[step] = -EIO;
    zo__ckpt_set_fault(plan_hook, &fp);
    int r = save_k(root, 2, 1);
    zo__ckpt_set_fault(NULL, NULL);
    ck_assert_int_eq(fp.seen[step], 1);
    ck_assert_msg(r == -EIO, "step %s: commit returned %d (%s)", step_names[step], r, zo_last_error_detail());
    ck_assert_msg(!exists(root, "step-000002"), "step %s: a failed commit published step-000002 (%s)",
                  step_names[step], zo_last_error_detail());
    if (first) {
        ck_assert_msg(!exists(root, "latest"), "step %s: latest appeared", step_names[step]);
    } else {
        ck_assert_int_eq(check_ckpt(root, NULL), 1);
    }
    assert_no_leftovers(root);
    /* the same name again */
    r = save_k(root, 2, 1);
    ck_assert_msg(r == 0, "step %s: retry: %s (%s)", step_names[step], zo_strerror(r), zo_last_error_detail());
    ck_assert_int_eq(check_ckpt(root, NULL), 2);
    ck_assert(!exists(root, "step-000001")); /* keep_last 1 pruned it */
    assert_no_leftovers(root);
    zo_test_rmtree(dir);
}
END_TEST

/* A second fault while taking a checkpoint back: the error is returned and
 * the detail says what stayed; latest always names a complete checkpoint. */
START_TEST(test_ckpt_commit_double_fault)
{
    char root[300], dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    /* the root fsync after the rename fails, and so does renaming it back:
     * step-000002 stays complete, latest does not name it */
    fault_plan fp = {0};
    fp.fail[ZO__CKPT_F_ROOT_SYNC] = -EIO;
    fp.fail[ZO__CKPT_F_UNDO_RENAME] = -EROFS;
    zo__ckpt_set_fault(plan_hook, &fp);
    ck_assert_int_eq(save_k(root, 2, 0), -EIO);
    zo__ckpt_set_fault(NULL, NULL);
    ck_assert_msg(strstr(zo_last_error_detail(), "latest does not name it"), "%s", zo_last_error_detail());
    ck_assert_int_eq(check_ckpt(root, NULL), 1);
    ck_assert_int_eq(check_ckpt(root, "step-000002"), 2);
    ck_assert_int_eq(save_k(root, 2, 0), -EEXIST);
    /* the last fsync fails and latest cannot be put back: step-000003 is
     * current (latest names it) and stays */
    memset(&fp, 0, sizeof(fp));
    fp.fail[ZO__CKPT_F_LATEST_SYNC] = -EIO;
    fp.fail[ZO__CKPT_F_UNDO_LATEST] = -EIO;
    zo__ckpt_set_fault(plan_hook, &fp);
    ck_assert_int_eq(save_k(root, 3, 0), -EIO);
    zo__ckpt_set_fault(NULL, NULL);
    ck_assert_msg(strstr(zo_last_error_detail(), "stays, current"), "%s", zo_last_error_detail());
    ck_assert_int_eq(check_ckpt(root, NULL), 3);
    /* latest put back, renaming back fails: latest names step-000003 again */
    memset(&fp, 0, sizeof(fp));
    fp.fail[ZO__CKPT_F_LATEST_SYNC] = -EIO;
    fp.fail[ZO__CKPT_F_UNDO_RENAME] = -EIO;
    zo__ckpt_set_fault(plan_hook, &fp);
    ck_assert_int_eq(save_k(root, 4, 0), -EIO);
    zo__ckpt_set_fault(NULL, NULL);
    ck_assert_int_eq(check_ckpt(root, NULL), 3);
    ck_assert_int_eq(check_ckpt(root, "step-000004"), 4);
    assert_no_leftovers(root);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- a root shared between machines ---------------------------------------------------- */
static void plant_dir(const char *root, const char *name, int with_lock)
{
    char p[600], f[700];
    snprintf(p, sizeof(p), "%s/%s", root, name);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(f, sizeof(f), "%s/tensors.bin", p);
    int fd = open(f, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "work", 4), 4);
    close(fd);
    if (with_lock) {
        snprintf(f, sizeof(f), "%s/.lock", p);
        fd = open(f, O_CREAT | O_WRONLY, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
}

/* Another host's checkpoint in progress lives under the same root: its
 * pid means nothing here (0x7ffffffe is never alive on this host), so
 * clean-up must leave every name of another host alone, with or without a
 * free lock. Before, any .tmp-/.trash-/.latest. name whose last field was a
 * pid dead here was removed. */
START_TEST(test_ckpt_shared_root_other_host)
{
    char root[300], dir[256], name[200];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    const char *other = strcmp(zo__ckpt_host(), "node7") ? "node7" : "node8";
    const int dead = 0x7ffffffe;
    char planted[4][200];
    snprintf(planted[0], sizeof(planted[0]), ".tmp-step-000050.%s.%d", other, dead);
    snprintf(planted[1], sizeof(planted[1]), ".tmp-step-000051.%s.%d", other, dead);
    snprintf(planted[2], sizeof(planted[2]), ".trash-step-000040.%s.%d", other, dead);
    snprintf(planted[3], sizeof(planted[3]), ".latest.%s.%d", other, dead);
    plant_dir(root, planted[0], 0);
    plant_dir(root, planted[1], 1); /* its lock free: a lock local to that host says nothing here */
    plant_dir(root, planted[2], 0);
    snprintf(name, sizeof(name), "%s/%s", root, planted[3]);
    int fd = open(name, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    /* the same names of this host are leftovers: removed */
    char mine[3][200];
    snprintf(mine[0], sizeof(mine[0]), ".tmp-step-000050.%s.%d", zo__ckpt_host(), dead);
    snprintf(mine[1], sizeof(mine[1]), ".trash-step-000040.%s.%d", zo__ckpt_host(), dead);
    snprintf(mine[2], sizeof(mine[2]), ".latest.%s.%d", zo__ckpt_host(), dead);
    plant_dir(root, mine[0], 0);
    plant_dir(root, mine[1], 0);
    snprintf(name, sizeof(name), "%s/%s", root, mine[2]);
    fd = open(name, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(save_k(root, 2, 0), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(exists(root, planted[i]), "clean-up removed another host's %s", planted[i]);
    char f[700];
    snprintf(f, sizeof(f), "%s/%s/tensors.bin", root, planted[0]);
    ck_assert_int_eq(access(f, F_OK), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(!exists(root, mine[i]), "this host's leftover %s stayed", mine[i]);
    ck_assert_int_eq(check_ckpt(root, NULL), 2);
    zo_test_rmtree(dir);
}
END_TEST

/* On this host the lock decides, not the pid: a temporary directory whose
 * .lock is held stays even though its pid is not alive here (a writer in
 * another pid namespace with this host name); once the lock is free it is
 * removed. A writer killed in the middle leaves its lock free. */
START_TEST(test_ckpt_lock_liveness)
{
    char root[300], dir[256], name[200], lk[700];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    ck_assert_int_eq(save_k(root, 1, 0), 0);
    snprintf(name, sizeof(name), ".tmp-step-000060.%s.%d", zo__ckpt_host(), 0x7ffffffe);
    plant_dir(root, name, 1);
    snprintf(lk, sizeof(lk), "%s/%s/.lock", root, name);
    int fd = open(lk, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(flock(fd, LOCK_EX), 0);
    ck_assert_int_eq(save_k(root, 2, 0), 0);
    ck_assert_msg(exists(root, name), "a locked temporary directory was removed");
    close(fd); /* its writer is gone */
    ck_assert_int_eq(save_k(root, 3, 0), 0);
    ck_assert_msg(!exists(root, name), "an abandoned temporary directory stayed");
    /* a real writer, killed with its data half written: its .lock is
     * there, locked while it lives */
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        zo_ckpt_writer *w;
        static uint8_t b[65536];
        zo_ckpt_entry e = {.name = "t", .dtype = ZO_DTYPE_U8, .ndim = 1, .shape = {2 * sizeof(b)},
                           .bytes = 2 * sizeof(b)};
        zo_ckpt_options o;
        zo_ckpt_options_default(&o);
        o.chunk_size = sizeof(b);
        if (zo_ckpt_begin(&w, root, "killed", &o) || zo_ckpt_add(w, &e, NULL) || zo_ckpt_put(w, 0, 0, b, sizeof(b)))
            _exit(3);
        if (write(pfd[1], "r", 1) != 1) /* no Check calls in the child: the parent judges */
            _exit(4);
        pause();
        _exit(0);
    }
    char c;
    ck_assert_int_eq(read(pfd[0], &c, 1), 1);
    snprintf(name, sizeof(name), ".tmp-killed.%s.%ld", zo__ckpt_host(), (long)pid);
    snprintf(lk, sizeof(lk), "%s/%s/.lock", root, name);
    fd = open(lk, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_ne(flock(fd, LOCK_EX | LOCK_NB), 0); /* the live writer holds it */
    close(fd);
    ck_assert_int_eq(save_k(root, 4, 0), 0);
    ck_assert_msg(exists(root, name), "a live writer's directory was removed");
    kill(pid, SIGKILL);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    ck_assert_int_eq(save_k(root, 5, 0), 0);
    ck_assert_msg(!exists(root, name), "a killed writer's directory stayed");
    close(pfd[0]);
    close(pfd[1]);
    assert_no_leftovers(root);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- the crash test ------------------------------------------------------------ */
#define ZO_MIN_U64(a, b) ((a) < (b) ? (a) : (b))

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

START_TEST(test_ckpt_crash)
{
    char root[300], dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    /* how long one checkpoint takes here: the faster of two (a stall of
     * the shared machine in one must not stretch every kill's delay) */
    uint64_t t0 = now_us();
    ck_assert_int_eq(save_k(root, 1, 2), 0);
    uint64_t t1 = now_us();
    ck_assert_int_eq(save_k(root, 2, 2), 0);
    uint64_t per = ZO_MIN_U64(t1 - t0, now_us() - t1);
    long long last = check_ckpt(root, NULL);
    ck_assert_int_eq(last, 2);
    zo_test_rng rng = {zo_test_seed() ^ 0xc4a5};
    /* 60 kills, more (up to 240) until kills landed both before and after
     * a publish often enough: on a loaded machine one checkpoint can take
     * many times what the calibration above measured */
    enum { KILLS = 60, MAX_KILLS = 240 };
    int advanced = 0, same = 0, kills = 0;
    for (int kill_no = 0; kill_no < KILLS || (kill_no < MAX_KILLS && (advanced <= 5 || same <= 5)); kill_no++) {
        kills++;
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            zo_log_set_level(ZO_LOG_OFF);
            /* a name may exist already: a killed writer published it but
             * died before moving `latest` to it */
            for (uint64_t k = (uint64_t)last + 1;; k++) {
                int r = save_k(root, k, 2);
                if (r != 0 && r != -EEXIST) {
                    fprintf(stderr, "child: checkpoint %llu: %s (%s)\n", (unsigned long long)k, zo_strerror(r),
                            zo_last_error_detail());
                    _exit(3);
                }
            }
        }
        /* somewhere in the first one to three checkpoints of the child */
        uint64_t delay = zo_test_next(&rng) % (3 * per + 1);
        struct timespec ts = {(time_t)(delay / 1000000u), (long)(delay % 1000000u) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child ended by itself (status 0x%x)", st);
        /* latest: complete, and the previous or a newer one */
        long long k = check_ckpt(root, NULL);
        ck_assert_msg(k >= last, "latest went back from %lld to %lld", last, k);
        if (k > last)
            advanced++;
        else
            same++;
        /* every checkpoint visible under its own name is complete */
        DIR *d = opendir(root);
        struct dirent *de;
        int visible = 0;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.' || !strcmp(de->d_name, "latest"))
                continue;
            check_ckpt(root, de->d_name);
            visible++;
        }
        closedir(d);
        ck_assert_int_ge(visible, 1);
        last = k;
    }
    fprintf(stderr, "crash test: %d kills, latest advanced %d times, stayed %d times (one checkpoint: %.1f ms)\n",
            kills, advanced, same, (double)per / 1000.0);
    ck_assert_int_gt(advanced, 5);
    ck_assert_int_gt(same, 5);
    /* the next writer cleans up what the killed ones left */
    uint64_t next = (uint64_t)last + 1;
    int r;
    while ((r = save_k(root, next, 2)) == -EEXIST)
        next++;
    ck_assert_int_eq(r, 0);
    DIR *d = opendir(root);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(strncmp(de->d_name, ".tmp-", 5) != 0 && strncmp(de->d_name, ".trash-", 7) != 0 &&
                          strncmp(de->d_name, ".latest.", 8) != 0,
                      "left behind: %s", de->d_name);
    closedir(d);
    ck_assert_int_eq(check_ckpt(root, NULL), (long long)next);
    zo_test_rmtree(dir);
}
END_TEST

int main(void)
{
    zo_log_set_level(ZO_LOG_ERROR);
    if (!(zo_build_features() & ZO_BUILD_CJSON))
        ZO_TEST_SKIP("built without libcjson: no checkpoints");
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("ckpt");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_ckpt_roundtrip);
    tcase_add_test(tc, test_ckpt_validation);
    tcase_add_test(tc, test_ckpt_verify_big_chunk);
    tcase_add_test(tc, test_ckpt_prune_and_stale);
    tcase_add_test(tc, test_ckpt_stale_symlink);
    tcase_add_test(tc, test_ckpt_shared_engine_errors);
    tcase_add_test(tc, test_ckpt_same_name_writers);
    tcase_add_test(tc, test_ckpt_fifo_files);
    tcase_add_test(tc, test_ckpt_bad_tensor_no_leak);
    tcase_add_loop_test(tc, test_ckpt_commit_fault, 0, 2 * (ZO__CKPT_F_LATEST_SYNC + 1));
    tcase_add_test(tc, test_ckpt_commit_double_fault);
    tcase_add_test(tc, test_ckpt_shared_root_other_host);
    tcase_add_test(tc, test_ckpt_lock_liveness);
    tcase_add_test(tc, test_ckpt_crash);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
