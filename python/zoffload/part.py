# SPDX-License-Identifier: Apache-2.0
"""Many ranks: the partitioned engine (``zo_part``, include/zoffload/part.h)
and a ``zo_comm`` made of torch.distributed collectives.

Each rank runs a :class:`PartEngine` over the whole model; the engine keeps
only its shard of the fp32 masters and optimizer states, reduces (averages)
the gradients across the ranks in buckets as they are handed over, clips
by the global norm and all-gathers the updated parameters into every
rank's tensors. :class:`TorchComm` gives it torch.distributed's collectives
(gloo on CPU): reduce-scatter as an all-reduce of the bucket (gloo has no
reduce-scatter), all-gather of bytes with each chunk padded to the largest
(gloo's all_gather takes equal sizes and no 16-bit integers), all-reduce of
doubles. bf16 and fp16
buckets are summed in fp32 and rounded once.
"""
import ctypes
import errno

import numpy as np

from . import _lib
from . import optim as _optim
from ._lib import lib, check, c_int, c_uint, c_size_t, c_double, c_u64, c_i64, c_void_p, c_char_p, P

ZO_COMM_SUM = 0
ZO_COMM_MAX = 1

_COLL = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, P(c_u64), c_int)
_ALLRED = ctypes.CFUNCTYPE(c_int, c_void_p, P(c_double), c_uint, c_int)


class Comm(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("rank", c_uint), ("world", c_uint), ("user", c_void_p),
                ("reduce_scatter", _COLL), ("all_gather", _COLL), ("all_reduce", _ALLRED)]


class PartConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("optim", P(_optim.OptimConfig)), ("comm", P(Comm)),
                ("bucket_bytes", c_u64)]


class PartInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("rank", c_uint), ("world", c_uint), ("ntensors", c_uint),
                ("nbuckets", c_uint), ("numel", c_u64), ("shard_numel", c_u64), ("state_host_bytes", c_u64),
                ("state_nvme_bytes", c_u64), ("pinned_bytes", c_u64), ("host_bytes", c_u64),
                ("device_bytes", c_u64), ("step", c_i64), ("reduce_scatters", c_u64), ("buckets_in_grad", c_u64),
                ("all_gathers", c_u64)]


_lib.register_structs({"zo_comm": (Comm, "zo_comm_default", ()),
                       "zo_part_config": (PartConfig, "zo_part_config_default", ())},
                      {"zo_part_info": PartInfo})

_declared = False


def available():
    """Whether the loaded library has the partitioned engine."""
    return lib.has("zo_part_create")


def _declare():
    global _declared
    if _declared:
        return
    _optim._declare()
    if not available():
        raise _lib._errors.LibraryNotFound("%s has no zo_part engine (built before part.h)" % lib.path)
    d = lib.declare
    d("zo_comm_default", None, [c_void_p])
    d("zo_part_config_default", None, [c_void_p])
    d("zo_part_create", c_int, [P(c_void_p), P(PartConfig)])
    d("zo_part_destroy", None, [P(c_void_p)])
    d("zo_part_errmsg", c_char_p, [c_void_p])
    d("zo_part_init_from_device", c_int, [c_void_p])
    d("zo_part_grad", c_int, [c_void_p, c_uint, c_void_p, c_void_p])
    d("zo_part_step", c_int, [c_void_p, P(_optim.OptimStepResult)])
    d("zo_part_set_lr", c_int, [c_void_p, c_uint, c_double])
    d("zo_part_loss_scale", c_double, [c_void_p])
    d("zo_part_save", c_int, [c_void_p, c_char_p, c_char_p, c_uint, c_char_p])
    d("zo_part_load", c_int, [c_void_p, c_char_p, c_char_p, ctypes.c_char_p, c_size_t])
    d("zo_part_get_info", c_int, [c_void_p, P(PartInfo)])
    d("zo_part_optim", c_void_p, [c_void_p])
    if lib.has("zo_part_push_params"):
        d("zo_part_push_params", c_int, [c_void_p])
    _declared = True


