/* SPDX-License-Identifier: Apache-2.0 */
/* Crash-safe checkpoints: data + JSON manifest written under a temporary
 * directory, fsynced, renamed into place, then `latest` replaced atomically.
 *
 * Order of a commit (each step durable before the next):
 *   1. tensors.bin complete, fdatasync
 *   2. manifest.json written, fsync
 *   3. fsync the temporary directory (its entries are on disk)
 *   4. rename .tmp-<name>.<host>.<pid> -> <name> (RENAME_NOREPLACE), fsync root
 *   5. .latest.<host>.<pid> written + fsync, rename -> latest, fsync root
 * A crash before 4 leaves a temporary directory (removed by the next
 * writer of this host) and `latest` untouched; between 4 and 5 a complete
 * checkpoint that `latest` does not name yet; after 5 the new one. A step
 * after 4 that fails takes the checkpoint back (latest restored, directory
 * renamed back and removed): a failed commit publishes nothing.
 *
 * Liveness of a temporary directory: its writer holds an flock on
 * `.lock` inside it for its whole life, so "abandoned" means "that lock
 * can be taken". Names carry the host, and clean-up never touches another
 * host's names: on a root shared between machines a pid says nothing about
 * a process elsewhere, and a lock may be local to each client (NFS mounted
 * with local_lock). */
#define ZO_MODULE "ckpt"
#include "core/internal.h"
#include "nvme/nvme_internal.h"

#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/aio.h>
#include <zoffload/mem.h>

ZO_API void zo_ckpt_options_default(zo_ckpt_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->struct_size = sizeof(*o);
    o->chunk_size = 1u << 20;
}

#if ZO_HAVE_CJSON
#include <cjson/cJSON.h>

#define CKPT_FORMAT "zoffload-checkpoint"
#define CKPT_DATA "tensors.bin"
#define CKPT_MANIFEST "manifest.json"
#define CKPT_LOCK ".lock"
#define CKPT_ALIGN 4096u
#define CKPT_MAX_MANIFEST (1ull << 30)
#define JSON_INT_MAX (1ull << 53) /* integers a JSON double holds exactly */

typedef struct ck_tensor {
    zo_ckpt_entry e;
    char *name;
    uint64_t offset, nchunks;
    uint32_t *crc;
    uint8_t *have; /* writer: chunk written */
} ck_tensor;

static void tensors_free(ck_tensor *t, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        free(t[i].name);
        free(t[i].crc);
        free(t[i].have);
    }
    free(t);
}

struct zo_ckpt_writer {
    char *root, *name, *tmpdir, *final;
    zo_ckpt_options opts;
    cJSON *user;
    zo_aio *aio, *own_aio;
    zo_file *data;
    ck_tensor *t;
    unsigned n, cap;
    uint64_t data_end;
    uint64_t sequence;
    int put_started;
    int failed;
    int registered;      /* in the active-writer list (see writer_claim()) */
    int lock_fd;         /* holds the flock on <tmpdir>/.lock (-1: none: the filesystem refused flock) */
    int tmpdir_published; /* a failed commit could not take it back: never remove it */
    dev_t root_dev;
    ino_t root_ino;
    struct zo_ckpt_writer *next_active;
};

struct zo_ckpt_reader {
    char *dir, *name, *libver, *user;
    zo_aio *aio;
    zo_file *data;
    ck_tensor *t;
    unsigned n;
    size_t chunk_size;
    uint64_t sequence;
};

/* ---- small file helpers ----------------------------------------------------------- */
static char *path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write a small file durably: create exclusively, write, fsync, close. */
static int write_file_sync(const char *path, const void *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int r = write_all(fd, buf, n);
    if (r == 0 && fsync(fd) != 0)
        r = -errno;
    if (close(fd) != 0 && r == 0)
        r = -errno;
    if (r < 0)
        unlink(path);
    return r;
}

static int read_file(const char *path, char **out, size_t *len, size_t max)
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
static int remove_flat_dir(const char *path)
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

static int name_ok(const char *name)
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

static int pid_alive(long pid)
{
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno != ESRCH);
}

/* ---- fault injection (tests) ------------------------------------------------------- */
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static zo__ckpt_fault_fn fault_fn;
static void *fault_user;

void zo__ckpt_set_fault(zo__ckpt_fault_fn fn, void *user)
{
    pthread_mutex_lock(&fault_lock);
    fault_fn = fn;
    fault_user = user;
    pthread_mutex_unlock(&fault_lock);
}

/* 0, or the error the test hook wants step `step` to fail with */
static int fault(int step)
{
    pthread_mutex_lock(&fault_lock);
    int r = fault_fn ? fault_fn(fault_user, step) : 0;
    pthread_mutex_unlock(&fault_lock);
    return r < 0 ? r : 0;
}

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

enum { TMP_LIVE = 0, TMP_ABANDONED = 1, TMP_NOLOCK = 2 };

/* Is the writer of temporary directory `path` alive? TMP_ABANDONED with
 * *lock_fd holding its lock (close it once the directory is gone),
 * TMP_LIVE, or TMP_NOLOCK (no lock file: the writer died before arming it,
 * or the filesystem has no flock). A link or a non-directory under that
 * name is TMP_NOLOCK (nothing can hold it). Errors other than "no lock
 * file" count as live: when in doubt, keep the data. */
static int tmp_state(const char *path, int *lock_fd)
{
    *lock_fd = -1;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return errno == ELOOP || errno == ENOTDIR ? TMP_NOLOCK : TMP_LIVE;
    int fd = openat(dfd, CKPT_LOCK, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int e = errno;
    close(dfd);
    if (fd < 0)
        return e == ENOENT ? TMP_NOLOCK : TMP_LIVE;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return TMP_LIVE;
    }
    *lock_fd = fd;
    return TMP_ABANDONED;
}

/* Remove leftovers of writers of this host that died: .tmp-<name>.<host>.<pid>
 * whose lock is free (or, without a lock file, whose pid is gone),
 * .trash-<name>.<host>.<pid> and .latest.<host>.<pid> whose pid is gone.
 * Another host's names are never touched (its own writers clean them), nor
 * names of this process (its writers are alive: see writer_claim()). */
