/* SPDX-License-Identifier: Apache-2.0 */
/* The dW sink pipeline shared by the tiled operators (see tiling_internal.h). */
#define ZO_MODULE "tiling"
#include "tiling/tiling_internal.h"

#include <string.h>

int zo__sinkq_init(zo__sinkq *q, zo_dev *dev, uint64_t buf_bytes, zo_tile_sink_fn fn, void *ctx, zo_errbuf *eb)
{
    memset(q, 0, sizeof(*q));
    q->fn = fn;
    q->ctx = ctx;
    q->dev = dev;
    int r;
    ZO_CHECK(zo_stream_create(dev, &q->stream));
    for (int i = 0; i < 2; i++) {
        r = zo_dev_malloc(dev, (void **)&q->buf[i], (size_t)buf_bytes);
        if (r < 0)
            return ZO_FAIL(eb, r, "gradient tile buffer (%llu bytes): %s", (unsigned long long)buf_bytes,
                           zo_dev_errmsg(dev));
        ZO_CHECK(zo_event_create(dev, &q->done[i]));
        ZO_CHECK(zo_event_create(dev, &q->sunk[i]));
    }
    return 0;
}

void zo__sinkq_fini(zo__sinkq *q)
{
    if (q->stream)
        zo_stream_sync(q->stream);
    for (int i = 0; i < 2; i++) {
        zo_event_destroy(&q->done[i]);
        zo_event_destroy(&q->sunk[i]);
        if (q->buf[i])
            zo_dev_free(q->dev, q->buf[i]);
        q->buf[i] = NULL;
    }
    zo_stream_destroy(&q->stream);
}

void zo__sinkq_reset(zo__sinkq *q)
{
    q->sunk_rec[0] = q->sunk_rec[1] = 0;
    q->has_pending = 0;
}

float *zo__sinkq_buf(zo__sinkq *q, zo_stream *s, unsigned k, int *err)
{
    int i = (int)(k & 1);
    *err = q->sunk_rec[i] ? zo_stream_wait_event(s, q->sunk[i]) : 0;
    return *err < 0 ? NULL : q->buf[i];
}

static int hand_over(zo__sinkq *q, zo_errbuf *eb)
{
    q->has_pending = 0;
    int i = (int)(q->pending_k & 1);
    ZO_CHECK(zo_event_sync(q->done[i]));
    q->pending.dw = q->buf[i];
    q->pending.stream = q->stream;
    int r = q->fn(q->ctx, &q->pending);
    if (r < 0)
        return ZO_FAIL(eb, r, "the gradient sink failed on tile (%u, %u): %s", q->pending.row, q->pending.col,
                       zo_strerror(r));
    /* whatever the sink queued on its stream reads buf[i] until sunk[i] */
    ZO_CHECK(zo_event_record(q->sunk[i], q->stream));
    q->sunk_rec[i] = 1;
    return 0;
}

int zo__sinkq_queued(zo__sinkq *q, zo_stream *s, unsigned k, const zo_tile_grad *g, zo_errbuf *eb)
{
    ZO_CHECK(zo_event_record(q->done[k & 1], s));
    /* the previous tile's gradient is done or nearly: hand it over while
     * this tile's GEMMs run */
    if (q->has_pending)
        ZO_CHECK(hand_over(q, eb));
    q->pending = *g;
    q->pending_k = k;
    q->has_pending = 1;
    return 0;
}

int zo__sinkq_flush(zo__sinkq *q, int deliver, zo_errbuf *eb)
{
    int r = deliver && q->has_pending ? hand_over(q, eb) : 0;
    q->has_pending = 0;
    int r2 = zo_stream_sync(q->stream);
    if (r == 0 && r2 < 0)
        r = ZO_FAIL(eb, r2, "work the gradient sink queued failed: %s", zo_strerror(r2));
    return r;
}
