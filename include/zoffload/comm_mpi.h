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
 * The collectives are MPI's nonblocking ones (MPI_Ialltoallv,
 * MPI_Iallgatherv, ...), also behind the synchronous callbacks, so that
 * each can give up after `timeout_s` (below). The engine uses the
 * asynchronous callbacks (start/wait) for gradient buckets and the params'
 * all-gathers: a bucket moves while the next one fills.
 *   - reduce_scatter, ordered (the default, `ordered` 1): MPI_Ialltoallv
 *     brings every rank's copy of this rank's chunk here, and they are
 *     summed in rank order (0, 1, ...), f32 / bf16 / f16 in an fp32
 *     accumulator rounded once to the dtype at the end, f64 in double. The
 *     result is the same bits whatever MPI library, algorithm or process
 *     placement runs it, so a run is reproducible and checkable against a
 *     single rank (zo-train --verify under mpirun). It moves the same bytes
 *     as a ring reduce-scatter ((world - 1) chunks out and in per rank) and
 *     needs world chunks of scratch (about one bucket).
 *   - reduce_scatter, `ordered` 0: MPI_Ireduce_scatter in place, then the
 *     rank's result is moved from the buffer's start to its chunk; MPI
 *     picks the order of the sums (with more than 2 ranks the last bits
 *     then depend on its algorithm).
 *   - all_gather: MPI_Iallgatherv in place.
 *   - all_reduce: max: MPI_Iallreduce of doubles; sum: ordered, an
 *     MPI_Iallgather and the sum in rank order (0 + ... in double); not
 *     ordered, MPI_Iallreduce.
 *   f32 and f64 are summed by MPI_SUM. bf16 and f16 are summed by an
 *   MPI_Op of this header, one element at a time: widen both to fp32
 *   (zo_vec_cast), add, round to nearest even, as NCCL sums half types.
 *
 * Limits:
 *   - A chunk of more than INT_MAX elements is refused with -EOVERFLOW:
 *     MPI counts are int, and the engine's buckets are far smaller.
 *   - Failures: a rank that dies usually ends the job through the launcher
 *     (mpirun terminates the others). A rank that hangs, is stopped
 *     (SIGSTOP) or dies where the launcher does not notice leaves the
 *     others waiting in a collective: each wait gives up after
 *     `timeout_s` seconds (1800 by default, torch.distributed's; 0 waits
 *     forever) with -ETIMEDOUT, the engine's call fails with a message
 *     naming the collective, and every later call fails at once
 *     (`timed_out`): MPI still holds the abandoned request, so the process
 *     should report and exit (not MPI_Finalize, which may wait for it).
 *     The wait polls MPI_Test, as MPI_Wait's own progress loop does.
 *     MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN) turns other MPI
 *     errors into -EIO here.
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

/* One collective in flight: MPI needs its count arrays and buffers until
 * it completes. Kept on a free list for reuse (the scratch is about a
 * bucket). */
typedef struct zo__mpi_req {
    struct zo__mpi_req *next;    /* the free list */
    MPI_Request req;
    int kind;                    /* ZO__MPI_* */
    void *buf;                   /* the engine's buffer */
    zo_dtype dt;
    size_t es, c, off;           /* element size; this rank's chunk: elements, element offset */
    int *counts, *displs, *rcounts, *rdispls; /* [world] each */
    void *scratch;               /* ordered reduce-scatter: world copies of the chunk; sum: world x n doubles */
    size_t scratch_bytes;
    double *vals;                /* all_reduce: the caller's values */
    unsigned n;
} zo__mpi_req;

#define ZO__MPI_RS_ORDERED 0 /* wait: sum the received copies in rank order */
#define ZO__MPI_RS_MPI 1     /* wait: move the result from the buffer's start to the chunk */
#define ZO__MPI_PLAIN 2      /* all-gather, MPI's all-reduce: nothing to do after */
#define ZO__MPI_SUM 3        /* ordered sum all-reduce: sum the gathered values */

