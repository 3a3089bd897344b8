/* SPDX-License-Identifier: Apache-2.0 */
/* Tiling: the device GEMM op, the planner, the tiled linear and the
 * vocabulary-tiled cross-entropy, on the host device backend (the
 * reference: "device memory" is host memory capped by host_mem_limit) with
 * a real pinned-memory store and a real swap store in a temporary
 * directory.
 *
 * Tolerance: every result is compared with a double-precision reference
 * computed from the same (bf16-rounded where the type is bf16) inputs;
 * |got - ref| <= 2^-20 * (sum of |terms| of that output) + 1e-30, i.e. the
 * f32 accumulation error bound of k products with a margin of 16 ulps, at
 * any tiling (the tile loop only changes the summation order).
 *
 * Peak device memory: the device's limit is set to exactly the bytes of
 * the caller's tensors, the store's device tier and the operator's budget,
 * so any allocation past the budget fails the run; the operator's own
 * allocation is also read back (zo_dev_get_info) and compared with the
 * planner's work_bytes and the budget.
 *
 * argv[1] "cuda": the same suite on the CUDA backend (skips, 77, without one). */
#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>

#include "zo_test.h"
#include "zo_test_dev.h"

#include <zoffload/zoffload.h>

#include "dev/dev_internal.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

static zo_dev_kind g_kind = ZO_DEV_HOST;

/* ---- helpers ---------------------------------------------------------------------------- */
static float rnd(zo_test_rng *r)
{
    return (float)(zo_test_uniform(r) * 2.0 - 1.0);
}

/* Round-trip through the storage type, so the reference sees what the op sees. */
static float quant(float v, zo_dtype t)
{
    if (t == ZO_DTYPE_BF16)
        return zo_bf16_to_f32(zo_f32_to_bf16(v));
    return t == ZO_DTYPE_F16 ? zo_f16_to_f32(zo_f32_to_f16(v)) : v;
}

/* n random values: f32 copy (already rounded to t) and the packed t bytes */
static void fill(zo_test_rng *r, float *f, void *packed, zo_dtype t, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        f[i] = quant(rnd(r) * scale, t);
    ck_assert_int_eq(zo_vec_cast(packed, t, f, ZO_DTYPE_F32, n), 0);
}

static int close_enough(double got, double ref, double mag)
{
    return fabs(got - ref) <= 0x1p-20 * mag + 1e-30;
}

static zo_dev *dev_open(size_t limit)
{
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.kind = g_kind;
    dc.host_mem_limit = limit;
    zo_dev *d = NULL;
    int r = zo_dev_open(&d, &dc);
    ck_assert_msg(r == 0, "zo_dev_open: %s (%s)", zo_strerror(r), zo_last_error_detail());
    return d;
}

/* Exact device accounting: the host backend's (CUDA's free memory also
 * moves with cuBLAS's workspace and other processes). */
static int exact_mem(void)
{
    return g_kind == ZO_DEV_HOST;
}

static size_t dev_used(zo_dev *d)
{
    zo_dev_info di;
    ck_assert_int_eq(zo_dev_get_info(d, &di), 0);
    return di.total_mem - di.free_mem;
}

static void *dmalloc(zo_dev *d, size_t n)
{
    void *p = NULL;
    int r = zo_dev_malloc(d, &p, n);
    ck_assert_msg(r == 0, "zo_dev_malloc(%zu): %s (%s)", n, zo_strerror(r), zo_dev_errmsg(d));
    return p;
}

static void h2d(zo_dev *d, void *dst, const void *src, size_t n)
{
    zo_stream *s;
    ck_assert_int_eq(zo_stream_create(d, &s), 0);
    ck_assert_int_eq(zo_memcpy_async(s, dst, src, n, ZO_COPY_H2D), 0);
    ck_assert_int_eq(zo_stream_sync(s), 0);
    zo_stream_destroy(&s);
}

static void d2h(zo_dev *d, void *dst, const void *src, size_t n)
{
    zo_stream *s;
    ck_assert_int_eq(zo_stream_create(d, &s), 0);
    ck_assert_int_eq(zo_memcpy_async(s, dst, src, n, ZO_COPY_D2H), 0);
    ck_assert_int_eq(zo_stream_sync(s), 0);
    zo_stream_destroy(&s);
}

/* ---- GEMM ------------------------------------------------------------------------------- */
/* op(X)(r, c) of a row-major f32 matrix with stride ld */
static double at(const float *x, zo_gemm_op op, size_t ld, size_t r, size_t c)
{
    return op == ZO_GEMM_N ? x[r * ld + c] : x[c * ld + r];
}

static void check_gemm(zo_dev *d, zo_stream *s, zo_test_rng *rng, zo_dtype t, zo_gemm_op oa, zo_gemm_op ob,
                       size_t m, size_t n, size_t k, size_t pad, float alpha, float beta)
{
    size_t esz = zo_dtype_size(t);
    size_t ar = oa == ZO_GEMM_N ? m : k, ac = oa == ZO_GEMM_N ? k : m;
    size_t br = ob == ZO_GEMM_N ? k : n, bc = ob == ZO_GEMM_N ? n : k;
    size_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
    size_t na = ZO_MAX(ar * lda, (size_t)1), nb = ZO_MAX(br * ldb, (size_t)1), nc = m * ldc;
    float *fa = malloc(na * 4), *fb = malloc(nb * 4), *fc = malloc(nc * 4), *out = malloc(nc * 4);
    void *pa = malloc(na * esz), *pb = malloc(nb * esz);
    fill(rng, fa, pa, t, na, 1.0f);
    fill(rng, fb, pb, t, nb, 1.0f);
    for (size_t i = 0; i < nc; i++)
        fc[i] = beta == 0.0f ? NAN : rnd(rng); /* beta 0 must ignore C */
    void *da = dmalloc(d, na * esz), *db = dmalloc(d, nb * esz), *dc = dmalloc(d, nc * 4);
    h2d(d, da, pa, na * esz);
    h2d(d, db, pb, nb * esz);
    h2d(d, dc, fc, nc * 4);
    int r = zo_gemm_async(s, oa, ob, m, n, k, alpha, da, lda, db, ldb, t, beta, dc, ldc);
    ck_assert_msg(r == 0, "zo_gemm_async: %s (%s)", zo_strerror(r), zo_dev_errmsg(d));
    ck_assert_int_eq(zo_stream_sync(s), 0);
    d2h(d, out, dc, nc * 4);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (size_t p = 0; p < k; p++) {
                double v = at(fa, oa, lda, i, p) * at(fb, ob, ldb, p, j);
                ref += v;
                mag += fabs(v);
            }
            ref *= alpha;
            mag *= fabs(alpha);
            if (beta != 0.0f) {
                ref += (double)beta * fc[i * ldc + j];
                mag += fabs((double)beta * fc[i * ldc + j]);
            }
            ZO_EXPECT(close_enough(out[i * ldc + j], ref, mag),
                      "%s %c%c m=%zu n=%zu k=%zu pad=%zu: C(%zu,%zu) = %.9g, reference %.9g", zo_dtype_name(t),
                      oa ? 'T' : 'N', ob ? 'T' : 'N', m, n, k, pad, i, j, out[i * ldc + j], ref);
        }
        for (size_t j = n; j < ldc; j++) /* the padding is not written */
            ZO_EXPECT(memcmp(&out[i * ldc + j], &fc[i * ldc + j], 4) == 0, "padding of C row %zu written", i);
    }
    zo_dev_free(d, da);
    zo_dev_free(d, db);
    zo_dev_free(d, dc);
    free(fa), free(fb), free(fc), free(out), free(pa), free(pb);
}

START_TEST(gemm_shapes)
{
    zo_dev *d = dev_open(0);
    zo_stream *s;
    ck_assert_int_eq(zo_stream_create(d, &s), 0);
    zo_test_rng rng = {zo_test_seed()};
    static const size_t dims[][3] = {{1, 1, 1}, {1, 7, 3}, {5, 1, 9}, {3, 5, 1}, {13, 17, 19}, {31, 2, 67},
                                     {64, 48, 96}, {97, 61, 127}, {4, 4, 0}};
    zo_dtype types[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t di = 0; di < ZO_ARRAY_LEN(dims); di++)
            for (int oa = 0; oa < 2; oa++)
                for (int ob = 0; ob < 2; ob++)
                    check_gemm(d, s, &rng, types[ti], (zo_gemm_op)oa, (zo_gemm_op)ob, dims[di][0], dims[di][1],
                               dims[di][2], (di + (size_t)oa) % 3, di % 2 ? 0.5f : 1.0f, di % 3 == 1 ? 0.75f : 0.0f);
    zo_stream_destroy(&s);
    zo_dev_close(&d);
}
END_TEST

/* The reference loop on its own (the build's GEMM may be OpenBLAS). */
START_TEST(gemm_reference_loop)
{
    zo_test_rng rng = {zo_test_seed() ^ 7};
    size_t m = 11, n = 7, k = 23;
    float a[11 * 23], b[23 * 7], c[11 * 7];
    for (size_t i = 0; i < ZO_ARRAY_LEN(a); i++)
        a[i] = rnd(&rng);
    for (size_t i = 0; i < ZO_ARRAY_LEN(b); i++)
        b[i] = rnd(&rng);
    zo__gemm_args g = {.op_a = ZO_GEMM_N, .op_b = ZO_GEMM_N, .m = m, .n = n, .k = k, .alpha = 1, .beta = 0,
                       .a = a, .b = b, .lda = k, .ldb = n, .ab_type = ZO_DTYPE_F32, .c = c, .ldc = n};
    ck_assert_int_eq(zo__host_gemm_ref(&g), 0);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (size_t p = 0; p < k; p++) {
                ref += (double)a[i * k + p] * b[p * n + j];
                mag += fabs((double)a[i * k + p] * b[p * n + j]);
            }
            ZO_EXPECT(close_enough(c[i * n + j], ref, mag), "reference loop C(%zu,%zu)", i, j);
        }
    ck_assert_str_ne(zo_gemm_impl(ZO_DEV_HOST), "none");
}
END_TEST

START_TEST(gemm_bad_input)
{
    zo_dev *d = dev_open(0);
    zo_stream *s;
    ck_assert_int_eq(zo_stream_create(d, &s), 0);
    float *buf = dmalloc(d, 64 * 4);
    ck_assert_int_eq(zo_gemm_async(NULL, ZO_GEMM_N, ZO_GEMM_N, 2, 2, 2, 1, buf, 2, buf + 8, 2, ZO_DTYPE_F32, 0,
                                   buf + 16, 2), -EINVAL);
    ck_assert_int_eq(zo_gemm_async(s, (zo_gemm_op)2, ZO_GEMM_N, 2, 2, 2, 1, buf, 2, buf + 8, 2, ZO_DTYPE_F32, 0,
                                   buf + 16, 2), -EINVAL);
    ck_assert_int_eq(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, 2, 2, 2, 1, NULL, 2, buf + 8, 2, ZO_DTYPE_F32, 0,
                                   buf + 16, 2), -EINVAL);
    ck_assert_int_eq(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, 2, 2, 3, 1, buf, 2, buf + 8, 2, ZO_DTYPE_F32, 0,
                                   buf + 16, 2), -EINVAL); /* lda 2 < k 3 */
    ck_assert_int_eq(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, 2, 3, 2, 1, buf, 2, buf + 8, 3, ZO_DTYPE_F32, 0,
                                   buf + 16, 2), -EINVAL); /* ldc 2 < n 3 */
    ck_assert_int_eq(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, 2, 2, 2, 1, buf, 2, buf + 8, 2, ZO_DTYPE_F32, 0,
                                   buf + 2, 2), -EINVAL); /* C overlaps A */
    ck_assert_int_eq(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, 2, 2, 2, 1, buf, 2, buf + 8, 2, ZO_DTYPE_U8, 0,
                                   buf + 16, 2), ZO_ENOTSUP);
    ck_assert_int_eq(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, (size_t)INT_MAX + 1, 2, 2, 1, buf, 2, buf + 8, 2,
                                   ZO_DTYPE_F32, 0, buf + 16, 2), -EINVAL);
    ck_assert_int_eq(zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, 0, 2, 2, 1, NULL, 2, NULL, 2, ZO_DTYPE_F32, 0, NULL, 2),
                     0); /* nothing to do */
    ck_assert_int_eq(zo_stream_sync(s), 0);
    zo_dev_free(d, buf);
    zo_stream_destroy(&s);
    zo_dev_close(&d);
}
END_TEST

