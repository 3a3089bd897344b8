/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpuadam public API: argument checks, the per-step scalars, threading
 * (OpenMP, one contiguous 64-element-aligned range per thread walked in
 * tiles), teams (thread count, pinning and variant in a handle).
 */
#define ZO_MODULE "cpuadam"
#include "core/internal.h"
#include "cpuadam/cpuadam_internal.h"

#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zoffload/cpu.h>
#include <zoffload/cpuadam.h>
#include <zoffload/topo.h>

#if ZO_HAVE_OPENMP
#include <omp.h>
#endif

/* Thread ranges start on multiples of this many elements, so two threads
 * never write the same cache line of 64-byte-aligned arrays. */
#define SPLIT_ALIGN 64u
/* A thread is worth forking only with at least this many elements: below
 * it the fork/join costs more than the work (measured on Zen 4: see
 * docs/benchmarks.md, "cpuadam"). */
#define MIN_PER_THREAD 32768u
#define DEFAULT_TILE 16384u
#define MAX_THREADS 1024
/* Streaming stores for the out copy: measured +3-8% at n = 1e8, no
 * difference at 1e5 (docs/benchmarks.md, "cpuadam"); below 2 MiB the copy
 * is likely still cached when the device copy reads it, so leave it there. */
#define NT_MIN_OUT_BYTES (2u << 20)

/* ---- hyperparameters and tensors --------------------------------------- */
ZO_API int zo_cpuadam_hparams_default(zo_cpuadam_hparams *hp, zo_optim_kind kind)
{
    if (!hp || (unsigned)kind >= ZO_OPTIM_KIND_COUNT)
        return ZO_FAIL(NULL, -EINVAL, "zo_cpuadam_hparams_default: %s",
                       hp ? "unknown optimizer kind" : "hp is NULL");
    memset(hp, 0, sizeof(*hp));
    hp->struct_size = sizeof(*hp);
    hp->kind = kind;
    hp->bias_correction = 1;
    hp->step = 1;
    hp->grad_scale = 1.0;
    hp->clip_coef = 1.0;
    switch (kind) {
    case ZO_OPTIM_ADAMW:
    case ZO_OPTIM_ADAM:
        hp->lr = 1e-3;
        hp->beta1 = 0.9;
        hp->beta2 = 0.999;
        hp->eps = 1e-8;
        hp->weight_decay = kind == ZO_OPTIM_ADAMW ? 1e-2 : 0.0;
        break;
    case ZO_OPTIM_ADAGRAD:
        hp->lr = 1e-2;
        hp->eps = 1e-10;
        break;
    default: /* Lion */
        hp->lr = 1e-4;
        hp->beta1 = 0.9;
        hp->beta2 = 0.99;
        break;
    }
    return 0;
}

ZO_API int zo_cpuadam_tensors_default(zo_cpuadam_tensors *t)
{
    if (!t)
        return ZO_FAIL(NULL, -EINVAL, "zo_cpuadam_tensors_default: t is NULL");
    memset(t, 0, sizeof(*t));
    t->struct_size = sizeof(*t);
    t->grad_dtype = ZO_DTYPE_F32;
    t->state_dtype = ZO_DTYPE_F32;
    t->out_dtype = ZO_DTYPE_BF16;
    return 0;
}

static const char *kind_name(int k)
{
    static const char *names[] = {"adamw", "adam", "adagrad", "lion"};
    return (unsigned)k < 4 ? names[k] : "?";
}

/* Copy a caller's hparams (which may be an older, shorter struct) over
 * the defaults. */
static int read_hparams(zo_errbuf *eb, const char *fn, const zo_cpuadam_hparams *in,
                        zo_cpuadam_hparams *hp)
{
    if (!in)
        return ZO_FAIL(eb, -EINVAL, "%s: hparams is NULL", fn);
    /* The first published version ends before grad_scale. The defaults
     * depend on the kind, which only the caller's struct names: a first
     * pass checks the size and reads the kind, a second lays the caller's
     * bytes over that kind's defaults. */
    const size_t min = offsetof(zo_cpuadam_hparams, grad_scale);
    zo_cpuadam_hparams_default(hp, ZO_OPTIM_ADAMW);
    ZO_CHECK(ZO_STRUCT_IN(hp, in, min, eb, fn));
    if ((unsigned)hp->kind >= ZO_OPTIM_KIND_COUNT)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: unknown optimizer kind %d", fn, (int)hp->kind);
    zo_cpuadam_hparams_default(hp, hp->kind);
    return ZO_STRUCT_IN(hp, in, min, eb, fn);
}

