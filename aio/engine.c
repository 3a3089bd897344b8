/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo_aio: the backend-independent front of the engine. It validates and
 * queues requests, cuts them into pieces (see aio_internal.h), hands the
 * pieces to the backend's I/O threads (zo__aio_claim), judges every result
 * (zo__aio_piece_result: short transfers resumed, -EAGAIN retried with a
 * bound, end of file on a read is ZO_ETRUNC, any other error fails the
 * request), completes requests (callback, waiter, or the fire-and-forget
 * error kept for zo_aio_wait_all) and keeps registered regions.
 */
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "aio_internal.h"

#include <zoffload/topo.h>

/* ---- process-wide state: live engines (file close drops files from their
 * rings) and the test switch that makes io_uring look unusable ------------- */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static zo_list live = ZO_LIST_INIT(live); /* zo_aio by live_link, under live_lock */
static char forced_unusable[128];
static _Atomic int memlock_warned; /* the registration fallback is a warning once per process */

void zo__aio_force_uring_unusable(const char *reason)
{
    pthread_mutex_lock(&live_lock);
    snprintf(forced_unusable, sizeof(forced_unusable), "%s", reason ? reason : "");
    pthread_mutex_unlock(&live_lock);
}

void zo__aio_forget_file(uint64_t file_id)
{
    pthread_mutex_lock(&live_lock);
    zo_list *pos;
    zo_list_for_each(pos, &live) {
        zo_aio *a = zo_list_entry(pos, zo_aio, live_link);
        if (a->ops->forget_file)
            a->ops->forget_file(a, file_id);
    }
    pthread_mutex_unlock(&live_lock);
}