/* A GEMM on one stream and a copy on another run at the same time: each
 * stream's work waits for a flag only the other stream's work sets after
 * its GEMM / copy. Serialized streams would deadlock (bounded: the wait
 * times out and records the failure). */
typedef struct rendezvous {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int a_done, b_done, timed_out;
} rendezvous;

static void wait_flag(rendezvous *rv, int *flag)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&rv->lock);
    while (!*flag)
        if (pthread_cond_timedwait(&rv->cond, &rv->lock, &ts) != 0) {
            rv->timed_out = 1;
            break;
        }
    pthread_mutex_unlock(&rv->lock);
}

static void set_flag(rendezvous *rv, int *flag)
{
    pthread_mutex_lock(&rv->lock);
    *flag = 1;
    pthread_cond_broadcast(&rv->cond);
    pthread_mutex_unlock(&rv->lock);
}

static rendezvous g_rv = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
static void a_set(void *arg) { set_flag(arg, &g_rv.a_done); }
static void b_set(void *arg) { set_flag(arg, &g_rv.b_done); }
static void a_wait(void *arg) { wait_flag(arg, &g_rv.b_done); }
static void b_wait(void *arg) { wait_flag(arg, &g_rv.a_done); }

START_TEST(gemm_overlaps_copy)
{
    zo_dev *d = dev_open(0);
    zo_stream *sa, *sb;
    ck_assert_int_eq(zo_stream_create(d, &sa), 0);
    ck_assert_int_eq(zo_stream_create(d, &sb), 0);
    size_t n = 128;
    float *a = dmalloc(d, n * n * 4), *c = dmalloc(d, n * n * 4), *h = malloc(n * n * 4);
    memset(h, 0, n * n * 4);
    h2d(d, a, h, n * n * 4);
    /* A: GEMM, then say so, then wait for B's word; B: copy, say so, wait
     * for A's word. Both workers must be live at once to get through. */
    ck_assert_int_eq(zo_gemm_async(sa, ZO_GEMM_N, ZO_GEMM_N, n, n, n, 1, a, n, a, n, ZO_DTYPE_F32, 0, c, n), 0);
    ck_assert_int_eq(zo_stream_host_fn(sa, a_set, &g_rv), 0);
    ck_assert_int_eq(zo_stream_host_fn(sa, a_wait, &g_rv), 0);
    ck_assert_int_eq(zo_memcpy_async(sb, h, a, n * n * 4, ZO_COPY_D2H), 0);
    ck_assert_int_eq(zo_stream_host_fn(sb, b_set, &g_rv), 0);
    ck_assert_int_eq(zo_stream_host_fn(sb, b_wait, &g_rv), 0);
    ck_assert_int_eq(zo_stream_sync(sa), 0);
    ck_assert_int_eq(zo_stream_sync(sb), 0);
    ck_assert_int_eq(g_rv.timed_out, 0);
    zo_dev_free(d, a);
    zo_dev_free(d, c);
    free(h);
    zo_stream_destroy(&sa);
    zo_stream_destroy(&sb);
    zo_dev_close(&d);
}
END_TEST

/* ---- planner ------------------------------------------------------------------------------ */
START_TEST(plan_budgets)
{
    zo_tile_grid g;
    static const uint64_t shapes[][3] = {{1, 1, 1}, {8, 1000, 1000}, {3, 97, 257}, {16, 50000, 4096},
                                         {1, 7, 100000}};
    static const uint64_t budgets[] = {64 * KiB, 1 * MiB, 16 * MiB, 1ull << 40};
    for (size_t si = 0; si < ZO_ARRAY_LEN(shapes); si++)
        for (size_t bi = 0; bi < ZO_ARRAY_LEN(budgets); bi++)
            for (unsigned flags = 0; flags < 4; flags++)
                for (int ti = 0; ti < 2; ti++) {
                    zo_dtype t = ti ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
                    int r = zo_tile_plan(shapes[si][0], shapes[si][1], shapes[si][2], t, budgets[bi], flags, &g);
                    if (r == ZO_EBUDGET)
                        continue;
                    ck_assert_msg(r == 0, "plan: %s (%s)", zo_strerror(r), zo_last_error_detail());
                    ck_assert_uint_le(g.work_bytes, budgets[bi]);
                    ck_assert_uint_ge((uint64_t)g.tile_out * g.tiles_out, shapes[si][1]);
                    ck_assert_uint_lt((uint64_t)g.tile_out * (g.tiles_out - 1), shapes[si][1]);
                    ck_assert_uint_ge((uint64_t)g.tile_in * g.tiles_in, shapes[si][2]);
                    ck_assert_uint_lt((uint64_t)g.tile_in * (g.tiles_in - 1), shapes[si][2]);
                    /* whole rows whenever one fits */
                    if (g.tile_out > 1)
                        ck_assert_uint_eq(g.tile_in, shapes[si][2]);
                }
    /* a budget with room for the whole matrix gives one tile */
    ck_assert_int_eq(zo_tile_plan(4, 100, 50, ZO_DTYPE_F32, 1 * MiB, ZO_TILE_TRAIN, &g), 0);
    ck_assert_uint_eq(g.tiles_out * g.tiles_in, 1);
    ck_assert_uint_eq(g.work_bytes, 100 * 50 * (2 * 4 + 2 * 4) + 4 * (4 + 4));
    /* balanced: 1000 rows, room for 400 -> 3 tiles of 334, not 400+400+200 */
    uint64_t per = 2 * 4 + 2 * 4, fixed = 8 * (4 + 4);
    ck_assert_int_eq(zo_tile_plan(8, 1000, 100, ZO_DTYPE_F32, fixed + 400 * 100 * per, ZO_TILE_TRAIN, &g), 0);
    ck_assert_uint_eq(g.tiles_out, 3);
    ck_assert_uint_eq(g.tile_out, 334);
}
END_TEST

START_TEST(plan_bad_input)
{
    zo_tile_grid g;
    ck_assert_int_eq(zo_tile_plan(1, 10, 10, ZO_DTYPE_F32, MiB, 0, NULL), -EINVAL);
    ck_assert_int_eq(zo_tile_plan(0, 10, 10, ZO_DTYPE_F32, MiB, 0, &g), -EINVAL);
    ck_assert_int_eq(zo_tile_plan(1, 0, 10, ZO_DTYPE_F32, MiB, 0, &g), -EINVAL);
    ck_assert_int_eq(zo_tile_plan(1, 10, (uint64_t)INT_MAX + 1, ZO_DTYPE_F32, MiB, 0, &g), -EINVAL);
    ck_assert_int_eq(zo_tile_plan(1, 10, 10, ZO_DTYPE_F32, MiB, 0x80, &g), -EINVAL);
    ck_assert_int_eq(zo_tile_plan(1, 10, 10, ZO_DTYPE_U8, MiB, 0, &g), ZO_ENOTSUP);
    /* budget too small for one tile row: ones vector (4 bytes per row of
     * x, 8 with TRAIN for f32) + 64 columns x 16 bytes */
    uint64_t need = 2 * 8 + 64 * 16;
    ck_assert_int_eq(zo_tile_plan(2, 10, 1000, ZO_DTYPE_F32, need - 1, ZO_TILE_TRAIN, &g), ZO_EBUDGET);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "below the smallest plan"));
    ck_assert_int_eq(zo_tile_plan(2, 10, 1000, ZO_DTYPE_F32, need, ZO_TILE_TRAIN, &g), 0);
    ck_assert_uint_eq(g.tile_out, 1);
    ck_assert_uint_le(g.work_bytes, need);
    ck_assert_int_eq(zo_tile_grid_make(1, 10, 10, ZO_DTYPE_F32, 0, 3, 0, &g), -EINVAL);
    ck_assert_int_eq(zo_tile_grid_make(1, 10, 10, ZO_DTYPE_F32, 4, 3, 0, &g), 0);
    ck_assert_uint_eq(g.tiles_out, 3);
    ck_assert_uint_eq(g.tiles_in, 4);
}
END_TEST

/* ---- store environment ------------------------------------------------------------------------ */
#include "store_env.h"

#define STORE_DEV_BYTES (4 * MiB)
#define STORE_HOST_BYTES (4 * MiB)

/* act_bytes: the caller's tensors the test allocates; budget: the operator's */
static void env_open(env *e, size_t act_bytes, uint64_t budget)
{
    env_open_with(e, &(env_opts){.kind = g_kind,
                                 .dev_limit = act_bytes + STORE_DEV_BYTES + budget,
                                 .dev_bytes = STORE_DEV_BYTES,
                                 .host_bytes = STORE_HOST_BYTES,
                                 .slot_size = 64 * KiB, /* small: tiles span several slots */
                                 .slots = 8,
                                 .chunk = 64 * KiB,
                                 .arena = 16 * MiB});
}

/* ---- walker --------------------------------------------------------------------------------- */
/* Double buffering for real: while tile k's work runs (here: a host function
 * on the compute stream that does not return until it sees it), tile k+1
 * arrives in the other buffer. A walker that copied only after the work of
 * tile k would never let it return (bounded: it gives up after 20 s and the
 * test fails). */
typedef struct overlap_ctx {
    const void *ptr[2];
    size_t bytes;
    unsigned n;
    int waited[8], seen[8];
    struct overlap_wait {
        struct overlap_ctx *c;
        unsigned k;
    } w[8];
} overlap_ctx;

static void wait_next_tile(void *arg)
{
    struct overlap_wait *ow = arg;
    overlap_ctx *c = ow->c;
    unsigned next = ow->k + 1;
    const volatile uint8_t *p = c->ptr[next & 1];
    for (int i = 0; i < 20000; i++) {
        if (p[0] == (uint8_t)(0x40 + next) && p[c->bytes - 1] == (uint8_t)(0x40 + next)) {
            c->seen[ow->k] = 1;
            return;
        }
        usleep(1000);
    }
}

static int overlap_fn(void *ctx, unsigned k, const void *tile, zo_stream *s)
{
    overlap_ctx *c = ctx;
    c->ptr[k & 1] = tile;
    /* tile k's own bytes are there once the stream reaches this work */
    if (k >= 1 && k + 1 < c->n) {
        c->w[k] = (struct overlap_wait){c, k};
        c->waited[k] = 1;
        return zo_stream_host_fn(s, wait_next_tile, &c->w[k]);
    }
    return 0;
}

/* Register u8 tensor "t<k>" of `bytes` in `home`, every byte 0x40 + k. */
static zo_tensor *walk_tensor(zo_store *st, unsigned k, size_t bytes, zo_tier home)
{
    char name[16];
    snprintf(name, sizeof(name), "t%u", k);
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.name = name;
    d.dtype = ZO_DTYPE_U8;
    d.bytes = bytes;
    d.home = home;
    zo_tensor *t = NULL;
    ck_assert_int_eq(zo_store_register(st, &d, &t), 0);
    uint8_t *buf = malloc(bytes);
    memset(buf, 0x40 + (int)k, bytes);
    ck_assert_int_eq(zo_store_write(st, t, 0, buf, bytes), 0);
    free(buf);
    return t;
}

