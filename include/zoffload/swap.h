/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file swap.h
 * @brief The NVMe tier: checksums, the swap store (preallocated arena files
 *        in one or more directories, an extent allocator, async swap in/out
 *        through the aio engine with a checksum per chunk) and crash-safe
 *        checkpoints.
 *
 * Swap store (zo_swap)
 *   Each swap directory holds arena files `zo-swap.<pid>.<instance>.<n>`,
 *   created mode 0600 with O_EXCL | O_NOFOLLOW and reserved on disk with
 *   fallocate() when they are created or grown, so a full disk fails the
 *   allocation up front rather than a write half way. A store holds each
 *   of its arena files with flock(LOCK_EX) for the file's life; an arena
 *   file nobody holds belongs to a store that is gone (a killed process),
 *   and zo_swap_create() removes such stale files from its directories, so
 *   a restarted process (with the same pid, as pid 1 in a container) just
 *   works. Files another live process holds are never touched. An allocation
 *   (zo_swap_alloc()) is cut into chunks of `chunk_size` bytes; with several
 *   directories chunk i goes to directory ((first + i) mod ndirs), where
 *   `first` rotates from one allocation to the next (so small allocations
 *   spread over the drives too), and one tensor is striped across every
 *   drive. Every chunk written gets a checksum, computed on the source
 *   buffer while its write is in flight; every chunk read is verified in
 *   the destination buffer as soon as its read completes (on a checksum
 *   thread, off the I/O threads; inline when csum_threads is 0), and a
 *   mismatch fails the read with ZO_ECORRUPT whose detail names the tensor,
 *   the byte offset, the arena file and both checksums.
 *   Arena files are removed by zo_swap_destroy() unless `keep_files` is set.
 *
 * Checkpoints (zo_ckpt_*)
 *   A checkpoint is a directory `<root>/<name>` holding `tensors.bin` (every
 *   tensor, 4 KiB aligned) and `manifest.json` (names, dtypes, shapes,
 *   offsets, a CRC32C per chunk, the library version, optional user JSON).
 *   It is written under a temporary name, every file and the directory are
 *   fsynced, then it is renamed into place, and `<root>/latest` is replaced
 *   atomically (write a temporary file, fsync, rename, fsync the root). A
 *   process killed at any moment leaves the previous checkpoint intact and
 *   `latest` pointing to a complete checkpoint; a commit that fails
 *   publishes nothing. Readers validate the manifest and verify every
 *   chunk they read. A root may be shared between machines: temporary names
 *   carry the host name (.tmp-<name>.<host>.<pid>), a writer holds an
 *   flock on a lock file in its temporary directory for its life, and the
 *   clean-up of leftovers touches only names of its own host (see
 *   zo_ckpt_begin()).
 *
 * Thread safety: a zo_swap may be used from any number of threads. A
 * checkpoint writer or reader belongs to one thread at a time.
 */
#ifndef ZOFFLOAD_SWAP_H
#define ZOFFLOAD_SWAP_H

#include <errno.h> /* the -E* codes the functions below document */

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zo_aio;
struct zo_aio_config;

/* ------------------------------------------------------------------------ */
/** @name Checksums */
/**@{*/
typedef enum zo_csum_kind {
    ZO_CSUM_NONE = 0,   /**< no checksums (reads are not verified) */
    ZO_CSUM_CRC32C = 1, /**< CRC32C (Castagnoli), SSE4.2 instruction when the CPU has it */
    ZO_CSUM_XXH3 = 2,   /**< XXH3 64-bit from libxxhash (ZO_ENOTSUP when not built with it) */
} zo_csum_kind;

/**
 * CRC32C (Castagnoli polynomial, reflected, init and final XOR ~0) of n
 * bytes, continuing from `crc` (pass 0 to start; pass a previous result to
 * continue: zo_crc32c(zo_crc32c(0, a, n), b, m) equals the CRC of a||b).
 * zo_crc32c(0, "123456789", 9) == 0xe3069283. buf may be NULL when n is 0.
 * Uses the fastest variant the dispatch mask allows (see cpu.h).
 * Thread-safe, never fails.
 */
ZO_API uint32_t zo_crc32c(uint32_t crc, const void *buf, size_t n);

