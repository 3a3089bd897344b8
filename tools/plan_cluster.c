/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-plan --ranks N --nodes M --transformer L,H,A: the plan of a transformer
 * trained on N ranks (one GPU each) over M nodes, every rank offloading only
 * its partition. See plan_cluster.h for the layout, docs/tools/zo-plan.md
 * ("Many ranks") for the model and its check against the ZeRO-Infinity
 * paper's table.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zoffload/zoffload.h>
#include <zoffload/optim.h>

#include "plan_cluster.h"

static double gib(uint64_t b)
{
    return (double)b / (double)(1ull << 30);
}

static double tib(uint64_t b)
{
    return (double)b / (double)(1ull << 40);
}

int plan_xf_parse(const char *s, plan_xf *xf)
{
    char buf[128];
    if (!s || strlen(s) >= sizeof(buf))
        return -1;
    strcpy(buf, s);
    char *save = NULL, *tok[3];
    int n = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == 3)
            return -1;
        tok[n++] = t;
    }
    uint64_t v[3];
    if (n != 3)
        return -1;
    for (int i = 0; i < 3; i++)
        if (zo_parse_size(tok[i], &v[i]) < 0 || v[i] == 0)
            return -1;
    if (v[0] > 100000 || v[1] > (1u << 24) || v[2] > 65536 || v[1] % v[2])
        return -1;
    xf->layers = (unsigned)v[0];
    xf->hidden = v[1];
    xf->heads = (unsigned)v[2];
    return 0;
}

uint64_t plan_xf_params(const plan_xf *xf)
{
    uint64_t H = xf->hidden, F = xf->ffn ? xf->ffn : 4 * H;
    uint64_t kv = xf->kv_heads ? xf->kv_heads : xf->heads;
    uint64_t kvdim = H / xf->heads * kv;
    /* q and o H x H, k and v H x kvdim; the MLP's two (GPT) or three
     * (gated) H x F matrices; two norms */
    uint64_t block = 2 * H * H + 2 * H * kvdim + (xf->gated ? 3 : 2) * H * F + 2 * H;
    return (uint64_t)xf->layers * block + xf->vocab * H;
}

__attribute__((format(printf, 2, 3))) static void say(plan_cluster_out *p, const char *fmt, ...)
{
    if (p->nwhy < 4) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->why[p->nwhy++], sizeof(p->why[0]), fmt, ap);
        va_end(ap);
    }
}

/* One rank's engine for its shard, asked of the library (a device backend:
 * staging, a parameter buffer and pinned windows as on a GPU). */
static int rank_footprint(const plan_cluster_in *in, uint64_t shard, zo_optim_footprint *f)
{
    static char dummy;
    void *devp[1] = {&dummy};
    zo_optim_group grp;
    zo_optim_group_default(&grp);
    grp.ntensors = 1;
    grp.numel = &shard;
    grp.dev_params = devp;
    zo_optim_config cfg;
    zo_optim_config_default(&cfg);
    cfg.param_dtype = in->pdt;
    cfg.grad_dtype = in->gdt;
    cfg.groups = &grp;
    cfg.ngroups = 1;
    cfg.placement = in->nvme ? ZO_OPTIM_PLACE_NVME : ZO_OPTIM_PLACE_HOST;
    cfg.grad_accum_steps = in->accum ? in->accum : 1;
    return zo_optim_estimate(&cfg, ZO_DEV_CUDA, f);
}

