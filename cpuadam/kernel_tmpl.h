/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The optimizer kernels, written once over a small vector layer that each
 * ISA file defines before including this header:
 *
 *   W                      lanes per vector
 *   VF                     the float vector type
 *   vf_set1(x) vf_zero()   broadcast, zero
 *   vf_add/sub/mul/div(a,b), vf_fma(a,b,c) = a*b+c (fused),
 *   vf_fnma(a,b,c) = c-a*b (fused), vf_sqrt(a), vf_max0(a) = max(0,a) with
 *   NaN kept, vf_sign_nan(a) = -1/0/+1 with NaN kept
 *   ldv(base, t, i)              W elements of type t at base[i] -> VF
 *   ldv_part(base, t, i, k)      the first k < W elements, the rest 0
 *   stv(base, t, i, x, nt)       store W elements (nt: streaming, aligned)
 *   stv_part(base, t, i, x, k)   store the first k < W elements
 *                                (a layer without masked loads and stores
 *                                defines KT_PART_BY_BUFFER instead and gets
 *                                the two through a stack buffer)
 *   kt_fence()                   after streaming stores
 *
 * and, for the gradient statistics (sums of squares in double lanes):
 *
 *   SD, sd_zero()                double accumulators holding W/2 squares
 *   SC, sc_zero()                32-bit lane counters
 *   stats_vec(x, &lo, &hi, &c)   squares of x's halves into lo and hi, and
 *                                c += 1 in each lane whose x is inf or NaN
 *   sc_sum(c)                    the sum of c's lanes (uint64_t)
 *   sd_sum4(a0, a1, a2, a3)      the sum of all their lanes (double)
 *
 * The operations, their order and the five fused multiply-adds are exactly
 * those of the C reference (kernels_ref.c, which calls fmaf() at the same
 * places), so every variant is bit-identical to it.
 *
 * Every (optimizer, grad type, state type, out type) combination becomes
 * its own function with the types as constants, so the inner loop has no
 * type tests. Each thread's range is walked in full vectors, two at a time
 * (enough loads in flight for this core), with one partial vector at the
 * end. With streaming output the head is peeled until the out copy is
 * 64-byte aligned, so whole cache lines stream.
 */
#ifndef ZO_CPUADAM_KERNEL_TMPL_H
#define ZO_CPUADAM_KERNEL_TMPL_H

#include <string.h>

#define AI static inline __attribute__((always_inline))

/* Optional: software prefetch of the step's input streams at element i of
 * the main loop (a layer defines it where the hardware prefetchers leave
 * the loads short; see adam_avx2.c). */
#ifndef KT_PREFETCH
#define KT_PREFETCH(j, i, G, S) ((void)0)
#endif

AI size_t tsize(int t)
{
    return t == ZO__T_F32 ? 4 : 2;
}

#ifdef KT_PART_BY_BUFFER
/* Partial vectors through a small stack buffer, so tails get the same
 * vector arithmetic as the body. */
AI VF ldv_part(const void *base, int t, size_t i, unsigned k)
{
    _Alignas(64) unsigned char buf[4 * W] = {0};
    memcpy(buf, (const char *)base + i * tsize(t), k * tsize(t));
    return ldv(buf, t, 0);
}

AI void stv_part(void *base, int t, size_t i, VF x, unsigned k)
{
    _Alignas(64) unsigned char buf[4 * W];
    stv(buf, t, 0, x, 0);
    memcpy((char *)base + i * tsize(t), buf, k * tsize(t));
}
#endif

typedef struct kconst {
    VF gscale, b1, omb1, b2, omb2, eps, decay, l2, neg_step, isbc2;
} kconst;

AI kconst kconst_load(const zo__optim_job *j)
{
    kconst c;
    c.gscale = vf_set1(j->gscale);
    c.b1 = vf_set1(j->b1);
    c.omb1 = vf_set1(j->omb1);
    c.b2 = vf_set1(j->b2);
    c.omb2 = vf_set1(j->omb2);
    c.eps = vf_set1(j->eps);
    c.decay = vf_set1(j->decay);
    c.l2 = vf_set1(j->l2);
    c.neg_step = vf_set1(j->neg_step);
    c.isbc2 = vf_set1(j->inv_sqrt_bc2);
    return c;
}

