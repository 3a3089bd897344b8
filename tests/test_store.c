/* SPDX-License-Identifier: Apache-2.0 */
/* Tiered store on the host device backend (the reference: "device memory"
 * is host memory capped by host_mem_limit), real pinned memory and a real
 * swap store: exact contents through every tier pair, a tensor larger than
 * the pool, budgets, eviction with write-back, streams, checkpoints of
 * tensors in any tier, corruption surfacing through acquire, a randomized
 * model test (budgets asserted at every step), and trace-driven prefetch
 * (stalls with prefetch < 5% of stalls without, on a replayed sequence
 * whose I/O fits in the compute time between accesses). */
#include <fcntl.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "zo_test.h"
#include "zo_test_dev.h"

#include <zoffload/zoffload.h>

#include "aio/aio_internal.h"
#include "dev/dev_internal.h"
#include "store/store_internal.h"

#include "store_env.h"

/* pinned memory the process held once the store was created: the store
 * allocates none after that, whatever it moves */
static size_t env_pinned;

static size_t pinned_now(void)
{
    zo_pinned_stats ps;
    zo_pinned_stats_get(&ps);
    return ps.locked_bytes + ps.unlocked_bytes;
}

/* set: the next env_open() gives the swap store a 4-thread pread/pwrite
 * engine (a test hook that blocks one I/O leaves the others running) */
static int env_threads_aio;
/* set: the next env_open() uses this prefetch cap (0: the default) */
static uint64_t env_prefetch_bytes;

static void env_open(env *e, uint64_t dev_bytes, uint64_t host_bytes, size_t slot, unsigned slots, size_t chunk,
                     zo_trace_mode trace)
{
    env_opts o = env_opts_sized(dev_bytes, host_bytes, slot, slots, chunk);
    o.trace = trace;
    o.trace_set = 1;
    o.prefetch_bytes = env_prefetch_bytes;
    o.aio_threads = env_threads_aio ? 4 : 0;
    env_open_with(e, &o);
    env_pinned = pinned_now();
}

static void pattern(uint8_t *p, size_t n, uint64_t id, uint64_t ver)
{
    zo_test_rng r = {(id * 0x9e3779b97f4a7c15ull) ^ (ver * 0xc2b2ae3d27d4eb4full) ^ 0x5bd1e995u};
    zo_test_next(&r);
    zo_test_fill_bytes(&r, p, n);
}

static zo_tensor *reg(zo_store *s, const char *name, uint64_t bytes, zo_tier home)
{
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.name = name;
    d.bytes = bytes;
    d.dtype = ZO_DTYPE_U8;
    d.home = home;
    zo_tensor *t = NULL;
    int r = zo_store_register(s, &d, &t);
    ck_assert_msg(r == 0, "register %s: %s (%s)", name, zo_strerror(r), zo_last_error_detail());
    return t;
}

static void *acq(zo_store *s, zo_tensor *t, zo_tier x, unsigned flags)
{
    zo_store_req *q;
    int r = zo_store_acquire(s, t, x, flags, &q);
    ck_assert_msg(r == 0, "acquire: %s (%s)", zo_strerror(r), zo_last_error_detail());
    void *p = NULL;
    r = zo_store_wait(s, q, &p);
    ck_assert_msg(r == 0, "wait: %s (%s)", zo_strerror(r), zo_last_error_detail());
    ck_assert_ptr_nonnull(p);
    return p;
}

static void check_budgets(zo_store *s, const zo_store_config *c)
{
    zo_store_stats st;
    zo_store_get_stats(s, &st);
    for (int x = 0; x < ZO_TIER_COUNT; x++) {
        ZO_EXPECT(st.used[x] <= st.budget[x], "tier %s: used %llu > budget %llu", zo_tier_name((zo_tier)x),
                  (unsigned long long)st.used[x], (unsigned long long)st.budget[x]);
        ZO_EXPECT(st.peak[x] <= st.budget[x], "tier %s: peak over budget", zo_tier_name((zo_tier)x));
    }
    ZO_EXPECT(st.pool_in_use <= st.pool_slots && st.pool_peak <= st.pool_slots, "pool: %zu/%zu slots (peak %zu)",
              st.pool_in_use, st.pool_slots, st.pool_peak);
    ZO_EXPECT(st.pinned_bytes == c->host_bytes + (uint64_t)c->slots * c->slot_size,
              "pinned %llu != host tier + pool", (unsigned long long)st.pinned_bytes);
    size_t now = pinned_now();
    ZO_EXPECT(now == env_pinned, "pinned memory in use %zu, %zu after create", now, env_pinned);
    pthread_mutex_lock(&s->lock);
    uint64_t bad = s->bad_transitions;
    pthread_mutex_unlock(&s->lock);
    ZO_EXPECT(bad == 0, "%llu illegal copy state transitions (see the log)", (unsigned long long)bad);
}

/* Every tier pair, exact bytes. */
START_TEST(test_store_tiers)
{
    env e;
    env_open(&e, 8 * MiB, 8 * MiB, 256 * KiB, 6, 64 * KiB, ZO_TRACE_OFF);
    const uint64_t n = 700 * KiB + 123;
    zo_tier homes[] = {ZO_TIER_NVME, ZO_TIER_HOST, ZO_TIER_DEVICE};
    uint8_t *want = malloc(n), *got = malloc(n);
    for (int h = 0; h < 3; h++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "t-%s", zo_tier_name(homes[h]));
        zo_tensor *t = reg(e.st, nm, n, homes[h]);
        /* zeros at first, wherever it lives */
        ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
        for (uint64_t k = 0; k < n; k++)
            ZO_EXPECT(got[k] == 0, "%s byte %llu not zero", nm, (unsigned long long)k);
        pattern(want, n, (uint64_t)h, 1);
        ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
        for (int x = 0; x < 2; x++) {
            uint8_t *p = acq(e.st, t, (zo_tier)x, 0);
            ck_assert_msg(memcmp(p, want, n) == 0, "%s in %s differs", nm, zo_tier_name((zo_tier)x));
            ck_assert_int_eq(zo_store_release(e.st, t, (zo_tier)x, 0), 0);
        }
        /* modify on the device, read it back through host and the API */
        uint8_t *d = acq(e.st, t, ZO_TIER_DEVICE, ZO_ACQ_WRITE);
        pattern(want, n, (uint64_t)h, 2);
        memcpy(d, want, n);
        zo_tensor_info ti;
        ck_assert_int_eq(zo_store_tensor_info(e.st, t, &ti), 0);
        ck_assert_uint_eq(ti.refs[ZO_TIER_DEVICE], 1);
        ck_assert_int_eq(ti.state[ZO_TIER_DEVICE], ZO_COPY_RESIDENT);
        if (homes[h] != ZO_TIER_DEVICE) {
            ck_assert_int_eq(ti.dirty[ZO_TIER_DEVICE], 1);
            ck_assert_int_eq(ti.state[homes[h]], ZO_COPY_ABSENT); /* stale */
        }
        /* another tier cannot be acquired while it is held for writing */
        zo_store_req *q;
        ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_HOST, 0, &q), -EBUSY);
        /* unknown release flags: refused, the reference is kept */
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0x100), -EINVAL);
        ck_assert_int_eq(zo_store_tensor_info(e.st, t, &ti), 0);
        ck_assert_uint_eq(ti.refs[ZO_TIER_DEVICE], 1);
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0), 0);
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0), ZO_ESTATE);
        uint8_t *hp = acq(e.st, t, ZO_TIER_HOST, 0);
        ck_assert_msg(memcmp(hp, want, n) == 0, "%s: device->host differs", nm);
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_HOST, 0), 0);
        ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
        ck_assert_int_eq(zo_store_tensor_info(e.st, t, &ti), 0);
        ck_assert_int_eq(ti.state[homes[h]], ZO_COPY_RESIDENT);
        ck_assert_int_eq(ti.dirty[ZO_TIER_DEVICE], 0);
        memset(got, 0, n);
        ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
        ck_assert_msg(memcmp(got, want, n) == 0, "%s: read after flush differs", nm);
        /* partial unaligned rewrite through the API */
        uint8_t patch[1000];
        pattern(patch, sizeof(patch), 99, (uint64_t)h);
        ck_assert_int_eq(zo_store_write(e.st, t, 300 * KiB - 17, patch, sizeof(patch)), 0);
        memcpy(want + 300 * KiB - 17, patch, sizeof(patch));
        ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
        ck_assert_msg(memcmp(got, want, n) == 0, "%s: partial write differs", nm);
        ck_assert_int_eq(zo_store_read(e.st, t, 299 * KiB, got, 5 * KiB), 0);
        ck_assert(memcmp(got, want + 299 * KiB, 5 * KiB) == 0);
        /* a discard acquire loads nothing and becomes the current copy */
        uint8_t *dd = acq(e.st, t, ZO_TIER_HOST, ZO_ACQ_DISCARD);
        pattern(want, n, (uint64_t)h, 3);
        memcpy(dd, want, n);
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_HOST, ZO_REL_WRITEBACK), 0);
        ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
        ck_assert_msg(memcmp(got, want, n) == 0, "%s: discard+write differs", nm);
        check_budgets(e.st, &e.cfg);
    }
    zo_tensor *t;
    ck_assert_int_eq(zo_store_find(e.st, "t-host", &t), 0);
    ck_assert_int_eq(zo_store_find(e.st, "nope", &t), -ENOENT);
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.name = "t-host";
    d.bytes = 10;
    ck_assert_int_eq(zo_store_register(e.st, &d, &t), -EEXIST);
    d.name = "";
    ck_assert_int_eq(zo_store_register(e.st, &d, &t), -EINVAL);
    d.name = "shape";
    d.ndim = 2;
    d.shape[0] = 3;
    d.shape[1] = 5;
    d.bytes = 0;
    d.dtype = ZO_DTYPE_F32;
    ck_assert_int_eq(zo_store_register(e.st, &d, &t), 0);
    zo_tensor_info ti;
    zo_store_tensor_info(e.st, t, &ti);
    ck_assert_uint_eq(ti.bytes, 60);
    d.name = "mismatch";
    d.bytes = 61;
    ck_assert_int_eq(zo_store_register(e.st, &d, &t), -EINVAL);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_NVME, 0, &q), -EINVAL);
    free(want);
    free(got);
    env_close(&e);
}
END_TEST

/* A tensor 10x larger than the pool moves NVMe <-> device in slot-sized
 * pieces; pinned memory stays what was configured. */
START_TEST(test_store_big_through_pool)
{
    env e;
    env_open(&e, 16 * MiB, 0, 128 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    const uint64_t n = 5 * MiB + 4097;
    zo_tensor *t = reg(e.st, "big", n, ZO_TIER_NVME);
    uint8_t *want = malloc(n), *got = malloc(n);
    pattern(want, n, 7, 1);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
    uint8_t *d = acq(e.st, t, ZO_TIER_DEVICE, ZO_ACQ_WRITE);
    ck_assert(memcmp(d, want, n) == 0);
    for (uint64_t k = 0; k < n; k += 4096)
        d[k] ^= 0x5a;
    memcpy(want, d, n);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, ZO_REL_DROP), 0);
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    zo_tensor_info ti;
    zo_store_tensor_info(e.st, t, &ti);
    ck_assert_int_eq(ti.state[ZO_TIER_DEVICE], ZO_COPY_ABSENT); /* dropped after its write-back */
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
    ck_assert(memcmp(got, want, n) == 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_ge(st.moved[ZO_TIER_NVME][ZO_TIER_DEVICE], n);
    ck_assert_uint_ge(st.moved[ZO_TIER_DEVICE][ZO_TIER_NVME], n);
    ck_assert_uint_le(st.pool_peak, 4);
    ck_assert_uint_eq(st.pinned_bytes, 4 * 128 * KiB);
    /* the pool is registered with the device and, as fixed buffers, with
     * io_uring (root or a large enough RLIMIT_MEMLOCK), and used as such */
    ck_assert_int_eq(st.pool_dev_registered, 1);
    zo_aio *aio = zo_swap_get_aio(e.swap);
    if (st.pool_locked && zo_aio_get_backend(aio) == ZO_AIO_URING) {
        zo_aio_info ai;
        zo_aio_get_info(aio, &ai);
        if (ai.fixed_buffers) {
            ck_assert_int_eq(st.pool_aio_fixed, 1);
            zo_aio_stats as;
            zo_aio_get_stats(aio, &as);
            ck_assert_uint_gt(as.fixed_chunks, 0);
        }
    }
    zo_pinned_stats ps;
    zo_pinned_stats_get(&ps);
    ck_assert_uint_le(ps.locked_bytes + ps.unlocked_bytes, 4 * 128 * KiB + 2 * MiB); /* pool only (page-rounded) */
    check_budgets(e.st, &e.cfg);
    free(want);
    free(got);
    env_close(&e);
}
END_TEST

START_TEST(test_store_budget_evict)
{
    env e;
    /* device tier: room for two 1 MiB tensors */
    env_open(&e, 2 * MiB + 64 * KiB, 4 * MiB, 256 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    zo_tensor *t[3];
    uint8_t *want[3];
    for (int i = 0; i < 3; i++) {
        char nm[8];
        snprintf(nm, sizeof(nm), "e%d", i);
        t[i] = reg(e.st, nm, MiB, ZO_TIER_NVME);
        want[i] = malloc(MiB);
        pattern(want[i], MiB, (uint64_t)i, 1);
        ck_assert_int_eq(zo_store_write(e.st, t[i], 0, want[i], MiB), 0);
    }
    zo_tensor *huge = reg(e.st, "huge", 3 * MiB, ZO_TIER_NVME);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, huge, ZO_TIER_DEVICE, 0, &q), ZO_EBUDGET);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "huge"));
    /* modify e0 and e1 on the device, keep both referenced: e2 cannot fit */
    for (int i = 0; i < 2; i++) {
        uint8_t *d = acq(e.st, t[i], ZO_TIER_DEVICE, ZO_ACQ_WRITE);
        pattern(want[i], MiB, (uint64_t)i, 2);
        memcpy(d, want[i], MiB);
    }
    ck_assert_int_eq(zo_store_acquire(e.st, t[2], ZO_TIER_DEVICE, 0, &q), 0);
    void *p;
    ck_assert_int_eq(zo_store_wait(e.st, q, &p), ZO_EBUDGET);
    ck_assert_ptr_null(p);
    zo_tensor_info ti;
    zo_store_tensor_info(e.st, t[2], &ti);
    ck_assert_uint_eq(ti.refs[ZO_TIER_DEVICE], 0);
    /* release e0 (least recently used): e2 evicts it, writing it back first */
    ck_assert_int_eq(zo_store_release(e.st, t[0], ZO_TIER_DEVICE, 0), 0);
    uint8_t *d2 = acq(e.st, t[2], ZO_TIER_DEVICE, 0);
    ck_assert(memcmp(d2, want[2], MiB) == 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_ge(st.writebacks, 1);
    ck_assert_uint_ge(st.evictions, 1);
    zo_store_tensor_info(e.st, t[0], &ti);
    ck_assert_int_eq(ti.state[ZO_TIER_DEVICE], ZO_COPY_ABSENT);
    ck_assert_int_eq(ti.state[ZO_TIER_NVME], ZO_COPY_RESIDENT);
    uint8_t *got = malloc(MiB);
    ck_assert_int_eq(zo_store_read(e.st, t[0], 0, got, MiB), 0);
    ck_assert(memcmp(got, want[0], MiB) == 0);
    ck_assert_int_eq(zo_store_release(e.st, t[1], ZO_TIER_DEVICE, 0), 0);
    ck_assert_int_eq(zo_store_release(e.st, t[2], ZO_TIER_DEVICE, 0), 0);
    /* unregister: refused while referenced, fine after */
    uint8_t *h = acq(e.st, t[1], ZO_TIER_HOST, 0);
    ck_assert(memcmp(h, want[1], MiB) == 0);
    ck_assert_int_eq(zo_store_unregister(e.st, &t[1]), -EBUSY);
    ck_assert_int_eq(zo_store_release(e.st, t[1], ZO_TIER_HOST, 0), 0);
    ck_assert_int_eq(zo_store_unregister(e.st, &t[1]), 0);
    ck_assert_ptr_null(t[1]);
    check_budgets(e.st, &e.cfg);
    free(got);
    for (int i = 0; i < 3; i++)
        free(want[i]);
    env_close(&e);
}
END_TEST