int plan_cluster_make(const plan_cluster_in *in, plan_cluster_out *p)
{
    memset(p, 0, sizeof(*p));
    const plan_xf *x = &in->xf;
    unsigned N = in->ranks, G = in->ranks / in->nodes;
    uint64_t H = x->hidden, S = x->seq, A = x->heads, F = x->ffn ? x->ffn : 4 * H;
    size_t pes = zo_dtype_size(in->pdt), ges = zo_dtype_size(in->gdt);
    p->params = plan_xf_params(x);
    /* DeepSpeed's layout: the flat group split into N shards, each a
     * multiple of 2 elements (aligned for half-precision pairs) */
    p->shard = ((p->params + N - 1) / N + 1) / 2 * 2;
    zo_optim_footprint f = {.struct_size = sizeof(f)};
    int r = rank_footprint(in, p->shard, &f);
    if (r < 0) {
        fprintf(stderr, "zo-plan: the engine of a rank's shard: %s\n", zo_last_error_detail());
        return r;
    }
    p->host_rank = f.pinned_bytes + f.host_bytes;
    p->nvme_rank = f.nvme_state_bytes;
    p->host_node = p->host_rank * G;
    p->nvme_node = p->nvme_rank * G;
    /* model states: every rank's param and grad shard on its GPU, every
     * rank's engine on host and NVMe */
    p->model_states = (uint64_t)N * (p->shard * (pes + ges) + p->host_rank + p->nvme_rank);
    /* activations, the paper's model (fp16/bf16, 2 bytes): per block and
     * sample 16 H + 2 A S values per token; checkpoints one H per token
     * every ckpt_every blocks */
    uint64_t bn = x->micro_batch * G;
    uint64_t per_tok = 16 * H + 2 * A * S;
    p->act_node = 2 * bn * S * x->layers * per_tok;
    p->act_ckpt_node = 2 * bn * S * H * ((x->layers + x->ckpt_every - 1) / x->ckpt_every);
    /* working memory: the largest operator's params and grads whole (the
     * MLP's H x F, or the embedding), and one checkpoint interval's
     * activations of the GPU's micro-batch */
    uint64_t big = H * F > x->vocab * H ? H * F : x->vocab * H;
    p->wm_state_gpu = big * (pes + ges);
    p->wm_act_gpu = 2 * x->micro_batch * S * x->ckpt_every * per_tok;
    p->gpu_rank = p->shard * (pes + ges) + p->wm_state_gpu + p->wm_act_gpu + p->act_ckpt_node / G;

    p->fits = 1;
    if (in->gpu_mem && p->gpu_rank > in->gpu_mem) {
        p->fits = 0;
        say(p, "GPU: a rank needs %.1f GiB (shard %.1f, working memory %.1f + %.1f, checkpoints %.1f), has %.1f GiB: "
               "more ranks, a smaller micro-batch, checkpoints more often",
            gib(p->gpu_rank), gib(p->shard * (pes + ges)), gib(p->wm_state_gpu), gib(p->wm_act_gpu),
            gib(p->act_ckpt_node / G), gib(in->gpu_mem));
    }
    if (in->cpu_mem && p->host_node > in->cpu_mem) {
        p->fits = 0;
        say(p, "CPU memory: a node's %u ranks need %.1f GiB, it has %.1f GiB: %s", G, gib(p->host_node),
            gib(in->cpu_mem), in->nvme ? "more nodes" : "NVMe placement (--offload nvme) or more nodes");
    }
    if (in->nvme && in->nvme_bytes && p->nvme_node > in->nvme_bytes) {
        p->fits = 0;
        say(p, "NVMe: a node's %u ranks need %.1f GiB, it has %.1f GiB: more nodes", G, gib(p->nvme_node),
            gib(in->nvme_bytes));
    }

    /* the step: forward, backward and the recomputation of checkpointed
     * activations (8 flop per parameter and token); parameters gathered
     * for forward and backward and gradients reduce-scattered every
     * micro-step (ring: (N-1)/N of the bytes through each GPU's link); the
     * rank's gradients down and parameters up over PCIe; the node's CPUs
     * update its ranks' shards while NVMe reads and writes them */
    double acc = in->accum ? in->accum : 1;
    double tokens = (double)x->micro_batch * (double)S * acc;
    p->compute = in->gpu_flops > 0 ? 8.0 * (double)p->params * tokens / in->gpu_flops : 0;
    p->comm = N > 1 && in->net_bw > 0 ? acc * (double)(2 * pes + ges) * (double)p->params * (N - 1) / N / in->net_bw
                                      : 0;
    p->pcie = in->pcie_bw > 0 ? ((double)ges * acc + (double)pes) * (double)p->shard / in->pcie_bw : 0;
    p->optim = in->adam_rate > 0 ? (double)p->shard * G / in->adam_rate : 0;
    p->nvme_io = in->nvme && in->nvme_bw > 0 ? 2.0 * (double)p->nvme_node / in->nvme_bw : 0;
    p->step = fmax(p->compute, p->comm) + p->pcie + fmax(p->optim, p->nvme_io);
    return 0;
}

