/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints: the small file helpers the root, writer and reader share,
 * and the public functions of a build without libcjson (a manifest needs
 * it, so every checkpoint call then fails with ZO_ENOTSUP). The pieces
 * are ckpt_root.c (host tag, leftovers, latest), ckpt_manifest.c,
 * ckpt_write.c (the commit order) and ckpt_read.c. */
#define ZO_MODULE "ckpt"
#include "core/internal.h"
#include "nvme/nvme_internal.h"

#if ZO_HAVE_CJSON
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void zo__ckpt_tensors_free(zo__ckpt_tensor *t, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        free(t[i].name);
        free(t[i].crc);
        free(t[i].have);
    }
    free(t);
}

/* ---- small file helpers ----------------------------------------------------------- */
char *zo__ckpt_path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

int zo__ckpt_read_file(const char *path, char **out, size_t *len, size_t max)
{
    /* O_NONBLOCK: a FIFO planted under our name must be an error, not a
     * wait for a writer (no effect on a regular file) */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        int e = S_ISREG(st.st_mode) ? -EFBIG : -EINVAL;
        close(fd);
        return e;
    }
    size_t n = (size_t)st.st_size;
    char *b = malloc(n + 1);
    if (!b) {
        close(fd);
        return -ENOMEM;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? -errno : ZO_ETRUNC;
            free(b);
            close(fd);
            return e;
        }
        got += (size_t)r;
    }
    close(fd);
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* Remove a directory holding only plain files (ours: a checkpoint). The
 * name is never followed: a symlink (or other non-directory) under one of
 * our names is removed itself, so a link planted as .tmp-<x>.<dead pid>
 * cannot make us empty the directory it points to. */
int zo__ckpt_remove_flat_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ELOOP || errno == ENOTDIR)
            return unlink(path) == 0 || errno == ENOENT ? 0 : -errno;
        return -errno;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = -errno;
        close(fd);
        return e;
    }
    struct dirent *de;
    int r = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (unlinkat(dirfd(d), de->d_name, 0) != 0 && r == 0)
            r = -errno;
    }
    closedir(d);
    if (rmdir(path) != 0 && r == 0)
        r = -errno;
    return r;
}

int zo__ckpt_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > ZO_CKPT_NAME_MAX || name[0] == '.' || strcmp(name, "latest") == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

#else /* !ZO_HAVE_CJSON: checkpoints need a JSON library */

#define NO_CJSON(fn) ZO_FAIL(NULL, ZO_ENOTSUP, "%s: built without libcjson (checkpoint manifests)", fn)

ZO_API int zo_ckpt_begin(zo_ckpt_writer **out, const char *root, const char *name, const zo_ckpt_options *opts)
{
    if (out)
        *out = NULL;
    return NO_CJSON("zo_ckpt_begin");
}
ZO_API int zo_ckpt_add(zo_ckpt_writer *w, const zo_ckpt_entry *e, unsigned *index)
{
    return NO_CJSON("zo_ckpt_add");
}
ZO_API int zo_ckpt_put(zo_ckpt_writer *w, unsigned index, uint64_t off, const void *buf, size_t len)
{
    return NO_CJSON("zo_ckpt_put");
}
ZO_API int zo_ckpt_commit(zo_ckpt_writer **w)
{
    return NO_CJSON("zo_ckpt_commit");
}
ZO_API void zo_ckpt_abort(zo_ckpt_writer **w)
{
}
ZO_API int zo_ckpt_save(const char *root, const char *name, const zo_ckpt_entry *entries, const void *const *data,
                        unsigned n, const zo_ckpt_options *opts)
{
    return NO_CJSON("zo_ckpt_save");
}
ZO_API int zo_ckpt_latest(const char *root, char *buf, size_t len)
{
    return NO_CJSON("zo_ckpt_latest");
}
ZO_API int zo_ckpt_open(zo_ckpt_reader **out, const char *root, const char *name)
{
    if (out)
        *out = NULL;
    return NO_CJSON("zo_ckpt_open");
}
ZO_API void zo_ckpt_close(zo_ckpt_reader **r)
{
}
ZO_API unsigned zo_ckpt_count(const zo_ckpt_reader *r)
{
    return 0;
}
ZO_API int zo_ckpt_get_entry(const zo_ckpt_reader *r, unsigned i, zo_ckpt_entry *e)
{
    return NO_CJSON("zo_ckpt_get_entry");
}
ZO_API int zo_ckpt_find(const zo_ckpt_reader *r, const char *name, unsigned *index)
{
    return NO_CJSON("zo_ckpt_find");
}
ZO_API const char *zo_ckpt_name(const zo_ckpt_reader *r)
{
    return "";
}
ZO_API const char *zo_ckpt_library_version(const zo_ckpt_reader *r)
{
    return "";
}
ZO_API const char *zo_ckpt_user_json(const zo_ckpt_reader *r)
{
    return "";
}
ZO_API size_t zo_ckpt_chunk_size(const zo_ckpt_reader *r)
{
    return 0;
}
ZO_API int zo_ckpt_read(zo_ckpt_reader *r, unsigned i, uint64_t off, void *buf, size_t len)
{
    return NO_CJSON("zo_ckpt_read");
}
ZO_API int zo_ckpt_verify(zo_ckpt_reader *r)
{
    return NO_CJSON("zo_ckpt_verify");
}
#endif /* ZO_HAVE_CJSON */
