/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend: the CUDA runtime (linked statically, so it dlopens the
 * driver on first use and the library loads without one) plus the kernels
 * of cuda_kernels.cu. Every entry point selects the device first because
 * the runtime's current device is per host thread. */
#define ZO_MODULE "dev.cuda"
#include "dev/dev_internal.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <zoffload/topo.h>

#include "dev/cuda_kernels.h"

typedef struct cuda_event {
    cudaEvent_t ev;
    int recorded;
} cuda_event;

static int cu_fail(zo_dev *d, cudaError_t e, const char *what)
{
    int code = (e == cudaErrorMemoryAllocation) ? -ENOMEM : ZO_ECUDA;
    return ZO_FAIL(d ? &d->err : NULL, code, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CU(d, call)                                  \
    do {                                             \
        cudaError_t e_ = (call);                     \
        if (e_ != cudaSuccess)                       \
            return cu_fail((d), e_, #call);          \
    } while (0)

static int select_dev(zo_dev *d)
{
    CU(d, cudaSetDevice(d->ordinal));
    return 0;
}

static int cuda_probe(int *ndev, char *why, size_t why_len)
{
    /* Ask the loader first: the runtime's own error for a missing driver
     * ("driver version is insufficient") misleads people. */
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_len, "no NVIDIA driver: libcuda.so.1 cannot be loaded (%s)", e ? e : "not found");
        return ZO_ENODEV;
    }
    dlclose(h);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "CUDA runtime cannot use the driver: %s (%s)", cudaGetErrorName(e),
                 cudaGetErrorString(e));
        return ZO_ENODEV;
    }
    if (n == 0) {
        snprintf(why, why_len, "no CUDA device found");
        return ZO_ENODEV;
    }
    *ndev = n;
    return 0;
}

static int cuda_open(zo_dev *d, const zo_dev_config *cfg)
{
    int n = 0;
    char why[256] = "";
    int r = cuda_probe(&n, why, sizeof(why));
    if (r < 0)
        return ZO_FAIL(&d->err, r, "CUDA backend unavailable: %s", why);
    if (cfg->ordinal >= n)
        return ZO_FAIL(&d->err, ZO_ENODEV, "CUDA device %d requested, %d present", cfg->ordinal, n);
    ZO_CHECK(select_dev(d));
    CU(d, cudaFree(NULL)); /* create the primary context now, not mid-step */
    return 0;
}

static void cuda_close(zo_dev *d)
{
    (void)d; /* the primary context stays: other users of it may exist */
}

static int cuda_info(zo_dev *d, zo_dev_info *info)
{
    ZO_CHECK(select_dev(d));
    struct cudaDeviceProp prop;
    CU(d, cudaGetDeviceProperties(&prop, d->ordinal));
    snprintf(info->name, sizeof(info->name), "%s", prop.name);
    size_t fr = 0, tot = 0;
    CU(d, cudaMemGetInfo(&fr, &tot));
    info->total_mem = tot;
    info->free_mem = fr;
    snprintf(info->pci_bus_id, sizeof(info->pci_bus_id), "%04x:%02x:%02x.0", (unsigned)prop.pciDomainID,
             (unsigned)prop.pciBusID, (unsigned)prop.pciDeviceID);
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->copy_engines = prop.asyncEngineCount;
    zo_topo *t = NULL;
    if (zo_topo_create(&t) == 0) {
        int node = zo_topo_node_of_pci(t, info->pci_bus_id);
        info->numa_node = node >= 0 ? node : -1;
        zo_topo_destroy(&t);
    }
    return 0;
}

static int cuda_malloc(zo_dev *d, void **out, size_t n)
{
    ZO_CHECK(select_dev(d));
    CU(d, cudaMalloc(out, n));
    return 0;
}

static int cuda_free(zo_dev *d, void *p)
{
    ZO_CHECK(select_dev(d));
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice || a.device != d->ordinal) {
        cudaGetLastError(); /* clear the error state the query may leave */
        return ZO_FAIL(&d->err, -EINVAL, "zo_dev_free: %p is not device memory of CUDA device %d", p, d->ordinal);
    }
    CU(d, cudaFree(p));
    return 0;
}

static int cuda_host_register(zo_dev *d, void *p, size_t n)
{
    ZO_CHECK(select_dev(d));
    CU(d, cudaHostRegister(p, n, cudaHostRegisterPortable));
    return 0;
}

static int cuda_host_unregister(zo_dev *d, void *p)
{
    ZO_CHECK(select_dev(d));
    CU(d, cudaHostUnregister(p));
    return 0;
}

