# SPDX-License-Identifier: Apache-2.0
"""zoffload.torch.TiledLinear against torch.nn.Linear: forward and backward
for odd shapes (1, primes, tiles that do not divide, rows cut, inputs in
chunks of max_batch), fp32 and bf16, weights homed in pinned host memory
and on NVMe, the in-place and the copy fetch; the device budget honoured;
training with torch.optim and OffloadAdamW; clear errors for bad arguments.
CPU tensors: the host backend computes on them.

Tolerances (stated): every output is compared with a float64 reference
computed from the same (bf16-rounded where the type is bf16) inputs, with
mag = the sum of |terms| of that output:
  fp32:  |got - ref| <= 2^-20 mag   (f32 accumulation, 16 ulps of margin,
         the C tests' bound), and nn.Linear meets the same bound;
  bf16:  |got - ref| <= 2^-8 |ref| + 2^-20 mag   (one rounding of an f32
         result to bf16: half an ulp is 2^-9 relative, so one ulp of margin).
nn.Linear meets the fp32 bound too, and ours and it differ by at most twice
that. In bf16, torch 1.13's CPU kernels round partial sums to bf16 (dx
errs by up to ~2^-7 mag there), so nn.Linear is held only to the bf16
accumulation bound 2^-8 |ref| + k 2^-8 mag (k terms), and ours and it
differ by at most the sum of the two bounds."""
import copy

import pytest

from conftest import torch_or_skip

torch = torch_or_skip()
import zoffload  # noqa: E402
from zoffload import tiling  # noqa: E402
from zoffload.torch import TiledLinear, OffloadAdamW  # noqa: E402

F64 = torch.float64


def bound(ref, mag, dtype):
    if dtype == torch.bfloat16:
        return 2.0 ** -8 * ref.abs() + 2.0 ** -20 * mag
    return 2.0 ** -20 * mag + 1e-30


def nn_bound(ref, mag, dtype, k):
    """What nn.Linear meets: ours in fp32; bf16 accumulation of k terms in bf16."""
    if dtype == torch.bfloat16:
        return 2.0 ** -8 * ref.abs() + k * 2.0 ** -8 * mag
    return bound(ref, mag, dtype)


def assert_close(got, ref, mag, dtype, what, lim=None):
    err = (got.to(F64) - ref).abs()
    lim = bound(ref, mag, dtype) if lim is None else lim
    bad = err > lim
    assert not bad.any(), "%s: %d of %d outside the bound, worst err %g (bound there %g)" % (
        what, int(bad.sum()), bad.numel(), float(err[bad].max()), float(lim[bad][0]))


def reference(x, w, b, gy):
    """float64 forward / backward and the magnitudes of their terms."""
    x64, w64, gy64 = x.to(F64), w.to(F64), gy.to(F64)
    y = x64 @ w64.T + (b.to(F64) if b is not None else 0)
    ymag = x64.abs() @ w64.abs().T + (b.to(F64).abs() if b is not None else 0)
    dx, dxmag = gy64 @ w64, gy64.abs() @ w64.abs()
    dw, dwmag = gy64.T @ x64, gy64.abs().T @ x64.abs()
    db, dbmag = gy64.sum(0), gy64.abs().sum(0)
    return (y, ymag), (dx, dxmag), (dw, dwmag), (db, dbmag)


def pair(in_f, out_f, dtype, bias=True, seed=0, **kw):
    """A TiledLinear and an nn.Linear with the same parameters."""
    torch.manual_seed(seed)
    ref = torch.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    with torch.no_grad():  # weights of both signs and some size
        ref.weight.uniform_(-0.5, 0.5)
        if bias:
            ref.bias.uniform_(-1, 1)
    m = TiledLinear(in_f, out_f, bias=bias, dtype=dtype, **kw)
    m.load_state_dict(ref.state_dict())
    return m, ref


