/* SPDX-License-Identifier: Apache-2.0 */
/* The swap store: arena files in one or more directories, striping, arena
 * space carved by the core's extent allocator, and swap in/out through the
 * aio engine with a checksum per chunk. A chunk's write is queued first and
 * its checksum computed from the source buffer while the write is in
 * flight; a read chunk is verified as soon as its read completes. Both run
 * on the store's checksum threads (csum_threads), or inline when there are
 * none: the write's checksum in the submitting thread, the read's check on
 * the engine thread that completed it. */
#define ZO_MODULE "swap"
#include "core/internal.h"
#include "core/extent.h"
#include "core/list.h"
#include "nvme/nvme_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zoffload/aio.h>

#define SWAP_GRANULE 4096u

typedef struct arena {
    zo_file *f;
    int lockfd;       /* holds flock(LOCK_EX) on the file for the arena's life */
    char *path;
    zo__extalloc ext; /* offsets in the file; ext.size == bytes reserved */
    zo_file_info fi;  /* how the file was opened (direct, alignment) */
} arena;

typedef struct swap_dir {
    char *path;
    arena **arenas;
    unsigned narenas, cap;
    int growing; /* a thread is creating an arena here (s->lock dropped) */
} swap_dir;

/* A run of a stripe stored contiguously in one arena. soff: offset inside
 * the stripe; len: bytes (rounded to the granule, chunk multiples except the
 * stripe's last segment). */
typedef struct seg {
    arena *ar;
    uint64_t foff, soff, len;
} seg;

typedef struct stripe {
    seg *segs;
    unsigned nsegs;
    uint64_t len; /* payload bytes of this stripe */
} stripe;

enum { CH_UNWRITTEN = 0, CH_PENDING = 1, CH_VALID = 2, CH_FAILED = 3 };

typedef struct salloc {
    zo_swap_id id;
    uint64_t bytes, nchunks;
    unsigned first_dir;
    uint64_t *csum;
    _Atomic uint8_t *cstate;
    stripe *stripes; /* ndirs entries */
    unsigned inflight; /* ios using it; under s->lock */
    char name[ZO_SWAP_NAME_MAX + 1];
} salloc;

typedef struct chunk_ctx {
    struct zo_swap_io *io;
    uint64_t idx;     /* chunk index in the allocation */
    arena *ar;
    uint64_t foff;
    uint8_t *buf;
    uint32_t len;
    _Atomic int parts; /* write: the I/O and the checksum, each finishing once */
    int64_t res;       /* the I/O's result */
    zo_qnode vnode;    /* on the checksum threads' queue */
} chunk_ctx;

enum { IO_READ = 0, IO_WRITE = 1 };

struct zo_swap_io {
    zo_swap *s;
    salloc *al;
    int op;
    int waitable;
    zo_swap_cb cb;
    void *user;
    _Atomic uint64_t pending;
    _Atomic int err;
    int done; /* under s->lock */
    char detail[ZO_ERRMSG_LEN];
    uint64_t nctx;
    chunk_ctx ctx[];
};

struct zo_swap {
    zo_swap_config cfg;
    zo_aio *aio, *own_aio;
    swap_dir *dirs;
    unsigned ndirs;
    unsigned instance;
    unsigned next_dir;       /* striping start of the next allocation */
    _Atomic unsigned arena_seq; /* <n> of the next arena file name */
    uint64_t granule;        /* extent granule: max(4096, O_DIRECT offset alignment) */
    zo_swap_info info;
    int info_set;

    pthread_mutex_t lock;    /* tables, arenas, inflight, io completion */
    pthread_cond_t cond;     /* io done, inflight dropped */
    pthread_cond_t gcond;    /* an arena growth finished (published or failed) */
    uint64_t growing_bytes;  /* arena bytes being created with the lock dropped */
    salloc **tab;            /* handle table: slot i holds id with index i+1 */
    uint32_t *gen;
    size_t ntab, captab;
    uint32_t *free_slots;
    size_t nfree_slots;
    uint64_t inflight;       /* ios in flight */
    int async_err;           /* first error of an unwaited io since wait_all */
    char async_detail[ZO_ERRMSG_LEN];

    /* checksum threads: verify reads off the engine threads */
    pthread_t *vthr;
    unsigned nvthr;
    pthread_mutex_t vlock;
    pthread_cond_t vcond;
    zo_queue vq;             /* chunks to checksum or verify, FIFO */
    int vstop;

    uint64_t arena_bytes, arena_files, allocated, nallocs;
    _Atomic uint64_t bytes_written, bytes_read, chunks_written, chunks_read, chunks_verified, chunks_zero;
    _Atomic uint64_t corrupt, csum_ns, io_errors;
    zo_errbuf err;           /* has its own lock: one whole message at a time */
    zo__swap_queue_fault_fn qfault; /* tests: fail the queueing of a chunk */
    void *qfault_user;
    zo__swap_grow_hook_fn ghook;    /* tests: runs while an arena is created */
    void *ghook_user;
};

static _Atomic unsigned swap_instances;

/* Record a failure in the store's message. API calls from any thread and
 * waiters finishing failed I/O (the store's mover among them) fail at the
 * same time; zo_errbuf takes its own lock, as in aio and every handle, so
 * zo_swap_errmsg() shows one whole message, never the bytes of two. Code
 * that needs the reason of a failure it just saw reads
 * zo_last_error_detail(), never s->err, which another thread may have
 * overwritten since. */
#define SWAP_FAIL(s_, code_, ...) ZO_FAIL(&(s_)->err, (code_), __VA_ARGS__)

ZO_API void zo_swap_config_default(zo_swap_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->arena_size = 1ull << 30;
    cfg->chunk_size = 1u << 20;
    cfg->checksum = ZO_CSUM_CRC32C;
    cfg->csum_threads = 1;
}

ZO_API const char *zo_swap_errmsg(const zo_swap *s)
{
    static _Thread_local char copy[ZO_ERRMSG_LEN]; /* a whole message, whatever completions write */
    return zo__errbuf_tls(s ? &s->err : NULL, copy);
}

ZO_API zo_aio *zo_swap_get_aio(zo_swap *s)
{
    return s ? s->aio : NULL;
}

void zo__swap_set_queue_fault(zo_swap *s, zo__swap_queue_fault_fn fn, void *user)
{
    s->qfault_user = user;
    s->qfault = fn;
}

void zo__swap_set_grow_hook(zo_swap *s, zo__swap_grow_hook_fn fn, void *user)
{
    s->ghook_user = user;
    s->ghook = fn;
}

