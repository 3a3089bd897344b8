# SPDX-License-Identifier: Apache-2.0
"""The CPU optimizer kernels (cpuadam.h) on numpy arrays and torch tensors.

Every call works in place on the caller's memory (no copies): ``param`` is
the fp32 master, ``grad`` fp32/fp16/bf16, the states fp32 or bf16, and
``param_out`` (optional) receives the updated parameters as bf16/fp16/fp32
in the same pass. Numerics and error codes are those of the C library
(docs/cpuadam.md): AdamW and Adam agree with torch.optim within a few ulps.

Example::

    import numpy as np, zoffload.cpuadam as ca
    p = np.random.rand(1000).astype(np.float32); g = np.ones_like(p)
    m = np.zeros_like(p); v = np.zeros_like(p)
    ca.step(p, g, m, v, kind="adamw", lr=1e-3, step=1)
"""

import ctypes
import os

from . import _lib
from ._lib import lib, check
from . import arrays

ADAMW, ADAM, ADAGRAD, LION = 0, 1, 2, 3
KINDS = {"adamw": ADAMW, "adam": ADAM, "adagrad": ADAGRAD, "lion": LION}

_HP_FIELDS = ("lr", "beta1", "beta2", "eps", "weight_decay", "bias_correction", "step",
              "grad_scale", "clip_coef")


def kind_of(kind):
    if isinstance(kind, int) and kind in KINDS.values():
        return kind
    k = KINDS.get(str(kind).lower())
    if k is None:
        raise ValueError("unknown optimizer %r (adamw, adam, adagrad, lion)" % (kind,))
    return k


def hparams(kind="adamw", **kw):
    """A ``zo_cpuadam_hparams`` with the defaults of `kind`, then `kw`
    (lr, beta1, beta2, betas=(b1, b2), eps, weight_decay, bias_correction,
    step, grad_scale, clip_coef)."""
    hp = _lib.new_struct("zo_cpuadam_hparams", kind_of(kind))
    if "betas" in kw:
        b = kw.pop("betas")
        kw["beta1"], kw["beta2"] = float(b[0]), float(b[1])
    for k, val in kw.items():
        if k not in _HP_FIELDS:
            raise TypeError("hparams: unknown field %r" % k)
        if k in ("bias_correction", "step"):
            setattr(hp, k, int(val))
        else:
            setattr(hp, k, float(val))
    return hp


def default_threads():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


_GRAD_TYPES = (arrays.F32, arrays.F16, arrays.BF16)
_STATE_TYPES = (arrays.F32, arrays.BF16)
_OUT_TYPES = (arrays.F32, arrays.F16, arrays.BF16)


def tensors(param, grad, exp_avg=None, exp_avg_sq=None, param_out=None, *,
            grad_dtype=None, state_dtype=None, out_dtype=None):
    """Check the arrays of one slice and build the ``zo_cpuadam_tensors``.
    Returns (struct, views) - keep `views` alive while the struct is used.
    `*_dtype` say how to read numpy uint16 arrays (BF16 or F16)."""
    vp = arrays.view(param, "param", dtypes=(arrays.F32,), writable=True)
    vg = arrays.view(grad, "grad", dtypes=_GRAD_TYPES, as_dtype=grad_dtype)
    views = [vp, vg]
    t = _lib.new_struct("zo_cpuadam_tensors")
    t.n = vp.n
    t.param = vp.ptr
    t.grad = vg.ptr
    t.grad_dtype = vg.dtype
    sdt = None
    for name, x, field in (("exp_avg", exp_avg, "exp_avg"), ("exp_avg_sq", exp_avg_sq, "exp_avg_sq")):
        if x is None:
            continue
        v = arrays.view(x, name, dtypes=_STATE_TYPES, as_dtype=state_dtype, writable=True)
        if sdt is not None and v.dtype != sdt:
            raise TypeError("exp_avg and exp_avg_sq must have the same element type")
        sdt = v.dtype
        setattr(t, field, v.ptr)
        views.append(v)
    if sdt is not None:
        t.state_dtype = sdt
    if param_out is not None:
        vo = arrays.view(param_out, "param_out", dtypes=_OUT_TYPES, as_dtype=out_dtype,
                         writable=True)
        t.param_out = vo.ptr
        t.out_dtype = vo.dtype
        views.append(vo)
    arrays.same_length(*views)
    return t, views


