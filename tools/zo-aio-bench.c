/* SPDX-License-Identifier: Apache-2.0 */
/* zo-aio-bench: the storage benchmark to run before training. It drives the
 * zoffload aio engine the way the NVMe swap store does (block-size chunks,
 * a queue depth per I/O thread, registered pinned buffers, O_DIRECT) and
 * reports bandwidth, IOPS, request latency percentiles and CPU time; it
 * sweeps block size x queue depth x threads and prints the best as a ready
 * config block; and it compares itself with fio on the same file.
 *
 * Exit status: 0 success; 1 a run failed (I/O error, verification
 * mismatch, fio failed); 2 bad usage or input (options, paths). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "tool_common.h"

#define MAX_PATHS 16
#define MAX_GRID 16
#define EXIT_RUN 1
#define EXIT_USAGE 2

enum { OP_READ = 0, OP_WRITE = 1 };
static const char *const op_names[2] = {"read", "write"};

/* ---- options ---------------------------------------------------------------- */
typedef struct opts {
    int do_read, do_write;   /* separate passes: write first, then read */
    unsigned mix_r, mix_w;   /* --mixed R:W (both nonzero), else 0 */
    uint64_t size;           /* bytes per path */
    uint64_t bs, req;        /* block size; request size (0 = bs) */
    unsigned qd, threads;
    const char *paths[MAX_PATHS];
    int npaths;
    int direct, registered, sqpoll;
    int plain_buffers;       /* --buffers plain: zo_aligned_alloc, 4 KiB pages */
    zo_aio_backend backend;
    int verify;
    unsigned loops;
    int json, sweep, vs_fio;
    unsigned pairs;
    const char *fio;
    const char *fio_iomem; /* fio --iomem= (e.g. shmhuge for huge-page buffers) */
    int keep;
    int progress; /* -1 auto (a terminal), 0 off, 1 on */
    uint64_t grid_bs[MAX_GRID];
    unsigned grid_qd[MAX_GRID], grid_threads[MAX_GRID];
    int n_bs, n_qd, n_threads;
    /* --through-store: the swap store (nvme/) on the same engine */
    int through_store;
    unsigned tensors;
    uint64_t tensor_size;
    zo_csum_kind csum;
    unsigned csum_threads; /* UINT_MAX: the swap store's default */
} opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zo-aio-bench [options]\n"
            "what to run (default: --write then --read):\n"
            "  --read, --write        sequential passes over the file(s); both: write first\n"
            "  --mixed R:W            reads and writes at once in the ratio R:W (the swap pattern)\n"
            "  --verify               write a pattern, read it back, check every byte\n"
            "  --loops N              passes over the data per measurement (default 1)\n"
            "where:\n"
            "  --path P               a file, or a directory to hold zo-aio-bench.N.dat (default /var/tmp);\n"
            "                         repeat to stripe over several drives\n"
            "  --size SIZE            bytes per path: 13522, 64M, 1G (=2^30), 1GB (=10^9); default 1G\n"
            "  --keep                 keep the data files the tool created\n"
            "how:\n"
            "  --block-size SIZE      engine chunk size, a power of two >= 4K (default 1M)\n"
            "  --queue-depth N        chunks in flight per I/O thread, 1..4096 (default 32)\n"
            "  --threads N            I/O threads, one ring each (default 1)\n"
            "  --request-size SIZE    bytes per request handed to the engine (default: the block size)\n"
            "  --direct | --buffered  O_DIRECT (default) or the page cache\n"
            "  --registered | --unregistered  fixed (registered) buffers (default) or not\n"
            "  --sqpoll               io_uring kernel submission thread\n"
            "  --buffers pinned|plain pinned (default: locked, huge pages where possible) or plain\n"
            "                         aligned memory (4 KiB pages, as fio's own buffers)\n"
            "  --backend B            uring, threads or auto (default auto)\n"
            "comparisons:\n"
            "  --sweep                grid over block size x queue depth x threads; prints the best\n"
            "                         as config blocks for zoffload and DeepSpeed's \"aio\" section\n"
            "  --sweep-bs LIST, --sweep-qd LIST, --sweep-threads LIST   the grid (comma lists)\n"
            "  --vs-fio               alternate fio (io_uring, direct, fixedbufs, registerfiles, same\n"
            "                         bs/QD/jobs/size/file) with this tool; prints both and the median ratio\n"
            "  --pairs N              pairs for --vs-fio (default 5)\n"
            "  --fio PATH             the fio binary (default: fio in PATH)\n"
            "  --fio-iomem MODE       fio's buffer memory (--iomem=MODE), e.g. shmhuge for huge pages\n"
            "                         (needs /proc/sys/vm/nr_hugepages); like-for-like with --buffers pinned\n"
            "through the swap store:\n"
            "  --through-store        move tensors out to and back in from a zo_swap in the --path\n"
            "                         directories (striped over several): swap-out, then swap-in, with a\n"
            "                         checksum per block computed on the way out and verified on the way in;\n"
            "                         --size is then the size of fio's file per path for --vs-fio\n"
            "  --tensors N            tensors (default 4)\n"
            "  --tensor-size SIZE     bytes per tensor (default 256M)\n"
            "  --checksum crc32c|xxh3|none   (default crc32c); --no-checksum is --checksum none\n"
            "  --csum-threads N       the swap store's checksum threads (default: its default; 0: inline)\n"
            "output:\n"
            "  --json                 one JSON object on stdout\n"
            "  --progress | --no-progress   progress line on stderr (default: when stderr is a terminal)\n"
            "Units: GB = 10^9 bytes, GiB = 2^30 bytes; latency is per request, submission to completion.\n");
}

/* usage errors: "zo-aio-bench: message" on stderr, exit status 2 (tool_common.c) */
#define bad(...) zo_tool_bad("zo-aio-bench", __VA_ARGS__)

