/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file comm_nccl.h
 * @brief ::zo_comm over NCCL, for ranks on the CUDA backend (the engine's
 *        buffers are device memory).
 *
 * Header-only, as comm_mpi.h: the program includes it and links its NCCL
 * and CUDA runtime (`-lnccl -lcudart`); libzoffload links no NCCL. The
 * caller makes the ncclComm_t (ncclCommInitRank with an id its launcher
 * shares, or ncclCommInitAll in one process) and a stream; the collectives
 * run on that stream and are waited for before each callback returns (the
 * engine's callbacks are synchronous).
 *
 * The collectives:
 *   - reduce_scatter: one ncclReduce per chunk to its owner, in one NCCL
 *     group. ncclReduceScatter needs equal chunks, and the engine's last
 *     shard is shorter.
 *   - all_gather: one ncclBroadcast per chunk from its owner, in one group.
 *   - all_reduce: ncclAllReduce of doubles through a device scratch.
 *   bf16 and f16 sum as NCCL sums them.
 *
 * Errors: a failed NCCL or CUDA call returns -EIO. A rank that dies leaves
 * the others blocked in NCCL; ncclCommAbort() from a watchdog thread is the
 * caller's timeout (NCCL's own, NCCL_TIMEOUT, where set).
 */
#ifndef ZOFFLOAD_COMM_NCCL_H
#define ZOFFLOAD_COMM_NCCL_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "part.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The NCCL side of a ::zo_comm: owned by the caller, alive while the engine is. */
typedef struct zo_comm_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int world;
    double *scratch; /* device, for all_reduce */
    unsigned scratch_n;
} zo_comm_nccl;

static inline int zo__nccl_type(zo_dtype dt, ncclDataType_t *t, size_t *es)
{
    switch (dt) {
    case ZO_DTYPE_F32: *t = ncclFloat32; *es = 4; return 0;
    case ZO_DTYPE_F64: *t = ncclFloat64; *es = 8; return 0;
    case ZO_DTYPE_F16: *t = ncclFloat16; *es = 2; return 0;
    case ZO_DTYPE_BF16: *t = ncclBfloat16; *es = 2; return 0;
    default: return -ENOTSUP;
    }
}

/* one NCCL call per chunk (reduce to, or broadcast from, its owner) */
static inline int zo__nccl_chunks(zo_comm_nccl *m, void *buf, const uint64_t *counts, zo_dtype dt, int reduce)
{
    ncclDataType_t t;
    size_t es;
    int r = zo__nccl_type(dt, &t, &es);
    if (r < 0)
        return r;
    ncclResult_t nr = ncclGroupStart();
    uint64_t off = 0;
    for (int k = 0; k < m->world && nr == ncclSuccess; k++) {
        char *p = (char *)buf + off * es;
        if (counts[k])
            nr = reduce ? ncclReduce(p, p, (size_t)counts[k], t, ncclSum, k, m->comm, m->stream)
                        : ncclBroadcast(p, p, (size_t)counts[k], t, k, m->comm, m->stream);
        off += counts[k];
    }
    ncclResult_t ne = ncclGroupEnd();
    if (nr != ncclSuccess || ne != ncclSuccess || cudaStreamSynchronize(m->stream) != cudaSuccess)
        return -EIO;
    return 0;
}

static inline int zo__nccl_reduce_scatter(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    return zo__nccl_chunks((zo_comm_nccl *)user, buf, counts, dt, 1);
}

static inline int zo__nccl_all_gather(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    return zo__nccl_chunks((zo_comm_nccl *)user, buf, counts, dt, 0);
}

static inline int zo__nccl_all_reduce(void *user, double *vals, unsigned n, int op)
{
    zo_comm_nccl *m = (zo_comm_nccl *)user;
    if (op != ZO_COMM_SUM && op != ZO_COMM_MAX)
        return -EINVAL;
    if (n > m->scratch_n) {
        cudaFree(m->scratch);
        m->scratch = NULL;
        m->scratch_n = 0;
        if (cudaMalloc((void **)&m->scratch, (size_t)n * sizeof(double)) != cudaSuccess)
            return -ENOMEM;
        m->scratch_n = n;
    }
    size_t b = (size_t)n * sizeof(double);
    if (cudaMemcpyAsync(m->scratch, vals, b, cudaMemcpyHostToDevice, m->stream) != cudaSuccess ||
        ncclAllReduce(m->scratch, m->scratch, n, ncclFloat64, op == ZO_COMM_SUM ? ncclSum : ncclMax, m->comm,
                      m->stream) != ncclSuccess ||
        cudaMemcpyAsync(vals, m->scratch, b, cudaMemcpyDeviceToHost, m->stream) != cudaSuccess ||
        cudaStreamSynchronize(m->stream) != cudaSuccess)
        return -EIO;
    return 0;
}

/** Free what zo_comm_nccl_init() made (not the comm or the stream: the caller's). */
static inline void zo_comm_nccl_free(zo_comm_nccl *m)
{
    cudaFree(m->scratch);
    m->scratch = NULL;
    m->scratch_n = 0;
}

/**
 * Fill *c with collectives over `comm` on `stream` (the caller's, both
 * alive while the engine is): rank and world from the communicator.
 * @return 0; -EIO (an NCCL query failed).
 */
static inline int zo_comm_nccl_init(zo_comm *c, zo_comm_nccl *m, ncclComm_t comm, cudaStream_t stream)
{
    int rank, world;
    memset(m, 0, sizeof(*m));
    if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &world) != ncclSuccess)
        return -EIO;
    m->comm = comm;
    m->stream = stream;
    m->world = world;
    zo_comm_default(c);
    c->rank = (unsigned)rank;
    c->world = (unsigned)world;
    c->user = m;
    c->reduce_scatter = zo__nccl_reduce_scatter;
    c->all_gather = zo__nccl_all_gather;
    c->all_reduce = zo__nccl_all_reduce;
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_COMM_NCCL_H */
