# SPDX-License-Identifier: Apache-2.0
"""PyTorch integration: optimizers whose fp32 masters and states live off
the device, in libzoffload's offload optimizer engine (``zo_optim``,
optim.h; bound in zoffload.optim).

    from zoffload.torch import OffloadAdamW
    opt = OffloadAdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                       max_grad_norm=1.0)
    for batch in data:
        loss = model(batch).loss
        loss.backward()
        opt.step()               # gradients to the engine; fused unscale/clip/AdamW/cast
        opt.zero_grad()

This module is a thin front: the engine owns the optimizer's policy
(masters, states, gradient accumulation, clipping, loss scaling, overflow,
DPU, checkpoints); this module maps torch's optimizer interface onto it.

What happens:

* The model's parameters stay where they are (GPU, or CPU standing in for
  it), in their own dtype (bf16, fp16 or fp32). The engine keeps an fp32
  master copy and the states in pinned host memory or on NVMe: one engine
  per parameter dtype (an engine has one device dtype); with several, the
  global norm and overflow are combined across them as across ranks.
* Gradients: by default (``grad_hooks="step"``) ``.grad`` is torch's until
  ``step()`` gives each one to the engine from host memory
  (``zo_optim_grad_host``) and leaves it there, so torch code between
  backward and step (``clip_grad_norm_``, ``zero_grad``, inspection) works
  as with any optimizer. ``grad_hooks="backward"`` hands them over as
  backward produces them instead: a hook per parameter
  (``Tensor.register_post_accumulate_grad_hook`` on torch >= 2.1, the
  AccumulateGrad node's hook on older torch) gives the gradient to the
  engine and frees ``p.grad``, so the device never holds all gradients at
  once; clipping is then ``max_grad_norm``'s (torch's clipping functions
  refuse those parameters), and ``zero_grad()`` drops the engine's window.
  Gradient accumulation over several backward passes adds up in the engine.
* ``step()`` runs the engine's step: the global gradient norm and the
  inf/NaN count, the skip on overflow (fp16 dynamic loss scaling), then the
  fused kernel (unscale and clip coefficient folded into one multiplier,
  the update of master and states, the cast of the new parameters to their
  dtype in the same pass). CPU parameters are written in place by the
  kernel; others are copied back from the engine's parameter buffers.
* ``delay_update=True`` (DeepSpeed's DPU): from step ``dpu_warmup + 1`` on,
  the update of step N runs on the engine's worker thread while
  forward/backward of step N+1 run with the parameters of step N-1;
  ``step()`` of N+1 first waits for it (the fence) and copies its result
  into the parameters, so the next forward sees them. ``wait()`` is the
  fence on demand (before evaluation or saving); with ``process_group`` it
  is collective while an update is in flight (torch_dist).

A parameter without a gradient in a step (``.grad`` None at ``step()`` and
none handed over since the last one) is skipped as torch.optim skips it:
not updated, not decayed, its states and its own step count untouched
(``no_grad="zero"``: DeepSpeed's zero gradient instead). torch.optim's
keywords: ``foreach`` and ``fused`` are accepted as the hints they are,
``maximize`` is honoured, ``amsgrad``, ``capturable=True`` and
``differentiable=True`` are refused by name. ``add_param_group`` builds
the new group's state in the engine. ``optimizer.state[p]`` has torch's
keys, fp32 copies of the engine's states kept current (see _ParamState).

Many ranks: ``process_group=True`` (torch.distributed's default group) or a
``ProcessGroup`` runs the optimizer on the partitioned engine (zo_part,
zoffload.torch_dist): no DDP wrapper, the gradients averaged across the
ranks in buckets during backward, each rank holding its shard of masters
and states, the global norm, the updated params all-gathered;
``consolidated_state_dict()`` gives torch's format on one rank
(docs/pytorch.md "Many ranks").
"""

import json
import math
import os
import warnings
import weakref

import torch

from . import arrays
from . import ckpt as _ckpt
from . import cpuadam as _ca
from . import errors as _lib_errors
# parameter offload and the tiled linear live in their own modules (neither
# imports this one at load time) and are part of zoffload.torch
from .torch_params import offload_parameters, restore_parameters, ParamOffload, ParamBudgetError
from .torch_tiled import TiledLinear

__all__ = ["OffloadAdamW", "OffloadAdam", "OffloadAdagrad", "OffloadLion", "OffloadOptimizer",
           "LossScaler", "from_deepspeed_config", "offload_parameters", "restore_parameters",
           "ParamOffload", "ParamBudgetError", "TiledLinear", "dequantize_qstate"]

_ZO_DT = {torch.float32: arrays.F32, torch.float16: arrays.F16, torch.bfloat16: arrays.BF16}
_FORMAT = "zoffload.torch.OffloadOptimizer/1"


def _has_post_accumulate_hook():
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


# Optimizers with grad_hooks="backward": the hooks free p.grad as they hand
# it to the engine, so torch's clipping functions would see no gradient,
# clip nothing and return 0. They are wrapped (once, when the first such
# optimizer is made) to refuse parameters whose gradient went that way.
_BACKWARD_HOOKED = weakref.WeakSet()


def _guard_clipping():
    import functools
    import torch.nn.utils as nn_utils
    from torch.nn.utils import clip_grad

    def guarded(fn, name):
        @functools.wraps(fn)
        def clip(parameters, *args, **kwargs):
            parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            for opt in list(_BACKWARD_HOOKED):
                n = opt._eb.handed_among(parameters) if getattr(opt, "_eb", None) else 0
                if n:
                    raise RuntimeError(
                        "torch.nn.utils.%s: %d of these parameters' gradients were handed to %s "
                        "during backward (grad_hooks='backward' frees p.grad as it hands it over), so "
                        "it would clip nothing and return 0. Give the optimizer max_grad_norm=... "
                        "instead (the same global-norm clipping, fused into the step; the norm is "
                        "opt.last_grad_norm after step()), or use grad_hooks='step' (the default), "
                        "which leaves .grad to torch until step()" % (name, n, type(opt).__name__))
            return fn(parameters, *args, **kwargs)
        clip._zo_guard = True
        return clip

    for mod in (nn_utils, clip_grad):
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            fn = getattr(mod, name, None)
            if fn is not None and not getattr(fn, "_zo_guard", False):
                setattr(mod, name, guarded(fn, name))


class LossScaler:
    """The loss scaling settings of fp16 training, with DeepSpeed's rules
    (fp16.* in a DeepSpeed config), given to the engine, which keeps the
    scaler's state and applies the rules (lib/optim, optim.h "Non-finite
    gradients"): the scale starts at 2**initial_scale_power; a step whose
    gradients overflow is skipped; an overflow while `hysteresis` is
    used up halves the scale (not below min_scale), each earlier one
    uses up one; after `window` steps without overflow the scale doubles
    (and hysteresis is refilled; with consecutive_hysteresis after every
    good step). ``scale=<number>`` gives a static scale. The current scale
    is the optimizer's ``loss_scale``."""

    def __init__(self, scale=None, initial_scale_power=16, window=1000, hysteresis=2,
                 min_scale=1.0, dynamic=None, consecutive_hysteresis=False):
        self.dynamic = (scale is None) if dynamic is None else bool(dynamic)
        self.scale = float(scale) if scale is not None else float(2 ** initial_scale_power)
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError("loss scale must be finite and > 0, not %r" % (scale,))
        if self.dynamic and math.log2(self.scale) != int(math.log2(self.scale)):
            raise ValueError("a dynamic loss scale starts at a power of two, not %r" % self.scale)
        self.window = int(window)
        self.hysteresis = int(hysteresis)
        self.min_scale = float(min_scale)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        if self.window < 1 or self.hysteresis < 1:
            raise ValueError("loss scale window and hysteresis must be >= 1")

    def engine_config(self):
        """The zo_optim_config fields."""
        if not self.dynamic:
            return {"loss_scale": self.scale}
        return {"loss_scale": 0.0, "initial_scale_power": int(math.log2(self.scale)),
                "loss_scale_window": self.window, "hysteresis": self.hysteresis,
                "consecutive_hysteresis": int(self.consecutive_hysteresis),
                "min_loss_scale": self.min_scale}

    def state_dict(self):
        return {"scale": self.scale, "dynamic": self.dynamic, "window": self.window,
                "hysteresis": self.hysteresis, "min_scale": self.min_scale,
                "consecutive_hysteresis": self.consecutive_hysteresis}


class _ParamState(dict):
    """``optimizer.state[p]`` of an offload optimizer: torch's keys ("step"
    and the optimizer's states: "exp_avg", "exp_avg_sq"; Adagrad "sum";
    Lion "exp_avg"), present once the parameter has been updated (Adagrad:
    from the start), as torch's. The states live in the engine (pinned
    memory or NVMe, fp32 or bf16), so a state read here is an fp32 copy
    (bf16 states widened exactly), made when first asked for and rewritten
    in place after every later update of the parameter, so a tensor kept
    from here stays current. Written in place (its version counter moved),
    it goes back into the engine before the next step(), state_dict() or
    save(); assigning a tensor to a key imports it at once."""

    def __init__(self, opt, i):
        super().__init__()
        self._opt = weakref.ref(opt)
        self._i = i
        self._seen = {}          # key -> the tensor's _version after our own write

    def _keys(self):
        opt = self._opt()
        if opt is None or (not opt._eager_state and opt._eb.tsteps[self._i] == 0):
            return ()
        return ("step",) + opt._state_names

    def _fill(self, k, t):
        opt = self._opt()
        with torch.no_grad():
            if k == "step":
                t.fill_(float(opt._eb.tsteps[self._i]))
            else:
                opt._eb.export_state(self._i, k, t)     # through the pointer: no version bump
        self._seen[k] = t._version

    def __getitem__(self, k):
        if k not in self._keys():
            raise KeyError(k)
        if not dict.__contains__(self, k):
            p = self._opt()._plist[self._i][1]
            t = torch.zeros((), dtype=torch.float32) if k == "step" else \
                torch.empty(p.shape, dtype=torch.float32)
            self._fill(k, t)
            dict.__setitem__(self, k, t)
            self._opt()._live.add(self._i)
        return dict.__getitem__(self, k)

    def __setitem__(self, k, v):
        opt = self._opt()
        if k not in ("step",) + opt._state_names:
            raise KeyError("%s keeps %s per parameter, not %r"
                           % (type(opt).__name__, ", ".join(("step",) + opt._state_names), k))
        opt._eb.import_live(self._i, k, v)
        if dict.__contains__(self, k):
            self._fill(k, dict.__getitem__(self, k))

    def __delitem__(self, k):
        raise TypeError("the state of an offload optimizer's parameter cannot be deleted "
                        "(load_state_dict() replaces it)")

    def __contains__(self, k):
        return k in self._keys()

    def __iter__(self):
        return iter(self._keys())

    def __len__(self):
        return len(self._keys())

    def __repr__(self):
        return repr(dict(self.items()))

    def keys(self):
        return list(self._keys())

    def items(self):
        return [(k, self[k]) for k in self._keys()]

    def values(self):
        return [self[k] for k in self._keys()]

    def get(self, k, default=None):
        return self[k] if k in self._keys() else default

    def refresh(self):
        """The copies handed out, rewritten from the engine."""
        for k in list(dict.keys(self)):
            self._fill(k, dict.__getitem__(self, k))

    def write_back(self):
        """The copies written in place since, into the engine."""
        for k in list(dict.keys(self)):
            t = dict.__getitem__(self, k)
            if t._version != self._seen.get(k):
                self._opt()._eb.import_live(self._i, k, t)
                self._seen[k] = t._version


