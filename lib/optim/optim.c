/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The offload optimizer engine: configuration, sub-group layout, buffers,
 * gradient intake and the step calls of the driving thread. The update
 * itself runs on the worker (step.c); state import/export and save/load are
 * in state.c.
 */
#include "optim_internal.h"

#include <math.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zoffload/aio.h>
#include <zoffload/mem.h>
#include <zoffload/swap.h>
#include <zoffload/vec.h>

int zo__optim_force_copy;
int zo__optim_legacy_qmaps;

/* state_bits and state_block were added in what was the struct's tail
 * padding: its size (which create checks, and the Python ctypes mirror
 * sets) is what it was with state_dtype last. */
_Static_assert(sizeof(zo_optim_group) == (offsetof(zo_optim_group, state_dtype) + sizeof(zo_dtype) +
                                          _Alignof(zo_optim_group) - 1) / _Alignof(zo_optim_group) *
                                             _Alignof(zo_optim_group),
               "zo_optim_group grew: state_bits / state_block no longer fit its old tail padding");

void zo_optim_group_default(zo_optim_group *g)
{
    if (!g)
        return;
    memset(g, 0, sizeof(*g));
    g->struct_size = sizeof(*g);
    g->placement = ZO_OPTIM_PLACE_DEFAULT;
    g->state_dtype = ZO_DTYPE_F32;
}

void zo_optim_config_default(zo_optim_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    /* no default: a guess (it was bf16) writes bf16 into an fp32 trainer's
     * buffers with rc 0 everywhere; create asks for it instead */
    cfg->param_dtype = ZO_DTYPE_COUNT;
    cfg->grad_dtype = ZO_DTYPE_COUNT;
    zo_cpuadam_hparams_default(&cfg->hparams, ZO_OPTIM_ADAMW);
    cfg->placement = ZO_OPTIM_PLACE_HOST;
    cfg->pin_memory = 1;
    cfg->buffer_count = 4;
    cfg->sub_group_size = (uint64_t)1 << 24;
    cfg->grad_staging_bytes = (size_t)32 << 20;
    cfg->aio_block_size = (size_t)1 << 20;
    cfg->aio_queue_depth = 32;
    cfg->aio_threads = 1;
    cfg->initial_scale_power = 16;
    cfg->loss_scale_window = 1000;
    cfg->hysteresis = 2;
    cfg->min_loss_scale = 1.0;
    cfg->grad_accum_steps = 1;
    cfg->clip_mode = ZO_OPTIM_CLIP_TWO_PASS;
    cfg->nonfinite = ZO_OPTIM_NONFINITE_ERROR;
    cfg->no_grad = ZO_OPTIM_NO_GRAD_ZERO;
    cfg->state_map_m = ZO_QMAP_COUNT; /* the per-width default (zo__q_default_maps()) */
    cfg->state_map_v = ZO_QMAP_COUNT;
    cfg->dpu_warmup_steps = 1;
    cfg->numa_node = -1;
}

void zo_optim_step_opts_default(zo_optim_step_opts *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof(*opts));
    opts->struct_size = sizeof(*opts);
    opts->global_sumsq = -1.0;
    opts->global_nonfinite = -1;
}

const char *zo_optim_errmsg(const zo_optim *o)
{
    static _Thread_local char tls[ZO_ERRMSG_LEN];
    return zo__errbuf_tls(o ? &o->err : NULL, tls);
}

/* ---- helpers ------------------------------------------------------------------- */

static const char *const state_suffix[ZO_OPTIM_STATE_COUNT] = {"master", "exp_avg", "exp_avg_sq"};

uint64_t zo__fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    return zo__fnv1a(h, &v, sizeof(v));
}

/* The configuration a checkpoint must match: dtypes, groups, optimizers,
 * sub-group sizes, tensors and names; with `states`, also each group's
 * state type (without: the layout, which a load across state types needs
 * to match). A group of fp32 states hashes the same either way, and the
 * quantized fields only when set, so fingerprints of engines made before
 * quantized states stay what they were. types: other state types per
 * group (a checkpoint's), or NULL: the engine's. */
uint64_t zo__config_fingerprint(const zo_optim *o, int states, const zo__og *types)
{
    uint64_t fp = 0xcbf29ce484222325ull;
    fp = fnv_u64(fp, 1); /* layout version */
    fp = fnv_u64(fp, (uint64_t)o->pdt);
    fp = fnv_u64(fp, (uint64_t)o->gdt);
    fp = fnv_u64(fp, o->ngroups);
    for (unsigned g = 0; g < o->ngroups; g++) {
        const zo__og *og = &o->groups[g], *st = types ? &types[g] : og;
        fp = fnv_u64(fp, (uint64_t)og->hp.kind);
        fp = fnv_u64(fp, (uint64_t)(states ? st->sdt : ZO_DTYPE_F32));
        fp = fnv_u64(fp, og->sgsize);
        if (states && st->qbits)
            fp = fnv_u64(fp, ((uint64_t)st->qbits << 32) | st->qblock);
        /* maps other than the legacy ones: a library that knows only those
         * (and a record without maps) then has another fingerprint, so it
         * cannot take these codes for legacy ones */
        if (states && st->qbits && !zo__q_legacy_maps(st))
            fp = fnv_u64(fp, 0x716d6170ull << 32 | (uint64_t)st->qmap[ZO_OPTIM_STATE_EXP_AVG] << 16 |
                                 (uint64_t)st->qmap[ZO_OPTIM_STATE_EXP_AVG_SQ]);
        fp = fnv_u64(fp, og->ntensors);
        for (unsigned i = og->first_tensor; i < og->first_tensor + og->ntensors; i++) {
            fp = fnv_u64(fp, o->tensors[i].numel);
            fp = zo__fnv1a(fp, o->tensors[i].name, strlen(o->tensors[i].name) + 1);
        }
    }
    return fp;
}

/* Which states an optimizer uses. */
static void states_used(zo_optim_kind k, int used[ZO_OPTIM_STATE_COUNT])
{
    used[ZO_OPTIM_STATE_MASTER] = 1;
    used[ZO_OPTIM_STATE_EXP_AVG] = k != ZO_OPTIM_ADAGRAD;
    used[ZO_OPTIM_STATE_EXP_AVG_SQ] = k != ZO_OPTIM_LION;
}

unsigned zo__q_map_users(const zo_optim_config *cfg)
{
    unsigned u = 0;
    for (unsigned g = 0; g < cfg->ngroups; g++) {
        const zo_optim_group *ug = &cfg->groups[g];
        int used[ZO_OPTIM_STATE_COUNT];
        if (!ug->state_bits)
            continue;
        states_used(ug->hparams ? ug->hparams->kind : cfg->hparams.kind, used);
        for (int k = ZO_OPTIM_STATE_EXP_AVG; k <= ZO_OPTIM_STATE_EXP_AVG_SQ; k++)
            if (used[k])
                u |= 1u << k;
    }
    return u;
}

int zo__optim_check_maps(const zo_optim_config *cfg, zo_errbuf *eb, const char *fn)
{
    zo_qmap m = cfg->state_map_m, v = cfg->state_map_v;
    /* the kernel takes any map for either state, but a signed map spends
     * half its codes on negative v's that never occur, and an unsigned one
     * cannot hold a negative m */
    if (m != ZO_QMAP_COUNT && m != ZO_QMAP_DYNAMIC_SIGNED && m != ZO_QMAP_LINEAR_SIGNED)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: state_map_m %d: m is signed: ZO_QMAP_DYNAMIC_SIGNED (%d), "
                       "ZO_QMAP_LINEAR_SIGNED (%d), or ZO_QMAP_COUNT (%d) for the default", fn, (int)m,
                       (int)ZO_QMAP_DYNAMIC_SIGNED, (int)ZO_QMAP_LINEAR_SIGNED, (int)ZO_QMAP_COUNT);
    if (v != ZO_QMAP_COUNT && v != ZO_QMAP_DYNAMIC_UNSIGNED && v != ZO_QMAP_LINEAR_UNSIGNED &&
        v != ZO_QMAP_DYNAMIC_UNSIGNED_NZ && v != ZO_QMAP_LINEAR_UNSIGNED_NZ)
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: state_map_v %d: v is unsigned: ZO_QMAP_DYNAMIC_UNSIGNED (%d), "
                       "ZO_QMAP_LINEAR_UNSIGNED (%d), ZO_QMAP_DYNAMIC_UNSIGNED_NZ (%d), ZO_QMAP_LINEAR_UNSIGNED_NZ "
                       "(%d), or ZO_QMAP_COUNT (%d) for the default", fn, (int)v, (int)ZO_QMAP_DYNAMIC_UNSIGNED,
                       (int)ZO_QMAP_LINEAR_UNSIGNED, (int)ZO_QMAP_DYNAMIC_UNSIGNED_NZ,
                       (int)ZO_QMAP_LINEAR_UNSIGNED_NZ, (int)ZO_QMAP_COUNT);
    /* a map nothing uses would be ignored without a word: the caller
     * meant some state to be quantized with it */
    unsigned u = zo__q_map_users(cfg);
    if (m != ZO_QMAP_COUNT && !(u & 1u << ZO_OPTIM_STATE_EXP_AVG))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: state_map_m %d is set but no group has quantized states (state_bits 8 "
                       "or 4): it would be ignored; leave it ZO_QMAP_COUNT", fn, (int)m);
    if (v != ZO_QMAP_COUNT && !(u & 1u << ZO_OPTIM_STATE_EXP_AVG_SQ))
        return ZO_FAIL(eb, ZO_ECONFIG, "%s: state_map_v %d is set but no group has a quantized v (state_bits 8 or "
                       "4, and not Lion, which keeps no v): it would be ignored; leave it ZO_QMAP_COUNT", fn, (int)v);
    return 0;
}

/* step, grad_scale and clip_coef belong to the engine (its update count,
 * loss scale and clip coefficient): a group that sets them would have them
 * silently replaced, so anything but zo_cpuadam_hparams_default()'s 1 is
 * refused. */
static int check_engine_fields(zo_optim *o, const zo_cpuadam_hparams *hp, unsigned g, const char *fn)
{
    if (hp->step == 1 && hp->grad_scale == 1.0 && hp->clip_coef == 1.0)
        return 0;
    return ZO_FAIL(&o->err, ZO_ECONFIG,
                   "%s: group %u hparams set step %lld, grad_scale %g, clip_coef %g: the engine sets these itself "
                   "(its update count: zo_optim_set_step(); the loss scale; max_grad_norm clipping): leave them at "
                   "zo_cpuadam_hparams_default()'s 1",
                   fn, g, (long long)hp->step, hp->grad_scale, hp->clip_coef);
}

/* What quantized moments cannot do, refused at create with the reason:
 * the q kernel has no Adagrad and no rollback (the speculative step takes
 * updates back), and a block is requantized whole, so elements of a
 * tensor skipped under ZO_OPTIM_NO_GRAD_SKIP would change with their
 * block's neighbours. */
static int check_quantized(zo_optim *o, const zo_optim_config *cfg, const zo_cpuadam_hparams *hp, unsigned g)
{
    if (hp->kind == ZO_OPTIM_ADAGRAD)
        return ZO_FAIL(&o->err, ZO_ENOTSUP, "zo_optim_create: group %u: Adagrad has no quantized state (state_bits %u): "
                       "use state_bits 0", g, o->groups[g].qbits);
    if (cfg->clip_mode == ZO_OPTIM_CLIP_SPECULATIVE)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u: the speculative step rolls updates back and "
                       "quantized states (state_bits %d) cannot be rolled back: use ZO_OPTIM_CLIP_TWO_PASS", g,
                       o->groups[g].qbits);
    if (cfg->no_grad == ZO_OPTIM_NO_GRAD_SKIP)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u: ZO_OPTIM_NO_GRAD_SKIP leaves tensors "
                       "untouched, but a quantized block (state_bits %d) is requantized whole, across tensors: use "
                       "ZO_OPTIM_NO_GRAD_ZERO", g, o->groups[g].qbits);
    return 0;
}

