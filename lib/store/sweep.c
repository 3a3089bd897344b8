/* SPDX-License-Identifier: Apache-2.0 */
/* Group sweeps: an ordered list of groups (tensors with the same element
 * count) walked in pieces cut in elements, every tensor of a group in step,
 * with read-ahead that runs on across group boundaries inside one fixed
 * slot reservation. Also the tier sizing query.
 *
 * Frames: piece number i of the sweep lives in frame i % nframes. A frame
 * has a fixed place in the sweep's slots for each slot-backed position
 * (packed at open: a bf16 piece takes half the room of an fp32 one), so the
 * reservation never grows and a group boundary costs nothing. A frame is
 * FREE, LOADING (reads in flight), READY, HELD (the caller has it) or
 * WRITING (write-backs in flight); frame_set() is the one place its state
 * changes.
 *
 * Tensors: every tensor of the sweep is claimed at open, as a stream
 * claims its tensor (t->streams, the READ source's readers, stream_write
 * with a WRITE position), and a group is given back as soon as its last
 * piece is retired, so the caller can use it again while the sweep goes on.
 * Host-homed tensors are not copied: their pointers point into the home
 * copy, which open makes current (flushes) first. */
#include "store/store_internal.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define SW_MAX_DEPTH 64u
/* frames: the depth, the one held, those writing back (up to 8: a write-back
 * window scaled by bytes, see plan()) */
#define SW_MAX_FRAMES (SW_MAX_DEPTH + 1u + 8u)
/* Most bytes per element a caller may count its depth in (depth_elem_bytes):
 * eight fp32 positions */
#define SW_MAX_ELEM_BYTES (4u * ZO_SWEEP_MAX_TENSORS)
/* Per-tensor piece size aimed at when the slots allow: large disk requests */
#define SW_DEFAULT_HOST_ELEMS (1u << 20)

enum { FR_FREE = 0, FR_LOADING, FR_READY, FR_HELD, FR_WRITING };

typedef struct sw_frame {
    int state;
    uint64_t piece;    /* piece number held (not FREE) */
    size_t group;
    uint64_t elem_off, nelem;
    unsigned pending;  /* transfers in flight */
} sw_frame;

typedef struct sw_tensor {
    zo_tensor *t;
    size_t esz;
    int direct;        /* host-homed: pointers into the home copy */
    zo_tier src;       /* READ: the copy read from */
} sw_tensor;

typedef struct sw_group {
    uint64_t nelem, pieces, retired;
    int touched;       /* a piece with a WRITE position was handed out */
    int released;
} sw_group;

struct zo_store_sweep {
    zo_store *s;
    unsigned nt;
    unsigned mode[ZO_SWEEP_MAX_TENSORS];
    int slotted[ZO_SWEEP_MAX_TENSORS];  /* position goes through slots in some group */
    size_t ngroups;
    sw_tensor *ten;                     /* ngroups * nt */
    sw_group *grp;
    unsigned depth, nframes;
    unsigned hold_max;                  /* pieces the caller may hold: its depth */
    uint64_t piece_elems, npieces;
    /* slots: `nslots` reserved; slot[i] the pool slot held (-1: not yet) */
    unsigned nslots, slots_held, slots_peak;
    int *slot;
    unsigned *lslot;                    /* [frame * nt + k]: index into slot[] */
    size_t *loff;                       /* [frame * nt + k]: byte offset in that slot */
    sw_frame *fr;
    /* cursors */
    uint64_t next_load, next_hand;
    size_t load_group;
    uint64_t load_off;
    unsigned held, busy;
    int err;
    char detail[ZO_ERRMSG_LEN];
    struct zo_store_sweep *snext;
};

ZO_API void zo_store_sweep_desc_default(zo_store_sweep_desc *d)
{
    if (!d)
        return;
    memset(d, 0, sizeof(*d));
    d->struct_size = sizeof(*d);
    d->ntensors = 1;
    for (unsigned k = 0; k < ZO_SWEEP_MAX_TENSORS; k++)
        d->mode[k] = ZO_STREAM_READ | ZO_STREAM_WRITE;
    d->depth = 2;
}

static sw_tensor *ten_at(zo_store_sweep *sw, size_t g, unsigned k)
{
    return &sw->ten[g * sw->nt + k];
}

static void sw_fail(zo_store_sweep *sw, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sw_fail(zo_store_sweep *sw, int err, const char *fmt, ...)
{
    if (sw->err)
        return;
    sw->err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sw->detail, sizeof(sw->detail), fmt, ap);
    va_end(ap);
}

/* ---- layout ------------------------------------------------------------------------------ */
/* Pack nframes x (slot-backed positions) pieces of nelem elements into slots
 * of slot_size bytes, largest first, first fit. Fills lslot/loff when they
 * are not NULL. Returns the slots used. */
