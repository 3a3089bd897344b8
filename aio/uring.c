/* SPDX-License-Identifier: Apache-2.0 */
/*
 * io_uring backend: one ring per I/O thread, created by that thread so the
 * ring can be single-issuer with deferred task running (completions are
 * run only when the owner waits: no interrupts of the thread, no lock
 * contention in the kernel). Each thread keeps up to queue_depth pieces in
 * flight, submits and waits in one system call, and resubmits what a
 * completion left undone.
 *
 * Wake-ups: an eventfd read is always armed in the ring. Submitters write
 * the eventfd only when the thread sleeps with free slots; control messages
 * (register a region, forget a file) always write it.
 *
 * Registered files: a small direct-mapped table per ring (sparse, updated
 * on first use). A slot in use by I/O in flight is never replaced; a
 * colliding file then simply goes unregistered for that piece.
 * Fixed buffers: a sparse table of ZO__AIO_BUF_SLOTS per ring; a region
 * takes one slot per GiB (the kernel's limit per buffer).
 */
#include "aio_internal.h"

#if ZO_HAVE_LIBURING

#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define TAG_EFD 1ull
#define TAG_CANCEL 2ull
#define FTAB 64 /* registered file slots per ring (power of two) */

enum { CTL_REG_BUF = 1, CTL_UNREG_BUF, CTL_FORGET_FILE };

typedef struct ctl_msg {
    int type;
    int sync;            /* the sender waits on done; else the worker frees it */
    zo__aio_region *region;
    uint64_t file_id;
    int rc;
    _Atomic uint32_t done;
    zo_qnode qn;         /* on the worker's ctl queue */
} ctl_msg;

typedef struct uslot {
    zo__aio_piece p;
    zo_list free_link;  /* on the worker's free list while not in use */
    int fslot;          /* registered file slot in use, -1 if none */
    int in_use;
    int cancel_sent;
} uslot;

typedef struct fent {
    uint64_t key;       /* file id << 1 | direct; 0 = empty */
    uint32_t inflight;
} fent;

typedef struct uworker {
    zo_aio *a;
    struct uring_be *be;
    unsigned idx;
    pthread_t th;
    int thread_ok;
    struct io_uring ring;
    int efd;
    uint64_t efd_val;
    int efd_armed, efd_cancel_sent;
    unsigned aux_inflight; /* eventfd read and cancel requests */
    _Atomic int sleeping;
    uslot *slots;
    zo_list free;          /* uslot by free_link; last freed first (cache-warm) */
    unsigned inflight;     /* slots in use */
    fent ftab[FTAB];
    int files_ok, bufs_ok;
    int stop_seen;
    pthread_mutex_t cl;
    zo_queue ctl;          /* ctl_msg, under cl */
    _Atomic int ctl_pending;
    _Atomic unsigned cancel_gen;
    unsigned cancel_seen;
    /* start-up report */
    int start_rc;
    unsigned flags_used;
    int sqpoll_on;
    char why[160];
    _Atomic uint32_t started;
} uworker;

typedef struct uring_be {
    unsigned n;
    uworker *w;
    _Atomic int stop;
    _Atomic unsigned rr;
} uring_be;