/* Validate hyperparameters by the kernel's own rules: one step on one element. */
static int check_hparams(zo_optim *o, const zo_cpuadam_hparams *hp, unsigned g, zo_dtype sdt)
{
    float p = 0.f, gr = 0.f, m = 0.f, v = 0.f;
    uint16_t m16 = 0, v16 = 0;
    zo_cpuadam_tensors t;
    zo_cpuadam_tensors_default(&t);
    t.n = 1;
    t.param = &p;
    t.grad = &gr;
    t.grad_dtype = ZO_DTYPE_F32;
    t.state_dtype = sdt;
    t.exp_avg = sdt == ZO_DTYPE_BF16 ? (void *)&m16 : (void *)&m;
    t.exp_avg_sq = sdt == ZO_DTYPE_BF16 ? (void *)&v16 : (void *)&v;
    int r = zo_cpuadam_step(hp, &t, 1);
    if (r < 0)
        return ZO_FAIL(&o->err, r == -EINVAL ? ZO_ECONFIG : r, "zo_optim_create: group %u hyperparameters: %s", g,
                       zo_last_error_detail());
    return 0;
}

void zo__acc_add(float *dst, const void *src, zo_dtype dt, size_t n, int first)
{
    if (first) {
        zo_vec_cast(dst, ZO_DTYPE_F32, src, dt, n);
        return;
    }
    if (dt == ZO_DTYPE_F32) {
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] += s[i];
    } else if (dt == ZO_DTYPE_BF16) {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)s[i] << 16;
            float f;
            memcpy(&f, &u, sizeof(f));
            dst[i] += f;
        }
    } else {
        /* widen a tile at a time with the dispatched cast, then add */
        float tmp[1024];
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i += 1024) {
            size_t k = ZO_MIN(n - i, (size_t)1024);
            zo_vec_cast(tmp, ZO_DTYPE_F32, s + i, ZO_DTYPE_F16, k);
            for (size_t j = 0; j < k; j++)
                dst[i + j] += tmp[j];
        }
    }
}

/* Host memory the engine allocates: pinned (and registered with the device)
 * when asked and within the budget, else ordinary aligned memory. */
static int pin_try(zo_optim *o, void **out, size_t bytes)
{
    if (!o->cfg.pin_memory || (o->cfg.pinned_bytes && o->pinned_bytes + bytes > o->cfg.pinned_bytes))
        return 0;
    zo_pin_opts po;
    zo_pin_opts_default(&po);
    po.numa_node = o->cfg.numa_node;
    po.dev = o->dev;
    po.flags = 0;
    if (zo_pinned_alloc(out, bytes, &po) < 0)
        return 0;
    o->pinned_bytes += bytes;
    return 1;
}

static int host_alloc(zo_optim *o, void **out, size_t bytes, int want_pinned, int *pinned)
{
    *pinned = 0;
    if (want_pinned && pin_try(o, out, bytes)) {
        *pinned = 1;
        return 0;
    }
    int r = zo_aligned_alloc(out, ZO_ALIGN_UP(bytes, (size_t)64), 64);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_create: cannot allocate %zu bytes of host memory", bytes);
    memset(*out, 0, bytes);
    o->host_bytes += bytes;
    return 0;
}

static void host_free(void *p, int pinned)
{
    if (pinned)
        zo_pinned_free(p);
    else
        zo_aligned_free(p);
}

/* The parameter buffer exists (direct mode makes it on first use; its
 * contents are then the device's, read back by zo__pbuf_fresh()). Caller's
 * thread, no job running. */
int zo__pbuf_need(zo_optim *o, unsigned b)
{
    if (o->pbuf[b])
        return 0;
    int r = host_alloc(o, &o->pbuf[b], (size_t)o->numel * o->pes, 1, &o->pbuf_pinned[b]);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim: cannot allocate the %llu-byte parameter buffer",
                       (unsigned long long)(o->numel * o->pes));
    o->pbuf_stale[b] = 1;
    return 0;
}

/* ---- layout --------------------------------------------------------------------- */

/* The groups, tensors and sub-groups of cfg, checked. with_sgs 0 (an
 * estimate) leaves the per-sub-group arrays out: a plan for 10^14
 * parameters has millions of sub-groups and needs only their sizes. */
static int layout(zo_optim *o, const zo_optim_config *cfg, int with_sgs)
{
    unsigned nt = 0;
    for (unsigned g = 0; g < cfg->ngroups; g++) {
        const zo_optim_group *ug = &cfg->groups[g];
        /* the first published version is today's: anything else was not
         * filled by zo_optim_group_default() */
        if (ug->struct_size != sizeof(zo_optim_group))
            return ZO_FAIL(&o->err, -EINVAL,
                           "zo_optim_create: group %u struct_size %zu is not that of a zo_optim_group (%zu): fill it "
                           "with zo_optim_group_default()", g, ug->struct_size, sizeof(zo_optim_group));
        if (ug->ntensors == 0 || !ug->numel)
            return ZO_FAIL(&o->err, -EINVAL, "zo_optim_create: group %u has no tensors", g);
        if (ug->ntensors > (1u << 24) || nt + ug->ntensors > (1u << 24))
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: more than 2^24 tensors");
        nt += ug->ntensors;
    }
    int r = zo__optim_check_maps(cfg, &o->err, "zo_optim_create");
    if (r < 0)
        return r;
    o->groups = calloc(cfg->ngroups, sizeof(*o->groups));
    o->tensors = calloc(nt, sizeof(*o->tensors));
    if (!o->groups || !o->tensors)
        return -ENOMEM;
    o->ngroups = cfg->ngroups;
    o->nt = nt;
    unsigned ti = 0, nsg = 0;
    uint64_t off = 0;
    for (unsigned g = 0; g < cfg->ngroups; g++) {
        const zo_optim_group *ug = &cfg->groups[g];
        zo__og *og = &o->groups[g];
        og->hp = ug->hparams ? *ug->hparams : cfg->hparams;
        og->place = ug->placement == ZO_OPTIM_PLACE_DEFAULT ? cfg->placement : ug->placement;
        if (og->place != ZO_OPTIM_PLACE_HOST && og->place != ZO_OPTIM_PLACE_NVME)
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u placement %d unknown", g, (int)og->place);
        og->sgsize = ug->sub_group_size ? ug->sub_group_size : cfg->sub_group_size;
        if (og->sgsize < 64 || og->sgsize > ((uint64_t)1 << 32))
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u sub_group_size %llu out of [64, 2^32]", g,
                           (unsigned long long)og->sgsize);
        og->sdt = ug->state_dtype;
        if (og->sdt != ZO_DTYPE_F32 && og->sdt != ZO_DTYPE_BF16)
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u state_dtype %s (f32 or bf16)", g,
                           zo_dtype_name(og->sdt));
        og->qbits = ug->state_bits;
        og->qblock = ug->state_block ? ug->state_block : ug->state_bits == 4 ? 128 : 256;
        zo__q_default_maps(og->qbits, zo__optim_legacy_qmaps, og->qmap);
        /* the caller's maps (checked above); the legacy hook, which makes
         * old-format checkpoints in tests, still wins */
        if (og->qbits && !zo__optim_legacy_qmaps) {
            if (cfg->state_map_m != ZO_QMAP_COUNT)
                og->qmap[ZO_OPTIM_STATE_EXP_AVG] = cfg->state_map_m;
            if (cfg->state_map_v != ZO_QMAP_COUNT)
                og->qmap[ZO_OPTIM_STATE_EXP_AVG_SQ] = cfg->state_map_v;
        }
        if (og->qbits != 0 && og->qbits != 8 && og->qbits != 4)
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u state_bits %d (0: state_dtype, 8: q8, 4: q4)",
                           g, og->qbits);
        /* a power of two: NVMe sweep pieces start on swap chunks (powers of
         * two), so they then start on whole blocks */
        if (og->qbits && (og->qblock < 64 || og->qblock > ZO_QBLOCK_MAX || (og->qblock & (og->qblock - 1))))
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u state_block %zu (a power of two in [64, %d])",
                           g, og->qblock, ZO_QBLOCK_MAX);
        if (og->qbits && og->sdt != ZO_DTYPE_F32)
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u: state_bits %d quantizes fp32 moments: leave "
                           "state_dtype at f32, not %s", g, og->qbits, zo_dtype_name(og->sdt));
        if (og->hp.struct_size != sizeof(zo_cpuadam_hparams) || og->hp.kind < 0 || og->hp.kind >= ZO_OPTIM_KIND_COUNT)
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: group %u hparams not filled by "
                           "zo_cpuadam_hparams_default()", g);
        r = check_engine_fields(o, &og->hp, g, "zo_optim_create");
        if (r < 0)
            return r;
        r = check_hparams(o, &og->hp, g, og->sdt);
        if (r < 0)
            return r;
        if (cfg->clip_mode == ZO_OPTIM_CLIP_SPECULATIVE &&
            ((og->hp.kind != ZO_OPTIM_ADAMW && og->hp.kind != ZO_OPTIM_ADAM) || og->sdt != ZO_DTYPE_F32))
            return ZO_FAIL(&o->err, ZO_ECONFIG,
                           "zo_optim_create: group %u: the speculative step needs Adam/AdamW with fp32 states "
                           "(rollback), not %s with %s states", g,
                           og->hp.kind == ZO_OPTIM_LION ? "Lion" : og->hp.kind == ZO_OPTIM_ADAGRAD ? "Adagrad" : "Adam",
                           zo_dtype_name(og->sdt));
        if (og->qbits && (r = check_quantized(o, cfg, &og->hp, g)) < 0)
            return r;
        og->hp_next = og->hp;
        states_used(og->hp.kind, og->used);
        og->first_tensor = ti;
        og->ntensors = ug->ntensors;
        og->off = off;
        og->has_dev = ug->dev_params != NULL;
        for (unsigned i = 0; i < ug->ntensors; i++, ti++) {
            zo__ot *t = &o->tensors[ti];
            if (ug->numel[i] == 0 || ug->numel[i] > ((uint64_t)1 << 48))
                return ZO_FAIL(&o->err, -EINVAL, "zo_optim_create: group %u tensor %u has numel %llu", g, i,
                               (unsigned long long)ug->numel[i]);
            char def[48];
            const char *nm = ug->names ? ug->names[i] : NULL;
            if (!nm) {
                snprintf(def, sizeof(def), "g%u.t%u", g, i);
                nm = def;
            }
            size_t len = strlen(nm);
            if (len == 0 || len > ZO_OPTIM_NAME_MAX || strchr(nm, '/'))
                return ZO_FAIL(&o->err, -EINVAL, "zo_optim_create: group %u tensor %u: name must be 1..%d bytes "
                               "without '/'", g, i, ZO_OPTIM_NAME_MAX);
            for (unsigned j = 0; j < ti; j++)
                if (!strcmp(o->tensors[j].name, nm))
                    return ZO_FAIL(&o->err, -EEXIST, "zo_optim_create: two tensors named '%s'", nm);
            if (!(t->name = strdup(nm)))
                return -ENOMEM;
            t->numel = ug->numel[i];
            t->off = off;
            t->group = g;
            t->dev = ug->dev_params ? ug->dev_params[i] : NULL;
            t->devb[0] = t->devb[1] = t->dev;
            if (ug->dev_params && !t->dev)
                return ZO_FAIL(&o->err, -EINVAL, "zo_optim_create: group %u tensor %u: dev_params entry NULL", g, i);
            off += t->numel;
        }
        og->numel = off - og->off;
        og->first_sg = nsg;
        og->nsg = (unsigned)((og->numel + og->sgsize - 1) / og->sgsize);
        nsg += og->nsg;
    }
    o->numel = off;
    o->fingerprint = zo__config_fingerprint(o, 1, NULL);
    o->layout_fingerprint = zo__config_fingerprint(o, 0, NULL);
    o->nsg = nsg;
    if (!with_sgs)
        return 0;
    o->sgs = calloc(nsg, sizeof(*o->sgs));
    o->master_set = calloc(nt, sizeof(*o->master_set));
    if (!o->sgs || !o->master_set)
        return -ENOMEM;
    o->masters_unset = nt;
    for (unsigned g = 0; g < o->ngroups; g++) {
        zo__og *og = &o->groups[g];
        for (unsigned k = 0; k < og->nsg; k++) {
            zo__sg *sg = &o->sgs[og->first_sg + k];
            sg->group = g;
            sg->off = og->off + (uint64_t)k * og->sgsize;
            sg->n = ZO_MIN(og->sgsize, og->off + og->numel - sg->off);
        }
    }
    return 0;
}

