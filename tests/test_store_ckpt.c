/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints of the tiered store and the completion calls: a tensor in a
 * running checkpoint or restore cannot be unregistered (it was freed under
 * them), zo_store_test() says "not finished" with ZO_PENDING, never with a
 * code a finished request can also return, and zo_store_restore2() hands
 * back the user JSON and reads the checkpoint once (verifying what it read
 * before writing it), with the documented state after a damaged one.
 * Real pinned memory, a real swap store, real files; the aio engine's
 * fault hook holds or fails chosen I/O. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>

#include "zo_test.h"

#include <zoffload/zoffload.h>

#include "aio/aio_internal.h"

#include "store_env.h"

/* A store with a 1 MiB device tier and a 1 MiB host tier on the host
 * backend, 8 slots of 64 KiB, a swap store on a 4-thread pread/pwrite
 * engine (a hook holding one I/O leaves the others running). */
static void env_open(env *e)
{
    env_open_with(e, &(env_opts){.dev_limit = 2 * MiB,
                                 .dev_bytes = 1 * MiB,
                                 .host_bytes = 1 * MiB,
                                 .slot_size = 64 * KiB,
                                 .slots = 8,
                                 .chunk = 64 * KiB,
                                 .arena = 16 * MiB,
                                 .aio_threads = 4});
}

static void fill(uint8_t *p, size_t n, uint64_t id)
{
    zo_test_rng r = {id * 0x9e3779b97f4a7c15ull + 0x51ed27u};
    zo_test_next(&r);
    zo_test_fill_bytes(&r, p, n);
}

static zo_tensor *reg(env *e, const char *name, uint64_t bytes, zo_tier home, uint64_t id)
{
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.name = name;
    d.bytes = bytes;
    d.dtype = ZO_DTYPE_U8;
    d.home = home;
    zo_tensor *t = NULL;
    int r = zo_store_register(e->st, &d, &t);
    ck_assert_msg(r == 0, "register %s: %s (%s)", name, zo_strerror(r), zo_last_error_detail());
    uint8_t *b = malloc(bytes);
    fill(b, bytes, id);
    ck_assert_int_eq(zo_store_write(e->st, t, 0, b, bytes), 0);
    free(b);
    return t;
}