static int check_hparams(zo_errbuf *eb, const char *fn, const zo_cpuadam_hparams *hp)
{
    const char *k = kind_name(hp->kind);
    int adam = hp->kind == ZO_OPTIM_ADAMW || hp->kind == ZO_OPTIM_ADAM;
    if (!isfinite(hp->lr) || hp->lr < 0 || hp->lr > FLT_MAX)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: %s lr %g must be finite, >= 0, within fp32 range", fn, k, hp->lr);
    /* fp32 betas must stay below 1 too: (float)0.99999999 is 1 */
    if (adam && !(hp->beta1 >= 0 && (float)hp->beta1 < 1 && hp->beta2 >= 0 && (float)hp->beta2 < 1))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: %s betas (%g, %g) must lie in [0, 1)", fn, k,
                       hp->beta1, hp->beta2);
    if (hp->kind == ZO_OPTIM_LION && !(hp->beta1 >= 0 && hp->beta1 <= 1 && hp->beta2 >= 0 && hp->beta2 <= 1))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: lion betas (%g, %g) must lie in [0, 1]", fn,
                       hp->beta1, hp->beta2);
    if (!isfinite(hp->eps) || hp->eps < 0 || hp->eps > FLT_MAX)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: %s eps %g must be finite and >= 0", fn, k, hp->eps);
    if (!isfinite(hp->weight_decay) || hp->weight_decay < 0 || hp->weight_decay > FLT_MAX)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: %s weight_decay %g must be finite and >= 0", fn, k,
                       hp->weight_decay);
    if (hp->step < 1)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: step %lld must be >= 1 (the first update is step 1)", fn,
                       (long long)hp->step);
    if (hp->bias_correction != 0 && hp->bias_correction != 1)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: bias_correction %d must be 0 or 1", fn, hp->bias_correction);
    if (!isfinite(hp->grad_scale) || hp->grad_scale <= 0)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: grad_scale %g must be finite and > 0", fn, hp->grad_scale);
    if (!isfinite(hp->clip_coef) || hp->clip_coef <= 0)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: clip_coef %g must be finite and > 0", fn, hp->clip_coef);
    if (!isfinite((float)(hp->grad_scale * hp->clip_coef)) || !((float)(hp->grad_scale * hp->clip_coef) > 0))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: grad_scale * clip_coef = %g overflows or underflows fp32", fn,
                       hp->grad_scale * hp->clip_coef);
    return 0;
}

static int dtype_code(zo_dtype t)
{
    switch (t) {
    case ZO_DTYPE_F32: return ZO__T_F32;
    case ZO_DTYPE_F16: return ZO__T_F16;
    case ZO_DTYPE_BF16: return ZO__T_BF16;
    default: return -1;
    }
}

typedef struct span {
    const char *name;
    const void *p;
    size_t bytes;
} span;

static int check_buffers(zo_errbuf *eb, const char *fn, const span *s, int ns)
{
    for (int a = 0; a < ns; a++) {
        if (!s[a].p)
            return ZO_FAIL(eb, -EINVAL, "%s: %s is NULL", fn, s[a].name);
        /* a slice that would run past the end of the address space is a bad
         * n, not memory to walk into (and would wrap the overlap test) */
        if (s[a].bytes > UINTPTR_MAX - (uintptr_t)s[a].p)
            return ZO_FAIL(eb, -EINVAL, "%s: %s [%p, +%zu) runs past the end of the address space", fn,
                           s[a].name, s[a].p, s[a].bytes);
        for (int b = 0; b < a; b++) {
            uintptr_t a0 = (uintptr_t)s[a].p, b0 = (uintptr_t)s[b].p;
            if (a0 < b0 + s[b].bytes && b0 < a0 + s[a].bytes)
                return ZO_FAIL(eb, -EINVAL, "%s: %s [%p, +%zu) overlaps %s [%p, +%zu)", fn, s[a].name,
                               s[a].p, s[a].bytes, s[b].name, s[b].p, s[b].bytes);
        }
    }
    return 0;
}

static int check_align(zo_errbuf *eb, const char *fn, const char *name, const void *p, size_t esz)
{
    if ((uintptr_t)p % esz)
        return ZO_FAIL(eb, -EINVAL, "%s: %s %p is not aligned to its %zu-byte element", fn, name, p, esz);
    return 0;
}

static int job_scalars(zo_errbuf *eb, const char *fn, zo__optim_job *job, const zo_cpuadam_hparams *hp,
                       int rollback);

static int build_job(zo_errbuf *eb, const char *fn, zo__optim_job *job, const zo_cpuadam_hparams *hp_in,
                     const zo_cpuadam_tensors *t, int rollback)
{
    zo_cpuadam_hparams hp;
    ZO_CHECK(read_hparams(eb, fn, hp_in, &hp));
    ZO_CHECK(check_hparams(eb, fn, &hp));
    if (!t)
        return ZO_FAIL(eb, -EINVAL, "%s: tensors is NULL", fn);
    /* Checked like every versioned struct; the first published version is
     * the current one, so only struct_size == sizeof passes today. */
    zo_cpuadam_tensors tv;
    zo_cpuadam_tensors_default(&tv);
    ZO_CHECK(ZO_STRUCT_IN(&tv, t, sizeof(tv), eb, fn));
    t = &tv;
    size_t n = t->n;
    if (n == 0)
        return ZO_FAIL(eb, -EINVAL, "%s: n = 0 (an empty slice is a caller bug)", fn);
    if (n > SIZE_MAX / 8)
        return ZO_FAIL(eb, -EINVAL, "%s: n = %zu too large", fn, n);
    int kind = hp.kind;
    int gdt = dtype_code(t->grad_dtype), sdt = dtype_code(t->state_dtype);
    int odt = t->param_out ? dtype_code(t->out_dtype) : ZO__T_F32;
    if (gdt < 0)
        return ZO_FAIL(eb, ZO_ENOTSUP, "%s: grad dtype %s not supported (f32, f16, bf16)", fn,
                       zo_dtype_name(t->grad_dtype));
    if (sdt != ZO__T_F32 && sdt != ZO__T_BF16)
        return ZO_FAIL(eb, ZO_ENOTSUP, "%s: state dtype %s not supported (f32, bf16)", fn,
                       zo_dtype_name(t->state_dtype));
    if (odt < 0)
        return ZO_FAIL(eb, ZO_ENOTSUP, "%s: out dtype %s not supported (bf16, f16, f32)", fn,
                       zo_dtype_name(t->out_dtype));
    if (rollback) {
        if (kind != ZO_OPTIM_ADAMW && kind != ZO_OPTIM_ADAM)
            return ZO_FAIL(eb, ZO_ENOTSUP, "%s: rollback exists for adam and adamw, not %s", fn, kind_name(kind));
        if (sdt != ZO__T_F32)
            return ZO_FAIL(eb, ZO_ENOTSUP, "%s: rollback needs fp32 states (bf16 rounding cannot be undone)", fn);
    }
    size_t gsz = zo_dtype_size(t->grad_dtype), ssz = zo_dtype_size(t->state_dtype),
           osz = zo_dtype_size(t->param_out ? t->out_dtype : ZO_DTYPE_F32);
    int need_m = kind != ZO_OPTIM_ADAGRAD, need_v = kind != ZO_OPTIM_LION;
    span s[5];
    int ns = 0;
    s[ns++] = (span){"param", t->param, n * 4};
    s[ns++] = (span){"grad", t->grad, n * gsz};
    if (need_m)
        s[ns++] = (span){"exp_avg", t->exp_avg, n * ssz};
    if (need_v)
        s[ns++] = (span){"exp_avg_sq", t->exp_avg_sq, n * ssz};
    if (t->param_out)
        s[ns++] = (span){"param_out", t->param_out, n * osz};
    ZO_CHECK(check_buffers(eb, fn, s, ns));
    ZO_CHECK(check_align(eb, fn, "param", t->param, 4));
    ZO_CHECK(check_align(eb, fn, "grad", t->grad, gsz));
    if (need_m)
        ZO_CHECK(check_align(eb, fn, "exp_avg", t->exp_avg, ssz));
    if (need_v)
        ZO_CHECK(check_align(eb, fn, "exp_avg_sq", t->exp_avg_sq, ssz));
    if (t->param_out)
        ZO_CHECK(check_align(eb, fn, "param_out", t->param_out, osz));

    memset(job, 0, sizeof(*job));
    job->kind = kind; /* zo_optim_kind values equal ZO__K_* */
    job->gdt = gdt;
    job->sdt = sdt;
    job->odt = odt;
    job->p = t->param;
    job->g = t->grad;
    job->m = need_m ? t->exp_avg : NULL;
    job->v = need_v ? t->exp_avg_sq : NULL;
    job->out = t->param_out;
    return job_scalars(eb, fn, job, &hp, rollback);
}

