/* SPDX-License-Identifier: Apache-2.0 */
/* cpuadam: every variant against the C reference (checkasm style), the
 * reference against PyTorch (fixed vectors from torch 1.13) and against the
 * formulas in double, rollback, gradient statistics, threading, teams, and
 * bad input. */
#include <float.h>
#include <math.h>
#include <sched.h>

#include "zo_test.h"

#include "core/internal.h"
#include "core/vec_ref.h"
#include "cpuadam/cpuadam_internal.h"

#include <zoffload/zoffload.h>

#include "torch_vectors.h"

/* Every architecture's variants: those this CPU cannot run are skipped. */
static const unsigned variant_flags[] = {
    0,
    ZO_CPU_LEVEL_AVX2,
    ZO_CPU_LEVEL_AVX512,
    ZO_CPU_LEVEL_AVX512 | ZO_CPU_AVX512BF16,
    ZO_CPU_LEVEL_NEON,
};
#define NVARIANTS (sizeof(variant_flags) / sizeof(variant_flags[0]))

static int variant_runs(size_t v)
{
    return (zo_cpu_detected() & variant_flags[v]) == variant_flags[v];
}

/* ---- ulps ------------------------------------------------------------------- */
/* The spacing of fp32 numbers at magnitude s (subnormal spacing below). */
static double ulp32(double s)
{
    if (!(s >= 0x1p-126))
        return 0x1p-149;
    int e;
    frexp(s, &e);
    return ldexp(1.0, e - 24);
}

/* Distance in ulps between two finite floats (0 for +0 and -0). */
static uint64_t ulp_distance(float a, float b)
{
    int64_t x = (int32_t)zo__f32_bits(a), y = (int32_t)zo__f32_bits(b);
    if (x < 0)
        x = INT32_MIN - x;
    if (y < 0)
        y = INT32_MIN - y;
    return (uint64_t)(x > y ? x - y : y - x);
}

/* Same value: identical bits, or both NaN (NaN payloads may differ: C and
 * SIMD may pick a different operand's NaN), or within the stated bound
 * (which is 0: the variants are bit-identical to the reference). */
static int same_f32(float a, float b)
{
    if (zo__f32_bits(a) == zo__f32_bits(b) || (isnan(a) && isnan(b)))
        return 1;
    return ZO_CPUADAM_ULP_BOUND > 0 && isfinite(a) && isfinite(b) && ulp_distance(a, b) <= ZO_CPUADAM_ULP_BOUND;
}

static int same_16(uint16_t a, uint16_t b, int t)
{
    uint16_t e = t == ZO__T_F16 ? 0x7c00 : 0x7f80;
    int an = (a & e) == e && (a & ~e & 0x7fff), bn = (b & e) == e && (b & ~e & 0x7fff);
    return a == b || (an && bn);
}

/* ---- buffers with guard bytes on both sides ------------------------------ */
#define GUARD 64
#define CANARY 0xa5

typedef struct gbuf {
    unsigned char *raw;
    size_t bytes; /* usable bytes after the front guard */
} gbuf;

static void gbuf_init(gbuf *b, size_t bytes)
{
    b->bytes = bytes;
    b->raw = NULL;
    ck_assert_int_eq(posix_memalign((void **)&b->raw, 64, bytes + 2 * GUARD), 0);
    memset(b->raw, CANARY, bytes + 2 * GUARD);
}

static void *gbuf_at(const gbuf *b, size_t byte_off)
{
    return b->raw + GUARD + byte_off;
}

/* Every byte outside [off, off+len) of the usable area and both guards
 * still hold the canary. */
static void gbuf_check(const gbuf *b, size_t off, size_t len, const char *what)
{
    for (size_t i = 0; i < GUARD + off; i++)
        ZO_EXPECT(b->raw[i] == CANARY, "%s: byte %zd before the buffer written", what, (ssize_t)i - GUARD - (ssize_t)off);
    for (size_t i = GUARD + off + len; i < b->bytes + 2 * GUARD; i++)
        ZO_EXPECT(b->raw[i] == CANARY, "%s: byte %zu after the buffer written", what, i - GUARD - off - len);
}

static void gbuf_free(gbuf *b)
{
    free(b->raw);
    b->raw = NULL;
}

/* ---- values ------------------------------------------------------------------ */
static float rnd_sign(zo_test_rng *r, float x)
{
    return (zo_test_next(r) & 1) ? -x : x;
}

/* A mix of ordinary values, zeros, subnormals and huge values; with
 * `nonfinite`, a few inf and NaN too. `nonneg` for v. */
static float gen_value(zo_test_rng *r, int nonneg, int nonfinite, int huge)
{
    uint64_t k = zo_test_next(r) % 100;
    float x;
    if (k < 70)
        x = (float)(zo_test_uniform(r) * ldexp(1.0, (int)(zo_test_next(r) % 24) - 16));
    else if (k < 80)
        x = 0.0f;
    else if (k < 86)
        x = (float)(zo_test_uniform(r) * 0x1p-126); /* subnormal */
    else if (k < 92 && huge)
        x = (float)((0.5 + zo_test_uniform(r)) * ldexp(1.0, 90 + (int)(zo_test_next(r) % 37)));
    else if (k < 96 && nonfinite)
        x = (zo_test_next(r) & 1) ? INFINITY : NAN;
    else
        x = (float)(zo_test_uniform(r) * 1e-3);
    return nonneg ? fabsf(x) : rnd_sign(r, x);
}

static void store_elem(void *base, int t, size_t i, float x)
{
    switch (t) {
    case ZO__T_F16: ((uint16_t *)base)[i] = zo__ref_f32_to_f16(x); break;
    case ZO__T_BF16: ((uint16_t *)base)[i] = zo__ref_f32_to_bf16(x); break;
    default: ((float *)base)[i] = x; break;
    }
}