static unsigned pack(const zo_store_sweep *sw, const size_t *esz, uint64_t nelem, size_t slot_size,
                     unsigned *lslot, size_t *loff)
{
    unsigned order[ZO_SWEEP_MAX_TENSORS], n = 0;
    for (unsigned k = 0; k < sw->nt; k++)
        if (sw->slotted[k])
            order[n++] = k;
    /* sort positions by piece size, largest first (n <= 8) */
    for (unsigned a = 1; a < n; a++)
        for (unsigned b = a; b > 0 && esz[order[b]] > esz[order[b - 1]]; b--) {
            unsigned tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    size_t fill[ZO_SWEEP_MAX_TENSORS * SW_MAX_FRAMES];
    unsigned used = 0;
    for (unsigned i = 0; i < n; i++) {
        size_t len = (size_t)nelem * esz[order[i]];
        for (unsigned f = 0; f < sw->nframes; f++) {
            unsigned b = 0;
            while (b < used && fill[b] + len > slot_size)
                b++;
            if (b == used)
                fill[used++] = 0;
            if (lslot) {
                lslot[f * sw->nt + order[i]] = b;
                loff[f * sw->nt + order[i]] = fill[b];
            }
            fill[b] += len;
        }
    }
    return used;
}

/* The largest piece (a multiple of gran, at most `most`) whose frames pack
 * into at most `avail` slots at the sweep's current nframes: 0 and *ne,
 * *need, or -EBUSY when not even gran elements fit. */
static int fit(const zo_store_sweep *sw, const size_t *esz, uint64_t gran, uint64_t most, unsigned avail,
               size_t slot_size, uint64_t *ne_out, unsigned *need_out)
{
    uint64_t frame_bytes = 0;
    for (unsigned k = 0; k < sw->nt; k++)
        frame_bytes += esz[k];
    frame_bytes *= sw->nframes;
    /* no piece larger than the bytes of avail slots allow, packed perfectly */
    uint64_t bound = (uint64_t)avail * slot_size / frame_bytes / gran * gran;
    /* largest first; the step grows after a few tries so a huge slot with a
     * small chunk does not mean millions of packings */
    uint64_t ne = ZO_MIN(most, bound), step = gran;
    for (unsigned tries = 0; ne >= gran; tries++) {
        unsigned need = pack(sw, esz, ne, slot_size, NULL, NULL);
        if (need <= avail) {
            *ne_out = ne;
            *need_out = need;
            return 0;
        }
        if (tries >= 16)
            step *= 2;
        if (ne - gran < step)
            ne = ne == gran ? 0 : gran;
        else
            ne -= step;
    }
    return -EBUSY;
}

static void set_frames(zo_store_sweep *sw, unsigned depth, unsigned writing)
{
    sw->depth = depth;
    sw->nframes = depth + 1 + writing;
}

/* Choose the depth, piece_elems and the slots (lock held: reads the pool's
 * state).
 *
 * Depth by bytes: the caller's depth counts pieces as wide as the widest
 * position (an fp32 master + m + v piece of 1 Mi elements is 12 MiB). With
 * narrower positions (bf16 m and v: 8 MiB a piece) the same number of
 * pieces keeps a third fewer bytes queued at the disk, which then idles
 * between pieces (measured: a bf16 sweep at 0.72-0.80 of fio at depth 2,
 * 0.88 at depth 3). So the read-ahead and the write-back window are scaled
 * by widest / actual bytes per element, rounded up, when the slots allow
 * it with pieces no smaller than at the caller's depth; the slots used are
 * never more than an all-widest sweep of the caller's depth would take. */
static int plan(zo_store *s, zo_store_sweep *sw, const zo_store_sweep_desc *d, unsigned writing)
{
    size_t esz[ZO_SWEEP_MAX_TENSORS] = {0}, emin = 0, emax = 0;
    int any = 0;
    for (unsigned k = 0; k < sw->nt; k++)
        for (size_t g = 0; g < sw->ngroups; g++) {
            sw_tensor *x = ten_at(sw, g, k);
            if (x->direct)
                continue;
            sw->slotted[k] = 1;
            esz[k] = ZO_MAX(esz[k], x->esz);
            emin = emin ? ZO_MIN(emin, x->esz) : x->esz;
            emax = ZO_MAX(emax, x->esz);
            any = 1;
        }
    set_frames(sw, d->depth, writing);
    if (!any) {
        sw->piece_elems = d->piece_elems ? d->piece_elems : SW_DEFAULT_HOST_ELEMS;
        sw->nslots = 0;
        return 0;
    }
    if (!s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "zo_store_sweep_open: '%s' needs pool slots and the store has none",
                       sw->ten[0].t->name);
    /* pieces start at element multiples of gran: a multiple of the swap
     * chunk for every element size (element sizes are powers of two) */
    size_t chunk = s->chunk ? s->chunk : 4096;
    uint64_t gran = chunk / emin;
    if ((size_t)gran * emax > s->slot_size)
        return ZO_FAIL(&s->err, ZO_ECONFIG,
                       "zo_store_sweep_open: pieces start on swap chunks of every tensor: %llu elements (a %zu-byte "
                       "chunk of %zu-byte elements), which for %zu-byte elements take %llu bytes, more than a slot "
                       "(%zu); use slots of at least that, or a smaller swap chunk",
                       (unsigned long long)gran, chunk, emin, emax, (unsigned long long)(gran * emax), s->slot_size);
    uint64_t most = s->slot_size / emax / gran * gran; /* one piece of the widest position fills a slot */
    if (d->piece_elems)
        most = ZO_MIN(most, ZO_MAX(gran, d->piece_elems / gran * gran));
    /* no room for pieces larger than the largest group */
    uint64_t largest = 0;
    for (size_t g = 0; g < sw->ngroups; g++)
        largest = ZO_MAX(largest, sw->grp[g].nelem);
    most = ZO_MIN(most, ZO_MAX(gran, (largest + gran - 1) / gran * gran));
    unsigned avail = s->nslots - 1 > s->reserved ? s->nslots - 1 - s->reserved : 0;
    if (d->max_slots)
        avail = ZO_MIN(avail, d->max_slots);
    uint64_t ne = 0;
    unsigned need = 0;
    int r = fit(sw, esz, gran, most, avail, s->slot_size, &ne, &need);
    /* deeper by bytes (see above) */
    uint64_t wide = 0, narrow = 0;
    for (unsigned k = 0; k < sw->nt; k++)
        if (sw->slotted[k]) {
            wide += emax;
            narrow += esz[k];
        }
    /* the caller's element may be wider than the positions here (part of it
     * moves outside the sweep): count the depth in its bytes */
    if (d->depth_elem_bytes > wide)
        wide = d->depth_elem_bytes;
    if (narrow < wide && r == 0 && d->depth < SW_MAX_DEPTH) {
        unsigned wb = writing ? (unsigned)ZO_MIN(8u, (writing * wide + narrow - 1) / narrow) : 0;
        unsigned depth = (unsigned)ZO_MIN((uint64_t)(SW_MAX_DEPTH + 1 - wb), (d->depth * wide + narrow - 1) / narrow);
        unsigned cap = (d->depth + 1 + writing) * (unsigned)(wide / emax); /* an all-widest sweep's slots */
        uint64_t ne2 = 0;
        unsigned need2 = 0;
        set_frames(sw, ZO_MAX(depth, d->depth), wb);
        if (fit(sw, esz, gran, most, ZO_MIN(avail, cap), s->slot_size, &ne2, &need2) == 0 && ne2 >= ne) {
            ne = ne2;
            need = need2;
        } else {
            set_frames(sw, d->depth, writing);
        }
    }
    if (r < 0) {
        unsigned least = pack(sw, esz, gran, s->slot_size, NULL, NULL);
        return ZO_FAIL(&s->err, -EBUSY,
                       "zo_store_sweep_open: depth %u needs at least %u pool slots; %u are free to reserve (pool %u, "
                       "%u reserved by others, one kept for transfers%s)",
                       sw->depth, least, avail, s->nslots, s->reserved, d->max_slots ? ", max_slots" : "");
    }
    sw->piece_elems = ne;
    sw->nslots = need;
    return 0;
}

static int layout(zo_store_sweep *sw)
{
    size_t esz[ZO_SWEEP_MAX_TENSORS] = {0};
    for (unsigned k = 0; k < sw->nt; k++)
        for (size_t g = 0; g < sw->ngroups; g++)
            if (!ten_at(sw, g, k)->direct)
                esz[k] = ZO_MAX(esz[k], ten_at(sw, g, k)->esz);
    size_t n = (size_t)sw->nframes * sw->nt;
    sw->fr = calloc(sw->nframes, sizeof(*sw->fr));
    sw->lslot = calloc(n, sizeof(*sw->lslot));
    sw->loff = calloc(n, sizeof(*sw->loff));
    sw->slot = calloc(sw->nslots ? sw->nslots : 1, sizeof(*sw->slot));
    if (!sw->fr || !sw->lslot || !sw->loff || !sw->slot)
        return -ENOMEM;
    for (unsigned i = 0; i < sw->nslots; i++)
        sw->slot[i] = -1;
    if (sw->nslots)
        pack(sw, esz, sw->piece_elems, sw->s->slot_size, sw->lslot, sw->loff);
    return 0;
}

static void sweep_free(zo_store_sweep *sw)
{
    if (!sw)
        return;
    free(sw->ten);
    free(sw->grp);
    free(sw->fr);
    free(sw->lslot);
    free(sw->loff);
    free(sw->slot);
    free(sw);
}

/* ---- claims ------------------------------------------------------------------------------ */
static void claim(zo_store_sweep *sw, size_t g)
{
    for (unsigned k = 0; k < sw->nt; k++) {
        sw_tensor *x = ten_at(sw, g, k);
        x->t->streams++;
        if (sw->mode[k] & ZO_STREAM_READ)
            x->t->c[x->src].readers++;
        if (sw->mode[k] & ZO_STREAM_WRITE)
            x->t->stream_write = 1;
    }
}

/* Give group g back (lock held): the tensors are usable again. */
static void release(zo_store *s, zo_store_sweep *sw, size_t g)
{
    sw_group *gr = &sw->grp[g];
    if (gr->released)
        return;
    gr->released = 1;
    for (unsigned k = 0; k < sw->nt; k++) {
        sw_tensor *x = ten_at(sw, g, k);
        zo_tensor *t = x->t;
        t->streams--;
        if (sw->mode[k] & ZO_STREAM_READ) {
            t->c[x->src].readers--;
            zo__store_maybe_free(s, t, x->src);
            zo__store_settle(s, t, x->src);
        }
        if (sw->mode[k] & ZO_STREAM_WRITE) {
            t->stream_write = 0;
            if (gr->touched) {
                /* the home copy holds the new contents; cached copies are stale */
                t->cur_ver++;
                t->c[t->home].ver = t->cur_ver;
                for (int y = 0; y < ZO__NTIERS; y++)
                    if (y != (int)t->home) {
                        t->c[y].wb_wanted = 0;
                        zo__store_maybe_free(s, t, (zo_tier)y);
                    }
            }
        }
    }
    zo__store_retry_parked(s);
    zo__trace_pump(s);
}

/* ---- frames ------------------------------------------------------------------------------ */
static uint8_t *frame_ptr(zo_store *s, zo_store_sweep *sw, unsigned f, unsigned k)
{
    sw_tensor *x = ten_at(sw, sw->fr[f].group, k);
    if (x->direct)
        return x->t->c[ZO_TIER_HOST].ptr + sw->fr[f].elem_off * x->esz;
    return zo__slot_ptr(s, sw->slot[sw->lslot[f * sw->nt + k]]) + sw->loff[f * sw->nt + k];
}

/* The one place a frame changes state (lock held). */
static void frame_set(zo_store *s, zo_store_sweep *sw, unsigned f, int state)
{
    sw_frame *fr = &sw->fr[f];
    if (state == FR_FREE && fr->state != FR_FREE) {
        sw_group *gr = &sw->grp[fr->group];
        if (++gr->retired == gr->pieces)
            release(s, sw, fr->group);
    }
    fr->state = state;
    pthread_cond_broadcast(&s->cond);
}

static int start_move(zo_store *s, zo_store_sweep *sw, unsigned f, unsigned k, int write)
{
    sw_frame *fr = &sw->fr[f];
    sw_tensor *x = ten_at(sw, fr->group, k);
    zo__job *j = zo__job_new(s, JOB_SWEEP, x->t);
    if (!j) {
        sw_fail(sw, -ENOMEM, "sweep: out of memory queueing a transfer of '%s'", x->t->name);
        return -ENOMEM;
    }
    zo__ep slot = {.kind = EP_HOST, .p = frame_ptr(s, sw, f, k), .fixed = 1};
    j->sweep = sw;
    j->spiece = f;
    j->src = write ? ZO_TIER_HOST : x->src;
    j->dst = write ? x->t->home : ZO_TIER_HOST;
    j->from = write ? slot : zo__store_ep(s, x->t, x->src);
    j->to = write ? zo__store_ep(s, x->t, x->t->home) : slot;
    j->r0 = j->next_off = fr->elem_off * x->esz;
    j->r1 = (fr->elem_off + fr->nelem) * x->esz;
    j->piece = (size_t)(j->r1 - j->r0);
    j->max_inflight = 1;
    fr->pending++;
    sw->busy++;
    zo__job_pump(s, j);
    return 0;
}

/* The frame's reads (LOADING, dir READ) or write-backs (WRITING, dir WRITE)
 * of its slot-backed positions; then READY / FREE once they are done. The
 * frame counts one extra pending move while they are queued: a move that
 * ends at once (a failed queueing) must not finish the frame before the
 * others are queued. */
static void frame_moves(zo_store *s, zo_store_sweep *sw, unsigned f, unsigned dir)
{
    sw_frame *fr = &sw->fr[f];
    fr->pending++;
    for (unsigned k = 0; k < sw->nt; k++)
        if ((sw->mode[k] & dir) && !ten_at(sw, fr->group, k)->direct)
            if (start_move(s, sw, f, k, dir == ZO_STREAM_WRITE) < 0)
                break;
    if (--fr->pending == 0)
        frame_set(s, sw, f, dir == ZO_STREAM_READ ? FR_READY : FR_FREE);
}

void zo__sweep_piece_done(zo_store *s, zo__job *j)
{
    zo_store_sweep *sw = j->sweep;
    unsigned f = j->spiece;
    sw_frame *fr = &sw->fr[f];
    sw->busy--;
    fr->pending--;
    if (j->err)
        sw_fail(sw, j->err, "sweep: %s '%s' (group %zu, elements [%llu, +%llu)): %s",
                fr->state == FR_WRITING ? "writing back" : "reading", j->t->name, fr->group,
                (unsigned long long)fr->elem_off, (unsigned long long)fr->nelem, j->detail);
    else
        s->st.moved[j->src][j->dst] += j->r1 - j->r0;
    if (fr->pending)
        return;
    if (fr->state == FR_LOADING)
        frame_set(s, sw, f, FR_READY);
    else if (fr->state == FR_WRITING)
        frame_set(s, sw, f, FR_FREE);
}

static void sweep_pump(zo_store *s, zo_store_sweep *sw)
{
    while (sw->slots_held < sw->nslots) {
        int slot = zo__slot_take(s);
        if (slot < 0)
            break; /* slots_pump calls back when one comes free */
        for (unsigned i = 0; i < sw->nslots; i++)
            if (sw->slot[i] < 0) {
                sw->slot[i] = slot;
                break;
            }
        sw->slots_held++;
        sw->slots_peak = ZO_MAX(sw->slots_peak, sw->slots_held);
    }
    while (!sw->err && sw->next_load < sw->npieces && sw->next_load - sw->next_hand < sw->depth) {
        unsigned f = (unsigned)(sw->next_load % sw->nframes);
        sw_frame *fr = &sw->fr[f];
        if (fr->state != FR_FREE)
            return;
        for (unsigned k = 0; k < sw->nt; k++)
            if (!ten_at(sw, sw->load_group, k)->direct && sw->slot[sw->lslot[f * sw->nt + k]] < 0)
                return; /* its slots are not all in hand yet */
        sw_group *gr = &sw->grp[sw->load_group];
        fr->piece = sw->next_load++;
        fr->group = sw->load_group;
        fr->elem_off = sw->load_off;
        fr->nelem = ZO_MIN(sw->piece_elems, gr->nelem - sw->load_off);
        fr->pending = 0;
        sw->load_off += fr->nelem;
        if (sw->load_off == gr->nelem) {
            sw->load_group++;
            sw->load_off = 0;
        }
        frame_set(s, sw, f, FR_LOADING);
        frame_moves(s, sw, f, ZO_STREAM_READ);
    }
}

void zo__sweeps_pump(zo_store *s)
{
    for (zo_store_sweep *sw = s->sweeps; sw; sw = sw->snext)
        sweep_pump(s, sw);
}

/* ---- open -------------------------------------------------------------------------------- */
static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (zo_tensor *const *)a, y = (uintptr_t) * (zo_tensor *const *)b;
    return x < y ? -1 : x > y;
}

