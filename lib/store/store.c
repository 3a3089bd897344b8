/* SPDX-License-Identifier: Apache-2.0 */
/* The tiered store: tiers and budgets, the pinned pool, copies and their
 * states, loads and write-backs. Room in a tier (eviction, placement) is
 * in space.c, the tensor registry in registry.c, requests and acquire /
 * release / prefetch / flush and statistics in acquire.c; transfers run in
 * mover.c, the trace in trace.c, streams and checkpoints in stream.c. */
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

/* ---- copies ------------------------------------------------------------------------ */
static const char *const copy_state_names[ZO__CS_COUNT] = {"absent", "loading", "resident", "writeback",
                                                             "receiving"};

/* Legal transitions: the table in store_internal.h. */
static const unsigned char copy_legal[ZO__CS_COUNT][ZO__CS_COUNT] = {
    [ZO__CS_ABSENT] = {[ZO__CS_LOADING] = 1, [ZO__CS_RESIDENT] = 1},
    [ZO__CS_LOADING] = {[ZO__CS_ABSENT] = 1, [ZO__CS_RESIDENT] = 1},
    [ZO__CS_RESIDENT] = {[ZO__CS_ABSENT] = 1, [ZO__CS_LOADING] = 1, [ZO__CS_RESIDENT] = 1, [ZO__CS_WRITEBACK] = 1,
                         [ZO__CS_RECEIVING] = 1},
    [ZO__CS_WRITEBACK] = {[ZO__CS_RESIDENT] = 1},
    [ZO__CS_RECEIVING] = {[ZO__CS_RESIDENT] = 1},
};

void zo__copy_to(zo_store *s, zo_tensor *t, zo_tier x, zo__copy_state to)
{
    zo__copy *c = &t->c[x];
    zo__copy_state from = c->state;
    /* what else each state needs: only a home copy receives, only a
     * non-home copy is written back, a reload only replaces stale data,
     * nothing is freed under a reader */
    int ok = copy_legal[from][to] && (to != ZO__CS_RECEIVING || x == t->home) &&
             (to != ZO__CS_WRITEBACK || x != t->home) &&
             (!(from == ZO__CS_RESIDENT && to == ZO__CS_LOADING) || c->ver != t->cur_ver) &&
             (to != ZO__CS_ABSENT || !c->readers);
    if (!ok) {
        /* a bug in the store: say so loudly, count it (tests), go on */
        s->bad_transitions++;
        ZO_LOGE("store: illegal copy transition %s -> %s ('%s', %s tier, %u readers)", copy_state_names[from],
                copy_state_names[to], t->name, zo_tier_name(x), c->readers);
    }
    c->state = to;
}

int zo__store_current(const zo_tensor *t, zo_tier x)
{
    return zo__copy_has_data(&t->c[x]) && t->c[x].ver == t->cur_ver;
}

/* The only current copy: freeing it would lose the data. */
int zo__store_sole_current(const zo_tensor *t, zo_tier x)
{
    if (!zo__store_current(t, x))
        return 0;
    for (int y = 0; y < ZO__NTIERS; y++)
        if (y != (int)x && zo__store_current(t, (zo_tier)y))
            return 0;
    return 1;
}

/* Current copy to load tier x from: the nearest one. */
static int pick_source(const zo_tensor *t, zo_tier x, zo_tier *src)
{
    static const zo_tier pref[ZO__NTIERS][ZO__NTIERS - 1] = {
        [ZO_TIER_DEVICE] = {ZO_TIER_HOST, ZO_TIER_NVME},
        [ZO_TIER_HOST] = {ZO_TIER_DEVICE, ZO_TIER_NVME},
        [ZO_TIER_NVME] = {ZO_TIER_HOST, ZO_TIER_DEVICE},
    };
    /* a copy held for writing is changing under the caller's hands: never
     * a source */
    int held = 0;
    for (int i = 0; i < ZO__NTIERS - 1; i++)
        if (zo__store_current(t, pref[x][i])) {
            if (t->c[pref[x][i]].write_held) {
                held = 1;
                continue;
            }
            *src = pref[x][i];
            return 0;
        }
    return held ? -EBUSY : -ENOENT;
}

int zo__store_freshest(const zo_tensor *t, zo_tier *out)
{
    static const zo_tier order[ZO__NTIERS] = {ZO_TIER_HOST, ZO_TIER_DEVICE, ZO_TIER_NVME};
    for (int i = 0; i < ZO__NTIERS; i++)
        if (zo__store_current(t, order[i])) {
            *out = order[i];
            return 0;
        }
    return -ENOENT;
}

zo__ep zo__store_ep(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__ep e = {0};
    if (x == ZO_TIER_NVME) {
        e.kind = EP_NVME;
        e.sid = t->sid;
    } else {
        e.kind = x == ZO_TIER_DEVICE ? EP_DEV : EP_HOST;
        e.p = t->c[x].ptr;
    }
    return e;
}

static void lru_unlink(zo__tier *tr, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    if (zo_list_linked(&c->lnode)) {
        zo_list_del(&c->lnode);
        tr->ncopies--;
    }
}

/* Append at the tail (most recent); O(1). */
void zo__store_lru_append(zo__tier *tr, zo_tensor *t, zo_tier x)
{
    zo_list_add_tail(&tr->lru, &t->c[x].lnode);
    tr->ncopies++;
}

void zo__store_copy_free(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    zo__tier *tr = &s->tier[x];
    if (!c->len)
        return;
    if (c->prefetched) {
        tr->prefetched_bytes -= c->len;
        c->prefetched = 0;
    }
    zo__ext_free(&tr->ext, c->off, c->len);
    tr->used -= c->len;
    if (x == t->home)
        tr->home_bytes -= c->len;
    else
        lru_unlink(tr, t, x);
    zo__copy_to(s, t, x, ZO__CS_ABSENT);
    c->len = c->off = 0;
    c->ptr = NULL;
    c->drop_after = 0;
    c->wb_wanted = 0;
    c->wb_fail = 0;
}

