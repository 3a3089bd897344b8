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

/* ---- the options' sets (zo_tool_opt: tool_common.h); d->what: the range in words ---- */
static int set_count64(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    unsigned long long v;
    if (zo_tool_parse_u(arg, d->lo, d->hi, &v))
        return bad("--%s %s: bad value (%s)", d->name, arg, d->what);
    *(uint64_t *)d->dst = v;
    return 0;
}

static int set_count(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    unsigned long long v;
    if (zo_tool_parse_u(arg, d->lo, d->hi, &v))
        return bad("--%s %s: bad value (%s)", d->name, arg, d->what);
    *(unsigned *)d->dst = (unsigned)v;
    return 0;
}

static int set_budget(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t *b = d->dst;
    if (zo_parse_size(arg, b) || *b == 0)
        return bad("--budget %s: not a size above 0", arg);
    return 0;
}

static int set_slot_size(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t *s = d->dst;
    /* the store checks the rest (a multiple of the swap chunk size) */
    if (!strcmp(arg, "auto"))
        *s = 0;
    else if (zo_parse_size(arg, s) || *s == 0 || *s > ((uint64_t)1 << 30))
        return bad("--slot-size %s: not a size in (0, 1G] or auto", arg);
    return 0;
}

static int set_fio_iomem(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    /* fio checks the mode itself (its list depends on its build) */
    if (!*arg || strchr(arg, ' '))
        return bad("--fio-iomem '%s': expected a fio --iomem mode, e.g. shmhuge or malloc", arg);
    *(const char **)d->dst = arg;
    return 0;
}

static int set_fio_size(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t *s = d->dst;
    /* at most 1P: it is rounded up to fio's block size (a value near
     * 2^64 would wrap to a 0-byte file) */
    if (zo_parse_size(arg, s) || *s < (1u << 20) || *s > (1ull << 50))
        return bad("--fio-size %s: not a size of at least 1M and at most 1P", arg);
    return 0;
}

static int set_tile(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    opts *o = d->dst;
    unsigned a, b;
    char tail;
    if (sscanf(arg, "%ux%u%c", &a, &b, &tail) != 2 || !a || !b)
        return bad("--tile %s: expected RxC, e.g. 512x4096", arg);
    o->tile_out = a;
    o->tile_in = b;
    return 0;
}

static int set_budgets(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (parse_budgets(arg, d->dst))
        return bad("--budgets %s: a comma list of up to %d sizes above 0", arg, MAX_BUDGETS);
    return 0;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof(*o));
    o->batch = 16;
    o->out = o->in = 4096;
    o->dtype = ZO_DTYPE_F32;
    o->dev = ZO_DEV_HOST;
    o->pairs = 5;
    o->path = "/var/tmp";
    parse_budgets("8M,64M,512M", o);
    const zo_tool_opt table[] = {
        {"batch", 1, 0, set_count64, &o->batch, 1, 1u << 30, "1..2^30"},
        {"out", 1, 0, set_count64, &o->out, 1, 1u << 30, "1..2^30"},
        {"in", 1, 0, set_count64, &o->in, 1, 1u << 30, "1..2^30"},
        {"dtype", 1, 0, zo_tool_opt_f32_bf16, &o->dtype, 0, 0, NULL},
        {"budget", 1, 0, set_budget, &o->budget, 0, 0, NULL},
        {"tile", 1, 0, set_tile, o, 0, 0, NULL},
        {"device", 1, 0, zo_tool_opt_dev_kind, &o->dev, 0, 0, NULL},
        {"pairs", 1, 0, set_count, &o->pairs, 1, 1000, "1..1000"},
        {"path", 1, 0, zo_tool_opt_str, &o->path, 0, 0, NULL},
        {"no-nvme", 0, 0, zo_tool_opt_on, &o->no_nvme, 0, 0, NULL},
        {"fio", 1, 0, zo_tool_opt_str, &o->fio, 0, 0, NULL},
        {"no-fio", 0, 0, zo_tool_opt_on, &o->no_fio, 0, 0, NULL},
        {"plan", 0, 0, zo_tool_opt_on, &o->plan, 0, 0, NULL},
        {"budgets", 1, 0, set_budgets, o, 0, 0, NULL},
        {"json", 0, 0, zo_tool_opt_on, &o->json, 0, 0, NULL},
        {"help", 0, 'h', zo_tool_opt_help, NULL, 0, 0, NULL},
        {"copy-tiles", 0, 0, zo_tool_opt_on, &o->copy_tiles, 0, 0, NULL},
        {"slot-size", 1, 0, set_slot_size, &o->slot_size, 0, 0, NULL},
        {"no-keep", 0, 0, zo_tool_opt_on, &o->no_keep, 0, 0, NULL},
        {"no-prefetch", 0, 0, zo_tool_opt_on, &o->no_prefetch, 0, 0, NULL},
        {"in-order", 0, 0, zo_tool_opt_on, &o->in_order, 0, 0, NULL},
        {"read-ahead", 1, 0, set_count, &o->read_ahead, 0, 64, "0..64"},
        {"fio-iomem", 1, 0, set_fio_iomem, &o->fio_iomem, 0, 0, NULL},
        {"fio-size", 1, 0, set_fio_size, &o->fio_size, 0, 0, NULL},
    };
    const zo_tool_cli cli = {"zo-tile-bench", usage, table, sizeof(table) / sizeof(table[0])};
    int rc = zo_tool_opts_parse_strict(&cli, argc, argv);
    if (rc)
        return rc;
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

