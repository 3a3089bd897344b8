#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# usage: aio-bench-nofallocate.sh ZO_AIO_BENCH
# On a filesystem without fallocate (ext2: no extents) that fills up,
# zo-aio-bench must say "No space left on device". It said "Operation not
# supported": the stale errno of the refused fallocate, reported for a short
# write. Needs root, a loop device, mkfs.ext2 and a private mount namespace
# (unshare -m, so nothing stays mounted); skips (77) without them.
bench="$1"
command -v mkfs.ext2 >/dev/null 2>&1 || { echo "skip: no mkfs.ext2"; exit 77; }
command -v unshare >/dev/null 2>&1 || { echo "skip: no unshare"; exit 77; }
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root to mount a loop device"; exit 77; }
base=$(mktemp -d /var/tmp/zo-bench-nofalloc-XXXXXX) || exit 1
trap 'rm -rf "$base"' EXIT
truncate -s 4M "$base/fs.img" && mkfs.ext2 -q -F "$base/fs.img" >/dev/null 2>&1 || { echo "skip: mkfs.ext2 failed"; exit 77; }
mkdir "$base/mnt"
# 77 from inside when the mount is refused (no loop devices in a container)
unshare -m sh -c '
    mount -o loop "$1/fs.img" "$1/mnt" 2>/dev/null || { echo "skip: cannot mount a loop device"; exit 77; }
    "$2" --write --size 16M --path "$1/mnt" --no-progress 2>"$1/err"; rc=$?
    cat "$1/err"
    [ $rc -eq 1 ] || { echo "FAIL: exit $rc, want 1"; exit 1; }
    grep -q "No space left on device" "$1/err" || { echo "FAIL: not reported as no space"; exit 1; }
    if grep -q "not supported" "$1/err"; then echo "FAIL: reported as not supported"; exit 1; fi
    [ ! -e "$1/mnt/zo-aio-bench.0.dat" ] || { echo "FAIL: the partial file was left behind"; exit 1; }
    echo ok
' sh "$base" "$bench"