_QSTATES = ("q8", "q4")


def _engine_state(state_dtype, state_block=None):
    """The engine group keys of OffloadOptimizer's state_dtype / state_block."""
    if isinstance(state_dtype, str):            # "q8" / "q4": block-wise quantized m and v
        return {"state_dtype": state_dtype, "state_block": state_block or 0}
    return {"state_dtype": "bf16" if state_dtype == torch.bfloat16 else "f32"}


def _state_elem_bytes(fmt, block):
    """Bytes per element of one state (m or v) in format fmt ("f32", "bf16",
    "q8", "q4"): codes plus the fp32 absmax per block for q8/q4."""
    if fmt in _QSTATES:
        bits = 8 if fmt == "q8" else 4
        block = block or (256 if bits == 8 else 128)
        return bits / 8.0 + 4.0 / block
    return 4 if fmt == "f32" else 2


_QFORMAT = "zoffload.qstate/1"


def _code_bytes(n, bits):
    """Bytes of n codes: n (q8) or ceil(n / 2) (q4: two nibbles a byte)."""
    return n if bits == 8 else (n + 1) // 2


def _qstate_record(opt, info):
    """state_dict(quantized=True)'s "qstate" record from one sub-group's
    zo_optim_qstate_info (None: the engine has no sub-group, then bits,
    block and maps are unknown): format, bits, block and each state's map
    (zo_qmap id and its fp32 table)."""
    from . import optim as _optim
    if info is None:
        return {"format": _QFORMAT, "state_format": opt.state_format, "bits": None, "block": None, "maps": {}}
    maps = {nm: {"id": info["maps"][nm],
                 "values": torch.tensor(_optim.qmap_values(info["maps"][nm], info["bits"]), dtype=torch.float32)}
            for nm in opt._state_names}
    return {"format": _QFORMAT, "state_format": opt.state_format, "bits": info["bits"], "block": info["block"],
            "maps": maps}


