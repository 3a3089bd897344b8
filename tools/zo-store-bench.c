/* SPDX-License-Identifier: Apache-2.0 */
/* zo-store-bench: measurements of the tiered store and its checksums.
 *
 *   replay (default)  a training-like access sequence (acquire each tensor
 *                     on the device in order, compute, release; repeat)
 *                     over tensors on NVMe that do not all fit the device
 *                     tier; pairs alternate the store without prefetch and
 *                     with trace-driven prefetch, and report the demand
 *                     stall time of each and the median ratio.
 *   --checksums       CRC32C (every variant this CPU runs: scalar, sse42, vpclmul256, vpclmul512;
 *                     armv8, pmull on aarch64) and XXH3 speed
 *                     on the same buffer, alternating, medians.
 *   --optim           an offload optimizer's step: one group sweep
 *                     (READ|WRITE) over N bytes of NVMe-homed state
 *                     (fp32 master + m + v, states fp32 or bf16) with an
 *                     in-place update per element; read and write GB/s,
 *                     and with --vs-fio fio (io_uring, direct, fixedbufs,
 *                     registerfiles) mixed read/write of the same bytes on
 *                     the same path, alternating pairs, medians; with
 *                     --vs-raw also the sweep's own I/O pattern done with
 *                     liburing alone (raw_sweep.h), to tell a gap that
 *                     the pattern makes on this disk from one the store
 *                     makes.
 *
 * Exit status: 0 success; 1 a run failed; 2 bad usage or input. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "raw_sweep.h"
#include "tool_common.h"

#define EXIT_RUN 1
#define EXIT_USAGE 2

typedef struct opts {
    const char *path;
    unsigned tensors, device_tensors, iters, pairs, lookahead;
    uint64_t tensor_size;
    double compute_ms; /* < 0: auto */
    zo_dev_kind dev;
    int checksums, json;
    uint64_t csum_size;
    /* --optim */
    int optim, vs_fio, vs_raw;
    int order_abba;        /* --order abba: zoffload first in every other round */
    uint64_t state_bytes, group_elems, slot_size;
    zo_dtype state_dtype;
    unsigned depth, slots, max_slots;
    int disk_stats;
    zo_csum_kind csum;
    unsigned csum_threads; /* UINT_MAX: the swap store's default */
    unsigned queue_depth;  /* the swap's engine; 0: every pool slot in flight */
    int io_only;           /* sweep without the update: the store's I/O alone */
    const char *fio, *fio_iomem;
} opts;

/* usage errors: "zo-store-bench: message" on stderr, exit status 2 (tool_common.c) */
#define bad(...) zo_tool_bad("zo-store-bench", __VA_ARGS__)

static void usage(FILE *f)
{
    fprintf(f, "usage: zo-store-bench [options]\n"
               "replay (default): no prefetch vs trace-driven prefetch, alternating pairs\n"
               "  --path DIR            swap directory (default /var/tmp)\n"
               "  --tensors N           tensors on NVMe (default 16)\n"
               "  --tensor-size SIZE    bytes each (default 4M)\n"
               "  --device-tensors K    device tier budget in tensors, < N (default 6)\n"
               "  --device host|cuda    device backend (default host: host memory stands in)\n"
               "  --compute-ms MS|auto  compute time after each acquire (default auto: 4x the demand\n"
               "                        load time of one tensor, measured first)\n"
               "  --lookahead N         trace entries fetched ahead (default 4)\n"
               "  --iters N             iterations measured per run, after one warm-up (default 4)\n"
               "  --pairs N             alternating pairs (default 5)\n"
               "optimizer sweep:\n"
               "  --optim               one group sweep per run over --state bytes of NVMe-homed\n"
               "                        (master fp32, m, v), updated in place; read/write GB/s\n"
               "  --state SIZE          bytes of master + m + v (default 4G)\n"
               "  --state-dtype f32|bf16  m and v (default f32)\n"
               "  --group-elems N       elements per sub-group (default 8388608)\n"
               "  --depth N             pieces read ahead, fp32-wide (default 2; bf16 states read more ahead)\n"
               "  --slot-size SIZE      pool slot (default: the store's, 4M)\n"
               "  --slots N             pool slots (default: the store's, 16)\n"
               "  --max-slots N         most slots the sweep may reserve (default: as the layout needs;\n"
               "                        8 with bf16 states keeps depth 2 pieces: the layout before depth by bytes)\n"
               "  --checksum crc32c|xxh3|none  the swap store's chunk checksum (default crc32c)\n"
               "  --csum-threads N      the swap store's checksum threads (default: its default, 1; 0: inline)\n"
               "  --queue-depth N       chunks in flight in the swap store's aio engine (default: the\n"
               "                        engine's, 32)\n"
               "  --io-only             read and write every piece without updating it: the store's I/O\n"
               "                        pipeline alone (the check then expects the initial values)\n"
               "  --disk-stats          after each run, what the block device of --path saw (requests, average\n"
               "                        request size, average queue depth, busy time) from its sysfs stat file\n"
               "  --vs-fio              alternate with fio (io_uring, direct, fixedbufs, registerfiles;\n"
               "                        mixed read/write of the same bytes on the same path)\n"
               "  --vs-raw              also alternate with the sweep's own I/O done by a hand-written\n"
               "                        liburing loop (same pieces, frames and update, no store; direct,\n"
               "                        registered buffers and file), to tell the pattern's cost from the store's\n"
               "  --order ab|abba       ab (default): each round runs the references, then zoffload;\n"
               "                        abba: every other round runs zoffload first\n"
               "  --fio PATH            the fio binary (default: fio in PATH)\n"
               "  --fio-iomem MODE      fio's buffer memory (--iomem=MODE), e.g. shmhuge\n"
               "  --pairs N             runs (pairs with --vs-fio or --vs-raw; default 5)\n"
               "checksums:\n"
               "  --checksums           CRC32C variants and XXH3 speed, alternating (median of --pairs)\n"
               "  --checksum-size SIZE  buffer (default 64M)\n"
               "output:\n"
               "  --json                one JSON object on stdout\n");
}

/* ---- the options' sets (zo_tool_opt: tool_common.h) ---------------------------- */
/* an integer in [lo, hi] into an unsigned */
static int set_u(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    unsigned long long v;
    if (zo_tool_parse_u(arg, d->lo, d->hi, &v))
        return bad("--%s %s: must be %llu..%llu", d->name, arg, d->lo, d->hi);
    *(unsigned *)d->dst = (unsigned)v;
    return 0;
}

/* the same into a uint64_t */
static int set_u64(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    unsigned long long v;
    if (zo_tool_parse_u(arg, d->lo, d->hi, &v))
        return bad("--%s %s: must be %llu..%llu", d->name, arg, d->lo, d->hi);
    *(uint64_t *)d->dst = v;
    return 0;
}

/* a size in [lo, hi] (d->what: the range in words) */
static int set_size(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t sz;
    if (zo_parse_size(arg, &sz) || sz < d->lo || sz > d->hi)
        return bad("--%s %s: not a size from %s", d->name, arg, d->what);
    *(uint64_t *)d->dst = sz;
    return 0;
}

static int set_compute_ms(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    double *ms = d->dst;
    if (!strcmp(arg, "auto")) {
        *ms = -1;
    } else {
        char *end;
        *ms = strtod(arg, &end);
        if (*end || !(*ms >= 0 && *ms <= 60000))
            return bad("--compute-ms %s: a number of milliseconds 0..60000, or auto", arg);
    }
    return 0;
}