/* Load / store W lanes at i, whole (k == W) or partial (k < W). */
AI VF ld_k(const void *base, int t, size_t i, unsigned k)
{
    return k == W ? ldv(base, t, i) : ldv_part(base, t, i, k);
}

AI void st_k(void *base, int t, size_t i, VF x, unsigned k, int nt)
{
    if (k == W)
        stv(base, t, i, x, nt);
    else
        stv_part(base, t, i, x, k);
}

/* One vector of the step. K, G, S, O are constants after inlining; O < 0
 * means no out copy. */
AI void step_vec(const zo__optim_job *j, const kconst *c, size_t i, unsigned k, const int K,
                 const int G, const int S, const int O, const int nt)
{
    VF g = vf_mul(ld_k(j->g, G, i, k), c->gscale);
    VF p = ld_k(j->p, ZO__T_F32, i, k);
    if (K == ZO__K_ADAMW || K == ZO__K_ADAM) {
        if (K == ZO__K_ADAM)
            g = vf_fma(c->l2, p, g);
        VF m = vf_fma(c->b1, ld_k(j->m, S, i, k), vf_mul(c->omb1, g));
        VF v = vf_fma(vf_mul(c->omb2, g), g, vf_mul(c->b2, ld_k(j->v, S, i, k)));
        VF den = vf_fma(vf_sqrt(v), c->isbc2, c->eps);
        VF u = vf_div(vf_mul(c->neg_step, m), den);
        p = K == ZO__K_ADAMW ? vf_fma(p, c->decay, u) : vf_add(p, u);
        st_k(j->m, S, i, m, k, 0);
        st_k(j->v, S, i, v, k, 0);
    } else if (K == ZO__K_ADAGRAD) {
        g = vf_fma(c->l2, p, g);
        VF v = vf_fma(g, g, ld_k(j->v, S, i, k));
        VF sd = vf_add(vf_sqrt(v), c->eps);
        p = vf_add(p, vf_div(vf_mul(c->neg_step, g), sd));
        st_k(j->v, S, i, v, k, 0);
    } else { /* Lion */
        VF m = ld_k(j->m, S, i, k);
        VF cc = vf_fma(m, c->b1, vf_mul(g, c->omb1));
        p = vf_fma(p, c->decay, vf_mul(c->neg_step, vf_sign_nan(cc)));
        st_k(j->m, S, i, vf_fma(m, c->b2, vf_mul(g, c->omb2)), k, 0);
    }
    st_k(j->p, ZO__T_F32, i, p, k, 0);
    if (O >= 0)
        st_k(j->out, O, i, p, k, nt);
}

AI void step_range(const zo__optim_job *j, size_t i, size_t end, const int K, const int G,
                   const int S, const int O)
{
    const kconst c = kconst_load(j);
    int nt = O >= 0 && j->nt_out;
    if (nt) {
        /* peel until out + i is 64-byte aligned (out is element-aligned) */
        uintptr_t a = (uintptr_t)((char *)j->out + i * tsize(O));
        size_t head = ((64 - (a & 63)) & 63) / tsize(O);
        head = head < end - i ? head : end - i;
        while (head) {
            unsigned k = head < W ? (unsigned)head : W;
            step_vec(j, &c, i, k, K, G, S, O, 0);
            i += k;
            head -= k;
        }
    }
    if (nt) {
        for (; i + 2 * W <= end; i += 2 * W) {
            KT_PREFETCH(j, i, G, S);
            step_vec(j, &c, i, W, K, G, S, O, 1);
            step_vec(j, &c, i + W, W, K, G, S, O, 1);
        }
    } else {
        for (; i + 2 * W <= end; i += 2 * W) {
            KT_PREFETCH(j, i, G, S);
            step_vec(j, &c, i, W, K, G, S, O, 0);
            step_vec(j, &c, i + W, W, K, G, S, O, 0);
        }
    }
    for (; i + W <= end; i += W)
        step_vec(j, &c, i, W, K, G, S, O, 0);
    if (i < end)
        step_vec(j, &c, i, (unsigned)(end - i), K, G, S, O, 0);
    if (nt && !j->nt_defer_fence)
        kt_fence();
}

