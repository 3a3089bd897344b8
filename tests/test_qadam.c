/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized optimizer states (q8, q4): the code maps and the quantizer
 * against a plain reference written here, the quantized step of every
 * variant against the C reference bit for bit (odd lengths, partial last
 * blocks, inf/NaN gradients, 1 and 2 threads), the step against the fp32
 * kernel on the dequantized states, and bad input. */
#include <float.h>
#include <math.h>

#include "zo_test.h"

#include "core/internal.h"
#include "core/vec_ref.h"
#include "cpuadam/cpuadam_internal.h"

#include <zoffload/zoffload.h>

static const char *const variants[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};
/* (m, v) map pairs of the step tests: every unsigned map for v */
static const zo_qmap signed_maps[] = {ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_DYNAMIC_SIGNED,
                                      ZO_QMAP_DYNAMIC_SIGNED};
static const zo_qmap unsigned_maps[] = {ZO_QMAP_DYNAMIC_UNSIGNED, ZO_QMAP_LINEAR_UNSIGNED,
                                        ZO_QMAP_DYNAMIC_UNSIGNED_NZ, ZO_QMAP_LINEAR_UNSIGNED_NZ};

static int map_signed(int m)
{
    return m == ZO_QMAP_DYNAMIC_SIGNED || m == ZO_QMAP_LINEAR_SIGNED;
}

static int map_linear(int m)
{
    return m == ZO_QMAP_LINEAR_SIGNED || m == ZO_QMAP_LINEAR_UNSIGNED || m == ZO_QMAP_LINEAR_UNSIGNED_NZ;
}

/* the unsigned maps without zero (for v: Li et al. 2023's zero-point problem) */
static int map_zero_free(int m)
{
    return m == ZO_QMAP_DYNAMIC_UNSIGNED_NZ || m == ZO_QMAP_LINEAR_UNSIGNED_NZ;
}

static uint32_t fbits(float f)
{
    return zo__f32_bits(f);
}

/* Same bits, or both NaN (which operand's NaN propagates may differ). */
static int same_f32(float a, float b)
{
    return fbits(a) == fbits(b) || (a != a && b != b);
}

/* The quantizer's rule written out plainly: the code of x is the number of
 * midpoints fp32((v[k] + v[k+1]) / 2) below x, over the codes in use. */
typedef struct plain_map {
    int count, used;
    float v[256], mid[255];
} plain_map;

static void plain_map_init(plain_map *p, zo_qmap map, int bits)
{
    p->count = zo_cpuadam_qmap_values(map, bits, p->v);
    ck_assert_int_eq(p->count, 1 << bits);
    /* the codes in use end where the table stops increasing */
    p->used = 1;
    while (p->used < p->count && p->v[p->used] > p->v[p->used - 1])
        p->used++;
    for (int k = 0; k + 1 < p->used; k++)
        p->mid[k] = (float)(((double)p->v[k] + (double)p->v[k + 1]) * 0.5);
}

static unsigned plain_code(const plain_map *p, float x)
{
    unsigned c = 0;
    for (int k = 0; k + 1 < p->used; k++)
        c += x > p->mid[k];
    return c;
}

static float rnd_range(zo_test_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)zo_test_uniform(r);
}

/* A value with a random decimal exponent in [1e-9, 1e1) and sign. */
static float rnd_wide(zo_test_rng *r, int nonneg)
{
    float x = powf(10.0f, rnd_range(r, -9.0f, 1.0f));
    return nonneg || zo_test_uniform(r) < 0.5 ? x : -x;
}

