#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# usage: aio-bench-files.sh ZO_AIO_BENCH
# The data files zo-aio-bench makes are as safe as the library's own:
#  - a symlink planted where the tool puts zo-aio-bench.0.dat (in /var/tmp
#    by default, where any local user can plant one) is refused, exit 2,
#    and its target is untouched (a root run used to overwrite it);
#  - the same for a --path file that does not exist yet when the run starts
#    (created O_EXCL | O_NOFOLLOW), and for another user's file or a hard
#    link sitting at the tool's name;
#  - a regular file of ours left by a killed earlier run is reused, and the
#    run works (--verify checks every byte);
#  - --through-store creates a --path directory that does not exist yet
#    (0700), and sizes its swap arenas from the run (it reserved 1 GiB per
#    directory however small the run).
bench="$1"
base=$(mktemp -d /var/tmp/zo-bench-files-XXXXXX) || exit 1
trap 'rm -rf "$base"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "precious" > "$base/victim"
cp "$base/victim" "$base/victim.orig"

# 1. planted symlink at the tool's own name
mkdir "$base/d1"
ln -s "$base/victim" "$base/d1/zo-aio-bench.0.dat"
"$bench" --write --size 64K --path "$base/d1" --no-progress 2>"$base/err"; rc=$?
[ $rc -eq 2 ] || fail "planted symlink: exit $rc, want 2: $(cat "$base/err")"
grep -q "symbolic link" "$base/err" || fail "planted symlink: message: $(cat "$base/err")"
cmp -s "$base/victim" "$base/victim.orig" || fail "planted symlink: the target was written"
[ -L "$base/d1/zo-aio-bench.0.dat" ] || fail "planted symlink: removed"

# 2. a dangling symlink at the tool's name (O_CREAT would follow it and
#    create the target)
mkdir "$base/d2"
ln -s "$base/created-through-link" "$base/d2/zo-aio-bench.0.dat"
"$bench" --write --size 64K --path "$base/d2" --no-progress 2>"$base/err"; rc=$?
[ $rc -eq 2 ] || fail "dangling symlink: exit $rc: $(cat "$base/err")"
[ ! -e "$base/created-through-link" ] || fail "dangling symlink: followed"

# 3. a hard link to someone's file at the tool's name
mkdir "$base/d3"
ln "$base/victim" "$base/d3/zo-aio-bench.0.dat"
"$bench" --write --size 64K --path "$base/d3" --no-progress 2>"$base/err"; rc=$?
[ $rc -eq 2 ] || fail "hard link: exit $rc: $(cat "$base/err")"
grep -q "hard link" "$base/err" || fail "hard link: message: $(cat "$base/err")"
cmp -s "$base/victim" "$base/victim.orig" || fail "hard link: the target was written"

# 3b. a FIFO at the tool's name (opening it for writing would block)
mkdir "$base/d3b"
mkfifo "$base/d3b/zo-aio-bench.0.dat"
timeout 60 "$bench" --write --size 64K --path "$base/d3b" --no-progress 2>"$base/err"; rc=$?
[ $rc -eq 2 ] || fail "fifo: exit $rc: $(cat "$base/err")"
grep -q "not a regular file" "$base/err" || fail "fifo: message: $(cat "$base/err")"

# 4. another user's file at the tool's name (only root can make one)
if [ "$(id -u)" -eq 0 ]; then
    mkdir "$base/d4"
    echo theirs > "$base/d4/zo-aio-bench.0.dat"
    chown 65534 "$base/d4/zo-aio-bench.0.dat"
    "$bench" --write --size 64K --path "$base/d4" --no-progress 2>"$base/err"; rc=$?
    [ $rc -eq 2 ] || fail "other user's file: exit $rc: $(cat "$base/err")"
    grep -q "belongs to uid 65534" "$base/err" || fail "other user's file: message: $(cat "$base/err")"
    [ "$(cat "$base/d4/zo-aio-bench.0.dat")" = theirs ] || fail "other user's file: written"
fi

# 5. a stale regular file of ours (a killed earlier run): reused, run works
mkdir "$base/d5"
head -c 1000 /dev/urandom > "$base/d5/zo-aio-bench.0.dat"
chmod 600 "$base/d5/zo-aio-bench.0.dat"
"$bench" --verify --size 256K --block-size 64K --path "$base/d5" --no-progress >/dev/null 2>"$base/err" ||
    fail "stale file of ours: $(cat "$base/err")"

# 6. a --path file named but not there yet: created 0600 and removed at
#    exit; a symlink planted at that name instead is refused
"$bench" --write --size 64K --path "$base/new.dat" --keep --no-progress >/dev/null 2>"$base/err" ||
    fail "new file: $(cat "$base/err")"
mode=$(stat -c %a "$base/new.dat") || fail "new file: not kept with --keep"
[ "$mode" = 600 ] || fail "new file: mode $mode, want 600"
ln -s "$base/victim" "$base/new2.dat"
rm "$base/victim"
"$bench" --write --size 64K --path "$base/new2.dat" --no-progress 2>"$base/err"; rc=$?
[ $rc -eq 2 ] || fail "symlink at a new --path: exit $rc: $(cat "$base/err")"
[ ! -e "$base/victim" ] || fail "symlink at a new --path: followed"

# 7. --through-store into a directory that does not exist yet
"$bench" --through-store --tensors 2 --tensor-size 300K --block-size 64K --keep --path "$base/swap-here" \
    --no-progress >/dev/null 2>"$base/err" || fail "through-store new dir: $(cat "$base/err")"
mode=$(stat -c %a "$base/swap-here") || fail "through-store: directory not made"
[ "$mode" = 700 ] || fail "through-store: directory mode $mode, want 700"
bytes=$(find "$base/swap-here" -type f -printf '%s\n' | awk '{t += $1} END {print t + 0}')
[ "$bytes" -gt 0 ] || fail "through-store: no arena kept with --keep"
[ "$bytes" -le $((4 << 20)) ] || fail "through-store: $bytes bytes of arenas for a 600 KiB run"

echo "ok"
