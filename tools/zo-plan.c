/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-plan: where a model's training state goes with the offload optimizer
 * engine (device, pinned host, pageable host, NVMe), how many bytes each
 * place holds, whether it fits this machine, and the predicted step time
 * split the way zo-train reports it (compute, device->host, optimizer,
 * NVMe read, NVMe write, host->device), from measured bandwidths: a quick
 * probe of this machine or the JSON of zo-aio-bench / zo-adam-bench.
 * --config writes the engine configuration (JSON for zo_optim_json_load()).
 *
 * The engine's byte counts are the library's: zo_optim_estimate() with the
 * configuration zo-train builds (or one group of --params elements), which
 * says what zo_optim_create() allocates: pinned masters and states of host
 * placement, the store's slot pool, gradient staging and parameter buffers
 * (device backends), the gradient windows (pinned on a GPU, pageable on the
 * host backend), NVMe bytes of the swap. zo-plan adds what is not the
 * engine's: device params, grads and activations, zo-train's tiles.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>
#include <zoffload/optim.h>
#include <zoffload/optim_json.h>
#include <zoffload/aio.h>
#include <zoffload/mem.h>

#ifdef ZO_PLAN_CJSON
#include <cjson/cJSON.h>
#endif

#include "tool_common.h"
#include "train_model.h"
#include "train_options.h"
#include "zo-plan-probe.h"
#include "plan_cluster.h"

#define MAX_NVME 8

enum { PROBE_NONE, PROBE_QUICK, PROBE_RUN };

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- inputs ------------------------------------------------------------------------------- */

typedef struct plan_in {
    /* model */
    uint64_t params;        /* total elements */
    unsigned ntensors;
    int from_train;         /* a zo-train command line: activations and compute known */
    train_shape shape;      /* from_train only */
    uint64_t activation_bytes;
    double flops;           /* per micro-step (from_train), else 0 */
    /* zo-train's tiled layers (from_train, the model over the device budget):
     * train_plan_tiles(), the rule zo-train follows */
    int tiled;              /* 1 tiled, 0 not, < 0 not even tiled (ZO_EBUDGET...) */
    uint64_t layer_budget;
    zo_tile_grid grid;
    /* precision and engine */
    zo_dtype pdt, gdt, sdt;
    int qbits; /* --state q8 / q4: quantized m and v (sdt is then fp32) */
    int nvme;               /* placement: 1 NVMe, 0 host */
    int dpu;
    unsigned accum;
    uint64_t sub_group;
    unsigned buffer_count;
    uint64_t staging;
    double clip;
    /* machine */
    uint64_t gpu_mem;       /* 0: unknown */
    const char *gpu_what;
    int gpu;                /* 1: a real GPU (compute overlaps the CPU optimizer) */
    uint64_t ram, memlock;
    const char *paths[MAX_NVME]; /* NVMe directories */
    unsigned nnvme;
    /* bandwidths (bytes/s, params/s, flop/s) and where they came from */
    double nvme_read, nvme_write, adam_rate, copy_bw, gemm_flops;
    char src_nvme[128], src_adam[128], src_copy[128], src_gemm[128];
    /* the run probe (the default): a slice of the model trained for a few
     * steps; ran = 0 when the figures above predict instead */
    int ran;
    options topt;           /* from_train: the zo-train options */
    unsigned probe_layers;  /* from_train: layers of the slice */
    uint64_t probe_size;    /* --probe-size: elements the slice aims at (0: the default) */
    char probe_note[200];   /* why the run probe did not run, when it was asked for */
    plan_probe_out pr;
} plan_in;

static const char *state_name(const plan_in *in)
{
    return zo_tool_state_name(in->sdt, in->qbits);
}

static int parse_tensors(const char *s, plan_in *in)
{
    /* comma list of items: N, RxC or either with *COUNT ("4096x4096*32") */
    const char *p = s;
    in->params = 0;
    in->ntensors = 0;
    while (*p) {
        char item[64];
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof(item))
            return -1;
        memcpy(item, p, n);
        item[n] = 0;
        p += n + (p[n] == ',');
        uint64_t count = 1, a, b = 1;
        char *star = strchr(item, '*');
        if (star) {
            *star = 0;
            if (zo_parse_size(star + 1, &count) < 0 || count == 0)
                return -1;
        }
        char *x = strchr(item, 'x');
        if (x) {
            *x = 0;
            if (zo_parse_size(x + 1, &b) < 0 || b == 0)
                return -1;
        }
        if (zo_parse_size(item, &a) < 0 || a == 0)
            return -1;
        in->params += a * b * count;
        in->ntensors += (unsigned)count;
    }
    return in->ntensors ? 0 : -1;
}

/* ---- probes ----------------------------------------------------------------------------- */

/* The fused AdamW step on 4 M fp32 elements: params per second. */
/* The q8 / q4 step over t's arrays: codes in the first bytes of m and v
 * (fresh: zero), their scales after n codes (the fp32 arrays are far larger). */
static int qstep(const zo_cpuadam_hparams *hp, const zo_cpuadam_tensors *t, int bits, uint8_t *m, uint8_t *v,
                 int nthreads)
{
    zo_cpuadam_qtensors q;
    zo_cpuadam_qtensors_default(&q);
    q.n = t->n;
    q.param = t->param;
    q.grad = t->grad;
    q.bits = bits;
    q.m_codes = m;
    q.v_codes = v;
    q.m_absmax = (float *)(void *)(m + t->n);
    q.v_absmax = (float *)(void *)(v + t->n);
    q.param_out = t->param_out;
    q.out_dtype = t->out_dtype;
    return zo_cpuadam_qstep(hp, &q, nthreads);
}

/* The optimizer's rate, elements per second: the fp32-state kernel, or with
 * qbits the quantized one (what the engine runs for --state q8 / q4). */
static double probe_adam(int nthreads, int qbits)
{
    size_t n = (size_t)4 << 20;
    float *a = NULL, *g = NULL, *m = NULL, *v = NULL;
    uint16_t *out = NULL;
    double best = 0;
    if (zo_aligned_alloc((void **)&a, n * 4, 64) == 0 && zo_aligned_alloc((void **)&g, n * 4, 64) == 0 &&
        zo_aligned_alloc((void **)&m, n * 4, 64) == 0 && zo_aligned_alloc((void **)&v, n * 4, 64) == 0 &&
        zo_aligned_alloc((void **)&out, n * 2, 64) == 0) {
        for (size_t i = 0; i < n; i++) {
            a[i] = 0.01f * (float)(i % 97);
            g[i] = 0.001f * (float)(i % 89) - 0.04f;
            m[i] = v[i] = 0;
        }
        zo_cpuadam_hparams hp;
        zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW);
        zo_cpuadam_tensors t;
        zo_cpuadam_tensors_default(&t);
        t.n = n;
        t.param = a;
        t.grad = g;
        t.exp_avg = m;
        t.exp_avg_sq = v;
        t.param_out = out;
        t.out_dtype = ZO_DTYPE_BF16;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            hp.step = rep + 1;
            if ((qbits ? qstep(&hp, &t, qbits, (uint8_t *)(void *)m, (uint8_t *)(void *)v, nthreads)
                       : zo_cpuadam_step(&hp, &t, nthreads)) < 0)
                break;
            double r = (double)n / (now_s() - t0);
            best = r > best ? r : best;
        }
    }
    zo_aligned_free(a);
    zo_aligned_free(g);
    zo_aligned_free(m);
    zo_aligned_free(v);
    zo_aligned_free(out);
    return best;
}

/* memcpy of 64 MiB: the host backend's device <-> host copies. */
static double probe_copy(void)
{
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            memcpy(b, a, n);
            double r = (double)n / (now_s() - t0);
            best = r > best ? r : best;
        }
    }
    free(a);
    free(b);
    return best;
}

/* The model's GEMM (zo_gemm_async on a host-backend stream, as zo-train
 * runs it) at 1024^3: flop per second; 0 if it cannot run. */
static double probe_gemm(void)
{
    size_t n = 1024;
    zo_dev *dev = NULL;
    zo_stream *s = NULL;
    float *a = NULL, *b = NULL, *c = NULL;
    double best = 0;
    if (zo_dev_open(&dev, NULL) == 0 && zo_stream_create(dev, &s) == 0 &&
        zo_dev_malloc(dev, (void **)&a, n * n * 4) == 0 && zo_dev_malloc(dev, (void **)&b, n * n * 4) == 0 &&
        zo_dev_malloc(dev, (void **)&c, n * n * 4) == 0) {
        for (size_t i = 0; i < n * n; i++) { /* host backend: device memory is host memory */
            a[i] = (float)(i % 13) * 0.1f;
            b[i] = (float)(i % 7) * 0.2f;
        }
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            if (zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_T, n, n, n, 1.0f, a, n, b, n, ZO_DTYPE_F32, 0.0f, c, n) < 0 ||
                zo_stream_sync(s) < 0)
                break;
            double r = 2.0 * (double)n * n * n / (now_s() - t0);
            best = r > best ? r : best;
        }
    }
    zo_stream_destroy(&s);
    if (dev) {
        zo_dev_free(dev, a);
        zo_dev_free(dev, b);
        zo_dev_free(dev, c);
    }
    zo_dev_close(&dev);
    return best;
}

