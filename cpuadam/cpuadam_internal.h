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
    int nt_defer_fence; /* with nt_out: no store fence at the end: a later call on this thread fences */
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

/*
 * A code map prepared for the kernels (cpuadam/qstate_ref.c builds them
 * once). code(x) = #{k : x > mid[k]} is found without a search: the fp32
 * bits of x, sign and exponent and the top `mbits` mantissa bits, pick a
 * bucket of |x| in [2^-24, 2) (smaller magnitudes clamp to the first
 * bucket); the builder checks that no bucket holds more than one
 * midpoint, so code(x) = base + (x > mid[base]) with base = bucket[key]
 * (mid[ncodes-1] and above are +inf). Every variant computes exactly this.
 */
#define ZO__QBLOCK_MAX 4096 /* ZO_QBLOCK_MAX of the public header */
#define ZO__QB_EXPS 25 /* exponents 2^-24 .. 2^0 */
#define ZO__QB_EBIAS (127 - 24)
#define ZO__QB_MAXM 8 /* most mantissa bits a bucket key may use */
typedef struct zo__qmap_tab {
    int bits;          /* 8 or 4 */
    int ncodes;        /* codes the quantizer produces */
    unsigned shift;    /* 23 - mbits: |x| bits >> shift = exponent:mantissa key */
    int32_t kbias;     /* ZO__QB_EBIAS << mbits */
    int32_t nmag;      /* ZO__QB_EXPS << mbits buckets per sign */
    _Alignas(64) float value[256]; /* code -> value; unused codes read as the largest */
    _Alignas(64) float mid[256];   /* mid[k] = fp32((value[k] + value[k+1]) / 2); +inf from ncodes-1 on */
    /* [sign][magnitude bucket] -> base code; 4 bytes of padding so a 32-bit
     * gather of the last entry stays inside */
    _Alignas(64) uint8_t bucket[2 * (ZO__QB_EXPS << ZO__QB_MAXM) + 4];
    /* The same buckets packed for one lookup instead of two (the AVX2
     * kernels: on Zen 3 each 8-lane gather costs about as much as the rest
     * of the quantizer). Entry = base | thr << 8: inside a bucket x's sign,
     * exponent and top mantissa bits are fixed, so x > mid[base] depends
     * only on its low `shift` bits, low(x) = (bits ^ (x < 0 ? ~0 : 0)) &
     * lowmask (flipped for negatives, where a larger magnitude is a smaller
     * x): x > mid[base] is low(x) > thr. thr = lowmask where no midpoint
     * lies in the bucket. The builder refuses maps whose clamped bucket
     * (|x| < 2^-24 and up) holds a midpoint, and checks this against
     * zo__qcode(). */
    uint32_t lowmask;
    _Alignas(64) uint32_t pbucket[2 * (ZO__QB_EXPS << ZO__QB_MAXM)];
} zo__qmap_tab;

/* The prepared map (zo_qmap value, 8 or 4 bits), or NULL. */
const zo__qmap_tab *zo__qmap_get(int map, int bits);

/* The bucket of x's bits b: [sign][clamped exponent:top mantissa bits]. */
static inline int32_t zo__qkey(const zo__qmap_tab *t, uint32_t b)
{
    int32_t k = (int32_t)((b & 0x7fffffffu) >> t->shift) - t->kbias;
    k = k < 0 ? 0 : k >= t->nmag ? t->nmag - 1 : k;
    return k + (int32_t)(b >> 31) * t->nmag;
}

/* The code of x (already divided by its block's absmax): the definition
 * every variant follows. */
static inline unsigned zo__qcode(const zo__qmap_tab *t, float x)
{
    uint32_t b;
    __builtin_memcpy(&b, &x, 4);
    unsigned base = t->bucket[zo__qkey(t, b)];
    return base + (x > t->mid[base]);
}

/* zo__qcode() through the packed buckets: the same code for every x with
 * |x| < 2 (the builder checks it at every midpoint and its neighbours; an
 * exhaustive run over every fp32 |x| <= 1 of the eight maps before the
 * zero-free ones found no difference; those have the builder's check and
 * test_qadam's). */
static inline unsigned zo__qcode_packed(const zo__qmap_tab *t, float x)
{
    uint32_t b;
    __builtin_memcpy(&b, &x, 4);
    uint32_t e = t->pbucket[zo__qkey(t, b)], low = (b ^ (uint32_t)((int32_t)b >> 31)) & t->lowmask;
    return (e & 0xffu) + (low > (e >> 8));
}

/* A step on quantized moments: the fp32 job's scalars and streams, and per
 * moment its codes, scales and map. */
