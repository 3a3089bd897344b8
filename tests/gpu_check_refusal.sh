#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# usage: gpu_check_refusal.sh SCRIPT
# scripts/gpu-check.sh refuses at once where there is no CUDA device: exit 3,
# a message that says so, a report that says so, and nothing built. The
# driver is made missing through --libcuda, so this runs the refusal on a
# GPU machine too. Then the real device check: 0 (a GPU is there) or 3.
script="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stderr:"; cat "$tmp/err"; exit 1; }

bash "$script" --libcuda /nonexistent/libcuda.so.1 --out "$tmp/out" --build-dir "$tmp/build" \
    >"$tmp/stdout" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 3 ] || fail "full run without a driver: exit $rc, expected 3"
grep -q "refused: no CUDA device or driver here: no NVIDIA driver: /nonexistent/libcuda.so.1 cannot be loaded" \
    "$tmp/err" || fail "no refusal message naming the driver"
[ ! -e "$tmp/build" ] || fail "a build folder was made before the refusal"
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "refused" and "no CUDA device or driver" in r["reason"] and r["steps"] == [], r
' "$tmp/out/report.json" || fail "report.json does not say refused"
[ -s "$tmp/out/report.md" ] || fail "no report.md"
[ "$(ls -A "$tmp/out" | sort | tr '\n' ' ')" = "report.json report.md " ] ||
    fail "the report folder holds more than report.json and report.md: $(ls -A "$tmp/out")"
echo "full run: exit 3, $(cat "$tmp/err" | head -n1)"

bash "$script" --check-device --libcuda /nonexistent/libcuda.so.1 >"$tmp/stdout" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 3 ] || fail "--check-device without a driver: exit $rc, expected 3"
grep -q "no CUDA device or driver here" "$tmp/err" || fail "--check-device: no message"

bash "$script" --check-device >"$tmp/stdout" 2>"$tmp/err"
rc=$?
case $rc in
0) grep -q '"ok": true' "$tmp/stdout" || fail "--check-device: exit 0 without the devices"
   echo "this machine has a CUDA device: $(cat "$tmp/stdout")" ;;
3) grep -q "no CUDA device or driver here" "$tmp/err" || fail "--check-device: exit 3 without the message"
   echo "this machine: $(cat "$tmp/err")" ;;
*) fail "--check-device: exit $rc, expected 0 or 3" ;;
esac

bash "$script" --frobnicate >"$tmp/stdout" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "bad option: exit $rc, expected 2"
exit 0