static int set_order(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (strcmp(arg, "ab") && strcmp(arg, "abba"))
        return bad("--order %s: expected ab or abba", arg);
    *(int *)d->dst = !strcmp(arg, "abba");
    return 0;
}

static int set_checksum(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (zo_csum_parse(arg, d->dst) != 0)
        return bad("--checksum %s: expected crc32c, xxh3 or none", arg);
    return 0;
}

/* The combinations that make no sense, and --path */
static int check_opts(const opts *o)
{
    if (o->vs_fio && !o->optim)
        return bad("--vs-fio compares the --optim sweep with fio: add --optim");
    if ((o->disk_stats || o->max_slots || o->queue_depth || o->io_only || o->vs_raw || o->order_abba) && !o->optim)
        return bad("--disk-stats, --max-slots, --queue-depth, --io-only, --vs-raw and --order are --optim options: add "
                   "--optim");
    if (o->optim && o->checksums)
        return bad("--optim and --checksums: run them separately");
    if (o->device_tensors >= o->tensors)
        return bad("--device-tensors %u must be below --tensors %u (else nothing is ever evicted)",
                   o->device_tensors, o->tensors);
    struct stat st;
    if (!o->checksums && (stat(o->path, &st) != 0 || !S_ISDIR(st.st_mode)))
        return bad("--path %s: not an existing directory", o->path);
    return 0;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof(*o));
    o->path = "/var/tmp";
    o->tensors = 16;
    o->device_tensors = 6;
    o->tensor_size = 4u << 20;
    o->compute_ms = -1;
    o->iters = 4;
    o->pairs = 5;
    o->lookahead = 4;
    o->dev = ZO_DEV_HOST;
    o->csum_size = 64u << 20;
    o->state_bytes = 4ull << 30;
    o->state_dtype = ZO_DTYPE_F32;
    o->group_elems = 8u << 20;
    o->depth = 2;
    o->csum = ZO_CSUM_CRC32C;
    o->csum_threads = UINT_MAX;
    const zo_tool_opt table[] = {
        {"path", 1, 0, zo_tool_opt_str, &o->path, 0, 0, NULL},
        {"tensors", 1, 0, set_u, &o->tensors, 2, 100000, NULL},
        {"tensor-size", 1, 0, set_size, &o->tensor_size, 1, 1ull << 36, "1 byte to 64G"},
        {"device-tensors", 1, 0, set_u, &o->device_tensors, 1, 100000, NULL},
        {"device", 1, 0, zo_tool_opt_dev_kind, &o->dev, 0, 0, NULL},
        {"compute-ms", 1, 0, set_compute_ms, &o->compute_ms, 0, 0, NULL},
        {"lookahead", 1, 0, set_u, &o->lookahead, 1, 4096, NULL},
        {"iters", 1, 0, set_u, &o->iters, 1, 10000, NULL},
        {"pairs", 1, 0, set_u, &o->pairs, 1, 1000, NULL},
        {"checksums", 0, 0, zo_tool_opt_on, &o->checksums, 0, 0, NULL},
        {"checksum-size", 1, 0, set_size, &o->csum_size, 1, 16ull << 30, "1 byte to 16G"},
        {"json", 0, 0, zo_tool_opt_on, &o->json, 0, 0, NULL},
        {"help", 0, 'h', zo_tool_opt_help, NULL, 0, 0, NULL},
        {"optim", 0, 0, zo_tool_opt_on, &o->optim, 0, 0, NULL},
        {"state", 1, 0, set_size, &o->state_bytes, 12, 1ull << 42, "12 bytes to 4T"},
        {"state-dtype", 1, 0, zo_tool_opt_f32_bf16, &o->state_dtype, 0, 0, NULL},
        {"group-elems", 1, 0, set_u64, &o->group_elems, 1, 1ull << 34, NULL},
        {"depth", 1, 0, set_u, &o->depth, 1, 64, NULL},
        {"slot-size", 1, 0, set_size, &o->slot_size, 1, 1u << 30, "1 byte to 1G"},
        {"slots", 1, 0, set_u, &o->slots, 2, 65536, NULL},
        {"vs-fio", 0, 0, zo_tool_opt_on, &o->vs_fio, 0, 0, NULL},
        {"fio", 1, 0, zo_tool_opt_str, &o->fio, 0, 0, NULL},
        {"fio-iomem", 1, 0, zo_tool_opt_str, &o->fio_iomem, 0, 0, NULL},
        {"max-slots", 1, 0, set_u, &o->max_slots, 1, 65536, NULL},
        {"disk-stats", 0, 0, zo_tool_opt_on, &o->disk_stats, 0, 0, NULL},
        {"checksum", 1, 0, set_checksum, &o->csum, 0, 0, NULL},
        {"csum-threads", 1, 0, set_u, &o->csum_threads, 0, 64, NULL},
        {"queue-depth", 1, 0, set_u, &o->queue_depth, 1, 4096, NULL},
        {"io-only", 0, 0, zo_tool_opt_on, &o->io_only, 0, 0, NULL},
        {"vs-raw", 0, 0, zo_tool_opt_on, &o->vs_raw, 0, 0, NULL},
        {"order", 1, 0, set_order, &o->order_abba, 0, 0, NULL},
    };
    const zo_tool_cli cli = {"zo-store-bench", usage, table, sizeof(table) / sizeof(table[0])};
    int rc = zo_tool_opts_parse_strict(&cli, argc, argv);
    return rc ? rc : check_opts(o);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double median(const double *v, unsigned n)
{
    return zo_median(v, n);
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* The machine, then "label path (filesystem on device)" */
static void print_where(const zo_machine *m, const char *label, const char *path)
{
    zo_machine_print(m, stdout);
    char sto[512];
    zo_path_storage(path, sto, sizeof(sto));
    printf("%s %s (%s)\n", label, path, sto);
}

/* ---- replay ----------------------------------------------------------------------- */
typedef struct env {
    zo_dev *dev;
    zo_swap *swap;
    zo_store *st;
    zo_tensor **t;
    char dir[4200];
} env;

static void env_close(env *e)
{
    zo_store_destroy(&e->st);
    zo_swap_destroy(&e->swap);
    zo_dev_close(&e->dev);
    free(e->t);
    /* the run directory stays until the process ends (run_dir_remove) */
}

/* The swap engine's queue depth: --queue-depth, else the engine's default.
 * (Sizing it to every pool slot, 64 here, measured no better: 0.80 and
 * 0.88 against 0.86-0.91 at 32, docs/benchmarks.md.) */
static unsigned optim_queue_depth(const opts *o)
{
    if (o->queue_depth)
        return o->queue_depth;
    zo_aio_config ac;
    zo_aio_config_default(&ac);
    return ac.queue_depth;
}

/* The run's directory: zo-store-bench-XXXXXX (zo_tool_rundir: mkdtemp,
 * 0700, marked as this run's, one a killed run left reclaimed first),
 * made by the first environment and kept until the process ends; each
 * environment's swap store removes its own arenas. */
static zo_tool_rundir run_dir = {.lock = -1};

static void run_dir_remove(void)
{
    zo_tool_cleanup_drop(run_dir.path);
    zo_tool_rundir_remove(&run_dir);
}

/* The swap store of an environment: a zo_swap in the run's private
 * directory under --path (dir: its path, removed when the process ends).
 * 0, EXIT_RUN (said why; dir[0] is 0), or a negative error of
 * zo_swap_create(). */
static int swap_open(const opts *o, const char *path, char *dir, size_t dirlen, zo_swap **out)
{
    if (!run_dir.path[0]) {
        char why[4300];
        if (zo_tool_rundir_make(&run_dir, "zo-store-bench", path, why, sizeof(why)) < 0) {
            fprintf(stderr, "zo-store-bench: %s\n", why);
            dir[0] = 0;
            return EXIT_RUN;
        }
        atexit(run_dir_remove);
        zo_tool_cleanup_add(run_dir.path, 1); /* an interrupt removes it with the arenas and fio's file */
    }
    snprintf(dir, dirlen, "%s", run_dir.path);
    const char *dirs[] = {dir};
    zo_swap_config sc;
    zo_swap_config_default(&sc);
    sc.dirs = dirs;
    sc.ndirs = 1;
    sc.checksum = o->csum;
    if (o->csum_threads != UINT_MAX)
        sc.csum_threads = o->csum_threads;
    zo_aio_config ac;
    zo_aio_config_default(&ac);
    if (o->optim && o->queue_depth) {
        ac.queue_depth = optim_queue_depth(o);
        sc.aio_cfg = &ac;
    }
    return zo_swap_create(out, &sc);
}

static int env_open(const opts *o, env *e, zo_trace_mode trace)
{
    memset(e, 0, sizeof(*e));
    int rc = swap_open(o, o->path, e->dir, sizeof(e->dir), &e->swap);
    if (rc == EXIT_RUN)
        return EXIT_RUN;
    if (rc != 0)
        goto fail;
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.kind = o->dev;
    uint64_t dev_bytes = (uint64_t)o->device_tensors * ((o->tensor_size + 4095) & ~4095ull) + (1u << 20);
    dc.host_mem_limit = dev_bytes + (1u << 20);
    if ((rc = zo_dev_open(&e->dev, &dc)) != 0)
        goto fail;
    zo_store_config cfg;
    zo_store_config_default(&cfg);
    cfg.dev = e->dev;
    cfg.device_bytes = dev_bytes;
    cfg.swap = e->swap;
    cfg.trace = trace;
    cfg.lookahead = o->lookahead;
    if ((rc = zo_store_create(&e->st, &cfg)) != 0)
        goto fail;
    e->t = calloc(o->tensors, sizeof(*e->t));
    uint8_t *buf = malloc(o->tensor_size);
    if (!e->t || !buf) {
        free(buf);
        rc = -ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < o->tensors && rc == 0; i++) {
        char name[32];
        snprintf(name, sizeof(name), "layer%u", i);
        zo_tensor_desc d;
        zo_tensor_desc_default(&d);
        d.name = name;
        d.bytes = o->tensor_size;
        d.dtype = ZO_DTYPE_U8;
        memset(buf, (int)i + 1, o->tensor_size);
        if ((rc = zo_store_register(e->st, &d, &e->t[i])) == 0)
            rc = zo_store_write(e->st, e->t[i], 0, buf, o->tensor_size);
    }
    free(buf);
    if (rc)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "zo-store-bench: setting up the store failed: %s (%s)\n", zo_strerror(rc), zo_last_error_detail());
    env_close(e);
    return EXIT_RUN;
}

