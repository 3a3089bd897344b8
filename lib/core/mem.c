/* SPDX-License-Identifier: Apache-2.0 */
/* Host memory: aligned allocation, and pinned allocation (mmap, NUMA bind,
 * fault-in, MADV_DONTFORK, mlock, device registration) under a process-wide
 * budget, falling back to pageable memory when locking is refused. */
#define ZO_MODULE "mem"
#include "core/internal.h"
#include "core/list.h"
#include "core/pin_hooks.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#if ZO_HAVE_NUMA
#include <numaif.h>
#endif

#include <zoffload/mem.h>

/* the dev module's registration functions (core/pin_hooks.h); a device
 * handle in zo_pin_opts means one was opened, so they are set by then */
static _Atomic(const zo__pin_hooks *) pin_hooks;

void zo__pin_hooks_set(const zo__pin_hooks *h)
{
    atomic_store(&pin_hooks, h);
}

static int dev_register(struct zo_dev *d, void *p, size_t n)
{
    const zo__pin_hooks *h = atomic_load(&pin_hooks);
    return h ? h->host_register(d, p, n) : -EINVAL;
}

static void dev_unregister(struct zo_dev *d, void *p)
{
    const zo__pin_hooks *h = atomic_load(&pin_hooks);
    if (h)
        h->host_unregister(d, p);
}

static const char *dev_errmsg(const struct zo_dev *d)
{
    const zo__pin_hooks *h = atomic_load(&pin_hooks);
    return h ? h->errmsg(d) : "no device module";
}

#define HUGE_2M (2u << 20)

/* ---- aligned ---------------------------------------------------------------- */
ZO_API int zo_aligned_alloc(void **out, size_t size, size_t align)
{
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_aligned_alloc: out is NULL");
    *out = NULL;
    if (size == 0 || !ZO_IS_POW2(align) || align < sizeof(void *))
        return ZO_FAIL(NULL, -EINVAL, "zo_aligned_alloc: size %zu / alignment %zu invalid", size, align);
    void *p = NULL;
    int r = posix_memalign(&p, align, size);
    if (r)
        return ZO_FAIL(NULL, -r, "zo_aligned_alloc: %zu bytes: %s", size, strerror(r));
    *out = p;
    return 0;
}

ZO_API void zo_aligned_free(void *p)
{
    free(p);
}

/* ---- pinned ----------------------------------------------------------------- */
typedef struct pin_rec {
    void *p;
    size_t size, mapped;
    int node;
    unsigned flags;
    struct zo_dev *dev;
    zo_list link; /* on pin_list */
} pin_rec;

static pthread_mutex_t pin_lock = PTHREAD_MUTEX_INITIALIZER;
static zo_list pin_list = ZO_LIST_INIT(pin_list); /* pin_rec, under pin_lock */
static size_t pin_budget = SIZE_MAX;
static size_t pin_locked, pin_locked_peak, pin_unlocked, pin_count, pin_fallbacks;
static char pin_last_fallback[160];
static unsigned pin_warned; /* one warning per distinct cause */

enum { WARN_MLOCK_PERM = 1, WARN_MLOCK_NOMEM = 2, WARN_BUDGET = 4, WARN_DEV = 8, WARN_NUMA = 16 };

ZO_API size_t zo_page_size(void)
{
    long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? (size_t)v : 4096;
}

ZO_API size_t zo_huge_page_size(void)
{
    return HUGE_2M;
}

ZO_API void zo_pin_opts_default(zo_pin_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->struct_size = sizeof(*o);
    o->numa_node = -1;
    o->flags = ZO_PIN_HUGE;
}

static int has_cap_ipc_lock(void)
{
    char buf[4096];
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return 0;
    int yes = 0;
    while (fgets(buf, sizeof(buf), f)) {
        unsigned long long cap;
        if (sscanf(buf, "CapEff: %llx", &cap) == 1) {
            yes = !!(cap & (1ull << 14)); /* CAP_IPC_LOCK */
            break;
        }
    }
    fclose(f);
    return yes;
}

static uint64_t memlock_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return (uint64_t)rl.rlim_cur;
}

