/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo_optim with quantized moments (zo_optim_group.state_bits 8 and 4) on the
 * host device backend, host and NVMe placement (real store, real swap
 * files): the engine against a reference run of zo_cpuadam_team_qstep() on
 * plain per-sub-group arrays (the same gradients, norm, clip coefficient),
 * bit for bit over several steps; export / import (dequantized, and raw:
 * zo_optim_qstate_export / import), save / load, and what create refuses.
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "zo_test.h"
#include "zo_test_dtype.h"

#define NTHREADS 2
#define SGSIZE 65536u

/* group 0: AdamW, q8, a tensor cut across sub-groups and small ones packed
 * (pieces that cross tensors); group 1: Adam with L2 decay, q4, odd sizes
 * (partial last blocks, an odd count of 4-bit codes) */
static const uint64_t g0_numel[] = {1536, 70001, 5, 129000};
static const uint64_t g1_numel[] = {4099, 61};
enum { NT0 = 4, NT1 = 2, NT = NT0 + NT1 };
static const char *const tnames[NT] = {"tok", "fc1", "b1", "fc2", "out", "ln"};

/* The engine's v map for `bits` (zo__q_default_maps()): q4's has no zero. */
static zo_qmap vmap(int bits)
{
    return bits == 4 ? ZO_QMAP_DYNAMIC_UNSIGNED_NZ : ZO_QMAP_DYNAMIC_UNSIGNED;
}

typedef struct qsg { /* one sub-group of the reference */
    int g;
    uint64_t off, n;
    uint8_t *mc, *vc;
    float *ms, *vs;
} qsg;

typedef struct run {
    zo_dtype pdt;
    uint64_t numel[NT], off[NT], total, goff[2], gn[2];
    int bits[2];
    zo_cpuadam_hparams hp[2];
    zo_qmap mm, mv; /* the maps set (zo_optim_config.state_map_m / _v); ZO_QMAP_COUNT: the defaults */
    /* reference */
    float *master;
    void *out;
    qsg sg[8];
    unsigned nsg;
    int64_t step;
    zo_cpuadam_team *team;
    /* engine */
    zo_dev *dev;
    void *dparam[NT], *dgrad[NT];
    zo_optim_config cfg;
    zo_optim_group grp[2];
    zo_optim *o;
    char dir[256];
} run;

static float init_param(uint64_t e)
{
    return (float)(0.5 * cos(0.001 * (double)e + 0.3));
}

static float grad_value(uint64_t e, int s)
{
    double amp = (s % 2) ? 1e-1 : 1e-3; /* odd steps clipped at max norm 1 */
    return (float)(amp * sin(0.003 * (double)e + 0.7 * s) + 1e-4 * cos(0.01 * (double)e));
}

static void run_init(run *r, int nvme, int q0, int q1)
{
    memset(r, 0, sizeof(*r));
    r->pdt = ZO_DTYPE_BF16;
    r->bits[0] = q0;
    r->bits[1] = q1;
    r->mm = r->mv = ZO_QMAP_COUNT;
    uint64_t off = 0;
    for (int i = 0; i < NT; i++) {
        r->numel[i] = i < NT0 ? g0_numel[i] : g1_numel[i - NT0];
        r->off[i] = off;
        off += r->numel[i];
        if (i == NT0 - 1)
            r->gn[0] = off;
    }
    r->total = off;
    r->goff[1] = r->gn[0];
    r->gn[1] = off - r->gn[0];
    ck_assert_int_eq(zo_cpuadam_hparams_default(&r->hp[0], ZO_OPTIM_ADAMW), 0);
    r->hp[0].lr = 1e-2;
    ck_assert_int_eq(zo_cpuadam_hparams_default(&r->hp[1], ZO_OPTIM_ADAM), 0);
    r->hp[1].lr = 5e-3;
    r->hp[1].weight_decay = 1e-2;
    /* reference */
    r->master = calloc(r->total, 4);
    r->out = calloc(r->total, 2);
    for (uint64_t e = 0; e < r->total; e++) {
        zo_test_put(r->out, r->pdt, e, init_param(e));
        r->master[e] = zo_test_get(r->out, r->pdt, e);
    }
    for (int g = 0; g < 2; g++)
        for (uint64_t o = 0; o < r->gn[g]; o += SGSIZE) {
            qsg *s = &r->sg[r->nsg++];
            s->g = g;
            s->off = r->goff[g] + o;
            s->n = r->gn[g] - o < SGSIZE ? r->gn[g] - o : SGSIZE;
            s->mc = calloc(s->n, 1); /* fresh: codes 0, scales 0 */
            s->vc = calloc(s->n, 1);
            s->ms = calloc(s->n / 64 + 1, 4);
            s->vs = calloc(s->n / 64 + 1, 4);
        }
    zo_cpuadam_team_config tc;
    zo_cpuadam_team_config_default(&tc);
    tc.nthreads = NTHREADS;
    ck_assert_int_eq(zo_cpuadam_team_create(&r->team, &tc), 0);
    /* engine */
    ck_assert_int_eq(zo_dev_open(&r->dev, NULL), 0);
    for (int i = 0; i < NT; i++) {
        ck_assert_int_eq(zo_dev_malloc(r->dev, &r->dparam[i], r->numel[i] * 2), 0);
        ck_assert_int_eq(zo_dev_malloc(r->dev, &r->dgrad[i], r->numel[i] * 2), 0);
        memcpy(r->dparam[i], (char *)r->out + r->off[i] * 2, r->numel[i] * 2);
    }
    zo_optim_config_default(&r->cfg);
    r->cfg.dev = r->dev;
    r->cfg.param_dtype = r->pdt;
    r->cfg.sub_group_size = SGSIZE;
    r->cfg.nthreads = NTHREADS;
    r->cfg.max_grad_norm = 1.0;
    r->cfg.grad_staging_bytes = 64 << 10;
    if (nvme) {
        zo_test_mkdtemp(r->dir, sizeof(r->dir));
        r->cfg.placement = ZO_OPTIM_PLACE_NVME;
        r->cfg.nvme_path = r->dir;
    }
    for (int g = 0; g < 2; g++) {
        zo_optim_group_default(&r->grp[g]);
        r->grp[g].ntensors = g ? NT1 : NT0;
        r->grp[g].numel = g ? g1_numel : g0_numel;
        r->grp[g].names = tnames + (g ? NT0 : 0);
        r->grp[g].dev_params = r->dparam + (g ? NT0 : 0);
        r->grp[g].hparams = &r->hp[g];
        r->grp[g].state_bits = (uint16_t)r->bits[g];
    }
    r->cfg.groups = r->grp;
    r->cfg.ngroups = 2;
}

/* Give r's engine (and its reference) the maps m and v. */
static void run_maps(run *r, zo_qmap m, zo_qmap v)
{
    r->cfg.state_map_m = r->mm = m;
    r->cfg.state_map_v = r->mv = v;
}

/* The map of r's moment k (1 m, 2 v) at `bits`: the one set, else the default. */
static zo_qmap run_map(const run *r, int k, int bits)
{
    zo_qmap set = k == 1 ? r->mm : r->mv;
    if (set != ZO_QMAP_COUNT)
        return set;
    return k == 1 ? ZO_QMAP_DYNAMIC_SIGNED : vmap(bits);
}

/* Load checkpoint `name` under root into r's engine; `what` names the load in a failure. */
static void run_load(run *r, const char *root, const char *name, const char *what)
{
    int rc = zo_optim_load(r->o, root, name, NULL, 0);
    ck_assert_msg(rc == 0, "%s: %s (%s)", what, zo_strerror(rc), zo_optim_errmsg(r->o));
}

static void run_create(run *r)
{
    int rc = zo_optim_create(&r->o, &r->cfg);
    ck_assert_msg(rc == 0, "create: %s (%s)", zo_strerror(rc), zo_last_error_detail());
    ck_assert_int_eq(zo_optim_init_from_device(r->o), 0);
}

static void run_free(run *r)
{
    zo_optim_destroy(&r->o);
    for (int i = 0; i < NT; i++) {
        zo_dev_free(r->dev, r->dparam[i]);
        zo_dev_free(r->dev, r->dgrad[i]);
    }
    zo_dev_close(&r->dev);
    for (unsigned k = 0; k < r->nsg; k++) {
        free(r->sg[k].mc);
        free(r->sg[k].vc);
        free(r->sg[k].ms);
        free(r->sg[k].vs);
    }
    free(r->master);
    free(r->out);
    zo_cpuadam_team_destroy(&r->team);
    if (r->dir[0])
        zo_test_rmtree(r->dir);
}

/* One step with the gradients of step s: the engine's (unless eng is 0)
 * and the reference's (bf16 gradients, kept bf16 in the window; the norm
 * is the sum of per-sub-group statistics in order, as the engine takes it). */