/* The per-step scalars of job (kind already set) from validated hparams. */
static int job_scalars(zo_errbuf *eb, const char *fn, zo__optim_job *job, const zo_cpuadam_hparams *hpp,
                       int rollback)
{
    const zo_cpuadam_hparams hp = *hpp;
    int kind = hp.kind;
    double lr = hp.lr, wd = hp.weight_decay, b1 = hp.beta1, b2 = hp.beta2, step = (double)hp.step;
    job->gscale = (float)(hp.grad_scale * hp.clip_coef);
    job->b1 = (float)b1;
    job->b2 = (float)b2;
    job->omb1 = (float)(1.0 - b1);
    job->omb2 = (float)(1.0 - b2);
    job->eps = (float)hp.eps;
    job->decay = 1.0f;
    job->inv_sqrt_bc2 = 1.0f;
    switch (kind) {
    case ZO_OPTIM_ADAMW:
    case ZO_OPTIM_ADAM: {
        double bc1 = 1, bc2 = 1;
        if (hp.bias_correction) {
            bc1 = 1.0 - pow(b1, step);
            bc2 = 1.0 - pow(b2, step);
        }
        job->neg_step = (float)(-lr / bc1);
        job->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
        if (kind == ZO_OPTIM_ADAMW)
            job->decay = (float)(1.0 - lr * wd);
        else
            job->l2 = (float)wd;
        break;
    }
    case ZO_OPTIM_ADAGRAD:
        job->neg_step = (float)-lr;
        job->l2 = (float)wd;
        break;
    default: /* Lion */
        job->neg_step = (float)-lr;
        job->decay = (float)(1.0 - lr * wd);
        break;
    }
    if (!isfinite(job->neg_step))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: lr / (1 - beta1^step) overflows fp32", fn);
    /* lr and weight_decay each fit fp32, their product need not: a decay
     * of -inf would silently turn every parameter into inf/NaN */
    if (!isfinite(job->decay))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: %s 1 - lr * weight_decay = %g overflows fp32", fn, kind_name(kind),
                       1.0 - lr * wd);
    if (rollback && kind == ZO_OPTIM_ADAMW && !(job->decay > 0.0f))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: lr * weight_decay = %g >= 1: the decayed parameters cannot be recovered",
                       fn, lr * wd);
    return 0;
}

int zo__cpuadam_make_job(zo__optim_job *job, const struct zo_cpuadam_hparams *hp,
                         const struct zo_cpuadam_tensors *t, int for_rollback)
{
    return build_job(NULL, "cpuadam", job, hp, t, for_rollback);
}

/* ---- execution: threads, ranges, tiles ---------------------------------- */
typedef struct exec {
    const zo_cpuadam_dsp *dsp;
    int nthreads;
    size_t tile;
    zo_cpuadam_nt nt;
} exec;

/* Threads worth using for n elements. */
static int threads_for(size_t n, int nthreads)
{
    size_t useful = n / MIN_PER_THREAD;
    if (useful < 1)
        useful = 1;
    return useful < (size_t)nthreads ? (int)useful : nthreads;
}

/* Start of thread t's range among k: `align` aligned (a power of two),
 * ends at n. */
static size_t split_at(size_t n, int k, int t, size_t align)
{
    if (t >= k)
        return n;
    size_t b = (size_t)((unsigned __int128)n * (unsigned)t / (unsigned)k);
    return b & ~(align - 1);
}

/* OP_QSTEP's ranges count blocks, so each block is one thread's whole */
typedef enum { OP_STEP, OP_ROLLBACK, OP_STATS, OP_BOUND, OP_QSTEP } op_kind;

