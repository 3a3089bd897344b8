/* SPDX-License-Identifier: Apache-2.0 */
/*
 * DeepSpeed-style JSON configuration of the offload optimizer engine.
 *
 * The file is checked against a schema: one table of keys per JSON object.
 * A key is either mapped (it sets a value the engine uses), known-unused (a
 * DeepSpeed key with no meaning here: accepted and reported) or a section
 * (an object with its own table). Parsing validates everything at once so a
 * typo is found before any memory is pinned or any file created; apply()
 * only copies the validated values into a zo_optim_config and resolves
 * "auto" from the machine.
 */
#define ZO_MODULE "optim"
#include "core/internal.h"

#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zoffload/optim_json.h>

#if ZO_HAVE_CJSON
#include <cjson/cJSON.h>

/* ---- the values a file can set ------------------------------------------- */
enum vid {
    V_NONE = -1,
    V_OPT_TYPE, V_LR, V_BETAS, V_EPS, V_WD, V_BIAS_CORR, V_ADAMW_MODE, V_AMSGRAD,
    V_FP16_EN, V_LOSS_SCALE, V_ISP, V_LSW, V_HYST, V_CONSEC_HYST, V_MIN_LS,
    V_BF16_EN,
    V_CLIP, V_ACCUM, V_SGS,
    V_OFF_DEVICE, V_NVME_PATH, V_PIN, V_BUFCNT,
    V_AIO_BS, V_AIO_QD, V_AIO_THREADS, V_AIO_SS, V_AIO_OE, V_AIO_GDS,
    V_PINNED_BYTES, V_STAGING, V_CLIP_MODE, V_NONFINITE, V_NO_GRAD, V_DPU, V_DPU_WARMUP, V_DPU_DOUBLE, V_NTHREADS, V_NUMA,
    V_STATE_DTYPE, V_GRAD_DTYPE, V_STATE_BLOCK, V_STATE_MAP_M, V_STATE_MAP_V,
    V_COUNT
};

/* Value kinds a key accepts (a mask). */
enum {
    T_BOOL = 1u << 0,
    T_NUM = 1u << 1,  /* any finite number */
    T_INT = 1u << 2,  /* an integral number (1e9 is fine) */
    T_STR = 1u << 3,
    T_AUTO = 1u << 4, /* the string "auto" */
    T_PAIR = 1u << 5, /* [number, number] */
    T_SIZE = 1u << 6, /* an integer or a size string ("2GiB") */
    T_OBJ = 1u << 7,  /* a section: sub-table */
    T_ANY = 1u << 8,  /* known but unused: any value */
};

typedef struct keydef {
    const char *name;
    unsigned types;
    int id;                   /* enum vid, or V_NONE */
    double min, max;          /* range of numbers */
    const struct keydef *sub; /* T_OBJ: its keys, ending with a NULL name */
} keydef;

#define UNUSED_KEY(n) {n, T_ANY, V_NONE, 0, 0, NULL}
#define INF_ HUGE_VAL