static void run_step(run *r, int s, int eng)
{
    /* the window: bf16 as handed over (one micro-step), or fp32 sums of
     * the micro-steps' gradients in order (accumulation), as the engine's */
    unsigned K = r->cfg.grad_accum_steps;
    zo_dtype wdt = K > 1 ? ZO_DTYPE_F32 : ZO_DTYPE_BF16;
    size_t wes = zo_dtype_size(wdt);
    char *g = calloc(r->total, wes);
    for (unsigned a = 0; a < K; a++) {
        for (int i = 0; i < NT; i++) {
            for (uint64_t k = 0; k < r->numel[i]; k++) {
                zo_test_put(r->dgrad[i], ZO_DTYPE_BF16, k, grad_value(r->off[i] + k, s + 100 * (int)a));
                float f = zo_test_get(r->dgrad[i], ZO_DTYPE_BF16, k);
                zo_test_put(g, wdt, r->off[i] + k, a ? zo_test_get(g, wdt, r->off[i] + k) + f : f);
            }
            if (eng)
                ck_assert_int_eq(zo_optim_grad(r->o, (unsigned)i, r->dgrad[i], NULL), 0);
        }
        if (eng) {
            int rc = zo_optim_step(r->o, NULL, NULL);
            ck_assert_msg(rc == 0, "step %d: %s (%s)", s, zo_strerror(rc), zo_optim_errmsg(r->o));
        }
    }
    double sumsq = 0;
    for (unsigned k = 0; k < r->nsg; k++) {
        zo_grad_stats gs;
        ck_assert_int_eq(zo_cpuadam_team_grad_stats(r->team, g + r->sg[k].off * wes, wdt, r->sg[k].n, &gs), 0);
        sumsq += gs.sumsq;
    }
    double norm = sqrt(sumsq), coef = 1.0 / (norm + 1e-6);
    r->step++;
    for (unsigned k = 0; k < r->nsg; k++) {
        qsg *q = &r->sg[k];
        zo_cpuadam_hparams hp = r->hp[q->g];
        hp.step = r->step;
        hp.clip_coef = coef < 1.0 ? coef : 1.0;
        zo_cpuadam_qtensors t;
        zo_cpuadam_qtensors_default(&t);
        t.n = q->n;
        t.param = r->master + q->off;
        t.grad = g + q->off * wes;
        t.grad_dtype = wdt;
        t.bits = r->bits[q->g];
        t.map_m = run_map(r, 1, t.bits);
        t.map_v = run_map(r, 2, t.bits);
        t.m_codes = q->mc;
        t.m_absmax = q->ms;
        t.v_codes = q->vc;
        t.v_absmax = q->vs;
        t.param_out = (uint16_t *)r->out + q->off;
        t.out_dtype = r->pdt;
        ck_assert_int_eq(zo_cpuadam_team_qstep(r->team, &hp, &t), 0);
    }
    free(g);
}

/* The reference's moment k (1 m, 2 v) over flat [e0, e0 + n), dequantized. */
static void ref_state(const run *r, int k, uint64_t e0, uint64_t n, float *x)
{
    for (unsigned j = 0; j < r->nsg; j++) {
        const qsg *q = &r->sg[j];
        if (q->off + q->n <= e0 || q->off >= e0 + n)
            continue;
        int b = r->bits[q->g];
        float *all = malloc(q->n * 4);
        ck_assert_int_eq(zo_cpuadam_dequantize(k == 1 ? q->mc : q->vc, k == 1 ? q->ms : q->vs, q->n,
                                               run_map(r, k, b), b,
                                               b == 4 ? 128 : 256, all),
                         0);
        for (uint64_t e = q->off > e0 ? q->off : e0; e < q->off + q->n && e < e0 + n; e++)
            x[e - e0] = all[e - q->off];
        free(all);
    }
}

/* masters, moments (dequantized) and device params equal the reference's, bit for bit */
static void compare(run *r, const char *when)
{
    for (int i = 0; i < NT; i++) {
        uint64_t n = r->numel[i];
        float *got = malloc(n * 4), *want = malloc(n * 4);
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(zo_optim_state_export(r->o, (unsigned)i, (zo_optim_state)k, got, ZO_DTYPE_F32, 0, n), 0);
            if (k == 0)
                memcpy(want, r->master + r->off[i], n * 4);
            else
                ref_state(r, k, r->off[i], n, want);
            for (uint64_t j = 0; j < n; j++)
                ZO_EXPECT(memcmp(&got[j], &want[j], 4) == 0, "%s: tensor %d state %d elem %llu: %a != %a", when, i,
                          k, (unsigned long long)j, (double)got[j], (double)want[j]);
        }
        void *dev = NULL; /* the buffer the next forward reads (the second one under double-buffered DPU) */
        ck_assert_int_ge(zo_optim_param_device(r->o, (unsigned)i, &dev, NULL), 0);
        ck_assert_msg(memcmp(dev, (char *)r->out + r->off[i] * 2, n * 2) == 0,
                      "%s: device params of tensor %d differ", when, i);
        free(got);
        free(want);
    }
}

/* engine internals: the parameter buffer and copies on the host backend
 * too (the path a GPU takes), instead of the kernel writing params in place */
extern int zo__optim_force_copy;

/* _i: bit 0 NVMe placement, bit 1 the copy path, bit 2 q4 / q8 swapped */
START_TEST(test_q_step_matches_kernel)
{
    run r;
    zo__optim_force_copy = (_i >> 1) & 1;
    run_init(&r, _i & 1, _i & 4 ? 4 : 8, _i & 4 ? 8 : 4);
    run_create(&r);
    zo__optim_force_copy = 0;
    compare(&r, "fresh");
    char when[32];
    for (int s = 1; s <= 4; s++) {
        run_step(&r, s, 1);
        snprintf(when, sizeof(when), "step %d", s);
        compare(&r, when);
    }
    /* the moments really are quantized: group 0's m takes at most 256 (q8)
     * or 16 (q4) values per block */
    float *m = malloc(r.numel[3] * 4);
    ck_assert_int_eq(zo_optim_state_export(r.o, 3, ZO_OPTIM_STATE_EXP_AVG, m, ZO_DTYPE_F32, 0, r.numel[3]), 0);
    int distinct = 0;
    for (uint64_t j = 1; j < 256; j++)
        distinct += m[j] != m[0];
    ck_assert_int_gt(distinct, 0);
    free(m);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(r.o, &info), 0);
    if (_i & 1) {
        /* NVMe: each step read and wrote masters and the quantized states,
         * far less than fp32 states (12 B per element) */
        ck_assert_uint_gt(info.nvme_read_bytes_total, 4 * 4 * r.total);
        ck_assert_uint_lt(info.nvme_read_bytes_total, 4 * 12 * r.total);
    }
    run_free(&r);
}
END_TEST

/* Under DPU (0: one param buffer, copied; 1: double-buffered device
 * params, with two micro-steps a step), host and NVMe placement: the same bits. The gradients do not
 * depend on the params, so the delay changes nothing, and each
 * zo_optim_step() ends it. */
START_TEST(test_q_dpu)
{
    run r;
    run_init(&r, _i >> 1, 8, 4);
    r.cfg.dpu = 1;
    r.cfg.dpu_double_buffer = _i & 1;
    r.cfg.grad_accum_steps = 1 + (_i & 1); /* and accumulation (an fp32 window) */
    run_create(&r);
    char when[32];
    for (int s = 1; s <= 4; s++) {
        run_step(&r, s, 1);
        snprintf(when, sizeof(when), "dpu step %d", s);
        compare(&r, when);
    }
    run_free(&r);
}
END_TEST

/* Import quantizes (values read back within the block's quantization
 * error), export dequantizes to fp32 and to bf16 (the fp32 values rounded). */
START_TEST(test_q_export_import)
{
    run r;
    run_init(&r, _i, 8, 4);
    run_create(&r);
    for (int i = 0; i < NT; i++) {
        uint64_t n = r.numel[i];
        float *x = malloc(n * 4), *y = malloc(n * 4);
        uint16_t *h = malloc(n * 2);
        for (int k = 1; k <= 2; k++) {
            for (uint64_t j = 0; j < n; j++)
                x[j] = (float)((k == 1 ? sin(0.01 * (double)j) : 1.5 + cos(0.02 * (double)j)) * 1e-3);
            ck_assert_int_eq(zo_optim_state_import(r.o, (unsigned)i, (zo_optim_state)k, x, ZO_DTYPE_F32, 0, n), 0);
            ck_assert_int_eq(zo_optim_state_export(r.o, (unsigned)i, (zo_optim_state)k, y, ZO_DTYPE_F32, 0, n), 0);
            for (uint64_t j = 0; j < n; j++) {
                /* within the quantization error of the block: 8 bits ~1%, 4 bits ~20% of absmax */
                double tol = (r.bits[i < NT0 ? 0 : 1] == 8 ? 0.02 : 0.3) * 1e-3 * (k == 2 ? 2.5 : 1.0);
                ZO_EXPECT(fabs((double)y[j] - (double)x[j]) <= tol, "tensor %d state %d elem %llu: %g for %g", i, k,
                          (unsigned long long)j, (double)y[j], (double)x[j]);
            }
            /* bf16 export: the fp32 values rounded */
            ck_assert_int_eq(zo_optim_state_export(r.o, (unsigned)i, (zo_optim_state)k, h, ZO_DTYPE_BF16, 0, n), 0);
            for (uint64_t j = 0; j < n; j++) {
                uint16_t w;
                zo_test_put(&w, ZO_DTYPE_BF16, 0, y[j]);
                ZO_EXPECT(w == h[j], "bf16 export elem %llu", (unsigned long long)j);
            }
        }
        free(x);
        free(y);
        free(h);
    }
    run_free(&r);
}
END_TEST

/* A tensor at the start of a sub-group, imported whole, holds exactly the
 * kernel's quantization of the values (codes and scales, read back). */