/* ---- main's phases ---------------------------------------------------------------------------- */
/* The grid for o's budget (or --tile) with the planner's flags: both the
 * check before any device is touched and --slot-size auto plan this way */
static int plan_grid(const opts *o, uint64_t wbytes, unsigned flags, zo_tile_grid *g)
{
    return o->tile_out ? zo_tile_grid_make(o->batch, o->out, o->in, o->dtype, o->tile_out, o->tile_in, flags, g)
                       : zo_tile_plan(o->batch, o->out, o->in, o->dtype, o->budget ? o->budget : MAXU(wbytes / 4, 1),
                                      flags, g);
}

/* The store's pool slot: --slot-size, or auto (auto_slot) */
static void choose_slot(bench *bn, const zo_tile_grid *pg, uint64_t wbytes)
{
    const opts *o = bn->o;
    zo_store_config scd;
    zo_store_config_default(&scd);
    bn->slot_size = o->slot_size;
    if (!bn->slot_size && o->no_nvme) {
        bn->slot_size = scd.slot_size; /* no NVMe tile to size the slot for */
        bn->slot_auto = 1;
    } else if (!bn->slot_size) {
        /* the tile the pinned-host home plans (in place on the host
         * backend unless --copy-tiles: as zo_tiled_linear_create plans) */
        zo_tile_grid hg = *pg;
        unsigned hf = ZO_TILE_TRAIN | (o->dev == ZO_DEV_HOST && !o->copy_tiles ? ZO_TILE_IN_PLACE : 0);
        if (plan_grid(o, wbytes, hf, &hg))
            hg = *pg;
        bn->slot_size = auto_slot(hg.tile_bytes, scd.slot_size);
        bn->slot_auto = 1;
    }
}

/* The CPU an NVMe run spends verifying what it reads: CRC32C's rate on
 * one core here (best of 3 over up to 64 MiB); 0 without NVMe */
static double crc32c_rate(const opts *o, uint64_t wbytes)
{
    double crc_bw = 0;
    if (o->no_nvme)
        return 0;
    size_t cb = (size_t)(wbytes < (64u << 20) ? wbytes : (64u << 20));
    uint8_t *cbuf = malloc(cb);
    if (!cbuf)
        return 0;
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
    return crc_bw;
}

/* The pinned-host home copies its tiles (a GPU; --copy-tiles): its bound
 * is max(GEMM, two host->device copies of W), measured in each pair from a
 * pinned copy of W (W's own bytes, so W is unchanged). 1: that bound is
 * measured; 0: the tiles are read in place, or the copy could not be made. */