/** The MPI side of a ::zo_comm: owned by the caller, alive while the engine is. */
typedef struct zo_comm_mpi {
    MPI_Comm comm;
    int world, rank;
    int ordered;          /* 1 (set by zo_comm_mpi_init): reduce-scatter and sum in rank order */
    /** A collective this rank waits for longer than this many seconds fails
     *  with -ETIMEDOUT (a rank died, hangs or stopped): zo_comm_mpi_init()
     *  sets 1800 (torch.distributed's default), 0 waits forever. */
    double timeout_s;
    /** Set when a collective timed out: the ranks are out of step and MPI
     *  still holds that request, so every later call fails at once with
     *  -ETIMEDOUT (end the process; MPI cannot be recovered). */
    int timed_out;
    zo__mpi_req *free_reqs;
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

/* A request from the free list (or new); NULL: out of memory. */
static inline zo__mpi_req *zo__mpi_req_get(zo_comm_mpi *m)
{
    zo__mpi_req *q = m->free_reqs;
    if (q) {
        m->free_reqs = q->next;
        return q;
    }
    q = (zo__mpi_req *)calloc(1, sizeof(*q));
    int *a = (int *)calloc((size_t)m->world * 4, sizeof(int));
    if (!q || !a) {
        free(q);
        free(a);
        return NULL;
    }
    q->counts = a;
    q->displs = a + m->world;
    q->rcounts = a + 2 * m->world;
    q->rdispls = a + 3 * m->world;
    return q;
}

static inline void zo__mpi_req_put(zo_comm_mpi *m, zo__mpi_req *q)
{
    q->next = m->free_reqs;
    m->free_reqs = q;
}

/* The request's scratch: at least `need` bytes. */
static inline int zo__mpi_req_scratch(zo__mpi_req *q, size_t need)
{
    if (need > q->scratch_bytes) {
        void *s = realloc(q->scratch, need);
        if (!s)
            return -ENOMEM;
        q->scratch = s;
        q->scratch_bytes = need;
    }
    return 0;
}

/* counts (elements) -> the request's int counts and displacements, and this
 * rank's chunk; -EOVERFLOW past MPI's int counts. */
static inline int zo__mpi_layout(zo_comm_mpi *m, zo__mpi_req *q, const uint64_t *counts)
{
    uint64_t off = 0;
    for (int r = 0; r < m->world; r++) {
        if (counts[r] > INT_MAX || off > INT_MAX)
            return -EOVERFLOW;
        q->counts[r] = (int)counts[r];
        q->displs[r] = (int)off;
        off += counts[r];
    }
    q->c = (size_t)counts[m->rank];
    q->off = (size_t)q->displs[m->rank];
    return 0;
}

/* Wait for q's MPI request: MPI_Test until it is done or timeout_s has
 * passed (then -ETIMEDOUT, and the comm is marked timed out). */
static inline int zo__mpi_wait_mpi(zo_comm_mpi *m, MPI_Request *rq)
{
    if (m->timed_out)
        return -ETIMEDOUT;
    if (m->timeout_s <= 0)
        return MPI_Wait(rq, MPI_STATUS_IGNORE) == MPI_SUCCESS ? 0 : -EIO;
    double deadline = MPI_Wtime() + m->timeout_s;
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        if (MPI_Test(rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return -EIO;
        if (done)
            return 0;
        /* MPI_Test drives MPI's progress, as MPI_Wait's own polling does;
         * the clock is read every 64 tests */
        if ((spin & 63) == 63 && MPI_Wtime() > deadline) {
            m->timed_out = 1;
            return -ETIMEDOUT;
        }
    }
}

/* The work after a request completes; the request back to the free list.
 * A request whose wait failed stays MPI's (never reused or freed). */
static inline int zo__mpi_finish(zo_comm_mpi *m, zo__mpi_req *q)
{
    int r = zo__mpi_wait_mpi(m, &q->req);
    if (r < 0)
        return r;
    if (q->kind == ZO__MPI_RS_ORDERED) {
        size_t c = q->c, es = q->es;
        char *out = (char *)q->buf + q->off * es;
        const char *in = (const char *)q->scratch;
        if (q->dt == ZO_DTYPE_F64) {
            for (size_t i = 0; i < c; i++) {
                double a = 0;
                for (int k = 0; k < m->world; k++)
                    a += ((const double *)in)[(size_t)k * c + i];
                ((double *)out)[i] = a;
            }
        } else {
            float acc[512], v[512];
            for (size_t i = 0; i < c; i += 512) {
                size_t n = c - i < 512 ? c - i : 512;
                zo_vec_cast(acc, ZO_DTYPE_F32, in + i * es, q->dt, n);
                for (int k = 1; k < m->world; k++) {
                    zo_vec_cast(v, ZO_DTYPE_F32, in + ((size_t)k * c + i) * es, q->dt, n);
                    for (size_t j = 0; j < n; j++)
                        acc[j] += v[j];
                }
                zo_vec_cast(out + i * es, q->dt, acc, ZO_DTYPE_F32, n);
            }
        }
    } else if (q->kind == ZO__MPI_RS_MPI) {
        /* in place, MPI leaves this rank's result at the start of buf */
        if (q->off && q->c)
            memmove((char *)q->buf + q->off * q->es, q->buf, q->c * q->es);
    } else if (q->kind == ZO__MPI_SUM) {
        const double *all = (const double *)q->scratch;
        for (unsigned i = 0; i < q->n; i++) {
            double a = all[i];
            for (int k = 1; k < m->world; k++)
                a += all[(size_t)k * q->n + i];
            q->vals[i] = a;
        }
    }
    zo__mpi_req_put(m, q);
    return 0;
}

/* A request for a collective over buf: the MPI type and op of dt, the
 * counts laid out; 0, or < 0 with nothing taken. */
static inline int zo__mpi_prepare(zo_comm_mpi *m, void *buf, const uint64_t *counts, zo_dtype dt, MPI_Datatype *type,
                                  MPI_Op *op, zo__mpi_req **out)
{
    size_t es;
    int r = zo__mpi_type(m, dt, type, op, &es);
    if (r < 0)
        return r;
    if (m->timed_out)
        return -ETIMEDOUT;
    zo__mpi_req *q = zo__mpi_req_get(m);
    if (!q)
        return -ENOMEM;
    if ((r = zo__mpi_layout(m, q, counts)) < 0) {
        zo__mpi_req_put(m, q);
        return r;
    }
    q->buf = buf;
    q->dt = dt;
    q->es = es;
    *out = q;
    return 0;
}

static inline int zo__mpi_reduce_scatter_start(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    zo_comm_mpi *m = (zo_comm_mpi *)user;
    MPI_Datatype type;
    MPI_Op op;
    zo__mpi_req *q;
    int r = zo__mpi_prepare(m, buf, counts, dt, &type, &op, &q);
    if (r < 0)
        return r;
    if (m->ordered) {
        /* every rank's copy of this rank's chunk here (MPI_Ialltoallv),
         * summed in rank order when it is done */
        size_t c = q->c;
        if (c * (size_t)m->world > INT_MAX) {
            r = -EOVERFLOW;
            goto fail;
        }
        if ((r = zo__mpi_req_scratch(q, c * q->es * (size_t)m->world)) < 0)
            goto fail;
        for (int k = 0; k < m->world; k++) {
            q->rcounts[k] = (int)c;
            q->rdispls[k] = (int)c * k; /* c * world <= INT_MAX, checked above */
        }
        q->kind = ZO__MPI_RS_ORDERED;
        if (MPI_Ialltoallv(buf, q->counts, q->displs, type, q->scratch, q->rcounts, q->rdispls, type, m->comm,
                           &q->req) != MPI_SUCCESS) {
            r = -EIO;
            goto fail;
        }
    } else {
        q->kind = ZO__MPI_RS_MPI;
        if (MPI_Ireduce_scatter(MPI_IN_PLACE, buf, q->counts, type, op, m->comm, &q->req) != MPI_SUCCESS) {
            r = -EIO;
            goto fail;
        }
    }
    *req = q;
    return 0;
fail:
    zo__mpi_req_put(m, q);
    return r;
}

static inline int zo__mpi_all_gather_start(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    zo_comm_mpi *m = (zo_comm_mpi *)user;
    MPI_Datatype type;
    MPI_Op op;
    zo__mpi_req *q;
    int r = zo__mpi_prepare(m, buf, counts, dt, &type, &op, &q);
    if (r < 0)
        return r;
    q->kind = ZO__MPI_PLAIN;
    if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, q->counts, q->displs, type, m->comm, &q->req) !=
        MPI_SUCCESS) {
        zo__mpi_req_put(m, q);
        return -EIO;
    }
    *req = q;
    return 0;
}