static int parse_uint(const char *s, unsigned long long max, unsigned long long *out)
{
    if (!s || !*s || !isdigit((unsigned char)*s))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

/* Split a comma list into at most `max` items, each non-empty ("1,,2",
 * a trailing comma and over-long lists are errors, not silently shortened). */
static int split_list(const char *s, char *buf, size_t bufsz, char **items, int max)
{
    if (strlen(s) >= bufsz)
        return -EINVAL;
    memcpy(buf, s, strlen(s) + 1);
    int n = 0;
    for (char *p = buf, *tok; (tok = strsep(&p, ",")) != NULL;) {
        if (!*tok || n == max)
            return -EINVAL;
        items[n++] = tok;
    }
    return n;
}

static int parse_size_list(const char *s, uint64_t *out, int max, int *n)
{
    char buf[512], *items[64];
    int k = split_list(s, buf, sizeof(buf), items, (max < 64 ? max : 64));
    if (k <= 0)
        return -EINVAL;
    for (int i = 0; i < k; i++)
        if (zo_parse_size(items[i], &out[i]) != 0)
            return -EINVAL;
    *n = k;
    return 0;
}

static int parse_uint_list(const char *s, unsigned *out, int max, int *n, unsigned long long lim)
{
    char buf[512], *items[64];
    int k = split_list(s, buf, sizeof(buf), items, (max < 64 ? max : 64));
    if (k <= 0)
        return -EINVAL;
    for (int i = 0; i < k; i++) {
        unsigned long long v;
        if (parse_uint(items[i], lim, &v) != 0 || v == 0)
            return -EINVAL;
        out[i] = (unsigned)v;
    }
    *n = k;
    return 0;
}

static int check_bs(uint64_t bs, const char *what)
{
    if (bs < 4096 || bs > ZO_AIO_MAX_BLOCK_SIZE || (bs & (bs - 1)))
        return bad("%s %llu: must be a power of two from 4096 to %u", what, (unsigned long long)bs,
                   ZO_AIO_MAX_BLOCK_SIZE);
    return 0;
}

static int check_qd(unsigned long long qd)
{
    if (qd == 0 || qd > ZO_AIO_MAX_QUEUE_DEPTH)
        return bad("queue depth %llu: must be 1..%d", qd, ZO_AIO_MAX_QUEUE_DEPTH);
    return 0;
}

static int check_threads(unsigned long long t)
{
    if (t == 0 || t > ZO_AIO_MAX_THREADS)
        return bad("threads %llu: must be 1..%d", t, ZO_AIO_MAX_THREADS);
    return 0;
}

enum {
    OPT_READ = 256, OPT_WRITE, OPT_MIXED, OPT_SIZE, OPT_BS, OPT_QD, OPT_THREADS, OPT_REQ, OPT_PATH, OPT_DIRECT, OPT_BUFFERED,
    OPT_REG, OPT_UNREG, OPT_SQPOLL, OPT_BACKEND, OPT_VERIFY, OPT_LOOPS, OPT_JSON, OPT_SWEEP, OPT_SWEEP_BS, OPT_SWEEP_QD,
    OPT_SWEEP_T, OPT_VSFIO, OPT_PAIRS, OPT_FIO, OPT_KEEP, OPT_PROGRESS, OPT_NOPROGRESS, OPT_HELP, OPT_BUFFERS, OPT_FIO_IOMEM,
    OPT_STORE, OPT_TENSORS, OPT_TSIZE, OPT_CSUM, OPT_NOCSUM, OPT_CSTH,
};

static int parse_opts(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"read", no_argument, 0, OPT_READ},          {"write", no_argument, 0, OPT_WRITE},
        {"mixed", required_argument, 0, OPT_MIXED},  {"size", required_argument, 0, OPT_SIZE},
        {"block-size", required_argument, 0, OPT_BS}, {"queue-depth", required_argument, 0, OPT_QD},
        {"threads", required_argument, 0, OPT_THREADS}, {"request-size", required_argument, 0, OPT_REQ},
        {"path", required_argument, 0, OPT_PATH},     {"direct", no_argument, 0, OPT_DIRECT},
        {"buffered", no_argument, 0, OPT_BUFFERED},   {"registered", no_argument, 0, OPT_REG},
        {"unregistered", no_argument, 0, OPT_UNREG},  {"sqpoll", no_argument, 0, OPT_SQPOLL},
        {"backend", required_argument, 0, OPT_BACKEND}, {"verify", no_argument, 0, OPT_VERIFY},
        {"loops", required_argument, 0, OPT_LOOPS},   {"json", no_argument, 0, OPT_JSON},
        {"sweep", no_argument, 0, OPT_SWEEP},         {"sweep-bs", required_argument, 0, OPT_SWEEP_BS},
        {"sweep-qd", required_argument, 0, OPT_SWEEP_QD}, {"sweep-threads", required_argument, 0, OPT_SWEEP_T},
        {"vs-fio", no_argument, 0, OPT_VSFIO},        {"pairs", required_argument, 0, OPT_PAIRS},
        {"fio", required_argument, 0, OPT_FIO},       {"fio-iomem", required_argument, 0, OPT_FIO_IOMEM},       {"keep", no_argument, 0, OPT_KEEP},
        {"progress", no_argument, 0, OPT_PROGRESS},   {"no-progress", no_argument, 0, OPT_NOPROGRESS},
        {"help", no_argument, 0, OPT_HELP},         {"buffers", required_argument, 0, OPT_BUFFERS},
        {"through-store", no_argument, 0, OPT_STORE}, {"tensors", required_argument, 0, OPT_TENSORS},
        {"tensor-size", required_argument, 0, OPT_TSIZE}, {"checksum", required_argument, 0, OPT_CSUM},
        {"no-checksum", no_argument, 0, OPT_NOCSUM},  {"csum-threads", required_argument, 0, OPT_CSTH},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof(*o));
    o->size = 1ull << 30;
    o->bs = 1u << 20;
    o->qd = 32;
    o->threads = 1;
    o->direct = 1;
    o->registered = 1;
    o->backend = ZO_AIO_AUTO;
    o->loops = 1;
    o->pairs = 5;
    o->progress = -1;
    o->tensors = 4;
    o->tensor_size = 256ull << 20;
    o->csum = ZO_CSUM_CRC32C;
    o->csum_threads = UINT_MAX;
    int size_given = 0;
    int c, rc;
    unsigned long long v;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case OPT_READ: o->do_read = 1; break;
        case OPT_WRITE: o->do_write = 1; break;
        case OPT_MIXED: {
            unsigned a = 0, b = 0;
            char tail;
            if (sscanf(optarg, "%u:%u%c", &a, &b, &tail) != 2 || !a || !b || a > 1000 || b > 1000)
                return bad("--mixed %s: expected R:W with both parts 1..1000 (e.g. 1:1, 3:1)", optarg);
            o->mix_r = a;
            o->mix_w = b;
            break;
        }
        case OPT_SIZE:
            if (zo_parse_size(optarg, &o->size) != 0)
                return bad("--size %s: not a size (examples: 13522, 64M, 1G, 1GB)", optarg);
            if (o->size == 0)
                return bad("--size 0: nothing to do; give a positive byte count");
            if (o->size > (1ull << 50))
                return bad("--size %s: more than 1 PiB per path", optarg);
            size_given = 1;
            break;
        case OPT_BS:
            if (zo_parse_size(optarg, &o->bs) != 0)
                return bad("--block-size %s: not a size", optarg);
            if ((rc = check_bs(o->bs, "--block-size")))
                return rc;
            break;
        case OPT_REQ:
            if (zo_parse_size(optarg, &o->req) != 0 || o->req == 0 || o->req > (1ull << 32))
                return bad("--request-size %s: must be a size from 1 byte to 4G", optarg);
            break;
        case OPT_QD:
        case OPT_THREADS:
            if (parse_uint(optarg, ~0ull, &v) != 0)
                return bad("--%s %s: not a number", c == OPT_QD ? "queue-depth" : "threads", optarg);
            if ((rc = c == OPT_QD ? check_qd(v) : check_threads(v)))
                return rc;
            *(c == OPT_QD ? &o->qd : &o->threads) = (unsigned)v;
            break;
        case OPT_PATH:
            if (o->npaths == MAX_PATHS)
                return bad("at most %d --path options", MAX_PATHS);
            if (!*optarg)
                return bad("--path: empty");
            o->paths[o->npaths++] = optarg;
            break;
        case OPT_DIRECT: o->direct = 1; break;
        case OPT_BUFFERED: o->direct = 0; break;
        case OPT_REG: o->registered = 1; break;
        case OPT_UNREG: o->registered = 0; break;
        case OPT_SQPOLL: o->sqpoll = 1; break;
        case OPT_BUFFERS:
            if (!strcmp(optarg, "pinned"))
                o->plain_buffers = 0;
            else if (!strcmp(optarg, "plain"))
                o->plain_buffers = 1;
            else
                return bad("--buffers %s: expected pinned or plain", optarg);
            break;
        case OPT_BACKEND:
            if (!strcmp(optarg, "uring"))
                o->backend = ZO_AIO_URING;
            else if (!strcmp(optarg, "threads"))
                o->backend = ZO_AIO_THREADS;
            else if (!strcmp(optarg, "auto"))
                o->backend = ZO_AIO_AUTO;
            else
                return bad("--backend %s: expected uring, threads or auto", optarg);
            break;
        case OPT_VERIFY: o->verify = 1; break;
        case OPT_LOOPS:
            if (parse_uint(optarg, 1000000, &v) != 0 || v == 0)
                return bad("--loops %s: must be 1..1000000", optarg);
            o->loops = (unsigned)v;
            break;
        case OPT_JSON: o->json = 1; break;
        case OPT_SWEEP: o->sweep = 1; break;
        case OPT_SWEEP_BS:
            if (parse_size_list(optarg, o->grid_bs, MAX_GRID, &o->n_bs) != 0)
                return bad("--sweep-bs %s: expected a comma list of sizes (at most %d)", optarg, MAX_GRID);
            for (int i = 0; i < o->n_bs; i++)
                if ((rc = check_bs(o->grid_bs[i], "--sweep-bs")))
                    return rc;
            break;
        case OPT_SWEEP_QD:
            if (parse_uint_list(optarg, o->grid_qd, MAX_GRID, &o->n_qd, ZO_AIO_MAX_QUEUE_DEPTH) != 0)
                return bad("--sweep-qd %s: expected a comma list of 1..%d", optarg, ZO_AIO_MAX_QUEUE_DEPTH);
            break;
        case OPT_SWEEP_T:
            if (parse_uint_list(optarg, o->grid_threads, MAX_GRID, &o->n_threads, ZO_AIO_MAX_THREADS) != 0)
                return bad("--sweep-threads %s: expected a comma list of 1..%d", optarg, ZO_AIO_MAX_THREADS);
            break;
        case OPT_VSFIO: o->vs_fio = 1; break;
        case OPT_PAIRS:
            if (parse_uint(optarg, 1000, &v) != 0 || v == 0)
                return bad("--pairs %s: must be 1..1000", optarg);
            o->pairs = (unsigned)v;
            break;
        case OPT_FIO: o->fio = optarg; break;
        case OPT_FIO_IOMEM: o->fio_iomem = optarg; break;
        case OPT_KEEP: o->keep = 1; break;
        case OPT_STORE: o->through_store = 1; break;
        case OPT_TENSORS:
            if (parse_uint(optarg, 1u << 20, &v) != 0 || v == 0)
                return bad("--tensors %s: must be 1..1048576", optarg);
            o->tensors = (unsigned)v;
            break;
        case OPT_TSIZE:
            if (zo_parse_size(optarg, &o->tensor_size) != 0 || o->tensor_size == 0 || o->tensor_size > (1ull << 46))
                return bad("--tensor-size %s: must be a size from 1 byte to 64T", optarg);
            break;
        case OPT_CSUM:
            if (zo_csum_parse(optarg, &o->csum) != 0)
                return bad("--checksum %s: expected crc32c, xxh3 or none", optarg);
            if (!zo_csum_available(o->csum))
                return bad("--checksum %s: not built in (libxxhash missing)", optarg);
            break;
        case OPT_NOCSUM: o->csum = ZO_CSUM_NONE; break;
        case OPT_CSTH:
            if (parse_uint(optarg, 64, &v) != 0)
                return bad("--csum-threads %s: must be 0..64", optarg);
            o->csum_threads = (unsigned)v;
            break;
        case OPT_PROGRESS: o->progress = 1; break;
        case OPT_NOPROGRESS: o->progress = 0; break;
        case 'h':
        case OPT_HELP: usage(stdout); exit(0);
        default:
            if (optopt)
                return bad("option %s needs a value or is unknown (--help lists them)", argv[optind - 1]);
            return bad("unknown option %s (--help lists them)", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad("unexpected argument '%s' (--help lists the options)", argv[optind]);
    if (o->mix_r && (o->do_read || o->do_write))
        return bad("--mixed runs reads and writes together: do not add --read/--write");
    if (o->sweep && o->vs_fio)
        return bad("--sweep and --vs-fio: run them separately");
    if (!o->mix_r && !o->do_read && !o->do_write)
        o->do_read = o->do_write = 1;
    if (o->verify && o->mix_r)
        return bad("--verify checks sequential passes; it cannot be combined with --mixed");
    if (o->verify)
        o->do_read = o->do_write = 1;
    if (!o->npaths)
        o->paths[o->npaths++] = "/var/tmp";
    if (!o->n_bs) {
        static const uint64_t d[] = {256u << 10, 1u << 20, 4u << 20};
        memcpy(o->grid_bs, d, sizeof(d));
        o->n_bs = 3;
    }
    if (!o->n_qd) {
        static const unsigned d[] = {8, 32, 128};
        memcpy(o->grid_qd, d, sizeof(d));
        o->n_qd = 3;
    }
    if (!o->n_threads) {
        o->grid_threads[0] = 1;
        o->grid_threads[1] = 2;
        o->n_threads = 2;
    }
    if (o->progress < 0)
        o->progress = isatty(2) && !o->json;
    if (o->through_store) {
        if (o->mix_r || o->sweep)
            return bad("--through-store runs swap-out then swap-in: no --mixed or --sweep");
        if (o->req && o->req != o->bs)
            return bad("--through-store moves one block per request: drop --request-size");
        if (o->tensors * o->tensor_size / o->tensors != o->tensor_size)
            return bad("--tensors x --tensor-size overflows");
        /* swap-in needs what swap-out wrote */
        o->do_read = o->do_write = 1;
        /* fio's file per path (for --vs-fio) holds the same bytes in all */
        if (!size_given) {
            uint64_t total = (uint64_t)o->tensors * o->tensor_size;
            o->size = (total / (uint64_t)o->npaths + o->bs - 1) / o->bs * o->bs;
        }
    }
    return 0;
}

