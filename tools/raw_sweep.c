/* SPDX-License-Identifier: Apache-2.0 */
/* The optimizer sweep's I/O with liburing alone (raw_sweep.h). One thread,
 * one ring, no store: the loop a careful user would write by hand, so that
 * zo-store-bench can say how far the store is from it on the same disk. */
#include "raw_sweep.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "tool_common.h"

#if ZO_RAW_HAVE_LIBURING
#include <liburing.h>
#endif

#define ALIGN 4096u /* O_DIRECT offsets, lengths and buffers */

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

#if ZO_RAW_HAVE_LIBURING

typedef struct raw_piece {
    uint32_t group;
    uint64_t first, n; /* elements of the group */
} raw_piece;

enum frame_state { FRAME_FREE, FRAME_READING, FRAME_WRITING };

typedef struct raw_frame {
    enum frame_state state;
    size_t piece;
    unsigned pending; /* requests not yet completed */
} raw_frame;

struct zo_raw_sweep {
    zo_raw_sweep_desc d;
    char file[4400];
    int fd;
    size_t ngroups;
    uint64_t (*base)[3];   /* file offset of each group's tensors */
    raw_piece *pieces;
    size_t npieces;
    size_t tbuf[3];        /* a frame's buffer bytes per tensor */
    size_t frame_bytes;
    uint8_t *buf;          /* frames x frame_bytes */
    raw_frame *fr;
    struct io_uring ring;
    int ring_up, fixed_buf, fixed_file;
    char desc[160];
};

static size_t esz_of(const zo_raw_sweep *rs, int k)
{
    return k ? rs->d.state_esz : 4;
}

static uint64_t group_elems(const zo_raw_sweep *rs, size_t g)
{
    uint64_t left = rs->d.nelem - (uint64_t)g * rs->d.group_elems;
    return left < rs->d.group_elems ? left : rs->d.group_elems;
}

/* Every group's master 1.0f and m, v 0, through the first frame's buffer */
static int lay_out(zo_raw_sweep *rs, char *why, size_t whylen)
{
    size_t req = rs->d.request;
    float *ones = (float *)rs->buf;
    uint8_t *zeros = rs->buf + req;
    for (size_t i = 0; i < req / 4; i++)
        ones[i] = 1.0f;
    memset(zeros, 0, req);
    for (size_t g = 0; g < rs->ngroups; g++) {
        uint64_t n = group_elems(rs, g);
        for (int k = 0; k < 3; k++) {
            uint64_t len = round_up(n * esz_of(rs, k), req);
            for (uint64_t o = 0; o < len; o += req) {
                int e = zo_tool_pwrite_all(rs->fd, k ? (void *)zeros : (void *)ones, req, rs->base[g][k] + o);
                if (e) {
                    snprintf(why, whylen, "writing %s: %s", rs->file, strerror(e));
                    return -e;
                }
            }
        }
    }
    if (fsync(rs->fd) != 0) {
        int e = errno;
        snprintf(why, whylen, "fsync %s: %s", rs->file, strerror(e));
        return -e;
    }
    return 0;
}

