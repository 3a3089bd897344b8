# SPDX-License-Identifier: Apache-2.0
"""The offload optimizer engine (optim.h, ``zo_optim``) from Python.

:class:`Engine` owns a ``zo_optim``: fp32 masters and states in pinned host
memory or on NVMe, fp32 gradient accumulators, the fused step, DPU, loss
scaling, clipping, crash-safe save/load. From Python the framework hands
gradients over from host memory (:meth:`Engine.grad_host`) and copies the
new parameters from the engine's parameter buffers
(:meth:`Engine.param_buffer`), so any framework tensor works, on any
device; zoffload.torch builds OffloadAdamW on it.

Example (numpy, host backend)::

    import numpy as np
    from zoffload.optim import Engine
    e = Engine([{"numel": [1000, 10]}], param_dtype="f32", kind="adamw", lr=1e-3)
    e.import_state(0, "master", np.random.rand(1000).astype(np.float32))
    e.import_state(1, "master", np.zeros(10, np.float32))  # every tensor's, before a step
    e.grad_host(0, np.ones(1000, np.float32))
    res = e.step()
"""

import ctypes
import errno

from . import _lib
from ._lib import lib, check, c_int, c_uint, c_size_t, c_double, c_u64, c_i64, c_void_p, c_char_p, P
from . import arrays
from . import cpuadam as _ca

PLACE_DEFAULT, PLACE_HOST, PLACE_NVME = -1, 0, 1
PLACEMENTS = {"default": PLACE_DEFAULT, "cpu": PLACE_HOST, "host": PLACE_HOST, "nvme": PLACE_NVME}
CLIP_TWO_PASS, CLIP_SPECULATIVE = 0, 1
NONFINITE_ERROR, NONFINITE_SKIP = 0, 1
NO_GRAD_ZERO, NO_GRAD_SKIP = 0, 1
STATE_MASTER, STATE_EXP_AVG, STATE_EXP_AVG_SQ = 0, 1, 2
STATES = {"master": STATE_MASTER, "exp_avg": STATE_EXP_AVG, "exp_avg_sq": STATE_EXP_AVG_SQ,
          "sum": STATE_EXP_AVG_SQ}
ZO_DTYPE_COUNT = 6
# block-wise quantized moments (zo_optim_group.state_bits): q8 and q4
QSTATES = {"q8": 8, "q4": 4}
# their code maps (zo_qmap; zo_optim_config.state_map_m / state_map_v, JSON's
# names): m is signed, v unsigned ("_nz": without a zero). QMAP_DEFAULT
# (ZO_QMAP_COUNT): the per-width default, dynamic m, v dynamic (q8) or
# dynamic_nz (q4)
QMAPS_M = {"dynamic": 0, "linear": 2}
QMAPS_V = {"dynamic": 1, "linear": 3, "dynamic_nz": 4, "linear_nz": 5}
QMAP_DEFAULT = 6


def qmap_id(which, v):
    """The zo_qmap id of a state_map_m (which "m") or state_map_v ("v")
    value: a name of QMAPS_M / QMAPS_V (any case), an int (passed on: the
    engine checks it), or None: QMAP_DEFAULT. Other names: ValueError."""
    if v is None:
        return QMAP_DEFAULT
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    names = QMAPS_M if which == "m" else QMAPS_V
    if isinstance(v, str) and v.lower() in names:
        return names[v.lower()]
    raise ValueError("state_map_%s %r: one of %s (or a zo_qmap id)" % (which, v, ", ".join(names)))
_DT = {"f32": arrays.F32, "float32": arrays.F32, "f16": arrays.F16, "float16": arrays.F16,
       "bf16": arrays.BF16, "bfloat16": arrays.BF16}


def _dtype(x):
    if isinstance(x, int):
        return x
    s = str(x).replace("torch.", "")
    if s not in _DT:
        raise TypeError("dtype %r: f32, f16 or bf16" % (x,))
    return _DT[s]


class OptimGroup(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("ntensors", c_uint), ("numel", P(c_u64)),
                ("names", P(c_char_p)), ("dev_params", P(c_void_p)),
                ("hparams", P(_lib.CpuadamHparams)), ("placement", c_int),
                ("sub_group_size", c_u64), ("state_dtype", c_int),
                # in the C struct's former tail padding (optim.h): sizeof unchanged
                ("state_bits", ctypes.c_uint16), ("state_block", ctypes.c_uint16)]


class OptimConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t),
                ("dev", c_void_p), ("param_dtype", c_int), ("grad_dtype", c_int),
                ("groups", P(OptimGroup)), ("ngroups", c_uint), ("hparams", _lib.CpuadamHparams),
                ("placement", c_int), ("nvme_path", c_char_p), ("pin_memory", c_int),
                ("buffer_count", c_uint), ("sub_group_size", c_u64), ("pinned_bytes", c_u64),
                ("grad_staging_bytes", c_size_t),
                ("aio_block_size", c_size_t), ("aio_queue_depth", c_uint), ("aio_threads", c_uint),
                ("aio_single_submit", c_int), ("aio_overlap_events", c_int), ("swap", c_void_p),
                ("loss_scale", c_double), ("initial_scale_power", c_int),
                ("loss_scale_window", c_uint), ("hysteresis", c_uint),
                ("consecutive_hysteresis", c_int), ("min_loss_scale", c_double),
                ("max_grad_norm", c_double), ("grad_accum_steps", c_uint), ("clip_mode", c_int),
                ("nonfinite", c_int), ("dpu", c_int), ("dpu_warmup_steps", c_uint),
                ("nthreads", c_int), ("numa_node", c_int), ("dpu_double_buffer", c_int),
                ("no_grad", c_int),
                # appended later (optim.h): the code maps of quantized moments
                ("state_map_m", c_int), ("state_map_v", c_int)]


class OptimStepOpts(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("global_sumsq", c_double),
                ("global_nonfinite", c_int)]


# Output structs start with struct_size, which the caller sets (_out()).
class OptimStepResult(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("step", c_i64), ("boundary", c_int), ("skipped", c_int), ("clipped", c_int),
                ("rolled_back", c_int), ("grad_norm", c_double), ("clip_coef", c_double),
                ("loss_scale", c_double), ("nonfinite", c_u64)]


class OptimInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("step", c_i64), ("micro_steps", c_u64), ("skipped_steps", c_u64),
                ("rollbacks", c_u64), ("loss_scale", c_double), ("ntensors", c_uint),
                ("ngroups", c_uint), ("nsubgroups", c_uint), ("numel", c_u64),
                ("pinned_bytes", c_u64), ("host_bytes", c_u64), ("dpu_active", c_int),
                ("eager_subgroups", c_u64), ("updates_done", c_u64), ("nvme_read_bytes_total", c_u64),
                ("nvme_write_bytes_total", c_u64), ("grad_buffer_bytes", c_u64),
                ("grad_buffer_dtype", c_int), ("grad_windows_pinned", c_uint),
                ("grad_direct_bytes_total", c_u64)]


class OptimTimeline(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("step", c_i64), ("total_ns", c_u64), ("d2h_ns", c_u64), ("d2h_bytes", c_u64),
                ("norm_ns", c_u64), ("compute_ns", c_u64), ("nvme_read_ns", c_u64),
                ("nvme_read_bytes", c_u64), ("nvme_write_ns", c_u64),
                ("nvme_write_bytes", c_u64), ("h2d_ns", c_u64), ("h2d_bytes", c_u64),
                ("stall_ns", c_u64), ("update_ns", c_u64)]


class OptimFootprint(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("numel", c_u64), ("nsubgroups", c_uint), ("pool_slots", c_uint),
                ("pool_slot_bytes", c_u64), ("host_state_bytes", c_u64), ("nvme_state_bytes", c_u64),
                ("staging_bytes", c_u64), ("param_buffer_bytes", c_u64), ("grad_window_bytes", c_u64),
                ("grad_window_dtype", c_int), ("pinned_min_bytes", c_u64), ("pinned_bytes", c_u64),
                ("host_bytes", c_u64), ("device_bytes", c_u64)]


class OptimScalerState(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("dynamic", c_int), ("scale", c_double), ("cur_iter", c_i64),
                ("last_overflow_iter", c_i64), ("cur_hysteresis", c_uint)]


class OptimQstateInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("group", c_uint), ("offset", c_u64), ("numel", c_u64),
                ("bits", c_int), ("block", ctypes.c_uint32), ("code_bytes", c_u64), ("nscales", c_u64),
                ("map", ctypes.c_int32 * 3)]


_SIZED = {
    "zo_optim_group": (OptimGroup, "zo_optim_group_default", ()),
    "zo_optim_config": (OptimConfig, "zo_optim_config_default", ()),
    "zo_optim_step_opts": (OptimStepOpts, "zo_optim_step_opts_default", ()),
}

_lib.C_STRUCTS.update({k: v[0] for k, v in _SIZED.items()})
_lib.C_STRUCTS.update({"zo_optim_step_result": OptimStepResult, "zo_optim_info": OptimInfo,
                       "zo_optim_timeline": OptimTimeline, "zo_optim_scaler_state": OptimScalerState,
                       "zo_optim_footprint": OptimFootprint, "zo_optim_qstate_info": OptimQstateInfo})

_declared = False


def _out(cls):
    """An output struct with struct_size set to our version's size (the
    library fills what fits; slack behind it as _lib.out_struct gives)."""
    r = _lib.out_struct(cls)
    r.struct_size = ctypes.sizeof(cls)
    return r


def _fields(r):
    return {f: getattr(r, f) for f, _ in type(r)._fields_ if f != "struct_size"}


def available():
    """Whether the loaded library has the zo_optim engine's entry points."""
    return lib.has("zo_optim_create")


