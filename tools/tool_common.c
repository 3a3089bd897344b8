/* SPDX-License-Identifier: Apache-2.0 */
/* Shared helpers of the command-line tools (see tool_common.h). */
#include "tool_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <mntent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

int zo_tool_open_data(const char *path, int *created, char *why, size_t whylen)
{
    *created = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            *created = 1;
            return fd;
        }
        if (errno != EEXIST) {
            int e = errno;
            snprintf(why, whylen, "cannot create %s: %s", path, strerror(e));
            errno = e;
            return -1;
        }
        /* something is there: reuse it only if it is ours. A symlink, FIFO
         * or device is refused before it is opened (opening some devices
         * has effects); the checks that count are made on the descriptor. */
        struct stat lst;
        if (lstat(path, &lst) == 0 && !S_ISREG(lst.st_mode) && !S_ISLNK(lst.st_mode)) {
            snprintf(why, whylen, "refusing the existing %s: it is not a regular file, so it is not a leftover of "
                     "ours; remove it or give another --path", path);
            errno = EEXIST;
            return -1;
        }
        fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == ENOENT)
                continue; /* removed meanwhile (another run's exit): create it */
            if (e == ELOOP)
                snprintf(why, whylen, "refusing %s: it is a symbolic link (planted by someone else?); remove it "
                         "or give another --path", path);
            else
                snprintf(why, whylen, "cannot open the existing %s: %s", path, strerror(e));
            errno = e;
            return -1;
        }
        struct stat st;
        const char *not_ours = NULL;
        char uidmsg[64];
        if (fstat(fd, &st) != 0)
            not_ours = "cannot be examined";
        else if (!S_ISREG(st.st_mode))
            not_ours = "is not a regular file";
        else if (st.st_uid != geteuid()) {
            snprintf(uidmsg, sizeof(uidmsg), "belongs to uid %u, not to us", (unsigned)st.st_uid);
            not_ours = uidmsg;
        } else if (st.st_nlink != 1)
            not_ours = "has more than one hard link";
        if (not_ours) {
            close(fd);
            snprintf(why, whylen, "refusing the existing %s: it %s, so it is not a leftover of ours; remove it or "
                     "give another --path", path, not_ours);
            errno = EEXIST;
            return -1;
        }
        /* back to blocking mode; O_NONBLOCK only guarded the open of a FIFO */
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
            fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        return fd;
    }
    snprintf(why, whylen, "cannot create %s: it keeps appearing and disappearing", path);
    errno = EEXIST;
    return -1;
}

int zo_tool_mkdir(const char *path, char *why, size_t whylen)
{
    if (mkdir(path, 0700) == 0)
        return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    snprintf(why, whylen, "cannot create directory %s: %s", path, e == EEXIST ? "exists and is not a directory"
                                                                              : strerror(e));
    errno = e;
    return -1;
}

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

/* ---- option tables ---------------------------------------------------------------------------- */
/* An entry's getopt_long value: its short form, else 256 + its index (above any character) */
static int opt_val(const zo_tool_opt *t, size_t i)
{
    return t[i].short_name ? t[i].short_name : 256 + (int)i;
}

int zo_tool_opts_parse(const zo_tool_cli *cli, int argc, char **argv)
{
    const zo_tool_opt *t = cli->opt;
    size_t n = cli->nopt, ns = 0;
    struct option lo[ZO_TOOL_OPTS_MAX + 1];
    char shorts[2 * ZO_TOOL_OPTS_MAX + 1];
    if (n > ZO_TOOL_OPTS_MAX)
        abort();
    for (size_t i = 0; i < n; i++) {
        lo[i] = (struct option){t[i].name, t[i].has_arg ? required_argument : no_argument, NULL, opt_val(t, i)};
        if (t[i].short_name) {
            shorts[ns++] = (char)t[i].short_name;
            if (t[i].has_arg)
                shorts[ns++] = ':';
        }
    }
    lo[n] = (struct option){0, 0, 0, 0};
    shorts[ns] = '\0';
    int c;
    while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
        size_t i = 0;
        while (i < n && opt_val(t, i) != c)
            i++;
        if (i == n)
            return -1;
        int rc = t[i].set(cli, &t[i], t[i].has_arg ? optarg : NULL);
        if (rc)
            return rc;
    }
    return 0;
}

