/* SPDX-License-Identifier: Apache-2.0 */
/* Device layer front end: argument checks shared by every backend, the
 * registered-range book, then a call through the backend's vtable. */
#define ZO_MODULE "dev"
#include "dev/dev_internal.h"
#include "core/pin_hooks.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const zo_dev_ops *backend(zo_dev_kind kind)
{
    switch (kind) {
    case ZO_DEV_HOST: return &zo__dev_host_ops;
#if ZO_HAVE_CUDA
    case ZO_DEV_CUDA: return &zo__dev_cuda_ops;
#endif
    default: return NULL;
    }
}

ZO_API const char *zo_dev_kind_name(zo_dev_kind kind)
{
    switch (kind) {
    case ZO_DEV_HOST: return "host";
    case ZO_DEV_CUDA: return "cuda";
    default: return "?";
    }
}

ZO_API int zo_dev_kind_parse(const char *s, zo_dev_kind *out)
{
    if (!s || !out)
        return -EINVAL;
    if (!strcasecmp(s, "host") || !strcasecmp(s, "cpu")) {
        *out = ZO_DEV_HOST;
        return 0;
    }
    if (!strcasecmp(s, "cuda") || !strcasecmp(s, "gpu")) {
        *out = ZO_DEV_CUDA;
        return 0;
    }
    return -EINVAL;
}

ZO_API int zo_dev_probe(zo_dev_kind kind, int *ndev, char *why, size_t why_len)
{
    if (ndev)
        *ndev = 0;
    if (why && why_len)
        why[0] = '\0';
    if ((unsigned)kind >= ZO_DEV_KIND_COUNT)
        return -EINVAL;
    const zo_dev_ops *ops = backend(kind);
    if (!ops) {
        if (why && why_len)
            snprintf(why, why_len, "the %s backend is not built into this library", zo_dev_kind_name(kind));
        return ZO_ENOTSUP;
    }
    int n = 0;
    char tmp[256] = "";
    int r = ops->probe(&n, tmp, sizeof(tmp));
    if (ndev)
        *ndev = r == 0 ? n : 0;
    if (why && why_len)
        snprintf(why, why_len, "%s", tmp);
    return r;
}

ZO_API void zo_dev_config_default(zo_dev_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->kind = ZO_DEV_HOST;
}

/* what zo_pinned_alloc (lib/core) calls to register pinned memory with a
 * device: handed to core rather than called by it (core/pin_hooks.h) */
static const zo__pin_hooks pin_hooks = {
    .host_register = zo_dev_host_register,
    .host_unregister = zo_dev_host_unregister,
    .errmsg = zo_dev_errmsg,
};

ZO_API int zo_dev_open(zo_dev **out, const zo_dev_config *cfg)
{
    zo__pin_hooks_set(&pin_hooks); /* before any device exists to be named in zo_pin_opts */
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_dev_open: out is NULL");
    *out = NULL;
    zo_dev_config c;
    zo_dev_config_default(&c);
    /* The first published zo_dev_config ends with host_mem_limit. */
    if (cfg)
        ZO_CHECK(ZO_STRUCT_IN(&c, cfg, offsetof(zo_dev_config, host_mem_limit) + sizeof(size_t), NULL,
                              "zo_dev_open"));
    if ((unsigned)c.kind >= ZO_DEV_KIND_COUNT)
        return ZO_FAIL(NULL, -EINVAL, "zo_dev_open: unknown device kind %d", (int)c.kind);
    const zo_dev_ops *ops = backend(c.kind);
    if (!ops)
        return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_dev_open: the %s backend is not built into this library",
                       zo_dev_kind_name(c.kind));
    if (c.ordinal < 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_dev_open: negative ordinal %d", c.ordinal);
    zo_dev *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->ops = ops;
    d->kind = c.kind;
    d->ordinal = c.ordinal;
    zo_list_init(&d->regs);
    pthread_mutex_init(&d->lock, NULL);
    int r = ops->open(d, &c);
    if (r < 0) {
        pthread_mutex_destroy(&d->lock);
        free(d);
        return r; /* the backend set the detail */
    }
    *out = d;
    return 0;
}

