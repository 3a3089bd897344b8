# SPDX-License-Identifier: Apache-2.0
"""zoffload.torch: the offload optimizers against torch.optim and against
reference schedules (DPU, clipping, loss scaling), state round trips, and
argument errors. CPU tensors stand in for device memory."""
import copy

import pytest

from conftest import torch_or_skip

torch = torch_or_skip()
import zoffload  # noqa: E402
from zoffload.torch import (OffloadAdamW, OffloadAdam, OffloadAdagrad, OffloadLion,  # noqa: E402
                            LossScaler, from_deepspeed_config)

# fp32: the kernels agree with torch's arithmetic within a few ulps per step
# (docs/cpuadam.md); after 20 steps through a small network the parameters
# agree within this relative/absolute tolerance.
RTOL, ATOL = 1e-5, 1e-6


def model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 24),
                            torch.nn.Tanh(), torch.nn.Linear(24, 3))
    return m.to(dtype)


def batches(n, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 12, generator=g).to(dtype), torch.randn(16, 3, generator=g).to(dtype))
            for _ in range(n)]


def loss_fn(m, b):
    x, y = b
    return (m(x).float() - y.float()).pow(2).mean()


def train(m, opt, data, clip=None, scale=1.0):
    for b in data:
        opt.zero_grad()
        (loss_fn(m, b) * scale).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
    if hasattr(opt, "wait"):
        opt.wait()


def assert_close_params(m1, m2, rtol=RTOL, atol=ATOL):
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=rtol, atol=atol, msg=n)


@pytest.mark.parametrize("hooks", ["backward", "step"])
def test_adamw_equals_torch_fp32(hooks):
    m1, data = model(), batches(20)
    m2 = copy.deepcopy(m1)
    train(m1, torch.optim.AdamW(m1.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05),
          data)
    opt = OffloadAdamW(m2.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05,
                       grad_hooks=hooks, nthreads=2)
    if hooks == "backward":
        assert opt.grad_hook_mode in ("post_accumulate_grad_hook", "accumulate_grad_node")
    train(m2, opt, data)
    assert_close_params(m1, m2)
    # the parameters moved: the test would notice an optimizer that does nothing
    assert not torch.allclose(m2[0].weight, model()[0].weight)
    # gradients were handed over and freed
    if hooks == "backward":
        assert all(p.grad is None for p in m2.parameters())