/** Name of the CRC32C variant the current mask selects: "scalar", "sse42",
 *  "vpclmul256" or "vpclmul512" on x86-64; "scalar", "armv8" or "pmull" on
 *  aarch64. */
ZO_API const char *zo_crc32c_variant(void);

/**
 * The i-th CRC32C variant built into this library, slowest first (0 is
 * "scalar"); `needs` (if not NULL) gets the ZO_CPU_* flags it needs.
 * @return its name, or NULL when i is past the last. Thread-safe.
 */
ZO_API const char *zo_crc32c_variant_at(unsigned i, unsigned *needs);

/**
 * Checksum of n bytes with the given kind, in *out (CRC32C zero-extended).
 * @return 0; -EINVAL (out NULL, buf NULL with n > 0, unknown kind);
 *         ZO_ENOTSUP (XXH3 without libxxhash). ZO_CSUM_NONE gives 0.
 */
ZO_API int zo_checksum(zo_csum_kind kind, const void *buf, size_t n, uint64_t *out);

/** "none", "crc32c", "xxh3"; "?" for an invalid value. */
ZO_API const char *zo_csum_name(zo_csum_kind kind);
/** Parse a name as zo_csum_name() gives it. -EINVAL if unknown. */
ZO_API int zo_csum_parse(const char *s, zo_csum_kind *out);
/** 1 if this build can compute `kind`, else 0. */
ZO_API int zo_csum_available(zo_csum_kind kind);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Swap store */
/**@{*/
typedef struct zo_swap zo_swap;
typedef struct zo_swap_io zo_swap_io;
/** Handle of one allocation in a swap store; 0 is never a valid handle. */
typedef uint64_t zo_swap_id;

#define ZO_SWAP_MAX_DIRS 64
#define ZO_SWAP_NAME_MAX 255 /**< longest allocation name kept (bytes) */

typedef struct zo_swap_config {
    size_t struct_size;       /**< sizeof(zo_swap_config), set by the defaults function */
    const char *const *dirs;  /**< swap directories (required; several = striping); copied */
    unsigned ndirs;           /**< number of entries in dirs, 1..ZO_SWAP_MAX_DIRS */
    uint64_t arena_size;      /**< size of one arena file and growth step, rounded up to whole chunks: a value below chunk_size gives one chunk, so a small run sizes it from what it needs instead of reserving 1 GiB; 1 .. 2^56; default 1 GiB */
    uint64_t reserve;         /**< bytes to reserve per directory at create (fails early if the disk cannot hold them); default 0 */
    uint64_t max_bytes;       /**< cap on arena bytes over all directories; 0 = until a disk is full (default) */
    size_t chunk_size;        /**< stripe unit and checksum granule: power of two >= 4096; default 1 MiB */
    zo_csum_kind checksum;    /**< default ZO_CSUM_CRC32C */
    int keep_files;           /**< keep arena files on destroy (for inspection: nobody holds them then, so the next store created in that directory removes them as stale); default 0 */
    int buffered;             /**< open arenas without O_DIRECT; default 0 */
    struct zo_aio *aio;       /**< engine to use (not owned); NULL: create one from aio_cfg */
    const struct zo_aio_config *aio_cfg; /**< config of the engine created when aio is NULL (NULL = defaults) */
    unsigned csum_threads;    /**< threads computing and verifying checksums off the I/O and calling threads (0: inline); default 1, max 64 */
} zo_swap_config;

/** Fill *cfg with the defaults above (dirs NULL). NULL is ignored. */
ZO_API void zo_swap_config_default(zo_swap_config *cfg);

/**
 * Create a swap store. Each directory must exist, be a directory (not a
 * symlink to one: pass the real path), be writable, and, if others may
 * write to it, have the sticky bit (else a local user could plant files).
 * Stale arena files of stores that are gone (see above) are removed from
 * every directory first. Arena files of `reserve` bytes are created at once
 * when reserve > 0.
 * @return 0; -EINVAL (NULL, no dirs, struct_size not that of a known
 *         zo_swap_config); ZO_ECONFIG (bad chunk size or
 *         arena_size, too many dirs, unknown checksum: detail names the
 *         field); ZO_EBUDGET (reserve in every directory exceeds
 *         max_bytes); ZO_ENOTSUP
 *         (XXH3 without libxxhash); -ENOENT, -ENOTDIR, -ELOOP (symlink),
 *         -EACCES, -EROFS, -EPERM (world-writable without sticky bit);
 *         -ENOSPC (reserve does not fit); errors of zo_aio_create();
 *         -ENOMEM. Blocks (creates files). Thread-safe.
 */
