/* SPDX-License-Identifier: Apache-2.0 */
/* Vector primitives: C reference kernels, run-time dispatch, public API. */
#define ZO_MODULE "vec"
#include "core/internal.h"
#include "core/dispatch.h"
#include "core/vec_ref.h"

#include <pthread.h>

#include <zoffload/cpu.h>
#include <zoffload/vec.h>

static void c_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = zo__ref_f32_to_bf16(src[i]);
}

static void c_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = zo__ref_f32_to_f16(src[i]);
}

static void c_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = zo__ref_bf16_to_f32(src[i]);
}

static void c_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = zo__ref_f16_to_f32(src[i]);
}

static double c_sumsq_f32(const float *src, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)src[i] * (double)src[i];
    return s;
}

static double c_sumsq_bf16(const uint16_t *src, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double v = zo__ref_bf16_to_f32(src[i]);
        s += v * v;
    }
    return s;
}

static double c_sumsq_f16(const uint16_t *src, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double v = zo__ref_f16_to_f32(src[i]);
        s += v * v;
    }
    return s;
}

static size_t c_nonfinite_f32(const float *src, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += (zo__f32_bits(src[i]) & 0x7f800000u) == 0x7f800000u;
    return c;
}

static size_t c_nonfinite_16(const uint16_t *src, size_t n, uint16_t exp_mask)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += (src[i] & exp_mask) == exp_mask;
    return c;
}

static const zo_vec_dsp c_table = {
    .name = "scalar",
    .f32_to_bf16 = c_f32_to_bf16,
    .f32_to_f16 = c_f32_to_f16,
    .bf16_to_f32 = c_bf16_to_f32,
    .f16_to_f32 = c_f16_to_f32,
    .sumsq_f32 = c_sumsq_f32,
    .sumsq_bf16 = c_sumsq_bf16,
    .sumsq_f16 = c_sumsq_f16,
    .nonfinite_f32 = c_nonfinite_f32,
    .nonfinite_16 = c_nonfinite_16,
};

/* The variants from slowest to fastest, each needing all its predecessors
 * need. Each ISA file gives a constant table (data, no code runs); the
 * usable table of variant v is built here, in baseline code, by laying
 * variants 0..v over each other (core/dispatch.h). Building touches only
 * addresses, so all tables can be built on any CPU; zo__variant_pick()
 * is what keeps a table the CPU cannot run from being handed out. */
ZO_DISPATCH_TABLE_CHECK(zo_vec_dsp);
static const zo__variant variants[] = {
    {0, &c_table},
#if defined(__x86_64__)
    {ZO_CPU_LEVEL_AVX2, &zo__vec_avx2},
    {ZO_CPU_LEVEL_AVX512, &zo__vec_avx512},
    {ZO_CPU_LEVEL_AVX512 | ZO_CPU_AVX512BF16, &zo__vec_avx512bf16},
#elif defined(__aarch64__)
    {ZO_CPU_LEVEL_NEON, &zo__vec_neon},
#endif
};
#define V_COUNT ZO_ARRAY_LEN(variants)
static zo_vec_dsp tables[V_COUNT];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
    zo__variant_overlay(tables, sizeof(tables[0]), variants, V_COUNT);
}

const zo_vec_dsp *zo__vec_dsp_for(unsigned flags)
{
    pthread_once(&tables_once, tables_init);
    return &tables[zo__variant_pick(variants, V_COUNT, flags)];
}

const zo_vec_dsp *zo__vec_dsp(void)
{
    return zo__vec_dsp_for(zo_cpu_flags());
}

ZO_API const char *zo_vec_variant_at(unsigned i, unsigned *needs)
{
    if (i >= V_COUNT)
        return NULL;
    if (needs)
        *needs = variants[i].need;
    return zo__variant_name(&variants[i]);
}

ZO_API const char *zo_vec_variant(void)
{
    return zo__vec_dsp()->name;
}

ZO_API int zo_vec_cast(void *dst, zo_dtype dst_type, const void *src, zo_dtype src_type, size_t n)
{
    if (zo_dtype_size(dst_type) == 0 || zo_dtype_size(src_type) == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_vec_cast: invalid dtype (%d, %d)", dst_type, src_type);
    if (n == 0)
        return 0;
    if (!dst || !src)
        return ZO_FAIL(NULL, -EINVAL, "zo_vec_cast: NULL buffer with n=%zu", n);
    const zo_vec_dsp *d = zo__vec_dsp();
    if (dst_type == src_type) {
        if (dst != src)
            memmove(dst, src, n * zo_dtype_size(src_type));
        return 0;
    }
    if (src_type == ZO_DTYPE_F32 && dst_type == ZO_DTYPE_BF16)
        d->f32_to_bf16(dst, src, n);
    else if (src_type == ZO_DTYPE_F32 && dst_type == ZO_DTYPE_F16)
        d->f32_to_f16(dst, src, n);
    else if (src_type == ZO_DTYPE_BF16 && dst_type == ZO_DTYPE_F32)
        d->bf16_to_f32(dst, src, n);
    else if (src_type == ZO_DTYPE_F16 && dst_type == ZO_DTYPE_F32)
        d->f16_to_f32(dst, src, n);
    else
        return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_vec_cast: %s -> %s not supported",
                       zo_dtype_name(src_type), zo_dtype_name(dst_type));
    return 0;
}

ZO_API int zo_vec_sumsq(const void *src, zo_dtype type, size_t n, double *out)
{
    if (!out || (n && !src))
        return ZO_FAIL(NULL, -EINVAL, "zo_vec_sumsq: NULL argument");
    const zo_vec_dsp *d = zo__vec_dsp();
    switch (type) {
    case ZO_DTYPE_F32: *out = n ? d->sumsq_f32(src, n) : 0; return 0;
    case ZO_DTYPE_BF16: *out = n ? d->sumsq_bf16(src, n) : 0; return 0;
    case ZO_DTYPE_F16: *out = n ? d->sumsq_f16(src, n) : 0; return 0;
    default:
        return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_vec_sumsq: dtype %s not supported", zo_dtype_name(type));
    }
}

ZO_API int zo_vec_nonfinite(const void *src, zo_dtype type, size_t n, size_t *count)
{
    if (!count || (n && !src))
        return ZO_FAIL(NULL, -EINVAL, "zo_vec_nonfinite: NULL argument");
    const zo_vec_dsp *d = zo__vec_dsp();
    switch (type) {
    case ZO_DTYPE_F32: *count = n ? d->nonfinite_f32(src, n) : 0; return 0;
    case ZO_DTYPE_BF16: *count = n ? d->nonfinite_16(src, n, 0x7f80) : 0; return 0;
    case ZO_DTYPE_F16: *count = n ? d->nonfinite_16(src, n, 0x7c00) : 0; return 0;
    default:
        return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_vec_nonfinite: dtype %s not supported",
                       zo_dtype_name(type));
    }
}

ZO_API uint16_t zo_f32_to_bf16(float f) { return zo__ref_f32_to_bf16(f); }
ZO_API float zo_bf16_to_f32(uint16_t h) { return zo__ref_bf16_to_f32(h); }
ZO_API uint16_t zo_f32_to_f16(float f) { return zo__ref_f32_to_f16(f); }
ZO_API float zo_f16_to_f32(uint16_t h) { return zo__ref_f16_to_f32(h); }