void plan_cluster_print(const plan_cluster_in *in, const plan_cluster_out *p)
{
    const plan_xf *x = &in->xf;
    unsigned G = in->ranks / in->nodes;
    printf("model: %" PRIu64 " parameters (%.2f %s); %u layers, hidden %" PRIu64 ", %u heads, MLP %" PRIu64
           "%s, vocab %" PRIu64 "; seq %" PRIu64 ", micro-batch %" PRIu64 " per GPU, checkpoint every %u\n",
           p->params, p->params >= 1e12 ? p->params / 1e12 : p->params / 1e9, p->params >= 1e12 ? "T" : "B", x->layers, x->hidden, x->heads, x->ffn ? x->ffn : 4 * x->hidden,
           x->gated ? " gated" : "", x->vocab, x->seq, x->micro_batch, x->ckpt_every);
    printf("cluster: %u ranks on %u nodes (%u per node); params %s, grads %s; %s placement; each rank %" PRIu64
           " elements\n\n", in->ranks, in->nodes, G, zo_dtype_name(in->pdt), zo_dtype_name(in->gdt),
           in->nvme ? "NVMe" : "host", p->shard);
    printf("  model states, whole model      %10.2f TiB\n", tib(p->model_states));
    printf("  activations per node           %10.2f TiB (no checkpointing)\n", tib(p->act_node));
    printf("  activation checkpoints / node  %10.2f TiB\n", tib(p->act_ckpt_node));
    printf("  working memory per GPU         %10.2f GiB model states, %.2f GiB activations\n", gib(p->wm_state_gpu),
           gib(p->wm_act_gpu));
    printf("  per rank: GPU %.1f GiB%s, host %.1f GiB, NVMe %.1f GiB\n", gib(p->gpu_rank),
           in->gpu_mem ? (p->gpu_rank <= in->gpu_mem ? " (fits)" : " (DOES NOT FIT)") : "", gib(p->host_rank),
           gib(p->nvme_rank));
    printf("  per node: host %.1f GiB%s, NVMe %.1f GiB%s\n", gib(p->host_node),
           in->cpu_mem ? (p->host_node <= in->cpu_mem ? " (fits)" : " (DOES NOT FIT)") : "", gib(p->nvme_node),
           in->nvme && in->nvme_bytes ? (p->nvme_node <= in->nvme_bytes ? " (fits)" : " (DOES NOT FIT)") : "");
    printf("predicted step: %.2f s = max(compute %.2f, collectives %.2f) + PCIe %.2f + max(optimizer %.2f, NVMe "
           "%.2f)\n", p->step, p->compute, p->comm, p->pcie, p->optim, p->nvme_io);
    for (int i = 0; i < p->nwhy; i++)
        printf("does not fit: %s\n", p->why[i]);
    if (p->fits)
        printf("fits.\n");
}

