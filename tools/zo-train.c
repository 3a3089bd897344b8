/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-train: trains a real model through the offload optimizer engine
 * (zo_optim), and is the worked example of how a C or C++ framework drives
 * it (docs/optim-integration.md walks through this file).
 *
 * The model (train_model.h) is an MLP of L square linear layers regressing
 * a fixed random teacher network: its loss has a known floor of 0. The
 * framework side (this file) owns the device parameters and gradients; the
 * engine owns the fp32 masters and the optimizer states, in pinned host
 * memory or on NVMe. One training step is:
 *
 *   forward                      (device, params as they are now)
 *   zo_optim_grads_done()        (the engine has copied the previous step's
 *                                 gradients: their buffers may be rewritten)
 *   backward, and for each tensor as soon as its gradient exists:
 *     zo_optim_grad(o, tensor, dev_grad, ready_event)
 *   zo_optim_step_async()        (every micro-step; at an accumulation
 *                                 boundary this starts the update)
 *   zo_optim_wait()              (unless the delayed parameter update is
 *                                 active: then the next step call finishes it)
 *
 * --verify runs the same steps a second time fully in memory, with plain
 * arrays and the cpuadam kernels on the same schedule (the DPU delay
 * included), and compares losses every step and the masters, optimizer
 * states and device parameters bit for bit at the end.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>
#include <zoffload/optim.h>
#include <zoffload/optim_json.h>

#include "tool_common.h"
#include "train_dp.h"
#include "train_model.h"
#include "train_options.h"

/* ---- temporary directories and files ------------------------------------------------------ */

/* The private swap directory, removed at exit on every path (also Ctrl-C);
 * one a killed run left is reclaimed by the next run (zo_tool_rundir). */
static zo_tool_rundir g_run = {.lock = -1};

static int make_tmpdir(const char *parent)
{
    struct stat st;
    if (stat(parent, &st) < 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "zo-train: NVMe path %s: %s\n", parent, errno ? strerror(errno) : "not a directory");
        return -1;
    }
    char why[PATH_MAX + 128];
    if (zo_tool_rundir_make(&g_run, "zo-train", parent, why, sizeof(why)) < 0) {
        fprintf(stderr, "zo-train: NVMe path %s: %s\n", parent, why);
        return -1;
    }
    return 0;
}

/* A new output file: never follows a link, never overwrites, 0600. */
static FILE *create_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "zo-train: %s: %s%s\n", path, strerror(errno),
                errno == EEXIST ? " (zo-train never overwrites: remove it or pick another name)" : "");
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f)
        close(fd);
    return f;
}

/* --save DIR, checked before the first step rather than after the last:
 * DIR is (made if missing, mode 0700) a directory this process can write
 * into, and holds no checkpoint this run could write, step-K for K in
 * (first, last] (an interrupted or skipping run ends before last; a
 * checkpoint is never overwritten). 0, or -1 with the reason on stderr. */
static int check_save_dir(const char *dir, int64_t first, int64_t last)
{
    char why[PATH_MAX + 128];
    if (zo_tool_mkdir(dir, why, sizeof(why)) < 0) {
        fprintf(stderr, "zo-train: --save %s: %s\n", dir, why);
        return -1;
    }
    if (access(dir, W_OK | X_OK) < 0) {
        fprintf(stderr, "zo-train: --save %s: cannot write checkpoints into it: %s\n", dir, strerror(errno));
        return -1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "zo-train: --save %s: %s\n", dir, strerror(errno));
        return -1;
    }
    int r = 0;
    struct dirent *de;
    while ((de = readdir(d)) && r == 0) {
        long long k;
        int n = 0;
        if (sscanf(de->d_name, "step-%lld%n", &k, &n) == 1 && de->d_name[n] == 0 && k > first && k <= last) {
            fprintf(stderr, "zo-train: --save %s: it already holds %s, a checkpoint this run may write (steps "
                            "%" PRId64 " to %" PRId64 "; checkpoints are never overwritten): remove it or save "
                            "elsewhere\n", dir, de->d_name, first + 1, last);
            r = -1;
        }
    }
    closedir(d);
    return r;
}

/* Ctrl-C (and SIGTERM): stop at the next micro-step (a window stopped
 * inside is dropped, so the checkpoint is at a step boundary). A second
 * signal exits at once: a run stuck in a long micro-step must still be
 * stoppable; its private NVMe directory is then reclaimed by the next run
 * (zo_tool_rundir_make). */
static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    if (g_stop) {
        static const char msg[] = "zo-train: second signal: exiting now, without saving\n";
        if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
            /* nothing more to say */
        }
        _exit(128 + sig);
    }
    g_stop = sig;
}

/* Test hook: ZO_TRAIN_TEST_MICRO_DELAY_MS makes every micro-step take that
 * much longer (a stand-in for a long forward/backward), so the tests can
 * signal a run inside a micro-step or an accumulation window. Signals do
 * not shorten it. */
/* A test hook's count from the environment: 0 when unset, garbage or negative. */
static long test_hook_env(const char *name)
{
    const char *e = getenv(name);
    long v = e ? strtol(e, NULL, 10) : 0;
    return v > 0 ? v : 0;
}