ZO_API int zo_swap_create(zo_swap **out, const zo_swap_config *cfg);

/**
 * Wait for all I/O of the store, close and (unless keep_files) remove its
 * arena files, free everything. NULL ok; clears *s. Handles and
 * zo_swap_io pointers of the store become invalid.
 */
ZO_API void zo_swap_destroy(zo_swap **s);

/** The swap store's last error detail ("" if none): the most recent failure
 *  of any thread using the store. For the detail of your own call's
 *  failure, zo_last_error_detail() (thread local) is exact; this one may
 *  already hold another thread's. Thread-safe: the result is a copy of one
 *  whole message, taken under the message's lock, in a thread-local buffer
 *  that stays valid until this thread next calls zo_swap_errmsg() (NULL
 *  gives "").
 */
ZO_API const char *zo_swap_errmsg(const zo_swap *s);

/** The engine the store uses (its own or the one given). */
ZO_API struct zo_aio *zo_swap_get_aio(zo_swap *s);

/**
 * Reserve space for `bytes` bytes named `name` (for error messages; copied,
 * truncated to ZO_SWAP_NAME_MAX). Arenas grow (fallocate) as needed.
 * Contents read as zeros until written.
 * @return 0 and *id; -EINVAL (bytes 0, NULL); ZO_EBUDGET (max_bytes would be
 *         exceeded); -ENOSPC (a disk is full: nothing was written);
 *         -EFBIG; other -errno of open or fallocate; -ENOMEM. Thread-safe.
 *         Blocks while an arena grows; the store's lock is not held
 *         meanwhile, so I/O, completions and other calls (allocations that
 *         fit the arenas there are included) go on; an allocation that
 *         needs a directory another thread is growing waits for that arena
 *         and looks again.
 */
ZO_API int zo_swap_alloc(zo_swap *s, uint64_t bytes, const char *name, zo_swap_id *id);

/**
 * Give an allocation's space back (reused by later allocations).
 * @return 0; -ENOENT (unknown or freed handle); -EBUSY (I/O in flight on it);
 *         -EINVAL (s NULL).
 */
ZO_API int zo_swap_free(zo_swap *s, zo_swap_id id);

/** Completion callback of a swap I/O: runs on an aio engine thread or one
 *  of the store's checksum threads once every chunk has completed (and, for
 *  reads, been verified); err is 0 or the first error. It must not block;
 *  it may queue more swap I/O. */
typedef void (*zo_swap_cb)(void *user, int err);

/**
 * Queue a write of [off, off+len) of allocation `id` from buf ("swap out").
 * off must be a multiple of the chunk size, and off+len a multiple of it
 * or the allocation's end, so each chunk's checksum covers the whole chunk.
 * Each chunk's checksum is computed from buf right after its write is
 * queued, while the device works, on a checksum thread (in the calling
 * thread if csum_threads is 0); a chunk counts as written once both are
 * done. buf
 * may be any address; buffers aligned to 4096 inside a registered region
 * (zo_swap_register_memory()) are fastest. buf must stay unchanged until
 * completion.
 *
 * Completion: as zo_aio_write(): out != NULL gives a handle to wait for
 * (zo_swap_wait()/zo_swap_test()); else cb (may be NULL: then errors are
 * reported by zo_swap_wait_all()).
 * @return 0 (queued); -EINVAL (range or alignment, NULL buf, len 0);
 *         -ENOENT (unknown handle); -ENOMEM. Thread-safe; does not block
 *         on I/O (it computes the checksums).
 */
ZO_API int zo_swap_write(zo_swap *s, zo_swap_id id, uint64_t off, const void *buf, size_t len, zo_swap_cb cb,
                         void *user, zo_swap_io **out);

/**
 * Queue a read of [off, off+len) of allocation `id` into buf ("swap in"),
 * with the same range rules and completion as zo_swap_write(). Chunks never
 * written are filled with zeros without I/O. Every chunk is verified after
 * its read; the I/O then completes with ZO_ECORRUPT (detail: tensor name,
 * byte offset, arena file, file offset, both checksums) on mismatch, or
 * ZO_ESTATE for a chunk whose last write failed.
 * @return as zo_swap_write().
 */