static int h2d_prepare(bench *bn, uint64_t wbytes)
{
    if (bn->grid[0].flags & ZO_TILE_IN_PLACE)
        return 0;
    zo_pin_opts po;
    zo_pin_opts_default(&po);
    po.dev = bn->dev;
    int pr = zo_pinned_alloc(&bn->hw, (size_t)wbytes, &po);
    if (pr == 0)
        pr = zo_memcpy_async(bn->s, bn->hw, bn->w, wbytes, ZO_COPY_D2H);
    if (pr == 0)
        pr = zo_stream_sync(bn->s);
    if (pr < 0) {
        fprintf(stderr, "zo-tile-bench: no host->device bound: a pinned copy of W: %s\n", zo_strerror(pr));
        return 0;
    }
    return 1;
}

/* What the rounds measure, and what the report says besides */
typedef struct results {
    uint64_t wbytes, pool_bytes;
    zo_store_stats ss;
    int use_fio, use_h2d;
    char fio_err[256];
    double crc_bw;
    double *t[R_COUNT];                          /* per pair: seconds; R_FIO: fio's bytes/s */
    double *ratio_host, *ratio_nvme, *ratio_host_b; /* per pair */
} results;

static void results_alloc(results *rs, unsigned pairs)
{
    rs->ratio_host = calloc(pairs, 8);
    rs->ratio_nvme = calloc(pairs, 8);
    rs->ratio_host_b = calloc(pairs, 8);
    for (int k = 0; k < R_COUNT; k++)
        rs->t[k] = calloc(pairs, sizeof(double));
}

static void results_free(results *rs)
{
    for (int k = 0; k < R_COUNT; k++)
        free(rs->t[k]);
    free(rs->ratio_host);
    free(rs->ratio_nvme);
    free(rs->ratio_host_b);
}

/* One warm-up round (first-touch, OpenBLAS thread start, page cache; fio
 * lays its file out, once for the run) */
static int warm_up(bench *bn, results *rs)
{
    const opts *o = bn->o;
    int rc = untiled(bn) || tiled(bn, 0) || (!o->no_nvme && tiled(bn, 1)) ? EXIT_RUN : 0;
    if (rc || !rs->use_fio)
        return rc;
    double bw0;
    fio_setup *fs = &bn->fio;
    int r0 = fio_read_bw(fs, &bw0, rs->fio_err, sizeof(rs->fio_err));
    if (r0 < 0 && !o->fio_iomem && fs->iomem) {
        /* the huge pages free a moment ago were taken meanwhile (they
         * are shared with every process): fio's default buffers, said */
        snprintf(fs->iomem_note, sizeof(fs->iomem_note), "fio with --iomem=shmhuge failed: %s", rs->fio_err);
        fs->iomem = fs->job.iomem = NULL;
        if (zo_fio_cmdline(&fs->job, fs->cmdline, sizeof(fs->cmdline)) < 0)
            snprintf(fs->cmdline, sizeof(fs->cmdline), "(too long to print)");
        r0 = fio_read_bw(fs, &bw0, rs->fio_err, sizeof(rs->fio_err));
    }
    if (r0 < 0)
        rs->use_fio = 0; /* say why below; the rest still runs */
    return 0;
}