/* ---- data files ---------------------------------------------------------------- */
typedef struct target {
    char path[4096];
    int created;   /* made by this tool: removed at exit unless --keep */
    zo_file *f;
} target;

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The pattern --verify writes: 8-byte words, a hash of (path index, offset). */
static inline uint64_t pattern_word(unsigned t, uint64_t off8)
{
    uint64_t z = off8 ^ ((uint64_t)t << 56) ^ 0x5bd1e9955bd1e995ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void pattern_fill(uint8_t *buf, size_t len, unsigned t, uint64_t off)
{
    size_t i = 0;
    while (i < len && ((off + i) & 7)) {
        uint64_t w = pattern_word(t, (off + i) & ~7ull);
        buf[i] = (uint8_t)(w >> (8 * ((off + i) & 7)));
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pattern_word(t, off + i);
        memcpy(buf + i, &w, 8);
    }
    for (; i < len; i++) {
        uint64_t w = pattern_word(t, (off + i) & ~7ull);
        buf[i] = (uint8_t)(w >> (8 * ((off + i) & 7)));
    }
}

/* First byte of buf that differs from the pattern, or -1. */
static int64_t pattern_check(const uint8_t *buf, size_t len, unsigned t, uint64_t off, uint8_t *scratch)
{
    pattern_fill(scratch, len, t, off);
    if (!memcmp(buf, scratch, len))
        return -1;
    size_t i = 0;
    while (buf[i] == scratch[i])
        i++;
    return (int64_t)i;
}

/* Fill [0, size) of fd with the pattern of path i, with plain synchronous
 * writes. A short write is resumed; the error that stops it (ENOSPC on a
 * full filesystem) is the one reported, never a stale errno. 0 or errno. */
static int fill_file(int fd, unsigned i, uint64_t size)
{
    size_t chunk = 8u << 20;
    uint8_t *buf = malloc(chunk);
    if (!buf)
        return ENOMEM;
    int e = 0;
    for (uint64_t off = 0; off < size && !e;) {
        size_t n = (size_t)(size - off < chunk ? size - off : chunk);
        pattern_fill(buf, n, i, off);
        e = zo_tool_pwrite_all(fd, buf, n, off);
        off += n;
    }
    free(buf);
    if (!e && fdatasync(fd) != 0)
        e = errno;
    return e;
}

/* Open (creating when needed) the file behind each --path. Files this tool
 * creates, or finds too small among its own, are preallocated and written
 * once (untimed) so reads meet real data, never unwritten extents. A user's
 * existing file is never extended or rewritten for a read pass.
 *
 * Files the tool makes (its own zo-aio-bench.N.dat in a directory, or a
 * --path file that does not exist yet) are opened through
 * zo_tool_open_data(): created O_EXCL | O_NOFOLLOW mode 0600, or, when
 * something is already there, reused only if it is a regular file of ours
 * with one link (a killed earlier run's leftover, or --keep); a planted
 * symlink or someone else's file is refused. A file the user names and that
 * exists is the user's choice and is opened as named (a symlink to a block
 * device is fine there). */
static int open_targets(const opts *o, target *tg, int need_data)
{
    dev_t devs[MAX_PATHS];
    ino_t inos[MAX_PATHS];
    for (int i = 0; i < o->npaths; i++) {
        target *t = &tg[i];
        memset(t, 0, sizeof(*t));
        int own = 0;
        if (is_dir(o->paths[i])) {
            snprintf(t->path, sizeof(t->path), "%s/zo-aio-bench.%d.dat", o->paths[i], i);
            own = 1;
        } else {
            snprintf(t->path, sizeof(t->path), "%s", o->paths[i]);
        }
        struct stat st;
        int exists = stat(t->path, &st) == 0;
        int fd = -1, made = 0;
        if (own || !exists) {
            char why[4300];
            fd = zo_tool_open_data(t->path, &made, why, sizeof(why));
            if (fd < 0)
                return bad("%s", why);
            if (made && !o->keep) /* from its creation on, not after the engine opened it */
                zo_tool_cleanup_add(t->path, 0);
            exists = 1;
        }
        /* a user's existing file is opened for writing only when a pass
         * writes; the tool's own files are created and filled as needed */
        int writes = o->do_write || o->mix_r || o->verify || fd >= 0;
        unsigned fl = (writes ? ZO_FILE_WRITE : 0) | ZO_FILE_READ | (o->direct ? 0 : ZO_FILE_BUFFERED) |
                      (fd >= 0 ? ZO_FILE_NOFOLLOW : 0);
        int rc = zo_file_open(&t->f, t->path, fl);
        if (rc) {
            if (made) {
                unlink(t->path);
                zo_tool_cleanup_drop(t->path);
            }
            if (fd >= 0)
                close(fd);
            return bad("cannot open %s: %s (%s)", t->path, zo_strerror(rc), zo_last_error_detail());
        }
        t->created = made;
        if (fd >= 0) {
            /* the engine's file must be the one we examined */
            struct stat a, b;
            if (fstat(fd, &a) != 0 || lstat(t->path, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
                close(fd);
                return bad("%s changed while it was being opened: refusing it", t->path);
            }
        }
        /* the same file under two --path (or one path given twice) would
         * have two stripes write the same bytes with different patterns:
         * --verify would then report corruption that is not there */
        if (stat(t->path, &st) == 0) {
            devs[i] = st.st_dev;
            inos[i] = st.st_ino;
            for (int j = 0; j < i; j++)
                if (devs[j] == devs[i] && inos[j] == inos[i])
                    return bad("--path %s and --path %s name the same file (%s): give each file once",
                               o->paths[j], o->paths[i], t->path);
        } else {
            devs[i] = 0;
            inos[i] = 0;
        }
        zo_file_info info;
        zo_file_get_info(t->f, &info);
        if (o->direct && !info.direct)
            fprintf(stderr, "zo-aio-bench: note: %s: %s; measuring buffered I/O\n", t->path, info.fallback);
        if (need_data && info.size < o->size && fd >= 0) {
            t->created = t->created || own;
            if (t->created && !o->keep)
                zo_tool_cleanup_add(t->path, 0);
            rc = zo_file_allocate(t->f, 0, o->size);
            if (rc && rc != -EOPNOTSUPP) {
                close(fd);
                return fprintf(stderr, "zo-aio-bench: cannot reserve %llu bytes for %s: %s (%s)\n",
                               (unsigned long long)o->size, t->path, zo_strerror(rc), zo_last_error_detail()),
                       EXIT_RUN;
            }
            /* write it once, through the descriptor we examined (no second
             * open by name); without fallocate (ext2, vfat...) a full disk
             * shows here, and must be reported as such */
            int e = fill_file(fd, (unsigned)i, o->size);
            if (e) {
                close(fd);
                return fprintf(stderr, "zo-aio-bench: cannot fill %s with %llu bytes: %s\n", t->path,
                               (unsigned long long)o->size, strerror(e)),
                       EXIT_RUN;
            }
        }
        if (fd >= 0)
            close(fd);
    }
    return 0;
}

static void close_targets(const opts *o, target *tg)
{
    for (int i = 0; i < o->npaths; i++) {
        zo_file_close(&tg[i].f);
        if (tg[i].created && !o->keep && tg[i].path[0]) {
            unlink(tg[i].path);
            zo_tool_cleanup_drop(tg[i].path);
        }
    }
}

/* ---- latency histogram (log-linear, about 3% resolution) -------------------------- */
#define HB_SUB 32
#define HB_N (64 + 40 * HB_SUB)

typedef struct hist {
    _Atomic uint64_t b[HB_N];
    _Atomic uint64_t n, sum_ns, max_ns;
} hist;

static unsigned hist_index(uint64_t v)
{
    if (v < 64)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    unsigned idx = 64 + (e - 6) * HB_SUB + (unsigned)((v >> (e - 5)) & (HB_SUB - 1));
    return idx < HB_N ? idx : HB_N - 1;
}

static uint64_t hist_value(unsigned idx) /* middle of the bucket */
{
    if (idx < 64)
        return idx;
    unsigned e = (idx - 64) / HB_SUB + 6, sub = (idx - 64) % HB_SUB;
    uint64_t lo = (1ull << e) + ((uint64_t)sub << (e - 5));
    return lo + (1ull << (e - 6));
}

static void hist_add(hist *h, uint64_t ns)
{
    atomic_fetch_add_explicit(&h->b[hist_index(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->n, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
    while (ns > m && !atomic_compare_exchange_weak(&h->max_ns, &m, ns)) {
    }
}

static double hist_pct_us(hist *h, double p)
{
    uint64_t n = atomic_load(&h->n);
    if (!n)
        return NAN;
    uint64_t want = (uint64_t)ceil(p * (double)n), acc = 0;
    if (want == 0)
        want = 1;
    for (unsigned i = 0; i < HB_N; i++) {
        acc += atomic_load(&h->b[i]);
        if (acc >= want)
            return (double)hist_value(i) / 1000.0;
    }
    return (double)atomic_load(&h->max_ns) / 1000.0;
}

/* ---- one measurement -------------------------------------------------------------- */
typedef struct params {
    uint64_t bs, req;
    unsigned qd, threads;
    int mode; /* OP_READ, OP_WRITE, or -1 for mixed */
    int verify;
} params;

typedef struct op_res {
    uint64_t bytes, ios;
    hist *h;
} op_res;

typedef struct run_res {
    op_res op[2];
    double seconds, cpu_s;
    int rc;                 /* 0 or the first error */
    char err[320];
    int64_t verify_bad_off; /* -1: all good */
    uint64_t verified;
    zo_aio_info info;
    zo_aio_stats st;
    int registered;
    double segs_per_block; /* physical memory segments per block of the buffers; 0 = unknown */
} run_res;

struct run;

typedef struct slot {
    struct run *run;
    uint8_t *buf;
    uint8_t *scratch; /* verify */
    uint64_t t0;
    uint64_t k;
    int op;
    unsigned tgt;
    uint64_t off;
    size_t len;
} slot;

typedef struct run {
    const opts *o;
    const params *pp;
    target *tg;
    zo_aio *a;
    run_res *res;
    uint64_t per_file;      /* requests per file per loop */
    uint64_t total;         /* requests in the measurement */
    _Atomic uint64_t next;  /* next request number to hand out */
    _Atomic uint64_t issued; /* requests handed to the engine (counted before submission) */
    _Atomic uint64_t completed;
    _Atomic uint64_t bytes_done;
    _Atomic uint64_t op_bytes[2];
    _Atomic int failed;
    uint64_t t_end;
    pthread_mutex_t m;
    pthread_cond_t cv;
    int finished;
} run;

/* ---- --through-store: one swap store and its engine for the whole
 * program, since swap-in reads what swap-out wrote ----------------------------- */
typedef struct store_ctx {
    zo_aio *a;
    zo_swap *sw;
    zo_swap_id *ids;
} store_ctx;
static store_ctx g_store;

static unsigned ntargets(const opts *o)
{
    return o->through_store ? o->tensors : (unsigned)o->npaths;
}

static uint64_t target_size(const opts *o)
{
    return o->through_store ? o->tensor_size : o->size;
}

static void store_close(void)
{
    zo_swap_destroy(&g_store.sw);
    zo_aio_destroy(&g_store.a);
    free(g_store.ids);
    g_store.ids = NULL;
}

static int store_open(const opts *o, const zo_aio_config *cfg)
{
    if (g_store.sw)
        return 0;
    int rc = zo_aio_create(&g_store.a, cfg);
    if (rc)
        return rc;
    zo_swap_config sc;
    zo_swap_config_default(&sc);
    sc.dirs = o->paths;
    sc.ndirs = (unsigned)o->npaths;
    sc.chunk_size = o->bs;
    /* Arenas sized from the run, not the 1 GiB default, which a tiny run
     * would reserve (fallocate) per directory: each tensor is striped over
     * the directories in chunks, so a directory holds at most
     * ceil(chunks / ndirs) chunks of each tensor. Big runs keep the default
     * as the growth step; a short estimate only means a second arena. */
    {
        uint64_t chunks = (o->tensor_size + o->bs - 1) / o->bs;
        uint64_t per_dir = (chunks + (uint64_t)o->npaths - 1) / (uint64_t)o->npaths * o->bs * o->tensors;
        if (per_dir < sc.arena_size)
            sc.arena_size = per_dir > o->bs ? per_dir : o->bs;
    }
    sc.checksum = o->csum;
    if (o->csum_threads != UINT_MAX)
        sc.csum_threads = o->csum_threads;
    sc.keep_files = o->keep;
    sc.buffered = !o->direct;
    sc.aio = g_store.a;
    g_store.ids = calloc(o->tensors, sizeof(*g_store.ids));
    if (!g_store.ids || (rc = zo_swap_create(&g_store.sw, &sc)) != 0) {
        store_close();
        return rc ? rc : -ENOMEM;
    }
    for (unsigned i = 0; i < o->tensors; i++) {
        char name[32];
        snprintf(name, sizeof(name), "tensor%u", i);
        if ((rc = zo_swap_alloc(g_store.sw, o->tensor_size, name, &g_store.ids[i])) != 0) {
            store_close();
            return rc;
        }
    }
    return 0;
}

static int op_of(const run *r, uint64_t k)
{
    if (r->pp->mode >= 0)
        return r->pp->mode;
    /* interleave R:W evenly: request k writes when the W share steps */
    uint64_t R = r->o->mix_r, W = r->o->mix_w;
    return ((k + 1) * W / (R + W)) > (k * W / (R + W)) ? OP_WRITE : OP_READ;
}

static void finish(run *r)
{
    pthread_mutex_lock(&r->m);
    r->finished = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->m);
}

static void on_done(void *user, int64_t result);

/* A swap store I/O completed (every chunk verified on the way in). */
static void on_swap_done(void *user, int err)
{
    slot *s = user;
    on_done(user, err < 0 ? (int64_t)err : (int64_t)s->len);
}

/* The run is over when every request handed out has completed: each
 * completion hands out its successor (issued++) before it counts itself
 * (completed++), so completed == issued means nothing is in flight. */
static void count_completion(run *r, uint64_t t1)
{
    uint64_t c = atomic_fetch_add(&r->completed, 1) + 1;
    if (c == atomic_load(&r->issued)) {
        r->t_end = t1;
        finish(r);
    }
}

static void fail_run(run *r, int rc, const char *detail)
{
    if (!atomic_exchange(&r->failed, 1)) {
        r->res->rc = rc;
        snprintf(r->res->err, sizeof(r->res->err), "%s", detail);
    }
}

/* Submit request k from slot s; issued already counts it. */
static void issue(slot *s, uint64_t k)
{
    run *r = s->run;
    const opts *o = r->o;
    uint64_t nt = ntargets(o), tsize = target_size(o);
    uint64_t in_loop = k % (r->per_file * nt);
    s->k = k;
    s->tgt = (unsigned)(in_loop % nt);
    uint64_t j = in_loop / nt;
    s->off = j * r->pp->req;
    s->len = (size_t)(tsize - s->off < r->pp->req ? tsize - s->off : r->pp->req);
    s->op = op_of(r, k);
    if (s->op == OP_WRITE && r->pp->verify)
        pattern_fill(s->buf, s->len, s->tgt, s->off);
    s->t0 = now_ns();
    int rc;
    if (o->through_store) {
        zo_swap_id id = g_store.ids[s->tgt];
        rc = s->op == OP_READ ? zo_swap_read(g_store.sw, id, s->off, s->buf, s->len, on_swap_done, s, NULL)
                              : zo_swap_write(g_store.sw, id, s->off, s->buf, s->len, on_swap_done, s, NULL);
    } else {
        zo_file *f = r->tg[s->tgt].f;
        rc = s->op == OP_READ ? zo_aio_read(r->a, f, s->buf, s->len, s->off, on_done, s, NULL)
                              : zo_aio_write(r->a, f, s->buf, s->len, s->off, on_done, s, NULL);
    }
    if (rc) {
        fail_run(r, rc, zo_last_error_detail());
        count_completion(r, now_ns());
    }
}

static void on_done(void *user, int64_t result)
{
    slot *s = user;
    run *r = s->run;
    uint64_t t1 = now_ns();
    if (result < 0) {
        fail_run(r, (int)result, zo_last_error_detail());
    } else {
        hist_add(r->res->op[s->op].h, t1 - s->t0);
        atomic_fetch_add_explicit(&r->op_bytes[s->op], s->len, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->bytes_done, s->len, memory_order_relaxed);
        if (s->op == OP_READ && r->pp->verify) {
            int64_t badoff = pattern_check(s->buf, s->len, s->tgt, s->off, s->scratch);
            if (badoff >= 0) {
                char msg[320];
                if (r->o->through_store)
                    snprintf(msg, sizeof(msg), "verify: tensor%u byte %llu differs from what was swapped out", s->tgt,
                             (unsigned long long)(s->off + (uint64_t)badoff));
                else
                    snprintf(msg, sizeof(msg), "verify: %s byte %llu differs from what was written",
                             r->tg[s->tgt].path, (unsigned long long)(s->off + (uint64_t)badoff));
                fail_run(r, -EIO, msg);
            }
        }
    }
    /* the next request, from this completion: a closed loop per slot */
    if (!atomic_load(&r->failed)) {
        uint64_t k = atomic_fetch_add(&r->next, 1);
        if (k < r->total) {
            atomic_fetch_add(&r->issued, 1);
            issue(s, k);
        }
    }
    count_completion(r, t1);
}

/* How many physically contiguous runs a block of the buffers has, on
 * average (from /proc/self/pagemap; page frame numbers need
 * CAP_SYS_ADMIN, else 0 = unknown). Devices take a limited number of
 * segments per request (virtio-blk: often 254), so this explains much of
 * the difference between huge-page and 4 KiB-page buffers. */
static double buffer_segments(const uint8_t *p, size_t bytes, size_t block)
{
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), segs = 0, blocks = 0;
    if (block > bytes)
        block = bytes;
    for (size_t b = 0; b + block <= bytes && blocks < 64; b += block, blocks++) {
        uint64_t prev = 0;
        for (size_t o = 0; o < block; o += pg) {
            uint64_t e = 0;
            if (pread(fd, &e, 8, (off_t)(((uintptr_t)(p + b + o) / pg) * 8)) != 8 || !(e & (1ull << 63))) {
                close(fd);
                return 0;
            }
            uint64_t frame = e & ((1ull << 55) - 1);
            if (!frame) { /* no permission to see frames */
                close(fd);
                return 0;
            }
            if (o == 0 || frame != prev + 1)
                segs++;
            prev = frame;
        }
    }
    close(fd);
    return blocks ? (double)segs / (double)blocks : 0;
}

static double cpu_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}

static void progress_line(const char *what, double frac, double gbps, double eta)
{
    fprintf(stderr, "\r  %-6s %5.1f%%  %7.2f GB/s  ETA %5.0f s ", what, frac * 100.0, gbps, eta);
    fflush(stderr);
}

static void pool_free(const opts *o, void *pool)
{
    if (o->plain_buffers)
        zo_aligned_free(pool);
    else
        zo_pinned_free(pool);
}

static int run_one(const opts *o, target *tg, const params *pp, run_res *res)
{
    memset(res, 0, sizeof(*res));
    res->verify_bad_off = -1;
    hist *h[2] = {calloc(1, sizeof(hist)), calloc(1, sizeof(hist))};
    if (!h[0] || !h[1]) {
        free(h[0]);
        free(h[1]);
        return fprintf(stderr, "zo-aio-bench: out of memory\n"), EXIT_RUN;
    }
    res->op[0].h = h[0];
    res->op[1].h = h[1];

    zo_aio_config cfg;
    zo_aio_config_default(&cfg);
    cfg.backend = o->backend;
    cfg.threads = pp->threads;
    cfg.queue_depth = pp->qd;
    cfg.block_size = pp->bs;
    cfg.sqpoll = o->sqpoll;
    cfg.register_buffers = o->registered;
    zo_aio *a = NULL;
    int rc = o->through_store ? store_open(o, &cfg) : zo_aio_create(&a, &cfg);
    if (rc) {
        fprintf(stderr, "zo-aio-bench: cannot create the engine%s: %s (%s)\n",
                o->through_store ? " or the swap store" : "", zo_strerror(rc), zo_last_error_detail());
        free(h[0]);
        free(h[1]);
        return rc == ZO_ECONFIG ? EXIT_USAGE : EXIT_RUN;
    }
    zo_aio_stats st0 = {0};
    if (o->through_store) { /* the engine lives on: count this run only */
        a = g_store.a;
        zo_aio_get_stats(a, &st0);
    }
    zo_aio_get_info(a, &res->info);

    run r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    r.pp = pp;
    r.tg = tg;
    r.a = a;
    r.res = res;
    r.per_file = (target_size(o) + pp->req - 1) / pp->req;
    r.total = r.per_file * (uint64_t)ntargets(o) * o->loops;
    pthread_mutex_init(&r.m, NULL);
    pthread_cond_init(&r.cv, NULL);

    /* enough requests in flight to keep every ring's queue full */
    uint64_t chunks_per_req = (pp->req + pp->bs - 1) / pp->bs;
    uint64_t window = ((uint64_t)pp->qd * pp->threads + chunks_per_req - 1) / chunks_per_req;
    if (window > r.total)
        window = r.total;
    if (window < 1)
        window = 1;
    size_t stride = (size_t)((pp->req + 4095) & ~4095ull);
    size_t pool_bytes = stride * (size_t)window;
    if (pool_bytes > (8ull << 30)) {
        if (!o->through_store)
            zo_aio_destroy(&a);
        free(h[0]);
        free(h[1]);
        return bad("buffers for %llu requests of %llu bytes exceed 8 GiB: lower --queue-depth/--threads/--request-size",
                   (unsigned long long)window, (unsigned long long)pp->req);
    }
    void *pool = NULL;
    rc = o->plain_buffers ? zo_aligned_alloc(&pool, pool_bytes, 4096) : zo_pinned_alloc(&pool, pool_bytes, NULL);
    uint8_t *scratch = pp->verify ? malloc(stride * (size_t)window) : NULL;
    slot *slots = calloc((size_t)window, sizeof(slot));
    if (rc || !slots || (pp->verify && !scratch)) {
        pool_free(o, pool);
        free(scratch);
        free(slots);
        if (!o->through_store)
            zo_aio_destroy(&a);
        free(h[0]);
        free(h[1]);
        return fprintf(stderr, "zo-aio-bench: cannot allocate %zu bytes of buffers\n", pool_bytes), EXIT_RUN;
    }
    /* write data that is not all zeros */
    for (size_t i = 0; i < pool_bytes; i += 8) {
        uint64_t w = pattern_word(99, i);
        memcpy((uint8_t *)pool + i, &w, 8);
    }
    if (o->registered) {
        rc = zo_aio_register_region(a, pool, pool_bytes, &res->registered);
        if (rc)
            fprintf(stderr, "zo-aio-bench: note: buffers not registered: %s\n", zo_strerror(rc));
    }
    res->segs_per_block = buffer_segments(pool, pool_bytes, pp->bs);
    for (uint64_t i = 0; i < window; i++) {
        slots[i].run = &r;
        slots[i].buf = (uint8_t *)pool + i * stride;
        slots[i].scratch = scratch ? scratch + i * stride : NULL;
    }

    double c0 = cpu_now();
    uint64_t t0 = now_ns();
    atomic_store(&r.next, window);
    atomic_store(&r.issued, window);
    for (uint64_t i = 0; i < window; i++)
        issue(&slots[i], i);

    const char *what = pp->mode < 0 ? "mixed" : op_names[pp->mode];
    uint64_t total_bytes = target_size(o) * (uint64_t)ntargets(o) * o->loops;
    int shown = 0;
    pthread_mutex_lock(&r.m);
    while (!r.finished) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r.cv, &r.m, &ts);
        if (!r.finished && o->progress) {
            double el = (double)(now_ns() - t0) * 1e-9;
            double done = (double)atomic_load(&r.bytes_done);
            if (el > 1.0) {
                double rate = done / el;
                progress_line(what, done / (double)total_bytes, rate * 1e-9,
                              rate > 0 ? ((double)total_bytes - done) / rate : 0);
                shown = 1;
            }
        }
    }
    pthread_mutex_unlock(&r.m);
    if (shown)
        fprintf(stderr, "\r%60s\r", "");
    int wrc = zo_aio_wait_all(a);
    double c1 = cpu_now();
    if (!r.t_end)
        r.t_end = now_ns();
    res->seconds = (double)(r.t_end - t0) * 1e-9;
    res->cpu_s = c1 - c0;
    if (!res->rc && wrc)
        res->rc = wrc;
    for (int op = 0; op < 2; op++) {
        res->op[op].ios = atomic_load(&h[op]->n);
        res->op[op].bytes = atomic_load(&r.op_bytes[op]);
    }
    if (!res->rc && pp->verify && pp->mode == OP_READ)
        res->verified = res->op[OP_READ].bytes;
    zo_aio_get_stats(a, &res->st);
    if (o->through_store) {
        uint64_t *now = (uint64_t *)&res->st;
        const uint64_t *before = (const uint64_t *)&st0;
        for (size_t i = 0; i < sizeof(zo_aio_stats) / sizeof(uint64_t); i++)
            now[i] -= before[i];
        if (o->registered)
            zo_aio_unregister_region(a, pool);
    } else {
        zo_aio_destroy(&a);
    }
    pool_free(o, pool);
    free(scratch);
    free(slots);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.m);
    return 0;
}