/* ---- probing --------------------------------------------------------------------- */
int zo__uring_probe(char *why, size_t len)
{
    char buf[32];
    if (zo__read_text("/proc/sys/kernel/io_uring_disabled", buf, sizeof(buf)) > 0 && buf[0] == '2') {
        snprintf(why, len, "io_uring disabled by sysctl kernel.io_uring_disabled=2");
        return ZO_ENODEV;
    }
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc < 0) {
        if (rc == -ENOSYS)
            snprintf(why, len, "kernel without io_uring (ENOSYS)");
        else if (rc == -EPERM)
            snprintf(why, len, "io_uring refused (EPERM: kernel.io_uring_disabled or seccomp)");
        else
            snprintf(why, len, "io_uring_setup failed: %s", strerror(-rc));
        return ZO_ENODEV;
    }
    struct io_uring_probe *pr = io_uring_get_probe_ring(&ring);
    rc = 0;
    if (!pr) {
        snprintf(why, len, "kernel too old to probe io_uring operations (needs 5.6)");
        rc = ZO_ENODEV;
    } else {
        static const struct {
            int op;
            const char *name;
        } need[] = {
            {IORING_OP_READ, "READ"},           {IORING_OP_WRITE, "WRITE"},
            {IORING_OP_READ_FIXED, "READ_FIXED"}, {IORING_OP_WRITE_FIXED, "WRITE_FIXED"},
            {IORING_OP_NOP, "NOP"},             {IORING_OP_ASYNC_CANCEL, "ASYNC_CANCEL"},
        };
        for (size_t i = 0; i < ZO_ARRAY_LEN(need); i++)
            if (!io_uring_opcode_supported(pr, need[i].op)) {
                snprintf(why, len, "io_uring lacks IORING_OP_%s", need[i].name);
                rc = ZO_ENODEV;
                break;
            }
        io_uring_free_probe(pr);
    }
    io_uring_queue_exit(&ring);
    return rc;
}

/* ---- ring set-up, in the worker thread --------------------------------------------- */
static void flags_words(unsigned fl, char *buf, size_t len)
{
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {
        {IORING_SETUP_SQPOLL, "sqpoll"},
        {IORING_SETUP_SUBMIT_ALL, "submit_all"},
        {IORING_SETUP_COOP_TASKRUN, "coop_taskrun"},
        {IORING_SETUP_SINGLE_ISSUER, "single_issuer"},
        {IORING_SETUP_DEFER_TASKRUN, "defer_taskrun"},
    };
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < ZO_ARRAY_LEN(names); i++)
        if (fl & names[i].bit)
            o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%s%s", o ? " " : "", names[i].name);
    if (!o)
        snprintf(buf, len, "none");
}

static int ring_setup(uworker *w)
{
    zo_aio *a = w->a;
    static const unsigned plain[] = {
        IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER,
        IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN,
        IORING_SETUP_SUBMIT_ALL,
        0,
    };
    static const unsigned sqpoll[] = {
        IORING_SETUP_SQPOLL | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER,
        IORING_SETUP_SQPOLL | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_SQPOLL,
    };
    /* Room for every piece in flight, as many cancels, and the eventfd. */
    unsigned entries = 8;
    while (entries < 2 * a->cfg.queue_depth + 4)
        entries <<= 1;
    int rc = -EINVAL;
    if (a->cfg.sqpoll) {
        for (size_t i = 0; i < ZO_ARRAY_LEN(sqpoll); i++) {
            struct io_uring_params p;
            memset(&p, 0, sizeof(p));
            p.flags = sqpoll[i];
            p.sq_thread_idle = a->cfg.sqpoll_idle_ms;
            rc = io_uring_queue_init_params(entries, &w->ring, &p);
            if (rc == 0) {
                w->flags_used = sqpoll[i];
                w->sqpoll_on = 1;
                break;
            }
            if (rc != -EINVAL)
                break;
        }
        if (rc)
            snprintf(w->why, sizeof(w->why), "SQPOLL refused (%s): rings without it", strerror(-rc));
    }
    if (rc) {
        for (size_t i = 0; i < ZO_ARRAY_LEN(plain); i++) {
            struct io_uring_params p;
            memset(&p, 0, sizeof(p));
            p.flags = plain[i];
            rc = io_uring_queue_init_params(entries, &w->ring, &p);
            if (rc == 0) {
                w->flags_used = plain[i];
                break;
            }
            if (rc != -EINVAL)
                break;
        }
    }
    if (rc) {
        snprintf(w->why, sizeof(w->why), "io_uring_queue_init (%u entries): %s", entries, strerror(-rc));
        return rc == -EPERM || rc == -ENOSYS ? ZO_ENODEV : rc;
    }
    /* Optional extras: each failure only loses an optimisation. */
    io_uring_register_ring_fd(&w->ring);
    if (a->cfg.register_files) {
        rc = io_uring_register_files_sparse(&w->ring, FTAB);
        w->files_ok = rc == 0;
        if (rc)
            ZO_LOGI("ring %u: no registered files (%s)", w->idx, strerror(-rc));
    }
    if (a->cfg.register_buffers) {
        rc = io_uring_register_buffers_sparse(&w->ring, ZO__AIO_BUF_SLOTS);
        w->bufs_ok = rc == 0;
        if (rc)
            ZO_LOGI("ring %u: no fixed buffers (%s)", w->idx, strerror(-rc));
    }
    w->efd = eventfd(0, EFD_CLOEXEC);
    if (w->efd < 0) {
        rc = -errno;
        snprintf(w->why, sizeof(w->why), "eventfd: %s", strerror(errno));
        io_uring_queue_exit(&w->ring);
        return rc;
    }
    w->slots = calloc(a->cfg.queue_depth, sizeof(*w->slots));
    if (!w->slots) {
        close(w->efd);
        w->efd = -1;
        io_uring_queue_exit(&w->ring);
        snprintf(w->why, sizeof(w->why), "out of memory");
        return -ENOMEM;
    }
    for (unsigned i = a->cfg.queue_depth; i-- > 0;)
        zo_list_add_head(&w->free, &w->slots[i].free_link);
    return 0;
}