static float load_elem(const void *base, int t, size_t i)
{
    switch (t) {
    case ZO__T_F16: return zo__ref_f16_to_f32(((const uint16_t *)base)[i]);
    case ZO__T_BF16: return zo__ref_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static size_t tsz(int t)
{
    return t == ZO__T_F32 ? 4 : 2;
}

static void random_hparams(zo_test_rng *r, zo_cpuadam_hparams *hp, int kind)
{
    zo_cpuadam_hparams_default(hp, (zo_optim_kind)kind);
    hp->lr = ldexp(0.5 + zo_test_uniform(r), -(int)(zo_test_next(r) % 12) - 1);
    hp->weight_decay = (zo_test_next(r) % 3) ? zo_test_uniform(r) * 0.2 : 0.0;
    hp->eps = ldexp(1.0, -(int)(zo_test_next(r) % 30) - 5);
    hp->step = 1 + (int64_t)(zo_test_next(r) % 2000);
    hp->bias_correction = (int)(zo_test_next(r) % 4 != 0);
    hp->grad_scale = (zo_test_next(r) & 1) ? ldexp(1.0, -(int)(zo_test_next(r) % 17)) : 0.1 + zo_test_uniform(r);
    hp->clip_coef = (zo_test_next(r) & 1) ? 1.0 : 0.05 + 0.95 * zo_test_uniform(r);
    if (kind == ZO_OPTIM_LION) {
        hp->beta1 = 0.8 + 0.2 * zo_test_uniform(r);
        hp->beta2 = 0.9 + 0.1 * zo_test_uniform(r);
    } else if (kind != ZO_OPTIM_ADAGRAD) {
        hp->beta1 = (zo_test_next(r) % 8) ? 0.5 + 0.49 * zo_test_uniform(r) : 0.0;
        hp->beta2 = 0.9 + 0.0999 * zo_test_uniform(r);
    }
}

/* One slice: original inputs and two working sets (reference, variant). */
typedef struct slice {
    size_t n, off; /* elements; offset of element 0 from the 64-byte-aligned buffer */
    int kind, gdt, sdt, odt; /* odt < 0: no out copy */
    gbuf p[3], g, m[3], v[3], o[3]; /* [0] original, [1] reference, [2] variant */
} slice;

static void slice_init(slice *s, size_t n, size_t off, int kind, int gdt, int sdt, int odt)
{
    memset(s, 0, sizeof(*s));
    s->n = n, s->off = off, s->kind = kind, s->gdt = gdt, s->sdt = sdt, s->odt = odt;
    size_t cap = (n + off) * 4;
    gbuf_init(&s->g, cap);
    for (int k = 0; k < 3; k++) {
        gbuf_init(&s->p[k], cap);
        gbuf_init(&s->m[k], cap);
        gbuf_init(&s->v[k], cap);
        gbuf_init(&s->o[k], cap);
    }
}

static void slice_free(slice *s)
{
    gbuf_free(&s->g);
    for (int k = 0; k < 3; k++) {
        gbuf_free(&s->p[k]);
        gbuf_free(&s->m[k]);
        gbuf_free(&s->v[k]);
        gbuf_free(&s->o[k]);
    }
}

#define SP(s, k) ((float *)gbuf_at(&(s)->p[k], (s)->off * 4))
#define SG(s) gbuf_at(&(s)->g, (s)->off * tsz((s)->gdt))
#define SM(s, k) gbuf_at(&(s)->m[k], (s)->off * tsz((s)->sdt))
#define SV(s, k) gbuf_at(&(s)->v[k], (s)->off * tsz((s)->sdt))
#define SO(s, k) gbuf_at(&(s)->o[k], (s)->off * tsz((s)->odt))

static void slice_fill(slice *s, zo_test_rng *r, int special)
{
    for (size_t i = 0; i < s->n; i++) {
        SP(s, 0)[i] = gen_value(r, 0, 0, special);
        store_elem(SG(s), s->gdt, i, gen_value(r, 0, special, special));
        store_elem(SM(s, 0), s->sdt, i, gen_value(r, 0, 0, 0));
        store_elem(SV(s, 0), s->sdt, i, gen_value(r, 1, 0, special));
    }
    for (int k = 1; k < 3; k++) {
        memcpy(s->p[k].raw, s->p[0].raw, s->p[0].bytes + 2 * GUARD);
        memcpy(s->m[k].raw, s->m[0].raw, s->m[0].bytes + 2 * GUARD);
        memcpy(s->v[k].raw, s->v[0].raw, s->v[0].bytes + 2 * GUARD);
    }
}

static void slice_tensors(slice *s, int k, zo_cpuadam_tensors *t)
{
    zo_cpuadam_tensors_default(t);
    t->n = s->n;
    t->param = SP(s, k);
    t->grad = SG(s);
    t->grad_dtype = (zo_dtype)s->gdt;
    t->state_dtype = (zo_dtype)s->sdt;
    t->exp_avg = s->kind != ZO_OPTIM_ADAGRAD ? SM(s, k) : NULL;
    t->exp_avg_sq = s->kind != ZO_OPTIM_LION ? SV(s, k) : NULL;
    if (s->odt >= 0) {
        t->param_out = SO(s, k);
        t->out_dtype = (zo_dtype)s->odt;
    }
}

static void make_job(slice *s, int k, const zo_cpuadam_hparams *hp, zo__optim_job *job, int rollback)
{
    zo_cpuadam_tensors t;
    slice_tensors(s, k, &t);
    int rc = zo__cpuadam_make_job(job, hp, &t, rollback);
    ck_assert_msg(rc == 0, "make_job: %s: %s", zo_strerror(rc), zo_last_error_detail());
}

static int is_sub32(float f)
{
    uint32_t u = zo__f32_bits(f);
    return (u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0;
}

/* The out copy must be exactly the rounding of the kernel's own fp32
 * parameter (VCVTNEPS2BF16 flushes subnormals to signed zero). */
static void check_out(slice *s, int k, const char *name, int bf16_ftz)
{
    if (s->odt < 0)
        return;
    const float *p = SP(s, k);
    const void *o = SO(s, k);
    for (size_t i = 0; i < s->n; i++) {
        if (s->odt == ZO__T_F32) {
            ZO_EXPECT(zo__f32_bits(((const float *)o)[i]) == zo__f32_bits(p[i]), "%s out f32 i=%zu", name, i);
            continue;
        }
        uint16_t want = s->odt == ZO__T_F16 ? zo__ref_f32_to_f16(p[i]) : zo__ref_f32_to_bf16(p[i]);
        if (s->odt == ZO__T_BF16 && bf16_ftz && is_sub32(p[i]))
            want = (uint16_t)((zo__f32_bits(p[i]) >> 16) & 0x8000u);
        uint16_t got = ((const uint16_t *)o)[i];
        ZO_EXPECT(got == want, "%s out %s n=%zu i=%zu p=%a got 0x%04x want 0x%04x", name,
                  s->odt == ZO__T_F16 ? "f16" : "bf16", s->n, i, (double)p[i], got, want);
    }
    gbuf_check(&s->o[k], s->off * tsz(s->odt), s->n * tsz(s->odt), name);
}

/*
 * The variant's results (set 2) must equal the reference's (set 1) bit for
 * bit: parameters, states, out copy. The one allowed difference: with
 * VCVTNEPS2BF16 (bf16_ftz) a bf16 state whose fp32 value is subnormal is
 * stored as a signed zero, where the reference stores the rounded
 * subnormal (or the smallest normal it rounds up to).
 */
static void compare_step(slice *s, const char *name, int bf16_ftz)
{
    const float *pr = SP(s, 1), *pv = SP(s, 2);
    for (size_t i = 0; i < s->n; i++) {
        ZO_EXPECT(same_f32(pr[i], pv[i]), "%s kind %d g%d s%d o%d n=%zu i=%zu: p ref %a var %a (p0 %a g %a)", name,
                  s->kind, s->gdt, s->sdt, s->odt, s->n, i, (double)pr[i], (double)pv[i], (double)SP(s, 0)[i],
                  (double)load_elem(SG(s), s->gdt, i));
        for (int which = 0; which < 2; which++) {
            if ((which == 0 && s->kind == ZO__K_ADAGRAD) || (which == 1 && s->kind == ZO__K_LION))
                continue;
            const void *want = which == 0 ? SM(s, 1) : SV(s, 1), *got = which == 0 ? SM(s, 2) : SV(s, 2);
            int ok;
            if (s->sdt == ZO__T_F32) {
                ok = same_f32(((const float *)want)[i], ((const float *)got)[i]);
            } else {
                uint16_t w = ((const uint16_t *)want)[i], gv = ((const uint16_t *)got)[i];
                ok = same_16(w, gv, ZO__T_BF16) ||
                     (bf16_ftz && (gv & 0x7fff) == 0 && ((w & 0x7f80) == 0 || (w & 0x7fff) == 0x0080));
            }
            ZO_EXPECT(ok, "%s kind %d g%d s%d n=%zu i=%zu: %s ref %a var %a", name, s->kind, s->gdt, s->sdt, s->n, i,
                      which ? "v" : "m", (double)load_elem(want, s->sdt, i), (double)load_elem(got, s->sdt, i));
        }
    }
    gbuf_check(&s->p[2], s->off * 4, s->n * 4, "param");
    if (s->kind != ZO__K_ADAGRAD)
        gbuf_check(&s->m[2], s->off * tsz(s->sdt), s->n * tsz(s->sdt), "exp_avg");
    if (s->kind != ZO__K_LION)
        gbuf_check(&s->v[2], s->off * tsz(s->sdt), s->n * tsz(s->sdt), "exp_avg_sq");
    check_out(s, 1, "reference", 0);
    check_out(s, 2, name, bf16_ftz);
}

/* Run one slice through the reference and variant v and compare. */
static void check_case(size_t v, size_t n, size_t off, int kind, int gdt, int sdt, int odt, int nt,
                       int special, zo_test_rng *r)
{
    const zo_cpuadam_dsp *ref = zo__cpuadam_dsp_for(0), *var = zo__cpuadam_dsp_for(variant_flags[v]);
    slice s;
    slice_init(&s, n, off, kind, gdt, sdt, odt);
    slice_fill(&s, r, special);
    zo_cpuadam_hparams hp;
    random_hparams(r, &hp, kind);
    zo__optim_job jr, jv;
    make_job(&s, 1, &hp, &jr, 0);
    make_job(&s, 2, &hp, &jv, 0);
    jv.nt_out = nt;
    ref->step(&jr, 0, n);
    var->step(&jv, 0, n);
    compare_step(&s, var->name, !strcmp(var->name, "avx512bf16"));
    slice_free(&s);
}

START_TEST(test_variants_lengths_1_to_257)
{
    zo_test_rng r = {zo_test_seed()};
    for (size_t v = 0; v < NVARIANTS; v++) {
        if (!variant_runs(v))
            continue;
        for (size_t n = 1; n <= 257; n++) {
            /* walk all 96 type combinations across the lengths */
            size_t c = n * 37 + v;
            int kind = (int)(c % 4), gdt = (int)(c / 4 % 3), sdt = (c / 12 % 2) ? ZO__T_BF16 : ZO__T_F32;
            int odt = (int)(c / 24 % 4) - 1;
            check_case(v, n, n % 5, kind, gdt, sdt, odt, (int)(n / 2 & 1), 1, &r);
        }
    }
}
END_TEST

START_TEST(test_variants_all_combinations)
{
    zo_test_rng r = {zo_test_seed() ^ 0x1234};
    static const size_t lengths[] = {1, 15, 16, 17, 33, 100, 1027, 40003};
    for (size_t v = 0; v < NVARIANTS; v++) {
        if (!variant_runs(v))
            continue;
        for (int kind = 0; kind < 4; kind++)
            for (int gdt = 0; gdt < 3; gdt++)
                for (int sb = 0; sb < 2; sb++)
                    for (int odt = -1; odt < 3; odt++)
                        for (size_t li = 0; li < ZO_ARRAY_LEN(lengths); li++) {
                            size_t n = lengths[li];
                            check_case(v, n, (n + (size_t)kind) % 7, kind, gdt, sb ? ZO__T_BF16 : ZO__T_F32, odt,
                                       (int)(li & 1), (int)(li % 3 != 2), &r);
                        }
    }
}
END_TEST

/* Planted values at the vector edges: zeros everywhere, and inf/NaN
 * gradients at the first and last lane of vectors and of the tail. */
START_TEST(test_variants_planted_specials)
{
    zo_test_rng r = {zo_test_seed() ^ 99};
    const size_t n = 67;
    for (size_t v = 0; v < NVARIANTS; v++) {
        if (!variant_runs(v))
            continue;
        const zo_cpuadam_dsp *ref = zo__cpuadam_dsp_for(0), *var = zo__cpuadam_dsp_for(variant_flags[v]);
        for (int kind = 0; kind < 4; kind++) {
            slice s;
            slice_init(&s, n, 3, kind, ZO__T_F32, ZO__T_F32, ZO__T_BF16);
            slice_fill(&s, &r, 0);
            float *g = SG(&s);
            static const size_t where[] = {0, 7, 8, 15, 16, 31, 32, 63, 64, 66};
            for (size_t k = 0; k < ZO_ARRAY_LEN(where); k++)
                g[where[k]] = (k % 3 == 0) ? NAN : (k % 3 == 1) ? INFINITY : -INFINITY;
            for (size_t i = 40; i < 48; i++) { /* all-zero element */
                g[i] = 0;
                SP(&s, 0)[i] = SP(&s, 1)[i] = SP(&s, 2)[i] = 0;
                ((float *)SM(&s, 0))[i] = ((float *)SM(&s, 1))[i] = ((float *)SM(&s, 2))[i] = 0;
                ((float *)SV(&s, 0))[i] = ((float *)SV(&s, 1))[i] = ((float *)SV(&s, 2))[i] = 0;
            }
            zo_cpuadam_hparams hp;
            random_hparams(&r, &hp, kind);
            zo__optim_job jr, jv;
            make_job(&s, 1, &hp, &jr, 0);
            make_job(&s, 2, &hp, &jv, 0);
            ref->step(&jr, 0, n);
            var->step(&jv, 0, n);
            compare_step(&s, var->name, !strcmp(var->name, "avx512bf16"));
            /* a non-finite gradient poisons its own element only */
            for (size_t k = 0; k < ZO_ARRAY_LEN(where); k++)
                ck_assert_msg(!isfinite(SP(&s, 2)[where[k]]) || kind == ZO__K_LION,
                              "%s kind %d: p[%zu] finite after a non-finite gradient", var->name, kind, where[k]);
            for (size_t i = 40; i < 48; i++) {
                if (kind == ZO__K_LION)
                    ck_assert(SP(&s, 2)[i] == 0.0f); /* sign(0) = 0 */
                else
                    ck_assert_msg(SP(&s, 2)[i] == 0.0f, "%s kind %d: zero element moved to %a", var->name, kind,
                                  (double)SP(&s, 2)[i]);
            }
            for (size_t i = 0; i < n; i++) {
                int bad = 0;
                for (size_t k = 0; k < ZO_ARRAY_LEN(where); k++)
                    bad |= where[k] == i;
                if (!bad)
                    ZO_EXPECT(isfinite(SP(&s, 2)[i]), "%s kind %d: p[%zu] not finite", var->name, kind, i);
            }
            slice_free(&s);
        }
    }
}
END_TEST

/* ---- the reference against PyTorch -------------------------------------------- */
/* The reference follows torch's order of operations but multiplies by
 * 1/sqrt(1-beta2^t) where torch divides, and rounds the step size once;
 * after three steps every value agrees within this many ulps of the
 * values' magnitude (for parameters: the largest of the result, the
 * previous value and lr, the scale of one update). */
#define TORCH_ULPS 4
static double torch_worst;

static void torch_run(int kind, double lr, double b1, double b2, double eps, double wd, const float *want_p[3],
                      const float *want_m[3], const float *want_v[3])
{
    const zo_cpuadam_dsp *ref = zo__cpuadam_dsp_for(0);
    float p[8], m[8] = {0}, v[8] = {0}, g[8];
    memcpy(p, tv_p0, sizeof(p));
    const float *gs[3] = {tv_g1, tv_g2, tv_g3};
    for (int s = 0; s < 3; s++) {
        float prev[8];
        memcpy(prev, p, sizeof(p));
        memcpy(g, gs[s], sizeof(g));
        zo_cpuadam_hparams hp;
        zo_cpuadam_hparams_default(&hp, (zo_optim_kind)kind);
        hp.lr = lr, hp.beta1 = b1, hp.beta2 = b2, hp.eps = eps, hp.weight_decay = wd, hp.step = s + 1;
        zo_cpuadam_tensors t;
        zo_cpuadam_tensors_default(&t);
        t.n = 8, t.param = p, t.grad = g, t.exp_avg = kind != ZO_OPTIM_ADAGRAD ? m : NULL, t.exp_avg_sq = v;
        zo__optim_job j;
        ck_assert_int_eq(zo__cpuadam_make_job(&j, &hp, &t, 0), 0);
        ref->step(&j, 0, 8);
        for (int i = 0; i < 8; i++) {
            double sc = fmax(fmax(fabs((double)want_p[s][i]), fabs((double)prev[i])), lr);
            torch_worst = fmax(torch_worst, fabs((double)p[i] - want_p[s][i]) / ulp32(sc));
            if (want_m)
                torch_worst = fmax(torch_worst, fabs((double)m[i] - want_m[s][i]) / ulp32(fabs((double)want_m[s][i])));
            torch_worst = fmax(torch_worst, fabs((double)v[i] - want_v[s][i]) / ulp32(fabs((double)want_v[s][i])));
            ck_assert_msg(fabs((double)p[i] - want_p[s][i]) <= TORCH_ULPS * ulp32(sc),
                          "kind %d step %d p[%d]: ours %a torch %a", kind, s + 1, i, (double)p[i], (double)want_p[s][i]);
            if (want_m)
                ck_assert_msg(fabs((double)m[i] - want_m[s][i]) <= TORCH_ULPS * ulp32(fabs((double)want_m[s][i])),
                              "kind %d step %d m[%d]: ours %a torch %a", kind, s + 1, i, (double)m[i], (double)want_m[s][i]);
            ck_assert_msg(fabs((double)v[i] - want_v[s][i]) <= TORCH_ULPS * ulp32(fabs((double)want_v[s][i])),
                          "kind %d step %d v[%d]: ours %a torch %a", kind, s + 1, i, (double)v[i], (double)want_v[s][i]);
        }
    }
}

START_TEST(test_reference_matches_torch_vectors)
{
    const float *ap[3] = {tv_adamw_p1, tv_adamw_p2, tv_adamw_p3};
    const float *am[3] = {tv_adamw_exp_avg1, tv_adamw_exp_avg2, tv_adamw_exp_avg3};
    const float *av[3] = {tv_adamw_exp_avg_sq1, tv_adamw_exp_avg_sq2, tv_adamw_exp_avg_sq3};
    torch_run(ZO_OPTIM_ADAMW, 1e-2, 0.9, 0.999, 1e-8, 0.1, ap, am, av);
    const float *bp[3] = {tv_adam_p1, tv_adam_p2, tv_adam_p3};
    const float *bm[3] = {tv_adam_exp_avg1, tv_adam_exp_avg2, tv_adam_exp_avg3};
    const float *bv[3] = {tv_adam_exp_avg_sq1, tv_adam_exp_avg_sq2, tv_adam_exp_avg_sq3};
    torch_run(ZO_OPTIM_ADAM, 1e-2, 0.8, 0.99, 1e-6, 0.05, bp, bm, bv);
    const float *cp[3] = {tv_adagrad_p1, tv_adagrad_p2, tv_adagrad_p3};
    const float *cv[3] = {tv_adagrad_sum1, tv_adagrad_sum2, tv_adagrad_sum3};
    torch_run(ZO_OPTIM_ADAGRAD, 1e-1, 0, 0, 1e-10, 0.02, cp, NULL, cv);
    fprintf(stderr, "cpuadam: reference vs torch 1.13: largest difference %.2f ulps (bound %d)\n", torch_worst,
            TORCH_ULPS);
}
END_TEST

/* The reference against the published formulas evaluated in double
 * (torch.optim semantics: eps outside the square root after bias
 * correction, decoupled decay lr*wd*p, L2 added to the gradient; Lion per
 * the paper and DeepSpeed). */
START_TEST(test_reference_matches_formula_in_double)
{
    zo_test_rng r = {zo_test_seed() ^ 0x77};
    const zo_cpuadam_dsp *ref = zo__cpuadam_dsp_for(0);
    enum { N = 4096 };
    static float p[N], g[N], m[N], v[N];
    for (int kind = 0; kind < 4; kind++) {
        for (int rep = 0; rep < 4; rep++) {
            zo_cpuadam_hparams hp;
            random_hparams(&r, &hp, kind);
            float p0[N], m0[N], v0[N];
            for (int i = 0; i < N; i++) {
                p0[i] = p[i] = (float)(zo_test_uniform(&r) * 2 - 1);
                g[i] = (float)((zo_test_uniform(&r) * 2 - 1) * ldexp(1.0, -(int)(zo_test_next(&r) % 12)));
                m0[i] = m[i] = (float)((zo_test_uniform(&r) * 2 - 1) * 1e-2);
                v0[i] = v[i] = (float)(zo_test_uniform(&r) * 1e-4);
            }
            zo_cpuadam_tensors t;
            zo_cpuadam_tensors_default(&t);
            t.n = N, t.param = p, t.grad = g, t.exp_avg = m, t.exp_avg_sq = v;
            zo__optim_job j;
            ck_assert_int_eq(zo__cpuadam_make_job(&j, &hp, &t, 0), 0);
            ref->step(&j, 0, N);
            /* First-order error bounds for fp32 evaluation, one rounding
             * per operation: an error of one ulp of the gradient's terms
             * (gt) moves v by about 2|g| ulp(gt), the denominator by half
             * that relatively, and the update with it. */
            double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, wd = hp.weight_decay, st = (double)hp.step;
            double gs = hp.grad_scale * hp.clip_coef;
            for (int i = 0; i < N; i++) {
                double gi = g[i] * gs, pi = p0[i], mw = 0, vw = 0, pw, sc, gt = fabs(gi), ev = 0, eu = 0;
                if (kind == ZO_OPTIM_ADAMW || kind == ZO_OPTIM_ADAM) {
                    if (kind == ZO_OPTIM_ADAM) {
                        gt += fabs(wd * pi);
                        gi += wd * pi;
                    } else {
                        pi *= 1 - lr * wd;
                    }
                    mw = b1 * m0[i] + (1 - b1) * gi;
                    vw = b2 * v0[i] + (1 - b2) * gi * gi;
                    double bc1 = hp.bias_correction ? 1 - pow(b1, st) : 1;
                    double bc2 = hp.bias_correction ? 1 - pow(b2, st) : 1;
                    double den = sqrt(vw) / sqrt(bc2) + hp.eps;
                    pw = pi - (lr / bc1) * mw / den;
                    ev = (1 - b2) * 2 * fabs(gi) * ulp32(gt) + 4 * ulp32(vw);
                    eu = fabs(pw - pi) * (vw > 0 ? ev / (2 * vw) : 0);
                    sc = fmax(fabs(pi), (lr / bc1) * (fabs(b1 * m0[i]) + (1 - b1) * gt) / den);
                } else if (kind == ZO_OPTIM_ADAGRAD) {
                    gt += fabs(wd * pi);
                    gi += wd * pi;
                    vw = v0[i] + gi * gi;
                    double den = sqrt(vw) + hp.eps;
                    pw = pi - lr * gi / den;
                    ev = 2 * fabs(gi) * ulp32(gt) + 4 * ulp32(vw);
                    eu = lr * ulp32(gt) / den + fabs(pw - pi) * (vw > 0 ? ev / (2 * vw) : 0);
                    sc = fmax(fabs(pi), lr);
                } else {
                    double c = b1 * m0[i] + (1 - b1) * gi;
                    pw = pi * (1 - lr * wd) - lr * (c > 0 ? 1 : c < 0 ? -1 : 0);
                    mw = b2 * m0[i] + (1 - b2) * gi;
                    sc = fmax(fabs(pi), lr);
                }
                ZO_EXPECT(fabs(p[i] - pw) <= 8 * ulp32(sc) + 2 * eu, "kind %d i=%d: p ref %a formula %a", kind, i,
                          (double)p[i], pw);
                if (kind != ZO_OPTIM_ADAGRAD)
                    ZO_EXPECT(fabs(m[i] - mw) <= 4 * ulp32(fabs(b1 * m0[i]) + (1 - b1) * gt + fabs(mw)),
                              "kind %d i=%d: m ref %a formula %a", kind, i, (double)m[i], mw);
                if (kind != ZO_OPTIM_LION)
                    ZO_EXPECT(fabs(v[i] - vw) <= 2 * ev, "kind %d i=%d: v ref %a formula %a", kind, i, (double)v[i], vw);
            }
        }
    }
}
END_TEST

/* ---- rollback ----------------------------------------------------------------- */
START_TEST(test_rollback_restores_state)
{
    zo_test_rng r = {zo_test_seed() ^ 0x5eed};
    for (size_t vi = 0; vi < NVARIANTS; vi++) {
        if (!variant_runs(vi))
            continue;
        const zo_cpuadam_dsp *var = zo__cpuadam_dsp_for(variant_flags[vi]);
        for (int kind = 0; kind < 2; kind++)
            for (int gdt = 0; gdt < 3; gdt++) {
                size_t n = 1000 + (size_t)gdt * 7 + (size_t)kind;
                slice s;
                slice_init(&s, n, 1 + (size_t)gdt, kind, gdt, ZO__T_F32, gdt == 2 ? ZO__T_BF16 : -1);
                slice_fill(&s, &r, 0);
                zo_cpuadam_hparams hp;
                random_hparams(&r, &hp, kind);
                if (gdt == 1)
                    hp.beta1 = 0; /* the m of before is irrelevant: comes back 0 */
                zo__optim_job j;
                make_job(&s, 2, &hp, &j, 0);
                var->step(&j, 0, n);
                /* keep the post-step values to bound the restore */
                float *p1 = malloc(n * 4), *m1 = malloc(n * 4), *v1 = malloc(n * 4);
                memcpy(p1, SP(&s, 2), n * 4);
                memcpy(m1, SM(&s, 2), n * 4);
                memcpy(v1, SV(&s, 2), n * 4);
                zo__optim_job jb;
                make_job(&s, 2, &hp, &jb, 1);
                var->rollback(&jb, 0, n);
                const float *p0 = SP(&s, 0), *m0 = SM(&s, 0), *v0 = SV(&s, 0);
                const float *pr = SP(&s, 2), *mr = SM(&s, 2), *vr = SV(&s, 2);
                for (size_t i = 0; i < n; i++) {
                    double g = (double)load_elem(SG(&s), gdt, i) * j.gscale;
                    double den = sqrt(v1[i]) * j.inv_sqrt_bc2 + j.eps;
                    double u = fabs(j.neg_step * (double)m1[i] / den);
                    double tp = 4 * ulp32(fmax(fmax(fabs(p0[i]), fabs(p1[i])), u)) / j.decay;
                    ZO_EXPECT(fabs((double)pr[i] - p0[i]) <= tp, "%s kind %d i=%zu: p back %a was %a", var->name, kind, i,
                              (double)pr[i], (double)p0[i]);
                    double gl = kind == ZO__K_ADAM ? fabs(g) + fabs(j.l2 * (double)p0[i]) : fabs(g);
                    double dg = kind == ZO__K_ADAM ? j.l2 * tp : 0; /* g moves with the restored p */
                    if (j.b1 == 0) {
                        ZO_EXPECT(mr[i] == 0.0f, "%s: m back %a with beta1 = 0", var->name, (double)mr[i]);
                    } else {
                        double tm = (4 * ulp32(fmax(fmax(fabs(m1[i]), j.omb1 * gl), j.b1 * fabs(m0[i]))) + j.omb1 * dg) / j.b1;
                        ZO_EXPECT(fabs((double)mr[i] - m0[i]) <= tm, "%s kind %d i=%zu: m back %a was %a", var->name, kind,
                                  i, (double)mr[i], (double)m0[i]);
                    }
                    double tv = (4 * ulp32(fmax(fmax(v1[i], j.omb2 * gl * gl), j.b2 * v0[i])) + 2 * j.omb2 * gl * dg) / j.b2;
                    ZO_EXPECT(fabs((double)vr[i] - v0[i]) <= tv, "%s kind %d i=%zu: v back %a was %a", var->name, kind, i,
                              (double)vr[i], (double)v0[i]);
                    ZO_EXPECT(vr[i] >= 0.0f, "%s: v negative after rollback", var->name);
                }
                check_out(&s, 2, var->name, !strcmp(var->name, "avx512bf16"));
                free(p1);
                free(m1);
                free(v1);
                slice_free(&s);
            }
    }
}
END_TEST

/* Every variant's rollback against the reference's, bit for bit, with
 * planted elements where v is -0 and the gradient 0: AdamW gives v = -0
 * back there, which the reference keeps (vp < 0 is false) and a max()
 * instruction that returns +0 for (+0, -0), like AArch64's FMAX, would
 * not. */
START_TEST(test_rollback_matches_reference)
{
    zo_test_rng r = {zo_test_seed() ^ 0xb0b};
    const zo_cpuadam_dsp *ref = zo__cpuadam_dsp_for(0);
    for (size_t vi = 1; vi < NVARIANTS; vi++) {
        if (!variant_runs(vi))
            continue;
        const zo_cpuadam_dsp *var = zo__cpuadam_dsp_for(variant_flags[vi]);
        for (int kind = 0; kind < 2; kind++) {
            const size_t n = 67;
            slice s;
            slice_init(&s, n, 3, kind, ZO__T_F32, ZO__T_F32, ZO__T_F32);
            slice_fill(&s, &r, 0);
            for (size_t i = 0; i < n; i += 5) {
                ((float *)SG(&s))[i] = 0.0f;
                ((float *)SV(&s, 1))[i] = ((float *)SV(&s, 2))[i] = -0.0f;
            }
            zo_cpuadam_hparams hp;
            random_hparams(&r, &hp, kind);
            zo__optim_job jr, jv;
            make_job(&s, 1, &hp, &jr, 1);
            make_job(&s, 2, &hp, &jv, 1);
            ref->rollback(&jr, 0, n);
            var->rollback(&jv, 0, n);
            compare_step(&s, var->name, 0);
            slice_free(&s);
        }
    }
}
END_TEST

/* ---- gradient statistics ------------------------------------------------------- */
START_TEST(test_grad_stats_all_variants)
{
    zo_test_rng r = {zo_test_seed() ^ 3};
    size_t cap = 70001 + 4;
    float *x = malloc(cap * 4);
    uint16_t *hb = malloc(cap * 2), *hf = malloc(cap * 2);
    ck_assert(x && hb && hf);
    for (size_t n = 1; n <= 70001; n = n < 257 ? n + 1 : n * 9 + 1) {
        for (size_t i = 0; i < n + 1; i++)
            x[i] = (float)((zo_test_uniform(&r) - 0.5) * 8.0);
        size_t off = n & 1;
        for (size_t i = 0; i < n; i++) {
            hb[off + i] = zo__ref_f32_to_bf16(x[off + i]);
            hf[off + i] = zo__ref_f32_to_f16(x[off + i]);
        }
        const void *src[3] = {x + off, hf + off, hb + off};
        for (int t = 0; t < 3; t++) {
            long double want = 0;
            for (size_t i = 0; i < n; i++) {
                long double e = load_elem(src[t], t, i);
                want += e * e;
            }
            for (size_t v = 0; v < NVARIANTS; v++) {
                if (!variant_runs(v))
                    continue;
                const zo_cpuadam_dsp *d = zo__cpuadam_dsp_for(variant_flags[v]);
                double s;
                uint64_t c;
                d->grad_stats(src[t], t, 0, n, &s, &c);
                ZO_EXPECT(fabs(s - (double)want) <= (double)n * 0x1p-52 * (double)want + 1e-300,
                          "%s type %d n=%zu sumsq %a want %a", d->name, t, n, s, (double)want);
                ZO_EXPECT(c == 0, "%s: %llu non-finite in finite data", d->name, (unsigned long long)c);
            }
        }
    }
    /* planted inf/nan: counted exactly, sum non-finite */
    size_t n = 1031;
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f;
    static const size_t where[] = {0, 7, 15, 16, 517, 1024, 1030};
    for (size_t k = 0; k < ZO_ARRAY_LEN(where); k++)
        x[where[k]] = (k & 1) ? INFINITY : NAN;
    for (size_t i = 0; i < n; i++) {
        hb[i] = zo__ref_f32_to_bf16(x[i]);
        hf[i] = zo__ref_f32_to_f16(x[i]);
    }
    hf[100] = 0x7bff; /* fp16 max: finite */
    const void *src[3] = {x, hf, hb};
    for (size_t v = 0; v < NVARIANTS; v++) {
        if (!variant_runs(v))
            continue;
        const zo_cpuadam_dsp *d = zo__cpuadam_dsp_for(variant_flags[v]);
        for (int t = 0; t < 3; t++) {
            double s;
            uint64_t c;
            d->grad_stats(src[t], t, 0, n, &s, &c);
            ck_assert_msg(c == ZO_ARRAY_LEN(where), "%s type %d: counted %llu", d->name, t, (unsigned long long)c);
            ck_assert(!isfinite(s));
        }
    }
    free(x);
    free(hb);
    free(hf);
}
END_TEST

/* Lion and non-finite gradients, as cpuadam.h states it: the update is
 * sign(c) * lr, so +/-inf moves the parameter by -/+lr (finite) and makes
 * exp_avg +/-inf; NaN makes both NaN. Every variant, bit for bit. */
START_TEST(test_lion_nonfinite_gradient)
{
    enum { N = 67 };
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_LION);
    hp.lr = 0.25; /* exact in fp32: 1 -/+ lr is exact */
    hp.weight_decay = 0;
    for (size_t v = 0; v < NVARIANTS; v++) {
        if (!variant_runs(v))
            continue;
        const zo_cpuadam_dsp *d = zo__cpuadam_dsp_for(variant_flags[v]);
        float p[N], g[N], m[N];
        for (int i = 0; i < N; i++)
            p[i] = 1.0f, g[i] = 0.5f, m[i] = 0.0f;
        g[3] = INFINITY, g[40] = -INFINITY, g[65] = NAN;
        zo_cpuadam_tensors t;
        zo_cpuadam_tensors_default(&t);
        t.n = N, t.param = p, t.grad = g, t.exp_avg = m;
        zo__optim_job job;
        ck_assert_int_eq(zo__cpuadam_make_job(&job, &hp, &t, 0), 0);
        d->step(&job, 0, N);
        ck_assert_msg(p[3] == 0.75f && p[40] == 1.25f, "%s: p %a %a", d->name, (double)p[3], (double)p[40]);
        ck_assert_msg(isnan(p[65]), "%s: NaN gradient gave p %a", d->name, (double)p[65]);
        ck_assert_msg(isinf(m[3]) && m[3] > 0 && isinf(m[40]) && m[40] < 0 && isnan(m[65]), "%s: m %a %a %a",
                      d->name, (double)m[3], (double)m[40], (double)m[65]);
        ck_assert_msg(p[0] == 0.75f, "%s: finite element p %a", d->name, (double)p[0]);
        /* exp_avg = inf stays the sign until an inf of the other sign meets it */
        g[3] = 1.0f, g[40] = 1.0f;
        d->step(&job, 0, N);
        ck_assert_msg(p[3] == 0.5f && p[40] == 1.5f, "%s: second step p %a %a", d->name, (double)p[3],
                      (double)p[40]);
        g[3] = -INFINITY;
        d->step(&job, 0, N);
        ck_assert_msg(isnan(p[3]), "%s: inf - inf gave p %a", d->name, (double)p[3]);
    }
}
END_TEST

START_TEST(test_grad_stats_threads)
{
    size_t n = 1000003;
    float *g = malloc(n * 4);
    ck_assert_ptr_nonnull(g);
    zo_test_rng r = {zo_test_seed() ^ 11};
    long double want = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)(zo_test_uniform(&r) - 0.5);
        want += (long double)g[i] * g[i];
    }
    g[12345] = NAN;
    g[999999] = -INFINITY;
    for (int th = 1; th <= 4; th++) {
        zo_grad_stats st;
        ck_assert_int_eq(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, n, th, &st), 0);
        ck_assert_uint_eq(st.nonfinite, 2);
        ck_assert(!isfinite(st.sumsq));
        zo_grad_stats st2;
        ck_assert_int_eq(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, 12345, th, &st2), 0);
        ck_assert_uint_eq(st2.nonfinite, 0);
        long double w2 = 0;
        for (size_t i = 0; i < 12345; i++)
            w2 += (long double)g[i] * g[i];
        ck_assert_double_le(fabs(st2.sumsq - (double)w2), 12345 * 0x1p-52 * (double)w2);
    }
    g[12345] = 0;
    g[999999] = 0;
    want = 0;
    for (size_t i = 0; i < n; i++)
        want += (long double)g[i] * g[i];
    double first = 0;
    for (int th = 1; th <= 4; th++) {
        zo_grad_stats st;
        ck_assert_int_eq(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, n, th, &st), 0);
        ck_assert_uint_eq(st.nonfinite, 0);
        ck_assert_double_le(fabs(st.sumsq - (double)want), (double)n * 0x1p-52 * (double)want);
        zo_grad_stats again; /* deterministic for the same thread count */
        ck_assert_int_eq(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, n, th, &again), 0);
        ck_assert(again.sumsq == st.sumsq);
        if (th == 1)
            first = st.sumsq;
    }
    ck_assert(first > 0);
    free(g);
}
END_TEST

