/* SPDX-License-Identifier: Apache-2.0 */
/* zo-tile-bench: the tiled linear against what it cannot beat.
 *
 * One layer y = x W^T, forward + backward (dx, and dW to a sink that takes
 * each tile on the device; no bias, so both sides run exactly the same
 * three GEMM shapes), measured three ways in every pair,
 * the order alternating from pair to pair:
 *   untiled  the same GEMMs, untiled, with W whole in device memory;
 *   host     the tiled linear, weight tiles homed in pinned host memory;
 *   nvme     the tiled linear, weight tiles homed on NVMe (--path).
 * With fio available, each pair also measures fio's sequential read
 * bandwidth on a file in --path, giving the NVMe bound
 *   max(untiled GEMM time, 2 x weight bytes / fio read bandwidth)
 * (the weights are read twice, once per pass). Reported: medians of each
 * time and of the per-pair ratios host/untiled and nvme/bound.
 *
 * fio runs in its best mode here (the project compares with each peer's
 * best): io_uring, O_DIRECT, registered files and fixed buffers, its
 * buffers in huge pages (--iomem=shmhuge) when enough are free (else fio's
 * default, said in the output), 4 MiB blocks at QD 8, on a file of at least
 * 512 MiB laid out once per run (in the warm-up round) and removed at the
 * end or on an interrupt. The fio command line is printed.
 *
 * Slot size: an NVMe tile read in place is at most one of the store's pool
 * slots, so by default (--slot-size auto) the slot is sized to the tile the
 * pinned-host home gets from the budget (a power of two MiB, 4..64 MiB):
 * both homes then walk the same grid.
 *
 *   --plan     print the tile grid chosen for each --budgets entry and exit
 *              (no device, no store): what the docs' table comes from.
 *
 * Fetch mode: on the host backend the tiled runs read tiles already in host
 * memory in place (the pinned home; an NVMe tile's pool slot when a tile
 * fits one), unless --copy-tiles asks for the copy into the device buffers
 * that a GPU does; the mode used is printed for each home.
 *
 * Pass boundaries, as a training loop drives a tiled layer: forward keeps
 * its last tile for backward, backward walks the tiles last to first (so
 * it starts with that tile, not read again), and at the end of each step
 * the next forward's first tile is prefetched (its read overlaps whatever
 * runs next: in training the optimizer step and the other layers; here the
 * bench's next run). A tiled run's timed region holds forward, backward,
 * every wait for a tile, and the prefetch call; only that one tile's read
 * can fall outside it. --no-keep, --no-prefetch and --in-order turn these
 * off, to compare.
 *
 * Exit status: 0 success; 1 a run failed; 2 bad usage or input. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "tool_common.h"

#define EXIT_RUN 1
#define EXIT_USAGE 2
#define MAX_BUDGETS 16
#define MAXU(a, b) ((a) > (b) ? (a) : (b))

typedef struct opts {
    uint64_t batch, out, in, budget, slot_size; /* slot_size 0: auto */
    uint64_t fio_size;                          /* 0: max(512 MiB, 2 x W) */
    uint32_t tile_out, tile_in;
    zo_dtype dtype;
    zo_dev_kind dev;
    unsigned pairs;
    const char *path, *fio;
    const char *fio_iomem; /* NULL: shmhuge when the huge pages fit, else fio's default */
    int json, plan, no_nvme, no_fio, copy_tiles;
    int no_keep, no_prefetch, in_order; /* the pass-boundary measures off (to compare) */
    unsigned read_ahead;                /* 0: the pool's default */
    uint64_t budgets[MAX_BUDGETS];
    unsigned nbudgets;
} opts;

#define bad(...) zo_tool_bad("zo-tile-bench", __VA_ARGS__)

static void usage(FILE *f)
{
    fprintf(f, "usage: zo-tile-bench [options]\n"
               "  --batch B            rows of x (default 16)\n"
               "  --out N              rows of W, output features (default 4096)\n"
               "  --in N               columns of W, input features (default 4096)\n"
               "  --dtype f32|bf16     weight and activation type (default f32)\n"
               "  --budget SIZE        device working-memory budget (default: a quarter of W's bytes)\n"
               "  --tile RxC           a given tile instead of a budget\n"
               "  --device host|cuda   device backend (default host)\n"
               "  --pairs N            alternating rounds, medians reported (default 5)\n"
               "  --path DIR           swap directory and fio's file (default /var/tmp)\n"
               "  --no-nvme            skip the NVMe-homed run and the fio bound\n"
               "  --slot-size SIZE|auto  the store's pinned pool slot: an NVMe-homed tile read in\n"
               "                       place is at most one slot. auto (default): the pinned-host\n"
               "                       home's tile rounded up to a power of two MiB, 4 MiB..64 MiB\n"
               "  --copy-tiles         copy every tile into the device buffers (the host backend\n"
               "                       otherwise reads tiles in host memory in place)\n"
               "  --no-keep            forward does not keep its last tile for backward\n"
               "  --no-prefetch        no zo_tiled_linear_prefetch() of the next forward's first tile\n"
               "  --read-ahead N       most NVMe tiles read ahead in place (default 0: what the\n"
               "                       store's pool allows; 1: the next tile only)\n"
               "  --in-order           backward walks the tiles first to last (the old order; no keep)\n"
               "  --fio PATH           the fio binary (default fio in PATH); --no-fio: no bound\n"
               "  --fio-iomem MODE     fio's buffer memory (--iomem=MODE; default shmhuge when the free\n"
               "                       huge pages hold fio's buffers, else fio's default, malloc)\n"
               "  --fio-size SIZE      fio's file (default the larger of 512 MiB and 2 x W's bytes)\n"
               "  --plan               print the grid for each --budgets entry and exit\n"
               "  --budgets LIST       comma list of sizes for --plan (default 8M,64M,512M)\n"
               "  --json               one JSON object on stdout\n");
}