/* Record a fallback: counted, kept as the last reason, warned once per cause. */
static void note_fallback(unsigned cause, const char *fmt, ...) ZO_PRINTF(2, 3);
static void note_fallback(unsigned cause, const char *fmt, ...)
{
    char msg[sizeof(pin_last_fallback)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&pin_lock);
    memcpy(pin_last_fallback, msg, sizeof(msg));
    int warn = !(pin_warned & cause);
    pin_warned |= cause;
    pthread_mutex_unlock(&pin_lock);
    if (warn)
        ZO_LOGW("pinned memory: %s; continuing with pageable memory (further cases logged at debug)", msg);
    else
        ZO_LOGD("pinned memory: %s", msg);
}

static int node_exists(int node)
{
    char path[64];
    snprintf(path, sizeof(path), "/sys/devices/system/node/node%d", node);
    if (access(path, F_OK) == 0)
        return 1;
    /* Kernels without NUMA support have no node directory: node 0 is all. */
    return node == 0 && access("/sys/devices/system/node", F_OK) != 0;
}

static int bind_node(void *p, size_t len, int node)
{
    /* MPOL_BIND with its result checked: libnuma's mbind() where the build
     * has it, the system call otherwise. (numa_tonode_memory(), used
     * before, returns nothing: a failed bind was reported as
     * ZO_PIN_NUMA_BOUND. test_pinned_numa_node0 now asks the kernel.) */
    unsigned long mask[16] = {0};
    if (node < 0 || node >= (int)(sizeof(mask) * 8))
        return -EINVAL;
    mask[node / (8 * sizeof(long))] = 1ul << (node % (8 * sizeof(long)));
#if ZO_HAVE_NUMA
    if (mbind(p, len, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0)
        return -errno;
#else
    if (syscall(SYS_mbind, p, len, 2 /* MPOL_BIND */, mask, sizeof(mask) * 8, 0) != 0)
        return -errno;
#endif
    return 0;
}

/* Map `len` bytes, 2 MiB aligned when len allows, trying hugetlb first if
 * asked. Returns MAP_FAILED-free pointer or NULL with errno. */
static void *map_region(size_t len, int want_huge, unsigned *flags_out)
{
    if (want_huge && len % HUGE_2M == 0) {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT), -1, 0);
        if (p != MAP_FAILED) {
            *flags_out |= ZO_PIN_HUGE;
            return p;
        }
        /* Usually ENOMEM: no pages reserved in the hugetlb pool. */
        ZO_LOGD("hugetlb mapping of %zu bytes refused (%s); using normal pages", len, strerror(errno));
    }
    if (len >= HUGE_2M) {
        /* Over-map and trim so the region is 2 MiB aligned: transparent huge
         * pages can only back aligned 2 MiB ranges. */
        size_t over = len + HUGE_2M;
        uint8_t *raw = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED)
            return NULL;
        uint8_t *aligned = (uint8_t *)ZO_ALIGN_UP((uintptr_t)raw, (uintptr_t)HUGE_2M);
        size_t head = (size_t)(aligned - raw), tail = over - head - len;
        if (head)
            munmap(raw, head);
        if (tail)
            munmap(aligned + len, tail);
        if (madvise(aligned, len, MADV_HUGEPAGE) == 0)
            *flags_out |= ZO_PIN_THP;
        return aligned;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void fault_in(uint8_t *p, size_t len, size_t step)
{
    for (size_t off = 0; off < len; off += step)
        ((volatile uint8_t *)p)[off] = 0;
}