static void clean_stale(const char *root)
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
        char *p = path_join(root, n);
        if (!p)
            break;
        int lock_fd = -1, gone;
        if (is_tmp) {
            int stt = tmp_state(p, &lock_fd);
            gone = stt == TMP_ABANDONED || (stt == TMP_NOLOCK && !pid_alive(pid));
        } else {
            gone = !pid_alive(pid);
        }
        if (gone) {
            int r = is_latest ? (unlink(p) == 0 ? 0 : -errno) : remove_flat_dir(p);
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
static int read_latest(const char *root, char *name, size_t len, uint32_t *mcrc)
{
    char *p = path_join(root, "latest");
    if (!p)
        return -ENOMEM;
    char *buf;
    size_t n;
    int r = read_file(p, &buf, &n, 4096);
    free(p);
    if (r < 0)
        return r == -ENOENT ? ZO_FAIL(NULL, -ENOENT, "checkpoint root %s has no 'latest' yet", root)
                            : ZO_FAIL(NULL, r, "cannot read %s/latest: %s", root, zo_strerror(r));
    char nm[ZO_CKPT_NAME_MAX + 2];
    unsigned c;
    char tail;
    int ok = n > 0 && buf[n - 1] == '\n' && sscanf(buf, "%129s %8x%c", nm, &c, &tail) == 3 && tail == '\n' &&
             name_ok(nm) && strlen(buf) == n;
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
    return read_latest(root, buf, len, NULL);
}

/* ---- manifest ------------------------------------------------------------------------ */
static int json_u64(const cJSON *o, const char *key, uint64_t *out, const char *where)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (double)JSON_INT_MAX ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: '%s' missing or not a non-negative integer", where, key);
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static const char *json_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : NULL;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static cJSON *manifest_build(zo_ckpt_writer *w)
{
    cJSON *m = cJSON_CreateObject();
    if (!m)
        return NULL;
    cJSON_AddStringToObject(m, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(m, "format_version", ZO_CKPT_FORMAT_VERSION);
    cJSON_AddStringToObject(m, "library_version", zo_version_string());
    cJSON_AddStringToObject(m, "name", w->name);
    cJSON_AddNumberToObject(m, "sequence", (double)w->sequence);
    cJSON_AddNumberToObject(m, "created_unix", (double)time(NULL));
    cJSON_AddStringToObject(m, "checksum", "crc32c");
    cJSON_AddNumberToObject(m, "chunk_size", (double)w->opts.chunk_size);
    cJSON_AddStringToObject(m, "data_file", CKPT_DATA);
    cJSON_AddNumberToObject(m, "data_bytes", (double)w->data_end);
    cJSON *arr = cJSON_AddArrayToObject(m, "tensors");
    for (unsigned i = 0; arr && i < w->n; i++) {
        ck_tensor *t = &w->t[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o))
            goto fail;
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "dtype", zo_dtype_name(t->e.dtype));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (unsigned d = 0; shape && d < t->e.ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->e.shape[d]));
        cJSON_AddNumberToObject(o, "bytes", (double)t->e.bytes);
        cJSON_AddNumberToObject(o, "offset", (double)t->offset);
        char *hex = malloc(t->nchunks * 8 + 1);
        if (!hex)
            goto fail;
        for (uint64_t c = 0; c < t->nchunks; c++)
            snprintf(hex + c * 8, 9, "%08x", t->crc[c]);
        hex[t->nchunks * 8] = 0;
        cJSON *h = cJSON_AddStringToObject(o, "crc32c", hex);
        free(hex);
        if (!h)
            goto fail;
    }
    if (!arr)
        goto fail;
    if (w->user) {
        cJSON *u = cJSON_Duplicate(w->user, 1);
        if (!u || !cJSON_AddItemToObject(m, "user", u))
            goto fail;
    }
    return m;
fail:
    cJSON_Delete(m);
    return NULL;
}

