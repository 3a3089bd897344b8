/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file optim.h
 * @brief The offload optimizer engine (ZeRO-Offload / ZeRO-Infinity step):
 *        the object a training framework drives once per step.
 *
 * Ownership
 *   The framework owns the device parameters (bf16, fp16 or fp32) and the
 *   device gradients. The engine owns everything else: the fp32 master
 *   parameters and optimizer states (in a ::zo_store, homed in pinned host
 *   memory or on NVMe), the gradient window (fp32 accumulators; bf16/fp16
 *   gradients as they are when grad_accum_steps is 1), pinned staging for
 *   device -> host gradient copies, the low-precision parameter buffers it
 *   copies back to the device, its device streams, and a worker thread.
 *
 * Layout
 *   Tensors are declared in parameter groups (::zo_optim_group); every
 *   group has its own hyperparameters and placement. A group's tensors are
 *   laid end to end in one flat element space, cut into sub-groups of
 *   `sub_group_size` elements: many small tensors share one sub-group, a
 *   large one is cut across several. A sub-group is the unit of the step:
 *   its master, m and v are three store tensors walked together. Tensors are
 *   named by a global index: group 0's tensors first, in declaration order,
 *   then group 1's, and so on (zo_optim_tensor_index() finds one by name).
 *
 * One step (see docs/optim.md for a complete training loop)
 *   1. During backward the framework hands each gradient over as it is
 *      produced: zo_optim_grad() takes a device pointer and the event after
 *      which it is valid; the engine copies it device -> pinned host on its
 *      own stream while backward goes on, and adds it into an fp32
 *      accumulator (the first arrival of an accumulation window overwrites).
 *   2. zo_optim_step() (or zo_optim_step_async() + zo_optim_wait()) at the
 *      end of every micro-step. Only every `grad_accum_steps`-th call
 *      updates (the accumulation boundary); the others just wait for the
 *      gradients to land. K micro-steps give the update one step on the
 *      summed gradient gives.
 *   3. At a boundary: gradient statistics (sum of squares, inf/NaN count),
 *      then one fused pass per element: unscale (1 / loss scale), clip
 *      coefficient, the optimizer, and the cast to the device dtype into the
 *      engine's parameter buffer; each sub-group's new parameters are queued
 *      host -> device as soon as the sub-group is done.
 *
 * Clipping and overflow (::zo_optim_clip_mode)
 *   - ZO_OPTIM_CLIP_TWO_PASS (the default): the global norm and the overflow
 *     flag come first (a read-only pass over the gradient window), then
 *     the fused update. Exact, works for every optimizer and state dtype,
 *     and never has to undo anything: it is the default because its result
 *     is bit-identical to a plain run of the cpuadam kernels.
 *   - ZO_OPTIM_CLIP_SPECULATIVE (SuperOffload): each sub-group is checked
 *     and updated at once with clip coefficient 1, without a separate norm
 *     pass over all gradients first (the statistics of a sub-group are
 *     taken just before its update, while its gradients are in cache);
 *     when the norm turns out to exceed `max_grad_norm`, or an overflow is
 *     found, the sub-groups already updated are rolled back with
 *     zo_cpuadam_rollback() and the step is redone with the clip
 *     coefficient (or skipped). Identical to two-pass, bit for bit, when
 *     nothing is clipped and nothing overflows. After a rollback the states
 *     are within the rollback's rounding bounds (cpuadam.h): m and v within
 *     a few ulps of max(state, (1-beta) g) / beta, and a master may move by
 *     up to about one update (lr) where v came back with a large relative
 *     error (tiny gradients in early steps). Adam / AdamW with fp32 states
 *     only (ZO_ECONFIG otherwise). Without DPU the update starts while
 *     backward still runs: the last micro-step's first gradient starts the
 *     job, and the worker walks the sub-groups in backward's order (reverse
 *     index order at first, then the order the previous window completed
 *     them in), updating each as soon as every tensor in it has its gradient;
 *     the step call closes the window (the rest, with zeros for tensors
 *     that got none, follow). Hyperparameter changes must therefore come
 *     before the last micro-step's backward, and a tensor's gradient must be
 *     handed over once in the last micro-step (a second: ZO_ESTATE). With
 *     DPU the speculative update starts at the step call.
 *   Clip coefficient (DeepSpeed's): with norm = sqrt(sumsq) / loss_scale,
 *   coef = max_grad_norm / (norm + 1e-6) when that is below 1, else 1.
 *
 * Non-finite gradients
 *   fp16 with dynamic loss scaling: the step is skipped (masters, states
 *   and step count untouched), counted, and the scale lowered, exactly as
 *   DeepSpeed's DynamicLossScaler. bf16 / fp32 (and fp16 with a static
 *   scale): `nonfinite` decides: ZO_OPTIM_NONFINITE_ERROR (default) fails
 *   the step with ZO_ENONFINITE, ZO_OPTIM_NONFINITE_SKIP skips and counts
 *   it. Either way the accumulated gradients are discarded and no inf/NaN
 *   ever reaches the masters.
 *
 * Tensors without a gradient (::zo_optim_no_grad)
 *   A tensor that got no gradient in an accumulation window (none was
 *   handed over since the last boundary: a frozen parameter, a branch the
 *   forward did not take) is, at the boundary:
 *   - ZO_OPTIM_NO_GRAD_ZERO (the default, DeepSpeed's offload): updated with
 *     a zero gradient: its states decay, weight decay applies, and every
 *     tensor counts the engine's one step count;
 *   - ZO_OPTIM_NO_GRAD_SKIP (torch.optim's rule): left alone: master, states
 *     and device params untouched, and not counted: each tensor has its own
 *     update count (zo_optim_tensor_step()), which Adam's bias correction
 *     uses, as torch keeps `step` per parameter. It takes no part in the
 *     global norm (its gradient is zero there either way).
 *   The engine's count (zo_optim_step_result.step, zo_optim_info.step)
 *   counts the boundaries applied in both modes.
 *
 * Delayed parameter update (DPU, ZeRO-Offload paper)
 *   With `dpu` set, zo_optim_step_async() at a boundary returns once the
 *   update is queued; the CPU applies the gradients of step N while the
 *   device runs forward/backward of step N+1. The new parameters of step N
 *   are copied to the device at the next step call (after the framework's
 *   backward of N+1 has finished with the old ones) or at zo_optim_wait().
 *   The first `dpu_warmup_steps` (K) boundaries run without delay:
 *   zo_optim_step_async() blocks until their update reached the device. Which
 *   parameters the forward of step k (1-based, counting boundaries) sees:
 *     k <= K + 1:  the result of step k - 1 (the initial params for k = 1)
 *     k >= K + 2:  the result of step k - 2.
 *   Gradients of step k are always applied to the masters of step k - 1.
 *
 *   Double-buffered device params (`dpu_double_buffer`): the same schedule,
 *   without the copy at the step call. Every tensor with dev_params has two
 *   device buffers: the framework's (dev_params) and one the engine
 *   allocates with zo_dev_malloc(). The update of step k writes the buffer
 *   the device is not reading, piece by piece as its sub-groups finish (on
 *   the host backend the fused kernel writes it directly; on a GPU the
 *   pieces are copied host -> device on the engine's stream, after the
 *   window's gradient events, so after the backward that read that buffer).
 *   The step call that collects the update (the next boundary's
 *   zo_optim_step_async(), zo_optim_wait(), or the warm-up boundary's own
 *   call) makes that buffer current; zo_optim_param_device() then returns
 *   each tensor's pointer for the next forward and an event to wait on.
 *   A framework re-reads the pointers after every step call at a boundary
 *   (and after zo_optim_wait()); the other buffer must not be read from
 *   then on: the next update writes it.
 *
 * Failures during an update
 *   A full disk under NVMe placement fails zo_optim_create(), never a step:
 *   the states' disk space is allocated and reserved (fallocate) when create
 *   registers them, and a step only overwrites it, so a disk that fills up
 *   later costs the steps nothing (checkpoints, which are new files, fail
 *   atomically). On a filesystem that cannot reserve (no fallocate; the
 *   swap store logs a warning) or that copies on write, and for any I/O
 *   error, a step that fails while states are being written (surfacing
 *   from the store's sweep) leaves the masters neither all before nor all
 *   after the step: the
 *   sub-groups before the failure hold the new values, the failing piece is
 *   undefined, the rest hold the old ones (making it all-before would need
 *   a second copy of the states on disk). The engine then refuses steps,
 *   gradients, saves, exports, imports, pushes and parameter buffers with
 *   ZO_ESTATE until zo_optim_load() restores a checkpoint (or
 *   zo_optim_init_from_device() starts over); a load or init that fails
 *   midway leaves it refusing the same way. A
 *   failure before any state is written (a gradient copy) drops the
 *   window's gradients and changes nothing.
 *
 * Multi-rank
 *   A rank declares only the tensors (or tensor slices) whose state it owns.
 *   zo_optim_grad_norm_partial() gives this rank's partial sum of squares
 *   and inf/NaN count; the caller combines them across ranks (all-reduce)
 *   and passes the totals in ::zo_optim_step_opts. part.h (::zo_part) does
 *   this for a data-parallel job: DeepSpeed's partition layout, bucketed
 *   reduce-scatter, the all-gather of the updated params.
 *
 * Blocking and threads: a zo_optim is driven from one thread at a time
 * (calls on one engine are serialized by the caller), except
 * zo_optim_poll(), zo_optim_eventfd() and zo_optim_params_current(), which
 * any thread may call at any time. No call ever calls back into the caller.
 */
#ifndef ZOFFLOAD_OPTIM_H
#define ZOFFLOAD_OPTIM_H

#include "common.h"
#include "cpuadam.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zo_dev;
struct zo_event;
struct zo_swap;

typedef struct zo_optim zo_optim;

/** Where a group's fp32 masters and optimizer states live. */
typedef enum zo_optim_placement {
    ZO_OPTIM_PLACE_DEFAULT = -1, /**< in a group: the config's placement */
    ZO_OPTIM_PLACE_HOST = 0,     /**< pinned host memory ("cpu" in DeepSpeed) */
    ZO_OPTIM_PLACE_NVME = 1,     /**< the swap store on NVMe ("nvme") */
} zo_optim_placement;

/** How the global norm and overflow are combined with the update (see the file comment). */
typedef enum zo_optim_clip_mode {
    ZO_OPTIM_CLIP_TWO_PASS = 0,    /**< norm first, then the fused update (default) */
    ZO_OPTIM_CLIP_SPECULATIVE = 1, /**< update at once, roll back what clipping or overflow invalidates */
} zo_optim_clip_mode;

/** What a boundary with inf/NaN gradients does when no dynamic loss scaler owns the case. */
typedef enum zo_optim_nonfinite {
    ZO_OPTIM_NONFINITE_ERROR = 0, /**< the step fails with ZO_ENONFINITE, nothing updated (default) */
    ZO_OPTIM_NONFINITE_SKIP = 1,  /**< the step is skipped and counted, nothing updated */
} zo_optim_nonfinite;

/** What a boundary does with a tensor that got no gradient in its window (see the file comment). */
typedef enum zo_optim_no_grad {
    ZO_OPTIM_NO_GRAD_ZERO = 0, /**< updated with a zero gradient, one step count for all (DeepSpeed; default) */
    ZO_OPTIM_NO_GRAD_SKIP = 1, /**< skipped: untouched, and a step count per tensor (torch.optim) */
} zo_optim_no_grad;

/** The per-tensor optimizer states, for export / import. */
typedef enum zo_optim_state {
    ZO_OPTIM_STATE_MASTER = 0,     /**< fp32 master parameters */
    ZO_OPTIM_STATE_EXP_AVG = 1,    /**< m (Adam/AdamW/Lion first moment) */
    ZO_OPTIM_STATE_EXP_AVG_SQ = 2, /**< v (Adam/AdamW second moment, Adagrad state sum) */
    ZO_OPTIM_STATE_COUNT
} zo_optim_state;

/**
 * One parameter group. Fill with zo_optim_group_default(), then set the
 * tensors. The arrays are read during zo_optim_create() only (names are
 * copied); the device pointers are remembered (see dev_params).
 */
typedef struct zo_optim_group {
    size_t struct_size;          /**< sizeof(zo_optim_group), set by the defaults function */
    unsigned ntensors;           /**< tensors in the group, >= 1 */
    const uint64_t *numel;       /**< [ntensors] element counts, each >= 1 */
    const char *const *names;    /**< [ntensors] unique names (1..200 bytes, no '/'), or NULL: "g<group>.t<i>" */
    void *const *dev_params;     /**< [ntensors] device parameters (param_dtype, zo_dev_malloc() memory of
                                      the config's device; on the host backend any host memory will do,
                                      plain malloc() or a framework's tensors: it copies with memcpy and
                                      the fused kernel writes them in place), or NULL: the engine never
                                      touches device params; the framework copies from
                                      zo_optim_param_buffer() itself. Not owned: valid, at the same
                                      address, until zo_optim_destroy() */
    const zo_cpuadam_hparams *hparams; /**< NULL: the config's `hparams`. step, grad_scale and clip_coef are
                                          the engine's: leave them at zo_cpuadam_hparams_default()'s 1
                                          (anything else is ZO_ECONFIG) */
    zo_optim_placement placement; /**< default ZO_OPTIM_PLACE_DEFAULT (the config's) */
    uint64_t sub_group_size;     /**< elements per sub-group; 0 (default): the config's */
    zo_dtype state_dtype;        /**< m and v: ZO_DTYPE_F32 (default) or ZO_DTYPE_BF16; with state_bits,
                                      ZO_DTYPE_F32 (the moments are computed in fp32 and stored quantized) */
    /* in what was the struct's tail padding: sizeof is unchanged */
    uint16_t state_bits;         /**< 0 (default): m and v in state_dtype; 8 (q8) or 4 (q4): block-wise
                                      quantized moments (zo_cpuadam_qstep(): codes + one fp32 absmax per
                                      block; dynamic maps, q4's v the dynamic map without its zero:
                                      docs/optim.md), AdamW, Adam or Lion, two-pass clipping and
                                      ZO_OPTIM_NO_GRAD_ZERO only (see docs/optim-integration.md) */
    uint16_t state_block;        /**< with state_bits: elements per absmax scale, a power of two in [64, 4096];
                                      0 (default): 256 for q8, 128 for q4 */
} zo_optim_group;

/** Fill *g: no tensors, the config's hparams / placement / sub_group_size, fp32 states. NULL ignored. */
ZO_API void zo_optim_group_default(zo_optim_group *g);

/**
 * Engine configuration. Fill with zo_optim_config_default(), then set
 * `dev`, the groups and what differs. Each field names the DeepSpeed key it
 * carries, so a DeepSpeed JSON config maps onto it one key at a time.
 */
typedef struct zo_optim_config {
    size_t struct_size;          /**< sizeof(zo_optim_config), set by the defaults function */

    /* ---- model ---- */
    struct zo_dev *dev;          /**< device backend (not owned, required; ZO_DEV_HOST is the reference) */
    zo_dtype param_dtype;        /**< device params: ZO_DTYPE_BF16, ZO_DTYPE_F16 or ZO_DTYPE_F32 (DeepSpeed:
                                      bf16.enabled / fp16.enabled / neither). Required: the default is
                                      ZO_DTYPE_COUNT (unset) and create refuses it with ZO_ECONFIG, since the
                                      engine writes params of this dtype into dev_params and a wrong one (a
                                      bf16 guess for an fp32 trainer) would go unnoticed */
    zo_dtype grad_dtype;         /**< device gradients: ZO_DTYPE_COUNT (default) means param_dtype */
    const zo_optim_group *groups; /**< [ngroups] parameter groups (read during create) */
    unsigned ngroups;            /**< >= 1 */
    zo_cpuadam_hparams hparams;    /**< default hyperparameters of the groups (optimizer.type, optimizer.params:
                                      lr, betas, eps, weight_decay, bias_correction; "Adam" with
                                      adam_w_mode true is ZO_OPTIM_ADAMW); default: AdamW defaults.
                                      step, grad_scale, clip_coef: the engine's, leave them at 1 */

    /* ---- zero_optimization.offload_optimizer, sub_group_size ---- */
    zo_optim_placement placement; /**< offload_optimizer.device: "cpu" HOST (default), "nvme" NVME */
    const char *nvme_path;       /**< offload_optimizer.nvme_path: directory of the swap files (NVMe placement,
                                      unless `swap` is given); copied */
    int pin_memory;              /**< offload_optimizer.pin_memory: 1 (default) page-lock host buffers (within
                                      pinned_bytes); 0 pageable (still within the budget, counted) */
    unsigned buffer_count;       /**< offload_optimizer.buffer_count: sweep pieces (of master, m, v) in
                                      flight through pinned slots with NVMe placement: read-ahead depth =
                                      buffer_count - 2, one in the kernel, one writing back; the pool has
                                      3 x buffer_count + 2 slots; default 4, in [4, 1024] */
    uint64_t sub_group_size;     /**< zero_optimization.sub_group_size, elements per sub-group; default 2^24
                                      (64 MiB of fp32); >= 64 */
    uint64_t pinned_bytes;       /**< budget of pinned host memory the engine may hold (0: unlimited); an
                                      impossible budget fails create with ZO_EBUDGET naming what is needed */
    size_t grad_staging_bytes;   /**< pinned staging for device -> host gradient copies (a gradient larger
                                      than this streams through it in pieces); default 32 MiB, >= 64 KiB */

    /* ---- aio (NVMe placement; ignored with an external `swap`) ---- */
    size_t aio_block_size;       /**< aio.block_size; default 1 MiB */
    unsigned aio_queue_depth;    /**< aio.queue_depth; default 32 */
    unsigned aio_threads;        /**< aio.intra_op_parallelism; default 1 */
    int aio_single_submit;       /**< aio.single_submit (accepted; the engine always batches submissions) */
    int aio_overlap_events;      /**< aio.overlap_events (accepted; completions always overlap submission) */
    struct zo_swap *swap;        /**< an existing swap store to use (not owned), or NULL: one is created
                                      in nvme_path */

    /* ---- fp16 / bf16 loss scaling (fp16.*) ---- */
    double loss_scale;           /**< fp16.loss_scale: 0 (default) dynamic (fp16 only), > 0 static; bf16/fp32
                                      ignore it (no scaling) */
    int initial_scale_power;     /**< fp16.initial_scale_power: first dynamic scale 2^power; default 16 */
    unsigned loss_scale_window;  /**< fp16.loss_scale_window: steps without overflow before doubling; default 1000 */
    unsigned hysteresis;         /**< fp16.hysteresis: overflows tolerated before the scale drops; default 2 */
    int consecutive_hysteresis;  /**< fp16.consecutive_hysteresis: refill hysteresis after every good step; default 0 */
    double min_loss_scale;       /**< fp16.min_loss_scale; default 1 */

    /* ---- clipping, accumulation, overflow ---- */
    double max_grad_norm;        /**< gradient_clipping: 0 (default) no clipping, else the global norm cap */
    unsigned grad_accum_steps;   /**< gradient_accumulation_steps: micro-steps per update; default 1 */
    zo_optim_clip_mode clip_mode; /**< default ZO_OPTIM_CLIP_TWO_PASS */
    zo_optim_nonfinite nonfinite; /**< bf16/fp32/static fp16 policy; default ZO_OPTIM_NONFINITE_ERROR */

    /* ---- delayed parameter update ---- */
    int dpu;                     /**< 1: delayed parameter update (see the file comment); default 0 */
    unsigned dpu_warmup_steps;   /**< boundaries run without delay first; default 1 */

    /* ---- CPU ---- */
    int nthreads;                /**< optimizer threads; 0 (default): the CPUs this process may use */
    int numa_node;               /**< node for pinned memory and the store; -1 (default): the device's */

    /* ---- added after the first version (in what was its tail padding) ---- */
    int dpu_double_buffer;       /**< with dpu 1: 1 double-buffers the device params (see "Delayed parameter
                                      update"): the engine allocates a second device buffer per tensor with
                                      dev_params, each update writes the buffer the device is not reading as
                                      its sub-groups finish, and the framework switches buffers at the step
                                      call (zo_optim_param_device()); no copy at the step call. Default 0 */
    zo_optim_no_grad no_grad;    /**< tensors without a gradient in a window: ZO_OPTIM_NO_GRAD_ZERO (default)
                                      or ZO_OPTIM_NO_GRAD_SKIP (see "Tensors without a gradient") */

    /* ---- added later: the struct grew; callers built before pass the shorter struct and get the defaults ---- */
    zo_qmap state_map_m;         /**< code map of m in the groups with state_bits: ZO_QMAP_DYNAMIC_SIGNED or
                                      ZO_QMAP_LINEAR_SIGNED (m is signed). ZO_QMAP_COUNT (default): the per-width
                                      default, ZO_QMAP_DYNAMIC_SIGNED. Set without any quantized group: ZO_ECONFIG
                                      (it would be ignored) */
    zo_qmap state_map_v;         /**< code map of v in the groups with state_bits: ZO_QMAP_DYNAMIC_UNSIGNED,
                                      ZO_QMAP_LINEAR_UNSIGNED, ZO_QMAP_DYNAMIC_UNSIGNED_NZ or
                                      ZO_QMAP_LINEAR_UNSIGNED_NZ (v >= 0). ZO_QMAP_COUNT (default): the per-width
                                      default, DYNAMIC_UNSIGNED for q8 and DYNAMIC_UNSIGNED_NZ for q4 (see
                                      "Quantized states" in docs/optim.md). Lion keeps no v: set when no quantized
                                      group has a v (none, or only Lion ones): ZO_ECONFIG (it would be ignored) */
} zo_optim_config;

/** Fill *cfg with the defaults listed above. NULL ignored. */
ZO_API void zo_optim_config_default(zo_optim_config *cfg);

/**
 * Create an engine: lays out the sub-groups, creates the store (and the swap
 * store for NVMe placement), registers every sub-group's master / m / v
 * (zero), allocates the accumulators, staging and parameter buffers,
 * creates two device streams and starts the worker thread. Masters start
 * at zero: initialise them with zo_optim_init_from_device(),
 * zo_optim_state_import() of ZO_OPTIM_STATE_MASTER for every tensor, or
 * zo_optim_load(). Until every tensor's masters are set, the calls that
 * would apply or push them (zo_optim_step_async(), zo_optim_step(),
 * zo_optim_push_params(), and under the eager speculative step the
 * gradient that would start the update) refuse with ZO_ESTATE and a
 * detail naming the first tensor and these calls: a step on zero masters
 * would write updates of zero over the framework's parameters.
 * @return 0; -EINVAL (out or cfg NULL, struct_size out of range, no groups,
 *         a group without tensors or with a zero numel, NULL dev); ZO_ECONFIG
 *         (param_dtype not set; a value out of range: dtype, sub_group_size,
 *         buffer_count, hyperparameters, speculative mode with Adagrad/Lion/bf16 states,
 *         NVMe placement without nvme_path or swap; state_bits not 0/8/4,
 *         state_block not a power of two in [64, 4096], state_bits with bf16
 *         state_dtype, the speculative step or ZO_OPTIM_NO_GRAD_SKIP; a
 *         state_map_m not signed, a state_map_v not unsigned, or either set
 *         without a quantized group that has that state...; the
 *         detail names the field); -EEXIST (two tensors with one name);
 *         ZO_EBUDGET (pinned_bytes cannot hold what the placement needs: the
 *         detail says how much); ZO_ENOTSUP (a feature not available in this
 *         build; Adagrad with state_bits); -ENOMEM;
 *         errors of zo_swap_create(), zo_store_create(), zo_stream_create(),
 *         zo_store_register() (-ENOSPC: the swap store cannot hold the
 *         NVMe-placed states).
 * Blocks (allocates, pins, may create files).
 */
ZO_API int zo_optim_create(zo_optim **out, const zo_optim_config *cfg);

/**
 * What zo_optim_create() would allocate for a configuration, without
 * allocating it: the planner's and a framework's question "does this fit"
 * answered by the code that makes the allocations (zo-plan and the Python
 * package ask this; they keep no arithmetic of their own).
 *
 * The figures are those zo_optim_get_info() reports right after a create
 * with the same configuration (pinned_bytes, host_bytes, grad_buffer_bytes,
 * nsubgroups), assuming every pinned allocation the budget allows also
 * succeeds (a memlock limit can make some pageable instead: the total is
 * the same). Not counted: window spills (gradients of a second arrival
 * under accumulation, made at run time), the host parameter buffers that
 * direct mode makes on first zo_optim_param_host(), swap file metadata,
 * thread stacks. Sizes of a cuda device are those of any device backend.
 */
typedef struct zo_optim_footprint {
    size_t struct_size;          /**< set by the caller: sizeof(zo_optim_footprint) */
    uint64_t numel;              /**< elements of all tensors */
    unsigned nsubgroups;         /**< sub-groups (zo_optim_info.nsubgroups) */
    unsigned pool_slots;         /**< the store's slot pool (pinned): 8 for host placement, 3 x buffer_count + 2
                                      with NVMe placement */
    uint64_t pool_slot_bytes;    /**< each slot: 1 MiB host; NVMe 4 MiB, shrunk to fit pinned_bytes down to the
                                      swap chunk (x2 with bf16 states) */
    uint64_t host_state_bytes;   /**< masters and states of host-placed groups (pinned), each sub-group's
                                      array rounded up to 4 KiB */
    uint64_t nvme_state_bytes;   /**< masters and states of NVMe-placed groups, each array rounded up to 1 MiB:
                                      the swap space they take */
    uint64_t staging_bytes;      /**< pinned gradient staging: grad_staging_bytes, 0 on the host backend
                                      (gradients are read in place) */
    uint64_t param_buffer_bytes; /**< host copies of the params made at create (numel x param size, x2 with
                                      dpu); 0 where the engine writes device params in place */
    uint64_t grad_window_bytes;  /**< gradient windows (numel x window dtype, x2 with dpu) */
    zo_dtype grad_window_dtype;  /**< the windows' dtype: the grad dtype (bf16/f16, no accumulation) or f32 */
    uint64_t pinned_min_bytes;   /**< the least pinned_bytes create accepts: host states + pool + staging */
    uint64_t pinned_bytes;       /**< pinned memory after create (zo_optim_info.pinned_bytes): the above plus
                                      the parameter buffers and windows that fit pinned_bytes */
    uint64_t host_bytes;         /**< other host memory after create (zo_optim_info.host_bytes) */
    uint64_t device_bytes;       /**< device memory the engine allocates: the second param buffers of
                                      dpu_double_buffer */
} zo_optim_footprint;

/**
 * Fill *out with what zo_optim_create(cfg) would allocate (see
 * zo_optim_footprint). cfg is checked as create checks it, except that
 * cfg->dev may be NULL: `kind` then says which backend to plan for
 * (ZO_DEV_HOST or ZO_DEV_CUDA); with a device, its kind is used and `kind`
 * is ignored. With NVMe placement the swap chunk is 1 MiB (the one create
 * makes) or the external cfg->swap's.
 * @return 0; -EINVAL (NULL, struct_size smaller than the struct); ZO_ECONFIG
 *         or -EINVAL (what create refuses, same message via
 *         zo_last_error_detail()); ZO_EBUDGET (pinned_bytes below
 *         pinned_min_bytes: *out is filled all the same). Allocates only
 *         small temporaries; any thread.
 */
ZO_API int zo_optim_estimate(const zo_optim_config *cfg, int kind, zo_optim_footprint *out);

/**
 * Stop the engine: waits for a step in flight (its result is kept in the
 * store but nothing more is copied to the device), then frees everything.
 * Safe during an async step. NULL (or *o NULL) ok; clears *o.
 */
ZO_API void zo_optim_destroy(zo_optim **o);

/**
 * The detail of the driving thread's latest call on the engine: why it
 * failed, or "" when it succeeded (each such call clears it as it begins;
 * the any-thread calls zo_optim_poll(), zo_optim_eventfd(),
 * zo_optim_params_current(), zo_optim_get_info(), zo_optim_loss_scale()
 * and the tensor queries leave it). The detail of an update that failed on
 * the worker comes with the call that returns its error (zo_optim_wait(),
 * zo_optim_step(), the next step_async under DPU...), whatever succeeded in
 * between. Read it right after the call. Thread-safe: a copy in a
 * thread-local buffer valid until this thread next calls zo_optim_errmsg()
 * (NULL gives "").
 */
ZO_API const char *zo_optim_errmsg(const zo_optim *o);

/* ---- tensors ------------------------------------------------------------------ */

/** Number of tensors over all groups. 0 if o is NULL. */
ZO_API unsigned zo_optim_tensor_count(const zo_optim *o);
/** Find a tensor's global index by name. @return 0; -ENOENT; -EINVAL (NULL). */
ZO_API int zo_optim_tensor_index(const zo_optim *o, const char *name, unsigned *index);
/** Elements, group and name of tensor `index`. Any out pointer may be NULL.
 *  @return 0; -EINVAL (NULL o, index out of range). */
ZO_API int zo_optim_tensor_get(const zo_optim *o, unsigned index, uint64_t *numel, unsigned *group,
                               const char **name);

/* ---- initialisation, export, import ----------------------------------------------- */

/**
 * Initialise every master from the device parameters (widened to fp32)
 * and zero the states; also fills the parameter buffers. Needs dev_params
 * in every group. With dpu_double_buffer it reads the current buffers (those
 * zo_optim_param_device() gives). Blocks until done. A success also ends
 * the refusals after a failed step or load; a failure after the masters
 * began to be rewritten leaves them undefined and the engine refuses as
 * after a failed load (see zo_optim_load()) until an init or load succeeds.
 * @return 0; ZO_ESTATE (a group has no dev_params; or a step in flight or
 *         gradients pending); device copy errors; store errors.
 */
ZO_API int zo_optim_init_from_device(zo_optim *o);

/**
 * Copy elements [off, off + n) of one state of tensor `index` out, converted
 * to `dtype` (F32, BF16 or F16; rounded to nearest even). For a torch-style
 * state_dict. Waits for a step in flight first. Blocks.
 * @return 0; -EINVAL (NULL, index or range out of bounds); ZO_ENOTSUP
 *         (dtype; or the state is unused by the group's optimizer); store errors.
 */
ZO_API int zo_optim_state_export(zo_optim *o, unsigned index, zo_optim_state which, void *dst, zo_dtype dtype,
                                 uint64_t off, uint64_t n);

/**
 * Copy elements [off, off + n) of one state of tensor `index` in from
 * `src` of type `dtype` (F32, BF16, F16; widened exactly). Importing
 * masters also rewrites the low-precision parameter buffer for the range
 * (not the device params: zo_optim_push_params() does that), and counts
 * toward the tensor's masters being set (see zo_optim_create()): a tensor
 * counts as set once imports have written numel of its master elements
 * (elements are counted, not tracked: import each range once). Blocks.
 * @return as zo_optim_state_export(); ZO_ESTATE (a step in flight).
 */
ZO_API int zo_optim_state_import(zo_optim *o, unsigned index, zo_optim_state which, const void *src,
                                 zo_dtype dtype, uint64_t off, uint64_t n);

/**
 * One sub-group as the raw quantized-state calls see it
 * (zo_optim_get_qstate_info()). A quantized state is stored per sub-group, not
 * per tensor: its blocks start at the sub-group's first element and run
 * over the group's flat space across tensor boundaries (a tensor may start
 * or end mid-block, and the last block of a sub-group may be short), so
 * the sub-group is the unit whose codes come with all of their scales.
 */
typedef struct zo_optim_qstate_info {
    size_t struct_size;  /**< set by the caller: sizeof(zo_optim_qstate_info) */
    unsigned group;      /**< the sub-group's parameter group */
    uint64_t offset;     /**< its first element in the group's flat space (tensors end to end, in order) */
    uint64_t numel;      /**< its elements */
    int bits;            /**< 8 (q8) or 4 (q4); 0: the group's states are not quantized */
    uint32_t block;      /**< elements per absmax scale (0 when bits is 0) */
    uint64_t code_bytes; /**< bytes of codes of one state: numel (q8) or (numel + 1) / 2 (q4, an odd numel
                              leaves the last high nibble 0) */
    uint64_t nscales;    /**< fp32 absmax values of one state: ceil(numel / block) */
    int32_t map[ZO_OPTIM_STATE_COUNT]; /**< each state's code map (a ::zo_qmap); -1 for the master, for a state
                                            the optimizer does not use, and when bits is 0 */
} zo_optim_qstate_info;

/**
 * Describe sub-group `subgroup` (0 .. zo_optim_info.nsubgroups - 1, group
 * 0's first, in flat order) of any group, quantized or not. Any thread
 * (the layout never changes). @return 0; -EINVAL (NULL, struct_size too
 * small, subgroup out of range).
 */
ZO_API int zo_optim_get_qstate_info(zo_optim *o, unsigned subgroup, zo_optim_qstate_info *info);

/**
 * Copy one quantized state (ZO_OPTIM_STATE_EXP_AVG or EXP_AVG_SQ) of
 * sub-group `subgroup` out as it is stored, no dequantize: `codes` gets
 * info.code_bytes bytes (the kernel's layout, cpuadam.h), `absmax`
 * info.nscales floats. Under both placements (NVMe: read from the swap
 * store). Waits for an update in flight first, as zo_optim_state_export().
 * Blocks. What a bit-exact state dict of quantized states is built from.
 * @return 0; -EINVAL (NULL, subgroup out of range, `which` not a moment,
 *         code_bytes / nscales not exactly the sub-group's);
 *         ZO_ENOTSUP (the group's states are not quantized; or the state
 *         is unused by its optimizer, Lion's v); ZO_ESTATE (the states are
 *         undefined after a failed step, load or init, see
 *         zo_optim_load()); store errors.
 */
ZO_API int zo_optim_qstate_export(zo_optim *o, unsigned subgroup, zo_optim_state which, uint8_t *codes,
                                  uint64_t code_bytes, float *absmax, uint64_t nscales);

/**
 * Replace one quantized state of sub-group `subgroup` with codes and scales
 * as zo_optim_qstate_export() gives them: stored bit for bit, no
 * requantization (the next step dequantizes exactly these). Checked before
 * anything is written: a 4-bit state of odd numel must leave its last high
 * nibble 0, and every absmax must be >= 0 or NaN (a NaN block is what a
 * step stores for an inf/NaN moment; a negative or infinite scale is
 * never stored). Waits for an update in flight first. Blocks.
 * @return as zo_optim_qstate_export(); -EINVAL also for a bad pad nibble or
 *         scale (nothing written).
 */
ZO_API int zo_optim_qstate_import(zo_optim *o, unsigned subgroup, zo_optim_state which, const uint8_t *codes,
                                  uint64_t code_bytes, const float *absmax, uint64_t nscales);

/**
 * Copy the parameter buffers (the masters cast to param_dtype) to the
 * device parameters of every group that has dev_params (with
 * dpu_double_buffer: to the current buffers), and wait.
 * @return 0; ZO_ESTATE (a step in flight; or some tensor's masters were
 *         never set, see zo_optim_create()); device errors.
 */
ZO_API int zo_optim_push_params(zo_optim *o);

/* ---- gradient intake ---------------------------------------------------------------- */

/**
 * Hand over the gradient of tensor `index`: `numel` elements of grad_dtype
 * at device pointer `dev_grad` (on the host backend any host memory,
 * malloc() included: it is read in place), valid once `ready` completes
 * (NULL: already valid). The copy is queued on the engine's device -> host stream behind
 * `ready` and the call returns at once; the device memory must stay valid
 * and unchanged until the copy is done: zo_optim_grads_done() or the step
 * call that ends the micro-step has returned (zo_optim_step(),
 * zo_optim_step_async(), also under DPU, where the update itself runs on).
 * Within one accumulation window the first gradient of a
 * tensor overwrites its accumulator and later ones are added in fp32; a
 * tensor that gets none in a window has a zero gradient.
 * @return 0; -EINVAL (NULL, index out of range); ZO_ESTATE (a step is
 *         being applied to the accumulators this gradient would land in:
 *         only possible without DPU between step_async and wait; speculative
 *         mode: a second gradient for the tensor in the last micro-step, or
 *         masters never set; any mode: the states are undefined after a
 *         step, load or init that failed midway); device errors (also a
 *         failed earlier copy).
 */
ZO_API int zo_optim_grad(zo_optim *o, unsigned index, const void *dev_grad, struct zo_event *ready);

/** One entry of a gradient bucket. */
typedef struct zo_optim_grad_ref {
    unsigned index;       /**< tensor */
    const void *dev_grad; /**< its gradient in device memory */
} zo_optim_grad_ref;

/** zo_optim_grad() for n gradients behind one event. @return as zo_optim_grad(); on an
 *  error entries before the bad one are queued. */
ZO_API int zo_optim_grad_bucket(zo_optim *o, const zo_optim_grad_ref *refs, unsigned n, struct zo_event *ready);

/**
 * Hand over a gradient already in host memory (any host memory, grad_dtype
 * or `dtype`: F32, BF16, F16): accumulated at once, synchronously. For
 * frameworks that copy device -> host themselves (e.g. into a pinned
 * torch tensor with non_blocking copies, then synchronize).
 * @return as zo_optim_grad(); ZO_ENOTSUP (dtype).
 */
ZO_API int zo_optim_grad_host(zo_optim *o, unsigned index, const void *host_grad, zo_dtype dtype);

/** Block until every gradient handed over so far has landed in the accumulators.
 *  @return 0 or the first copy error (the window's gradients are then lost: ZO_ESTATE
 *  until the next boundary discards them). */
ZO_API int zo_optim_grads_done(zo_optim *o);

/**
 * Drop the current accumulation window: every gradient handed over since
 * the last boundary (waited for first) and the window's micro-steps (the
 * micro-step count goes back to the boundary's), as if the window had not
 * begun. For a framework's zero_grad() mid-window, or a trainer stopping
 * between boundaries that still wants to save (saves are refused
 * mid-window). Masters, states, counts and the scaler are untouched; under
 * DPU an update in flight goes on. Blocks until the window's copies land.
 * @return 0; -EINVAL (NULL); ZO_ESTATE (without DPU, a step in flight on
 *         this window; the eager speculative update of this window has
 *         begun; the states are undefined); copy errors.
 */
ZO_API int zo_optim_discard_grads(zo_optim *o);

/**
 * This rank's partial of the global gradient norm for the current
 * boundary: waits for the gradients, then *sumsq = sum of the squares of
 * the accumulated (still loss-scaled) gradients, in double, summed tensor
 * by tensor in index order, and *nonfinite = count of inf/NaN elements.
 * Combine ranks: total = sum of sumsq; norm = sqrt(total) / loss_scale.
 * Either out may be NULL. @return 0; -EINVAL; copy errors.
 */
ZO_API int zo_optim_grad_norm_partial(zo_optim *o, double *sumsq, uint64_t *nonfinite);

/* ---- the step ---------------------------------------------------------------------- */

/** Options of one step call; fill with zo_optim_step_opts_default(). */
typedef struct zo_optim_step_opts {
    size_t struct_size;   /**< sizeof(zo_optim_step_opts) */
    double global_sumsq;  /**< combined sum of squares over all ranks (zo_optim_grad_norm_partial());
                               < 0 (default): this engine's own */
    int global_nonfinite; /**< 1: some rank overflowed, 0: none; -1 (default): this engine's own */
} zo_optim_step_opts;

/** Defaults: local norm and overflow. NULL ignored. */
ZO_API void zo_optim_step_opts_default(zo_optim_step_opts *opts);

/**
 * End of a micro-step. Not at an accumulation boundary: waits for the
 * micro-step's gradients to land and returns. At a boundary: starts the
 * update (norm, overflow check, fused step, parameter copy-back) on the
 * worker thread and returns; zo_optim_wait() collects the result. With DPU
 * (after the warm-up) it first finishes the previous step: waits for its
 * update, copies its parameters to the device. opts may be NULL.
 * @return 0 (started, or accumulated); ZO_ESTATE (a step already in flight
 *         or not yet collected without DPU: call zo_optim_wait() first; or an
 *         earlier step failed mid-update: load a checkpoint; or some
 *         tensor's masters were never set: zo_optim_init_from_device(),
 *         zo_optim_state_import() or zo_optim_load() first); the previous
 *         step's error under DPU (this step is started all the same,
 *         unless that error left the states undefined: then it is not); copy
 *         errors of the gradients; -EINVAL (bad opts).
 */
ZO_API int zo_optim_step_async(zo_optim *o, const zo_optim_step_opts *opts);

/*
 * Output structs (zo_optim_step_result, zo_optim_info, zo_optim_timeline)
 * start with struct_size, which the caller sets (to sizeof the struct, e.g.
 * `zo_optim_info info = {.struct_size = sizeof(info)};`) before the call.
 * The library fills only what fits in struct_size and never writes
 * struct_size itself; a struct_size smaller than the struct's first
 * published version (the ZO_OPTIM_*_SIZE_V1 macros) is refused with -EINVAL
 * before anything is done. A caller built against an older header gets the
 * fields its version has.
 */

/** Result of a step (zo_optim_wait(), zo_optim_step()). */
typedef struct zo_optim_step_result {
    size_t struct_size;  /**< set by the caller: sizeof(zo_optim_step_result) */
    int64_t step;        /**< updates applied so far (a skipped boundary does not count) */
    int boundary;        /**< 1 if the call ended an accumulation window */
    int skipped;         /**< 1 if the update was skipped (overflow) */
    int clipped;         /**< 1 if the clip coefficient was below 1 */
    int rolled_back;     /**< speculative: 1 if sub-groups were rolled back */
    double grad_norm;    /**< unscaled global norm (NaN/inf on overflow) */
    double clip_coef;    /**< coefficient applied */
    double loss_scale;   /**< scale the gradients carried (the scale is then updated) */
    uint64_t nonfinite;  /**< inf/NaN elements found */
} zo_optim_step_result;

/** The size of the first version of zo_optim_step_result (the smallest struct_size accepted). */
#define ZO_OPTIM_STEP_RESULT_SIZE_V1 sizeof(zo_optim_step_result)

/**
 * Wait for the step in flight (no-op when none): its update and the copy of
 * its parameters to the device. Under DPU this also ends the delay: the
 * device params are current afterwards. res may be NULL; when no step was
 * in flight it gets boundary 0, the current step count and loss scale.
 * @return 0; -EINVAL (res->struct_size below ZO_OPTIM_STEP_RESULT_SIZE_V1:
 *         nothing is waited for); ZO_ENONFINITE (non-finite gradients under
 *         ZO_OPTIM_NONFINITE_ERROR: nothing was updated); store errors
 *         (-EIO, -ENOSPC, ZO_ECORRUPT: see "Failures during an update"),
 *         device and kernel errors.
 */
ZO_API int zo_optim_wait(zo_optim *o, zo_optim_step_result *res);

/** zo_optim_step_async() then zo_optim_wait(); res (if not NULL) is checked first (-EINVAL, nothing done). */
ZO_API int zo_optim_step(zo_optim *o, const zo_optim_step_opts *opts, zo_optim_step_result *res);

/**
 * The result of the latest collected boundary: the one zo_optim_wait() (or
 * zo_optim_step()) returned, or under DPU the previous step, whose update
 * zo_optim_step_async() finished (fenced) before starting its own. Not an
 * update that finished on the worker since: the answer depends only on
 * the calls made, never on timing. @return 0; -EINVAL (NULL, struct_size);
 * -ENOENT (none yet).
 */
ZO_API int zo_optim_last_result(zo_optim *o, zo_optim_step_result *res);

/**
 * The loss scale the framework multiplies the loss by for the backward
 * passes of the current accumulation window (1 without fp16 scaling). It
 * changes only in step calls: read it after each boundary's step call.
 * Under DPU a step's scale update reaches the window after next. 0 if o is NULL.
 */
ZO_API double zo_optim_loss_scale(const zo_optim *o);

/** The loss scaler's state: DeepSpeed's DynamicLossScaler fields, what a
 *  framework's state dict carries so a restored run goes on with the same
 *  scale (zo_optim_save/load carry it in the checkpoint themselves). */
typedef struct zo_optim_scaler_state {
    size_t struct_size;         /**< set by the caller: sizeof(zo_optim_scaler_state) */
    int dynamic;                /**< 1: fp16 dynamic scaling; 0: a static scale or none (1.0) */
    double scale;               /**< the current scale */
    int64_t cur_iter;           /**< boundaries the scaler has seen */
    int64_t last_overflow_iter; /**< the boundary of the latest overflow, -1 for none */
    unsigned cur_hysteresis;    /**< overflows left before the scale is halved, 1..hysteresis */
} zo_optim_scaler_state;

/** @return 0; -EINVAL (NULL, struct_size too small). Any thread (a snapshot). */
ZO_API int zo_optim_get_scaler(zo_optim *o, zo_optim_scaler_state *st);
/**
 * Restore the scaler's state (a framework's load_state_dict). Only between
 * boundaries with nothing handed over in the current window: the gradients
 * already there were scaled by the old scale.
 * @return 0; -EINVAL (NULL, struct_size); ZO_ECONFIG (dynamic differs from
 *         the engine's, a static scale other than the engine's, scale not
 *         finite or below min_loss_scale, cur_hysteresis outside
 *         [1, hysteresis], last_overflow_iter outside [-1, cur_iter]);
 *         ZO_ESTATE (an update is queued or running: zo_optim_wait() first;
 *         gradients were handed over in this window).
 */
ZO_API int zo_optim_set_scaler(zo_optim *o, const zo_optim_scaler_state *st);

/** ZO_PENDING while a step is in flight, else 0 (or the finished step's error, kept for
 *  zo_optim_wait()). Never blocks; any thread. -EINVAL (NULL). */
ZO_API int zo_optim_poll(zo_optim *o);

/**
 * An eventfd that becomes readable when a step finishes (its update done,
 * before the DPU parameter copy). Owned by the engine; do not close it.
 * Read it (8 bytes) to re-arm. Any thread. @return the fd, or -EINVAL.
 */
ZO_API int zo_optim_eventfd(zo_optim *o);

/** 1 if the device params hold the result of the latest applied update, 0 if
 *  an update is in flight or not yet copied (DPU). -EINVAL (NULL). Any thread. */
ZO_API int zo_optim_params_current(zo_optim *o);

/**
 * Set the learning rate of group `group` for the next updates (LR
 * schedules): the update started by the next boundary's step call uses it;
 * an update already in flight (DPU) keeps its own. Does not block. Other
 * hyperparameters: zo_optim_set_hparams().
 * @return 0; -EINVAL (NULL, group out of range); ZO_ECONFIG (lr not finite or < 0).
 */
ZO_API int zo_optim_set_lr(zo_optim *o, unsigned group, double lr);
/** Replace a group's hyperparameters (kind must stay). step, grad_scale and clip_coef are the engine's
 *  and must stay at zo_cpuadam_hparams_default()'s 1 (zo_optim_set_step() sets the update count).
 *  @return 0; -EINVAL; ZO_ECONFIG (out of range, kind changed, step/grad_scale/clip_coef set). */
ZO_API int zo_optim_set_hparams(zo_optim *o, unsigned group, const zo_cpuadam_hparams *hp);

/**
 * Set the number of updates applied so far (the next update is step + 1:
 * Adam's bias correction uses it), the engine's and every tensor's. For
 * frameworks that restore the count from their own state_dict instead of
 * zo_optim_load(). Between updates
 * only. @return 0; -EINVAL (NULL, step < 0); ZO_ESTATE (an update in flight
 * or not yet collected with zo_optim_wait()).
 */
ZO_API int zo_optim_set_step(zo_optim *o, int64_t step);

/**
 * The number of updates applied to tensor `index`: the engine's count
 * under ZO_OPTIM_NO_GRAD_ZERO; its own under ZO_OPTIM_NO_GRAD_SKIP (the
 * boundaries at which it had a gradient). Between updates (an update in
 * flight may still change it). @return 0; -EINVAL (NULL, index out of range).
 */
ZO_API int zo_optim_tensor_step(zo_optim *o, unsigned index, int64_t *step);

/**
 * Set tensor `index`'s update count (ZO_OPTIM_NO_GRAD_SKIP: a framework
 * restoring per-parameter counts from its own state_dict;
 * zo_optim_set_step() sets every tensor's and the engine's). Between updates
 * only. @return 0; -EINVAL (NULL, index out of range, step < 0); ZO_ECONFIG
 * (ZO_OPTIM_NO_GRAD_ZERO: every tensor has the engine's count, and step
 * differs from it); ZO_ESTATE (an update in flight or not yet collected).
 */
ZO_API int zo_optim_set_tensor_step(zo_optim *o, unsigned index, int64_t step);

/* ---- library-owned host buffers -------------------------------------------------------- */

/**
 * The host buffer holding tensor `index`'s latest parameters in
 * param_dtype (the masters cast by the fused step), for frameworks that copy
 * to the device themselves with non-blocking copies. Under DPU the engine
 * double-buffers: the returned buffer is the one of the latest finished
 * update and stays unchanged until the step after next begins. Valid until
 * destroy. @return 0; -EINVAL; ZO_ESTATE (a step in flight without DPU).
 */
ZO_API int zo_optim_param_buffer(zo_optim *o, unsigned index, const void **host);

/**
 * Where tensor `index`'s device params for the next forward are. Without
 * `dpu_double_buffer` always the group's dev_params entry (returns 0).
 * With it, one of the tensor's two device buffers: 0 the framework's
 * dev_params entry, 1 the engine's second buffer; the answer changes only
 * in step calls that collect an update (a boundary's zo_optim_step_async(),
 * zo_optim_wait(), zo_optim_step(); also a save, export, import, push,
 * init or load, which wait for the update in flight first), so read it
 * after each. *ready (if not NULL) receives an event of the engine's device
 * the framework's stream must wait on before it reads the buffer
 * (zo_stream_wait_event()), or NULL when there is nothing to wait for (the host
 * backend writes the buffer on the CPU; on a GPU the engine waits for its
 * copies before it switches buffers, so the event is complete, but a
 * framework must not rely on that). The engine's buffers are owned by it
 * and freed by zo_optim_destroy(). Caller's thread. Does not block.
 * @return the buffer index (0 or 1); -EINVAL (NULL o, index out of range);
 *         -ENOENT (the tensor's group has no dev_params).
 */
ZO_API int zo_optim_param_device(zo_optim *o, unsigned index, void **dev, struct zo_event **ready);

/**
 * The framework moved tensor `index`'s device params to `dev_param` (a new
 * buffer of the same numel and param_dtype, on the engine's device: a
 * framework that reallocates a parameter, as torch's module.to() or
 * `p.data = ...` do): from now on the engine writes the updated params
 * there, and zo_optim_init_from_device() reads them from there. The old
 * address is never touched again (the framework may have freed it). Only
 * between updates: nothing in flight or waiting to be collected. Not with
 * `dpu_double_buffer` (the engine's second buffer takes turns with the
 * framework's: a new address would break the pairing). Caller's thread.
 * @return 0; -EINVAL (NULL o or dev_param, index out of range); -ENOENT
 *         (the tensor's group has no dev_params); ZO_ESTATE (an update in
 *         flight or not collected: zo_optim_wait() first); ZO_ENOTSUP
 *         (dpu_double_buffer).
 */
ZO_API int zo_optim_set_dev_param(zo_optim *o, unsigned index, void *dev_param);

/* ---- save / load ----------------------------------------------------------------------- */

/**
 * Save everything (masters, states, step counts (per tensor too), loss scaler, accumulation
 * position, config fingerprint) as checkpoint <root>/<name> through the
 * store's crash-safe checkpoints, keeping the last `keep_last` (0: all).
 * user_json (NULL or a JSON value) is stored beside the engine's own record.
 * Waits for a step in flight first. Refused mid-accumulation window.
 * @return 0; -EINVAL; ZO_ESTATE (gradients accumulated but not applied);
 *         errors of zo_store_checkpoint().
 */
ZO_API int zo_optim_save(zo_optim *o, const char *root, const char *name, unsigned keep_last,
                         const char *user_json);

/**
 * Load checkpoint `name` (NULL: the latest) of `root`: masters, states,
 * counts and scaler; rewrites the parameter buffers and (with dev_params)
 * the device params (with dpu_double_buffer: the current buffers, which
 * stay the ones zo_optim_param_device() gave). A run resumed from it
 * continues bit-identically.
 * user_json, if not NULL, receives the caller's JSON (truncated to len, NUL-terminated).
 *
 * A checkpoint of the same layout with other state types (fp32, bf16, q8,
 * q4: zo_optim_group.state_dtype / state_bits / state_block) is converted
 * as it is restored: moments dequantized or widened to fp32, then
 * quantized or cast to the engine's types; masters as saved (docs/optim.md,
 * "Quantized states"). Then the run continues from the converted states,
 * not bit-identically to the saved engine.
 *
 * What can be checked without reading the data is checked before anything
 * is written (the manifest, the engine's record and its fingerprint, and
 * the tensor set: the checkpoint must hold exactly the engine's states, by
 * name, dtype and shape, in the order a save writes them): a load refused
 * there leaves the engine as it was. The data is read once,
 * each chunk verified as it is restored, so a corrupt chunk or an I/O
 * error is found midway, after earlier states were overwritten: the
 * engine then refuses steps, gradients, saves, exports, imports, pushes
 * and parameter buffers with ZO_ESTATE (the detail says a load failed)
 * until a zo_optim_load() or zo_optim_init_from_device() succeeds.
 * @return 0; -EINVAL; ZO_EFORMAT (not an optim checkpoint, or the config
 *         fingerprint differs: layout, dtypes, optimizer kinds; or a state
 *         is missing, extra, of another size or out of place); -ENOENT;
 *         errors of zo_store_restore() (ZO_ECORRUPT, -EIO...: the states
 *         are then undefined, see above); ZO_ESTATE (step in flight).
 */
ZO_API int zo_optim_load(zo_optim *o, const char *root, const char *name, char *user_json, size_t len);

/* ---- info and timeline --------------------------------------------------------------------- */

/** Engine state. */
typedef struct zo_optim_info {
    size_t struct_size;      /**< set by the caller: sizeof(zo_optim_info) */
    int64_t step;            /**< updates applied */
    uint64_t micro_steps;    /**< micro-steps seen */
    uint64_t skipped_steps;  /**< boundaries skipped (overflow) */
    uint64_t rollbacks;      /**< speculative steps rolled back */
    double loss_scale;       /**< current scale (1 without scaling) */
    unsigned ntensors, ngroups, nsubgroups;
    uint64_t numel;          /**< elements over all tensors */
    uint64_t pinned_bytes;   /**< pinned host memory the engine holds */
    uint64_t host_bytes;     /**< other host memory it holds (gradient window...) */
    int dpu_active;          /**< 1 once past the DPU warm-up */
    uint64_t eager_subgroups; /**< speculative: sub-group updates done before the step call closed their
                                   window (while backward still handed gradients over) */
    uint64_t updates_done;   /**< boundaries the worker finished (applied, skipped or failed), since create */
    uint64_t nvme_read_bytes_total;  /**< NVMe bytes the updates read, since create (sum of the timelines') */
    uint64_t nvme_write_bytes_total; /**< NVMe bytes the updates wrote, since create */
    uint64_t grad_buffer_bytes; /**< host memory holding gradients between hand-over and step (part of
                                     host_bytes, or of pinned_bytes for pinned windows): the gradient windows, numel x 2 (bf16/fp16 gradients
                                     without accumulation: kept in their dtype) or x 4 (fp32), twice
                                     under DPU, plus fp32 spills of tensors handed over twice */
    zo_dtype grad_buffer_dtype; /**< the windows' dtype: ZO_DTYPE_F32, or grad_dtype (bf16/fp16) when
                                     grad_accum_steps is 1 */
    unsigned grad_windows_pinned; /**< windows in pinned memory (0..2): with a device backend, a
                                       tensor's first gradient in a window of its own dtype is copied
                                       by the device straight into it; otherwise it lands in the
                                       staging buffer and a host thread copies or adds it in */
    uint64_t grad_direct_bytes_total; /**< gradient bytes copied straight into a pinned window, since
                                           create */
} zo_optim_info;

/** The size of the first version of zo_optim_info (through dpu_active): the smallest struct_size accepted. */
#define ZO_OPTIM_INFO_SIZE_V1 offsetof(zo_optim_info, eager_subgroups)

/** @return 0; -EINVAL (NULL, struct_size below ZO_OPTIM_INFO_SIZE_V1). Any thread (a snapshot). */
ZO_API int zo_optim_get_info(zo_optim *o, zo_optim_info *info);

/** Where the time of one step went. Durations in nanoseconds (sums over the
 *  step's pieces; pieces overlap, so they may add up to more than total). */
typedef struct zo_optim_timeline {
    size_t struct_size;      /**< set by the caller: sizeof(zo_optim_timeline) */
    int64_t step;            /**< the update this describes (its value after the update) */
    uint64_t total_ns;       /**< from the boundary's step call to the end of its copy-back */
    uint64_t d2h_ns;         /**< gradient copies device -> host (this window) */
    uint64_t d2h_bytes;
    uint64_t norm_ns;        /**< gradient statistics the step computed itself: 0 when every sub-group's
                                  were taken as its last micro-step's gradients landed (the usual case);
                                  sub-groups with a tensor that got no gradient, or a second one in the
                                  last micro-step, are computed by the step */
    uint64_t compute_ns;     /**< fused optimizer kernels (and rollbacks) */
    uint64_t nvme_read_ns;   /**< waiting for sub-group pieces to load (the part of the NVMe reads the
                                  read-ahead did not hide; ~0 under host placement) */
    uint64_t nvme_read_bytes; /**< bytes read from NVMe */
    uint64_t nvme_write_ns;  /**< waiting for the last write-backs at the end of each sweep */
    uint64_t nvme_write_bytes; /**< bytes written to NVMe */
    uint64_t h2d_ns;         /**< parameter copies host -> device */
    uint64_t h2d_bytes;
    uint64_t stall_ns;       /**< the worker blocked waiting for data: gradients still copying, plus the
                                  store's stall time (NVMe pieces not yet loaded) */
    uint64_t update_ns;      /**< the worker's own time on the update: from the window's gradients
                                  having landed (an eager speculative job: from its start) to the update
                                  done, its parameter copies included unless delayed. Unlike total_ns it
                                  excludes the wait for the gradient copies and, under DPU, for the next
                                  step call's parameter copy: the optimizer's cost to set against compute */
} zo_optim_timeline;

/** The size of the first version of zo_optim_timeline (through stall_ns): the smallest struct_size accepted. */
#define ZO_OPTIM_TIMELINE_SIZE_V1 offsetof(zo_optim_timeline, update_ns)

/** The timeline of the latest finished update. @return 0; -EINVAL (NULL, struct_size below
 *  ZO_OPTIM_TIMELINE_SIZE_V1); -ENOENT (no update yet). */
ZO_API int zo_optim_get_timeline(zo_optim *o, zo_optim_timeline *tl);

/**
 * The latest timeline as one JSON object ({"step":..,"total_ns":..,...}) into
 * buf (NUL-terminated, truncated to len). @return the length the full text
 * needs (without the NUL), or -EINVAL / -ENOENT.
 */
ZO_API int zo_optim_timeline_json(zo_optim *o, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_OPTIM_H */