/* The backend's modes, from the device kind alone (create and estimate):
 * direct, the engine writes device params in place (host backend, no DPU
 * or double-buffered); host_grads, gradients are read in place (host
 * backend, no staging). The test hook zo__optim_force_copy makes the host
 * backend take a device backend's copy paths. */
static void backend_modes(zo_optim *o, int kind)
{
    const zo_optim_config *cfg = &o->cfg;
    o->nwin = cfg->dpu ? 2 : 1;
    o->npbuf = cfg->dpu ? 2 : 1;
    /* double-buffered device params: the update writes the buffer the
     * device does not read, so on the host backend the kernel writes it
     * itself as it does without DPU */
    o->dbl = cfg->dpu_double_buffer;
    o->direct = kind == ZO_DEV_HOST && (!cfg->dpu || o->dbl) && !zo__optim_force_copy;
    o->host_grads = kind == ZO_DEV_HOST && !zo__optim_force_copy;
}

/* What create allocates, from the layout, the configuration, the backend's
 * modes and the swap chunk (NVMe placement): the one place these sizes are
 * derived. make_store() builds the store from it; zo_optim_estimate()
 * reports it, with the pinning that create does next (staging, parameter
 * buffers, then windows, each pinned while the budget has room) played
 * through in the same order. f->struct_size is left alone. */
static void footprint(const zo_optim *o, size_t chunk, zo_optim_footprint *f)
{
    const zo_optim_config *cfg = &o->cfg;
    uint64_t host_tier = 0, nvme_bytes = 0, qcache = 0;
    int mixed_width = 0;
    /* per group: its full sub-groups and the remainder, as layout() cuts
     * them (no walk over the sub-groups, which an estimate does not make) */
    for (unsigned g = 0; g < o->ngroups; g++) {
        const zo__og *og = &o->groups[g];
        uint64_t nfull = og->numel / og->sgsize, rest = og->numel % og->sgsize;
        int nvme = og->place == ZO_OPTIM_PLACE_NVME;
        uint64_t align = nvme ? (uint64_t)1 << 20 : 4096;
        uint64_t bytes = 0;
        for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++) {
            if (!og->used[k])
                continue;
            bytes += nfull * ZO_ALIGN_UP(zo__state_bytes(og, k, og->sgsize), align) +
                     (rest ? ZO_ALIGN_UP(zo__state_bytes(og, k, rest), align) : 0);
        }
        if (nvme) {
            nvme_bytes += bytes;
            mixed_width |= og->sdt != ZO_DTYPE_F32;
            /* quantized states are not in the sweep (their codes and
             * scales do not step with the masters' elements): each
             * sub-group's are acquired into the host tier whole, one
             * sub-group updated, the next loading, the previous writing
             * back */
            if (og->qbits) {
                uint64_t q = 0;
                for (int k = 1; k < ZO_OPTIM_STATE_COUNT; k++)
                    q += og->used[k] ? ZO_ALIGN_UP(zo__state_bytes(og, k, ZO_MIN(og->sgsize, og->numel)), 4096) : 0;
                qcache = ZO_MAX(qcache, 3 * q);
            }
        } else {
            host_tier += bytes;
        }
    }
    host_tier += qcache;
    int nvme = nvme_bytes != 0;
    uint64_t staging = o->host_grads ? 0 : cfg->grad_staging_bytes;
    /* a sweep holds buffer_count pieces of (master, m, v), one slot each;
     * two more slots serve reads, writes and checkpoints beside it */
    unsigned slots = nvme ? 3 * cfg->buffer_count + 2 : 8;
    size_t slot = nvme ? (size_t)4 << 20 : (size_t)1 << 20;
    size_t min_slot = nvme ? chunk * (mixed_width ? 2 : 1) : (size_t)1 << 20;
    if (nvme) {
        slot = ZO_MAX(ZO_ALIGN_UP(slot, chunk), min_slot);
        if (cfg->pinned_bytes && cfg->pinned_bytes > host_tier + staging) {
            uint64_t room = (cfg->pinned_bytes - host_tier - staging) / slots;
            if (room < slot)
                slot = (size_t)(room / chunk * chunk);
        }
        if (slot < min_slot)
            slot = min_slot; /* the budget check reports it */
    }
    f->numel = o->numel;
    f->nsubgroups = o->nsg;
    f->pool_slots = slots;
    f->pool_slot_bytes = slot;
    f->host_state_bytes = host_tier;
    f->nvme_state_bytes = nvme_bytes;
    f->staging_bytes = staging;
    f->pinned_min_bytes = host_tier + (uint64_t)slots * slot + staging;
    /* direct mode needs the parameter buffer only for tensors without
     * device params; otherwise it is made when first asked for */
    int need_pbuf = !o->direct;
    for (unsigned g = 0; g < o->ngroups; g++)
        need_pbuf |= !o->groups[g].has_dev;
    uint64_t pb = o->numel * o->pes;
    f->param_buffer_bytes = need_pbuf ? pb * o->npbuf : 0;
    f->grad_window_dtype = zo__win_dtype(cfg, o->gdt);
    uint64_t wb = o->numel * zo_dtype_size(f->grad_window_dtype);
    f->grad_window_bytes = wb * o->nwin;
    f->device_bytes = 0;
    if (o->dbl)
        for (unsigned i = 0; i < o->nt; i++)
            f->device_bytes += o->tensors[i].dev ? o->tensors[i].numel * o->pes : 0;
    /* create's pinning, in its order (pin_try) */
    uint64_t pinned = host_tier + (uint64_t)slots * slot, host = f->grad_window_bytes;
#define ZO__PIN_FITS(b) (cfg->pin_memory && (!cfg->pinned_bytes || pinned + (b) <= cfg->pinned_bytes))
    if (staging) {
        if (ZO__PIN_FITS(staging))
            pinned += staging;
        else
            host += staging;
    }
    for (unsigned b = 0; b < o->npbuf && need_pbuf; b++) {
        if (ZO__PIN_FITS(pb))
            pinned += pb;
        else
            host += pb;
    }
    for (unsigned w = 0; w < o->nwin && !o->host_grads && wb; w++) {
        if (!ZO__PIN_FITS(wb))
            break;
        pinned += wb;
        host -= wb;
    }
#undef ZO__PIN_FITS
    f->pinned_bytes = pinned;
    f->host_bytes = host;
}

/* Store, swap and the sub-groups' store tensors. Pinned memory: the host
 * tier (host placement) plus the slot pool plus the gradient staging must
 * fit pinned_bytes; with NVMe placement the pool's slot size shrinks to fit,
 * down to the least a sweep can work with (footprint()). */
static int make_store(zo_optim *o)
{
    uint64_t nvme_bytes = 0;
    for (unsigned g = 0; g < o->ngroups; g++)
        if (o->groups[g].place == ZO_OPTIM_PLACE_NVME)
            nvme_bytes = 1;
    int r;
    size_t chunk = 0;
    if (nvme_bytes) {
        zo_optim_footprint f0;
        footprint(o, (size_t)1 << 20, &f0);
        nvme_bytes = f0.nvme_state_bytes;
        if (o->cfg.swap) {
            o->swap = o->cfg.swap;
        } else {
            if (!o->nvme_path)
                return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: NVMe placement needs nvme_path (or swap)");
            const char *dirs[1] = {o->nvme_path};
            zo_aio_config ac;
            zo_aio_config_default(&ac);
            ac.block_size = o->cfg.aio_block_size;
            ac.queue_depth = o->cfg.aio_queue_depth;
            ac.threads = o->cfg.aio_threads;
            zo_swap_config wc;
            zo_swap_config_default(&wc);
            wc.dirs = dirs;
            wc.ndirs = 1;
            wc.aio_cfg = &ac;
            /* arenas no larger than the states need (small models, tests) */
            wc.arena_size = ZO_MIN(wc.arena_size, ZO_ALIGN_UP(nvme_bytes, (uint64_t)1 << 20) + ((uint64_t)1 << 20));
            if ((r = zo_swap_create(&o->swap, &wc)) < 0)
                return ZO_FAIL(&o->err, r, "zo_optim_create: swap store in %s: %s", o->nvme_path,
                               zo_last_error_detail());
            o->own_swap = 1;
        }
        zo_swap_info si;
        zo_swap_get_info(o->swap, &si);
        chunk = si.chunk_size;
    }
    zo_optim_footprint f;
    footprint(o, chunk, &f);
    uint64_t host_tier = f.host_state_bytes;
    unsigned slots = f.pool_slots;
    size_t slot = (size_t)f.pool_slot_bytes;
    if (o->cfg.pinned_bytes && f.pinned_min_bytes > o->cfg.pinned_bytes)
        return ZO_FAIL(&o->err, ZO_EBUDGET,
                       "zo_optim_create: pinned_bytes %llu cannot hold what the placement needs: %llu (host-placed "
                       "masters and states %llu, pool %u x %zu, gradient staging %llu)",
                       (unsigned long long)o->cfg.pinned_bytes, (unsigned long long)f.pinned_min_bytes,
                       (unsigned long long)host_tier, slots, slot, (unsigned long long)f.staging_bytes);
    zo_store_config sc;
    zo_store_config_default(&sc);
    sc.dev = NULL; /* the engine moves device data itself */
    sc.host_bytes = host_tier;
    sc.swap = o->swap;
    sc.slot_size = slot;
    sc.slots = slots;
    sc.numa_node = o->cfg.numa_node;
    sc.pin_flags = o->cfg.pin_memory ? 0 : ZO_PIN_NO_LOCK;
    sc.trace = ZO_TRACE_OFF;
    r = zo_store_create(&o->store, &sc);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_create: store: %s", zo_last_error_detail());
    o->pinned_bytes += host_tier + (uint64_t)slots * slot;
    for (unsigned i = 0; i < o->nsg; i++) {
        zo__sg *sg = &o->sgs[i];
        zo__og *og = &o->groups[sg->group];
        for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++) {
            if (!og->used[k])
                continue;
            char name[64];
            snprintf(name, sizeof(name), "optim.sg%u.%s", i, state_suffix[k]);
            zo_tensor_desc d;
            zo_tensor_desc_default(&d);
            d.name = name;
            d.dtype = k == ZO_OPTIM_STATE_MASTER ? ZO_DTYPE_F32 : og->qbits ? ZO_DTYPE_U8 : og->sdt;
            d.ndim = 1;
            d.shape[0] = zo__state_bytes(og, k, sg->n) / zo_dtype_size(d.dtype);
            d.home = og->place == ZO_OPTIM_PLACE_NVME ? ZO_TIER_NVME : ZO_TIER_HOST;
            if ((r = zo_store_register(o->store, &d, &sg->t[k])) < 0)
                return ZO_FAIL(&o->err, r, "zo_optim_create: registering %s: %s", name, zo_store_errmsg(o->store));
        }
    }
    return 0;
}

/* The checks of the configuration that need no device and no layout:
 * create's and zo_optim_estimate()'s, so that an estimate refuses what
 * create would. Sets the dtypes. */
