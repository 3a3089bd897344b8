/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dev.h
 * @brief Device abstraction: memory, streams, events, copies and the small
 *        kernels the offload engine needs, over interchangeable backends.
 *
 * Backends
 *  - ZO_DEV_HOST, the reference: "device memory" is host memory; every
 *    stream owns a worker thread that runs its queue in order, so copies and
 *    kernels really run asynchronously, two streams really overlap, and
 *    events really mark points in a stream. Always available.
 *  - ZO_DEV_CUDA: the CUDA runtime (linked statically, so the library loads
 *    without a driver) and kernels built for sm_80/sm_90. With no driver or
 *    no GPU, zo_dev_probe() and zo_dev_open() return ZO_ENODEV with the
 *    reason, and everything else keeps working on ZO_DEV_HOST.
 *
 * Semantics follow CUDA's: work queued on one stream runs in order; work on
 * different streams is unordered unless joined with zo_stream_wait_event();
 * "async" calls return once the work is queued. Errors in queued work are
 * kept by the stream and returned by its next zo_stream_sync() (or by
 * zo_event_sync() of an event recorded after it), never dropped.
 *
 * Pointers: "device" pointers come from zo_dev_malloc() of the same device;
 * "host" pointers are any host memory (registered memory is faster and, for
 * CUDA, required for a copy to be truly asynchronous).
 *
 * Thread safety: a zo_dev may be used from any number of threads. A stream
 * or event may be used from several threads, but the order of work queued
 * concurrently on one stream from different threads is unspecified.
 */
#ifndef ZOFFLOAD_DEV_H
#define ZOFFLOAD_DEV_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_dev zo_dev;
typedef struct zo_stream zo_stream;
typedef struct zo_event zo_event;

typedef enum zo_dev_kind {
    ZO_DEV_HOST = 0,
    ZO_DEV_CUDA = 1,
    ZO_DEV_KIND_COUNT
} zo_dev_kind;

typedef enum zo_copy_kind {
    ZO_COPY_H2D = 0, /**< host -> device */
    ZO_COPY_D2H = 1, /**< device -> host */
    ZO_COPY_D2D = 2, /**< device -> device (same device) */
    ZO_COPY_H2H = 3, /**< host -> host, ordered in the stream */
} zo_copy_kind;

/** "host", "cuda"; "?" if invalid. */
ZO_API const char *zo_dev_kind_name(zo_dev_kind kind);
/** Parse "host" / "cuda". -EINVAL if unknown. */
ZO_API int zo_dev_kind_parse(const char *s, zo_dev_kind *out);

/**
 * Is backend `kind` usable on this machine?
 * @param ndev  out (may be NULL): number of devices of that kind.
 * @param why   out (may be NULL): on failure, the reason, e.g. "CUDA driver
 *              not loadable (cudaErrorInsufficientDriver)".
 * @return 0 if usable; ZO_ENOTSUP (not built in); ZO_ENODEV (no driver,
 *         no device); -EINVAL (bad kind).
 */
ZO_API int zo_dev_probe(zo_dev_kind kind, int *ndev, char *why, size_t why_len);

typedef struct zo_dev_config {
    size_t struct_size;  /**< sizeof(zo_dev_config), set by the defaults function */
    zo_dev_kind kind;    /**< default ZO_DEV_HOST */
    int ordinal;         /**< device index, default 0 */
    /** Host backend only: cap on bytes zo_dev_malloc() may hold at once,
     *  to stand in for a GPU's capacity (0 = unlimited, the default). */
    size_t host_mem_limit;
} zo_dev_config;

ZO_API void zo_dev_config_default(zo_dev_config *cfg);

/**
 * Open a device. `cfg` NULL means the defaults (host backend).
 * @return 0; -EINVAL (bad kind or ordinal, struct_size not that of a known
 *         zo_dev_config); ZO_ENOTSUP; ZO_ENODEV (unavailable, reason in
 *         zo_last_error_detail()); ZO_ECUDA; -ENOMEM.
 */
ZO_API int zo_dev_open(zo_dev **out, const zo_dev_config *cfg);

/**
 * Close a device. Streams and events of it must have been destroyed and its
 * allocations freed (leftovers are freed and logged). NULL ok; clears *d.
 */
ZO_API void zo_dev_close(zo_dev **d);

typedef struct zo_dev_info {
    zo_dev_kind kind;
    int ordinal;
    char name[96];         /**< "host" or the GPU's name */
    size_t total_mem;      /**< bytes (host: the limit, or physical RAM) */
    size_t free_mem;       /**< bytes free now */
    char pci_bus_id[32];   /**< "0000:3b:00.0", "" for host */
    int numa_node;         /**< nearest NUMA node, -1 unknown */
    int cc_major, cc_minor; /**< CUDA compute capability, 0 for host */
    int copy_engines;      /**< concurrent copy engines (host: 1 per stream) */
} zo_dev_info;

