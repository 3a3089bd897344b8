/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zoffload version. This is the only place the version is written down:
 * meson.build reads these three lines to version the shared library and the
 * pkg-config file, so bump them here and nowhere else.
 */
#ifndef ZOFFLOAD_VERSION_H
#define ZOFFLOAD_VERSION_H

#define ZO_VERSION_MAJOR 0
#define ZO_VERSION_MINOR 1
#define ZO_VERSION_PATCH 0

/** Version as one comparable integer: major * 10000 + minor * 100 + patch. */
#define ZO_VERSION_NUMBER \
    (ZO_VERSION_MAJOR * 10000 + ZO_VERSION_MINOR * 100 + ZO_VERSION_PATCH)

#endif /* ZOFFLOAD_VERSION_H */
