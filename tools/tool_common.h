/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers shared by the command-line tools: a small streaming JSON writer
 * and a description of the machine (every benchmark result is reported with
 * the machine it ran on). Not part of the library.
 */
#ifndef ZO_TOOL_COMMON_H
#define ZO_TOOL_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <zoffload/common.h>

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

/* Open a data file the tool makes, as safely as the library's own files (the
 * swap store's arenas): a new file is created O_EXCL | O_NOFOLLOW, mode 0600.
 * If `path` exists, it is reused only when it can be a leftover of ours (a
 * killed earlier run, or --keep): a regular file, owned by this effective
 * user, with one link, opened O_NOFOLLOW. Anything else there (a symlink a
 * local user planted in /var/tmp, another user's file, a hard link, a
 * device) is refused, so a benchmark run as root never writes through it.
 * Returns a descriptor (O_RDWR | O_CLOEXEC) and sets *created (1: made now),
 * or -1 with errno set and the reason in why. */
int zo_tool_open_data(const char *path, int *created, char *why, size_t whylen);

/* Create directory `path` (mode 0700) if it does not exist, as the library
 * does for a checkpoint root; an existing directory (or a symlink to one)
 * is accepted. Only the last component is created. 0, or -1 with why. */
int zo_tool_mkdir(const char *path, char *why, size_t whylen);

/* ---- private run directories ------------------------------------------------ */
/* A tool's files for one run (swap arenas, fio's file) go in a directory of
 * their own, <parent>/<prog>-XXXXXX (mkdtemp: mode 0700, a fresh name).
 * A run killed with SIGKILL (or by the OOM killer) leaves it behind, and
 * since the next run makes a fresh name, nothing would ever look there
 * again: so each directory is marked as the tool's own by an owner file,
 * .zo-run-owner (0600), saying "<prog> pid P boot B start T" (the boot id
 * and the process start time, so a reused pid cannot pass for the owner)
 * and held with flock(LOCK_EX) for the run's life (the kernel drops it
 * when the process dies, however it dies), and every run first reclaims
 * the stale ones of its prog in its parent. */
typedef struct zo_tool_rundir {
    char path[4200]; /* "" when none */
    int lock;        /* the owner file, held locked; -1 when none */
} zo_tool_rundir;

/* Reclaim stale run directories of `prog` in `parent` (messages on stderr),
 * then make this run's and mark it. 0, or -1 with why (d->path ""). */
int zo_tool_rundir_make(zo_tool_rundir *d, const char *prog, const char *parent, char *why, size_t whylen);
/* Remove the run directory with everything in it (never following a
 * symlink) and let go of it. NULL or an empty one: nothing. */
void zo_tool_rundir_remove(zo_tool_rundir *d);
/* Remove every directory <parent>/<prog>-XXXXXX that is a stale run
 * directory: not a symlink, owned by this effective user and not writable
 * by others, holding a regular owner file of this user that no live
 * process holds locked and whose owner (pid, boot id, start time) is not
 * running. Anything else named like one is left alone. Its contents go
 * without following symlinks. Returns how many were removed; *bytes (may be
 * NULL) gets the disk space they held. Says what it removed on stderr. */
int zo_tool_rundir_reclaim(const char *prog, const char *parent, uint64_t *bytes);

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

/* ---- option tables ------------------------------------------------------------ */
/* A tool's options as one table: each entry names its option and the
 * function that takes its value, where a tool otherwise keeps an enum, a
 * struct option array and a switch that must agree with each other. The
 * messages stay the tool's own: set says what is wrong (the formats must be
 * literals for -Wformat=2, so they live in the set functions, not in the
 * table). */
typedef struct zo_tool_opt zo_tool_opt;
typedef struct zo_tool_cli zo_tool_cli;

struct zo_tool_opt {
    const char *name; /* the long option, without "--" */
    int has_arg;      /* 1: takes a value (required), 0: none */
    int short_name;   /* its one-letter form (-x), or 0 */
    /* Takes the option's value (NULL without one): 0, or the exit status
     * the tool ends with (a usage error: 2) */
    int (*set)(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg);
    void *dst;                 /* where set stores the value */
    unsigned long long lo, hi; /* bounds, for set */
    const char *what;          /* words for set's messages (a range, a list), or NULL */
};

/* The tool and its table */
struct zo_tool_cli {
    const char *prog;       /* "prog: " starts the messages of the sets below */
    void (*usage)(FILE *f); /* the usage text, for zo_tool_opt_help */
    const zo_tool_opt *opt;
    size_t nopt;            /* at most ZO_TOOL_OPTS_MAX */
};

/* getopt_long's struct option array is built on the stack, so a table has a bound */
#define ZO_TOOL_OPTS_MAX 64

/* Parse argv's options by cli's table (getopt_long, the short forms from
 * the entries' short_name; opterr as the caller set it), calling each
 * option's set in argv's order; optind is left at the first operand.
 * Returns 0 when every option was taken; the first non-zero status a set
 * returned; or -1 at an option no entry takes (unknown, or its value
 * missing: argv[optind - 1]), for the tool to say. A table of more than
 * ZO_TOOL_OPTS_MAX entries is a bug in the tool: abort(). */
int zo_tool_opts_parse(const zo_tool_cli *cli, int argc, char **argv);
/* The same with getopt_long quiet (opterr 0), no operands, and the benches'
 * usual words for what is wrong: "prog: unknown option or missing value: X
 * (--help lists them)", "prog: unexpected argument 'X'". 0, or the exit
 * status (2: bad usage). */
int zo_tool_opts_parse_strict(const zo_tool_cli *cli, int argc, char **argv);