/* Parse and validate a manifest into r. */
static int manifest_parse(zo_ckpt_reader *r, const char *text, const char *where)
{
    /* the whole file must be the one JSON value: trailing bytes are damage */
    const char *end = NULL;
    cJSON *m = cJSON_ParseWithOpts(text, &end, 1);
    if (!m)
        return ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s is not valid JSON (near byte %ld)", where,
                       end ? (long)(end - text) : -1L);
    int ret = ZO_EFORMAT;
    uint64_t ver, chunk, data_bytes;
    const char *fmt = json_str(m, "format");
    if (!cJSON_IsObject(m) || !fmt || strcmp(fmt, CKPT_FORMAT) != 0) {
        ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: 'format' is not \"%s\"", where, CKPT_FORMAT);
        goto out;
    }
    if ((ret = json_u64(m, "format_version", &ver, where)) < 0)
        goto out;
    if (ver > ZO_CKPT_FORMAT_VERSION || ver == 0) {
        ret = ZO_FAIL(NULL, ZO_EVERSION, "manifest %s: format_version %llu (this library reads up to %d)", where,
                      (unsigned long long)ver, ZO_CKPT_FORMAT_VERSION);
        goto out;
    }
    const char *libver = json_str(m, "library_version"), *name = json_str(m, "name");
    const char *csum = json_str(m, "checksum"), *dfile = json_str(m, "data_file");
    ret = ZO_EFORMAT;
    if (!libver || !name || !csum || strcmp(csum, "crc32c") != 0 || !dfile || strcmp(dfile, CKPT_DATA) != 0) {
        ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: library_version, name, checksum (crc32c) or data_file (%s) missing "
                "or wrong", where, CKPT_DATA);
        goto out;
    }
    if ((ret = json_u64(m, "chunk_size", &chunk, where)) < 0 || (ret = json_u64(m, "data_bytes", &data_bytes, where)) < 0 ||
        (ret = json_u64(m, "sequence", &r->sequence, where)) < 0)
        goto out;
    ret = ZO_EFORMAT;
    if (!ZO_IS_POW2(chunk) || chunk < 4096 || chunk > (1u << 30)) {
        ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: chunk_size %llu invalid", where, (unsigned long long)chunk);
        goto out;
    }
    r->chunk_size = (size_t)chunk;
    if (!(r->name = strdup(name)) || !(r->libver = strdup(libver))) {
        ret = -ENOMEM;
        goto out;
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(m, "user");
    r->user = user ? cJSON_PrintUnformatted(user) : strdup("");
    if (!r->user) {
        ret = -ENOMEM;
        goto out;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(m, "tensors");
    if (!cJSON_IsArray(arr)) {
        ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: 'tensors' is not an array", where);
        goto out;
    }
    int n = cJSON_GetArraySize(arr);
    r->t = calloc((size_t)n + 1, sizeof(*r->t));
    if (!r->t) {
        ret = -ENOMEM;
        goto out;
    }
    uint64_t prev_end = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, arr)
    {
        ck_tensor *t = &r->t[r->n];
        char w2[64];
        snprintf(w2, sizeof(w2), "%s tensor %u", where, r->n);
        const char *tn = json_str(o, "name"), *dt = json_str(o, "dtype"), *hex = json_str(o, "crc32c");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
        if (!cJSON_IsObject(o) || !tn || !*tn || strlen(tn) > 255 || !dt || !hex || !cJSON_IsArray(shape) ||
            cJSON_GetArraySize(shape) > ZO_CKPT_MAX_DIMS) {
            ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: name, dtype, shape (<= %d dims) or crc32c missing or invalid",
                    w2, ZO_CKPT_MAX_DIMS);
            goto out;
        }
        if (zo_dtype_parse(dt, &t->e.dtype) < 0) {
            ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: unknown dtype '%s'", w2, dt);
            goto out;
        }
        if ((ret = json_u64(o, "bytes", &t->e.bytes, w2)) < 0 || (ret = json_u64(o, "offset", &t->offset, w2)) < 0)
            goto out;
        ret = ZO_EFORMAT;
        const cJSON *dim;
        cJSON_ArrayForEach(dim, shape)
        {
            if (!cJSON_IsNumber(dim) || dim->valuedouble < 0 || dim->valuedouble >= (double)JSON_INT_MAX ||
                dim->valuedouble != (double)(uint64_t)dim->valuedouble) {
                ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: shape holds a non-integer", w2);
                goto out;
            }
            t->e.shape[t->e.ndim++] = (uint64_t)dim->valuedouble;
        }
        if (t->e.bytes == 0 || t->offset % CKPT_ALIGN || t->offset < prev_end || t->offset > data_bytes ||
            t->e.bytes > data_bytes - t->offset) {
            ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: bytes %llu at offset %llu overlap or leave the data (%llu bytes)",
                    w2, (unsigned long long)t->e.bytes, (unsigned long long)t->offset,
                    (unsigned long long)data_bytes);
            goto out;
        }
        prev_end = t->offset + t->e.bytes;
        t->nchunks = (t->e.bytes + chunk - 1) / chunk;
        if (strlen(hex) != t->nchunks * 8) {
            ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: %zu hex digits of crc32c for %llu chunks", w2, strlen(hex),
                    (unsigned long long)t->nchunks);
            goto out;
        }
        if (!(t->name = strdup(tn)) || !(t->crc = malloc(t->nchunks * sizeof(*t->crc)))) {
            ret = -ENOMEM;
            goto out;
        }
        t->e.name = t->name;
        for (uint64_t c = 0; c < t->nchunks; c++) {
            uint32_t v = 0;
            for (int k = 0; k < 8; k++) {
                int h = hexval(hex[c * 8 + k]);
                if (h < 0) {
                    ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: crc32c holds a non-hex digit", w2);
                    goto out;
                }
                v = (v << 4) | (uint32_t)h;
            }
            t->crc[c] = v;
        }
        for (unsigned k = 0; k < r->n; k++)
            if (strcmp(r->t[k].name, tn) == 0) {
                ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: duplicate tensor name '%s'", w2, tn);
                goto out;
            }
        r->n++;
    }
    /* the data file must hold what the manifest promises */
    zo_file_info fi;
    if ((ret = zo_file_get_info(r->data, &fi)) < 0)
        goto out;
    if (fi.size < data_bytes) {
        ret = ZO_FAIL(NULL, ZO_ETRUNC, "checkpoint %s: %s has %llu bytes, the manifest needs %llu", where, CKPT_DATA,
                      (unsigned long long)fi.size, (unsigned long long)data_bytes);
        goto out;
    }
    ret = 0;
out:
    if (ret < 0 && r->t) {
        /* the tensor being parsed is not counted in r->n yet: free what
         * it got before it was refused (name, crc) */
        free(r->t[r->n].name);
        free(r->t[r->n].crc);
        r->t[r->n].name = NULL;
        r->t[r->n].crc = NULL;
    }
    cJSON_Delete(m);
    return ret;
}

/* ---- writer ---------------------------------------------------------------------------- */
/* Writers of this process, by (root, name). Their temporary directory
 * .tmp-<name>.<host>.<pid> is the same for two writers of one name, and a
 * dead earlier process with our pid (a restarted container) can leave one
 * behind: begin removes such a leftover, so it must know that no live
 * writer of this process owns it, else it would delete that writer's data
 * under it and the other's commit would publish a manifest over the wrong
 * data file. */
static pthread_mutex_t active_lock = PTHREAD_MUTEX_INITIALIZER;
static zo_ckpt_writer *active_head;

static int writer_claim(zo_ckpt_writer *w)
{
    struct stat st;
    if (stat(w->root, &st) != 0)
        return -errno;
    w->root_dev = st.st_dev;
    w->root_ino = st.st_ino;
    pthread_mutex_lock(&active_lock);
    for (zo_ckpt_writer *o = active_head; o; o = o->next_active)
        if (o->root_dev == w->root_dev && o->root_ino == w->root_ino && strcmp(o->name, w->name) == 0) {
            pthread_mutex_unlock(&active_lock);
            return -EBUSY;
        }
    w->next_active = active_head;
    active_head = w;
    w->registered = 1;
    pthread_mutex_unlock(&active_lock);
    return 0;
}

static void writer_unclaim(zo_ckpt_writer *w)
{
    if (!w->registered)
        return;
    pthread_mutex_lock(&active_lock);
    for (zo_ckpt_writer **pp = &active_head; *pp; pp = &(*pp)->next_active)
        if (*pp == w) {
            *pp = w->next_active;
            break;
        }
    pthread_mutex_unlock(&active_lock);
    w->registered = 0;
}

static void writer_free(zo_ckpt_writer *w)
{
    if (!w)
        return;
    writer_unclaim(w);
    /* No zo_aio_wait_all() here: zo_ckpt_put() waits for every request it
     * queues, so none of ours is in flight; on a shared engine (the swap
     * store's) wait_all would block on other users' I/O and consume the
     * fire-and-forget error they are owed. */
    zo_file_close(&w->data);
    if (w->lock_fd >= 0)
        close(w->lock_fd); /* the temporary directory is gone or published by now */
    zo_aio_destroy(&w->own_aio);
    tensors_free(w->t, w->n);
    cJSON_Delete(w->user);
    free(w->root);
    free(w->name);
    free(w->tmpdir);
    free(w->final);
    free(w);
}

