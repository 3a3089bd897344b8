/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo_optim, the offload optimizer engine, on the host device backend (real
 * streams, events and copy threads; real pinned memory; the real store).
 *
 * Every numeric test runs the engine and, beside it, an in-memory reference:
 * the same cpuadam kernels on plain arrays, with the gradient accumulation,
 * norm (per sub-group statistics summed in order), clip coefficient, loss
 * scaler and DPU schedule the engine documents in optim.h, and compares the
 * masters, states and device params bit for bit.
 */
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "zo_test.h"
#include "zo_test_dtype.h"

#include "aio/aio_internal.h"
#include "nvme/nvme_internal.h"

#define NTHREADS 2
#define SGSIZE 65536u

/* the model: group 0 AdamW (small tensors packed, a large one cut across
 * sub-groups), group 1 Adam with L2 decay */
static const uint64_t g0_numel[] = {1000, 70000, 3, 130001};
static const uint64_t g1_numel[] = {4097, 50};
#define NT0 4
#define NT1 2
#define NT (NT0 + NT1)

typedef struct model {
    zo_dtype pdt, gdt;
    uint64_t numel[NT], off[NT], total;
    uint64_t goff[2], gnumel[2];
    zo_cpuadam_hparams hp[2];
} model;

static void model_init(model *m, zo_dtype pdt, zo_dtype gdt)
{
    memset(m, 0, sizeof(*m));
    m->pdt = pdt;
    m->gdt = gdt;
    uint64_t off = 0;
    for (int i = 0; i < NT; i++) {
        m->numel[i] = i < NT0 ? g0_numel[i] : g1_numel[i - NT0];
        m->off[i] = off;
        off += m->numel[i];
        if (i == NT0 - 1)
            m->gnumel[0] = off;
    }
    m->total = off;
    m->goff[1] = m->gnumel[0];
    m->gnumel[1] = off - m->gnumel[0];
    ck_assert_int_eq(zo_cpuadam_hparams_default(&m->hp[0], ZO_OPTIM_ADAMW), 0);
    m->hp[0].lr = 1e-2;
    ck_assert_int_eq(zo_cpuadam_hparams_default(&m->hp[1], ZO_OPTIM_ADAM), 0);
    m->hp[1].lr = 5e-3;
    m->hp[1].weight_decay = 1e-2;
}

static float init_param(uint64_t e)
{
    return (float)(0.5 * cos(0.001 * (double)e + 0.3));
}

/* store a float as dtype */

/* The gradient of element e (global) in micro-step `ms`, as a function of
 * the params the forward saw (so a delayed update shows). Odd steps have a
 * large amplitude (clipped at max norm 1), even ones a small one. */
static float grad_value(uint64_t e, int ms, float param_seen, double scale)
{
    double amp = (ms % 2) ? 1e-2 : 1e-3;
    return (float)(scale * amp * (sin(0.003 * (double)e + 0.7 * ms) + param_seen));
}

/* ---- the reference --------------------------------------------------------------- */

typedef struct ref {
    model *m;
    float *master, *m1, *v, *acc;
    void *out; /* params in pdt, as the device holds them */
    int64_t step;
    zo_cpuadam_team *team;
    int first[NT];
} ref;

static void ref_init(ref *r, model *m)
{
    memset(r, 0, sizeof(*r));
    r->m = m;
    r->master = calloc(m->total, 4);
    r->m1 = calloc(m->total, 4);
    r->v = calloc(m->total, 4);
    r->acc = calloc(m->total, 4);
    r->out = calloc(m->total, 4);
    for (uint64_t e = 0; e < m->total; e++) {
        zo_test_put(r->out, m->pdt, e, init_param(e));
        r->master[e] = zo_test_get(r->out, m->pdt, e);
    }
    zo_cpuadam_team_config tc;
    zo_cpuadam_team_config_default(&tc);
    tc.nthreads = NTHREADS;
    ck_assert_int_eq(zo_cpuadam_team_create(&r->team, &tc), 0);
    for (int i = 0; i < NT; i++)
        r->first[i] = 1;
}

static void ref_free(ref *r)
{
    free(r->master);
    free(r->m1);
    free(r->v);
    free(r->acc);
    free(r->out);
    zo_cpuadam_team_destroy(&r->team);
}

/* accumulate one tensor's gradient (in gdt) */
static void ref_grad(ref *r, int i, const void *g)
{
    model *m = r->m;
    float *a = r->acc + m->off[i];
    for (uint64_t k = 0; k < m->numel[i]; k++) {
        float f = zo_test_get(g, m->gdt, k);
        a[k] = r->first[i] ? f : a[k] + f;
    }
    r->first[i] = 0;
}

/* The kernel over the reference's elements [o, o + n) with gradients g */
static void ref_kernel(ref *r, const zo_cpuadam_hparams *hp, uint64_t o, uint64_t n, const void *g, zo_dtype gdt)
{
    model *m = r->m;
    zo_cpuadam_tensors t;
    zo_cpuadam_tensors_default(&t);
    t.n = n;
    t.param = r->master + o;
    t.grad = g;
    t.grad_dtype = gdt;
    t.exp_avg = r->m1 + o;
    t.exp_avg_sq = r->v + o;
    t.state_dtype = ZO_DTYPE_F32;
    t.param_out = (char *)r->out + o * zo_dtype_size(m->pdt);
    t.out_dtype = m->pdt;
    ck_assert_int_eq(zo_cpuadam_team_step(r->team, hp, &t), 0);
}

/* The boundary: returns 1 if applied, 0 if overflowed. */
static int ref_step(ref *r, double scale, double max_norm, double *norm_out)
{
    model *m = r->m;
    for (int i = 0; i < NT; i++) {
        if (r->first[i])
            memset(r->acc + m->off[i], 0, m->numel[i] * 4);
        r->first[i] = 1;
    }
    double sumsq = 0;
    uint64_t nf = 0;
    for (int g = 0; g < 2; g++)
        for (uint64_t o = 0; o < m->gnumel[g]; o += SGSIZE) {
            zo_grad_stats gs;
            uint64_t n = m->gnumel[g] - o < SGSIZE ? m->gnumel[g] - o : SGSIZE;
            ck_assert_int_eq(zo_cpuadam_team_grad_stats(r->team, r->acc + m->goff[g] + o, ZO_DTYPE_F32, n, &gs), 0);
            sumsq += gs.sumsq;
            nf += gs.nonfinite;
        }
    if (nf)
        return 0;
    double norm = sqrt(sumsq) / scale;
    if (norm_out)
        *norm_out = norm;
    double coef = 1.0;
    if (max_norm > 0) {
        coef = max_norm / (norm + 1e-6);
        if (coef > 1.0)
            coef = 1.0;
    }
    r->step++;
    for (int g = 0; g < 2; g++) {
        zo_cpuadam_hparams hp = m->hp[g];
        hp.step = r->step;
        hp.grad_scale = 1.0 / scale;
        hp.clip_coef = coef;
        ref_kernel(r, &hp, m->goff[g], m->gnumel[g], r->acc + m->goff[g], ZO_DTYPE_F32);
    }
    return 1;
}

/* ---- the engine under test ------------------------------------------------------------ */

typedef struct eng {
    model *m;
    zo_dev *dev;
    void *dparam[NT], *dgrad[NT];
    zo_optim *o;
    zo_optim_config cfg;
    zo_optim_group grp[2];
    const char *names[NT];
} eng;

static const char *const tnames[NT] = {"embed", "w1", "bias", "w2", "head", "norm"};

static void eng_config(eng *e, model *m)
{
    memset(e, 0, sizeof(*e));
    e->m = m;
    ck_assert_int_eq(zo_dev_open(&e->dev, NULL), 0);
    size_t pes = zo_dtype_size(m->pdt), ges = zo_dtype_size(m->gdt);
    for (int i = 0; i < NT; i++) {
        ck_assert_int_eq(zo_dev_malloc(e->dev, &e->dparam[i], m->numel[i] * pes), 0);
        ck_assert_int_eq(zo_dev_malloc(e->dev, &e->dgrad[i], m->numel[i] * ges), 0);
        /* host backend: device memory is host memory */
        for (uint64_t k = 0; k < m->numel[i]; k++)
            zo_test_put(e->dparam[i], m->pdt, k, init_param(m->off[i] + k));
        e->names[i] = tnames[i];
    }
    zo_optim_config_default(&e->cfg);
    e->cfg.dev = e->dev;
    e->cfg.param_dtype = m->pdt;
    e->cfg.grad_dtype = m->gdt;
    e->cfg.sub_group_size = SGSIZE;
    e->cfg.nthreads = NTHREADS;
    e->cfg.grad_staging_bytes = 64 << 10; /* small: gradients stream through it in pieces */
    for (int g = 0; g < 2; g++) {
        zo_optim_group_default(&e->grp[g]);
        e->grp[g].ntensors = g ? NT1 : NT0;
        e->grp[g].numel = g ? g1_numel : g0_numel;
        e->grp[g].names = e->names + (g ? NT0 : 0);
        e->grp[g].dev_params = e->dparam + (g ? NT0 : 0);
        e->grp[g].hparams = &m->hp[g];
    }
    e->cfg.groups = e->grp;
    e->cfg.ngroups = 2;
}

/* a model, its reference and an engine configured for it (not created) */
static void setup(model *m, ref *r, eng *e, zo_dtype pdt, zo_dtype gdt)
{
    model_init(m, pdt, gdt);
    ref_init(r, m);
    eng_config(e, m);
}

static void eng_create(eng *e)
{
    int r = zo_optim_create(&e->o, &e->cfg);
    ck_assert_msg(r == 0, "create: %s (%s)", zo_strerror(r), zo_last_error_detail());
    ck_assert_int_eq(zo_optim_init_from_device(e->o), 0);
}

static void eng_free(eng *e)
{
    zo_optim_destroy(&e->o);
    ck_assert_ptr_null(e->o);
    for (int i = 0; i < NT; i++) {
        zo_dev_free(e->dev, e->dparam[i]);
        zo_dev_free(e->dev, e->dgrad[i]);
    }
    zo_dev_close(&e->dev);
}

/* fill the device gradient of tensor i for micro-step ms from the params
 * the device holds now */
static void fill_grad_from(eng *e, int i, int ms, double scale, const void *params)
{
    model *m = e->m;
    for (uint64_t k = 0; k < m->numel[i]; k++)
        zo_test_put(e->dgrad[i], m->gdt, k, grad_value(m->off[i] + k, ms, zo_test_get(params, m->pdt, k), scale));
}

static void fill_grad(eng *e, int i, int ms, double scale)
{
    fill_grad_from(e, i, ms, scale, e->dparam[i]);
}

static void compare_dev(eng *e, ref *r, const char *when, void *const *dev);

/* masters, states and device params equal the reference, bit for bit */
static void compare(eng *e, ref *r, const char *when)
{
    compare_dev(e, r, when, e->dparam);
}

/* the same, with the device params read at dev[] (double-buffered params) */
static void compare_dev(eng *e, ref *r, const char *when, void *const *dev)
{
    model *m = e->m;
    size_t pes = zo_dtype_size(m->pdt);
    for (int i = 0; i < NT; i++) {
        uint64_t n = m->numel[i];
        float *buf = malloc(n * 4);
        const float *want[3] = {r->master + m->off[i], r->m1 + m->off[i], r->v + m->off[i]};
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(zo_optim_state_export(e->o, (unsigned)i, (zo_optim_state)k, buf, ZO_DTYPE_F32, 0, n), 0);
            for (uint64_t j = 0; j < n; j++)
                ZO_EXPECT(memcmp(&buf[j], &want[k][j], 4) == 0, "%s: tensor %d state %d elem %llu: %a != %a", when,
                          i, k, (unsigned long long)j, (double)buf[j], (double)want[k][j]);
        }
        free(buf);
        ck_assert_msg(memcmp(dev[i], (char *)r->out + m->off[i] * pes, n * pes) == 0,
                      "%s: device params of tensor %d differ", when, i);
    }
}

/* One training run: `steps` boundaries of `accum` micro-steps each. */
/* engine internals (lib/optim/optim_internal.h): use the parameter buffer
 * and copies on the host backend too, the path a GPU takes */
extern int zo__optim_force_copy;

static void run_plain(zo_dtype pdt, zo_dtype gdt, unsigned accum, int steps, double max_norm, int nvme)
{
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, pdt, gdt);
    e.cfg.grad_accum_steps = accum;
    e.cfg.max_grad_norm = max_norm;
    char dir[256] = "";
    if (nvme) {
        zo_test_mkdtemp(dir, sizeof(dir));
        e.cfg.placement = ZO_OPTIM_PLACE_NVME;
        e.cfg.nvme_path = dir;
        e.cfg.buffer_count = 5; /* read-ahead depth 3 */
    }
    eng_create(&e);
    int ms = 0;
    int clipped = 0;
    for (int s = 1; s <= steps; s++) {
        for (unsigned a = 0; a < accum; a++) {
            ms++;
            double scale = zo_optim_loss_scale(e.o);
            for (int i = NT - 1; i >= 0; i--) { /* backward order */
                if (s == 2 && i == 2)
                    continue; /* a tensor without a gradient this step: zero */
                fill_grad(&e, i, ms, scale);
                ref_grad(&r, i, e.dgrad[i]);
                ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
                if (s == 3 && i == 1 && a + 1 == accum) {
                    /* a second gradient in the last micro-step: the statistics
                     * taken when the first landed are stale (its sub-groups
                     * must be recomputed by the step) */
                    ck_assert_int_eq(zo_optim_grads_done(e.o), 0);
                    ref_grad(&r, i, e.dgrad[i]);
                    ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
                }
            }
            zo_optim_step_result res = {.struct_size = sizeof(res)};
            int rc = zo_optim_step(e.o, NULL, &res);
            ck_assert_msg(rc == 0, "step: %s (%s)", zo_strerror(rc), zo_optim_errmsg(e.o));
            ck_assert_int_eq(res.boundary, a + 1 == accum);
            if (a + 1 == accum) {
                double norm = 0;
                ck_assert_int_eq(ref_step(&r, scale, max_norm, &norm), 1);
                ck_assert_int_eq(res.step, s);
                ck_assert_msg(res.grad_norm == norm, "norm %a != %a", res.grad_norm, norm);
                clipped += res.clipped;
                zo_optim_timeline stl = {.struct_size = sizeof(stl)};
                ck_assert_int_eq(zo_optim_get_timeline(e.o, &stl), 0);
                /* every tensor got its gradient: the statistics were taken at
                 * intake and the step made no pass of its own */
                if (s != 2 && s != 3)
                    ck_assert_msg(stl.norm_ns == 0, "step %d: a statistics pass of %llu ns", s,
                                  (unsigned long long)stl.norm_ns);
                ck_assert(stl.update_ns > 0 && stl.update_ns <= stl.total_ns);
                zo_optim_info inf = {.struct_size = sizeof(inf)};
                ck_assert_int_eq(zo_optim_get_info(e.o, &inf), 0);
                ck_assert_uint_eq(inf.updates_done, (uint64_t)s);
            }
        }
        char when[32];
        snprintf(when, sizeof(when), "step %d", s);
        compare(&e, &r, when);
        ck_assert_int_eq(zo_optim_params_current(e.o), 1);
        for (int i = 0; i < NT; i++) { /* the host copy holds them too (read back after direct steps) */
            const void *pb;
            ck_assert_int_eq(zo_optim_param_buffer(e.o, (unsigned)i, &pb), 0);
            ck_assert_msg(memcmp(pb, (char *)r.out + m.off[i] * zo_dtype_size(pdt), m.numel[i] * zo_dtype_size(pdt)) == 0,
                          "%s: parameter buffer of tensor %d differs", when, i);
        }
    }
    if (max_norm > 0)
        ck_assert_msg(clipped > 0 && (accum > 1 || clipped < steps), "clipping should hit some steps, not all (%d)",
                      clipped);
    zo_optim_timeline tl = {.struct_size = sizeof(tl)};
    ck_assert_int_eq(zo_optim_get_timeline(e.o, &tl), 0);
    ck_assert_int_eq(tl.step, steps);
    ck_assert(tl.d2h_bytes > 0 && tl.h2d_bytes == m.total * zo_dtype_size(pdt) && tl.compute_ns > 0);
    char js[1024];
    int n = zo_optim_timeline_json(e.o, js, sizeof(js));
    ck_assert(n > 0 && (size_t)n < sizeof(js) && strstr(js, "\"compute_ns\":"));
    if (nvme) {
        /* exactly the fp32 states (12 B/param) in and out per step, nothing else */
        ck_assert_uint_eq(tl.nvme_read_bytes, m.total * 12);
        ck_assert_uint_eq(tl.nvme_write_bytes, m.total * 12);
        zo_optim_info inf = {.struct_size = sizeof(inf)};
        ck_assert_int_eq(zo_optim_get_info(e.o, &inf), 0);
        ck_assert_uint_eq(inf.nvme_read_bytes_total, (uint64_t)steps * m.total * 12);
        ck_assert_uint_eq(inf.nvme_write_bytes_total, (uint64_t)steps * m.total * 12);
    }
    ck_assert(strstr(js, "\"update_ns\":"));
    {
        /* with copies (a GPU's path), the first gradient of each tensor in a
         * pinned window of its dtype is copied straight in: every step's,
         * once per tensor; later micro-steps' and widened ones go through
         * staging. Both ways must give the reference's bits (compared above). */
        zo_optim_info inf = {.struct_size = sizeof(inf)};
        ck_assert_int_eq(zo_optim_get_info(e.o, &inf), 0);
        uint64_t direct = inf.grad_direct_bytes_total, want = (uint64_t)steps * m.total * zo_dtype_size(gdt);
        if (steps >= 2)
            want -= m.numel[2] * zo_dtype_size(gdt); /* tensor 2 had no gradient in step 2 */
        if (!zo__optim_force_copy)
            ck_assert_uint_eq(inf.grad_windows_pinned, 0);
        if (!inf.grad_windows_pinned || inf.grad_buffer_dtype != gdt)
            ck_assert_uint_eq(direct, 0);
        else
            ck_assert_msg(direct == want, "direct gradient bytes %llu, want %llu", (unsigned long long)direct,
                          (unsigned long long)want);
        if (zo__optim_force_copy && getenv("ZO_TEST_VERBOSE"))
            fprintf(stderr, "copy path: %u windows pinned, dtype %d (gradients %d), %llu bytes direct\n",
                    inf.grad_windows_pinned, (int)inf.grad_buffer_dtype, (int)gdt, (unsigned long long)direct);
    }
    eng_free(&e);
    ref_free(&r);
    if (nvme)
        zo_test_rmtree(dir);
}

