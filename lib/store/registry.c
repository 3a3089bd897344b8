/* SPDX-License-Identifier: Apache-2.0 */
/* The tensor registry: names (a hash table), register (the home copy's
 * space, allocated and zeroed), find, unregister, tensor info. Apart from
 * store.c because registration has its own locking (it drops the store
 * lock to allocate and zero, with the name claimed first). */
#include "store/store_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- registry ------------------------------------------------------------------------- */
/* What zo_store_register allocated for t (its copies' space is freed
 * before; zo_store_destroy frees the tensors still registered). */
void zo__tensor_free(zo_tensor *t)
{
    if (!t)
        return;
    free(t->tpos);
    free(t->name);
    free(t);
}

/* Names: a hash table (FNV-1a, chained, doubled at load 1/2) holds every
 * claimed name, registered or being registered, so registering n tensors
 * is O(n), not O(n^2). Registration drops the lock to allocate and zero
 * the home copy; the name is claimed first, so a second registration of it
 * fails instead of both succeeding. */
static uint64_t name_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

static zo_tensor *name_lookup(zo_store *s, const char *name)
{
    if (!s->hcap)
        return NULL;
    for (zo_tensor *t = s->htab[name_hash(name) & (s->hcap - 1)]; t; t = t->hnext)
        if (strcmp(t->name, name) == 0)
            return t;
    return NULL;
}

static zo_tensor *find_locked(zo_store *s, const char *name)
{
    zo_tensor *t = name_lookup(s, name);
    return t && t->listed ? t : NULL;
}

static int claim(zo_store *s, zo_tensor *t)
{
    if ((s->hcount + 1) * 2 > s->hcap) {
        size_t cap = s->hcap ? s->hcap * 2 : 64;
        zo_tensor **tab = calloc(cap, sizeof(*tab));
        if (!tab)
            return -ENOMEM;
        for (size_t i = 0; i < s->hcap; i++)
            for (zo_tensor *u = s->htab[i], *n; u; u = n) {
                n = u->hnext;
                size_t b = name_hash(u->name) & (cap - 1);
                u->hnext = tab[b];
                tab[b] = u;
            }
        free(s->htab);
        s->htab = tab;
        s->hcap = cap;
    }
    size_t b = name_hash(t->name) & (s->hcap - 1);
    t->hnext = s->htab[b];
    s->htab[b] = t;
    s->hcount++;
    return 0;
}

/* The name is free again (a failed registration, an unregistered tensor). */
static void unclaim(zo_store *s, zo_tensor *t)
{
    if (!s->hcap)
        return;
    for (zo_tensor **pp = &s->htab[name_hash(t->name) & (s->hcap - 1)]; *pp; pp = &(*pp)->hnext)
        if (*pp == t) {
            *pp = t->hnext;
            s->hcount--;
            break;
        }
    t->hnext = NULL;
}

ZO_API int zo_store_find(zo_store *s, const char *name, zo_tensor **out)
{
    if (!s || !name || !out)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    *out = find_locked(s, name);
    pthread_mutex_unlock(&s->lock);
    return *out ? 0 : -ENOENT;
}