/* Hold an flock on <tmpdir>/.lock for the writer's life: clean-up of this
 * host takes a temporary directory whose lock it can take for abandoned.
 * The lock is taken on a file under another name and then renamed to
 * .lock, so a .lock is never seen unlocked while its writer lives. A
 * filesystem without flock leaves no .lock (clean-up then goes by pid). */
static int lock_arm(zo_ckpt_writer *w)
{
    char *tmp = path_join(w->tmpdir, ".lock.new"), *fin = path_join(w->tmpdir, CKPT_LOCK);
    int r = 0;
    if (!tmp || !fin) {
        r = -ENOMEM;
        goto out;
    }
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        r = -errno;
        goto out;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        ZO_LOGD("%s: no flock here (%s): liveness of this checkpoint goes by pid", w->tmpdir, strerror(errno));
        unlink(tmp);
        close(fd);
        goto out;
    }
    if (rename(tmp, fin) != 0) {
        r = -errno;
        unlink(tmp);
        close(fd);
        goto out;
    }
    w->lock_fd = fd;
out:
    free(tmp);
    free(fin);
    return r;
}

static uint64_t latest_sequence(const char *root)
{
    zo_ckpt_reader *r = NULL;
    char nm[ZO_CKPT_NAME_MAX + 1];
    if (read_latest(root, nm, sizeof(nm), NULL) < 0)
        return 0;
    if (zo_ckpt_open(&r, root, NULL) < 0)
        return 0;
    uint64_t s = r->sequence;
    zo_ckpt_close(&r);
    return s;
}

ZO_API int zo_ckpt_begin(zo_ckpt_writer **out, const char *root, const char *name, const zo_ckpt_options *uo)
{
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_begin: out is NULL");
    *out = NULL;
    if (!root || !*root)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_begin: no root directory");
    if (!name_ok(name))
        return ZO_FAIL(NULL, -EINVAL,
                       "zo_ckpt_begin: checkpoint name '%s' must be 1..%d of [A-Za-z0-9._-], not starting with '.', "
                       "not 'latest'",
                       name ? name : "(null)", ZO_CKPT_NAME_MAX);
    zo_ckpt_options o;
    zo_ckpt_options_default(&o);
    if (uo)
        ZO_CHECK(ZO_STRUCT_IN(&o, uo, offsetof(zo_ckpt_options, chunk_size) + sizeof(size_t), NULL, "zo_ckpt_begin"));
    if (!ZO_IS_POW2(o.chunk_size) || o.chunk_size < 4096 || o.chunk_size > (1u << 30))
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_ckpt_begin: chunk_size %zu must be a power of two in [4096, 1 GiB]",
                       o.chunk_size);
    if (mkdir(root, 0700) == 0) {
        /* a new root's entry lives in its parent: without this fsync the
         * first checkpoint could vanish with the root after a power loss,
         * although its commit returned 0 */
        char *parent = strdup(root);
        if (!parent)
            return -ENOMEM;
        int fr = zo__fsync_dir(dirname(parent));
        free(parent);
        if (fr < 0)
            return ZO_FAIL(NULL, fr, "zo_ckpt_begin: cannot fsync the parent of %s: %s", root, strerror(-fr));
    } else if (errno != EEXIST) {
        return ZO_FAIL(NULL, -errno, "zo_ckpt_begin: cannot create %s: %s", root, strerror(errno));
    }
    int r = zo__check_dir(NULL, "checkpoint root", root);
    if (r < 0)
        return r;
    zo_ckpt_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->lock_fd = -1;
    w->opts = o;
    if (o.user_json) {
        w->user = cJSON_ParseWithOpts(o.user_json, NULL, 1); /* nothing after the value */
        if (!w->user) {
            writer_free(w);
            return ZO_FAIL(NULL, ZO_EFORMAT, "zo_ckpt_begin: user_json is not valid JSON");
        }
    }
    w->opts.user_json = NULL;
    char tmpname[ZO_CKPT_NAME_MAX + ZO__CKPT_HOST_MAX + 40];
    snprintf(tmpname, sizeof(tmpname), ".tmp-%s.%s.%ld", name, zo__ckpt_host(), (long)getpid());
    w->root = strdup(root);
    w->name = strdup(name);
    w->tmpdir = path_join(root, tmpname);
    w->final = path_join(root, name);
    if (!w->root || !w->name || !w->tmpdir || !w->final) {
        writer_free(w);
        return -ENOMEM;
    }
    if ((r = writer_claim(w)) < 0) {
        writer_free(w);
        if (r == -EBUSY)
            return ZO_FAIL(NULL, -EBUSY, "zo_ckpt_begin: checkpoint %s/%s is being written by another writer of this "
                           "process", root, name);
        return ZO_FAIL(NULL, r, "zo_ckpt_begin: %s: %s", root, strerror(-r));
    }
    clean_stale(root);
    if (access(w->final, F_OK) == 0) {
        writer_free(w);
        return ZO_FAIL(NULL, -EEXIST, "zo_ckpt_begin: checkpoint %s/%s exists", root, name);
    }
    w->sequence = latest_sequence(root) + 1;
    if (mkdir(w->tmpdir, 0700) != 0) {
        r = -errno;
        if (r == -EEXIST) {
            /* a leftover under our host and pid: no live writer of this
             * process owns it (writer_claim), but a process of another pid
             * namespace with the same host name and pid might: its lock says */
            int lfd;
            if (tmp_state(w->tmpdir, &lfd) == TMP_LIVE) {
                r = ZO_FAIL(NULL, -EBUSY, "zo_ckpt_begin: %s is locked by a live writer (another container with "
                            "this host name and pid?) or its lock cannot be checked", w->tmpdir);
                writer_free(w);
                return r;
            }
            r = remove_flat_dir(w->tmpdir) == 0 && mkdir(w->tmpdir, 0700) == 0 ? 0 : -errno;
            if (lfd >= 0)
                close(lfd);
        }
        if (r < 0) {
            ZO_FAIL(NULL, r, "zo_ckpt_begin: cannot create %s: %s", w->tmpdir, zo_strerror(r));
            writer_free(w);
            return r;
        }
    }
    if ((r = lock_arm(w)) < 0) {
        ZO_FAIL(NULL, r, "zo_ckpt_begin: cannot create the lock file in %s: %s", w->tmpdir, zo_strerror(r));
        remove_flat_dir(w->tmpdir);
        writer_free(w);
        return r;
    }
    if (o.aio) {
        w->aio = o.aio;
    } else {
        zo_aio_config ac;
        zo_aio_config_default(&ac);
        r = zo_aio_create(&w->own_aio, &ac);
        if (r < 0) {
            remove_flat_dir(w->tmpdir);
            writer_free(w);
            return r;
        }
        w->aio = w->own_aio;
    }
    char *dp = path_join(w->tmpdir, CKPT_DATA);
    if (!dp) {
        zo_ckpt_abort(&w);
        return -ENOMEM;
    }
    unsigned fl = ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_CREATE | ZO_FILE_EXCL | ZO_FILE_NOFOLLOW;
    if (o.buffered)
        fl |= ZO_FILE_BUFFERED;
    r = zo_file_open(&w->data, dp, fl);
    free(dp);
    if (r < 0) {
        ZO_FAIL(NULL, r, "zo_ckpt_begin: cannot create the data file in %s: %s", w->tmpdir, zo_strerror(r));
        zo_ckpt_abort(&w);
        return r;
    }
    *out = w;
    return 0;
}

