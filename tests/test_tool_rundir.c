/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tools' private run directories (tools/tool_common.c,
 * zo_tool_rundir_*): what a run killed with SIGKILL leaves behind is
 * reclaimed by the next run, and nothing else ever is: a live run's
 * directory, a directory named like one but not marked, a symlink, another
 * user's directory, a marked one whose owner (pid, boot, start time) still
 * runs. A reused pid does not pass for the owner.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tool_common.h"
#include "zo_test.h"

#define PROG "zo-test-run"

static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* A child makes a run directory and reports its path; then it exits
 * without removing it (stale = 1) or waits to be killed (stale = 0). */
static pid_t child_rundir(const char *parent, int stale, char *path, size_t len)
{
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        zo_tool_rundir d;
        char why[256];
        if (zo_tool_rundir_make(&d, PROG, parent, why, sizeof(why)) < 0)
            _exit(3);
        if (write(pfd[1], d.path, strlen(d.path) + 1) < 0)
            _exit(4);
        close(pfd[1]);
        if (stale)
            _exit(0); /* as SIGKILL would: nothing removed */
        pause();
        _exit(0);
    }
    close(pfd[1]);
    ssize_t n = read(pfd[0], path, len);
    close(pfd[0]);
    ck_assert_int_gt(n, 0);
    if (stale) {
        int st;
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    return pid;
}

/* A stale run directory in parent: made by a child that exits, in a
 * staging directory of its own (a run reclaims the stale directories of its
 * parent as it starts), then moved into parent. */
static void stale_rundir(const char *base, const char *parent, char *path, size_t len)
{
    static int k;
    char stage[400], made[600];
    snprintf(stage, sizeof(stage), "%s/stage%d", base, k++);
    ck_assert_int_eq(mkdir(stage, 0700), 0);
    child_rundir(stage, 1, made, sizeof(made));
    snprintf(path, len, "%s/%s", parent, strrchr(made, '/') + 1);
    ck_assert_int_eq(rename(made, path), 0);
    ck_assert_int_eq(rmdir(stage), 0);
}

