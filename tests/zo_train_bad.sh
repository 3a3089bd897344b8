#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# usage: zo_train_bad.sh ZO_TRAIN CASE [ZO_PLAN]
# zo-train's refusals and its cleanup: each case checks the exit code, the
# message, and that nothing is left behind in the NVMe parent directory
# (zo-train makes a private 0700 subdirectory there and removes it on every
# path, Ctrl-C included).
train="$1"; case_="$2"; plan="$3"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/zo-train-test.XXXXXX") || exit 1
trap 'rm -rf "$scratch"' EXIT
small="--layers 2 --width 32 --batch 4 --quiet"

# run EXPECTED_RC PATTERN ARGS...: stderr must contain PATTERN
run() {
    want="$1"; pattern="$2"; shift 2
    "$train" "$@" >"$scratch/out" 2>"$scratch/err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "expected exit $want, got $rc: zo-train $*"; cat "$scratch/err"; exit 1
    fi
    if [ -n "$pattern" ] && ! grep -q -- "$pattern" "$scratch/err"; then
        echo "exit $rc as expected, but stderr lacks '$pattern':"; cat "$scratch/err"; exit 1
    fi
    echo "exit $rc: $(cat "$scratch/err")"
}

# start zo-train in the background (pid in $pid), output in $scratch/out and
# err, and wait until it is training (its engine line is out: up to 60 s)
start_training() {
    "$train" "$@" >"$scratch/out" 2>"$scratch/err" &
    pid=$!
    i=0
    while ! grep -q "^engine:" "$scratch/out" 2>/dev/null; do
        kill -0 $pid 2>/dev/null && [ $i -lt 600 ] ||
            { echo "no engine line"; cat "$scratch/out" "$scratch/err"; kill -9 $pid 2>/dev/null; exit 1; }
        sleep 0.1; i=$((i + 1))
    done
}

# wait for $pid to end, within $1 seconds (killed and failed otherwise); rc in $rc
wait_within() {
    i=0
    while kill -0 $pid 2>/dev/null; do
        [ $i -lt $(($1 * 10)) ] || { echo "still running after $1 s"; kill -9 $pid; cat "$scratch/err"; exit 1; }
        sleep 0.1; i=$((i + 1))
    done
    wait $pid
    rc=$?
}

# the NVMe parent holds nothing of ours after the run
nothing_left() {
    if [ -n "$(ls -A "$1")" ]; then
        echo "left behind in $1:"; ls -la "$1"; exit 1
    fi
}

case "$case_" in
too-wide)
    run 2 "32-bit" --width 100000 --layers 1 ;;
too-big)
    run 2 "more than this machine" --params 64G --layers 4096 ;;
save-checked-first)
    # --save problems are found before the first step, not after the whole run (with an empty
    # detail): not a directory, a checkpoint name this run would write already there
    run 2 "exists and is not a directory" $small --steps 2 --save /dev/null
    ! grep -q "^summary" "$scratch/out" || { echo "trained before refusing"; exit 1; }
    mkdir -p "$scratch/ck/step-2"
    run 2 "already holds step-2" $small --steps 2 --save "$scratch/ck"
    ! grep -q "^summary" "$scratch/out" || { echo "trained before refusing"; exit 1; }
    run 0 "" $small --steps 1 --save "$scratch/ck"
    [ -f "$scratch/ck/latest" ] || { echo "no checkpoint"; exit 1; } ;;
params-limits)
    # --params with a narrow --width: the layers it implies are held to --layers' limit, in
    # 64 bits (2^32 + 1 layers once wrapped to one, a 2-parameter model); 1e6 is a size
    run 2 "4294967297 layers, more than the 4096" --params 8589934594 --width 1
    run 2 "10000 layers, more than the 4096" --params 20000 --width 1
    run 0 "" --params 1e5 --layers 2 --batch 4 --steps 1 --quiet
    grep -q "^model: 2 layers of 223 x 223" "$scratch/out" || { echo "--params 1e5:"; cat "$scratch/out"; exit 1; } ;;
params-too-small)
    run 2 "less than one layer" --params 10 --width 64 ;;
