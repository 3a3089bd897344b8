#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DeepSpeed's aio handle against zo-aio-bench (and fio) on the same file.

Runs, alternating A B C D A B C D ..., on one preallocated file:
  ds         DeepSpeed's libaio handle (deepspeed.ops.op_builder.AsyncIOBuilder
             .load().aio_handle(block_size, queue_depth, single_submit,
             overlap_events, thread_count)), sync_pwrite / sync_pread of the
             whole file from a pinned tensor (new_cpu_locked_tensor)
  zo         zo-aio-bench, default buffers (zo_pinned_alloc: locked, huge
             pages where possible)
  zo-plain   zo-aio-bench --buffers plain (4 KiB pages, like DeepSpeed's and
             fio's own buffers)
  fio        fio --ioengine=io_uring --direct=1 --fixedbufs --registerfiles
at the same block size, queue depth, threads and size; prints every pair
and the median of each and of the ratios against DeepSpeed.

Setting up (once): DeepSpeed lives in a private virtual environment made
by benchmarks/setup_ds_venv.sh (a CPU-only torch and DeepSpeed 0.19 from
PyPI, libaio-dev; --system-torch: Debian's torch 1.13 with DeepSpeed
0.14.4); --setup runs it when the venv is missing. The async_io op is
JIT-built on first use by DeepSpeed's CPU-side builder, the one that links
libaio (with DeepSpeed 0.19 the generic AsyncIOBuilder is the CUDA-side
one, whose op fails to load on a CPU torch: undefined symbol io_submit;
see benchmarks/_ds_common.py). Not part of CI.

usage: benchmarks/ds_aio_bench.py [--setup] [--system-torch] [--size 1G]
       [--block-size 1M] [--queue-depth 32] [--threads 1] [--pairs 5]
       [--path FILE] [--zo-bench build/tools/zo-aio-bench] [--venv VENV]
       [--no-fio] [--no-plain] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _ds_common  # noqa: E402


def parse_size(s):
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
            "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    num = s.rstrip("KMGTB")
    suf = s[len(num):]
    if not num.isdigit() or suf not in mult:
        raise argparse.ArgumentTypeError(f"not a size: {s}")
    return int(num) * mult[suf]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def load_ds_aio():
    b = _ds_common.aio_builder()
    if not b.is_compatible(verbose=False):
        sys.exit("DeepSpeed reports async_io as incompatible here (libaio-dev missing?)")
    t0 = time.time()
    mod = b.load(verbose=False)
    return mod, time.time() - t0


def ds_run(mod, torch, args, op, path):
    h = mod.aio_handle(args.block_size, args.queue_depth, False, True, args.threads)
    buf = h.new_cpu_locked_tensor(args.size, torch.empty(0, dtype=torch.uint8))
    try:
        if op == "write":
            buf.random_(0, 255)
        t0 = time.perf_counter()
        rc = h.sync_pwrite(buf, path) if op == "write" else h.sync_pread(buf, path)
        dt = time.perf_counter() - t0
        if rc < 0:
            raise RuntimeError(f"DeepSpeed {op} returned {rc}")
    finally:
        h.free_cpu_locked_tensor(buf)
    return args.size / dt


def zo_run(args, op, path, plain):
    cmd = [args.zo_bench, "--" + op, "--json", "--no-progress", "--size", str(args.size),
           "--block-size", str(args.block_size), "--queue-depth", str(args.queue_depth),
           "--threads", str(args.threads), "--path", path]
    if plain:
        cmd += ["--buffers", "plain"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res = json.loads(out)["results"]
    return next(r for r in res if r["op"] == op)["bytes_per_s"]


def fio_run(args, op, path):
    cmd = ["fio", "--name=ds-cmp", f"--filename={path}", f"--size={args.size // args.threads}",
           f"--offset_increment={args.size // args.threads}", f"--numjobs={args.threads}",
           f"--bs={args.block_size}", f"--iodepth={args.queue_depth}", f"--rw={op}",
           "--ioengine=io_uring", "--direct=1", "--fixedbufs", "--registerfiles", "--thread",
           "--group_reporting", "--output-format=json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["jobs"][0][op]["bw_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", action="store_true", help="create the venv and install deepspeed if needed")
    ap.add_argument("--venv", default=_ds_common.DEFAULT_VENV)
    ap.add_argument("--system-torch", action="store_true",
                    help="with --setup: the venv over Debian's torch 1.13 (DeepSpeed 0.14.4)")
    ap.add_argument("--size", type=parse_size, default=1 << 30)
    ap.add_argument("--block-size", type=parse_size, default=1 << 20)
    ap.add_argument("--queue-depth", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--path", default="/var/tmp/zo-ds-aio-bench.dat")
    ap.add_argument("--zo-bench", default=os.path.join(ROOT, "build", "tools", "zo-aio-bench"))
    ap.add_argument("--no-fio", action="store_true")
    ap.add_argument("--no-plain", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.size % args.threads:
        sys.exit("--size must divide evenly by --threads (DeepSpeed's handle splits the bytes evenly)")

    if not _ds_common.in_venv(args.venv):
        if args.setup:
            _ds_common.ensure_venv(args.venv, args.system_torch)
        py = _ds_common.venv_python(args.venv)
        if not os.path.exists(py):
            sys.exit(f"{args.venv} does not exist: run with --setup (needs the package index)")
        os.execv(py, [py] + sys.argv)

    import torch  # noqa: E402  (the venv's)
    import deepspeed  # noqa: E402
    mod, build_s = load_ds_aio()
    if not os.access(args.zo_bench, os.X_OK):
        sys.exit(f"{args.zo_bench} not found: build zoffload first (meson compile -C build)")

    # The preallocated, fully written file every arm uses.
    sh([args.zo_bench, "--write", "--size", str(args.size), "--path", args.path, "--keep", "--no-progress"],
       stdout=subprocess.DEVNULL)
    arms = [("ds", lambda op: ds_run(mod, torch, args, op, args.path)),
            ("zo", lambda op: zo_run(args, op, args.path, False))]
    if not args.no_plain:
        arms.append(("zo-plain", lambda op: zo_run(args, op, args.path, True)))
    if not args.no_fio:
        arms.append(("fio", lambda op: fio_run(args, op, args.path)))

    machine = subprocess.run([os.path.join(os.path.dirname(args.zo_bench), "zo-info"), "--json", "--pin-test", "0"],
                             capture_output=True, text=True)
    report = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "async_io_load_s": build_s,
              "size": args.size, "block_size": args.block_size, "queue_depth": args.queue_depth,
              "threads": args.threads, "pairs": args.pairs, "file": args.path, "ops": {}}
    try:
        report["machine"] = json.loads(machine.stdout).get("machine")
    except ValueError:
        pass
    for op in ("write", "read"):
        res = {name: [] for name, _ in arms}
        for p in range(args.pairs):
            for name, fn in arms:
                res[name].append(fn(op))
            if not args.json:
                print(f"{op:5s} pair {p + 1}: " + "  ".join(f"{n} {res[n][-1] / 1e9:.3f}" for n, _ in arms)
                      + "  GB/s", flush=True)
        med = {n: statistics.median(v) for n, v in res.items()}
        ratios = {n: statistics.median([a / b for a, b in zip(res[n], res["ds"])]) for n in res if n != "ds"}
        report["ops"][op] = {"bytes_per_s": res, "median_bytes_per_s": med, "median_ratio_vs_ds": ratios}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"\nDeepSpeed {deepspeed.__version__} (torch {torch.__version__}), size {args.size}, "
              f"bs {args.block_size}, QD {args.queue_depth}, threads {args.threads}, {args.pairs} pairs; "
              f"GB = 10^9 bytes")
        for op, r in report["ops"].items():
            line = f"{op:5s} median GB/s: " + "  ".join(f"{n} {v / 1e9:.3f}" for n, v in r["median_bytes_per_s"].items())
            line += "   ratio vs ds: " + "  ".join(f"{n} {v:.3f}" for n, v in r["median_ratio_vs_ds"].items())
            print(line)
    os.unlink(args.path)


if __name__ == "__main__":
    main()