ZO_API int zo_swap_read(zo_swap *s, zo_swap_id id, uint64_t off, void *buf, size_t len, zo_swap_cb cb, void *user,
                        zo_swap_io **out);

/** Block until io completes; releases it. Returns 0 or its error (detail in
 *  zo_last_error_detail()); -EINVAL (s or io NULL). Only one thread may
 *  wait for a given io. */
ZO_API int zo_swap_wait(zo_swap *s, zo_swap_io *io);
/** Poll io without blocking. @return ZO_PENDING (positive) while it is in
 *  flight (io stays valid); once it has finished, as zo_swap_wait(): 0 or
 *  its (negative) error, and io is released. -EINVAL (s or io NULL).
 *  A finished io's error may be any code, -EBUSY included, so test for
 *  ZO_PENDING, never for an error code. */
ZO_API int zo_swap_test(zo_swap *s, zo_swap_io *io);
/** Wait until no I/O of the store is in flight. Returns 0, or the first
 *  error of an io nobody waited for (since the last call); -EINVAL (NULL). */
ZO_API int zo_swap_wait_all(zo_swap *s);

/**
 * Register [p, p+n) with the store's aio engine (fixed-buffer I/O), e.g. a
 * pinned buffer pool. *registered (may be NULL) as zo_aio_register_region().
 * @return 0 or the zo_aio_register_region() error; -EINVAL (s NULL).
 */
ZO_API int zo_swap_register_memory(zo_swap *s, void *p, size_t n, int *registered);
/** Undo zo_swap_register_memory(p). @return 0; -ENOENT if unknown; -EINVAL
 *  (s NULL). */
ZO_API int zo_swap_unregister_memory(zo_swap *s, void *p);

typedef struct zo_swap_info {
    size_t chunk_size;       /**< stripe unit and checksum granule */
    unsigned ndirs;          /**< swap directories */
    zo_csum_kind checksum;   /**< checksum in use */
    uint32_t io_align;       /**< buffer and offset alignment for direct I/O (4096 or more) */
    int direct;              /**< 1 if the arenas are open with O_DIRECT (0: buffered fallback) */
    char fallback[128];      /**< why O_DIRECT is not used ("" if it is) */
} zo_swap_info;

/** Fill *info. @return 0; -EINVAL (NULL). */
ZO_API int zo_swap_get_info(const zo_swap *s, zo_swap_info *info);

typedef struct zo_swap_stats {
    uint64_t arena_bytes;       /**< bytes reserved in arena files */
    uint64_t arena_files;       /**< arena files open */
    uint64_t allocated_bytes;   /**< bytes held by live allocations (rounded to the alignment) */
    uint64_t allocations;       /**< live allocations */
    uint64_t bytes_written, bytes_read; /**< payload bytes swapped out / in */
    uint64_t chunks_written, chunks_read;
    uint64_t chunks_verified;   /**< chunks whose checksum was checked on read */
    uint64_t chunks_zero;       /**< never-written chunks read as zeros */
    uint64_t corrupt;           /**< checksum mismatches found */
    uint64_t csum_ns;           /**< time spent computing checksums (all threads) */
    uint64_t io_errors;         /**< I/O that failed */
} zo_swap_stats;

ZO_API void zo_swap_get_stats(zo_swap *s, zo_swap_stats *st);

/** Bytes of allocation `id` (0 if unknown). */
ZO_API uint64_t zo_swap_size(zo_swap *s, zo_swap_id id);
/**@}*/

/* ------------------------------------------------------------------------ */
/** @name Checkpoints */
/**@{*/
typedef struct zo_ckpt_writer zo_ckpt_writer;
typedef struct zo_ckpt_reader zo_ckpt_reader;

#define ZO_CKPT_MAX_DIMS 8
#define ZO_CKPT_NAME_MAX 128       /**< longest checkpoint name */
#define ZO_CKPT_FORMAT_VERSION 1   /**< manifest format written by this library */