class TorchComm:
    """A zo_comm of torch.distributed collectives over `group` (default: the
    world). The callbacks run in the thread that drives the engine, inside
    its calls; a Python exception in one becomes -EIO for the engine, and is
    kept in `error` (re-raised by PartEngine with the engine's message)."""

    def __init__(self, group=None):
        import torch
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("TorchComm: torch.distributed is not initialized (init_process_group first)")
        self._torch, self._dist, self._group = torch, dist, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.error = None
        _declare()
        # the CFUNCTYPE objects must outlive the engine: kept here
        self._cb = (_COLL(self._reduce_scatter), _COLL(self._all_gather), _ALLRED(self._all_reduce))
        c = _lib.new_struct("zo_comm")
        c.rank, c.world = self.rank, self.world
        c.reduce_scatter, c.all_gather, c.all_reduce = self._cb
        self.struct = c

    def _view(self, buf, counts, dt):
        """The engine's buffer (host memory) as a torch tensor of dt, and the
        chunk bounds."""
        n = [int(counts[k]) for k in range(self.world)]
        total = sum(n)
        es, npdt, tdt = {_optim.arrays.F32: (4, np.float32, None), _optim.arrays.BF16: (2, np.int16, "bfloat16"),
                         _optim.arrays.F16: (2, np.int16, "float16")}[dt]
        a = np.ctypeslib.as_array((ctypes.c_char * (total * es)).from_address(buf)).view(npdt)
        t = self._torch.from_numpy(a)
        if tdt:
            t = t.view(getattr(self._torch, tdt))
        bounds = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        return t, n, bounds

    def _guard(self, fn, *a):
        try:
            fn(*a)
            return 0
        except Exception as e:  # a callback must not raise through C
            self.error = e
            return -errno.EIO

    def _reduce_scatter(self, user, buf, counts, dt):
        def run():
            t, n, b = self._view(buf, counts, dt)
            lo, hi = int(b[self.rank]), int(b[self.rank + 1])
            if t.dtype == self._torch.float32:
                self._dist.all_reduce(t, group=self._group)   # the whole bucket: gloo has no reduce-scatter
            else:
                f = t.float()
                self._dist.all_reduce(f, group=self._group)
                t[lo:hi].copy_(f[lo:hi])                      # one rounding of the fp32 sum
        return self._guard(run)

    def _all_gather(self, user, buf, counts, dt):
        def run():
            t, n, b = self._view(buf, counts, dt)
            es = t.element_size()
            raw = t.view(self._torch.uint8)   # moved as bytes: gloo gathers no 16-bit integers
            m = max(n) * es
            mine = raw.new_zeros(m)
            mine[:n[self.rank] * es].copy_(raw[int(b[self.rank]) * es:int(b[self.rank + 1]) * es])
            parts = [raw.new_empty(m) for _ in range(self.world)]
            self._dist.all_gather(parts, mine, group=self._group)   # equal sizes: padded chunks
            for k in range(self.world):
                if k != self.rank:
                    raw[int(b[k]) * es:int(b[k + 1]) * es].copy_(parts[k][:n[k] * es])
        return self._guard(run)

    def _all_reduce(self, user, vals, n, op):
        def run():
            t = self._torch.tensor([vals[i] for i in range(n)], dtype=self._torch.float64)
            self._dist.all_reduce(t, op=self._dist.ReduceOp.SUM if op == ZO_COMM_SUM else self._dist.ReduceOp.MAX,
                                  group=self._group)
            for i in range(n):
                vals[i] = float(t[i])
        if op not in (ZO_COMM_SUM, ZO_COMM_MAX):
            return -errno.EINVAL
        return self._guard(run)