void plan_cluster_json(zo_json *j, const plan_cluster_in *in, const plan_cluster_out *p)
{
    const plan_xf *x = &in->xf;
    zj_obj_begin(j, NULL);
    zj_obj_begin(j, "model");
    zj_uint(j, "params", p->params);
    zj_uint(j, "layers", x->layers);
    zj_uint(j, "hidden", x->hidden);
    zj_uint(j, "heads", x->heads);
    zj_uint(j, "kv_heads", x->kv_heads ? x->kv_heads : x->heads);
    zj_uint(j, "ffn", x->ffn ? x->ffn : 4 * x->hidden);
    zj_bool(j, "gated", x->gated);
    zj_uint(j, "vocab", x->vocab);
    zj_uint(j, "seq", x->seq);
    zj_uint(j, "micro_batch", x->micro_batch);
    zj_uint(j, "ckpt_every", x->ckpt_every);
    zj_obj_end(j);
    zj_obj_begin(j, "cluster");
    zj_uint(j, "ranks", in->ranks);
    zj_uint(j, "nodes", in->nodes);
    zj_str(j, "offload", in->nvme ? "nvme" : "host");
    zj_uint(j, "shard", p->shard);
    zj_obj_end(j);
    zj_obj_begin(j, "bytes");
    zj_uint(j, "model_states", p->model_states);
    zj_uint(j, "activations_per_node", p->act_node);
    zj_uint(j, "activation_checkpoints_per_node", p->act_ckpt_node);
    zj_uint(j, "working_memory_states_per_gpu", p->wm_state_gpu);
    zj_uint(j, "working_memory_activations_per_gpu", p->wm_act_gpu);
    zj_uint(j, "gpu_per_rank", p->gpu_rank);
    zj_uint(j, "host_per_rank", p->host_rank);
    zj_uint(j, "nvme_per_rank", p->nvme_rank);
    zj_uint(j, "host_per_node", p->host_node);
    zj_uint(j, "nvme_per_node", p->nvme_node);
    zj_obj_end(j);
    zj_obj_begin(j, "predicted");
    zj_num(j, "step_s", p->step);
    zj_num(j, "compute_s", p->compute);
    zj_num(j, "collectives_s", p->comm);
    zj_num(j, "pcie_s", p->pcie);
    zj_num(j, "optim_s", p->optim);
    zj_num(j, "nvme_s", p->nvme_io);
    zj_obj_end(j);
    zj_bool(j, "fits", p->fits);
    zj_arr_begin(j, "advice");
    for (int i = 0; i < p->nwhy; i++)
        zj_str(j, NULL, p->why[i]);
    zj_arr_end(j);
    zj_obj_end(j);
    zj_end(j);
}

/* ---- the command line (zo-plan --ranks ...) -------------------------------------- */

#define PROG "zo-plan"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zo-plan --ranks N [--nodes M] --transformer L,H,A [options] [--json]\n"
            "A transformer on N ranks (one GPU each) over M nodes, each rank offloading its partition.\n"
            "model:   --transformer L,H,A layers, hidden, heads   --seq N (1024)   --micro-batch N per GPU (2)\n"
            "         --vocab N (51200)   --ffn N (4H)   --gated (3 MLP matrices)   --kv-heads N   --ckpt-every N (1)\n"
            "engine:  --offload host|nvme (host)   --param-dtype bf16|f32   --grad bf16|f32   --accum N (1)\n"
            "per GPU: --gpu-mem B   --gpu-flops F (achieved)   --pcie-bw B/s   --net-bw B/s (collectives)\n"
            "per node: --cpu-mem B   --nvme-size B   --nvme-bw B/s   --adam-rate params/s\n"
            "Sizes take K M G T suffixes and 1e9. A figure not given is not checked (or its time is 0).\n");
}

static int set_count(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    uint64_t v;
    if (zo_parse_size(arg, &v) < 0 || v < d->lo || v > d->hi)
        return zo_tool_bad(cli->prog, "--%s %s: expected a count in %llu..%llu", d->name, arg, d->lo, d->hi);
    if (d->hi <= UINT32_MAX)
        *(unsigned *)d->dst = (unsigned)v;
    else
        *(uint64_t *)d->dst = v;
    return 0;
}

static int set_rate(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v > 0) || !isfinite(v))
        return zo_tool_bad(cli->prog, "--%s %s: expected a positive number (1e9, 2.5e12)", d->name, arg);
    *(double *)d->dst = v;
    return 0;
}

static int set_xf(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (plan_xf_parse(arg, d->dst) < 0)
        return zo_tool_bad(cli->prog, "--transformer %s: expected LAYERS,HIDDEN,HEADS (80,10K,128), hidden a "
                                      "multiple of heads", arg);
    return 0;
}

static int set_offload(const zo_tool_cli *cli, const zo_tool_opt *d, const char *arg)
{
    if (strcmp(arg, "host") && strcmp(arg, "cpu") && strcmp(arg, "nvme"))
        return zo_tool_bad(cli->prog, "--offload %s: expected host or nvme", arg);
    *(int *)d->dst = !strcmp(arg, "nvme");
    return 0;
}

