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
 * run on that stream. The synchronous callbacks wait before they return;
 * the asynchronous ones (start/wait) enqueue, record a CUDA event, and wait
 * for that event, so the engine keeps two gradient buckets in flight.
 *
 * The collectives:
 *   - reduce_scatter: one ncclReduce per chunk to its owner, in one NCCL
 *     group. ncclReduceScatter needs equal chunks, and the engine's last
 *     shard is shorter.
 *   - all_gather: one ncclBroadcast per chunk from its owner, in one group.
 *   - all_reduce: ncclAllReduce of doubles through a device scratch.
 *   bf16 and f16 sum as NCCL sums them.
 *
 * Errors: a failed NCCL or CUDA call returns -EIO. A wait polls its event
 * and ncclCommGetAsyncError(): an NCCL error, or no completion within
 * `timeout_s` seconds (a rank died or hangs: default 1800, 0 waits
 * forever), aborts the communicator (ncclCommAbort, which also frees the
 * kernels stuck waiting for the peer) and returns -EIO or -ETIMEDOUT;
 * every later call then fails at once (`broken`): the caller ends the
 * process, or makes a new communicator and a new engine.
 */
#ifndef ZOFFLOAD_COMM_NCCL_H
#define ZOFFLOAD_COMM_NCCL_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "part.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The NCCL side of a ::zo_comm: owned by the caller, alive while the engine is. */
/* A started collective: the event after it on the stream (reused). */
typedef struct zo__nccl_req {
    struct zo__nccl_req *next;
    cudaEvent_t ev;
} zo__nccl_req;

typedef struct zo_comm_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int world;
    double *scratch; /* device, for all_reduce */
    unsigned scratch_n;
    /** A wait gives up after this many seconds (zo_comm_nccl_init() sets
     *  1800; 0 waits forever): the communicator is aborted. */
    double timeout_s;
    /** Set once the communicator was aborted (a timeout, an NCCL error):
     *  every later call fails at once with -ETIMEDOUT or -EIO. */
    int broken;
    zo__nccl_req *free_reqs;
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

/* Record an event after what is queued on the stream: the request. */
static inline int zo__nccl_mark(zo_comm_nccl *m, void **req)
{
    zo__nccl_req *q = m->free_reqs;
    if (q) {
        m->free_reqs = q->next;
    } else {
        q = (zo__nccl_req *)calloc(1, sizeof(*q));
        if (!q)
            return -ENOMEM;
        if (cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming) != cudaSuccess) {
            free(q);
            return -EIO;
        }
    }
    if (cudaEventRecord(q->ev, m->stream) != cudaSuccess) {
        q->next = m->free_reqs;
        m->free_reqs = q;
        return -EIO;
    }
    *req = q;
    return 0;
}

/* Wait for a request's event: polled with the communicator's async error
 * and the deadline; on either the communicator is aborted. */
static inline int zo__nccl_wait(void *user, void *req)
{
    zo_comm_nccl *m = (zo_comm_nccl *)user;
    zo__nccl_req *q = (zo__nccl_req *)req;
    if (m->broken)
        return m->broken;
    int r = 0;
    if (m->timeout_s <= 0) {
        r = cudaEventSynchronize(q->ev) == cudaSuccess ? 0 : -EIO;
    } else {
        struct timespec t0, t;
        timespec_get(&t0, TIME_UTC);
        for (unsigned spin = 0;; spin++) {
            cudaError_t ce = cudaEventQuery(q->ev);
            if (ce == cudaSuccess)
                break;
            if (ce != cudaErrorNotReady) {
                r = -EIO;
                break;
            }
            if ((spin & 255) != 255)
                continue;
            ncclResult_t ae = ncclSuccess;
            if (ncclCommGetAsyncError(m->comm, &ae) != ncclSuccess || (ae != ncclSuccess && ae != ncclInProgress)) {
                r = -EIO;
                break;
            }
            timespec_get(&t, TIME_UTC);
            if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > m->timeout_s) {
                r = -ETIMEDOUT;
                break;
            }
        }
    }
    if (r < 0) {
        /* the kernels may wait for a peer forever: abort them (the request
         * stays with the aborted communicator's stream: not reused) */
        ncclCommAbort(m->comm);
        m->broken = r;
        return r;
    }
    q->next = m->free_reqs;
    m->free_reqs = q;
    return 0;
}