ZO_API int zo_ckpt_add(zo_ckpt_writer *w, const zo_ckpt_entry *e, unsigned *index)
{
    if (!w || !e)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_add: NULL argument");
    if (w->put_started || w->failed)
        return ZO_FAIL(NULL, ZO_ESTATE, "zo_ckpt_add: %s", w->failed ? "the checkpoint failed" :
                                                                       "data was already put: declare every tensor first");
    if (!e->name || !*e->name || strlen(e->name) > 255 || e->bytes == 0 || e->bytes >= JSON_INT_MAX ||
        e->ndim > ZO_CKPT_MAX_DIMS || zo_dtype_size(e->dtype) == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_add: tensor '%s': name (1..255 bytes), bytes > 0, ndim <= %d and a "
                       "valid dtype are required",
                       e->name ? e->name : "(null)", ZO_CKPT_MAX_DIMS);
    for (unsigned i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, e->name) == 0)
            return ZO_FAIL(NULL, -EEXIST, "zo_ckpt_add: tensor '%s' declared twice", e->name);
    if (w->n == w->cap) {
        unsigned cap = w->cap ? w->cap * 2 : 16;
        ck_tensor *t = realloc(w->t, cap * sizeof(*t));
        if (!t)
            return -ENOMEM;
        w->t = t;
        w->cap = cap;
    }
    ck_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof(*t));
    t->e = *e;
    t->nchunks = (e->bytes + w->opts.chunk_size - 1) / w->opts.chunk_size;
    t->name = strdup(e->name);
    t->crc = calloc(t->nchunks, sizeof(*t->crc));
    t->have = calloc(t->nchunks, 1);
    if (!t->name || !t->crc || !t->have) {
        free(t->name);
        free(t->crc);
        free(t->have);
        return -ENOMEM;
    }
    t->e.name = t->name;
    t->offset = ZO_ALIGN_UP(w->data_end, (uint64_t)CKPT_ALIGN);
    w->data_end = t->offset + e->bytes;
    if (index)
        *index = w->n;
    w->n++;
    return 0;
}

ZO_API int zo_ckpt_put(zo_ckpt_writer *w, unsigned index, uint64_t off, const void *buf, size_t len)
{
    if (!w || !buf || len == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_put: %s", !w ? "NULL writer" : !buf ? "NULL buffer" : "len 0");
    if (w->failed)
        return ZO_FAIL(NULL, ZO_ESTATE, "zo_ckpt_put: an earlier write failed; abort the checkpoint");
    if (index >= w->n)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_put: tensor index %u of %u", index, w->n);
    ck_tensor *t = &w->t[index];
    uint64_t chunk = w->opts.chunk_size;
    if (off > t->e.bytes || len > t->e.bytes - off || off % chunk || ((off + len) % chunk && off + len != t->e.bytes))
        return ZO_FAIL(NULL, -EINVAL,
                       "zo_ckpt_put: range [%llu, +%zu) of '%s' (%llu bytes) must start and end on %llu-byte chunk "
                       "boundaries (or at its end)",
                       (unsigned long long)off, len, t->name, (unsigned long long)t->e.bytes,
                       (unsigned long long)chunk);
    uint64_t c0 = off / chunk, nc = (len + chunk - 1) / chunk;
    for (uint64_t c = c0; c < c0 + nc; c++)
        if (t->have[c])
            return ZO_FAIL(NULL, ZO_ESTATE, "zo_ckpt_put: chunk at offset %llu of '%s' was already written",
                           (unsigned long long)(c * chunk), t->name);
    int r;
    if (!w->put_started) {
        /* reserve the whole data file now: a full disk fails here */
        if (w->data_end) {
            r = zo_file_allocate(w->data, 0, ZO_ALIGN_UP(w->data_end, (uint64_t)CKPT_ALIGN));
            if (r == -EOPNOTSUPP)
                r = 0;
            if (r < 0) {
                w->failed = 1;
                return ZO_FAIL(NULL, r, "checkpoint %s: cannot reserve %llu bytes: %s", w->name,
                               (unsigned long long)w->data_end, zo_strerror(r));
            }
        }
        w->put_started = 1;
    }
    zo_aio_req *reqs[64];
    int ret = 0;
    for (uint64_t base = 0; base < nc; base += 64) {
        uint64_t m = ZO_MIN((uint64_t)64, nc - base), q = 0;
        for (; q < m; q++) {
            uint64_t c = c0 + base + q;
            const uint8_t *p = (const uint8_t *)buf + (c - c0) * chunk;
            uint64_t l = ZO_MIN(chunk, t->e.bytes - c * chunk);
            t->crc[c] = zo_crc32c(0, p, l);
            r = zo_aio_write(w->aio, w->data, p, l, t->offset + c * chunk, NULL, NULL, &reqs[q]);
            if (r < 0) {
                ret = ret ? ret : r;
                break;
            }
        }
        for (uint64_t k = 0; k < q; k++) {
            r = zo_aio_wait(w->aio, reqs[k], NULL);
            if (r < 0 && ret == 0)
                ret = r;
            else if (r == 0)
                t->have[c0 + base + k] = 1;
        }
        if (ret)
            break;
    }
    if (ret < 0) {
        w->failed = 1;
        return ZO_FAIL(NULL, ret, "checkpoint %s: writing '%s' at %llu failed: %s", w->name, t->name,
                       (unsigned long long)off, zo_aio_errmsg(w->aio));
    }
    return 0;
}

ZO_API void zo_ckpt_abort(zo_ckpt_writer **wp)
{
    if (!wp || !*wp)
        return;
    zo_ckpt_writer *w = *wp;
    zo_file_close(&w->data); /* nothing of ours in flight: see writer_free() */
    if (w->tmpdir)
        remove_flat_dir(w->tmpdir);
    writer_free(w);
    *wp = NULL;
}

/* Prune: keep the `keep` newest checkpoints (by sequence), never `latest`. */
static void prune(const char *root, const char *latest, uint64_t latest_seq, unsigned keep)
{
    DIR *d = opendir(root);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !name_ok(de->d_name) || strcmp(de->d_name, latest) == 0)
            continue;
        zo_ckpt_reader *r = NULL;
        if (zo_ckpt_open(&r, root, de->d_name) < 0)
            continue; /* not a checkpoint of ours, or damaged: leave it to the user */
        uint64_t seq = r->sequence;
        zo_ckpt_close(&r);
        if (seq + keep > latest_seq)
            continue;
        char trash[ZO_CKPT_NAME_MAX + ZO__CKPT_HOST_MAX + 40];
        snprintf(trash, sizeof(trash), ".trash-%s.%s.%ld", de->d_name, zo__ckpt_host(), (long)getpid());
        char *from = path_join(root, de->d_name), *to = path_join(root, trash);
        /* rename first: the old checkpoint disappears at once, never half */
        if (from && to && renameat(AT_FDCWD, from, AT_FDCWD, to) == 0) {
            zo__fsync_dir(root);
            if (remove_flat_dir(to) < 0)
                ZO_LOGW("prune: could not remove %s", to);
        }
        free(from);
        free(to);
    }
    closedir(d);
}