missing-nvme-path)
    run 2 "NVMe path /nonexistent-zo-dir" $small --offload nvme --nvme-path /nonexistent-zo-dir/sub ;;
read-only-nvme-path)
    # /proc/sys is read-only even for root
    run 2 "cannot create a directory" $small --offload nvme --nvme-path /proc/sys ;;
nvme-path-without-nvme)
    mkdir "$scratch/nvme"
    run 2 "needs --offload nvme" $small --offload host --nvme-path "$scratch/nvme"
    nothing_left "$scratch/nvme" ;;
config-typo)
    mkdir "$scratch/nvme"
    printf '{"zero_optimization": {"offload_optimzer": {"device": "nvme", "nvme_path": "%s"}}}\n' \
        "$scratch/nvme" >"$scratch/ds.json"
    run 2 "offload_optimizer" $small --config "$scratch/ds.json"
    nothing_left "$scratch/nvme" ;;
config-missing)
    run 2 "No such file" $small --config "$scratch/none.json" ;;
config-dtype-clash)
    printf '{"fp16": {"enabled": true}}\n' >"$scratch/ds.json"
    run 2 "sets device params f16, the model has bf16: give --param-dtype f16" $small --config "$scratch/ds.json"
    # the gradients' clash names the gradients' dtypes (it printed the params' before)
    printf '{"zoffload": {"grad_dtype": "fp32"}}\n' >"$scratch/ds.json"
    run 2 "sets device gradients (zoffload.grad_dtype) f32, the model's are bf16: give --grad f32" $small \
        --config "$scratch/ds.json"
    # an option without its value says so (it said "unknown option")
    run 2 "--config needs a value" $small --config
    run 2 "--steps needs a value" $small --steps ;;
json-exists)
    : >"$scratch/steps.json"
    run 2 "never overwrites" $small --steps 1 --json "$scratch/steps.json" ;;
json-symlink)
    ln -s "$scratch/target" "$scratch/link.json"
    run 2 "" $small --steps 1 --json "$scratch/link.json"
    [ ! -e "$scratch/target" ] || { echo "followed the link"; exit 1; } ;;
bad-dtype)
    run 2 "bf16, fp16 or fp32" $small --grad fp8 ;;
state-dtype-q)
    # --state-dtype: refusals; a q8 run on NVMe saves its codes and scales, a run with fp32
    # states resumes from that checkpoint (converted on load) and verifies from there, and one
    # with q4 states resumes from it too
    run 2 "fp32, bf16, q8 or q4" $small --state-dtype fp8
    run 2 "not q8" $small --steps 1 --verify --state-dtype q8
    mkdir "$scratch/nvme"
    run 0 "" $small --steps 3 --offload nvme --nvme-path "$scratch/nvme" --state-dtype q8 --save "$scratch/ck"
    run 0 "" $small --steps 2 --resume "$scratch/ck" --state-dtype fp32 --verify
    grep -q "bit for bit" "$scratch/out" || { echo "fp32 resume of q8 did not verify"; cat "$scratch/out"; exit 1; }
    run 0 "" $small --steps 2 --resume "$scratch/ck" --state-dtype q4 ;;
bad-offload)
    run 2 "host or nvme" $small --offload gpu ;;
unknown-option)
    run 2 "unknown option" --frobnicate ;;
verify-optimizers)
    # --verify with the config's optimizer and state dtype: bf16 states, Lion, Adagrad, Adam,
    # speculative clipping without a cap (then identical to two-pass)
    for c in '{"zoffload": {"state_dtype": "bf16"}}' '{"optimizer": {"type": "Lion", "params": {"lr": 1e-4}}}' \
             '{"optimizer": {"type": "Adagrad", "params": {"lr": 1e-2}}}' \
             '{"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.01}}}'; do
        printf '%s\n' "$c" >"$scratch/opt.json"
        run 0 "" $small --steps 4 --dpu on --verify --config "$scratch/opt.json"
        grep -q "bit for bit" "$scratch/out" || { echo "$c did not verify"; cat "$scratch/out"; exit 1; }
    done
    printf '{"zoffload": {"clip_mode": "speculative"}}\n' >"$scratch/spec.json"
    run 0 "" $small --steps 4 --clip 0 --verify --config "$scratch/spec.json"
    run 2 "speculative clipping" $small --steps 4 --verify --config "$scratch/spec.json" ;;