def test_adam_adagrad_equal_torch():
    for ours, theirs, kw in ((OffloadAdam, torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
                             (OffloadAdagrad, torch.optim.Adagrad,
                              dict(lr=5e-2, lr_decay=0.01, weight_decay=0.05,
                                   initial_accumulator_value=0.1))):
        m1, data = model(), batches(20)
        m2 = copy.deepcopy(m1)
        train(m1, theirs(m1.parameters(), **kw), data)
        train(m2, ours(m2.parameters(), nthreads=2, **kw), data)
        assert_close_params(m1, m2)


class RefLion(torch.optim.Optimizer):
    """Lion as in the paper / lion-pytorch, in plain torch."""

    def __init__(self, params, lr, betas, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                st = self.state[p]
                m = st.setdefault("exp_avg", torch.zeros_like(p))
                c = m * b1 + p.grad * (1 - b1)
                p.mul_(1 - g["lr"] * g["weight_decay"]).add_(torch.sign(c), alpha=-g["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def test_lion_equals_reference():
    m1, data = model(), batches(20)
    m2 = copy.deepcopy(m1)
    train(m1, RefLion(m1.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1), data)
    train(m2, OffloadLion(m2.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1), data)
    # sign() makes Lion sensitive to the last bit of c near 0: allow a rare
    # lr-sized difference, but the bulk must agree
    diffs = torch.cat([(a - b).abs().flatten() for a, b in zip(m1.parameters(), m2.parameters())])
    assert (diffs > 1e-5).float().mean() < 0.01
    assert diffs.max() < 4 * 1e-3 * 20


def test_bf16_params_within_bf16_rounding():
    """bf16 model params; reference: fp32 masters updated by torch AdamW from
    the same bf16 gradients, cast to bf16 after each step.

    The gradients must be the same ones: the offloaded model runs its forward
    and backward (through the optimizer's gradient hooks) on the reference's
    bf16 parameters of that step. Letting each model train on its own
    parameters does not test the optimizer: our fp32 masters and torch's
    differ by fp32 rounding (the same formula in a different order), so now
    and then a master falls on the other side of a bf16 rounding boundary,
    one parameter then differs by one bf16 ulp, every later gradient
    differs, and the two runs drift apart at a rate set by the machine's
    bf16 matmul (on an AVX2-only CPU: one parameter one ulp off at step 8,
    104 of 288 off, up to 14%, by step 20)."""
    mref, data = model(torch.bfloat16), batches(20, dtype=torch.bfloat16)
    m2 = copy.deepcopy(mref)
    masters = [p.detach().float().clone().requires_grad_(True) for p in mref.parameters()]
    ref = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.01)
    opt = OffloadAdamW(m2.parameters(), lr=1e-2, weight_decay=0.01)
    one_ulp = 0
    for b in data:
        for p in mref.parameters():
            p.grad = None
        with torch.no_grad():
            for p, q in zip(mref.parameters(), m2.parameters()):
                q.copy_(p)
        loss_fn(mref, b).backward()
        for mp, p in zip(masters, mref.parameters()):
            mp.grad = p.grad.float()
        ref.step()
        with torch.no_grad():
            for mp, p in zip(masters, mref.parameters()):
                p.copy_(mp)
        opt.zero_grad()
        loss_fn(m2, b).backward()
        opt.step()
        # every step: each parameter equal, or one bf16 ulp apart where the
        # two masters straddle a rounding boundary
        for p, q in zip(mref.parameters(), m2.parameters()):
            assert q.dtype == torch.bfloat16
            ulps = (q.detach().view(torch.int16).int() - p.detach().view(torch.int16).int()).abs()
            assert bool(((ulps <= 1) | (q == p)).all()), "more than one bf16 ulp apart"
            one_ulp += int((ulps == 1).sum())
    assert one_ulp < 288  # rare: a boundary straddle, not a different update
    sd = opt.state_dict()["state"]
    for i, (mp, q) in enumerate(zip(masters, m2.parameters())):
        # same gradients, so the masters differ only by fp32 rounding
        torch.testing.assert_close(sd[i]["master_param"], mp.detach(), rtol=1e-5, atol=1e-7)
        assert torch.equal(sd[i]["master_param"].to(torch.bfloat16), q.detach())


def test_clipping_equals_clip_grad_norm():
    m1, data = model(), batches(20)
    m2 = copy.deepcopy(m1)
    train(m1, torch.optim.AdamW(m1.parameters(), lr=1e-2), data, clip=0.05)
    opt = OffloadAdamW(m2.parameters(), lr=1e-2, max_grad_norm=0.05)
    train(m2, opt, data)
    assert opt.last_grad_norm is not None and opt.last_grad_norm > 0.05  # it did clip
    assert_close_params(m1, m2)


def test_clip_grad_norm_between_backward_and_step():
    """Issue 21 item 9: torch.nn.utils.clip_grad_norm_ between backward and
    step() (HF Trainer's max_grad_norm) clips what step() applies and returns
    the true norm: the default grad_hooks="step" leaves .grad to torch until
    step(). With grad_hooks="backward" the gradients are gone from .grad by
    then, and the clipping functions refuse instead of returning 0."""
    m1, data = model(), batches(12)
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2)
    for b in data:
        norms = []
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            loss_fn(m, b).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)))
            o.step()
        assert norms[0] > 0.05                      # it clips
        assert norms[1] == pytest.approx(norms[0], rel=1e-5)
        assert o2.last_grad_norm == pytest.approx(0.05, rel=1e-4)   # what the engine applied
    assert_close_params(m1, m2)
    m3 = model()
    o3 = OffloadAdamW(m3.parameters(), lr=1e-2, grad_hooks="backward")
    loss_fn(m3, data[0]).backward()
    for clip in (lambda: torch.nn.utils.clip_grad_norm_(m3.parameters(), 1.0),
                 lambda: torch.nn.utils.clip_grad.clip_grad_norm_(list(m3.parameters()), 1.0),
                 lambda: torch.nn.utils.clip_grad_value_(m3.parameters(), 1.0)):
        with pytest.raises(RuntimeError, match="max_grad_norm"):
            clip()
    # another model's parameters pass through (torch keeps their .grad after a step)
    assert float(torch.nn.utils.clip_grad_norm_(m1.parameters(), 1e9)) > 0
    o3.step()
    assert float(torch.nn.utils.clip_grad_norm_(m3.parameters(), 1.0)) == 0.0   # nothing held back now


def test_grad_accumulation():
    m1, data = model(), batches(20)
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2)
    for i in range(0, 20, 2):
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            loss_fn(m, data[i]).backward()
            loss_fn(m, data[i + 1]).backward()
            o.step()
    assert_close_params(m1, m2)


