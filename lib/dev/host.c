/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend: the reference every other backend is tested against.
 * "Device memory" is host memory. Each stream owns a worker thread that runs
 * its queue in order, so asynchronous copies and kernels really are
 * asynchronous and two streams really overlap. Events carry a generation
 * number: recording bumps it and books the generation as pending; the
 * worker that reaches the mark takes it off the pending list. A generation
 * is done when it is no longer pending, whatever the order in which
 * records on different streams complete. */
#define ZO_MODULE "dev.host"
#include "dev/dev_internal.h"
#include "core/list.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/vec.h>

typedef struct host_alloc {
    void *p;
    size_t n;
    zo_list link; /* on host_dev.allocs */
} host_alloc;

typedef struct host_dev {
    size_t limit, used;
    zo_list allocs;            /* host_alloc, guarded by zo_dev.lock */
    pthread_mutex_t ev_lock;   /* guards every host_event */
    pthread_cond_t ev_cond;
    pthread_mutex_t streams_lock;
    zo_list streams;           /* host_stream, for zo_dev_free's device-wide sync */
    atomic_int copy_fault;     /* tests: copies fail with this error */
} host_dev;

typedef enum { OP_COPY, OP_SET, OP_HOSTFN, OP_HOSTFN_STATUS, OP_CAST, OP_SUMSQ, OP_NONFINITE, OP_RECORD, OP_WAIT, OP_GEMM, OP_RELU_MASK, OP_BUSY } op_kind;

typedef struct host_gen {
    uint64_t gen;
    zo_list link; /* on host_event.pending */
} host_gen;

/* All fields under host_dev.ev_lock. */
typedef struct host_event {
    uint64_t gen_recorded; /* the latest record's generation */
    zo_list pending;       /* host_gen: records queued and not reached yet */
    uint64_t t_gen, t_ns;  /* the newest completed record and when it completed */
    unsigned refs;         /* queued records and waits that point here */
    int destroyed;         /* zo_event_destroy() called: freed when refs drops to 0 */
} host_event;

static int gen_pending(const host_event *he, uint64_t gen)
{
    const zo_list *pos;
    zo_list_for_each(pos, &he->pending)
        if (zo_list_entry(pos, host_gen, link)->gen == gen)
            return 1;
    return 0;
}

/* Drop one reference of a queued op; the last one frees a destroyed event.
 * Called under ev_lock. */
static void event_unref(host_event *he)
{
    if (--he->refs == 0 && he->destroyed)
        free(he);
}

typedef struct host_op {
    op_kind kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    zo_dtype dt, st;
    zo_host_fn fn;
    zo__host_status_fn sfn;
    void *arg;
    host_event *ev;
    uint64_t gen;
    host_gen *g;      /* OP_RECORD: its entry on ev's pending list */
    zo_qnode qn;      /* on host_stream.ops */
} host_op;

typedef struct host_stream {
    zo_stream *pub;
    host_dev *hd;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;  /* work queued, work finished, or stop */
    zo_queue ops;   /* host_op, run in order by the worker */
    uint64_t submitted, completed;
    int stop;
    int err; /* first error since the last sync */
    zo_list link;   /* on host_dev.streams */
} host_stream;

/* ---- device ----------------------------------------------------------------- */
static int host_probe(int *ndev, char *why, size_t why_len)
{
    (void)why, (void)why_len;
    *ndev = 1;
    return 0;
}

static int host_open(zo_dev *d, const zo_dev_config *cfg)
{
    if (cfg->ordinal != 0)
        return ZO_FAIL(&d->err, ZO_ENODEV, "host backend has one device (ordinal 0), asked for %d", cfg->ordinal);
    host_dev *hd = calloc(1, sizeof(*hd));
    if (!hd)
        return -ENOMEM;
    hd->limit = cfg->host_mem_limit;
    zo_list_init(&hd->allocs);
    zo_list_init(&hd->streams);
    pthread_mutex_init(&hd->ev_lock, NULL);
    pthread_cond_init(&hd->ev_cond, NULL);
    pthread_mutex_init(&hd->streams_lock, NULL);
    d->impl = hd;
    return 0;
}

