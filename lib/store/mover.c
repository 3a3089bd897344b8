/* SPDX-License-Identifier: Apache-2.0 */
/* The mover: transfers cut into pieces, moves between endpoints (swap
 * read/write, device copies, host copies), the event queue fed by
 * completion callbacks, the pool slots and the thread that applies events.
 *
 * A piece is one or two moves: NVMe <-> device goes through a pool slot
 * (stage 0 into the slot, stage 1 out of it); every other pair is direct.
 * How a move completes: a swap read/write's callback (aio engine thread)
 * appends the piece to the event queue; a device copy is followed by a
 * fence the mover polls (no callback on a driver thread, none holding the
 * stream); a host <-> host copy is queued for the mover, which copies with
 * no lock held. The mover then takes the store lock and advances the
 * pieces. (That the caller's thread no longer copies under the lock has
 * no test: nothing outside the mover can tell which thread ran a memcpy;
 * the stream tests check the bytes.) */
#include "store/store_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- events ----------------------------------------------------------------------- */
static void push_event(zo_store *s, zo__piece *p)
{
    pthread_mutex_lock(&s->evlock);
    zo_queue_push(&s->evq, &p->qn);
    pthread_cond_signal(&s->evcond);
    pthread_mutex_unlock(&s->evlock);
}

static void piece_swap_cb(void *user, int err)
{
    zo__piece *p = user;
    p->err = err;
    if (err < 0) /* the swap store left the why in this thread's detail */
        snprintf(p->detail, sizeof(p->detail), "%s", zo_last_error_detail());
    push_event(p->j->s, p);
}

/* A fence's notify (host backend: its stream thread reached the fence). */
static void fence_wake(void *arg)
{
    zo_store *s = arg;
    pthread_mutex_lock(&s->evlock);
    s->dev_ready = 1;
    pthread_cond_signal(&s->evcond);
    pthread_mutex_unlock(&s->evlock);
}

/* ---- slots ----------------------------------------------------------------------------- */
int zo__slot_take(zo_store *s)
{
    if (!s->nfree)
        return -1;
    int slot = (int)s->free_slots[--s->nfree];
    s->pool_in_use++;
    if (s->pool_in_use > s->pool_peak)
        s->pool_peak = s->pool_in_use;
    return slot;
}

void zo__slot_put(zo_store *s, int slot)
{
    s->free_slots[s->nfree++] = (unsigned)slot;
    s->pool_in_use--;
}

static int job_slot_take(zo_store *s)
{
    if (s->jobs_using >= s->nslots - s->reserved)
        return -1;
    int slot = zo__slot_take(s);
    if (slot >= 0)
        s->jobs_using++;
    return slot;
}

static void job_slot_put(zo_store *s, int slot)
{
    zo__slot_put(s, slot);
    s->jobs_using--;
}

/* Jobs waiting for a slot: demand (0) before prefetch (1), FIFO in each. */
static void slotq_push(zo_store *s, zo__job *j)
{
    if (j->queued)
        return;
    zo_list_add_tail(&s->slotq[j->prefetch ? 1 : 0], &j->qlink);
    j->queued = 1;
}

static void slotq_remove(zo__job *j)
{
    zo_list_del(&j->qlink);
    j->queued = 0;
}

/* Slots came free: streams below their quota first (guaranteed), then
 * transfers waiting, demand before prefetch. */
void zo__slots_pump(zo_store *s)
{
    zo__streams_pump(s);
    for (int q = 0; q < 2; q++) {
        zo_list *n;
        while ((n = zo_list_first(&s->slotq[q])) && s->nfree && s->jobs_using < s->nslots - s->reserved) {
            zo__job *j = zo_list_entry(n, zo__job, qlink);
            slotq_remove(j);
            zo__job_pump(s, j);
            if (j->queued)
                break; /* took what it could and wants more: keep the order */
        }
    }
}

