/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-train's command line (train_options.h).
 */
#include "train_options.h"
#include "tool_common.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
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
            "  --state-dtype T     Adam's m and v: fp32 (default), bf16, q8 or q4 (block-quantized)\n"
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
            "  --comm-timeout S    under mpirun: a rank waiting longer than S seconds in a\n"
            "                      collective fails the run (a rank died, hangs or stopped;\n"
            "                      default 1800, 0 waits forever)\n"
            "  --json FILE         one JSON line per step (and a summary line) into a new FILE\n"
            "  --quiet             no per-step lines\n"
            "  --help\n");
}

/* How an option's value is read, and where it goes. */
typedef enum train_opt_kind {
    OPT_U64,     /* a size (zo_parse_size: 4K, 1e6) in [min, max], into a uint64_t */
    OPT_UINT,    /* the same, into an unsigned */
    OPT_INT,     /* the same, into an int */
    OPT_DOUBLE,  /* a finite number in [dmin, dmax], into a double */
    OPT_ONOFF,   /* on / off (1 / 0, true / false), into an int */
    OPT_DTYPE,   /* bf16, fp16 or fp32, into a zo_dtype */
    OPT_OFFLOAD, /* host (or cpu) / nvme, into an int (a zo_optim_placement) */
    OPT_STATE,   /* fp32, bf16, q8 or q4: into state_dtype and the int state_bits (the field) */
    OPT_STR,     /* the argument itself, into a const char * */
    OPT_FLAG,    /* no value: 1 into an int */
    OPT_HELP,    /* no value: the usage on stdout */
} train_opt_kind;

/* One option: the table below is the whole command line but for --help's
 * text (train_usage()) and the checks across options (options_finish()). */
typedef struct train_opt {
    const char *name;     /* the long name, without "--" */
    train_opt_kind kind;
    size_t field;         /* offsetof the field in options */
    uint64_t min, max;    /* OPT_U64, OPT_UINT, OPT_INT */
    double dmin, dmax;    /* OPT_DOUBLE */
    size_t given;         /* offsetof an int set to 1 when the option is given; 0: none (params is at 0) */
    int model;            /* a model option: its presence means not the embedded default */
} train_opt;

#define F(f) offsetof(options, f)
static const train_opt train_opts[] = {
    {"params", OPT_U64, F(params), .min = 2, .max = 1ull << 40, .model = 1},
    {"layers", OPT_UINT, F(layers), .min = 1, .max = TRAIN_MAX_LAYERS, .model = 1},
    {"width", OPT_U64, F(width), .min = 1, .max = 1 << 20, .model = 1},
    {"batch", OPT_U64, F(batch), .min = 1, .max = 1 << 20},
    {"steps", OPT_UINT, F(steps), .min = 1, .max = 100000000},
    {"offload", OPT_OFFLOAD, F(offload)},
    {"nvme-path", OPT_STR, F(nvme_path)},
    {"dpu", OPT_ONOFF, F(dpu)},
    {"dpu-warmup", OPT_INT, F(dpu_warmup), .min = 0, .max = 1000000},
    {"param-dtype", OPT_DTYPE, F(param_dtype)},
    {"grad", OPT_DTYPE, F(grad_dtype)},
    {"state-dtype", OPT_STATE, F(state_bits)},
    {"accum", OPT_INT, F(accum), .min = 1, .max = 65536},
    {"clip", OPT_DOUBLE, F(clip), .dmin = 0, .dmax = 1e30},
    {"lr", OPT_DOUBLE, F(lr), .dmin = 0, .dmax = 1e3, .given = F(lr_given)},
    {"sub-group", OPT_U64, F(sub_group), .min = 64, .max = 1ull << 40},
    {"device-budget", OPT_U64, F(dev_budget), .min = 1, .max = UINT64_MAX},
    {"threads", OPT_INT, F(nthreads), .min = 1, .max = 1024},
    {"backend", OPT_STR, F(backend)},
    {"config", OPT_STR, F(config)},
    {"save", OPT_STR, F(save)},
    {"resume", OPT_STR, F(resume)},
    {"verify", OPT_FLAG, F(verify)},
    {"comm-timeout", OPT_DOUBLE, F(comm_timeout), .dmin = 0, .dmax = 1e7},
    {"json", OPT_STR, F(json)},
    {"quiet", OPT_FLAG, F(quiet)},
    {"seed", OPT_U64, F(seed), .min = 0, .max = UINT64_MAX / 4, .given = F(seed_given)},
    {"help", OPT_HELP, 0},
};
#undef F
#define NOPTS (sizeof(train_opts) / sizeof(train_opts[0]))
/* getopt_long's value for train_opts[i]: clear of the characters it returns itself */
#define OPT_VAL0 256