/* ---- threads, tiles, teams: the public API -------------------------------------- */
typedef struct big {
    size_t n;
    float *p, *m, *v, *g;
    uint16_t *out;
} big;

static void big_init(big *b, size_t n, uint64_t seed)
{
    b->n = n;
    b->p = malloc(n * 4), b->m = malloc(n * 4), b->v = malloc(n * 4), b->g = malloc(n * 4);
    b->out = malloc(n * 2);
    ck_assert(b->p && b->m && b->v && b->g && b->out);
    zo_test_rng r = {seed};
    for (size_t i = 0; i < n; i++) {
        b->p[i] = (float)(zo_test_uniform(&r) * 2 - 1);
        b->g[i] = (float)((zo_test_uniform(&r) * 2 - 1) * 1e-2);
        b->m[i] = (float)((zo_test_uniform(&r) * 2 - 1) * 1e-3);
        b->v[i] = (float)(zo_test_uniform(&r) * 1e-5);
    }
    memset(b->out, 0, n * 2);
}

static void big_free(big *b)
{
    free(b->p), free(b->m), free(b->v), free(b->g), free(b->out);
}

static void big_tensors(big *b, zo_cpuadam_tensors *t)
{
    zo_cpuadam_tensors_default(t);
    t->n = b->n, t->param = b->p, t->grad = b->g, t->exp_avg = b->m, t->exp_avg_sq = b->v;
    t->param_out = b->out, t->out_dtype = ZO_DTYPE_BF16;
}