ZO_API int zo_dev_get_info(zo_dev *d, zo_dev_info *info);
ZO_API zo_dev_kind zo_dev_get_kind(const zo_dev *d);
/** The device a stream belongs to (NULL for NULL): how code handed only a
 *  stream (a tile callback, a sink) asks about its device. */
ZO_API zo_dev *zo_stream_device(const zo_stream *s);
/** The device's last error detail ("" if none).
 *  Thread-safe: the handle's threads may be recording a failure at the same
 *  time; the result is a copy of one whole message, in a thread-local buffer
 *  that stays valid until this thread next calls zo_dev_errmsg() (NULL gives "").
 */
ZO_API const char *zo_dev_errmsg(const zo_dev *d);

/** @name Memory */
/**@{*/
/**
 * Allocate n > 0 bytes of device memory, aligned to at least 256 bytes.
 * @return 0, -EINVAL, -ENOMEM (out of device memory / host limit), ZO_ECUDA.
 */
ZO_API int zo_dev_malloc(zo_dev *d, void **out, size_t n);
/** Free device memory (NULL ok). Like cudaFree it first waits for the
 *  device's queued work, so memory in use by a queued copy is never freed
 *  under it. -EINVAL if p is not a live allocation of this device. */
ZO_API int zo_dev_free(zo_dev *d, void *p);

/**
 * Page-lock and register host memory with the device for DMA (CUDA:
 * cudaHostRegister; host: recorded, nothing to do). Ranges may not overlap
 * an already registered range.
 * @return 0, -EINVAL, -EEXIST (overlap), ZO_ECUDA, -ENOMEM.
 */
ZO_API int zo_dev_host_register(zo_dev *d, void *p, size_t n);
/** Undo zo_dev_host_register(p). -ENOENT if p was not registered. */
ZO_API int zo_dev_host_unregister(zo_dev *d, void *p);
/**@}*/

/** @name Streams */
/**@{*/
ZO_API int zo_stream_create(zo_dev *d, zo_stream **out);
/** Wait for queued work, then destroy. NULL ok; clears *s. */
ZO_API void zo_stream_destroy(zo_stream **s);
/** Block until all queued work is done. Returns (and clears) the first
 *  error raised by queued work since the last sync, else 0. */
ZO_API int zo_stream_sync(zo_stream *s);
/** 0 if all queued work is done, -EBUSY if not. Does not block. */
ZO_API int zo_stream_query(zo_stream *s);

/**
 * Queue a copy of n bytes. n == 0 is a no-op. The kind must match where the
 * pointers live (checked where the backend can tell).
 * @return 0 (queued), -EINVAL, ZO_ECUDA.
 */
ZO_API int zo_memcpy_async(zo_stream *s, void *dst, const void *src, size_t n, zo_copy_kind kind);
/** Queue a fill of n bytes of device memory with the byte `value`. */
ZO_API int zo_memset_async(zo_stream *s, void *dst, int value, size_t n);

typedef void (*zo_host_fn)(void *arg);
/**
 * Queue a host function: it runs on a library thread once the work queued
 * before it is done, and work queued after it waits for it to return. It
 * must not call zo_stream_sync()/zo_event_sync() on its own stream.
 */
ZO_API int zo_stream_host_fn(zo_stream *s, zo_host_fn fn, void *arg);
/**@}*/

/** @name Events */
/**@{*/
ZO_API int zo_event_create(zo_dev *d, zo_event **out);
/** NULL ok; clears *e. */
ZO_API void zo_event_destroy(zo_event **e);
/** Mark the current end of stream s. Re-recording moves the mark. */
ZO_API int zo_event_record(zo_event *e, zo_stream *s);
/** Block until the marked work is done; returns the stream's pending error
 *  if that work failed. An event never recorded is complete. */
ZO_API int zo_event_sync(zo_event *e);
/** 0 if complete, -EBUSY if not. Does not block. */
ZO_API int zo_event_query(zo_event *e);
/** Make future work on s wait until e completes (e may be from another stream). */
ZO_API int zo_stream_wait_event(zo_stream *s, zo_event *e);
/** Milliseconds between two completed events. -EBUSY if one is pending,
 *  -EINVAL if either was never recorded. */
ZO_API int zo_event_elapsed_ms(zo_event *start, zo_event *end, float *ms);
/**@}*/

/** @name Kernels (queued on a stream; pointers in device memory) */
/**@{*/
/**
 * dst[i] = (dst_type) src[i]: f32 -> bf16/f16 (round to nearest even, NaN
 * kept), bf16/f16 -> f32, or a same-type copy. Numerics as in vec.h.
 * The buffers must not overlap (dst == src with the same type is a no-op).
 * @return 0 (queued), -EINVAL (also for overlap), ZO_ENOTSUP (pair).
 */
ZO_API int zo_dev_cast(zo_stream *s, void *dst, zo_dtype dst_type, const void *src,
                       zo_dtype src_type, size_t n);