def _qpieces(toff, tn, sgs, block):
    """The pieces of a tensor at [toff, toff + tn) of its group's flat space
    over the group's sub-groups sgs ([(k, offset, numel)], in order): for
    each sub-group it overlaps, (k, t0, lead, n, ncodes): the whole blocks
    covering it start at sub-group element t0 and hold ncodes elements (the
    last block of a sub-group may be short), the tensor's n elements start
    `lead` elements into them."""
    out = []
    for k, so, sn in sgs:
        a, b = max(toff, so), min(toff + tn, so + sn)
        if a >= b:
            continue
        a, b = a - so, b - so
        t0 = a // block * block
        t1 = min(-(-b // block) * block, sn)
        out.append((k, t0, a - t0, b - a, t1 - t0))
    return out


def dequantize_qstate(entry, name, qstate):
    """The fp32 values (flat, the parameter's numel) of state `name`
    ("exp_avg", "exp_avg_sq") of one parameter's entry of
    ``state_dict(quantized=True)``: ``qstate`` is that dict's
    ``["zoffload"]["qstate"]``. Value i of a piece is map[code] * absmax of
    its block, in fp32, as the engine's own dequantize computes it (the
    map is the dict's own table, so a dict stays readable after a library
    changes its maps)."""
    bits, block = int(qstate["bits"]), int(qstate["block"])
    values = torch.as_tensor(qstate["maps"][name]["values"], dtype=torch.float32)
    codes = torch.as_tensor(entry[name + "_codes"]).reshape(-1)
    absmax = torch.as_tensor(entry[name + "_absmax"], dtype=torch.float32).reshape(-1)
    pieces = torch.as_tensor(entry["qpieces"]).reshape(-1, 3).tolist()
    out, cpos, spos = [], 0, 0
    for lead, n, nc in pieces:
        cb, nb = _code_bytes(nc, bits), -(-nc // block)
        c = codes[cpos:cpos + cb].to(torch.uint8)
        if c.numel() != cb or spos + nb > absmax.numel():
            raise ValueError("state %r: the codes or scales end before piece (%d, %d, %d)" % (name, lead, n, nc))
        if bits == 4:
            c = torch.stack((c & 15, c >> 4), dim=1).reshape(-1)
        x = values[c[:nc].long()] * absmax[spos:spos + nb].repeat_interleave(block)[:nc]
        out.append(x[lead:lead + n])
        cpos, spos = cpos + cb, spos + nb
    if cpos != codes.numel() or spos != absmax.numel():
        raise ValueError("state %r: %d code bytes and %d scales, its pieces take %d and %d"
                         % (name, codes.numel(), absmax.numel(), cpos, spos))
    return torch.cat(out) if out else torch.zeros(0)


def _engine_kw(opt, dt, *, offload_device, nthreads, numa_node, pin_memory, no_grad, nvme_path, sub_group_size,
               pinned_bytes, buffer_count):
    """The engine keywords of an optimizer's settings for parameters of dtype
    dt (one rank's engine, or the partitioned engine's template)."""
    kw = dict(param_dtype=_ZO_DT[dt], grad_dtype=_ZO_DT[dt], placement=offload_device,
              max_grad_norm=opt.max_grad_norm or 0.0, nthreads=nthreads or 0, numa_node=numa_node,
              pin_memory=pin_memory, no_grad=no_grad, nonfinite="skip" if opt._skip_nonfinite else "error")
    if nvme_path is not None:
        kw["nvme_path"] = nvme_path
    if sub_group_size:
        kw["sub_group_size"] = int(sub_group_size)
    if pinned_bytes:
        kw["pinned_bytes"] = int(pinned_bytes)
    if buffer_count:
        kw["buffer_count"] = int(buffer_count)
    # the code maps of q8/q4 moments, only when chosen (None: the engine's defaults)
    for k in ("state_map_m", "state_map_v"):
        if getattr(opt, k, None) is not None:
            kw[k] = getattr(opt, k)
    kw.update(opt._scaler_cfg)
    return kw


class _BackendCommon:
    """What the backends (_EngineBackend here, torch_dist._PartBackend for
    many ranks) share: `opt`, `handed_idx`, `last`, `steps_skipped`."""

    def handed_among(self, params):
        """How many of `params` had their gradient handed over since the
        last step (and their .grad freed)."""
        if not self.handed_idx:
            return 0
        mine = {id(self.opt._plist[i][1]) for i in self.handed_idx}
        return sum(1 for p in params if id(p) in mine)

    def _handed_over(self, i, p, free):
        """Count parameter i's gradient as handed over; free p.grad if asked."""
        self.handed += 1
        if free:
            self.handed_idx.add(i)
            p.grad = None

    def _follow_params(self, repoint):
        """Parameters whose storage moved since the engine took their
        addresses (self._ptrs: (index, address)): torch's module.to() and
        `p.data = ...` give a parameter new memory and free the old, and
        Hugging Face's Trainer (accelerate) does so under torchrun after the
        optimizer was built. torch's optimizers follow the Parameter object;
        this one follows it too: repoint(i, address) tells the engine, which
        writes (and reads) the new address from then on, never the old. A
        parameter whose numel, dtype or device changed, or that is no longer
        contiguous, is refused: the engine writes numel contiguous elements
        of the dtype it was built for."""
        for k, (i, addr) in enumerate(self._ptrs):
            p = self.opt._plist[i][1]
            a = p.data_ptr()
            if a == addr:
                continue
            numel, dtype = self._pmeta[i]
            what = None
            if p.device.type != "cpu":
                what = "moved to %s" % p.device
            elif p.dtype != dtype:
                what = "changed dtype from %s to %s" % (dtype, p.dtype)
            elif p.numel() != numel:
                what = "changed size from %d to %d elements" % (numel, p.numel())
            elif not p.is_contiguous():
                what = "is no longer contiguous"
            if what is not None:
                raise RuntimeError(
                    "%s: parameter %d %s since the optimizer was created: the engine updates it in place as it "
                    "was; create the optimizer after model.to(...)" % (type(self.opt).__name__, i, what))
            try:
                repoint(i, a)
            except _lib_errors.LibraryNotFound as e:
                raise RuntimeError(
                    "%s: parameter %d moved since the optimizer was created (p.data was replaced) and %s; create "
                    "the optimizer after model.to(...)" % (type(self.opt).__name__, i, e)) from e
            self._ptrs[k] = (i, a)

    def _account(self, res):
        """A step's result into the optimizer: skipped count, the norm, the
        groups' step."""
        self.last = res
        opt = self.opt
        if res["boundary"]:
            if res["skipped"]:
                self.steps_skipped += 1
            opt.last_grad_norm = res["grad_norm"]
        step = res["step"]
        for g in opt.param_groups:
            g["step"] = step


class _EngineBackend(_BackendCommon):
    """OffloadOptimizer's state in zo_optim engines (optim.h): one engine per
    parameter dtype (an engine has one device dtype); with several, the
    global norm and overflow are combined across them as across ranks.
    Gradients are handed over from host memory (zo_optim_grad_host) and the
    new parameters copied from the engines' parameter buffers, so any torch
    device works; masters and states live in pinned host memory or on NVMe."""

    def __init__(self, opt, *, state_dtype, nthreads, numa_node, offload_device, nvme_path,
                 sub_group_size, pinned_bytes, pin_memory, buffer_count, clip_mode, no_grad,
                 state_block=None, direct=None):
        from . import optim as _optim
        self.opt = weakref.proxy(opt)      # no cycle: the optimizer owns this
        self.kw = dict(state_dtype=state_dtype, nthreads=nthreads, numa_node=numa_node,
                       offload_device=offload_device, nvme_path=nvme_path,
                       sub_group_size=sub_group_size, pinned_bytes=pinned_bytes,
                       pin_memory=pin_memory, buffer_count=buffer_count, clip_mode=clip_mode,
                       no_grad=no_grad, state_block=state_block)
        # CPU params without DPU: the engine's fused kernel writes the new
        # params straight into the parameters' memory (zo_optim's direct mode
        # on the host backend): no parameter buffer (2 B/param) and no copy
        # back. The parameters must stay in place (create the optimizer after
        # model.to(...)). Under DPU the engine double-buffers them instead.
        # Parameters under zoffload.torch.offload_parameters() move (p.data is
        # swapped between store copies and placeholders): never in place.
        if direct is None:
            direct = (opt.device.type == "cpu" and not opt.delay_update
                      and not any(getattr(p, "_zo_offloaded", False) for _, p in opt._plist))
        self.direct = bool(direct)
        self.no_grad = no_grad
        self.speculative = clip_mode == "speculative"
        self._hp_sent = False
        self.engines = []           # [(dtype, Engine, {torch group: engine group}, [param idx])]
        self._ptrs = []             # direct: (param idx, address the engine writes)
        self._pmeta = {}            # direct: param idx -> (numel, dtype) the engine was built for
        self.where = [None] * len(opt._plist)     # param index -> (engine no, tensor index)
        # seconds spent in: step_async (launch), waiting for undelayed updates
        # (update), copying parameters back (copy_back), DPU fences (fence)
        self.timings = {"launch": 0.0, "update": 0.0, "copy_back": 0.0, "fence": 0.0}
        self.last = None
        self.steps_skipped = 0
        dtypes = sorted({p.dtype for _, p in opt._plist}, key=str)
        if self.speculative and len(dtypes) > 1:
            # the engines' norms would be combined while their updates run
            raise ValueError("clip_mode='speculative' needs one parameter dtype (got %s)"
                             % ", ".join(str(d).replace("torch.", "") for d in dtypes))
        for dt in dtypes:
            gmap, groups, idx = {}, [], []
            for gi, g in enumerate(opt.param_groups):
                mine = [i for i, (pg, p) in enumerate(opt._plist) if pg == gi and p.dtype == dt]
                if not mine:
                    continue
                gmap[gi] = len(groups)
                grp = {"numel": [opt._plist[i][1].numel() for i in mine],
                       "names": ["p%d" % i for i in mine]}
                grp.update(_engine_state(state_dtype, state_block))
                if self.direct:
                    grp["dev_params"] = [opt._plist[i][1].data_ptr() for i in mine]
                    self._ptrs.extend((i, opt._plist[i][1].data_ptr()) for i in mine)
                    self._pmeta.update((i, (opt._plist[i][1].numel(), dt)) for i in mine)
                groups.append(grp)
                idx.extend(mine)
            kw = _engine_kw(opt, dt, offload_device=offload_device, nthreads=nthreads, numa_node=numa_node,
                            pin_memory=pin_memory, no_grad=no_grad, nvme_path=nvme_path,
                            sub_group_size=sub_group_size, pinned_bytes=pinned_bytes, buffer_count=buffer_count)
            kw.update(dpu=opt.delay_update, dpu_warmup_steps=opt._dpu_warmup_left, clip_mode=clip_mode)
            e = _optim.Engine(groups, kind=opt._zo_kind_id(), **kw)
            no = len(self.engines)
            self.engines.append((dt, e, gmap, idx))
            for t, i in enumerate(idx):
                self.where[i] = (no, t)
        self.tsteps = [0] * len(opt._plist)
        self.handed = 0             # gradients handed over since the last step
        self.handed_idx = set()     # params whose .grad was freed by that
        self._params_from_torch()
        self._set_hparams()

    # -- helpers
    def _set_hparams(self):
        opt = self.opt
        for g in opt.param_groups:
            opt._check_group_flags(g)
        for dt, e, gmap, _ in self.engines:
            for gi, eg in gmap.items():
                g = opt.param_groups[gi]
                h = opt._hparams(g, g.get("step", 0) + 1)
                h.step = 1  # the engine counts its updates itself (and refuses another count here)
                e.set_hparams(eg, h)

    def _params_from_torch(self):
        if self.direct:
            # widened from the parameters' own memory, without a parameter buffer
            self.follow_params()
            for _, e, _, _ in self.engines:
                e.init_from_device()
            return
        with torch.no_grad():
            for i, (gi, p) in enumerate(self.opt._plist):
                no, t = self.where[i]
                e = self.engines[no][1]
                e.import_state(t, "master", p.detach().to("cpu", torch.float32).reshape(-1))

    def copy_back(self, only=None, followed=False):
        """The engines' parameters into the model's (all, or the indices in
        `only`: those an update changed); `followed`: the caller re-pointed
        moved parameters already (step() does before its update)."""
        t0 = _now()
        if self.direct:
            # the kernel wrote the params; after an import of masters the
            # engine copies its buffer (no-op otherwise)
            if not followed:
                self.follow_params()
            for _, e, _, _ in self.engines:
                e.push_params()
            self.timings["copy_back"] += _now() - t0
            return
        with torch.no_grad():
            for i in range(len(self.opt._plist)) if only is None else only:
                p = self.opt._plist[i][1]
                no, t = self.where[i]
                buf = self.engines[no][1].param_buffer(t, like="torch")
                p.data.copy_(buf.view(p.shape))
        self.timings["copy_back"] += _now() - t0

    # -- gradients
    def take_grad(self, i, p, free):
        if self.speculative and not self._hp_sent:
            self.follow_params()
            # the speculative step starts with this step's first gradient:
            # its hyperparameters (LR schedule) must be in before
            self._set_hparams()
            self._hp_sent = True
        g = p.grad
        no, t = self.where[i]
        host = g.detach()
        if host.device.type != "cpu" or not host.is_contiguous():
            host = host.to("cpu").contiguous()
        if self.opt.param_groups[self.opt._plist[i][0]].get("maximize"):
            host = torch.neg(host)      # torch's maximize: the update follows -grad
        self.engines[no][1].grad_host(t, host.reshape(-1))
        self._handed_over(i, p, free)

    def discard(self):
        """Forget the gradients handed over since the last step (zero_grad)."""
        if not self.handed:
            return
        for _, e, _, _ in self.engines:
            if not e.can_discard_grads():
                raise NotImplementedError(
                    "zero_grad(): %d gradients were handed to the engine during backward "
                    "(grad_hooks='backward') and this libzoffload cannot drop them (it has no "
                    "zo_optim_discard_grads): the next step() would apply them. Use a library with "
                    "it, or grad_hooks='step'" % self.handed)
        for _, e, _, _ in self.engines:
            e.discard_grads()
        self.handed = 0
        self.handed_idx.clear()

    # -- step
    def follow_params(self):
        """Direct mode: the engine writes the parameters at their addresses;
        one that moved (p.data replaced) is re-pointed before the engine
        touches it again (_follow_params)."""
        def repoint(i, addr):
            no, t = self.where[i]
            self.engines[no][1].set_dev_param(t, addr)
        self._follow_params(repoint)

    def step(self):
        opt = self.opt
        self.follow_params()
        if opt.delay_update:
            # The fence: finish the update of the previous step and put its
            # parameters into the model (the forward of the next step uses
            # them), before this step's update starts.
            self.wait()
        if not (self.speculative and self._hp_sent):
            self._set_hparams()
        self._hp_sent = False
        t0 = _now()
        if len(self.engines) > 1:
            sumsq, nonfinite = 0.0, 0
            for _, e, _, _ in self.engines:
                s, n = e.grad_norm_partial()
                sumsq += s
                nonfinite += n
            for _, e, _, _ in self.engines:
                e.step_async(global_sumsq=sumsq, global_nonfinite=nonfinite > 0)
        else:
            self.engines[0][1].step_async()
        self.handed = 0
        self.handed_idx.clear()
        self.timings["launch"] += _now() - t0
        delayed = opt.delay_update and self.engines[0][1].info()["dpu_active"]
        if delayed:
            # runs while the next forward/backward do; wait() collects it
            res = None
            for g in opt.param_groups:
                g["step"] = g.get("step", 0) + 1
        else:
            t0 = _now()
            res = self._wait_all()
            if opt.delay_update and not res.get("boundary"):
                # a DPU warm-up boundary: step_async finished the update
                # itself (the next forward must see it), so wait() found
                # nothing in flight; its result (norm, skip) is the last one
                res = self.engines[0][1].last_result() or res
            self.timings["update"] += _now() - t0
            self.copy_back(self.refresh_steps(), followed=True)
        if res is not None:
            self._account(res)
        return res

    def _wait_all(self):
        res = None
        for _, e, _, _ in self.engines:
            r = e.wait()
            res = r if res is None else res
        return res

    def refresh_steps(self):
        """Each parameter's update count from the engines (its own with
        no_grad="skip"); returns the indices whose count moved."""
        moved = []
        for i, (gi, p) in enumerate(self.opt._plist):
            no, t = self.where[i]
            s = self.engines[no][1].tensor_step(t)
            if s != self.tsteps[i]:
                self.tsteps[i] = s
                moved.append(i)
        for i in moved:
            if i in self.opt._live:
                self.opt.state[self.opt._plist[i][1]].refresh()
        return moved

    def set_steps(self, steps, top=None):
        """Set every parameter's update count (a list by parameter index);
        the engines' own counts become `top` (default: the largest)."""
        if top is None:
            top = max(steps) if steps else 0
        for _, e, _, _ in self.engines:
            e.set_step(top)
        if self.no_grad == "skip":
            for i, s in enumerate(steps):
                no, t = self.where[i]
                if s != top:
                    self.engines[no][1].set_tensor_step(t, s)
        self.refresh_steps()

    def wait(self):
        t0 = _now()
        res = self._wait_all()
        self.timings["fence"] += _now() - t0
        self.copy_back(self.refresh_steps())
        if res is not None and res.get("boundary"):
            self._account(res)

    @property
    def loss_scale(self):
        return self.engines[0][1].info()["loss_scale"]

    def scaler_states(self):
        """Each engine's loss-scaler state (zo_optim_get_scaler), in engine order."""
        return [e.scaler_state() for _, e, _, _ in self.engines]

    def set_scaler_states(self, states):
        for (_, e, _, _), st in zip(self.engines, states):
            e.set_scaler_state(st)

    def memory(self):
        out = {"grad_buffer_bytes": 0, "pinned_bytes": 0, "host_bytes": 0, "numel": 0,
               "state_bytes": 0, "nvme_read_bytes_total": 0, "nvme_write_bytes_total": 0}
        sb = _state_elem_bytes(self.opt.state_format, self.opt.state_block)
        for _, e, _, _ in self.engines:
            inf = e.info()
            for k in out:
                if k in inf:
                    out[k] += inf[k]
            out["state_bytes"] += int(inf["numel"] * (4 + sb * len(self.opt._state_names)))
        return out

    # -- state
    def export_state(self, i, name, out):
        """State `name` of parameter i into tensor `out` (its dtype)."""
        no, t = self.where[i]
        self.engines[no][1].export_state(t, name, out.view(-1))

    def import_live(self, i, name, value):
        """state[p][name] = value: a state tensor, or the step count."""
        p = self.opt._plist[i][1]
        no, t = self.where[i]
        e = self.engines[no][1]
        if name == "step":
            s = int(float(value))
            if self.no_grad != "skip" and s != self.tsteps[i]:
                raise ValueError("no_grad='zero' keeps one step count for all parameters: set it "
                                 "with load_state_dict()")
            if self.no_grad == "skip":
                e.set_tensor_step(t, s)
            self.tsteps[i] = s
            return
        src = torch.as_tensor(value).detach().to("cpu")
        if tuple(src.shape) != tuple(p.shape):
            raise ValueError("state %r has shape %s, the parameter %s"
                             % (name, tuple(src.shape), tuple(p.shape)))
        if src.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            src = src.float()
        e.import_state(t, name, src.contiguous().reshape(-1))

    def export_param(self, i):
        opt = self.opt
        p = opt._plist[i][1]
        no, t = self.where[i]
        e = self.engines[no][1]
        out = {}
        for nm in opt._state_names:
            dst = torch.empty(p.shape, dtype=opt.state_dtype)
            e.export_state(t, nm, dst.view(-1))
            out[nm] = dst
        if p.dtype != torch.float32:
            m = torch.empty(p.shape, dtype=torch.float32)
            e.export_state(t, "master", m.view(-1))
            out["master_param"] = m
        return out

    def import_param(self, i, s, p):
        no, t = self.where[i]
        e = self.engines[no][1]
        for nm in self.opt._state_names:
            if nm in s:
                self.import_live(i, nm, s[nm])
        m = s.get("master_param")
        m = m.detach().to("cpu", torch.float32) if m is not None else p.detach().to("cpu", torch.float32)
        e.import_state(t, "master", m.contiguous().reshape(-1))

    def fill_state(self, i, name, value):
        no, t = self.where[i]
        p = self.opt._plist[i][1]
        self.engines[no][1].import_state(t, name, torch.full((p.numel(),), float(value)))

    # -- raw quantized states (state_dict(quantized=True))
    def _qlayout(self, no):
        """Engine no's layout: per tensor index its (group, offset in the
        group, numel), and per group its sub-groups [(k, offset, numel)] and
        their zo_optim_qstate_info."""
        e = self.engines[no][1]
        tens, goff = [], {}
        for t in range(len(e)):
            n, g, _ = e.tensor(t)
            tens.append((g, goff.get(g, 0), n))
            goff[g] = goff.get(g, 0) + n
        sgs, infos = {}, []
        for k in range(e.info()["nsubgroups"]):
            qi = e.qstate_info(k)
            infos.append(qi)
            sgs.setdefault(qi["group"], []).append((k, qi["offset"], qi["numel"]))
        return tens, sgs, infos

    def qstate_meta(self):
        """The dict's "qstate" record: format, bits, block, and each
        state's map (zo_qmap id and its fp32 table)."""
        info = None
        for _, e, _, _ in self.engines:
            if e.info()["nsubgroups"]:
                info = e.qstate_info(0)
                break
        return _qstate_record(self.opt, info)

    def export_qstate(self):
        """{param index: {"<state>_codes", "<state>_absmax", "qpieces"}}:
        the codes and scales of the whole blocks covering each parameter,
        read raw (zo_optim_qstate_export) one sub-group at a time."""
        opt = self.opt
        names = opt._state_names
        parts = {i: {"pieces": [], **{nm: ([], []) for nm in names}} for i in range(len(opt._plist))}
        for no, (_, e, _, idx) in enumerate(self.engines):
            tens, sgs, infos = self._qlayout(no)
            # the pieces of every tensor, by sub-group
            by_sg = {}
            for t, (g, toff, tn) in enumerate(tens):
                for k, t0, lead, n, nc in _qpieces(toff, tn, sgs[g], infos[sgs[g][0][0]]["block"]):
                    by_sg.setdefault(k, []).append((t, t0, lead, n, nc))
            for k, qi in enumerate(infos):
                bits, block = qi["bits"], qi["block"]
                raw = {nm: e.qstate_export(k, nm, torch.empty(qi["code_bytes"], dtype=torch.uint8),
                                           torch.empty(qi["nscales"], dtype=torch.float32)) for nm in names}
                for t, t0, lead, n, nc in by_sg.get(k, ()):
                    pt = parts[idx[t]]
                    pt["pieces"].append((lead, n, nc))
                    c0, s0 = _code_bytes(t0, bits), t0 // block
                    for nm in names:
                        pt[nm][0].append(raw[nm][0][c0:c0 + _code_bytes(nc, bits)])
                        pt[nm][1].append(raw[nm][1][s0:s0 + -(-nc // block)])
        out = {}
        for i, pt in parts.items():
            d = {"qpieces": torch.tensor(pt["pieces"], dtype=torch.int64).reshape(-1, 3)}
            for nm in names:
                d[nm + "_codes"] = torch.cat(pt[nm][0])
                d[nm + "_absmax"] = torch.cat(pt[nm][1])
            out[i] = d
        return out

    def qstate_plan(self, entries, qz):
        """The raw restore of entries (by parameter index, each with codes,
        scales and qpieces) into the engines, or None when it cannot be bit
        for bit: another format, block or map, a parameter without an entry,
        or another layout (pieces that differ). Checks that blocks shared by
        neighbouring parameters agree (ValueError). Changes nothing."""
        opt = self.opt
        names = opt._state_names
        if opt.state_format != qz.get("state_format") or any(s is None for s in entries):
            return None
        meta = self.qstate_meta()
        if int(qz.get("bits", 0)) != meta["bits"] or int(qz.get("block", 0)) != meta["block"]:
            return None
        for nm in names:
            mine, theirs = meta["maps"][nm], qz["maps"][nm]
            if int(theirs["id"]) != mine["id"] or not torch.equal(
                    torch.as_tensor(theirs["values"], dtype=torch.float32), mine["values"]):
                return None
        plan = []
        for no, (_, e, _, idx) in enumerate(self.engines):
            tens, sgs, infos = self._qlayout(no)
            bufs = {k: {nm: (torch.empty(qi["code_bytes"], dtype=torch.uint8),
                             torch.empty(qi["nscales"], dtype=torch.float32)) for nm in names}
                    for k, qi in enumerate(infos)}
            # who wrote each code byte / scale first: a later piece must agree
            seen = {k: (torch.full((qi["code_bytes"],), -1, dtype=torch.int64),
                        torch.full((qi["nscales"],), -1, dtype=torch.int64)) for k, qi in enumerate(infos)}
            for t, (g, toff, tn) in enumerate(tens):
                i = idx[t]
                s = entries[i]
                want = _qpieces(toff, tn, sgs[g], meta["block"])
                got = torch.as_tensor(s["qpieces"]).reshape(-1, 3).tolist()
                if [list(w[2:]) for w in want] != got:
                    return None
                cpos, spos = 0, 0
                for k, t0, lead, n, nc in want:
                    cb, nb = _code_bytes(nc, meta["bits"]), -(-nc // meta["block"])
                    c0, s0 = _code_bytes(t0, meta["bits"]), t0 // meta["block"]
                    for nm in names:
                        codes = torch.as_tensor(s[nm + "_codes"]).reshape(-1)
                        absmax = torch.as_tensor(s[nm + "_absmax"]).reshape(-1)
                        if codes.dtype != torch.uint8 or absmax.dtype != torch.float32:
                            raise ValueError("state dict: parameter %d's %s_codes must be uint8 and %s_absmax "
                                             "float32 (got %s, %s)" % (i, nm, nm, codes.dtype, absmax.dtype))
                        if codes.numel() < cpos + cb or absmax.numel() < spos + nb:
                            raise ValueError("state dict: parameter %d's %s codes or scales are shorter than its "
                                             "qpieces say" % (i, nm))
                        for dst, src, who, lo, m in ((bufs[k][nm][0], codes[cpos:cpos + cb], seen[k][0], c0, cb),
                                                     (bufs[k][nm][1], absmax[spos:spos + nb], seen[k][1], s0, nb)):
                            prev = who[lo:lo + m]
                            old = prev >= 0
                            if bool(old.any()) and not torch.equal(
                                    dst[lo:lo + m][old].view(torch.uint8) if src.dtype == torch.uint8
                                    else dst[lo:lo + m][old].view(torch.int32),
                                    src[old].view(torch.uint8) if src.dtype == torch.uint8
                                    else src[old].view(torch.int32)):
                                raise ValueError("state dict: parameters %d and %d hold different %s codes or "
                                                 "scales for the block they share"
                                                 % (int(prev[old][0]), i, nm))
                            dst[lo:lo + m] = src
                            if nm == names[-1]:
                                prev[prev < 0] = i
                    cpos, spos = cpos + cb, spos + nb
            for k, (cs, ss) in seen.items():
                if bool((cs < 0).any()) or bool((ss < 0).any()):
                    return None
            # what zo_optim_qstate_import refuses, refused here before anything is changed
            for k, states in bufs.items():
                for nm, (codes, absmax) in states.items():
                    bad = (absmax < 0) | torch.isinf(absmax)
                    if bool(bad.any()):
                        raise ValueError("state dict: an %s absmax is %g (a scale is >= 0, or NaN for a block "
                                         "that overflowed)" % (nm, float(absmax[bad][0])))
                    if meta["bits"] == 4 and infos[k]["numel"] % 2 and int(codes[-1]) >> 4:
                        raise ValueError("state dict: the pad nibble of an odd-sized sub-group's %s codes is "
                                         "not 0" % nm)
            plan.append((e, bufs))
        return plan

    def import_qstate(self, plan):
        """Store a qstate_plan's sub-groups raw (zo_optim_qstate_import)."""
        for e, bufs in plan:
            for k, states in bufs.items():
                for nm, (codes, absmax) in states.items():
                    e.qstate_import(k, nm, codes, absmax)

    def save(self, root, name, keep_last, user):
        # one engine checkpoint root per engine, under the caller's root
        os.makedirs(str(root), mode=0o700, exist_ok=True)
        for no, (dt, e, _, _) in enumerate(self.engines):
            e.save(os.path.join(str(root), "engine%d" % no), name, keep_last,
                   json.dumps(user))

    def latest(self, root):
        return _ckpt.latest(os.path.join(str(root), "engine0"))

    def load(self, root, name):
        user = None
        for no, (dt, e, _, _) in enumerate(self.engines):
            txt = e.load(os.path.join(str(root), "engine%d" % no), name)
            user = json.loads(txt) if txt else user
        self.copy_back()
        return user

    def close(self):
        for _, e, _, _ in self.engines:
            e.close()
        self.engines = []


class OffloadOptimizer(torch.optim.Optimizer):
    """Base class; use :class:`OffloadAdamW`, :class:`OffloadAdam`,
    :class:`OffloadAdagrad` or :class:`OffloadLion`.

    Common keyword arguments (besides the optimizer's hyperparameters):

    max_grad_norm:   clip the global L2 norm of the gradients to this (None: no clipping)
    loss_scale:      None (no scaling), "dynamic", a number (static), or a LossScaler
    delay_update:    DPU: overlap the update of step N with forward/backward of N+1
    dpu_warmup:      steps run without delay first (default 0)
    grad_hooks:      "step" (default: .grad as torch has it, handed over at
                     step(); torch's clipping, zero_grad and inspection work
                     as with any optimizer) or "backward" ("auto": hand each
                     gradient over as backward completes it and free .grad,
                     so torch never holds all gradients; clip with
                     max_grad_norm, torch's clipping functions refuse)
    no_grad:         parameters without a gradient in a step: "skip" (default,
                     torch's rule: not updated, no weight decay, states and
                     their own step count untouched) or "zero" (DeepSpeed's:
                     updated with a zero gradient, one step count for all)
    state_dtype:     torch.float32 (default) or torch.bfloat16 for the two states,
                     or "q8" / "q4": block-wise quantized moments (a byte or
                     half a byte per element plus an fp32 absmax per block;
                     AdamW, Adam and Lion; two_pass clipping; no_grad "zero",
                     its default there). state_dict() gives them dequantized
                     to fp32 in torch's format, state_dict(quantized=True)
                     the codes and scales as stored (loaded back bit for
                     bit); save() keeps them as they are too (docs/pytorch.md)
    state_block:     with "q8"/"q4": elements per absmax scale, a power of
                     two in [64, 4096] (default 256 for q8, 128 for q4)
    state_map_m, state_map_v: with "q8"/"q4": the code maps of m ("dynamic",
                     "linear") and v ("dynamic", "dynamic_nz", "linear",
                     "linear_nz"; not with Lion, which keeps no v). None
                     (default): dynamic m, v "dynamic" for q8 and
                     "dynamic_nz" for q4 (docs/optim.md "Quantized states")
    nthreads:        CPU threads of the update (default: the CPUs this process may use)
    numa_node:       NUMA node for the pinned buffers (-1: the engine's choice)
    offload_device:  "cpu" (pinned host memory) or "nvme"
    nvme_path:       directory of the swap files for offload_device="nvme"
    sub_group_size, pinned_bytes, pin_memory, buffer_count: engine settings
                     (DeepSpeed's names, see optim.h)
    process_group:   None (one rank), True (torch.distributed's default group)
                     or a ProcessGroup: the partitioned engine, each rank its
                     shard (see zoffload.torch_dist and docs/pytorch.md);
                     there no_grad defaults to (and must be) "zero" and
                     grad_hooks to "backward"
    bucket_bytes:    with process_group, the gradient bucket of one
                     reduce-scatter (default 25 MiB)
    clip_mode:       "two_pass" (default: norm first, then the update, after
                     backward) or "speculative" (each sub-group is updated as
                     soon as backward has produced all of its gradients, in
                     backward's order, so the update, and with NVMe its disk
                     traffic, overlaps backward; clipping or an overflow found
                     at the end rolls the step back and redoes it: cheap for
                     rare events, three sweeps when it hits). Adam/AdamW with
                     fp32 states, without delay_update.

    Memory (CPU params): the parameters' own memory is written by the engine
    (no copy of the params); gradients wait in a window of 2 B/param for
    bf16/fp16 params (4 B/param for fp32 params or several backward passes
    per step); with grad_hooks="backward" each ``p.grad`` is freed as soon
    as the engine has it, so torch never holds all gradients at once;
    masters and states (12 B/param) are in pinned memory or on NVMe.
    ``memory()`` reports it.
    """

    _kind = None
    #: state names in torch's format
    _state_names = ("exp_avg", "exp_avg_sq")
    #: whether torch's optimizer has a parameter's state before its first update
    _eager_state = False

    def __init__(self, params, defaults, *, max_grad_norm=None, loss_scale=None,
                 delay_update=False, dpu_warmup=0, grad_hooks=None, state_dtype=torch.float32,
                 nthreads=None, numa_node=-1, offload_device="cpu", nvme_path=None,
                 sub_group_size=None, pinned_bytes=None, pin_memory=True,
                 buffer_count=None, clip_mode="two_pass", no_grad=None, maximize=False,
                 foreach=None, fused=None, capturable=False, differentiable=False,
                 process_group=None, bucket_bytes=None, state_block=None, state_map_m=None, state_map_v=None):
        if type(self)._hparams is OffloadOptimizer._hparams:
            raise TypeError("%s is a base class: use OffloadAdamW, OffloadAdam, OffloadAdagrad or OffloadLion"
                            % type(self).__name__)
        defaults = dict(defaults, maximize=bool(maximize), foreach=foreach, fused=fused,
                        capturable=capturable, differentiable=differentiable)
        self._built = False
        super().__init__(params, defaults)
        for g in self.param_groups:
            self._check_group_flags(g)
        # many ranks (torch_dist): no_grad "zero" and the backward hooks are
        # the defaults there; one rank keeps torch's rule and .grad until step()
        many = process_group is not None
        quant = isinstance(state_dtype, str)
        if quant:
            self._check_qstate(state_dtype, state_block, clip_mode, no_grad)
            self._check_qmaps(state_map_m, state_map_v)
        else:
            for k, v in (("state_block", state_block), ("state_map_m", state_map_m), ("state_map_v", state_map_v)):
                if v is not None:
                    raise ValueError("%s is a setting of quantized states: it needs state_dtype='q8' or 'q4'" % k)
        # the code maps (None: the engine's per-width defaults); _engine_kw() passes them on
        self.state_map_m = state_map_m.lower() if isinstance(state_map_m, str) else state_map_m
        self.state_map_v = state_map_v.lower() if isinstance(state_map_v, str) else state_map_v
        if no_grad is None:
            # the engine's quantized step updates every element (no_grad "zero" only)
            no_grad = "zero" if many or quant else "skip"
        if grad_hooks is None:
            grad_hooks = "backward" if many else "step"
        if bucket_bytes is not None and not many:
            raise ValueError("bucket_bytes is the gradient bucket of the ranks' reduce-scatters: it needs "
                             "process_group=...")
        if no_grad not in ("skip", "zero"):
            raise ValueError("no_grad must be 'skip' (torch's rule) or 'zero' (DeepSpeed's), not %r"
                             % (no_grad,))
        if clip_mode not in ("two_pass", "speculative"):
            raise ValueError("clip_mode must be 'two_pass' or 'speculative', not %r" % (clip_mode,))
        if offload_device not in ("cpu", "nvme"):
            raise ValueError("offload_device must be 'cpu' or 'nvme', not %r" % (offload_device,))
        if not quant and state_dtype not in (torch.float32, torch.bfloat16):
            raise TypeError("state_dtype must be torch.float32, torch.bfloat16, 'q8' or 'q4', not %r"
                            % (state_dtype,))
        if max_grad_norm is not None and not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
            raise ValueError("max_grad_norm must be finite and > 0, not %r" % (max_grad_norm,))
        if grad_hooks not in ("step", "backward", "auto"):
            raise ValueError("grad_hooks must be 'step' or 'backward' ('auto'), not %r" % (grad_hooks,))
        self.max_grad_norm = max_grad_norm
        for g in self.param_groups:
            g.setdefault("step", 0)
        if isinstance(loss_scale, LossScaler):
            self.scaler = loss_scale
        elif loss_scale is None:
            self.scaler = None
        elif loss_scale == "dynamic":
            self.scaler = LossScaler()
        else:
            self.scaler = LossScaler(scale=float(loss_scale))
        self.delay_update = bool(delay_update)
        self.dpu_warmup = int(dpu_warmup)
        self._dpu_warmup_left = self.dpu_warmup
        # state_dtype: the dtype states are exported in (state_dict(), state[p]):
        # fp32 for q8/q4, whose moments are computed in fp32 and stored quantized
        self.state_dtype = torch.float32 if quant else state_dtype
        self.state_format = state_dtype if quant else ("bf16" if state_dtype == torch.bfloat16 else "f32")
        self.state_block = int(state_block) if state_block else (
            (256 if state_dtype == "q8" else 128) if quant else None)
        self.last_grad_norm = None
        self.steps_skipped = 0
        self._skip_nonfinite = False
        self._hooks = []
        self._no_sync = False
        self._check_params()
        self._live = set()          # params whose state[p] has copies handed out
        ekw = dict(state_dtype=state_dtype, nthreads=nthreads, numa_node=numa_node,
                   offload_device=offload_device, nvme_path=nvme_path,
                   sub_group_size=sub_group_size, pinned_bytes=pinned_bytes,
                   pin_memory=pin_memory, buffer_count=buffer_count, clip_mode=clip_mode,
                   no_grad=no_grad, state_block=state_block)
        if many:
            from .torch_dist import _PartBackend
            self._eb = _PartBackend(self, process_group=process_group, bucket_bytes=bucket_bytes, **ekw)
        else:
            self._eb = _EngineBackend(self, **ekw)
        self.no_grad = no_grad
        for i, (_, p) in enumerate(self._plist):
            self.state[p] = _ParamState(self, i)
        self.timings = self._eb.timings
        self.grad_hook_mode = self._install_hooks(grad_hooks)
        self._built = True

    @property
    def _scaler_cfg(self):
        """The loss scaler as zo_optim config fields. Without a scaler the
        engine must not scale on its own (fp16 defaults to dynamic there)."""
        return self.scaler.engine_config() if self.scaler is not None else {"loss_scale": 1.0}

    def _zo_kind_id(self):
        return self._zo_kind

    def _check_qstate(self, state_dtype, state_block, clip_mode, no_grad):
        """Refuse, by name, what the engine's quantized states do not offer."""
        name = type(self).__name__
        if state_dtype not in _QSTATES:
            raise TypeError("state_dtype must be torch.float32, torch.bfloat16, 'q8' or 'q4', not %r"
                            % (state_dtype,))
        if self._kind not in ("adamw", "adam", "lion"):
            raise ValueError("%s: state_dtype=%r: quantized states are offered for AdamW, Adam and Lion "
                             "(the engine has no quantized %s step)" % (name, state_dtype, self._kind))
        if clip_mode != "two_pass":
            raise ValueError("%s: state_dtype=%r needs clip_mode='two_pass' (the speculative step keeps "
                             "fp32 states to roll back)" % (name, state_dtype))
        if no_grad == "skip":
            raise ValueError("%s: state_dtype=%r needs no_grad='zero' (the default with q states): the "
                             "quantized step updates every element of a block" % (name, state_dtype))
        if state_block is not None:
            b = int(state_block)
            if b != state_block or b < 64 or b > 4096 or b & (b - 1):
                raise ValueError("%s: state_block must be a power of two in [64, 4096], not %r"
                                 % (name, state_block))

    def _check_qmaps(self, state_map_m, state_map_v):
        """Refuse, by name, maps the engine would refuse: unknown names, and
        a v map for Lion (it keeps no v: the map would be ignored)."""
        from . import optim as _optim
        name = type(self).__name__
        for which, v in (("m", state_map_m), ("v", state_map_v)):
            if v is None:
                continue
            try:
                _optim.qmap_id(which, v)
            except ValueError as e:
                raise ValueError("%s: %s" % (name, e)) from None
        if state_map_v is not None and "exp_avg_sq" not in self._state_names:
            raise ValueError("%s: state_map_v=%r: %s keeps no v (only m is quantized): leave it None"
                             % (name, state_map_v, name))

    def _check_group_flags(self, g):
        """torch.optim's keywords this optimizer does not implement, refused
        by name (foreach and fused are hints: the engine's step is one fused
        CPU pass either way; maximize is honoured)."""
        name = type(self).__name__
        if g.get("amsgrad"):
            raise ValueError("%s: amsgrad=True is not offered (the engine keeps exp_avg and "
                             "exp_avg_sq, not max_exp_avg_sq)" % name)
        if g.get("capturable"):
            raise ValueError("%s: capturable=True (a step() CUDA graphs can capture) is not offered: "
                             "the step runs on the CPU, in the engine" % name)
        if g.get("differentiable"):
            raise ValueError("%s: differentiable=True (autograd through step()) is not offered" % name)
        for k in ("foreach", "fused"):
            if g.get(k) not in (None, True, False):
                raise TypeError("%s: %s must be None, True or False, not %r" % (name, k, g.get(k)))

    # ------------------------------------------------------------ parameters
    def _check_params(self):
        plist, dev = [], None
        seen = set()
        for gi, g in enumerate(self.param_groups):
            for p in g["params"]:
                if id(p) in seen:
                    raise ValueError("a parameter appears twice in the param groups")
                seen.add(id(p))
                if p.dtype not in _ZO_DT:
                    raise TypeError("parameter of dtype %s: only float32, float16 and bfloat16 "
                                    "parameters can be offloaded" % p.dtype)
                if p.is_sparse or p.layout != torch.strided:
                    raise ValueError("sparse parameters are not supported")
                if not p.is_contiguous():
                    raise ValueError("parameter of shape %s is not contiguous" % (tuple(p.shape),))
                if p.numel() == 0:
                    raise ValueError("empty parameter (0 elements)")
                if dev is None:
                    dev = p.device
                elif p.device != dev:
                    raise ValueError("parameters on two devices (%s and %s): one optimizer "
                                     "offloads the parameters of one device" % (dev, p.device))
                if dev.type not in ("cpu", "cuda"):
                    raise ValueError("parameters on %s: cpu or cuda supported" % dev)
                plist.append((gi, p))
        if not plist:
            raise ValueError("optimizer got an empty parameter list")
        self.device = dev
        self._plist = plist

    # ------------------------------------------------------------ gradient intake
    def _install_hooks(self, mode, first=0):
        if mode == "step":
            return "step"
        _BACKWARD_HOOKED.add(self)
        _guard_clipping()
        for i, (_, p) in enumerate(self._plist):
            if i < first or not p.requires_grad:
                continue
            if _has_post_accumulate_hook():
                h = p.register_post_accumulate_grad_hook(self._make_post_hook(i))
                self._hooks.append(h)
            else:
                # torch < 2.1: hook the parameter's AccumulateGrad node (it runs
                # after .grad is accumulated); keep the node alive, or autograd
                # makes a new one without our hook.
                with torch.enable_grad():
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                h = acc.register_hook(self._make_node_hook(i))
                self._hooks.append((acc, h))
        return "post_accumulate_grad_hook" if _has_post_accumulate_hook() else "accumulate_grad_node"

    # The hooks hold the optimizer weakly: a model must not keep an optimizer
    # alive (and taking its gradients) after the program dropped it.
    def _make_post_hook(self, i):
        ref = weakref.ref(self)

        def hook(p):
            opt = ref()
            if opt is not None and not opt._no_sync:
                opt._take_grad(i, p)
        return hook

    def _make_node_hook(self, i):
        p = self._plist[i][1]
        ref = weakref.ref(self)

        def hook(grad_inputs, grad_outputs):
            opt = ref()
            if opt is not None and not opt._no_sync:
                opt._take_grad(i, p)
        return hook

    def _take_grad(self, i, p, free=True):
        g = p.grad
        if g is None:
            return
        if g.is_sparse:
            raise RuntimeError("sparse gradients are not supported")
        self._eb.take_grad(i, p, free)

    def _collect_step_grads(self):
        """The .grad tensors the hooks did not take (grad_hooks="step", a
        parameter without a hook, a .grad set by hand). With "step" they stay
        in .grad, as torch leaves them after a step."""
        keep = self.grad_hook_mode == "step"
        for i, (_, p) in enumerate(self._plist):
            if p.grad is not None:
                self._take_grad(i, p, free=not keep)

    # ------------------------------------------------------------ the step
    def _hparams(self, group, step):
        """The engine's hyperparameters of a param group: each optimizer
        class gives its own (__init__ refuses a class without one)."""
        raise TypeError("%s defines no _hparams" % type(self).__name__)

    def _fence(self):
        """Wait for a delayed update and put its result into the params."""
        self._eb.wait()

    def wait(self):
        """The DPU fence: finish a delayed update and copy its parameters
        into the model. A no-op without delay_update."""
        self._fence()

    synchronize = wait

    @torch.no_grad()
    def _no_direct(self):
        """Stop the engine writing parameters in place (zoffload.torch.
        offload_parameters calls this: it moves p.data). The engine is made
        again without direct mode; allowed only before the first step, when
        the masters still equal the parameters (read from them again here)."""
        eb = self._eb
        if getattr(eb, "partitioned", False):
            raise NotImplementedError("offload_parameters() with process_group: the partitioned engine "
                                      "all-gathers the params into their memory, which offloading moves")
        if not eb.direct:
            return
        if any(g.get("step", 0) for g in self.param_groups):
            raise ValueError("this optimizer already stepped with the parameters updated in place: "
                             "offload the parameters before its first step")
        kw = eb.kw
        eb.close()
        self._eb = _EngineBackend(self, direct=False, **kw)
        self.timings = self._eb.timings

    @torch.no_grad()
    def add_param_group(self, param_group):
        """torch's add_param_group (fine-tuning that unfreezes layers as it
        goes): the new group's parameters get masters and states in the
        engine, which is made again around them; the other parameters'
        masters, states and step counts carry over, and a DPU warm-up goes
        on where it was, and so does a dynamic loss scaler (its state is
        carried into the new engines)."""
        if not getattr(self, "_built", False):     # torch.optim.Optimizer.__init__
            return super().add_param_group(param_group)
        if getattr(self._eb, "partitioned", False):
            raise NotImplementedError("%s.add_param_group with process_group: the partitioned engine's layout "
                                      "is fixed at creation; make a new optimizer over every group (carry the "
                                      "states over with consolidated_state_dict() and load_state_dict())"
                                      % type(self).__name__)
        self._fence()
        self._write_back_live()
        eb = self._eb
        info = eb.engines[0][1].info()
        # each engine's scaler, by its dtype: a new dtype's engine takes the first one's
        scalers = {dt: e.scaler_state() for dt, e, _, _ in eb.engines}
        n_old = len(self._plist)
        snap = [eb.export_param(i) for i in range(n_old)]
        steps = list(eb.tsteps)
        gstep = self.param_groups[0].get("step", 0)
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        try:
            self._check_group_flags(g)
            self._check_params()
        except Exception:
            self.param_groups.pop()
            self._check_params()
            raise
        g["step"] = gstep
        self._dpu_warmup_left = max(0, self._dpu_warmup_left - info["micro_steps"])
        skipped = eb.steps_skipped
        eb.close()
        self._eb = _EngineBackend(self, direct=None if eb.direct else False, **eb.kw)
        self._eb.steps_skipped = skipped
        self.timings = self._eb.timings
        for i, (_, p) in enumerate(self._plist):
            self._eb.import_param(i, snap[i] if i < n_old else self._fresh_state(i), p)
            if i >= n_old:
                self.state[p] = _ParamState(self, i)
        self._eb.set_steps(steps + [0] * (len(self._plist) - n_old), top=gstep)
        if self.scaler is not None and self.scaler.dynamic:
            first = next(iter(scalers.values()))
            self._eb.set_scaler_states([scalers.get(dt, first) for dt, _, _, _ in self._eb.engines])
        for grp in self.param_groups:
            grp["step"] = gstep
        self._eb._set_hparams()
        self._eb.copy_back()
        self._refresh_live()
        if self.grad_hook_mode != "step":
            self._install_hooks("backward", first=n_old)

    def step(self, closure=None):
        """One optimizer step (see the module documentation)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._write_back_live()
        # Gradients that bypassed the hooks (grad_hooks="step", or a .grad
        # set by hand) are taken here.
        self._collect_step_grads()
        self._eb.step()
        self.steps_skipped = self._eb.steps_skipped
        return loss

    def _write_back_live(self):
        """state[p] tensors written in place since they were handed out go
        back into the engine."""
        for i in self._live:
            self.state[self._plist[i][1]].write_back()

    def _refresh_live(self):
        for i in self._live:
            self.state[self._plist[i][1]].refresh()

    def no_sync(self):
        """A context manager, DDP's ``no_sync``: the backward passes inside
        leave their gradients in ``.grad`` (torch adds them up) instead of
        handing them to the engine; the next backward outside (or step())
        hands the sums over. Gradient accumulation with process_group and
        grad_hooks="backward" needs it around all but the last backward."""
        from .torch_dist import no_sync
        return no_sync(self)

    def zero_grad(self, set_to_none=True):
        """Clear the parameters' .grad, and forget the gradients handed to
        the engine since the last step (the hooks hand them over during
        backward): what a later step() applies is only what comes after."""
        self._eb.discard()
        super().zero_grad(set_to_none=set_to_none)

    def scale_loss(self, loss):
        """loss * the current loss scale (identity without loss scaling)."""
        s = self.loss_scale
        return loss * s if s != 1.0 else loss

    @property
    def loss_scale(self):
        """The scale the engine expects the next backward's loss to carry."""
        return self._eb.loss_scale

    def memory(self):
        """The host memory the engine holds (dict: grad_buffer_bytes,
        pinned_bytes, host_bytes, state_bytes of masters + states wherever
        they live, numel, NVMe bytes moved so far)."""
        return self._eb.memory()

    def timeline(self):
        """Where the latest update's time went (a dict per engine, see
        zo_optim_timeline)."""
        return [e.timeline() for _, e, _, _ in self._eb.engines]

    # ------------------------------------------------------------ state
    def state_dict(self, quantized=False):
        """torch's format: {'state': {index: {'step', 'exp_avg', ...,
        'master_param' (low-precision params only)}}, 'param_groups': [...]};
        plus 'zoffload' with the loss scaler's settings and current scale.
        A parameter never updated has no entry (as in torch). The tensors
        are copies.

        quantized=True (q8/q4 states only): the moments as the engine stores
        them instead of dequantized: per parameter '<state>_codes' (uint8)
        and '<state>_absmax' (float32) of the whole blocks covering it, and
        'qpieces' (int64 [pieces, 3]: lead, numel, codes per sub-group it
        crosses); 'zoffload'/'qstate' has the format, bits, block and each
        state's code map (id and table). load_state_dict() of it into the
        same setting restores the codes bit for bit (docs/pytorch.md).
        With process_group the blocks start at this rank's shard, not at a
        parameter: 'zoffload'/'partition' then holds the shard's masters
        and, per sub-group of its engine, the codes and scales as stored
        ('qsub'); loadable on the same rank of the same world with the same
        state_dtype, state_block and sub_group_size, bit for bit."""
        if quantized and self.state_format not in _QSTATES:
            raise ValueError("%s.state_dict(quantized=True): the states are %s, not quantized (q8/q4 states "
                             "only)" % (type(self).__name__, self.state_format))
        self._fence()
        self._write_back_live()
        sd = super().state_dict()
        if getattr(self._eb, "partitioned", False):
            sd["state"] = {}
            sd["zoffload"] = {"format": _FORMAT, "kind": self._kind,
                              "scaler": self.scaler.state_dict() if self.scaler else None,
                              "loss_scale": self.loss_scale, "scaler_states": self._eb.scaler_states(),
                              "partition": self._eb.rank_state(quantized=quantized)}
            if quantized:
                sd["zoffload"]["qstate"] = self._eb.qstate_meta()
            return sd
        state = {}
        raw = self._eb.export_qstate() if quantized and any(self._eb.tsteps) else None
        for i, (_, p) in enumerate(self._plist):
            if self._eb.tsteps[i] == 0:
                continue
            state[i] = {"step": torch.tensor(float(self._eb.tsteps[i]))}
            if raw is None:
                state[i].update(self._eb.export_param(i))
                continue
            state[i].update(raw[i])
            if p.dtype != torch.float32:
                m = torch.empty(p.shape, dtype=torch.float32)
                self._eb.export_state(i, "master", m)
                state[i]["master_param"] = m
        sd["state"] = state
        sd["zoffload"] = {"format": _FORMAT, "kind": self._kind,
                          "scaler": self.scaler.state_dict() if self.scaler else None,
                          "loss_scale": self.loss_scale,
                          # the dynamic scaler goes on where it was after a load
                          "scaler_states": self._eb.scaler_states()}
        if quantized:
            sd["zoffload"]["qstate"] = self._eb.qstate_meta()
        return sd

    def load_state_dict(self, state_dict):
        """Load a state dict of this class or of the matching torch.optim
        optimizer (then masters come from the current parameters). A
        parameter without an entry starts afresh (zero states, count 0,
        master from the parameter), as in torch. Everything is checked
        before anything is changed."""
        self._fence()
        if (state_dict.get("zoffload") or {}).get("format") == "zoffload.hf.stub/1":
            raise ValueError("this state dict is zoffload.hf's stub: the optimizer's state is in the engine "
                             "checkpoint %r beside the file it came from; resume the Trainer with "
                             "zoffload.hf.attach(trainer), or call opt.load(<checkpoint>/%s)"
                             % (state_dict["zoffload"].get("checkpoint_dir"),
                                state_dict["zoffload"].get("checkpoint_dir")))
        part = (state_dict.get("zoffload") or {}).get("partition")
        if part is not None and not getattr(self._eb, "partitioned", False):
            raise ValueError("this state dict is one rank's shard (rank %s of %s) of a process_group optimizer: "
                             "load it with process_group on that rank, or save consolidated_state_dict() for "
                             "one rank" % (part.get("rank"), part.get("world")))
        groups = state_dict["param_groups"]
        for sg in groups:
            if sg.get("amsgrad"):
                raise ValueError("state dict uses amsgrad=True, which %s does not offer"
                                 % type(self).__name__)
        if len(groups) != len(self.param_groups):
            raise ValueError("state dict has %d param groups, optimizer has %d"
                             % (len(groups), len(self.param_groups)))
        ids = []
        for g, sg in zip(self.param_groups, groups):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError("param group sizes differ (%d vs %d)"
                                 % (len(g["params"]), len(sg["params"])))
            ids.extend(sg["params"])
        pidx = {id(p): i for i, (_, p) in enumerate(self._plist)}
        order = [pidx[id(p)] for g in self.param_groups for p in g["params"]]
        st = state_dict["state"]
        entries = [None] * len(self._plist)
        steps = [0] * len(self._plist)
        qz = (state_dict.get("zoffload") or {}).get("qstate")
        if qz is not None and qz.get("format") != _QFORMAT:
            raise ValueError("state dict: quantized states of format %r (this version reads %r)"
                             % (qz.get("format"), _QFORMAT))
        if part is not None and qz is not None and self.state_format not in _QSTATES:
            raise ValueError("state dict: this rank's shard holds %s states as raw codes "
                             "(state_dict(quantized=True)); this optimizer keeps %s states: load it into the same "
                             "state_dtype, or save state_dict() (dequantized)" % (qz.get("state_format"),
                                                                                 self.state_format))
        if part is not None and qz is not None and part.get("qsub"):
            mine = self._eb.qstate_meta()
            for key in ("bits", "block"):
                if mine[key] is not None and qz.get(key) != mine[key]:
                    raise ValueError("state dict: raw %s states with %s %s, this optimizer's are %s (state_dtype "
                                     "and state_block must match to load codes as stored)"
                                     % (qz.get("state_format"), "state_block" if key == "block" else "bits",
                                        qz.get(key), mine[key]))
            ids_q = {nm: (m or {}).get("id") for nm, m in (qz.get("maps") or {}).items()}
            ids_mine = {nm: m["id"] for nm, m in mine["maps"].items()}
            if mine["maps"] and ids_q != ids_mine:
                raise ValueError("state dict: raw states coded with maps %s, this optimizer's are %s (state_map_m "
                                 "/ state_map_v)" % (ids_q, ids_mine))
        for sid, i in zip(ids, order):
            s = st.get(sid)
            if s is None:
                continue
            p = self._plist[i][1]
            if qz is not None:
                entries[i] = self._check_qentry(sid, s, qz, p)
                s = entries[i]["plain"]
            for nm in self._state_names + ("master_param",):
                if nm in s and tuple(s[nm].shape) != tuple(p.shape):
                    raise ValueError("state %r of parameter %s has shape %s, the parameter %s"
                                     % (nm, sid, tuple(s[nm].shape), tuple(p.shape)))
            if qz is None:
                entries[i] = s
            steps[i] = int(float(s["step"])) if "step" in s else 0
        if part is not None:
            self._eb.load_rank_state(part)
            for g, sg in zip(self.param_groups, groups):
                for key, val in sg.items():
                    if key not in ("params", "foreach", "fused", "capturable", "differentiable"):
                        g[key] = val
            for g in self.param_groups:
                g["step"] = int(part["step"])
            self._eb._set_hparams()
            self._eb.copy_back()
            self._load_scaler(state_dict)
            return
        if self.no_grad == "zero" and len(set(steps)) > 1:
            raise ValueError("no_grad='zero' keeps one step count for all parameters; the state dict "
                             "has %s (no_grad='skip' keeps one per parameter)" % sorted(set(steps)))
        plan = None
        if qz is not None:
            # raw when this optimizer stores the same codes the same way,
            # else each parameter's states dequantized (and requantized by
            # the import, for other q settings)
            if self.state_format in _QSTATES and not getattr(self._eb, "partitioned", False):
                plan = self._eb.qstate_plan([s if s is None else s["raw"] for s in entries], qz)
            if plan is None:
                entries = [s if s is None else s["dequantized"]() for s in entries]
            else:
                entries = [s if s is None else s["plain"] for s in entries]
        with torch.no_grad():
            for i, s in enumerate(entries):
                self._eb.import_param(i, s if s is not None else self._fresh_state(i),
                                      self._plist[i][1])
            if plan is not None:
                self._eb.import_qstate(plan)
        for g, sg in zip(self.param_groups, groups):
            for key, val in sg.items():
                # torch's implementation hints (a CUDA run's capturable=True) are not this
                # optimizer's: it keeps its own
                if key not in ("params", "foreach", "fused", "capturable", "differentiable"):
                    g[key] = val
        self._eb.set_steps(steps)
        for g in self.param_groups:
            g["step"] = max(steps)
        self._eb._set_hparams()
        self._eb.copy_back()
        self._refresh_live()
        self._load_scaler(state_dict)

    def _check_qentry(self, sid, s, qz, p):
        """One parameter's entry of a state_dict(quantized=True) dict, checked:
        {"raw": the entry, "plain": it without the moments (step and
        master_param: the raw restore imports those), "dequantized": a
        function giving it with the moments dequantized to fp32 tensors of
        the parameter's shape}."""
        need = ["qpieces"] + [nm + k for nm in self._state_names for k in ("_codes", "_absmax")]
        miss = [k for k in need if k not in s]
        if miss:
            raise ValueError("state dict: parameter %s lacks %s (a quantized state dict of %s holds %s)"
                             % (sid, ", ".join(miss), type(self).__name__, ", ".join(need)))
        pieces = torch.as_tensor(s["qpieces"]).reshape(-1, 3)
        if int(pieces[:, 1].sum()) != p.numel():
            raise ValueError("state dict: parameter %s's qpieces cover %d elements, the parameter has %d"
                             % (sid, int(pieces[:, 1].sum()), p.numel()))
        plain = {k: v for k, v in s.items() if k not in need}

        def dequantized():
            d = dict(plain)
            for nm in self._state_names:
                d[nm] = dequantize_qstate(s, nm, qz).reshape(p.shape)
            return d
        return {"raw": s, "plain": plain, "dequantized": dequantized}

    def _load_scaler(self, state_dict):
        z = state_dict.get("zoffload") or {}
        states = z.get("scaler_states")
        dynamic = self.scaler is not None and self.scaler.dynamic
        if dynamic and states and len(states) == len(self._eb.engines) and all(s.get("dynamic") for s in states):
            self._eb.set_scaler_states(states)
        elif dynamic and z.get("loss_scale") not in (None, self.loss_scale):
            # a state dict without the scaler's state (an older one, or one
            # made without dynamic scaling)
            warnings.warn("%s.load_state_dict: the dynamic loss scale restarts at %g (the state dict's run "
                          "was at %g, and it holds no scaler state)" % (type(self).__name__, self.loss_scale,
                                                                        z["loss_scale"]),
                          RuntimeWarning, stacklevel=2)

    def consolidated_state_dict(self, to_rank=0):
        """The whole optimizer state in torch's format (as state_dict() of a
        one-rank optimizer: loadable by OffloadAdamW at any world size, or by
        torch.optim.AdamW) on rank `to_rank` of the process group, None on
        the others. Collective with process_group: every rank calls it.
        Without process_group it is state_dict() (to_rank must be 0)."""
        if not getattr(self._eb, "partitioned", False):
            if to_rank != 0:
                raise ValueError("consolidated_state_dict(to_rank=%r): one rank (no process_group)" % (to_rank,))
            return self.state_dict()
        if not 0 <= int(to_rank) < self._eb.world:
            raise ValueError("to_rank %r: 0 <= to_rank < %d" % (to_rank, self._eb.world))
        self._fence()
        flat = self._eb.consolidated(int(to_rank))
        if flat is None:
            return None
        sd = super().state_dict()
        step = self._eb.tsteps[0] if self._eb.tsteps else 0
        state = {}
        for i, (gi, p) in enumerate(self._plist):
            if step == 0:
                continue
            a, n = self._eb.toff[i], p.numel()
            e = {"step": torch.tensor(float(step))}
            for nm in self._state_names:
                e[nm] = flat[(gi, nm)][a:a + n].reshape(p.shape).to(self.state_dtype).clone()
            if p.dtype != torch.float32:
                e["master_param"] = flat[(gi, "master")][a:a + n].reshape(p.shape).clone()
            state[i] = e
        sd["state"] = state
        sd["zoffload"] = {"format": _FORMAT, "kind": self._kind,
                          "scaler": self.scaler.state_dict() if self.scaler else None,
                          "loss_scale": self.loss_scale, "scaler_states": self._eb.scaler_states()}
        return sd

    def _fresh_state(self, i):
        """The state of a parameter that was never updated."""
        p = self._plist[i][1]
        return {nm: torch.zeros(p.shape) for nm in self._state_names}

    def save(self, root, name=None, keep_last=2):
        """Crash-safe checkpoint of the optimizer (masters, states, steps,
        hyperparameters, loss scaler) under directory `root` as `name`
        (default "step<N>"). A kill at any point leaves the previous
        checkpoint intact. Returns the name."""
        self._fence()
        self._write_back_live()
        step = self.param_groups[0].get("step", 0)
        name = name or "step%d" % step
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        self._eb.save(root, name, keep_last,
                      _jsonable({"format": _FORMAT, "kind": self._kind, "param_groups": groups}))
        return name

    def load(self, root, name=None):
        """Restore a checkpoint written by save() (default: the latest),
        verifying every checksum; the model parameters are set from the
        restored masters. Returns the checkpoint's name."""
        self._fence()
        user = self._eb.load(root, name) or {}
        if user.get("format") != _FORMAT or user.get("kind") != self._kind:
            raise ValueError("checkpoint %s was not written by %s" % (root, type(self).__name__))
        for g, sg in zip(self.param_groups, user["param_groups"]):
            for k, v in sg.items():
                g[k] = tuple(v) if isinstance(v, list) else v
        self._eb.refresh_steps()
        self._refresh_live()
        self._eb._set_hparams()
        return name or self._eb.latest(root)

    def close(self):
        """Finish pending work, remove the gradient hooks and free the engine.
        With process_group and delay_update the fence is collective (every
        rank closes together); the engine is freed even if it fails."""
        try:
            if getattr(self, "_eb", None) is not None and self._eb.engines:
                self._fence()
        finally:
            for h in self._hooks:
                (h[1] if isinstance(h, tuple) else h).remove()
            self._hooks = []
            if getattr(self, "_eb", None) is not None:
                self._eb.close()

    def __del__(self):
        try:
            for h in getattr(self, "_hooks", ()):
                (h[1] if isinstance(h, tuple) else h).remove()
        except Exception:  # interpreter shutdown
            pass


def _now():
    import time
    return time.perf_counter()


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.item() if x.numel() == 1 else x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _check_hparams(lr, eps=0.0, weight_decay=0.0, betas=None, beta_hi_open=True, **more):
    """torch.optim's checks, with its messages (NaN fails every one)."""
    if not 0.0 <= lr:
        raise ValueError("Invalid learning rate: {}".format(lr))
    if not 0.0 <= eps:
        raise ValueError("Invalid epsilon value: {}".format(eps))
    if not 0.0 <= weight_decay:
        raise ValueError("Invalid weight_decay value: {}".format(weight_decay))
    for k, v in more.items():
        if not 0.0 <= v:
            raise ValueError("Invalid {} value: {}".format(k, v))
    if betas is not None:
        for n, b in enumerate(betas):
            if not (0.0 <= b < 1.0 if beta_hi_open else 0.0 <= b <= 1.0):
                raise ValueError("Invalid beta parameter at index {}: {} (betas must be in [0, 1{})"
                                 .format(n, b, ")" if beta_hi_open else "]"))


class OffloadAdamW(OffloadOptimizer):
    """torch.optim.AdamW with masters and states offloaded (see the module
    documentation for the extra keyword arguments)."""

    _kind = "adamw"
    _zo_kind = _ca.ADAMW

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, bias_correction=True, **kw):
        _check_hparams(lr, eps, weight_decay, betas)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=bool(amsgrad),
                                      bias_correction=bool(bias_correction)), **kw)

    def _hparams(self, g, step):
        return _ca.hparams(self._zo_kind, lr=g["lr"], betas=g["betas"], eps=g["eps"],
                           weight_decay=g["weight_decay"],
                           bias_correction=1 if g.get("bias_correction", True) else 0, step=step)


class OffloadAdam(OffloadAdamW):
    """torch.optim.Adam (L2 weight decay) offloaded."""

    _kind = "adam"
    _zo_kind = _ca.ADAM

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, **kw):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, **kw)


class OffloadAdagrad(OffloadOptimizer):
    """torch.optim.Adagrad offloaded (lr_decay and initial_accumulator_value
    as torch's)."""

    _kind = "adagrad"
    _zo_kind = _ca.ADAGRAD
    _state_names = ("sum",)
    _eager_state = True

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, foreach=None, **kw):
        _check_hparams(lr, eps, weight_decay, lr_decay=lr_decay,
                       initial_accumulator_value=initial_accumulator_value)
        kw["foreach"] = foreach
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps), **kw)
        for i, (gi, _) in enumerate(self._plist):
            self._eb.fill_state(i, "sum", self.param_groups[gi]["initial_accumulator_value"])

    def _fresh_state(self, i):
        gi, p = self._plist[i]
        return {"sum": torch.full(p.shape, float(self.param_groups[gi]["initial_accumulator_value"]))}

    def _hparams(self, g, step):
        clr = g["lr"] / (1 + (step - 1) * g["lr_decay"])
        return _ca.hparams(_ca.ADAGRAD, lr=clr, eps=g["eps"], weight_decay=g["weight_decay"],
                           step=step)


