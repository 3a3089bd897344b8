/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-train's command line, shared with zo-plan (which plans a zo-train
 * command line): the options and their defaults, the embedded default
 * included. Not part of the library: a tool helper.
 */
#ifndef ZO_TRAIN_OPTIONS_H
#define ZO_TRAIN_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#include <zoffload/common.h>

typedef struct options {
    uint64_t params;          /* --params: total parameters (picks the width for --layers) */
    unsigned layers;          /* --layers */
    uint64_t width;           /* --width */
    uint64_t batch;           /* --batch */
    unsigned steps;           /* --steps: optimizer steps (accumulation boundaries) this run */
    int offload;              /* --offload: ZO_OPTIM_PLACE_HOST / _NVME, -1 not given */
    const char *nvme_path;    /* --nvme-path: parent of the private swap directory */
    int dpu;                  /* --dpu: 0 / 1, -1 not given */
    int dpu_warmup;           /* --dpu-warmup, -1 not given */
    zo_dtype param_dtype;     /* --param-dtype */
    zo_dtype grad_dtype;      /* --grad: ZO_DTYPE_COUNT = not given */
    int accum;                /* --accum, -1 not given */
    int state_bits;           /* --state-dtype: 8 (q8), 4 (q4), 0 fp32/bf16 (state_dtype), -1 not given */
    zo_dtype state_dtype;     /* --state-dtype fp32 / bf16 (f32 with q8 / q4) */
    double clip;              /* --clip, < 0 not given */
    double lr;                /* --lr, or the default for the width */
    int lr_given;
    uint64_t sub_group;       /* --sub-group, 0 not given */
    uint64_t dev_budget;      /* --device-budget: host backend device memory cap, 0: automatic */
    int nthreads;             /* --threads */
    const char *backend;      /* --backend */
    const char *config;       /* --config */
    const char *save;         /* --save */
    const char *resume;       /* --resume */
    int verify;               /* --verify */
    double comm_timeout;      /* --comm-timeout: seconds a rank waits in a collective (0: forever) */
    const char *json;         /* --json */
    int quiet;                /* --quiet: no per-step lines */
    uint64_t seed;            /* --seed */
    int seed_given;
    int defaulted;            /* no model flags: the embedded default */
} options;

/* The most layers a model may have (--layers, and what --params with --width implies). */
#define TRAIN_MAX_LAYERS 4096u

/* The host backend's device budget zo-train sets itself when --device-budget
 * is not given: what the device model needs (params, grads, activations)
 * and an eighth more, never the fp32 masters and states. */
static inline uint64_t train_default_device_budget(uint64_t device_model_bytes)
{
    return device_model_bytes + device_model_bytes / 8 + (1u << 20);
}

/* The usage text. */
void train_usage(FILE *f);

/* Parse argv (argv[0] is the program) into *o, filling the defaults.
 * @return 0; 2 on bad usage (message on stderr); -1 after --help. Uses getopt: resets optind. */
int train_options_parse(int argc, char **argv, options *o);

#endif
