/* SPDX-License-Identifier: Apache-2.0 */
/* The DeepSpeed-style JSON config of zo_optim: DeepSpeed files accepted as
 * they are, every mapped key lands in the right field, typos are errors
 * that name the closest key, "auto" is resolved and reported, bad values
 * and bad files are clear errors. */
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>

#include "zo_test.h"

#include <zoffload/zoffload.h>

/* A config as DeepSpeed's docs and the Hugging Face integration write them. */
static const char ds_nvme[] = "{\n"
    "  \"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 4, \"steps_per_print\": 2000,\n"
    "  \"wall_clock_breakdown\": false,\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-5, \"betas\": [0.8, 0.95],\n"
    "                \"eps\": 1e-7, \"weight_decay\": 0.1, \"torch_adam\": false}},\n"
    "  \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 100}},\n"
    "  \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12,\n"
    "           \"loss_scale_window\": 500, \"hysteresis\": 3, \"min_loss_scale\": 2},\n"
    "  \"gradient_clipping\": 1.5, \"gradient_accumulation_steps\": 4,\n"
    "  \"zero_optimization\": {\"stage\": 3, \"overlap_comm\": true, \"contiguous_gradients\": true,\n"
    "     \"sub_group_size\": 1e8, \"reduce_bucket_size\": \"auto\",\n"
    "     \"stage3_prefetch_bucket_size\": \"auto\",\n"
    "     \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true},\n"
    "     \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/local_nvme\", \"pin_memory\": true,\n"
    "                           \"buffer_count\": 6, \"fast_init\": false}},\n"
    "  \"aio\": {\"block_size\": 262144, \"queue_depth\": 16, \"intra_op_parallelism\": 2,\n"
    "          \"single_submit\": true, \"overlap_events\": false},\n"
    "  \"zoffload\": {\"dpu\": true, \"dpu_warmup_steps\": 3, \"dpu_double_buffer\": true,\n"
    "               \"clip_mode\": \"speculative\",\n"
    "               \"pinned_bytes\": \"768MiB\", \"state_dtype\": \"bf16\", \"nonfinite\": \"skip\",\n"
    "               \"no_grad\": \"skip\"}\n"
    "}\n";

