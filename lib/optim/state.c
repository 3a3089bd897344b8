/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's state seen from outside: initialisation of the masters,
 * per-tensor export / import of masters and states, save / load through the
 * store's crash-safe checkpoints, and the timeline.
 */
#include "optim_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/swap.h>
#include <zoffload/vec.h>

#define TILE_ELEMS ((size_t)1 << 20) /* elements staged per store read / write */

/* dst (ddt) = src (sdt): zo_vec_cast where it has the pair, else via fp32. */
static int convert(void *dst, zo_dtype ddt, const void *src, zo_dtype sdt, size_t n, float *scratch)
{
    if (ddt == sdt || ddt == ZO_DTYPE_F32 || sdt == ZO_DTYPE_F32)
        return zo_vec_cast(dst, ddt, src, sdt, n);
    int r = zo_vec_cast(scratch, ZO_DTYPE_F32, src, sdt, n);
    return r < 0 ? r : zo_vec_cast(dst, ddt, scratch, ZO_DTYPE_F32, n);
}

static int check_range(zo_optim *o, const char *fn, unsigned index, zo_optim_state which, zo_dtype dtype,
                       uint64_t off, uint64_t n, const void *buf)
{
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL engine", fn);
    if (!buf || index >= o->nt || (unsigned)which >= ZO_OPTIM_STATE_COUNT || n == 0 ||
        off > o->tensors[index].numel || n > o->tensors[index].numel - off)
        return ZO_FAIL(&o->err, -EINVAL, "%s: %s", fn,
                       !buf ? "NULL buffer"
                       : index >= o->nt ? "tensor index out of range"
                       : (unsigned)which >= ZO_OPTIM_STATE_COUNT ? "unknown state"
                                                                  : "range outside the tensor");
    if (dtype != ZO_DTYPE_F32 && dtype != ZO_DTYPE_BF16 && dtype != ZO_DTYPE_F16)
        return ZO_FAIL(&o->err, ZO_ENOTSUP, "%s: dtype %s (f32, bf16 or f16)", fn, zo_dtype_name(dtype));
    if (!o->groups[o->tensors[index].group].used[which])
        return ZO_FAIL(&o->err, ZO_ENOTSUP, "%s: the group's optimizer has no state %d", fn, (int)which);
    return 0;
}

static zo_dtype state_dtype(const zo_optim *o, unsigned group, int k)
{
    return k == ZO_OPTIM_STATE_MASTER ? ZO_DTYPE_F32 : o->groups[group].sdt;
}

/* state_io() of a quantized state (zo__og.qbits): each tile of whole
 * blocks covering the range is read and dequantized; a read converts its
 * part of it, a write replaces its part and requantizes the tile's blocks
 * (the other elements of a block the range shares with its neighbours keep
 * their values up to that block's new scale). */
static int q_io(zo_optim *o, unsigned group, int k, uint64_t lo, uint64_t hi, void *dst, const void *src,
                zo_dtype dtype)
{
    zo__og *og = &o->groups[group];
    size_t des = zo_dtype_size(dtype), B = og->qblock;
    int bits = og->qbits;
    zo_qmap map = zo__q_map(og, k);
    uint8_t *codes = malloc(TILE_ELEMS);
    float *scales = malloc(TILE_ELEMS / 64 * 4), *x = malloc(TILE_ELEMS * 4);
    int r = 0;
    if (!codes || !scales || !x) {
        r = -ENOMEM;
        goto out;
    }
    for (uint64_t e = lo; e < hi && r == 0;) {
        unsigned si = og->first_sg + (unsigned)((e - og->off) / og->sgsize);
        zo__sg *sg = &o->sgs[si];
        /* local range [a, b) in the sub-group; tile [t0, t1) of whole blocks */
        uint64_t a = e - sg->off, t0 = a / B * B;
        uint64_t end = ZO_MIN(hi, sg->off + sg->n) - sg->off;
        uint64_t t1 = ZO_MIN(ZO_MIN(t0 + TILE_ELEMS, sg->n), (end + B - 1) / B * B);
        uint64_t b = ZO_MIN(end, t1), cnt = t1 - t0;
        uint64_t coff = zo__q_code_bytes(t0, bits), cb = zo__q_code_bytes(cnt, bits);
        uint64_t soff = zo__q_scale_off(sg->n, bits) + 4 * (t0 / B), sb = 4 * zo__q_nscales(cnt, B);
        if ((r = zo_store_read(o->store, sg->t[k], coff, codes, cb)) < 0 ||
            (r = zo_store_read(o->store, sg->t[k], soff, scales, sb)) < 0 ||
            (r = zo_cpuadam_dequantize(codes, scales, cnt, map, bits, B, x)) < 0)
            break;
        if (dst) {
            r = zo_vec_cast((char *)dst + (e - lo) * des, dtype, x + (a - t0), ZO_DTYPE_F32, (size_t)(b - a));
        } else {
            if ((r = zo_vec_cast(x + (a - t0), ZO_DTYPE_F32, (const char *)src + (e - lo) * des, dtype,
                                 (size_t)(b - a))) < 0 ||
                (r = zo_cpuadam_quantize(x, cnt, map, bits, B, codes, scales)) < 0)
                break;
            if ((r = zo_store_write(o->store, sg->t[k], coff, codes, cb)) == 0)
                r = zo_store_write(o->store, sg->t[k], soff, scales, sb);
        }
        e = sg->off + b;
    }
    if (r < 0)
        ZO_FAIL(&o->err, r, "zo_optim: quantized state %s: %s", dst ? "read" : "write",
                zo_store_errmsg(o->store)[0] ? zo_store_errmsg(o->store) : zo_last_error_detail());
out:
    free(codes);
    free(scales);
    free(x);
    return r;
}

/* Walk flat range [lo, hi) of one state through the sub-groups it crosses,
 * a tile at a time: write (src given) or read (dst given), converting
 * between `dtype` and the state's type. */