/* Argument checks that need no lock. */
static int check_desc(zo_store *s, const zo_store_sweep_desc *d, zo_store_sweep *sw)
{
    const char *fn = "zo_store_sweep_open";
    if (d->ntensors == 0 || d->ntensors > ZO_SWEEP_MAX_TENSORS)
        return ZO_FAIL(&s->err, -EINVAL, "%s: ntensors %u (1..%d)", fn, d->ntensors, ZO_SWEEP_MAX_TENSORS);
    if (d->ngroups == 0 || !d->tensors)
        return ZO_FAIL(&s->err, -EINVAL, "%s: no groups (ngroups %zu, tensors %p)", fn, d->ngroups,
                       (const void *)d->tensors);
    if (d->ngroups > SIZE_MAX / d->ntensors / sizeof(sw_tensor))
        return ZO_FAIL(&s->err, -EINVAL, "%s: ngroups %zu is absurd", fn, d->ngroups);
    if (d->depth == 0 || d->depth > SW_MAX_DEPTH)
        return ZO_FAIL(&s->err, -EINVAL, "%s: depth %u (1..%u)", fn, d->depth, SW_MAX_DEPTH);
    if (d->depth_elem_bytes > SW_MAX_ELEM_BYTES)
        return ZO_FAIL(&s->err, -EINVAL, "%s: depth_elem_bytes %u (0..%u)", fn, d->depth_elem_bytes,
                       SW_MAX_ELEM_BYTES);
    for (unsigned k = 0; k < d->ntensors; k++)
        if (!d->mode[k] || (d->mode[k] & ~(unsigned)(ZO_STREAM_READ | ZO_STREAM_WRITE)))
            return ZO_FAIL(&s->err, -EINVAL, "%s: mode[%u] 0x%x is not READ and/or WRITE", fn, k, d->mode[k]);
    size_t n = d->ngroups * d->ntensors;
    for (size_t i = 0; i < n; i++)
        if (!d->tensors[i])
            return ZO_FAIL(&s->err, -EINVAL, "%s: tensor %u of group %zu is NULL", fn,
                           (unsigned)(i % d->ntensors), i / d->ntensors);
    zo_tensor **sorted = malloc(n * sizeof(*sorted));
    if (!sorted)
        return -ENOMEM;
    memcpy(sorted, d->tensors, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), ptr_cmp);
    for (size_t i = 1; i < n; i++)
        if (sorted[i] == sorted[i - 1]) {
            const char *name = sorted[i]->name;
            free(sorted);
            return ZO_FAIL(&s->err, -EINVAL, "%s: '%s' is listed twice", fn, name);
        }
    free(sorted);
    sw->nt = d->ntensors;
    sw->ngroups = d->ngroups;
    sw->depth = sw->hold_max = d->depth;
    memcpy(sw->mode, d->mode, sizeof(sw->mode));
    sw->ten = calloc(n, sizeof(*sw->ten));
    sw->grp = calloc(d->ngroups, sizeof(*sw->grp));
    if (!sw->ten || !sw->grp)
        return -ENOMEM;
    for (size_t g = 0; g < d->ngroups; g++) {
        for (unsigned k = 0; k < d->ntensors; k++) {
            sw_tensor *x = ten_at(sw, g, k);
            x->t = d->tensors[g * d->ntensors + k];
            x->esz = zo_dtype_size(x->t->desc.dtype);
            x->direct = x->t->home == ZO_TIER_HOST;
            if (!x->esz || x->t->bytes % x->esz)
                return ZO_FAIL(&s->err, -EINVAL, "%s: '%s' is %llu bytes, not a whole number of %s elements", fn,
                               x->t->name, (unsigned long long)x->t->bytes, zo_dtype_name(x->t->desc.dtype));
            uint64_t ne = x->t->bytes / x->esz;
            if (k && ne != sw->grp[g].nelem)
                return ZO_FAIL(&s->err, -EINVAL, "%s: group %zu: '%s' has %llu elements, '%s' %llu", fn, g,
                               x->t->name, (unsigned long long)ne, ten_at(sw, g, 0)->t->name,
                               (unsigned long long)sw->grp[g].nelem);
            sw->grp[g].nelem = ne;
        }
    }
    return 0;
}