/* The optimizer's pattern: three tensors walked in lockstep, read-ahead 2,
 * updated in the slot, written behind. */
START_TEST(test_store_streams)
{
    env e;
    env_open(&e, 0, 0, 64 * KiB, 13, 64 * KiB, ZO_TRACE_OFF);
    const uint64_t nel = (3 * MiB + 1000) / 4, n = nel * 4;
    zo_tensor *w = reg(e.st, "master", n, ZO_TIER_NVME), *m = reg(e.st, "m", n, ZO_TIER_NVME),
              *v = reg(e.st, "v", n, ZO_TIER_NVME);
    float *init = malloc(n);
    for (uint64_t i = 0; i < nel; i++)
        init[i] = (float)i;
    ck_assert_int_eq(zo_store_write(e.st, w, 0, init, n), 0);
    zo_store_stream *sw, *sm, *sv, *extra;
    unsigned mode = ZO_STREAM_READ | ZO_STREAM_WRITE;
    ck_assert_int_eq(zo_store_stream_open(e.st, w, mode, 2, &sw), 0);
    ck_assert_int_eq(zo_store_stream_open(e.st, m, mode, 2, &sm), 0);
    ck_assert_int_eq(zo_store_stream_open(e.st, v, mode, 2, &sv), 0);
    /* 12 slots reserved, one left for transfers: no room for a fourth */
    ck_assert_int_eq(zo_store_stream_open(e.st, v, ZO_STREAM_READ, 1, &extra), -EBUSY);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, w, ZO_TIER_NVME, 0, &q), -EINVAL);
    for (int step = 0;; step++) {
        zo_store_piece pw, pm, pv;
        ck_assert_int_eq(zo_store_stream_next(sw, &pw), 0);
        ck_assert_int_eq(zo_store_stream_next(sm, &pm), 0);
        ck_assert_int_eq(zo_store_stream_next(sv, &pv), 0);
        if (!pw.len) {
            ck_assert_uint_eq(pm.len, 0);
            break;
        }
        ck_assert_uint_eq(pw.off, pm.off);
        ck_assert_uint_eq(pw.len, pv.len);
        ck_assert_uint_eq(pw.index, (unsigned)step);
        float *fw = pw.host, *fm = pm.host, *fv = pv.host;
        for (size_t i = 0; i < pw.len / 4; i++) {
            fm[i] = fw[i] * 0.5f;
            fv[i] = fw[i] + 1.0f;
            fw[i] = -fw[i];
        }
        ck_assert_int_eq(zo_store_stream_done(sw, &pw), 0);
        ck_assert_int_eq(zo_store_stream_done(sm, &pm), 0);
        ck_assert_int_eq(zo_store_stream_done(sv, &pv), 0);
    }
    ck_assert_int_eq(zo_store_stream_close(&sw), 0);
    ck_assert_int_eq(zo_store_stream_close(&sm), 0);
    ck_assert_int_eq(zo_store_stream_close(&sv), 0);
    ck_assert_ptr_null(sw);
    float *got = malloc(n);
    ck_assert_int_eq(zo_store_read(e.st, w, 0, got, n), 0);
    for (uint64_t i = 0; i < nel; i++)
        ZO_EXPECT(got[i] == -(float)i, "master[%llu] = %g", (unsigned long long)i, (double)got[i]);
    ck_assert_int_eq(zo_store_read(e.st, m, 0, got, n), 0);
    for (uint64_t i = 0; i < nel; i++)
        ZO_EXPECT(got[i] == (float)i * 0.5f, "m[%llu] = %g", (unsigned long long)i, (double)got[i]);
    ck_assert_int_eq(zo_store_read(e.st, v, 0, got, n), 0);
    for (uint64_t i = 0; i < nel; i++)
        ZO_EXPECT(got[i] == (float)i + 1.0f, "v[%llu] = %g", (unsigned long long)i, (double)got[i]);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_le(st.pool_peak, 13);
    check_budgets(e.st, &e.cfg);
    free(init);
    free(got);
    env_close(&e);
}
END_TEST

/* Corruption in an arena surfaces through acquire, naming the tensor. */
START_TEST(test_store_corrupt)
{
    env e;
    env_open(&e, 4 * MiB, 4 * MiB, 64 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    const uint64_t n = 256 * KiB;
    zo_tensor *t = reg(e.st, "decoder.7.w", n, ZO_TIER_NVME);
    uint8_t *want = malloc(n);
    pattern(want, n, 1, 1);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
    DIR *d = opendir(e.dir);
    struct dirent *de;
    int flipped = 0;
    uint8_t *buf = malloc(16 * MiB);
    while (!flipped && (de = readdir(d))) {
        if (strncmp(de->d_name, "zo-swap.", 8))
            continue;
        char p[4400];
        snprintf(p, sizeof(p), "%s/%s", e.dir, de->d_name);
        int fd = open(p, O_RDWR);
        ssize_t got = pread(fd, buf, 16 * MiB, 0);
        for (ssize_t o = 0; got > 0 && o + 64 <= got; o += 4096)
            if (memcmp(buf + o, want + 128 * KiB, 64) == 0) {
                uint8_t b = (uint8_t)~buf[o + 5];
                ck_assert_int_eq(pwrite(fd, &b, 1, o + 5), 1);
                flipped = 1;
                break;
            }
        close(fd);
    }
    closedir(d);
    free(buf);
    ck_assert(flipped);
    for (int x = 0; x < 2; x++) {
        zo_store_req *q;
        ck_assert_int_eq(zo_store_acquire(e.st, t, (zo_tier)x, 0, &q), 0);
        ck_assert_int_eq(zo_store_wait(e.st, q, NULL), ZO_ECORRUPT);
        const char *msg = zo_last_error_detail();
        ck_assert_msg(strstr(msg, "'decoder.7.w'") && strstr(msg, "offset 131072"), "detail: %s", msg);
        zo_tensor_info ti;
        zo_store_tensor_info(e.st, t, &ti);
        ck_assert_uint_eq(ti.refs[x], 0);
        ck_assert_int_eq(ti.state[x], ZO_COPY_ABSENT);
    }
    uint8_t *got = malloc(n);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), ZO_ECORRUPT);
    /* rewriting repairs it */
    ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
    ck_assert(memcmp(got, want, n) == 0);
    free(want);
    free(got);
    env_close(&e);
}
END_TEST

/* Checkpoint of tensors wherever they live (dirty device copy, host home,
 * NVMe home), then restore over modified contents. */
START_TEST(test_store_checkpoint)
{
    env e;
    env_open(&e, 4 * MiB, 4 * MiB, 128 * KiB, 6, 64 * KiB, ZO_TRACE_OFF);
    char root[300];
    snprintf(root, sizeof(root), "%s/ckpt", e.dir);
    const uint64_t n = 300 * KiB + 5;
    zo_tensor *a = reg(e.st, "a", n, ZO_TIER_NVME), *b = reg(e.st, "b", n, ZO_TIER_HOST),
              *c = reg(e.st, "c", n, ZO_TIER_DEVICE);
    uint8_t *wa = malloc(n), *wb = malloc(n), *wc = malloc(n), *got = malloc(n);
    pattern(wa, n, 1, 1);
    pattern(wb, n, 2, 1);
    pattern(wc, n, 3, 1);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, wa, n), 0);
    ck_assert_int_eq(zo_store_write(e.st, b, 0, wb, n), 0);
    ck_assert_int_eq(zo_store_write(e.st, c, 0, wc, n), 0);
    /* a's current copy is a dirty device copy, not written back */
    uint8_t *d = acq(e.st, a, ZO_TIER_DEVICE, ZO_ACQ_WRITE);
    pattern(wa, n, 1, 2);
    memcpy(d, wa, n);
    ck_assert_int_eq(zo_store_checkpoint(e.st, root, "s1", NULL, 0, 0, "{\"step\":1}"), -EBUSY);
    ck_assert_int_eq(zo_store_release(e.st, a, ZO_TIER_DEVICE, 0), 0);
    ck_assert_int_eq(zo_store_checkpoint(e.st, root, "s1", NULL, 0, 2, "{\"step\":1}"), 0);
    char latest[200];
    ck_assert_int_eq(zo_ckpt_latest(root, latest, sizeof(latest)), 0);
    ck_assert_str_eq(latest, "s1");
    zo_ckpt_reader *rd;
    ck_assert_int_eq(zo_ckpt_open(&rd, root, NULL), 0);
    ck_assert_uint_eq(zo_ckpt_count(rd), 3);
    ck_assert_str_eq(zo_ckpt_user_json(rd), "{\"step\":1}");
    unsigned ia;
    ck_assert_int_eq(zo_ckpt_find(rd, "a", &ia), 0);
    ck_assert_int_eq(zo_ckpt_read(rd, ia, 0, got, n), 0);
    ck_assert(memcmp(got, wa, n) == 0);
    zo_ckpt_close(&rd);
    /* change everything, then restore */
    uint8_t *junk = malloc(n);
    pattern(junk, n, 9, 9);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, junk, n), 0);
    ck_assert_int_eq(zo_store_write(e.st, b, 0, junk, n), 0);
    uint8_t *hc = acq(e.st, c, ZO_TIER_HOST, ZO_ACQ_WRITE);
    memcpy(hc, junk, n);
    ck_assert_int_eq(zo_store_restore(e.st, root, NULL), -EBUSY); /* c is referenced */
    ck_assert_int_eq(zo_store_release(e.st, c, ZO_TIER_HOST, 0), 0);
    ck_assert_int_eq(zo_store_restore(e.st, root, NULL), 0);
    ck_assert_int_eq(zo_store_read(e.st, a, 0, got, n), 0);
    ck_assert(memcmp(got, wa, n) == 0);
    ck_assert_int_eq(zo_store_read(e.st, b, 0, got, n), 0);
    ck_assert(memcmp(got, wb, n) == 0);
    uint8_t *dc = acq(e.st, c, ZO_TIER_DEVICE, 0); /* c's home is the device */
    ck_assert(memcmp(dc, wc, n) == 0);
    ck_assert_int_eq(zo_store_release(e.st, c, ZO_TIER_DEVICE, 0), 0);
    /* a tensor the checkpoint has but the store lacks, and a size mismatch */
    zo_tensor *x = reg(e.st, "extra", 10, ZO_TIER_NVME);
    ck_assert_int_eq(zo_store_checkpoint(e.st, root, "s2", NULL, 0, 2, NULL), 0);
    ck_assert_int_eq(zo_store_unregister(e.st, &x), 0);
    ck_assert_int_eq(zo_store_restore(e.st, root, "s2"), -ENOENT);
    x = reg(e.st, "extra", 11, ZO_TIER_NVME);
    ck_assert_int_eq(zo_store_restore(e.st, root, "s2"), ZO_EFORMAT);
    ck_assert_int_eq(zo_store_checkpoint(e.st, root, "s2", NULL, 0, 2, NULL), -EEXIST);
    free(wa);
    free(wb);
    free(wc);
    free(got);
    free(junk);
    env_close(&e);
}
END_TEST

/* ---- randomized model test ------------------------------------------------------- */
enum { MT = 12 };
typedef struct mtensor {
    zo_tensor *t;
    uint64_t bytes;
    zo_tier home;
    uint64_t ver;
    unsigned refs[2];
    int write_held[2];
    int id;
} mtensor;

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* bytes the model knows cannot be evicted from tier x */
static uint64_t model_pinned(mtensor *m, int x, const mtensor *except)
{
    uint64_t b = 0;
    for (int i = 0; i < MT; i++) {
        if (!m[i].t)
            continue;
        uint64_t g = x == ZO_TIER_HOST ? 4096 : 256;
        if ((int)m[i].home == x || (m[i].refs[x] && &m[i] != except))
            b += round_up(m[i].bytes, g);
    }
    return b;
}

static int model_debug;
static void model_check_content(zo_store *s, mtensor *mt, const uint8_t *p)
{
    if (model_debug)
        fprintf(stderr, "  check m%d v%llu\n", mt->id, (unsigned long long)mt->ver);
    uint8_t *want = malloc(mt->bytes);
    pattern(want, mt->bytes, (uint64_t)mt->id, mt->ver);
    ZO_EXPECT(memcmp(p, want, mt->bytes) == 0, "tensor %d (v%llu) contents differ", mt->id,
              (unsigned long long)mt->ver);
    free(want);
}