/** One tensor of a checkpoint. */
typedef struct zo_ckpt_entry {
    const char *name;       /**< unique in the checkpoint, 1..255 bytes */
    zo_dtype dtype;
    unsigned ndim;          /**< 0..ZO_CKPT_MAX_DIMS */
    uint64_t shape[ZO_CKPT_MAX_DIMS];
    uint64_t bytes;         /**< payload bytes (> 0) */
} zo_ckpt_entry;

typedef struct zo_ckpt_options {
    size_t struct_size;     /**< sizeof(zo_ckpt_options), set by the defaults function */
    size_t chunk_size;      /**< checksum granule: power of two >= 4096; default 1 MiB */
    unsigned keep_last;     /**< after commit, delete older checkpoints beyond this many (0 = keep all; default 0) */
    const char *user_json;  /**< JSON value stored under "user" in the manifest (NULL: none); validated */
    struct zo_aio *aio;     /**< engine for the data file (not owned); NULL: a private one */
    int buffered;           /**< write the data file without O_DIRECT; default 0 */
} zo_ckpt_options;

ZO_API void zo_ckpt_options_default(zo_ckpt_options *o);

/**
 * Start checkpoint `name` (letters, digits, '.', '_', '-'; not starting with
 * '.'; at most ZO_CKPT_NAME_MAX) under directory `root` (created if missing,
 * mode 0700). The data goes to `<root>/.tmp-<name>.<host>.<pid>/` (host:
 * the host name, characters other than [A-Za-z0-9_-] replaced by '_'),
 * whose `.lock` the writer holds an flock on until commit or abort.
 * Leftovers of dead writers **of this host** are removed first: a
 * temporary directory whose lock can be taken (or, with no lock file, whose
 * pid is not alive), `.trash-*` and `.latest.*` names whose pid is not
 * alive. Names of other hosts are never touched (a pid or a lock may say
 * nothing about another machine): a host cleans up after itself when it
 * next writes to the root; those of a host that never comes back are to be
 * removed by hand. Names without a host field (older versions) are left
 * alone too.
 * Tensors are then declared with zo_ckpt_add() and their data given with
 * zo_ckpt_put(); zo_ckpt_commit() makes it durable and current.
 * @return 0; -EINVAL (also opts whose struct_size is not that of a known
 *         zo_ckpt_options); ZO_ECONFIG (opts: chunk_size not a power of two in
 *         [4096, 1 GiB]); -EEXIST (a checkpoint of that name exists); -EBUSY
 *         (another writer of this process is writing that name, or a live
 *         process elsewhere holds the lock of our temporary name: another
 *         container with this host name and pid); ZO_ENOTSUP (built without
 *         libcjson); ZO_EFORMAT (user_json not valid JSON); -errno of
 *         mkdir/open (root, temporary directory, lock and data files);
 *         -ENOMEM. Blocks.
 */
ZO_API int zo_ckpt_begin(zo_ckpt_writer **out, const char *root, const char *name, const zo_ckpt_options *opts);

/**
 * Declare a tensor; *index receives its number (0, 1, ...). Space in the
 * data file is laid out in declaration order.
 * @return 0; -EINVAL (bad entry); -EEXIST (duplicate name); ZO_ESTATE
 *         (data was already put: declare every tensor first); -ENOMEM.
 */
ZO_API int zo_ckpt_add(zo_ckpt_writer *w, const zo_ckpt_entry *e, unsigned *index);

/**
 * Write [off, off+len) of tensor `index` from buf. Pieces may come in any
 * order but must be chunk-aligned (off a multiple of the chunk size; len a
 * multiple of it or reaching the tensor's end) and each byte written once.
 * Checksums are computed as the data goes out. Returns when the data is
 * written (not yet synced).
 * @return 0; -EINVAL (range); ZO_ESTATE (already committed/aborted, or
 *         data already put for that chunk); I/O errors (-ENOSPC...).
 */
ZO_API int zo_ckpt_put(zo_ckpt_writer *w, unsigned index, uint64_t off, const void *buf, size_t len);