ZO_API int zo_store_register(zo_store *s, const zo_tensor_desc *ud, zo_tensor **out)
{
    if (!s || !ud || !out)
        return ZO_FAIL(s ? &s->err : NULL, -EINVAL, "zo_store_register: NULL argument");
    *out = NULL;
    zo_tensor_desc d;
    zo_tensor_desc_default(&d);
    ZO_CHECK(ZO_STRUCT_IN(&d, ud, offsetof(zo_tensor_desc, home) + sizeof(ud->home), &s->err, "zo_store_register"));
    if (!d.name || !*d.name || strlen(d.name) > ZO_TENSOR_NAME_MAX)
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_register: a name of 1..%d bytes is required", ZO_TENSOR_NAME_MAX);
    size_t esz = zo_dtype_size(d.dtype);
    if (!esz || d.ndim > ZO_TENSOR_MAX_DIMS)
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_register: '%s': invalid dtype or ndim %u", d.name, d.ndim);
    uint64_t nel = 1;
    for (unsigned i = 0; i < d.ndim; i++)
        if (__builtin_mul_overflow(nel, d.shape[i], &nel))
            return ZO_FAIL(&s->err, -EINVAL, "zo_store_register: '%s': shape overflows", d.name);
    uint64_t sbytes;
    if (__builtin_mul_overflow(nel, (uint64_t)esz, &sbytes))
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_register: '%s': shape overflows", d.name);
    uint64_t bytes = d.bytes ? d.bytes : (d.ndim ? sbytes : 0);
    if (bytes == 0 || (d.ndim && d.bytes && d.bytes != sbytes))
        return ZO_FAIL(&s->err, -EINVAL, "zo_store_register: '%s': bytes %llu vs shape x dtype %llu", d.name,
                       (unsigned long long)d.bytes, (unsigned long long)sbytes);
    if ((unsigned)d.home >= ZO__NTIERS || !s->have[d.home])
        return ZO_FAIL(&s->err, ZO_ECONFIG, "zo_store_register: '%s': home tier %s is not configured", d.name,
                       zo_tier_name(d.home));
    zo_tensor *t = calloc(1, sizeof(*t));
    if (!t || !(t->name = strdup(d.name))) {
        free(t);
        return -ENOMEM;
    }
    t->desc = d;
    t->desc.name = t->name;
    t->desc.bytes = bytes;
    t->bytes = bytes;
    t->home = d.home;
    t->cur_ver = 1;
    for (int x = 0; x < ZO__NTIERS; x++) {
        zo_list_init(&t->c[x].lnode);
        zo_list_init(&t->c[x].wq);
        t->c[x].owner = t;
    }
    int r = 0;
    pthread_mutex_lock(&s->lock);
    if (name_lookup(s, d.name)) {
        pthread_mutex_unlock(&s->lock);
        zo__tensor_free(t);
        return ZO_FAIL(&s->err, -EEXIST, "zo_store_register: '%s' is registered already", d.name);
    }
    if (claim(s, t) < 0) {
        pthread_mutex_unlock(&s->lock);
        zo__tensor_free(t);
        return -ENOMEM;
    }
    if (d.home == ZO_TIER_NVME) {
        zo__tier *tr = &s->tier[ZO_TIER_NVME];
        t->nvme_len = ZO_ALIGN_UP(bytes, (uint64_t)4096);
        if (t->nvme_len > tr->budget - tr->used) {
            unclaim(s, t);
            pthread_mutex_unlock(&s->lock);
            zo__tensor_free(t);
            return ZO_FAIL(&s->err, ZO_EBUDGET, "zo_store_register: '%s' (%llu bytes) exceeds the NVMe budget "
                           "(%llu of %llu used)", d.name, (unsigned long long)bytes, (unsigned long long)tr->used,
                           (unsigned long long)tr->budget);
        }
        tr->used += t->nvme_len;
        tr->home_bytes += t->nvme_len;
        if (tr->used > tr->peak)
            tr->peak = tr->used;
        pthread_mutex_unlock(&s->lock);
        r = zo_swap_alloc(s->swap, bytes, d.name, &t->sid);
        pthread_mutex_lock(&s->lock);
        if (r < 0) {
            tr->used -= t->nvme_len;
            tr->home_bytes -= t->nvme_len;
            unclaim(s, t);
            ZO_FAIL(&s->err, r, "%s", zo_swap_errmsg(s->swap));
            pthread_mutex_unlock(&s->lock);
            zo__tensor_free(t);
            return r;
        }
        zo__copy_to(s, t, ZO_TIER_NVME, ZO__CS_RESIDENT);
        t->c[ZO_TIER_NVME].ver = 1;
    } else {
        s->tier[d.home].space_round++;
        while ((r = zo__store_space(s, t, d.home, 0, 0)) == -EAGAIN)
            pthread_cond_wait(&s->cond, &s->lock);
        if (r < 0) {
            unclaim(s, t);
            pthread_mutex_unlock(&s->lock);
            zo__tensor_free(t);
            return r;
        }
        zo__copy_to(s, t, d.home, ZO__CS_RESIDENT);
        t->c[d.home].ver = 1;
    }
    pthread_mutex_unlock(&s->lock);
    /* zero the home copy (NVMe chunks never written read as zeros) */
    if (d.home == ZO_TIER_HOST) {
        memset(t->c[ZO_TIER_HOST].ptr, 0, bytes);
    } else if (d.home == ZO_TIER_DEVICE) {
        pthread_mutex_lock(&s->zero_lock);
        r = zo_memset_async(s->zero, t->c[ZO_TIER_DEVICE].ptr, 0, bytes);
        if (r == 0)
            r = zo_stream_sync(s->zero);
        pthread_mutex_unlock(&s->zero_lock);
        if (r < 0) {
            pthread_mutex_lock(&s->lock);
            zo__store_copy_free(s, t, d.home);
            unclaim(s, t);
            pthread_mutex_unlock(&s->lock);
            zo__tensor_free(t);
            return ZO_FAIL(&s->err, r, "zo_store_register: zeroing '%s' on the device failed", d.name);
        }
    }
    pthread_mutex_lock(&s->lock);
    t->listed = 1;
    t->next = s->tensors;
    if (s->tensors)
        s->tensors->prev = t;
    s->tensors = t;
    s->ntensors++;
    pthread_mutex_unlock(&s->lock);
    *out = t;
    return 0;
}