def check_case(lead, in_f, out_f, dtype, bias=True, seed=0, **kw):
    m, ref = pair(in_f, out_f, dtype, bias, seed, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(*lead, in_f, generator=g).to(dtype)
    gy = torch.randn(*lead, out_f, generator=g).to(dtype)
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    y = m(xa)
    yr = ref(xb)
    assert y.shape == yr.shape and y.dtype == yr.dtype == dtype
    y.backward(gy)
    yr.backward(gy)
    x2, gy2 = x.reshape(-1, in_f), gy.reshape(-1, out_f)
    (r_y, m_y), (r_dx, m_dx), (r_dw, m_dw), (r_db, m_db) = reference(
        x2, ref.weight.detach(), ref.bias.detach() if bias else None, gy2)
    rows = x2.shape[0]
    for name, got, nn_got, r, mag, k in (
            ("y", y.detach().reshape(-1, out_f), yr.detach().reshape(-1, out_f), r_y, m_y, in_f + 1),
            ("dx", xa.grad.reshape(-1, in_f), xb.grad.reshape(-1, in_f), r_dx, m_dx, out_f),
            ("dW", m.weight.grad, ref.weight.grad, r_dw, m_dw, rows)) + (
            (("db", m.bias.grad, ref.bias.grad, r_db, m_db, rows),) if bias else ()):
        assert got.dtype == nn_got.dtype == dtype, name
        assert_close(got, r, mag, dtype, name)
        nb = nn_bound(r, mag, dtype, k)
        assert_close(nn_got, r, mag, dtype, name + " (nn.Linear)", lim=nb)
        assert_close(got, nn_got.to(F64), mag, dtype, name + " vs nn.Linear",
                     lim=bound(r, mag, dtype) + nb)
    return m, y.detach(), xa.grad, m.weight.grad


# (lead dims of x, in, out, keywords): 1 x 1 x 1; primes; tiles that do not
# divide; one tile; one row per tile; rows cut by a small budget; a budget
# choosing whole rows; chunks of max_batch (11 rows in 4s); 3-D and 1-D x
CASES = [
    ((1,), 1, 1, dict(tile=(1, 1))),
    ((7,), 13, 11, dict(tile=(4, 5))),
    ((5,), 37, 53, dict(tile=(7, 16))),
    ((3,), 29, 17, dict(tile=(17, 29))),
    ((2,), 19, 23, dict(tile=(1, 19))),
    ((3,), 1031, 7, dict(budget=6 << 10, max_batch=3)),
    ((4,), 257, 97, dict(budget=40 << 10, max_batch=4)),
    ((11,), 31, 41, dict(tile=(6, 31), max_batch=4)),
    ((2, 3), 17, 5, dict(tile=(2, 7))),
    ((), 23, 13, dict(tile=(5, 23))),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_nn_linear(case, dtype):
    lead, in_f, out_f, kw = CASES[case]
    check_case(lead, in_f, out_f, dtype, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_no_bias_and_frozen_weight(dtype):
    check_case((6,), 43, 9, dtype, bias=False, tile=(4, 43))
    m, ref = pair(20, 8, dtype, tile=(3, 20))
    m.weight.requires_grad_(False)
    x = torch.randn(5, 20).to(dtype).requires_grad_()
    m(x).sum().backward()
    assert m.weight.grad is None and m.bias.grad is not None and x.grad is not None


def test_empty_batch():
    m, ref = pair(9, 4, torch.float32, tile=(2, 9))
    x = torch.zeros(0, 9, requires_grad=True)
    y = m(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == (0, 9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fetch_modes_and_homes_identical(dtype, tmp_path):
    """The same grid gives the same bits whether the tiles are read in place
    or copied, homed in pinned host memory or on NVMe."""
    outs = []
    for kw in (dict(), dict(copy_tiles=True), dict(home="nvme", nvme_path=str(tmp_path)),
               dict(home="nvme", nvme_path=str(tmp_path), copy_tiles=True)):
        m, y, dx, dw = check_case((6,), 301, 53, dtype, tile=(10, 301), **kw)
        st = m.tile_stats()
        copied = kw.get("copy_tiles", False)
        assert st["in_place_tiles"] == (0 if copied else st["tiles"]), (kw, st)
        assert st["fetch_bytes"] == (2 * 301 * 53 * (4 if dtype == torch.float32 else 2)
                                     if copied else 0), (kw, st)
        outs.append((y, dx, dw))
        m.close()
    for o in outs[1:]:
        for a, b in zip(outs[0], o):
            assert torch.equal(a, b)


@pytest.mark.parametrize("copy_tiles", [False, True], ids=["in_place", "copy"])
def test_budget_honoured(copy_tiles):
    """The operator's device allocation is exactly the planned work bytes,
    within the budget, and no call allocates more."""
    budget = 96 << 10
    m, ref = pair(700, 300, torch.float32, budget=budget, max_batch=8, copy_tiles=copy_tiles)
    g = m.grid
    assert g["work_bytes"] <= budget
    assert g["tiles_out"] > 1  # the budget forced tiling: W is 840000 bytes
    assert bool(g["flags"] & tiling.TILE_IN_PLACE) == (not copy_tiles)
    assert g == tiling.plan(8, 300, 700, "f32", budget=budget, in_place=not copy_tiles)
    used = tiling.device_bytes_in_use(m.zo_device)
    assert used == g["work_bytes"]
    x = torch.randn(20, 700, requires_grad=True)
    m(x).square().sum().backward()
    assert tiling.device_bytes_in_use(m.zo_device) == used
    # in place needs no staging: the same budget gives fewer, larger tiles
    other = tiling.plan(8, 300, 700, "f32", budget=budget, in_place=copy_tiles)
    if copy_tiles:
        assert other["tiles_out"] < g["tiles_out"]


def test_trains_with_torch_optim_and_offload_adamw():
    """Parameters updated in place by an optimizer reach the tiles at the
    next forward: three steps of SGD, then of OffloadAdamW, track nn.Linear."""
    for make in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                 lambda p: OffloadAdamW(p, lr=1e-2, weight_decay=0.01)):
        m, ref = pair(33, 12, torch.float32, tile=(5, 33))
        om, orf = make(m.parameters()), make(ref.parameters())
        g = torch.Generator().manual_seed(3)
        for _ in range(3):
            x, t = torch.randn(8, 33, generator=g), torch.randn(8, 12, generator=g)
            for mod, opt in ((m, om), (ref, orf)):
                opt.zero_grad()
                torch.nn.functional.mse_loss(mod(x), t).backward()
                opt.step()
        for a, b in zip(m.parameters(), ref.parameters()):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
        if hasattr(om, "close"):
            om.close()
            orf.close()


def test_is_an_nn_linear():
    m, ref = pair(10, 6, torch.float32, budget=1 << 20)
    assert isinstance(m, torch.nn.Linear)
    assert list(m.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    assert "budget=1048576" in repr(m)
    m2 = copy.deepcopy(m)  # C handles are not copied: rebuilt on first use
    x = torch.randn(4, 10)
    assert torch.equal(m2(x), m(x))
    with torch.no_grad():
        m2.weight.add_(1.0)  # the copy's own tiles
    assert not torch.equal(m2(x), m(x))
    m.bfloat16()  # the operator follows the dtype
    assert m(x.bfloat16()).dtype == torch.bfloat16
    m.float()
    ref.bfloat16().float()  # the same rounding on both
    assert torch.allclose(m(x), ref(x), rtol=1e-5, atol=1e-6)
    # a write the module cannot see, then told
    y0 = m(x)
    m.weight.data.mul_(2.0)
    assert torch.equal(m(x), y0)
    m.weight_changed()
    assert torch.allclose(m(x), ref(x) * 2 - ref.bias, rtol=1e-5, atol=1e-5)


def test_bad_arguments(tmp_path):
    with pytest.raises(zoffload.BudgetError, match="below the smallest plan"):
        TiledLinear(1000, 10, budget=100)
    with pytest.raises(ValueError, match="not both"):
        TiledLinear(10, 10, budget=1 << 20, tile=(2, 2))
    with pytest.raises(ValueError, match="tile"):
        TiledLinear(10, 10, tile=(0, 5))
    with pytest.raises(ValueError, match="tile"):
        TiledLinear(10, 10, tile=7)
    with pytest.raises(ValueError, match="budget"):
        TiledLinear(10, 10, budget=-1)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        TiledLinear(10, 10, dtype=torch.float16)
    with pytest.raises(ValueError, match="in_features"):
        TiledLinear(0, 10)
    with pytest.raises(ValueError, match="max_batch"):
        TiledLinear(10, 10, max_batch=0)
    with pytest.raises(ValueError, match="home"):
        TiledLinear(10, 10, home="disk")
    with pytest.raises(ValueError, match="nvme_path"):
        TiledLinear(10, 10, home="nvme")
    with pytest.raises(ValueError, match="CPU"):
        TiledLinear(10, 10, device="meta")
    with pytest.raises(ValueError, match="go together"):
        TiledLinear(10, 10, zo_store=object())
    m = TiledLinear(10, 4, tile=(2, 10))
    with pytest.raises(RuntimeError, match="dtype"):
        m(torch.zeros(3, 10, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="in_features"):
        m(torch.zeros(3, 11))
    with pytest.raises(TypeError, match="torch.Tensor"):
        m([1.0] * 10)
    with pytest.raises(ValueError, match="budget"):
        tiling.plan(4, 10, 10, "f32")
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        tiling.plan(4, 10, 10, "f16", budget=1 << 20)
    with pytest.raises(zoffload.InvalidArgument):
        tiling.plan(4, 10, 1 << 31, "f32", budget=1 << 20)
    # a working module after all that
    assert m(torch.ones(2, 10)).shape == (2, 4)


def test_struct_layouts(tmp_path):
    """tiling.py's mirrors (zo_tiled_linear_config, zo_tile_grid, the host
    sink, the walker's stats, zo_dev_info) match the C compiler's."""
    from test_core import test_abi_layout
    for cname in ("zo_tiled_linear_config", "zo_tile_grid", "zo_tile_host_sink",
                  "zo_tile_walk_stats", "zo_dev_info"):
        assert cname in zoffload._lib.C_STRUCTS
    test_abi_layout(tmp_path)


def test_pytorch_md_example_runs(tmp_path):
    """docs/pytorch.md's TiledLinear example runs as written."""
    import os
    import re
    import subprocess
    import sys
    from conftest import SRC
    from test_docs import doc_block
    script = tmp_path / "tiled_example.py"
    script.write_text(doc_block(os.path.join(SRC, "docs", "pytorch.md"),
                                "## TiledLinear: a tiled drop-in"))
    r = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300, cwd=str(tmp_path))
    out = r.stdout.decode()
    assert r.returncode == 0, out
    m = re.search(r"max \|y - nn.Linear\| ([0-9.e+-]+)", out)
    assert m and float(m.group(1)) < 1e-4, out


def test_layers_share_a_store(tmp_path):
    """Two layers over one caller's Store (NVMe home) and Device: a small
    MLP trains like its nn.Linear twin; closing the layers frees their tiles."""
    from zoffload.optim import Device
    from zoffload import store as zs
    dev = Device("host")
    swap = zs.Swap([str(tmp_path)], arena_size=32 << 20, chunk_size=1 << 20)
    st = zs.Store(device=dev, swap=swap, slot_size=1 << 20, slots=8, trace="off")
    torch.manual_seed(5)
    refs = [torch.nn.Linear(24, 16), torch.nn.Linear(16, 3)]
    layers = [TiledLinear(r.in_features, r.out_features, home="nvme", budget=600, max_batch=8,
                          zo_store=st, zo_device=dev) for r in refs]
    for t, r in zip(layers, refs):
        t.load_state_dict(r.state_dict())
    net = torch.nn.Sequential(layers[0], torch.nn.Tanh(), layers[1])
    ref = torch.nn.Sequential(refs[0], torch.nn.Tanh(), refs[1])
    o1 = torch.optim.SGD(net.parameters(), lr=0.05)
    o2 = torch.optim.SGD(ref.parameters(), lr=0.05)
    x, t = torch.randn(8, 24), torch.randn(8, 3)
    for _ in range(3):
        for m, o in ((net, o1), (ref, o2)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), t).backward()
            o.step()
    for a, b in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert layers[0].grid["tiles_out"] > 1
    assert st.stats()["used"]["nvme"] > 0
    for t in layers:
        t.close()
    assert st.stats()["used"]["nvme"] == 0  # the tiles are gone with their layers
    st.close()
    swap.close()
    dev.close()
