/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints: manifest.json, built from a writer's tensors at commit
 * and parsed (every field checked) into a reader at open. */
#define ZO_MODULE "ckpt"
#include "core/internal.h"
#include "nvme/nvme_internal.h"

#if ZO_HAVE_CJSON
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <zoffload/aio.h>

#define CKPT_FORMAT "zoffload-checkpoint"

/* ---- manifest ------------------------------------------------------------------------ */
static int json_u64(const cJSON *o, const char *key, uint64_t *out, const char *where)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (double)ZO__CKPT_JSON_INT_MAX ||
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

cJSON *zo__ckpt_manifest_build(zo_ckpt_writer *w)
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
    cJSON_AddStringToObject(m, "data_file", ZO__CKPT_DATA);
    cJSON_AddNumberToObject(m, "data_bytes", (double)w->data_end);
    cJSON *arr = cJSON_AddArrayToObject(m, "tensors");
    for (unsigned i = 0; arr && i < w->n; i++) {
        zo__ckpt_tensor *t = &w->t[i];
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
int zo__ckpt_manifest_parse(zo_ckpt_reader *r, const char *text, const char *where)
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
    if (!libver || !name || !csum || strcmp(csum, "crc32c") != 0 || !dfile || strcmp(dfile, ZO__CKPT_DATA) != 0) {
        ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: library_version, name, checksum (crc32c) or data_file (%s) missing "
                "or wrong", where, ZO__CKPT_DATA);
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
        zo__ckpt_tensor *t = &r->t[r->n];
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
            if (!cJSON_IsNumber(dim) || dim->valuedouble < 0 || dim->valuedouble >= (double)ZO__CKPT_JSON_INT_MAX ||
                dim->valuedouble != (double)(uint64_t)dim->valuedouble) {
                ZO_FAIL(NULL, ZO_EFORMAT, "manifest %s: shape holds a non-integer", w2);
                goto out;
            }
            t->e.shape[t->e.ndim++] = (uint64_t)dim->valuedouble;
        }
        if (t->e.bytes == 0 || t->offset % ZO__CKPT_ALIGN || t->offset < prev_end || t->offset > data_bytes ||
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
        ret = ZO_FAIL(NULL, ZO_ETRUNC, "checkpoint %s: %s has %llu bytes, the manifest needs %llu", where,
                      ZO__CKPT_DATA, (unsigned long long)fi.size, (unsigned long long)data_bytes);
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
#endif /* ZO_HAVE_CJSON */