START_TEST(test_q_import_exact)
{
    run r;
    run_init(&r, 0, 8, 4);
    run_create(&r);
    /* tok (1536 elements) starts sub-group 0 of group 0; out (4099)
     * starts group 1's only sub-group: import both whole, with the rest of
     * those sub-groups zero (fresh), and compare with quantize of the
     * sub-group's values */
    const int which[2] = {0, 4};
    for (int w = 0; w < 2; w++) {
        int i = which[w], b = w ? 4 : 8;
        size_t B = b == 4 ? 128 : 256;
        uint64_t n = r.numel[i];
        uint64_t sgn = w ? r.gn[1] : SGSIZE;
        float *x = calloc(sgn, 4), *want = malloc(sgn * 4), *y = malloc(n * 4);
        uint8_t *c = calloc(sgn, 1);
        float *s = calloc(sgn / 64 + 1, 4);
        for (uint64_t j = 0; j < n; j++)
            x[j] = (float)(1e-2 * sin(0.05 * (double)j));
        ck_assert_int_eq(zo_optim_state_import(r.o, (unsigned)i, ZO_OPTIM_STATE_EXP_AVG, x, ZO_DTYPE_F32, 0, n), 0);
        ck_assert_int_eq(zo_optim_state_export(r.o, (unsigned)i, ZO_OPTIM_STATE_EXP_AVG, y, ZO_DTYPE_F32, 0, n), 0);
        ck_assert_int_eq(zo_cpuadam_quantize(x, sgn, ZO_QMAP_DYNAMIC_SIGNED, b, B, c, s), 0);
        ck_assert_int_eq(zo_cpuadam_dequantize(c, s, sgn, ZO_QMAP_DYNAMIC_SIGNED, b, B, want), 0);
        for (uint64_t j = 0; j < n; j++)
            ZO_EXPECT(memcmp(&y[j], &want[j], 4) == 0, "tensor %d elem %llu: %a != %a", i, (unsigned long long)j,
                      (double)y[j], (double)want[j]);
        free(x);
        free(want);
        free(y);
        free(c);
        free(s);
    }
    run_free(&r);
}
END_TEST

/* Two engines alike (q8 and q4 groups), created and initialised, with
 * their references: one to run, one to take its state. */
static void run_pair(run *a, run *b, int nvme)
{
    run_init(a, nvme, 8, 4);
    run_init(b, nvme, 8, 4);
    run_create(a);
    run_create(b);
}

/* b took a's state after a's two steps: b's reference takes them too, b
 * equals it, and both engines take the same third step. */
static void pair_go_on(run *a, run *b, const char *when)
{
    run_step(b, 1, 0);
    run_step(b, 2, 0);
    compare(b, when);
    run_step(a, 3, 1);
    run_step(b, 3, 1);
    compare(a, "a step 3");
    compare(b, "b step 3");
}

/* Save after two steps; a second engine loads it and both take the same
 * third step: the same masters, moments and params (the codes and scales
 * were saved as they are). Host and NVMe placement. */
START_TEST(test_q_save_load)
{
    run a, b;
    run_pair(&a, &b, _i);
    char root[256];
    zo_test_mkdtemp(root, sizeof(root));
    run_step(&a, 1, 1);
    run_step(&a, 2, 1);
    ck_assert_int_eq(zo_optim_save(a.o, root, "q", 1, NULL), 0);
    int rc = zo_optim_load(b.o, root, "q", NULL, 0);
    ck_assert_msg(rc == 0, "load: %s (%s)", zo_strerror(rc), zo_optim_errmsg(b.o));
    pair_go_on(&a, &b, "loaded");
    /* not into an engine of another layout */
    run c;
    run_init(&c, _i, 8, 4);
    c.cfg.sub_group_size = SGSIZE / 2;
    run_create(&c);
    ck_assert_int_eq(zo_optim_load(c.o, root, "q", NULL, 0), ZO_EFORMAT);
    run_free(&c);
    run_free(&a);
    run_free(&b);
    zo_test_rmtree(root);
}
END_TEST

/* Export every state of every tensor as fp32 into x[NT][3][numel]. */
static float **export_all(run *r)
{
    float **x = calloc(NT * 3, sizeof(*x));
    for (int i = 0; i < NT; i++)
        for (int k = 0; k < 3; k++) {
            x[i * 3 + k] = malloc(r->numel[i] * 4);
            ck_assert_int_eq(zo_optim_state_export(r->o, (unsigned)i, (zo_optim_state)k, x[i * 3 + k], ZO_DTYPE_F32,
                                                   0, r->numel[i]),
                             0);
        }
    return x;
}

static void free_all(float **x)
{
    for (int i = 0; i < NT * 3; i++)
        free(x[i]);
    free(x);
}

/* State k of every tensor of x (export_all()) into flat[r->total]; then
 * into back[]: with `requant` (a moment) the engine's quantization of it
 * with the engine's maps, per sub-group (what a converting load stores),
 * else a copy. */
static void requantized(const run *r, float **x, int k, int requant, float *flat, float *back)
{
    for (int i = 0; i < NT; i++)
        memcpy(flat + r->off[i], x[i * 3 + k], r->numel[i] * 4);
    memcpy(back, flat, r->total * 4);
    for (unsigned j = 0; j < r->nsg && requant; j++) {
        const qsg *q = &r->sg[j];
        int bits = r->bits[q->g];
        size_t B = bits == 4 ? 128 : 256;
        zo_qmap map = run_map(r, k, bits);
        uint8_t *c = malloc(q->n);
        float *sc = malloc((q->n / 64 + 1) * 4);
        ck_assert_int_eq(zo_cpuadam_quantize(flat + q->off, q->n, map, bits, B, c, sc), 0);
        ck_assert_int_eq(zo_cpuadam_dequantize(c, sc, q->n, map, bits, B, back + q->off), 0);
        free(c);
        free(sc);
    }
}

/* a: an engine of q8 and q4 groups (NVMe placement with nvme) that took
 * two steps and saved them as `name` under root; returns its states
 * (export_all()). */
static float **trained_saved(run *a, int nvme, const char *root, const char *name)
{
    run_init(a, nvme, 8, 4);
    run_create(a);
    run_step(a, 1, 1);
    run_step(a, 2, 1);
    ck_assert_int_eq(zo_optim_save(a->o, root, name, 0, NULL), 0);
    return export_all(a);
}

/* Loads across state types: a q8/q4 checkpoint into fp32 states holds the
 * dequantized moments exactly; saved again and loaded into q8/q4 states,
 * the kernel's quantization of those; into bf16 states, the moments
 * rounded. Host and NVMe placement. */
START_TEST(test_q_load_across_types)
{
    char root[256];
    zo_test_mkdtemp(root, sizeof(root));
    run a, f, b, h;
    float **xa = trained_saved(&a, _i, root, "q");
    run_init(&f, _i, 0, 0);
    run_create(&f);
    run_load(&f, root, "q", "q -> f32");
    float **xf = export_all(&f);
    for (int i = 0; i < NT * 3; i++)
        ck_assert_msg(memcmp(xa[i], xf[i], a.numel[i / 3] * 4) == 0, "q -> f32: tensor %d state %d", i / 3, i % 3);
    ck_assert_int_eq(zo_optim_save(f.o, root, "f", 0, NULL), 0);
    run_init(&b, _i, 8, 4);
    run_create(&b);
    run_load(&b, root, "f", "f32 -> q");
    /* back in q8/q4: the masters as they were; each moment the kernel's
     * quantization of the dequantized values, per sub-group. v comes back
     * bit for bit (its map holds 1.0, so a block's largest value is its
     * absmax again); so does a block of m whose largest magnitude is
     * positive, while one whose is negative (the signed map ends at
     * -0.994 or -0.887) is rescaled. */
    float **xb = export_all(&b);
    float *flat = malloc(a.total * 4), *back = malloc(a.total * 4);
    for (int k = 0; k < 3; k++) {
        requantized(&a, xa, k, k != 0, flat, back);
        if (k == 2)
            ck_assert(memcmp(flat, back, a.total * 4) == 0);
        for (int i = 0; i < NT; i++)
            ck_assert_msg(memcmp(back + a.off[i], xb[i * 3 + k], a.numel[i] * 4) == 0,
                          "q -> f32 -> q: tensor %d state %d", i, k);
    }
    free(flat);
    free(back);
    /* and it trains on from there */
    run_step(&b, 3, 1);
    /* into bf16 states: each moment rounded to bf16 */
    run_init(&h, _i, 0, 0);
    h.grp[0].state_dtype = h.grp[1].state_dtype = ZO_DTYPE_BF16;
    run_create(&h);
    run_load(&h, root, "q", "q -> bf16");
    for (int i = 0; i < NT; i++) {
        uint16_t *y = malloc(a.numel[i] * 2);
        ck_assert_int_eq(zo_optim_state_export(h.o, (unsigned)i, ZO_OPTIM_STATE_EXP_AVG_SQ, y, ZO_DTYPE_BF16, 0,
                                               a.numel[i]),
                         0);
        for (uint64_t j = 0; j < a.numel[i]; j++) {
            uint16_t w;
            zo_test_put(&w, ZO_DTYPE_BF16, 0, xa[i * 3 + 2][j]);
            ZO_EXPECT(w == y[j], "q -> bf16: tensor %d elem %llu", i, (unsigned long long)j);
        }
        free(y);
    }
    free_all(xa);
    free_all(xb);
    free_all(xf);
    run_free(&a);
    run_free(&f);
    run_free(&b);
    run_free(&h);
    zo_test_rmtree(root);
}
END_TEST