/* ---- directories and arenas -------------------------------------------------- */
int zo__check_dir(zo_errbuf *eb, const char *what, const char *path)
{
    struct stat st;
    if (!path || !*path)
        return ZO_FAIL(eb, -EINVAL, "%s: empty directory path", what);
    if (lstat(path, &st) != 0)
        return ZO_FAIL(eb, -errno, "%s %s: %s", what, path, strerror(errno));
    if (S_ISLNK(st.st_mode))
        return ZO_FAIL(eb, -ELOOP, "%s %s is a symbolic link; give the real directory", what, path);
    if (!S_ISDIR(st.st_mode))
        return ZO_FAIL(eb, -ENOTDIR, "%s %s is not a directory", what, path);
    if (access(path, W_OK | X_OK) != 0)
        return ZO_FAIL(eb, -errno, "%s %s is not writable: %s", what, path, strerror(errno));
    if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
        return ZO_FAIL(eb, -EPERM,
                       "%s %s is writable by everyone without the sticky bit: another user could plant "
                       "files there; use a private directory",
                       what, path);
    return 0;
}

int zo__fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int r = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return r;
}

/* ---- arena files: creation, the life lock, stale leftovers --------------------------
 * Each arena file is held with flock(LOCK_EX) on a descriptor of its own
 * from just after it is created until the store closes it; the kernel drops
 * the lock when the process dies, however it dies. A file named like an
 * arena that nobody holds is therefore a leftover of a dead store: it is
 * reclaimed (unlinked) by the next store created in that directory, and a
 * restarted process whose pid is the dead one's (pid 1 in every container)
 * reclaims the file in its way instead of failing with -EEXIST. The lock is
 * the only evidence used: a pid says nothing across pid namespaces sharing
 * a directory. Between a file's creation and its lock it is empty, so
 * reclaiming skips empty files (they hold no space either). */

/* Does `name` look like an arena file, zo-swap.<pid>.<instance>.<n>? */
static int arena_name(const char *name)
{
    if (strncmp(name, "zo-swap.", 8) != 0)
        return 0;
    const char *p = name + 8;
    for (int field = 0; field < 3; field++) {
        if (*p < '0' || *p > '9')
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
        if (field < 2 && *p++ != '.')
            return 0;
    }
    return *p == 0;
}

/* Reclaim `name` in directory dirfd if it is a stale arena: a regular file
 * of ours, not empty, that nobody holds locked. 1: removed, 0: left alone
 * (live, empty, not ours, gone), <0: unlink failed. */
static int arena_reclaim(int dirfd, const char *dpath, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return 0; /* gone, a symlink (ELOOP) or unreadable: never ours to remove */
    int r = 0;
    struct stat st, now;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
        goto out;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        goto out; /* a live store holds it (or is just taking it) */
    /* the lock is ours: whoever created the file is gone, or has just
     * created it and waits for our lock to take its own (then it is still
     * empty). Remove only a file that is still the one we locked. */
    if (fstat(fd, &st) != 0 || st.st_size == 0 || fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0 ||
        now.st_ino != st.st_ino || now.st_dev != st.st_dev)
        goto out;
    if (unlinkat(dirfd, name, 0) != 0) {
        r = -errno;
        ZO_LOGW("swap: cannot remove stale arena %s/%s: %s", dpath, name, strerror(errno));
        goto out;
    }
    ZO_LOGI("swap: removed stale arena %s/%s (%llu bytes) left by a store that is gone", dpath, name,
            (unsigned long long)st.st_size);
    r = 1;
out:
    close(fd); /* drops our flock */
    return r;
}

/* Remove every stale arena in directory `path`. Returns the number removed;
 * a directory that cannot be listed is logged and skipped (the store works
 * without the space). */
static int arenas_reclaim_dir(const char *path)
{
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!dir) {
        ZO_LOGW("swap: cannot list %s for stale arenas: %s", path, strerror(errno));
        if (dfd >= 0)
            close(dfd);
        return 0;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dir)))
        if (arena_name(de->d_name) && arena_reclaim(dirfd(dir), path, de->d_name) == 1)
            n++;
    closedir(dir);
    return n;
}

/* Create `path` (O_EXCL, O_NOFOLLOW, 0600) and take its life lock. The
 * lock waits for a reclaimer that may hold it for an instant. 0 and *fd,
 * or -errno (-EEXIST: the name is taken; -ELOOP: a symlink is planted). */
static int arena_file_create(const char *path, int *fd)
{
    int f = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (f < 0)
        return -errno;
    while (flock(f, LOCK_EX) != 0) {
        if (errno == EINTR)
            continue;
        int r = -errno;
        unlink(path);
        close(f);
        return r;
    }
    *fd = f;
    return 0;
}

static void arena_close(zo_swap *s, arena *ar)
{
    if (!ar)
        return;
    zo_file_close(&ar->f);
    if (!s->cfg.keep_files && ar->path && unlink(ar->path) != 0)
        ZO_LOGW("could not remove arena %s: %s", ar->path, strerror(errno));
    /* unlock last: until then no other store may take the file for stale */
    if (ar->lockfd >= 0)
        close(ar->lockfd);
    zo__ext_fini(&ar->ext);
    free(ar->path);
    free(ar);
}

/* Create an arena of `size` bytes in directory d and reserve it with
 * fallocate. Called WITHOUT s->lock: the reservation of a large arena
 * takes long (a second per GiB on some filesystems), and completions and
 * every other call need the lock meanwhile. The arena is private to the
 * caller until arena_publish(). */