/* t holds exactly the bytes of fill(id)? */
static int holds(env *e, zo_tensor *t, uint64_t bytes, uint64_t id)
{
    uint8_t *want = malloc(bytes), *got = malloc(bytes);
    fill(want, bytes, id);
    ck_assert_int_eq(zo_store_read(e->st, t, 0, got, bytes), 0);
    int same = memcmp(want, got, bytes) == 0;
    free(want);
    free(got);
    return same;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ---- an I/O gate on the swap store's engine --------------------------------------- */
typedef struct gate {
    int op;                 /* ZO__OP_READ or ZO__OP_WRITE */
    _Atomic int closed;     /* hold the first such I/O while set */
    _Atomic int held;       /* I/Os of that kind seen while closed */
    int fail;               /* instead: fail every such I/O with this error */
} gate;

static int64_t gate_hook(void *user, const zo__aio_fault_site *s)
{
    gate *g = user;
    if (s->op != g->op)
        return 0;
    if (g->fail)
        return g->fail;
    if (atomic_load(&g->closed) && atomic_fetch_add(&g->held, 1) == 0)
        while (atomic_load(&g->closed))
            nap_ms(1);
    return 0;
}

static void gate_wait_held(gate *g)
{
    for (int i = 0; i < 20000 && !atomic_load(&g->held); i++)
        nap_ms(1);
    ck_assert_msg(atomic_load(&g->held), "no I/O reached the gate");
}

/* ---- zo_store_test: ZO_PENDING ------------------------------------------------------ */
/* While the load is held, zo_store_test() returns ZO_PENDING (it used to
 * return -EBUSY, which a finished request also returns when its load
 * failed with -EBUSY: a caller could not tell "poll again" from "done,
 * request freed"). Then a load that fails with -EBUSY: the poll loop ends
 * with that error, once. */
START_TEST(test_store_test_pending)
{
    env e;
    env_open(&e);
    const uint64_t n = 200 * KiB + 3;
    zo_tensor *t = reg(&e, "t", n, ZO_TIER_NVME, 1);
    gate g = {.op = ZO__OP_READ};
    atomic_store(&g.closed, 1);
    zo__aio_set_fault(zo_swap_get_aio(e.swap), gate_hook, &g);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_HOST, 0, &q), 0);
    gate_wait_held(&g);
    void *p = (void *)1;
    int rc = zo_store_test(e.st, q, &p);
    ck_assert_msg(rc == ZO_PENDING, "test while loading: %d (%s)", rc, zo_strerror(rc));
    ck_assert_ptr_null(p);
    atomic_store(&g.closed, 0);
    while ((rc = zo_store_test(e.st, q, &p)) == ZO_PENDING)
        nap_ms(1);
    ck_assert_msg(rc == 0, "%s (%s)", zo_strerror(rc), zo_store_errmsg(e.st));
    uint8_t *want = malloc(n);
    fill(want, n, 1);
    ck_assert(memcmp(p, want, n) == 0);
    free(want);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_HOST, ZO_REL_DROP), 0);
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    /* a load that fails with -EBUSY: a completion error, not "pending" */
    zo_tensor *u = reg(&e, "u", n, ZO_TIER_NVME, 2);
    g.fail = -EBUSY;
    ck_assert_int_eq(zo_store_acquire(e.st, u, ZO_TIER_DEVICE, 0, &q), 0);
    int polls = 0;
    while ((rc = zo_store_test(e.st, q, &p)) == ZO_PENDING) {
        nap_ms(1);
        ck_assert_int_lt(++polls, 20000);
    }
    ck_assert_msg(rc == -EBUSY, "failed load: %d (%s)", rc, zo_strerror(rc));
    ck_assert_ptr_null(p);
    g.fail = 0;
    zo_tensor_info ti;
    ck_assert_int_eq(zo_store_tensor_info(e.st, u, &ti), 0);
    ck_assert_uint_eq(ti.refs[ZO_TIER_DEVICE], 0); /* a failed acquire holds no reference */
    ck_assert(holds(&e, u, n, 2));
    ck_assert_int_eq(zo_store_test(e.st, NULL, &p), -EINVAL);
    env_close(&e);
}
END_TEST

/* ---- tensors pinned by a checkpoint or a restore --------------------------------------- */
typedef struct call {
    env *e;
    zo_tensor *ts[2];
    int restore;
    int rc;
    char detail[ZO_ERRMSG_LEN];
} call;

static void *run_call(void *arg)
{
    call *c = arg;
    c->rc = c->restore ? zo_store_restore(c->e->st, c->e->root, "c1")
                       : zo_store_checkpoint(c->e->st, c->e->root, "c1", c->ts, 2, 0, NULL);
    snprintf(c->detail, sizeof(c->detail), "%s", zo_last_error_detail());
    return NULL;
}

/* A checkpoint of [a, b] drops the store's lock while it streams a (its
 * read held here); unregistering b meanwhile used to succeed and free it,
 * and the checkpoint then streamed the freed tensor. Now: -EBUSY, b stays,
 * the checkpoint holds b's bytes. */
