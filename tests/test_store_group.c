/* SPDX-License-Identifier: Apache-2.0 */
/* Group sweeps of the tiered store (zo_store_sweep_*) and the tier sizing
 * query, on the host device backend, real pinned memory and a real swap
 * store: tensors of different element sizes walked in step, exact bytes
 * after write-back on host and NVMe homes, read-ahead across groups at the
 * default slot count, slot use within the reservation, I/O errors surfacing
 * in next/close, close in the middle, bad input, and the tier bytes query
 * against what create and the allocator really need. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "zo_test.h"

#include <zoffload/zoffload.h>

#include "aio/aio_internal.h"
#include "store/store_internal.h"

#include "store_env.h"

/* ---- environment ------------------------------------------------------------------------- */
/* slots 0: the store's default slot count */
static void env_open(env *e, uint64_t dev_bytes, uint64_t host_bytes, size_t slot, unsigned slots, size_t chunk)
{
    env_opts o = env_opts_sized(dev_bytes, host_bytes, slot, slots, chunk);
    env_open_with(e, &o);
}

static zo_tensor *reg(zo_store *s, const char *name, zo_dtype dt, uint64_t nelem, zo_tier home)
{
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.name = name;
    d.dtype = dt;
    d.ndim = 1;
    d.shape[0] = nelem;
    d.home = home;
    zo_tensor *t = NULL;
    int r = zo_store_register(s, &d, &t);
    ck_assert_msg(r == 0, "register %s: %s (%s)", name, zo_strerror(r), zo_last_error_detail());
    return t;
}

/* host -> device tier memory (the host backend's device memory is host
 * memory, but only the backend knows that) */
static void dev_put(zo_dev *dev, void *dst, const void *src, size_t n)
{
    zo_stream *st;
    ck_assert_int_eq(zo_stream_create(dev, &st), 0);
    ck_assert_int_eq(zo_memcpy_async(st, dst, src, n, ZO_COPY_H2D), 0);
    ck_assert_int_eq(zo_stream_sync(st), 0);
    zo_stream_destroy(&st);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    zo_test_rng r = {seed * 0x9e3779b97f4a7c15ull + 0x5bd1e995u};
    zo_test_next(&r);
    zo_test_fill_bytes(&r, p, n);
}

/* The per-element update of the tests: integer, so exact whatever the bits */
static void update(void *p, size_t esz, uint64_t first, uint64_t n, unsigned k)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t e = first + i;
        if (esz == 4)
            ((uint32_t *)p)[i] += (uint32_t)(e * 2654435761u + k);
        else if (esz == 2)
            ((uint16_t *)p)[i] ^= (uint16_t)(e * 40503u + k + 1);
        else
            ((uint8_t *)p)[i] ^= (uint8_t)(e + k + 1);
    }
}

static void check_pool_idle(zo_store *s)
{
    zo_store_stats st;
    zo_store_get_stats(s, &st);
    ck_assert_uint_eq(st.pool_in_use, 0);
    ZO_EXPECT(st.pool_peak <= st.pool_slots, "pool peak %zu > %zu slots", st.pool_peak, st.pool_slots);
    pthread_mutex_lock(&s->lock);
    ck_assert_uint_eq(s->reserved, 0);
    pthread_mutex_unlock(&s->lock);
}

/* ---- lockstep: fp32 master + bf16 m, v; odd element counts ------------------------------- */
enum { NG = 6, NPOS = 3 };
static const uint64_t g_nelem[NG] = {1, 257, 65521, 1, 131071, 100003};
static const zo_dtype g_dt[NPOS] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_BF16};

typedef struct groups {
    zo_tensor *t[NG * NPOS];
    uint8_t *want[NG * NPOS];
} groups;

static void groups_make(env *e, groups *G, zo_tier home, const char *prefix)
{
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NPOS; k++) {
            char name[64];
            snprintf(name, sizeof(name), "%s.%d.%d", prefix, g, k);
            int i = g * NPOS + k;
            size_t bytes = g_nelem[g] * zo_dtype_size(g_dt[k]);
            G->t[i] = reg(e->st, name, g_dt[k], g_nelem[g], home);
            G->want[i] = malloc(bytes);
            fill(G->want[i], bytes, (uint64_t)i + 1000 * home);
            ck_assert_int_eq(zo_store_write(e->st, G->t[i], 0, G->want[i], bytes), 0);
        }
}

static void groups_check(env *e, groups *G)
{
    for (int i = 0; i < NG * NPOS; i++) {
        size_t bytes = G->t[i]->bytes;
        uint8_t *got = malloc(bytes);
        ck_assert_int_eq(zo_store_read(e->st, G->t[i], 0, got, bytes), 0);
        ck_assert_msg(memcmp(got, G->want[i], bytes) == 0, "group %d tensor %d differs after the sweep", i / NPOS,
                      i % NPOS);
        free(got);
    }
}

static void groups_free(groups *G)
{
    for (int i = 0; i < NG * NPOS; i++)
        free(G->want[i]);
}

/* One READ|WRITE sweep with the update; checks every piece against the
 * expected contents before updating it, and the walk's order. */