@pytest.mark.parametrize("hooks", ["backward", "step"])
def test_zero_grad_drops_what_was_handed_over(hooks):
    """Issue 21 item 10: backward(); zero_grad(); backward(); step() applies
    the second gradient only, as torch does, though the hooks handed the
    first to the engine during backward (zero_grad() drops the engine's
    window)."""
    m1, data = model(), batches(8)
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2, grad_hooks=hooks)
    for i in range(0, 8, 2):
        for m, o in ((m1, o1), (m2, o2)):
            loss_fn(m, data[i]).backward()          # dropped
            o.zero_grad()
            loss_fn(m, data[i + 1]).backward()
            o.step()
            o.zero_grad()
    assert_close_params(m1, m2)


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_dpu_equals_delayed_schedule(warmup):
    """Reference: the update of step k is applied to the masters of step
    k-1 with the gradients of the params the forward of k saw: the result of
    update k-1 for k <= warmup+1, else of k-2 (the update of k-1 was still
    running; step() of k fences it after backward)."""
    m1, data = model(), batches(12)
    m2 = copy.deepcopy(m1)
    master = copy.deepcopy(m1)
    ref = torch.optim.AdamW(master.parameters(), lr=1e-2)
    pending = False
    for k, b in enumerate(data, 1):
        for p in m1.parameters():
            p.grad = None
        loss_fn(m1, b).backward()
        for mp, p in zip(master.parameters(), m1.parameters()):
            mp.grad = p.grad.clone()
        if pending:                       # the fence in step(): update k-1 reaches the model
            m1.load_state_dict(master.state_dict())
            pending = False
        ref.step()
        if k <= warmup:
            m1.load_state_dict(master.state_dict())
        else:
            pending = True
    m1.load_state_dict(master.state_dict())
    opt = OffloadAdamW(m2.parameters(), lr=1e-2, delay_update=True, dpu_warmup=warmup)
    train(m2, opt, data)
    assert_close_params(m1, m2)
    # and it is not the undelayed result
    m3 = copy.deepcopy(model())
    train(m3, torch.optim.AdamW(m3.parameters(), lr=1e-2), data)
    assert max((a - b).abs().max().item() for a, b in zip(m3.parameters(), m2.parameters())) > 1e-4


def test_dpu_warmup_steps_report_their_result():
    """A DPU warm-up step finishes its update inside step() (the engine's
    step_async collects it, so a wait() after it finds nothing): its
    global norm is reported right away, the undelayed optimizer's."""
    m1, data = model(), batches(3)
    m2 = copy.deepcopy(m1)
    o1 = OffloadAdamW(m1.parameters(), lr=1e-2, max_grad_norm=0.5, delay_update=True, dpu_warmup=2)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2, max_grad_norm=0.5)
    norms = []
    for b in data:
        for m, o in ((m1, o1), (m2, o2)):
            loss_fn(m, b).backward()
            o.step()
            o.zero_grad()
        norms.append((o1.last_grad_norm, o2.last_grad_norm))
    assert norms[0][0] is not None and norms[0][0] > 0
    assert [a for a, _ in norms[:2]] == [b for _, b in norms[:2]], norms
    assert norms[2][0] == norms[1][1]       # delayed: the fence's, the previous update's