/* Pair p: every run once, in order, or reversed every other pair */
static int run_pair(bench *bn, results *rs, unsigned p)
{
    const opts *o = bn->o;
    double **t = rs->t;
    int rc = 0;
    int order[R_COUNT] = {R_UNTILED, R_HOST, R_NVME, R_H2D, R_FIO};
    if (p % 2) /* alternate: reversed every other round */
        for (int a = 0, b = R_COUNT - 1; a < b; a++, b--) {
            int tmp = order[a];
            order[a] = order[b];
            order[b] = tmp;
        }
    for (int q = 0; q < R_COUNT && !rc; q++) {
        int k = order[q];
        if ((k == R_NVME && o->no_nvme) || (k == R_FIO && !rs->use_fio) || (k == R_H2D && !rs->use_h2d))
            continue;
        double t0 = now_s();
        if (k == R_UNTILED)
            rc = untiled(bn);
        else if (k == R_H2D)
            rc = h2d_twice(bn, rs->wbytes);
        else if (k == R_HOST || k == R_NVME)
            rc = tiled(bn, k == R_NVME);
        else if (fio_read_bw(&bn->fio, &t[R_FIO][p], rs->fio_err, sizeof(rs->fio_err)) < 0)
            rs->use_fio = 0; /* say why below; the rest still runs */
        if (k != R_FIO)
            t[k][p] = now_s() - t0;
    }
    rs->ratio_host[p] = t[R_HOST][p] / t[R_UNTILED][p];
    rs->ratio_host_b[p] =
        t[R_HOST][p] / (rs->use_h2d ? fmax(t[R_UNTILED][p], t[R_H2D][p]) : t[R_UNTILED][p]);
    if (rs->use_fio)
        rs->ratio_nvme[p] = t[R_NVME][p] / fmax(t[R_UNTILED][p], 2.0 * (double)rs->wbytes / t[R_FIO][p]);
    return rc;
}

/* ---- the report ------------------------------------------------------------------------------ */
typedef struct summary {
    double med[R_COUNT];
    double rh, rn, rhb; /* medians of the per-pair ratios: host/untiled, nvme/bound, host/bound */
    zo_tile_walk_stats ws[2];
    zo_machine m;
} summary;

static void summarize(const bench *bn, const results *rs, summary *sm)
{
    unsigned pairs = bn->o->pairs;
    for (int k = 0; k < R_COUNT; k++)
        sm->med[k] = zo_median(rs->t[k], pairs);
    sm->rh = zo_median(rs->ratio_host, pairs);
    sm->rn = rs->use_fio ? zo_median(rs->ratio_nvme, pairs) : NAN;
    sm->rhb = zo_median(rs->ratio_host_b, pairs);
    zo_tiled_linear_get_stats(bn->tl[0], &sm->ws[0]);
    zo_tiled_linear_get_stats(bn->tl[1], &sm->ws[1]);
    zo_machine_get(&sm->m);
}

static void json_config(zo_json *j, const bench *bn, const results *rs)
{
    const opts *o = bn->o;
    zj_obj_begin(j, "config");
    zj_uint(j, "batch", o->batch);
    zj_uint(j, "out", o->out);
    zj_uint(j, "in", o->in);
    zj_str(j, "dtype", zo_dtype_name(o->dtype));
    zj_str(j, "device", zo_dev_kind_name(o->dev));
    zj_str(j, "gemm", zo_gemm_impl(o->dev));
    zj_uint(j, "weight_bytes", rs->wbytes);
    zj_uint(j, "pairs", o->pairs);
    if (!o->no_nvme) {
        char stor[256];
        zo_path_storage(o->path, stor, sizeof(stor));
        zj_str(j, "nvme_path", o->path);
        zj_str(j, "nvme_storage", stor);
    }
    zj_obj_end(j);
    grid_json(j, "grid", &bn->grid[0]);
    zj_str(j, "fetch_host", fetch_mode(&bn->grid[0]));
    if (!o->no_nvme) {
        grid_json(j, "grid_nvme", &bn->grid[1]);
        zj_str(j, "fetch_nvme", fetch_mode(&bn->grid[1]));
    }
}

