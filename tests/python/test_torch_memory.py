# SPDX-License-Identifier: Apache-2.0
"""zoffload.torch: what a big model needs to fit. The
gradients wait in their own dtype (2 B/param for bf16), each p.grad is freed
as soon as the engine has it (torch never holds all gradients), the engine
writes CPU params in place (no parameter buffer), and the speculative step
updates during backward with the same bits as the two-pass step."""
import pytest

from conftest import torch_or_skip

torch = torch_or_skip()
import zoffload  # noqa: E402
from zoffload.torch import OffloadAdamW  # noqa: E402


def model(dtype=torch.bfloat16, seed=0, width=64, depth=4):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    layers.append(torch.nn.Linear(width, 3))
    return torch.nn.Sequential(*layers).to(dtype)


def batches(n, width=64, seed=1, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, width, generator=g).to(dtype), torch.randn(32, 3, generator=g).to(dtype))
            for _ in range(n)]


def loss_fn(m, b):
    x, y = b
    return (m(x).float() - y.float()).pow(2).mean()


def _after_hook(p, fn):
    """Run fn(p) after the optimizer's own gradient hook of p (registered
    later, so it runs later), on either torch hook API."""
    if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(lambda q: fn(q))
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    h = acc.register_hook(lambda gi, go: fn(p))
    return (acc, h)


def test_window_bytes_and_memory_report():
    for dt, per in ((torch.bfloat16, 2), (torch.float16, 2), (torch.float32, 4)):
        m = model(dt)
        n = sum(p.numel() for p in m.parameters())
        opt = OffloadAdamW(m.parameters(),
                           loss_scale=1.0 if dt == torch.float16 else None)
        mem = opt.memory()
        assert mem["numel"] == n
        assert mem["grad_buffer_bytes"] == per * n, (dt, mem)
        assert mem["state_bytes"] == 12 * n
        # no parameter buffer: the engine writes the CPU params in place
        assert opt._eb.direct
        assert mem["host_bytes"] == mem["grad_buffer_bytes"], mem
        opt.close()


def test_grads_freed_as_taken():
    """No two .grad tensors coexist: when a parameter's gradient arrives,
    every other parameter's .grad has already been taken and freed."""
    m = model()
    opt = OffloadAdamW(m.parameters(), lr=1e-3, grad_hooks="backward")
    params = list(m.parameters())
    seen = []
    hooks = [_after_hook(p, lambda q: seen.append(sum(x.grad is not None for x in params)))
             for p in params]
    for b in batches(3):
        loss_fn(m, b).backward()
        assert all(p.grad is None for p in params)
        opt.step()
    assert len(seen) == 3 * len(params)
    assert max(seen) == 0, seen
    for h in hooks:
        (h[1] if isinstance(h, tuple) else h).remove()
    opt.close()


def _run(clip_mode, data, max_grad_norm=None, sub_group_size=None, lr_schedule=True):
    m = model()
    opt = OffloadAdamW(m.parameters(), lr=1e-2, clip_mode=clip_mode, grad_hooks="backward",
                       max_grad_norm=max_grad_norm, sub_group_size=sub_group_size)
    for k, b in enumerate(data):
        loss_fn(m, b).backward()
        opt.step()
        opt.zero_grad()
        if lr_schedule:  # a schedule changes the LR between steps
            for g in opt.param_groups:
                g["lr"] = 1e-2 / (k + 2)
    info = opt._eb.engines[0][1].info()
    opt.close()
    return m, info


def test_speculative_equals_two_pass():
    """Without clipping the speculative step (updates during backward) gives
    the two-pass step's bits, LR schedule included; it did update sub-groups
    while backward ran."""
    data = batches(6)
    a, _ = _run("two_pass", data, sub_group_size=1024)
    b, info = _run("speculative", data, sub_group_size=1024)
    for (n, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(x, y), n
    assert info["eager_subgroups"] > 0
    assert info["rollbacks"] == 0


def test_speculative_clipping_close():
    """With clipping that hits, the speculative step rolls back and redoes:
    within the rollback's rounding of the two-pass result."""
    data = batches(4)
    a, _ = _run("two_pass", data, max_grad_norm=1e-3, sub_group_size=1024)
    b, info = _run("speculative", data, max_grad_norm=1e-3, sub_group_size=1024)
    assert info["rollbacks"] > 0
    for (n, x), y in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=1e-3, msg=n)


def test_clip_mode_errors():
    p = [torch.nn.Parameter(torch.zeros(4))]
    with pytest.raises(ValueError, match="clip_mode"):
        OffloadAdamW(p, clip_mode="eager")
    mixed = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))]
    with pytest.raises(ValueError, match="one parameter dtype"):
        OffloadAdamW(mixed, clip_mode="speculative")


