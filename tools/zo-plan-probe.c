/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-plan's run probe (zo-plan-probe.h): zo-train's step loop, on a slice
 * of the model, with zo-train's engine configuration.
 */
#include "zo-plan-probe.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>
#include <zoffload/optim_json.h>

#include "tool_common.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct probe {
    zo_dev *dev;
    zo_optim *o;
    unsigned nt;
    uint64_t *numel;
    void **param, **grad;
    train_model model;
    int have_model;
    train_teacher teacher;
    float *x, *y;
    zo_tool_rundir run; /* the NVMe probe's private directory */
} probe;

static void probe_free(probe *p)
{
    zo_optim_destroy(&p->o);
    if (p->have_model)
        train_model_free(&p->model);
    train_teacher_free(&p->teacher);
    free(p->x);
    free(p->y);
    if (p->param)
        for (unsigned i = 0; i < p->nt; i++) {
            if (p->param[i])
                zo_dev_free(p->dev, p->param[i]);
            if (p->grad[i])
                zo_dev_free(p->dev, p->grad[i]);
        }
    free(p->param);
    free(p->grad);
    free(p->numel);
    zo_dev_close(&p->dev);
    /* the engine's swap store unlinks its files when destroyed */
    zo_tool_rundir_remove(&p->run); /* the owner mark is what is left */
}

/* zo-train's gradient hand-over (engine_grad in zo-train.c) */
static int probe_grad(void *user, unsigned tensor, const void *dev_grad, zo_event *ready, const void *host_grad)
{
    (void)host_grad; /* tiled layers only, which the probe does not run */
    return zo_optim_grad((zo_optim *)user, tensor, dev_grad, ready);
}

#define MAX_STEPS 16

/* Per step (or update) samples of each part; the probe reports medians,
 * which a passing burst of other work on the machine moves less than means. */
enum { S_DATA, S_COMPUTE, S_CALL, S_WAIT, S_STEP, S_D2H, S_OPTIM, S_NVR, S_NVW, S_H2D, S_STALL, S_UPDATE, S_N };

typedef struct samples {
    double v[S_N][MAX_STEPS + 1];
    unsigned n[S_N];
} samples;

