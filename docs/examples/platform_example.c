/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A complete program using the platform and device layers: pinned host
 * memory registered with a device, asynchronous copies on a stream, a cast
 * kernel, an overflow check, events, and error handling. Built and run by
 * the test suite (so this example cannot rot), and quoted in docs/api.md.
 *
 *   cc platform_example.c $(pkg-config --cflags --libs zoffload) -o example
 *   ./example            # host backend
 *   ./example cuda       # CUDA backend, if this machine has a GPU
 */
#include <stdio.h>
#include <string.h>

#include <zoffload/zoffload.h>

/* Print a failed call with its code and the library's detail, then bail. */
#define TRY(call)                                                                  \
    do {                                                                           \
        int rc_ = (call);                                                          \
        if (rc_ < 0) {                                                             \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, zo_strerror(rc_),       \
                    zo_last_error_detail());                                       \
            goto out;                                                              \
        }                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    const size_t n = 1 << 20; /* one million parameters */
    int status = 1;
    zo_dev *dev = NULL;
    zo_stream *stream = NULL;
    zo_event *done = NULL;
    float *host_f32 = NULL;
    uint16_t *host_bf16 = NULL;
    void *dev_f32 = NULL, *dev_bf16 = NULL, *dev_flag = NULL;
    int flag = 0;

    /* 1. Open a device: the host backend always works; "cuda" needs a GPU. */
    zo_dev_config cfg;
    zo_dev_config_default(&cfg);
    if (argc > 1 && zo_dev_kind_parse(argv[1], &cfg.kind) != 0) {
        fprintf(stderr, "unknown backend '%s' (host, cuda)\n", argv[1]);
        return 2;
    }
    char why[256];
    if (zo_dev_probe(cfg.kind, NULL, why, sizeof(why)) != 0) {
        fprintf(stderr, "backend %s unavailable: %s\n", zo_dev_kind_name(cfg.kind), why);
        return 77;
    }
    TRY(zo_dev_open(&dev, &cfg));

    /* 2. Pinned host buffers, registered with the device so copies are DMA.
     *    If the OS refuses to lock (RLIMIT_MEMLOCK), this still succeeds with
     *    pageable memory and says so in the log. */
    zo_pin_opts pin;
    zo_pin_opts_default(&pin);
    pin.dev = dev;
    TRY(zo_pinned_alloc((void **)&host_f32, n * sizeof(float), &pin));
    TRY(zo_pinned_alloc((void **)&host_bf16, n * sizeof(uint16_t), &pin));
    for (size_t i = 0; i < n; i++)
        host_f32[i] = (float)i * 0.001f;

    /* 3. Device buffers and a stream. */
    TRY(zo_dev_malloc(dev, &dev_f32, n * sizeof(float)));
    TRY(zo_dev_malloc(dev, &dev_bf16, n * sizeof(uint16_t)));
    TRY(zo_dev_malloc(dev, &dev_flag, sizeof(int)));
    TRY(zo_stream_create(dev, &stream));
    TRY(zo_event_create(dev, &done));

    /* 4. Queue: upload fp32, cast to bf16 on the device, check for inf/NaN,
     *    download. Nothing blocks until the event sync. */
    TRY(zo_memcpy_async(stream, dev_f32, host_f32, n * sizeof(float), ZO_COPY_H2D));
    TRY(zo_dev_cast(stream, dev_bf16, ZO_DTYPE_BF16, dev_f32, ZO_DTYPE_F32, n));
    TRY(zo_memset_async(stream, dev_flag, 0, sizeof(int)));
    TRY(zo_dev_nonfinite(stream, dev_f32, ZO_DTYPE_F32, n, dev_flag));
    TRY(zo_memcpy_async(stream, host_bf16, dev_bf16, n * sizeof(uint16_t), ZO_COPY_D2H));
    TRY(zo_memcpy_async(stream, &flag, dev_flag, sizeof(int), ZO_COPY_D2H));
    TRY(zo_event_record(done, stream));
    TRY(zo_event_sync(done)); /* errors of queued work would be returned here */

    /* 5. Check against the host reference conversion. */
    for (size_t i = 0; i < n; i++) {
        if (host_bf16[i] != zo_f32_to_bf16(host_f32[i])) {
            fprintf(stderr, "mismatch at %zu\n", i);
            goto out;
        }
    }
    printf("%zu values cast to bf16 on the %s backend (vec kernels: %s), inf/NaN found: %s\n", n,
           zo_dev_kind_name(cfg.kind), zo_vec_variant(), flag ? "yes" : "no");
    status = 0;

out:
    /* 6. Tear down in reverse order; every destroy accepts NULL. */
    zo_event_destroy(&done);
    zo_stream_destroy(&stream);
    if (dev) {
        zo_dev_free(dev, dev_f32);
        zo_dev_free(dev, dev_bf16);
        zo_dev_free(dev, dev_flag);
    }
    zo_pinned_free(host_f32);
    zo_pinned_free(host_bf16);
    zo_dev_close(&dev);
    return status;
}
