/* SPDX-License-Identifier: Apache-2.0 */
/* Platform core: error codes, logging, dtypes, sizes, CPU features and mask,
 * and the vec kernels, every variant against the C reference (checkasm
 * style). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "zo_test.h"

#include "core/internal.h"
#include "core/dispatch.h"
#include "core/list.h"
#include "core/vec_ref.h"
#include "store/store_internal.h"

#include <zoffload/zoffload.h>

/* ---- errors ---------------------------------------------------------------- */
/* The shared intrusive list and queue: order, O(1) unlink from the middle,
 * self-linked after delete, splice keeps order and counts. */
typedef struct item {
    int v;
    zo_list link;
    zo_qnode q;
} item;

START_TEST(test_list_and_queue)
{
    item it[6];
    zo_list head = ZO_LIST_INIT(head);
    ck_assert(zo_list_empty(&head));
    ck_assert_ptr_null(zo_list_first(&head));
    for (int i = 0; i < 6; i++) {
        it[i].v = i;
        zo_list_init(&it[i].link);
        ck_assert(!zo_list_linked(&it[i].link));
        zo_list_add_tail(&head, &it[i].link);
    }
    zo_list_del(&it[2].link);
    zo_list_del(&it[2].link); /* second delete of an unlinked node: harmless */
    ck_assert(!zo_list_linked(&it[2].link));
    zo_list_move_tail(&head, &it[0].link); /* LRU touch */
    zo_list_add_head(&head, &it[2].link);
    const int want[] = {2, 1, 3, 4, 5, 0};
    int k = 0;
    zo_list *pos, *tmp;
    zo_list_for_each(pos, &head) {
        ck_assert_int_lt(k, 6);
        ck_assert_int_eq(zo_list_entry(pos, item, link)->v, want[k++]);
    }
    ck_assert_int_eq(k, 6);
    zo_list_for_each_safe(pos, tmp, &head) {
        if (zo_list_entry(pos, item, link)->v % 2)
            zo_list_del(pos);
    }
    ck_assert_int_eq(zo_list_entry(zo_list_pop_head(&head), item, link)->v, 2);
    ck_assert_int_eq(zo_list_entry(zo_list_pop_head(&head), item, link)->v, 4);
    ck_assert_int_eq(zo_list_entry(zo_list_pop_head(&head), item, link)->v, 0);
    ck_assert_ptr_null(zo_list_pop_head(&head));
    ck_assert(zo_list_empty(&head));

    zo_queue a, b;
    zo_queue_init(&a);
    zo_queue_init(&b);
    ck_assert_ptr_null(zo_queue_pop(&a));
    for (int i = 0; i < 3; i++)
        zo_queue_push(&a, &it[i].q);
    for (int i = 3; i < 6; i++)
        zo_queue_push(&b, &it[i].q);
    zo_queue_splice(&a, &b);
    ck_assert(zo_queue_empty(&b));
    ck_assert_uint_eq(a.len, 6);
    ck_assert_int_eq(zo_queue_entry(zo_queue_peek(&a), item, q)->v, 0);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(zo_queue_entry(zo_queue_pop(&a), item, q)->v, i);
    ck_assert(zo_queue_empty(&a));
    ck_assert_uint_eq(a.len, 0);
    zo_queue_push(&a, &it[1].q); /* usable again after draining: tail reset */
    ck_assert_int_eq(zo_queue_entry(zo_queue_pop(&a), item, q)->v, 1);
}
END_TEST

/* ---- per-handle error messages under concurrent writers ---------------- */
/* Writers record failures on one handle from several threads while a reader
 * copies the message out: every copy must be one writer's message, whole.
 * Each writer's message is a run of one letter, so a torn copy (bytes of
 * two messages) shows as a run of two letters or a wrong length. Before
 * zo_errbuf had its lock, the store's and swap store's messages were plain
 * memcpy'd by zo__fail and read in place by the *_errmsg getters. */
enum { EB_WRITERS = 3, EB_RUN = 200 };

typedef struct eb_ctx {
    zo_errbuf *eb;     /* generic: ZO_FAIL into it */
    zo_store *store;   /* or: fail zo_store_register with a bad dtype */
    zo_swap *swap;     /* or: fail zo_swap_free with an unknown handle */
    int id;
    _Atomic int *stop;
} eb_ctx;

static void *eb_writer(void *arg)
{
    eb_ctx *c = arg;
    char run[EB_RUN + 1];
    memset(run, 'a' + c->id, EB_RUN);
    run[EB_RUN] = '\0';
    while (!atomic_load(c->stop)) {
        if (c->eb) {
            ZO_FAIL(c->eb, -EIO, "<%s>", run);
        } else if (c->store) {
            zo_tensor_desc d;
            zo_tensor_desc_default(&d);
            d.name = run;
            d.bytes = 4;
            d.dtype = (zo_dtype)99;
            zo_tensor *t;
            ck_assert_int_eq(zo_store_register(c->store, &d, &t), -EINVAL);
        } else {
            uint64_t id = 0x1111111111111111ull * (uint64_t)(c->id + 1);
            ck_assert_int_eq(zo_swap_free(c->swap, id), -ENOENT);
        }
    }
    return NULL;
}

/* Is msg one writer's whole message? The varying part starts at `open` and
 * is `len` copies of one character, followed by `tail`. */
static int eb_whole(const char *msg, const char *head, size_t len, const char *tail)
{
    size_t h = strlen(head);
    if (strncmp(msg, head, h) != 0)
        return 0;
    const char *p = msg + h;
    for (size_t i = 0; i < len; i++)
        if (p[i] != p[0])
            return 0;
    return strcmp(p + len, tail) == 0;
}