/* fio's mode and the store's pool */
static void json_fio_pool(zo_json *j, const bench *bn, const results *rs, const summary *sm)
{
    const opts *o = bn->o;
    const fio_setup *fs = &bn->fio;
    if (rs->use_fio)
        zj_num(j, "fio_read_bytes_per_s", sm->med[R_FIO]);
    else
        zj_str(j, "fio_skipped", o->no_nvme || o->no_fio ? "not asked" : rs->fio_err);
    if (fs->cmdline[0]) {
        zj_str(j, "fio_cmdline", fs->cmdline);
        zj_str(j, "fio_iomem", fs->iomem ? fs->iomem : "malloc (fio's default)");
        if (fs->iomem_note[0])
            zj_str(j, "fio_iomem_note", fs->iomem_note);
        zj_uint(j, "fio_file_bytes", fs->job.size);
        zj_uint(j, "fio_bs", fs->job.bs);
        zj_uint(j, "fio_iodepth", fs->job.iodepth);
    }
    zj_obj_begin(j, "store_pool");
    zj_uint(j, "slot_size", rs->ss.pool_slot_size);
    zj_bool(j, "slot_size_auto", bn->slot_auto);
    zj_uint(j, "slots", rs->ss.pool_slots);
    zj_uint(j, "pool_bytes", rs->pool_bytes);
    zj_uint(j, "pinned_bytes", rs->ss.pinned_bytes);
    zj_bool(j, "pool_locked", rs->ss.pool_locked);
    zj_obj_end(j);
}

/* the walkers' own timers over every run (warm-up included): where a
 * tiled run's time goes besides the GEMMs */
static void json_walks(zo_json *j, const opts *o, const summary *sm)
{
    for (int i = 0; i < (o->no_nvme ? 1 : 2); i++) {
        const zo_tile_walk_stats *w = &sm->ws[i];
        zj_obj_begin(j, i ? "walk_nvme" : "walk_host");
        zj_uint(j, "tiles", w->tiles);
        zj_uint(j, "in_place_tiles", w->in_place_tiles);
        zj_uint(j, "fetch_bytes", w->fetch_bytes);
        zj_num(j, "fetch_seconds", (double)w->fetch_ns * 1e-9);
        zj_num(j, "wait_seconds", (double)w->wait_ns * 1e-9);
        zj_uint(j, "runs", w->runs);
        zj_uint(j, "reads", w->reads);
        zj_uint(j, "reused", w->reused);
        zj_uint(j, "prefetched", w->prefetched);
        zj_uint(j, "prefetch_skipped", w->prefetch_skipped);
        zj_num(j, "first_tile_seconds", (double)w->first_ns * 1e-9);
        zj_uint(j, "read_ahead_peak", w->ahead_peak);
        zj_obj_end(j);
    }
}

static void report_json(const bench *bn, const results *rs, const summary *sm)
{
    const opts *o = bn->o;
    zo_json j;
    zj_init(&j, stdout, 1);
    zj_obj_begin(&j, NULL);
    zo_machine_json(&sm->m, &j, "machine");
    json_config(&j, bn, rs);
    zj_obj_begin(&j, "median_seconds");
    for (int k = 0; k < R_FIO; k++)
        if ((k != R_NVME || !o->no_nvme) && (k != R_H2D || rs->use_h2d))
            zj_num(&j, run_names[k], sm->med[k]);
    zj_obj_end(&j);
    json_fio_pool(&j, bn, rs, sm);
    zj_num(&j, "ratio_host_to_untiled", sm->rh);
    /* max(GEMM, 2 W host->device) where the tiles are copied; untiled where read in place */
    zj_num(&j, "ratio_host_to_bound", sm->rhb);
    zj_str(&j, "host_bound", rs->use_h2d ? "max(untiled, h2d_twice)" : "untiled");
    zj_num(&j, "ratio_nvme_to_bound", sm->rn);
    zj_arr_begin(&j, "pairs");
    for (unsigned p = 0; p < o->pairs; p++) {
        zj_obj_begin(&j, NULL);
        for (int k = 0; k < R_COUNT; k++)
            if ((k != R_NVME || !o->no_nvme) && (k != R_FIO || rs->use_fio) && (k != R_H2D || rs->use_h2d))
                zj_num(&j, run_names[k], rs->t[k][p]);
        zj_obj_end(&j);
    }
    zj_arr_end(&j);
    zj_uint(&j, "fetch_bytes_host", sm->ws[0].fetch_bytes);
    zj_uint(&j, "fetch_bytes_nvme", sm->ws[1].fetch_bytes);
    json_walks(&j, o, sm);
    zj_str(&j, "backward_order", o->in_order ? "in_order" : "reverse");
    zj_bool(&j, "keep_last", !o->no_keep && !o->in_order);
    zj_bool(&j, "prefetch", !o->no_prefetch);
    zj_uint(&j, "read_ahead", o->read_ahead);
    if (!o->no_nvme) {
        zj_num(&j, "crc32c_bytes_per_s", rs->crc_bw);
        zj_str(&j, "crc32c_variant", zo_crc32c_variant());
    }
    zj_obj_end(&j);
    zj_end(&j);
}

