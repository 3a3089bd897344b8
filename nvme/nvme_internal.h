/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme internals: the CRC32C kernel table (run-time dispatch), test hooks
 * and small shared helpers. The extent allocator the swap store carves its
 * arenas with is a platform utility: core/extent.h. Not installed.
 */
#ifndef ZO_NVME_INTERNAL_H
#define ZO_NVME_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <zoffload/swap.h>

/* ---- CRC32C ------------------------------------------------------------------ */
/* Kernels work on the raw CRC register (no pre/post inversion): the public
 * zo_crc32c() inverts around them. */
typedef uint32_t (*zo__crc32c_fn)(uint32_t reg, const uint8_t *p, size_t n);

typedef struct zo__crc_dsp {
    const char *name;
    zo__crc32c_fn crc32c;
} zo__crc_dsp;

/* Lanes of the interleaved kernels and the tables that shift a register
 * over that many zero bytes: shift(x) = t[0][x & 0xff] ^ t[1][(x >> 8) & 0xff]
 * ^ t[2][(x >> 16) & 0xff] ^ t[3][x >> 24]. Built in checksum.c (plain C). */
#define ZO__CRC_LONG 4096
#define ZO__CRC_SHORT 256
typedef struct zo__crc_shift {
    uint32_t t[4][256];
} zo__crc_shift;
extern zo__crc_shift zo__crc_shift_long, zo__crc_shift_short;

static inline uint32_t zo__crc_shift_apply(const zo__crc_shift *s, uint32_t x)
{
    return s->t[0][x & 0xff] ^ s->t[1][(x >> 8) & 0xff] ^ s->t[2][(x >> 16) & 0xff] ^ s->t[3][x >> 24];
}

/* Carry-less folding constants of the VPCLMULQDQ kernel, derived from the
 * polynomial in checksum.c (plain C) before any kernel runs.
 *
 * A 128-bit block T of message (16 bytes, bit-reflected: bit 0 of byte 0
 * is the highest power) is the polynomial T_hi * x^64 + T_lo, T_hi its
 * first eight bytes. Moving it D bits further down the message multiplies
 * it by x^D, and since only the value mod P matters,
 *     T * x^D == T_hi * (x^(D+64) mod P) + T_lo * (x^D mod P).
 * Each product of a 64-bit and a 32-bit polynomial fits in 128 bits, so it
 * can be XORed onto the block that sits D bits later. fold_k(E) is the
 * 64-bit operand that makes PCLMULQDQ's product of a reflected qword by it
 * equal (mod P) that qword times x^E: a reflected product comes out one
 * power high and a 32-bit value in the low half of a reflected qword reads
 * as times x^32, so fold_k(E) = reflect32(x^(E-33) mod P). A pair for
 * distance D is {fold_k(D + 64), fold_k(D)}: the low qword multiplies T_hi,
 * the high one T_lo. */
typedef struct zo__crc_fold {
    uint64_t d2048[2]; /* four 512-bit accumulators, 256 bytes a step */
    uint64_t d1536[2], d1024[2], d512[2]; /* joining them; d512 also one accumulator's step */
    uint64_t d768[2]; /* 256-bit kernel: joining its first accumulator (d1024, d512 and lanes[2..3] too) */
    uint64_t lanes[8]; /* the four 128-bit lanes of one register onto the last: d384, d256, d128, 0 */
} zo__crc_fold;
extern zo__crc_fold zo__crc_fold_k;
/* reflect32(x^(e-33) mod P) as above; e >= 33. */
uint64_t zo__crc_fold_const(unsigned e);

/* Below this many bytes the VPCLMULQDQ kernel hands the buffer to the
 * SSE4.2 one: setting up and reducing four 512-bit accumulators costs
 * about what a crc32q chain spends on 256 bytes. */
#define ZO__CRC_VPCLMUL_MIN 256

/* The table for the given CPU flags (tests pin each variant with it). */
const zo__crc_dsp *zo__crc_dsp_for(unsigned flags);
/* The table for zo_cpu_flags(). */
const zo__crc_dsp *zo__crc_dsp_cur(void);
/* What the VPCLMULQDQ kernels need (crc32q for the ends; 256- or 512-bit
 * folding). The variants form a chain, each needing all of the one before. */