/* ---- moves -------------------------------------------------------------------------------- */
int zo__move(zo_store *s, zo__piece *p, const zo__ep *from, uint64_t foff, const zo__ep *to, uint64_t toff,
             size_t len)
{
    if (from->fixed)
        foff = 0;
    if (to->fixed)
        toff = 0;
    int r;
    if (from->kind == EP_NVME) {
        if (to->kind != EP_HOST)
            return ZO_EINTERNAL;
        return zo_swap_read(s->swap, from->sid, foff, to->p + toff, len, piece_swap_cb, p, NULL);
    }
    if (to->kind == EP_NVME) {
        if (from->kind != EP_HOST)
            return ZO_EINTERNAL;
        return zo_swap_write(s->swap, to->sid, toff, from->p + foff, len, piece_swap_cb, p, NULL);
    }
    if (from->kind == EP_HOST && to->kind == EP_HOST) {
        /* the mover copies it outside the store lock: a 16 MiB memcpy
         * held every caller of the store up. The buffers are safe without
         * the lock: the source has a reader, the destination is loading. */
        p->hdst = to->p + toff;
        p->hsrc = from->p + foff;
        p->hlen = len;
        pthread_mutex_lock(&s->evlock);
        zo_queue_push(&s->hostq, &p->qn);
        pthread_cond_signal(&s->evcond);
        pthread_mutex_unlock(&s->evlock);
        return 0;
    }
    int q = to->kind == EP_DEV ? 0 : 1;
    zo_stream *st = q == 0 ? s->h2d : s->d2h;
    zo_copy_kind k = q == 0 ? ZO_COPY_H2D : ZO_COPY_D2H;
    if (from->kind == EP_DEV && to->kind == EP_DEV)
        return ZO_EINTERNAL;
    r = zo_memcpy_async(st, to->p + toff, from->p + foff, len, k);
    if (r < 0)
        return r; /* nothing queued */
    r = zo__fence_record(st, fence_wake, s, &p->fence);
    if (r < 0) {
        /* The copy is queued and may still write into the piece's buffer
         * (a pool slot, which goes back to the pool with this error):
         * wait for it first. Only the store queues work on this stream,
         * under the store lock, and every copy before this one has its
         * fence already, so the sync reports no one else's error. */
        int e = zo_stream_sync(st);
        if (e < 0)
            ZO_LOGW("store: device copy failed while its completion could not be tracked: %s", zo_strerror(e));
        return r;
    }
    pthread_mutex_lock(&s->evlock);
    zo_queue_push(&s->devq[q], &p->qn);
    /* the fence may have been reached already, its notify spent while
     * the queue was empty: the mover polls now */
    s->dev_ready = 1;
    pthread_cond_signal(&s->evcond);
    pthread_mutex_unlock(&s->evlock);
    return 0;
}

static void piece_stage(zo_store *s, zo__piece *p)
{
    zo__job *j = p->j;
    int r;
    if (!j->via_slot) {
        r = zo__move(s, p, &j->from, p->off, &j->to, p->off, p->len);
    } else {
        zo__ep slot = {.kind = EP_HOST, .p = zo__slot_ptr(s, p->slot), .fixed = 1};
        if (p->stage == 0)
            r = zo__move(s, p, &j->from, p->off, &slot, 0, p->len);
        else
            r = zo__move(s, p, &slot, 0, &j->to, p->off, p->len);
    }
    if (r < 0) {
        p->err = r;
        snprintf(p->detail, sizeof(p->detail), "could not queue the transfer: %s (%s)", zo_strerror(r),
                 zo_last_error_detail());
        push_event(s, p);
    }
}

zo__job *zo__job_new(zo_store *s, int kind, zo_tensor *t)
{
    zo__job *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->s = s;
    j->kind = kind;
    j->t = t;
    zo_list_init(&j->qlink);
    s->jobs_active++;
    return j;
}

static void job_finish(zo_store *s, zo__job *j)
{
    if (j->kind == JOB_STREAM)
        zo__stream_piece_done(s, j);
    else if (j->kind == JOB_SWEEP)
        zo__sweep_piece_done(s, j);
    else
        zo__store_job_done(s, j);
    s->jobs_active--;
    pthread_cond_broadcast(&s->cond);
    free(j);
}

/* Start what pieces the job may have in flight now. */
void zo__job_pump(zo_store *s, zo__job *j)
{
    while (!j->err && j->next_off < j->r1 && j->inflight < j->max_inflight) {
        int slot = -1;
        if (j->via_slot) {
            if ((slot = job_slot_take(s)) < 0) {
                slotq_push(s, j);
                return;
            }
        }
        zo__piece *p = calloc(1, sizeof(*p));
        if (!p) {
            if (slot >= 0)
                job_slot_put(s, slot);
            j->err = -ENOMEM;
            snprintf(j->detail, sizeof(j->detail), "out of memory");
            break;
        }
        p->j = j;
        p->off = j->next_off;
        p->len = (size_t)ZO_MIN((uint64_t)j->piece, j->r1 - j->next_off);
        p->slot = slot;
        p->nstages = j->via_slot ? 2 : 1;
        j->next_off += p->len;
        j->inflight++;
        piece_stage(s, p);
    }
    if (!j->inflight && (j->err || j->next_off >= j->r1)) {
        if (j->queued)
            slotq_remove(j);
        job_finish(s, j);
    }
}

/* Apply one completion (mover thread, lock held). */
static void piece_event(zo_store *s, zo__piece *p)
{
    zo__job *j = p->j;
    if (p->err < 0 && !j->err) {
        j->err = p->err;
        snprintf(j->detail, sizeof(j->detail), "%s", p->detail[0] ? p->detail : zo_strerror(p->err));
    }
    if (!p->err && p->stage + 1 < p->nstages) {
        p->stage++;
        piece_stage(s, p);
        return;
    }
    if (p->slot >= 0)
        job_slot_put(s, p->slot);
    j->inflight--;
    free(p);
    zo__job_pump(s, j);
}

