# SPDX-License-Identifier: Apache-2.0
"""Quantized optimizer states (q8, q4) from Python: the engine group fields
(state_bits / state_block at the C struct's offsets, read back through
zo_optim_estimate's byte counts), OffloadAdamW(state_dtype="q8"/"q4")
against the engine driven directly (bit for bit), against torch.optim.AdamW
where the quantization cannot matter yet (the first step), against an
fp32-state run (states within quantization error, loss comparable), state
dicts both ways, checkpoints, and the refusals. CPU tensors stand in for
device memory."""
import copy

import pytest

from conftest import torch_or_skip

torch = torch_or_skip()
from zoffload import optim  # noqa: E402
import zoffload.torch as zoffload_torch  # noqa: E402
from zoffload.torch import (OffloadAdamW, OffloadAdam, OffloadAdagrad, OffloadLion,  # noqa: E402
                            from_deepspeed_config)

HP = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 24),
                               torch.nn.Tanh(), torch.nn.Linear(24, 3))


def batches(n, seed=1):
    # a learnable target: a fixed linear map of the input, plus noise
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(12, 3, generator=g) / 3
    out = []
    for _ in range(n):
        x = torch.randn(16, 12, generator=g)
        out.append((x, x @ w + 0.05 * torch.randn(16, 3, generator=g)))
    return out


def loss_fn(m, b):
    x, y = b
    return (m(x) - y).pow(2).mean()


def train(m, opt, data):
    losses = []
    for b in data:
        opt.zero_grad()
        loss = loss_fn(m, b)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def same_params(m1, m2):
    return all(torch.equal(a.detach(), b.detach()) for a, b in zip(m1.parameters(), m2.parameters()))


@pytest.mark.parametrize("sd,per_el", [("f32", 12.0), ("bf16", 8.0), ("q8", 6.03), ("q4", 5.06)])
def test_group_fields_reach_the_engine(sd, per_el):
    # a wrong ctypes offset of state_bits / state_block would leave the
    # engine with fp32 states: its own byte count tells
    n = 1 << 20
    e = optim.estimate([{"numel": [n], "state_dtype": sd}], param_dtype="f32")
    assert e["host_state_bytes"] / n == pytest.approx(per_el, abs=0.01)
    if sd in ("q8", "q4"):
        # 2 states x 4 B of absmax per block (the engine rounds allocations up)
        big = optim.estimate([{"numel": [n], "state_dtype": sd, "state_block": 4096}], param_dtype="f32")
        assert e["host_state_bytes"] - big["host_state_bytes"] == pytest.approx(
            2 * 4 * n * (1 / (256 if sd == "q8" else 128) - 1 / 4096), abs=8192)
        raw = optim.estimate([{"numel": [n], "state_bits": 8 if sd == "q8" else 4}], param_dtype="f32")
        assert raw["host_state_bytes"] == e["host_state_bytes"]
    assert optim.OptimGroup.state_bits.offset + 4 <= optim.ctypes.sizeof(optim.OptimGroup)


def test_engine_refuses_bad_block():
    with pytest.raises(Exception):
        optim.estimate([{"numel": [1000], "state_dtype": "q8", "state_block": 100}], param_dtype="f32")


LINEAR_MAPS = dict(state_map_m="linear", state_map_v="linear_nz")