static int big_equal(const big *a, const big *b)
{
    return !memcmp(a->p, b->p, a->n * 4) && !memcmp(a->m, b->m, a->n * 4) && !memcmp(a->v, b->v, a->n * 4) &&
           !memcmp(a->out, b->out, a->n * 2);
}

/* Element-wise kernels: results do not depend on threads or tiles. */
START_TEST(test_threads_and_tiles_bit_identical)
{
    size_t n = 300007;
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW);
    hp.step = 7;
    big want;
    big_init(&want, n, 42);
    zo_cpuadam_tensors t;
    big_tensors(&want, &t);
    zo__optim_job j;
    ck_assert_int_eq(zo__cpuadam_make_job(&j, &hp, &t, 0), 0);
    zo__cpuadam_dsp()->step(&j, 0, n);
    static const int threads[] = {1, 2, 3, 8};
    static const size_t tiles[] = {1024, 16384, 1 << 20};
    for (size_t a = 0; a < ZO_ARRAY_LEN(threads); a++) {
        big got;
        big_init(&got, n, 42);
        big_tensors(&got, &t);
        ck_assert_int_eq(zo_cpuadam_step(&hp, &t, threads[a]), 0);
        ck_assert_msg(big_equal(&want, &got), "%d threads differ from one", threads[a]);
        big_free(&got);
        for (size_t b = 0; b < ZO_ARRAY_LEN(tiles); b++) {
            for (int ntm = 0; ntm < 3; ntm++) {
                zo_cpuadam_team_config cfg;
                zo_cpuadam_team_config_default(&cfg);
                cfg.nthreads = threads[a];
                cfg.tile_elems = tiles[b];
                cfg.nt_stores = (zo_cpuadam_nt)ntm;
                zo_cpuadam_team *tm;
                ck_assert_int_eq(zo_cpuadam_team_create(&tm, &cfg), 0);
                big_init(&got, n, 42);
                big_tensors(&got, &t);
                ck_assert_int_eq(zo_cpuadam_team_step(tm, &hp, &t), 0);
                ck_assert_msg(big_equal(&want, &got), "team %d threads tile %zu nt %d differs", threads[a], tiles[b], ntm);
                big_free(&got);
                zo_cpuadam_team_destroy(&tm);
                ck_assert_ptr_null(tm);
            }
        }
    }
    big_free(&want);
}
END_TEST