/* The text report's head: the machine, the layer, its tiles, the store's pool and fio's command */
static void text_setup(const bench *bn, const results *rs, const summary *sm)
{
    const opts *o = bn->o;
    char wb[32];
    fmt_bytes(wb, sizeof(wb), rs->wbytes);
    zo_machine_print(&sm->m, stdout);
    printf("layer: x [%llu x %llu], W [%llu x %llu] %s (%s), forward + backward; device %s, GEMM %s\n",
           (unsigned long long)o->batch, (unsigned long long)o->in, (unsigned long long)o->out,
           (unsigned long long)o->in, zo_dtype_name(o->dtype), wb, zo_dev_kind_name(o->dev), zo_gemm_impl(o->dev));
    for (int i = 0; i < (o->no_nvme ? 1 : 2); i++) {
        const zo_tile_grid *g = &bn->grid[i];
        char work[32];
        fmt_bytes(work, sizeof(work), g->work_bytes);
        printf("tiles (%s home): %u x %u (grid %u x %u), device working memory %s, fetch %s\n",
               i ? "NVMe" : "pinned host", g->tile_out, g->tile_in, g->tiles_out, g->tiles_in, work,
               (g->flags & ZO_TILE_IN_PLACE) ? "in place (no copy)" : "copied into two device buffers");
    }
    const zo_store_stats *ss = &rs->ss;
    char sb[32], pb[32], tb[32];
    fmt_bytes(sb, sizeof(sb), ss->pool_slot_size);
    fmt_bytes(pb, sizeof(pb), rs->pool_bytes);
    fmt_bytes(tb, sizeof(tb), ss->pinned_bytes);
    int capped =
        !o->no_nvme && (bn->grid[1].flags & ZO_TILE_IN_PLACE) && bn->grid[1].tile_bytes < bn->grid[0].tile_bytes;
    printf("store pool: %zu slots of %s (%s%s), %s pinned%s; the store pins %s in all\n", ss->pool_slots, sb,
           bn->slot_auto ? "auto: the pinned-host home's tile, rounded up" : "--slot-size",
           capped ? "; NVMe tiles cut to one slot" : "", pb,
           ss->pool_locked ? "" : " (not page-locked: the OS refused)", tb);
    if (bn->fio.cmdline[0]) {
        printf("fio: %s\n", bn->fio.cmdline);
        if (bn->fio.iomem_note[0])
            printf("fio: without --iomem=shmhuge (fio's default buffers, slower): %s\n", bn->fio.iomem_note);
    }
}

/* The walkers' counts, and what checking an NVMe step's reads costs the CPU */
static void text_walks(const bench *bn, const results *rs, const summary *sm)
{
    const opts *o = bn->o;
    for (int i = 0; i < (o->no_nvme ? 1 : 2); i++) {
        const zo_tile_walk_stats *w = &sm->ws[i];
        printf("walk (%s, all runs): %llu runs, %llu tiles, %llu read, %llu reused, %llu prefetched "
               "(%llu skipped), up to %llu read ahead; first tile %.3f ms per run, fetching %.3f ms per run\n",
               i ? "NVMe" : "pinned host", (unsigned long long)w->runs, (unsigned long long)w->tiles,
               (unsigned long long)w->reads, (unsigned long long)w->reused, (unsigned long long)w->prefetched,
               (unsigned long long)w->prefetch_skipped, (unsigned long long)(w->ahead_peak ? w->ahead_peak : 1),
               w->runs ? (double)w->first_ns * 1e-6 / w->runs : 0.0,
               w->runs ? (double)w->fetch_ns * 1e-6 / w->runs : 0.0);
    }
    if (!o->no_nvme && rs->crc_bw > 0) {
        const zo_tile_walk_stats *w = &sm->ws[1];
        double per_step = (double)w->reads / (double)(w->runs ? w->runs : 1) * 2.0 * (double)bn->grid[1].tile_bytes;
        printf("CRC32C (%s): %.2f GB/s on one core here: checking the ~%.1f MiB an NVMe step reads takes "
               "~%.2f ms of CPU\n",
               zo_crc32c_variant(), rs->crc_bw * 1e-9, per_step / 1048576.0, per_step / rs->crc_bw * 1e3);
    }
}