static int check_config(zo_optim *o, const zo_optim_config *cfg)
{
    if (cfg->param_dtype == ZO_DTYPE_COUNT)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: param_dtype is not set: give the dtype of the device "
                       "params the engine writes (ZO_DTYPE_F32 for an fp32 or CPU trainer, ZO_DTYPE_BF16, "
                       "ZO_DTYPE_F16); there is no default");
    o->pdt = cfg->param_dtype;
    o->gdt = cfg->grad_dtype == ZO_DTYPE_COUNT ? cfg->param_dtype : cfg->grad_dtype;
    if (o->pdt != ZO_DTYPE_F32 && o->pdt != ZO_DTYPE_BF16 && o->pdt != ZO_DTYPE_F16)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: param_dtype %s (bf16, f16 or f32)", zo_dtype_name(o->pdt));
    if (o->gdt != ZO_DTYPE_F32 && o->gdt != ZO_DTYPE_BF16 && o->gdt != ZO_DTYPE_F16)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: grad_dtype %s (bf16, f16 or f32)", zo_dtype_name(o->gdt));
    o->pes = zo_dtype_size(o->pdt);
    o->ges = zo_dtype_size(o->gdt);
    if (cfg->buffer_count < 4 || cfg->buffer_count > 1024)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: buffer_count %u out of [4, 1024]", cfg->buffer_count);
    if (cfg->grad_staging_bytes < (64u << 10) || cfg->grad_staging_bytes > ((size_t)1 << 32))
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: grad_staging_bytes %zu out of [64 KiB, 4 GiB]",
                       cfg->grad_staging_bytes);
    if (cfg->grad_accum_steps < 1)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: grad_accum_steps must be >= 1");
    if (!(cfg->max_grad_norm >= 0) || !isfinite(cfg->max_grad_norm))
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: max_grad_norm %g (finite, >= 0)", cfg->max_grad_norm);
    if (!(cfg->loss_scale >= 0) || !isfinite(cfg->loss_scale) || cfg->initial_scale_power < 0 ||
        cfg->initial_scale_power > 64 || cfg->loss_scale_window < 1 || cfg->hysteresis < 1 ||
        !(cfg->min_loss_scale > 0) || !isfinite(cfg->min_loss_scale))
        return ZO_FAIL(&o->err, ZO_ECONFIG,
                       "zo_optim_create: loss scaling out of range (loss_scale %g >= 0, initial_scale_power %d in "
                       "[0, 64], loss_scale_window %u >= 1, hysteresis %u >= 1, min_loss_scale %g > 0)",
                       cfg->loss_scale, cfg->initial_scale_power, cfg->loss_scale_window, cfg->hysteresis,
                       cfg->min_loss_scale);
    if ((unsigned)cfg->clip_mode > ZO_OPTIM_CLIP_SPECULATIVE || (unsigned)cfg->nonfinite > ZO_OPTIM_NONFINITE_SKIP ||
        (cfg->dpu != 0 && cfg->dpu != 1) || cfg->nthreads < 0 || cfg->nthreads > 1024)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: clip_mode, nonfinite, dpu or nthreads out of range");
    if ((unsigned)cfg->no_grad > ZO_OPTIM_NO_GRAD_SKIP)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: no_grad %d (ZO_OPTIM_NO_GRAD_ZERO or _SKIP)",
                       (int)cfg->no_grad);
    if ((cfg->dpu_double_buffer != 0 && cfg->dpu_double_buffer != 1) || (cfg->dpu_double_buffer && !cfg->dpu))
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_create: dpu_double_buffer %d (0, or 1 with dpu 1)",
                       cfg->dpu_double_buffer);
    return 0;
}

int zo_optim_create(zo_optim **out, const zo_optim_config *ucfg)
{
    if (out)
        *out = NULL;
    if (!out || !ucfg)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_create: NULL %s", out ? "cfg" : "out");
    zo_optim *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->efd = -1;
    zo_optim_config_default(&o->cfg);
    /* a caller built before no_grad was added passes the struct that ends there */
    int r = ZO_STRUCT_IN(&o->cfg, ucfg, offsetof(zo_optim_config, no_grad), &o->err, "zo_optim_create");
    if (r < 0) {
        free(o);
        return r;
    }
    const zo_optim_config *cfg = &o->cfg;
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->cond, NULL);
    if (!cfg->dev) {
        r = ZO_FAIL(&o->err, -EINVAL, "zo_optim_create: no device (dev)");
        goto fail;
    }
    if (!cfg->groups || cfg->ngroups == 0) {
        r = ZO_FAIL(&o->err, -EINVAL, "zo_optim_create: no parameter groups");
        goto fail;
    }
    o->dev = cfg->dev;
    if ((r = check_config(o, cfg)) < 0)
        goto fail;
    /* read the caller's values from our copy (never past its struct_size) */
    if ((r = layout(o, &o->cfg, 1)) < 0)
        goto fail;
    if (o->cfg.nvme_path && !(o->nvme_path = strdup(o->cfg.nvme_path))) {
        r = -ENOMEM;
        goto fail;
    }
    o->cfg.groups = NULL; /* read during create only */
    o->cfg.nvme_path = NULL;
    zo__scaler_init(&o->scaler, cfg, o->pdt);
    o->win_scale[0] = o->win_scale[1] = o->scaler.scale;
    backend_modes(o, zo_dev_get_kind(o->dev));
    if ((r = make_store(o)) < 0)
        goto fail;

    zo_cpuadam_team_config tc;
    zo_cpuadam_team_config_default(&tc);
    if (cfg->nthreads)
        tc.nthreads = cfg->nthreads;
    if ((r = zo_cpuadam_team_create(&o->team, &tc)) < 0 || (r = zo_cpuadam_team_create(&o->iteam, &tc)) < 0) {
        ZO_FAIL(&o->err, r, "zo_optim_create: cpuadam team: %s", zo_last_error_detail());
        goto fail;
    }

    /* buffers: gradient windows (window.c), staging (pinned: the DMA
     * target), parameter buffers (pinned while the budget allows: the H2D
     * source) */
    size_t pb;
    if (zo__mul_size((size_t)o->numel, o->pes, &pb) < 0) {
        r = ZO_FAIL(&o->err, -ENOMEM, "zo_optim_create: model too large");
        goto fail;
    }
    if ((r = zo__win_alloc(o, &o->win_bytes)) < 0)
        goto fail;
    o->staging_bytes = cfg->grad_staging_bytes;
    /* host backend: gradients are read in place, no staging */
    if (!o->host_grads && (r = host_alloc(o, &o->staging, o->staging_bytes, 1, &o->staging_pinned)) < 0)
        goto fail;
    /* direct mode needs the parameter buffer only for tensors without
     * device params; otherwise it is made when first asked for
     * (zo__pbuf_need): 2 B/param less host memory */
    int need_pbuf = !o->direct;
    for (unsigned g = 0; g < o->ngroups; g++)
        need_pbuf |= !o->groups[g].has_dev;
    for (unsigned b = 0; b < o->npbuf && need_pbuf; b++)
        if ((r = host_alloc(o, &o->pbuf[b], pb, 1, &o->pbuf_pinned[b])) < 0)
            goto fail;
    /* Gradient windows in pinned memory where the budget has room after the
     * store, the staging and the parameter buffers: a tensor's first
     * gradient in a window of its own dtype is then copied by the device
     * straight into its place (grad_one), and no host thread copies it out
     * of staging. On CUDA that copy ran on the driver's one host-function
     * thread, single-threaded, on the step's critical path (2 GiB of bf16
     * gradients per step at 1G params, H200 run of 2026-11-27). A window
     * that does not fit stays pageable and takes the staging path. */
    size_t wb = (size_t)(o->win_bytes / o->nwin);
    for (unsigned w = 0; w < o->nwin && !o->host_grads && wb; w++) {
        void *p;
        if (!pin_try(o, &p, wb))
            break;
        memset(p, 0, wb);
        zo_aligned_free(o->acc[w]);
        o->host_bytes -= wb;
        o->acc[w] = p;
        o->acc_pinned[w] = 1;
    }
    if (o->dbl) {
        /* the second device buffer of every tensor with device params */
        for (unsigned i = 0; i < o->nt; i++) {
            zo__ot *t = &o->tensors[i];
            if (!t->dev)
                continue;
            if ((r = zo_dev_malloc(o->dev, &t->devb[1], (size_t)t->numel * o->pes)) < 0) {
                t->devb[1] = NULL;
                ZO_FAIL(&o->err, r, "zo_optim_create: the second device buffer of '%s' (%llu bytes): %s", t->name,
                        (unsigned long long)(t->numel * o->pes), zo_dev_errmsg(o->dev));
                goto fail;
            }
            o->own_devb = 1;
        }
        if ((r = zo_event_create(o->dev, &o->ev_pdone[0])) < 0 || (r = zo_event_create(o->dev, &o->ev_pdone[1])) < 0) {
            ZO_FAIL(&o->err, r, "zo_optim_create: events: %s", zo_dev_errmsg(o->dev));
            goto fail;
        }
    }
    o->eager = cfg->clip_mode == ZO_OPTIM_CLIP_SPECULATIVE && !cfg->dpu;
    o->sg_list = calloc(o->nsg, sizeof(*o->sg_list));
    o->sg_sumsq = calloc(o->nsg, sizeof(*o->sg_sumsq));
    o->sg_nf = calloc(o->nsg, sizeof(*o->sg_nf));
    o->sg_stats = calloc(o->nsg, 1);
    o->sg_updated = calloc(o->nsg, 1);
    o->sg_ntens = calloc(o->nsg, sizeof(*o->sg_ntens));
    o->eager_order = calloc(o->nsg, sizeof(*o->eager_order));
    o->tstep = calloc(o->nt, sizeof(*o->tstep));
    if (!o->sg_list || !o->sg_sumsq || !o->sg_nf || !o->sg_stats || !o->sg_updated || !o->sg_ntens ||
        !o->eager_order || !o->tstep) {
        r = -ENOMEM;
        goto fail;
    }
    for (unsigned t = 0; t < o->nt; t++) {
        unsigned a, b;
        zo__tensor_sgs(o, t, &a, &b);
        for (unsigned i = a; i < b; i++)
            o->sg_ntens[i]++;
    }
    if ((r = zo__gst_alloc(o)) < 0)
        goto fail;
    o->stage_half = o->staging_bytes / 2 / 64 * 64;
    if ((r = zo_stream_create(o->dev, &o->d2h)) < 0 || (r = zo_stream_create(o->dev, &o->land)) < 0 ||
        (r = zo_stream_create(o->dev, &o->h2d)) < 0 || (r = zo_event_create(o->dev, &o->ev_win[0])) < 0 ||
        (r = zo_event_create(o->dev, &o->ev_win[1])) < 0 || (r = zo_event_create(o->dev, &o->ev_copied[0])) < 0 ||
        (r = zo_event_create(o->dev, &o->ev_copied[1])) < 0 || (r = zo_event_create(o->dev, &o->ev_freed[0])) < 0 ||
        (r = zo_event_create(o->dev, &o->ev_freed[1])) < 0 || (r = zo_event_create(o->dev, &o->ev_tail)) < 0 ||
        (r = zo_event_create(o->dev, &o->ev_direct)) < 0) {
        ZO_FAIL(&o->err, r, "zo_optim_create: device streams: %s", zo_dev_errmsg(o->dev));
        goto fail;
    }
    o->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (o->efd < 0) {
        r = ZO_FAIL(&o->err, -errno, "zo_optim_create: eventfd: %s", zo_strerror(-errno));
        goto fail;
    }
    o->params_current = 1;
    o->ws = ZO__W_IDLE;
    if ((r = -pthread_create(&o->worker, NULL, zo__optim_worker, o)) < 0) {
        ZO_FAIL(&o->err, r, "zo_optim_create: worker thread");
        goto fail;
    }
    o->worker_started = 1;
    *out = o;
    return 0;
fail:
    zo_optim_destroy(&o);
    return r;
}