static void free_res(run_res *r)
{
    free(r->op[0].h);
    free(r->op[1].h);
    r->op[0].h = r->op[1].h = NULL;
}

/* ---- reporting ---------------------------------------------------------------------------- */
static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, len, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1u << 20))
        snprintf(buf, len, "%.2f MiB", (double)b / (double)(1u << 20));
    else if (b >= 1024)
        snprintf(buf, len, "%.2f KiB", (double)b / 1024.0);
    else
        snprintf(buf, len, "%llu B", (unsigned long long)b);
}

static void print_header(void)
{
    printf("%-6s %12s %9s %8s %8s %9s %9s %9s %9s %8s\n", "op", "bytes", "seconds", "GB/s", "GiB/s", "IOPS",
           "p50 us", "p99 us", "p99.9 us", "cpu s");
}

static void print_row(const char *op, const op_res *r, double secs, double cpu)
{
    char b[32];
    fmt_bytes(b, sizeof(b), r->bytes);
    double bps = secs > 0 ? (double)r->bytes / secs : 0;
    printf("%-6s %12s %9.3f %8.3f %8.3f %9.0f %9.1f %9.1f %9.1f %8.3f\n", op, b, secs, bps * 1e-9,
           bps / (double)(1ull << 30), secs > 0 ? (double)r->ios / secs : 0, hist_pct_us(r->h, 0.50),
           hist_pct_us(r->h, 0.99), hist_pct_us(r->h, 0.999), cpu);
}

