/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C with the SSE4.2 crc32 instruction. Compiled with -msse4.2 only.
 * The kernel is the three-lane one of nvme/crc32c_hw.h (it says why). */
#include "nvme/x86/crc32c_x86.h"

uint32_t zo__crc32c_sse42(uint32_t reg, const uint8_t *p, size_t n)
{
    return zo__crc_lanes3(reg, p, n);
}

/* Data only: checksum.c picks it after checking the CPU. */
const zo__crc_dsp zo__crc_sse42 = {
    .name = "sse42",
    .crc32c = zo__crc32c_sse42,
};
