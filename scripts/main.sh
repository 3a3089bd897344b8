#!/usr/bin/env bash
# Set up and run the main job on its embedded default. Until the trainer
# (zo-train) exists, the main job is the self-check: zo-info reports the
# build, CPU features and chosen kernels, topology, pinned-memory limits
# and device backends.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
meson setup build -Dwerror=true --reconfigure >/dev/null 2>&1 || meson setup build -Dwerror=true
meson compile -C build -j "$(nproc)"
exec ./build/tools/zo-info "$@"
