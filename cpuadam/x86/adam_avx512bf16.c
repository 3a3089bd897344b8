/* SPDX-License-Identifier: Apache-2.0 */
/* cpuadam kernels for AVX-512 with AVX512-BF16: bf16 outputs and states
 * are rounded with VCVTNEPS2BF16 (one instruction for 16 lanes). It rounds
 * to nearest even and quiets NaN as the reference does, but flushes fp32
 * subnormal inputs (|x| < 2^-126) to a zero of the same sign; the tests
 * allow exactly that difference. The statistics and bound kernels have no
 * conversion and stay those of the avx512 variant. */
#define ZO_KT_CVT_BF16(x) ((__m256i)_mm512_cvtneps_pbh(x))
#include "cpuadam/x86/avx512_layer.h"

/* Data only; the NULL entries keep the avx512 kernels (kernels_ref.c). */
const zo_cpuadam_dsp zo__cpuadam_avx512bf16 = {
    .name = "avx512bf16",
    .step = kt_step,
    .rollback = kt_rollback,
};
