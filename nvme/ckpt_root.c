/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints: what a root holds besides the checkpoints themselves. This
 * host's tag in temporary names, who owns a leftover and whether its
 * writer still lives (the flock on .lock; ckpt_write.c arms it), the
 * clean-up of dead writers' leftovers, and reading `latest`. */
#define ZO_MODULE "ckpt"
#include "core/internal.h"
#include "nvme/nvme_internal.h"

#if ZO_HAVE_CJSON
#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* ---- host tag and owner of our leftovers ---------------------------------------------- */
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static char host_buf[ZO__CKPT_HOST_MAX + 1];

/* The host name as it goes into our file names: no dots (they separate the
 * fields), only [A-Za-z0-9_-], at most ZO__CKPT_HOST_MAX bytes. */
static void host_init(void)
{
    char h[256] = "";
    if (gethostname(h, sizeof(h) - 1) != 0)
        h[0] = 0;
    size_t n = 0;
    for (const char *p = h; *p && n < ZO__CKPT_HOST_MAX; p++, n++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        host_buf[n] = ok ? c : '_';
    }
    host_buf[n] = 0;
    if (n == 0)
        snprintf(host_buf, sizeof(host_buf), "localhost");
}

const char *zo__ckpt_host(void)
{
    pthread_once(&host_once, host_init);
    return host_buf;
}

/* "<anything>.<host>.<pid>": is it this host's, and which pid. 0 if the name
 * has that form (names of older versions, without a host, do not). */
static int parse_owner(const char *n, int *ours, long *pid)
{
    const char *dot = strrchr(n, '.');
    if (!dot || dot == n || !dot[1])
        return -1;
    char *end;
    long p = strtol(dot + 1, &end, 10);
    if (*end || p <= 0)
        return -1;
    const char *h = dot - 1;
    while (h > n && *h != '.')
        h--;
    /* the host field needs a dot before it that is not the name's first
     * character: ".latest.<pid>" of older versions has no host */
    if (h == n || h + 1 == dot)
        return -1;
    const char *me = zo__ckpt_host();
    *ours = strlen(me) == (size_t)(dot - h - 1) && strncmp(h + 1, me, (size_t)(dot - h - 1)) == 0;
    *pid = p;
    return 0;
}

/* Is the writer of temporary directory `path` alive? ZO__CKPT_TMP_ABANDONED
 * with *lock_fd holding its lock (close it once the directory is gone),
 * ZO__CKPT_TMP_LIVE, or ZO__CKPT_TMP_NOLOCK (no lock file: the writer died
 * before arming it, or the filesystem has no flock). A link or a
 * non-directory under that name is ZO__CKPT_TMP_NOLOCK (nothing can hold
 * it). Errors other than "no lock file" count as live: when in doubt, keep
 * the data. */
int zo__ckpt_tmp_state(const char *path, int *lock_fd)
{
    *lock_fd = -1;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return errno == ELOOP || errno == ENOTDIR ? ZO__CKPT_TMP_NOLOCK : ZO__CKPT_TMP_LIVE;
    int fd = openat(dfd, ZO__CKPT_LOCK, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int e = errno;
    close(dfd);
    if (fd < 0)
        return e == ENOENT ? ZO__CKPT_TMP_NOLOCK : ZO__CKPT_TMP_LIVE;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return ZO__CKPT_TMP_LIVE;
    }
    *lock_fd = fd;
    return ZO__CKPT_TMP_ABANDONED;
}

static int pid_alive(long pid)
{
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno != ESRCH);
}

/* Remove leftovers of writers of this host that died: .tmp-<name>.<host>.<pid>
 * whose lock is free (or, without a lock file, whose pid is gone),
 * .trash-<name>.<host>.<pid> and .latest.<host>.<pid> whose pid is gone.
 * Another host's names are never touched (its own writers clean them), nor
 * names of this process (its writers are alive: see writer_claim() in
 * ckpt_write.c). */
void zo__ckpt_clean_stale(const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        int is_tmp = !strncmp(n, ".tmp-", 5), is_trash = !strncmp(n, ".trash-", 7);
        int is_latest = !strncmp(n, ".latest.", 8);
        int ours;
        long pid;
        if ((!is_tmp && !is_trash && !is_latest) || parse_owner(n, &ours, &pid) < 0 || !ours ||
            pid == (long)getpid())
            continue;
        char *p = zo__ckpt_path_join(root, n);
        if (!p)
            break;
        int lock_fd = -1, gone;
        if (is_tmp) {
            int stt = zo__ckpt_tmp_state(p, &lock_fd);
            gone = stt == ZO__CKPT_TMP_ABANDONED || (stt == ZO__CKPT_TMP_NOLOCK && !pid_alive(pid));
        } else {
            gone = !pid_alive(pid);
        }
        if (gone) {
            int r = is_latest ? (unlink(p) == 0 ? 0 : -errno) : zo__ckpt_remove_flat_dir(p);
            if (r < 0)
                ZO_LOGW("could not remove stale %s: %s", p, strerror(-r));
            else
                ZO_LOGI("removed %s left by a writer that died (pid %ld)", p, pid);
        }
        if (lock_fd >= 0)
            close(lock_fd);
        free(p);
    }
    closedir(d);
}

/* latest: "<name> <crc32c of manifest.json, 8 hex digits>\n" */
int zo__ckpt_read_latest(const char *root, char *name, size_t len, uint32_t *mcrc)
{
    char *p = zo__ckpt_path_join(root, "latest");
    if (!p)
        return -ENOMEM;
    char *buf;
    size_t n;
    int r = zo__ckpt_read_file(p, &buf, &n, 4096);
    free(p);
    if (r < 0)
        return r == -ENOENT ? ZO_FAIL(NULL, -ENOENT, "checkpoint root %s has no 'latest' yet", root)
                            : ZO_FAIL(NULL, r, "cannot read %s/latest: %s", root, zo_strerror(r));
    char nm[ZO_CKPT_NAME_MAX + 2];
    unsigned c;
    char tail;
    int ok = n > 0 && buf[n - 1] == '\n' && sscanf(buf, "%129s %8x%c", nm, &c, &tail) == 3 && tail == '\n' &&
             zo__ckpt_name_ok(nm) && strlen(buf) == n;
    free(buf);
    if (!ok)
        return ZO_FAIL(NULL, ZO_EFORMAT, "%s/latest is malformed (expected '<name> <crc32c>')", root);
    if (strlen(nm) + 1 > len)
        return -ERANGE;
    snprintf(name, len, "%s", nm);
    if (mcrc)
        *mcrc = c;
    return 0;
}

ZO_API int zo_ckpt_latest(const char *root, char *buf, size_t len)
{
    if (!root || !buf || len == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_latest: NULL argument");
    return zo__ckpt_read_latest(root, buf, len, NULL);
}
#endif /* ZO_HAVE_CJSON */