/* One iteration; returns 0 or the first error. */
static int iteration(const opts *o, env *e, double compute_s)
{
    for (unsigned i = 0; i < o->tensors; i++) {
        zo_store_req *r;
        void *p;
        int rc = zo_store_acquire(e->st, e->t[i], ZO_TIER_DEVICE, 0, &r);
        if (rc == 0)
            rc = zo_store_wait(e->st, r, &p);
        if (rc == 0 && compute_s > 0)
            sleep_s(compute_s);
        if (rc == 0)
            rc = zo_store_release(e->st, e->t[i], ZO_TIER_DEVICE, 0);
        if (rc) {
            fprintf(stderr, "zo-store-bench: layer%u: %s (%s)\n", i, zo_strerror(rc), zo_last_error_detail());
            return rc;
        }
    }
    return zo_store_step(e->st);
}

typedef struct replay_res {
    double stall_s, wall_s;
    uint64_t demand, prefetched, used, stalls;
    uint64_t issued, wasted, dropped; /* prefetches: started, evicted unused, hints dropped */
} replay_res;

static int replay(const opts *o, zo_trace_mode trace, double compute_s, replay_res *rr)
{
    env e;
    if (env_open(o, &e, trace))
        return EXIT_RUN;
    int rc = iteration(o, &e, compute_s); /* warm-up: records the trace */
    zo_store_reset_stats(e.st);
    double t0 = now_s();
    for (unsigned it = 0; it < o->iters && rc == 0; it++)
        rc = iteration(o, &e, compute_s);
    rr->wall_s = now_s() - t0;
    zo_store_stats st;
    zo_store_get_stats(e.st, &st);
    rr->stall_s = (double)st.stall_ns * 1e-9;
    rr->demand = st.demand_bytes;
    rr->prefetched = st.prefetch_bytes;
    rr->used = st.prefetch_used;
    rr->stalls = st.stalls;
    rr->issued = st.prefetch_issued;
    rr->wasted = st.prefetch_wasted;
    rr->dropped = st.prefetch_dropped;
    env_close(&e);
    return rc ? EXIT_RUN : 0;
}