/* dtypes x accumulation x clipping; fp16 runs with the dynamic scaler (no overflow) */
static const struct {
    zo_dtype pdt, gdt;
    unsigned accum;
    int steps;
    double max_norm;
    int nvme;
} plain_cases[] = {
    {ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 4, 1.0, 0},
    {ZO_DTYPE_F32, ZO_DTYPE_F32, 3, 4, 1.0, 0},
    {ZO_DTYPE_BF16, ZO_DTYPE_BF16, 2, 3, 0.0, 0},
    {ZO_DTYPE_F16, ZO_DTYPE_F16, 1, 3, 1.0, 0},
    {ZO_DTYPE_BF16, ZO_DTYPE_F32, 2, 2, 1.0, 0}, /* fp32 gradients of bf16 params */
    /* NVMe placement: the same reference, so bit-identical to host placement */
    {ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 4, 1.0, 1},
    {ZO_DTYPE_F32, ZO_DTYPE_F32, 2, 2, 1.0, 1},
};


START_TEST(test_optim_plain)
{
    /* on the host backend the fused kernel writes the device params itself;
     * each case runs that way and through the parameter buffer */
    for (int copy = 0; copy < 2; copy++) {
        zo__optim_force_copy = copy;
        run_plain(plain_cases[_i].pdt, plain_cases[_i].gdt, plain_cases[_i].accum, plain_cases[_i].steps,
                  plain_cases[_i].max_norm, plain_cases[_i].nvme);
    }
    zo__optim_force_copy = 0;
}
END_TEST

/* ---- fp16 overflow: skip, hysteresis, scale window ----------------------------------- */

START_TEST(test_optim_fp16_scaler)
{
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, ZO_DTYPE_F16, ZO_DTYPE_F16);
    e.cfg.initial_scale_power = 10;
    e.cfg.loss_scale_window = 2;
    e.cfg.hysteresis = 2;
    eng_create(&e);
    /* iter 0, 1 overflow (the second lowers the scale: hysteresis 2); 2 good;
     * 3 good: (3 - 1) % 2 == 0 doubles it again */
    const double want_scale[] = {1024, 1024, 512, 512, 1024};
    for (int s = 0; s < 4; s++) {
        double scale = zo_optim_loss_scale(e.o);
        ck_assert_msg(scale == want_scale[s], "iter %d scale %g", s, scale);
        for (int i = 0; i < NT; i++) {
            fill_grad(&e, i, s + 1, scale);
            if (s < 2 && i == 3)
                zo_test_put(e.dgrad[i], m.gdt, 77, s ? NAN : INFINITY);
            ref_grad(&r, i, e.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
        }
        zo_optim_step_result res = {.struct_size = sizeof(res)};
        ck_assert_int_eq(zo_optim_step(e.o, NULL, &res), 0);
        int applied = ref_step(&r, scale, 0, NULL);
        ck_assert_int_eq(applied, s >= 2);
        ck_assert_int_eq(res.skipped, s < 2);
        ck_assert_int_eq(res.loss_scale, scale);
        compare(&e, &r, "fp16 scaler");
    }
    ck_assert(zo_optim_loss_scale(e.o) == want_scale[4]);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
    ck_assert_int_eq(info.skipped_steps, 2);
    ck_assert_int_eq(info.step, 2);

    /* the scaler's state goes into a second engine (a state dict's way) and
     * both go on the same: scale, hysteresis, and when the scale grows */
    /* one more overflow first: hysteresis takes it (2 -> 1), so the next
     * one halves the scale, which a fresh scaler would not do */
    for (int i = 0; i < NT; i++) {
        fill_grad(&e, i, 9, zo_optim_loss_scale(e.o));
        if (i == 1)
            zo_test_put(e.dgrad[i], m.gdt, 3, INFINITY);
        ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
    }
    ck_assert_int_eq(zo_optim_step(e.o, NULL, NULL), 0);
    zo_optim_scaler_state st = {.struct_size = sizeof(st)};
    ck_assert_int_eq(zo_optim_get_scaler(e.o, &st), 0);
    ck_assert_int_eq(st.dynamic, 1);
    ck_assert_msg(st.scale == 1024 && st.cur_iter == 5 && st.last_overflow_iter == 4 && st.cur_hysteresis == 1,
                  "scale %g iter %lld last overflow %lld hysteresis %u", st.scale, (long long)st.cur_iter,
                  (long long)st.last_overflow_iter, st.cur_hysteresis);
    zo_optim *o2 = NULL;
    ck_assert_int_eq(zo_optim_create(&o2, &e.cfg), 0);
    ck_assert_int_eq(zo_optim_init_from_device(o2), 0); /* the same device params: only the scale is compared */
    ck_assert(zo_optim_loss_scale(o2) == 1024); /* the initial scale: equal by chance, the rest is not */
    zo_optim_scaler_state bad = st;
    bad.cur_hysteresis = 3; /* above the configured 2 */
    ck_assert_int_eq(zo_optim_set_scaler(o2, &bad), ZO_ECONFIG);
    bad = st;
    bad.scale = NAN;
    ck_assert_int_eq(zo_optim_set_scaler(o2, &bad), ZO_ECONFIG);
    bad = st;
    bad.last_overflow_iter = 9;
    ck_assert_int_eq(zo_optim_set_scaler(o2, &bad), ZO_ECONFIG);
    bad = st;
    bad.dynamic = 0;
    ck_assert_int_eq(zo_optim_set_scaler(o2, &bad), ZO_ECONFIG);
    bad.struct_size = 4;
    ck_assert_int_eq(zo_optim_set_scaler(o2, &bad), -EINVAL);
    ck_assert_int_eq(zo_optim_set_scaler(NULL, &st), -EINVAL);
    ck_assert_int_eq(zo_optim_set_scaler(o2, &st), 0);
    zo_optim_scaler_state st2 = {.struct_size = sizeof(st2)};
    ck_assert_int_eq(zo_optim_get_scaler(o2, &st2), 0);
    ck_assert(st2.scale == st.scale && st2.cur_iter == st.cur_iter &&
              st2.last_overflow_iter == st.last_overflow_iter && st2.cur_hysteresis == st.cur_hysteresis);
    /* an overflow in both: with the restored hysteresis (1 left) both
     * halve (a fresh scaler would count down and keep 1024), then the
     * good boundaries double alike */
    zo_optim *both[2] = {e.o, o2};
    for (int s = 0; s < 3; s++) {
        double sc[2];
        for (int k = 0; k < 2; k++) {
            sc[k] = zo_optim_loss_scale(both[k]);
            for (int i = 0; i < NT; i++) {
                fill_grad(&e, i, 10 + s, sc[k]);
                if (s == 0 && i == 2)
                    zo_test_put(e.dgrad[i], m.gdt, 1, INFINITY);
                ck_assert_int_eq(zo_optim_grad(both[k], (unsigned)i, e.dgrad[i], NULL), 0);
            }
            if (s == 0 && k == 1) /* mid-window: refused, the gradients carry the old scale */
                ck_assert_int_eq(zo_optim_set_scaler(o2, &st), ZO_ESTATE);
            ck_assert_int_eq(zo_optim_step(both[k], NULL, NULL), 0);
        }
        ck_assert_msg(sc[0] == sc[1], "boundary %d: scales %g and %g", s, sc[0], sc[1]);
        if (s == 1)
            ck_assert_msg(sc[1] == 512, "after the overflow: %g (a fresh scaler keeps 1024)", sc[1]);
    }
    ck_assert(zo_optim_loss_scale(e.o) == zo_optim_loss_scale(o2));
    zo_optim_destroy(&o2);
    eng_free(&e);
    ref_free(&r);
}
END_TEST

/* bf16: inf/NaN is an error (default) or a counted skip; never in the masters */
START_TEST(test_optim_nonfinite_policy)
{
    for (int policy = 0; policy < 2; policy++) {
        model m;
        ref r;
        eng e;
        setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
        e.cfg.nonfinite = policy ? ZO_OPTIM_NONFINITE_SKIP : ZO_OPTIM_NONFINITE_ERROR;
        eng_create(&e);
        for (int s = 1; s <= 3; s++) {
            for (int i = 0; i < NT; i++) {
                fill_grad(&e, i, s, 1.0);
                if (s == 2 && i == 4)
                    zo_test_put(e.dgrad[i], m.gdt, 5, NAN);
                ref_grad(&r, i, e.dgrad[i]);
                ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
            }
            zo_optim_step_result res = {.struct_size = sizeof(res)};
            int rc = zo_optim_step(e.o, NULL, &res);
            int applied = ref_step(&r, 1.0, 0, NULL);
            ck_assert_int_eq(applied, s != 2);
            if (s == 2) {
                ck_assert_int_eq(rc, policy ? 0 : ZO_ENONFINITE);
                ck_assert_int_eq(res.skipped, 1);
                ck_assert_int_eq(res.nonfinite, 1);
            } else {
                ck_assert_int_eq(rc, 0);
            }
            compare(&e, &r, "nonfinite");
        }
        eng_free(&e);
        ref_free(&r);
    }
}
END_TEST

/* ---- DPU --------------------------------------------------------------------------------- */

/* The forward of step k sees the result of step k-1 for k <= K+1, of step
 * k-2 after; the engine's final state equals that schedule run in memory. */