static void json_row(zo_json *j, const char *op, const op_res *r, double secs, double cpu, int cpu_shared)
{
    zj_obj_begin(j, NULL);
    zj_str(j, "op", op);
    zj_uint(j, "bytes", r->bytes);
    zj_num(j, "seconds", secs);
    double bps = secs > 0 ? (double)r->bytes / secs : 0;
    zj_num(j, "bytes_per_s", bps);
    zj_num(j, "GB_per_s", bps * 1e-9);
    zj_num(j, "GiB_per_s", bps / (double)(1ull << 30));
    zj_uint(j, "ios", r->ios);
    zj_num(j, "iops", secs > 0 ? (double)r->ios / secs : 0);
    zj_obj_begin(j, "lat_us");
    zj_num(j, "mean", r->ios ? (double)atomic_load(&r->h->sum_ns) / (double)r->ios / 1000.0 : NAN);
    zj_num(j, "p50", hist_pct_us(r->h, 0.50));
    zj_num(j, "p99", hist_pct_us(r->h, 0.99));
    zj_num(j, "p999", hist_pct_us(r->h, 0.999));
    zj_num(j, "max", (double)atomic_load(&r->h->max_ns) / 1000.0);
    zj_obj_end(j);
    zj_num(j, "cpu_s", cpu);
    zj_bool(j, "cpu_shared", cpu_shared);
    zj_obj_end(j);
}

