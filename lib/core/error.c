/* SPDX-License-Identifier: Apache-2.0 */
/* Error codes, per-thread failure detail, element types, version. */
#define ZO_MODULE "core"
#include "core/internal.h"

#include <ctype.h>
#include <sched.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <zoffload/common.h>

static _Thread_local char tls_detail[ZO_ERRMSG_LEN];
static _Thread_local char tls_strerror[96];

static const char *const lib_errors[] = {
    [0] = "internal error (a zoffload bug)",
    [1] = "not supported by this build or machine",
    [2] = "device or backend unavailable",
    [3] = "data corrupted (checksum mismatch)",
    [4] = "byte budget exceeded",
    [5] = "invalid configuration",
    [6] = "malformed file or string",
    [7] = "incompatible version",
    [8] = "invalid in the object's current state",
    [9] = "CUDA runtime error",
    [10] = "inf or NaN found",
    [11] = "data ended before the expected length",
};

ZO_API const char *zo_strerror(int err)
{
    if (err == 0)
        return "success";
    if (err == ZO_PENDING)
        return "pending (not finished yet)";
    if (err <= ZO_ERR_BASE && err >= ZO_ERR_LAST)
        return lib_errors[ZO_ERR_BASE - err];
    if (err < 0 && err > ZO_ERR_BASE) {
        /* strerrordesc_np is static and thread-safe (glibc >= 2.32). */
        const char *d = strerrordesc_np(-err);
        if (d)
            return d;
    }
    snprintf(tls_strerror, sizeof(tls_strerror), "unknown error %d", err);
    return tls_strerror;
}

ZO_API const char *zo_last_error_detail(void)
{
    return tls_detail;
}

/* ---- per-object error buffers -------------------------------------------- */
static void eb_lock(zo_errbuf *eb)
{
    while (atomic_exchange_explicit(&eb->busy, 1, memory_order_acquire)) {
        /* held for a 256-byte copy: spin briefly, then let the holder run */
        for (int i = 0; atomic_load_explicit(&eb->busy, memory_order_relaxed); i++)
            if (i > 64)
                sched_yield();
    }
}

static void eb_unlock(zo_errbuf *eb)
{
    atomic_store_explicit(&eb->busy, 0, memory_order_release);
}

void zo__errbuf_set(zo_errbuf *eb, const char *msg)
{
    size_t n = strnlen(msg, sizeof(eb->msg) - 1);
    eb_lock(eb);
    memcpy(eb->msg, msg, n);
    eb->msg[n] = '\0';
    eb_unlock(eb);
}

char *zo__errbuf_get(const zo_errbuf *ceb, char *out, size_t len)
{
    zo_errbuf *eb = (zo_errbuf *)ceb; /* the lock word is the only thing written */
    if (!len)
        return out;
    eb_lock(eb);
    size_t n = strnlen(eb->msg, ZO_MIN(len - 1, sizeof(eb->msg) - 1));
    memcpy(out, eb->msg, n);
    eb_unlock(eb);
    out[n] = '\0';
    return out;
}

const char *zo__errbuf_tls(const zo_errbuf *eb, char *tls)
{
    if (!eb)
        return "";
    return zo__errbuf_get(eb, tls, ZO_ERRMSG_LEN);
}

int zo__fail(zo_errbuf *eb, int err, const char *module, const char *fmt, ...)
{
    /* Format into a private buffer: the arguments may point into tls_detail
     * or into eb->msg (a detail re-raised as "%s"), and vsnprintf's output
     * must not overlap its input. */
    char msg[ZO_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n < 0)
        msg[0] = '\0';
    memcpy(tls_detail, msg, sizeof(tls_detail));
    if (eb)
        zo__errbuf_set(eb, msg);
    if (zo__log_enabled(ZO_LOG_DEBUG))
        zo__log(ZO_LOG_DEBUG, module, "%s (%s)", tls_detail, zo_strerror(err));
    return err;
}