/* Tensors whose home copy must be current before the claim: host-homed
 * ones (their pointers are the home copy) and those written (a write-back
 * of part of a group keeps the rest from home). Lock held. */
static zo_tensor *stale_home(zo_store_sweep *sw)
{
    for (size_t g = 0; g < sw->ngroups; g++)
        for (unsigned k = 0; k < sw->nt; k++) {
            sw_tensor *x = ten_at(sw, g, k);
            if ((x->direct || (sw->mode[k] & ZO_STREAM_WRITE)) && !zo__store_current(x->t, x->t->home))
                return x->t;
        }
    return NULL;
}

ZO_API int zo_store_sweep_open(zo_store *s, const zo_store_sweep_desc *ud, zo_store_sweep **out)
{
    if (!s || !ud || !out)
        return ZO_FAIL(s ? &s->err : NULL, -EINVAL, "zo_store_sweep_open: NULL argument");
    *out = NULL;
    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d);
    int r = ZO_STRUCT_IN(&d, ud, sizeof(zo_store_sweep_desc), &s->err, "zo_store_sweep_open");
    if (r < 0)
        return r;
    zo_store_sweep *sw = calloc(1, sizeof(*sw));
    if (!sw)
        return -ENOMEM;
    sw->s = s;
    if ((r = check_desc(s, &d, sw)) < 0)
        goto fail;
    pthread_mutex_lock(&s->lock);
    for (int flushes = 0;;) {
        /* wait for background transfers of written tensors; refuse what
         * the caller (or another thread) holds */
        const char *busy = NULL;
        zo_tensor *bt = NULL;
        int settling = 0;
        for (size_t g = 0; g < sw->ngroups && !busy; g++)
            for (unsigned k = 0; k < sw->nt && !busy; k++) {
                int st;
                bt = ten_at(sw, g, k)->t;
                busy = zo__stream_claim_busy(s, bt, sw->mode[k], &st);
                settling |= st;
            }
        if (busy) {
            r = ZO_FAIL(&s->err, -EBUSY, "zo_store_sweep_open: '%s': %s", bt->name, busy);
            goto fail_locked;
        }
        if (settling) {
            pthread_cond_wait(&s->cond, &s->lock);
            continue;
        }
        zo_tensor *stale = stale_home(sw);
        if (!stale)
            break;
        if (flushes++ >= 8) {
            r = ZO_FAIL(&s->err, -EBUSY, "zo_store_sweep_open: '%s' keeps being written while the sweep opens",
                        stale->name);
            goto fail_locked;
        }
        pthread_mutex_unlock(&s->lock);
        r = zo_store_flush(s, stale);
        pthread_mutex_lock(&s->lock);
        if (r < 0)
            goto fail_locked;
    }
    for (size_t g = 0; g < sw->ngroups; g++)
        for (unsigned k = 0; k < sw->nt; k++) {
            sw_tensor *x = ten_at(sw, g, k);
            if (x->direct)
                x->src = ZO_TIER_HOST;
            else if ((sw->mode[k] & ZO_STREAM_READ) && zo__store_freshest(x->t, &x->src) < 0) {
                r = ZO_FAIL(&s->err, ZO_EINTERNAL, "zo_store_sweep_open: '%s' has no current copy", x->t->name);
                goto fail_locked;
            }
        }
    unsigned writing = 0; /* frames writing back: one at the caller's depth */
    for (unsigned k = 0; k < sw->nt; k++)
        if (sw->mode[k] & ZO_STREAM_WRITE)
            writing = 1;
    if ((r = plan(s, sw, &d, writing)) < 0)
        goto fail_locked;
    if ((r = layout(sw)) < 0)
        goto fail_locked;
    for (size_t g = 0; g < sw->ngroups; g++) {
        sw_group *gr = &sw->grp[g];
        gr->pieces = (gr->nelem + sw->piece_elems - 1) / sw->piece_elems;
        sw->npieces += gr->pieces;
        claim(sw, g);
        if (!gr->pieces)
            release(s, sw, g); /* an empty group: nothing to walk */
    }
    s->reserved += sw->nslots;
    sw->snext = s->sweeps;
    s->sweeps = sw;
    sweep_pump(s, sw);
    pthread_mutex_unlock(&s->lock);
    *out = sw;
    return 0;