static int parse_budgets(const char *s, opts *o)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    if (!*buf || buf[strlen(buf) - 1] == ',' || strstr(buf, ",,") || *buf == ',')
        return -1;
    o->nbudgets = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->nbudgets == MAX_BUDGETS || zo_parse_size(t, &o->budgets[o->nbudgets]) || !o->budgets[o->nbudgets])
            return -1;
        o->nbudgets++;
    }
    return 0;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    enum { OPT_B = 256, OPT_OUT, OPT_IN, OPT_DT, OPT_BUD, OPT_TILE, OPT_DEV, OPT_PR, OPT_PATH, OPT_NONVME, OPT_FIO, OPT_NOFIO, OPT_PLAN,
           OPT_BUDS, OPT_JSON, OPT_COPY, OPT_SLOT, OPT_NOKEEP, OPT_NOPRE, OPT_INORDER, OPT_AHEAD, OPT_FIOMEM,
           OPT_FIOSIZE, OPT_HELP };
    static const struct option lo[] = {
        {"batch", 1, 0, OPT_B},     {"out", 1, 0, OPT_OUT},        {"in", 1, 0, OPT_IN},       {"dtype", 1, 0, OPT_DT},
        {"budget", 1, 0, OPT_BUD},  {"tile", 1, 0, OPT_TILE},      {"device", 1, 0, OPT_DEV},  {"pairs", 1, 0, OPT_PR},
        {"path", 1, 0, OPT_PATH},   {"no-nvme", 0, 0, OPT_NONVME}, {"fio", 1, 0, OPT_FIO},     {"no-fio", 0, 0, OPT_NOFIO},
        {"plan", 0, 0, OPT_PLAN},   {"budgets", 1, 0, OPT_BUDS},   {"json", 0, 0, OPT_JSON},   {"help", 0, 0, OPT_HELP},
        {"copy-tiles", 0, 0, OPT_COPY}, {"slot-size", 1, 0, OPT_SLOT}, {"no-keep", 0, 0, OPT_NOKEEP},
        {"no-prefetch", 0, 0, OPT_NOPRE}, {"in-order", 0, 0, OPT_INORDER}, {"read-ahead", 1, 0, OPT_AHEAD},
        {"fio-iomem", 1, 0, OPT_FIOMEM}, {"fio-size", 1, 0, OPT_FIOSIZE},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof(*o));
    o->batch = 16;
    o->out = o->in = 4096;
    o->dtype = ZO_DTYPE_F32;
    o->dev = ZO_DEV_HOST;
    o->pairs = 5;
    o->path = "/var/tmp";
    parse_budgets("8M,64M,512M", o);
    unsigned long long v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case OPT_B:
        case OPT_OUT:
        case OPT_IN:
            if (zo_tool_parse_u(optarg, 1, 1u << 30, &v))
                return bad("%s %s: bad value (1..2^30)", argv[optind - 2], optarg);
            *(c == OPT_B ? &o->batch : c == OPT_OUT ? &o->out : &o->in) = v;
            break;
        case OPT_DT:
            if (zo_dtype_parse(optarg, &o->dtype) || (o->dtype != ZO_DTYPE_F32 && o->dtype != ZO_DTYPE_BF16))
                return bad("--dtype %s: expected f32 or bf16", optarg);
            break;
        case OPT_BUD:
            if (zo_parse_size(optarg, &o->budget) || o->budget == 0)
                return bad("--budget %s: not a size above 0", optarg);
            break;
        case OPT_SLOT:
            /* the store checks the rest (a multiple of the swap chunk size) */
            if (!strcmp(optarg, "auto"))
                o->slot_size = 0;
            else if (zo_parse_size(optarg, &o->slot_size) || o->slot_size == 0 || o->slot_size > ((uint64_t)1 << 30))
                return bad("--slot-size %s: not a size in (0, 1G] or auto", optarg);
            break;
        case OPT_FIOMEM:
            /* fio checks the mode itself (its list depends on its build) */
            if (!*optarg || strchr(optarg, ' '))
                return bad("--fio-iomem '%s': expected a fio --iomem mode, e.g. shmhuge or malloc", optarg);
            o->fio_iomem = optarg;
            break;
        case OPT_FIOSIZE:
            /* at most 1P: it is rounded up to fio's block size (a value near
             * 2^64 would wrap to a 0-byte file) */
            if (zo_parse_size(optarg, &o->fio_size) || o->fio_size < (1u << 20) || o->fio_size > (1ull << 50))
                return bad("--fio-size %s: not a size of at least 1M and at most 1P", optarg);
            break;
        case OPT_TILE: {
            unsigned a, b;
            char tail;
            if (sscanf(optarg, "%ux%u%c", &a, &b, &tail) != 2 || !a || !b)
                return bad("--tile %s: expected RxC, e.g. 512x4096", optarg);
            o->tile_out = a;
            o->tile_in = b;
            break;
        }
        case OPT_DEV:
            if (zo_dev_kind_parse(optarg, &o->dev))
                return bad("--device %s: expected host or cuda", optarg);
            break;
        case OPT_PR:
            if (zo_tool_parse_u(optarg, 1, 1000, &v))
                return bad("--pairs %s: bad value (1..1000)", optarg);
            o->pairs = (unsigned)v;
            break;
        case OPT_PATH: o->path = optarg; break;
        case OPT_NONVME: o->no_nvme = 1; break;
        case OPT_FIO: o->fio = optarg; break;
        case OPT_NOFIO: o->no_fio = 1; break;
        case OPT_PLAN: o->plan = 1; break;
        case OPT_BUDS:
            if (parse_budgets(optarg, o))
                return bad("--budgets %s: a comma list of up to %d sizes above 0", optarg, MAX_BUDGETS);
            break;
        case OPT_JSON: o->json = 1; break;
        case OPT_COPY: o->copy_tiles = 1; break;
        case OPT_NOKEEP: o->no_keep = 1; break;
        case OPT_NOPRE: o->no_prefetch = 1; break;
        case OPT_INORDER: o->in_order = 1; break;
        case OPT_AHEAD:
            if (zo_tool_parse_u(optarg, 0, 64, &v))
                return bad("--read-ahead %s: bad value (0..64)", optarg);
            o->read_ahead = (unsigned)v;
            break;
        case 'h':
        case OPT_HELP: usage(stdout); exit(0);
        default: return bad("unknown option or missing value: %s (--help lists them)", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad("unexpected argument '%s'", argv[optind]);
    if (o->budget && o->tile_out)
        return bad("--budget and --tile: give one");
    struct stat st;
    if (!o->plan && !o->no_nvme && (stat(o->path, &st) != 0 || !S_ISDIR(st.st_mode)))
        return bad("--path %s: not an existing directory", o->path);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fmt_bytes(char *b, size_t n, uint64_t v)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    int i = 0;
    while (d >= 1024 && i < 4) {
        d /= 1024;
        i++;
    }
    snprintf(b, n, i ? "%.1f %s" : "%.0f %s", d, u[i]);
}

