/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo_file: a file opened for O_DIRECT where the filesystem allows it, with
 * a second, buffered descriptor of the same inode for the parts of a
 * request that cannot go direct (an unaligned head or tail, an unaligned
 * buffer). The kernel keeps the page cache coherent with direct I/O: a
 * direct read writes back dirty cached pages of its range first, a direct
 * write invalidates them. Because the alignment unit is at least the page
 * size, a direct piece and a buffered piece of two different requests never
 * share a page unless their byte ranges overlap.
 */
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "aio_internal.h"

#include <zoffload/mem.h>

#define FILE_FLAGS_ALL                                                                                   \
    (ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_CREATE | ZO_FILE_TRUNC | ZO_FILE_EXCL | ZO_FILE_BUFFERED | \
     ZO_FILE_REQUIRE_DIRECT | ZO_FILE_NOFOLLOW)

#define ZO_DIRECT_MIN_ALIGN 4096u

static _Atomic uint64_t next_file_id = 1;
static _Atomic int fallback_warned;

static uint32_t max_u32(uint32_t a, uint32_t b)
{
    return a > b ? a : b;
}

/* Alignment for direct I/O on fd: statx(STATX_DIOALIGN) when the kernel and
 * filesystem report it, else the block size (BLKSSZGET for block devices,
 * st_blksize otherwise). Offsets and lengths never below 4096 nor the page
 * size; returns 0 and leaves *off_align 0 when the file cannot do direct
 * I/O at all (statx says so). */
static void dio_alignment(int fd, const struct stat *st, uint32_t *off_align, uint32_t *mem_align)
{
    uint32_t page = (uint32_t)zo_page_size();
    uint32_t floor_align = max_u32(ZO_DIRECT_MIN_ALIGN, page);
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0) {
            *off_align = 0;
            *mem_align = 0;
            return;
        }
        *off_align = max_u32(floor_align, sx.stx_dio_offset_align);
        *mem_align = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : 512;
        return;
    }
#endif
    uint32_t bs = 0;
    if (S_ISBLK(st->st_mode)) {
        int lbs = 0;
        if (ioctl(fd, BLKSSZGET, &lbs) == 0 && lbs > 0)
            bs = (uint32_t)lbs;
    }
    if (!bs && st->st_blksize > 0)
        bs = (uint32_t)st->st_blksize;
    if (!bs || !ZO_IS_POW2(bs))
        bs = floor_align;
    *off_align = max_u32(floor_align, bs);
    /* without statx, the only safe buffer alignment is the block size */
    *mem_align = max_u32(512, bs);
}

static const char *fs_name(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return "unknown filesystem";
    switch ((unsigned long)sf.f_type) {
    case 0x01021994: return "tmpfs";
    case 0x858458f6: return "ramfs";
    case 0x794c7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    case 0x9123683e: return "btrfs";
    case 0xef53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x2fc12fc1: return "zfs";
    case 0x62656572: return "sysfs";
    case 0x9fa0: return "proc";
    default: return "this filesystem";
    }
}

static void report_fallback(zo_file *f)
{
    if (!atomic_exchange(&fallback_warned, 1))
        ZO_LOGW("%s: %s (buffered I/O; later fallbacks are logged at info level)", f->path, f->fallback);
    else
        ZO_LOGI("%s: %s (buffered I/O)", f->path, f->fallback);
}

