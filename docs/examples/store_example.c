/* SPDX-License-Identifier: Apache-2.0 */
/* The tiered store in one program (docs/store.md walks through it):
 * a swap store on NVMe, a device tier (the host backend stands in for a
 * GPU with 64 MiB), a pinned host tier and a slot pool; four "layers" whose
 * weights live on NVMe (more than the device tier holds) are acquired on the
 * device in a loop that the store learns and prefetches; an optimizer-style stream updates a state tensor
 * piece by piece; a checkpoint is written and restored.
 *
 * Build: cc store_example.c $(pkg-config --cflags --libs zoffload)
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

int main(int argc, char **argv)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/zo-store-example.%ld", argc > 1 ? argv[1] : "/var/tmp", (long)getpid());
    if (mkdir(dir, 0700) != 0) {
        perror(dir);
        return 1;
    }

    /* 1. the NVMe tier: a swap store (arena files in dir, CRC32C per MiB) */
    const char *dirs[] = {dir};
    zo_swap_config sc;
    zo_swap_config_default(&sc);
    sc.dirs = dirs;
    sc.ndirs = 1;
    zo_swap *swap;
    CHECK(zo_swap_create(&swap, &sc));

    /* 2. a device (host backend: a 64 MiB "GPU") and the store */
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.host_mem_limit = 64u << 20;
    zo_dev *dev;
    CHECK(zo_dev_open(&dev, &dc));
    zo_store_config cfg;
    zo_store_config_default(&cfg);
    cfg.dev = dev;
    cfg.device_bytes = 24u << 20; /* device tier budget: three of the four layers */
    cfg.prefetch_bytes = 16u << 20; /* up to two layers loaded ahead */
    cfg.host_bytes = 16u << 20;   /* pinned host tier budget */
    cfg.swap = swap;
    cfg.slot_size = 4u << 20; /* pool: 8 x 4 MiB pinned slots */
    cfg.slots = 8;
    zo_store *st;
    CHECK(zo_store_create(&st, &cfg));

    /* 3. tensors: four layers' weights and one optimizer state, home NVMe */
    enum { L = 4 };
    zo_tensor *w[L], *m;
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    d.dtype = ZO_DTYPE_F32;
    d.ndim = 2;
    d.shape[0] = 1024;
    d.shape[1] = 2048; /* 8 MiB each */
    size_t n = 1024 * 2048;
    float *init = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        init[i] = (float)(i % 1000) * 0.001f;
    for (int l = 0; l < L; l++) {
        char name[32];
        snprintf(name, sizeof(name), "layer%d.weight", l);
        d.name = name; /* copied */
        CHECK(zo_store_register(st, &d, &w[l]));
        CHECK(zo_store_write(st, w[l], 0, init, n * sizeof(float)));
    }
    d.name = "layer0.exp_avg";
    CHECK(zo_store_register(st, &d, &m));

    /* 4. a training loop: acquire each layer on the device, use it,
     *    release; zo_store_step() marks iterations, so from the second one
     *    on the store prefetches the next layer while this one computes */
    for (int step = 0; step < 4; step++) {
        for (int l = 0; l < L; l++) {
            zo_store_req *req;
            void *p;
            CHECK(zo_store_acquire(st, w[l], ZO_TIER_DEVICE, 0, &req));
            CHECK(zo_store_wait(st, req, &p)); /* a device pointer */
            if (((float *)p)[999] != init[999]) {
                fprintf(stderr, "unexpected contents\n");
                return 1;
            }
            usleep(20000); /* the layer's compute */
            CHECK(zo_store_release(st, w[l], ZO_TIER_DEVICE, 0));
        }
        CHECK(zo_store_step(st));
    }

    /* 5. an optimizer-style pass: stream the state through pinned slots,
     *    two pieces read ahead, each piece written back behind */
    zo_store_stream *s;
    CHECK(zo_store_stream_open(st, m, ZO_STREAM_READ | ZO_STREAM_WRITE, 2, &s));
    zo_store_piece pc;
    while (zo_store_stream_next(s, &pc) == 0 && pc.len) {
        float *f = pc.host;
        for (size_t i = 0; i < pc.len / sizeof(float); i++)
            f[i] = 0.9f * f[i] + 0.1f; /* exp_avg = 0.9 exp_avg + 0.1 g, g = 1 */
        CHECK(zo_store_stream_done(s, &pc));
    }
    CHECK(zo_store_stream_close(&s));

    /* 6. a checkpoint of everything, wherever it lives, and a restore */
    char root[600];
    snprintf(root, sizeof(root), "%s/ckpt", dir);
    CHECK(zo_store_checkpoint(st, root, "step-3", NULL, 0, 2, "{\"step\": 3}"));
    float zero = 0;
    CHECK(zo_store_write(st, m, 0, &zero, sizeof(zero)));
    char *user = NULL; /* the checkpoint's user JSON comes back with it */
    CHECK(zo_store_restore2(st, root, NULL, NULL, &user));
    float first;
    CHECK(zo_store_read(st, m, 0, &first, sizeof(first)));
    printf("restored step-3, user %s\n", user);
    free(user);

    zo_store_stats stats;
    zo_store_get_stats(st, &stats);
    printf("layers loaded ahead of need: %llu; on demand: %llu; stall %.1f ms\n",
           (unsigned long long)stats.prefetch_used, (unsigned long long)stats.misses, (double)stats.stall_ns / 1e6);
    printf("exp_avg[0] = %.2f after restore (expected 0.10)\n", (double)first);
    printf("moved NVMe->device %.0f MiB, pinned %.0f MiB (host tier + pool, fixed at create)\n",
           (double)stats.moved[ZO_TIER_NVME][ZO_TIER_DEVICE] / (1 << 20), (double)stats.pinned_bytes / (1 << 20));

    zo_store_destroy(&st);
    zo_dev_close(&dev);
    zo_swap_destroy(&swap); /* removes the arena files */
    free(init);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 && first > 0.0999f && first < 0.1001f ? 0 : 1;
}
