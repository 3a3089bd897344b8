#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Fails if the shared library exports any symbol not starting with "zo_"
# (internal helpers are "zo__" and must stay hidden too).
lib="$1"
bad=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | grep -v '^zo_[a-z0-9]' )
if [ -n "$bad" ]; then
    echo "symbols exported without the zo_ prefix (or internal zo__):"
    echo "$bad"
    exit 1
fi
n=$(nm -D --defined-only "$lib" | awk '$2 != "A"' | wc -l)
echo "$n exported symbols, all zo_*"
[ "$n" -gt 0 ]