static void grid_json(zo_json *j, const char *key, const zo_tile_grid *g)
{
    zj_obj_begin(j, key);
    zj_uint(j, "tile_out", g->tile_out);
    zj_uint(j, "tile_in", g->tile_in);
    zj_uint(j, "tiles_out", g->tiles_out);
    zj_uint(j, "tiles_in", g->tiles_in);
    zj_uint(j, "tile_bytes", g->tile_bytes);
    zj_uint(j, "work_bytes", g->work_bytes);
    zj_obj_end(j);
}

/* ---- --plan ---------------------------------------------------------------------------- */
static int cmd_plan(const opts *o)
{
    zo_json j;
    if (o->json) {
        zj_init(&j, stdout, 1);
        zj_obj_begin(&j, NULL);
        zj_uint(&j, "batch", o->batch);
        zj_uint(&j, "out", o->out);
        zj_uint(&j, "in", o->in);
        zj_str(&j, "dtype", zo_dtype_name(o->dtype));
        zj_arr_begin(&j, "plans");
    } else {
        printf("W [%llu x %llu] %s, x [%llu x %llu], forward + backward (dW tiles double-buffered)\n",
               (unsigned long long)o->out, (unsigned long long)o->in, zo_dtype_name(o->dtype),
               (unsigned long long)o->batch, (unsigned long long)o->in);
        printf("%12s  %14s  %10s  %12s  %12s\n", "budget", "tile", "grid", "tile bytes", "work bytes");
    }
    int rc = 0;
    for (unsigned i = 0; i < o->nbudgets; i++) {
        zo_tile_grid g;
        int r = zo_tile_plan(o->batch, o->out, o->in, o->dtype, o->budgets[i], ZO_TILE_TRAIN, &g);
        char bb[32], tb[32], wb[32];
        fmt_bytes(bb, sizeof(bb), o->budgets[i]);
        if (o->json) {
            zj_obj_begin(&j, NULL);
            zj_uint(&j, "budget", o->budgets[i]);
            if (r == 0)
                grid_json(&j, "grid", &g);
            else
                zj_str(&j, "error", zo_last_error_detail());
            zj_obj_end(&j);
        } else if (r == 0) {
            char tile[32], grid[32];
            fmt_bytes(tb, sizeof(tb), g.tile_bytes);
            fmt_bytes(wb, sizeof(wb), g.work_bytes);
            snprintf(tile, sizeof(tile), "%u x %u", g.tile_out, g.tile_in);
            snprintf(grid, sizeof(grid), "%u x %u", g.tiles_out, g.tiles_in);
            printf("%12s  %14s  %10s  %12s  %12s\n", bb, tile, grid, tb, wb);
        } else {
            printf("%12s  %s\n", bb, zo_last_error_detail());
        }
        if (r < 0 && r != ZO_EBUDGET)
            rc = EXIT_USAGE;
    }
    if (o->json) {
        zj_arr_end(&j);
        zj_obj_end(&j);
        zj_end(&j);
    }
    return rc;
}

/* ---- fio ------------------------------------------------------------------------------------ */
/* fio's blocks and queue depth. Its best mode on this machine's virtio
 * disk (io_uring, direct, fixedbufs, registerfiles, shmhuge; 1 GiB file,
 * alternated, nice'd, 2026-11): bs 4M QD 8 at 1.8-3.0 GB/s, bs 1M QD 32 at
 * 2.0-2.9, bs 4M QD 16 at 2.3-3.0, bs 8M QD 8 at 2.3-3.0: within the noise
 * of each other, 4M QD 8 as fast as any (deeper was not faster for fio,
 * while the walker's read-ahead goes up to 128 MiB). It is 32 MiB in
 * flight (16 huge pages of fio's buffers). */
#define FIO_BS (4ull << 20)
#define FIO_QD 8u
/* fio's file: large enough that the disk's cache and the first request's
 * latency do not decide the rate (128 MiB read slightly slower than 1 GiB here) */
#define FIO_MIN_FILE (512ull << 20)

typedef struct fio_setup {
    zo_fio_job job;
    char file[4300];
    char cmdline[8800];
    char iomem_note[256]; /* why not shmhuge (default mode only) */
    const char *iomem;    /* as passed; NULL: fio's default */
} fio_setup;

/* The job, its mode (huge pages when they fit, unless --fio-iomem) and
 * fio's file in dir (created and laid out here, untimed, with direct
 * writes: zo_fio_file_prepare(); the caller registered dir for removal on
 * interrupt). */
static int fio_prepare(const opts *o, const char *dir, uint64_t wbytes, fio_setup *fs)
{
    memset(fs, 0, sizeof(*fs));
    uint64_t size = o->fio_size ? o->fio_size : MAXU(FIO_MIN_FILE, 2 * wbytes);
    size = (size + FIO_BS - 1) / FIO_BS * FIO_BS;
    snprintf(fs->file, sizeof(fs->file), "%s/fio.dat", dir);
    if (o->fio_iomem) {
        fs->iomem = o->fio_iomem;
    } else if (zo_fio_hugepages_fit(FIO_BS, FIO_QD, 1, fs->iomem_note, sizeof(fs->iomem_note))) {
        fs->iomem = "shmhuge";
    }
    fs->job = (zo_fio_job){.fio = o->fio, .filename = fs->file, .size = size, .bs = FIO_BS, .iodepth = FIO_QD,
                           .numjobs = 1, .rw = "read", .direct = 1, .fixedbufs = 1, .iomem = fs->iomem};
    if (zo_fio_cmdline(&fs->job, fs->cmdline, sizeof(fs->cmdline)) < 0)
        snprintf(fs->cmdline, sizeof(fs->cmdline), "(too long to print)");
    char why[512];
    if (zo_fio_file_prepare(fs->file, size, why, sizeof(why)) != 0) {
        fprintf(stderr, "zo-tile-bench: fio's file: %s\n", why);
        fs->file[0] = '\0';
        return -1;
    }
    return 0;
}