@pytest.mark.parametrize("q,maps", [("q8", {}), ("q4", {}), ("q8", LINEAR_MAPS), ("q4", LINEAR_MAPS)])
def test_equals_engine_driven_directly(q, maps):
    # the torch wrapper adds nothing to the engine's arithmetic: the same
    # gradients through optim.Engine give the same parameters, bit for bit
    # (with the maps chosen: the optimizer hands them to its engine)
    m1, data = model(), batches(15)
    m2 = copy.deepcopy(m1)
    opt = OffloadAdamW(m1.parameters(), state_dtype=q, nthreads=2, **maps, **HP)
    assert opt.no_grad == "zero"
    e = optim.Engine([{"numel": [p.numel() for p in m2.parameters()], "state_dtype": q}],
                     param_dtype="f32", kind="adamw", lr=HP["lr"], betas=HP["betas"],
                     weight_decay=HP["weight_decay"], nthreads=2, no_grad="zero", **maps)
    for i, p in enumerate(m2.parameters()):
        e.import_state(i, "master", p.detach().reshape(-1).numpy().copy())
        for nm in ("exp_avg", "exp_avg_sq"):
            e.import_state(i, nm, torch.zeros(p.numel()).numpy())
    for b in data:
        opt.zero_grad()
        loss_fn(m1, b).backward()
        opt.step()
        for p in m2.parameters():
            p.grad = None
        loss_fn(m2, b).backward()
        for i, p in enumerate(m2.parameters()):
            e.grad_host(i, p.grad.reshape(-1).numpy())
        e.step()
        with torch.no_grad():
            for i, p in enumerate(m2.parameters()):
                p.copy_(torch.from_numpy(e.param_buffer(i).copy()).reshape(p.shape))
    assert same_params(m1, m2)
    st = opt.state_dict()["state"]
    for i, p in enumerate(m2.parameters()):
        for nm in ("exp_avg", "exp_avg_sq"):
            ref = e.export_state(i, nm, torch.zeros(p.numel()).numpy())
            assert torch.equal(st[i][nm].reshape(-1), torch.from_numpy(ref))
    e.close()


@pytest.mark.parametrize("q", ["q8", "q4"])
def test_first_step_equals_torch(q):
    # fresh states are zero codes, which read 0 exactly: the first update
    # is computed from exact moments, so it is torch's within fp32 ulps
    m1, m2, data = model(), model(), batches(1)
    train(m1, torch.optim.AdamW(m1.parameters(), **HP), data)
    train(m2, OffloadAdamW(m2.parameters(), state_dtype=q, nthreads=2, **HP), data)
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


# tol: of the largest moment of the model (a block's absmax is at most that,
# and blocks run across tensors); gap: the last 10 losses against fp32 states
@pytest.mark.parametrize("q,tol,gap", [("q8", 0.05, 0.1), ("q4", 0.25, 0.4)])
def test_states_and_loss_close_to_fp32_states(q, tol, gap):
    data = batches(60)
    m32, mq = model(), model()
    o32 = OffloadAdamW(m32.parameters(), nthreads=2, no_grad="zero", **HP)
    oq = OffloadAdamW(mq.parameters(), state_dtype=q, nthreads=2, **HP)
    l32, lq = train(m32, o32, data), train(mq, oq, data)
    # both learn, and comparably
    assert sum(lq[-10:]) < 0.8 * sum(lq[:10])
    assert sum(lq[-10:]) == pytest.approx(sum(l32[-10:]), rel=gap)
    # after one step from the same params, the dequantized moments are the
    # fp32 ones within the quantization error of their block
    m32, mq = model(), model()
    o32 = OffloadAdamW(m32.parameters(), nthreads=2, no_grad="zero", **HP)
    oq = OffloadAdamW(mq.parameters(), state_dtype=q, nthreads=2, **HP)
    train(m32, o32, data[:1])
    train(mq, oq, data[:1])
    s32, sq = o32.state_dict()["state"], oq.state_dict()["state"]
    for nm in ("exp_avg", "exp_avg_sq"):
        scale = max(float(s32[i][nm].abs().max()) for i in s32)
        for i in s32:
            a, b = s32[i][nm], sq[i][nm]
            assert b.dtype == torch.float32 and b.shape == a.shape
            assert float((a - b).abs().max()) <= tol * scale, (i, nm)
    assert oq.memory()["state_bytes"] < o32.memory()["state_bytes"] * (0.55 if q == "q8" else 0.45)


@pytest.mark.parametrize("q", ["q8", "q4"])
def test_checkpoint_round_trip_bit_for_bit(q, tmp_path):
    data = batches(20)
    m1 = model()
    o1 = OffloadAdamW(m1.parameters(), state_dtype=q, nthreads=2, **HP)
    train(m1, o1, data[:10])
    name = o1.save(tmp_path)
    m2 = copy.deepcopy(m1)
    o2 = OffloadAdamW(m2.parameters(), state_dtype=q, nthreads=2, **HP)
    o2.load(tmp_path, name)
    train(m1, o1, data[10:])
    train(m2, o2, data[10:])
    assert same_params(m1, m2)


