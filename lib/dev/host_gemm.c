/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend's GEMM: OpenBLAS where the build has it, a plain C loop
 * otherwise. Runs on the calling thread (the stream's worker).
 *
 * OpenBLAS is opened with dlopen on the first GEMM (or zo_gemm_impl), not
 * linked: a pthread OpenBLAS starts ncpu - 1 threads when it is loaded, and
 * every program linking libzoffload paid for them, even one that only runs
 * the optimizer (issue 21). Where it cannot be opened the C loop runs and
 * zo_gemm_impl() says why.
 *
 * bf16/f16 operands: OpenBLAS's cblas_sbgemm where the library exports it
 * (Debian's 0.3.21 declares it in cblas.h but is built without
 * BUILD_BFLOAT16, so meson checks the symbol, not the header); otherwise
 * each operand is widened to f32 with the vec kernels (exact: bf16 and f16
 * are subsets of f32) and multiplied with sgemm. The scratch for that is
 * the op's own heap allocation: it stands for the conversion a GPU does in
 * registers, and is not device memory of the host backend. */
#define ZO_MODULE "dev.host"
#include "dev/dev_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/vec.h>

#if ZO_HAVE_OPENBLAS
/* cblas.h's values, fixed by the CBLAS standard; OpenBLAS's blasint is int
 * outside its 64-bit-integer builds (a different soname, libopenblas64) */
enum { CB_ROW_MAJOR = 101, CB_NO_TRANS = 111, CB_TRANS = 112 };
typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*sbgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                          const uint16_t *b, int ldb, float beta, float *c, int ldc);

static struct {
    pthread_once_t once;
    void *h;
    sgemm_fn sgemm;
    sbgemm_fn sbgemm; /* NULL where the library lacks it (Debian's 0.3.21: built without BUILD_BFLOAT16) */
    char impl[320];
} blas = {.once = PTHREAD_ONCE_INIT};

static void blas_open(void)
{
    /* ZO_OPENBLAS names another copy; then the build's (its pkg-config
     * libdir), then the loader's search path */
    const char *names[] = {getenv("ZO_OPENBLAS"), ZO_OPENBLAS_PATH, "libopenblas.so.0", "libopenblas.so"};
    char why[256] = "";
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !blas.h; i++) {
        if (!names[i] || !names[i][0])
            continue;
        blas.h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!blas.h && !why[0]) {
            const char *e = dlerror();
            snprintf(why, sizeof(why), "%s", e ? e : names[i]);
        }
    }
    if (blas.h) {
        blas.sgemm = (sgemm_fn)(uintptr_t)dlsym(blas.h, "cblas_sgemm");
        blas.sbgemm = (sbgemm_fn)(uintptr_t)dlsym(blas.h, "cblas_sbgemm");
        if (!blas.sgemm) {
            snprintf(why, sizeof(why), "the OpenBLAS opened has no cblas_sgemm");
            dlclose(blas.h);
            blas.h = NULL;
            blas.sbgemm = NULL;
        }
    }
    if (blas.h)
        snprintf(blas.impl, sizeof(blas.impl), "%s", blas.sbgemm ? "openblas+sbgemm" : "openblas");
    else
        snprintf(blas.impl, sizeof(blas.impl), "reference (OpenBLAS not loaded: %s)", why);
    if (!blas.h)
        ZO_LOGW("OpenBLAS cannot be opened (%s): host GEMMs run the plain C loop", why);
}

static void blas_need(void)
{
    pthread_once(&blas.once, blas_open);
}
#endif

const char *zo__host_gemm_impl(void)
{
#if ZO_HAVE_OPENBLAS
    blas_need();
    return blas.impl;
#else
    return "reference";
#endif
}

/* Element (r, c) of op(X) for f32 X. */
static inline float at(const float *x, zo_gemm_op op, size_t ld, size_t r, size_t c)
{
    return op == ZO_GEMM_N ? x[r * ld + c] : x[c * ld + r];
}