START_TEST(test_store_model)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB, 64 * KiB, 6, 16 * KiB, ZO_TRACE_AUTO);
    mtensor m[MT];
    memset(m, 0, sizeof(m));
    model_debug = getenv("ZO_MODEL_DEBUG") != NULL;
    zo_test_rng rng = {zo_test_seed() ^ 0x77};
    int next_id = 0;
    unsigned nacq = 0, nebudget = 0, nebusy = 0, nwrites = 0, nregs = 0, nunregs = 0;
    uint8_t *tmp = malloc(400 * KiB);
    for (int step = 0; step < 2500; step++) {
        int i = (int)(zo_test_next(&rng) % MT);
        mtensor *mt = &m[i];
        unsigned op = (unsigned)(zo_test_next(&rng) % 100);
        if (model_debug && mt->t)
            fprintf(stderr, "step %d: m%d op %u refs %u/%u wh %d/%d\n", step, mt->id, op, mt->refs[0], mt->refs[1],
                    mt->write_held[0], mt->write_held[1]);
        if (!mt->t) {
            /* register (with initial contents) */
            zo_tier homes[] = {ZO_TIER_NVME, ZO_TIER_NVME, ZO_TIER_NVME, ZO_TIER_HOST, ZO_TIER_DEVICE};
            zo_tier home = homes[zo_test_next(&rng) % 5];
            uint64_t bytes = 1 + zo_test_next(&rng) % (home == ZO_TIER_NVME ? 300 * KiB : 120 * KiB);
            char nm[32];
            snprintf(nm, sizeof(nm), "m%d", next_id);
            zo_tensor_desc d;
            zo_tensor_desc_default(&d);
            d.name = nm;
            d.bytes = bytes;
            d.dtype = ZO_DTYPE_U8;
            d.home = home;
            zo_store_stats before;
            zo_store_get_stats(e.st, &before);
            int r = zo_store_register(e.st, &d, &mt->t);
            if (r == ZO_EBUDGET) {
                uint64_t g = home == ZO_TIER_HOST ? 4096 : 256;
                ZO_EXPECT(model_pinned(m, home, NULL) + round_up(bytes, g) > e.cfg.host_bytes ||
                              zo_store_errmsg(e.st)[0],
                          "register %s refused without reason", nm);
                mt->t = NULL;
                continue;
            }
            ck_assert_msg(r == 0, "register: %s (%s)", zo_strerror(r), zo_last_error_detail());
            mt->bytes = bytes;
            mt->home = home;
            if (model_debug)
                fprintf(stderr, "  register m%d home %d bytes %llu\n", next_id, home, (unsigned long long)bytes);
            mt->id = next_id++;
            mt->ver = 1;
            memset(mt->refs, 0, sizeof(mt->refs));
            memset(mt->write_held, 0, sizeof(mt->write_held));
            pattern(tmp, bytes, (uint64_t)mt->id, 1);
            ck_assert_int_eq(zo_store_write(e.st, mt->t, 0, tmp, bytes), 0);
            nregs++;
        } else if (op < 40) {
            /* acquire, read or write */
            int x = (int)(zo_test_next(&rng) % 2);
            int write = (zo_test_next(&rng) % 3) == 0;
            if (mt->refs[x] >= 2)
                continue;
            int busy = mt->write_held[!x] || (write && mt->refs[!x]);
            zo_store_req *q;
            int r = zo_store_acquire(e.st, mt->t, (zo_tier)x, write ? ZO_ACQ_WRITE : 0, &q);
            if (busy) {
                ZO_EXPECT(r == -EBUSY, "acquire should be busy, got %d", r);
                nebusy++;
                continue;
            }
            uint64_t g = x == ZO_TIER_HOST ? 4096 : 256;
            int must_fail = (int)mt->home != x && !mt->refs[x] &&
                            model_pinned(m, x, NULL) + round_up(mt->bytes, g) > (x ? e.cfg.host_bytes : e.cfg.device_bytes);
            void *p = NULL;
            if (r == 0)
                r = zo_store_wait(e.st, q, &p);
            if (r == ZO_EBUDGET) {
                zo_store_stats st;
                zo_store_get_stats(e.st, &st);
                ZO_EXPECT(must_fail || st.frag_failures > 0, "acquire refused (%s) though it fits",
                          zo_last_error_detail());
                nebudget++;
                continue;
            }
            ck_assert_msg(r == 0, "acquire %d in %s: %s (%s)", mt->id, zo_tier_name((zo_tier)x), zo_strerror(r),
                          zo_last_error_detail());
            ZO_EXPECT(!must_fail, "acquire succeeded though the model says it cannot fit");
            if (model_debug)
                fprintf(stderr, "  acquire m%d tier %d write %d\n", mt->id, x, write);
            model_check_content(e.st, mt, p);
            mt->refs[x]++;
            nacq++;
            if (write) {
                mt->ver++;
                mt->write_held[x] = 1;
                pattern(p, mt->bytes, (uint64_t)mt->id, mt->ver);
                nwrites++;
            }
        } else if (op < 75) {
            /* release a reference */
            int x = mt->refs[0] ? 0 : mt->refs[1] ? 1 : -1;
            if (x < 0)
                continue;
            unsigned fl = (unsigned)(zo_test_next(&rng) % 4);
            if (model_debug)
                fprintf(stderr, "  release m%d tier %d flags %u\n", mt->id, x, fl);
            ck_assert_int_eq(zo_store_release(e.st, mt->t, (zo_tier)x, fl), 0);
            if (--mt->refs[x] == 0)
                mt->write_held[x] = 0;
        } else if (op < 85) {
            ck_assert_int_eq(zo_store_prefetch(e.st, mt->t, (zo_tier)(zo_test_next(&rng) % 2)), 0);
        } else if (op < 92) {
            /* read back through the API (needs no writer anywhere) */
            if (mt->write_held[0] || mt->write_held[1])
                continue;
            ck_assert_int_eq(zo_store_read(e.st, mt->t, 0, tmp, mt->bytes), 0);
            model_check_content(e.st, mt, tmp);
        } else if (op < 95) {
            ck_assert_int_eq(zo_store_flush(e.st, (zo_test_next(&rng) & 1) ? mt->t : NULL), 0);
        } else if (op < 97) {
            ck_assert_int_eq(zo_store_step(e.st), 0);
        } else {
            int r = zo_store_unregister(e.st, &mt->t);
            if (mt->refs[0] || mt->refs[1]) {
                ZO_EXPECT(r == -EBUSY, "unregister of a referenced tensor: %d", r);
            } else {
                ck_assert_int_eq(r, 0);
                nunregs++;
            }
        }
        /* the store agrees with the model, within budget, at every step */
        check_budgets(e.st, &e.cfg);
        for (int k = 0; k < MT; k++) {
            if (!m[k].t)
                continue;
            zo_tensor_info ti;
            ck_assert_int_eq(zo_store_tensor_info(e.st, m[k].t, &ti), 0);
            ZO_EXPECT(ti.refs[0] == m[k].refs[0] && ti.refs[1] == m[k].refs[1] && ti.refs[2] == 0,
                      "step %d: refs of m%d: %u/%u vs model %u/%u", step, m[k].id, ti.refs[0], ti.refs[1],
                      m[k].refs[0], m[k].refs[1]);
            ZO_EXPECT(ti.bytes == m[k].bytes && ti.home == m[k].home, "m%d: size/home", m[k].id);
        }
    }
    /* everything released and flushed: each tensor reads back its last version */
    for (int k = 0; k < MT; k++) {
        if (!m[k].t)
            continue;
        for (int x = 0; x < 2; x++)
            while (m[k].refs[x]) {
                ck_assert_int_eq(zo_store_release(e.st, m[k].t, (zo_tier)x, 0), 0);
                m[k].refs[x]--;
            }
    }
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    for (int k = 0; k < MT; k++)
        if (m[k].t) {
            ck_assert_int_eq(zo_store_read(e.st, m[k].t, 0, tmp, m[k].bytes), 0);
            model_check_content(e.st, &m[k], tmp);
        }
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_gt(nacq, 300);
    ck_assert_uint_gt(nwrites, 80);
    ck_assert_uint_gt(nregs, 20);
    ck_assert_uint_gt(nunregs, 5);
    ck_assert_uint_gt(st.evictions, 20);
    ck_assert_uint_gt(st.writebacks, 5);
    fprintf(stderr, "model: %u acquires (%u writes), %u EBUDGET, %u EBUSY, %u registers, %u unregisters; "
            "%llu evictions, %llu write-backs, %llu prefetches issued\n",
            nacq, nwrites, nebudget, nebusy, nregs, nunregs, (unsigned long long)st.evictions,
            (unsigned long long)st.writebacks, (unsigned long long)st.prefetch_issued);
    free(tmp);
    env_close(&e);
}
END_TEST

/* A load still in flight when its data is replaced (a write acquire in another
 * tier) is stale. A later load into the same copy (a prefetch hint, the
 * trace) must wait for it to land, never start beside it: two loads into
 * one buffer race (the stale one can land last and overwrite the new
 * data), and the first to finish marks the copy resident while the other
 * still writes into it. */
static int wait_moved(zo_store *s, zo_tier from, zo_tier to, uint64_t n)
{
    for (int i = 0; i < 20000; i++) { /* 20 s */
        zo_store_stats st;
        zo_store_get_stats(s, &st);
        if (st.moved[from][to] >= n)
            return 1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

START_TEST(test_store_stale_load)
{
    /* the stale load goes NVMe -> device through small slots: slow,
     * so the fresh host -> device load would finish well before it */
    const uint64_t n = 48 * MiB;
    env e;
    env_open(&e, n + MiB, n + MiB, 64 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    zo_store_destroy(&e.st);
    e.cfg.prefetch_bytes = n;
    ck_assert_int_eq(zo_store_create(&e.st, &e.cfg), 0);
    zo_tensor *t = reg(e.st, "stale", n, ZO_TIER_NVME);
    uint8_t *v1 = malloc(n), *v2 = malloc(n);
    pattern(v1, n, 7, 1);
    pattern(v2, n, 7, 2);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, v1, n), 0);
    zo_store_reset_stats(e.st);
    ck_assert_int_eq(zo_store_prefetch(e.st, t, ZO_TIER_DEVICE), 0); /* loads v1 */
    /* new contents written in the host tier while that load is in flight */
    uint8_t *h = acq(e.st, t, ZO_TIER_HOST, ZO_ACQ_DISCARD);
    memcpy(h, v2, n);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_HOST, 0), 0);
    zo_tensor_info ti;
    ck_assert_int_eq(zo_store_tensor_info(e.st, t, &ti), 0);
    if (ti.state[ZO_TIER_DEVICE] != ZO_COPY_INFLIGHT) /* still checked, but the race was not exercised */
        fprintf(stderr, "stale load: the first load landed before the second was asked for\n");
    /* a second load of the device copy, then a reader of it */
    ck_assert_int_eq(zo_store_prefetch(e.st, t, ZO_TIER_DEVICE), 0);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_DEVICE, 0, &q), 0);
    void *d = NULL;
    ck_assert_int_eq(zo_store_wait(e.st, q, &d), 0);
    ck_assert_ptr_nonnull(d);
    /* once the stale load has landed too, the copy must still hold v2 */
    ck_assert_msg(wait_moved(e.st, ZO_TIER_NVME, ZO_TIER_DEVICE, n), "the stale load never finished");
    ck_assert_msg(memcmp(d, v2, n) == 0, "the device copy does not hold the newest data");
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0), 0);
    ck_assert_int_eq(zo_store_tensor_info(e.st, t, &ti), 0);
    ck_assert_int_eq(ti.state[ZO_TIER_DEVICE], ZO_COPY_RESIDENT);
    uint8_t *got = malloc(n);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
    ck_assert(memcmp(got, v2, n) == 0);
    check_budgets(e.st, &e.cfg);

    /* The stale copy was loaded by a hint and its space reused by the
     * demand load: it no longer counts as prefetched-and-unused. The cap
     * (prefetch_bytes = n) leaves room for a 1 MiB prefetch only if it was
     * uncounted: trace-driven prefetch must still run. */
    ck_assert_int_eq(zo_store_unregister(e.st, &t), 0);
    ck_assert_int_eq(zo_store_set_trace(e.st, ZO_TRACE_AUTO), 0);
    enum { NS = 4 };
    zo_tensor *sm[NS];
    for (int i = 0; i < NS; i++) {
        char nm[16];
        snprintf(nm, sizeof(nm), "small%d", i);
        sm[i] = reg(e.st, nm, MiB, ZO_TIER_NVME);
    }
    zo_store_reset_stats(e.st);
    for (int it = 0; it < 3; it++) { /* record, then follow the trace */
        for (int i = 0; i < NS; i++) {
            acq(e.st, sm[i], ZO_TIER_DEVICE, 0);
            ck_assert_int_eq(zo_store_release(e.st, sm[i], ZO_TIER_DEVICE, ZO_REL_DROP), 0);
        }
        ck_assert_int_eq(zo_store_step(e.st), 0);
    }
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_msg(st.prefetch_issued > 0, "no prefetch: the prefetch cap is held by a copy long gone");
    free(got);
    free(v1);
    free(v2);
    env_close(&e);
}
END_TEST

/* Two threads registering the same name at once: exactly one wins. The
 * store drops its lock while it allocates the home copy, so the name must
 * be claimed before that. */
typedef struct dupreg {
    zo_store *s;
    pthread_barrier_t *bar;
    char name[32];
    zo_tier home;
    int r;
    zo_tensor *t;
} dupreg;

static void *dupreg_main(void *arg)
{
    dupreg *d = arg;
    zo_tensor_desc desc;
    zo_tensor_desc_default(&desc);
    desc.name = d->name;
    desc.bytes = 256 * KiB;
    desc.dtype = ZO_DTYPE_U8;
    desc.home = d->home;
    pthread_barrier_wait(d->bar);
    d->r = zo_store_register(d->s, &desc, &d->t);
    return NULL;
}

START_TEST(test_store_register_race)
{
    env e;
    env_open(&e, 4 * MiB, 4 * MiB, 64 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    int both = 0;
    for (int i = 0; i < 300; i++) {
        dupreg d[2];
        pthread_t th[2];
        for (int k = 0; k < 2; k++) {
            memset(&d[k], 0, sizeof(d[k]));
            d[k].s = e.st;
            d[k].bar = &bar;
            snprintf(d[k].name, sizeof(d[k].name), "dup%d", i);
            d[k].home = (zo_tier)(i % 3 == 0 ? ZO_TIER_DEVICE : ZO_TIER_NVME);
            ck_assert_int_eq(pthread_create(&th[k], NULL, dupreg_main, &d[k]), 0);
        }
        for (int k = 0; k < 2; k++)
            pthread_join(th[k], NULL);
        int ok = (d[0].r == 0) + (d[1].r == 0);
        both += ok == 2;
        ck_assert_msg(ok >= 1, "dup%d: neither registered (%d, %d)", i, d[0].r, d[1].r);
        for (int k = 0; k < 2; k++) {
            if (d[k].r == 0)
                ck_assert_int_eq(zo_store_unregister(e.st, &d[k].t), 0);
            else
                ck_assert_int_eq(d[k].r, -EEXIST);
        }
    }
    ck_assert_msg(both == 0, "a name was registered twice %d times out of 300", both);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    for (int x = 0; x < ZO_TIER_COUNT; x++)
        ck_assert_uint_eq(st.used[x], 0);
    pthread_barrier_destroy(&bar);
    env_close(&e);
}
END_TEST

/* zo_store_unregister waiting for a tensor's transfers marks it dying (no
 * new work). If it then gives up (-EBUSY: a stream was opened meanwhile),
 * the tensor stays registered and must stay usable; a stream must not
 * open on a dying tensor in the first place. */
typedef struct unreg_arg {
    zo_store *s;
    zo_tensor *t;
    int r;
} unreg_arg;

static void *unreg_main(void *arg)
{
    unreg_arg *u = arg;
    u->r = zo_store_unregister(u->s, &u->t);
    return NULL;
}

START_TEST(test_store_unregister_busy)
{
    const uint64_t n = 48 * MiB;
    env e;
    env_open(&e, n + MiB, 0, 64 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    zo_tensor *t = reg(e.st, "dying", n, ZO_TIER_NVME);
    uint8_t *buf = malloc(n);
    pattern(buf, n, 9, 1);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, buf, n), 0);
    /* a slow load in flight (NVMe -> device through small slots), then an
     * unregister that waits for it */
    ck_assert_int_eq(zo_store_prefetch(e.st, t, ZO_TIER_DEVICE), 0);
    unreg_arg u = {e.st, t, 1};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, unreg_main, &u), 0);
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    zo_store_stream *st = NULL;
    int so = zo_store_stream_open(e.st, t, ZO_STREAM_READ, 1, &st);
    if (so == 0)
        zo_store_stream_close(&st);
    pthread_join(th, NULL);
    fprintf(stderr, "unregister busy: stream open %d, unregister %d\n", so, u.r);
    /* u.r == 0: unregistered; the stream was refused (the tensor was
     * going away) or came and went before the unregister looked again */
    if (u.r != 0) {
        /* the stream won: the tensor is still registered and usable */
        ck_assert_int_eq(u.r, -EBUSY);
        ck_assert_int_eq(so, 0);
        uint8_t *d = acq(e.st, t, ZO_TIER_DEVICE, 0);
        ck_assert(memcmp(d, buf, n) == 0);
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0), 0);
        ck_assert_int_eq(zo_store_unregister(e.st, &t), 0);
    }
    free(buf);
    env_close(&e);
}
END_TEST

/* Threads hammering one store: each owns its tensors (acquire read/write,
 * release with random flags, store read/write, flush), and hints prefetches
 * of anyone's; contents checked against a version pattern every time. */
typedef struct sthr {
    zo_store *s;
    zo_tensor **all;
    int nall, first, n;
    uint64_t *ver, *bytes;
    uint64_t seed;
    unsigned ok, ebudget;
    char fail[256];
} sthr;

