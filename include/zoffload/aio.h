/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file aio.h
 * @brief Asynchronous file I/O: files opened for O_DIRECT where possible,
 *        and an engine (io_uring rings, or a pread/pwrite thread pool) that
 *        splits requests into blocks, keeps a queue depth per thread, and
 *        checks every completion.
 *
 * Files (zo_file)
 *   Opened with O_DIRECT when the filesystem allows it; alignment comes
 *   from statx(STATX_DIOALIGN) with a block-size fallback, never below 4096
 *   (nor the page size) for offsets and lengths. Where O_DIRECT is refused
 *   the file is opened buffered and the fallback is reported (log +
 *   zo_file_info). Requests of any length, at any offset, from any buffer
 *   address are exact: the parts that cannot go direct (an unaligned head
 *   or tail, a buffer address the device cannot DMA to) go through a second,
 *   buffered descriptor of the same file, which the kernel keeps coherent
 *   with direct I/O (see docs/aio.md). Files created are mode 0600, opened
 *   O_CLOEXEC.
 *
 * Engine (zo_aio)
 *   A request (file, buffer, length, offset) is split into block_size
 *   chunks spread over the engine's I/O threads; each thread owns one ring
 *   with queue_depth entries in flight. Buffers inside a region registered
 *   with zo_aio_register_region() use fixed-buffer I/O. Short transfers are
 *   resumed, -EAGAIN retried (bounded), other errors fail that request with
 *   their code while other requests carry on. Errors of requests nobody
 *   waits for individually are reported by zo_aio_wait_all().
 *
 * Thread safety: a zo_aio may be used from any number of threads. A zo_file
 * may be used by several engines and threads at once.
 */
#ifndef ZOFFLOAD_AIO_H
#define ZOFFLOAD_AIO_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_file zo_file;
typedef struct zo_aio zo_aio;
typedef struct zo_aio_req zo_aio_req;

/* ---- files ------------------------------------------------------------------ */
/** Flags for zo_file_open(). */
#define ZO_FILE_READ (1u << 0)
#define ZO_FILE_WRITE (1u << 1)
#define ZO_FILE_CREATE (1u << 2)   /**< create if missing (mode 0600) */
#define ZO_FILE_TRUNC (1u << 3)    /**< truncate to 0 on open (needs WRITE) */
#define ZO_FILE_EXCL (1u << 4)     /**< with CREATE: fail (-EEXIST) if it exists */
#define ZO_FILE_BUFFERED (1u << 5) /**< do not try O_DIRECT */
#define ZO_FILE_REQUIRE_DIRECT (1u << 6) /**< fail (ZO_ENOTSUP) if O_DIRECT is refused */
#define ZO_FILE_NOFOLLOW (1u << 7) /**< refuse a symlink as the last component */

typedef struct zo_file_info {
    int direct;             /**< 1 if opened with O_DIRECT */
    uint32_t offset_align;  /**< alignment of direct offsets and lengths (>= 4096; 1 if buffered) */
    uint32_t mem_align;     /**< alignment of direct buffer addresses (1 if buffered) */
    uint64_t size;          /**< current size in bytes */
    char fallback[128];     /**< why O_DIRECT was not used ("" if it is) */
} zo_file_info;

/**
 * Open a regular file (or a block device).
 * @param out    receives the handle; set to NULL on failure.
 * @param path   file path.
 * @param flags  ZO_FILE_* bits; READ and/or WRITE is required.
 * @return 0; -EINVAL (no READ/WRITE, unknown flag, TRUNC without WRITE,
 *         NULL path/out, not a regular file or block device); -ENOENT,
 *         -EACCES, -EROFS, -EISDIR, -EEXIST (EXCL), -ELOOP (NOFOLLOW on a
 *         symlink) and other -errno from open(2); ZO_ENOTSUP (REQUIRE_DIRECT
 *         and O_DIRECT refused); -ENOMEM.
 * Thread-safe. Blocks for the open system calls.
 */
ZO_API int zo_file_open(zo_file **out, const char *path, unsigned flags);
/**
 * Close (NULL ok; clears *f). The caller must not have requests in flight
 * on it. Engines that registered the file with their rings drop it.
 */