int zo_tool_opts_parse_strict(const zo_tool_cli *cli, int argc, char **argv)
{
    opterr = 0;
    int rc = zo_tool_opts_parse(cli, argc, argv);
    if (rc < 0)
        return zo_tool_bad(cli->prog, "unknown option or missing value: %s (--help lists them)", argv[optind - 1]);
    if (rc)
        return rc;
    if (optind < argc)
        return zo_tool_bad(cli->prog, "unexpected argument '%s'", argv[optind]);
    return 0;
}

int zo_tool_opt_on(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    *(int *)d->dst = 1;
    return 0;
}

int zo_tool_opt_off(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    *(int *)d->dst = 0;
    return 0;
}

int zo_tool_opt_str(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    *(const char **)d->dst = arg;
    return 0;
}

int zo_tool_opt_help(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    cli->usage(stdout);
    exit(0);
}

int zo_tool_opt_dev_kind(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (zo_dev_kind_parse(arg, d->dst))
        return zo_tool_bad(cli->prog, "--%s %s: expected host or cuda", d->name, arg);
    return 0;
}

int zo_tool_opt_f32_bf16(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    zo_dtype *t = d->dst;
    if (zo_dtype_parse(arg, t) || (*t != ZO_DTYPE_F32 && *t != ZO_DTYPE_BF16))
        return zo_tool_bad(cli->prog, "--%s %s: expected f32 or bf16", d->name, arg);
    return 0;
}

int zo_tool_state_parse(const char *s, zo_dtype *dt, int *bits)
{
    *bits = !strcmp(s, "q8") ? 8 : !strcmp(s, "q4") ? 4 : 0;
    if (*bits) {
        *dt = ZO_DTYPE_F32;
        return 0;
    }
    return zo_dtype_parse(s, dt) < 0 || (*dt != ZO_DTYPE_F32 && *dt != ZO_DTYPE_BF16) ? -EINVAL : 0;
}

const char *zo_tool_state_name(zo_dtype dt, int bits)
{
    return bits == 8 ? "q8" : bits == 4 ? "q4" : zo_dtype_name(dt);
}

/* ---- private run directories ------------------------------------------------------------------ */
#define RUNDIR_OWNER ".zo-run-owner"
#define RUNDIR_MAX_DEPTH 16

/* This boot's id (36 characters), or "" */
static void boot_id(char out[40])
{
    out[0] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f)
        return;
    if (!fgets(out, 40, f))
        out[0] = 0;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
}

/* When process pid started (clock ticks since boot, /proc/<pid>/stat's
 * 22nd field), or 0 if it does not exist (or cannot be read). */
static unsigned long long proc_start(pid_t pid)
{
    char p[64], buf[1024];
    snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *q = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    unsigned long long t = 0;
    /* after ") ": state (3) ... starttime (22): skip 19 fields */
    if (!q || sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &t) != 1)
        return 0;
    return t;
}

/* <prog>-XXXXXX, as mkdtemp makes it */
static int rundir_name(const char *name, const char *prog)
{
    size_t n = strlen(prog);
    if (strncmp(name, prog, n) != 0 || name[n] != '-' || strlen(name + n + 1) != 6)
        return 0;
    for (const char *c = name + n + 1; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            return 0;
    return 1;
}

/* Remove what directory dfd holds, never following a symlink (a symlink
 * is removed itself); the disk space of the files removed is added to
 * *bytes. Subdirectories of another user are left (and so is their
 * parent, which then cannot be removed). */
static void rm_tree_at(int dfd, int depth, uint64_t *bytes)
{
    int fd = dup(dfd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            if (st.st_uid != geteuid() || depth >= RUNDIR_MAX_DEPTH)
                continue;
            int sub = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0)
                continue;
            rm_tree_at(sub, depth + 1, bytes);
            close(sub);
            unlinkat(dfd, de->d_name, AT_REMOVEDIR);
        } else if (unlinkat(dfd, de->d_name, 0) == 0 && S_ISREG(st.st_mode) && bytes) {
            *bytes += (uint64_t)st.st_blocks * 512;
        }
    }
    closedir(dir);
}

/* Is <parentfd>/<name> a stale run directory of prog? 1 (then *owner_pid
 * says whose; the directory is open in *dfd and its owner file in *ofd,
 * locked by us), 0 no (nothing left open). */