/* ---- submission -------------------------------------------------------------------- */
static struct io_uring_sqe *get_sqe(uworker *w)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    while (!sqe) {
        io_uring_submit(&w->ring);
        sqe = io_uring_get_sqe(&w->ring);
    }
    return sqe;
}

static void arm_efd(uworker *w)
{
    struct io_uring_sqe *sqe = get_sqe(w);
    io_uring_prep_read(sqe, w->efd, &w->efd_val, sizeof(w->efd_val), 0);
    io_uring_sqe_set_data64(sqe, TAG_EFD);
    w->efd_armed = 1;
    w->aux_inflight++;
}

static void prep_cancel(uworker *w, uint64_t target)
{
    struct io_uring_sqe *sqe = get_sqe(w);
    io_uring_prep_cancel64(sqe, target, 0);
    io_uring_sqe_set_data64(sqe, TAG_CANCEL);
    w->aux_inflight++;
}

static inline unsigned ftab_hash(uint64_t key)
{
    return (unsigned)((key * 0x9e3779b97f4a7c15ull) >> 58) & (FTAB - 1);
}

/* Registered file index for (f, direct), registering on a miss; -1 = use
 * the plain descriptor. */
static int file_index(uworker *w, const zo_file *f, int direct)
{
    if (!w->files_ok)
        return -1;
    uint64_t key = (f->id << 1) | (uint64_t)(direct != 0);
    unsigned h = ftab_hash(key);
    fent *e = &w->ftab[h];
    if (e->key != key) {
        if (e->inflight)
            return -1;
        int fd = direct ? f->fd : f->bfd;
        if (io_uring_register_files_update(&w->ring, h, &fd, 1) != 1) {
            e->key = 0;
            return -1;
        }
        e->key = key;
    }
    e->inflight++;
    return (int)h;
}