static void ref_sgemm(const zo__gemm_args *g, const float *a, size_t lda, const float *b, size_t ldb)
{
    for (size_t i = 0; i < g->m; i++) {
        float *crow = g->c + i * g->ldc;
        for (size_t j = 0; j < g->n; j++) {
            float acc = 0.0f;
            for (size_t p = 0; p < g->k; p++)
                acc += at(a, g->op_a, lda, i, p) * at(b, g->op_b, ldb, p, j);
            /* beta == 0 must not read C: it may hold NaN (BLAS semantics) */
            crow[j] = g->beta == 0.0f ? g->alpha * acc : g->alpha * acc + g->beta * crow[j];
        }
    }
}

static void sgemm(const zo__gemm_args *g, const float *a, size_t lda, const float *b, size_t ldb)
{
#if ZO_HAVE_OPENBLAS
    blas_need();
    if (blas.sgemm) {
        blas.sgemm(CB_ROW_MAJOR, g->op_a == ZO_GEMM_T ? CB_TRANS : CB_NO_TRANS,
                   g->op_b == ZO_GEMM_T ? CB_TRANS : CB_NO_TRANS, (int)g->m, (int)g->n, (int)g->k, g->alpha, a,
                   (int)lda, b, (int)ldb, g->beta, g->c, (int)g->ldc);
        return;
    }
#endif
    ref_sgemm(g, a, lda, b, ldb);
}

/* Widen the stored rows x cols block of x (stride ld) into a packed f32
 * array (stride cols). */
static float *widen(const void *x, zo_dtype t, size_t rows, size_t cols, size_t ld)
{
    size_t bytes;
    if (zo__mul_size(rows, cols, &bytes) < 0 || zo__mul_size(bytes, sizeof(float), &bytes) < 0)
        return NULL;
    float *w = malloc(bytes ? bytes : 1);
    if (!w)
        return NULL;
    size_t esz = zo_dtype_size(t);
    for (size_t r = 0; r < rows; r++)
        zo_vec_cast(w + r * cols, ZO_DTYPE_F32, (const uint8_t *)x + r * ld * esz, t, cols);
    return w;
}

static int run(const zo__gemm_args *g, int reference)
{
    if (g->k == 0) { /* C = beta * C; BLAS would do the same */
        for (size_t i = 0; i < g->m; i++)
            for (size_t j = 0; j < g->n; j++)
                g->c[i * g->ldc + j] = g->beta == 0.0f ? 0.0f : g->beta * g->c[i * g->ldc + j];
        return 0;
    }
    if (g->ab_type == ZO_DTYPE_F32) {
        if (reference)
            ref_sgemm(g, g->a, g->lda, g->b, g->ldb);
        else
            sgemm(g, g->a, g->lda, g->b, g->ldb);
        return 0;
    }
#if ZO_HAVE_OPENBLAS
    if (!reference && g->ab_type == ZO_DTYPE_BF16) {
        blas_need();
        if (blas.sbgemm) {
            blas.sbgemm(CB_ROW_MAJOR, g->op_a == ZO_GEMM_T ? CB_TRANS : CB_NO_TRANS,
                        g->op_b == ZO_GEMM_T ? CB_TRANS : CB_NO_TRANS, (int)g->m, (int)g->n, (int)g->k, g->alpha,
                        g->a, (int)g->lda, g->b, (int)g->ldb, g->beta, g->c, (int)g->ldc);
            return 0;
        }
    }
#endif
    size_t ar = g->op_a == ZO_GEMM_N ? g->m : g->k, ac = g->op_a == ZO_GEMM_N ? g->k : g->m;
    size_t br = g->op_b == ZO_GEMM_N ? g->k : g->n, bc = g->op_b == ZO_GEMM_N ? g->n : g->k;
    float *wa = widen(g->a, g->ab_type, ar, ac, g->lda);
    float *wb = wa ? widen(g->b, g->ab_type, br, bc, g->ldb) : NULL;
    if (!wa || !wb) {
        free(wa);
        return ZO_FAIL(NULL, -ENOMEM, "zo_gemm_async: no memory to widen %s operands (%zu x %zu, %zu x %zu)",
                       zo_dtype_name(g->ab_type), ar, ac, br, bc);
    }
    if (reference)
        ref_sgemm(g, wa, ac, wb, bc);
    else
        sgemm(g, wa, ac, wb, bc);
    free(wa);
    free(wb);
    return 0;
}

int zo__host_gemm_run(const zo__gemm_args *g)
{
    return run(g, 0);
}

int zo__host_gemm_ref(const zo__gemm_args *g)
{
    return run(g, 1);
}