def _declare():
    global _declared
    if _declared:
        return
    if not available():
        raise _lib._errors.LibraryNotFound(
            "%s has no zo_optim engine (built before optim.h)" % lib.path)
    d = lib.declare
    d("zo_optim_group_default", None, [c_void_p])
    d("zo_optim_config_default", None, [c_void_p])
    d("zo_optim_step_opts_default", None, [c_void_p])
    d("zo_optim_create", c_int, [P(c_void_p), P(OptimConfig)])
    d("zo_optim_destroy", None, [P(c_void_p)])
    d("zo_optim_errmsg", c_char_p, [c_void_p])
    d("zo_optim_tensor_count", c_uint, [c_void_p])
    d("zo_optim_tensor_index", c_int, [c_void_p, c_char_p, P(c_uint)])
    d("zo_optim_tensor_get", c_int, [c_void_p, c_uint, P(c_u64), P(c_uint), P(c_char_p)])
    d("zo_optim_init_from_device", c_int, [c_void_p])
    d("zo_optim_state_export", c_int, [c_void_p, c_uint, c_int, c_void_p, c_int, c_u64, c_u64])
    d("zo_optim_state_import", c_int, [c_void_p, c_uint, c_int, c_void_p, c_int, c_u64, c_u64])
    d("zo_optim_push_params", c_int, [c_void_p])
    d("zo_optim_grad_host", c_int, [c_void_p, c_uint, c_void_p, c_int])
    d("zo_optim_grads_done", c_int, [c_void_p])
    d("zo_optim_grad_norm_partial", c_int, [c_void_p, P(c_double), P(c_u64)])
    d("zo_optim_step_async", c_int, [c_void_p, P(OptimStepOpts)])
    d("zo_optim_wait", c_int, [c_void_p, P(OptimStepResult)])
    d("zo_optim_step", c_int, [c_void_p, P(OptimStepOpts), P(OptimStepResult)])
    d("zo_optim_poll", c_int, [c_void_p])
    d("zo_optim_params_current", c_int, [c_void_p])
    d("zo_optim_set_lr", c_int, [c_void_p, c_uint, c_double])
    d("zo_optim_set_hparams", c_int, [c_void_p, c_uint, P(_lib.CpuadamHparams)])
    d("zo_optim_param_buffer", c_int, [c_void_p, c_uint, P(c_void_p)])
    d("zo_optim_save", c_int, [c_void_p, c_char_p, c_char_p, c_uint, c_char_p])
    d("zo_optim_load", c_int, [c_void_p, c_char_p, c_char_p, ctypes.c_char_p, c_size_t])
    d("zo_optim_get_info", c_int, [c_void_p, P(OptimInfo)])
    d("zo_optim_get_timeline", c_int, [c_void_p, P(OptimTimeline)])
    d("zo_optim_timeline_json", c_int, [c_void_p, ctypes.c_char_p, c_size_t])
    if lib.has("zo_optim_last_result"):
        d("zo_optim_last_result", c_int, [c_void_p, P(OptimStepResult)])
    if lib.has("zo_optim_set_step"):
        d("zo_optim_set_step", c_int, [c_void_p, c_i64])
    if lib.has("zo_optim_discard_grads"):
        d("zo_optim_discard_grads", c_int, [c_void_p])
    if lib.has("zo_optim_set_dev_param"):
        d("zo_optim_set_dev_param", c_int, [c_void_p, c_uint, c_void_p])
    if lib.has("zo_optim_tensor_step"):
        d("zo_optim_tensor_step", c_int, [c_void_p, c_uint, P(c_i64)])
        d("zo_optim_set_tensor_step", c_int, [c_void_p, c_uint, c_i64])
    if lib.has("zo_optim_config_from_json"):
        d("zo_optim_config_from_json", c_int, [P(OptimConfig), c_char_p])
    d("zo_optim_get_scaler", c_int, [c_void_p, P(OptimScalerState)])
    if lib.has("zo_optim_estimate"):
        d("zo_optim_estimate", c_int, [P(OptimConfig), c_int, P(OptimFootprint)])
    d("zo_optim_set_scaler", c_int, [c_void_p, P(OptimScalerState)])
    if lib.has("zo_optim_qstate_export"):
        d("zo_optim_get_qstate_info", c_int, [c_void_p, c_uint, P(OptimQstateInfo)])
        d("zo_optim_qstate_export", c_int, [c_void_p, c_uint, c_int, c_void_p, c_u64, c_void_p, c_u64])
        d("zo_optim_qstate_import", c_int, [c_void_p, c_uint, c_int, c_void_p, c_u64, c_void_p, c_u64])
    if lib.has("zo_cpuadam_qmap_values"):
        d("zo_cpuadam_qmap_values", c_int, [c_int, c_int, c_void_p])
    _lib.SIZED_STRUCTS.update(_SIZED)
    _declared = True


