/* SPDX-License-Identifier: Apache-2.0 */
/* CPU feature detection (CPUID + XGETBV) and the dispatch mask. */
#define ZO_MODULE "cpu"
#include "core/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zoffload/cpu.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ZO_X86 1
#elif defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#define ZO_X86 0
#else
#define ZO_X86 0
#endif

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static unsigned cpu_detected_flags;
static atomic_uint cpu_mask = ZO_CPU_ALL;
static char cpu_model_str[64];

static const char *const flag_names[] = {
    "sse4.2", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
    "avx512bf16", "avx512fp16", "vpclmulqdq", "neon", "crc32", "pmull", "sve",
};

#if ZO_X86
static uint64_t xgetbv0(void)
{
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static unsigned detect(void)
{
    unsigned a, b, c, d, f = 0;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 1)
        return 0;
    __cpuid(1, a, b, c, d);
    if (c & bit_SSE4_2)
        f |= ZO_CPU_SSE42;
    int osxsave = !!(c & bit_OSXSAVE);
    int has_avx = !!(c & bit_AVX), has_fma = !!(c & bit_FMA), has_f16c = !!(c & bit_F16C);
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    /* YMM state (bits 1-2) must be OS-enabled for any VEX instruction;
     * opmask + ZMM_Hi256 + Hi16_ZMM (bits 5-7) for EVEX. */
    int os_ymm = (xcr0 & 0x6) == 0x6;
    int os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (os_ymm && has_avx) {
        if (has_fma)
            f |= ZO_CPU_FMA;
        if (has_f16c)
            f |= ZO_CPU_F16C;
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        if (os_ymm && has_avx && (b & bit_AVX2))
            f |= ZO_CPU_AVX2;
        /* the VEX.256 form needs YMM state; the EVEX.512 one, checked by
         * its kernel's needs, AVX-512F */
        if (os_ymm && has_avx && (c & (1u << 10)))
            f |= ZO_CPU_VPCLMULQDQ;
        if (os_zmm) {
            if (b & bit_AVX512F)
                f |= ZO_CPU_AVX512F;
            if (b & bit_AVX512BW)
                f |= ZO_CPU_AVX512BW;
            if (b & bit_AVX512VL)
                f |= ZO_CPU_AVX512VL;
            if (b & bit_AVX512DQ)
                f |= ZO_CPU_AVX512DQ;
            if (d & (1u << 23)) /* AVX512_FP16 */
                f |= ZO_CPU_AVX512FP16;
            unsigned a1, b1, c1, d1;
            __cpuid_count(7, 1, a1, b1, c1, d1);
            (void)b1, (void)c1, (void)d1;
            if (a1 & (1u << 5)) /* AVX512_BF16 */
                f |= ZO_CPU_AVX512BF16;
        }
    }
    /* Extensions are only usable with the foundation. */
    if (!(f & ZO_CPU_AVX512F))
        f &= ~(ZO_CPU_AVX512BW | ZO_CPU_AVX512VL | ZO_CPU_AVX512DQ | ZO_CPU_AVX512BF16 |
               ZO_CPU_AVX512FP16);

    unsigned ext = __get_cpuid_max(0x80000000u, NULL);
    if (ext >= 0x80000004u) {
        unsigned *w = (unsigned *)cpu_model_str;
        for (unsigned leaf = 0; leaf < 3; leaf++)
            __cpuid(0x80000002u + leaf, w[leaf * 4], w[leaf * 4 + 1], w[leaf * 4 + 2],
                    w[leaf * 4 + 3]);
        cpu_model_str[48] = '\0';
        /* trim leading/trailing spaces */
        char *s = cpu_model_str;
        while (*s == ' ')
            s++;
        memmove(cpu_model_str, s, strlen(s) + 1);
        size_t n = strlen(cpu_model_str);
        while (n && cpu_model_str[n - 1] == ' ')
            cpu_model_str[--n] = '\0';
    }
    return f;
}
#elif defined(__aarch64__) && defined(__linux__)
/* The kernel reports what the CPU has and the OS supports in the auxiliary
 * vector (reading the ID registers from user space traps to it anyway). */
static unsigned detect(void)
{
    unsigned long hw = getauxval(AT_HWCAP);
    unsigned f = 0;
    if (hw & HWCAP_ASIMD)
        f |= ZO_CPU_NEON;
    if (hw & HWCAP_CRC32)
        f |= ZO_CPU_ARM_CRC32;
    if (hw & HWCAP_PMULL)
        f |= ZO_CPU_PMULL;
    if (hw & HWCAP_SVE)
        f |= ZO_CPU_SVE;
    /* MIDR is exposed through sysfs; the model name is enough for zo-info */
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (fp) {
        char line[256];
        unsigned impl = 0, part = 0;
        while (fgets(line, sizeof(line), fp)) {
            if (sscanf(line, "CPU implementer : %x", &impl) == 1)
                continue;
            if (sscanf(line, "CPU part : %x", &part) == 1)
                break;
        }
        fclose(fp);
        if (impl)
            snprintf(cpu_model_str, sizeof(cpu_model_str), "aarch64 implementer 0x%02x part 0x%03x",
                     impl, part);
    }
    if (!cpu_model_str[0])
        snprintf(cpu_model_str, sizeof(cpu_model_str), "aarch64");
    return f;
}
#else
static unsigned detect(void)
{
    return 0;
}
#endif

/* Set by cpu_init when ZO_CPU_MASK could not be parsed; the warning is
 * logged by cpu_once_init() after pthread_once has returned, because a user
 * log callback may itself ask for the CPU flags, and calling pthread_once
 * again from inside its own init routine deadlocks. */
