/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file mem.h
 * @brief Host memory: aligned allocation and pinned (page-locked,
 *        NUMA-local) allocation under a process-wide budget.
 *
 * Pinned allocation does, in order: an anonymous mmap (2 MiB huge pages
 * from the hugetlb pool when asked and available, else normal pages with
 * transparent huge pages advised), NUMA binding of the range to a node
 * (libnuma when built with it, the mbind system call otherwise), fault-in of
 * every page on that node, MADV_DONTFORK (so a fork() in the host program
 * does not copy-on-write pages a device or the kernel is using), mlock(),
 * and registration with a device backend when one is given (cudaHostRegister
 * for CUDA), so DMA can use it directly.
 *
 * Locking can be refused (RLIMIT_MEMLOCK, no CAP_IPC_LOCK, a container) and
 * the process-wide budget can run out. Neither is fatal: the allocation
 * falls back to ordinary pageable memory, the reason is logged once per
 * distinct cause at ZO_LOG_WARN, counted in zo_pinned_stats(), and
 * readable per allocation with zo_pinned_query(). Callers that must have
 * locked memory pass ZO_PIN_REQUIRE and get an error instead.
 *
 * Thread safety: all functions are thread-safe.
 */
#ifndef ZOFFLOAD_MEM_H
#define ZOFFLOAD_MEM_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zo_dev;

/**
 * Allocate `size` bytes aligned to `align` (a power of two, at least
 * sizeof(void*)). size 0 -> -EINVAL. Free with zo_aligned_free().
 * @return 0, -EINVAL (bad size/alignment/out), -ENOMEM.
 */
ZO_API int zo_aligned_alloc(void **out, size_t size, size_t align);
/** Free memory from zo_aligned_alloc(); NULL is ignored. */
ZO_API void zo_aligned_free(void *p);

/** Flags for zo_pin_opts.flags and zo_pinned_info.flags. */
#define ZO_PIN_HUGE (1u << 0)     /**< in: try hugetlb 2 MiB pages first; out: backed by hugetlb pages */
#define ZO_PIN_NO_LOCK (1u << 1)  /**< in: do not mlock (NUMA-bound, faulted-in, pageable) */
#define ZO_PIN_REQUIRE (1u << 2)  /**< in: fail (ZO_EBUDGET / -EPERM / -ENOMEM) rather than fall back */
#define ZO_PIN_NO_FAULT (1u << 3) /**< in: skip the fault-in pass (pages appear on first touch) */
#define ZO_PIN_LOCKED (1u << 8)   /**< out: the range is mlock()ed */
#define ZO_PIN_NUMA_BOUND (1u << 9) /**< out: the range is bound to `node` */
#define ZO_PIN_DEV_REGISTERED (1u << 10) /**< out: registered with the device backend */
#define ZO_PIN_THP (1u << 11)     /**< out: transparent huge pages were advised */

/** Options for zo_pinned_alloc(); fill with zo_pin_opts_default(). */
typedef struct zo_pin_opts {
    size_t struct_size;  /**< sizeof(zo_pin_opts), set by the defaults function */
    int numa_node;       /**< node to bind to; -1 = no binding (default) */
    unsigned flags;      /**< ZO_PIN_* input flags; default ZO_PIN_HUGE */
    struct zo_dev *dev;  /**< register with this device backend (NULL: none) */
} zo_pin_opts;

ZO_API void zo_pin_opts_default(zo_pin_opts *o);

/**
 * Allocate `size` bytes of pinned host memory (see the file comment).
 * The returned pointer is page-aligned (2 MiB aligned when huge pages back
 * it) and its contents are zero. `opts` may be NULL for the defaults.
 * @return 0 (possibly unlocked: see zo_pinned_query()), -EINVAL (size 0,
 *         out NULL, bad node, opts->struct_size not that of a known
 *         zo_pin_opts), -ENOMEM (no address space), or, only with
 *         ZO_PIN_REQUIRE, ZO_EBUDGET or the mlock/registration error.
 */
ZO_API int zo_pinned_alloc(void **out, size_t size, const zo_pin_opts *opts);

/** Free memory from zo_pinned_alloc() (unregisters, unlocks). NULL ok. */
ZO_API void zo_pinned_free(void *p);

typedef struct zo_pinned_info {
    size_t size;     /**< bytes asked for */
    size_t mapped;   /**< bytes mapped (rounded up to the page size) */
    int numa_node;   /**< bound node, -1 if none */
    unsigned flags;  /**< ZO_PIN_* output flags */
} zo_pinned_info;

/**
 * Describe the pinned allocation containing `p` (any address inside it).
 * @return 0, or -ENOENT if `p` is not in a live pinned allocation.
 */
ZO_API int zo_pinned_query(const void *p, zo_pinned_info *info);

typedef struct zo_pinned_stats {
    size_t budget;          /**< process-wide budget for locked bytes */
    size_t locked_bytes;    /**< bytes currently locked */
    size_t locked_peak;     /**< high-water mark of locked_bytes */
    size_t unlocked_bytes;  /**< bytes currently allocated but not locked (fallbacks, NO_LOCK) */
    size_t allocations;     /**< live allocations */
    size_t fallbacks;       /**< allocations that wanted locking and did not get it (ever) */
    uint64_t memlock_limit; /**< RLIMIT_MEMLOCK soft limit in bytes (UINT64_MAX: unlimited) */
    int can_lock_unlimited; /**< 1 if the process has CAP_IPC_LOCK */
    char last_fallback[160]; /**< why the last fallback happened ("" if never) */
} zo_pinned_stats;

ZO_API void zo_pinned_stats_get(zo_pinned_stats *st);

/**
 * Set the process-wide budget of locked bytes (default: unlimited by the
 * library; the OS limit still applies). Lowering it below what is already
 * locked affects only later allocations. Returns the previous budget.
 */
ZO_API size_t zo_pinned_set_budget(size_t bytes);

/** System page size and the huge page size used for ZO_PIN_HUGE. */
ZO_API size_t zo_page_size(void);
ZO_API size_t zo_huge_page_size(void);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_MEM_H */