/* ---- rollback: the inverse of the Adam/AdamW vector (fp32 states) ---------- */
AI void rollback_vec(const zo__optim_job *j, const kconst *c, size_t i, unsigned k, const int K,
                     const int G, const int O)
{
    VF g = vf_mul(ld_k(j->g, G, i, k), c->gscale);
    VF m = ld_k(j->m, ZO__T_F32, i, k);
    VF v = ld_k(j->v, ZO__T_F32, i, k);
    VF den = vf_fma(vf_sqrt(v), c->isbc2, c->eps);
    VF u = vf_div(vf_mul(c->neg_step, m), den);
    VF p = vf_sub(ld_k(j->p, ZO__T_F32, i, k), u);
    if (K == ZO__K_ADAMW)
        p = vf_div(p, c->decay);
    else
        g = vf_fma(c->l2, p, g);
    /* beta == 0: the old state never matters again; it comes back 0 */
    VF mp = j->b1 != 0.0f ? vf_div(vf_fnma(c->omb1, g, m), c->b1) : vf_zero();
    VF vp = j->b2 != 0.0f ? vf_div(vf_fnma(vf_mul(c->omb2, g), g, v), c->b2) : vf_zero();
    st_k(j->m, ZO__T_F32, i, mp, k, 0);
    st_k(j->v, ZO__T_F32, i, vf_max0(vp), k, 0);
    st_k(j->p, ZO__T_F32, i, p, k, 0);
    if (O >= 0)
        st_k(j->out, O, i, p, k, 0);
}

AI void rollback_range(const zo__optim_job *j, size_t i, size_t end, const int K, const int G,
                       const int O)
{
    const kconst c = kconst_load(j);
    for (; i + W <= end; i += W)
        rollback_vec(j, &c, i, W, K, G, O);
    if (i < end)
        rollback_vec(j, &c, i, (unsigned)(end - i), K, G, O);
}

/* ---- one function per type combination, and the tables ------------------ */
typedef void (*zo__kfn)(const zo__optim_job *, size_t, size_t);

#define KT_S(s) ((s) ? ZO__T_BF16 : ZO__T_F32)
#define KT_FN(K, G, S, O) kt_step_##K##_##G##_##S##_##O
#define KT_DEF1(K, G, S, O)                                                           \
    static void KT_FN(K, G, S, O)(const zo__optim_job *j, size_t b, size_t e)         \
    {                                                                                 \
        step_range(j, b, e, K, G, KT_S(S), (O) - 1);                                  \
    }
#define KT_DEF_O(K, G, S) KT_DEF1(K, G, S, 0) KT_DEF1(K, G, S, 1) KT_DEF1(K, G, S, 2) KT_DEF1(K, G, S, 3)
#define KT_DEF_S(K, G) KT_DEF_O(K, G, 0) KT_DEF_O(K, G, 1)
#define KT_DEF_G(K) KT_DEF_S(K, 0) KT_DEF_S(K, 1) KT_DEF_S(K, 2)
KT_DEF_G(0)
KT_DEF_G(1)
KT_DEF_G(2)
KT_DEF_G(3)

#define KT_ROW_O(K, G, S) {KT_FN(K, G, S, 0), KT_FN(K, G, S, 1), KT_FN(K, G, S, 2), KT_FN(K, G, S, 3)}
#define KT_ROW_S(K, G) {KT_ROW_O(K, G, 0), KT_ROW_O(K, G, 1)}
#define KT_ROW_G(K) {KT_ROW_S(K, 0), KT_ROW_S(K, 1), KT_ROW_S(K, 2)}
/* [kind][grad type][state bf16?][out type + 1] */
static const zo__kfn kt_step_tab[4][3][2][4] = {KT_ROW_G(0), KT_ROW_G(1), KT_ROW_G(2), KT_ROW_G(3)};

static void kt_step(const zo__optim_job *j, size_t begin, size_t end)
{
    kt_step_tab[j->kind][j->gdt][j->sdt == ZO__T_BF16][j->out ? j->odt + 1 : 0](j, begin, end);
}

#define KT_RFN(K, G, O) kt_rb_##K##_##G##_##O
#define KT_RDEF1(K, G, O)                                                             \
    static void KT_RFN(K, G, O)(const zo__optim_job *j, size_t b, size_t e)           \
    {                                                                                 \
        rollback_range(j, b, e, K, G, (O) - 1);                                       \
    }
