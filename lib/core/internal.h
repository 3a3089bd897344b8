/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal helpers shared by every module: logging, error detail, checks,
 * time. Not installed. Include after defining ZO_MODULE to a short name.
 */
#ifndef ZO_CORE_INTERNAL_H
#define ZO_CORE_INTERNAL_H

#include "zo_config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <zoffload/common.h>

#ifndef ZO_MODULE
#define ZO_MODULE "core"
#endif

#define ZO_LIKELY(x) __builtin_expect(!!(x), 1)
#define ZO_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define ZO_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define ZO_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZO_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ZO_ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))
#define ZO_IS_POW2(x) ((x) != 0 && (((x) & ((x) - 1)) == 0))
#define ZO_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ---- logging ------------------------------------------------------------ */
int zo__log_enabled(zo_log_level lvl);
void zo__log(zo_log_level lvl, const char *module, const char *fmt, ...) ZO_PRINTF(3, 4);
void zo__vlog(zo_log_level lvl, const char *module, const char *fmt, va_list ap) ZO_PRINTF(3, 0);

#define ZO_LOG_AT(lvl, ...)                                  \
    do {                                                     \
        if (ZO_UNLIKELY(zo__log_enabled(lvl)))               \
            zo__log((lvl), ZO_MODULE, __VA_ARGS__);          \
    } while (0)
#define ZO_LOGE(...) ZO_LOG_AT(ZO_LOG_ERROR, __VA_ARGS__)
#define ZO_LOGW(...) ZO_LOG_AT(ZO_LOG_WARN, __VA_ARGS__)
#define ZO_LOGI(...) ZO_LOG_AT(ZO_LOG_INFO, __VA_ARGS__)
#define ZO_LOGD(...) ZO_LOG_AT(ZO_LOG_DEBUG, __VA_ARGS__)
#define ZO_LOGT(...) ZO_LOG_AT(ZO_LOG_TRACE, __VA_ARGS__)

/* ---- error detail --------------------------------------------------------- */
#define ZO_ERRMSG_LEN 256

/* Per-object last-error buffer. A handle's API calls and its background
 * threads (the store's mover, the swap store's completions, aio's I/O
 * threads) fail at the same time, so every write and every read of msg
 * goes through the small lock in `busy`: writers replace the whole message
 * (last writer wins), readers copy one whole message out, never the bytes
 * of two. Never read msg directly: use zo__errbuf_get() or
 * zo__errbuf_tls(). The lock is a spin lock on an atomic so that a
 * zero-filled errbuf (calloc, memset, `= {{0}}`) is ready to use and needs
 * no destroy; it is held only for a 256-byte copy. */
typedef struct zo_errbuf {
    char msg[ZO_ERRMSG_LEN];
    _Atomic int busy;
} zo_errbuf;

/* Replace eb's message with msg (truncated to ZO_ERRMSG_LEN - 1). */
void zo__errbuf_set(zo_errbuf *eb, const char *msg);
/* Copy eb's message into out[len] (always NUL-terminated). const: only the
 * lock word changes. Returns out. */
char *zo__errbuf_get(const zo_errbuf *eb, char *out, size_t len);
/* For the public *_errmsg getters: copy eb's message into `tls` (the
 * getter's own thread-local buffer of ZO_ERRMSG_LEN bytes) and return it.
 * "" for eb NULL. The copy is whole and stays valid until the same getter is
 * next called in the same thread, whatever other threads do to the handle. */
const char *zo__errbuf_tls(const zo_errbuf *eb, char *tls);

/* Record a failure: formats the detail into the calling thread's buffer and
 * into `eb` (if not NULL), logs it at debug level, and returns `err` so a
 * function can `return zo__fail(...)`. The arguments may point into the
 * calling thread's detail or into eb (re-raising a detail, as in
 * ZO_FAIL(eb, r, "%s", zo_last_error_detail())): the message is formatted
 * into a private buffer first. */
int zo__fail(zo_errbuf *eb, int err, const char *module, const char *fmt, ...) ZO_PRINTF(4, 5);
#define ZO_FAIL(eb, err, ...) zo__fail((eb), (err), ZO_MODULE, __VA_ARGS__)

/* Propagate a negative result, logging where it passed at trace level. */
#define ZO_CHECK(expr)                                                          \
    do {                                                                        \
        int zo__r_ = (expr);                                                    \
        if (ZO_UNLIKELY(zo__r_ < 0)) {                                          \
            ZO_LOGT("%s:%d: %s -> %s", __FILE__, __LINE__, #expr,               \
                    zo_strerror(zo__r_));                                       \
            return zo__r_;                                                      \
        }                                                                       \
    } while (0)
#define ZO_CHECK_GOTO(expr, ret, label)                                         \
    do {                                                                        \
        (ret) = (expr);                                                         \
        if (ZO_UNLIKELY((ret) < 0)) {                                           \
            ZO_LOGT("%s:%d: %s -> %s", __FILE__, __LINE__, #expr,               \
                    zo_strerror(ret));                                          \
            goto label;                                                         \
        }                                                                       \
    } while (0)

/* ---- versioned structs ------------------------------------------------- */
/* The one rule for a caller's struct that starts with `size_t struct_size`
 * (configs, options, descriptors): struct_size must lie in [min_size,
 * dst_size], where min_size is the size of the first published version and
 * dst_size our sizeof. `dst` must already hold our defaults; the caller's
 * first struct_size bytes are copied over them, so an older caller gets the
 * defaults of fields it does not know, and we never read past its struct.
 * dst->struct_size is then set to dst_size. Anything else is -EINVAL with a
 * detail naming `fn`. src NULL is the caller's to handle (usually: defaults). */
int zo__struct_in(void *dst, size_t dst_size, const void *src, size_t min_size, zo_errbuf *eb, const char *fn);
#define ZO_STRUCT_IN(dst, src, first_member_end, eb, fn) \
    zo__struct_in((dst), sizeof(*(dst)), (src), (first_member_end), (eb), (fn))

/* The rule for a struct the library fills for the caller (results, info,
 * timelines) that starts with `size_t struct_size`: the caller sets
 * struct_size to the size of its version of the struct; it must be at least
 * min_size, the size of the first published version (else -EINVAL with a
 * detail naming `fn`, and nothing is written). The library fills `src`
 * (its own, current version) and copies the first min(struct_size,
 * src_size) bytes of it out, struct_size excepted: an older caller gets the
 * fields it knows, a newer caller's fields past ours are left as it set
 * them. Check first with src NULL (nothing is copied) when the function has
 * work to do before it fills the struct. */
int zo__struct_out(void *dst, const void *src, size_t src_size, size_t min_size, zo_errbuf *eb, const char *fn);
#define ZO_STRUCT_OUT(dst, src, min_size, eb, fn) \
    zo__struct_out((dst), (src), sizeof(*(src)), (min_size), (eb), (fn))

/* ---- time ----------------------------------------------------------------- */
static inline uint64_t zo__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- misc ----------------------------------------------------------------- */
/* Read a whole small text file (sysfs) into buf, NUL-terminated, trailing
 * newline stripped. Returns length or -errno. */
int zo__read_text(const char *path, char *buf, size_t len);

/* Parse a Linux cpulist ("0-3,8,10-11") into a bitmap-free list of ids.
 * Returns the number of ids (may exceed max) or -EINVAL. */
int zo__parse_cpulist(const char *s, int *ids, int max);

/* Checked size arithmetic: returns 0 and sets *out, or -EOVERFLOW. */
static inline int zo__mul_size(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -EOVERFLOW : 0;
}

#endif /* ZO_CORE_INTERNAL_H */