START_TEST(test_maps)
{
    for (int bits = 8; bits >= 4; bits -= 4) {
        for (int m = 0; m < ZO_QMAP_COUNT; m++) {
            plain_map p;
            plain_map_init(&p, (zo_qmap)m, bits);
            int sgn = map_signed(m), lin = map_linear(m), nz = map_zero_free(m);
            /* codes in use: all but one for the signed linear map (an exact 0
             * in the middle) and the dynamic one without zero */
            ck_assert_int_eq(p.used, (lin && sgn) || m == ZO_QMAP_DYNAMIC_UNSIGNED_NZ ? p.count - 1 : p.count);
            ck_assert(p.v[p.used - 1] == 1.0f);
            if (m == ZO_QMAP_LINEAR_UNSIGNED_NZ)
                ck_assert(p.v[0] == 1.0f / (float)p.count && p.v[1] == 2.0f / (float)p.count);
            else if (m == ZO_QMAP_DYNAMIC_UNSIGNED_NZ) { /* the unsigned dynamic map less its 0 */
                plain_map u;
                plain_map_init(&u, ZO_QMAP_DYNAMIC_UNSIGNED, bits);
                ck_assert(memcmp(p.v, u.v + 1, (size_t)p.used * 4) == 0);
            } else
                ck_assert(p.v[0] == (sgn ? (lin ? -1.0f : p.v[0]) : 0.0f));
            int zero = 0;
            for (int k = 0; k < p.used; k++)
                zero |= p.v[k] == 0.0f;
            ck_assert(zero == !nz);
            if (sgn && !lin) /* dynamic signed: symmetric except +1 */
                for (int k = 0; k + 1 < p.used; k++)
                    ck_assert(p.v[k] == -p.v[p.used - 2 - k]);
            /* the bucket lookup (zo__qcode) equals the plain rule on every
             * midpoint, its neighbours and random points of both signs */
            const zo__qmap_tab *t = zo__qmap_get(m, bits);
            ck_assert_ptr_nonnull(t);
            for (int k = 0; k + 1 < p.used; k++) {
                float pts[3] = {p.mid[k], nextafterf(p.mid[k], -1.0f), nextafterf(p.mid[k], 2.0f)};
                for (int q = 0; q < 3; q++)
                    ZO_EXPECT(zo__qcode(t, pts[q]) == plain_code(&p, pts[q]), "map %d bits %d x %a", m, bits,
                              (double)pts[q]);
            }
            zo_test_rng r = {zo_test_seed() + (uint64_t)(m * 16 + bits)};
            for (int i = 0; i < 20000; i++) {
                float x = i & 1 ? rnd_range(&r, -1.0f, 1.0f) : rnd_wide(&r, 0) / 10.0f;
                ZO_EXPECT(zo__qcode(t, x) == plain_code(&p, x), "map %d bits %d x %a", m, bits, (double)x);
            }
            ck_assert_uint_eq(zo__qcode(t, 0.0f), plain_code(&p, 0.0f));
            ck_assert_uint_eq(zo__qcode(t, -0.0f), plain_code(&p, 0.0f));
            ck_assert_uint_eq(zo__qcode(t, 1.0f), (unsigned)p.used - 1);
            ck_assert_uint_eq(zo__qcode(t, 0x1p-149f), plain_code(&p, 0x1p-149f));
        }
    }
    /* dynamic 8-bit: bitsandbytes' first positive values (0.55e-6 ...) */
    float v[256];
    ck_assert_int_eq(zo_cpuadam_qmap_values(ZO_QMAP_DYNAMIC_SIGNED, 8, v), 256);
    ck_assert(v[128] == (float)(1e-6 * 0.55) && v[127] == 0.0f && v[126] == -(float)(1e-6 * 0.55));
    ck_assert_int_eq(zo_cpuadam_qmap_values(ZO_QMAP_COUNT, 8, v), -EINVAL);
    ck_assert_int_eq(zo_cpuadam_qmap_values(ZO_QMAP_LINEAR_SIGNED, 5, v), -EINVAL);
}
END_TEST

