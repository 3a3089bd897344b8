/* SPDX-License-Identifier: Apache-2.0 */
/* Logging: a process-wide level and sink. The default sink is stderr, one
 * line per message; the level starts at WARN or at $ZO_LOG. */
#define ZO_MODULE "log"
#include "core/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zoffload/common.h>

static atomic_int log_level = ZO_LOG_WARN;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
/* The sink pair is swapped under a lock so fn and user always match. */
static pthread_mutex_t sink_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static zo_log_fn sink_fn;
static void *sink_user;

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

ZO_API int zo_log_parse_level(const char *s, zo_log_level *out)
{
    if (!s || !out)
        return -EINVAL;
    if (s[0] >= '0' && s[0] <= '5' && s[1] == '\0') {
        *out = (zo_log_level)(s[0] - '0');
        return 0;
    }
    for (int i = 0; i <= ZO_LOG_TRACE; i++) {
        if (!strcasecmp(s, level_names[i])) {
            *out = (zo_log_level)i;
            return 0;
        }
    }
    if (!strcasecmp(s, "warning")) {
        *out = ZO_LOG_WARN;
        return 0;
    }
    return -EINVAL;
}

static void log_init(void)
{
    const char *e = getenv("ZO_LOG");
    zo_log_level lvl;
    if (e && *e) {
        if (zo_log_parse_level(e, &lvl) == 0)
            atomic_store(&log_level, (int)lvl);
        else
            fprintf(stderr, "zoffload: warn: [log] ignoring unknown ZO_LOG=%s\n", e);
    }
}

int zo__log_enabled(zo_log_level lvl)
{
    pthread_once(&log_once, log_init);
    return (int)lvl <= atomic_load_explicit(&log_level, memory_order_relaxed) && lvl != ZO_LOG_OFF;
}

ZO_API void zo_log_set_level(zo_log_level level)
{
    pthread_once(&log_once, log_init);
    if ((int)level < ZO_LOG_OFF)
        level = ZO_LOG_OFF;
    if ((int)level > ZO_LOG_TRACE)
        level = ZO_LOG_TRACE;
    atomic_store(&log_level, (int)level);
}

ZO_API zo_log_level zo_log_get_level(void)
{
    pthread_once(&log_once, log_init);
    return (zo_log_level)atomic_load(&log_level);
}

ZO_API void zo_log_set_callback(zo_log_fn fn, void *user)
{
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_user = user;
    pthread_mutex_unlock(&sink_lock);
}

void zo__vlog(zo_log_level lvl, const char *module, const char *fmt, va_list ap)
{
    char msg[1024];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (n < 0)
        return;
    pthread_mutex_lock(&sink_lock);
    zo_log_fn fn = sink_fn;
    void *user = sink_user;
    if (fn) {
        /* Called under the lock so a concurrent set_callback() cannot free
         * `user` while it is in use. The lock is recursive, so a callback
         * that calls back into the library does not deadlock. */
        fn(user, lvl, module, msg);
    } else {
        fprintf(stderr, "zoffload: %s: [%s] %s\n", level_names[lvl], module, msg);
    }
    pthread_mutex_unlock(&sink_lock);
}

void zo__log(zo_log_level lvl, const char *module, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zo__vlog(lvl, module, fmt, ap);
    va_end(ap);
}