static int state_io(zo_optim *o, unsigned group, int k, uint64_t lo, uint64_t hi, void *dst, const void *src,
                    zo_dtype dtype, int update_pbuf)
{
    zo__og *og = &o->groups[group];
    if (og->qbits && k != ZO_OPTIM_STATE_MASTER)
        return q_io(o, group, k, lo, hi, dst, src, dtype);
    zo_dtype sdt = state_dtype(o, group, k);
    size_t ses = zo_dtype_size(sdt), des = zo_dtype_size(dtype);
    void *tmp = malloc(TILE_ELEMS * 4);
    float *scratch = malloc(TILE_ELEMS * 4);
    int r = 0;
    if (!tmp || !scratch) {
        r = -ENOMEM;
        goto out;
    }
    for (uint64_t e = lo; e < hi;) {
        unsigned si = og->first_sg + (unsigned)((e - og->off) / og->sgsize);
        zo__sg *sg = &o->sgs[si];
        size_t cnt = (size_t)ZO_MIN(ZO_MIN(hi, sg->off + sg->n) - e, (uint64_t)TILE_ELEMS);
        uint64_t boff = (e - sg->off) * ses;
        if (dst) {
            if ((r = zo_store_read(o->store, sg->t[k], boff, tmp, cnt * ses)) < 0)
                break;
            if ((r = convert((char *)dst + (e - lo) * des, dtype, tmp, sdt, cnt, scratch)) < 0)
                break;
        } else {
            if ((r = convert(tmp, sdt, src ? (const char *)src + (e - lo) * des : NULL, dtype, cnt, scratch)) < 0)
                break;
            if ((r = zo_store_write(o->store, sg->t[k], boff, tmp, cnt * ses)) < 0)
                break;
            if (update_pbuf && (r = zo_vec_cast((char *)o->pbuf[o->pcur] + e * o->pes, o->pdt, tmp, ZO_DTYPE_F32,
                                                cnt)) < 0)
                break;
        }
        e += cnt;
    }
    if (r < 0)
        ZO_FAIL(&o->err, r, "zo_optim: state %s: %s", dst ? "read" : "write",
                zo_store_errmsg(o->store)[0] ? zo_store_errmsg(o->store) : zo_last_error_detail());
out:
    free(tmp);
    free(scratch);
    return r;
}

int zo_optim_state_export(zo_optim *o, unsigned index, zo_optim_state which, void *dst, zo_dtype dtype,
                          uint64_t off, uint64_t n)
{
    zo__enter(o);
    int r = check_range(o, "zo_optim_state_export", index, which, dtype, off, n, dst);
    if (r < 0)
        return r;
    if ((r = zo__optim_quiesce(o, 0)) < 0)
        return r;
    zo__ot *t = &o->tensors[index];
    return state_io(o, t->group, which, t->off + off, t->off + off + n, dst, NULL, dtype, 0);
}

int zo_optim_state_import(zo_optim *o, unsigned index, zo_optim_state which, const void *src, zo_dtype dtype,
                          uint64_t off, uint64_t n)
{
    zo__enter(o);
    int r = check_range(o, "zo_optim_state_import", index, which, dtype, off, n, src);
    if (r < 0)
        return r;
    if ((r = zo__optim_quiesce(o, 0)) < 0)
        return r;
    /* the parameter buffer follows the masters: it must hold the rest too */
    if (which == ZO_OPTIM_STATE_MASTER && (r = zo__pbuf_fresh(o, o->pcur)) < 0)
        return r;
    zo__ot *t = &o->tensors[index];
    r = state_io(o, t->group, which, t->off + off, t->off + off + n, NULL, src, dtype,
                 which == ZO_OPTIM_STATE_MASTER);
    if (r == 0 && which == ZO_OPTIM_STATE_MASTER)
        zo__masters_add(o, index, n);
    return r;
}

/* ---- raw quantized states ------------------------------------------------------------ */

int zo_optim_get_qstate_info(zo_optim *o, unsigned subgroup, zo_optim_qstate_info *uinfo)
{
    if (!o || !uinfo)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_get_qstate_info: NULL argument");
    int r = ZO_STRUCT_OUT(uinfo, (const zo_optim_qstate_info *)NULL, sizeof(zo_optim_qstate_info), &o->err,
                          "zo_optim_get_qstate_info");
    if (r < 0)
        return r;
    if (subgroup >= o->nsg)
        return ZO_FAIL(&o->err, -EINVAL, "zo_optim_get_qstate_info: sub-group %u out of range (the engine has %u)",
                       subgroup, o->nsg);
    const zo__sg *sg = &o->sgs[subgroup];
    const zo__og *og = &o->groups[sg->group];
    zo_optim_qstate_info in;
    memset(&in, 0, sizeof(in));
    in.group = sg->group;
    in.offset = sg->off - og->off;
    in.numel = sg->n;
    for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
        in.map[k] = -1;
    if (og->qbits) {
        in.bits = og->qbits;
        in.block = (uint32_t)og->qblock;
        in.code_bytes = zo__q_code_bytes(sg->n, og->qbits);
        in.nscales = zo__q_nscales(sg->n, og->qblock);
        for (int k = 1; k < ZO_OPTIM_STATE_COUNT; k++)
            if (og->used[k])
                in.map[k] = (int32_t)zo__q_map(og, k);
    }
    return ZO_STRUCT_OUT(uinfo, &in, sizeof(zo_optim_qstate_info), &o->err, "zo_optim_get_qstate_info");
}

/* What the raw calls share: the arguments against the sub-group's state,
 * then the engine's state (an update in flight is waited for). */
static int qraw_check(zo_optim *o, const char *fn, unsigned subgroup, zo_optim_state which, const void *codes,
                      uint64_t code_bytes, const void *absmax, uint64_t nscales)
{
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "%s: NULL engine", fn);
    if (!codes || !absmax)
        return ZO_FAIL(&o->err, -EINVAL, "%s: NULL %s", fn, codes ? "absmax" : "codes");
    if (subgroup >= o->nsg)
        return ZO_FAIL(&o->err, -EINVAL, "%s: sub-group %u out of range (the engine has %u)", fn, subgroup, o->nsg);
    if (which != ZO_OPTIM_STATE_EXP_AVG && which != ZO_OPTIM_STATE_EXP_AVG_SQ)
        return ZO_FAIL(&o->err, -EINVAL, "%s: state %d is not a moment (exp_avg or exp_avg_sq; masters are fp32: "
                       "zo_optim_state_export)", fn, (int)which);
    const zo__sg *sg = &o->sgs[subgroup];
    const zo__og *og = &o->groups[sg->group];
    if (!og->qbits)
        return ZO_FAIL(&o->err, ZO_ENOTSUP, "%s: group %u keeps its states as %s, not quantized (state_bits 0): "
                       "zo_optim_state_export / import", fn, sg->group, zo_dtype_name(og->sdt));
    if (!og->used[which] || !sg->t[which])
        return ZO_FAIL(&o->err, ZO_ENOTSUP, "%s: the optimizer of group %u has no state %d", fn, sg->group,
                       (int)which);
    uint64_t cb = zo__q_code_bytes(sg->n, og->qbits), ns = zo__q_nscales(sg->n, og->qblock);
    if (code_bytes != cb || nscales != ns)
        return ZO_FAIL(&o->err, -EINVAL, "%s: sub-group %u holds %llu code bytes and %llu scales per state "
                       "(%llu elements, q%d, block %zu), not %llu and %llu", fn, subgroup, (unsigned long long)cb,
                       (unsigned long long)ns, (unsigned long long)sg->n, og->qbits, og->qblock,
                       (unsigned long long)code_bytes, (unsigned long long)nscales);
    return 0;
}