static void submit_slot(uworker *w, uslot *s)
{
    zo_aio *a = w->a;
    zo__aio_piece *p = &s->p;
    int first = p->attempt == 0;
    zo__aio_piece_next(a, p);
    struct io_uring_sqe *sqe = get_sqe(w);
    if (ZO_UNLIKELY(p->forced < 0)) {
        io_uring_prep_nop(sqe);
        s->fslot = -1;
    } else {
        zo_aio_req *r = p->req;
        uint8_t *buf = p->buf + p->done;
        uint64_t off = p->off + p->done;
        int fidx = file_index(w, r->f, p->direct);
        int fd = fidx >= 0 ? fidx : p->fd;
        int bidx = w->bufs_ok ? zo__region_slot(r->region, w->idx, buf, p->cur_len) : -1;
        if (r->op == ZO__OP_READ) {
            if (bidx >= 0)
                io_uring_prep_read_fixed(sqe, fd, buf, p->cur_len, off, bidx);
            else
                io_uring_prep_read(sqe, fd, buf, p->cur_len, off);
        } else {
            if (bidx >= 0)
                io_uring_prep_write_fixed(sqe, fd, buf, p->cur_len, off, bidx);
            else
                io_uring_prep_write(sqe, fd, buf, p->cur_len, off);
        }
        if (fidx >= 0)
            sqe->flags |= IOSQE_FIXED_FILE;
        if (bidx >= 0 && first)
            atomic_fetch_add_explicit(&a->st.fixed_chunks, 1, memory_order_relaxed);
        s->fslot = fidx;
    }
    io_uring_sqe_set_data(sqe, s);
}

/* Claim pieces into free slots and prepare them. */
static void fill(uworker *w)
{
    zo__aio_piece *batch[16];
    while (!zo_list_empty(&w->free)) {
        /* claim into the first free slots, in free-list order */
        unsigned n = 0;
        zo_list *pos;
        zo_list_for_each(pos, &w->free) {
            if (n == 16)
                break;
            batch[n++] = &zo_list_entry(pos, uslot, free_link)->p;
        }
        unsigned got = zo__aio_claim(w->a, batch, n);
        for (unsigned i = 0; i < got; i++) {
            uslot *s = zo_list_entry(zo_list_pop_head(&w->free), uslot, free_link);
            s->in_use = 1;
            s->cancel_sent = 0;
            w->inflight++;
            submit_slot(w, s);
        }
        if (got < n)
            break;
    }
}

/* ---- completion -------------------------------------------------------------------- */
static void handle_cqe(uworker *w, uint64_t ud, int res)
{
    if (ud == TAG_EFD) {
        w->efd_armed = 0;
        w->aux_inflight--;
        return;
    }
    if (ud == TAG_CANCEL) {
        w->aux_inflight--;
        return;
    }
    uslot *s = (uslot *)(uintptr_t)ud;
    if (s->fslot >= 0)
        w->ftab[s->fslot].inflight--;
    int64_t v = ZO_UNLIKELY(s->p.forced < 0) ? s->p.forced : (int64_t)res;
    if (zo__aio_piece_result(w->a, &s->p, v)) {
        s->cancel_sent = 0;
        submit_slot(w, s);
        return;
    }
    zo__aio_piece_finish(w->a, &s->p);
    s->in_use = 0;
    zo_list_add_head(&w->free, &s->free_link);
    w->inflight--;
}

static void reap(uworker *w)
{
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&w->ring, head, cqe)
    {
        n++;
        handle_cqe(w, cqe->user_data, cqe->res);
    }
    io_uring_cq_advance(&w->ring, n);
}

/* ---- control messages ----------------------------------------------------------------- */
static void do_reg_buf(uworker *w, ctl_msg *m)
{
    zo__aio_region *r = m->region;
    if (!w->bufs_ok) {
        m->rc = ZO_ENOTSUP;
        return;
    }
    struct iovec iov[64];
    unsigned done = 0;
    m->rc = 0;
    while (done < r->nslots) {
        unsigned k = ZO_MIN(r->nslots - done, (unsigned)ZO_ARRAY_LEN(iov));
        for (unsigned i = 0; i < k; i++) {
            uint64_t o = (uint64_t)(done + i) * ZO__AIO_BUF_SLOT_BYTES;
            iov[i].iov_base = r->base + o;
            iov[i].iov_len = (size_t)ZO_MIN((uint64_t)r->len - o, ZO__AIO_BUF_SLOT_BYTES);
        }
        int rc = io_uring_register_buffers_update_tag(&w->ring, r->slot0 + done, iov, NULL, k);
        if (rc != (int)k) {
            m->rc = rc < 0 ? rc : -ENOMEM;
            break;
        }
        done += k;
    }
    if (m->rc) { /* undo the slots that did register */
        for (unsigned i = 0; i < done; i++) {
            struct iovec z = {0};
            io_uring_register_buffers_update_tag(&w->ring, r->slot0 + i, &z, NULL, 1);
        }
        return;
    }
    r->ok[w->idx] = 1;
}