int zo__tensor_busy(const zo_tensor *t)
{
    if (t->streams || t->wb_count)
        return 1;
    for (int x = 0; x < ZO__NTIERS; x++)
        if (zo__copy_busy(&t->c[x]))
            return 1;
    return 0;
}

ZO_API int zo_store_unregister(zo_store *s, zo_tensor **tp)
{
    if (!s || !tp || !*tp)
        return -EINVAL;
    zo_tensor *t = *tp;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        int held = t->streams;
        for (int x = 0; x < ZO__NTIERS; x++)
            held |= t->c[x].refs || t->c[x].waiters;
        /* a checkpoint or a restore uses it with the lock dropped */
        int pinned = t->ckpt_pins || t->restoring;
        if (held || pinned) {
            /* it stays registered: usable again (a previous pass of this
             * loop may have marked it dying) */
            t->dying = 0;
            pthread_mutex_unlock(&s->lock);
            return ZO_FAIL(&s->err, -EBUSY, "zo_store_unregister: '%s' is %s", t->name,
                           pinned ? (t->restoring ? "being restored" : "in a checkpoint being written")
                                  : "referenced or streamed");
        }
        if (!zo__tensor_busy(t))
            break;
        t->dying = 1; /* no new prefetch of it while its transfers finish */
        zo__trace_forget_tensor(s, t);
        pthread_cond_wait(&s->cond, &s->lock);
    }
    t->dying = 0;
    for (int x = 0; x < ZO__NTIERS; x++)
        if (x != ZO_TIER_NVME)
            zo__store_copy_free(s, t, (zo_tier)x);
    if (t->home == ZO_TIER_NVME) {
        s->tier[ZO_TIER_NVME].used -= t->nvme_len;
        s->tier[ZO_TIER_NVME].home_bytes -= t->nvme_len;
        zo_swap_free(s->swap, t->sid);
    }
    zo__trace_forget_tensor(s, t);
    unclaim(s, t);
    if (t->prev)
        t->prev->next = t->next;
    else
        s->tensors = t->next;
    if (t->next)
        t->next->prev = t->prev;
    s->ntensors--;
    zo__store_retry_parked(s);
    pthread_mutex_unlock(&s->lock);
    zo__tensor_free(t);
    *tp = NULL;
    return 0;
}

ZO_API int zo_store_tensor_info(zo_store *s, const zo_tensor *t, zo_tensor_info *info)
{
    if (!s || !t || !info)
        return -EINVAL;
    memset(info, 0, sizeof(*info));
    pthread_mutex_lock(&s->lock);
    info->name = t->name;
    info->dtype = t->desc.dtype;
    info->ndim = t->desc.ndim;
    memcpy(info->shape, t->desc.shape, sizeof(info->shape));
    info->bytes = t->bytes;
    info->home = t->home;
    for (int x = 0; x < ZO__NTIERS; x++) {
        const zo__copy *c = &t->c[x];
        if (c->state == ZO__CS_LOADING || c->state == ZO__CS_WRITEBACK)
            info->state[x] = ZO_COPY_INFLIGHT;
        else if (zo__store_current(t, (zo_tier)x))
            info->state[x] = ZO_COPY_RESIDENT;
        else
            info->state[x] = ZO_COPY_ABSENT;
        info->refs[x] = c->refs;
        info->dirty[x] = x != (int)t->home && zo__store_current(t, (zo_tier)x) && !zo__store_current(t, t->home);
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}