extern int zo__optim_legacy_qmaps;

/* The engine record's state types of checkpoint `name` ("states":[...]). */
static char *record_states(const char *root, const char *name)
{
    zo_ckpt_reader *rd = NULL;
    ck_assert_int_eq(zo_ckpt_open(&rd, root, name), 0);
    const char *js = zo_ckpt_user_json(rd), *p = js ? strstr(js, "\"states\":[") : NULL;
    ck_assert_ptr_nonnull(p);
    char *s = strndup(p, (size_t)(strchr(p, ']') - p + 1));
    zo_ckpt_close(&rd);
    return s;
}

/* A checkpoint of the format before the maps were recorded (state types
 * "q8/256", "q4/128"; v of q4 in the dynamic map, which has a 0), as the
 * test hook makes the engine write it, loads into today's engine: masters
 * and m (same map) bit for bit, and q4's v, whose map now has no 0, as the
 * kernel's requantization of the old codes' values per sub-group (not the
 * old codes read with the new map). Today's checkpoints record the maps. */
START_TEST(test_q_load_legacy_record)
{
    char root[256];
    zo_test_mkdtemp(root, sizeof(root));
    run a, b;
    zo__optim_legacy_qmaps = 1;
    run_init(&a, _i, 8, 4);
    run_create(&a);
    zo__optim_legacy_qmaps = 0;
    run_step(&a, 1, 1);
    run_step(&a, 2, 1);
    /* the test's smooth gradients leave no v small enough to read 0: give
     * the q4 tensors a v spanning six decades (as a real model's does) */
    for (int i = NT0; i < NT; i++) {
        float *x = malloc(a.numel[i] * 4);
        for (uint64_t j = 0; j < a.numel[i]; j++)
            x[j] = (float)(1e-3 * pow(10.0, -6.0 * fmod(0.37 * (double)j, 1.0)));
        ck_assert_int_eq(zo_optim_state_import(a.o, (unsigned)i, ZO_OPTIM_STATE_EXP_AVG_SQ, x, ZO_DTYPE_F32, 0,
                                               a.numel[i]),
                         0);
        free(x);
    }
    zo__optim_legacy_qmaps = 1;
    ck_assert_int_eq(zo_optim_save(a.o, root, "old", 0, NULL), 0);
    zo__optim_legacy_qmaps = 0;
    char *st = record_states(root, "old");
    ck_assert_msg(strcmp(st, "\"states\":[\"q8/256\",\"q4/128\"]") == 0, "old record: %s", st);
    free(st);
    float **xa = export_all(&a);
    /* the old v map does round small v of q4 to exactly 0 in nonzero blocks */
    size_t zeros = 0;
    for (int i = NT0; i < NT; i++)
        for (uint64_t j = 0; j < a.numel[i]; j++)
            zeros += xa[i * 3 + 2][j] == 0.0f;
    ck_assert_uint_gt(zeros, 0);
    run_init(&b, _i, 8, 4);
    run_create(&b);
    int rc = zo_optim_load(b.o, root, "old", NULL, 0);
    ck_assert_msg(rc == 0, "legacy load: %s (%s)", zo_strerror(rc), zo_optim_errmsg(b.o));
    float **xb = export_all(&b);
    float *flat = malloc(a.total * 4), *want = malloc(a.total * 4);
    for (int k = 0; k < 3; k++) {
        /* masters and m (same map) as they were; v converted */
        requantized(&a, xa, k, k == 2, flat, want);
        for (int i = 0; i < NT; i++)
            ck_assert_msg(memcmp(want + a.off[i], xb[i * 3 + k], a.numel[i] * 4) == 0, "legacy: tensor %d state %d",
                          i, k);
    }
    /* q4's v changed (no zeros left in its blocks), q8's did not */
    for (int i = NT0; i < NT; i++)
        for (uint64_t j = 0; j < a.numel[i]; j++)
            ZO_EXPECT(xb[i * 3 + 2][j] != 0.0f || xa[i * 3 + 1][j] == 0.0f, "tensor %d v[%llu] still 0", i,
                      (unsigned long long)j);
    free(flat);
    free(want);
    /* it trains on, and its own checkpoints record the maps */
    run_step(&b, 3, 1);
    ck_assert_int_eq(zo_optim_save(b.o, root, "new", 0, NULL), 0);
    st = record_states(root, "new");
    char exp[96];
    snprintf(exp, sizeof(exp), "\"states\":[\"q8/256/%d/%d\",\"q4/128/%d/%d\"]", ZO_QMAP_DYNAMIC_SIGNED,
             vmap(8), ZO_QMAP_DYNAMIC_SIGNED, vmap(4));
    ck_assert_msg(strcmp(st, exp) == 0, "new record: %s", st);
    free(st);
    free_all(xa);
    free_all(xb);
    run_free(&a);
    run_free(&b);
    zo_test_rmtree(root);
}
END_TEST

/* The maps the caller chose (zo_optim_config.state_map_m / _v: the linear
 * ones) are the kernel's: the engine equals zo_cpuadam_team_qstep() with
 * those maps bit for bit, and reports them. _i: bit 0 NVMe placement, bit
 * 1 q4 / q8 swapped. */
START_TEST(test_q_maps_match_kernel)
{
    run r;
    run_init(&r, _i & 1, _i & 2 ? 4 : 8, _i & 2 ? 8 : 4);
    run_maps(&r, ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_LINEAR_UNSIGNED_NZ);
    run_create(&r);
    zo_optim_qstate_info qi = {.struct_size = sizeof(qi)};
    ck_assert_int_eq(zo_optim_get_qstate_info(r.o, 0, &qi), 0);
    ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_EXP_AVG], ZO_QMAP_LINEAR_SIGNED);
    ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_EXP_AVG_SQ], ZO_QMAP_LINEAR_UNSIGNED_NZ);
    char when[32];
    for (int s = 1; s <= 3; s++) {
        run_step(&r, s, 1);
        snprintf(when, sizeof(when), "linear maps, step %d", s);
        compare(&r, when);
    }
    /* and the maps matter: the default maps' reference has other moments */
    run d;
    run_init(&d, 0, r.bits[0], r.bits[1]);
    for (int s = 1; s <= 3; s++)
        run_step(&d, s, 0);
    uint64_t n = r.numel[3];
    float *x = malloc(n * 4), *y = malloc(n * 4);
    for (int k = 1; k <= 2; k++) {
        ref_state(&r, k, r.off[3], n, x);
        ref_state(&d, k, d.off[3], n, y);
        ck_assert_msg(memcmp(x, y, n * 4) != 0, "moment %d: the linear maps changed nothing", k);
    }
    free(x);
    free(y);
    run_free(&d);
    run_free(&r);
}
END_TEST

/* A checkpoint of the default maps loads into an engine of the linear
 * maps: masters as they were, each moment the kernel's quantization of
 * the dequantized old one with the new map (close to it); that engine's
 * checkpoints record its maps, reload bit for bit into an engine of the
 * same maps and convert back into one of the defaults. Host and NVMe. */
START_TEST(test_q_maps_save_load)
{
    char root[256];
    zo_test_mkdtemp(root, sizeof(root));
    run a, b, c, d;
    float **xa = trained_saved(&a, _i, root, "dflt");
    run_init(&b, _i, 8, 4);
    run_maps(&b, ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_LINEAR_UNSIGNED_NZ);
    run_create(&b);
    run_load(&b, root, "dflt", "default -> linear");
    float **xb = export_all(&b);
    float *flat = malloc(a.total * 4), *want = malloc(a.total * 4);
    for (int k = 0; k < 3; k++) {
        requantized(&b, xa, k, k != 0, flat, want);
        for (int i = 0; i < NT; i++) {
            ck_assert_msg(memcmp(want + a.off[i], xb[i * 3 + k], a.numel[i] * 4) == 0,
                          "default -> linear: tensor %d state %d", i, k);
            /* close to the originals: within a linear step of the block's absmax */
            for (uint64_t j = 0; j < a.numel[i] && k; j++) {
                float o = xa[i * 3 + k][j], g = xb[i * 3 + k][j];
                ZO_EXPECT(fabsf(g - o) <= 0.15f * fabsf(o) + 1e-3f, "tensor %d state %d elem %llu: %g from %g", i,
                          k, (unsigned long long)j, (double)g, (double)o);
            }
        }
        if (k)
            ck_assert_msg(memcmp(flat, want, a.total * 4) != 0, "state %d: converted to the same values", k);
    }
    run_step(&b, 3, 1);
    ck_assert_int_eq(zo_optim_save(b.o, root, "lin", 0, NULL), 0);
    char *st = record_states(root, "lin"), exp[96];
    snprintf(exp, sizeof(exp), "\"states\":[\"q8/256/%d/%d\",\"q4/128/%d/%d\"]", ZO_QMAP_LINEAR_SIGNED,
             ZO_QMAP_LINEAR_UNSIGNED_NZ, ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_LINEAR_UNSIGNED_NZ);
    ck_assert_msg(strcmp(st, exp) == 0, "linear record: %s", st);
    free(st);
    free_all(xb);
    xb = export_all(&b);
    /* the same maps: bit for bit, and both train on alike */
    run_init(&c, _i, 8, 4);
    run_maps(&c, ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_LINEAR_UNSIGNED_NZ);
    run_create(&c);
    run_load(&c, root, "lin", "linear -> linear");
    float **xc = export_all(&c);
    for (int i = 0; i < NT * 3; i++)
        ck_assert_msg(memcmp(xb[i], xc[i], a.numel[i / 3] * 4) == 0, "linear -> linear: tensor %d state %d", i / 3,
                      i % 3);
    run_step(&b, 4, 1);
    run_step(&c, 4, 1);
    free_all(xb);
    free_all(xc);
    xb = export_all(&b);
    xc = export_all(&c);
    for (int i = 0; i < NT * 3; i++)
        ck_assert_msg(memcmp(xb[i], xc[i], a.numel[i / 3] * 4) == 0, "step 4: tensor %d state %d", i / 3, i % 3);
    free_all(xb);
    /* back into the default maps: converted */
    run_init(&d, _i, 8, 4);
    run_create(&d);
    ck_assert_int_eq(zo_optim_save(c.o, root, "lin4", 0, NULL), 0);
    run_load(&d, root, "lin4", "linear -> default");
    float **xd = export_all(&d);
    for (int k = 0; k < 3; k++) {
        requantized(&d, xc, k, k != 0, flat, want);
        for (int i = 0; i < NT; i++)
            ck_assert_msg(memcmp(want + a.off[i], xd[i * 3 + k], a.numel[i] * 4) == 0,
                          "linear -> default: tensor %d state %d", i, k);
    }
    free(flat);
    free(want);
    free_all(xa);
    free_all(xc);
    free_all(xd);
    run_free(&a);
    run_free(&b);
    run_free(&c);
    run_free(&d);
    zo_test_rmtree(root);
}
END_TEST