/* The steady state of the engine's swap files: 256 MiB written once into
 * reserved space (untimed, synced), then overwritten and read back through
 * the library's async I/O engine with the engine config's aio defaults
 * (1 MiB blocks, 32 in flight, O_DIRECT where the filesystem allows), in a
 * new 0600 file in dir that is removed. @return 0 or a negative error
 * (message printed). */
static int probe_nvme(const char *dir, double *rd, double *wr)
{
    char path[4096];
    size_t total = (size_t)256 << 20;
    snprintf(path, sizeof(path), "%s/.zo-plan-probe-%ld", dir, (long)getpid());
    zo_aio *aio = NULL;
    zo_file *f = NULL;
    void *buf = NULL;
    int r;
    zo_optim_config oc;
    zo_optim_config_default(&oc); /* the engine's aio.block_size and aio.queue_depth */
    zo_aio_config ac;
    zo_aio_config_default(&ac);
    ac.block_size = oc.aio_block_size;
    ac.queue_depth = oc.aio_queue_depth;
    ac.threads = oc.aio_threads;
    if ((r = zo_aio_create(&aio, &ac)) < 0 || (r = zo_aligned_alloc(&buf, total, 4096)) < 0)
        goto out;
    if ((r = zo_file_open(&f, path, ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_CREATE | ZO_FILE_EXCL |
                                        ZO_FILE_NOFOLLOW)) < 0)
        goto out;
    memset(buf, 0x5a, total);
    /* the swap store writes into space it reserved beforehand: so does the probe */
    if ((r = zo_file_allocate(f, 0, total)) < 0)
        goto out;
    zo_aio_req *req;
    /* the first pass fills the blocks (the engine's files are written at create) */
    if ((r = zo_aio_write(aio, f, buf, total, 0, NULL, NULL, &req)) < 0 || (r = zo_aio_wait(aio, req, NULL)) < 0 ||
        (r = zo_file_sync(f)) < 0)
        goto out;
    double t0 = now_s();
    if ((r = zo_aio_write(aio, f, buf, total, 0, NULL, NULL, &req)) < 0 || (r = zo_aio_wait(aio, req, NULL)) < 0 ||
        (r = zo_file_sync(f)) < 0)
        goto out;
    *wr = (double)total / (now_s() - t0);
    t0 = now_s();
    if ((r = zo_aio_read(aio, f, buf, total, 0, NULL, NULL, &req)) < 0 || (r = zo_aio_wait(aio, req, NULL)) < 0)
        goto out;
    *rd = (double)total / (now_s() - t0);
out:
    if (r < 0)
        fprintf(stderr, "zo-plan: NVMe probe in %s: %s (%s)\n", dir, zo_strerror(r), zo_last_error_detail());
    if (f) {
        zo_file_close(&f);
        unlink(path);
    }
    zo_aio_destroy(&aio);
    zo_aligned_free(buf);
    return r;
}

#ifdef ZO_PLAN_CJSON
/* Bandwidths from a zo-aio-bench or zo-adam-bench --json file: every object
 * with "op" read/write and "bytes_per_s", and "params_per_s". */
static void bench_walk(const cJSON *j, plan_in *in, const char *file)
{
    if (cJSON_IsObject(j)) {
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(j, "op");
        const cJSON *bps = cJSON_GetObjectItemCaseSensitive(j, "bytes_per_s");
        const cJSON *pps = cJSON_GetObjectItemCaseSensitive(j, "params_per_s");
        if (cJSON_IsString(op) && cJSON_IsNumber(bps)) {
            if (!strcmp(op->valuestring, "read")) {
                in->nvme_read = bps->valuedouble;
                snprintf(in->src_nvme, sizeof(in->src_nvme), "%s", file);
            } else if (!strcmp(op->valuestring, "write")) {
                in->nvme_write = bps->valuedouble;
                snprintf(in->src_nvme, sizeof(in->src_nvme), "%s", file);
            }
        }
        if (cJSON_IsNumber(pps) && pps->valuedouble > 0) {
            in->adam_rate = pps->valuedouble;
            snprintf(in->src_adam, sizeof(in->src_adam), "%s", file);
        }
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, j)
        bench_walk(c, in, file);
}
#endif

static int load_bench(const char *file, plan_in *in)
{
#ifdef ZO_PLAN_CJSON
    FILE *f = fopen(file, "re");
    if (!f) {
        fprintf(stderr, "zo-plan: --bench %s: %s\n", file, strerror(errno));
        return -1;
    }
    char *text = malloc(16 << 20);
    size_t n = text ? fread(text, 1, (16 << 20) - 1, f) : 0;
    fclose(f);
    if (!text)
        return -1;
    text[n] = 0;
    /* one JSON value, or one per line (a JSON-lines file) */
    int found = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithOpts(line, &end, 0);
        if (j) {
            bench_walk(j, in, file);
            cJSON_Delete(j);
            found = 1;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    if (!found) {
        fprintf(stderr, "zo-plan: --bench %s: not JSON from zo-aio-bench or zo-adam-bench\n", file);
        return -1;
    }
    return 0;
#else
    (void)in;
    fprintf(stderr, "zo-plan: --bench %s: this build has no JSON parser (cJSON)\n", file);
    return -1;
#endif
}

/* ---- the plan ----------------------------------------------------------------------------- */

typedef struct plan_out {
    uint64_t nsub;                        /* sub-groups */
    uint64_t dev_params, dev_grads, dev_act, dev_tiles, dev_total;
    uint64_t tile_home;                   /* tiled weights in their home (fp32): pinned host or NVMe */
    uint64_t pin_tile_pool;               /* the tile store's slot pool */
    uint64_t pin_states, pin_pool, pin_staging, pin_pbuf, pin_win, pin_total;
    unsigned pool_slots;
    uint64_t pool_slot;
    zo_dtype win_dtype;                   /* the gradient windows' */
    int est_rc;                           /* zo_optim_estimate()'s */
    uint64_t host_acc, host_total;
    uint64_t nvme_bytes;
    uint64_t nvme_free[MAX_NVME];
    int nvme_at;                          /* index of the path that holds it, -1 none */
    /* predicted seconds */
    double data, compute, d2h, optim, nvme_r, nvme_w, h2d, stall, update, step;
    double scale;                         /* run probe: the model's parameters over the slice's */
    /* fit */
    int fits;
    char why[8][200];
    int nwhy;
} plan_out;

__attribute__((format(printf, 2, 3))) static void say(plan_out *p, const char *fmt, ...)
{
    if (p->nwhy < 8) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->why[p->nwhy++], sizeof(p->why[0]), fmt, ap);
        va_end(ap);
    }
}

/* What the engine allocates for this plan, asked of the library with the
 * configuration zo-train builds (tools/zo-train.c: two groups, weights then
 * biases; tiled weights have no device params). The device addresses are
 * not read by an estimate, only whether a group has them. */
static int engine_footprint(const plan_in *in, zo_optim_footprint *f)
{
    static char dummy;
    void *devp[1] = {&dummy};
    uint64_t numel[2];
    unsigned ngroups;
    if (in->from_train) {
        numel[0] = (uint64_t)in->shape.layers * in->shape.width * in->shape.width;
        numel[1] = (uint64_t)in->shape.layers * in->shape.width;
        ngroups = 2;
    } else {
        numel[0] = in->params;
        ngroups = 1;
    }
    zo_optim_group grp[2];
    for (unsigned g = 0; g < ngroups; g++) {
        zo_optim_group_default(&grp[g]);
        grp[g].ntensors = 1;
        grp[g].numel = &numel[g];
        grp[g].dev_params = g == 0 && in->tiled > 0 ? NULL : devp;
        grp[g].state_dtype = in->sdt;
        grp[g].state_bits = (uint16_t)in->qbits;
    }
    zo_optim_config cfg;
    zo_optim_config_default(&cfg);
    cfg.param_dtype = in->pdt;
    cfg.grad_dtype = in->gdt;
    cfg.groups = grp;
    cfg.ngroups = ngroups;
    cfg.placement = in->nvme ? ZO_OPTIM_PLACE_NVME : ZO_OPTIM_PLACE_HOST;
    cfg.buffer_count = in->buffer_count;
    cfg.sub_group_size = in->sub_group;
    cfg.grad_staging_bytes = (size_t)in->staging;
    cfg.grad_accum_steps = in->accum ? in->accum : 1;
    cfg.dpu = in->dpu;
    /* zo-train's backend is its --backend (host by default, whatever GPU
     * this machine has); a plan of figures is for a GPU where one is named */
    int cuda = in->from_train ? !strcmp(in->topt.backend, "cuda") : in->gpu;
    return zo_optim_estimate(&cfg, cuda ? ZO_DEV_CUDA : ZO_DEV_HOST, f);
}