static int parse_size_in(const train_opt *d, const char *s, uint64_t *out)
{
    uint64_t v;
    if (zo_parse_size(s, &v) < 0 || v < d->min || v > d->max) {
        fprintf(stderr, "zo-train: --%s: bad value '%s' (expected %" PRIu64 "..%" PRIu64 ")\n", d->name, s, d->min,
                d->max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const train_opt *d, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < d->dmin || v > d->dmax) {
        fprintf(stderr, "zo-train: --%s: bad value '%s' (expected a number in %g..%g)\n", d->name, s, d->dmin,
                d->dmax);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_onoff(const train_opt *d, const char *s, int *out)
{
    if (!strcmp(s, "on") || !strcmp(s, "1") || !strcmp(s, "true"))
        *out = 1;
    else if (!strcmp(s, "off") || !strcmp(s, "0") || !strcmp(s, "false"))
        *out = 0;
    else {
        fprintf(stderr, "zo-train: --%s: expected on or off, not '%s'\n", d->name, s);
        return -1;
    }
    return 0;
}

static int parse_dtype(const train_opt *d, const char *s, zo_dtype *out)
{
    zo_dtype t;
    if (zo_dtype_parse(s, &t) < 0 || (t != ZO_DTYPE_BF16 && t != ZO_DTYPE_F16 && t != ZO_DTYPE_F32)) {
        fprintf(stderr, "zo-train: --%s: expected bf16, fp16 or fp32, not '%s'\n", d->name, s);
        return -1;
    }
    *out = t;
    return 0;
}

static int parse_offload(const train_opt *d, const char *s, int *out)
{
    if (!strcmp(s, "host") || !strcmp(s, "cpu"))
        *out = ZO_OPTIM_PLACE_HOST;
    else if (!strcmp(s, "nvme"))
        *out = ZO_OPTIM_PLACE_NVME;
    else {
        fprintf(stderr, "zo-train: --%s: expected host or nvme, not '%s'\n", d->name, s);
        return -1;
    }
    return 0;
}

static int parse_state(const train_opt *d, const char *s, options *o)
{
    if (zo_tool_state_parse(s, &o->state_dtype, &o->state_bits) < 0) {
        fprintf(stderr, "zo-train: --%s: expected fp32, bf16, q8 or q4, not '%s'\n", d->name, s);
        return -1;
    }
    return 0;
}

/* Store one option's value s (NULL for one without) into o. 0, or -1 with
 * the reason on stderr. */
static int option_set(const train_opt *d, const char *s, options *o)
{
    char *field = (char *)o + d->field;
    uint64_t v;
    int r = 0;
    switch (d->kind) {
    case OPT_U64: r = parse_size_in(d, s, (uint64_t *)(void *)field); break;
    case OPT_UINT: if ((r = parse_size_in(d, s, &v)) == 0) *(unsigned *)(void *)field = (unsigned)v; break;
    case OPT_INT: if ((r = parse_size_in(d, s, &v)) == 0) *(int *)(void *)field = (int)v; break;
    case OPT_DOUBLE: r = parse_double(d, s, (double *)(void *)field); break;
    case OPT_ONOFF: r = parse_onoff(d, s, (int *)(void *)field); break;
    case OPT_DTYPE: r = parse_dtype(d, s, (zo_dtype *)(void *)field); break;
    case OPT_OFFLOAD: r = parse_offload(d, s, (int *)(void *)field); break;
    case OPT_STATE: r = parse_state(d, s, o); break;
    case OPT_STR: *(const char **)(void *)field = s; break;
    case OPT_FLAG: *(int *)(void *)field = 1; break;
    case OPT_HELP: break;
    }
    if (r == 0 && d->given)
        *(int *)(void *)((char *)o + d->given) = 1;
    return r;
}

static void options_defaults(options *o)
{
    memset(o, 0, sizeof(*o));
    o->offload = -1;
    o->dpu = -1;
    o->dpu_warmup = -1;
    o->param_dtype = ZO_DTYPE_BF16;
    o->grad_dtype = ZO_DTYPE_COUNT;
    o->accum = -1;
    o->state_bits = -1;
    o->clip = -1;
    o->lr = -1;
    o->backend = "host";
    o->seed = 1;
    o->comm_timeout = 1800; /* torch.distributed's default */
}

/* The options as they stand on the command line, one by one (getopt_long
 * over train_opts). 0; 2 on bad usage; -1 after --help. */
static int options_read(int argc, char **argv, options *o, int *model_flags)
{
    static struct option longopts[NOPTS + 1]; /* the last stays zero */
    for (size_t i = 0; i < NOPTS; i++) {
        int novalue = train_opts[i].kind == OPT_FLAG || train_opts[i].kind == OPT_HELP;
        longopts[i] = (struct option){train_opts[i].name, novalue ? no_argument : required_argument, 0,
                                      OPT_VAL0 + (int)i};
    }
    optind = 1;
    opterr = 0;
    int c;
    /* ":": a missing value is ':', not '?' (which reads as an unknown option) */
    while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        if (c == ':') {
            fprintf(stderr, "zo-train: %s needs a value (--help lists the options)\n", argv[optind - 1]);
            return 2;
        }
        if (c < OPT_VAL0 || c >= OPT_VAL0 + (int)NOPTS) {
            fprintf(stderr, "zo-train: unknown option '%s' (--help lists them)\n", argv[optind - 1]);
            return 2;
        }
        const train_opt *d = &train_opts[c - OPT_VAL0];
        if (d->kind == OPT_HELP) {
            train_usage(stdout);
            return -1;
        }
        if (option_set(d, optarg, o) < 0)
            return 2;
        *model_flags |= d->model;
    }
    if (optind < argc) {
        fprintf(stderr, "zo-train: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return 0;
}

/* The checks across options, and the defaults that follow from the others
 * (the model's shape, the learning rate for its width, the embedded
 * default). 0, or 2 on bad usage. */
static int options_finish(options *o, int argc, int model_flags)
{
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

int train_options_parse(int argc, char **argv, options *o)
{
    int model_flags = 0;
    options_defaults(o);
    int r = options_read(argc, argv, o, &model_flags);
    return r ? r : options_finish(o, argc, model_flags);
}