static int rundir_stale(int parentfd, const char *name, const char *prog, int *dfd, int *ofd, long *owner_pid)
{
    struct stat st, dst, ost;
    *dfd = *ofd = -1;
    if (fstatat(parentfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 022))
        return 0; /* a symlink, another user's, or one others may write into: never ours */
    int d = openat(parentfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0)
        return 0;
    if (fstat(d, &dst) != 0 || dst.st_dev != st.st_dev || dst.st_ino != st.st_ino)
        goto no; /* swapped meanwhile */
    int o = openat(d, RUNDIR_OWNER, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (o < 0)
        goto no; /* unmarked: not a directory of ours (or one being made) */
    if (fstat(o, &ost) != 0 || !S_ISREG(ost.st_mode) || ost.st_uid != geteuid() || ost.st_nlink != 1 ||
        flock(o, LOCK_EX | LOCK_NB) != 0) {
        close(o); /* another user's, a link, or held by a live run */
        goto no;
    }
    /* The lock is ours: its owner is gone, or it has just created the file
     * and waits for our lock to take its own (the file is still empty). */
    char text[256], who[64], boot[40], now[40];
    ssize_t n = pread(o, text, sizeof(text) - 1, 0);
    long pid = 0;
    unsigned long long start = 0;
    text[n > 0 ? n : 0] = 0;
    if (n <= 0 || sscanf(text, "%63s pid %ld boot %39s start %llu", who, &pid, boot, &start) != 4 ||
        strcmp(who, prog) != 0) {
        close(o);
        goto no;
    }
    /* The lock says gone; the process table must agree (a filesystem where
     * locks do not work, say): the same pid on this boot that started when
     * the owner did is the owner, alive. */
    boot_id(now);
    if (!strcmp(boot, now) && pid > 0 && proc_start((pid_t)pid) == start) {
        close(o);
        goto no;
    }
    *dfd = d;
    *ofd = o;
    *owner_pid = pid;
    return 1;
no:
    close(d);
    return 0;
}

int zo_tool_rundir_reclaim(const char *prog, const char *parent, uint64_t *bytes)
{
    if (bytes)
        *bytes = 0;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = pfd >= 0 ? fdopendir(dup(pfd)) : NULL;
    if (!dir) {
        if (pfd >= 0)
            close(pfd);
        return 0;
    }
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        int dfd, ofd;
        long pid;
        if (!rundir_name(de->d_name, prog) || !rundir_stale(pfd, de->d_name, prog, &dfd, &ofd, &pid))
            continue;
        uint64_t b = 0;
        rm_tree_at(dfd, 0, &b); /* the owner file too: we hold its lock until it is gone */
        close(dfd);
        close(ofd);
        if (unlinkat(pfd, de->d_name, AT_REMOVEDIR) == 0) {
            removed++;
            fprintf(stderr, "%s: removed %s/%s, the run directory of a run that is gone (pid %ld), %.1f MiB\n", prog,
                    parent, de->d_name, pid, (double)b / (1024.0 * 1024.0));
        } else {
            fprintf(stderr, "%s: could not remove %s/%s, the run directory of a run that is gone (pid %ld): %s\n",
                    prog, parent, de->d_name, pid, strerror(errno));
        }
        if (bytes)
            *bytes += b;
    }
    closedir(dir);
    close(pfd);
    return removed;
}

