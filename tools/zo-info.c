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

int main(int argc, char **argv)
{
    int json = 0;
    const char *paths[MAX_PATHS];
    int npaths = 0;
    uint64_t pin_bytes = 64ull << 20;
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},
        {"path", required_argument, 0, 'p'},
        {"pin-test", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "jp:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'p':
            if (npaths == MAX_PATHS) {
                fprintf(stderr, "zo-info: at most %d --path\n", MAX_PATHS);
                return 2;
            }
            paths[npaths++] = optarg;
            break;
        case 't':
            if (zo_parse_size(optarg, &pin_bytes) != 0) {
                fprintf(stderr, "zo-info: --pin-test: '%s' is not a size (e.g. 64M, 1G, 0)\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zo-info: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (npaths == 0)
        paths[npaths++] = "/var/tmp";

    zo_machine m;
    zo_machine_get(&m);
    unsigned det = zo_cpu_detected(), mask = zo_cpu_get_mask(), eff = zo_cpu_flags();
    char sdet[256], smask[256], seff[256];
    zo_cpu_flags_string(det, sdet, sizeof(sdet));
    zo_cpu_flags_string(mask & ZO_CPU_ALL, smask, sizeof(smask));
    zo_cpu_flags_string(eff, seff, sizeof(seff));
    const char *env_mask = getenv("ZO_CPU_MASK");

    zo_topo *topo = NULL;
    int trc = zo_topo_create(&topo);

    aio_probe ap = probe_aio();
    dir_probe dp[MAX_PATHS];
    for (int i = 0; i < npaths; i++)
        dp[i] = probe_dir(paths[i]);

    zo_pinned_stats ps;
    pin_probe pp = probe_pinned(pin_bytes);
    zo_pinned_stats_get(&ps);

    struct {
        zo_dev_kind kind;
        int rc, n;
        char why[256];
        zo_dev_info info[8];
        int ninfo;
    } backs[ZO_DEV_KIND_COUNT];
    for (int k = 0; k < ZO_DEV_KIND_COUNT; k++) {
        backs[k].kind = (zo_dev_kind)k;
        backs[k].rc = zo_dev_probe((zo_dev_kind)k, &backs[k].n, backs[k].why, sizeof(backs[k].why));
        backs[k].ninfo = 0;
        for (int i = 0; backs[k].rc == 0 && i < backs[k].n && i < 8; i++) {
            zo_dev_config cfg;
            zo_dev_config_default(&cfg);
            cfg.kind = (zo_dev_kind)k;
            cfg.ordinal = i;
            zo_dev *d;
            if (zo_dev_open(&d, &cfg) == 0) {
                if (zo_dev_get_info(d, &backs[k].info[backs[k].ninfo]) == 0)
                    backs[k].ninfo++;
                zo_dev_close(&d);
            }
        }
    }

    if (json) {
        zo_json j;
        zj_init(&j, stdout, 1);
        zj_obj_begin(&j, NULL);
        zj_str(&j, "version", zo_version_string());
        zj_str(&j, "build", zo_build_string());
        zo_machine_json(&m, &j, "machine");
        zj_obj_begin(&j, "cpu");
        zj_str(&j, "model", zo_cpu_model());
        zj_str(&j, "detected", sdet);
        zj_str(&j, "mask", smask);
        zj_str(&j, "mask_env", env_mask);
        zj_str(&j, "effective", seff);
        zj_str(&j, "level", zo_cpu_level_name(eff));
        zj_obj_end(&j);
        zj_obj_begin(&j, "kernels");
        for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
            zj_str(&j, kernels[i].module, kernels[i].variant());
        zj_obj_end(&j);
        /* per family: built, runnable on this CPU, left by the mask, picked */
        zj_obj_begin(&j, "kernel_variants");
        for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
            char built[256], cpu[256], allowed[256];
            variant_lists(&kernels[i], built, cpu, allowed, sizeof(built));
            zj_obj_begin(&j, kernels[i].module);
            zj_str(&j, "built", built);
            zj_str(&j, "cpu", cpu);
            zj_str(&j, "allowed", allowed);
            zj_str(&j, "picked", kernels[i].variant());
            zj_obj_end(&j);
        }
        zj_obj_end(&j);
        zj_obj_begin(&j, "topology");
        if (trc == 0) {
            zj_str(&j, "source", zo_topo_source(topo));
            zj_int(&j, "cpus", zo_topo_ncpus(topo));
            zj_int(&j, "cores", zo_topo_ncores(topo));
            zj_arr_begin(&j, "nodes");
            for (int i = 0; i < zo_topo_nnodes(topo); i++) {
                int id = zo_topo_node_id(topo, i);
                int cpus[4096];
                int n = zo_topo_node_cpus(topo, id, cpus, 4096);
                zj_obj_begin(&j, NULL);
                zj_int(&j, "id", id);
                zj_arr_begin(&j, "cpus");
                for (int k = 0; k < n && k < 4096; k++)
                    zj_int(&j, NULL, cpus[k]);
                zj_arr_end(&j);
                zj_int(&j, "memory_bytes", zo_topo_node_memory(topo, id));
                zj_obj_end(&j);
            }
            zj_arr_end(&j);
            zj_arr_begin(&j, "paths");
            for (int i = 0; i < npaths; i++) {
                char st[512];
                zo_path_storage(paths[i], st, sizeof(st));
                zj_obj_begin(&j, NULL);
                zj_str(&j, "path", paths[i]);
                zj_int(&j, "numa_node", zo_topo_node_of_path(topo, paths[i]));
                zj_str(&j, "storage", st);
                zj_obj_end(&j);
            }
            zj_arr_end(&j);
        } else {
            zj_str(&j, "error", zo_strerror(trc));
        }
        zj_obj_end(&j);
        zj_obj_begin(&j, "pinned");
        zj_uint(&j, "memlock_limit", ps.memlock_limit);
        zj_bool(&j, "cap_ipc_lock", ps.can_lock_unlimited);
        zj_uint(&j, "budget", ps.budget);
        if (pp.ran) {
            zj_obj_begin(&j, "test_allocation");
            zj_uint(&j, "bytes", pp.bytes);
            zj_int(&j, "rc", pp.rc);
            zj_bool(&j, "locked", !!(pp.flags & ZO_PIN_LOCKED));
            zj_bool(&j, "hugetlb", !!(pp.flags & ZO_PIN_HUGE));
            zj_bool(&j, "thp", !!(pp.flags & ZO_PIN_THP));
            zj_num(&j, "seconds", pp.seconds);
            zj_str(&j, "fallback_reason", ps.last_fallback);
            zj_obj_end(&j);
        }
        zj_obj_end(&j);
        zj_obj_begin(&j, "aio");
        if (ap.rc == 0) {
            zj_str(&j, "backend", zo_aio_backend_name(ap.info.backend));
            zj_str(&j, "ring_setup", ap.info.ring_setup);
            zj_bool(&j, "registered_files", ap.info.registered_files);
            zj_bool(&j, "fixed_buffers", ap.info.fixed_buffers);
            zj_str(&j, "fallback", ap.info.fallback);
        } else {
            zj_str(&j, "error", zo_strerror(ap.rc));
            zj_str(&j, "detail", ap.why);
        }
        zj_arr_begin(&j, "paths");
        for (int i = 0; i < npaths; i++) {
            zj_obj_begin(&j, NULL);
            zj_str(&j, "path", paths[i]);
            if (dp[i].rc == 0) {
                zj_bool(&j, "direct", dp[i].info.direct);
                zj_uint(&j, "offset_align", dp[i].info.offset_align);
                zj_uint(&j, "mem_align", dp[i].info.mem_align);
                zj_str(&j, "fallback", dp[i].info.fallback);
            } else {
                zj_str(&j, "error", zo_strerror(dp[i].rc));
            }
            zj_obj_end(&j);
        }
        zj_arr_end(&j);
        zj_obj_end(&j);
        zj_arr_begin(&j, "devices");
        for (int k = 0; k < ZO_DEV_KIND_COUNT; k++) {
            zj_obj_begin(&j, NULL);
            zj_str(&j, "backend", zo_dev_kind_name(backs[k].kind));
            zj_bool(&j, "available", backs[k].rc == 0);
            zj_int(&j, "count", backs[k].n);
            if (backs[k].rc)
                zj_str(&j, "reason", backs[k].why);
            zj_arr_begin(&j, "info");
            for (int i = 0; i < backs[k].ninfo; i++) {
                zo_dev_info *in = &backs[k].info[i];
                zj_obj_begin(&j, NULL);
                zj_str(&j, "name", in->name);
                zj_uint(&j, "total_mem", in->total_mem);
                zj_uint(&j, "free_mem", in->free_mem);
                zj_str(&j, "pci_bus_id", in->pci_bus_id);
                zj_int(&j, "numa_node", in->numa_node);
                zj_int(&j, "cc_major", in->cc_major);
                zj_int(&j, "cc_minor", in->cc_minor);
                zj_obj_end(&j);
            }
            zj_arr_end(&j);
            zj_obj_end(&j);
        }
        zj_arr_end(&j);
        zj_obj_end(&j);
        zj_end(&j);
    } else {
        char b1[32], b2[32];
        printf("zoffload %s\n", zo_version_string());
        printf("build:    %s\n", zo_build_string());
        zo_machine_print(&m, stdout);
        printf("\nCPU:      %s\n", zo_cpu_model());
        printf("  detected:  %s\n", sdet);
        printf("  mask:      %s%s%s%s\n", smask[0] ? smask : "(none: scalar only)", env_mask ? "  (ZO_CPU_MASK=" : "",
               env_mask ? env_mask : "", env_mask ? ")" : "");
        printf("  effective: %s  -> level %s\n", seff[0] ? seff : "(none)", zo_cpu_level_name(eff));
        printf("\nkernels:    picked       built / this CPU runs / the mask allows\n");
        for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
            char built[256], cpu[256], allowed[256];
            variant_lists(&kernels[i], built, cpu, allowed, sizeof(built));
            printf("  %-10s %-12s %s / %s / %s\n", kernels[i].module, kernels[i].variant(), built, cpu, allowed);
        }
        printf("\ntopology:\n");
        if (trc == 0) {
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
            for (int i = 0; i < npaths; i++) {
                char st[512];
                zo_path_storage(paths[i], st, sizeof(st));
                int node = zo_topo_node_of_path(topo, paths[i]);
                if (node >= -1)
                    printf("  %s: %s, NUMA node %d\n", paths[i], st, node);
                else
                    printf("  %s: %s\n", paths[i], zo_strerror(node));
            }
        } else {
            printf("  unavailable: %s (%s)\n", zo_strerror(trc), zo_last_error_detail());
        }
        fmt_bytes(ps.memlock_limit, b1, sizeof(b1));
        fmt_bytes(ps.budget == SIZE_MAX ? UINT64_MAX : ps.budget, b2, sizeof(b2));
        printf("\npinned memory:\n  RLIMIT_MEMLOCK %s, CAP_IPC_LOCK %s, zoffload budget %s\n", b1,
               ps.can_lock_unlimited ? "yes" : "no", b2);
        if (pp.ran) {
            fmt_bytes(pp.bytes, b1, sizeof(b1));
            if (pp.rc)
                printf("  test allocation of %s failed: %s\n", b1, zo_strerror(pp.rc));
            else
                printf("  test allocation of %s: %s%s%s in %.1f ms%s%s\n", b1,
                       (pp.flags & ZO_PIN_LOCKED) ? "locked" : "NOT locked (fallback to pageable)",
                       (pp.flags & ZO_PIN_HUGE) ? ", hugetlb pages" : "",
                       (pp.flags & ZO_PIN_THP) ? ", THP advised" : "", pp.seconds * 1e3,
                       (pp.flags & ZO_PIN_LOCKED) ? "" : ": ", (pp.flags & ZO_PIN_LOCKED) ? "" : ps.last_fallback);
        }
        printf("\naio:\n");
        if (ap.rc == 0)
            printf("  engine: %s%s%s%s%s\n", zo_aio_backend_name(ap.info.backend),
                   ap.info.ring_setup[0] ? " (" : "", ap.info.ring_setup, ap.info.ring_setup[0] ? ")" : "",
                   ap.info.registered_files ? ", registered files" : "");
        else
            printf("  engine unavailable: %s (%s)\n", zo_strerror(ap.rc), ap.why);
        if (ap.rc == 0 && ap.info.fallback[0])
            printf("  note: %s\n", ap.info.fallback);
        for (int i = 0; i < npaths; i++) {
            if (dp[i].rc)
                printf("  %s: cannot create a scratch file: %s\n", paths[i], zo_strerror(dp[i].rc));
            else if (dp[i].info.direct)
                printf("  %s: O_DIRECT, offsets/lengths aligned to %u, buffers to %u\n", paths[i],
                       dp[i].info.offset_align, dp[i].info.mem_align);
            else
                printf("  %s: buffered only (%s)\n", paths[i], dp[i].info.fallback);
        }
        printf("\ndevice backends:\n");
        for (int k = 0; k < ZO_DEV_KIND_COUNT; k++) {
            if (backs[k].rc)
                printf("  %-5s unavailable: %s\n", zo_dev_kind_name(backs[k].kind), backs[k].why);
            else
                printf("  %-5s available, %d device(s)\n", zo_dev_kind_name(backs[k].kind), backs[k].n);
            for (int i = 0; i < backs[k].ninfo; i++) {
                zo_dev_info *in = &backs[k].info[i];
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
    zo_topo_destroy(&topo);
    return 0;
}