static const keydef k_opt_params[] = {
    {"lr", T_NUM | T_AUTO, V_LR, 0, INF_, NULL},
    {"betas", T_PAIR | T_AUTO, V_BETAS, 0, 1, NULL},
    {"eps", T_NUM | T_AUTO, V_EPS, 0, INF_, NULL},
    {"weight_decay", T_NUM | T_AUTO, V_WD, 0, INF_, NULL},
    {"bias_correction", T_BOOL, V_BIAS_CORR, 0, 0, NULL},
    {"adam_w_mode", T_BOOL, V_ADAMW_MODE, 0, 0, NULL},
    {"amsgrad", T_BOOL, V_AMSGRAD, 0, 0, NULL},
    UNUSED_KEY("torch_adam"),
    UNUSED_KEY("fp32_optimizer_states"),
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_optimizer[] = {
    {"type", T_STR, V_OPT_TYPE, 0, 0, NULL},
    {"params", T_OBJ, V_NONE, 0, 0, k_opt_params},
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_fp16[] = {
    {"enabled", T_BOOL | T_AUTO, V_FP16_EN, 0, 0, NULL},
    {"loss_scale", T_NUM, V_LOSS_SCALE, 0, INF_, NULL},
    {"initial_scale_power", T_INT, V_ISP, 0, 126, NULL},
    {"loss_scale_window", T_INT, V_LSW, 1, 1e9, NULL},
    {"hysteresis", T_INT, V_HYST, 1, 1e9, NULL},
    {"consecutive_hysteresis", T_BOOL, V_CONSEC_HYST, 0, 0, NULL},
    {"min_loss_scale", T_NUM, V_MIN_LS, 0x1p-126, INF_, NULL},
    UNUSED_KEY("auto_cast"),
    UNUSED_KEY("fp16_master_weights_and_grads"),
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_bf16[] = {
    {"enabled", T_BOOL | T_AUTO, V_BF16_EN, 0, 0, NULL},
    UNUSED_KEY("immediate_grad_update"),
    UNUSED_KEY("check_grad_overflow"),
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_offload_opt[] = {
    {"device", T_STR, V_OFF_DEVICE, 0, 0, NULL},
    {"nvme_path", T_STR, V_NVME_PATH, 0, 0, NULL},
    {"pin_memory", T_BOOL, V_PIN, 0, 0, NULL},
    {"buffer_count", T_INT | T_AUTO, V_BUFCNT, 4, 1024, NULL},
    UNUSED_KEY("fast_init"),
    UNUSED_KEY("pipeline"),
    UNUSED_KEY("pipeline_read"),
    UNUSED_KEY("pipeline_write"),
    UNUSED_KEY("ratio"),
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_zero[] = {
    {"offload_optimizer", T_OBJ, V_NONE, 0, 0, k_offload_opt},
    {"sub_group_size", T_INT | T_AUTO, V_SGS, 64, 0x1p62, NULL},
    UNUSED_KEY("stage"),
    UNUSED_KEY("offload_param"),
    UNUSED_KEY("contiguous_gradients"),
    UNUSED_KEY("reduce_scatter"),
    UNUSED_KEY("reduce_bucket_size"),
    UNUSED_KEY("allgather_partitions"),
    UNUSED_KEY("allgather_bucket_size"),
    UNUSED_KEY("overlap_comm"),
    UNUSED_KEY("load_from_fp32_weights"),
    UNUSED_KEY("elastic_checkpoint"),
    UNUSED_KEY("cpu_offload"),
    UNUSED_KEY("cpu_offload_params"),
    UNUSED_KEY("cpu_offload_use_pin_memory"),
    UNUSED_KEY("round_robin_gradients"),
    UNUSED_KEY("stage3_max_live_parameters"),
    UNUSED_KEY("stage3_max_reuse_distance"),
    UNUSED_KEY("stage3_prefetch_bucket_size"),
    UNUSED_KEY("stage3_param_persistence_threshold"),
    UNUSED_KEY("stage3_model_persistence_threshold"),
    UNUSED_KEY("stage3_gather_16bit_weights_on_model_save"),
    UNUSED_KEY("stage3_gather_fp16_weights_on_model_save"),
    UNUSED_KEY("max_live_parameters"),
    UNUSED_KEY("max_reuse_distance"),
    UNUSED_KEY("prefetch_bucket_size"),
    UNUSED_KEY("param_persistence_threshold"),
    UNUSED_KEY("model_persistence_threshold"),
    UNUSED_KEY("gather_16bit_weights_on_model_save"),
    UNUSED_KEY("zero_hpz_partition_size"),
    UNUSED_KEY("zero_quantized_weights"),
    UNUSED_KEY("zero_quantized_nontrainable_weights"),
    UNUSED_KEY("zero_quantized_gradients"),
    UNUSED_KEY("mics_shard_size"),
    UNUSED_KEY("mics_hierarchical_params_gather"),
    UNUSED_KEY("memory_efficient_linear"),
    UNUSED_KEY("ignore_unused_parameters"),
    UNUSED_KEY("legacy_stage1"),
    UNUSED_KEY("use_multi_rank_bucket_allreduce"),
    UNUSED_KEY("pipeline_loading_checkpoint"),
    UNUSED_KEY("override_module_apply"),
    UNUSED_KEY("log_trace_cache_warnings"),
    UNUSED_KEY("zeropp_loco_param"),
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_aio[] = {
    {"block_size", T_INT | T_AUTO, V_AIO_BS, 4096, 1u << 30, NULL},
    {"queue_depth", T_INT | T_AUTO, V_AIO_QD, 1, 4096, NULL},
    {"intra_op_parallelism", T_INT | T_AUTO, V_AIO_THREADS, 1, 256, NULL},
    {"thread_count", T_INT | T_AUTO, V_AIO_THREADS, 1, 256, NULL},
    {"single_submit", T_BOOL, V_AIO_SS, 0, 0, NULL},
    {"overlap_events", T_BOOL, V_AIO_OE, 0, 0, NULL},
    {"use_gds", T_BOOL, V_AIO_GDS, 0, 0, NULL},
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_ours[] = {
    {"pinned_bytes", T_SIZE | T_AUTO, V_PINNED_BYTES, 0, 0x1p62, NULL},
    {"grad_staging_bytes", T_SIZE, V_STAGING, 65536, 0x1p40, NULL},
    {"clip_mode", T_STR, V_CLIP_MODE, 0, 0, NULL},
    {"nonfinite", T_STR, V_NONFINITE, 0, 0, NULL},
    {"no_grad", T_STR, V_NO_GRAD, 0, 0, NULL},
    {"dpu", T_BOOL, V_DPU, 0, 0, NULL},
    {"dpu_warmup_steps", T_INT, V_DPU_WARMUP, 0, 1e9, NULL},
    {"dpu_double_buffer", T_BOOL, V_DPU_DOUBLE, 0, 0, NULL},
    {"nthreads", T_INT | T_AUTO, V_NTHREADS, 1, 1024, NULL},
    {"numa_node", T_INT, V_NUMA, -1, 4095, NULL},
    {"state_dtype", T_STR, V_STATE_DTYPE, 0, 0, NULL},
    {"state_block", T_INT, V_STATE_BLOCK, 64, 4096, NULL},
    {"state_map_m", T_STR, V_STATE_MAP_M, 0, 0, NULL},
    {"state_map_v", T_STR, V_STATE_MAP_V, 0, 0, NULL},
    {"grad_dtype", T_STR, V_GRAD_DTYPE, 0, 0, NULL},
    {NULL, 0, V_NONE, 0, 0, NULL},
};
static const keydef k_top[] = {
    {"optimizer", T_OBJ, V_NONE, 0, 0, k_optimizer},
    {"fp16", T_OBJ, V_NONE, 0, 0, k_fp16},
    {"bf16", T_OBJ, V_NONE, 0, 0, k_bf16},
    {"gradient_clipping", T_NUM | T_AUTO, V_CLIP, 0, INF_, NULL},
    {"gradient_accumulation_steps", T_INT | T_AUTO, V_ACCUM, 1, 1e9, NULL},
    {"zero_optimization", T_OBJ, V_NONE, 0, 0, k_zero},
    {"aio", T_OBJ, V_NONE, 0, 0, k_aio},
    {"zoffload", T_OBJ, V_NONE, 0, 0, k_ours},
    UNUSED_KEY("train_batch_size"),
    UNUSED_KEY("train_micro_batch_size_per_gpu"),
    UNUSED_KEY("steps_per_print"),
    UNUSED_KEY("wall_clock_breakdown"),
    UNUSED_KEY("scheduler"),
    UNUSED_KEY("amp"),
    UNUSED_KEY("zero_allow_untested_optimizer"),
    UNUSED_KEY("zero_force_ds_cpu_optimizer"),
    UNUSED_KEY("dump_state"),
    UNUSED_KEY("prescale_gradients"),
    UNUSED_KEY("gradient_predivide_factor"),
    UNUSED_KEY("sparse_gradients"),
    UNUSED_KEY("activation_checkpointing"),
    UNUSED_KEY("flops_profiler"),
    UNUSED_KEY("tensorboard"),
    UNUSED_KEY("wandb"),
    UNUSED_KEY("csv_monitor"),
    UNUSED_KEY("comet"),
    UNUSED_KEY("comms_logger"),
    UNUSED_KEY("communication_data_type"),
    UNUSED_KEY("seq_parallel_communication_data_type"),
    UNUSED_KEY("elasticity"),
    UNUSED_KEY("data_efficiency"),
    UNUSED_KEY("compression_training"),
    UNUSED_KEY("checkpoint"),
    UNUSED_KEY("data_types"),
    UNUSED_KEY("autotuning"),
    UNUSED_KEY("memory_breakdown"),
    UNUSED_KEY("pipeline"),
    UNUSED_KEY("eigenvalue"),
    UNUSED_KEY("progressive_layer_drop"),
    UNUSED_KEY("curriculum_learning"),
    UNUSED_KEY("nebula"),
    UNUSED_KEY("disable_allgather"),
    UNUSED_KEY("sparse_attention"),
    UNUSED_KEY("hybrid_engine"),
    UNUSED_KEY("graph_harvesting"),
    UNUSED_KEY("timers"),
    {NULL, 0, V_NONE, 0, 0, NULL},
};

typedef struct jval {
    bool set, is_auto, b;
    double num, pair[2];
    const char *str; /* points into the cJSON tree */
    const char *path;
} jval;

struct zo_optim_json {
    cJSON *root;
    jval v[V_COUNT];
    char *unused;   /* "unused: a.b\n..." built at parse */
    size_t unused_len;
    char *report;   /* built by apply */
};

/* ---- small helpers ------------------------------------------------------------ */
/* Damerau-Levenshtein (optimal string alignment) distance, for "did you mean". */
static unsigned edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    unsigned d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (unsigned)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (unsigned)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            unsigned cost = a[i - 1] != b[j - 1];
            unsigned best = ZO_MIN(d[i - 1][j] + 1, d[i][j - 1] + 1);
            best = ZO_MIN(best, d[i - 1][j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                best = ZO_MIN(best, d[i - 2][j - 2] + 1);
            d[i][j] = best;
        }
    return d[la][lb];
}

/* Where else in the schema a key of this exact name lives ("zero_optimization"
 * for a sub_group_size put at the top level). */
static const char *find_elsewhere(const keydef *tab, const char *name, const char *tabname, char *buf, size_t len)
{
    for (const keydef *k = tab; k->name; k++) {
        if (strcmp(k->name, name) == 0 && tabname) {
            snprintf(buf, len, "%s.%s", tabname, name);
            return buf;
        }
        if (k->types & T_OBJ) {
            char sub[160];
            snprintf(sub, sizeof(sub), "%s%s%s", tabname ? tabname : "", tabname ? "." : "", k->name);
            const char *r = find_elsewhere(k->sub, name, sub, buf, len);
            if (r)
                return r;
        }
    }
    return NULL;
}

/* A key or string value of the file, for a message: control bytes, quotes
 * and backslashes as \xNN (a key of escape sequences must not reach the
 * user's terminal raw), cut to 64 bytes. Returns buf. */
#define ESC_LEN (64 * 4 + 8)
static const char *esc(const char *s, char buf[ESC_LEN])
{
    size_t n = 0;
    for (size_t i = 0; s[i] && n + 5 < ESC_LEN; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 64) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
            n += (size_t)snprintf(buf + n, ESC_LEN - n, "\\x%02x", c);
        else
            buf[n++] = (char)c;
    }
    buf[n] = '\0';
    return buf;
}

static int unknown_key(const keydef *tab, const char *path, const char *uname)
{
    char ebuf[ESC_LEN];
    const char *name = uname;
    const char *best = NULL;
    unsigned bestd = 99;
    size_t nl = strlen(name);
    for (const keydef *k = tab; k->name; k++) {
        unsigned d = edit_distance(name, k->name);
        /* a shortened or lengthened key ("dpu_warmup" for dpu_warmup_steps) is as good as a typo */
        size_t kl = strlen(k->name);
        if (nl >= 4 && kl >= 4 && (strncmp(name, k->name, ZO_MIN(nl, kl)) == 0))
            d = ZO_MIN(d, 1u);
        if (d < bestd)
            bestd = d, best = k->name;
    }
    unsigned allow = nl <= 4 ? 1 : nl <= 9 ? 2 : 3;
    char where[256];
    int elsewhere = find_elsewhere(k_top, name, NULL, where, sizeof(where)) != NULL;
    name = esc(uname, ebuf); /* from here on, for the message */
    if (best && bestd <= allow)
        return ZO_FAIL(NULL, ZO_ECONFIG, "unknown key %s%s%s (did you mean %s?)", path, *path ? "." : "", name, best);
    if (elsewhere)
        return ZO_FAIL(NULL, ZO_ECONFIG, "unknown key %s%s%s (it belongs in %s)", path, *path ? "." : "", name, where);
    return ZO_FAIL(NULL, ZO_ECONFIG, "unknown key %s%s%s%s%s%s", path, *path ? "." : "", name,
                   best ? " (closest known: " : "", best ? best : "", best ? ")" : "");
}

static const char *type_names(unsigned t, char *buf, size_t len)
{
    buf[0] = '\0';
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{T_BOOL, "true/false"}, {T_INT, "an integer"},    {T_NUM, "a number"},
                 {T_SIZE, "a byte count"}, {T_STR, "a string"},  {T_PAIR, "[number, number]"},
                 {T_AUTO, "\"auto\""},     {T_OBJ, "an object"}};
    for (size_t i = 0; i < ZO_ARRAY_LEN(names); i++)
        if (t & names[i].bit) {
            size_t l = strlen(buf);
            snprintf(buf + l, len - l, "%s%s", l ? " or " : "", names[i].name);
        }
    return buf;
}

static int append(char **s, size_t *len, const char *fmt, ...) ZO_PRINTF(3, 4);
static int append(char **s, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    char *p = realloc(*s, *len + (size_t)n + 1);
    if (!p)
        return -ENOMEM;
    va_start(ap, fmt);
    vsnprintf(p + *len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    *s = p;
    *len += (size_t)n;
    return 0;
}

/* ---- parse ------------------------------------------------------------------------ */
static int check_number(const keydef *k, const char *path, double x)
{
    if (!isfinite(x))
        return ZO_FAIL(NULL, ZO_ECONFIG, "%s: %g is not finite", path, x);
    if ((k->types & (T_INT | T_SIZE)) && !(k->types & T_NUM) && x != floor(x))
        return ZO_FAIL(NULL, ZO_ECONFIG, "%s: %g is not an integer", path, x);
    if (x < k->min || x > k->max)
        return ZO_FAIL(NULL, ZO_ECONFIG, "%s: %g out of range [%g, %g]", path, x, k->min, k->max);
    return 0;
}

static int walk(zo_optim_json *j, const cJSON *obj, const keydef *tab, const char *path, int depth)
{
    if (depth > 8)
        return ZO_FAIL(NULL, ZO_ECONFIG, "%s: nested too deep", path);
    for (const cJSON *it = obj->child; it; it = it->next) {
        const char *name = it->string ? it->string : "";
        const keydef *k = tab;
        while (k->name && strcmp(k->name, name) != 0)
            k++;
        if (!k->name)
            return unknown_key(tab, path, name);
        /* a duplicate key is an error: JSON parsers disagree on which one wins */
        for (const cJSON *o = obj->child; o != it; o = o->next)
            if (o->string && strcmp(o->string, name) == 0)
                return ZO_FAIL(NULL, ZO_ECONFIG, "key %s%s%s appears twice", path, *path ? "." : "", name);
        char full[256];
        int fl = snprintf(full, sizeof(full), "%s%s%s", path, *path ? "." : "", name);
        if (fl < 0 || (size_t)fl >= sizeof(full))
            return ZO_FAIL(NULL, ZO_ECONFIG, "key path too long: %s...", path);
        char tn[128];
        if (k->types & T_ANY) {
            ZO_CHECK(append(&j->unused, &j->unused_len, "unused: %s (a DeepSpeed key zoffload does not need)\n", full));
            continue;
        }
        if (k->types & T_OBJ) {
            if (!cJSON_IsObject(it))
                return ZO_FAIL(NULL, ZO_ECONFIG, "%s: must be an object", full);
            ZO_CHECK(walk(j, it, k->sub, full, depth + 1));
            continue;
        }
        jval *v = &j->v[k->id];
        if (v->set) /* two aliases of one value (aio.thread_count and intra_op_parallelism) */
            return ZO_FAIL(NULL, ZO_ECONFIG, "%s: also set as %s", full, v->path);
        v->path = strdup(full);
        if (!v->path)
            return -ENOMEM;
        v->set = true;
        if ((k->types & T_AUTO) && cJSON_IsString(it) && strcmp(it->valuestring, "auto") == 0) {
            v->is_auto = true;
        } else if ((k->types & T_BOOL) && cJSON_IsBool(it)) {
            v->b = cJSON_IsTrue(it);
        } else if ((k->types & (T_NUM | T_INT | T_SIZE)) && cJSON_IsNumber(it)) {
            v->num = it->valuedouble;
            ZO_CHECK(check_number(k, full, v->num));
        } else if ((k->types & T_SIZE) && cJSON_IsString(it)) {
            uint64_t b;
            if (zo_parse_size(it->valuestring, &b) < 0)
                return ZO_FAIL(NULL, ZO_ECONFIG, "%s: \"%s\" is not a byte count (e.g. 2GiB)", full,
                               esc(it->valuestring, (char[ESC_LEN]){0}));
            v->num = (double)b;
            ZO_CHECK(check_number(k, full, v->num));
        } else if ((k->types & T_STR) && cJSON_IsString(it)) {
            v->str = it->valuestring;
        } else if ((k->types & T_PAIR) && cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsNumber(cJSON_GetArrayItem(it, 0)) && cJSON_IsNumber(cJSON_GetArrayItem(it, 1))) {
            for (int i = 0; i < 2; i++) {
                v->pair[i] = cJSON_GetArrayItem(it, i)->valuedouble;
                ZO_CHECK(check_number(k, full, v->pair[i]));
            }
        } else {
            char *txt = cJSON_PrintUnformatted(it);
            int r = ZO_FAIL(NULL, ZO_ECONFIG, "%s: %.60s is not %s", full, txt ? txt : "(value)",
                            type_names(k->types, tn, sizeof(tn)));
            free(txt);
            return r;
        }
    }
    return 0;
}

/* "fp32"/"f32", "bf16": that dtype; "q8", "q4": quantized fp32 moments
 * (zo_optim_group.state_bits). -EINVAL otherwise. */
static int state_type(const char *str, zo_dtype *dt, int *bits)
{
    *bits = !strcmp(str, "q8") ? 8 : !strcmp(str, "q4") ? 4 : 0;
    if (*bits) {
        *dt = ZO_DTYPE_F32;
        return 0;
    }
    return zo_dtype_parse(str, dt) < 0 || (*dt != ZO_DTYPE_F32 && *dt != ZO_DTYPE_BF16) ? -EINVAL : 0;
}

/* zoffload.state_map_m / state_map_v: the names and the zo_qmap each means
 * (m is signed, v unsigned; "_nz": the map without its zero) */
static const char *const k_map_m_names[] = {"dynamic", "linear"};
static const zo_qmap k_map_m[] = {ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_LINEAR_SIGNED};
static const char *const k_map_v_names[] = {"dynamic", "dynamic_nz", "linear", "linear_nz"};
static const zo_qmap k_map_v[] = {ZO_QMAP_DYNAMIC_UNSIGNED, ZO_QMAP_DYNAMIC_UNSIGNED_NZ, ZO_QMAP_LINEAR_UNSIGNED,
                                  ZO_QMAP_LINEAR_UNSIGNED_NZ};

static int str_choice(const jval *v, const char *const *names, unsigned n, const char *const *also, unsigned *out)
{
    for (unsigned i = 0; i < n; i++)
        if (strcasecmp(v->str, names[i]) == 0 || (also && also[i] && strcasecmp(v->str, also[i]) == 0)) {
            *out = i;
            return 0;
        }
    char list[160] = "";
    for (unsigned i = 0; i < n; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof(list) - l, "%s%s", i ? ", " : "", names[i]);
    }
    return ZO_FAIL(NULL, ZO_ECONFIG, "%s: \"%s\" is not one of %s", v->path, esc(v->str, (char[ESC_LEN]){0}), list);
}

/* Cross-key checks that need no machine facts. */
static int validate(zo_optim_json *j)
{
    jval *v = j->v;
    if (v[V_OPT_TYPE].set) {
        static const char *const ok[] = {"AdamW", "Adam", "Adagrad", "Lion"};
        static const char *const known_no[] = {"OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Lamb", "FusedLamb",
                                               "MuAdam", "MuAdamW", "MuSGD", "SGD", "Muon"};
        unsigned i;
        for (i = 0; i < ZO_ARRAY_LEN(known_no); i++)
            if (strcasecmp(v[V_OPT_TYPE].str, known_no[i]) == 0)
                return ZO_FAIL(NULL, ZO_ENOTSUP, "optimizer.type \"%s\" is a DeepSpeed optimizer zoffload does not "
                               "offload (it has AdamW, Adam, Adagrad, Lion)", esc(v[V_OPT_TYPE].str, (char[ESC_LEN]){0}));
        ZO_CHECK(str_choice(&v[V_OPT_TYPE], ok, ZO_ARRAY_LEN(ok), NULL, &i));
    }
    if (v[V_AMSGRAD].set && v[V_AMSGRAD].b)
        return ZO_FAIL(NULL, ZO_ENOTSUP,
                       "optimizer.params.amsgrad: zoffload has no AMSGrad variant (AdamW, Adam, Adagrad, Lion)");
    if (v[V_BETAS].set && !v[V_BETAS].is_auto && (v[V_BETAS].pair[0] >= 1 || v[V_BETAS].pair[1] >= 1) &&
        !(v[V_OPT_TYPE].set && strcasecmp(v[V_OPT_TYPE].str, "Lion") == 0))
        return ZO_FAIL(NULL, ZO_ECONFIG, "optimizer.params.betas: each beta must be < 1 for Adam/AdamW");
    bool fp16 = v[V_FP16_EN].set && !v[V_FP16_EN].is_auto && v[V_FP16_EN].b;
    bool bf16 = v[V_BF16_EN].set && !v[V_BF16_EN].is_auto && v[V_BF16_EN].b;
    if (fp16 && bf16)
        return ZO_FAIL(NULL, ZO_ECONFIG, "fp16.enabled and bf16.enabled are both true: pick one");
    if (v[V_OFF_DEVICE].set) {
        static const char *const dev[] = {"cpu", "nvme", "none"};
        unsigned i;
        ZO_CHECK(str_choice(&v[V_OFF_DEVICE], dev, 3, NULL, &i));
    }
    if (v[V_NVME_PATH].set && !v[V_NVME_PATH].str[0])
        return ZO_FAIL(NULL, ZO_ECONFIG, "zero_optimization.offload_optimizer.nvme_path is empty");
    if (v[V_AIO_GDS].set && v[V_AIO_GDS].b)
        return ZO_FAIL(NULL, ZO_ENOTSUP, "aio.use_gds: GPUDirect Storage is not supported yet");
    unsigned dummy;
    if (v[V_CLIP_MODE].set) {
        static const char *const m[] = {"two_pass", "speculative"};
        ZO_CHECK(str_choice(&v[V_CLIP_MODE], m, 2, NULL, &dummy));
    }
    if (v[V_NONFINITE].set) {
        static const char *const m[] = {"error", "skip"};
        ZO_CHECK(str_choice(&v[V_NONFINITE], m, 2, NULL, &dummy));
    }
    if (v[V_NO_GRAD].set) {
        static const char *const m[] = {"zero", "skip"};
        ZO_CHECK(str_choice(&v[V_NO_GRAD], m, 2, NULL, &dummy));
    }
    zo_dtype dt;
    int bits = 0;
    if (v[V_STATE_DTYPE].set && state_type(v[V_STATE_DTYPE].str, &dt, &bits) < 0)
        return ZO_FAIL(NULL, ZO_ECONFIG, "zoffload.state_dtype: \"%s\" is not fp32, bf16, q8 or q4",
                       esc(v[V_STATE_DTYPE].str, (char[ESC_LEN]){0}));
    if (v[V_STATE_BLOCK].set && (!bits || ((uint64_t)v[V_STATE_BLOCK].num & ((uint64_t)v[V_STATE_BLOCK].num - 1))))
        return ZO_FAIL(NULL, ZO_ECONFIG, "zoffload.state_block: %g: %s", v[V_STATE_BLOCK].num,
                       bits ? "not a power of two" : "a block of quantized states: needs state_dtype q8 or q4");
    for (int s = V_STATE_MAP_M; s <= V_STATE_MAP_V; s++) {
        if (!v[s].set)
            continue;
        if (s == V_STATE_MAP_M)
            ZO_CHECK(str_choice(&v[s], k_map_m_names, ZO_ARRAY_LEN(k_map_m_names), NULL, &dummy));
        else
            ZO_CHECK(str_choice(&v[s], k_map_v_names, ZO_ARRAY_LEN(k_map_v_names), NULL, &dummy));
        if (!bits)
            return ZO_FAIL(NULL, ZO_ECONFIG, "%s: \"%s\": a code map of quantized states: needs state_dtype q8 or q4",
                           v[s].path, esc(v[s].str, (char[ESC_LEN]){0}));
    }
    if (v[V_GRAD_DTYPE].set && (zo_dtype_parse(v[V_GRAD_DTYPE].str, &dt) < 0 ||
                                (dt != ZO_DTYPE_F32 && dt != ZO_DTYPE_BF16 && dt != ZO_DTYPE_F16)))
        return ZO_FAIL(NULL, ZO_ECONFIG, "zoffload.grad_dtype: \"%s\" is not fp32, fp16 or bf16",
                       esc(v[V_GRAD_DTYPE].str, (char[ESC_LEN]){0}));
    return 0;
}

ZO_API int zo_optim_json_parse(const char *text, size_t len, zo_optim_json **out)
{
    if (!out || !text)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_json_parse: NULL %s", out ? "text" : "out");
    *out = NULL;
    zo_optim_json *j = calloc(1, sizeof(*j));
    if (!j)
        return -ENOMEM;
    int rc;
    const char *end = NULL;
    j->root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j->root) {
        size_t pos = end && end >= text ? (size_t)(end - text) : 0;
        size_t line = 1;
        for (size_t i = 0; i < pos && i < len; i++)
            line += text[i] == '\n';
        rc = ZO_FAIL(NULL, ZO_EFORMAT, "config is not valid JSON (near byte %zu, line %zu)", pos, line);
        goto fail;
    }
    /* Trailing bytes after the value are an error, not silently ignored. */
    for (const char *p = end; p && p < text + len; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != '\0') {
            rc = ZO_FAIL(NULL, ZO_EFORMAT, "config has bytes after its JSON value (byte %zu)", (size_t)(p - text));
            goto fail;
        }
    if (!cJSON_IsObject(j->root)) {
        rc = ZO_FAIL(NULL, ZO_EFORMAT, "config: the top level must be a JSON object");
        goto fail;
    }
    ZO_CHECK_GOTO(walk(j, j->root, k_top, "", 0), rc, fail);
    ZO_CHECK_GOTO(validate(j), rc, fail);
    *out = j;
    return 0;
fail:
    zo_optim_json_free(&j);
    return rc;
}

ZO_API int zo_optim_json_load(const char *path, zo_optim_json **out)
{
    if (!path || !out)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_json_load: NULL %s", path ? "out" : "path");
    *out = NULL;
    /* O_NONBLOCK: a FIFO planted as the config must not hang the open. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return ZO_FAIL(NULL, -errno, "config %s: %s", path, zo_strerror(-errno));
    struct stat st;
    int rc;
    char *buf = NULL;
    if (fstat(fd, &st) < 0) {
        rc = ZO_FAIL(NULL, -errno, "config %s: fstat: %s", path, zo_strerror(-errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = ZO_FAIL(NULL, -EINVAL, "config %s: not a regular file", path);
        goto out;
    }
    if (st.st_size > (16 << 20)) {
        rc = ZO_FAIL(NULL, -EFBIG, "config %s: %lld bytes, over the 16 MiB limit", path, (long long)st.st_size);
        goto out;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = ZO_FAIL(NULL, -errno, "config %s: read: %s", path, zo_strerror(-errno));
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap) { /* the file grew since fstat */
            rc = ZO_FAIL(NULL, -EFBIG, "config %s: changed size while being read", path);
            goto out;
        }
    }
    rc = zo_optim_json_parse(buf, n, out);
out:
    free(buf);
    close(fd);
    return rc;
}

ZO_API void zo_optim_json_free(zo_optim_json **pj)
{
    if (!pj || !*pj)
        return;
    zo_optim_json *j = *pj;
    for (int i = 0; i < V_COUNT; i++)
        free((char *)j->v[i].path);
    cJSON_Delete(j->root);
    free(j->unused);
    free(j->report);
    free(j);
    *pj = NULL;
}

/* ---- apply -------------------------------------------------------------------------- */
static uint64_t machine_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

#define REPORT(...)                                                 \
    do {                                                            \
        int r_ = append(&rep, &rlen, __VA_ARGS__);                  \
        if (r_ < 0) {                                               \
            free(rep);                                              \
            return r_;                                              \
        }                                                           \
    } while (0)

ZO_API int zo_optim_json_apply(zo_optim_json *j, zo_optim_config *cfg, zo_optim_group *group)
{
    if (!j || !cfg)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_json_apply: NULL %s", j ? "cfg" : "j");
    if (cfg->struct_size != sizeof(*cfg))
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_json_apply: cfg.struct_size %zu, expected %zu (use "
                       "zo_optim_config_default)", cfg->struct_size, sizeof(*cfg));
    if (group && group->struct_size != sizeof(*group))
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_json_apply: group.struct_size %zu, expected %zu",
                       group->struct_size, sizeof(*group));
    const jval *v = j->v;
    zo_optim_config c = *cfg;
    char *rep = NULL;
    size_t rlen = 0;

    /* optimizer */
    if (v[V_OPT_TYPE].set) {
        zo_optim_kind kind = ZO_OPTIM_ADAMW;
        const char *t = v[V_OPT_TYPE].str;
        if (strcasecmp(t, "Adam") == 0) /* DeepSpeed's Adam is AdamW unless adam_w_mode is false */
            kind = (v[V_ADAMW_MODE].set && !v[V_ADAMW_MODE].b) ? ZO_OPTIM_ADAM : ZO_OPTIM_ADAMW;
        else if (strcasecmp(t, "Adagrad") == 0)
            kind = ZO_OPTIM_ADAGRAD;
        else if (strcasecmp(t, "Lion") == 0)
            kind = ZO_OPTIM_LION;
        if (kind != c.hparams.kind)
            zo_cpuadam_hparams_default(&c.hparams, kind);
    }
    if (v[V_ADAMW_MODE].set && !v[V_OPT_TYPE].set && c.hparams.kind <= ZO_OPTIM_ADAM)
        c.hparams.kind = v[V_ADAMW_MODE].b ? ZO_OPTIM_ADAMW : ZO_OPTIM_ADAM;
    if (v[V_LR].set) {
        if (v[V_LR].is_auto)
            REPORT("auto: optimizer.params.lr = %g (the optimizer's default)\n", c.hparams.lr);
        else
            c.hparams.lr = v[V_LR].num;
    }
    if (v[V_BETAS].set) {
        if (v[V_BETAS].is_auto)
            REPORT("auto: optimizer.params.betas = [%g, %g] (the optimizer's default)\n", c.hparams.beta1,
                   c.hparams.beta2);
        else
            c.hparams.beta1 = v[V_BETAS].pair[0], c.hparams.beta2 = v[V_BETAS].pair[1];
    }
    if (v[V_EPS].set) {
        if (v[V_EPS].is_auto)
            REPORT("auto: optimizer.params.eps = %g (the optimizer's default)\n", c.hparams.eps);
        else
            c.hparams.eps = v[V_EPS].num;
    }
    if (v[V_WD].set) {
        if (v[V_WD].is_auto)
            REPORT("auto: optimizer.params.weight_decay = %g (the optimizer's default)\n", c.hparams.weight_decay);
        else
            c.hparams.weight_decay = v[V_WD].num;
    }
    if (v[V_BIAS_CORR].set)
        c.hparams.bias_correction = v[V_BIAS_CORR].b;

    /* precision and loss scaling */
    if (v[V_FP16_EN].set && !v[V_FP16_EN].is_auto && v[V_FP16_EN].b)
        c.param_dtype = ZO_DTYPE_F16;
    else if (v[V_BF16_EN].set && !v[V_BF16_EN].is_auto && v[V_BF16_EN].b)
        c.param_dtype = ZO_DTYPE_BF16;
    else if ((v[V_FP16_EN].set && !v[V_FP16_EN].is_auto) && (v[V_BF16_EN].set && !v[V_BF16_EN].is_auto))
        c.param_dtype = ZO_DTYPE_F32; /* both present and false: fp32 training */
    if ((v[V_FP16_EN].set && v[V_FP16_EN].is_auto) || (v[V_BF16_EN].set && v[V_BF16_EN].is_auto))
        REPORT("auto: fp16/bf16.enabled: parameter dtype stays %s\n",
               c.param_dtype == ZO_DTYPE_COUNT ? "unset (the caller sets param_dtype)" : zo_dtype_name(c.param_dtype));
    if (v[V_LOSS_SCALE].set)
        c.loss_scale = v[V_LOSS_SCALE].num;
    if (v[V_ISP].set)
        c.initial_scale_power = (int)v[V_ISP].num;
    if (v[V_LSW].set)
        c.loss_scale_window = (unsigned)v[V_LSW].num;
    if (v[V_HYST].set)
        c.hysteresis = (unsigned)v[V_HYST].num;
    if (v[V_CONSEC_HYST].set)
        c.consecutive_hysteresis = v[V_CONSEC_HYST].b;
    if (v[V_MIN_LS].set)
        c.min_loss_scale = v[V_MIN_LS].num;
    if (v[V_CLIP].set) {
        if (v[V_CLIP].is_auto)
            REPORT("auto: gradient_clipping = %g (%s)\n", c.max_grad_norm,
                   c.max_grad_norm > 0 ? "the caller's" : "no clipping");
        else
            c.max_grad_norm = v[V_CLIP].num;
    }
    if (v[V_ACCUM].set) {
        if (v[V_ACCUM].is_auto)
            REPORT("auto: gradient_accumulation_steps = %u (the caller's)\n", c.grad_accum_steps);
        else
            c.grad_accum_steps = (unsigned)v[V_ACCUM].num;
    }

    /* placement */
    if (v[V_OFF_DEVICE].set) {
        if (strcasecmp(v[V_OFF_DEVICE].str, "nvme") == 0)
            c.placement = ZO_OPTIM_PLACE_NVME;
        else {
            c.placement = ZO_OPTIM_PLACE_HOST;
            if (strcasecmp(v[V_OFF_DEVICE].str, "none") == 0)
                REPORT("note: offload_optimizer.device \"none\": zoffload always keeps the optimizer off the "
                       "device; using pinned host memory (\"cpu\")\n");
        }
    }
    if (v[V_NVME_PATH].set)
        c.nvme_path = v[V_NVME_PATH].str;
    if (c.placement == ZO_OPTIM_PLACE_NVME && !c.swap && (!c.nvme_path || !c.nvme_path[0])) {
        free(rep);
        return ZO_FAIL(NULL, ZO_ECONFIG, "offload_optimizer.device is \"nvme\" but no nvme_path is given");
    }
    if (v[V_PIN].set)
        c.pin_memory = v[V_PIN].b;
    if (v[V_BUFCNT].set) {
        if (v[V_BUFCNT].is_auto)
            REPORT("auto: offload_optimizer.buffer_count = %u (default)\n", c.buffer_count);
        else
            c.buffer_count = (unsigned)v[V_BUFCNT].num;
    }
    /* budgets: "auto" pinned memory is an eighth of RAM, at least 256 MiB and
     * at most 2 GiB (the engine streams NVMe sub-groups through it: more
     * buys nothing once disk-bound), and never above the memlock limit. */
    if (v[V_PINNED_BYTES].set) {
        if (v[V_PINNED_BYTES].is_auto) {
            uint64_t ram = machine_ram(), b = ram / 8;
            b = ZO_MAX(b, (uint64_t)256 << 20);
            b = ZO_MIN(b, (uint64_t)2 << 30);
            struct rlimit rl;
            const char *why = "RAM/8 within [256 MiB, 2 GiB]";
            if (c.pin_memory && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
                geteuid() != 0 && (uint64_t)rl.rlim_cur < b) {
                b = (uint64_t)rl.rlim_cur;
                why = "the memlock limit (ulimit -l)";
            }
            c.pinned_bytes = b;
            REPORT("auto: zoffload.pinned_bytes = %llu (%s; RAM %llu)\n", (unsigned long long)b, why,
                   (unsigned long long)ram);
        } else {
            c.pinned_bytes = (uint64_t)v[V_PINNED_BYTES].num;
        }
    }
    if (v[V_STAGING].set)
        c.grad_staging_bytes = (size_t)v[V_STAGING].num;
    /* sub_group_size "auto": NVMe placement keeps buffer_count sub-groups of
     * master + m + v (12 B/element with fp32 states) in flight through pinned
     * memory: give each a quarter of the pinned budget's share, in whole
     * MiB-multiples of elements, within [1 Mi, 256 Mi] elements. Host
     * placement: 16 Mi elements, big enough to amortise a sub-group's fixed
     * cost, small enough to pipeline the copy-back. */
    if (v[V_SGS].set) {
        if (v[V_SGS].is_auto) {
            uint64_t sgs = (uint64_t)1 << 24;
            if (c.placement == ZO_OPTIM_PLACE_NVME) {
                uint64_t budget = c.pinned_bytes ? c.pinned_bytes : ((uint64_t)2 << 30);
                unsigned bufs = c.buffer_count ? c.buffer_count : 4;
                sgs = budget / ((uint64_t)bufs * 12u);
                sgs &= ~(((uint64_t)1 << 20) - 1);
                sgs = ZO_MAX(sgs, (uint64_t)1 << 20);
                sgs = ZO_MIN(sgs, (uint64_t)1 << 28);
                REPORT("auto: zero_optimization.sub_group_size = %llu (%u buffers of 12 B/element in the %llu-byte "
                       "pinned budget)\n", (unsigned long long)sgs, bufs, (unsigned long long)budget);
            } else {
                REPORT("auto: zero_optimization.sub_group_size = %llu (host placement default)\n",
                       (unsigned long long)sgs);
            }
            c.sub_group_size = sgs;
        } else {
            c.sub_group_size = (uint64_t)v[V_SGS].num;
        }
    }

    /* aio */
    if (v[V_AIO_BS].set) {
        if (v[V_AIO_BS].is_auto)
            REPORT("auto: aio.block_size = %zu (default; zo-aio-bench --sweep finds the best)\n", c.aio_block_size);
        else
            c.aio_block_size = (size_t)v[V_AIO_BS].num;
    }
    if (v[V_AIO_QD].set) {
        if (v[V_AIO_QD].is_auto)
            REPORT("auto: aio.queue_depth = %u (default)\n", c.aio_queue_depth);
        else
            c.aio_queue_depth = (unsigned)v[V_AIO_QD].num;
    }
    if (v[V_AIO_THREADS].set) {
        if (v[V_AIO_THREADS].is_auto)
            REPORT("auto: %s = %u (default)\n", v[V_AIO_THREADS].path, c.aio_threads);
        else
            c.aio_threads = (unsigned)v[V_AIO_THREADS].num;
    }
    if (v[V_AIO_SS].set)
        c.aio_single_submit = v[V_AIO_SS].b;
    if (v[V_AIO_OE].set)
        c.aio_overlap_events = v[V_AIO_OE].b;

    /* ours */
    if (v[V_CLIP_MODE].set)
        c.clip_mode = strcasecmp(v[V_CLIP_MODE].str, "speculative") == 0 ? ZO_OPTIM_CLIP_SPECULATIVE
                                                                       : ZO_OPTIM_CLIP_TWO_PASS;
    if (v[V_NONFINITE].set)
        c.nonfinite = strcasecmp(v[V_NONFINITE].str, "skip") == 0 ? ZO_OPTIM_NONFINITE_SKIP
                                                                : ZO_OPTIM_NONFINITE_ERROR;
    if (v[V_NO_GRAD].set)
        c.no_grad = strcasecmp(v[V_NO_GRAD].str, "skip") == 0 ? ZO_OPTIM_NO_GRAD_SKIP : ZO_OPTIM_NO_GRAD_ZERO;
    if (v[V_DPU].set)
        c.dpu = v[V_DPU].b;
    if (v[V_DPU_WARMUP].set)
        c.dpu_warmup_steps = (unsigned)v[V_DPU_WARMUP].num;
    if (v[V_DPU_DOUBLE].set)
        c.dpu_double_buffer = v[V_DPU_DOUBLE].b;
    if (v[V_NTHREADS].set) {
        if (v[V_NTHREADS].is_auto) {
            c.nthreads = 0;
            REPORT("auto: zoffload.nthreads = every CPU this process may use\n");
        } else {
            c.nthreads = (int)v[V_NTHREADS].num;
        }
    }
    if (v[V_NUMA].set)
        c.numa_node = (int)v[V_NUMA].num;
    if (v[V_GRAD_DTYPE].set)
        (void)zo_dtype_parse(v[V_GRAD_DTYPE].str, &c.grad_dtype);
    if (group && v[V_STATE_DTYPE].set) {
        int bits = 0;
        (void)state_type(v[V_STATE_DTYPE].str, &group->state_dtype, &bits);
        group->state_bits = (uint16_t)bits;
        if (v[V_STATE_BLOCK].set)
            group->state_block = (uint16_t)v[V_STATE_BLOCK].num;
    } else if (!group && v[V_STATE_DTYPE].set) {
        REPORT("note: zoffload.state_dtype is a group setting: pass a group to zo_optim_json_apply to use it\n");
    }
    /* engine settings (every quantized group's), validated with state_dtype */
    unsigned mi;
    if (v[V_STATE_MAP_M].set &&
        str_choice(&v[V_STATE_MAP_M], k_map_m_names, ZO_ARRAY_LEN(k_map_m_names), NULL, &mi) == 0)
        c.state_map_m = k_map_m[mi];
    if (v[V_STATE_MAP_V].set &&
        str_choice(&v[V_STATE_MAP_V], k_map_v_names, ZO_ARRAY_LEN(k_map_v_names), NULL, &mi) == 0)
        c.state_map_v = k_map_v[mi];

    if (j->unused)
        REPORT("%s", j->unused);
    if (rep && zo__log_enabled(ZO_LOG_INFO)) {
        /* one log line per report line */
        for (char *p = rep; *p;) {
            char *nl = strchr(p, '\n');
            size_t l = nl ? (size_t)(nl - p) : strlen(p);
            ZO_LOGI("config %.*s", (int)l, p);
            p += l + (nl != NULL);
        }
    }
    free(j->report);
    j->report = rep;
    *cfg = c;
    return 0;
}

ZO_API const char *zo_optim_json_report(const zo_optim_json *j)
{
    return j && j->report ? j->report : "";
}

ZO_API int zo_optim_json_number(const zo_optim_json *j, const char *path, double *out)
{
    if (!j || !path || !out)
        return ZO_FAIL(NULL, -EINVAL, "zo_optim_json_number: NULL argument");
    const cJSON *node = j->root;
    char part[128];
    for (const char *p = path; node;) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        if (l == 0 || l >= sizeof(part))
            return ZO_FAIL(NULL, -EINVAL, "zo_optim_json_number: bad path \"%s\"", path);
        memcpy(part, p, l);
        part[l] = '\0';
        node = cJSON_IsObject(node) ? cJSON_GetObjectItemCaseSensitive(node, part) : NULL;
        if (!dot)
            break;
        p = dot + 1;
    }
    if (!node || (cJSON_IsString(node) && strcmp(node->valuestring, "auto") == 0))
        return -ENOENT;
    if (!cJSON_IsNumber(node))
        return ZO_FAIL(NULL, ZO_ECONFIG, "%s: not a number", path);
    *out = node->valuedouble;
    return 0;
}