START_TEST(walker_overlaps_fetch_with_work)
{
    env e;
    env_open(&e, 0, 1 * MiB);
    enum { N = 5, BYTES = 96 * 1024 };
    zo_tensor *t[N];
    for (unsigned k = 0; k < N; k++) /* both fetch paths */
        t[k] = walk_tensor(e.st, k, BYTES, k % 2 ? ZO_TIER_HOST : ZO_TIER_NVME);
    zo_tile_walk *w = NULL;
    ck_assert_int_eq(zo_tile_walk_create(&w, e.st, e.dev, BYTES), 0);
    overlap_ctx c;
    memset(&c, 0, sizeof(c));
    c.n = N;
    c.bytes = BYTES;
    int r = zo_tile_walk_run(w, t, N, overlap_fn, &c);
    ck_assert_msg(r == 0, "walk: %s (%s)", zo_strerror(r), zo_last_error_detail());
    for (unsigned k = 1; k + 1 < N; k++)
        ck_assert_msg(c.waited[k] && c.seen[k], "tile %u arrived only after tile %u's work", k + 1, k);
    zo_tile_walk_stats ws;
    zo_tile_walk_get_stats(w, &ws);
    ck_assert_uint_eq(ws.tiles, N);
    ck_assert_uint_eq(ws.fetch_bytes, (uint64_t)N * BYTES);
    /* bad input */
    ck_assert_int_eq(zo_tile_walk_run(w, t, 0, overlap_fn, &c), -EINVAL);
    ck_assert_int_eq(zo_tile_walk_run(w, NULL, N, overlap_fn, &c), -EINVAL);
    ck_assert_int_eq(zo_tile_walk_run(w, t, N, NULL, &c), -EINVAL);
    zo_tile_walk_destroy(&w);
    zo_tile_walk *small = NULL;
    ck_assert_int_eq(zo_tile_walk_create(&small, e.st, e.dev, BYTES - 1), 0);
    ck_assert_int_eq(zo_tile_walk_run(small, t, N, overlap_fn, &c), -EINVAL); /* tile larger than the buffers */
    zo_tile_walk_destroy(&small);
    ck_assert_int_eq(zo_tile_walk_create(&small, NULL, e.dev, BYTES), -EINVAL);
    env_close(&e);
}
END_TEST

/* ---- tiled linear ------------------------------------------------------------------------- */
typedef struct lin_case {
    uint64_t batch, out, in;
    uint64_t budget;            /* 0: tile_out x tile_in */
    uint32_t tile_out, tile_in;
} lin_case;

typedef struct lin_result {
    float *y, *dx, *db, *dw;
    zo_tile_grid grid;
    zo_tile_walk_stats ws;
} lin_result;

static void lin_result_free(lin_result *r)
{
    free(r->y), free(r->dx), free(r->db), free(r->dw);
}

/* Run forward + backward of one case with W homed in `home`; check against
 * the double reference; return the outputs for cross-tier comparison.
 * copy: the config's copy_tiles (1: tiles copied into the device buffers,
 * as on a GPU; 0: the host backend's in-place fetch). */
/* How run_linear_ex() drives the operator beyond the defaults. */
typedef struct lin_opts {
    int copy;        /* config copy_tiles */
    int in_order;    /* config backward_in_order */
    int keep;        /* config keep_last */
    int prefetch;    /* zo_tiled_linear_prefetch() before each pass */
} lin_opts;

static void run_linear_ex(const lin_case *lc, zo_dtype t, zo_tier home, uint64_t seed, const lin_opts *lo,
                          lin_result *res);

static void run_linear(const lin_case *lc, zo_dtype t, zo_tier home, uint64_t seed, int copy, lin_result *res)
{
    run_linear_ex(lc, t, home, seed, &(lin_opts){.copy = copy}, res);
}

static void run_linear_ex(const lin_case *lc, zo_dtype t, zo_tier home, uint64_t seed, const lin_opts *lo,
                          lin_result *res)
{
    int copy = lo->copy;
    uint64_t B = lc->batch, O = lc->out, I = lc->in;
    size_t esz = zo_dtype_size(t);
    zo_test_rng rng = {seed};
    float *w = malloc(O * I * 4), *x = malloc(B * I * 4), *dy = malloc(B * O * 4), *b = malloc(O * 4);
    void *pw = malloc(O * I * esz), *px = malloc(B * I * esz), *pdy = malloc(B * O * esz);
    fill(&rng, w, pw, t, O * I, 0.5f);
    fill(&rng, x, px, t, B * I, 1.0f);
    fill(&rng, dy, pdy, t, B * O, 1.0f);
    for (uint64_t i = 0; i < O; i++)
        b[i] = rnd(&rng);
    /* the caller's tensors: x, dy (dtype), bias, y, db (out f32), dx (in f32) */
    size_t act = B * I * esz + B * O * esz + O * 4 + B * O * 4 + O * 4 + B * I * 4;
    uint64_t budget = lc->budget;
    if (!budget) {
        zo_tile_grid g;
        unsigned fl = ZO_TILE_TRAIN | (home == ZO_TIER_DEVICE ? ZO_TILE_RESIDENT : 0);
        ck_assert_int_eq(zo_tile_grid_make(B, O, I, t, lc->tile_out, lc->tile_in, fl, &g), 0);
        budget = g.work_bytes;
    }
    env e;
    env_open(&e, act, budget);
    void *dx_ = dmalloc(e.dev, B * I * esz), *ddy = dmalloc(e.dev, B * O * esz);
    float *dbias = dmalloc(e.dev, O * 4), *dyo = dmalloc(e.dev, B * O * 4), *ddb = dmalloc(e.dev, O * 4),
          *ddx = dmalloc(e.dev, B * I * 4);
    h2d(e.dev, dx_, px, B * I * esz);
    h2d(e.dev, ddy, pdy, B * O * esz);
    h2d(e.dev, dbias, b, O * 4);
    size_t before = dev_used(e.dev);

    res->dw = calloc(O * I, 4);
    zo_tile_host_sink hs = {.dw = res->dw, .ld = I, .accumulate = 0};
    zo_tiled_linear_config c;
    zo_tiled_linear_config_default(&c);
    c.name = "lin";
    c.in_features = I;
    c.out_features = O;
    c.max_batch = B;
    c.dtype = t;
    c.home = home;
    c.budget = lc->budget;
    c.tile_out = lc->tile_out;
    c.tile_in = lc->tile_in;
    c.dw_sink = zo_tile_sink_host;
    c.dw_sink_ctx = &hs;
    c.copy_tiles = copy;
    c.backward_in_order = lo->in_order;
    c.keep_last = lo->keep;
    zo_tiled_linear *tl = NULL;
    int r = zo_tiled_linear_create(&tl, e.st, e.dev, &c);
    ck_assert_msg(r == 0, "create: %s (%s)", zo_strerror(r), zo_last_error_detail());
    zo_tile_grid g;
    ck_assert_int_eq(zo_tiled_linear_grid(tl, &g), 0);
    /* the operator holds exactly the planned bytes, within the budget */
    if (exact_mem())
        ck_assert_uint_eq(dev_used(e.dev) - before, g.work_bytes);
    ck_assert_uint_le(g.work_bytes, budget);
    r = zo_tiled_linear_set_weight(tl, pw, I);
    ck_assert_msg(r == 0, "set_weight: %s (%s)", zo_strerror(r), zo_tiled_linear_errmsg(tl));
    void *back = malloc(O * I * esz);
    ck_assert_int_eq(zo_tiled_linear_get_weight(tl, back, I), 0);
    ck_assert_int_eq(memcmp(back, pw, O * I * esz), 0);
    free(back);

    if (lo->prefetch)
        ck_assert_int_eq(zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_FORWARD), 0);
    r = zo_tiled_linear_forward(tl, dx_, B, dbias, dyo);
    ck_assert_msg(r == 0, "forward: %s (%s)", zo_strerror(r), zo_tiled_linear_errmsg(tl));
    if (lo->prefetch)
        ck_assert_int_eq(zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_BACKWARD), 0);
    r = zo_tiled_linear_backward(tl, dx_, ddy, B, ddx, ddb);
    ck_assert_msg(r == 0, "backward: %s (%s)", zo_strerror(r), zo_tiled_linear_errmsg(tl));
    zo_tile_walk_stats ws;
    zo_tiled_linear_get_stats(tl, &ws);
    uint64_t n = (uint64_t)g.tiles_out * g.tiles_in;
    ck_assert_uint_eq(ws.tiles, 2 * n);
    ck_assert_uint_eq(ws.runs, 2);
    /* tile reads: every tile twice, but the one forward kept for a
     * reversed backward; a prefetch is a read begun early, not an extra */
    int kept = lo->keep && !lo->in_order;
    ck_assert_uint_eq(ws.reused, kept);
    ck_assert_uint_eq(ws.reads, 2 * n - (uint64_t)kept);
    ck_assert_uint_eq(ws.prefetched + ws.prefetch_skipped, lo->prefetch ? 2 - (uint64_t)kept : 0);
    /* the pool never held more than it has (a prefetch waits in slots the
     * pass would have taken anyway) */
    zo_store_stats ss;
    zo_store_get_stats(e.st, &ss);
    ck_assert_uint_le(ss.pool_peak, ss.pool_slots);
    /* in place: host home always (host backend), NVMe when the grid's tiles fit a pool slot */
    int in_place = !copy && home != ZO_TIER_DEVICE && g_kind == ZO_DEV_HOST &&
                   (home == ZO_TIER_HOST || g.tile_bytes <= 64 * KiB);
    ck_assert_int_eq(!!(g.flags & ZO_TILE_IN_PLACE), in_place);
    uint64_t last_rows = O - (uint64_t)(g.tiles_out - 1) * g.tile_out, last_cols = I - (uint64_t)(g.tiles_in - 1) * g.tile_in;
    uint64_t last_bytes = last_rows * last_cols * esz;
    if (in_place) {
        ck_assert_uint_eq(ws.fetch_bytes, 0);
        ck_assert_uint_eq(ws.in_place_tiles, ws.tiles - (uint64_t)kept);
    } else if (home != ZO_TIER_DEVICE) {
        ck_assert_uint_eq(ws.fetch_bytes, 2 * O * I * esz - (kept ? last_bytes : 0));
        ck_assert_uint_eq(ws.in_place_tiles, 0);
    }
    res->grid = g;
    res->ws = ws;
    /* no allocation beyond the plan happened in the calls */
    if (exact_mem())
        ck_assert_uint_eq(dev_used(e.dev) - before, g.work_bytes);

    res->y = malloc(B * O * 4);
    res->dx = malloc(B * I * 4);
    res->db = malloc(O * 4);
    d2h(e.dev, res->y, dyo, B * O * 4);
    d2h(e.dev, res->dx, ddx, B * I * 4);
    d2h(e.dev, res->db, ddb, O * 4);
    for (uint64_t i = 0; i < B; i++)
        for (uint64_t o = 0; o < O; o++) {
            double ref = b[o], mag = fabs(b[o]);
            for (uint64_t k = 0; k < I; k++) {
                ref += (double)x[i * I + k] * w[o * I + k];
                mag += fabs((double)x[i * I + k] * w[o * I + k]);
            }
            ZO_EXPECT(close_enough(res->y[i * O + o], ref, mag), "y(%llu,%llu) %.9g vs %.9g", (unsigned long long)i,
                      (unsigned long long)o, res->y[i * O + o], ref);
        }
    for (uint64_t i = 0; i < B; i++)
        for (uint64_t k = 0; k < I; k++) {
            double ref = 0, mag = 0;
            for (uint64_t o = 0; o < O; o++) {
                ref += (double)dy[i * O + o] * w[o * I + k];
                mag += fabs((double)dy[i * O + o] * w[o * I + k]);
            }
            ZO_EXPECT(close_enough(res->dx[i * I + k], ref, mag), "dx(%llu,%llu)", (unsigned long long)i,
                      (unsigned long long)k);
        }
    for (uint64_t o = 0; o < O; o++) {
        double ref = 0, mag = 0;
        for (uint64_t i = 0; i < B; i++) {
            ref += dy[i * O + o];
            mag += fabs(dy[i * O + o]);
        }
        ZO_EXPECT(close_enough(res->db[o], ref, mag), "db(%llu)", (unsigned long long)o);
        for (uint64_t k = 0; k < I; k++) {
            double rw = 0, mw = 0;
            for (uint64_t i = 0; i < B; i++) {
                rw += (double)dy[i * O + o] * x[i * I + k];
                mw += fabs((double)dy[i * O + o] * x[i * I + k]);
            }
            ZO_EXPECT(close_enough(res->dw[o * I + k], rw, mw), "dW(%llu,%llu) %.9g vs %.9g", (unsigned long long)o,
                      (unsigned long long)k, res->dw[o * I + k], rw);
        }
    }
    zo_tiled_linear_destroy(&tl);
    ck_assert_ptr_null(tl);
    if (exact_mem())
        ck_assert_uint_eq(dev_used(e.dev), before);
    zo_dev_free(e.dev, dx_);
    zo_dev_free(e.dev, ddy);
    zo_dev_free(e.dev, dbias);
    zo_dev_free(e.dev, dyo);
    zo_dev_free(e.dev, ddb);
    zo_dev_free(e.dev, ddx);
    env_close(&e);
    free(w), free(x), free(dy), free(b), free(pw), free(px), free(pdy);
}

