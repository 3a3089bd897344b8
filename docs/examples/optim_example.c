/* SPDX-License-Identifier: Apache-2.0 */
/* The complete example of docs/optim.md: a framework's training loop driving
 * the offload optimizer engine.
 *
 * The "framework" here is a linear layer y = W x + b trained on a synthetic
 * regression task, with bf16 parameters and gradients in device memory. It
 * runs its forward/backward on the CPU (so the example needs no GPU) and
 * moves data to and from the device with its own stream, exactly as a GPU
 * framework's kernels would produce and consume device buffers. The engine
 * owns the fp32 masters and AdamW states, takes each gradient as backward
 * produces it, clips, updates, and writes the new bf16 params back.
 *
 * Shown: groups (weights with decay, biases without), gradient intake with
 * an event, accumulation over 2 micro-steps, clipping, delayed parameter
 * update (DPU) after one warm-up step, an LR schedule, the timeline, and
 * save / load of the whole optimizer state.
 *
 * Usage: optim_example [host|cuda] [checkpoint_dir]
 * Built and run by `meson test` (examples suite), so it stays true. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != 0) {                                                                      \
            fprintf(stderr, "%s: %s (%s)\n", #call, zo_strerror(rc_), zo_last_error_detail()); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

enum { IN = 64, OUT = 16, BATCH = 32, ACCUM = 2, STEPS = 40 };

/* the framework's state: device params and grads, its stream */
typedef struct framework {
    zo_dev *dev;
    zo_stream *stream;
    zo_event *grads_ready;
    void *w, *b;         /* device params, bf16 */
    void *gw, *gb;       /* device grads, bf16 */
    uint16_t hw[OUT * IN], hb[OUT], hgw[OUT * IN], hgb[OUT]; /* host staging of the framework */
    float target_w[OUT * IN], target_b[OUT];
    unsigned seed;
} framework;

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* forward + backward of one micro-batch on the params the device holds now;
 * leaves bf16 gradients in device memory and records `grads_ready` */
static double forward_backward(framework *f, double loss_scale)
{
    CHECK(zo_memcpy_async(f->stream, f->hw, f->w, sizeof(f->hw), ZO_COPY_D2H));
    CHECK(zo_memcpy_async(f->stream, f->hb, f->b, sizeof(f->hb), ZO_COPY_D2H));
    CHECK(zo_stream_sync(f->stream));
    float gw[OUT * IN] = {0}, gb[OUT] = {0};
    double loss = 0;
    for (int n = 0; n < BATCH; n++) {
        float x[IN];
        for (int i = 0; i < IN; i++)
            x[i] = frand(&f->seed);
        for (int o = 0; o < OUT; o++) {
            float y = zo_bf16_to_f32(f->hb[o]), t = f->target_b[o];
            for (int i = 0; i < IN; i++) {
                y += zo_bf16_to_f32(f->hw[o * IN + i]) * x[i];
                t += f->target_w[o * IN + i] * x[i];
            }
            float d = (y - t) / (BATCH * ACCUM); /* mean over the accumulated batch */
            loss += 0.5 * (double)(y - t) * (y - t) / BATCH;
            gb[o] += d;
            for (int i = 0; i < IN; i++)
                gw[o * IN + i] += d * x[i];
        }
    }
    for (int k = 0; k < OUT * IN; k++)
        f->hgw[k] = zo_f32_to_bf16((float)(gw[k] * loss_scale));
    for (int k = 0; k < OUT; k++)
        f->hgb[k] = zo_f32_to_bf16((float)(gb[k] * loss_scale));
    CHECK(zo_memcpy_async(f->stream, f->gw, f->hgw, sizeof(f->hgw), ZO_COPY_H2D));
    CHECK(zo_memcpy_async(f->stream, f->gb, f->hgb, sizeof(f->hgb), ZO_COPY_H2D));
    CHECK(zo_event_record(f->grads_ready, f->stream));
    return loss;
}