static void json_config(zo_json *j, const opts *o, const params *pp, const run_res *r, const target *tg)
{
    zj_obj_begin(j, "config");
    zj_str(j, "backend", zo_aio_backend_name(r->info.backend));
    zj_str(j, "ring_setup", r->info.ring_setup);
    zj_str(j, "fallback", r->info.fallback);
    zj_uint(j, "threads", pp->threads);
    zj_uint(j, "queue_depth", pp->qd);
    zj_uint(j, "block_size", pp->bs);
    zj_uint(j, "request_size", pp->req);
    zj_uint(j, "size_per_path", o->size);
    zj_uint(j, "loops", o->loops);
    zj_bool(j, "direct", o->direct);
    zj_bool(j, "registered", r->registered);
    zj_bool(j, "sqpoll", r->info.sqpoll);
    zj_str(j, "buffers", o->plain_buffers ? "plain" : "pinned");
    if (r->segs_per_block > 0)
        zj_num(j, "buffer_segments_per_block", r->segs_per_block);
    else
        zj_null(j, "buffer_segments_per_block");
    zj_arr_begin(j, "paths");
    for (int i = 0; i < o->npaths; i++) {
        char sto[512];
        zo_path_storage(tg[i].path, sto, sizeof(sto));
        zj_obj_begin(j, NULL);
        zj_str(j, "file", tg[i].path);
        zj_str(j, "storage", sto);
        zj_obj_end(j);
    }
    zj_arr_end(j);
    if (o->through_store) {
        zj_obj_begin(j, "through_store");
        zj_uint(j, "tensors", o->tensors);
        zj_uint(j, "tensor_size", o->tensor_size);
        zj_uint(j, "chunk_size", o->bs);
        zj_str(j, "checksum", zo_csum_name(o->csum));
        zj_str(j, "crc32c_variant", zo_crc32c_variant());
        zo_swap_stats ss;
        zo_swap_get_stats(g_store.sw, &ss);
        zj_uint(j, "chunks_verified", ss.chunks_verified);
        zj_uint(j, "corrupt", ss.corrupt);
        zj_num(j, "checksum_cpu_s", (double)ss.csum_ns * 1e-9);
        zj_obj_end(j);
    }
    zj_obj_end(j);
}

static void json_stats(zo_json *j, const zo_aio_stats *s)
{
    zj_obj_begin(j, "engine_stats");
    zj_uint(j, "chunks", s->chunks);
    zj_uint(j, "fixed_chunks", s->fixed_chunks);
    zj_uint(j, "direct_chunks", s->direct_chunks);
    zj_uint(j, "buffered_chunks", s->buffered_chunks);
    zj_uint(j, "short_resumed", s->short_resumed);
    zj_uint(j, "eagain_retried", s->eagain_retried);
    zj_uint(j, "errors", s->errors);
    zj_obj_end(j);
}

static void print_engine(const opts *o, const params *pp, const run_res *r)
{
    char sz[32], bs[32], rq[32];
    fmt_bytes(sz, sizeof(sz), o->size);
    fmt_bytes(bs, sizeof(bs), pp->bs);
    fmt_bytes(rq, sizeof(rq), pp->req);
    printf("engine:  %s", zo_aio_backend_name(r->info.backend));
    if (r->info.backend == ZO_AIO_URING)
        printf(" (%s%s)", r->info.ring_setup, r->info.registered_files ? ", registered files" : "");
    else
        printf(" (%u pool threads)", r->info.pool_threads);
    printf(", %u thread%s, QD %u, block %s, request %s, %s, %s\n", pp->threads, pp->threads > 1 ? "s" : "", pp->qd,
           bs, rq, o->direct ? "O_DIRECT" : "buffered",
           r->registered ? "registered buffers" : o->registered ? "buffers NOT registered" : "unregistered buffers");
    if (o->through_store) {
        char ts[32];
        fmt_bytes(ts, sizeof(ts), o->tensor_size);
        printf("store:   %u tensor%s x %s through zo_swap over %d director%s, chunk %s, checksum %s%s%s, %u loop%s\n",
               o->tensors, o->tensors > 1 ? "s" : "", ts, o->npaths, o->npaths > 1 ? "ies" : "y", bs,
               zo_csum_name(o->csum), o->csum == ZO_CSUM_CRC32C ? " " : "",
               o->csum == ZO_CSUM_CRC32C ? zo_crc32c_variant() : "", o->loops, o->loops > 1 ? "s" : "");
    } else {
        printf("data:    %d file%s x %s, %u loop%s\n", o->npaths, o->npaths > 1 ? "s" : "", sz, o->loops,
               o->loops > 1 ? "s" : "");
    }
    if (r->segs_per_block > 0)
        printf("buffers: %s, %.1f physical segments per block on average\n",
               o->plain_buffers ? "plain (4 KiB pages)" : "pinned", r->segs_per_block);
    else
        printf("buffers: %s\n", o->plain_buffers ? "plain (4 KiB pages)" : "pinned");
    if (r->info.fallback[0])
        printf("note:    %s\n", r->info.fallback);
}

static int report_failure(const char *what, const run_res *r)
{
    fprintf(stderr, "zo-aio-bench: %s failed: %s: %s\n", what, zo_strerror(r->rc), r->err[0] ? r->err : "");
    return EXIT_RUN;
}

/* The report's head: tool, what it runs, machine, and each data file with
 * the filesystem and device behind it. */
static void print_banner(const opts *o, const target *tg, const zo_machine *m, const char *what)
{
    printf("zo-aio-bench %s%s%s%s\n", zo_version_string(), what[0] ? " " : "", what,
           o->through_store ? " (zoffload through the swap store)" : "");
    zo_machine_print(m, stdout);
    for (int i = 0; i < o->npaths; i++) {
        char sto[512];
        zo_path_storage(tg[i].path, sto, sizeof(sto));
        /* through the store without fio: the swap directories */
        printf("%s %s (%s)\n", o->through_store && !o->vs_fio ? "dir:    " : "file:   ", tg[i].path, sto);
    }
}

/* The passes a run makes, in order: -1 for a mixed run. Returns how many. */
static int run_modes(const opts *o, int modes[2])
{
    int n = 0;
    if (o->mix_r) {
        modes[n++] = -1;
    } else {
        if (o->do_write)
            modes[n++] = OP_WRITE;
        if (o->do_read)
            modes[n++] = OP_READ;
    }
    return n;
}

/* ---- plain runs ---------------------------------------------------------------------------- */
static params base_params(const opts *o)
{
    params p = {.bs = o->bs, .req = o->req ? o->req : o->bs, .qd = o->qd, .threads = o->threads};
    return p;
}

static int cmd_run(const opts *o, target *tg, const zo_machine *m)
{
    params pp = base_params(o);
    run_res rr[2];
    int modes[2];
    int nres = run_modes(o, modes);
    int rc = 0;
    for (int i = 0; i < nres; i++) {
        pp.mode = modes[i];
        pp.verify = o->verify;
        rc = run_one(o, tg, &pp, &rr[i]);
        if (rc) {
            for (int k = 0; k < i; k++)
                free_res(&rr[k]);
            return rc;
        }
        if (rr[i].rc) {
            rc = report_failure(modes[i] < 0 ? "mixed run" : op_names[modes[i]], &rr[i]);
            for (int k = 0; k <= i; k++)
                free_res(&rr[k]);
            return rc;
        }
    }
    if (o->json) {
        zo_json j;
        zj_init(&j, stdout, 1);
        zj_obj_begin(&j, NULL);
        zj_str(&j, "tool", "zo-aio-bench");
        zj_str(&j, "version", zo_version_string());
        zo_machine_json(m, &j, "machine");
        json_config(&j, o, &pp, &rr[0], tg);
        zj_str(&j, "units", "GB = 1e9 bytes, GiB = 2^30 bytes; latency per request");
        zj_arr_begin(&j, "results");
        for (int i = 0; i < nres; i++) {
            if (modes[i] < 0) {
                json_row(&j, "read", &rr[i].op[OP_READ], rr[i].seconds, rr[i].cpu_s, 1);
                json_row(&j, "write", &rr[i].op[OP_WRITE], rr[i].seconds, rr[i].cpu_s, 1);
            } else {
                json_row(&j, op_names[modes[i]], &rr[i].op[modes[i]], rr[i].seconds, rr[i].cpu_s, 0);
            }
        }
        zj_arr_end(&j);
        if (o->verify) {
            zj_obj_begin(&j, "verify");
            zj_uint(&j, "bytes_checked", rr[nres - 1].verified);
            zj_bool(&j, "ok", 1);
            zj_obj_end(&j);
        }
        json_stats(&j, &rr[nres - 1].st);
        zj_obj_end(&j);
        zj_end(&j);
    } else {
        print_banner(o, tg, m, "");
        print_engine(o, &pp, &rr[0]);
        printf("\n");
        print_header();
        for (int i = 0; i < nres; i++) {
            if (modes[i] < 0) {
                print_row("read", &rr[i].op[OP_READ], rr[i].seconds, rr[i].cpu_s);
                print_row("write", &rr[i].op[OP_WRITE], rr[i].seconds, rr[i].cpu_s);
            } else {
                print_row(op_names[modes[i]], &rr[i].op[modes[i]], rr[i].seconds, rr[i].cpu_s);
            }
        }
        printf("GB = 10^9 bytes, GiB = 2^30 bytes; latency per request (submission to completion)%s\n",
               o->mix_r ? "; mixed: both ops share the run time and CPU" : "");
        const zo_aio_stats *s = &rr[nres - 1].st;
        printf("engine:  %llu chunks (%llu direct, %llu buffered, %llu fixed-buffer), %llu short resumed, %llu "
               "EAGAIN retried\n",
               (unsigned long long)s->chunks, (unsigned long long)s->direct_chunks,
               (unsigned long long)s->buffered_chunks, (unsigned long long)s->fixed_chunks,
               (unsigned long long)s->short_resumed, (unsigned long long)s->eagain_retried);
        if (o->verify) {
            char b[32];
            fmt_bytes(b, sizeof(b), rr[nres - 1].verified);
            printf("verify:  OK, %s read back and checked byte for byte\n", b);
        }
        if (o->through_store) {
            zo_swap_stats ss;
            zo_swap_get_stats(g_store.sw, &ss);
            printf("store:   %llu chunks verified on swap-in, %llu corrupt, %.3f s of CPU computing checksums\n",
                   (unsigned long long)ss.chunks_verified, (unsigned long long)ss.corrupt, (double)ss.csum_ns * 1e-9);
        }
    }
    for (int i = 0; i < nres; i++)
        free_res(&rr[i]);
    return 0;
}