typedef struct stats_slot {
    double sumsq;
    uint64_t nonfinite;
    char pad[48]; /* one cache line per thread: no false sharing */
} stats_slot;

typedef struct op {
    op_kind kind;
    const zo_cpuadam_dsp *dsp;
    size_t tile;
    const zo__optim_job *job;
    const zo__qjob *qjob;
    /* stats */
    const void *g;
    int gdt;
    stats_slot *slots;
    /* bound */
    float *a, *b, *c;
    const float *d;
    float alpha;
} op;

static void run_range(const op *o, size_t b, size_t e, int tid)
{
    if (o->kind == OP_STATS) {
        o->dsp->grad_stats(o->g, o->gdt, b, e, &o->slots[tid].sumsq, &o->slots[tid].nonfinite);
        return;
    }
    if (o->kind == OP_QSTEP) { /* [b, e) are blocks; each is its own tile */
        zo__cpuadam_qstep_blocks(o->dsp, o->qjob, b, e);
        return;
    }
    for (size_t i = b; i < e; i += o->tile) {
        size_t te = e - i > o->tile ? i + o->tile : e;
        switch (o->kind) {
        case OP_STEP: o->dsp->step(o->job, i, te); break;
        case OP_ROLLBACK: o->dsp->rollback(o->job, i, te); break;
        default: o->dsp->stream_bound(o->a, o->b, o->c, o->d, o->alpha, i, te); break;
        }
    }
}

/* Run o over [0, n) with up to nthreads threads; returns the team size.
 * Quantized steps split their blocks (n counts blocks, elems elements). */
static int run_parallel_units(const op *o, size_t n, size_t elems, int nthreads)
{
    int nth = threads_for(elems, nthreads);
    size_t align = o->kind == OP_QSTEP ? 1 : SPLIT_ALIGN;
#if ZO_HAVE_OPENMP
    if (nth > 1) {
        int used = 1;
#pragma omp parallel num_threads(nth)
        {
            int k = omp_get_num_threads(), t = omp_get_thread_num();
            if (t == 0)
                used = k;
            run_range(o, split_at(n, k, t, align), split_at(n, k, t + 1, align), t);
        }
        return used;
    }
#endif
    run_range(o, 0, n, 0);
    return 1;
}

static int run_parallel(const op *o, size_t n, int nthreads)
{
    return run_parallel_units(o, n, n, nthreads);
}

static int exec_step(zo_errbuf *eb, const exec *x, const zo_cpuadam_hparams *hp,
                     const zo_cpuadam_tensors *t, int rollback)
{
    const char *fn = rollback ? "zo_cpuadam_rollback" : "zo_cpuadam_step";
    zo__optim_job job;
    ZO_CHECK(build_job(eb, fn, &job, hp, t, rollback));
    if (job.out && x->nt != ZO_CPUADAM_NT_OFF)
        job.nt_out = x->nt == ZO_CPUADAM_NT_ON ||
                     t->n * zo_dtype_size(t->out_dtype) >= NT_MIN_OUT_BYTES;
    op o = {.kind = rollback ? OP_ROLLBACK : OP_STEP, .dsp = x->dsp, .tile = x->tile, .job = &job};
    run_parallel(&o, t->n, x->nthreads);
    return 0;
}

static int exec_stats(zo_errbuf *eb, const exec *x, const void *grad, zo_dtype type, size_t n,
                      zo_grad_stats *out)
{
    const char *fn = "zo_cpuadam_grad_stats";
    if (!out)
        return ZO_FAIL(eb, -EINVAL, "%s: out is NULL", fn);
    int gdt = dtype_code(type);
    if (gdt < 0)
        return ZO_FAIL(eb, ZO_ENOTSUP, "%s: dtype %s not supported (f32, f16, bf16)", fn, zo_dtype_name(type));
    if (n == 0)
        return ZO_FAIL(eb, -EINVAL, "%s: n = 0", fn);
    if (!grad)
        return ZO_FAIL(eb, -EINVAL, "%s: grad is NULL", fn);
    /* the same bounds as the step functions (an absurd n used to be walked) */
    if (n > SIZE_MAX / 8)
        return ZO_FAIL(eb, -EINVAL, "%s: n = %zu too large", fn, n);
    span s = {"grad", grad, n * zo_dtype_size(type)};
    ZO_CHECK(check_buffers(eb, fn, &s, 1));
    ZO_CHECK(check_align(eb, fn, "grad", grad, zo_dtype_size(type)));
    int nth = threads_for(n, x->nthreads);
    stats_slot local[8], *slots = local;
    if (nth > (int)ZO_ARRAY_LEN(local)) {
        slots = aligned_alloc(64, sizeof(stats_slot) * (size_t)nth);
        if (!slots)
            return ZO_FAIL(eb, -ENOMEM, "%s: no memory for %d partial sums", fn, nth);
    }
    op o = {.kind = OP_STATS, .dsp = x->dsp, .g = grad, .gdt = gdt, .slots = slots};
    int used = run_parallel(&o, n, nth);
    /* partial results combine in thread order: deterministic */
    out->sumsq = 0;
    out->nonfinite = 0;
    for (int k = 0; k < used; k++) {
        out->sumsq += slots[k].sumsq;
        out->nonfinite += slots[k].nonfinite;
    }
    if (slots != local)
        free(slots);
    return 0;
}