START_TEST(test_team_variants_match_dsp)
{
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};
    size_t n = 100003;
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAM);
    hp.weight_decay = 0.01f;
    for (size_t k = 0; k < ZO_ARRAY_LEN(names); k++) {
        int avail = zo_cpuadam_variant_available(names[k]);
        ck_assert_int_ge(avail, 0);
        zo_cpuadam_team_config cfg;
        zo_cpuadam_team_config_default(&cfg);
        cfg.nthreads = 2;
        cfg.variant = names[k];
        zo_cpuadam_team *tm = NULL;
        int rc = zo_cpuadam_team_create(&tm, &cfg);
        if (!avail) {
            ck_assert_int_eq(rc, ZO_ENOTSUP);
            ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), names[k]));
            continue;
        }
        ck_assert_int_eq(rc, 0);
        ck_assert_str_eq(zo_cpuadam_team_variant(tm), names[k]);
        ck_assert_int_eq(zo_cpuadam_team_threads(tm), 2);
        big want, got;
        big_init(&want, n, 7);
        big_init(&got, n, 7);
        zo_cpuadam_tensors t;
        big_tensors(&want, &t);
        zo__optim_job j;
        ck_assert_int_eq(zo__cpuadam_make_job(&j, &hp, &t, 0), 0);
        zo__cpuadam_dsp_named(names[k], NULL)->step(&j, 0, n);
        big_tensors(&got, &t);
        ck_assert_int_eq(zo_cpuadam_team_step(tm, &hp, &t), 0);
        ck_assert_msg(big_equal(&want, &got), "team variant %s", names[k]);
        /* rollback through the team, then the step again gives the same */
        ck_assert_int_eq(zo_cpuadam_team_rollback(tm, &hp, &t), 0);
        ck_assert_int_eq(zo_cpuadam_team_step(tm, &hp, &t), 0);
        for (size_t i = 0; i < n; i++)
            ZO_EXPECT(fabsf(got.p[i] - want.p[i]) <= 16 * (float)ulp32(fabs((double)want.p[i])), "%s redo p[%zu]",
                      names[k], i);
        zo_grad_stats st;
        ck_assert_int_eq(zo_cpuadam_team_grad_stats(tm, got.g, ZO_DTYPE_F32, n, &st), 0);
        ck_assert(st.sumsq > 0 && st.nonfinite == 0);
        ck_assert_int_eq(zo_cpuadam_team_stream_bound(tm, got.p, got.m, got.v, got.g, 0.0f, n), 0);
        big_free(&want);
        big_free(&got);
        zo_cpuadam_team_destroy(&tm);
    }
}
END_TEST