START_TEST(test_store_ckpt_pins)
{
    env e;
    env_open(&e);
    const uint64_t n = 300 * KiB + 11;
    zo_tensor *a = reg(&e, "a", n, ZO_TIER_NVME, 11), *b = reg(&e, "b", n, ZO_TIER_NVME, 12);
    gate g = {.op = ZO__OP_READ};
    atomic_store(&g.closed, 1);
    zo__aio_set_fault(zo_swap_get_aio(e.swap), gate_hook, &g);
    call c = {.e = &e, .ts = {a, b}};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_call, &c), 0);
    gate_wait_held(&g);
    zo_tensor *bb = b, *aa = a;
    int rc = zo_store_unregister(e.st, &bb);
    ck_assert_msg(rc == -EBUSY, "unregister of a tensor in a running checkpoint: %d (%s)", rc,
                  zo_store_errmsg(e.st));
    ck_assert_ptr_eq(bb, b);
    ck_assert_ptr_nonnull(strstr(zo_store_errmsg(e.st), "checkpoint"));
    ck_assert_int_eq(zo_store_unregister(e.st, &aa), -EBUSY);
    atomic_store(&g.closed, 0);
    pthread_join(th, NULL);
    ck_assert_msg(c.rc == 0, "checkpoint: %s (%s)", zo_strerror(c.rc), c.detail);
    zo_ckpt_reader *rd;
    ck_assert_int_eq(zo_ckpt_open(&rd, e.root, "c1"), 0);
    unsigned ib;
    ck_assert_int_eq(zo_ckpt_find(rd, "b", &ib), 0);
    uint8_t *got = malloc(n), *want = malloc(n);
    ck_assert_int_eq(zo_ckpt_read(rd, ib, 0, got, n), 0);
    fill(want, n, 12);
    ck_assert(memcmp(got, want, n) == 0);
    zo_ckpt_close(&rd);
    /* done: unregister works again */
    ck_assert_int_eq(zo_store_unregister(e.st, &b), 0);
    ck_assert_ptr_null(b);
    /* a stale handle in ts is refused, not used */
    zo_tensor *stale[2] = {a, bb};
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "c2", stale, 2, 0, NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(zo_store_errmsg(e.st), "ts[1]"));
    /* a tensor twice: refused by the writer, and the pins all come off */
    zo_tensor *twice[2] = {a, a};
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "c3", twice, 2, 0, NULL), -EEXIST);
    ck_assert_int_eq(zo_store_unregister(e.st, &a), 0);
    free(got);
    free(want);
    env_close(&e);
}
END_TEST

/* The same for a restore: it looked its tensors up, dropped the lock, and
 * used them later; an unregister in between freed one under it. */
START_TEST(test_store_restore_pins)
{
    env e;
    env_open(&e);
    const uint64_t n = 300 * KiB + 11;
    zo_tensor *a = reg(&e, "a", n, ZO_TIER_NVME, 21), *b = reg(&e, "b", n, ZO_TIER_NVME, 22);
    zo_tensor *both[] = {a, b};
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "c1", both, 2, 0, NULL), 0);
    uint8_t *junk = malloc(n);
    fill(junk, n, 99);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, junk, n), 0);
    ck_assert_int_eq(zo_store_write(e.st, b, 0, junk, n), 0);
    /* hold the restore's first write home (a's) */
    gate g = {.op = ZO__OP_WRITE};
    atomic_store(&g.closed, 1);
    zo__aio_set_fault(zo_swap_get_aio(e.swap), gate_hook, &g);
    call c = {.e = &e, .restore = 1};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_call, &c), 0);
    gate_wait_held(&g);
    zo_tensor *bb = b;
    int rc = zo_store_unregister(e.st, &bb);
    ck_assert_msg(rc == -EBUSY, "unregister of a tensor being restored: %d (%s)", rc, zo_store_errmsg(e.st));
    ck_assert_ptr_eq(bb, b);
    /* nor can a checkpoint of it start */
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "c2", &bb, 1, 0, NULL), -EBUSY);
    atomic_store(&g.closed, 0);
    pthread_join(th, NULL);
    ck_assert_msg(c.rc == 0, "restore: %s (%s)", zo_strerror(c.rc), c.detail);
    ck_assert(holds(&e, a, n, 21));
    ck_assert(holds(&e, b, n, 22));
    ck_assert_int_eq(zo_store_unregister(e.st, &b), 0);
    free(junk);
    env_close(&e);
}
END_TEST

