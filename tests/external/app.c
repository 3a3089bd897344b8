/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A program written the way a user's would be, built by tests/external_link.sh
 * against the *installed* library through pkg-config, shared and static.
 * It checks what linking must not do (issue 21): start threads when the
 * library loads, or load OpenBLAS (whose pthread build starts ncpu - 1
 * threads) before the program asks for a GEMM.
 *
 * usage: app [expect-openblas]   exit 0 ok, 1 a check failed
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/zoffload.h>

static int threads(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int blas_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int hit = 0;
    if (!f)
        return -1;
    while (!hit && fgets(line, sizeof(line), f))
        hit = strstr(line, "libopenblas") != NULL;
    fclose(f);
    return hit;
}

#define CHECK(cond, ...)                                 \
    do {                                                 \
        if (!(cond)) {                                   \
            fprintf(stderr, "app: FAIL: " __VA_ARGS__);  \
            fprintf(stderr, "\n");                       \
            return 1;                                    \
        }                                                \
    } while (0)

int main(int argc, char **argv)
{
    int expect_blas = argc > 1 && strcmp(argv[1], "expect-openblas") == 0;
    int t0 = threads();
    CHECK(t0 == 1, "%d threads at main(): the library started threads when it loaded", t0);
    CHECK(blas_mapped() == 0, "OpenBLAS is loaded before any GEMM");
    printf("app: zoffload %s, cpu kernels %s\n", zo_version_string(), zo_cpuadam_variant());

    /* the optimizer alone, on one thread: no BLAS */
    enum { N = 1000 };
    static float p[N], g[N], m[N], v[N];
    for (int i = 0; i < N; i++) {
        p[i] = 1.0f;
        g[i] = (float)(i % 7) - 3.0f;
    }
    zo_cpuadam_hparams hp;
    CHECK(zo_cpuadam_hparams_default(&hp, ZO_OPTIM_ADAMW) == 0, "hparams");
    hp.step = 1;
    zo_cpuadam_tensors t;
    zo_cpuadam_tensors_default(&t);
    t.n = N;
    t.param = p;
    t.grad = g;
    t.exp_avg = m;
    t.exp_avg_sq = v;
    int r = zo_cpuadam_step(&hp, &t, 1);
    CHECK(r == 0, "zo_cpuadam_step: %s", zo_strerror(r));
    /* Adam's first step moves each parameter by about lr against its
     * gradient's sign: g[0] = -3 up, g[4] = 1 down */
    CHECK(p[0] > 1.0f && p[0] < 1.0f + 2 * hp.lr && p[4] < 1.0f && p[4] > 1.0f - 2 * hp.lr,
          "update: p[0] = %g, p[4] = %g", p[0], p[4]);
    CHECK(blas_mapped() == 0, "OpenBLAS loaded by the optimizer");
    printf("app: optimizer step ok, %d thread(s), OpenBLAS not loaded\n", threads());

    /* a GEMM on the host backend: now (and only now) BLAS may load */
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    zo_dev *dev = NULL;
    CHECK(zo_dev_open(&dev, &dc) == 0, "zo_dev_open: %s", zo_last_error_detail());
    zo_stream *s = NULL;
    CHECK(zo_stream_create(dev, &s) == 0, "zo_stream_create");
    float a[4 * 3], b[3 * 2], c[4 * 2];
    for (int i = 0; i < 12; i++)
        a[i] = (float)i;
    for (int i = 0; i < 6; i++)
        b[i] = (float)(i + 1);
    r = zo_gemm_async(s, ZO_GEMM_N, ZO_GEMM_N, 4, 2, 3, 1.0f, a, 3, b, 2, ZO_DTYPE_F32, 0.0f, c, 2);
    CHECK(r == 0, "zo_gemm_async: %s", zo_strerror(r));
    CHECK(zo_stream_sync(s) == 0, "sync");
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) {
            float want = 0;
            for (int k = 0; k < 3; k++)
                want += a[i * 3 + k] * b[k * 2 + j];
            CHECK(fabsf(c[i * 2 + j] - want) < 1e-4f, "C[%d][%d] = %g, want %g", i, j, c[i * 2 + j], want);
        }
    const char *impl = zo_gemm_impl(ZO_DEV_HOST);
    printf("app: GEMM ok (%s), %d threads, OpenBLAS %s\n", impl, threads(), blas_mapped() ? "loaded" : "not loaded");
    if (expect_blas)
        CHECK(blas_mapped() == 1 && strncmp(impl, "openblas", 8) == 0, "a build with OpenBLAS did not use it: %s", impl);
    zo_stream_destroy(&s);
    zo_dev_close(&dev);
    return 0;
}
