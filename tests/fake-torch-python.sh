#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Stands in for `python3 -c <torch script> n threads kind` where torch is not
# installed, speaking the same line protocol as zo-adam-bench's torch child:
# READY with two modes, one of them "fused", then one time per "step" line.
# It exercises the tool's --vs-torch reporting (JSON shape), not torch.
echo "READY torch=fake threads=1 modes=foreach,fused fused=yes"
while read -r cmd mode; do
    [ "$cmd" = step ] || exit 0
    echo "0.000100000"
done