START_TEST(test_optim_dpu)
{
    const int K = 2, N = 7;
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    ref r;
    ref_init(&r, &m);
    size_t pb = m.total * 2;
    void **hist = calloc((size_t)N + 1, sizeof(void *));
    hist[0] = malloc(pb);
    memcpy(hist[0], r.out, pb);
    eng e;
    eng_config(&e, &m);
    e.cfg.dpu = 1;
    e.cfg.dpu_warmup_steps = (unsigned)K;
    /* _i 1: the speculative step (started at the step call under DPU);
     * without clipping it is bit-identical to two-pass */
    double max_norm = _i ? 0.0 : 1.0;
    e.cfg.max_grad_norm = max_norm;
    e.cfg.clip_mode = _i ? ZO_OPTIM_CLIP_SPECULATIVE : ZO_OPTIM_CLIP_TWO_PASS;
    eng_create(&e);
    int efd = zo_optim_eventfd(e.o);
    ck_assert(efd >= 0);
    void *seen = malloc(pb);
    for (int k = 1; k <= N; k++) {
        /* what the device holds now is what the forward of step k sees */
        int want = k <= K + 1 ? k - 1 : k - 2;
        for (int i = 0; i < NT; i++)
            memcpy((char *)seen + m.off[i] * 2, e.dparam[i], m.numel[i] * 2);
        ck_assert_msg(memcmp(seen, hist[want], pb) == 0, "forward %d does not see step %d's params", k, want);
        ck_assert_int_eq(zo_optim_grads_done(e.o), 0); /* the previous copies read dgrad */
        for (int i = NT - 1; i >= 0; i--) {
            fill_grad(&e, i, k, 1.0);
            ref_grad(&r, i, e.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
        }
        /* an LR schedule: set while the previous update may still run; it
         * applies to the update this step call starts */
        m.hp[0].lr = 1e-2 / k;
        ck_assert_int_eq(zo_optim_set_lr(e.o, 0, m.hp[0].lr), 0);
        int rc = zo_optim_step_async(e.o, NULL);
        ck_assert_msg(rc == 0, "step_async %d: %s (%s)", k, zo_strerror(rc), zo_optim_errmsg(e.o));
        ck_assert_int_eq(ref_step(&r, 1.0, max_norm, NULL), 1);
        hist[k] = malloc(pb);
        memcpy(hist[k], r.out, pb);
        /* warm-up: no delay, step_async itself landed the update */
        ck_assert_int_eq(zo_optim_params_current(e.o), k <= K);
    }
    /* the eventfd says the last update finished */
    struct pollfd pfd = {.fd = efd, .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
    zo_optim_step_result res = {.struct_size = sizeof(res)};
    ck_assert_int_eq(zo_optim_wait(e.o, &res), 0);
    ck_assert_int_eq(res.step, N);
    ck_assert_int_eq(zo_optim_params_current(e.o), 1);
    ck_assert_int_eq(zo_optim_poll(e.o), 0);
    compare(&e, &r, "dpu");
    zo_optim_info info = {.struct_size = sizeof(info)};
    zo_optim_get_info(e.o, &info);
    ck_assert_int_eq(info.dpu_active, 1);
    ck_assert_uint_eq(info.updates_done, N);
    /* the update's own time is part of the span from its step call to its
     * copy-back (which under DPU waits for the next step call) */
    zo_optim_timeline tl = {.struct_size = sizeof(tl)};
    ck_assert_int_eq(zo_optim_get_timeline(e.o, &tl), 0);
    ck_assert_msg(tl.update_ns > 0 && tl.update_ns <= tl.total_ns, "update_ns %llu, total_ns %llu",
                  (unsigned long long)tl.update_ns, (unsigned long long)tl.total_ns);
    eng_free(&e);
    ref_free(&r);
    for (int k = 0; k <= N; k++)
        free(hist[k]);
    free(hist);
    free(seen);
}
END_TEST

/* Double-buffered device params under DPU: the same schedule as above (the
 * forward of step k sees step k-1's params for k <= K+1, step k-2's after,
 * and after a wait the latest), read at the pointers zo_optim_param_device()
 * gives after each step call; bit-identical to the in-memory delayed run.
 * Then save, go on, and resume from the checkpoint in a new engine: the
 * same states. _i: 0 two-pass with clipping, 1 speculative, 2 two-pass
 * through the parameter buffer and copies (the path a GPU takes). */
typedef struct dbl_run {
    eng *e;
    ref *r;        /* NULL: the reference was stepped by an earlier run */
    void **hist;   /* [k]: the reference params after step k (NULL: not checked) */
    double max_norm;
    void *dev[NT]; /* where the next forward reads */
    int slot;
} dbl_run;

static void dbl_where(dbl_run *d)
{
    for (int i = 0; i < NT; i++) {
        zo_event *ev = (zo_event *)1;
        int slot = zo_optim_param_device(d->e->o, (unsigned)i, &d->dev[i], &ev);
        ck_assert_msg(slot == 0 || slot == 1, "param_device: %d", slot);
        if (i == 0)
            d->slot = slot;
        ck_assert_int_eq(slot, d->slot); /* one switch for every tensor */
        ck_assert(slot == 1 ? d->dev[i] != d->e->dparam[i] : d->dev[i] == d->e->dparam[i]);
        if (ev)
            ck_assert_int_eq(zo_event_sync(ev), 0);
    }
}

/* steps from..to; `want(k)` = the step whose params the forward of k sees */
static void dbl_steps(dbl_run *d, int from, int to, int K, int after_wait)
{
    eng *e = d->e;
    model *m = e->m;
    size_t pb = m->total * 2;
    void *seen = malloc(pb);
    for (int k = from; k <= to; k++) {
        dbl_where(d);
        if (d->hist) {
            int want = after_wait ? (k == from ? k - 1 : k - 2)
                                  : (k <= K + 1 ? k - 1 : k - 2);
            for (int i = 0; i < NT; i++)
                memcpy((char *)seen + m->off[i] * 2, d->dev[i], m->numel[i] * 2);
            ck_assert_msg(memcmp(seen, d->hist[want], pb) == 0, "forward %d does not see step %d's params", k, want);
        }
        ck_assert_int_eq(zo_optim_grads_done(e->o), 0);
        for (int i = NT - 1; i >= 0; i--) {
            fill_grad_from(e, i, k, 1.0, d->dev[i]);
            if (d->r)
                ref_grad(d->r, i, e->dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(e->o, (unsigned)i, e->dgrad[i], NULL), 0);
        }
        int rc = zo_optim_step_async(e->o, NULL);
        ck_assert_msg(rc == 0, "step_async %d: %s (%s)", k, zo_strerror(rc), zo_optim_errmsg(e->o));
        if (d->r) {
            ck_assert_int_eq(ref_step(d->r, 1.0, d->max_norm, NULL), 1);
            if (d->hist) {
                d->hist[k] = malloc(pb);
                memcpy(d->hist[k], d->r->out, pb);
            }
        }
        if (d->r && d->hist && !after_wait && k > K) {
            /* while update k runs: the host copy of the latest finished update
             * (k - 1, or k if it just finished), read back beside the writes */
            const void *hb = NULL;
            ck_assert_int_eq(zo_optim_param_buffer(e->o, 3, &hb), 0);
            const char *want1 = (char *)d->hist[k - 1] + m->off[3] * 2, *want2 = (char *)d->hist[k] + m->off[3] * 2;
            ck_assert_msg(memcmp(hb, want1, m->numel[3] * 2) == 0 || memcmp(hb, want2, m->numel[3] * 2) == 0,
                          "param_buffer during update %d", k);
        }
        ck_assert_int_eq(zo_optim_params_current(e->o), !after_wait && k <= K);
    }
    free(seen);
}

START_TEST(test_optim_dpu_double)
{
    const int K = 2, N = 7, M = 3;
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    zo__optim_force_copy = _i == 2;
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    ref r;
    ref_init(&r, &m);
    size_t pb = m.total * 2;
    void **hist = calloc((size_t)(N + M) + 1, sizeof(void *));
    hist[0] = malloc(pb);
    memcpy(hist[0], r.out, pb);
    eng e;
    eng_config(&e, &m);
    e.cfg.dpu = 1;
    e.cfg.dpu_double_buffer = 1;
    e.cfg.dpu_warmup_steps = (unsigned)K;
    dbl_run d = {.e = &e, .r = &r, .hist = hist, .max_norm = _i == 1 ? 0.0 : 1.0};
    e.cfg.max_grad_norm = d.max_norm;
    e.cfg.clip_mode = _i == 1 ? ZO_OPTIM_CLIP_SPECULATIVE : ZO_OPTIM_CLIP_TWO_PASS;
    eng_create(&e);
    dbl_steps(&d, 1, N, K, 0);
    /* wait ends the delay: the buffer the last update wrote is current */
    zo_optim_step_result res = {.struct_size = sizeof(res)};
    ck_assert_int_eq(zo_optim_wait(e.o, &res), 0);
    ck_assert_int_eq(res.step, N);
    ck_assert_int_eq(zo_optim_params_current(e.o), 1);
    dbl_where(&d);
    ck_assert_int_eq(d.slot, N % 2); /* every applied update switched buffers */
    compare_dev(&e, &r, "dpu double", d.dev);
    /* the engine's host copy of the params (read back from the buffer the
     * kernel wrote, on the host backend) is the same update's */
    for (int i = 0; i < NT; i++) {
        const void *hb = NULL;
        ck_assert_int_eq(zo_optim_param_buffer(e.o, (unsigned)i, &hb), 0);
        ck_assert_msg(memcmp(hb, (char *)hist[N] + m.off[i] * 2, m.numel[i] * 2) == 0, "param_buffer %d", i);
    }
    /* the update copied or wrote its params as it went: nothing is left for a step call to copy */
    zo_optim_timeline tl = {.struct_size = sizeof(tl)};
    ck_assert_int_eq(zo_optim_get_timeline(e.o, &tl), 0);
    ck_assert_uint_eq(tl.h2d_bytes, m.total * 2);
    /* save, then the uninterrupted run goes on */
    ck_assert_int_eq(zo_optim_save(e.o, dir, "dbl", 0, NULL), 0);
    dbl_steps(&d, N + 1, N + M, K, 1);
    ck_assert_int_eq(zo_optim_wait(e.o, NULL), 0);
    dbl_where(&d);
    compare_dev(&e, &r, "dpu double, uninterrupted", d.dev);
    /* resume in a new engine, device params scrambled: the same states and params */
    zo_optim_destroy(&e.o);
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    for (int i = 0; i < NT; i++)
        memset(e.dparam[i], 0x5a, m.numel[i] * 2);
    ck_assert_int_eq(zo_optim_load(e.o, dir, "dbl", NULL, 0), 0);
    dbl_run d2 = {.e = &e, .hist = hist, .max_norm = d.max_norm};
    dbl_steps(&d2, N + 1, N + M, K, 1);
    ck_assert_int_eq(zo_optim_wait(e.o, NULL), 0);
    dbl_where(&d2);
    compare_dev(&e, &r, "dpu double, resumed", d2.dev);
    eng_free(&e);
    ref_free(&r);
    for (int k = 0; k <= N + M; k++)
        free(hist[k]);
    free(hist);
    zo__optim_force_copy = 0;
    zo_test_rmtree(dir);
}
END_TEST

/* ---- save / load ------------------------------------------------------------------------- */

/* the reference alone through steps from..to of train() (the gradients it
 * would have seen, from the params the reference holds) */
static void train_ref_only(eng *e, ref *r, int from, int to)
{
    model *m = e->m;
    size_t ges = zo_dtype_size(m->gdt);
    for (int s = from; s <= to; s++) {
        for (int i = 0; i < NT; i++) {
            void *g = malloc(m->numel[i] * ges);
            for (uint64_t k = 0; k < m->numel[i]; k++)
                zo_test_put(g, m->gdt, k, grad_value(m->off[i] + k, s, zo_test_get(r->out, m->pdt, m->off[i] + k), 1.0));
            ref_grad(r, i, g);
            free(g);
        }
        ref_step(r, 1.0, 1.0, NULL);
    }
}

static void train(eng *e, ref *r, int from, int to)
{
    for (int s = from; s <= to; s++) {
        for (int i = 0; i < NT; i++) {
            fill_grad(e, i, s, 1.0);
            if (r)
                ref_grad(r, i, e->dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(e->o, (unsigned)i, e->dgrad[i], NULL), 0);
        }
        ck_assert_int_eq(zo_optim_step(e->o, NULL, NULL), 0);
        if (r)
            ref_step(r, 1.0, 1.0, NULL);
    }
}

/* A checkpoint directory and a bf16 engine with the clipping train()'s
 * reference applies, created and initialised. */
typedef struct ckpt_run {
    char dir[256];
    model m;
    ref r;
    eng e;
} ckpt_run;

/* ... configured only (params and gradients in dtype) */
static void ckpt_run_config(ckpt_run *k, zo_dtype dtype)
{
    zo_test_mkdtemp(k->dir, sizeof(k->dir));
    setup(&k->m, &k->r, &k->e, dtype, dtype);
    k->e.cfg.max_grad_norm = 1.0;
}

static void ckpt_run_setup(ckpt_run *k)
{
    ckpt_run_config(k, ZO_DTYPE_BF16);
    eng_create(&k->e);
}

static void ckpt_run_free(ckpt_run *k)
{
    eng_free(&k->e);
    ref_free(&k->r);
    zo_test_rmtree(k->dir);
}

START_TEST(test_optim_save_load)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e.cfg.max_grad_norm = 1.0;
    eng_create(&e);
    train(&e, &r, 1, 3);
    /* mid-accumulation saves are refused */
    fill_grad(&e, 0, 9, 1.0);
    ck_assert_int_eq(zo_optim_grad(e.o, 0, e.dgrad[0], NULL), 0);
    ck_assert_int_eq(zo_optim_save(e.o, dir, "bad", 0, NULL), ZO_ESTATE);
    zo_optim_destroy(&e.o);
    /* a fresh engine at step 3 again: the reference has 3 steps too */
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    /* masters from the reference by import (the host-buffer init path) */
    for (int i = 0; i < NT; i++) {
        for (int k = 0; k < 3; k++) {
            const float *src = (k == 0 ? r.master : k == 1 ? r.m1 : r.v) + m.off[i];
            ck_assert_int_eq(zo_optim_state_import(e.o, (unsigned)i, (zo_optim_state)k, src, ZO_DTYPE_F32, 0,
                                                   m.numel[i]), 0);
        }
    }
    ck_assert_int_eq(zo_optim_push_params(e.o), 0);
    compare(&e, &r, "imported");
    /* the engine's step count is 0 here (save/load carries it): a real run */
    zo_optim_destroy(&e.o);
    for (int i = 0; i < NT; i++)
        for (uint64_t k = 0; k < m.numel[i]; k++)
            zo_test_put(e.dparam[i], m.pdt, k, init_param(m.off[i] + k));
    eng_create(&e);
    ref_free(&r);
    ref_init(&r, &m);
    train(&e, &r, 1, 3);
    ck_assert_int_eq(zo_optim_save(e.o, dir, "step-3", 2, "{\"epoch\": 7, \"note\": \"x}\"}"), 0);
    train(&e, &r, 4, 6); /* the uninterrupted run */
    compare(&e, &r, "uninterrupted");
    /* resume in a new engine: device params scrambled first, load restores them */
    zo_optim_destroy(&e.o);
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    for (int i = 0; i < NT; i++)
        memset(e.dparam[i], 0x5a, m.numel[i] * 2);
    char uj[128];
    int rc = zo_optim_load(e.o, dir, NULL, uj, sizeof(uj));
    ck_assert_msg(rc == 0, "load: %s (%s)", zo_strerror(rc), zo_optim_errmsg(e.o));
    /* the checkpoint stores the JSON value, not its spelling: compare without blanks */
    char *w = uj;
    for (char *q = uj; *q; q++)
        if (*q != ' ')
            *w++ = *q;
    *w = '\0';
    ck_assert_str_eq(uj, "{\"epoch\":7,\"note\":\"x}\"}");
    zo_optim_info info = {.struct_size = sizeof(info)};
    zo_optim_get_info(e.o, &info);
    ck_assert_int_eq(info.step, 3);
    train(&e, NULL, 4, 6);
    compare(&e, &r, "resumed");
    /* a different model refuses the checkpoint before touching anything */
    zo_optim_destroy(&e.o);
    e.grp[1].numel = g0_numel; /* other sizes */
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    ck_assert_int_eq(zo_optim_load(e.o, dir, "step-3", NULL, 0), ZO_EFORMAT);
    zo_optim_destroy(&e.o);
    e.grp[1].numel = g1_numel;
    eng_free(&e);
    ref_free(&r);
    zo_test_rmtree(dir);
}
END_TEST

/* ZO_OPTIM_NO_GRAD_SKIP: a tensor without a gradient in a window is left
 * alone (master, states, device params) and not counted; the others are
 * updated with their own counts. Reference: the kernels run tensor by tensor
 * with each tensor's own count. The counts survive save and load; a ZERO
 * engine refuses such a checkpoint and per-tensor counts. _i: 0 direct (the
 * kernel writes the params), 1 DPU (a pair of parameter buffers: the one an
 * update writes holds older params), 2 DPU with double-buffered device
 * params (likewise), 3 through the parameter buffer and copies, 4 the
 * speculative step (sub-groups updated as their gradients complete). */
static const unsigned skip_masks[] = {0x3f, 0x2d, 0x02, 0x3f}; /* tensors with a gradient, per step */

static void skip_steps(eng *e, ref *r, int64_t *ts, int from, int to)
{
    model *m = e->m;
    for (int k = from; k <= to; k++) {
        unsigned mask = skip_masks[k - 1];
        for (int i = 0; i < NT; i++) {
            if (!(mask >> i & 1))
                continue;
            for (uint64_t j = 0; j < m->numel[i]; j++)
                zo_test_put(e->dgrad[i], m->gdt, j, grad_value(m->off[i] + j, k, 0.0f, 1.0));
            ck_assert_int_eq(zo_optim_grad(e->o, (unsigned)i, e->dgrad[i], NULL), 0);
            ts[i]++;
            if (!r)
                continue;
            zo_cpuadam_hparams hp = m->hp[i < NT0 ? 0 : 1];
            hp.step = ts[i];
            ref_kernel(r, &hp, m->off[i], m->numel[i], e->dgrad[i], m->gdt);
        }
        if (k == 2) { /* a norm asked for first does not give the others a gradient */
            double sumsq;
            ck_assert_int_eq(zo_optim_grad_norm_partial(e->o, &sumsq, NULL), 0);
        }
        int rc = zo_optim_step(e->o, NULL, NULL);
        ck_assert_msg(rc == 0, "step %d: %s (%s)", k, zo_strerror(rc), zo_optim_errmsg(e->o));
        for (int i = 0; i < NT; i++) {
            int64_t got = -1;
            ck_assert_int_eq(zo_optim_tensor_step(e->o, (unsigned)i, &got), 0);
            ck_assert_msg(got == ts[i], "step %d: tensor %d counts %lld, want %lld", k, i, (long long)got,
                          (long long)ts[i]);
        }
        if (!r)
            continue;
        void *dev[NT];
        for (int i = 0; i < NT; i++)
            ck_assert_int_ge(zo_optim_param_device(e->o, (unsigned)i, &dev[i], NULL), 0);
        char when[32];
        snprintf(when, sizeof(when), "skip step %d", k);
        compare_dev(e, r, when, dev);
    }
}

START_TEST(test_optim_no_grad_skip)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    zo__optim_force_copy = _i == 3;
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e.cfg.no_grad = ZO_OPTIM_NO_GRAD_SKIP;
    e.cfg.dpu = _i == 1 || _i == 2;
    e.cfg.dpu_warmup_steps = 0;
    e.cfg.dpu_double_buffer = _i == 2;
    e.cfg.clip_mode = _i == 4 ? ZO_OPTIM_CLIP_SPECULATIVE : ZO_OPTIM_CLIP_TWO_PASS;
    eng_create(&e);
    int64_t ts[NT] = {0}, ts_saved[NT];
    skip_steps(&e, &r, ts, 1, 3);
    ck_assert_int_eq(zo_optim_save(e.o, dir, "skip", 0, NULL), 0);
    memcpy(ts_saved, ts, sizeof(ts));
    skip_steps(&e, &r, ts, 4, 4);
    /* resumed in a new engine: the same counts, the same step 4 */
    zo_optim_destroy(&e.o);
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    ck_assert_int_eq(zo_optim_load(e.o, dir, "skip", NULL, 0), 0);
    for (int i = 0; i < NT; i++) {
        int64_t got = -1;
        ck_assert_int_eq(zo_optim_tensor_step(e.o, (unsigned)i, &got), 0);
        ck_assert_int_eq(got, ts_saved[i]);
    }
    skip_steps(&e, NULL, ts_saved, 4, 4);
    void *dev[NT];
    for (int i = 0; i < NT; i++)
        ck_assert_int_ge(zo_optim_param_device(e.o, (unsigned)i, &dev[i], NULL), 0);
    compare_dev(&e, &r, "skip, resumed", dev);
    /* per-tensor counts set by hand, and the engine-wide set */
    ck_assert_int_eq(zo_optim_set_tensor_step(e.o, 1, 9), 0);
    int64_t got = -1;
    ck_assert_int_eq(zo_optim_tensor_step(e.o, 1, &got), 0);
    ck_assert_int_eq(got, 9);
    ck_assert_int_eq(zo_optim_set_tensor_step(e.o, NT, 9), -EINVAL);
    ck_assert_int_eq(zo_optim_set_tensor_step(e.o, 0, -1), -EINVAL);
    ck_assert_int_eq(zo_optim_set_step(e.o, 4), 0);
    ck_assert_int_eq(zo_optim_tensor_step(e.o, 1, &got), 0);
    ck_assert_int_eq(got, 4);
    /* an engine with one count refuses the checkpoint (counts differ) and per-tensor counts */
    zo_optim_destroy(&e.o);
    e.cfg.no_grad = ZO_OPTIM_NO_GRAD_ZERO;
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    ck_assert_int_eq(zo_optim_load(e.o, dir, "skip", NULL, 0), ZO_EFORMAT);
    ck_assert_msg(strstr(zo_optim_errmsg(e.o), "own update count"), "%s", zo_optim_errmsg(e.o));
    ck_assert_int_eq(zo_optim_set_tensor_step(e.o, 0, 3), ZO_ECONFIG);
    ck_assert_int_eq(zo_optim_set_tensor_step(e.o, 0, 0), 0);
    zo_optim_destroy(&e.o);
    /* a caller built before no_grad existed: its shorter config is taken, with ZERO */
    e.cfg.no_grad = ZO_OPTIM_NO_GRAD_SKIP;
    e.cfg.struct_size = offsetof(zo_optim_config, no_grad);
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    ck_assert_int_eq(zo_optim_set_tensor_step(e.o, 0, 3), ZO_ECONFIG);
    zo_optim_destroy(&e.o);
    e.cfg.struct_size = sizeof(e.cfg);
    e.cfg.no_grad = (zo_optim_no_grad)2;
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), ZO_ECONFIG);
    eng_free(&e);
    ref_free(&r);
    zo__optim_force_copy = 0;
    zo_test_rmtree(dir);
}
END_TEST

