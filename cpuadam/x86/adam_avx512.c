/* cpuadam kernels for AVX-512 F/BW/VL/DQ. Compiled with those flags only.
 * bf16 outputs and states round in integer arithmetic, bit-identical to the
 * C reference conversion. */
#define ZO_KT_CVT_BF16(x) bf16_rne_int(x)
#include "cpuadam/x86/avx512_layer.h"

void zo__cpuadam_dsp_init_avx512(zo_cpuadam_dsp *dsp)
{
    dsp->name = "avx512";
    dsp->step = kt_step;
    dsp->rollback = kt_rollback;
    dsp->grad_stats = kt_grad_stats;
    dsp->stream_bound = kt_stream_bound;
}
