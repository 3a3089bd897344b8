#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs what no developer machine shows: the library on CPUs it is not on.
# Under qemu-user, on an existing native build (default build/, made by
# scripts/test.sh), for each x86-64 CPU model:
#   Haswell-v4  AVX2 + FMA + F16C, no AVX-512 (the "avx2" variants)
#   Nehalem-v2  SSE4.2 only (scalar kernels, SSE4.2 CRC32C)
#   qemu64      x86-64 v1: no SSE4.2 (scalar everything, software CRC32C)
# it runs zo-info, the dispatch-covering test programs (core, cpuadam,
# optim, swap) and a 3-step zo-train with --verify. On Haswell the
# forced-variant runs (ZO_CPU_MASK) run too: a test that forces a variant the
# emulated CPU lacks must still pass there. A kernel that executes an
# instruction the CPU lacks dies with SIGILL, which qemu reproduces.
#
# qemu-user cannot say anything about speed, and it does not emulate
# AVX-512, mbind or MADV_DONTFORK: the AVX-512 kernels are checked natively
# on AVX-512 machines, and the memory tests (test_mem) are not run here.
#
# Usage: scripts/emulated-check.sh [BUILD_DIR]    (env ZO_EMU_MODELS to pick models)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
models=${ZO_EMU_MODELS:-"Haswell-v4 Nehalem-v2 qemu64"}
jobs=$(nproc)

if ! command -v qemu-x86_64 >/dev/null; then
    echo "emulated-check: qemu-x86_64 not found (Debian: qemu-user)" >&2
    exit 1
fi
if [ "$(uname -m)" != x86_64 ]; then
    echo "emulated-check: the x86-64 models need an x86-64 build; this is $(uname -m)" >&2
    exit 1
fi
for t in tools/zo-info tools/zo-train tests/test_core tests/test_cpuadam tests/test_optim tests/test_swap; do
    if [ ! -x "$build/$t" ]; then
        echo "emulated-check: $build/$t is missing: build first (scripts/test.sh)" >&2
        exit 1
    fi
done

# qemu warns about host CPUID bits TCG does not model; that is not ours.
quiet() { grep -v "TCG doesn't support requested feature" || true; }

fail=0
for cpu in $models; do
    t0=$(date +%s)
    echo "== qemu-x86_64 -cpu $cpu"
    wrap="qemu-x86_64 -cpu $cpu"
    # OpenBLAS (zo-train's GEMM) picks its kernels by CPU vendor and family:
    # qemu64 claims to be an AMD family-6 part, gets OpenBLAS's "Opteron"
    # kernels, which use 3DNow! prefetches that real Opterons have and qemu64
    # does not (SIGILL inside libopenblas). Name the baseline core for it.
    blas_core=()
    [ "$cpu" = qemu64 ] && blas_core=(env OPENBLAS_CORETYPE=Prescott)
    # zo-info: every family lists its variants; the picked one must run here
    if ! $wrap "$build/tools/zo-info" --pin-test 0 2> >(quiet >&2) | sed -n '/^CPU/,/^topology/p' | sed '/^topology/d'; then
        echo "FAIL: zo-info under $cpu" >&2
        fail=1
    fi
    tests=(core swap cpuadam optim optim-json)
    # The forced-variant runs only tell something new where the CPU has more
    # than scalar: on Haswell they force avx512 on a CPU without it.
    [ "$cpu" = Haswell-v4 ] && tests+=(core-mask-avx512 swap-mask-avx512 cpuadam-mask-avx512 cpuadam-mask-scalar)
    if ! meson test -C "$build" --no-rebuild --wrapper "$wrap" --timeout-multiplier 10 \
            --num-processes "$jobs" --print-errorlogs "${tests[@]}" 2>&1 | quiet |
            grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|^>>>|Assertion|FAIL"; then
        echo "FAIL: a test failed under $cpu" >&2
        fail=1
    fi
    # three optimizer steps of the trainer, NVMe offload, replayed in memory
    # and compared bit for bit
    if ! "${blas_core[@]}" $wrap "$build/tools/zo-train" --steps 3 --layers 2 --width 256 --batch 16 --offload nvme \
            --threads 2 --verify --quiet 2> >(quiet >&2) | tail -n 4; then
        echo "FAIL: zo-train under $cpu" >&2
        fail=1
    fi
    echo "-- $cpu: $(($(date +%s) - t0)) s"
done
if [ "$fail" != 0 ]; then
    echo "emulated-check: FAILED" >&2
    exit 1
fi
echo "emulated-check: all models passed"
