/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file cpu.h
 * @brief CPU feature detection and the dispatch mask.
 *
 * Features are read from CPUID and checked against XGETBV, so a feature only
 * counts when the OS saves its register state (AVX needs YMM state, AVX-512
 * needs opmask + ZMM state). Kernels are picked at run time from
 * `zo_cpu_flags()`, which is the detected set ANDed with a mask. The mask
 * starts as the `ZO_CPU_MASK` environment variable (see zo_cpu_parse_mask())
 * or all-ones, and can be lowered with zo_cpu_set_mask() to force a slower
 * variant (tests do this to run every variant; users to work around a bad
 * CPU). Modules that cache a kernel table re-pick when the mask changes.
 */
#ifndef ZOFFLOAD_CPU_H
#define ZOFFLOAD_CPU_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZO_CPU_SSE42 (1u << 0)
#define ZO_CPU_AVX2 (1u << 1)
#define ZO_CPU_FMA (1u << 2)
#define ZO_CPU_F16C (1u << 3)
#define ZO_CPU_AVX512F (1u << 4)
#define ZO_CPU_AVX512BW (1u << 5)
#define ZO_CPU_AVX512VL (1u << 6)
#define ZO_CPU_AVX512DQ (1u << 7)
#define ZO_CPU_AVX512BF16 (1u << 8)
#define ZO_CPU_AVX512FP16 (1u << 9)
/** VPCLMULQDQ (carry-less multiply on vector registers). Counted with AVX
 *  (YMM state): the CRC32C folding kernel has a 256-bit form for CPUs with
 *  AVX2 but no AVX-512 (Zen 3, Alder Lake) and a 512-bit one. */
#define ZO_CPU_VPCLMULQDQ (1u << 10)
/** aarch64: Advanced SIMD (NEON); every ARMv8-A CPU has it. */
#define ZO_CPU_NEON (1u << 11)
/** aarch64: the ARMv8 CRC32 instructions (CRC32C* for Castagnoli). */
#define ZO_CPU_ARM_CRC32 (1u << 12)
/** aarch64: PMULL/PMULL2 on 64-bit lanes (the crypto extension's). */
#define ZO_CPU_PMULL (1u << 13)
/** aarch64: the Scalable Vector Extension (Grace: SVE2, 4 x 128-bit). */
#define ZO_CPU_SVE (1u << 14)
#define ZO_CPU_ALL 0x7fffu

/** What an "avx2" kernel needs. */
#define ZO_CPU_LEVEL_AVX2 (ZO_CPU_SSE42 | ZO_CPU_AVX2 | ZO_CPU_FMA | ZO_CPU_F16C)
/** What an "avx512" kernel needs. */
#define ZO_CPU_LEVEL_AVX512 \
    (ZO_CPU_LEVEL_AVX2 | ZO_CPU_AVX512F | ZO_CPU_AVX512BW | ZO_CPU_AVX512VL | ZO_CPU_AVX512DQ)

/** What the "neon" kernels need (aarch64). */
#define ZO_CPU_LEVEL_NEON ZO_CPU_NEON

/** Features this CPU and OS support, ignoring the mask. Thread-safe. */
ZO_API unsigned zo_cpu_detected(void);

/** zo_cpu_detected() & the current mask: what kernels may use. Thread-safe. */
ZO_API unsigned zo_cpu_flags(void);

/** The current mask. */
ZO_API unsigned zo_cpu_get_mask(void);

/**
 * Set the process-wide mask (replaces the one from ZO_CPU_MASK). Takes
 * effect for kernel tables picked after the call; calls already running
 * finish with the table they started with. Thread-safe.
 */
ZO_API void zo_cpu_set_mask(unsigned mask);

/**
 * Parse a mask as ZO_CPU_MASK accepts it:
 *  - a level: "scalar" (or "none", "c"), "avx2", "avx512", "all";
 *  - a comma-separated list of feature names as zo_cpu_flag_name() gives
 *    them ("avx2,fma,f16c,sse4.2"); a leading '-' removes a feature from
 *    all ("-avx512bf16");
 *  - a number ("0x1f", "31"); bits above ZO_CPU_ALL are ignored.
 * @return 0, or -EINVAL (NULL, empty, no word, unknown word, a number
 *         out of range; *mask untouched).
 */
ZO_API int zo_cpu_parse_mask(const char *s, unsigned *mask);

/** Name of one feature bit ("avx512bw"), or NULL if not a single known bit. */
ZO_API const char *zo_cpu_flag_name(unsigned bit);

/**
 * Write the names of the set bits of `flags`, space-separated, into buf.
 * @return length written (truncated to len-1), or -EINVAL.
 */
ZO_API int zo_cpu_flags_string(unsigned flags, char *buf, size_t len);

/** Highest level name `flags` satisfies: "avx512", "avx2", "neon" or "scalar". */
ZO_API const char *zo_cpu_level_name(unsigned flags);

/** CPU model string from CPUID (static, "" if unknown). */
ZO_API const char *zo_cpu_model(void);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_CPU_H */
