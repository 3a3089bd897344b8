/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Element i of an f32 / bf16 / f16 buffer as a float, and back (round to
 * nearest even): the engine tests' model tensors in any device dtype.
 */
#ifndef ZO_TEST_DTYPE_H
#define ZO_TEST_DTYPE_H

#include <stdint.h>

#include <zoffload/zoffload.h>

static inline void zo_test_put(void *buf, zo_dtype dt, uint64_t i, float f)
{
    if (dt == ZO_DTYPE_F32)
        ((float *)buf)[i] = f;
    else if (dt == ZO_DTYPE_BF16)
        ((uint16_t *)buf)[i] = zo_f32_to_bf16(f);
    else
        ((uint16_t *)buf)[i] = zo_f32_to_f16(f);
}

static inline float zo_test_get(const void *buf, zo_dtype dt, uint64_t i)
{
    if (dt == ZO_DTYPE_F32)
        return ((const float *)buf)[i];
    if (dt == ZO_DTYPE_BF16)
        return zo_bf16_to_f32(((const uint16_t *)buf)[i]);
    return zo_f16_to_f32(((const uint16_t *)buf)[i]);
}

#endif /* ZO_TEST_DTYPE_H */
