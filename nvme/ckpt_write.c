/* SPDX-License-Identifier: Apache-2.0 */
/* Crash-safe checkpoints, the writer: data + JSON manifest written under a
 * temporary directory, fsynced, renamed into place, then `latest` replaced
 * atomically. The other pieces: ckpt_manifest.c (the JSON), ckpt_root.c
 * (host tag, clean-up of leftovers, reading latest), ckpt_read.c,
 * ckpt_common.c (shared file helpers).
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
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zoffload/aio.h>

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

/* ---- small file helpers (the writer's) ---------------------------------------------- */
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
    zo__ckpt_tensors_free(w->t, w->n);
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
    char *tmp = zo__ckpt_path_join(w->tmpdir, ".lock.new"), *fin = zo__ckpt_path_join(w->tmpdir, ZO__CKPT_LOCK);
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
    if (zo__ckpt_read_latest(root, nm, sizeof(nm), NULL) < 0)
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
    if (!zo__ckpt_name_ok(name))
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
    w->tmpdir = zo__ckpt_path_join(root, tmpname);
    w->final = zo__ckpt_path_join(root, name);
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
    zo__ckpt_clean_stale(root);
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
            if (zo__ckpt_tmp_state(w->tmpdir, &lfd) == ZO__CKPT_TMP_LIVE) {
                r = ZO_FAIL(NULL, -EBUSY, "zo_ckpt_begin: %s is locked by a live writer (another container with "
                            "this host name and pid?) or its lock cannot be checked", w->tmpdir);
                writer_free(w);
                return r;
            }
            r = zo__ckpt_remove_flat_dir(w->tmpdir) == 0 && mkdir(w->tmpdir, 0700) == 0 ? 0 : -errno;
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
        zo__ckpt_remove_flat_dir(w->tmpdir);
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
            zo__ckpt_remove_flat_dir(w->tmpdir);
            writer_free(w);
            return r;
        }
        w->aio = w->own_aio;
    }
    char *dp = zo__ckpt_path_join(w->tmpdir, ZO__CKPT_DATA);
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
    if (!e->name || !*e->name || strlen(e->name) > 255 || e->bytes == 0 || e->bytes >= ZO__CKPT_JSON_INT_MAX ||
        e->ndim > ZO_CKPT_MAX_DIMS || zo_dtype_size(e->dtype) == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_add: tensor '%s': name (1..255 bytes), bytes > 0, ndim <= %d and a "
                       "valid dtype are required",
                       e->name ? e->name : "(null)", ZO_CKPT_MAX_DIMS);
    for (unsigned i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, e->name) == 0)
            return ZO_FAIL(NULL, -EEXIST, "zo_ckpt_add: tensor '%s' declared twice", e->name);
    if (w->n == w->cap) {
        unsigned cap = w->cap ? w->cap * 2 : 16;
        zo__ckpt_tensor *t = realloc(w->t, cap * sizeof(*t));
        if (!t)
            return -ENOMEM;
        w->t = t;
        w->cap = cap;
    }
    zo__ckpt_tensor *t = &w->t[w->n];
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
    t->offset = ZO_ALIGN_UP(w->data_end, (uint64_t)ZO__CKPT_ALIGN);
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
    zo__ckpt_tensor *t = &w->t[index];
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
            r = zo_file_allocate(w->data, 0, ZO_ALIGN_UP(w->data_end, (uint64_t)ZO__CKPT_ALIGN));
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
        zo__ckpt_remove_flat_dir(w->tmpdir);
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
        if (de->d_name[0] == '.' || !zo__ckpt_name_ok(de->d_name) || strcmp(de->d_name, latest) == 0)
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
        char *from = zo__ckpt_path_join(root, de->d_name), *to = zo__ckpt_path_join(root, trash);
        /* rename first: the old checkpoint disappears at once, never half */
        if (from && to && renameat(AT_FDCWD, from, AT_FDCWD, to) == 0) {
            zo__fsync_dir(root);
            if (zo__ckpt_remove_flat_dir(to) < 0)
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
    ltmp = zo__ckpt_path_join(w->root, lname);
    lpath = zo__ckpt_path_join(w->root, "latest");
    mpath = zo__ckpt_path_join(w->tmpdir, ZO__CKPT_MANIFEST);
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
    cJSON *m = zo__ckpt_manifest_build(w);
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
    int lr = zo__ckpt_read_file(lpath, &ps.old, &ps.old_len, 4096);
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
    char *lk = zo__ckpt_path_join(w->final, ZO__CKPT_LOCK);
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
        zo__ckpt_remove_flat_dir(w->tmpdir);
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
#endif /* ZO_HAVE_CJSON */