class Device(_lib.SharedHandle):
    """A ``zo_dev`` (the host backend by default: "device memory" is host
    memory, the reference every backend is tested against). Closing it is
    deferred while an engine or a store over it is open."""

    _destroy = "zo_dev_close"
    _what = "device"

    def __init__(self, kind="host", ordinal=0):
        cfg = _lib.new_struct("zo_dev_config")
        k = c_int()
        check(lib.zo_dev_kind_parse(str(kind).encode(), ctypes.byref(k)), "zo_dev_kind_parse")
        cfg.kind = k.value
        cfg.ordinal = int(ordinal)
        self._h = c_void_p()
        check(lib.zo_dev_open(ctypes.byref(self._h), ctypes.byref(cfg)), "zo_dev_open")
        self.kind = kind

    @property
    def handle(self):
        return self._live()


def _result(r):
    return _fields(r)


def _config(groups, dev_handle, kind, kw, who):
    """The zo_optim_config of Engine's arguments (see Engine), with the
    arrays it points at (keep them alive until the C call has read them),
    the tensors' element counts and the optimizer kind."""
    kw = dict(kw)
    cfg = _lib.new_struct("zo_optim_config")
    hp_keys = ("lr", "betas", "beta1", "beta2", "eps", "weight_decay", "bias_correction")
    hp_kw = {k: kw.pop(k) for k in list(kw) if k in hp_keys}
    kind_c = _ca.kind_of(kind)
    cfg.hparams = _ca.hparams(kind_c, **hp_kw)
    cfg.dev = dev_handle
    keep = []
    if kw.get("param_dtype") is None:
        # the engine writes params of this dtype: no default, a wrong
        # guess (bf16 into fp32 tensors) would go unnoticed
        raise TypeError(who + ": param_dtype is required (\"f32\", \"bf16\" or \"f16\": the dtype of the "
                        "parameters the engine writes)")
    for k, v in kw.items():
        if k in ("param_dtype", "grad_dtype"):
            v = ZO_DTYPE_COUNT if v is None else _dtype(v)
        elif k == "placement":
            v = PLACEMENTS[v] if isinstance(v, str) else int(v)
        elif k == "nvme_path":
            v = None if v is None else str(v).encode()
            keep.append(v)
        elif k == "clip_mode" and isinstance(v, str):
            v = {"two_pass": CLIP_TWO_PASS, "speculative": CLIP_SPECULATIVE}[v]
        elif k == "nonfinite" and isinstance(v, str):
            v = {"error": NONFINITE_ERROR, "skip": NONFINITE_SKIP}[v]
        elif k == "no_grad" and isinstance(v, str):
            v = {"zero": NO_GRAD_ZERO, "skip": NO_GRAD_SKIP}[v]
        elif k in ("state_map_m", "state_map_v"):
            v = qmap_id(k[-1], v)
        elif k in ("dev", "groups", "ngroups", "hparams", "struct_size", "swap"):
            raise TypeError(who + ": %r is set by the bindings" % k)
        if not hasattr(cfg, k) or k.startswith("_"):
            raise TypeError(who + ": unknown config field %r" % k)
        if isinstance(v, bool):
            v = int(v)
        setattr(cfg, k, v)
    garr = (OptimGroup * len(groups))()
    all_numel = []
    for gi, g in enumerate(groups):
        g = dict(g)
        grp = _lib.new_struct("zo_optim_group")
        numel = [int(n) for n in g.pop("numel")]
        all_numel.extend(numel)
        arr = (c_u64 * len(numel))(*numel)
        grp.ntensors = len(numel)
        grp.numel = arr
        keep.append(arr)
        names = g.pop("names", None)
        if names is not None:
            enc = [str(n).encode() for n in names]
            narr = (c_char_p * len(enc))(*enc)
            grp.names = narr
            keep.extend([enc, narr])
        ghp = {k: g.pop(k) for k in list(g) if k in hp_keys}
        gkind = g.pop("kind", None)
        if ghp or gkind is not None:
            base = {"lr": cfg.hparams.lr, "beta1": cfg.hparams.beta1,
                    "beta2": cfg.hparams.beta2, "eps": cfg.hparams.eps,
                    "weight_decay": cfg.hparams.weight_decay,
                    "bias_correction": cfg.hparams.bias_correction}
            if gkind is not None and _ca.kind_of(gkind) != kind_c:
                base = {}
            base.update(ghp)
            h = _ca.hparams(gkind if gkind is not None else kind_c, **base)
            grp.hparams = ctypes.pointer(h)
            keep.append(h)
        if "placement" in g:
            p = g.pop("placement")
            grp.placement = PLACEMENTS[p] if isinstance(p, str) else int(p)
        if "sub_group_size" in g:
            grp.sub_group_size = int(g.pop("sub_group_size"))
        if "state_dtype" in g:
            sd = g.pop("state_dtype")
            if isinstance(sd, str) and sd in QSTATES:
                # quantized moments: computed in fp32, stored as codes + absmax
                grp.state_dtype = arrays.F32
                grp.state_bits = QSTATES[sd]
            else:
                grp.state_dtype = _dtype(sd)
        if "state_bits" in g:
            grp.state_bits = int(g.pop("state_bits"))
        if "state_block" in g:
            b = g.pop("state_block")
            grp.state_block = 0 if b is None else int(b)
        dp = g.pop("dev_params", None)
        if dp is not None:
            # device (host backend: host) addresses of the tensors' params;
            # the engine writes the new params there itself
            if len(dp) != len(numel) or not all(dp):
                raise ValueError(who + ": group %d dev_params needs one non-NULL address per tensor" % gi)
            darr = (c_void_p * len(dp))(*[int(a) for a in dp])
            grp.dev_params = darr
            keep.append(darr)
        if g:
            raise TypeError(who + ": unknown group keys %s" % sorted(g))
        garr[gi] = grp
    cfg.groups = garr
    cfg.ngroups = len(groups)
    keep.append(garr)
    return cfg, keep, all_numel, kind_c