static int cmd_replay(const opts *o, const zo_machine *m)
{
    double compute_s = o->compute_ms / 1000.0;
    double load_s = 0;
    if (o->compute_ms < 0) { /* calibrate: demand loads, no compute */
        env e;
        if (env_open(o, &e, ZO_TRACE_OFF))
            return EXIT_RUN;
        int rc = iteration(o, &e, 0);
        zo_store_reset_stats(e.st);
        if (rc == 0)
            rc = iteration(o, &e, 0);
        zo_store_stats st;
        zo_store_get_stats(e.st, &st);
        env_close(&e);
        if (rc)
            return EXIT_RUN;
        load_s = (double)st.stall_ns * 1e-9 / (st.stalls ? (double)st.stalls : 1.0);
        compute_s = 4 * load_s;
    }
    unsigned P = o->pairs;
    double *off = calloc(P, sizeof(double)), *on = calloc(P, sizeof(double)), *ratio = calloc(P, sizeof(double));
    double *woff = calloc(P, sizeof(double)), *won = calloc(P, sizeof(double));
    replay_res last_on = {0}, last_off = {0};
    int rc = 0;
    if (!o->json) {
        printf("zo-store-bench %s: replay, no prefetch vs trace-driven prefetch\n", zo_version_string());
        print_where(m, "swap:   ", o->path);
        printf("tensors: %u x %.2f MiB on NVMe, device tier (%s) holds %u; lookahead %u; compute %.2f ms per "
               "access%s\n",
               o->tensors, (double)o->tensor_size / (1 << 20), zo_dev_kind_name(o->dev), o->device_tensors,
               o->lookahead, compute_s * 1e3, o->compute_ms < 0 ? " (4x the demand load time)" : "");
        printf("pairs:   %u x (%u iterations without prefetch, %u with), after one warm-up iteration each\n\n", P,
               o->iters, o->iters);
        printf("%5s %16s %16s %9s\n", "pair", "stall off (ms)", "stall on (ms)", "on/off");
    }
    for (unsigned p = 0; p < P && rc == 0; p++) {
        if ((rc = replay(o, ZO_TRACE_OFF, compute_s, &last_off)) || (rc = replay(o, ZO_TRACE_AUTO, compute_s, &last_on)))
            break;
        off[p] = last_off.stall_s;
        on[p] = last_on.stall_s;
        woff[p] = last_off.wall_s;
        won[p] = last_on.wall_s;
        ratio[p] = off[p] > 0 ? on[p] / off[p] : 0;
        if (!o->json)
            printf("%5u %16.2f %16.2f %9.4f\n", p + 1, off[p] * 1e3, on[p] * 1e3, ratio[p]);
    }
    if (rc == 0) {
        double moff = median(off, P), mon = median(on, P), mr = median(ratio, P);
        double ideal = (double)o->iters * o->tensors * compute_s;
        if (o->json) {
            zo_json j;
            zj_init(&j, stdout, 1);
            zj_obj_begin(&j, NULL);
            zj_str(&j, "tool", "zo-store-bench");
            zj_str(&j, "mode", "replay");
            zj_str(&j, "version", zo_version_string());
            zo_machine_json(m, &j, "machine");
            zj_obj_begin(&j, "config");
            zj_str(&j, "path", o->path);
            zj_uint(&j, "tensors", o->tensors);
            zj_uint(&j, "tensor_size", o->tensor_size);
            zj_uint(&j, "device_tensors", o->device_tensors);
            zj_str(&j, "device", zo_dev_kind_name(o->dev));
            zj_uint(&j, "lookahead", o->lookahead);
            zj_uint(&j, "iters", o->iters);
            zj_num(&j, "compute_ms", compute_s * 1e3);
            zj_num(&j, "demand_load_ms", load_s * 1e3);
            zj_obj_end(&j);
            zj_uint(&j, "pairs", P);
            zj_arr_begin(&j, "stall_off_s");
            for (unsigned p = 0; p < P; p++)
                zj_num(&j, NULL, off[p]);
            zj_arr_end(&j);
            zj_arr_begin(&j, "stall_on_s");
            for (unsigned p = 0; p < P; p++)
                zj_num(&j, NULL, on[p]);
            zj_arr_end(&j);
            zj_arr_begin(&j, "ratios");
            for (unsigned p = 0; p < P; p++)
                zj_num(&j, NULL, ratio[p]);
            zj_arr_end(&j);
            zj_num(&j, "stall_off_median_s", moff);
            zj_num(&j, "stall_on_median_s", mon);
            zj_num(&j, "median_ratio", mr);
            zj_num(&j, "wall_off_median_s", median(woff, P));
            zj_num(&j, "wall_on_median_s", median(won, P));
            zj_num(&j, "compute_only_s", ideal);
            zj_uint(&j, "last_on_prefetch_used", last_on.used);
            zj_uint(&j, "last_on_prefetch_issued", last_on.issued);
            zj_uint(&j, "last_on_prefetch_wasted", last_on.wasted);
            zj_uint(&j, "last_on_prefetch_dropped", last_on.dropped);
            zj_uint(&j, "last_on_demand_bytes", last_on.demand);
            zj_uint(&j, "last_on_stalls", last_on.stalls);
            zj_obj_end(&j);
            zj_end(&j);
        } else {
            printf("\nmedians: stall without prefetch %.2f ms, with %.2f ms; ratio %.4f (%.2f%%)\n", moff * 1e3,
                   mon * 1e3, mr, mr * 100);
            printf("wall:    %.3f s without, %.3f s with, %.3f s of compute alone\n", median(woff, P),
                   median(won, P), ideal);
            printf("last run with prefetch: %llu loads used ahead of need, %.1f MiB loaded on demand, %llu of %u "
                   "acquires waited\n",
                   (unsigned long long)last_on.used, (double)last_on.demand / (1 << 20),
                   (unsigned long long)last_on.stalls, o->iters * o->tensors);
            printf("prefetches: %llu issued, %llu used, %llu evicted unused (wasted), %llu hints dropped\n",
                   (unsigned long long)last_on.issued, (unsigned long long)last_on.used,
                   (unsigned long long)last_on.wasted, (unsigned long long)last_on.dropped);
        }
    }
    free(off);
    free(on);
    free(ratio);
    free(woff);
    free(won);
    return rc;
}

/* ---- checksums ------------------------------------------------------------------------ */
static int cmd_checksums(const opts *o, const zo_machine *m)
{
    size_t n = (size_t)o->csum_size;
    uint8_t *buf = malloc(n);
    if (!buf)
        return fprintf(stderr, "zo-store-bench: cannot allocate %zu bytes\n", n), EXIT_RUN;
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(i * 131 + (i >> 9));
    /* variants: each CRC32C kernel the CPU can run, picked by lowering
     * the mask (none; without VPCLMULQDQ; without AVX-512F; without PMULL
     * on aarch64; all), named as dispatch names it, each once */
    struct {
        char name[32];
        zo_csum_kind kind;
        unsigned mask;
    } v[7];
    int nv = 0;
    unsigned saved = zo_cpu_get_mask();
    const unsigned crc_masks[] = {0, saved & ~ZO_CPU_VPCLMULQDQ, saved & ~ZO_CPU_AVX512F, saved & ~ZO_CPU_PMULL,
                                  saved};
    for (size_t i = 0; i < sizeof(crc_masks) / sizeof(crc_masks[0]); i++) {
        zo_cpu_set_mask(crc_masks[i]);
        char name[32];
        snprintf(name, sizeof(name), "crc32c %s", zo_crc32c_variant());
        int seen = 0;
        for (int k = 0; k < nv; k++)
            seen |= !strcmp(v[k].name, name);
        if (seen)
            continue;
        memcpy(v[nv].name, name, sizeof(name));
        v[nv].kind = ZO_CSUM_CRC32C;
        v[nv++].mask = crc_masks[i];
    }
    zo_cpu_set_mask(saved);
    if (zo_csum_available(ZO_CSUM_XXH3)) {
        snprintf(v[nv].name, sizeof(v[nv].name), "xxh3");
        v[nv].kind = ZO_CSUM_XXH3;
        v[nv++].mask = saved;
    }
    unsigned P = o->pairs;
    double gbps[6][1000];
    for (unsigned p = 0; p < P; p++)
        for (int k = 0; k < nv; k++) {
            zo_cpu_set_mask(v[k].mask);
            uint64_t sum = 0, r;
            double t0 = now_s();
            unsigned reps = 0;
            do {
                zo_checksum(v[k].kind, buf, n, &r);
                sum ^= r;
                reps++;
            } while (now_s() - t0 < 0.2);
            gbps[k][p] = (double)n * reps / (now_s() - t0) * 1e-9;
            (void)sum;
        }
    zo_cpu_set_mask(saved);
    if (o->json) {
        zo_json j;
        zj_init(&j, stdout, 1);
        zj_obj_begin(&j, NULL);
        zj_str(&j, "tool", "zo-store-bench");
        zj_str(&j, "mode", "checksums");
        zo_machine_json(m, &j, "machine");
        zj_uint(&j, "buffer_bytes", n);
        zj_uint(&j, "pairs", P);
        zj_arr_begin(&j, "results");
        for (int k = 0; k < nv; k++) {
            zj_obj_begin(&j, NULL);
            zj_str(&j, "name", v[k].name);
            zj_num(&j, "GB_per_s_median", median(gbps[k], P));
            zj_num(&j, "vs_crc32c_scalar", median(gbps[k], P) / median(gbps[0], P));
            zj_obj_end(&j);
        }
        zj_arr_end(&j);
        zj_obj_end(&j);
        zj_end(&j);
    } else {
        printf("zo-store-bench %s: checksum speed, one thread, %.0f MiB buffer, medians of %u rounds\n",
               zo_version_string(), (double)n / (1 << 20), P);
        zo_machine_print(m, stdout);
        printf("%-16s %10s %10s\n", "checksum", "GB/s", "x scalar");
        for (int k = 0; k < nv; k++)
            printf("%-16s %10.2f %10.2f\n", v[k].name, median(gbps[k], P), median(gbps[k], P) / median(gbps[0], P));
    }
    free(buf);
    return 0;
}