static void *stress_main(void *arg)
{
    sthr *a = arg;
    zo_test_rng rng = {a->seed};
    uint8_t *want = malloc(400 * KiB), *got = malloc(400 * KiB);
    for (int it = 0; it < 1500 && !a->fail[0]; it++) {
        int i = a->first + (int)(zo_test_next(&rng) % (unsigned)a->n);
        zo_tensor *t = a->all[i];
        uint64_t n = a->bytes[i];
        unsigned op = (unsigned)(zo_test_next(&rng) % 100);
        zo_tier x = (zo_tier)(zo_test_next(&rng) % 2);
        if (op < 45) {
            int write = op < 15;
            zo_store_req *q;
            int r = zo_store_acquire(a->s, t, x, write ? ZO_ACQ_WRITE : 0, &q);
            void *p = NULL;
            if (r == 0)
                r = zo_store_wait(a->s, q, &p);
            if (r == ZO_EBUDGET) {
                a->ebudget++;
                continue;
            }
            if (r < 0) {
                snprintf(a->fail, sizeof(a->fail), "acquire %d: %s (%s)", i, zo_strerror(r), zo_last_error_detail());
                break;
            }
            pattern(want, n, (uint64_t)i, a->ver[i]);
            if (memcmp(p, want, n) != 0) {
                snprintf(a->fail, sizeof(a->fail), "tensor %d ver %llu in %s differs", i,
                         (unsigned long long)a->ver[i], zo_tier_name(x));
                break;
            }
            if (write) {
                a->ver[i]++;
                pattern(p, n, (uint64_t)i, a->ver[i]);
            }
            unsigned fl = (unsigned)(zo_test_next(&rng) % 4);
            r = zo_store_release(a->s, t, x, fl);
            if (r < 0 && r != ZO_EBUDGET) {
                snprintf(a->fail, sizeof(a->fail), "release %d: %s", i, zo_strerror(r));
                break;
            }
            a->ok++;
        } else if (op < 60) {
            int j = (int)(zo_test_next(&rng) % (unsigned)a->nall);
            zo_store_prefetch(a->s, a->all[j], x);
        } else if (op < 75) {
            int r = zo_store_read(a->s, t, 0, got, n);
            pattern(want, n, (uint64_t)i, a->ver[i]);
            if (r < 0 || memcmp(got, want, n) != 0) {
                snprintf(a->fail, sizeof(a->fail), "read %d: %d / differs", i, r);
                break;
            }
        } else if (op < 85) {
            a->ver[i]++;
            pattern(want, n, (uint64_t)i, a->ver[i]);
            int r = zo_store_write(a->s, t, 0, want, n);
            if (r < 0) {
                snprintf(a->fail, sizeof(a->fail), "write %d: %s (%s)", i, zo_strerror(r), zo_last_error_detail());
                break;
            }
        } else if (op < 90) {
            int r = zo_store_flush(a->s, t);
            if (r < 0) {
                snprintf(a->fail, sizeof(a->fail), "flush %d: %s", i, zo_strerror(r));
                break;
            }
        } else {
            zo_store_step(a->s);
        }
    }
    free(want);
    free(got);
    return NULL;
}

START_TEST(test_store_stress)
{
    enum { NT = 4, PER = 4 };
    env e;
    env_open(&e, 1536 * KiB, 1536 * KiB, 64 * KiB, 8, 16 * KiB, ZO_TRACE_AUTO);
    zo_tensor *all[NT * PER];
    uint64_t ver[NT * PER], bytes[NT * PER];
    zo_test_rng rng = {zo_test_seed() ^ 0x5157};
    uint8_t *buf = malloc(400 * KiB);
    for (int i = 0; i < NT * PER; i++) {
        char nm[16];
        snprintf(nm, sizeof(nm), "s%d", i);
        bytes[i] = 1 + zo_test_next(&rng) % (300 * KiB);
        all[i] = reg(e.st, nm, bytes[i], ZO_TIER_NVME);
        ver[i] = 1;
        pattern(buf, bytes[i], (uint64_t)i, 1);
        ck_assert_int_eq(zo_store_write(e.st, all[i], 0, buf, bytes[i]), 0);
    }
    sthr a[NT];
    pthread_t th[NT];
    for (int k = 0; k < NT; k++) {
        a[k] = (sthr){.s = e.st, .all = all, .nall = NT * PER, .first = k * PER, .n = PER, .ver = ver,
                      .bytes = bytes, .seed = zo_test_next(&rng)};
        ck_assert_int_eq(pthread_create(&th[k], NULL, stress_main, &a[k]), 0);
    }
    for (int k = 0; k < NT; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < NT; k++) {
        fprintf(stderr, "stress thread %d: %u acquires, %u EBUDGET\n", k, a[k].ok, a[k].ebudget);
        ck_assert_msg(!a[k].fail[0], "thread %d: %s", k, a[k].fail);
    }
    /* no read ever raced a write of the same chunk (a stale load reading
     * the home copy while a write-back rewrote it) */
    zo_swap_stats ss;
    zo_swap_get_stats(e.swap, &ss);
    ck_assert_uint_eq(ss.corrupt, 0);
    check_budgets(e.st, &e.cfg);
    free(buf);
    env_close(&e);
}
END_TEST

/* ---- trace-driven prefetch ---------------------------------------------------------- */
static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* One iteration: acquire each tensor in order, "compute", release. */
static void iteration(zo_store *s, zo_tensor **t, int n, const int *order, uint64_t compute_ns)
{
    for (int k = 0; k < n; k++) {
        zo_tensor *x = t[order ? order[k] : k];
        acq(s, x, ZO_TIER_DEVICE, 0);
        sleep_ns(compute_ns);
        ck_assert_int_eq(zo_store_release(s, x, ZO_TIER_DEVICE, 0), 0);
    }
    ck_assert_int_eq(zo_store_step(s), 0);
}

/* One measurement: stall time without and with prefetch on the same
 * replayed sequence; returns with/without. */
static double prefetch_ratio(int attempt)
{
    enum { N = 16, ITERS = 4 };
    const uint64_t sz = 2 * MiB;
    uint64_t stall[2];
    uint64_t compute_ns = 0;
    for (int mode = 0; mode < 2; mode++) {
        env e;
        /* the device holds 6 of the 16 tensors: every iteration reloads */
        env_open(&e, 6 * sz + 64 * KiB, 0, 512 * KiB, 8, 64 * KiB, mode ? ZO_TRACE_AUTO : ZO_TRACE_OFF);
        zo_tensor *t[N];
        uint8_t *buf = malloc(sz);
        for (int i = 0; i < N; i++) {
            char nm[16];
            snprintf(nm, sizeof(nm), "layer%d", i);
            t[i] = reg(e.st, nm, sz, ZO_TIER_NVME);
            pattern(buf, sz, (uint64_t)i, 1);
            ck_assert_int_eq(zo_store_write(e.st, t[i], 0, buf, sz), 0);
        }
        free(buf);
        if (mode == 0) {
            /* calibrate: the demand load time of one tensor, no prefetch */
            iteration(e.st, t, N, NULL, 0);
            zo_store_stats st;
            zo_store_get_stats(e.st, &st);
            uint64_t per = st.stall_ns / (st.stalls ? st.stalls : 1);
            compute_ns = 4 * per > 8000000ull ? 4 * per : 8000000ull; /* I/O fits in the compute time */
        } else {
            iteration(e.st, t, N, NULL, compute_ns); /* the recording iteration */
        }
        zo_store_reset_stats(e.st);
        for (int it = 0; it < ITERS; it++)
            iteration(e.st, t, N, NULL, compute_ns);
        zo_store_stats st;
        zo_store_get_stats(e.st, &st);
        stall[mode] = st.stall_ns;
        fprintf(stderr, "prefetch %s: stall %.2f ms over %d accesses (compute %.2f ms each); prefetched %llu, used "
                "%llu, demand bytes %llu, prefetch bytes %llu, trace %llu\n",
                mode ? "on " : "off", (double)st.stall_ns / 1e6, ITERS * N, (double)compute_ns / 1e6,
                (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_used,
                (unsigned long long)st.demand_bytes, (unsigned long long)st.prefetch_bytes,
                (unsigned long long)st.trace_len);
        if (mode) {
            ck_assert_uint_eq(st.trace_len, N);
            ck_assert_uint_ge(st.prefetch_used, (uint64_t)(ITERS * N * 3 / 4));
            ck_assert_uint_gt(st.prefetch_bytes, st.demand_bytes);
        } else {
            ck_assert_uint_eq(st.prefetch_issued, 0);
        }
        check_budgets(e.st, &e.cfg);
        env_close(&e);
    }
    double ratio = (double)stall[1] / (double)stall[0];
    fprintf(stderr, "prefetch: attempt %d: stall ratio on/off = %.4f\n", attempt, ratio);
    return ratio;
}

START_TEST(test_store_prefetch)
{
    /* A loaded machine (other tests, other jobs on the runner) can stretch
     * one sleep or one load and spoil a measurement: the bar holds if any
     * of three attempts meets it. A real regression fails all three. */
    double best = 1e9;
    for (int attempt = 1; attempt <= 3 && best >= 0.05; attempt++) {
        double ratio = prefetch_ratio(attempt);
        if (ratio < best)
            best = ratio;
    }
    ck_assert_msg(best < 0.05, "stalls with prefetch are %.1f%% of those without (best of 3 attempts)", best * 100);
}
END_TEST

/* Prefetch must never thrash (issue 9, item 2). Host cache over NVMe homes;
 * R (20 MiB) is held while the trace says A (14 MiB) comes next. A fits in
 * neither the free 8 MiB nor the 8 MiB plus the 4 MiB of S (needed later
 * than A, so a legal victim). The store used to evict S for A, find that A
 * still did not fit and give up; the next pump (S is in the lookahead)
 * reloaded S into the space just freed, its completion pumped again, and
 * the loop ran for as long as R was held: thousands of prefetches, each
 * one evicted unused. Now a prefetch decides whether it fits before it
 * evicts anything. */
START_TEST(test_store_prefetch_no_thrash)
{
    env e;
    env_prefetch_bytes = 32 * MiB; /* no cap: the space decides */
    env_open(&e, 0, 32 * MiB, 1 * MiB, 4, 64 * KiB, ZO_TRACE_AUTO);
    env_prefetch_bytes = 0;
    zo_tensor *R = reg(e.st, "R", 20 * MiB, ZO_TIER_NVME), *S = reg(e.st, "S", 4 * MiB, ZO_TIER_NVME),
              *A = reg(e.st, "A", 14 * MiB, ZO_TIER_NVME);
    zo_tensor *all[3] = {R, S, A};
    uint8_t *buf = malloc(20 * MiB);
    for (int i = 0; i < 3; i++) {
        uint64_t n = i == 0 ? 20 * MiB : i == 1 ? 4 * MiB : 14 * MiB;
        pattern(buf, n, (uint64_t)i, 1);
        ck_assert_int_eq(zo_store_write(e.st, all[i], 0, buf, n), 0);
    }
    uint64_t issued = 0, wasted = 0;
    for (int it = 0; it < 4; it++) {
        zo_store_stats a, b;
        zo_store_get_stats(e.st, &a);
        acq(e.st, R, ZO_TIER_HOST, 0);
        uint8_t *p = acq(e.st, S, ZO_TIER_HOST, 0);
        pattern(buf, 4 * MiB, 1, 1);
        ck_assert_int_eq(memcmp(p, buf, 4 * MiB), 0);
        ck_assert_int_eq(zo_store_release(e.st, S, ZO_TIER_HOST, 0), 0);
        sleep_ns(60000000ull); /* "compute" with R held: the window the loop ran in */
        ck_assert_int_eq(zo_store_release(e.st, R, ZO_TIER_HOST, 0), 0);
        p = acq(e.st, A, ZO_TIER_HOST, 0);
        pattern(buf, 14 * MiB, 2, 1);
        ck_assert_int_eq(memcmp(p, buf, 14 * MiB), 0);
        ck_assert_int_eq(zo_store_release(e.st, A, ZO_TIER_HOST, 0), 0);
        ck_assert_int_eq(zo_store_step(e.st), 0);
        zo_store_get_stats(e.st, &b);
        fprintf(stderr, "no-thrash iteration %d: prefetches issued %llu, used %llu, wasted %llu, dropped %llu\n", it,
                (unsigned long long)(b.prefetch_issued - a.prefetch_issued),
                (unsigned long long)(b.prefetch_used - a.prefetch_used),
                (unsigned long long)(b.prefetch_wasted - a.prefetch_wasted),
                (unsigned long long)(b.prefetch_dropped - a.prefetch_dropped));
        if (it > 0) { /* the first one recorded the trace */
            issued += b.prefetch_issued - a.prefetch_issued;
            wasted += b.prefetch_wasted - a.prefetch_wasted;
        }
    }
    /* three entries an iteration: a handful of prefetches, none wasted */
    ck_assert_msg(issued <= 3 * 3, "%llu prefetches issued in 3 iterations of 3 accesses", (unsigned long long)issued);
    ck_assert_msg(wasted == 0, "%llu of %llu prefetches evicted unused", (unsigned long long)wasted,
                  (unsigned long long)issued);
    check_budgets(e.st, &e.cfg);
    free(buf);
    env_close(&e);
}
END_TEST

/* Registering a device-homed tensor zeroes it. It used to do that on the
 * store's shared host->device stream and sync it: it waited for every
 * transfer queued there (and could take another copy's error, which its
 * piece then never saw). Here that stream is held by a gate: the register
 * must finish anyway. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, reg_done;
} gate;

static void gate_fn(void *arg)
{
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

typedef struct reg_arg {
    env *e;
    gate *g;
    zo_tensor *t;
} reg_arg;

static void *reg_dev_main(void *arg)
{
    reg_arg *a = arg;
    a->t = reg(a->e->st, "dev-homed", 256 * KiB, ZO_TIER_DEVICE);
    pthread_mutex_lock(&a->g->mu);
    a->g->reg_done = 1;
    pthread_cond_broadcast(&a->g->cv);
    pthread_mutex_unlock(&a->g->mu);
    return NULL;
}

START_TEST(test_store_register_own_stream)
{
    env e;
    env_open(&e, 4 * MiB, 4 * MiB, 256 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    ck_assert_int_eq(zo_stream_host_fn(e.st->h2d, gate_fn, &g), 0);
    reg_arg a = {&e, &g, NULL};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, reg_dev_main, &a), 0);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 5;
    pthread_mutex_lock(&g.mu);
    while (!g.reg_done && pthread_cond_timedwait(&g.cv, &g.mu, &dl) == 0)
        ;
    int done = g.reg_done;
    g.open = 1; /* let the stream go either way, so the thread can end */
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(th, NULL);
    ck_assert_msg(done, "registering a device-homed tensor waited for the transfers on the shared stream");
    uint8_t *p = acq(e.st, a.t, ZO_TIER_DEVICE, 0), *z = calloc(1, 256 * KiB);
    ck_assert_int_eq(memcmp(p, z, 256 * KiB), 0); /* host backend: device memory is host memory */
    free(z);
    ck_assert_int_eq(zo_store_release(e.st, a.t, ZO_TIER_DEVICE, 0), 0);
    env_close(&e);
}
END_TEST

/* A device piece whose copy was queued but whose completion could not be
 * tracked (its status function, now its fence, could not be queued) used
 * to fail at once: the slot went back to the pool while the copy could
 * still write into it. Now the store waits for the copy first. The device
 * stream is held by a gate; the failing acquire must not complete before
 * the gate opens. */
static void *gate_open_after(void *arg)
{
    gate *g = arg;
    sleep_ns(200000000ull);
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

START_TEST(test_store_untracked_copy)
{
    env e;
    env_open(&e, 4 * MiB, 0, 256 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    zo_tensor *t = reg(e.st, "w", 512 * KiB, ZO_TIER_NVME);
    uint8_t *buf = malloc(512 * KiB);
    pattern(buf, 512 * KiB, 7, 1);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, buf, 512 * KiB), 0);
    gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    ck_assert_int_eq(zo_stream_host_fn(e.st->h2d, gate_fn, &g), 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, gate_open_after, &g), 0);
    zo__dev_fail_fences(e.dev, 1, -ENOMEM);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_DEVICE, 0, &q), 0);
    void *p;
    int r = zo_store_wait(e.st, q, &p);
    pthread_mutex_lock(&g.mu);
    int opened = g.open;
    pthread_mutex_unlock(&g.mu);
    pthread_join(th, NULL);
    zo__dev_fail_fences(e.dev, 0, 0);
    ck_assert_int_eq(r, -ENOMEM);
    ck_assert_msg(opened, "the acquire failed while its copy into a pool slot's data was still queued");
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.pool_in_use, 0);
    /* and the store goes on */
    p = acq(e.st, t, ZO_TIER_DEVICE, 0);
    ck_assert_int_eq(memcmp(p, buf, 512 * KiB), 0);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0), 0);
    free(buf);
    env_close(&e);
}
END_TEST

/* Names live in a hash table now (registration was O(n) per tensor). The
 * cost only shows at ~10^5 tensors, which a unit test on a shared runner
 * cannot time reliably; this checks what the table must keep right:
 * lookups, duplicates, names freed by unregister and claimed again, growth
 * past several doublings. */