ZO_API int zo_pinned_alloc(void **out, size_t size, const zo_pin_opts *opts)
{
    zo_pin_opts o;
    zo_pin_opts_default(&o);
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_pinned_alloc: out is NULL");
    *out = NULL;
    /* The first published zo_pin_opts ends with `dev`. */
    if (opts)
        ZO_CHECK(ZO_STRUCT_IN(&o, opts, offsetof(zo_pin_opts, dev) + sizeof(opts->dev), NULL, "zo_pinned_alloc"));
    if (size == 0)
        return ZO_FAIL(NULL, -EINVAL, "zo_pinned_alloc: size is 0");
    if (o.numa_node < -1 || (o.numa_node >= 0 && !node_exists(o.numa_node)))
        return ZO_FAIL(NULL, -EINVAL, "zo_pinned_alloc: NUMA node %d does not exist", o.numa_node);

    /* No address space holds this; refusing it here also keeps the page
     * and huge-page round-ups and map_region's 2 MiB over-map (len + 2 MiB)
     * from wrapping to a small length. */
    if (size > SIZE_MAX / 2)
        return ZO_FAIL(NULL, -ENOMEM, "zo_pinned_alloc: size %zu is larger than any address space", size);
    size_t page = zo_page_size();
    size_t len = ZO_ALIGN_UP(size, page);
    int want_huge = (o.flags & ZO_PIN_HUGE) && size >= HUGE_2M;
    if (want_huge)
        len = ZO_ALIGN_UP(size, (size_t)HUGE_2M);

    unsigned got = 0;
    uint8_t *p = map_region(len, want_huge, &got);
    if (!p)
        return ZO_FAIL(NULL, -errno ? -errno : -ENOMEM, "zo_pinned_alloc: mmap of %zu bytes failed: %s", len,
                       strerror(errno));

    /* A fork() of the host process must not copy-on-write pages that DMA or
     * io_uring may be writing into. */
    madvise(p, len, MADV_DONTFORK);

    int node = -1;
    if (o.numa_node >= 0) {
        int r = bind_node(p, len, o.numa_node);
        if (r == 0) {
            got |= ZO_PIN_NUMA_BOUND;
            node = o.numa_node;
        } else {
            note_fallback(WARN_NUMA, "binding %zu bytes to node %d failed (%s)", len, o.numa_node, zo_strerror(r));
        }
    }

    int want_lock = !(o.flags & ZO_PIN_NO_LOCK);
    int err = 0;
    if (want_lock) {
        pthread_mutex_lock(&pin_lock);
        int over = pin_locked + len > pin_budget || pin_locked + len < pin_locked;
        size_t budget = pin_budget, locked = pin_locked;
        if (!over)
            pin_locked += len; /* reserve before locking so racing callers see it */
        pthread_mutex_unlock(&pin_lock);
        if (over) {
            err = ZO_EBUDGET;
            note_fallback(WARN_BUDGET, "locking %zu more bytes would exceed the pinned budget (%zu of %zu in use)", len,
                          locked, budget);
        } else if (syscall(SYS_mlock, p, len) != 0) {
            /* The raw system call: sanitizer runtimes intercept mlock() as a
             * no-op, which would report memory as locked that is not. */
            err = -errno;
            pthread_mutex_lock(&pin_lock);
            pin_locked -= len;
            pthread_mutex_unlock(&pin_lock);
            uint64_t lim = memlock_limit();
            if (err == -EPERM || err == -ENOMEM || err == -EAGAIN) {
                char l[32];
                if (lim == UINT64_MAX)
                    snprintf(l, sizeof(l), "unlimited");
                else
                    snprintf(l, sizeof(l), "%llu bytes", (unsigned long long)lim);
                note_fallback(err == -EPERM ? WARN_MLOCK_PERM : WARN_MLOCK_NOMEM,
                              "mlock of %zu bytes refused (%s; RLIMIT_MEMLOCK %s, raise it with ulimit -l or "
                              "give CAP_IPC_LOCK)", len, strerror(-err), l);
            } else {
                note_fallback(WARN_MLOCK_NOMEM, "mlock of %zu bytes failed (%s)", len, strerror(-err));
            }
        } else {
            got |= ZO_PIN_LOCKED; /* mlock faulted every page in */
        }
        if (err && (o.flags & ZO_PIN_REQUIRE)) {
            munmap(p, len);
            return ZO_FAIL(NULL, err, "zo_pinned_alloc: %zu bytes could not be locked (%s) and ZO_PIN_REQUIRE is set",
                           len, zo_strerror(err));
        }
    }
    if (!(got & ZO_PIN_LOCKED) && !(o.flags & ZO_PIN_NO_FAULT))
        fault_in(p, len, (got & ZO_PIN_HUGE) ? HUGE_2M : page);

    if (o.dev) {
        int r = dev_register(o.dev, p, len);
        if (r == 0) {
            got |= ZO_PIN_DEV_REGISTERED;
        } else if (o.flags & ZO_PIN_REQUIRE) {
            if (got & ZO_PIN_LOCKED) {
                munlock(p, len);
                pthread_mutex_lock(&pin_lock);
                pin_locked -= len;
                pthread_mutex_unlock(&pin_lock);
            }
            munmap(p, len);
            return ZO_FAIL(NULL, r, "zo_pinned_alloc: device registration of %zu bytes failed: %s", len,
                           dev_errmsg(o.dev));
        } else {
            note_fallback(WARN_DEV, "device registration of %zu bytes failed (%s)", len, zo_strerror(r));
        }
    }

    pin_rec *rec = calloc(1, sizeof(*rec));
    if (!rec) {
        if (got & ZO_PIN_DEV_REGISTERED)
            dev_unregister(o.dev, p);
        if (got & ZO_PIN_LOCKED) {
            munlock(p, len);
            pthread_mutex_lock(&pin_lock);
            pin_locked -= len;
            pthread_mutex_unlock(&pin_lock);
        }
        munmap(p, len);
        return ZO_FAIL(NULL, -ENOMEM, "zo_pinned_alloc: out of memory for the record");
    }
    rec->p = p;
    rec->size = size;
    rec->mapped = len;
    rec->node = node;
    rec->flags = got;
    rec->dev = (got & ZO_PIN_DEV_REGISTERED) ? o.dev : NULL;
    pthread_mutex_lock(&pin_lock);
    zo_list_add_head(&pin_list, &rec->link);
    pin_count++;
    if (got & ZO_PIN_LOCKED) {
        if (pin_locked > pin_locked_peak)
            pin_locked_peak = pin_locked;
    } else {
        pin_unlocked += len;
        if (want_lock)
            pin_fallbacks++;
    }
    pthread_mutex_unlock(&pin_lock);
    ZO_LOGT("pinned %zu bytes at %p (flags 0x%x, node %d)", len, (void *)p, got, node);
    *out = p;
    return 0;
}