static void report_text(const bench *bn, const results *rs, const summary *sm)
{
    const opts *o = bn->o;
    const double *med = sm->med;
    text_setup(bn, rs, sm);
    printf("%u pairs, order alternating\n", o->pairs);
    printf("  untiled GEMMs (W on the device)   %10.3f ms\n", med[R_UNTILED] * 1e3);
    printf("  tiled, W in pinned host memory    %10.3f ms   ratio to untiled %.3f", med[R_HOST] * 1e3, sm->rh);
    if (rs->use_h2d)
        printf(", to max(GEMM, 2 x W host->device = %.3f ms) %.3f", med[R_H2D] * 1e3, sm->rhb);
    printf("\n");
    if (!o->no_nvme) {
        printf("  tiled, W on NVMe                  %10.3f ms", med[R_NVME] * 1e3);
        if (rs->use_fio)
            printf("   ratio to max(GEMM, 2 x W / fio %.2f GB/s = %.3f ms) %.3f\n", med[R_FIO] * 1e-9,
                   2.0 * (double)rs->wbytes / med[R_FIO] * 1e3, sm->rn);
        else
            printf("   (no NVMe bound: %s)\n", o->no_fio ? "--no-fio" : rs->fio_err);
    }
    printf("(medians of %u pairs; ratios are medians of per-pair ratios)\n", o->pairs);
    printf("passes: backward %s, forward's last tile %s, next forward's first tile %s\n",
           o->in_order ? "first tile to last" : "last tile to first",
           !o->no_keep && !o->in_order ? "kept for backward" : "released",
           o->no_prefetch ? "not prefetched" : "prefetched at the end of the step (its read untimed)");
    text_walks(bn, rs, sm);
}

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
    uint64_t wbytes = o.out * o.in * zo_dtype_size(o.dtype);
    if (plan_grid(&o, wbytes, ZO_TILE_TRAIN, &pg) < 0)
        return bad("%s", zo_last_error_detail());
    bench bn;
    memset(&bn, 0, sizeof(bn));
    bn.o = &o;
    choose_slot(&bn, &pg, wbytes);
    rc = setup(&bn);
    if (rc) {
        teardown(&bn);
        return rc;
    }
    results rs;
    memset(&rs, 0, sizeof(rs));
    rs.wbytes = wbytes;
    zo_store_get_stats(bn.store, &rs.ss);
    rs.pool_bytes = (uint64_t)rs.ss.pool_slots * rs.ss.pool_slot_size;
    rs.use_fio = !o.no_nvme && !o.no_fio;
    if (rs.use_fio && fio_prepare(&o, bn.dir, wbytes, &bn.fio) < 0) {
        teardown(&bn);
        return EXIT_RUN;
    }
    rs.crc_bw = crc32c_rate(&o, wbytes);
    rs.use_h2d = h2d_prepare(&bn, wbytes);
    results_alloc(&rs, o.pairs);
    rc = warm_up(&bn, &rs);
    for (unsigned p = 0; p < o.pairs && !rc; p++)
        rc = run_pair(&bn, &rs, p);
    if (!rc) {
        summary sm;
        summarize(&bn, &rs, &sm);
        if (o.json)
            report_json(&bn, &rs, &sm);
        else
            report_text(&bn, &rs, &sm);
    }
    results_free(&rs);
    teardown(&bn);
    return rc;
}