START_TEST(test_store_names)
{
    enum { N = 3000 };
    env e;
    env_open(&e, 0, N * 4096ull + MiB, 256 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    zo_tensor **t = calloc(N, sizeof(*t));
    char nm[32];
    for (int i = 0; i < N; i++) {
        snprintf(nm, sizeof(nm), "layer.%d.w", i);
        t[i] = reg(e.st, nm, 100, ZO_TIER_HOST);
    }
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.bytes = 100;
    d.dtype = ZO_DTYPE_U8;
    d.home = ZO_TIER_HOST;
    zo_tensor *dup = NULL;
    for (int i = 0; i < N; i += 7) {
        snprintf(nm, sizeof(nm), "layer.%d.w", i);
        zo_tensor *f = NULL;
        ck_assert_int_eq(zo_store_find(e.st, nm, &f), 0);
        ck_assert_ptr_eq(f, t[i]);
        d.name = nm;
        ck_assert_int_eq(zo_store_register(e.st, &d, &dup), -EEXIST);
    }
    ck_assert_int_eq(zo_store_find(e.st, "layer.3000.w", &dup), -ENOENT);
    for (int i = 0; i < N; i += 2)
        ck_assert_int_eq(zo_store_unregister(e.st, &t[i]), 0);
    for (int i = 0; i < N; i++) {
        snprintf(nm, sizeof(nm), "layer.%d.w", i);
        zo_tensor *f = NULL;
        ck_assert_int_eq(zo_store_find(e.st, nm, &f), i % 2 ? 0 : -ENOENT);
        if (i % 2 == 0)
            t[i] = reg(e.st, nm, 100, ZO_TIER_HOST); /* the name is free again */
    }
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(zo_store_unregister(e.st, &t[i]), 0);
    free(t);
    env_close(&e);
}
END_TEST

/* ---- the offload optimizer's pattern over a small host cache (issue 9) ------------------ */
/* shared/repro/store_optimizer_proto.c, nvme-acq, as a framework writes it:
 * groups of (master f32, m bf16, v bf16) homed on NVMe, a host cache, the
 * trace on; each step acquires a group's three tensors for writing, hints
 * the next group, waits, updates the three in place and releases them with
 * write-behind. Every update is applied to plain arrays too and each copy
 * is compared with them, bit for bit, before it is updated and at the end. */
enum { OPT_NS = 3, OPT_MAXG = 8 };

typedef struct opt_run {
    int ng, steps;
    uint64_t nel[OPT_MAXG];
    uint64_t host_bytes;
    unsigned slow_write_us; /* each write piece waits this long first (a slow disk) */
    /* results */
    uint64_t group_max;     /* the largest group, rounded as the host tier rounds */
    uint64_t issued, used, wasted, dropped;
    unsigned ebudget;       /* acquires that failed with ZO_EBUDGET */
    uint64_t frag_failures;
    char first_fail[ZO_ERRMSG_LEN];
} opt_run;

static uint64_t opt_bytes(const opt_run *o, int i, int k)
{
    return o->nel[i] * (k == 0 ? 4 : 2);
}

static uint64_t opt_group_max(const opt_run *o)
{
    uint64_t gmax = 0;
    for (int i = 0; i < o->ng; i++) {
        uint64_t g = 0;
        for (int k = 0; k < OPT_NS; k++)
            g += round_up(opt_bytes(o, i, k), 4096);
        gmax = g > gmax ? g : gmax;
    }
    return gmax;
}

/* The "optimizer update": a mix of the old bytes, the step and the place,
 * the same on the store's copy and on the reference. */
static void opt_update(uint8_t *p, uint64_t n, uint64_t salt)
{
    uint64_t x = salt * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t j = 0; j < n; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[j] = (uint8_t)(p[j] * 5u + (uint8_t)x);
    }
}

static int64_t slow_write_hook(void *user, const zo__aio_fault_site *s)
{
    const opt_run *o = user;
    if (s->op == ZO__OP_WRITE)
        sleep_ns((uint64_t)o->slow_write_us * 1000u);
    return 0;
}

static void opt_run_go(opt_run *o)
{
    env e;
    o->group_max = opt_group_max(o);
    env_prefetch_bytes = 0;
    env_open(&e, 0, o->host_bytes, 256 * KiB, 16, 64 * KiB, ZO_TRACE_AUTO);
    if (o->slow_write_us)
        zo__aio_set_fault(zo_swap_get_aio(e.swap), slow_write_hook, o);
    zo_tensor *t[OPT_MAXG][OPT_NS];
    uint8_t *ref[OPT_MAXG][OPT_NS];
    for (int i = 0; i < o->ng; i++)
        for (int k = 0; k < OPT_NS; k++) {
            char nm[32];
            snprintf(nm, sizeof(nm), "p%d.%s", i, k == 0 ? "master" : k == 1 ? "m" : "v");
            t[i][k] = reg(e.st, nm, opt_bytes(o, i, k), ZO_TIER_NVME);
            ref[i][k] = calloc(1, opt_bytes(o, i, k)); /* registered tensors start as zeros */
            ck_assert_ptr_nonnull(ref[i][k]);
        }
    o->ebudget = 0;
    o->first_fail[0] = 0;
    for (int step = 0; step < o->steps; step++) {
        for (int i = 0; i < o->ng; i++) {
            zo_store_req *q[OPT_NS];
            void *ptr[OPT_NS];
            int rc[OPT_NS], failed = 0;
            for (int k = 0; k < OPT_NS; k++)
                ck_assert_int_eq(zo_store_acquire(e.st, t[i][k], ZO_TIER_HOST, ZO_ACQ_WRITE, &q[k]), 0);
            if (i + 1 < o->ng)
                for (int k = 0; k < OPT_NS; k++)
                    ck_assert_int_eq(zo_store_prefetch(e.st, t[i + 1][k], ZO_TIER_HOST), 0);
            for (int k = 0; k < OPT_NS; k++) {
                rc[k] = zo_store_wait(e.st, q[k], &ptr[k]);
                if (rc[k] == ZO_EBUDGET) {
                    if (!o->ebudget++)
                        snprintf(o->first_fail, sizeof(o->first_fail), "step %d p%d/%d: %s", step, i, k,
                                 zo_last_error_detail());
                    failed = 1;
                    continue;
                }
                ck_assert_msg(rc[k] == 0, "step %d p%d/%d: %s (%s)", step, i, k, zo_strerror(rc[k]),
                              zo_last_error_detail());
            }
            for (int k = 0; k < OPT_NS; k++) {
                if (rc[k] < 0)
                    continue;
                uint64_t n = opt_bytes(o, i, k);
                ck_assert_msg(memcmp(ptr[k], ref[i][k], n) == 0, "step %d p%d/%d: contents differ", step, i, k);
                if (!failed) { /* a group updates as a whole or not at all */
                    uint64_t salt = ((uint64_t)step << 16) | (uint64_t)(i * OPT_NS + k);
                    opt_update(ptr[k], n, salt);
                    opt_update(ref[i][k], n, salt);
                }
                ck_assert_int_eq(zo_store_release(e.st, t[i][k], ZO_TIER_HOST, ZO_REL_WRITEBACK), 0);
            }
        }
        ck_assert_int_eq(zo_store_step(e.st), 0);
    }
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    o->issued = st.prefetch_issued;
    o->used = st.prefetch_used;
    o->wasted = st.prefetch_wasted;
    o->dropped = st.prefetch_dropped;
    o->frag_failures = st.frag_failures;
    for (int i = 0; i < o->ng; i++) /* the data made it home */
        for (int k = 0; k < OPT_NS; k++) {
            uint64_t n = opt_bytes(o, i, k);
            uint8_t *got = malloc(n);
            ck_assert_int_eq(zo_store_read(e.st, t[i][k], 0, got, n), 0);
            ck_assert_msg(memcmp(got, ref[i][k], n) == 0, "p%d/%d: home copy differs from the reference", i, k);
            free(got);
            free(ref[i][k]);
        }
    check_budgets(e.st, &e.cfg);
    env_close(&e);
}

static void opt_print(const char *what, const opt_run *o)
{
    fprintf(stderr,
            "%s: cache %.3f x group (%llu / %llu): prefetches issued %llu, used %llu, wasted %llu, dropped %llu; "
            "ZO_EBUDGET %u (frag %llu)%s%s\n",
            what, (double)o->host_bytes / (double)o->group_max, (unsigned long long)o->host_bytes,
            (unsigned long long)o->group_max, (unsigned long long)o->issued, (unsigned long long)o->used,
            (unsigned long long)o->wasted, (unsigned long long)o->dropped, o->ebudget,
            (unsigned long long)o->frag_failures, o->ebudget ? ": first " : "", o->first_fail);
}

static const uint64_t opt_mix0[5] = {256 * 1024, 768 * 1024 + 123, 257, 512 * 1024, 16 * 1024 + 7};

/* The prototype's situation with a cache half again the largest group.
 * Prefetches evicted unused must stay under 5% of those issued, and no
 * acquire may fail with ZO_EBUDGET. loop 1: the same over a slow disk
 * (every write waits 2 ms first), as on a loaded machine: write-backs are
 * still in flight when the next group's acquires need their space. */
START_TEST(test_store_prefetch_optimizer)
{
    opt_run o = {.ng = 5, .steps = 4, .slow_write_us = _i ? 2000 : 0};
    memcpy(o.nel, opt_mix0, sizeof(opt_mix0));
    o.host_bytes = round_up(opt_group_max(&o) * 3 / 2, 4096);
    opt_run_go(&o);
    opt_print(_i ? "optimizer replay, slow disk" : "optimizer replay", &o);
    /* it did prefetch (over the slow disk most of the room is still being
     * written back when the next group is hinted: fewer fit in time) */
    ck_assert_uint_ge(o.used, _i ? 1u : (uint64_t)o.ng);
    ck_assert_msg(o.wasted * 20 < o.issued, "%llu of %llu prefetches evicted unused", (unsigned long long)o.wasted,
                  (unsigned long long)o.issued);
    ck_assert_msg(o.ebudget == 0, "%u acquires failed with ZO_EBUDGET, first: %s", o.ebudget, o.first_fail);
}
END_TEST

/* Fragmentation (issue 9, item 3): the same pattern with a host cache
 * barely larger than the largest group, groups of different sizes. While a
 * group was held, the next group's first members were loaded ahead into
 * the space the held copies left; after the release they sat in the middle
 * of the cache, and the group's last members, loaded on demand, found the
 * free space cut in two by the group's own referenced copies: ZO_EBUDGET.
 * Before placement planned for co-held tensors (store.c, plan_space) this
 * failed at 1.05 to 1.10 x in every mix, at 1.12 x in three of the four, at
 * 1.2 x in one. Every size from 1.00 x (the group's exact bytes), four
 * mixes of group sizes, five steps: no ZO_EBUDGET, prefetches wasted under
 * 5 % of those issued, contents bit for bit. */
/* The trace records how long each acquire stays held (placement's
 * co-held sets): nested acquires of one hold all end at its last release,
 * a hold still open at zo_store_step() counts as held to the end of the
 * iteration, and one that spans the step ends nothing in the next record. */
START_TEST(test_store_trace_holds)
{
    env e;
    env_opts o = env_opts_sized(0, 8 * MiB, 0, 0, 0);
    o.trace = ZO_TRACE_AUTO;
    o.trace_set = 1;
    env_open_with(&e, &o);
    enum { F, A, B, C, D, E, NT };
    zo_tensor *t[NT];
    for (int i = 0; i < NT; i++) {
        char nm[8];
        snprintf(nm, sizeof(nm), "h%d", i);
        t[i] = reg(e.st, nm, 4096, ZO_TIER_HOST);
    }
    const zo_tier h = ZO_TIER_HOST;
    acq(e.st, t[F], h, 0); /* 0, held across the step */
    acq(e.st, t[A], h, 0); /* 1 */
    acq(e.st, t[B], h, 0); /* 2 */
    acq(e.st, t[A], h, 0); /* 3: the same hold as 1 */
    ck_assert_int_eq(zo_store_release(e.st, t[A], h, 0), 0);
    acq(e.st, t[C], h, 0); /* 4 */
    ck_assert_int_eq(zo_store_release(e.st, t[A], h, 0), 0); /* A's hold: 1 and 3 end at 5 */
    acq(e.st, t[D], h, 0); /* 5 */
    ck_assert_int_eq(zo_store_release(e.st, t[B], h, 0), 0);
    ck_assert_int_eq(zo_store_release(e.st, t[C], h, 0), 0);
    ck_assert_int_eq(zo_store_release(e.st, t[D], h, 0), 0);
    acq(e.st, t[E], h, 0); /* 6 */
    ck_assert_int_eq(zo_store_release(e.st, t[E], h, 0), 0);
    acq(e.st, t[F], h, 0); /* 7: F's hold from 0 goes on */
    ck_assert_int_eq(zo_store_step(e.st), 0);
    static const uint32_t want_end[] = {0, 5, 6, 5, 6, 6, 7, 0};
    static const uint64_t want_len[] = {8, 4, 4, 2, 2, 1, 1, 1};
    ck_assert_uint_eq(e.st->ntrace, 8);
    for (size_t q = 0; q < 8; q++) {
        ck_assert_msg(e.st->trace[q].end == want_end[q], "entry %zu: end %u, want %u", q, e.st->trace[q].end,
                      want_end[q]);
        ck_assert_uint_eq(zo__trace_hold_len(e.st, q), want_len[q]);
    }
    /* F's hold ends in the next iteration: the new record's entries stay open */
    acq(e.st, t[A], h, 0);
    ck_assert_int_eq(zo_store_release(e.st, t[F], h, 0), 0);
    ck_assert_int_eq(zo_store_release(e.st, t[F], h, 0), 0);
    ck_assert_int_eq(zo_store_release(e.st, t[A], h, 0), 0);
    ck_assert_uint_eq(e.st->nrec, 1);
    ck_assert_uint_eq(e.st->rec[0].end, 1);
    env_close(&e);
}
END_TEST

START_TEST(test_store_frag_optimizer)
{
    static const double factor[] = {1.00, 1.05, 1.08, 1.10, 1.12, 1.20};
    enum { NMIX = 4, NF = sizeof(factor) / sizeof(factor[0]) };
    opt_run runs[NMIX][NF];
    for (int mix = 0; mix < NMIX; mix++)
        for (int f = 0; f < (int)NF; f++) {
            opt_run *o = &runs[mix][f];
            memset(o, 0, sizeof(*o));
            o->steps = 5;
            if (mix == 0) {
                o->ng = 5;
                memcpy(o->nel, opt_mix0, sizeof(opt_mix0));
            } else {
                zo_test_rng r = {0x5eed0000u + (uint64_t)mix};
                zo_test_next(&r);
                o->ng = 4 + (int)(zo_test_next(&r) % 4);
                for (int i = 0; i < o->ng; i++)
                    o->nel[i] = (1 + zo_test_next(&r) % 12) * 64 * 1024 + zo_test_next(&r) % 5000;
            }
            o->host_bytes = round_up((uint64_t)((double)opt_group_max(o) * factor[f]), 4096);
            opt_run_go(o);
            char what[64];
            snprintf(what, sizeof(what), "frag mix %d x%.2f", mix, factor[f]);
            opt_print(what, o);
        }
    for (int mix = 0; mix < NMIX; mix++)
        for (int f = 0; f < (int)NF; f++) {
            const opt_run *o = &runs[mix][f];
            ck_assert_msg(o->ebudget == 0, "mix %d, cache %.2f x: %u acquires failed with ZO_EBUDGET, first: %s", mix,
                          factor[f], o->ebudget, o->first_fail);
            ck_assert_msg(o->wasted * 20 < o->issued || (o->issued == 0 && o->wasted == 0),
                          "mix %d, cache %.2f x: %llu of %llu prefetches evicted unused", mix, factor[f],
                          (unsigned long long)o->wasted, (unsigned long long)o->issued);
        }
}
END_TEST

