/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file common.h
 * @brief Conventions shared by every zoffload module: export macro, error
 *        codes, logging, element types, version and build information.
 *
 * Error model
 * -----------
 * Every fallible function returns `int`: 0 on success, a negative value on
 * failure. Operating-system failures are returned as `-errno` (io_uring and
 * the kernel already speak this), so `-ENOMEM`, `-EINVAL`, `-ENOSPC` mean
 * what they always mean. Failures that are the library's own use the codes
 * below, which lie below errno's range (`<= ZO_ERR_BASE`) and never collide
 * with it. The ZO_E* macros are already negative: a function returns
 * `ZO_ECORRUPT`, not `-ZO_ECORRUPT`. zo_strerror() names either kind.
 *
 * A code says *what* failed; the detail message says *why* ("arena file
 * /nvme/a0 offset 1048576: checksum 0x1a2b != 0x3c4d"). The calling thread's
 * last detail is always available from zo_last_error_detail(); objects that
 * keep state also keep their own last detail (e.g. zo_aio_errmsg()).
 *
 * The library never calls abort() or exit(), and never writes to stdout.
 * Diagnostics go to the log (stderr by default, at ZO_LOG_WARN and above,
 * or to a callback installed with zo_log_set_callback()).
 */
#ifndef ZOFFLOAD_COMMON_H
#define ZOFFLOAD_COMMON_H

#include <errno.h> /* -errno is half of the error model below */
#include <stddef.h>
#include <stdint.h>

#include "version.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Marks a symbol exported from libzoffload (the build hides all others). */
#if defined(__GNUC__) || defined(__clang__)
#define ZO_API __attribute__((visibility("default")))
#else
#define ZO_API
#endif

/* ------------------------------------------------------------------------ */
/** @name Library error codes (all below errno's range) */
/**@{*/
#define ZO_OK 0
/**
 * Returned (positive, not an error) by the `*_test` calls (zo_aio_test,
 * zo_swap_test, zo_store_test...) while the operation has not finished. A
 * finished operation gives 0 or its negative error code, so "not yet" can
 * never be confused with a completion error such as -EBUSY.
 */
#define ZO_PENDING 1
#define ZO_ERR_BASE (-10000)
#define ZO_EINTERNAL (-10000) /**< an internal invariant broke (a bug: please report) */
#define ZO_ENOTSUP (-10001)   /**< feature not built in, or not supported by this machine */
#define ZO_ENODEV (-10002)    /**< device or backend unavailable (no GPU, no driver, no io_uring) */
#define ZO_ECORRUPT (-10003)  /**< stored data failed its checksum */
#define ZO_EBUDGET (-10004)   /**< the request would exceed a configured byte budget */
#define ZO_ECONFIG (-10005)   /**< configuration value missing, unknown or out of range */
#define ZO_EFORMAT (-10006)   /**< malformed file, manifest or string */
#define ZO_EVERSION (-10007)  /**< data written by an incompatible version */
#define ZO_ESTATE (-10008)    /**< call not valid in the object's current state */
#define ZO_ECUDA (-10009)     /**< the CUDA runtime failed (detail has its message) */
#define ZO_ENONFINITE (-10010) /**< inf or NaN found where finite values are required */
#define ZO_ETRUNC (-10011)    /**< data ended before the expected length */
#define ZO_ERR_LAST (-10011)
/**@}*/

/**
 * Name an error code: `-errno` values give the C library's text, library
 * codes give their own. Never returns NULL; thread-safe; the string is static
 * or thread-local and stays valid until the next call in the same thread.
 */
ZO_API const char *zo_strerror(int err);

/**
 * The calling thread's most recent failure detail ("" if none yet). Every
 * failing library call in this thread overwrites it. The pointer is
 * thread-local and stays valid for the thread's lifetime.
 */
ZO_API const char *zo_last_error_detail(void);

/* ------------------------------------------------------------------------ */
/** @name Logging */
/**@{*/
typedef enum zo_log_level {
    ZO_LOG_OFF = 0,
    ZO_LOG_ERROR = 1,
    ZO_LOG_WARN = 2,
    ZO_LOG_INFO = 3,
    ZO_LOG_DEBUG = 4,
    ZO_LOG_TRACE = 5,
} zo_log_level;

/**
 * Log sink. `module` is a short static name ("mem", "aio", ...); `msg` has
 * no trailing newline and is only valid during the call. Called from any
 * library thread, possibly concurrently: the callback must be thread-safe.
 */
typedef void (*zo_log_fn)(void *user, zo_log_level level, const char *module, const char *msg);

/**
 * Install a log sink; NULL restores the default (stderr). Process-wide.
 * Thread-safe. Messages above the current level are not formatted at all.
 */
ZO_API void zo_log_set_callback(zo_log_fn fn, void *user);

/**
 * Set the process-wide log level. The initial level is ZO_LOG_WARN, or the
 * value of the `ZO_LOG` environment variable (off, error, warn, info, debug,
 * trace, or 0-5) read at the first log call.
 */
ZO_API void zo_log_set_level(zo_log_level level);
ZO_API zo_log_level zo_log_get_level(void);

/** Parse a level name or digit as `ZO_LOG` accepts it. -EINVAL if unknown. */
ZO_API int zo_log_parse_level(const char *s, zo_log_level *out);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Element types */
/**@{*/
typedef enum zo_dtype {
    ZO_DTYPE_F32 = 0,
    ZO_DTYPE_F16 = 1,  /**< IEEE binary16 */
    ZO_DTYPE_BF16 = 2, /**< bfloat16: the upper half of an fp32 */
    ZO_DTYPE_F64 = 3,
    ZO_DTYPE_U8 = 4, /**< raw bytes */
    ZO_DTYPE_I32 = 5,
    ZO_DTYPE_COUNT
} zo_dtype;

/** Bytes per element; 0 for an invalid type. */
ZO_API size_t zo_dtype_size(zo_dtype t);
/** "f32", "f16", "bf16", "f64", "u8", "i32"; "?" for an invalid type. */
ZO_API const char *zo_dtype_name(zo_dtype t);
/** Parse a type name (also accepts "fp32", "float32", "half", "bfloat16"). */
ZO_API int zo_dtype_parse(const char *s, zo_dtype *out);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Sizes */
/**@{*/
/**
 * Parse a byte count: a decimal integer with an optional suffix. Binary
 * suffixes K, M, G, T (also KiB, MiB, GiB, TiB, k, m, g, t) mean powers of
 * 1024; decimal suffixes KB, MB, GB, TB mean powers of 1000. "13522",
 * "1G" (= 2^30), "1GB" (= 10^9), "64MiB". Scientific notation without a
 * suffix, as parameter counts are written, if the value is a whole number:
 * "1e6", "2.5e9", "1E9" ("2.5e0" is -EINVAL). Whitespace is not allowed.
 * @return 0, -EINVAL (NULL/empty/unknown suffix/garbage/not a whole number),
 *         -ERANGE (overflow).
 */
ZO_API int zo_parse_size(const char *s, uint64_t *out);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Version and build */
/**@{*/
/** Run-time library version as ZO_VERSION_NUMBER (compare with the header's). */
ZO_API unsigned zo_version(void);
/** "major.minor.patch" */
ZO_API const char *zo_version_string(void);

/** Features compiled into this build (bits of zo_build_features()). */
#define ZO_BUILD_CUDA (1u << 0)
#define ZO_BUILD_NCCL (1u << 1)
#define ZO_BUILD_LIBURING (1u << 2)
#define ZO_BUILD_NUMA (1u << 3)
#define ZO_BUILD_HWLOC (1u << 4)
#define ZO_BUILD_OPENMP (1u << 5)
#define ZO_BUILD_CJSON (1u << 6)
#define ZO_BUILD_XXHASH (1u << 7)

ZO_API unsigned zo_build_features(void);
/** Space-separated "name=yes|no" list of the build features. Static string. */
ZO_API const char *zo_build_string(void);
/**@}*/

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_COMMON_H */