int zo_optim_qstate_export(zo_optim *o, unsigned subgroup, zo_optim_state which, uint8_t *codes,
                           uint64_t code_bytes, float *absmax, uint64_t nscales)
{
    zo__enter(o);
    int r = qraw_check(o, "zo_optim_qstate_export", subgroup, which, codes, code_bytes, absmax, nscales);
    if (r < 0 || (r = zo__optim_quiesce(o, 0)) < 0)
        return r;
    zo__sg *sg = &o->sgs[subgroup];
    /* the store tensor: codes, then (64-byte aligned) the scales */
    uint64_t soff = zo__q_scale_off(sg->n, o->groups[sg->group].qbits);
    if ((r = zo_store_read(o->store, sg->t[which], 0, codes, code_bytes)) < 0 ||
        (r = zo_store_read(o->store, sg->t[which], soff, absmax, nscales * 4)) < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_qstate_export: sub-group %u: %s", subgroup, zo_store_errmsg(o->store));
    return 0;
}

int zo_optim_qstate_import(zo_optim *o, unsigned subgroup, zo_optim_state which, const uint8_t *codes,
                           uint64_t code_bytes, const float *absmax, uint64_t nscales)
{
    zo__enter(o);
    int r = qraw_check(o, "zo_optim_qstate_import", subgroup, which, codes, code_bytes, absmax, nscales);
    if (r < 0)
        return r;
    zo__sg *sg = &o->sgs[subgroup];
    int bits = o->groups[sg->group].qbits;
    /* what no step stores would be read by the next one as it is: refused
     * before anything is written */
    if (bits == 4 && (sg->n & 1) && (codes[code_bytes - 1] >> 4))
        return ZO_FAIL(&o->err, -EINVAL, "zo_optim_qstate_import: sub-group %u has %llu elements: the high nibble "
                       "of its last code byte is padding and must be 0, not %u", subgroup,
                       (unsigned long long)sg->n, (unsigned)(codes[code_bytes - 1] >> 4));
    for (uint64_t b = 0; b < nscales; b++)
        if (absmax[b] < 0 || isinf(absmax[b]))
            return ZO_FAIL(&o->err, -EINVAL, "zo_optim_qstate_import: sub-group %u: absmax %llu is %g (a scale is "
                           ">= 0, or NaN for a block that overflowed)", subgroup, (unsigned long long)b,
                           (double)absmax[b]);
    if ((r = zo__optim_quiesce(o, 0)) < 0)
        return r;
    uint64_t soff = zo__q_scale_off(sg->n, bits);
    if ((r = zo_store_write(o->store, sg->t[which], 0, codes, code_bytes)) < 0 ||
        (r = zo_store_write(o->store, sg->t[which], soff, absmax, nscales * 4)) < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_qstate_import: sub-group %u: %s", subgroup, zo_store_errmsg(o->store));
    return 0;
}

/* Zero the optimizer states (not the masters) of every sub-group. */
static int zero_states(zo_optim *o)
{
    void *z = calloc(TILE_ELEMS, 4);
    if (!z)
        return -ENOMEM;
    int r = 0;
    for (unsigned i = 0; i < o->nsg && r == 0; i++) {
        zo__sg *sg = &o->sgs[i];
        for (int k = 1; k < ZO_OPTIM_STATE_COUNT && r == 0; k++) {
            if (!sg->t[k])
                continue;
            /* fresh quantized states too: codes of 0 and scales of 0 read 0 */
            uint64_t bytes = zo__state_bytes(&o->groups[sg->group], k, sg->n);
            for (uint64_t e = 0; e < bytes && r == 0; e += TILE_ELEMS * 4)
                r = zo_store_write(o->store, sg->t[k], e, z, (size_t)ZO_MIN(bytes - e, (uint64_t)TILE_ELEMS * 4));
        }
    }
    free(z);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim: zeroing the states: %s", zo_store_errmsg(o->store));
    return 0;
}

int zo_optim_init_from_device(zo_optim *o)
{
    zo__enter(o);
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_init_from_device: NULL engine");
    for (unsigned g = 0; g < o->ngroups; g++)
        if (!o->groups[g].has_dev)
            return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_init_from_device: group %u has no dev_params", g);
    int r = zo__optim_quiesce(o, 1); /* everything is rewritten: also after a failed step */
    if (r < 0)
        return r;
    if (!o->pbuf[o->pcur]) {
        /* direct mode without a parameter buffer: widen the device params
         * (host memory) in place */
        for (unsigned i = 0; i < o->nt && r == 0; i++) {
            zo__ot *t = &o->tensors[i];
            r = state_io(o, t->group, ZO_OPTIM_STATE_MASTER, t->off, t->off + t->numel, NULL, t->dev, o->pdt, 0);
        }
        o->pbuf_stale[o->pcur] = 1;
        goto states;
    }
    /* the device params, exactly, into the parameter buffer; then widened */
    for (unsigned i = 0; i < o->nt; i++) {
        zo__ot *t = &o->tensors[i];
        if ((r = zo_memcpy_async(o->h2d, (char *)o->pbuf[o->pcur] + t->off * o->pes, t->dev, t->numel * o->pes,
                                 ZO_COPY_D2H)) < 0)
            break;
    }
    if (r == 0)
        r = zo_stream_sync(o->h2d);
    if (r < 0) {
        /* the parameter buffer is partly rewritten */
        o->failed = ZO__FAILED_INIT;
        return ZO_FAIL(&o->err, r, "zo_optim_init_from_device: copying the device params: %s", zo_dev_errmsg(o->dev));
    }
    o->pbuf_stale[o->pcur] = 0;
    for (unsigned g = 0; g < o->ngroups && r == 0; g++) {
        zo__og *og = &o->groups[g];
        r = state_io(o, g, ZO_OPTIM_STATE_MASTER, og->off, og->off + og->numel, NULL,
                     (const char *)o->pbuf[o->pcur] + og->off * o->pes, o->pdt, 0);
    }
states:
    if (r == 0)
        r = zero_states(o);
    if (r == 0) {
        o->params_current = 1;
        o->failed = 0;
        zo__masters_all_set(o);
    } else {
        /* masters or states partly rewritten (state_io / zero_states said why) */
        o->failed = ZO__FAILED_INIT;
    }
    return r;
}

int zo_optim_push_params(zo_optim *o)
{
    zo__enter(o);
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_push_params: NULL engine");
    int r = zo__optim_quiesce(o, 0);
    if (r < 0 || (r = zo__masters_check(o, "zo_optim_push_params")) < 0)
        return r;
    if (o->direct && (!o->pbuf[o->pcur] || o->pbuf_stale[o->pcur])) {
        /* the device params are the latest (the kernel wrote them; no
         * import since): nothing to copy */
        o->params_current = 1;
        return 0;
    }
    if ((r = zo__push_range(o, o->pcur, o->dcur, 0, o->numel)) == 0)
        r = zo_stream_sync(o->h2d);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_push_params: %s", zo_dev_errmsg(o->dev));
    o->params_current = 1;
    return 0;
}

/* ---- save / load --------------------------------------------------------------------- */

#define OPTIM_FORMAT 1

static int pending_grads(const zo_optim *o)
{
    if (o->micro % o->cfg.grad_accum_steps)
        return 1;
    for (unsigned i = 0; i < o->nt; i++)
        if (o->arrivals[o->win][i])
            return 1;
    return 0;
}

int zo_optim_save(zo_optim *o, const char *root, const char *name, unsigned keep_last, const char *user_json)
{
    zo__enter(o);
    if (!o || !root || !name)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_save: NULL argument");
    int r = zo__optim_quiesce(o, 0);
    if (r < 0)
        return r;
    if (pending_grads(o))
        return ZO_FAIL(&o->err, ZO_ESTATE,
                       "zo_optim_save: gradients accumulated but not applied (save at a step boundary)");
    int skip = o->cfg.no_grad == ZO_OPTIM_NO_GRAD_SKIP;
    size_t cap = 560 + (size_t)o->ngroups * 200 + (skip ? (size_t)o->nt * 24 : 0) + (user_json ? strlen(user_json) : 4);
    char *js = malloc(cap);
    if (!js)
        return -ENOMEM;
    size_t n = (size_t)snprintf(js, cap,
                                "{\"zo_optim\":{\"format\":%d,\"fingerprint\":\"%016" PRIx64 "\",\"step\":%" PRId64
                                ",\"micro\":%" PRIu64 ",\"boundaries\":%" PRIu64 ",\"skipped\":%" PRIu64
                                ",\"rollbacks\":%" PRIu64 ",\"scale\":\"%a\",\"scaler_iter\":%" PRId64
                                ",\"last_overflow\":%" PRId64 ",\"hysteresis\":%u,",
                                OPTIM_FORMAT, o->fingerprint, o->step, o->micro, o->boundaries, o->skipped,
                                o->rollbacks, o->scaler.scale, o->scaler.cur_iter, o->scaler.last_overflow_iter,
                                o->scaler.cur_hysteresis);
    if (skip) /* per-tensor update counts (ZO_OPTIM_NO_GRAD_SKIP) */
        for (unsigned i = 0; i < o->nt; i++)
            n += (size_t)snprintf(js + n, cap - n, "%s%" PRId64 "%s", i ? "," : "\"tensor_steps\":[", o->tstep[i],
                                  i + 1 == o->nt ? "]," : "");
    /* what a load into other state types needs: the layout without them,
     * and each group's state type ("f32", "bf16", "q8/256/0/1"...) */
    n += (size_t)snprintf(js + n, cap - n, "\"layout\":\"%016" PRIx64 "\",\"states\":[", o->layout_fingerprint);
    for (unsigned g = 0; g < o->ngroups; g++) {
        const zo__og *og = &o->groups[g];
        /* q<bits>/<block>/<m map>/<v map> (zo_qmap values); "q<bits>/<block>"
         * alone, as before maps were recorded, means the legacy maps */
        if (og->qbits && zo__optim_legacy_qmaps) /* the test hook: the old record */
            n += (size_t)snprintf(js + n, cap - n, "%s\"q%d/%zu\"", g ? "," : "", og->qbits, og->qblock);
        else if (og->qbits)
            n += (size_t)snprintf(js + n, cap - n, "%s\"q%d/%zu/%d/%d\"", g ? "," : "", og->qbits, og->qblock,
                                  (int)og->qmap[ZO_OPTIM_STATE_EXP_AVG], (int)og->qmap[ZO_OPTIM_STATE_EXP_AVG_SQ]);
        else
            n += (size_t)snprintf(js + n, cap - n, "%s\"%s\"", g ? "," : "", zo_dtype_name(og->sdt));
    }
    n += (size_t)snprintf(js + n, cap - n, "],\"groups\":[");
    for (unsigned g = 0; g < o->ngroups; g++) {
        const zo_cpuadam_hparams *hp = &o->groups[g].hp_next;
        n += (size_t)snprintf(js + n, cap - n, "%s\"%a,%a,%a,%a,%a,%d\"", g ? "," : "", hp->lr, hp->beta1,
                              hp->beta2, hp->eps, hp->weight_decay, hp->bias_correction);
    }
    snprintf(js + n, cap - n, "]},\"user\":%s}", user_json ? user_json : "null");
    r = zo_store_checkpoint(o->store, root, name, NULL, 0, keep_last, js);
    free(js);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_save: %s", zo_store_errmsg(o->store));
    return 0;
}

/* Value after "key": inside the engine's record (before "user"). */
static const char *field(const char *js, const char *end, const char *key)
{
    char pat[48];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(js, pat);
    return p && p < end ? p + strlen(pat) : NULL;
}

/* One group's saved hyperparameters at *p (advanced past them) into *hp. */
static int parse_hp(const char **p, zo_cpuadam_hparams *hp)
{
    int used = 0;
    if (sscanf(*p, "%*[,]\"%la,%la,%la,%la,%la,%d\"%n", &hp->lr, &hp->beta1, &hp->beta2, &hp->eps, &hp->weight_decay,
               &hp->bias_correction, &used) != 6 &&
        sscanf(*p, "\"%la,%la,%la,%la,%la,%d\"%n", &hp->lr, &hp->beta1, &hp->beta2, &hp->eps, &hp->weight_decay,
               &hp->bias_correction, &used) != 6)
        return -1;
    *p += used;
    return 0;
}

int zo__state_type_parse(const char *nm, zo__og *ck)
{
    int bits = 0, mm = 0, vm = 0, tail = 0, nf = 0;
    size_t block = 0;
    ck->qbits = 0;
    if (nm[0] == 'q')
        nf = sscanf(nm, "q%d/%zu%n/%d/%d%n", &bits, &block, &tail, &mm, &vm, &tail);
    if ((nf == 2 || nf == 4) && !nm[tail] && (bits == 8 || bits == 4) && block >= 64 && block <= ZO_QBLOCK_MAX &&
        !(block & (block - 1))) {
        ck->sdt = ZO_DTYPE_F32;
        ck->qbits = bits;
        ck->qblock = block;
        /* a record without maps was written before they could differ: the legacy ones */
        zo__q_default_maps(bits, 1, ck->qmap);
        if (nf == 4) {
            if (mm < 0 || mm >= ZO_QMAP_COUNT || vm < 0 || vm >= ZO_QMAP_COUNT || vm == ZO_QMAP_DYNAMIC_SIGNED ||
                vm == ZO_QMAP_LINEAR_SIGNED)
                return -2;
            ck->qmap[ZO_OPTIM_STATE_EXP_AVG] = (zo_qmap)mm;
            ck->qmap[ZO_OPTIM_STATE_EXP_AVG_SQ] = (zo_qmap)vm;
        }
        return 0;
    }
    if (zo_dtype_parse(nm, &ck->sdt) < 0 || (ck->sdt != ZO_DTYPE_F32 && ck->sdt != ZO_DTYPE_BF16))
        return -1;
    return 0;
}

/* Parse "states" of the record into ck[ngroups] (sdt, qbits, qblock). */
static int parse_states(zo_optim *o, const char *p, const char *end, zo__og *ck)
{
    if (!p || *p != '[')
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: the record has no state types");
    p++;
    for (unsigned g = 0; g < o->ngroups; g++) {
        char nm[32];
        int used = 0;
        if (sscanf(p, g ? ",\"%31[^\"]\"%n" : "\"%31[^\"]\"%n", nm, &used) != 1 || !used || p + used > end)
            return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: state type of group %u missing", g);
        p += used;
        ck[g] = o->groups[g];
        int r = zo__state_type_parse(nm, &ck[g]);
        if (r == -2)
            return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: group %u state type '%s': unknown code maps", g, nm);
        if (r < 0)
            return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: group %u state type '%s' unknown", g, nm);
    }
    return 0;
}

/* The engine record of checkpoint JSON js: counters, step, scaler, and the
 * hyperparameters of its first ngroups groups into hps (the engine's own
 * as the base of each). check_fp: the config fingerprint must be this
 * engine's, or (*conv set, ck[] holding them) that of this layout with the
 * record's other state types; 0: not checked (a resharded load takes a
 * shard of another world size, whose fingerprint differs by construction;
 * *conv 0). */
static int parse_record(zo_optim *o, const char *js, zo__scaler *sc, int64_t *step, uint64_t c[4],
                        zo_cpuadam_hparams *hps, unsigned ngroups, int check_fp, int *conv, zo__og *ck)
{
    const char *rec = strstr(js, "{\"zo_optim\":{");
    const char *end = rec ? strstr(rec, "]},\"user\":") : NULL;
    if (!rec || !end)
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: not an optimizer checkpoint (no engine record)");
    const char *p;
    int fmt = 0;
    if (!(p = field(rec, end, "format")) || sscanf(p, "%d", &fmt) != 1 || fmt != OPTIM_FORMAT)
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: record format %d, this library reads %d", fmt,
                       OPTIM_FORMAT);
    uint64_t fpr = 0;
    if (!(p = field(rec, end, "fingerprint")) || sscanf(p, "\"%" SCNx64 "\"", &fpr) != 1)
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: no config fingerprint");
    uint64_t lfp = 0;
    *conv = check_fp && fpr != o->fingerprint && (p = field(rec, end, "layout")) &&
            sscanf(p, "\"%" SCNx64 "\"", &lfp) == 1 && lfp == o->layout_fingerprint;
    if (*conv) {
        /* other state types, and the record's fingerprint is that of this
         * layout with them (else it was altered) */
        int r = parse_states(o, field(rec, end, "states"), end, ck);
        if (r < 0)
            return r;
        *conv = fpr == zo__config_fingerprint(o, 1, ck);
    }
    if (check_fp && !*conv && fpr != o->fingerprint)
        return ZO_FAIL(&o->err, ZO_EFORMAT,
                       "zo_optim_load: config fingerprint %016" PRIx64 " differs from this engine's %016" PRIx64
                       " (tensors, sizes, names, dtypes, optimizers or sub-group sizes changed)",
                       fpr, o->fingerprint);
    const char *keys[] = {"micro", "boundaries", "skipped", "rollbacks"};
    for (int i = 0; i < 4; i++)
        if (!(p = field(rec, end, keys[i])) || sscanf(p, "%" SCNu64, &c[i]) != 1)
            return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: field %s missing", keys[i]);
    *sc = o->scaler;
    if (!(p = field(rec, end, "step")) || sscanf(p, "%" SCNd64, step) != 1 ||
        !(p = field(rec, end, "scale")) || sscanf(p, "\"%la\"", &sc->scale) != 1 ||
        !(p = field(rec, end, "scaler_iter")) || sscanf(p, "%" SCNd64, &sc->cur_iter) != 1 ||
        !(p = field(rec, end, "last_overflow")) || sscanf(p, "%" SCNd64, &sc->last_overflow_iter) != 1 ||
        !(p = field(rec, end, "hysteresis")) || sscanf(p, "%u", &sc->cur_hysteresis) != 1)
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: step or scaler fields missing");
    if (!(p = field(rec, end, "groups")) || *p != '[')
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: groups missing");
    p++;
    for (unsigned g = 0; g < ngroups; g++) {
        hps[g] = o->groups[ZO_MIN(g, o->ngroups - 1)].hp_next;
        if (parse_hp(&p, &hps[g]) < 0)
            return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: hyperparameters of group %u missing", g);
        if (p > end)
            return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: hyperparameters run past the record");
    }
    return 0;
}

/* The checkpoint's tensors must be exactly the engine's store tensors,
 * each with the engine's dtype and shape, in the order a save writes them
 * (registration order: sub-group by sub-group, master, m, v). The store's
 * restore alone takes a checkpoint that lacks some (their states would stay
 * as they are, fresh or stale, under the restored step count and scaler)
 * and one whose same-size names were swapped in the manifest (each state
 * restored into the other's place): the order catches that, as the data
 * offsets stay in manifest order. types: the checkpoint's state types
 * when they differ from the engine's (a converting load), else NULL. */
static int check_tensor_set(zo_optim *o, zo_ckpt_reader *rd, const zo__og *types)
{
    unsigned n = zo_ckpt_count(rd), want = 0, k = 0;
    const char *ck = zo_ckpt_name(rd);
    for (unsigned i = 0; i < o->nsg; i++)
        for (int s = 0; s < ZO_OPTIM_STATE_COUNT; s++)
            want += o->sgs[i].t[s] != NULL;
    for (unsigned i = 0; i < o->nsg; i++)
        for (int s = 0; s < ZO_OPTIM_STATE_COUNT; s++) {
            if (!o->sgs[i].t[s])
                continue;
            zo_tensor_info ti;
            zo_ckpt_entry e;
            unsigned at;
            int r = zo_store_tensor_info(o->store, o->sgs[i].t[s], &ti);
            if (r < 0)
                return ZO_FAIL(&o->err, r, "zo_optim_load: %s", zo_store_errmsg(o->store));
            if (zo_ckpt_find(rd, ti.name, &at) < 0 || zo_ckpt_get_entry(rd, at, &e) < 0)
                return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: checkpoint %s lacks '%s' (it holds %u tensors, "
                               "this engine's states are %u): not a checkpoint of this engine", ck, ti.name, n, want);
            if (types && s != ZO_OPTIM_STATE_MASTER) {
                /* a load across state types: the checkpoint's own */
                const zo__og *cg = &types[o->sgs[i].group];
                ti.dtype = cg->qbits ? ZO_DTYPE_U8 : cg->sdt;
                ti.bytes = zo__state_bytes(cg, s, o->sgs[i].n);
                ti.shape[0] = ti.bytes / zo_dtype_size(ti.dtype);
            }
            int same = e.dtype == ti.dtype && e.ndim == ti.ndim && e.bytes == ti.bytes;
            for (unsigned d = 0; same && d < ti.ndim; d++)
                same = e.shape[d] == ti.shape[d];
            if (!same)
                return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: '%s' is %llu bytes of %s (%u dims) in checkpoint "
                               "%s, %llu bytes of %s (%u dims) in this engine", ti.name,
                               (unsigned long long)e.bytes, zo_dtype_name(e.dtype), e.ndim, ck,
                               (unsigned long long)ti.bytes, zo_dtype_name(ti.dtype), ti.ndim);
            if (at != k)
                return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: checkpoint %s holds '%s' as tensor %u, where this "
                               "engine saves it as tensor %u: names swapped or entries reordered", ck, ti.name, at, k);
            k++;
        }
    if (n != want)
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: checkpoint %s holds %u tensors, this engine's states are "
                       "%u: it has tensors this engine does not", ck, n, want);
    return 0;
}

