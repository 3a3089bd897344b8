# SPDX-License-Identifier: Apache-2.0
"""zoffload.torch.offload_parameters: parameters in the tiered store, fetched
per module within a device budget. Same losses, gradients and parameters as
the model without offload (host and NVMe homes, torch.optim.AdamW and
OffloadAdamW, activation checkpointing), the budget held, prefetch hits
after the first iteration, restore, and clear errors."""
import copy
import math

import pytest

from conftest import torch_or_skip

torch = torch_or_skip()
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from zoffload.torch import (OffloadAdamW, ParamBudgetError, offload_parameters,  # noqa: E402
                            restore_parameters)

V, D = 64, 32
# small pool: the tests' pinned memory stays small
STORE = dict(slot_size=1 << 20, slots=4)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        a = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(mask, float("-inf"))
        x = x + self.proj(torch.softmax(a, -1) @ v)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Decoder(nn.Module):
    """Embedding, blocks, final norm, and a head tied to the embedding."""

    def __init__(self, layers=2, ckpt=None):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block(D) for _ in range(layers)])
        self.lnf = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight
        self.ckpt = ckpt

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            if self.ckpt is None:
                x = b(x)
            else:
                x = checkpoint(b, x, use_reentrant=self.ckpt == "reentrant")
        return self.head(self.lnf(x))


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (4, 13), generator=g) for _ in range(n)]


def _loss(model, ids):
    out = model(ids[:, :-1])
    return F.cross_entropy(out.reshape(-1, V), ids[:, 1:].reshape(-1))


def _train(model, opt, batches, grads=None):
    losses = []
    for ids in batches:
        loss = _loss(model, ids)
        loss.backward()
        if grads is not None:
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                          if p.grad is not None})
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _pair(ckpt=None, seed=0):
    torch.manual_seed(seed)
    ref = Decoder(ckpt=ckpt)
    return ref, copy.deepcopy(ref)


def _budget(off_min):
    return off_min * 3   # room for a module and prefetch, far below the whole model


@pytest.mark.parametrize("home", ["host", "nvme"])
@pytest.mark.parametrize("ckpt", [None, "reentrant", "non_reentrant"])
def test_same_as_no_offload_torch_adamw(tmp_path, home, ckpt):
    """Bit-identical losses, gradients and parameters to the model without
    offload, with the device budget far below the model's size (every
    forward and backward re-fetches), and held within it throughout."""
    ref, mod = _pair(ckpt)
    batches = _batches(5)
    oref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    omod = torch.optim.AdamW(mod.parameters(), lr=1e-2, weight_decay=0.1)
    probe = offload_parameters(copy.deepcopy(mod), budget=1 << 30, home="host", **STORE)
    budget = _budget(probe.min_budget)
    probe.restore()
    off = offload_parameters(mod, budget=budget, home=home, nvme_path=str(tmp_path),
                             optimizer=omod, **STORE)
    assert off.total_bytes > 2 * budget
    gref, gmod = [], []
    lref = _train(ref, oref, batches, gref)
    lmod = _train(mod, omod, batches, gmod)
    assert lmod == lref
    for a, b in zip(gref, gmod):
        assert a.keys() == b.keys()
        for n in a:
            assert torch.equal(a[n], b[n]), n
    s = off.stats()
    assert 0 < s["held_peak"] <= budget
    assert 0 < s["device_peak"] <= budget
    assert s["held_bytes"] == 0 and s["iterations"] == len(batches)
    assert off.saved_rebuilt > 0     # saved views of fetched copies were rebuilt at backward
    restore_parameters(mod)
    for (n, a), b in zip(ref.named_parameters(), mod.parameters()):
        assert torch.equal(a, b), n
        assert b.is_contiguous() and b.shape == a.shape
    assert mod.head.weight is mod.emb.weight