/* export / import in bf16 and f16; host gradient intake; external norm */
START_TEST(test_optim_export_import)
{
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e.cfg.max_grad_norm = 1.0;
    eng_create(&e);
    /* host intake, and the partial norm fed back as the "global" one */
    for (int s = 1; s <= 2; s++) {
        for (int i = 0; i < NT; i++) {
            fill_grad(&e, i, s, 1.0);
            ref_grad(&r, i, e.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad_host(e.o, (unsigned)i, e.dgrad[i], ZO_DTYPE_BF16), 0);
        }
        zo_optim_step_opts so;
        zo_optim_step_opts_default(&so);
        uint64_t nf = 9;
        ck_assert_int_eq(zo_optim_grad_norm_partial(e.o, &so.global_sumsq, &nf), 0);
        ck_assert_int_eq(nf, 0);
        so.global_nonfinite = 0;
        ck_assert_int_eq(zo_optim_step(e.o, &so, NULL), 0);
        ref_step(&r, 1.0, 1.0, NULL);
    }
    compare(&e, &r, "host intake");
    /* the update count a framework restores from its own state_dict: the next
     * update's bias correction follows it, exactly as the reference's */
    zo_optim_info inf = {.struct_size = sizeof(inf)};
    ck_assert_int_eq(zo_optim_set_step(e.o, -1), -EINVAL);
    ck_assert_int_eq(zo_optim_set_step(e.o, 7), 0);
    ck_assert_int_eq(zo_optim_get_info(e.o, &inf), 0);
    ck_assert_int_eq(inf.step, 7);
    r.step = 7;
    for (int i = 0; i < NT; i++) {
        fill_grad(&e, i, 3, 1.0);
        ref_grad(&r, i, e.dgrad[i]);
        ck_assert_int_eq(zo_optim_grad_host(e.o, (unsigned)i, e.dgrad[i], ZO_DTYPE_BF16), 0);
    }
    ck_assert_int_eq(zo_optim_step_async(e.o, NULL), 0);
    ck_assert_int_eq(zo_optim_set_step(e.o, 1), ZO_ESTATE); /* not between updates */
    ck_assert_int_eq(zo_optim_wait(e.o, NULL), 0);
    ref_step(&r, 1.0, 1.0, NULL);
    compare(&e, &r, "after set_step(7)");
    ck_assert_int_eq(zo_optim_get_info(e.o, &inf), 0);
    ck_assert_int_eq(inf.step, 8);
    unsigned idx;
    ck_assert_int_eq(zo_optim_tensor_index(e.o, "w2", &idx), 0);
    ck_assert_int_eq(idx, 3);
    ck_assert_int_eq(zo_optim_tensor_index(e.o, "nope", &idx), -ENOENT);
    uint64_t n = m.numel[3];
    uint16_t *b = malloc(n * 2);
    ck_assert_int_eq(zo_optim_state_export(e.o, 3, ZO_OPTIM_STATE_EXP_AVG, b, ZO_DTYPE_BF16, 0, n), 0);
    for (uint64_t j = 0; j < n; j++)
        ZO_EXPECT(b[j] == zo_f32_to_bf16(r.m1[m.off[3] + j]), "bf16 export elem %llu", (unsigned long long)j);
    ck_assert_int_eq(zo_optim_state_export(e.o, 3, ZO_OPTIM_STATE_MASTER, b, ZO_DTYPE_F16, 100, 5), 0);
    for (int j = 0; j < 5; j++)
        ck_assert_uint_eq(b[j], zo_f32_to_f16(r.master[m.off[3] + 100 + j]));
    /* import a slice of masters: the param buffer follows */
    float vals[3] = {1.5f, -2.25f, 0.125f};
    ck_assert_int_eq(zo_optim_state_import(e.o, 1, ZO_OPTIM_STATE_MASTER, vals, ZO_DTYPE_F32, 69997, 3), 0);
    const void *pbuf;
    ck_assert_int_eq(zo_optim_param_buffer(e.o, 1, &pbuf), 0);
    for (int j = 0; j < 3; j++)
        ck_assert_uint_eq(((const uint16_t *)pbuf)[69997 + j], zo_f32_to_bf16(vals[j]));
    /* bad ranges and states */
    ck_assert_int_eq(zo_optim_state_export(e.o, 1, ZO_OPTIM_STATE_MASTER, b, ZO_DTYPE_F32, 69998, 3), -EINVAL);
    ck_assert_int_eq(zo_optim_state_export(e.o, NT, ZO_OPTIM_STATE_MASTER, b, ZO_DTYPE_F32, 0, 1), -EINVAL);
    ck_assert_int_eq(zo_optim_state_export(e.o, 1, ZO_OPTIM_STATE_MASTER, b, ZO_DTYPE_U8, 0, 1), ZO_ENOTSUP);
    free(b);
    eng_free(&e);
    ref_free(&r);
}
END_TEST

/* ---- speculative step ------------------------------------------------------------------- */

START_TEST(test_optim_speculative)
{
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    /* Adam's L2 term feeds the (rollback-perturbed) master into m and v;
     * without it the state bounds below are the rollback's own */
    m.hp[1].weight_decay = 0;
    /* two engines side by side, fed the same gradients */
    eng a, b;
    eng_config(&a, &m);
    eng_config(&b, &m);
    a.cfg.max_grad_norm = b.cfg.max_grad_norm = 1.0;
    b.cfg.clip_mode = ZO_OPTIM_CLIP_SPECULATIVE;
    eng_create(&a);
    eng_create(&b);
    float *xa = malloc(m.total * 4), *xb = malloc(m.total * 4);
    int nrb = 0;
    for (int s = 1; s <= 5; s++) {
        /* before the first gradient: the eager update starts with it */
        zo_optim_info info0 = {.struct_size = sizeof(info0)};
        zo_optim_get_info(b.o, &info0);
        for (int i = 0; i < NT; i++) {
            fill_grad(&a, i, s, 1.0);
            memcpy(b.dgrad[i], a.dgrad[i], m.numel[i] * 2);
            if (s == 5 && i == NT - 1) {
                /* in the sub-group walked last: the others are rolled back (the
                 * eager walk follows the order the gradients completed in the
                 * previous step: this one, handed over last, completes last) */
                zo_test_put(a.dgrad[i], m.gdt, 3, INFINITY);
                zo_test_put(b.dgrad[i], m.gdt, 3, INFINITY);
            }
            ck_assert_int_eq(zo_optim_grad(a.o, (unsigned)i, a.dgrad[i], NULL), 0);
            ck_assert_int_eq(zo_optim_grad(b.o, (unsigned)i, b.dgrad[i], NULL), 0);
        }
        /* the speculative engine updates every sub-group before the step call
         * (all gradients are in): wait for it to show */
        zo_optim_info info1 = {.struct_size = sizeof(info1)};
        ck_assert_int_eq(zo_optim_grads_done(b.o), 0);
        for (int t = 0; t < 10000 && s != 5; t++) {
            zo_optim_get_info(b.o, &info1);
            if (info1.eager_subgroups == info0.eager_subgroups + info1.nsubgroups)
                break;
            usleep(1000);
        }
        zo_optim_get_info(b.o, &info1);
        if (s != 5)
            ck_assert_uint_eq(info1.eager_subgroups, info0.eager_subgroups + info1.nsubgroups);
        /* a second gradient for a tensor in the last micro-step is refused */
        ck_assert_int_eq(zo_optim_grad(b.o, 2, b.dgrad[2], NULL), ZO_ESTATE);
        /* and so is a save or a wait while the window is open */
        ck_assert_int_eq(zo_optim_wait(b.o, NULL), ZO_ESTATE);
        zo_optim_step_result ra = {.struct_size = sizeof(ra)}, rb = {.struct_size = sizeof(rb)};
        int rca = zo_optim_step(a.o, NULL, &ra), rcb = zo_optim_step(b.o, NULL, &rb);
        ck_assert_int_eq(rca, rcb);
        ck_assert_int_eq(ra.clipped, rb.clipped);
        ck_assert_int_eq(ra.skipped, rb.skipped);
        ck_assert(ra.grad_norm == rb.grad_norm);
        /* odd steps clip (rolled back and redone), even ones do not; step 5 overflows */
        ck_assert_int_eq(rb.rolled_back, (s % 2) == 1);
        ck_assert_int_eq(rb.skipped, s == 5);
        nrb += rb.rolled_back;
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < NT; i++) {
                ck_assert_int_eq(zo_optim_state_export(a.o, (unsigned)i, (zo_optim_state)k, xa + m.off[i],
                                                       ZO_DTYPE_F32, 0, m.numel[i]), 0);
                ck_assert_int_eq(zo_optim_state_export(b.o, (unsigned)i, (zo_optim_state)k, xb + m.off[i],
                                                       ZO_DTYPE_F32, 0, m.numel[i]), 0);
            }
            /* after a rollback: the states come back within a few ulps of
             * max(state, (1-beta) g) / beta, so m and v stay close in absolute
             * terms; a master can move by up to about one update (lr) per
             * rollback where v came back with a large relative error (tiny
             * gradients, early steps: cpuadam.h) */
            double maxabs = 0;
            for (uint64_t j = 0; j < m.total; j++)
                maxabs = fmax(maxabs, fabs((double)xa[j]));
            for (uint64_t j = 0; j < m.total; j++) {
                double d = fabs((double)xa[j] - (double)xb[j]);
                double tol = 1e-5 * fabs((double)xa[j]) + (k == 0 ? 2 * 1e-2 * nrb : 1e-5 * maxabs);
                ZO_EXPECT(d <= tol, "step %d state %d elem %llu: %a vs %a", s, k, (unsigned long long)j,
                          (double)xa[j], (double)xb[j]);
            }
        }
    }
    /* with no clipping and no overflow the two modes agree bit for bit */
    eng c, d;
    eng_config(&c, &m);
    eng_config(&d, &m);
    d.cfg.clip_mode = ZO_OPTIM_CLIP_SPECULATIVE;
    eng_create(&c);
    eng_create(&d);
    ref r;
    ref_init(&r, &m);
    for (int s = 1; s <= 3; s++) {
        for (int i = 0; i < NT; i++) {
            fill_grad(&c, i, s, 1.0);
            memcpy(d.dgrad[i], c.dgrad[i], m.numel[i] * 2);
            ref_grad(&r, i, c.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(c.o, (unsigned)i, c.dgrad[i], NULL), 0);
            ck_assert_int_eq(zo_optim_grad(d.o, (unsigned)i, d.dgrad[i], NULL), 0);
        }
        zo_optim_step_result rd = {.struct_size = sizeof(rd)};
        ck_assert_int_eq(zo_optim_step(c.o, NULL, NULL), 0);
        ck_assert_int_eq(zo_optim_step(d.o, NULL, &rd), 0);
        ck_assert_int_eq(rd.rolled_back, 0);
        ref_step(&r, 1.0, 0, NULL);
    }
    compare(&c, &r, "two-pass");
    compare(&d, &r, "speculative");
    free(xa);
    free(xb);
    ref_free(&r);
    eng_free(&a);
    eng_free(&b);
    eng_free(&c);
    eng_free(&d);
}
END_TEST

/* bf16 optimizer states in one group: host and NVMe placement agree bit for
 * bit (NVMe walks fp32 masters beside bf16 states through the pool) */
START_TEST(test_optim_bf16_states)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    eng a, b;
    eng_config(&a, &m);
    eng_config(&b, &m);
    a.grp[1].state_dtype = b.grp[1].state_dtype = ZO_DTYPE_BF16;
    a.cfg.max_grad_norm = b.cfg.max_grad_norm = 1.0;
    b.cfg.placement = ZO_OPTIM_PLACE_NVME;
    b.cfg.nvme_path = dir;
    eng_create(&a);
    eng_create(&b);
    for (int s = 1; s <= 3; s++) {
        for (int i = 0; i < NT; i++) {
            fill_grad(&a, i, s, 1.0);
            memcpy(b.dgrad[i], a.dgrad[i], m.numel[i] * 2);
            ck_assert_int_eq(zo_optim_grad(a.o, (unsigned)i, a.dgrad[i], NULL), 0);
            ck_assert_int_eq(zo_optim_grad(b.o, (unsigned)i, b.dgrad[i], NULL), 0);
        }
        ck_assert_int_eq(zo_optim_step(a.o, NULL, NULL), 0);
        ck_assert_int_eq(zo_optim_step(b.o, NULL, NULL), 0);
    }
    for (int i = 0; i < NT; i++) {
        uint64_t n = m.numel[i];
        uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(zo_optim_state_export(a.o, (unsigned)i, (zo_optim_state)k, x, ZO_DTYPE_BF16, 0, n), 0);
            ck_assert_int_eq(zo_optim_state_export(b.o, (unsigned)i, (zo_optim_state)k, y, ZO_DTYPE_BF16, 0, n), 0);
            ck_assert_msg(memcmp(x, y, n * 2) == 0, "tensor %d state %d differs", i, k);
        }
        ck_assert(memcmp(a.dparam[i], b.dparam[i], n * 2) == 0);
        free(x);
        free(y);
    }
    /* the bf16 states really are bf16: m of group 1 holds no fp32-only bits */
    uint64_t n = m.numel[4];
    float *mf = malloc(n * 4);
    ck_assert_int_eq(zo_optim_state_export(a.o, 4, ZO_OPTIM_STATE_EXP_AVG, mf, ZO_DTYPE_F32, 0, n), 0);
    for (uint64_t j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, &mf[j], 4);
        ZO_EXPECT((u & 0xffff) == 0, "elem %llu: %a is not a bf16 value", (unsigned long long)j, (double)mf[j]);
    }
    free(mf);
    eng_free(&a);
    eng_free(&b);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------ */