static void write_text(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void field(const char *path, const char *key, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char text[256];
    ck_assert_ptr_nonnull(fgets(text, sizeof(text), f));
    fclose(f);
    const char *p = strstr(text, key);
    ck_assert_ptr_nonnull(p);
    snprintf(out, len, "%s", p + strlen(key));
    out[strcspn(out, " \n")] = 0;
}

START_TEST(test_rundir_reclaim)
{
    char base[256], parent[300], other[300];
    zo_test_mkdtemp(base, sizeof(base));
    zo_test_subdir(parent, sizeof(parent), base, "p");
    zo_test_subdir(other, sizeof(other), base, "other");

    /* a live run and a run that died (SIGKILL-like: no cleanup) */
    char live[600], dead[600], reused[600], owner_live[600], foreign[600], far[600], p[900];
    pid_t lpid = child_rundir(parent, 0, live, sizeof(live));
    stale_rundir(base, parent, dead, sizeof(dead));
    /* the dead run's files: an arena, a subdirectory, and a symlink to a
     * file outside that must survive */
    char outside[400];
    snprintf(outside, sizeof(outside), "%s/keep.dat", other);
    FILE *f = fopen(outside, "w");
    ck_assert_ptr_nonnull(f);
    fputs("outside", f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/zo-swap.1.0.0", dead);
    f = fopen(p, "w");
    fputs("arena", f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/tiles", dead);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/tiles/zo-swap.1.1.0", dead);
    f = fopen(p, "w");
    fputs("tile", f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/link", dead);
    ck_assert_int_eq(symlink(outside, p), 0);

    /* a dead run whose pid is now a live process's (this one): its boot and
     * start time say it is not that process, so it is stale */
    stale_rundir(base, parent, reused, sizeof(reused));
    char mark[700], boot[64], start[64], text[256];
    snprintf(mark, sizeof(mark), "%s/.zo-run-owner", reused);
    field(mark, "boot ", boot, sizeof(boot));
    snprintf(text, sizeof(text), PROG " pid %ld boot %s start 1\n", (long)getpid(), boot);
    write_text(mark, text);
    /* a marked directory whose lock is free but whose owner is this very
     * process (same pid, boot and start time): left alone */
    stale_rundir(base, parent, owner_live, sizeof(owner_live));
    char mymark[700];
    {
        zo_tool_rundir me;
        char why[256];
        ck_assert_int_eq(zo_tool_rundir_make(&me, "zo-test-self", base, why, sizeof(why)), 0);
        snprintf(mymark, sizeof(mymark), "%s/.zo-run-owner", me.path);
        field(mymark, "start ", start, sizeof(start));
        zo_tool_rundir_remove(&me);
        ck_assert(!exists(me.path));
    }
    snprintf(mark, sizeof(mark), "%s/.zo-run-owner", owner_live);
    snprintf(text, sizeof(text), PROG " pid %ld boot %s start %s\n", (long)getpid(), boot, start);
    write_text(mark, text);
    /* named like ours but unmarked */
    char unmarked[400];
    snprintf(unmarked, sizeof(unmarked), "%s/" PROG "-abcdef", parent);
    ck_assert_int_eq(mkdir(unmarked, 0700), 0);
    /* a symlink named like ours to a stale run directory elsewhere */
    stale_rundir(base, other, far, sizeof(far));
    char link[400];
    snprintf(link, sizeof(link), "%s/" PROG "-lnk123", parent);
    ck_assert_int_eq(symlink(far, link), 0);
    /* another user's stale directory (root only can make one) */
    foreign[0] = 0;
    if (geteuid() == 0) {
        stale_rundir(base, parent, foreign, sizeof(foreign));
        snprintf(mark, sizeof(mark), "%s/.zo-run-owner", foreign);
        ck_assert_int_eq(chown(mark, 65534, 65534), 0);
        ck_assert_int_eq(chown(foreign, 65534, 65534), 0);
    } else {
        fprintf(stderr, "not root: the foreign-user case is not tried\n");
    }

    uint64_t bytes = 0;
    int n = zo_tool_rundir_reclaim(PROG, parent, &bytes);
    ck_assert_int_eq(n, 2);
    ck_assert_uint_gt(bytes, 0);
    ck_assert_msg(!exists(dead) && !exists(reused), "the stale directories are still there");
    ck_assert_msg(exists(live), "a live run's directory was removed");
    snprintf(p, sizeof(p), "%s/.zo-run-owner", live);
    ck_assert(exists(p));
    ck_assert_msg(exists(owner_live), "a directory whose owner runs was removed");
    ck_assert(exists(unmarked));
    ck_assert(exists(link) && exists(far));
    snprintf(p, sizeof(p), "%s/.zo-run-owner", far);
    ck_assert_msg(exists(p), "the symlink was followed");
    ck_assert_msg(exists(outside), "a file outside was removed through a symlink");
    if (foreign[0]) {
        snprintf(p, sizeof(p), "%s/.zo-run-owner", foreign);
        ck_assert_msg(exists(p), "another user's directory was touched");
    }

    /* once the live run is killed, the next run reclaims its directory too */
    ck_assert_int_eq(kill(lpid, SIGKILL), 0);
    int st;
    ck_assert_int_eq(waitpid(lpid, &st, 0), lpid);
    zo_tool_rundir d;
    char why[256];
    ck_assert_int_eq(zo_tool_rundir_make(&d, PROG, parent, why, sizeof(why)), 0);
    ck_assert(!exists(live));
    ck_assert(exists(d.path) && exists(owner_live) && exists(unmarked));
    zo_tool_rundir_remove(&d);
    ck_assert_str_eq(d.path, "");
    zo_test_rmtree(base);
}
END_TEST

int main(void)
{
    TCase *tc;
    Suite *s = zo_test_suite1("tool_rundir", &tc, 60);
    tcase_add_test(tc, test_rundir_reclaim);
    return zo_test_run(s);
}