static inline int zo__mpi_wait(void *user, void *req)
{
    return zo__mpi_finish((zo_comm_mpi *)user, (zo__mpi_req *)req);
}

static inline int zo__mpi_reduce_scatter(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    void *q;
    int r = zo__mpi_reduce_scatter_start(user, buf, counts, dt, &q);
    return r < 0 ? r : zo__mpi_wait(user, q);
}

static inline int zo__mpi_all_gather(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    void *q;
    int r = zo__mpi_all_gather_start(user, buf, counts, dt, &q);
    return r < 0 ? r : zo__mpi_wait(user, q);
}

static inline int zo__mpi_all_reduce(void *user, double *vals, unsigned n, int op)
{
    zo_comm_mpi *m = (zo_comm_mpi *)user;
    if (n > INT_MAX || (op != ZO_COMM_SUM && op != ZO_COMM_MAX))
        return -EINVAL;
    if (m->timed_out)
        return -ETIMEDOUT;
    zo__mpi_req *q = zo__mpi_req_get(m);
    if (!q)
        return -ENOMEM;
    int r = 0;
    if (m->ordered && op == ZO_COMM_SUM) {
        /* every rank's values here, summed in rank order: the same bits
         * whatever MPI's algorithm (a norm's partial sums, a loss) */
        if ((size_t)n * (size_t)m->world > INT_MAX)
            r = -EOVERFLOW;
        else
            r = zo__mpi_req_scratch(q, (size_t)n * (size_t)m->world * 8);
        q->kind = ZO__MPI_SUM;
        q->vals = vals;
        q->n = n;
        if (r == 0 && MPI_Iallgather(vals, (int)n, MPI_DOUBLE, q->scratch, (int)n, MPI_DOUBLE, m->comm, &q->req) !=
                          MPI_SUCCESS)
            r = -EIO;
    } else {
        q->kind = ZO__MPI_PLAIN;
        if (MPI_Iallreduce(MPI_IN_PLACE, vals, (int)n, MPI_DOUBLE, op == ZO_COMM_SUM ? MPI_SUM : MPI_MAX, m->comm,
                           &q->req) != MPI_SUCCESS)
            r = -EIO;
    }
    if (r < 0) {
        zo__mpi_req_put(m, q);
        return r;
    }
    return zo__mpi_finish(m, q);
}

