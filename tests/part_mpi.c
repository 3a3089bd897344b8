/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The partitioned engine under mpirun, with the MPI comm of
 * <zoffload/comm_mpi.h>: every rank trains the same model on its own
 * gradients, and its parameters after each step must equal those of a
 * single-rank zo_optim fed the ranks' mean gradient (summed in rank order,
 * divided by the world size, in fp32; the comm's ordered reduce-scatter
 * sums in that order too). The engine's global norm adds per-rank partial
 * sums, the reference's its own sub-groups: with 2 ranks that grouping
 * leaves the parameters bit for bit equal here; with more the norm may
 * differ in its last bits, and the parameters are checked to 1e-6
 * relative. (zo-train --verify under mpirun mirrors the grouping and is
 * bit for bit at any world size.)
 * Run: mpirun -np N part_mpi [host|nvme] (nvme: states in a fresh directory
 * under /var/tmp, one subdirectory per rank and per reference, removed at
 * the end).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zoffload/zoffload.h>
#include <zoffload/comm_mpi.h>

#define NT 4
#define STEPS 5
static const uint64_t numel[NT] = {1000, 70001, 33, 4099}; /* groups: {0, 1, 2}, {3} */

static int rank_, world_;

#define FAIL(...)                                                                                          \
    do {                                                                                                   \
        fprintf(stderr, "part_mpi rank %d: ", rank_);                                                      \
        fprintf(stderr, __VA_ARGS__);                                                                      \
        fprintf(stderr, "\n");                                                                             \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                                      \
    } while (0)

static float grad_of(int r, int step, int t, uint64_t i)
{
    return 0.05f * sinf(0.013f * (float)i + (float)step + 0.7f * (float)r + (float)t) + 0.01f * (float)(r - 1);
}

static void config(zo_optim_config *cfg, zo_optim_group grp[2], zo_cpuadam_hparams *hp, zo_dev *dev, float **params,
                   const char *nvme_dir)
{
    zo_optim_config_default(cfg);
    cfg->dev = dev;
    cfg->param_dtype = ZO_DTYPE_F32;
    cfg->grad_dtype = ZO_DTYPE_F32;
    cfg->sub_group_size = 16384; /* several sub-groups per shard */
    cfg->max_grad_norm = 0.5;    /* the global norm: clipping engages */
    cfg->nthreads = 1;
    if (nvme_dir) {
        cfg->placement = ZO_OPTIM_PLACE_NVME;
        cfg->nvme_path = nvme_dir;
    }
    zo_cpuadam_hparams_default(hp, ZO_OPTIM_ADAMW);
    hp->lr = 1e-2;
    hp->weight_decay = 0.1;
    cfg->hparams = *hp;
    for (int g = 0; g < 2; g++) {
        zo_optim_group_default(&grp[g]);
        grp[g].ntensors = g ? 1 : 3;
        grp[g].numel = numel + (g ? 3 : 0);
        grp[g].dev_params = (void **)params + (g ? 3 : 0);
    }
    cfg->groups = grp;
    cfg->ngroups = 2;
}

