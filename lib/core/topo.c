/* SPDX-License-Identifier: Apache-2.0 */
/* Topology from hwloc or sysfs, device-to-node lookups, thread binding. */
#define ZO_MODULE "topo"
#include "core/internal.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#if ZO_HAVE_HWLOC
#include <hwloc.h>
#endif
#if ZO_HAVE_OPENMP
#include <omp.h>
#endif

#include <zoffload/topo.h>

typedef struct topo_node {
    int id;
    int ncpus;
    int *cpus;
    int64_t memory;
} topo_node;

struct zo_topo {
    const char *source;
    int ncpus, ncores, nnodes;
    topo_node *nodes;
    int *all_cpus; /* the process's allowed CPUs at creation */
#if ZO_HAVE_HWLOC
    hwloc_topology_t hw;
#endif
};

/* CPU sets are allocated with CPU_ALLOC, not as a fixed cpu_set_t: the
 * fixed type holds 1024 CPUs and sched_getaffinity refuses it (EINVAL) on
 * machines with more. */
static int allowed_cpus(int **out)
{
    for (int ncpu = ZO_MAX(1024, (int)sysconf(_SC_NPROCESSORS_CONF)); ncpu <= (1 << 22); ncpu *= 2) {
        cpu_set_t *set = CPU_ALLOC(ncpu);
        if (!set)
            return -ENOMEM;
        size_t sz = CPU_ALLOC_SIZE(ncpu);
        CPU_ZERO_S(sz, set);
        if (sched_getaffinity(0, sz, set) != 0) {
            int e = errno;
            CPU_FREE(set);
            if (e == EINVAL)
                continue; /* the kernel's mask is wider: try a bigger set */
            return -e;
        }
        int n = CPU_COUNT_S(sz, set);
        int *ids = calloc((size_t)ZO_MAX(n, 1), sizeof(int));
        if (!ids) {
            CPU_FREE(set);
            return -ENOMEM;
        }
        int k = 0;
        for (int c = 0; c < (int)(sz * 8) && k < n; c++)
            if (CPU_ISSET_S(c, sz, set))
                ids[k++] = c;
        CPU_FREE(set);
        *out = ids;
        return n;
    }
    return -EINVAL;
}

static int cpu_allowed(const zo_topo *t, int cpu)
{
    for (int i = 0; i < t->ncpus; i++)
        if (t->all_cpus[i] == cpu)
            return 1;
    return 0;
}

/* ---- sysfs ------------------------------------------------------------------ */
static int count_cores_sysfs(const zo_topo *t)
{
    /* A core is a distinct (package, core id) pair. */
    long *keys = calloc((size_t)t->ncpus, sizeof(long));
    if (!keys)
        return t->ncpus;
    int n = 0;
    for (int i = 0; i < t->ncpus; i++) {
        char path[128], buf[32];
        long pkg = 0, core = t->all_cpus[i];
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", t->all_cpus[i]);
        if (zo__read_text(path, buf, sizeof(buf)) > 0)
            pkg = strtol(buf, NULL, 10);
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/core_id", t->all_cpus[i]);
        if (zo__read_text(path, buf, sizeof(buf)) > 0)
            core = strtol(buf, NULL, 10);
        long key = pkg * 1000000 + core;
        int seen = 0;
        for (int j = 0; j < n; j++)
            if (keys[j] == key)
                seen = 1;
        if (!seen)
            keys[n++] = key;
    }
    free(keys);
    return n;
}

