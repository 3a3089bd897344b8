/* The mover: transfers cut into pieces, moves between endpoints (swap
 * read/write, device copies, host copies), the event queue fed by
 * completion callbacks, the pool slots and the thread that applies events.
 *
 * A piece is one or two moves: NVMe <-> device goes through a pool slot
 * (stage 0 into the slot, stage 1 out of it); every other pair is direct.
 * Callbacks (aio engine threads, device stream threads) only append the
 * piece to the event queue; the mover thread takes the store lock and
 * advances it. */
#include "store/store_internal.h"

#include "dev/dev_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- events ----------------------------------------------------------------------- */
static void push_event(zo_store *s, zo__piece *p)
{
    pthread_mutex_lock(&s->evlock);
    p->evnext = NULL;
    if (s->evtail)
        s->evtail->evnext = p;
    else
        s->evhead = p;
    s->evtail = p;
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

static void piece_dev_cb(void *arg, int err)
{
    zo__piece *p = arg;
    if (err < 0) {
        p->err = err;
        snprintf(p->detail, sizeof(p->detail), "device copy failed: %s", zo_strerror(err));
    }
    push_event(p->j->s, p);
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

static void slotq_push(zo_store *s, zo__job *j)
{
    if (j->queued)
        return;
    zo__job **pp = j->prefetch ? &s->slotq_lo : &s->slotq_hi;
    while (*pp)
        pp = &(*pp)->qnext;
    j->qnext = NULL;
    *pp = j;
    j->queued = 1;
}

/* Slots came free: streams below their quota first (guaranteed), then
 * transfers waiting, demand before prefetch. */
void zo__slots_pump(zo_store *s)
{
    zo__streams_pump(s);
    for (int q = 0; q < 2; q++) {
        zo__job **head = q == 0 ? &s->slotq_hi : &s->slotq_lo;
        while (*head && s->nfree && s->jobs_using < s->nslots - s->reserved) {
            zo__job *j = *head;
            *head = j->qnext;
            j->queued = 0;
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
        memcpy(to->p + toff, from->p + foff, len);
        push_event(s, p);
        return 0;
    }
    zo_stream *st = to->kind == EP_DEV ? s->h2d : s->d2h;
    zo_copy_kind k = to->kind == EP_DEV ? ZO_COPY_H2D : ZO_COPY_D2H;
    if (from->kind == EP_DEV && to->kind == EP_DEV)
        return ZO_EINTERNAL;
    r = zo_memcpy_async(st, to->p + toff, from->p + foff, len, k);
    if (r == 0)
        r = zo__stream_host_fn_status(st, piece_dev_cb, p);
    return r;
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
        if (j->queued) { /* drop it from a slot queue */
            for (zo__job **pp = j->prefetch ? &s->slotq_lo : &s->slotq_hi; *pp; pp = &(*pp)->qnext)
                if (*pp == j) {
                    *pp = j->qnext;
                    break;
                }
        }
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
static void *mover_main(void *arg)
{
    zo_store *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->evlock);
        while (!s->evhead && !s->stop)
            pthread_cond_wait(&s->evcond, &s->evlock);
        zo__piece *list = s->evhead;
        s->evhead = s->evtail = NULL;
        int stop = s->stop && !list;
        pthread_mutex_unlock(&s->evlock);
        if (stop)
            break;
        pthread_mutex_lock(&s->lock);
        while (list) {
            zo__piece *p = list;
            list = p->evnext;
            piece_event(s, p);
        }
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