/* Sets any tool may use. on, off: *(int *)dst = 1, 0; str: *(const char **)dst = arg. */
int zo_tool_opt_on(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg);
int zo_tool_opt_off(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg);
int zo_tool_opt_str(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg);
/* --help: cli->usage on stdout, then exit(0). */
int zo_tool_opt_help(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg);
/* A device backend (zo_dev_kind_parse) into *(zo_dev_kind *)dst;
 * else "prog: --NAME ARG: expected host or cuda", 2. */
int zo_tool_opt_dev_kind(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg);
/* f32 or bf16 (zo_dtype_parse) into *(zo_dtype *)dst; else
 * "prog: --NAME ARG: expected f32 or bf16", 2. */
int zo_tool_opt_f32_bf16(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg);
/* An optimizer state type: "fp32" / "f32" or "bf16" (*bits 0), or "q8" /
 * "q4" (fp32 moments block-quantized: *dt fp32, *bits 8 / 4). 0 or -EINVAL. */
int zo_tool_state_parse(const char *s, zo_dtype *dt, int *bits);
/* Its name: "f32", "bf16", "q8", "q4". */
const char *zo_tool_state_name(zo_dtype dt, int bits);

/* ---- cleanup when the tool is interrupted ------------------------------------ */
/* Install handlers for SIGINT, SIGTERM and SIGHUP that kill the running fio
 * child's process group (zo_fio_run), remove the registered paths, and then
 * let the same signal end the process (a shell sees 128 + N). A signal the
 * tool was started with ignored (nohup, a background job without job
 * control) stays ignored. Call once, early in main. 0, or -1 (errno). */
int zo_tool_cleanup_signals(void);
/* Remove path if such a signal arrives: a file, or (dir != 0) a directory
 * with the files in it. Adding a path dropped before arms it again; at
 * most 16 distinct paths a process (a slot is never given to another
 * path, see tool_common.c). Main thread only. 0, or -1 (table full, path
 * empty or too long, or registered before with the other dir: then the
 * tool's own cleanup at exit is all there is). */
int zo_tool_cleanup_add(const char *path, int dir);
/* Forget path (the tool removes it itself, or keeps it). */
void zo_tool_cleanup_drop(const char *path);

/* Median of n values (n >= 1); v is not reordered. */
double zo_median(const double *v, unsigned n);

/* ---- fio, for comparisons on the same path ---------------------------------- */
typedef struct zo_fio_job {
    const char *fio;           /* the binary; NULL: fio in PATH */
    const char *filename;      /* --filename (several: ':'-separated) */
    uint64_t size;             /* --size, per job */
    uint64_t bs;               /* --bs */
    unsigned iodepth, numjobs; /* --iodepth, --numjobs */
    uint64_t offset_increment; /* --offset_increment (0: not given) */
    const char *rw;            /* --rw: "read", "write", "rw"... */
    unsigned rwmixread;        /* --rwmixread with rw "rw" (0: not given) */
    unsigned loops;            /* --loops (0: not given) */
    uint64_t runtime_ms;       /* --time_based --runtime=N ms: over the file as often as that takes (0: one pass) */
    int direct;                /* --direct */
    int fixedbufs, sqpoll;     /* --fixedbufs, --sqthread_poll=1 */
    const char *iomem;         /* --iomem (NULL: fio's default, malloc) */
} zo_fio_job;

typedef struct zo_fio_result {
    double bw[2];   /* read, write: bytes/s */
    double cpu_s;   /* user + system CPU seconds of every job */
    char err[256];  /* why it failed */
} zo_fio_result;

/* Run fio (ioengine io_uring, --registerfiles --thread, group reporting,
 * terse output) and parse its bandwidths. 0, or -1 with res->err set.
 * fio runs in its own process group with PR_SET_PDEATHSIG(SIGKILL), so it
 * dies with the tool however the tool dies (call it from the main thread:
 * the death signal follows the thread that forked), and the handlers of
 * zo_tool_cleanup_signals() kill that group. */
int zo_fio_run(const zo_fio_job *job, zo_fio_result *res);

/* The command line zo_fio_run runs for job, the binary first, arguments
 * separated by one space (for the tools' output and JSON). 0, or -1 (buf
 * too small, out of memory). */
int zo_fio_cmdline(const zo_fio_job *job, char *buf, size_t len);

/* Write all `len` bytes of buf at offset off, resuming short writes and
 * EINTR. 0, or the errno that stopped it (a write that makes no progress
 * and reports no error is ENOSPC: nothing left to write into). */
int zo_tool_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);

/* Lay fio's file out before its first timed run: `size` bytes of a non-zero
 * pattern written with O_DIRECT (buffered where the filesystem refuses
 * it), then fsync. Left to fio, the layout is buffered, and the kernel's
 * write-back of those dirty pages runs under the next timed runs (it slowed
 * zo-store-bench's first sweep to 0.24-1.5 GB/s against 1.6-2.0). fio
 * reuses a file of its size as it is. The file is made with
 * zo_tool_open_data(). 0, or -1 with the reason in why. */
int zo_fio_file_prepare(const char *path, uint64_t size, char *why, size_t len);

/* Whether fio's --iomem=shmhuge buffers (per job iodepth x bs and a page of
 * alignment, in whole huge pages) fit the huge pages free now
 * (/proc/meminfo HugePages_Free less HugePages_Rsvd; none at all when
 * /proc/sys/vm/nr_hugepages is 0). 1 yes; 0 no, the reason in why. */
int zo_fio_hugepages_fit(uint64_t bs, unsigned iodepth, unsigned numjobs, char *why, size_t len);

#endif
