/* SPDX-License-Identifier: Apache-2.0 */
/* The complete example of docs/cpuadam.md: one mixed-precision AdamW step
 * on a flat slice, the way an offload engine runs it per sub-group:
 *   1. gradient statistics of every slice (global norm, overflow check);
 *   2. the clip coefficient from the norm;
 *   3. the fused step: bf16 gradients in, unscale + clip, AdamW on the fp32
 *      master and states, bf16 parameters out for the GPU;
 *   4. taking a speculative step back with the rollback kernel.
 * Built and run by `meson test` (examples suite), so it stays true. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <zoffload/zoffload.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != 0) {                                                                      \
            fprintf(stderr, "%s: %s (%s)\n", #call, zo_strerror(rc_), zo_last_error_detail()); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(void)
{
    const size_t n = 1 << 20;
    const double loss_scale = 1024.0, max_norm = 1.0;
    float *master = NULL, *m = NULL, *v = NULL;
    uint16_t *grad = NULL, *out = NULL; /* bf16 */
    CHECK(zo_aligned_alloc((void **)&master, n * 4, 64));
    CHECK(zo_aligned_alloc((void **)&m, n * 4, 64));
    CHECK(zo_aligned_alloc((void **)&v, n * 4, 64));
    CHECK(zo_aligned_alloc((void **)&grad, n * 2, 64));
    CHECK(zo_aligned_alloc((void **)&out, n * 2, 64));
    for (size_t i = 0; i < n; i++) {
        master[i] = (float)sin((double)i);
        m[i] = v[i] = 0.0f;
        grad[i] = zo_f32_to_bf16((float)(loss_scale * 1e-3 * cos((double)i))); /* scaled by the loss scale */
    }

    /* A team: 2 threads, the variant the CPU flags pick. */
    zo_cpuadam_team_config cfg;
    zo_cpuadam_team_config_default(&cfg);
    cfg.nthreads = 2;
    zo_cpuadam_team *team = NULL;
    CHECK(zo_cpuadam_team_create(&team, &cfg));

    /* 1-2: overflow check and global norm (one slice here; sum over all) */
    zo_grad_stats st;
    CHECK(zo_cpuadam_team_grad_stats(team, grad, ZO_DTYPE_BF16, n, &st));
    if (st.nonfinite) {
        printf("overflow: skip the step, lower the loss scale\n");
        return 0;
    }
    double norm = sqrt(st.sumsq) / loss_scale;
    double clip = norm > max_norm ? max_norm / norm : 1.0;

    /* 3: the fused step */
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW); /* lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 1e-2 */
    hp.step = 1;
    hp.grad_scale = 1.0 / loss_scale;
    hp.clip_coef = clip;
    zo_cpuadam_tensors t;
    zo_cpuadam_tensors_default(&t);
    t.n = n;
    t.param = master;
    t.grad = grad;
    t.grad_dtype = ZO_DTYPE_BF16;
    t.exp_avg = m;
    t.exp_avg_sq = v;
    t.state_dtype = ZO_DTYPE_F32;
    t.param_out = out;
    t.out_dtype = ZO_DTYPE_BF16;
    float before = master[12345];
    CHECK(zo_cpuadam_team_step(team, &hp, &t));
    printf("variant %s, norm %.4f, clip %.4f, p[12345] %.6f -> %.6f (bf16 copy %.6f)\n",
           zo_cpuadam_team_variant(team), norm, clip, before, master[12345], zo_bf16_to_f32(out[12345]));

    /* 4: the step was speculative and must be taken back: same hparams, same grads */
    CHECK(zo_cpuadam_team_rollback(team, &hp, &t));
    printf("after rollback p[12345] = %.6f (was %.6f)\n", master[12345], before);
    int ok = fabsf(master[12345] - before) <= 1e-6f * (fabsf(before) + 1e-3f);

    zo_cpuadam_team_destroy(&team);
    zo_aligned_free(master);
    zo_aligned_free(m);
    zo_aligned_free(v);
    zo_aligned_free(grad);
    zo_aligned_free(out);
    return ok ? 0 : 1;
}