int zo_raw_sweep_open(zo_raw_sweep **out, const zo_raw_sweep_desc *d, char *why, size_t whylen)
{
    *out = NULL;
    if (!d->file || !d->nelem || !d->group_elems || !d->piece_elems || (d->state_esz != 2 && d->state_esz != 4) ||
        !d->request || d->request % ALIGN || !d->frames || d->frames > 65535) {
        snprintf(why, whylen, "bad raw sweep description");
        return -EINVAL;
    }
    zo_raw_sweep *rs = calloc(1, sizeof(*rs));
    if (!rs)
        return -ENOMEM;
    rs->d = *d;
    rs->fd = -1;
    /* O_DIRECT needs every piece's bytes block-aligned in m and v: round the
     * store's piece down to 2048 elements (4 KiB of bf16). The store's own
     * pieces (a slot's worth, 1M elements by default) already are. */
    if (rs->d.piece_elems >= 2048)
        rs->d.piece_elems -= rs->d.piece_elems % 2048;
    else
        rs->d.piece_elems = 2048;
    snprintf(rs->file, sizeof(rs->file), "%s", d->file);
    int rc = -ENOMEM;
    rs->ngroups = (size_t)((d->nelem + d->group_elems - 1) / d->group_elems);
    if (!(rs->base = calloc(rs->ngroups, sizeof(*rs->base))))
        goto fail;
    uint64_t off = 0;
    size_t np = 0;
    for (size_t g = 0; g < rs->ngroups; g++) {
        uint64_t n = group_elems(rs, g);
        for (int k = 0; k < 3; k++) {
            rs->base[g][k] = off;
            off += round_up(n * esz_of(rs, k), d->request);
        }
        np += (size_t)((n + rs->d.piece_elems - 1) / rs->d.piece_elems);
    }
    if (!(rs->pieces = calloc(np, sizeof(*rs->pieces))))
        goto fail;
    for (size_t g = 0; g < rs->ngroups; g++)
        for (uint64_t e = 0, n = group_elems(rs, g); e < n; e += rs->d.piece_elems)
            rs->pieces[rs->npieces++] =
                (raw_piece){(uint32_t)g, e, n - e < rs->d.piece_elems ? n - e : rs->d.piece_elems};
    rs->frame_bytes = 0;
    for (int k = 0; k < 3; k++) {
        rs->tbuf[k] = (size_t)round_up(rs->d.piece_elems * esz_of(rs, k), ALIGN);
        rs->frame_bytes += rs->tbuf[k];
    }
    size_t blen = rs->frame_bytes * d->frames;
    if (blen < 2 * d->request)
        blen = 2 * d->request; /* lay_out's two request buffers */
    if ((rc = zo_pinned_alloc((void **)&rs->buf, blen, NULL)) != 0) {
        snprintf(why, whylen, "no memory for %zu bytes of buffers", blen);
        goto fail;
    }
    if (!(rs->fr = calloc(d->frames, sizeof(*rs->fr))))
        goto fail;
    int created;
    if ((rs->fd = zo_tool_open_data(rs->file, &created, why, whylen)) < 0) {
        rc = -errno;
        goto fail;
    }
    int fl = fcntl(rs->fd, F_GETFL);
    if (fl < 0 || fcntl(rs->fd, F_SETFL, fl | O_DIRECT) != 0) {
        rc = -errno;
        snprintf(why, whylen, "%s: the filesystem does not take O_DIRECT (%s), which fio's --direct=1 and the "
                 "swap store use", rs->file, strerror(errno));
        goto fail;
    }
    if ((rc = lay_out(rs, why, whylen)) != 0)
        goto fail;
    /* a ring as deep as every frame's requests: submissions never wait for room */
    unsigned reqs = 0;
    for (int k = 0; k < 3; k++)
        reqs += (unsigned)((rs->tbuf[k] + d->request - 1) / d->request);
    unsigned entries = 1;
    while (entries < reqs * d->frames && entries < 4096)
        entries <<= 1;
    if ((rc = io_uring_queue_init(entries, &rs->ring, 0)) != 0) {
        snprintf(why, whylen, "io_uring unavailable: io_uring_queue_init: %s", strerror(-rc));
        rc = -ENOSYS;
        goto fail;
    }
    rs->ring_up = 1;
    struct iovec iov = {rs->buf, blen};
    rs->fixed_buf = io_uring_register_buffers(&rs->ring, &iov, 1) == 0;
    rs->fixed_file = io_uring_register_files(&rs->ring, &rs->fd, 1) == 0;
    zo_pinned_info pi;
    int huge = zo_pinned_query(rs->buf, &pi) == 0 && (pi.flags & ZO_PIN_HUGE);
    snprintf(rs->desc, sizeof(rs->desc), "%u frames of %zu KiB in %s, %s buffers, %s file", d->frames,
             rs->frame_bytes >> 10, huge ? "hugetlb pages" : "normal pages",
             rs->fixed_buf ? "registered" : "unregistered (no memlock for them)",
             rs->fixed_file ? "registered" : "unregistered");
    *out = rs;
    return 0;
fail:
    zo_raw_sweep_close(rs);
    return rc < 0 ? rc : -EIO;
}

/* Queue tensor k's requests of frame f's piece, reading or writing */
static void queue_io(zo_raw_sweep *rs, unsigned f, int write)
{
    raw_frame *fr = &rs->fr[f];
    const raw_piece *pc = &rs->pieces[fr->piece];
    uint8_t *fb = rs->buf + (size_t)f * rs->frame_bytes;
    fr->pending = 0;
    for (int k = 0; k < 3; k++) {
        size_t esz = esz_of(rs, k);
        uint64_t off = rs->base[pc->group][k] + pc->first * esz;
        uint64_t len = round_up(pc->n * esz, ALIGN); /* the tail is the region's padding */
        for (uint64_t o = 0; o < len; o += rs->d.request) {
            unsigned n = (unsigned)(len - o < rs->d.request ? len - o : rs->d.request);
            struct io_uring_sqe *sqe;
            while (!(sqe = io_uring_get_sqe(&rs->ring)))
                io_uring_submit(&rs->ring);
            void *p = fb + o;
            int fd = rs->fixed_file ? 0 : rs->fd;
            if (write && rs->fixed_buf)
                io_uring_prep_write_fixed(sqe, fd, p, n, off + o, 0);
            else if (write)
                io_uring_prep_write(sqe, fd, p, n, off + o);
            else if (rs->fixed_buf)
                io_uring_prep_read_fixed(sqe, fd, p, n, off + o, 0);
            else
                io_uring_prep_read(sqe, fd, p, n, off + o);
            if (rs->fixed_file)
                sqe->flags |= IOSQE_FIXED_FILE;
            io_uring_sqe_set_data64(sqe, (uint64_t)n << 16 | f);
            fr->pending++;
        }
        fb += rs->tbuf[k];
    }
}