/* The crash test's writer (this program run as `crash-writer ROOT SWAPDIR
 * FD` by the test, forked and exec'd): an engine with q8/q4 states on
 * NVMe continues from the latest checkpoint, then steps and saves, keeping
 * two, writing a byte to saved_fd after each save, until it is killed.
 * Exits 3 on an error. */
static void crash_writer(const char *root, const char *swapdir, int saved_fd)
{
    zo_log_set_level(ZO_LOG_OFF);
    run r;
    run_init(&r, 0, 8, 4);
    r.cfg.placement = ZO_OPTIM_PLACE_NVME;
    r.cfg.nvme_path = swapdir;
    int rc = zo_optim_create(&r.o, &r.cfg);
    if (rc < 0 || (rc = zo_optim_load(r.o, root, NULL, NULL, 0)) < 0) {
        fprintf(stderr, "crash writer: %s (%s)\n", zo_strerror(rc), zo_last_error_detail());
        _exit(3);
    }
    zo_optim_info info = {.struct_size = sizeof(info)};
    if (zo_optim_get_info(r.o, &info) < 0)
        _exit(3);
    for (int s = (int)info.step + 1;; s++) {
        char name[32];
        snprintf(name, sizeof(name), "s%d", s);
        rc = 0;
        for (int i = 0; i < NT && rc == 0; i++) {
            for (uint64_t k = 0; k < r.numel[i]; k++)
                zo_test_put(r.dgrad[i], ZO_DTYPE_BF16, k, grad_value(r.off[i] + k, s));
            rc = zo_optim_grad(r.o, (unsigned)i, r.dgrad[i], NULL);
        }
        if (rc == 0)
            rc = zo_optim_step(r.o, NULL, NULL);
        if (rc == 0 && (rc = zo_optim_save(r.o, root, name, 2, NULL)) == -EEXIST)
            continue; /* a killed writer published it and died before moving `latest`: this step moved
                         nothing, so the parent is told only after the next save (it counts advances) */
        if (rc < 0 || write(saved_fd, "s", 1) != 1) {
            fprintf(stderr, "crash writer: step %d: %s (%s)\n", s, zo_strerror(rc), zo_optim_errmsg(r.o));
            _exit(3);
        }
    }
}

static char **writer_args; /* ROOT SWAPDIR FD */

START_TEST(test_q_crash_writer)
{
    crash_writer(writer_args[0], writer_args[1], atoi(writer_args[2]));
}
END_TEST

/* The latest checkpoint loads (into host placement) and holds exactly the
 * reference's masters, moments and params after its step count. */
static int64_t crash_check(const char *root)
{
    run q;
    run_init(&q, 0, 8, 4);
    run_create(&q);
    int rc = zo_optim_load(q.o, root, NULL, NULL, 0);
    ck_assert_msg(rc == 0, "load latest: %s (%s)", zo_strerror(rc), zo_optim_errmsg(q.o));
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(q.o, &info), 0);
    for (int s = 1; s <= info.step; s++)
        run_step(&q, s, 0);
    compare(&q, "after the kill");
    run_free(&q);
    return info.step;
}

/* kill -9 while an engine with q8/q4 states on NVMe saves in a loop: every
 * time, the latest checkpoint is complete and loads, at the same or a later
 * step, and is that step's exact state. */
START_TEST(test_q_crash_during_save)
{
    char dir[256], root[300], swapdir[300];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(root, sizeof(root), "%s/ck", dir);
    /* the first checkpoint, and how long a step and a save take */
    run a;
    run_init(&a, 1, 8, 4);
    run_create(&a);
    run_step(&a, 1, 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(zo_optim_save(a.o, root, "s1", 2, NULL), 0);
    run_step(&a, 2, 1);
    ck_assert_int_eq(zo_optim_save(a.o, root, "s2", 2, NULL), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    run_free(&a);
    long per_us = (long)((t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000) / 2 + 1;
    int64_t last = crash_check(root);
    ck_assert_int_eq(last, 2);
    zo_test_rng rng = {zo_test_seed() ^ 0x9a8};
    int advanced = 0;
    for (int kill_no = 0; kill_no < 12; kill_no++) {
        snprintf(swapdir, sizeof(swapdir), "%s/swap%d", dir, kill_no);
        ck_assert_int_eq(mkdir(swapdir, 0700), 0);
        int saved[2];
        ck_assert_int_eq(pipe(saved), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            /* a fresh process: this one's OpenMP threads do not survive a fork */
            char fd[16];
            snprintf(fd, sizeof(fd), "%d", saved[1]);
            close(saved[0]);
            execl("/proc/self/exe", "test_optim_q", "crash-writer", root, swapdir, fd, (char *)NULL);
            _exit(77); /* cannot run itself: qemu-user without binfmt_misc cannot exec a foreign binary */
        }
        close(saved[1]);
        /* once the child has saved one, anywhere in its next two or so */
        char c;
        if (read(saved[0], &c, 1) != 1) {
            int st;
            ck_assert_int_eq(waitpid(pid, &st, 0), pid);
            close(saved[0]);
            if (kill_no == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 77) {
                fprintf(stderr, "q crash test skipped: this process cannot exec itself (an emulator without "
                                "binfmt_misc); the native runs do it\n");
                zo_test_rmtree(dir);
                return;
            }
            ck_abort_msg("the crash writer ended before its first save (status 0x%x)", st);
        }
        uint64_t delay = zo_test_next(&rng) % (2 * (uint64_t)per_us + 1);
        struct timespec ts = {(time_t)(delay / 1000000u), (long)(delay % 1000000u) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        close(saved[0]); /* open until now: the writer's next write must not raise SIGPIPE */
        ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "writer ended by itself (status 0x%x)", st);
        int64_t k = crash_check(root);
        ck_assert_msg(k >= last, "latest went back from step %lld to %lld", (long long)last, (long long)k);
        advanced += k > last;
        last = k;
        zo_test_rmtree(swapdir);
    }
    fprintf(stderr, "q crash test: 12 kills, latest advanced %d times, at step %lld\n", advanced, (long long)last);
    ck_assert_int_ge(advanced, 12); /* each writer saved at least once before its kill */
    zo_test_rmtree(dir);
}
END_TEST

/* A map is signed (m) when its table starts below 0, unsigned (v) when it starts at 0. */
static float qmap_first(int32_t map, int bits)
{
    float v[256];
    ck_assert_int_eq(zo_cpuadam_qmap_values((zo_qmap)map, bits, v), bits == 4 ? 16 : 256);
    return v[0];
}

/* Sub-group k's raw state s (1 m, 2 v) of engine o into fresh buffers. */
static void raw_get(zo_optim *o, unsigned k, int s, const zo_optim_qstate_info *qi, uint8_t **c, float **sc)
{
    *c = malloc(qi->code_bytes);
    *sc = malloc(qi->nscales * 4 + 4);
    int rc = zo_optim_qstate_export(o, k, (zo_optim_state)s, *c, qi->code_bytes, *sc, qi->nscales);
    ck_assert_msg(rc == 0, "qstate_export sg %u state %d: %s (%s)", k, s, zo_strerror(rc), zo_optim_errmsg(o));
}

/* Every sub-group's raw codes and scales equal the reference kernel's
 * arrays bit for bit (zo_optim_get_qstate_info() describes them). Imported into
 * a second engine (with the masters and the step count) they are stored as
 * they are (exported again: the same bytes), and the next step of both
 * engines gives the same masters, moments, codes and params. Host and NVMe. */
START_TEST(test_q_raw_round_trip)
{
    run a, b;
    run_pair(&a, &b, _i);
    run_step(&a, 1, 1);
    run_step(&a, 2, 1);
    zo_optim_info info = {.struct_size = sizeof(info)};
    ck_assert_int_eq(zo_optim_get_info(a.o, &info), 0);
    ck_assert_uint_eq(info.nsubgroups, a.nsg);
    for (unsigned k = 0; k < a.nsg; k++) {
        const qsg *q = &a.sg[k];
        int bits = a.bits[q->g];
        zo_optim_qstate_info qi = {.struct_size = sizeof(qi)};
        ck_assert_int_eq(zo_optim_get_qstate_info(a.o, k, &qi), 0);
        ck_assert_uint_eq(qi.group, (unsigned)q->g);
        ck_assert_uint_eq(qi.offset, q->off - a.goff[q->g]);
        ck_assert_uint_eq(qi.numel, q->n);
        ck_assert_int_eq(qi.bits, bits);
        ck_assert_uint_eq(qi.block, bits == 4 ? 128u : 256u);
        ck_assert_uint_eq(qi.code_bytes, bits == 4 ? (q->n + 1) / 2 : q->n);
        ck_assert_uint_eq(qi.nscales, (q->n + qi.block - 1) / qi.block);
        ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_MASTER], -1);
        ck_assert(qmap_first(qi.map[ZO_OPTIM_STATE_EXP_AVG], bits) < 0);
        /* v's map is unsigned; q4's has no zero (a small v must not read 0) */
        ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_EXP_AVG_SQ],
                         bits == 4 ? ZO_QMAP_DYNAMIC_UNSIGNED_NZ : ZO_QMAP_DYNAMIC_UNSIGNED);
        ck_assert(bits == 4 ? qmap_first(qi.map[ZO_OPTIM_STATE_EXP_AVG_SQ], bits) > 0
                            : qmap_first(qi.map[ZO_OPTIM_STATE_EXP_AVG_SQ], bits) == 0);
        for (int s = 1; s <= 2; s++) {
            uint8_t *c, *c2;
            float *sc, *sc2;
            raw_get(a.o, k, s, &qi, &c, &sc);
            ck_assert_msg(memcmp(c, s == 1 ? q->mc : q->vc, qi.code_bytes) == 0, "sg %u state %d: codes", k, s);
            ck_assert_msg(memcmp(sc, s == 1 ? q->ms : q->vs, qi.nscales * 4) == 0, "sg %u state %d: scales", k, s);
            int rc = zo_optim_qstate_import(b.o, k, (zo_optim_state)s, c, qi.code_bytes, sc, qi.nscales);
            ck_assert_msg(rc == 0, "qstate_import: %s (%s)", zo_strerror(rc), zo_optim_errmsg(b.o));
            raw_get(b.o, k, s, &qi, &c2, &sc2);
            ck_assert(memcmp(c, c2, qi.code_bytes) == 0 && memcmp(sc, sc2, qi.nscales * 4) == 0);
            free(c);
            free(sc);
            free(c2);
            free(sc2);
        }
    }
    /* the masters (fp32, exact through the plain export) and the count */
    for (int i = 0; i < NT; i++) {
        float *x = malloc(a.numel[i] * 4);
        ck_assert_int_eq(zo_optim_state_export(a.o, (unsigned)i, ZO_OPTIM_STATE_MASTER, x, ZO_DTYPE_F32, 0, a.numel[i]),
                         0);
        ck_assert_int_eq(zo_optim_state_import(b.o, (unsigned)i, ZO_OPTIM_STATE_MASTER, x, ZO_DTYPE_F32, 0, b.numel[i]),
                         0);
        free(x);
    }
    ck_assert_int_eq(zo_optim_set_step(b.o, 2), 0);
    ck_assert_int_eq(zo_optim_push_params(b.o), 0);
    pair_go_on(&a, &b, "raw imported");
    for (unsigned k = 0; k < a.nsg; k++) {
        zo_optim_qstate_info qi = {.struct_size = sizeof(qi)};
        ck_assert_int_eq(zo_optim_get_qstate_info(a.o, k, &qi), 0);
        for (int s = 1; s <= 2; s++) {
            uint8_t *c, *c2;
            float *sc, *sc2;
            raw_get(a.o, k, s, &qi, &c, &sc);
            raw_get(b.o, k, s, &qi, &c2, &sc2);
            ck_assert_msg(memcmp(c, c2, qi.code_bytes) == 0 && memcmp(sc, sc2, qi.nscales * 4) == 0,
                          "step 3: sg %u state %d differs", k, s);
            free(c);
            free(sc);
            free(c2);
            free(sc2);
        }
    }
    run_free(&a);
    run_free(&b);
}
END_TEST

