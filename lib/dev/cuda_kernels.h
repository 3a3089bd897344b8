/* SPDX-License-Identifier: Apache-2.0 */
/* Launchers for the CUDA kernels (cuda_kernels.cu), callable from C. Each
 * returns a cudaError_t value (0 = cudaSuccess) from the launch. */
#ifndef ZO_DEV_CUDA_KERNELS_H
#define ZO_DEV_CUDA_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dtype codes as zo_dtype: 0 f32, 1 f16, 2 bf16 */
int zo__cuda_cast(void *stream, void *dst, int dst_type, const void *src, int src_type, size_t n);
int zo__cuda_sumsq(void *stream, const void *src, int type, size_t n, double *acc);
int zo__cuda_nonfinite(void *stream, const void *src, int type, size_t n, int *flag);
/* dst[i] = mask[i] > 0 ? src[i] : 0, f32 (zo_dev_relu_mask) */
int zo__cuda_relu_mask(void *stream, float *dst, const float *src, const float *mask, size_t n);

/* one block that waits on the GPU's global timer for ns nanoseconds (zo_dev_busy) */
int zo__cuda_busy(void *stream, unsigned long long ns);

#ifdef __cplusplus
}
#endif

#endif