def test_finetune_big_model_path(tmp_path):
    """examples/finetune.py on the path the 3B run takes, at a tiny size:
    bf16 params, activation checkpointing, NVMe placement, the speculative
    step; the memory model, the step split and (with fio) the NVMe bound
    are reported, and the loss falls."""
    import os
    import re
    import shutil
    import subprocess
    import sys
    from conftest import SRC
    cmd = [sys.executable, os.path.join(SRC, "examples", "finetune.py"), "--dim", "64",
           "--layers", "2", "--heads", "4", "--seq", "32", "--batch", "4", "--steps", "8",
           "--warmup", "2", "--log-every", "1", "--threads", "1", "--lr", "3e-3", "--checkpoint",
           "--offload", "nvme", "--nvme-path", str(tmp_path), "--clip-mode", "speculative",
           "--max-grad-norm", "0", "--sub-group-size", "4096", "--compare", "torch"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert "activation checkpointing" in out
    m = re.search(r"gradient window ([0-9.]+) GiB \(2 B/param\)", out)
    assert m, out
    assert re.search(r"masters and states [0-9.]+ GiB on NVMe", out), out
    assert re.search(r"\[zoffload\] peak RSS [0-9.]+ GiB, predicted [0-9.]+ GiB", out), out
    assert re.search(r"\[zoffload\] step split: forward\+backward [0-9.]+ ms", out), out
    # sub-groups were updated while backward ran
    ups = [int(x) for x in re.findall(r"sub-groups updated during backward so far ([0-9]+)", out)]
    assert ups and ups[-1] > 0, out
    if shutil.which("fio"):
        assert re.search(r"NVMe per step: read [0-9.]+ GB at [0-9.]+ GB/s \+ write [0-9.]+ GB at "
                         r"[0-9.]+ GB/s = bound [0-9.]+ ms; step / max\(forward\+backward, NVMe bound\) "
                         r"= [0-9.]+", out), out
    m = re.search(r"\[zoffload\] loss ([0-9.]+) -> ([0-9.]+)", out)
    assert m and float(m.group(2)) < float(m.group(1)), out
    assert not os.listdir(str(tmp_path)) or all(not f.startswith("finetune-fio") for f in os.listdir(str(tmp_path)))


def test_moved_params_followed():
    """The engine writes CPU params at their addresses (direct mode). torch
    gives a parameter new memory in module.to() / _apply() and `p.data =
    ...` (Hugging Face's Trainer does it after the optimizer exists, see
    test_hf_trainer.py): the optimizer follows the Parameter as torch's
    do, re-pointing the engine before it touches the params again. The run
    equals one that never moved, bit for bit, and the old memory (kept
    alive here, poisoned) is never written. A change of dtype, size or
    layout is refused before anything is written."""
    ref, m = model(torch.float32), model(torch.float32)
    oref, opt = OffloadAdamW(ref.parameters(), lr=1e-2), OffloadAdamW(m.parameters(), lr=1e-2)
    assert opt._eb.direct
    old = []
    for step, b in enumerate(batches(4, dtype=torch.float32)):
        for mm, o in ((ref, oref), (m, opt)):
            loss_fn(mm, b).backward()
            o.step()
            o.zero_grad()
        if step == 0:          # every parameter, the way module.to() copies
            old += [p.data for p in m.parameters()]
            m._apply(lambda t: t.clone())
        elif step == 1:        # one parameter, by hand
            p0 = next(m.parameters())
            old.append(p0.data)
            p0.data = p0.data.clone()
        for o in old:
            o.fill_(float("nan"))
        for a, c in zip(ref.parameters(), m.parameters()):
            assert torch.equal(a, c), step
    assert all(bool(torch.isnan(o).all()) for o in old)
    # load_state_dict writes the params too (accelerate's prepare_optimizer
    # does state_dict() then load_state_dict() after moving the model)
    sd = opt.state_dict()
    old = [p.data for p in m.parameters()]
    m._apply(lambda t: t.clone())
    for o in old:
        o.fill_(float("nan"))
    opt.load_state_dict(sd)
    for a, c in zip(ref.parameters(), m.parameters()):
        assert torch.equal(a, c)
    assert all(bool(torch.isnan(o).all()) for o in old)
    # refused: dtype, size, layout; nothing written
    b = batches(1, dtype=torch.float32)[0]
    for change, msg in ((lambda t: t.double(), "changed dtype"),
                        (lambda t: t.reshape(-1)[:-1].clone(), "changed size"),
                        (lambda t: t.t().contiguous().t() if t.dim() == 2 else t, "no longer contiguous")):
        loss_fn(m, b).backward()
        p0 = next(m.parameters())
        keep = p0.data
        p0.data = change(keep.detach().clone())
        before = p0.data.clone()
        with pytest.raises(RuntimeError, match=msg):
            opt.step()
        assert torch.equal(p0.data, before)
        p0.data = keep
        opt.zero_grad()
    opt.close()
    oref.close()
    # marked parameters: no direct mode
    m2 = model(torch.float32)
    for p in m2.parameters():
        p._zo_offloaded = True
    opt2 = OffloadAdamW(m2.parameters())
    assert not opt2._eb.direct
    opt2.close()
