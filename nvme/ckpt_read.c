/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints, the reader: open one (by name or through `latest`, whose
 * crc32c of the manifest must match), list its tensors, and read them
 * back chunk by chunk, each chunk checked against its crc32c. */
#define ZO_MODULE "ckpt"
#include "core/internal.h"
#include "nvme/nvme_internal.h"

#if ZO_HAVE_CJSON
#include <stdlib.h>
#include <string.h>

#include <zoffload/aio.h>
#include <zoffload/mem.h>

#define CKPT_MAX_MANIFEST (1ull << 30)

/* ---- reader ----------------------------------------------------------------------------- */
ZO_API void zo_ckpt_close(zo_ckpt_reader **rp)
{
    if (!rp || !*rp)
        return;
    zo_ckpt_reader *r = *rp;
    zo_file_close(&r->data);
    zo_aio_destroy(&r->aio);
    zo__ckpt_tensors_free(r->t, r->n);
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
        if ((r = zo__ckpt_read_latest(root, nm, sizeof(nm), &want_crc)) < 0)
            return r;
        name = nm;
    } else if (!zo__ckpt_name_ok(name)) {
        return ZO_FAIL(NULL, -EINVAL, "zo_ckpt_open: invalid checkpoint name '%s'", name);
    }
    zo_ckpt_reader *rd = calloc(1, sizeof(*rd));
    if (!rd)
        return -ENOMEM;
    char *mpath = NULL, *dpath = NULL, *text = NULL;
    size_t tlen;
    rd->dir = zo__ckpt_path_join(root, name);
    mpath = rd->dir ? zo__ckpt_path_join(rd->dir, ZO__CKPT_MANIFEST) : NULL;
    dpath = rd->dir ? zo__ckpt_path_join(rd->dir, ZO__CKPT_DATA) : NULL;
    if (!mpath || !dpath) {
        r = -ENOMEM;
        goto fail;
    }
    if ((r = zo__ckpt_read_file(mpath, &text, &tlen, CKPT_MAX_MANIFEST)) < 0) {
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
    if ((r = zo__ckpt_manifest_parse(rd, text, mpath)) < 0)
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
    zo__ckpt_tensor *t = &r->t[i];
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
#endif /* ZO_HAVE_CJSON */