/* ---- optimizer sweep ------------------------------------------------------------------ */
typedef struct optim_env {
    zo_swap *swap;
    zo_store *st;
    zo_tensor **t;       /* ngroups x (master, m, v) */
    size_t ngroups;
    size_t chunk;        /* the swap chunk size */
    uint64_t nelem;      /* elements of state */
    zo_raw_sweep *raw;   /* --vs-raw: the same I/O without the store */
    char dir[4200];
    char fio_file[4300];
    char raw_file[4300];
} optim_env;

/* The update of every element: an Adam-shaped recurrence, cheap enough not
 * to hide the I/O, exact to repeat for the check at the end. */
static inline void upd(float *p, float *m, float *v)
{
    *m = 0.9f * *m + 0.1f;
    *v = 0.999f * *v + 0.001f;
    *p += 1e-3f * *m;
}

/* Vectorised (gcc: O3 for this function only; clang vectorises at -O2):
 * a scalar loop of 4-5 ns per element kept pace with the disk on a 2-core
 * machine and made the sweep CPU-bound, measuring the loop, not the I/O. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void optim_update(const opts *o, void *const *ptr, uint64_t n)
{
    float *restrict p = ptr[0];
    if (o->state_dtype == ZO_DTYPE_F32) {
        float *restrict m = ptr[1], *restrict v = ptr[2];
        for (uint64_t i = 0; i < n; i++)
            upd(&p[i], &m[i], &v[i]);
    } else {
        /* the states widened and narrowed a piece at a time by the
         * library's own conversions (SIMD, the one rounding: zo_vec_cast),
         * the update vectorised between them */
        uint16_t *m = ptr[1], *v = ptr[2];
        enum { PIECE = 2048 };
        float mf[PIECE], vf[PIECE];
        for (uint64_t i = 0; i < n; i += PIECE) {
            size_t k = (size_t)(n - i < PIECE ? n - i : PIECE);
            zo_vec_cast(mf, ZO_DTYPE_F32, m + i, ZO_DTYPE_BF16, k);
            zo_vec_cast(vf, ZO_DTYPE_F32, v + i, ZO_DTYPE_BF16, k);
            for (size_t j = 0; j < k; j++)
                upd(&p[i + j], &mf[j], &vf[j]);
            zo_vec_cast(m + i, ZO_DTYPE_BF16, mf, ZO_DTYPE_F32, k);
            zo_vec_cast(v + i, ZO_DTYPE_BF16, vf, ZO_DTYPE_F32, k);
        }
    }
}

/* The values every element holds after `steps` updates (the same rounding) */
static void optim_expect(const opts *o, unsigned steps, float *p, float *m, float *v)
{
    *p = 1.0f;
    *m = *v = 0.0f;
    for (unsigned k = 0; k < steps; k++) {
        upd(p, m, v);
        if (o->state_dtype == ZO_DTYPE_BF16) {
            *m = zo_bf16_to_f32(zo_f32_to_bf16(*m));
            *v = zo_bf16_to_f32(zo_f32_to_bf16(*v));
        }
    }
}

static void optim_close(optim_env *e)
{
    zo_raw_sweep_close(e->raw); /* removes its file */
    e->raw = NULL;
    zo_store_destroy(&e->st);
    zo_swap_destroy(&e->swap);
    free(e->t);
    if (e->fio_file[0])
        unlink(e->fio_file);
    /* the run directory stays until the process ends (run_dir_remove) */
}

static int optim_sweep(const opts *o, optim_env *e, unsigned mode, int init, double *secs, zo_store_sweep_info *info)
{
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    d.ntensors = 3;
    d.ngroups = e->ngroups;
    d.tensors = e->t;
    d.depth = o->depth;
    d.max_slots = o->max_slots;
    d.mode[0] = d.mode[1] = d.mode[2] = mode;
    zo_store_sweep *sw;
    double t0 = now_s();
    int rc = zo_store_sweep_open(e->st, &d, &sw);
    if (rc)
        return rc;
    if (info)
        zo_store_sweep_get_info(sw, info);
    zo_store_sweep_piece pc;
    size_t esz = zo_dtype_size(o->state_dtype);
    while ((rc = zo_store_sweep_next(sw, &pc)) == 0 && pc.nelem) {
        if (init) {
            float *p = pc.ptr[0];
            for (uint64_t i = 0; i < pc.nelem; i++)
                p[i] = 1.0f;
            memset(pc.ptr[1], 0, pc.nelem * esz); /* 0.0 in f32 and bf16 */
            memset(pc.ptr[2], 0, pc.nelem * esz);
        } else if (!o->io_only) {
            optim_update(o, pc.ptr, pc.nelem);
        }
        if ((rc = zo_store_sweep_done(sw, &pc)) != 0)
            break;
    }
    int rc2 = zo_store_sweep_close(&sw);
    *secs = now_s() - t0;
    return rc ? rc : rc2;
}

static int optim_open(const opts *o, optim_env *e)
{
    memset(e, 0, sizeof(*e));
    int rc = swap_open(o, o->path, e->dir, sizeof(e->dir), &e->swap);
    if (rc == EXIT_RUN)
        return EXIT_RUN;
    size_t esz = zo_dtype_size(o->state_dtype);
    uint64_t total = o->state_bytes / (4 + 2 * esz);
    if (total == 0)
        total = 1;
    e->nelem = total;
    e->ngroups = (size_t)((total + o->group_elems - 1) / o->group_elems);
    if (rc != 0)
        goto fail;
    zo_swap_info si;
    zo_swap_get_info(e->swap, &si);
    e->chunk = si.chunk_size;
    zo_store_config cfg;
    zo_store_config_default(&cfg);
    cfg.swap = e->swap;
    cfg.trace = ZO_TRACE_OFF;
    if (o->slot_size)
        cfg.slot_size = (size_t)o->slot_size;
    if (o->slots)
        cfg.slots = o->slots;
    if ((rc = zo_store_create(&e->st, &cfg)) != 0)
        goto fail;
    if (!(e->t = calloc(e->ngroups * 3, sizeof(*e->t)))) {
        rc = -ENOMEM;
        goto fail;
    }
    static const char *const sname[3] = {"master", "exp_avg", "exp_avg_sq"};
    for (size_t g = 0; g < e->ngroups && rc == 0; g++) {
        uint64_t left = total - g * o->group_elems, n = left < o->group_elems ? left : o->group_elems;
        for (int k = 0; k < 3 && rc == 0; k++) {
            char name[64];
            snprintf(name, sizeof(name), "group%zu.%s", g, sname[k]);
            zo_tensor_desc d;
            zo_tensor_desc_default(&d);
            d.name = name;
            d.dtype = k ? o->state_dtype : ZO_DTYPE_F32;
            d.ndim = 1;
            d.shape[0] = n;
            d.home = ZO_TIER_NVME;
            rc = zo_store_register(e->st, &d, &e->t[g * 3 + k]);
        }
    }
    double secs;
    if (rc == 0) /* untimed: every byte written once, so reads meet real data */
        rc = optim_sweep(o, e, ZO_STREAM_WRITE, 1, &secs, NULL);
    if (rc)
        goto fail;
    snprintf(e->fio_file, sizeof(e->fio_file), "%s/fio.dat", e->dir);
    snprintf(e->raw_file, sizeof(e->raw_file), "%s/raw.dat", e->dir);
    return 0;
fail:
    fprintf(stderr, "zo-store-bench: setting up the optimizer state failed: %s (%s)\n", zo_strerror(rc),
            zo_last_error_detail());
    optim_close(e);
    return EXIT_RUN;
}