static atomic_int cpu_bad_mask_pending;

static void cpu_init(void)
{
    cpu_detected_flags = detect();
    const char *e = getenv("ZO_CPU_MASK");
    if (e && *e) {
        unsigned m;
        if (zo_cpu_parse_mask(e, &m) == 0)
            atomic_store(&cpu_mask, m);
        else
            atomic_store(&cpu_bad_mask_pending, 1);
    }
}

static void cpu_once_init(void)
{
    pthread_once(&cpu_once, cpu_init);
    /* exchange: exactly one caller logs it, and a callback that re-enters
     * here sees 0 and returns */
    if (atomic_load_explicit(&cpu_bad_mask_pending, memory_order_relaxed) &&
        atomic_exchange(&cpu_bad_mask_pending, 0)) {
        const char *e = getenv("ZO_CPU_MASK");
        ZO_LOGW("ignoring unparsable ZO_CPU_MASK=%s", e ? e : "");
    }
}

ZO_API unsigned zo_cpu_detected(void)
{
    cpu_once_init();
    return cpu_detected_flags;
}

ZO_API unsigned zo_cpu_flags(void)
{
    cpu_once_init();
    return cpu_detected_flags & atomic_load_explicit(&cpu_mask, memory_order_acquire);
}

ZO_API unsigned zo_cpu_get_mask(void)
{
    cpu_once_init();
    return atomic_load(&cpu_mask);
}

ZO_API void zo_cpu_set_mask(unsigned mask)
{
    cpu_once_init();
    atomic_store_explicit(&cpu_mask, mask, memory_order_release);
}

ZO_API const char *zo_cpu_flag_name(unsigned bit)
{
    if (!ZO_IS_POW2(bit))
        return NULL;
    unsigned i = (unsigned)__builtin_ctz(bit);
    return i < ZO_ARRAY_LEN(flag_names) ? flag_names[i] : NULL;
}

static int parse_word(const char *w, unsigned *bits)
{
    static const struct {
        const char *name;
        unsigned bits;
    } levels[] = {
        {"scalar", 0}, {"none", 0}, {"c", 0},
        {"avx2", ZO_CPU_LEVEL_AVX2},
        {"avx512", ZO_CPU_LEVEL_AVX512}, {"all", ZO_CPU_ALL},
        {"asimd", ZO_CPU_NEON},
    };
    for (size_t i = 0; i < ZO_ARRAY_LEN(levels); i++) {
        if (!strcasecmp(w, levels[i].name)) {
            *bits = levels[i].bits;
            return 0;
        }
    }
    for (unsigned i = 0; i < ZO_ARRAY_LEN(flag_names); i++) {
        if (!strcasecmp(w, flag_names[i]) || (i == 0 && !strcasecmp(w, "sse42"))) {
            *bits = 1u << i;
            return 0;
        }
    }
    return -EINVAL;
}

ZO_API int zo_cpu_parse_mask(const char *s, unsigned *mask)
{
    if (!s || !mask || !*s)
        return -EINVAL;
    if (s[0] >= '0' && s[0] <= '9') {
        char *end;
        errno = 0;
        unsigned long v = strtoul(s, &end, 0);
        /* out of range saturates to ULONG_MAX, which would read as "all" */
        if (*end != '\0' || errno == ERANGE)
            return -EINVAL;
        *mask = (unsigned)v & ZO_CPU_ALL;
        return 0;
    }
    char buf[256];
    if (strlen(s) >= sizeof(buf))
        return -EINVAL;
    strcpy(buf, s);
    /* A list that only removes starts from "all"; one that names features
     * starts from nothing. "avx2" alone is a level (the AVX2 kernel's needs),
     * which is also what naming the single feature would imply for dispatch. */
    unsigned add = 0, remove = 0;
    int any_add = 0, words = 0;
    char *save = NULL;
    for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        int neg = (w[0] == '-');
        unsigned bits;
        words++;
        if (parse_word(w + neg, &bits) < 0)
            return -EINVAL;
        if (neg) {
            remove |= bits;
        } else {
            add |= bits;
            any_add = 1;
        }
    }
    if (!words) /* "," or ",,": no word at all, not "all" */
        return -EINVAL;
    *mask = ((any_add ? add : ZO_CPU_ALL) & ~remove) & ZO_CPU_ALL;
    return 0;
}

ZO_API int zo_cpu_flags_string(unsigned flags, char *buf, size_t len)
{
    if (!buf || len == 0)
        return -EINVAL;
    size_t off = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < ZO_ARRAY_LEN(flag_names); i++) {
        if (!(flags & (1u << i)))
            continue;
        int n = snprintf(buf + off, len - off, "%s%s", off ? " " : "", flag_names[i]);
        if (n < 0 || (size_t)n >= len - off) {
            buf[len - 1] = '\0';
            return (int)(len - 1);
        }
        off += (size_t)n;
    }
    return (int)off;
}

ZO_API const char *zo_cpu_level_name(unsigned flags)
{
    if ((flags & ZO_CPU_LEVEL_AVX512) == ZO_CPU_LEVEL_AVX512)
        return "avx512";
    if ((flags & ZO_CPU_LEVEL_AVX2) == ZO_CPU_LEVEL_AVX2)
        return "avx2";
    if ((flags & ZO_CPU_LEVEL_NEON) == ZO_CPU_LEVEL_NEON)
        return "neon";
    return "scalar";
}

ZO_API const char *zo_cpu_model(void)
{
    cpu_once_init();
    return cpu_model_str;
}