/* ---- restore2: user JSON, one read, the state after a damaged checkpoint ---------------- */
START_TEST(test_store_restore_user_json)
{
    env e;
    env_open(&e);
    const uint64_t n = 100 * KiB;
    zo_tensor *a = reg(&e, "a", n, ZO_TIER_HOST, 31);
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "s7", NULL, 0, 0, "{\"step\": 7, \"lr\": 0.5}"), 0);
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "s8", NULL, 0, 0, NULL), 0);
    /* a name taken: the store's detail says so (it was empty when the
     * checkpoint could not even begin; zo_optim_save passes it on) */
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "s8", NULL, 0, 0, NULL), -EEXIST);
    ck_assert_msg(strstr(zo_store_errmsg(e.st), "zo_store_checkpoint") && strstr(zo_store_errmsg(e.st), "s8"), "%s",
                  zo_store_errmsg(e.st));
    uint8_t *junk = malloc(n);
    fill(junk, n, 98);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, junk, n), 0);
    char *uj = (char *)1;
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, "s7", NULL, &uj), 0);
    ck_assert_ptr_nonnull(uj);
    ck_assert_str_eq(uj, "{\"step\":7,\"lr\":0.5}");
    free(uj);
    ck_assert(holds(&e, a, n, 31));
    /* latest (s8) has none: "" */
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, NULL, NULL, &uj), 0);
    ck_assert_str_eq(uj, "");
    free(uj);
    /* options: versioned struct, known flags; a failure leaves *user_json NULL */
    zo_store_restore_options o;
    zo_store_restore_options_default(&o);
    ck_assert_uint_eq(o.struct_size, sizeof(o));
    ck_assert_uint_eq(o.flags, 0);
    o.flags = ZO_RESTORE_VERIFY_FIRST;
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, "s7", &o, &uj), 0);
    ck_assert_str_eq(uj, "{\"step\":7,\"lr\":0.5}");
    free(uj);
    o.flags = 1u << 7;
    uj = (char *)1;
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, "s7", &o, &uj), -EINVAL);
    ck_assert_ptr_null(uj);
    o.flags = 0;
    o.struct_size = 3;
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, "s7", &o, &uj), -EINVAL);
    ck_assert_ptr_nonnull(strstr(zo_store_errmsg(e.st), "struct_size"));
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, "nope", NULL, &uj), -ENOENT);
    ck_assert_ptr_null(uj);
    ck_assert_int_eq(zo_store_restore2(NULL, e.root, NULL, NULL, &uj), -EINVAL);
    free(junk);
    env_close(&e);
}
END_TEST

/* Bytes this process has read through read(2)/pread(2) so far; -1 without
 * task I/O accounting. */
static long long rchar(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    if (!f)
        return -1;
    char line[128];
    long long v = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "rchar: %lld", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* Flip one byte of tensor `name`'s data in the data file. */
static void corrupt(const char *root, const char *ck, const char *name, uint64_t off)
{
    zo_ckpt_reader *rd;
    ck_assert_int_eq(zo_ckpt_open(&rd, root, ck), 0);
    unsigned i;
    ck_assert_int_eq(zo_ckpt_find(rd, name, &i), 0);
    zo_ckpt_close(&rd);
    ck_assert_int_eq(zo_test_ckpt_corrupt(root, ck, name, off), 0);
}

/* The checkpoint is read once: the bytes read(2) during a restore are
 * about the checkpoint's data, not twice that (it used to verify every
 * checksum in a first pass, then read everything again to load it).
 * ZO_RESTORE_VERIFY_FIRST reads it twice. The engines read with pread here
 * (io_uring forced off) so /proc/self/io counts what they read. */
START_TEST(test_store_restore_one_read)
{
    zo__aio_force_uring_unusable("test: count reads in /proc/self/io");
    if (rchar() < 0)
        ZO_TEST_SKIP("no /proc/self/io (task I/O accounting): cannot count the bytes read");
    env e;
    env_open(&e);
    const uint64_t n = 400 * KiB + 7;
    zo_tensor *a = reg(&e, "a", n, ZO_TIER_NVME, 41), *b = reg(&e, "b", n, ZO_TIER_HOST, 42);
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "r1", NULL, 0, 0, NULL), 0);
    uint8_t *junk = malloc(n);
    fill(junk, n, 97);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, junk, n), 0);
    ck_assert_int_eq(zo_store_write(e.st, b, 0, junk, n), 0);
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    long long r0 = rchar();
    ck_assert_int_eq(zo_store_restore(e.st, e.root, "r1"), 0);
    long long one = rchar() - r0;
    ck_assert(holds(&e, a, n, 41));
    ck_assert(holds(&e, b, n, 42));
    ck_assert_int_eq(zo_store_write(e.st, a, 0, junk, n), 0);
    zo_store_restore_options o;
    zo_store_restore_options_default(&o);
    o.flags = ZO_RESTORE_VERIFY_FIRST;
    r0 = rchar();
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, "r1", &o, NULL), 0);
    long long two = rchar() - r0;
    ck_assert(holds(&e, a, n, 41));
    fprintf(stderr, "restore of %llu data bytes read %lld bytes (one read), %lld (verify first)\n",
            (unsigned long long)(2 * n), one, two);
    ck_assert_msg(one >= (long long)(2 * n) && one < (long long)(3 * n), "one read: %lld bytes for %llu", one,
                  (unsigned long long)(2 * n));
    ck_assert_msg(two >= (long long)(4 * n), "verify first: %lld bytes for %llu", two, (unsigned long long)(2 * n));
    free(junk);
    env_close(&e);
}
END_TEST