/* ---- the thread ---------------------------------------------------------------------------- */
/* Fence polling while device moves are in flight and no notify comes (CUDA):
 * from 20 us, doubling while nothing completes, up to 1 ms. */
#define POLL_MIN_NS 20000ull
#define POLL_MAX_NS 1000000ull

/* Move the device pieces whose fences are done, in stream order, to done.
 * Mover thread; the fence queries run without a lock (only this thread
 * pops the fence queues). */
static void poll_fences(zo_store *s, zo_queue *done)
{
    for (int q = 0; q < 2; q++) {
        for (;;) {
            pthread_mutex_lock(&s->evlock);
            zo_qnode *n = zo_queue_peek(&s->devq[q]);
            pthread_mutex_unlock(&s->evlock);
            if (!n)
                break;
            zo__piece *p = zo_queue_entry(n, zo__piece, qn);
            int r = zo__fence_query(p->fence);
            if (r == -EBUSY)
                break; /* the later ones are queued behind it */
            if (r < 0) {
                p->err = r;
                snprintf(p->detail, sizeof(p->detail), "device copy failed: %s (%s)", zo_strerror(r),
                         zo_last_error_detail());
            }
            zo__fence_destroy(&p->fence);
            pthread_mutex_lock(&s->evlock);
            zo_queue_pop(&s->devq[q]);
            pthread_mutex_unlock(&s->evlock);
            zo_queue_push(done, &p->qn);
        }
    }
}

static void *mover_main(void *arg)
{
    zo_store *s = arg;
    uint64_t poll_ns = POLL_MIN_NS;
    for (;;) {
        zo_queue list, host;
        pthread_mutex_lock(&s->evlock);
        for (;;) {
            if (!zo_queue_empty(&s->evq) || !zo_queue_empty(&s->hostq) || s->dev_ready || s->stop)
                break;
            if (zo_queue_empty(&s->devq[0]) && zo_queue_empty(&s->devq[1])) {
                pthread_cond_wait(&s->evcond, &s->evlock);
                continue;
            }
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            uint64_t ns = (uint64_t)dl.tv_nsec + poll_ns;
            dl.tv_sec += (time_t)(ns / 1000000000u);
            dl.tv_nsec = (long)(ns % 1000000000u);
            if (pthread_cond_timedwait(&s->evcond, &s->evlock, &dl) != 0)
                break; /* time to poll */
        }
        zo_queue_init(&list);
        zo_queue_init(&host);
        zo_queue_splice(&list, &s->evq);
        zo_queue_splice(&host, &s->hostq);
        s->dev_ready = 0;
        int fences = !zo_queue_empty(&s->devq[0]) || !zo_queue_empty(&s->devq[1]);
        int stop = s->stop && zo_queue_empty(&list) && zo_queue_empty(&host) && !fences;
        pthread_mutex_unlock(&s->evlock);
        if (stop)
            break;
        /* host -> host moves: the copying without any lock */
        for (zo_qnode *n; (n = zo_queue_pop(&host));) {
            zo__piece *p = zo_queue_entry(n, zo__piece, qn);
            memcpy(p->hdst, p->hsrc, p->hlen);
            zo_queue_push(&list, &p->qn);
        }
        if (fences) {
            size_t before = list.len;
            poll_fences(s, &list);
            poll_ns = list.len > before ? POLL_MIN_NS : ZO_MIN(2 * poll_ns, POLL_MAX_NS);
        }
        if (zo_queue_empty(&list))
            continue;
        pthread_mutex_lock(&s->lock);
        for (zo_qnode *n; (n = zo_queue_pop(&list));)
            piece_event(s, zo_queue_entry(n, zo__piece, qn));
        zo__slots_pump(s);
        zo__store_retry_parked(s);
        zo__trace_pump(s);
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
    return NULL;
}

int zo__mover_start(zo_store *s)
{
    pthread_mutex_init(&s->evlock, NULL);
    pthread_cond_init(&s->evcond, NULL);
    zo_queue_init(&s->evq);
    zo_queue_init(&s->hostq);
    zo_queue_init(&s->devq[0]);
    zo_queue_init(&s->devq[1]);
    zo_list_init(&s->slotq[0]);
    zo_list_init(&s->slotq[1]);
    int r = pthread_create(&s->mover, NULL, mover_main, s);
    if (r)
        return ZO_FAIL(&s->err, -r, "store: cannot start the mover thread: %s", strerror(r));
    s->mover_started = 1;
    return 0;
}

void zo__mover_stop(zo_store *s)
{
    if (!s->mover_started)
        return;
    pthread_mutex_lock(&s->evlock);
    s->stop = 1;
    pthread_cond_signal(&s->evcond);
    pthread_mutex_unlock(&s->evlock);
    pthread_join(s->mover, NULL);
    s->mover_started = 0;
    pthread_mutex_destroy(&s->evlock);
    pthread_cond_destroy(&s->evcond);
}