/* The bytes: the device's (params, grads, activations, zo-train's tiles) and
 * the engine's, asked of the library */
static void plan_bytes(const plan_in *in, plan_out *p)
{
    size_t pes = zo_dtype_size(in->pdt), ges = zo_dtype_size(in->gdt);
    uint64_t P = in->params;
    p->dev_params = P * pes;
    p->dev_grads = P * ges;
    p->dev_act = in->activation_bytes;
    if (in->tiled > 0) {
        /* zo-train's tiled layers: only the biases are device tensors; the
         * weights live in the store as fp32 tiles, the device holds each
         * layer's working memory (zo_tile_grid.work_bytes) */
        uint64_t L = in->shape.layers, W = in->shape.width, biases = L * W;
        p->dev_params = biases * pes;
        p->dev_grads = biases * ges;
        p->dev_act = train_shape_tiled_rest_bytes(&in->shape) - biases * (pes + ges);
        p->dev_tiles = L * in->grid.work_bytes;
        p->tile_home = L * W * W * 4;
        /* zo-train's tile store: 4 x 1 MiB slots (pinned home), 16 x 4 MiB (NVMe home) */
        p->pin_tile_pool = in->nvme ? 16ull * (4ull << 20) : 4ull << 20;
    }
    p->dev_total = p->dev_params + p->dev_grads + p->dev_act + p->dev_tiles;
    /* The engine's own allocations, from the library (zo_optim_estimate):
     * zo-train's two groups (weights, biases) or one group of the model's
     * elements, on the backend zo-train would use here (a GPU's copy paths
     * where there is one or --gpu-mem names one, the host backend's direct
     * mode otherwise). */
    zo_optim_footprint fp = {.struct_size = sizeof(fp)};
    p->est_rc = engine_footprint(in, &fp);
    p->nsub = fp.nsubgroups;
    p->nvme_bytes = fp.nvme_state_bytes;
    p->pin_states = fp.host_state_bytes;
    p->pool_slots = fp.pool_slots;
    p->pool_slot = fp.pool_slot_bytes;
    p->pin_pool = (uint64_t)fp.pool_slots * fp.pool_slot_bytes;
    p->pin_staging = fp.staging_bytes;
    p->pin_pbuf = fp.param_buffer_bytes;
    p->win_dtype = fp.grad_window_dtype;
    /* no pinned budget is given, so everything the engine pins is pinned:
     * what stays pageable is the windows on the host backend */
    p->host_acc = fp.host_bytes;
    p->pin_win = fp.grad_window_bytes - fp.host_bytes;
    p->pin_total = fp.pinned_bytes + p->pin_tile_pool + (in->nvme ? 0 : p->tile_home);
    p->host_total = p->pin_total + p->host_acc;
}

