/* SPDX-License-Identifier: Apache-2.0 */
/* cuBLAS for the CUDA backend's GEMM, loaded with dlopen on the first GEMM.
 *
 * The toolkit ships cuBLAS only as a shared library (no libcublas_static.a),
 * and linking it would make libzoffload fail to load wherever it is missing,
 * against the rule that the library loads and runs with no GPU stack. So
 * only the header is used at build time (the function types below come
 * from it: a signature change breaks the build, not the run) and the
 * library of the same major version is opened when a GEMM is first queued.
 * cuBLAS talks to the driver itself; its streams are the driver's, so the
 * cudaStream_t of our statically linked runtime is valid for it.
 *
 * One handle per device ordinal, created on first use and kept for the
 * life of the process (cuBLAS handles are costly to create, and nothing
 * tells us when the last GEMM has run). A cuBLAS handle is not safe to
 * re-point at another stream while a GEMM is being queued on it from
 * another thread, so set-stream + GEMM run under one lock. */
#define ZO_MODULE "dev.cuda"
#include "dev/dev_internal.h"

#include <dlfcn.h>
#include <string.h>

/* cuda_fp16.h / cuda_bf16.h (pulled in by cublas_api.h) test __cplusplus
 * and _MSC_FULL_VER without defining them */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <cublas_v2.h>
#pragma GCC diagnostic pop
#include <cuda_runtime_api.h>

#define ZO_STR2(x) #x
#define ZO_STR(x) ZO_STR2(x)
#define CUBLAS_SONAME "libcublas.so." ZO_STR(CUBLAS_VER_MAJOR)
#define MAX_ORDINALS 64

static struct {
    pthread_mutex_t lock;
    int tried;              /* dlopen attempted (once per process) */
    void *lib;
    char why[192];          /* why it could not be loaded */
    __typeof__(cublasCreate_v2) *create;
    __typeof__(cublasSetStream_v2) *set_stream;
    __typeof__(cublasGemmEx) *gemm_ex;
    __typeof__(cublasGetStatusString) *status_string;
    cublasHandle_t handle[MAX_ORDINALS];
} blas = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Under blas.lock. */
static int load(void)
{
    if (blas.tried)
        return blas.lib ? 0 : ZO_ENOTSUP;
    blas.tried = 1;
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(blas.why, sizeof(blas.why), "%s cannot be loaded (%s)", CUBLAS_SONAME, e ? e : "not found");
        return ZO_ENOTSUP;
    }
    blas.create = (__typeof__(blas.create))dlsym(h, "cublasCreate_v2");
    blas.set_stream = (__typeof__(blas.set_stream))dlsym(h, "cublasSetStream_v2");
    blas.gemm_ex = (__typeof__(blas.gemm_ex))dlsym(h, "cublasGemmEx");
    blas.status_string = (__typeof__(blas.status_string))dlsym(h, "cublasGetStatusString");
    if (!blas.create || !blas.set_stream || !blas.gemm_ex) {
        snprintf(blas.why, sizeof(blas.why), "%s lacks cublasCreate_v2/cublasSetStream_v2/cublasGemmEx",
                 CUBLAS_SONAME);
        dlclose(h);
        return ZO_ENOTSUP;
    }
    blas.lib = h;
    return 0;
}

static const char *status_name(cublasStatus_t st)
{
    return blas.status_string ? blas.status_string(st) : "cuBLAS error";
}

static cudaDataType data_type(zo_dtype t)
{
    switch (t) {
    case ZO_DTYPE_BF16: return CUDA_R_16BF;
    case ZO_DTYPE_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

int zo__cuda_gemm(zo_stream *s, const zo__gemm_args *g)
{
    zo_dev *d = s->dev;
    if (d->ordinal >= MAX_ORDINALS)
        return ZO_FAIL(&d->err, ZO_ENOTSUP, "zo_gemm_async: device ordinal %d above %d", d->ordinal, MAX_ORDINALS);
    cudaError_t ce = cudaSetDevice(d->ordinal);
    if (ce != cudaSuccess)
        return ZO_FAIL(&d->err, ZO_ECUDA, "cudaSetDevice: %s", cudaGetErrorString(ce));
    pthread_mutex_lock(&blas.lock);
    int r = load();
    if (r < 0) {
        pthread_mutex_unlock(&blas.lock);
        return ZO_FAIL(&d->err, r, "zo_gemm_async: cuBLAS unavailable: %s", blas.why);
    }
    cublasStatus_t st;
    if (!blas.handle[d->ordinal]) {
        st = blas.create(&blas.handle[d->ordinal]);
        if (st != CUBLAS_STATUS_SUCCESS) {
            blas.handle[d->ordinal] = NULL;
            pthread_mutex_unlock(&blas.lock);
            return ZO_FAIL(&d->err, ZO_ECUDA, "cublasCreate: %s", status_name(st));
        }
    }
    cublasHandle_t h = blas.handle[d->ordinal];
    st = blas.set_stream(h, (cudaStream_t)s->impl);
    if (st == CUBLAS_STATUS_SUCCESS) {
        /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
         * the same buffers with the operands swapped and m, n swapped. */
        cudaDataType t = data_type(g->ab_type);
        /* k == 0 reads neither A nor B (zo_gemm_async takes any strides
         * then), but cuBLAS still checks them against the shapes and
         * refused 4 x 4 x 0 with lda 0 on the H200: give it strides that
         * pass; C = beta C as BLAS defines it */
        int lda = (int)g->lda, ldb = (int)g->ldb;
        if (g->k == 0)
            lda = ldb = (int)ZO_MAX(ZO_MAX(g->m, g->n), (size_t)1);
        st = blas.gemm_ex(h, g->op_b == ZO_GEMM_T ? CUBLAS_OP_T : CUBLAS_OP_N,
                          g->op_a == ZO_GEMM_T ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n, (int)g->m, (int)g->k,
                          &g->alpha, g->b, t, ldb, g->a, t, lda, &g->beta, g->c, CUDA_R_32F,
                          (int)g->ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    pthread_mutex_unlock(&blas.lock);
    if (st != CUBLAS_STATUS_SUCCESS)
        return ZO_FAIL(&d->err, st == CUBLAS_STATUS_NOT_SUPPORTED ? ZO_ENOTSUP : ZO_ECUDA,
                       "cublasGemmEx (%zu x %zu x %zu, %s): %s", g->m, g->n, g->k, zo_dtype_name(g->ab_type),
                       status_name(st));
    return 0;
}