ZO_API void zo_file_close(zo_file **f);
/** Describe f (size read now with fstat). @return 0, -EINVAL, -errno. */
ZO_API int zo_file_get_info(zo_file *f, zo_file_info *info);
/** The path given to zo_file_open() ("" for NULL). Valid until close. */
ZO_API const char *zo_file_path(const zo_file *f);
/**
 * Reserve [offset, offset+len) on disk with fallocate(), so a full disk is
 * found now rather than mid-write. Extends the file size if needed.
 * @return 0, -EINVAL (len 0, overflow), -EBADF (not open for writing),
 *         -ENOSPC, -EOPNOTSUPP (filesystem cannot; nothing reserved), -errno.
 */
ZO_API int zo_file_allocate(zo_file *f, uint64_t offset, uint64_t len);
/** Set the file size (ftruncate). @return 0, -EINVAL, -EBADF, -errno. */
ZO_API int zo_file_truncate(zo_file *f, uint64_t size);
/** Flush data (direct and buffered parts) to stable storage (fdatasync).
 *  @return 0, -EINVAL (NULL), -errno of fdatasync. */
ZO_API int zo_file_sync(zo_file *f);

/* ---- engine ----------------------------------------------------------------- */
typedef enum zo_aio_backend {
    ZO_AIO_AUTO = 0,    /**< io_uring when usable, else threads */
    ZO_AIO_URING = 1,   /**< io_uring only (create fails with ZO_ENODEV if unusable) */
    ZO_AIO_THREADS = 2, /**< pread/pwrite on a thread pool */
} zo_aio_backend;

/** Upper bounds checked by zo_aio_create() (ZO_ECONFIG beyond them). */
#define ZO_AIO_MAX_THREADS 256
#define ZO_AIO_MAX_QUEUE_DEPTH 4096
#define ZO_AIO_MAX_BLOCK_SIZE (256u << 20)

typedef struct zo_aio_config {
    size_t struct_size;      /**< sizeof(zo_aio_config), set by the defaults function */
    zo_aio_backend backend;  /**< default ZO_AIO_AUTO */
    unsigned threads;        /**< I/O threads, one ring each; default 1, max 256 */
    unsigned queue_depth;    /**< chunks in flight per thread; default 32, max 4096 */
    size_t block_size;       /**< chunk size: power of two, 4096 .. 256 MiB; default 1 MiB */
    int sqpoll;              /**< io_uring SQPOLL (kernel polling thread); default 0 */
    unsigned sqpoll_idle_ms; /**< SQPOLL idle time before it sleeps; default 1000 */
    int register_files;      /**< io_uring registered files; default 1 */
    int register_buffers;    /**< fixed buffers for registered regions; default 1 */
    unsigned eagain_retries; /**< bound on -EAGAIN resubmissions per chunk; default 64 */
    int numa_node;           /**< bind the I/O threads to this NUMA node; -1 = no binding (default) */
} zo_aio_config;

/** Fill *cfg with the defaults above (sets struct_size). NULL is ignored. */
ZO_API void zo_aio_config_default(zo_aio_config *cfg);

/**
 * Create an engine. cfg NULL = defaults. A cfg whose struct_size is
 * smaller than today's (an older caller) gets the defaults for the fields it
 * lacks.
 *
 * With ZO_AIO_AUTO, io_uring is used unless it is unusable here
 * (kernel.io_uring_disabled, seccomp, a kernel without the needed
 * operations): then the thread backend is used and zo_aio_get_info() says
 * why. Ring setup flags are tried best first (see docs/aio.md); SQPOLL
 * that the kernel refuses is dropped and reported the same way.
 *
 * @return 0; ZO_ECONFIG (zero/absurd queue depth, block size not a power of
 *         two, zero threads...: detail names the field); ZO_ENODEV
 *         (ZO_AIO_URING and io_uring unusable: detail says why); -EINVAL
 *         (out NULL, struct_size not that of a known zo_aio_config);
 *         -ENOMEM; -EAGAIN (threads could not be created).
 * Thread-safe. Blocks while the I/O threads start.
 */