ZO_API void zo_dev_close(zo_dev **dp)
{
    if (!dp || !*dp)
        return;
    zo_dev *d = *dp;
    int ns = atomic_load(&d->nstreams), ne = atomic_load(&d->nevents);
    if (ns || ne)
        ZO_LOGE("zo_dev_close: %d stream(s) and %d event(s) still alive; they are now invalid", ns, ne);
    zo_list left = ZO_LIST_INIT(left);
    pthread_mutex_lock(&d->lock);
    zo_list *n;
    while ((n = zo_list_pop_head(&d->regs)))
        zo_list_add_tail(&left, n);
    pthread_mutex_unlock(&d->lock);
    while ((n = zo_list_pop_head(&left))) {
        zo_reg_range *r = zo_list_entry(n, zo_reg_range, link);
        ZO_LOGW("zo_dev_close: host range %p (+%zu) still registered; unregistering", (void *)r->p, r->n);
        d->ops->host_unregister(d, r->p);
        free(r);
    }
    d->ops->close(d);
    pthread_mutex_destroy(&d->lock);
    free(d);
    *dp = NULL;
}

ZO_API int zo_dev_get_info(zo_dev *d, zo_dev_info *info)
{
    if (!d || !info)
        return -EINVAL;
    memset(info, 0, sizeof(*info));
    info->kind = d->kind;
    info->ordinal = d->ordinal;
    info->numa_node = -1;
    return d->ops->info(d, info);
}

ZO_API zo_dev *zo_stream_device(const zo_stream *s)
{
    return s ? s->dev : NULL;
}

ZO_API zo_dev_kind zo_dev_get_kind(const zo_dev *d)
{
    return d ? d->kind : ZO_DEV_KIND_COUNT;
}

ZO_API const char *zo_dev_errmsg(const zo_dev *d)
{
    static _Thread_local char copy[ZO_ERRMSG_LEN];
    return zo__errbuf_tls(d ? &d->err : NULL, copy);
}

ZO_API int zo_dev_malloc(zo_dev *d, void **out, size_t n)
{
    if (!d || !out)
        return ZO_FAIL(d ? &d->err : NULL, -EINVAL, "zo_dev_malloc: NULL argument");
    *out = NULL;
    if (n == 0)
        return ZO_FAIL(&d->err, -EINVAL, "zo_dev_malloc: size 0");
    return d->ops->malloc(d, out, n);
}

ZO_API int zo_dev_free(zo_dev *d, void *p)
{
    if (!d)
        return -EINVAL;
    if (!p)
        return 0;
    return d->ops->free(d, p);
}

ZO_API int zo_dev_host_register(zo_dev *d, void *p, size_t n)
{
    if (!d || !p || n == 0)
        return ZO_FAIL(d ? &d->err : NULL, -EINVAL, "zo_dev_host_register: NULL pointer or size 0");
    zo_reg_range *rr = calloc(1, sizeof(*rr));
    if (!rr)
        return -ENOMEM;
    rr->p = p;
    rr->n = n;
    pthread_mutex_lock(&d->lock);
    zo_list *pos;
    zo_list_for_each(pos, &d->regs) {
        const zo_reg_range *q = zo_list_entry(pos, zo_reg_range, link);
        if ((uint8_t *)p < q->p + q->n && q->p < (uint8_t *)p + n) {
            pthread_mutex_unlock(&d->lock);
            free(rr);
            return ZO_FAIL(&d->err, -EEXIST, "zo_dev_host_register: [%p, +%zu) overlaps registered [%p, +%zu)", p, n,
                           (void *)q->p, q->n);
        }
    }
    /* Book the range first so a racing overlapping call is refused. */
    zo_list_add_head(&d->regs, &rr->link);
    pthread_mutex_unlock(&d->lock);
    int r = d->ops->host_register(d, p, n);
    if (r < 0) {
        pthread_mutex_lock(&d->lock);
        zo_list_del(&rr->link);
        pthread_mutex_unlock(&d->lock);
        free(rr);
    }
    return r;
}