static void host_close(zo_dev *d)
{
    host_dev *hd = d->impl;
    zo_list *n;
    while ((n = zo_list_pop_head(&hd->allocs))) {
        host_alloc *a = zo_list_entry(n, host_alloc, link);
        ZO_LOGW("zo_dev_close: %zu bytes at %p were not freed; freeing", a->n, a->p);
        free(a->p);
        free(a);
    }
    pthread_mutex_destroy(&hd->ev_lock);
    pthread_cond_destroy(&hd->ev_cond);
    pthread_mutex_destroy(&hd->streams_lock);
    free(hd);
}

static int host_info(zo_dev *d, zo_dev_info *info)
{
    host_dev *hd = d->impl;
    snprintf(info->name, sizeof(info->name), "host");
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t phys = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
    pthread_mutex_lock(&d->lock);
    size_t used = hd->used;
    pthread_mutex_unlock(&d->lock);
    info->total_mem = hd->limit ? hd->limit : phys;
    info->free_mem = info->total_mem > used ? info->total_mem - used : 0;
    info->copy_engines = 1;
    return 0;
}

static int host_malloc(zo_dev *d, void **out, size_t n)
{
    host_dev *hd = d->impl;
    host_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    pthread_mutex_lock(&d->lock);
    if (hd->limit && (hd->used + n > hd->limit || hd->used + n < hd->used)) {
        size_t used = hd->used;
        pthread_mutex_unlock(&d->lock);
        free(a);
        return ZO_FAIL(&d->err, -ENOMEM, "host device: %zu bytes requested, %zu of %zu in use", n, used, hd->limit);
    }
    hd->used += n; /* reserve */
    pthread_mutex_unlock(&d->lock);
    /* 4 KiB alignment for large buffers keeps O_DIRECT usable on them. */
    if (posix_memalign(&a->p, n >= 4096 ? 4096 : 256, n) != 0) {
        pthread_mutex_lock(&d->lock);
        hd->used -= n;
        pthread_mutex_unlock(&d->lock);
        free(a);
        return ZO_FAIL(&d->err, -ENOMEM, "host device: out of memory for %zu bytes", n);
    }
    a->n = n;
    pthread_mutex_lock(&d->lock);
    zo_list_add_head(&hd->allocs, &a->link);
    pthread_mutex_unlock(&d->lock);
    *out = a->p;
    return 0;
}

static int host_stream_sync(zo_stream *s);