@pytest.mark.parametrize("home", ["host", "nvme"])
def test_same_as_no_offload_offload_adamw(tmp_path, home):
    """OffloadAdamW (which takes gradients during backward) over offloaded
    parameters equals OffloadAdamW over the plain model."""
    ref, mod = _pair()
    batches = _batches(4)
    kw = dict(lr=1e-2, weight_decay=0.1, max_grad_norm=1.0, grad_hooks="backward")
    oref = OffloadAdamW(ref.parameters(), **kw)
    if home == "nvme":
        # an NVMe home's params are placeholders between uses: make the
        # optimizer first (or inside off.gathered())
        omod = OffloadAdamW(mod.parameters(), **kw)
        off = offload_parameters(mod, budget=64 << 10, home=home, nvme_path=str(tmp_path),
                                 optimizer=omod, **STORE)
    else:
        # a host home's params are views of their home copies: any order works
        off = offload_parameters(mod, budget=64 << 10, home=home, **STORE)
        omod = OffloadAdamW(mod.parameters(), **kw)
        off.attach_optimizer(omod)
    lref = _train(ref, oref, batches)
    lmod = _train(mod, omod, batches)
    assert lmod == lref
    # the calls that fence and copy parameters back (state_dict, close) run
    # inside updating() too: with an NVMe home the params are placeholders
    sref, smod = oref.state_dict(), omod.state_dict()
    for i, st in sref["state"].items():
        assert torch.equal(st["exp_avg"], smod["state"][i]["exp_avg"])
    oref.close()
    omod.close()
    with off.gathered():
        for (n, a), b in zip(ref.named_parameters(), mod.parameters()):
            assert torch.equal(a, b), n
    assert off.stats()["device_peak"] <= 64 << 10
    off.restore()


