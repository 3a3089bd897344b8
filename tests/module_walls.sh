#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Walls between the library's modules (issue 21). Each module includes its
# own internal headers, the public headers, and from another module only
# that module's declared doors:
#   core (the base every module builds on): internal.h, list.h, extent.h,
#       fp_convert.h, vec_ref.h and arm/neon_cvt.h (the CPU kernels'
#       conversions), dispatch.h (the kernel families' variant tables);
#       pin_hooks.h for dev alone (core/pin_hooks.h says why)
#   dev: fence.h, for the store's mover
# and lib/core includes no other module at all, public headers of the
# device, store, optimizer, aio, swap, cpuadam and tiling layers included
# (core calling dev made a circle; it now takes dev's registration through
# core/pin_hooks.h). A new reach across a wall fails this test.
# usage: module_walls.sh SOURCE_DIR     exit 0 ok, 1 a wall is crossed
set -euo pipefail
cd "$1"
modules=(lib/core lib/dev lib/store lib/optim aio cpuadam nvme tiling)
door() {  # door MODULE HEADER: may MODULE include HEADER of another module?
    case "$2" in
    core/internal.h|core/list.h|core/extent.h|core/fp_convert.h|core/vec_ref.h|core/arm/neon_cvt.h|core/dispatch.h) return 0 ;;
    core/pin_hooks.h) [ "$1" = lib/dev ] ;;
    dev/fence.h) [ "$1" = lib/store ] ;;
    *) return 1 ;;
    esac
}
bad=0
for m in "${modules[@]}"; do
    own=$(basename "$m")
    while IFS=: read -r file line hdr; do
        top=${hdr%%/*}
        [ "$top" = "$own" ] && continue
        if ! door "$m" "$hdr"; then
            echo "$file:$line: $m includes \"$hdr\" (another module's internals)"
            bad=$((bad + 1))
        fi
    done < <(grep -rnoE '#include "[a-z_]+/[a-z_0-9/]+\.h"' "$m" --include='*.c' --include='*.h' --include='*.cu' |
             sed -E 's/#include "([^"]+)"/\1/')
done
while IFS=: read -r file line hdr; do
    echo "$file:$line: lib/core includes <$hdr> (core is below every other module)"
    bad=$((bad + 1))
done < <(grep -rnoE '#include <zoffload/(dev|store|optim|optim_json|aio|swap|cpuadam|tiling)\.h>' lib/core |
         sed -E 's/#include <([^>]+)>/\1/')
[ $bad -eq 0 ] || { echo "FAIL: $bad include(s) across a module wall"; exit 1; }
echo "module walls: ${#modules[@]} modules, every cross-module include is a declared door"