int zo_raw_sweep_run(zo_raw_sweep *rs, double *secs, char *why, size_t whylen)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t next = 0, done = 0, inflight = 0;
    int err = 0;
    for (unsigned f = 0; f < rs->d.frames; f++)
        rs->fr[f].state = FRAME_FREE;
    /* after an error nothing new starts; what is in flight is reaped before
     * returning, so no transfer outlives the buffers */
    while (err ? inflight > 0 : done < rs->npieces) {
        for (unsigned f = 0; !err && f < rs->d.frames && next < rs->npieces; f++) {
            if (rs->fr[f].state != FRAME_FREE)
                continue;
            rs->fr[f] = (raw_frame){FRAME_READING, next++, 0};
            queue_io(rs, f, 0);
            inflight += rs->fr[f].pending;
        }
        int rc = io_uring_submit_and_wait(&rs->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            /* cannot even wait: the ring is unusable; leave the buffers
             * allocated (close tears the ring down first) */
            snprintf(why, whylen, "io_uring_submit_and_wait: %s", strerror(-rc));
            return rc;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&rs->ring, head, cqe)
        {
            seen++;
            inflight--;
            unsigned f = (unsigned)(cqe->user_data & 0xffff);
            int want = (int)(cqe->user_data >> 16);
            raw_frame *fr = &rs->fr[f];
            if (cqe->res != want && !err) {
                err = cqe->res < 0 ? cqe->res : -EIO;
                snprintf(why, whylen, "%s of %s: %s", fr->state == FRAME_READING ? "read" : "write", rs->file,
                         cqe->res < 0 ? strerror(-cqe->res) : "short transfer");
            }
            if (--fr->pending || err)
                continue;
            if (fr->state == FRAME_READING) {
                if (rs->d.update) {
                    uint8_t *fb = rs->buf + (size_t)f * rs->frame_bytes;
                    void *const ptr[3] = {fb, fb + rs->tbuf[0], fb + rs->tbuf[0] + rs->tbuf[1]};
                    rs->d.update(rs->d.ctx, ptr, rs->pieces[fr->piece].n);
                }
                fr->state = FRAME_WRITING;
                queue_io(rs, f, 1);
                inflight += fr->pending;
            } else {
                fr->state = FRAME_FREE;
                done++;
            }
        }
        io_uring_cq_advance(&rs->ring, seen);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return err;
}

int zo_raw_sweep_read(zo_raw_sweep *rs, size_t g, int k, uint64_t off, void *out, size_t len)
{
    if (g >= rs->ngroups || k < 0 || k > 2 || len > ALIGN || off + len > group_elems(rs, g) * esz_of(rs, k))
        return -EINVAL;
    uint64_t at = rs->base[g][k] + off, start = at / ALIGN * ALIGN;
    size_t span = (size_t)round_up(at + len - start, ALIGN); /* one or two blocks */
    ssize_t r = pread(rs->fd, rs->buf, span, (off_t)start);
    if (r < 0)
        return -errno;
    if ((size_t)r < at - start + len)
        return -EIO;
    memcpy(out, rs->buf + (at - start), len);
    return 0;
}

const char *zo_raw_sweep_describe(const zo_raw_sweep *rs)
{
    return rs->desc;
}

void zo_raw_sweep_close(zo_raw_sweep *rs)
{
    if (!rs)
        return;
    if (rs->ring_up)
        io_uring_queue_exit(&rs->ring);
    if (rs->fd >= 0) {
        close(rs->fd);
        unlink(rs->file);
    }
    zo_pinned_free(rs->buf);
    free(rs->fr);
    free(rs->pieces);
    free(rs->base);
    free(rs);
}

#else /* !ZO_RAW_HAVE_LIBURING */

struct zo_raw_sweep {
    int unused;
};

int zo_raw_sweep_open(zo_raw_sweep **out, const zo_raw_sweep_desc *d, char *why, size_t whylen)
{
    (void)d;
    *out = NULL;
    snprintf(why, whylen, "io_uring unavailable: zoffload was built without liburing");
    return -ENOSYS;
}

int zo_raw_sweep_run(zo_raw_sweep *rs, double *secs, char *why, size_t whylen)
{
    (void)rs, (void)why, (void)whylen;
    *secs = 0;
    return -ENOSYS;
}

int zo_raw_sweep_read(zo_raw_sweep *rs, size_t g, int k, uint64_t off, void *out, size_t len)
{
    (void)rs, (void)g, (void)k, (void)off, (void)out, (void)len;
    return -ENOSYS;
}

const char *zo_raw_sweep_describe(const zo_raw_sweep *rs)
{
    (void)rs;
    return "";
}

void zo_raw_sweep_close(zo_raw_sweep *rs)
{
    free(rs);
}

#endif