def test_checkpoint_across_state_types(tmp_path):
    # q8 -> fp32 on load: exactly the dequantized moments
    data = batches(10)
    m1 = model()
    o1 = OffloadAdamW(m1.parameters(), state_dtype="q8", nthreads=2, **HP)
    train(m1, o1, data)
    name = o1.save(tmp_path)
    m2 = copy.deepcopy(m1)
    o2 = OffloadAdamW(m2.parameters(), nthreads=2, no_grad="zero", **HP)
    o2.load(tmp_path, name)
    s1, s2 = o1.state_dict()["state"], o2.state_dict()["state"]
    for i in s1:
        for nm in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(s1[i][nm], s2[i][nm])


def test_dequantized_state_dict_loads_into_torch_and_back():
    data = batches(20)
    m1 = model()
    o1 = OffloadAdamW(m1.parameters(), state_dtype="q8", nthreads=2, **HP)
    train(m1, o1, data[:10])
    sd = o1.state_dict()
    # torch.optim.AdamW takes it as it is
    mt = copy.deepcopy(m1)
    ot = torch.optim.AdamW(mt.parameters(), **HP)
    ot.load_state_dict(copy.deepcopy(sd))
    # and so does a q8 optimizer: the whole-tensor import requantizes; the
    # states read back within half a code step of the block (not bit-exact
    # where a tensor covers part of a block, docs/optim.md)
    m2 = copy.deepcopy(m1)
    o2 = OffloadAdamW(m2.parameters(), state_dtype="q8", nthreads=2, **HP)
    o2.load_state_dict(copy.deepcopy(sd))
    sd2 = o2.state_dict()
    for nm in ("exp_avg", "exp_avg_sq"):
        scale = max(float(sd["state"][i][nm].abs().max()) for i in sd["state"])
        for i in sd["state"]:
            assert int(sd2["state"][i]["step"]) == int(sd["state"][i]["step"])
            a, b = sd["state"][i][nm], sd2["state"][i][nm]
            assert float((a - b).abs().max()) <= 0.05 * scale, (i, nm)
    l2 = train(m2, o2, data[10:])
    l1 = train(m1, o1, data[10:])
    assert sum(l2) == pytest.approx(sum(l1), rel=0.02)


def test_lion_and_adam_take_q_states():
    for cls, kw in ((OffloadAdam, dict(lr=1e-2)), (OffloadLion, dict(lr=1e-3))):
        m = model()
        losses = train(m, cls(m.parameters(), state_dtype="q8", nthreads=2, **kw), batches(20))
        assert all(x == x for x in losses)


def test_refusals():
    p = list(model().parameters())
    with pytest.raises(ValueError, match="Adagrad|adagrad"):
        OffloadAdagrad(p, state_dtype="q8")
    with pytest.raises(ValueError, match="two_pass"):
        OffloadAdamW(p, state_dtype="q8", clip_mode="speculative")
    with pytest.raises(ValueError, match="no_grad='zero'"):
        OffloadAdamW(p, state_dtype="q4", no_grad="skip")
    with pytest.raises(ValueError, match="power of two"):
        OffloadAdamW(p, state_dtype="q8", state_block=100)
    with pytest.raises(ValueError, match="power of two"):
        OffloadAdamW(p, state_dtype="q8", state_block=8192)
    with pytest.raises(ValueError, match="state_block"):
        OffloadAdamW(p, state_block=256)
    with pytest.raises(TypeError, match="q8"):
        OffloadAdamW(p, state_dtype="q2")
    with pytest.raises(TypeError):
        OffloadAdamW(p, state_dtype=torch.float16)


def test_state_block():
    m = model()
    o = OffloadAdamW(m.parameters(), state_dtype="q4", state_block=64, nthreads=2, **HP)
    assert o.state_format == "q4" and o.state_block == 64 and o.state_dtype == torch.float32
    losses = train(m, o, batches(20))
    assert losses[-1] == losses[-1]


def test_deepspeed_config_zoffload_key():
    p = list(model().parameters())
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zoffload": {"state_dtype": "q4", "state_block": 512}}
    o = from_deepspeed_config(p, cfg)
    assert o.state_format == "q4" and o.state_block == 512 and o.no_grad == "zero"
    cfg["zoffload"] = {"state_dtype": "bf16"}
    assert from_deepspeed_config(p, cfg).state_dtype == torch.bfloat16
    cfg["zoffload"] = {"state_dtype": "q2"}
    with pytest.raises(ValueError, match="q8"):
        from_deepspeed_config(p, cfg)


