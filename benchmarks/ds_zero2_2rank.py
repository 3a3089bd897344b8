#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""OffloadAdamW(process_group=...) against DeepSpeed ZeRO-2 with
offload_optimizer cpu, both data-parallel over N ranks on this machine
(gloo, DeepSpeed's CPU accelerator): the same model (examples/finetune.py's
decoder), data (each rank its slice of one global batch) and seed; per
step the global loss (the ranks' mean), then tokens/s over the steps after
the warm-up.

    benchmarks/ds_zero2_2rank.py [--ranks 2] [--dim 256 --layers 4 ...] [--rounds N] [--json out.json]

Both sides run in the peers' venv (benchmarks/setup_peer_venv.sh of
../shared/peers, default ~/.cache/zoffload/peers-venv, --venv): the same
torch for both, so the forward and backward kernels are the same and the
difference is the optimizer side (gradient averaging, the CPU update,
the parameter all-gather). zoffload's library comes from ZOFFLOAD_LIB or
./build. Each rank is one process with --threads CPU threads
(OMP_NUM_THREADS), for both. DeepSpeed is driven as examples/ds_offload.py
drives it (its CPU ops JIT-built with the C++ standard fix; ZeRO stage 2,
offload_optimizer device cpu, pin_memory, contiguous gradients, no
overlap_comm: the CPU accelerator has no streams to overlap with).

Exit status 0 when both ran; the comparison (loss within --loss-tol, the
tokens/s ratio) is printed and written to --json, not judged.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
DEFAULT_VENV = os.environ.get("ZO_PEERS_VENV", os.path.expanduser("~/.cache/zoffload/peers-venv"))


class _Profile:
    """--profile: wall time per call of the torch.distributed collectives
    and of each side's optimizer pieces, summed over the timed steps (the
    ones after the warm-up), on every rank. Wrapped by name, so both
    implementations are timed by the same code; a collective's time
    includes waiting for the other ranks to reach it."""

    DIST = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
            "all_gather_into_tensor", "all_to_all_single", "broadcast", "send", "recv", "barrier")

    def __init__(self):
        self.on = False
        self.ms = {}
        self.calls = {}

    def wrap(self, owner, name, key=None):
        import functools
        import time
        f = getattr(owner, name, None)
        if f is None:
            return
        key = key or name

        @functools.wraps(f)
        def timed(*a, **k):
            if not self.on:
                return f(*a, **k)
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.ms[key] = self.ms.get(key, 0.0) + 1e3 * (time.perf_counter() - t0)
                self.calls[key] = self.calls.get(key, 0) + 1
        setattr(owner, name, timed)

    def per_step(self, steps):
        return {k: {"ms": round(v / steps, 2), "calls": round(self.calls[k] / steps, 2)}
                for k, v in sorted(self.ms.items())}


