#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run the Python binding tests against the library of a build tree.
#   run.sh <libzoffload.so> <source root> [pytest arguments...]
# Uses Debian's /usr/bin/python3 (it sees python3-numpy, python3-torch and
# python3-pytest), not whatever python3 comes first on PATH, or, when
# scripts/deps-python.sh has made it, the checkout's .venv-test/ (made from
# that interpreter with --system-site-packages: Debian's packages plus
# transformers); ZOFFLOAD_PYTHON overrides both. Exits 77 (skipped) when an
# interpreter module is missing.
set -u
lib=$(realpath "$1") || exit 1
src=$(realpath "$2") || exit 1
shift 2
py=/usr/bin/python3
[ -x "$src/.venv-test/bin/python" ] && py=$src/.venv-test/bin/python
py=${ZOFFLOAD_PYTHON:-$py}
if [ ! -x "$py" ]; then
    echo "skip: $py not found (set ZOFFLOAD_PYTHON)"
    exit 77
fi
# A sanitized library (meson -Db_sanitize=address,undefined): the
# interpreter is not, so the sanitizer runtimes must be loaded first
# (LD_PRELOAD); leak detection is off because the interpreter and torch
# keep memory until exit by design (their leaks, not the library's).
if command -v ldd >/dev/null 2>&1 && ldd "$lib" 2>/dev/null | grep -q 'libasan'; then
    asan=$(ldd "$lib" | awk '/libasan/ {print $3; exit}')
    ubsan=$(ldd "$lib" | awk '/libubsan/ {print $3; exit}')
    if [ ! -e "$asan" ]; then
        echo "skip: $lib is built with ASan but its runtime was not found to preload"
        exit 77
    fi
    export LD_PRELOAD="$asan${ubsan:+ $ubsan}"
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    echo "sanitized library: preloading $LD_PRELOAD"
fi
for mod in numpy pytest; do
    if ! "$py" -c "import $mod" 2>/dev/null; then
        echo "skip: $py cannot import $mod (apt-get install python3-$mod)"
        exit 77
    fi
done
export ZOFFLOAD_LIB="$lib"
export ZOFFLOAD_SOURCE_ROOT="$src"
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
# Two OpenMP runtimes' threads (torch's and ours) on a shared machine: keep
# the tests' thread counts small.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
cd "$src/tests/python" || exit 1
"$py" -m pytest -q -p no:cacheprovider -rs "$@"
rc=$?
# pytest: 5 = no tests collected (everything skipped at module level)
[ $rc -eq 5 ] && { echo "skip: no tests ran"; exit 77; }
exit $rc
