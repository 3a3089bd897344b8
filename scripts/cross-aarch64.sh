#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Cross-build zoffload for aarch64 and run what covers its dispatch under
# qemu-aarch64 (user-mode emulation), as CI does:
#   zo-info, the core / cpuadam / optim suites, the CRC and swap tests of
#   the nvme suite, and a 3-step zo-train on NVMe placement with --verify.
# Emulation says nothing about speed (docs/benchmarks.md, "aarch64").
#
# What emulation changes, and why the tests still pass:
#  - qemu-user has no io_uring (ENOSYS): the aio layer takes its thread
#    pool backend, as on an old kernel, and the uring-only tests skip (77).
#  - qemu-user reports no O_DIRECT alignment from statx: I/O is buffered.
#  - qemu-user has no mbind/get_mempolicy (ENOSYS) and accepts madvise()
#    without acting on it: tests/test_mem.c probes both and checks what the
#    library must do there (allocate unbound and say why; MADV_DONTFORK is
#    not checked where the platform ignores it).
#  - qemu's default CPU ("max") has NEON, CRC32, PMULL and SVE, so every
#    kernel runs; ZO_CPU_MASK lowers dispatch to the others.
# Left out for time (each is architecture-independent and runs natively):
# the nvme suite's checkpoint-crash (60 SIGKILLed children, ~2 min here),
# its swap-threads (the emulated swap test already runs on threads) and
# the mask runs that pick the same CRC kernel as another.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps-aarch64.sh
jobs=$(nproc)
build=build-aarch64
start=$(date +%s)

opts=(--cross-file cross/aarch64-linux-gnu.ini -Dcuda=disabled -Dnccl=disabled -Dwerror=true)
meson setup "$build" "${opts[@]}" --reconfigure >/dev/null 2>&1 || meson setup "$build" "${opts[@]}"
meson compile -C "$build" -j "$jobs"
echo "cross build: $(($(date +%s) - start)) s"

# The programs run through qemu-aarch64 with the multiarch libc6:arm64 (the
# cross file says why there is no -L).
qemu-aarch64 "$build/tools/zo-info" --pin-test 1M

meson test -C "$build" --print-errorlogs --num-processes "$jobs" --suite core --suite cpuadam --suite optim
# nvme: every CRC32C variant against the references (swap, and the armv8
# kernel pinned by a mask), the swap store, a full disk and inline checksums
meson test -C "$build" --print-errorlogs --num-processes "$jobs" \
    swap swap-mask-crc32 swap-diskfull swap-csum-inline

# A short run of the main job: NVMe placement, DPU, the optimizer on
# NEON, checked bit for bit against the in-memory run.
qemu-aarch64 "$build/tools/zo-train" --steps 3 --layers 3 --width 256 --batch 16 \
    --offload nvme --dpu on --verify --quiet
echo "aarch64 under qemu: all passed in $(($(date +%s) - start)) s"