START_TEST(test_deepspeed_file_maps)
{
    zo_optim_json *j = NULL;
    ck_assert_int_eq(zo_optim_json_parse(ds_nvme, strlen(ds_nvme), &j), 0);
    zo_optim_config c;
    zo_optim_config_default(&c);
    zo_optim_group g;
    zo_optim_group_default(&g);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, &g), 0);
    ck_assert_int_eq(c.hparams.kind, ZO_OPTIM_ADAMW);
    ck_assert(c.hparams.lr == 3e-5 && c.hparams.beta1 == 0.8 && c.hparams.beta2 == 0.95);
    ck_assert(c.hparams.eps == 1e-7 && c.hparams.weight_decay == 0.1);
    ck_assert_int_eq(c.param_dtype, ZO_DTYPE_F16);
    ck_assert(c.loss_scale == 0 && c.initial_scale_power == 12);
    ck_assert_uint_eq(c.loss_scale_window, 500);
    ck_assert_uint_eq(c.hysteresis, 3);
    ck_assert(c.min_loss_scale == 2);
    ck_assert(c.max_grad_norm == 1.5);
    ck_assert_uint_eq(c.grad_accum_steps, 4);
    ck_assert_uint_eq(c.sub_group_size, 100000000u);
    ck_assert_int_eq(c.placement, ZO_OPTIM_PLACE_NVME);
    ck_assert_str_eq(c.nvme_path, "/local_nvme");
    ck_assert_int_eq(c.pin_memory, 1);
    ck_assert_uint_eq(c.buffer_count, 6);
    ck_assert_uint_eq(c.aio_block_size, 262144);
    ck_assert_uint_eq(c.aio_queue_depth, 16);
    ck_assert_uint_eq(c.aio_threads, 2);
    ck_assert_int_eq(c.aio_single_submit, 1);
    ck_assert_int_eq(c.aio_overlap_events, 0);
    ck_assert_int_eq(c.dpu, 1);
    ck_assert_uint_eq(c.dpu_warmup_steps, 3);
    ck_assert_int_eq(c.dpu_double_buffer, 1);
    ck_assert_int_eq(c.clip_mode, ZO_OPTIM_CLIP_SPECULATIVE);
    ck_assert_int_eq(c.nonfinite, ZO_OPTIM_NONFINITE_SKIP);
    ck_assert_int_eq(c.no_grad, ZO_OPTIM_NO_GRAD_SKIP);
    ck_assert_uint_eq(c.pinned_bytes, 768ull << 20);
    ck_assert_int_eq(g.state_dtype, ZO_DTYPE_BF16);
    /* the DeepSpeed keys with no meaning here are accepted and reported */
    const char *rep = zo_optim_json_report(j);
    ck_assert_ptr_nonnull(strstr(rep, "unused: train_batch_size"));
    ck_assert_ptr_nonnull(strstr(rep, "unused: zero_optimization.stage3_prefetch_bucket_size"));
    ck_assert_ptr_nonnull(strstr(rep, "unused: zero_optimization.offload_optimizer.fast_init"));
    double mb = 0;
    ck_assert_int_eq(zo_optim_json_number(j, "train_micro_batch_size_per_gpu", &mb), 0);
    ck_assert(mb == 4);
    ck_assert_int_eq(zo_optim_json_number(j, "zero_optimization.reduce_bucket_size", &mb), -ENOENT); /* auto */
    ck_assert_int_eq(zo_optim_json_number(j, "nope", &mb), -ENOENT);
    ck_assert_int_eq(zo_optim_json_number(j, "optimizer.type", &mb), ZO_ECONFIG);
    zo_optim_json_free(&j);
    ck_assert_ptr_null(j);
    zo_optim_json_free(&j); /* NULL ok */
}
END_TEST

/* Keys a file does not name keep the caller's values; DeepSpeed's "Adam"
 * is AdamW unless adam_w_mode is false; bf16 sets bf16 params. */
START_TEST(test_partial_and_adam_modes)
{
    zo_optim_config c;
    zo_optim_config_default(&c);
    c.max_grad_norm = 7;
    c.grad_accum_steps = 9;
    zo_optim_json *j = NULL;
    const char *t1 = "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.5}}, \"bf16\": {\"enabled\": true}}";
    ck_assert_int_eq(zo_optim_json_parse(t1, strlen(t1), &j), 0);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, NULL), 0);
    ck_assert_int_eq(c.hparams.kind, ZO_OPTIM_ADAMW);
    ck_assert(c.hparams.lr == 0.5);
    ck_assert_int_eq(c.param_dtype, ZO_DTYPE_BF16);
    ck_assert(c.max_grad_norm == 7);
    ck_assert_uint_eq(c.grad_accum_steps, 9);
    zo_optim_json_free(&j);

    const char *t2 = "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false, \"weight_decay\": 0.01}},"
                     " \"fp16\": {\"enabled\": false}, \"bf16\": {\"enabled\": false}}";
    ck_assert_int_eq(zo_optim_json_parse(t2, strlen(t2), &j), 0);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, NULL), 0);
    ck_assert_int_eq(c.hparams.kind, ZO_OPTIM_ADAM);
    ck_assert(c.hparams.weight_decay == 0.01);
    ck_assert_int_eq(c.param_dtype, ZO_DTYPE_F32);
    zo_optim_json_free(&j);

    const char *t3 = "{\"optimizer\": {\"type\": \"Lion\", \"params\": {\"betas\": [0.95, 0.98]}}}";
    ck_assert_int_eq(zo_optim_json_parse(t3, strlen(t3), &j), 0);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, NULL), 0);
    ck_assert_int_eq(c.hparams.kind, ZO_OPTIM_LION);
    ck_assert(c.hparams.beta1 == 0.95 && c.hparams.lr == 1e-4); /* Lion's default lr */
    zo_optim_json_free(&j);
}
END_TEST

