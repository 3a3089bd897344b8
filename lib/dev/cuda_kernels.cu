/* SPDX-License-Identifier: Apache-2.0 */
// CUDA kernels of the device layer: casts, sum of squares, inf/NaN check.
// Conversions are the host's own (lib/core/fp_convert.h, integer
// arithmetic), so they give exactly the host reference's bits: round to
// nearest even, NaN quieted with its payload kept (the CUDA intrinsics
// return one canonical NaN instead).
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "core/fp_convert.h"

namespace {

/* the host's conversions, compiled for the device too (core/fp_convert.h) */
__device__ __forceinline__ uint16_t f32_to_bf16(float f) { return zo__ref_f32_to_bf16(f); }
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return zo__ref_bf16_to_f32(h); }
__device__ __forceinline__ uint16_t f32_to_f16(float f) { return zo__ref_f32_to_f16(f); }
__device__ __forceinline__ float f16_to_f32(uint16_t h) { return zo__ref_f16_to_f32(h); }

__device__ __forceinline__ float load_as_f32(const void *src, int type, size_t i)
{
    if (type == 0)
        return static_cast<const float *>(src)[i];
    uint16_t h = static_cast<const uint16_t *>(src)[i];
    return type == 1 ? f16_to_f32(h) : bf16_to_f32(h);
}

__global__ void cast_kernel(void *dst, int dt, const void *src, int st, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (st == 0) {
            float v = static_cast<const float *>(src)[i];
            static_cast<uint16_t *>(dst)[i] = dt == 1 ? f32_to_f16(v) : f32_to_bf16(v);
        } else {
            static_cast<float *>(dst)[i] = load_as_f32(src, st, i);
        }
    }
}

__global__ void sumsq_kernel(const void *src, int type, size_t n, double *acc)
{
    __shared__ double warp_sums[32];
    double s = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double v = load_as_f32(src, type, i);
        s += v * v;
    }
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, off);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_sums[warp] = s;
    __syncthreads();
    if (warp == 0) {
        int nw = (blockDim.x + 31) / 32;
        s = lane < nw ? warp_sums[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_down_sync(0xffffffffu, s, off);
        if (lane == 0)
            atomicAdd(acc, s);
    }
}

__global__ void nonfinite_kernel(const void *src, int type, size_t n, int *flag)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    int found = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (type == 0)
            found |= (__float_as_uint(static_cast<const float *>(src)[i]) & 0x7f800000u) == 0x7f800000u;
        else {
            uint16_t h = static_cast<const uint16_t *>(src)[i], m = type == 1 ? 0x7c00 : 0x7f80;
            found |= (h & m) == m;
        }
    }
    if (__syncthreads_or(found) && threadIdx.x == 0)
        *flag = 1;
}

constexpr int kThreads = 256;

unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    // A grid-stride loop needs no more blocks than keep every SM busy.
    return (unsigned)(blocks < 4096 ? (blocks ? blocks : 1) : 4096);
}

} // namespace

/* The ReLU and its backward: dst[i] = mask[i] > 0 ? src[i] : 0 (a NaN mask
 * gives 0). Each lane reads its element before writing it, so dst may be
 * src or mask. */
__global__ void relu_mask_kernel(float *dst, const float *src, const float *mask, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = mask[i] > 0.0f ? src[i] : 0.0f;
}

/* Stands in for a model's compute (zo_dev_busy): one thread of one block
 * polls the global timer (ns since an arbitrary origin, the same on every
 * SM), napping between polls, so the stream is occupied for ns and the SMs
 * and copy engines stay free for the other streams. */
__global__ void busy_kernel(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

extern "C" int zo__cuda_busy(void *stream, unsigned long long ns)
{
    busy_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(ns);
    return (int)cudaGetLastError();
}

extern "C" int zo__cuda_cast(void *stream, void *dst, int dst_type, const void *src, int src_type, size_t n)
{
    cast_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(dst, dst_type, src, src_type, n);
    return (int)cudaGetLastError();
}

extern "C" int zo__cuda_sumsq(void *stream, const void *src, int type, size_t n, double *acc)
{
    sumsq_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(src, type, n, acc);
    return (int)cudaGetLastError();
}

extern "C" int zo__cuda_nonfinite(void *stream, const void *src, int type, size_t n, int *flag)
{
    nonfinite_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(src, type, n, flag);
    return (int)cudaGetLastError();
}

extern "C" int zo__cuda_relu_mask(void *stream, float *dst, const float *src, const float *mask, size_t n)
{
    relu_mask_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(dst, src, mask, n);
    return (int)cudaGetLastError();
}