static int load_sysfs(zo_topo *t)
{
    t->source = "sysfs";
    DIR *d = opendir("/sys/devices/system/node");
    int ids[1024], nids = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && nids < (int)ZO_ARRAY_LEN(ids)) {
            if (!strncmp(e->d_name, "node", 4) && isdigit((unsigned char)e->d_name[4]))
                ids[nids++] = atoi(e->d_name + 4);
        }
        closedir(d);
    }
    if (nids == 0) {
        /* No NUMA support in the kernel: one node with every CPU. */
        t->nodes = calloc(1, sizeof(topo_node));
        if (!t->nodes)
            return -ENOMEM;
        t->nnodes = 1;
        t->nodes[0].id = 0;
        t->nodes[0].ncpus = t->ncpus;
        t->nodes[0].cpus = calloc((size_t)t->ncpus, sizeof(int));
        if (!t->nodes[0].cpus)
            return -ENOMEM;
        memcpy(t->nodes[0].cpus, t->all_cpus, (size_t)t->ncpus * sizeof(int));
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        t->nodes[0].memory = pages > 0 && psz > 0 ? (int64_t)pages * psz : 0;
    } else {
        /* sort ids */
        for (int i = 1; i < nids; i++)
            for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
                int x = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = x;
            }
        t->nodes = calloc((size_t)nids, sizeof(topo_node));
        if (!t->nodes)
            return -ENOMEM;
        t->nnodes = nids;
        for (int i = 0; i < nids; i++) {
            topo_node *nd = &t->nodes[i];
            nd->id = ids[i];
            char path[128], buf[4096];
            snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", ids[i]);
            int cap = 0;
            if (zo__read_text(path, buf, sizeof(buf)) > 0)
                cap = zo__parse_cpulist(buf, NULL, 0);
            nd->cpus = calloc((size_t)ZO_MAX(cap, 1), sizeof(int));
            if (!nd->cpus)
                return -ENOMEM;
            if (cap > 0) {
                int *tmp = calloc((size_t)cap, sizeof(int));
                if (!tmp)
                    return -ENOMEM;
                zo__parse_cpulist(buf, tmp, cap);
                for (int k = 0; k < cap; k++)
                    if (cpu_allowed(t, tmp[k]))
                        nd->cpus[nd->ncpus++] = tmp[k];
                free(tmp);
            }
            snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/meminfo", ids[i]);
            FILE *f = fopen(path, "re");
            if (f) {
                char line[256];
                while (fgets(line, sizeof(line), f)) {
                    long long kb;
                    if (sscanf(line, "Node %*d MemTotal: %lld kB", &kb) == 1) {
                        nd->memory = kb * 1024;
                        break;
                    }
                }
                fclose(f);
            }
        }
    }
    t->ncores = count_cores_sysfs(t);
    return 0;
}

/* ---- hwloc ------------------------------------------------------------------ */
#if ZO_HAVE_HWLOC
static int load_hwloc(zo_topo *t)
{
    if (hwloc_topology_init(&t->hw) != 0)
        return -ENOMEM;
    hwloc_topology_set_io_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    /* The OpenCL and GL plugins start an OpenCL runtime / probe X displays
     * at load: slow, leaky, and nothing we need (GPUs are found by PCI). */
#if HWLOC_API_VERSION >= 0x00020100
    hwloc_topology_set_components(t->hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "opencl");
    hwloc_topology_set_components(t->hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "gl");
#endif
    if (hwloc_topology_load(t->hw) != 0) {
        int e = errno ? -errno : -EIO;
        hwloc_topology_destroy(t->hw);
        t->hw = NULL;
        return e;
    }
    t->source = "hwloc";
    int ncores = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_CORE);
    t->ncores = ncores > 0 ? ncores : t->ncpus;
    int nn = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_NUMANODE);
    if (nn <= 0)
        return -ENOENT;
    t->nodes = calloc((size_t)nn, sizeof(topo_node));
    if (!t->nodes)
        return -ENOMEM;
    t->nnodes = nn;
    for (int i = 0; i < nn; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (!o)
            return -ENOENT;
        topo_node *nd = &t->nodes[i];
        nd->id = (int)o->os_index;
        nd->memory = (int64_t)o->attr->numanode.local_memory;
        int w = hwloc_bitmap_weight(o->cpuset);
        nd->cpus = calloc((size_t)ZO_MAX(w, 1), sizeof(int));
        if (!nd->cpus)
            return -ENOMEM;
        unsigned id;
        hwloc_bitmap_foreach_begin(id, o->cpuset)
        {
            if (cpu_allowed(t, (int)id))
                nd->cpus[nd->ncpus++] = (int)id;
        }
        hwloc_bitmap_foreach_end();
    }
    return 0;
}
#endif

static void free_nodes(zo_topo *t)
{
    for (int i = 0; i < t->nnodes && t->nodes; i++)
        free(t->nodes[i].cpus);
    free(t->nodes);
    t->nodes = NULL;
    t->nnodes = 0;
}

