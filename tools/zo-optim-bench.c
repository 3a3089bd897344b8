/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-optim-bench: drive the offload optimizer engine (zo_optim) with
 * synthetic gradients the way a training loop does, and measure it against
 * its bounds in the same run (docs/tools/zo-optim-bench.md).
 *
 * One iteration: the device stream runs --compute-ms of work
 * (zo_dev_busy: it occupies the device stream and no CPU core; on CUDA a
 * kernel, not a host function, which would share the driver's one
 * host-function thread with the engine's own), and as "backward" produces each tensor's
 * gradient an event is recorded and the gradient handed to the engine;
 * then the step (zo_optim_step, or zo_optim_step_async under --dpu).
 *
 * --vs-bound alternates, pair by pair, the engine's step with its bound:
 *  - host placement: the bare fused kernel (zo_cpuadam_step) on plain
 *    arrays of the same n, same threads and dtypes as the engine feeds it;
 *  - NVMe placement: the disk bound, fio on the same path at the engine's
 *    block size and queue depth (--fio-iomem shmhuge: fio's best): the
 *    shorter of reads then writes (bytes read / fio read bandwidth + bytes
 *    written / fio write bandwidth) and both at once (fio --rw=rw with the
 *    step's read share: the bytes of each direction at its own rate in
 *    that mix, the slower direction's time). A disk that serves a mix
 *    faster than one direction after the other (virtual disks do) sets
 *    the lower bound by the mix; the engine reads and writes at once;
 *  - --dpu with --compute-ms: max(compute, optimizer step) per iteration.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "tool_common.h"

enum { EXIT_OK = 0, EXIT_RUN = 1, EXIT_USAGE = 2 };

typedef struct opts {
    uint64_t params, tensor_elems, sub_group, pinned;
    zo_optim_placement placement;
    const char *nvme_path, *config, *fio, *fio_iomem;
    zo_dtype grad, state;
    int qbits; /* --state q8 / q4: quantized m and v (state is then fp32) */
    zo_optim_kind kind;
    unsigned steps, pairs, dpu_warmup;
    int dpu, dpu_double, vs_bound, json, progress, threads;
    double compute_ms, clip;
    double fio_runtime; /* --fio-runtime: < 0 auto (as long as the step), 0 once over the file, else seconds */
    zo_dev_kind backend;
} opts;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* usage errors: "zo-optim-bench: message" on stderr, exit status 2 (tool_common.c) */
#define bad(...) zo_tool_bad("zo-optim-bench", __VA_ARGS__)

static void usage(FILE *f)
{
    fprintf(f, "usage: zo-optim-bench [options]\n"
               "Drive the offload optimizer engine with synthetic gradients; measure step time and its split.\n\n"
               "  --params N            parameters (default 64M; suffixes K M G, or 1e9)\n"
               "  --tensor-elems N      largest tensor the model is cut into (default 32M elements)\n"
               "  --placement host|nvme where masters and states live (default host)\n"
               "  --nvme-path DIR       directory for NVMe placement (default /var/tmp); a private\n"
               "                        directory is made inside and removed at exit\n"
               "  --grad bf16|fp16|fp32 device param and gradient dtype (default bf16)\n"
               "  --state fp32|bf16|q8|q4  m and v: fp32 (default), bf16, or block-quantized 8 / 4 bits\n"
               "                        (also --state-dtype)\n"
               "  --optimizer NAME      adamw (default), adam, adagrad, lion\n"
               "  --sub-group N         elements per sub-group (default: the engine's)\n"
               "  --pinned BYTES        pinned budget (default: the engine's)\n"
               "  --threads N           optimizer threads (default: all)\n"
               "  --clip X              global-norm clipping at X (default off)\n"
               "  --dpu                 delayed parameter update (--dpu-warmup K, default 1)\n"
               "  --dpu-params double|single  under --dpu: double-buffered device params, switched at the\n"
               "                        step call (default), or one buffer copied to at the step call\n"
               "  --compute-ms X        device-stream work per iteration (default 0)\n"
               "  --steps N             timed steps without --vs-bound (default 5)\n"
               "  --vs-bound            alternate with the bound (kernel, fio, or max(compute, step)); --pairs N\n"
               "  --fio PATH, --fio-iomem MODE   fio binary and its --iomem (shmhuge: huge pages)\n"
               "  --fio-runtime auto|once|S   each fio pass as long as the previous step (auto, default),\n"
               "                        one pass over the file, or S seconds\n"
               "  --config FILE         engine JSON config (DeepSpeed keys accepted), applied after the flags\n"
               "  --backend host|cuda   device backend (default host)\n"
               "  --json                one JSON object on stdout\n"
               "  --no-progress         no per-step line\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end); /* 1e9 */
    if (errno == 0 && *end == '\0' && d >= 1 && d < 0x1p62 && d == floor(d)) {
        *out = (uint64_t)d;
        return 0;
    }
    return zo_parse_size(s, out) == 0 && *out > 0 ? 0 : -1;
}

/* ---- the options' sets (zo_tool_opt: tool_common.h) ---------------------------- */
/* a positive count (1e9 and K M G suffixes accepted) into a uint64_t */
static int set_count(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (parse_u64(arg, d->dst))
        return bad("--%s: \"%s\" is not a positive count", d->name, arg);
    return 0;
}

/* a count in 1..hi into an unsigned */
static int set_count_to(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t u;
    if (parse_u64(arg, &u) || u > d->hi)
        return bad("--%s: \"%s\" is not in 1..%llu", d->name, arg, d->hi);
    *(unsigned *)d->dst = (unsigned)u;
    return 0;
}

static int set_placement(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    zo_optim_placement *p = d->dst;
    if (strcmp(arg, "host") == 0)
        *p = ZO_OPTIM_PLACE_HOST;
    else if (strcmp(arg, "nvme") == 0)
        *p = ZO_OPTIM_PLACE_NVME;
    else
        return bad("--placement: \"%s\" is not host or nvme", arg);
    return 0;
}

static int set_grad(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    zo_dtype *t = d->dst;
    if (zo_dtype_parse(arg, t) < 0 || (*t != ZO_DTYPE_BF16 && *t != ZO_DTYPE_F16 && *t != ZO_DTYPE_F32))
        return bad("--grad: \"%s\" is not bf16, fp16 or fp32", arg);
    return 0;
}

static int set_state(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    opts *o = d->dst;
    if (zo_tool_state_parse(arg, &o->state, &o->qbits) < 0)
        return bad("--%s: \"%s\" is not fp32, bf16, q8 or q4", d->name, arg);
    return 0;
}

static const char *state_name(const opts *o)
{
    return zo_tool_state_name(o->state, o->qbits);
}

static int set_optimizer(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    static const struct {
        const char *name;
        zo_optim_kind kind;
    } kinds[] = {{"adamw", ZO_OPTIM_ADAMW}, {"adam", ZO_OPTIM_ADAM}, {"adagrad", ZO_OPTIM_ADAGRAD},
                 {"lion", ZO_OPTIM_LION}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (strcasecmp(arg, kinds[i].name) == 0) {
            *(zo_optim_kind *)d->dst = kinds[i].kind;
            return 0;
        }
    return bad("--optimizer: \"%s\" is not adamw, adam, adagrad or lion", arg);
}

static int set_pinned(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (zo_parse_size(arg, d->dst) < 0)
        return bad("--pinned: \"%s\" is not a byte count", arg);
    return 0;
}

static int set_threads(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    int *t = d->dst;
    char *end;
    *t = (int)strtol(arg, &end, 10);
    if (*end || *t < 1 || *t > 1024)
        return bad("--threads: \"%s\" is not in 1..1024", arg);
    return 0;
}

static int set_clip(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    double *c = d->dst;
    char *end;
    *c = strtod(arg, &end);
    if (*end || !(*c > 0) || !isfinite(*c))
        return bad("--clip: \"%s\" is not a positive number", arg);
    return 0;
}

static int set_dpu_warmup(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t u;
    if (parse_u64(arg, &u) && strcmp(arg, "0") != 0)
        return bad("--dpu-warmup: \"%s\" is not a count", arg);
    *(unsigned *)d->dst = strcmp(arg, "0") == 0 ? 0 : (unsigned)u;
    return 0;
}

static int set_dpu_params(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (strcmp(arg, "double") == 0)
        *(int *)d->dst = 1;
    else if (strcmp(arg, "single") == 0)
        *(int *)d->dst = 0;
    else
        return bad("--dpu-params: \"%s\" is not double or single", arg);
    return 0;
}

static int set_compute_ms(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    double *ms = d->dst;
    char *end;
    *ms = strtod(arg, &end);
    if (*end || *ms < 0 || *ms > 3.6e6)
        return bad("--compute-ms: \"%s\" is not a duration in ms", arg);
    return 0;
}

static int set_fio_runtime(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    double *s = d->dst;
    char *end;
    if (!strcmp(arg, "auto"))
        *s = -1;
    else if (!strcmp(arg, "once"))
        *s = 0;
    else if ((*s = strtod(arg, &end)), *end || !(*s > 0) || *s > 3600)
        return bad("--fio-runtime: \"%s\" is not auto, once or seconds in (0, 3600]", arg);
    return 0;
}

static int set_backend(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (zo_dev_kind_parse(arg, d->dst) < 0)
        return bad("--backend: \"%s\" is not host or cuda", arg);
    return 0;
}

/* -1: parsed, go on; else the exit status (2: bad usage) */
static int parse_opts(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof(*o));
    o->params = 64ull << 20;
    o->tensor_elems = 32ull << 20;
    o->placement = ZO_OPTIM_PLACE_HOST;
    o->nvme_path = "/var/tmp";
    o->grad = ZO_DTYPE_BF16;
    o->state = ZO_DTYPE_F32;
    o->kind = ZO_OPTIM_ADAMW;
    o->steps = 5;
    o->pairs = 5;
    o->dpu_warmup = 1;
    o->dpu_double = 1;
    o->fio_runtime = -1;
    o->progress = 1;
    o->backend = ZO_DEV_HOST;
    const zo_tool_opt table[] = {
        {"params", 1, 0, set_count, &o->params, 0, 0, NULL},
        {"tensor-elems", 1, 0, set_count, &o->tensor_elems, 0, 0, NULL},
        {"placement", 1, 0, set_placement, &o->placement, 0, 0, NULL},
        {"nvme-path", 1, 0, zo_tool_opt_str, &o->nvme_path, 0, 0, NULL},
        {"grad", 1, 0, set_grad, &o->grad, 0, 0, NULL},
        {"state", 1, 0, set_state, o, 0, 0, NULL},
        {"state-dtype", 1, 0, set_state, o, 0, 0, NULL},
        {"optimizer", 1, 0, set_optimizer, &o->kind, 0, 0, NULL},
        {"sub-group", 1, 0, set_count, &o->sub_group, 0, 0, NULL},
        {"pinned", 1, 0, set_pinned, &o->pinned, 0, 0, NULL},
        {"threads", 1, 0, set_threads, &o->threads, 0, 0, NULL},
        {"clip", 1, 0, set_clip, &o->clip, 0, 0, NULL},
        {"dpu", 0, 0, zo_tool_opt_on, &o->dpu, 0, 0, NULL},
        {"dpu-warmup", 1, 0, set_dpu_warmup, &o->dpu_warmup, 0, 0, NULL},
        {"dpu-params", 1, 0, set_dpu_params, &o->dpu_double, 0, 0, NULL},
        {"compute-ms", 1, 0, set_compute_ms, &o->compute_ms, 0, 0, NULL},
        {"steps", 1, 0, set_count_to, &o->steps, 1, 100000, NULL},
        {"vs-bound", 0, 0, zo_tool_opt_on, &o->vs_bound, 0, 0, NULL},
        {"pairs", 1, 0, set_count_to, &o->pairs, 1, 1000, NULL},
        {"fio", 1, 0, zo_tool_opt_str, &o->fio, 0, 0, NULL},
        {"fio-iomem", 1, 0, zo_tool_opt_str, &o->fio_iomem, 0, 0, NULL},
        {"fio-runtime", 1, 0, set_fio_runtime, &o->fio_runtime, 0, 0, NULL},
        {"config", 1, 0, zo_tool_opt_str, &o->config, 0, 0, NULL},
        {"backend", 1, 0, set_backend, &o->backend, 0, 0, NULL},
        {"json", 0, 0, zo_tool_opt_on, &o->json, 0, 0, NULL},
        {"no-progress", 0, 0, zo_tool_opt_off, &o->progress, 0, 0, NULL},
        {"help", 0, 0, zo_tool_opt_help, NULL, 0, 0, NULL},
    };
    opterr = 0;
    const zo_tool_cli cli = {"zo-optim-bench", usage, table, sizeof(table) / sizeof(table[0])};
    int rc = zo_tool_opts_parse(&cli, argc, argv);
    if (rc)
        return rc > 0 ? rc : bad("unknown or incomplete option %s", argv[optind - 1]);
    if (optind < argc)
        return bad("unexpected argument \"%s\"", argv[optind]);
    if (o->json)
        o->progress = 0;
    return -1;
}

/* ---- the run ---------------------------------------------------------------------- */
typedef struct bench {
    const opts *o;
    zo_dev *dev;
    zo_stream *compute;
    zo_event **ev;   /* one per tensor: "backward produced this gradient" */
    unsigned nt;
    uint64_t *numel;
    void **dparam, **dgrad;
    void **cur;      /* where the next forward reads each tensor's params (double-buffered under DPU) */
    zo_optim_group grp;
    zo_optim_config cfg;
    zo_optim_json *json;
    zo_optim *opt;
    zo_tool_rundir run; /* private NVMe directory, removed at exit (a killed run's: by the next run) */
    const char *dir;    /* run.path */
    char fio_file[4200];
    double slice_s;  /* compute per tensor */
    double warm_step_s; /* the warm-up step's time (--fio-runtime auto before the first timed step) */
} bench;

/* A fixed pseudo-random gradient pattern in [-5e-3, 5e-3) (fp32). */
static void fill_grad(float *p, uint64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        p[i] = (float)((double)((s * 0x2545f4914f6cdd1dull) >> 40) / (double)(1ull << 24) - 0.5) * 1e-2f;
    }
}

static void bench_free(bench *b)
{
    zo_optim_destroy(&b->opt);
    for (unsigned i = 0; b->dparam && i < b->nt; i++) {
        if (b->dparam[i])
            zo_dev_free(b->dev, b->dparam[i]);
        if (b->dgrad[i])
            zo_dev_free(b->dev, b->dgrad[i]);
        zo_event_destroy(&b->ev[i]);
    }
    free(b->dparam);
    free(b->dgrad);
    free(b->cur);
    free(b->ev);
    free(b->numel);
    zo_stream_destroy(&b->compute);
    zo_dev_close(&b->dev);
    zo_optim_json_free(&b->json);
    if (b->fio_file[0])
        unlink(b->fio_file);
    /* the engine's swap store removed its arenas at destroy; what is left
     * is ours (the run's owner mark) */
    zo_tool_rundir_remove(&b->run);
}

static volatile sig_atomic_t interrupted;
static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Tensor i's device params and gradient, and its "gradient produced" event */
static int tensor_make(bench *b, unsigned i, size_t esz)
{
    const opts *o = b->o;
    int rc;
    b->numel[i] = i + 1 < b->nt ? o->tensor_elems : o->params - (uint64_t)i * o->tensor_elems;
    if ((rc = zo_dev_malloc(b->dev, &b->dparam[i], b->numel[i] * esz)) < 0 ||
        (rc = zo_dev_malloc(b->dev, &b->dgrad[i], b->numel[i] * esz)) < 0 ||
        (rc = zo_event_create(b->dev, &b->ev[i])) < 0)
        return rc;
    /* params: small values; grads: a fixed pseudo-random pattern per tensor,
     * written through a host buffer and copied (the cuda backend's memory
     * is not host-addressable) */
    void *h = malloc(b->numel[i] * 4);
    if (!h)
        return -ENOMEM;
    fill_grad(h, b->numel[i], i + 1);
    if (o->grad != ZO_DTYPE_F32) {
        void *h2 = malloc(b->numel[i] * esz);
        if (!h2) {
            free(h);
            return -ENOMEM;
        }
        zo_vec_cast(h2, o->grad, h, ZO_DTYPE_F32, b->numel[i]);
        free(h);
        h = h2;
    }
    rc = zo_memcpy_async(b->compute, b->dgrad[i], h, b->numel[i] * esz, ZO_COPY_H2D);
    if (rc == 0)
        rc = zo_memcpy_async(b->compute, b->dparam[i], h, b->numel[i] * esz, ZO_COPY_H2D);
    if (rc == 0)
        rc = zo_stream_sync(b->compute);
    free(h);
    return rc < 0 ? rc : 0;
}

static int setup(bench *b, const opts *o)
{
    memset(b, 0, sizeof(*b));
    b->o = o;
    int rc;
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.kind = o->backend;
    if ((rc = zo_dev_open(&b->dev, &dc)) < 0) {
        fprintf(stderr, "zo-optim-bench: %s backend: %s (%s)\n", zo_dev_kind_name(o->backend), zo_strerror(rc),
                zo_last_error_detail());
        return EXIT_RUN;
    }
    if ((rc = zo_stream_create(b->dev, &b->compute)) < 0)
        goto fail;
    b->nt = (unsigned)((o->params + o->tensor_elems - 1) / o->tensor_elems);
    b->numel = calloc(b->nt, sizeof(*b->numel));
    b->dparam = calloc(b->nt, sizeof(void *));
    b->dgrad = calloc(b->nt, sizeof(void *));
    b->ev = calloc(b->nt, sizeof(*b->ev));
    b->cur = calloc(b->nt, sizeof(void *));
    if (!b->numel || !b->dparam || !b->dgrad || !b->ev || !b->cur) {
        rc = -ENOMEM;
        goto fail;
    }
    size_t esz = zo_dtype_size(o->grad);
    for (unsigned i = 0; i < b->nt; i++)
        if ((rc = tensor_make(b, i, esz)) < 0)
            goto fail;
    b->slice_s = o->compute_ms * 1e-3 / b->nt;

    zo_optim_group_default(&b->grp);
    b->grp.ntensors = b->nt;
    b->grp.numel = b->numel;
    b->grp.dev_params = b->dparam;
    b->grp.state_dtype = o->state;
    b->grp.state_bits = (uint16_t)o->qbits;
    zo_optim_config_default(&b->cfg);
    b->cfg.dev = b->dev;
    b->cfg.param_dtype = o->grad;
    b->cfg.grad_dtype = o->grad;
    zo_cpuadam_hparams_default(&b->cfg.hparams, o->kind);
    b->cfg.placement = o->placement;
    if (o->sub_group)
        b->cfg.sub_group_size = o->sub_group;
    if (o->pinned)
        b->cfg.pinned_bytes = o->pinned;
    b->cfg.nthreads = o->threads;
    b->cfg.max_grad_norm = o->clip;
    b->cfg.dpu = o->dpu;
    b->cfg.dpu_warmup_steps = o->dpu_warmup;
    b->cfg.dpu_double_buffer = o->dpu && o->dpu_double;
    if (o->grad == ZO_DTYPE_F16)
        b->cfg.loss_scale = 1; /* static: synthetic gradients never overflow, the scaler would only skew timing */
    if (o->placement == ZO_OPTIM_PLACE_NVME) {
        if (mkdir(o->nvme_path, 0700) < 0 && errno != EEXIST) {
            fprintf(stderr, "zo-optim-bench: --nvme-path %s: %s\n", o->nvme_path, strerror(errno));
            rc = EXIT_USAGE;
            goto fail_usage;
        }
        char why[4300];
        if (zo_tool_rundir_make(&b->run, "zo-optim-bench", o->nvme_path, why, sizeof(why)) < 0) {
            fprintf(stderr, "zo-optim-bench: %s\n", why);
            rc = EXIT_USAGE;
            goto fail_usage;
        }
        b->dir = b->run.path;
        b->cfg.nvme_path = b->dir;
    }
    if (o->config) {
        if ((rc = zo_optim_json_load(o->config, &b->json)) < 0 ||
            (rc = zo_optim_json_apply(b->json, &b->cfg, &b->grp)) < 0) {
            fprintf(stderr, "zo-optim-bench: --config %s: %s\n", o->config, zo_last_error_detail());
            rc = EXIT_USAGE;
            goto fail_usage;
        }
        if (!o->json && zo_optim_json_report(b->json)[0])
            fprintf(stderr, "%s", zo_optim_json_report(b->json));
    }
    b->cfg.groups = &b->grp;
    b->cfg.ngroups = 1;
    if ((rc = zo_optim_create(&b->opt, &b->cfg)) < 0) {
        fprintf(stderr, "zo-optim-bench: zo_optim_create: %s (%s)\n", zo_strerror(rc), zo_last_error_detail());
        rc = rc == ZO_ECONFIG || rc == ZO_EBUDGET || rc == -EINVAL ? EXIT_USAGE : EXIT_RUN;
        goto fail_usage;
    }
    if ((rc = zo_optim_init_from_device(b->opt)) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "zo-optim-bench: set-up failed: %s (%s)\n", zo_strerror(rc), zo_last_error_detail());
    rc = EXIT_RUN;
fail_usage:
    bench_free(b);
    return rc;
}

/* "Backward": the device stream computes, each tensor's gradient becomes
 * valid in turn and is handed to the engine at once. */
static int hand_grads(bench *b)
{
    for (unsigned i = 0; i < b->nt; i++) {
        int rc;
        if (b->slice_s > 0) {
            if ((rc = zo_dev_busy(b->compute, b->slice_s)) < 0)
                return rc;
        }
        if ((rc = zo_event_record(b->ev[i], b->compute)) < 0)
            return rc;
        if ((rc = zo_optim_grad(b->opt, i, b->dgrad[i], b->ev[i])) < 0)
            return rc;
    }
    return 0;
}

typedef struct iter_res {
    double iter_s, step_s;   /* whole iteration; the step call(s) */
    zo_optim_timeline tl;
    int have_tl;
} iter_res;

/* What a framework does after each step call: look up where each tensor's
 * params are for the next forward and order its stream after them (with
 * double-buffered params the pointers alternate between two buffers; the
 * synthetic compute does not read them, but the look-up is part of the cost). */
static int next_params(bench *b)
{
    for (unsigned i = 0; i < b->nt; i++) {
        zo_event *ev = NULL;
        int rc = zo_optim_param_device(b->opt, i, &b->cur[i], &ev);
        if (rc < 0)
            return rc;
        if (ev && (rc = zo_stream_wait_event(b->compute, ev)) < 0)
            return rc;
    }
    return 0;
}

/* One training iteration. With DPU the step call returns once the update is
 * queued, and the iteration ends when the device has finished its compute. */
static int iterate(bench *b, iter_res *r, int isolate)
{
    memset(r, 0, sizeof(*r));
    r->tl.struct_size = sizeof(r->tl);
    double t0 = now_s();
    int rc = hand_grads(b);
    if (rc < 0)
        return rc;
    if (isolate) { /* time the step alone: gradients landed first */
        if ((rc = zo_stream_sync(b->compute)) < 0 || (rc = zo_optim_grads_done(b->opt)) < 0)
            return rc;
    }
    double ts = now_s();
    rc = b->o->dpu ? zo_optim_step_async(b->opt, NULL) : zo_optim_step(b->opt, NULL, NULL);
    if (rc < 0 || (rc = next_params(b)) < 0)
        return rc;
    r->step_s = now_s() - ts;
    if ((rc = zo_stream_sync(b->compute)) < 0)
        return rc;
    r->iter_s = now_s() - t0;
    r->have_tl = zo_optim_get_timeline(b->opt, &r->tl) == 0;
    return 0;
}

static void print_progress(unsigned k, unsigned n, const iter_res *r)
{
    const zo_optim_timeline *t = &r->tl;
    printf("step %3u/%u  iter %8.1f ms  step %8.1f ms", k, n, r->iter_s * 1e3, r->step_s * 1e3);
    if (r->have_tl)
        printf(" | opt %7.1f upd %7.1f: d2h %6.1f norm %6.1f compute %7.1f nvme-rd %7.1f nvme-wr %7.1f h2d %6.1f "
               "stall %6.1f ms",
               t->total_ns * 1e-6, t->update_ns * 1e-6, t->d2h_ns * 1e-6, t->norm_ns * 1e-6, t->compute_ns * 1e-6, t->nvme_read_ns * 1e-6,
               t->nvme_write_ns * 1e-6, t->h2d_ns * 1e-6, t->stall_ns * 1e-6);
    printf("\n");
    fflush(stdout);
}

/* The bare fused kernel on plain arrays of the same n: what the engine feeds
 * the kernel (gradients in the engine's window dtype: bf16/fp16 as handed
 * over when nothing accumulates, else fp32; the group's state dtype; the
 * device dtype out). */
typedef struct kernel_ref {
    float *p;
    void *g, *m, *v, *out;
    zo_dtype gdt;
    uint64_t n;
} kernel_ref;

static int kernel_ref_alloc(kernel_ref *k, const opts *o, zo_dtype window)
{
    memset(k, 0, sizeof(*k));
    k->n = o->params;
    k->gdt = window;
    size_t ss = zo_dtype_size(o->state);
    int rc = 0;
    rc |= zo_aligned_alloc((void **)&k->p, k->n * 4, 64);
    rc |= zo_aligned_alloc(&k->g, k->n * zo_dtype_size(window), 64);
    rc |= zo_aligned_alloc(&k->m, k->n * ss, 64);
    rc |= zo_aligned_alloc(&k->v, k->n * ss, 64);
    rc |= zo_aligned_alloc(&k->out, k->n * zo_dtype_size(o->grad), 64);
    if (rc)
        return -ENOMEM;
    fill_grad(k->p, k->n, 7); /* p as scratch: the gradients in fp32, narrowed into g */
    if (window == ZO_DTYPE_F32)
        memcpy(k->g, k->p, k->n * 4);
    else if ((rc = zo_vec_cast(k->g, window, k->p, ZO_DTYPE_F32, k->n)) < 0)
        return rc;
    memset(k->p, 0, k->n * 4);
    memset(k->m, 0, k->n * ss);
    memset(k->v, 0, k->n * ss);
    return 0;
}

static void kernel_ref_free(kernel_ref *k)
{
    zo_aligned_free(k->p);
    zo_aligned_free(k->g);
    zo_aligned_free(k->m);
    zo_aligned_free(k->v);
    zo_aligned_free(k->out);
}

static int kernel_ref_step(kernel_ref *k, const bench *b, int64_t step, double *secs)
{
    zo_cpuadam_hparams hp = b->cfg.hparams;
    hp.step = step;
    zo_cpuadam_tensors t;
    zo_cpuadam_tensors_default(&t);
    t.n = k->n;
    t.param = k->p;
    t.grad = k->g;
    t.grad_dtype = k->gdt;
    t.exp_avg = k->m;
    t.exp_avg_sq = k->v;
    t.state_dtype = b->o->state;
    t.param_out = k->out;
    t.out_dtype = b->o->grad;
    int threads = b->o->threads;
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    double t0 = now_s();
    int rc = zo_cpuadam_step(&hp, &t, threads);
    *secs = now_s() - t0;
    return rc;
}

static uint64_t peak_rss(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0;
}

/* ---- main's phases --------------------------------------------------------------- */
/* What the timed runs record, one entry a run, and the bound's means */
typedef struct runs {
    unsigned n, done; /* asked for; done (interrupted: fewer) */
    double *zo_t, *ref_t, *ratio, *fio_r, *fio_w, *fio_mr, *fio_mw, *seq_t, *mix_t, *iter_t;
    zo_optim_timeline *tls;
    kernel_ref kr; /* --vs-bound, host: the bare kernel's arrays */
    zo_fio_job fj; /* --vs-bound, NVMe: fio's job */
} runs;

static int runs_alloc(runs *rs, unsigned n)
{
    memset(rs, 0, sizeof(*rs));
    rs->n = n;
    double **series[] = {&rs->zo_t,   &rs->ref_t,  &rs->ratio, &rs->fio_r,  &rs->fio_w,
                         &rs->fio_mr, &rs->fio_mw, &rs->seq_t, &rs->mix_t, &rs->iter_t};
    int ok = 1;
    for (size_t i = 0; i < sizeof(series) / sizeof(series[0]); i++)
        ok &= (*series[i] = calloc(n, sizeof(double))) != NULL;
    rs->tls = calloc(n, sizeof(*rs->tls));
    return ok && rs->tls ? 0 : -ENOMEM;
}

static void runs_free(runs *rs)
{
    kernel_ref_free(&rs->kr);
    free(rs->zo_t), free(rs->ref_t), free(rs->ratio), free(rs->fio_r), free(rs->fio_w), free(rs->iter_t), free(rs->tls);
    free(rs->fio_mr), free(rs->fio_mw), free(rs->seq_t), free(rs->mix_t);
}

/* A failure with an error code: said with the library's detail, EXIT_RUN */
static int run_failed(int rc)
{
    fprintf(stderr, "zo-optim-bench: %s (%s)\n", zo_strerror(rc), zo_last_error_detail());
    return EXIT_RUN;
}

static void print_head(const bench *b, const zo_optim_info *info, const zo_machine *mach)
{
    const opts *o = b->o;
    printf("zo-optim-bench %s: %s placement, %.3g params in %u tensors (%u sub-groups), grads/params %s, states %s, "
           "%s%s\n",
           zo_version_string(), o->placement == ZO_OPTIM_PLACE_NVME ? "nvme" : "host", (double)o->params, b->nt,
           info->nsubgroups, zo_dtype_name(o->grad), state_name(o), zo_cpuadam_variant(),
           o->dpu ? (o->dpu_double ? ", DPU (double-buffered params)" : ", DPU (single param buffer)") : "");
    zo_machine_print(mach, stdout);
    if (o->placement == ZO_OPTIM_PLACE_NVME) {
        char where[256];
        zo_path_storage(b->dir, where, sizeof(where));
        printf("path:    %s (%s)\n", b->dir, where);
    }
    printf("engine:  pinned %.1f MiB, other host %.1f MiB (gradient window %.1f MiB of it, %s)\n",
           info->pinned_bytes / 1048576.0, info->host_bytes / 1048576.0, info->grad_buffer_bytes / 1048576.0,
           zo_dtype_name(info->grad_buffer_dtype));
    if (o->compute_ms > 0)
        printf("compute: %.1f ms per iteration on the device stream\n", o->compute_ms);
}

/* The bound's means: the bare kernel's arrays (host), or fio's job on the
 * same directory (NVMe); nothing under --dpu or without --vs-bound */
static int bound_prepare(bench *b, runs *rs, const zo_optim_info *info)
{
    const opts *o = b->o;
    int rc;
    if (o->vs_bound && !o->dpu && o->placement == ZO_OPTIM_PLACE_HOST &&
        (rc = kernel_ref_alloc(&rs->kr, o, info->grad_buffer_dtype)) < 0)
        return rc;
    if (o->vs_bound && !o->dpu && o->placement == ZO_OPTIM_PLACE_NVME) {
        /* fio on the same directory, the engine's block size and queue depth,
         * a file as large as the state (at most 4 GiB: enough to leave any
         * cache behind with O_DIRECT) */
        uint64_t bytes = o->qbits ? o->params * 4 + o->params * (uint64_t)o->qbits / 4
                                  : o->params * (4 + 2 * zo_dtype_size(o->state));
        uint64_t fsz = bytes < (4ull << 30) ? bytes : (4ull << 30);
        fsz = (fsz + b->cfg.aio_block_size - 1) / b->cfg.aio_block_size * b->cfg.aio_block_size;
        snprintf(b->fio_file, sizeof(b->fio_file), "%s/fio.dat", b->dir);
        rs->fj = (zo_fio_job){.fio = o->fio, .filename = b->fio_file, .size = fsz, .bs = b->cfg.aio_block_size,
                              .iodepth = b->cfg.aio_queue_depth, .numjobs = 1, .direct = 1, .fixedbufs = 1,
                              .iomem = o->fio_iomem};
        if (!o->json)
            printf("fio:     --size=%llu --bs=%zu --iodepth=%u --direct=1 --ioengine=io_uring --fixedbufs "
                   "--registerfiles%s%s, read, write, then rw (--rwmixread: the step's share)\n",
                   (unsigned long long)fsz, b->cfg.aio_block_size, b->cfg.aio_queue_depth,
                   o->fio_iomem ? " --iomem=" : "", o->fio_iomem ? o->fio_iomem : "");
    }
    return 0;
}

/* One fio run of fj as rw: 0, or EXIT_RUN (said) */
static int fio_once(zo_fio_job *fj, const char *rw, zo_fio_result *fr)
{
    fj->rw = rw;
    if (zo_fio_run(fj, fr) != 0) {
        fprintf(stderr, "zo-optim-bench: fio failed: %s\n", fr->err);
        return EXIT_RUN;
    }
    return 0;
}

/* Run k's bound: the bare kernel, or fio's read and write (the file laid
 * out first: fio reads need it). 0; < 0 an error code; EXIT_RUN (said). */
static int bound_run(bench *b, runs *rs, unsigned k)
{
    const opts *o = b->o;
    if (o->vs_bound && !o->dpu && o->placement == ZO_OPTIM_PLACE_HOST)
        return kernel_ref_step(&rs->kr, b, (int64_t)k + 1, &rs->ref_t[k]);
    if (!o->vs_bound || o->dpu)
        return 0;
    zo_fio_result fr;
    rs->fj.runtime_ms = 0; /* laying the file out: one pass */
    if (k == 0 && fio_once(&rs->fj, "write", &fr))
        return EXIT_RUN;
    /* Each pass as long as the step it is the bound of (auto): a step of
     * seconds on a journaling filesystem includes its periodic commits
     * (ext4 every 5 s, a cache flush the disk stalls on: 0.1-0.3 s seen
     * here), which one short pass over the file may miss */
    double rt = o->fio_runtime < 0 ? (k > 0 ? rs->zo_t[k - 1] : b->warm_step_s) : o->fio_runtime;
    rs->fj.runtime_ms = rt > 0 ? (uint64_t)fmax(1000.0, rt * 1e3) : 0;
    if (fio_once(&rs->fj, "read", &fr))
        return EXIT_RUN;
    rs->fio_r[k] = fr.bw[0];
    if (fio_once(&rs->fj, "write", &fr))
        return EXIT_RUN;
    rs->fio_w[k] = fr.bw[1];
    /* the mix in the step's proportions: a sweep reads and writes every
     * byte it moves (50 / 50) unless the previous step said otherwise */
    double rd = k > 0 ? (double)rs->tls[k - 1].nvme_read_bytes : 1, wr = k > 0 ? (double)rs->tls[k - 1].nvme_write_bytes : 1;
    unsigned mix = rd + wr > 0 ? (unsigned)lround(100.0 * rd / (rd + wr)) : 50;
    rs->fj.rwmixread = mix < 1 ? 1 : mix > 99 ? 99 : mix;
    int rc = fio_once(&rs->fj, "rw", &fr);
    rs->fj.rwmixread = 0;
    if (rc)
        return EXIT_RUN;
    rs->fio_mr[k] = fr.bw[0];
    rs->fio_mw[k] = fr.bw[1];
    return 0;
}

/* Run k's times, its ratio to the bound, and its progress line */
static void record_run(const bench *b, runs *rs, unsigned k, const iter_res *r)
{
    const opts *o = b->o;
    if (o->dpu) /* the update's own time (its timeline's update_ns: total_ns would count the wait for this
                  step call too) */
        rs->zo_t[k] = r->have_tl ? r->tl.update_ns * 1e-9 : r->step_s;
    else
        rs->zo_t[k] = r->step_s;
    rs->iter_t[k] = r->iter_s;
    rs->tls[k] = r->tl;
    if (o->vs_bound && o->dpu) {
        double ideal = fmax(o->compute_ms * 1e-3, rs->zo_t[k]);
        rs->ref_t[k] = ideal;
        rs->ratio[k] = rs->iter_t[k] / ideal;
    } else if (o->vs_bound && o->placement == ZO_OPTIM_PLACE_HOST) {
        rs->ratio[k] = rs->zo_t[k] / rs->ref_t[k];
    } else if (o->vs_bound) {
        double rd = (double)r->tl.nvme_read_bytes, wr = (double)r->tl.nvme_write_bytes;
        rs->seq_t[k] = (rs->fio_r[k] > 0 ? rd / rs->fio_r[k] : 0) + (rs->fio_w[k] > 0 ? wr / rs->fio_w[k] : 0);
        /* at once: each direction at its rate in the mix; the slower one ends it */
        rs->mix_t[k] = fmax(rs->fio_mr[k] > 0 ? rd / rs->fio_mr[k] : 0, rs->fio_mw[k] > 0 ? wr / rs->fio_mw[k] : 0);
        rs->ref_t[k] = rs->mix_t[k] > 0 ? fmin(rs->seq_t[k], rs->mix_t[k]) : rs->seq_t[k];
        rs->ratio[k] = rs->ref_t[k] > 0 ? rs->zo_t[k] / rs->ref_t[k] : 0;
    }
    if (o->progress) {
        print_progress(k + 1, rs->n, r);
        if (o->vs_bound) {
            printf("          bound %8.1f ms%s  ratio %.3f", rs->ref_t[k] * 1e3,
                   o->dpu ? " (max(compute, step))" : o->placement == ZO_OPTIM_PLACE_NVME ? " (disk)" : " (kernel)",
                   rs->ratio[k]);
            if (!o->dpu && o->placement == ZO_OPTIM_PLACE_NVME)
                printf("  (read then write %.1f ms, mixed %.1f ms)", rs->seq_t[k] * 1e3, rs->mix_t[k] * 1e3);
            printf("\n");
        }
    }
}

/* The medians over the runs done */
typedef struct summary {
    unsigned n;
    double med_step, med_iter, med_ref, med_ratio;
    uint64_t rd, wr; /* the last step's NVMe bytes */
} summary;

static void summarize(const opts *o, const runs *rs, summary *sm)
{
    unsigned n = rs->done;
    sm->n = n;
    sm->med_step = zo_median(rs->zo_t, n), sm->med_iter = zo_median(rs->iter_t, n);
    sm->med_ref = o->vs_bound ? zo_median(rs->ref_t, n) : 0, sm->med_ratio = o->vs_bound ? zo_median(rs->ratio, n) : 0;
    sm->rd = rs->tls[n - 1].nvme_read_bytes, sm->wr = rs->tls[n - 1].nvme_write_bytes;
}

static void json_steps(zo_json *j, const opts *o, const runs *rs, unsigned n)
{
    zj_arr_begin(j, "steps");
    for (unsigned k = 0; k < n; k++) {
        const zo_optim_timeline *t = &rs->tls[k];
        zj_obj_begin(j, NULL);
        zj_num(j, "iter_s", rs->iter_t[k]);
        zj_num(j, "step_s", rs->zo_t[k]);
        if (o->vs_bound) {
            zj_num(j, "bound_s", rs->ref_t[k]);
            zj_num(j, "ratio", rs->ratio[k]);
            if (!o->dpu && o->placement == ZO_OPTIM_PLACE_NVME) {
                zj_num(j, "bound_read_then_write_s", rs->seq_t[k]);
                zj_num(j, "bound_mixed_s", rs->mix_t[k]);
            }
        }
        zj_uint(j, "d2h_ns", t->d2h_ns);
        zj_uint(j, "norm_ns", t->norm_ns);
        zj_uint(j, "compute_ns", t->compute_ns);
        zj_uint(j, "nvme_read_ns", t->nvme_read_ns);
        zj_uint(j, "nvme_write_ns", t->nvme_write_ns);
        zj_uint(j, "h2d_ns", t->h2d_ns);
        zj_uint(j, "stall_ns", t->stall_ns);
        zj_uint(j, "update_ns", t->update_ns);
        zj_uint(j, "total_ns", t->total_ns);
        zj_obj_end(j);
    }
    zj_arr_end(j);
}

static void report_json(const bench *b, const runs *rs, const summary *sm, const zo_optim_info *info,
                        const zo_machine *mach)
{
    const opts *o = b->o;
    unsigned n = sm->n;
    const char *mode =
        o->vs_bound ? (o->dpu ? "dpu" : o->placement == ZO_OPTIM_PLACE_NVME ? "disk" : "kernel") : "steps";
    zo_json j;
    zj_init(&j, stdout, 0);
    zj_obj_begin(&j, NULL);
    zj_str(&j, "tool", "zo-optim-bench");
    zj_str(&j, "version", zo_version_string());
    zo_machine_json(mach, &j, "machine");
    zj_str(&j, "placement", o->placement == ZO_OPTIM_PLACE_NVME ? "nvme" : "host");
    zj_uint(&j, "params", o->params);
    zj_uint(&j, "tensors", b->nt);
    zj_uint(&j, "sub_groups", info->nsubgroups);
    zj_str(&j, "grad_dtype", zo_dtype_name(o->grad));
    zj_str(&j, "state_dtype", state_name(o));
    zj_str(&j, "kernel", zo_cpuadam_variant());
    zj_bool(&j, "dpu", o->dpu);
    if (o->dpu)
        zj_str(&j, "dpu_params", o->dpu_double ? "double" : "single");
    zj_num(&j, "compute_ms", o->compute_ms);
    zj_str(&j, "mode", mode);
    zj_uint(&j, "runs", n);
    zj_num(&j, "step_s", sm->med_step);
    zj_num(&j, "iter_s", sm->med_iter);
    if (o->vs_bound) {
        zj_num(&j, "bound_s", sm->med_ref);
        zj_num(&j, "ratio", sm->med_ratio);
        if (o->placement == ZO_OPTIM_PLACE_NVME && !o->dpu) {
            zj_num(&j, "fio_read_bytes_per_s", zo_median(rs->fio_r, n));
            zj_num(&j, "fio_write_bytes_per_s", zo_median(rs->fio_w, n));
            zj_num(&j, "fio_mixed_read_bytes_per_s", zo_median(rs->fio_mr, n));
            zj_num(&j, "fio_mixed_write_bytes_per_s", zo_median(rs->fio_mw, n));
            zj_num(&j, "bound_read_then_write_s", zo_median(rs->seq_t, n));
            zj_num(&j, "bound_mixed_s", zo_median(rs->mix_t, n));
            if (o->fio_runtime < 0)
                zj_str(&j, "fio_runtime", "auto");
            else
                zj_num(&j, "fio_runtime", o->fio_runtime);
        }
    }
    zj_uint(&j, "nvme_read_bytes", sm->rd);
    zj_uint(&j, "nvme_write_bytes", sm->wr);
    zj_uint(&j, "pinned_bytes", info->pinned_bytes);
    zj_uint(&j, "host_bytes", info->host_bytes);
    /* gradients the device copied straight into a pinned window
     * (docs/optim.md), over the whole run: asked for now */
    zo_optim_info now = {.struct_size = sizeof(now)};
    if (zo_optim_get_info(b->opt, &now) == 0) {
        zj_uint(&j, "grad_windows_pinned", now.grad_windows_pinned);
        zj_uint(&j, "grad_direct_bytes_total", now.grad_direct_bytes_total);
    }
    zj_uint(&j, "peak_rss_bytes", peak_rss());
    json_steps(&j, o, rs, n);
    zj_obj_end(&j);
    zj_end(&j);
}

static void report_text(const opts *o, const runs *rs, const summary *sm, const zo_optim_info *info)
{
    unsigned n = sm->n;
    printf("\nmedian of %u: step %.1f ms, iteration %.1f ms", n, sm->med_step * 1e3, sm->med_iter * 1e3);
    if (o->placement == ZO_OPTIM_PLACE_NVME)
        printf(", NVMe %.2f GB read + %.2f GB written per step", sm->rd * 1e-9, sm->wr * 1e-9);
    printf("\n");
    if (o->vs_bound && o->dpu)
        printf("DPU: iteration %.1f ms vs ideal max(compute %.1f, step %.1f) = %.1f ms: ratio %.3f (serial "
               "would be %.1f ms)\n",
               sm->med_iter * 1e3, o->compute_ms, sm->med_step * 1e3, sm->med_ref * 1e3, sm->med_ratio,
               (o->compute_ms * 1e-3 + sm->med_step) * 1e3);
    else if (o->vs_bound && o->placement == ZO_OPTIM_PLACE_NVME) {
        printf("fio passes: %s\n", o->fio_runtime < 0    ? "each as long as the previous step (--fio-runtime auto)"
                                   : o->fio_runtime == 0 ? "one pass over the file each (--fio-runtime once)"
                                                         : "a fixed time each (--fio-runtime)");
        printf("disk bound %.1f ms: the shorter of read then write %.1f ms (fio read %.2f GB/s, write %.2f GB/s) "
               "and mixed %.1f ms (fio rw: read %.2f + write %.2f GB/s): step / bound = %.3f\n",
               sm->med_ref * 1e3, zo_median(rs->seq_t, n) * 1e3, zo_median(rs->fio_r, n) * 1e-9,
               zo_median(rs->fio_w, n) * 1e-9, zo_median(rs->mix_t, n) * 1e3, zo_median(rs->fio_mr, n) * 1e-9,
               zo_median(rs->fio_mw, n) * 1e-9, sm->med_ratio);
    }
    else if (o->vs_bound)
        printf("bare fused kernel %.1f ms on the same n: step / kernel = %.3f\n", sm->med_ref * 1e3, sm->med_ratio);
    printf("memory: engine pinned %.1f MiB + other host %.1f MiB (of it the gradient window %.1f MiB, %s); "
           "peak RSS %.1f MiB\n",
           info->pinned_bytes / 1048576.0, info->host_bytes / 1048576.0, info->grad_buffer_bytes / 1048576.0,
           zo_dtype_name(info->grad_buffer_dtype), peak_rss() / 1048576.0);
    if (interrupted)
        printf("interrupted: %u of %u runs done\n", rs->done, o->vs_bound ? o->pairs : o->steps);
}

/* The timed runs after the warm-up, and the report: the exit status */
static int run_and_report(bench *b, runs *rs, zo_optim_info *info, const zo_machine *mach)
{
    const opts *o = b->o;
    unsigned n = o->vs_bound ? o->pairs : o->steps;
    int rc = runs_alloc(rs, n);
    if (rc == 0)
        rc = bound_prepare(b, rs, info);
    if (rc < 0)
        return run_failed(rc);
    if (!o->json && o->vs_bound)
        printf("runs:    %u pairs, alternating bound and engine, after one warm-up step\n\n", n);
    else if (!o->json)
        printf("\n");
    for (unsigned k = 0; k < n && !interrupted; k++, rs->done = k) {
        iter_res r;
        if ((rc = bound_run(b, rs, k)) != 0)
            return rc < 0 ? run_failed(rc) : rc;
        if ((rc = iterate(b, &r, !o->dpu)) < 0)
            return run_failed(rc);
        record_run(b, rs, k, &r);
    }
    if (rs->done == 0)
        return EXIT_OK; /* interrupted before the first run: nothing to report */
    if (o->dpu) { /* collect the last delayed update */
        zo_optim_step_result sr = {.struct_size = sizeof(sr)};
        if ((rc = zo_optim_wait(b->opt, &sr)) < 0)
            return run_failed(rc);
    }
    zo_optim_get_info(b->opt, info);
    summary sm; /* medians over the runs done (interrupted: fewer than asked) */
    summarize(o, rs, &sm);
    if (o->json)
        report_json(b, rs, &sm, info, mach);
    else
        report_text(o, rs, &sm, info);
    return EXIT_OK;
}

int main(int argc, char **argv)
{
    opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc >= 0)
        return prc;
    if (o.vs_bound && o.placement == ZO_OPTIM_PLACE_HOST && o.dpu && o.compute_ms == 0)
        return bad("--vs-bound with --dpu needs --compute-ms (the bound is max(compute, step))");
    if (o.vs_bound && o.placement == ZO_OPTIM_PLACE_HOST && !o.dpu && o.qbits)
        return bad("--vs-bound on host placement times the fp32/bf16-state kernel, not --state %s: use "
                   "zo-adam-bench for the quantized kernel's bound, or NVMe placement (the disk bound)",
                   state_name(&o));
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    zo_machine mach;
    zo_machine_get(&mach);
    bench b;
    int rc = setup(&b, &o);
    if (rc)
        return rc;
    zo_optim_info info = {.struct_size = sizeof(info)};
    zo_optim_get_info(b.opt, &info);
    if (!o.json)
        print_head(&b, &info, &mach);
    /* one warm-up iteration, untimed */
    iter_res r;
    if ((rc = iterate(&b, &r, !o.dpu)) < 0) {
        rc = run_failed(rc);
        bench_free(&b);
        return rc;
    }
    b.warm_step_s = r.step_s;
    runs rs;
    rc = run_and_report(&b, &rs, &info, &mach);
    runs_free(&rs);
    bench_free(&b);
    return rc;
}
