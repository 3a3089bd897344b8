#!/usr/bin/env python3
"""Train a small Llama-style decoder with zoffload's OffloadAdamW.

A decoder-only transformer written here (RMSNorm, rotary position
embeddings, SwiGLU; random init, nothing downloaded), trained as a
byte-level language model on local text: by default the licence texts every
Debian system ships in /usr/share/common-licenses (or /usr/share/dict),
else generated text. Prints the loss, tokens/s, where each step's time
went, the optimizer's pinned memory and the peak host memory.

    /usr/bin/python3 examples/finetune.py --dim 256 --layers 4 --steps 30
    /usr/bin/python3 examples/finetune.py --compare torch     # also torch.optim.AdamW
    /usr/bin/python3 examples/finetune.py --delay-update      # DPU

Parameters are bf16 by default (CPU torch runs bf16 matmuls through oneDNN,
fast on AVX-512/AMX machines; fp32 is slower). With --device cuda the model
runs on the GPU and the optimizer state stays in pinned host memory.
Set ZOFFLOAD_LIB (or PYTHONPATH=python in a checkout with a build/
directory) so the package finds libzoffload.
"""

import argparse
import glob
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import zoffload  # noqa: E402
from zoffload.torch import OffloadAdamW  # noqa: E402
from zoffload import mem as zmem  # noqa: E402


# ----------------------------------------------------------------- the model
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rotary_tables(seq, head_dim, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)      # [seq, hd/2]
    return torch.cos(ang), torch.sin(ang)


def apply_rotary(x, cos, sin):
    # x: [b, h, s, hd]; rotate pairs (x0, x1) by the position's angle
    x0, x1 = x.float()[..., 0::2], x.float()[..., 1::2]
    c, s = cos[: x.shape[2]], sin[: x.shape[2]]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q, k, v = (w(x).view(b, s, self.heads, self.hd).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            att = (q @ k.transpose(-2, -1)).float() / math.sqrt(self.hd)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype)
            o = att @ v
        return self.wo(o.transpose(1, 2).reshape(b, s, d))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.n1, self.attn = RMSNorm(dim), Attention(dim, heads)
        self.n2, self.mlp = RMSNorm(dim), SwiGLU(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.n1(x), cos, sin)
        return x + self.mlp(self.n2(x))


class Decoder(nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq):
        super().__init__()
        hidden = int(8 * dim / 3 / 64 + 0.999) * 64          # Llama's 2/3 * 4d, rounded to 64
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rotary_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        return self.head(self.norm(x))


# ------------------------------------------------------------------ the data
def load_corpus(paths):
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "**", "*"), recursive=True)) if os.path.isdir(p) else [p]
    data = bytearray()
    for f in files:
        if os.path.isfile(f) and not os.path.islink(f):
            try:
                with open(f, "rb") as fh:
                    data += fh.read()
            except OSError:
                pass
    return bytes(data), files