int zo__struct_in(void *dst, size_t dst_size, const void *src, size_t min_size, zo_errbuf *eb, const char *fn)
{
    size_t have;
    memcpy(&have, src, sizeof(have)); /* every versioned struct starts with size_t struct_size */
    if (have < min_size || have > dst_size)
        return zo__fail(eb, -EINVAL, "core",
                        "%s: struct_size %zu is not that of a known version (expected %zu..%zu): fill the struct "
                        "with its *_default() function",
                        fn, have, min_size, dst_size);
    memcpy(dst, src, have);
    memcpy(dst, &dst_size, sizeof(dst_size));
    return 0;
}

int zo__struct_out(void *dst, const void *src, size_t src_size, size_t min_size, zo_errbuf *eb, const char *fn)
{
    size_t have;
    memcpy(&have, dst, sizeof(have)); /* every versioned struct starts with size_t struct_size */
    if (have < min_size || have < sizeof(size_t))
        return zo__fail(eb, -EINVAL, "core",
                        "%s: struct_size %zu is smaller than the first version of the struct (%zu): set it to "
                        "sizeof the struct", fn, have, min_size);
    if (src) {
        size_t n = have < src_size ? have : src_size;
        memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), n - sizeof(size_t));
    }
    return 0;
}

/* ---- dtypes ------------------------------------------------------------- */
static const struct {
    const char *name;
    size_t size;
} dtypes[ZO_DTYPE_COUNT] = {
    [ZO_DTYPE_F32] = {"f32", 4}, [ZO_DTYPE_F16] = {"f16", 2}, [ZO_DTYPE_BF16] = {"bf16", 2},
    [ZO_DTYPE_F64] = {"f64", 8}, [ZO_DTYPE_U8] = {"u8", 1},   [ZO_DTYPE_I32] = {"i32", 4},
};

ZO_API size_t zo_dtype_size(zo_dtype t)
{
    return ((unsigned)t < ZO_DTYPE_COUNT) ? dtypes[t].size : 0;
}

ZO_API const char *zo_dtype_name(zo_dtype t)
{
    return ((unsigned)t < ZO_DTYPE_COUNT) ? dtypes[t].name : "?";
}