/* "state_dtype": "q8" / "q4" (and "state_block") set the group's quantized
 * moments; fp32 / bf16 clear them again. */
START_TEST(test_quantized_states)
{
    zo_optim_config c;
    zo_optim_config_default(&c);
    zo_optim_group g;
    zo_optim_group_default(&g);
    zo_optim_json *j = NULL;
    const char *t1 = "{\"zoffload\": {\"state_dtype\": \"q4\", \"state_block\": 512}}";
    ck_assert_int_eq(zo_optim_json_parse(t1, strlen(t1), &j), 0);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, &g), 0);
    ck_assert_int_eq(g.state_dtype, ZO_DTYPE_F32);
    ck_assert_uint_eq(g.state_bits, 4);
    ck_assert_uint_eq(g.state_block, 512);
    zo_optim_json_free(&j);
    const char *t2 = "{\"zoffload\": {\"state_dtype\": \"q8\"}}";
    ck_assert_int_eq(zo_optim_json_parse(t2, strlen(t2), &j), 0);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, &g), 0);
    ck_assert_uint_eq(g.state_bits, 8);
    zo_optim_json_free(&j);
    const char *t3 = "{\"zoffload\": {\"state_dtype\": \"bf16\"}}";
    ck_assert_int_eq(zo_optim_json_parse(t3, strlen(t3), &j), 0);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, &g), 0);
    ck_assert_int_eq(g.state_dtype, ZO_DTYPE_BF16);
    ck_assert_uint_eq(g.state_bits, 0);
    zo_optim_json_free(&j);
}
END_TEST

/* Parse `text` and apply it to c and g: both must succeed. */
static void apply_ok(const char *text, zo_optim_config *c, zo_optim_group *g)
{
    zo_optim_json *j = NULL;
    ck_assert_msg(zo_optim_json_parse(text, strlen(text), &j) == 0, "%s: %s", text, zo_last_error_detail());
    ck_assert_int_eq(zo_optim_json_apply(j, c, g), 0);
    zo_optim_json_free(&j);
}

/* "state_map_m" / "state_map_v" (any case) set the engine's code maps of
 * the quantized moments; left out, the config keeps its maps. */
START_TEST(test_quantized_state_maps)
{
    static const struct {
        const char *m, *v;
        zo_qmap wm, wv;
    } ok[] = {
        {"dynamic", "dynamic", ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED},
        {"Linear", "LINEAR_NZ", ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_LINEAR_UNSIGNED_NZ},
        {"linear", "linear", ZO_QMAP_LINEAR_SIGNED, ZO_QMAP_LINEAR_UNSIGNED},
        {"DYNAMIC", "dynamic_nz", ZO_QMAP_DYNAMIC_SIGNED, ZO_QMAP_DYNAMIC_UNSIGNED_NZ},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        zo_optim_config c;
        zo_optim_config_default(&c);
        ck_assert_int_eq(c.state_map_m, ZO_QMAP_COUNT);
        ck_assert_int_eq(c.state_map_v, ZO_QMAP_COUNT);
        zo_optim_group g;
        zo_optim_group_default(&g);
        char t[160];
        snprintf(t, sizeof(t), "{\"zoffload\": {\"state_dtype\": \"q4\", \"state_map_m\": \"%s\", \"state_map_v\": \"%s\"}}",
                 ok[i].m, ok[i].v);
        apply_ok(t, &c, &g);
        ck_assert_uint_eq(g.state_bits, 4);
        ck_assert_int_eq(c.state_map_m, ok[i].wm);
        ck_assert_int_eq(c.state_map_v, ok[i].wv);
        /* one key alone sets that map only, and a config without them keeps the maps */
        const char *const more[] = {"{\"zoffload\": {\"state_dtype\": \"q8\", \"state_map_v\": \"linear\"}}",
                                    "{\"zoffload\": {\"state_dtype\": \"q8\"}}"};
        for (int k = 0; k < 2; k++) {
            apply_ok(more[k], &c, &g);
            ck_assert_int_eq(c.state_map_m, ok[i].wm);
            ck_assert_int_eq(c.state_map_v, ZO_QMAP_LINEAR_UNSIGNED);
        }
    }
}
END_TEST