def generated_corpus(n=1 << 20, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = ["offload", "tensor", "memory", "optimizer", "pinned", "gradient", "step", "the",
             "a", "of", "to", "host", "device", "nvme", "update", "parameter"]
    idx = torch.randint(len(words), (n // 6,), generator=g).tolist()
    return " ".join(words[i] for i in idx).encode()[:n]


def batches(data, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    while True:
        starts = torch.randint(len(t) - seq - 1, (batch,), generator=g)
        x = torch.stack([t[s: s + seq + 1] for s in starts.tolist()]).long()
        yield x[:, :-1], x[:, 1:]


# ------------------------------------------------------------------ parameter offload
def offload_params(args, which, model, opt):
    """--offload-params host|nvme (the zoffload run): the parameters live in
    zoffload's tiered store (pinned host memory, or NVMe under --nvme-path)
    and each module's are fetched to the device before it runs and released
    after, within --param-budget device bytes; opt.step() runs inside the
    offload's updating(), which puts the new values home. The offload's
    accounting is printed when the optimizer closes."""
    if not args.offload_params or which != "zoffload":
        return None
    from zoffload.torch import offload_parameters
    off = offload_parameters(model, budget=args.param_budget, home=args.offload_params,
                             nvme_path=args.nvme_path, optimizer=opt)
    close = opt.close

    def close_and_report():
        s = off.stats()
        print("[%s] parameter offload (%s home): budget %.2f MiB (least %.2f), params %.2f MiB; "
              "held peak %.2f MiB, device tier peak %.2f MiB; fetches %d hits / %d misses, "
              "%d prefetched and used, stalled %.1f ms"
              % (which, off.home, s["budget"] / 2 ** 20, s["min_budget"] / 2 ** 20,
                 s["total_bytes"] / 2 ** 20, s["held_peak"] / 2 ** 20, s["device_peak"] / 2 ** 20,
                 s["hits"], s["misses"], s["prefetch_used"], 1e3 * s["stall_s"]))
        close()
    opt.close = close_and_report
    return off


# ------------------------------------------------------------------ training
def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(args, which, data):
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    model = Decoder(256, args.dim, args.layers, args.heads, args.seq).to(dev, dtype)
    nparams = sum(p.numel() for p in model.parameters())
    if which == "zoffload":
        opt = OffloadAdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                           max_grad_norm=args.max_grad_norm, delay_update=args.delay_update,
                           nthreads=args.threads, engine=args.engine,
                           offload_device=args.offload, nvme_path=args.nvme_path,
                           loss_scale="dynamic" if args.dtype == "fp16" else None)
    elif which == "deepspeed":
        import ds_offload
        opt = ds_offload.Engine(model, args)   # DeepSpeed wraps the model: forward through it
        print("[deepspeed] %s" % opt.describe())
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    offload_params(args, which, model, opt)
    forward = opt if which == "deepspeed" else model
    print("[%s] %.2fM params, %s on %s, dim %d, %d layers, seq %d, batch %d"
          % (which, nparams / 1e6, args.dtype, dev, args.dim, args.layers, args.seq, args.batch))
    it = batches(data, args.batch, args.seq, args.seed)
    t_fwd = t_bwd = t_opt = 0.0
    tokens = 0
    losses = []
    t_start = None
    for step in range(1, args.steps + 1):
        x, y = next(it)
        x, y = x.to(dev), y.to(dev)
        sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        logits = forward(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        sync()
        t1 = time.perf_counter()
        if which == "zoffload":
            opt.scale_loss(loss).backward()
        elif which == "deepspeed":
            opt.backward(loss)             # DeepSpeed clips in its step (gradient_clipping)
        else:
            loss.backward()
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        sync()
        t2 = time.perf_counter()
        opt.step()
        if which != "deepspeed":           # DeepSpeed's engine zeroes its own gradients
            opt.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if step > args.warmup:                       # the first steps include one-time costs
            if t_start is None:
                t_start = t0
            t_fwd += t1 - t0
            t_bwd += t2 - t1
            t_opt += t3 - t2
            tokens += x.numel()
        if step % args.log_every == 0 or step == args.steps:
            print("  step %4d  loss %.4f" % (step, loss.item()))
    if which == "zoffload":
        opt.wait()
    total = time.perf_counter() - t_start if t_start else float("nan")
    n = max(args.steps - args.warmup, 1)
    res = {"which": which, "loss_first": losses[0], "loss_last": losses[-1],
           "tokens_per_s": tokens / total if t_start else float("nan"),
           "fwd_ms": 1e3 * t_fwd / n, "bwd_ms": 1e3 * t_bwd / n, "opt_ms": 1e3 * t_opt / n,
           "peak_rss_mib": peak_rss_mib()}
    if which == "zoffload":
        st = zmem.pinned_stats()
        res["pinned_mib"] = (st["locked_bytes"] + st["unlocked_bytes"]) / 2 ** 20
        res["kernel_ms"] = {k: 1e3 * v / n for k, v in opt.timings.items()}
        res["engine"] = opt.engine
        tl = opt.timeline()
        res["timeline"] = tl[0] if tl else None
        if args.save:
            name = opt.save(args.save)
            print("  saved optimizer checkpoint %s/%s" % (args.save, name))
        opt.close()
    return res


def run_deepspeed(args):
    """DeepSpeed ZeRO-Offload on the same model, data and seed: in this
    interpreter when deepspeed imports, else in DeepSpeed's venv (a child
    process running this script with --only deepspeed)."""
    sys.path.insert(0, HERE)
    import ds_offload
    if ds_offload.available():
        return run(args, "deepspeed", args._data)
    venv = os.environ.get("ZO_DS_VENV", os.path.expanduser("~/.cache/zoffload/venv-ds"))
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print("--compare deepspeed: DeepSpeed is not importable here and there is no venv at %s; "
              "make one with benchmarks/setup_ds_venv.sh --system-torch (or set ZO_DS_VENV)" % venv)
        return None
    fd, out = tempfile.mkstemp(prefix="zo-ft-ds-", suffix=".json")
    os.close(fd)
    try:
        argv, skip = [], False
        for a in sys.argv[1:]:             # the same run, less --compare
            if skip:
                skip = False
            elif a == "--compare":
                skip = True
            elif not a.startswith("--compare="):
                argv.append(a)
        cmd = [py, os.path.abspath(__file__)] + argv + ["--only", "deepspeed", "--result-json", out]
        print("--compare deepspeed: running %s" % " ".join(cmd))
        sys.stdout.flush()
        rc = subprocess.call(cmd)
        if rc != 0:
            print("--compare deepspeed: DeepSpeed's run failed (exit %d); see its output above" % rc)
            return None
        with open(out) as f:
            return json.load(f)
    finally:
        os.unlink(out)


def report(r):
    print("[%s] loss %.4f -> %.4f | %.0f tokens/s | step %.1f ms = fwd %.1f + bwd %.1f + opt %.1f"
          % (r["which"], r["loss_first"], r["loss_last"], r["tokens_per_s"],
             r["fwd_ms"] + r["bwd_ms"] + r["opt_ms"], r["fwd_ms"], r["bwd_ms"], r["opt_ms"]))
    if "kernel_ms" in r:
        k = r["kernel_ms"]
        print("[%s] optimizer per step (%s engine): %s; pinned %.1f MiB"
              % (r["which"], r["engine"], ", ".join("%s %.2f ms" % kv for kv in k.items()),
                 r["pinned_mib"]))
    if r.get("timeline"):
        t = r["timeline"]
        print("[%s] zo_optim last update: total %.2f ms = norm %.2f + compute %.2f ms, "
              "stalls %.2f ms" % (r["which"], t["total_ns"] / 1e6, t["norm_ns"] / 1e6,
                                  t["compute_ns"] / 1e6, t["stall_ns"] / 1e6))
    print("[%s] peak host memory (max RSS of the process so far) %.0f MiB"
          % (r["which"], r["peak_rss_mib"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the timings")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="optimizer threads")
    ap.add_argument("--delay-update", action="store_true", help="DPU (overlap the update)")
    ap.add_argument("--engine", choices=["auto", "zo_optim", "kernels"], default="auto",
                    help="OffloadAdamW's engine (default: zo_optim where the library has it)")
    ap.add_argument("--offload", choices=["cpu", "nvme"], default="cpu",
                    help="where masters and states live")
    ap.add_argument("--nvme-path", default=None, help="swap directory for --offload nvme")
    ap.add_argument("--offload-params", choices=["host", "nvme"], default=None,
                    help="parameter offload (ZeRO-3 style): parameters homed in pinned host "
                         "memory or on NVMe (--nvme-path), fetched per module")
    ap.add_argument("--param-budget", default="256MiB",
                    help="device bytes for parameters with --offload-params")
    ap.add_argument("--data", nargs="*", default=None,
                    help="text files or directories (default: /usr/share/common-licenses)")
    ap.add_argument("--compare", choices=["torch", "deepspeed"], default=None,
                    help="also train with torch.optim.AdamW, or with DeepSpeed ZeRO-Offload "
                         "(from the venv of benchmarks/setup_ds_venv.sh --system-torch, "
                         "$ZO_DS_VENV), and compare")
    ap.add_argument("--only", choices=["deepspeed"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result-json", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help="directory for an optimizer checkpoint at the end")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        ap.error("--dim must split into --heads heads of even size")
    paths = args.data or [p for p in ("/usr/share/common-licenses", "/usr/share/dict")
                          if os.path.isdir(p)]
    data, files = load_corpus(paths) if paths else (b"", [])
    if len(data) < 4 * (args.seq + 1):
        data = generated_corpus()
        print("corpus: %d bytes of generated text" % len(data))
    else:
        print("corpus: %d bytes from %d files under %s" % (len(data), len(files), ", ".join(paths)))
    print("libzoffload %s at %s" % (zoffload.version(), zoffload.library_path()))
    args._data = data
    if args.only:                     # the DeepSpeed half, run in DeepSpeed's venv
        r = run(args, args.only, data)
        with open(args.result_json, "w") as f:
            json.dump(r, f)
        return
    results = [run(args, "zoffload", data)]
    if args.compare == "torch":
        results.append(run(args, "torch", data))
    elif args.compare == "deepspeed":
        r = run_deepspeed(args)
        if r:
            results.append(r)
    for r in results:
        report(r)
    if len(results) == 2:
        a, b = results
        print("loss after %d steps: zoffload %.4f, %s %.4f (difference %.2e)"
              % (args.steps, a["loss_last"], b["which"], b["loss_last"],
                 abs(a["loss_last"] - b["loss_last"])))
        print("zoffload / %s: tokens/s %.3fx, optimizer step %.3fx faster"
              % (b["which"], a["tokens_per_s"] / b["tokens_per_s"], b["opt_ms"] / a["opt_ms"]))


if __name__ == "__main__":
    main()