static const lin_case lin_cases[] = {
    {1, 1, 1, 0, 1, 1},         /* all ones */
    {3, 7, 5, 0, 4, 3},         /* tiles that do not divide */
    {5, 13, 11, 0, 13, 11},     /* one tile */
    {2, 17, 19, 0, 1, 19},      /* one row per tile */
    {7, 31, 67, 0, 5, 64},      /* primes, last column tile of 3 */
    {4, 97, 257, 40 * KiB, 0, 0},  /* budget-chosen: whole rows */
    {3, 61, 1031, 6 * KiB, 0, 0},  /* budget below one row: rows cut too */
};

static void lin_same(const lin_result *a, const lin_result *b, const lin_case *lc)
{
    ck_assert_int_eq(memcmp(a->y, b->y, lc->batch * lc->out * 4), 0);
    ck_assert_int_eq(memcmp(a->dx, b->dx, lc->batch * lc->in * 4), 0);
    ck_assert_int_eq(memcmp(a->db, b->db, lc->out * 4), 0);
    ck_assert_int_eq(memcmp(a->dw, b->dw, lc->out * lc->in * 4), 0);
}

/* Every case with tiles copied into the device buffers (the GPU's path,
 * kept on the host backend by copy_tiles), and with the host backend's
 * in-place fetch: both against the reference, and bit for bit equal to
 * each other where they use the same grid (given tiles). */
START_TEST(linear_matches_reference)
{
    int ci = _i / 2;
    zo_dtype t = _i % 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
    for (int h = 0; h < 3; h++) {
        zo_tier home = (zo_tier)h;
        lin_result res, inp;
        memset(&res, 0, sizeof(res));
        memset(&inp, 0, sizeof(inp));
        run_linear(&lin_cases[ci], t, home, zo_test_seed() + (uint64_t)ci, 1, &res);
        if (home != ZO_TIER_DEVICE) {
            run_linear(&lin_cases[ci], t, home, zo_test_seed() + (uint64_t)ci, 0, &inp);
            if (inp.grid.tile_out == res.grid.tile_out && inp.grid.tile_in == res.grid.tile_in)
                lin_same(&res, &inp, &lin_cases[ci]);
            else
                ck_assert_uint_ne(lin_cases[ci].budget, 0); /* only a budget-chosen grid may differ */
            lin_result_free(&inp);
        }
        lin_result_free(&res);
    }
}
END_TEST

/* Weights on NVMe give results identical to the bit with weights in pinned host memory. */
START_TEST(linear_nvme_identical)
{
    /* small tiles in one pool slot; tiles of 7 slots each (64 KiB slots) */
    static const lin_case cases[] = {{6, 53, 301, 24 * KiB, 0, 0}, {4, 300, 700, 2 * MiB, 0, 0}};
    for (int ti = 0; ti < 4; ti++) {
        zo_dtype t = ti % 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
        lin_case lc = cases[ti / 2];
        lin_result a, b;
        memset(&a, 0, sizeof(a));
        memset(&b, 0, sizeof(b));
        run_linear(&lc, t, ZO_TIER_HOST, 99, 1, &a);
        run_linear(&lc, t, ZO_TIER_NVME, 99, 1, &b);
        lin_same(&a, &b, &lc);
        lin_result_free(&a);
        lin_result_free(&b);
    }
}
END_TEST

static int failing_sink(void *ctx, const zo_tile_grad *g)
{
    int *calls = ctx;
    return ++*calls == 2 ? -EIO : 0;
}

START_TEST(linear_bad_input)
{
    env e;
    env_open(&e, 4 * MiB, 1 * MiB);
    zo_tiled_linear_config c;
    zo_tiled_linear_config_default(&c);
    c.copy_tiles = 1; /* the copy path (a GPU's); in place: linear_in_place_* */
    c.in_features = 100;
    c.out_features = 50;
    c.max_batch = 4;
    c.budget = 64 * KiB;
    zo_tiled_linear *tl = NULL;
    ck_assert_int_eq(zo_tiled_linear_create(NULL, e.st, e.dev, &c), -EINVAL);
    ck_assert_int_eq(zo_tiled_linear_create(&tl, NULL, e.dev, &c), -EINVAL);
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, NULL), -EINVAL);
    zo_tiled_linear_config bad = c;
    bad.struct_size = 8;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), -EINVAL);
    bad.struct_size = sizeof(bad) + 8; /* a newer version than the library's */
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), -EINVAL);
    /* the first published version, without copy_tiles: accepted, in place */
    bad = c;
    bad.struct_size = offsetof(zo_tiled_linear_config, copy_tiles);
    bad.name = "v1";
    bad.home = ZO_TIER_HOST;
    bad.copy_tiles = 1; /* beyond struct_size: not read */
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), 0);
    zo_tile_grid vg;
    ck_assert_int_eq(zo_tiled_linear_grid(tl, &vg), 0);
    ck_assert_int_eq(!!(vg.flags & ZO_TILE_IN_PLACE), g_kind == ZO_DEV_HOST);
    zo_tiled_linear_destroy(&tl);
    bad = c;
    bad.in_features = 0;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), -EINVAL);
    bad = c;
    bad.budget = 0; /* no budget and no tile given */
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), -EINVAL);
    bad = c;
    bad.budget = 500; /* too small for one tile row */
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), ZO_EBUDGET);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "below the smallest plan"));
    bad = c;
    bad.dtype = ZO_DTYPE_F64;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), ZO_ENOTSUP);
    if (g_kind == ZO_DEV_HOST) {
        /* the host backend's memory limit (store_env: 1 MiB above the
         * device tier) is below what this plan allocates; a GPU has more
         * free memory than any plan here (the H200 run: created fine) */
        bad = c;
        bad.budget = 8 * MiB; /* plans fine, but the device has less free: its limit holds */
        bad.out_features = 5000;
        ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &bad), -ENOMEM);
        ck_assert_ptr_null(tl);
    }

    int calls = 0;
    c.dw_sink = failing_sink;
    c.dw_sink_ctx = &calls;
    c.budget = 2 * 8 * 4 + 10 * 100 * 16; /* 10-row tiles: 5 tiles */
    int r = zo_tiled_linear_create(&tl, e.st, e.dev, &c);
    ck_assert_msg(r == 0, "%s", zo_last_error_detail());
    zo_tiled_linear *tl2 = NULL;
    ck_assert_int_eq(zo_tiled_linear_create(&tl2, e.st, e.dev, &c), -EEXIST); /* tile names taken */
    ck_assert_ptr_null(tl2);
    zo_tiled_linear_destroy(&tl);
    ck_assert_ptr_null(tl);
    ck_assert_int_eq(zo_tiled_linear_create(&tl2, e.st, e.dev, &c), 0); /* names free again */
    zo_tiled_linear_destroy(&tl2);
    env_close(&e);
}
END_TEST

START_TEST(linear_runtime_errors)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB);
    int calls = 0;
    zo_tiled_linear_config c;
    zo_tiled_linear_config_default(&c);
    c.copy_tiles = 1; /* the copy path (a GPU's); in place: linear_in_place_* */
    c.in_features = 100;
    c.out_features = 50;
    c.max_batch = 4;
    c.budget = 4 * (4 + 4) + 10 * 100 * 16; /* 10-row tiles: 5 tiles */
    c.dw_sink = failing_sink;
    c.dw_sink_ctx = &calls;
    zo_tiled_linear *tl = NULL;
    int r = zo_tiled_linear_create(&tl, e.st, e.dev, &c);
    ck_assert_msg(r == 0, "%s", zo_last_error_detail());
    zo_tile_grid g;
    zo_tiled_linear_grid(tl, &g);
    ck_assert_uint_eq(g.tiles_out, 5);
    float *x = dmalloc(e.dev, 4 * 100 * 4), *y = dmalloc(e.dev, 4 * 50 * 4), *dy = dmalloc(e.dev, 4 * 50 * 4);
    float zeros[400] = {0};
    h2d(e.dev, x, zeros, sizeof(zeros));
    h2d(e.dev, dy, zeros, 4 * 50 * 4);
    ck_assert_int_eq(zo_tiled_linear_forward(tl, NULL, 4, NULL, y), -EINVAL);
    ck_assert_int_eq(zo_tiled_linear_forward(tl, x, 0, NULL, y), -EINVAL);
    ck_assert_int_eq(zo_tiled_linear_forward(tl, x, 5, NULL, y), -EINVAL); /* above max_batch */
    ck_assert_int_eq(zo_tiled_linear_forward(NULL, x, 4, NULL, y), -EINVAL);
    ck_assert_int_eq(zo_tiled_linear_set_weight(tl, zeros, 99), -EINVAL); /* ld < in */
    ck_assert_int_eq(zo_tiled_linear_set_weight(tl, NULL, 100), -EINVAL);
    zo_tensor *t;
    ck_assert_int_eq(zo_tiled_linear_tile(tl, 5, 0, &t), -EINVAL);
    ck_assert_int_eq(zo_tiled_linear_tile(tl, 4, 0, &t), 0);
    ck_assert_int_eq(zo_tiled_linear_forward(tl, x, 4, NULL, y), 0);
    /* the sink fails on its second tile: backward says so, and works again after */
    r = zo_tiled_linear_backward(tl, x, dy, 4, NULL, NULL);
    ck_assert_int_eq(r, -EIO);
    ck_assert_ptr_nonnull(strstr(zo_tiled_linear_errmsg(tl), "sink"));
    ck_assert_int_eq(zo_tiled_linear_backward(tl, x, dy, 4, NULL, NULL), 0);
    ck_assert_int_eq(calls, 2 + 5);
    zo_tiled_linear_destroy(&tl);
    /* train = 0: backward is refused, and no dW memory is taken */
    c.train = 0;
    c.dw_sink = NULL;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
    zo_tiled_linear_grid(tl, &g);
    ck_assert_uint_eq(g.flags & ZO_TILE_TRAIN, 0);
    ck_assert_int_eq(zo_tiled_linear_backward(tl, x, dy, 4, NULL, NULL), ZO_ESTATE);
    zo_tiled_linear_destroy(&tl);
    zo_tiled_linear_destroy(&tl); /* NULL ok */
    zo_dev_free(e.dev, x);
    zo_dev_free(e.dev, y);
    zo_dev_free(e.dev, dy);
    env_close(&e);
}
END_TEST

/* dW tiles written into store tensors (NVMe-homed) by the store sink equal
 * the host sink's dense matrix. */
