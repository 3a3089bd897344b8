/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-train's command line (train_options.h).
 */
#include "train_options.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/optim.h>


void train_usage(FILE *f)
{
    fprintf(f,
            "usage: zo-train [options]\n"
            "Trains an MLP regressing a random teacher network through the offload optimizer engine.\n"
            "With no options: a model whose masters and states do not fit the device budget, NVMe\n"
            "offload into a temporary directory, DPU after warm-up, about a minute of training.\n"
            "\n"
            "model\n"
            "  --params N          parameters in total (with --layers: picks the width)\n"
            "  --layers L          linear layers (default 6)\n"
            "  --width W           layer width: W x W weights plus a bias (default 2048)\n"
            "  --batch B           samples per micro-step (default 128)\n"
            "  --steps S           optimizer steps to run (default 200)\n"
            "  --seed N            model, teacher and data seed (default 1)\n"
            "precision and optimizer\n"
            "  --param-dtype T     device parameters: bf16 (default), fp16, fp32\n"
            "  --grad T            device gradients: bf16, fp16, fp32 (default: the param dtype)\n"
            "  --lr X              AdamW learning rate (default min(1e-3, 0.25 / width))\n"
            "  --accum K           micro-steps per optimizer step (default 1)\n"
            "  --clip X            global gradient norm cap (default 1.0; 0 no clipping)\n"
            "engine\n"
            "  --offload host|nvme where masters and optimizer states live\n"
            "  --nvme-path DIR     directory for the swap files (a private subdirectory is made and removed)\n"
            "  --dpu on|off        delayed parameter update\n"
            "  --dpu-warmup N      optimizer steps without delay first (default 1)\n"
            "  --sub-group N       elements per sub-group\n"
            "  --threads N         optimizer threads (default: all CPUs)\n"
            "  --config FILE       engine JSON config (DeepSpeed keys accepted); flags override it\n"
            "device\n"
            "  --backend host|cuda device backend for forward/backward (default host)\n"
            "  --device-budget N   device memory the model may hold, enforced on the host backend\n"
            "                      (default: params, grads and activations, so masters and states\n"
            "                      must be offloaded); a model over it gets tiled layers\n"
            "run\n"
            "  --save DIR          checkpoint at the end (and on Ctrl-C) into DIR\n"
            "  --resume DIR        continue from the latest checkpoint in DIR\n"
            "  --verify            also run the steps in memory and compare bit for bit\n"
            "  --json FILE         one JSON line per step (and a summary line) into a new FILE\n"
            "  --quiet             no per-step lines\n"
            "  --help\n");
}