/* Under DPU an export called while the update runs waits for it: it gives
 * the codes of the step just queued. */
START_TEST(test_q_raw_waits_for_update)
{
    run r;
    run_init(&r, 0, 8, 4);
    r.cfg.dpu = 1;
    run_create(&r);
    run_step(&r, 1, 1);
    for (int i = 0; i < NT; i++) {
        for (uint64_t k = 0; k < r.numel[i]; k++)
            zo_test_put(r.dgrad[i], ZO_DTYPE_BF16, k, grad_value(r.off[i] + k, 2));
        ck_assert_int_eq(zo_optim_grad(r.o, (unsigned)i, r.dgrad[i], NULL), 0);
    }
    ck_assert_int_eq(zo_optim_step_async(r.o, NULL), 0);
    zo_optim_qstate_info qi[8];
    uint8_t *c[8][3];
    float *sc[8][3];
    for (unsigned k = 0; k < r.nsg; k++) {
        qi[k].struct_size = sizeof(qi[k]);
        ck_assert_int_eq(zo_optim_get_qstate_info(r.o, k, &qi[k]), 0);
        for (int s = 1; s <= 2; s++)
            raw_get(r.o, k, s, &qi[k], &c[k][s], &sc[k][s]);
    }
    run_step(&r, 2, 0); /* the reference's step 2 (the engine is done with the gradients) */
    for (unsigned k = 0; k < r.nsg; k++)
        for (int s = 1; s <= 2; s++) {
            ck_assert_msg(memcmp(c[k][s], s == 1 ? r.sg[k].mc : r.sg[k].vc, qi[k].code_bytes) == 0 &&
                              memcmp(sc[k][s], s == 1 ? r.sg[k].ms : r.sg[k].vs, qi[k].nscales * 4) == 0,
                          "sg %u state %d: not step 2's", k, s);
            free(c[k][s]);
            free(sc[k][s]);
        }
    zo_optim_step_result res = {.struct_size = sizeof(res)};
    ck_assert_int_eq(zo_optim_wait(r.o, &res), 0);
    compare(&r, "dpu step 2");
    run_free(&r);
}
END_TEST

/* The raw calls' refusals, each with nothing written: a small engine with a
 * q4 AdamW group of an odd element count (a pad nibble), an fp32 group and
 * a q8 Lion group (no v). Any codes and scales a step could have stored
 * are stored bit for bit and read by the dequantizing export as they are.
 * After a failed load the states are undefined: ZO_ESTATE. */