/* The order changes: the next iteration is recorded and replaces the trace. */
START_TEST(test_store_rerecord)
{
    enum { N = 10 };
    env e;
    env_open(&e, 4 * MiB + 64 * KiB, 0, 256 * KiB, 6, 64 * KiB, ZO_TRACE_AUTO);
    zo_tensor *t[N];
    for (int i = 0; i < N; i++) {
        char nm[16];
        snprintf(nm, sizeof(nm), "p%d", i);
        t[i] = reg(e.st, nm, MiB, ZO_TIER_NVME);
    }
    iteration(e.st, t, N, NULL, 1000000);
    iteration(e.st, t, N, NULL, 1000000);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.trace_records, 1);
    ck_assert_uint_eq(st.trace_mismatches, 0);
    int rev[N];
    for (int i = 0; i < N; i++)
        rev[i] = N - 1 - i;
    iteration(e.st, t, N, rev, 1000000); /* differs: recorded, adopted */
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.trace_records, 2);
    ck_assert_uint_gt(st.trace_mismatches, 0);
    zo_store_reset_stats(e.st);
    iteration(e.st, t, N, rev, 3000000); /* follows the new order */
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.trace_mismatches, 0);
    ck_assert_uint_ge(st.prefetch_used, N / 2);
    ck_assert_int_eq(zo_store_set_trace(e.st, ZO_TRACE_OFF), 0);
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.trace_len, 0);
    env_close(&e);
}
END_TEST

START_TEST(test_store_config)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    zo_store *s = (zo_store *)1;
    zo_store_config c;
    zo_store_config_default(&c);
    ck_assert_int_eq(zo_store_create(&s, &c), ZO_ECONFIG); /* no tier */
    ck_assert_ptr_null(s);
    c.device_bytes = MiB;
    ck_assert_int_eq(zo_store_create(&s, &c), ZO_ECONFIG); /* no device */
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "dev"));
    c.device_bytes = 0;
    c.host_bytes = MiB;
    c.slot_size = 1000;
    ck_assert_int_eq(zo_store_create(&s, &c), ZO_ECONFIG);
    c.slot_size = 64 * KiB;
    c.trace = (zo_trace_mode)5;
    ck_assert_int_eq(zo_store_create(&s, &c), ZO_ECONFIG);
    c.trace = ZO_TRACE_AUTO;
    c.struct_size = 4;
    ck_assert_int_eq(zo_store_create(&s, &c), -EINVAL);
    c.struct_size = sizeof(c);
    ck_assert_int_eq(zo_store_create(NULL, &c), -EINVAL);
    /* host tier only, with a pool: works; the NVMe and device tiers are absent */
    ck_assert_int_eq(zo_store_create(&s, &c), 0);
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.name = "x";
    d.bytes = 100;
    zo_tensor *t;
    ck_assert_int_eq(zo_store_register(s, &d, &t), ZO_ECONFIG); /* home nvme */
    d.home = ZO_TIER_HOST;
    ck_assert_int_eq(zo_store_register(s, &d, &t), 0);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(s, t, ZO_TIER_DEVICE, 0, &q), ZO_ECONFIG);
    d.name = "too-big";
    d.bytes = 2 * MiB;
    ck_assert_int_eq(zo_store_register(s, &d, &t), ZO_EBUDGET);
    ck_assert_str_eq(zo_tier_name(ZO_TIER_HOST), "host");
    zo_tier tt;
    ck_assert_int_eq(zo_tier_parse("nvme", &tt), 0);
    ck_assert_int_eq(tt, ZO_TIER_NVME);
    ck_assert_int_eq(zo_tier_parse("ssd", &tt), -EINVAL);
    zo_store_destroy(&s);
    zo_store_destroy(&s);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- a real GPU as the device tier (skips without one) ----------------------------- */
static void dev_copy(zo_dev *dev, void *dst, const void *src, size_t n, zo_copy_kind kind)
{
    zo_stream *st;
    ck_assert_int_eq(zo_stream_create(dev, &st), 0);
    ck_assert_int_eq(zo_memcpy_async(st, dst, src, n, kind), 0);
    ck_assert_int_eq(zo_stream_sync(st), 0);
    zo_stream_destroy(&st);
}

/* The device tier through a device backend: CUDA (store-cuda), and the host
 * backend in the host suite, so the same sequence runs on every machine. */
static zo_dev_kind g_tier_kind = ZO_DEV_HOST;

START_TEST(test_store_cuda)
{
    env e;
    env_open_with(&e, &(env_opts){.kind = g_tier_kind,
                                  .dev_bytes = 16 * MiB,
                                  .host_bytes = 4 * MiB,
                                  .slot_size = 512 * KiB,
                                  .slots = 4,
                                  .chunk = 64 * KiB,
                                  .trace = ZO_TRACE_AUTO,
                                  .trace_set = 1});
    const uint64_t n = 5 * MiB + 100; /* larger than the pool */
    uint8_t *want = malloc(n), *got = malloc(n);
    zo_tensor *t = reg(e.st, "gpu.big", n, ZO_TIER_NVME), *h = reg(e.st, "gpu.home", 1 * MiB, ZO_TIER_DEVICE);
    pattern(want, n, 1, 1);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
    /* NVMe -> GPU through the pool */
    void *d = acq(e.st, t, ZO_TIER_DEVICE, 0);
    dev_copy(e.dev, got, d, n, ZO_COPY_D2H);
    ck_assert(memcmp(got, want, n) == 0);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0), 0);
    /* written on the GPU, written back GPU -> NVMe through the pool */
    d = acq(e.st, t, ZO_TIER_DEVICE, ZO_ACQ_DISCARD);
    pattern(want, n, 1, 2);
    dev_copy(e.dev, d, want, n, ZO_COPY_H2D);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, ZO_REL_DROP), 0);
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
    ck_assert(memcmp(got, want, n) == 0);
    /* GPU-home tensor: zeros, then host <-> GPU */
    ck_assert_int_eq(zo_store_read(e.st, h, 0, got, MiB), 0);
    for (uint64_t k = 0; k < MiB; k++)
        ZO_EXPECT(got[k] == 0, "gpu home byte %llu", (unsigned long long)k);
    pattern(want, MiB, 2, 1);
    ck_assert_int_eq(zo_store_write(e.st, h, 0, want, MiB), 0);
    uint8_t *hp = acq(e.st, h, ZO_TIER_HOST, 0);
    ck_assert(memcmp(hp, want, MiB) == 0);
    ck_assert_int_eq(zo_store_release(e.st, h, ZO_TIER_HOST, 0), 0);
    /* checkpoint and restore through the GPU */
    char root[300];
    snprintf(root, sizeof(root), "%s/ckpt", e.dir);
    ck_assert_int_eq(zo_store_checkpoint(e.st, root, "g1", NULL, 0, 0, NULL), 0);
    uint8_t *junk = calloc(1, MiB);
    ck_assert_int_eq(zo_store_write(e.st, h, 0, junk, MiB), 0);
    int rr = zo_store_restore(e.st, root, NULL);
    ck_assert_msg(rr == 0, "restore: %s (%s)", zo_strerror(rr), zo_store_errmsg(e.st));
    ck_assert_int_eq(zo_store_read(e.st, h, 0, got, MiB), 0);
    ck_assert(memcmp(got, want, MiB) == 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_ge(st.moved[ZO_TIER_NVME][ZO_TIER_DEVICE], n);
    ck_assert_uint_ge(st.moved[ZO_TIER_DEVICE][ZO_TIER_NVME], n);
    ck_assert_uint_le(st.pool_peak, 4);
    free(junk);
    free(want);
    free(got);
    env_close(&e);
}
END_TEST

/* ---- persistent I/O errors (the aio engine's fault-injection hook) ------------------------ */
enum { F_NONE = 0, F_WRITE_EIO, F_WRITE_ENOSPC, F_READ_EIO };

typedef struct {
    _Atomic int mode;
    _Atomic int hits; /* attempts failed */
} store_fault;

static int64_t store_fault_hook(void *user, const zo__aio_fault_site *s)
{
    store_fault *f = user;
    int m = atomic_load(&f->mode);
    if ((m == F_WRITE_EIO || m == F_WRITE_ENOSPC) && s->op == ZO__OP_WRITE) {
        atomic_fetch_add(&f->hits, 1);
        return m == F_WRITE_EIO ? -EIO : -ENOSPC;
    }
    if (m == F_READ_EIO && s->op == ZO__OP_READ) {
        atomic_fetch_add(&f->hits, 1);
        return -EIO;
    }
    return 0;
}

/* The hook goes in before any I/O (it may not change while requests are in
 * flight); the mode switches faults on and off. */
static void fault_install(env *e, store_fault *f)
{
    atomic_init(&f->mode, F_NONE);
    atomic_init(&f->hits, 0);
    zo__aio_set_fault(zo_swap_get_aio(e->swap), store_fault_hook, f);
}

static void tier_put(env *e, zo_tier x, void *dst, const void *src, size_t n)
{
    if (x == ZO_TIER_DEVICE)
        dev_copy(e->dev, dst, src, n, ZO_COPY_H2D);
    else
        memcpy(dst, src, n);
}

static void tier_get(env *e, zo_tier x, void *dst, const void *src, size_t n)
{
    if (x == ZO_TIER_DEVICE)
        dev_copy(e->dev, dst, src, n, ZO_COPY_D2H);
    else
        memcpy(dst, src, n);
}

static int acq_err(zo_store *s, zo_tensor *t, zo_tier x, unsigned flags)
{
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(s, t, x, flags, &q), 0);
    void *p = (void *)1;
    int r = zo_store_wait(s, q, &p);
    ck_assert_ptr_null(p);
    return r;
}

/* An acquire waiting for space whose eviction write-back fails on every
 * try gets the write-back's error (it used to be retried forever); the
 * dirty copy stays, eviction does not retry it in a loop, other tensors
 * keep working, and once the fault clears the same acquire succeeds and
 * the dirty data reaches home intact. loop: {EIO, ENOSPC} x {host, device} */
START_TEST(test_store_writeback_error)
{
    int werr = _i & 1 ? -ENOSPC : -EIO;
    zo_tier x = _i & 2 ? ZO_TIER_DEVICE : ZO_TIER_HOST;
    zo_tier o = x == ZO_TIER_HOST ? ZO_TIER_DEVICE : ZO_TIER_HOST;
    env e;
    env_open(&e, 1 * MiB, 1 * MiB, 64 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    store_fault f;
    fault_install(&e, &f);
    const uint64_t n = 600 * KiB, nc = 256 * KiB; /* two of n do not fit in a tier */
    zo_tensor *a = reg(e.st, "wb.victim", n, ZO_TIER_NVME), *b = reg(e.st, "wb.waiter", n, ZO_TIER_NVME),
              *c = reg(e.st, "wb.other", nc, ZO_TIER_NVME);
    uint8_t *wa = malloc(n), *wc = malloc(nc), *got = malloc(n);
    pattern(wa, n, 11, 2);
    pattern(wc, nc, 12, 1);
    ck_assert_int_eq(zo_store_write(e.st, c, 0, wc, nc), 0);
    /* a dirty copy of a in tier x: its only current copy */
    tier_put(&e, x, acq(e.st, a, x, ZO_ACQ_DISCARD), wa, n);
    ck_assert_int_eq(zo_store_release(e.st, a, x, 0), 0);
    zo_tensor_info ti;
    zo_store_tensor_info(e.st, a, &ti);
    ck_assert(ti.dirty[x]);

    atomic_store(&f.mode, werr == -EIO ? F_WRITE_EIO : F_WRITE_ENOSPC);
    ck_assert_int_eq(acq_err(e.st, b, x, 0), werr);
    const char *msg = zo_last_error_detail();
    ck_assert_msg(strstr(msg, "'wb.victim'") && strstr(msg, "'wb.waiter'"), "detail: %s", msg);
    int hits = atomic_load(&f.hits);
    ck_assert_int_gt(hits, 0);
    /* the dirty copy is kept where it was, unreferenced and still dirty */
    zo_store_tensor_info(e.st, a, &ti);
    ck_assert_int_eq(ti.state[x], ZO_COPY_RESIDENT);
    ck_assert(ti.dirty[x]);
    ck_assert_uint_eq(ti.refs[x], 0);
    zo_store_tensor_info(e.st, b, &ti);
    ck_assert_int_eq(ti.state[x], ZO_COPY_ABSENT);
    ck_assert_uint_eq(ti.refs[x], 0);
    /* nothing retries the write-back behind the caller's back */
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    ck_assert_int_eq(atomic_load(&f.hits), hits);
    /* other tensors keep working (reads are not faulted) */
    uint8_t *pc = acq(e.st, c, o, 0);
    tier_get(&e, o, got, pc, nc);
    ck_assert(memcmp(got, wc, nc) == 0);
    ck_assert_int_eq(zo_store_release(e.st, c, o, 0), 0);
    /* asked again while the fault lasts: one more try, the same error */
    ck_assert_int_eq(acq_err(e.st, b, x, 0), werr);
    ck_assert_int_gt(atomic_load(&f.hits), hits);
    ck_assert_int_eq(zo_store_flush(e.st, NULL), werr);
    zo_store_tensor_info(e.st, a, &ti);
    ck_assert(ti.dirty[x]);

    /* the fault clears: the same acquire succeeds, a's data reaches home */
    atomic_store(&f.mode, F_NONE);
    uint8_t *pb = acq(e.st, b, x, 0);
    tier_get(&e, x, got, pb, n);
    for (uint64_t k = 0; k < n; k++)
        ZO_EXPECT(got[k] == 0, "b byte %llu not zero", (unsigned long long)k);
    ck_assert_int_eq(zo_store_release(e.st, b, x, 0), 0);
    zo_store_tensor_info(e.st, a, &ti);
    ck_assert(!ti.dirty[x]);
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    memset(got, 0, n);
    ck_assert_int_eq(zo_store_read(e.st, a, 0, got, n), 0);
    ck_assert(memcmp(got, wa, n) == 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_ge(st.writebacks, 1);
    ck_assert_uint_eq(st.pool_in_use, 0);
    free(wa);
    free(wc);
    free(got);
    env_close(&e);
}
END_TEST

/* A failing swap-in (read error, then a checksum mismatch) fails the
 * acquires that needed it, leaves no copy or reference behind, and the
 * same acquire succeeds with exact bytes once the fault is gone. */
START_TEST(test_store_swapin_error)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB, 64 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    store_fault f;
    fault_install(&e, &f);
    const uint64_t n = 300 * KiB + 17;
    zo_tensor *t = reg(e.st, "in.t", n, ZO_TIER_NVME);
    uint8_t *want = malloc(n), *got = malloc(n);
    pattern(want, n, 21, 1);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    atomic_store(&f.mode, F_READ_EIO);
    for (int x = 0; x < 2; x++)
        for (int w = 0; w < 2; w++) {
            ck_assert_int_eq(acq_err(e.st, t, (zo_tier)x, w ? ZO_ACQ_WRITE : 0), -EIO);
            const char *msg = zo_last_error_detail();
            ck_assert_msg(strstr(msg, "'in.t'"), "detail: %s", msg);
            zo_tensor_info ti;
            zo_store_tensor_info(e.st, t, &ti);
            ck_assert_int_eq(ti.state[x], ZO_COPY_ABSENT);
            ck_assert_uint_eq(ti.refs[x], 0);
            ck_assert_int_eq(ti.state[ZO_TIER_NVME], ZO_COPY_RESIDENT);
        }
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), -EIO);
    atomic_store(&f.mode, F_NONE);
    for (int x = 0; x < 2; x++) {
        uint8_t *p = acq(e.st, t, (zo_tier)x, 0);
        tier_get(&e, (zo_tier)x, got, p, n);
        ck_assert_msg(memcmp(got, want, n) == 0, "%s copy differs after the fault", zo_tier_name((zo_tier)x));
        ck_assert_int_eq(zo_store_release(e.st, t, (zo_tier)x, ZO_REL_DROP), 0);
    }

    /* a checksum mismatch: one byte of the arena flipped, then restored */
    char path[4400] = "";
    off_t at = -1;
    DIR *d = opendir(e.dir);
    struct dirent *de;
    uint8_t *buf = malloc(16 * MiB);
    while (at < 0 && (de = readdir(d))) {
        if (strncmp(de->d_name, "zo-swap.", 8))
            continue;
        snprintf(path, sizeof(path), "%s/%s", e.dir, de->d_name);
        int fd = open(path, O_RDONLY);
        ssize_t rd = pread(fd, buf, 16 * MiB, 0);
        for (ssize_t o = 0; rd > 0 && o + 64 <= rd; o += 4096)
            if (memcmp(buf + o, want + 128 * KiB, 64) == 0) {
                at = o + 5;
                break;
            }
        close(fd);
    }
    closedir(d);
    free(buf);
    ck_assert(at >= 0);
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t orig, flip;
    ck_assert_int_eq(pread(fd, &orig, 1, at), 1);
    flip = (uint8_t)~orig;
    ck_assert_int_eq(pwrite(fd, &flip, 1, at), 1);
    for (int x = 0; x < 2; x++) {
        ck_assert_int_eq(acq_err(e.st, t, (zo_tier)x, 0), ZO_ECORRUPT);
        zo_tensor_info ti;
        zo_store_tensor_info(e.st, t, &ti);
        ck_assert_int_eq(ti.state[x], ZO_COPY_ABSENT);
        ck_assert_uint_eq(ti.refs[x], 0);
    }
    ck_assert_int_eq(pwrite(fd, &orig, 1, at), 1);
    close(fd);
    for (int x = 0; x < 2; x++) {
        uint8_t *p = acq(e.st, t, (zo_tier)x, 0);
        tier_get(&e, (zo_tier)x, got, p, n);
        ck_assert_msg(memcmp(got, want, n) == 0, "%s copy differs after the repair", zo_tier_name((zo_tier)x));
        ck_assert_int_eq(zo_store_release(e.st, t, (zo_tier)x, 0), 0);
    }
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.pool_in_use, 0);
    free(want);
    free(got);
    env_close(&e);
}
END_TEST

