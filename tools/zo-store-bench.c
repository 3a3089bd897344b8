/* zo-store-bench: measurements of the tiered store and its checksums.
 *
 *   replay (default)  a training-like access sequence (acquire each tensor
 *                     on the device in order, compute, release; repeat)
 *                     over tensors on NVMe that do not all fit the device
 *                     tier; pairs alternate the store without prefetch and
 *                     with trace-driven prefetch, and report the demand
 *                     stall time of each and the median ratio.
 *   --checksums       CRC32C (every variant this CPU runs) and XXH3 speed
 *                     on the same buffer, alternating, medians.
 *
 * Exit status: 0 success; 1 a run failed; 2 bad usage or input. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

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
} opts;

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "zo-store-bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return EXIT_USAGE;
}

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
               "checksums:\n"
               "  --checksums           CRC32C variants and XXH3 speed, alternating (median of --pairs)\n"
               "  --checksum-size SIZE  buffer (default 64M)\n"
               "output:\n"
               "  --json                one JSON object on stdout\n");
}

static int parse_u(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *v)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return errno || *end || *v < lo || *v > hi ? -1 : 0;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    enum { O_PATH = 256, O_T, O_TS, O_DT, O_DEV, O_CMS, O_LA, O_IT, O_PR, O_CS, O_CSS, O_JSON, O_HELP };
    static const struct option lo[] = {
        {"path", 1, 0, O_PATH},       {"tensors", 1, 0, O_T},     {"tensor-size", 1, 0, O_TS},
        {"device-tensors", 1, 0, O_DT}, {"device", 1, 0, O_DEV},  {"compute-ms", 1, 0, O_CMS},
        {"lookahead", 1, 0, O_LA},    {"iters", 1, 0, O_IT},      {"pairs", 1, 0, O_PR},
        {"checksums", 0, 0, O_CS},    {"checksum-size", 1, 0, O_CSS}, {"json", 0, 0, O_JSON},
        {"help", 0, 0, O_HELP},       {0, 0, 0, 0},
    };
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
    unsigned long long v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case O_PATH: o->path = optarg; break;
        case O_T:
            if (parse_u(optarg, 2, 100000, &v))
                return bad("--tensors %s: must be 2..100000", optarg);
            o->tensors = (unsigned)v;
            break;
        case O_DT:
            if (parse_u(optarg, 1, 100000, &v))
                return bad("--device-tensors %s: must be 1..100000", optarg);
            o->device_tensors = (unsigned)v;
            break;
        case O_TS:
            if (zo_parse_size(optarg, &o->tensor_size) || o->tensor_size == 0 || o->tensor_size > (1ull << 36))
                return bad("--tensor-size %s: not a size from 1 byte to 64G", optarg);
            break;
        case O_DEV:
            if (zo_dev_kind_parse(optarg, &o->dev))
                return bad("--device %s: expected host or cuda", optarg);
            break;
        case O_CMS:
            if (!strcmp(optarg, "auto")) {
                o->compute_ms = -1;
            } else {
                char *end;
                o->compute_ms = strtod(optarg, &end);
                if (*end || !(o->compute_ms >= 0 && o->compute_ms <= 60000))
                    return bad("--compute-ms %s: a number of milliseconds 0..60000, or auto", optarg);
            }
            break;
        case O_LA:
            if (parse_u(optarg, 1, 4096, &v))
                return bad("--lookahead %s: must be 1..4096", optarg);
            o->lookahead = (unsigned)v;
            break;
        case O_IT:
            if (parse_u(optarg, 1, 10000, &v))
                return bad("--iters %s: must be 1..10000", optarg);
            o->iters = (unsigned)v;
            break;
        case O_PR:
            if (parse_u(optarg, 1, 1000, &v))
                return bad("--pairs %s: must be 1..1000", optarg);
            o->pairs = (unsigned)v;
            break;
        case O_CS: o->checksums = 1; break;
        case O_CSS:
            if (zo_parse_size(optarg, &o->csum_size) || o->csum_size == 0 || o->csum_size > (16ull << 30))
                return bad("--checksum-size %s: not a size from 1 byte to 16G", optarg);
            break;
        case O_JSON: o->json = 1; break;
        case 'h':
        case O_HELP: usage(stdout); exit(0);
        default: return bad("unknown option or missing value: %s (--help lists them)", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad("unexpected argument '%s'", argv[optind]);
    if (o->device_tensors >= o->tensors)
        return bad("--device-tensors %u must be below --tensors %u (else nothing is ever evicted)",
                   o->device_tensors, o->tensors);
    struct stat st;
    if (!o->checksums && (stat(o->path, &st) != 0 || !S_ISDIR(st.st_mode)))
        return bad("--path %s: not an existing directory", o->path);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, unsigned n)
{
    double *c = malloc(n * sizeof(double));
    memcpy(c, v, n * sizeof(double));
    qsort(c, n, sizeof(double), cmp_d);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
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
    if (e->dir[0])
        rmdir(e->dir);
}

static int env_open(const opts *o, env *e, zo_trace_mode trace)
{
    memset(e, 0, sizeof(*e));
    snprintf(e->dir, sizeof(e->dir), "%s/zo-store-bench.%ld", o->path, (long)getpid());
    if (mkdir(e->dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "zo-store-bench: cannot create %s: %s\n", e->dir, strerror(errno));
        e->dir[0] = 0;
        return EXIT_RUN;
    }
    int rc;
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.kind = o->dev;
    uint64_t dev_bytes = (uint64_t)o->device_tensors * ((o->tensor_size + 4095) & ~4095ull) + (1u << 20);
    dc.host_mem_limit = dev_bytes + (1u << 20);
    if ((rc = zo_dev_open(&e->dev, &dc)) != 0)
        goto fail;
    const char *dirs[] = {e->dir};
    zo_swap_config sc;
    zo_swap_config_default(&sc);
    sc.dirs = dirs;
    sc.ndirs = 1;
    if ((rc = zo_swap_create(&e->swap, &sc)) != 0)
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
        zo_machine_print(m, stdout);
        char sto[512];
        zo_path_storage(o->path, sto, sizeof(sto));
        printf("swap:    %s (%s)\n", o->path, sto);
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
    /* variants: what the CPU can run, by lowering the mask */
    struct {
        const char *name;
        zo_csum_kind kind;
        unsigned mask;
    } v[3];
    int nv = 0;
    unsigned saved = zo_cpu_get_mask();
    zo_cpu_set_mask(0);
    v[nv++] = (typeof(v[0])){"crc32c scalar", ZO_CSUM_CRC32C, 0};
    zo_cpu_set_mask(saved);
    if (zo_cpu_flags() & ZO_CPU_SSE42)
        v[nv++] = (typeof(v[0])){"crc32c sse42", ZO_CSUM_CRC32C, saved};
    if (zo_csum_available(ZO_CSUM_XXH3))
        v[nv++] = (typeof(v[0])){"xxh3", ZO_CSUM_XXH3, saved};
    unsigned P = o->pairs;
    double gbps[3][1000];
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

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;
    zo_machine m;
    zo_machine_get(&m);
    return o.checksums ? cmd_checksums(&o, &m) : cmd_replay(&o, &m);
}