/* Evict v's copy in tier x to make room. A prefetched copy evicted before
 * its use is a wasted prefetch (the thrash counter); one freed because its
 * data was replaced, its load failed or its tensor went away is not. */
void zo__store_evict(zo_store *s, zo_tensor *v, zo_tier x)
{
    s->st.evictions++;
    if (v->c[x].prefetched && v->c[x].ver == v->cur_ver)
        s->st.prefetch_wasted++;
    zo__store_copy_free(s, v, x);
}

/* Free a non-home copy nobody needs: stale, or asked to be dropped and not
 * the only current copy. */
void zo__store_maybe_free(zo_store *s, zo_tensor *t, zo_tier x)
{
    zo__copy *c = &t->c[x];
    if (x == t->home || c->state != ZO__CS_RESIDENT || zo__copy_busy(c))
        return;
    if (c->ver != t->cur_ver || (c->drop_after && !zo__store_sole_current(t, x))) {
        s->st.evictions++;
        zo__store_copy_free(s, t, x);
    }
}

/* ---- transfers ---------------------------------------------------------------------- */
static void set_job_path(zo_store *s, zo__job *j)
{
    j->from = zo__store_ep(s, j->t, j->src);
    j->to = zo__store_ep(s, j->t, j->dst);
    j->r0 = 0;
    j->r1 = j->t->bytes;
    j->next_off = 0;
    j->via_slot = (j->src == ZO_TIER_NVME && j->dst == ZO_TIER_DEVICE) ||
                  (j->src == ZO_TIER_DEVICE && j->dst == ZO_TIER_NVME);
    if (j->via_slot) {
        unsigned quota = s->nslots - s->reserved;
        j->piece = s->slot_size;
        j->max_inflight = ZO_MAX(2u, quota / 2);
    } else {
        j->piece = s->slot_size ? ZO_ALIGN_UP((size_t)ZO__DIRECT_PIECE, s->slot_size) : ZO__DIRECT_PIECE;
        j->max_inflight = ZO__DIRECT_INFLIGHT;
    }
}

int zo__store_start_load(zo_store *s, zo_tensor *t, zo_tier x, int prefetch, uint64_t dist)
{
    zo__copy *c = &t->c[x];
    zo_tier src;
    int ps = pick_source(t, x, &src);
    if (ps == -EBUSY)
        return prefetch ? -EBUSY
                        : ZO_FAIL(&s->err, -EBUSY, "store: '%s' is held for writing in another tier", t->name);
    if (ps < 0)
        return ZO_FAIL(&s->err, ZO_EINTERNAL, "store: '%s' has no current copy to load from", t->name);
    if (src == ZO_TIER_NVME && x == ZO_TIER_DEVICE && !s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "store: NVMe to device needs pool slots (slots = 0)");
    int r = zo__store_space(s, t, x, prefetch, dist);
    if (r < 0)
        return r;
    zo__job *j = zo__job_new(s, JOB_LOAD, t);
    if (!j)
        return -ENOMEM;
    if (c->prefetched) {
        /* a stale copy loaded by a hint and never used: its space is
         * reused now, so it stops counting against the prefetch cap (not
         * wasted by the store: its data was replaced) */
        s->tier[x].prefetched_bytes -= c->len;
    }
    zo__copy_to(s, t, x, ZO__CS_LOADING);
    c->ver = t->cur_ver;
    c->prefetched = prefetch;
    if (prefetch) {
        s->tier[x].prefetched_bytes += c->len;
        s->st.prefetch_issued++;
    }
    t->c[src].readers++;
    j->src = src;
    j->dst = x;
    j->ver = t->cur_ver;
    j->prefetch = prefetch;
    if (prefetch) {
        j->pf_bytes = c->len;
        s->tier[x].prefetch_inflight += c->len;
    }
    set_job_path(s, j);
    zo__job_pump(s, j);
    return 0;
}

int zo__store_start_writeback(zo_store *s, zo_tensor *t, zo_tier x, int drop)
{
    zo__copy *c = &t->c[x];
    if (x == t->home || !zo__store_current(t, x) || zo__store_current(t, t->home)) {
        c->wb_wanted = 0;
        return 0;
    }
    zo__copy *home = &t->c[t->home];
    if (c->write_held || t->stream_write || zo__copy_in_flight(home) || home->readers) {
        /* still being modified, another write-back is landing in the home
         * copy (or a load fills it), or a load of an older version still
         * reads it (writing under it would tear what it reads, and fail it
         * with a checksum error): start when that ends */
        c->wb_wanted = 1;
        c->drop_after |= drop;
        return 0;
    }
    if (c->state == ZO__CS_WRITEBACK) {
        c->drop_after |= drop;
        return 0;
    }
    if (x == ZO_TIER_DEVICE && t->home == ZO_TIER_NVME && !s->nslots)
        return ZO_FAIL(&s->err, ZO_ECONFIG, "store: device to NVMe needs pool slots (slots = 0)");
    zo__job *j = zo__job_new(s, JOB_WRITEBACK, t);
    if (!j)
        return -ENOMEM;
    c->readers++;
    zo__copy_to(s, t, x, ZO__CS_WRITEBACK);
    c->wb_wanted = 0;
    c->drop_after |= drop;
    zo__copy_to(s, t, t->home, ZO__CS_RECEIVING);
    t->wb_count++;
    j->src = x;
    j->dst = t->home;
    j->ver = c->ver;
    set_job_path(s, j);
    zo__job_pump(s, j);
    return 0;
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