# ------------------------------------------------- state_dict(quantized=True): the raw codes
# sub_group_size 400 over the model's 987 elements: three sub-groups (the
# last of 187 elements: a short block, and for q4 an odd count with a pad
# nibble), the 24x24 weight cut across two, small tensors sharing blocks

def _qopt(m, q, place="cpu", tmp=None, **kw):
    if place == "nvme":
        tmp.mkdir(exist_ok=True)
        kw.update(offload_device="nvme", nvme_path=str(tmp))
    kw.setdefault("sub_group_size", 400)
    return OffloadAdamW(m.parameters(), state_dtype=q if q != "f32" else torch.float32, nthreads=2,
                        **({"no_grad": "zero"} if q == "f32" else {}), **HP, **kw)


def _tensors_equal(a, b):
    """Two state dicts' states equal, bit for bit (NaN too)."""
    assert a.keys() == b.keys()
    for i in a:
        assert a[i].keys() == b[i].keys(), (i, a[i].keys(), b[i].keys())
        for k in a[i]:
            x, y = a[i][k], b[i][k]
            assert x.dtype == y.dtype and x.shape == y.shape, (i, k)
            if x.dtype == torch.float32:
                x, y = x.view(torch.int32), y.view(torch.int32)
            assert torch.equal(x, y), (i, k)


@pytest.mark.parametrize("q,place,dtype", [("q8", "cpu", torch.float32), ("q4", "cpu", torch.float32),
                                           ("q8", "nvme", torch.float32), ("q4", "nvme", torch.float32),
                                           ("q8", "cpu", torch.bfloat16)])
def test_quantized_state_dict_round_trip_bit_for_bit(q, place, dtype, tmp_path):
    data = batches(14)
    m1 = model().to(dtype)
    o1 = _qopt(m1, q, place, tmp_path / "a")
    train(m1, o1, [(x.to(dtype), y.to(dtype)) for x, y in data[:8]])
    sd = o1.state_dict(quantized=True)
    z = sd["zoffload"]["qstate"]
    assert z["format"] == "zoffload.qstate/1" and z["state_format"] == q
    assert z["bits"] == (8 if q == "q8" else 4) and z["block"] == o1.state_block
    assert z["maps"]["exp_avg"]["values"].numel() == 2 ** z["bits"]
    v0 = float(z["maps"]["exp_avg_sq"]["values"][0])   # v's map is unsigned; q4's has no zero
    assert float(z["maps"]["exp_avg"]["values"][0]) < 0 and (v0 > 0 if q == "q4" else v0 == 0)
    plain = o1.state_dict()
    params = list(m1.parameters())
    crossed = 0
    for i, e in sd["state"].items():
        assert e["exp_avg_codes"].dtype == torch.uint8 and e["exp_avg_absmax"].dtype == torch.float32
        assert "exp_avg" not in e and ("master_param" in e) == (dtype != torch.float32)
        crossed += e["qpieces"].shape[0] > 1
        # the dict's own map reads exactly the engine's dequantized states
        for nm in ("exp_avg", "exp_avg_sq"):
            v = zoffload_torch.dequantize_qstate(e, nm, z)
            assert torch.equal(v.view(torch.int32), plain["state"][i][nm].reshape(-1).view(torch.int32)), (i, nm)
        if dtype != torch.float32:
            assert torch.equal(e["master_param"], plain["state"][i]["master_param"])
        assert int(e["step"]) == 8
    assert crossed >= 1                           # a tensor cut across sub-groups
    assert sum(p.numel() for p in params) == 987
    # through torch.save / torch.load (plain tensors, ints and strings: also
    # what weights_only loading takes), into another optimizer of the same
    # setting: the codes as they were
    torch.save(sd, str(tmp_path / "sd.pt"))
    m2 = copy.deepcopy(m1)
    o2 = _qopt(m2, q, place, tmp_path / "b")
    o2.load_state_dict(torch.load(str(tmp_path / "sd.pt")))
    _tensors_equal(o2.state_dict(quantized=True)["state"], sd["state"])
    # and both go on the same, bit for bit
    rest = [(x.to(dtype), y.to(dtype)) for x, y in data[8:]]
    assert train(m1, o1, rest) == train(m2, o2, rest)
    assert same_params(m1, m2)
    _tensors_equal(o1.state_dict(quantized=True)["state"], o2.state_dict(quantized=True)["state"])