backend-cuda)
    # With a GPU (and a CUDA build) the model trains there; without, zo_dev_open's
    # refusal with its reason, exit 2. --verify is host-only either way.
    "$train" $small --steps 2 --backend cuda >"$scratch/out" 2>"$scratch/err"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        grep -q "^summary" "$scratch/out" || { echo "cuda run without a summary"; cat "$scratch/out"; exit 1; }
    else
        [ "$rc" -eq 2 ] && grep -q "the device does not open" "$scratch/err" ||
            { echo "cuda: exit $rc"; cat "$scratch/err"; exit 1; }
        echo "exit 2: $(cat "$scratch/err")"
    fi
    run 2 "use it with --backend host" $small --steps 2 --backend cuda --verify ;;
config-nvme-no-path)
    # a config asking for NVMe without nvme_path: a private directory under /var/tmp, removed
    printf '{"zero_optimization": {"offload_optimizer": {"device": "nvme"}}}\n' >"$scratch/nvme.json"
    run 0 "" $small --steps 2 --config "$scratch/nvme.json" --verify
    grep -q "NVMe in /var/tmp/zo-train-" "$scratch/out" || { echo "not on NVMe:"; cat "$scratch/out"; exit 1; }
    dir=$(sed -n 's/.*NVMe in \(\/var\/tmp\/zo-train-[A-Za-z0-9]*\);.*/\1/p' "$scratch/out")
    [ -n "$dir" ] && [ ! -e "$dir" ] || { echo "left behind: $dir"; exit 1; } ;;
nvme-cleanup)
    # NVMe placement: a verified run leaves the parent directory as it found
    # it, and so does one the engine refuses (a pinned budget too small)
    mkdir "$scratch/nvme"
    run 0 "" $small --steps 3 --offload nvme --nvme-path "$scratch/nvme" --verify
    grep -q "bit for bit" "$scratch/out" || { echo "no verify line"; cat "$scratch/out"; exit 1; }
    nothing_left "$scratch/nvme"
    printf '{"zoffload": {"pinned_bytes": 65536}}\n' >"$scratch/budget.json"
    run 2 "pinned_bytes" $small --steps 3 --offload nvme --nvme-path "$scratch/nvme" --config "$scratch/budget.json"
    nothing_left "$scratch/nvme" ;;
interrupt-save-resume)
    # Ctrl-C stops at a step boundary and saves; the checkpoint resumes, and
    # the resumed run verifies against the in-memory reference
    mkdir "$scratch/nvme"
    "$train" --layers 2 --width 256 --batch 64 --steps 100000 --save "$scratch/ck" \
        --json "$scratch/steps.json" >"$scratch/out" 2>"$scratch/err" &
    pid=$!
    i=0
    while [ "$(wc -l <"$scratch/steps.json" 2>/dev/null || echo 0)" -lt 3 ] && [ $i -lt 300 ]; do
        sleep 0.1; i=$((i + 1))
    done
    kill -INT $pid
    wait $pid
    rc=$?
    [ "$rc" -eq 0 ] || { echo "interrupted run exit $rc"; cat "$scratch/err"; exit 1; }
    grep -q "interrupted" "$scratch/out" || { echo "no interrupt message"; cat "$scratch/out"; exit 1; }
    grep -q '"type":"summary"' "$scratch/steps.json" || { echo "no summary line"; exit 1; }
    [ -f "$scratch/ck/latest" ] || { echo "no checkpoint"; ls -la "$scratch/ck"; exit 1; }
    run 0 "" --layers 2 --width 256 --batch 64 --steps 2 --resume "$scratch/ck" --verify
    grep -q "bit for bit" "$scratch/out" || { echo "resume did not verify"; cat "$scratch/out"; exit 1; } ;;