#define KT_RDEF_O(K, G) KT_RDEF1(K, G, 0) KT_RDEF1(K, G, 1) KT_RDEF1(K, G, 2) KT_RDEF1(K, G, 3)
#define KT_RDEF_G(K) KT_RDEF_O(K, 0) KT_RDEF_O(K, 1) KT_RDEF_O(K, 2)
KT_RDEF_G(0)
KT_RDEF_G(1)
#define KT_RROW_O(K, G) {KT_RFN(K, G, 0), KT_RFN(K, G, 1), KT_RFN(K, G, 2), KT_RFN(K, G, 3)}
#define KT_RROW_G(K) {KT_RROW_O(K, 0), KT_RROW_O(K, 1), KT_RROW_O(K, 2)}
/* [Adam(W) kind][grad type][out type + 1] */
static const zo__kfn kt_rb_tab[2][3][4] = {KT_RROW_G(0), KT_RROW_G(1)};

static void kt_rollback(const zo__optim_job *j, size_t begin, size_t end)
{
    kt_rb_tab[j->kind][j->gdt][j->out ? j->odt + 1 : 0](j, begin, end);
}

/* ---- the in-place streaming bound: 4 fp32 streams in, 3 out ------------- */
AI void bound_vec(float *a, float *b, float *c, const float *d, VF al, size_t i, unsigned k)
{
    VF x = vf_mul(al, ld_k(d, ZO__T_F32, i, k));
    st_k(a, ZO__T_F32, i, vf_add(ld_k(a, ZO__T_F32, i, k), x), k, 0);
    st_k(b, ZO__T_F32, i, vf_add(ld_k(b, ZO__T_F32, i, k), x), k, 0);
    st_k(c, ZO__T_F32, i, vf_add(ld_k(c, ZO__T_F32, i, k), x), k, 0);
}

static __attribute__((unused)) void kt_stream_bound(float *a, float *b, float *c, const float *d,
                                                    float alpha, size_t i, size_t end)
{
    VF al = vf_set1(alpha);
    for (; i + 2 * W <= end; i += 2 * W) {
        bound_vec(a, b, c, d, al, i, W);
        bound_vec(a, b, c, d, al, i + W, W);
    }
    for (; i + W <= end; i += W)
        bound_vec(a, b, c, d, al, i, W);
    if (i < end)
        bound_vec(a, b, c, d, al, i, (unsigned)(end - i));
}

/* ---- gradient statistics: sum of squares (double), non-finite count ----- */
AI void stats_range(const void *g, const int t, size_t i, size_t end, double *sumsq,
                    uint64_t *nonfinite)
{
    SD a0 = sd_zero(), a1 = a0, a2 = a0, a3 = a0;
    uint64_t total = 0;
    while (i < end) { /* 32-bit lane counters: flush every 2^30 elements */
        size_t stop = end - i > ((size_t)1 << 30) ? i + ((size_t)1 << 30) : end;
        SC c0 = sc_zero(), c1 = c0;
        for (; i + 2 * W <= stop; i += 2 * W) {
            stats_vec(ldv(g, t, i), &a0, &a1, &c0);
            stats_vec(ldv(g, t, i + W), &a2, &a3, &c1);
        }
        for (; i + W <= stop; i += W)
            stats_vec(ldv(g, t, i), &a0, &a1, &c0);
        if (i < stop) { /* zero padding adds nothing and is finite */
            stats_vec(ldv_part(g, t, i, (unsigned)(stop - i)), &a2, &a3, &c1);
            i = stop;
        }
        total += sc_sum(c0) + sc_sum(c1);
    }
    *sumsq = sd_sum4(a0, a1, a2, a3);
    *nonfinite = total;
}

static __attribute__((unused)) void kt_grad_stats(const void *g, int gdt, size_t begin, size_t end,
                                                  double *sumsq, uint64_t *nonfinite)
{
    switch (gdt) {
    case ZO__T_F16: stats_range(g, ZO__T_F16, begin, end, sumsq, nonfinite); break;
    case ZO__T_BF16: stats_range(g, ZO__T_BF16, begin, end, sumsq, nonfinite); break;
    default: stats_range(g, ZO__T_F32, begin, end, sumsq, nonfinite); break;
    }
}

#endif /* ZO_CPUADAM_KERNEL_TMPL_H */