/* A failed device copy fails the transfer (it used to complete the acquire
 * with whatever the device copy held): a load into the device tier, and
 * the write-back of a dirty device copy an eviction needs. Both succeed
 * with exact bytes once copies work again. */
START_TEST(test_store_dev_copy_error)
{
    env e;
    env_open(&e, 1 * MiB, 2 * MiB, 64 * KiB, 4, 64 * KiB, ZO_TRACE_OFF);
    const uint64_t n = 600 * KiB;
    zo_tensor *a = reg(e.st, "dc.loaded", n, ZO_TIER_NVME), *b = reg(e.st, "dc.dirty", n, ZO_TIER_NVME);
    uint8_t *wa = malloc(n), *wb = malloc(n), *got = malloc(n);
    pattern(wa, n, 31, 1);
    pattern(wb, n, 32, 2);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, wa, n), 0);
    zo_tensor_info ti;
    /* NVMe -> device (through a slot) and host -> device */
    for (int via_host = 0; via_host < 2; via_host++) {
        if (via_host) { /* a current host copy is the nearest source */
            acq(e.st, a, ZO_TIER_HOST, 0);
            ck_assert_int_eq(zo_store_release(e.st, a, ZO_TIER_HOST, 0), 0);
        }
        zo__dev_host_fail_copies(e.dev, -EIO);
        ck_assert_int_eq(acq_err(e.st, a, ZO_TIER_DEVICE, 0), -EIO);
        zo__dev_host_fail_copies(e.dev, 0);
        const char *msg = zo_last_error_detail();
        ck_assert_msg(strstr(msg, "'dc.loaded'") && strstr(msg, "device copy"), "detail: %s", msg);
        zo_store_tensor_info(e.st, a, &ti);
        ck_assert_int_eq(ti.state[ZO_TIER_DEVICE], ZO_COPY_ABSENT);
        ck_assert_uint_eq(ti.refs[ZO_TIER_DEVICE], 0);
        uint8_t *p = acq(e.st, a, ZO_TIER_DEVICE, 0);
        dev_copy(e.dev, got, p, n, ZO_COPY_D2H);
        ck_assert_msg(memcmp(got, wa, n) == 0, "device copy differs (via host %d)", via_host);
        ck_assert_int_eq(zo_store_release(e.st, a, ZO_TIER_DEVICE, ZO_REL_DROP), 0);
    }
    /* a dirty device copy whose write-back (device -> slot) fails */
    dev_copy(e.dev, acq(e.st, b, ZO_TIER_DEVICE, ZO_ACQ_DISCARD), wb, n, ZO_COPY_H2D);
    ck_assert_int_eq(zo_store_release(e.st, b, ZO_TIER_DEVICE, 0), 0);
    zo__dev_host_fail_copies(e.dev, -EIO);
    ck_assert_int_eq(acq_err(e.st, a, ZO_TIER_DEVICE, 0), -EIO);
    zo__dev_host_fail_copies(e.dev, 0);
    zo_store_tensor_info(e.st, b, &ti);
    ck_assert_int_eq(ti.state[ZO_TIER_DEVICE], ZO_COPY_RESIDENT);
    ck_assert(ti.dirty[ZO_TIER_DEVICE]);
    uint8_t *p = acq(e.st, a, ZO_TIER_DEVICE, 0);
    dev_copy(e.dev, got, p, n, ZO_COPY_D2H);
    ck_assert(memcmp(got, wa, n) == 0);
    ck_assert_int_eq(zo_store_release(e.st, a, ZO_TIER_DEVICE, 0), 0);
    ck_assert_int_eq(zo_store_read(e.st, b, 0, got, n), 0);
    ck_assert(memcmp(got, wb, n) == 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.pool_in_use, 0);
    free(wa);
    free(wb);
    free(got);
    env_close(&e);
}
END_TEST

/* zo_store_read/zo_store_write over ranges that are not slot multiples, in
 * tensors smaller than a slot, a slot plus one and larger than the whole
 * pool, in every home tier: every write keeps the bytes outside its range
 * (also those of a dirty cached copy), every read returns exactly the
 * model's bytes, ranges past the end are refused, and no slot stays taken.
 * A thread samples all along that the pool's slots in use and the pinned
 * memory of the process never exceed what the store had at create. */
typedef struct {
    zo_store *s;
    size_t slots, pinned;
    _Atomic int stop;
    _Atomic unsigned long samples, bad;
} pool_sampler;

/* Samples the pool and the process's pinned memory while transfers run. */
static void *pool_sample(void *arg)
{
    pool_sampler *ps = arg;
    while (!atomic_load(&ps->stop)) {
        zo_store_stats st;
        zo_store_get_stats(ps->s, &st);
        if (st.pool_in_use > ps->slots || st.pool_peak > ps->slots || pinned_now() != ps->pinned)
            atomic_fetch_add(&ps->bad, 1);
        atomic_fetch_add(&ps->samples, 1);
        sched_yield();
    }
    return NULL;
}

START_TEST(test_store_odd_ranges)
{
    env e;
    const size_t slot = 8 * KiB;
    env_open(&e, 1 * MiB, 1 * MiB, slot, 4, 4 * KiB, ZO_TRACE_OFF);
    const uint64_t sizes[] = {1, 4095, 4097, slot - 1, slot, slot + 1, 13522, 4 * slot + 4097, 50001};
    const zo_tier homes[] = {ZO_TIER_NVME, ZO_TIER_HOST, ZO_TIER_DEVICE};
    zo_test_rng rng = {zo_test_seed() ^ 0x0dd};
    uint8_t *model = malloc(64 * KiB), *got = malloc(64 * KiB), *buf = malloc(64 * KiB);
    int id = 0;
    pool_sampler ps = {.s = e.st, .slots = e.cfg.slots, .pinned = env_pinned};
    pthread_t sampler;
    ck_assert_int_eq(pthread_create(&sampler, NULL, pool_sample, &ps), 0);
    for (size_t h = 0; h < 3; h++)
        for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++, id++) {
            const uint64_t n = sizes[z];
            char nm[32];
            snprintf(nm, sizeof(nm), "odd%d", id);
            zo_tensor *t = reg(e.st, nm, n, homes[h]);
            pattern(model, n, (uint64_t)id, 1);
            ck_assert_int_eq(zo_store_write(e.st, t, 0, model, n), 0);
            for (int it = 0; it < 40; it++) {
                uint64_t off, len;
                switch (it) {
                case 0: off = 0, len = 1; break;
                case 1: off = n - 1, len = 1; break;
                case 2: off = n / 2, len = n - n / 2; break;
                case 3: off = 1, len = n - 1; break;
                case 4: off = 0, len = n - (n > 1); break;
                case 5: off = ZO_MIN(n, slot - 1), len = ZO_MIN(n - ZO_MIN(n, slot - 1), 2); break;
                case 6: off = ZO_MIN(n, 13), len = ZO_MIN(n - ZO_MIN(n, 13), 13522); break;
                default:
                    off = zo_test_next(&rng) % (n + 1);
                    len = zo_test_next(&rng) % (n - off + 1);
                    break;
                }
                /* sometimes the current copy is a dirty cached one */
                if (it % 5 == 4) {
                    zo_tier x = (zo_tier)(it % 2);
                    uint8_t *p = acq(e.st, t, x, ZO_ACQ_WRITE);
                    pattern(model, n, (uint64_t)id, 100 + (uint64_t)it);
                    tier_put(&e, x, p, model, n);
                    ck_assert_int_eq(zo_store_release(e.st, t, x, 0), 0);
                }
                pattern(buf, len, (uint64_t)id, 1000 + (uint64_t)it);
                int r = zo_store_write(e.st, t, off, buf, len);
                ck_assert_msg(r == 0, "%s: write [%llu,+%llu): %s (%s)", nm, (unsigned long long)off,
                              (unsigned long long)len, zo_strerror(r), zo_last_error_detail());
                memcpy(model + off, buf, len);
                memset(got, 0xee, n);
                ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
                ck_assert_msg(memcmp(got, model, n) == 0, "%s (%llu bytes, home %s): write [%llu,+%llu) differs",
                              nm, (unsigned long long)n, zo_tier_name(homes[h]), (unsigned long long)off,
                              (unsigned long long)len);
                uint64_t ro = zo_test_next(&rng) % (n + 1), rl = zo_test_next(&rng) % (n - ro + 1);
                memset(got, 0xee, n + 1);
                ck_assert_int_eq(zo_store_read(e.st, t, ro, got, rl), 0);
                ck_assert_msg(memcmp(got, model + ro, rl) == 0 && got[rl] == 0xee, "%s: read [%llu,+%llu) differs",
                              nm, (unsigned long long)ro, (unsigned long long)rl);
                zo_store_stats st;
                zo_store_get_stats(e.st, &st);
                ZO_EXPECT(st.pool_in_use == 0, "%s: %zu slots still taken", nm, st.pool_in_use);
                check_budgets(e.st, &e.cfg);
            }
            /* past the end, and offsets that would wrap */
            ck_assert_int_eq(zo_store_read(e.st, t, n, got, 1), -EINVAL);
            ck_assert_int_eq(zo_store_read(e.st, t, n + 1, got, 0), -EINVAL);
            ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n + 1), -EINVAL);
            ck_assert_int_eq(zo_store_write(e.st, t, n, buf, 1), -EINVAL);
            ck_assert_int_eq(zo_store_write(e.st, t, 1, buf, n), -EINVAL);
            ck_assert_int_eq(zo_store_write(e.st, t, UINT64_MAX, buf, 2), -EINVAL);
            ck_assert_int_eq(zo_store_read(e.st, t, 2, got, SIZE_MAX), -EINVAL);
            ck_assert_int_eq(zo_store_read(e.st, t, n, got, 0), 0);
            ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
            ck_assert(memcmp(got, model, n) == 0);
            ck_assert_int_eq(zo_store_unregister(e.st, &t), 0);
        }
    atomic_store(&ps.stop, 1);
    pthread_join(sampler, NULL);
    ck_assert_uint_gt(atomic_load(&ps.samples), 0);
    ck_assert_msg(atomic_load(&ps.bad) == 0, "%lu of %lu samples over the pool or the pinned memory at create",
                  atomic_load(&ps.bad), atomic_load(&ps.samples));
    free(model);
    free(got);
    free(buf);
    env_close(&e);
}
END_TEST

/* A writer that slips in between zo_store_write's flush and its stream open
 * (an acquire with WRITE, released dirty) must not lose its bytes outside
 * the written range: the stream used to open over a stale home copy, copy
 * the pieces of the range from the newer copy, and drop that copy at close. */
typedef struct {
    env *e;
    uint8_t *tail;
    uint64_t n;
    int calls;
} slip;

static void slip_hook(zo_store *s, zo_tensor *t, void *user)
{
    slip *sl = user;
    if (sl->calls++)
        return;
    uint8_t *p = acq(s, t, ZO_TIER_DEVICE, ZO_ACQ_WRITE);
    tier_put(sl->e, ZO_TIER_DEVICE, p + sl->n - 4096, sl->tail, 4096);
    ck_assert_int_eq(zo_store_release(s, t, ZO_TIER_DEVICE, 0), 0);
}

START_TEST(test_store_write_slip)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB, 8 * KiB, 4, 4 * KiB, ZO_TRACE_OFF);
    const uint64_t n = 40 * KiB + 3;
    zo_tensor *t = reg(e.st, "slip", n, ZO_TIER_NVME);
    uint8_t *want = malloc(n), *got = malloc(n), head[100];
    pattern(want, n, 31, 1);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
    slip sl = {.e = &e, .tail = want + n - 4096, .n = n};
    pattern(sl.tail, 4096, 31, 2);
    pattern(head, sizeof(head), 31, 3);
    zo__store_set_write_hook(e.st, slip_hook, &sl);
    ck_assert_int_eq(zo_store_write(e.st, t, 5, head, sizeof(head)), 0);
    zo__store_set_write_hook(e.st, NULL, NULL);
    ck_assert_int_ge(sl.calls, 1);
    memcpy(want + 5, head, sizeof(head));
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
    ck_assert_msg(memcmp(got + n - 4096, want + n - 4096, 4096) == 0, "the other writer's bytes were lost");
    ck_assert_msg(memcmp(got, want, n) == 0, "contents differ");
    ck_assert_int_eq(zo_store_flush(e.st, NULL), 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.pool_in_use, 0);
    free(want);
    free(got);
    env_close(&e);
}
END_TEST

/* Swap errors under zo_store_read/zo_store_write reach the caller, for
 * partial ranges too (a read-modify-write stream loads and writes); no slot
 * stays taken; the pieces the failed range does not touch keep their
 * contents, and once the fault clears the same calls succeed. */
START_TEST(test_store_rw_swap_error)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB, 8 * KiB, 4, 4 * KiB, ZO_TRACE_OFF);
    store_fault f;
    fault_install(&e, &f);
    const uint64_t n = 6 * 8 * KiB + 13522;
    zo_tensor *t = reg(e.st, "rw.err", n, ZO_TIER_NVME);
    uint8_t *want = malloc(n), *got = malloc(n), patch[4097];
    pattern(want, n, 41, 1);
    pattern(patch, sizeof(patch), 41, 2);
    ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
    const uint64_t off = 3 * 8 * KiB - 7; /* touches pieces 2 and 3 */
    for (int m = F_WRITE_EIO; m <= F_READ_EIO; m++) {
        atomic_store(&f.mode, m);
        int werr = m == F_WRITE_ENOSPC ? -ENOSPC : -EIO;
        ck_assert_int_eq(zo_store_write(e.st, t, off, patch, sizeof(patch)), werr);
        /* the whole tensor needs no load */
        ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), m == F_READ_EIO ? 0 : werr);
        if (m == F_READ_EIO) {
            ck_assert_int_eq(zo_store_read(e.st, t, off, got, sizeof(patch)), -EIO);
            ck_assert_int_eq(zo_store_read(e.st, t, 1, got, 1), -EIO);
        }
        zo_store_stats st;
        zo_store_get_stats(e.st, &st);
        ck_assert_uint_eq(st.pool_in_use, 0);
        atomic_store(&f.mode, F_NONE);
        ck_assert_int_gt(atomic_load(&f.hits), 0);
        /* the whole tensor written again, then the patch: both land */
        ck_assert_int_eq(zo_store_write(e.st, t, 0, want, n), 0);
        ck_assert_int_eq(zo_store_write(e.st, t, off, patch, sizeof(patch)), 0);
        memcpy(want + off, patch, sizeof(patch));
        ck_assert_int_eq(zo_store_read(e.st, t, 0, got, n), 0);
        ck_assert_msg(memcmp(got, want, n) == 0, "mode %d: contents differ after the fault cleared", m);
    }
    /* a failed partial write leaves the pieces it does not touch as they were */
    atomic_store(&f.mode, F_WRITE_EIO);
    pattern(patch, sizeof(patch), 41, 3);
    ck_assert_int_eq(zo_store_write(e.st, t, off, patch, sizeof(patch)), -EIO);
    atomic_store(&f.mode, F_NONE);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, got, 2 * 8 * KiB), 0);
    ck_assert(memcmp(got, want, 2 * 8 * KiB) == 0);
    ck_assert_int_eq(zo_store_read(e.st, t, 4 * 8 * KiB, got, n - 4 * 8 * KiB), 0);
    ck_assert(memcmp(got, want + 4 * 8 * KiB, n - 4 * 8 * KiB) == 0);
    free(want);
    free(got);
    env_close(&e);
}
END_TEST