interrupt-in-window)
    # a signal inside a long accumulation window (60000 micro-steps of 20 ms or more) stops the
    # run within a micro-step, not at the boundary half an hour later; the window is dropped and
    # the checkpoint is at the last boundary, from which a resumed run verifies
    ZO_TRAIN_TEST_MICRO_DELAY_MS=20 start_training $small --steps 3 --accum 60000 --save "$scratch/ck"
    sleep 0.5
    kill -TERM $pid
    wait_within 20
    [ "$rc" -eq 0 ] || { echo "interrupted run exit $rc"; cat "$scratch/err"; exit 1; }
    grep -q "interrupted inside an accumulation window" "$scratch/out" && grep -q "saved .*step-0" "$scratch/out" ||
        { echo "no interrupt or save line:"; cat "$scratch/out"; exit 1; }
    run 0 "" $small --steps 2 --accum 2 --resume "$scratch/ck" --verify
    grep -q "bit for bit" "$scratch/out" || { echo "resume did not verify"; cat "$scratch/out"; exit 1; } ;;
second-signal)
    # a second signal ends a run stuck in a long micro-step at once (128 + SIGINT)
    mkdir "$scratch/nvme"
    ZO_TRAIN_TEST_MICRO_DELAY_MS=100000 start_training $small --steps 2 --offload nvme --nvme-path "$scratch/nvme"
    sleep 0.3
    kill -INT $pid
    sleep 0.5
    kill -0 $pid 2>/dev/null || { echo "the first signal did not wait for the micro-step"; exit 1; }
    kill -INT $pid
    wait_within 10
    [ "$rc" -eq 130 ] && grep -q "second signal" "$scratch/err" ||
        { echo "exit $rc after two signals:"; cat "$scratch/err"; exit 1; }
    echo "exit 130: $(cat "$scratch/err")"
    # it left its private directory; the next run in that parent reclaims it
    [ -n "$(ls -A "$scratch/nvme")" ] || { echo "nothing left to reclaim?"; exit 1; }
    run 0 "removed .*/zo-train-" $small --steps 1 --offload nvme --nvme-path "$scratch/nvme"
    nothing_left "$scratch/nvme" ;;
killed-run-reclaimed)
    # kill -9 leaves the private directory with the swap files; each run makes a fresh one, so
    # only a reclaim of stale run directories gets the space back: the next run does it, and
    # never touches a live run's (a second run beside the first)
    mkdir "$scratch/nvme"
    ZO_TRAIN_TEST_MICRO_DELAY_MS=100000 start_training $small --steps 2 --offload nvme --nvme-path "$scratch/nvme"
    live=$pid
    run 0 "" $small --steps 1 --offload nvme --nvme-path "$scratch/nvme"
    ! grep -q "removed" "$scratch/err" && [ "$(ls -A "$scratch/nvme" | wc -l)" -eq 1 ] ||
        { echo "a live run's directory was touched:"; ls -la "$scratch/nvme"; cat "$scratch/err"; exit 1; }
    kill -KILL $live
    wait $live
    left=$(ls -A "$scratch/nvme")
    [ -n "$left" ] && [ -n "$(ls -A "$scratch/nvme/$left")" ] || { echo "kill -9 left nothing?"; exit 1; }
    run 0 "removed .*/$left, the run directory of a run that is gone (pid $live)" $small --steps 1 --offload nvme \
        --nvme-path "$scratch/nvme"
    nothing_left "$scratch/nvme" ;;