/* State k of n elements: convert `src`, in group cg's type, to group og's
 * (dst, zo__state_bytes() of it) through fp32 x[n]: dequantize or widen,
 * then quantize (with og's block) or cast (round to nearest even). */
static int convert_state(const zo__og *cg, const zo__og *og, int k, uint64_t n, const uint8_t *src, uint8_t *dst,
                         float *x)
{
    int r = cg->qbits ? zo_cpuadam_dequantize(src, (const float *)(const void *)(src + zo__q_scale_off(n, cg->qbits)),
                                              (size_t)n, zo__q_map(cg, k), cg->qbits, cg->qblock, x)
                      : zo_vec_cast(x, ZO_DTYPE_F32, src, cg->sdt, (size_t)n);
    if (r < 0)
        return r;
    if (!og->qbits)
        return zo_vec_cast(dst, og->sdt, x, ZO_DTYPE_F32, (size_t)n);
    memset(dst, 0, zo__state_bytes(og, k, n)); /* the padding between codes and scales */
    return zo_cpuadam_quantize(x, (size_t)n, zo__q_map(og, k), og->qbits, og->qblock, dst,
                               (float *)(void *)(dst + zo__q_scale_off(n, og->qbits)));
}

/* zo_store_restore() for a checkpoint of other state types (ck[]): each
 * tensor is read (every chunk verified), masters as they are, states
 * converted, and written into the engine's store. */