/* Output structs: the caller's struct_size, at least the first version's;
 * the library fills what fits and never writes struct_size. `e` has done
 * one step. */
static void out_struct_sizes(eng *e)
{
    /* too small: refused before anything is done (nothing written, nothing waited for) */
    zo_optim_info info;
    memset(&info, 0xab, sizeof(info));
    info.struct_size = ZO_OPTIM_INFO_SIZE_V1 - 8;
    ck_assert_int_eq(zo_optim_get_info(e->o, &info), -EINVAL);
    ck_assert(strstr(zo_optim_errmsg(e->o), "zo_optim_get_info") && strstr(zo_optim_errmsg(e->o), "struct_size"));
    ck_assert_uint_eq(info.step, 0xababababababababull);
    zo_optim_timeline tl;
    memset(&tl, 0xab, sizeof(tl));
    tl.struct_size = 0;
    ck_assert_int_eq(zo_optim_get_timeline(e->o, &tl), -EINVAL);
    ck_assert_uint_eq(tl.total_ns, 0xababababababababull);
    zo_optim_step_result res;
    memset(&res, 0xab, sizeof(res));
    res.struct_size = sizeof(res) - 1;
    ck_assert_int_eq(zo_optim_wait(e->o, &res), -EINVAL);
    ck_assert_int_eq(zo_optim_last_result(e->o, &res), -EINVAL);
    ck_assert_int_eq(zo_optim_step(e->o, NULL, &res), -EINVAL); /* nothing done: not a micro-step */
    ck_assert_int_eq(res.boundary, (int)0xabababab);
    zo_optim_info now = {.struct_size = sizeof(now)};
    ck_assert_int_eq(zo_optim_get_info(e->o, &now), 0);
    ck_assert_uint_eq(now.micro_steps, 1);
    ck_assert_uint_eq(now.updates_done, 1);
    /* an older caller (the first version): its fields, nothing past them */
    memset(&info, 0xab, sizeof(info));
    info.struct_size = ZO_OPTIM_INFO_SIZE_V1;
    ck_assert_int_eq(zo_optim_get_info(e->o, &info), 0);
    ck_assert_uint_eq(info.struct_size, ZO_OPTIM_INFO_SIZE_V1);
    ck_assert_int_eq(info.step, 1);
    ck_assert_uint_eq(info.ntensors, NT);
    ck_assert_uint_eq(info.numel, e->m->total);
    ck_assert_int_eq(info.dpu_active, 0);
    ck_assert_uint_eq(info.eager_subgroups, 0xababababababababull);
    ck_assert_uint_eq(info.updates_done, 0xababababababababull);
    ck_assert_uint_eq(info.nvme_write_bytes_total, 0xababababababababull);
    memset(&tl, 0xab, sizeof(tl));
    tl.struct_size = ZO_OPTIM_TIMELINE_SIZE_V1;
    ck_assert_int_eq(zo_optim_get_timeline(e->o, &tl), 0);
    ck_assert_int_eq(tl.step, 1);
    ck_assert_uint_gt(tl.total_ns, 0);
    ck_assert_uint_ne(tl.stall_ns, 0xababababababababull);
    ck_assert_uint_eq(tl.update_ns, 0xababababababababull);
    /* a newer caller (a longer struct): ours filled, its own tail untouched */
    struct {
        zo_optim_info info;
        uint64_t newer;
    } big;
    memset(&big, 0xab, sizeof(big));
    big.info.struct_size = sizeof(big);
    ck_assert_int_eq(zo_optim_get_info(e->o, &big.info), 0);
    ck_assert_uint_eq(big.info.struct_size, sizeof(big));
    ck_assert_uint_eq(big.info.updates_done, 1);
    ck_assert_uint_eq(big.newer, 0xababababababababull);
    res.struct_size = sizeof(res);
    ck_assert_int_eq(zo_optim_last_result(e->o, &res), 0);
    ck_assert_int_eq(res.step, 1);
    ck_assert_int_eq(res.boundary, 1);
}

START_TEST(test_optim_errors)
{
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    eng e;
    eng_config(&e, &m);
    zo_optim *o = (zo_optim *)&e; /* must be cleared on failure */
    ck_assert_int_eq(zo_optim_create(&o, NULL), -EINVAL);
    ck_assert_ptr_null(o);
    ck_assert_int_eq(zo_optim_create(NULL, &e.cfg), -EINVAL);
    zo_optim_config c = e.cfg;
    c.struct_size = 8;
    ck_assert_int_eq(zo_optim_create(&o, &c), -EINVAL);
    c = e.cfg;
    c.dev = NULL;
    ck_assert_int_eq(zo_optim_create(&o, &c), -EINVAL);
    c = e.cfg;
    c.param_dtype = ZO_DTYPE_U8;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
    /* the device dtype is required: a default (it was bf16) wrote bf16 into
     * an fp32 trainer's buffers with rc 0; grad_dtype follows it */
    zo_optim_config d;
    zo_optim_config_default(&d);
    ck_assert_int_eq(d.param_dtype, ZO_DTYPE_COUNT);
    d.dev = c.dev;
    d.groups = c.groups;
    d.ngroups = c.ngroups;
    ck_assert_int_eq(zo_optim_create(&o, &d), ZO_ECONFIG);
    ck_assert_msg(strstr(zo_last_error_detail(), "param_dtype is not set") &&
                  strstr(zo_last_error_detail(), "ZO_DTYPE_F32"), "%s", zo_last_error_detail());
    ck_assert_ptr_null(o);
    c = e.cfg;
    c.sub_group_size = 10;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
    /* double-buffered device params belong to DPU */
    c = e.cfg;
    c.dpu_double_buffer = 1;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
    ck_assert(strstr(zo_last_error_detail(), "dpu_double_buffer") != NULL);
    c.dpu = 1;
    c.dpu_double_buffer = 2;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
    /* a zero-size tensor */
    uint64_t bad[NT0] = {1000, 0, 3, 130001};
    zo_optim_group g[2] = {e.grp[0], e.grp[1]};
    g[0].numel = bad;
    c = e.cfg;
    c.groups = g;
    ck_assert_int_eq(zo_optim_create(&o, &c), -EINVAL);
    ck_assert(strstr(zo_last_error_detail(), "numel") != NULL);
    /* a group not filled by the defaults function */
    g[0] = e.grp[0];
    g[0].struct_size = 0;
    ck_assert_int_eq(zo_optim_create(&o, &c), -EINVAL);
    /* duplicate names */
    const char *dup[NT0] = {"a", "b", "a", "c"};
    g[0] = e.grp[0];
    g[0].names = dup;
    ck_assert_int_eq(zo_optim_create(&o, &c), -EEXIST);
    /* hyperparameters out of range */
    zo_cpuadam_hparams hp = m.hp[0];
    hp.beta1 = 1.5;
    g[0] = e.grp[0];
    g[0].hparams = &hp;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
    /* step, grad_scale and clip_coef are the engine's: a group that sets
     * them is refused, not silently overridden */
    for (int k = 0; k < 3; k++) {
        hp = m.hp[0];
        if (k == 0)
            hp.step = 5;
        else if (k == 1)
            hp.grad_scale = 0.5;
        else
            hp.clip_coef = 0.25;
        ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
        ck_assert_msg(strstr(zo_last_error_detail(), "the engine sets these itself"), "%s", zo_last_error_detail());
        ck_assert_ptr_null(o);
    }
    /* speculative with Lion */
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_LION);
    c.clip_mode = ZO_OPTIM_CLIP_SPECULATIVE;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
    /* an impossible pinned budget */
    c = e.cfg;
    c.pinned_bytes = 1 << 20;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_EBUDGET);
    ck_assert(strstr(zo_last_error_detail(), "pinned_bytes") != NULL);
    /* NVMe placement without a place, or with a pinned budget below the least pool */
    c = e.cfg;
    c.placement = ZO_OPTIM_PLACE_NVME;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_ECONFIG);
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    c.nvme_path = dir;
    c.pinned_bytes = 8 << 20;
    ck_assert_int_eq(zo_optim_create(&o, &c), ZO_EBUDGET);
    ck_assert_ptr_null(o);
    /* a budget the pool can shrink into */
    c.pinned_bytes = 48 << 20;
    ck_assert_int_eq(zo_optim_create(&o, &c), 0);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(o, &info), 0);
    ck_assert_uint_le(info.pinned_bytes, 48 << 20);
    zo_optim_destroy(&o);
    zo_test_rmtree(dir);

    /* a working engine: bad calls */
    eng_create(&e);
    ck_assert_int_eq(zo_optim_grad(e.o, NT, e.dgrad[0], NULL), -EINVAL);
    ck_assert_int_eq(zo_optim_grad(e.o, 0, NULL, NULL), -EINVAL);
    ck_assert_int_eq(zo_optim_grad_host(e.o, 0, e.dgrad[0], ZO_DTYPE_U8), ZO_ENOTSUP);
    ck_assert_int_eq(zo_optim_set_lr(e.o, 2, 1e-3), -EINVAL);
    ck_assert_int_eq(zo_optim_set_lr(e.o, 0, -1.0), ZO_ECONFIG);
    ck_assert_int_eq(zo_optim_set_lr(e.o, 0, 2e-3), 0);
    zo_cpuadam_hparams lion;
    zo_cpuadam_hparams_default(&lion, ZO_OPTIM_LION);
    ck_assert_int_eq(zo_optim_set_hparams(e.o, 0, &lion), ZO_ECONFIG);
    zo_cpuadam_hparams h2 = m.hp[0];
    h2.clip_coef = 0.5;
    ck_assert_int_eq(zo_optim_set_hparams(e.o, 0, &h2), ZO_ECONFIG);
    ck_assert(strstr(zo_optim_errmsg(e.o), "clip_coef 0.5"));
    h2.clip_coef = 1.0;
    ck_assert_int_eq(zo_optim_set_hparams(e.o, 0, &h2), 0);
    /* without double buffering the device params stay where the framework put them */
    void *dp = NULL;
    zo_event *ev = (zo_event *)1;
    ck_assert_int_eq(zo_optim_param_device(e.o, 3, &dp, &ev), 0);
    ck_assert_ptr_eq(dp, e.dparam[3]);
    ck_assert_ptr_null(ev);
    ck_assert_int_eq(zo_optim_param_device(e.o, NT, &dp, NULL), -EINVAL);
    ck_assert_int_eq(zo_optim_param_device(NULL, 0, &dp, NULL), -EINVAL);
    /* without DPU, a second step while one is in flight is refused, and so is intake */
    for (int i = 0; i < NT; i++) {
        fill_grad(&e, i, 1, 1.0);
        ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
    }
    ck_assert_int_eq(zo_optim_step_async(e.o, NULL), 0);
    ck_assert_int_eq(zo_optim_step_async(e.o, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_grad(e.o, 0, e.dgrad[0], NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_wait(e.o, NULL), 0);
    ck_assert_int_eq(zo_optim_wait(e.o, NULL), 0); /* nothing in flight: no-op */
    out_struct_sizes(&e);
    eng_free(&e);
    /* NULL tolerance */
    zo_optim_destroy(NULL);
    o = NULL;
    zo_optim_destroy(&o);
    ck_assert_int_eq(zo_optim_poll(NULL), -EINVAL);
    ck_assert_str_eq(zo_optim_errmsg(NULL), "");
}
END_TEST

/* A step on masters nobody set: they start at zero, so the update would
 * write updates of zero masters over the framework's parameters. Refused
 * (ZO_ESTATE, naming the missing call) until init_from_device, an import of
 * every tensor's masters, or a load; the device params stay untouched.
 * 0: two-pass, 1: speculative (the update starts at the first gradient). */
START_TEST(test_optim_uninit_masters)
{
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    eng e;
    eng_config(&e, &m);
    e.cfg.clip_mode = _i ? ZO_OPTIM_CLIP_SPECULATIVE : ZO_OPTIM_CLIP_TWO_PASS;
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    size_t pes = zo_dtype_size(m.pdt);
    void *before[NT];
    for (int i = 0; i < NT; i++) {
        before[i] = malloc(m.numel[i] * pes);
        memcpy(before[i], e.dparam[i], m.numel[i] * pes);
    }
    /* speculative: the first gradient of the last micro-step would start the update */
    fill_grad(&e, NT - 1, 1, 1.0);
    int rc = zo_optim_grad(e.o, NT - 1, e.dgrad[NT - 1], NULL);
    ck_assert_int_eq(rc, _i ? ZO_ESTATE : 0);
    for (int i = 0; i < NT - 1; i++) {
        fill_grad(&e, i, 1, 1.0);
        ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), _i ? ZO_ESTATE : 0);
    }
    ck_assert_int_eq(zo_optim_step(e.o, NULL, NULL), ZO_ESTATE);
    ck_assert_msg(strstr(zo_optim_errmsg(e.o), "zo_optim_init_from_device()") &&
                  strstr(zo_optim_errmsg(e.o), "never set") && strstr(zo_optim_errmsg(e.o), "'embed'"),
                  "%s", zo_optim_errmsg(e.o));
    ck_assert_int_eq(zo_optim_push_params(e.o), ZO_ESTATE);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
    ck_assert_int_eq(info.step, 0);
    ck_assert_uint_eq(info.updates_done, 0);
    for (int i = 0; i < NT; i++)
        ck_assert_msg(memcmp(before[i], e.dparam[i], m.numel[i] * pes) == 0, "device params of %d changed", i);
    /* every tensor's masters but the last one's, tensor 3 in two pieces: still refused, naming it */
    float *w = malloc(m.total * 4);
    for (uint64_t k = 0; k < m.total; k++)
        w[k] = init_param(k);
    for (int i = 0; i < NT - 1; i++) {
        uint64_t half = i == 3 ? m.numel[i] / 2 : 0;
        if (half)
            ck_assert_int_eq(zo_optim_state_import(e.o, (unsigned)i, ZO_OPTIM_STATE_MASTER, w + m.off[i] + half,
                                                   ZO_DTYPE_F32, half, m.numel[i] - half), 0);
        ck_assert_int_eq(zo_optim_state_import(e.o, (unsigned)i, ZO_OPTIM_STATE_MASTER, w + m.off[i], ZO_DTYPE_F32,
                                               0, half ? half : m.numel[i]), 0);
    }
    ck_assert_int_eq(zo_optim_step(e.o, NULL, NULL), ZO_ESTATE);
    ck_assert_msg(strstr(zo_optim_errmsg(e.o), "'norm'"), "%s", zo_optim_errmsg(e.o));
    ck_assert_int_eq(zo_optim_state_import(e.o, NT - 1, ZO_OPTIM_STATE_MASTER, w + m.off[NT - 1], ZO_DTYPE_F32, 0,
                                           m.numel[NT - 1]), 0);
    ck_assert_int_eq(zo_optim_push_params(e.o), 0);
    for (int i = 0; i < NT; i++) {
        fill_grad(&e, i, 2, 1.0);
        ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
    }
    rc = zo_optim_step(e.o, NULL, NULL);
    ck_assert_msg(rc == 0, "%s", zo_optim_errmsg(e.o));
    /* a fresh engine initialised from the device steps at once */
    zo_optim_destroy(&e.o);
    eng_create(&e);
    train(&e, NULL, 1, 1);
    free(w);
    for (int i = 0; i < NT; i++)
        free(before[i]);
    eng_free(&e);
}
END_TEST

/* ---- checkpoints a load must refuse -------------------------------------------------------- */

static void manifest_write(const char *root, const char *ck, const char *text)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s/manifest.json", root, ck);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    ck_assert_int_eq(fclose(f), 0);
}

/* A load that fails: refused before anything is written where it can be
 * (a record that does not match: the engine goes on as it was), and where
 * the failure is found only midway (a corrupt chunk of the last sub-group's
 * states, read after the others were restored) the engine refuses
 * everything that would use the half-restored states until a load
 * succeeds; training then continues exactly as the uninterrupted run. */