static void sample(samples *sm, int k, double v)
{
    if (sm->n[k] <= MAX_STEPS)
        sm->v[k][sm->n[k]++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(samples *sm, int k)
{
    unsigned n = sm->n[k];
    if (!n)
        return 0;
    qsort(sm->v[k], n, sizeof(double), cmp_double);
    return n % 2 ? sm->v[k][n / 2] : 0.5 * (sm->v[k][n / 2 - 1] + sm->v[k][n / 2]);
}

static void add_timeline(samples *sm, const zo_optim_timeline *tl)
{
    sample(sm, S_D2H, tl->d2h_ns * 1e-9);
    sample(sm, S_OPTIM, (tl->compute_ns + tl->norm_ns) * 1e-9);
    sample(sm, S_NVR, tl->nvme_read_ns * 1e-9);
    sample(sm, S_NVW, tl->nvme_write_ns * 1e-9);
    sample(sm, S_H2D, tl->h2d_ns * 1e-9);
    sample(sm, S_STALL, tl->stall_ns * 1e-9);
    sample(sm, S_UPDATE, tl->total_ns * 1e-9);
}

int plan_probe_run(const plan_probe_in *in, plan_probe_out *out)
{
    double t_begin = now_s();
    probe p;
    memset(&p, 0, sizeof(p));
    memset(out, 0, sizeof(*out));
    const options *opt = in->opt;
    int r;
    const char *what = "the device";
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    if (opt && (r = zo_dev_kind_parse(opt->backend, &dc.kind)) < 0)
        goto fail;
    if ((r = zo_dev_open(&p.dev, &dc)) < 0)
        goto fail;

    /* the tensors: zo-train's (weights, then biases), or slices of at most 4 M */
    zo_dtype pdt = opt ? in->shape.param_dtype : in->pdt, gdt = opt ? in->shape.grad_dtype : in->gdt;
    unsigned nweights;
    what = "the model";
    if (opt) {
        if ((r = train_model_init(&p.model, p.dev, &in->shape, NULL)) < 0)
            goto fail;
        p.have_model = 1;
        p.nt = train_model_ntensors(&p.model);
        nweights = in->shape.layers;
    } else {
        p.nt = (unsigned)((in->params + (4u << 20) - 1) >> 22);
        nweights = p.nt;
    }
    p.numel = calloc(p.nt, sizeof(uint64_t));
    p.param = calloc(p.nt, sizeof(void *));
    p.grad = calloc(p.nt, sizeof(void *));
    r = -ENOMEM;
    if (!p.numel || !p.param || !p.grad)
        goto fail;
    for (unsigned i = 0; i < p.nt; i++) {
        p.numel[i] = opt ? train_model_numel(&p.model, i)
                         : (i + 1 < p.nt ? 4u << 20 : in->params - ((uint64_t)(p.nt - 1) << 22));
        out->params += p.numel[i];
        if ((r = zo_dev_malloc(p.dev, &p.param[i], p.numel[i] * zo_dtype_size(pdt))) < 0 ||
            (r = zo_dev_malloc(p.dev, &p.grad[i], p.numel[i] * zo_dtype_size(gdt))) < 0)
            goto fail;
    }
    if (opt) {
        p.model.weight = p.param;
        p.model.bias = p.param + nweights;
        p.model.gweight = p.grad;
        p.model.gbias = p.grad + nweights;
        if ((r = train_model_init_params(&p.model)) < 0)
            goto fail;
        r = -ENOMEM;
        if (train_teacher_init(&p.teacher, &in->shape) < 0 ||
            !(p.x = malloc(in->shape.batch * in->shape.width * 4)) ||
            !(p.y = malloc(in->shape.batch * in->shape.width * 4)))
            goto fail;
    } else {
        /* gradients of a plausible size: the update's cost does not depend on them */
        for (unsigned i = 0; i < p.nt; i++) {
            memset(p.param[i], 0, p.numel[i] * zo_dtype_size(pdt));
            if (gdt == ZO_DTYPE_F32)
                for (uint64_t e = 0; e < p.numel[i]; e++)
                    ((float *)p.grad[i])[e] = 1e-3f * (float)((e % 17) + 1);
            else
                for (uint64_t e = 0; e < p.numel[i]; e++)
                    ((uint16_t *)p.grad[i])[e] = gdt == ZO_DTYPE_BF16 ? 0x3a83 : 0x1419; /* ~1e-3 */
        }
    }

    /* the engine: zo-train's configuration (its defaults, the --config
     * file, the flags), the placement in a private directory */
    what = "the engine";
    zo_cpuadam_hparams hp_w, hp_b;
    zo_optim_config cfg;
    zo_optim_config_default(&cfg);
    cfg.dev = p.dev;
    cfg.param_dtype = pdt;
    cfg.grad_dtype = gdt;
    cfg.max_grad_norm = in->clip;
    zo_optim_group grp[2], jgroup;
    zo_optim_group_default(&jgroup);
    jgroup.state_dtype = in->sdt;
    jgroup.state_bits = (uint16_t)in->qbits;
    zo_optim_json *cj = NULL;
    if (opt && opt->config) {
        if ((r = zo_optim_json_load(opt->config, &cj)) < 0 || (r = zo_optim_json_apply(cj, &cfg, &jgroup)) < 0) {
            zo_optim_json_free(&cj);
            what = "the --config file";
            goto fail;
        }
        cfg.param_dtype = pdt;
        cfg.grad_dtype = gdt;
        cfg.max_grad_norm = in->clip;
    }
    hp_w = cfg.hparams;
    hp_w.lr = opt ? opt->lr : 1e-4;
    hp_b = hp_w;
    hp_b.weight_decay = 0;
    cfg.placement = in->nvme ? ZO_OPTIM_PLACE_NVME : ZO_OPTIM_PLACE_HOST;
    cfg.dpu = in->dpu;
    cfg.dpu_warmup_steps = opt && opt->dpu_warmup >= 0 ? (unsigned)opt->dpu_warmup : cfg.dpu_warmup_steps;
    cfg.grad_accum_steps = in->accum ? in->accum : 1;
    if (in->sub_group)
        cfg.sub_group_size = in->sub_group;
    if (in->buffer_count)
        cfg.buffer_count = in->buffer_count;
    cfg.nthreads = in->nthreads ? in->nthreads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    cfg.nvme_path = NULL;
    if (in->nvme) {
        char why[PATH_MAX + 128];
        if (zo_tool_rundir_make(&p.run, "zo-plan-probe", in->nvme_dir, why, sizeof(why)) < 0) {
            r = -(errno ? errno : EIO);
            zo_optim_json_free(&cj);
            fprintf(stderr, "zo-plan: NVMe probe in %s: cannot make its directory: %s\n", in->nvme_dir, why);
            probe_free(&p);
            return r;
        }
        cfg.nvme_path = p.run.path;
    }
    unsigned ngroups = opt ? 2 : 1;
    for (unsigned g = 0; g < ngroups; g++) {
        zo_optim_group_default(&grp[g]);
        grp[g].ntensors = g ? in->shape.layers : nweights;
        grp[g].numel = p.numel + (g ? nweights : 0);
        grp[g].dev_params = p.param + (g ? nweights : 0);
        grp[g].hparams = g ? &hp_b : &hp_w;
        grp[g].state_dtype = jgroup.state_dtype;
        grp[g].state_bits = jgroup.state_bits;
        grp[g].state_block = jgroup.state_block;
    }
    cfg.groups = grp;
    cfg.ngroups = ngroups;
    r = zo_optim_create(&p.o, &cfg);
    zo_optim_json_free(&cj);
    if (r < 0 || (r = zo_optim_init_from_device(p.o)) < 0)
        goto fail;

    /* zo-train's loop: warm-up steps (the first touches every page; under
     * DPU the warm-up boundaries run undelayed and the first delayed step
     * has no update to wait for), then the timed ones */
    what = "a step";
    unsigned warm = 1 + (in->dpu ? cfg.dpu_warmup_steps + 1 : 0), total = warm + in->steps;
    uint64_t micro = 0;
    int64_t last_tl = -1;
    samples sm;
    memset(&sm, 0, sizeof(sm));
    if (total - warm > MAX_STEPS)
        total = warm + MAX_STEPS;
    for (unsigned s = 0; s < total; s++) {
        double t0 = now_s(), data = 0, compute = 0, call = 0, wait = 0;
        for (unsigned k = 0; k < cfg.grad_accum_steps; k++, micro++) {
            double ta = now_s();
            if (opt)
                train_teacher_batch(&p.teacher, micro, p.x, p.y);
            double tc = now_s();
            data += tc - ta;
            double loss;
            if (opt && (r = train_forward(&p.model, p.x, p.y, &loss)) < 0)
                goto fail;
            if ((r = zo_optim_grads_done(p.o)) < 0)
                goto fail;
            if (opt) {
                if ((r = train_backward(&p.model, p.y, zo_optim_loss_scale(p.o), probe_grad, p.o)) < 0)
                    goto fail;
            } else {
                for (unsigned i = 0; i < p.nt; i++)
                    if ((r = zo_optim_grad(p.o, i, p.grad[i], NULL)) < 0)
                        goto fail;
            }
            double tk = now_s();
            compute += tk - tc;
            if ((r = zo_optim_step_async(p.o, NULL)) < 0)
                goto fail;
            call += now_s() - tk;
        }
        zo_optim_info info = {.struct_size = sizeof(info)};
        if ((r = zo_optim_get_info(p.o, &info)) < 0)
            goto fail;
        if (!cfg.dpu || !info.dpu_active) {
            double tw = now_s();
            if ((r = zo_optim_wait(p.o, NULL)) < 0)
                goto fail;
            wait = now_s() - tw;
        }
        double dt = now_s() - t0;
        zo_optim_timeline tl = {.struct_size = sizeof(tl)};
        if (s >= warm) {
            out->steps++;
            sample(&sm, S_DATA, data);
            sample(&sm, S_COMPUTE, compute);
            sample(&sm, S_CALL, call);
            sample(&sm, S_WAIT, wait);
            sample(&sm, S_STEP, dt);
            /* each update once (under DPU the latest finished one can show twice) */
            if (zo_optim_get_timeline(p.o, &tl) == 0 && tl.step != last_tl) {
                add_timeline(&sm, &tl);
                last_tl = tl.step;
            }
        } else if (zo_optim_get_timeline(p.o, &tl) == 0) {
            last_tl = tl.step;
        }
    }
    if ((r = zo_optim_wait(p.o, NULL)) < 0)
        goto fail;
    if (in->dpu) {
        /* the update started by the last timed step ran in its shadow */
        zo_optim_timeline tl = {.struct_size = sizeof(tl)};
        if (zo_optim_get_timeline(p.o, &tl) == 0 && tl.step != last_tl)
            add_timeline(&sm, &tl);
    }
    out->data = median(&sm, S_DATA);
    out->compute = median(&sm, S_COMPUTE);
    out->call = median(&sm, S_CALL);
    out->wait = median(&sm, S_WAIT);
    out->step = median(&sm, S_STEP);
    out->d2h = median(&sm, S_D2H);
    out->optim = median(&sm, S_OPTIM);
    out->nvme_read = median(&sm, S_NVR);
    out->nvme_write = median(&sm, S_NVW);
    out->h2d = median(&sm, S_H2D);
    out->stall = median(&sm, S_STALL);
    out->update = median(&sm, S_UPDATE);
    probe_free(&p);
    out->setup = now_s() - t_begin;
    return 0;
fail:
    fprintf(stderr, "zo-plan: run probe: %s: %s (%s)\n", what, zo_strerror(r),
            p.o ? zo_optim_errmsg(p.o) : zo_last_error_detail());
    probe_free(&p);
    return r < 0 ? r : -EIO;
}