START_TEST(test_q_raw_refusals)
{
    static const uint64_t n0[] = {101, 30}, n1[] = {10}, n2[] = {64};
    zo_dev *dev;
    ck_assert_int_eq(zo_dev_open(&dev, NULL), 0);
    zo_optim_config cfg;
    zo_optim_config_default(&cfg);
    cfg.dev = dev;
    cfg.param_dtype = ZO_DTYPE_F32;
    cfg.nthreads = NTHREADS;
    zo_cpuadam_hparams hw, hl;
    ck_assert_int_eq(zo_cpuadam_hparams_default(&hw, ZO_OPTIM_ADAMW), 0);
    ck_assert_int_eq(zo_cpuadam_hparams_default(&hl, ZO_OPTIM_LION), 0);
    zo_optim_group g[3];
    const uint64_t *ns[3] = {n0, n1, n2};
    const unsigned nts[3] = {2, 1, 1};
    for (int k = 0; k < 3; k++) {
        zo_optim_group_default(&g[k]);
        g[k].ntensors = nts[k];
        g[k].numel = ns[k];
        g[k].hparams = k == 2 ? &hl : &hw;
    }
    g[0].state_bits = 4;
    g[2].state_bits = 8;
    cfg.groups = g;
    cfg.ngroups = 3;
    zo_optim *o = NULL;
    int rc = zo_optim_create(&o, &cfg);
    ck_assert_msg(rc == 0, "create: %s (%s)", zo_strerror(rc), zo_last_error_detail());
    float zero[131] = {0};
    for (unsigned i = 0; i < 4; i++) {
        uint64_t n;
        ck_assert_int_eq(zo_optim_tensor_get(o, i, &n, NULL, NULL), 0);
        ck_assert_int_eq(zo_optim_state_import(o, i, ZO_OPTIM_STATE_MASTER, zero, ZO_DTYPE_F32, 0, n), 0);
    }
    zo_optim_qstate_info qi = {.struct_size = sizeof(qi)}, qf = {.struct_size = sizeof(qf)};
    ck_assert_int_eq(zo_optim_get_qstate_info(o, 0, &qi), 0);
    ck_assert_int_eq(qi.bits, 4);
    ck_assert_uint_eq(qi.numel, 131);
    ck_assert_uint_eq(qi.code_bytes, 66);
    ck_assert_uint_eq(qi.nscales, 2);
    /* an fp32 group's sub-group is described, with no codes */
    ck_assert_int_eq(zo_optim_get_qstate_info(o, 1, &qf), 0);
    ck_assert_int_eq(qf.bits, 0);
    ck_assert_uint_eq(qf.group, 1);
    ck_assert_uint_eq(qf.numel, 10);
    ck_assert_uint_eq(qf.code_bytes, 0);
    for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
        ck_assert_int_eq(qf.map[k], -1);
    zo_optim_qstate_info ql = {.struct_size = sizeof(ql)};
    ck_assert_int_eq(zo_optim_get_qstate_info(o, 2, &ql), 0);
    ck_assert_int_eq(ql.map[ZO_OPTIM_STATE_EXP_AVG_SQ], -1); /* Lion: no v */
    zo_optim_qstate_info small = {.struct_size = 8};
    ck_assert_int_eq(zo_optim_get_qstate_info(o, 0, &small), -EINVAL);
    ck_assert_int_eq(zo_optim_get_qstate_info(o, 3, &qi), -EINVAL);
    ck_assert_int_eq(zo_optim_get_qstate_info(NULL, 0, &qi), -EINVAL);
    ck_assert_int_eq(zo_optim_get_qstate_info(o, 0, NULL), -EINVAL);

    /* any codes and scales are stored as they are, and the dequantizing
     * export reads exactly them; NaN scales (an overflowed block) too */
    uint8_t c[66], c2[66];
    float s[2] = {0.25f, NAN}, s2[3];
    for (int j = 0; j < 66; j++)
        c[j] = (uint8_t)(j * 37 + 11);
    c[65] &= 0x0f; /* the pad nibble */
    ck_assert_int_eq(zo_optim_qstate_import(o, 0, ZO_OPTIM_STATE_EXP_AVG, c, 66, s, 2), 0);
    ck_assert_int_eq(zo_optim_qstate_export(o, 0, ZO_OPTIM_STATE_EXP_AVG, c2, 66, s2, 2), 0);
    ck_assert(memcmp(c, c2, 66) == 0 && memcmp(s, s2, 8) == 0);
    float want[131], got[131];
    ck_assert_int_eq(zo_cpuadam_dequantize(c, s, 131, (zo_qmap)qi.map[ZO_OPTIM_STATE_EXP_AVG], 4, 128, want), 0);
    ck_assert_int_eq(zo_optim_state_export(o, 0, ZO_OPTIM_STATE_EXP_AVG, got, ZO_DTYPE_F32, 0, 101), 0);
    ck_assert_int_eq(zo_optim_state_export(o, 1, ZO_OPTIM_STATE_EXP_AVG, got + 101, ZO_DTYPE_F32, 0, 30), 0);
    ck_assert(memcmp(want, got, sizeof(want)) == 0);
    ck_assert(isnan(got[130]));

#define REFUSED(call, want_rc, needle)                                                                     \
    do {                                                                                                   \
        int rc_ = (call);                                                                                  \
        ck_assert_msg(rc_ == (want_rc), #call ": %d (%s), want %d", rc_, zo_optim_errmsg(o), (want_rc));  \
        ck_assert_msg(strstr(zo_optim_errmsg(o), (needle)) != NULL, #call ": %s", zo_optim_errmsg(o));    \
    } while (0)
    uint8_t bad[66];
    memcpy(bad, c, 66);
    bad[65] |= 0x30;
    REFUSED(zo_optim_qstate_import(o, 0, ZO_OPTIM_STATE_EXP_AVG, bad, 66, s, 2), -EINVAL, "padding");
    float neg[2] = {0.5f, -0.5f}, inf[2] = {INFINITY, 1.0f};
    REFUSED(zo_optim_qstate_import(o, 0, ZO_OPTIM_STATE_EXP_AVG, c, 66, neg, 2), -EINVAL, "absmax 1 is -0.5");
    REFUSED(zo_optim_qstate_import(o, 0, ZO_OPTIM_STATE_EXP_AVG, c, 66, inf, 2), -EINVAL, "absmax 0 is inf");
    REFUSED(zo_optim_qstate_import(o, 0, ZO_OPTIM_STATE_EXP_AVG, c, 65, s, 2), -EINVAL, "66 code bytes");
    REFUSED(zo_optim_qstate_export(o, 0, ZO_OPTIM_STATE_EXP_AVG, c2, 66, s2, 3), -EINVAL, "and 2 scales");
    REFUSED(zo_optim_qstate_export(o, 0, ZO_OPTIM_STATE_MASTER, c2, 66, s2, 2), -EINVAL, "not a moment");
    REFUSED(zo_optim_qstate_export(o, 0, (zo_optim_state)7, c2, 66, s2, 2), -EINVAL, "not a moment");
    REFUSED(zo_optim_qstate_export(o, 0, ZO_OPTIM_STATE_EXP_AVG, NULL, 66, s2, 2), -EINVAL, "NULL codes");
    REFUSED(zo_optim_qstate_import(o, 0, ZO_OPTIM_STATE_EXP_AVG, c, 66, NULL, 2), -EINVAL, "NULL absmax");
    REFUSED(zo_optim_qstate_export(o, 3, ZO_OPTIM_STATE_EXP_AVG, c2, 66, s2, 2), -EINVAL, "out of range");
    REFUSED(zo_optim_qstate_export(o, 1, ZO_OPTIM_STATE_EXP_AVG, c2, 10, s2, 1), ZO_ENOTSUP, "not quantized");
    REFUSED(zo_optim_qstate_import(o, 1, ZO_OPTIM_STATE_EXP_AVG_SQ, c, 10, s, 1), ZO_ENOTSUP, "not quantized");
    REFUSED(zo_optim_qstate_export(o, 2, ZO_OPTIM_STATE_EXP_AVG_SQ, c2, 64, s2, 1), ZO_ENOTSUP, "no state 2");
    ck_assert_int_eq(zo_optim_qstate_export(NULL, 0, ZO_OPTIM_STATE_EXP_AVG, c2, 66, s2, 2), -EINVAL);
    ck_assert_int_eq(zo_optim_qstate_import(NULL, 0, ZO_OPTIM_STATE_EXP_AVG, c, 66, s, 2), -EINVAL);
    /* nothing of the refused imports was written */
    ck_assert_int_eq(zo_optim_qstate_export(o, 0, ZO_OPTIM_STATE_EXP_AVG, c2, 66, s2, 2), 0);
    ck_assert(memcmp(c, c2, 66) == 0 && memcmp(s, s2, 8) == 0);

    /* a load that fails midway leaves the states undefined: refused */
    char root[256];
    zo_test_mkdtemp(root, sizeof(root));
    ck_assert_int_eq(zo_optim_save(o, root, "ck", 0, NULL), 0);
    ck_assert_int_eq(zo_test_ckpt_corrupt(root, "ck", "optim.sg2.exp_avg", 0), 0);
    ck_assert_int_eq(zo_optim_load(o, root, "ck", NULL, 0), ZO_ECORRUPT);
    REFUSED(zo_optim_qstate_export(o, 0, ZO_OPTIM_STATE_EXP_AVG, c2, 66, s2, 2), ZO_ESTATE, "load");
    REFUSED(zo_optim_qstate_import(o, 0, ZO_OPTIM_STATE_EXP_AVG, c, 66, s, 2), ZO_ESTATE, "load");
#undef REFUSED
    zo_test_rmtree(root);
    zo_optim_destroy(&o);
    zo_dev_close(&dev);
}
END_TEST

/* What quantized states cannot do is refused at create, with the reason. */
START_TEST(test_q_refusals)
{
    run r;
    run_init(&r, 0, 8, 8);
    zo_optim *o = NULL;
    zo_optim_config c;
    zo_optim_group g[2];
#define TRY(want, needle)                                                                              \
    do {                                                                                               \
        c.groups = g;                                                                                  \
        int rc_ = zo_optim_create(&o, &c);                                                             \
        ck_assert_msg(rc_ == (want), "rc %d (%s), want %d", rc_, zo_last_error_detail(), (want));      \
        ck_assert_msg(strstr(zo_last_error_detail(), (needle)) != NULL, "detail: %s", zo_last_error_detail()); \
        zo_optim_footprint f_ = {.struct_size = sizeof(f_)};                                           \
        ck_assert_int_eq(zo_optim_estimate(&c, ZO_DEV_HOST, &f_), (want));                             \
        ck_assert_ptr_null(o);                                                                         \
        c = r.cfg;                                                                                     \
        memcpy(g, r.grp, sizeof(g));                                                                   \
    } while (0)
    c = r.cfg;
    memcpy(g, r.grp, sizeof(g));
    zo_cpuadam_hparams ada;
    ck_assert_int_eq(zo_cpuadam_hparams_default(&ada, ZO_OPTIM_ADAGRAD), 0);
    g[1].hparams = &ada;
    TRY(ZO_ENOTSUP, "Adagrad");
    c.clip_mode = ZO_OPTIM_CLIP_SPECULATIVE;
    TRY(ZO_ECONFIG, "rolled back");
    c.no_grad = ZO_OPTIM_NO_GRAD_SKIP;
    TRY(ZO_ECONFIG, "NO_GRAD_SKIP");
    g[0].state_bits = 5;
    TRY(ZO_ECONFIG, "state_bits 5");
    g[0].state_block = 96;
    TRY(ZO_ECONFIG, "power of two");
    g[0].state_block = 8192;
    TRY(ZO_ECONFIG, "power of two");
    g[0].state_dtype = ZO_DTYPE_BF16;
    TRY(ZO_ECONFIG, "leave state_dtype at f32");
#undef TRY
    /* Lion has one moment: fine */
    zo_cpuadam_hparams lion;
    ck_assert_int_eq(zo_cpuadam_hparams_default(&lion, ZO_OPTIM_LION), 0);
    r.grp[1].hparams = &lion;
    run_create(&r);
    run_free(&r);
}
END_TEST

/* What create (and the estimate) refuse of state_map_m / state_map_v: an
 * m map not signed, a v map not signed... unsigned, values out of range,
 * and maps nothing would use (no quantized group; a v map with only Lion,
 * which keeps no v). The accepted ones create. */
START_TEST(test_q_maps_refusals)
{
    run r;
    run_init(&r, 0, 8, 4);
    zo_optim *o = NULL;
    zo_optim_group g[2];
    zo_optim_config c;
    zo_cpuadam_hparams lion;
    ck_assert_int_eq(zo_cpuadam_hparams_default(&lion, ZO_OPTIM_LION), 0);
    static const struct {
        int m, v, q0, q1, lion; /* maps; state_bits of the groups; both groups Lion */
        const char *needle;
    } bad[] = {
        {ZO_QMAP_DYNAMIC_UNSIGNED, ZO_QMAP_COUNT, 8, 4, 0, "state_map_m 1: m is signed"},
        {ZO_QMAP_LINEAR_UNSIGNED_NZ, ZO_QMAP_COUNT, 8, 4, 0, "state_map_m 5: m is signed"},
        {ZO_QMAP_COUNT, ZO_QMAP_DYNAMIC_SIGNED, 8, 4, 0, "state_map_v 0: v is unsigned"},
        {ZO_QMAP_COUNT, ZO_QMAP_LINEAR_SIGNED, 8, 4, 0, "state_map_v 2: v is unsigned"},
        {ZO_QMAP_COUNT + 1, ZO_QMAP_COUNT, 8, 4, 0, "state_map_m 7"},
        {-1, ZO_QMAP_COUNT, 8, 4, 0, "state_map_m -1"},
        {ZO_QMAP_COUNT, 99, 8, 4, 0, "state_map_v 99"},
        {ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_COUNT, 0, 0, 0, "no group has quantized states"},
        {ZO_QMAP_COUNT, ZO_QMAP_LINEAR_UNSIGNED, 0, 0, 0, "no group has a quantized v"},
        {ZO_QMAP_COUNT, ZO_QMAP_LINEAR_UNSIGNED, 8, 4, 1, "no group has a quantized v"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c = r.cfg;
        memcpy(g, r.grp, sizeof(g));
        c.groups = g;
        c.state_map_m = (zo_qmap)bad[i].m;
        c.state_map_v = (zo_qmap)bad[i].v;
        g[0].state_bits = (uint16_t)bad[i].q0;
        g[1].state_bits = (uint16_t)bad[i].q1;
        if (bad[i].lion)
            g[0].hparams = g[1].hparams = &lion;
        int rc = zo_optim_create(&o, &c);
        ck_assert_msg(rc == ZO_ECONFIG, "case %zu: rc %d (%s)", i, rc, zo_last_error_detail());
        ck_assert_msg(strstr(zo_last_error_detail(), bad[i].needle) != NULL, "case %zu: detail: %s", i,
                      zo_last_error_detail());
        ck_assert_ptr_null(o);
        zo_optim_footprint f = {.struct_size = sizeof(f)};
        ck_assert_int_eq(zo_optim_estimate(&c, ZO_DEV_HOST, &f), ZO_ECONFIG);
    }
    /* accepted: an m map with only Lion (its one moment), and every valid pair */
    c = r.cfg;
    memcpy(g, r.grp, sizeof(g));
    c.groups = g;
    g[0].hparams = g[1].hparams = &lion;
    c.state_map_m = ZO_QMAP_LINEAR_SIGNED;
    ck_assert_msg(zo_optim_create(&o, &c) == 0, "Lion with an m map: %s", zo_last_error_detail());
    zo_optim_destroy(&o);
    static const zo_qmap ms[] = {ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_LINEAR_SIGNED};
    static const zo_qmap vs[] = {ZO_QMAP_DYNAMIC_UNSIGNED, ZO_QMAP_LINEAR_UNSIGNED, ZO_QMAP_DYNAMIC_UNSIGNED_NZ,
                                 ZO_QMAP_LINEAR_UNSIGNED_NZ};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            c = r.cfg;
            c.state_map_m = ms[i];
            c.state_map_v = vs[j];
            ck_assert_msg(zo_optim_create(&o, &c) == 0, "maps %d/%d: %s", ms[i], vs[j], zo_last_error_detail());
            zo_optim_qstate_info qi = {.struct_size = sizeof(qi)};
            zo_optim_info info = {.struct_size = sizeof(info)};
            ck_assert_int_eq(zo_optim_get_info(o, &info), 0);
            ck_assert_int_eq(zo_optim_get_qstate_info(o, info.nsubgroups - 1, &qi), 0); /* group 1's (q4) */
            ck_assert_int_eq(qi.bits, 4);
            ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_EXP_AVG], ms[i]);
            ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_EXP_AVG_SQ], vs[j]);
            zo_optim_destroy(&o);
        }
    run_free(&r);
}
END_TEST

