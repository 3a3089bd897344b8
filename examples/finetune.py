#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
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

Big models (docs/pytorch.md, "Big models"): --preset 3b builds a
Llama-3B-like decoder (3.2B params, created in bf16), --checkpoint turns on
activation checkpointing, --offload nvme --nvme-path DIR puts the fp32
masters and states on disk, --clip-mode speculative overlaps the update and
its disk traffic with backward; the run prints the memory model against the
measured peak RSS, the step split and the NVMe bound (fio on DIR, measured
in the same run):

    /usr/bin/python3 examples/finetune.py --preset 3b --checkpoint --seq 512 --batch 1 \
        --steps 6 --warmup 1 --log-every 1 --offload nvme --nvme-path /var/tmp/zo-3b \
        --clip-mode speculative --max-grad-norm 0 --lr 1e-4 --compare torch
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
    def __init__(self, dim, eps=1e-5, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

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
    def __init__(self, dim, heads, dtype=None):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(dim, dim, bias=False, dtype=dtype)
        self.wv = nn.Linear(dim, dim, bias=False, dtype=dtype)
        self.wo = nn.Linear(dim, dim, bias=False, dtype=dtype)

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
    def __init__(self, dim, hidden, dtype=None):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False, dtype=dtype)
        self.w3 = nn.Linear(dim, hidden, bias=False, dtype=dtype)
        self.w2 = nn.Linear(hidden, dim, bias=False, dtype=dtype)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, dtype=None):
        super().__init__()
        self.n1, self.attn = RMSNorm(dim, dtype=dtype), Attention(dim, heads, dtype=dtype)
        self.n2, self.mlp = RMSNorm(dim, dtype=dtype), SwiGLU(dim, hidden, dtype=dtype)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.n1(x), cos, sin)
        return x + self.mlp(self.n2(x))


def ffn_hidden(dim):
    return int(8 * dim / 3 / 64 + 0.999) * 64               # Llama's 2/3 * 4d, rounded to 64


def _checkpoint(fn, *args):
    from torch.utils import checkpoint as ck
    try:   # torch >= 1.11: the non-reentrant form (the reentrant one is being retired)
        return ck.checkpoint(fn, *args, use_reentrant=False)
    except TypeError:
        return ck.checkpoint(fn, *args)


class Decoder(nn.Module):
    """Parameters are created in `dtype` directly (a 3B model never exists
    in fp32: that alone would be 12 GB)."""

    def __init__(self, vocab, dim, layers, heads, seq, hidden=None, dtype=None, checkpoint=False):
        super().__init__()
        hidden = hidden or ffn_hidden(dim)
        self.checkpoint = checkpoint
        self.emb = nn.Embedding(vocab, dim, dtype=dtype)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, dtype=dtype) for _ in range(layers))
        self.norm = RMSNorm(dim, dtype=dtype)
        self.head = nn.Linear(dim, vocab, bias=False, dtype=dtype)
        cos, sin = rotary_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                # activation checkpointing: keep each block's input, recompute
                # the rest of the block in backward
                x = _checkpoint(b, x, self.cos, self.sin)
            else:
                x = b(x, self.cos, self.sin)
        return self.head(self.norm(x))


# ---------------------------------------------------------------- safetensors
# The safetensors format (8-byte little-endian header length, a JSON header
# of name -> dtype, shape, [begin, end) data offsets, then the raw bytes),
# read and written here so the example needs no package beyond torch.
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


class WeightsError(Exception):
    """A weights file that cannot be used: said with the file and the tensor."""


class MemoryNeedError(Exception):
    """The run cannot fit in this machine's available memory: said before
    anything is allocated, with the figures and what would fit."""


