/* SPDX-License-Identifier: Apache-2.0 */
/* An offload optimizer's step with a group sweep (docs/store.md, "Group
 * sweeps"): sub-groups of (fp32 master, bf16 m, bf16 v), three homed on
 * NVMe and one in the pinned host tier, updated in place by one loop, every
 * tensor of a sub-group in step; the host tier is sized with
 * zo_store_tier_bytes_needed(). Two steps are checked against the same
 * update on plain arrays, bit for bit.
 *
 * Build: cc sweep_example.c $(pkg-config --cflags --libs zoffload)
 * Run:   ./a.out [swap-directory]      (default /var/tmp) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != 0) {                                                                      \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, zo_strerror(rc_),                 \
                    zo_last_error_detail());                                                 \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

enum { NG = 4, NPOS = 3, STEPS = 2 };
/* the engine's sub-groups; odd sizes on purpose (the last one is host-homed) */
static const uint64_t nelem[NG] = {1000003, 1 << 20, 257, 300007};

/* momentum SGD with bf16 state: p -= lr * (m = 0.9 m + g); v tracks g^2 */
static void update(float *p, uint16_t *m, uint16_t *v, const float *g, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        float mf = 0.9f * zo_bf16_to_f32(m[i]) + g[i];
        float vf = 0.99f * zo_bf16_to_f32(v[i]) + 0.01f * g[i] * g[i];
        m[i] = zo_f32_to_bf16(mf);
        v[i] = zo_f32_to_bf16(vf);
        p[i] -= 1e-2f * mf;
    }
}

int main(int argc, char **argv)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/zo-sweep-example.%ld", argc > 1 ? argv[1] : "/var/tmp", (long)getpid());
    if (mkdir(dir, 0700) != 0) {
        perror(dir);
        return 1;
    }
    const char *dirs[] = {dir};
    zo_swap_config sc;
    zo_swap_config_default(&sc);
    sc.dirs = dirs;
    sc.ndirs = 1;
    zo_swap *swap;
    CHECK(zo_swap_create(&swap, &sc));

    /* the host tier holds the last sub-group: exactly what it needs */
    const char *pos[NPOS] = {"master", "exp_avg", "exp_avg_sq"};
    zo_tensor_desc desc[NG][NPOS];
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NPOS; k++) {
            zo_tensor_desc_default(&desc[g][k]);
            static char names[NG][NPOS][32];
            snprintf(names[g][k], sizeof(names[g][k]), "group%d.%s", g, pos[k]);
            desc[g][k].name = names[g][k];
            desc[g][k].dtype = k ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
            desc[g][k].ndim = 1;
            desc[g][k].shape[0] = nelem[g];
            desc[g][k].home = g == NG - 1 ? ZO_TIER_HOST : ZO_TIER_NVME;
        }
    const zo_tensor_desc *host_set[NPOS] = {&desc[NG - 1][0], &desc[NG - 1][1], &desc[NG - 1][2]};
    zo_store_tier_need need;
    CHECK(zo_store_tier_bytes_needed(NULL, ZO_TIER_HOST, host_set, NPOS, &need));

    zo_store_config cfg;
    zo_store_config_default(&cfg); /* 16 slots of 4 MiB */
    cfg.host_bytes = need.exact;
    cfg.swap = swap;
    zo_store *st;
    CHECK(zo_store_create(&st, &cfg));

    /* register; master = 1, m = v = 0 (a fresh tensor reads as zeros) */
    zo_tensor *ts[NG * NPOS];
    float *ref_p[NG], *grad[NG];
    uint16_t *ref_m[NG], *ref_v[NG];
    for (int g = 0; g < NG; g++) {
        for (int k = 0; k < NPOS; k++)
            CHECK(zo_store_register(st, &desc[g][k], &ts[g * NPOS + k]));
        uint64_t n = nelem[g];
        ref_p[g] = malloc(n * sizeof(float));
        grad[g] = malloc(n * sizeof(float));
        ref_m[g] = calloc(n, sizeof(uint16_t));
        ref_v[g] = calloc(n, sizeof(uint16_t));
        if (!ref_p[g] || !grad[g] || !ref_m[g] || !ref_v[g])
            return 1;
        for (uint64_t i = 0; i < n; i++)
            ref_p[g][i] = 1.0f;
        CHECK(zo_store_write(st, ts[g * NPOS], 0, ref_p[g], n * sizeof(float)));
    }

    zo_store_sweep_desc d;
    zo_store_sweep_desc_default(&d); /* every position READ|WRITE, depth 2 */
    d.ntensors = NPOS;
    d.ngroups = NG;
    d.tensors = ts;
    for (int step = 0; step < STEPS; step++) {
        for (int g = 0; g < NG; g++) /* the gradients: caller memory */
            for (uint64_t i = 0; i < nelem[g]; i++)
                grad[g][i] = 1e-3f * (float)((i * 7 + (uint64_t)g + (uint64_t)step) % 11) - 5e-3f;
        zo_store_sweep *sw;
        CHECK(zo_store_sweep_open(st, &d, &sw));
        zo_store_sweep_piece pc;
        int rc;
        while ((rc = zo_store_sweep_next(sw, &pc)) == 0 && pc.nelem) {
            update(pc.ptr[0], pc.ptr[1], pc.ptr[2], grad[pc.group] + pc.elem_off, pc.nelem);
            CHECK(zo_store_sweep_done(sw, &pc));
        }
        if (step == 0) {
            zo_store_sweep_info info;
            CHECK(zo_store_sweep_get_info(sw, &info));
            printf("sweep: %llu pieces of up to %llu elements, %u slots reserved, %u frames\n",
                   (unsigned long long)info.pieces, (unsigned long long)info.piece_elems, info.slots, info.frames);
        }
        int rc2 = zo_store_sweep_close(&sw);
        CHECK(rc);
        CHECK(rc2);
        for (int g = 0; g < NG; g++)
            update(ref_p[g], ref_m[g], ref_v[g], grad[g], nelem[g]);
    }

    /* every byte of every tensor, against the plain arrays */
    int bad = 0;
    for (int g = 0; g < NG; g++) {
        uint64_t n = nelem[g];
        void *got = malloc(n * sizeof(float));
        const void *want[NPOS] = {ref_p[g], ref_m[g], ref_v[g]};
        for (int k = 0; k < NPOS; k++) {
            size_t bytes = n * (k ? 2 : 4);
            CHECK(zo_store_read(st, ts[g * NPOS + k], 0, got, bytes));
            if (memcmp(got, want[k], bytes) != 0) {
                fprintf(stderr, "group %d %s differs\n", g, pos[k]);
                bad = 1;
            }
        }
        free(got);
        free(ref_p[g]);
        free(grad[g]);
        free(ref_m[g]);
        free(ref_v[g]);
    }
    zo_store_destroy(&st);
    zo_swap_destroy(&swap);
    rmdir(dir);
    printf("%s: %d steps over %d sub-groups (fp32 master, bf16 m and v)\n", bad ? "FAILED" : "ok", STEPS, NG);
    return bad;
}
