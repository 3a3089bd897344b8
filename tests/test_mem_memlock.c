/* SPDX-License-Identifier: Apache-2.0 */
/* Pinned memory when the OS refuses to lock: meson runs this program under
 * `prlimit --memlock=65536:65536`; it also drops CAP_IPC_LOCK (root ignores
 * RLIMIT_MEMLOCK otherwise) and sets the limit itself when run directly.
 * Allocations over the limit must still succeed as pageable memory, say so
 * once in the log and in the statistics, and lose nothing. */
#include "zo_test.h"

#include <zoffload/zoffload.h>

#define LIMIT 65536

typedef struct {
    int warns;
    char last[512];
} warn_capture;

static void on_log(void *user, zo_log_level level, const char *module, const char *msg)
{
    warn_capture *w = user;
    if (level == ZO_LOG_WARN) {
        w->warns++;
        snprintf(w->last, sizeof(w->last), "%s", msg);
    }
}

START_TEST(test_fallback_under_memlock)
{
    ck_assert_int_eq(zo_test_limit_memlock(LIMIT), 0);
    warn_capture w = {0};
    zo_log_set_level(ZO_LOG_WARN);
    zo_log_set_callback(on_log, &w);

    zo_pinned_stats st;
    zo_pinned_stats_get(&st);
    ck_assert_uint_eq(st.memlock_limit, LIMIT);
    ck_assert_int_eq(st.can_lock_unlimited, 0);

    /* small: fits under the limit, gets locked */
    void *small;
    ck_assert_int_eq(zo_pinned_alloc(&small, 16384, NULL), 0);
    zo_pinned_info info;
    ck_assert_int_eq(zo_pinned_query(small, &info), 0);
    ck_assert(info.flags & ZO_PIN_LOCKED);

    /* large: refused by the OS, still usable memory */
    void *big[2];
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(zo_pinned_alloc(&big[i], 4u << 20, NULL), 0);
        ck_assert_int_eq(zo_pinned_query(big[i], &info), 0);
        ck_assert(!(info.flags & ZO_PIN_LOCKED));
        memset(big[i], 0x33 + i, 4u << 20);
    }
    ck_assert_uint_eq(((uint8_t *)big[0])[(4u << 20) - 1], 0x33);
    ck_assert_uint_eq(((uint8_t *)big[1])[0], 0x34);
    zo_pinned_stats_get(&st);
    ck_assert_uint_eq(st.fallbacks, 2);
    ck_assert_uint_ge(st.unlocked_bytes, 8u << 20);
    ck_assert_uint_le(st.locked_bytes, LIMIT);
    ck_assert_ptr_nonnull(strstr(st.last_fallback, "RLIMIT_MEMLOCK"));
    /* one warning for the cause, not one per allocation */
    ck_assert_int_eq(w.warns, 1);
    ck_assert_ptr_nonnull(strstr(w.last, "mlock"));

    /* strict callers get the OS error */
    zo_pin_opts o;
    zo_pin_opts_default(&o);
    o.flags |= ZO_PIN_REQUIRE;
    void *strict = (void *)1;
    int r = zo_pinned_alloc(&strict, 4u << 20, &o);
    ck_assert_msg(r == -EPERM || r == -ENOMEM || r == -EAGAIN, "got %d (%s)", r, zo_strerror(r));
    ck_assert_ptr_null(strict);

    zo_pinned_free(small);
    zo_pinned_free(big[0]);
    zo_pinned_free(big[1]);
    zo_pinned_stats_get(&st);
    ck_assert_uint_eq(st.locked_bytes, 0);
    ck_assert_uint_eq(st.unlocked_bytes, 0);
    zo_log_set_callback(NULL, NULL);
}
END_TEST

/* A store whose host tier must be locked (ZO_PIN_REQUIRE) under a limit too
 * small: the detail names the store's step once and keeps the cause from
 * zo_pinned_alloc. It used to format zo_last_error_detail() into itself:
 * "store: cannot allocate ... for the host tier: store: cannot allocate ...
 * for the host tier: store: ...", the cause lost. */
START_TEST(test_store_require_detail)
{
    ck_assert_int_eq(zo_test_limit_memlock(LIMIT), 0);
    zo_store_config c;
    zo_store_config_default(&c);
    c.host_bytes = 4u << 20;
    c.slots = 0;
    c.pin_flags |= ZO_PIN_REQUIRE;
    zo_store *s = (zo_store *)1;
    int r = zo_store_create(&s, &c);
    ck_assert_msg(r == -EPERM || r == -ENOMEM || r == -EAGAIN, "got %d (%s)", r, zo_strerror(r));
    ck_assert_ptr_null(s);
    const char *d = zo_last_error_detail();
    const char *first = strstr(d, "store: cannot allocate");
    ck_assert_msg(first != NULL, "detail: %s", d);
    ck_assert_msg(strstr(first + 1, "store: cannot allocate") == NULL, "prefix repeated: %s", d);
    ck_assert_msg(strstr(d, "zo_pinned_alloc:") && strstr(d, "ZO_PIN_REQUIRE"), "cause lost: %s", d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mem-memlock");
    TCase *tc = tcase_create("memlock");
    tcase_add_test(tc, test_fallback_under_memlock);
    tcase_add_test(tc, test_store_require_detail);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