class Branchy(torch.nn.Module):
    """A trunk, a frozen layer, two heads used on different steps and a
    layer frozen at first and unfrozen later: parameters that get no
    gradient in some steps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.trunk = torch.nn.Linear(12, 24)
        self.frozen = torch.nn.Linear(24, 24).requires_grad_(False)
        self.late = torch.nn.Linear(24, 24).requires_grad_(False)
        self.a = torch.nn.Linear(24, 3)
        self.b = torch.nn.Linear(24, 3)

    def forward(self, x, k):
        h = torch.tanh(self.late(torch.tanh(self.frozen(torch.tanh(self.trunk(x))))))
        return self.a(h) if k % 3 else self.b(h)


def _train_branchy(m, opt, data):
    for k, (x, y) in enumerate(data):
        if k == 4:
            m.late.requires_grad_(True)
        # (torch 1.13's default set_to_none=False would leave zero tensors,
        # which are gradients to torch: updated, decayed)
        opt.zero_grad(set_to_none=True)
        (m(x, k) - y).pow(2).mean().backward()
        opt.step()


@pytest.mark.parametrize("hooks", ["backward", "step"])
def test_params_without_gradient_follow_torch(hooks):
    """Issue 21 items 1 and 11: torch.optim.AdamW skips a parameter without
    a gradient (no weight decay, states untouched, its own step count), on
    every torch version; so does OffloadAdamW by default: a frozen layer
    stays bit for bit, a head used every third step and a layer unfrozen
    at step 5 train as under torch (bias correction by their own counts)."""
    m1, data = Branchy(), batches(12)
    m2 = copy.deepcopy(m1)
    frozen0 = m2.frozen.weight.detach().clone()
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2, weight_decay=0.1)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2, weight_decay=0.1, grad_hooks=hooks)
    _train_branchy(m1, o1, data)
    _train_branchy(m2, o2, data)
    assert torch.equal(m2.frozen.weight, frozen0)
    assert_close_params(m1, m2)
    # per-parameter step counts, and no state for the never-updated ones, as torch's
    sd1, sd2 = o1.state_dict()["state"], o2.state_dict()["state"]
    assert sorted(sd1) == sorted(sd2)
    for k in sd1:
        assert float(sd1[k]["step"]) == float(sd2[k]["step"]), k
    names = [n for n, _ in m2.named_parameters()]
    steps = {names[k]: int(float(sd2[k]["step"])) for k in sd2}
    assert steps["trunk.weight"] == 12 and steps["b.weight"] == 4 and steps["late.weight"] == 8
    assert "frozen.weight" not in steps
    # a fresh optimizer takes the per-parameter counts from either dict
    m3 = copy.deepcopy(m2)
    o3 = OffloadAdamW(m3.parameters(), lr=1e-2, weight_decay=0.1)
    o3.load_state_dict(o1.state_dict())
    assert {k: float(v["step"]) for k, v in o3.state_dict()["state"].items()} == \
        {k: float(v["step"]) for k, v in sd1.items()}


def test_params_without_gradient_zero_option():
    """no_grad="zero" keeps DeepSpeed's rule: a parameter without a gradient
    is updated with a zero gradient (weight decay applies), one count for all."""
    m, data = Branchy(), batches(3)
    frozen0 = m.frozen.weight.detach().clone()
    o = OffloadAdamW(m.parameters(), lr=1e-2, weight_decay=0.1, no_grad="zero")
    _train_branchy(m, o, data)
    assert not torch.equal(m.frozen.weight, frozen0)
    assert {float(v["step"]) for v in o.state_dict()["state"].values()} == {3.0}
    with pytest.raises(ValueError, match="no_grad"):
        OffloadAdamW(m.parameters(), no_grad="none")


def test_lr_scheduler_drives_the_offload_optimizer():
    m1, data = model(), batches(10)
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2)
    s1 = torch.optim.lr_scheduler.StepLR(o1, 3, gamma=0.3)
    s2 = torch.optim.lr_scheduler.StepLR(o2, 3, gamma=0.3)
    for b in data:
        for m, o, s in ((m1, o1, s1), (m2, o2, s2)):
            o.zero_grad()
            loss_fn(m, b).backward()
            o.step()
            s.step()
    assert_close_params(m1, m2)


def test_state_dict_round_trip_resumes_identically():
    m1, data = model(), batches(16)
    m2 = copy.deepcopy(m1)
    o1 = OffloadAdamW(m1.parameters(), lr=1e-2, weight_decay=0.02)
    train(m1, o1, data)                         # uninterrupted 16 steps
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2, weight_decay=0.02)
    train(m2, o2, data[:8])
    sd = o2.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(sd["state"][0]["step"]) == 8
    msd = copy.deepcopy(m2.state_dict())
    o2.close()
    m3 = model(seed=5)                          # a fresh process, other weights
    m3.load_state_dict(msd)
    o3 = OffloadAdamW(m3.parameters(), lr=0.5)
    o3.load_state_dict(sd)
    assert o3.param_groups[0]["lr"] == 1e-2
    train(m3, o3, data[8:])
    for a, b in zip(m1.parameters(), m3.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_live_state_reads_and_writes(state_dtype):
    """Issue 21 item 8: optimizer.state[p] has torch's keys once p was
    updated (fp32 copies of the engine's states, bf16 states widened), kept
    current after every step; written in place, a state goes back into the
    engine: zeroing exp_avg mid-run does what it does to torch's AdamW."""
    m1, data = model(), batches(8)
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2, state_dtype=state_dtype)
    w1, w2 = m1[0].weight, m2[0].weight
    assert len(o2.state[w2]) == 0 and "exp_avg" not in o2.state[w2]     # as torch before a step
    train(m1, o1, data[:4])
    train(m2, o2, data[:4])
    st = o2.state[w2]
    assert set(st) == set(o1.state[w1]) == {"step", "exp_avg", "exp_avg_sq"}
    ea = st["exp_avg"]
    assert ea.dtype == torch.float32 and float(st["step"]) == 4
    sd = o2.state_dict()["state"][0]
    torch.testing.assert_close(ea, sd["exp_avg"].float(), rtol=0, atol=0)
    tol = dict(rtol=1e-5, atol=1e-7) if state_dtype == torch.float32 else dict(rtol=1e-2, atol=1e-5)
    torch.testing.assert_close(st["exp_avg_sq"], o1.state[w1]["exp_avg_sq"], **tol)
    train(m1, o1, data[4:5])
    train(m2, o2, data[4:5])
    assert float(st["step"]) == 5                               # the copy handed out is current
    torch.testing.assert_close(ea, o2.state_dict()["state"][0]["exp_avg"].float(), rtol=0, atol=0)
    for o, w in ((o1, w1), (o2, w2)):                           # written in place: the engine's too
        o.state[w]["exp_avg"].zero_()
    o2.state[m2[2].weight]["exp_avg_sq"] = o1.state[m1[2].weight]["exp_avg_sq"] * 2
    o1.state[m1[2].weight]["exp_avg_sq"].mul_(2)
    train(m1, o1, data[5:])
    train(m2, o2, data[5:])
    if state_dtype == torch.float32:
        assert_close_params(m1, m2)
    with pytest.raises(KeyError):
        o2.state[w2]["exp_avg_max"] = torch.zeros(24, 12)