static int restore_converting(zo_optim *o, const char *root, const char *name, const zo__og *ck)
{
    zo_ckpt_reader *rd = NULL;
    int r = zo_ckpt_open(&rd, root, name);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_load: %s", zo_last_error_detail());
    for (unsigned i = 0; i < o->nsg && r == 0; i++) {
        zo__sg *sg = &o->sgs[i];
        const zo__og *og = &o->groups[sg->group], *cg = &ck[sg->group];
        for (int k = 0; k < ZO_OPTIM_STATE_COUNT && r == 0; k++) {
            if (!sg->t[k])
                continue;
            zo_tensor_info ti;
            zo_ckpt_entry e;
            unsigned at;
            uint64_t eb = zo__state_bytes(og, k, sg->n);
            if ((r = zo_store_tensor_info(o->store, sg->t[k], &ti)) < 0 || (r = zo_ckpt_find(rd, ti.name, &at)) < 0 ||
                (r = zo_ckpt_get_entry(rd, at, &e)) < 0)
                break;
            uint8_t *buf = malloc(e.bytes), *out = malloc(eb);
            float *x = malloc(sg->n * 4);
            if (!buf || !out || !x)
                r = -ENOMEM;
            if (r == 0 && (r = zo_ckpt_read(rd, at, 0, buf, e.bytes)) < 0)
                ZO_FAIL(&o->err, r, "zo_optim_load: %s", zo_last_error_detail());
            int same = k == ZO_OPTIM_STATE_MASTER || (cg->qbits == og->qbits && cg->qblock == og->qblock &&
                                                      cg->sdt == og->sdt &&
                                                      (!og->qbits || cg->qmap[k] == og->qmap[k]));
            if (r == 0 && !same && (r = convert_state(cg, og, k, sg->n, buf, out, x)) < 0)
                ZO_FAIL(&o->err, r, "zo_optim_load: converting '%s': %s", ti.name, zo_last_error_detail());
            if (r == 0 && (r = zo_store_write(o->store, sg->t[k], 0, same ? buf : out, eb)) < 0)
                ZO_FAIL(&o->err, r, "zo_optim_load: writing '%s': %s", ti.name, zo_store_errmsg(o->store));
            free(buf);
            free(out);
            free(x);
        }
    }
    zo_ckpt_close(&rd);
    return r;
}