def load_safetensors(path):
    """{name: tensor} from a .safetensors file (F32, F16, BF16)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise WeightsError("%s: %s" % (path, e.strerror or e)) from e
    if len(raw) < 8:
        raise WeightsError("%s: too short for a safetensors file" % path)
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8:
        raise WeightsError("%s: header of %d bytes in a file of %d" % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n])
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser's stack
        raise WeightsError("%s: header is not JSON (%s)" % (path, type(e).__name__)) from e
    if not isinstance(header, dict):
        raise WeightsError("%s: header is a JSON %s, not an object of tensors" % (path, type(header).__name__))
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        # every field checked for its type and range before it is used: a
        # malformed file ends in this message, never in a traceback
        ok = (isinstance(d, dict) and isinstance(d.get("dtype"), str) and d["dtype"] in _ST_DTYPES
              and isinstance(d.get("shape"), list)
              and all(type(x) is int and 0 <= x < 2 ** 48 for x in d["shape"])
              and isinstance(d.get("data_offsets"), list) and len(d["data_offsets"]) == 2
              and all(type(x) is int and x >= 0 for x in d["data_offsets"]))
        if not ok:
            raise WeightsError("%s: tensor %r: unsupported or malformed entry %.200r" % (path, name, d))
        dt, shape, (b, e) = _ST_DTYPES[d["dtype"]], d["shape"], d["data_offsets"]
        numel = math.prod(shape)
        esz = torch.tensor([], dtype=dt).element_size()
        if not (0 <= b <= e <= len(data)) or e - b != numel * esz:
            raise WeightsError("%s: tensor %r: offsets [%d, %d) do not hold %s %s"
                               % (path, name, b, e, d["dtype"], shape))
        t = torch.frombuffer(bytearray(data[b:e]), dtype=dt) if numel else torch.empty(0, dtype=dt)
        out[name] = t.reshape(shape)
    return out


def save_safetensors(path, tensors):
    """Write {name: tensor} (F32, F16, BF16) as a .safetensors file: to a new
    temporary file beside path (mkstemp: 0600, O_EXCL), renamed over it
    only when complete, so a failure leaves any earlier file as it was."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _ST_NAMES:
            raise WeightsError("%s: tensor %r has dtype %s (F32, F16, BF16 only)" % (path, name, t.dtype))
        b = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    try:
        # a fresh random name (O_EXCL, O_NOFOLLOW, 0600): a leftover of a
        # killed earlier save never blocks this one
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.",
                                   dir=os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        raise WeightsError("%s: %s" % (path, e.strerror or e)) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise WeightsError("%s: %s" % (path, e.strerror or e)) from e


def load_weights(model, path):
    """Copy a safetensors file's tensors into the model's parameters by name:
    every parameter must be there with its shape (dtype converted)."""
    w = load_safetensors(path)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(w))
    extra = sorted(set(w) - set(params))
    if missing or extra:
        raise WeightsError("%s: does not match the model: missing %s; not in the model %s"
                           % (path, missing[:5] or "none", extra[:5] or "none"))
    with torch.no_grad():
        for n, p in params.items():
            if tuple(w[n].shape) != tuple(p.shape):
                raise WeightsError("%s: tensor %r has shape %s, the model's is %s"
                                   % (path, n, tuple(w[n].shape), tuple(p.shape)))
        for n, p in params.items():
            p.copy_(w[n])
    return len(params)


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
GiB = float(1 << 30)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _meminfo(key, path="/proc/meminfo"):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_bytes():
    return _meminfo("VmRSS", "/proc/self/status") or 0