int zo_tool_rundir_make(zo_tool_rundir *d, const char *prog, const char *parent, char *why, size_t whylen)
{
    d->path[0] = 0;
    d->lock = -1;
    zo_tool_rundir_reclaim(prog, parent, NULL);
    char tmpl[sizeof(d->path)];
    if ((size_t)snprintf(tmpl, sizeof(tmpl), "%s/%s-XXXXXX", parent, prog) >= sizeof(tmpl)) {
        snprintf(why, whylen, "%s: path too long", parent);
        return -1;
    }
    if (!mkdtemp(tmpl)) {
        snprintf(why, whylen, "cannot create a directory in %s: %s", parent, strerror(errno));
        return -1;
    }
    /* the mark: created, locked, then written (a reclaimer that takes the
     * lock in between finds it empty and leaves the directory alone) */
    char owner[sizeof(tmpl) + sizeof(RUNDIR_OWNER) + 1];
    snprintf(owner, sizeof(owner), "%s/%s", tmpl, RUNDIR_OWNER);
    int fd = open(owner, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int e = fd < 0 ? errno : 0;
    while (fd >= 0 && flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            e = errno;
            break;
        }
    char text[160], boot[40];
    boot_id(boot);
    int n = snprintf(text, sizeof(text), "%s pid %ld boot %s start %llu\n", prog, (long)getpid(), boot[0] ? boot : "-",
                     proc_start(getpid()));
    if (!e && zo_tool_pwrite_all(fd, text, (size_t)n, 0) != 0)
        e = errno ? errno : EIO;
    if (e) {
        snprintf(why, whylen, "cannot mark %s as this run's: %s", tmpl, strerror(e));
        if (fd >= 0)
            close(fd);
        unlink(owner);
        rmdir(tmpl);
        return -1;
    }
    memcpy(d->path, tmpl, sizeof(d->path));
    d->lock = fd;
    return 0;
}

void zo_tool_rundir_remove(zo_tool_rundir *d)
{
    if (!d || !d->path[0])
        return;
    int fd = open(d->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        rm_tree_at(fd, 0, NULL);
        close(fd);
    }
    if (rmdir(d->path) != 0 && errno != ENOENT)
        fprintf(stderr, "could not remove %s: %s\n", d->path, strerror(errno));
    if (d->lock >= 0)
        close(d->lock);
    d->lock = -1;
    d->path[0] = 0;
}

/* ---- cleanup on SIGINT / SIGTERM / SIGHUP -------------------------------------------------- */
/* Everything the handler touches is a lock-free atomic or a path written
 * before its slot is published, and it only makes system calls (kill,
 * open, getdents64, unlinkat, rmdir, sigprocmask, raise). */
#define CLEANUP_SLOTS 16
static struct {
    atomic_int used;
    int dir;
    char path[4300];
} cleanup_slots[CLEANUP_SLOTS];
static atomic_int fio_pgid; /* the running fio's process group, 0 if none */
static const int cleanup_sigs[] = {SIGINT, SIGTERM, SIGHUP};

/* The files in a directory, then the directory. Entries removed while the
 * directory is read may make getdents skip some, so it reads again until a
 * pass finds nothing it could remove. */
static void rm_dir_files(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096] __attribute__((aligned(8)));
        for (int pass = 0, removed = 1; removed && pass < 8; pass++) {
            removed = 0;
            lseek(fd, 0, SEEK_SET);
            long n;
            while ((n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0)
                for (long off = 0; off < n;) {
                    struct {
                        uint64_t ino;
                        int64_t off;
                        unsigned short reclen;
                        unsigned char type;
                        char name[];
                    } *d = (void *)(buf + off);
                    if (strcmp(d->name, ".") != 0 && strcmp(d->name, "..") != 0 && unlinkat(fd, d->name, 0) == 0)
                        removed = 1;
                    off += d->reclen;
                }
        }
        close(fd);
    }
    rmdir(path);
}

static void on_interrupt(int sig)
{
    int g = atomic_load(&fio_pgid);
    if (g > 0)
        kill(-g, SIGKILL);
    for (int i = 0; i < CLEANUP_SLOTS; i++) {
        if (!atomic_load(&cleanup_slots[i].used))
            continue;
        if (cleanup_slots[i].dir)
            rm_dir_files(cleanup_slots[i].path);
        else
            unlink(cleanup_slots[i].path);
    }
    /* SA_RESETHAND put the default action back: let it end the process */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, sig);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
    raise(sig);
}

int zo_tool_cleanup_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(cleanup_sigs) / sizeof(cleanup_sigs[0]); i++)
        sigaddset(&sa.sa_mask, cleanup_sigs[i]);
    for (size_t i = 0; i < sizeof(cleanup_sigs) / sizeof(cleanup_sigs[0]); i++) {
        struct sigaction old;
        if (sigaction(cleanup_sigs[i], NULL, &old) != 0)
            return -1;
        if (old.sa_handler == SIG_IGN)
            continue;
        if (sigaction(cleanup_sigs[i], &sa, NULL) != 0)
            return -1;
    }
    return 0;
}

/* A slot's path and dir are written once, before the slot is first
 * published, and never again: dropping only clears `used`, and adding the
 * same path again sets it back. Reusing a dropped slot for another path
 * would rewrite a path that a handler running on another thread (the
 * library's threads do not block these signals) may have seen as used a
 * moment before and be reading: it could then remove a mix of the two
 * names. The tools register a few fixed names (zo-aio-bench one per
 * --path, zo-store-bench its one run directory), so the table never fills
 * up by repetition. Called from one thread (main). */