def step(param, grad, exp_avg=None, exp_avg_sq=None, param_out=None, *, kind="adamw",
         nthreads=None, team=None, grad_dtype=None, state_dtype=None, out_dtype=None, **hp):
    """One optimizer step on one slice, in place. `hp` as :func:`hparams`
    (``step`` is the 1-based update number). Returns None."""
    h = hparams(kind, **hp)
    t, views = tensors(param, grad, exp_avg, exp_avg_sq, param_out, grad_dtype=grad_dtype,
                       state_dtype=state_dtype, out_dtype=out_dtype)
    if team is not None:
        team.step(h, t)
    else:
        check(lib.zo_cpuadam_step(ctypes.byref(h), ctypes.byref(t),
                                  int(nthreads or default_threads())), "zo_cpuadam_step")
    del views


def rollback(param, grad, exp_avg, exp_avg_sq, param_out=None, *, kind="adamw",
             nthreads=None, grad_dtype=None, out_dtype=None, **hp):
    """Undo one Adam/AdamW step (same gradients and hyperparameters)."""
    h = hparams(kind, **hp)
    t, views = tensors(param, grad, exp_avg, exp_avg_sq, param_out, grad_dtype=grad_dtype,
                       out_dtype=out_dtype)
    check(lib.zo_cpuadam_rollback(ctypes.byref(h), ctypes.byref(t),
                                  int(nthreads or default_threads())), "zo_cpuadam_rollback")
    del views


def grad_stats(grad, nthreads=None, grad_dtype=None, team=None):
    """(sum of squares as a float, number of inf/NaN elements) of `grad`."""
    v = arrays.view(grad, "grad", dtypes=_GRAD_TYPES, as_dtype=grad_dtype)
    st = _lib.out_struct(_lib.GradStats)
    if team is not None:
        return team.grad_stats_view(v)
    check(lib.zo_cpuadam_grad_stats(v.ptr, v.dtype, v.n, int(nthreads or default_threads()),
                                    ctypes.byref(st)), "zo_cpuadam_grad_stats")
    return st.sumsq, st.nonfinite


def variant():
    """The kernel variant auto dispatch uses now ("avx512", ...)."""
    return lib.zo_cpuadam_variant().decode()


class Team(_lib.Handle):
    """A ``zo_cpuadam_team``: thread count, optional CPU pinning and variant."""

    _destroy = "zo_cpuadam_team_destroy"
    _what = "cpuadam team"

    def __init__(self, nthreads=None, pin=False, numa_node=-1, variant=None, tile_elems=None):
        cfg = _lib.new_struct("zo_cpuadam_team_config")
        if nthreads is not None:
            cfg.nthreads = int(nthreads)
        cfg.pin = 1 if pin else 0
        cfg.numa_node = int(numa_node)
        self._variant = variant.encode() if variant else None
        cfg.variant = self._variant
        if tile_elems is not None:
            cfg.tile_elems = int(tile_elems)
        self._h = ctypes.c_void_p()
        check(lib.zo_cpuadam_team_create(ctypes.byref(self._h), ctypes.byref(cfg)),
              "zo_cpuadam_team_create")

    def _msg(self):
        return lib.zo_cpuadam_team_errmsg(self._h).decode(errors="replace") if self._h else ""

    @property
    def nthreads(self):
        return check(lib.zo_cpuadam_team_threads(self._live()), "zo_cpuadam_team_threads")

    @property
    def variant(self):
        return lib.zo_cpuadam_team_variant(self._live()).decode()

    def step(self, h, t):
        check(lib.zo_cpuadam_team_step(self._live(), ctypes.byref(h), ctypes.byref(t)),
              "zo_cpuadam_team_step", self._msg)

    def grad_stats_view(self, v):
        st = _lib.out_struct(_lib.GradStats)
        check(lib.zo_cpuadam_team_grad_stats(self._live(), v.ptr, v.dtype, v.n, ctypes.byref(st)),
              "zo_cpuadam_team_grad_stats", self._msg)
        return st.sumsq, st.nonfinite