/* zo_cpuadam_quantize against the plain rule, and dequantize of its result. */
START_TEST(test_quantize_plain)
{
    zo_test_rng r = {zo_test_seed() + 3};
    size_t ns[] = {1, 63, 64, 65, 255, 256, 257, 1000, 4097};
    for (int bits = 8; bits >= 4; bits -= 4) {
        for (int m = 0; m < ZO_QMAP_COUNT; m++) {
            plain_map p;
            plain_map_init(&p, (zo_qmap)m, bits);
            int nonneg = !map_signed(m);
            for (size_t a = 0; a < ZO_ARRAY_LEN(ns); a++) {
                size_t n = ns[a], block = (size_t)64 << (a % 3), nb = (n - 1) / block + 1;
                float *x = malloc(n * 4), *y = malloc(n * 4), *s = malloc(nb * 4);
                uint8_t *c = malloc(n);
                for (size_t i = 0; i < n; i++)
                    x[i] = rnd_wide(&r, nonneg);
                if (n > 300) { /* a zero block and a NaN block */
                    for (size_t i = 0; i < block; i++)
                        x[i] = i & 1 ? -0.0f : 0.0f;
                    x[block + 3] = NAN;
                    x[n - 1] = INFINITY;
                }
                ck_assert_int_eq(zo_cpuadam_quantize(x, n, (zo_qmap)m, bits, block, c, s), 0);
                ck_assert_int_eq(zo_cpuadam_dequantize(c, s, n, (zo_qmap)m, bits, block, y), 0);
                unsigned zc = plain_code(&p, 0.0f);
                for (size_t b = 0; b < nb; b++) {
                    size_t i0 = b * block, len = ZO_MIN(block, n - i0);
                    float amax = 0;
                    int bad = 0;
                    for (size_t i = i0; i < i0 + len; i++) {
                        bad |= !isfinite(x[i]);
                        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
                    }
                    if (bad)
                        ZO_EXPECT(s[b] != s[b], "n %zu block %zu: scale %g, want NaN", n, b, (double)s[b]);
                    else
                        ZO_EXPECT(fbits(s[b]) == fbits(amax), "n %zu block %zu scale", n, b);
                    for (size_t i = i0; i < i0 + len; i++) {
                        unsigned want = bad || amax == 0 ? zc : plain_code(&p, x[i] / amax);
                        unsigned got = bits == 8 ? c[i] : (c[i / 2] >> (4 * (i & 1))) & 15;
                        ZO_EXPECT(got == want, "map %d bits %d n %zu x[%zu] %a code %u want %u", m, bits, n, i,
                                  (double)x[i], got, want);
                        ZO_EXPECT(same_f32(y[i], p.v[got] * s[b]), "dequantize [%zu]", i);
                    }
                }
                if (bits == 4 && n % 2)
                    ck_assert_uint_eq(c[n / 2] >> 4, 0);
                free(x);
                free(y);
                free(s);
                free(c);
            }
        }
    }
}
END_TEST

/* Every variant's block kernels against the reference ones on inputs
 * whose quotients x / absmax (zo__qquot) land on a midpoint, next to one, on a value,
 * and anywhere: the code search is the part each ISA does its own way
 * (bucket gathers, packed buckets, in-register binary search). */