static void expect_bad(const char *text, int code, const char *needle)
{
    zo_optim_json *j = (zo_optim_json *)0x1;
    int rc = zo_optim_json_parse(text, strlen(text), &j);
    ck_assert_msg(rc == code, "%s: got %d (%s), want %d: %s", text, rc, zo_strerror(rc), code, zo_last_error_detail());
    ck_assert_ptr_null(j);
    ck_assert_msg(strstr(zo_last_error_detail(), needle), "%s: detail \"%s\" lacks \"%s\"", text,
                  zo_last_error_detail(), needle);
}

START_TEST(test_typos_name_the_closest_key)
{
    expect_bad("{\"zero_optimization\": {\"offload_optimzer\": {}}}", ZO_ECONFIG,
               "unknown key zero_optimization.offload_optimzer (did you mean offload_optimizer?)");
    expect_bad("{\"gradient_cliping\": 1}", ZO_ECONFIG, "did you mean gradient_clipping?");
    expect_bad("{\"fp16\": {\"enabeld\": true}}", ZO_ECONFIG, "did you mean enabled?");
    expect_bad("{\"aio\": {\"queue_dpeth\": 8}}", ZO_ECONFIG, "did you mean queue_depth?");
    expect_bad("{\"sub_group_size\": 1000}", ZO_ECONFIG, "belongs in zero_optimization.sub_group_size");
    expect_bad("{\"zoffload\": {\"dpu_warmup\": 1}}", ZO_ECONFIG, "did you mean dpu_warmup_steps?");
    expect_bad("{\"completely_unrelated_thing\": 1}", ZO_ECONFIG, "unknown key completely_unrelated_thing");
    /* control bytes in a key or a string value never reach a terminal raw */
    expect_bad("{\"zoffload\": {\"\\u001b]0;pwned\\u0007\\u001b[2J\": 1}}", ZO_ECONFIG,
               "unknown key zoffload.\\x1b]0;pwned\\x07\\x1b[2J");
    ck_assert(!strchr(zo_last_error_detail(), 0x1b) && !strchr(zo_last_error_detail(), 0x07));
    expect_bad("{\"zoffload\": {\"clip_mode\": \"\\u001b[31mred\"}}", ZO_ECONFIG, "\"\\x1b[31mred\" is not one of");
    ck_assert(!strchr(zo_last_error_detail(), 0x1b));
}
END_TEST