/** *acc += sum of src[i]^2 (f32/f16/bf16); `acc` is a double in device memory. */
ZO_API int zo_dev_sumsq(zo_stream *s, const void *src, zo_dtype type, size_t n, double *acc);
/** If any src[i] is inf or NaN, *flag = 1 (never written otherwise); `flag`
 *  is an int in device memory. */
ZO_API int zo_dev_nonfinite(zo_stream *s, const void *src, zo_dtype type, size_t n, int *flag);
/**
 * Occupy stream s for `seconds` without using a CPU core or the device's
 * compute units: work queued after it on s waits that long, other streams
 * run meanwhile. It stands in for a model's compute in benchmarks and
 * tests (zo-optim-bench --compute-ms). CUDA: a one-thread kernel that
 * polls the GPU's global timer. Host: the stream's thread sleeps.
 *
 * Not zo_stream_host_fn() with a sleep: CUDA runs the host functions of
 * every stream on one driver thread, so a sleeping host function would
 * also hold back every other stream's host functions (the library's own
 * gradient landing among them) and serialise what should overlap.
 * @return 0 (queued), -EINVAL (NULL stream, a negative, NaN or over an
 *         hour duration), ZO_ENOTSUP, ZO_ECUDA. Does not block.
 */
ZO_API int zo_dev_busy(zo_stream *s, double seconds);
/**
 * dst[i] = mask[i] > 0 ? src[i] : 0 over n f32 elements: the ReLU (src =
 * mask = dst, in place) and its backward (src the incoming gradient, mask
 * the ReLU's output). A NaN mask gives 0, as a ReLU written `x > 0 ? x : 0`.
 * dst may be src or mask (each element is read before it is written); any
 * other overlap of dst with them is -EINVAL.
 * @return 0 (queued), -EINVAL (NULL stream, a NULL pointer with n > 0, n
 *         too large, overlap), ZO_ENOTSUP (a backend without it), ZO_ECUDA.
 *         Does not block. Thread-safe as the other stream calls.
 */
ZO_API int zo_dev_relu_mask(zo_stream *s, float *dst, const float *src, const float *mask, size_t n);
/**@}*/


/** @name GEMM (queued on a stream; pointers in device memory) */
/**@{*/
/** Whether a GEMM operand is used as stored or transposed. */
typedef enum zo_gemm_op {
    ZO_GEMM_N = 0, /**< as stored */
    ZO_GEMM_T = 1, /**< transposed */
} zo_gemm_op;

/**
 * Queue C = alpha * op(A) * op(B) + beta * C, all matrices row-major:
 * op(A) is m x k, op(B) is k x n, C is m x n. A is stored as (m x k) when
 * op_a is ZO_GEMM_N and (k x m) when ZO_GEMM_T, with row stride lda
 * elements; likewise B (k x n or n x k, stride ldb); C has stride ldc.
 * A and B share one element type `ab_type` (f32, bf16 or f16); C is f32 and
 * every product is accumulated in f32 (f32 inputs: no TF32, results as
 * sgemm). beta == 0 ignores C's previous contents (NaN in C is not kept).
 * k == 0 scales C by beta; m == 0 or n == 0 queues nothing.
 *
 * Backends: host runs it on the stream's worker thread with OpenBLAS
 * (cblas_sgemm; bf16 through cblas_sbgemm where the library exports it,
 * otherwise each operand is widened to f32 with the vec kernels into a
 * scratch buffer of the op's own) or, in a build without OpenBLAS, a plain
 * C loop; a GEMM on one stream and a copy on another really overlap. CUDA
 * uses cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F), loaded with dlopen on the
 * first GEMM of the process, so the library loads and runs without it;
 * without a loadable cuBLAS this returns ZO_ENOTSUP with the reason.
 *
 * @return 0 (queued); -EINVAL (NULL stream or pointer with m, n, k > 0,
 *         an operand op other than N/T, a stride smaller than its row,
 *         a dimension or stride above INT_MAX, C overlapping A or B);
 *         ZO_ENOTSUP (ab_type, or the backend has no GEMM); -ENOMEM;
 *         ZO_ECUDA. Errors of the queued work (-ENOMEM for the widening
 *         scratch) surface at the stream's next sync. Does not block.
 *         Thread-safe as the other stream calls.
 */
ZO_API int zo_gemm_async(zo_stream *s, zo_gemm_op op_a, zo_gemm_op op_b, size_t m, size_t n, size_t k, float alpha,
                         const void *a, size_t lda, const void *b, size_t ldb, zo_dtype ab_type, float beta, float *c,
                         size_t ldc);

/** Name of the GEMM implementation this build's backend `kind` uses:
 *  "openblas", "openblas+sbgemm", "reference" or "reference (OpenBLAS not
 *  loaded: why)" (host), "cublas" (CUDA), "none" (backend not built). For
 *  the host backend this opens OpenBLAS, as the first GEMM would (it is
 *  never opened at load: docs/api.md, "Linking"); for CUDA it loads
 *  nothing. */
ZO_API const char *zo_gemm_impl(zo_dev_kind kind);
/**@}*/

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_DEV_H */