int plan_cluster_main(int argc, char **argv)
{
    plan_cluster_in in;
    memset(&in, 0, sizeof(in));
    in.nodes = 1;
    in.xf.seq = 1024;
    in.xf.micro_batch = 2;
    in.xf.vocab = 51200; /* GPT-2's 50257 padded, as in the ZeRO-Infinity paper */
    in.xf.ckpt_every = 1;
    in.pdt = in.gdt = ZO_DTYPE_BF16;
    in.accum = 1;
    int json = 0, have_xf = 0;
    in.xf.layers = 0;
    const zo_tool_opt table[] = {
        {"ranks", 1, 0, set_count, &in.ranks, 1, 1u << 20, NULL},
        {"nodes", 1, 0, set_count, &in.nodes, 1, 1u << 20, NULL},
        {"transformer", 1, 0, set_xf, &in.xf, 0, 0, NULL},
        {"seq", 1, 0, set_count, &in.xf.seq, 1, 1ull << 40, NULL},
        {"micro-batch", 1, 0, set_count, &in.xf.micro_batch, 1, 1ull << 40, NULL},
        {"vocab", 1, 0, set_count, &in.xf.vocab, 1, 1ull << 40, NULL},
        {"ffn", 1, 0, set_count, &in.xf.ffn, 1, 1ull << 40, NULL},
        {"gated", 0, 0, zo_tool_opt_on, &in.xf.gated, 0, 0, NULL},
        {"kv-heads", 1, 0, set_count, &in.xf.kv_heads, 1, 65536, NULL},
        {"ckpt-every", 1, 0, set_count, &in.xf.ckpt_every, 1, 100000, NULL},
        {"offload", 1, 0, set_offload, &in.nvme, 0, 0, NULL},
        {"param-dtype", 1, 0, zo_tool_opt_f32_bf16, &in.pdt, 0, 0, NULL},
        {"grad", 1, 0, zo_tool_opt_f32_bf16, &in.gdt, 0, 0, NULL},
        {"accum", 1, 0, set_count, &in.accum, 1, 1u << 20, NULL},
        {"gpu-mem", 1, 0, set_count, &in.gpu_mem, 1, 1ull << 60, NULL},
        {"gpu-flops", 1, 0, set_rate, &in.gpu_flops, 0, 0, NULL},
        {"pcie-bw", 1, 0, set_rate, &in.pcie_bw, 0, 0, NULL},
        {"net-bw", 1, 0, set_rate, &in.net_bw, 0, 0, NULL},
        {"cpu-mem", 1, 0, set_count, &in.cpu_mem, 1, 1ull << 60, NULL},
        {"nvme-size", 1, 0, set_count, &in.nvme_bytes, 1, 1ull << 60, NULL},
        {"nvme-bw", 1, 0, set_rate, &in.nvme_bw, 0, 0, NULL},
        {"adam-rate", 1, 0, set_rate, &in.adam_rate, 0, 0, NULL},
        {"json", 0, 0, zo_tool_opt_on, &json, 0, 0, NULL},
        {"help", 0, 'h', zo_tool_opt_help, NULL, 0, 0, NULL},
    };
    const zo_tool_cli cli = {PROG, usage, table, sizeof(table) / sizeof(table[0])};
    int r = zo_tool_opts_parse_strict(&cli, argc, argv);
    if (r)
        return r;
    have_xf = in.xf.layers != 0;
    if (!in.ranks || !have_xf)
        return zo_tool_bad(PROG, "a plan for many ranks needs --ranks N and --transformer L,H,A");
    if (in.ranks % in.nodes)
        return zo_tool_bad(PROG, "--ranks %u on --nodes %u: every node has the same number of ranks", in.ranks,
                           in.nodes);
    if (in.xf.kv_heads && in.xf.heads % in.xf.kv_heads)
        return zo_tool_bad(PROG, "--kv-heads %u must divide the %u heads", in.xf.kv_heads, in.xf.heads);
    plan_cluster_out out;
    if ((r = plan_cluster_make(&in, &out)) < 0)
        return 2;
    if (json) {
        zo_json j;
        zj_init(&j, stdout, 0);
        plan_cluster_json(&j, &in, &out);
    } else {
        plan_cluster_print(&in, &out);
    }
    return out.fits ? 0 : 3;
}

int plan_cluster_wanted(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strncmp(argv[i], "--ranks", 7) || !strncmp(argv[i], "--transformer", 13))
            return 1;
    return 0;
}
