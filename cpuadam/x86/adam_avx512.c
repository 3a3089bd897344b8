/* SPDX-License-Identifier: Apache-2.0 */
/* cpuadam kernels for AVX-512 F/BW/VL/DQ. Compiled with those flags only.
 * bf16 outputs and states round in integer arithmetic, bit-identical to the
 * C reference conversion. */
#define ZO_KT_CVT_BF16(x) bf16_rne_int(x)
#include "cpuadam/x86/avx512_layer.h"

/* Data only: generic code (kernels_ref.c) picks it after checking the CPU. */
const zo_cpuadam_dsp zo__cpuadam_avx512 = {
    .name = "avx512",
    .step = kt_step,
    .rollback = kt_rollback,
    .grad_stats = kt_grad_stats,
    .stream_bound = kt_stream_bound,
};