/* Whether it fits, and the advice where it does not */
static void plan_fit(const plan_in *in, plan_out *p)
{
    p->fits = 1;
    if (p->est_rc < 0) {
        p->fits = 0;
        say(p, "engine: %s", zo_last_error_detail());
    }
    if (in->tiled < 0) {
        p->fits = 0;
        say(p, "device: the activations and biases alone need %.0f MiB of the %.0f MiB budget: not even tiled "
               "layers fit; a smaller batch", mib(train_shape_tiled_rest_bytes(&in->shape)), mib(in->gpu_mem));
    }
    if (in->probe_note[0])
        say(p, "%s", in->probe_note);
    if (in->tiled > 0 && in->dpu) {
        p->fits = 0;
        say(p, "zo-train's tiled layers need --dpu off");
    }
    if (in->tiled >= 0 && in->gpu_mem && p->dev_total > in->gpu_mem) {
        p->fits = 0;
        say(p, "device: needs %.0f MiB, has %.0f MiB: a smaller batch (activations) or fp16/bf16 grads", mib(p->dev_total),
            mib(in->gpu_mem));
    }
    if (in->ram && p->host_total > in->ram) {
        p->fits = 0;
        if (!in->nvme)
            say(p, "host memory: needs %.0f MiB, has %.0f MiB: NVMe placement (--offload nvme) or more RAM",
                mib(p->host_total), mib(in->ram));
        else
            say(p, "host memory: needs %.0f MiB, has %.0f MiB: fewer buffers (buffer_count) or more RAM; the "
                   "accumulators and parameter buffers grow with the model",
                mib(p->host_total), mib(in->ram));
    }
    if (in->memlock && p->pin_total > in->memlock) {
        /* not fatal: the engine falls back to pageable memory, slower copies */
        say(p, "pinned: needs %.0f MiB, the memlock limit is %.0f MiB: raise it (ulimit -l) or the engine "
               "uses pageable memory for the rest (slower copies)", mib(p->pin_total), mib(in->memlock));
    }
    p->nvme_at = -1;
    for (unsigned i = 0; i < in->nnvme; i++) {
        struct statvfs sv;
        p->nvme_free[i] = statvfs(in->paths[i], &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
        if (in->nvme && p->nvme_at < 0 && p->nvme_free[i] >= p->nvme_bytes + p->tile_home)
            p->nvme_at = (int)i;
    }
    if (in->nvme && p->nvme_at < 0) {
        p->fits = 0;
        say(p, "NVMe: needs %.0f MiB, the largest path has %.0f MiB free: another path (--nvme)", mib(p->nvme_bytes),
            in->nnvme ? mib(p->nvme_free[0]) : 0);
    }
}

/* The predicted step from the run probe */
static void plan_step_probed(const plan_in *in, plan_out *p)
{
    uint64_t P = in->params;
    /* The run probe trained a slice of the model (zo-train lines: k of
     * the L layers, every part of a step proportional to the layers;
     * otherwise P' of the P elements): each part it measured, scaled. */
    double f = p->scale = in->pr.params ? (double)P / (double)in->pr.params : 1;
    p->data = in->pr.data * f;
    p->compute = in->pr.compute * f;
    p->d2h = in->pr.d2h * f;
    p->optim = in->pr.optim * f;
    p->nvme_r = in->pr.nvme_read * f;
    /* nvme-w is the wait for the last write-backs of each sweep (one
     * per engine group, as many in the slice as in the model): a tail
     * that does not grow with the model */
    p->nvme_w = in->pr.nvme_write;
    p->h2d = in->pr.h2d * f;
    p->stall = in->pr.stall * f;
    p->update = (in->pr.update - in->pr.nvme_write) * f + in->pr.nvme_write;
    /* without DPU: data + compute + the step call + the wait for the
     * update; with DPU the step call waits for the previous update
     * where it outlasted data + compute, and copies its params */
    if (in->dpu)
        p->step = (in->pr.data + in->pr.compute + in->pr.call + in->pr.wait) * f;
    else
        p->step = (in->pr.data + in->pr.compute + in->pr.call + in->pr.wait - in->pr.nvme_write) * f +
                  in->pr.nvme_write;
}

/* The predicted step from figures (bandwidths, rates) */
static void plan_step_figures(const plan_in *in, plan_out *p)
{
    size_t pes = zo_dtype_size(in->pdt), ges = zo_dtype_size(in->gdt);
    uint64_t P = in->params;
    /* From figures: the teacher's GEMMs (2BP of the 8BP) are zo-train's data */
    double flops = in->flops * in->accum;
    p->data = in->gemm_flops > 0 ? flops / 4 / in->gemm_flops : 0;
    p->compute = in->gemm_flops > 0 ? flops * 3 / 4 / in->gemm_flops : 0;
    p->d2h = in->copy_bw > 0 ? (double)(P * ges) * in->accum / in->copy_bw : 0;
    p->optim = in->adam_rate > 0 ? (double)P / in->adam_rate : 0;
    /* without DPU on the host backend the kernel writes the device params
     * in place (the engine's direct mode): no copy */
    p->h2d = in->copy_bw > 0 && (in->gpu || in->dpu) ? (double)(P * pes) / in->copy_bw : 0;
    if (in->nvme) {
        /* the sweep reads and writes every NVMe-placed array whole */
        p->nvme_r = in->nvme_read > 0 ? (double)p->nvme_bytes / in->nvme_read : 0;
        p->nvme_w = in->nvme_write > 0 ? (double)p->nvme_bytes / in->nvme_write : 0;
    }
    /* The update streams sub-groups: reads ahead, the optimizer and the
     * write-backs overlap; one disk carries the reads and the writes, so
     * their times add (the sweep moves both at once at about the mixed
     * rate). The gradient copies overlap backward except the last
     * tensor's; the parameter copies overlap the update except the last
     * sub-group's. */
    double nsub = p->nsub ? (double)p->nsub : 1;
    p->update = fmax(p->optim, p->nvme_r + p->nvme_w) + p->h2d / nsub;
    double d2h_tail = p->d2h / (in->ntensors ? in->ntensors : 1);
    if (in->dpu && in->gpu)
        p->step = p->data + fmax(p->compute, p->update) + d2h_tail; /* the CPU update hides behind the GPU */
    else if (in->dpu)
        /* host backend: the model and the optimizer share the same cores and
         * add up; the NVMe transfers overlap both; the parameter copy is a
         * CPU memcpy in the next step call */
        p->step = fmax(p->data + p->compute + p->optim, p->nvme_r + p->nvme_w) + d2h_tail + p->h2d;
    else
        p->step = p->data + p->compute + d2h_tail + p->update; /* without DPU the update follows backward */
}

static void make_plan(const plan_in *in, plan_out *p)
{
    memset(p, 0, sizeof(*p));
    plan_bytes(in, p);
    plan_fit(in, p);
    if (in->ran)
        plan_step_probed(in, p);
    else
        plan_step_figures(in, p);
}

/* ---- output --------------------------------------------------------------------------------- */

static void row(const char *where, const char *what, uint64_t bytes)
{
    printf("  %-26s %-48s %10.1f MiB\n", where, what, mib(bytes));
}

/* The model, zo-train's line and its tiles */
static void print_model(const plan_in *in, const plan_out *p)
{
    printf("model: %" PRIu64 " parameters (%.1f M) in %u tensors; params %s, grads %s, states %s; %s placement, "
           "DPU %s, sub-group %" PRIu64 " (%" PRIu64 " sub-groups)\n",
           in->params, in->params / 1e6, in->ntensors, zo_dtype_name(in->pdt), zo_dtype_name(in->gdt),
           state_name(in), in->nvme ? "NVMe" : "host", in->dpu ? "on" : "off", in->sub_group, p->nsub);
    if (in->from_train)
        printf("zo-train: %u layers of %zu, batch %zu x %u micro-steps\n", in->shape.layers, in->shape.width,
               in->shape.batch, in->accum);
    if (in->tiled > 0)
        printf("tiles: the model does not fit the device budget whole -> per layer %u x %u tiles of %u x %u "
               "(%.1f KiB fp32), %.1f MiB working memory (zo_tile_plan of %.1f MiB), weights homed in %s\n",
               in->grid.tiles_out, in->grid.tiles_in, in->grid.tile_out, in->grid.tile_in,
               in->grid.tile_bytes / 1024.0, mib(in->grid.work_bytes), mib(in->layer_budget),
               in->nvme ? "NVMe" : "pinned host memory");
}

/* The table's head and the device's rows */
static void print_device(const plan_in *in, const plan_out *p)
{
    char buf[128];
    printf("\n  %-26s %-48s %14s\n", "where", "what", "bytes");
    snprintf(buf, sizeof(buf), "device (%s)", in->gpu_what);
    row(buf, "parameters", p->dev_params);
    row("", "gradients", p->dev_grads);
    if (p->dev_act)
        row("", "activations and scratch (zo-train)", p->dev_act);
    if (in->tiled > 0) {
        snprintf(buf, sizeof(buf), "tiled weights: working memory, %u layers", in->shape.layers);
        row("", buf, p->dev_tiles);
    }
    if (in->gpu_mem)
        snprintf(buf, sizeof(buf), "total, of %.0f MiB: %s", mib(in->gpu_mem), p->dev_total <= in->gpu_mem ? "fits" : "DOES NOT FIT");
    else
        snprintf(buf, sizeof(buf), "total");
    row("", buf, p->dev_total);
}

/* Pinned and pageable host memory */
static void print_host(const plan_in *in, const plan_out *p)
{
    char buf[128];
    if (p->pin_states)
        row("pinned host", "fp32 masters + optimizer states", p->pin_states);
    snprintf(buf, sizeof(buf), "store slots, %u x %.0f MiB%s", p->pool_slots, mib(p->pool_slot),
             in->nvme ? " (the NVMe sweep)" : "");
    row(p->pin_states ? "" : "pinned host", buf, p->pin_pool);
    if (p->pin_staging)
        row("", "gradient staging (device -> host)", p->pin_staging);
    if (in->tiled > 0) {
        if (!in->nvme)
            row("", "tiled weights, fp32 (their home)", p->tile_home);
        row("", in->nvme ? "tile store slots, 16 x 4 MiB" : "tile store slots, 4 x 1 MiB", p->pin_tile_pool);
    }
    if (p->pin_pbuf)
        row("", in->dpu ? "parameter buffers x2 (DPU)" : "parameter buffers", p->pin_pbuf);
    if (p->pin_win) {
        snprintf(buf, sizeof(buf), "gradient windows, %s%s", zo_dtype_name(p->win_dtype), in->dpu ? " x2 (DPU)" : "");
        row("", buf, p->pin_win);
    }
    if (in->memlock)
        snprintf(buf, sizeof(buf), "total, memlock limit %.0f MiB: %s", mib(in->memlock),
                 p->pin_total <= in->memlock ? "fits" : "partly pageable");
    else
        snprintf(buf, sizeof(buf), "total (memlock unlimited)");
    row("", buf, p->pin_total);
    snprintf(buf, sizeof(buf), "gradient windows, %s%s", zo_dtype_name(p->win_dtype), in->dpu ? " x2 (DPU)" : "");
    row("pageable host", p->host_acc ? buf : "nothing", p->host_acc);
    snprintf(buf, sizeof(buf), "host total, of %.0f MiB RAM: %s", mib(in->ram), p->host_total <= in->ram ? "fits" : "DOES NOT FIT");
    row("", buf, p->host_total);
}

/* Each NVMe path: what it holds, what it has free */
static void print_nvme(const plan_in *in, const plan_out *p)
{
    char buf[128];
    for (unsigned i = 0; i < in->nnvme; i++) {
        char what[128];
        snprintf(buf, sizeof(buf), "NVMe %s", in->paths[i]);
        if (in->nvme && (int)i == p->nvme_at)
            snprintf(what, sizeof(what), "fp32 masters + states%s (%.0f MiB free)",
                     p->tile_home ? " + tiled weights" : "", mib(p->nvme_free[i]));
        else
            snprintf(what, sizeof(what), "nothing (%.0f MiB free)", mib(p->nvme_free[i]));
        row(buf, what, (int)i == p->nvme_at ? p->nvme_bytes + (in->nvme ? p->tile_home : 0) : 0);
    }
}

/* The predicted step: from the run probe or from figures */
static void print_step(const plan_in *in, const plan_out *p)
{
    if (in->ran) {
        if (in->from_train)
            printf("\nrun probe: %u of the %u layers (%.1f M params) trained %u steps as zo-train does, %.1f s; "
                   "every part scaled by %.2f\n",
                   in->probe_layers, in->shape.layers, in->pr.params / 1e6, in->pr.steps, in->pr.setup, p->scale);
        else
            printf("\nrun probe: the engine on %.1f M params (gradients handed over, stepped) %u steps, %.1f s; "
                   "every part scaled by %.2f\n",
                   in->pr.params / 1e6, in->pr.steps, in->pr.setup, p->scale);
        printf("predicted step: %.1f ms = data %.1f + compute %.1f + update %.1f%s (update: d2h %.1f, optim %.1f, "
               "nvme-r %.1f, nvme-w %.1f, h2d %.1f, stall %.1f ms)\n",
               p->step * 1e3, p->data * 1e3, p->compute * 1e3, p->update * 1e3,
               in->dpu ? " overlapped (DPU)" : "", p->d2h * 1e3, p->optim * 1e3, p->nvme_r * 1e3, p->nvme_w * 1e3,
               p->h2d * 1e3, p->stall * 1e3);
    } else {
        printf("\nbandwidths: NVMe read %.2f GB/s, write %.2f GB/s (%s); optimizer %.0f M params/s (%s); copies "
               "%.2f GB/s (%s); GEMM %.1f GFLOP/s (%s)\n",
               in->nvme_read / 1e9, in->nvme_write / 1e9, in->src_nvme, in->adam_rate / 1e6, in->src_adam,
               in->copy_bw / 1e9, in->src_copy, in->gemm_flops / 1e9, in->src_gemm);
        printf("predicted step: %.1f ms = data %.1f, compute %.1f, d2h %.1f, optim %.1f, nvme-r %.1f, nvme-w %.1f, "
               "h2d %.1f (update %.1f ms; %s)\n",
               p->step * 1e3, p->data * 1e3, p->compute * 1e3, p->d2h * 1e3, p->optim * 1e3, p->nvme_r * 1e3,
               p->nvme_w * 1e3, p->h2d * 1e3, p->update * 1e3,
               in->dpu && in->gpu ? "DPU: the update overlaps the next forward/backward"
                                  : !in->dpu ? "the update follows backward"
                                             : "DPU on the host backend: model and optimizer share the CPUs, NVMe "
                                               "overlaps");
    }
}

/* Whether it fits, and why not */
static void print_fit(const plan_in *in, const plan_out *p)
{
    if (!in->from_train)
        printf("  (compute is the framework's: give a zo-train command line after -- to include it)\n");
    if (p->fits && !p->nwhy)
        printf("fits.\n");
    else {
        printf(p->fits ? "fits, with a caveat:\n" : "DOES NOT FIT:\n");
        for (int i = 0; i < p->nwhy; i++)
            printf("  - %s\n", p->why[i]);
    }
}

static void print_plan(const plan_in *in, const plan_out *p)
{
    print_model(in, p);
    print_device(in, p);
    print_host(in, p);
    print_nvme(in, p);
    print_step(in, p);
    print_fit(in, p);
}

/* "model" and "engine" */
static void json_model(zo_json *j, const plan_in *in, const plan_out *p)
{
    zj_obj_begin(j, "model");
    zj_uint(j, "params", in->params);
    zj_uint(j, "tensors", in->ntensors);
    zj_str(j, "param_dtype", zo_dtype_name(in->pdt));
    zj_str(j, "grad_dtype", zo_dtype_name(in->gdt));
    zj_str(j, "state_dtype", state_name(in));
    if (in->from_train) {
        zj_uint(j, "layers", in->shape.layers);
        zj_uint(j, "width", in->shape.width);
        zj_uint(j, "batch", in->shape.batch);
    }
    zj_obj_end(j);
    zj_obj_begin(j, "engine");
    zj_str(j, "offload", in->nvme ? "nvme" : "host");
    zj_bool(j, "dpu", in->dpu);
    zj_uint(j, "accum", in->accum);
    zj_uint(j, "sub_group_size", in->sub_group);
    zj_uint(j, "sub_groups", p->nsub);
    zj_uint(j, "buffer_count", in->buffer_count);
    zj_obj_end(j);
}

/* "bytes": the device's, the host's, each NVMe path's */
static void json_bytes(zo_json *j, const plan_in *in, const plan_out *p)
{
    zj_obj_begin(j, "bytes");
    zj_uint(j, "device_params", p->dev_params);
    zj_uint(j, "device_grads", p->dev_grads);
    zj_uint(j, "device_activations", p->dev_act);
    zj_uint(j, "device_tiles", p->dev_tiles);
    zj_uint(j, "tiled_weights_home", p->tile_home);
    zj_uint(j, "pinned_tile_pool", p->pin_tile_pool);
    zj_uint(j, "device_total", p->dev_total);
    zj_uint(j, "pinned_states", p->pin_states);
    zj_uint(j, "pinned_pool", p->pin_pool);
    zj_uint(j, "pinned_staging", p->pin_staging);
    zj_uint(j, "pinned_param_buffers", p->pin_pbuf);
    zj_uint(j, "pinned_grad_windows", p->pin_win);
    zj_uint(j, "pinned_total", p->pin_total);
    zj_uint(j, "pageable_accumulators", p->host_acc);
    zj_uint(j, "host_total", p->host_total);
    zj_arr_begin(j, "nvme");
    for (unsigned i = 0; i < in->nnvme; i++) {
        zj_obj_begin(j, NULL);
        zj_str(j, "path", in->paths[i]);
        zj_uint(j, "bytes", (int)i == p->nvme_at ? p->nvme_bytes : 0);
        zj_uint(j, "free", p->nvme_free[i]);
        zj_obj_end(j);
    }
    zj_arr_end(j);
    zj_obj_end(j);
}

/* "tiles", "machine" and "bandwidth" */
static void json_machine(zo_json *j, const plan_in *in)
{
    /* zo-train's tiled layers (null when the model is not tiled) */
    if (in->tiled > 0) {
        zj_obj_begin(j, "tiles");
        zj_uint(j, "layer_budget", in->layer_budget);
        zj_uint(j, "tile_out", in->grid.tile_out);
        zj_uint(j, "tile_in", in->grid.tile_in);
        zj_uint(j, "tiles_out", in->grid.tiles_out);
        zj_uint(j, "tiles_in", in->grid.tiles_in);
        zj_uint(j, "tile_bytes", in->grid.tile_bytes);
        zj_uint(j, "work_bytes", in->grid.work_bytes);
        zj_str(j, "home", in->nvme ? "nvme" : "host");
        zj_obj_end(j);
    } else {
        zj_num(j, "tiles", NAN); /* null */
    }
    zj_obj_begin(j, "machine");
    zj_str(j, "device", in->gpu_what);
    zj_uint(j, "device_mem", in->gpu_mem);
    zj_uint(j, "ram", in->ram);
    zj_uint(j, "memlock", in->memlock);
    zj_obj_end(j);
    zj_obj_begin(j, "bandwidth");
    zj_num(j, "nvme_read_bytes_per_s", in->nvme_read);
    zj_num(j, "nvme_write_bytes_per_s", in->nvme_write);
    zj_num(j, "optimizer_params_per_s", in->adam_rate);
    zj_num(j, "copy_bytes_per_s", in->copy_bw);
    zj_num(j, "gemm_flop_per_s", in->gemm_flops);
    zj_obj_end(j);
}

/* "probe", "predicted", "fits" and "advice" */
static void json_predicted(zo_json *j, const plan_in *in, const plan_out *p)
{
    /* the run probe (null when the figures predicted) */
    if (in->ran) {
        zj_obj_begin(j, "probe");
        zj_uint(j, "layers", in->probe_layers);
        zj_uint(j, "params", in->pr.params);
        zj_uint(j, "steps", in->pr.steps);
        zj_num(j, "seconds", in->pr.setup);
        zj_num(j, "scale", p->scale);
        /* what the slice measured (medians per step), before scaling */
        zj_num(j, "step_ms", in->pr.step * 1e3);
        zj_num(j, "data_ms", in->pr.data * 1e3);
        zj_num(j, "compute_ms", in->pr.compute * 1e3);
        zj_num(j, "call_ms", in->pr.call * 1e3);
        zj_num(j, "wait_ms", in->pr.wait * 1e3);
        zj_num(j, "update_ms", in->pr.update * 1e3);
        zj_num(j, "nvme_read_ms", in->pr.nvme_read * 1e3);
        zj_num(j, "nvme_write_ms", in->pr.nvme_write * 1e3);
        zj_obj_end(j);
    } else {
        zj_num(j, "probe", NAN);
    }
    /* the same names as zo-train --json's step lines */
    zj_obj_begin(j, "predicted");
    zj_str(j, "from", in->ran ? "run probe" : "figures");
    zj_num(j, "step_ms", p->step * 1e3);
    zj_num(j, "data_ms", p->data * 1e3);
    zj_num(j, "compute_ms", p->compute * 1e3);
    zj_num(j, "d2h_ms", p->d2h * 1e3);
    zj_num(j, "optim_ms", p->optim * 1e3);
    zj_num(j, "nvme_read_ms", p->nvme_r * 1e3);
    zj_num(j, "nvme_write_ms", p->nvme_w * 1e3);
    zj_num(j, "h2d_ms", p->h2d * 1e3);
    zj_num(j, "stall_ms", p->stall * 1e3);
    zj_num(j, "update_ms", p->update * 1e3);
    zj_obj_end(j);
    zj_bool(j, "fits", p->fits);
    zj_arr_begin(j, "advice");
    for (int i = 0; i < p->nwhy; i++)
        zj_str(j, NULL, p->why[i]);
    zj_arr_end(j);
}

static void json_plan(const plan_in *in, const plan_out *p)
{
    zo_json j;
    zj_init(&j, stdout, 1);
    zj_obj_begin(&j, NULL);
    zj_str(&j, "tool", "zo-plan");
    json_model(&j, in, p);
    json_bytes(&j, in, p);
    json_machine(&j, in);
    json_predicted(&j, in, p);
    zj_obj_end(&j);
    zj_end(&j);
}

/* The engine configuration for this plan: DeepSpeed keys where they exist, ours under "zoffload". */
static int write_config(const char *path, const plan_in *in, const plan_out *p)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "zo-plan: --config %s: %s%s\n", path, strerror(errno),
                errno == EEXIST ? " (zo-plan never overwrites)" : "");
        return -1;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return -1;
    }
    zo_json j;
    zj_init(&j, f, 1);
    zj_obj_begin(&j, NULL);
    zj_obj_begin(&j, "bf16");
    zj_bool(&j, "enabled", in->pdt == ZO_DTYPE_BF16);
    zj_obj_end(&j);
    zj_obj_begin(&j, "fp16");
    zj_bool(&j, "enabled", in->pdt == ZO_DTYPE_F16);
    zj_obj_end(&j);
    zj_num(&j, "gradient_clipping", in->clip);
    zj_uint(&j, "gradient_accumulation_steps", in->accum);
    zj_obj_begin(&j, "zero_optimization");
    zj_uint(&j, "sub_group_size", in->sub_group);
    zj_obj_begin(&j, "offload_optimizer");
    zj_str(&j, "device", in->nvme ? "nvme" : "cpu");
    if (in->nvme && p->nvme_at >= 0)
        zj_str(&j, "nvme_path", in->paths[p->nvme_at]);
    zj_bool(&j, "pin_memory", 1);
    zj_uint(&j, "buffer_count", in->buffer_count);
    zj_obj_end(&j);
    zj_obj_end(&j);
    zj_obj_begin(&j, "zoffload");
    zj_bool(&j, "dpu", in->dpu);
    zj_str(&j, "grad_dtype", zo_dtype_name(in->gdt));
    zj_str(&j, "state_dtype", state_name(in));
    zj_uint(&j, "grad_staging_bytes", in->staging);
    zj_obj_end(&j);
    zj_obj_end(&j);
    zj_end(&j);
    if (fclose(f) != 0) {
        fprintf(stderr, "zo-plan: --config %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The run probe: the slice of the model to train, and the run. */
static int run_probe(plan_in *in)
{
    plan_probe_in pi;
    memset(&pi, 0, sizeof(pi));
    /* large enough that the sweep is steady (NVMe: 192 MiB of state each
     * way), that the slice's weights (32 MiB in bf16, 64 MiB more of the
     * teacher's fp32) overflow the CPU caches as the model's do, and that
     * fixed per-step costs are small; small enough to take a few seconds */
    uint64_t target = in->probe_size ? in->probe_size : 16ull << 20;
    if (in->from_train) {
        pi.opt = &in->topt;
        pi.shape = in->shape;
        uint64_t per_layer = (uint64_t)in->shape.width * in->shape.width + in->shape.width;
        uint64_t k = (target + per_layer - 1) / per_layer;
        /* Under host placement the step is mostly forward and backward, and
         * in the model the intake of every layer's gradients but the last
         * runs under backward, on the same cores: a slice of one layer has
         * none of that contention (its one gradient lands after backward)
         * and ran 15% faster than the model (--layers 8 --width 4096
         * --batch 8: 585-594 ms predicted, 677-716 ms the whole model as the
         * slice, 624 ms two layers). Under NVMe placement the disk dominates
         * and two 8192-wide layers would double a 9 s probe. */
        if (!in->nvme && k < 2 && !in->probe_size)
            k = 2;
        pi.shape.layers = (unsigned)(k < in->shape.layers ? k : in->shape.layers);
        in->probe_layers = pi.shape.layers;
        pi.nthreads = in->topt.nthreads;
    } else {
        pi.params = in->params < target ? in->params : target;
    }
    pi.pdt = in->pdt;
    pi.gdt = in->gdt;
    pi.sdt = in->sdt;
    pi.qbits = in->qbits;
    pi.nvme = in->nvme;
    pi.dpu = in->dpu;
    pi.accum = in->accum;
    pi.clip = in->clip;
    pi.sub_group = in->sub_group;
    pi.buffer_count = in->buffer_count;
    pi.nvme_dir = in->paths[0];
    pi.steps = 3;
    /* the slice must fit this machine easily: its memory (device params and
     * grads, fp32 scratch and teacher weights, the engine's accumulators,
     * parameter buffers and, under host placement, masters and states) and
     * its swap files */
    uint64_t n = in->from_train ? (uint64_t)pi.shape.layers * ((uint64_t)in->shape.width * in->shape.width + in->shape.width)
                                : pi.params;
    uint64_t nwin = in->dpu ? 2 : 1, ses = zo_dtype_size(in->sdt);
    if (in->qbits)
        ses = 1; /* q8 (q4 half of it) and a scale per block: at most a byte per element */
    uint64_t mem = n * (zo_dtype_size(in->pdt) * (1 + nwin) + zo_dtype_size(in->gdt) + 4 * nwin +
                        (in->from_train ? 12 : 0) + (in->nvme ? 0 : 4 + 2 * ses));
    struct statvfs sv;
    uint64_t disk = in->nvme && statvfs(pi.nvme_dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : UINT64_MAX;
    if (in->ram && mem > in->ram / 2) {
        snprintf(in->probe_note, sizeof(in->probe_note), "the run probe's slice would need %.0f MiB of the %.0f MiB "
                 "RAM: predicted from figures", mib(mem), mib(in->ram));
        return 1;
    }
    if (in->nvme && n * (4 + 2 * ses) > disk / 2) {
        snprintf(in->probe_note, sizeof(in->probe_note), "the run probe's slice would need %.0f MiB of the %.0f MiB "
                 "free in %s: predicted from figures", mib(n * (4 + 2 * ses)), mib(disk), pi.nvme_dir);
        return 1;
    }
    int r = plan_probe_run(&pi, &in->pr);
    if (r < 0)
        return r;
    in->ran = 1;
    snprintf(in->src_nvme, sizeof(in->src_nvme), "run probe");
    snprintf(in->src_adam, sizeof(in->src_adam), "run probe");
    snprintf(in->src_copy, sizeof(in->src_copy), "run probe");
    snprintf(in->src_gemm, sizeof(in->src_gemm), "run probe");
    return 0;
}

/* ---- main --------------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zo-plan [options] [-- ZO-TRAIN OPTIONS]\n"
            "Where a model's training state goes with the offload optimizer engine, whether it fits,\n"
            "and the predicted step time.\n"
            "model (one of)\n"
            "  --params N            parameters in total\n"
            "  --tensors LIST        tensor sizes: N, RxC, each with an optional *COUNT (\"4096x4096*32,4096*64\")\n"
            "  -- ZO-TRAIN OPTIONS   a zo-train command line (\"--\" alone: zo-train's default)\n"
            "precision and engine (a zo-train command line sets these itself)\n"
            "  --param-dtype T       bf16 (default), fp16, fp32\n"
            "  --grad T              default: the param dtype\n"
            "  --state T             optimizer states: fp32 (default) or bf16\n"
            "  --offload host|nvme   (default host)\n"
            "  --dpu on|off          (default off)\n"
            "  --accum K             micro-steps per step (default 1)\n"
            "  --sub-group N         elements per sub-group (default 16M)\n"
            "  --buffer-count N      NVMe sub-group buffers (default 4)\n"
            "machine (detected unless given)\n"
            "  --gpu-mem N           device memory\n"
            "  --ram N               host memory\n"
            "  --memlock N           pinned memory limit\n"
            "  --nvme PATH           an NVMe directory (repeatable; default /var/tmp)\n"
            "the predicted step (default: --probe run)\n"
            "  --probe run           train a slice of the model a few steps as zo-train would, scale each part\n"
            "  --probe quick         predict from bandwidths: quick probes for those not given\n"
            "  --probe none, --no-probe  measure nothing: use --bench and the values below\n"
            "  --probe-size N        elements the run probe's slice aims at (default 16M)\n"
            "  --bench FILE          zo-aio-bench / zo-adam-bench --json output (repeatable; implies quick)\n"
            "  --nvme-read X, --nvme-write X, --copy X  bytes/s (any of these implies quick)\n"
            "  --adam-rate X         optimizer params/s\n"
            "  --gemm-flops X        GEMM flop/s\n"
            "output\n"
            "  --json                the plan as JSON\n"
            "  --config FILE         also write the engine configuration (a new file) for zo_optim_json_load\n");
}

/* ---- the command line ------------------------------------------------------------------------- */

/* A phase's result when the run goes on (else the exit status) */
enum { GO_ON = -1 };

/* --bench files in their order (past 8 they are not read) */
typedef struct plan_bench_files {
    const char *file[8];
    unsigned n;
} plan_bench_files;

/* The command line: the plan's inputs and what else it asks for */
typedef struct plan_args {
    plan_in in;
    const char *config_out, *tensors;
    plan_bench_files bench;
    int json;
    int probe;            /* PROBE_* */
    int dpu;              /* --dpu: 1 on, 0 off, -1 not given */
    int figures;          /* a bandwidth given, or --bench: predict from figures */
    int train_argc;       /* the zo-train command line after "--" (train_argv NULL: none), */
    char **train_argv;    /* whose "--" stands in for the program name */
} plan_args;

static void plan_args_default(plan_args *a)
{
    memset(a, 0, sizeof(*a));
    a->in.pdt = ZO_DTYPE_BF16;
    a->in.gdt = ZO_DTYPE_COUNT;
    a->in.sdt = ZO_DTYPE_F32;
    a->in.accum = 1;
    a->in.buffer_count = 4;
    a->in.staging = 32ull << 20;
    a->in.clip = 1.0;
    a->in.sub_group = 1ull << 24;
    a->probe = PROBE_RUN;
    a->dpu = -1;
}

/* ---- the options' sets (zo_tool_opt: tool_common.h) ---- */

/* A size (zo_parse_size, not 0) in d->lo..d->hi, one message either way:
 * "not a size", or the range (d->what, else lo..hi). 0 or 2. */
static int size_in(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg, uint64_t *v)
{
    if (zo_parse_size(arg, v) < 0 || *v == 0)
        return zo_tool_bad(cli->prog, "--%s: not a size: '%s'", d->name, arg);
    if (*v < d->lo || *v > d->hi) {
        if (d->what)
            return zo_tool_bad(cli->prog, "--%s: '%s' is out of range: %s", d->name, arg, d->what);
        return zo_tool_bad(cli->prog, "--%s: '%s' is out of range: %llu..%llu", d->name, arg, d->lo, d->hi);
    }
    return 0;
}

/* a size into *(uint64_t *)dst */
static int set_size(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t v;
    int rc = size_in(cli, d, arg, &v);
    if (!rc)
        *(uint64_t *)d->dst = v;
    return rc;
}

/* a size into *(unsigned *)dst (d->hi fits an unsigned) */
static int set_count(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t v;
    int rc = size_in(cli, d, arg, &v);
    if (!rc)
        *(unsigned *)d->dst = (unsigned)v;
    return rc;
}

/* a positive number (bytes/s, params/s, flop/s) into *(double *)dst */
static int set_rate(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    char *end;
    double v = strtod(arg, &end);
    if (end == arg || *end || !isfinite(v) || v <= 0)
        return zo_tool_bad(cli->prog, "--%s: bad value '%s' (a positive number)", d->name, arg);
    *(double *)d->dst = v;
    return 0;
}

/* a dtype into *(zo_dtype *)dst: those with their bit (1 << dtype) in
 * d->hi, named in d->what */
static int set_dtype(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    zo_dtype t;
    if (zo_dtype_parse(arg, &t) < 0 || !(d->hi >> t & 1))
        return zo_tool_bad(cli->prog, "--%s: '%s' is not one of %s", d->name, arg, d->what);
    *(zo_dtype *)d->dst = t;
    return 0;
}

/* --state fp32|bf16|q8|q4 into the plan_in at dst (sdt, qbits) */
static int set_state(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    plan_in *in = d->dst;
    if (zo_tool_state_parse(arg, &in->sdt, &in->qbits) < 0)
        return zo_tool_bad(cli->prog, "--%s: '%s' is not one of %s", d->name, arg, d->what);
    return 0;
}

/* --offload host|cpu|nvme into *(int *)dst: 1 for nvme */
static int set_offload(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (strcmp(arg, "host") && strcmp(arg, "cpu") && strcmp(arg, "nvme"))
        return zo_tool_bad(cli->prog, "--%s: expected host or nvme, not '%s'", d->name, arg);
    *(int *)d->dst = !strcmp(arg, "nvme");
    return 0;
}

/* on|off into *(int *)dst */
static int set_on_off(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (strcmp(arg, "on") && strcmp(arg, "off"))
        return zo_tool_bad(cli->prog, "--%s: expected on or off", d->name);
    *(int *)d->dst = !strcmp(arg, "on");
    return 0;
}

/* --probe run|quick|none into *(int *)dst (PROBE_*); --no-probe, which takes no value: none */
static int set_probe(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    static const char *const names[] = {[PROBE_NONE] = "none", [PROBE_QUICK] = "quick", [PROBE_RUN] = "run"};
    if (!arg) {
        *(int *)d->dst = PROBE_NONE;
        return 0;
    }
    for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
        if (!strcmp(arg, names[i])) {
            *(int *)d->dst = i;
            return 0;
        }
    return zo_tool_bad(cli->prog, "--%s: expected run, quick or none, not '%s'", d->name, arg);
}

/* one more NVMe directory into the plan_in at dst */
static int set_nvme_path(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    plan_in *in = d->dst;
    if (in->nnvme == MAX_NVME)
        return zo_tool_bad(cli->prog, "at most %d --nvme paths", MAX_NVME);
    in->paths[in->nnvme++] = arg;
    return 0;
}

/* one more --bench file into the plan_bench_files at dst */
static int set_bench(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    plan_bench_files *b = d->dst;
    if (b->n < sizeof(b->file) / sizeof(b->file[0]))
        b->file[b->n++] = arg;
    return 0;
}

/* ---- the phases of a run: each returns GO_ON, or the exit status ---- */

/* Split off a zo-train command line after "--": argc then counts zo-plan's own options */
static void split_train_line(int *argc, char **argv, plan_args *a)
{
    for (int i = 1; i < *argc; i++)
        if (!strcmp(argv[i], "--")) {
            a->train_argc = *argc - i; /* argv[i] stands in for the program name */
            a->train_argv = argv + i;
            *argc = i;
            return;
        }
}

/* What the sets stored says what was given: they store nothing but
 * positive sizes and figures, so a value not 0 was on the command line */
static void note_given(plan_args *a)
{
    plan_in *in = &a->in;
    if (in->gpu_mem) {
        in->gpu_what = "given";
        in->gpu = 1;
    }
    if (in->nvme_read || in->nvme_write)
        strcpy(in->src_nvme, "given");
    if (in->copy_bw)
        strcpy(in->src_copy, "given");
    if (in->adam_rate)
        strcpy(in->src_adam, "given");
    if (in->gemm_flops)
        strcpy(in->src_gemm, "given");
    a->figures = a->bench.n || in->src_nvme[0] || in->src_copy[0] || in->src_adam[0] || in->src_gemm[0];
}

/* zo-plan's own options, by the table */
static int parse_options(int argc, char **argv, plan_args *a)
{
    plan_in *in = &a->in;
    const unsigned long long st = 1ull << ZO_DTYPE_F32 | 1ull << ZO_DTYPE_BF16, pg = st | 1ull << ZO_DTYPE_F16;
    const zo_tool_opt table[] = {
        {"params", 1, 0, set_size, &in->params, 1, UINT64_MAX, NULL},
        {"tensors", 1, 0, zo_tool_opt_str, &a->tensors, 0, 0, NULL},
        {"param-dtype", 1, 0, set_dtype, &in->pdt, 0, pg, "bf16, fp16, fp32"},
        {"grad", 1, 0, set_dtype, &in->gdt, 0, pg, "bf16, fp16, fp32"},
        {"state", 1, 0, set_state, in, 0, st, "fp32, bf16, q8, q4"},
        {"offload", 1, 0, set_offload, &in->nvme, 0, 0, NULL},
        {"dpu", 1, 0, set_on_off, &a->dpu, 0, 0, NULL},
        {"accum", 1, 0, set_count, &in->accum, 1, 65536, NULL},
        {"sub-group", 1, 0, set_size, &in->sub_group, 64, UINT64_MAX, "at least 64 elements"},
        {"buffer-count", 1, 0, set_count, &in->buffer_count, 4, 1024, "4..1024"},
        {"gpu-mem", 1, 0, set_size, &in->gpu_mem, 1, UINT64_MAX, NULL},
        {"ram", 1, 0, set_size, &in->ram, 1, UINT64_MAX, NULL},
        {"memlock", 1, 0, set_size, &in->memlock, 1, UINT64_MAX, NULL},
        {"nvme", 1, 0, set_nvme_path, in, 0, 0, NULL},
        {"bench", 1, 0, set_bench, &a->bench, 0, 0, NULL},
        {"no-probe", 0, 0, set_probe, &a->probe, 0, 0, NULL},
        {"probe", 1, 0, set_probe, &a->probe, 0, 0, NULL},
        {"probe-size", 1, 0, set_size, &in->probe_size, 1, UINT64_MAX, NULL},
        {"nvme-read", 1, 0, set_rate, &in->nvme_read, 0, 0, NULL},
        {"nvme-write", 1, 0, set_rate, &in->nvme_write, 0, 0, NULL},
        {"copy", 1, 0, set_rate, &in->copy_bw, 0, 0, NULL},
        {"adam-rate", 1, 0, set_rate, &in->adam_rate, 0, 0, NULL},
        {"gemm-flops", 1, 0, set_rate, &in->gemm_flops, 0, 0, NULL},
        {"json", 0, 0, zo_tool_opt_on, &a->json, 0, 0, NULL},
        {"config", 1, 0, zo_tool_opt_str, &a->config_out, 0, 0, NULL},
        {"help", 0, 0, zo_tool_opt_help, NULL, 0, 0, NULL},
    };
    const zo_tool_cli cli = {"zo-plan", usage, table, sizeof(table) / sizeof(table[0])};
    opterr = 0;
    int rc = zo_tool_opts_parse(&cli, argc, argv);
    if (rc < 0)
        return zo_tool_bad(cli.prog, "unknown option '%s' (--help lists them)", argv[optind - 1]);
    if (rc)
        return rc;
    if (optind < argc)
        return zo_tool_bad(cli.prog, "unexpected argument '%s'", argv[optind]);
    note_given(a);
    return GO_ON;
}

/* The zo-train command line decides model, precisions and engine */
static int read_train_line(int argc, char **argv, plan_in *in)
{
    options to;
    int r = train_options_parse(argc, argv, &to);
    if (r)
        return r < 0 ? 0 : r; /* < 0: its --help was asked for, and printed */
    in->from_train = 1;
    in->topt = to;
    in->shape = (train_shape){.layers = to.layers, .width = (size_t)to.width, .batch = (size_t)to.batch,
                              .param_dtype = to.param_dtype,
                              .grad_dtype = to.grad_dtype == ZO_DTYPE_COUNT ? to.param_dtype : to.grad_dtype,
                              .seed = to.seed};
    in->params = train_shape_params(&in->shape);
    in->ntensors = 2 * to.layers;
    in->activation_bytes = train_shape_activation_bytes(&in->shape);
    in->flops = train_shape_flops(&in->shape);
    in->pdt = in->shape.param_dtype;
    in->gdt = in->shape.grad_dtype;
    in->nvme = to.offload == ZO_OPTIM_PLACE_NVME;
    in->dpu = to.dpu > 0;
    in->accum = to.accum > 0 ? (unsigned)to.accum : 1;
    if (to.clip >= 0)
        in->clip = to.clip;
    if (to.sub_group)
        in->sub_group = to.sub_group;
    if (to.nvme_path && in->nnvme < MAX_NVME)
        in->paths[in->nnvme++] = to.nvme_path;
    if (!in->gpu_mem) {
        /* zo-train's host backend: the budget it sets itself */
        in->gpu_mem = to.dev_budget ? to.dev_budget
                                    : train_default_device_budget(in->params * (zo_dtype_size(in->pdt) +
                                                                                zo_dtype_size(in->gdt)) +
                                                                  in->activation_bytes);
        in->gpu_what = "zo-train budget";
    }
    return GO_ON;
}

/* The model: one of --params, --tensors or a zo-train line, and the defaults that follow */
static int read_model(plan_args *a)
{
    plan_in *in = &a->in;
    int have_params = in->params != 0; /* only --params sets it so far */
    if (have_params + (a->tensors != NULL) + (a->train_argv != NULL) != 1)
        return zo_tool_bad("zo-plan", "give the model as one of --params, --tensors or -- ZO-TRAIN OPTIONS");
    if (have_params)
        in->ntensors = 1;
    if (a->tensors && parse_tensors(a->tensors, in) < 0)
        return zo_tool_bad("zo-plan", "--tensors: '%s' is not a comma list of N, RxC or either *COUNT", a->tensors);
    if (a->train_argv) {
        int r = read_train_line(a->train_argc, a->train_argv, in);
        if (r != GO_ON)
            return r;
    }
    if (in->gdt == ZO_DTYPE_COUNT)
        in->gdt = in->pdt;
    if (a->dpu >= 0)
        in->dpu = a->dpu;
    if (!in->nnvme)
        in->paths[in->nnvme++] = "/var/tmp";
    return GO_ON;
}

/* CUDA device 0's memory, where there is one */
static void detect_gpu(plan_in *in)
{
    int ndev = 0;
    zo_dev *d = NULL;
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.kind = ZO_DEV_CUDA;
    zo_dev_info di;
    if (zo_dev_probe(ZO_DEV_CUDA, &ndev, NULL, 0) == 0 && ndev > 0 && zo_dev_open(&d, &dc) == 0 &&
        zo_dev_get_info(d, &di) == 0) {
        in->gpu_mem = di.total_mem;
        in->gpu_what = "CUDA device 0";
        in->gpu = 1;
    } else {
        in->gpu_what = "no GPU: not checked";
    }
    zo_dev_close(&d);
}

/* The machine, where the command line did not describe it; zo-train's tiles */
static int detect_machine(plan_in *in)
{
    zo_machine mach;
    zo_machine_get(&mach);
    if (!in->ram)
        in->ram = mach.mem_bytes;
    if (!in->memlock) {
        /* RLIMIT_MEMLOCK, unless the process may lock without limit (CAP_IPC_LOCK) */
        zo_pinned_stats ps;
        zo_pinned_stats_get(&ps);
        if (!ps.can_lock_unlimited && ps.memlock_limit != UINT64_MAX)
            in->memlock = ps.memlock_limit;
    }
    if (!in->gpu_mem)
        detect_gpu(in);
    if (in->from_train && in->gpu_mem) {
        /* zo-train's rule: over the device budget, every layer tiled */
        in->tiled = train_plan_tiles(&in->shape, in->gpu_mem, &in->layer_budget, &in->grid);
        if (in->tiled > 0)
            in->ntensors = in->shape.layers * in->grid.tiles_out * in->grid.tiles_in + in->shape.layers;
    }
    for (unsigned i = 0; i < in->nnvme; i++) {
        struct statvfs sv;
        if (statvfs(in->paths[i], &sv) < 0)
            return zo_tool_bad("zo-plan", "--nvme %s: %s", in->paths[i], strerror(errno));
    }
    return GO_ON;
}

/* The quick probes, for the figures not given: 0, or -1 (message printed) */
static int quick_probes(plan_in *in)
{
    if (!in->adam_rate) {
        in->adam_rate = probe_adam((int)sysconf(_SC_NPROCESSORS_ONLN), in->qbits);
        strcpy(in->src_adam, in->qbits == 8 ? "probe: AdamW 4M q8" : in->qbits == 4 ? "probe: AdamW 4M q4"
                                                                                  : "probe: AdamW 4M fp32");
    }
    if (!in->copy_bw) {
        in->copy_bw = in->gpu ? 20e9 : probe_copy();
        strcpy(in->src_copy, in->gpu ? "assumed PCIe 20 GB/s" : "probe: memcpy 64 MiB");
    }
    if (!in->gemm_flops && in->from_train) {
        in->gemm_flops = probe_gemm();
        strcpy(in->src_gemm, "probe: sgemm 1024^3");
    }
    if (in->nvme && (!in->nvme_read || !in->nvme_write)) {
        double rd = 0, wr = 0;
        if (probe_nvme(in->paths[0], &rd, &wr) < 0)
            return -1;
        if (!in->nvme_read)
            in->nvme_read = rd;
        if (!in->nvme_write)
            in->nvme_write = wr;
        snprintf(in->src_nvme, sizeof(in->src_nvme), "probe: 256 MiB overwritten, then read, through zo_aio, 1 MiB x 32 in flight");
    }
    return 0;
}

/* Bandwidths: given, from bench files, or probed; then where each came from */
static int get_figures(plan_args *a)
{
    plan_in *in = &a->in;
    int probe = a->probe;
    for (unsigned i = 0; i < a->bench.n; i++)
        if (load_bench(a->bench.file[i], in) < 0)
            return 2;
    /* given figures (or --bench) predict from figures; the quick probes fill the missing ones */
    if (probe == PROBE_RUN && a->figures)
        probe = PROBE_QUICK;
    if (probe == PROBE_RUN && in->tiled > 0)
        probe = PROBE_QUICK; /* the run probe trains untiled layers only */
    if (probe == PROBE_RUN) {
        int r = run_probe(in);
        if (r < 0)
            return 2;
        if (r > 0)
            probe = PROBE_QUICK; /* too large to probe here */
    }
    if (probe == PROBE_QUICK && quick_probes(in) < 0)
        return 2;
    const char *none = "not measured";
    if (!in->src_nvme[0])
        strcpy(in->src_nvme, in->nvme ? none : "unused");
    if (!in->src_adam[0])
        strcpy(in->src_adam, none);
    if (!in->src_copy[0])
        strcpy(in->src_copy, none);
    if (!in->src_gemm[0])
        strcpy(in->src_gemm, in->from_train ? none : "unused");
    return GO_ON;
}

/* --config: write the engine configuration, and load it back as the engine will: 0, or 1 */
static int config_phase(const char *path, const plan_in *in, const plan_out *p, int json)
{
    if (write_config(path, in, p) < 0)
        return 1;
    /* the file must be one the engine takes: load it back */
    zo_optim_json *cj = NULL;
    int r = zo_optim_json_load(path, &cj);
    zo_optim_json_free(&cj);
    if (r < 0) {
        fprintf(stderr, "zo-plan: the written config %s is refused by zo_optim_json_load: %s (%s)\n", path,
                zo_strerror(r), zo_last_error_detail());
        return 1;
    }
    if (!json)
        printf("engine config written to %s\n", path);
    return 0;
}

int main(int argc, char **argv)
{
    if (plan_cluster_wanted(argc, argv))
        return plan_cluster_main(argc, argv); /* many ranks: plan_cluster.c */
    plan_args a;
    plan_args_default(&a);
    split_train_line(&argc, argv, &a);
    int rc = parse_options(argc, argv, &a);
    if (rc == GO_ON)
        rc = read_model(&a);
    if (rc == GO_ON)
        rc = detect_machine(&a.in);
    if (rc == GO_ON)
        rc = get_figures(&a);
    if (rc != GO_ON)
        return rc;

    plan_out p;
    make_plan(&a.in, &p);
    if (a.json)
        json_plan(&a.in, &p);
    else
        print_plan(&a.in, &p);
    if (a.config_out && config_phase(a.config_out, &a.in, &p, a.json))
        return 1;
    return p.fits ? 0 : 3;
}
