/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Gradient windows: where the gradients of an accumulation window wait for
 * the step (acc[w], optim_internal.h).
 *
 * Window dtype. With accumulation over micro-steps (grad_accum_steps > 1)
 * or fp32 gradients the window is fp32 (4 B/param): gradients are added in
 * fp32. Without accumulation and with bf16/fp16 gradients it holds them in
 * their own dtype (2 B/param): each tensor gets one gradient, copied as it
 * is, and the kernels (statistics, the fused step, rollback) read bf16/fp16
 * gradients directly, widening each element to fp32 as they load it. Both
 * give the same bits: the widening is exact, and the kernels split work by
 * elements and sum statistics in the same lanes whatever the input dtype.
 *
 * Spills. A narrow window cannot take what does not fit its dtype exactly:
 * a second gradient of a tensor in the window (the sum needs fp32) or a
 * host gradient of another dtype (zo_optim_grad_host). That tensor then
 * gets an fp32 buffer of its own for the window (its "spill"): what landed
 * narrow so far is widened into it and the new gradient added there, in
 * fp32 as a wide window would. Ranges that touch a spilled tensor are read
 * through an fp32 copy made for the read (zo__win_range). Spills are rare
 * (the framework hands a gradient over twice) and freed when the window is
 * finished.
 *
 * Threads: spills are created by the caller's thread before the landing
 * they serve is queued; the land stream (or the caller, for host
 * gradients) writes them; the worker reads and frees them when it owns
 * the window (optim_internal.h).
 */
#include "optim_internal.h"

#include <stdlib.h>
#include <string.h>

#include <zoffload/mem.h>
#include <zoffload/vec.h>

