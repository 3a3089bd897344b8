#!/bin/sh
# Run the Python binding tests against the library of a build tree.
#   run.sh <libzoffload.so> <source root> [pytest arguments...]
# Uses Debian's /usr/bin/python3 (it sees python3-numpy, python3-torch and
# python3-pytest), not whatever python3 comes first on PATH; ZOFFLOAD_PYTHON
# overrides it. Exits 77 (skipped) when an interpreter module is missing.
set -u
lib=$(realpath "$1") || exit 1
src=$(realpath "$2") || exit 1
shift 2
py=${ZOFFLOAD_PYTHON:-/usr/bin/python3}
if [ ! -x "$py" ]; then
    echo "skip: $py not found (set ZOFFLOAD_PYTHON)"
    exit 77
fi
if command -v ldd >/dev/null 2>&1 && ldd "$lib" 2>/dev/null | grep -q 'lib[at]san'; then
    echo "skip: $lib is built with a sanitizer; python cannot load it without preloading the runtime"
    exit 77
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