static void do_unreg_buf(uworker *w, ctl_msg *m)
{
    zo__aio_region *r = m->region;
    if (!r->ok[w->idx])
        return;
    for (unsigned i = 0; i < r->nslots; i++) {
        struct iovec z = {0};
        io_uring_register_buffers_update_tag(&w->ring, r->slot0 + i, &z, NULL, 1);
    }
    r->ok[w->idx] = 0;
}

static void do_forget(uworker *w, uint64_t id)
{
    for (unsigned i = 0; i < FTAB; i++) {
        if (w->ftab[i].key && (w->ftab[i].key >> 1) == id) {
            int fd = -1;
            io_uring_register_files_update(&w->ring, i, &fd, 1);
            w->ftab[i].key = 0;
        }
    }
}

static void process_ctl(uworker *w)
{
    zo_queue q;
    zo_queue_init(&q);
    pthread_mutex_lock(&w->cl);
    zo_queue_splice(&q, &w->ctl);
    atomic_store(&w->ctl_pending, 0);
    pthread_mutex_unlock(&w->cl);
    zo_qnode *n;
    while ((n = zo_queue_pop(&q))) {
        ctl_msg *m = zo_queue_entry(n, ctl_msg, qn);
        switch (m->type) {
        case CTL_REG_BUF: do_reg_buf(w, m); break;
        case CTL_UNREG_BUF: do_unreg_buf(w, m); break;
        case CTL_FORGET_FILE: do_forget(w, m->file_id); break;
        default: break;
        }
        if (m->sync) {
            atomic_store(&m->done, 1);
            zo__futex_wake(&m->done, 1);
        } else {
            free(m);
        }
    }
}

static void wake(uworker *w)
{
    eventfd_write(w->efd, 1);
}

static void post_ctl(uworker *w, ctl_msg *m)
{
    pthread_mutex_lock(&w->cl);
    zo_queue_push(&w->ctl, &m->qn);
    atomic_store(&w->ctl_pending, 1);
    pthread_mutex_unlock(&w->cl);
    wake(w);
}

static int call_ctl(uworker *w, ctl_msg *m)
{
    m->sync = 1;
    atomic_store(&m->done, 0);
    post_ctl(w, m);
    while (!atomic_load(&m->done))
        zo__futex_wait(&m->done, 0);
    return m->rc;
}

/* ---- the I/O thread -------------------------------------------------------------- */
static void scan_cancels(uworker *w, int all)
{
    for (unsigned i = 0; i < w->a->cfg.queue_depth; i++) {
        uslot *s = &w->slots[i];
        if (!s->in_use || s->cancel_sent)
            continue;
        if (all)
            atomic_store(&s->p.req->cancel, 1);
        else if (!atomic_load(&s->p.req->cancel))
            continue;
        prep_cancel(w, (uint64_t)(uintptr_t)s);
        s->cancel_sent = 1;
    }
}