START_TEST(linear_store_sink)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB);
    uint64_t B = 3, O = 23, I = 41;
    zo_tiled_linear_config c;
    zo_tiled_linear_config_default(&c);
    c.copy_tiles = 1; /* the copy path (a GPU's); in place: linear_in_place_* */
    c.in_features = I;
    c.out_features = O;
    c.max_batch = B;
    c.tile_out = 7;
    c.tile_in = 16;
    zo_tile_grid g;
    ck_assert_int_eq(zo_tile_grid_make(B, O, I, ZO_DTYPE_F32, 7, 16, ZO_TILE_TRAIN, &g), 0);
    zo_tensor *grads[16];
    for (uint32_t r = 0; r < g.tiles_out; r++)
        for (uint32_t q = 0; q < g.tiles_in; q++) {
            char name[32];
            snprintf(name, sizeof(name), "grad.%u.%u", r, q);
            zo_tensor_desc d;
            zo_tensor_desc_default(&d);
            d.name = name;
            d.ndim = 2;
            d.shape[0] = ZO_MIN(7, O - r * 7);
            d.shape[1] = ZO_MIN(16, I - q * 16);
            ck_assert_int_eq(zo_store_register(e.st, &d, &grads[r * g.tiles_in + q]), 0);
        }
    zo_tile_store_sink ss = {.store = e.st, .grads = grads, .tiles_in = g.tiles_in};
    c.dw_sink = zo_tile_sink_store;
    c.dw_sink_ctx = &ss;
    zo_tiled_linear *tl = NULL;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
    zo_test_rng rng = {11};
    float x[3 * 41], dy[3 * 23], dense[23 * 41];
    for (size_t i = 0; i < ZO_ARRAY_LEN(x); i++)
        x[i] = rnd(&rng);
    for (size_t i = 0; i < ZO_ARRAY_LEN(dy); i++)
        dy[i] = rnd(&rng);
    float *dx_ = dmalloc(e.dev, sizeof(x)), *ddy = dmalloc(e.dev, sizeof(dy));
    h2d(e.dev, dx_, x, sizeof(x));
    h2d(e.dev, ddy, dy, sizeof(dy));
    int r = zo_tiled_linear_backward(tl, dx_, ddy, B, NULL, NULL);
    ck_assert_msg(r == 0, "backward: %s (%s)", zo_strerror(r), zo_tiled_linear_errmsg(tl));
    zo_tiled_linear_destroy(&tl);
    zo_tile_host_sink hs = {.dw = dense, .ld = I};
    c.name = "linear2";
    c.dw_sink = zo_tile_sink_host;
    c.dw_sink_ctx = &hs;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
    ck_assert_int_eq(zo_tiled_linear_backward(tl, dx_, ddy, B, NULL, NULL), 0);
    for (uint32_t t = 0; t < g.tiles_out * g.tiles_in; t++) {
        uint32_t rr = t / g.tiles_in, q = t % g.tiles_in;
        uint32_t rows = ZO_MIN(7, O - rr * 7), cols = ZO_MIN(16, I - q * 16);
        float got[7 * 16];
        ck_assert_int_eq(zo_store_read(e.st, grads[t], 0, got, rows * cols * 4), 0);
        for (uint32_t i = 0; i < rows; i++)
            ck_assert_int_eq(memcmp(got + i * cols, dense + (rr * 7 + i) * I + q * 16, cols * 4), 0);
    }
    /* a tensor of the wrong size is refused, and the backward says so */
    zo_tensor *wrong = grads[0];
    grads[0] = grads[2]; /* 7 x 9, tile (0, 0) is 7 x 16 */
    zo_tiled_linear_destroy(&tl);
    c.dw_sink = zo_tile_sink_store;
    c.dw_sink_ctx = &ss;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
    ck_assert_int_eq(zo_tiled_linear_backward(tl, dx_, ddy, B, NULL, NULL), -EINVAL);
    grads[0] = wrong;
    zo_tiled_linear_destroy(&tl);
    zo_dev_free(e.dev, dx_);
    zo_dev_free(e.dev, ddy);
    env_close(&e);
}
END_TEST

/* Another user of the store's pool holds 4 of its 8 slots while an
 * NVMe-homed linear runs forward. copy: one 240000-byte tile of four 64 KiB
 * slots, copied: the walk reads ahead less instead of failing with -EBUSY.
 * In place: 48000-byte tiles of one slot each, read in place: the walk
 * waits for tile k's slot before reading k+1 instead of failing. */
static void pool_shared(int copy)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB);
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.name = "other";
    d.bytes = 1 * MiB;
    d.dtype = ZO_DTYPE_U8;
    zo_tensor *other;
    ck_assert_int_eq(zo_store_register(e.st, &d, &other), 0);
    zo_store_stream *held;
    ck_assert_int_eq(zo_store_stream_open(e.st, other, ZO_STREAM_READ, 3, &held), 0); /* 4 of 8 slots */
    zo_tiled_linear_config c;
    zo_tiled_linear_config_default(&c);
    c.copy_tiles = copy;
    c.in_features = 300;
    c.out_features = 200;
    c.max_batch = 2;
    c.tile_out = copy ? 200 : 40;
    c.tile_in = 300;
    zo_tiled_linear *tl = NULL;
    ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
    zo_tile_grid g;
    zo_tiled_linear_grid(tl, &g);
    ck_assert_int_eq(!!(g.flags & ZO_TILE_IN_PLACE), !copy);
    float *x = dmalloc(e.dev, 2 * 300 * 4), *y = dmalloc(e.dev, 2 * 200 * 4);
    float zeros[600] = {0};
    h2d(e.dev, x, zeros, sizeof(zeros));
    int r = zo_tiled_linear_forward(tl, x, 2, NULL, y);
    ck_assert_msg(r == 0, "forward with the pool shared: %s (%s)", zo_strerror(r), zo_tiled_linear_errmsg(tl));
    zo_tile_walk_stats ws;
    zo_tiled_linear_get_stats(tl, &ws);
    ck_assert_uint_eq(ws.in_place_tiles, copy ? 0 : 5);
    ck_assert_int_eq(zo_store_stream_close(&held), 0);
    zo_tiled_linear_destroy(&tl);
    zo_dev_free(e.dev, x);
    zo_dev_free(e.dev, y);
    env_close(&e);
}

START_TEST(linear_pool_shared)
{
    pool_shared(1); /* the copy path (a GPU's) */
}
END_TEST

/* ---- in-place fetch (host backend) ------------------------------------------------------- */
/* The walker with ZO_TILE_WALK_IN_PLACE and no buffers at all: host-homed
 * tiles and NVMe-homed tiles of one pool slot reach fn with their bytes
 * already there and nothing copied; an NVMe tile larger than a slot still
 * needs a buffer (-EINVAL without one). */
typedef struct inplace_ctx {
    size_t bytes;
    int ok[6];
} inplace_ctx;

static int inplace_fn(void *ctx, unsigned k, const void *tile, zo_stream *s)
{
    inplace_ctx *c = ctx;
    const uint8_t *p = tile;
    (void)s;
    /* in place means here now, before any stream work */
    c->ok[k] = p[0] == (uint8_t)(0x40 + k) && p[c->bytes - 1] == (uint8_t)(0x40 + k);
    return 0;
}

/* Destroy w: every pool slot it held is back; then unregister t[0..n). */
static void walker_gone(env *e, zo_tile_walk **w, zo_tensor **t, unsigned n)
{
    zo_tile_walk_destroy(w);
    zo_store_stats ss;
    zo_store_get_stats(e->st, &ss);
    ck_assert_uint_eq(ss.pool_in_use, 0);
    for (unsigned k = 0; k < n; k++)
        ck_assert_int_eq(zo_store_unregister(e->st, &t[k]), 0);
}

/* fn checking, when the compute stream gets there, that tile k of a walk of
 * n over t0..t(n-1) (reversed or not) has its own bytes. The tile may be
 * device memory (CUDA: the H200 run died reading it from the host), so
 * three of its bytes are copied to the host on the stream and checked by a
 * host function after them. */
typedef struct many_ctx {
    size_t bytes;
    unsigned n;
    int rev;
    int ok[16];
    struct many_at {
        struct many_ctx *c;
        unsigned k;
        uint8_t got[3];
    } at[16];
} many_ctx;

static void many_check(void *arg)
{
    struct many_at *a = arg;
    unsigned id = a->c->rev ? a->c->n - 1 - a->k : a->k;
    uint8_t want = (uint8_t)(0x40 + id);
    a->c->ok[a->k] = a->got[0] == want && a->got[1] == want && a->got[2] == want;
}

static int many_fn(void *ctx, unsigned k, const void *tile, zo_stream *s)
{
    many_ctx *c = ctx;
    c->at[k] = (struct many_at){.c = c, .k = k};
    const size_t at[3] = {0, c->bytes / 2, c->bytes - 1};
    for (int i = 0; i < 3; i++) {
        int r = zo_memcpy_async(s, &c->at[k].got[i], (const uint8_t *)tile + at[i], 1, ZO_COPY_D2H);
        if (r < 0)
            return r;
    }
    return zo_stream_host_fn(s, many_check, &c->at[k]);
}

/* Deeper read-ahead of in-place NVMe tiles: with a pool of 16 slots a walk
 * of 12 one-slot tiles has several reads in flight (ahead_peak, at most
 * ZO_TILE_AHEAD_MAX-bounded by the pool: (16 - 5) / 2 + 1 = 6), every tile
 * reaches fn with its own bytes, in both orders, and the pool's peak stays
 * within its slots and is all back after; with the minimum pool of 5 slots
 * it reads one ahead only (ahead_peak 0). Mixed homes stop the deeper
 * read-ahead at a tile that is not an in-place NVMe one. */
START_TEST(walker_read_ahead_deeper)
{
    static const unsigned slots[] = {16, 5};
    for (unsigned si = 0; si < 2; si++) {
        env e;
        env_open_with(&e, &(env_opts){.kind = g_kind,
                                      .dev_limit = STORE_DEV_BYTES + 1 * MiB,
                                      .dev_bytes = STORE_DEV_BYTES,
                                      .host_bytes = STORE_HOST_BYTES,
                                      .slot_size = 64 * KiB,
                                      .slots = slots[si],
                                      .chunk = 64 * KiB,
                                      .arena = 16 * MiB});
        enum { N = 12, BYTES = 40 * 1024 };
        zo_tensor *t[N], *rt[N];
        for (unsigned k = 0; k < N; k++)
            t[k] = walk_tensor(e.st, k, BYTES, k == 7 ? ZO_TIER_HOST : ZO_TIER_NVME);
        for (unsigned k = 0; k < N; k++)
            rt[k] = t[N - 1 - k];
        zo_tile_walk *w = NULL;
        ck_assert_int_eq(zo_tile_walk_create_ex(&w, e.st, e.dev, 0, ZO_TILE_WALK_IN_PLACE), 0);
        unsigned deflt = slots[si] == 16 ? 6 : 1;
        ck_assert_int_eq(zo_tile_walk_set_read_ahead(w, 1), 1);
        ck_assert_int_eq(zo_tile_walk_set_read_ahead(w, 100), (int)deflt); /* capped at what the pool allows */
        ck_assert_int_eq(zo_tile_walk_set_read_ahead(w, 0), (int)deflt);
        ck_assert_int_eq(zo_tile_walk_set_read_ahead(NULL, 0), -EINVAL);
        for (int rev = 0; rev < 2; rev++) {
            many_ctx m = {.bytes = BYTES, .n = N, .rev = rev};
            int r = zo_tile_walk_run(w, rev ? rt : t, N, many_fn, &m);
            ck_assert_msg(r == 0, "walk: %s (%s)", zo_strerror(r), zo_last_error_detail());
            for (unsigned k = 0; k < N; k++)
                ck_assert_msg(m.ok[k], "tile %u (reversed %d) had the wrong bytes", k, rev);
        }
        zo_tile_walk_stats ws;
        zo_tile_walk_get_stats(w, &ws);
        zo_store_stats ss;
        zo_store_get_stats(e.st, &ss);
        ck_assert_uint_le(ss.pool_peak, ss.pool_slots);
        if (slots[si] == 16) {
            ck_assert_uint_ge(ws.ahead_peak, 2);
            ck_assert_uint_le(ws.ahead_peak, 6);
        } else {
            ck_assert_uint_eq(ws.ahead_peak, 0);
        }
        ck_assert_uint_eq(ws.reads, 2 * N);
        ck_assert_uint_eq(ws.in_place_tiles, 2 * N);
        walker_gone(&e, &w, t, N);
        env_close(&e);
    }
}
END_TEST