/* The error codes store.h documents for reads, writes and streams. */
START_TEST(test_store_rw_codes)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB, 8 * KiB, 3, 4 * KiB, ZO_TRACE_OFF);
    const uint64_t n = 20 * KiB + 1;
    zo_tensor *t = reg(e.st, "codes", n, ZO_TIER_NVME);
    uint8_t *buf = calloc(1, n);
    /* 3 slots: enough to read through, not to read-modify-write */
    ck_assert_int_eq(zo_store_read(e.st, t, 1, buf, n - 1), 0);
    ck_assert_int_eq(zo_store_write(e.st, t, 1, buf, 2), ZO_ECONFIG);
    ck_assert_int_eq(zo_store_read(NULL, t, 0, buf, 1), -EINVAL);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, NULL, 1), -EINVAL);
    /* held for writing: reads and writes refuse, they do not wait */
    acq(e.st, t, ZO_TIER_HOST, ZO_ACQ_WRITE);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, buf, 1), -EBUSY);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_HOST, 0), 0);
    acq(e.st, t, ZO_TIER_HOST, 0);
    ck_assert_int_eq(zo_store_read(e.st, t, 0, buf, 1), 0);
    ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_HOST, 0), 0);
    /* streams: arguments, depth against the pool, pieces held */
    zo_store_stream *st = NULL;
    ck_assert_int_eq(zo_store_stream_open(e.st, t, 0, 1, &st), -EINVAL);
    ck_assert_int_eq(zo_store_stream_open(e.st, t, 4, 1, &st), -EINVAL);
    ck_assert_int_eq(zo_store_stream_open(e.st, t, ZO_STREAM_READ, 0, &st), -EINVAL);
    ck_assert_int_eq(zo_store_stream_open(e.st, t, ZO_STREAM_READ, 1025, &st), -EINVAL);
    ck_assert_int_eq(zo_store_stream_open(e.st, t, ZO_STREAM_READ, 2, &st), -EBUSY); /* 3 slots: one kept */
    ck_assert_int_eq(zo_store_stream_open(e.st, t, ZO_STREAM_WRITE, 1, &st), -EBUSY);
    ck_assert_int_eq(zo_store_stream_open(e.st, t, ZO_STREAM_READ, 1, &st), 0);
    /* a read stream keeps writers out */
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_HOST, ZO_ACQ_WRITE, &q), -EBUSY);
    zo_store_piece p, p2;
    ck_assert_int_eq(zo_store_stream_next(st, &p), 0);
    ck_assert_uint_eq(p.len, 8 * KiB);
    ck_assert_int_eq(zo_store_stream_next(st, &p2), ZO_ESTATE);
    p2 = p;
    p2.off += 1;
    ck_assert_int_eq(zo_store_stream_done(st, &p2), -EINVAL);
    ck_assert_int_eq(zo_store_stream_done(st, NULL), -EINVAL);
    ck_assert_int_eq(zo_store_stream_next(NULL, &p2), -EINVAL);
    ck_assert_int_eq(zo_store_stream_done(st, &p), 0);
    ck_assert_int_eq(zo_store_stream_done(st, &p), -EINVAL); /* not held any more */
    ck_assert_int_eq(zo_store_stream_close(&st), 0);
    zo_store_stats ss;
    zo_store_get_stats(e.st, &ss);
    ck_assert_uint_eq(ss.pool_in_use, 0);
    free(buf);
    env_close(&e);
}
END_TEST

/* A restore waits for background transfers of its tensors (here a
 * write-back held in the aio engine) instead of refusing with -EBUSY
 * halfway, after the tensors before it were already overwritten. */
typedef struct {
    _Atomic int closed, held, passed;
} io_gate;

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* While closed, the first write waits for the gate to open; the others
 * pass and are counted. */
static int64_t gate_hook(void *user, const zo__aio_fault_site *s)
{
    io_gate *g = user;
    if (s->op == ZO__OP_WRITE && atomic_load(&g->closed)) {
        if (atomic_fetch_add(&g->held, 1) != 0) {
            atomic_fetch_add(&g->passed, 1);
            return 0;
        }
        while (atomic_load(&g->closed))
            nap_ms(1);
    }
    return 0;
}

/* Opens the gate once the restore has written the first tensor (every
 * piece of it passed), and a while more: the restore is at the second,
 * whose write-back the gate holds, by then. */
static void *gate_open_later(void *arg)
{
    io_gate *g = arg;
    while (atomic_load(&g->passed) < 4)
        nap_ms(1);
    nap_ms(100);
    atomic_store(&g->closed, 0);
    return NULL;
}

/* The hook goes in open, before any I/O. */
static void gate_install(env *e, io_gate *g)
{
    atomic_init(&g->closed, 0);
    atomic_init(&g->held, 0);
    atomic_init(&g->passed, 0);
    zo__aio_set_fault(zo_swap_get_aio(e->swap), gate_hook, g);
}

/* A prefetch wasted because the machine was slow (issue 9): the optimizer
 * replay once failed its 5 % bar under heavy load. A demand load chose
 * among the places it could take *now*: while the write-back that frees
 * the cheap room was still running (slower than the caller, as on a loaded
 * machine), the only room now was a copy a hint had just loaded, and the
 * load evicted it unused; on a quiet machine the write-back had landed
 * first and nothing was wasted. Now a demand load that would evict a copy
 * needed soon waits for transfers in flight that free room costing
 * nothing. Here the write-back is held in the aio engine, so the slow case
 * happens every run: A (8 MiB) is written back, B (4 MiB) hinted into the
 * free top of a 16 MiB cache, then D (8 MiB) fits only over B or over A. */
START_TEST(test_store_prefetch_waste_inflight)
{
    env e;
    env_threads_aio = 1; /* the held write leaves the other I/O threads running */
    env_open(&e, 0, 16 * MiB, 1 * MiB, 4, 64 * KiB, ZO_TRACE_AUTO);
    env_threads_aio = 0;
    io_gate g;
    gate_install(&e, &g);
    zo_tensor *A = reg(e.st, "A", 8 * MiB, ZO_TIER_NVME), *B = reg(e.st, "B", 4 * MiB, ZO_TIER_NVME),
              *D = reg(e.st, "D", 8 * MiB, ZO_TIER_NVME);
    uint8_t *buf = malloc(8 * MiB);
    pattern(buf, 4 * MiB, 1, 1);
    ck_assert_int_eq(zo_store_write(e.st, B, 0, buf, 4 * MiB), 0);
    atomic_store(&g.closed, 1);
    uint8_t *p = acq(e.st, A, ZO_TIER_HOST, ZO_ACQ_WRITE);
    pattern(p, 8 * MiB, 0, 2);
    ck_assert_int_eq(zo_store_release(e.st, A, ZO_TIER_HOST, ZO_REL_WRITEBACK), 0); /* held in the engine */
    ck_assert_int_eq(zo_store_prefetch(e.st, B, ZO_TIER_HOST), 0);
    zo_tensor_info ti;
    for (int i = 0; i < 10000; i++) {
        ck_assert_int_eq(zo_store_tensor_info(e.st, B, &ti), 0);
        if (ti.state[ZO_TIER_HOST] == ZO_COPY_RESIDENT)
            break;
        nap_ms(1);
    }
    ck_assert_int_eq(ti.state[ZO_TIER_HOST], ZO_COPY_RESIDENT);
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, D, ZO_TIER_HOST, 0, &q), 0);
    nap_ms(20);
    atomic_store(&g.closed, 0); /* the write-back lands */
    void *pd = NULL;
    int r = zo_store_wait(e.st, q, &pd);
    ck_assert_msg(r == 0, "acquire D: %s (%s)", zo_strerror(r), zo_last_error_detail());
    ck_assert_int_eq(zo_store_release(e.st, D, ZO_TIER_HOST, 0), 0);
    p = acq(e.st, B, ZO_TIER_HOST, 0);
    pattern(buf, 4 * MiB, 1, 1);
    ck_assert_int_eq(memcmp(p, buf, 4 * MiB), 0);
    ck_assert_int_eq(zo_store_release(e.st, B, ZO_TIER_HOST, 0), 0);
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_msg(st.prefetch_wasted == 0, "the hinted copy was evicted unused (%llu wasted)",
                  (unsigned long long)st.prefetch_wasted);
    ck_assert_uint_eq(st.prefetch_issued, 1);
    ck_assert_uint_eq(st.prefetch_used, 1);
    ck_assert_int_eq(zo_store_read(e.st, A, 0, buf, 8 * MiB), 0); /* A's data made it home */
    uint8_t *want = malloc(8 * MiB);
    pattern(want, 8 * MiB, 0, 2);
    ck_assert_int_eq(memcmp(buf, want, 8 * MiB), 0);
    free(want);
    free(buf);
    zo__aio_set_fault(zo_swap_get_aio(e.swap), NULL, NULL);
    check_budgets(e.st, &e.cfg);
    env_close(&e);
}
END_TEST

START_TEST(test_store_restore_waits)
{
    env e;
    env_threads_aio = 1;
    env_open(&e, 1 * MiB, 1 * MiB, 64 * KiB, 8, 64 * KiB, ZO_TRACE_OFF);
    env_threads_aio = 0;
    io_gate g;
    gate_install(&e, &g);
    const uint64_t n = 200 * KiB + 5;
    zo_tensor *a = reg(e.st, "rs.a", n, ZO_TIER_NVME), *b = reg(e.st, "rs.b", n, ZO_TIER_NVME);
    uint8_t *va = malloc(n), *vb = malloc(n), *junk = malloc(n), *got = malloc(n);
    pattern(va, n, 51, 1);
    pattern(vb, n, 52, 1);
    pattern(junk, n, 53, 1);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, va, n), 0);
    ck_assert_int_eq(zo_store_write(e.st, b, 0, vb, n), 0);
    zo_tensor *both[] = {a, b};
    ck_assert_int_eq(zo_store_checkpoint(e.st, e.dir, "rs1", both, 2, 0, NULL), 0);
    ck_assert_int_eq(zo_store_write(e.st, a, 0, junk, n), 0);
    /* b: a dirty host copy whose write-back is held in the engine */
    memcpy(acq(e.st, b, ZO_TIER_HOST, ZO_ACQ_WRITE), junk, n);
    atomic_store(&g.closed, 1);
    ck_assert_int_eq(zo_store_release(e.st, b, ZO_TIER_HOST, ZO_REL_WRITEBACK), 0);
    while (!atomic_load(&g.held))
        nap_ms(1);
    pthread_t opener;
    ck_assert_int_eq(pthread_create(&opener, NULL, gate_open_later, &g), 0);
    int r = zo_store_restore(e.st, e.dir, "rs1");
    pthread_join(opener, NULL);
    ck_assert_msg(r == 0, "restore: %s (%s)", zo_strerror(r), zo_last_error_detail());
    ck_assert_int_eq(zo_store_read(e.st, a, 0, got, n), 0);
    ck_assert_msg(memcmp(got, va, n) == 0, "a not restored");
    ck_assert_int_eq(zo_store_read(e.st, b, 0, got, n), 0);
    ck_assert_msg(memcmp(got, vb, n) == 0, "b not restored");
    /* a referenced tensor is refused before any is touched */
    ck_assert_int_eq(zo_store_write(e.st, a, 0, junk, n), 0);
    acq(e.st, b, ZO_TIER_DEVICE, 0);
    ck_assert_int_eq(zo_store_restore(e.st, e.dir, "rs1"), -EBUSY);
    ck_assert_int_eq(zo_store_release(e.st, b, ZO_TIER_DEVICE, 0), 0);
    ck_assert_int_eq(zo_store_read(e.st, a, 0, got, n), 0);
    ck_assert_msg(memcmp(got, junk, n) == 0, "a was restored by a refused restore");
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_eq(st.pool_in_use, 0);
    zo__aio_set_fault(zo_swap_get_aio(e.swap), NULL, NULL);
    free(va);
    free(vb);
    free(junk);
    free(got);
    env_close(&e);
}
END_TEST

int main(int argc, char **argv)
{
    zo_log_set_level(ZO_LOG_ERROR);
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
        char why[256] = "";
        int nd = 0;
        if (zo_test_probe_dev(ZO_DEV_CUDA, &nd, why, sizeof(why)) != 0 || nd == 0)
            ZO_TEST_SKIP("no CUDA device: %s", why[0] ? why : "none found");
        g_tier_kind = ZO_DEV_CUDA;
        Suite *s = suite_create("store-cuda");
        TCase *tc = tcase_create("cuda");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_store_cuda);
        suite_add_tcase(s, tc);
        return zo_test_run(s);
    }
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_store_config);
    tcase_add_test(tc, test_store_tiers);
    tcase_add_test(tc, test_store_cuda);
    tcase_add_test(tc, test_store_big_through_pool);
    tcase_add_test(tc, test_store_budget_evict);
    tcase_add_test(tc, test_store_streams);
    tcase_add_test(tc, test_store_corrupt);
    tcase_add_test(tc, test_store_checkpoint);
    tcase_add_test(tc, test_store_model);
    tcase_add_test(tc, test_store_stale_load);
    tcase_add_test(tc, test_store_register_race);
    tcase_add_test(tc, test_store_unregister_busy);
    tcase_add_test(tc, test_store_stress);
    tcase_add_test(tc, test_store_odd_ranges);
    tcase_add_test(tc, test_store_write_slip);
    tcase_add_test(tc, test_store_rw_codes);
    tcase_add_test(tc, test_store_restore_waits);
    suite_add_tcase(s, tc);
    tc = tcase_create("prefetch");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_store_prefetch);
    tcase_add_test(tc, test_store_rerecord);
    suite_add_tcase(s, tc);
    /* regressions of issue 9 (prefetch thrash, copy machinery) */
    tc = tcase_create("machinery");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_store_prefetch_no_thrash);
    tcase_add_loop_test(tc, test_store_prefetch_optimizer, 0, 2);
    tcase_add_test(tc, test_store_prefetch_waste_inflight);
    tcase_add_test(tc, test_store_register_own_stream);
    tcase_add_test(tc, test_store_untracked_copy);
    tcase_add_test(tc, test_store_names);
    suite_add_tcase(s, tc);
    /* issue 9, item 3: a host cache barely larger than one group */
    tc = tcase_create("frag");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_store_frag_optimizer);
    tcase_add_test(tc, test_store_trace_holds);
    suite_add_tcase(s, tc);
    /* a hang is the bug these look for: fail it in bounded time */
    tc = tcase_create("errors");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_store_writeback_error, 0, 4);
    tcase_add_test(tc, test_store_swapin_error);
    tcase_add_test(tc, test_store_dev_copy_error);
    tcase_add_test(tc, test_store_rw_swap_error);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