START_TEST(test_optim_load_fails_midway)
{
    ckpt_run k;
    ckpt_run_setup(&k);
    model *m = &k.m;
    ref *r = &k.r;
    eng *e = &k.e;
    const char *dir = k.dir;
    train(e, r, 1, 2);
    ck_assert_int_eq(zo_optim_save(e->o, dir, "step-2", 0, NULL), 0);
    /* a record that is not this engine's (the fingerprint changed): refused
     * before anything is touched, and the run goes on */
    ck_assert_int_eq(zo_optim_save(e->o, dir, "other", 0, NULL), 0);
    size_t len;
    char *text = zo_test_manifest_read(dir, "other", &len);
    char *fp = strstr(text, "\"fingerprint\":");
    ck_assert_ptr_nonnull(fp);
    fp = strchr(fp + strlen("\"fingerprint\":"), '"') + 1;
    *fp = *fp == '0' ? '1' : '0';
    manifest_write(dir, "other", text);
    free(text);
    ck_assert_int_eq(zo_optim_load(e->o, dir, "other", NULL, 0), ZO_EFORMAT);
    compare(e, r, "after a refused load");
    train(e, r, 3, 3);
    compare(e, r, "a step after a refused load");
    /* a corrupt chunk in the last sub-group's states: found midway */
    train(e, NULL, 4, 4);
    ck_assert_int_eq(zo_optim_save(e->o, dir, "step-4", 0, NULL), 0);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(e->o, &info), 0);
    char last[64];
    snprintf(last, sizeof(last), "optim.sg%u.exp_avg_sq", info.nsubgroups - 1);
    ck_assert_int_eq(zo_test_ckpt_corrupt(dir, "step-4", last, 100), 0);
    int rc = zo_optim_load(e->o, dir, "step-4", NULL, 0);
    ck_assert_msg(rc == ZO_ECORRUPT, "load: %s (%s)", zo_strerror(rc), zo_optim_errmsg(e->o));
    /* every call that would use the half-restored states is refused */
    ck_assert_int_eq(zo_optim_step(e->o, NULL, NULL), ZO_ESTATE);
    ck_assert_msg(strstr(zo_optim_errmsg(e->o), "zo_optim_load() failed"), "%s", zo_optim_errmsg(e->o));
    fill_grad(e, 0, 5, 1.0);
    ck_assert_int_eq(zo_optim_grad(e->o, 0, e->dgrad[0], NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_grad_host(e->o, 0, e->dgrad[0], m->gdt), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_save(e->o, dir, "bad", 0, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_push_params(e->o), ZO_ESTATE);
    float x;
    ck_assert_int_eq(zo_optim_state_export(e->o, 0, ZO_OPTIM_STATE_MASTER, &x, ZO_DTYPE_F32, 0, 1), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_state_import(e->o, 0, ZO_OPTIM_STATE_MASTER, &x, ZO_DTYPE_F32, 0, 1), ZO_ESTATE);
    const void *pb;
    ck_assert_int_eq(zo_optim_param_buffer(e->o, 0, &pb), ZO_ESTATE);
    /* a good checkpoint brings it back: the run goes on as the uninterrupted one */
    rc = zo_optim_load(e->o, dir, "step-2", NULL, 0);
    ck_assert_msg(rc == 0, "load: %s (%s)", zo_strerror(rc), zo_optim_errmsg(e->o));
    ref_free(r);
    ref_init(r, m);
    train_ref_only(e, r, 1, 2);
    compare(e, r, "step-2 restored");
    train(e, r, 3, 4);
    compare(e, r, "after the failed load");
    /* init_from_device also clears the refusal */
    ck_assert_int_eq(zo_optim_load(e->o, dir, "step-4", NULL, 0), ZO_ECORRUPT);
    ck_assert_int_eq(zo_optim_step(e->o, NULL, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_init_from_device(e->o), 0);
    train(e, NULL, 1, 1);
    ckpt_run_free(&k);
}
END_TEST

/* Index of the bracket or brace closing the one at text[at] (strings
 * skipped; the manifest's names have no escapes). */
static size_t json_close(const char *text, size_t at)
{
    int depth = 0, str = 0;
    for (size_t i = at; text[i]; i++) {
        if (text[i] == '"')
            str = !str;
        else if (!str && (text[i] == '[' || text[i] == '{'))
            depth++;
        else if (!str && (text[i] == ']' || text[i] == '}') && --depth == 0)
            return i;
    }
    ck_abort_msg("unbalanced JSON");
    return 0;
}

/* Remove text[a, b) */
static void cut(char *text, size_t a, size_t b)
{
    memmove(text + a, text + b, strlen(text + b) + 1);
}

/* Checkpoints whose tensor set is not the engine's, each made from a good
 * one by editing its manifest as a careless tool or a hand might (loaded
 * by name: the manifest's CRC is checked only through `latest`, and a tool
 * can fix that up too): no tensors at all, one dropped, two of the same
 * size with their names swapped. Each is refused before anything is
 * written (ZO_EFORMAT, naming what differs), and training goes on as it
 * was: fresh or stale states never run under the restored step count. */
START_TEST(test_optim_load_tensor_set)
{
    ckpt_run k;
    ckpt_run_setup(&k);
    train(&k.e, &k.r, 1, 2);
    static const char *const cases[] = {"empty", "dropped", "swapped"};
    static const char *const why[] = {"lacks 'optim.sg0.master'", "lacks 'optim.sg1.master'", "names swapped"};
    for (int c = 0; c < 3; c++) {
        ck_assert_int_eq(zo_optim_save(k.e.o, k.dir, cases[c], 0, NULL), 0);
        size_t len;
        char *text = zo_test_manifest_read(k.dir, cases[c], &len);
        ck_assert_ptr_nonnull(text);
        if (c == 0) {
            size_t a = (size_t)(strchr(strstr(text, "\"tensors\":"), '[') - text);
            cut(text, a + 1, json_close(text, a));
        } else if (c == 1) {
            char *at = strstr(text, "\"name\":\t\"optim.sg1.master\"");
            ck_assert_ptr_nonnull(at);
            while (*at != '{')
                at--;
            size_t a = (size_t)(at - text), b = json_close(text, a) + 1;
            if (text[b] == ',')
                b++;
            cut(text, a, b);
        } else {
            /* m and v of sub-group 0: the same size and dtype */
            const char *m1 = "\"optim.sg0.exp_avg\"", *v1 = "\"optim.sg0.exp_avg_sq\"";
            char *x = strstr(text, m1), *y = strstr(text, v1);
            ck_assert(x && y && x < y);
            char *sw = malloc(len + 1);
            snprintf(sw, len + 1, "%.*s%s%.*s%s%s", (int)(x - text), text, v1, (int)(y - x - strlen(m1)),
                     x + strlen(m1), m1, y + strlen(v1));
            strcpy(text, sw);
            free(sw);
        }
        manifest_write(k.dir, cases[c], text);
        free(text);
        int rc = zo_optim_load(k.e.o, k.dir, cases[c], NULL, 0);
        ck_assert_msg(rc == ZO_EFORMAT && strstr(zo_optim_errmsg(k.e.o), why[c]), "%s: %s (%s)", cases[c],
                      zo_strerror(rc), zo_optim_errmsg(k.e.o));
        compare(&k.e, &k.r, cases[c]);
    }
    train(&k.e, &k.r, 3, 3);
    compare(&k.e, &k.r, "a step after the refused loads");
    ckpt_run_free(&k);
}
END_TEST

/* zo_optim_errmsg() is the detail of the driving thread's latest call: a
 * call that succeeds leaves "", not an older call's failure; the detail of
 * a failed update (found by the worker) comes with the call that returns
 * its error, even when other calls succeeded in between. */
START_TEST(test_optim_errmsg)
{
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    eng e;
    eng_config(&e, &m);
    eng_create(&e);
    ck_assert_str_eq(zo_optim_errmsg(e.o), "");
    ck_assert_int_eq(zo_optim_set_lr(e.o, 2, 1e-3), -EINVAL);
    ck_assert(strstr(zo_optim_errmsg(e.o), "group out of range"));
    ck_assert_int_eq(zo_optim_set_lr(e.o, 0, 2e-3), 0);
    ck_assert_str_eq(zo_optim_errmsg(e.o), "");
    float x;
    ck_assert_int_eq(zo_optim_state_export(e.o, NT, ZO_OPTIM_STATE_MASTER, &x, ZO_DTYPE_F32, 0, 1), -EINVAL);
    ck_assert(zo_optim_errmsg(e.o)[0]);
    ck_assert_int_eq(zo_optim_state_export(e.o, 0, ZO_OPTIM_STATE_MASTER, &x, ZO_DTYPE_F32, 0, 1), 0);
    ck_assert_str_eq(zo_optim_errmsg(e.o), "");
    /* an update that fails on the worker (inf gradients, the default
     * policy): successful calls meanwhile do not lose its detail */
    for (int i = 0; i < NT; i++) {
        fill_grad(&e, i, 1, 1.0);
        if (i == 2)
            zo_test_put(e.dgrad[i], m.gdt, 1, INFINITY);
        ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
    }
    ck_assert_int_eq(zo_optim_step_async(e.o, NULL), 0);
    while (zo_optim_poll(e.o) == ZO_PENDING)
        usleep(1000);
    ck_assert_int_eq(zo_optim_set_lr(e.o, 0, 1e-3), 0);
    ck_assert_str_eq(zo_optim_errmsg(e.o), "");
    ck_assert_int_eq(zo_optim_wait(e.o, NULL), ZO_ENONFINITE);
    ck_assert_msg(strstr(zo_optim_errmsg(e.o), "inf/NaN"), "%s", zo_optim_errmsg(e.o));
    train(&e, NULL, 2, 2);
    ck_assert_str_eq(zo_optim_errmsg(e.o), "");
    eng_free(&e);
}
END_TEST

/* zo_optim_discard_grads(): a window dropped mid-way (two of three
 * micro-steps, and a gradient after them) leaves no trace: the next window
 * updates exactly as the reference that never saw it, and a save is allowed
 * again at once. Under the eager speculative step a window whose update
 * has begun cannot be dropped. */
START_TEST(test_optim_discard_grads)
{
    ckpt_run k;
    ckpt_run_config(&k, ZO_DTYPE_BF16);
    k.e.cfg.grad_accum_steps = 3;
    eng_create(&k.e);
    zo_optim *o = k.e.o;
    for (int ms = 0; ms < 2; ms++) {
        for (int i = 0; i < NT; i++) {
            fill_grad(&k.e, i, 100 + ms, 1.0);
            ck_assert_int_eq(zo_optim_grad(o, (unsigned)i, k.e.dgrad[i], NULL), 0);
        }
        ck_assert_int_eq(zo_optim_step_async(o, NULL), 0);
    }
    ck_assert_int_eq(zo_optim_grad(o, 1, k.e.dgrad[1], NULL), 0);
    ck_assert_int_eq(zo_optim_save(o, k.dir, "mid", 0, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_discard_grads(o), 0);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(o, &info), 0);
    ck_assert_uint_eq(info.micro_steps, 0);
    ck_assert_int_eq(zo_optim_save(o, k.dir, "boundary", 0, NULL), 0);
    /* one whole window, as the reference sees it: tensor 2 gets no gradient */
    for (int ms = 1; ms <= 3; ms++) {
        for (int i = 0; i < NT; i++) {
            if (i == 2)
                continue;
            fill_grad(&k.e, i, ms, 1.0);
            ref_grad(&k.r, i, k.e.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(o, (unsigned)i, k.e.dgrad[i], NULL), 0);
        }
        ck_assert_int_eq(zo_optim_step(o, NULL, NULL), 0);
    }
    ref_step(&k.r, 1.0, 1.0, NULL);
    compare(&k.e, &k.r, "after a discarded window");
    zo_optim_destroy(&k.e.o);
    /* eager speculative: the last micro-step's first gradient starts the update */
    k.e.cfg.grad_accum_steps = 1;
    k.e.cfg.clip_mode = ZO_OPTIM_CLIP_SPECULATIVE;
    eng_create(&k.e);
    ck_assert_int_eq(zo_optim_grad(k.e.o, 0, k.e.dgrad[0], NULL), 0);
    ck_assert_int_eq(zo_optim_discard_grads(k.e.o), ZO_ESTATE);
    ck_assert(strstr(zo_optim_errmsg(k.e.o), "has begun"));
    ck_assert_int_eq(zo_optim_step(k.e.o, NULL, NULL), 0);
    ck_assert_int_eq(zo_optim_discard_grads(k.e.o), 0); /* an empty window: nothing to drop */
    ck_assert_int_eq(zo_optim_discard_grads(NULL), -EINVAL);
    ckpt_run_free(&k);
}
END_TEST

/* The fp32 CPU trainer's path (docs/optim-integration.md): on the host
 * backend the params and gradients may be plain malloc() memory (optim.h,
 * dev_params); the engine reads and writes them in place, exactly as the
 * reference run. */
START_TEST(test_optim_host_malloc)
{
    ckpt_run k;
    ckpt_run_config(&k, ZO_DTYPE_F32);
    void *devp[NT], *devg[NT];
    for (int i = 0; i < NT; i++) {
        devp[i] = k.e.dparam[i];
        devg[i] = k.e.dgrad[i];
        k.e.dparam[i] = malloc(k.m.numel[i] * 4); /* grp[].dev_params point into e.dparam */
        k.e.dgrad[i] = malloc(k.m.numel[i] * 4);
        memcpy(k.e.dparam[i], devp[i], k.m.numel[i] * 4);
    }
    eng_create(&k.e);
    train(&k.e, &k.r, 1, 3);
    compare(&k.e, &k.r, "malloc'd params");
    zo_optim_destroy(&k.e.o);
    for (int i = 0; i < NT; i++) {
        free(k.e.dparam[i]);
        free(k.e.dgrad[i]);
        k.e.dparam[i] = devp[i];
        k.e.dgrad[i] = devg[i];
    }
    ckpt_run_free(&k);
}
END_TEST

/* Bytes of the arena files in `dir` whose name carries pid `pid` (0: any). */
static uint64_t arena_bytes(const char *dir, pid_t pid)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    char pre[64];
    snprintf(pre, sizeof(pre), "zo-swap.%d.", (int)pid);
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, pid ? pre : "zo-swap.", strlen(pid ? pre : "zo-swap.")) != 0)
            continue;
        char p[600];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        if (stat(p, &st) == 0)
            sum += (uint64_t)st.st_size;
    }
    closedir(d);
    return sum;
}

/* docs/optim.md: the swap files of a run killed with SIGKILL (no destroy,
 * no cleanup) are reclaimed by the next engine created with the same
 * nvme_path (the swap store's flock on each arena file dies with the
 * process), and not before: a live engine's are never touched. */
START_TEST(test_optim_nvme_killed_reclaimed)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    model m;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        eng e;
        eng_config(&e, &m);
        e.cfg.placement = ZO_OPTIM_PLACE_NVME;
        e.cfg.nvme_path = dir;
        int r = zo_optim_create(&e.o, &e.cfg);
        if (r == 0)
            r = zo_optim_init_from_device(e.o);
        char c = r == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1)
            _exit(3);
        pause(); /* killed here, engine and all */
        _exit(0);
    }
    close(ready[1]);
    char c = 0;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    close(ready[0]);
    ck_assert_int_eq(c, 'y');
    uint64_t held = arena_bytes(dir, child);
    ck_assert_uint_gt(held, 0);
    /* a second engine beside the live one leaves its files alone */
    eng e;
    eng_config(&e, &m);
    e.cfg.placement = ZO_OPTIM_PLACE_NVME;
    e.cfg.nvme_path = dir;
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    ck_assert_uint_eq(arena_bytes(dir, child), held);
    zo_optim_destroy(&e.o);
    ck_assert_int_eq(kill(child, SIGKILL), 0);
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    ck_assert_uint_eq(arena_bytes(dir, child), held); /* nobody has looked yet */
    ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), 0);
    ck_assert_uint_eq(arena_bytes(dir, child), 0);
    zo_optim_destroy(&e.o);
    ck_assert_uint_eq(arena_bytes(dir, 0), 0); /* and destroy removes its own */
    eng_free(&e);
    zo_test_rmtree(dir);
}
END_TEST

/* destroy while a step runs (and while DPU copies are pending; 2: DPU with
 * double-buffered device params, writing the engine's second buffers) */