/* ---- futex ------------------------------------------------------------------ */
void zo__futex_wait(_Atomic uint32_t *w, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

void zo__futex_wake(_Atomic uint32_t *w, int n)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* ---- config ------------------------------------------------------------------- */
ZO_API void zo_aio_config_default(zo_aio_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->backend = ZO_AIO_AUTO;
    cfg->threads = 1;
    cfg->queue_depth = 32;
    cfg->block_size = 1u << 20;
    cfg->sqpoll = 0;
    cfg->sqpoll_idle_ms = 1000;
    cfg->register_files = 1;
    cfg->register_buffers = 1;
    cfg->eagain_retries = 64;
    cfg->numa_node = -1;
}

ZO_API const char *zo_aio_backend_name(zo_aio_backend b)
{
    switch (b) {
    case ZO_AIO_AUTO: return "auto";
    case ZO_AIO_URING: return "uring";
    case ZO_AIO_THREADS: return "threads";
    default: return "?";
    }
}

/* Record a failure in the handle's message. I/O threads completing failed
 * requests and API calls fail at the same time: zo_errbuf takes its own
 * lock, so zo_aio_errmsg() shows one whole message, never the bytes of two
 * (the same mechanism as every other handle's message). */
#define AIO_FAIL(a, err, ...) ZO_FAIL((a) ? &(a)->eb : NULL, (err), __VA_ARGS__)

static int check_config(const zo_aio_config *in, zo_aio_config *cfg, zo_errbuf *eb)
{
    zo_aio_config_default(cfg);
    if (in)
        ZO_CHECK(ZO_STRUCT_IN(cfg, in, offsetof(zo_aio_config, threads), eb, "zo_aio_create"));
    if (cfg->backend != ZO_AIO_AUTO && cfg->backend != ZO_AIO_URING && cfg->backend != ZO_AIO_THREADS)
        return ZO_FAIL(eb, ZO_ECONFIG, "zo_aio_config.backend = %d: not auto, uring or threads", (int)cfg->backend);
    if (cfg->threads == 0 || cfg->threads > ZO_AIO_MAX_THREADS)
        return ZO_FAIL(eb, ZO_ECONFIG, "zo_aio_config.threads = %u: must be 1..%d", cfg->threads, ZO_AIO_MAX_THREADS);
    if (cfg->queue_depth == 0 || cfg->queue_depth > ZO_AIO_MAX_QUEUE_DEPTH)
        return ZO_FAIL(eb, ZO_ECONFIG, "zo_aio_config.queue_depth = %u: must be 1..%d", cfg->queue_depth,
                       ZO_AIO_MAX_QUEUE_DEPTH);
    if (!ZO_IS_POW2(cfg->block_size) || cfg->block_size < 4096 || cfg->block_size > ZO_AIO_MAX_BLOCK_SIZE)
        return ZO_FAIL(eb, ZO_ECONFIG, "zo_aio_config.block_size = %zu: must be a power of two, 4096..%u",
                       cfg->block_size, ZO_AIO_MAX_BLOCK_SIZE);
    if (cfg->sqpoll_idle_ms > 3600u * 1000u)
        return ZO_FAIL(eb, ZO_ECONFIG, "zo_aio_config.sqpoll_idle_ms = %u: more than an hour", cfg->sqpoll_idle_ms);
    if (cfg->eagain_retries > 65535)
        return ZO_FAIL(eb, ZO_ECONFIG, "zo_aio_config.eagain_retries = %u: must be <= 65535", cfg->eagain_retries);
    if (cfg->numa_node < -1)
        return ZO_FAIL(eb, ZO_ECONFIG, "zo_aio_config.numa_node = %d: must be -1 or a node id", cfg->numa_node);
    return 0;
}

/* ---- I/O thread helpers --------------------------------------------------------- */
static int on_io_thread(zo_aio *a)
{
    return a->ops->is_io_thread && a->ops->is_io_thread(a);
}

void zo__aio_thread_setup(zo_aio *a, unsigned idx, const char *kind)
{
    char name[16];
    snprintf(name, sizeof(name), "zo-%s-%u", kind, idx);
    pthread_setname_np(pthread_self(), name);
    if (a->topo) {
        int rc = zo_topo_bind_thread(a->topo, a->cfg.numa_node);
        if (rc < 0)
            ZO_LOGW("I/O thread %u: cannot bind to NUMA node %d: %s", idx, a->cfg.numa_node, zo_strerror(rc));
    }
}

/* ---- create / destroy ----------------------------------------------------------- */
ZO_API int zo_aio_create(zo_aio **out, const zo_aio_config *cfgin)
{
    if (out)
        *out = NULL;
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_aio_create: out is NULL");
    zo_aio_config cfg;
    int rc = check_config(cfgin, &cfg, NULL);
    if (rc)
        return rc;
    zo_aio *a = calloc(1, sizeof(*a));
    if (!a)
        return ZO_FAIL(NULL, -ENOMEM, "zo_aio_create: out of memory");
    a->cfg = cfg;
    zo_list_init(&a->runq);
    zo_list_init(&a->held);
    zo_list_init(&a->live_link);
    pthread_mutex_init(&a->qlock, NULL);
    pthread_mutex_init(&a->elock, NULL);
    pthread_mutex_init(&a->reg_serial, NULL);
    pthread_rwlock_init(&a->rlock, NULL);
    a->info.threads = cfg.threads;
    a->info.queue_depth = cfg.queue_depth;
    a->info.block_size = cfg.block_size;

    if (cfg.numa_node >= 0) {
        rc = zo_topo_create(&a->topo);
        if (rc == 0 && zo_topo_node_cpus(a->topo, cfg.numa_node, NULL, 0) <= 0) {
            rc = ZO_FAIL(NULL, ZO_ECONFIG, "zo_aio_config.numa_node = %d: no such node with CPUs", cfg.numa_node);
            goto fail;
        }
        if (rc)
            goto fail;
    }

    char why[160] = "";
    int use_uring = cfg.backend != ZO_AIO_THREADS;
    if (use_uring) {
        pthread_mutex_lock(&live_lock);
        if (forced_unusable[0])
            snprintf(why, sizeof(why), "%s", forced_unusable);
        pthread_mutex_unlock(&live_lock);
#if ZO_HAVE_LIBURING
        if (!why[0] && zo__uring_probe(why, sizeof(why)) == 0)
            why[0] = '\0';
        else if (!why[0])
            snprintf(why, sizeof(why), "io_uring unusable");
#else
        if (!why[0])
            snprintf(why, sizeof(why), "built without liburing");
#endif
        if (why[0]) {
            if (cfg.backend == ZO_AIO_URING) {
                rc = ZO_FAIL(NULL, ZO_ENODEV, "io_uring backend asked for but unusable: %s", why);
                goto fail;
            }
            use_uring = 0;
        }
    }
#if ZO_HAVE_LIBURING
    if (use_uring) {
        a->ops = &zo__aio_uring_ops;
        a->info.backend = ZO_AIO_URING;
        rc = a->ops->start(a);
        if (rc == ZO_ENODEV && cfg.backend == ZO_AIO_AUTO) {
            snprintf(why, sizeof(why), "%s", a->info.fallback);
            use_uring = 0;
        } else if (rc) {
            goto fail;
        }
    }
#endif
    if (!use_uring) {
        memset(&a->info, 0, sizeof(a->info));
        a->info.threads = cfg.threads;
        a->info.queue_depth = cfg.queue_depth;
        a->info.block_size = cfg.block_size;
        a->info.backend = ZO_AIO_THREADS;
        if (cfg.backend == ZO_AIO_AUTO) {
            snprintf(a->info.fallback, sizeof(a->info.fallback), "io_uring unusable (%s): thread pool backend", why);
            ZO_LOGW("%s", a->info.fallback);
        }
        a->ops = &zo__aio_threads_ops;
        rc = a->ops->start(a);
        if (rc)
            goto fail;
    }

    pthread_mutex_lock(&live_lock);
    zo_list_add_tail(&live, &a->live_link);
    pthread_mutex_unlock(&live_lock);
    ZO_LOGD("engine: %s backend, %u threads, queue depth %u, block %zu%s%s", a->ops->name, cfg.threads,
            cfg.queue_depth, cfg.block_size, a->info.ring_setup[0] ? ", ring: " : "", a->info.ring_setup);
    *out = a;
    return 0;

fail:
    zo_topo_destroy(&a->topo);
    pthread_mutex_destroy(&a->qlock);
    pthread_mutex_destroy(&a->elock);
    pthread_mutex_destroy(&a->reg_serial);
    pthread_rwlock_destroy(&a->rlock);
    free(a);
    return rc;
}

ZO_API void zo_aio_destroy(zo_aio **pa)
{
    if (!pa || !*pa)
        return;
    zo_aio *a = *pa;
    if (on_io_thread(a)) { /* it would join itself */
        ZO_LOGE("zo_aio_destroy called from an I/O thread (a completion callback): refused");
        return;
    }
    *pa = NULL;

    pthread_mutex_lock(&live_lock);
    zo_list_del(&a->live_link);
    pthread_mutex_unlock(&live_lock);

    /* No new requests; what is queued is dropped as cancelled, what is in
     * flight is cancelled where the kernel can and drained either way. */
    pthread_mutex_lock(&a->qlock);
    atomic_store(&a->stopping, 1);
    zo_list *pos;
    zo_list_for_each(pos, &a->runq)
        atomic_store(&zo_list_entry(pos, zo_aio_req, qlink)->cancel, 1);
    pthread_mutex_unlock(&a->qlock);
    a->ops->stop(a);

    /* requests the caller never waited for */
    zo_list *n;
    while ((n = zo_list_pop_head(&a->held)))
        free(zo_list_entry(n, zo_aio_req, hlink));
    for (unsigned i = 0; i < a->nregions; i++) {
        free(a->regions[i]->ok);
        free(a->regions[i]);
    }
    zo_topo_destroy(&a->topo);
    pthread_mutex_destroy(&a->qlock);
    pthread_mutex_destroy(&a->elock);
    pthread_mutex_destroy(&a->reg_serial);
    pthread_rwlock_destroy(&a->rlock);
    free(a);
}

ZO_API zo_aio_backend zo_aio_get_backend(const zo_aio *a)
{
    return a ? a->info.backend : ZO_AIO_AUTO;
}

ZO_API const char *zo_aio_errmsg(const zo_aio *a)
{
    static _Thread_local char copy[ZO_ERRMSG_LEN];
    return zo__errbuf_tls(a ? &a->eb : NULL, copy);
}

ZO_API int zo_aio_get_info(const zo_aio *a, zo_aio_info *info)
{
    if (!a || !info)
        return ZO_FAIL(NULL, -EINVAL, "zo_aio_get_info: NULL argument");
    *info = a->info;
    return 0;
}

void zo__aio_set_fault(zo_aio *a, zo__aio_fault_fn fn, void *user)
{
    a->fault_user = user;
    a->fault = fn;
}

/* ---- regions ---------------------------------------------------------------------- */
/* Region holding all of [p, p+n), or NULL. Caller holds rlock. */
static zo__aio_region *region_find(zo_aio *a, const uint8_t *p, size_t n)
{
    unsigned lo = 0, hi = a->nregions;
    while (lo < hi) { /* first region with base > p */
        unsigned mid = (lo + hi) / 2;
        if (a->regions[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    zo__aio_region *r = a->regions[lo - 1];
    if ((uint64_t)(p - r->base) + n <= r->len)
        return r;
    return NULL;
}

ZO_API int zo_aio_register_region(zo_aio *a, void *p, size_t n, int *registered)
{
    if (registered)
        *registered = 0;
    if (!a || !p || n == 0 || (uintptr_t)p + n < (uintptr_t)p)
        return AIO_FAIL(a, -EINVAL, "zo_aio_register_region: NULL engine/pointer, size 0 or wraps");
    if (on_io_thread(a))
        return AIO_FAIL(a, ZO_ESTATE, "zo_aio_register_region: called from an I/O thread (a callback)");
    uint8_t *base = p;
    int rc = 0;
    pthread_mutex_lock(&a->reg_serial);
    pthread_rwlock_wrlock(&a->rlock);
    unsigned pos = 0;
    while (pos < a->nregions && a->regions[pos]->base < base)
        pos++;
    if ((pos > 0 && a->regions[pos - 1]->base + a->regions[pos - 1]->len > base) ||
        (pos < a->nregions && base + n > a->regions[pos]->base)) {
        pthread_rwlock_unlock(&a->rlock);
        rc = AIO_FAIL(a, -EEXIST, "zo_aio_register_region(%p, %zu): overlaps a registered region", p, n);
        goto out;
    }
    unsigned nslots = (unsigned)((n + ZO__AIO_BUF_SLOT_BYTES - 1) / ZO__AIO_BUF_SLOT_BYTES);
    unsigned slot0 = 0, run = 0;
    for (unsigned i = 0; i < ZO__AIO_BUF_SLOTS && run < nslots; i++) {
        if (a->slot_used[i]) {
            run = 0;
        } else {
            if (run == 0)
                slot0 = i;
            run++;
        }
    }
    if (a->nregions == ZO__AIO_MAX_REGIONS || run < nslots) {
        pthread_rwlock_unlock(&a->rlock);
        rc = AIO_FAIL(a, -ENOSPC, "zo_aio_register_region(%p, %zu): too many regions (%u) or buffer slots", p, n,
                     a->nregions);
        goto out;
    }
    zo__aio_region *r = calloc(1, sizeof(*r));
    uint8_t *ok = r ? calloc(a->cfg.threads, 1) : NULL;
    if (!ok) {
        free(r);
        pthread_rwlock_unlock(&a->rlock);
        rc = AIO_FAIL(a, -ENOMEM, "zo_aio_register_region: out of memory");
        goto out;
    }
    r->base = base;
    r->len = n;
    r->slot0 = slot0;
    r->nslots = nslots;
    r->ok = ok;
    for (unsigned i = 0; i < nslots; i++)
        a->slot_used[slot0 + i] = 1;
    memmove(&a->regions[pos + 1], &a->regions[pos], (a->nregions - pos) * sizeof(a->regions[0]));
    a->regions[pos] = r;
    a->nregions++;
    pthread_rwlock_unlock(&a->rlock);

    /* Recorded: requests inside it work from now on. Fixed buffers are an
     * optimisation on top, per ring. */
    if (a->cfg.register_buffers && a->info.fixed_buffers) {
        int err = a->ops->register_region(a, r);
        if (r->rings_ok == a->cfg.threads) {
            if (registered)
                *registered = 1;
        } else {
            atomic_fetch_add(&a->st.regions_fallback, 1);
            struct rlimit rl = {0};
            getrlimit(RLIMIT_MEMLOCK, &rl);
            char lim[32];
            if (rl.rlim_cur == RLIM_INFINITY)
                snprintf(lim, sizeof(lim), "unlimited");
            else
                snprintf(lim, sizeof(lim), "%llu bytes", (unsigned long long)rl.rlim_cur);
            AIO_FAIL(a, err ? err : -ENOMEM,
                    "fixed-buffer registration of %zu bytes refused by %u of %u rings (%s; RLIMIT_MEMLOCK %s): "
                    "the region uses unregistered I/O",
                    n, a->cfg.threads - r->rings_ok, a->cfg.threads, zo_strerror(err ? err : -ENOMEM), lim);
            if (!atomic_exchange(&memlock_warned, 1)) {
                ZO_LOGW("%s (raise ulimit -l for fixed buffers)", zo_last_error_detail());
            } else {
                ZO_LOGI("%s", zo_last_error_detail());
            }
        }
    }
out:
    pthread_mutex_unlock(&a->reg_serial);
    return rc;
}

ZO_API int zo_aio_unregister_region(zo_aio *a, void *p)
{
    if (!a || !p)
        return AIO_FAIL(a, -EINVAL, "zo_aio_unregister_region: NULL argument");
    if (on_io_thread(a))
        return AIO_FAIL(a, ZO_ESTATE, "zo_aio_unregister_region: called from an I/O thread (a callback)");
    pthread_mutex_lock(&a->reg_serial);
    pthread_rwlock_wrlock(&a->rlock);
    unsigned pos = 0;
    while (pos < a->nregions && a->regions[pos]->base != (uint8_t *)p)
        pos++;
    if (pos == a->nregions) {
        pthread_rwlock_unlock(&a->rlock);
        pthread_mutex_unlock(&a->reg_serial);
        return AIO_FAIL(a, -ENOENT, "zo_aio_unregister_region(%p): no region starts there", p);
    }
    zo__aio_region *r = a->regions[pos];
    memmove(&a->regions[pos], &a->regions[pos + 1], (a->nregions - pos - 1) * sizeof(a->regions[0]));
    a->nregions--;
    pthread_rwlock_unlock(&a->rlock);

    /* New requests no longer find it; wait for those that did. */
    for (;;) {
        uint32_t v = atomic_load(&r->refs);
        if (!v)
            break;
        zo__futex_wait(&r->refs, v);
    }
    if (r->rings_ok)
        a->ops->unregister_region(a, r);
    pthread_rwlock_wrlock(&a->rlock);
    for (unsigned i = 0; i < r->nslots; i++)
        a->slot_used[r->slot0 + i] = 0;
    pthread_rwlock_unlock(&a->rlock);
    pthread_mutex_unlock(&a->reg_serial);
    free(r->ok);
    free(r);
    return 0;
}

/* ---- requests --------------------------------------------------------------------- */
static void req_geometry(zo_aio *a, zo_aio_req *r)
{
    const zo_file *f = r->f;
    uint64_t A = f->direct ? f->offset_align : 1;
    uint64_t bs = ZO_MAX((uint64_t)a->cfg.block_size, A);
    uint64_t end = r->off + r->len;
    r->head_end = r->off;
    if (A > 1 && (r->off & (A - 1)))
        r->head_end = ZO_MIN(end, ZO_ALIGN_UP(r->off, A));
    r->body_end = end;
    if (A > 1)
        r->body_end = ZO_MAX(r->head_end, end & ~(A - 1));
    r->nhead = r->head_end > r->off;
    r->nbody = 0;
    if (r->body_end > r->head_end) {
        r->body_base = r->head_end & ~(bs - 1);
        r->nbody = (r->body_end - r->body_base + bs - 1) / bs;
    }
    r->npieces = r->nhead + r->nbody + (end > r->body_end);
}

/* Piece i of r: file offset and length. */
static void req_piece(const zo_aio *a, const zo_aio_req *r, uint64_t i, uint64_t *off, uint64_t *len)
{
    uint64_t A = r->f->direct ? r->f->offset_align : 1;
    uint64_t bs = ZO_MAX((uint64_t)a->cfg.block_size, A);
    if (i < r->nhead) {
        *off = r->off;
        *len = r->head_end - r->off;
        return;
    }
    i -= r->nhead;
    if (i < r->nbody) {
        uint64_t s = ZO_MAX(r->head_end, r->body_base + i * bs);
        uint64_t e = ZO_MIN(r->body_end, r->body_base + (i + 1) * bs);
        *off = s;
        *len = e - s;
        return;
    }
    *off = r->body_end;
    *len = r->off + r->len - r->body_end;
}

static void req_complete(zo_aio *a, zo_aio_req *r)
{
    int err = atomic_load(&r->error);
    int64_t result = err ? err : (int64_t)r->len;
    if (!err) {
        if (r->op == ZO__OP_READ) {
            atomic_fetch_add_explicit(&a->st.reads, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&a->st.bytes_read, r->len, memory_order_relaxed);
        } else {
            atomic_fetch_add_explicit(&a->st.writes, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&a->st.bytes_written, r->len, memory_order_relaxed);
        }
    } else {
        atomic_fetch_add_explicit(&a->st.errors, 1, memory_order_relaxed);
        if (err == -ECANCELED)
            atomic_fetch_add_explicit(&a->st.cancelled, 1, memory_order_relaxed);
    }
    /* r may be freed by its waiter (or below) the moment it is marked done,
     * so keep the region; its reference is dropped only after completion is
     * published, so a zo_aio_unregister_region() that returns guarantees the
     * requests that used the region are complete, not merely off the disk. */
    zo__aio_region *reg = r->region;
    if (r->cb) {
        /* a failing callback can read the detail (file, offset, length)
         * from zo_last_error_detail() or zo_aio_errmsg() */
        if (err)
            AIO_FAIL(a, err, "%s", r->detail);
        r->cb(r->user, result);
    }
    if (r->waitable) {
        r->result = result;
        uint32_t old = atomic_exchange(&r->state, ZO__REQ_DONE);
        if (old == ZO__REQ_WAITED)
            zo__futex_wake(&r->state, 1);
    } else {
        if (err && !r->cb) {
            pthread_mutex_lock(&a->elock);
            if (!a->ff_error) {
                a->ff_error = err;
                snprintf(a->ff_detail, sizeof(a->ff_detail), "%s", r->detail);
            }
            pthread_mutex_unlock(&a->elock);
            ZO_LOGD("fire-and-forget request failed: %s", r->detail);
        }
        free(r);
    }
    if (reg && atomic_fetch_sub(&reg->refs, 1) == 1)
        zo__futex_wake(&reg->refs, INT_MAX);
    if (atomic_fetch_sub(&a->outstanding, 1) == 1 && atomic_load(&a->all_waiters))
        zo__futex_wake(&a->outstanding, INT_MAX);
}

/* Finish `n` pieces of r that will never run (cancelled or failed request). */
static void req_drop_pieces(zo_aio *a, zo_aio_req *r, uint64_t n)
{
    if (!n)
        return;
    int expected = 0;
    if (atomic_load(&r->cancel) &&
        atomic_compare_exchange_strong(&r->error, &expected, -ECANCELED))
        snprintf(r->detail, sizeof(r->detail), "%s of %s, offset %llu, length %llu: cancelled",
                 r->op == ZO__OP_READ ? "read" : "write", r->f->path, (unsigned long long)r->off,
                 (unsigned long long)r->len);
    if (atomic_fetch_sub(&r->pending, n) == n)
        req_complete(a, r);
}

unsigned zo__aio_claim(zo_aio *a, zo__aio_piece **out, unsigned n)
{
    unsigned got = 0;
    /* Requests dropped here leave the run queue for this local list (by the
     * same link) and are finished after the lock is released. zo_aio_cancel
     * cannot take them back: it only unlinks a request whose next_piece <
     * npieces, and a dropped one has next_piece = npieces. */
    zo_list dropped = ZO_LIST_INIT(dropped);
    uint64_t ndropped = 0;
    if (!atomic_load_explicit(&a->queued, memory_order_relaxed))
        return 0;
    pthread_mutex_lock(&a->qlock);
    zo_list *first;
    while (got < n && (first = zo_list_first(&a->runq))) {
        zo_aio_req *r = zo_list_entry(first, zo_aio_req, qlink);
        if (atomic_load(&r->cancel) || atomic_load(&r->error)) {
            uint64_t skip = r->npieces - r->next_piece;
            r->next_piece = r->npieces;
            zo_list_move_tail(&dropped, &r->qlink);
            /* the count travels in result until req_drop_pieces */
            r->result = (int64_t)skip;
            ndropped += skip;
            continue;
        }
        while (got < n && r->next_piece < r->npieces) {
            zo__aio_piece *p = out[got++];
            uint64_t off, len;
            req_piece(a, r, r->next_piece++, &off, &len);
            p->req = r;
            p->off = off;
            p->buf = r->buf + (off - r->off);
            p->len = (uint32_t)len;
            p->done = 0;
            p->attempt = 0;
            p->eagain = 0;
            p->zero = 0;
            p->forced = 0;
        }
        if (r->next_piece == r->npieces)
            zo_list_del(&r->qlink);
    }
    atomic_fetch_sub(&a->queued, got + ndropped);
    pthread_mutex_unlock(&a->qlock);
    zo_list *dn;
    while ((dn = zo_list_pop_head(&dropped))) {
        zo_aio_req *r = zo_list_entry(dn, zo_aio_req, qlink);
        uint64_t skip = (uint64_t)r->result;
        r->result = 0;
        req_drop_pieces(a, r, skip);
    }
    return got;
}

void zo__aio_piece_next(zo_aio *a, zo__aio_piece *p)
{
    zo_aio_req *r = p->req;
    const zo_file *f = r->f;
    uint64_t off = p->off + p->done;
    uint32_t len = p->len - p->done;
    uint8_t *buf = p->buf + p->done;
    p->forced = 0;
    if (ZO_UNLIKELY(a->fault != NULL)) {
        zo__aio_fault_site s = {
            .op = r->op,
            .file = f,
            .req_off = r->off,
            .req_len = r->len,
            .off = off,
            .len = len,
            .attempt = p->attempt,
            .direct = zo__file_direct_ok(f, off, len, buf),
        };
        int64_t v = a->fault(a->fault_user, &s);
        if (v < 0)
            p->forced = v;
        else if (v > 0 && v < (int64_t)len)
            len = (uint32_t)v;
    }
    p->direct = zo__file_direct_ok(f, off, len, buf);
    p->fd = p->direct ? f->fd : f->bfd;
    p->cur_len = len;
    if (p->attempt == 0) {
        atomic_fetch_add_explicit(&a->st.chunks, 1, memory_order_relaxed);
        if (p->direct)
            atomic_fetch_add_explicit(&a->st.direct_chunks, 1, memory_order_relaxed);
        else
            atomic_fetch_add_explicit(&a->st.buffered_chunks, 1, memory_order_relaxed);
    }
    p->attempt++;
}

void zo__aio_piece_fail(zo_aio *a, zo__aio_piece *p, int err, const char *why)
{
    zo_aio_req *r = p->req;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&r->error, &expected, err))
        return;
    snprintf(r->detail, sizeof(r->detail), "%s of %s, offset %llu, length %llu: %s at offset %llu (%s)",
             r->op == ZO__OP_READ ? "read" : "write", r->f->path, (unsigned long long)r->off,
             (unsigned long long)r->len, why, (unsigned long long)(p->off + p->done), zo_strerror(err));
    ZO_LOGD("%s", r->detail);
}

int zo__aio_piece_result(zo_aio *a, zo__aio_piece *p, int64_t res)
{
    zo_aio_req *r = p->req;
    if (res > 0) {
        if (ZO_UNLIKELY(res > (int64_t)p->cur_len)) {
            zo__aio_piece_fail(a, p, ZO_EINTERNAL, "the kernel reported more bytes than asked for");
            return 0;
        }
        p->done += (uint32_t)res;
        if (p->done == p->len)
            return 0;
        if (atomic_load(&r->cancel)) {
            zo__aio_piece_fail(a, p, -ECANCELED, "cancelled");
            return 0;
        }
        if (atomic_load(&r->error))
            return 0; /* the request failed elsewhere: no point going on */
        atomic_fetch_add_explicit(&a->st.short_resumed, 1, memory_order_relaxed);
        return 1;
    }
    if (res == 0) {
        if (r->op == ZO__OP_READ) {
            struct stat st;
            char why[96];
            if (fstat(r->f->bfd, &st) == 0)
                snprintf(why, sizeof(why), "end of file (the file has %lld bytes) reading", (long long)st.st_size);
            else
                snprintf(why, sizeof(why), "end of file reading");
            zo__aio_piece_fail(a, p, ZO_ETRUNC, why);
            return 0;
        }
        if (++p->zero > a->cfg.eagain_retries) {
            zo__aio_piece_fail(a, p, -EIO, "writes make no progress");
            return 0;
        }
        return 1;
    }
    if (res == -EAGAIN || res == -EINTR) {
        if (atomic_load(&r->cancel)) {
            zo__aio_piece_fail(a, p, -ECANCELED, "cancelled");
            return 0;
        }
        if (++p->eagain > a->cfg.eagain_retries) {
            /* -EAGAIN whichever of the two came last, as documented: a
             * caller that retries on -EAGAIN must not see -EINTR */
            zo__aio_piece_fail(a, p, -EAGAIN, "still failing after the retry bound");
            return 0;
        }
        atomic_fetch_add_explicit(&a->st.eagain_retried, 1, memory_order_relaxed);
        return 1;
    }
    zo__aio_piece_fail(a, p, res < INT_MIN ? -EIO : (int)res, res == -ECANCELED ? "cancelled" : "I/O failed");
    return 0;
}

void zo__aio_piece_finish(zo_aio *a, zo__aio_piece *p)
{
    zo_aio_req *r = p->req;
    if (atomic_fetch_sub(&r->pending, 1) == 1)
        req_complete(a, r);
}

static int submit(zo_aio *a, int op, zo_file *f, void *buf, size_t len, uint64_t off, zo_aio_cb cb, void *user,
                  zo_aio_req **out)
{
    if (out)
        *out = NULL;
    const char *opn = op == ZO__OP_READ ? "zo_aio_read" : "zo_aio_write";
    if (!a || !f || !buf)
        return AIO_FAIL(a, -EINVAL, "%s: NULL %s", opn, !a ? "engine" : !f ? "file" : "buffer");
    if (len == 0)
        return AIO_FAIL(a, -EINVAL, "%s(%s, offset %llu): length 0", opn, f->path, (unsigned long long)off);
    if (off > (uint64_t)INT64_MAX || (uint64_t)len > (uint64_t)INT64_MAX - off)
        return AIO_FAIL(a, -EINVAL, "%s(%s): offset %llu + length %zu overflows", opn, f->path,
                       (unsigned long long)off, len);
    if (op == ZO__OP_READ ? !f->readable : !f->writable)
        return AIO_FAIL(a, -EBADF, "%s(%s): file not open for %s", opn, f->path,
                       op == ZO__OP_READ ? "reading" : "writing");
    zo_aio_req *r = malloc(sizeof(*r));
    if (!r)
        return AIO_FAIL(a, -ENOMEM, "%s: out of memory", opn);
    memset(r, 0, offsetof(zo_aio_req, detail));
    r->detail[0] = '\0';
    zo_list_init(&r->qlink);
    zo_list_init(&r->hlink);
    r->a = a;
    r->f = f;
    r->buf = buf;
    r->off = off;
    r->len = len;
    r->op = op;
    r->cb = cb;
    r->user = user;
    r->waitable = out != NULL;
    req_geometry(a, r);
    atomic_init(&r->pending, r->npieces);

    if (a->nregions) { /* racy peek; the lookup itself is locked */
        pthread_rwlock_rdlock(&a->rlock);
        zo__aio_region *reg = region_find(a, buf, len);
        if (reg) {
            atomic_fetch_add(&reg->refs, 1);
            r->region = reg;
        }
        pthread_rwlock_unlock(&a->rlock);
    }

    atomic_fetch_add(&a->outstanding, 1);
    pthread_mutex_lock(&a->qlock);
    if (ZO_UNLIKELY(atomic_load(&a->stopping))) {
        pthread_mutex_unlock(&a->qlock);
        if (r->region && atomic_fetch_sub(&r->region->refs, 1) == 1)
            zo__futex_wake(&r->region->refs, INT_MAX);
        free(r);
        if (atomic_fetch_sub(&a->outstanding, 1) == 1 && atomic_load(&a->all_waiters))
            zo__futex_wake(&a->outstanding, INT_MAX);
        return AIO_FAIL(a, ZO_ESTATE, "%s: the engine is being destroyed", opn);
    }
    r->seq = ++a->seq;
    zo_list_add_tail(&a->runq, &r->qlink);
    if (r->waitable)
        zo_list_add_tail(&a->held, &r->hlink);
    uint64_t npieces = r->npieces; /* r may be complete and freed once unlocked */
    atomic_fetch_add(&a->queued, npieces);
    if (out)
        *out = r;
    pthread_mutex_unlock(&a->qlock);
    a->ops->kick(a, npieces);
    return 0;
}

ZO_API int zo_aio_read(zo_aio *a, zo_file *f, void *buf, size_t len, uint64_t offset, zo_aio_cb cb, void *user,
                       zo_aio_req **out)
{
    return submit(a, ZO__OP_READ, f, buf, len, offset, cb, user, out);
}

ZO_API int zo_aio_write(zo_aio *a, zo_file *f, const void *buf, size_t len, uint64_t offset, zo_aio_cb cb,
                        void *user, zo_aio_req **out)
{
    return submit(a, ZO__OP_WRITE, f, (void *)buf, len, offset, cb, user, out);
}

static int req_release(zo_aio *a, zo_aio_req *r, int64_t *result)
{
    int64_t res = r->result;
    char detail[sizeof(r->detail)];
    if (res < 0)
        memcpy(detail, r->detail, sizeof(detail));
    pthread_mutex_lock(&a->qlock);
    zo_list_del(&r->hlink);
    pthread_mutex_unlock(&a->qlock);
    free(r);
    if (result)
        *result = res;
    if (res < 0)
        return AIO_FAIL(a, (int)res, "%s", detail);
    return 0;
}

ZO_API int zo_aio_wait(zo_aio *a, zo_aio_req *r, int64_t *result)
{
    if (!a || !r || r->a != a || !r->waitable)
        return AIO_FAIL(a, -EINVAL, "zo_aio_wait: NULL or foreign request");
    uint32_t s = atomic_load(&r->state);
    if (s != ZO__REQ_DONE && on_io_thread(a)) /* it could wait for itself */
        return AIO_FAIL(a, ZO_ESTATE, "zo_aio_wait: called from an I/O thread (a callback) on a request in flight");
    while (s != ZO__REQ_DONE) {
        if (s == ZO__REQ_INFLIGHT) {
            uint32_t exp = ZO__REQ_INFLIGHT;
            if (!atomic_compare_exchange_strong(&r->state, &exp, ZO__REQ_WAITED)) {
                s = exp;
                continue;
            }
        }
        zo__futex_wait(&r->state, ZO__REQ_WAITED);
        s = atomic_load(&r->state);
    }
    return req_release(a, r, result);
}

ZO_API int zo_aio_test(zo_aio *a, zo_aio_req *r, int64_t *result)
{
    if (!a || !r || r->a != a || !r->waitable)
        return AIO_FAIL(a, -EINVAL, "zo_aio_test: NULL or foreign request");
    if (atomic_load(&r->state) != ZO__REQ_DONE)
        return ZO_PENDING; /* positive: a request that failed with -EBUSY is finished */
    return req_release(a, r, result);
}

ZO_API int zo_aio_cancel(zo_aio *a, zo_aio_req *r)
{
    if (!a || !r || r->a != a)
        return AIO_FAIL(a, -EINVAL, "zo_aio_cancel: NULL or foreign request");
    if (atomic_load(&r->state) == ZO__REQ_DONE)
        return 0;
    atomic_store(&r->cancel, 1);
    /* Pieces not claimed yet are dropped now. */
    uint64_t skip = 0;
    pthread_mutex_lock(&a->qlock);
    if (r->next_piece < r->npieces) { /* still on the run queue: unlink in O(1) */
        skip = r->npieces - r->next_piece;
        r->next_piece = r->npieces;
        zo_list_del(&r->qlink);
        atomic_fetch_sub(&a->queued, skip);
    }
    pthread_mutex_unlock(&a->qlock);
    req_drop_pieces(a, r, skip);
    /* and those in flight are cancelled where the kernel can */
    a->ops->cancel(a);
    return 0;
}

ZO_API int zo_aio_wait_all(zo_aio *a)
{
    if (!a)
        return ZO_FAIL(NULL, -EINVAL, "zo_aio_wait_all: NULL engine");
    if (on_io_thread(a))
        return AIO_FAIL(a, ZO_ESTATE, "zo_aio_wait_all: called from an I/O thread (a callback)");
    for (;;) {
        uint32_t v = atomic_load(&a->outstanding);
        if (!v)
            break;
        atomic_fetch_add(&a->all_waiters, 1);
        v = atomic_load(&a->outstanding);
        if (v)
            zo__futex_wait(&a->outstanding, v);
        atomic_fetch_sub(&a->all_waiters, 1);
    }
    pthread_mutex_lock(&a->elock);
    int err = a->ff_error;
    char detail[ZO_ERRMSG_LEN];
    memcpy(detail, a->ff_detail, sizeof(detail));
    a->ff_error = 0;
    a->ff_detail[0] = '\0';
    pthread_mutex_unlock(&a->elock);
    if (err)
        return AIO_FAIL(a, err, "%s", detail);
    return 0;
}

ZO_API void zo_aio_get_stats(zo_aio *a, zo_aio_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof(*st));
    if (!a)
        return;
#define LD(x) atomic_load_explicit(&a->st.x, memory_order_relaxed)
    st->reads = LD(reads);
    st->writes = LD(writes);
    st->bytes_read = LD(bytes_read);
    st->bytes_written = LD(bytes_written);
    st->chunks = LD(chunks);
    st->fixed_chunks = LD(fixed_chunks);
    st->short_resumed = LD(short_resumed);
    st->eagain_retried = LD(eagain_retried);
    st->errors = LD(errors);
    st->direct_chunks = LD(direct_chunks);
    st->buffered_chunks = LD(buffered_chunks);
    st->cancelled = LD(cancelled);
    st->regions_fallback = LD(regions_fallback);
#undef LD
    pthread_rwlock_rdlock(&a->rlock);
    st->regions = a->nregions;
    pthread_rwlock_unlock(&a->rlock);
    st->inflight = atomic_load(&a->outstanding);
}
