/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The dispatch rule's shared part (docs/architecture.md, "CPU features and
 * dispatch"), for the baseline files of the kernel families (vec,
 * cpuadam, crc32c). Each lists its variants from slowest to fastest, each
 * the CPU flags its file was compiled for and that file's constant table;
 * these pick one for the current flags and build the laid-over tables.
 * Baseline code only: nothing here calls a kernel, and building a table
 * copies addresses, so it is safe on any CPU. Not installed.
 */
#ifndef ZO_CORE_DISPATCH_H
#define ZO_CORE_DISPATCH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <zoffload/cpu.h>

/* A table is a struct of pointers only, its name first: the overlay copies
 * it one pointer-size word at a time, code addresses included. */
_Static_assert(sizeof(void (*)(void)) == sizeof(void *), "function and data pointers differ in size");

typedef struct zo__variant {
    unsigned need;     /* the ZO_CPU_* flags its file was compiled for */
    const void *table; /* that file's constant table */
} zo__variant;

/* The index of the fastest of v[0..n) that `flags` allow, after ANDing
 * them with what this CPU has (zo_cpu_detected()): a test may ask for any
 * variant, a CPU without it gets the best one it has, and a table the CPU
 * cannot run is never handed out. v[0] is the baseline: always allowed. */
static inline size_t zo__variant_pick(const zo__variant *v, size_t n, unsigned flags)
{
    flags &= zo_cpu_detected();
    for (size_t i = n - 1; i > 0; i--)
        if ((flags & v[i].need) == v[i].need)
            return i;
    return 0;
}

/* A variant's name: its table's first member. */
static inline const char *zo__variant_name(const zo__variant *v)
{
    const char *name;
    memcpy(&name, v->table, sizeof(name));
    return name;
}

/* out[i] (tables of `size` bytes, n of them) = out[i - 1] with the
 * non-NULL members of v[i].table laid over it; out[0] = v[0].table. A
 * NULL member keeps the kernel of the level below, so a variant's file
 * holds only what it does better. */
static inline void zo__variant_overlay(void *out, size_t size, const zo__variant *v, size_t n)
{
    char *o = (char *)out;
    for (size_t i = 0; i < n; i++) {
        char *d = o + i * size;
        const char *src = (const char *)v[i].table;
        memcpy(d, i ? d - size : src, size);
        for (size_t k = 0; k + sizeof(void *) <= size; k += sizeof(void *)) {
            uintptr_t w;
            memcpy(&w, src + k, sizeof(w));
            if (w)
                memcpy(d + k, &w, sizeof(w));
        }
    }
}

/* For each family's table type: a struct of pointer-size members only. */
#define ZO_DISPATCH_TABLE_CHECK(type)                                                                               \
    _Static_assert(sizeof(type) % sizeof(void *) == 0 && offsetof(type, name) == 0,                                \
                   #type ": a dispatch table is pointers only, its name first")

#endif /* ZO_CORE_DISPATCH_H */