class PartEngine(_lib.Handle):
    """A ``zo_part``: this rank's engine of a model partitioned over the
    comm's ranks. `groups` and the keywords are those of
    :class:`zoffload.optim.Engine` (every group needs dev_params: the
    addresses of the full tensors, which the engine reads at init and
    writes after every update); `comm` is a :class:`TorchComm` (or any
    object with a `struct` zo_comm and an `error`); `bucket_bytes` the
    gradient bucket (default 25 MiB)."""

    _destroy = "zo_part_destroy"
    _what = "zo_part engine"

    def __init__(self, groups, comm, device=None, kind="adamw", bucket_bytes=None, **kw):
        _declare()
        self._dev = device if device is not None else _optim.Device("host")
        cfg, keep, self.numel, self._kind = _optim._config(groups, self._dev.handle, kind, kw, "PartEngine")
        pc = _lib.new_struct("zo_part_config")
        pc.optim = ctypes.pointer(cfg)
        pc.comm = ctypes.pointer(comm.struct)
        if bucket_bytes is not None:
            pc.bucket_bytes = int(bucket_bytes)
        self._comm = comm
        self._inner = None
        self._h = c_void_p()
        check(lib.zo_part_create(ctypes.byref(self._h), ctypes.byref(pc)), "zo_part_create")
        del keep  # read during create only
        self._dev._users += 1

    def _msg(self):
        return lib.zo_part_errmsg(self._h).decode(errors="replace") if self._h else ""

    def _c(self, rc, fn):
        if rc < 0 and self._comm.error is not None:
            e, self._comm.error = self._comm.error, None
            raise RuntimeError("%s: a collective failed: %s: %r" % (fn, self._msg(), e)) from e
        return check(rc, fn, self._msg)

    def close(self):
        if self._inner is not None:
            self._inner._h = None      # borrowed: gone with this engine
            self._inner = None
        if self._h:
            super().close()
            self._dev._release()

    def init_from_device(self):
        """Collective: the masters of this rank's shard from the tensors, then
        every rank's tensors from the shard owners."""
        self._c(lib.zo_part_init_from_device(self._live()), "zo_part_init_from_device")

    def grad(self, i, addr):
        """Tensor i's gradient at `addr` (grad dtype; valid and unchanged
        until the next step()). May reduce a bucket (collective)."""
        self._c(lib.zo_part_grad(self._live(), int(i), c_void_p(int(addr)), None), "zo_part_grad")

    def step(self):
        """Collective end of a micro-step (see zo_part_step): a dict of the
        result, grad_norm the global norm."""
        r = _optim._out(_optim.OptimStepResult)
        self._c(lib.zo_part_step(self._live(), ctypes.byref(r)), "zo_part_step")
        return _optim._result(r)

    def push_params(self):
        """Collective: the masters of this rank's shards (after imports into
        inner()) cast, all-gathered and copied into every rank's tensors."""
        if not lib.has("zo_part_push_params"):
            raise _lib._errors.LibraryNotFound("%s has no zo_part_push_params (built before it)" % lib.path)
        self._c(lib.zo_part_push_params(self._live()), "zo_part_push_params")

    def inner(self):
        """The inner engine of this rank's shards (zo_part_optim) as an
        :class:`zoffload.optim.Engine` that does not own its handle: one
        tensor per group of which this rank owns a piece, in group order.
        For queries, state export/import and hyperparameters set alike on
        every rank; its gradients and steps are this engine's to drive."""
        if self._inner is None:
            self._inner = _Inner(self)
        return self._inner

    def set_lr(self, group, lr):
        self._c(lib.zo_part_set_lr(self._live(), int(group), float(lr)), "zo_part_set_lr")

    def loss_scale(self):
        return lib.zo_part_loss_scale(self._live())

    def save(self, root, name, keep_last=0, user_json=None):
        self._c(lib.zo_part_save(self._live(), str(root).encode(), str(name).encode(), int(keep_last),
                                 None if user_json is None else str(user_json).encode()), "zo_part_save")

    def load(self, root, name=None, user_len=1 << 20):
        buf = ctypes.create_string_buffer(user_len)
        self._c(lib.zo_part_load(self._live(), str(root).encode(), None if name is None else str(name).encode(),
                                 buf, user_len), "zo_part_load")
        return buf.value.decode() or None

    def info(self):
        i = _optim._out(PartInfo)
        self._c(lib.zo_part_get_info(self._live(), ctypes.byref(i)), "zo_part_get_info")
        return _optim._fields(i)


class _Inner(_optim.Engine):
    """A borrowed zo_optim handle (zo_part_optim()): the Engine methods over
    it, never destroyed here (the zo_part owns it)."""

    _what = "inner engine of a zo_part (closed with it)"

    def __init__(self, part):
        h = lib.zo_part_optim(part._live())
        self._h = c_void_p(h)
        self._part = part            # the owner outlives this view
        self._kind = part._kind
        n = len(self)
        self.numel = [self.tensor(i)[0] for i in range(n)]
        self.param_dtype = None

    def close(self):
        self._h = None

    def __del__(self):
        pass