def test_load_torch_adamw_state_dict():
    m1, data = model(), batches(12)
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
    train(m1, o1, data[:6])
    m2.load_state_dict(m1.state_dict())
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2)
    o2.load_state_dict(o1.state_dict())
    train(m1, o1, data[6:])
    train(m2, o2, data[6:])
    assert_close_params(m1, m2)
    # and ours loads into torch's
    o4 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    sd2 = o2.state_dict()  # the engine keeps its states in C: the exported dict is what torch sees
    o4.load_state_dict(sd2)
    torch.testing.assert_close(o4.state[m2[0].weight]["exp_avg"], sd2["state"][0]["exp_avg"])
    assert float(o4.state[m2[0].weight]["step"]) == 12


def test_save_load_checkpoint(tmp_path):
    m1, data = model(torch.bfloat16), batches(12, dtype=torch.bfloat16)
    m2 = copy.deepcopy(m1)
    o1 = OffloadAdamW(m1.parameters(), lr=1e-2, loss_scale=1024.0)
    train(m1, o1, data)
    o2 = OffloadAdamW(m2.parameters(), lr=1e-2, loss_scale=1024.0)
    train(m2, o2, data[:6])
    name = o2.save(tmp_path)
    assert name == "step6"
    train(m2, o2, data[6:8])                    # diverge, then go back
    m3 = model(torch.bfloat16, seed=9)
    o3 = OffloadAdamW(m3.parameters(), lr=1e-2, loss_scale=1024.0)
    assert o3.load(tmp_path) == "step6"         # the model params come from the masters
    assert o3.param_groups[0]["step"] == 6
    train(m3, o3, data[6:])
    for a, b in zip(m1.parameters(), m3.parameters()):
        assert torch.equal(a, b)
    # a checkpoint of another model is refused, with a reason
    o4 = OffloadAdamW(model()[:1].parameters(), lr=1e-2)
    with pytest.raises(zoffload.CorruptError, match="fingerprint .* differs"):
        o4.load(tmp_path)
    with pytest.raises(zoffload.CorruptError, match="fingerprint .* differs"):
        OffloadAdam(model(torch.bfloat16).parameters()).load(tmp_path)