START_TEST(test_optim_destroy_async)
{
    for (int mode = 0; mode < 3; mode++) {
        int dpu = mode > 0;
        model m;
        model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
        eng e;
        eng_config(&e, &m);
        e.cfg.dpu = dpu;
        e.cfg.dpu_double_buffer = mode == 2;
        e.cfg.dpu_warmup_steps = 0;
        eng_create(&e);
        for (int s = 1; s <= 2; s++) {
            ck_assert_int_eq(zo_optim_grads_done(e.o), 0);
            for (int i = 0; i < NT; i++) {
                fill_grad(&e, i, s, 1.0);
                ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
            }
            ck_assert_int_eq(zo_optim_step_async(e.o, NULL), 0);
            if (!dpu)
                break;
        }
        /* gradients still being copied for the next window, too */
        for (int i = 0; i < NT; i++)
            ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), dpu ? 0 : ZO_ESTATE);
        zo_optim_destroy(&e.o);
        eng_free(&e);
    }
}
END_TEST

/* ---- NVMe: a full disk mid-step ----------------------------------------------------------- */

typedef struct wfault {
    _Atomic int armed;
    _Atomic int writes; /* writes let through once armed */
    _Atomic int hits;
} wfault;

static int64_t wfault_hook(void *user, const zo__aio_fault_site *st)
{
    wfault *f = user;
    if (!atomic_load(&f->armed) || st->op != ZO__OP_WRITE)
        return 0;
    if (atomic_fetch_sub(&f->writes, 1) > 0)
        return 0;
    atomic_fetch_add(&f->hits, 1);
    return -ENOSPC;
}

/* A swap store in dir with arenas of arena_size bytes (grown as needed). */
static zo_swap *nvme_swap(const char *dir, uint64_t arena_size)
{
    const char *dirs[1] = {dir};
    zo_swap_config wc;
    zo_swap_config_default(&wc);
    wc.dirs = dirs;
    wc.ndirs = 1;
    wc.arena_size = arena_size;
    zo_swap *swap;
    ck_assert_int_eq(zo_swap_create(&swap, &wc), 0);
    return swap;
}

/* setup() with NVMe placement in `swap`, clipping at 1 */
static void setup_nvme(model *m, ref *r, eng *e, zo_swap *swap)
{
    setup(m, r, e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e->cfg.placement = ZO_OPTIM_PLACE_NVME;
    e->cfg.swap = swap;
    e->cfg.max_grad_norm = 1.0;
}

/* The step fails with the disk's error, the engine refuses to go on with
 * states it cannot vouch for, and the last checkpoint restores a state
 * from which training continues exactly as the uninterrupted run. */
START_TEST(test_optim_nvme_diskfull)
{
    char dir[256], swapdir[300], ckdir[300];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(swapdir, sizeof(swapdir), "%s/swap", dir);
    snprintf(ckdir, sizeof(ckdir), "%s/ckpt", dir);
    ck_assert_int_eq(mkdir(swapdir, 0700), 0);
    zo_swap *swap = nvme_swap(swapdir, 16 << 20);
    wfault f;
    atomic_init(&f.armed, 0);
    atomic_init(&f.writes, 0);
    atomic_init(&f.hits, 0);
    zo__aio_set_fault(zo_swap_get_aio(swap), wfault_hook, &f);

    model m;
    ref r;
    eng e;
    setup_nvme(&m, &r, &e, swap);
    eng_create(&e);
    train(&e, &r, 1, 2);
    ck_assert_int_eq(zo_optim_save(e.o, ckdir, "step-2", 0, NULL), 0);
    /* step 3: a few write-backs land, then the disk is full */
    atomic_store(&f.writes, 3);
    atomic_store(&f.armed, 1);
    for (int i = 0; i < NT; i++) {
        fill_grad(&e, i, 3, 1.0);
        ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
    }
    int rc = zo_optim_step(e.o, NULL, NULL);
    ck_assert_msg(rc == -ENOSPC, "step on a full disk: %s (%s)", zo_strerror(rc), zo_optim_errmsg(e.o));
    ck_assert_int_gt(atomic_load(&f.hits), 0);
    atomic_store(&f.armed, 0);
    /* no more steps, saves or exports on undefined states */
    ck_assert_int_eq(zo_optim_step(e.o, NULL, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_optim_save(e.o, ckdir, "bad", 0, NULL), ZO_ESTATE);
    float x;
    ck_assert_int_eq(zo_optim_state_export(e.o, 0, ZO_OPTIM_STATE_MASTER, &x, ZO_DTYPE_F32, 0, 1), ZO_ESTATE);
    /* the checkpoint restores, and the run goes on as the uninterrupted one */
    ck_assert_int_eq(zo_optim_load(e.o, ckdir, NULL, NULL, 0), 0);
    compare(&e, &r, "restored");
    train(&e, &r, 3, 4);
    compare(&e, &r, "after the full disk");
    eng_free(&e);
    ref_free(&r);
    zo_swap_destroy(&swap);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- the gradient window's dtype (window.c) ------------------------------------------------ */

/* bf16/fp16 gradients without accumulation wait in their own dtype (2 B/param),
 * everything else in fp32; DPU has two windows */
START_TEST(test_optim_grad_window_size)
{
    static const struct {
        zo_dtype pdt, gdt;
        unsigned accum;
        int dpu;
        zo_dtype want;
        unsigned bytes, nwin;
    } c[] = {
        {ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 0, ZO_DTYPE_BF16, 2, 1}, {ZO_DTYPE_F16, ZO_DTYPE_F16, 1, 0, ZO_DTYPE_F16, 2, 1},
        {ZO_DTYPE_BF16, ZO_DTYPE_BF16, 2, 0, ZO_DTYPE_F32, 4, 1},  {ZO_DTYPE_F32, ZO_DTYPE_F32, 1, 0, ZO_DTYPE_F32, 4, 1},
        {ZO_DTYPE_BF16, ZO_DTYPE_F32, 1, 0, ZO_DTYPE_F32, 4, 1},   {ZO_DTYPE_BF16, ZO_DTYPE_BF16, 1, 1, ZO_DTYPE_BF16, 2, 2},
        {ZO_DTYPE_F32, ZO_DTYPE_BF16, 1, 0, ZO_DTYPE_BF16, 2, 1},
    };
    for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
        model m;
        eng e;
        model_init(&m, c[k].pdt, c[k].gdt);
        eng_config(&e, &m);
        e.cfg.grad_accum_steps = c[k].accum;
        e.cfg.dpu = c[k].dpu;
        eng_create(&e);
        zo_optim_info info = {.struct_size = sizeof(info)};
        ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
        ck_assert_msg(info.grad_buffer_dtype == c[k].want, "case %zu: window %s", k,
                      zo_dtype_name(info.grad_buffer_dtype));
        ck_assert_uint_eq(info.grad_buffer_bytes, (uint64_t)c[k].nwin * c[k].bytes * m.total);
        ck_assert_uint_ge(info.host_bytes, info.grad_buffer_bytes);
        eng_free(&e);
    }
}
END_TEST

/* zo_optim_estimate() says what create allocates: every figure that
 * zo_optim_get_info() reports after create, for host and NVMe placement,
 * DPU (double-buffered or not), accumulation, bf16 states, the device
 * backends' copy paths (the force_copy hook: staging, pinned windows), a
 * pinned budget that leaves the parameter buffers pageable, pin_memory 0,
 * and one group without device params; and it refuses what create refuses,
 * with the same code. */
START_TEST(test_optim_estimate)
{
    static const struct {
        int nvme, dpu, dbl, copy, pin, nodev;
        unsigned accum;
        zo_dtype gdt, sdt;
        uint64_t budget; /* added to pinned_min_bytes (0: no budget) */
    } c[] = {
        {0, 0, 0, 0, 1, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 0},
        {0, 1, 0, 0, 1, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 0},
        {0, 1, 1, 0, 1, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 0},
        {0, 0, 0, 1, 1, 0, 4, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 0},
        {0, 1, 0, 1, 1, 0, 1, ZO_DTYPE_F32, ZO_DTYPE_F32, 0},
        /* 205151 params: 410302-byte param buffers and windows */
        {0, 1, 0, 1, 1, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 500000},  /* one param buffer pinned, no window */
        {0, 1, 0, 1, 1, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 1331000}, /* both buffers and one window pinned */
        {0, 0, 0, 1, 0, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 0},
        {0, 0, 0, 0, 1, 1, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 0},
        {1, 0, 0, 0, 1, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 0},
        {1, 1, 0, 1, 1, 0, 2, ZO_DTYPE_BF16, ZO_DTYPE_BF16, 0},
        {1, 0, 0, 1, 1, 0, 1, ZO_DTYPE_BF16, ZO_DTYPE_F32, 1 << 20},
    };
    for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
        model m;
        eng e;
        model_init(&m, ZO_DTYPE_BF16, c[k].gdt);
        eng_config(&e, &m);
        char dir[256] = "";
        if (c[k].nvme) {
            zo_test_mkdtemp(dir, sizeof(dir));
            e.cfg.placement = ZO_OPTIM_PLACE_NVME;
            e.cfg.nvme_path = dir;
        }
        e.cfg.dpu = c[k].dpu;
        e.cfg.dpu_double_buffer = c[k].dbl;
        e.cfg.grad_accum_steps = c[k].accum;
        e.cfg.pin_memory = c[k].pin;
        e.grp[0].state_dtype = e.grp[1].state_dtype = c[k].sdt;
        if (c[k].nodev)
            e.grp[1].dev_params = NULL;
        zo__optim_force_copy = c[k].copy;
        zo_optim_footprint f = {.struct_size = sizeof(f)};
        int r = zo_optim_estimate(&e.cfg, -1, &f);
        ck_assert_msg(r == 0, "case %zu: estimate: %s (%s)", k, zo_strerror(r), zo_last_error_detail());
        if (c[k].budget) {
            e.cfg.pinned_bytes = f.pinned_min_bytes + c[k].budget;
            ck_assert_int_eq(zo_optim_estimate(&e.cfg, -1, &f), 0);
        }
        r = zo_optim_create(&e.o, &e.cfg);
        ck_assert_msg(r == 0, "case %zu: create: %s (%s)", k, zo_strerror(r), zo_last_error_detail());
        zo_optim_info info = {.struct_size = sizeof(info)};
        ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
        ck_assert_msg(f.pinned_bytes == info.pinned_bytes && f.host_bytes == info.host_bytes,
                      "case %zu: estimate pinned %llu host %llu, create pinned %llu host %llu", k,
                      (unsigned long long)f.pinned_bytes, (unsigned long long)f.host_bytes,
                      (unsigned long long)info.pinned_bytes, (unsigned long long)info.host_bytes);
        ck_assert_uint_eq(f.grad_window_bytes, info.grad_buffer_bytes);
        ck_assert_int_eq(f.grad_window_dtype, info.grad_buffer_dtype);
        ck_assert_uint_eq(f.nsubgroups, info.nsubgroups);
        ck_assert_uint_eq(f.numel, m.total);
        ck_assert_uint_eq(m.total, 205151);
        if (c[k].budget == 500000)
            ck_assert_uint_eq(info.pinned_bytes, f.pinned_min_bytes + 410302);
        if (c[k].budget == 1331000)
            ck_assert_uint_eq(info.grad_windows_pinned, 1);
        ck_assert_uint_eq(f.staging_bytes, c[k].copy ? e.cfg.grad_staging_bytes : 0);
        ck_assert_uint_eq(f.device_bytes, c[k].dbl ? m.total * 2 : 0);
        /* the states: 3 arrays per sub-group, fp32 master + m/v of the state dtype */
        uint64_t want_states = 0;
        for (int g = 0; g < 2; g++)
            for (uint64_t off = 0; off < m.gnumel[g]; off += SGSIZE) {
                uint64_t n = ZO_MIN((uint64_t)SGSIZE, m.gnumel[g] - off);
                uint64_t a = c[k].nvme ? 1 << 20 : 4096;
                want_states += ZO_ALIGN_UP(n * 4, a) + 2 * ZO_ALIGN_UP(n * zo_dtype_size(c[k].sdt), a);
            }
        ck_assert_uint_eq(c[k].nvme ? f.nvme_state_bytes : f.host_state_bytes, want_states);
        ck_assert_uint_eq(c[k].nvme ? f.host_state_bytes : f.nvme_state_bytes, 0);
        if (c[k].budget) {
            /* a budget one byte short of the least is refused by both */
            eng_free(&e);
            eng_config(&e, &m);
            e.cfg.dpu = c[k].dpu;
            e.cfg.grad_accum_steps = c[k].accum;
            if (c[k].nvme) {
                e.cfg.placement = ZO_OPTIM_PLACE_NVME;
                e.cfg.nvme_path = dir;
            }
            e.grp[0].state_dtype = e.grp[1].state_dtype = c[k].sdt;
            e.cfg.pinned_bytes = f.pinned_min_bytes - (c[k].nvme ? f.pool_slots * f.pool_slot_bytes : 1);
            ck_assert_int_eq(zo_optim_estimate(&e.cfg, -1, &f), ZO_EBUDGET);
            ck_assert_int_eq(zo_optim_create(&e.o, &e.cfg), ZO_EBUDGET);
        }
        zo__optim_force_copy = 0;
        eng_free(&e);
        if (dir[0])
            zo_test_rmtree(dir);
    }
    /* what create refuses, estimate refuses with the same code */
    model m;
    eng e;
    model_init(&m, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    eng_config(&e, &m);
    zo_optim_footprint f = {.struct_size = sizeof(f)};
    e.cfg.param_dtype = ZO_DTYPE_COUNT;
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, -1, &f), ZO_ECONFIG);
    e.cfg.param_dtype = ZO_DTYPE_BF16;
    e.cfg.buffer_count = 2;
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, -1, &f), ZO_ECONFIG);
    e.cfg.buffer_count = 4;
    e.names[3] = e.names[0];
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, -1, &f), -EEXIST);
    e.names[3] = tnames[3];
    e.grp[1].sub_group_size = 8;
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, -1, &f), ZO_ECONFIG);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "sub_group_size"));
    e.grp[1].sub_group_size = 0;
    /* no device: the kind argument decides; a device backend stages */
    e.cfg.dev = NULL;
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, 7, &f), -EINVAL);
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, ZO_DEV_CUDA, &f), 0);
    ck_assert_uint_eq(f.staging_bytes, e.cfg.grad_staging_bytes);
    ck_assert_uint_eq(f.param_buffer_bytes, m.total * 2);
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, ZO_DEV_HOST, &f), 0);
    ck_assert_uint_eq(f.staging_bytes, 0);
    ck_assert_uint_eq(f.param_buffer_bytes, 0);
    f.struct_size = 8;
    ck_assert_int_eq(zo_optim_estimate(&e.cfg, ZO_DEV_HOST, &f), -EINVAL);
    ck_assert_int_eq(zo_optim_estimate(NULL, ZO_DEV_HOST, &f), -EINVAL);
    e.cfg.dev = e.dev;
    eng_free(&e);
}
END_TEST

/* accumulate an fp32 host gradient into the reference */
static void ref_grad_f32(ref *r, int i, const float *g)
{
    float *a = r->acc + r->m->off[i];
    for (uint64_t k = 0; k < r->m->numel[i]; k++)
        a[k] = r->first[i] ? g[k] : a[k] + g[k];
    r->first[i] = 0;
}

/* A bf16 window through everything that reads it, bit for bit against the
 * fp32 reference: intake statistics, clipping, an overflow skip, and the
 * spills (a second gradient, an fp32 host gradient) in both step modes and
 * both intake paths (in place on the host backend, staging and copies). */