static void run(uworker *w)
{
    zo_aio *a = w->a;
    uring_be *be = w->be;
    for (;;) {
        if (atomic_load(&w->ctl_pending))
            process_ctl(w);
        unsigned cg = atomic_load(&w->cancel_gen);
        if (cg != w->cancel_seen) {
            w->cancel_seen = cg;
            scan_cancels(w, 0);
        }
        int stopping = atomic_load(&be->stop);
        if (stopping && !w->stop_seen) {
            w->stop_seen = 1;
            scan_cancels(w, 1);
        }
        fill(w);
        if (stopping && w->inflight == 0 && atomic_load(&a->queued) == 0) {
            if (w->efd_armed && !w->efd_cancel_sent) {
                prep_cancel(w, TAG_EFD);
                w->efd_cancel_sent = 1;
            }
            if (!w->efd_armed && w->aux_inflight == 0)
                break;
        }
        if (!w->efd_armed && !stopping)
            arm_efd(w);
        if (!zo_list_empty(&w->free) && !stopping) {
            /* Sleeping with free slots: ask submitters to wake us, then look
             * once more (they may have queued before seeing the flag). */
            atomic_store(&w->sleeping, 1);
            if (atomic_load(&a->queued) || atomic_load(&w->ctl_pending) ||
                atomic_load(&w->cancel_gen) != w->cancel_seen) {
                atomic_store(&w->sleeping, 0);
                continue;
            }
        }
        int rc = io_uring_submit_and_wait(&w->ring, 1);
        atomic_store(&w->sleeping, 0);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME)
            ZO_LOGE("ring %u: io_uring_enter: %s", w->idx, strerror(-rc));
        reap(w);
    }
    if (atomic_load(&w->ctl_pending))
        process_ctl(w);
}

static void *worker_main(void *arg)
{
    uworker *w = arg;
    zo__aio_thread_setup(w->a, w->idx, "uring");
    w->start_rc = ring_setup(w);
    atomic_store(&w->started, 1);
    zo__futex_wake(&w->started, INT32_MAX);
    if (w->start_rc)
        return NULL;
    run(w);
    io_uring_queue_exit(&w->ring);
    free(w->slots);
    return NULL; /* the eventfd is closed after the join: others may still write it */
}

/* ---- ops ---------------------------------------------------------------------------------- */
static void be_free(uring_be *be)
{
    for (unsigned i = 0; i < be->n; i++) {
        if (be->w[i].efd >= 0)
            close(be->w[i].efd);
        pthread_mutex_destroy(&be->w[i].cl);
    }
    free(be->w);
    free(be);
}

static void stop_started(uring_be *be)
{
    atomic_store(&be->stop, 1);
    for (unsigned i = 0; i < be->n; i++) {
        uworker *w = &be->w[i];
        if (!w->thread_ok)
            continue;
        if (w->start_rc == 0)
            wake(w);
        pthread_join(w->th, NULL);
    }
}

static int u_start(zo_aio *a)
{
    uring_be *be = calloc(1, sizeof(*be));
    uworker *ws = be ? calloc(a->cfg.threads, sizeof(*ws)) : NULL;
    if (!ws) {
        free(be);
        return ZO_FAIL(&a->eb, -ENOMEM, "zo_aio_create: out of memory");
    }
    be->n = a->cfg.threads;
    be->w = ws;
    int rc = 0;
    for (unsigned i = 0; i < be->n; i++) {
        uworker *w = &ws[i];
        w->a = a;
        w->be = be;
        w->idx = i;
        w->efd = -1;
        zo_list_init(&w->free);
        zo_queue_init(&w->ctl);
        pthread_mutex_init(&w->cl, NULL);
    }
    for (unsigned i = 0; i < be->n && !rc; i++) {
        uworker *w = &ws[i];
        int e = pthread_create(&w->th, NULL, worker_main, w);
        if (e) {
            rc = ZO_FAIL(&a->eb, -e, "zo_aio_create: cannot start I/O thread %u: %s", i, strerror(e));
            break;
        }
        w->thread_ok = 1;
        while (!atomic_load(&w->started))
            zo__futex_wait(&w->started, 0);
        if (w->start_rc) {
            rc = w->start_rc;
            snprintf(a->info.fallback, sizeof(a->info.fallback), "%s", w->why);
            ZO_FAIL(&a->eb, rc, "io_uring ring %u: %s", i, w->why);
        }
    }
    if (rc) {
        stop_started(be);
        be_free(be);
        return rc;
    }
    uworker *w0 = &ws[0];
    a->backend = be;
    a->info.backend = ZO_AIO_URING;
    a->info.ring_flags = w0->flags_used;
    a->info.sqpoll = w0->sqpoll_on;
    a->info.registered_files = 1;
    a->info.fixed_buffers = 1;
    for (unsigned i = 0; i < be->n; i++) {
        a->info.registered_files &= ws[i].files_ok;
        a->info.fixed_buffers &= ws[i].bufs_ok;
    }
    flags_words(w0->flags_used, a->info.ring_setup, sizeof(a->info.ring_setup));
    if (w0->why[0]) { /* SQPOLL dropped */
        snprintf(a->info.fallback, sizeof(a->info.fallback), "%s", w0->why);
        ZO_LOGW("%s", w0->why);
    }
    return 0;
}

