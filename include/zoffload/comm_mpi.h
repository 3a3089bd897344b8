/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file comm_mpi.h
 * @brief ::zo_comm over MPI, for a program that runs one rank per process
 *        under mpirun (the host backend: buffers in host memory).
 *
 * Header-only on purpose: the program includes it and is built with its
 * MPI (mpicc, or `dependency('mpi')`); libzoffload itself links no MPI, so
 * one library serves Open MPI, MPICH and programs without MPI, whose
 * MPI_Comm types and ABIs differ.
 *
 * @code
 *   MPI_Init(&argc, &argv);
 *   zo_comm comm;
 *   zo_comm_mpi mc;
 *   zo_comm_mpi_init(&comm, &mc, MPI_COMM_WORLD);   // rank, world, callbacks
 *   zo_part_config pc;
 *   zo_part_config_default(&pc);
 *   pc.optim = &template_cfg;
 *   pc.comm = &comm;
 *   zo_part_create(&part, &pc);
 *   ...
 *   zo_part_destroy(&part);
 *   zo_comm_mpi_free(&mc);
 *   MPI_Finalize();
 * @endcode
 *
 * The collectives:
 *   - reduce_scatter, ordered (the default, `ordered` 1): MPI_Alltoallv
 *     brings every rank's copy of this rank's chunk here, and they are
 *     summed in rank order (0, 1, ...), f32 / bf16 / f16 in an fp32
 *     accumulator rounded once to the dtype at the end, f64 in double. The
 *     result is the same bits whatever MPI library, algorithm or process
 *     placement runs it, so a run is reproducible and checkable against a
 *     single rank (zo-train --verify under mpirun). It moves the same bytes
 *     as a ring reduce-scatter ((world - 1) chunks out and in per rank) and
 *     needs world chunks of scratch (about one bucket).
 *   - reduce_scatter, `ordered` 0: MPI_Reduce_scatter in place, then the
 *     rank's result is moved from the buffer's start to its chunk; MPI
 *     picks the order of the sums (with more than 2 ranks the last bits
 *     then depend on its algorithm).
 *   - all_gather: MPI_Allgatherv in place.
 *   - all_reduce: max: MPI_Allreduce of doubles; sum: ordered, an
 *     MPI_Allgather and the sum in rank order (0 + ... in double); not
 *     ordered, MPI_Allreduce.
 *   f32 and f64 are summed by MPI_SUM. bf16 and f16 are summed by an
 *   MPI_Op of this header, one element at a time: widen both to fp32
 *   (zo_vec_cast), add, round to nearest even, as NCCL sums half types.
 *
 * Limits:
 *   - A chunk of more than INT_MAX elements is refused with -EOVERFLOW:
 *     MPI counts are int, and the engine's buckets are far smaller.
 *   - MPI's default error handler aborts the job when a rank dies; the
 *     engine's "fail within a timeout" needs a comm that can time out
 *     (MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN) turns MPI errors
 *     into -EIO here, but a dead peer may still hang some MPI libraries).
 */
#ifndef ZOFFLOAD_COMM_MPI_H
#define ZOFFLOAD_COMM_MPI_H

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "part.h"
#include "vec.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The MPI side of a ::zo_comm: owned by the caller, alive while the engine is. */
typedef struct zo_comm_mpi {
    MPI_Comm comm;
    int world;
    int *counts, *displs; /* [world] scratch of the collectives */
    int *rcounts, *rdispls; /* [world] the ordered reduce-scatter's receive side */
    void *scratch;        /* the ordered reduce-scatter: world copies of this rank's chunk */
    size_t scratch_bytes;
    int ordered;          /* 1 (set by zo_comm_mpi_init): reduce-scatter sums in rank order */
    MPI_Op bf16_sum, f16_sum;
} zo_comm_mpi;

/* Half-precision sums: widen, add in fp32, round back (one rounding per add). */
static inline void zo__mpi_half_sum(void *in, void *inout, int len, zo_dtype dt)
{
    float a[512], b[512];
    for (int i = 0; i < len; i += 512) {
        int k = len - i < 512 ? len - i : 512;
        zo_vec_cast(a, ZO_DTYPE_F32, (const uint16_t *)in + i, dt, (size_t)k);
        zo_vec_cast(b, ZO_DTYPE_F32, (const uint16_t *)inout + i, dt, (size_t)k);
        for (int j = 0; j < k; j++)
            b[j] += a[j];
        zo_vec_cast((uint16_t *)inout + i, dt, b, ZO_DTYPE_F32, (size_t)k);
    }
}

static inline void zo__mpi_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    zo__mpi_half_sum(in, inout, *len, ZO_DTYPE_BF16);
}

