#!/usr/bin/env bash
# Set up and run every test, as CI does: a -Werror build, then an
# address+undefined sanitizer build, each running the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)

meson setup build -Dwerror=true --reconfigure >/dev/null 2>&1 || meson setup build -Dwerror=true
meson compile -C build -j "$jobs"
meson test -C build --print-errorlogs --num-processes "$jobs"

meson setup build-san -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false --reconfigure >/dev/null 2>&1 ||
    meson setup build-san -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false
meson compile -C build-san -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-san --print-errorlogs --num-processes "$jobs" --timeout-multiplier 3
echo "all tests passed (werror build and sanitizer build)"