/* one NCCL call per chunk (reduce to, or broadcast from, its owner), queued */
static inline int zo__nccl_chunks_start(zo_comm_nccl *m, void *buf, const uint64_t *counts, zo_dtype dt, int reduce,
                                        void **req)
{
    ncclDataType_t t;
    size_t es;
    int r = zo__nccl_type(dt, &t, &es);
    if (r < 0)
        return r;
    if (m->broken)
        return m->broken;
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
    if (nr != ncclSuccess || ne != ncclSuccess)
        return -EIO;
    return zo__nccl_mark(m, req);
}

static inline int zo__nccl_reduce_scatter_start(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    return zo__nccl_chunks_start((zo_comm_nccl *)user, buf, counts, dt, 1, req);
}

static inline int zo__nccl_all_gather_start(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    return zo__nccl_chunks_start((zo_comm_nccl *)user, buf, counts, dt, 0, req);
}

static inline int zo__nccl_reduce_scatter(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    void *q;
    int r = zo__nccl_reduce_scatter_start(user, buf, counts, dt, &q);
    return r < 0 ? r : zo__nccl_wait(user, q);
}

static inline int zo__nccl_all_gather(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    void *q;
    int r = zo__nccl_all_gather_start(user, buf, counts, dt, &q);
    return r < 0 ? r : zo__nccl_wait(user, q);
}

static inline int zo__nccl_all_reduce(void *user, double *vals, unsigned n, int op)
{
    zo_comm_nccl *m = (zo_comm_nccl *)user;
    if (op != ZO_COMM_SUM && op != ZO_COMM_MAX)
        return -EINVAL;
    if (m->broken)
        return m->broken;
    if (n > m->scratch_n) {
        cudaFree(m->scratch);
        m->scratch = NULL;
        m->scratch_n = 0;
        if (cudaMalloc((void **)&m->scratch, (size_t)n * sizeof(double)) != cudaSuccess)
            return -ENOMEM;
        m->scratch_n = n;
    }
    size_t b = (size_t)n * sizeof(double);
    void *q;
    if (cudaMemcpyAsync(m->scratch, vals, b, cudaMemcpyHostToDevice, m->stream) != cudaSuccess ||
        ncclAllReduce(m->scratch, m->scratch, n, ncclFloat64, op == ZO_COMM_SUM ? ncclSum : ncclMax, m->comm,
                      m->stream) != ncclSuccess ||
        cudaMemcpyAsync(vals, m->scratch, b, cudaMemcpyDeviceToHost, m->stream) != cudaSuccess)
        return -EIO;
    int r = zo__nccl_mark(m, &q);
    return r < 0 ? r : zo__nccl_wait(m, q);
}

/** Free what zo_comm_nccl_init() made (not the comm or the stream: the caller's). */
static inline void zo_comm_nccl_free(zo_comm_nccl *m)
{
    cudaFree(m->scratch);
    m->scratch = NULL;
    m->scratch_n = 0;
    while (m->free_reqs) {
        zo__nccl_req *q = m->free_reqs;
        m->free_reqs = q->next;
        cudaEventDestroy(q->ev);
        free(q);
    }
}

/**
 * Fill *c with collectives over `comm` on `stream` (the caller's, both
 * alive while the engine is): rank and world from the communicator, the
 * synchronous and asynchronous callbacks, a 1800 s timeout (m->timeout_s).
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
    m->timeout_s = 1800;
    zo_comm_default(c);
    c->rank = (unsigned)rank;
    c->world = (unsigned)world;
    c->user = m;
    c->reduce_scatter = zo__nccl_reduce_scatter;
    c->all_gather = zo__nccl_all_gather;
    c->all_reduce = zo__nccl_all_reduce;
    c->reduce_scatter_start = zo__nccl_reduce_scatter_start;
    c->all_gather_start = zo__nccl_all_gather_start;
    c->wait = zo__nccl_wait;
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_COMM_NCCL_H */