static inline void zo__mpi_f16_sum(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    zo__mpi_half_sum(in, inout, *len, ZO_DTYPE_F16);
}

/* MPI type and op of dt; -ENOTSUP for a dtype the engine never reduces. */
static inline int zo__mpi_type(const zo_comm_mpi *m, zo_dtype dt, MPI_Datatype *type, MPI_Op *op, size_t *es)
{
    switch (dt) {
    case ZO_DTYPE_F32: *type = MPI_FLOAT; *op = MPI_SUM; *es = 4; return 0;
    case ZO_DTYPE_F64: *type = MPI_DOUBLE; *op = MPI_SUM; *es = 8; return 0;
    case ZO_DTYPE_BF16: *type = MPI_UINT16_T; *op = m->bf16_sum; *es = 2; return 0;
    case ZO_DTYPE_F16: *type = MPI_UINT16_T; *op = m->f16_sum; *es = 2; return 0;
    default: return -ENOTSUP;
    }
}

/* counts (elements) -> int counts and displacements; -EOVERFLOW past int. */
static inline int zo__mpi_layout(zo_comm_mpi *m, const uint64_t *counts)
{
    uint64_t off = 0;
    for (int r = 0; r < m->world; r++) {
        if (counts[r] > INT_MAX || off > INT_MAX)
            return -EOVERFLOW;
        m->counts[r] = (int)counts[r];
        m->displs[r] = (int)off;
        off += counts[r];
    }
    return 0;
}

/* Scratch for world copies of n elements of es bytes; -EOVERFLOW past
 * MPI's int counts. */
static inline int zo__mpi_scratch(zo_comm_mpi *m, size_t n, size_t es)
{
    size_t need = n * es * (size_t)m->world;
    if (n * (size_t)m->world > INT_MAX)
        return -EOVERFLOW;
    if (need > m->scratch_bytes) {
        void *s = realloc(m->scratch, need);
        if (!s)
            return -ENOMEM;
        m->scratch = s;
        m->scratch_bytes = need;
    }
    return 0;
}

/* The ordered reduce-scatter: every rank's copy of this rank's chunk here
 * (MPI_Alltoallv), summed in rank order. */
static inline int zo__mpi_reduce_scatter_ordered(zo_comm_mpi *m, void *buf, int rank, MPI_Datatype type, size_t es,
                                                 zo_dtype dt)
{
    size_t c = (size_t)m->counts[rank];
    int r = zo__mpi_scratch(m, c, es);
    if (r < 0)
        return r;
    for (int k = 0; k < m->world; k++) {
        m->rcounts[k] = (int)c;
        m->rdispls[k] = (int)c * k; /* c * world <= the bucket's elements: an int */
    }
    if (MPI_Alltoallv(buf, m->counts, m->displs, type, m->scratch, m->rcounts, m->rdispls, type, m->comm) !=
        MPI_SUCCESS)
        return -EIO;
    char *out = (char *)buf + (size_t)m->displs[rank] * es;
    const char *in = (const char *)m->scratch;
    if (dt == ZO_DTYPE_F64) {
        for (size_t i = 0; i < c; i++) {
            double a = 0;
            for (int k = 0; k < m->world; k++)
                a += ((const double *)in)[(size_t)k * c + i];
            ((double *)out)[i] = a;
        }
        return 0;
    }
    float acc[512], v[512];
    for (size_t i = 0; i < c; i += 512) {
        size_t n = c - i < 512 ? c - i : 512;
        zo_vec_cast(acc, ZO_DTYPE_F32, in + i * es, dt, n);
        for (int k = 1; k < m->world; k++) {
            zo_vec_cast(v, ZO_DTYPE_F32, in + ((size_t)k * c + i) * es, dt, n);
            for (size_t j = 0; j < n; j++)
                acc[j] += v[j];
        }
        zo_vec_cast(out + i * es, dt, acc, ZO_DTYPE_F32, n);
    }
    return 0;
}

static inline int zo__mpi_reduce_scatter(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    zo_comm_mpi *m = (zo_comm_mpi *)user;
    MPI_Datatype type;
    MPI_Op op;
    size_t es;
    int rank, r = zo__mpi_type(m, dt, &type, &op, &es);
    if (r < 0 || (r = zo__mpi_layout(m, counts)) < 0)
        return r;
    MPI_Comm_rank(m->comm, &rank);
    if (m->ordered)
        return zo__mpi_reduce_scatter_ordered(m, buf, rank, type, es, dt);
    if (MPI_Reduce_scatter(MPI_IN_PLACE, buf, m->counts, type, op, m->comm) != MPI_SUCCESS)
        return -EIO;
    /* in place, MPI leaves this rank's result at the start of buf */
    if (m->displs[rank] && m->counts[rank])
        memmove((char *)buf + (size_t)m->displs[rank] * es, buf, (size_t)m->counts[rank] * es);
    return 0;
}

