/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file part.h
 * @brief Many ranks: a ZeRO-partitioned engine (each rank offloads only its
 *        shard) over the single-rank ::zo_optim, and the collectives it
 *        needs (::zo_comm).
 *
 * Layout (DeepSpeed's ZeRO-1/2 partitioning)
 *   Every parameter group's tensors are laid end to end in one flat element
 *   space of N elements (the order of the group's tensors). It is cut into
 *   `world` shards of S = ceil(N / world) rounded up to a multiple of 2
 *   elements: rank r owns [r S, min((r + 1) S, N)), so every shard has the
 *   same size but the last ones, which are shorter (or empty in a group
 *   smaller than world x 2 elements). No padding is stored. Each rank runs
 *   an inner ::zo_optim whose groups are its shards: one tensor per group,
 *   named "g<group>.shard.r<rank>of<world>", whose device params lie inside
 *   the rank's flat device copy of all the params (allocated by the
 *   engine). Its fp32 masters and optimizer states (host or NVMe, per the
 *   template's placement: each rank its own swap files) are 1/world of a
 *   single-rank engine's.
 *
 * One step
 *   1. Backward: zo_part_grad() per tensor as its gradient is produced.
 *      Gradients are grouped into buckets of at most `bucket_bytes` (in
 *      backward order: the reverse of the declaration order; a bucket never
 *      spans two groups; a tensor larger than a bucket is cut into several).
 *      When every tensor of the next bucket is in, the caller's thread copies
 *      the bucket into the engine's device bucket buffer and reduce-scatters
 *      it (::zo_comm.reduce_scatter; with the asynchronous callbacks it
 *      starts the collective and returns, two buckets in flight): the
 *      buckets are reduced while backward goes on, in bucket order on every
 *      rank (a bucket that fills before the one before it waits for it), so
 *      the ranks' collectives pair up whatever order the gradients arrive
 *      in.
 *   2. The rank's part of the sum is averaged (divided by world in fp32,
 *      after the sum: one rounding, the mean is correctly rounded from the
 *      summed gradient; see docs/optim-integration.md "Many ranks") into an
 *      fp32 host buffer of the rank's shard; a group's shard is handed to
 *      the inner engine (zo_optim_grad_host()) as soon as all of its buckets
 *      are reduced.
 *   3. zo_part_step() (every micro-step, as zo_optim_step()): buckets still
 *      incomplete are reduced (tensors that got no gradient count as zero).
 *      At a boundary: the inner engine's partial sum of squares, an
 *      overflow flag and an error flag are all-reduced (one sum; a flag
 *      summed above 0 is some rank's), the inner engine steps with the
 *      global values (::zo_optim_step_opts): max_grad_norm clips by the
 *      global norm and every rank skips an overflowed step together; then
 *      a one-value all-reduce (max) of "did my update fail", then the flat
 *      params are all-gathered (::zo_comm.all_gather, one call per group)
 *      and every tensor's params are copied to the framework's dev_params.
 *
 * Collectives and failures
 *   Every rank must make the same calls in the same order (create, init,
 *   steps, loads); the engine's collectives then match. A collective that
 *   fails (a callback returning < 0) fails the call with that error and a
 *   detail naming the collective; the ranks are then out of step, so the
 *   engine refuses gradients, steps and saves with ZO_ESTATE until a
 *   zo_part_load() or zo_part_init_from_device() (both collective) succeeds.
 *
 * Not in this version (refused with ZO_ENOTSUP, never ignored):
 * `dpu_double_buffer` (DPU itself is supported), the speculative clip mode,
 * ZO_OPTIM_NO_GRAD_SKIP (a shard mixes tensors). A checkpoint saved at another world size is resharded at load
 * (zo_part_load()).
 * The collectives: <zoffload/comm_mpi.h> (MPI, host backend) and
 * <zoffload/comm_nccl.h> (NCCL, CUDA backend), header-only, or the
 * framework's own callbacks (the "external" comm).
 *
 * Threads: a zo_part is driven from one thread at a time; the comm
 * callbacks are called from that thread, inside the zo_part call.
 */
#ifndef ZOFFLOAD_PART_H
#define ZOFFLOAD_PART_H

#include "common.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zo_event;

/** zo_comm.all_reduce operations. */
#define ZO_COMM_SUM 0 /**< vals[i] = sum over ranks */
#define ZO_COMM_MAX 1 /**< vals[i] = max over ranks */

/**
 * The collectives of one rank (the "external" comm: the framework's own,
 * e.g. torch.distributed, MPI or NCCL calls behind three callbacks). Fill
 * with zo_comm_default(), then set rank, world, user and the callbacks.
 * The first three callbacks are synchronous: the data is in `buf` when it
 * is called, and the result must be there when it returns; the optional
 * start/wait pairs below let the engine overlap them. `buf` is memory of the
 * engine's device (host memory on the host backend). counts[world] give
 * each rank's chunk, in elements of `dt`, laid out rank 0's first; chunks
 * may be empty (count 0). Return 0, or a negative error code (-errno or a
 * ZO_E* code): the engine's call fails with it.
 * Not owned: read during zo_part_create() (copied).
 */
typedef struct zo_comm {
    size_t struct_size; /**< sizeof(zo_comm), set by zo_comm_default() */
    unsigned rank;      /**< this rank, < world */
    unsigned world;     /**< number of ranks, >= 1 */
    void *user;         /**< passed to every callback */
    /** In place over buf (sum of counts elements): afterwards this rank's
     *  chunk (at element offset counts[0] + ... + counts[rank - 1]) holds the
     *  element-wise sum over the ranks of that chunk; the other chunks are
     *  undefined. */
    int (*reduce_scatter)(void *user, void *buf, const uint64_t *counts, zo_dtype dt);
    /** In place over buf: afterwards every chunk holds its owner's data (this
     *  rank's chunk is its input). */
    int (*all_gather)(void *user, void *buf, const uint64_t *counts, zo_dtype dt);
    /** vals[0..n) (host memory) = the op (ZO_COMM_SUM or ZO_COMM_MAX) over
     *  the ranks, the same bits on every rank. */
    int (*all_reduce)(void *user, double *vals, unsigned n, int op);
    /* ---- optional: asynchronous collectives (all three set, or none) ---- */
    /** Start what reduce_scatter does over buf and return at once, with the
     *  callback's own handle in *req. The engine leaves buf alone until
     *  wait(req) has returned. With these set, up to two gradient buckets
     *  are in flight: the next one fills while the previous one moves
     *  (overlap with backward). Return 0 (then wait is called), or < 0 (the
     *  operation did not start; no wait). */
    int (*reduce_scatter_start)(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req);
    /** Start what all_gather does over buf (as reduce_scatter_start). The
     *  engine starts one per group, over disjoint parts of its buffer. */
    int (*all_gather_start)(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req);
    /** Finish a started operation: the result is in its buf when it returns
     *  0; < 0 (-ETIMEDOUT, -EIO, ...) fails the engine's call. The engine
     *  waits each started request exactly once, in the order started (on
     *  every rank the same order), also after an earlier one failed, so
     *  the callback can free it; after a failure it may return at once. */
    int (*wait)(void *user, void *req);
} zo_comm;

/** Fill *c: rank 0 of world 1, no callbacks. NULL ignored. */
ZO_API void zo_comm_default(zo_comm *c);

typedef struct zo_part zo_part;

/** Configuration of a partitioned engine; fill with zo_part_config_default(). */
typedef struct zo_part_config {
    size_t struct_size;           /**< sizeof(zo_part_config), set by the defaults function */
    const zo_optim_config *optim; /**< template: the whole model (groups with every full tensor: numel,
                                       names, dev_params, required), dtypes, placement, hyperparameters,
                                       clipping, loss scaling, as for a single-rank engine. Read during
                                       create (dev_params are remembered: valid until destroy) */
    const zo_comm *comm;          /**< this rank's collectives (required; callbacks may be NULL only with
                                       world 1) */
    uint64_t bucket_bytes;        /**< gradient bucket (reduce_bucket_size): at most this many bytes of
                                       gradients per reduce-scatter; default 25 MiB, >= 4096 */
} zo_part_config;

/** Fill *cfg with the defaults (no template, no comm, 25 MiB buckets). NULL ignored. */
ZO_API void zo_part_config_default(zo_part_config *cfg);

/**
 * Create this rank's engine: the layout, the inner ::zo_optim of its shards,
 * the flat device params and the gradient bucket (zo_dev_malloc() of the
 * template's device). Not collective (no callback is called). Masters
 * start at zero: zo_part_init_from_device() or zo_part_load() next.
 * @return 0; -EINVAL (NULL, struct_size out of range, no template or comm,
 *         what zo_optim_create() refuses as -EINVAL); ZO_ECONFIG (world 0,
 *         rank >= world, a NULL callback with world > 1, bucket_bytes below
 *         4096, a group without dev_params, a model too small for the world:
 *         the last rank would own nothing; what zo_optim_create() refuses);
 *         ZO_ENOTSUP (dpu_double_buffer, speculative clip mode, ZO_OPTIM_NO_GRAD_SKIP);
 *         -ENOMEM; errors of zo_optim_create() and zo_dev_malloc(). Blocks.
 */
ZO_API int zo_part_create(zo_part **out, const zo_part_config *cfg);

/** Destroy (not collective). NULL (or *p NULL) ok; clears *p. */
ZO_API void zo_part_destroy(zo_part **p);

/** The detail of the latest failed call on p (thread-local copy); "" for NULL. */
ZO_API const char *zo_part_errmsg(const zo_part *p);

/** The inner engine of this rank's shards, for its queries (zo_optim_get_info(),
 *  zo_optim_get_timeline()...). Driving it directly breaks the ranks' agreement:
 *  don't. NULL if p is NULL. */
ZO_API zo_optim *zo_part_optim(zo_part *p);

/**
 * Collective. Masters of this rank's shards from the framework's device
 * params (each tensor copied into the flat buffer, then
 * zo_optim_init_from_device() of the inner engine), then the flat params
 * are all-gathered and copied back to every tensor's dev_params: every
 * rank starts from the shard owners' values even if the ranks' copies
 * differed. Also ends the refusals after a failed collective.
 * @return 0; ZO_ESTATE (gradients handed over in this micro-step); device,
 *         inner engine and collective errors. Blocks.
 */
ZO_API int zo_part_init_from_device(zo_part *p);

/**
 * Hand over the gradient of tensor `index` (global index, as zo_optim
 * numbers them: group 0's tensors first): numel elements of grad_dtype at
 * device pointer dev_grad, valid once `ready` completes (NULL: already
 * valid). The engine copies it into its bucket when the bucket is reduced,
 * which may be in this call (the bucket it completes, and those after it
 * that were waiting) or a later zo_part_grad() / zo_part_step(): dev_grad
 * must stay valid and unchanged until the next zo_part_step() returns.
 * Collective when it reduces buckets: every rank hands over the same
 * tensors per micro-step (in any order).
 * @return 0; -EINVAL (NULL, index out of range); ZO_ESTATE (the tensor was
 *         already handed over in this micro-step; an earlier collective
 *         failed); collective and device errors (the engine then refuses,
 *         see the file comment).
 */
ZO_API int zo_part_grad(zo_part *p, unsigned index, const void *dev_grad, struct zo_event *ready);

/**
 * End of a micro-step, as zo_optim_step(): the buckets not yet reduced are
 * (a tensor without a gradient counts as zero); at an accumulation boundary
 * the global norm and overflow (all-reduce), the inner step, and the
 * all-gather of the updated params into every tensor's dev_params (not
 * after a skipped step: nothing changed). Collective. Blocks until the
 * framework's params are updated. res (may be NULL) gets the inner
 * engine's result: grad_norm is the global norm, clip_coef the
 * coefficient every rank applied.
 * With the template's `dpu` (delayed parameter update, optim.h) the
 * schedule is the single-rank engine's: after the warm-up the inner
 * update of this boundary runs on while the framework's next forward and
 * backward do, and the next boundary's call finishes it and gathers its
 * params (so the forward of step k sees the result of step k - 2); res is
 * then the latest finished update's (boundary 1); at a warm-up boundary
 * it is that boundary's own update's. zo_part_wait() finishes the last
 * one.
 * @return 0; -EINVAL (res->struct_size); ZO_ESTATE (an earlier collective
 *         or update failed); the inner step's errors (ZO_ENONFINITE under
 *         ZO_OPTIM_NONFINITE_ERROR, the same on every rank; store errors);
 *         ZO_ESTATE on the ranks whose update succeeded when another
 *         rank's failed; collective and device errors.
 */
ZO_API int zo_part_step(zo_part *p, zo_optim_step_result *res);

/**
 * Finish the update in flight (the template's `dpu`: delayed parameter
 * update) and all-gather its params into every tensor's dev_params, after
 * an all-reduce of "did my update fail" so no rank waits for another.
 * Without dpu nothing is ever in flight and this returns at once (not
 * collective then). Collective with dpu: every rank calls it, e.g. at the
 * end of training; zo_part_save() and zo_part_push_params() call it
 * themselves. res (may be NULL) gets that update's result.
 * @return 0; -EINVAL (NULL, res->struct_size); ZO_ESTATE (an earlier
 *         collective failed; another rank's update failed); the update's
 *         errors; collective and device errors.
 */
ZO_API int zo_part_wait(zo_part *p, zo_optim_step_result *res);

/**
 * Collective. The masters of this rank's shards cast to the param dtype
 * (zo_optim_push_params() of the inner engine into the flat params), then
 * the flat params all-gathered and copied to every tensor's dev_params:
 * after masters were imported into the inner engine
 * (zo_optim_state_import() through zo_part_optim(): a framework's state
 * dict), the framework's params follow them. A local failure is agreed on
 * (one all-reduce) before the all-gather, so no rank waits for another.
 * @return 0; -EINVAL (NULL); ZO_ESTATE (gradients handed over in this
 *         micro-step; an earlier collective failed; another rank's push
 *         failed); errors of zo_optim_push_params(); collective and device
 *         errors. Blocks.
 */
ZO_API int zo_part_push_params(zo_part *p);

/**
 * The framework moved tensor `index`'s params (its index over all groups,
 * as zo_part_grad() counts) to `dev_param`: a new buffer of the same numel
 * and param dtype on the engine's device. The all-gathers from now on copy
 * the params there (an update in flight under DPU included: its params are
 * gathered into the new address), zo_part_init_from_device() reads them
 * from there. Local, not collective: each rank re-points its own tensors.
 * @return 0; -EINVAL (NULL p or dev_param, index out of range).
 */
ZO_API int zo_part_set_dev_param(zo_part *p, unsigned index, void *dev_param);

/** zo_optim_set_lr() of group `group` (a template group index). @return as zo_optim_set_lr(). */
ZO_API int zo_part_set_lr(zo_part *p, unsigned group, double lr);

/** The loss scale for the next backward (fp16 dynamic scaling: the same on every rank). 0 if NULL. */
ZO_API double zo_part_loss_scale(const zo_part *p);

/**
 * Collective. Save checkpoint `name`: each rank its shard, zo_optim_save()
 * of the inner engine into <root>/rank<r>/<name> (root is created if
 * missing), with a record of the rank, the world size and a fingerprint of
 * the full model's layout beside user_json (NULL or a JSON value, returned
 * by zo_part_load()); then one world commit: when every rank's shard is
 * durable (an all-reduce), rank 0 names `name` in <root>/world.json
 * (written aside, flushed, renamed, the directory flushed), and every
 * rank returns once that is done. A load of the latest takes world.json's
 * name, so a kill -9 of any rank at any moment leaves the previous
 * checkpoint the one loaded (tests: test_part's commit crash test).
 * keep_last counts each rank's checkpoints: 0 keeps all, 1 is refused (a
 * rank would delete its previous shard before the world has the new one).
 * @return 0; -EINVAL (NULL, keep_last 1); ZO_ESTATE (mid accumulation
 *         window; an earlier failure; another rank's shard or the commit
 *         failed: not committed, the previous checkpoint stays the latest);
 *         errors of zo_optim_save(); -errno of mkdir and of the commit file;
 *         collective errors.
 */
ZO_API int zo_part_save(zo_part *p, const char *root, const char *name, unsigned keep_last, const char *user_json);

/**
 * Collective. Load this rank's shard from <root>/rank<r>/<name> (NULL: the
 * latest the world committed, <root>/world.json; a root saved before
 * world commits: each rank's latest, which must be the same checkpoint),
 * then all-gather the params and copy them to every tensor's dev_params.
 * Checked before anything is read: the checkpoint's record must name this
 * rank and world size and the same model layout; the ranks agree on the
 * verdict first, so a rank that cannot load fails every rank (ZO_ESTATE
 * on the others) instead of leaving them in a collective.
 * user_json (if not NULL) receives the caller's JSON given to the save.
 *
 * Saved by another number of ranks (W): resharded, no conversion step.
 * Every old rank's record (<root>/rank<k>/<name>, k < W) is checked first
 * (rank k of W, the same model); then each rank reads the parts of the old
 * shards that overlap its new one (each chunk verified by its checksum)
 * into its masters and states: fp32 and bf16 states widened to fp32,
 * quantized (q8 / q4) ones dequantized with the old group's bits, block
 * and code maps; then stored in this engine's state types a tile of whole
 * blocks of the new layout at a time. Exact when the state types are the
 * same and not quantized (or fp32 into bf16 when the values were bf16); into
 * q8 / q4 states the new blocks are requantized, which is lossy: each value
 * changes by at most the new map's rounding at its new block's scale. It
 * takes the step, counters, loss scaler and hyperparameters
 * of old rank 0's record, rounds its masters into its params and
 * all-gathers them. Every rank reads about 1/world of the checkpoint.
 * A failure after the checks leaves the engine refusing (ZO_ESTATE) until
 * a load or zo_part_init_from_device() succeeds.
 * @return 0; -EINVAL; -ENOENT (no such checkpoint for this rank, and no
 *         rank-0 one either); ZO_EFORMAT (not a zo_part checkpoint,
 *         another rank's, another model; resharding: an old rank's shard
 *         missing or not of this model, or a state tensor that is not
 *         what its record's state type says); ZO_ENOTSUP (resharding a
 *         state stored in another dtype than fp32, bf16, q8 or q4); errors of zo_optim_load() and
 *         zo_ckpt_read(); collective errors.
 */
ZO_API int zo_part_load(zo_part *p, const char *root, const char *name, char *user_json, size_t len);

/** State of this rank. */
typedef struct zo_part_info {
    size_t struct_size;        /**< set by the caller: sizeof(zo_part_info) */
    unsigned rank, world;
    unsigned ntensors;         /**< full tensors (the template's) */
    unsigned nbuckets;         /**< gradient buckets per micro-step */
    uint64_t numel;            /**< elements of the whole model */
    uint64_t shard_numel;      /**< elements this rank owns (over all groups) */
    uint64_t state_host_bytes; /**< this rank's masters and states in host memory (zo_optim_estimate() of
                                    the inner engine: host_state_bytes) */
    uint64_t state_nvme_bytes; /**< this rank's masters and states on NVMe (nvme_state_bytes) */
    uint64_t pinned_bytes;     /**< the inner engine's pinned memory (zo_optim_info.pinned_bytes) */
    uint64_t host_bytes;       /**< other host memory: the inner engine's plus the fp32 shard gradients
                                    and host staging of this layer */
    uint64_t device_bytes;     /**< device memory of this layer: the flat params and the bucket buffer (two
                                    with an asynchronous comm) */
    int64_t step;              /**< updates applied */
    uint64_t reduce_scatters;  /**< buckets reduced, since create */
    uint64_t buckets_in_grad;  /**< of those, reduced inside zo_part_grad() (overlapping backward) */
    uint64_t all_gathers;      /**< all_gather calls, since create */
} zo_part_info;

/** The smallest struct_size accepted by zo_part_get_info(). */
#define ZO_PART_INFO_SIZE_V1 sizeof(zo_part_info)

/** @return 0; -EINVAL (NULL, struct_size below ZO_PART_INFO_SIZE_V1). */
ZO_API int zo_part_get_info(zo_part *p, zo_part_info *info);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_PART_H */
