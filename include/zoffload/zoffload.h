/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file zoffload.h
 * @brief Umbrella header: includes every public zoffload header.
 *
 * zoffload is a heterogeneous-memory offload engine: it keeps fp32 master
 * weights and optimizer states in GPU memory, pinned host memory or NVMe,
 * moves them with io_uring and updates them with run-time-dispatched SIMD
 * CPU optimizers. See docs/api.md for a guided tour and a complete example.
 */
#ifndef ZOFFLOAD_H
#define ZOFFLOAD_H

#include "version.h"
#include "common.h"
#include "cpu.h"
#include "mem.h"
#include "topo.h"
#include "vec.h"
#include "dev.h"
#include "aio.h"
#include "swap.h"
#include "store.h"
#include "cpuadam.h"
#include "tiling.h"
#include "optim.h"
#include "optim_json.h"
#include "part.h"

#endif /* ZOFFLOAD_H */