/* The per-tensor update counts of the record into ts[nt]: its
 * "tensor_steps", or every tensor at the engine's `step` when it has none
 * (a ZO_OPTIM_NO_GRAD_ZERO checkpoint). A ZERO engine takes only counts
 * that all equal `step`. */
static int parse_tensor_steps(zo_optim *o, const char *js, int64_t step, int64_t *ts)
{
    const char *rec = strstr(js, "{\"zo_optim\":{");
    const char *end = rec ? strstr(rec, "]},\"user\":") : NULL;
    const char *p = rec && end ? field(rec, end, "tensor_steps") : NULL;
    for (unsigned i = 0; i < o->nt; i++)
        ts[i] = step;
    if (!p)
        return 0;
    for (unsigned i = 0; i < o->nt; i++) {
        int used = 0;
        if (sscanf(p, i ? ",%" SCNd64 "%n" : "[%" SCNd64 "%n", &ts[i], &used) != 1 || ts[i] < 0 || p + used > end)
            return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: tensor_steps: entry %u missing or negative", i);
        p += used;
        if (o->cfg.no_grad != ZO_OPTIM_NO_GRAD_SKIP && ts[i] != step)
            return ZO_FAIL(&o->err, ZO_EFORMAT,
                           "zo_optim_load: tensor '%s' has its own update count %" PRId64 " (engine %" PRId64
                           "): the checkpoint is of an engine with ZO_OPTIM_NO_GRAD_SKIP; this one keeps one count",
                           o->tensors[i].name, ts[i], step);
    }
    if (*p != ']')
        return ZO_FAIL(&o->err, ZO_EFORMAT, "zo_optim_load: tensor_steps has more than %u entries", o->nt);
    return 0;
}

