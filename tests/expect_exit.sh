#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# usage: expect_exit.sh CODE [PATTERN] -- COMMAND [ARGS...]
# Passes when COMMAND exits with exactly CODE (not a signal, not another
# code) and, if PATTERN is given, its stderr contains PATTERN.
want="$1"; shift
pattern=""
if [ "$1" != "--" ]; then pattern="$1"; shift; fi
[ "$1" = "--" ] && shift
err=$(mktemp)
"$@" >/dev/null 2>"$err"
rc=$?
msg=$(cat "$err"); rm -f "$err"
if [ "$rc" -ne "$want" ]; then
    echo "expected exit $want, got $rc (>128 means a signal): $*"
    echo "$msg"
    exit 1
fi
if [ -n "$pattern" ] && ! printf '%s' "$msg" | grep -q -- "$pattern"; then
    echo "exit $rc as expected, but stderr lacks '$pattern':"
    echo "$msg"
    exit 1
fi
echo "exit $rc: $msg"
exit 0
