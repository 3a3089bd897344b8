/* SPDX-License-Identifier: Apache-2.0 */
/* The ARMv8 CRC32C instructions for nvme/crc32c_hw.h. For files built with
 * +crc only. */
#ifndef ZO_NVME_ARM_CRC32C_ARM_H
#define ZO_NVME_ARM_CRC32C_ARM_H

#include <arm_acle.h>

#define ZO_CRC_U8(reg, byte) __crc32cb((uint32_t)(reg), (byte))
#define ZO_CRC_U64(reg, word) __crc32cd((uint32_t)(reg), (word))
#include "nvme/crc32c_hw.h"

#endif