ZO_API int zo_topo_create(zo_topo **out)
{
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_topo_create: out is NULL");
    *out = NULL;
    zo_topo *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    int r = allowed_cpus(&t->all_cpus);
    if (r < 0) {
        free(t);
        return ZO_FAIL(NULL, r, "zo_topo_create: sched_getaffinity failed");
    }
    t->ncpus = r;
    r = -ENOTSUP;
#if ZO_HAVE_HWLOC
    /* ZO_TOPO=sysfs skips hwloc: tests run both readers, and it is a way
     * out if hwloc misreads a machine. */
    const char *force = getenv("ZO_TOPO");
    if (!force || strcmp(force, "sysfs") != 0)
        r = load_hwloc(t);
    if (r < 0) {
        ZO_LOGI("hwloc topology failed (%s); reading sysfs", zo_strerror(r));
        free_nodes(t);
        if (t->hw)
            hwloc_topology_destroy(t->hw);
        t->hw = NULL;
    }
#endif
    if (r < 0)
        r = load_sysfs(t);
    if (r < 0) {
        zo_topo_destroy(&t);
        return ZO_FAIL(NULL, r, "zo_topo_create: topology unreadable");
    }
    *out = t;
    return 0;
}

ZO_API void zo_topo_destroy(zo_topo **tp)
{
    if (!tp || !*tp)
        return;
    zo_topo *t = *tp;
    free_nodes(t);
#if ZO_HAVE_HWLOC
    if (t->hw)
        hwloc_topology_destroy(t->hw);
#endif
    free(t->all_cpus);
    free(t);
    *tp = NULL;
}

ZO_API const char *zo_topo_source(const zo_topo *t) { return t ? t->source : "?"; }
ZO_API int zo_topo_ncpus(const zo_topo *t) { return t ? t->ncpus : -EINVAL; }
ZO_API int zo_topo_ncores(const zo_topo *t) { return t ? t->ncores : -EINVAL; }
ZO_API int zo_topo_nnodes(const zo_topo *t) { return t ? t->nnodes : -EINVAL; }

ZO_API int zo_topo_node_id(const zo_topo *t, int idx)
{
    if (!t || idx < 0 || idx >= t->nnodes)
        return -EINVAL;
    return t->nodes[idx].id;
}

static const topo_node *find_node(const zo_topo *t, int node)
{
    for (int i = 0; t && i < t->nnodes; i++)
        if (t->nodes[i].id == node)
            return &t->nodes[i];
    return NULL;
}

ZO_API int zo_topo_node_cpus(const zo_topo *t, int node, int *cpus, int max)
{
    const topo_node *nd = find_node(t, node);
    if (!nd || max < 0 || (max > 0 && !cpus))
        return -EINVAL;
    for (int i = 0; i < nd->ncpus && i < max; i++)
        cpus[i] = nd->cpus[i];
    return nd->ncpus;
}

ZO_API int64_t zo_topo_node_memory(const zo_topo *t, int node)
{
    const topo_node *nd = find_node(t, node);
    return nd ? nd->memory : -EINVAL;
}

/* A sysfs numa_node value mapped to our convention: single-node -> 0. */
static int node_or_single(const zo_topo *t, int v)
{
    if (v >= 0 && find_node(t, v))
        return v;
    return t->nnodes == 1 ? t->nodes[0].id : -1;
}

static int normalize_busid(const char *in, char *out, size_t len)
{
    unsigned dom = 0, bus, dev, fn;
    char tail;
    if (sscanf(in, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) == 4) {
        /* full form */
    } else if (sscanf(in, "%x:%x.%x%c", &bus, &dev, &fn, &tail) == 3) {
        dom = 0;
    } else {
        return -EINVAL;
    }
    if (bus > 0xff || dev > 0x1f || fn > 7)
        return -EINVAL;
    snprintf(out, len, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
    return 0;
}

ZO_API int zo_topo_node_of_pci(const zo_topo *t, const char *bus_id)
{
    if (!t || !bus_id)
        return -EINVAL;
    char id[32];
    if (normalize_busid(bus_id, id, sizeof(id)) < 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_topo_node_of_pci: malformed PCI bus id '%s'", bus_id);
#if ZO_HAVE_HWLOC
    if (t->hw) {
        hwloc_obj_t o = hwloc_get_pcidev_by_busidstring(t->hw, id);
        if (o) {
            hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t->hw, o);
            if (a && a->nodeset && hwloc_bitmap_weight(a->nodeset) == 1)
                return node_or_single(t, hwloc_bitmap_first(a->nodeset));
        }
    }
#endif
    char path[96], buf[32];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", id);
    int r = zo__read_text(path, buf, sizeof(buf));
    if (r == -ENOENT) {
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", id);
        if (access(path, F_OK) != 0)
            return ZO_FAIL(NULL, -ENOENT, "zo_topo_node_of_pci: no PCI device %s", id);
        return node_or_single(t, -1);
    }
    if (r < 0)
        return r;
    return node_or_single(t, atoi(buf));
}

/* Walk up from a sysfs device directory to the first ancestor that states
 * a numa_node (the PCI function of the controller). */
static int numa_of_sysfs_dir(const char *dir)
{
    char cur[PATH_MAX];
    if (!realpath(dir, cur))
        return -errno;
    for (;;) {
        char path[PATH_MAX + 16], buf[32];
        snprintf(path, sizeof(path), "%s/numa_node", cur);
        if (zo__read_text(path, buf, sizeof(buf)) > 0)
            return atoi(buf);
        /* device-mapper / md: follow the first underlying device */
        snprintf(path, sizeof(path), "%s/slaves", cur);
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (e->d_name[0] == '.')
                    continue;
                char sub[PATH_MAX + 300];
                snprintf(sub, sizeof(sub), "%s/slaves/%s", cur, e->d_name);
                closedir(d);
                return numa_of_sysfs_dir(sub);
            }
            closedir(d);
        }
        char *slash = strrchr(cur, '/');
        if (!slash || slash == cur || !strcmp(cur, "/sys/devices"))
            return -1;
        *slash = '\0';
    }
}