static void eb_hammer(eb_ctx proto, const char *(*read)(eb_ctx *), const char *head, size_t len, const char *tail)
{
    _Atomic int stop = 0;
    eb_ctx ctx[EB_WRITERS];
    pthread_t th[EB_WRITERS];
    for (int i = 0; i < EB_WRITERS; i++) {
        ctx[i] = proto;
        ctx[i].id = i;
        ctx[i].stop = &stop;
        ck_assert_int_eq(pthread_create(&th[i], NULL, eb_writer, &ctx[i]), 0);
    }
    int seen = 0;
    for (int i = 0; i < 200000; i++) {
        char copy[ZO_ERRMSG_LEN];
        snprintf(copy, sizeof(copy), "%s", read(&proto));
        if (!copy[0])
            continue; /* no failure recorded yet */
        seen++;
        if (!eb_whole(copy, head, len, tail)) {
            atomic_store(&stop, 1);
            for (int k = 0; k < EB_WRITERS; k++)
                pthread_join(th[k], NULL);
            ck_abort_msg("torn message after %d good reads: %s", seen, copy);
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < EB_WRITERS; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_gt(seen, 0);
}

/* Deterministic half: while the test holds an errbuf's lock, a thread that
 * records a failure in it (or reads it through a getter) must wait. */
typedef struct eb_blocked {
    eb_ctx c;
    int read; /* 1: call the getter instead of failing */
    _Atomic int done;
} eb_blocked;

static void *eb_blocked_thread(void *arg)
{
    eb_blocked *b = arg;
    if (b->read) {
        (void)zo_store_errmsg(b->c.store);
    } else {
        if (b->c.eb)
            ZO_FAIL(b->c.eb, -EIO, "blocked writer");
        else {
            zo_tensor_desc d;
            zo_tensor_desc_default(&d);
            d.name = "blocked";
            d.bytes = 4;
            d.dtype = (zo_dtype)99;
            zo_tensor *t;
            (void)zo_store_register(b->c.store, &d, &t);
        }
    }
    atomic_store(&b->done, 1);
    return NULL;
}

static void eb_must_wait(zo_errbuf *lockword, eb_blocked *b)
{
    pthread_t th;
    atomic_store(&lockword->busy, 1);
    ck_assert_int_eq(pthread_create(&th, NULL, eb_blocked_thread, b), 0);
    usleep(100000);
    int early = atomic_load(&b->done);
    atomic_store(&lockword->busy, 0);
    pthread_join(th, NULL);
    ck_assert_msg(!early, "the message was %s without its lock", b->read ? "read" : "written");
    ck_assert(atomic_load(&b->done));
}

static const char *read_eb(eb_ctx *c)
{
    static _Thread_local char out[ZO_ERRMSG_LEN];
    return zo__errbuf_get(c->eb, out, sizeof(out));
}
static const char *read_store(eb_ctx *c) { return zo_store_errmsg(c->store); }
static const char *read_swap(eb_ctx *c) { return zo_swap_errmsg(c->swap); }

START_TEST(test_errbuf_threads)
{
    zo_errbuf eb = {{0}};
    eb_hammer((eb_ctx){.eb = &eb}, read_eb, "<", EB_RUN, ">");
    eb_blocked b = {.c = {.eb = &eb}};
    eb_must_wait(&eb, &b);
    ck_assert_str_eq(read_eb(&b.c), "blocked writer");
    /* a detail re-raised from the buffer it lands in (formatted privately) */
    ZO_FAIL(&eb, -EIO, "cause");
    char again[ZO_ERRMSG_LEN];
    ZO_FAIL(&eb, -EIO, "outer: %s", zo__errbuf_get(&eb, again, sizeof(again)));
    ck_assert_str_eq(zo__errbuf_get(&eb, again, sizeof(again)), "outer: cause");
    ZO_FAIL(NULL, -EIO, "outer2: %s", zo_last_error_detail());
    ck_assert_str_eq(zo_last_error_detail(), "outer2: outer: cause");
}
END_TEST

START_TEST(test_errbuf_store_swap_threads)
{
    zo_store_config sc;
    zo_store_config_default(&sc);
    sc.host_bytes = 1u << 20;
    sc.slots = 0;
    sc.pin_flags = ZO_PIN_NO_LOCK;
    zo_store *s;
    ck_assert_int_eq(zo_store_create(&s, &sc), 0);
    eb_hammer((eb_ctx){.store = s}, read_store, "zo_store_register: '", EB_RUN, "': invalid dtype or ndim 0");
    eb_blocked b = {.c = {.store = s}};
    eb_must_wait(&s->err, &b);
    ck_assert_str_eq(zo_store_errmsg(s), "zo_store_register: 'blocked': invalid dtype or ndim 0");
    eb_blocked rb = {.c = {.store = s}, .read = 1};
    eb_must_wait(&s->err, &rb);
    zo_store_destroy(&s);

    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    const char *dirs[1] = {dir};
    zo_swap_config wc;
    zo_swap_config_default(&wc);
    wc.dirs = dirs;
    wc.ndirs = 1;
    zo_swap *w;
    ck_assert_int_eq(zo_swap_create(&w, &wc), 0);
    eb_hammer((eb_ctx){.swap = w}, read_swap, "zo_swap_free: unknown handle 0x", 16, "");
    zo_swap_destroy(&w);
    zo_test_rmtree(dir);
}
END_TEST

/* The one struct_size rule: older versions get our defaults for fields they
 * do not know, and nothing past their struct is read; sizes outside
 * [first version, ours] are -EINVAL naming the function. */
typedef struct vs {
    size_t struct_size;
    int a;
    int b; /* added in "version 2" */
} vs;

START_TEST(test_struct_in)
{
    const vs dflt = {sizeof(vs), 1, 2};
    vs dst = dflt, src = {offsetof(vs, b), 10, 20};
    ck_assert_int_eq(ZO_STRUCT_IN(&dst, &src, offsetof(vs, b), NULL, "f"), 0);
    ck_assert_uint_eq(dst.struct_size, sizeof(vs));
    ck_assert_int_eq(dst.a, 10);
    ck_assert_int_eq(dst.b, 2); /* beyond the caller's struct: default kept */
    src.struct_size = sizeof(vs);
    dst = dflt;
    ck_assert_int_eq(ZO_STRUCT_IN(&dst, &src, offsetof(vs, b), NULL, "f"), 0);
    ck_assert_int_eq(dst.b, 20);
    zo_errbuf eb = {{0}};
    src.struct_size = 3;
    ck_assert_int_eq(ZO_STRUCT_IN(&dst, &src, offsetof(vs, b), &eb, "zo_thing_create"), -EINVAL);
    ck_assert_ptr_nonnull(strstr(eb.msg, "zo_thing_create"));
    src.struct_size = sizeof(vs) + 8;
    ck_assert_int_eq(ZO_STRUCT_IN(&dst, &src, offsetof(vs, b), NULL, "f"), -EINVAL);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "struct_size"));
}
END_TEST