static void sweep_update(env *e, groups *G, unsigned depth)
{
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = NPOS;
    d.ngroups = NG;
    d.tensors = G->t;
    d.depth = depth;
    zo_store_sweep *sw = NULL;
    int r = zo_store_sweep_open(e->st, &d, &sw);
    ck_assert_msg(r == 0, "sweep open: %s (%s)", zo_strerror(r), zo_last_error_detail());
    zo_store_sweep_info info;
    ck_assert_int_eq(zo_store_sweep_get_info(sw, &info), 0);
    ck_assert_uint_le(info.slots, e->cfg.slots - 1);
    size_t g = 0;
    uint64_t off = 0, idx = 0;
    zo_store_sweep_piece p;
    while ((r = zo_store_sweep_next(sw, &p)) == 0 && p.nelem) {
        while (off == g_nelem[g]) {
            g++;
            off = 0;
        }
        ck_assert_uint_eq(p.group, g);
        ck_assert_uint_eq(p.elem_off, off);
        ck_assert_uint_eq(p.index, idx);
        ck_assert_uint_le(p.nelem, info.piece_elems);
        ck_assert_int_eq(p.group_last, off + p.nelem == g_nelem[g]);
        for (int k = 0; k < NPOS; k++) {
            size_t esz = zo_dtype_size(g_dt[k]);
            uint8_t *w = G->want[g * NPOS + k] + off * esz;
            ck_assert_msg(memcmp(p.ptr[k], w, p.nelem * esz) == 0,
                          "group %zu tensor %d elements [%llu, +%llu): piece differs", g, k,
                          (unsigned long long)off, (unsigned long long)p.nelem);
            update(p.ptr[k], esz, off, p.nelem, (unsigned)k);
            update(w, esz, off, p.nelem, (unsigned)k);
        }
        ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
        off += p.nelem;
        idx++;
    }
    ck_assert_msg(r == 0, "sweep next: %s (%s)", zo_strerror(r), zo_last_error_detail());
    ck_assert_uint_eq(g, NG - 1);
    ck_assert_uint_eq(off, g_nelem[NG - 1]);
    ck_assert_uint_eq(idx, info.pieces);
    ck_assert_int_eq(zo_store_sweep_get_info(sw, &info), 0);
    ck_assert_uint_le(info.slots_peak, info.slots);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    ck_assert_ptr_null(sw);
}

START_TEST(test_group_lockstep)
{
    const zo_tier homes[3] = {ZO_TIER_NVME, ZO_TIER_HOST, ZO_TIER_DEVICE};
    zo_tier home = homes[_i];
    env e;
    /* default slot count; 64 KiB chunks, 256 KiB slots: many pieces */
    env_open(&e, 4 * MiB, 8 * MiB, 256 * KiB, 0, 64 * KiB);
    zo_store_config defaults;
    zo_store_config_default(&defaults);
    ck_assert_uint_eq(e.cfg.slots, defaults.slots);
    groups G;
    groups_make(&e, &G, home, "a");
    /* a fresher copy elsewhere than home: a dirty device copy of group 1's
     * master, a dirty host-cache copy of group 2's m (NVMe home) */
    {
        zo_tensor *t = G.t[1 * NPOS + 0];
        zo_store_req *q;
        void *dp;
        ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_DEVICE, ZO_ACQ_WRITE, &q), 0);
        ck_assert_int_eq(zo_store_wait(e.st, q, &dp), 0);
        fill(G.want[1 * NPOS + 0], t->bytes, 77);
        dev_put(e.dev, dp, G.want[1 * NPOS + 0], t->bytes);
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_DEVICE, 0), 0);
    }
    if (home == ZO_TIER_NVME) {
        zo_tensor *t = G.t[2 * NPOS + 1];
        zo_store_req *q;
        void *hp;
        ck_assert_int_eq(zo_store_acquire(e.st, t, ZO_TIER_HOST, ZO_ACQ_WRITE, &q), 0);
        ck_assert_int_eq(zo_store_wait(e.st, q, &hp), 0);
        fill(G.want[2 * NPOS + 1], t->bytes, 78);
        memcpy(hp, G.want[2 * NPOS + 1], t->bytes);
        ck_assert_int_eq(zo_store_release(e.st, t, ZO_TIER_HOST, 0), 0);
    }
    for (unsigned depth = 1; depth <= 3; depth++) {
        sweep_update(&e, &G, depth);
        check_pool_idle(e.st);
    }
    groups_check(&e, &G);
    if (home == ZO_TIER_HOST) {
        /* host-homed: the pointers are the home copy itself */
        zo_store_sweep_desc d;
        zo_store_sweep_desc_default(&d);
        d.ntensors = NPOS;
        d.ngroups = 1;
        d.tensors = &G.t[4 * NPOS];
        d.mode[0] = d.mode[1] = d.mode[2] = ZO_STREAM_READ;
        zo_store_sweep *sw;
        ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
        zo_store_sweep_info info;
        zo_store_sweep_get_info(sw, &info);
        ck_assert_uint_eq(info.slots, 0);
        zo_store_sweep_piece p;
        ck_assert_int_eq(zo_store_sweep_next(sw, &p), 0);
        ck_assert_ptr_eq(p.ptr[0], G.t[4 * NPOS]->c[ZO_TIER_HOST].ptr);
        ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    }
    groups_check(&e, &G);
    groups_free(&G);
    check_pool_idle(e.st);
    env_close(&e);
}
END_TEST