int main(int argc, char **argv)
{
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    if (argc > 1 && zo_dev_kind_parse(argv[1], &dc.kind) != 0)
        return 2;
    if (dc.kind != ZO_DEV_HOST && zo_dev_probe(dc.kind, NULL, NULL, 0) != 0) {
        printf("SKIP: no %s device\n", argv[1]);
        return 77;
    }
    const char *base = argc > 2 ? argv[2] : "/var/tmp";
    char ckdir[512];
    snprintf(ckdir, sizeof(ckdir), "%s/zo-optim-example.%ld", base, (long)getpid());

    framework f = {.seed = 12345};
    CHECK(zo_dev_open(&f.dev, &dc));
    CHECK(zo_stream_create(f.dev, &f.stream));
    CHECK(zo_event_create(f.dev, &f.grads_ready));
    CHECK(zo_dev_malloc(f.dev, &f.w, sizeof(f.hw)));
    CHECK(zo_dev_malloc(f.dev, &f.b, sizeof(f.hb)));
    CHECK(zo_dev_malloc(f.dev, &f.gw, sizeof(f.hgw)));
    CHECK(zo_dev_malloc(f.dev, &f.gb, sizeof(f.hgb)));
    for (int k = 0; k < OUT * IN; k++) {
        f.target_w[k] = frand(&f.seed);
        f.hw[k] = zo_f32_to_bf16(0.1f * frand(&f.seed));
    }
    for (int k = 0; k < OUT; k++) {
        f.target_b[k] = frand(&f.seed);
        f.hb[k] = 0;
    }
    CHECK(zo_memcpy_async(f.stream, f.w, f.hw, sizeof(f.hw), ZO_COPY_H2D));
    CHECK(zo_memcpy_async(f.stream, f.b, f.hb, sizeof(f.hb), ZO_COPY_H2D));
    CHECK(zo_stream_sync(f.stream));

    /* ---- the engine: two groups, masters in pinned host memory ---- */
    const uint64_t wn[1] = {OUT * IN}, bn[1] = {OUT};
    const char *wname[1] = {"linear.weight"}, *bname[1] = {"linear.bias"};
    void *wdev[1] = {f.w}, *bdev[1] = {f.b};
    zo_cpuadam_hparams nodecay;
    CHECK(zo_cpuadam_hparams_default(&nodecay, ZO_OPTIM_ADAMW));
    nodecay.lr = 3e-2;
    nodecay.weight_decay = 0;
    zo_optim_group groups[2];
    zo_optim_group_default(&groups[0]);
    groups[0].ntensors = 1;
    groups[0].numel = wn;
    groups[0].names = wname;
    groups[0].dev_params = wdev;
    zo_optim_group_default(&groups[1]);
    groups[1].ntensors = 1;
    groups[1].numel = bn;
    groups[1].names = bname;
    groups[1].dev_params = bdev;
    groups[1].hparams = &nodecay;

    zo_optim_config cfg;
    zo_optim_config_default(&cfg);
    cfg.dev = f.dev;
    cfg.param_dtype = ZO_DTYPE_BF16; /* bf16: no loss scaling needed */
    cfg.groups = groups;
    cfg.ngroups = 2;
    cfg.hparams.lr = 3e-2;           /* group 0 uses the config's AdamW hparams */
    cfg.hparams.weight_decay = 1e-4;
    cfg.max_grad_norm = 1.0;         /* gradient_clipping */
    cfg.grad_accum_steps = ACCUM;    /* gradient_accumulation_steps */
    cfg.dpu = 1;                     /* delayed parameter update ... */
    cfg.dpu_warmup_steps = 1;        /* ... after one step without delay */
    cfg.nthreads = 2;
    zo_optim *opt;
    CHECK(zo_optim_create(&opt, &cfg));
    CHECK(zo_optim_init_from_device(opt)); /* masters = the device params, widened */

    /* ---- the training loop ---- */
    double first = 0, last = 0;
    for (int step = 1; step <= STEPS; step++) {
        /* an LR schedule: cosine decay over the run, set before the update */
        double lr = 3e-2 * 0.5 * (1 + cos(M_PI * (step - 1) / STEPS));
        CHECK(zo_optim_set_lr(opt, 0, lr));
        CHECK(zo_optim_set_lr(opt, 1, lr));
        double loss = 0;
        for (int micro = 0; micro < ACCUM; micro++) {
            /* under DPU the params read here are those of step - 2 (step - 1
             * during the warm-up): see docs/optim.md */
            loss += forward_backward(&f, zo_optim_loss_scale(opt)) / ACCUM;
            /* hand both gradients over as soon as backward produced them;
             * the engine copies them device -> host behind the event */
            zo_optim_grad_ref bucket[2] = {{0, f.gw}, {1, f.gb}};
            CHECK(zo_optim_grad_bucket(opt, bucket, 2, f.grads_ready));
            /* end of the micro-step: accumulates, or starts the update at the
             * boundary (and, under DPU, first lands the previous update) */
            CHECK(zo_optim_step_async(opt, NULL));
            /* the device gradient buffers are reused by the next backward:
             * wait for the engine's copies of them */
            CHECK(zo_optim_grads_done(opt));
        }
        if (step == 1)
            first = loss;
        last = loss;
        if (step % 10 == 0) {
            zo_optim_step_result res = {.struct_size = sizeof(res)};
            char tl[512];
            if (zo_optim_last_result(opt, &res) == 0 && zo_optim_timeline_json(opt, tl, sizeof(tl)) > 0)
                printf("step %2d loss %.5f  grad norm %.4f clip %.3f  timeline %s\n", step, loss, res.grad_norm,
                       res.clip_coef, tl);
        }
    }
    CHECK(zo_optim_wait(opt, NULL)); /* the last update lands on the device */

    /* ---- save, scramble, load: the optimizer comes back whole ---- */
    float before[8], after[8];
    CHECK(zo_optim_state_export(opt, 0, ZO_OPTIM_STATE_EXP_AVG_SQ, before, ZO_DTYPE_F32, 0, 8));
    CHECK(zo_optim_save(opt, ckdir, "final", 2, "{\"epoch\": 1}"));
    zo_optim_destroy(&opt);
    CHECK(zo_optim_create(&opt, &cfg));
    char user[64];
    CHECK(zo_optim_load(opt, ckdir, NULL, user, sizeof(user)));
    CHECK(zo_optim_state_export(opt, 0, ZO_OPTIM_STATE_EXP_AVG_SQ, after, ZO_DTYPE_F32, 0, 8));
    zo_optim_info info = {.struct_size = sizeof(info)};
    CHECK(zo_optim_get_info(opt, &info));
    int same = memcmp(before, after, sizeof(before)) == 0;
    printf("loss %.5f -> %.5f; restored step %lld, user %s, states %s\n", first, last, (long long)info.step, user,
           same ? "identical" : "DIFFER");

    zo_optim_destroy(&opt);
    zo_dev_free(f.dev, f.w);
    zo_dev_free(f.dev, f.b);
    zo_dev_free(f.dev, f.gw);
    zo_dev_free(f.dev, f.gb);
    zo_event_destroy(&f.grads_ready);
    zo_stream_destroy(&f.stream);
    zo_dev_close(&f.dev);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", ckdir);
    if (system(cmd) != 0)
        return 1;
    return same && info.step == STEPS && last < 0.25 * first ? 0 : 1;
}