def estimate(groups, device=None, kind="adamw", backend=None, **kw):
    """What ``Engine(groups, device, kind, **kw)`` would allocate, without
    allocating it (``zo_optim_estimate``; the library's own sizes, the same
    checks as the engine's create). Returns a dict of zo_optim_footprint's
    fields: numel, nsubgroups, pool_slots, pool_slot_bytes,
    host_state_bytes, nvme_state_bytes, staging_bytes, param_buffer_bytes,
    grad_window_bytes, grad_window_dtype (a name), pinned_min_bytes,
    pinned_bytes, host_bytes (pinned and pageable memory right after
    create), device_bytes. `backend` ("host" or "cuda") plans for a backend
    without a device; otherwise `device`'s (default: the host backend).
    A group's dev_params are not read, only whether it has them."""
    _declare()
    if not lib.has("zo_optim_estimate"):
        raise _lib._errors.LibraryNotFound("%s has no zo_optim_estimate (built before it)" % lib.path)
    if backend is not None and backend not in ("host", "cuda"):
        raise ValueError("estimate: backend %r (\"host\" or \"cuda\")" % (backend,))
    kind_arg = {"host": 0, "cuda": 1}.get(backend, 0)
    cfg, keep, _, _ = _config(groups, device.handle if device is not None and backend is None else None, kind,
                              kw, "estimate")
    out = _out(OptimFootprint)
    check(lib.zo_optim_estimate(ctypes.byref(cfg), kind_arg, ctypes.byref(out)), "zo_optim_estimate")
    del keep
    d = _fields(out)
    d["grad_window_dtype"] = arrays.DTYPE_NAMES.get(d["grad_window_dtype"], d["grad_window_dtype"])
    return d


def qmap_values(map_id, bits):
    """The fp32 values of code map `map_id` (a zo_qmap) at `bits` (8 or 4):
    a list of 256 or 16 floats (zo_cpuadam_qmap_values)."""
    _declare()
    n = 1 << int(bits)
    buf = (ctypes.c_float * 256)()
    check(lib.zo_cpuadam_qmap_values(int(map_id), int(bits), ctypes.cast(buf, c_void_p)),
          "zo_cpuadam_qmap_values")
    return [buf[i] for i in range(n)]