def _trained(q="q8", steps=6, **kw):
    m = model()
    o = _qopt(m, q, **kw)
    train(m, o, batches(steps))
    return m, o


def test_quantized_state_dict_into_fp32_states_dequantizes():
    m1, o1 = _trained("q8")
    sd, plain = o1.state_dict(quantized=True), o1.state_dict()
    m2 = copy.deepcopy(m1)
    o2 = _qopt(m2, "f32")
    o2.load_state_dict(sd)
    _tensors_equal(o2.state_dict()["state"], plain["state"])


@pytest.mark.parametrize("other", [dict(q="q4"), dict(q="q8", state_block=128), dict(q="q8", sub_group_size=512)])
def test_quantized_state_dict_into_another_q_setting_converts(other):
    # another format, block or layout: the moments are dequantized with the
    # dict's map and imported (requantized): exactly what loading the
    # dequantized state dict gives
    m1, o1 = _trained("q8")
    sd, plain = o1.state_dict(quantized=True), o1.state_dict()
    got, want = [], []
    for d in (sd, plain):
        m2 = copy.deepcopy(m1)
        kw = dict(other)
        o2 = _qopt(m2, kw.pop("q"), **kw)
        o2.load_state_dict(copy.deepcopy(d))
        (got if d is sd else want).append(o2.state_dict(quantized=True))
    _tensors_equal(got[0]["state"], want[0]["state"])
    assert got[0]["zoffload"]["qstate"]["bits"] == (4 if other["q"] == "q4" else 8)


def test_quantized_state_dict_map_change_is_detected():
    # a dict whose map is not this library's (a future map change): not
    # restored raw; read with the dict's own table instead
    m1, o1 = _trained("q8")
    sd = o1.state_dict(quantized=True)
    sd["zoffload"]["qstate"]["maps"]["exp_avg"]["values"] = sd["zoffload"]["qstate"]["maps"]["exp_avg"]["values"] * 0.5
    m2 = copy.deepcopy(m1)
    o2 = _qopt(m2, "q8")
    o2.load_state_dict(copy.deepcopy(sd))
    s1, s2 = o1.state_dict()["state"], o2.state_dict()["state"]
    scale = max(float(s1[i]["exp_avg"].abs().max()) for i in s1)
    for i in s1:
        # within the requantization error of the halved values' blocks
        assert float((s2[i]["exp_avg"] - s1[i]["exp_avg"] * 0.5).abs().max()) <= 0.02 * scale, i
    assert any(not torch.equal(s2[i]["exp_avg"], s1[i]["exp_avg"]) for i in s1)


def test_quantized_state_dict_refusals():
    m1, o1 = _trained("q8")
    sd = o1.state_dict(quantized=True)
    o32 = _qopt(copy.deepcopy(m1), "f32")
    with pytest.raises(ValueError, match="not quantized"):
        o32.state_dict(quantized=True)
    m2 = copy.deepcopy(m1)
    o2 = _qopt(m2, "q8")
    before = o2.state_dict(quantized=True)
    # two parameters disagree on the block they share
    bad = copy.deepcopy(sd)
    e = bad["state"][1]                          # the first bias (24 elements): shares a block with the weight
    assert e["qpieces"][0, 0] > 0
    e["exp_avg_codes"][0] ^= 1
    with pytest.raises(ValueError, match="share"):
        o2.load_state_dict(bad)
    bad = copy.deepcopy(sd)
    del bad["state"][0]["exp_avg_sq_absmax"]
    with pytest.raises(ValueError, match="exp_avg_sq_absmax"):
        o2.load_state_dict(bad)
    bad = copy.deepcopy(sd)
    bad["state"][0]["qpieces"][0, 1] += 1
    with pytest.raises(ValueError, match="cover"):
        o2.load_state_dict(bad)
    bad = copy.deepcopy(sd)
    bad["zoffload"]["qstate"]["format"] = "zoffload.qstate/9"
    with pytest.raises(ValueError, match="format"):
        o2.load_state_dict(bad)
    bad = copy.deepcopy(sd)
    bad["state"][0]["exp_avg_sq_absmax"][0] = -1.0
    with pytest.raises(ValueError, match="absmax"):
        o2.load_state_dict(bad)
    # nothing of the refused loads was taken
    _tensors_equal(o2.state_dict(quantized=True)["state"], before["state"])