void zo_optim_destroy(zo_optim **op)
{
    if (!op || !*op)
        return;
    zo_optim *o = *op;
    *op = NULL;
    if (o->worker_started) {
        pthread_mutex_lock(&o->lock);
        o->abort = 1; /* an eager step waiting for gradients stops */
        pthread_cond_broadcast(&o->cond);
        while (o->ws == ZO__W_QUEUED || o->ws == ZO__W_RUNNING)
            pthread_cond_wait(&o->cond, &o->lock);
        pthread_mutex_unlock(&o->lock);
        zo__wstate_set(o, ZO__W_EXIT);
        pthread_join(o->worker, NULL);
    }
    if (o->d2h)
        zo_stream_sync(o->d2h);
    if (o->land)
        zo_stream_sync(o->land);
    if (o->h2d)
        zo_stream_sync(o->h2d);
    zo_stream_destroy(&o->d2h);
    zo_stream_destroy(&o->land);
    for (unsigned b = 0; b < 2; b++) {
        zo_event_destroy(&o->ev_copied[b]);
        zo_event_destroy(&o->ev_freed[b]);
    }
    zo_event_destroy(&o->ev_direct);
    zo_event_destroy(&o->ev_tail);
    zo_stream_destroy(&o->h2d);
    zo_event_destroy(&o->ev_win[0]);
    zo_event_destroy(&o->ev_win[1]);
    zo_event_destroy(&o->ev_pdone[0]);
    zo_event_destroy(&o->ev_pdone[1]);
    if (o->own_devb)
        for (unsigned i = 0; i < o->nt; i++)
            if (o->tensors[i].devb[1] && o->tensors[i].devb[1] != o->tensors[i].devb[0])
                zo_dev_free(o->dev, o->tensors[i].devb[1]);
    zo_cpuadam_team_destroy(&o->team);
    zo_cpuadam_team_destroy(&o->iteam);
    zo_store_destroy(&o->store);
    if (o->own_swap)
        zo_swap_destroy(&o->swap);
    zo__win_free(o);
    for (unsigned w = 0; w < 2; w++) {
        if (o->pbuf[w])
            host_free(o->pbuf[w], o->pbuf_pinned[w]);
    }
    if (o->staging)
        host_free(o->staging, o->staging_pinned);
    if (o->efd >= 0)
        close(o->efd);
    if (o->tensors)
        for (unsigned i = 0; i < o->nt; i++)
            free(o->tensors[i].name);
    free(o->tensors);
    free(o->groups);
    free(o->sgs);
    free(o->nvme_path);
    free(o->sg_list);
    free(o->sg_sumsq);
    free(o->sg_nf);
    free(o->sg_stats);
    free(o->sg_updated);
    free(o->sg_ntens);
    free(o->eager_order);
    free(o->master_set);
    free(o->tstep);
    zo__gst_free(o);
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->cond);
    free(o);
}

int zo_optim_estimate(const zo_optim_config *ucfg, int kind, zo_optim_footprint *out)
{
    if (!ucfg || !out)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_estimate: NULL %s", ucfg ? "out" : "cfg");
    if (out->struct_size < sizeof(*out))
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_estimate: out->struct_size %zu, not sizeof(zo_optim_footprint) %zu",
                       out->struct_size, sizeof(*out));
    /* the engine that create would build, up to its layout: the same
     * checks, the same sub-group cut, then footprint() */
    zo_optim *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->efd = -1;
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->cond, NULL);
    zo_optim_config_default(&o->cfg);
    int r = ZO_STRUCT_IN(&o->cfg, ucfg, offsetof(zo_optim_config, no_grad), &o->err, "zo_optim_estimate");
    const zo_optim_config *cfg = &o->cfg;
    if (r < 0)
        goto done;
    if (cfg->dev)
        kind = zo_dev_get_kind(cfg->dev);
    if (kind != ZO_DEV_HOST && kind != ZO_DEV_CUDA) {
        r = ZO_FAIL(&o->err, -EINVAL, "zo_optim_estimate: no device and kind %d (ZO_DEV_HOST or ZO_DEV_CUDA)", kind);
        goto done;
    }
    if (!cfg->groups || cfg->ngroups == 0) {
        r = ZO_FAIL(&o->err, -EINVAL, "zo_optim_create: no parameter groups");
        goto done;
    }
    if ((r = check_config(o, cfg)) < 0 || (r = layout(o, cfg, 0)) < 0)
        goto done;
    o->cfg.groups = NULL;
    o->cfg.nvme_path = NULL;
    backend_modes(o, kind);
    size_t chunk = (size_t)1 << 20; /* zo_swap_config_default()'s, which create's own swap keeps */
    if (cfg->swap) {
        zo_swap_info si;
        if ((r = zo_swap_get_info(cfg->swap, &si)) < 0)
            goto done;
        chunk = si.chunk_size;
    }
    zo_optim_footprint f;
    memset(&f, 0, sizeof(f));
    footprint(o, chunk, &f);
    f.struct_size = out->struct_size;
    *out = f;
    if (cfg->pinned_bytes && f.pinned_min_bytes > cfg->pinned_bytes)
        r = ZO_FAIL(&o->err, ZO_EBUDGET,
                    "zo_optim_estimate: pinned_bytes %llu cannot hold what the placement needs: %llu (host-placed "
                    "masters and states %llu, pool %u x %llu, gradient staging %llu)",
                    (unsigned long long)cfg->pinned_bytes, (unsigned long long)f.pinned_min_bytes,
                    (unsigned long long)f.host_state_bytes, f.pool_slots, (unsigned long long)f.pool_slot_bytes,
                    (unsigned long long)f.staging_bytes);
done:
    zo_optim_destroy(&o);
    return r;
}

/* ---- tensors ------------------------------------------------------------------- */

unsigned zo_optim_tensor_count(const zo_optim *o)
{
    return o ? o->nt : 0;
}

int zo_optim_tensor_index(const zo_optim *o, const char *name, unsigned *index)
{
    if (!o || !name || !index)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_tensor_index: NULL argument");
    for (unsigned i = 0; i < o->nt; i++)
        if (!strcmp(o->tensors[i].name, name)) {
            *index = i;
            return 0;
        }
    return ZO_FAIL(NULL, -ENOENT, "zo_optim_tensor_index: no tensor '%s'", name);
}

int zo_optim_tensor_get(const zo_optim *o, unsigned index, uint64_t *numel, unsigned *group, const char **name)
{
    if (!o || index >= o->nt)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_tensor_get: %s", o ? "index out of range" : "NULL engine");
    if (numel)
        *numel = o->tensors[index].numel;
    if (group)
        *group = o->tensors[index].group;
    if (name)
        *name = o->tensors[index].name;
    return 0;
}

/* ---- masters set ----------------------------------------------------------------- */

void zo__masters_all_set(zo_optim *o)
{
    for (unsigned i = 0; i < o->nt; i++)
        o->master_set[i] = o->tensors[i].numel;
    o->masters_unset = 0;
}

void zo__masters_add(zo_optim *o, unsigned t, uint64_t n)
{
    uint64_t have = o->master_set[t], numel = o->tensors[t].numel;
    if (have >= numel)
        return;
    /* an import cannot tell a rewrite of a range from a new one: elements
     * are counted, so overlapping partial imports may count twice */
    o->master_set[t] = n >= numel - have ? numel : have + n;
    if (o->master_set[t] == numel)
        o->masters_unset--;
}

int zo__masters_check(zo_optim *o, const char *fn)
{
    if (!o->masters_unset)
        return 0;
    unsigned t = 0;
    while (t < o->nt && o->master_set[t] >= o->tensors[t].numel)
        t++;
    return ZO_FAIL(&o->err, ZO_ESTATE,
                   "%s: the fp32 masters of tensor '%s'%s were never set (they start at zero, and a step would "
                   "write updates of zero masters over the parameters): call zo_optim_init_from_device(), "
                   "zo_optim_state_import(ZO_OPTIM_STATE_MASTER) for every tensor, or zo_optim_load() first",
                   fn, t < o->nt ? o->tensors[t].name : "?", o->masters_unset > 1 ? " (and others)" : "");
}

/* ---- gradient intake -------------------------------------------------------------- */

typedef struct d2h_job {
    zo_optim *o;
    const void *src; /* the staging half */
    float *spill;    /* the tensor's fp32 spill, or NULL: its place in the window */
    uint64_t e;      /* first element (of the tensor) */
    size_t n;
    int first;
    int widen;      /* not a piece: widen what landed narrow into the new spill */
    unsigned win;
    int track;      /* eager: a piece of the tensor's last micro-step gradient */
    unsigned index; /* tensor */
    uint64_t t0;
    int direct;     /* copied by the device straight into the window: bookkeeping only */
} d2h_job;

static void d2h_begin(void *arg)
{
    ((d2h_job *)arg)->t0 = zo__now_ns();
}

static void d2h_land(void *arg)
{
    d2h_job *j = arg;
    if (j->direct) {
        uint64_t now = zo__now_ns(), from = ZO_MAX(j->t0, j->o->land_end);
        j->o->land_end = now;
        atomic_fetch_add(&j->o->d2h_ns[j->win], now - from);
        atomic_fetch_add(&j->o->d2h_bytes[j->win], (uint64_t)j->n * j->o->ges);
        atomic_fetch_add(&j->o->d2h_direct_bytes, (uint64_t)j->n * j->o->ges);
        if (j->track)
            zo__gst_landed(j->o, j->win, j->index);
        free(j);
        return;
    }
    if (j->widen) {
        zo__win_spill_widen(j->o, j->win, j->index);
        free(j);
        return;
    }
    zo__win_land(j->o, j->win, j->index, j->spill, j->e, j->src, j->o->gdt, j->n, j->first);
    /* chunks overlap (copy of k + 1 during the accumulate of k): count the
     * union of their spans, not the sum */
    uint64_t now = zo__now_ns(), from = ZO_MAX(j->t0, j->o->land_end);
    j->o->land_end = now;
    atomic_fetch_add(&j->o->d2h_ns[j->win], now - from);
    atomic_fetch_add(&j->o->d2h_bytes[j->win], (uint64_t)j->n * j->o->ges);
    if (j->track)
        zo__gst_landed(j->o, j->win, j->index);
    free(j);
}

/* Gradients may be handed over unless the worker is applying the window they
 * would land in (possible only without DPU: one window). */
static int intake_ok(zo_optim *o, const char *fn)
{
    int r = zo__failed_check(o, fn); /* the window would feed undefined states */
    if (r < 0)
        return r;
    pthread_mutex_lock(&o->lock);
    /* DONE counts too: without DPU the window is free only once wait() collected the step */
    int busy = o->ws != ZO__W_IDLE && o->job.win == o->win && !o->eager_open;
    pthread_mutex_unlock(&o->lock);
    if (busy)
        return ZO_FAIL(&o->err, ZO_ESTATE, "%s: a step is being applied to the accumulators: zo_optim_wait() first",
                       fn);
    return 0;
}

/* Eager speculative step: the last micro-step's first gradient starts the
 * update job; the worker then updates each sub-group as soon as every tensor
 * in it has its gradient, while backward goes on. */
static int eager_start(zo_optim *o)
{
    int r = zo__failed_check(o, "zo_optim_grad");
    if (r < 0 || (r = zo__masters_check(o, "zo_optim_grad")) < 0)
        return r;
    zo__job job = {.win = o->win, .pbuf = 0, .delayed = 0, .eager = 1, .scale = o->win_scale[o->win],
                   .t_call = zo__now_ns()};
    zo_optim_step_opts_default(&job.opts);
    pthread_mutex_lock(&o->lock);
    for (unsigned g = 0; g < o->ngroups; g++) /* the worker is idle here */
        o->groups[g].hp = o->groups[g].hp_next;
    /* the window's landing counts (gst) were reset when it was last finished */
    o->closed = 0;
    o->landed = 0;
    o->job = job;
    o->job_err = 0;
    memset(&o->job_res, 0, sizeof(o->job_res));
    pthread_mutex_unlock(&o->lock);
    o->params_current = 0;
    o->eager_open = 1;
    return zo__wstate_set(o, ZO__W_QUEUED);
}