ZO_API int zo_dtype_parse(const char *s, zo_dtype *out)
{
    static const struct {
        const char *alias;
        zo_dtype t;
    } aliases[] = {
        {"fp32", ZO_DTYPE_F32},     {"float32", ZO_DTYPE_F32}, {"float", ZO_DTYPE_F32},
        {"fp16", ZO_DTYPE_F16},     {"float16", ZO_DTYPE_F16}, {"half", ZO_DTYPE_F16},
        {"bfloat16", ZO_DTYPE_BF16}, {"fp64", ZO_DTYPE_F64},   {"float64", ZO_DTYPE_F64},
        {"double", ZO_DTYPE_F64},   {"uint8", ZO_DTYPE_U8},    {"int32", ZO_DTYPE_I32},
    };
    if (!s || !out)
        return -EINVAL;
    for (int i = 0; i < ZO_DTYPE_COUNT; i++) {
        if (!strcasecmp(s, dtypes[i].name)) {
            *out = (zo_dtype)i;
            return 0;
        }
    }
    for (size_t i = 0; i < ZO_ARRAY_LEN(aliases); i++) {
        if (!strcasecmp(s, aliases[i].alias)) {
            *out = aliases[i].t;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- sizes ---------------------------------------------------------------- */
/* Scientific notation, as people write parameter counts: "1e6", "2.5e9"
 * (digits, an optional fraction, e or E and a decimal exponent), exactly, in
 * integers: the value must be a whole number. 0, -EINVAL, -ERANGE. */
static int parse_sci(const char *s, uint64_t *out)
{
    uint64_t m = 0;
    int frac = -1, exp = 0; /* frac: fraction digits seen (-1: no '.') */
    const char *p = s;
    for (; isdigit((unsigned char)*p) || (*p == '.' && frac < 0); p++) {
        if (*p == '.') {
            frac = 0;
            continue;
        }
        unsigned d = (unsigned)(*p - '0');
        if (m > (UINT64_MAX - d) / 10)
            return -ERANGE;
        m = m * 10 + d;
        if (frac >= 0)
            frac++;
    }
    if (p == s || (*p != 'e' && *p != 'E') || !isdigit((unsigned char)p[1]))
        return -EINVAL;
    for (p++; isdigit((unsigned char)*p); p++) {
        exp = exp * 10 + (*p - '0');
        if (exp > 1000)
            return -ERANGE;
    }
    if (*p)
        return -EINVAL;
    exp -= frac > 0 ? frac : 0;
    for (; exp < 0; exp++) { /* "2.5e0": not a whole number unless the digits end in zeros */
        if (m % 10)
            return -EINVAL;
        m /= 10;
    }
    for (; exp > 0; exp--) {
        if (m && m > UINT64_MAX / 10)
            return -ERANGE;
        m *= 10;
    }
    *out = m;
    return 0;
}

ZO_API int zo_parse_size(const char *s, uint64_t *out)
{
    if (!s || !out || !isdigit((unsigned char)s[0]))
        return -EINVAL;
    if (strpbrk(s, "eE.") && !strpbrk(s, "KMGTkmgtiB"))
        return parse_sci(s, out);
    uint64_t v = 0;
    const char *p = s;
    while (isdigit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -ERANGE;
        v = v * 10 + d;
        p++;
    }
    static const struct {
        const char *suffix;
        uint64_t mult;
    } suffixes[] = {
        {"", 1},
        {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"k", 1ull << 10},
        {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"m", 1ull << 20},
        {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"g", 1ull << 30},
        {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"t", 1ull << 40},
        {"KB", 1000ull}, {"MB", 1000000ull}, {"GB", 1000000000ull}, {"TB", 1000000000000ull},
        {"B", 1},
    };
    for (size_t i = 0; i < ZO_ARRAY_LEN(suffixes); i++) {
        if (!strcmp(p, suffixes[i].suffix)) {
            uint64_t r;
            if (__builtin_mul_overflow(v, suffixes[i].mult, &r))
                return -ERANGE;
            *out = r;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- version and build ---------------------------------------------------- */
#define ZO_STR_(x) #x
#define ZO_STR(x) ZO_STR_(x)

ZO_API unsigned zo_version(void)
{
    return ZO_VERSION_NUMBER;
}

ZO_API const char *zo_version_string(void)
{
    return ZO_STR(ZO_VERSION_MAJOR) "." ZO_STR(ZO_VERSION_MINOR) "." ZO_STR(ZO_VERSION_PATCH);
}

ZO_API unsigned zo_build_features(void)
{
    return (ZO_HAVE_CUDA ? ZO_BUILD_CUDA : 0) | (ZO_HAVE_NCCL ? ZO_BUILD_NCCL : 0) |
           (ZO_HAVE_LIBURING ? ZO_BUILD_LIBURING : 0) | (ZO_HAVE_NUMA ? ZO_BUILD_NUMA : 0) |
           (ZO_HAVE_HWLOC ? ZO_BUILD_HWLOC : 0) | (ZO_HAVE_OPENMP ? ZO_BUILD_OPENMP : 0) |
           (ZO_HAVE_CJSON ? ZO_BUILD_CJSON : 0) | (ZO_HAVE_XXHASH ? ZO_BUILD_XXHASH : 0);
}

/* ZO_HAVE_* are literal 0/1, so the answer can be pasted at compile time. */
#define YN_0 "no"
#define YN_1 "yes"
#define YN_(x) YN_##x
#define YN(x) YN_(x)
ZO_API const char *zo_build_string(void)
{
    static const char s[] = "cuda=" YN(ZO_HAVE_CUDA) " nccl=" YN(ZO_HAVE_NCCL)
        " liburing=" YN(ZO_HAVE_LIBURING) " numa=" YN(ZO_HAVE_NUMA) " hwloc=" YN(ZO_HAVE_HWLOC)
        " openmp=" YN(ZO_HAVE_OPENMP) " cjson=" YN(ZO_HAVE_CJSON) " xxhash=" YN(ZO_HAVE_XXHASH)
        " cuda_archs=" ZO_CUDA_ARCHS;
    return s;
}