fail_locked:
    pthread_mutex_unlock(&s->lock);
fail:
    sweep_free(sw);
    return r;
}

/* ---- next / done / close ----------------------------------------------------------------- */
ZO_API int zo_store_sweep_next(zo_store_sweep *sw, zo_store_sweep_piece *p)
{
    if (!sw || !p)
        return -EINVAL;
    zo_store *s = sw->s;
    memset(p, 0, sizeof(*p));
    pthread_mutex_lock(&s->lock);
    int r = 0;
    if (sw->err) {
        r = ZO_FAIL(&s->err, sw->err, "%s", sw->detail);
        goto out;
    }
    if (sw->next_hand >= sw->npieces)
        goto out;
    if (sw->held >= sw->hold_max) {
        r = ZO_FAIL(&s->err, ZO_ESTATE, "zo_store_sweep_next: %u pieces held (depth %u): call "
                    "zo_store_sweep_done() first", sw->held, sw->hold_max);
        goto out;
    }
    unsigned f = (unsigned)(sw->next_hand % sw->nframes);
    sw_frame *fr = &sw->fr[f];
    if (fr->state == FR_HELD && fr->piece != sw->next_hand) {
        r = ZO_FAIL(&s->err, ZO_ESTATE, "zo_store_sweep_next: piece %llu is still held and piece %llu needs its "
                    "room: call zo_store_sweep_done() on it first", (unsigned long long)fr->piece,
                    (unsigned long long)sw->next_hand);
        goto out;
    }
    if (fr->state != FR_READY || fr->piece != sw->next_hand) {
        uint64_t t0 = zo__now_ns();
        while ((fr->state != FR_READY || fr->piece != sw->next_hand) && !sw->err)
            pthread_cond_wait(&s->cond, &s->lock);
        s->st.stalls++;
        s->st.stall_ns += zo__now_ns() - t0;
        if (sw->err) {
            r = ZO_FAIL(&s->err, sw->err, "%s", sw->detail);
            goto out;
        }
    }
    frame_set(s, sw, f, FR_HELD);
    sw->held++;
    sw->next_hand++;
    for (unsigned k = 0; k < sw->nt; k++) {
        p->ptr[k] = frame_ptr(s, sw, f, k);
        if (sw->mode[k] & ZO_STREAM_WRITE)
            sw->grp[fr->group].touched = 1;
    }
    p->group = fr->group;
    p->elem_off = fr->elem_off;
    p->nelem = fr->nelem;
    p->index = fr->piece;
    p->group_last = fr->elem_off + fr->nelem == sw->grp[fr->group].nelem;
    sweep_pump(s, sw);
out:
    pthread_mutex_unlock(&s->lock);
    return r;
}

