/* SPDX-License-Identifier: Apache-2.0 */
/* Extent allocator: best fit over a sorted, coalescing free list. Used for
 * the swap arenas (file offsets) and by the tiered store for its pinned host
 * and device arenas (offsets into one big allocation). Small free lists are
 * the norm (extents are megabytes), so plain arrays with memmove are faster
 * than trees here and simpler to check. */
#define ZO_MODULE "extent"
#include "core/internal.h"
#include "core/extent.h"

#include <stdlib.h>
#include <string.h>

int zo__ext_init(zo__extalloc *a, uint64_t size, uint64_t granule)
{
    memset(a, 0, sizeof(*a));
    if (!ZO_IS_POW2(granule))
        return -EINVAL;
    a->granule = granule;
    a->size = size & ~(granule - 1);
    if (a->size) {
        a->free = malloc(4 * sizeof(*a->free));
        if (!a->free)
            return -ENOMEM;
        a->cap = 4;
        a->free[0] = (zo__ext_span){0, a->size};
        a->nfree = 1;
    }
    return 0;
}

void zo__ext_fini(zo__extalloc *a)
{
    free(a->free);
    memset(a, 0, sizeof(*a));
}

static int reserve(zo__extalloc *a, size_t n)
{
    if (n <= a->cap)
        return 0;
    size_t cap = a->cap ? a->cap * 2 : 4;
    while (cap < n)
        cap *= 2;
    zo__ext_span *f = realloc(a->free, cap * sizeof(*f));
    if (!f)
        return -ENOMEM;
    a->free = f;
    a->cap = cap;
    return 0;
}

static void erase_at(zo__extalloc *a, size_t i)
{
    memmove(&a->free[i], &a->free[i + 1], (a->nfree - i - 1) * sizeof(*a->free));
    a->nfree--;
}

/* caller reserved room for one more */
static void insert_at(zo__extalloc *a, size_t i, uint64_t off, uint64_t len)
{
    memmove(&a->free[i + 1], &a->free[i], (a->nfree - i) * sizeof(*a->free));
    a->free[i] = (zo__ext_span){off, len};
    a->nfree++;
}

/* Allocate [start, start+len) out of free span i, which holds it. */
static int take(zo__extalloc *a, size_t i, uint64_t start, uint64_t len)
{
    /* splitting may leave a piece before and after: one more entry at most */
    if (reserve(a, a->nfree + 1) < 0)
        return -ENOMEM;
    zo__ext_span f = a->free[i];
    uint64_t head = start - f.off, tail = f.off + f.len - (start + len);
    if (head && tail) {
        a->free[i].len = head;
        insert_at(a, i + 1, start + len, tail);
    } else if (head) {
        a->free[i].len = head;
    } else if (tail) {
        a->free[i] = (zo__ext_span){start + len, tail};
    } else {
        erase_at(a, i);
    }
    a->used += len;
    return 0;
}

int zo__ext_alloc(zo__extalloc *a, uint64_t len, uint64_t align, uint64_t *off)
{
    if (len == 0 || len > UINT64_MAX - a->granule)
        return -EINVAL;
    len = zo__ext_round(a, len);
    if (align < a->granule)
        align = a->granule;
    if (!ZO_IS_POW2(align))
        return -EINVAL;
    size_t best = SIZE_MAX;
    uint64_t best_waste = UINT64_MAX, best_start = 0;
    for (size_t i = 0; i < a->nfree; i++) {
        const zo__ext_span *f = &a->free[i];
        uint64_t start = ZO_ALIGN_UP(f->off, align);
        if (start < f->off || start - f->off >= f->len || f->len - (start - f->off) < len)
            continue;
        uint64_t waste = f->len - len;
        if (waste < best_waste) {
            best = i;
            best_waste = waste;
            best_start = start;
            if (waste == 0)
                break;
        }
    }
    if (best == SIZE_MAX)
        return -ENOSPC;
    int r = take(a, best, best_start, len);
    if (r == 0)
        *off = best_start;
    return r;
}

int zo__ext_claim(zo__extalloc *a, uint64_t off, uint64_t len)
{
    if (len == 0 || len > UINT64_MAX - a->granule || off % a->granule)
        return -EINVAL;
    len = zo__ext_round(a, len);
    if (off > a->size || len > a->size - off)
        return -EINVAL;
    for (size_t i = 0; i < a->nfree; i++) {
        const zo__ext_span *f = &a->free[i];
        if (f->off > off)
            break; /* sorted: no later span starts at or before off */
        if (off - f->off < f->len)
            return f->len - (off - f->off) >= len ? take(a, i, off, len) : -ENOSPC;
    }
    return -ENOSPC;
}

int zo__ext_free(zo__extalloc *a, uint64_t off, uint64_t len)
{
    if (len == 0)
        return -EINVAL;
    len = zo__ext_round(a, len);
    if ((off & (a->granule - 1)) || off > a->size || len > a->size - off || len > a->used)
        return -EINVAL;
    /* first free extent after off */
    size_t lo = 0, hi = a->nfree;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->free[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t i = lo;
    if (i > 0 && a->free[i - 1].off + a->free[i - 1].len > off)
        return -EINVAL; /* overlaps the previous free extent */
    if (i < a->nfree && off + len > a->free[i].off)
        return -EINVAL; /* overlaps the next one */
    int merge_prev = i > 0 && a->free[i - 1].off + a->free[i - 1].len == off;
    int merge_next = i < a->nfree && off + len == a->free[i].off;
    if (merge_prev && merge_next) {
        a->free[i - 1].len += len + a->free[i].len;
        erase_at(a, i);
    } else if (merge_prev) {
        a->free[i - 1].len += len;
    } else if (merge_next) {
        a->free[i].off = off;
        a->free[i].len += len;
    } else {
        if (reserve(a, a->nfree + 1) < 0)
            return -ENOMEM;
        insert_at(a, i, off, len);
    }
    a->used -= len;
    return 0;
}

int zo__ext_grow(zo__extalloc *a, uint64_t new_size)
{
    new_size &= ~(a->granule - 1);
    if (new_size <= a->size)
        return -EINVAL;
    uint64_t add = new_size - a->size;
    if (a->nfree && a->free[a->nfree - 1].off + a->free[a->nfree - 1].len == a->size) {
        a->free[a->nfree - 1].len += add;
    } else {
        if (reserve(a, a->nfree + 1) < 0)
            return -ENOMEM;
        insert_at(a, a->nfree, a->size, add);
    }
    a->size = new_size;
    return 0;
}

uint64_t zo__ext_largest(const zo__extalloc *a)
{
    uint64_t m = 0;
    for (size_t i = 0; i < a->nfree; i++)
        m = ZO_MAX(m, a->free[i].len);
    return m;
}

int zo__ext_check(const zo__extalloc *a)
{
    uint64_t freeb = 0;
    for (size_t i = 0; i < a->nfree; i++) {
        const zo__ext_span *f = &a->free[i];
        if (f->len == 0 || (f->off & (a->granule - 1)) || (f->len & (a->granule - 1)) || f->off > a->size ||
            f->len > a->size - f->off)
            return -EINVAL;
        if (i > 0 && a->free[i - 1].off + a->free[i - 1].len >= f->off)
            return -EINVAL; /* unsorted, overlapping or not coalesced */
        freeb += f->len;
    }
    return freeb + a->used == a->size ? 0 : -EINVAL;
}