def rank_main(args):
    """One rank of one implementation (RANK, WORLD_SIZE, MASTER_* in the
    environment); rank 0 writes the result JSON."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    prof = _Profile()
    if args.profile:
        for name in _Profile.DIST:
            prof.wrap(dist, "%s" % name, "dist." + name)
        if args.impl == "zoffload":
            from zoffload import part as zpart, torch_dist as ztd
            for name in ("_reduce_scatter", "_all_gather", "_all_reduce", "_reduce_scatter_start", "_all_gather_start",
                         "_wait"):
                prof.wrap(zpart.TorchComm, name, "TorchComm." + name.lstrip("_"))
            prof.wrap(ztd._PartBackend, "take_grad", "hooks (take_grad)")
            prof.wrap(zpart.PartEngine, "grad", "zo_part_grad")
            prof.wrap(ztd._PartBackend, "step", "optimizer step (all of it)")
            prof.wrap(zpart.PartEngine, "push_params", "push_params")
    sys.path.insert(0, EXAMPLES)
    import finetune as ft
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(args.seed)
    model = ft.Decoder(256, args.dim, args.layers, args.heads, args.seq, dtype=dtype).to(dtype)
    nparams = sum(p.numel() for p in model.parameters())
    if args.impl == "deepspeed":
        import ds_offload
        ns = argparse.Namespace(batch=args.batch, lr=args.lr, weight_decay=args.weight_decay,
                                max_grad_norm=args.max_grad_norm, dtype=args.dtype, offload="cpu", nvme_path=None)
        eng = ds_offload.Engine(model, ns)       # deepspeed.init_distributed(gloo) from the environment
        forward, desc = eng, eng.describe()
        if args.profile:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            prof.wrap(DeepSpeedCPUAdam, "step", "DeepSpeedCPUAdam.step (update)")
            prof.wrap(type(eng.engine.optimizer), "step", "optimizer step (all of it)")
            prof.wrap(type(eng.engine.optimizer), "average_tensor", "average_tensor (reduce)")
    else:
        dist.init_process_group("gloo")
        from zoffload.torch import OffloadAdamW
        opt = OffloadAdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                           max_grad_norm=args.max_grad_norm or None, nthreads=args.threads, process_group=True,
                           bucket_bytes=args.bucket_bytes)
        forward, desc = model, "OffloadAdamW(process_group) on torch %s" % torch.__version__
    it = ft.batches(ft.generated_corpus(seed=args.seed), args.batch * world, args.seq, args.seed)
    losses, t_start, tokens = [], None, 0
    phase = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    for step in range(1, args.steps + 1):
        x, y = next(it)
        x, y = x[rank * args.batch:(rank + 1) * args.batch], y[rank * args.batch:(rank + 1) * args.batch]
        if step == args.warmup + 1:
            dist.barrier()
            t_start = time.perf_counter()
            prof.on = True
        t0 = time.perf_counter()
        logits = forward(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        t1 = time.perf_counter()
        if args.impl == "deepspeed":
            eng.backward(loss)                    # gradients reduced here (its hooks), or in step
            t2 = time.perf_counter()
            eng.step()
        else:
            loss.backward()                       # buckets averaged across the ranks here
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad()
        t3 = time.perf_counter()
        if step > args.warmup:
            for k, v in (("forward", t1 - t0), ("backward", t2 - t1), ("step", t3 - t2)):
                phase[k] += v
        prof.on = False
        t = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(t)                        # the global batch's loss: the ranks' mean
        losses.append(t.item() / world)
        if step > args.warmup:
            tokens += x.numel() * world
            prof.on = True
    prof.on = False
    dist.barrier()
    total = time.perf_counter() - t_start
    timed = max(args.steps - args.warmup, 1)
    if args.profile:
        every = [None] * world
        dist.all_gather_object(every, {"phases": {k: round(1e3 * v / timed, 1) for k, v in phase.items()},
                                       "calls": prof.per_step(timed)})
    res = {"impl": args.impl, "describe": desc, "ranks": world, "threads_per_rank": args.threads,
           "params": nparams, "losses": losses, "tokens_per_s": tokens / total, "seconds": total,
           "ms_per_step": {k: 1e3 * v / timed for k, v in phase.items()}}
    if args.profile:
        res["profile_per_rank"] = every
    if args.impl == "zoffload":
        m = opt.memory()
        res["state_host_bytes_per_rank"] = m["state_host_bytes"]
        res["buckets_in_grad"] = m["buckets_in_grad"]
        opt.close()
    else:
        eng.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(res, f)
    if dist.is_initialized():     # gloo's threads joined before exit (else a rare SIGABRT at exit)
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, impl, out):
    """Start args.ranks processes of this script for `impl` (torchrun's
    environment set by hand), wait for all."""
    py = os.path.join(args.venv, "bin", "python")
    lib = os.environ.get("ZOFFLOAD_LIB") or os.path.join(ROOT, "build", "libzoffload.so")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.ranks),
               OMP_NUM_THREADS=str(args.threads), DS_ACCELERATOR="cpu", ZOFFLOAD_LIB=lib,
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), EXAMPLES, HERE,
                                           os.environ.get("PYTHONPATH", "")]))
    fwd = ["--dim", args.dim, "--layers", args.layers, "--heads", args.heads, "--seq", args.seq, "--batch",
           args.batch, "--steps", args.steps, "--warmup", args.warmup, "--dtype", args.dtype, "--lr", args.lr,
           "--weight-decay", args.weight_decay, "--max-grad-norm", args.max_grad_norm, "--threads", args.threads,
           "--seed", args.seed] + (["--profile"] if args.profile else []) + \
        (["--bucket-bytes", args.bucket_bytes] if args.bucket_bytes else [])
    procs = []
    for r in range(args.ranks):
        cmd = [py, os.path.abspath(__file__), "--rank-worker", impl, "--out", out] + [str(a) for a in fwd]
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
    rcs = [p.wait() for p in procs]
    if any(rcs):
        raise SystemExit("ds_zero2_2rank: %s ranks exited %s" % (impl, rcs))
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-bytes", type=int, default=None,
                    help="zoffload's gradient bucket (bucket_bytes; default the optimizer's, 25 MiB)")
    ap.add_argument("--loss-tol", type=float, default=1e-3)
    ap.add_argument("--venv", default=DEFAULT_VENV)
    ap.add_argument("--json", default=None, help="write the comparison here")
    ap.add_argument("--profile", action="store_true",
                    help="time the collectives and optimizer pieces per step on every rank (printed, in --json)")
    ap.add_argument("--only", choices=["zoffload", "deepspeed"], default=None)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run both N times, alternating which goes first; the ratio printed is the median "
                    "of the rounds' ratios (each round's in --json)")
    ap.add_argument("--rank-worker", choices=["zoffload", "deepspeed"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        args.impl = args.rank_worker
        return rank_main(args)
    if args.rounds < 1:
        raise SystemExit("ds_zero2_2rank: --rounds %d: at least 1" % args.rounds)
    if not os.path.exists(os.path.join(args.venv, "bin", "python")):
        raise SystemExit("ds_zero2_2rank: no venv at %s (../shared/peers/setup_peer_venv.sh makes it; --venv)"
                         % args.venv)
    impls = [i for i in ("zoffload", "deepspeed") if args.only in (None, i)]
    rounds = []
    with tempfile.TemporaryDirectory() as d:
        for rnd in range(args.rounds):
            # alternated order (zoffload first in even rounds): a drift of
            # the machine's speed through the run falls on both sides
            res = {}
            for impl in (impls if rnd % 2 == 0 else impls[::-1]):
                res[impl] = launch(args, impl, os.path.join(d, impl + ".json"))
                r = res[impl]
                print("%s%s: %.1f tokens/s (rank 0 ms per step: %s), losses %s"
                      % ("round %d, " % (rnd + 1) if args.rounds > 1 else "", r["describe"], r["tokens_per_s"],
                         ", ".join("%s %.0f" % kv for kv in r["ms_per_step"].items()),
                         " ".join("%.4f" % v for v in r["losses"])), flush=True)
                for rk, pr in enumerate(r.get("profile_per_rank") or []):
                    print("  rank %d ms per step: %s" % (rk, ", ".join("%s %.0f" % kv for kv in pr["phases"].items())))
                    for k, v in pr["calls"].items():
                        print("    %-34s %8.1f ms  %5.1f calls" % (k, v["ms"], v["calls"]))
            rounds.append(res)
    out = {"args": {k: v for k, v in vars(args).items() if k not in ("rank_worker", "out")},
           "runs": rounds[0] if args.rounds == 1 else rounds}
    if len(impls) == 2:
        diffs, ratios = [], []
        for res in rounds:
            z, ds = res["zoffload"], res["deepspeed"]
            diffs.append(max(abs(a - b) for a, b in zip(z["losses"], ds["losses"])))
            ratios.append(z["tokens_per_s"] / ds["tokens_per_s"])
        diff = max(diffs)
        out["max_loss_diff"] = diff
        out["tokens_per_s_ratio"] = sorted(ratios)[len(ratios) // 2] if len(ratios) % 2 else \
            0.5 * sum(sorted(ratios)[len(ratios) // 2 - 1:len(ratios) // 2 + 1])
        out["tokens_per_s_ratios"] = ratios
        print("max |loss difference| %.2e (tolerance %.0e: %s); tokens/s zoffload / DeepSpeed = %.2f%s"
              % (diff, args.loss_tol, "within" if diff <= args.loss_tol else "NOT within",
                 out["tokens_per_s_ratio"],
                 " (median of %d alternated rounds: %s)" % (len(ratios), " ".join("%.2f" % x for x in ratios))
                 if len(ratios) > 1 else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