/* One element's bytes of tensor k (0 master, 1 m, 2 v) of group g, from the store or the raw file */
typedef int (*elem_reader)(optim_env *e, size_t g, int k, uint64_t off, void *out, size_t len);

static int read_store(optim_env *e, size_t g, int k, uint64_t off, void *out, size_t len)
{
    return zo_store_read(e->st, e->t[g * 3 + k], off, out, len);
}

static int read_raw(optim_env *e, size_t g, int k, uint64_t off, void *out, size_t len)
{
    return zo_raw_sweep_read(e->raw, g, k, off, out, len);
}

/* The raw loop's update: the same as the store sweep's */
static void raw_update(void *ctx, void *const ptr[3], uint64_t n)
{
    optim_update(ctx, ptr, n);
}

/* Every group's first, middle and last element hold what `steps` updates give */
static int optim_check(const opts *o, optim_env *e, unsigned steps, elem_reader rd, const char *who)
{
    float want[3];
    optim_expect(o, steps, &want[0], &want[1], &want[2]);
    size_t esz = zo_dtype_size(o->state_dtype);
    for (size_t g = 0; g < e->ngroups; g++) {
        uint64_t left = e->nelem - g * o->group_elems, n = left < o->group_elems ? left : o->group_elems;
        uint64_t at[3] = {0, n / 2, n - 1};
        for (int a = 0; a < 3; a++)
            for (int k = 0; k < 3; k++) {
                size_t sz = k ? esz : 4;
                uint8_t b[4] = {0};
                int rc = rd(e, g, k, at[a] * sz, b, sz);
                float got;
                if (sz == 4) {
                    memcpy(&got, b, 4);
                } else {
                    uint16_t h;
                    memcpy(&h, b, 2);
                    got = zo_bf16_to_f32(h);
                }
                if (rc || memcmp(&got, &want[k], 4) != 0) {
                    fprintf(stderr, "zo-store-bench: %s: group %zu tensor %d element %llu: %s, %.9g (want %.9g "
                                    "after %u updates)\n",
                            who, g, k, (unsigned long long)at[a], rc ? zo_strerror(rc) : "read", (double)got,
                            (double)want[k], steps);
                    return EXIT_RUN;
                }
            }
    }
    return 0;
}

/* What the block device under --path saw during a run: its sysfs stat
 * file (Documentation/block/stat.rst) read before and after. */
typedef struct disk_snap {
    unsigned long long v[11];
    double t;
} disk_snap;

static int disk_stat_path(const char *path, char *out, size_t len)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    snprintf(out, len, "/sys/dev/block/%u:%u/stat", major(st.st_dev), minor(st.st_dev));
    return access(out, R_OK) == 0 ? 0 : -errno;
}

static void disk_snap_take(const char *file, disk_snap *d)
{
    memset(d, 0, sizeof(*d));
    d->t = now_s();
    FILE *f = fopen(file, "re");
    if (!f)
        return;
    for (int i = 0; i < 11; i++)
        if (fscanf(f, "%llu", &d->v[i]) != 1)
            break;
    fclose(f);
}

/* reads, writes (+ merged), average request KiB, average queue depth
 * (time_in_queue / io_ticks) and busy share (io_ticks / elapsed) */
static void disk_print(const char *who, const disk_snap *a, const disk_snap *b)
{
    unsigned long long d[11];
    for (int i = 0; i < 11; i++)
        d[i] = b->v[i] - a->v[i];
    double el = b->t - a->t;
    printf("      disk %-3s reads %llu (+%llu merged) avg %.0f KiB, writes %llu (+%llu merged) avg %.0f KiB, "
           "avg queue %.1f, busy %.0f%%\n",
           who, d[0], d[1], d[0] ? (double)d[2] * 512 / 1024 / (double)d[0] : 0.0, d[4], d[5],
           d[4] ? (double)d[6] * 512 / 1024 / (double)d[4] : 0.0, d[9] ? (double)d[10] / (double)d[9] : 0.0,
           el > 0 ? (double)d[9] / 10.0 / el : 0.0);
}

/* ---- --optim: the phases of cmd_optim ------------------------------------------------ */
/* Per run: zoffload, fio read, fio write, raw, ratios to fio and to raw, stall. A sweep reads
 * and writes every byte once in the same time, so zoffload's and raw's one rate is both. */
enum { SER_ZO, SER_FR, SER_FW, SER_RAW, SER_RATIO, SER_RRATIO, SER_STALL, NSER };

typedef struct optim_run {
    const opts *o;
    optim_env e;
    zo_store_sweep_info info; /* the layout the sweeps pick */
    zo_fio_job fj;
    double *ser[NSER];
    uint64_t bytes;           /* read once and written once per sweep */
    size_t esz;               /* a state element's size */
    unsigned steps, raw_steps; /* updates the store's state and the raw loop's file have had */
    char why[512];
    char dstat[128];          /* --disk-stats: the block device's sysfs stat file ("": none) */
} optim_run;

/* One warm-up step, untimed: it also gives the layout the sweeps pick */
static int optim_warm_up(optim_run *r)
{
    double s0;
    int rc = optim_sweep(r->o, &r->e, ZO_STREAM_READ | ZO_STREAM_WRITE, 0, &s0, &r->info);
    if (rc != 0) {
        fprintf(stderr, "zo-store-bench: sweep failed: %s (%s)\n", zo_strerror(rc), zo_last_error_detail());
        return EXIT_RUN;
    }
    r->steps = r->o->io_only ? 0 : 1;
    return 0;
}

/* --vs-raw: the same pieces, as many frames as the sweep has slots for, the same update */
static int optim_raw_open(optim_run *r)
{
    const opts *o = r->o;
    zo_raw_sweep_desc rd = {
        .file = r->e.raw_file,
        .nelem = r->e.nelem,
        .group_elems = o->group_elems,
        .piece_elems = r->info.piece_elems,
        .state_esz = r->esz,
        .request = r->e.chunk,
        .frames = r->info.frames ? r->info.frames : 1,
        .update = o->io_only ? NULL : raw_update,
        .ctx = (void *)o,
    };
    if (zo_raw_sweep_open(&r->e.raw, &rd, r->why, sizeof(r->why)) != 0) {
        fprintf(stderr, "zo-store-bench: --vs-raw: %s\n", r->why);
        return EXIT_RUN;
    }
    return 0;
}

/* fio's requests as the sweep's: chunk-sized, as many in flight as its
 * frames ahead and the one writing hold chunks; with --vs-fio its file laid out */
static int optim_fio_setup(optim_run *r)
{
    const opts *o = r->o;
    const optim_env *e = &r->e;
    uint64_t qd = (r->info.depth + 1) * r->info.piece_elems * (4 + 2 * r->esz) / e->chunk;
    r->fj = (zo_fio_job){
        .fio = o->fio,
        .filename = e->fio_file,
        .size = (2 * r->bytes + e->chunk - 1) / e->chunk * e->chunk,
        .bs = e->chunk,
        .iodepth = (unsigned)(qd < 1 ? 1 : qd > 256 ? 256 : qd),
        .numjobs = 1,
        .rw = "rw",
        .rwmixread = 50,
        .direct = 1,
        .fixedbufs = 1,
        .iomem = o->fio_iomem,
    };
    /* fio's huge-page buffers come from the pool the store's slots (and the
     * raw loop's buffers) drew from first: say so before fio fails with
     * its own "no huge pages available" */
    if (o->vs_fio && o->fio_iomem && (!strncmp(o->fio_iomem, "shmhuge", 7) || !strncmp(o->fio_iomem, "mmaphuge", 8)) &&
        !zo_fio_hugepages_fit(r->fj.bs, r->fj.iodepth, 1, r->why, sizeof(r->why))) {
        fprintf(stderr, "zo-store-bench: --fio-iomem %s: %s, after the store's slots%s took theirs; raise "
                        "/proc/sys/vm/nr_hugepages or leave out --fio-iomem\n",
                o->fio_iomem, r->why, o->vs_raw ? " and the raw loop's buffers" : "");
        return EXIT_RUN;
    }
    if (o->vs_fio && zo_fio_file_prepare(e->fio_file, r->fj.size, r->why, sizeof(r->why)) != 0) {
        fprintf(stderr, "zo-store-bench: fio's file: %s\n", r->why);
        return EXIT_RUN;
    }
    return 0;
}

