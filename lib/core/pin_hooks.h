/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How pinned memory reaches a device without lib/core calling lib/dev.
 *
 * zo_pinned_alloc() takes an optional device to register the memory with
 * (zo_pin_opts.dev). lib/core is the layer every module builds on, and lib/dev
 * is built on it; core calling dev's functions made a circle between the two
 * (issue 21: "lib/core must not call lib/dev"). So dev hands core its
 * registration functions, once, in zo_dev_open() (generic code, before any
 * device can exist to be named), and core calls them through this table.
 */
#ifndef ZO_CORE_PIN_HOOKS_H
#define ZO_CORE_PIN_HOOKS_H

#include <stddef.h>

struct zo_dev;

typedef struct zo__pin_hooks {
    int (*host_register)(struct zo_dev *d, void *p, size_t n);
    int (*host_unregister)(struct zo_dev *d, void *p);
    const char *(*errmsg)(const struct zo_dev *d);
} zo__pin_hooks;

/* Install the table (the dev module, at every zo_dev_open: the same
 * constant table each time, so a race between two opens is harmless). */
void zo__pin_hooks_set(const zo__pin_hooks *h);

#endif /* ZO_CORE_PIN_HOOKS_H */