/* Take a loaded record: step, per-tensor counts, counters, scaler and
 * the hyperparameters (group g's from hps[map ? map[g] : g]); the
 * accumulation windows start empty. */
static void adopt(zo_optim *o, int64_t step, const int64_t *ts, const uint64_t c[4], const zo__scaler *sc,
                  const zo_cpuadam_hparams *hps, const unsigned *map)
{
    o->step = step;
    memcpy(o->tstep, ts, o->nt * sizeof(*ts));
    o->micro = c[0];
    o->boundaries = c[1];
    o->skipped = c[2];
    o->rollbacks = c[3];
    o->scaler = *sc;
    for (unsigned g = 0; g < o->ngroups; g++)
        o->groups[g].hp = o->groups[g].hp_next = hps[map ? map[g] : g];
    for (unsigned w = 0; w < o->nwin; w++) {
        memset(o->arrivals[w], 0, o->nt * sizeof(uint32_t));
        zo__win_reset(o, w);
        zo__gst_reset(o, w);
        o->win_scale[w] = sc->scale;
    }
    o->push_pending = 0;
    o->have_res = 0;
}

int zo__optim_adopt_record(zo_optim *o, const char *js, unsigned nrec, const unsigned *map)
{
    zo_cpuadam_hparams *hps = calloc(nrec ? nrec : 1, sizeof(*hps));
    int64_t *ts = calloc(o->nt, sizeof(*ts));
    zo__scaler sc;
    int64_t step = 0;
    uint64_t c[4];
    int r = hps && ts ? 0 : -ENOMEM;
    for (unsigned g = 0; g < o->ngroups && r == 0; g++)
        if (map[g] >= nrec)
            r = ZO_FAIL(&o->err, -EINVAL, "zo_optim_load: group %u maps to record group %u of %u", g, map[g], nrec);
    int conv = 0;
    if (r == 0 && (r = zo__optim_quiesce(o, 1)) == 0 &&
        (r = parse_record(o, js, &sc, &step, c, hps, nrec, 0, &conv, NULL)) == 0) {
        /* the partitioned engine refuses per-tensor counts: every shard is at the engine's step */
        for (unsigned i = 0; i < o->nt; i++)
            ts[i] = step;
        adopt(o, step, ts, c, &sc, hps, map);
    }
    free(hps);
    free(ts);
    return r;
}