class RMSNorm(nn.Module):
    """As Hugging Face's LlamaRMSNorm: on fp32 input ``x.float()`` is x itself,
    which the module then reads twice (pow and the product)."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([nn.ModuleDict({"norm": RMSNorm(D), "fc": nn.Linear(D, D)})
                                     for _ in range(3)])
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = x + b["fc"](b["norm"](x))      # x: the residual outside, twice inside the norm
        return self.head(x).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_input_read_twice_inside_a_module(dtype):
    """The limit of bit-identity (issue 21 item 13, found with HF's Llama):
    the backward release hook passes a module's inputs through an autograd
    node, so a module that reads an input twice while the input is also used
    outside (the residual) gets its two inner gradient contributions summed
    before the outer one is added, where plain torch adds the three in
    arrival order: the same gradients up to the rounding of that fp32 sum.
    The forward is identical. In bf16 the norm's first read is the cast to
    fp32, one read: bit-identical, as every module that reads each input
    once (nn.Linear, nn.LayerNorm...)."""
    torch.manual_seed(0)
    ref = NormNet().to(dtype)
    mod = copy.deepcopy(ref)
    oref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    omod = torch.optim.AdamW(mod.parameters(), lr=1e-2)
    off = offload_parameters(mod, budget=1 << 20, home="host", optimizer=omod, **STORE)
    gref, gmod = [], []
    lref = _train(ref, oref, _batches(3), gref)
    lmod = _train(mod, omod, _batches(3), gmod)
    assert lmod[0] == lref[0]                   # the forward is the same
    for n in gref[0]:
        a, b = gref[0][n].float(), gmod[0][n].float()
        if dtype == torch.bfloat16:
            assert torch.equal(a, b), n
        else:   # a regrouped sum of three fp32 terms: a few ulps of the largest
            assert (a - b).abs().max() <= 8 * 2 ** -24 * a.abs().max(), n
    if dtype == torch.bfloat16:
        assert lmod == lref
    off.restore()


def test_host_home_without_attached_optimizer(tmp_path):
    """A host home's params are their home copies between uses: a plain
    optimizer not attached writes there, and the next forward drops the
    device copies it made stale."""
    ref, mod = _pair()
    batches = _batches(4)
    oref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    off = offload_parameters(mod, budget=256 << 10, home="host", **STORE)  # all fits: cached
    omod = torch.optim.AdamW(mod.parameters(), lr=1e-2)
    assert _train(mod, omod, batches) == _train(ref, oref, batches)
    off.restore()


def test_prefetch_hits_after_first_iteration(tmp_path):
    ref, mod = _pair()
    opt = torch.optim.SGD(mod.parameters(), lr=1e-2)
    off = offload_parameters(mod, budget=64 << 10, home="nvme", nvme_path=str(tmp_path),
                             optimizer=opt, lookahead=4, **STORE)
    batches = _batches(4)
    _train(mod, opt, batches[:1])
    s1 = off.stats()
    assert s1["prefetch_used"] == 0 and s1["misses"] > 0     # iteration 1 records the trace
    off.reset_stats()
    _train(mod, opt, batches[1:])
    s = off.stats()
    assert s["trace_len"] > 0 and s["trace_mismatches"] == 0
    assert s["prefetch_used"] > 0 and s["prefetch_used"] <= s["prefetch_issued"]
    # most fetches find their copy loaded ahead or cached
    assert s["hits"] > s["misses"]
    assert s["device_peak"] <= 64 << 10
    off.restore()


def test_updating_and_gathered_nvme(tmp_path):
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    before = [p.detach().clone() for p in m.parameters()]
    off = offload_parameters(m, budget=16 << 10, home="nvme", nvme_path=str(tmp_path), **STORE)
    w = m[0].weight
    assert w.shape == (8, 8) and torch.isnan(w).all()     # placeholder between uses
    with off.gathered():
        assert torch.equal(w, before[0])
        w.data.add_(1)                                   # not written back
    with off.gathered():
        assert torch.equal(w, before[0])
    with off.updating():
        w.data.add_(1)                                   # written back
    with off.gathered():
        assert torch.equal(w, before[0] + 1)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
    assert torch.equal(sd["0.weight"], before[0] + 1)
    x = torch.randn(3, 8)
    y = m(x)
    off.restore()
    assert torch.equal(m(x), y)
    assert torch.equal(m[0].weight, before[0] + 1)


def test_bad_arguments(tmp_path):
    m = Decoder()
    with pytest.raises(ValueError, match="budget 1000 bytes is smaller than module 'blocks.0.fc"):
        offload_parameters(m, budget=1000)
    with pytest.raises(ValueError, match="budget must be a positive"):
        offload_parameters(m, budget=0)
    with pytest.raises(ValueError, match="home 'gpu'"):
        offload_parameters(m, budget=1 << 20, home="gpu")
    with pytest.raises(ValueError, match="needs nvme_path"):
        offload_parameters(m, budget=1 << 20, home="nvme")
    with pytest.raises(ValueError, match="is not a directory"):
        offload_parameters(m, budget=1 << 20, home="nvme", nvme_path=str(tmp_path / "none"))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        offload_parameters([nn.Parameter(torch.zeros(3))], budget=1 << 20)
    two = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, device="meta"))
    with pytest.raises(ValueError, match="parameters on two devices"):
        offload_parameters(two, budget=1 << 20)
    nc = nn.Linear(4, 3)
    nc.weight = nn.Parameter(torch.randn(4, 3).t())
    with pytest.raises(ValueError, match="'weight' of shape \\(3, 4\\) is not contiguous"):
        offload_parameters(nc, budget=1 << 20)
    it = nn.Linear(4, 3)
    it.register_parameter("count", nn.Parameter(torch.zeros(3, dtype=torch.int32),
                                                requires_grad=False))
    with pytest.raises(TypeError, match="'count' is torch.int32"):
        offload_parameters(it, budget=1 << 20)
    with pytest.raises(ValueError, match="not offloaded"):
        restore_parameters(m)
    # nothing was left half done: the model still works as before
    ids = _batches(1)[0]
    m(ids)
    off = offload_parameters(m, budget="1MiB", **STORE)
    with pytest.raises(ValueError, match="already offloaded"):
        offload_parameters(m, budget=1 << 20)
    off.restore()
    assert off.restore() is m       # idempotent


def test_budget_error_names_the_modules(tmp_path):
    """Parameters a module uses outside its own forward (here the root
    reads another module's weight) are fetched on demand; when that cannot
    fit the budget, the error says which parameters and what was held."""

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(64, 64)
            self.b = nn.Linear(64, 64)

        def forward(self, x):
            return self.a(x) + self.b(x)

    m = Odd()
    off = offload_parameters(m, budget=20 << 10, home="host", **STORE)
    x = torch.randn(2, 64, requires_grad=True)
    m(x).sum().backward()                        # fits: a then b
    # hold a's params (as a forward stack would) and fetch b's: too much
    ra = [off.params["a.weight"], off.params["a.bias"]]
    off._fetch(ra, "test")
    with pytest.raises(ParamBudgetError) as ei:
        off._fetch([off.params["b.weight"]], "forward of 'b'")
    msg = str(ei.value)
    assert "forward of 'b'" in msg and "'b.weight'" in msg and "a.weight" in msg
    assert isinstance(ei.value, MemoryError)
    assert off.params["b.weight"].refs == 0      # nothing left taken
    off._release(ra)
    off.restore()


def test_finetune_example_offload_params(tmp_path):
    """examples/finetune.py --offload-params: the same losses as without,
    and the offload's report."""
    import os
    import re
    import subprocess
    import sys
    from conftest import SRC

    def run(*extra):
        cmd = [sys.executable, os.path.join(SRC, "examples", "finetune.py"), "--dim", "32",
               "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "2", "--steps", "4",
               "--warmup", "1", "--threads", "1", "--lr", "3e-3", "--log-every", "1"] + list(extra)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        out = r.stdout.decode()
        assert r.returncode == 0, out
        return out, re.findall(r"step +[0-9]+ +loss ([0-9.]+)", out)

    _, plain = run()
    for home in ("host", "nvme"):
        out, losses = run("--offload-params", home, "--param-budget", "48KiB",
                          "--nvme-path", str(tmp_path))
        assert losses == plain and len(plain) == 4, out
        m = re.search(r"parameter offload \(%s home\): budget ([0-9.]+) MiB .* held peak ([0-9.]+) "
                      r"MiB, device tier peak ([0-9.]+) MiB" % home, out)
        assert m, out
        assert float(m.group(2)) <= float(m.group(1)) and float(m.group(3)) <= float(m.group(1))


def test_gradient_accumulation_and_a_failed_forward(tmp_path):
    """Two backward passes per step accumulate as without offload; a
    forward that raised half-way leaves nothing fetched for the next one."""
    ref, mod = _pair(seed=5)
    oref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    omod = torch.optim.AdamW(mod.parameters(), lr=1e-2)
    off = offload_parameters(mod, budget=64 << 10, home="nvme", nvme_path=str(tmp_path),
                             optimizer=omod, **STORE)
    batches = _batches(6, seed=9)
    for m, o in ((ref, oref), (mod, omod)):
        losses = []
        for i in range(0, 6, 2):
            for ids in batches[i:i + 2]:
                loss = _loss(m, ids)
                loss.backward()
                losses.append(loss.item())
            o.step()
            o.zero_grad()
        if m is ref:
            lref = losses
    assert losses == lref
    with pytest.raises(IndexError):
        mod(torch.full((2, 5), V + 3))      # the embedding raises after its params were fetched
    assert off.stats()["held_bytes"] > 0
    loss = _loss(mod, batches[0])           # the next forward starts clean
    loss.backward()
    assert off.stats()["held_bytes"] == 0
    with off.gathered():
        for (n, a), b in zip(ref.named_parameters(), mod.parameters()):
            assert torch.equal(a, b), n
    off.restore()


def test_failed_offload_leaves_the_model_intact(tmp_path, monkeypatch):
    """A failure while the parameters are being registered (injected at the
    third write into the store) leaves every parameter with its own values
    and the model usable; nothing stays hooked."""
    from zoffload import store as zs
    torch.manual_seed(2)
    m = Decoder()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    calls = {"n": 0}
    orig = zs.Store.write

    def failing_write(self, t, src, off=0):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("injected write failure")
        return orig(self, t, src, off)
    monkeypatch.setattr(zs.Store, "write", failing_write)
    with pytest.raises(OSError, match="injected"):
        offload_parameters(m, budget=1 << 20, home="nvme", nvme_path=str(tmp_path), **STORE)
    monkeypatch.setattr(zs.Store, "write", orig)
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n]), n
        assert p.is_contiguous()
    assert getattr(m, "_zo_param_offload", None) is None
    m(_batches(1)[0])
    off = offload_parameters(m, budget=1 << 20, **STORE)
    off.restore()