/* Retire held frame f: write-backs of its WRITE positions (lock held). */
static void frame_done(zo_store *s, zo_store_sweep *sw, unsigned f)
{
    sw->held--;
    frame_set(s, sw, f, FR_WRITING);
    if (!sw->err) /* after an error nothing more is written */
        frame_moves(s, sw, f, ZO_STREAM_WRITE);
    else
        frame_set(s, sw, f, FR_FREE);
}

ZO_API int zo_store_sweep_done(zo_store_sweep *sw, const zo_store_sweep_piece *p)
{
    if (!sw || !p)
        return -EINVAL;
    zo_store *s = sw->s;
    pthread_mutex_lock(&s->lock);
    unsigned f = (unsigned)(p->index % sw->nframes);
    if (sw->fr[f].state != FR_HELD || sw->fr[f].piece != p->index || p->nelem == 0) {
        pthread_mutex_unlock(&s->lock);
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_sweep_done: piece %llu is not held",
                       (unsigned long long)p->index);
    }
    frame_done(s, sw, f);
    sweep_pump(s, sw);
    zo__slots_pump(s);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

ZO_API int zo_store_sweep_get_info(zo_store_sweep *sw, zo_store_sweep_info *info)
{
    if (!sw || !info)
        return -EINVAL;
    pthread_mutex_lock(&sw->s->lock);
    info->piece_elems = sw->piece_elems;
    info->pieces = sw->npieces;
    info->depth = sw->depth;
    info->frames = sw->nframes;
    info->slots = sw->nslots;
    info->slots_peak = sw->slots_peak;
    pthread_mutex_unlock(&sw->s->lock);
    return 0;
}

