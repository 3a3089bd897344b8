/* Shared helpers of the command-line tools (see tool_common.h). */
#include "tool_common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <mntent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

void zj_init(zo_json *j, FILE *f, int pretty)
{
    memset(j, 0, sizeof(*j));
    j->f = f;
    j->pretty = pretty;
}

static void put_escaped(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* Separator, indentation and "key": before any value. */
static void zj_pre(zo_json *j, const char *key)
{
    if (j->need_comma[j->depth])
        fputc(',', j->f);
    if (j->pretty && j->depth > 0) {
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    j->need_comma[j->depth] = 1;
    if (key) {
        put_escaped(j->f, key);
        fputs(j->pretty ? ": " : ":", j->f);
    }
}

void zj_str(zo_json *j, const char *key, const char *val)
{
    zj_pre(j, key);
    if (val)
        put_escaped(j->f, val);
    else
        fputs("null", j->f);
}

void zj_obj_begin(zo_json *j, const char *key)
{
    zj_pre(j, key);
    fputc('{', j->f);
    j->depth++;
    j->need_comma[j->depth] = 0;
}

void zj_obj_end(zo_json *j)
{
    int had = j->need_comma[j->depth];
    j->depth--;
    if (j->pretty && had) {
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    fputc('}', j->f);
}

void zj_arr_begin(zo_json *j, const char *key)
{
    zj_pre(j, key);
    fputc('[', j->f);
    j->depth++;
    j->need_comma[j->depth] = 0;
}

void zj_arr_end(zo_json *j)
{
    j->depth--;
    fputc(']', j->f);
}

void zj_int(zo_json *j, const char *key, int64_t val)
{
    zj_pre(j, key);
    fprintf(j->f, "%lld", (long long)val);
}

void zj_uint(zo_json *j, const char *key, uint64_t val)
{
    zj_pre(j, key);
    fprintf(j->f, "%llu", (unsigned long long)val);
}

void zj_num(zo_json *j, const char *key, double val)
{
    zj_pre(j, key);
    if (isfinite(val))
        fprintf(j->f, "%.6g", val);
    else
        fputs("null", j->f);
}

void zj_bool(zo_json *j, const char *key, int val)
{
    zj_pre(j, key);
    fputs(val ? "true" : "false", j->f);
}

void zj_null(zo_json *j, const char *key)
{
    zj_pre(j, key);
    fputs("null", j->f);
}

void zj_end(zo_json *j)
{
    fputc('\n', j->f);
    fflush(j->f);
}

void zo_machine_get(zo_machine *m)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->cpu_model, sizeof(m->cpu_model), "%s", zo_cpu_model()[0] ? zo_cpu_model() : "unknown CPU");
    m->cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    zo_cpu_flags_string(zo_cpu_detected(), m->isa, sizeof(m->isa));
    struct sysinfo si;
    if (sysinfo(&si) == 0)
        m->mem_bytes = (uint64_t)si.totalram * si.mem_unit;
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(m->kernel, sizeof(m->kernel), "%s %s", u.sysname, u.release);
        snprintf(m->hostname, sizeof(m->hostname), "%s", u.nodename);
    }
}

void zo_machine_print(const zo_machine *m, FILE *f)
{
    fprintf(f, "machine: %s, %d CPUs, %s, %.1f GiB RAM, %s\n", m->cpu_model, m->cpus,
            zo_cpu_level_name(zo_cpu_detected()), (double)m->mem_bytes / (1u << 30), m->kernel);
}

void zo_machine_json(const zo_machine *m, zo_json *j, const char *key)
{
    zj_obj_begin(j, key);
    zj_str(j, "cpu", m->cpu_model);
    zj_int(j, "cpus", m->cpus);
    zj_str(j, "isa_level", zo_cpu_level_name(zo_cpu_detected()));
    zj_str(j, "isa", m->isa);
    zj_uint(j, "mem_bytes", m->mem_bytes);
    zj_str(j, "kernel", m->kernel);
    zj_obj_end(j);
}

void zo_path_storage(const char *path, char *buf, size_t len)
{
    struct stat st;
    snprintf(buf, len, "unknown");
    if (stat(path, &st) != 0)
        return;
    FILE *mt = setmntent("/proc/self/mounts", "re");
    if (!mt)
        return;
    struct mntent *e, best = {0};
    size_t best_len = 0;
    char dir[4096], fs[64], src[256];
    while ((e = getmntent(mt))) {
        struct stat ms;
        if (stat(e->mnt_dir, &ms) == 0 && ms.st_dev == st.st_dev && strlen(e->mnt_dir) >= best_len) {
            best_len = strlen(e->mnt_dir);
            snprintf(dir, sizeof(dir), "%s", e->mnt_dir);
            snprintf(fs, sizeof(fs), "%s", e->mnt_type);
            snprintf(src, sizeof(src), "%s", e->mnt_fsname);
            best.mnt_dir = dir;
        }
    }
    endmntent(mt);
    if (best.mnt_dir)
        snprintf(buf, len, "%s on %s (mounted at %s)", fs, src, dir);
}

static int zo_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double zo_median(const double *v, unsigned n)
{
    if (n == 0)
        return NAN;
    double *c = malloc(n * sizeof(double));
    if (!c)
        return NAN;
    memcpy(c, v, n * sizeof(double));
    qsort(c, n, sizeof(double), zo_cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

int zo_tool_parse_u(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *v)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return errno || *end || *v < lo || *v > hi ? -1 : 0;
}

int zo_tool_bad(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}
