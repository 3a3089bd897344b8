/* SPDX-License-Identifier: Apache-2.0 */
/* The tiered store as an object: tier names, the config and tensor
 * descriptor defaults, and zo_store_create / zo_store_destroy (tiers and
 * budgets, the pinned slot pool, the mover thread). The rest of the store
 * lives beside it, one file a concern: copies and their states, loads and
 * write-backs (copy.c), room in a tier (space.c), the tensor registry
 * (registry.c), acquire / release / prefetch / flush and statistics
 * (acquire.c); transfers run in mover.c, the trace in trace.c, streams and
 * checkpoints in stream.c, group sweeps in sweep.c. */
#include "store/store_internal.h"

#include <stdlib.h>
#include <string.h>

#include <zoffload/mem.h>

#include <zoffload/mem.h>

static const char *const tier_names[ZO__NTIERS] = {"device", "host", "nvme"};

ZO_API const char *zo_tier_name(zo_tier t)
{
    return (unsigned)t < ZO__NTIERS ? tier_names[t] : "?";
}

ZO_API int zo_tier_parse(const char *s, zo_tier *out)
{
    if (!s || !out)
        return -EINVAL;
    for (int i = 0; i < ZO__NTIERS; i++)
        if (strcmp(s, tier_names[i]) == 0) {
            *out = (zo_tier)i;
            return 0;
        }
    return ZO_FAIL(NULL, -EINVAL, "unknown tier '%s' (device, host, nvme)", s);
}

ZO_API void zo_store_config_default(zo_store_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->slot_size = 4u << 20;
    cfg->slots = 16;
    cfg->numa_node = -1;
    cfg->pin_flags = ZO_PIN_HUGE;
    cfg->trace = ZO_TRACE_AUTO;
    cfg->lookahead = 4;
}

ZO_API const char *zo_store_errmsg(const zo_store *s)
{
    static _Thread_local char copy[ZO_ERRMSG_LEN]; /* a whole message, whatever the mover writes */
    return zo__errbuf_tls(s ? &s->err : NULL, copy);
}

ZO_API void zo_tensor_desc_default(zo_tensor_desc *d)
{
    if (!d)
        return;
    memset(d, 0, sizeof(*d));
    d->struct_size = sizeof(*d);
    d->dtype = ZO_DTYPE_F32;
    d->home = ZO_TIER_NVME;
}

/* ---- create / destroy ------------------------------------------------------------------ */
ZO_API void zo_store_destroy(zo_store **sp)
{
    if (!sp || !*sp)
        return;
    zo_store *s = *sp;
    pthread_mutex_lock(&s->lock);
    while (s->jobs_active)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    zo__mover_stop(s);
    while (s->tensors) {
        zo_tensor *t = s->tensors;
        s->tensors = t->next;
        if (t->sid)
            zo_swap_free(s->swap, t->sid);
        zo__tensor_free(t);
    }
    zo__trace_free(s);
    free(s->htab);
    for (int x = 0; x < ZO__NTIERS; x++) {
        /* never waited for: the caller broke the contract; do not leak */
        for (zo_list *n; (n = zo_list_pop_head(&s->tier[x].parked));)
            free(zo_list_entry(n, zo_store_req, link));
        zo__ext_fini(&s->tier[x].ext);
    }
    if (s->h2d) {
        int e = zo_stream_sync(s->h2d);
        if (e < 0)
            ZO_LOGW("store: device copies reported %s at shutdown", zo_strerror(e));
    }
    zo_stream_destroy(&s->h2d);
    zo_stream_destroy(&s->d2h);
    zo_stream_destroy(&s->zero);
    pthread_mutex_destroy(&s->zero_lock);
    if (s->tier[ZO_TIER_DEVICE].base)
        zo_dev_free(s->dev, s->tier[ZO_TIER_DEVICE].base);
    if (s->tier[ZO_TIER_HOST].base) {
        if (s->swap)
            zo_swap_unregister_memory(s->swap, s->tier[ZO_TIER_HOST].base);
        zo_pinned_free(s->tier[ZO_TIER_HOST].base);
    }
    if (s->pool) {
        if (s->swap)
            zo_swap_unregister_memory(s->swap, s->pool);
        zo_pinned_free(s->pool);
    }
    free(s->free_slots);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    *sp = NULL;
}

static int pinned_region(zo_store *s, size_t n, uint8_t **out, const char *what, int *locked, int *fixed,
                         int *devreg)
{
    zo_pin_opts o;
    zo_pin_opts_default(&o);
    o.numa_node = s->cfg.numa_node;
    o.flags = s->cfg.pin_flags;
    o.dev = s->dev;
    void *p;
    int r = zo_pinned_alloc(&p, n, &o);
    if (r < 0)
        return ZO_FAIL(&s->err, r, "store: cannot allocate %zu bytes of pinned memory for the %s: %s", n, what,
                       zo_last_error_detail());
    zo_pinned_info pi;
    if (zo_pinned_query(p, &pi) == 0) {
        *locked = (pi.flags & ZO_PIN_LOCKED) != 0;
        *devreg = (pi.flags & ZO_PIN_DEV_REGISTERED) != 0;
    }
    if (!*locked)
        ZO_LOGW("store: the %s (%zu bytes) is not page-locked (see zo_pinned_stats): transfers will be slower", what,
                n);
    if (s->swap) {
        int reg = 0;
        r = zo_swap_register_memory(s->swap, p, n, &reg);
        *fixed = reg;
        if (r < 0) {
            zo_pinned_free(p);
            return ZO_FAIL(&s->err, r, "store: registering the %s with the aio engine failed: %s", what,
                           zo_strerror(r));
        }
    }
    s->st.pinned_bytes += n;
    *out = p;
    return 0;
}