/* What a commit changed after its rename (step 4), to be taken back if a
 * later step fails. */
typedef struct publish_state {
    int renamed;       /* <root>/<name> is ours (step 4 done) */
    int latest_moved;  /* latest was replaced (step 5's rename done) */
    int old_latest;    /* latest before: 1 held old/old_len, 0 none, -1 unreadable */
    char *old;
    size_t old_len;
} publish_state;

/* A commit step after the rename failed with `err` (detail recorded): take
 * the checkpoint back so that a failed commit publishes nothing and a
 * retry of the name works: latest put back as it was, the directory
 * renamed back to its temporary name (removed by the caller). Returns
 * `err`, with the detail extended if the undo fails too (a second fault):
 * then what stays is said there. */
static int unpublish(zo_ckpt_writer *w, publish_state *ps, const char *ltmp, const char *lpath, int err)
{
    char why[ZO_ERRMSG_LEN];
    snprintf(why, sizeof(why), "%s", zo_last_error_detail());
    if (ps->latest_moved) {
        int r = fault(ZO__CKPT_F_UNDO_LATEST);
        if (r == 0 && ps->old_latest == 1) {
            unlink(ltmp);
            r = write_file_sync(ltmp, ps->old, ps->old_len);
            if (r == 0 && rename(ltmp, lpath) != 0)
                r = -errno;
            if (r < 0)
                unlink(ltmp);
        } else if (r == 0 && ps->old_latest == 0) {
            r = unlink(lpath) == 0 || errno == ENOENT ? 0 : -errno;
        } else if (r == 0) {
            r = -EIO; /* what latest held could not be read: it cannot be put back */
        }
        if (r < 0) {
            /* latest names the new checkpoint: it must stay */
            w->tmpdir_published = 1;
            return ZO_FAIL(NULL, err, "%s; latest could not be put back (%s): checkpoint %s stays, current, and may "
                           "not be durable", why, zo_strerror(r), w->name);
        }
        ps->latest_moved = 0;
    }
    int r = fault(ZO__CKPT_F_UNDO_RENAME);
    if (r == 0 && renameat2(AT_FDCWD, w->final, AT_FDCWD, w->tmpdir, RENAME_NOREPLACE) != 0)
        r = -errno;
    if (r < 0) {
        w->tmpdir_published = 1;
        return ZO_FAIL(NULL, err, "%s; renaming it back failed (%s): %s stays, complete, and latest does not name it",
                       why, zo_strerror(r), w->final);
    }
    ps->renamed = 0;
    zo__fsync_dir(w->root); /* best effort: the step that failed may have been this very fsync */
    return ZO_FAIL(NULL, err, "%s (nothing published)", why);
}