static float **alloc_params(void)
{
    float **p = calloc(NT, sizeof(*p));
    for (int t = 0; t < NT; t++) {
        p[t] = malloc(numel[t] * sizeof(float));
        for (uint64_t i = 0; i < numel[t]; i++)
            p[t][i] = 0.1f * cosf(0.007f * (float)i + (float)t);
    }
    return p;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
    char root[256] = "";
    const char *nvme_dir = NULL;
    if (argc > 1 && !strcmp(argv[1], "nvme")) {
        if (rank_ == 0) {
            strcpy(root, "/var/tmp/zo-part-mpi-XXXXXX");
            if (!mkdtemp(root))
                FAIL("mkdtemp %s", root);
        }
        MPI_Bcast(root, sizeof(root), MPI_CHAR, 0, MPI_COMM_WORLD);
        nvme_dir = root;
    }
    char mydir[512] = "";
    if (nvme_dir) { /* each rank its own swap files */
        snprintf(mydir, sizeof(mydir), "%s/rank%d", nvme_dir, rank_);
        mkdir(mydir, 0700);
    }
    zo_dev *dev;
    if (zo_dev_open(&dev, NULL) < 0)
        FAIL("zo_dev_open: %s", zo_last_error_detail());
    zo_comm comm;
    zo_comm_mpi mc;
    if (zo_comm_mpi_init(&comm, &mc, MPI_COMM_WORLD) < 0)
        FAIL("zo_comm_mpi_init");

    /* this rank's partitioned engine */
    float **mine = alloc_params();
    zo_optim_config cfg;
    zo_optim_group grp[2];
    zo_cpuadam_hparams hp;
    config(&cfg, grp, &hp, dev, mine, nvme_dir ? mydir : NULL);
    zo_part_config pc;
    zo_part_config_default(&pc);
    pc.optim = &cfg;
    pc.comm = &comm;
    pc.bucket_bytes = 64 << 10; /* several buckets: reduced while "backward" goes on */
    zo_part *part;
    int rc = zo_part_create(&part, &pc);
    if (rc < 0)
        FAIL("zo_part_create: %s (%s)", zo_strerror(rc), zo_last_error_detail());
    if ((rc = zo_part_init_from_device(part)) < 0)
        FAIL("zo_part_init_from_device: %s (%s)", zo_strerror(rc), zo_part_errmsg(part));

    /* the single-rank reference, fed the mean gradient */
    float **ref = alloc_params();
    zo_optim_config rcfg;
    zo_optim_group rgrp[2];
    zo_cpuadam_hparams rhp;
    char refdir[512] = "";
    if (nvme_dir) {
        snprintf(refdir, sizeof(refdir), "%s/ref%d", nvme_dir, rank_);
        mkdir(refdir, 0700);
    }
    config(&rcfg, rgrp, &rhp, dev, ref, nvme_dir ? refdir : NULL);
    zo_optim *o;
    if ((rc = zo_optim_create(&o, &rcfg)) < 0 || (rc = zo_optim_init_from_device(o)) < 0)
        FAIL("reference engine: %s (%s)", zo_strerror(rc), zo_last_error_detail());

    float **g = calloc(NT, sizeof(*g)), **gm = calloc(NT, sizeof(*gm));
    for (int t = 0; t < NT; t++) {
        g[t] = malloc(numel[t] * sizeof(float));
        gm[t] = malloc(numel[t] * sizeof(float));
    }
    for (int s = 1; s <= STEPS; s++) {
        for (int t = NT - 1; t >= 0; t--) { /* backward order */
            for (uint64_t i = 0; i < numel[t]; i++) {
                g[t][i] = grad_of(rank_, s, t, i);
                float sum = 0;
                for (int r = 0; r < world_; r++)
                    sum += grad_of(r, s, t, i);
                gm[t][i] = sum / (float)world_;
            }
            if ((rc = zo_part_grad(part, (unsigned)t, g[t], NULL)) < 0)
                FAIL("zo_part_grad: %s (%s)", zo_strerror(rc), zo_part_errmsg(part));
            if ((rc = zo_optim_grad(o, (unsigned)t, gm[t], NULL)) < 0)
                FAIL("zo_optim_grad: %s", zo_strerror(rc));
        }
        zo_optim_step_result pr = {.struct_size = sizeof(pr)}, rr = {.struct_size = sizeof(rr)};
        if ((rc = zo_part_step(part, &pr)) < 0)
            FAIL("zo_part_step: %s (%s)", zo_strerror(rc), zo_part_errmsg(part));
        if ((rc = zo_optim_step(o, NULL, &rr)) < 0)
            FAIL("reference step: %s", zo_strerror(rc));
        if (!rr.clipped)
            FAIL("step %d: the reference did not clip: the test would not check the global norm", s);
        double tol = world_ == 2 ? 0 : 1e-6;
        if (fabs(pr.grad_norm - rr.grad_norm) > (world_ == 2 ? 1e-12 : 1e-6) * rr.grad_norm)
            FAIL("step %d: global norm %.17g, reference %.17g", s, pr.grad_norm, rr.grad_norm);
        for (int t = 0; t < NT; t++)
            for (uint64_t i = 0; i < numel[t]; i++) {
                float a = mine[t][i], b = ref[t][i];
                if (tol == 0 ? memcmp(&a, &b, 4) != 0 : fabsf(a - b) > tol * fmaxf(1.0f, fabsf(b)))
                    FAIL("step %d tensor %d element %llu: %.9g, the single-rank engine %.9g", s, t,
                         (unsigned long long)i, a, b);
            }
    }
    /* each rank holds its shard's states: about 1/world of the single-rank engine's */
    zo_part_info pi = {.struct_size = sizeof(pi)};
    zo_optim_info ri = {.struct_size = sizeof(ri)};
    if (zo_part_get_info(part, &pi) < 0 || zo_optim_get_info(o, &ri) < 0)
        FAIL("info");
    uint64_t total = 0;
    for (int t = 0; t < NT; t++)
        total += numel[t];
    if (pi.numel != total || pi.shard_numel > total / (uint64_t)world_ + 4 || pi.reduce_scatters == 0 ||
        pi.buckets_in_grad == 0)
        FAIL("info: numel %llu shard %llu reduce-scatters %llu (in grad %llu)", (unsigned long long)pi.numel,
             (unsigned long long)pi.shard_numel, (unsigned long long)pi.reduce_scatters,
             (unsigned long long)pi.buckets_in_grad);
    uint64_t states = pi.state_host_bytes + pi.state_nvme_bytes;
    if (rank_ == 0)
        printf("part_mpi: %d ranks, %s: parameters equal the single-rank engine's after %d steps (%s); states "
               "per rank %llu bytes (%llu elements of %llu), %llu reduce-scatters (%llu during backward)\n",
               world_, nvme_dir ? "NVMe" : "host", STEPS, world_ == 2 ? "bit for bit" : "to 1e-6",
               (unsigned long long)states, (unsigned long long)pi.shard_numel, (unsigned long long)total,
               (unsigned long long)pi.reduce_scatters, (unsigned long long)pi.buckets_in_grad);
    /* against the single-rank engine's (zo_optim_estimate): host placement
     * rounds each array to 4 KiB, so a rank holds 1/world of it up to that
     * rounding; NVMe rounds each array to 1 MiB, which at this model's size
     * is most of the bytes, so there a rank only holds less */
    zo_optim_footprint sf = {.struct_size = sizeof(sf)};
    if ((rc = zo_optim_estimate(&rcfg, -1, &sf)) < 0)
        FAIL("zo_optim_estimate: %s", zo_strerror(rc));
    uint64_t single = sf.host_state_bytes + sf.nvme_state_bytes;
    if (nvme_dir ? states >= single : states > single / (uint64_t)world_ + 2 * 3 * 4096)
        FAIL("states per rank %llu bytes, the single-rank engine's %llu: not a 1/%d share",
             (unsigned long long)states, (unsigned long long)single, world_);
    if (rank_ == 0)
        printf("part_mpi: the single-rank engine's states: %llu bytes\n", (unsigned long long)single);
    zo_optim_destroy(&o);
    zo_part_destroy(&part);
    for (int t = 0; t < NT; t++) {
        free(mine[t]);
        free(ref[t]);
        free(g[t]);
        free(gm[t]);
    }
    free(mine);
    free(ref);
    free(g);
    free(gm);
    zo_comm_mpi_free(&mc);
    zo_dev_close(&dev);
    if (nvme_dir) { /* the engines removed their swap files */
        if (rmdir(mydir) < 0 || rmdir(refdir) < 0)
            FAIL("%s or %s not empty after the engines: swap files left behind", mydir, refdir);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank_ == 0)
            rmdir(root);
    }
    MPI_Finalize();
    return 0;
}