def fio_bandwidth(path, size, bs=1 << 20, iodepth=32):
    """Read and write bandwidth (bytes/s) of the disk under `path`, measured
    by fio as zo-optim-bench --vs-bound does: O_DIRECT, io_uring, fixed
    buffers, the engine's block size and queue depth, a file of `size`
    bytes laid out by the write pass and read back. None if fio is missing."""
    import shutil
    import subprocess
    fio = shutil.which("fio")
    if not fio:
        return None
    f = os.path.join(path, "finetune-fio-%d.dat" % os.getpid())
    size = max(bs, size // bs * bs)
    bw = {}
    try:
        for rw, field in (("write", 47), ("read", 6)):
            cmd = [fio, "--name=finetune-bound", "--filename=" + f, "--size=%d" % size,
                   "--bs=%d" % bs, "--iodepth=%d" % iodepth, "--rw=" + rw, "--direct=1",
                   "--ioengine=io_uring", "--fixedbufs", "--registerfiles", "--thread",
                   "--output-format=terse", "--terse-version=3"]
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
            bw[rw] = float(out.stdout.decode().strip().splitlines()[-1].split(";")[field]) * 1024
    except (subprocess.CalledProcessError, ValueError, IndexError, OSError) as e:
        print("fio on %s failed (%s): no NVMe bound" % (path, e))
        return None
    finally:
        try:
            os.unlink(f)
        except OSError:
            pass
    return bw


def torch_adamw_need(nparams, dtype):
    """Host bytes plain torch AdamW needs for mixed-precision training of
    these params: params + grads in their dtype, and (params not fp32) the
    fp32 masters and fp32 exp_avg / exp_avg_sq every mixed-precision
    recipe keeps (12 B/param); fp32 params: params, grads, 2 states.
    Activations come on top."""
    es = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4}[dtype]
    return nparams * (2 * es + (12 if es == 2 else 8))


