/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C with the ARMv8 CRC32C instructions (optional in ARMv8.0,
 * mandatory from ARMv8.1). Compiled with +crc only. The kernel is the
 * three-lane one of nvme/crc32c_hw.h (it says why). */
#include "nvme/arm/crc32c_arm.h"

uint32_t zo__crc32c_armv8(uint32_t reg, const uint8_t *p, size_t n)
{
    return zo__crc_lanes3(reg, p, n);
}

/* Data only: checksum.c picks it after checking the CPU. */
const zo__crc_dsp zo__crc_armv8 = {
    .name = "armv8",
    .crc32c = zo__crc32c_armv8,
};