static int exec_bound(zo_errbuf *eb, const exec *x, float *a, float *b, float *c, const float *d,
                      float alpha, size_t n)
{
    const char *fn = "zo_cpuadam_stream_bound";
    if (n == 0)
        return ZO_FAIL(eb, -EINVAL, "%s: n = 0", fn);
    if (n > SIZE_MAX / 8)
        return ZO_FAIL(eb, -EINVAL, "%s: n = %zu too large", fn, n);
    span s[4] = {{"a", a, n * 4}, {"b", b, n * 4}, {"c", c, n * 4}, {"d", d, n * 4}};
    ZO_CHECK(check_buffers(eb, fn, s, 4));
    for (int k = 0; k < 4; k++)
        ZO_CHECK(check_align(eb, fn, s[k].name, s[k].p, 4));
    op o = {.kind = OP_BOUND, .dsp = x->dsp, .tile = x->tile, .a = a, .b = b, .c = c, .d = d, .alpha = alpha};
    run_parallel(&o, n, x->nthreads);
    return 0;
}

/* ---- quantized states --------------------------------------------------- */
ZO_API int zo_cpuadam_qtensors_default(zo_cpuadam_qtensors *t)
{
    if (!t)
        return ZO_FAIL(NULL, -EINVAL, "zo_cpuadam_qtensors_default: t is NULL");
    memset(t, 0, sizeof(*t));
    t->struct_size = sizeof(*t);
    t->grad_dtype = ZO_DTYPE_F32;
    t->bits = 8;
    t->map_m = ZO_QMAP_DYNAMIC_SIGNED;
    t->map_v = ZO_QMAP_DYNAMIC_UNSIGNED;
    t->out_dtype = ZO_DTYPE_BF16;
    return 0;
}

/* bits, block (0 -> default for bits) and map checked; *blk gets the block. */
static int check_qlayout(zo_errbuf *eb, const char *fn, int bits, size_t block, size_t *blk)
{
    if (bits != 8 && bits != 4)
        return ZO_FAIL(eb, -EINVAL, "%s: bits %d must be 8 or 4", fn, bits);
    if (block == 0)
        block = bits == 8 ? 256 : 128;
    /* multiples of 64: thread ranges of whole blocks stay cache-line aligned */
    if (block % 64 || block > ZO_QBLOCK_MAX)
        return ZO_FAIL(eb, -EINVAL, "%s: block %zu must be a multiple of 64 in [64, %d]", fn, block,
                       ZO_QBLOCK_MAX);
    *blk = block;
    return 0;
}

static const zo__qmap_tab *qmap_for(zo_errbuf *eb, const char *fn, const char *what, zo_qmap map, int bits,
                                    int need_unsigned, int *err)
{
    const zo__qmap_tab *t = zo__qmap_get((int)map, bits);
    *err = 0;
    if (!t) {
        *err = (unsigned)map >= ZO_QMAP_COUNT
                   ? ZO_FAIL(eb, -EINVAL, "%s: %s %d is not a zo_qmap", fn, what, (int)map)
                   : ZO_FAIL(eb, ZO_EINTERNAL, "%s: building the %d-bit code maps failed", fn, bits);
        return NULL;
    }
    if (need_unsigned && (map == ZO_QMAP_DYNAMIC_SIGNED || map == ZO_QMAP_LINEAR_SIGNED)) {
        *err = ZO_FAIL(eb, -EINVAL, "%s: %s must be an unsigned map (v is never negative)", fn, what);
        return NULL;
    }
    return t;
}

static int build_qjob(zo_errbuf *eb, const char *fn, zo__qjob *q, const zo_cpuadam_hparams *hp_in,
                      const zo_cpuadam_qtensors *t_in)
{
    zo_cpuadam_hparams hp;
    ZO_CHECK(read_hparams(eb, fn, hp_in, &hp));
    ZO_CHECK(check_hparams(eb, fn, &hp));
    if (!t_in)
        return ZO_FAIL(eb, -EINVAL, "%s: tensors is NULL", fn);
    zo_cpuadam_qtensors tv;
    zo_cpuadam_qtensors_default(&tv);
    ZO_CHECK(ZO_STRUCT_IN(&tv, t_in, sizeof(tv), eb, fn));
    const zo_cpuadam_qtensors *t = &tv;
    size_t n = t->n, block = 0;
    if (n == 0)
        return ZO_FAIL(eb, -EINVAL, "%s: n = 0 (an empty slice is a caller bug)", fn);
    if (n > SIZE_MAX / 8)
        return ZO_FAIL(eb, -EINVAL, "%s: n = %zu too large", fn, n);
    int kind = hp.kind;
    if (kind == ZO_OPTIM_ADAGRAD)
        return ZO_FAIL(eb, ZO_ENOTSUP, "%s: quantized states exist for adam, adamw and lion, not adagrad", fn);
    ZO_CHECK(check_qlayout(eb, fn, t->bits, t->block, &block));
    int gdt = dtype_code(t->grad_dtype), odt = t->param_out ? dtype_code(t->out_dtype) : ZO__T_F32;
    if (gdt < 0)
        return ZO_FAIL(eb, ZO_ENOTSUP, "%s: grad dtype %s not supported (f32, f16, bf16)", fn,
                       zo_dtype_name(t->grad_dtype));
    if (odt < 0)
        return ZO_FAIL(eb, ZO_ENOTSUP, "%s: out dtype %s not supported (bf16, f16, f32)", fn,
                       zo_dtype_name(t->out_dtype));
    int err = 0, need_v = kind != ZO_OPTIM_LION;
    const zo__qmap_tab *mm = qmap_for(eb, fn, "map_m", t->map_m, t->bits, 0, &err);
    if (!mm)
        return err;
    const zo__qmap_tab *vm = NULL;
    if (need_v && !(vm = qmap_for(eb, fn, "map_v", t->map_v, t->bits, 1, &err)))
        return err;
    size_t nb = (n - 1) / block + 1, cbytes = t->bits == 8 ? n : (n + 1) / 2;
    size_t gsz = zo_dtype_size(t->grad_dtype), osz = zo_dtype_size(t->param_out ? t->out_dtype : ZO_DTYPE_F32);
    span s[7];
    int ns = 0;
    s[ns++] = (span){"param", t->param, n * 4};
    s[ns++] = (span){"grad", t->grad, n * gsz};
    s[ns++] = (span){"m_codes", t->m_codes, cbytes};
    s[ns++] = (span){"m_absmax", t->m_absmax, nb * 4};
    if (need_v) {
        s[ns++] = (span){"v_codes", t->v_codes, cbytes};
        s[ns++] = (span){"v_absmax", t->v_absmax, nb * 4};
    }
    if (t->param_out)
        s[ns++] = (span){"param_out", t->param_out, n * osz};
    ZO_CHECK(check_buffers(eb, fn, s, ns));
    ZO_CHECK(check_align(eb, fn, "param", t->param, 4));
    ZO_CHECK(check_align(eb, fn, "grad", t->grad, gsz));
    ZO_CHECK(check_align(eb, fn, "m_absmax", t->m_absmax, 4));
    if (need_v)
        ZO_CHECK(check_align(eb, fn, "v_absmax", t->v_absmax, 4));
    if (t->param_out)
        ZO_CHECK(check_align(eb, fn, "param_out", t->param_out, osz));

    memset(q, 0, sizeof(*q));
    zo__optim_job *job = &q->job;
    job->kind = kind;
    job->gdt = gdt;
    job->sdt = ZO__T_F32; /* the kernels see fp32 moments in block buffers */
    job->odt = odt;
    job->p = t->param;
    job->g = t->grad;
    job->out = t->param_out;
    q->n = n;
    q->block = block;
    q->bits = t->bits;
    q->mc = t->m_codes;
    q->ms = t->m_absmax;
    q->mmap = mm;
    if (need_v) {
        q->vc = t->v_codes;
        q->vs = t->v_absmax;
        q->vmap = vm;
    }
    return job_scalars(eb, fn, job, &hp, 0);
}