static void test_micro_delay(void)
{
    static long ms = -1;
    if (ms < 0)
        ms = test_hook_env("ZO_TRAIN_TEST_MICRO_DELAY_MS");
    if (!ms)
        return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Test hook: ZO_TRAIN_TEST_SIGNAL_AFTER_STOP_REDUCE=N makes rank 0 raise
 * SIGTERM just after its N-th all-reduce of the stop flag has returned: a
 * signal that lands while the ranks' agreement for this boundary is already
 * made (on a real run, while a rank waits in that all-reduce for a slower
 * one). The ranks must still stop together, at the next boundary. */
static void test_signal_after_stop_reduce(unsigned rank)
{
    static long n = -1, seen;
    if (n < 0)
        n = test_hook_env("ZO_TRAIN_TEST_SIGNAL_AFTER_STOP_REDUCE");
    if (n && rank == 0 && ++seen == n)
        raise(SIGTERM);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t u64_min(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* ---- the framework side: device tensors ---------------------------------------------------- */

/* The trainer's device memory: params and grads per tensor (weights first,
 * then biases: the engine's tensor order), in the engine's dtypes. With
 * tiled layers the weight tensors are the tiles, homed in the store (param
 * and grad NULL): only the biases are device tensors. */
typedef struct device_model {
    zo_dev *dev;
    unsigned ntensors;       /* L * tiles + L */
    unsigned nweights;       /* L * tiles: the weight tensors (group 0) */
    uint64_t *numel;         /* [ntensors] */
    void **param, **grad;    /* [ntensors] device pointers */
    uint64_t bytes;          /* device memory held by params, grads and activations */
    train_model model;
} device_model;

static int device_alloc(device_model *d, void **p, size_t n)
{
    int r = zo_dev_malloc(d->dev, p, n);
    if (r == 0)
        d->bytes += n;
    return r;
}

static void device_model_free(device_model *d)
{
    if (d->param)
        for (unsigned i = 0; i < d->ntensors; i++) {
            if (d->param[i])
                zo_dev_free(d->dev, d->param[i]);
            if (d->grad[i])
                zo_dev_free(d->dev, d->grad[i]);
        }
    free(d->param);
    free(d->grad);
    free(d->numel);
    train_model_free(&d->model);
    memset(d, 0, sizeof(*d));
}

static int device_model_init(device_model *d, zo_dev *dev, const train_shape *s, const train_tiling *tiling)
{
    memset(d, 0, sizeof(*d));
    d->dev = dev;
    int r;
    if ((r = train_model_init(&d->model, dev, s, tiling)) < 0)
        return r;
    d->bytes += d->model.dev_bytes; /* activations, scratch, ones; tiled layers' working memory */
    d->ntensors = train_model_ntensors(&d->model);
    d->nweights = d->ntensors - s->layers;
    d->numel = calloc(d->ntensors, sizeof(uint64_t));
    d->param = calloc(d->ntensors, sizeof(void *));
    d->grad = calloc(d->ntensors, sizeof(void *));
    if (!d->numel || !d->param || !d->grad)
        return -ENOMEM;
    size_t pes = zo_dtype_size(s->param_dtype), ges = zo_dtype_size(s->grad_dtype);
    for (unsigned i = 0; i < d->ntensors; i++) {
        d->numel[i] = train_model_numel(&d->model, i);
        if (tiling && i < d->nweights)
            continue; /* a tile: homed in the store */
        if ((r = device_alloc(d, &d->param[i], d->numel[i] * pes)) < 0 ||
            (r = device_alloc(d, &d->grad[i], d->numel[i] * ges)) < 0)
            return r;
    }
    d->model.weight = d->param;
    d->model.bias = d->param + d->nweights;
    d->model.gweight = d->grad;
    d->model.gbias = d->grad + d->nweights;
    return 0;
}

/* The store homing the tiled layers' weights: pinned host memory for
 * them all, or (swap given) NVMe through the store's pinned slot pool. */
static int open_tile_store(zo_dev *dev, uint64_t weight_bytes, zo_swap *swap, zo_store **out)
{
    zo_store_config sc;
    zo_store_config_default(&sc);
    sc.dev = dev;
    sc.trace = ZO_TRACE_OFF; /* the walker fetches each tile itself, in order */
    if (swap) {
        sc.swap = swap;
        sc.host_bytes = 0;
    } else {
        /* every tile rounded up in the arena: room for the rounding */
        sc.host_bytes = weight_bytes + weight_bytes / 8 + (4u << 20);
        sc.slots = 4; /* zo_store_write() streams through the pool */
        sc.slot_size = 1u << 20;
    }
    int r = zo_store_create(out, &sc);
    if (r < 0)
        fprintf(stderr, "zo-train: the store for the tiled weights: %s (%s)\n", zo_strerror(r),
                zo_last_error_detail());
    return r;
}

/* ---- the in-memory reference run (--verify) ------------------------------------------------ */

/*
 * The same training, without the engine: the framework side is a second
 * model over plain arrays; the optimizer side is the fp32 accumulators,
 * masters and states of the whole model in flat arrays (weights group, then
 * biases group, as the engine lays them out), stepped with the cpuadam
 * kernels: the gradient statistics per sub-group in sub-group order (the
 * engine's summation order), DeepSpeed's clip coefficient, and one fused
 * step per group. The DPU schedule is replayed: the forward of step k sees
 * the result of step k-1 during the warm-up and one step later, of k-2,
 * after it.
 */
typedef struct reference {
    zo_dev *dev;           /* its own host device, unlimited: the model's GEMMs run as on the engine's side */
    zo_store *store;       /* tiled layers: its own store (pinned host home) */
    train_model model;
    unsigned ntensors, layers;
    uint64_t *off, *numel; /* [ntensors] flat offsets and sizes */
    uint64_t total, gsplit; /* elements; first bias element (start of group 1) */
    zo_dtype pdt, gdt;
    zo_dtype sdt;          /* optimizer state dtype (m, v): f32 or bf16 */
    float *master, *acc;
    void *m, *v;           /* in sdt */
    void *seen;            /* the params the forward sees (what the device holds) */
    void *out, *prev_out;  /* params after the latest update, and after the one before */
    void *grad;            /* gradients in gdt (the reference's "device" grads) */
    int *first;            /* [ntensors] 1 until the window's first gradient */
    zo_cpuadam_hparams hp[2];
    uint64_t sub_group;
    int64_t step;
    uint64_t boundaries;
    zo_cpuadam_team *team;
    /* many ranks (world > 1): the ranks' gradients of one micro-step summed
     * in rank order in fp32 and rounded once to gdt, as the MPI comm's
     * ordered reduce-scatter does, then averaged in fp32 as zo_part does */
    unsigned world, slice;   /* ranks; the slice being run */
    float *dpsum;            /* [total] */
} reference;

static void reference_free(reference *r)
{
    free(r->model.weight); /* the pointer arrays are the reference's; train_model_free() clears them */
    free(r->model.gweight);
    train_model_free(&r->model);
    free(r->numel);
    free(r->off);
    free(r->master);
    free(r->m);
    free(r->v);
    free(r->acc);
    free(r->seen);
    free(r->out);
    free(r->prev_out);
    free(r->grad);
    free(r->first);
    free(r->dpsum);
    zo_cpuadam_team_destroy(&r->team);
    zo_store_destroy(&r->store); /* after the model: its tiled layers unregister their tiles */
    zo_dev_close(&r->dev);
    memset(r, 0, sizeof(*r));
}

static int reference_init(reference *r, const train_shape *s, const zo_optim_config *cfg, const device_model *d,
                          const train_tiling *tiling, unsigned world)
{
    memset(r, 0, sizeof(*r));
    r->world = world;
    r->ntensors = d->ntensors;
    r->layers = s->layers;
    r->pdt = s->param_dtype;
    r->gdt = s->grad_dtype;
    r->off = calloc(r->ntensors, sizeof(uint64_t));
    r->first = calloc(r->ntensors, sizeof(int));
    r->numel = calloc(r->ntensors, sizeof(uint64_t));
    if (!r->off || !r->first || !r->numel)
        return -ENOMEM;
    for (unsigned i = 0; i < r->ntensors; i++) {
        r->numel[i] = d->numel[i];
        r->off[i] = r->total;
        r->total += d->numel[i];
        r->first[i] = 1;
    }
    r->gsplit = r->off[d->nweights];
    size_t pes = zo_dtype_size(r->pdt), n = (size_t)r->total;
    r->master = calloc(n, 4);
    r->sdt = cfg->groups[0].state_dtype;
    r->m = calloc(n, zo_dtype_size(r->sdt));
    r->v = calloc(n, zo_dtype_size(r->sdt));
    r->acc = calloc(n, 4);
    r->seen = calloc(n, pes);
    r->out = calloc(n, pes);
    r->prev_out = calloc(n, pes);
    r->grad = calloc(n, zo_dtype_size(r->gdt));
    if (world > 1)
        r->dpsum = calloc(n, 4);
    if (!r->master || !r->m || !r->v || !r->acc || !r->seen || !r->out || !r->prev_out || !r->grad ||
        (world > 1 && !r->dpsum))
        return -ENOMEM;
    /* The reference model runs on a host device of its own, through the same
     * zo_gemm_async() host path as the engine side's model, so its losses and
     * gradients are the same bits. Its parameters and gradients are plain
     * arrays (host backend: "device" memory is host memory). */
    int rc = zo_dev_open(&r->dev, NULL);
    if (rc < 0)
        return rc;
    train_tiling rt;
    if (tiling) {
        /* the same grid (the same per-layer budget), homed in pinned host
         * memory: the home does not change a bit of the math */
        rt = *tiling;
        rt.home = ZO_TIER_HOST;
        rt.prefix = "ref.layer";
        uint64_t wb = 0;
        for (unsigned i = 0; i < d->nweights; i++)
            wb += d->numel[i] * 4;
        if ((rc = open_tile_store(r->dev, wb, NULL, &r->store)) < 0)
            return rc;
        rt.store = r->store;
    }
    if ((rc = train_model_init(&r->model, r->dev, s, tiling ? &rt : NULL)) < 0)
        return rc;
    r->model.weight = calloc(r->ntensors, sizeof(void *));
    r->model.gweight = calloc(r->ntensors, sizeof(void *));
    if (!r->model.weight || !r->model.gweight)
        return -ENOMEM;
    for (unsigned i = 0; i < r->ntensors; i++) {
        r->model.weight[i] = (char *)r->seen + r->off[i] * pes;
        r->model.gweight[i] = (char *)r->grad + r->off[i] * zo_dtype_size(r->gdt);
    }
    r->model.bias = r->model.weight + d->nweights;
    r->model.gbias = r->model.gweight + d->nweights;
    r->hp[0] = cfg->groups[0].hparams ? *cfg->groups[0].hparams : cfg->hparams;
    r->hp[1] = cfg->groups[1].hparams ? *cfg->groups[1].hparams : cfg->hparams;
    r->sub_group = cfg->sub_group_size;
    zo_cpuadam_team_config tc;
    zo_cpuadam_team_config_default(&tc);
    tc.nthreads = cfg->nthreads;
    return zo_cpuadam_team_create(&r->team, &tc);
}

/* Tiled layers: the weight tiles the reference's forward sees are written
 * from `seen` (as zo-train writes the engine's from its parameter buffers). */
static int reference_push_tiles(reference *r)
{
    if (!r->model.tl)
        return 0;
    size_t pes = zo_dtype_size(r->pdt);
    int rc = 0;
    for (unsigned i = 0; i < r->ntensors - r->layers && rc == 0; i++)
        rc = train_model_tile_set(&r->model, i, (const char *)r->seen + r->off[i] * pes);
    return rc;
}

/* Start where the engine starts: its masters and states (a fresh run: the
 * student's initial params widened; a resumed one: the checkpoint). */
static int reference_start(reference *r, zo_optim *o, const device_model *d)
{
    size_t pes = zo_dtype_size(r->pdt), ses = zo_dtype_size(r->sdt);
    /* many ranks (a fresh run: zo-train refuses --verify with --resume
     * there): zo_part_init_from_device() widened the device params, and the
     * states start at zero */
    for (unsigned i = 0; i < r->ntensors && r->world > 1; i++)
        zo_vec_cast(r->master + r->off[i], ZO_DTYPE_F32, d->param[i], r->pdt, (size_t)r->numel[i]);
    for (unsigned i = 0; i < r->ntensors && r->world == 1; i++) {
        uint64_t n = r->numel[i], off = r->off[i];
        int rc = zo_optim_state_export(o, i, ZO_OPTIM_STATE_MASTER, r->master + off, ZO_DTYPE_F32, 0, n);
        if (rc < 0)
            return rc;
        /* the states in their own dtype (exact); one the optimizer does not
         * use (Lion's v, Adagrad's m) is ZO_ENOTSUP and stays zero */
        rc = zo_optim_state_export(o, i, ZO_OPTIM_STATE_EXP_AVG, (char *)r->m + off * ses, r->sdt, 0, n);
        if (rc < 0 && rc != ZO_ENOTSUP)
            return rc;
        rc = zo_optim_state_export(o, i, ZO_OPTIM_STATE_EXP_AVG_SQ, (char *)r->v + off * ses, r->sdt, 0, n);
        if (rc < 0 && rc != ZO_ENOTSUP)
            return rc;
    }
    zo_vec_cast(r->out, r->pdt, r->master, ZO_DTYPE_F32, (size_t)r->total);
    memcpy(r->seen, r->out, (size_t)r->total * pes);
    memcpy(r->prev_out, r->out, (size_t)r->total * pes);
    zo_optim_info info = {.struct_size = sizeof(info)};
    zo_optim_get_info(o, &info);
    r->step = info.step;
    /* the DPU warm-up counts boundaries, applied or skipped; a checkpoint
     * carries the count, so a resumed run is past its warm-up at once */
    r->boundaries = (uint64_t)info.step + info.skipped_steps;
    return r->world > 1 ? 0 : reference_push_tiles(r);
}

/* The reference's gradient hand-over: add into the fp32 accumulator (the
 * window's first gradient of a tensor overwrites it). */
static int reference_grad(void *user, unsigned tensor, const void *dev_grad, zo_event *ready, const void *host_grad)
{
    reference *r = user;
    const void *g = host_grad;
    if (!g) {
        int rc = zo_event_sync(ready); /* the gradient is queued: wait for it */
        if (rc < 0)
            return rc;
        g = dev_grad; /* host backend: device memory is host memory */
    }
    uint64_t n = r->numel[tensor];
    if (r->world > 1) {
        /* rank `slice`'s gradient joins the fp32 sum of the ranks before it */
        size_t es = zo_dtype_size(r->gdt);
        float *sum = r->dpsum + r->off[tensor], b[256];
        for (uint64_t k0 = 0; k0 < n; k0 += 256) {
            size_t c = n - k0 < 256 ? (size_t)(n - k0) : 256;
            zo_vec_cast(b, ZO_DTYPE_F32, (const char *)g + k0 * es, r->gdt, c);
            for (size_t k = 0; k < c; k++)
                sum[k0 + k] = r->slice == 0 ? b[k] : sum[k0 + k] + b[k];
        }
        return 0;
    }
    float *a = r->acc + r->off[tensor];
    float w[256]; /* widened in pieces */
    for (uint64_t k0 = 0; k0 < n; k0 += 256) {
        size_t c = n - k0 < 256 ? (size_t)(n - k0) : 256;
        zo_vec_cast(w, ZO_DTYPE_F32, (const char *)g + k0 * zo_dtype_size(r->gdt), r->gdt, c);
        for (size_t k = 0; k < c; k++)
            a[k0 + k] = r->first[tensor] ? w[k] : a[k0 + k] + w[k];
    }
    r->first[tensor] = 0;
    return 0;
}

/* Many ranks, the end of a micro-step (every rank's slice in): the sum
 * rounded to gdt (the reduce-scatter's result), the mean divided by world
 * in fp32 (zo_part's rule), into the accumulator as one gradient. */
static void reference_dp_mean(reference *r)
{
    float w = (float)r->world, v[256];
    uint16_t h[256];
    for (unsigned t = 0; t < r->ntensors; t++) {
        float *a = r->acc + r->off[t];
        const float *sum = r->dpsum + r->off[t];
        for (uint64_t k0 = 0; k0 < r->numel[t]; k0 += 256) {
            size_t c = r->numel[t] - k0 < 256 ? (size_t)(r->numel[t] - k0) : 256;
            if (r->gdt == ZO_DTYPE_F32) {
                memcpy(v, sum + k0, c * 4);
            } else {
                zo_vec_cast(h, r->gdt, sum + k0, ZO_DTYPE_F32, c);
                zo_vec_cast(v, ZO_DTYPE_F32, h, r->gdt, c);
            }
            for (size_t k = 0; k < c; k++)
                a[k0 + k] = r->first[t] ? v[k] / w : a[k0 + k] + v[k] / w;
        }
        r->first[t] = 0;
    }
}

/* The squared norm of a window's gradient, summed as the engine sums it:
 * one rank, every sub-group in order; many ranks (zo_part), each rank's
 * shard of each group cut in sub-groups from its start, summed per rank,
 * then over the ranks in rank order. */
static int reference_sumsq(reference *r, double *sumsq, uint64_t *nonfinite)
{
    const uint64_t gstart[2] = {0, r->gsplit}, gend[2] = {r->gsplit, r->total};
    *sumsq = 0;
    *nonfinite = 0;
    for (unsigned rk = 0; rk < r->world; rk++) {
        double part = 0;
        for (int g = 0; g < 2; g++) {
            /* zo_part's shard: ceil(N / world) rounded up to 2 elements */
            uint64_t len = gend[g] - gstart[g], sh = (len + r->world - 1) / r->world;
            sh += sh & 1;
            uint64_t lo = r->world > 1 ? u64_min(len, rk * sh) : 0, hi = r->world > 1 ? u64_min(len, lo + sh) : len;
            for (uint64_t o = lo; o < hi; o += r->sub_group) {
                uint64_t n = hi - o < r->sub_group ? hi - o : r->sub_group;
                zo_grad_stats gs;
                int rc = zo_cpuadam_team_grad_stats(r->team, r->acc + gstart[g] + o, ZO_DTYPE_F32, (size_t)n, &gs);
                if (rc < 0)
                    return rc;
                part += gs.sumsq;
                *nonfinite += gs.nonfinite;
            }
        }
        *sumsq += part;
    }
    return 0;
}

/* One accumulation boundary. @return 1 applied, 0 skipped (inf/NaN), < 0 error. */
static int reference_step(reference *r, double scale, double max_norm, unsigned dpu_warmup, int dpu)
{
    for (unsigned i = 0; i < r->ntensors; i++) {
        if (r->first[i]) /* no gradient this window: zero */
            memset(r->acc + r->off[i], 0, (size_t)r->numel[i] * 4);
        r->first[i] = 1;
    }
    r->boundaries++;
    const uint64_t gstart[2] = {0, r->gsplit}, gend[2] = {r->gsplit, r->total};
    double sumsq;
    uint64_t nonfinite;
    int src = reference_sumsq(r, &sumsq, &nonfinite);
    if (src < 0)
        return src;
    size_t pb = (size_t)r->total * zo_dtype_size(r->pdt);
    if (!nonfinite) {
        double norm = sqrt(sumsq) / scale, coef = 1.0;
        if (max_norm > 0 && max_norm / (norm + 1e-6) < 1.0)
            coef = max_norm / (norm + 1e-6);
        r->step++;
        memcpy(r->prev_out, r->out, pb);
        for (int g = 0; g < 2; g++) {
            zo_cpuadam_hparams hp = r->hp[g];
            hp.step = r->step;
            hp.grad_scale = 1.0 / scale;
            hp.clip_coef = coef;
            zo_cpuadam_tensors t;
            zo_cpuadam_tensors_default(&t);
            t.n = (size_t)(gend[g] - gstart[g]);
            t.param = r->master + gstart[g];
            t.grad = r->acc + gstart[g];
            t.grad_dtype = ZO_DTYPE_F32;
            t.exp_avg = (char *)r->m + gstart[g] * zo_dtype_size(r->sdt);
            t.exp_avg_sq = (char *)r->v + gstart[g] * zo_dtype_size(r->sdt);
            t.state_dtype = r->sdt;
            t.param_out = (char *)r->out + gstart[g] * zo_dtype_size(r->pdt);
            t.out_dtype = r->pdt;
            int rc = zo_cpuadam_team_step(r->team, &hp, &t);
            if (rc < 0)
                return rc;
        }
    }
    /* What the next forward sees: this update at once during the warm-up,
     * the one before it under the delay. */
    int delayed = dpu && r->boundaries > dpu_warmup;
    memcpy(r->seen, delayed ? r->prev_out : r->out, pb);
    int rc = reference_push_tiles(r);
    return rc < 0 ? rc : nonfinite ? 0 : 1;
}

/* The end of the run (zo_optim_wait()): the device holds the latest update. */
static int reference_finish(reference *r)
{
    memcpy(r->seen, r->out, (size_t)r->total * zo_dtype_size(r->pdt));
    return reference_push_tiles(r);
}

/* Masters, states and device params of the engine equal the reference's, bit for bit. */
static int reference_compare(reference *r, zo_optim *o, device_model *d)
{
    size_t pes = zo_dtype_size(r->pdt);
    int bad = 0;
    static const char *const what[3] = {"master", "exp_avg", "exp_avg_sq"};
    const void *want[3] = {r->master, r->m, r->v};
    const zo_dtype dt[3] = {ZO_DTYPE_F32, r->sdt, r->sdt};
    char *buf = NULL;
    for (unsigned i = 0; i < r->ntensors && !bad; i++) {
        uint64_t n = d->numel[i], off = r->off[i];
        free(buf);
        if (!(buf = malloc((size_t)n * 4)))
            return -ENOMEM;
        for (int k = 0; k < 3 && !bad; k++) {
            /* each state in its own dtype: bit for bit */
            size_t es = zo_dtype_size(dt[k]);
            int rc = zo_optim_state_export(o, i, (zo_optim_state)k, buf, dt[k], 0, n);
            if (rc == ZO_ENOTSUP)
                continue; /* a state this optimizer does not use */
            if (rc < 0) {
                fprintf(stderr, "zo-train: verify: export: %s (%s)\n", zo_strerror(rc), zo_optim_errmsg(o));
                free(buf);
                return rc;
            }
            const char *ref = (const char *)want[k] + off * es;
            for (uint64_t j = 0; j < n; j++)
                if (memcmp(buf + j * es, ref + j * es, es)) {
                    float a, b;
                    zo_vec_cast(&a, ZO_DTYPE_F32, buf + j * es, dt[k], 1);
                    zo_vec_cast(&b, ZO_DTYPE_F32, ref + j * es, dt[k], 1);
                    fprintf(stderr, "zo-train: verify: tensor %u %s element %" PRIu64 ": engine %a, reference %a\n",
                            i, what[k], j, (double)a, (double)b);
                    bad = 1;
                    break;
                }
        }
        if (!bad && !d->param[i]) {
            /* a weight tile: the store holds the params widened to fp32 */
            float *want_f = malloc((size_t)n * 4);
            int rc = want_f ? train_model_tile_get(&d->model, i, (float *)buf) : -ENOMEM;
            if (rc == 0)
                zo_vec_cast(want_f, ZO_DTYPE_F32, (char *)r->seen + off * pes, r->pdt, (size_t)n);
            if (rc < 0 || memcmp(buf, want_f, (size_t)n * 4)) {
                fprintf(stderr, "zo-train: verify: the weight tile of tensor %u differs%s\n", i,
                        rc < 0 ? " (cannot be read)" : "");
                bad = 1;
            }
            free(want_f);
        } else if (!bad && (zo_memcpy_async(d->model.s, buf, d->param[i], (size_t)n * pes, ZO_COPY_D2H) < 0 ||
                            zo_stream_sync(d->model.s) < 0 ||
                            memcmp(buf, (char *)r->seen + off * pes, (size_t)n * pes))) {
            /* the device params, read back through the model's stream */
            fprintf(stderr, "zo-train: verify: device params of tensor %u differ\n", i);
            bad = 1;
        }
    }
    free(buf);
    return bad ? ZO_ECORRUPT : 0;
}

/* Many ranks: this rank's shard of the masters and states (the inner
 * engine's tensor "g<group>.shard.r<rank>of<world>") against the
 * reference's flat arrays, and every device param (all-gathered) against
 * what the reference's forward sees, bit for bit: the MPI comm's ordered
 * collectives sum in rank order, as the reference does. */
static int reference_compare_dp(reference *r, zo_optim *inner, device_model *d, unsigned rank)
{
    static const char *const what[3] = {"master", "exp_avg", "exp_avg_sq"};
    const void *want[3] = {r->master, r->m, r->v};
    const zo_dtype dt[3] = {ZO_DTYPE_F32, r->sdt, r->sdt};
    const uint64_t gstart[2] = {0, r->gsplit}, gend[2] = {r->gsplit, r->total};
    size_t pes = zo_dtype_size(r->pdt);
    float *buf = malloc((size_t)r->total * 4), *ref = malloc((size_t)r->total * 4);
    char *pb = malloc((size_t)r->total * pes);
    int bad = !buf || !ref || !pb ? -ENOMEM : 0;
    for (unsigned g = 0; g < 2 && !bad; g++) {
        char name[64];
        unsigned ti;
        uint64_t len = gend[g] - gstart[g], sh = (len + r->world - 1) / r->world, n;
        sh += sh & 1;
        uint64_t lo = u64_min(len, rank * sh);
        snprintf(name, sizeof(name), "g%u.shard.r%uof%u", g, rank, r->world);
        if (zo_optim_tensor_index(inner, name, &ti) < 0)
            continue; /* an empty shard: the inner engine has no tensor for it */
        if (zo_optim_tensor_get(inner, ti, &n, NULL, NULL) < 0 || lo + n > len) {
            fprintf(stderr, "zo-train: verify: shard %s: not the layout expected\n", name);
            bad = 1;
            break;
        }
        for (int k = 0; k < 3 && !bad; k++) {
            int rc = zo_optim_state_export(inner, ti, (zo_optim_state)k, buf, ZO_DTYPE_F32, 0, n);
            if (rc == ZO_ENOTSUP)
                continue; /* a state this optimizer does not use */
            if (rc < 0) {
                fprintf(stderr, "zo-train: verify: export: %s (%s)\n", zo_strerror(rc), zo_optim_errmsg(inner));
                bad = rc;
                break;
            }
            zo_vec_cast(ref, ZO_DTYPE_F32, (const char *)want[k] + (gstart[g] + lo) * zo_dtype_size(dt[k]), dt[k],
                        (size_t)n);
            for (uint64_t j = 0; j < n; j++) {
                if (memcmp(&buf[j], &ref[j], 4) != 0) {
                    fprintf(stderr, "zo-train: verify: group %u %s element %" PRIu64 " (rank %u's shard): engine %a, "
                                    "reference %a\n", g, what[k], gstart[g] + lo + j, rank, (double)buf[j],
                            (double)ref[j]);
                    bad = 1;
                    break;
                }
            }
        }
    }
    for (unsigned i = 0; i < r->ntensors && !bad; i++) {
        uint64_t n = r->numel[i];
        if (zo_memcpy_async(d->model.s, pb, d->param[i], (size_t)n * pes, ZO_COPY_D2H) < 0 ||
            zo_stream_sync(d->model.s) < 0) {
            bad = 1;
            break;
        }
        zo_vec_cast(buf, ZO_DTYPE_F32, pb, r->pdt, (size_t)n);
        zo_vec_cast(ref, ZO_DTYPE_F32, (char *)r->seen + r->off[i] * pes, r->pdt, (size_t)n);
        for (uint64_t j = 0; j < n; j++) {
            if (memcmp(&buf[j], &ref[j], 4) != 0) {
                fprintf(stderr, "zo-train: verify: device params of tensor %u element %" PRIu64 ": %a, reference %a\n",
                        i, j, (double)buf[j], (double)ref[j]);
                bad = 1;
                break;
            }
        }
    }
    free(buf);
    free(ref);
    free(pb);
    return bad < 0 ? bad : bad ? ZO_ECORRUPT : 0;
}

/* ---- the training loop ------------------------------------------------------------------------ */

/* Handing a gradient to the engine: called by backward as soon as a
 * tensor's gradient is queued into its device buffer, with the event
 * recorded on the compute stream after it; the engine's copy waits for that
 * event on the engine's own stream, so backward goes on with the layers
 * below while the copy runs, as in a GPU framework. */
typedef struct engine_intake {
    zo_optim *o;
    zo_part *part; /* many ranks: the partitioned engine takes the gradients */
    zo_dtype grad_dtype;
} engine_intake;

static int engine_grad(void *user, unsigned tensor, const void *dev_grad, zo_event *ready, const void *host_grad)
{
    engine_intake *ei = user;
    zo_optim *o = ei->o;
    if (ei->part) {
        /* zo_part buckets the gradients and reduce-scatters each bucket as
         * it fills (with the other ranks, while backward goes on) */
        int r = zo_part_grad(ei->part, tensor, dev_grad, ready);
        if (r < 0)
            fprintf(stderr, "zo-train: zo_part_grad(%u): %s (%s)\n", tensor, zo_strerror(r),
                    zo_part_errmsg(ei->part));
        return r;
    }
    /* a tiled weight's dW tile comes staged in host memory (grad_dtype) */
    int r = host_grad ? zo_optim_grad_host(o, tensor, host_grad, ei->grad_dtype)
                      : zo_optim_grad(o, tensor, dev_grad, ready);
    if (r < 0)
        fprintf(stderr, "zo-train: zo_optim_grad(%u): %s (%s)\n", tensor, zo_strerror(r), zo_optim_errmsg(o));
    return r;
}

/* Tiled layers: write every weight tile from the engine's parameter
 * buffer (the params of the latest finished update, in param_dtype; the
 * tiles hold them widened to fp32). Called where the engine pushes the
 * device params of the other tensors: after each zo_optim_wait(). */
static int refresh_tiles(zo_optim *o, device_model *d)
{
    for (unsigned i = 0; i < d->nweights; i++) {
        const void *p;
        int r = zo_optim_param_buffer(o, i, &p);
        if (r == 0)
            r = train_model_tile_set(&d->model, i, p);
        if (r < 0) {
            fprintf(stderr, "zo-train: weight tile %u: %s (%s)\n", i, zo_strerror(r), zo_optim_errmsg(o));
            return r;
        }
    }
    return 0;
}

/* Tiled layers, a fresh run: the student's initial values as the engine's
 * masters (widened exactly, as zo_optim_init_from_device() would read
 * them), zero optimizer states. */
static int init_masters(zo_optim *o, device_model *d)
{
    size_t pes = zo_dtype_size(d->model.shape.param_dtype);
    uint64_t most = 0;
    for (unsigned i = 0; i < d->ntensors; i++)
        most = d->numel[i] > most ? d->numel[i] : most;
    void *p = malloc((size_t)most * pes);
    float *zero = calloc((size_t)most, sizeof(float));
    int r = p && zero ? 0 : -ENOMEM;
    for (unsigned i = 0; i < d->ntensors && r == 0; i++) {
        train_model_initial(&d->model, i, p);
        r = zo_optim_state_import(o, i, ZO_OPTIM_STATE_MASTER, p, d->model.shape.param_dtype, 0, d->numel[i]);
        for (int k = ZO_OPTIM_STATE_EXP_AVG; k <= ZO_OPTIM_STATE_EXP_AVG_SQ && r == 0; k++)
            if ((r = zo_optim_state_import(o, i, (zo_optim_state)k, zero, ZO_DTYPE_F32, 0, d->numel[i])) == ZO_ENOTSUP)
                r = 0; /* a state this optimizer does not use */
    }
    free(p);
    free(zero);
    if (r < 0)
        fprintf(stderr, "zo-train: initial masters: %s (%s)\n", zo_strerror(r), zo_optim_errmsg(o));
    return r;
}

/* Device bytes in use now (zo_dev_get_info: the host backend's accounting
 * of zo_dev_malloc(), or the GPU's), or `peak` if larger. */
static uint64_t device_in_use(zo_dev *dev, uint64_t peak)
{
    zo_dev_info di;
    if (zo_dev_get_info(dev, &di) < 0 || di.total_mem < di.free_mem)
        return peak;
    uint64_t used = di.total_mem - di.free_mem;
    return used > peak ? used : peak;
}

/* Totals over the run, for the summary. */
typedef struct totals {
    unsigned steps;
    double wall_s, compute_s, data_s;
    double first_loss, last_loss;
    /* The engine's timelines, each update counted once. zo_optim_get_timeline
     * gives the latest finished update, so under DPU one update can show on
     * two step lines and a fast one on none: these are the updates seen. */
    int64_t last_update;
    unsigned updates;
    zo_optim_timeline sum;
} totals;

static void totals_add_timeline(totals *t, const zo_optim_timeline *tl)
{
    if (tl->step == t->last_update)
        return;
    t->last_update = tl->step;
    t->updates++;
    t->sum.total_ns += tl->total_ns;
    t->sum.d2h_ns += tl->d2h_ns;
    t->sum.d2h_bytes += tl->d2h_bytes;
    t->sum.norm_ns += tl->norm_ns;
    t->sum.compute_ns += tl->compute_ns;
    t->sum.nvme_read_ns += tl->nvme_read_ns;
    t->sum.nvme_read_bytes += tl->nvme_read_bytes;
    t->sum.nvme_write_ns += tl->nvme_write_ns;
    t->sum.nvme_write_bytes += tl->nvme_write_bytes;
    t->sum.h2d_ns += tl->h2d_ns;
    t->sum.h2d_bytes += tl->h2d_bytes;
    t->sum.stall_ns += tl->stall_ns;
}

static void step_json(FILE *f, int64_t step, double loss, double step_s, double compute_s, double data_s,
                      const zo_optim_timeline *tl, int have_tl)
{
    zo_json jw, *j = &jw;
    zj_init(j, f, 0); /* one top-level object per line (JSON lines) */
    zj_obj_begin(j, NULL);
    zj_str(j, "type", "step");
    zj_int(j, "step", step);
    zj_num(j, "loss", loss);
    zj_num(j, "step_ms", step_s * 1e3);
    zj_num(j, "compute_ms", compute_s * 1e3);
    zj_num(j, "data_ms", data_s * 1e3); /* the teacher's batch, before each micro-step's forward */
    if (have_tl) {
        zj_int(j, "timeline_step", tl->step);
        zj_num(j, "d2h_ms", tl->d2h_ns * 1e-6);
        zj_num(j, "optim_ms", (tl->compute_ns + tl->norm_ns) * 1e-6);
        zj_num(j, "nvme_read_ms", tl->nvme_read_ns * 1e-6);
        zj_num(j, "nvme_write_ms", tl->nvme_write_ns * 1e-6);
        zj_num(j, "h2d_ms", tl->h2d_ns * 1e-6);
        zj_num(j, "stall_ms", tl->stall_ns * 1e-6);
        zj_num(j, "update_ms", tl->total_ns * 1e-6);
        zj_uint(j, "d2h_bytes", tl->d2h_bytes);
        zj_uint(j, "h2d_bytes", tl->h2d_bytes);
        zj_uint(j, "nvme_read_bytes", tl->nvme_read_bytes);
        zj_uint(j, "nvme_write_bytes", tl->nvme_write_bytes);
    }
    zj_obj_end(j);
    zj_end(j);
}

/* ---- main: the run, phase by phase ------------------------------------------------------------ */

/* One run: what main()'s phases set up and hand on to the next, all of it
 * released by run_cleanup(). The engine keeps pointers into it (cfg.groups
 * -> grp -> hp_w, hp_b), so it stays where it is for the whole run. */
typedef struct train_run {
    options opt;
    train_shape shape;
    uint64_t nparams;
    size_t pes, ges;          /* bytes per device parameter and gradient element */
    uint64_t dev_need;        /* device bytes of the untiled model: params, grads, activations */
    uint64_t budget;          /* the device budget: --device-budget, or the default for dev_need */
    zo_dev *dev;
    int tiled;                /* the model does not fit --device-budget whole: tiled layers */
    uint64_t layer_budget;    /* tiled: a layer's share of the budget (train_plan_tiles) */
    train_tiling tiling;
    zo_swap *tile_swap;       /* tiles on NVMe: their swap files */
    zo_store *tile_store;     /* tiles: their home */
    zo_optim_json *cj;        /* --config, until the engine is created */
    zo_optim_config cfg;
    zo_optim_group grp[2];    /* weights, biases */
    zo_optim_group jgroup;    /* the config file's group settings (state dtype) */
    zo_cpuadam_hparams hp_w, hp_b;
    device_model dm;
    zo_optim *o;              /* the engine; many ranks: the inner engine of this rank's shards */
    train_dp dp;              /* the ranks (mpirun): world 1 in a single process */
    zo_part *part;            /* the partitioned engine (owns o): world > 1, or resuming its checkpoint */
    int use_part;             /* run on zo_part (set by check_request) */
    size_t global_batch;      /* --batch: every rank trains batch / world of its samples */
    uint64_t micro;           /* global micro-step index: picks the data */
    reference ref;            /* --verify */
    train_teacher teacher;
    float *x, *y;             /* one micro-step's batch */
    FILE *jf;                 /* --json */
    int64_t step0;            /* updates before this run (a resumed checkpoint's) */
    double t_start;
    uint64_t dev_peak;
    int verify_failed;
    int failed_together;      /* many ranks: every rank knows the run failed (no forced exit needed) */
    totals tot;
} train_run;

/* A sum or max over the ranks (nothing to do in one process). */
static int dp_reduce(train_run *t, double *vals, unsigned n, int op)
{
    return t->dp.world > 1 ? t->dp.comm.all_reduce(t->dp.comm.user, vals, n, op) : 0;
}

/* Each phase below returns 0 to go on, or the exit status: 1 the run
 * failed, 2 the request cannot be run (bad usage: zo_tool_bad()); the
 * reason is on stderr by then. */

/* What can be refused before anything is allocated. */
static int check_request(train_run *t)
{
    const options *opt = &t->opt;
    if (opt->verify && strcmp(opt->backend, "host"))
        /* the in-memory reference runs the model on the host backend's GEMM
         * (OpenBLAS); cuBLAS sums in another order, so no bit-for-bit match */
        return zo_tool_bad("zo-train", "--verify compares bit for bit with an in-memory run on the host backend's "
                                       "GEMM: use it with --backend host");
    t->shape = (train_shape){.layers = opt->layers,
                             .width = (size_t)opt->width,
                             .batch = (size_t)opt->batch,
                             .param_dtype = opt->param_dtype,
                             .grad_dtype = opt->grad_dtype == ZO_DTYPE_COUNT ? opt->param_dtype : opt->grad_dtype,
                             .seed = opt->seed};
    t->global_batch = t->shape.batch;
    unsigned world = t->dp.world;
    /* a checkpoint of the partitioned engine (<dir>/rank0/...) is resumed
     * by it, at any number of ranks, one included (resharded at load) */
    struct stat rs;
    char r0[PATH_MAX];
    t->use_part = world > 1 || (opt->resume && snprintf(r0, sizeof(r0), "%s/rank0", opt->resume) < (int)sizeof(r0) &&
                                stat(r0, &rs) == 0 && S_ISDIR(rs.st_mode));
    if (t->use_part) {
        char who[64];
        if (world > 1)
            snprintf(who, sizeof(who), "%u ranks", world);
        else
            snprintf(who, sizeof(who), "--resume of a partitioned checkpoint");
        /* data parallel: the global batch is cut into one slice per rank */
        if (strcmp(opt->backend, "host"))
            return zo_tool_bad("zo-train", "%s: the MPI comm moves host memory, so ranks run on --backend host "
                                           "(a CUDA framework uses <zoffload/comm_nccl.h>)", who);
        if (opt->batch % world)
            return zo_tool_bad("zo-train", "%s: --batch %" PRIu64 " (the global batch) must be a multiple of the "
                                           "number of ranks", who, opt->batch);
        if (opt->verify && opt->resume)
            return zo_tool_bad("zo-train", "%s: --verify starts from the initial parameters: leave --resume out",
                               who);
        if (opt->verify && world > 64)
            return zo_tool_bad("zo-train", "--verify runs every rank's slice in each rank's reference: up to 64 ranks");
        t->shape.batch /= world;
    }
    t->nparams = train_shape_params(&t->shape);
    t->pes = zo_dtype_size(t->shape.param_dtype);
    t->ges = zo_dtype_size(t->shape.grad_dtype);
    t->dev_need = train_shape_device_bytes(&t->shape);
    if ((double)opt->width * opt->width > (double)INT32_MAX || (double)opt->batch * opt->width > (double)INT32_MAX)
        return zo_tool_bad("zo-train", "a %" PRIu64 " x %" PRIu64 " layer at batch %" PRIu64
                                       " is beyond the GEMM's 32-bit sizes", opt->width, opt->width, opt->batch);
    /* refuse what cannot fit in this machine's memory before allocating it */
    zo_machine mach;
    zo_machine_get(&mach);
    uint64_t host_need = t->dev_need + t->nparams * (12 + 4 + (uint64_t)t->pes) * (opt->verify ? 2 : 1);
    if (mach.mem_bytes && host_need > mach.mem_bytes)
        return zo_tool_bad("zo-train", "%" PRIu64 " parameters need about %.0f MiB of memory (device model, "
                                       "masters, states, accumulators%s), more than this machine's %.0f MiB",
                           t->nparams, mib(host_need), opt->verify ? ", twice for --verify" : "",
                           mib(mach.mem_bytes));
    return 0;
}

static int install_signals(train_run *t)
{
    (void)t;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return 0;
}

/* The device: --backend (host: capped at the device budget), and whether
 * the model's layers must be tiled to fit that budget. */
static int open_device(train_run *t)
{
    const options *opt = &t->opt;
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    if (zo_dev_kind_parse(opt->backend, &dc.kind) < 0)
        return zo_tool_bad("zo-train", "--backend %s: host or cuda", opt->backend);
    /* By default the budget holds the device model (params, grads,
     * activations) and a little slack, never the fp32 masters and states. */
    t->budget = opt->dev_budget ? opt->dev_budget : train_default_device_budget(t->dev_need);
    if (t->use_part && !opt->dev_budget)
        /* zo_part's flat params and its gradient buckets (each at most
         * 25 MiB, at most the gradients; two with an asynchronous comm,
         * one filling while the other moves) live on the device too */
        t->budget += t->nparams * t->pes + (t->dp.comm.reduce_scatter_start ? 2u : 1u) *
                                               u64_min((uint64_t)25 << 20, t->nparams * t->ges);
    if (dc.kind == ZO_DEV_HOST)
        dc.host_mem_limit = (size_t)t->budget;
    int r = zo_dev_open(&t->dev, &dc);
    if (r < 0) {
        fprintf(stderr, "zo-train: --backend %s: the device does not open: %s (%s)%s\n", opt->backend, zo_strerror(r),
                zo_last_error_detail(), dc.kind == ZO_DEV_HOST ? "" : "; --backend host runs everywhere");
        return dc.kind == ZO_DEV_HOST ? 1 : 2;
    }
    /* A model that does not fit a given budget whole gets tiled layers
     * (every layer is W x W: all or none are tiled), planned as zo-plan
     * predicts (train_plan_tiles()). */
    zo_tile_grid plan_grid;
    t->tiled = opt->dev_budget ? train_plan_tiles(&t->shape, t->budget, &t->layer_budget, &plan_grid) : 0;
    if (t->tiled > 0 && t->use_part)
        return zo_tool_bad("zo-train", "--device-budget %.1f MiB would tile the layers, which one rank does alone: "
                                       "give the ranks a budget that holds the model", mib(t->budget));
    if (t->tiled < 0)
        return zo_tool_bad("zo-train", "--device-budget %.1f MiB: the activations and biases need %.1f MiB, so not "
                                       "even a tiled layer fits (%s%s%s)", mib(t->budget),
                           mib(train_shape_tiled_rest_bytes(&t->shape)), zo_strerror(t->tiled),
                           t->layer_budget ? ": " : "", t->layer_budget ? zo_last_error_detail() : "");
    return 0;
}

/* The engine configuration, first step: the defaults, then the JSON file
 * (--config), whose dtypes must be the model's. */
/* --state-dtype over the config file's zoffload.state_dtype; --verify's
 * in-memory run keeps fp32 or bf16 moments, so it refuses q8 / q4. 0, or
 * 2 (usage). */
static int state_flag(train_run *t)
{
    if (t->opt.state_bits >= 0) {
        t->jgroup.state_dtype = t->opt.state_dtype;
        t->jgroup.state_bits = (uint16_t)t->opt.state_bits;
    }
    if (t->opt.verify && t->jgroup.state_bits)
        return zo_tool_bad("zo-train", "--verify runs the steps in memory with fp32 or bf16 moments, not q%u: "
                                       "the engine's quantized step is checked bit for bit by tests/test_optim_q.c",
                           (unsigned)t->jgroup.state_bits);
    return 0;
}

static int load_config(train_run *t)
{
    const options *opt = &t->opt;
    zo_optim_config *cfg = &t->cfg;
    zo_optim_config_default(cfg);
    cfg->dev = t->dev;
    cfg->param_dtype = t->shape.param_dtype;
    cfg->grad_dtype = t->shape.grad_dtype;
    cfg->max_grad_norm = 1.0;
    /* NVMe placement from the config file alone still gets a parent directory */
    cfg->nvme_path = opt->nvme_path ? opt->nvme_path : "/var/tmp";
    zo_optim_group_default(&t->jgroup);
    if (!opt->config)
        return state_flag(t);
    int r;
    if ((r = zo_optim_json_load(opt->config, &t->cj)) < 0 ||
        /* the file decides dtypes too (bf16.enabled / fp16.enabled): keep the model's in step */
        (r = zo_optim_json_apply(t->cj, cfg, &t->jgroup)) < 0)
        return zo_tool_bad("zo-train", "--config %s: %s: %s", opt->config, zo_strerror(r), zo_last_error_detail());
    if ((r = state_flag(t)) != 0)
        return r;
    if (cfg->param_dtype != t->shape.param_dtype)
        return zo_tool_bad("zo-train", "--config %s sets device params %s, the model has %s: give --param-dtype %s "
                                       "to match", opt->config, zo_dtype_name(cfg->param_dtype),
                           zo_dtype_name(t->shape.param_dtype), zo_dtype_name(cfg->param_dtype));
    if (cfg->grad_dtype != ZO_DTYPE_COUNT && cfg->grad_dtype != t->shape.grad_dtype)
        return zo_tool_bad("zo-train", "--config %s sets device gradients (zoffload.grad_dtype) %s, the model's are "
                                       "%s: give --grad %s to match", opt->config, zo_dtype_name(cfg->grad_dtype),
                           zo_dtype_name(t->shape.grad_dtype), zo_dtype_name(cfg->grad_dtype));
    const char *rep = zo_optim_json_report(t->cj);
    if (rep && *rep && !opt->quiet)
        printf("config %s:\n%s", opt->config, rep);
    return 0;
}

/* The engine configuration, second step: the flags override the file. */
static int apply_flags(train_run *t)
{
    const options *opt = &t->opt;
    zo_optim_config *cfg = &t->cfg;
    t->hp_w = cfg->hparams;
    /* the learning rate: --lr, else the config file's, else the width-scaled default */
    double cfg_lr;
    if (opt->lr_given || !t->cj || zo_optim_json_number(t->cj, "optimizer.params.lr", &cfg_lr) < 0)
        t->hp_w.lr = opt->lr;
    /* biases: no weight decay (the usual second parameter group) */
    t->hp_b = t->hp_w;
    t->hp_b.weight_decay = 0;
    if (opt->offload >= 0)
        cfg->placement = (zo_optim_placement)opt->offload;
    if (opt->dpu >= 0)
        cfg->dpu = opt->dpu;
    if (opt->dpu_warmup >= 0)
        cfg->dpu_warmup_steps = (unsigned)opt->dpu_warmup;
    if (opt->accum > 0)
        cfg->grad_accum_steps = (unsigned)opt->accum;
    if (opt->clip >= 0)
        cfg->max_grad_norm = opt->clip;
    if (opt->sub_group)
        cfg->sub_group_size = opt->sub_group;
    if (opt->nthreads)
        cfg->nthreads = opt->nthreads;
    if (!cfg->nthreads)
        cfg->nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN); /* explicit, so --verify's team matches */
    if (opt->verify && cfg->clip_mode == ZO_OPTIM_CLIP_SPECULATIVE && cfg->max_grad_norm > 0)
        /* a clipped speculative step is rolled back, which is exact only
         * within the rollback's rounding bounds (optim.h) */
        return zo_tool_bad("zo-train", "--verify compares bit for bit, and speculative clipping rolls clipped "
                                       "steps back within rounding bounds: use clip_mode two_pass, or --clip 0");
    return 0;
}

/* NVMe placement: the private run directory (a killed run's is reclaimed
 * here), under --nvme-path, else the config's nvme_path, else /var/tmp. */
static int place_state(train_run *t)
{
    zo_optim_config *cfg = &t->cfg;
    if (cfg->placement == ZO_OPTIM_PLACE_NVME) {
        if (make_tmpdir(t->opt.nvme_path ? t->opt.nvme_path : cfg->nvme_path) < 0)
            return 2;
        cfg->nvme_path = g_run.path;
    } else if (t->opt.nvme_path) {
        return zo_tool_bad("zo-train", "--nvme-path needs --offload nvme");
    } else {
        cfg->nvme_path = NULL;
    }
    return 0;
}

/* Tiled layers: the home of the weight tiles, a store in pinned host
 * memory or (NVMe placement) on swap files in the run directory. */
static int open_tile_home(train_run *t)
{
    if (t->cfg.dpu)
        /* the tiles are rewritten from the engine's parameter buffer after
         * each zo_optim_wait(); under DPU the update in flight flips that
         * buffer while the next forward runs */
        return zo_tool_bad("zo-train", "tiled layers (the model does not fit --device-budget) need --dpu off");
    train_tiling *tiling = &t->tiling;
    tiling->home = t->cfg.placement == ZO_OPTIM_PLACE_NVME ? ZO_TIER_NVME : ZO_TIER_HOST;
    tiling->layer_budget = t->layer_budget; /* zo_tiled_linear_create() plans the grid from it again */
    tiling->prefix = "layer";
    uint64_t wbytes = (uint64_t)t->shape.layers * t->shape.width * t->shape.width * 4;
    if (tiling->home == ZO_TIER_NVME) {
        char dir[PATH_MAX + 8];
        snprintf(dir, sizeof(dir), "%s/tiles", g_run.path);
        zo_swap_config sc;
        zo_swap_config_default(&sc);
        const char *dirs[1] = {dir};
        sc.dirs = dirs;
        sc.ndirs = 1;
        sc.arena_size = wbytes;
        if (mkdir(dir, 0700) < 0 || zo_swap_create(&t->tile_swap, &sc) < 0) {
            fprintf(stderr, "zo-train: the tiles' NVMe home %s: %s\n", dir,
                    errno && !t->tile_swap ? strerror(errno) : zo_last_error_detail());
            return 1;
        }
    }
    if (open_tile_store(t->dev, wbytes, t->tile_swap, &t->tile_store) < 0)
        return 1;
    tiling->store = t->tile_store;
    return 0;
}

/* The device model (params, grads, activations); tiled layers homed in a store. */
static int build_model(train_run *t)
{
    int rc = t->tiled ? open_tile_home(t) : 0;
    if (rc)
        return rc;
    int r = device_model_init(&t->dm, t->dev, &t->shape, t->tiled ? &t->tiling : NULL);
    if (r < 0) {
        if (t->tiled)
            fprintf(stderr, "zo-train: tiled layers within the device budget of %.1f MiB: %s\n", mib(t->budget),
                    zo_strerror(r));
        else
            fprintf(stderr, "zo-train: the model (%.1f MiB of params, grads and activations) does not fit the device "
                            "budget of %.1f MiB: %s\n", mib(t->dev_need), mib(t->budget), zo_strerror(r));
        return r == ZO_EBUDGET ? 2 : 1;
    }
    return 0;
}

/* The engine: two parameter groups, the weights (weight decay) and the
 * biases (none), over the device model's tensors; the initial parameters
 * are written to the device first. */
static int create_engine(train_run *t)
{
    device_model *dm = &t->dm;
    int rc = 1, r;
    const char **names = calloc(dm->ntensors, sizeof(char *));
    char (*namebuf)[32] = calloc(dm->ntensors, 32);
    if (!names || !namebuf) {
        fprintf(stderr, "zo-train: out of memory\n");
        goto out;
    }
    for (unsigned i = 0; i < dm->ntensors; i++) {
        if (i >= dm->nweights)
            snprintf(namebuf[i], 32, "layer%u.bias", i - dm->nweights);
        else if (t->tiled)
            snprintf(namebuf[i], 32, "layer%u.weight.%u", i / dm->model.tiles, i % dm->model.tiles);
        else
            snprintf(namebuf[i], 32, "layer%u.weight", i);
        names[i] = namebuf[i];
    }
    for (int g = 0; g < 2; g++) {
        zo_optim_group *grp = &t->grp[g];
        zo_optim_group_default(grp);
        grp->ntensors = g ? t->shape.layers : dm->nweights;
        grp->numel = dm->numel + (g ? dm->nweights : 0);
        grp->names = names + (g ? dm->nweights : 0);
        /* tiles: the engine never touches them; zo-train writes them from
         * the parameter buffers after each update (refresh_tiles()) */
        grp->dev_params = g == 0 && t->tiled ? NULL : dm->param + (g ? dm->nweights : 0);
        grp->hparams = g ? &t->hp_b : &t->hp_w;
        grp->state_dtype = t->jgroup.state_dtype;
        grp->state_bits = t->jgroup.state_bits;
        grp->state_block = t->jgroup.state_block;
    }
    t->cfg.groups = t->grp;
    t->cfg.ngroups = 2;
    if ((r = train_model_init_params(&dm->model)) < 0) {
        fprintf(stderr, "zo-train: initial parameters: %s (%s)\n", zo_strerror(r), zo_dev_errmsg(t->dev));
        goto out;
    }
    if (t->use_part) {
        /* every rank the whole model's template; zo_part keeps 1/world of
         * the masters and states (its shard of each group) */
        zo_part_config pc;
        zo_part_config_default(&pc);
        pc.optim = &t->cfg;
        pc.comm = &t->dp.comm;
        if ((r = zo_part_create(&t->part, &pc)) < 0) {
            fprintf(stderr, "zo-train: zo_part_create: %s: %s\n", zo_strerror(r), zo_last_error_detail());
            rc = r == ZO_ECONFIG || r == ZO_EBUDGET || r == ZO_ENOTSUP || r == -EINVAL ? 2 : 1;
            goto out;
        }
        t->o = zo_part_optim(t->part);
    } else if ((r = zo_optim_create(&t->o, &t->cfg)) < 0) {
        fprintf(stderr, "zo-train: zo_optim_create: %s: %s\n", zo_strerror(r), zo_last_error_detail());
        rc = r == ZO_ECONFIG || r == ZO_EBUDGET || r == -EINVAL ? 2 : 1;
        goto out;
    }
    zo_optim_json_free(&t->cj); /* cfg pointed into it until create */
    rc = 0;
out:
    free(names); /* the engine keeps its own copies */
    free(namebuf);
    return rc;
}

/* --resume: the engine's masters and states from the checkpoint, and what
 * zo-train keeps in its user data: the data position (micro), the seed (the
 * teacher and the data follow it: another one is refused) and the learning
 * rate (--lr replaces it). */
static int resume_checkpoint(train_run *t)
{
    const options *opt = &t->opt;
    char user[256] = "";
    int r;
    if ((r = t->part ? zo_part_load(t->part, opt->resume, NULL, user, sizeof(user))
                     : zo_optim_load(t->o, opt->resume, NULL, user, sizeof(user))) < 0) {
        fprintf(stderr, "zo-train: --resume %s: %s: %s\n", opt->resume, zo_strerror(r),
                t->part ? zo_part_errmsg(t->part) : zo_optim_errmsg(t->o));
        return 1;
    }
    const char *p = strstr(user, "\"micro\":");
    unsigned long long um = 0;
    if (!p || sscanf(p, "\"micro\":%llu", &um) != 1) {
        fprintf(stderr, "zo-train: --resume %s: not a zo-train checkpoint\n", opt->resume);
        return 1;
    }
    t->micro = um;
    /* The seed makes the teacher and the data: the run goes on with the
     * checkpoint's, and another one would be another task. */
    unsigned long long useed;
    if ((p = strstr(user, "\"seed\":")) && sscanf(p, "\"seed\":%llu", &useed) == 1) {
        if (opt->seed_given && opt->seed != useed)
            return zo_tool_bad("zo-train", "--resume %s: --seed %" PRIu64 ", but the checkpoint was trained with "
                                           "seed %llu (the teacher and the data follow the seed): give --seed %llu "
                                           "or leave it out", opt->resume, opt->seed, useed, useed);
        t->shape.seed = useed;
    }
    /* The learning rate: --lr replaces the checkpoint's; without it the
     * checkpoint's goes on (zo_optim_load restored it), and the
     * reference of --verify takes it too. */
    double ulr;
    const char *lr_from = "--lr";
    if (opt->lr_given) {
        if (t->part ? (r = zo_part_set_lr(t->part, 0, opt->lr)) < 0 || (r = zo_part_set_lr(t->part, 1, opt->lr)) < 0
                    : (r = zo_optim_set_lr(t->o, 0, opt->lr)) < 0 || (r = zo_optim_set_lr(t->o, 1, opt->lr)) < 0)
            return zo_tool_bad("zo-train", "--lr %g: %s (%s)", opt->lr, zo_strerror(r), zo_optim_errmsg(t->o));
    } else if ((p = strstr(user, "\"lr\":")) && sscanf(p, "\"lr\":%lf", &ulr) == 1) {
        t->hp_w.lr = t->hp_b.lr = ulr;
        lr_from = "the checkpoint's";
    } else {
        lr_from = NULL; /* an older checkpoint: the engine has it, we do not know it */
    }
    printf("resumed from %s: seed %" PRIu64 "%s, ", opt->resume, t->shape.seed,
           opt->seed_given ? "" : " (the checkpoint's)");
    if (lr_from)
        printf("lr %g (%s)\n", t->hp_w.lr, lr_from);
    else
        printf("lr: the checkpoint's (not recorded in it)\n");
    return t->tiled && refresh_tiles(t->o, &t->dm) < 0 ? 1 : 0;
}

/* The engine's starting state: a checkpoint (--resume), else the initial
 * parameters as masters and zero optimizer states. */
static int start_state(train_run *t)
{
    if (t->opt.resume)
        return resume_checkpoint(t);
    if (t->tiled)
        /* the tiles have no device params to read: the initial values go in as masters */
        return init_masters(t->o, &t->dm) < 0 ? 1 : 0;
    int r = t->part ? zo_part_init_from_device(t->part) : zo_optim_init_from_device(t->o);
    if (r < 0) {
        fprintf(stderr, "zo-train: init_from_device: %s: %s\n", zo_strerror(r),
                t->part ? zo_part_errmsg(t->part) : zo_optim_errmsg(t->o));
        return 1;
    }
    return 0;
}

/* Before the first step: the --save directory can take this run's
 * checkpoints (found now, not after the whole run), the reference of
 * --verify starts where the engine does, the teacher and the batch
 * buffers exist, and the --json file is new. */
static int prepare_run(train_run *t)
{
    const options *opt = &t->opt;
    int r;
    if (opt->save) {
        zo_optim_info si = {.struct_size = sizeof(si)};
        if (zo_optim_get_info(t->o, &si) < 0 || check_save_dir(opt->save, si.step, si.step + opt->steps) < 0)
            return 2;
        /* many ranks: each saves into <save>/rank<r> (zo_part_save) */
        char rdir[PATH_MAX];
        if (t->part && (snprintf(rdir, sizeof(rdir), "%s/rank%u", opt->save, t->dp.rank) >= (int)sizeof(rdir) ||
                        check_save_dir(rdir, si.step, si.step + opt->steps) < 0))
            return 2;
    }
    if (opt->verify && ((r = reference_init(&t->ref, &t->shape, &t->cfg, &t->dm, t->tiled ? &t->tiling : NULL,
                                            t->dp.world)) < 0 ||
                        (r = reference_start(&t->ref, t->o, &t->dm)) < 0)) {
        fprintf(stderr, "zo-train: verify: %s\n", zo_strerror(r));
        return 1;
    }
    /* the teacher makes the global batch; each rank trains its slice */
    train_shape gs = t->shape;
    gs.batch = t->global_batch;
    size_t batch_bytes = gs.batch * gs.width * 4;
    if (train_teacher_init(&t->teacher, &gs) < 0 || !(t->x = malloc(batch_bytes)) ||
        !(t->y = malloc(batch_bytes))) {
        fprintf(stderr, "zo-train: out of memory for the teacher and the data\n");
        return 1;
    }
    if (opt->json && t->dp.rank == 0 && !(t->jf = create_file(opt->json))) /* rank 0 writes for the run */
        return 2;
    return 0;
}

/* What is about to run: the model, the device, the tiles, the engine. */
static int print_setup(train_run *t)
{
    const train_shape *s = &t->shape;
    const zo_optim_config *cfg = &t->cfg;
    const char *backend = t->opt.backend;
    zo_optim_info info = {.struct_size = sizeof(info)};
    zo_optim_get_info(t->o, &info);
    printf("model: %u layers of %zu x %zu + bias, %" PRIu64 " parameters (%.1f M), batch %zu x %u micro-steps\n",
           s->layers, s->width, s->width, t->nparams, t->nparams / 1e6, t->global_batch, cfg->grad_accum_steps);
    if (t->part) {
        zo_part_info pi = {.struct_size = sizeof(pi)};
        zo_part_get_info(t->part, &pi);
        printf("ranks: %u (MPI), each a slice of %zu samples; rank %u owns %" PRIu64 " of the %" PRIu64
               " elements (%.1f MiB of masters and states), %u gradient buckets per micro-step\n",
               pi.world, s->batch, pi.rank, pi.shard_numel, pi.numel,
               mib(pi.state_host_bytes + pi.state_nvme_bytes), pi.nbuckets);
    }
    if (t->tiled)
        printf("device (%s): budget %.1f MiB, held %.1f MiB: params %s and grads %s of the biases, activations; "
               "the weights in tiles\n", backend, mib(t->budget), mib(t->dm.bytes), zo_dtype_name(s->param_dtype),
               zo_dtype_name(s->grad_dtype));
    else
        printf("device (%s): budget %.1f MiB; params %s %.1f MiB, grads %s %.1f MiB, activations %.1f MiB\n",
               backend, mib(t->budget), zo_dtype_name(s->param_dtype), mib(t->nparams * t->pes),
               zo_dtype_name(s->grad_dtype), mib(t->nparams * t->ges), mib(train_shape_activation_bytes(s)));
    if (t->tiled) {
        const zo_tile_grid *g = &t->dm.model.grid;
        printf("tiles: a %zu x %zu weight (%.1f MiB as fp32 tiles) does not fit the device budget -> per layer %u x %u "
               "tiles of %u x %u (%.1f KiB) homed in %s, %.1f MiB device working memory (zo_tile_plan of %.1f MiB)\n",
               s->width, s->width, mib((uint64_t)s->width * s->width * 4), g->tiles_out, g->tiles_in,
               g->tile_out, g->tile_in, g->tile_bytes / 1024.0,
               t->tiling.home == ZO_TIER_NVME ? "NVMe" : "pinned host memory", mib(g->work_bytes),
               mib(t->tiling.layer_budget));
    }
    /* master, m, v (quantized: codes and about a scale per block) */
    uint64_t state_bytes = t->jgroup.state_bits ? t->nparams * 4 + t->nparams * t->jgroup.state_bits / 4
                                                : t->nparams * (4 + 2 * zo_dtype_size(t->jgroup.state_dtype));
    state_bytes /= t->dp.world; /* this rank's */
    printf("engine: fp32 masters + optimizer states %.1f MiB %s the device budget -> %s%s; DPU %s (warm-up %u), "
           "clip %g, %d threads, %u sub-groups\n",
           mib(state_bytes), state_bytes > t->budget ? "do not fit" : "would fit",
           cfg->placement == ZO_OPTIM_PLACE_NVME ? "NVMe in " : "pinned host memory",
           cfg->placement == ZO_OPTIM_PLACE_NVME ? g_run.path : "", cfg->dpu ? "on" : "off", cfg->dpu_warmup_steps,
           cfg->max_grad_norm, cfg->nthreads, info.nsubgroups);
    fflush(stdout);
    return 0;
}

/* One optimizer step's window, as it went. */
typedef struct window {
    double scale;             /* fp16: the dynamic loss scale of this window */
    double compute, data;     /* seconds: forward and backward; the teacher's batches */
    double loss, ref_loss;    /* mean over the micro-steps; the reference's (--verify) */
    double ref_rank_loss[64]; /* many ranks, --verify: each rank's slice's loss, summed in rank order */
    zo_optim_step_result res; /* many ranks: the boundary's zo_part_step() result */
    unsigned done;            /* micro-steps run: grad_accum_steps, or fewer when a signal stopped it */
} window;

/* The micro-steps of one accumulation window: forward, backward handing
 * each gradient to the engine, and a step call each; with --verify the
 * reference does the same on the same batch. A signal is checked at every
 * micro-step, not only at the boundary. */
static int run_window(train_run *t, window *w)
{
    unsigned accum = t->cfg.grad_accum_steps;
    int r;
    size_t slice = t->shape.batch * t->shape.width; /* one rank's samples: its part of x and y */
    const float *x = t->x + t->dp.rank * slice, *y = t->y + t->dp.rank * slice;
    for (w->done = 0; w->done < accum; w->done++, t->micro++) {
        /* many ranks agree on stopping at a step boundary (train_loop) */
        if (g_stop && !t->part)
            break;
        test_micro_delay();
        double td = now_s();
        train_teacher_batch(&t->teacher, t->micro, t->x, t->y);
        double tc = now_s();
        w->data += tc - td;
        double l;
        if ((r = train_forward(&t->dm.model, x, y, &l)) < 0) {
            fprintf(stderr, "zo-train: forward: %s (%s)\n", zo_strerror(r), zo_dev_errmsg(t->dev));
            return 1;
        }
        /* the previous step's gradient copies must be done before
         * backward rewrites the gradient buffers */
        if (!t->part && (r = zo_optim_grads_done(t->o)) < 0) {
            fprintf(stderr, "zo-train: zo_optim_grads_done: %s (%s)\n", zo_strerror(r), zo_optim_errmsg(t->o));
            return 1;
        }
        engine_intake ei = {.o = t->o, .part = t->part, .grad_dtype = t->shape.grad_dtype};
        if ((r = train_backward(&t->dm.model, y, w->scale, engine_grad, &ei)) < 0) {
            fprintf(stderr, "zo-train: backward: %s (%s)\n", zo_strerror(r), zo_dev_errmsg(t->dev));
            return 1;
        }
        w->compute += now_s() - tc;
        w->loss += l / accum;
        /* every micro-step ends with a step call; only the boundary updates */
        if (t->part) {
            /* reduces the buckets still open; at the boundary the update
             * with the global norm, and the all-gather of the params */
            w->res.struct_size = sizeof(w->res);
            if ((r = zo_part_step(t->part, &w->res)) < 0) {
                fprintf(stderr, "zo-train: zo_part_step: %s (%s)\n", zo_strerror(r), zo_part_errmsg(t->part));
                return 1;
            }
        } else if ((r = zo_optim_step_async(t->o, NULL)) < 0) {
            fprintf(stderr, "zo-train: zo_optim_step_async: %s (%s)\n", zo_strerror(r), zo_optim_errmsg(t->o));
            return 1;
        }
        if (t->opt.verify && t->part) {
            /* the reference is the single-rank run of the global batch:
             * every rank's slice, the gradients averaged as zo_part does */
            for (unsigned k = 0; k < t->dp.world; k++) {
                double rl = 0;
                t->ref.slice = k;
                if ((r = train_forward(&t->ref.model, t->x + k * slice, t->y + k * slice, &rl)) < 0 ||
                    (r = train_backward(&t->ref.model, t->y + k * slice, w->scale, reference_grad, &t->ref)) < 0) {
                    fprintf(stderr, "zo-train: verify: reference model: %s\n", zo_strerror(r));
                    return 1;
                }
                w->ref_rank_loss[k] += rl / accum;
            }
            reference_dp_mean(&t->ref);
        } else if (t->opt.verify) {
            double rl = 0;
            if ((r = train_forward(&t->ref.model, t->x, t->y, &rl)) < 0 ||
                (r = train_backward(&t->ref.model, t->y, w->scale, reference_grad, &t->ref)) < 0) {
                fprintf(stderr, "zo-train: verify: reference model: %s\n", zo_strerror(r));
                return 1;
            }
            w->ref_loss += rl / accum;
        }
    }
    return 0;
}

/* Stopped inside the window: a step on part of it would not be this run's
 * step, and a save is refused mid-window; drop it, so the run ends (and
 * saves) at the last boundary and a resumed run starts this window again
 * from its first micro-step. */
static int drop_window(train_run *t, const window *w)
{
    int r = zo_optim_discard_grads(t->o);
    if (r < 0) {
        fprintf(stderr, "zo-train: dropping the interrupted window: %s (%s)\n", zo_strerror(r), zo_optim_errmsg(t->o));
        return 1;
    }
    t->micro -= w->done;
    if (t->opt.verify)
        for (unsigned i = 0; i < t->ref.ntensors; i++)
            t->ref.first[i] = 1;
    printf("interrupted inside an accumulation window: its %u of %u micro-steps are dropped\n", w->done,
           t->cfg.grad_accum_steps);
    return 0;
}

/* A step's line: loss, time, and the latest finished update's timeline. */
static void print_step(int64_t step, const window *w, double dt, const zo_optim_timeline *tl, int have_tl,
                       const zo_optim_step_result *res)
{
    printf("step %4" PRId64 " loss %.6f  %7.1f ms: compute %.1f", step, w->loss, dt * 1e3, w->compute * 1e3);
    if (have_tl)
        printf(" | update %" PRId64 ": d2h %.1f optim %.1f nvme-r %.1f nvme-w %.1f h2d %.1f stall %.1f", tl->step,
               tl->d2h_ns * 1e-6, (tl->compute_ns + tl->norm_ns) * 1e-6, tl->nvme_read_ns * 1e-6,
               tl->nvme_write_ns * 1e-6, tl->h2d_ns * 1e-6, tl->stall_ns * 1e-6);
    if (res->boundary && res->clipped)
        printf(" clip %.3f", res->clip_coef);
    if (res->skipped)
        printf(" (skipped: overflow)");
    printf("\n");
    fflush(stdout);
}

/* The end of step s (0-based, of this run) after its window: the update
 * finished (or left in flight under DPU), the tiles rewritten, the
 * reference stepped, the totals, the step's line and JSON. */
static int finish_step(train_run *t, unsigned s, double t0, window *w)
{
    const zo_optim_config *cfg = &t->cfg;
    zo_optim_info info = {.struct_size = sizeof(info)};
    int r;
    /* Without DPU (or in its warm-up) the update finishes now; with it,
     * the next step call finishes it while this step's forward runs. */
    if ((r = zo_optim_get_info(t->o, &info)) < 0) {
        fprintf(stderr, "zo-train: zo_optim_get_info: %s (%s)\n", zo_strerror(r), zo_optim_errmsg(t->o));
        return 1;
    }
    zo_optim_step_result res = {.struct_size = sizeof(res)};
    if (t->part) {
        /* zo_part_step() finished the update (under DPU the previous one);
         * the loss is the mean of the ranks' slices' losses (equal slices:
         * the global batch's mean) */
        res = w->res;
        double l = w->loss;
        if ((r = dp_reduce(t, &l, 1, ZO_COMM_SUM)) < 0) {
            fprintf(stderr, "zo-train: step %u: all-reduce of the loss: %s\n", s + 1, zo_strerror(r));
            return 1;
        }
        w->loss = l / t->dp.world;
        double rl = 0;
        for (unsigned k = 0; k < t->dp.world && t->opt.verify; k++)
            rl += w->ref_rank_loss[k];
        w->ref_loss = rl / t->dp.world;
    } else if ((!cfg->dpu || !info.dpu_active) && (r = zo_optim_wait(t->o, &res)) < 0) {
        fprintf(stderr, "zo-train: step %u: %s (%s)\n", s + 1, zo_strerror(r), zo_optim_errmsg(t->o));
        return 1;
    }
    if (t->tiled && refresh_tiles(t->o, &t->dm) < 0)
        return 1;
    t->dev_peak = device_in_use(t->dev, t->dev_peak);
    double dt = now_s() - t0;
    if (t->opt.verify) {
        if ((r = reference_step(&t->ref, w->scale, cfg->max_grad_norm, cfg->dpu_warmup_steps, cfg->dpu)) < 0) {
            fprintf(stderr, "zo-train: verify: reference step: %s\n", zo_strerror(r));
            return 1;
        }
        if (memcmp(&w->loss, &w->ref_loss, sizeof(double)) && !t->verify_failed) {
            fprintf(stderr, "zo-train: verify: step %u: loss %.9g, reference %.9g\n", s + 1, w->loss, w->ref_loss);
            t->verify_failed = 1;
        }
    }
    zo_optim_timeline tl = {.struct_size = sizeof(tl)};
    int have_tl = zo_optim_get_timeline(t->o, &tl) == 0;
    totals *tot = &t->tot;
    if (tot->steps == 0)
        tot->first_loss = w->loss;
    tot->last_loss = w->loss;
    tot->steps++;
    tot->compute_s += w->compute;
    tot->data_s += w->data;
    if (have_tl)
        totals_add_timeline(tot, &tl);
    if (!t->opt.quiet)
        print_step(t->step0 + s + 1, w, dt, &tl, have_tl, &res);
    if (t->jf)
        step_json(t->jf, t->step0 + s + 1, w->loss, dt, w->compute, w->data, &tl, have_tl);
    return 0;
}

/* The training loop: --steps optimizer steps, or fewer after a signal. */
static int train_loop(train_run *t)
{
    t->dev_peak = device_in_use(t->dev, t->dev_peak);
    t->t_start = now_s();
    zo_optim_info info = {.struct_size = sizeof(info)};
    zo_optim_get_info(t->o, &info);
    t->step0 = info.step;
    for (unsigned s = 0; s < t->opt.steps; s++) {
        int stop_now = g_stop != 0;
        if (t->part) {
            /* a signal reaches the ranks at different moments: they stop
             * together, at the first step boundary where any has one. The
             * decision is the reduced flag alone: a signal that lands after
             * this rank's value went in (while it waits for a slower rank)
             * is for the next boundary, else this rank would stop while the
             * others go on into the next step's collectives. */
            double stop = g_stop;
            int r = dp_reduce(t, &stop, 1, ZO_COMM_MAX);
            if (r < 0) {
                fprintf(stderr, "zo-train: all-reduce of the stop flag: %s\n", zo_strerror(r));
                return 1;
            }
            test_signal_after_stop_reduce(t->dp.rank);
            stop_now = stop > 0;
            if (stop_now && !g_stop)
                g_stop = (sig_atomic_t)stop;
        }
        if (stop_now)
            break;
        double t0 = now_s();
        window w = {.scale = t->part ? zo_part_loss_scale(t->part) : zo_optim_loss_scale(t->o)};
        int rc = run_window(t, &w);
        if (rc)
            return rc;
        if (w.done < t->cfg.grad_accum_steps)
            return drop_window(t, &w);
        if ((rc = finish_step(t, s, t0, &w)))
            return rc;
    }
    return 0;
}

/* After the loop: the update in flight (DPU) finished, so the device
 * params are current, and its timeline counted. */
static int finish_training(train_run *t)
{
    /* many ranks: the update in flight (DPU) finished and gathered on every rank */
    int r = t->part ? zo_part_wait(t->part, NULL) : zo_optim_wait(t->o, NULL);
    if (r < 0) {
        fprintf(stderr, "zo-train: final step: %s (%s)\n", zo_strerror(r),
                t->part ? zo_part_errmsg(t->part) : zo_optim_errmsg(t->o));
        return 1;
    }
    if (t->tiled && refresh_tiles(t->o, &t->dm) < 0)
        return 1;
    t->tot.wall_s = now_s() - t->t_start;
    zo_optim_timeline tl = {.struct_size = sizeof(tl)};
    if (zo_optim_get_timeline(t->o, &tl) == 0)
        totals_add_timeline(&t->tot, &tl); /* the last update, finished by the wait */
    if (g_stop)
        printf("interrupted (%s): stopped at a step boundary\n", g_stop == SIGTERM ? "SIGTERM" : "SIGINT");
    return 0;
}

/* --save: the checkpoint step-K (K the engine's step), with what a resumed
 * run needs in its user data (resume_checkpoint()). */
static int save_checkpoint(train_run *t)
{
    if (!t->opt.save)
        return 0;
    char name[64], user[192];
    zo_optim_info info = {.struct_size = sizeof(info)};
    zo_optim_get_info(t->o, &info);
    snprintf(name, sizeof(name), "step-%" PRId64, info.step);
    snprintf(user, sizeof(user),
             "{\"micro\":%" PRIu64 ",\"layers\":%u,\"width\":%zu,\"seed\":%" PRIu64 ",\"lr\":%.17g}", t->micro,
             t->shape.layers, t->shape.width, t->shape.seed, t->hp_w.lr);
    int r = t->part ? zo_part_save(t->part, t->opt.save, name, 2, user) : zo_optim_save(t->o, t->opt.save, name, 2, user);
    if (r < 0)
        fprintf(stderr, "zo-train: --save %s: %s (%s)\n", t->opt.save, zo_strerror(r),
                t->part ? zo_part_errmsg(t->part) : zo_optim_errmsg(t->o));
    if (t->part) {
        /* the checkpoint is whole once every rank's shard is saved */
        double failed = r < 0;
        if (dp_reduce(t, &failed, 1, ZO_COMM_MAX) < 0 || failed > 0) {
            if (r >= 0)
                fprintf(stderr, "zo-train: --save %s: another rank's shard was not saved: %s is incomplete\n",
                        t->opt.save, name);
            t->failed_together = failed > 0;
            return 1;
        }
        printf("saved %s/rank*/%s (%u ranks)\n", t->opt.save, name, t->dp.world);
        return 0;
    }
    if (r < 0)
        return 1;
    printf("saved %s/%s\n", t->opt.save, name);
    return 0;
}

/* The summary's figures, for its lines and its JSON. */
typedef struct summary {
    zo_optim_info info;
    struct rusage ru;
    double samples, ms;       /* samples trained; wall ms per step */
    int64_t applied;          /* updates this run applied */
    uint64_t moved[4];        /* bytes: d2h, h2d, NVMe read, NVMe write */
} summary;

static void summary_json(train_run *t, const summary *sm)
{
    const totals *tot = &t->tot;
    zo_json jw;
    zj_init(&jw, t->jf, 0);
    zj_obj_begin(&jw, NULL);
    zj_str(&jw, "type", "summary");
    zj_uint(&jw, "params", t->nparams);
    zj_uint(&jw, "layers", t->shape.layers);
    zj_uint(&jw, "width", t->shape.width);
    zj_uint(&jw, "batch", t->global_batch);
    zj_uint(&jw, "ranks", t->dp.world);
    zj_uint(&jw, "accum", t->cfg.grad_accum_steps);
    zj_str(&jw, "offload", t->cfg.placement == ZO_OPTIM_PLACE_NVME ? "nvme" : "host");
    zj_bool(&jw, "dpu", t->cfg.dpu);
    zj_uint(&jw, "steps", tot->steps);
    zj_num(&jw, "step_ms", sm->ms);
    zj_num(&jw, "compute_ms", tot->steps ? tot->compute_s * 1e3 / tot->steps : 0);
    zj_num(&jw, "data_ms", tot->steps ? tot->data_s * 1e3 / tot->steps : 0);
    zj_num(&jw, "samples_per_s", tot->wall_s > 0 ? sm->samples / tot->wall_s : 0);
    zj_num(&jw, "first_loss", tot->first_loss);
    zj_num(&jw, "last_loss", tot->last_loss);
    zj_uint(&jw, "device_bytes", t->dm.bytes);
    zj_uint(&jw, "device_peak_bytes", t->dev_peak);
    zj_uint(&jw, "device_budget_bytes", t->budget);
    zj_uint(&jw, "tiles_per_layer", t->tiled ? t->dm.model.tiles : 0);
    zj_uint(&jw, "pinned_bytes", sm->info.pinned_bytes);
    zj_uint(&jw, "host_bytes", sm->info.host_bytes);
    zj_uint(&jw, "peak_rss_bytes", (uint64_t)sm->ru.ru_maxrss * 1024);
    zj_int(&jw, "updates_applied", sm->applied);
    zj_uint(&jw, "d2h_bytes", sm->moved[0]);
    zj_uint(&jw, "h2d_bytes", sm->moved[1]);
    zj_uint(&jw, "nvme_read_bytes", sm->moved[2]);
    zj_uint(&jw, "nvme_write_bytes", sm->moved[3]);
    /* means over the updates, named as zo-plan's "predicted" */
    double k = tot->updates ? 1e-6 / tot->updates : 0;
    zj_uint(&jw, "updates_seen", tot->updates);
    zj_num(&jw, "update_ms", tot->sum.total_ns * k);
    zj_num(&jw, "d2h_ms", tot->sum.d2h_ns * k);
    zj_num(&jw, "optim_ms", (tot->sum.compute_ns + tot->sum.norm_ns) * k);
    zj_num(&jw, "nvme_read_ms", tot->sum.nvme_read_ns * k);
    zj_num(&jw, "nvme_write_ms", tot->sum.nvme_write_ns * k);
    zj_num(&jw, "h2d_ms", tot->sum.h2d_ns * k);
    zj_num(&jw, "stall_ms", tot->sum.stall_ns * k);
    zj_obj_end(&jw);
    zj_end(&jw);
}

/* The summary: speed, loss, memory, bytes moved, the mean update; and its
 * JSON line (--json). */
static int report(train_run *t)
{
    const totals *tot = &t->tot;
    unsigned accum = t->cfg.grad_accum_steps;
    summary sm = {.info = {.struct_size = sizeof(sm.info)}};
    zo_optim_get_info(t->o, &sm.info);
    zo_pinned_stats ps;
    zo_pinned_stats_get(&ps);
    getrusage(RUSAGE_SELF, &sm.ru);
    sm.samples = (double)tot->steps * accum * t->global_batch;
    sm.ms = tot->steps ? tot->wall_s * 1e3 / tot->steps : 0;
    printf("summary: %u steps in %.1f s (%.1f ms/step, compute %.1f ms/step), %.0f samples/s, %.1f GFLOP/s\n",
           tot->steps, tot->wall_s, sm.ms, tot->steps ? tot->compute_s * 1e3 / tot->steps : 0,
           tot->wall_s > 0 ? sm.samples / tot->wall_s : 0,
           tot->wall_s > 0 ? train_shape_flops(&t->shape) * t->dp.world * tot->steps * accum / tot->wall_s / 1e9 : 0);
    printf("loss: %.6f -> %.6f (%.1f%% of the start; floor 0)\n", tot->first_loss, tot->last_loss,
           tot->first_loss > 0 ? 100.0 * tot->last_loss / tot->first_loss : 0);
    t->dev_peak = device_in_use(t->dev, t->dev_peak);
    if (t->part)
        printf("(memory and bytes moved below: rank %u of %u, its shard)\n", t->dp.rank, t->dp.world);
    printf("memory: device %.1f MiB, peak in use %.1f MiB (budget %.1f), engine pinned %.1f MiB (process peak locked "
           "%.1f), engine pageable %.1f MiB, process peak RSS %.1f MiB\n",
           mib(t->dm.bytes), mib(t->dev_peak), mib(t->budget), mib(sm.info.pinned_bytes), mib(ps.locked_peak),
           mib(sm.info.host_bytes), sm.ru.ru_maxrss / 1024.0);
    /* Bytes moved: every update of one run moves the same bytes (the same
     * tensors, the same states), so the run's total is the mean per update
     * seen times the updates applied. */
    sm.applied = sm.info.step - t->step0;
    double per = tot->updates ? (double)sm.applied / tot->updates : 0;
    sm.moved[0] = (uint64_t)(tot->sum.d2h_bytes * per);
    sm.moved[1] = (uint64_t)(tot->sum.h2d_bytes * per);
    sm.moved[2] = (uint64_t)(tot->sum.nvme_read_bytes * per);
    sm.moved[3] = (uint64_t)(tot->sum.nvme_write_bytes * per);
    printf("moved in %" PRId64 " updates: d2h %.1f MiB, h2d %.1f MiB, NVMe read %.1f MiB, NVMe write %.1f MiB\n",
           sm.applied, mib(sm.moved[0]), mib(sm.moved[1]), mib(sm.moved[2]), mib(sm.moved[3]));
    if (tot->updates) {
        double k = 1e-6 / tot->updates;
        printf("update (mean of the %u seen): %.1f ms: d2h %.1f optim %.1f nvme-r %.1f nvme-w %.1f h2d %.1f stall %.1f\n",
               tot->updates, tot->sum.total_ns * k, tot->sum.d2h_ns * k, (tot->sum.compute_ns + tot->sum.norm_ns) * k,
               tot->sum.nvme_read_ns * k, tot->sum.nvme_write_ns * k, tot->sum.h2d_ns * k, tot->sum.stall_ns * k);
    }
    if (t->jf)
        summary_json(t, &sm);
    return 0;
}

/* --verify: the masters, states and device params against the reference's
 * (and the losses, compared step by step in finish_step()). */
static int verify_result(train_run *t)
{
    if (!t->opt.verify)
        return 0;
    if (t->part) {
        /* every rank checks its shard; all pass or the run fails */
        double failed = reference_finish(&t->ref) < 0 || reference_compare_dp(&t->ref, t->o, &t->dm, t->dp.rank) < 0 ||
                        t->verify_failed;
        if (dp_reduce(t, &failed, 1, ZO_COMM_MAX) < 0 || failed > 0) {
            fprintf(stderr, "zo-train: verify: FAILED\n");
            t->failed_together = failed > 0;
            return 1;
        }
        printf("verify: every rank's shard of masters and states, and the device params, equal the single-rank "
                   "in-memory run of the global batch bit for bit (%u ranks, %u steps)\n", t->dp.world,
                   t->tot.steps);
        return 0;
    }
    if (reference_finish(&t->ref) < 0 || reference_compare(&t->ref, t->o, &t->dm) < 0 || t->verify_failed) {
        fprintf(stderr, "zo-train: verify: FAILED\n");
        return 1;
    }
    printf("verify: masters, states and device params equal the in-memory run bit for bit (%u steps)\n",
           t->tot.steps);
    return 0;
}

/* Many ranks, before the first collective (start_state): whether every
 * rank got here. A rank that failed in setup (a refusal, a directory...)
 * says so here instead of leaving the others waiting in a collective;
 * all then leave with the worst exit status, none forced out. */
static int agree_setup(train_run *t, int rc)
{
    double worst = rc;
    if (dp_reduce(t, &worst, 1, ZO_COMM_MAX) < 0) {
        fprintf(stderr, "zo-train: rank %u: the ranks cannot agree on the setup (MPI)\n", t->dp.rank);
        return 1;
    }
    t->failed_together = worst > 0;
    return (int)worst;
}

/* Release everything, on every path; the exit status rc, or 1 when the
 * --json file does not close cleanly (its last lines may be lost). */
static int run_cleanup(train_run *t, int rc)
{
    if (t->jf && fclose(t->jf) != 0) {
        fprintf(stderr, "zo-train: %s: %s\n", t->opt.json, strerror(errno));
        rc = 1;
    }
    reference_free(&t->ref);
    train_teacher_free(&t->teacher);
    free(t->x);
    free(t->y);
    if (t->part) {
        zo_part_destroy(&t->part); /* with its inner engine */
        t->o = NULL;
    }
    zo_optim_destroy(&t->o);
    zo_optim_json_free(&t->cj);
    device_model_free(&t->dm);
    zo_store_destroy(&t->tile_store); /* after the model: its tiled layers unregister their tiles */
    zo_swap_destroy(&t->tile_swap);
    zo_dev_close(&t->dev);
    zo_tool_rundir_remove(&g_run);
    if (rc && train_dp_timed_out(&t->dp))
        fprintf(stderr, "zo-train: rank %u: no answer from the other ranks within %g s (--comm-timeout): a rank "
                "died, hangs or was stopped\n", t->dp.rank, t->opt.comm_timeout);
    if (rc && t->dp.world > 1 && !t->failed_together)
        /* the other ranks may be waiting in a collective for this one */
        train_dp_abort(&t->dp, rc);
    train_dp_finish(&t->dp);
    return rc;
}

int main(int argc, char **argv)
{
    /* In order; the first that does not return 0 ends the run with its exit status. */
    static int (*const phases[])(train_run *) = {
        check_request,   /* refusals before anything is allocated */
        install_signals, /* from here on a signal stops the run at a step boundary */
        open_device,
        load_config,     /* the engine config: defaults and --config... */
        apply_flags,     /* ...then the flags */
        place_state,     /* NVMe placement: the private run directory */
        build_model,
        create_engine,
        start_state,     /* --resume, or the initial masters */
        prepare_run,     /* --save and --json checked before the first step; --verify's reference */
        print_setup,
        train_loop,
        finish_training, /* the update in flight (DPU) */
        save_checkpoint,
        report,
        verify_result,
    };
    static train_run run; /* static: zeroed, and large */
    int rc = train_options_parse(argc, argv, &run.opt);
    if (rc)
        return rc < 0 ? 0 : rc; /* -1: --help */
    /* under mpirun: one rank of the data-parallel run (train_dp.h) */
    char why[512];
    if ((rc = train_dp_init(&run.dp, &argc, &argv, run.opt.comm_timeout, why, sizeof(why))) < 0) {
        fprintf(stderr, "zo-train: %s\n", why);
        return rc == ZO_ENOTSUP ? 2 : 1;
    }
    if (run.dp.rank > 0 && !freopen("/dev/null", "w", stdout)) {
        /* rank 0 speaks for the run; the others' stderr stays */
        fprintf(stderr, "zo-train: rank %u: /dev/null: %s\n", run.dp.rank, strerror(errno));
        train_dp_abort(&run.dp, 1);
        return 1;
    }
    size_t nphases = sizeof(phases) / sizeof(phases[0]);
    for (size_t i = 0; i < nphases && (rc == 0 || (run.dp.world > 1 && phases[i - 1] != start_state)); i++) {
        if (run.dp.world > 1 && phases[i] == start_state && (rc = agree_setup(&run, rc)) != 0)
            break;
        if (rc == 0)
            rc = phases[i](&run);
    }
    return run_cleanup(&run, rc);
}