#else /* !ZO_HAVE_CJSON */

ZO_API int zo_optim_json_parse(const char *text, size_t len, zo_optim_json **out)
{
    (void)text, (void)len;
    if (out)
        *out = NULL;
    return ZO_FAIL(NULL, ZO_ENOTSUP, "JSON configs need cJSON (libcjson-dev), absent from this build");
}
ZO_API int zo_optim_json_load(const char *path, zo_optim_json **out)
{
    return zo_optim_json_parse(path, 0, out);
}
ZO_API void zo_optim_json_free(zo_optim_json **j)
{
    if (j)
        *j = NULL;
}
ZO_API int zo_optim_json_apply(zo_optim_json *j, zo_optim_config *cfg, zo_optim_group *group)
{
    (void)j, (void)cfg, (void)group;
    return ZO_FAIL(NULL, ZO_ENOTSUP, "JSON configs need cJSON (libcjson-dev), absent from this build");
}
ZO_API const char *zo_optim_json_report(const zo_optim_json *j)
{
    (void)j;
    return "";
}
ZO_API int zo_optim_json_number(const zo_optim_json *j, const char *path, double *out)
{
    (void)j, (void)path, (void)out;
    return ZO_FAIL(NULL, ZO_ENOTSUP, "JSON configs need cJSON (libcjson-dev), absent from this build");
}
#endif
