/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Intrusive lists and queues, the one copy every module uses.
 *
 * Why intrusive: the store, the mover, the device backends and the aio
 * engine keep objects on several lists at once (LRU, park list, slot queue,
 * per-stream op queue). With the links inside the object, insert and unlink
 * are O(1) and never allocate, so they cannot fail under a lock and need no
 * walk to find the predecessor. Not installed; not thread safe (callers hold
 * the lock that guards the list).
 */
#ifndef ZO_CORE_LIST_H
#define ZO_CORE_LIST_H

#include <stdbool.h>
#include <stddef.h>

#define zo_container_of(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* ---- doubly linked circular list with a sentinel head --------------------- */
/* An unlinked node points at itself, so zo_list_linked() is a test and
 * zo_list_del() of an unlinked node is harmless. Zero-filled nodes are not
 * valid: call zo_list_init() (or ZO_LIST_INIT) first. */
typedef struct zo_list {
    struct zo_list *prev, *next;
} zo_list;

#define ZO_LIST_INIT(name) {&(name), &(name)}

static inline void zo_list_init(zo_list *n) { n->prev = n->next = n; }
static inline bool zo_list_empty(const zo_list *h) { return h->next == h; }
static inline bool zo_list_linked(const zo_list *n) { return n->next != n; }

static inline void zo__list_insert(zo_list *n, zo_list *prev, zo_list *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}
/* Append at the tail (LRU: most recently used last). */
static inline void zo_list_add_tail(zo_list *h, zo_list *n) { zo__list_insert(n, h->prev, h); }
static inline void zo_list_add_head(zo_list *h, zo_list *n) { zo__list_insert(n, h, h->next); }
/* Unlink and leave the node self-linked (safe on an unlinked node). */
static inline void zo_list_del(zo_list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}
/* Move to the tail of h, whether or not it is on a list now. */
static inline void zo_list_move_tail(zo_list *h, zo_list *n)
{
    zo_list_del(n);
    zo_list_add_tail(h, n);
}
static inline zo_list *zo_list_first(const zo_list *h) { return zo_list_empty(h) ? NULL : h->next; }
static inline zo_list *zo_list_pop_head(zo_list *h)
{
    zo_list *n = zo_list_first(h);
    if (n)
        zo_list_del(n);
    return n;
}

#define zo_list_entry(ptr, type, member) zo_container_of(ptr, type, member)
/* Iterate; the _safe form allows zo_list_del() of the current node. */
#define zo_list_for_each(pos, head) for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)
#define zo_list_for_each_safe(pos, tmp, head) \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); (pos) = (tmp), (tmp) = (pos)->next)

/* ---- singly linked FIFO queue ------------------------------------------- */
/* For work queues that are only pushed at the tail and popped at the head
 * (a stream's op queue, the mover's event queue): one pointer per node. */
typedef struct zo_qnode {
    struct zo_qnode *next;
} zo_qnode;

typedef struct zo_queue {
    zo_qnode *head;
    zo_qnode **tailp; /* &last->next, or &head when empty */
    size_t len;
} zo_queue;

static inline void zo_queue_init(zo_queue *q)
{
    q->head = NULL;
    q->tailp = &q->head;
    q->len = 0;
}
static inline bool zo_queue_empty(const zo_queue *q) { return q->head == NULL; }
static inline void zo_queue_push(zo_queue *q, zo_qnode *n)
{
    n->next = NULL;
    *q->tailp = n;
    q->tailp = &n->next;
    q->len++;
}
static inline zo_qnode *zo_queue_pop(zo_queue *q)
{
    zo_qnode *n = q->head;
    if (n) {
        q->head = n->next;
        if (!q->head)
            q->tailp = &q->head;
        n->next = NULL;
        q->len--;
    }
    return n;
}
static inline zo_qnode *zo_queue_peek(const zo_queue *q) { return q->head; }
/* Move every node of src to the tail of dst, in order; src ends empty. */
static inline void zo_queue_splice(zo_queue *dst, zo_queue *src)
{
    if (!src->head)
        return;
    *dst->tailp = src->head;
    dst->tailp = src->tailp;
    dst->len += src->len;
    zo_queue_init(src);
}
#define zo_queue_entry(ptr, type, member) zo_container_of(ptr, type, member)

#endif /* ZO_CORE_LIST_H */