static int exec_qstep(zo_errbuf *eb, const exec *x, const zo_cpuadam_hparams *hp, const zo_cpuadam_qtensors *t)
{
    zo__qjob q;
    ZO_CHECK(build_qjob(eb, "zo_cpuadam_qstep", &q, hp, t));
    if (q.job.out && x->nt != ZO_CPUADAM_NT_OFF)
        q.job.nt_out = x->nt == ZO_CPUADAM_NT_ON || t->n * zo_dtype_size(t->out_dtype) >= NT_MIN_OUT_BYTES;
    op o = {.kind = OP_QSTEP, .dsp = x->dsp, .qjob = &q};
    run_parallel_units(&o, (q.n - 1) / q.block + 1, q.n, x->nthreads);
    return 0;
}

/* zo_cpuadam_quantize/dequantize: one loop over the blocks with the C
 * reference block kernels (x and codes are the fp32 and code sides). */
static int qconvert(const char *fn, int to_codes, float *x, size_t n, zo_qmap map, int bits, size_t block,
                    uint8_t *codes, float *absmax)
{
    int err = 0;
    if (!x || !codes || !absmax || n == 0)
        return ZO_FAIL(NULL, -EINVAL, "%s: %s", fn, n ? "NULL buffer" : "n = 0");
    if (block == 0)
        return ZO_FAIL(NULL, -EINVAL, "%s: block 0 (pass the block size the states use)", fn);
    ZO_CHECK(check_qlayout(NULL, fn, bits, block, &block));
    const zo__qmap_tab *t = qmap_for(NULL, fn, "map", map, bits, 0, &err);
    if (!t)
        return err;
    for (size_t i0 = 0; i0 < n; i0 += block) {
        size_t len = n - i0 < block ? n - i0 : block;
        uint8_t *c = codes + (bits == 8 ? i0 : i0 / 2);
        if (to_codes)
            zo__q_quant_ref(x + i0, len, t, bits, c, &absmax[i0 / block]);
        else
            zo__q_dequant_ref(c, bits, t, absmax[i0 / block], x + i0, len);
    }
    return 0;
}

ZO_API int zo_cpuadam_quantize(const float *x, size_t n, zo_qmap map, int bits, size_t block,
                               uint8_t *codes, float *absmax)
{
    /* x is only read on this side */
    return qconvert("zo_cpuadam_quantize", 1, (float *)(uintptr_t)x, n, map, bits, block, codes, absmax);
}

ZO_API int zo_cpuadam_dequantize(const uint8_t *codes, const float *absmax, size_t n, zo_qmap map,
                                 int bits, size_t block, float *x)
{
    /* codes and absmax are only read on this side */
    return qconvert("zo_cpuadam_dequantize", 0, x, n, map, bits, block, (uint8_t *)(uintptr_t)codes,
                    (float *)(uintptr_t)absmax);
}

ZO_API int zo_cpuadam_qmap_values(zo_qmap map, int bits, float *values)
{
    int err = 0;
    if (bits != 8 && bits != 4)
        return ZO_FAIL(NULL, -EINVAL, "zo_cpuadam_qmap_values: bits %d must be 8 or 4", bits);
    const zo__qmap_tab *t = qmap_for(NULL, "zo_cpuadam_qmap_values", "map", map, bits, 0, &err);
    if (!t)
        return err;
    int count = 1 << bits;
    if (values)
        memcpy(values, t->value, (size_t)count * sizeof(float));
    return count;
}

