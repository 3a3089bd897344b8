/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The extent allocator: best fit over [0, size) with a sorted, coalescing
 * free list. A platform utility: the swap store carves its arena files with
 * it (file offsets) and the tiered store its pinned host and device arenas
 * (offsets into one big allocation). Not installed.
 */
#ifndef ZO_CORE_EXTENT_H
#define ZO_CORE_EXTENT_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* ZO_CORE_EXTENT_H */