static int cuda_stream_create(zo_dev *d, zo_stream *s)
{
    ZO_CHECK(select_dev(d));
    cudaStream_t cs;
    /* Non-blocking: never serialize with the legacy default stream that a
     * host framework may be using. */
    CU(d, cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    s->impl = cs;
    return 0;
}

static void cuda_stream_destroy(zo_stream *s)
{
    if (select_dev(s->dev) == 0) {
        cudaError_t e = cudaStreamSynchronize((cudaStream_t)s->impl);
        if (e != cudaSuccess)
            ZO_LOGW("stream destroyed with an unreported error: %s", cudaGetErrorString(e));
        cudaStreamDestroy((cudaStream_t)s->impl);
    }
}

static int cuda_stream_sync(zo_stream *s)
{
    ZO_CHECK(select_dev(s->dev));
    CU(s->dev, cudaStreamSynchronize((cudaStream_t)s->impl));
    return 0;
}

static int cuda_stream_query(zo_stream *s)
{
    ZO_CHECK(select_dev(s->dev));
    cudaError_t e = cudaStreamQuery((cudaStream_t)s->impl);
    if (e == cudaErrorNotReady)
        return -EBUSY;
    if (e != cudaSuccess)
        return cu_fail(s->dev, e, "cudaStreamQuery");
    return 0;
}

static int cuda_memcpy_async(zo_stream *s, void *dst, const void *src, size_t n, zo_copy_kind kind)
{
    static const enum cudaMemcpyKind kinds[] = {
        [ZO_COPY_H2D] = cudaMemcpyHostToDevice,
        [ZO_COPY_D2H] = cudaMemcpyDeviceToHost,
        [ZO_COPY_D2D] = cudaMemcpyDeviceToDevice,
        [ZO_COPY_H2H] = cudaMemcpyHostToHost,
    };
    ZO_CHECK(select_dev(s->dev));
    CU(s->dev, cudaMemcpyAsync(dst, src, n, kinds[kind], (cudaStream_t)s->impl));
    return 0;
}

static int cuda_memset_async(zo_stream *s, void *dst, int value, size_t n)
{
    ZO_CHECK(select_dev(s->dev));
    CU(s->dev, cudaMemsetAsync(dst, value, n, (cudaStream_t)s->impl));
    return 0;
}

static int cuda_host_fn(zo_stream *s, zo_host_fn fn, void *arg)
{
    ZO_CHECK(select_dev(s->dev));
    CU(s->dev, cudaLaunchHostFunc((cudaStream_t)s->impl, fn, arg));
    return 0;
}

typedef struct cuda_status_cb {
    zo__host_status_fn fn;
    void *arg;
} cuda_status_cb;

/* A stream callback, unlike cudaLaunchHostFunc's function, also runs when
 * the work before it failed, and is told so. */
static void CUDART_CB cuda_status_tramp(cudaStream_t st, cudaError_t status, void *user)
{
    (void)st;
    cuda_status_cb cb = *(cuda_status_cb *)user;
    free(user);
    cb.fn(cb.arg, status == cudaSuccess ? 0 : ZO_ECUDA);
}

static int cuda_host_fn_status(zo_stream *s, zo__host_status_fn fn, void *arg)
{
    ZO_CHECK(select_dev(s->dev));
    cuda_status_cb *cb = malloc(sizeof(*cb));
    if (!cb)
        return -ENOMEM;
    cb->fn = fn;
    cb->arg = arg;
    cudaError_t e = cudaStreamAddCallback((cudaStream_t)s->impl, cuda_status_tramp, cb, 0);
    if (e != cudaSuccess) {
        free(cb);
        return cu_fail(s->dev, e, "cudaStreamAddCallback");
    }
    return 0;
}

/* Fences are events without timing (the cheapest kind), polled by their
 * owner: nothing runs on a driver thread and the stream is never held for
 * host code. An event query reports the context's sticky error, if any. */
static int cuda_fence_record(zo_stream *s, void **impl)
{
    ZO_CHECK(select_dev(s->dev));
    cudaEvent_t ev;
    CU(s->dev, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, (cudaStream_t)s->impl);
    if (e != cudaSuccess) {
        cudaEventDestroy(ev);
        return cu_fail(s->dev, e, "cudaEventRecord");
    }
    *impl = ev;
    return 0;
}

static int cuda_fence_query(zo_dev *d, void *impl)
{
    ZO_CHECK(select_dev(d));
    cudaError_t e = cudaEventQuery((cudaEvent_t)impl);
    if (e == cudaErrorNotReady)
        return -EBUSY;
    if (e != cudaSuccess)
        return cu_fail(d, e, "device copy (cudaEventQuery)");
    return 0;
}

static void cuda_fence_destroy(zo_dev *d, void *impl)
{
    /* a pending event's resources are released once it completes */
    if (select_dev(d) == 0)
        cudaEventDestroy((cudaEvent_t)impl);
}

static int cuda_event_create(zo_dev *d, zo_event *e)
{
    ZO_CHECK(select_dev(d));
    cuda_event *ce = calloc(1, sizeof(*ce));
    if (!ce)
        return -ENOMEM;
    cudaError_t err = cudaEventCreateWithFlags(&ce->ev, cudaEventDefault);
    if (err != cudaSuccess) {
        free(ce);
        return cu_fail(d, err, "cudaEventCreateWithFlags");
    }
    e->impl = ce;
    return 0;
}

static void cuda_event_destroy(zo_event *e)
{
    cuda_event *ce = e->impl;
    if (select_dev(e->dev) == 0)
        cudaEventDestroy(ce->ev);
    free(ce);
}

static int cuda_event_record(zo_event *e, zo_stream *s)
{
    cuda_event *ce = e->impl;
    ZO_CHECK(select_dev(s->dev));
    CU(s->dev, cudaEventRecord(ce->ev, (cudaStream_t)s->impl));
    ce->recorded = 1;
    return 0;
}

static int cuda_event_sync(zo_event *e)
{
    cuda_event *ce = e->impl;
    ZO_CHECK(select_dev(e->dev));
    CU(e->dev, cudaEventSynchronize(ce->ev));
    return 0;
}

static int cuda_event_query(zo_event *e)
{
    cuda_event *ce = e->impl;
    ZO_CHECK(select_dev(e->dev));
    cudaError_t err = cudaEventQuery(ce->ev);
    if (err == cudaErrorNotReady)
        return -EBUSY;
    if (err != cudaSuccess)
        return cu_fail(e->dev, err, "cudaEventQuery");
    return 0;
}

static int cuda_stream_wait_event(zo_stream *s, zo_event *e)
{
    cuda_event *ce = e->impl;
    ZO_CHECK(select_dev(s->dev));
    CU(s->dev, cudaStreamWaitEvent((cudaStream_t)s->impl, ce->ev, 0));
    return 0;
}

static int cuda_event_elapsed_ms(zo_event *a, zo_event *b, float *ms)
{
    cuda_event *ca = a->impl, *cb = b->impl;
    if (!ca->recorded || !cb->recorded)
        return ZO_FAIL(&a->dev->err, -EINVAL, "zo_event_elapsed_ms: an event was never recorded");
    ZO_CHECK(select_dev(a->dev));
    cudaError_t err = cudaEventElapsedTime(ms, ca->ev, cb->ev);
    if (err == cudaErrorNotReady)
        return -EBUSY;
    if (err != cudaSuccess)
        return cu_fail(a->dev, err, "cudaEventElapsedTime");
    return 0;
}

static int launched(zo_stream *s, int err, const char *what)
{
    return err ? cu_fail(s->dev, (cudaError_t)err, what) : 0;
}

static int cuda_cast(zo_stream *s, void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n)
{
    ZO_CHECK(select_dev(s->dev));
    return launched(s, zo__cuda_cast(s->impl, dst, (int)dt, src, (int)st, n), "cast kernel launch");
}

static int cuda_sumsq(zo_stream *s, const void *src, zo_dtype t, size_t n, double *acc)
{
    ZO_CHECK(select_dev(s->dev));
    return launched(s, zo__cuda_sumsq(s->impl, src, (int)t, n, acc), "sumsq kernel launch");
}

static int cuda_busy(zo_stream *s, uint64_t ns)
{
    ZO_CHECK(select_dev(s->dev));
    return launched(s, zo__cuda_busy(s->impl, ns), "busy kernel launch");
}

static int cuda_relu_mask(zo_stream *s, float *dst, const float *src, const float *mask, size_t n)
{
    ZO_CHECK(select_dev(s->dev));
    return launched(s, zo__cuda_relu_mask(s->impl, dst, src, mask, n), "relu_mask kernel launch");
}

static int cuda_nonfinite(zo_stream *s, const void *src, zo_dtype t, size_t n, int *flag)
{
    ZO_CHECK(select_dev(s->dev));
    return launched(s, zo__cuda_nonfinite(s->impl, src, (int)t, n, flag), "nonfinite kernel launch");
}

const zo_dev_ops zo__dev_cuda_ops = {
    .kind = ZO_DEV_CUDA,
    .name = "cuda",
    .probe = cuda_probe,
    .open = cuda_open,
    .close = cuda_close,
    .info = cuda_info,
    .malloc = cuda_malloc,
    .free = cuda_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_query = cuda_stream_query,
    .memcpy_async = cuda_memcpy_async,
    .memset_async = cuda_memset_async,
    .host_fn = cuda_host_fn,
    .host_fn_status = cuda_host_fn_status,
    .fence_record = cuda_fence_record,
    .fence_query = cuda_fence_query,
    .fence_destroy = cuda_fence_destroy,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_sync = cuda_event_sync,
    .event_query = cuda_event_query,
    .stream_wait_event = cuda_stream_wait_event,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .cast = cuda_cast,
    .sumsq = cuda_sumsq,
    .relu_mask = cuda_relu_mask,
    .busy = cuda_busy,
    .nonfinite = cuda_nonfinite,
    .gemm = zo__cuda_gemm,
};