ZO_API int zo_dev_host_unregister(zo_dev *d, void *p)
{
    if (!d || !p)
        return -EINVAL;
    zo_reg_range *found = NULL;
    pthread_mutex_lock(&d->lock);
    zo_list *pos;
    zo_list_for_each(pos, &d->regs) {
        zo_reg_range *q = zo_list_entry(pos, zo_reg_range, link);
        if (q->p == p) {
            found = q;
            zo_list_del(&found->link);
            break;
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (!found)
        return ZO_FAIL(&d->err, -ENOENT, "zo_dev_host_unregister: %p is not the start of a registered range", p);
    free(found);
    return d->ops->host_unregister(d, p);
}

/* ---- streams ------------------------------------------------------------- */
ZO_API int zo_stream_create(zo_dev *d, zo_stream **out)
{
    if (!d || !out)
        return ZO_FAIL(d ? &d->err : NULL, -EINVAL, "zo_stream_create: NULL argument");
    *out = NULL;
    zo_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->dev = d;
    int r = d->ops->stream_create(d, s);
    if (r < 0) {
        free(s);
        return r;
    }
    atomic_fetch_add(&d->nstreams, 1);
    *out = s;
    return 0;
}

ZO_API void zo_stream_destroy(zo_stream **sp)
{
    if (!sp || !*sp)
        return;
    zo_stream *s = *sp;
    s->dev->ops->stream_destroy(s);
    atomic_fetch_sub(&s->dev->nstreams, 1);
    free(s);
    *sp = NULL;
}

ZO_API int zo_stream_sync(zo_stream *s)
{
    return s ? s->dev->ops->stream_sync(s) : -EINVAL;
}

ZO_API int zo_stream_query(zo_stream *s)
{
    return s ? s->dev->ops->stream_query(s) : -EINVAL;
}

ZO_API int zo_memcpy_async(zo_stream *s, void *dst, const void *src, size_t n, zo_copy_kind kind)
{
    if (!s)
        return ZO_FAIL(NULL, -EINVAL, "zo_memcpy_async: stream is NULL");
    if ((unsigned)kind > ZO_COPY_H2H)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_memcpy_async: unknown copy kind %d", (int)kind);
    if (n == 0)
        return 0;
    if (!dst || !src)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_memcpy_async: NULL pointer with n=%zu", n);
    if ((const uint8_t *)dst < (const uint8_t *)src + n && (const uint8_t *)src < (const uint8_t *)dst + n)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_memcpy_async: source and destination overlap");
    return s->dev->ops->memcpy_async(s, dst, src, n, kind);
}

ZO_API int zo_memset_async(zo_stream *s, void *dst, int value, size_t n)
{
    if (!s)
        return -EINVAL;
    if (n == 0)
        return 0;
    if (!dst)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_memset_async: NULL pointer with n=%zu", n);
    return s->dev->ops->memset_async(s, dst, value, n);
}

ZO_API int zo_stream_host_fn(zo_stream *s, zo_host_fn fn, void *arg)
{
    if (!s || !fn)
        return ZO_FAIL(s ? &s->dev->err : NULL, -EINVAL, "zo_stream_host_fn: NULL argument");
    return s->dev->ops->host_fn(s, fn, arg);
}

int zo__stream_host_fn_status(zo_stream *s, zo__host_status_fn fn, void *arg)
{
    if (!s || !fn)
        return ZO_FAIL(s ? &s->dev->err : NULL, -EINVAL, "zo__stream_host_fn_status: NULL argument");
    return s->dev->ops->host_fn_status(s, fn, arg);
}

/* ---- fences --------------------------------------------------------------- */
struct zo__fence {
    zo_dev *dev;
    void *impl;              /* the backend's (fence_record), or NULL: the fallback below */
    int result;              /* latched once not -EBUSY */
    /* fallback on host_fn_status: the status function fills these */
    atomic_int done;
    int err;
    atomic_int refs;         /* the owner and the queued status function */
    void (*notify)(void *arg);
    void *arg;
};

static void fence_unref(zo__fence *f)
{
    if (atomic_fetch_sub(&f->refs, 1) == 1)
        free(f);
}

static void fence_status_fn(void *arg, int err)
{
    zo__fence *f = arg;
    void (*notify)(void *) = f->notify;
    void *narg = f->arg;
    f->err = err;
    atomic_store_explicit(&f->done, 1, memory_order_release);
    /* the owner may destroy the fence as soon as done is seen: notify
     * with the copies taken before */
    fence_unref(f);
    if (notify)
        notify(narg);
}

int zo__fence_record(zo_stream *s, void (*notify)(void *arg), void *arg, zo__fence **out)
{
    if (!s || !out)
        return ZO_FAIL(s ? &s->dev->err : NULL, -EINVAL, "zo__fence_record: NULL argument");
    *out = NULL;
    zo_dev *d = s->dev;
    int n = atomic_load(&d->fence_faults);
    while (n > 0 && !atomic_compare_exchange_weak(&d->fence_faults, &n, n - 1))
        ;
    if (n > 0)
        return ZO_FAIL(&d->err, atomic_load(&d->fence_fault_err), "zo__fence_record: injected failure");
    zo__fence *f = calloc(1, sizeof(*f));
    if (!f)
        return ZO_FAIL(&d->err, -ENOMEM, "zo__fence_record: out of memory");
    f->dev = d;
    f->result = -EBUSY;
    f->notify = notify;
    f->arg = arg;
    int r;
    if (d->ops->fence_record) {
        atomic_store(&f->refs, 1);
        r = d->ops->fence_record(s, &f->impl);
    } else {
        atomic_store(&f->refs, 2);
        r = d->ops->host_fn_status(s, fence_status_fn, f);
        if (r < 0)
            atomic_store(&f->refs, 1);
    }
    if (r < 0) {
        free(f);
        return r;
    }
    *out = f;
    return 0;
}

int zo__fence_query(zo__fence *f)
{
    if (!f)
        return -EINVAL;
    if (f->result != -EBUSY)
        return f->result;
    if (f->impl)
        f->result = f->dev->ops->fence_query(f->dev, f->impl);
    else if (atomic_load_explicit(&f->done, memory_order_acquire))
        f->result = f->err;
    return f->result;
}

void zo__fence_destroy(zo__fence **fp)
{
    if (!fp || !*fp)
        return;
    zo__fence *f = *fp;
    *fp = NULL;
    if (f->impl)
        f->dev->ops->fence_destroy(f->dev, f->impl);
    fence_unref(f);
}

void zo__dev_fail_fences(zo_dev *d, int n, int err)
{
    if (!d)
        return;
    atomic_store(&d->fence_fault_err, err);
    atomic_store(&d->fence_faults, n);
}

/* ---- events --------------------------------------------------------------- */
ZO_API int zo_event_create(zo_dev *d, zo_event **out)
{
    if (!d || !out)
        return -EINVAL;
    *out = NULL;
    zo_event *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->dev = d;
    int r = d->ops->event_create(d, e);
    if (r < 0) {
        free(e);
        return r;
    }
    atomic_fetch_add(&d->nevents, 1);
    *out = e;
    return 0;
}

ZO_API void zo_event_destroy(zo_event **ep)
{
    if (!ep || !*ep)
        return;
    zo_event *e = *ep;
    e->dev->ops->event_destroy(e);
    atomic_fetch_sub(&e->dev->nevents, 1);
    free(e);
    *ep = NULL;
}

static int same_dev(zo_event *e, zo_stream *s, const char *fn)
{
    if (!e || !s)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL argument", fn);
    if (e->dev != s->dev)
        return ZO_FAIL(&s->dev->err, -EINVAL, "%s: event and stream belong to different devices", fn);
    return 0;
}

ZO_API int zo_event_record(zo_event *e, zo_stream *s)
{
    ZO_CHECK(same_dev(e, s, "zo_event_record"));
    return s->dev->ops->event_record(e, s);
}

ZO_API int zo_event_sync(zo_event *e)
{
    return e ? e->dev->ops->event_sync(e) : -EINVAL;
}

ZO_API int zo_event_query(zo_event *e)
{
    return e ? e->dev->ops->event_query(e) : -EINVAL;
}

ZO_API int zo_stream_wait_event(zo_stream *s, zo_event *e)
{
    ZO_CHECK(same_dev(e, s, "zo_stream_wait_event"));
    return s->dev->ops->stream_wait_event(s, e);
}

ZO_API int zo_event_elapsed_ms(zo_event *a, zo_event *b, float *ms)
{
    if (!a || !b || !ms || a->dev != b->dev)
        return -EINVAL;
    return a->dev->ops->event_elapsed_ms(a, b, ms);
}

/* ---- kernels ---------------------------------------------------------------- */
static int float_type(zo_dtype t)
{
    return t == ZO_DTYPE_F32 || t == ZO_DTYPE_F16 || t == ZO_DTYPE_BF16;
}

ZO_API int zo_dev_cast(zo_stream *s, void *dst, zo_dtype dst_type, const void *src, zo_dtype src_type, size_t n)
{
    if (!s)
        return -EINVAL;
    if (zo_dtype_size(dst_type) == 0 || zo_dtype_size(src_type) == 0)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_cast: invalid dtype");
    int ok = dst_type == src_type || (src_type == ZO_DTYPE_F32 && float_type(dst_type)) ||
             (dst_type == ZO_DTYPE_F32 && float_type(src_type));
    if (!ok)
        return ZO_FAIL(&s->dev->err, ZO_ENOTSUP, "zo_dev_cast: %s -> %s not supported", zo_dtype_name(src_type),
                       zo_dtype_name(dst_type));
    if (n == 0)
        return 0;
    if (!dst || !src)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_cast: NULL pointer with n=%zu", n);
    size_t db, sb;
    if (zo__mul_size(n, zo_dtype_size(dst_type), &db) < 0 || zo__mul_size(n, zo_dtype_size(src_type), &sb) < 0)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_cast: n=%zu too large", n);
    /* the copy path would memcpy overlapping ranges, and a converting
     * kernel would read elements another lane already overwrote */
    if (!(dst == src && dst_type == src_type) && (const uint8_t *)dst < (const uint8_t *)src + sb &&
        (const uint8_t *)src < (const uint8_t *)dst + db)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_cast: source and destination overlap");
    if (dst_type == src_type)
        return dst == src ? 0 : s->dev->ops->memcpy_async(s, dst, src, n * zo_dtype_size(src_type), ZO_COPY_D2D);
    return s->dev->ops->cast(s, dst, dst_type, src, src_type, n);
}

ZO_API int zo_dev_sumsq(zo_stream *s, const void *src, zo_dtype type, size_t n, double *acc)
{
    if (!s || !acc || (n && !src))
        return ZO_FAIL(s ? &s->dev->err : NULL, -EINVAL, "zo_dev_sumsq: NULL argument");
    if (!float_type(type))
        return ZO_FAIL(&s->dev->err, ZO_ENOTSUP, "zo_dev_sumsq: dtype %s not supported", zo_dtype_name(type));
    if (n == 0)
        return 0;
    return s->dev->ops->sumsq(s, src, type, n, acc);
}

ZO_API int zo_dev_nonfinite(zo_stream *s, const void *src, zo_dtype type, size_t n, int *flag)
{
    if (!s || !flag || (n && !src))
        return ZO_FAIL(s ? &s->dev->err : NULL, -EINVAL, "zo_dev_nonfinite: NULL argument");
    if (!float_type(type))
        return ZO_FAIL(&s->dev->err, ZO_ENOTSUP, "zo_dev_nonfinite: dtype %s not supported", zo_dtype_name(type));
    if (n == 0)
        return 0;
    return s->dev->ops->nonfinite(s, src, type, n, flag);
}

/* dst and p (n floats each) overlap other than exactly */
static int overlaps(const float *dst, const float *p, size_t n)
{
    return dst != p && dst < p + n && p < dst + n;
}

ZO_API int zo_dev_busy(zo_stream *s, double seconds)
{
    if (!s)
        return -EINVAL;
    /* !(x >= 0) also refuses NaN */
    if (!(seconds >= 0) || seconds > 3600)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_busy: %g s is not a duration in [0, 3600]", seconds);
    if (!s->dev->ops->busy)
        return ZO_FAIL(&s->dev->err, ZO_ENOTSUP, "zo_dev_busy: backend %s has no such kernel", s->dev->ops->name);
    uint64_t ns = (uint64_t)(seconds * 1e9 + 0.5);
    return ns ? s->dev->ops->busy(s, ns) : 0;
}

ZO_API int zo_dev_relu_mask(zo_stream *s, float *dst, const float *src, const float *mask, size_t n)
{
    if (!s)
        return -EINVAL;
    if (n == 0)
        return 0;
    if (!dst || !src || !mask)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_relu_mask: NULL pointer with n=%zu", n);
    size_t bytes;
    if (zo__mul_size(n, sizeof(float), &bytes) < 0)
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_relu_mask: n=%zu too large", n);
    /* elementwise in place is fine; a shifted overlap would read what another lane wrote */
    if (overlaps(dst, src, n) || overlaps(dst, mask, n))
        return ZO_FAIL(&s->dev->err, -EINVAL, "zo_dev_relu_mask: dst partly overlaps src or mask");
    if (!s->dev->ops->relu_mask)
        return ZO_FAIL(&s->dev->err, ZO_ENOTSUP, "zo_dev_relu_mask: backend %s has no such kernel",
                       s->dev->ops->name);
    return s->dev->ops->relu_mask(s, dst, src, mask, n);
}

/* ---- GEMM ------------------------------------------------------------------------- */
static int gemm_range(const void *p, zo_gemm_op op, size_t rows_n, size_t cols_n, size_t ld, size_t esz,
                      const uint8_t **lo, const uint8_t **hi)
{
    /* stored rows x cols of the operand as it lies in memory */
    size_t rows = op == ZO_GEMM_N ? rows_n : cols_n, cols = op == ZO_GEMM_N ? cols_n : rows_n, span;
    if (rows == 0 || cols == 0) {
        *lo = *hi = p;
        return 0;
    }
    if (zo__mul_size(rows - 1, ld, &span) < 0 || __builtin_add_overflow(span, cols, &span) ||
        zo__mul_size(span, esz, &span) < 0)
        return -EINVAL;
    *lo = p;
    *hi = (const uint8_t *)p + span;
    return 0;
}

ZO_API int zo_gemm_async(zo_stream *s, zo_gemm_op op_a, zo_gemm_op op_b, size_t m, size_t n, size_t k, float alpha,
                         const void *a, size_t lda, const void *b, size_t ldb, zo_dtype ab_type, float beta, float *c,
                         size_t ldc)
{
    if (!s)
        return ZO_FAIL(NULL, -EINVAL, "zo_gemm_async: stream is NULL");
    zo_errbuf *eb = &s->dev->err;
    if ((op_a != ZO_GEMM_N && op_a != ZO_GEMM_T) || (op_b != ZO_GEMM_N && op_b != ZO_GEMM_T))
        return ZO_FAIL(eb, -EINVAL, "zo_gemm_async: operand op must be ZO_GEMM_N or ZO_GEMM_T");
    if (!float_type(ab_type))
        return ZO_FAIL(eb, ZO_ENOTSUP, "zo_gemm_async: operand type %s not supported (f32, bf16, f16)",
                       zo_dtype_name(ab_type));
    if (!s->dev->ops->gemm)
        return ZO_FAIL(eb, ZO_ENOTSUP, "zo_gemm_async: the %s backend has no GEMM", s->dev->ops->name);
    if (m == 0 || n == 0)
        return 0;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return ZO_FAIL(eb, -EINVAL, "zo_gemm_async: m=%zu n=%zu k=%zu or a stride above INT_MAX", m, n, k);
    if (!c || (k && (!a || !b)))
        return ZO_FAIL(eb, -EINVAL, "zo_gemm_async: NULL matrix with m=%zu n=%zu k=%zu", m, n, k);
    size_t a_cols = op_a == ZO_GEMM_N ? k : m, b_cols = op_b == ZO_GEMM_N ? n : k;
    /* with k == 0 neither A nor B is read: their strides do not matter */
    if (ldc < n || (k && (lda < a_cols || ldb < b_cols)))
        return ZO_FAIL(eb, -EINVAL, "zo_gemm_async: stride below its row (lda=%zu needs %zu, ldb=%zu needs %zu, "
                       "ldc=%zu needs %zu)", lda, a_cols, ldb, b_cols, ldc, n);
    size_t esz = zo_dtype_size(ab_type);
    const uint8_t *alo, *ahi, *blo, *bhi, *clo, *chi;
    if (gemm_range(a, op_a, m, k, lda, esz, &alo, &ahi) < 0 || gemm_range(b, op_b, k, n, ldb, esz, &blo, &bhi) < 0 ||
        gemm_range(c, ZO_GEMM_N, m, n, ldc, sizeof(float), &clo, &chi) < 0)
        return ZO_FAIL(eb, -EINVAL, "zo_gemm_async: matrix extent overflows");
    /* C is written while A and B are read: an overlap gives garbage in
     * every backend, so it is refused rather than computed */
    if (k && ((clo < ahi && alo < chi) || (clo < bhi && blo < chi)))
        return ZO_FAIL(eb, -EINVAL, "zo_gemm_async: C overlaps A or B");
    zo__gemm_args g = {.op_a = op_a, .op_b = op_b, .m = m, .n = n, .k = k, .alpha = alpha, .beta = beta,
                       .a = a, .b = b, .lda = lda, .ldb = ldb, .ab_type = ab_type, .c = c, .ldc = ldc};
    return s->dev->ops->gemm(s, &g);
}

ZO_API const char *zo_gemm_impl(zo_dev_kind kind)
{
    switch (kind) {
    case ZO_DEV_HOST: return zo__host_gemm_impl();
#if ZO_HAVE_CUDA
    case ZO_DEV_CUDA: return "cublas";
#endif
    default: return "none";
    }
}