static void u_kick(zo_aio *a, uint64_t n)
{
    uring_be *be = a->backend;
    unsigned start = atomic_fetch_add_explicit(&be->rr, 1, memory_order_relaxed);
    uint64_t woke = 0;
    for (unsigned k = 0; k < be->n && woke < n; k++) {
        uworker *w = &be->w[(start + k) % be->n];
        if (atomic_load(&w->sleeping) && atomic_exchange(&w->sleeping, 0)) {
            wake(w);
            woke++;
        }
    }
}

static int u_register_region(zo_aio *a, zo__aio_region *r)
{
    uring_be *be = a->backend;
    int first = 0;
    r->rings_ok = 0;
    for (unsigned i = 0; i < be->n; i++) {
        ctl_msg m = {.type = CTL_REG_BUF, .region = r};
        int rc = call_ctl(&be->w[i], &m);
        if (rc == 0)
            r->rings_ok++;
        else if (!first)
            first = rc;
    }
    return first;
}

static void u_unregister_region(zo_aio *a, zo__aio_region *r)
{
    uring_be *be = a->backend;
    for (unsigned i = 0; i < be->n; i++) {
        ctl_msg m = {.type = CTL_UNREG_BUF, .region = r};
        call_ctl(&be->w[i], &m);
    }
    r->rings_ok = 0;
}

static void u_forget_file(zo_aio *a, uint64_t id)
{
    uring_be *be = a->backend;
    for (unsigned i = 0; i < be->n; i++) {
        ctl_msg *m = calloc(1, sizeof(*m));
        if (!m) /* the ring keeps the file until its slot is reused or the engine ends */
            continue;
        m->type = CTL_FORGET_FILE;
        m->file_id = id;
        post_ctl(&be->w[i], m);
    }
}

static void u_cancel(zo_aio *a)
{
    uring_be *be = a->backend;
    for (unsigned i = 0; i < be->n; i++) {
        atomic_fetch_add(&be->w[i].cancel_gen, 1);
        wake(&be->w[i]);
    }
}

static void u_stop(zo_aio *a)
{
    uring_be *be = a->backend;
    stop_started(be);
    be_free(be);
    a->backend = NULL;
}

static int u_is_io_thread(zo_aio *a)
{
    uring_be *be = a->backend;
    pthread_t self = pthread_self();
    for (unsigned i = 0; i < be->n; i++)
        if (pthread_equal(be->w[i].th, self))
            return 1;
    return 0;
}

const zo__aio_ops zo__aio_uring_ops = {
    .name = "uring",
    .start = u_start,
    .kick = u_kick,
    .register_region = u_register_region,
    .unregister_region = u_unregister_region,
    .forget_file = u_forget_file,
    .cancel = u_cancel,
    .stop = u_stop,
    .is_io_thread = u_is_io_thread,
};

#endif /* ZO_HAVE_LIBURING */