/* ---- modes: READ-only, WRITE-only, mixed homes in one group ------------------------------ */
START_TEST(test_group_modes)
{
    env e;
    env_open(&e, 0, 4 * MiB, 256 * KiB, 0, 64 * KiB);
    enum { N = 3, NE = 70001 };
    zo_tensor *t[2 * N];
    uint8_t *want[2 * N];
    const zo_dtype dt[N] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F64};
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < N; k++) {
            char name[32];
            snprintf(name, sizeof(name), "m.%d.%d", g, k);
            /* group 1's middle tensor lives in the host tier */
            zo_tier home = g == 1 && k == 1 ? ZO_TIER_HOST : ZO_TIER_NVME;
            int i = g * N + k;
            t[i] = reg(e.st, name, dt[k], NE + g, home);
            want[i] = malloc(t[i]->bytes);
            fill(want[i], t[i]->bytes, (uint64_t)i + 5);
            ck_assert_int_eq(zo_store_write(e.st, t[i], 0, want[i], t[i]->bytes), 0);
        }
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = N;
    d.ngroups = 2;
    d.tensors = t;
    d.mode[0] = ZO_STREAM_READ;
    d.mode[1] = ZO_STREAM_READ | ZO_STREAM_WRITE;
    d.mode[2] = ZO_STREAM_WRITE;
    zo_store_sweep *sw;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
    /* claimed: writes refused, reads of the READ-only position allowed */
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, t[0], ZO_TIER_HOST, ZO_ACQ_WRITE, &q), -EBUSY);
    ck_assert_int_eq(zo_store_acquire(e.st, t[2], ZO_TIER_HOST, 0, &q), -EBUSY);
    zo_store_sweep_piece p;
    int r;
    while ((r = zo_store_sweep_next(sw, &p)) == 0 && p.nelem) {
        int base = (int)p.group * N;
        uint8_t *w0 = want[base] + p.elem_off * 4;
        ck_assert(memcmp(p.ptr[0], w0, p.nelem * 4) == 0);
        uint8_t *w1 = want[base + 1] + p.elem_off * 2;
        ck_assert(memcmp(p.ptr[1], w1, p.nelem * 2) == 0);
        update(p.ptr[1], 2, p.elem_off, p.nelem, 1);
        update(w1, 2, p.elem_off, p.nelem, 1);
        /* write-only: filled from scratch; the master's piece is changed
         * too but must not be written back */
        uint8_t *w2 = want[base + 2] + p.elem_off * 8;
        fill(w2, p.nelem * 8, p.index + 99);
        memcpy(p.ptr[2], w2, p.nelem * 8);
        memset(p.ptr[0], 0xee, p.nelem * 4);
        ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    }
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    for (int i = 0; i < 2 * N; i++) {
        uint8_t *got = malloc(t[i]->bytes);
        ck_assert_int_eq(zo_store_read(e.st, t[i], 0, got, t[i]->bytes), 0);
        ck_assert_msg(memcmp(got, want[i], t[i]->bytes) == 0, "tensor %d differs", i);
        free(got);
        free(want[i]);
    }
    check_pool_idle(e.st);
    env_close(&e);
}
END_TEST

/* ---- read-ahead across groups at the default slot count --------------------------------- */
typedef struct {
    _Atomic uint64_t read_bytes;
    _Atomic int mode; /* fault: 0 none, 1 reads fail, 2 writes fail */
    _Atomic int hits;
} observer;

static int64_t observe_hook(void *user, const zo__aio_fault_site *s)
{
    observer *o = user;
    int m = atomic_load(&o->mode);
    if (s->op == ZO__OP_READ && m == 1) {
        atomic_fetch_add(&o->hits, 1);
        return -EIO;
    }
    if (s->op == ZO__OP_WRITE && m == 2) {
        atomic_fetch_add(&o->hits, 1);
        return -EIO;
    }
    if (s->op == ZO__OP_READ && s->attempt == 0)
        atomic_fetch_add(&o->read_bytes, s->len);
    return 0;
}

/* The hook goes in before any I/O (it may not change while requests are in
 * flight); the mode switches faults on and off. */
static void observer_install(env *e, observer *o)
{
    atomic_init(&o->read_bytes, 0);
    atomic_init(&o->mode, 0);
    atomic_init(&o->hits, 0);
    zo__aio_set_fault(zo_swap_get_aio(e->swap), observe_hook, o);
}

static int wait_read_bytes(observer *o, uint64_t want)
{
    for (int i = 0; i < 30000; i++) { /* 30 s: a loaded machine, sanitizers */
        if (atomic_load(&o->read_bytes) >= want)
            return 1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

START_TEST(test_group_readahead)
{
    env e;
    /* the default slot count and chunk size (1 MiB), 2 MiB slots: f32
     * pieces of 2 MiB, bf16 ones of 1 MiB */
    env_open(&e, 0, 0, 2 * MiB, 0, 1 * MiB);
    observer o;
    observer_install(&e, &o);
    enum { G = 3 };
    const uint64_t ne = 2 * 512 * 1024; /* two pieces of 512 Ki elements per group */
    zo_store_config defaults;
    zo_store_config_default(&defaults);
    ck_assert_uint_eq(e.cfg.slots, defaults.slots);
    zo_tensor *t[G * NPOS];
    for (int g = 0; g < G; g++)
        for (int k = 0; k < NPOS; k++) {
            char name[32];
            snprintf(name, sizeof(name), "r.%d.%d", g, k);
            t[g * NPOS + k] = reg(e.st, name, g_dt[k], ne, ZO_TIER_NVME);
            size_t bytes = t[g * NPOS + k]->bytes;
            uint8_t *buf = malloc(bytes);
            fill(buf, bytes, (uint64_t)(g * NPOS + k));
            ck_assert_int_eq(zo_store_write(e.st, t[g * NPOS + k], 0, buf, bytes), 0);
            free(buf);
        }
    atomic_store(&o.read_bytes, 0);
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = NPOS;
    d.ngroups = G;
    d.tensors = t;
    d.depth = 2;
    zo_store_sweep *sw;
    int r = zo_store_sweep_open(e.st, &d, &sw);
    ck_assert_msg(r == 0, "open at the default slot count: %s (%s)", zo_strerror(r), zo_last_error_detail());
    zo_store_sweep_info info;
    zo_store_sweep_get_info(sw, &info);
    ck_assert_uint_eq(info.piece_elems, 512 * 1024); /* >= 1 MiB per tensor piece */
    ck_assert_uint_le(info.slots, e.cfg.slots - 1);
    ck_assert_uint_eq(info.pieces, 2 * G);
    uint64_t piece_bytes = info.piece_elems * (4 + 2 + 2);
    zo_store_sweep_piece p;
    /* hold group 0's last piece: group 1's first two pieces load meanwhile */
    ck_assert_int_eq(zo_store_sweep_next(sw, &p), 0);
    ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    ck_assert_int_eq(zo_store_sweep_next(sw, &p), 0);
    ck_assert_int_eq(p.group_last, 1);
    ck_assert_msg(wait_read_bytes(&o, 4 * piece_bytes), "read-ahead did not cross into group 1: %llu bytes read",
                  (unsigned long long)atomic_load(&o.read_bytes));
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    ck_assert_uint_le(st.pool_in_use, info.slots);
    /* another sweep cannot take the slots this one holds */
    zo_store_sweep_desc d2 = d;
    d2.ngroups = 1;
    zo_store_sweep *sw2;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d2, &sw2), -EBUSY); /* its tensors are claimed */
    ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    while ((r = zo_store_sweep_next(sw, &p)) == 0 && p.nelem) {
        zo_store_get_stats(e.st, &st);
        ck_assert_uint_le(st.pool_in_use, info.slots);
        ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    }
    ck_assert_int_eq(r, 0);
    zo_store_sweep_get_info(sw, &info);
    ck_assert_uint_le(info.slots_peak, info.slots);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    zo__aio_set_fault(zo_swap_get_aio(e.swap), NULL, NULL);
    check_pool_idle(e.st);
    env_close(&e);
}
END_TEST

