/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file store.h
 * @brief The tiered store: decides where every tensor lives (device, pinned
 *        host, NVMe), moves copies between tiers ahead of need, and keeps
 *        each tier within its byte budget.
 *
 * Tiers and copies
 *   Every registered tensor has a home tier, where its space is reserved
 *   for its whole life (the home copy). zo_store_acquire() makes a copy
 *   resident in the device or host tier and returns its address; the copy
 *   stays cached after zo_store_release() until the space is needed again,
 *   when it is evicted (written back home first if it was modified). A copy
 *   is *absent*, *in flight* (being loaded, or written back) or *resident*;
 *   zo_store_tensor_info() reports each tier's state and reference count.
 *
 * Budgets
 *   Each tier has a byte budget that is never exceeded: the device and host
 *   tiers are one allocation each (device memory from zo_dev_malloc(), pinned
 *   host memory from zo_pinned_alloc()), made at create and carved up by an
 *   extent allocator; the NVMe tier is a zo_swap. Traffic between NVMe and
 *   the device flows through a pool of fixed-size pinned slots, allocated
 *   once, NUMA-local, registered with the aio engine (fixed buffers) and
 *   the device backend: a tensor larger than the pool streams through it in
 *   slot-sized pieces, so pinned memory in use never exceeds
 *   host_bytes + slots * slot_size, whatever the tensor sizes.
 *
 * Prefetch
 *   With trace mode ZO_TRACE_AUTO the store records the order of acquires
 *   in the first iteration (iterations are delimited by zo_store_step()),
 *   then keeps fetching ahead of the recorded order, up to `lookahead`
 *   entries and `prefetch_bytes` bytes not yet used; an iteration whose order
 *   differs from the trace is recorded and replaces it. Eviction picks the
 *   copy whose next use in the trace is farthest (LRU without a trace), and
 *   prefetch never evicts a copy needed sooner than the one it fetches.
 *   zo_store_prefetch() is an explicit hint with the same rules. The trace
 *   also records how long each acquire stays referenced, and a copy is
 *   placed where the tensors held with it fit beside it, so tensors
 *   acquired together (an optimizer's master, m and v) fit in a cache of
 *   their summed sizes, whatever their sizes (docs/store.md).
 *
 * Streams and group sweeps
 *   zo_store_stream_open() walks one tensor in slot-sized pieces through
 *   reserved pool slots with read-ahead and write-behind.
 *   zo_store_sweep_open() walks an ordered list of groups of tensors (an
 *   optimizer's (master, m, v) sub-groups, element sizes free) in element
 *   lockstep inside one slot reservation, reading sub-group i+1 and i+2
 *   while i is updated and i-1 written back: the optimizer step.
 *
 * Thread safety: a zo_store may be used from any number of threads. One
 * mover thread runs every transfer; completion callbacks only queue events
 * for it. A stream or a sweep belongs to one thread at a time.
 */
#ifndef ZOFFLOAD_STORE_H
#define ZOFFLOAD_STORE_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zo_dev;
struct zo_swap;

typedef enum zo_tier {
    ZO_TIER_DEVICE = 0, /**< device memory (zo_dev) */
    ZO_TIER_HOST = 1,   /**< pinned host memory */
    ZO_TIER_NVME = 2,   /**< the swap store */
    ZO_TIER_COUNT = 3
} zo_tier;

/** "device", "host", "nvme"; "?" if invalid. */
ZO_API const char *zo_tier_name(zo_tier t);
/** Parse a tier name. -EINVAL if unknown. */
ZO_API int zo_tier_parse(const char *s, zo_tier *out);

typedef struct zo_store zo_store;
typedef struct zo_tensor zo_tensor;
typedef struct zo_store_req zo_store_req;
typedef struct zo_store_stream zo_store_stream;

/** Trace modes. */
typedef enum zo_trace_mode {
    ZO_TRACE_OFF = 0,  /**< no trace: LRU eviction, explicit prefetch only */
    ZO_TRACE_AUTO = 1, /**< record, replay with prefetch, re-record on change */
} zo_trace_mode;

typedef struct zo_store_config {
    size_t struct_size;      /**< sizeof(zo_store_config), set by the defaults function */
    struct zo_dev *dev;      /**< device backend (not owned); NULL: no device tier */
    uint64_t device_bytes;   /**< device tier budget (0: no device tier) */
    uint64_t host_bytes;     /**< pinned host tier budget (0: no host tier) */
    struct zo_swap *swap;    /**< NVMe tier (not owned); NULL: no NVMe tier */
    uint64_t nvme_bytes;     /**< NVMe tier budget (0: as much as the swap store gives) */
    size_t slot_size;        /**< pinned pool slot, a multiple of the swap chunk size; default 4 MiB */
    unsigned slots;          /**< pool slots; default 16 (0 with no NVMe tier and no device tier is allowed) */
    int numa_node;           /**< node for pinned memory; -1 (default): the device's node, else none */
    unsigned pin_flags;      /**< ZO_PIN_* flags for the host tier and the pool; default ZO_PIN_HUGE */
    zo_trace_mode trace;     /**< default ZO_TRACE_AUTO */
    unsigned lookahead;      /**< trace entries fetched ahead; default 4 */
    uint64_t prefetch_bytes; /**< cap on prefetched bytes not yet used, per tier; default: half the tier budget */
} zo_store_config;

/** Fill *cfg with the defaults above. NULL is ignored. */
ZO_API void zo_store_config_default(zo_store_config *cfg);

/**
 * Create a store: allocates the device and host tier arenas and the slot
 * pool, registers pinned memory with the swap store's aio engine and the
 * device, starts the mover thread.
 * @return 0; -EINVAL (out NULL; numa_node names no node; struct_size not
 *         that of a known zo_store_config); ZO_ECONFIG
 *         (device_bytes without dev, slot_size not a multiple of the swap
 *         chunk size, no tier at all, NVMe without slots...: detail names
 *         the field); -ENOMEM (pinned or device memory could not be had);
 *         ZO_ECUDA; with ZO_PIN_REQUIRE in pin_flags, ZO_EBUDGET or the
 *         mlock/registration error of zo_pinned_alloc(); an error of
 *         zo_aio_register_region() (pinned memory registered with the swap
 *         store's engine); -EAGAIN (thread). Blocks (allocates and pins
 *         memory).
 */
ZO_API int zo_store_create(zo_store **out, const zo_store_config *cfg);

/**
 * Wait for every transfer, free the tiers, the pool and every tensor
 * (their handles become invalid). Dirty copies are not written back (call
 * zo_store_flush() first to keep them in their home tier). Outstanding
 * requests, streams and sweeps must have been waited for / closed. NULL ok; clears *s.
 */
ZO_API void zo_store_destroy(zo_store **s);

/** The store's last error detail ("" if none).
 *  Thread-safe: the handle's threads may be recording a failure at the same
 *  time; the result is a copy of one whole message, in a thread-local buffer
 *  that stays valid until this thread next calls zo_store_errmsg() (NULL gives "").
 */
ZO_API const char *zo_store_errmsg(const zo_store *s);

/* ---- tensors ------------------------------------------------------------------ */
#define ZO_TENSOR_MAX_DIMS 8
#define ZO_TENSOR_NAME_MAX 255

typedef struct zo_tensor_desc {
    size_t struct_size;  /**< sizeof(zo_tensor_desc), set by the defaults function */
    const char *name;    /**< unique, 1..ZO_TENSOR_NAME_MAX bytes; copied */
    zo_dtype dtype;      /**< default ZO_DTYPE_F32 */
    unsigned ndim;       /**< 0..ZO_TENSOR_MAX_DIMS */
    uint64_t shape[ZO_TENSOR_MAX_DIMS];
    uint64_t bytes;      /**< payload bytes; 0: product of shape x dtype size */
    zo_tier home;        /**< where its space lives for good; default ZO_TIER_NVME */
} zo_tensor_desc;

ZO_API void zo_tensor_desc_default(zo_tensor_desc *d);

/**
 * Register a tensor: reserves its space in the home tier (contents zero).
 * @return 0; -EINVAL (bad name, bytes 0, shape/bytes mismatch, struct_size
 *         not that of a known zo_tensor_desc); -EEXIST
 *         (name taken); ZO_ECONFIG (home tier not configured); ZO_EBUDGET
 *         (home tier full of home copies and referenced copies); -ENOSPC
 *         (disk full); -ENOMEM. Blocks (may wait for evictions).
 */
ZO_API int zo_store_register(zo_store *s, const zo_tensor_desc *d, zo_tensor **out);

/**
 * Unregister a tensor and free all its copies. *t is cleared. Blocks while
 * transfers of it (a prefetch, a write-back) finish. A tensor in a
 * zo_store_checkpoint() or zo_store_restore() that is running is refused
 * with -EBUSY, not waited for (those calls use it until they return); so
 * is a referenced or streamed one. On -EBUSY the tensor stays registered
 * and usable, *t unchanged.
 * @return 0; -EINVAL (NULL); -EBUSY (referenced, being acquired, streamed,
 *         in a checkpoint being written, or being restored).
 */
ZO_API int zo_store_unregister(zo_store *s, zo_tensor **t);

/** Find a tensor by name. @return 0; -ENOENT if none; -EINVAL (NULL). */
ZO_API int zo_store_find(zo_store *s, const char *name, zo_tensor **out);

typedef enum zo_copy_state {
    ZO_COPY_ABSENT = 0,   /**< no copy in that tier */
    ZO_COPY_INFLIGHT = 1, /**< being loaded or written back */
    ZO_COPY_RESIDENT = 2, /**< present and current */
} zo_copy_state;

typedef struct zo_tensor_info {
    const char *name;    /**< valid while the tensor is registered */
    zo_dtype dtype;
    unsigned ndim;
    uint64_t shape[ZO_TENSOR_MAX_DIMS];
    uint64_t bytes;
    zo_tier home;
    zo_copy_state state[ZO_TIER_COUNT]; /**< per tier */
    unsigned refs[ZO_TIER_COUNT];       /**< references held per tier */
    int dirty[ZO_TIER_COUNT];           /**< copy newer than the home copy */
} zo_tensor_info;

/** Snapshot of t's state. @return 0; -EINVAL (NULL). */
ZO_API int zo_store_tensor_info(zo_store *s, const zo_tensor *t, zo_tensor_info *info);

/* ---- acquire / release ---------------------------------------------------------- */
#define ZO_ACQ_WRITE (1u << 0)   /**< the caller will modify the copy (it becomes the only current one) */
#define ZO_ACQ_DISCARD (1u << 1) /**< contents not needed: no load (implies WRITE) */

/**
 * Make t resident in `tier` (device or host) and take a reference on that
 * copy. The returned request is a future: wait for it with
 * zo_store_wait() (which yields the address) or poll with zo_store_test().
 * The copy cannot be evicted while referenced.
 *
 * With ZO_ACQ_WRITE, the other tiers must not hold references (they would
 * read stale data): -EBUSY otherwise; copies in other tiers become stale
 * and are dropped. A WRITE future completes once no transfer still reads
 * the copy (e.g. a write-back).
 * @return 0 (queued; *out set); -EINVAL (NVMe tier has no address, NULL);
 *         ZO_ECONFIG (tier not configured); ZO_EBUDGET (the tensor cannot
 *         fit: referenced and home copies fill the tier); -EBUSY (see
 *         WRITE; or held for writing in another tier; or a stream is open
 *         on it); -ENOMEM. Does not block on I/O. Thread-safe.
 */
ZO_API int zo_store_acquire(zo_store *s, zo_tensor *t, zo_tier tier, unsigned flags, zo_store_req **out);

/**
 * Block until the request completes and release it. On success *ptr (may
 * be NULL) is the copy's address (device pointer for the device tier).
 * Time blocked is counted as stall time. On failure no reference is held.
 * @return 0, or the transfer's error (ZO_ECORRUPT, -EIO, ZO_EBUDGET...);
 *         -EINVAL (s or r NULL).
 */
ZO_API int zo_store_wait(zo_store *s, zo_store_req *r, void **ptr);
/**
 * Poll a request without blocking. While it has not completed: returns
 * ZO_PENDING (positive; r stays valid, *ptr set to NULL). Once it has: as
 * zo_store_wait() (0 or the transfer's negative error, which may be any
 * code, -EBUSY included), and r is released: do not test it again.
 * @return ZO_PENDING; 0; the transfer's error; -EINVAL (s or r NULL).
 */
ZO_API int zo_store_test(zo_store *s, zo_store_req *r, void **ptr);

/** Flags for zo_store_release(). */
#define ZO_REL_WRITEBACK (1u << 0) /**< start writing a modified copy back home now */
#define ZO_REL_DROP (1u << 1)      /**< free the copy once unreferenced (after write-back) */

/**
 * Drop a reference taken by a completed acquire.
 * @return 0; -EINVAL (also unknown flags: the reference is kept); ZO_ESTATE
 * (no reference held in that tier).
 */
ZO_API int zo_store_release(zo_store *s, zo_tensor *t, zo_tier tier, unsigned flags);

/**
 * Hint that t will be acquired in `tier` soon: loads it in the background
 * if that fits without evicting anything needed sooner. Never fails for
 * lack of room (the hint is dropped and counted).
 * @return 0; -EINVAL; ZO_ECONFIG.
 */
ZO_API int zo_store_prefetch(zo_store *s, zo_tensor *t, zo_tier tier);

/**
 * Write modified copies back to their home tier (t NULL: every tensor) and
 * wait. Copies stay resident and clean.
 * @return 0 or the first write-back error; -EINVAL (s NULL). Blocks.
 */
ZO_API int zo_store_flush(zo_store *s, zo_tensor *t);

/* ---- trace ------------------------------------------------------------------------ */
/**
 * Mark an iteration boundary. The first call ends the recording of the
 * trace; later calls compare the iteration that ended with the trace and
 * adopt it if its order differed.
 * @return 0, -EINVAL.
 */
ZO_API int zo_store_step(zo_store *s);
/** Forget the trace and start recording again (also switches mode).
 *  @return 0; -EINVAL (s NULL, unknown mode). */
ZO_API int zo_store_set_trace(zo_store *s, zo_trace_mode mode);

/* ---- streams ------------------------------------------------------------------------ */
#define ZO_STREAM_READ (1u << 0)  /**< load each piece before it is handed out (read-ahead) */
#define ZO_STREAM_WRITE (1u << 1) /**< write each piece home after zo_store_stream_done() (write-behind) */

/** One slot-sized piece of a stream. */
typedef struct zo_store_piece {
    void *host;     /**< pinned slot memory holding the piece */
    uint64_t off;   /**< offset in the tensor */
    size_t len;     /**< bytes (0: end of the tensor) */
    unsigned index; /**< piece number */
} zo_store_piece;

/**
 * Open a stream over t: pieces of slot_size bytes, `depth` (>= 1) of them
 * loaded ahead. Reserves depth+1 slots (depth+2 with WRITE) for its life.
 * READ loads from the freshest copy wherever it is; WRITE writes each piece
 * to the home copy and drops cached copies (they would be stale); WRITE
 * without READ hands out pieces with undefined contents, to be filled.
 * @return 0; -EINVAL (NULL, mode 0 or unknown bits, depth 0 or > 1024);
 *         ZO_ECONFIG (no pool); -EBUSY (depth needs more slots than the
 *         pool has less one; not enough unreserved slots; t held for
 *         writing, a write stream open on it, or being unregistered; and
 *         with WRITE: t referenced, streamed, transfers of it in flight, or
 *         a checkpoint being written); -ENOMEM. Does not block.
 */
ZO_API int zo_store_stream_open(zo_store *s, zo_tensor *t, unsigned mode, unsigned depth, zo_store_stream **out);
/**
 * Next piece, in order; blocks until it is loaded (stall time counted).
 * At the end p->len is 0.
 * @return 0; the stream's first transfer error, a load's or a
 *         write-behind's (ZO_ECORRUPT, -EIO...); ZO_ESTATE (more pieces held
 *         than depth: call zo_store_stream_done() first); -EINVAL (NULL).
 */
ZO_API int zo_store_stream_next(zo_store_stream *st, zo_store_piece *p);
/** Done with a piece: WRITE queues its write-back; the slot is reused after.
 *  Errors of the write-back surface in zo_store_stream_next() and _close().
 *  @return 0; -EINVAL (NULL, or p is not a piece this stream handed out
 *  and still holds). */
ZO_API int zo_store_stream_done(zo_store_stream *st, const zo_store_piece *p);
/** Wait for write-behind, release the slots, free. Returns the first error
 *  of the stream's transfers. NULL ok; clears *st. */
ZO_API int zo_store_stream_close(zo_store_stream **st);

/* ---- group sweeps ------------------------------------------------------------------------ */
/*
 * A sweep walks an ordered list of groups once. A group is n tensors with
 * the same element count (element sizes may differ: an fp32 master with
 * bf16 m and v); every piece covers the same element range
 * [elem_off, elem_off + nelem) of each tensor of its group, so the tensors
 * stay in step whatever their dtypes. The sweep holds one fixed slot
 * reservation for its whole life and reads ahead across group boundaries:
 * the next group's first pieces load while the caller updates this group's
 * last ones and the previous ones write back. It is the NVMe step of an
 * offload optimizer: one sweep per step over every sub-group.
 *
 * Tensors homed in the host tier are not copied: their piece pointers point
 * into the home copy, and writes land there directly. Every other tensor
 * goes through pool slots (read from its freshest copy, written back to its
 * home), so the same loop serves host and NVMe placement.
 */
#define ZO_SWEEP_MAX_TENSORS 8 /**< tensors per group, at most */

typedef struct zo_store_sweep zo_store_sweep;

/** What a sweep walks. Fill with zo_store_sweep_desc_default() first. */
typedef struct zo_store_sweep_desc {
    size_t struct_size;               /**< sizeof(zo_store_sweep_desc), set by the defaults function */
    unsigned ntensors;                /**< tensors per group, 1..ZO_SWEEP_MAX_TENSORS; default 1 */
    unsigned mode[ZO_SWEEP_MAX_TENSORS]; /**< per position in the group: ZO_STREAM_READ and/or
                                           ZO_STREAM_WRITE; default READ|WRITE */
    size_t ngroups;                   /**< groups, walked in order (>= 1) */
    zo_tensor *const *tensors;        /**< ngroups * ntensors handles, group after group:
                                           tensors[g * ntensors + k] is position k of group g */
    unsigned depth;                   /**< pieces loaded ahead of the one handed out, counted as wide as
                                           the widest position; 1..64, default 2. With narrower positions
                                           (fp32 master, bf16 m and v) open reads more pieces ahead and
                                           writes more back at once, so as many bytes are in flight, when
                                           the free slots allow it with pieces as large and no more slots
                                           than all-widest positions would take (docs/store.md, "Depth by
                                           bytes"); zo_store_sweep_get_info() reports the depth used. At
                                           most `depth` pieces may be held at once. */
    uint64_t piece_elems;             /**< most elements per piece; 0 (default): the largest the slot
                                           reservation allows (>= 1 MiB per tensor piece when it can) */
    unsigned max_slots;               /**< most pool slots to reserve; 0 (default): what the layout
                                           needs, at most the unreserved slots less one */
    unsigned depth_elem_bytes;        /**< bytes of one element that `depth` is counted in; 0 (default):
                                           the widest position's size times the slot-backed positions.
                                           A caller that moves part of each element outside the sweep
                                           (the optimizer's quantized m and v beside a master-only
                                           sweep) passes the bytes a full sweep would carry (12: fp32
                                           master, m and v), so as many bytes are in flight as there
                                           (depth by bytes, under the same slot limits) */
} zo_store_sweep_desc;

/** Fill *d with the defaults above. NULL is ignored. */
ZO_API void zo_store_sweep_desc_default(zo_store_sweep_desc *d);

/** One piece of a sweep: the same element range of every tensor of a group. */
typedef struct zo_store_sweep_piece {
    size_t group;       /**< index of the group */
    uint64_t elem_off;  /**< first element of the piece in the group's tensors */
    uint64_t nelem;     /**< elements in the piece (0: the sweep is over) */
    uint64_t index;     /**< piece number in the sweep, from 0 */
    int group_last;     /**< 1 on the last piece of its group */
    void *ptr[ZO_SWEEP_MAX_TENSORS]; /**< per position: element elem_off of that tensor (host memory) */
} zo_store_sweep_piece;

/** A sweep's layout, fixed at open. */
typedef struct zo_store_sweep_info {
    uint64_t piece_elems;   /**< elements per piece (the last piece of a group may be shorter) */
    uint64_t pieces;        /**< pieces in the whole sweep */
    unsigned depth;         /**< pieces loaded ahead (the desc's depth, deeper by bytes when narrower positions allow) */
    unsigned frames;        /**< pieces the sweep can have in flight at once (loading, held, writing) */
    unsigned slots;         /**< pool slots reserved (0 if every tensor is homed in the host tier) */
    unsigned slots_peak;    /**< most slots it has held at once (never above slots) */
} zo_store_sweep_info;

/**
 * Open a sweep. Checks every group, claims every tensor (as a stream would:
 * acquires with WRITE are refused while it is open, and with a WRITE
 * position any acquire of that tensor), and reserves the pool slots for its
 * whole life. Pieces are cut in elements: as large as the reservation
 * allows for `depth` pieces ahead plus the one held (plus the one writing
 * back with a WRITE position), keeping each piece a multiple of the swap
 * chunk. A group is given back (its tensors usable again) as soon as its
 * last piece is done and written. A tensor homed in the host tier whose
 * home copy is stale (a newer device copy) is flushed first.
 * @return 0; -EINVAL (NULL, ntensors 0 or > ZO_SWEEP_MAX_TENSORS, ngroups
 *         0, a mode 0 or with unknown bits, depth 0 or > 64, a NULL tensor,
 *         tensors of one group with different element counts, a tensor
 *         whose bytes are not a whole number of elements, a tensor listed
 *         twice in the sweep; struct_size of a different version: detail
 *         names the field); ZO_ECONFIG (a tensor needs pool slots and the
 *         store has none; or slot_size is below chunk * widest / narrowest
 *         element size: a piece starts on a swap chunk of every tensor, so
 *         with 1 MiB chunks, fp32 next to bf16 needs slots of 2 MiB); -EBUSY (not enough unreserved slots for even the
 *         smallest pieces; a tensor held for writing, referenced (with a
 *         WRITE position), streamed, being unregistered, or in a checkpoint
 *         being written (WRITE)); -ENOMEM; errors of zo_store_flush().
 *         Blocks while the tensors' background transfers finish and while
 *         stale host-homed tensors are flushed.
 */
ZO_API int zo_store_sweep_open(zo_store *s, const zo_store_sweep_desc *d, zo_store_sweep **out);

/**
 * Next piece, in order (group by group, element range by element range);
 * blocks until every tensor of it is loaded (stall time counted). At the
 * end p->nelem is 0. Up to `depth` pieces may be held at once.
 * @return 0; the sweep's first transfer error (a read's or a write-back's:
 *         ZO_ECORRUPT, -EIO...; detail names the tensor and offset);
 *         ZO_ESTATE (depth pieces held: call zo_store_sweep_done() first);
 *         -EINVAL (NULL).
 */
ZO_API int zo_store_sweep_next(zo_store_sweep *sw, zo_store_sweep_piece *p);

/**
 * Done with a piece: the WRITE positions of it are written back (slot
 * backed tensors; host-homed ones were written in place) and its slots are
 * reused for the pieces ahead. Pieces may be done in any order.
 * @return 0; -EINVAL (NULL, or p is not a piece this sweep handed out and
 *         still holds). Does not block; write-back errors surface in
 *         zo_store_sweep_next() and zo_store_sweep_close().
 */
ZO_API int zo_store_sweep_done(zo_store_sweep *sw, const zo_store_sweep_piece *p);

/** Layout and slot use of a sweep. @return 0; -EINVAL (NULL). */
ZO_API int zo_store_sweep_get_info(zo_store_sweep *sw, zo_store_sweep_info *info);

/**
 * Finish a sweep, also in the middle: pieces still held count as done
 * (written back), loads ahead are waited for and dropped, groups never
 * reached keep their contents. Releases the slots and every tensor; frees.
 * Blocks until the write-backs finish. NULL ok; clears *sw.
 * @return 0 or the first error of the sweep's transfers. A WRITE group the
 *         error hit has undefined contents in the pieces not written.
 */
ZO_API int zo_store_sweep_close(zo_store_sweep **sw);

/* ---- tier sizing ------------------------------------------------------------------------ */
/** Bytes a device or host tier needs for a set of tensors. */
typedef struct zo_store_tier_need {
    uint64_t exact;      /**< the tier budget that holds all of them at once in an empty tier
                              (each one rounded to the tier's allocation granule) */
    uint64_t any_layout; /**< a budget that lets them be acquired one after another, in the order
                              given, each kept referenced, whatever the free space looks like
                              (other copies unreferenced): the fragmentation headroom included,
                              whatever placed the other copies. With ZO_TRACE_AUTO a cache that
                              groups acquired together pass through (no home copies in the tier)
                              needs `exact` of the largest group: placement keeps room for a
                              group beside its first copy (docs/store.md, headroom) */
} zo_store_tier_need;

/**
 * How many bytes `tier` (ZO_TIER_DEVICE or ZO_TIER_HOST) needs for the n
 * tensors described (usable before zo_store_create(): set host_bytes or
 * device_bytes from it). cfg may be NULL (defaults). A desc's bytes or
 * shape and dtype give its size, as in zo_store_register().
 * @return 0; -EINVAL (NULL out, n > 0 with descs NULL, a NULL desc, a desc
 *         whose size is 0 or does not match its shape, tier not DEVICE or
 *         HOST; struct_size mismatch).
 */
ZO_API int zo_store_tier_bytes_needed(const zo_store_config *cfg, zo_tier tier, const zo_tensor_desc *const *descs,
                                      size_t n, zo_store_tier_need *out);

/* ---- host copies and checkpoints ------------------------------------------------------ */
/**
 * Copy len bytes at offset off of t's current contents (wherever they are)
 * into dst, through the pool. Blocks. off and len need no alignment.
 * @return 0; -EINVAL (NULL, or [off, off + len) not inside t); ZO_ECONFIG
 *         (fewer than 3 pool slots: none to stream through); -EBUSY (t held
 *         for writing, written by a write stream or zo_store_write(), or
 *         being unregistered: the call does not wait for those); -ENOMEM;
 *         transfer errors (ZO_ECORRUPT, -EIO...).
 */
ZO_API int zo_store_read(zo_store *s, zo_tensor *t, uint64_t off, void *dst, size_t len);
/**
 * Write len bytes from src at offset off of t (into its home copy; cached
 * copies are dropped). Unaligned ranges read-modify-write the pieces they
 * touch. Blocks. The bytes outside the range keep their contents, even
 * when another thread writes the tensor in the meantime; on an error the
 * pieces the range touches are undefined.
 * @return as zo_store_read() (ZO_ECONFIG below 4 slots); -EBUSY also when
 *         t is referenced, streamed (zo_store_read() too) or a checkpoint
 *         is being written; write-back errors of the flush that comes first.
 */
ZO_API int zo_store_write(zo_store *s, zo_tensor *t, uint64_t off, const void *src, size_t len);

/**
 * Write a consistent checkpoint of n tensors (n 0 and ts NULL: every
 * registered tensor) to <root>/<name>, wherever their current copies live,
 * through the pool (see zo_ckpt_begin() and zo_ckpt_commit() for the
 * format and guarantees: a failed call publishes nothing). Writers are
 * kept out while it runs (acquire with ZO_ACQ_WRITE, zo_store_write() and
 * write streams return -EBUSY), and its tensors cannot be unregistered
 * (-EBUSY) until it returns. keep_last as zo_ckpt_options. user_json (any
 * JSON value: step counters, hyperparameters) may be NULL; it comes back
 * from zo_store_restore2(). Blocks; thread-safe (one checkpoint per store
 * at a time).
 * @return 0; -EINVAL (NULL, or ts holds a pointer that is not a tensor of
 *         this store); ZO_ECONFIG (no pool); -EBUSY (a tensor is held for
 *         writing, being unregistered or being restored, or another
 *         checkpoint is being written); -EEXIST (<root>/<name> exists);
 *         ZO_EFORMAT (user_json is not JSON); ZO_ENOTSUP (no libcjson);
 *         -ENOMEM; the other errors of zo_ckpt_begin(), zo_ckpt_put() and
 *         zo_ckpt_commit() (-ENOSPC, -EIO...); errors of the transfers
 *         (ZO_ECORRUPT, -EIO...).
 */
ZO_API int zo_store_checkpoint(zo_store *s, const char *root, const char *name, zo_tensor *const *ts, unsigned n,
                               unsigned keep_last, const char *user_json);

/** zo_store_restore_options.flags: read and verify every checksum of the
 *  checkpoint before any tensor is written (the checkpoint is read twice). */
#define ZO_RESTORE_VERIFY_FIRST (1u << 0)

typedef struct zo_store_restore_options {
    size_t struct_size; /**< sizeof(zo_store_restore_options), set by the defaults function */
    unsigned flags;     /**< ZO_RESTORE_VERIFY_FIRST; default 0 (one read) */
} zo_store_restore_options;

/** Fill *o with the defaults (flags 0). NULL is ignored. */
ZO_API void zo_store_restore_options_default(zo_store_restore_options *o);

/**
 * Load checkpoint `name` (NULL: latest) of `root` into the registered
 * tensors of the same names (into their home copies; cached copies are
 * dropped), and hand back the checkpoint's user JSON.
 *
 * Every tensor of the checkpoint must be registered with the same byte
 * size and dtype, and be unreferenced, not streamed, not being
 * unregistered and not in another restore; this is checked for all of
 * them before any is written (-ENOENT / ZO_EFORMAT / -EBUSY: then no
 * tensor was changed). While the call runs its tensors cannot be
 * unregistered (-EBUSY); the caller must not acquire them either (an
 * acquire meanwhile makes the restore fail with -EBUSY at that tensor,
 * see below).
 *
 * The data is read once: each piece is read into a pool slot, its chunks'
 * checksums verified there, and only then written home. Tensors are loaded
 * one after the other in the checkpoint's order (zo_ckpt_get_entry()
 * index). **A failure while loading (ZO_ECORRUPT, -EIO, a write-back
 * error...) leaves the tensors before the failing one restored, the
 * failing one partly loaded (its contents undefined: a mix of the
 * checkpoint's pieces that passed and older data; a piece that failed its
 * checksum is never written), and the ones after it untouched**; the
 * detail names the tensor and says which. Keeping every tensor untouched
 * would need a second copy of the checkpoint's data (unbounded memory):
 * ZO_RESTORE_VERIFY_FIRST instead verifies the whole checkpoint first, at
 * the cost of reading it twice, so a damaged checkpoint changes nothing
 * (an I/O error during the second read still leaves the state above).
 *
 * Blocks, also while background transfers of the tensors finish and pool
 * slots that other streams hold come free (do not call it with a stream
 * open). Thread-safe.
 * @param opts       NULL: defaults.
 * @param user_json  NULL, or receives on success a copy of the
 *                   checkpoint's user JSON ("" if it has none; release it
 *                   with free()); set to NULL on failure.
 * @return 0; -EINVAL (NULL s or root; opts->struct_size not that of a
 *         known version; unknown flags; a name that is not a checkpoint
 *         name); ZO_ECONFIG (no pool, or the checkpoint's chunk size does
 *         not divide slot_size); -ENOENT (no checkpoint, or one of its
 *         tensors is not registered); ZO_EFORMAT (size or dtype mismatch;
 *         malformed manifest or latest); ZO_EVERSION; ZO_ETRUNC; -EBUSY (see
 *         above; also a checkpoint being written); ZO_ECORRUPT (a chunk or
 *         the manifest failed its checksum); ZO_ENOTSUP (no libcjson);
 *         -ENOMEM; -errno of reading the checkpoint; errors of the
 *         transfers (-EIO, -ENOSPC...).
 */
ZO_API int zo_store_restore2(zo_store *s, const char *root, const char *name, const zo_store_restore_options *opts,
                             char **user_json);

/**
 * zo_store_restore2(s, root, name, NULL, NULL): one read, no user JSON back.
 * @return as zo_store_restore2().
 */
ZO_API int zo_store_restore(zo_store *s, const char *root, const char *name);

/* ---- statistics ---------------------------------------------------------------------- */
typedef struct zo_store_stats {
    uint64_t budget[ZO_TIER_COUNT];  /**< configured bytes per tier */
    uint64_t used[ZO_TIER_COUNT];    /**< bytes held by copies now */
    uint64_t peak[ZO_TIER_COUNT];    /**< high-water mark of used */
    uint64_t moved[ZO_TIER_COUNT][ZO_TIER_COUNT]; /**< bytes moved [from][to] */
    uint64_t demand_bytes;           /**< bytes loaded because an acquire needed them */
    uint64_t prefetch_bytes;         /**< bytes loaded ahead of need */
    uint64_t hits, misses;           /**< acquires that found a resident / in-flight copy vs had to load */
    /** Prefetch loads started; acquires that found a prefetched copy; hints
     *  dropped (no room without evicting what is needed sooner); prefetched
     *  copies evicted for room before their use (the thrash counter: a copy
     *  whose data was rewritten or whose tensor was unregistered first is
     *  not counted). */
    uint64_t prefetch_issued, prefetch_used, prefetch_dropped, prefetch_wasted;
    uint64_t evictions, writebacks, writeback_bytes;
    uint64_t stalls;                 /**< waits that blocked */
    uint64_t stall_ns;               /**< time blocked in zo_store_wait / stream_next */
    uint64_t trace_len, trace_records, trace_mismatches;
    size_t pool_slots, pool_slot_size;
    size_t pool_in_use, pool_peak;   /**< slots */
    uint64_t pinned_bytes;           /**< pinned memory the store holds (host tier + pool) */
    int pool_locked;                 /**< 1 if the pool is page-locked (else the OS refused: see zo_pinned_stats) */
    int pool_aio_fixed;              /**< 1 if the pool is registered with the aio engine as fixed buffers */
    int pool_dev_registered;         /**< 1 if the pool is registered with the device backend */
    uint64_t frag_failures;          /**< acquires refused although the bytes fit (fragmentation) */
} zo_store_stats;

ZO_API void zo_store_get_stats(zo_store *s, zo_store_stats *st);
/** Zero the counters (not the budgets, usage or trace). */
ZO_API void zo_store_reset_stats(zo_store *s);

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_STORE_H */