ZO_API int zo_store_sweep_close(zo_store_sweep **swp)
{
    if (!swp || !*swp)
        return 0;
    zo_store_sweep *sw = *swp;
    zo_store *s = sw->s;
    pthread_mutex_lock(&s->lock);
    /* pieces still held count as done: the caller may have written them */
    for (unsigned f = 0; f < sw->nframes; f++)
        if (sw->fr[f].state == FR_HELD)
            frame_done(s, sw, f);
    while (sw->busy)
        pthread_cond_wait(&s->cond, &s->lock);
    /* loads ahead that were never handed out: dropped */
    for (unsigned f = 0; f < sw->nframes; f++)
        if (sw->fr[f].state == FR_READY)
            frame_set(s, sw, f, FR_FREE);
    for (size_t g = 0; g < sw->ngroups; g++)
        release(s, sw, g);
    for (unsigned i = 0; i < sw->nslots; i++)
        if (sw->slot[i] >= 0)
            zo__slot_put(s, sw->slot[i]);
    s->reserved -= sw->nslots;
    for (zo_store_sweep **pp = &s->sweeps; *pp; pp = &(*pp)->snext)
        if (*pp == sw) {
            *pp = sw->snext;
            break;
        }
    int err = sw->err;
    if (err)
        ZO_FAIL(&s->err, err, "%s", sw->detail);
    zo__slots_pump(s);
    zo__store_retry_parked(s);
    zo__trace_pump(s);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    sweep_free(sw);
    *swp = NULL;
    return err;
}