ZO_API int zo_store_create(zo_store **out, const zo_store_config *ucfg)
{
    if (!out)
        return ZO_FAIL(NULL, -EINVAL, "zo_store_create: out is NULL");
    *out = NULL;
    zo_store_config cfg;
    zo_store_config_default(&cfg);
    if (ucfg)
        ZO_CHECK(ZO_STRUCT_IN(&cfg, ucfg, offsetof(zo_store_config, device_bytes), NULL, "zo_store_create"));
    if (cfg.device_bytes && !cfg.dev)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_store_create: device_bytes set without a device (dev)");
    if (!cfg.device_bytes && !cfg.host_bytes && !cfg.swap)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_store_create: no tier configured (device_bytes, host_bytes, swap)");
    if (cfg.trace != ZO_TRACE_OFF && cfg.trace != ZO_TRACE_AUTO)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_store_create: unknown trace mode %d", (int)cfg.trace);
    size_t chunk = 0;
    if (cfg.swap) {
        zo_swap_info si;
        zo_swap_get_info(cfg.swap, &si);
        chunk = si.chunk_size;
    }
    if (cfg.slots) {
        size_t gran = chunk ? chunk : 4096;
        if (cfg.slot_size == 0 || cfg.slot_size % gran || cfg.slot_size > (1u << 30))
            return ZO_FAIL(NULL, ZO_ECONFIG,
                           "zo_store_create: slot_size %zu must be a positive multiple of %zu (the swap chunk "
                           "size, or 4096) up to 1 GiB",
                           cfg.slot_size, gran);
        if (cfg.slots > 65536)
            return ZO_FAIL(NULL, ZO_ECONFIG, "zo_store_create: slots %u is absurd", cfg.slots);
    } else if (cfg.swap && cfg.device_bytes) {
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_store_create: NVMe and device tiers need pool slots (slots = 0)");
    }
    if (cfg.lookahead > 4096)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zo_store_create: lookahead %u is absurd", cfg.lookahead);

    zo_store *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->cfg = cfg;
    s->dev = cfg.dev;
    s->swap = cfg.swap;
    s->chunk = chunk;
    s->trace_mode = cfg.trace;
    s->recording = 1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_mutex_init(&s->zero_lock, NULL);
    int r = 0;
    if (s->cfg.numa_node == -1 && s->dev) {
        zo_dev_info di;
        if (zo_dev_get_info(s->dev, &di) == 0 && di.numa_node >= 0)
            s->cfg.numa_node = di.numa_node;
    }
    for (int x = 0; x < ZO__NTIERS; x++) {
        zo__ext_init(&s->tier[x].ext, 0, 4096);
        zo_list_init(&s->tier[x].lru);
        zo_list_init(&s->tier[x].parked);
    }
    if (cfg.device_bytes) {
        void *p;
        if ((r = zo_dev_malloc(s->dev, &p, (size_t)cfg.device_bytes)) < 0) {
            ZO_FAIL(&s->err, r, "store: cannot allocate the %llu-byte device tier: %s",
                    (unsigned long long)cfg.device_bytes, zo_dev_errmsg(s->dev));
            goto fail;
        }
        s->tier[ZO_TIER_DEVICE].base = p;
        if ((r = zo_stream_create(s->dev, &s->h2d)) < 0 || (r = zo_stream_create(s->dev, &s->d2h)) < 0 ||
            (r = zo_stream_create(s->dev, &s->zero)) < 0)
            goto fail;
        zo__ext_fini(&s->tier[ZO_TIER_DEVICE].ext);
        if ((r = zo__ext_init(&s->tier[ZO_TIER_DEVICE].ext, cfg.device_bytes, 256)) < 0)
            goto fail;
        s->tier[ZO_TIER_DEVICE].budget = cfg.device_bytes;
        s->have[ZO_TIER_DEVICE] = 1;
    }
    if (cfg.host_bytes) {
        uint8_t *p;
        int lk = 0, fx = 0, dr = 0;
        if ((r = pinned_region(s, (size_t)cfg.host_bytes, &p, "host tier", &lk, &fx, &dr)) < 0)
            goto fail;
        s->tier[ZO_TIER_HOST].base = p;
        zo__ext_fini(&s->tier[ZO_TIER_HOST].ext);
        if ((r = zo__ext_init(&s->tier[ZO_TIER_HOST].ext, cfg.host_bytes, 4096)) < 0)
            goto fail;
        s->tier[ZO_TIER_HOST].budget = cfg.host_bytes & ~4095ull;
        s->have[ZO_TIER_HOST] = 1;
    }
    if (cfg.swap) {
        s->tier[ZO_TIER_NVME].budget = cfg.nvme_bytes ? cfg.nvme_bytes : UINT64_MAX;
        s->have[ZO_TIER_NVME] = 1;
    }
    if (cfg.slots) {
        s->slot_size = cfg.slot_size;
        s->nslots = cfg.slots;
        if ((r = pinned_region(s, cfg.slot_size * (size_t)cfg.slots, &s->pool, "slot pool", &s->st.pool_locked,
                               &s->st.pool_aio_fixed, &s->st.pool_dev_registered)) < 0)
            goto fail;
        s->free_slots = malloc(cfg.slots * sizeof(unsigned));
        if (!s->free_slots) {
            r = -ENOMEM;
            goto fail;
        }
        for (unsigned i = 0; i < cfg.slots; i++)
            s->free_slots[i] = cfg.slots - 1 - i;
        s->nfree = cfg.slots;
    }
    if ((r = zo__mover_start(s)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    if (r < 0)
        zo__fail(NULL, r, ZO_MODULE, "%s", zo_store_errmsg(s)[0] ? zo_store_errmsg(s) : zo_strerror(r));
    zo_store_destroy(&s);
    return r;
}
