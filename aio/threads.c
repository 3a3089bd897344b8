/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Thread-pool backend: the same engine over pread/pwrite, for machines where
 * io_uring is unusable (kernel.io_uring_disabled, seccomp, an old kernel) or
 * when asked for. Each pool thread claims one piece at a time and runs it to
 * the end (resuming short transfers, retrying -EAGAIN), so the pool size is
 * the number of pieces in flight: threads x queue_depth, capped at
 * POOL_MAX. Nothing can be cancelled once a system call is under way;
 * pieces not started yet are dropped.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aio_internal.h"

#define POOL_MAX 128u

typedef struct tpool tpool;

typedef struct tthread {
    tpool *tp;
    unsigned idx;
    pthread_t th;
} tthread;

struct tpool {
    zo_aio *a;
    unsigned n, started;
    tthread *t;
    pthread_mutex_t m;
    pthread_cond_t cv;
    _Atomic unsigned idle;
    int stop; /* under m */
};

static void run_piece(zo_aio *a, zo__aio_piece *p)
{
    for (;;) {
        zo__aio_piece_next(a, p);
        int64_t res;
        if (ZO_UNLIKELY(p->forced < 0)) {
            res = p->forced;
        } else {
            uint8_t *buf = p->buf + p->done;
            off_t off = (off_t)(p->off + p->done);
            ssize_t n = p->req->op == ZO__OP_READ ? pread(p->fd, buf, p->cur_len, off)
                                                  : pwrite(p->fd, buf, p->cur_len, off);
            res = n < 0 ? -(int64_t)errno : (int64_t)n;
        }
        if (!zo__aio_piece_result(a, p, res))
            break;
    }
    zo__aio_piece_finish(a, p);
}

static void *pool_main(void *arg)
{
    tthread *t = arg;
    tpool *tp = t->tp;
    zo_aio *a = tp->a;
    zo__aio_thread_setup(a, t->idx, "aio");
    zo__aio_piece piece, *pp = &piece;
    for (;;) {
        if (zo__aio_claim(a, &pp, 1) == 1) {
            run_piece(a, &piece);
            continue;
        }
        pthread_mutex_lock(&tp->m);
        atomic_fetch_add(&tp->idle, 1);
        while (!atomic_load(&a->queued) && !tp->stop)
            pthread_cond_wait(&tp->cv, &tp->m);
        atomic_fetch_sub(&tp->idle, 1);
        int quit = tp->stop && !atomic_load(&a->queued);
        pthread_mutex_unlock(&tp->m);
        if (quit)
            break;
    }
    return NULL;
}

static void pool_stop(tpool *tp)
{
    pthread_mutex_lock(&tp->m);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->m);
    for (unsigned i = 0; i < tp->started; i++)
        pthread_join(tp->t[i].th, NULL);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->m);
    free(tp->t);
    free(tp);
}

static int t_start(zo_aio *a)
{
    uint64_t want = (uint64_t)a->cfg.threads * a->cfg.queue_depth;
    unsigned n = (unsigned)ZO_MIN(want, (uint64_t)POOL_MAX);
    tpool *tp = calloc(1, sizeof(*tp));
    tthread *t = tp ? calloc(n, sizeof(*t)) : NULL;
    if (!t) {
        free(tp);
        return ZO_FAIL(&a->eb, -ENOMEM, "zo_aio_create: out of memory");
    }
    tp->a = a;
    tp->n = n;
    tp->t = t;
    pthread_mutex_init(&tp->m, NULL);
    pthread_cond_init(&tp->cv, NULL);
    for (unsigned i = 0; i < n; i++) {
        t[i].tp = tp;
        t[i].idx = i;
        int e = pthread_create(&t[i].th, NULL, pool_main, &t[i]);
        if (e) {
            int rc = ZO_FAIL(&a->eb, -e, "zo_aio_create: cannot start pool thread %u of %u: %s", i, n, strerror(e));
            pool_stop(tp);
            return rc;
        }
        tp->started++;
    }
    a->backend = tp;
    a->info.backend = ZO_AIO_THREADS;
    a->info.pool_threads = n;
    return 0;
}

static void t_kick(zo_aio *a, uint64_t n)
{
    tpool *tp = a->backend;
    if (!atomic_load(&tp->idle))
        return;
    pthread_mutex_lock(&tp->m);
    if (n >= tp->n)
        pthread_cond_broadcast(&tp->cv);
    else
        for (uint64_t i = 0; i < n; i++)
            pthread_cond_signal(&tp->cv);
    pthread_mutex_unlock(&tp->m);
}

static int t_register_region(zo_aio *a, zo__aio_region *r)
{
    return ZO_ENOTSUP; /* nothing to register with pread/pwrite */
}

static void t_unregister_region(zo_aio *a, zo__aio_region *r)
{
}

static void t_cancel(zo_aio *a)
{
    /* Only pieces not started can be dropped, which zo_aio_cancel did. */
}

static void t_stop(zo_aio *a)
{
    pool_stop(a->backend);
    a->backend = NULL;
}

static int t_is_io_thread(zo_aio *a)
{
    tpool *tp = a->backend;
    pthread_t self = pthread_self();
    for (unsigned i = 0; i < tp->started; i++)
        if (pthread_equal(tp->t[i].th, self))
            return 1;
    return 0;
}

const zo__aio_ops zo__aio_threads_ops = {
    .name = "threads",
    .start = t_start,
    .kick = t_kick,
    .register_region = t_register_region,
    .unregister_region = t_unregister_region,
    .forget_file = NULL,
    .cancel = t_cancel,
    .stop = t_stop,
    .is_io_thread = t_is_io_thread,
};
