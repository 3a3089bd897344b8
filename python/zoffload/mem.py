# SPDX-License-Identifier: Apache-2.0
"""Pinned host memory as numpy arrays and torch tensors.

:func:`pinned_empty` allocates with ``zo_pinned_alloc`` (page-locked,
NUMA-bound, zero-filled; falls back to pageable memory when locking is
refused, see :func:`pinned_info`) and wraps the memory without copying. The
memory is freed with ``zo_pinned_free`` when the last array or tensor over
it is garbage collected.
"""

import ctypes

from . import _lib
from ._lib import lib, check
from . import arrays

PIN_HUGE = 1 << 0
PIN_NO_LOCK = 1 << 1
PIN_REQUIRE = 1 << 2
PIN_NO_FAULT = 1 << 3
PIN_LOCKED = 1 << 8
PIN_NUMA_BOUND = 1 << 9
PIN_DEV_REGISTERED = 1 << 10
PIN_THP = 1 << 11

_TORCH_DT = {arrays.F32: "float32", arrays.F16: "float16", arrays.BF16: "bfloat16",
             arrays.F64: "float64", arrays.U8: "uint8", arrays.I32: "int32"}
_NP_DT = {arrays.F32: "float32", arrays.F16: "float16", arrays.BF16: "uint16",
          arrays.F64: "float64", arrays.U8: "uint8", arrays.I32: "int32"}


def _owner_class(nbytes):
    """A ctypes byte array type whose instances free their pinned memory
    when collected (they are the buffer numpy/torch keep alive)."""

    def _free(self):
        p = self._zo_ptr
        self._zo_ptr = None
        if p:
            lib.zo_pinned_free(p)

    return type("PinnedBytes", (ctypes.c_uint8 * nbytes,), {"__del__": _free, "_zo_ptr": None})


def pinned_buffer(nbytes, numa_node=-1, flags=PIN_HUGE):
    """Allocate `nbytes` of pinned memory; returns a ctypes byte array that
    owns it (frees it when collected)."""
    if nbytes <= 0:
        raise ValueError("pinned_buffer: size %d, must be > 0" % nbytes)
    opts = _lib.new_struct("zo_pin_opts")
    opts.numa_node = numa_node
    opts.flags = flags
    p = ctypes.c_void_p()
    check(lib.zo_pinned_alloc(ctypes.byref(p), nbytes, ctypes.byref(opts)), "zo_pinned_alloc")
    try:
        owner = _owner_class(nbytes).from_address(p.value)
    except BaseException:
        lib.zo_pinned_free(p)
        raise
    # from_address does not own memory; the subclass's __del__ frees it.
    owner._zo_ptr = p.value
    return owner


def _parse_dtype(dtype):
    if isinstance(dtype, int):
        return dtype
    s = str(dtype).replace("torch.", "").replace("numpy.", "")
    names = {"float32": arrays.F32, "f32": arrays.F32, "float": arrays.F32,
             "float16": arrays.F16, "f16": arrays.F16, "half": arrays.F16,
             "bfloat16": arrays.BF16, "bf16": arrays.BF16, "float64": arrays.F64,
             "f64": arrays.F64, "uint8": arrays.U8, "u8": arrays.U8, "int32": arrays.I32,
             "i32": arrays.I32}
    if s not in names:
        raise TypeError("unsupported element type %r" % (dtype,))
    return names[s]


def _shape(shape):
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in shape:
        if s < 0:
            raise ValueError("negative dimension in %s" % (shape,))
        n *= s
    return shape, n


def pinned_empty(shape, dtype="float32", like="numpy", numa_node=-1, flags=PIN_HUGE):
    """A zero-filled array in pinned memory.

    like: "numpy" (bf16 comes back as a uint16 array) or "torch".
    """
    shape, n = _shape(shape)
    dt = _parse_dtype(dtype)
    nbytes = max(n * arrays.DTYPE_SIZES[dt], 1)
    owner = pinned_buffer(nbytes, numa_node, flags)
    if like == "torch":
        import torch
        t = torch.frombuffer(owner, dtype=getattr(torch, _TORCH_DT[dt]), count=n)
        return t.view(shape)
    if like == "numpy":
        import numpy as np
        return np.frombuffer(owner, dtype=_NP_DT[dt], count=n).reshape(shape)
    raise ValueError("like must be 'numpy' or 'torch', not %r" % (like,))


class PinnedInfo:
    """What a pinned allocation actually got (see ``zo_pinned_query``)."""

    def __init__(self, info):
        self.size = info.size
        self.mapped = info.mapped
        self.numa_node = info.numa_node
        self.flags = info.flags
        self.locked = bool(info.flags & PIN_LOCKED)
        self.huge = bool(info.flags & PIN_HUGE)

    def __repr__(self):
        return "PinnedInfo(size=%d, mapped=%d, numa_node=%d, locked=%s, huge=%s)" % (
            self.size, self.mapped, self.numa_node, self.locked, self.huge)


def pinned_info(x):
    """Describe the pinned allocation holding array/tensor `x`; ValueError
    if it is not in pinned memory from this library."""
    v = arrays.view(x, "x", min_elems=0) if not isinstance(x, int) else None
    addr = x if v is None else v.ptr
    info = _lib.out_struct(_lib.PinnedInfo)
    rc = lib.zo_pinned_query(addr, ctypes.byref(info))
    if rc == -2:  # -ENOENT
        raise ValueError("memory at 0x%x is not a live pinned allocation" % addr)
    check(rc, "zo_pinned_query")
    return PinnedInfo(info)


def pinned_stats():
    """Process-wide pinned memory counters as a dict."""
    st = _lib.out_struct(_lib.PinnedStats)
    lib.zo_pinned_stats_get(ctypes.byref(st))
    out = {f: getattr(st, f) for f, _ in _lib.PinnedStats._fields_}
    out["last_fallback"] = st.last_fallback.decode(errors="replace")
    return out


def set_pinned_budget(nbytes):
    """Set the process-wide budget of locked bytes; returns the previous one."""
    return lib.zo_pinned_set_budget(int(nbytes))