START_TEST(test_bad_values)
{
    expect_bad("{\"gradient_clipping\": \"1.0\"}", ZO_ECONFIG, "gradient_clipping: \"1.0\" is not a number");
    expect_bad("{\"gradient_accumulation_steps\": 2.5}", ZO_ECONFIG, "not an integer");
    expect_bad("{\"gradient_accumulation_steps\": 0}", ZO_ECONFIG, "out of range");
    expect_bad("{\"optimizer\": {\"params\": {\"lr\": -1}}}", ZO_ECONFIG, "optimizer.params.lr");
    expect_bad("{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", ZO_ECONFIG, "betas");
    expect_bad("{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}", ZO_ECONFIG, "< 1");
    expect_bad("{\"optimizer\": {\"type\": \"OneBitAdam\"}}", ZO_ENOTSUP, "OneBitAdam");
    expect_bad("{\"optimizer\": {\"type\": \"Adamm\"}}", ZO_ECONFIG, "is not one of AdamW, Adam, Adagrad, Lion");
    expect_bad("{\"optimizer\": {\"params\": {\"amsgrad\": true}}}", ZO_ENOTSUP, "amsgrad");
    expect_bad("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", ZO_ECONFIG, "pick one");
    expect_bad("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"disk\"}}}", ZO_ECONFIG,
               "is not one of cpu, nvme, none");
    expect_bad("{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": 1}}}", ZO_ECONFIG, "out of range");
    expect_bad("{\"zero_optimization\": \"yes\"}", ZO_ECONFIG, "must be an object");
    expect_bad("{\"aio\": {\"thread_count\": 2, \"intra_op_parallelism\": 4}}", ZO_ECONFIG, "also set as");
    expect_bad("{\"aio\": {\"use_gds\": true}}", ZO_ENOTSUP, "GPUDirect");
    expect_bad("{\"zoffload\": {\"pinned_bytes\": \"lots\"}}", ZO_ECONFIG, "not a byte count");
    expect_bad("{\"zoffload\": {\"clip_mode\": \"fast\"}}", ZO_ECONFIG, "two_pass, speculative");
    expect_bad("{\"zoffload\": {\"state_dtype\": \"fp16\"}}", ZO_ECONFIG, "fp32, bf16, q8 or q4");
    expect_bad("{\"zoffload\": {\"state_dtype\": \"q8\", \"state_block\": 384}}", ZO_ECONFIG, "not a power of two");
    expect_bad("{\"zoffload\": {\"state_block\": 256}}", ZO_ECONFIG, "needs state_dtype q8 or q4");
    expect_bad("{\"zoffload\": {\"state_dtype\": \"q8\", \"state_block\": 8192}}", ZO_ECONFIG, "out of range");
    expect_bad("{\"zoffload\": {\"state_dtype\": \"q8\", \"state_map_m\": \"dynamic_nz\"}}", ZO_ECONFIG,
               "zoffload.state_map_m: \"dynamic_nz\" is not one of dynamic, linear");
    expect_bad("{\"zoffload\": {\"state_dtype\": \"q4\", \"state_map_v\": \"signed\"}}", ZO_ECONFIG,
               "zoffload.state_map_v: \"signed\" is not one of dynamic, dynamic_nz, linear, linear_nz");
    expect_bad("{\"zoffload\": {\"state_dtype\": \"q8\", \"state_map_v\": 3}}", ZO_ECONFIG,
               "zoffload.state_map_v: 3 is not");
    expect_bad("{\"zoffload\": {\"state_map_m\": \"linear\"}}", ZO_ECONFIG,
               "zoffload.state_map_m: \"linear\": a code map of quantized states: needs state_dtype q8 or q4");
    expect_bad("{\"zoffload\": {\"state_dtype\": \"bf16\", \"state_map_v\": \"linear\"}}", ZO_ECONFIG,
               "needs state_dtype q8 or q4");
    expect_bad("{\"gradient_clipping\": 1, \"gradient_clipping\": 2}", ZO_ECONFIG, "appears twice");
    /* not JSON, not an object, trailing bytes */
    expect_bad("{\"fp16\": {", ZO_EFORMAT, "not valid JSON");
    expect_bad("[1, 2]", ZO_EFORMAT, "must be a JSON object");
    expect_bad("{} {}", ZO_EFORMAT, "bytes after");
    expect_bad("", ZO_EFORMAT, "not valid JSON");
    zo_optim_json *j;
    ck_assert_int_eq(zo_optim_json_parse(NULL, 0, &j), -EINVAL);
    ck_assert_int_eq(zo_optim_json_parse("{}", 2, NULL), -EINVAL);
}
END_TEST

