/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The optimizer sweep's access pattern done with liburing alone, no store:
 * the reference `zo-store-bench --optim --vs-raw` alternates with the
 * store's sweep. Where fio (`--vs-fio`) says what the disk does for a mixed
 * sequential stream, this says what a hand-written io_uring loop gets for
 * exactly the sweep's I/O (read a piece of master, m and v ahead, update it,
 * overwrite it in place) with the same buffer memory, so the two sources of
 * a gap to fio can be told apart: the pattern on this disk, or the store.
 * Not part of the library.
 */
#ifndef ZO_RAW_SWEEP_H
#define ZO_RAW_SWEEP_H

#include <stddef.h>
#include <stdint.h>

typedef struct zo_raw_sweep zo_raw_sweep;

/* The update of one piece: ptr[0] master fp32, ptr[1], ptr[2] m and v */
typedef void (*zo_raw_update_fn)(void *ctx, void *const ptr[3], uint64_t n);

typedef struct zo_raw_sweep_desc {
    const char *file;     /* created O_EXCL | O_NOFOLLOW (the run's private directory) */
    uint64_t nelem;       /* elements of state in all */
    uint64_t group_elems; /* elements per group (the last may be shorter) */
    uint64_t piece_elems; /* elements per piece, as the store's sweep cuts them */
    size_t state_esz;     /* bytes per m / v element (4 or 2); master is fp32 */
    size_t request;       /* bytes per read / write (the swap store's chunk) */
    unsigned frames;      /* pieces in flight or being updated at once */
    zo_raw_update_fn update; /* NULL: I/O only */
    void *ctx;
} zo_raw_sweep_desc;

/* Create the file (every group's master 1.0, m and v 0, written once so
 * reads meet real data), the buffers (huge pages where there are some) and
 * the ring (buffers and file registered as fio's --fixedbufs
 * --registerfiles; without the memlock for it, unregistered, said in
 * info). 0, or a negative errno with the reason in why (-ENOSYS: built
 * without liburing, or io_uring refused by the kernel). */
int zo_raw_sweep_open(zo_raw_sweep **out, const zo_raw_sweep_desc *d, char *why, size_t whylen);

/* One sweep: every piece read, updated, written back. 0 or a negative
 * errno (an I/O error or short transfer, said in why). */
int zo_raw_sweep_run(zo_raw_sweep *rs, double *secs, char *why, size_t whylen);

/* Read `len` bytes of tensor k (0 master, 1 m, 2 v) of group g at byte
 * offset `off` into out: the check that every byte made the round trip. */
int zo_raw_sweep_read(zo_raw_sweep *rs, size_t g, int k, uint64_t off, void *out, size_t len);

/* "huge pages, registered buffers" and the like, for the report */
const char *zo_raw_sweep_describe(const zo_raw_sweep *rs);

/* Remove the file, free everything. NULL ok. */
void zo_raw_sweep_close(zo_raw_sweep *rs);

#endif