typedef struct zo__qjob {
    zo__optim_job job; /* m, v, sdt unused */
    size_t n, block;
    int bits;
    uint8_t *mc, *vc;
    float *ms, *vs;
    const zo__qmap_tab *mmap, *vmap;
} zo__qjob;

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
    /* Block kernels of the quantized step (one block of len <= ZO_QBLOCK_MAX
     * elements; codes point at the block's first byte):
     * x[i] = map->value[code i] * absmax; */
    void (*qdequant)(const uint8_t *codes, int bits, const zo__qmap_tab *map, float absmax, float *x,
                     size_t len);
    /* *absmax = max |x[i]| and codes of x[i] / *absmax (the rules of
     * zo_cpuadam_qstep(): non-finite -> NaN scale, zero -> 0, codes of 0). */
    void (*qquant)(const float *x, size_t len, const zo__qmap_tab *map, int bits, uint8_t *codes,
                   float *absmax);
} zo_cpuadam_dsp;

/* The C reference block kernels (cpuadam/qstate_ref.c). */
void zo__q_dequant_ref(const uint8_t *codes, int bits, const zo__qmap_tab *map, float absmax, float *x,
                       size_t len);
void zo__q_quant_ref(const float *x, size_t len, const zo__qmap_tab *map, int bits, uint8_t *codes,
                     float *absmax);

/* The quantized step over blocks [bbegin, bend) with table d's kernels
 * (baseline code: it only calls through the table). */
void zo__cpuadam_qstep_blocks(const zo_cpuadam_dsp *d, const zo__qjob *q, size_t bbegin, size_t bend);

/* Shared pieces of the block quantizer, used by every variant's qquant:
 * the block's scale from the largest |x| bits (NaN for inf/NaN, 0 for
 * zeros): returns 1 when codes must be computed, 0 when every code is the
 * map's zero code (then *zero_code gets it). */
static inline int zo__qscale(const zo__qmap_tab *t, uint32_t amax_bits, float *absmax, unsigned *zero_code)
{
    if (amax_bits != 0 && amax_bits < 0x7f800000u) {
        __builtin_memcpy(absmax, &amax_bits, 4);
        return 1;
    }
    uint32_t nan = 0x7fc00000u;
    if (amax_bits)
        __builtin_memcpy(absmax, &nan, 4);
    else
        *absmax = 0.0f;
    *zero_code = zo__qcode(t, 0.0f);
    return 0;
}

/* The scalar pieces every variant's block kernels end with (their tails):
 * the largest |x| bits over x[i..len) (NaN > inf > every finite value),
 * the codes of x[i..len) / s (zo__qquot), and map values times s. */
static inline uint32_t zo__qamax(const float *x, size_t i, size_t len, uint32_t amax)
{
    for (; i < len; i++) {
        uint32_t a;
        __builtin_memcpy(&a, &x[i], 4);
        a &= 0x7fffffffu;
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* The quotient every variant quantizes, x "divided" by the block's absmax:
 * x times fl(1 / absmax), one multiply per element instead of one division
 * (the divisions were about a third of the quantizer's time: 10% of the q8
 * step on Emerald Rapids, docs/cpuadam.md). Where 1 / absmax would not be
 * a normal number (absmax below 2^-126 or from 2^125 up: flushed or
 * imprecise) it is the plain division x / absmax. Either way every variant
 * rounds the same operations, so the codes stay bit-identical; the product
 * may exceed 1 by an ulp, which the buckets take as 1 (|x| < 2). */
typedef struct zo__qdiv {
    float s;   /* 1 / absmax (recip) or absmax */
    int recip;
} zo__qdiv;

static inline zo__qdiv zo__qdiv_of(float absmax)
{
    uint32_t b;
    __builtin_memcpy(&b, &absmax, 4);
    uint32_t e = (b >> 23) & 0xffu;
    zo__qdiv d;
    d.recip = e >= 1 && e <= 251;
    d.s = d.recip ? 1.0f / absmax : absmax;
    return d;
}

static inline float zo__qquot(zo__qdiv d, float x)
{
    return d.recip ? x * d.s : x / d.s;
}

static inline void zo__qcodes(const zo__qmap_tab *t, const float *x, size_t i, size_t len, zo__qdiv d, uint8_t *c)
{
    for (; i < len; i++)
        c[i] = (uint8_t)zo__qcode(t, zo__qquot(d, x[i]));
}

static inline void zo__qvalues(const zo__qmap_tab *t, const uint8_t *c, size_t i, size_t len, float s, float *x)
{
    for (; i < len; i++)
        x[i] = t->value[c[i]] * s;
}

/* Store per-element codes c[0..len) in the layout of `bits`. */
static inline void zo__qpack(const uint8_t *c, size_t len, int bits, uint8_t *codes)
{
    if (bits == 8) {
        __builtin_memcpy(codes, c, len);
        return;
    }
    size_t i = 0;
    for (; i + 1 < len; i += 2)
        codes[i / 2] = (uint8_t)(c[i] | c[i + 1] << 4);
    if (i < len)
        codes[i / 2] = c[i];
}

/* Per-element codes of a block (8 bits: the codes themselves). */
static inline const uint8_t *zo__qunpack(const uint8_t *codes, size_t len, int bits, uint8_t *buf)
{
    if (bits == 8)
        return codes;
    for (size_t i = 0; i < len; i++)
        buf[i] = (codes[i / 2] >> (4 * (i & 1))) & 15;
    return buf;
}

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