ZO_API int zo_aio_create(zo_aio **out, const zo_aio_config *cfg);

/**
 * Cancel what is in flight, wait for it to drain, free everything. NULL ok;
 * clears *a. Callbacks of cancelled requests run (with -ECANCELED) before
 * it returns; requests returned through `out` and not yet waited for are
 * freed (their pointers become invalid). Must not be called from a
 * callback, nor while another thread still submits to the engine.
 */
ZO_API void zo_aio_destroy(zo_aio **a);

/** The backend in use: ZO_AIO_URING or ZO_AIO_THREADS. */
ZO_API zo_aio_backend zo_aio_get_backend(const zo_aio *a);
/** "auto", "uring", "threads" ("?" for an invalid value). */
ZO_API const char *zo_aio_backend_name(zo_aio_backend b);
/** The engine's last error detail ("" if none).
 *  Thread-safe: the handle's threads may be recording a failure at the same
 *  time; the result is a copy of one whole message, in a thread-local buffer
 *  that stays valid until this thread next calls zo_aio_errmsg() (NULL gives "").
 */
ZO_API const char *zo_aio_errmsg(const zo_aio *a);

/** What an engine actually got (filled by zo_aio_get_info()). */
typedef struct zo_aio_info {
    zo_aio_backend backend;   /**< ZO_AIO_URING or ZO_AIO_THREADS */
    unsigned threads;         /**< I/O threads (rings) */
    unsigned queue_depth;     /**< chunks in flight per I/O thread */
    size_t block_size;        /**< chunk size */
    unsigned pool_threads;    /**< threads backend: pread/pwrite workers (threads x queue_depth, capped at 128) */
    int sqpoll;               /**< 1 if the rings run with SQPOLL */
    int registered_files;     /**< 1 if files are registered with the rings */
    int fixed_buffers;        /**< 1 if regions can be registered as fixed buffers */
    unsigned ring_flags;      /**< IORING_SETUP_* flags the rings were created with */
    char ring_setup[96];      /**< the same as words ("single_issuer defer_taskrun ...") */
    char fallback[192];       /**< why a backend or feature asked for is not in use ("" if none) */
} zo_aio_info;

/** Describe the engine. @return 0, -EINVAL (NULL). Thread-safe. */
ZO_API int zo_aio_get_info(const zo_aio *a, zo_aio_info *info);

/**
 * Register [p, p+n) with the engine: later requests whose buffer lies
 * entirely inside it use fixed-buffer I/O (no per-I/O page pinning). If the
 * kernel refuses (RLIMIT_MEMLOCK), the region is still recorded, I/O uses
 * plain read/write, *registered (if not NULL) is 0, the reason is logged
 * once (warning) and counted in zo_aio_stats.regions_fallback. *registered
 * is 1 when every ring registered the region. The thread backend records
 * regions but has nothing to register (*registered = 0, no warning).
 * The memory must stay mapped until zo_aio_unregister_region().
 * @return 0, -EINVAL (NULL, n 0, wraps), -EEXIST (overlaps a region),
 *         -ENOSPC (too many regions or buffer slots), ZO_ESTATE (called
 *         from a completion callback), -ENOMEM. Blocks until every ring
 *         has answered.
 */
ZO_API int zo_aio_register_region(zo_aio *a, void *p, size_t n, int *registered);
/** Forget the region that starts at p. Waits until every request using it
 *  has completed (when it returns, zo_aio_test() of those reports done).
 *  @return 0, -EINVAL, -ENOENT if no region starts at p, ZO_ESTATE (called
 *  from a completion callback). */
ZO_API int zo_aio_unregister_region(zo_aio *a, void *p);

/** Completion callback: runs on an engine thread; result is the byte count
 *  (== len) or a negative error, whose detail (file, offset, length) the
 *  callback can read with zo_last_error_detail(). It must not block or call
 *  zo_aio_wait*, zo_aio_register_region or zo_aio_destroy; it may submit new
 *  requests. */
typedef void (*zo_aio_cb)(void *user, int64_t result);

