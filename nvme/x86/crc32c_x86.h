/* SPDX-License-Identifier: Apache-2.0 */
/* The SSE4.2 crc32 instruction for nvme/crc32c_hw.h. For files built with
 * SSE4.2 or more only. */
#ifndef ZO_NVME_X86_CRC32C_X86_H
#define ZO_NVME_X86_CRC32C_X86_H

#include <nmmintrin.h>

#define ZO_CRC_U8(reg, byte) _mm_crc32_u8((reg), (byte))
#define ZO_CRC_U64(reg, word) _mm_crc32_u64((reg), (word))
#include "nvme/crc32c_hw.h"

#endif
