/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-plan past one machine: a transformer's memory and step on N ranks over
 * M nodes, each rank offloading only its partition (ZeRO stage 3 layout:
 * every flat group split into N aligned shards; a rank's engine holds the
 * masters and optimizer states of its shard on host or NVMe, its GPU holds
 * its shard of the fp16/bf16 params and grads plus the working memory of
 * the layer being computed). The engine's bytes per rank are the library's
 * (zo_optim_estimate() for a shard); the activation figures follow the
 * ZeRO-Infinity paper's model (Rajbhandari et al., SC'21, section 3), so
 * that its table can be checked, and say so.
 */
#ifndef ZO_PLAN_CLUSTER_H
#define ZO_PLAN_CLUSTER_H

#include <stdint.h>

#include <zoffload/common.h>

#include "tool_common.h"

typedef struct plan_xf {
    unsigned layers;      /* transformer blocks */
    uint64_t hidden;      /* H */
    unsigned heads;       /* attention heads */
    unsigned kv_heads;    /* 0: heads (no grouped-query attention) */
    uint64_t ffn;         /* MLP width; 0: 4H */
    int gated;            /* 1: three MLP matrices (SwiGLU, Llama), else two (GPT) */
    uint64_t vocab;       /* embedding rows (counted once: tied) */
    uint64_t seq;         /* tokens per sample */
    uint64_t micro_batch; /* samples per GPU per micro-step */
    unsigned ckpt_every;  /* blocks between activation checkpoints (ci) */
} plan_xf;

typedef struct plan_cluster_in {
    plan_xf xf;
    unsigned ranks, nodes;    /* ranks (one GPU each), nodes; ranks % nodes == 0 */
    /* per GPU */
    uint64_t gpu_mem;
    double gpu_flops;         /* achieved, flop/s */
    double pcie_bw;           /* host <-> GPU, bytes/s */
    double net_bw;            /* GPU <-> GPU across the ranks (ring), bytes/s */
    /* per node */
    uint64_t cpu_mem, nvme_bytes;
    double nvme_bw;           /* read or write, bytes/s */
    double adam_rate;         /* CPU optimizer, params/s for the node's CPUs */
    /* engine */
    zo_dtype pdt, gdt;
    int nvme;                 /* placement: masters and states on NVMe */
    unsigned accum;
} plan_cluster_in;

typedef struct plan_cluster_out {
    uint64_t params;          /* whole model */
    uint64_t shard;           /* elements a rank owns */
    /* the paper's columns */
    uint64_t model_states;    /* whole model: device params + grads, every rank's engine (host + NVMe) */
    uint64_t act_node;        /* activations of a node's micro-batches, no checkpointing */
    uint64_t act_ckpt_node;   /* activation checkpoints of a node */
    uint64_t wm_state_gpu;    /* working memory per GPU: the largest operator's params + grads */
    uint64_t wm_act_gpu;      /* working memory per GPU: one checkpoint interval's activations */
    /* per rank and per node */
    uint64_t gpu_rank;        /* param + grad shard + working memory + the rank's checkpoints */
    uint64_t host_rank;       /* the engine's pinned + pageable bytes for the shard */
    uint64_t nvme_rank;       /* the engine's NVMe bytes for the shard */
    uint64_t host_node, nvme_node;
    /* predicted step, seconds */
    double compute, comm, pcie, optim, nvme_io, step;
    int fits;
    char why[4][200];
    int nwhy;
} plan_cluster_out;

/* Parse "L,H,A" (layers, hidden, heads; sizes accept K/M suffixes and 1e3).
 * 0, or -1 (the caller says what is wrong). */
int plan_xf_parse(const char *s, plan_xf *xf);

/* Elements of the model: blocks (attention with kv_heads, MLP) plus the
 * embedding and the two norms per block. */
uint64_t plan_xf_params(const plan_xf *xf);

/* The plan. 0, or a negative code with the reason printed to stderr (an
 * engine configuration zo_optim_estimate() refuses). */
int plan_cluster_make(const plan_cluster_in *in, plan_cluster_out *out);

void plan_cluster_print(const plan_cluster_in *in, const plan_cluster_out *out);
void plan_cluster_json(zo_json *j, const plan_cluster_in *in, const plan_cluster_out *out);

/* zo-plan's many-rank mode: its own options (see usage()), the plan printed
 * or as JSON. Exit status: 0 fits, 3 does not fit, 2 bad usage. */
int plan_cluster_main(int argc, char **argv);

/* Whether argv asks for the many-rank mode (--ranks or --transformer
 * before any "--"). */
int plan_cluster_wanted(int argc, char **argv);

#endif