START_TEST(test_block_kernels)
{
    zo_test_rng r = {zo_test_seed() + 5};
    static const size_t lens[] = {1, 7, 8, 9, 15, 16, 17, 63, 64, 255, 256, 4096};
    float *x = malloc(ZO__QBLOCK_MAX * 4), *y0 = malloc(ZO__QBLOCK_MAX * 4), *y1 = malloc(ZO__QBLOCK_MAX * 4);
    uint8_t c0[ZO__QBLOCK_MAX], c1[ZO__QBLOCK_MAX + 1]; /* + a byte that must stay */
    for (size_t v = 1; v < ZO_ARRAY_LEN(variants); v++) {
        unsigned need = 0;
        const zo_cpuadam_dsp *d = zo__cpuadam_dsp_named(variants[v], &need);
        if (!d || (zo_cpu_flags() & need) != need || !d->qquant || !d->qdequant)
            continue;
        for (int bits = 8; bits >= 4; bits -= 4) {
            for (int m = 0; m < ZO_QMAP_COUNT; m++) {
                const zo__qmap_tab *t = zo__qmap_get(m, bits);
                ck_assert_ptr_nonnull(t);
                int nonneg = !map_signed(m);
                for (size_t a = 0; a < ZO_ARRAY_LEN(lens); a++) {
                    for (int rep = 0; rep < 7; rep++) {
                        size_t len = lens[a];
                        /* rep 0, 1: absmax 1 (quotient = x); 2, 3: a random scale;
                         * 4-6: where zo__qquot() divides instead of multiplying by
                         * 1 / absmax (a subnormal absmax, 2^125, 3e38) */
                        static const float edge[] = {1e-39f, 0x1p125f, 3e38f};
                        float sc = rep < 2 ? 1.0f : rep < 4 ? rnd_wide(&r, 1) : edge[rep - 4];
                        for (size_t i = 0; i < len; i++) {
                            int k = (int)(zo_test_uniform(&r) * (t->ncodes - 1));
                            float q = t->mid[k];
                            switch ((i + (size_t)rep) % 5) {
                            case 0: break;
                            case 1: q = nextafterf(q, 2.0f); break;
                            case 2: q = nextafterf(q, -2.0f); break;
                            case 3: q = t->value[k]; break;
                            default: q = rnd_range(&r, -1.0f, 1.0f); break;
                            }
                            if (nonneg)
                                q = fabsf(q);
                            else if (zo_test_uniform(&r) < 0.25)
                                q = -q;
                            x[i] = fminf(fmaxf(q, -1.0f), 1.0f) * sc;
                        }
                        x[(len - 1) / 2] = rep & 1 && !nonneg ? -sc : sc; /* the block's absmax */
                        if (rep == 3 && len > 2)
                            x[len - 1] = len % 2 ? 0.0f : -0.0f;
                        float s0 = 0, s1 = 0;
                        zo__q_quant_ref(x, len, t, bits, c0, &s0);
                        d->qquant(x, len, t, bits, c1, &s1);
                        size_t nb = bits == 8 ? len : (len + 1) / 2;
                        ck_assert_msg(fbits(s0) == fbits(s1), "%s scale", variants[v]);
                        for (size_t i = 0; i < nb; i++)
                            ck_assert_msg(c0[i] == c1[i], "%s map %d bits %d len %zu rep %d: byte %zu %#x want %#x",
                                          variants[v], m, bits, len, rep, i, c1[i], c0[i]);
                        zo__q_dequant_ref(c0, bits, t, s0, y0, len);
                        d->qdequant(c0, bits, t, s0, y1, len);
                        for (size_t i = 0; i < len; i++)
                            ck_assert_msg(same_f32(y0[i], y1[i]), "%s dequant [%zu]", variants[v], i);
                    }
                    /* blocks without a finite nonzero scale: all zeros, an
                     * inf, a NaN (every code the zero code, odd tails too) */
                    static const float special[] = {0.0f, INFINITY, NAN};
                    for (size_t sp = 0; sp < ZO_ARRAY_LEN(special); sp++) {
                        size_t len = lens[a];
                        for (size_t i = 0; i < len; i++)
                            x[i] = sp ? rnd_range(&r, -1.0f, 1.0f) : -0.0f;
                        x[len / 2] = special[sp];
                        float s0 = 0, s1 = 0;
                        memset(c1, 0xa5, sizeof c1);
                        zo__q_quant_ref(x, len, t, bits, c0, &s0);
                        d->qquant(x, len, t, bits, c1, &s1);
                        size_t nb = bits == 8 ? len : (len + 1) / 2;
                        ck_assert_msg(fbits(s0) == fbits(s1), "%s special %zu scale", variants[v], sp);
                        ck_assert_msg(memcmp(c0, c1, nb) == 0, "%s special %zu map %d bits %d len %zu",
                                      variants[v], sp, m, bits, len);
                        ck_assert_msg(c1[nb] == 0xa5, "%s wrote past the block: special %zu map %d bits %d len %zu", variants[v], sp, m, bits, len);
                    }
                }
            }
        }
    }
    free(x);
    free(y0);
    free(y1);
}
END_TEST

/* One slice with quantized states and a copy to compare. */
typedef struct qslice {
    size_t n, block, nb, cbytes;
    int bits, gdt, odt; /* odt < 0: no out copy */
    float *p, *ms, *vs;
    void *g, *out;
    uint8_t *mc, *vc;
} qslice;

