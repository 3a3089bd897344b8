#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set up and run every test, as CI does: a -Werror build, then an
# address+undefined sanitizer build, each running the whole suite; between
# them the dispatch checks under emulation: x86-64 CPUs this machine is not
# (scripts/emulated-check.sh) and an aarch64 cross build (cross-aarch64.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/deps-python.sh     # transformers for the HF Trainer test, in .venv-test/
jobs=$(nproc)
# Where a CUDA toolkit is installed the build must have the CUDA backend:
# the GPU check (scripts/gpu-check.sh) builds this code with -Dcuda=enabled
# on a GPU machine, so a detection that silently drops it fails here first.
cuda_opt=()
[ -x "${CUDA_PATH:-${CUDA_HOME:-/usr/local/cuda}}/bin/nvcc" ] && cuda_opt=(-Dcuda=enabled)

meson setup build -Dwerror=true "${cuda_opt[@]}" --reconfigure >/dev/null 2>&1 ||
    meson setup build -Dwerror=true "${cuda_opt[@]}"
meson compile -C build -j "$jobs"
meson test -C build --print-errorlogs --num-processes "$jobs"

# The installed headers and zoffload.pc are enough to build a program, both
# against the shared library and against the static one.
# shellcheck disable=SC2046
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
meson install -C build --destdir "$dest" >/dev/null
pc=$(dirname "$(find "$dest" -name zoffload.pc | head -n1)")
prefix=$(sed -n 's/^prefix=//p' "$pc/zoffload.pc")
pcflags=(--define-variable=prefix="$dest$prefix")
export PKG_CONFIG_PATH="$pc"
cc docs/examples/platform_example.c -o "$dest/example" $(pkg-config "${pcflags[@]}" --cflags --libs zoffload)
LD_LIBRARY_PATH="$(pkg-config "${pcflags[@]}" --variable=libdir zoffload)" "$dest/example" host
# static libzoffload, its dependencies shared (Libs.private + Requires.private)
privlibs=$(sed -n 's/^Libs.private: //p' "$pc/zoffload.pc")
reqs=$(sed -n 's/^Requires.private: //p' "$pc/zoffload.pc" | tr ',' ' ')
# shellcheck disable=SC2086
cc docs/examples/platform_example.c -o "$dest/example-static" $(pkg-config "${pcflags[@]}" --cflags zoffload) \
    "$(pkg-config "${pcflags[@]}" --variable=libdir zoffload)/libzoffload.a" $privlibs $(pkg-config --libs $reqs)
"$dest/example-static" host
unset PKG_CONFIG_PATH

# The CPUs this machine is not: the dispatch suites and a short training run
# under qemu-x86_64 as an AVX2-only, an SSE4.2-only and a baseline x86-64.
./scripts/emulated-check.sh build
# aarch64 (NVIDIA Grace): a cross build with Debian's toolchain and multiarch
# packages, its dispatch suites and a 3-step zo-train under qemu-aarch64.
./scripts/cross-aarch64.sh

meson setup build-san -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false --reconfigure >/dev/null 2>&1 ||
    meson setup build-san -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-san -j "$jobs"
# allocator_may_return_null: tests check that absurd sizes give -ENOMEM.
# fast_unwind_on_malloc=0: full stacks, so the suppressions can match.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1:fast_unwind_on_malloc=0 \
LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-san --print-errorlogs --num-processes "$jobs" --timeout-multiplier 3
echo "all tests passed (werror build and sanitizer build)"