/* ---- tier sizing ------------------------------------------------------------------------- */
/* A desc's payload bytes, as zo_store_register() computes them. */
static int desc_bytes(const zo_tensor_desc *ud, uint64_t *out, const char *fn)
{
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    int r = ZO_STRUCT_IN(&d, ud, offsetof(zo_tensor_desc, home) + sizeof(ud->home), NULL, fn);
    if (r < 0)
        return r;
    size_t esz = zo_dtype_size(d.dtype);
    if (!esz || d.ndim > ZO_TENSOR_MAX_DIMS)
        return ZO_FAIL(NULL, -EINVAL, "%s: invalid dtype or ndim %u", fn, d.ndim);
    uint64_t nel = 1, sbytes;
    for (unsigned i = 0; i < d.ndim; i++)
        if (__builtin_mul_overflow(nel, d.shape[i], &nel))
            return ZO_FAIL(NULL, -EINVAL, "%s: shape overflows", fn);
    if (__builtin_mul_overflow(nel, (uint64_t)esz, &sbytes))
        return ZO_FAIL(NULL, -EINVAL, "%s: shape overflows", fn);
    uint64_t bytes = d.bytes ? d.bytes : (d.ndim ? sbytes : 0);
    if (bytes == 0 || (d.ndim && d.bytes && d.bytes != sbytes))
        return ZO_FAIL(NULL, -EINVAL, "%s: bytes %llu vs shape x dtype %llu", fn, (unsigned long long)d.bytes,
                       (unsigned long long)sbytes);
    *out = bytes;
    return 0;
}

ZO_API int zo_store_tier_bytes_needed(const zo_store_config *cfg, zo_tier tier, const zo_tensor_desc *const *descs,
                                      size_t n, zo_store_tier_need *out)
{
    const char *fn = "zo_store_tier_bytes_needed";
    if (!out || (n && !descs))
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL argument", fn);
    memset(out, 0, sizeof(*out));
    if (cfg) { /* the granules are fixed today; the config is checked for the day they are not */
        zo_store_config c;
        zo_store_config_default(&c);
        int r = ZO_STRUCT_IN(&c, cfg, offsetof(zo_store_config, device_bytes), NULL, fn);
        if (r < 0)
            return r;
    }
    if (tier != ZO_TIER_DEVICE && tier != ZO_TIER_HOST)
        return ZO_FAIL(NULL, -EINVAL, "%s: tier %d is not the device or host tier", fn, (int)tier);
    uint64_t gran = tier == ZO_TIER_HOST ? ZO__HOST_GRANULE : ZO__DEV_GRANULE;
    uint64_t held = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (!descs[i])
            return ZO_FAIL(NULL, -EINVAL, "%s: descs[%zu] is NULL", fn, i);
        uint64_t bytes = 0;
        int r = desc_bytes(descs[i], &bytes, fn);
        if (r < 0)
            return r;
        uint64_t need = ZO_ALIGN_UP(bytes, gran);
        /* held extents cut the free space into at most i + 1 holes; with
         * every hole one granule short of `need`, it does not fit */
        uint64_t bound = held + (uint64_t)(i + 1) * (need - gran) + gran;
        worst = ZO_MAX(worst, bound);
        held += need;
    }
    out->exact = held;
    out->any_layout = ZO_MAX(worst, held);
    return 0;
}