START_TEST(test_team_pinned)
{
    size_t n = 200000;
    zo_cpuadam_team_config cfg;
    zo_cpuadam_team_config_default(&cfg);
    cfg.nthreads = 2;
    cfg.pin = 1;
    zo_cpuadam_team *tm;
    int rc = zo_cpuadam_team_create(&tm, &cfg);
    if (rc == ZO_ENOTSUP)
        return; /* built without OpenMP: said in the detail */
    ck_assert_int_eq(rc, 0);
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW);
    big want, got;
    big_init(&want, n, 3);
    big_init(&got, n, 3);
    zo_cpuadam_tensors t;
    big_tensors(&want, &t);
    ck_assert_int_eq(zo_cpuadam_step(&hp, &t, 2), 0);
    big_tensors(&got, &t);
    ck_assert_int_eq(zo_cpuadam_team_step(tm, &hp, &t), 0);
    ck_assert(big_equal(&want, &got));
    /* the calling thread is OpenMP thread 0: now bound to one CPU */
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    ck_assert_int_eq(CPU_COUNT(&set), 1);
    /* a node that does not exist */
    cfg.numa_node = 4095;
    zo_cpuadam_team *bad = NULL;
    ck_assert_int_eq(zo_cpuadam_team_create(&bad, &cfg), ZO_ECONFIG);
    ck_assert_ptr_null(bad);
    big_free(&want);
    big_free(&got);
    zo_cpuadam_team_destroy(&tm);
}
END_TEST

