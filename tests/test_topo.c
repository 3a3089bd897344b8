/* SPDX-License-Identifier: Apache-2.0 */
/* Topology: counts against what the OS says, device-to-node lookups, and
 * thread / OpenMP-team binding checked through the real affinity. meson runs
 * it twice: with hwloc and with ZO_TOPO=sysfs. */
#include <dirent.h>
#include <sched.h>

#include "zo_test.h"

#include "core/internal.h"

#include <zoffload/zoffload.h>

#if ZO_HAVE_OPENMP
#include <omp.h>
#endif

static zo_topo *topo;

static void setup(void)
{
    ck_assert_int_eq(zo_topo_create(&topo), 0);
}

static void teardown(void)
{
    zo_topo_destroy(&topo);
    ck_assert_ptr_null(topo);
}

START_TEST(test_counts)
{
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    ck_assert_int_eq(zo_topo_ncpus(topo), CPU_COUNT(&set));
    ck_assert_int_ge(zo_topo_ncores(topo), 1);
    ck_assert_int_le(zo_topo_ncores(topo), zo_topo_ncpus(topo));
    int nn = zo_topo_nnodes(topo);
    ck_assert_int_ge(nn, 1);
    int total = 0;
    for (int i = 0; i < nn; i++) {
        int id = zo_topo_node_id(topo, i);
        ck_assert_int_ge(id, 0);
        int cpus[1024];
        int n = zo_topo_node_cpus(topo, id, cpus, 1024);
        ck_assert_int_ge(n, 0);
        for (int k = 0; k < n && k < 1024; k++)
            ck_assert(CPU_ISSET(cpus[k], &set));
        total += n;
        ck_assert_int_gt(zo_topo_node_memory(topo, id), 0);
    }
    ck_assert_int_eq(total, zo_topo_ncpus(topo));
    ck_assert_int_eq(zo_topo_node_id(topo, nn), -EINVAL);
    ck_assert_int_eq(zo_topo_node_cpus(topo, 9999, NULL, 0), -EINVAL);
    const char *want = getenv("ZO_TOPO");
    if (want && !strcmp(want, "sysfs"))
        ck_assert_str_eq(zo_topo_source(topo), "sysfs");
    else if (ZO_HAVE_HWLOC)
        ck_assert_str_eq(zo_topo_source(topo), "hwloc");
}
END_TEST

START_TEST(test_node_of_path)
{
    int n = zo_topo_node_of_path(topo, "/var/tmp");
    /* /var/tmp is on a block device on every machine we test on */
    ck_assert_int_ge(n, zo_topo_nnodes(topo) == 1 ? 0 : -1);
    ck_assert_int_eq(zo_topo_node_of_path(topo, "/nonexistent/zo"), -ENOENT);
    if (access("/proc/self", F_OK) == 0)
        ck_assert_int_eq(zo_topo_node_of_path(topo, "/proc/self"), -1); /* procfs: no block device */
    ck_assert_int_eq(zo_topo_node_of_path(topo, NULL), -EINVAL);
}
END_TEST

START_TEST(test_node_of_pci)
{
    ck_assert_int_eq(zo_topo_node_of_pci(topo, "not-a-bus-id"), -EINVAL);
    ck_assert_int_eq(zo_topo_node_of_pci(topo, "0000:ff:1f.9"), -EINVAL); /* function > 7 */
    ck_assert_int_eq(zo_topo_node_of_pci(topo, "7fff:fe:1f.7"), -ENOENT);
    DIR *d = opendir("/sys/bus/pci/devices");
    if (!d)
        return; /* no PCI bus (some VMs): nothing more to check */
    struct dirent *e;
    int checked = 0;
    while ((e = readdir(d)) && checked < 4) {
        if (e->d_name[0] == '.')
            continue;
        int n = zo_topo_node_of_pci(topo, e->d_name);
        if (zo_topo_nnodes(topo) == 1)
            ck_assert_int_eq(n, zo_topo_node_id(topo, 0));
        else
            ck_assert_int_ge(n, -1);
        /* the short form (domain 0) names the same device */
        if (!strncmp(e->d_name, "0000:", 5))
            ck_assert_int_eq(zo_topo_node_of_pci(topo, e->d_name + 5), n);
        checked++;
    }
    closedir(d);
}
END_TEST

