/* SPDX-License-Identifier: Apache-2.0 */
/* zo-info: what this build of zoffload is and what it finds on this machine:
 * version, build features, CPU features and mask, the kernel variant each
 * module picked, topology, pinned-memory limits (with a real test
 * allocation), device backends. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "tool_common.h"

#define MAX_PATHS 16

typedef struct {
    const char *module;
    const char *(*variant)(void);                        /* the one picked now */
    const char *(*variant_at)(unsigned i, unsigned *needs); /* the ones built */
} kernel_entry;

/* One line per run-time-dispatched module. */
static const kernel_entry kernels[] = {
    {"vec", zo_vec_variant, zo_vec_variant_at},
    {"crc32c", zo_crc32c_variant, zo_crc32c_variant_at},
    {"cpuadam", zo_cpuadam_variant, zo_cpuadam_variant_at},
};

/* The variants of kernel family k that are built, that this CPU runs, and
 * that the mask leaves to dispatch, each as a space-separated list. */
static void variant_lists(const kernel_entry *k, char *built, char *cpu, char *allowed, size_t len)
{
    unsigned det = zo_cpu_detected(), eff = zo_cpu_flags(), need;
    built[0] = cpu[0] = allowed[0] = '\0';
    const char *name;
    for (unsigned i = 0; (name = k->variant_at(i, &need)) != NULL; i++) {
        snprintf(built + strlen(built), len - strlen(built), "%s%s", i ? " " : "", name);
        if ((det & need) == need)
            snprintf(cpu + strlen(cpu), len - strlen(cpu), "%s%s", cpu[0] ? " " : "", name);
        if ((eff & need) == need)
            snprintf(allowed + strlen(allowed), len - strlen(allowed), "%s%s", allowed[0] ? " " : "", name);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zo-info [--json] [--path DIR]... [--pin-test SIZE]\n"
            "  --json           machine-readable output\n"
            "  --path DIR       report the NUMA node and filesystem of DIR (default /var/tmp)\n"
            "  --pin-test SIZE  try a pinned allocation of SIZE (default 64M; 0 skips)\n"
            "environment: ZO_CPU_MASK lowers the CPU features kernels may use,\n"
            "             ZO_LOG sets the log level, ZO_TOPO=sysfs skips hwloc\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    int ran, rc;
    unsigned flags;
    double seconds;
    size_t bytes;
} pin_probe;

static pin_probe probe_pinned(uint64_t bytes)
{
    pin_probe p = {0};
    if (!bytes)
        return p;
    p.ran = 1;
    p.bytes = (size_t)bytes;
    void *mem = NULL;
    double t0 = now_s();
    p.rc = zo_pinned_alloc(&mem, (size_t)bytes, NULL);
    p.seconds = now_s() - t0;
    if (p.rc == 0) {
        zo_pinned_info info;
        zo_pinned_query(mem, &info);
        p.flags = info.flags;
        zo_pinned_free(mem);
    }
    return p;
}

/* What the aio engine picks here (AUTO), and whether a directory takes
 * O_DIRECT (a scratch file is created there and removed). */
typedef struct {
    int rc;
    zo_aio_info info;
    char why[256];
} aio_probe;

static aio_probe probe_aio(void)
{
    aio_probe p;
    memset(&p, 0, sizeof(p));
    zo_aio *a = NULL;
    p.rc = zo_aio_create(&a, NULL);
    if (p.rc == 0) {
        zo_aio_get_info(a, &p.info);
        zo_aio_destroy(&a);
    } else {
        snprintf(p.why, sizeof(p.why), "%s", zo_last_error_detail());
    }
    return p;
}

typedef struct {
    int rc; /* 0, or why the scratch file could not be made */
    zo_file_info info;
} dir_probe;

static dir_probe probe_dir(const char *dir)
{
    dir_probe d;
    memset(&d, 0, sizeof(d));
    char path[4200];
    snprintf(path, sizeof(path), "%s/.zo-info-probe.%d", dir, (int)getpid());
    zo_file *f = NULL;
    d.rc = zo_file_open(&f, path, ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_CREATE | ZO_FILE_EXCL | ZO_FILE_NOFOLLOW);
    if (d.rc == 0) {
        zo_file_get_info(f, &d.info);
        zo_file_close(&f);
        unlink(path);
    }
    return d;
}

static void fmt_bytes(uint64_t b, char *buf, size_t len)
{
    if (b == UINT64_MAX)
        snprintf(buf, len, "unlimited");
    else if (b >= (1ull << 30))
        snprintf(buf, len, "%.1f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
    else
        snprintf(buf, len, "%llu B", (unsigned long long)b);
}

/* ---- the command line ---------------------------------------------------------- */
typedef struct info_opts {
    int json;
    const char *paths[MAX_PATHS];
    int npaths;
    uint64_t pin_bytes;
} info_opts;

static int set_path(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    info_opts *o = d->dst;
    if (o->npaths == MAX_PATHS) {
        fprintf(stderr, "zo-info: at most %d --path\n", MAX_PATHS);
        return 2;
    }
    o->paths[o->npaths++] = arg;
    return 0;
}

static int set_pin_test(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (zo_parse_size(arg, d->dst) != 0) {
        fprintf(stderr, "zo-info: --pin-test: '%s' is not a size (e.g. 64M, 1G, 0)\n", arg);
        return 2;
    }
    return 0;
}

/* 0, or the exit status (getopt says what it does not know itself: opterr stays on) */
static int parse_opts(int argc, char **argv, info_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->pin_bytes = 64ull << 20;
    const zo_tool_opt table[] = {
        {"json", 0, 'j', zo_tool_opt_on, &o->json, 0, 0, NULL},
        {"path", 1, 'p', set_path, o, 0, 0, NULL},
        {"pin-test", 1, 't', set_pin_test, &o->pin_bytes, 0, 0, NULL},
        {"help", 0, 'h', zo_tool_opt_help, NULL, 0, 0, NULL},
    };
    const zo_tool_cli cli = {"zo-info", usage, table, sizeof(table) / sizeof(table[0])};
    int rc = zo_tool_opts_parse(&cli, argc, argv);
    if (rc > 0)
        return rc;
    if (rc < 0) {
        usage(stderr);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "zo-info: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (o->npaths == 0)
        o->paths[o->npaths++] = "/var/tmp";
    return 0;
}

/* ---- what this machine has: gathered first, then printed one way or the other ---- */
typedef struct backend_probe {
    zo_dev_kind kind;
    int rc, n;
    char why[256];
    zo_dev_info info[8];
    int ninfo;
} backend_probe;

typedef struct report {
    const info_opts *o;
    zo_machine m;
    unsigned det, mask, eff;
    char sdet[256], smask[256], seff[256];
    const char *env_mask;
    zo_topo *topo;
    int trc;
    aio_probe ap;
    dir_probe dp[MAX_PATHS];
    zo_pinned_stats ps;
    pin_probe pp;
    backend_probe backs[ZO_DEV_KIND_COUNT];
} report;

/* Each device backend: whether it is there, and what its first devices are */
static void probe_backend(backend_probe *b, zo_dev_kind k)
{
    b->kind = k;
    b->rc = zo_dev_probe(k, &b->n, b->why, sizeof(b->why));
    b->ninfo = 0;
    for (int i = 0; b->rc == 0 && i < b->n && i < 8; i++) {
        zo_dev_config cfg;
        zo_dev_config_default(&cfg);
        cfg.kind = k;
        cfg.ordinal = i;
        zo_dev *d;
        if (zo_dev_open(&d, &cfg) == 0) {
            if (zo_dev_get_info(d, &b->info[b->ninfo]) == 0)
                b->ninfo++;
            zo_dev_close(&d);
        }
    }
}

/* Everything, in this order: the pinned statistics are read after the test
 * allocation, whose fallback reason they carry */
static void gather(report *r, const info_opts *o)
{
    r->o = o;
    zo_machine_get(&r->m);
    r->det = zo_cpu_detected(), r->mask = zo_cpu_get_mask(), r->eff = zo_cpu_flags();
    zo_cpu_flags_string(r->det, r->sdet, sizeof(r->sdet));
    zo_cpu_flags_string(r->mask & ZO_CPU_ALL, r->smask, sizeof(r->smask));
    zo_cpu_flags_string(r->eff, r->seff, sizeof(r->seff));
    r->env_mask = getenv("ZO_CPU_MASK");
    r->topo = NULL;
    r->trc = zo_topo_create(&r->topo);
    r->ap = probe_aio();
    for (int i = 0; i < o->npaths; i++)
        r->dp[i] = probe_dir(o->paths[i]);
    r->pp = probe_pinned(o->pin_bytes);
    zo_pinned_stats_get(&r->ps);
    for (int k = 0; k < ZO_DEV_KIND_COUNT; k++)
        probe_backend(&r->backs[k], (zo_dev_kind)k);
}

/* ---- --json ----------------------------------------------------------------------- */
static void json_cpu(zo_json *j, const report *r)
{
    zj_obj_begin(j, "cpu");
    zj_str(j, "model", zo_cpu_model());
    zj_str(j, "detected", r->sdet);
    zj_str(j, "mask", r->smask);
    zj_str(j, "mask_env", r->env_mask);
    zj_str(j, "effective", r->seff);
    zj_str(j, "level", zo_cpu_level_name(r->eff));
    zj_obj_end(j);
    zj_obj_begin(j, "kernels");
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
        zj_str(j, kernels[i].module, kernels[i].variant());
    zj_obj_end(j);
    /* per family: built, runnable on this CPU, left by the mask, picked */
    zj_obj_begin(j, "kernel_variants");
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
        char built[256], cpu[256], allowed[256];
        variant_lists(&kernels[i], built, cpu, allowed, sizeof(built));
        zj_obj_begin(j, kernels[i].module);
        zj_str(j, "built", built);
        zj_str(j, "cpu", cpu);
        zj_str(j, "allowed", allowed);
        zj_str(j, "picked", kernels[i].variant());
        zj_obj_end(j);
    }
    zj_obj_end(j);
}

static void json_topology(zo_json *j, const report *r)
{
    const info_opts *o = r->o;
    zo_topo *topo = r->topo;
    zj_obj_begin(j, "topology");
    if (r->trc == 0) {
        zj_str(j, "source", zo_topo_source(topo));
        zj_int(j, "cpus", zo_topo_ncpus(topo));
        zj_int(j, "cores", zo_topo_ncores(topo));
        zj_arr_begin(j, "nodes");
        for (int i = 0; i < zo_topo_nnodes(topo); i++) {
            int id = zo_topo_node_id(topo, i);
            int cpus[4096];
            int n = zo_topo_node_cpus(topo, id, cpus, 4096);
            zj_obj_begin(j, NULL);
            zj_int(j, "id", id);
            zj_arr_begin(j, "cpus");
            for (int k = 0; k < n && k < 4096; k++)
                zj_int(j, NULL, cpus[k]);
            zj_arr_end(j);
            zj_int(j, "memory_bytes", zo_topo_node_memory(topo, id));
            zj_obj_end(j);
        }
        zj_arr_end(j);
        zj_arr_begin(j, "paths");
        for (int i = 0; i < o->npaths; i++) {
            char st[512];
            zo_path_storage(o->paths[i], st, sizeof(st));
            zj_obj_begin(j, NULL);
            zj_str(j, "path", o->paths[i]);
            zj_int(j, "numa_node", zo_topo_node_of_path(topo, o->paths[i]));
            zj_str(j, "storage", st);
            zj_obj_end(j);
        }
        zj_arr_end(j);
    } else {
        zj_str(j, "error", zo_strerror(r->trc));
    }
    zj_obj_end(j);
}

static void json_pinned(zo_json *j, const report *r)
{
    const pin_probe *pp = &r->pp;
    zj_obj_begin(j, "pinned");
    zj_uint(j, "memlock_limit", r->ps.memlock_limit);
    zj_bool(j, "cap_ipc_lock", r->ps.can_lock_unlimited);
    zj_uint(j, "budget", r->ps.budget);
    if (pp->ran) {
        zj_obj_begin(j, "test_allocation");
        zj_uint(j, "bytes", pp->bytes);
        zj_int(j, "rc", pp->rc);
        zj_bool(j, "locked", !!(pp->flags & ZO_PIN_LOCKED));
        zj_bool(j, "hugetlb", !!(pp->flags & ZO_PIN_HUGE));
        zj_bool(j, "thp", !!(pp->flags & ZO_PIN_THP));
        zj_num(j, "seconds", pp->seconds);
        zj_str(j, "fallback_reason", r->ps.last_fallback);
        zj_obj_end(j);
    }
    zj_obj_end(j);
}

static void json_aio(zo_json *j, const report *r)
{
    const aio_probe *ap = &r->ap;
    zj_obj_begin(j, "aio");
    if (ap->rc == 0) {
        zj_str(j, "backend", zo_aio_backend_name(ap->info.backend));
        zj_str(j, "ring_setup", ap->info.ring_setup);
        zj_bool(j, "registered_files", ap->info.registered_files);
        zj_bool(j, "fixed_buffers", ap->info.fixed_buffers);
        zj_str(j, "fallback", ap->info.fallback);
    } else {
        zj_str(j, "error", zo_strerror(ap->rc));
        zj_str(j, "detail", ap->why);
    }
    zj_arr_begin(j, "paths");
    for (int i = 0; i < r->o->npaths; i++) {
        const dir_probe *dp = r->dp;
        zj_obj_begin(j, NULL);
        zj_str(j, "path", r->o->paths[i]);
        if (dp[i].rc == 0) {
            zj_bool(j, "direct", dp[i].info.direct);
            zj_uint(j, "offset_align", dp[i].info.offset_align);
            zj_uint(j, "mem_align", dp[i].info.mem_align);
            zj_str(j, "fallback", dp[i].info.fallback);
        } else {
            zj_str(j, "error", zo_strerror(dp[i].rc));
        }
        zj_obj_end(j);
    }
    zj_arr_end(j);
    zj_obj_end(j);
}

static void json_devices(zo_json *j, const report *r)
{
    zj_arr_begin(j, "devices");
    for (int k = 0; k < ZO_DEV_KIND_COUNT; k++) {
        const backend_probe *b = &r->backs[k];
        zj_obj_begin(j, NULL);
        zj_str(j, "backend", zo_dev_kind_name(b->kind));
        zj_bool(j, "available", b->rc == 0);
        zj_int(j, "count", b->n);
        if (b->rc)
            zj_str(j, "reason", b->why);
        zj_arr_begin(j, "info");
        for (int i = 0; i < b->ninfo; i++) {
            const zo_dev_info *in = &b->info[i];
            zj_obj_begin(j, NULL);
            zj_str(j, "name", in->name);
            zj_uint(j, "total_mem", in->total_mem);
            zj_uint(j, "free_mem", in->free_mem);
            zj_str(j, "pci_bus_id", in->pci_bus_id);
            zj_int(j, "numa_node", in->numa_node);
            zj_int(j, "cc_major", in->cc_major);
            zj_int(j, "cc_minor", in->cc_minor);
            zj_obj_end(j);
        }
        zj_arr_end(j);
        zj_obj_end(j);
    }
    zj_arr_end(j);
}

static void print_json(const report *r)
{
    zo_json j;
    zj_init(&j, stdout, 1);
    zj_obj_begin(&j, NULL);
    zj_str(&j, "version", zo_version_string());
    zj_str(&j, "build", zo_build_string());
    zo_machine_json(&r->m, &j, "machine");
    json_cpu(&j, r);
    json_topology(&j, r);
    json_pinned(&j, r);
    json_aio(&j, r);
    json_devices(&j, r);
    zj_obj_end(&j);
    zj_end(&j);
}

/* ---- text --------------------------------------------------------------------------- */
static void text_cpu(const report *r)
{
    const char *env_mask = r->env_mask;
    printf("\nCPU:      %s\n", zo_cpu_model());
    printf("  detected:  %s\n", r->sdet);
    printf("  mask:      %s%s%s%s\n", r->smask[0] ? r->smask : "(none: scalar only)", env_mask ? "  (ZO_CPU_MASK=" : "",
           env_mask ? env_mask : "", env_mask ? ")" : "");
    printf("  effective: %s  -> level %s\n", r->seff[0] ? r->seff : "(none)", zo_cpu_level_name(r->eff));
    printf("\nkernels:    picked       built / this CPU runs / the mask allows\n");
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
        char built[256], cpu[256], allowed[256];
        variant_lists(&kernels[i], built, cpu, allowed, sizeof(built));
        printf("  %-10s %-12s %s / %s / %s\n", kernels[i].module, kernels[i].variant(), built, cpu, allowed);
    }
}

static void text_topology(const report *r)
{
    const info_opts *o = r->o;
    zo_topo *topo = r->topo;
    char b1[32];
    printf("\ntopology:\n");
    if (r->trc != 0) {
        printf("  unavailable: %s (%s)\n", zo_strerror(r->trc), zo_last_error_detail());
        return;
    }
    printf("  source %s: %d CPUs, %d cores, %d NUMA node(s)\n", zo_topo_source(topo), zo_topo_ncpus(topo),
           zo_topo_ncores(topo), zo_topo_nnodes(topo));
    for (int i = 0; i < zo_topo_nnodes(topo); i++) {
        int id = zo_topo_node_id(topo, i);
        int cpus[4096];
        int n = zo_topo_node_cpus(topo, id, cpus, 4096);
        fmt_bytes((uint64_t)zo_topo_node_memory(topo, id), b1, sizeof(b1));
        printf("  node %d: %s, CPUs", id, b1);
        for (int k = 0; k < n && k < 4096; k++)
            printf("%s%d", k ? "," : " ", cpus[k]);
        printf("\n");
    }
    for (int i = 0; i < o->npaths; i++) {
        char st[512];
        zo_path_storage(o->paths[i], st, sizeof(st));
        int node = zo_topo_node_of_path(topo, o->paths[i]);
        if (node >= -1)
            printf("  %s: %s, NUMA node %d\n", o->paths[i], st, node);
        else
            printf("  %s: %s\n", o->paths[i], zo_strerror(node));
    }
}

static void text_pinned(const report *r)
{
    const zo_pinned_stats *ps = &r->ps;
    const pin_probe *pp = &r->pp;
    char b1[32], b2[32];
    fmt_bytes(ps->memlock_limit, b1, sizeof(b1));
    fmt_bytes(ps->budget == SIZE_MAX ? UINT64_MAX : ps->budget, b2, sizeof(b2));
    printf("\npinned memory:\n  RLIMIT_MEMLOCK %s, CAP_IPC_LOCK %s, zoffload budget %s\n", b1,
           ps->can_lock_unlimited ? "yes" : "no", b2);
    if (!pp->ran)
        return;
    fmt_bytes(pp->bytes, b1, sizeof(b1));
    if (pp->rc)
        printf("  test allocation of %s failed: %s\n", b1, zo_strerror(pp->rc));
    else
        printf("  test allocation of %s: %s%s%s in %.1f ms%s%s\n", b1,
               (pp->flags & ZO_PIN_LOCKED) ? "locked" : "NOT locked (fallback to pageable)",
               (pp->flags & ZO_PIN_HUGE) ? ", hugetlb pages" : "", (pp->flags & ZO_PIN_THP) ? ", THP advised" : "",
               pp->seconds * 1e3, (pp->flags & ZO_PIN_LOCKED) ? "" : ": ",
               (pp->flags & ZO_PIN_LOCKED) ? "" : ps->last_fallback);
}

static void text_aio(const report *r)
{
    const aio_probe *ap = &r->ap;
    printf("\naio:\n");
    if (ap->rc == 0)
        printf("  engine: %s%s%s%s%s\n", zo_aio_backend_name(ap->info.backend), ap->info.ring_setup[0] ? " (" : "",
               ap->info.ring_setup, ap->info.ring_setup[0] ? ")" : "",
               ap->info.registered_files ? ", registered files" : "");
    else
        printf("  engine unavailable: %s (%s)\n", zo_strerror(ap->rc), ap->why);
    if (ap->rc == 0 && ap->info.fallback[0])
        printf("  note: %s\n", ap->info.fallback);
    for (int i = 0; i < r->o->npaths; i++) {
        const char *path = r->o->paths[i];
        const dir_probe *dp = &r->dp[i];
        if (dp->rc)
            printf("  %s: cannot create a scratch file: %s\n", path, zo_strerror(dp->rc));
        else if (dp->info.direct)
            printf("  %s: O_DIRECT, offsets/lengths aligned to %u, buffers to %u\n", path, dp->info.offset_align,
                   dp->info.mem_align);
        else
            printf("  %s: buffered only (%s)\n", path, dp->info.fallback);
    }
}

static void text_devices(const report *r)
{
    char b1[32], b2[32];
    printf("\ndevice backends:\n");
    for (int k = 0; k < ZO_DEV_KIND_COUNT; k++) {
        const backend_probe *b = &r->backs[k];
        if (b->rc)
            printf("  %-5s unavailable: %s\n", zo_dev_kind_name(b->kind), b->why);
        else
            printf("  %-5s available, %d device(s)\n", zo_dev_kind_name(b->kind), b->n);
        for (int i = 0; i < b->ninfo; i++) {
            const zo_dev_info *in = &b->info[i];
            fmt_bytes(in->total_mem, b1, sizeof(b1));
            fmt_bytes(in->free_mem, b2, sizeof(b2));
            if (in->kind == ZO_DEV_CUDA)
                printf("        %d: %s (sm_%d%d), %s total, %s free, PCI %s, NUMA node %d\n", i, in->name,
                       in->cc_major, in->cc_minor, b1, b2, in->pci_bus_id, in->numa_node);
            else
                printf("        %d: %s, %s, %s free\n", i, in->name, b1, b2);
        }
    }
}

static void print_text(const report *r)
{
    printf("zoffload %s\n", zo_version_string());
    printf("build:    %s\n", zo_build_string());
    zo_machine_print(&r->m, stdout);
    text_cpu(r);
    text_topology(r);
    text_pinned(r);
    text_aio(r);
    text_devices(r);
}

int main(int argc, char **argv)
{
    info_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;
    report r;
    gather(&r, &o);
    if (o.json)
        print_json(&r);
    else
        print_text(&r);
    zo_topo_destroy(&r.topo);
    return 0;
}