/* The estimate knows the quantized bytes, and create makes what it says. */
START_TEST(test_q_estimate)
{
    for (int nvme = 0; nvme <= 1; nvme++) {
        run r;
        run_init(&r, nvme, 8, 4);
        zo_optim_footprint fq = {.struct_size = sizeof(fq)}, f32 = {.struct_size = sizeof(f32)};
        ck_assert_int_eq(zo_optim_estimate(&r.cfg, ZO_DEV_HOST, &fq), 0);
        run_create(&r);
        zo_optim_info info = {.struct_size = sizeof(info)};
        ck_assert_int_eq(zo_optim_get_info(r.o, &info), 0);
        ck_assert_uint_eq(info.pinned_bytes, fq.pinned_bytes);
        ck_assert_uint_eq(info.host_bytes, fq.host_bytes);
        zo_optim_destroy(&r.o);
        /* by hand: per sub-group, fp32 masters, and per moment its codes
         * (64-byte aligned) then one fp32 scale per block */
        uint64_t want = 0, align = nvme ? 1 << 20 : 4096;
        for (unsigned k = 0; k < r.nsg; k++) {
            uint64_t n = r.sg[k].n;
            int b = r.bits[r.sg[k].g];
            uint64_t B = b == 4 ? 128 : 256, codes = b == 4 ? (n + 1) / 2 : n;
            uint64_t q = (codes + 63) / 64 * 64 + 4 * ((n + B - 1) / B);
            want += (n * 4 + align - 1) / align * align + 2 * ((q + align - 1) / align * align);
        }
        if (nvme) {
            ck_assert_uint_eq(fq.nvme_state_bytes, want);
            /* the host tier caches three sub-groups' quantized states */
            ck_assert_uint_gt(fq.host_state_bytes, 0);
        } else {
            ck_assert_uint_eq(fq.host_state_bytes, want);
        }
        r.grp[0].state_bits = r.grp[1].state_bits = 0;
        ck_assert_int_eq(zo_optim_estimate(&r.cfg, ZO_DEV_HOST, &f32), 0);
        /* (NVMe arrays round up to 1 MiB: at this size both take the same) */
        uint64_t qb = nvme ? fq.nvme_state_bytes : fq.host_state_bytes;
        uint64_t fb = nvme ? f32.nvme_state_bytes : f32.host_state_bytes;
        if (nvme)
            ck_assert_uint_le(qb, fb);
        else
            ck_assert_uint_lt(qb, fb);
        run_free(&r);
    }
}
END_TEST

int main(int argc, char **argv)
{
    TCase *tc;
    if (argc == 5 && !strcmp(argv[1], "crash-writer")) {
        /* in a test of its own, where the helpers' ck_asserts may run
         * (and not filtered out by the caller's Check selection) */
        writer_args = argv + 2;
        unsetenv("CK_RUN_SUITE");
        unsetenv("CK_RUN_CASE");
        unsetenv("CK_INCLUDE_TAGS");
        unsetenv("CK_EXCLUDE_TAGS");
        Suite *w = zo_test_suite1("crash-writer", &tc, 0);
        tcase_add_test(tc, test_q_crash_writer);
        SRunner *sr = srunner_create(w);
        srunner_set_fork_status(sr, CK_NOFORK);
        srunner_run_all(sr, CK_SILENT);
        srunner_free(sr);
        return 3; /* the writer only ends by its kill */
    }
    Suite *s = zo_test_suite1("optim-q", &tc, 300);
    tcase_add_loop_test(tc, test_q_step_matches_kernel, 0, 8);
    tcase_add_loop_test(tc, test_q_dpu, 0, 4);
    tcase_add_loop_test(tc, test_q_export_import, 0, 2);
    tcase_add_test(tc, test_q_import_exact);
    tcase_add_loop_test(tc, test_q_save_load, 0, 2);
    tcase_add_loop_test(tc, test_q_load_across_types, 0, 2);
    tcase_add_loop_test(tc, test_q_load_legacy_record, 0, 2);
    tcase_add_test(tc, test_q_crash_during_save);
    tcase_add_test(tc, test_q_refusals);
    tcase_add_loop_test(tc, test_q_raw_round_trip, 0, 2);
    tcase_add_test(tc, test_q_raw_waits_for_update);
    tcase_add_test(tc, test_q_raw_refusals);
    tcase_add_test(tc, test_q_estimate);
    tcase_add_loop_test(tc, test_q_maps_match_kernel, 0, 4);
    tcase_add_loop_test(tc, test_q_maps_save_load, 0, 2);
    tcase_add_test(tc, test_q_maps_refusals);
    return zo_test_run(s);
}
