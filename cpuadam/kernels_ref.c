/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpuadam C reference kernels and the run-time dispatch of the DSP table.
 *
 * The reference is the definition every SIMD variant is tested against. It
 * is torch.optim's formula in fp32, one rounding per operation, except at
 * the five places where the SIMD kernels use a fused multiply-add: there
 * it calls fmaf(), which rounds once too. Everything else (mul, div, sqrt,
 * add) is correctly rounded in C and in SIMD alike, so every variant gives
 * bit-identical fp32 results (NaN payloads aside). The file is built with
 * -ffp-contract=off so the compiler adds no other fusions. Against torch's
 * own fp32 arithmetic (which does not fuse) the results differ by a few
 * ulps; docs/cpuadam.md states the bound and tests/test_cpuadam.c checks it
 * on vectors torch computed. One more difference from torch: the
 * bias-corrected denominator multiplies by 1/sqrt(1 - beta2^t) (rounded once
 * from double) where torch divides by sqrt(1 - beta2^t).
 */
#define ZO_MODULE "cpuadam"
#include "core/internal.h"
#include "core/dispatch.h"
#include "core/vec_ref.h"
#include "cpuadam/cpuadam_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include <zoffload/cpu.h>

static inline float ld(const void *base, int t, size_t i)
{
    switch (t) {
    case ZO__T_F16: return zo__ref_f16_to_f32(((const uint16_t *)base)[i]);
    case ZO__T_BF16: return zo__ref_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static inline void st(void *base, int t, size_t i, float x)
{
    switch (t) {
    case ZO__T_F16: ((uint16_t *)base)[i] = zo__ref_f32_to_f16(x); break;
    case ZO__T_BF16: ((uint16_t *)base)[i] = zo__ref_f32_to_bf16(x); break;
    default: ((float *)base)[i] = x; break;
    }
}

/* torch.sign: -1, 0 or 1; NaN stays NaN. */
static inline float sign_nan(float c)
{
    if (c > 0.0f)
        return 1.0f;
    if (c < 0.0f)
        return -1.0f;
    return c != c ? c : 0.0f;
}

static void c_step(const zo__optim_job *j, size_t begin, size_t end)
{
    for (size_t i = begin; i < end; i++) {
        float g = ld(j->g, j->gdt, i) * j->gscale;
        float p = j->p[i];
        switch (j->kind) {
        case ZO__K_ADAMW:
        case ZO__K_ADAM: {
            if (j->kind == ZO__K_ADAM)
                g = fmaf(j->l2, p, g);
            float m = fmaf(j->b1, ld(j->m, j->sdt, i), j->omb1 * g);
            float v = fmaf(j->omb2 * g, g, j->b2 * ld(j->v, j->sdt, i));
            float denom = fmaf(sqrtf(v), j->inv_sqrt_bc2, j->eps);
            float u = (j->neg_step * m) / denom;
            p = j->kind == ZO__K_ADAMW ? fmaf(p, j->decay, u) : p + u;
            st(j->m, j->sdt, i, m);
            st(j->v, j->sdt, i, v);
            break;
        }
        case ZO__K_ADAGRAD: {
            g = fmaf(j->l2, p, g);
            float v = fmaf(g, g, ld(j->v, j->sdt, i));
            float sd = sqrtf(v) + j->eps;
            p = p + (j->neg_step * g) / sd;
            st(j->v, j->sdt, i, v);
            break;
        }
        default: { /* Lion */
            float m = ld(j->m, j->sdt, i);
            float c = fmaf(m, j->b1, g * j->omb1);
            p = fmaf(p, j->decay, j->neg_step * sign_nan(c));
            st(j->m, j->sdt, i, fmaf(m, j->b2, g * j->omb2));
            break;
        }
        }
        j->p[i] = p;
        if (j->out)
            st(j->out, j->odt, i, p);
    }
}

/* Inverse of the Adam/AdamW element update (fp32 states). */
static void c_rollback(const zo__optim_job *j, size_t begin, size_t end)
{
    float *M = j->m, *V = j->v;
    for (size_t i = begin; i < end; i++) {
        float g = ld(j->g, j->gdt, i) * j->gscale;
        float m = M[i], v = V[i];
        float denom = fmaf(sqrtf(v), j->inv_sqrt_bc2, j->eps);
        float u = (j->neg_step * m) / denom;
        float p = j->p[i] - u;
        if (j->kind == ZO__K_ADAMW)
            p = p / j->decay;
        else
            g = fmaf(j->l2, p, g);
        /* beta == 0: the old state never matters again; it comes back 0 */
        float mp = j->b1 != 0.0f ? fmaf(-j->omb1, g, m) / j->b1 : 0.0f;
        float vp = j->b2 != 0.0f ? fmaf(-(j->omb2 * g), g, v) / j->b2 : 0.0f;
        if (vp < 0.0f)
            vp = 0.0f;
        M[i] = mp;
        V[i] = vp;
        j->p[i] = p;
        if (j->out)
            st(j->out, j->odt, i, p);
    }
}

static void c_grad_stats(const void *g, int gdt, size_t begin, size_t end, double *sumsq,
                         uint64_t *nonfinite)
{
    double s = 0;
    uint64_t c = 0;
    for (size_t i = begin; i < end; i++) {
        float x = ld(g, gdt, i);
        s += (double)x * (double)x;
        c += (zo__f32_bits(x) & 0x7f800000u) == 0x7f800000u;
    }
    *sumsq = s;
    *nonfinite = c;
}

static void c_stream_bound(float *a, float *b, float *c, const float *d, float alpha, size_t begin,
                           size_t end)
{
    for (size_t i = begin; i < end; i++) {
        float x = alpha * d[i];
        a[i] = a[i] + x;
        b[i] = b[i] + x;
        c[i] = c[i] + x;
    }
}

static const zo_cpuadam_dsp c_table = {
    .name = "scalar",
    .step = c_step,
    .rollback = c_rollback,
    .grad_stats = c_grad_stats,
    .stream_bound = c_stream_bound,
    .qdequant = zo__q_dequant_ref,
    .qquant = zo__q_quant_ref,
};

/* The variants from slowest to fastest, each needing what its predecessors
 * need. The usable table of variant v is built here, in baseline code, by
 * laying the constant tables 0..v over each other (core/dispatch.h): only
 * addresses are copied, so every table can be built on any CPU, and
 * zo__variant_pick() keeps a table the CPU cannot run from being handed
 * out. */
ZO_DISPATCH_TABLE_CHECK(zo_cpuadam_dsp);
static const zo__variant variants[] = {
    {0, &c_table},
#if defined(__x86_64__)
    {ZO_CPU_LEVEL_AVX2, &zo__cpuadam_avx2},
    {ZO_CPU_LEVEL_AVX512, &zo__cpuadam_avx512},
    {ZO_CPU_LEVEL_AVX512 | ZO_CPU_AVX512BF16, &zo__cpuadam_avx512bf16},
#elif defined(__aarch64__)
    {ZO_CPU_LEVEL_NEON, &zo__cpuadam_neon},
#endif
};
#define V_COUNT (sizeof(variants) / sizeof(variants[0]))
static zo_cpuadam_dsp tables[V_COUNT];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
    zo__variant_overlay(tables, sizeof(tables[0]), variants, V_COUNT);
}

const zo_cpuadam_dsp *zo__cpuadam_dsp_for(unsigned flags)
{
    pthread_once(&tables_once, tables_init);
    return &tables[zo__variant_pick(variants, V_COUNT, flags)];
}

const zo_cpuadam_dsp *zo__cpuadam_dsp(void)
{
    return zo__cpuadam_dsp_for(zo_cpu_flags());
}

const char *zo__cpuadam_variant_at(unsigned i, unsigned *need)
{
    if (i >= V_COUNT)
        return NULL;
    if (need)
        *need = variants[i].need;
    return zo__variant_name(&variants[i]);
}

const zo_cpuadam_dsp *zo__cpuadam_dsp_named(const char *name, unsigned *need)
{
    pthread_once(&tables_once, tables_init);
    for (size_t v = 0; v < V_COUNT; v++) {
        if (strcmp(name, tables[v].name) == 0) {
            if (need)
                *need = variants[v].need;
            return &tables[v];
        }
    }
    return NULL;
}