static int plain_exec(zo_errbuf *eb, const char *fn, int nthreads, exec *x)
{
    if (nthreads < 1 || nthreads > MAX_THREADS)
        return ZO_FAIL(eb, -EINVAL, "%s: nthreads %d must be in [1, %d]", fn, nthreads, MAX_THREADS);
    x->dsp = zo__cpuadam_dsp();
    x->nthreads = nthreads;
    x->tile = DEFAULT_TILE;
    x->nt = ZO_CPUADAM_NT_AUTO;
    return 0;
}

ZO_API int zo_cpuadam_step(const zo_cpuadam_hparams *hp, const zo_cpuadam_tensors *t, int nthreads)
{
    exec x;
    ZO_CHECK(plain_exec(NULL, "zo_cpuadam_step", nthreads, &x));
    return exec_step(NULL, &x, hp, t, 0);
}

ZO_API int zo_cpuadam_rollback(const zo_cpuadam_hparams *hp, const zo_cpuadam_tensors *t, int nthreads)
{
    exec x;
    ZO_CHECK(plain_exec(NULL, "zo_cpuadam_rollback", nthreads, &x));
    return exec_step(NULL, &x, hp, t, 1);
}

ZO_API int zo_cpuadam_grad_stats(const void *grad, zo_dtype type, size_t n, int nthreads,
                                 zo_grad_stats *out)
{
    exec x;
    ZO_CHECK(plain_exec(NULL, "zo_cpuadam_grad_stats", nthreads, &x));
    return exec_stats(NULL, &x, grad, type, n, out);
}

ZO_API int zo_cpuadam_stream_bound(float *a, float *b, float *c, const float *d, float alpha,
                                   size_t n, int nthreads)
{
    exec x;
    ZO_CHECK(plain_exec(NULL, "zo_cpuadam_stream_bound", nthreads, &x));
    return exec_bound(NULL, &x, a, b, c, d, alpha, n);
}

ZO_API int zo_cpuadam_qstep(const zo_cpuadam_hparams *hp, const zo_cpuadam_qtensors *t, int nthreads)
{
    exec x;
    ZO_CHECK(plain_exec(NULL, "zo_cpuadam_qstep", nthreads, &x));
    return exec_qstep(NULL, &x, hp, t);
}

ZO_API const char *zo_cpuadam_variant(void)
{
    return zo__cpuadam_dsp()->name;
}

/* Every variant any build of the library can have: a name compiled only
 * for another architecture is known, and not available here. */
static const char *const all_variants[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};

ZO_API int zo_cpuadam_variant_available(const char *name)
{
    unsigned need = 0;
    if (name && zo__cpuadam_dsp_named(name, &need))
        return (zo_cpu_flags() & need) == need;
    for (size_t i = 0; name && i < ZO_ARRAY_LEN(all_variants); i++)
        if (!strcmp(name, all_variants[i]))
            return 0;
    return ZO_FAIL(NULL, -EINVAL, "zo_cpuadam_variant_available: unknown variant '%s'",
                   name ? name : "(null)");
}

ZO_API const char *zo_cpuadam_variant_at(unsigned i, unsigned *needs)
{
    return zo__cpuadam_variant_at(i, needs);
}

/* ---- teams ------------------------------------------------------------------ */
struct zo_cpuadam_team {
    int nthreads;
    int pin;
    int node;
    const zo_cpuadam_dsp *dsp; /* NULL: follow zo_cpu_flags() */
    zo_cpuadam_nt nt;
    size_t tile;
    zo_topo *topo;
    uint64_t id;
    zo_errbuf eb;
};

static atomic_uint_fast64_t team_ids = 1;
/* The team whose pinning this thread's OpenMP pool has now. */
static _Thread_local uint64_t tls_pinned_team;

ZO_API int zo_cpuadam_team_config_default(zo_cpuadam_team_config *cfg)
{
    if (!cfg)
        return ZO_FAIL(NULL, -EINVAL, "zo_cpuadam_team_config_default: cfg is NULL");
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        nc = CPU_COUNT(&set);
    cfg->nthreads = nc > 0 ? (int)ZO_MIN(nc, MAX_THREADS) : 1;
    cfg->numa_node = -1;
    cfg->nt_stores = ZO_CPUADAM_NT_AUTO;
    cfg->tile_elems = DEFAULT_TILE;
    return 0;
}