def zoffload_need(args, nparams, hidden, dtype, offload_params=None):
    """Host bytes the zoffload run will hold at its peak, from the sizes alone
    (decided before anything is allocated: a 3B fp32 model was OOM-killed at
    24.3 GB before its first step, leaving its swap files behind): the model's
    parameters (only the device budget under --offload-params nvme), what the
    engine allocates for this configuration (asked of the library,
    zoffload.optim.estimate: masters and states under host placement, the
    store's pool, the gradient windows, parameter buffers with DPU), and the
    activations. The memory model printed after creation gives the engine's
    own figures for the same pieces."""
    from zoffload import optim as zoptim
    es = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4}[dtype]
    params = nparams * es
    if offload_params == "nvme":
        params = min(params, parse_size(args.param_budget))
    # OffloadAdamW on CPU tensors: one group, the host backend, the engine
    # writing the params in place (dev_params: only whether they are given)
    kw = dict(param_dtype={torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[dtype],
              placement="nvme" if args.offload == "nvme" else "cpu", dpu=int(bool(args.delay_update)))
    if args.sub_group_size:
        kw["sub_group_size"] = int(args.sub_group_size)
    if args.buffer_count:
        kw["buffer_count"] = int(args.buffer_count)
    if args.offload == "nvme":
        kw["nvme_path"] = args.nvme_path or "/tmp"
    fp = zoptim.estimate([{"numel": [int(nparams)], "dev_params": [1]}], backend="host", **kw)
    return params + fp["pinned_bytes"] + fp["host_bytes"] + activation_estimate(args, hidden)


def parse_size(text):
    """'256MiB', '1.5GiB', '4e9', '1G' -> bytes."""
    t = str(text).strip()
    units = [("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40),
             ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40), ("B", 1)]
    for u, m in units:
        if t.endswith(u):
            return int(float(t[:-len(u)]) * m)
    return int(float(t))


def activation_estimate(args, hidden):
    """Rough bytes of activations autograd keeps (per-element sizes of the
    tensors a block saves; with checkpointing one block's input per layer
    plus one block recomputed)."""
    es = 4 if args.dtype == "fp32" else 2
    t = args.batch * args.seq
    block = t * (10 * args.dim + 4 * hidden) * es + 3 * args.batch * args.heads * args.seq ** 2 * 4
    logits = t * 256 * 4 * 3
    if args.checkpoint:
        return args.layers * t * args.dim * es + block + logits
    return args.layers * block + logits


def run(args, which, data):
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    hidden = args.hidden or ffn_hidden(args.dim)
    if which == "torch":
        # decided before the model is built (a 3B model takes a minute to initialize)
        d, h = args.dim, hidden
        nparams = 2 * 256 * d + args.layers * (4 * d * d + 3 * d * h + 2 * d) + d
        need = torch_adamw_need(nparams, dtype)
        avail = _meminfo("MemAvailable")
        if avail is not None and need > avail and not args.force_torch:
            print("[torch] %.2fM params: plain torch.optim.AdamW in mixed precision needs %.1f GiB "
                  "(params and grads %s, fp32 masters and states) and this machine has %.1f GiB "
                  "available: it cannot allocate its state; not run (--force-torch tries anyway)"
                  % (nparams / 1e6, need / GiB, args.dtype, avail / GiB))
            return None
    if which == "zoffload":
        d, h = args.dim, hidden
        nparams = 2 * 256 * d + args.layers * (4 * d * d + 3 * d * h + 2 * d) + d
        base = rss_bytes()

        def need_with(**change):  # the same run with some options changed
            a = argparse.Namespace(**dict(vars(args), **change))
            dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[a.dtype]
            return base + zoffload_need(a, nparams, h, dt, a.offload_params)

        need = need_with()
        avail = _meminfo("MemAvailable")
        if avail is not None and need > avail and not args.force_memory:
            alts = []
            if args.dtype == "fp32":
                alts.append("--dtype bf16 needs %.1f GiB" % (need_with(dtype="bf16") / GiB))
            if args.offload_params != "nvme":
                alts.append("--offload-params nvme needs %.1f GiB" % (need_with(offload_params="nvme") / GiB))
            if args.offload == "cpu":
                alts.append("--offload nvme needs %.1f GiB" % (need_with(offload="nvme") / GiB))
            raise MemoryNeedError(
                "%.2fM params, %s: the zoffload run needs about %.1f GiB of host memory (params, gradient "
                "window, %s, activations) and MemAvailable is %.1f GiB; nothing was allocated. %s"
                "(--force-memory tries anyway)"
                % (nparams / 1e6, args.dtype, need / GiB,
                   "masters and states in memory" if args.offload == "cpu" else "the NVMe pool",
                   avail / GiB, ("Would fit or come closer: " + "; ".join(alts) + ". ") if alts else ""))
    rss0 = rss_bytes()
    model = Decoder(256, args.dim, args.layers, args.heads, args.seq, hidden=hidden,
                    dtype=dtype if dev.type == "cpu" else None,
                    checkpoint=args.checkpoint).to(dev, dtype)
    if args.weights:
        print("[%s] weights: %d tensors from %s" % (which, load_weights(model, args.weights), args.weights))
    nparams = sum(p.numel() for p in model.parameters())
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if which == "zoffload":
        opt = OffloadAdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                           max_grad_norm=args.max_grad_norm or None, delay_update=args.delay_update,
                           nthreads=args.threads, grad_hooks="backward",  # .grad freed as handed over
                           offload_device=args.offload, nvme_path=args.nvme_path,
                           clip_mode=args.clip_mode, sub_group_size=args.sub_group_size,
                           buffer_count=args.buffer_count,
                           loss_scale="dynamic" if args.dtype == "fp16" else None,
                           **_state_kw(args.state_dtype))
    elif which == "deepspeed":
        import ds_offload
        opt = ds_offload.Engine(model, args)   # DeepSpeed wraps the model: forward through it
        print("[deepspeed] %s" % opt.describe())
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    offload_params(args, which, model, opt)
    forward = opt if which == "deepspeed" else model
    print("[%s] %.2fM params, %s on %s, dim %d, hidden %d, %d layers, seq %d, batch %d%s"
          % (which, nparams / 1e6, args.dtype, dev, args.dim, hidden, args.layers, args.seq,
             args.batch, ", activation checkpointing" if args.checkpoint else ""))
    acct = None
    if which == "zoffload" and opt.memory() is not None:
        m = opt.memory()
        act = activation_estimate(args, hidden)
        where = "on NVMe (%s)" % args.nvme_path if args.offload == "nvme" else "in pinned memory"
        # pinned_bytes holds the masters and states under host placement
        acct = {"baseline": rss0, "params": pbytes, "grad_window": m["grad_buffer_bytes"],
                "pinned": m["pinned_bytes"], "other_host": m["host_bytes"] - m["grad_buffer_bytes"],
                "activations_est": act}
        pred = sum(acct.values())
        print("[zoffload] memory model: process before the model %.2f GiB + params %.2f GiB + "
              "gradient window %.2f GiB (%s) + engine pinned %.2f GiB + engine other %.2f GiB + "
              "activations ~%.2f GiB = %.2f GiB predicted peak RSS; masters and states %.2f GiB %s"
              % (rss0 / GiB, pbytes / GiB, m["grad_buffer_bytes"] / GiB,
                 "%.0f B/param" % (m["grad_buffer_bytes"] / max(nparams, 1)), m["pinned_bytes"] / GiB,
                 acct["other_host"] / GiB, act / GiB, pred / GiB, m["state_bytes"] / GiB, where))
        acct["predicted"] = pred
        acct["state_bytes"] = m["state_bytes"]
    bound_bw = None
    if which == "zoffload" and args.offload == "nvme" and args.nvme_bound == "fio":
        st = opt.memory()["state_bytes"]
        bound_bw = fio_bandwidth(args.nvme_path, min(st, 4 << 30))
        if bound_bw:
            print("[zoffload] fio on %s: read %.2f GB/s, write %.2f GB/s (1 MiB blocks, queue depth 32, "
                  "O_DIRECT, io_uring); a step moves the %.2f GB of masters and states in and out: "
                  "NVMe bound %.1f s (the speculative step overlaps it with backward: pick the batch "
                  "so that forward+backward is at least ~1.3x that)"
                  % (args.nvme_path, bound_bw["read"] / 1e9, bound_bw["write"] / 1e9, st / 1e9,
                     st / bound_bw["read"] + st / bound_bw["write"]))
    it = batches(data, args.batch, args.seq, args.seed)
    t_fwd = t_bwd = t_opt = 0.0
    stall = 0.0
    nvme_r = nvme_w = 0
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
        del logits
        tl = opt.timeline() if which == "zoffload" else None
        tl = tl[0] if tl else None
        if step > args.warmup:                       # the first steps include one-time costs
            if t_start is None:
                t_start = t0
            t_fwd += t1 - t0
            t_bwd += t2 - t1
            t_opt += t3 - t2
            tokens += x.numel()
            if tl:
                stall += tl["stall_ns"] / 1e9
                nvme_r += tl["nvme_read_bytes"]
                nvme_w += tl["nvme_write_bytes"]
        if step % args.log_every == 0 or step == args.steps or args.log_every == 1:
            extra = ""
            if tl and args.log_every == 1:
                extra = ("  (fwd %.2f s, bwd %.2f s, step call %.2f s, sub-groups updated during "
                         "backward so far %d, engine stall %.2f s, rss %.2f GiB"
                         % (t1 - t0, t2 - t1, t3 - t2, opt._eb.engines[0][1].info()["eager_subgroups"],
                            tl["stall_ns"] / 1e9,
                            rss_bytes() / GiB))
                if bound_bw:
                    b = tl["nvme_read_bytes"] / bound_bw["read"] + tl["nvme_write_bytes"] / bound_bw["write"]
                    extra += ", NVMe bound %.2f s, step / max(fwd+bwd, bound) %.3f" % (
                        b, (t3 - t0) / max(t2 - t0, b, 1e-9))
                extra += ")"
            print("  step %4d  loss %.4f%s" % (step, loss.item(), extra), flush=True)
    if which == "zoffload":
        opt.wait()
    total = time.perf_counter() - t_start if t_start else float("nan")
    n = max(args.steps - args.warmup, 1)
    res = {"which": which, "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
           "tokens_per_s": tokens / total if t_start else float("nan"),
           "fwd_ms": 1e3 * t_fwd / n, "bwd_ms": 1e3 * t_bwd / n, "opt_ms": 1e3 * t_opt / n,
           "peak_rss_mib": peak_rss_mib(), "acct": acct}
    if which == "zoffload":
        st = zmem.pinned_stats()
        res["pinned_mib"] = (st["locked_bytes"] + st["unlocked_bytes"]) / 2 ** 20
        res["kernel_ms"] = {k: 1e3 * v / n for k, v in opt.timings.items()}
        tl = opt.timeline()
        res["timeline"] = tl[0] if tl else None
        res["stall_ms"] = 1e3 * stall / n
        if bound_bw and nvme_r + nvme_w:
            res["nvme"] = {"read_bytes": nvme_r / n, "write_bytes": nvme_w / n,
                           "read_bw": bound_bw["read"], "write_bw": bound_bw["write"],
                           "bound_ms": 1e3 * (nvme_r / n / bound_bw["read"] + nvme_w / n / bound_bw["write"])}
        if args.save:
            name = opt.save(args.save)
            print("  saved optimizer checkpoint %s/%s" % (args.save, name))
    if which != "torch":                   # OffloadAdamW, DeepSpeed's engine (gives back the collectives)
        opt.close()
    if args.save_weights and which == "zoffload":
        save_safetensors(args.save_weights, dict(model.named_parameters()))
        print("  saved the model's weights to %s" % args.save_weights)
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
        print("[%s] optimizer per step: %s; pinned %.1f MiB"
              % (r["which"], ", ".join("%s %.2f ms" % kv for kv in k.items()),
                 r["pinned_mib"]))
    if r.get("timeline"):
        t = r["timeline"]
        print("[%s] zo_optim last update: total %.2f ms = norm %.2f + compute %.2f ms, "
              "stalls %.2f ms" % (r["which"], t["total_ns"] / 1e6, t["norm_ns"] / 1e6,
                                  t["compute_ns"] / 1e6, t["stall_ns"] / 1e6))
    print("[%s] peak host memory (max RSS of the process so far) %.0f MiB"
          % (r["which"], r["peak_rss_mib"]))
    if r.get("acct"):
        a = r["acct"]
        print("[%s] peak RSS %.2f GiB, predicted %.2f GiB (memory model above)"
              % (r["which"], r["peak_rss_mib"] / 1024.0, a["predicted"] / GiB))
    if "stall_ms" in r:
        fb = r["fwd_ms"] + r["bwd_ms"]
        step = fb + r["opt_ms"]
        line = ("[%s] step split: forward+backward %.1f ms (the update overlaps backward with "
                "--clip-mode speculative), optimizer step call %.1f ms (what the update adds after "
                "backward), engine stall %.1f ms (its worker waiting for gradients or the disk: "
                "during backward that is overlap, not lost time)"
                % (r["which"], fb, r["opt_ms"], r["stall_ms"]))
        nv = r.get("nvme")
        if nv:
            line += ("; NVMe per step: read %.2f GB at %.2f GB/s + write %.2f GB at %.2f GB/s = bound "
                     "%.1f ms; step / max(forward+backward, NVMe bound) = %.3f"
                     % (nv["read_bytes"] / 1e9, nv["read_bw"] / 1e9, nv["write_bytes"] / 1e9,
                        nv["write_bw"] / 1e9, nv["bound_ms"], step / max(fb, nv["bound_ms"])))
        print(line)


