/* SPDX-License-Identifier: Apache-2.0 */
/* Small helpers: sysfs text files, cpulists. */
#define ZO_MODULE "core"
#include "core/internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int zo__read_text(const char *path, char *buf, size_t len)
{
    if (!buf || len == 0)
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t off = 0;
    while (off + 1 < len) {
        ssize_t n = read(fd, buf + off, len - 1 - off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = -errno;
            close(fd);
            return e;
        }
        if (n == 0)
            break;
        off += (size_t)n;
    }
    close(fd);
    buf[off] = '\0';
    while (off && (buf[off - 1] == '\n' || buf[off - 1] == ' '))
        buf[--off] = '\0';
    return (int)off;
}

int zo__parse_cpulist(const char *s, int *ids, int max)
{
    if (!s)
        return -EINVAL;
    int count = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p || a < 0)
            return -EINVAL;
        long b = a;
        p = end;
        if (*p == '-') {
            p++;
            b = strtol(p, &end, 10);
            if (end == p || b < a)
                return -EINVAL;
            p = end;
        }
        for (long c = a; c <= b; c++) {
            if (count < max && ids)
                ids[count] = (int)c;
            count++;
        }
        if (*p == ',')
            p++;
        else if (*p != '\0' && *p != '\n')
            return -EINVAL;
        else
            break;
    }
    return count;
}
