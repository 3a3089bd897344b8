#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set up and run the main job on its embedded default: zo-train trains an
# MLP (6 layers of 2048, 25 M parameters) whose fp32 masters and AdamW
# states do not fit the device budget it sets itself, through the offload
# optimizer engine: NVMe offload into a temporary directory it removes
# afterwards, delayed parameter update after one warm-up step, about a
# minute. Arguments go to zo-train (--help lists them). zo-info, the
# self-check of the build and the machine, stays in build/tools/zo-info.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
meson setup build -Dwerror=true --reconfigure >/dev/null 2>&1 || meson setup build -Dwerror=true
meson compile -C build -j "$(nproc)"
if [ ! -x ./build/tools/zo-train ]; then
    echo "main.sh: zo-train was not built: it needs OpenBLAS (Debian: libopenblas-dev)" >&2
    exit 1
fi
exec ./build/tools/zo-train "$@"
