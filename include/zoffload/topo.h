/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file topo.h
 * @brief Machine topology: cores, NUMA nodes, which node is nearest a GPU or
 *        the block device behind a path, and binding threads to a node.
 *
 * Read with hwloc when the build has it, otherwise from sysfs
 * (/sys/devices/system/{cpu,node}); a machine without NUMA information is
 * one node 0 holding every CPU this process may run on. The environment
 * variable ZO_TOPO=sysfs skips hwloc. A zo_topo is
 * immutable after creation and may be shared by any number of threads.
 */
#ifndef ZOFFLOAD_TOPO_H
#define ZOFFLOAD_TOPO_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_topo zo_topo;

/**
 * Discover the topology. Costs milliseconds (hwloc walks sysfs): create one
 * and keep it.
 * @return 0, -EINVAL (out NULL), -ENOMEM, or -errno from sysfs.
 */
ZO_API int zo_topo_create(zo_topo **out);
/** Destroy; NULL ok; clears *t. */
ZO_API void zo_topo_destroy(zo_topo **t);

/** "hwloc" or "sysfs". */
ZO_API const char *zo_topo_source(const zo_topo *t);

/** Logical CPUs (hardware threads) this process may run on. */
ZO_API int zo_topo_ncpus(const zo_topo *t);
/** Physical cores among those CPUs. */
ZO_API int zo_topo_ncores(const zo_topo *t);
/** NUMA nodes (at least 1). Node ids are 0..n-1 as the OS numbers them,
 *  except that a machine with holes in its numbering is compacted. */
ZO_API int zo_topo_nnodes(const zo_topo *t);

/**
 * The OS node id of compacted node index `idx` (0..nnodes-1).
 * @return node id >= 0, or -EINVAL.
 */
ZO_API int zo_topo_node_id(const zo_topo *t, int idx);

/**
 * CPUs of node `node` (OS id). Writes up to `max` CPU ids into `cpus`.
 * @return number of CPUs in the node (may exceed max), or -EINVAL.
 */
ZO_API int zo_topo_node_cpus(const zo_topo *t, int node, int *cpus, int max);

/** Memory of node `node` in bytes (0 if unknown), or -EINVAL as (int64) */
ZO_API int64_t zo_topo_node_memory(const zo_topo *t, int node);

/**
 * The NUMA node nearest a PCI device, given its bus id ("0000:3b:00.0",
 * case-insensitive; the short "3b:00.0" form assumes domain 0).
 * @return node id >= 0 (always 0 on a single-node machine), -1 if a
 *         multi-node platform does not say, -EINVAL (malformed id), -ENOENT
 *         (no such device).
 */
ZO_API int zo_topo_node_of_pci(const zo_topo *t, const char *bus_id);

/**
 * The NUMA node nearest the block device holding `path` (a file or
 * directory that exists). Follows partitions to their disk and the disk to
 * its PCI controller.
 * @return node id >= 0 (0 on a single-node machine when the path is on a
 *         block device); -1 if no block device backs the path (tmpfs,
 *         overlay, network filesystems) or a multi-node platform does not
 *         say; -ENOENT (path missing) or another -errno.
 */
ZO_API int zo_topo_node_of_path(const zo_topo *t, const char *path);

/**
 * Bind the calling thread to the CPUs of `node` (-1: all CPUs of the
 * process's original affinity).
 * @return 0, -EINVAL (unknown node), or -errno from sched_setaffinity.
 */
ZO_API int zo_topo_bind_thread(const zo_topo *t, int node);

/**
 * Bind the calling thread to one CPU (OS id).
 * @return 0, -EINVAL, or -errno.
 */
ZO_API int zo_topo_bind_thread_cpu(const zo_topo *t, int cpu);

/**
 * Bind an OpenMP team: runs a parallel region of `nthreads` threads (<= 0:
 * as many as the node has CPUs) that each bind themselves, thread i to CPU
 * i mod n of `node` (-1: of the whole process). The OpenMP runtime reuses
 * its threads, so later regions of the same size in the calling thread run
 * bound. Returns the team size used.
 * @return team size > 0, ZO_ENOTSUP (built without OpenMP), -EINVAL, or
 *         -errno from sched_setaffinity (a thread could not bind).
 */
ZO_API int zo_topo_bind_omp(const zo_topo *t, int node, int nthreads);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_TOPO_H */