#define ZO__CRC_VPCLMUL256_NEEDS (ZO_CPU_SSE42 | ZO_CPU_AVX2 | ZO_CPU_VPCLMULQDQ)
#define ZO__CRC_VPCLMUL512_NEEDS (ZO__CRC_VPCLMUL256_NEEDS | ZO_CPU_AVX512F)
/* aarch64: the CRC32C instructions; PMULL folding with them at the ends. */
#define ZO__CRC_ARMV8_NEEDS ZO_CPU_ARM_CRC32
#define ZO__CRC_PMULL_NEEDS (ZO_CPU_ARM_CRC32 | ZO_CPU_PMULL)
/* The C reference (slicing-by-8) on the raw register. */
uint32_t zo__crc32c_ref(uint32_t reg, const uint8_t *p, size_t n);

/* Each ISA file gives a constant table and no code that runs before the
 * CPU check (the dispatch rule, docs/architecture.md); checksum.c picks. */
#if defined(__x86_64__)
extern const zo__crc_dsp zo__crc_sse42;      /* x86/crc32c_sse42.c */
extern const zo__crc_dsp zo__crc_vpclmul256; /* x86/crc32c_vpclmul256.c */
extern const zo__crc_dsp zo__crc_vpclmul512; /* x86/crc32c_vpclmul.c */
/* the SSE4.2 kernel, for the folding kernels' ends */
uint32_t zo__crc32c_sse42(uint32_t reg, const uint8_t *p, size_t n);
#elif defined(__aarch64__)
extern const zo__crc_dsp zo__crc_armv8; /* arm/crc32c_armv8.c */
extern const zo__crc_dsp zo__crc_pmull; /* arm/crc32c_pmull.c */
/* the CRC32C instruction kernel, for the PMULL kernel's ends */
uint32_t zo__crc32c_armv8(uint32_t reg, const uint8_t *p, size_t n);
/* Below this many bytes the PMULL kernel hands the buffer to the CRC32C
 * instruction one: the same trade as ZO__CRC_VPCLMUL_MIN (eight
 * accumulators to set up and join), to be confirmed on hardware. */
#define ZO__CRC_PMULL_MIN 256
#endif

/* Checksum of one chunk with the kind's fastest kernel (no argument checks). */
uint64_t zo__csum(zo_csum_kind kind, const void *p, size_t n);

/* ---- fault injection (tests) ------------------------------------------------------ */
/* Called before each chunk's I/O of a swap write or read is queued (write:
 * 1 for a write); a negative return fails the queueing with that error, as
 * a refused zo_aio submission would. fn NULL removes it. Call while nothing
 * is in flight. */
typedef int (*zo__swap_queue_fault_fn)(void *user, int write, uint64_t chunk_idx);
struct zo_swap;
void zo__swap_set_queue_fault(struct zo_swap *s, zo__swap_queue_fault_fn fn, void *user);
/* Called while a swap store creates an arena file (after the file exists,
 * before its space is reserved), in the thread that grows the store, with
 * no lock of the store held; a negative return fails the growth with that
 * error, as a failed fallocate would. Tests use it to hold a growth open
 * and check that the store keeps working meanwhile. fn NULL removes it;
 * set it while no allocation is running. */
typedef int (*zo__swap_grow_hook_fn)(void *user, const char *path);
void zo__swap_set_grow_hook(struct zo_swap *s, zo__swap_grow_hook_fn fn, void *user);

/* Checkpoint commit: called before each step of zo_ckpt_commit() (see the
 * order at the top of ckpt_write.c); a negative return fails that step with
 * that error, the step not done. Process-wide; fn NULL removes it. */
enum {
    ZO__CKPT_F_DATA_SYNC = 0, /* 1. fdatasync of tensors.bin */
    ZO__CKPT_F_MANIFEST,      /* 2. manifest.json written + fsync */
    ZO__CKPT_F_TMPDIR_SYNC,   /* 3. fsync of the temporary directory */
    ZO__CKPT_F_RENAME,        /* 4. rename to <root>/<name> */
    ZO__CKPT_F_ROOT_SYNC,     /* 4. fsync of the root */
    ZO__CKPT_F_LATEST_WRITE,  /* 5. .latest.<host>.<pid> written + fsync */
    ZO__CKPT_F_LATEST_RENAME, /* 5. rename over latest */
    ZO__CKPT_F_LATEST_SYNC,   /* 5. fsync of the root */
    ZO__CKPT_F_UNDO_LATEST,   /* taking back: latest put back as it was */
    ZO__CKPT_F_UNDO_RENAME,   /* taking back: <root>/<name> renamed back */
    ZO__CKPT_F_NSTEPS
};
typedef int (*zo__ckpt_fault_fn)(void *user, int step);
void zo__ckpt_set_fault(zo__ckpt_fault_fn fn, void *user);
/* This host's tag in checkpoint leftovers' names (.tmp-<name>.<host>.<pid>). */
#define ZO__CKPT_HOST_MAX 64
const char *zo__ckpt_host(void);