/**
 * Queue a read of len bytes at offset into buf, or a write from buf.
 * len 0 is invalid (-EINVAL). A read that reaches past end of file fails
 * with ZO_ETRUNC (nothing is silently short). A write past end of file
 * extends it to exactly offset + len.
 *
 * Completion, one of:
 *  - out != NULL: the request is returned; the caller must zo_aio_wait()
 *    or zo_aio_test() it to completion (which releases it). If cb is also
 *    given, cb runs first, then the waiter wakes;
 *  - cb != NULL (out NULL): cb(user, result) is called once, then the
 *    request is released by the engine;
 *  - neither: fire and forget; a failure is reported by zo_aio_wait_all().
 *
 * The buffer must stay valid (and, for a write, unchanged) until completion.
 * @return 0 (queued), -EINVAL (NULL engine/file/buffer, len 0, offset + len
 *         overflows), -EBADF (file not open for that direction), ZO_ESTATE
 *         (the engine is being destroyed), -ENOMEM. Thread-safe; does not
 *         block on I/O.
 */
ZO_API int zo_aio_read(zo_aio *a, zo_file *f, void *buf, size_t len, uint64_t offset, zo_aio_cb cb, void *user,
                       zo_aio_req **out);
ZO_API int zo_aio_write(zo_aio *a, zo_file *f, const void *buf, size_t len, uint64_t offset, zo_aio_cb cb,
                        void *user, zo_aio_req **out);

/** Block until r completes; releases r. Returns 0 or r's error (the detail,
 *  naming file, offset and length, is in zo_aio_errmsg() and
 *  zo_last_error_detail()); *result (if not NULL) gets the byte count or the
 *  error. -EINVAL for NULL; ZO_ESTATE (r not released) when called from a
 *  completion callback while r is still in flight. Only one thread may wait
 *  for a given r. */
ZO_API int zo_aio_wait(zo_aio *a, zo_aio_req *r, int64_t *result);
/** ZO_PENDING (positive) while r is in flight (r stays valid); else as
 *  zo_aio_wait() (releasing r): 0 or r's error, which may itself be -EBUSY
 *  (the device said so) and is then final. -EINVAL for NULL or a foreign or
 *  fire-and-forget request. Never blocks. */
ZO_API int zo_aio_test(zo_aio *a, zo_aio_req *r, int64_t *result);
/** Ask to cancel r (best effort): chunks not yet started are dropped and
 *  those in flight are cancelled where the kernel can; still wait for r. It
 *  completes with -ECANCELED if any part was cancelled, else normally.
 *  @return 0, -EINVAL. Does not block. */
ZO_API int zo_aio_cancel(zo_aio *a, zo_aio_req *r);
/**
 * Wait until no request is in flight (everything submitted so far, and
 * anything submitted meanwhile, has completed). Returns 0, or the first
 * error of a fire-and-forget request since the last call (the detail names
 * file, offset and length; later errors are counted in stats.errors);
 * -EINVAL (NULL). Must not be called from a callback (ZO_ESTATE).
 */
ZO_API int zo_aio_wait_all(zo_aio *a);

typedef struct zo_aio_stats {
    uint64_t reads, writes;           /**< requests completed */
    uint64_t bytes_read, bytes_written;
    uint64_t chunks;                  /**< block-size pieces submitted */
    uint64_t fixed_chunks;            /**< of which used registered buffers */
    uint64_t short_resumed;           /**< short transfers resumed */
    uint64_t eagain_retried;          /**< -EAGAIN resubmissions */
    uint64_t errors;                  /**< requests that failed */
    /* added with the implementation: */
    uint64_t direct_chunks;           /**< pieces that went O_DIRECT */
    uint64_t buffered_chunks;         /**< pieces through the buffered descriptor (unaligned parts, buffered files) */
    uint64_t cancelled;               /**< requests that completed with -ECANCELED */
    uint64_t regions;                 /**< regions registered now */
    uint64_t regions_fallback;        /**< regions the kernel refused to register (ever) */
    uint64_t inflight;                /**< requests in flight now */
} zo_aio_stats;

/** Snapshot the counters (relaxed: each is exact, the set is not atomic). */
ZO_API void zo_aio_get_stats(zo_aio *a, zo_aio_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_AIO_H */