/* fio's sequential read bandwidth on its file, O_DIRECT, in the mode set. */
static int fio_read_bw(const fio_setup *fs, double *bw, char *err, size_t errlen)
{
    zo_fio_result fr;
    int r = zo_fio_run(&fs->job, &fr);
    if (r < 0 || fr.bw[0] <= 0) {
        snprintf(err, errlen, "%s", r < 0 ? fr.err : "fio reported no read bandwidth");
        return -1;
    }
    *bw = fr.bw[0];
    return 0;
}

/* The pool slot for --slot-size auto: the tile the pinned-host home plans
 * from the budget (the NVMe home's tile is capped at one slot when read in
 * place) rounded up to a power of two MiB, within [the store's default,
 * 64 MiB]. Measured (batch 512, 4096 x 4096 fp32, NVMe / bound): 4 MiB
 * slots 1.095, 8M 1.064, 16M 1.050, 32M 1.047; batch 16, 8192 x 8192:
 * 296 ms with 4 MiB slots, 213 ms with 32 MiB. At most 64 MiB: the store's
 * 16 slots then pin 1 GiB. */
static uint64_t auto_slot(uint64_t tile_bytes, uint64_t store_default)
{
    uint64_t s = 1u << 20;
    while (s < tile_bytes && s < (64ull << 20))
        s <<= 1;
    return MAXU(s, store_default);
}

/* ---- the measured runs --------------------------------------------------------------------- */
typedef struct bench {
    const opts *o;
    zo_dev *dev;
    zo_stream *s;
    zo_swap *swap;
    zo_store *store;
    char dir[4200];     /* run.path, or "" without NVMe */
    zo_tool_rundir run; /* private directory: a killed run's is reclaimed by the next run */
    zo_tiled_linear *tl[2]; /* host home, NVMe home */
    void *x, *dy, *w;       /* device */
    float *y, *dx, *dw;
    zo_tile_grid grid[2];   /* host home, NVMe home */
    uint64_t slot_size;     /* the store's pool slot (chosen in main) */
    int slot_auto;          /* chosen by --slot-size auto */
    fio_setup fio;          /* fio's job and file (file[0]: none made) */
    void *hw;               /* pinned copy of W: the host->device bound, when the host home copies */
} bench;

static const char *fetch_mode(const zo_tile_grid *g)
{
    return (g->flags & ZO_TILE_IN_PLACE) ? "in_place" : "copy";
}

static int null_sink(void *ctx, const zo_tile_grad *g)
{
    (void)ctx, (void)g;
    return 0;
}

static int fail(const char *what, int r, const char *detail)
{
    fprintf(stderr, "zo-tile-bench: %s: %s (%s)\n", what, zo_strerror(r), detail);
    return EXIT_RUN;
}

static int dmalloc(bench *bn, void **p, uint64_t n)
{
    int r = zo_dev_malloc(bn->dev, p, (size_t)n);
    return r < 0 ? fail("device allocation", r, zo_dev_errmsg(bn->dev)) : 0;
}

static int untiled(bench *bn)
{
    const opts *o = bn->o;
    zo_stream *s = bn->s;
    zo_dtype t = o->dtype;
    int r = zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_T, o->batch, o->out, o->in, 1, bn->x, o->in, bn->w, o->in, t, 0,
                          bn->y, o->out);
    if (r == 0)
        r = zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, o->batch, o->in, o->out, 1, bn->dy, o->out, bn->w, o->in, t, 0,
                          bn->dx, o->in);
    if (r == 0)
        r = zo_gemm_async(s, ZO_GEMM_T, ZO_GEMM_N, o->out, o->in, o->batch, 1, bn->dy, o->out, bn->x, o->in, t, 0,
                          bn->dw, o->in);
    if (r == 0)
        r = zo_stream_sync(s);
    return r < 0 ? fail("untiled GEMMs", r, zo_dev_errmsg(bn->dev)) : 0;
}

/* The pinned-host home's bound when its tiles are copied to the device:
 * W crosses host->device twice a step (forward, backward), so the tiled
 * run cannot beat two copies of W from pinned memory, one piece each. */
static int h2d_twice(bench *bn, uint64_t wbytes)
{
    int r = zo_memcpy_async(bn->s, bn->w, bn->hw, wbytes, ZO_COPY_H2D);
    if (r == 0)
        r = zo_memcpy_async(bn->s, bn->w, bn->hw, wbytes, ZO_COPY_H2D);
    if (r == 0)
        r = zo_stream_sync(bn->s);
    return r < 0 ? fail("host->device copies of W", r, zo_dev_errmsg(bn->dev)) : 0;
}

/* One training step's use of the layer, as a training loop drives it:
 * forward (keeping its last tile for backward unless --no-keep), backward
 * (last tile first), then the prefetch of the next step's first forward
 * tile (unless --no-prefetch), whose read runs while the rest of the step
 * would (here: whatever the bench runs next). All inside the timed region
 * but that read itself: one tile of W, 1/tiles of the bytes a pass reads. */
static int tiled(bench *bn, int which)
{
    zo_tiled_linear *tl = bn->tl[which];
    int r = zo_tiled_linear_forward(tl, bn->x, bn->o->batch, NULL, bn->y);
    if (r == 0)
        r = zo_tiled_linear_backward(tl, bn->x, bn->dy, bn->o->batch, bn->dx, NULL);
    if (r == 0 && !bn->o->no_prefetch)
        r = zo_tiled_linear_prefetch(tl, ZO_TILE_PASS_FORWARD);
    return r < 0 ? fail(which ? "tiled, NVMe" : "tiled, pinned host", r, zo_tiled_linear_errmsg(tl)) : 0;
}