START_TEST(test_bind_thread)
{
    int node = zo_topo_node_id(topo, 0);
    int cpus[1024];
    int n = zo_topo_node_cpus(topo, node, cpus, 1024);
    ck_assert_int_eq(zo_topo_bind_thread(topo, node), 0);
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    ck_assert_int_eq(CPU_COUNT(&set), n);
    int last = cpus[n - 1];
    ck_assert_int_eq(zo_topo_bind_thread_cpu(topo, last), 0);
    sched_getaffinity(0, sizeof(set), &set);
    ck_assert_int_eq(CPU_COUNT(&set), 1);
    ck_assert(CPU_ISSET(last, &set));
    sched_yield();
    ck_assert_int_eq(sched_getcpu(), last);
    ck_assert_int_eq(zo_topo_bind_thread(topo, -1), 0);
    sched_getaffinity(0, sizeof(set), &set);
    ck_assert_int_eq(CPU_COUNT(&set), zo_topo_ncpus(topo));
    ck_assert_int_eq(zo_topo_bind_thread(topo, 4000), -EINVAL);
    ck_assert_int_eq(zo_topo_bind_thread_cpu(topo, 100000), -EINVAL);
}
END_TEST

START_TEST(test_bind_omp)
{
#if ZO_HAVE_OPENMP
    int node = zo_topo_node_id(topo, 0);
    int cpus[1024];
    int n = zo_topo_node_cpus(topo, node, cpus, 1024);
    int team = zo_topo_bind_omp(topo, node, 0);
    ck_assert_int_eq(team, n);
    /* the same-sized team in this thread reuses the bound threads */
    int ok = 1;
#pragma omp parallel num_threads(team)
    {
        cpu_set_t set;
        sched_getaffinity(0, sizeof(set), &set);
        int tid = omp_get_thread_num();
        if (CPU_COUNT(&set) != 1 || !CPU_ISSET(cpus[tid % n], &set)) {
#pragma omp atomic write
            ok = 0;
        }
    }
    ck_assert_msg(ok, "an OpenMP thread is not bound to its CPU");
    ck_assert_int_eq(zo_topo_bind_omp(topo, 4000, 2), -EINVAL);
    /* more threads than CPUs wrap around */
    ck_assert_int_eq(zo_topo_bind_omp(topo, -1, zo_topo_ncpus(topo) + 1), zo_topo_ncpus(topo) + 1);
#else
    ck_assert_int_eq(zo_topo_bind_omp(topo, -1, 2), ZO_ENOTSUP);
#endif
}
END_TEST

START_TEST(test_cpulist)
{
    int ids[16];
    ck_assert_int_eq(zo__parse_cpulist("0-3,8,10-11", ids, 16), 7);
    ck_assert_int_eq(ids[0], 0);
    ck_assert_int_eq(ids[3], 3);
    ck_assert_int_eq(ids[4], 8);
    ck_assert_int_eq(ids[6], 11);
    ck_assert_int_eq(zo__parse_cpulist("5", ids, 16), 1);
    ck_assert_int_eq(zo__parse_cpulist("0-99", ids, 16), 100); /* count beyond max */
    ck_assert_int_eq(zo__parse_cpulist("3-1", ids, 16), -EINVAL);
    ck_assert_int_eq(zo__parse_cpulist("a", ids, 16), -EINVAL);
    ck_assert_int_eq(zo__parse_cpulist("1,,2", ids, 16), -EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("topo");
    TCase *tc = tcase_create("topo");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_counts);
    tcase_add_test(tc, test_node_of_path);
    tcase_add_test(tc, test_node_of_pci);
    tcase_add_test(tc, test_bind_thread);
    tcase_add_test(tc, test_bind_omp);
    tcase_add_test(tc, test_cpulist);
    suite_add_tcase(s, tc);
    return zo_test_run(s);
}