/* ---- the layout at the defaults (numbers docs/store.md quotes) ------------------------- */
/* Open a sweep and check its layout: pieces of 1 Mi elements (the default
 * slots at these sizes), the depth, frames and slots given. */
static zo_store_sweep *open_layout(zo_store *st, const zo_store_sweep_desc *d, unsigned depth, unsigned frames,
                                   unsigned slots)
{
    zo_store_sweep *sw = NULL;
    ck_assert_int_eq(zo_store_sweep_open(st, d, &sw), 0);
    zo_store_sweep_info info;
    zo_store_sweep_get_info(sw, &info);
    ck_assert_uint_eq(info.piece_elems, 1u << 20);
    ck_assert_uint_eq(info.depth, depth);
    ck_assert_uint_eq(info.frames, frames);
    ck_assert_uint_eq(info.slots, slots);
    return sw;
}

/* Walk a sweep of never-written tensors to its end (every piece reads as
 * zeros, sampled) and close it. */
static void walk_zeros_close(zo_store_sweep **sw, int ntensors)
{
    zo_store_sweep_piece p;
    int r;
    while ((r = zo_store_sweep_next(*sw, &p)) == 0 && p.nelem) {
        for (int k = 0; k < ntensors; k++)
            for (uint64_t i = 0; i < p.nelem; i += 4099)
                ck_assert_uint_eq(((uint8_t *)p.ptr[k])[i], 0);
        ck_assert_int_eq(zo_store_sweep_done(*sw, &p), 0);
    }
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(zo_store_sweep_close(sw), 0);
}

START_TEST(test_group_default_layout)
{
    env e;
    zo_store_config defaults;
    zo_store_config_default(&defaults);
    /* default slot size and count, default chunk (1 MiB); never-written
     * chunks read as zeros without I/O, so large tensors cost nothing */
    env_open(&e, 0, 0, defaults.slot_size, 0, 1 * MiB);
    const uint64_t ne = 2u << 20;
    zo_tensor *t[2][3];
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 3; k++) {
            char name[32];
            snprintf(name, sizeof(name), "%s.%d", g ? "f32" : "mixed", k);
            t[g][k] = reg(e.st, name, g || k == 0 ? ZO_DTYPE_F32 : ZO_DTYPE_BF16, ne, ZO_TIER_NVME);
        }
    /* depth by bytes: mixed pieces carry 8 bytes an element, fp32 ones 12,
     * so the mixed sweep reads 3 pieces ahead (24 MiB, as fp32's 2) with 2
     * writing back: 6 frames of 8 MiB, the same 12 slots as fp32's 4 of 12 */
    const unsigned want_slots[2] = {12, 12}, want_frames[2] = {6, 4}, want_depth[2] = {3, 2};
    for (int g = 0; g < 2; g++) {
        zo_store_sweep_desc d;
        zo_store_sweep_desc_default(&d);
        d.ntensors = 3;
        d.ngroups = 1;
        d.tensors = t[g];
        zo_store_sweep *sw = open_layout(e.st, &d, want_depth[g], want_frames[g], want_slots[g]);
        walk_zeros_close(&sw, 3);
    }
    /* when the slots do not allow the deeper layout with pieces as large,
     * the caller's depth stands: 8 slots hold 4 mixed frames of 1 Mi */
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = 3;
    d.ngroups = 1;
    d.tensors = t[0];
    d.max_slots = 8;
    zo_store_sweep *sw = open_layout(e.st, &d, 2, 4, 8);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    /* depth_elem_bytes: a master-only sweep (the optimizer's, with quantized
     * m and v read beside it) counted in an fp32 master + m + v element's 12
     * bytes reads 6 pieces of 4 MiB ahead (24 MiB, as the full sweep's 2 of
     * 12) with 3 writing back: 10 frames in 10 slots, at most the full
     * sweep's 12; at most the positions' own bytes (4, or 0) it changes
     * nothing; garbage is refused */
    const unsigned ebytes[3] = {12, 4, 0}, edepth[3] = {6, 2, 2}, eframes[3] = {10, 4, 4};
    for (int c = 0; c < 3; c++) {
        zo_store_sweep_desc_default(&d);
        d.ngroups = 1;
        d.tensors = &t[1][0];
        d.depth_elem_bytes = ebytes[c];
        sw = open_layout(e.st, &d, edepth[c], eframes[c], eframes[c]);
        walk_zeros_close(&sw, 1);
    }
    zo_store_sweep_desc_default(&d);
    d.ngroups = 1;
    d.tensors = &t[1][0];
    d.depth_elem_bytes = 1000;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), -EINVAL);
    ck_assert_ptr_null(sw);
    ck_assert_ptr_nonnull(strstr(zo_store_errmsg(e.st), "depth_elem_bytes 1000"));
    /* a step's worth of sweeps back to back: the pool comes back each time */
    check_pool_idle(e.st);
    env_close(&e);
}
END_TEST