/**
 * Make the checkpoint durable and current: every tensor must be complete;
 * fsync the data, write and fsync the manifest, fsync the directory, rename
 * it into place, fsync the root, replace `latest` atomically, then prune
 * (keep_last). The writer is freed in every case; *w is cleared.
 *
 * A failed commit publishes nothing: when a step after the rename fails
 * (an fsync of the root, writing or renaming `latest`), the commit takes
 * the checkpoint back (`latest` restored to what it held, the directory
 * renamed back and removed), so `<root>/<name>` does not exist and a retry
 * of the same name works. Only if taking it back fails as well (a second
 * fault) does something stay, and the detail says what: either
 * `<root>/<name>`, complete, that `latest` does not name (a retry of the
 * name then gets -EEXIST; zo_ckpt_open() by name reads it), or, when
 * `latest` could not be put back, the new checkpoint stays current. Errors
 * in pruning (after success) are only logged.
 * @return 0; -EINVAL (NULL); ZO_ESTATE (a tensor incomplete, or an
 *         earlier zo_ckpt_put() failed); -ENOMEM; -errno of fdatasync,
 *         fsync, write, rename (the failing step is named in the detail).
 *         Blocks.
 */
ZO_API int zo_ckpt_commit(zo_ckpt_writer **w);

/** Abandon a checkpoint: remove its temporary directory, free the writer.
 *  NULL ok; clears *w. */
ZO_API void zo_ckpt_abort(zo_ckpt_writer **w);

/**
 * One-call checkpoint of tensors in host memory: begin, add, put, commit.
 * @param data  data[i] holds entries[i].bytes bytes.
 * @return as the calls it makes.
 */
ZO_API int zo_ckpt_save(const char *root, const char *name, const zo_ckpt_entry *entries, const void *const *data,
                        unsigned n, const zo_ckpt_options *opts);

/**
 * Name of the checkpoint `latest` points to, into buf (ZO_CKPT_NAME_MAX+1
 * bytes suffice). @return 0; -ENOENT (no checkpoint yet); ZO_EFORMAT;
 * -ERANGE (buf too small); -errno.
 */
ZO_API int zo_ckpt_latest(const char *root, char *buf, size_t len);

/**
 * Open checkpoint `name` (NULL: the one `latest` points to) and validate
 * its manifest: format, version, field types, sizes, offsets inside the
 * data file, chunk checksum counts. Opening through `latest` also checks
 * the manifest's own CRC32C recorded in `latest`.
 * @return 0; -ENOENT; ZO_EFORMAT (malformed manifest: detail says where);
 *         ZO_EVERSION (written by a newer format); ZO_ECORRUPT (manifest
 *         checksum); ZO_ETRUNC (data file shorter than the manifest says);
 *         ZO_ENOTSUP (no libcjson); -errno; -ENOMEM.
 */
ZO_API int zo_ckpt_open(zo_ckpt_reader **out, const char *root, const char *name);
ZO_API void zo_ckpt_close(zo_ckpt_reader **r);

/** Number of tensors. */
ZO_API unsigned zo_ckpt_count(const zo_ckpt_reader *r);
/** Describe tensor i (name valid until close). -EINVAL if out of range. */
ZO_API int zo_ckpt_get_entry(const zo_ckpt_reader *r, unsigned i, zo_ckpt_entry *e);
/** Index of the tensor called name. -ENOENT if absent; -EINVAL (NULL). */
ZO_API int zo_ckpt_find(const zo_ckpt_reader *r, const char *name, unsigned *index);
/** The checkpoint's name, library version string and user JSON ("" if none). */
ZO_API const char *zo_ckpt_name(const zo_ckpt_reader *r);
ZO_API const char *zo_ckpt_library_version(const zo_ckpt_reader *r);
ZO_API const char *zo_ckpt_user_json(const zo_ckpt_reader *r);
/** The checkpoint's chunk size. */
ZO_API size_t zo_ckpt_chunk_size(const zo_ckpt_reader *r);

/**
 * Read [off, off+len) of tensor i into buf (chunk-aligned as for put),
 * verifying every chunk. @return 0; -EINVAL; ZO_ECORRUPT (detail: tensor,
 * byte offset, checksums); ZO_ETRUNC; -errno.
 */
ZO_API int zo_ckpt_read(zo_ckpt_reader *r, unsigned i, uint64_t off, void *buf, size_t len);

/** Read and verify every chunk of every tensor. @return 0, as zo_ckpt_read(),
 *  or -ENOMEM (its read buffer). */
ZO_API int zo_ckpt_verify(zo_ckpt_reader *r);
/**@}*/

#ifdef __cplusplus
}
#endif

#endif /* ZOFFLOAD_SWAP_H */