static int arena_create(zo_swap *s, swap_dir *d, uint64_t size, arena **out)
{
    int r;
    *out = NULL;
    arena *ar = calloc(1, sizeof(*ar));
    size_t plen = strlen(d->path) + 64;
    if (!ar || !(ar->path = malloc(plen))) {
        free(ar);
        return -ENOMEM;
    }
    ar->lockfd = -1;
    unsigned seq = atomic_fetch_add(&s->arena_seq, 1);
    for (int attempt = 0;; attempt++) {
        snprintf(ar->path, plen, "%s/zo-swap.%ld.%u.%u", d->path, (long)getpid(), s->instance, seq);
        r = arena_file_create(ar->path, &ar->lockfd);
        if (r != -EEXIST || attempt == 16)
            break;
        /* Our name is taken. A stale arena of a dead store that had our pid
         * (a restarted container) is reclaimed and the name reused; a live
         * one (another pid namespace sharing the directory), an empty
         * leftover or anything planted (never followed) makes us take the
         * next name. */
        int dfd = open(d->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int rr = dfd >= 0 ? arena_reclaim(dfd, d->path, strrchr(ar->path, '/') + 1) : 0;
        if (dfd >= 0)
            close(dfd);
        if (rr != 1)
            seq = atomic_fetch_add(&s->arena_seq, 1);
    }
    if (r < 0) {
        SWAP_FAIL(s, r, "swap: cannot create arena %s: %s", ar->path, zo_strerror(r));
        free(ar->path);
        free(ar);
        return r;
    }
    unsigned fl = ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_NOFOLLOW;
    if (s->cfg.buffered)
        fl |= ZO_FILE_BUFFERED;
    r = zo_file_open(&ar->f, ar->path, fl);
    if (r < 0) {
        SWAP_FAIL(s, r, "swap: cannot open arena %s: %s", ar->path, zo_strerror(r));
        goto fail;
    }
    r = ZO_UNLIKELY(s->ghook != NULL) ? s->ghook(s->ghook_user, ar->path) : 0;
    if (r < 0) {
        SWAP_FAIL(s, r, "swap: cannot reserve %llu bytes for arena %s: %s", (unsigned long long)size, ar->path,
                  zo_strerror(r));
        goto fail;
    }
    r = zo_file_allocate(ar->f, 0, size);
    if (r == -EOPNOTSUPP) {
        /* the filesystem cannot reserve: size the file and say so */
        ZO_LOGW("swap: %s cannot be preallocated (fallocate unsupported); a full disk will show up as "
                "write errors",
                ar->path);
        r = zo_file_truncate(ar->f, size);
    }
    if (r < 0) {
        SWAP_FAIL(s, r, "swap: cannot reserve %llu bytes for arena %s: %s", (unsigned long long)size, ar->path,
                  zo_strerror(r));
        goto fail;
    }
    ar->fi.offset_align = SWAP_GRANULE;
    if (zo_file_get_info(ar->f, &ar->fi) != 0) {
        memset(&ar->fi, 0, sizeof(ar->fi));
        ar->fi.offset_align = SWAP_GRANULE;
        ar->fi.direct = !s->cfg.buffered;
    }
    /* extents start and end on the direct-I/O alignment of this file */
    r = zo__ext_init(&ar->ext, size, ZO_MAX((uint64_t)SWAP_GRANULE, (uint64_t)ar->fi.offset_align));
    if (r < 0)
        goto fail;
    *out = ar;
    return 0;
fail:
    zo_file_close(&ar->f);
    unlink(ar->path);
    close(ar->lockfd);
    free(ar->path);
    free(ar);
    return r;
}

/* Make room in d's arena list for one more (done before the lock is
 * dropped for a growth, so publishing cannot fail). Under s->lock. */
static int dir_reserve(swap_dir *d)
{
    if (d->narenas < d->cap)
        return 0;
    unsigned cap = d->cap ? d->cap * 2 : 4;
    arena **a = realloc(d->arenas, cap * sizeof(*a));
    if (!a)
        return -ENOMEM;
    d->arenas = a;
    d->cap = cap;
    return 0;
}

/* Add a created arena to d, visible to every allocation. Under s->lock,
 * after dir_reserve(). */
static void arena_publish(zo_swap *s, swap_dir *d, arena *ar)
{
    d->arenas[d->narenas++] = ar;
    s->arena_bytes += ar->ext.size;
    s->arena_files++;
    if (!s->info_set) {
        s->info.direct = ar->fi.direct;
        s->info.io_align = ZO_MAX(ar->fi.offset_align, ar->fi.mem_align);
        if (s->info.io_align < SWAP_GRANULE)
            s->info.io_align = SWAP_GRANULE;
        snprintf(s->info.fallback, sizeof(s->info.fallback), "%s", ar->fi.fallback);
        s->info_set = 1;
        if (!ar->fi.direct)
            ZO_LOGI("swap: %s opened buffered: %s", ar->path, ar->fi.fallback);
    }
}

/* ---- placement ------------------------------------------------------------------ */
static int seg_push(stripe *st, unsigned *cap, seg sg)
{
    if (st->nsegs == *cap) {
        unsigned c = *cap ? *cap * 2 : 2;
        seg *n = realloc(st->segs, c * sizeof(*n));
        if (!n)
            return -ENOMEM;
        st->segs = n;
        *cap = c;
    }
    st->segs[st->nsegs++] = sg;
    return 0;
}

static void stripe_release(stripe *st)
{
    for (unsigned i = 0; i < st->nsegs; i++)
        zo__ext_free(&st->segs[i].ar->ext, st->segs[i].foff, st->segs[i].len);
    free(st->segs);
    st->segs = NULL;
    st->nsegs = 0;
}

/* The single-extent placement: record the extent, or give it back to the
 * arena when the segment list cannot grow (ENOMEM), so nothing leaks. */
static int seg_push_or_free(stripe *st, unsigned *cap, arena *ar, uint64_t off, uint64_t need)
{
    uint64_t len = zo__ext_round(&ar->ext, need);
    int r = seg_push(st, cap, (seg){ar, off, 0, len});
    if (r < 0)
        zo__ext_free(&ar->ext, off, len);
    return r;
}

/* Place a stripe of `len` payload bytes in directory d: one extent in an
 * existing arena, else a new arena, else (max_bytes reached) pieces of
 * whole chunks from the free space left. Called with s->lock held; drops
 * it while a new arena is created (see arena_create()). One thread at a
 * time grows a directory: the others wait for its arena and look again,
 * so concurrent allocations do not each add an arena. Bytes being created
 * count against max_bytes, and a thread that would exceed it waits for the
 * growths in flight before it settles for the free space. */
static int stripe_place(zo_swap *s, swap_dir *d, uint64_t len, stripe *st)
{
    uint64_t chunk = s->cfg.chunk_size;
    uint64_t need = ZO_ALIGN_UP(len, s->granule);
    uint64_t align = len >= chunk ? chunk : s->granule;
    unsigned cap = 0;
    st->len = len;
    uint64_t off;
    uint64_t size = ZO_MAX(s->cfg.arena_size, ZO_ALIGN_UP(need, chunk));
    char why[ZO_ERRMSG_LEN];
    int r;
    for (;;) {
        for (unsigned i = 0; i < d->narenas; i++)
            if (zo__ext_alloc(&d->arenas[i]->ext, need, align, &off) == 0)
                return seg_push_or_free(st, &cap, d->arenas[i], off, need);
        uint64_t ahead = s->arena_bytes + s->growing_bytes;
        int over = s->cfg.max_bytes && (ahead > s->cfg.max_bytes || size > s->cfg.max_bytes - ahead);
        if (d->growing || (over && s->growing_bytes)) {
            pthread_cond_wait(&s->gcond, &s->lock);
            continue;
        }
        if (over) {
            snprintf(why, sizeof(why), "swap: growing by %llu bytes would exceed max_bytes %llu (arenas hold %llu)",
                     (unsigned long long)size, (unsigned long long)s->cfg.max_bytes,
                     (unsigned long long)s->arena_bytes);
            break;
        }
        if ((r = dir_reserve(d)) < 0)
            return r;
        d->growing = 1;
        s->growing_bytes += size;
        pthread_mutex_unlock(&s->lock);
        arena *ar;
        r = arena_create(s, d, size, &ar);
        pthread_mutex_lock(&s->lock);
        d->growing = 0;
        s->growing_bytes -= size;
        pthread_cond_broadcast(&s->gcond);
        if (r < 0)
            return r;
        /* the arena is still ours alone: take our extent before others see it */
        r = zo__ext_alloc(&ar->ext, need, align, &off);
        arena_publish(s, d, ar);
        if (r < 0)
            return SWAP_FAIL(s, ZO_EINTERNAL, "swap: a fresh arena of %llu bytes cannot hold %llu",
                             (unsigned long long)size, (unsigned long long)need);
        return seg_push_or_free(st, &cap, ar, off, need);
    }
    /* No room to grow: gather whole chunks from the free space. A piece may
     * start at any granule: chunk_locate() only needs every piece but the
     * last to hold whole chunks, so that no chunk (its I/O and checksum)
     * straddles two pieces; O_DIRECT only needs the granule. Asking for chunk
     * alignment here would refuse free space that holds the bytes. */
    uint64_t soff = 0;
    while (soff < need) {
        arena *best = NULL;
        uint64_t best_len = 0;
        for (unsigned i = 0; i < d->narenas; i++) {
            uint64_t l = zo__ext_largest(&d->arenas[i]->ext);
            if (l > best_len) {
                best_len = l;
                best = d->arenas[i];
            }
        }
        uint64_t want = need - soff;
        uint64_t take = want <= best_len ? want : best_len / chunk * chunk;
        if (!best || take == 0 || zo__ext_alloc(&best->ext, take, s->granule, &off) < 0) {
            stripe_release(st);
            return SWAP_FAIL(s, ZO_EBUDGET, "%s; the free space left in %s is too fragmented or too small",
                             why, d->path);
        }
        take = zo__ext_round(&best->ext, take);
        r = seg_push(st, &cap, (seg){best, off, soff, take});
        if (r < 0) {
            zo__ext_free(&best->ext, off, take);
            stripe_release(st);
            return r;
        }
        soff += take;
    }
    return 0;
}

/* File location of chunk `idx` of allocation al. */
static void chunk_locate(const zo_swap *s, const salloc *al, uint64_t idx, arena **ar, uint64_t *foff)
{
    unsigned nd = s->ndirs;
    unsigned d = (unsigned)((al->first_dir + idx) % nd);
    uint64_t soff = (idx / nd) * s->cfg.chunk_size;
    const stripe *st = &al->stripes[d];
    const seg *sg = &st->segs[0];
    for (unsigned i = 1; i < st->nsegs && st->segs[i].soff <= soff; i++)
        sg = &st->segs[i];
    *ar = sg->ar;
    *foff = sg->foff + (soff - sg->soff);
}

/* ---- create / destroy ------------------------------------------------------------ */
static void salloc_free(zo_swap *s, salloc *al)
{
    if (!al)
        return;
    if (al->stripes)
        for (unsigned d = 0; d < s->ndirs; d++)
            stripe_release(&al->stripes[d]);
    free(al->stripes);
    free(al->csum);
    free((void *)al->cstate);
    free(al);
}

ZO_API void zo_swap_destroy(zo_swap **sp)
{
    if (!sp || !*sp)
        return;
    zo_swap *s = *sp;
    zo_swap_wait_all(s);
    if (s->nvthr) {
        pthread_mutex_lock(&s->vlock);
        s->vstop = 1;
        pthread_cond_broadcast(&s->vcond);
        pthread_mutex_unlock(&s->vlock);
        for (unsigned i = 0; i < s->nvthr; i++)
            pthread_join(s->vthr[i], NULL);
    }
    free(s->vthr);
    pthread_mutex_destroy(&s->vlock);
    pthread_cond_destroy(&s->vcond);
    for (size_t i = 0; i < s->ntab; i++)
        salloc_free(s, s->tab[i]);
    for (unsigned d = 0; d < s->ndirs; d++) {
        for (unsigned i = 0; i < s->dirs[d].narenas; i++)
            arena_close(s, s->dirs[d].arenas[i]);
        free(s->dirs[d].arenas);
        free(s->dirs[d].path);
    }
    free(s->dirs);
    free(s->tab);
    free(s->gen);
    free(s->free_slots);
    zo_aio_destroy(&s->own_aio);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    pthread_cond_destroy(&s->gcond);
    free(s);
    *sp = NULL;
}

static void *csum_main(void *arg);

ZO_API int zo_swap_create(zo_swap **out, const zo_swap_config *ucfg)
{
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_swap_create: out is NULL");
    *out = NULL;
    if (!ucfg)
        return ZO_FAIL(NULL, -EINVAL, "zo_swap_create: a config with at least one directory is required");
    zo_swap_config cfg;
    zo_swap_config_default(&cfg);
    ZO_CHECK(ZO_STRUCT_IN(&cfg, ucfg, offsetof(zo_swap_config, dirs) + sizeof(ucfg->dirs), NULL, "zo_swap_create"));
    if (!cfg.dirs || cfg.ndirs == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_swap_create: no swap directory given");
    if (cfg.ndirs > ZO_SWAP_MAX_DIRS)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_swap_create: ndirs %u exceeds %d", cfg.ndirs, ZO_SWAP_MAX_DIRS);
    if (!ZO_IS_POW2(cfg.chunk_size) || cfg.chunk_size < 4096 || cfg.chunk_size > (1u << 30))
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_swap_create: chunk_size %zu must be a power of two in [4096, 1 GiB]",
                       cfg.chunk_size);
    if (cfg.checksum != ZO_CSUM_NONE && cfg.checksum != ZO_CSUM_CRC32C && cfg.checksum != ZO_CSUM_XXH3)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_swap_create: unknown checksum %d", (int)cfg.checksum);
    if (!zo_csum_available(cfg.checksum))
        return ZO_FAIL(NULL, ZO_ENOTSUP, "zo_swap_create: checksum %s not built in (libxxhash missing)",
                       zo_csum_name(cfg.checksum));
    if (cfg.csum_threads > 64)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_swap_create: csum_threads %u is absurd (at most 64)", cfg.csum_threads);
    /* a small run sizes its arenas from what it needs: anything from one
     * byte is fine and rounds up to whole chunks (one at least) */
    if (cfg.arena_size == 0 || cfg.arena_size > (1ull << 56))
        return ZO_FAIL(NULL, ZO_ECONFIG,
                       "zo_swap_create: arena_size %llu must be in [1, 2^56] (it is rounded up to chunk_size)",
                       (unsigned long long)cfg.arena_size);
    cfg.arena_size = ZO_ALIGN_UP(cfg.arena_size, (uint64_t)cfg.chunk_size);
    for (unsigned i = 0; i < cfg.ndirs; i++) {
        int r = zo__check_dir(NULL, "swap directory", cfg.dirs[i]);
        if (r < 0)
            return r;
        for (unsigned j = 0; j < i; j++)
            if (strcmp(cfg.dirs[i], cfg.dirs[j]) == 0)
                return ZO_FAIL(NULL, ZO_ECONFIG, "zo_swap_create: directory %s given twice", cfg.dirs[i]);
    }

    zo_swap *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_cond_init(&s->gcond, NULL);
    pthread_mutex_init(&s->vlock, NULL);
    pthread_cond_init(&s->vcond, NULL);
    zo_queue_init(&s->vq);
    s->cfg = cfg;
    s->cfg.dirs = NULL;
    s->ndirs = cfg.ndirs;
    s->instance = atomic_fetch_add(&swap_instances, 1);
    s->granule = SWAP_GRANULE;
    s->info.chunk_size = cfg.chunk_size;
    s->info.ndirs = cfg.ndirs;
    s->info.checksum = cfg.checksum;
    s->info.io_align = SWAP_GRANULE;
    s->info.direct = !cfg.buffered;
    int r = 0;
    s->dirs = calloc(cfg.ndirs, sizeof(*s->dirs));
    if (!s->dirs) {
        r = -ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < cfg.ndirs; i++) {
        s->dirs[i].path = strdup(cfg.dirs[i]);
        if (!s->dirs[i].path) {
            r = -ENOMEM;
            goto fail;
        }
        /* drop trailing slashes so file names read well */
        size_t l = strlen(s->dirs[i].path);
        while (l > 1 && s->dirs[i].path[l - 1] == '/')
            s->dirs[i].path[--l] = 0;
    }
    if (cfg.checksum != ZO_CSUM_NONE && cfg.csum_threads) {
        s->vthr = calloc(cfg.csum_threads, sizeof(*s->vthr));
        if (!s->vthr) {
            r = -ENOMEM;
            goto fail;
        }
        for (; s->nvthr < cfg.csum_threads; s->nvthr++) {
            int e = pthread_create(&s->vthr[s->nvthr], NULL, csum_main, s);
            if (e) {
                r = ZO_FAIL(NULL, -e, "zo_swap_create: cannot start a checksum thread: %s", strerror(e));
                goto fail;
            }
        }
    }
    if (cfg.aio) {
        s->aio = cfg.aio;
    } else {
        r = zo_aio_create(&s->own_aio, cfg.aio_cfg);
        if (r < 0)
            goto fail;
        s->aio = s->own_aio;
    }
    for (unsigned i = 0; i < cfg.ndirs; i++)
        arenas_reclaim_dir(s->dirs[i].path);
    if (cfg.reserve) {
        uint64_t size = ZO_ALIGN_UP(cfg.reserve, (uint64_t)cfg.chunk_size);
        if (cfg.max_bytes && size > cfg.max_bytes / cfg.ndirs) {
            r = ZO_FAIL(NULL, ZO_EBUDGET, "zo_swap_create: reserve %llu bytes in each of %u directories exceeds max_bytes %llu",
                        (unsigned long long)size, cfg.ndirs, (unsigned long long)cfg.max_bytes);
            goto fail;
        }
        /* nobody else knows s yet: no lock needed while the arenas grow */
        for (unsigned i = 0; i < cfg.ndirs && r == 0; i++) {
            arena *ar;
            r = arena_create(s, &s->dirs[i], size, &ar);
            if (r == 0 && (r = dir_reserve(&s->dirs[i])) < 0)
                arena_close(s, ar);
            else if (r == 0)
                arena_publish(s, &s->dirs[i], ar);
        }
        if (r < 0)
            goto fail;
    }
    *out = s;
    return 0;
fail:
    zo_swap_destroy(&s);
    return r;
}

/* ---- allocations ----------------------------------------------------------------- */
static salloc *lookup(zo_swap *s, zo_swap_id id)
{
    uint64_t idx = (id & 0xffffffffu);
    if (idx == 0 || idx > s->ntab)
        return NULL;
    salloc *al = s->tab[idx - 1];
    return al && al->id == id ? al : NULL;
}

ZO_API int zo_swap_alloc(zo_swap *s, uint64_t bytes, const char *name, zo_swap_id *id)
{
    if (!s || !id || bytes == 0)
        return s ? SWAP_FAIL(s, -EINVAL, "zo_swap_alloc: %s", !id ? "NULL argument" : "0 bytes")
                 : ZO_FAIL(NULL, -EINVAL, "zo_swap_alloc: NULL store");
    if (bytes > (1ull << 56))
        return SWAP_FAIL(s, -EFBIG, "zo_swap_alloc: %llu bytes is too large", (unsigned long long)bytes);
    *id = 0;
    uint64_t chunk = s->cfg.chunk_size;
    salloc *al = calloc(1, sizeof(*al));
    if (!al)
        return -ENOMEM;
    al->bytes = bytes;
    al->nchunks = (bytes + chunk - 1) / chunk;
    snprintf(al->name, sizeof(al->name), "%s", name && *name ? name : "(unnamed)");
    al->csum = calloc(al->nchunks, sizeof(*al->csum));
    al->cstate = calloc(al->nchunks, sizeof(*al->cstate));
    al->stripes = calloc(s->ndirs, sizeof(*al->stripes));
    if (!al->csum || !al->cstate || !al->stripes) {
        salloc_free(s, al);
        return -ENOMEM;
    }
    int r = 0;
    pthread_mutex_lock(&s->lock);
    al->first_dir = s->next_dir;
    s->next_dir = (s->next_dir + 1) % s->ndirs;
    uint64_t last_len = bytes - (al->nchunks - 1) * chunk;
    unsigned last_dir = (unsigned)((al->first_dir + al->nchunks - 1) % s->ndirs);
    for (unsigned k = 0; k < s->ndirs && r == 0; k++) {
        unsigned d = (al->first_dir + k) % s->ndirs;
        uint64_t n = al->nchunks / s->ndirs + (k < al->nchunks % s->ndirs ? 1 : 0);
        if (n == 0)
            continue;
        uint64_t len = n * chunk - (d == last_dir ? chunk - last_len : 0);
        r = stripe_place(s, &s->dirs[d], len, &al->stripes[d]);
    }
    if (r == 0) {
        size_t slot;
        if (s->nfree_slots) {
            slot = s->free_slots[--s->nfree_slots];
        } else {
            if (s->ntab == s->captab) {
                size_t cap = s->captab ? s->captab * 2 : 64;
                salloc **t = realloc(s->tab, cap * sizeof(*t));
                if (t)
                    s->tab = t;
                uint32_t *g = t ? realloc(s->gen, cap * sizeof(*g)) : NULL;
                if (g)
                    s->gen = g;
                uint32_t *f = g ? realloc(s->free_slots, cap * sizeof(*f)) : NULL;
                if (f)
                    s->free_slots = f;
                if (!f)
                    r = -ENOMEM;
                else
                    s->captab = cap;
            }
            slot = s->ntab;
            if (r == 0) {
                s->gen[s->ntab] = 0;
                s->tab[s->ntab++] = NULL;
            }
        }
        if (r == 0) {
            s->gen[slot]++;
            al->id = ((uint64_t)s->gen[slot] << 32) | (uint64_t)(slot + 1);
            s->tab[slot] = al;
            for (unsigned d = 0; d < s->ndirs; d++)
                for (unsigned i = 0; i < al->stripes[d].nsegs; i++)
                    s->allocated += al->stripes[d].segs[i].len;
            s->nallocs++;
            *id = al->id;
        }
    }
    if (r < 0) {
        char why[ZO_ERRMSG_LEN];
        snprintf(why, sizeof(why), "%s", r == -ENOMEM ? "out of memory" : zo_last_error_detail());
        SWAP_FAIL(s, r, "zo_swap_alloc of %llu bytes for '%s': %s", (unsigned long long)bytes, al->name, why);
        salloc_free(s, al);
    }
    pthread_mutex_unlock(&s->lock);
    return r;
}

ZO_API int zo_swap_free(zo_swap *s, zo_swap_id id)
{
    if (!s)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    salloc *al = lookup(s, id);
    if (!al) {
        pthread_mutex_unlock(&s->lock);
        return SWAP_FAIL(s, -ENOENT, "zo_swap_free: unknown handle 0x%llx", (unsigned long long)id);
    }
    if (al->inflight) {
        pthread_mutex_unlock(&s->lock);
        return SWAP_FAIL(s, -EBUSY, "zo_swap_free: '%s' has %u I/O in flight", al->name, al->inflight);
    }
    size_t slot = (size_t)(id & 0xffffffffu) - 1;
    s->tab[slot] = NULL;
    s->free_slots[s->nfree_slots++] = (uint32_t)slot;
    for (unsigned d = 0; d < s->ndirs; d++)
        for (unsigned i = 0; i < al->stripes[d].nsegs; i++)
            s->allocated -= al->stripes[d].segs[i].len;
    s->nallocs--;
    salloc_free(s, al);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

ZO_API uint64_t zo_swap_size(zo_swap *s, zo_swap_id id)
{
    if (!s)
        return 0;
    pthread_mutex_lock(&s->lock);
    salloc *al = lookup(s, id);
    uint64_t b = al ? al->bytes : 0;
    pthread_mutex_unlock(&s->lock);
    return b;
}

/* ---- I/O --------------------------------------------------------------------------- */
static void io_set_error(zo_swap_io *io, int err, const char *fmt, ...) ZO_PRINTF(3, 4);
static void io_set_error(zo_swap_io *io, int err, const char *fmt, ...)
{
    int zero = 0;
    if (!atomic_compare_exchange_strong(&io->err, &zero, err))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(io->detail, sizeof(io->detail), fmt, ap);
    va_end(ap);
}

static void io_complete(zo_swap_io *io)
{
    zo_swap *s = io->s;
    int err = atomic_load(&io->err);
    if (err < 0)
        ZO_LOGD("swap io on '%s' failed: %s", io->al->name, io->detail);
    if (io->waitable) {
        pthread_mutex_lock(&s->lock);
        io->al->inflight--;
        io->done = 1;
        s->inflight--;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        return;
    }
    zo_swap_cb cb = io->cb;
    void *user = io->user;
    pthread_mutex_lock(&s->lock);
    io->al->inflight--;
    if (!cb && err < 0 && s->async_err == 0) {
        s->async_err = err;
        snprintf(s->async_detail, sizeof(s->async_detail), "%s", io->detail);
    }
    pthread_mutex_unlock(&s->lock);
    if (err < 0)
        zo__fail(NULL, err, ZO_MODULE, "%s", io->detail);
    free(io);
    if (cb)
        cb(user, err);
    pthread_mutex_lock(&s->lock);
    s->inflight--;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void io_put(zo_swap_io *io, uint64_t n)
{
    if (atomic_fetch_sub(&io->pending, n) == n)
        io_complete(io);
}

static void chunk_failed(chunk_ctx *c, int e)
{
    zo_swap_io *io = c->io;
    zo_swap *s = io->s;
    atomic_fetch_add(&s->io_errors, 1);
    io_set_error(io, e, "swap %s of '%s' offset %llu (%u bytes; arena %s offset %llu) failed: %s",
                 io->op == IO_WRITE ? "write" : "read", io->al->name,
                 (unsigned long long)(c->idx * s->cfg.chunk_size), c->len, c->ar->path, (unsigned long long)c->foff,
                 zo_strerror(e));
}

/* A write chunk is done when both its I/O and its checksum are: only then
 * may a read trust the stored checksum. */
static void write_part_done(chunk_ctx *c)
{
    if (atomic_fetch_sub(&c->parts, 1) != 1)
        return;
    zo_swap_io *io = c->io;
    zo_swap *s = io->s;
    if (c->res < 0 || (uint64_t)c->res != c->len) {
        chunk_failed(c, c->res < 0 ? (int)c->res : -EIO);
        atomic_store(&io->al->cstate[c->idx], CH_FAILED);
    } else {
        atomic_store(&io->al->cstate[c->idx], CH_VALID);
        atomic_fetch_add(&s->bytes_written, c->len);
        atomic_fetch_add(&s->chunks_written, 1);
    }
    io_put(io, 1);
}

static void verify_chunk(chunk_ctx *c)
{
    zo_swap_io *io = c->io;
    zo_swap *s = io->s;
    salloc *al = io->al;
    uint64_t t0 = zo__now_ns();
    uint64_t got = zo__csum(s->cfg.checksum, c->buf, c->len);
    atomic_fetch_add(&s->csum_ns, zo__now_ns() - t0);
    atomic_fetch_add(&s->chunks_verified, 1);
    if (got != al->csum[c->idx]) {
        atomic_fetch_add(&s->corrupt, 1);
        io_set_error(io, ZO_ECORRUPT,
                     "swap: '%s' corrupt at byte offset %llu (chunk %llu, %u bytes; arena %s offset "
                     "%llu): %s 0x%llx, stored 0x%llx",
                     al->name, (unsigned long long)(c->idx * s->cfg.chunk_size), (unsigned long long)c->idx, c->len,
                     c->ar->path, (unsigned long long)c->foff, zo_csum_name(s->cfg.checksum), (unsigned long long)got,
                     (unsigned long long)al->csum[c->idx]);
    }
    io_put(io, 1);
}

/* The checksum of a chunk being written (its I/O is in flight). */
static void write_csum(chunk_ctx *c)
{
    zo_swap *s = c->io->s;
    uint64_t t0 = zo__now_ns();
    c->io->al->csum[c->idx] = zo__csum(s->cfg.checksum, c->buf, c->len);
    atomic_fetch_add(&s->csum_ns, zo__now_ns() - t0);
    write_part_done(c);
}

static void *csum_main(void *arg)
{
    zo_swap *s = arg;
    pthread_mutex_lock(&s->vlock);
    for (;;) {
        while (zo_queue_empty(&s->vq) && !s->vstop)
            pthread_cond_wait(&s->vcond, &s->vlock);
        zo_qnode *n = zo_queue_pop(&s->vq);
        if (!n)
            break;
        chunk_ctx *c = zo_queue_entry(n, chunk_ctx, vnode);
        pthread_mutex_unlock(&s->vlock);
        if (c->io->op == IO_WRITE)
            write_csum(c);
        else
            verify_chunk(c);
        pthread_mutex_lock(&s->vlock);
    }
    pthread_mutex_unlock(&s->vlock);
    return NULL;
}

/* Hand a chunk to the checksum threads. */
static void csum_queue(zo_swap *s, chunk_ctx *c)
{
    pthread_mutex_lock(&s->vlock);
    zo_queue_push(&s->vq, &c->vnode);
    pthread_cond_signal(&s->vcond);
    pthread_mutex_unlock(&s->vlock);
}

static void chunk_done(void *user, int64_t res)
{
    chunk_ctx *c = user;
    zo_swap_io *io = c->io;
    zo_swap *s = io->s;
    c->res = res;
    if (io->op == IO_WRITE) {
        write_part_done(c);
        return;
    }
    if (res < 0 || (uint64_t)res != c->len) {
        chunk_failed(c, res < 0 ? (int)res : -EIO);
        io_put(io, 1);
        return;
    }
    atomic_fetch_add(&s->bytes_read, c->len);
    atomic_fetch_add(&s->chunks_read, 1);
    if (s->cfg.checksum == ZO_CSUM_NONE) {
        io_put(io, 1);
    } else if (s->nvthr) {
        /* verify off the engine thread: it goes back to reaping and
         * submitting while a checksum thread reads the chunk */
        csum_queue(s, c);
    } else {
        verify_chunk(c);
    }
}

static int io_start(zo_swap *s, int op, zo_swap_id id, uint64_t off, void *buf, size_t len, zo_swap_cb cb,
                    void *user, zo_swap_io **out)
{
    const char *fn = op == IO_WRITE ? "zo_swap_write" : "zo_swap_read";
    if (!s)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL store", fn);
    if (out)
        *out = NULL;
    if (!buf || len == 0)
        return SWAP_FAIL(s, -EINVAL, "%s: %s", fn, buf ? "len 0" : "NULL buffer");
    uint64_t chunk = s->cfg.chunk_size;
    pthread_mutex_lock(&s->lock);
    salloc *al = lookup(s, id);
    if (!al) {
        pthread_mutex_unlock(&s->lock);
        return SWAP_FAIL(s, -ENOENT, "%s: unknown handle 0x%llx", fn, (unsigned long long)id);
    }
    if (off > al->bytes || len > al->bytes - off || (off % chunk) != 0 ||
        ((off + len) % chunk != 0 && off + len != al->bytes)) {
        pthread_mutex_unlock(&s->lock);
        return SWAP_FAIL(s, -EINVAL,
                         "%s: range [%llu, +%zu) of '%s' (%llu bytes) must lie inside it and start and end on "
                         "%llu-byte chunk boundaries (or at its end)",
                         fn, (unsigned long long)off, len, al->name, (unsigned long long)al->bytes,
                         (unsigned long long)chunk);
    }
    uint64_t c0 = off / chunk, nc = (len + chunk - 1) / chunk;
    zo_swap_io *io = calloc(1, sizeof(*io) + nc * sizeof(chunk_ctx));
    if (!io) {
        pthread_mutex_unlock(&s->lock);
        return -ENOMEM;
    }
    io->s = s;
    io->al = al;
    io->op = op;
    io->waitable = out != NULL;
    io->cb = out ? NULL : cb;
    io->user = user;
    io->nctx = nc;
    atomic_init(&io->pending, nc + 1);
    al->inflight++;
    s->inflight++;
    for (uint64_t i = 0; i < nc; i++) {
        chunk_ctx *c = &io->ctx[i];
        c->io = io;
        c->idx = c0 + i;
        c->buf = (uint8_t *)buf + i * chunk;
        c->len = (uint32_t)ZO_MIN(chunk, len - i * chunk);
        chunk_locate(s, al, c->idx, &c->ar, &c->foff);
    }
    pthread_mutex_unlock(&s->lock);
    if (out)
        *out = io;

    uint64_t submitted = 0;
    for (uint64_t i = 0; i < nc; i++) {
        chunk_ctx *c = &io->ctx[i];
        int r;
        if (op == IO_WRITE) {
            /* queue the write first and checksum the buffer while it is in
             * flight (it may not change until completion), on a checksum
             * thread when there is one: neither the device nor the caller
             * (often an engine thread, from a callback) waits for the CPU;
             * the chunk is valid once both are done */
            uint8_t prev = atomic_exchange(&al->cstate[c->idx], CH_PENDING);
            atomic_init(&c->parts, 2);
            r = ZO_UNLIKELY(s->qfault != NULL) ? s->qfault(s->qfault_user, 1, c->idx) : 0;
            if (r == 0)
                r = zo_aio_write(s->aio, c->ar->f, c->buf, c->len, c->foff, chunk_done, c, NULL);
            if (r < 0) {
                /* A refused submission wrote nothing: this chunk and the
                 * rest still hold their old contents and checksums. If no
                 * chunk of this write was queued, the range is unchanged
                 * and stays readable. Otherwise it is a mix of new and old
                 * chunks: mark every chunk not queued as failed, so the
                 * range never reads back as a blend of two versions. */
                if (submitted == 0)
                    atomic_store(&al->cstate[c->idx], prev);
                else
                    for (uint64_t j = i; j < nc; j++)
                        atomic_store(&al->cstate[io->ctx[j].idx], CH_FAILED);
            } else if (s->cfg.checksum == ZO_CSUM_NONE)
                write_part_done(c);
            else if (s->nvthr)
                csum_queue(s, c);
            else
                write_csum(c);
        } else {
            uint8_t st = atomic_load(&al->cstate[c->idx]);
            if (st == CH_UNWRITTEN) {
                memset(c->buf, 0, c->len);
                atomic_fetch_add(&s->chunks_zero, 1);
                submitted++;
                io_put(io, 1);
                continue;
            }
            if (st != CH_VALID) {
                io_set_error(io, ZO_ESTATE, "swap read of '%s' offset %llu: the chunk's last write %s",
                             al->name, (unsigned long long)(c->idx * chunk),
                             st == CH_FAILED ? "failed, its contents are lost" : "has not completed");
                submitted++;
                io_put(io, 1);
                continue;
            }
            r = ZO_UNLIKELY(s->qfault != NULL) ? s->qfault(s->qfault_user, 0, c->idx) : 0;
            if (r == 0)
                r = zo_aio_read(s->aio, c->ar->f, c->buf, c->len, c->foff, chunk_done, c, NULL);
        }
        if (r < 0) {
            io_set_error(io, r, "%s of '%s' offset %llu: could not queue: %s", fn, al->name,
                         (unsigned long long)(c->idx * chunk), zo_strerror(r));
            break;
        }
        submitted++;
    }
    /* chunks never queued count as finished; then drop the submission guard */
    io_put(io, (nc - submitted) + 1);
    return 0;
}

ZO_API int zo_swap_write(zo_swap *s, zo_swap_id id, uint64_t off, const void *buf, size_t len, zo_swap_cb cb,
                         void *user, zo_swap_io **out)
{
    return io_start(s, IO_WRITE, id, off, (void *)buf, len, cb, user, out);
}

ZO_API int zo_swap_read(zo_swap *s, zo_swap_id id, uint64_t off, void *buf, size_t len, zo_swap_cb cb, void *user,
                        zo_swap_io **out)
{
    return io_start(s, IO_READ, id, off, buf, len, cb, user, out);
}

static int io_finish(zo_swap *s, zo_swap_io *io)
{
    int err = atomic_load(&io->err);
    if (err < 0)
        SWAP_FAIL(s, err, "%s", io->detail);
    free(io);
    return err;
}

ZO_API int zo_swap_wait(zo_swap *s, zo_swap_io *io)
{
    if (!s || !io)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    while (!io->done)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return io_finish(s, io);
}

ZO_API int zo_swap_test(zo_swap *s, zo_swap_io *io)
{
    if (!s || !io)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    int done = io->done;
    pthread_mutex_unlock(&s->lock);
    return done ? io_finish(s, io) : ZO_PENDING;
}

ZO_API int zo_swap_wait_all(zo_swap *s)
{
    if (!s)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    while (s->inflight)
        pthread_cond_wait(&s->cond, &s->lock);
    int err = s->async_err;
    char detail[ZO_ERRMSG_LEN];
    snprintf(detail, sizeof(detail), "%s", s->async_detail);
    s->async_err = 0;
    pthread_mutex_unlock(&s->lock);
    if (err < 0)
        SWAP_FAIL(s, err, "%s", detail);
    return err;
}

/* Waitable ios still in flight keep s->inflight up; zo_swap_wait_all()
 * waits for them too (their owners still have to zo_swap_wait() them). */

ZO_API int zo_swap_register_memory(zo_swap *s, void *p, size_t n, int *registered)
{
    if (!s)
        return -EINVAL;
    return zo_aio_register_region(s->aio, p, n, registered);
}

ZO_API int zo_swap_unregister_memory(zo_swap *s, void *p)
{
    if (!s)
        return -EINVAL;
    return zo_aio_unregister_region(s->aio, p);
}

ZO_API int zo_swap_get_info(const zo_swap *s, zo_swap_info *info)
{
    if (!s || !info)
        return -EINVAL;
    pthread_mutex_lock((pthread_mutex_t *)&s->lock);
    *info = s->info;
    pthread_mutex_unlock((pthread_mutex_t *)&s->lock);
    return 0;
}

ZO_API void zo_swap_get_stats(zo_swap *s, zo_swap_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof(*st));
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    st->arena_bytes = s->arena_bytes;
    st->arena_files = s->arena_files;
    st->allocated_bytes = s->allocated;
    st->allocations = s->nallocs;
    pthread_mutex_unlock(&s->lock);
    st->bytes_written = atomic_load(&s->bytes_written);
    st->bytes_read = atomic_load(&s->bytes_read);
    st->chunks_written = atomic_load(&s->chunks_written);
    st->chunks_read = atomic_load(&s->chunks_read);
    st->chunks_verified = atomic_load(&s->chunks_verified);
    st->chunks_zero = atomic_load(&s->chunks_zero);
    st->corrupt = atomic_load(&s->corrupt);
    st->csum_ns = atomic_load(&s->csum_ns);
    st->io_errors = atomic_load(&s->io_errors);
}