def test_quantized_state_dict_engine_calls():
    # optim.Engine's raw calls: info per sub-group, export / import as stored
    e = optim.Engine([{"numel": [300, 101], "state_dtype": "q4"}, {"numel": [10]}], param_dtype="f32",
                     kind="adamw", sub_group_size=256)
    infos = [e.qstate_info(k) for k in range(e.info()["nsubgroups"])]
    assert [(i["group"], i["offset"], i["numel"], i["bits"]) for i in infos] == [
        (0, 0, 256, 4), (0, 256, 145, 4), (1, 0, 10, 0)]
    assert infos[1]["code_bytes"] == 73 and infos[1]["nscales"] == 2
    assert infos[2]["maps"] == {"exp_avg": None, "exp_avg_sq": None}
    codes = torch.arange(73, dtype=torch.uint8)
    codes[-1] &= 15
    scales = torch.tensor([0.5, float("nan")])
    e.qstate_import(1, "exp_avg", codes, scales)
    c2, s2 = e.qstate_export(1, "exp_avg", torch.empty(73, dtype=torch.uint8), torch.empty(2))
    assert torch.equal(c2, codes) and torch.equal(s2.view(torch.int32), scales.view(torch.int32))
    from zoffload.errors import ZoError
    with pytest.raises(ZoError, match="not quantized"):
        e.qstate_export(2, "exp_avg", torch.empty(10, dtype=torch.uint8), torch.empty(1))
    codes[-1] |= 0x10
    with pytest.raises(ZoError, match="padding"):
        e.qstate_import(1, "exp_avg", codes, scales)
    with pytest.raises(ZoError, match="code bytes"):
        e.qstate_export(1, "exp_avg", torch.empty(72, dtype=torch.uint8), torch.empty(2))
    e.close()


# ------------------------------------------------- the code maps (state_map_m / state_map_v)

def _maps_of(o):
    """The maps o's engine uses (zo_optim_get_qstate_info of sub-group 0)."""
    return o._eb.engines[0][1].qstate_info(0)["maps"]


def test_state_maps_reach_the_engine():
    # names (any case) and ids land in zo_optim_config's fields at their offsets
    n = [1000, 300]
    for kw, want in ((dict(), {"exp_avg": 0, "exp_avg_sq": 4}),
                     (dict(state_map_m="LINEAR", state_map_v="linear_nz"), {"exp_avg": 2, "exp_avg_sq": 5}),
                     (dict(state_map_m=2, state_map_v=3), {"exp_avg": 2, "exp_avg_sq": 3}),
                     (dict(state_map_v="dynamic"), {"exp_avg": 0, "exp_avg_sq": 1})):
        e = optim.Engine([{"numel": n, "state_dtype": "q4"}], param_dtype="f32", nthreads=2, **kw)
        assert e.qstate_info(0)["maps"] == want, kw
        e.close()
    fields = [f for f, _ in optim.OptimConfig._fields_]
    assert fields[-2:] == ["state_map_m", "state_map_v"]
    cfg = optim._lib.new_struct("zo_optim_config")
    assert cfg.state_map_m == cfg.state_map_v == optim.QMAP_DEFAULT


def test_engine_refuses_bad_maps():
    q8 = [{"numel": [1000], "state_dtype": "q8"}]
    with pytest.raises(ValueError, match="dynamic, linear"):
        optim.estimate(q8, param_dtype="f32", state_map_m="dynamic_nz")
    with pytest.raises(ValueError, match="linear_nz"):
        optim.estimate(q8, param_dtype="f32", state_map_v="signed")
    # ids the engine refuses: an unsigned m map, a signed v map, no quantized group
    with pytest.raises(Exception, match="m is signed"):
        optim.estimate(q8, param_dtype="f32", state_map_m=1)
    with pytest.raises(Exception, match="v is unsigned"):
        optim.estimate(q8, param_dtype="f32", state_map_v=2)
    with pytest.raises(Exception, match="no group has quantized states"):
        optim.estimate([{"numel": [1000]}], param_dtype="f32", state_map_m="linear")