/* ---- checkpoints (ckpt_*.c) ------------------------------------------------------- */
/* What the checkpoint files share: ckpt_common.c (file helpers),
 * ckpt_root.c (leftovers, latest), ckpt_manifest.c, ckpt_write.c and
 * ckpt_read.c. Defined only where libcjson is (ZO_HAVE_CJSON). */
#define ZO__CKPT_DATA "tensors.bin"
#define ZO__CKPT_MANIFEST "manifest.json"
#define ZO__CKPT_LOCK ".lock"
#define ZO__CKPT_ALIGN 4096u
#define ZO__CKPT_JSON_INT_MAX (1ull << 53) /* integers a JSON double holds exactly */

typedef struct zo__ckpt_tensor {
    zo_ckpt_entry e;
    char *name;
    uint64_t offset, nchunks;
    uint32_t *crc;
    uint8_t *have; /* writer: chunk written */
} zo__ckpt_tensor;

/* cJSON's, zo_aio's and zo_file's types by their struct tags: this header
 * stays free of <cjson/cJSON.h> and <zoffload/aio.h>. */
struct cJSON;
struct zo_file;

struct zo_ckpt_writer {
    char *root, *name, *tmpdir, *final;
    zo_ckpt_options opts;
    struct cJSON *user;
    struct zo_aio *aio, *own_aio;
    struct zo_file *data;
    zo__ckpt_tensor *t;
    unsigned n, cap;
    uint64_t data_end;
    uint64_t sequence;
    int put_started;
    int failed;
    int registered;      /* in the active-writer list (see writer_claim()) */
    int lock_fd;         /* holds the flock on <tmpdir>/.lock (-1: none: the filesystem refused flock) */
    int tmpdir_published; /* a failed commit could not take it back: never remove it */
    dev_t root_dev;
    ino_t root_ino;
    struct zo_ckpt_writer *next_active;
};

struct zo_ckpt_reader {
    char *dir, *name, *libver, *user;
    struct zo_aio *aio;
    struct zo_file *data;
    zo__ckpt_tensor *t;
    unsigned n;
    size_t chunk_size;
    uint64_t sequence;
};

void zo__ckpt_tensors_free(zo__ckpt_tensor *t, unsigned n);

/* ckpt_common.c. Paths are malloc'd ("a/b"); errors are -errno. */
char *zo__ckpt_path_join(const char *a, const char *b);
/* A regular file of at most `max` bytes, NUL-terminated, into *out (freed
 * by the caller); a link, FIFO or larger file is an error. */
int zo__ckpt_read_file(const char *path, char **out, size_t *len, size_t max);
/* Remove a directory of plain files; never follows the name. */
int zo__ckpt_remove_flat_dir(const char *path);
/* 1 if `name` may name a checkpoint. */
int zo__ckpt_name_ok(const char *name);

/* ckpt_root.c */
enum { ZO__CKPT_TMP_LIVE = 0, ZO__CKPT_TMP_ABANDONED = 1, ZO__CKPT_TMP_NOLOCK = 2 };
/* Is the writer of temporary directory `path` alive (ZO__CKPT_TMP_*)? */
int zo__ckpt_tmp_state(const char *path, int *lock_fd);
/* Remove leftovers of this host's dead writers from `root`. */
void zo__ckpt_clean_stale(const char *root);
/* Read <root>/latest: the name, and the crc32c of its manifest (may be NULL). */
int zo__ckpt_read_latest(const char *root, char *name, size_t len, uint32_t *mcrc);

/* ckpt_manifest.c */
struct cJSON *zo__ckpt_manifest_build(zo_ckpt_writer *w);
/* Parse and validate a manifest into r (r->data open: its size is checked). */
int zo__ckpt_manifest_parse(zo_ckpt_reader *r, const char *text, const char *where);

/* ---- helpers ------------------------------------------------------------------- */
/* fsync a directory by path. 0 or -errno. */
int zo__fsync_dir(const char *path);
/* Check a directory meant to hold our files: exists, is a directory and not
 * a symlink, writable, and not writable by others without the sticky bit.
 * 0 or -errno with the detail recorded (eb may be NULL). */
struct zo_errbuf;
int zo__check_dir(struct zo_errbuf *eb, const char *what, const char *path);

#endif /* ZO_NVME_INTERNAL_H */
