#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Every source file git tracks (C, CUDA, headers, Python, shell, meson)
# names meson.build's license in an SPDX line within its first three lines
# (issue 21: "a LICENSE file and SPDX lines match meson.build's license").
# usage: spdx_check.sh SOURCE_DIR    exit 0 ok, 1 files lack it, 77 not a git checkout
set -euo pipefail
src=$1
cd "$src"
git rev-parse --git-dir >/dev/null 2>&1 || { echo "SKIP: $src is not a git checkout"; exit 77; }
license=$(sed -n "s/^ *license: *'\([^']*\)'.*/\1/p" meson.build | head -1)
[ -n "$license" ] || { echo "FAIL: no license: in meson.build"; exit 1; }
grep -q "Apache License" LICENSE || { echo "FAIL: LICENSE is not the $license text"; exit 1; }
bad=0
while IFS= read -r f; do
    [ -f "$f" ] || continue
    if ! head -3 "$f" | grep -q "SPDX-License-Identifier: $license\b"; then
        echo "no SPDX-License-Identifier: $license line: $f"
        bad=$((bad + 1))
    fi
done < <(git ls-files | grep -E '\.(c|h|cu|py|sh)$|(^|/)meson\.build$|(^|/)meson_options\.txt$|^\.ci/run$')
[ $bad -eq 0 ] || { echo "FAIL: $bad file(s)"; exit 1; }
echo "SPDX: every tracked source file names $license"