static int host_free(zo_dev *d, void *p)
{
    host_dev *hd = d->impl;
    /* Like cudaFree: wait for every stream, so queued work never touches
     * freed memory. Errors stay with their streams for their own sync. */
    pthread_mutex_lock(&hd->streams_lock);
    zo_list *pos;
    zo_list_for_each(pos, &hd->streams) {
        host_stream *hs = zo_list_entry(pos, host_stream, link);
        pthread_mutex_lock(&hs->lock);
        while (hs->completed < hs->submitted)
            pthread_cond_wait(&hs->cond, &hs->lock);
        pthread_mutex_unlock(&hs->lock);
    }
    pthread_mutex_unlock(&hd->streams_lock);
    pthread_mutex_lock(&d->lock);
    host_alloc *a = NULL;
    zo_list_for_each(pos, &hd->allocs) {
        host_alloc *x = zo_list_entry(pos, host_alloc, link);
        if (x->p == p) {
            a = x;
            zo_list_del(&a->link);
            hd->used -= a->n;
            break;
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (!a)
        return ZO_FAIL(&d->err, -EINVAL, "zo_dev_free: %p is not an allocation of this device", p);
    free(a->p);
    free(a);
    return 0;
}

static int host_register(zo_dev *d, void *p, size_t n)
{
    (void)d, (void)p, (void)n; /* host memory is already "device" memory */
    return 0;
}

static int host_unregister(zo_dev *d, void *p)
{
    (void)d, (void)p;
    return 0;
}

/* ---- the worker ------------------------------------------------------------- */
static void run_op(host_stream *hs, host_op *op)
{
    host_dev *hd = hs->hd;
    switch (op->kind) {
    case OP_COPY: {
        int f = atomic_load_explicit(&hd->copy_fault, memory_order_relaxed);
        if (!f) {
            memcpy(op->dst, op->src, op->n);
            break;
        }
        pthread_mutex_lock(&hs->lock);
        if (!hs->err)
            hs->err = f;
        pthread_mutex_unlock(&hs->lock);
        break;
    }
    case OP_SET: memset(op->dst, op->value, op->n); break;
    case OP_BUSY: { /* n nanoseconds on this stream's thread, asleep: no CPU */
        struct timespec ts = {.tv_sec = (time_t)(op->n / 1000000000u), .tv_nsec = (long)(op->n % 1000000000u)};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        break;
    }
    case OP_HOSTFN: op->fn(op->arg); break;
    case OP_HOSTFN_STATUS: {
        /* handed over: the error of a copy goes to the function that
         * follows it, not also to the next sync */
        pthread_mutex_lock(&hs->lock);
        int err = hs->err;
        hs->err = 0;
        pthread_mutex_unlock(&hs->lock);
        op->sfn(op->arg, err);
        break;
    }
    case OP_CAST: {
        int r = zo_vec_cast(op->dst, op->dt, op->src, op->st, op->n);
        if (r < 0 && !hs->err)
            hs->err = r;
        break;
    }
    case OP_SUMSQ: {
        double v = 0;
        int r = zo_vec_sumsq(op->src, op->st, op->n, &v);
        if (r < 0 && !hs->err)
            hs->err = r;
        else
            *(double *)op->dst += v;
        break;
    }
    case OP_NONFINITE: {
        size_t c = 0;
        int r = zo_vec_nonfinite(op->src, op->st, op->n, &c);
        if (r < 0 && !hs->err)
            hs->err = r;
        else if (c)
            *(int *)op->dst = 1;
        break;
    }
    case OP_RELU_MASK: {
        /* dst[i] = mask[i] > 0 ? src[i] : 0; mask travels in arg */
        float *d = op->dst;
        const float *x = op->src, *m = op->arg;
        for (size_t i = 0; i < op->n; i++)
            d[i] = m[i] > 0.0f ? x[i] : 0.0f;
        break;
    }
    case OP_RECORD: {
        host_event *he = op->ev;
        pthread_mutex_lock(&hd->ev_lock);
        zo_list_del(&op->g->link);
        free(op->g);
        if (op->gen > he->t_gen) {
            he->t_gen = op->gen;
            he->t_ns = zo__now_ns();
        }
        event_unref(he);
        pthread_cond_broadcast(&hd->ev_cond);
        pthread_mutex_unlock(&hd->ev_lock);
        break;
    }
    case OP_GEMM: {
        int r = zo__host_gemm_run(op->arg);
        free(op->arg);
        if (r < 0) {
            pthread_mutex_lock(&hs->lock);
            if (!hs->err)
                hs->err = r;
            pthread_mutex_unlock(&hs->lock);
        }
        break;
    }
    case OP_WAIT:
        pthread_mutex_lock(&hd->ev_lock);
        /* the generation captured at zo_stream_wait_event(): a later
         * record of the event on another stream does not release it */
        while (gen_pending(op->ev, op->gen))
            pthread_cond_wait(&hd->ev_cond, &hd->ev_lock);
        event_unref(op->ev);
        pthread_mutex_unlock(&hd->ev_lock);
        break;
    }
}

static void *worker(void *arg)
{
    host_stream *hs = arg;
    pthread_mutex_lock(&hs->lock);
    for (;;) {
        while (zo_queue_empty(&hs->ops) && !hs->stop)
            pthread_cond_wait(&hs->cond, &hs->lock);
        if (zo_queue_empty(&hs->ops) && hs->stop)
            break;
        host_op *op = zo_queue_entry(zo_queue_pop(&hs->ops), host_op, qn);
        pthread_mutex_unlock(&hs->lock);
        run_op(hs, op);
        free(op);
        pthread_mutex_lock(&hs->lock);
        hs->completed++;
        pthread_cond_broadcast(&hs->cond);
    }
    pthread_mutex_unlock(&hs->lock);
    return NULL;
}

static int enqueue(host_stream *hs, host_op *tmpl)
{
    host_op *op = malloc(sizeof(*op));
    if (!op)
        return ZO_FAIL(&hs->pub->dev->err, -ENOMEM, "host stream: out of memory queueing work");
    *op = *tmpl;
    pthread_mutex_lock(&hs->lock);
    zo_queue_push(&hs->ops, &op->qn);
    hs->submitted++;
    pthread_cond_broadcast(&hs->cond);
    pthread_mutex_unlock(&hs->lock);
    return 0;
}

/* ---- streams ------------------------------------------------------------------- */
static int host_stream_create(zo_dev *d, zo_stream *s)
{
    host_dev *hd = d->impl;
    host_stream *hs = calloc(1, sizeof(*hs));
    if (!hs)
        return -ENOMEM;
    hs->pub = s;
    hs->hd = hd;
    zo_queue_init(&hs->ops);
    pthread_mutex_init(&hs->lock, NULL);
    pthread_cond_init(&hs->cond, NULL);
    int r = pthread_create(&hs->thread, NULL, worker, hs);
    if (r) {
        pthread_mutex_destroy(&hs->lock);
        pthread_cond_destroy(&hs->cond);
        free(hs);
        return ZO_FAIL(&d->err, -r, "host stream: cannot start its worker thread");
    }
    pthread_setname_np(hs->thread, "zo-stream");
    pthread_mutex_lock(&hd->streams_lock);
    zo_list_add_tail(&hd->streams, &hs->link);
    pthread_mutex_unlock(&hd->streams_lock);
    s->impl = hs;
    return 0;
}

static void host_stream_destroy(zo_stream *s)
{
    host_stream *hs = s->impl;
    host_dev *hd = hs->hd;
    pthread_mutex_lock(&hs->lock);
    hs->stop = 1; /* the worker drains the queue before it exits */
    pthread_cond_broadcast(&hs->cond);
    pthread_mutex_unlock(&hs->lock);
    pthread_join(hs->thread, NULL);
    if (hs->err)
        ZO_LOGW("stream destroyed with an unreported error: %s", zo_strerror(hs->err));
    pthread_mutex_lock(&hd->streams_lock);
    zo_list_del(&hs->link);
    pthread_mutex_unlock(&hd->streams_lock);
    pthread_mutex_destroy(&hs->lock);
    pthread_cond_destroy(&hs->cond);
    free(hs);
}

static int host_stream_sync(zo_stream *s)
{
    host_stream *hs = s->impl;
    pthread_mutex_lock(&hs->lock);
    while (hs->completed < hs->submitted)
        pthread_cond_wait(&hs->cond, &hs->lock);
    int err = hs->err;
    hs->err = 0;
    pthread_mutex_unlock(&hs->lock);
    return err;
}

static int host_stream_query(zo_stream *s)
{
    host_stream *hs = s->impl;
    pthread_mutex_lock(&hs->lock);
    int busy = hs->completed < hs->submitted;
    pthread_mutex_unlock(&hs->lock);
    return busy ? -EBUSY : 0;
}

static int host_memcpy_async(zo_stream *s, void *dst, const void *src, size_t n, zo_copy_kind kind)
{
    (void)kind; /* all host memory */
    host_op op = {.kind = OP_COPY, .dst = dst, .src = src, .n = n};
    return enqueue(s->impl, &op);
}

static int host_memset_async(zo_stream *s, void *dst, int value, size_t n)
{
    host_op op = {.kind = OP_SET, .dst = dst, .value = value, .n = n};
    return enqueue(s->impl, &op);
}

static int host_host_fn(zo_stream *s, zo_host_fn fn, void *arg)
{
    host_op op = {.kind = OP_HOSTFN, .fn = fn, .arg = arg};
    return enqueue(s->impl, &op);
}

static int host_host_fn_status(zo_stream *s, zo__host_status_fn fn, void *arg)
{
    host_op op = {.kind = OP_HOSTFN_STATUS, .sfn = fn, .arg = arg};
    return enqueue(s->impl, &op);
}

void zo__dev_host_fail_copies(zo_dev *d, int err)
{
    if (d && d->ops == &zo__dev_host_ops)
        atomic_store(&((host_dev *)d->impl)->copy_fault, err);
}

/* ---- events ------------------------------------------------------------------ */
static int host_event_create(zo_dev *d, zo_event *e)
{
    (void)d;
    host_event *he = calloc(1, sizeof(*he));
    if (!he)
        return -ENOMEM;
    zo_list_init(&he->pending);
    e->impl = he;
    return 0;
}

static void host_event_destroy(zo_event *e)
{
    /* As cudaEventDestroy: does not wait. Records and waits still queued
     * hold references; the last of them frees the event. */
    host_dev *hd = e->dev->impl;
    host_event *he = e->impl;
    pthread_mutex_lock(&hd->ev_lock);
    he->destroyed = 1;
    if (he->refs == 0)
        free(he);
    pthread_mutex_unlock(&hd->ev_lock);
}

static int host_event_record(zo_event *e, zo_stream *s)
{
    host_dev *hd = s->dev->impl;
    host_event *he = e->impl;
    host_gen *g = malloc(sizeof(*g));
    if (!g)
        return ZO_FAIL(&s->dev->err, -ENOMEM, "zo_event_record: out of memory");
    pthread_mutex_lock(&hd->ev_lock);
    uint64_t gen = ++he->gen_recorded;
    g->gen = gen;
    zo_list_add_tail(&he->pending, &g->link);
    he->refs++;
    pthread_mutex_unlock(&hd->ev_lock);
    host_op op = {.kind = OP_RECORD, .ev = he, .gen = gen, .g = g};
    int r = enqueue(s->impl, &op);
    if (r < 0) { /* never queued: the generation counts as done */
        pthread_mutex_lock(&hd->ev_lock);
        zo_list_del(&g->link);
        free(g);
        event_unref(he);
        pthread_cond_broadcast(&hd->ev_cond);
        pthread_mutex_unlock(&hd->ev_lock);
    }
    return r;
}

static int host_event_sync(zo_event *e)
{
    host_dev *hd = e->dev->impl;
    host_event *he = e->impl;
    pthread_mutex_lock(&hd->ev_lock);
    uint64_t gen = he->gen_recorded; /* the latest record at the call */
    while (gen_pending(he, gen))
        pthread_cond_wait(&hd->ev_cond, &hd->ev_lock);
    pthread_mutex_unlock(&hd->ev_lock);
    return 0;
}

static int host_event_query(zo_event *e)
{
    host_dev *hd = e->dev->impl;
    host_event *he = e->impl;
    pthread_mutex_lock(&hd->ev_lock);
    int busy = gen_pending(he, he->gen_recorded);
    pthread_mutex_unlock(&hd->ev_lock);
    return busy ? -EBUSY : 0;
}

static int host_stream_wait_event(zo_stream *s, zo_event *e)
{
    host_dev *hd = s->dev->impl;
    host_event *he = e->impl;
    pthread_mutex_lock(&hd->ev_lock);
    uint64_t gen = he->gen_recorded;
    /* never recorded, or its latest record already reached: nothing to wait for */
    int pending = gen_pending(he, gen);
    if (pending)
        he->refs++;
    pthread_mutex_unlock(&hd->ev_lock);
    if (!pending)
        return 0;
    host_op op = {.kind = OP_WAIT, .ev = he, .gen = gen};
    int r = enqueue(s->impl, &op);
    if (r < 0) {
        pthread_mutex_lock(&hd->ev_lock);
        event_unref(he);
        pthread_mutex_unlock(&hd->ev_lock);
    }
    return r;
}

static int host_event_elapsed_ms(zo_event *a, zo_event *b, float *ms)
{
    host_dev *hd = a->dev->impl;
    host_event *ha = a->impl, *hb = b->impl;
    pthread_mutex_lock(&hd->ev_lock);
    int never = ha->gen_recorded == 0 || hb->gen_recorded == 0;
    int busy = gen_pending(ha, ha->gen_recorded) || gen_pending(hb, hb->gen_recorded);
    double d = ((double)hb->t_ns - (double)ha->t_ns) / 1e6;
    pthread_mutex_unlock(&hd->ev_lock);
    if (never)
        return ZO_FAIL(&a->dev->err, -EINVAL, "zo_event_elapsed_ms: an event was never recorded");
    if (busy)
        return -EBUSY;
    *ms = (float)d;
    return 0;
}

/* ---- kernels ------------------------------------------------------------------ */
static int host_cast(zo_stream *s, void *dst, zo_dtype dt, const void *src, zo_dtype st, size_t n)
{
    host_op op = {.kind = OP_CAST, .dst = dst, .src = src, .dt = dt, .st = st, .n = n};
    return enqueue(s->impl, &op);
}

static int host_sumsq(zo_stream *s, const void *src, zo_dtype t, size_t n, double *acc)
{
    host_op op = {.kind = OP_SUMSQ, .dst = acc, .src = src, .st = t, .n = n};
    return enqueue(s->impl, &op);
}

static int host_nonfinite(zo_stream *s, const void *src, zo_dtype t, size_t n, int *flag)
{
    host_op op = {.kind = OP_NONFINITE, .dst = flag, .src = src, .st = t, .n = n};
    return enqueue(s->impl, &op);
}

static int host_busy(zo_stream *s, uint64_t ns)
{
    host_op op = {.kind = OP_BUSY, .n = (size_t)ns};
    return enqueue(s->impl, &op);
}

static int host_relu_mask(zo_stream *s, float *dst, const float *src, const float *mask, size_t n)
{
    host_op op = {.kind = OP_RELU_MASK, .dst = dst, .src = src, .arg = (void *)mask, .n = n};
    return enqueue(s->impl, &op);
}

/* ---- GEMM ----------------------------------------------------------------------- */
/* The arguments travel in their own allocation (the op stays small for the
 * copies that make up most of the traffic); the worker frees them. */
static int host_gemm(zo_stream *s, const zo__gemm_args *g)
{
    zo__gemm_args *copy = malloc(sizeof(*copy));
    if (!copy)
        return ZO_FAIL(&s->dev->err, -ENOMEM, "zo_gemm_async: out of memory queueing work");
    *copy = *g;
    host_op op = {.kind = OP_GEMM, .arg = copy};
    int r = enqueue(s->impl, &op);
    if (r < 0)
        free(copy);
    return r;
}

const zo_dev_ops zo__dev_host_ops = {
    .kind = ZO_DEV_HOST,
    .name = "host",
    .probe = host_probe,
    .open = host_open,
    .close = host_close,
    .info = host_info,
    .malloc = host_malloc,
    .free = host_free,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_sync = host_stream_sync,
    .stream_query = host_stream_query,
    .memcpy_async = host_memcpy_async,
    .memset_async = host_memset_async,
    .host_fn = host_host_fn,
    .host_fn_status = host_host_fn_status,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_sync = host_event_sync,
    .event_query = host_event_query,
    .stream_wait_event = host_stream_wait_event,
    .event_elapsed_ms = host_event_elapsed_ms,
    .cast = host_cast,
    .sumsq = host_sumsq,
    .nonfinite = host_nonfinite,
    .relu_mask = host_relu_mask,
    .busy = host_busy,
    .gemm = host_gemm,
};
