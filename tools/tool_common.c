/* Shared helpers of the command-line tools (see tool_common.h). */
#include "tool_common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <mntent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <sys/wait.h>
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

/* ---- statistics ----------------------------------------------------------------------------- */
static int cmp_double(const void *a, const void *b)
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
    qsort(c, n, sizeof(double), cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

/* ---- fio ------------------------------------------------------------------------------------ */
int zo_fio_run(const zo_fio_job *jb, zo_fio_result *fr)
{
    memset(fr, 0, sizeof(*fr));
    char a_file[16400], a_size[64], a_bs[64], a_qd[64], a_jobs[64], a_rw[64], a_mix[64], a_loops[64], a_direct[32],
        a_inc[64], a_iomem[80];
    char a_name[] = "--name=zo-vs-fio";
    if ((size_t)snprintf(a_file, sizeof(a_file), "--filename=%s", jb->filename) >= sizeof(a_file))
        return snprintf(fr->err, sizeof(fr->err), "file names too long"), -1;
    snprintf(a_size, sizeof(a_size), "--size=%llu", (unsigned long long)jb->size);
    snprintf(a_bs, sizeof(a_bs), "--bs=%llu", (unsigned long long)jb->bs);
    snprintf(a_qd, sizeof(a_qd), "--iodepth=%u", jb->iodepth);
    snprintf(a_jobs, sizeof(a_jobs), "--numjobs=%u", jb->numjobs ? jb->numjobs : 1);
    snprintf(a_inc, sizeof(a_inc), "--offset_increment=%llu", (unsigned long long)jb->offset_increment);
    snprintf(a_rw, sizeof(a_rw), "--rw=%s", jb->rw);
    snprintf(a_mix, sizeof(a_mix), "--rwmixread=%u", jb->rwmixread);
    snprintf(a_loops, sizeof(a_loops), "--loops=%u", jb->loops);
    snprintf(a_direct, sizeof(a_direct), "--direct=%d", jb->direct);
    const char *argv[32];
    int n = 0;
    argv[n++] = jb->fio ? jb->fio : "fio";
    argv[n++] = a_name;
    argv[n++] = a_file;
    argv[n++] = a_size;
    argv[n++] = a_bs;
    argv[n++] = a_qd;
    argv[n++] = a_jobs;
    if (jb->offset_increment)
        argv[n++] = a_inc;
    argv[n++] = a_rw;
    if (jb->rwmixread)
        argv[n++] = a_mix;
    if (jb->loops)
        argv[n++] = a_loops;
    argv[n++] = a_direct;
    argv[n++] = "--ioengine=io_uring";
    if (jb->fixedbufs)
        argv[n++] = "--fixedbufs";
    argv[n++] = "--registerfiles";
    if (jb->sqpoll)
        argv[n++] = "--sqthread_poll=1";
    if (jb->iomem) {
        snprintf(a_iomem, sizeof(a_iomem), "--iomem=%s", jb->iomem);
        argv[n++] = a_iomem;
    }
    argv[n++] = "--thread";
    argv[n++] = "--group_reporting";
    argv[n++] = "--output-format=terse";
    argv[n++] = "--terse-version=3";
    argv[n] = NULL;

    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return snprintf(fr->err, sizeof(fr->err), "pipe: %s", strerror(errno)), -1;
    fflush(NULL); /* the child must not write our buffered output again */
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return snprintf(fr->err, sizeof(fr->err), "fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        dup2(pfd[1], 1);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char out[16384];
    size_t got = 0;
    ssize_t k;
    while ((k = read(pfd[0], out + got, sizeof(out) - 1 - got)) > 0)
        got += (size_t)k;
    out[got] = '\0';
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(fr->err, sizeof(fr->err), "%s exited with status %d%s", argv[0],
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                 WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (not installed? give --fio PATH)" : "");
        return -1;
    }
    /* terse v3: 6..9 read kb, bw, iops, runtime ms; 47..50 the same for
     * writes; 88/89 user/system CPU in percent of the runtime */
    char *line = strstr(out, "3;fio-");
    if (!line)
        return snprintf(fr->err, sizeof(fr->err), "cannot parse fio's output"), -1;
    char *fields[140];
    int nf = 0;
    for (char *save = NULL, *t = strtok_r(line, ";\n", &save); t && nf < 140; t = strtok_r(NULL, ";\n", &save))
        fields[nf++] = t;
    if (nf < 90)
        return snprintf(fr->err, sizeof(fr->err), "fio's terse output has %d fields", nf), -1;
    double rkb = atof(fields[5]), rms = atof(fields[8]), wkb = atof(fields[46]), wms = atof(fields[49]);
    fr->bw[0] = rms > 0 ? rkb * 1024.0 / (rms / 1000.0) : 0;
    fr->bw[1] = wms > 0 ? wkb * 1024.0 / (wms / 1000.0) : 0;
    double runtime_s = (rms > wms ? rms : wms) / 1000.0;
    fr->cpu_s = (atof(fields[87]) + atof(fields[88])) / 100.0 * runtime_s * (jb->numjobs ? jb->numjobs : 1);
    return 0;
}