/* The text output's head: what runs, and the table's column titles */
static void optim_print_head(const optim_run *r, const zo_machine *m)
{
    const opts *o = r->o;
    const zo_store_sweep_info *info = &r->info;
    printf("zo-store-bench %s: optimizer sweep%s%s\n", zo_version_string(), o->vs_fio ? " vs fio" : "",
           o->vs_raw ? " vs raw io_uring" : "");
    print_where(m, "path:   ", o->path);
    printf("state:   %.1f MiB: %zu groups of up to %llu elements, master f32, m and v %s; depth %u, pieces of "
           "%llu elements, %u slots reserved\n",
           (double)r->bytes / (1 << 20), r->e.ngroups, (unsigned long long)o->group_elems,
           zo_dtype_name(o->state_dtype), info->depth, (unsigned long long)info->piece_elems, info->slots);
    zo_swap_info si;
    zo_swap_get_info(r->e.swap, &si);
    printf("swap:    chunks of %zu bytes, checksum %s%s, engine queue depth %u%s\n", si.chunk_size,
           zo_csum_name(o->csum), o->csum_threads == 0 ? " (inline)" : "", optim_queue_depth(o),
           o->io_only ? "; --io-only: no update" : "");
    char cmd[20000]; /* the line zo_fio_run runs, from the same builder */
    if (o->vs_fio && zo_fio_cmdline(&r->fj, cmd, sizeof(cmd)) == 0)
        printf("fio:     %s\n", cmd);
    if (o->vs_raw)
        printf("raw:     one thread, one ring, no store, requests of %zu bytes, %s\n", si.chunk_size,
               zo_raw_sweep_describe(r->e.raw));
    printf("runs:    %u%s, after one warm-up step (GB/s, GB = 10^9 bytes; each step reads and writes every byte of "
           "the state once)\n\n",
           o->pairs,
           !o->vs_fio && !o->vs_raw ? ""
           : o->order_abba          ? " rounds, alternating the references then zoffload, and zoffload then the references"
                                    : " rounds, alternating the references, then zoffload");
    printf("%5s", o->vs_fio || o->vs_raw ? "round" : "run");
    if (o->vs_fio)
        printf(" %10s %10s", "fio rd", "fio wr");
    if (o->vs_raw)
        printf(" %10s %10s", "raw rd", "raw wr");
    printf(" %10s %10s", "zo rd", "zo wr");
    if (o->vs_fio)
        printf(" %8s", "ratio");
    if (o->vs_raw)
        printf(" %8s", "zo/raw");
    if (!o->vs_fio && !o->vs_raw)
        printf(" %10s", "stall s");
    printf("\n");
}

/* What the disk saw around each side of a round: before and after fio, raw, zoffload */
typedef struct round_snaps {
    disk_snap f0, f1, r0, r1, z0, z1;
} round_snaps;

/* zoffload's side of a round: one timed sweep */
static int optim_round_zo(optim_run *r, round_snaps *ds, double *zsecs)
{
    zo_store_reset_stats(r->e.st);
    disk_snap_take(r->dstat, &ds->z0);
    int rc = optim_sweep(r->o, &r->e, ZO_STREAM_READ | ZO_STREAM_WRITE, 0, zsecs, &r->info);
    disk_snap_take(r->dstat, &ds->z1);
    if (rc) {
        fprintf(stderr, "zo-store-bench: sweep failed: %s (%s)\n", zo_strerror(rc), zo_last_error_detail());
        return EXIT_RUN;
    }
    if (!r->o->io_only)
        r->steps++;
    return 0;
}

/* The references' side of round p: fio, then the raw loop, each if asked */
static int optim_round_refs(optim_run *r, unsigned p, round_snaps *ds)
{
    const opts *o = r->o;
    if (o->vs_fio) {
        zo_fio_result res;
        disk_snap_take(r->dstat, &ds->f0);
        int fr_rc = zo_fio_run(&r->fj, &res);
        disk_snap_take(r->dstat, &ds->f1);
        if (fr_rc != 0) {
            fprintf(stderr, "zo-store-bench: fio failed: %s\n", res.err);
            return EXIT_RUN;
        }
        r->ser[SER_FR][p] = res.bw[0];
        r->ser[SER_FW][p] = res.bw[1];
    }
    if (o->vs_raw) {
        double secs;
        disk_snap_take(r->dstat, &ds->r0);
        int rr_rc = zo_raw_sweep_run(r->e.raw, &secs, r->why, sizeof(r->why));
        disk_snap_take(r->dstat, &ds->r1);
        if (rr_rc != 0) {
            fprintf(stderr, "zo-store-bench: --vs-raw: %s\n", r->why);
            return EXIT_RUN;
        }
        if (!o->io_only)
            r->raw_steps++;
        r->ser[SER_RAW][p] = (double)r->bytes / secs;
    }
    return 0;
}

/* Round p's line of the table, and what the disk saw */
static void optim_round_print(const optim_run *r, unsigned p, const round_snaps *ds)
{
    const opts *o = r->o;
    double *const *ser = r->ser;
    if (!o->json) {
        printf("%5u", p + 1);
        if (o->vs_fio)
            printf(" %10.3f %10.3f", ser[SER_FR][p] * 1e-9, ser[SER_FW][p] * 1e-9);
        if (o->vs_raw)
            printf(" %10.3f %10.3f", ser[SER_RAW][p] * 1e-9, ser[SER_RAW][p] * 1e-9);
        printf(" %10.3f %10.3f", ser[SER_ZO][p] * 1e-9, ser[SER_ZO][p] * 1e-9);
        if (o->vs_fio)
            printf(" %8.3f", ser[SER_RATIO][p]);
        if (o->vs_raw)
            printf(" %8.3f", ser[SER_RRATIO][p]);
        if (!o->vs_fio && !o->vs_raw)
            printf(" %10.3f", ser[SER_STALL][p]);
        printf("\n");
    }
    if (r->dstat[0]) {
        if (o->vs_fio)
            disk_print("fio", &ds->f0, &ds->f1);
        if (o->vs_raw)
            disk_print("raw", &ds->r0, &ds->r1);
        disk_print("zo", &ds->z0, &ds->z1);
    }
}