ZO_API int zo_file_open(zo_file **out, const char *path, unsigned flags)
{
    if (out)
        *out = NULL;
    if (!out || !path || !*path)
        return ZO_FAIL(NULL, -EINVAL, "zo_file_open: %s is NULL or empty", !out ? "out" : "path");
    if (flags & ~FILE_FLAGS_ALL)
        return ZO_FAIL(NULL, -EINVAL, "zo_file_open(%s): unknown flag bits 0x%x", path, flags & ~FILE_FLAGS_ALL);
    if (!(flags & (ZO_FILE_READ | ZO_FILE_WRITE)))
        return ZO_FAIL(NULL, -EINVAL, "zo_file_open(%s): neither ZO_FILE_READ nor ZO_FILE_WRITE given", path);
    if ((flags & ZO_FILE_TRUNC) && !(flags & ZO_FILE_WRITE))
        return ZO_FAIL(NULL, -EINVAL, "zo_file_open(%s): ZO_FILE_TRUNC needs ZO_FILE_WRITE", path);
    if ((flags & ZO_FILE_BUFFERED) && (flags & ZO_FILE_REQUIRE_DIRECT))
        return ZO_FAIL(NULL, -EINVAL, "zo_file_open(%s): ZO_FILE_BUFFERED and ZO_FILE_REQUIRE_DIRECT together", path);

    size_t plen = strlen(path);
    zo_file *f = calloc(1, sizeof(*f) + plen + 1);
    if (!f)
        return ZO_FAIL(NULL, -ENOMEM, "zo_file_open(%s): out of memory", path);
    memcpy(f->path, path, plen + 1);
    f->fd = f->bfd = -1;
    f->readable = !!(flags & ZO_FILE_READ);
    f->writable = !!(flags & ZO_FILE_WRITE);

    int acc = f->readable && f->writable ? O_RDWR : f->writable ? O_WRONLY : O_RDONLY;
    int of = acc | O_CLOEXEC;
    if (flags & ZO_FILE_CREATE)
        of |= O_CREAT;
    if (flags & ZO_FILE_TRUNC)
        of |= O_TRUNC;
    if ((flags & ZO_FILE_EXCL) && (flags & ZO_FILE_CREATE))
        of |= O_EXCL;
    if (flags & ZO_FILE_NOFOLLOW)
        of |= O_NOFOLLOW;

    int rc = 0;
    /* The buffered descriptor first: it carries the create/truncate flags,
     * so a refused O_DIRECT cannot leave a half-done create behind.
     * O_NONBLOCK until the type is checked: opening a FIFO for reading
     * would otherwise wait for a writer forever. */
    f->bfd = open(path, of | O_NONBLOCK, 0600);
    if (f->bfd < 0) {
        rc = -errno;
        if (rc == -ELOOP && (flags & ZO_FILE_NOFOLLOW))
            ZO_FAIL(NULL, rc, "open %s: the last component is a symbolic link (ZO_FILE_NOFOLLOW)", path);
        else
            ZO_FAIL(NULL, rc, "open %s: %s", path, strerror(-rc));
        goto fail;
    }
    struct stat st;
    if (fstat(f->bfd, &st) != 0) {
        rc = -errno;
        ZO_FAIL(NULL, rc, "fstat %s: %s", path, strerror(-rc));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = ZO_FAIL(NULL, -EISDIR, "open %s: is a directory", path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
        rc = ZO_FAIL(NULL, -EINVAL, "open %s: not a regular file or block device", path);
        goto fail;
    }
    /* back to blocking: io_uring completes I/O on an O_NONBLOCK file with
     * -EAGAIN instead of waiting for it */
    int fl = fcntl(f->bfd, F_GETFL);
    if (fl < 0 || fcntl(f->bfd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        rc = -errno;
        ZO_FAIL(NULL, rc, "fcntl %s: %s", path, strerror(-rc));
        goto fail;
    }

    f->fd = f->bfd;
    f->offset_align = f->mem_align = 1;
    if (flags & ZO_FILE_BUFFERED) {
        snprintf(f->fallback, sizeof(f->fallback), "buffered I/O asked for (ZO_FILE_BUFFERED)");
    } else {
        uint32_t oa = 0, ma = 0;
        dio_alignment(f->bfd, &st, &oa, &ma);
        if (!oa) {
            snprintf(f->fallback, sizeof(f->fallback), "O_DIRECT not supported by %s (statx reports no DIO alignment)",
                     fs_name(f->bfd));
        } else {
            /* Reopen the same open file (not the path, which could have been
             * replaced) with O_DIRECT; the path is the fallback when /proc is
             * not mounted, checked to be the same inode. */
            char self[64];
            snprintf(self, sizeof(self), "/proc/self/fd/%d", f->bfd);
            int dfd = open(self, acc | O_CLOEXEC | O_DIRECT);
            if (dfd < 0 && (errno == ENOENT || errno == EACCES)) {
                dfd = open(path, acc | O_CLOEXEC | O_DIRECT | ((flags & ZO_FILE_NOFOLLOW) ? O_NOFOLLOW : 0));
                struct stat st2;
                if (dfd >= 0 && (fstat(dfd, &st2) != 0 || st2.st_ino != st.st_ino || st2.st_dev != st.st_dev)) {
                    close(dfd);
                    dfd = -1;
                    errno = ESTALE;
                }
            }
            if (dfd >= 0) {
                f->fd = dfd;
                f->direct = 1;
                f->offset_align = oa;
                f->mem_align = ma;
            } else {
                int e = errno;
                snprintf(f->fallback, sizeof(f->fallback), "O_DIRECT refused by %s: %s", fs_name(f->bfd), strerror(e));
            }
        }
        if (!f->direct) {
            if (flags & ZO_FILE_REQUIRE_DIRECT) {
                rc = ZO_FAIL(NULL, ZO_ENOTSUP, "open %s: %s and ZO_FILE_REQUIRE_DIRECT was given", path, f->fallback);
                goto fail;
            }
            report_fallback(f);
        }
    }
    f->id = atomic_fetch_add(&next_file_id, 1);
    ZO_LOGD("opened %s: %s, offset align %u, memory align %u", path, f->direct ? "direct" : "buffered",
            f->offset_align, f->mem_align);
    *out = f;
    return 0;

fail:
    if (f->fd >= 0 && f->fd != f->bfd)
        close(f->fd);
    if (f->bfd >= 0)
        close(f->bfd);
    free(f);
    return rc;
}

ZO_API void zo_file_close(zo_file **pf)
{
    if (!pf || !*pf)
        return;
    zo_file *f = *pf;
    *pf = NULL;
    /* Rings hold a reference to registered files: drop them so the file is
     * really closed (and a deleted file's space freed) now. */
    zo__aio_forget_file(f->id);
    if (f->fd != f->bfd)
        close(f->fd);
    close(f->bfd);
    free(f);
}

ZO_API int zo_file_get_info(zo_file *f, zo_file_info *info)
{
    if (!f || !info)
        return ZO_FAIL(NULL, -EINVAL, "zo_file_get_info: NULL argument");
    memset(info, 0, sizeof(*info));
    info->direct = f->direct;
    info->offset_align = f->offset_align;
    info->mem_align = f->mem_align;
    snprintf(info->fallback, sizeof(info->fallback), "%s", f->fallback);
    struct stat st;
    if (fstat(f->bfd, &st) != 0)
        return ZO_FAIL(NULL, -errno, "fstat %s: %s", f->path, strerror(errno));
    if (S_ISBLK(st.st_mode)) {
        uint64_t bytes = 0;
        if (ioctl(f->bfd, BLKGETSIZE64, &bytes) == 0)
            info->size = bytes;
    } else {
        info->size = (uint64_t)st.st_size;
    }
    return 0;
}

ZO_API const char *zo_file_path(const zo_file *f)
{
    return f ? f->path : "";
}

ZO_API int zo_file_allocate(zo_file *f, uint64_t offset, uint64_t len)
{
    if (!f || len == 0 || offset > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - offset)
        return ZO_FAIL(NULL, -EINVAL, "zo_file_allocate(%s, offset %llu, len %llu): bad arguments",
                       f ? f->path : "NULL", (unsigned long long)offset, (unsigned long long)len);
    if (!f->writable)
        return ZO_FAIL(NULL, -EBADF, "zo_file_allocate(%s): not open for writing", f->path);
    if (fallocate(f->bfd, 0, (off_t)offset, (off_t)len) != 0) {
        int e = errno;
        if (e == EOPNOTSUPP)
            return ZO_FAIL(NULL, -EOPNOTSUPP, "fallocate %s: not supported by %s (nothing reserved)", f->path,
                           fs_name(f->bfd));
        return ZO_FAIL(NULL, -e, "fallocate %s offset %llu len %llu: %s", f->path, (unsigned long long)offset,
                       (unsigned long long)len, strerror(e));
    }
    return 0;
}

ZO_API int zo_file_truncate(zo_file *f, uint64_t size)
{
    if (!f || size > (uint64_t)INT64_MAX)
        return ZO_FAIL(NULL, -EINVAL, "zo_file_truncate: bad arguments");
    if (!f->writable)
        return ZO_FAIL(NULL, -EBADF, "zo_file_truncate(%s): not open for writing", f->path);
    if (ftruncate(f->bfd, (off_t)size) != 0)
        return ZO_FAIL(NULL, -errno, "ftruncate %s to %llu: %s", f->path, (unsigned long long)size, strerror(errno));
    return 0;
}

ZO_API int zo_file_sync(zo_file *f)
{
    if (!f)
        return ZO_FAIL(NULL, -EINVAL, "zo_file_sync: NULL file");
    /* One inode: fdatasync through either descriptor flushes the dirty
     * pages written through the buffered one and the device cache. */
    if (fdatasync(f->bfd) != 0)
        return ZO_FAIL(NULL, -errno, "fdatasync %s: %s", f->path, strerror(errno));
    return 0;
}
