/* SPDX-License-Identifier: Apache-2.0 */
/* aio under a memlock limit too small to register buffers: meson runs this
 * program under `prlimit --memlock=65536:65536`. Root ignores
 * RLIMIT_MEMLOCK while it holds CAP_IPC_LOCK, so the program drops that
 * capability first (and sets the limit itself when run directly). The
 * engine must still work (unregistered I/O), and say so: the `registered`
 * out-parameter, a warning (once), the statistics and the detail message. */
#include <fcntl.h>

#include "zo_test.h"

#include <zoffload/zoffload.h>

#define LIMIT 65536

static zo_aio_backend g_backend;

typedef struct {
    int warns;
    char last[512];
} warn_capture;

static void on_log(void *user, zo_log_level level, const char *module, const char *msg)
{
    warn_capture *w = user;
    if (level == ZO_LOG_WARN && !strcmp(module, "aio")) {
        w->warns++;
        snprintf(w->last, sizeof(w->last), "%s", msg);
    }
}

START_TEST(test_register_under_memlock)
{
    ck_assert_int_eq(zo_test_limit_memlock(LIMIT), 0);
    warn_capture w = {0};
    zo_log_set_level(ZO_LOG_WARN);
    zo_log_set_callback(on_log, &w);

    zo_aio_config cfg;
    zo_aio_config_default(&cfg);
    cfg.backend = g_backend;
    cfg.threads = 2;
    zo_aio *a = NULL;
    ck_assert_int_eq(zo_aio_create(&a, &cfg), 0);

    size_t n = 8u << 20;
    void *pool = NULL;
    ck_assert_int_eq(zo_pinned_alloc(&pool, n, NULL), 0); /* falls back to pageable */
    int registered = -1;
    ck_assert_int_eq(zo_aio_register_region(a, pool, n, &registered), 0);
    ck_assert_int_eq(registered, 0);
    zo_aio_stats st;
    zo_aio_get_stats(a, &st);
    ck_assert_uint_eq(st.regions, 1);
    if (g_backend == ZO_AIO_URING) {
        ck_assert_uint_eq(st.regions_fallback, 1);
        ck_assert_int_eq(w.warns, 1);
        ck_assert_ptr_nonnull(strstr(w.last, "RLIMIT_MEMLOCK"));
        ck_assert_ptr_nonnull(strstr(zo_aio_errmsg(a), "unregistered I/O"));
        /* a second region: counted, logged below warning level */
        void *pool2 = NULL;
        ck_assert_int_eq(zo_aligned_alloc(&pool2, 1u << 20, 4096), 0);
        ck_assert_int_eq(zo_aio_register_region(a, pool2, 1u << 20, &registered), 0);
        ck_assert_int_eq(registered, 0);
        zo_aio_get_stats(a, &st);
        ck_assert_uint_eq(st.regions_fallback, 2);
        ck_assert_int_eq(w.warns, 1);
        ck_assert_int_eq(zo_aio_unregister_region(a, pool2), 0);
        zo_aligned_free(pool2);
    }

    /* the engine still works, exactly, inside the region */
    char dir[256], path[300];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/memlock.dat", dir);
    zo_file *f = NULL;
    ck_assert_int_eq(zo_file_open(&f, path, ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_CREATE), 0);
    zo_test_rng rng = {zo_test_seed()};
    uint8_t *p = pool;
    zo_test_fill_bytes(&rng, p, n / 2);
    zo_aio_req *r;
    ck_assert_int_eq(zo_aio_write(a, f, p, n / 2, 4096, NULL, NULL, &r), 0);
    ck_assert_int_eq(zo_aio_wait(a, r, NULL), 0);
    ck_assert_int_eq(zo_aio_read(a, f, p + n / 2, n / 2, 4096, NULL, NULL, &r), 0);
    ck_assert_int_eq(zo_aio_wait(a, r, NULL), 0);
    ck_assert_int_eq(memcmp(p, p + n / 2, n / 2), 0);
    zo_aio_get_stats(a, &st);
    ck_assert_uint_eq(st.fixed_chunks, 0);
    ck_assert_uint_gt(st.chunks, 0);
    ck_assert_int_eq(zo_aio_unregister_region(a, pool), 0);
    zo_aio_destroy(&a);
    zo_file_close(&f);
    zo_pinned_free(pool);
    zo_test_rmtree(dir);
    zo_log_set_callback(NULL, NULL);
}
END_TEST

int main(int argc, char **argv)
{
    const char *be = argc > 1 ? argv[1] : "uring";
    g_backend = !strcmp(be, "threads") ? ZO_AIO_THREADS : ZO_AIO_URING;
    if (g_backend == ZO_AIO_URING) {
        zo_aio_config cfg;
        zo_aio_config_default(&cfg);
        cfg.backend = ZO_AIO_URING;
        zo_aio *a = NULL;
        if (zo_aio_create(&a, &cfg) != 0)
            ZO_TEST_SKIP("io_uring unusable here: %s", zo_last_error_detail());
        zo_aio_destroy(&a);
    }
    Suite *s = suite_create("aio-memlock");
    TCase *tc = tcase_create("memlock");
    tcase_add_test(tc, test_register_under_memlock);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