class Half(torch.nn.Module):
    """fp16 parameters computing in fp32 (CPU torch has no fp16 matmul)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner.half()

    def forward(self, x):
        h = x.float()
        for mod in self.inner:
            if isinstance(mod, torch.nn.Linear):
                h = torch.nn.functional.linear(h, mod.weight.float(), mod.bias.float())
            else:
                h = mod(h)
        return h


def test_fp16_dynamic_loss_scale_skips_overflow():
    m = Half(model())
    scaler = LossScaler(initial_scale_power=4, window=2, hysteresis=1)
    opt = OffloadAdamW(m.parameters(), lr=1e-3, loss_scale=scaler)
    before = [p.detach().clone() for p in m.parameters()]
    x, y = batches(1, dtype=torch.float16)[0]
    opt.zero_grad()
    # an overflowing gradient, set by hand (step() takes .grad the hooks did not)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    next(m.parameters()).grad[0, 0] = float("inf")
    opt.step()
    assert opt.steps_skipped == 1 and opt.loss_scale == 8.0
    for a, b in zip(before, m.parameters()):
        assert torch.equal(a, b)
    assert opt.param_groups[0]["step"] == 0
    # then two good steps double the scale, and the update happened unscaled
    m_ref = copy.deepcopy(m.inner).float()
    ref = torch.optim.AdamW(m_ref.parameters(), lr=1e-3)
    for _ in range(2):
        s = opt.loss_scale
        opt.zero_grad()
        opt.scale_loss(loss_fn(m, (x, y))).backward()
        opt.step()
        ref.zero_grad()
        loss_fn(m_ref, (x.float(), y.float())).backward()
        ref.step()
        assert s == 8.0
    assert opt.loss_scale == 16.0
    for a, b in zip(m.parameters(), m_ref.parameters()):
        torch.testing.assert_close(a.float(), b, rtol=2e-3, atol=2e-3)


def test_state_dict_carries_the_dynamic_scale():
    """A state dict carries the engine's dynamic loss scaler (scale,
    hysteresis left, iteration counts): a second optimizer loaded from it
    goes on at the same scale and halves on the same overflow (a fresh
    scaler with hysteresis 2 would keep its scale). Before, the scale
    restarted with a warning. add_param_group carries it too."""
    m = Half(model())

    def overflow(o):
        o.zero_grad()
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        next(m.parameters()).grad[0, 0] = float("inf")
        o.step()

    mk = lambda: OffloadAdamW(m.parameters(), lr=1e-3,
                              loss_scale=LossScaler(initial_scale_power=4, window=1000, hysteresis=2))
    o1 = mk()
    overflow(o1)      # hysteresis takes it: 16, one left
    overflow(o1)      # halves: 8, hysteresis back to... 1 left still (not consecutive)
    scale1 = o1.loss_scale
    sd = o1.state_dict()
    assert sd["zoffload"]["scaler_states"][0]["scale"] == scale1
    o1.close()
    o2 = mk()
    assert o2.loss_scale == 16.0
    import warnings as _w
    with _w.catch_warnings():
        _w.simplefilter("error")
        o2.load_state_dict(sd)
    assert o2.loss_scale == scale1
    overflow(o2)
    assert o2.loss_scale == scale1 / 2      # a fresh scaler (hysteresis 2 left) would keep 16
    # add_param_group keeps the scaler where it was
    s_before = o2.loss_scale
    o2.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))]})
    assert o2.loss_scale == s_before
    overflow(o2)
    assert o2.loss_scale == s_before / 2


def test_loss_scaler_hysteresis_is_the_engines():
    """One loss scaler: the engine's (lib/optim, DeepSpeed's rules). With
    hysteresis 2, the first overflow uses up the hysteresis and each later
    one in a row halves the scale: three overflows take 2^4 to 2^2. (The
    Python scaler that used to run beside it halved once.)"""
    m = Half(model())
    opt = OffloadAdamW(m.parameters(), lr=1e-3,
                       loss_scale=LossScaler(initial_scale_power=4, window=1000, hysteresis=2))
    assert opt.loss_scale == 16.0
    seen = []
    for _ in range(3):
        opt.zero_grad()
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        next(m.parameters()).grad[0, 0] = float("inf")
        opt.step()
        seen.append(opt.loss_scale)
    assert seen == [16.0, 8.0, 4.0]
    assert opt.steps_skipped == 3 and opt.param_groups[0]["step"] == 0


def test_nonfinite_without_scaler_raises():
    m = model()
    opt = OffloadAdamW(m.parameters(), max_grad_norm=1.0)
    for p in m.parameters():
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(ArithmeticError):
        opt.step()
        opt.wait()


def test_nvme_offload_equals_torch(tmp_path):
    """Masters and states on NVMe (the swap store in tmp_path) through zo_optim."""
    m1, data = model(), batches(10)
    m2 = copy.deepcopy(m1)
    # no skip: without io_uring the aio layer's thread pool serves NVMe placement
    opt = OffloadAdamW(m2.parameters(), lr=1e-2, offload_device="nvme",
                       nvme_path=str(tmp_path), sub_group_size=256)
    train(m1, torch.optim.AdamW(m1.parameters(), lr=1e-2), data)
    train(m2, opt, data)
    assert_close_params(m1, m2)
    assert opt.timeline()[0]["nvme_read_bytes"] > 0


def test_dropped_optimizer_lets_go_of_the_gradients():
    """An optimizer the program dropped without close() must not keep
    taking the model's gradients through its hooks (they hold it weakly)."""
    m1, data = model(), batches(6)
    m2 = copy.deepcopy(m1)
    o = OffloadAdamW(m2.parameters(), lr=1e-2, grad_hooks="backward")
    del o
    train(m1, torch.optim.AdamW(m1.parameters(), lr=1e-2), data)
    train(m2, OffloadAdamW(m2.parameters(), lr=1e-2, grad_hooks="backward"), data)
    assert_close_params(m1, m2)


