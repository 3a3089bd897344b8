/* SPDX-License-Identifier: Apache-2.0 */
/* The aio guide's complete example (docs/aio.md): write a buffer to a file
 * and read it back through the engine, with a registered pinned buffer, an
 * unaligned offset and length, all three completion styles, and every
 * error checked. Built and run by the test suite: `aio_example [DIR]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        int rc_ = (call);                                                                           \
        if (rc_ < 0) {                                                                              \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, zo_strerror(rc_), zo_last_error_detail()); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static void on_done(void *user, int64_t result)
{
    /* runs on an engine thread: no blocking here */
    int *ok = user;
    *ok = result >= 0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/var/tmp";
    char path[4096];
    snprintf(path, sizeof(path), "%s/aio_example.%d.dat", dir, (int)getpid());

    /* 1. the file: O_DIRECT where the filesystem allows it */
    zo_file *f = NULL;
    CHECK(zo_file_open(&f, path, ZO_FILE_READ | ZO_FILE_WRITE | ZO_FILE_CREATE | ZO_FILE_TRUNC));
    zo_file_info fi;
    CHECK(zo_file_get_info(f, &fi));
    printf("%s: %s (offsets aligned to %u, buffers to %u)%s%s\n", path, fi.direct ? "O_DIRECT" : "buffered",
           fi.offset_align, fi.mem_align, fi.fallback[0] ? ": " : "", fi.fallback);
    CHECK(zo_file_allocate(f, 0, 8u << 20)); /* a full disk shows up now, not mid-write */

    /* 2. the engine: io_uring when usable, else a pread/pwrite pool */
    zo_aio_config cfg;
    zo_aio_config_default(&cfg);
    cfg.threads = 2;
    cfg.queue_depth = 16;
    cfg.block_size = 1u << 20;
    zo_aio *a = NULL;
    CHECK(zo_aio_create(&a, &cfg));
    zo_aio_info info;
    CHECK(zo_aio_get_info(a, &info));
    printf("engine: %s %s\n", zo_aio_backend_name(info.backend), info.ring_setup);

    /* 3. pinned memory, registered once: fixed-buffer I/O inside it */
    size_t n = 4u << 20;
    uint8_t *pool = NULL;
    CHECK(zo_pinned_alloc((void **)&pool, 2 * n, NULL));
    int registered = 0;
    CHECK(zo_aio_register_region(a, pool, 2 * n, &registered));
    printf("fixed buffers: %s\n", registered ? "yes" : "no (unregistered I/O)");

    /* 4. write 3 MiB + 13 bytes at an unaligned offset, and wait. The
     * buffer address and the file offset agree modulo the alignment
     * (both end in ...7), so all but the unaligned head and tail go direct */
    size_t len = (3u << 20) + 13;
    uint64_t off = 4096 + 7;
    uint8_t *src = pool + 7;
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 131 + 7);
    zo_aio_req *req = NULL;
    CHECK(zo_aio_write(a, f, src, len, off, NULL, NULL, &req));
    int64_t result = 0;
    CHECK(zo_aio_wait(a, req, &result)); /* releases req */

    /* 5. read it back with a callback, plus a fire-and-forget read */
    int ok = 0;
    uint8_t *back = pool + n + 7;
    CHECK(zo_aio_read(a, f, back, len, off, on_done, &ok, NULL));
    CHECK(zo_aio_read(a, f, back + len, 100, off, NULL, NULL, NULL));
    CHECK(zo_aio_wait_all(a)); /* first fire-and-forget error, if any */
    if (!ok || memcmp(src, back, len) != 0 || memcmp(src, back + len, 100) != 0) {
        fprintf(stderr, "read back differs\n");
        return 1;
    }

    /* 6. past the end of the file: ZO_ETRUNC, never a silent short read */
    CHECK(zo_file_truncate(f, off + len));
    CHECK(zo_aio_read(a, f, back, 4096, off + len - 10, NULL, NULL, &req));
    int rc = zo_aio_wait(a, req, NULL);
    printf("read past the end: %s (%s)\n", zo_strerror(rc), zo_aio_errmsg(a));
    if (rc != ZO_ETRUNC)
        return 1;

    zo_aio_stats st;
    zo_aio_get_stats(a, &st);
    printf("%llu bytes written, %llu read, %llu chunks (%llu fixed-buffer, %llu direct)\n",
           (unsigned long long)st.bytes_written, (unsigned long long)st.bytes_read, (unsigned long long)st.chunks,
           (unsigned long long)st.fixed_chunks, (unsigned long long)st.direct_chunks);

    /* 7. tear down: regions, engine (drains anything left), memory, file */
    CHECK(zo_aio_unregister_region(a, pool));
    zo_aio_destroy(&a);
    zo_pinned_free(pool);
    CHECK(zo_file_sync(f));
    zo_file_close(&f);
    unlink(path);
    return 0;
}