/* ---- hyperparameters ------------------------------------------------------------ */
START_TEST(test_hparams_defaults_and_old_struct)
{
    zo_cpuadam_hparams hp;
    ck_assert_int_eq(zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW), 0);
    ck_assert_uint_eq(hp.struct_size, sizeof(hp));
    ck_assert(hp.lr == 1e-3 && hp.beta1 == 0.9 && hp.beta2 == 0.999 && hp.eps == 1e-8 && hp.weight_decay == 1e-2);
    ck_assert(hp.step == 1 && hp.bias_correction == 1 && hp.grad_scale == 1.0 && hp.clip_coef == 1.0);
    ck_assert_int_eq(zo_cpuadam_hparams_default(&hp, ZO_OPTIM_LION), 0);
    ck_assert(hp.lr == 1e-4 && hp.beta2 == 0.99 && hp.weight_decay == 0);
    ck_assert_int_eq(zo_cpuadam_hparams_default(&hp, ZO_OPTIM_KIND_COUNT), -EINVAL);
    ck_assert_int_eq(zo_cpuadam_hparams_default(NULL, ZO_OPTIM_ADAM), -EINVAL);
    /* a caller built before grad_scale/clip_coef existed gets 1 for both */
    size_t n = 1000;
    big a, b;
    big_init(&a, n, 5);
    big_init(&b, n, 5);
    zo_cpuadam_tensors t;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW);
    big_tensors(&a, &t);
    ck_assert_int_eq(zo_cpuadam_step(&hp, &t, 1), 0);
    zo_cpuadam_hparams old;
    memset(&old, 0x7f, sizeof(old)); /* garbage past the old size */
    memcpy(&old, &hp, offsetof(zo_cpuadam_hparams, grad_scale));
    old.struct_size = offsetof(zo_cpuadam_hparams, grad_scale);
    big_tensors(&b, &t);
    ck_assert_int_eq(zo_cpuadam_step(&old, &t, 1), 0);
    ck_assert(big_equal(&a, &b));
    /* the fused pre-scale equals scaling the gradient first (power of 2: exact) */
    big c;
    big_init(&c, n, 5);
    for (size_t i = 0; i < n; i++)
        c.g[i] *= 1024.0f;
    hp.grad_scale = 1.0 / 1024.0;
    big_tensors(&c, &t);
    ck_assert_int_eq(zo_cpuadam_step(&hp, &t, 1), 0);
    ck_assert(!memcmp(a.p, c.p, n * 4) && !memcmp(a.m, c.m, n * 4));
    big_free(&a);
    big_free(&b);
    big_free(&c);
}
END_TEST

/* ---- bad input ------------------------------------------------------------------- */
#define EXPECT_FAIL(call, code, word)                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == (code), "%s -> %d (%s), want %d", #call, rc_, zo_strerror(rc_), code); \
        ck_assert_msg(strstr(zo_last_error_detail(), (word)) != NULL, "%s: detail '%s' lacks '%s'",  \
                      #call, zo_last_error_detail(), (word));                                      \
    } while (0)

START_TEST(test_bad_input)
{
    size_t n = 64;
    float p[64] = {0}, g[64] = {0}, m[64] = {0}, v[64] = {0};
    uint16_t o[64];
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW);
    zo_cpuadam_tensors t, t0;
    zo_cpuadam_tensors_default(&t0);
    t0.n = n, t0.param = p, t0.grad = g, t0.exp_avg = m, t0.exp_avg_sq = v;
    ck_assert_int_eq(zo_cpuadam_step(&hp, &t0, 1), 0);

    EXPECT_FAIL(zo_cpuadam_step(NULL, &t0, 1), -EINVAL, "hparams is NULL");
    EXPECT_FAIL(zo_cpuadam_step(&hp, NULL, 1), -EINVAL, "tensors is NULL");
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t0, 0), -EINVAL, "nthreads 0");
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t0, -3), -EINVAL, "nthreads -3");
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t0, 100000), -EINVAL, "nthreads");
    t = t0, t.n = 0;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "n = 0");
    t = t0, t.param = NULL;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "param is NULL");
    t = t0, t.grad = NULL;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "grad is NULL");
    t = t0, t.exp_avg = NULL;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "exp_avg is NULL");
    t = t0, t.exp_avg_sq = NULL;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "exp_avg_sq is NULL");
    /* the state an optimizer does not use may be NULL */
    zo_cpuadam_hparams ha;
    zo_cpuadam_hparams_default(&ha, ZO_OPTIM_ADAGRAD);
    t = t0, t.exp_avg = NULL;
    ck_assert_int_eq(zo_cpuadam_step(&ha, &t, 1), 0);
    zo_cpuadam_hparams hl;
    zo_cpuadam_hparams_default(&hl, ZO_OPTIM_LION);
    t = t0, t.exp_avg_sq = NULL;
    ck_assert_int_eq(zo_cpuadam_step(&hl, &t, 1), 0);
    /* overlaps */
    t = t0, t.exp_avg = p;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "overlaps");
    t = t0, t.grad = v + 10;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "overlaps");
    t = t0, t.param_out = (char *)p + 128, t.out_dtype = ZO_DTYPE_BF16;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "param_out");
    t = t0, t.param_out = p, t.out_dtype = ZO_DTYPE_F32; /* in place copy: not allowed */
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "overlaps");
    /* adjacent is fine */
    float pm[128] = {0};
    t = t0, t.param = pm, t.exp_avg = pm + 64;
    ck_assert_int_eq(zo_cpuadam_step(&hp, &t, 1), 0);
    /* misaligned */
    t = t0, t.param = (float *)((char *)p + 1), t.n = 10;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "aligned");
    t = t0, t.param_out = (char *)o + 1, t.out_dtype = ZO_DTYPE_BF16, t.n = 10;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "aligned");
    /* unsupported types */
    t = t0, t.grad_dtype = ZO_DTYPE_F64;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), ZO_ENOTSUP, "grad dtype f64");
    t = t0, t.grad_dtype = (zo_dtype)77;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), ZO_ENOTSUP, "grad dtype");
    t = t0, t.state_dtype = ZO_DTYPE_F16;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), ZO_ENOTSUP, "state dtype f16");
    t = t0, t.param_out = o, t.out_dtype = ZO_DTYPE_U8;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), ZO_ENOTSUP, "out dtype u8");
    t = t0, t.struct_size = 8;
    EXPECT_FAIL(zo_cpuadam_step(&hp, &t, 1), -EINVAL, "struct_size");
    /* hyperparameters */
    zo_cpuadam_hparams h;
