/*
 * nvme internals: the CRC32C kernel table (run-time dispatch), the extent
 * allocator (also used by the tiered store for its host and device arenas)
 * and small shared helpers. Not installed.
 */
#ifndef ZO_NVME_INTERNAL_H
#define ZO_NVME_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <zoffload/swap.h>

/* ---- CRC32C ------------------------------------------------------------------ */
/* Kernels work on the raw CRC register (no pre/post inversion): the public
 * zo_crc32c() inverts around them. */
typedef uint32_t (*zo__crc32c_fn)(uint32_t reg, const uint8_t *p, size_t n);

typedef struct zo__crc_dsp {
    const char *name;
    zo__crc32c_fn crc32c;
} zo__crc_dsp;

/* Lanes of the interleaved kernels and the tables that shift a register
 * over that many zero bytes: shift(x) = t[0][x & 0xff] ^ t[1][(x >> 8) & 0xff]
 * ^ t[2][(x >> 16) & 0xff] ^ t[3][x >> 24]. Built in checksum.c (plain C). */
#define ZO__CRC_LONG 4096
#define ZO__CRC_SHORT 256
typedef struct zo__crc_shift {
    uint32_t t[4][256];
} zo__crc_shift;
extern zo__crc_shift zo__crc_shift_long, zo__crc_shift_short;

static inline uint32_t zo__crc_shift_apply(const zo__crc_shift *s, uint32_t x)
{
    return s->t[0][x & 0xff] ^ s->t[1][(x >> 8) & 0xff] ^ s->t[2][(x >> 16) & 0xff] ^ s->t[3][x >> 24];
}

/* The table for the given CPU flags (tests pin each variant with it). */
const zo__crc_dsp *zo__crc_dsp_for(unsigned flags);
/* The table for zo_cpu_flags(). */
const zo__crc_dsp *zo__crc_dsp_cur(void);
/* The C reference (slicing-by-8) on the raw register. */
uint32_t zo__crc32c_ref(uint32_t reg, const uint8_t *p, size_t n);

#if defined(__x86_64__)
void zo__crc_dsp_init_sse42(zo__crc_dsp *dsp); /* x86/crc32c_sse42.c */
#endif

/* Checksum of one chunk with the kind's fastest kernel (no argument checks). */
uint64_t zo__csum(zo_csum_kind kind, const void *p, size_t n);

/* ---- extent allocator -------------------------------------------------------- */
/* Best-fit allocator over [0, size) with a sorted, coalescing free list.
 * Every length is rounded up to `granule` (a power of two); starts are
 * aligned as asked. Not thread-safe: callers lock. */
typedef struct zo__ext_span {
    uint64_t off, len;
} zo__ext_span;

typedef struct zo__extalloc {
    uint64_t size;     /* bytes managed */
    uint64_t granule;  /* length rounding and minimum start alignment */
    uint64_t used;     /* bytes allocated (rounded) */
    zo__ext_span *free;
    size_t nfree, cap;
} zo__extalloc;

int zo__ext_init(zo__extalloc *a, uint64_t size, uint64_t granule);
void zo__ext_fini(zo__extalloc *a);
/* Round len as the allocator does. */
static inline uint64_t zo__ext_round(const zo__extalloc *a, uint64_t len)
{
    return (len + a->granule - 1) & ~(a->granule - 1);
}
/* Allocate len bytes starting at a multiple of align (a power of two; values
 * below the granule mean the granule). -ENOSPC if no free extent fits,
 * -EINVAL for len 0, -ENOMEM if the free list cannot grow. */
int zo__ext_alloc(zo__extalloc *a, uint64_t len, uint64_t align, uint64_t *off);
/* Allocate exactly [off, off+len) (len rounded as alloc does, off a multiple
 * of the granule): for a caller that chose the place itself (the store puts
 * prefetched copies where they leave the rest of its arena contiguous).
 * -ENOSPC if part of it is not free, -EINVAL for a range outside the
 * allocator or a misaligned off, -ENOMEM if the free list cannot grow. */
int zo__ext_claim(zo__extalloc *a, uint64_t off, uint64_t len);
/* Return [off, off+len) (len as passed to alloc). -EINVAL if it is not
 * inside the managed range or overlaps free space (double free). */
int zo__ext_free(zo__extalloc *a, uint64_t off, uint64_t len);
/* Extend the managed range to new_size (> size): the new bytes are free. */
int zo__ext_grow(zo__extalloc *a, uint64_t new_size);
/* Largest free extent (bytes). */
uint64_t zo__ext_largest(const zo__extalloc *a);
/* Check the free list invariants (sorted, disjoint, coalesced, in range,
 * sizes consistent with `used`). 0 or -EINVAL. For tests. */
int zo__ext_check(const zo__extalloc *a);

/* ---- fault injection (tests) ------------------------------------------------------ */
/* Called before each chunk's I/O of a swap write or read is queued (write:
 * 1 for a write); a negative return fails the queueing with that error, as
 * a refused zo_aio submission would. fn NULL removes it. Call while nothing
 * is in flight. */
typedef int (*zo__swap_queue_fault_fn)(void *user, int write, uint64_t chunk_idx);
struct zo_swap;
void zo__swap_set_queue_fault(struct zo_swap *s, zo__swap_queue_fault_fn fn, void *user);

/* ---- helpers ------------------------------------------------------------------- */
/* fsync a directory by path. 0 or -errno. */
int zo__fsync_dir(const char *path);
/* Check a directory meant to hold our files: exists, is a directory and not
 * a symlink, writable, and not writable by others without the sticky bit.
 * 0 or -errno with the detail recorded (eb may be NULL). */
struct zo_errbuf;
int zo__check_dir(struct zo_errbuf *eb, const char *what, const char *path);

#endif /* ZO_NVME_INTERNAL_H */
