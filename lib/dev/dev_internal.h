/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device layer internals: the backend vtable and the handle layouts shared
 * by the wrapper (dev.c) and the backends (host.c, cuda.c).
 */
#ifndef ZO_DEV_INTERNAL_H
#define ZO_DEV_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/internal.h"
#include "core/list.h"

#include <zoffload/dev.h>

/* A host function told how the work queued before it went: err is the
 * first error raised by that work since the previous such function (or
 * sync) on the stream, else 0. */
typedef void (*zo__host_status_fn)(void *arg, int err);

struct zo__gemm_args; /* below, with the GEMM helpers */

typedef struct zo_dev_ops {
    zo_dev_kind kind;
    const char *name;
    int (*probe)(int *ndev, char *why, size_t why_len);
    int (*open)(zo_dev *d, const zo_dev_config *cfg);
    void (*close)(zo_dev *d);
    int (*info)(zo_dev *d, zo_dev_info *info);
    int (*malloc)(zo_dev *d, void **out, size_t n);
    int (*free)(zo_dev *d, void *p);
    int (*host_register)(zo_dev *d, void *p, size_t n);
    int (*host_unregister)(zo_dev *d, void *p);
    int (*stream_create)(zo_dev *d, zo_stream *s);
    void (*stream_destroy)(zo_stream *s);
    int (*stream_sync)(zo_stream *s);
    int (*stream_query)(zo_stream *s);
    int (*memcpy_async)(zo_stream *s, void *dst, const void *src, size_t n, zo_copy_kind kind);
    int (*memset_async)(zo_stream *s, void *dst, int value, size_t n);
    int (*host_fn)(zo_stream *s, zo_host_fn fn, void *arg);
    int (*host_fn_status)(zo_stream *s, zo__host_status_fn fn, void *arg);
    /* Optional (zo__fence_*; without them the wrapper builds fences on
     * host_fn_status): mark the work queued on s so far in *impl; 0 done
     * without error, -EBUSY not yet, else the work's error; free it. */
    int (*fence_record)(zo_stream *s, void **impl);
    int (*fence_query)(zo_dev *d, void *impl);
    void (*fence_destroy)(zo_dev *d, void *impl);
    int (*event_create)(zo_dev *d, zo_event *e);
    void (*event_destroy)(zo_event *e);
    int (*event_record)(zo_event *e, zo_stream *s);
    int (*event_sync)(zo_event *e);
    int (*event_query)(zo_event *e);
    int (*stream_wait_event)(zo_stream *s, zo_event *e);
    int (*event_elapsed_ms)(zo_event *a, zo_event *b, float *ms);
    int (*cast)(zo_stream *s, void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n);
    int (*sumsq)(zo_stream *s, const void *src, zo_dtype t, size_t n, double *acc);
    int (*nonfinite)(zo_stream *s, const void *src, zo_dtype t, size_t n, int *flag);
    /* optional (NULL: zo_dev_relu_mask returns ZO_ENOTSUP); args checked by dev.c */
    int (*relu_mask)(zo_stream *s, float *dst, const float *src, const float *mask, size_t n);
    /* optional (NULL: zo_dev_busy returns ZO_ENOTSUP): occupy the stream
     * for ns nanoseconds without a CPU core */
    int (*busy)(zo_stream *s, uint64_t ns);
    /* optional (NULL: zo_gemm_async returns ZO_ENOTSUP); args checked by dev.c */
    int (*gemm)(zo_stream *s, const struct zo__gemm_args *g);
} zo_dev_ops;

typedef struct zo_reg_range {
    uint8_t *p;
    size_t n;
    zo_list link; /* on zo_dev.regs */
} zo_reg_range;

struct zo_dev {
    const zo_dev_ops *ops;
    zo_dev_kind kind;
    int ordinal;
    zo_errbuf err;
    pthread_mutex_t lock;     /* guards regs and the counters below */
    zo_list regs;             /* zo_reg_range: host ranges registered through the wrapper */
    atomic_int nstreams, nevents;
    atomic_int fence_faults, fence_fault_err; /* tests: zo__dev_fail_fences() */
    void *impl;               /* backend state */
};

struct zo_stream {
    zo_dev *dev;
    void *impl;
};

struct zo_event {
    zo_dev *dev;
    void *impl;
};

/* As zo_stream_host_fn(), but fn always runs (also after a failed copy:
 * CUDA skips a plain host function then) and gets the error of the work
 * before it. The error is the stream's until then: a host backend hands
 * it to this function and clears it, CUDA's errors are sticky. Same
 * restrictions on fn (it must not call the device API). */
int zo__stream_host_fn_status(zo_stream *s, zo__host_status_fn fn, void *arg);

#include "dev/fence.h" /* the fences, and the hook tests use */

/* Tests: make the host backend's copies on device d fail with err (skipped,
 * the error raised on their stream); 0 restores them. */
void zo__dev_host_fail_copies(zo_dev *d, int err);

/* ---- GEMM (zo_gemm_async) ----------------------------------------------------- */
/* One GEMM as zo_gemm_async() states it, checked by the wrapper. */
typedef struct zo__gemm_args {
    zo_gemm_op op_a, op_b;
    size_t m, n, k;
    float alpha, beta;
    const void *a, *b;
    size_t lda, ldb;
    zo_dtype ab_type;
    float *c;
    size_t ldc;
} zo__gemm_args;

/* Run g now on the calling thread (host_gemm.c: OpenBLAS or the reference
 * loop); the host backend's stream workers call it. 0 or -ENOMEM. */
int zo__host_gemm_run(const zo__gemm_args *g);
/* The plain C loop alone, whatever the build has (tests compare against it). */
int zo__host_gemm_ref(const zo__gemm_args *g);
const char *zo__host_gemm_impl(void);
#if ZO_HAVE_CUDA
/* cuda_blas.c: cublasGemmEx on s's stream, cuBLAS loaded on first use. */
int zo__cuda_gemm(zo_stream *s, const zo__gemm_args *g);
#endif

extern const zo_dev_ops zo__dev_host_ops;
#if ZO_HAVE_CUDA
extern const zo_dev_ops zo__dev_cuda_ops;
#endif

#endif /* ZO_DEV_INTERNAL_H */