/** Free what zo_comm_mpi_init() made (before MPI_Finalize; after the
 *  engine is destroyed). */
static inline void zo_comm_mpi_free(zo_comm_mpi *m)
{
    if (m->world > 0 && m->bf16_sum != MPI_OP_NULL) /* world 0: never initialized (zeroed) */
        MPI_Op_free(&m->bf16_sum);
    if (m->world > 0 && m->f16_sum != MPI_OP_NULL)
        MPI_Op_free(&m->f16_sum);
    m->bf16_sum = m->f16_sum = MPI_OP_NULL;
    while (m->free_reqs) {
        zo__mpi_req *q = m->free_reqs;
        m->free_reqs = q->next;
        free(q->counts);
        free(q->scratch);
        free(q);
    }
}

/**
 * Fill *c with collectives over `comm` (MPI must be initialized): rank and
 * world from the communicator, `m` as the callbacks' user data, the
 * synchronous and the asynchronous (start/wait) callbacks; reduce-scatter
 * and sums ordered (set m->ordered = 0 afterwards for MPI's own), a timeout
 * of 1800 s (set m->timeout_s). Not collective. @return 0; -EIO (an MPI
 * call failed).
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
    m->rank = rank;
    m->ordered = 1;
    m->timeout_s = 1800;
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
    c->reduce_scatter_start = zo__mpi_reduce_scatter_start;
    c->all_gather_start = zo__mpi_all_gather_start;
    c->wait = zo__mpi_wait;
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_COMM_MPI_H */