START_TEST(walker_in_place)
{
    env e;
    env_open(&e, 0, 1 * MiB);
    enum { N = 6, BYTES = 48 * 1024 }; /* below the 64 KiB pool slot */
    zo_tensor *t[N + 1];
    for (unsigned k = 0; k < N; k++)
        t[k] = walk_tensor(e.st, k, BYTES, k % 2 ? ZO_TIER_HOST : ZO_TIER_NVME);
    t[N] = walk_tensor(e.st, N, 2 * BYTES, ZO_TIER_NVME); /* two slots */
    zo_tile_walk *w = NULL;
    ck_assert_int_eq(zo_tile_walk_create_ex(&w, e.st, e.dev, 0, 0x10), -EINVAL);
    ck_assert_int_eq(zo_tile_walk_create_ex(&w, e.st, e.dev, 0, ZO_TILE_WALK_IN_PLACE), 0);
    ck_assert_int_eq(zo_tile_walk_in_place(w), g_kind == ZO_DEV_HOST);
    ck_assert_int_eq(zo_tile_walk_in_place(NULL), 0);
    if (g_kind == ZO_DEV_HOST) {
        inplace_ctx c = {.bytes = BYTES};
        for (int rep = 0; rep < 2; rep++) { /* a second walk reuses nothing stale */
            memset(c.ok, 0, sizeof(c.ok));
            int r = zo_tile_walk_run(w, t, N, inplace_fn, &c);
            ck_assert_msg(r == 0, "walk: %s (%s)", zo_strerror(r), zo_last_error_detail());
            for (unsigned k = 0; k < N; k++)
                ck_assert_msg(c.ok[k], "tile %u not in place when fn ran", k);
        }
        zo_tile_walk_stats ws;
        zo_tile_walk_get_stats(w, &ws);
        ck_assert_uint_eq(ws.tiles, 2 * N);
        ck_assert_uint_eq(ws.fetch_bytes, 0);
        ck_assert_uint_eq(ws.in_place_tiles, 2 * N);
        /* every reference and pool slot is back: the tensors can go */
        zo_tensor_info ti;
        ck_assert_int_eq(zo_store_tensor_info(e.st, t[1], &ti), 0);
        ck_assert_int_eq(zo_store_tensor_info(e.st, t[0], &ti), 0);
        /* an NVMe tile of two slots cannot be read in place and there is no buffer */
        ck_assert_int_eq(zo_tile_walk_run(w, t + N - 1, 2, inplace_fn, &c), -EINVAL);
    }
    zo_tile_walk_destroy(&w);
    for (unsigned k = 0; k <= N; k++)
        ck_assert_int_eq(zo_store_unregister(e.st, &t[k]), 0);
    env_close(&e);
}
END_TEST

/* Weights on NVMe, read in place from their pool slots: bit for bit what
 * the pinned host home gives in place and what the copy path gives, on the
 * same grid (tiles of one slot); a budget-chosen NVMe grid is cut to tiles
 * of one slot, within the budget, against the reference (run_linear). */
START_TEST(linear_in_place_nvme)
{
    static const lin_case cases[] = {
        {6, 53, 301, 0, 10, 301},    /* 10 x 301 tiles: 12 KiB (f32), one slot */
        {3, 29, 4099, 0, 3, 4099},   /* 48 KiB f32 tiles, 3 rows each, the last of 2 */
    };
    for (int ti = 0; ti < 4; ti++) {
        zo_dtype t = ti % 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
        const lin_case *lc = &cases[ti / 2];
        lin_result a, b, c;
        memset(&a, 0, sizeof(a));
        memset(&b, 0, sizeof(b));
        memset(&c, 0, sizeof(c));
        run_linear(lc, t, ZO_TIER_NVME, 7, 0, &a);
        run_linear(lc, t, ZO_TIER_HOST, 7, 0, &b);
        run_linear(lc, t, ZO_TIER_NVME, 7, 1, &c);
        ck_assert_uint_ne(a.grid.flags & ZO_TILE_IN_PLACE, 0);
        ck_assert_uint_eq(c.grid.flags & ZO_TILE_IN_PLACE, 0);
        ck_assert_uint_eq(a.ws.in_place_tiles, a.ws.tiles);
        lin_same(&a, &b, lc);
        lin_same(&a, &c, lc);
        lin_result_free(&a);
        lin_result_free(&b);
        lin_result_free(&c);
    }
    /* budget-chosen: the in-place plan (no staging) gives one 840 KB tile,
     * above the 64 KiB slot: cut to whole-row tiles of one slot */
    lin_case big = {4, 300, 700, 2 * MiB, 0, 0};
    lin_result r;
    memset(&r, 0, sizeof(r));
    run_linear(&big, ZO_DTYPE_F32, ZO_TIER_NVME, 5, 0, &r);
    ck_assert_uint_le(r.grid.tile_bytes, 64 * KiB);
    ck_assert_uint_eq(r.grid.tile_in, 700);
    ck_assert_uint_eq(r.ws.in_place_tiles, r.ws.tiles);
    lin_result_free(&r);
    /* in place on the host home: fewer, larger tiles than the copy plan */
    lin_result h, hc;
    memset(&h, 0, sizeof(h));
    memset(&hc, 0, sizeof(hc));
    lin_case mid = {4, 300, 700, 1 * MiB, 0, 0};
    run_linear(&mid, ZO_DTYPE_F32, ZO_TIER_HOST, 5, 0, &h);
    run_linear(&mid, ZO_DTYPE_F32, ZO_TIER_HOST, 5, 1, &hc);
    ck_assert_uint_lt(h.grid.tiles_out, hc.grid.tiles_out);
    ck_assert_uint_le(h.grid.work_bytes, 1 * MiB);
    lin_result_free(&h);
    lin_result_free(&hc);
}
END_TEST

/* ---- pass order, kept last tile, prefetch ------------------------------------------------ */
/* Backward walking the tiles last to first (the default) against the old
 * first-to-last walk, every case, both dtypes, every home, copied and in
 * place: y, db and dW the same bits (each is one tile's work whatever the
 * order); dx the same bits when the grid has one tile row (each dx element
 * has one tile's term), else within rounding of the reference (checked by
 * run_linear_ex) since the tile rows are summed in the opposite order.
 * With keep_last the backward reads one tile fewer (counted in
 * run_linear_ex: reads 2n - 1, reused 1). */
START_TEST(linear_reverse_backward)
{
    int ci = _i / 2;
    zo_dtype t = _i % 2 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
    const lin_case *lc = &lin_cases[ci];
    for (int h = 0; h < 3; h++)
        for (int copy = 0; copy < 2; copy++) {
            zo_tier home = (zo_tier)h;
            lin_result fo, rv;
            memset(&fo, 0, sizeof(fo));
            memset(&rv, 0, sizeof(rv));
            run_linear_ex(lc, t, home, 41 + (uint64_t)ci, &(lin_opts){.copy = copy, .in_order = 1}, &fo);
            run_linear_ex(lc, t, home, 41 + (uint64_t)ci, &(lin_opts){.copy = copy, .keep = 1}, &rv);
            ck_assert_uint_eq(fo.grid.tile_out, rv.grid.tile_out);
            ck_assert_uint_eq(fo.grid.tile_in, rv.grid.tile_in);
            ck_assert_int_eq(memcmp(fo.y, rv.y, lc->batch * lc->out * 4), 0);
            ck_assert_int_eq(memcmp(fo.db, rv.db, lc->out * 4), 0);
            ck_assert_int_eq(memcmp(fo.dw, rv.dw, lc->out * lc->in * 4), 0);
            if (rv.grid.tiles_out == 1)
                ck_assert_int_eq(memcmp(fo.dx, rv.dx, lc->batch * lc->in * 4), 0);
            ck_assert_uint_eq(rv.ws.reads + 1, fo.ws.reads);
            lin_result_free(&fo);
            lin_result_free(&rv);
        }
}
END_TEST

/* zo_tiled_linear_prefetch() before each pass, with and without a kept
 * tile, weights on NVMe (in place and copied) and in pinned host memory:
 * the same bits as without it, the device memory exactly the plan's
 * (run_linear_ex), the pool within its slots. */
START_TEST(linear_prefetch)
{
    static const lin_case cases[] = {
        {6, 53, 301, 0, 10, 301},     /* 12 KiB tiles: one slot, in place on NVMe */
        {4, 97, 257, 40 * KiB, 0, 0}, /* budget-chosen */
        {3, 7, 5, 0, 4, 3},           /* two tile rows: dx rows summed in reverse */
    };
    for (unsigned ci = 0; ci < ZO_ARRAY_LEN(cases); ci++)
        for (int h = ZO_TIER_HOST; h <= ZO_TIER_NVME; h++)
            for (int copy = 0; copy < 2; copy++) {
                lin_result a, b, c;
                memset(&a, 0, sizeof(a));
                memset(&b, 0, sizeof(b));
                memset(&c, 0, sizeof(c));
                run_linear_ex(&cases[ci], ZO_DTYPE_F32, (zo_tier)h, 3, &(lin_opts){.copy = copy}, &a);
                run_linear_ex(&cases[ci], ZO_DTYPE_F32, (zo_tier)h, 3, &(lin_opts){.copy = copy, .prefetch = 1}, &b);
                run_linear_ex(&cases[ci], ZO_DTYPE_F32, (zo_tier)h, 3,
                              &(lin_opts){.copy = copy, .prefetch = 1, .keep = 1}, &c);
                lin_same(&a, &b, &cases[ci]);
                lin_same(&a, &c, &cases[ci]);
                ck_assert_uint_eq(b.ws.prefetched, 2);
                ck_assert_uint_eq(c.ws.prefetched, 1); /* backward's first tile was kept */
                lin_result_free(&a);
                lin_result_free(&b);
                lin_result_free(&c);
            }
}
END_TEST

/* What a walker holds between runs is let go on every path: a prefetch
 * never used and a kept tile never used, then destroy (no hang, the tiles
 * unregister, the pool's slots are all back); a prefetch for one pass
 * followed by the other pass; set_weight after a prefetch and a kept tile
 * (the write is not refused and the next pass sees the new weights). */