int zo_tool_cleanup_add(const char *path, int dir)
{
    if (strlen(path) >= sizeof(cleanup_slots[0].path) || !path[0])
        return -1;
    for (int i = 0; i < CLEANUP_SLOTS; i++)
        if (cleanup_slots[i].path[0] && !strcmp(cleanup_slots[i].path, path)) {
            if (cleanup_slots[i].dir != dir)
                return -1; /* a file and a directory of one name: a caller's mistake */
            atomic_store(&cleanup_slots[i].used, 1);
            return 0;
        }
    for (int i = 0; i < CLEANUP_SLOTS; i++) {
        if (cleanup_slots[i].path[0])
            continue;
        strcpy(cleanup_slots[i].path, path);
        cleanup_slots[i].dir = dir;
        atomic_store(&cleanup_slots[i].used, 1); /* published after the path */
        return 0;
    }
    return -1;
}

void zo_tool_cleanup_drop(const char *path)
{
    for (int i = 0; i < CLEANUP_SLOTS; i++)
        if (cleanup_slots[i].path[0] && !strcmp(cleanup_slots[i].path, path))
            atomic_store(&cleanup_slots[i].used, 0);
}

/* ---- fio ------------------------------------------------------------------------------------ */
/* fio's argument vector for a job: one builder, so that the line a tool
 * prints (zo_fio_cmdline) is the one zo_fio_run runs. */
typedef struct fio_args {
    char file[16400], size[64], bs[64], qd[64], jobs[64], rw[64], mix[64], loops[64], direct[32], inc[64], iomem[80];
    char runtime[64];
    char name[32];
    const char *argv[32];
} fio_args;

static int fio_argv(const zo_fio_job *jb, fio_args *a, char *err, size_t errlen)
{
    snprintf(a->name, sizeof(a->name), "--name=zo-vs-fio");
    if ((size_t)snprintf(a->file, sizeof(a->file), "--filename=%s", jb->filename) >= sizeof(a->file))
        return snprintf(err, errlen, "file names too long"), -1;
    snprintf(a->size, sizeof(a->size), "--size=%llu", (unsigned long long)jb->size);
    snprintf(a->bs, sizeof(a->bs), "--bs=%llu", (unsigned long long)jb->bs);
    snprintf(a->qd, sizeof(a->qd), "--iodepth=%u", jb->iodepth);
    snprintf(a->jobs, sizeof(a->jobs), "--numjobs=%u", jb->numjobs ? jb->numjobs : 1);
    snprintf(a->inc, sizeof(a->inc), "--offset_increment=%llu", (unsigned long long)jb->offset_increment);
    snprintf(a->rw, sizeof(a->rw), "--rw=%s", jb->rw);
    snprintf(a->mix, sizeof(a->mix), "--rwmixread=%u", jb->rwmixread);
    snprintf(a->loops, sizeof(a->loops), "--loops=%u", jb->loops);
    snprintf(a->direct, sizeof(a->direct), "--direct=%d", jb->direct);
    const char **argv = a->argv;
    int n = 0;
    argv[n++] = jb->fio ? jb->fio : "fio";
    argv[n++] = a->name;
    argv[n++] = a->file;
    argv[n++] = a->size;
    argv[n++] = a->bs;
    argv[n++] = a->qd;
    argv[n++] = a->jobs;
    if (jb->offset_increment)
        argv[n++] = a->inc;
    argv[n++] = a->rw;
    if (jb->rwmixread)
        argv[n++] = a->mix;
    if (jb->loops)
        argv[n++] = a->loops;
    if (jb->runtime_ms) {
        snprintf(a->runtime, sizeof(a->runtime), "--runtime=%llums", (unsigned long long)jb->runtime_ms);
        argv[n++] = "--time_based";
        argv[n++] = a->runtime;
    }
    argv[n++] = a->direct;
    argv[n++] = "--ioengine=io_uring";
    if (jb->fixedbufs)
        argv[n++] = "--fixedbufs";
    argv[n++] = "--registerfiles";
    if (jb->sqpoll)
        argv[n++] = "--sqthread_poll=1";
    if (jb->iomem) {
        snprintf(a->iomem, sizeof(a->iomem), "--iomem=%s", jb->iomem);
        argv[n++] = a->iomem;
    }
    argv[n++] = "--thread";
    argv[n++] = "--group_reporting";
    argv[n++] = "--output-format=terse";
    argv[n++] = "--terse-version=3";
    argv[n] = NULL;
    return 0;
}