ZO_API int zo_ckpt_commit(zo_ckpt_writer **wp)
{
    if (!wp || !*wp)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_commit: NULL writer");
    zo_ckpt_writer *w = *wp;
    int r = 0;
    char *mtext = NULL, *mpath = NULL, *ltmp = NULL, *lpath = NULL;
    publish_state ps = {0};
    if (w->failed) {
        r = ZO_FAIL(NULL, ZO_ESTATE, "zo_ckpt_commit: %s: an earlier write failed", w->name);
        goto fail;
    }
    for (unsigned i = 0; i < w->n; i++)
        for (uint64_t c = 0; c < w->t[i].nchunks; c++)
            if (!w->t[i].have[c]) {
                r = ZO_FAIL(NULL, ZO_ESTATE, "zo_ckpt_commit: %s: tensor '%s' has no data at offset %llu", w->name,
                            w->t[i].name, (unsigned long long)(c * w->opts.chunk_size));
                goto fail;
            }
    char lname[ZO__CKPT_HOST_MAX + 40];
    snprintf(lname, sizeof(lname), ".latest.%s.%ld", zo__ckpt_host(), (long)getpid());
    ltmp = path_join(w->root, lname);
    lpath = path_join(w->root, "latest");
    mpath = path_join(w->tmpdir, CKPT_MANIFEST);
    if (!ltmp || !lpath || !mpath) {
        r = -ENOMEM;
        goto fail;
    }
    /* 1. data */
    if ((r = fault(ZO__CKPT_F_DATA_SYNC)) < 0 || (r = zo_file_sync(w->data)) < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: fdatasync of the data failed: %s", w->name, zo_strerror(r));
        goto fail;
    }
    zo_file_close(&w->data);
    /* 2. manifest */
    cJSON *m = manifest_build(w);
    mtext = m ? cJSON_Print(m) : NULL;
    cJSON_Delete(m);
    if (!mtext) {
        r = -ENOMEM;
        goto fail;
    }
    size_t mlen = strlen(mtext);
    uint32_t mcrc = zo_crc32c(0, mtext, mlen);
    if ((r = fault(ZO__CKPT_F_MANIFEST)) < 0 || (r = write_file_sync(mpath, mtext, mlen)) < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: writing %s failed: %s", w->name, mpath, zo_strerror(r));
        goto fail;
    }
    /* 3. the directory's entries */
    if ((r = fault(ZO__CKPT_F_TMPDIR_SYNC)) < 0 || (r = zo__fsync_dir(w->tmpdir)) < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: fsync of %s failed: %s", w->name, w->tmpdir, zo_strerror(r));
        goto fail;
    }
    /* 4. publish the directory */
    if ((r = fault(ZO__CKPT_F_RENAME)) == 0 &&
        renameat2(AT_FDCWD, w->tmpdir, AT_FDCWD, w->final, RENAME_NOREPLACE) != 0)
        r = -errno;
    if (r < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: rename to %s failed: %s", w->name, w->final, zo_strerror(r));
        goto fail;
    }
    ps.renamed = 1;
    if ((r = fault(ZO__CKPT_F_ROOT_SYNC)) < 0 || (r = zo__fsync_dir(w->root)) < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: fsync of %s failed: %s", w->name, w->root, zo_strerror(r));
        goto fail;
    }
    /* 5. point latest at it; what latest held is kept to put it back if a
     * later step fails */
    int lr = read_file(lpath, &ps.old, &ps.old_len, 4096);
    ps.old_latest = lr == 0 ? 1 : lr == -ENOENT ? 0 : -1;
    char line[ZO_CKPT_NAME_MAX + 16];
    int ln = snprintf(line, sizeof(line), "%s %08x\n", w->name, mcrc);
    unlink(ltmp);
    if ((r = fault(ZO__CKPT_F_LATEST_WRITE)) == 0)
        r = write_file_sync(ltmp, line, (size_t)ln);
    if (r == 0 && (r = fault(ZO__CKPT_F_LATEST_RENAME)) == 0 && rename(ltmp, lpath) != 0)
        r = -errno;
    if (r < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: updating %s failed: %s", w->name, lpath, zo_strerror(r));
        unlink(ltmp);
        goto fail;
    }
    ps.latest_moved = 1;
    if ((r = fault(ZO__CKPT_F_LATEST_SYNC)) < 0 || (r = zo__fsync_dir(w->root)) < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: fsync of %s failed: %s", w->name, w->root, zo_strerror(r));
        goto fail;
    }
    /* published: the lock file goes (a crash before this leaves an empty
     * .lock in the checkpoint, which nothing reads) */
    char *lk = path_join(w->final, CKPT_LOCK);
    if (lk)
        unlink(lk);
    free(lk);
    if (w->opts.keep_last)
        prune(w->root, w->name, w->sequence, w->opts.keep_last);
    r = 0;
fail:
    if (r < 0 && ps.renamed)
        r = unpublish(w, &ps, ltmp, lpath, r);
    free(ps.old);
    free(mtext);
    free(mpath);
    free(ltmp);
    free(lpath);
    if (r < 0 && !w->tmpdir_published) {
        zo_file_close(&w->data);
        remove_flat_dir(w->tmpdir);
    }
    writer_free(w);
    *wp = NULL;
    return r;
}

ZO_API int zo_ckpt_save(const char *root, const char *name, const zo_ckpt_entry *entries, const void *const *data,
                        unsigned n, const zo_ckpt_options *opts)
{
    if ((!entries || !data) && n)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_save: NULL entries or data");
    zo_ckpt_writer *w;
    int r = zo_ckpt_begin(&w, root, name, opts);
    if (r < 0)
        return r;
    for (unsigned i = 0; i < n && r == 0; i++)
        r = zo_ckpt_add(w, &entries[i], NULL);
    for (unsigned i = 0; i < n && r == 0; i++)
        r = zo_ckpt_put(w, i, 0, data[i], entries[i].bytes);
    if (r < 0) {
        char why[ZO_ERRMSG_LEN];
        snprintf(why, sizeof(why), "%s", zo_last_error_detail());
        zo_ckpt_abort(&w);
        return ZO_FAIL(NULL, r, "%s", why);
    }
    return zo_ckpt_commit(&w);
}

/* ---- reader ----------------------------------------------------------------------------- */
ZO_API void zo_ckpt_close(zo_ckpt_reader **rp)
{
    if (!rp || !*rp)
        return;
    zo_ckpt_reader *r = *rp;
    zo_file_close(&r->data);
    zo_aio_destroy(&r->aio);
    tensors_free(r->t, r->n);
    free(r->dir);
    free(r->name);
    free(r->libver);
    free(r->user);
    free(r);
    *rp = NULL;
}

ZO_API int zo_ckpt_open(zo_ckpt_reader **out, const char *root, const char *name)
{
    if (!out || !root)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_open: NULL argument");
    *out = NULL;
    char nm[ZO_CKPT_NAME_MAX + 1];
    uint32_t want_crc = 0;
    int via_latest = name == NULL, r;
    if (via_latest) {
        if ((r = read_latest(root, nm, sizeof(nm), &want_crc)) < 0)
            return r;
        name = nm;
    } else if (!name_ok(name)) {
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_open: invalid checkpoint name '%s'", name);
    }
    zo_ckpt_reader *rd = calloc(1, sizeof(*rd));
    if (!rd)
        return -ENOMEM;
    char *mpath = NULL, *dpath = NULL, *text = NULL;
    size_t tlen;
    rd->dir = path_join(root, name);
    mpath = rd->dir ? path_join(rd->dir, CKPT_MANIFEST) : NULL;
    dpath = rd->dir ? path_join(rd->dir, CKPT_DATA) : NULL;
    if (!mpath || !dpath) {
        r = -ENOMEM;
        goto fail;
    }
    if ((r = read_file(mpath, &text, &tlen, CKPT_MAX_MANIFEST)) < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: cannot read %s: %s", name, mpath, zo_strerror(r));
        goto fail;
    }
    if (via_latest && zo_crc32c(0, text, tlen) != want_crc) {
        r = ZO_FAIL(NULL, ZO_ECORRUPT, "checkpoint %s: %s does not match the crc32c %08x recorded in latest (%08x)",
                    name, mpath, want_crc, zo_crc32c(0, text, tlen));
        goto fail;
    }
    if ((r = zo_file_open(&rd->data, dpath, ZO_FILE_READ | ZO_FILE_NOFOLLOW)) < 0) {
        ZO_FAIL(NULL, r, "checkpoint %s: cannot open %s: %s", name, dpath, zo_strerror(r));
        goto fail;
    }
    if ((r = manifest_parse(rd, text, mpath)) < 0)
        goto fail;
    if (strcmp(rd->name, name) != 0) {
        r = ZO_FAIL(NULL, ZO_EFORMAT, "checkpoint %s: its manifest names it '%s'", name, rd->name);
        goto fail;
    }
    free(mpath);
    free(dpath);
    free(text);
    *out = rd;
    return 0;
fail:
    free(mpath);
    free(dpath);
    free(text);
    zo_ckpt_close(&rd);
    return r;
}

