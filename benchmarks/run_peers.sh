#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Every peer comparison in one run, with the versions recorded:
#
#   benchmarks/run_peers.sh [--system-torch] [--quick] [--out DIR] [--venv VENV]
#
# 1. the peers' virtual environment, made as a user would from PyPI
#    (benchmarks/setup_ds_venv.sh: a CPU-only torch that does not drag the
#    CUDA wheels, DeepSpeed without build isolation, libaio-dev); with
#    --system-torch a venv over Debian's torch 1.13 and DeepSpeed 0.14.4;
# 2. CPU Adam: DeepSpeedCPUAdam fp32 and DeepSpeed's bf16 three-pass
#    ZeRO-Offload sequence against zoffload's fused pass
#    (benchmarks/ds_cpuadam_bench.py);
# 3. torch's AdamW in its best CPU mode (fused where that torch has it,
#    else foreach) against zo_cpuadam (zo-adam-bench --vs-torch, with the
#    venv's torch);
# 4. aio: DeepSpeed's libaio handle and fio against zo-aio-bench
#    (benchmarks/ds_aio_bench.py);
# 5. the end-to-end fine-tune: examples/finetune.py --compare deepspeed
#    (DeepSpeed ZeRO-Offload, stage 2 with CPU optimizer offload, same
#    model, data and seed).
#
# Results go to DIR (default bench-peers-<date>): one JSON or log per
# comparison and versions.json (zoffload, python, torch, DeepSpeed, fio,
# the machine from zo-info). Run from the repository root after
# `meson compile -C build`. --quick uses small sizes (a check that every
# comparison runs, minutes; not figures to quote). Exit status: the number
# of comparisons that failed (0: all ran).
set -u

system_torch=""
quick=0
out=""
venv=""
while [ $# -gt 0 ]; do
    case "$1" in
    --system-torch) system_torch="--system-torch" ;;
    --quick) quick=1 ;;
    --out) out=$2; shift ;;
    --venv) venv=$2; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "run_peers: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=$root/build
venv=${venv:-${ZO_DS_VENV:-$HOME/.cache/zoffload/venv-ds}}
out=${out:-bench-peers-$(date -u +%Y%m%dT%H%M%SZ)}
say() { printf 'run_peers: %s\n' "$*" >&2; }

[ -x "$build/tools/zo-adam-bench" ] || { say "no $build/tools/zo-adam-bench: run meson compile -C build first"; exit 2; }
mkdir -p "$out" || exit 2

"$here/setup_ds_venv.sh" $system_torch "$venv" || { say "could not make the peers' venv $venv"; exit 2; }
py="$venv/bin/python"

if [ $quick = 1 ]; then
    n=1e6; pairs=3; aio_size=64M; ft="--dim 128 --layers 2 --heads 4 --seq 64 --batch 4 --steps 4 --warmup 1"
else
    n=1e8; pairs=7; aio_size=1G; ft="--dim 768 --layers 18 --heads 12 --seq 256 --batch 4 --steps 8 --warmup 2"
fi

# versions
"$py" - "$out/versions.json" <<'EOF'
import json, platform, subprocess, sys
v = {"python": platform.python_version()}
try:
    import torch
    v["torch"] = torch.__version__
except Exception as e:
    v["torch"] = "unavailable: %s" % e
try:
    import deepspeed
    v["deepspeed"] = deepspeed.__version__
except Exception as e:
    v["deepspeed"] = "unavailable: %s" % e
try:
    v["fio"] = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
except OSError:
    v["fio"] = "not installed"
json.dump(v, open(sys.argv[1], "w"), indent=1)
EOF
"$build/tools/zo-info" --json > "$out/machine.json" 2>/dev/null || true
say "versions: $(tr -d '\n' < "$out/versions.json")"

failed=0
step() {  # name, then the command; its output to $out/name.log
    name=$1; shift
    say "$name: $*"
    if "$@" > "$out/$name.log" 2>&1; then
        say "$name: done ($out/$name.log)"
    else
        say "$name: FAILED (exit $?; see $out/$name.log)"
        failed=$((failed + 1))
    fi
}

step cpuadam "$py" "$here/ds_cpuadam_bench.py" --venv "$venv" $system_torch --n "$n" --threads 2 \
    --pairs "$pairs" --lib "$build/libzoffload.so" --json
step torch-adamw "$build/tools/zo-adam-bench" --n "$n" --threads 2 --pairs "$pairs" --vs-torch --python "$py" --json
step aio "$py" "$here/ds_aio_bench.py" --venv "$venv" $system_torch --size "$aio_size" --pairs "$pairs" --json
# shellcheck disable=SC2086
step finetune env ZOFFLOAD_LIB="$build" ZO_DS_VENV="$venv" /usr/bin/python3 "$root/examples/finetune.py" $ft \
    --compare deepspeed
say "results in $out ($failed failed)"
exit $failed