/* ---- sweep ----------------------------------------------------------------------------------- */
typedef struct point {
    params p;
    double bw[2]; /* bytes/s per op; 0 if not run */
    double score;
} point;

static void print_config_blocks(FILE *f, const params *p)
{
    fprintf(f,
            "zoffload (C):\n"
            "    zo_aio_config cfg;\n"
            "    zo_aio_config_default(&cfg);\n"
            "    cfg.block_size = %llu;\n"
            "    cfg.queue_depth = %u;\n"
            "    cfg.threads = %u;\n"
            "DeepSpeed (the \"aio\" section of its config; thread_count before 0.15, intra_op_parallelism after):\n"
            "    \"aio\": {\n"
            "      \"block_size\": %llu,\n"
            "      \"queue_depth\": %u,\n"
            "      \"thread_count\": %u,\n"
            "      \"intra_op_parallelism\": %u,\n"
            "      \"single_submit\": false,\n"
            "      \"overlap_events\": true\n"
            "    }\n",
            (unsigned long long)p->bs, p->qd, p->threads, (unsigned long long)p->bs, p->qd, p->threads, p->threads);
}

static int cmd_sweep(const opts *o, target *tg, const zo_machine *m)
{
    int npts = o->n_bs * o->n_qd * o->n_threads;
    point *pts = calloc((size_t)npts, sizeof(point));
    if (!pts)
        return EXIT_RUN;
    int ops[2], nops = 0;
    if (o->do_write || o->mix_r)
        ops[nops++] = OP_WRITE;
    if (o->do_read || o->mix_r)
        ops[nops++] = OP_READ;
    if (!o->json) {
        print_banner(o, tg, m, "sweep");
        char sz[32];
        fmt_bytes(sz, sizeof(sz), o->size);
        printf("data:    %s per file, %s, %s buffers, request = block size\n\n", sz,
               o->direct ? "O_DIRECT" : "buffered", o->registered ? "registered" : "unregistered");
        printf("%10s %6s %8s %12s %12s %12s\n", "block", "QD", "threads", "write GB/s", "read GB/s", "score");
    }
    int best = -1, n = 0, rc = 0;
    for (int a = 0; a < o->n_bs; a++)
        for (int b = 0; b < o->n_qd; b++)
            for (int c = 0; c < o->n_threads; c++, n++) {
                point *pt = &pts[n];
                pt->p = (params){.bs = o->grid_bs[a], .req = o->grid_bs[a], .qd = o->grid_qd[b],
                                 .threads = o->grid_threads[c]};
                for (int k = 0; k < nops; k++) {
                    run_res rr;
                    pt->p.mode = ops[k];
                    rc = run_one(o, tg, &pt->p, &rr);
                    if (rc) {
                        free(pts);
                        return rc;
                    }
                    if (rr.rc) {
                        rc = report_failure("sweep point", &rr);
                        free_res(&rr);
                        free(pts);
                        return rc;
                    }
                    pt->bw[ops[k]] = rr.seconds > 0 ? (double)rr.op[ops[k]].bytes / rr.seconds : 0;
                    free_res(&rr);
                }
                /* the time to read and write the same bytes: harmonic mean */
                if (nops == 2)
                    pt->score = 2.0 / (1.0 / pt->bw[OP_READ] + 1.0 / pt->bw[OP_WRITE]);
                else
                    pt->score = pt->bw[ops[0]];
                if (best < 0 || pt->score > pts[best].score)
                    best = n;
                if (!o->json) {
                    char bs[32];
                    fmt_bytes(bs, sizeof(bs), pt->p.bs);
                    printf("%10s %6u %8u %12.3f %12.3f %12.3f\n", bs, pt->p.qd, pt->p.threads,
                           pt->bw[OP_WRITE] * 1e-9, pt->bw[OP_READ] * 1e-9, pt->score * 1e-9);
                    fflush(stdout);
                }
            }
    point *bp = &pts[best];
    if (o->json) {
        zo_json j;
        zj_init(&j, stdout, 1);
        zj_obj_begin(&j, NULL);
        zj_str(&j, "tool", "zo-aio-bench");
        zj_str(&j, "mode", "sweep");
        zo_machine_json(m, &j, "machine");
        zj_uint(&j, "size_per_path", o->size);
        zj_bool(&j, "direct", o->direct);
        zj_str(&j, "score", nops == 2 ? "harmonic mean of read and write bytes_per_s" : "bytes_per_s");
        zj_arr_begin(&j, "points");
        for (int i = 0; i < npts; i++) {
            zj_obj_begin(&j, NULL);
            zj_uint(&j, "block_size", pts[i].p.bs);
            zj_uint(&j, "queue_depth", pts[i].p.qd);
            zj_uint(&j, "threads", pts[i].p.threads);
            if (pts[i].bw[OP_WRITE] > 0)
                zj_num(&j, "write_bytes_per_s", pts[i].bw[OP_WRITE]);
            if (pts[i].bw[OP_READ] > 0)
                zj_num(&j, "read_bytes_per_s", pts[i].bw[OP_READ]);
            zj_num(&j, "score", pts[i].score);
            zj_obj_end(&j);
        }
        zj_arr_end(&j);
        zj_obj_begin(&j, "best");
        zj_uint(&j, "block_size", bp->p.bs);
        zj_uint(&j, "queue_depth", bp->p.qd);
        zj_uint(&j, "threads", bp->p.threads);
        zj_num(&j, "score", bp->score);
        zj_obj_end(&j);
        zj_obj_begin(&j, "deepspeed_aio");
        zj_uint(&j, "block_size", bp->p.bs);
        zj_uint(&j, "queue_depth", bp->p.qd);
        zj_uint(&j, "thread_count", bp->p.threads);
        zj_uint(&j, "intra_op_parallelism", bp->p.threads);
        zj_bool(&j, "single_submit", 0);
        zj_bool(&j, "overlap_events", 1);
        zj_obj_end(&j);
        zj_obj_end(&j);
        zj_end(&j);
    } else {
        char bs[32];
        fmt_bytes(bs, sizeof(bs), bp->p.bs);
        printf("\nbest: block %s, QD %u, threads %u: write %.3f GB/s, read %.3f GB/s (GB = 10^9 bytes)\n\n", bs,
               bp->p.qd, bp->p.threads, bp->bw[OP_WRITE] * 1e-9, bp->bw[OP_READ] * 1e-9);
        print_config_blocks(stdout, &bp->p);
    }
    free(pts);
    return 0;
}

/* ---- fio comparison ------------------------------------------------------------------------------ */
typedef struct fio_res {
    double bw[2];  /* bytes/s */
    double cpu_s;
    int ok;
    char err[256];
} fio_res;

static int run_fio(const opts *o, const target *tg, const params *pp, int mode, fio_res *fr)
{
    memset(fr, 0, sizeof(*fr));
    char filenames[MAX_PATHS * 4100] = "";
    size_t fl = 0;
    for (int i = 0; i < o->npaths; i++)
        fl += (size_t)snprintf(filenames + fl, sizeof(filenames) - fl, "%s%s", i ? ":" : "", tg[i].path);
    uint64_t total = o->size * (uint64_t)o->npaths;
    uint64_t per_job = total / pp->threads;
    zo_fio_job jb = {
        .fio = o->fio,
        .filename = filenames,
        .size = per_job,
        .bs = pp->bs,
        .iodepth = pp->qd,
        .numjobs = pp->threads,
        .offset_increment = per_job,
        .rw = mode < 0 ? "rw" : mode == OP_READ ? "read" : "write",
        .rwmixread = mode < 0 ? (o->mix_r ? o->mix_r * 100 / (o->mix_r + o->mix_w) : 50) : 0,
        .loops = o->loops,
        .direct = o->direct,
        .fixedbufs = o->registered,
        .sqpoll = o->sqpoll,
        .iomem = o->fio_iomem,
    };
    zo_fio_result r;
    if (zo_fio_run(&jb, &r) != 0) {
        snprintf(fr->err, sizeof(fr->err), "%s", r.err);
        return -1;
    }
    fr->bw[OP_READ] = r.bw[0];
    fr->bw[OP_WRITE] = r.bw[1];
    fr->cpu_s = r.cpu_s;
    fr->ok = 1;
    return 0;
}

static double median(double *v, unsigned n)
{
    return zo_median(v, n);
}