def test_engine_and_device_collected_in_any_order():
    """Garbage collection may finalize a Device before the Engine over it
    (both in one cycle): the device's close waits for the engine. (Crashed
    with a segfault in zo_optim_destroy before; the order GC picks is not
    under the test's control, so both orders are tried.)"""
    import gc
    from zoffload import optim as zoptim
    for first in ("device", "engine"):
        d = zoptim.Device("host")
        e = zoptim.Engine([{"numel": [64]}], device=d, param_dtype="f32")
        if first == "device":
            d.close()               # deferred: the engine still uses it
            assert d._h
            e.close()
            assert not d._h         # closed once the engine let go
        else:
            d.cycle, e.cycle = e, d
            del d, e
            gc.collect()


def test_bad_arguments():
    with pytest.raises(TypeError, match="only float32, float16 and bfloat16"):
        OffloadAdamW([torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))])
    nc = torch.nn.Parameter(torch.zeros(4, 6).t())
    with pytest.raises(ValueError, match="not contiguous"):
        OffloadAdamW([nc])
    with pytest.raises(ValueError, match="two devices"):
        OffloadAdamW([torch.nn.Parameter(torch.zeros(3)),
                      torch.nn.Parameter(torch.zeros(3, device="meta"))])
    with pytest.raises(ValueError, match="empty parameter list"):
        OffloadAdamW([])
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="more than one parameter group"):
        OffloadAdamW([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="betas"):
        OffloadAdamW([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="max_grad_norm"):
        OffloadAdamW([p], max_grad_norm=-1)
    with pytest.raises(ValueError, match="offload_device"):
        OffloadAdamW([p], offload_device="gpu")
    from zoffload.torch import OffloadOptimizer
    with pytest.raises(TypeError, match="base class: use OffloadAdamW"):
        OffloadOptimizer([p], {"lr": 1e-3})
    with pytest.raises(ValueError, match="amsgrad"):
        q = torch.nn.Parameter(torch.zeros(3))
        t = torch.optim.AdamW([q], amsgrad=True)
        q.grad = torch.ones(3)
        t.step()
        OffloadAdamW([q]).load_state_dict(t.state_dict())


def test_param_groups_and_mixed_dtypes():
    m1 = model()
    m1[2].to(torch.bfloat16)
    m2 = copy.deepcopy(m1)
    groups = lambda m: [{"params": list(m[0].parameters()), "lr": 2e-2},
                        {"params": list(m[2].parameters()) + list(m[4].parameters()),
                         "weight_decay": 0.0}]
    o = OffloadAdamW(groups(m2), lr=1e-2)
    assert len(o._eb.engines) == 2              # one per dtype
    x = torch.randn(4, 12)

    def fwd(m):
        h = torch.tanh(m[0](x))
        h = torch.tanh(m[2](h.to(torch.bfloat16))).float()
        return m[4](h).pow(2).mean()
    for _ in range(5):
        o.zero_grad()
        fwd(m2).backward()
        o.step()
    assert m2[2].weight.dtype == torch.bfloat16
    assert not torch.equal(m1[0].weight, m2[0].weight)
    assert not torch.equal(m1[2].weight, m2[2].weight)


def test_bad_hyperparameter_names_itself():
    """lr NaN is refused as torch refuses it, at construction; set later
    (a scheduler gone wrong), the engine refuses the step naming it."""
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="Invalid learning rate: nan"):
        OffloadAdamW([p], lr=float("nan"))
    o = OffloadAdamW([p])
    o.param_groups[0]["lr"] = float("nan")
    p.grad = torch.ones(3)
    with pytest.raises(zoffload.InvalidArgument, match="lr nan"):
        o.step()


def test_torch_keywords_accepted_or_refused_by_name():
    """Issue 21 items 6 and 12: torch.optim.AdamW's keywords: foreach and
    fused are hints (accepted), maximize is honoured, amsgrad,
    capturable=True and differentiable=True are refused naming themselves;
    bad lr / eps / weight_decay / betas raise ValueError wherever torch's do."""
    ps = lambda: [torch.nn.Parameter(torch.zeros(3))]
    OffloadAdamW(ps(), 1e-3, (0.9, 0.999), 1e-8, 1e-2, False, maximize=False, foreach=True,
                 capturable=False, differentiable=False, fused=None).close()
    OffloadAdam(ps(), foreach=False, fused=True).close()
    OffloadAdagrad(ps(), foreach=None, maximize=True).close()
    for kw, name in ((dict(amsgrad=True), "amsgrad"), (dict(capturable=True), "capturable"),
                     (dict(differentiable=True), "differentiable")):
        with pytest.raises(ValueError, match=name):
            OffloadAdamW(ps(), **kw)
    with pytest.raises(ValueError, match="amsgrad"):
        OffloadAdamW([{"params": ps(), "amsgrad": True}])
    with pytest.raises(TypeError, match="foreach"):
        OffloadAdamW(ps(), foreach="yes")
    for kw in (dict(lr=float("nan")), dict(lr=-1.0), dict(eps=-1e-8), dict(weight_decay=-0.1),
               dict(betas=(1.0, 0.9)), dict(betas=(0.9, float("nan"))), dict(betas=(-0.1, 0.9))):
        with pytest.raises(ValueError):
            torch.optim.AdamW(ps(), **kw)             # torch refuses it ...
        with pytest.raises(ValueError, match="Invalid"):
            OffloadAdamW(ps(), **kw)                  # ... and so do we
    with pytest.raises(ValueError, match="lr_decay"):
        OffloadAdagrad(ps(), lr_decay=-1.0)
    # set on a group later: refused at the next step, not ignored
    p = ps()
    o = OffloadAdamW(p)
    o.param_groups[0]["amsgrad"] = True
    p[0].grad = torch.ones(3)
    with pytest.raises(ValueError, match="amsgrad"):
        o.step()


def test_maximize_equals_torch():
    m1, data = model(), batches(10)
    m2 = copy.deepcopy(m1)
    train(m1, torch.optim.AdamW(m1.parameters(), lr=1e-2, maximize=True), data)
    train(m2, OffloadAdamW(m2.parameters(), lr=1e-2, maximize=True), data)
    assert_close_params(m1, m2)


@pytest.mark.parametrize("hooks", ["step", "backward"])
def test_add_param_group_equals_torch(hooks):
    """Issue 21 item 6: add_param_group builds the new group's state in the
    engine (masters, states and counts of the others carry over): unfreezing
    the last layer after 3 steps, with its own lr, trains as under torch."""
    m1, data = model(), batches(10)
    m2 = copy.deepcopy(m1)
    head = lambda m: list(m[4].parameters())
    body = lambda m: list(m[0].parameters()) + list(m[2].parameters())
    o1 = torch.optim.AdamW(body(m1), lr=1e-2, weight_decay=0.05)
    o2 = OffloadAdamW(body(m2), lr=1e-2, weight_decay=0.05, grad_hooks=hooks)
    train(m1, o1, data[:3])
    train(m2, o2, data[:3])
    o1.add_param_group({"params": head(m1), "lr": 3e-2})
    o2.add_param_group({"params": head(m2), "lr": 3e-2})
    assert o2.param_groups[1]["lr"] == 3e-2 and o2.param_groups[1]["weight_decay"] == 0.05
    train(m1, o1, data[3:])
    train(m2, o2, data[3:])
    assert_close_params(m1, m2)
    assert float(o2.state[head(m2)[0]]["step"]) == 7 and float(o2.state[body(m2)[0]]["step"]) == 10
    # refused ones leave the optimizer as it was
    with pytest.raises(ValueError, match="more than one parameter group|appear in more than one"):
        o2.add_param_group({"params": head(m2)})
    with pytest.raises(TypeError, match="float64"):
        o2.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]})
    assert len(o2.param_groups) == 2
    train(m2, o2, data[:1])