ZO_API int zo_topo_node_of_path(const zo_topo *t, const char *path)
{
    if (!t || !path)
        return -EINVAL;
    struct stat st;
    if (stat(path, &st) != 0)
        return ZO_FAIL(NULL, -errno, "zo_topo_node_of_path: %s: %s", path, strerror(errno));
    char dir[96];
    snprintf(dir, sizeof(dir), "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
    if (access(dir, F_OK) != 0)
        return -1; /* not on a block device: tmpfs, overlay, nfs... */
    int v = numa_of_sysfs_dir(dir);
    return node_or_single(t, v);
}

static int bind_cpus(const int *cpus, int n)
{
    int maxc = -1;
    for (int i = 0; i < n; i++)
        maxc = ZO_MAX(maxc, cpus[i]);
    if (maxc < 0)
        return -EINVAL;
    cpu_set_t *set = CPU_ALLOC(maxc + 1);
    if (!set)
        return -ENOMEM;
    size_t sz = CPU_ALLOC_SIZE(maxc + 1);
    CPU_ZERO_S(sz, set);
    for (int i = 0; i < n; i++)
        if (cpus[i] >= 0)
            CPU_SET_S(cpus[i], sz, set);
    int r = 0;
    if (sched_setaffinity(0, sz, set) != 0)
        r = -errno;
    CPU_FREE(set);
    return r;
}

ZO_API int zo_topo_bind_thread(const zo_topo *t, int node)
{
    if (!t)
        return -EINVAL;
    if (node == -1)
        return bind_cpus(t->all_cpus, t->ncpus);
    const topo_node *nd = find_node(t, node);
    if (!nd)
        return ZO_FAIL(NULL, -EINVAL, "zo_topo_bind_thread: no NUMA node %d", node);
    if (nd->ncpus == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_topo_bind_thread: node %d has no CPUs this process may use", node);
    return bind_cpus(nd->cpus, nd->ncpus);
}

ZO_API int zo_topo_bind_thread_cpu(const zo_topo *t, int cpu)
{
    if (!t || !cpu_allowed(t, cpu))
        return ZO_FAIL(NULL, -EINVAL, "zo_topo_bind_thread_cpu: CPU %d not available", cpu);
    return bind_cpus(&cpu, 1);
}

ZO_API int zo_topo_bind_omp(const zo_topo *t, int node, int nthreads)
{
#if ZO_HAVE_OPENMP
    if (!t)
        return -EINVAL;
    const int *cpus = t->all_cpus;
    int n = t->ncpus;
    if (node != -1) {
        const topo_node *nd = find_node(t, node);
        if (!nd || nd->ncpus == 0)
            return ZO_FAIL(NULL, -EINVAL, "zo_topo_bind_omp: no usable NUMA node %d", node);
        cpus = nd->cpus;
        n = nd->ncpus;
    }
    int team = nthreads > 0 ? nthreads : n;
    int err = 0;
#pragma omp parallel num_threads(team)
    {
        int tid = omp_get_thread_num();
        int r = bind_cpus(&cpus[tid % n], 1);
        if (r < 0) {
#pragma omp atomic write
            err = r;
        }
    }
    return err < 0 ? err : team;
#else
    (void)t, (void)node, (void)nthreads;
    return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_topo_bind_omp: built without OpenMP");
#endif
}
