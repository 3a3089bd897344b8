/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Probing a device backend from a test program without initialising it in
 * the parent process.
 *
 * Check runs every test in a forked child. The CUDA driver cannot be used in
 * a child forked after the parent initialised it (cudaSetDevice fails with
 * cudaErrorInitializationError), so a probe in main() would fail every test
 * that follows. zo_test_probe_dev() runs zo_dev_probe() in a child of its
 * own and hands back its answer; the parent never touches the driver. The
 * H200 run of 2026-11-27 found this: dev-cuda, store-cuda and tiling-cuda
 * failed every test at zo_dev_open().
 */
#ifndef ZO_TEST_DEV_H
#define ZO_TEST_DEV_H

#include "zo_test.h"

#include <sys/wait.h>

#include <zoffload/dev.h>

/* zo_dev_probe(kind, ndev, why, why_len), run in a forked child. Where the
 * fork itself fails, the probe runs here and the tests run without fork
 * (CK_FORK=no) so that they still see a usable driver. */
static inline int zo_test_probe_dev(zo_dev_kind kind, int *ndev, char *why, size_t why_len)
{
    struct {
        int rc, n;
        char why[256];
    } ans;
    int fds[2];
    pid_t pid = -1;
    if (pipe(fds) == 0) {
        pid = fork();
        if (pid < 0) {
            close(fds[0]);
            close(fds[1]);
        }
    }
    if (pid < 0) {
        setenv("CK_FORK", "no", 1);
        return zo_dev_probe(kind, ndev, why, why_len);
    }
    if (pid == 0) {
        close(fds[0]);
        memset(&ans, 0, sizeof(ans));
        ans.rc = zo_dev_probe(kind, &ans.n, ans.why, sizeof(ans.why));
        ssize_t w = write(fds[1], &ans, sizeof(ans));
        _exit(w == (ssize_t)sizeof(ans) ? 0 : 1);
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof(ans)) {
        ssize_t r = read(fds[0], (char *)&ans + got, sizeof(ans) - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (got != sizeof(ans)) {
        if (why && why_len)
            snprintf(why, why_len, "the probe child died (%s)",
                     WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "no answer");
        return -EIO;
    }
    ans.why[sizeof(ans.why) - 1] = '\0';
    if (ndev)
        *ndev = ans.n;
    if (why && why_len)
        snprintf(why, why_len, "%s", ans.why);
    return ans.rc;
}

#endif /* ZO_TEST_DEV_H */