ZO_API int zo_cpuadam_team_create(zo_cpuadam_team **out, const zo_cpuadam_team_config *cfg_in)
{
    const char *fn = "zo_cpuadam_team_create";
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    zo_cpuadam_team_config cfg;
    zo_cpuadam_team_config_default(&cfg);
    if (cfg_in)
        ZO_CHECK(ZO_STRUCT_IN(&cfg, cfg_in, offsetof(zo_cpuadam_team_config, variant), NULL, fn));
    if (cfg.nthreads < 1 || cfg.nthreads > MAX_THREADS)
        return ZO_FAIL(NULL, -EINVAL, "%s: nthreads %d must be in [1, %d]", fn, cfg.nthreads, MAX_THREADS);
    if (cfg.tile_elems < 1024 || cfg.tile_elems % 64)
        return ZO_FAIL(NULL, -EINVAL, "%s: tile_elems %zu must be a multiple of 64, >= 1024", fn, cfg.tile_elems);
    if ((unsigned)cfg.nt_stores > ZO_CPUADAM_NT_OFF)
        return ZO_FAIL(NULL, ZO_ECONFIG, "%s: nt_stores %d unknown", fn, (int)cfg.nt_stores);
    const zo_cpuadam_dsp *dsp = NULL;
    if (cfg.variant && strcmp(cfg.variant, "auto") != 0) {
        unsigned need = 0;
        dsp = zo__cpuadam_dsp_named(cfg.variant, &need);
        if (!dsp) {
            int foreign = 0;
            for (size_t i = 0; i < ZO_ARRAY_LEN(all_variants); i++)
                foreign |= !strcmp(cfg.variant, all_variants[i]);
            if (foreign)
                return ZO_FAIL(NULL, ZO_ENOTSUP, "%s: variant '%s' is not built for this architecture",
                               fn, cfg.variant);
            return ZO_FAIL(NULL, ZO_ECONFIG, "%s: unknown variant '%s' (auto, scalar, avx2, avx512, avx512bf16, neon)",
                           fn, cfg.variant);
        }
        if ((zo_cpu_flags() & need) != need)
            return ZO_FAIL(NULL, ZO_ENOTSUP, "%s: variant '%s' needs CPU features this CPU (or ZO_CPU_MASK) lacks",
                           fn, cfg.variant);
    }
    zo_topo *topo = NULL;
    if (cfg.pin) {
#if !ZO_HAVE_OPENMP
        return ZO_FAIL(NULL, ZO_ENOTSUP, "%s: pinning needs OpenMP, and this build has none", fn);
#else
        ZO_CHECK(zo_topo_create(&topo));
        if (cfg.numa_node != -1) {
            int ids[1];
            if (zo_topo_node_cpus(topo, cfg.numa_node, ids, 1) <= 0) {
                zo_topo_destroy(&topo);
                return ZO_FAIL(NULL, ZO_ECONFIG, "%s: NUMA node %d has no CPUs this process may use", fn,
                               cfg.numa_node);
            }
        }
#endif
    }
    zo_cpuadam_team *tm = calloc(1, sizeof(*tm));
    if (!tm) {
        zo_topo_destroy(&topo);
        return ZO_FAIL(NULL, -ENOMEM, "%s: no memory", fn);
    }
    tm->nthreads = cfg.nthreads;
    tm->pin = !!cfg.pin;
    tm->node = cfg.numa_node;
    tm->dsp = dsp;
    tm->nt = cfg.nt_stores;
    tm->tile = cfg.tile_elems;
    tm->topo = topo;
    tm->id = atomic_fetch_add(&team_ids, 1);
    *out = tm;
    return 0;
}

ZO_API void zo_cpuadam_team_destroy(zo_cpuadam_team **team)
{
    if (!team || !*team)
        return;
    zo_topo_destroy(&(*team)->topo);
    free(*team);
    *team = NULL;
}

static int team_exec(zo_cpuadam_team *tm, const char *fn, exec *x)
{
    if (!tm)
        return ZO_FAIL(NULL, -EINVAL, "%s: team is NULL", fn);
    if (tm->pin && tls_pinned_team != tm->id) {
        int r = zo_topo_bind_omp(tm->topo, tm->node, tm->nthreads);
        if (r < 0)
            return ZO_FAIL(&tm->eb, r, "%s: pinning the OpenMP team: %s", fn, zo_strerror(r));
        tls_pinned_team = tm->id;
    }
    x->dsp = tm->dsp ? tm->dsp : zo__cpuadam_dsp();
    x->nthreads = tm->nthreads;
    x->tile = tm->tile;
    x->nt = tm->nt;
    return 0;
}

ZO_API int zo_cpuadam_team_step(zo_cpuadam_team *team, const zo_cpuadam_hparams *hp,
                                const zo_cpuadam_tensors *t)
{
    exec x;
    ZO_CHECK(team_exec(team, "zo_cpuadam_team_step", &x));
    return exec_step(&team->eb, &x, hp, t, 0);
}

ZO_API int zo_cpuadam_team_rollback(zo_cpuadam_team *team, const zo_cpuadam_hparams *hp,
                                    const zo_cpuadam_tensors *t)
{
    exec x;
    ZO_CHECK(team_exec(team, "zo_cpuadam_team_rollback", &x));
    return exec_step(&team->eb, &x, hp, t, 1);
}

ZO_API int zo_cpuadam_team_qstep(zo_cpuadam_team *team, const zo_cpuadam_hparams *hp,
                                 const zo_cpuadam_qtensors *t)
{
    exec x;
    ZO_CHECK(team_exec(team, "zo_cpuadam_team_qstep", &x));
    return exec_qstep(&team->eb, &x, hp, t);
}

ZO_API int zo_cpuadam_team_grad_stats(zo_cpuadam_team *team, const void *grad, zo_dtype type,
                                      size_t n, zo_grad_stats *out)
{
    exec x;
    ZO_CHECK(team_exec(team, "zo_cpuadam_team_grad_stats", &x));
    return exec_stats(&team->eb, &x, grad, type, n, out);
}

ZO_API int zo_cpuadam_team_stream_bound(zo_cpuadam_team *team, float *a, float *b, float *c,
                                        const float *d, float alpha, size_t n)
{
    exec x;
    ZO_CHECK(team_exec(team, "zo_cpuadam_team_stream_bound", &x));
    return exec_bound(&team->eb, &x, a, b, c, d, alpha, n);
}

ZO_API const char *zo_cpuadam_team_variant(const zo_cpuadam_team *team)
{
    if (!team)
        return "?";
    return team->dsp ? team->dsp->name : zo__cpuadam_dsp()->name;
}

ZO_API int zo_cpuadam_team_threads(const zo_cpuadam_team *team)
{
    return team ? team->nthreads : -EINVAL;
}

ZO_API const char *zo_cpuadam_team_errmsg(const zo_cpuadam_team *team)
{
    static _Thread_local char copy[ZO_ERRMSG_LEN];
    return zo__errbuf_tls(team ? &team->eb : NULL, copy);
}