/* ---- errors of reads and write-backs ----------------------------------------------------- */
START_TEST(test_group_io_error)
{
    int writes = _i == 1;
    env e;
    env_open(&e, 0, 0, 256 * KiB, 0, 64 * KiB);
    observer o;
    observer_install(&e, &o);
    zo_tensor *t[2];
    t[0] = reg(e.st, "e.master", ZO_DTYPE_F32, 300001, ZO_TIER_NVME);
    t[1] = reg(e.st, "e.m", ZO_DTYPE_BF16, 300001, ZO_TIER_NVME);
    for (int k = 0; k < 2; k++) {
        uint8_t *buf = malloc(t[k]->bytes);
        fill(buf, t[k]->bytes, (uint64_t)k);
        ck_assert_int_eq(zo_store_write(e.st, t[k], 0, buf, t[k]->bytes), 0);
        free(buf);
    }
    atomic_store(&o.mode, writes ? 2 : 1);
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = 2;
    d.ngroups = 1;
    d.tensors = t;
    zo_store_sweep *sw;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
    zo_store_sweep_piece p;
    int r, n = 0;
    while ((r = zo_store_sweep_next(sw, &p)) == 0 && p.nelem) {
        n++;
        ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    }
    ck_assert_msg(r == -EIO, "next: %s", zo_strerror(r));
    ck_assert(strstr(zo_last_error_detail(), "e.m") || strstr(zo_last_error_detail(), "e.master"));
    if (!writes)
        ck_assert_int_eq(n, 0);
    ck_assert_int_eq(zo_store_sweep_close(&sw), -EIO);
    ck_assert_int_gt(atomic_load(&o.hits), 0);
    atomic_store(&o.mode, 0);
    /* the tensors are usable again, and a new sweep works; after failed
     * write-backs the chunks read back as ZO_ESTATE until written again */
    check_pool_idle(e.st);
    if (writes) {
        zo_store_sweep_desc w = d;
        w.mode[0] = w.mode[1] = ZO_STREAM_WRITE;
        ck_assert_int_eq(zo_store_sweep_open(e.st, &w, &sw), 0);
        while ((r = zo_store_sweep_next(sw, &p)) == 0 && p.nelem) {
            memset(p.ptr[0], 1, p.nelem * 4);
            memset(p.ptr[1], 2, p.nelem * 2);
            ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
        }
        ck_assert_int_eq(r, 0);
        ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    }
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
    while ((r = zo_store_sweep_next(sw, &p)) == 0 && p.nelem)
        ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    zo__aio_set_fault(zo_swap_get_aio(e.swap), NULL, NULL);
    check_pool_idle(e.st);
    env_close(&e);
}
END_TEST