class OffloadLion(OffloadOptimizer):
    """Lion (Chen et al. 2023) offloaded."""

    _kind = "lion"
    _zo_kind = _ca.LION
    _state_names = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **kw):
        _check_hparams(lr, 0.0, weight_decay, betas, beta_hi_open=False)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay), **kw)

    def _hparams(self, g, step):
        return _ca.hparams(_ca.LION, lr=g["lr"], betas=g["betas"], weight_decay=g["weight_decay"],
                           step=step)


def from_deepspeed_config(params, config):
    """An offload optimizer built from a DeepSpeed config (a path or a dict):
    "optimizer" {type, params}, "gradient_clipping", "fp16" (loss scaling)
    and "zero_optimization"."offload_optimizer" {device, pin_memory, ...},
    and zoffload's own "zoffload" {"state_dtype": "fp32"/"bf16"/"q8"/"q4",
    "state_block", "state_map_m", "state_map_v"}. Keys that do not apply to one device are ignored; unknown optimizer
    types and an unusable offload device raise ValueError."""
    if not isinstance(config, dict):
        with open(config) as f:
            config = json.load(f)
    o = config.get("optimizer", {"type": "AdamW", "params": {}})
    typ = str(o.get("type", "AdamW")).lower()
    hp = dict(o.get("params", {}))
    cls = {"adamw": OffloadAdamW, "adam": OffloadAdam, "adagrad": OffloadAdagrad,
           "lion": OffloadLion}.get(typ)
    if cls is None:
        raise ValueError("DeepSpeed optimizer type %r not supported (AdamW, Adam, Adagrad, Lion)"
                         % o.get("type"))
    if typ == "adam" and hp.pop("adam_w_mode", True):
        cls = OffloadAdamW          # DeepSpeed's "Adam" defaults to AdamW mode
    hp.pop("torch_adam", None)
    hp.pop("adam_w_mode", None)
    kw = {}
    if "betas" in hp:
        hp["betas"] = tuple(hp["betas"])
    clip = config.get("gradient_clipping", 0)
    if clip:
        kw["max_grad_norm"] = float(clip)
    fp16 = config.get("fp16", {})
    if fp16.get("enabled"):
        if fp16.get("loss_scale", 0):
            kw["loss_scale"] = LossScaler(scale=float(fp16["loss_scale"]))
        else:
            kw["loss_scale"] = LossScaler(
                initial_scale_power=int(fp16.get("initial_scale_power", 16)),
                window=int(fp16.get("loss_scale_window", 1000)),
                hysteresis=int(fp16.get("hysteresis", 2)),
                min_scale=float(fp16.get("min_loss_scale", 1)),
                consecutive_hysteresis=bool(fp16.get("consecutive_hysteresis", False)))
    z = config.get("zero_optimization", {})
    off = z.get("offload_optimizer", {})
    dev = off.get("device", "cpu")
    if dev not in ("cpu", "nvme", "none"):
        raise ValueError("offload_optimizer.device %r: cpu or nvme" % dev)
    kw["offload_device"] = "cpu" if dev == "none" else dev
    if dev == "nvme":
        kw["nvme_path"] = off.get("nvme_path")
    if z.get("delay_update") or off.get("delay_update"):
        kw["delay_update"] = True
    # zoffload's own keys (docs/optim-config.md): the state type of m and v
    zo = config.get("zoffload", {})
    if "state_dtype" in zo:
        sd = str(zo["state_dtype"]).lower()
        states = {"fp32": torch.float32, "f32": torch.float32, "bf16": torch.bfloat16, "q8": "q8", "q4": "q4"}
        if sd not in states:
            raise ValueError("zoffload.state_dtype %r: fp32, bf16, q8 or q4" % (zo["state_dtype"],))
        kw["state_dtype"] = states[sd]
    if zo.get("state_block"):
        kw["state_block"] = int(zo["state_block"])
    # the code maps of q8/q4 moments (names as in JSON: the optimizer checks them)
    for k in ("state_map_m", "state_map_v"):
        if zo.get(k) is not None:
            kw[k] = str(zo[k])
    return cls(params, **hp, **kw)

