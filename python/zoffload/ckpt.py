# SPDX-License-Identifier: Apache-2.0
"""Crash-safe checkpoints of host arrays (swap.h ``zo_ckpt_*``).

:func:`save` writes named arrays as one checkpoint directory under `root`:
data file and JSON manifest written under a temporary name, fsynced,
renamed into place, then ``latest`` replaced atomically, every chunk
checksummed. A process killed at any moment leaves either the previous
checkpoint or the new one, never a mix. :func:`load` verifies every chunk
it reads (``CorruptError`` names the tensor and offset on a mismatch).
"""

import ctypes
import json

from . import _lib
from ._lib import lib, check
from . import arrays


def save(root, name, tensors, user=None, keep_last=0, buffered=False, chunk_size=None):
    """Write `tensors` (a dict name -> numpy array / CPU torch tensor,
    contiguous, each with at least one element) as checkpoint `name`.
    `user` is any JSON-serialisable value kept in the manifest."""
    if not tensors:
        raise ValueError("ckpt.save: no tensors")
    items = list(tensors.items())
    n = len(items)
    entries = (_lib.CkptEntry * n)()
    ptrs = (ctypes.c_void_p * n)()
    keep = []
    for i, (k, x) in enumerate(items):
        v = arrays.view(x, "tensors[%r]" % (k,))
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) > _lib.CKPT_MAX_DIMS:
            raise ValueError("tensors[%r]: %d dimensions, at most %d"
                             % (k, len(shape), _lib.CKPT_MAX_DIMS))
        nm = str(k).encode()
        keep.append((v, nm))
        entries[i].name = nm
        entries[i].dtype = v.dtype
        entries[i].ndim = len(shape)
        for j, s in enumerate(shape):
            entries[i].shape[j] = int(s)
        entries[i].bytes = v.nbytes
        ptrs[i] = v.ptr
    opts = _lib.new_struct("zo_ckpt_options")
    opts.keep_last = int(keep_last)
    opts.buffered = 1 if buffered else 0
    if chunk_size:
        opts.chunk_size = int(chunk_size)
    uj = json.dumps(user).encode() if user is not None else None
    opts.user_json = uj
    check(lib.zo_ckpt_save(str(root).encode(), str(name).encode(), entries, ptrs, n,
                           ctypes.byref(opts)), "zo_ckpt_save")
    del keep


def latest(root):
    """Name of the newest checkpoint under root, or None if there is none."""
    buf = ctypes.create_string_buffer(256)
    rc = lib.zo_ckpt_latest(str(root).encode(), buf, len(buf))
    if rc == -2:
        return None
    check(rc, "zo_ckpt_latest")
    return buf.value.decode()


class Reader(_lib.Handle):
    """An open, validated checkpoint; read tensors by name."""

    _destroy = "zo_ckpt_close"
    _what = "checkpoint reader"

    def __init__(self, root, name=None):
        self._h = ctypes.c_void_p()
        check(lib.zo_ckpt_open(ctypes.byref(self._h), str(root).encode(),
                               None if name is None else str(name).encode()), "zo_ckpt_open")

    @property
    def name(self):
        return lib.zo_ckpt_name(self._h).decode()

    @property
    def user(self):
        s = lib.zo_ckpt_user_json(self._h).decode()
        return json.loads(s) if s else None

    def entries(self):
        """[(name, zo_dtype, shape tuple, bytes)] in checkpoint order."""
        out = []
        for i in range(lib.zo_ckpt_count(self._h)):
            e = _lib.out_struct(_lib.CkptEntry)
            check(lib.zo_ckpt_get_entry(self._h, i, ctypes.byref(e)), "zo_ckpt_get_entry")
            out.append((e.name.decode(), e.dtype, tuple(e.shape[j] for j in range(e.ndim)),
                        e.bytes))
        return out

    def _index(self, name):
        idx = ctypes.c_uint()
        rc = lib.zo_ckpt_find(self._h, str(name).encode(), ctypes.byref(idx))
        if rc == -2:
            raise KeyError(name)
        check(rc, "zo_ckpt_find")
        return idx.value

    def read_into(self, name, out):
        """Read tensor `name` into array/tensor `out` (same byte size and
        element type), verifying checksums."""
        i = self._index(name)
        e = _lib.out_struct(_lib.CkptEntry)
        check(lib.zo_ckpt_get_entry(self._h, i, ctypes.byref(e)), "zo_ckpt_get_entry")
        v = arrays.view(out, "out", writable=True, as_dtype=e.dtype if e.dtype in
                        (arrays.BF16, arrays.F16) else None)
        if v.nbytes != e.bytes or v.dtype != e.dtype:
            raise ValueError("checkpoint tensor %r is %d bytes of %s; out is %d bytes of %s"
                             % (name, e.bytes, arrays.DTYPE_NAMES.get(e.dtype, e.dtype),
                                v.nbytes, arrays.DTYPE_NAMES[v.dtype]))
        check(lib.zo_ckpt_read(self._h, i, 0, v.ptr, v.nbytes), "zo_ckpt_read")
        return out

    def read(self, name, like="numpy"):
        """Tensor `name` as a new numpy array (bf16 as uint16) or CPU torch tensor."""
        i = self._index(name)
        e = _lib.out_struct(_lib.CkptEntry)
        check(lib.zo_ckpt_get_entry(self._h, i, ctypes.byref(e)), "zo_ckpt_get_entry")
        shape = tuple(e.shape[j] for j in range(e.ndim))
        if like == "torch":
            import torch
            dt = {arrays.F32: torch.float32, arrays.F16: torch.float16,
                  arrays.BF16: torch.bfloat16, arrays.F64: torch.float64,
                  arrays.U8: torch.uint8, arrays.I32: torch.int32}[e.dtype]
            out = torch.empty(shape, dtype=dt)
        else:
            import numpy as np
            dt = {arrays.F32: np.float32, arrays.F16: np.float16, arrays.BF16: np.uint16,
                  arrays.F64: np.float64, arrays.U8: np.uint8, arrays.I32: np.int32}[e.dtype]
            out = np.empty(shape, dtype=dt)
        return self.read_into(name, out)


def load(root, name=None, like="numpy"):
    """(dict name -> array, user value) of checkpoint `name` (None: latest)."""
    with Reader(root, name) as r:
        return {k: r.read(k, like) for k, _, _, _ in r.entries()}, r.user