/* ---- close in the middle ------------------------------------------------------------------ */
START_TEST(test_group_close_mid)
{
    env e;
    env_open(&e, 0, 4 * MiB, 256 * KiB, 0, 64 * KiB);
    groups G;
    groups_make(&e, &G, ZO_TIER_NVME, "c");
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = NPOS;
    d.ngroups = NG;
    d.tensors = G.t;
    zo_store_sweep *sw;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
    zo_store_sweep_piece p;
    /* through group 2 and into group 4 (131071 elements: several pieces),
     * holding the last piece handed out */
    int held = 0;
    for (;;) {
        int r = zo_store_sweep_next(sw, &p);
        ck_assert_msg(r == 0, "next: %s (%s)", zo_strerror(r), zo_last_error_detail());
        ck_assert_uint_ne(p.nelem, 0);
        for (int k = 0; k < NPOS; k++) {
            size_t esz = zo_dtype_size(g_dt[k]);
            update(p.ptr[k], esz, p.elem_off, p.nelem, (unsigned)k);
            update(G.want[p.group * NPOS + k] + p.elem_off * esz, esz, p.elem_off, p.nelem, (unsigned)k);
        }
        if (p.group == 4) {
            held = 1;
            break;
        }
        ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    }
    ck_assert(held);
    /* groups already finished are given back before the sweep closes */
    zo_store_req *q;
    ck_assert_int_eq(zo_store_acquire(e.st, G.t[0], ZO_TIER_HOST, 0, &q), 0);
    void *hp;
    ck_assert_int_eq(zo_store_wait(e.st, q, &hp), 0);
    ck_assert(memcmp(hp, G.want[0], G.t[0]->bytes) == 0);
    ck_assert_int_eq(zo_store_release(e.st, G.t[0], ZO_TIER_HOST, 0), 0);
    /* group 4, half done, is still claimed */
    ck_assert_int_eq(zo_store_acquire(e.st, G.t[4 * NPOS], ZO_TIER_HOST, ZO_ACQ_WRITE, &q), -EBUSY);
    /* closing writes the held piece back; group 5 keeps its contents */
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    groups_check(&e, &G);
    check_pool_idle(e.st);
    /* everything usable again */
    ck_assert_int_eq(zo_store_acquire(e.st, G.t[4 * NPOS], ZO_TIER_HOST, ZO_ACQ_WRITE, &q), 0);
    ck_assert_int_eq(zo_store_wait(e.st, q, &hp), 0);
    ck_assert_int_eq(zo_store_release(e.st, G.t[4 * NPOS], ZO_TIER_HOST, 0), 0);
    /* holding more than depth, and a piece whose room the next one needs */
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
    zo_store_sweep_piece a, b;
    ck_assert_int_eq(zo_store_sweep_next(sw, &a), 0);
    ck_assert_int_eq(zo_store_sweep_next(sw, &b), 0);
    ck_assert_int_eq(zo_store_sweep_next(sw, &p), ZO_ESTATE);
    ck_assert_int_eq(zo_store_sweep_done(sw, &b), 0);
    ck_assert_int_eq(zo_store_sweep_done(sw, &b), -EINVAL); /* not held any more */
    /* fp32 + bf16 + bf16 at depth 2: read ahead 3 pieces, 2 writing back
     * (depth by bytes: 8 bytes an element where fp32 has 12) */
    zo_store_sweep_info info;
    zo_store_sweep_get_info(sw, &info);
    ck_assert_uint_eq(info.depth, 3);
    ck_assert_uint_eq(info.frames, 6);
    for (unsigned i = 2; i < info.frames; i++) {
        ck_assert_int_eq(zo_store_sweep_next(sw, &p), 0);
        ck_assert_int_eq(zo_store_sweep_done(sw, &p), 0);
    }
    /* piece 0 (still held) sits in the room piece `frames` needs */
    ck_assert_int_eq(zo_store_sweep_next(sw, &p), ZO_ESTATE);
    ck_assert_int_eq(zo_store_sweep_done(sw, &a), 0);
    ck_assert_int_eq(zo_store_sweep_next(sw, &p), 0);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    groups_check(&e, &G); /* nothing changed: the pieces were written back as they were */
    groups_free(&G);
    check_pool_idle(e.st);
    env_close(&e);
}
END_TEST

/* ---- a sweep beside other traffic --------------------------------------------------------- */
typedef struct side {
    env *e;
    zo_tensor *t[4];
    uint8_t *want[4];
    _Atomic int stop;
    int err;
} side;

/* acquires of other tensors through a small host tier, and reads */
static void *side_main(void *arg)
{
    side *sd = arg;
    uint8_t *got = malloc(sd->t[3]->bytes); /* the largest */
    for (unsigned it = 0; !atomic_load(&sd->stop) && !sd->err; it++) {
        zo_tensor *t = sd->t[it % 4];
        zo_store_req *q;
        void *hp;
        int r = zo_store_acquire(sd->e->st, t, ZO_TIER_HOST, 0, &q);
        if (r == 0)
            r = zo_store_wait(sd->e->st, q, &hp);
        if (r == 0) {
            if (memcmp(hp, sd->want[it % 4], t->bytes) != 0)
                r = -EILSEQ;
            int r2 = zo_store_release(sd->e->st, t, ZO_TIER_HOST, 0);
            r = r ? r : r2;
        }
        if (r == 0 && (r = zo_store_read(sd->e->st, t, 0, got, t->bytes)) == 0 &&
            memcmp(got, sd->want[it % 4], t->bytes) != 0)
            r = -EILSEQ;
        if (r)
            sd->err = r;
    }
    free(got);
    return NULL;
}

START_TEST(test_group_beside_traffic)
{
    env e;
    /* a host tier for two of the four side tensors at a time */
    env_open(&e, 0, 2 * 260 * KiB, 256 * KiB, 0, 64 * KiB);
    groups G;
    groups_make(&e, &G, ZO_TIER_NVME, "b");
    side sd = {.e = &e};
    atomic_init(&sd.stop, 0);
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof(name), "side.%d", i);
        sd.t[i] = reg(e.st, name, ZO_DTYPE_U8, 250 * KiB + (uint64_t)i * 1000, ZO_TIER_NVME);
        sd.want[i] = malloc(sd.t[i]->bytes);
        fill(sd.want[i], sd.t[i]->bytes, 500 + (uint64_t)i);
        ck_assert_int_eq(zo_store_write(e.st, sd.t[i], 0, sd.want[i], sd.t[i]->bytes), 0);
    }
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, side_main, &sd), 0);
    for (int round = 0; round < 3; round++)
        sweep_update(&e, &G, 2);
    atomic_store(&sd.stop, 1);
    pthread_join(th, NULL);
    ck_assert_msg(sd.err == 0, "side traffic: %s", zo_strerror(sd.err));
    groups_check(&e, &G);
    groups_free(&G);
    for (int i = 0; i < 4; i++)
        free(sd.want[i]);
    check_pool_idle(e.st);
    env_close(&e);
}
END_TEST