START_TEST(test_strerror)
{
    ck_assert_str_eq(zo_strerror(ZO_PENDING), "pending (not finished yet)");
    ck_assert_str_eq(zo_strerror(0), "success");
    ck_assert_str_eq(zo_strerror(-ENOENT), "No such file or directory");
    ck_assert_ptr_nonnull(strstr(zo_strerror(ZO_ECORRUPT), "checksum"));
    for (int e = ZO_ERR_LAST; e <= ZO_ERR_BASE; e++) {
        const char *s = zo_strerror(e);
        ck_assert_ptr_nonnull(s);
        ck_assert_ptr_null(strstr(s, "unknown"));
    }
    ck_assert_ptr_nonnull(strstr(zo_strerror(-99999), "unknown"));
    ck_assert_ptr_nonnull(strstr(zo_strerror(12345), "unknown"));
    /* library codes never collide with errno */
    ck_assert_int_lt(ZO_ERR_BASE, -4095);
}
END_TEST

START_TEST(test_detail_thread_local)
{
    void *p;
    ck_assert_int_eq(zo_aligned_alloc(&p, 0, 64), -EINVAL);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "size 0"));
    ck_assert_int_eq(zo_aligned_alloc(&p, 64, 3), -EINVAL);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "alignment 3"));
}
END_TEST

/* ---- logging ------------------------------------------------------------------ */
typedef struct {
    int calls;
    zo_log_level last_level;
    char last[256];
} log_capture;

static void capture(void *user, zo_log_level level, const char *module, const char *msg)
{
    log_capture *c = user;
    c->calls++;
    c->last_level = level;
    snprintf(c->last, sizeof(c->last), "%s: %s", module, msg);
}

START_TEST(test_log_callback_and_level)
{
    log_capture c = {0};
    zo_log_level old = zo_log_get_level();
    zo_log_set_callback(capture, &c);
    zo_log_set_level(ZO_LOG_WARN);
    zo__log(ZO_LOG_WARN, "test", "hello %d", 42);
    ck_assert_int_eq(c.calls, 1);
    ck_assert_str_eq(c.last, "test: hello 42");
    ck_assert_int_eq(c.last_level, ZO_LOG_WARN);
    /* below the level: not delivered */
    ZO_LOG_AT(ZO_LOG_DEBUG, "invisible");
    ck_assert_int_eq(c.calls, 1);
    zo_log_set_level(ZO_LOG_DEBUG);
    ZO_LOG_AT(ZO_LOG_DEBUG, "visible");
    ck_assert_int_eq(c.calls, 2);
    /* a failing call logs its detail at debug level */
    void *p;
    zo_aligned_alloc(&p, 0, 64);
    ck_assert_int_eq(c.calls, 3);
    ck_assert_ptr_nonnull(strstr(c.last, "size 0"));
    zo_log_set_level(ZO_LOG_OFF);
    ZO_LOGE("nothing at off");
    ck_assert_int_eq(c.calls, 3);
    zo_log_set_callback(NULL, NULL);
    zo_log_set_level(old);
}
END_TEST

START_TEST(test_log_parse)
{
    zo_log_level l;
    ck_assert_int_eq(zo_log_parse_level("debug", &l), 0);
    ck_assert_int_eq(l, ZO_LOG_DEBUG);
    ck_assert_int_eq(zo_log_parse_level("WARNING", &l), 0);
    ck_assert_int_eq(l, ZO_LOG_WARN);
    ck_assert_int_eq(zo_log_parse_level("0", &l), 0);
    ck_assert_int_eq(l, ZO_LOG_OFF);
    ck_assert_int_eq(zo_log_parse_level("verbose", &l), -EINVAL);
    ck_assert_int_eq(zo_log_parse_level("6", &l), -EINVAL);
    ck_assert_int_eq(zo_log_parse_level(NULL, &l), -EINVAL);
}
END_TEST

/* ---- dtypes, sizes, version -------------------------------------------------- */
START_TEST(test_dtype)
{
    zo_dtype t;
    ck_assert_uint_eq(zo_dtype_size(ZO_DTYPE_F32), 4);
    ck_assert_uint_eq(zo_dtype_size(ZO_DTYPE_BF16), 2);
    ck_assert_uint_eq(zo_dtype_size((zo_dtype)99), 0);
    ck_assert_str_eq(zo_dtype_name((zo_dtype)-1), "?");
    ck_assert_int_eq(zo_dtype_parse("bfloat16", &t), 0);
    ck_assert_int_eq(t, ZO_DTYPE_BF16);
    ck_assert_int_eq(zo_dtype_parse("FP16", &t), 0);
    ck_assert_int_eq(t, ZO_DTYPE_F16);
    ck_assert_int_eq(zo_dtype_parse("f8", &t), -EINVAL);
}
END_TEST

START_TEST(test_parse_size)
{
    uint64_t v;
    ck_assert_int_eq(zo_parse_size("13522", &v), 0);
    ck_assert_uint_eq(v, 13522);
    ck_assert_int_eq(zo_parse_size("1G", &v), 0);
    ck_assert_uint_eq(v, 1ull << 30);
    ck_assert_int_eq(zo_parse_size("1GB", &v), 0);
    ck_assert_uint_eq(v, 1000000000ull);
    ck_assert_int_eq(zo_parse_size("64MiB", &v), 0);
    ck_assert_uint_eq(v, 64ull << 20);
    ck_assert_int_eq(zo_parse_size("0", &v), 0);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(zo_parse_size("", &v), -EINVAL);
    ck_assert_int_eq(zo_parse_size("-1", &v), -EINVAL);
    ck_assert_int_eq(zo_parse_size("1X", &v), -EINVAL);
    ck_assert_int_eq(zo_parse_size("1 G", &v), -EINVAL);
    ck_assert_int_eq(zo_parse_size("99999999999999999999", &v), -ERANGE);
    ck_assert_int_eq(zo_parse_size("17179869184G", &v), -ERANGE);
    /* scientific notation, exactly (the tools' docs promise --params 1e6);
     * "2.5e0" is not a whole number */
    static const struct {
        const char *s;
        int rc;
        uint64_t v;
    } sci[] = {{"1e6", 0, 1000000},       {"1E9", 0, 1000000000ull},   {"2.5e9", 0, 2500000000ull},
               {"1.50e1", 0, 15},         {"3e0", 0, 3},               {"1.8e19", 0, 18000000000000000000ull},
               {"2.5e0", -EINVAL, 0},     {"1e", -EINVAL, 0},          {"1e-3", -EINVAL, 0},
               {"1e6G", -EINVAL, 0},      {"1.5", -EINVAL, 0},         {"1..5e3", -EINVAL, 0},
               {"2e19", -ERANGE, 0},      {"1e1000000", -ERANGE, 0}};
    for (size_t i = 0; i < sizeof(sci) / sizeof(sci[0]); i++) {
        v = 0;
        ck_assert_msg(zo_parse_size(sci[i].s, &v) == sci[i].rc && (sci[i].rc || v == sci[i].v), "%s: %llu", sci[i].s,
                      (unsigned long long)v);
    }
}
END_TEST

