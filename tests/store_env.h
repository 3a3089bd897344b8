/* SPDX-License-Identifier: Apache-2.0 */
/* The store test environment shared by test_store, test_store_group,
 * test_store_ckpt and test_tiling: a temporary directory, a device (the
 * host backend unless asked: "device memory" is host memory capped by
 * dev_limit), a real swap store in that directory and a real tiered store
 * over them. Each test file keeps a thin env_open() of its own that fills
 * an env_opts; env_close() is the same for all and checks the store's copy
 * state machine saw no illegal transition.
 *
 * Include after zo_test.h and <zoffload/zoffload.h>. */
#ifndef ZO_TESTS_STORE_ENV_H
#define ZO_TESTS_STORE_ENV_H

#include "aio/aio_internal.h"
#include "store/store_internal.h"

#ifndef KiB
#define KiB 1024ull
#define MiB (1024ull * 1024)
#endif

typedef struct env {
    char dir[256];
    char root[300];      /* <dir>/ckpt: a checkpoint root inside the directory */
    zo_dev *dev;
    zo_swap *swap;
    zo_store *st;
    zo_store_config cfg; /* what the store was created with */
} env;

typedef struct env_opts {
    zo_dev_kind kind;        /* device backend (ZO_DEV_HOST) */
    uint64_t dev_limit;      /* host backend: its device memory cap (0: the backend's default) */
    int no_dev;              /* the store gets no device (a host + NVMe store) */
    uint64_t dev_bytes;      /* the store's device tier */
    uint64_t host_bytes;     /* the store's host tier */
    size_t slot_size;        /* 0: the store's default */
    unsigned slots;          /* 0: the store's default */
    size_t chunk;            /* swap chunk; 0: the swap store's default */
    uint64_t arena;          /* swap arena size; 0: the swap store's default */
    zo_trace_mode trace;     /* ZO_TRACE_OFF unless set */
    int trace_set;           /* trace holds the mode to use */
    uint64_t prefetch_bytes; /* the store's prefetch cap (0: the default) */
    unsigned aio_threads;    /* > 0: a pread/pwrite engine with that many threads (a fault
                                hook that holds one I/O leaves the others running) */
} env_opts;

/* The usual shape: a device tier of dev_bytes (none when 0) on a host
 * backend capped 1 MiB above it, 16 MiB swap arenas. */
static inline env_opts env_opts_sized(uint64_t dev_bytes, uint64_t host_bytes, size_t slot, unsigned slots,
                                      size_t chunk)
{
    return (env_opts){.dev_limit = dev_bytes + 1 * MiB,
                      .no_dev = !dev_bytes,
                      .dev_bytes = dev_bytes,
                      .host_bytes = host_bytes,
                      .slot_size = slot,
                      .slots = slots,
                      .chunk = chunk,
                      .arena = 16 * MiB};
}

static inline void env_open_with(env *e, const env_opts *o)
{
    memset(e, 0, sizeof(*e));
    zo_test_mkdtemp(e->dir, sizeof(e->dir));
    snprintf(e->root, sizeof(e->root), "%s/ckpt", e->dir);
    zo_dev_config dc;
    zo_dev_config_default(&dc);
    dc.kind = o->kind;
    if (o->dev_limit)
        dc.host_mem_limit = o->dev_limit;
    int r = zo_dev_open(&e->dev, &dc);
    ck_assert_msg(r == 0, "zo_dev_open: %s (%s)", zo_strerror(r), zo_last_error_detail());
    const char *dirs[] = {e->dir};
    zo_swap_config sc;
    zo_swap_config_default(&sc);
    sc.dirs = dirs;
    sc.ndirs = 1;
    if (o->chunk)
        sc.chunk_size = o->chunk;
    if (o->arena)
        sc.arena_size = o->arena;
    zo_aio_config ac;
    zo_aio_config_default(&ac);
    if (o->aio_threads) {
        ac.backend = ZO_AIO_THREADS;
        ac.threads = o->aio_threads;
        sc.aio_cfg = &ac;
    }
    r = zo_swap_create(&e->swap, &sc);
    ck_assert_msg(r == 0, "zo_swap_create: %s (%s)", zo_strerror(r), zo_last_error_detail());
    zo_store_config_default(&e->cfg);
    e->cfg.dev = o->no_dev ? NULL : e->dev;
    e->cfg.device_bytes = o->dev_bytes;
    e->cfg.host_bytes = o->host_bytes;
    e->cfg.swap = e->swap;
    if (o->slot_size)
        e->cfg.slot_size = o->slot_size;
    if (o->slots)
        e->cfg.slots = o->slots;
    e->cfg.trace = o->trace_set ? o->trace : ZO_TRACE_OFF;
    e->cfg.prefetch_bytes = o->prefetch_bytes;
    r = zo_store_create(&e->st, &e->cfg);
    ck_assert_msg(r == 0, "zo_store_create: %s (%s)", zo_strerror(r), zo_last_error_detail());
}

static inline void env_close(env *e)
{
    if (e->swap)
        zo__aio_set_fault(zo_swap_get_aio(e->swap), NULL, NULL);
    if (e->st) {
        pthread_mutex_lock(&e->st->lock);
        uint64_t bad = e->st->bad_transitions;
        pthread_mutex_unlock(&e->st->lock);
        ck_assert_msg(bad == 0, "%llu illegal copy state transitions (see the log)", (unsigned long long)bad);
    }
    zo_store_destroy(&e->st);
    ck_assert_ptr_null(e->st);
    zo_swap_destroy(&e->swap);
    zo_dev_close(&e->dev);
    zo_test_rmtree(e->dir);
}

#endif