static void qs_init(qslice *s, size_t n, size_t block, int bits, int gdt, int odt)
{
    memset(s, 0, sizeof(*s));
    s->n = n;
    s->block = block;
    s->nb = (n - 1) / block + 1;
    s->bits = bits;
    s->gdt = gdt;
    s->odt = odt;
    s->cbytes = bits == 8 ? n : (n + 1) / 2;
    s->p = malloc(n * 4);
    s->g = malloc(n * 4);
    s->out = malloc(n * 4);
    s->mc = malloc(s->cbytes);
    s->vc = malloc(s->cbytes);
    s->ms = malloc(s->nb * 4);
    s->vs = malloc(s->nb * 4);
}

static void qs_free(qslice *s)
{
    free(s->p);
    free(s->g);
    free(s->out);
    free(s->mc);
    free(s->vc);
    free(s->ms);
    free(s->vs);
}

static void qs_copy(qslice *d, const qslice *s)
{
    qs_init(d, s->n, s->block, s->bits, s->gdt, s->odt);
    memcpy(d->p, s->p, s->n * 4);
    memcpy(d->g, s->g, s->n * 4);
    memcpy(d->out, s->out, s->n * 4);
    memcpy(d->mc, s->mc, s->cbytes);
    memcpy(d->vc, s->vc, s->cbytes);
    memcpy(d->ms, s->ms, s->nb * 4);
    memcpy(d->vs, s->vs, s->nb * 4);
}

static void store_g(void *g, int t, size_t i, float x)
{
    if (t == ZO__T_F32)
        ((float *)g)[i] = x;
    else if (t == ZO__T_BF16)
        ((uint16_t *)g)[i] = zo__ref_f32_to_bf16(x);
    else
        ((uint16_t *)g)[i] = zo__ref_f32_to_f16(x);
}

static void qs_fill(qslice *s, zo_test_rng *r, zo_qmap mm, zo_qmap vm)
{
    for (size_t i = 0; i < s->n; i++) {
        s->p[i] = rnd_range(r, -1.0f, 1.0f);
        store_g(s->g, s->gdt, i, rnd_wide(r, 0) * 1e-2f);
    }
    /* states: quantized random moments (m signed, v = m'^2-like) */
    float *x = malloc(s->n * 4);
    for (size_t i = 0; i < s->n; i++)
        x[i] = rnd_wide(r, 0) * 1e-3f;
    ck_assert_int_eq(zo_cpuadam_quantize(x, s->n, mm, s->bits, s->block, s->mc, s->ms), 0);
    for (size_t i = 0; i < s->n; i++)
        x[i] = rnd_wide(r, 1) * 1e-6f;
    ck_assert_int_eq(zo_cpuadam_quantize(x, s->n, vm, s->bits, s->block, s->vc, s->vs), 0);
    free(x);
}

static void qs_tensors(qslice *s, zo_cpuadam_qtensors *t, zo_qmap mm, zo_qmap vm)
{
    zo_cpuadam_qtensors_default(t);
    t->n = s->n;
    t->param = s->p;
    t->grad = s->g;
    t->grad_dtype = (zo_dtype)s->gdt;
    t->bits = s->bits;
    t->block = s->block;
    t->map_m = mm;
    t->map_v = vm;
    t->m_codes = s->mc;
    t->m_absmax = s->ms;
    t->v_codes = s->vc;
    t->v_absmax = s->vs;
    t->param_out = s->odt >= 0 ? s->out : NULL;
    t->out_dtype = s->odt >= 0 ? (zo_dtype)s->odt : ZO_DTYPE_BF16;
}

static void qs_expect_equal(const qslice *a, const qslice *b, int lion, const char *what)
{
    for (size_t i = 0; i < a->n; i++)
        ZO_EXPECT(same_f32(a->p[i], b->p[i]), "%s: p[%zu] %a vs %a", what, i, (double)a->p[i], (double)b->p[i]);
    size_t ob = a->odt < 0 ? 0 : a->n * (a->odt == ZO__T_F32 ? 4 : 2);
    for (size_t i = 0; i < ob / 2; i++) { /* NaN out copies are the same quieted bits */
        uint16_t x = ((uint16_t *)a->out)[i], y = ((uint16_t *)b->out)[i];
        ZO_EXPECT(x == y || a->odt == ZO__T_F32, "%s: out half-word %zu", what, i);
    }
    ck_assert_msg(memcmp(a->mc, b->mc, a->cbytes) == 0, "%s: m codes differ", what);
    for (size_t k = 0; k < a->nb; k++)
        ZO_EXPECT(fbits(a->ms[k]) == fbits(b->ms[k]), "%s: m absmax[%zu]", what, k);
    if (!lion) {
        ck_assert_msg(memcmp(a->vc, b->vc, a->cbytes) == 0, "%s: v codes differ", what);
        for (size_t k = 0; k < a->nb; k++)
            ZO_EXPECT(fbits(a->vs[k]) == fbits(b->vs[k]), "%s: v absmax[%zu]", what, k);
    }
}