resume-lr-seed)
    # --resume goes on with the checkpoint's seed (the teacher and the data): the resumed steps'
    # losses are the uninterrupted run's; another --seed is refused; --lr replaces the
    # checkpoint's learning rate (the in-memory reference takes it, so --verify would fail if
    # the engine kept the old one)
    run 0 "" $small --steps 2 --seed 5 --lr 0.002 --save "$scratch/ck"
    run 2 "trained with seed 5" $small --steps 1 --resume "$scratch/ck" --seed 6
    run 0 "" $small --steps 4 --seed 5 --lr 0.002 --json "$scratch/a.json"
    run 0 "" $small --steps 2 --resume "$scratch/ck" --json "$scratch/c.json"
    grep -q "seed 5 (the checkpoint's), lr 0.002 (the checkpoint's)" "$scratch/out" ||
        { echo "no resume line:"; cat "$scratch/out"; exit 1; }
    loss() { sed -n "s/.*\"step\":$2,\"loss\":\([^,]*\),.*/\1/p" "$1"; }
    for st in 3 4; do
        a=$(loss "$scratch/a.json" $st); c=$(loss "$scratch/c.json" $st)
        [ -n "$a" ] && [ "$a" = "$c" ] || { echo "step $st: uninterrupted loss '$a', resumed '$c'"; exit 1; }
    done
    run 0 "" $small --steps 2 --resume "$scratch/ck" --lr 0.0005 --verify
    grep -q "lr 0.0005 (--lr)" "$scratch/out" && grep -q "bit for bit" "$scratch/out" ||
        { echo "--lr on resume:"; cat "$scratch/out"; exit 1; } ;;
plan-config)
    # zo-plan --config writes a config the engine loads: zo-train runs it and verifies
    "$plan" --no-probe --config "$scratch/plan.json" -- --layers 2 --width 32 --batch 4 --accum 2 --clip 0.5 \
        --dpu on >/dev/null || { echo "zo-plan --config failed"; exit 1; }
    run 0 "" --layers 2 --width 32 --batch 4 --steps 4 --accum 2 --config "$scratch/plan.json" --verify
    grep -q "DPU on" "$scratch/out" && grep -q "clip 0.5" "$scratch/out" && grep -q "bit for bit" "$scratch/out" ||
        { echo "the config did not take effect:"; cat "$scratch/out"; exit 1; } ;;
tiled-4x-budget)
    # Issue 13's done-when: host backend, a 1-layer model whose weight (512 x 512 bf16,
    # 512 KiB) is 4x the device budget (128 KiB) trains through zo_tiled_linear; the
    # device bytes in use (zo_dev_get_info: the host backend's zo_dev_malloc accounting)
    # never exceed the budget, and --verify still matches bit for bit
    run 0 "" --layers 1 --width 512 --batch 4 --steps 3 --device-budget 128K --verify --json "$scratch/t.json"
    grep -q "bit for bit" "$scratch/out" || { echo "tiled run did not verify"; cat "$scratch/out"; exit 1; }
    grep -q "^tiles: .* tiles of [0-9]* x 512" "$scratch/out" || { echo "no tiles line"; cat "$scratch/out"; exit 1; }
    sum=$(grep '"type":"summary"' "$scratch/t.json")
    num() { printf '%s\n' "$sum" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
    peak=$(num device_peak_bytes); budget=$(num device_budget_bytes); tiles=$(num tiles_per_layer)
    [ -n "$peak" ] && [ "$budget" -eq 131072 ] && [ "$peak" -gt 0 ] && [ "$peak" -le "$budget" ] && [ "$tiles" -gt 1 ] ||
        { echo "peak $peak budget $budget tiles $tiles: $sum"; exit 1; }
    echo "peak device bytes $peak <= budget $budget, $tiles tiles" ;;
tiled-nvme)
    # tiles homed on NVMe (with --offload nvme), two layers, gradient accumulation: verified,
    # and the private directory (the tiles' swap files included) is removed
    mkdir "$scratch/nvme"
    run 0 "" --layers 2 --width 256 --batch 4 --steps 3 --accum 2 --device-budget 128K --offload nvme \
        --nvme-path "$scratch/nvme" --verify
    grep -q "homed in NVMe" "$scratch/out" && grep -q "bit for bit" "$scratch/out" ||
        { echo "tiled NVMe run:"; cat "$scratch/out"; exit 1; }
    nothing_left "$scratch/nvme" ;;
tiled-refusals)
    # tiled layers and DPU: refused with the reason; a budget below the activations: refused
    run 2 "need --dpu off" --layers 1 --width 512 --batch 4 --steps 1 --device-budget 128K --dpu on
    run 2 "not even a tiled layer fits" --layers 1 --width 512 --batch 64 --steps 1 --device-budget 128K ;;
*)
    echo "unknown case $case_"; exit 1 ;;
esac
exit 0