def _state_kw(name):
    """OffloadAdamW's state keywords of --state-dtype (q8/q4: no_grad "zero",
    the only rule of quantized states; every parameter gets a gradient here)."""
    if name in ("q8", "q4"):
        return {"state_dtype": name, "no_grad": "zero"}
    return {"state_dtype": torch.bfloat16 if name == "bf16" else torch.float32}


PRESETS = {"3b": {"dim": 3200, "layers": 26, "heads": 32}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="model shape: 3b = Llama-3B-like (dim 3200, 26 layers, 32 heads, 3.2B "
                         "params with this byte vocabulary); --dim/--layers/--heads override")
    ap.add_argument("--dim", type=int, default=None, help="model width (default 256)")
    ap.add_argument("--layers", type=int, default=None, help="blocks (default 4)")
    ap.add_argument("--heads", type=int, default=None, help="attention heads (default 4)")
    ap.add_argument("--hidden", type=int, default=None, help="SwiGLU width (default Llama's 8/3 dim)")
    ap.add_argument("--checkpoint", action="store_true",
                    help="activation checkpointing: keep one input per block, recompute in backward")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the timings")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="0: no clipping")
    ap.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="optimizer threads")
    ap.add_argument("--delay-update", action="store_true", help="DPU (overlap the update)")
    ap.add_argument("--offload", choices=["cpu", "nvme"], default="cpu",
                    help="where masters and states live")
    ap.add_argument("--nvme-path", default=None, help="swap directory for --offload nvme")
    ap.add_argument("--offload-params", choices=["host", "nvme"], default=None,
                    help="parameter offload (ZeRO-3 style): parameters homed in pinned host "
                         "memory or on NVMe (--nvme-path), fetched per module")
    ap.add_argument("--param-budget", default="256MiB",
                    help="device bytes for parameters with --offload-params")
    ap.add_argument("--clip-mode", choices=["two_pass", "speculative"], default="two_pass",
                    help="speculative: update each sub-group as backward completes its gradients "
                         "(overlaps the optimizer and its NVMe traffic with backward)")
    ap.add_argument("--state-dtype", choices=["fp32", "bf16", "q8", "q4"], default="fp32",
                    help="OffloadAdamW's m and v: fp32, bf16, or block-wise quantized q8 / q4")
    ap.add_argument("--sub-group-size", type=int, default=None, help="zo_optim sub-group (elements)")
    ap.add_argument("--buffer-count", type=int, default=None, help="zo_optim NVMe pieces in flight")
    ap.add_argument("--nvme-bound", choices=["fio", "none"], default="fio",
                    help="with --offload nvme: measure the disk with fio on --nvme-path in the same "
                         "run and report the NVMe bound of the optimizer step")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--force-memory", action="store_true",
                    help="run the zoffload side even where the memory check says it cannot fit")
    ap.add_argument("--force-torch", action="store_true",
                    help="--compare torch: run torch AdamW even where its state cannot fit")
    ap.add_argument("--data", nargs="*", default=None,
                    help="text files or directories (default: /usr/share/common-licenses)")
    ap.add_argument("--compare", choices=["torch", "deepspeed"], default=None,
                    help="also train with torch.optim.AdamW, or with DeepSpeed ZeRO-Offload "
                         "(from the venv of benchmarks/setup_ds_venv.sh --system-torch, "
                         "$ZO_DS_VENV), and compare")
    ap.add_argument("--only", choices=["deepspeed"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result-json", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help="directory for an optimizer checkpoint at the end")
    ap.add_argument("--weights", default=None,
                    help="start from these weights (.safetensors, names as the model's parameters) "
                         "instead of random init")
    ap.add_argument("--save-weights", default=None, help="write the trained weights (.safetensors)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()
    if args.weights and not os.path.isfile(args.weights):
        ap.error("--weights %s: no such file" % args.weights)
    pre = PRESETS.get(args.preset, {})
    for k, d in (("dim", 256), ("layers", 4), ("heads", 4)):
        if getattr(args, k) is None:
            setattr(args, k, pre.get(k, d))
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if args.offload == "nvme" and not args.nvme_path:
        ap.error("--offload nvme needs --nvme-path")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
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
    results = [r for r in results if r is not None]
    for r in results:
        report(r)
    if len(results) == 2:
        a, b = results
        print("loss after %d steps: zoffload %.4f, %s %.4f (difference %.2e)"
              % (args.steps, a["loss_last"], b["which"], b["loss_last"],
                 abs(a["loss_last"] - b["loss_last"])))
        if args.steps <= args.warmup:      # every step was warm-up: nothing timed
            print("zoffload / %s: no speed comparison: --steps %d leaves no step after --warmup %d"
                  % (b["which"], args.steps, args.warmup))
        else:
            print("zoffload / %s: tokens/s %.3fx, optimizer step %.3fx faster"
                  % (b["which"], a["tokens_per_s"] / b["tokens_per_s"], b["opt_ms"] / a["opt_ms"]))


def cli():
    """main() with the errors a user can fix as exit 2 and one line."""
    try:
        main()
    except (WeightsError, MemoryNeedError) as e:
        print("finetune.py: %s" % e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