static int setup(bench *bn)
{
    const opts *o = bn->o;
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.kind = o->dev;
    int r = zo_dev_open(&bn->dev, &dc);
    if (r < 0)
        return fail("zo_dev_open", r, zo_last_error_detail());
    if ((r = zo_stream_create(bn->dev, &bn->s)) < 0)
        return fail("zo_stream_create", r, zo_dev_errmsg(bn->dev));
    size_t esz = zo_dtype_size(o->dtype);
    uint64_t wbytes = o->out * o->in * esz;
    if (dmalloc(bn, &bn->x, o->batch * o->in * esz) || dmalloc(bn, &bn->dy, o->batch * o->out * esz) ||
        dmalloc(bn, &bn->w, wbytes) || dmalloc(bn, (void **)&bn->y, o->batch * o->out * 4) ||
        dmalloc(bn, (void **)&bn->dx, o->batch * o->in * 4) || dmalloc(bn, (void **)&bn->dw, o->out * o->in * 4))
        return EXIT_RUN;
    /* random inputs in [-1, 1) */
    uint64_t n = MAXU(MAXU(o->batch * o->in, o->batch * o->out), o->out * o->in);
    float *f = malloc(n * 4);
    void *h = malloc(n * esz);
    if (!f || !h)
        return fail("host buffers", -ENOMEM, "");
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < n; i++) {
        st ^= st >> 12, st ^= st << 25, st ^= st >> 27;
        f[i] = (float)((double)((st * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-52 - 1.0);
    }
    zo_vec_cast(h, o->dtype, f, ZO_DTYPE_F32, n);
    r = zo_memcpy_async(bn->s, bn->x, h, o->batch * o->in * esz, ZO_COPY_H2D);
    if (r == 0)
        r = zo_memcpy_async(bn->s, bn->dy, h, o->batch * o->out * esz, ZO_COPY_H2D);
    if (r == 0)
        r = zo_memcpy_async(bn->s, bn->w, h, wbytes, ZO_COPY_H2D);
    if (r == 0)
        r = zo_stream_sync(bn->s);
    if (r < 0) {
        free(f);
        free(h);
        return fail("uploading inputs", r, zo_dev_errmsg(bn->dev));
    }

    /* the store: pinned host tier for W, and a swap store in a fresh directory */
    zo_store_config sc;
    zo_store_config_default(&sc);
    sc.host_bytes = wbytes + (1u << 20);
    sc.trace = ZO_TRACE_OFF;
    sc.slot_size = (size_t)bn->slot_size;
    sc.dev = bn->dev;
    if (!o->no_nvme) {
        char why[4300];
        if (zo_tool_rundir_make(&bn->run, "zo-tile-bench", o->path, why, sizeof(why)) < 0) {
            free(f);
            free(h);
            return fail("the run directory", -EIO, why);
        }
        snprintf(bn->dir, sizeof(bn->dir), "%s", bn->run.path);
        /* an interrupt removes it with the arenas and fio's file */
        zo_tool_cleanup_add(bn->dir, 1);
        const char *dirs[] = {bn->dir};
        zo_swap_config wc;
        zo_swap_config_default(&wc);
        wc.dirs = dirs;
        wc.ndirs = 1;
        wc.arena_size = MAXU(wbytes + (64u << 20), (uint64_t)256 << 20);
        if ((r = zo_swap_create(&bn->swap, &wc)) < 0) {
            free(f);
            free(h);
            return fail("zo_swap_create", r, zo_last_error_detail());
        }
        sc.swap = bn->swap;
    } else {
        bn->dir[0] = '\0';
    }
    if ((r = zo_store_create(&bn->store, &sc)) < 0) {
        free(f);
        free(h);
        return fail("zo_store_create", r, zo_last_error_detail());
    }
    for (int i = 0; i < (o->no_nvme ? 1 : 2); i++) {
        zo_tiled_linear_config c;
        zo_tiled_linear_config_default(&c);
        c.name = i ? "bench-nvme" : "bench-host";
        c.in_features = o->in;
        c.out_features = o->out;
        c.max_batch = o->batch;
        c.dtype = o->dtype;
        c.home = i ? ZO_TIER_NVME : ZO_TIER_HOST;
        c.budget = o->tile_out ? 0 : o->budget ? o->budget : MAXU(wbytes / 4, (uint64_t)1);
        c.tile_out = o->tile_out;
        c.tile_in = o->tile_in;
        c.dw_sink = null_sink;
        c.copy_tiles = o->copy_tiles;
        c.backward_in_order = o->in_order;
        c.keep_last = !o->no_keep && !o->in_order;
        c.read_ahead = o->read_ahead;
        r = zo_tiled_linear_create(&bn->tl[i], bn->store, bn->dev, &c);
        if (r < 0) {
            free(f);
            free(h);
            return fail("zo_tiled_linear_create", r, zo_last_error_detail());
        }
        r = zo_tiled_linear_set_weight(bn->tl[i], h, o->in);
        if (r < 0) {
            free(f);
            free(h);
            return fail("zo_tiled_linear_set_weight", r, zo_tiled_linear_errmsg(bn->tl[i]));
        }
        zo_tiled_linear_grid(bn->tl[i], &bn->grid[i]);
    }
    free(f);
    free(h);
    return 0;
}

static void teardown(bench *bn)
{
    for (int i = 0; i < 2; i++)
        zo_tiled_linear_destroy(&bn->tl[i]);
    zo_store_destroy(&bn->store);
    zo_swap_destroy(&bn->swap);
    if (bn->fio.file[0] && unlink(bn->fio.file) != 0 && errno != ENOENT)
        fprintf(stderr, "zo-tile-bench: could not remove %s: %s\n", bn->fio.file, strerror(errno));
    zo_tool_rundir_remove(&bn->run); /* the swap store removed its arenas: the owner mark is left */
    if (bn->dir[0])
        zo_tool_cleanup_drop(bn->dir);
    void *ps[] = {bn->x, bn->dy, bn->w, bn->y, bn->dx, bn->dw};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
        if (ps[i])
            zo_dev_free(bn->dev, ps[i]);
    if (bn->hw)
        zo_pinned_free(bn->hw);
    zo_stream_destroy(&bn->s);
    zo_dev_close(&bn->dev);
}

enum { R_UNTILED, R_HOST, R_NVME, R_H2D, R_FIO, R_COUNT };
static const char *run_names[R_COUNT] = {"untiled", "tiled_host", "tiled_nvme", "h2d_twice", "fio_read"};

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;
    if (o.plan)
        return cmd_plan(&o);
    /* SIGINT/SIGTERM/SIGHUP: end fio, remove the run's directory, then die */
    if (zo_tool_cleanup_signals() != 0)
        fprintf(stderr, "zo-tile-bench: cannot install the interrupt handlers: %s\n", strerror(errno));
    /* refuse a plan that cannot work before touching any device */
    zo_tile_grid pg;
    size_t esz = zo_dtype_size(o.dtype);
    uint64_t wbytes = o.out * o.in * esz;
    int r = o.tile_out ? zo_tile_grid_make(o.batch, o.out, o.in, o.dtype, o.tile_out, o.tile_in, ZO_TILE_TRAIN, &pg)
                       : zo_tile_plan(o.batch, o.out, o.in, o.dtype, o.budget ? o.budget : MAXU(wbytes / 4, 1),
                                      ZO_TILE_TRAIN, &pg);
    if (r < 0)
        return bad("%s", zo_last_error_detail());
    bench bn;
    memset(&bn, 0, sizeof(bn));
    bn.o = &o;
    zo_store_config scd;
    zo_store_config_default(&scd);
    bn.slot_size = o.slot_size;
    if (!bn.slot_size && o.no_nvme) {
        bn.slot_size = scd.slot_size; /* no NVMe tile to size the slot for */
        bn.slot_auto = 1;
    } else if (!bn.slot_size) {
        /* the tile the pinned-host home plans (in place on the host
         * backend unless --copy-tiles: as zo_tiled_linear_create plans) */
        zo_tile_grid hg = pg;
        unsigned hf = ZO_TILE_TRAIN | (o.dev == ZO_DEV_HOST && !o.copy_tiles ? ZO_TILE_IN_PLACE : 0);
        if (o.tile_out ? zo_tile_grid_make(o.batch, o.out, o.in, o.dtype, o.tile_out, o.tile_in, hf, &hg)
                       : zo_tile_plan(o.batch, o.out, o.in, o.dtype, o.budget ? o.budget : MAXU(wbytes / 4, 1), hf, &hg))
            hg = pg;
        bn.slot_size = auto_slot(hg.tile_bytes, scd.slot_size);
        bn.slot_auto = 1;
    }
    rc = setup(&bn);
    if (rc) {
        teardown(&bn);
        return rc;
    }
    zo_store_stats ss;
    zo_store_get_stats(bn.store, &ss);
    uint64_t pool_bytes = (uint64_t)ss.pool_slots * ss.pool_slot_size;
    int use_fio = !o.no_nvme && !o.no_fio;
    char fio_err[256] = "";
    if (use_fio && fio_prepare(&o, bn.dir, wbytes, &bn.fio) < 0) {
        teardown(&bn);
        return EXIT_RUN;
    }
    /* the CPU an NVMe run spends verifying what it reads: CRC32C's rate on
     * one core here (best of 3 over up to 64 MiB) */
    double crc_bw = 0;
    if (!o.no_nvme) {
        size_t cb = (size_t)(wbytes < (64u << 20) ? wbytes : (64u << 20));
        uint8_t *cbuf = malloc(cb);
        if (cbuf) {
            memset(cbuf, 0x5a, cb);
            volatile uint32_t sink = 0;
            for (int rep = 0; rep < 3; rep++) {
                double c0 = now_s();
                sink ^= zo_crc32c(0, cbuf, cb);
                double dt = now_s() - c0;
                if (dt > 0 && (double)cb / dt > crc_bw)
                    crc_bw = (double)cb / dt;
            }
            (void)sink;
            free(cbuf);
        }
    }
    /* the pinned-host home copies its tiles (a GPU; --copy-tiles): its bound
     * is max(GEMM, two host->device copies of W), measured in each pair
     * from a pinned copy of W (W's own bytes, so W is unchanged) */
    int use_h2d = !(bn.grid[0].flags & ZO_TILE_IN_PLACE);
    if (use_h2d) {
        zo_pin_opts po;
        zo_pin_opts_default(&po);
        po.dev = bn.dev;
        int pr = zo_pinned_alloc(&bn.hw, (size_t)wbytes, &po);
        if (pr == 0)
            pr = zo_memcpy_async(bn.s, bn.hw, bn.w, wbytes, ZO_COPY_D2H);
        if (pr == 0)
            pr = zo_stream_sync(bn.s);
        if (pr < 0) {
            fprintf(stderr, "zo-tile-bench: no host->device bound: a pinned copy of W: %s\n", zo_strerror(pr));
            use_h2d = 0;
        }
    }
    double *t[R_COUNT], *ratio_host = calloc(o.pairs, 8), *ratio_nvme = calloc(o.pairs, 8),
           *ratio_host_b = calloc(o.pairs, 8);
    for (int k = 0; k < R_COUNT; k++)
        t[k] = calloc(o.pairs, sizeof(double));
    /* one warm-up round (first-touch, OpenBLAS thread start, page cache;
     * fio lays its file out, once for the run) */
    rc = untiled(&bn) || tiled(&bn, 0) || (!o.no_nvme && tiled(&bn, 1)) ? EXIT_RUN : 0;
    if (!rc && use_fio) {
        double bw0;
        int r0 = fio_read_bw(&bn.fio, &bw0, fio_err, sizeof(fio_err));
        if (r0 < 0 && !o.fio_iomem && bn.fio.iomem) {
            /* the huge pages free a moment ago were taken meanwhile (they
             * are shared with every process): fio's default buffers, said */
            snprintf(bn.fio.iomem_note, sizeof(bn.fio.iomem_note), "fio with --iomem=shmhuge failed: %s", fio_err);
            bn.fio.iomem = bn.fio.job.iomem = NULL;
            if (zo_fio_cmdline(&bn.fio.job, bn.fio.cmdline, sizeof(bn.fio.cmdline)) < 0)
                snprintf(bn.fio.cmdline, sizeof(bn.fio.cmdline), "(too long to print)");
            r0 = fio_read_bw(&bn.fio, &bw0, fio_err, sizeof(fio_err));
        }
        if (r0 < 0)
            use_fio = 0; /* say why below; the rest still runs */
    }
    for (unsigned p = 0; p < o.pairs && !rc; p++) {
        int order[R_COUNT] = {R_UNTILED, R_HOST, R_NVME, R_H2D, R_FIO};
        if (p % 2) /* alternate: reversed every other round */
            for (int a = 0, b = R_COUNT - 1; a < b; a++, b--) {
                int tmp = order[a];
                order[a] = order[b];
                order[b] = tmp;
            }
        for (int q = 0; q < R_COUNT && !rc; q++) {
            int k = order[q];
            if ((k == R_NVME && o.no_nvme) || (k == R_FIO && !use_fio) || (k == R_H2D && !use_h2d))
                continue;
            double t0 = now_s();
            if (k == R_UNTILED)
                rc = untiled(&bn);
            else if (k == R_H2D)
                rc = h2d_twice(&bn, wbytes);
            else if (k == R_HOST || k == R_NVME)
                rc = tiled(&bn, k == R_NVME);
            else if (fio_read_bw(&bn.fio, &t[R_FIO][p], fio_err, sizeof(fio_err)) < 0)
                use_fio = 0; /* say why below; the rest still runs */
            if (k != R_FIO)
                t[k][p] = now_s() - t0;
        }
        ratio_host[p] = t[R_HOST][p] / t[R_UNTILED][p];
        ratio_host_b[p] = t[R_HOST][p] / (use_h2d ? fmax(t[R_UNTILED][p], t[R_H2D][p]) : t[R_UNTILED][p]);
        if (use_fio)
            ratio_nvme[p] = t[R_NVME][p] / fmax(t[R_UNTILED][p], 2.0 * (double)wbytes / t[R_FIO][p]);
    }
    if (!rc) {
        double med[R_COUNT];
        for (int k = 0; k < R_COUNT; k++)
            med[k] = zo_median(t[k], o.pairs);
        double rh = zo_median(ratio_host, o.pairs), rn = use_fio ? zo_median(ratio_nvme, o.pairs) : NAN;
        double rhb = zo_median(ratio_host_b, o.pairs);
        zo_tile_walk_stats ws[2];
        zo_tiled_linear_get_stats(bn.tl[0], &ws[0]);
        zo_tiled_linear_get_stats(bn.tl[1], &ws[1]);
        zo_machine m;
        zo_machine_get(&m);
        if (o.json) {
            zo_json j;
            zj_init(&j, stdout, 1);
            zj_obj_begin(&j, NULL);
            zo_machine_json(&m, &j, "machine");
            zj_obj_begin(&j, "config");
            zj_uint(&j, "batch", o.batch);
            zj_uint(&j, "out", o.out);
            zj_uint(&j, "in", o.in);
            zj_str(&j, "dtype", zo_dtype_name(o.dtype));
            zj_str(&j, "device", zo_dev_kind_name(o.dev));
            zj_str(&j, "gemm", zo_gemm_impl(o.dev));
            zj_uint(&j, "weight_bytes", wbytes);
            zj_uint(&j, "pairs", o.pairs);
            if (!o.no_nvme) {
                char stor[256];
                zo_path_storage(o.path, stor, sizeof(stor));
                zj_str(&j, "nvme_path", o.path);
                zj_str(&j, "nvme_storage", stor);
            }
            zj_obj_end(&j);
            grid_json(&j, "grid", &bn.grid[0]);
            zj_str(&j, "fetch_host", fetch_mode(&bn.grid[0]));
            if (!o.no_nvme) {
                grid_json(&j, "grid_nvme", &bn.grid[1]);
                zj_str(&j, "fetch_nvme", fetch_mode(&bn.grid[1]));
            }
            zj_obj_begin(&j, "median_seconds");
            for (int k = 0; k < R_FIO; k++)
                if ((k != R_NVME || !o.no_nvme) && (k != R_H2D || use_h2d))
                    zj_num(&j, run_names[k], med[k]);
            zj_obj_end(&j);
            if (use_fio)
                zj_num(&j, "fio_read_bytes_per_s", med[R_FIO]);
            else
                zj_str(&j, "fio_skipped", o.no_nvme || o.no_fio ? "not asked" : fio_err);
            if (bn.fio.cmdline[0]) {
                zj_str(&j, "fio_cmdline", bn.fio.cmdline);
                zj_str(&j, "fio_iomem", bn.fio.iomem ? bn.fio.iomem : "malloc (fio's default)");
                if (bn.fio.iomem_note[0])
                    zj_str(&j, "fio_iomem_note", bn.fio.iomem_note);
                zj_uint(&j, "fio_file_bytes", bn.fio.job.size);
                zj_uint(&j, "fio_bs", bn.fio.job.bs);
                zj_uint(&j, "fio_iodepth", bn.fio.job.iodepth);
            }
            zj_obj_begin(&j, "store_pool");
            zj_uint(&j, "slot_size", ss.pool_slot_size);
            zj_bool(&j, "slot_size_auto", bn.slot_auto);
            zj_uint(&j, "slots", ss.pool_slots);
            zj_uint(&j, "pool_bytes", pool_bytes);
            zj_uint(&j, "pinned_bytes", ss.pinned_bytes);
            zj_bool(&j, "pool_locked", ss.pool_locked);
            zj_obj_end(&j);
            zj_num(&j, "ratio_host_to_untiled", rh);
            /* max(GEMM, 2 W host->device) where the tiles are copied; untiled where read in place */
            zj_num(&j, "ratio_host_to_bound", rhb);
            zj_str(&j, "host_bound", use_h2d ? "max(untiled, h2d_twice)" : "untiled");
            zj_num(&j, "ratio_nvme_to_bound", rn);
            zj_arr_begin(&j, "pairs");
            for (unsigned p = 0; p < o.pairs; p++) {
                zj_obj_begin(&j, NULL);
                for (int k = 0; k < R_COUNT; k++)
                    if ((k != R_NVME || !o.no_nvme) && (k != R_FIO || use_fio) && (k != R_H2D || use_h2d))
                        zj_num(&j, run_names[k], t[k][p]);
                zj_obj_end(&j);
            }
            zj_arr_end(&j);
            zj_uint(&j, "fetch_bytes_host", ws[0].fetch_bytes);
            zj_uint(&j, "fetch_bytes_nvme", ws[1].fetch_bytes);
            /* the walkers' own timers over every run (warm-up included):
             * where a tiled run's time goes besides the GEMMs */
            for (int i = 0; i < (o.no_nvme ? 1 : 2); i++) {
                zj_obj_begin(&j, i ? "walk_nvme" : "walk_host");
                zj_uint(&j, "tiles", ws[i].tiles);
                zj_uint(&j, "in_place_tiles", ws[i].in_place_tiles);
                zj_uint(&j, "fetch_bytes", ws[i].fetch_bytes);
                zj_num(&j, "fetch_seconds", (double)ws[i].fetch_ns * 1e-9);
                zj_num(&j, "wait_seconds", (double)ws[i].wait_ns * 1e-9);
                zj_uint(&j, "runs", ws[i].runs);
                zj_uint(&j, "reads", ws[i].reads);
                zj_uint(&j, "reused", ws[i].reused);
                zj_uint(&j, "prefetched", ws[i].prefetched);
                zj_uint(&j, "prefetch_skipped", ws[i].prefetch_skipped);
                zj_num(&j, "first_tile_seconds", (double)ws[i].first_ns * 1e-9);
                zj_uint(&j, "read_ahead_peak", ws[i].ahead_peak);
                zj_obj_end(&j);
            }
            zj_str(&j, "backward_order", o.in_order ? "in_order" : "reverse");
            zj_bool(&j, "keep_last", !o.no_keep && !o.in_order);
            zj_bool(&j, "prefetch", !o.no_prefetch);
            zj_uint(&j, "read_ahead", o.read_ahead);
            if (!o.no_nvme) {
                zj_num(&j, "crc32c_bytes_per_s", crc_bw);
                zj_str(&j, "crc32c_variant", zo_crc32c_variant());
            }
            zj_obj_end(&j);
            zj_end(&j);
        } else {
            char wb[32];
            fmt_bytes(wb, sizeof(wb), wbytes);
            zo_machine_print(&m, stdout);
            printf("layer: x [%llu x %llu], W [%llu x %llu] %s (%s), forward + backward; device %s, GEMM %s\n",
                   (unsigned long long)o.batch, (unsigned long long)o.in, (unsigned long long)o.out,
                   (unsigned long long)o.in, zo_dtype_name(o.dtype), wb, zo_dev_kind_name(o.dev),
                   zo_gemm_impl(o.dev));
            for (int i = 0; i < (o.no_nvme ? 1 : 2); i++) {
                const zo_tile_grid *g = &bn.grid[i];
                char work[32];
                fmt_bytes(work, sizeof(work), g->work_bytes);
                printf("tiles (%s home): %u x %u (grid %u x %u), device working memory %s, fetch %s\n",
                       i ? "NVMe" : "pinned host", g->tile_out, g->tile_in, g->tiles_out, g->tiles_in, work,
                       (g->flags & ZO_TILE_IN_PLACE) ? "in place (no copy)" : "copied into two device buffers");
            }
            char sb[32], pb[32], tb[32];
            fmt_bytes(sb, sizeof(sb), ss.pool_slot_size);
            fmt_bytes(pb, sizeof(pb), pool_bytes);
            fmt_bytes(tb, sizeof(tb), ss.pinned_bytes);
            int capped = !o.no_nvme && (bn.grid[1].flags & ZO_TILE_IN_PLACE) &&
                         bn.grid[1].tile_bytes < bn.grid[0].tile_bytes;
            printf("store pool: %zu slots of %s (%s%s), %s pinned%s; the store pins %s in all\n", ss.pool_slots, sb,
                   bn.slot_auto ? "auto: the pinned-host home's tile, rounded up" : "--slot-size",
                   capped ? "; NVMe tiles cut to one slot" : "", pb,
                   ss.pool_locked ? "" : " (not page-locked: the OS refused)", tb);
            if (bn.fio.cmdline[0]) {
                printf("fio: %s\n", bn.fio.cmdline);
                if (bn.fio.iomem_note[0])
                    printf("fio: without --iomem=shmhuge (fio's default buffers, slower): %s\n", bn.fio.iomem_note);
            }
            printf("%u pairs, order alternating\n", o.pairs);
            printf("  untiled GEMMs (W on the device)   %10.3f ms\n", med[R_UNTILED] * 1e3);
            printf("  tiled, W in pinned host memory    %10.3f ms   ratio to untiled %.3f", med[R_HOST] * 1e3, rh);
            if (use_h2d)
                printf(", to max(GEMM, 2 x W host->device = %.3f ms) %.3f", med[R_H2D] * 1e3, rhb);
            printf("\n");
            if (!o.no_nvme) {
                printf("  tiled, W on NVMe                  %10.3f ms", med[R_NVME] * 1e3);
                if (use_fio)
                    printf("   ratio to max(GEMM, 2 x W / fio %.2f GB/s = %.3f ms) %.3f\n", med[R_FIO] * 1e-9,
                           2.0 * (double)wbytes / med[R_FIO] * 1e3, rn);
                else
                    printf("   (no NVMe bound: %s)\n", o.no_fio ? "--no-fio" : fio_err);
            }
            printf("(medians of %u pairs; ratios are medians of per-pair ratios)\n", o.pairs);
            printf("passes: backward %s, forward's last tile %s, next forward's first tile %s\n",
                   o.in_order ? "first tile to last" : "last tile to first",
                   !o.no_keep && !o.in_order ? "kept for backward" : "released",
                   o.no_prefetch ? "not prefetched" : "prefetched at the end of the step (its read untimed)");
            for (int i = 0; i < (o.no_nvme ? 1 : 2); i++) {
                const zo_tile_walk_stats *w = &ws[i];
                printf("walk (%s, all runs): %llu runs, %llu tiles, %llu read, %llu reused, %llu prefetched "
                       "(%llu skipped), up to %llu read ahead; first tile %.3f ms per run, fetching %.3f ms per run\n",
                       i ? "NVMe" : "pinned host", (unsigned long long)w->runs, (unsigned long long)w->tiles,
                       (unsigned long long)w->reads, (unsigned long long)w->reused, (unsigned long long)w->prefetched,
                       (unsigned long long)w->prefetch_skipped, (unsigned long long)(w->ahead_peak ? w->ahead_peak : 1), w->runs ? (double)w->first_ns * 1e-6 / w->runs : 0.0,
                       w->runs ? (double)w->fetch_ns * 1e-6 / w->runs : 0.0);
            }
            if (!o.no_nvme && crc_bw > 0) {
                double per_step = (double)ws[1].reads / (double)(ws[1].runs ? ws[1].runs : 1) * 2.0 *
                                  (double)bn.grid[1].tile_bytes;
                printf("CRC32C (%s): %.2f GB/s on one core here: checking the ~%.1f MiB an NVMe step reads takes "
                       "~%.2f ms of CPU\n",
                       zo_crc32c_variant(), crc_bw * 1e-9, per_step / 1048576.0, per_step / crc_bw * 1e3);
            }
        }
    }
    for (int k = 0; k < R_COUNT; k++)
        free(t[k]);
    free(ratio_host);
    free(ratio_nvme);
    free(ratio_host_b);
    teardown(&bn);
    return rc;
}
