/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpuadam internals: the job a kernel receives, the DSP table (one per
 * variant), and the scalar element formulas every variant follows.
 * Not installed.
 */
#ifndef ZO_CPUADAM_INTERNAL_H
#define ZO_CPUADAM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Element types use the zo_dtype values: F32 = 0, F16 = 1, BF16 = 2. */
enum { ZO__T_F32 = 0, ZO__T_F16 = 1, ZO__T_BF16 = 2 };

/* Which update a step kernel applies. */
enum { ZO__K_ADAMW = 0, ZO__K_ADAM = 1, ZO__K_ADAGRAD = 2, ZO__K_LION = 3 };

/*
 * Everything one kernel call needs, with the per-step scalars computed once
 * in double by the API layer and rounded to float. Kernels work on the
 * element range [begin, end) of these arrays.
 */
typedef struct zo__optim_job {
    int kind;          /* ZO__K_* */
    int gdt;           /* grad type ZO__T_* */
    int sdt;           /* state type: ZO__T_F32 or ZO__T_BF16 */
    int odt;           /* out type ZO__T_*; ignored when out == NULL */
    int nt_out;        /* non-temporal stores for out */
    float *p;
    const void *g;
    void *m;
    void *v;
    void *out;
    float gscale;       /* grad_scale * clip_coef */
    float b1, omb1;     /* beta1, 1 - beta1 */
    float b2, omb2;     /* beta2, 1 - beta2 */
    float eps;
    float decay;        /* 1 - lr*wd for AdamW and Lion, else 1 */
    float l2;           /* wd for Adam (L2) and Adagrad, else 0 */
    float neg_step;     /* -lr/(1-b1^t) (Adam/AdamW), -lr (Adagrad, Lion) */
    float inv_sqrt_bc2; /* 1/sqrt(1-b2^t), 1 without bias correction */
} zo__optim_job;

/* The DSP table. Every kernel handles any range (no alignment or length
 * requirements beyond natural element alignment). */
typedef struct zo_cpuadam_dsp {
    const char *name;
    /* Adam, AdamW, Adagrad or Lion over [begin, end), as job->kind says. */
    void (*step)(const zo__optim_job *job, size_t begin, size_t end);
    /* Undo one Adam/AdamW step (fp32 states) over [begin, end). */
    void (*rollback)(const zo__optim_job *job, size_t begin, size_t end);
    /* Sum of squares (double) and non-finite count of grad[begin, end). */
    void (*grad_stats)(const void *g, int gdt, size_t begin, size_t end, double *sumsq,
                       uint64_t *nonfinite);
    /* a,b,c[i] += alpha*d[i] over [begin, end). */
    void (*stream_bound)(float *a, float *b, float *c, const float *d, float alpha, size_t begin,
                         size_t end);
} zo_cpuadam_dsp;

/* Each ISA file gives one constant table of its kernels' addresses and no
 * code that runs before the CPU check (the dispatch rule, lib/core/vec_ref.h
 * and docs/architecture.md); kernels_ref.c builds the usable tables. A
 * NULL entry keeps the level below's kernel. */
#if defined(__x86_64__)
extern const zo_cpuadam_dsp zo__cpuadam_avx2;       /* x86/adam_avx2.c */
extern const zo_cpuadam_dsp zo__cpuadam_avx512;     /* x86/adam_avx512.c */
extern const zo_cpuadam_dsp zo__cpuadam_avx512bf16; /* x86/adam_avx512bf16.c */
#elif defined(__aarch64__)
extern const zo_cpuadam_dsp zo__cpuadam_neon; /* arm/adam_neon.c */
#endif

/* The table for explicit flags (ANDed with what the CPU has); never NULL. */
const zo_cpuadam_dsp *zo__cpuadam_dsp_for(unsigned flags);
/* The table for the current zo_cpu_flags(). */
const zo_cpuadam_dsp *zo__cpuadam_dsp(void);
/* The table of a named variant, or NULL if the name is unknown. Does not
 * check that the CPU can run it. *need gets the flags it needs. */
const zo_cpuadam_dsp *zo__cpuadam_dsp_named(const char *name, unsigned *need);
/* The i-th variant's name and needs (zo_cpuadam_variant_at()); NULL past the last. */
const char *zo__cpuadam_variant_at(unsigned i, unsigned *need);

/* Build a job from validated public arguments (cpuadam.c). Exposed for
 * the tests, which drive the DSP tables directly. Returns 0 or a negative
 * code with the detail recorded. */
struct zo_cpuadam_hparams;
struct zo_cpuadam_tensors;
int zo__cpuadam_make_job(zo__optim_job *job, const struct zo_cpuadam_hparams *hp,
                         const struct zo_cpuadam_tensors *t, int for_rollback);

#endif /* ZO_CPUADAM_INTERNAL_H */
