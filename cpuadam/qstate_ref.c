/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Low-bit optimizer states: the code maps, the C reference block kernels
 * (dequantize, quantize) and the quantized step's driver.
 *
 * The maps are computed in double and rounded once to fp32, so the tables
 * are the same on every machine and compiler (the file is built with
 * -ffp-contract=off like the other reference code); tests/python rebuilds
 * them with Python floats and compares bit for bit. The driver is baseline
 * code that only calls through a DSP table the dispatch already vetted: per
 * block it dequantizes m and v into fp32 buffers on the stack, runs the
 * variant's own fp32 step kernel on them (so the update is bit-identical to
 * the fp32 path's), and requantizes.
 */
#define ZO_MODULE "cpuadam"
#include "core/internal.h"
#include "core/vec_ref.h"
#include "cpuadam/cpuadam_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/cpuadam.h>

_Static_assert(ZO__QBLOCK_MAX == ZO_QBLOCK_MAX, "internal and public block limits differ");

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* bitsandbytes' create_dynamic_map(signed, max_exponent_bits, total_bits)
 * without its zero padding to 256 entries: for exponent i, the midpoints
 * of linspace(0.1, 1, k) scaled by 10^(i - meb + 1), plus 0 and 1. The
 * linspace is numpy's formula (start + k * step, the last point exactly
 * the end), in double. Returns the entry count (2^total_bits). */
static int dynamic_map(int sign, int meb, int total_bits, float *out)
{
    /* decimal powers as literals: correctly rounded, unlike some pow()s */
    static const double p10[] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0};
    int nsb = total_bits - 1, n = 0;
    for (int i = 0; i < meb; i++) {
        int items = sign ? (1 << (i + nsb - meb)) + 1 : (1 << (i + nsb - meb + 1)) + 1;
        double step = (1.0 - 0.1) / (double)(items - 1), scale = p10[6 - (meb - 1) + i];
        for (int k = 0; k + 1 < items; k++) {
            double b0 = 0.1 + (double)k * step;
            double b1 = k + 2 == items ? 1.0 : 0.1 + (double)(k + 1) * step;
            double mean = (b0 + b1) / 2.0;
            out[n++] = (float)(scale * mean);
            if (sign)
                out[n++] = (float)(-scale * mean);
        }
    }
    out[n++] = 0.0f;
    out[n++] = 1.0f;
    qsort(out, (size_t)n, sizeof(float), cmp_f);
    return n;
}

/* Evenly spaced: signed (k - h) / h for k = 0..2h (an exact 0 and +-1),
 * unsigned k / (2^bits - 1); without zero (nz) (k + 1) / 2^bits, the
 * divisions exact in double. */
static int linear_map(int sign, int nz, int bits, float *out)
{
    int top = (1 << bits) - 1;
    if (nz) {
        for (int k = 0; k <= top; k++)
            out[k] = (float)((double)(k + 1) / (double)(top + 1));
        return top + 1;
    }
    if (sign) {
        int h = top / 2;
        for (int k = 0; k <= 2 * h; k++)
            out[k] = (float)((double)(k - h) / (double)h);
        return 2 * h + 1;
    }
    for (int k = 0; k <= top; k++)
        out[k] = (float)((double)k / (double)top);
    return top + 1;
}

static float f_of_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* The straightforward definition the bucket lookup must reproduce. */
static unsigned count_below(const zo__qmap_tab *t, float x)
{
    unsigned c = 0;
    for (int k = 0; k + 1 < t->ncodes; k++)
        c += x > t->mid[k];
    return c;
}

/* Midpoints below x (strictly, or also equal to it): binary search over
 * the sorted midpoints, so building a map's buckets stays cheap. */