static inline int zo__mpi_all_gather(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    zo_comm_mpi *m = (zo_comm_mpi *)user;
    MPI_Datatype type;
    MPI_Op op;
    size_t es;
    int r = zo__mpi_type(m, dt, &type, &op, &es);
    if (r < 0 || (r = zo__mpi_layout(m, counts)) < 0)
        return r;
    if (MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, m->counts, m->displs, type, m->comm) != MPI_SUCCESS)
        return -EIO;
    return 0;
}

static inline int zo__mpi_all_reduce(void *user, double *vals, unsigned n, int op)
{
    zo_comm_mpi *m = (zo_comm_mpi *)user;
    if (n > INT_MAX || (op != ZO_COMM_SUM && op != ZO_COMM_MAX))
        return -EINVAL;
    if (m->ordered && op == ZO_COMM_SUM) {
        /* every rank's values here, summed in rank order: the same bits
         * whatever MPI's algorithm (a norm's partial sums, a loss) */
        int r = zo__mpi_scratch(m, n, 8);
        if (r < 0)
            return r;
        if (MPI_Allgather(vals, (int)n, MPI_DOUBLE, m->scratch, (int)n, MPI_DOUBLE, m->comm) != MPI_SUCCESS)
            return -EIO;
        const double *all = (const double *)m->scratch;
        for (unsigned i = 0; i < n; i++) {
            double a = all[i];
            for (int k = 1; k < m->world; k++)
                a += all[(size_t)k * n + i];
            vals[i] = a;
        }
        return 0;
    }
    if (MPI_Allreduce(MPI_IN_PLACE, vals, (int)n, MPI_DOUBLE, op == ZO_COMM_SUM ? MPI_SUM : MPI_MAX, m->comm) !=
        MPI_SUCCESS)
        return -EIO;
    return 0;
}

/** Free what zo_comm_mpi_init() made (before MPI_Finalize). */
static inline void zo_comm_mpi_free(zo_comm_mpi *m)
{
    if (m->counts && m->bf16_sum != MPI_OP_NULL)
        MPI_Op_free(&m->bf16_sum);
    if (m->counts && m->f16_sum != MPI_OP_NULL)
        MPI_Op_free(&m->f16_sum);
    free(m->counts);
    free(m->displs);
    free(m->rcounts);
    free(m->rdispls);
    free(m->scratch);
    m->counts = m->displs = m->rcounts = m->rdispls = NULL;
    m->scratch = NULL;
    m->scratch_bytes = 0;
}

/**
 * Fill *c with collectives over `comm` (MPI must be initialized): rank and
 * world from the communicator, `m` as the callbacks' user data; the
 * reduce-scatter ordered (set m->ordered = 0 afterwards for MPI's own). Not
 * collective. @return 0; -ENOMEM; -EIO (an MPI call failed).
 */
static inline int zo_comm_mpi_init(zo_comm *c, zo_comm_mpi *m, MPI_Comm comm)
{
    int rank, world;
    memset(m, 0, sizeof(*m));
    m->bf16_sum = m->f16_sum = MPI_OP_NULL;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &world) != MPI_SUCCESS)
        return -EIO;
    m->comm = comm;
    m->world = world;
    m->ordered = 1;
    m->counts = (int *)calloc((size_t)world, sizeof(int));
    m->displs = (int *)calloc((size_t)world, sizeof(int));
    m->rcounts = (int *)calloc((size_t)world, sizeof(int));
    m->rdispls = (int *)calloc((size_t)world, sizeof(int));
    if (!m->counts || !m->displs || !m->rcounts || !m->rdispls) {
        free(m->counts);
        free(m->displs);
        free(m->rcounts);
        free(m->rdispls);
        return -ENOMEM;
    }
    /* commutative: MPI may combine the ranks in any order */
    if (MPI_Op_create(zo__mpi_bf16_sum, 1, &m->bf16_sum) != MPI_SUCCESS ||
        MPI_Op_create(zo__mpi_f16_sum, 1, &m->f16_sum) != MPI_SUCCESS) {
        zo_comm_mpi_free(m);
        return -EIO;
    }
    zo_comm_default(c);
    c->rank = (unsigned)rank;
    c->world = (unsigned)world;
    c->user = m;
    c->reduce_scatter = zo__mpi_reduce_scatter;
    c->all_gather = zo__mpi_all_gather;
    c->all_reduce = zo__mpi_all_reduce;
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_COMM_MPI_H */