/* Tensor `index`'s gradient goes into the current window in `pieces`
 * copies. In the window's last micro-step the copies report their landing
 * (intake statistics, and the eager step waits on them), and in eager mode
 * the first such gradient starts the update. Returns 1 when the pieces must
 * report their landing (zo__gst_landed), 0 when not, or an error. */
static int track_last(zo_optim *o, unsigned index, uint32_t pieces)
{
    int r;
    if (o->eager && !((o->micro + 1) % o->cfg.grad_accum_steps) && !o->eager_open && (r = eager_start(o)) < 0)
        return r;
    return zo__gst_track(o, o->win, index, pieces);
}

static int grad_one(zo_optim *o, unsigned index, const void *dev_grad)
{
    zo__ot *t = &o->tensors[index];
    unsigned w = o->win;
    size_t chunk = o->stage_half / o->ges;
    int track = track_last(o, index, (uint32_t)((t->numel + chunk - 1) / chunk));
    if (track < 0)
        return track;
    int r;
    if (zo__win_needs_spill(o, w, index, o->gdt)) {
        /* a second gradient in a narrow window: from now on in fp32; what
         * landed narrow is widened first, in landing order */
        float *sp;
        d2h_job *j = malloc(sizeof(*j));
        if (!j)
            return -ENOMEM;
        if ((r = zo__win_spill(o, w, index, &sp)) < 0) {
            free(j);
            return r;
        }
        *j = (d2h_job){.o = o, .win = w, .index = index, .widen = 1};
        if ((r = zo_stream_host_fn(o->land, d2h_land, j)) < 0) {
            free(j);
            return ZO_FAIL(&o->err, r, "zo_optim_grad: tensor '%s': queueing the widening: %s", t->name,
                           zo_dev_errmsg(o->dev));
        }
    }
    float *spill = o->spill[w][index];
    int first = o->arrivals[w][index]++ == 0;
    /* the first gradient of a tensor in a pinned window of its dtype: the
     * device writes it in place (no staging, no host copy); the land stream
     * still takes each piece in order, after the copy, for the counts */
    int direct = !o->host_grads && o->acc_pinned[w] && first && !spill && o->wdt == o->gdt;
    for (uint64_t e = 0; e < t->numel; e += chunk) {
        size_t n = (size_t)ZO_MIN((uint64_t)chunk, t->numel - e);
        d2h_job *j = malloc(sizeof(*j));
        if (!j)
            return -ENOMEM;
        const void *src = (const char *)dev_grad + e * o->ges;
        if (o->host_grads) {
            /* "device" memory is host memory: accumulate from it in place */
            *j = (d2h_job){.o = o, .src = src, .spill = spill, .e = e, .n = n, .first = first, .win = w,
                           .track = track, .index = index};
            if ((r = zo_stream_host_fn(o->land, d2h_begin, j)) < 0 || (r = zo_stream_host_fn(o->land, d2h_land, j)) < 0)
                return ZO_FAIL(&o->err, r, "zo_optim_grad: tensor '%s': queueing the accumulate: %s", t->name,
                               zo_dev_errmsg(o->dev));
            continue;
        }
        if (direct) {
            void *dst = (char *)o->acc[w] + (t->off + e) * o->wes;
            *j = (d2h_job){.o = o, .n = n, .win = w, .track = track, .index = index, .direct = 1};
            if ((r = zo_stream_host_fn(o->d2h, d2h_begin, j)) < 0 ||
                (r = zo_memcpy_async(o->d2h, dst, src, n * o->ges, ZO_COPY_D2H)) < 0 ||
                (r = zo_event_record(o->ev_direct, o->d2h)) < 0 || (r = zo_stream_wait_event(o->land, o->ev_direct)) < 0 ||
                (r = zo_stream_host_fn(o->land, d2h_land, j)) < 0)
                return ZO_FAIL(&o->err, r, "zo_optim_grad: tensor '%s': queueing the copy: %s", t->name,
                               zo_dev_errmsg(o->dev));
            continue;
        }
        unsigned b = o->stage_next;
        o->stage_next ^= 1u;
        void *half = (char *)o->staging + b * o->stage_half;
        *j = (d2h_job){.o = o, .src = half, .spill = spill, .e = e, .n = n, .first = first, .win = w,
                       .track = track, .index = index};
        if ((r = zo_stream_wait_event(o->d2h, o->ev_freed[b])) < 0 || (r = zo_stream_host_fn(o->d2h, d2h_begin, j)) < 0 ||
            (r = zo_memcpy_async(o->d2h, half, src, n * o->ges, ZO_COPY_D2H)) < 0 ||
            (r = zo_event_record(o->ev_copied[b], o->d2h)) < 0 ||
            (r = zo_stream_wait_event(o->land, o->ev_copied[b])) < 0 ||
            (r = zo_stream_host_fn(o->land, d2h_land, j)) < 0 || (r = zo_event_record(o->ev_freed[b], o->land)) < 0) {
            /* the job may already be queued (begin): it is leaked rather than freed under the stream */
            return ZO_FAIL(&o->err, r, "zo_optim_grad: tensor '%s': queueing the copy: %s", t->name,
                           zo_dev_errmsg(o->dev));
        }
    }
    return 0;
}

int zo_optim_grad_bucket(zo_optim *o, const zo_optim_grad_ref *refs, unsigned n, struct zo_event *ready)
{
    zo__enter(o);
    if (!o || (!refs && n))
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_grad: NULL argument");
    int r = intake_ok(o, "zo_optim_grad");
    if (r < 0)
        return r;
    for (unsigned i = 0; i < n; i++)
        if (refs[i].index >= o->nt || !refs[i].dev_grad)
            return ZO_FAIL(&o->err, -EINVAL, "zo_optim_grad: entry %u: %s", i,
                           refs[i].dev_grad ? "tensor index out of range" : "NULL gradient");
    if (ready && (r = zo_stream_wait_event(o->host_grads ? o->land : o->d2h, ready)) < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_grad: waiting on the ready event: %s", zo_dev_errmsg(o->dev));
    for (unsigned i = 0; i < n; i++)
        if ((r = grad_one(o, refs[i].index, refs[i].dev_grad)) < 0)
            return r;
    return 0;
}

int zo_optim_grad(zo_optim *o, unsigned index, const void *dev_grad, struct zo_event *ready)
{
    zo_optim_grad_ref ref = {.index = index, .dev_grad = dev_grad};
    return zo_optim_grad_bucket(o, &ref, 1, ready);
}

int zo_optim_grad_host(zo_optim *o, unsigned index, const void *host_grad, zo_dtype dtype)
{
    zo__enter(o);
    if (!o || !host_grad || index >= o->nt)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_grad_host: %s",
                       !o || !host_grad ? "NULL argument" : "tensor index out of range");
    if (dtype != ZO_DTYPE_F32 && dtype != ZO_DTYPE_BF16 && dtype != ZO_DTYPE_F16)
        return ZO_FAIL(&o->err, ZO_ENOTSUP, "zo_optim_grad_host: dtype %s (f32, bf16 or f16)", zo_dtype_name(dtype));
    int r = intake_ok(o, "zo_optim_grad_host");
    if (r < 0)
        return r;
    /* queued device copies of the same tensor land first: keep the order */
    if ((r = zo_optim_grads_done(o)) < 0)
        return r;
    zo__ot *t = &o->tensors[index];
    unsigned w = o->win;
    int track = track_last(o, index, 1);
    if (track < 0)
        return track;
    uint64_t t0 = zo__now_ns();
    if (zo__win_needs_spill(o, w, index, dtype)) {
        /* not the window's dtype, or a second gradient: this tensor in fp32 */
        float *sp;
        if ((r = zo__win_spill(o, w, index, &sp)) < 0)
            return r;
        if (o->arrivals[w][index])
            zo__win_spill_widen(o, w, index);
    }
    int first = o->arrivals[w][index]++ == 0;
    zo__win_land(o, w, index, o->spill[w][index], 0, host_grad, dtype, (size_t)t->numel, first);
    atomic_fetch_add(&o->d2h_ns[w], zo__now_ns() - t0);
    atomic_fetch_add(&o->d2h_bytes[w], t->numel * zo_dtype_size(dtype));
    if (track)
        zo__gst_landed(o, w, index);
    return 0;
}

int zo_optim_grads_done(zo_optim *o)
{
    zo__enter(o);
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_grads_done: NULL engine");
    int r = zo_stream_sync(o->d2h), r2 = zo_stream_sync(o->land);
    if (r < 0 || (r = r2) < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_grads_done: a gradient copy failed: %s", zo_dev_errmsg(o->dev));
    return 0;
}

/* The window's gradients: ev_win[win] marks the end of every copy and
 * accumulate queued so far (the land stream joined with the copy stream). */
static int close_window(zo_optim *o)
{
    int r;
    if ((r = zo_event_record(o->ev_tail, o->d2h)) < 0 || (r = zo_stream_wait_event(o->land, o->ev_tail)) < 0 ||
        (r = zo_event_record(o->ev_win[o->win], o->land)) < 0)
        return r;
    return 0;
}

int zo_optim_discard_grads(zo_optim *o)
{
    zo__enter(o);
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_discard_grads: NULL engine");
    /* the eager speculative update already applies this window's gradients */
    if (o->eager_open)
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_discard_grads: the speculative update of this window has "
                       "begun (its last micro-step's first gradient started it): end the micro-step with "
                       "zo_optim_step_async()");
    int r = intake_ok(o, "zo_optim_discard_grads");
    if (r < 0 || (r = zo_optim_grads_done(o)) < 0)
        return r;
    /* with no arrivals, the window's next gradients overwrite the
     * accumulators, and tensors without one are zeroed at the step */
    unsigned w = o->win;
    memset(o->arrivals[w], 0, o->nt * sizeof(uint32_t));
    zo__win_reset(o, w);
    zo__gst_reset(o, w);
    atomic_store(&o->d2h_ns[w], 0);
    atomic_store(&o->d2h_bytes[w], 0);
    o->micro -= o->micro % o->cfg.grad_accum_steps;
    return 0;
}

int zo_optim_grad_norm_partial(zo_optim *o, double *sumsq, uint64_t *nonfinite)
{
    zo__enter(o);
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_grad_norm_partial: NULL engine");
    int r = intake_ok(o, "zo_optim_grad_norm_partial");
    if (r < 0)
        return r;
    if ((r = zo_optim_grads_done(o)) < 0)
        return r;
    unsigned w = o->win;
    /* tensors without a gradient this window are zero (and, unless they
     * are to be skipped, count as having one) */
    zo__win_zero_missing(o, w);
    for (unsigned i = 0; i < o->nt && o->cfg.no_grad == ZO_OPTIM_NO_GRAD_ZERO; i++)
        if (!o->arrivals[w][i])
            o->arrivals[w][i] = 1;
    double s = 0;
    uint64_t nf = 0;
    if ((r = zo__sg_stats(o, w, &s, &nf, NULL)) < 0)
        return r;
    if (sumsq)
        *sumsq = s;
    if (nonfinite)
        *nonfinite = nf;
    return 0;
}

/* ---- the step calls ---------------------------------------------------------------- */

/* Double-buffered device params: buffer db becomes the one the framework
 * reads (caller's thread, no job running). */
static void set_dcur(zo_optim *o, unsigned db)
{
    o->dcur = db;
    for (unsigned i = 0; i < o->nt; i++)
        o->tensors[i].dev = o->tensors[i].devb[db];
}