static int mids_below(const zo__qmap_tab *t, float x, int or_equal)
{
    int lo = 0, hi = t->ncodes - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (t->mid[mid] < x || (or_equal && t->mid[mid] == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Bucket tables with `mbits` mantissa bits per key; 0 if some bucket
 * would hold two midpoints. */
static int build_buckets(zo__qmap_tab *t, int mbits)
{
    t->shift = 23u - (unsigned)mbits;
    t->kbias = ZO__QB_EBIAS << mbits;
    t->nmag = ZO__QB_EXPS << mbits;
    for (int32_t j = 0; j < t->nmag; j++) {
        float lo = j ? f_of_bits((uint32_t)(j + t->kbias) << t->shift) : 0.0f;
        float hi = j + 1 < t->nmag ? f_of_bits((uint32_t)(j + 1 + t->kbias) << t->shift) : 2.0f;
        /* x in [lo, hi): midpoints below lo always count, one in [lo, hi) may */
        int below = mids_below(t, lo, 0), in = mids_below(t, hi, 0) - below;
        /* x in (-hi, -lo]: those <= -hi always count, one in (-hi, -lo] may */
        int nbelow = mids_below(t, -hi, 1), nin = mids_below(t, -lo, 1) - nbelow;
        if (in > 1 || nin > 1)
            return 0;
        t->bucket[j] = (uint8_t)below;
        t->bucket[t->nmag + j] = (uint8_t)nbelow;
    }
    return 1;
}

/* The packed buckets (zo__qmap_tab.pbucket) from the byte ones: the base
 * code and, where the bucket holds a midpoint, its low bits (flipped on the
 * negative side). 0 if the first bucket, which also takes every |x| below
 * 2^-24 (their low bits say nothing), holds one. */
static int build_packed(zo__qmap_tab *t)
{
    t->lowmask = (1u << t->shift) - 1u;
    for (int32_t j = 0; j < 2 * t->nmag; j++) {
        int neg = j >= t->nmag;
        int32_t jm = neg ? j - t->nmag : j;
        unsigned base = t->bucket[j];
        float mid = t->mid[base];
        uint32_t mb;
        memcpy(&mb, &mid, 4);
        /* is mid[base] inside this bucket: same sign and key */
        int32_t mk = (int32_t)((mb & 0x7fffffffu) >> t->shift) - t->kbias;
        int inside = isfinite(mid) && (mb >> 31) == (uint32_t)neg && mk == jm;
        if (inside && jm == 0)
            return 0;
        uint32_t thr = t->lowmask;
        if (inside)
            thr = (neg ? ~mb : mb) & t->lowmask;
        t->pbucket[j] = base | thr << 8;
    }
    return 1;
}

static int build_map(zo__qmap_tab *t, int map, int bits)
{
    memset(t, 0, sizeof(*t));
    t->bits = bits;
    int sign = map == ZO_QMAP_DYNAMIC_SIGNED || map == ZO_QMAP_LINEAR_SIGNED;
    if (map == ZO_QMAP_DYNAMIC_SIGNED || map == ZO_QMAP_DYNAMIC_UNSIGNED || map == ZO_QMAP_DYNAMIC_UNSIGNED_NZ) {
        t->ncodes = dynamic_map(sign, bits == 8 ? 7 : 3, bits, t->value);
        if (map == ZO_QMAP_DYNAMIC_UNSIGNED_NZ) { /* the same values less the 0 (sorted first) */
            memmove(t->value, t->value + 1, (size_t)(t->ncodes - 1) * sizeof(float));
            t->ncodes--;
        }
    } else {
        t->ncodes = linear_map(sign, map == ZO_QMAP_LINEAR_UNSIGNED_NZ, bits, t->value);
    }
    for (int k = t->ncodes; k < 256; k++)
        t->value[k] = t->value[t->ncodes - 1];
    for (int k = 0; k < 256; k++) {
        if (k + 1 < t->ncodes) {
            if (!(t->value[k] < t->value[k + 1]))
                return -1; /* the table must be strictly increasing */
            t->mid[k] = (float)(((double)t->value[k] + (double)t->value[k + 1]) * 0.5);
        } else {
            t->mid[k] = INFINITY;
        }
    }
    int mbits = 1;
    while (mbits <= ZO__QB_MAXM && !build_buckets(t, mbits))
        mbits++;
    if (mbits > ZO__QB_MAXM || !build_packed(t))
        return -1;
    /* check the lookup against the definition at every midpoint, its
     * neighbours and every value, both signs */
    for (int k = 0; k < 256; k++) {
        float pts[5] = {t->mid[k], nextafterf(t->mid[k], -INFINITY), nextafterf(t->mid[k], INFINITY),
                        t->value[k], -t->value[k]};
        for (int q = 0; q < 5; q++)
            if (isfinite(pts[q]) && (zo__qcode(t, pts[q]) != count_below(t, pts[q]) ||
                                     zo__qcode_packed(t, pts[q]) != count_below(t, pts[q])))
                return -1;
    }
    return 0;
}

static zo__qmap_tab maps[ZO_QMAP_COUNT][2];
static int maps_ok;
static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

static void maps_init(void)
{
    int ok = 1;
    for (int m = 0; m < ZO_QMAP_COUNT; m++)
        for (int b = 0; b < 2; b++)
            ok &= build_map(&maps[m][b], m, b ? 4 : 8) == 0;
    maps_ok = ok;
}

const zo__qmap_tab *zo__qmap_get(int map, int bits)
{
    if ((unsigned)map >= ZO_QMAP_COUNT || (bits != 8 && bits != 4))
        return NULL;
    pthread_once(&maps_once, maps_init);
    return maps_ok ? &maps[map][bits == 4] : NULL;
}

/* ---- the C reference block kernels ------------------------------------------ */
void zo__q_dequant_ref(const uint8_t *codes, int bits, const zo__qmap_tab *t, float absmax, float *x,
                       size_t len)
{
    uint8_t buf[ZO__QBLOCK_MAX];
    const uint8_t *c = zo__qunpack(codes, len, bits, buf);
    zo__qvalues(t, c, 0, len, absmax, x);
}

void zo__q_quant_ref(const float *x, size_t len, const zo__qmap_tab *t, int bits, uint8_t *codes,
                     float *absmax)
{
    uint8_t c[ZO__QBLOCK_MAX];
    unsigned z = 0;
    if (zo__qscale(t, zo__qamax(x, 0, len, 0), absmax, &z)) {
        zo__qcodes(t, x, 0, len, zo__qdiv_of(*absmax), c);
    } else {
        memset(c, (int)z, len);
    }
    zo__qpack(c, len, bits, codes);
}

/* ---- the driver ------------------------------------------------------------------ */
void zo__cpuadam_qstep_blocks(const zo_cpuadam_dsp *d, const zo__qjob *q, size_t bbegin, size_t bend)
{
    _Alignas(64) float mb[ZO__QBLOCK_MAX], vb[ZO__QBLOCK_MAX];
    const zo__optim_job *j = &q->job;
    size_t gsz = j->gdt == ZO__T_F32 ? 4 : 2, osz = j->odt == ZO__T_F32 ? 4 : 2;
    zo__optim_job s = *j;
    s.sdt = ZO__T_F32;
    s.m = q->mc ? mb : NULL;
    s.v = q->vc ? vb : NULL;
    for (size_t b = bbegin; b < bend; b++) {
        size_t i0 = b * q->block, len = q->n - i0 < q->block ? q->n - i0 : q->block;
        size_t coff = q->bits == 8 ? i0 : i0 / 2; /* blocks are even: whole bytes */
        s.p = j->p + i0;
        s.g = (const char *)j->g + i0 * gsz;
        s.out = j->out ? (char *)j->out + i0 * osz : NULL;
        if (q->mc)
            d->qdequant(q->mc + coff, q->bits, q->mmap, q->ms[b], mb, len);
        if (q->vc)
            d->qdequant(q->vc + coff, q->bits, q->vmap, q->vs[b], vb, len);
        /* one store fence for the range, not one per block: draining the
         * streaming out stores after every 256 elements cost the bf16-out
         * q8 step a fifth of its speed (docs/cpuadam.md) */
        s.nt_defer_fence = b + 1 < bend;
        d->step(&s, 0, len);
        if (q->mc)
            d->qquant(mb, len, q->mmap, q->bits, q->mc + coff, &q->ms[b]);
        if (q->vc)
            d->qquant(vb, len, q->vmap, q->bits, q->vc + coff, &q->vs[b]);
    }
}