#define BAD_HP(field, val, word)                                        \
    do {                                                                \
        h = hp;                                                         \
        h.field = val;                                                  \
        EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), ZO_ECONFIG, word);     \
    } while (0)
    BAD_HP(lr, NAN, "lr");
    BAD_HP(lr, -1.0, "lr");
    BAD_HP(beta1, 1.0, "betas");
    BAD_HP(beta2, -0.1, "betas");
    BAD_HP(eps, -1e-8, "eps");
    BAD_HP(eps, INFINITY, "eps");
    BAD_HP(weight_decay, NAN, "weight_decay");
    BAD_HP(step, 0, "step 0");
    BAD_HP(bias_correction, 2, "bias_correction");
    BAD_HP(grad_scale, 0.0, "grad_scale");
    BAD_HP(grad_scale, NAN, "grad_scale");
    BAD_HP(clip_coef, -1.0, "clip_coef");
    BAD_HP(clip_coef, INFINITY, "clip_coef");
    BAD_HP(kind, (zo_optim_kind)9, "kind");
    h = hp, h.grad_scale = 1e30, h.clip_coef = 1e30;
    EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), ZO_ECONFIG, "overflows");
    h = hp, h.grad_scale = 1e-30, h.clip_coef = 1e-30;
    EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), ZO_ECONFIG, "underflows");
    BAD_HP(beta2, 0.99999999, "betas"); /* rounds to 1 in fp32 */
    BAD_HP(lr, 1e300, "lr");
    BAD_HP(eps, 1e39, "eps");
    /* each in range, the decoupled decay 1 - lr*wd is not */
    h = hp, h.lr = 1e30, h.weight_decay = 1e30;
    EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), ZO_ECONFIG, "weight_decay");
    h = hl, h.lr = 1e30, h.weight_decay = 1e30;
    EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), ZO_ECONFIG, "weight_decay");
    h = hl, h.beta1 = 1.5;
    EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), ZO_ECONFIG, "lion betas");
    h = hp, h.struct_size = 4;
    EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), -EINVAL, "struct_size");
    h = hp, h.struct_size = sizeof(h) + 8;
    EXPECT_FAIL(zo_cpuadam_step(&h, &t0, 1), -EINVAL, "struct_size");
    /* rollback limits */
    EXPECT_FAIL(zo_cpuadam_rollback(&hl, &t0, 1), ZO_ENOTSUP, "lion");
    EXPECT_FAIL(zo_cpuadam_rollback(&ha, &t0, 1), ZO_ENOTSUP, "adagrad");
    uint16_t mb[64] = {0}, vb[64] = {0};
    t = t0, t.state_dtype = ZO_DTYPE_BF16, t.exp_avg = mb, t.exp_avg_sq = vb;
    ck_assert_int_eq(zo_cpuadam_step(&hp, &t, 1), 0);
    EXPECT_FAIL(zo_cpuadam_rollback(&hp, &t, 1), ZO_ENOTSUP, "fp32 states");
    h = hp, h.lr = 1.0, h.weight_decay = 1.0;
    EXPECT_FAIL(zo_cpuadam_rollback(&h, &t0, 1), ZO_ECONFIG, "cannot be recovered");
    EXPECT_FAIL(zo_cpuadam_rollback(&hp, &t0, 0), -EINVAL, "nthreads");
    /* statistics */
    zo_grad_stats st;
    EXPECT_FAIL(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, 0, 1, &st), -EINVAL, "n = 0");
    EXPECT_FAIL(zo_cpuadam_grad_stats(NULL, ZO_DTYPE_F32, 4, 1, &st), -EINVAL, "grad is NULL");
    EXPECT_FAIL(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, 4, 1, NULL), -EINVAL, "out is NULL");
    EXPECT_FAIL(zo_cpuadam_grad_stats(g, ZO_DTYPE_I32, 4, 1, &st), ZO_ENOTSUP, "i32");
    /* an absurd n is refused as the step functions refuse it (it was
     * walked: SIGSEGV) */
    EXPECT_FAIL(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, SIZE_MAX, 1, &st), -EINVAL, "too large");
    EXPECT_FAIL(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, SIZE_MAX / 8 + 1, 4, &st), -EINVAL, "too large");
    EXPECT_FAIL(zo_cpuadam_grad_stats(g, ZO_DTYPE_BF16, SIZE_MAX / 2, 4, &st), -EINVAL, "too large");
    EXPECT_FAIL(zo_cpuadam_grad_stats(g, ZO_DTYPE_F32, 4, 0, &st), -EINVAL, "nthreads");
    EXPECT_FAIL(zo_cpuadam_grad_stats((char *)g + 2, ZO_DTYPE_F32, 4, 1, &st), -EINVAL, "aligned");
    /* the bound kernel */
    EXPECT_FAIL(zo_cpuadam_stream_bound(p, m, v, g, 0, 0, 1), -EINVAL, "n = 0");
    EXPECT_FAIL(zo_cpuadam_stream_bound(p, p, v, g, 0, n, 1), -EINVAL, "overlaps");
    EXPECT_FAIL(zo_cpuadam_stream_bound(p, m, NULL, g, 0, n, 1), -EINVAL, "c is NULL");
    EXPECT_FAIL(zo_cpuadam_stream_bound(p, m, v, g, 0, n, 0), -EINVAL, "nthreads");
    ck_assert_int_eq(zo_cpuadam_stream_bound(p, m, v, g, 0, n, 2), 0);
    /* teams */
    zo_cpuadam_team_config cfg;
    zo_cpuadam_team *tm = (zo_cpuadam_team *)&cfg;
    EXPECT_FAIL(zo_cpuadam_team_create(NULL, NULL), -EINVAL, "out is NULL");
    zo_cpuadam_team_config_default(&cfg);
    cfg.nthreads = 0;
    EXPECT_FAIL(zo_cpuadam_team_create(&tm, &cfg), -EINVAL, "nthreads 0");
    ck_assert_ptr_null(tm);
    zo_cpuadam_team_config_default(&cfg);
    cfg.variant = "avx1024";
    EXPECT_FAIL(zo_cpuadam_team_create(&tm, &cfg), ZO_ECONFIG, "avx1024");
    zo_cpuadam_team_config_default(&cfg);
    cfg.tile_elems = 1000;
    EXPECT_FAIL(zo_cpuadam_team_create(&tm, &cfg), -EINVAL, "tile_elems");
    zo_cpuadam_team_config_default(&cfg);
    cfg.nt_stores = (zo_cpuadam_nt)7;
    EXPECT_FAIL(zo_cpuadam_team_create(&tm, &cfg), ZO_ECONFIG, "nt_stores");
    zo_cpuadam_team_config_default(&cfg);
    cfg.struct_size = 3;
    EXPECT_FAIL(zo_cpuadam_team_create(&tm, &cfg), -EINVAL, "struct_size");
    EXPECT_FAIL(zo_cpuadam_team_step(NULL, &hp, &t0), -EINVAL, "team is NULL");
    ck_assert_int_eq(zo_cpuadam_team_create(&tm, NULL), 0); /* NULL config: defaults */
    t = t0, t.n = 0;
    EXPECT_FAIL(zo_cpuadam_team_step(tm, &hp, &t), -EINVAL, "n = 0");
    ck_assert_ptr_nonnull(strstr(zo_cpuadam_team_errmsg(tm), "n = 0"));
    zo_cpuadam_team_destroy(&tm);
    ck_assert_ptr_null(tm);
    zo_cpuadam_team_destroy(&tm);
    zo_cpuadam_team_destroy(NULL);
    EXPECT_FAIL(zo_cpuadam_variant_available("avx3"), -EINVAL, "avx3");
    ck_assert_int_eq(zo_cpuadam_variant_available("scalar"), 1);
    EXPECT_FAIL(zo_cpuadam_tensors_default(NULL), -EINVAL, "NULL");
    EXPECT_FAIL(zo_cpuadam_team_config_default(NULL), -EINVAL, "NULL");
}
END_TEST

/* ---- dispatch under ZO_CPU_MASK (meson runs this program under each level) ------ */
START_TEST(test_mask_bounds_dispatch)
{
    const char *env = getenv("ZO_CPU_MASK");
    unsigned want = ZO_CPU_ALL;
    if (env)
        ck_assert_int_eq(zo_cpu_parse_mask(env, &want), 0);
    const char *v = zo_cpuadam_variant();
    unsigned eff = zo_cpu_detected() & want;
    if ((eff & ZO_CPU_LEVEL_AVX2) != ZO_CPU_LEVEL_AVX2 && (eff & ZO_CPU_LEVEL_NEON) != ZO_CPU_LEVEL_NEON)
        ck_assert_str_eq(v, "scalar");
    if ((eff & ZO_CPU_LEVEL_NEON) == ZO_CPU_LEVEL_NEON)
        ck_assert_str_eq(v, "neon");
    if ((eff & ZO_CPU_LEVEL_AVX512) != ZO_CPU_LEVEL_AVX512)
        ck_assert_ptr_null(strstr(v, "avx512"));
    if (!(eff & ZO_CPU_AVX512BF16))
        ck_assert_str_ne(v, "avx512bf16");
    /* and the auto path agrees with the pinned table of that variant */
    size_t n = 5003;
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW);
    big a, b;
    big_init(&a, n, 9);
    big_init(&b, n, 9);
    zo_cpuadam_tensors t;
    big_tensors(&a, &t);
    ck_assert_int_eq(zo_cpuadam_step(&hp, &t, 2), 0);
    big_tensors(&b, &t);
    zo__optim_job j;
    ck_assert_int_eq(zo__cpuadam_make_job(&j, &hp, &t, 0), 0);
    zo__cpuadam_dsp_named(v, NULL)->step(&j, 0, n);
    ck_assert(big_equal(&a, &b));
    big_free(&a);
    big_free(&b);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cpuadam");
    TCase *tc = tcase_create("variants");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_variants_lengths_1_to_257);
    tcase_add_test(tc, test_variants_all_combinations);
    tcase_add_test(tc, test_variants_planted_specials);
    suite_add_tcase(s, tc);
    tc = tcase_create("reference");
    tcase_add_test(tc, test_reference_matches_torch_vectors);
    tcase_add_test(tc, test_reference_matches_formula_in_double);
    suite_add_tcase(s, tc);
    tc = tcase_create("rollback");
    tcase_add_test(tc, test_rollback_restores_state);
    tcase_add_test(tc, test_rollback_matches_reference);
    suite_add_tcase(s, tc);
    tc = tcase_create("stats");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_grad_stats_all_variants);
    suite_add_tcase(s, tc);
    tc = tcase_create("api");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_team_variants_match_dsp);
    tcase_add_test(tc, test_team_pinned);
    tcase_add_test(tc, test_hparams_defaults_and_old_struct);
    tcase_add_test(tc, test_bad_input);
    suite_add_tcase(s, tc);
    /* the auto-dispatched paths: meson runs this case under each ZO_CPU_MASK level */
    tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_mask_bounds_dispatch);
    tcase_add_test(tc, test_threads_and_tiles_bit_identical);
    tcase_add_test(tc, test_grad_stats_threads);
    tcase_add_test(tc, test_lion_nonfinite_gradient);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return zo_test_run(suite());
}