/* ---- bad input ----------------------------------------------------------------------------- */
START_TEST(test_group_bad_input)
{
    env e;
    env_open(&e, 0, 1 * MiB, 256 * KiB, 0, 64 * KiB);
    zo_tensor *a = reg(e.st, "a", ZO_DTYPE_F32, 1000, ZO_TIER_NVME);
    zo_tensor *b = reg(e.st, "b", ZO_DTYPE_BF16, 1000, ZO_TIER_NVME);
    zo_tensor *c = reg(e.st, "c", ZO_DTYPE_BF16, 999, ZO_TIER_NVME);
    zo_tensor_desc td;
    zo_tensor_desc_default(&td);
    td.name = "odd";
    td.dtype = ZO_DTYPE_F32;
    td.bytes = 1001; /* not a whole number of f32 */
    zo_tensor *odd;
    ck_assert_int_eq(zo_store_register(e.st, &td, &odd), 0);
    zo_store_sweep *sw = (zo_store_sweep *)1;
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    zo_tensor *ab[2] = {a, b};
    d.ntensors = 2;
    d.ngroups = 1;
    d.tensors = ab;
    ck_assert_int_eq(zo_store_sweep_open(NULL, &d, &sw), -EINVAL);
    ck_assert_int_eq(zo_store_sweep_open(e.st, NULL, &sw), -EINVAL);
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, NULL), -EINVAL);
    zo_store_sweep_desc x = d;
    x.ntensors = 0;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    ck_assert_ptr_null(sw);
    x.ntensors = ZO_SWEEP_MAX_TENSORS + 1;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x = d;
    x.ngroups = 0;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x = d;
    x.tensors = NULL;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x = d;
    x.depth = 0;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x.depth = 65;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x = d;
    x.mode[1] = 0;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x.mode[1] = 4;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x = d;
    x.struct_size = 3;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x = d;
    zo_tensor *withnull[2] = {a, NULL};
    x.tensors = withnull;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    zo_tensor *mismatch[2] = {a, c};
    x.tensors = mismatch;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    ck_assert(strstr(zo_store_errmsg(e.st), "elements"));
    zo_tensor *twice[2] = {a, a};
    x.tensors = twice;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    ck_assert(strstr(zo_store_errmsg(e.st), "twice"));
    zo_tensor *across[4] = {a, b, b, a}; /* each group fine, the sweep lists them twice */
    x.tensors = across;
    x.ngroups = 2;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    x = d;
    x.ntensors = 1;
    x.tensors = &odd;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EINVAL);
    ck_assert_ptr_null(sw);
    /* busy: a referenced tensor cannot be written by a sweep; read it can */
    zo_store_req *q;
    void *hp;
    ck_assert_int_eq(zo_store_acquire(e.st, a, ZO_TIER_HOST, 0, &q), 0);
    ck_assert_int_eq(zo_store_wait(e.st, q, &hp), 0);
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), -EBUSY);
    x = d;
    x.mode[0] = ZO_STREAM_READ;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), 0);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    ck_assert_int_eq(zo_store_release(e.st, a, ZO_TIER_HOST, 0), 0);
    /* a stream open on one of them */
    zo_store_stream *str;
    ck_assert_int_eq(zo_store_stream_open(e.st, b, ZO_STREAM_READ, 1, &str), 0);
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), -EBUSY);
    ck_assert_int_eq(zo_store_stream_close(&str), 0);
    /* max_slots: 1000 elements in one chunk-sized piece (32 Ki elements
     * of bf16: 128 KiB of f32 + 64 KiB of bf16), 4 frames pack into 3 slots */
    x = d;
    x.max_slots = 3;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), 0);
    zo_store_sweep_info info;
    ck_assert_int_eq(zo_store_sweep_get_info(sw, &info), 0);
    ck_assert_uint_eq(info.slots, 3);
    ck_assert_uint_eq(info.piece_elems, 32 * 1024);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    x.max_slots = 2;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EBUSY);
    ck_assert(strstr(zo_store_errmsg(e.st), "slots"));
    x.max_slots = 0;
    x.depth = 64; /* 66 frames: 50 slots, the pool has 16 */
    ck_assert_int_eq(zo_store_sweep_open(e.st, &x, &sw), -EBUSY);
    /* next/done/info/close on NULL */
    zo_store_sweep_piece p;
    ck_assert_int_eq(zo_store_sweep_next(NULL, &p), -EINVAL);
    ck_assert_int_eq(zo_store_sweep_done(NULL, &p), -EINVAL);
    ck_assert_int_eq(zo_store_sweep_get_info(NULL, NULL), -EINVAL);
    ck_assert_int_eq(zo_store_sweep_close(NULL), 0);
    sw = NULL;
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    /* a piece that was never handed out */
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
    memset(&p, 0, sizeof(p));
    p.nelem = 1;
    ck_assert_int_eq(zo_store_sweep_done(sw, &p), -EINVAL);
    ck_assert_int_eq(zo_store_sweep_next(sw, &p), 0);
    ck_assert_int_eq(zo_store_sweep_next(sw, NULL), -EINVAL);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    check_pool_idle(e.st);
    env_close(&e);
    /* slots as large as a chunk: a bf16 piece starts on a chunk (32 Ki
     * elements), the f32 piece of those elements takes two chunks */
    env_open(&e, 0, 0, 64 * KiB, 0, 64 * KiB);
    a = reg(e.st, "a", ZO_DTYPE_F32, 100000, ZO_TIER_NVME);
    b = reg(e.st, "b", ZO_DTYPE_BF16, 100000, ZO_TIER_NVME);
    zo_tensor *ab2[2] = {a, b};
    d.tensors = ab2;
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), ZO_ECONFIG);
    ck_assert(strstr(zo_store_errmsg(e.st), "smaller swap chunk"));
    d.ntensors = 1; /* one element size: fine */
    ck_assert_int_eq(zo_store_sweep_open(e.st, &d, &sw), 0);
    ck_assert_int_eq(zo_store_sweep_close(&sw), 0);
    env_close(&e);
}
END_TEST