class Engine(_lib.Handle):
    """A ``zo_optim`` engine.

    groups: list of dicts, one per parameter group:
        numel (list of element counts, required), names (list or None),
        kind/lr/betas/eps/weight_decay/bias_correction (hyperparameters;
        missing ones from the engine-wide ones), placement ("cpu"/"nvme"),
        sub_group_size, state_dtype ("f32"/"bf16", or "q8"/"q4": m and v
        block-wise quantized, see docs/optim.md "Quantized states"),
        state_block (elements per absmax scale with q8/q4: a power of two in
        [64, 4096]; 0 or None: 256 for q8, 128 for q4), state_bits (0, 8 or
        4: the raw field; "q8"/"q4" set it), dev_params (one device
        address per tensor, e.g. ``tensor.data_ptr()``: the engine reads the
        initial params there and writes the new ones; the memory must stay
        valid and in place while the engine lives).
    Engine-wide keywords: every zo_optim_config field by name
    (param_dtype, grad_dtype, placement, nvme_path, pin_memory,
    buffer_count, sub_group_size, pinned_bytes, grad_staging_bytes,
    loss_scale, initial_scale_power, loss_scale_window, hysteresis,
    consecutive_hysteresis, min_loss_scale, max_grad_norm, grad_accum_steps,
    clip_mode, nonfinite, dpu, dpu_warmup_steps, nthreads, numa_node,
    dpu_double_buffer, no_grad: "zero" or "skip", state_map_m: "dynamic" or
    "linear", state_map_v: "dynamic", "dynamic_nz", "linear" or "linear_nz"
    (the code maps of every q8/q4 group's m and v, or zo_qmap ids; None:
    the default; see optim.h), and
    the default hyperparameters (kind, lr, betas, eps, weight_decay,
    bias_correction). `device` is a :class:`Device` (default: a host one).
    """

    _destroy = "zo_optim_destroy"
    _what = "zo_optim engine"

    def __init__(self, groups, device=None, kind="adamw", **kw):
        _declare()
        self._dev = device if device is not None else Device("host")
        cfg, self._keep, self.numel, self._kind = _config(groups, self._dev.handle, kind, kw, "Engine")
        self.param_dtype = cfg.param_dtype
        self._h = c_void_p()
        check(lib.zo_optim_create(ctypes.byref(self._h), ctypes.byref(cfg)), "zo_optim_create")
        self._dev._users += 1
        self._keep = None  # the arrays were read during create only

    # -------------------------------------------------------------- helpers
    def _msg(self):
        return lib.zo_optim_errmsg(self._h).decode(errors="replace") if self._h else ""

    def _c(self, rc, fn):
        return check(rc, fn, self._msg)

    def close(self):
        """Destroy the engine (waits for a step in flight), then let go of
        its device (closed now if it was closed, or collected, meanwhile)."""
        if self._h:
            super().close()
            self._dev._release()

    # -------------------------------------------------------------- tensors
    def __len__(self):
        return lib.zo_optim_tensor_count(self._live())

    def index(self, name):
        i = c_uint()
        self._c(lib.zo_optim_tensor_index(self._live(), str(name).encode(), ctypes.byref(i)),
                "zo_optim_tensor_index")
        return i.value

    def tensor(self, i):
        """(numel, group, name) of tensor i."""
        n, g, nm = c_u64(), c_uint(), c_char_p()
        self._c(lib.zo_optim_tensor_get(self._live(), int(i), ctypes.byref(n), ctypes.byref(g),
                                        ctypes.byref(nm)), "zo_optim_tensor_get")
        return n.value, g.value, nm.value.decode()

    # -------------------------------------------------------------- state
    def export_state(self, i, which, out, off=0):
        """Copy a state ("master", "exp_avg", "exp_avg_sq"/"sum") of tensor i,
        elements [off, off + out.size), into `out` (f32/bf16/f16, host)."""
        v = arrays.view(out, "out", dtypes=(arrays.F32, arrays.BF16, arrays.F16), writable=True)
        self._c(lib.zo_optim_state_export(self._live(), int(i), STATES[which], v.ptr, v.dtype,
                                          int(off), v.n), "zo_optim_state_export")
        return out

    def import_state(self, i, which, src, off=0):
        """Copy `src` into a state of tensor i at element `off`."""
        v = arrays.view(src, "src", dtypes=(arrays.F32, arrays.BF16, arrays.F16))
        self._c(lib.zo_optim_state_import(self._live(), int(i), STATES[which], v.ptr, v.dtype,
                                          int(off), v.n), "zo_optim_state_import")

    # ------------------------------------------------- raw quantized states
    def _need_qstate(self):
        if not lib.has("zo_optim_qstate_export"):
            raise _lib._errors.LibraryNotFound("%s has no zo_optim_qstate_export (built before it)" % lib.path)

    def qstate_info(self, k):
        """Sub-group k (0 .. info()["nsubgroups"] - 1) as zo_optim_qstate_info
        describes it: group, offset (its first element in the group's flat
        space), numel, bits (8, 4; 0: the group's states are not
        quantized), block, code_bytes and nscales (of one state), and maps:
        {"exp_avg": zo_qmap id, "exp_avg_sq": id or None}."""
        self._need_qstate()
        out = _out(OptimQstateInfo)
        self._c(lib.zo_optim_get_qstate_info(self._live(), int(k), ctypes.byref(out)), "zo_optim_get_qstate_info")
        d = _fields(out)
        m = list(d.pop("map"))
        d["maps"] = {"exp_avg": m[STATE_EXP_AVG] if m[STATE_EXP_AVG] >= 0 else None,
                     "exp_avg_sq": m[STATE_EXP_AVG_SQ] if m[STATE_EXP_AVG_SQ] >= 0 else None}
        return d

    def qstate_export(self, k, which, codes, absmax):
        """Sub-group k's quantized state `which` ("exp_avg", "exp_avg_sq") as
        stored: `codes` (uint8, code_bytes) and `absmax` (f32, nscales)
        are filled (numpy arrays or CPU tensors); returns them."""
        self._need_qstate()
        c = arrays.view(codes, "codes", dtypes=(arrays.U8,), writable=True)
        a = arrays.view(absmax, "absmax", dtypes=(arrays.F32,), writable=True)
        self._c(lib.zo_optim_qstate_export(self._live(), int(k), STATES[which], c.ptr, c.n, a.ptr, a.n),
                "zo_optim_qstate_export")
        return codes, absmax

    def qstate_import(self, k, which, codes, absmax):
        """Store `codes` and `absmax` as sub-group k's state `which`, bit for
        bit (what qstate_export gave)."""
        self._need_qstate()
        c = arrays.view(codes, "codes", dtypes=(arrays.U8,))
        a = arrays.view(absmax, "absmax", dtypes=(arrays.F32,))
        self._c(lib.zo_optim_qstate_import(self._live(), int(k), STATES[which], c.ptr, c.n, a.ptr, a.n),
                "zo_optim_qstate_import")

    def init_from_device(self):
        """Masters from the dev_params (widened), states zeroed."""
        self._c(lib.zo_optim_init_from_device(self._live()), "zo_optim_init_from_device")

    def push_params(self):
        self._c(lib.zo_optim_push_params(self._live()), "zo_optim_push_params")

    def set_dev_param(self, i, addr):
        """Tensor i's device params moved to `addr` (same numel and dtype):
        the engine writes and reads them there from now on
        (zo_optim_set_dev_param; between updates only)."""
        if not lib.has("zo_optim_set_dev_param"):
            raise _lib._errors.LibraryNotFound("%s has no zo_optim_set_dev_param (built before it)" % lib.path)
        self._c(lib.zo_optim_set_dev_param(self._live(), int(i), c_void_p(int(addr))), "zo_optim_set_dev_param")

    # -------------------------------------------------------------- gradients
    def grad_host(self, i, grad):
        """Accumulate the host gradient of tensor i (f32/bf16/f16, numel
        elements), synchronously."""
        v = arrays.view(grad, "grad", dtypes=(arrays.F32, arrays.BF16, arrays.F16))
        if v.n != self.numel[i]:
            raise ValueError("grad of tensor %d has %d elements, the tensor %d"
                             % (i, v.n, self.numel[i]))
        self._c(lib.zo_optim_grad_host(self._live(), int(i), v.ptr, v.dtype), "zo_optim_grad_host")

    def can_discard_grads(self):
        """Whether this library can drop an accumulation window (zo_optim_discard_grads)."""
        return lib.has("zo_optim_discard_grads")

    def discard_grads(self):
        """Forget every gradient handed over since the last boundary."""
        if not self.can_discard_grads():
            raise _lib._errors.NotSupported(
                _lib._errors.ZO_ENOTSUP, "zo_optim_discard_grads", "not supported",
                "this libzoffload has no zo_optim_discard_grads: gradients handed over cannot be "
                "dropped before the step applies them")
        self._c(lib.zo_optim_discard_grads(self._live()), "zo_optim_discard_grads")

    def grads_done(self):
        self._c(lib.zo_optim_grads_done(self._live()), "zo_optim_grads_done")

    def grad_norm_partial(self):
        """(sum of squares of the accumulated, still scaled, gradients, inf/NaN count)."""
        s, n = c_double(), c_u64()
        self._c(lib.zo_optim_grad_norm_partial(self._live(), ctypes.byref(s), ctypes.byref(n)),
                "zo_optim_grad_norm_partial")
        return s.value, n.value

    # -------------------------------------------------------------- step
    def _opts(self, global_sumsq, global_nonfinite):
        o = _lib.new_struct("zo_optim_step_opts")
        if global_sumsq is not None:
            o.global_sumsq = float(global_sumsq)
        if global_nonfinite is not None:
            o.global_nonfinite = 1 if global_nonfinite else 0
        return o

    def step_async(self, global_sumsq=None, global_nonfinite=None):
        o = self._opts(global_sumsq, global_nonfinite)
        self._c(lib.zo_optim_step_async(self._live(), ctypes.byref(o)), "zo_optim_step_async")

    def wait(self):
        """Wait for the step in flight; its result as a dict (step, boundary,
        skipped, clipped, rolled_back, grad_norm, clip_coef, loss_scale, nonfinite)."""
        r = _out(OptimStepResult)
        self._c(lib.zo_optim_wait(self._live(), ctypes.byref(r)), "zo_optim_wait")
        return _result(r)

    def last_result(self):
        """The result of the latest collected boundary (zo_optim_last_result:
        also a DPU warm-up boundary's, which zo_optim_step_async collects
        itself), or None before the first (or in a library without it)."""
        if not lib.has("zo_optim_last_result"):
            return None
        r = _out(OptimStepResult)
        rc = lib.zo_optim_last_result(self._live(), ctypes.byref(r))
        if rc == -errno.ENOENT:
            return None
        self._c(rc, "zo_optim_last_result")
        return _result(r)

    def step(self, global_sumsq=None, global_nonfinite=None):
        o = self._opts(global_sumsq, global_nonfinite)
        r = _out(OptimStepResult)
        self._c(lib.zo_optim_step(self._live(), ctypes.byref(o), ctypes.byref(r)), "zo_optim_step")
        return _result(r)

    def poll(self):
        """True while a step is in flight."""
        rc = lib.zo_optim_poll(self._live())
        if rc == 1:
            return True
        self._c(rc, "zo_optim_poll")
        return False

    def params_current(self):
        return bool(self._c(lib.zo_optim_params_current(self._live()), "zo_optim_params_current"))

    def set_lr(self, group, lr):
        self._c(lib.zo_optim_set_lr(self._live(), int(group), float(lr)), "zo_optim_set_lr")

    def set_hparams(self, group, hp=None, kind=None, **kw):
        """Replace group's hyperparameters: an CpuadamHparams (from
        zoffload.cpuadam.hparams()) or keywords as hparams() takes."""
        h = hp if hp is not None else _ca.hparams(self._kind if kind is None else kind, **kw)
        self._c(lib.zo_optim_set_hparams(self._live(), int(group), ctypes.byref(h)),
                "zo_optim_set_hparams")

    def can_set_step(self):
        """Whether this library lets the step count be set (zo_optim_set_step),
        which restoring from a framework state dict needs."""
        return lib.has("zo_optim_set_step")

    def set_step(self, step):
        """Set the number of updates applied (bias correction continues from it)."""
        if not self.can_set_step():
            raise _lib._errors.NotSupported(
                _lib._errors.ZO_ENOTSUP, "zo_optim_set_step", "not supported",
                "this libzoffload has no zo_optim_set_step: a state dict's step count cannot be "
                "given to the engine (zo_optim_load restores it from an engine checkpoint)")
        self._c(lib.zo_optim_set_step(self._live(), int(step)), "zo_optim_set_step")

    def scaler_state(self):
        """The loss scaler's state (dict: dynamic, scale, cur_iter,
        last_overflow_iter, cur_hysteresis), what a state dict carries."""
        st = _out(OptimScalerState)
        self._c(lib.zo_optim_get_scaler(self._live(), ctypes.byref(st)), "zo_optim_get_scaler")
        return _fields(st)

    def set_scaler_state(self, state):
        """Restore scaler_state()'s dict: between boundaries, with nothing
        handed over in the current window."""
        st = OptimScalerState(struct_size=ctypes.sizeof(OptimScalerState), dynamic=int(state["dynamic"]),
                              scale=float(state["scale"]), cur_iter=int(state["cur_iter"]),
                              last_overflow_iter=int(state["last_overflow_iter"]),
                              cur_hysteresis=int(state["cur_hysteresis"]))
        self._c(lib.zo_optim_set_scaler(self._live(), ctypes.byref(st)), "zo_optim_set_scaler")

    def tensor_step(self, i):
        """Updates applied to tensor i (its own count with no_grad="skip")."""
        s = c_i64()
        self._c(lib.zo_optim_tensor_step(self._live(), int(i), ctypes.byref(s)), "zo_optim_tensor_step")
        return s.value

    def set_tensor_step(self, i, step):
        """Set tensor i's update count (no_grad="skip")."""
        self._c(lib.zo_optim_set_tensor_step(self._live(), int(i), int(step)), "zo_optim_set_tensor_step")

    def param_buffer(self, i, like="numpy"):
        """The engine's buffer of tensor i's latest parameters in param_dtype,
        as a zero-copy numpy array (bf16 as uint16) or CPU torch tensor. It
        is the engine's memory: valid while the engine lives, rewritten by
        later steps (see zo_optim_param_buffer())."""
        p = c_void_p()
        self._c(lib.zo_optim_param_buffer(self._live(), int(i), ctypes.byref(p)),
                "zo_optim_param_buffer")
        n = self.numel[i]
        nbytes = n * arrays.DTYPE_SIZES[self.param_dtype]
        raw = (ctypes.c_uint8 * nbytes).from_address(p.value)
        raw._zo_engine = self  # keep the engine alive while the view lives
        if like == "torch":
            import torch
            dt = {arrays.F32: torch.float32, arrays.F16: torch.float16,
                  arrays.BF16: torch.bfloat16}[self.param_dtype]
            return torch.frombuffer(raw, dtype=dt, count=n)
        import numpy as np
        dt = {arrays.F32: np.float32, arrays.F16: np.float16, arrays.BF16: np.uint16}[self.param_dtype]
        return np.frombuffer(raw, dtype=dt, count=n)

    # -------------------------------------------------------------- save / load
    def save(self, root, name, keep_last=0, user_json=None):
        self._c(lib.zo_optim_save(self._live(), str(root).encode(), str(name).encode(),
                                  int(keep_last), None if user_json is None else user_json.encode()),
                "zo_optim_save")

    def load(self, root, name=None, user_len=1 << 20):
        """Load a checkpoint; returns the caller's JSON text stored with it ("" if none)."""
        buf = ctypes.create_string_buffer(user_len)
        self._c(lib.zo_optim_load(self._live(), str(root).encode(),
                                  None if name is None else str(name).encode(), buf, len(buf)),
                "zo_optim_load")
        return buf.value.decode()

    # -------------------------------------------------------------- info
    def info(self):
        i = _out(OptimInfo)
        self._c(lib.zo_optim_get_info(self._live(), ctypes.byref(i)), "zo_optim_get_info")
        return _fields(i)

    def timeline(self):
        """The latest update's timeline as a dict, or None before the first."""
        t = _out(OptimTimeline)
        rc = lib.zo_optim_get_timeline(self._live(), ctypes.byref(t))
        if rc == -2:
            return None
        self._c(rc, "zo_optim_get_timeline")
        return _fields(t)