/* A damaged checkpoint (one flipped byte in the second chunk of b, of a,
 * b, c): the restore fails with ZO_ECORRUPT naming b; a is restored, c is
 * untouched, b's first chunk (verified) is loaded and its damaged chunk
 * never written. With ZO_RESTORE_VERIFY_FIRST nothing changes. */
START_TEST(test_store_restore_corrupt)
{
    env e;
    env_open(&e);
    const uint64_t n = 200 * KiB + 5;
    zo_tensor *a = reg(&e, "a", n, ZO_TIER_NVME, 51), *b = reg(&e, "b", n, ZO_TIER_NVME, 52),
              *c = reg(&e, "c", n, ZO_TIER_HOST, 53);
    zo_tensor *all[] = {a, b, c};
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.root, "d1", all, 3, 0, "{\"k\":1}"), 0);
    corrupt(e.root, "d1", "b", 64 * KiB + 100);
    zo_tensor *t[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        uint8_t *j = malloc(n);
        fill(j, n, 90 + (uint64_t)i);
        ck_assert_int_eq(zo_store_write(e.st, t[i], 0, j, n), 0);
        free(j);
    }
    /* verify first: nothing changes */
    zo_store_restore_options o;
    zo_store_restore_options_default(&o);
    o.flags = ZO_RESTORE_VERIFY_FIRST;
    char *uj = (char *)1;
    ck_assert_int_eq(zo_store_restore2(e.st, e.root, "d1", &o, &uj), ZO_ECORRUPT);
    ck_assert_ptr_null(uj);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(holds(&e, t[i], n, 90 + (uint64_t)i), "tensor %d changed by a verify-first restore", i);
    /* one read: a restored, b partly, c untouched */
    int rc = zo_store_restore2(e.st, e.root, "d1", NULL, &uj);
    ck_assert_int_eq(rc, ZO_ECORRUPT);
    ck_assert_ptr_null(uj);
    const char *why = zo_store_errmsg(e.st);
    ck_assert_msg(strstr(why, "'b'") && strstr(why, "partly loaded"), "detail: %s", why);
    ck_assert(holds(&e, a, n, 51));
    ck_assert(holds(&e, c, n, 92));
    uint8_t *got = malloc(n), *want = malloc(n), *old = malloc(n);
    ck_assert_int_eq(zo_store_read(e.st, b, 0, got, n), 0);
    fill(want, n, 52);
    fill(old, n, 91);
    ck_assert_msg(memcmp(got, want, 64 * KiB) == 0, "b's verified first chunk was not loaded");
    /* the damaged chunk was never written: b's old bytes are there, not
     * the checkpoint's (minus one flipped bit) */
    ck_assert_msg(memcmp(got + 64 * KiB, old + 64 * KiB, 64 * KiB) == 0, "b's damaged chunk was written");
    ck_assert_int_eq(zo_store_unregister(e.st, &b), 0); /* nothing stays pinned */
    free(got);
    free(want);
    free(old);
    env_close(&e);
}
END_TEST

int main(void)
{
    zo_log_set_level(ZO_LOG_ERROR);
    if (!(zo_build_features() & ZO_BUILD_CJSON))
        ZO_TEST_SKIP("built without libcjson: no checkpoints");
    Suite *s = suite_create("store-ckpt");
    TCase *tc = tcase_create("store-ckpt");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_store_test_pending);
    tcase_add_test(tc, test_store_ckpt_pins);
    tcase_add_test(tc, test_store_restore_pins);
    tcase_add_test(tc, test_store_restore_user_json);
    tcase_add_test(tc, test_store_restore_one_read);
    tcase_add_test(tc, test_store_restore_corrupt);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