/* ---- the tier bytes query ----------------------------------------------------------------- */
static void desc_of(zo_tensor_desc *d, const char *name, uint64_t bytes, zo_tier home)
{
    zo_tensor_desc_default(d);
    d->name = name;
    d->dtype = ZO_DTYPE_U8;
    d->bytes = bytes;
    d->home = home;
}

START_TEST(test_group_tier_bytes)
{
    /* host-homed tensors: a tier of exactly `exact` bytes holds them; one
     * page less does not */
    const uint64_t sz[3] = {4 * MiB + 4, 2 * MiB + 1, 2 * MiB + 1};
    zo_tensor_desc ds[3];
    const zo_tensor_desc *dp[3];
    const char *names[3] = {"master", "m", "v"};
    for (int i = 0; i < 3; i++) {
        desc_of(&ds[i], names[i], sz[i], ZO_TIER_HOST);
        dp[i] = &ds[i];
    }
    zo_store_tier_need need;
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, dp, 3, &need), 0);
    ck_assert_uint_eq(need.exact, (4 * MiB + 4096) + 2 * (2 * MiB + 4096));
    ck_assert_uint_ge(need.any_layout, need.exact);
    for (int less = 0; less < 2; less++) {
        zo_store_config c;
        zo_store_config_default(&c);
        c.host_bytes = need.exact - (less ? 4096 : 0);
        c.slots = 0;
        zo_store *s;
        ck_assert_int_eq(zo_store_create(&s, &c), 0);
        int r = 0;
        zo_tensor *t;
        for (int i = 0; i < 3 && r == 0; i++)
            r = zo_store_register(s, &ds[i], &t);
        ck_assert_int_eq(r, less ? ZO_EBUDGET : 0);
        zo_store_destroy(&s);
    }
    /* device tier: 256-byte granule */
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_DEVICE, dp, 3, &need), 0);
    ck_assert_uint_eq(need.exact, (4 * MiB + 256) + 2 * (2 * MiB + 256));
    /* bad input */
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_NVME, dp, 3, &need), -EINVAL);
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, NULL, 3, &need), -EINVAL);
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, dp, 3, NULL), -EINVAL);
    const zo_tensor_desc *withnull[2] = {&ds[0], NULL};
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, withnull, 2, &need), -EINVAL);
    zo_tensor_desc bad = ds[0];
    bad.bytes = 0;
    const zo_tensor_desc *badp = &bad;
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, &badp, 1, &need), -EINVAL);
    ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, NULL, 0, &need), 0);
    ck_assert_uint_eq(need.exact, 0);

    /* a host cache of NVMe-homed groups of different sizes, each group
     * acquired whole (every copy referenced) then released: a cache of the
     * largest any_layout never fails, whatever the order of the groups */
    env e;
    enum { NGR = 12 };
    zo_test_rng rng = {zo_test_seed()};
    uint64_t gsz[NGR][3];
    uint64_t cache = 0;
    for (int g = 0; g < NGR; g++) {
        uint64_t n = 1 + zo_test_next(&rng) % (600 * 1024);
        gsz[g][0] = n * 4;
        gsz[g][1] = gsz[g][2] = n * (zo_test_next(&rng) & 1 ? 2 : 4);
        zo_tensor_desc gd[3];
        const zo_tensor_desc *gp[3];
        for (int k = 0; k < 3; k++) {
            desc_of(&gd[k], names[k], gsz[g][k], ZO_TIER_HOST);
            gp[k] = &gd[k];
        }
        ck_assert_int_eq(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, gp, 3, &need), 0);
        cache = ZO_MAX(cache, need.any_layout);
    }
    env_open(&e, 0, cache, 256 * KiB, 4, 64 * KiB);
    zo_tensor *t[NGR][3];
    for (int g = 0; g < NGR; g++)
        for (int k = 0; k < 3; k++) {
            char name[32];
            snprintf(name, sizeof(name), "h.%d.%d", g, k);
            zo_tensor_desc td;
            desc_of(&td, name, gsz[g][k], ZO_TIER_NVME);
            ck_assert_int_eq(zo_store_register(e.st, &td, &t[g][k]), 0);
        }
    for (int round = 0; round < 4 * NGR; round++) {
        int g = round < NGR ? round : (int)(zo_test_next(&rng) % NGR);
        for (int k = 0; k < 3; k++) {
            zo_store_req *q;
            void *hp;
            ck_assert_int_eq(zo_store_acquire(e.st, t[g][k], ZO_TIER_HOST, 0, &q), 0);
            int r = zo_store_wait(e.st, q, &hp);
            ck_assert_msg(r == 0, "round %d group %d tensor %d: %s (%s)", round, g, k, zo_strerror(r),
                          zo_last_error_detail());
        }
        for (int k = 0; k < 3; k++)
            ck_assert_int_eq(zo_store_release(e.st, t[g][k], ZO_TIER_HOST, 0), 0);
    }
    env_close(&e);
}
END_TEST

int main(void)
{
    zo_log_set_level(ZO_LOG_ERROR);
    Suite *s = suite_create("store-group");
    TCase *tc = tcase_create("sweep");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_group_lockstep, 0, 3);
    tcase_add_test(tc, test_group_modes);
    tcase_add_test(tc, test_group_readahead);
    tcase_add_test(tc, test_group_default_layout);
    tcase_add_test(tc, test_group_close_mid);
    tcase_add_test(tc, test_group_beside_traffic);
    tcase_add_test(tc, test_group_bad_input);
    tcase_add_test(tc, test_group_tier_bytes);
    suite_add_tcase(s, tc);
    /* a hang is the bug these look for: fail it in bounded time */
    tc = tcase_create("errors");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_group_io_error, 0, 2);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