static zo_cpuadam_team *team_for(const char *name, int nthreads)
{
    zo_cpuadam_team_config cfg;
    zo_cpuadam_team_config_default(&cfg);
    cfg.nthreads = nthreads;
    cfg.variant = name;
    zo_cpuadam_team *tm = NULL;
    if (zo_cpuadam_team_create(&tm, &cfg) != 0)
        return NULL;
    return tm;
}

static const zo_optim_kind kinds[] = {ZO_OPTIM_ADAMW, ZO_OPTIM_ADAM, ZO_OPTIM_LION};

static void hparams_for(zo_cpuadam_hparams *hp, zo_optim_kind k, int step)
{
    zo_cpuadam_hparams_default(hp, k);
    hp->step = step;
    hp->weight_decay = 0.01;
    hp->grad_scale = 0.5;
    hp->clip_coef = 0.75;
}

/* Every variant this CPU runs against the scalar reference, bit for bit. */
static void variants_case(size_t n, size_t block, int bits, int gdt, int odt, int special, uint64_t seed)
{
    zo_cpuadam_team *ref = team_for("scalar", 1);
    ck_assert_ptr_nonnull(ref);
    for (size_t kk = 0; kk < ZO_ARRAY_LEN(kinds); kk++) {
        for (int mi = 0; mi < (int)ZO_ARRAY_LEN(signed_maps); mi++) {
            zo_qmap mm = signed_maps[mi], vm = unsigned_maps[mi];
            zo_test_rng r = {seed + kk * 7 + (uint64_t)mi};
            qslice base;
            qs_init(&base, n, block, bits, gdt, odt);
            qs_fill(&base, &r, mm, vm);
            if (special) { /* inf and NaN gradients in the first and last blocks */
                store_g(base.g, gdt, 0, INFINITY);
                store_g(base.g, gdt, n - 1, n > 1 ? NAN : -INFINITY);
            }
            zo_cpuadam_hparams hp;
            hparams_for(&hp, kinds[kk], 3);
            qslice want;
            qs_copy(&want, &base);
            zo_cpuadam_qtensors t;
            qs_tensors(&want, &t, mm, vm);
            ck_assert_int_eq(zo_cpuadam_team_qstep(ref, &hp, &t), 0);
            if (special) {
                ck_assert(want.ms[0] != want.ms[0]); /* the rule: NaN scale for the block */
                ck_assert(kinds[kk] == ZO_OPTIM_LION || want.vs[want.nb - 1] != want.vs[want.nb - 1]);
            }
            for (size_t v = 1; v < ZO_ARRAY_LEN(variants); v++) {
                for (int th = 1; th <= 2; th++) {
                    zo_cpuadam_team *tm = team_for(variants[v], th);
                    if (!tm)
                        continue; /* not this CPU's */
                    qslice got;
                    qs_copy(&got, &base);
                    qs_tensors(&got, &t, mm, vm);
                    ck_assert_int_eq(zo_cpuadam_team_qstep(tm, &hp, &t), 0);
                    char what[160];
                    snprintf(what, sizeof(what), "%s x%d kind %d map %d n %zu block %zu bits %d g %d out %d%s",
                             variants[v], th, (int)kinds[kk], mi, n, block, bits, gdt, odt,
                             special ? " specials" : "");
                    qs_expect_equal(&want, &got, kinds[kk] == ZO_OPTIM_LION, what);
                    qs_free(&got);
                    zo_cpuadam_team_destroy(&tm);
                }
            }
            qs_free(&want);
            qs_free(&base);
        }
    }
    zo_cpuadam_team_destroy(&ref);
}