START_TEST(test_version_build)
{
    ck_assert_uint_eq(zo_version(), ZO_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", ZO_VERSION_MAJOR, ZO_VERSION_MINOR, ZO_VERSION_PATCH);
    ck_assert_str_eq(zo_version_string(), want);
    const char *b = zo_build_string();
    ck_assert_ptr_nonnull(strstr(b, "cuda="));
    ck_assert_ptr_nonnull(strstr(b, "liburing="));
    ck_assert_int_eq(!!(zo_build_features() & ZO_BUILD_CUDA), ZO_HAVE_CUDA);
}
END_TEST

/* ---- CPU ----------------------------------------------------------------------- */
START_TEST(test_cpu_parse_mask)
{
    unsigned m;
    ck_assert_int_eq(zo_cpu_parse_mask("scalar", &m), 0);
    ck_assert_uint_eq(m, 0);
    ck_assert_int_eq(zo_cpu_parse_mask("avx2", &m), 0);
    ck_assert_uint_eq(m, ZO_CPU_LEVEL_AVX2);
    ck_assert_int_eq(zo_cpu_parse_mask("avx512", &m), 0);
    ck_assert_uint_eq(m, ZO_CPU_LEVEL_AVX512);
    ck_assert_int_eq(zo_cpu_parse_mask("all", &m), 0);
    ck_assert_uint_eq(m, ZO_CPU_ALL);
    ck_assert_int_eq(zo_cpu_parse_mask("-avx512bf16", &m), 0);
    ck_assert_uint_eq(m, ZO_CPU_ALL & ~ZO_CPU_AVX512BF16);
    ck_assert_int_eq(zo_cpu_parse_mask("-vpclmulqdq", &m), 0);
    ck_assert_uint_eq(m, ZO_CPU_ALL & ~ZO_CPU_VPCLMULQDQ);
    /* the AVX-512 level is the kernels' common needs; VPCLMULQDQ is an
     * extension on top, like BF16 */
    ck_assert_uint_eq(ZO_CPU_LEVEL_AVX512 & ZO_CPU_VPCLMULQDQ, 0);
    ck_assert_int_eq(zo_cpu_parse_mask("sse4.2,fma", &m), 0);
    ck_assert_uint_eq(m, ZO_CPU_SSE42 | ZO_CPU_FMA);
    ck_assert_int_eq(zo_cpu_parse_mask("0x3", &m), 0);
    ck_assert_uint_eq(m, 3);
    ck_assert_int_eq(zo_cpu_parse_mask("avx1024", &m), -EINVAL);
    ck_assert_int_eq(zo_cpu_parse_mask("", &m), -EINVAL);
    ck_assert_int_eq(zo_cpu_parse_mask("12abc", &m), -EINVAL);
    /* garbage that once parsed as "all": an overflowing number, an empty list */
    m = 7;
    ck_assert_int_eq(zo_cpu_parse_mask("99999999999999999999999", &m), -EINVAL);
    ck_assert_int_eq(zo_cpu_parse_mask(",", &m), -EINVAL);
    ck_assert_int_eq(zo_cpu_parse_mask(",,,", &m), -EINVAL);
    ck_assert_uint_eq(m, 7);
    ck_assert_int_eq(zo_cpu_parse_mask("avx512,,-avx512bf16", &m), 0);
    ck_assert_uint_eq(m, ZO_CPU_LEVEL_AVX512 & ~ZO_CPU_AVX512BF16);
}
END_TEST

START_TEST(test_cpu_flags_consistent)
{
    unsigned d = zo_cpu_detected();
    /* extensions imply the foundation; VPCLMULQDQ needs only AVX (it has a
     * 256-bit form, used on CPUs with AVX2 and no AVX-512) */
    if (d & (ZO_CPU_AVX512BW | ZO_CPU_AVX512BF16))
        ck_assert(d & ZO_CPU_AVX512F);
    if (d & ZO_CPU_VPCLMULQDQ)
        ck_assert(d & ZO_CPU_SSE42);
    /* one architecture's features never show on another */
    if (d & (ZO_CPU_NEON | ZO_CPU_ARM_CRC32 | ZO_CPU_PMULL | ZO_CPU_SVE))
        ck_assert_uint_eq(d & (ZO_CPU_SSE42 | ZO_CPU_AVX2 | ZO_CPU_AVX512F), 0);
#if defined(__aarch64__)
    ck_assert(d & ZO_CPU_NEON); /* every ARMv8-A CPU */
#endif
    ck_assert_str_eq(zo_cpu_flag_name(ZO_CPU_VPCLMULQDQ), "vpclmulqdq");
    ck_assert_str_eq(zo_cpu_flag_name(ZO_CPU_NEON), "neon");
    ck_assert_str_eq(zo_cpu_flag_name(ZO_CPU_SVE), "sve");
    ck_assert_uint_eq(ZO_CPU_ALL, (ZO_CPU_SVE << 1) - 1);
    char buf[256];
    ck_assert_int_ge(zo_cpu_flags_string(d, buf, sizeof(buf)), 0);
    ck_assert_str_eq(zo_cpu_flag_name(ZO_CPU_AVX512BW), "avx512bw");
    ck_assert_ptr_null(zo_cpu_flag_name(3));
    ck_assert_str_eq(zo_cpu_level_name(0), "scalar");
    ck_assert_str_eq(zo_cpu_level_name(ZO_CPU_LEVEL_AVX2), "avx2");
    ck_assert_str_eq(zo_cpu_level_name(ZO_CPU_LEVEL_NEON), "neon");
}
END_TEST

/* The mask from ZO_CPU_MASK (meson runs this program under several values)
 * must bound what dispatch picks. */
START_TEST(test_cpu_mask_env_bounds_dispatch)
{
    const char *env = getenv("ZO_CPU_MASK");
    unsigned want = ZO_CPU_ALL;
    if (env)
        ck_assert_int_eq(zo_cpu_parse_mask(env, &want), 0);
    ck_assert_uint_eq(zo_cpu_get_mask(), want);
    ck_assert_uint_eq(zo_cpu_flags(), zo_cpu_detected() & want);
    const char *v = zo_vec_variant();
    if (!(want & (ZO_CPU_AVX2 | ZO_CPU_NEON)))
        ck_assert_str_eq(v, "scalar");
    if (!(want & ZO_CPU_AVX512F))
        ck_assert_ptr_null(strstr(v, "avx512"));
    if (zo_cpu_flags() & ZO_CPU_NEON)
        ck_assert_str_eq(v, "neon");
    /* aarch64: the PMULL kernel needs the CRC32 instructions for its ends */
    if (!(zo_cpu_flags() & ZO_CPU_ARM_CRC32))
        ck_assert(strcmp(zo_crc32c_variant(), "armv8") && strcmp(zo_crc32c_variant(), "pmull"));
    else if (zo_cpu_flags() & ZO_CPU_PMULL)
        ck_assert_str_eq(zo_crc32c_variant(), "pmull");
    else
        ck_assert_str_eq(zo_crc32c_variant(), "armv8");
    /* a mask without VPCLMULQDQ (or AVX2, or AVX-512F for the wide one)
     * leaves the folding CRC kernels out */
    const unsigned f256 = ZO_CPU_SSE42 | ZO_CPU_AVX2 | ZO_CPU_VPCLMULQDQ, f512 = f256 | ZO_CPU_AVX512F;
    if ((want & f512) != f512)
        ck_assert_str_ne(zo_crc32c_variant(), "vpclmul512");
    if ((want & f256) != f256)
        ck_assert_str_ne(zo_crc32c_variant(), "vpclmul256");
    if ((zo_cpu_flags() & f512) == f512)
        ck_assert_str_eq(zo_crc32c_variant(), "vpclmul512");
    else if ((zo_cpu_flags() & f256) == f256)
        ck_assert_str_eq(zo_crc32c_variant(), "vpclmul256");
}
END_TEST

/* A log callback that asks for the CPU flags while the warning about a bad
 * ZO_CPU_MASK is being delivered must not deadlock (the warning used to be
 * logged from inside the pthread_once routine), and the bad value is
 * ignored. Runs in its own forked process: the CPU state is initialised
 * once per process. */
static void capture_and_query(void *user, zo_log_level level, const char *module, const char *msg)
{
    capture(user, level, module, msg);
    (void)zo_cpu_flags();
}

START_TEST(test_cpu_bad_env_mask_logged_once)
{
    setenv("ZO_CPU_MASK", "avx2,not-a-feature", 1);
    log_capture c = {0};
    zo_log_set_level(ZO_LOG_WARN);
    zo_log_set_callback(capture_and_query, &c);
    unsigned f = zo_cpu_flags();
    ck_assert_uint_eq(zo_cpu_get_mask(), ZO_CPU_ALL);
    ck_assert_uint_eq(f, zo_cpu_detected());
    (void)zo_cpu_flags();
    ck_assert_int_eq(c.calls, 1);
    ck_assert_int_eq(c.last_level, ZO_LOG_WARN);
    ck_assert_ptr_nonnull(strstr(c.last, "ZO_CPU_MASK=avx2,not-a-feature"));
    zo_log_set_callback(NULL, NULL);
}
END_TEST

START_TEST(test_cpu_set_mask_lowers_dispatch)
{
    unsigned old = zo_cpu_get_mask();
    zo_cpu_set_mask(0);
    ck_assert_str_eq(zo_vec_variant(), "scalar");
    ck_assert_uint_eq(zo_cpu_flags(), 0);
    zo_cpu_set_mask(ZO_CPU_LEVEL_AVX2);
    if ((zo_cpu_detected() & ZO_CPU_LEVEL_AVX2) == ZO_CPU_LEVEL_AVX2)
        ck_assert_str_eq(zo_vec_variant(), "avx2");
    zo_cpu_set_mask(ZO_CPU_LEVEL_NEON);
    if ((zo_cpu_detected() & ZO_CPU_LEVEL_NEON) == ZO_CPU_LEVEL_NEON)
        ck_assert_str_eq(zo_vec_variant(), "neon");
    zo_cpu_set_mask(old);
}
END_TEST

/* ---- vec: every variant against the reference ---------------------------------- */
/* Every architecture's variants: those this CPU cannot run are skipped. */
static const unsigned variant_flags[] = {
    0,
    ZO_CPU_LEVEL_AVX2,
    ZO_CPU_LEVEL_AVX512,
    ZO_CPU_LEVEL_AVX512 | ZO_CPU_AVX512BF16,
    ZO_CPU_LEVEL_NEON,
};

/* Fill with values that exercise rounding: random bit patterns (all
 * classes), plus planted edges. */
static void fill_f32_edges(zo_test_rng *r, float *x, size_t n)
{
    static const uint32_t edges[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000, /* zero, -0, subnormals, min normal */
        0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffbfffff, /* inf, qnan, snan, neg nan */
        0x7f7fffff, 0x477fe000, 0x477ff000, 0x477fefff, 0x38800000, /* max, f16 max, f16 tie to inf, f16 min normal */
        0x33000000, 0x33000001, 0x337fffff, 0x387fc000, 0x3f808000, /* f16 subnormal edges, bf16 tie */
        0x3f818000, 0x3f807fff, 0x3f800001, 0xbf808000,
    };
    for (size_t i = 0; i < n; i++) {
        uint64_t k = zo_test_next(r);
        uint32_t u;
        switch (k % 4) {
        case 0: u = edges[(k >> 8) % (sizeof(edges) / 4)]; break;
        case 1: u = (uint32_t)(k >> 32); break; /* any bit pattern */
        default: {
            float f = (float)((zo_test_uniform(r) - 0.5) * ldexp(1.0, (int)((k >> 16) % 60) - 30));
            memcpy(&u, &f, 4);
        }
        }
        memcpy(&x[i], &u, 4);
    }
}

static int is_f32_subnormal(float f)
{
    uint32_t u = zo__f32_bits(f);
    return (u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0;
}

START_TEST(test_vec_casts_all_variants)
{
    zo_test_rng r = {zo_test_seed()};
    size_t cap = 100003 + 8;
    float *src = malloc(cap * 4), *back = malloc(cap * 4), *back_ref = malloc(cap * 4);
    uint16_t *h = malloc(cap * 2), *h_ref = malloc(cap * 2);
    ck_assert(src && back && h && h_ref && back_ref);
    unsigned detected = zo_cpu_detected();
    for (size_t v = 0; v < sizeof(variant_flags) / sizeof(variant_flags[0]); v++) {
        unsigned flags = variant_flags[v];
        if ((detected & flags) != flags)
            continue;
        const zo_vec_dsp *d = zo__vec_dsp_for(flags);
        int bf16_ftz = !strcmp(d->name, "avx512bf16");
        for (size_t n = 1; n <= 100003; n = (n < 257) ? n + 1 : n * 7 + 3) {
            for (int off = 0; off < 2; off++) { /* unaligned by one element */
                float *s = src + off;
                fill_f32_edges(&r, s, n);
                /* bf16 */
                d->f32_to_bf16(h + off, s, n);
                for (size_t i = 0; i < n; i++) {
                    uint16_t want = zo__ref_f32_to_bf16(s[i]);
                    if (bf16_ftz && is_f32_subnormal(s[i]))
                        want = (uint16_t)((zo__f32_bits(s[i]) >> 16) & 0x8000u);
                    ZO_EXPECT(h[off + i] == want, "%s f32->bf16 n=%zu i=%zu x=0x%08x got 0x%04x want 0x%04x",
                                  d->name, n, i, zo__f32_bits(s[i]), h[off + i], want);
                }
                d->bf16_to_f32(back + off, h + off, n);
                for (size_t i = 0; i < n; i++)
                    ZO_EXPECT(zo__f32_bits(back[off + i]) == (uint32_t)h[off + i] << 16, "%s bf16->f32 i=%zu",
                              d->name, i);
                /* f16 */
                d->f32_to_f16(h + off, s, n);
                for (size_t i = 0; i < n; i++) {
                    uint16_t want = zo__ref_f32_to_f16(s[i]);
                    ZO_EXPECT(h[off + i] == want, "%s f32->f16 n=%zu i=%zu x=0x%08x got 0x%04x want 0x%04x",
                                  d->name, n, i, zo__f32_bits(s[i]), h[off + i], want);
                }
                d->f16_to_f32(back + off, h + off, n);
                for (size_t i = 0; i < n; i++) {
                    float want = zo__ref_f16_to_f32(h[off + i]);
                    ZO_EXPECT(zo__f32_bits(back[off + i]) == zo__f32_bits(want),
                                  "%s f16->f32 h=0x%04x got 0x%08x want 0x%08x", d->name, h[off + i],
                                  zo__f32_bits(back[off + i]), zo__f32_bits(want));
                }
            }
        }
    }
    free(src);
    free(back);
    free(back_ref);
    free(h);
    free(h_ref);
}
END_TEST

/* Every 16-bit pattern, signaling NaNs included, widens to the same fp32
 * bits in every variant as in the reference (F16C quiets a signaling NaN;
 * the reference once kept it signaling, so the variants disagreed). */
START_TEST(test_vec_widen_exhaustive_all_variants)
{
    uint16_t *h = malloc(65536 * 2);
    float *f = malloc(65536 * 4);
    ck_assert(h && f);
    for (uint32_t u = 0; u < 65536; u++)
        h[u] = (uint16_t)u;
    unsigned detected = zo_cpu_detected();
    for (size_t v = 0; v < sizeof(variant_flags) / sizeof(variant_flags[0]); v++) {
        if ((detected & variant_flags[v]) != variant_flags[v])
            continue;
        const zo_vec_dsp *d = zo__vec_dsp_for(variant_flags[v]);
        d->f16_to_f32(f, h, 65536);
        for (uint32_t u = 0; u < 65536; u++) {
            float want = zo__ref_f16_to_f32(h[u]);
            ZO_EXPECT(zo__f32_bits(f[u]) == zo__f32_bits(want), "%s f16 0x%04x -> 0x%08x, reference 0x%08x",
                      d->name, u, zo__f32_bits(f[u]), zo__f32_bits(want));
            if ((u & 0x7c00) == 0x7c00 && (u & 0x3ff))
                ZO_EXPECT(zo__f32_bits(f[u]) & 0x400000u, "%s f16 NaN 0x%04x not quiet", d->name, u);
        }
        d->bf16_to_f32(f, h, 65536);
        for (uint32_t u = 0; u < 65536; u++)
            ZO_EXPECT(zo__f32_bits(f[u]) == zo__f32_bits(zo__ref_bf16_to_f32(h[u])), "%s bf16 0x%04x", d->name, u);
    }
    free(h);
    free(f);
}
END_TEST

/* Every 16-bit pattern through f16 -> f32 -> f16 is the identity, except
 * that NaNs come back quiet. Pins the reference itself. */
START_TEST(test_vec_f16_exhaustive_roundtrip)
{
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t hv = (uint16_t)u;
        float f = zo__ref_f16_to_f32(hv);
        uint16_t back = zo__ref_f32_to_f16(f);
        int is_nan = (hv & 0x7c00) == 0x7c00 && (hv & 0x3ff);
        ZO_EXPECT(back == (is_nan ? (hv | 0x200) : hv), "f16 0x%04x -> 0x%04x", hv, back);
        /* and the bf16 reference against a plain rounding formula */
        float g = zo__ref_bf16_to_f32(hv);
        uint16_t bb = zo__ref_f32_to_bf16(g);
        int bnan = (hv & 0x7f80) == 0x7f80 && (hv & 0x7f);
        ZO_EXPECT(bb == (bnan ? (hv | 0x40) : hv), "bf16 0x%04x -> 0x%04x", hv, bb);
    }
    /* values checked by hand */
    ck_assert_uint_eq(zo__ref_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(zo__ref_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(zo__ref_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(zo__ref_f32_to_f16(0x1p-24f), 0x0001);
    ck_assert_uint_eq(zo__ref_f32_to_f16(0x1p-25f), 0x0000);  /* tie to even */
    ck_assert_uint_eq(zo__ref_f32_to_f16(0x1.8p-24f), 0x0002); /* tie to even, up */
    ck_assert_uint_eq(zo__ref_f32_to_bf16(1.00390625f), 0x3f80); /* tie to even, down */
    ck_assert_uint_eq(zo__ref_f32_to_bf16(1.01171875f), 0x3f82); /* tie to even, up */
}
END_TEST

START_TEST(test_vec_sumsq_nonfinite_all_variants)
{
    zo_test_rng r = {zo_test_seed() ^ 7};
    size_t cap = 70001 + 4;
    float *x = malloc(cap * 4);
    uint16_t *hb = malloc(cap * 2), *hf = malloc(cap * 2);
    ck_assert(x && hb && hf);
    unsigned detected = zo_cpu_detected();
    for (size_t n = 1; n <= 70001; n = (n < 257) ? n + 1 : n * 9 + 1) {
        for (size_t i = 0; i < n + 1; i++)
            x[i] = (float)((zo_test_uniform(&r) - 0.5) * 8.0);
        float *s = x + (n & 1); /* alternate alignment */
        zo__vec_dsp_for(0)->f32_to_bf16(hb, s, n);
        zo__vec_dsp_for(0)->f32_to_f16(hf, s, n);
        long double ref32 = 0, refb = 0, reff = 0;
        for (size_t i = 0; i < n; i++) {
            ref32 += (long double)s[i] * s[i];
            long double b = zo__ref_bf16_to_f32(hb[i]), f = zo__ref_f16_to_f32(hf[i]);
            refb += b * b;
            reff += f * f;
        }
        for (size_t v = 0; v < sizeof(variant_flags) / sizeof(variant_flags[0]); v++) {
            unsigned flags = variant_flags[v];
            if ((detected & flags) != flags)
                continue;
            const zo_vec_dsp *d = zo__vec_dsp_for(flags);
            double tol = (double)n * 0x1p-52;
            ck_assert_double_le(fabs(d->sumsq_f32(s, n) - (double)ref32), tol * (double)ref32 + 1e-300);
            ck_assert_double_le(fabs(d->sumsq_bf16(hb, n) - (double)refb), tol * (double)refb + 1e-300);
            ck_assert_double_le(fabs(d->sumsq_f16(hf, n) - (double)reff), tol * (double)reff + 1e-300);
            ck_assert_uint_eq(d->nonfinite_f32(s, n), 0);
            ck_assert_uint_eq(d->nonfinite_16(hb, n, 0x7f80), 0);
        }
    }
    /* plant inf/nan at edges and in the middle */
    size_t n = 1031;
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f;
    size_t where[] = {0, 15, 16, 517, 1030};
    for (size_t k = 0; k < 5; k++)
        x[where[k]] = (k & 1) ? INFINITY : NAN;
    zo__vec_dsp_for(0)->f32_to_bf16(hb, x, n);
    zo__vec_dsp_for(0)->f32_to_f16(hf, x, n);
    for (size_t v = 0; v < sizeof(variant_flags) / sizeof(variant_flags[0]); v++) {
        unsigned flags = variant_flags[v];
        if ((detected & flags) != flags)
            continue;
        const zo_vec_dsp *d = zo__vec_dsp_for(flags);
        ck_assert_uint_eq(d->nonfinite_f32(x, n), 5);
        ck_assert_uint_eq(d->nonfinite_16(hb, n, 0x7f80), 5);
        ck_assert_uint_eq(d->nonfinite_16(hf, n, 0x7c00), 5);
        ck_assert(!isfinite(d->sumsq_f32(x, n)));
    }
    free(x);
    free(hb);
    free(hf);
}
END_TEST

START_TEST(test_vec_public_api_errors)
{
    float f[4] = {1, 2, 3, 4};
    uint16_t h[4];
    double s;
    size_t c;
    ck_assert_int_eq(zo_vec_cast(h, ZO_DTYPE_BF16, f, ZO_DTYPE_F32, 4), 0);
    ck_assert_int_eq(zo_vec_cast(h, ZO_DTYPE_BF16, NULL, ZO_DTYPE_F32, 4), -EINVAL);
    ck_assert_int_eq(zo_vec_cast(h, ZO_DTYPE_BF16, NULL, ZO_DTYPE_F32, 0), 0);
    ck_assert_int_eq(zo_vec_cast(h, ZO_DTYPE_F16, h, ZO_DTYPE_BF16, 4), ZO_ENOTSUP);
    ck_assert_int_eq(zo_vec_cast(h, (zo_dtype)42, f, ZO_DTYPE_F32, 4), -EINVAL);
    ck_assert_int_eq(zo_vec_sumsq(f, ZO_DTYPE_F32, 4, &s), 0);
    ck_assert_double_eq(s, 30.0);
    ck_assert_int_eq(zo_vec_sumsq(f, ZO_DTYPE_U8, 4, &s), ZO_ENOTSUP);
    ck_assert_int_eq(zo_vec_nonfinite(f, ZO_DTYPE_F32, 4, NULL), -EINVAL);
    ck_assert_int_eq(zo_vec_nonfinite(f, ZO_DTYPE_F32, 4, &c), 0);
    ck_assert_uint_eq(c, 0);
}
END_TEST

/* Every family lists its built variants slowest first, "scalar" first, each
 * needing all its predecessor needs (dispatch takes the last one allowed),
 * and the one picked now is the last the current flags allow. A variant
 * that needs what the CPU lacks is listed but never picked: the tables are
 * built from data on any CPU and only handed out after the CPU check. */
/* core/dispatch.h, the one pick and overlay of the kernel families: a
 * NULL member keeps the level below's, a name always comes from the
 * variant itself, and a variant whose flags this CPU lacks is never
 * picked, whatever flags the caller asks for. */
typedef struct fake_dsp {
    const char *name;
    int (*a)(void);
    int (*b)(void);
} fake_dsp;
ZO_DISPATCH_TABLE_CHECK(fake_dsp);
static int fake1(void) { return 1; }
static int fake2(void) { return 2; }
static int fake3(void) { return 3; }

START_TEST(test_dispatch_overlay_and_pick)
{
    static const fake_dsp t0 = {"base", fake1, fake1}, t1 = {"mid", NULL, fake2}, t2 = {"top", fake3, NULL};
    /* top needs a flag no CPU has (above ZO_CPU_ALL) */
    const zo__variant v[] = {{0, &t0}, {0, &t1}, {ZO_CPU_ALL + 1u, &t2}};
    fake_dsp tables[3];
    memset(tables, 0xa5, sizeof(tables));
    zo__variant_overlay(tables, sizeof(tables[0]), v, 3);
    ck_assert_str_eq(tables[0].name, "base");
    ck_assert(tables[0].a == fake1 && tables[0].b == fake1);
    ck_assert_str_eq(tables[1].name, "mid");
    ck_assert(tables[1].a == fake1 && tables[1].b == fake2);
    ck_assert_str_eq(tables[2].name, "top");
    ck_assert(tables[2].a == fake3 && tables[2].b == fake2);
    ck_assert_int_eq(tables[2].a() + tables[2].b(), 5);
    ck_assert_str_eq(zo__variant_name(&v[2]), "top");
    /* asked for everything: never the variant the CPU cannot run */
    ck_assert_uint_eq(zo__variant_pick(v, 3, ~0u), 1);
    ck_assert_uint_eq(zo__variant_pick(v, 1, ~0u), 0);
    /* a variant needing a flag not asked for: the one below */
    const zo__variant w[] = {{0, &t0}, {ZO_CPU_SSE42 | ZO_CPU_NEON, &t1}};
    ck_assert_uint_eq(zo__variant_pick(w, 2, 0), 0);
    ck_assert_uint_eq(zo__variant_pick(w, 2, ~0u), 0); /* no CPU has both */
}
END_TEST

START_TEST(test_kernel_variant_lists)
{
    const char *(*const at[])(unsigned, unsigned *) = {zo_vec_variant_at, zo_crc32c_variant_at,
                                                       zo_cpuadam_variant_at};
    const char *(*const cur[])(void) = {zo_vec_variant, zo_crc32c_variant, zo_cpuadam_variant};
    unsigned saved = zo_cpu_get_mask();
    const unsigned masks[] = {0, ZO_CPU_LEVEL_AVX2, ZO_CPU_SSE42, ZO_CPU_NEON, saved};
    for (size_t f = 0; f < ZO_ARRAY_LEN(at); f++) {
        unsigned need, prev = 0, n = 0;
        const char *name;
        ck_assert_str_eq(at[f](0, &need), "scalar");
        ck_assert_uint_eq(need, 0);
        for (; (name = at[f](n, &need)) != NULL; n++) {
            ck_assert_uint_eq(need & prev, prev);
            prev = need;
        }
        ck_assert_uint_ge(n, 1);
        ck_assert_ptr_null(at[f](n + 100, NULL));
        for (size_t k = 0; k < ZO_ARRAY_LEN(masks); k++) {
            zo_cpu_set_mask(masks[k]);
            const char *want = "scalar";
            for (unsigned i = 0; (name = at[f](i, &need)) != NULL; i++)
                if ((zo_cpu_flags() & need) == need)
                    want = name;
            ck_assert_str_eq(cur[f](), want);
        }
        zo_cpu_set_mask(saved);
    }
    /* every name is known on every architecture; foreign ones are not available */
    ck_assert_int_ge(zo_cpuadam_variant_available("neon"), 0);
    ck_assert_int_ge(zo_cpuadam_variant_available("avx2"), 0);
#if defined(__aarch64__)
    ck_assert_int_eq(zo_cpuadam_variant_available("avx2"), 0);
#else
    ck_assert_int_eq(zo_cpuadam_variant_available("neon"), 0);
#endif
}
END_TEST

static Suite *core_suite(void)
{
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("errors");
    tcase_add_test(tc, test_strerror);
    tcase_add_test(tc, test_detail_thread_local);
    tcase_add_test(tc, test_log_callback_and_level);
    tcase_add_test(tc, test_log_parse);
    tcase_add_test(tc, test_dtype);
    tcase_add_test(tc, test_parse_size);
    tcase_add_test(tc, test_version_build);
    tcase_add_test(tc, test_list_and_queue);
    tcase_add_test(tc, test_struct_in);
    tcase_add_test(tc, test_errbuf_threads);
    tcase_add_test(tc, test_errbuf_store_swap_threads);
    suite_add_tcase(s, tc);
    tc = tcase_create("cpu");
    tcase_add_test(tc, test_cpu_parse_mask);
    tcase_add_test(tc, test_cpu_flags_consistent);
    tcase_add_test(tc, test_kernel_variant_lists);
    tcase_add_test(tc, test_dispatch_overlay_and_pick);
    tcase_add_test(tc, test_cpu_mask_env_bounds_dispatch);
    tcase_add_test(tc, test_cpu_set_mask_lowers_dispatch);
    suite_add_tcase(s, tc);
    tc = tcase_create("cpu-env");
    tcase_set_timeout(tc, 10); /* a deadlock fails here instead of hanging */
    tcase_add_test(tc, test_cpu_bad_env_mask_logged_once);
    suite_add_tcase(s, tc);
    tc = tcase_create("vec");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_vec_casts_all_variants);
    tcase_add_test(tc, test_vec_f16_exhaustive_roundtrip);
    tcase_add_test(tc, test_vec_widen_exhaustive_all_variants);
    tcase_add_test(tc, test_vec_sumsq_nonfinite_all_variants);
    tcase_add_test(tc, test_vec_public_api_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return zo_test_run(core_suite());
}