/* The first tensor that ends after flat element lo (tensors are sorted by offset). */
unsigned zo__tensor_at(const zo_optim *o, uint64_t lo)
{
    unsigned a = 0, b = o->nt;
    while (a < b) {
        unsigned m = a + (b - a) / 2;
        if (o->tensors[m].off + o->tensors[m].numel <= lo)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

zo_dtype zo__win_dtype(const zo_optim_config *cfg, zo_dtype gdt)
{
    if (cfg->grad_accum_steps == 1 && (gdt == ZO_DTYPE_BF16 || gdt == ZO_DTYPE_F16))
        return gdt;
    return ZO_DTYPE_F32;
}

int zo__win_alloc(zo_optim *o, uint64_t *bytes_out)
{
    o->wdt = zo__win_dtype(&o->cfg, o->gdt);
    o->wes = zo_dtype_size(o->wdt);
    size_t bytes;
    if (zo__mul_size((size_t)o->numel, o->wes, &bytes) < 0)
        return ZO_FAIL(&o->err, -ENOMEM, "zo_optim_create: model too large");
    for (unsigned w = 0; w < o->nwin; w++) {
        /* pageable: only the CPU touches the window (staging is the DMA target) */
        int r = zo_aligned_alloc(&o->acc[w], ZO_ALIGN_UP(bytes, (size_t)64), 64);
        if (r < 0)
            return ZO_FAIL(&o->err, r, "zo_optim_create: cannot allocate the %zu-byte gradient window", bytes);
        memset(o->acc[w], 0, bytes);
        o->host_bytes += bytes;
        if (!(o->arrivals[w] = calloc(o->nt, sizeof(uint32_t))) || !(o->spill[w] = calloc(o->nt, sizeof(float *))))
            return -ENOMEM;
    }
    *bytes_out = (uint64_t)bytes * o->nwin;
    return 0;
}

/* Forget window w's spills. The owner of the window only. */
void zo__win_reset(zo_optim *o, unsigned w)
{
    if (!o->spill[w] || !atomic_load(&o->nspill[w]))
        return;
    for (unsigned t = 0; t < o->nt; t++)
        if (o->spill[w][t]) {
            zo_aligned_free(o->spill[w][t]);
            o->spill[w][t] = NULL;
            atomic_fetch_sub(&o->spill_bytes, o->tensors[t].numel * 4);
        }
    atomic_store(&o->nspill[w], 0);
}

void zo__win_free(zo_optim *o)
{
    for (unsigned w = 0; w < 2; w++) {
        if (o->spill[w])
            zo__win_reset(o, w);
        free(o->spill[w]);
        o->spill[w] = NULL;
        if (o->acc_pinned[w])
            zo_pinned_free(o->acc[w]);
        else
            zo_aligned_free(o->acc[w]);
        o->acc[w] = NULL;
        o->acc_pinned[w] = 0;
        free(o->arrivals[w]);
        o->arrivals[w] = NULL;
    }
}

/* Tensors that got no gradient in window w have a zero one. */
void zo__win_zero_missing(zo_optim *o, unsigned w)
{
    for (unsigned t = 0; t < o->nt; t++)
        if (!o->arrivals[w][t])
            memset((char *)o->acc[w] + o->tensors[t].off * o->wes, 0, o->tensors[t].numel * o->wes);
}

int zo__win_needs_spill(const zo_optim *o, unsigned w, unsigned t, zo_dtype src_dt)
{
    return o->wdt != ZO_DTYPE_F32 && !o->spill[w][t] && (o->arrivals[w][t] > 0 || src_dt != o->wdt);
}

int zo__win_spill(zo_optim *o, unsigned w, unsigned t, float **out)
{
    const zo__ot *ot = &o->tensors[t];
    void *p = NULL;
    int r = zo_aligned_alloc(&p, ZO_ALIGN_UP((size_t)ot->numel * 4, (size_t)64), 64);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_grad: tensor '%s': no memory for its fp32 gradient (%llu bytes)",
                       ot->name, (unsigned long long)(ot->numel * 4));
    o->spill[w][t] = p;
    *out = p;
    atomic_fetch_add(&o->spill_bytes, ot->numel * 4);
    atomic_fetch_add(&o->nspill[w], 1);
    return 0;
}

void zo__win_spill_widen(zo_optim *o, unsigned w, unsigned t)
{
    const zo__ot *ot = &o->tensors[t];
    zo_vec_cast(o->spill[w][t], ZO_DTYPE_F32, (const char *)o->acc[w] + ot->off * o->wes, o->wdt,
                (size_t)ot->numel);
}

void zo__win_land(zo_optim *o, unsigned w, unsigned t, float *spill, uint64_t e, const void *src, zo_dtype dt,
                  size_t n, int first)
{
    const zo__ot *ot = &o->tensors[t];
    if (spill) {
        zo__acc_add(spill + e, src, dt, n, first);
    } else if (o->wdt == ZO_DTYPE_F32) {
        zo__acc_add((float *)o->acc[w] + ot->off + e, src, dt, n, first);
    } else {
        /* narrow: the tensor's only gradient, in the window's dtype (anything
         * else was spilled by the hand-over) */
        memcpy((char *)o->acc[w] + (ot->off + e) * o->wes, src, n * o->wes);
    }
}

int zo__win_range(zo_optim *o, unsigned w, uint64_t lo, uint64_t n, const void **g, zo_dtype *dt, float **tmp)
{
    *tmp = NULL;
    *dt = o->wdt;
    *g = (const char *)o->acc[w] + lo * o->wes;
    if (o->wdt == ZO_DTYPE_F32 || !atomic_load(&o->nspill[w]))
        return 0;
    uint64_t hi = lo + n;
    unsigned a = zo__tensor_at(o, lo), i;
    for (i = a; i < o->nt && o->tensors[i].off < hi && !o->spill[w][i]; i++)
        ;
    if (i >= o->nt || o->tensors[i].off >= hi)
        return 0; /* no spilled tensor in the range */
    float *f = NULL;
    int r = zo_aligned_alloc((void **)&f, ZO_ALIGN_UP((size_t)n * 4, (size_t)64), 64);
    if (r < 0)
        return ZO_FAIL(zo__eb(o), r, "zo_optim: no memory for the fp32 copy of %llu gradient elements",
                       (unsigned long long)n);
    for (i = a; i < o->nt && o->tensors[i].off < hi; i++) {
        const zo__ot *ot = &o->tensors[i];
        uint64_t s = ZO_MAX(lo, ot->off), end = ZO_MIN(hi, ot->off + ot->numel);
        if (o->spill[w][i])
            memcpy(f + (s - lo), o->spill[w][i] + (s - ot->off), (size_t)(end - s) * 4);
        else
            zo_vec_cast(f + (s - lo), ZO_DTYPE_F32, (const char *)o->acc[w] + s * o->wes, o->wdt, (size_t)(end - s));
    }
    *g = f;
    *dt = ZO_DTYPE_F32;
    *tmp = f;
    return 0;
}