ZO_API unsigned zo_ckpt_count(const zo_ckpt_reader *r)
{
    return r ? r->n : 0;
}

ZO_API int zo_ckpt_get_entry(const zo_ckpt_reader *r, unsigned i, zo_ckpt_entry *e)
{
    if (!r || !e || i >= r->n)
        return -EINVAL;
    *e = r->t[i].e;
    return 0;
}

ZO_API int zo_ckpt_find(const zo_ckpt_reader *r, const char *name, unsigned *index)
{
    if (!r || !name)
        return -EINVAL;
    for (unsigned i = 0; i < r->n; i++)
        if (strcmp(r->t[i].name, name) == 0) {
            if (index)
                *index = i;
            return 0;
        }
    return -ENOENT;
}

ZO_API const char *zo_ckpt_name(const zo_ckpt_reader *r)
{
    return r ? r->name : "";
}

ZO_API const char *zo_ckpt_library_version(const zo_ckpt_reader *r)
{
    return r ? r->libver : "";
}

ZO_API const char *zo_ckpt_user_json(const zo_ckpt_reader *r)
{
    return r ? r->user : "";
}

ZO_API size_t zo_ckpt_chunk_size(const zo_ckpt_reader *r)
{
    return r ? r->chunk_size : 0;
}

ZO_API int zo_ckpt_read(zo_ckpt_reader *r, unsigned i, uint64_t off, void *buf, size_t len)
{
    if (!r || !buf || len == 0 || i >= r->n)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_read: bad argument");
    ck_tensor *t = &r->t[i];
    uint64_t chunk = r->chunk_size;
    if (off > t->e.bytes || len > t->e.bytes - off || off % chunk || ((off + len) % chunk && off + len != t->e.bytes))
        return ZO_FAIL(NULL, -EINVAL,
                       "zo_ckpt_read: range [%llu, +%zu) of '%s' (%llu bytes) must start and end on %llu-byte chunk "
                       "boundaries (or at its end)",
                       (unsigned long long)off, len, t->name, (unsigned long long)t->e.bytes,
                       (unsigned long long)chunk);
    uint64_t c0 = off / chunk, nc = (len + chunk - 1) / chunk;
    zo_aio_req *reqs[64];
    int ret = 0;
    if (!r->aio) { /* made on first use: opening (and pruning) reads no data */
        zo_aio_config ac;
        zo_aio_config_default(&ac);
        if ((ret = zo_aio_create(&r->aio, &ac)) < 0)
            return ret;
    }
    for (uint64_t base = 0; base < nc && ret == 0; base += 64) {
        uint64_t m = ZO_MIN((uint64_t)64, nc - base), q = 0;
        for (; q < m; q++) {
            uint64_t c = c0 + base + q;
            uint64_t l = ZO_MIN(chunk, t->e.bytes - c * chunk);
            int e = zo_aio_read(r->aio, r->data, (uint8_t *)buf + (c - c0) * chunk, l, t->offset + c * chunk, NULL,
                                NULL, &reqs[q]);
            if (e < 0) {
                ret = e;
                break;
            }
        }
        for (uint64_t k = 0; k < q; k++) {
            uint64_t c = c0 + base + k;
            int e = zo_aio_wait(r->aio, reqs[k], NULL);
            if (e < 0) {
                if (ret == 0)
                    ret = ZO_FAIL(NULL, e, "checkpoint %s: reading '%s' at %llu failed: %s", r->name, t->name,
                                  (unsigned long long)(c * chunk), zo_aio_errmsg(r->aio));
                continue;
            }
            if (ret)
                continue;
            uint64_t l = ZO_MIN(chunk, t->e.bytes - c * chunk);
            uint32_t got = zo_crc32c(0, (uint8_t *)buf + (c - c0) * chunk, l);
            if (got != t->crc[c])
                ret = ZO_FAIL(NULL, ZO_ECORRUPT,
                              "checkpoint %s: tensor '%s' corrupt at byte offset %llu (chunk %llu): crc32c 0x%08x, "
                              "manifest 0x%08x",
                              r->name, t->name, (unsigned long long)(c * chunk), (unsigned long long)c, got,
                              t->crc[c]);
        }
    }
    return ret;
}

ZO_API int zo_ckpt_verify(zo_ckpt_reader *r)
{
    if (!r)
        return -EINVAL;
    size_t bl = ZO_MAX(r->chunk_size, (size_t)(16u << 20));
    bl = bl / r->chunk_size * r->chunk_size;
    /* no bigger than the largest tensor: a manifest with 1 GiB chunks and
     * small tensors must not make verification allocate 1 GiB (each tensor
     * then fits one read) */
    uint64_t largest = 0;
    for (unsigned i = 0; i < r->n; i++)
        largest = ZO_MAX(largest, r->t[i].e.bytes);
    if (largest < bl)
        bl = (size_t)ZO_ALIGN_UP(ZO_MAX(largest, (uint64_t)1), 4096);
    void *buf;
    int ret = zo_aligned_alloc(&buf, bl, 4096);
    if (ret < 0)
        return ret;
    for (unsigned i = 0; i < r->n && ret == 0; i++)
        for (uint64_t off = 0; off < r->t[i].e.bytes && ret == 0; off += bl)
            ret = zo_ckpt_read(r, i, off, buf, (size_t)ZO_MIN((uint64_t)bl, r->t[i].e.bytes - off));
    zo_aligned_free(buf);
    return ret;
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
#endif