START_TEST(test_variants_bit_identical)
{
    static const size_t ns[] = {1, 7, 63, 64, 65, 129, 255, 256, 257, 1000, 4099};
    for (size_t a = 0; a < ZO_ARRAY_LEN(ns); a++) {
        size_t n = ns[a];
        variants_case(n, 64, 8, ZO__T_F32, -1, 0, 11 + a);
        variants_case(n, 256, 4, ZO__T_BF16, ZO__T_BF16, 0, 13 + a);
        variants_case(n, 128, 8, ZO__T_F16, ZO__T_F16, a % 2, 17 + a);
        variants_case(n, 192, 4, ZO__T_F32, ZO__T_F32, 1, 19 + a);
    }
}
END_TEST

/* Large slices: threads split at blocks, so 1 and 2 threads agree; and
 * the auto-dispatched plain function agrees with the scalar team. */
START_TEST(test_threads_bit_identical)
{
    size_t n = 300007;
    for (int bits = 8; bits >= 4; bits -= 4) {
        for (size_t kk = 0; kk < ZO_ARRAY_LEN(kinds); kk++) {
            zo_test_rng r = {zo_test_seed() + 99 + kk};
            qslice base, a, b;
            qs_init(&base, n, bits == 8 ? 256 : 128, bits, ZO__T_BF16, ZO__T_BF16);
            qs_fill(&base, &r, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
            qs_copy(&a, &base);
            qs_copy(&b, &base);
            zo_cpuadam_hparams hp;
            hparams_for(&hp, kinds[kk], 2);
            zo_cpuadam_qtensors t;
            qs_tensors(&a, &t, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
            t.block = 0; /* the default: 256 for 8 bits, 128 for 4 */
            ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), 0);
            qs_tensors(&b, &t, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
            ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 2), 0);
            qs_expect_equal(&a, &b, kinds[kk] == ZO_OPTIM_LION, "1 vs 2 threads");
            zo_cpuadam_team *ref = team_for("scalar", 2);
            qslice c;
            qs_copy(&c, &base);
            qs_tensors(&c, &t, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
            ck_assert_int_eq(zo_cpuadam_team_qstep(ref, &hp, &t), 0);
            qs_expect_equal(&a, &c, kinds[kk] == ZO_OPTIM_LION, "auto vs scalar");
            zo_cpuadam_team_destroy(&ref);
            qs_free(&a);
            qs_free(&b);
            qs_free(&c);
            qs_free(&base);
        }
    }
}
END_TEST

/* The quantized step is the fp32 step on the dequantized moments, then
 * zo_cpuadam_quantize of the new moments. */
START_TEST(test_matches_fp32_step)
{
    size_t n = 5000, block = 256;
    for (int bits = 8; bits >= 4; bits -= 4) {
        for (size_t kk = 0; kk < ZO_ARRAY_LEN(kinds); kk++) {
            int lion = kinds[kk] == ZO_OPTIM_LION;
            zo_test_rng r = {zo_test_seed() + 5 + kk};
            qslice q;
            qs_init(&q, n, block, bits, ZO__T_F32, ZO__T_BF16);
            qs_fill(&q, &r, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
            float *p = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4), *ms = malloc(q.nb * 4),
                  *vs = malloc(q.nb * 4);
            uint16_t *out = malloc(n * 2);
            uint8_t *mc = malloc(q.cbytes), *vc = malloc(q.cbytes);
            memcpy(p, q.p, n * 4);
            ck_assert_int_eq(zo_cpuadam_dequantize(q.mc, q.ms, n, ZO_QMAP_DYNAMIC_SIGNED, bits, block, m), 0);
            ck_assert_int_eq(zo_cpuadam_dequantize(q.vc, q.vs, n, ZO_QMAP_DYNAMIC_UNSIGNED, bits, block, v), 0);
            zo_cpuadam_hparams hp;
            hparams_for(&hp, kinds[kk], 4);
            zo_cpuadam_tensors ft;
            zo_cpuadam_tensors_default(&ft);
            ft.n = n;
            ft.param = p;
            ft.grad = q.g;
            ft.exp_avg = m;
            ft.exp_avg_sq = v;
            ft.param_out = out;
            ck_assert_int_eq(zo_cpuadam_step(&hp, &ft, 2), 0);
            ck_assert_int_eq(zo_cpuadam_quantize(m, n, ZO_QMAP_DYNAMIC_SIGNED, bits, block, mc, ms), 0);
            ck_assert_int_eq(zo_cpuadam_quantize(v, n, ZO_QMAP_DYNAMIC_UNSIGNED, bits, block, vc, vs), 0);
            zo_cpuadam_qtensors t;
            qs_tensors(&q, &t, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
            ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 2), 0);
            ck_assert(memcmp(p, q.p, n * 4) == 0);
            ck_assert(memcmp(out, q.out, n * 2) == 0);
            ck_assert(memcmp(mc, q.mc, q.cbytes) == 0 && memcmp(ms, q.ms, q.nb * 4) == 0);
            if (!lion)
                ck_assert(memcmp(vc, q.vc, q.cbytes) == 0 && memcmp(vs, q.vs, q.nb * 4) == 0);
            free(p);
            free(m);
            free(v);
            free(ms);
            free(vs);
            free(out);
            free(mc);
            free(vc);
            qs_free(&q);
        }
    }
}
END_TEST