def test_deepspeed_config(tmp_path):
    cfg = {"train_batch_size": 8,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.8, 0.95],
                                                     "eps": 1e-7, "weight_decay": 0.1}},
           "gradient_clipping": 1.0,
           "fp16": {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 50,
                    "consecutive_hysteresis": True},
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                   "pin_memory": True}}}
    import json
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    m = model()
    o = from_deepspeed_config(m.parameters(), str(path))
    assert isinstance(o, OffloadAdamW)
    g = o.param_groups[0]
    assert g["lr"] == 3e-3 and g["betas"] == (0.8, 0.95) and g["eps"] == 1e-7
    assert o.max_grad_norm == 1.0 and o.scaler.scale == 256.0 and o.scaler.window == 50
    assert o.scaler.engine_config()["consecutive_hysteresis"] == 1
    cfg["optimizer"]["type"] = "SGD"
    with pytest.raises(ValueError, match="SGD"):
        from_deepspeed_config(m.parameters(), cfg)
    # offload_optimizer.device nvme: swap files in nvme_path
    cfg["optimizer"]["type"] = "AdamW"
    cfg["fp16"]["enabled"] = False
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": str(tmp_path)}
    o = from_deepspeed_config(m.parameters(), cfg)
    before = m[0].weight.detach().clone()
    train(m, o, batches(2))
    assert not torch.equal(before, m[0].weight)