START_TEST(test_auto_resolved_and_reported)
{
    const char *t = "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"weight_decay\": \"auto\"}},"
                    " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\","
                    " \"fp16\": {\"enabled\": \"auto\"},"
                    " \"zero_optimization\": {\"sub_group_size\": \"auto\", \"offload_optimizer\": "
                    "   {\"device\": \"nvme\", \"nvme_path\": \"/x\", \"buffer_count\": 4}},"
                    " \"aio\": {\"block_size\": \"auto\"}, \"zoffload\": {\"pinned_bytes\": \"auto\"}}";
    zo_optim_json *j = NULL;
    ck_assert_int_eq(zo_optim_json_parse(t, strlen(t), &j), 0);
    zo_optim_config c;
    zo_optim_config_default(&c);
    const zo_dtype before = c.param_dtype;
    ck_assert_int_eq(zo_optim_json_apply(j, &c, NULL), 0);
    ck_assert_int_eq(c.param_dtype, before);
    ck_assert(c.hparams.lr == 1e-3); /* AdamW default */
    /* pinned budget: RAM/8 clamped to [256 MiB, 2 GiB] (or the memlock limit) */
    ck_assert_uint_le(c.pinned_bytes, 2ull << 30);
    ck_assert_uint_gt(c.pinned_bytes, 0);
    /* sub-groups: 4 buffers of 12 B/element inside the pinned budget, whole Mi elements */
    ck_assert_uint_le(c.sub_group_size * 12u * 4u, c.pinned_bytes < (12ull << 22) ? 12ull << 22 : c.pinned_bytes);
    ck_assert_uint_eq(c.sub_group_size % (1u << 20), 0);
    const char *rep = zo_optim_json_report(j);
    ck_assert_ptr_nonnull(strstr(rep, "auto: zoffload.pinned_bytes = "));
    ck_assert_ptr_nonnull(strstr(rep, "auto: zero_optimization.sub_group_size = "));
    ck_assert_ptr_nonnull(strstr(rep, "auto: optimizer.params.lr = 0.001"));
    ck_assert_ptr_nonnull(strstr(rep, "auto: gradient_accumulation_steps = 1"));
    ck_assert_ptr_nonnull(strstr(rep, "auto: aio.block_size"));
    zo_optim_json_free(&j);

    /* NVMe without a path anywhere is refused at apply */
    const char *t2 = "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}";
    ck_assert_int_eq(zo_optim_json_parse(t2, strlen(t2), &j), 0);
    zo_optim_config_default(&c);
    ck_assert_int_eq(zo_optim_json_apply(j, &c, NULL), ZO_ECONFIG);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "nvme_path"));
    c.nvme_path = "/given/by/caller";
    ck_assert_int_eq(zo_optim_json_apply(j, &c, NULL), 0);
    ck_assert_str_eq(c.nvme_path, "/given/by/caller");
    c.struct_size = 3;
    ck_assert_int_eq(zo_optim_json_apply(j, &c, NULL), -EINVAL);
    ck_assert_int_eq(zo_optim_json_apply(NULL, &c, NULL), -EINVAL);
    zo_optim_json_free(&j);
}
END_TEST

START_TEST(test_load_file)
{
    char dir[256], path[300];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/ds.json", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, ds_nvme, strlen(ds_nvme)), (ssize_t)strlen(ds_nvme));
    close(fd);
    zo_optim_json *j = NULL;
    ck_assert_int_eq(zo_optim_json_load(path, &j), 0);
    ck_assert_ptr_nonnull(j);
    zo_optim_json_free(&j);
    /* missing, a directory, a FIFO (must not hang) */
    snprintf(path, sizeof(path), "%s/missing.json", dir);
    ck_assert_int_eq(zo_optim_json_load(path, &j), -ENOENT);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "missing.json"));
    ck_assert_int_eq(zo_optim_json_load(dir, &j), -EINVAL);
    snprintf(path, sizeof(path), "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(zo_optim_json_load(path, &j), -EINVAL);
    ck_assert_ptr_null(j);
    zo_test_rmtree(dir);
}
END_TEST

static Suite *json_suite(void)
{
    Suite *s = suite_create("optim-json");
    TCase *tc = tcase_create("json");
    tcase_add_test(tc, test_deepspeed_file_maps);
    tcase_add_test(tc, test_partial_and_adam_modes);
    tcase_add_test(tc, test_quantized_states);
    tcase_add_test(tc, test_quantized_state_maps);
    tcase_add_test(tc, test_typos_name_the_closest_key);
    tcase_add_test(tc, test_bad_values);
    tcase_add_test(tc, test_auto_resolved_and_reported);
    tcase_add_test(tc, test_load_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    zo_optim_json *probe = NULL;
    if (zo_optim_json_parse("{}", 2, &probe) == ZO_ENOTSUP)
        ZO_TEST_SKIP("this build has no cJSON: JSON configs are not available");
    zo_optim_json_free(&probe);
    return zo_test_run(json_suite());
}