static int cmd_vs_fio(const opts *o, target *tg, const zo_machine *m)
{
    params pp = base_params(o);
    if (pp.req != pp.bs)
        return bad("--vs-fio compares requests of one block (fio's bs): drop --request-size");
    int modes[2];
    int nm = run_modes(o, modes);
    unsigned P = o->pairs;
    double *zo_bw = calloc(2 * P * 2, sizeof(double)), *fio_bw = calloc(2 * P * 2, sizeof(double));
    double *zo_cpu = calloc(2 * P, sizeof(double)), *fio_cpu = calloc(2 * P, sizeof(double));
    if (!zo_bw || !fio_bw || !zo_cpu || !fio_cpu)
        return EXIT_RUN;
    zo_aio_info info = {0};
    int registered = 0;
    double seg_sum = 0;
    if (!o->json) {
        print_banner(o, tg, m, "vs fio");
        char bs[32], sz[32];
        fmt_bytes(bs, sizeof(bs), pp.bs);
        fmt_bytes(sz, sizeof(sz), o->size);
        printf("both:    bs %s, QD %u, %u job%s/thread%s, %s per file, %s, loops %u; fio: io_uring%s --registerfiles%s%s\n",
               bs, pp.qd, pp.threads, pp.threads > 1 ? "s" : "", pp.threads > 1 ? "s" : "", sz,
               o->direct ? "direct" : "buffered", o->loops, o->registered ? " --fixedbufs" : "",
               o->fio_iomem ? " --iomem=" : "", o->fio_iomem ? o->fio_iomem : "");
        if (o->through_store) {
            char ts[32];
            fmt_bytes(ts, sizeof(ts), o->tensor_size);
            printf("store:   %u tensors x %s in swap arenas in the same director%s, checksum %s%s%s\n", o->tensors, ts,
                   o->npaths > 1 ? "ies" : "y", zo_csum_name(o->csum), o->csum == ZO_CSUM_CRC32C ? " " : "",
                   o->csum == ZO_CSUM_CRC32C ? zo_crc32c_variant() : "");
        }
        printf("pairs:   %u, alternating fio, zoffload (GB/s, GB = 10^9 bytes)\n\n", P);
    }
    int rc = 0;
    for (int mi = 0; mi < nm; mi++) {
        int mode = modes[mi];
        pp.mode = mode;
        const char *mname = mode < 0 ? "mixed" : op_names[mode];
        if (!o->json)
            printf("%-6s %5s %12s %12s %8s\n", mname, "pair", "fio", "zoffload", "ratio");
        for (unsigned p = 0; p < P; p++) {
            fio_res fr;
            if (run_fio(o, tg, &pp, mode, &fr) != 0) {
                fprintf(stderr, "zo-aio-bench: fio failed: %s\n", fr.err);
                rc = EXIT_RUN;
                goto out;
            }
            run_res rr;
            rc = run_one(o, tg, &pp, &rr);
            if (rc)
                goto out;
            if (rr.rc) {
                rc = report_failure(mname, &rr);
                free_res(&rr);
                goto out;
            }
            info = rr.info;
            registered = rr.registered;
            seg_sum += rr.segs_per_block;
            double zb = 0, fb = 0;
            for (int op = 0; op < 2; op++) {
                double z = rr.seconds > 0 ? (double)rr.op[op].bytes / rr.seconds : 0;
                zo_bw[(mi * P + p) * 2 + op] = z;
                fio_bw[(mi * P + p) * 2 + op] = fr.bw[op];
                zb += z;
                fb += fr.bw[op];
            }
            zo_cpu[mi * P + p] = rr.cpu_s;
            fio_cpu[mi * P + p] = fr.cpu_s;
            free_res(&rr);
            if (!o->json) {
                printf("%-6s %5u %12.3f %12.3f %8.3f\n", "", p + 1, fb * 1e-9, zb * 1e-9, fb > 0 ? zb / fb : 0);
                fflush(stdout);
            }
        }
    }
    /* one row per op (a mixed run has a read row and a write row) */
    typedef struct {
        const char *op;
        int mixed;
        double fv[1000], zv[1000], rv[1000];
        double fmed, zmed, rmed, fcpu, zcpu;
    } cmp_row;
    cmp_row *rows = calloc(3, sizeof(cmp_row));
    int nrows = 0;
    if (!rows) {
        rc = EXIT_RUN;
        goto out;
    }
    for (int mi = 0; mi < nm; mi++)
        for (int op = 1; op >= 0; op--) {
            if (modes[mi] >= 0 && modes[mi] != op)
                continue;
            cmp_row *cr = &rows[nrows++];
            cr->op = op_names[op];
            cr->mixed = modes[mi] < 0;
            for (unsigned p = 0; p < P; p++) {
                cr->zv[p] = zo_bw[(mi * P + p) * 2 + op];
                cr->fv[p] = fio_bw[(mi * P + p) * 2 + op];
                cr->rv[p] = cr->fv[p] > 0 ? cr->zv[p] / cr->fv[p] : 0;
            }
            cr->fmed = median(cr->fv, P);
            cr->zmed = median(cr->zv, P);
            cr->rmed = median(cr->rv, P);
            cr->fcpu = median(fio_cpu + mi * P, P);
            cr->zcpu = median(zo_cpu + mi * P, P);
        }
    if (o->json) {
        zo_json j;
        zj_init(&j, stdout, 1);
        zj_obj_begin(&j, NULL);
        zj_str(&j, "tool", "zo-aio-bench");
        zj_str(&j, "mode", "vs-fio");
        zj_str(&j, "version", zo_version_string());
        zo_machine_json(m, &j, "machine");
        run_res cfgres = {.info = info, .registered = registered, .segs_per_block = seg_sum / (P * nm)};
        json_config(&j, o, &pp, &cfgres, tg);
        zj_uint(&j, "pairs", P);
        zj_str(&j, "fio_options", o->registered ? "--ioengine=io_uring --fixedbufs --registerfiles --thread"
                                                : "--ioengine=io_uring --registerfiles --thread");
        zj_str(&j, "fio_iomem", o->fio_iomem ? o->fio_iomem : "malloc (fio's default)");
        zj_arr_begin(&j, "comparisons");
        for (int i = 0; i < nrows; i++) {
            cmp_row *cr = &rows[i];
            zj_obj_begin(&j, NULL);
            zj_str(&j, "op", cr->op);
            zj_bool(&j, "mixed", cr->mixed);
            zj_arr_begin(&j, "fio_bytes_per_s");
            for (unsigned p = 0; p < P; p++)
                zj_num(&j, NULL, cr->fv[p]);
            zj_arr_end(&j);
            zj_arr_begin(&j, "zo_bytes_per_s");
            for (unsigned p = 0; p < P; p++)
                zj_num(&j, NULL, cr->zv[p]);
            zj_arr_end(&j);
            zj_arr_begin(&j, "ratios");
            for (unsigned p = 0; p < P; p++)
                zj_num(&j, NULL, cr->rv[p]);
            zj_arr_end(&j);
            zj_num(&j, "fio_median_bytes_per_s", cr->fmed);
            zj_num(&j, "zo_median_bytes_per_s", cr->zmed);
            zj_num(&j, "median_ratio", cr->rmed);
            zj_num(&j, "fio_cpu_s_median", cr->fcpu);
            zj_num(&j, "zo_cpu_s_median", cr->zcpu);
            zj_obj_end(&j);
        }
        zj_arr_end(&j);
        zj_obj_end(&j);
        zj_end(&j);
    } else {
        printf("\nmedians over %u pairs (GB/s, GB = 10^9 bytes; CPU seconds per run):\n", P);
        printf("%-12s %10s %10s %8s %9s %9s\n", "op", "fio", "zoffload", "ratio", "fio cpu", "zo cpu");
        for (int i = 0; i < nrows; i++) {
            cmp_row *cr = &rows[i];
            char name[32];
            snprintf(name, sizeof(name), "%s%s", cr->op, cr->mixed ? " (mixed)" : "");
            printf("%-12s %10.3f %10.3f %8.3f %9.3f %9.3f\n", name, cr->fmed * 1e-9, cr->zmed * 1e-9, cr->rmed,
                   cr->fcpu, cr->zcpu);
        }
        printf("ratio: zoffload / fio in each pair, then the median of the ratios\n");
        if (seg_sum > 0)
            printf("zoffload buffers: %s, %.1f physical segments per block on average (fio's buffers: %s)\n",
                   o->plain_buffers ? "plain" : "pinned", seg_sum / (P * nm),
                   o->fio_iomem ? o->fio_iomem : "malloc, 4 KiB pages");
    }
    free(rows);
out:
    free(zo_bw);
    free(fio_bw);
    free(zo_cpu);
    free(fio_cpu);
    return rc;
}

/* ---- main ----------------------------------------------------------------------------------------- */
int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;
    /* paths: a missing directory or a path whose directory is missing is
     * bad input, said plainly before anything runs */
    for (int i = 0; i < o.npaths; i++) {
        struct stat st;
        if (stat(o.paths[i], &st) == 0)
            continue;
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s", o.paths[i]);
        char *slash = strrchr(dir, '/');
        if (slash == dir)
            dir[1] = '\0';
        else if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof(dir), ".");
        if (!is_dir(dir))
            return bad("--path %s: directory %s does not exist", o.paths[i], dir);
        if (o.through_store) {
            /* the swap arenas' directory: made (0700) as the library makes
             * a checkpoint root, and left in place */
            char why[4300];
            if (zo_tool_mkdir(o.paths[i], why, sizeof(why)) != 0)
                return bad("--path %s: %s", o.paths[i], why);
            continue;
        }
        if (o.do_read && !o.do_write && !o.mix_r)
            return bad("--path %s: no such file to read (write it first, or give a directory)", o.paths[i]);
    }
    /* SIGINT/SIGTERM: end fio, remove the files this run made, then die */
    zo_tool_cleanup_signals();
    zo_machine m;
    zo_machine_get(&m);
    target tg[MAX_PATHS];
    memset(tg, 0, sizeof(tg));
    /* read passes need data on disk; a write-only run on a fresh file still
     * wants the extents allocated and written, as a swap file would be */
    if (o.through_store) {
        for (int i = 0; i < o.npaths; i++)
            if (!is_dir(o.paths[i]))
                return bad("--path %s: --through-store needs directories (for the swap arenas)", o.paths[i]);
    }
    if (o.through_store && !o.vs_fio) { /* no data file: only the swap arenas */
        for (int i = 0; i < o.npaths; i++)
            snprintf(tg[i].path, sizeof(tg[i].path), "%s", o.paths[i]);
        rc = 0;
    } else {
        rc = open_targets(&o, tg, 1);
    }
    if (!rc) {
        if (o.sweep)
            rc = cmd_sweep(&o, tg, &m);
        else if (o.vs_fio)
            rc = cmd_vs_fio(&o, tg, &m);
        else
            rc = cmd_run(&o, tg, &m);
    }
    close_targets(&o, tg);
    store_close();
    return rc;
}