START_TEST(test_bad_input)
{
    qslice s;
    qs_init(&s, 1000, 256, 8, ZO__T_F32, -1);
    zo_test_rng r = {1};
    qs_fill(&s, &r, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW);
    zo_cpuadam_qtensors t;
    qs_tensors(&s, &t, ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED);
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), 0);
    t.bits = 5;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.bits = 8;
    t.block = 100;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.block = 8192;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.block = 256;
    t.map_v = ZO_QMAP_DYNAMIC_SIGNED;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "unsigned"));
    t.map_v = ZO_QMAP_COUNT;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.map_v = ZO_QMAP_DYNAMIC_UNSIGNED;
    t.v_codes = s.mc; /* overlaps m's codes */
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.v_codes = NULL;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.v_codes = s.vc;
    t.n = 0;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.n = s.n;
    t.struct_size = 8;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), -EINVAL);
    t.struct_size = sizeof(t);
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 0), -EINVAL);
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAGRAD);
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), ZO_ENOTSUP);
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_LION); /* v is not needed */
    t.v_codes = NULL;
    t.v_absmax = NULL;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), 0);
    hp.lr = -1;
    ck_assert_int_eq(zo_cpuadam_qstep(&hp, &t, 1), ZO_ECONFIG);
    float x[4] = {0};
    uint8_t c[4];
    float sc[1];
    ck_assert_int_eq(zo_cpuadam_quantize(x, 4, ZO_QMAP_LINEAR_SIGNED, 8, 0, c, sc), -EINVAL);
    ck_assert_int_eq(zo_cpuadam_quantize(x, 4, ZO_QMAP_LINEAR_SIGNED, 3, 64, c, sc), -EINVAL);
    ck_assert_int_eq(zo_cpuadam_quantize(x, 4, ZO_QMAP_COUNT, 8, 64, c, sc), -EINVAL);
    ck_assert_int_eq(zo_cpuadam_quantize(NULL, 4, ZO_QMAP_LINEAR_SIGNED, 8, 64, c, sc), -EINVAL);
    ck_assert_int_eq(zo_cpuadam_dequantize(c, sc, 0, ZO_QMAP_LINEAR_SIGNED, 8, 64, x), -EINVAL);
    ck_assert_int_eq(zo_cpuadam_qtensors_default(NULL), -EINVAL);
    qs_free(&s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("qadam");
    TCase *tc = tcase_create("maps");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_maps);
    tcase_add_test(tc, test_quantize_plain);
    tcase_add_test(tc, test_block_kernels);
    suite_add_tcase(s, tc);
    tc = tcase_create("variants");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_variants_bit_identical);
    suite_add_tcase(s, tc);
    /* large slices: split so an emulated run can take the variants alone */
    tc = tcase_create("api");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_threads_bit_identical);
    tcase_add_test(tc, test_matches_fp32_step);
    tcase_add_test(tc, test_bad_input);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return zo_test_run(suite());
}