/* Round p: the references and one zoffload sweep, in the round's order */
static int optim_round(optim_run *r, unsigned p)
{
    const opts *o = r->o;
    double *const *ser = r->ser;
    round_snaps ds;
    /* --order abba: every other round runs zoffload first, so that each
     * side follows the other as often as itself (a run that leaves the
     * disk slower for the next one then weighs on both) */
    int zo_first = o->order_abba && (p & 1);
    double zsecs = 0;
    int rc = 0;
    for (int ph = 0; ph < 2 && rc == 0; ph++)
        rc = (ph == 0) == zo_first ? optim_round_zo(r, &ds, &zsecs) : optim_round_refs(r, p, &ds);
    if (rc)
        return rc;
    zo_store_stats st;
    zo_store_get_stats(r->e.st, &st);
    ser[SER_STALL][p] = (double)st.stall_ns * 1e-9;
    ser[SER_ZO][p] = (double)r->bytes / zsecs;
    double fr = ser[SER_FR][p], fw = ser[SER_FW][p], raw = ser[SER_RAW][p], zo = ser[SER_ZO][p];
    ser[SER_RATIO][p] = o->vs_fio && fr + fw > 0 ? 2 * zo / (fr + fw) : 0;
    ser[SER_RRATIO][p] = o->vs_raw && raw > 0 ? zo / raw : 0;
    optim_round_print(r, p, &ds);
    return 0;
}

static void optim_report_json(const optim_run *r, const zo_machine *m)
{
    const opts *o = r->o;
    unsigned P = o->pairs;
    double *const *ser = r->ser;
    zo_json j;
    zj_init(&j, stdout, 1);
    zj_obj_begin(&j, NULL);
    zj_str(&j, "tool", "zo-store-bench");
    zj_str(&j, "mode", o->vs_fio ? "optim-vs-fio" : "optim");
    zj_str(&j, "version", zo_version_string());
    zo_machine_json(m, &j, "machine");
    zj_obj_begin(&j, "config");
    zj_str(&j, "path", o->path);
    zj_uint(&j, "state_bytes", r->bytes);
    zj_str(&j, "state_dtype", zo_dtype_name(o->state_dtype));
    zj_uint(&j, "group_elems", o->group_elems);
    zj_uint(&j, "groups", r->e.ngroups);
    zj_uint(&j, "depth", r->info.depth);
    zj_uint(&j, "piece_elems", r->info.piece_elems);
    zj_uint(&j, "slots_reserved", r->info.slots);
    zj_str(&j, "checksum", zo_csum_name(o->csum));
    zj_uint(&j, "queue_depth", optim_queue_depth(o));
    zj_bool(&j, "io_only", o->io_only);
    zj_str(&j, "order", o->order_abba ? "abba" : "ab");
    if (o->vs_fio) {
        zj_uint(&j, "fio_size", r->fj.size);
        zj_uint(&j, "fio_bs", r->fj.bs);
        zj_uint(&j, "fio_iodepth", r->fj.iodepth);
        zj_str(&j, "fio_iomem", o->fio_iomem ? o->fio_iomem : "malloc (fio's default)");
    }
    if (o->vs_raw)
        zj_str(&j, "raw", zo_raw_sweep_describe(r->e.raw));
    zj_obj_end(&j);
    zj_uint(&j, "pairs", P);
    const struct {
        const char *k;
        int s;
        int want; /* 0 always, 1 with --vs-fio, 2 with --vs-raw */
    } arr[] = {{"read_bytes_per_s", SER_ZO, 0},      {"write_bytes_per_s", SER_ZO, 0},
               {"stall_s", SER_STALL, 0},            {"fio_read_bytes_per_s", SER_FR, 1},
               {"fio_write_bytes_per_s", SER_FW, 1}, {"ratios", SER_RATIO, 1},
               {"raw_read_bytes_per_s", SER_RAW, 2}, {"raw_write_bytes_per_s", SER_RAW, 2},
               {"raw_ratios", SER_RRATIO, 2}};
    for (size_t a = 0; a < sizeof(arr) / sizeof(arr[0]); a++) {
        if ((arr[a].want == 1 && !o->vs_fio) || (arr[a].want == 2 && !o->vs_raw))
            continue;
        zj_arr_begin(&j, arr[a].k);
        for (unsigned p = 0; p < P; p++)
            zj_num(&j, NULL, ser[arr[a].s][p]);
        zj_arr_end(&j);
        char key[64];
        snprintf(key, sizeof(key), "%s_median", arr[a].k);
        zj_num(&j, key, median(ser[arr[a].s], P));
    }
    zj_arr_begin(&j, "zo_first"); /* per round: zoffload ran before the references */
    for (unsigned p = 0; p < P; p++)
        zj_bool(&j, NULL, (o->vs_fio || o->vs_raw) && o->order_abba && (p & 1));
    zj_arr_end(&j);
    zj_bool(&j, "verified", 1);
    zj_obj_end(&j);
    zj_end(&j);
}

static void optim_report_text(const optim_run *r)
{
    const opts *o = r->o;
    unsigned P = o->pairs;
    const double *zo = r->ser[SER_ZO];
    printf("\nmedians: zoffload read %.3f GB/s, write %.3f GB/s", median(zo, P) * 1e-9, median(zo, P) * 1e-9);
    if (o->vs_fio)
        printf("; fio read %.3f GB/s, write %.3f GB/s; ratio (read + write) %.3f", median(r->ser[SER_FR], P) * 1e-9,
               median(r->ser[SER_FW], P) * 1e-9, median(r->ser[SER_RATIO], P));
    if (o->vs_raw)
        printf("; raw io_uring read = write %.3f GB/s; zoffload / raw %.3f", median(r->ser[SER_RAW], P) * 1e-9,
               median(r->ser[SER_RRATIO], P));
    printf("\nchecked: every group's first, middle and last elements hold %u updates", r->steps);
    if (o->vs_raw)
        printf(" (raw io_uring's file: %u)", r->raw_steps);
    printf("\n");
}

/* Everything up to the rounds: series, warm-up, the references, the head */
static int optim_prepare(optim_run *r, const zo_machine *m)
{
    const opts *o = r->o;
    for (int i = 0; i < NSER; i++)
        if (!(r->ser[i] = calloc(o->pairs, sizeof(double))))
            return EXIT_RUN;
    int rc = optim_warm_up(r);
    if (rc == 0 && o->vs_raw)
        rc = optim_raw_open(r);
    if (rc == 0)
        rc = optim_fio_setup(r);
    if (rc)
        return rc;
    if (!o->json)
        optim_print_head(r, m);
    if (o->disk_stats && !o->json && (rc = disk_stat_path(o->path, r->dstat, sizeof(r->dstat))) != 0) {
        fprintf(stderr, "zo-store-bench: --disk-stats: no block device statistics for %s (%s)\n", o->path,
                strerror(-rc));
        return EXIT_RUN;
    }
    return 0;
}

static int cmd_optim(const opts *o, const zo_machine *m)
{
    optim_run r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    if (optim_open(o, &r.e))
        return EXIT_RUN;
    r.esz = zo_dtype_size(o->state_dtype);
    r.bytes = r.e.nelem * (4 + 2 * r.esz);
    int rc = optim_prepare(&r, m);
    for (unsigned p = 0; p < o->pairs && rc == 0; p++)
        rc = optim_round(&r, p);
    if (rc == 0)
        rc = optim_check(o, &r.e, r.steps, read_store, "zoffload");
    if (rc == 0 && o->vs_raw)
        rc = optim_check(o, &r.e, r.raw_steps, read_raw, "raw io_uring");
    if (rc == 0 && o->json)
        optim_report_json(&r, m);
    else if (rc == 0)
        optim_report_text(&r);
    for (int i = 0; i < NSER; i++)
        free(r.ser[i]);
    optim_close(&r.e);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;
    /* SIGINT/SIGTERM: end fio, remove the run's directory, then die */
    zo_tool_cleanup_signals();
    zo_machine m;
    zo_machine_get(&m);
    if (o.optim)
        return cmd_optim(&o, &m);
    return o.checksums ? cmd_checksums(&o, &m) : cmd_replay(&o, &m);
}