ZO_API void zo_pinned_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&pin_lock);
    pin_rec *rec = NULL;
    zo_list *pos;
    zo_list_for_each(pos, &pin_list) {
        pin_rec *x = zo_list_entry(pos, pin_rec, link);
        if (x->p == p) {
            rec = x;
            zo_list_del(&rec->link);
            break;
        }
    }
    if (rec) {
        pin_count--;
        if (rec->flags & ZO_PIN_LOCKED)
            pin_locked -= rec->mapped;
        else
            pin_unlocked -= rec->mapped;
    }
    pthread_mutex_unlock(&pin_lock);
    if (!rec) {
        ZO_LOGE("zo_pinned_free(%p): not a pinned allocation; ignored", p);
        return;
    }
    if (rec->dev)
        dev_unregister(rec->dev, p);
    /* munmap unlocks too; no munlock call needed. */
    munmap(p, rec->mapped);
    free(rec);
}

ZO_API int zo_pinned_query(const void *p, zo_pinned_info *info)
{
    if (!p || !info)
        return -EINVAL;
    int r = -ENOENT;
    pthread_mutex_lock(&pin_lock);
    const zo_list *pos;
    zo_list_for_each(pos, &pin_list) {
        const pin_rec *rec = zo_list_entry(pos, pin_rec, link);
        if ((const uint8_t *)p >= (uint8_t *)rec->p && (const uint8_t *)p < (uint8_t *)rec->p + rec->mapped) {
            info->size = rec->size;
            info->mapped = rec->mapped;
            info->numa_node = rec->node;
            info->flags = rec->flags;
            r = 0;
            break;
        }
    }
    pthread_mutex_unlock(&pin_lock);
    return r;
}

ZO_API void zo_pinned_stats_get(zo_pinned_stats *st)
{
    if (!st)
        return;
    memset(st, 0, sizeof(*st));
    pthread_mutex_lock(&pin_lock);
    st->budget = pin_budget;
    st->locked_bytes = pin_locked;
    st->locked_peak = pin_locked_peak;
    st->unlocked_bytes = pin_unlocked;
    st->allocations = pin_count;
    st->fallbacks = pin_fallbacks;
    memcpy(st->last_fallback, pin_last_fallback, sizeof(st->last_fallback));
    pthread_mutex_unlock(&pin_lock);
    st->memlock_limit = memlock_limit();
    st->can_lock_unlimited = has_cap_ipc_lock();
}

ZO_API size_t zo_pinned_set_budget(size_t bytes)
{
    pthread_mutex_lock(&pin_lock);
    size_t old = pin_budget;
    pin_budget = bytes;
    pthread_mutex_unlock(&pin_lock);
    return old;
}
