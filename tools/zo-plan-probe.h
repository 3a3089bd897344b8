/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-plan's run probe: a few real training steps on a slice of the planned
 * model, timed part by part the way zo-train times its steps, so that the
 * prediction rests on the very operations the plan describes (the teacher's
 * data, forward and backward of layers of the planned shape on the planned
 * backend, the engine's gradient intake, its sweep through the planned
 * placement and path with its own block size, depth and threads) rather
 * than on bandwidths of other operations. Not part of the library: a tool
 * helper of zo-plan.
 */
#ifndef ZO_PLAN_PROBE_H
#define ZO_PLAN_PROBE_H

#include <stdint.h>

#include <zoffload/optim.h>

#include "train_model.h"
#include "train_options.h"

/* What to probe. */
typedef struct plan_probe_in {
    /* a zo-train line: its options and shape (layers = the slice to run);
     * NULL opt: an engine-only probe of `params` elements (no model) */
    const options *opt;
    train_shape shape;
    uint64_t params;          /* engine-only: elements (in tensors of at most 4 M) */
    zo_dtype pdt, gdt, sdt;   /* engine-only: precisions */
    int qbits;                /* 8 / 4: q8 / q4 moments (sdt fp32), 0: sdt */
    int nvme, dpu;            /* placement, delayed parameter update */
    unsigned accum;
    double clip;
    uint64_t sub_group;       /* 0: the engine's default */
    unsigned buffer_count;    /* 0: the engine's default */
    int nthreads;             /* 0: every CPU */
    const char *nvme_dir;     /* parent of the probe's private swap directory */
    unsigned steps;           /* timed steps (after the warm-up ones), at most 16 */
} plan_probe_in;

/* Medians over the timed steps, in seconds (the engine's split: medians
 * over the timelines of the updates those steps finished). */
typedef struct plan_probe_out {
    uint64_t params;          /* parameters the probe trained */
    unsigned steps;           /* timed steps */
    double data;              /* the teacher's batch (zo-train: before each micro-step's forward) */
    double compute;           /* forward, zo_optim_grads_done, backward with the engine's intake */
    double call;              /* zo_optim_step_async: under DPU the wait for the previous update and its
                                 parameter copy */
    double wait;              /* zo_optim_wait: without DPU the update after backward */
    double step;              /* the whole step as zo-train measures it */
    double d2h, optim, nvme_read, nvme_write, h2d, stall, update; /* the engine's timeline */
    double setup;             /* seconds the probe took in all */
} plan_probe_out;

/* Run the probe. Prints nothing on success; on failure a line on stderr.
 * Every file it makes (a private directory under nvme_dir) is removed
 * before it returns. @return 0 or a negative error. */
int plan_probe_run(const plan_probe_in *in, plan_probe_out *out);

#endif