int zo_optim_load(zo_optim *o, const char *root, const char *name, char *user_json, size_t len)
{
    zo__enter(o);
    if (!o || !root)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_load: NULL argument");
    int r = zo__optim_quiesce(o, 1);
    if (r < 0)
        return r;
    zo_ckpt_reader *rd = NULL;
    if ((r = zo_ckpt_open(&rd, root, name)) < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_load: %s", zo_last_error_detail());
    char *nm = strdup(zo_ckpt_name(rd));
    char *js = strdup(zo_ckpt_user_json(rd) ? zo_ckpt_user_json(rd) : "");
    zo_cpuadam_hparams *hps = calloc(o->ngroups, sizeof(*hps));
    zo__og *ck = calloc(o->ngroups, sizeof(*ck)); /* the checkpoint's state types, when they differ */
    int conv = 0;
    int64_t *ts = calloc(o->nt, sizeof(*ts));
    float *tmp = NULL;
    zo__scaler sc;
    int64_t step = 0;
    uint64_t c[4];
    if (!nm || !js || !hps || !ck || !ts) {
        r = -ENOMEM;
        goto out;
    }
    /* Everything that can be checked without reading the data is checked
     * before anything is overwritten (the record, its fingerprint, the
     * per-tensor update counts, the tensor set): on these errors the engine
     * is left exactly as it was. */
    if ((r = parse_record(o, js, &sc, &step, c, hps, o->ngroups, 1, &conv, ck)) < 0 ||
        (r = parse_tensor_steps(o, js, step, ts)) < 0 || (r = check_tensor_set(o, rd, conv ? ck : NULL)) < 0)
        goto out;
    zo_ckpt_close(&rd);
    /* From here on the states are being overwritten. A chunk's checksum is
     * only known once it is read, and the data is read once (a verifying
     * first pass would read the whole checkpoint twice): a failure now
     * (a corrupt chunk, an I/O error) leaves the states partly restored, so
     * the engine refuses everything that would use them until a load or
     * init_from_device() succeeds. */
    if (conv && (r = restore_converting(o, root, nm, ck)) < 0) {
        ZO_FAIL(&o->err, r, "%s; the engine refuses steps until a load succeeds", zo_optim_errmsg(o));
        goto failed;
    }
    if (!conv && (r = zo_store_restore(o->store, root, nm)) < 0) {
        ZO_FAIL(&o->err, r, "zo_optim_load: %s; the engine refuses steps until a load succeeds",
                zo_store_errmsg(o->store));
        goto failed;
    }
    adopt(o, step, ts, c, &sc, hps, NULL);
    /* the parameter buffer from the masters (the cast the fused step
     * does); in direct mode without a parameter buffer (every tensor has
     * device params, which are host memory) the device params themselves */
    int to_dev = !o->pbuf[o->pcur];
    if (!(tmp = malloc(TILE_ELEMS * 4))) {
        r = ZO_FAIL(&o->err, -ENOMEM, "zo_optim_load: no memory to rebuild the parameters");
        goto failed;
    }
    for (unsigned i = 0; i < o->nt && r == 0; i++) {
        zo__ot *t = &o->tensors[i];
        for (uint64_t e = t->off; e < t->off + t->numel && r == 0;) {
            size_t cnt = (size_t)ZO_MIN(t->off + t->numel - e, (uint64_t)TILE_ELEMS);
            void *dst = to_dev ? (char *)t->dev + (e - t->off) * o->pes : (char *)o->pbuf[o->pcur] + e * o->pes;
            if ((r = state_io(o, t->group, ZO_OPTIM_STATE_MASTER, e, e + cnt, tmp, NULL, ZO_DTYPE_F32, 0)) == 0)
                r = zo_vec_cast(dst, o->pdt, tmp, ZO_DTYPE_F32, cnt);
            e += cnt;
        }
    }
    if (r < 0)
        goto failed;
    o->pbuf_stale[o->pcur] = to_dev; /* rebuilt from the masters, unless it does not exist */
    if (!to_dev && (r = zo__push_range(o, o->pcur, o->dcur, 0, o->numel)) == 0)
        r = zo_stream_sync(o->h2d);
    if (r < 0) {
        ZO_FAIL(&o->err, r, "zo_optim_load: copying the params to the device: %s", zo_dev_errmsg(o->dev));
        goto failed;
    }
    o->failed = 0;
    zo__masters_all_set(o);
    o->params_current = 1;
    if (user_json && len) {
        const char *u = strstr(js, "]},\"user\":");
        u = u ? u + strlen("]},\"user\":") : "null";
        size_t ul = strlen(u);
        if (ul && u[ul - 1] == '}')
            ul--; /* the closing brace of the outer object */
        size_t k = ZO_MIN(ul, len - 1);
        memcpy(user_json, u, k);
        user_json[k] = '\0';
    }
    goto out;
failed:
    o->failed = ZO__FAILED_LOAD;
out:
    zo_ckpt_close(&rd);
    free(tmp);
    free(nm);
    free(js);
    free(hps);
    free(ck);
    free(ts);
    return r;
}

/* ---- timeline ------------------------------------------------------------------------- */

int zo_optim_get_timeline(zo_optim *o, zo_optim_timeline *tl)
{
    zo__enter(o);
    if (!o || !tl)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_get_timeline: NULL argument");
    int r = ZO_STRUCT_OUT(tl, (const zo_optim_timeline *)NULL, ZO_OPTIM_TIMELINE_SIZE_V1, &o->err,
                          "zo_optim_get_timeline");
    if (r < 0)
        return r;
    pthread_mutex_lock(&o->lock);
    zo_optim_timeline t = o->tl;
    r = o->have_tl ? 0 : -ENOENT;
    pthread_mutex_unlock(&o->lock);
    if (r == 0)
        ZO_STRUCT_OUT(tl, &t, ZO_OPTIM_TIMELINE_SIZE_V1, &o->err, "zo_optim_get_timeline");
    return r;
}

int zo_optim_timeline_json(zo_optim *o, char *buf, size_t len)
{
    zo__enter(o);
    zo_optim_timeline t = {.struct_size = sizeof(t)};
    int r = zo_optim_get_timeline(o, &t);
    if (r < 0)
        return r;
    if (!buf && len)
        return -EINVAL;
    int n = snprintf(buf, len,
                     "{\"step\":%" PRId64 ",\"total_ns\":%" PRIu64 ",\"d2h_ns\":%" PRIu64 ",\"d2h_bytes\":%" PRIu64
                     ",\"norm_ns\":%" PRIu64 ",\"compute_ns\":%" PRIu64 ",\"nvme_read_ns\":%" PRIu64
                     ",\"nvme_read_bytes\":%" PRIu64 ",\"nvme_write_ns\":%" PRIu64 ",\"nvme_write_bytes\":%" PRIu64
                     ",\"h2d_ns\":%" PRIu64 ",\"h2d_bytes\":%" PRIu64 ",\"stall_ns\":%" PRIu64 ",\"update_ns\":%" PRIu64 "}",
                     t.step, t.total_ns, t.d2h_ns, t.d2h_bytes, t.norm_ns, t.compute_ns, t.nvme_read_ns,
                     t.nvme_read_bytes, t.nvme_write_ns, t.nvme_write_bytes, t.h2d_ns, t.h2d_bytes, t.stall_ns,
                     t.update_ns);
    return n;
}