START_TEST(test_optim_grad_window_spill)
{
    int spec = _i & 1, copy = _i >> 1;
    zo__optim_force_copy = copy;
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    /* the speculative step rolls back what clipping or an overflow
     * invalidates (not bit-exact): it runs without either */
    e.cfg.max_grad_norm = spec ? 0.0 : 1.0;
    e.cfg.nonfinite = ZO_OPTIM_NONFINITE_SKIP;
    e.cfg.clip_mode = spec ? ZO_OPTIM_CLIP_SPECULATIVE : ZO_OPTIM_CLIP_TWO_PASS;
    eng_create(&e);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
    ck_assert_int_eq(info.grad_buffer_dtype, ZO_DTYPE_BF16);
    const uint64_t narrow = m.total * 2;
    ck_assert_uint_eq(info.grad_buffer_bytes, narrow);
    float *f32 = malloc(m.numel[3] * 4);
    int clipped = 0;
    for (int s = 1; s <= 5; s++) {
        uint64_t spill = 0;
        for (int i = NT - 1; i >= 0; i--) {
            fill_grad(&e, i, s, 1.0);
            if (s == 4 && i == 3 && !spec)
                zo_test_put(e.dgrad[i], m.gdt, 70000, NAN); /* in the tensor's second sub-group */
            if ((s == 2 || s == 5) && i == 3) {
                /* an fp32 host gradient of a bf16 engine (not exact in bf16): spilled */
                for (uint64_t k = 0; k < m.numel[i]; k++)
                    f32[k] = zo_test_get(e.dgrad[i], m.gdt, k) + 0x1p-12f * (float)(k % 7);
                ref_grad_f32(&r, i, f32);
                ck_assert_int_eq(zo_optim_grad_host(e.o, (unsigned)i, f32, ZO_DTYPE_F32), 0);
                spill += m.numel[i] * 4;
                continue;
            }
            ref_grad(&r, i, e.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
            if (!spec && (s == 3 || s == 5) && (i == 1 || i == 3)) {
                /* a second gradient in the window: the sum needs fp32 (the
                 * first is widened behind its own landing) */
                ref_grad(&r, i, e.dgrad[i]);
                ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
                if (!(s == 5 && i == 3))
                    spill += m.numel[i] * 4;
            }
        }
        ck_assert_int_eq(zo_optim_grads_done(e.o), 0);
        ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
        ck_assert_uint_eq(info.grad_buffer_bytes, narrow + spill);
        zo_optim_step_result res = {.struct_size = sizeof(res)};
        int rc = zo_optim_step(e.o, NULL, &res);
        ck_assert_msg(rc == 0, "step %d: %s (%s)", s, zo_strerror(rc), zo_optim_errmsg(e.o));
        double norm = 0;
        int applied = ref_step(&r, 1.0, e.cfg.max_grad_norm, &norm);
        ck_assert_int_eq(applied, !(s == 4 && !spec));
        ck_assert_int_eq(res.skipped, !applied);
        if (applied)
            ck_assert_msg(res.grad_norm == norm, "step %d: norm %a != %a", s, res.grad_norm, norm);
        else
            ck_assert_uint_eq(res.nonfinite, 1);
        clipped += res.clipped;
        zo_optim_timeline tl = {.struct_size = sizeof(tl)};
        ck_assert_int_eq(zo_optim_get_timeline(e.o, &tl), 0);
        /* statistics taken at intake, from the bf16 window (and through the
         * fp32 copy where an fp32 host gradient spilled): no pass of the step's
         * own, except where a second gradient made them stale */
        if (s == 1 || s == 2 || s == 4)
            ck_assert_msg(tl.norm_ns == 0, "step %d: a statistics pass of %llu ns", s, (unsigned long long)tl.norm_ns);
        ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
        ck_assert_uint_eq(info.grad_buffer_bytes, narrow); /* the spills are gone with the window */
        char when[32];
        snprintf(when, sizeof(when), "window step %d", s);
        compare(&e, &r, when);
    }
    if (!spec)
        ck_assert_int_gt(clipped, 0);
    free(f32);
    eng_free(&e);
    ref_free(&r);
    zo__optim_force_copy = 0;
}
END_TEST

/* The eager speculative step walks the sub-groups in the order their
 * gradients completed in the last full window, not in an assumed one: a
 * framework that hands the gradients over in declaration order (not the
 * reverse) gets its sub-groups updated as they complete from the second
 * step on. Bit-identical to the two-pass reference throughout. */
START_TEST(test_optim_eager_learned_order)
{
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e.cfg.clip_mode = ZO_OPTIM_CLIP_SPECULATIVE;
    eng_create(&e);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(e.o, &info), 0);
    /* the last tensor ("norm", group 1) is in the last sub-group only */
    const uint64_t waiting = 1;
    for (int s = 1; s <= 3; s++) {
        zo_optim_info i0 = {.struct_size = sizeof(i0)}, i1 = {.struct_size = sizeof(i1)};
        zo_optim_get_info(e.o, &i0);
        for (int i = 0; i < NT - 1; i++) { /* declaration order, all but the last tensor */
            fill_grad(&e, i, s, 1.0);
            ref_grad(&r, i, e.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
        }
        ck_assert_int_eq(zo_optim_grads_done(e.o), 0);
        uint64_t want = s == 1 ? 0 : info.nsubgroups - waiting;
        for (int t = 0; t < 5000; t++) {
            zo_optim_get_info(e.o, &i1);
            if (i1.eager_subgroups - i0.eager_subgroups >= want && (s > 1 || t >= 50))
                break;
            usleep(1000);
        }
        zo_optim_get_info(e.o, &i1);
        /* step 1 walks in reverse and waits at the last sub-group; later steps
         * update every complete one */
        ck_assert_msg(i1.eager_subgroups - i0.eager_subgroups == want, "step %d: %llu sub-groups updated, want %llu",
                      s, (unsigned long long)(i1.eager_subgroups - i0.eager_subgroups), (unsigned long long)want);
        fill_grad(&e, NT - 1, s, 1.0);
        ref_grad(&r, NT - 1, e.dgrad[NT - 1]);
        ck_assert_int_eq(zo_optim_grad(e.o, NT - 1, e.dgrad[NT - 1], NULL), 0);
        zo_optim_step_result res = {.struct_size = sizeof(res)};
        ck_assert_int_eq(zo_optim_step(e.o, NULL, &res), 0);
        ck_assert_int_eq(res.rolled_back, 0);
        ref_step(&r, 1.0, 0, NULL);
        compare(&e, &r, "learned order");
    }
    eng_free(&e);
    ref_free(&r);
}
END_TEST

/* A full disk under NVMe placement: the states' disk space is allocated
 * and reserved (fallocate) when the engine registers them at create, and a
 * step only overwrites it. So a disk that is full before create fails
 * create (nothing trained, nothing half-written: all before), and a disk
 * that fills up after create fails no step: here every later growth of the
 * swap store fails with ENOSPC (the disk is full) and the steps go on,
 * bit-identical to the reference, without asking for any. (A write error
 * mid-step is test_optim_nvme_diskfull.) */
typedef struct nospace {
    _Atomic int tries;
} nospace;

static int nospace_hook(void *user, const char *path)
{
    (void)path;
    atomic_fetch_add(&((nospace *)user)->tries, 1);
    return -ENOSPC;
}

START_TEST(test_optim_nvme_full_disk_reserved)
{
    char dir[256];
    zo_test_mkdtemp(dir, sizeof(dir));
    zo_swap *swap = nvme_swap(dir, 1); /* one chunk: registering the states must grow the store */
    nospace ns;
    atomic_init(&ns.tries, 0);
    model m;
    ref r;
    eng e;
    setup_nvme(&m, &r, &e, swap);
    /* full before create: create fails, the device params untouched */
    zo__swap_set_grow_hook(swap, nospace_hook, &ns);
    int rc = zo_optim_create(&e.o, &e.cfg);
    ck_assert_msg(rc == -ENOSPC, "create on a full disk: %s (%s)", zo_strerror(rc), zo_last_error_detail());
    ck_assert_ptr_null(e.o);
    ck_assert_int_gt(atomic_load(&ns.tries), 0);
    for (int i = 0; i < NT; i++)
        for (uint64_t k = 0; k < m.numel[i]; k++)
            ck_assert_float_eq(zo_test_get(e.dparam[i], m.pdt, k), zo_test_get(r.out, m.pdt, m.off[i] + k));
    /* room at create; then the disk is full: the steps need none */
    zo__swap_set_grow_hook(swap, NULL, NULL);
    eng_create(&e);
    atomic_store(&ns.tries, 0);
    zo__swap_set_grow_hook(swap, nospace_hook, &ns);
    train(&e, &r, 1, 3);
    ck_assert_int_eq(atomic_load(&ns.tries), 0);
    compare(&e, &r, "disk full after create");
    zo__swap_set_grow_hook(swap, NULL, NULL);
    eng_free(&e);
    ref_free(&r);
    zo_swap_destroy(&swap);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- the framework moves its params (torch: module.to(), p.data = ...) ----------------- */

/* Give every tensor's device params a new buffer (the same bits), tell the
 * engine, and poison the old one, kept in old[] (never written again). */
static void move_params(eng *e, void **old)
{
    size_t pes = zo_dtype_size(e->m->pdt);
    for (int i = 0; i < NT; i++) {
        size_t n = e->m->numel[i] * pes;
        void *nb = NULL;
        ck_assert_int_eq(zo_dev_malloc(e->dev, &nb, n), 0);
        memcpy(nb, e->dparam[i], n);
        int rc = zo_optim_set_dev_param(e->o, (unsigned)i, nb);
        ck_assert_msg(rc == 0, "set_dev_param: %s (%s)", zo_strerror(rc), zo_optim_errmsg(e->o));
        memset(e->dparam[i], 0xA5, n);
        old[i] = e->dparam[i];
        e->dparam[i] = nb;
    }
}

static void old_untouched(eng *e, void **old)
{
    size_t pes = zo_dtype_size(e->m->pdt);
    for (int i = 0; i < NT; i++) {
        const unsigned char *b = old[i];
        for (size_t j = 0; j < e->m->numel[i] * pes; j++)
            ck_assert_msg(b[j] == 0xA5, "tensor %d: the old device params were written at byte %zu", i, j);
        zo_dev_free(e->dev, old[i]);
    }
}

START_TEST(test_optim_move_params)
{
    /* _i: 0 the kernel writes the device params itself (host backend), 1
     * through the parameter buffer and copies (a GPU's path), 2 DPU (the
     * copy at the step call) */
    zo__optim_force_copy = _i == 1;
    model m;
    ref r;
    eng e;
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e.cfg.max_grad_norm = 1.0;
    e.cfg.dpu = _i == 2;
    e.cfg.dpu_warmup_steps = 0;
    eng_create(&e);
    void *old[2][NT];
    int moves = 0;
    for (int s = 1; s <= 4; s++) {
        double scale = zo_optim_loss_scale(e.o);
        for (int i = NT - 1; i >= 0; i--) {
            fill_grad(&e, i, s, scale);
            ref_grad(&r, i, e.dgrad[i]);
            ck_assert_int_eq(zo_optim_grad(e.o, (unsigned)i, e.dgrad[i], NULL), 0);
        }
        zo_optim_step_result res = {.struct_size = sizeof(res)};
        if (_i == 2) {
            ck_assert_int_eq(zo_optim_step_async(e.o, NULL), 0);
            /* the update is in flight: refused, nothing changed */
            void *dummy = e.dparam[0];
            ck_assert_int_eq(zo_optim_set_dev_param(e.o, 0, dummy), ZO_ESTATE);
            ck_assert(strstr(zo_optim_errmsg(e.o), "zo_optim_wait") != NULL);
            ck_assert_int_eq(zo_optim_wait(e.o, &res), 0);
        } else {
            ck_assert_int_eq(zo_optim_step(e.o, NULL, &res), 0);
        }
        double norm = 0;
        ck_assert_int_eq(ref_step(&r, scale, 1.0, &norm), 1);
        char when[48];
        snprintf(when, sizeof(when), "step %d, after %d moves", s, moves);
        compare(&e, &r, when);
        if (s == 1 || s == 2) /* moved twice: the second from the first new buffer */
            move_params(&e, old[moves++]);
    }
    for (int k = 0; k < moves; k++)
        old_untouched(&e, old[k]);
    /* init_from_device reads the masters from the new address (bf16 params
     * widened exactly: the masters become those values) */
    ck_assert_int_eq(zo_optim_init_from_device(e.o), 0);
    for (int i = 0; i < NT; i++) {
        uint64_t n = m.numel[i];
        float *buf = malloc(n * 4);
        ck_assert_ptr_nonnull(buf);
        ck_assert_int_eq(zo_optim_state_export(e.o, (unsigned)i, ZO_OPTIM_STATE_MASTER, buf, ZO_DTYPE_F32, 0, n), 0);
        const uint16_t *d = e.dparam[i];
        for (uint64_t j = 0; j < n; j++) {
            uint32_t bits = (uint32_t)d[j] << 16, got;
            memcpy(&got, &buf[j], 4);
            ck_assert_msg(got == bits, "init_from_device: tensor %d elem %llu: %08x != %08x", i,
                          (unsigned long long)j, got, bits);
        }
        free(buf);
    }
    /* refusals */
    ck_assert_int_eq(zo_optim_set_dev_param(NULL, 0, e.dparam[0]), -EINVAL);
    ck_assert_int_eq(zo_optim_set_dev_param(e.o, NT, e.dparam[0]), -EINVAL);
    ck_assert_int_eq(zo_optim_set_dev_param(e.o, 0, NULL), -EINVAL);
    eng_free(&e);
    ref_free(&r);
    zo__optim_force_copy = 0;
    /* a group without device params: its tensors have nothing to re-point */
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e.grp[1].dev_params = NULL;
    {
        int rc = zo_optim_create(&e.o, &e.cfg);
        ck_assert_msg(rc == 0, "create: %s (%s)", zo_strerror(rc), zo_last_error_detail());
    }
    ck_assert_int_eq(zo_optim_set_dev_param(e.o, NT0, e.dparam[NT0]), -ENOENT);
    ck_assert(strstr(zo_optim_errmsg(e.o), "has no dev_params") != NULL);
    ck_assert_int_eq(zo_optim_set_dev_param(e.o, 0, e.dparam[0]), 0);
    eng_free(&e);
    ref_free(&r);
    /* dpu_double_buffer: the engine's buffer pairs with the framework's */
    setup(&m, &r, &e, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    e.cfg.dpu = 1;
    e.cfg.dpu_double_buffer = 1;
    eng_create(&e);
    ck_assert_int_eq(zo_optim_set_dev_param(e.o, 0, e.dparam[0]), ZO_ENOTSUP);
    ck_assert(strstr(zo_optim_errmsg(e.o), "dpu_double_buffer") != NULL);
    eng_free(&e);
    ref_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("host");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_optim_plain, 0, (int)(sizeof(plain_cases) / sizeof(plain_cases[0])));
    tcase_add_test(tc, test_optim_fp16_scaler);
    tcase_add_test(tc, test_optim_nonfinite_policy);
    tcase_add_loop_test(tc, test_optim_dpu, 0, 2);
    tcase_add_loop_test(tc, test_optim_dpu_double, 0, 3);
    tcase_add_test(tc, test_optim_save_load);
    tcase_add_test(tc, test_optim_export_import);
    tcase_add_loop_test(tc, test_optim_no_grad_skip, 0, 5);
    tcase_add_test(tc, test_optim_speculative);
    tcase_add_test(tc, test_optim_bf16_states);
    tcase_add_test(tc, test_optim_errors);
    tcase_add_test(tc, test_optim_destroy_async);
    tcase_add_test(tc, test_optim_nvme_diskfull);
    tcase_add_test(tc, test_optim_grad_window_size);
    tcase_add_test(tc, test_optim_estimate);
    tcase_add_loop_test(tc, test_optim_grad_window_spill, 0, 4);
    tcase_add_test(tc, test_optim_eager_learned_order);
    tcase_add_test(tc, test_optim_nvme_full_disk_reserved);
    suite_add_tcase(s, tc);
    /* the API contract: what a framework can get wrong is refused, never
     * silently run (CK_RUN_CASE=contract runs these alone) */
    TCase *tcc = tcase_create("contract");
    tcase_set_timeout(tcc, 300);
    tcase_add_loop_test(tcc, test_optim_uninit_masters, 0, 2);
    tcase_add_test(tcc, test_optim_load_fails_midway);
    tcase_add_test(tcc, test_optim_load_tensor_set);
    tcase_add_test(tcc, test_optim_errmsg);
    tcase_add_test(tcc, test_optim_host_malloc);
    tcase_add_test(tcc, test_optim_discard_grads);
    tcase_add_test(tcc, test_optim_nvme_killed_reclaimed);
    tcase_add_loop_test(tcc, test_optim_move_params, 0, 3);
    suite_add_tcase(s, tcc);
    return zo_test_run(s);
}