START_TEST(linear_prefetch_dropped)
{
    env e;
    env_open(&e, 1 * MiB, 1 * MiB);
    for (int h = ZO_TIER_HOST; h <= ZO_TIER_NVME; h++)
        for (int copy = 0; copy < 2; copy++) {
            zo_tiled_linear_config c;
            zo_tiled_linear_config_default(&c);
            c.copy_tiles = copy;
            c.home = (zo_tier)h;
            c.in_features = 300;
            c.out_features = 20;
            c.max_batch = 2;
            c.tile_out = 10;
            c.tile_in = 300;
            c.keep_last = 1;
            zo_tiled_linear *tl = NULL;
            ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
            /* prefetch, nothing else, destroy */
            ck_assert_int_eq(zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_FORWARD), 0);
            ck_assert_int_eq(zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_FORWARD), 0); /* no-op */
            ck_assert_int_eq(zo_tiled_linear_prefetch(tl, (zo_tile_pass)7), -EINVAL);
            ck_assert_int_eq(zo_tiled_linear_prefetch(NULL, ZO_TILE_PASS_FORWARD), -EINVAL);
            zo_tile_walk_stats ws;
            zo_tiled_linear_get_stats(tl, &ws);
            ck_assert_uint_eq(ws.prefetched + ws.prefetch_skipped, 1);
            zo_tiled_linear_destroy(&tl);
            zo_store_stats ss;
            zo_store_get_stats(e.st, &ss);
            ck_assert_uint_eq(ss.pool_in_use, 0);

            ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
            float *x = dmalloc(e.dev, 2 * 300 * 4), *y = dmalloc(e.dev, 2 * 20 * 4), *dx = dmalloc(e.dev, 2 * 300 * 4);
            float hx[600], hy[40], w[20 * 300];
            for (int i = 0; i < 600; i++)
                hx[i] = 1.0f;
            for (int i = 0; i < 20 * 300; i++)
                w[i] = 1.0f;
            h2d(e.dev, x, hx, sizeof(hx));
            ck_assert_int_eq(zo_tiled_linear_set_weight(tl, w, 300), 0);
            /* a backward prefetch, then a forward: the prefetch is undone */
            ck_assert_int_eq(zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_BACKWARD), 0);
            ck_assert_int_eq(zo_tiled_linear_forward(tl, x, 2, NULL, y), 0); /* keeps its last tile */
            d2h(e.dev, hy, y, sizeof(hy));
            ck_assert(hy[0] == 300.0f && hy[39] == 300.0f);
            /* new weights over a kept tile and a prefetch: dropped, not stale */
            ck_assert_int_eq(zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_FORWARD), 0);
            for (int i = 0; i < 20 * 300; i++)
                w[i] = 2.0f;
            int r = zo_tiled_linear_set_weight(tl, w, 300);
            ck_assert_msg(r == 0, "set_weight over a prefetch: %s (%s)", zo_strerror(r), zo_tiled_linear_errmsg(tl));
            ck_assert_int_eq(zo_tiled_linear_forward(tl, x, 2, NULL, y), 0);
            d2h(e.dev, hy, y, sizeof(hy));
            ck_assert(hy[0] == 600.0f && hy[39] == 600.0f);
            /* kept from that forward, never used: destroy lets it go */
            zo_tiled_linear_destroy(&tl);
            zo_store_get_stats(e.st, &ss);
            ck_assert_uint_eq(ss.pool_in_use, 0);
            (void)dx;
            zo_dev_free(e.dev, x);
            zo_dev_free(e.dev, y);
            zo_dev_free(e.dev, dx);
            /* a non-train layer has no backward to prefetch */
            c.train = 0;
            ck_assert_int_eq(zo_tiled_linear_create(&tl, e.st, e.dev, &c), 0);
            ck_assert_int_eq(zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_BACKWARD), ZO_ESTATE);
            zo_tiled_linear_destroy(&tl);
        }
    env_close(&e);
}
END_TEST

/* The walker's own between-run state: a run with KEEP_LAST, then a run over
 * the tiles reversed starts with the kept one (no read) and hands fn the
 * right bytes; a prefetch while the pool has no free slot is skipped (0,
 * counted) and the run still works; unknown run flags are refused. */
START_TEST(walker_keep_and_prefetch)
{
    env e;
    env_open(&e, 0, 1 * MiB);
    enum { N = 6, BYTES = 48 * 1024 };
    zo_tensor *t[N], *rt[N];
    for (unsigned k = 0; k < N; k++)
        t[k] = walk_tensor(e.st, k, BYTES, k % 2 ? ZO_TIER_HOST : ZO_TIER_NVME);
    for (unsigned k = 0; k < N; k++)
        rt[k] = t[N - 1 - k];
    for (int inp = 0; inp < (g_kind == ZO_DEV_HOST ? 2 : 1); inp++) { /* in place: the host backend's */
        zo_tile_walk *w = NULL;
        ck_assert_int_eq(zo_tile_walk_create_ex(&w, e.st, e.dev, inp ? 0 : BYTES, inp ? ZO_TILE_WALK_IN_PLACE : 0),
                         0);
        ck_assert_int_eq(zo_tile_walk_run_ex(w, t, N, many_fn, NULL, 2), -EINVAL);
        many_ctx c = {.bytes = BYTES, .n = N};
        ck_assert_int_eq(zo_tile_walk_run_ex(w, t, N, many_fn, &c, ZO_TILE_RUN_KEEP_LAST), 0);
        for (unsigned k = 0; k < N; k++)
            ck_assert_msg(c.ok[k], "walk: tile %u", k);
        /* reversed: fn(k) sees tile N-1-k's bytes, the first one kept */
        many_ctx rc = {.bytes = BYTES, .n = N, .rev = 1};
        ck_assert_int_eq(zo_tile_walk_run_ex(w, rt, N, many_fn, &rc, 0), 0);
        for (unsigned k = 0; k < N; k++)
            ck_assert_msg(rc.ok[k], "reversed walk: tile %u", k);
        zo_tile_walk_stats ws;
        zo_tile_walk_get_stats(w, &ws);
        ck_assert_uint_eq(ws.reads, 2 * N - 1);
        ck_assert_uint_eq(ws.reused, 1);
        /* the pool full (8 slots: 1 the store's, 6 held here, 1 left): the
         * NVMe tile's prefetch (a stream of 2 slots) is skipped */
        zo_tensor_desc d;
        zo_tensor_desc_default(&d);
        d.name = "hog";
        d.bytes = 1 * MiB;
        d.dtype = ZO_DTYPE_U8;
        zo_tensor *hog;
        ck_assert_int_eq(zo_store_register(e.st, &d, &hog), 0);
        zo_store_stream *held;
        ck_assert_int_eq(zo_store_stream_open(e.st, hog, ZO_STREAM_READ, 5, &held), 0);
        ck_assert_int_eq(zo_tile_walk_prefetch(w, t[0]), 0);
        zo_tile_walk_get_stats(w, &ws);
        ck_assert_uint_eq(ws.prefetch_skipped, 1);
        ck_assert_uint_eq(ws.prefetched, 0);
        ck_assert_int_eq(zo_store_stream_close(&held), 0);
        ck_assert_int_eq(zo_store_unregister(e.st, &hog), 0);
        /* now it is begun, and the run that starts with it uses it */
        ck_assert_int_eq(zo_tile_walk_prefetch(w, t[0]), 0);
        ck_assert_int_eq(zo_tile_walk_prefetch(NULL, t[0]), -EINVAL);
        memset(c.ok, 0, sizeof(c.ok));
        ck_assert_int_eq(zo_tile_walk_run(w, t, N, many_fn, &c), 0);
        for (unsigned k = 0; k < N; k++)
            ck_assert_msg(c.ok[k], "tile %u after a prefetch", k);
        zo_tile_walk_get_stats(w, &ws);
        ck_assert_uint_eq(ws.prefetched, 1);
        ck_assert_uint_eq(ws.reads, 3 * N - 1);
        /* a prefetch of a tile no run starts with: dropped by destroy */
        ck_assert_int_eq(zo_tile_walk_prefetch(w, t[2]), 0);
        zo_tile_walk_drop(NULL);
        walker_gone(&e, &w, t, inp ? N : 0);
    }
    env_close(&e);
}
END_TEST

START_TEST(linear_in_place_pool_shared)
{
    if (g_kind == ZO_DEV_HOST) /* in place is the host backend's */
        pool_shared(0);
}
END_TEST

/* ---- tiled cross-entropy ------------------------------------------------------------------- */
/* What run_xent_ex() got, for comparing two runs of the same case. */
typedef struct xent_result {
    double loss;
    float *dh, *de;
    zo_tile_grid grid;
    zo_tile_walk_stats ws;
} xent_result;

/* One case against the double reference. copy: the config's copy_tiles;
 * out: NULL, or keeps the results (free dh and de). */
static void run_xent_ex(zo_dtype t, zo_tier home, uint64_t B, uint64_t V, uint64_t H, uint64_t budget, uint32_t tv,
                        int copy, xent_result *out)
{
    size_t esz = zo_dtype_size(t);
    zo_test_rng rng = {zo_test_seed() ^ V};
    float *e_ = malloc(V * H * 4), *h = malloc(B * H * 4);
    void *pe = malloc(V * H * esz), *ph = malloc(B * H * esz);
    fill(&rng, e_, pe, t, V * H, 1.0f);
    fill(&rng, h, ph, t, B * H, 1.0f);
    int32_t *lab = malloc(B * 4);
    for (uint64_t b = 0; b < B; b++)
        lab[b] = (int32_t)(zo_test_next(&rng) % V);
    lab[0] = (int32_t)(V - 1); /* the last, partial tile */
    size_t act = B * H * esz + B * H * 4;
    uint64_t lim = budget ? budget : 16 * MiB;
    env en;
    env_open(&en, act, lim);
    void *dh_in = dmalloc(en.dev, B * H * esz);
    float *ddh = dmalloc(en.dev, B * H * 4);
    h2d(en.dev, dh_in, ph, B * H * esz);
    size_t before = dev_used(en.dev);
    float *de = calloc(V * H, 4);
    zo_tile_host_sink hs = {.dw = de, .ld = H};
    zo_tiled_xent_config c;
    zo_tiled_xent_config_default(&c);
    c.vocab = V;
    c.hidden = H;
    c.max_batch = B;
    c.dtype = t;
    c.home = home;
    c.budget = budget;
    c.tile_vocab = tv;
    c.de_sink = zo_tile_sink_host;
    c.de_sink_ctx = &hs;
    c.copy_tiles = copy;
    zo_tiled_xent *x = NULL;
    int r = zo_tiled_xent_create(&x, en.st, en.dev, &c);
    ck_assert_msg(r == 0, "xent create: %s (%s)", zo_strerror(r), zo_last_error_detail());
    zo_tile_grid g;
    ck_assert_int_eq(zo_tiled_xent_grid(x, &g), 0);
    if (exact_mem())
        ck_assert_uint_eq(dev_used(en.dev) - before, g.work_bytes);
    if (budget)
        ck_assert_uint_le(g.work_bytes, budget);
    ck_assert_uint_gt(g.tiles_out, 1); /* the full logits never exist */
    ck_assert_int_eq(zo_tiled_xent_set_weight(x, pe, H), 0);
    double loss = 0;
    float *got = malloc(B * H * 4);
    r = zo_tiled_xent_run(x, dh_in, B, lab, &loss, ddh);
    ck_assert_msg(r == 0, "xent run: %s (%s)", zo_strerror(r), zo_tiled_xent_errmsg(x));
    d2h(en.dev, got, ddh, B * H * 4);
    /* two walks; the second starts with the tile the first kept */
    zo_tile_walk_stats ws;
    zo_tiled_xent_get_stats(x, &ws);
    ck_assert_uint_eq(ws.runs, 2);
    ck_assert_uint_eq(ws.tiles, 2ull * g.tiles_out);
    ck_assert_uint_eq(ws.reused, 1);
    ck_assert_uint_eq(ws.reads, 2ull * g.tiles_out - 1);
    /* in place: host backend, not copy_tiles, host home or NVMe tiles of one slot */
    int in_place = !copy && home != ZO_TIER_DEVICE && g_kind == ZO_DEV_HOST &&
                   (home == ZO_TIER_HOST || g.tile_bytes <= 64 * KiB);
    ck_assert_int_eq(!!(g.flags & ZO_TILE_IN_PLACE), in_place);
    if (in_place) {
        ck_assert_uint_eq(ws.fetch_bytes, 0);
        ck_assert_uint_eq(ws.in_place_tiles, ws.tiles - 1);
    } else if (home != ZO_TIER_DEVICE) {
        ck_assert_uint_eq(ws.in_place_tiles, 0);
    }
    if (out) {
        out->loss = loss;
        out->grid = g;
        out->ws = ws;
        out->dh = malloc(B * H * 4);
        out->de = malloc(V * H * 4);
        memcpy(out->dh, got, B * H * 4);
        memcpy(out->de, de, V * H * 4);
    }

    /* reference: full logits in double */
    double *z = malloc(V * 8), *p = malloc(B * V * 8), ref_loss = 0;
    for (uint64_t b = 0; b < B; b++) {
        double mx = -INFINITY, s = 0;
        for (uint64_t v = 0; v < V; v++) {
            z[v] = 0;
            for (uint64_t k = 0; k < H; k++)
                z[v] += (double)h[b * H + k] * e_[v * H + k];
            mx = z[v] > mx ? z[v] : mx;
        }
        for (uint64_t v = 0; v < V; v++)
            s += exp(z[v] - mx);
        ref_loss += mx + log(s) - z[lab[b]];
        for (uint64_t v = 0; v < V; v++)
            p[b * V + v] = (exp(z[v] - mx) / s - (v == (uint64_t)lab[b])) / (double)B;
    }
    ref_loss /= (double)B;
    ck_assert_msg(fabs(loss - ref_loss) <= 1e-4 * fabs(ref_loss) + 1e-5, "loss %.9g vs %.9g", loss, ref_loss);
    /* gradients: dlogits is rounded to the weight type before its GEMMs */
    double tol = t == ZO_DTYPE_BF16 ? 0x1p-7 : 0x1p-18;
    for (uint64_t b = 0; b < B; b++)
        for (uint64_t k = 0; k < H; k++) {
            double ref = 0, mag = 0;
            for (uint64_t v = 0; v < V; v++) {
                ref += p[b * V + v] * e_[v * H + k];
                mag += fabs(p[b * V + v] * e_[v * H + k]);
            }
            ZO_EXPECT(fabs(got[b * H + k] - ref) <= tol * mag + 1e-7, "dh(%llu,%llu) %.9g vs %.9g",
                      (unsigned long long)b, (unsigned long long)k, got[b * H + k], ref);
        }
    for (uint64_t v = 0; v < V; v++)
        for (uint64_t k = 0; k < H; k++) {
            double ref = 0, mag = 0;
            for (uint64_t b = 0; b < B; b++) {
                ref += p[b * V + v] * h[b * H + k];
                mag += fabs(p[b * V + v] * h[b * H + k]);
            }
            ZO_EXPECT(fabs(de[v * H + k] - ref) <= tol * mag + 1e-7, "dE(%llu,%llu) %.9g vs %.9g",
                      (unsigned long long)v, (unsigned long long)k, de[v * H + k], ref);
        }
    /* bad labels are refused before any work */
    lab[B - 1] = (int32_t)V;
    ck_assert_int_eq(zo_tiled_xent_run(x, dh_in, B, lab, &loss, ddh), -EINVAL);
    lab[B - 1] = -1;
    ck_assert_int_eq(zo_tiled_xent_run(x, dh_in, B, lab, &loss, ddh), -EINVAL);
    ck_assert_int_eq(zo_tiled_xent_run(x, dh_in, B + 1, lab, &loss, ddh), -EINVAL);
    ck_assert_int_eq(zo_tiled_xent_run(x, NULL, B, lab, &loss, ddh), -EINVAL);
    zo_tiled_xent_destroy(&x);
    if (exact_mem())
        ck_assert_uint_eq(dev_used(en.dev), before);
    zo_dev_free(en.dev, dh_in);
    zo_dev_free(en.dev, ddh);
    env_close(&en);
    free(e_), free(h), free(pe), free(ph), free(lab), free(de), free(got), free(z), free(p);
}

