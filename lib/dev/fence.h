/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The dev module's door for its neighbours: stream fences. lib/store's
 * mover uses them; nothing else of dev_internal.h is for other modules
 * (tests/module_walls.sh lets lib/store include this header and not that
 * one).
 */
#ifndef ZO_DEV_FENCE_H
#define ZO_DEV_FENCE_H

#include <zoffload/dev.h>

/* A fence: a mark after the work queued on a stream so far, done once that
 * work has run. The store's mover ends each device piece with one and polls
 * it, instead of a stream callback: a callback (cudaStreamAddCallback,
 * deprecated) runs on a driver thread and holds the stream until it
 * returns, so the next copy waited for the mover's lock. A fence never
 * holds the stream.
 *
 * zo__fence_record(): notify (optional) is called once the fence is done,
 * from a backend thread, by backends that learn it without a callback on
 * the stream: the host backend (its stream thread reaches the mark) calls
 * it, CUDA does not (an event has no completion callback): poll there.
 * notify must not block nor call the device API. Errors: -EINVAL (NULL),
 * -ENOMEM, the backend's (ZO_ECUDA). On failure nothing was queued.
 * zo__fence_query(): 0 the work before it ran without error; -EBUSY not
 * yet; else that work's error (host backend: the first error raised on the
 * stream since the previous fence, status function or sync, which it takes;
 * CUDA: the sticky error of the context, ZO_ECUDA). Never blocks. Once it
 * returned something other than -EBUSY it keeps returning that.
 * zo__fence_destroy(): at any time (a pending fence is freed once reached);
 * accepts NULL and clears the pointer. A fence is used by one thread at a
 * time (the store's mover). */
typedef struct zo__fence zo__fence;
int zo__fence_record(zo_stream *s, void (*notify)(void *arg), void *arg, zo__fence **out);
int zo__fence_query(zo__fence *f);
void zo__fence_destroy(zo__fence **fp);

/* Tests: make the next n zo__fence_record() calls on device d fail with err
 * (after the copy they would follow was queued: the case where a piece's
 * copy is in flight and its completion cannot be tracked). */
void zo__dev_fail_fences(zo_dev *d, int n, int err);

#endif /* ZO_DEV_FENCE_H */
