/*
 * Helpers shared by the command-line tools: a small streaming JSON writer
 * and a description of the machine (every benchmark result is reported with
 * the machine it ran on). Not part of the library.
 */
#ifndef ZO_TOOL_COMMON_H
#define ZO_TOOL_COMMON_H

#include <stdint.h>
#include <stdio.h>

typedef struct zo_json {
    FILE *f;
    int depth;
    int need_comma[32];
    int pretty;
} zo_json;

void zj_init(zo_json *j, FILE *f, int pretty);
/* key may be NULL inside arrays and for the top-level value */
void zj_obj_begin(zo_json *j, const char *key);
void zj_obj_end(zo_json *j);
void zj_arr_begin(zo_json *j, const char *key);
void zj_arr_end(zo_json *j);
void zj_str(zo_json *j, const char *key, const char *val);
void zj_int(zo_json *j, const char *key, int64_t val);
void zj_uint(zo_json *j, const char *key, uint64_t val);
void zj_num(zo_json *j, const char *key, double val); /* non-finite -> null */
void zj_bool(zo_json *j, const char *key, int val);
void zj_null(zo_json *j, const char *key);
void zj_end(zo_json *j); /* final newline */

/* Facts about this machine: CPU model and count, ISA level, memory, kernel. */
typedef struct zo_machine {
    char cpu_model[64];
    int cpus;
    char isa[128];      /* detected flags, space separated */
    uint64_t mem_bytes;
    char kernel[128];   /* uname -sr */
    char hostname[64];
} zo_machine;

void zo_machine_get(zo_machine *m);
/* One line: "AMD EPYC 9R14 x2, avx512 (...), 23.4 GiB, Linux 6.18" */
void zo_machine_print(const zo_machine *m, FILE *f);
void zo_machine_json(const zo_machine *m, zo_json *j, const char *key);
/* The filesystem and block device behind a path: "ext4 on /dev/vda" */
void zo_path_storage(const char *path, char *buf, size_t len);

/* Parse a decimal unsigned in [lo, hi] (no sign, no trailing text): 0 or -1. */
int zo_tool_parse_u(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *v);
/* "prog: <message>" on stderr; returns 2, the tools' exit status for bad usage. */
int zo_tool_bad(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Median of n values (NaN for n == 0); v is not reordered. */
double zo_median(const double *v, unsigned n);

#endif