@pytest.mark.parametrize("q", ["q8", "q4"])
def test_state_maps_train_and_change_the_states(q):
    data = batches(12)
    m1, m2 = model(), model()
    o1 = _qopt(m1, q)
    o2 = _qopt(m2, q, **LINEAR_MAPS)
    assert _maps_of(o2) == {"exp_avg": 2, "exp_avg_sq": 5}
    l1, l2 = train(m1, o1, data), train(m2, o2, data)
    assert all(x == x for x in l2) and l2[-1] < l2[0]
    s1, s2 = o1.state_dict()["state"], o2.state_dict()["state"]
    for nm in ("exp_avg", "exp_avg_sq"):
        assert any(not torch.equal(s1[i][nm], s2[i][nm]) for i in s1), nm
    # state_dict(quantized=True) carries the chosen maps' ids and tables
    z = o2.state_dict(quantized=True)["zoffload"]["qstate"]
    bits = 8 if q == "q8" else 4
    for nm, mid in (("exp_avg", 2), ("exp_avg_sq", 5)):
        assert z["maps"][nm]["id"] == mid
        assert torch.equal(z["maps"][nm]["values"], torch.tensor(optim.qmap_values(mid, bits)))


def test_state_maps_quantized_state_dict_round_trips():
    # into the same maps: bit for bit; into the default maps: converted,
    # exactly as loading the dequantized dict
    m1, o1 = _trained("q8", **LINEAR_MAPS)
    sd, plain = o1.state_dict(quantized=True), o1.state_dict()
    o2 = _qopt(copy.deepcopy(m1), "q8", **LINEAR_MAPS)
    o2.load_state_dict(copy.deepcopy(sd))
    _tensors_equal(o2.state_dict(quantized=True)["state"], sd["state"])
    got, want = [], []
    for d in (sd, plain):
        o3 = _qopt(copy.deepcopy(m1), "q8")
        o3.load_state_dict(copy.deepcopy(d))
        (got if d is sd else want).append(o3.state_dict(quantized=True))
    _tensors_equal(got[0]["state"], want[0]["state"])
    assert got[0]["zoffload"]["qstate"]["maps"]["exp_avg"]["id"] == 0


def test_state_maps_refusals():
    p = list(model().parameters())
    for kw in (dict(state_map_m="linear"), dict(state_map_v="linear"),
               dict(state_dtype=torch.bfloat16, state_map_v="linear")):
        with pytest.raises(ValueError, match="needs state_dtype='q8' or 'q4'"):
            OffloadAdamW(p, **kw)
    with pytest.raises(ValueError, match="dynamic, linear"):
        OffloadAdamW(p, state_dtype="q8", state_map_m="dynamic_nz")
    with pytest.raises(ValueError, match="linear_nz"):
        OffloadAdamW(p, state_dtype="q4", state_map_v="log")
    with pytest.raises(ValueError, match="keeps no v"):
        OffloadLion(p, state_dtype="q8", state_map_v="linear")
    # Lion's one moment takes an m map
    m = model()
    o = OffloadLion(m.parameters(), lr=1e-3, state_dtype="q8", state_map_m="linear", nthreads=2)
    assert _maps_of(o)["exp_avg"] == 2
    assert all(x == x for x in train(m, o, batches(4)))


def test_deepspeed_config_state_maps():
    p = list(model().parameters())
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zoffload": {"state_dtype": "q4", "state_map_m": "Linear", "state_map_v": "dynamic"}}
    o = from_deepspeed_config(p, cfg)
    assert o.state_map_m == "linear" and o.state_map_v == "dynamic"
    assert _maps_of(o) == {"exp_avg": 2, "exp_avg_sq": 1}
    cfg["zoffload"] = {"state_dtype": "fp32", "state_map_m": "linear"}
    with pytest.raises(ValueError, match="needs state_dtype"):
        from_deepspeed_config(p, cfg)