/* Wait for the worker to finish a job and collect its result. */
static int collect(zo_optim *o, zo_optim_step_result *res)
{
    if (o->eager_open) /* the worker waits for gradients only the caller can hand over */
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim: the last micro-step's gradients are being handed over: end the "
                       "micro-step with zo_optim_step_async() first");
    pthread_mutex_lock(&o->lock);
    while (o->ws == ZO__W_QUEUED || o->ws == ZO__W_RUNNING)
        pthread_cond_wait(&o->cond, &o->lock);
    int r = 0;
    if (o->ws == ZO__W_DONE) {
        r = o->job_err;
        if (r < 0) /* the update's detail becomes this call's */
            zo__errbuf_set(&o->err, o->job_msg);
        if (res)
            *res = o->job_res;
        o->last_res = o->job_res;
        o->have_res = 1;
        int applied = r == 0 && !o->job_res.skipped;
        unsigned db = o->job.dbuf;
        pthread_mutex_unlock(&o->lock);
        if (o->dbl && applied)
            set_dcur(o, db); /* the buffer the update wrote is the one the next forward reads */
        zo__wstate_set(o, ZO__W_IDLE);
        return r;
    }
    pthread_mutex_unlock(&o->lock);
    return r;
}

/* DPU: the parameters of the latest update go to the device now. */
static int push_pending(zo_optim *o)
{
    if (!o->push_pending)
        return 0;
    uint64_t t0 = zo__now_ns();
    int r = zo__push_range(o, o->pcur, o->dcur, 0, o->numel);
    if (r == 0)
        r = zo_stream_sync(o->h2d);
    if (r < 0)
        return ZO_FAIL(&o->err, r, "zo_optim: copying the parameters to the device: %s", zo_dev_errmsg(o->dev));
    o->push_pending = 0;
    pthread_mutex_lock(&o->lock);
    o->tl.h2d_ns += zo__now_ns() - t0;
    o->tl.h2d_bytes += o->numel * o->pes;
    pthread_mutex_unlock(&o->lock);
    o->params_current = 1;
    return 0;
}

int zo__failed_check(zo_optim *o, const char *fn)
{
    int why = o->failed;
    if (!why)
        return 0;
    return ZO_FAIL(&o->err, ZO_ESTATE, "%s: %s, so the masters and states are undefined: zo_optim_load() a checkpoint "
                   "(or zo_optim_init_from_device()) first", fn,
                   why == ZO__FAILED_LOAD   ? "an earlier zo_optim_load() failed after it began to restore them"
                   : why == ZO__FAILED_INIT ? "an earlier zo_optim_init_from_device() failed midway"
                                            : "an earlier step failed mid-update");
}

int zo__optim_quiesce(zo_optim *o, int for_load)
{
    if (o->eager_open)
        return collect(o, NULL); /* ZO_ESTATE: mid-window */
    int r = collect(o, NULL);
    if (for_load) {
        /* a load or init replaces whatever the step in flight left, failed
         * or not (its error is theirs to replace). An applied update still
         * goes to the device first: a load that is refused before it writes
         * anything leaves the engine as it was, device params included. No
         * copy may still read the buffers they rewrite. */
        int r2 = o->failed ? 0 : push_pending(o);
        if (o->failed)
            o->push_pending = 0;
        zo_stream_sync(o->h2d);
        return r2;
    }
    int r2 = push_pending(o);
    if (r == 0 && r2 == 0 && o->failed)
        return zo__failed_check(o, "zo_optim");
    return r < 0 ? r : r2;
}

static int step_async_impl(zo_optim *o, const zo_optim_step_opts *uopts)
{
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_step_async: NULL engine");
    zo_optim_step_opts opts;
    zo_optim_step_opts_default(&opts);
    int r;
    if (uopts && (r = ZO_STRUCT_IN(&opts, uopts, sizeof(zo_optim_step_opts), &o->err, "zo_optim_step_async")) < 0)
        return r;
    if (opts.global_nonfinite < -1 || opts.global_nonfinite > 1 || isnan(opts.global_sumsq))
        return ZO_FAIL(&o->err, -EINVAL, "zo_optim_step_async: global_nonfinite %d / global_sumsq %g out of range",
                       opts.global_nonfinite, opts.global_sumsq);
    if ((r = zo__failed_check(o, "zo_optim_step_async")) < 0 || (r = zo__masters_check(o, "zo_optim_step_async")) < 0)
        return r;
    uint64_t t_call = zo__now_ns();
    pthread_mutex_lock(&o->lock);
    int busy = o->ws == ZO__W_QUEUED || o->ws == ZO__W_RUNNING || o->ws == ZO__W_DONE;
    pthread_mutex_unlock(&o->lock);
    o->micro++;
    int boundary = o->micro % o->cfg.grad_accum_steps == 0;
    if (!boundary) {
        if ((r = zo_optim_grads_done(o)) < 0)
            return r;
        return 0;
    }
    if (o->eager_open) {
        /* the eager update runs already: close its window */
        r = close_window(o);
        if (r < 0) {
            ZO_FAIL(&o->err, r, "zo_optim_step_async: %s", zo_dev_errmsg(o->dev));
            zo_stream_sync(o->d2h); /* the worker must not read gradients still landing */
            zo_stream_sync(o->land);
        }
        pthread_mutex_lock(&o->lock);
        o->job.opts = opts;
        o->closed = 1;
        pthread_cond_broadcast(&o->cond);
        pthread_mutex_unlock(&o->lock);
        o->eager_open = 0;
        o->boundaries++;
        return r;
    }
    if (busy && !o->cfg.dpu) {
        o->micro--;
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_step_async: a step is in flight: zo_optim_wait() first");
    }
    /* DPU: finish the previous update and copy its params (the framework's
     * backward is done with the old ones by now) */
    int prev_err = collect(o, NULL);
    if (o->failed) {
        /* the step just collected failed mid-update: nothing more on those states */
        o->micro--;
        return prev_err < 0 ? prev_err : zo__failed_check(o, "zo_optim_step_async");
    }
    if ((r = push_pending(o)) < 0)
        return r;
    o->boundaries++;
    for (unsigned g = 0; g < o->ngroups; g++) /* the worker is idle here */
        o->groups[g].hp = o->groups[g].hp_next;
    int delayed = o->cfg.dpu && o->boundaries > o->cfg.dpu_warmup_steps;
    zo__job job = {.win = o->win,
                   .pbuf = o->npbuf == 2 ? o->pcur ^ 1u : 0,
                   .dbuf = o->dbl ? o->dcur ^ 1u : 0,
                   .delayed = delayed,
                   .scale = o->win_scale[o->win],
                   .opts = opts,
                   .t_call = t_call};
    /* The caller may reuse its gradient memory once this call returns
     * (optim.h, zo_optim_grad()): the copies must have read it. Under DPU
     * the call returns while the update runs, and the next backward writes
     * the same buffers: without this wait the window's last copies raced
     * it (test_part's single-rank DPU reference saw other gradients in 1 of
     * about 10 runs). The update waits for these copies anyway. */
    if ((r = zo_optim_grads_done(o)) < 0)
        return r;
    if ((r = close_window(o)) < 0)
        return ZO_FAIL(&o->err, r, "zo_optim_step_async: %s", zo_dev_errmsg(o->dev));
    pthread_mutex_lock(&o->lock);
    o->job = job;
    o->job_err = 0;
    memset(&o->job_res, 0, sizeof(o->job_res));
    pthread_mutex_unlock(&o->lock);
    o->params_current = 0;
    /* the next window opens now: with DPU it is the other accumulator; its
     * gradients carry the scale known now (read before the worker owns the
     * scaler again) */
    unsigned next = (o->win + 1) % o->nwin;
    o->win_scale[next] = o->scaler.scale;
    zo__wstate_set(o, ZO__W_QUEUED);
    o->win = next;
    if (o->cfg.dpu && !delayed) {
        /* a DPU warm-up boundary: no delay, so the next forward must see
         * this update; block until it has reached the device */
        r = collect(o, NULL);
        if (r == 0)
            o->params_current = 1;
        return r < 0 ? r : prev_err;
    }
    return prev_err;
}

static int wait_impl(zo_optim *o, zo_optim_step_result *res)
{
    if (!o)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_wait: NULL engine");
    int rs = res ? ZO_STRUCT_OUT(res, (const zo_optim_step_result *)NULL, ZO_OPTIM_STEP_RESULT_SIZE_V1, &o->err,
                                 "zo_optim_wait") : 0;
    if (rs < 0)
        return rs;
    zo_optim_step_result rr;
    memset(&rr, 0, sizeof(rr));
    int r = collect(o, &rr);
    if (!rr.boundary) {
        /* nothing was in flight: no boundary ended here */
        pthread_mutex_lock(&o->lock);
        rr.step = o->step;
        pthread_mutex_unlock(&o->lock);
        rr.loss_scale = o->win_scale[o->win];
        rr.clip_coef = 1.0;
    }
    int r2 = push_pending(o);
    if (res)
        ZO_STRUCT_OUT(res, &rr, ZO_OPTIM_STEP_RESULT_SIZE_V1, &o->err, "zo_optim_wait");
    if (r == 0 && r2 == 0) {
        o->params_current = 1;
        o->win_scale[o->win] = o->scaler.scale;
    }
    return r < 0 ? r : r2;
}

int zo_optim_step_async(zo_optim *o, const zo_optim_step_opts *opts)
{
    zo__enter(o);
    return step_async_impl(o, opts);
}

int zo_optim_wait(zo_optim *o, zo_optim_step_result *res)
{
    zo__enter(o);
    return wait_impl(o, res);
}

int zo_optim_step(zo_optim *o, const zo_optim_step_opts *opts, zo_optim_step_result *res)
{
    int r;
    zo__enter(o);
    if (o && res && (r = ZO_STRUCT_OUT(res, (const zo_optim_step_result *)NULL, ZO_OPTIM_STEP_RESULT_SIZE_V1,
                                       &o->err, "zo_optim_step")) < 0)
        return r;
    /* the wait must not clear the detail of a step_async that failed */
    r = step_async_impl(o, opts);
    int r2 = o ? wait_impl(o, res) : r;
    return r < 0 ? r : r2;
}

int zo_optim_poll(zo_optim *o)
{
    if (!o)
        return -EINVAL;
    pthread_mutex_lock(&o->lock);
    int r = o->ws == ZO__W_QUEUED || o->ws == ZO__W_RUNNING ? ZO_PENDING : o->ws == ZO__W_DONE ? o->job_err : 0;
    pthread_mutex_unlock(&o->lock);
    return r;
}

int zo_optim_eventfd(zo_optim *o)
{
    return o ? o->efd : -EINVAL;
}

int zo_optim_params_current(zo_optim *o)
{
    return o ? o->params_current : -EINVAL;
}

int zo_optim_last_result(zo_optim *o, zo_optim_step_result *res)
{
    zo__enter(o);
    if (!o || !res)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_last_result: NULL argument");
    int r = ZO_STRUCT_OUT(res, (const zo_optim_step_result *)NULL, ZO_OPTIM_STEP_RESULT_SIZE_V1, &o->err,
                          "zo_optim_last_result");
    if (r < 0)
        return r;
    pthread_mutex_lock(&o->lock);
    zo_optim_step_result lr = o->last_res;
    r = o->have_res ? 0 : -ENOENT;
    pthread_mutex_unlock(&o->lock);
    if (r == 0)
        ZO_STRUCT_OUT(res, &lr, ZO_OPTIM_STEP_RESULT_SIZE_V1, &o->err, "zo_optim_last_result");
    return r;
}

double zo_optim_loss_scale(const zo_optim *o)
{
    return o ? o->win_scale[o->win] : 0.0;
}