int zo_fio_cmdline(const zo_fio_job *job, char *buf, size_t len)
{
    fio_args *a = malloc(sizeof(*a));
    char err[64];
    if (!a || fio_argv(job, a, err, sizeof(err)) < 0) {
        free(a);
        return -1;
    }
    size_t at = 0;
    int r = 0;
    for (int i = 0; a->argv[i]; i++) {
        int k = snprintf(buf + at, len - at, "%s%s", i ? " " : "", a->argv[i]);
        if (k < 0 || (size_t)k >= len - at) {
            r = -1;
            break;
        }
        at += (size_t)k;
    }
    free(a);
    return r;
}

/* /proc/meminfo's "key: N" for each of keys (the value as written, kB for
 * sizes), in one read of the file; 0 for a key that is absent */
static void meminfo_values(const char *const *keys, uint64_t *vals, size_t n)
{
    memset(vals, 0, n * sizeof(*vals));
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f))
        for (size_t i = 0; i < n; i++) {
            size_t kl = strlen(keys[i]);
            if (!strncmp(line, keys[i], kl) && line[kl] == ':')
                vals[i] = strtoull(line + kl + 1, NULL, 10);
        }
    fclose(f);
}

int zo_tool_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *b = buf;
    while (len) {
        ssize_t w = pwrite(fd, b, len, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? errno : ENOSPC;
        b += w, len -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

int zo_fio_file_prepare(const char *path, uint64_t size, char *why, size_t len)
{
    int created;
    int fd = zo_tool_open_data(path, &created, why, len);
    if (fd < 0)
        return -1;
    const size_t blen = 8u << 20;
    uint8_t *buf = aligned_alloc(4096, blen);
    int err = buf ? 0 : ENOMEM;
    int fl = fcntl(fd, F_GETFL);
    int direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
    for (size_t i = 0; buf && i < blen; i++)
        buf[i] = (uint8_t)(i * 131 + (i >> 12) + 1); /* not zeros: nothing below may skip them */
    for (uint64_t off = 0; !err && off < size; off += blen) {
        size_t n = size - off < blen ? (size_t)(size - off) : blen;
        if (direct)
            n = (n + 4095) & ~(size_t)4095; /* a block past an odd size: fio's --size still fits */
        err = zo_tool_pwrite_all(fd, buf, n, off);
    }
    if (!err && fsync(fd) != 0)
        err = errno;
    if (err) {
        snprintf(why, len, "laying out %s: %s", path, strerror(err));
        if (created) /* a full disk leaves nothing of ours behind */
            unlink(path);
    }
    free(buf);
    close(fd);
    return err ? -1 : 0;
}

int zo_fio_hugepages_fit(uint64_t bs, unsigned iodepth, unsigned numjobs, char *why, size_t len)
{
    /* HugePages_Total is what /proc/sys/vm/nr_hugepages sets, read in the
     * same pass as the rest */
    static const char *const keys[] = {"Hugepagesize", "HugePages_Total", "HugePages_Free", "HugePages_Rsvd"};
    uint64_t v[4];
    meminfo_values(keys, v, 4);
    uint64_t hp = v[0] * 1024, nr = v[1];
    uint64_t avail_pages = v[2] > v[3] ? v[2] - v[3] : 0;
    if (!hp || !nr) {
        snprintf(why, len, "no huge pages (/proc/sys/vm/nr_hugepages is 0)");
        return 0;
    }
    /* fio's buffer per job: iodepth x bs, one page of alignment slack,
     * rounded up to whole huge pages */
    uint64_t per_job = (bs * iodepth + 4096 + hp - 1) / hp;
    uint64_t need = per_job * (numjobs ? numjobs : 1);
    if (need > avail_pages) {
        snprintf(why, len,
                 "fio's buffers need %llu huge pages of %llu KiB, %llu free (/proc/sys/vm/nr_hugepages %llu)",
                 (unsigned long long)need, (unsigned long long)(hp >> 10), (unsigned long long)avail_pages,
                 (unsigned long long)nr);
        return 0;
    }
    return 1;
}

/* Run fio as argv (zo_fio_run's whole work after building the line). */
static int fio_exec(const char *const *argv, const zo_fio_job *jb, zo_fio_result *fr)
{
    /* pfd: fio's stdout. efd: the child's errno if it cannot exec fio
     * (close-on-exec, so a successful exec closes it empty). Between fork
     * and exec the child of this multi-threaded process may only make
     * async-signal-safe calls: no stdio, no strerror there; the parent
     * words the error. */
    int pfd[2], efd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return snprintf(fr->err, sizeof(fr->err), "pipe: %s", strerror(errno)), -1;
    if (pipe2(efd, O_CLOEXEC) != 0) {
        int e = errno;
        close(pfd[0]);
        close(pfd[1]);
        return snprintf(fr->err, sizeof(fr->err), "pipe: %s", strerror(e)), -1;
    }
    fflush(NULL); /* the child must not write our buffered output again */
    /* No interrupt between fork and recording the child's group in this
     * thread: the handler would miss the child, and in the child (until it
     * drops them) our handlers would remove the tool's files. A signal
     * taken by another thread meanwhile ends the tool, and the death
     * signal (or the getppid check) ends the child. */
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof(cleanup_sigs) / sizeof(cleanup_sigs[0]); i++)
        sigaddset(&block, cleanup_sigs[i]);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        close(pfd[0]);
        close(pfd[1]);
        close(efd[0]);
        close(efd[1]);
        return snprintf(fr->err, sizeof(fr->err), "fork: %s", strerror(e)), -1;
    }
    if (pid == 0) {
        for (size_t i = 0; i < sizeof(cleanup_sigs) / sizeof(cleanup_sigs[0]); i++) {
            struct sigaction cur;
            if (sigaction(cleanup_sigs[i], NULL, &cur) == 0 && cur.sa_handler != SIG_IGN) {
                cur.sa_handler = SIG_DFL;
                cur.sa_flags = 0;
                sigaction(cleanup_sigs[i], &cur, NULL);
            }
        }
        /* its own group, so the handler (and only it) can end fio and any
         * process fio starts; killed when the tool dies, even by SIGKILL.
         * The tool may have died before prctl: then the parent changed. */
        setpgid(0, 0);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(127);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        dup2(pfd[1], 1);
        execvp(argv[0], (char *const *)argv);
        int e = errno;
        (void)!write(efd[1], &e, sizeof(e)); /* nothing more to do if it fails: status 127 says it */
        _exit(127);
    }
    setpgid(pid, pid); /* also here: whichever runs first, the group exists before it is signalled */
    atomic_store(&fio_pgid, (int)pid);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(pfd[1]);
    close(efd[1]);
    char out[16384];
    size_t got = 0;
    ssize_t k;
    while ((k = read(pfd[0], out + got, sizeof(out) - 1 - got)) > 0)
        got += (size_t)k;
    out[got] = '\0';
    close(pfd[0]);
    /* Forget the group before reaping fio: once reaped, its pid (the group's
     * id) may be handed to an unrelated process group, which the handler's
     * kill(-pgid, SIGKILL) must never reach. WNOWAIT leaves fio a zombie,
     * holding the id, until the group is forgotten. */
    siginfo_t si;
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
        ;
    atomic_store(&fio_pgid, 0);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    int exec_errno = 0;
    ssize_t ek = read(efd[0], &exec_errno, sizeof(exec_errno));
    close(efd[0]);
    if (ek == (ssize_t)sizeof(exec_errno))
        return snprintf(fr->err, sizeof(fr->err), "cannot run %s: %s%s", argv[0], strerror(exec_errno),
                        exec_errno == ENOENT ? " (not installed? give --fio PATH)" : ""),
               -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(fr->err, sizeof(fr->err), "%s exited with status %d", argv[0],
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
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

int zo_fio_run(const zo_fio_job *jb, zo_fio_result *fr)
{
    memset(fr, 0, sizeof(*fr));
    fio_args *fa = malloc(sizeof(*fa));
    if (!fa)
        return snprintf(fr->err, sizeof(fr->err), "out of memory"), -1;
    int r = fio_argv(jb, fa, fr->err, sizeof(fr->err)) < 0 ? -1 : fio_exec(fa->argv, jb, fr);
    free(fa);
    return r;
}