static void run_xent(zo_dtype t, zo_tier home, uint64_t B, uint64_t V, uint64_t H, uint64_t budget, uint32_t tv)
{
    run_xent_ex(t, home, B, V, H, budget, tv, 0, NULL);
    if (home != ZO_TIER_DEVICE)
        run_xent_ex(t, home, B, V, H, budget, tv, 1, NULL);
}

/* E's tiles read in place (host backend) give the same bits as the copy
 * path on the same grid, pinned host and NVMe homes (tiles of one 64 KiB
 * slot), f32 and bf16; a budget-planned NVMe grid in place is cut to tiles
 * of one slot, within the budget (checked in run_xent_ex). */
START_TEST(xent_in_place)
{
    for (int ti = 0; ti < 2; ti++)
        for (int h = ZO_TIER_HOST; h <= ZO_TIER_NVME; h++) {
            zo_dtype t = ti ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
            uint64_t B = 5, V = 1009, H = 37;
            xent_result a, b;
            run_xent_ex(t, (zo_tier)h, B, V, H, 0, 128, 0, &a);
            run_xent_ex(t, (zo_tier)h, B, V, H, 0, 128, 1, &b);
            ck_assert_uint_ne(a.grid.flags & ZO_TILE_IN_PLACE, 0);
            ck_assert_uint_eq(b.grid.flags & ZO_TILE_IN_PLACE, 0);
            ck_assert_uint_eq(a.grid.tile_out, b.grid.tile_out);
            ck_assert(a.loss == b.loss);
            ck_assert_int_eq(memcmp(a.dh, b.dh, B * H * 4), 0);
            ck_assert_int_eq(memcmp(a.de, b.de, V * H * 4), 0);
            free(a.dh), free(a.de), free(b.dh), free(b.de);
        }
    /* budget-chosen on NVMe: 96 KiB plans tiles above a 64 KiB slot when
     * staging is left out; cut to one slot */
    xent_result r;
    run_xent_ex(ZO_DTYPE_F32, ZO_TIER_NVME, 3, 2003, 64, 160 * KiB, 0, 0, &r);
    ck_assert_uint_le(r.grid.tile_bytes, 64 * KiB);
    ck_assert_uint_ne(r.grid.flags & ZO_TILE_IN_PLACE, 0);
    free(r.dh), free(r.de);
}
END_TEST

START_TEST(xent_matches_reference)
{
    run_xent(ZO_DTYPE_F32, ZO_TIER_HOST, 5, 1009, 37, 0, 128);        /* 8 tiles, the last of 113 */
    run_xent(ZO_DTYPE_F32, ZO_TIER_NVME, 3, 2003, 64, 96 * KiB, 0);   /* budget-chosen */
    run_xent(ZO_DTYPE_F32, ZO_TIER_DEVICE, 1, 97, 13, 0, 10);
    run_xent(ZO_DTYPE_BF16, ZO_TIER_NVME, 4, 541, 29, 0, 100);
}
END_TEST

START_TEST(xent_bad_input)
{
    env e;
    env_open(&e, 0, 1 * MiB);
    zo_tiled_xent_config c;
    zo_tiled_xent_config_default(&c);
    c.vocab = 1000;
    c.hidden = 64;
    c.max_batch = 4;
    c.budget = 100; /* below one row */
    zo_tiled_xent *x = NULL;
    ck_assert_int_eq(zo_tiled_xent_create(&x, e.st, e.dev, &c), ZO_EBUDGET);
    c.budget = 0;
    c.tile_vocab = 0;
    ck_assert_int_eq(zo_tiled_xent_create(&x, e.st, e.dev, &c), -EINVAL);
    c.tile_vocab = 10;
    c.hidden = 0;
    ck_assert_int_eq(zo_tiled_xent_create(&x, e.st, e.dev, &c), -EINVAL);
    ck_assert_int_eq(zo_tiled_xent_create(&x, NULL, e.dev, &c), -EINVAL);
    ck_assert_ptr_null(x);
    /* the planner alone: one row = 2*64*4 + 2*4*4 + 4*4 + 2*64*4 = 1072 bytes */
    zo_tile_grid g;
    ck_assert_int_eq(zo_tile_plan_vocab(4, 1000, 64, ZO_DTYPE_F32, 1071, 0, 0, &g), ZO_EBUDGET);
    ck_assert_int_eq(zo_tile_plan_vocab(4, 1000, 64, ZO_DTYPE_F32, 1072 * 300, 0, 0, &g), 0);
    ck_assert_uint_eq(g.tiles_out, 4); /* 300 rows fit: 4 tiles of 250 */
    ck_assert_uint_eq(g.tile_out, 250);
    ck_assert_uint_eq(g.work_bytes, 250 * 1072);
    ck_assert_int_eq(zo_tile_plan_vocab(4, 1000, 64, ZO_DTYPE_F32, 0, 0, 0, &g), -EINVAL);
    ck_assert_int_eq(zo_tile_plan_vocab(4, 0, 64, ZO_DTYPE_F32, 1 * MiB, 0, 0, &g), -EINVAL);
    ck_assert_int_eq(zo_tile_plan_vocab(4, 1000, 64, ZO_DTYPE_F16, 1 * MiB, 0, 0, &g), ZO_ENOTSUP);
    ck_assert_int_eq(zo_tile_plan_vocab(4, 1000, 64, ZO_DTYPE_F32, 1 * MiB, 0, ZO_TILE_TRAIN, &g), -EINVAL);
    env_close(&e);
}
END_TEST

/* A test that holds on the host backend only: added there; on another
 * backend it is said on stderr and not run (a silent return would count
 * it as passed). */
#define ADD_HOST_ONLY(tc, t, why)                                                                        \
    do {                                                                                                 \
        if (g_kind == ZO_DEV_HOST)                                                                       \
            tcase_add_test(tc, t);                                                                       \
        else                                                                                             \
            fprintf(stderr, "not run on %s: %s (%s: host backend only)\n", zo_dev_kind_name(g_kind), #t, why); \
    } while (0)

static Suite *suite(void)
{
    Suite *s = suite_create("tiling");
    TCase *tc = tcase_create("gemm");
    tcase_add_test(tc, gemm_shapes);
    tcase_add_test(tc, gemm_reference_loop);
    tcase_add_test(tc, gemm_bad_input);
    ADD_HOST_ONLY(tc, gemm_overlaps_copy, "the rendezvous needs host functions that block");
    suite_add_tcase(s, tc);
    tc = tcase_create("plan");
    tcase_add_test(tc, plan_budgets);
    tcase_add_test(tc, plan_bad_input);
    suite_add_tcase(s, tc);
    tc = tcase_create("walker");
    ADD_HOST_ONLY(tc, walker_overlaps_fetch_with_work, "a host function that blocks the compute stream");
    tcase_add_test(tc, walker_in_place);
    suite_add_tcase(s, tc);
    tc = tcase_create("linear");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, linear_matches_reference, 0, (int)ZO_ARRAY_LEN(lin_cases) * 2);
    tcase_add_test(tc, linear_nvme_identical);
    tcase_add_test(tc, linear_bad_input);
    tcase_add_test(tc, linear_runtime_errors);
    tcase_add_test(tc, linear_pool_shared);
    tcase_add_test(tc, linear_store_sink);
    ADD_HOST_ONLY(tc, linear_in_place_nvme, "in place is the host backend's");
    tcase_add_test(tc, linear_in_place_pool_shared);
    tcase_add_loop_test(tc, linear_reverse_backward, 0, (int)ZO_ARRAY_LEN(lin_cases) * 2);
    tcase_add_test(tc, linear_prefetch);
    tcase_add_test(tc, linear_prefetch_dropped);
    tcase_add_test(tc, walker_keep_and_prefetch);
    ADD_HOST_ONLY(tc, walker_read_ahead_deeper, "in place is the host backend's");
    suite_add_tcase(s, tc);
    tc = tcase_create("xent");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, xent_matches_reference);
    ADD_HOST_ONLY(tc, xent_in_place, "in place is the host backend's");
    tcase_add_test(tc, xent_bad_input);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    if (argc > 1 && zo_dev_kind_parse(argv[1], &g_kind) < 0) {
        fprintf(stderr, "usage: %s [host|cuda]\n", argv[0]);
        return 2;
    }
    if (g_kind != ZO_DEV_HOST) {
        char why[256];
        if (zo_test_probe_dev(g_kind, NULL, why, sizeof(why)) < 0)
            ZO_TEST_SKIP("%s backend unavailable: %s", zo_dev_kind_name(g_kind), why);
    }
    return zo_test_run(suite());
}