int zo_optim_get_scaler(zo_optim *o, zo_optim_scaler_state *ust)
{
    if (!o || !ust)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_get_scaler: NULL argument");
    int r = ZO_STRUCT_OUT(ust, (const zo_optim_scaler_state *)NULL, sizeof(zo_optim_scaler_state), &o->err,
                          "zo_optim_get_scaler");
    if (r < 0)
        return r;
    zo_optim_scaler_state st = {.struct_size = sizeof(st)};
    pthread_mutex_lock(&o->lock); /* the worker updates it at each boundary */
    st.dynamic = o->scaler.dynamic;
    st.scale = o->scaler.scale;
    st.cur_iter = o->scaler.cur_iter;
    st.last_overflow_iter = o->scaler.last_overflow_iter;
    st.cur_hysteresis = o->scaler.cur_hysteresis;
    pthread_mutex_unlock(&o->lock);
    return ZO_STRUCT_OUT(ust, &st, sizeof(zo_optim_scaler_state), &o->err, "zo_optim_get_scaler");
}

int zo_optim_set_scaler(zo_optim *o, const zo_optim_scaler_state *ust)
{
    zo__enter(o);
    if (!o || !ust)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_set_scaler: NULL argument");
    zo_optim_scaler_state st = {.struct_size = sizeof(st)};
    int r = ZO_STRUCT_IN(&st, ust, sizeof(zo_optim_scaler_state), &o->err, "zo_optim_set_scaler");
    if (r < 0)
        return r;
    if (st.dynamic != o->scaler.dynamic)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_set_scaler: the state is of a %s scaler, the engine's is %s",
                       st.dynamic ? "dynamic" : "static", o->scaler.dynamic ? "dynamic" : "static");
    if (!st.dynamic) {
        if (st.scale != o->scaler.scale)
            return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_set_scaler: static scale %g, the engine's is %g",
                           st.scale, o->scaler.scale);
        return 0;
    }
    if (!isfinite(st.scale) || !(st.scale >= o->cfg.min_loss_scale) || st.cur_hysteresis < 1 ||
        st.cur_hysteresis > o->cfg.hysteresis || st.cur_iter < 0 || st.last_overflow_iter < -1 ||
        st.last_overflow_iter > st.cur_iter)
        return ZO_FAIL(&o->err, ZO_ECONFIG,
                       "zo_optim_set_scaler: scale %g (finite, >= min_loss_scale %g), cur_hysteresis %u (1..%u), "
                       "cur_iter %lld (>= 0), last_overflow_iter %lld (-1..cur_iter)",
                       st.scale, o->cfg.min_loss_scale, st.cur_hysteresis, o->cfg.hysteresis,
                       (long long)st.cur_iter, (long long)st.last_overflow_iter);
    pthread_mutex_lock(&o->lock);
    int busy = o->ws == ZO__W_QUEUED || o->ws == ZO__W_RUNNING;
    pthread_mutex_unlock(&o->lock);
    if (busy || o->eager_open)
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_set_scaler: an update is queued or running: zo_optim_wait() "
                       "first");
    for (unsigned i = 0; i < o->nt; i++)
        if (o->arrivals[o->win][i])
            return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_set_scaler: gradients were handed over in this window "
                           "(scaled by the old scale): set it between a boundary and the next gradient");
    pthread_mutex_lock(&o->lock);
    o->scaler.scale = st.scale;
    o->scaler.cur_iter = st.cur_iter;
    o->scaler.last_overflow_iter = st.last_overflow_iter;
    o->scaler.cur_hysteresis = st.cur_hysteresis;
    for (unsigned w = 0; w < 2; w++)
        o->win_scale[w] = st.scale;
    pthread_mutex_unlock(&o->lock);
    return 0;
}

int zo_optim_set_lr(zo_optim *o, unsigned group, double lr)
{
    zo__enter(o);
    if (!o || group >= o->ngroups)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_set_lr: %s", o ? "group out of range" : "NULL engine");
    zo_cpuadam_hparams hp = o->groups[group].hp;
    hp.lr = lr;
    return zo_optim_set_hparams(o, group, &hp);
}

int zo_optim_set_hparams(zo_optim *o, unsigned group, const zo_cpuadam_hparams *uhp)
{
    zo__enter(o);
    if (!o || group >= o->ngroups || !uhp)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_set_hparams: %s",
                       !o || !uhp ? "NULL argument" : "group out of range");
    zo__og *og = &o->groups[group];
    if (uhp->struct_size != sizeof(zo_cpuadam_hparams) || uhp->kind != og->hp.kind)
        return ZO_FAIL(&o->err, ZO_ECONFIG, "zo_optim_set_hparams: struct_size or optimizer kind differs");
    zo_cpuadam_hparams hp = *uhp;
    int r = check_engine_fields(o, &hp, group, "zo_optim_set_hparams");
    if (r < 0 || (r = check_hparams(o, &hp, group, og->sdt)) < 0)
        return r;
    /* the worker reads hp while it runs (DPU): the change waits for the next update */
    og->hp_next = hp;
    return 0;
}

int zo_optim_set_step(zo_optim *o, int64_t step)
{
    zo__enter(o);
    if (!o || step < 0)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_set_step: %s",
                       o ? "step must be >= 0" : "NULL engine");
    pthread_mutex_lock(&o->lock);
    /* the worker reads the count as it starts an update (bias correction):
     * only between updates, with nothing waiting to be collected */
    int busy = o->ws != ZO__W_IDLE || o->push_pending;
    if (!busy) {
        o->step = step;
        for (unsigned i = 0; i < o->nt; i++)
            o->tstep[i] = step;
    }
    pthread_mutex_unlock(&o->lock);
    if (busy)
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_set_step: an update is in flight or not collected: call "
                       "zo_optim_wait() first");
    return 0;
}

int zo_optim_tensor_step(zo_optim *o, unsigned index, int64_t *step)
{
    zo__enter(o);
    if (!o || !step || index >= o->nt)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_tensor_step: %s",
                       !o || !step ? "NULL argument" : "index out of range");
    pthread_mutex_lock(&o->lock);
    *step = o->cfg.no_grad == ZO_OPTIM_NO_GRAD_SKIP ? o->tstep[index] : o->step;
    pthread_mutex_unlock(&o->lock);
    return 0;
}

int zo_optim_set_tensor_step(zo_optim *o, unsigned index, int64_t step)
{
    zo__enter(o);
    if (!o || index >= o->nt || step < 0)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_set_tensor_step: %s",
                       !o ? "NULL engine" : step < 0 ? "step must be >= 0" : "index out of range");
    pthread_mutex_lock(&o->lock);
    int busy = o->ws != ZO__W_IDLE || o->push_pending;
    int64_t cur = o->step;
    int skip = o->cfg.no_grad == ZO_OPTIM_NO_GRAD_SKIP;
    if (!busy && skip)
        o->tstep[index] = step;
    pthread_mutex_unlock(&o->lock);
    if (busy)
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_set_tensor_step: an update is in flight or not collected: "
                       "call zo_optim_wait() first");
    if (!skip && step != cur)
        return ZO_FAIL(&o->err, ZO_ECONFIG,
                       "zo_optim_set_tensor_step: tensor '%s' to %lld: with no_grad ZO_OPTIM_NO_GRAD_ZERO every "
                       "tensor has the engine's count (%lld); per-tensor counts need ZO_OPTIM_NO_GRAD_SKIP",
                       o->tensors[index].name, (long long)step, (long long)cur);
    return 0;
}

int zo_optim_set_dev_param(zo_optim *o, unsigned index, void *dev_param)
{
    zo__enter(o);
    if (!o || !dev_param || index >= o->nt)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_set_dev_param: %s",
                       !o || !dev_param ? "NULL argument" : "index out of range");
    zo__ot *t = &o->tensors[index];
    if (!t->dev)
        return ZO_FAIL(&o->err, -ENOENT, "zo_optim_set_dev_param: tensor %u (%s) has no dev_params", index, t->name);
    if (o->dbl)
        return ZO_FAIL(&o->err, ZO_ENOTSUP, "zo_optim_set_dev_param: dpu_double_buffer: the engine's second buffer "
                       "takes turns with the framework's, whose address is fixed at create");
    /* the worker reads devb[] while it writes an update's params out (and a
     * collected DPU update's push reads it): only between updates */
    pthread_mutex_lock(&o->lock);
    int busy = o->ws != ZO__W_IDLE || o->push_pending;
    if (!busy)
        t->dev = t->devb[0] = t->devb[1] = dev_param;
    pthread_mutex_unlock(&o->lock);
    if (busy)
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_set_dev_param: an update is in flight or not collected: call "
                       "zo_optim_wait() first");
    return 0;
}

int zo_optim_param_buffer(zo_optim *o, unsigned index, const void **host)
{
    zo__enter(o);
    if (!o || !host || index >= o->nt)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_param_buffer: %s",
                       !o || !host ? "NULL argument" : "index out of range");
    int r = zo__failed_check(o, "zo_optim_param_buffer"); /* the buffer may be half rebuilt */
    if (r < 0)
        return r;
    pthread_mutex_lock(&o->lock);
    int busy = (o->ws == ZO__W_QUEUED || o->ws == ZO__W_RUNNING) && o->npbuf == 1;
    unsigned b = o->pcur;
    pthread_mutex_unlock(&o->lock);
    if (busy)
        return ZO_FAIL(&o->err, ZO_ESTATE, "zo_optim_param_buffer: a step is writing the buffer: wait first");
    r = zo__pbuf_fresh(o, b);
    if (r < 0)
        return r;
    *host = (const char *)o->pbuf[b] + o->tensors[index].off * o->pes;
    return 0;
}

int zo_optim_param_device(zo_optim *o, unsigned index, void **dev, struct zo_event **ready)
{
    zo__enter(o);
    if (!o || index >= o->nt)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_param_device: %s",
                       o ? "index out of range" : "NULL engine");
    const zo__ot *t = &o->tensors[index];
    if (!t->dev)
        return ZO_FAIL(&o->err, -ENOENT, "zo_optim_param_device: tensor '%s' has no device params (its group has "
                       "no dev_params)", t->name);
    if (dev)
        *dev = t->dev;
    if (ready)
        *ready = o->dbl && o->pdone_rec[o->dcur] ? o->ev_pdone[o->dcur] : NULL;
    return (int)o->dcur;
}

int zo_optim_get_info(zo_optim *o, zo_optim_info *uinfo)
{
    if (!o || !uinfo)
        return ZO_FAIL(o ? &o->err : NULL, -EINVAL, "zo_optim_get_info: NULL argument");
    int r = ZO_STRUCT_OUT(uinfo, (const zo_optim_info *)NULL, ZO_OPTIM_INFO_SIZE_V1, &o->err, "zo_optim_get_info");
    if (r < 0)
        return r;
    zo_optim_info in, *info = &in;
    memset(info, 0, sizeof(*info));
    pthread_mutex_lock(&o->lock);
    info->step = o->step;
    info->skipped_steps = o->skipped;
    info->rollbacks = o->rollbacks;
    info->updates_done = o->updates_done;
    info->nvme_read_bytes_total = o->nvme_read_total;
    info->nvme_write_bytes_total = o->nvme_write_total;
    pthread_mutex_unlock(&o->lock);
    info->micro_steps = o->micro;
    info->loss_scale = o->win_scale[o->win];
    info->ntensors = o->nt;
    info->ngroups = o->ngroups;
    info->nsubgroups = o->nsg;
    info->numel = o->numel;
    info->pinned_bytes = o->pinned_bytes;
    info->host_bytes = o->host_bytes + atomic_load(&o->spill_bytes);
    info->grad_buffer_bytes = o->win_bytes + atomic_load(&o->spill_bytes);
    info->grad_buffer_dtype = o->wdt;
    info->grad_windows_pinned = (unsigned)(o->acc_pinned[0] + o->acc_pinned[1]);
    info->grad_direct_bytes_total = atomic_load(&o->d2h_direct_bytes);
    info->dpu_active = o->cfg.dpu && o->boundaries > o->cfg.dpu_warmup_steps;
    info->eager_subgroups = o->eager_updates;
    return ZO_STRUCT_OUT(uinfo, info, ZO_OPTIM_INFO_SIZE_V1, &o->err, "zo_optim_get_info");
}