static int parse_u64(const char *name, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t v;
    if (zo_parse_size(s, &v) < 0 || v < min || v > max) {
        fprintf(stderr, "zo-train: %s: bad value '%s' (expected %" PRIu64 "..%" PRIu64 ")\n", name, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *name, const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "zo-train: %s: bad value '%s' (expected a number in %g..%g)\n", name, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_onoff(const char *name, const char *s, int *out)
{
    if (!strcmp(s, "on") || !strcmp(s, "1") || !strcmp(s, "true"))
        *out = 1;
    else if (!strcmp(s, "off") || !strcmp(s, "0") || !strcmp(s, "false"))
        *out = 0;
    else {
        fprintf(stderr, "zo-train: %s: expected on or off, not '%s'\n", name, s);
        return -1;
    }
    return 0;
}

static int parse_dtype(const char *name, const char *s, zo_dtype *out)
{
    zo_dtype t;
    if (zo_dtype_parse(s, &t) < 0 || (t != ZO_DTYPE_BF16 && t != ZO_DTYPE_F16 && t != ZO_DTYPE_F32)) {
        fprintf(stderr, "zo-train: %s: expected bf16, fp16 or fp32, not '%s'\n", name, s);
        return -1;
    }
    *out = t;
    return 0;
}

int train_options_parse(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof(*o));
    optind = 1;
    o->offload = -1;
    o->dpu = -1;
    o->dpu_warmup = -1;
    o->param_dtype = ZO_DTYPE_BF16;
    o->grad_dtype = ZO_DTYPE_COUNT;
    o->accum = -1;
    o->clip = -1;
    o->lr = -1;
    o->backend = "host";
    o->seed = 1;
    enum { O_PARAMS = 256, O_LAYERS, O_WIDTH, O_BATCH, O_STEPS, O_OFFLOAD, O_NVME, O_DPU, O_DPUW, O_PDT, O_GRAD,
           O_ACCUM, O_CLIP, O_LR, O_SG, O_BUDGET, O_THREADS, O_BACKEND, O_CONFIG, O_SAVE, O_RESUME, O_VERIFY,
           O_JSON, O_QUIET, O_SEED, O_HELP };
    static const struct option opts[] = {
        {"params", required_argument, 0, O_PARAMS},   {"layers", required_argument, 0, O_LAYERS},
        {"width", required_argument, 0, O_WIDTH},     {"batch", required_argument, 0, O_BATCH},
        {"steps", required_argument, 0, O_STEPS},     {"offload", required_argument, 0, O_OFFLOAD},
        {"nvme-path", required_argument, 0, O_NVME},  {"dpu", required_argument, 0, O_DPU},
        {"dpu-warmup", required_argument, 0, O_DPUW}, {"param-dtype", required_argument, 0, O_PDT},
        {"grad", required_argument, 0, O_GRAD},       {"accum", required_argument, 0, O_ACCUM},
        {"clip", required_argument, 0, O_CLIP},       {"lr", required_argument, 0, O_LR},
        {"sub-group", required_argument, 0, O_SG},    {"device-budget", required_argument, 0, O_BUDGET},
        {"threads", required_argument, 0, O_THREADS}, {"backend", required_argument, 0, O_BACKEND},
        {"config", required_argument, 0, O_CONFIG},   {"save", required_argument, 0, O_SAVE},
        {"resume", required_argument, 0, O_RESUME},   {"verify", no_argument, 0, O_VERIFY},
        {"json", required_argument, 0, O_JSON},       {"quiet", no_argument, 0, O_QUIET},
        {"seed", required_argument, 0, O_SEED},       {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0}};
    int c, model_flags = 0;
    uint64_t v;
    opterr = 0;
    /* ":": a missing value is ':', not '?' (which reads as an unknown option) */
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case O_PARAMS: if (parse_u64("--params", optarg, 2, 1ull << 40, &o->params)) return 2; model_flags = 1; break;
        case O_LAYERS: if (parse_u64("--layers", optarg, 1, TRAIN_MAX_LAYERS, &v)) return 2; o->layers = (unsigned)v; model_flags = 1; break;
        case O_WIDTH: if (parse_u64("--width", optarg, 1, 1 << 20, &o->width)) return 2; model_flags = 1; break;
        case O_BATCH: if (parse_u64("--batch", optarg, 1, 1 << 20, &o->batch)) return 2; break;
        case O_STEPS: if (parse_u64("--steps", optarg, 1, 100000000, &v)) return 2; o->steps = (unsigned)v; break;
        case O_OFFLOAD:
            if (!strcmp(optarg, "host") || !strcmp(optarg, "cpu"))
                o->offload = ZO_OPTIM_PLACE_HOST;
            else if (!strcmp(optarg, "nvme"))
                o->offload = ZO_OPTIM_PLACE_NVME;
            else {
                fprintf(stderr, "zo-train: --offload: expected host or nvme, not '%s'\n", optarg);
                return 2;
            }
            break;
        case O_NVME: o->nvme_path = optarg; break;
        case O_DPU: if (parse_onoff("--dpu", optarg, &o->dpu)) return 2; break;
        case O_DPUW: if (parse_u64("--dpu-warmup", optarg, 0, 1000000, &v)) return 2; o->dpu_warmup = (int)v; break;
        case O_PDT: if (parse_dtype("--param-dtype", optarg, &o->param_dtype)) return 2; break;
        case O_GRAD: if (parse_dtype("--grad", optarg, &o->grad_dtype)) return 2; break;
        case O_ACCUM: if (parse_u64("--accum", optarg, 1, 65536, &v)) return 2; o->accum = (int)v; break;
        case O_CLIP: if (parse_double("--clip", optarg, 0, 1e30, &o->clip)) return 2; break;
        case O_LR: if (parse_double("--lr", optarg, 0, 1e3, &o->lr)) return 2; o->lr_given = 1; break;
        case O_SG: if (parse_u64("--sub-group", optarg, 64, 1ull << 40, &o->sub_group)) return 2; break;
        case O_BUDGET: if (parse_u64("--device-budget", optarg, 1, UINT64_MAX, &o->dev_budget)) return 2; break;
        case O_THREADS: if (parse_u64("--threads", optarg, 1, 1024, &v)) return 2; o->nthreads = (int)v; break;
        case O_BACKEND: o->backend = optarg; break;
        case O_CONFIG: o->config = optarg; break;
        case O_SAVE: o->save = optarg; break;
        case O_RESUME: o->resume = optarg; break;
        case O_VERIFY: o->verify = 1; break;
        case O_JSON: o->json = optarg; break;
        case O_QUIET: o->quiet = 1; break;
        case O_SEED: if (parse_u64("--seed", optarg, 0, UINT64_MAX / 4, &o->seed)) return 2; o->seed_given = 1; break;
        case O_HELP: train_usage(stdout); return -1;
        case ':':
            fprintf(stderr, "zo-train: %s needs a value (--help lists the options)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "zo-train: unknown option '%s' (--help lists them)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zo-train: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (strcmp(o->backend, "host") && strcmp(o->backend, "cuda")) {
        fprintf(stderr, "zo-train: --backend: expected host or cuda, not '%s'\n", o->backend);
        return 2;
    }
    if (o->params && o->width && o->layers) {
        fprintf(stderr, "zo-train: give --params with --layers or --width, not all three\n");
        return 2;
    }
    o->defaulted = !model_flags && argc == 1;
    /* The embedded default: 6 layers of 2048 (25.2 M parameters: 288 MiB of
     * fp32 masters and Adam states against a device budget of about 130 MiB),
     * NVMe offload into a temporary directory, DPU after one warm-up step. */
    if (!o->layers && o->params && o->width) {
        /* in 64 bits, and held to --layers' own limit: a narrow width asks
         * for more layers than --layers accepts (and cast to unsigned, 2^32
         * + 1 of them wrapped to 1) */
        uint64_t l = o->params / (o->width * o->width + o->width);
        if (l > TRAIN_MAX_LAYERS) {
            fprintf(stderr, "zo-train: --params %" PRIu64 " at --width %" PRIu64 " means %" PRIu64 " layers, more than "
                            "the %u --layers allows: give a larger --width (or --layers)\n",
                    o->params, o->width, l, TRAIN_MAX_LAYERS);
            return 2;
        }
        o->layers = (unsigned)l;
    } else if (!o->layers) {
        o->layers = 6;
    }
    if (!o->layers) {
        fprintf(stderr, "zo-train: --params %" PRIu64 " is less than one layer of width %" PRIu64 "\n", o->params,
                o->width);
        return 2;
    }
    if (!o->width) {
        if (o->params) {
            /* L (W^2 + W) = P  ->  W = (-1 + sqrt(1 + 4P/L)) / 2 */
            double w = (-1.0 + sqrt(1.0 + 4.0 * (double)o->params / o->layers)) / 2.0;
            o->width = w < 1 ? 1 : (uint64_t)w;
        } else {
            o->width = 2048;
        }
    }
    if (!o->batch)
        o->batch = 128;
    if (o->lr < 0)
        /* Adam's step moves every weight by about lr, and a layer's output
         * by about lr * width: the rate that is stable shrinks with the width */
        o->lr = fmin(1e-3, 0.25 / (double)o->width);
    if (!o->steps)
        o->steps = 200;
    if (o->defaulted) {
        o->offload = ZO_OPTIM_PLACE_NVME;
        o->dpu = 1;
        /* sub-groups of 4 M elements, so the NVMe sweep has several in flight */
        o->sub_group = 1u << 22;
    }
    return 0;
}

