# SPDX-License-Identifier: Apache-2.0
"""Many ranks: the partitioned engine (``zo_part``, include/zoffload/part.h)
and a ``zo_comm`` made of torch.distributed collectives.

Each rank runs a :class:`PartEngine` over the whole model; the engine keeps
only its shard of the fp32 masters and optimizer states, reduces (averages)
the gradients across the ranks in buckets as they are handed over, clips
by the global norm and all-gathers the updated parameters into every
rank's tensors. :class:`TorchComm` gives it torch.distributed's
collectives (gloo on CPU): reduce-scatter and all-gather as point-to-point
exchanges between the engine's buffer and the peers (gloo has no
reduce-scatter and gathers only equal sizes), the received chunks summed
in rank order in fp32 (bf16 and fp16 rounded once), all-reduce of doubles.
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
_START = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, P(c_u64), c_int, P(c_void_p))
_WAIT = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)


class Comm(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("rank", c_uint), ("world", c_uint), ("user", c_void_p),
                ("reduce_scatter", _COLL), ("all_gather", _COLL), ("all_reduce", _ALLRED),
                ("reduce_scatter_start", _START), ("all_gather_start", _START), ("wait", _WAIT)]


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
    if lib.has("zo_part_wait"):
        d("zo_part_wait", c_int, [c_void_p, P(_optim.OptimStepResult)])
    if lib.has("zo_part_set_dev_param"):
        d("zo_part_set_dev_param", c_int, [c_void_p, c_uint, c_void_p])
    _declared = True


class TorchComm:
    """A zo_comm of torch.distributed collectives over `group` (default: the
    world). The callbacks run in the thread that drives the engine, inside
    its calls; a Python exception in one becomes -EIO for the engine, and is
    kept in `error` (re-raised by PartEngine with the engine's message).

    gloo has no reduce-scatter and gathers only equal sizes (torch 1.13),
    so both are point-to-point (isend / irecv) straight between the
    engine's buffer and the peers, which moves what a ring would and no
    more: per rank (world - 1) chunks out and (world - 1) in, where an
    all_reduce of the bucket moved twice that and the padded all_gather
    copied every chunk twice more.

    reduce_scatter: every peer's copy of this rank's chunk lands in a
    scratch buffer, then they are summed in rank order (0, 1, ...) in fp32
    (bf16 / fp16 widened, the sum rounded once to the dtype): the same bits
    as <zoffload/comm_mpi.h>'s ordered reduce-scatter, whatever the
    transport. all_gather: this rank's chunk goes to every peer and theirs
    land in place. Data travel as bytes (gloo in torch 1.13 sends no
    bfloat16).

    With `asynchronous` (the default) the engine also gets the start / wait
    callbacks (part.h): a start posts the sends and receives and returns,
    gloo's threads move the bytes while backward goes on, and wait finishes
    them (the rank-order sum happens there). The synchronous callbacks are
    a start and its wait."""

    _DT = None

    def __init__(self, group=None, asynchronous=True):
        import torch
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("TorchComm: torch.distributed is not initialized (init_process_group first)")
        self._torch, self._dist, self._group = torch, dist, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        # isend / irecv name peers by their rank in the default group
        self._peer = [global_rank(group, k) for k in range(self.world)]
        self.error = None
        self._free = []            # reduce-scatter scratch buffers not in use (one per request in flight)
        self._views = {}           # (address, bytes) -> uint8 tensor over the engine's buffer
        self._reqs = {}            # started, not yet waited: id -> (works, finish)
        self._next_id = 0
        if TorchComm._DT is None:
            TorchComm._DT = {_optim.arrays.F32: (4, torch.float32), _optim.arrays.BF16: (2, torch.bfloat16),
                             _optim.arrays.F16: (2, torch.float16)}
        _declare()
        # the CFUNCTYPE objects must outlive the engine: kept here
        self._cb = (_COLL(self._reduce_scatter), _COLL(self._all_gather), _ALLRED(self._all_reduce),
                    _START(self._reduce_scatter_start), _START(self._all_gather_start), _WAIT(self._wait))
        c = _lib.new_struct("zo_comm")
        c.rank, c.world = self.rank, self.world
        c.reduce_scatter, c.all_gather, c.all_reduce = self._cb[:3]
        if asynchronous:
            c.reduce_scatter_start, c.all_gather_start, c.wait = self._cb[3:]
        self.struct = c

    def _view(self, buf, counts, dt):
        """The engine's buffer (host memory) as uint8, the element size and
        torch dtype, and the chunk bounds in elements. The engine hands the
        same buffers step after step: their tensors are kept."""
        if dt not in self._DT:
            raise ValueError("TorchComm: dtype %d is not f32, bf16 or f16" % dt)
        es, tdt = self._DT[dt]
        b = [0] * (self.world + 1)
        for k in range(self.world):
            b[k + 1] = b[k] + int(counts[k])
        key = (buf, b[-1] * es)
        raw = self._views.get(key)
        if raw is None:
            if len(self._views) > 64:   # buffers of engines gone: let them go
                self._views.clear()
            a = np.ctypeslib.as_array((ctypes.c_char * key[1]).from_address(buf)).view(np.uint8)
            raw = self._views[key] = self._torch.from_numpy(a)
        return raw, es, tdt, b

    def _guard(self, fn, *a):
        try:
            fn(*a)
            return 0
        except Exception as e:  # a callback must not raise through C
            self.error = e
            return -errno.EIO

    def _post(self, sends, recvs):
        """Post every isend and irecv (byte tensors, peer indices): the
        pairs run concurrently, none waits on another. Their works."""
        works = [self._dist.isend(t, self._peer[k], group=self._group) for k, t in sends if t.numel()]
        works += [self._dist.irecv(t, self._peer[k], group=self._group) for k, t in recvs if t.numel()]
        return works

    def _start(self, kind, buf, counts, dt):
        """Post a reduce-scatter or an all-gather; the request id."""
        raw, es, tdt, b = self._view(buf, counts, dt)
        r, w = self.rank, self.world
        finish = None
        if kind == "rs":
            c = b[r + 1] - b[r]
            sc = self._scratch(w * c * es)
            works = self._post([(k, raw[b[k] * es:b[k + 1] * es]) for k in range(w) if k != r],
                               [(k, sc[k * c * es:(k + 1) * c * es]) for k in range(w) if k != r])

            def finish(ok):
                if not ok:          # a receive may still be pending into sc: never reused
                    return
                try:
                    if c:
                        self._sum(raw[b[r] * es:b[r + 1] * es].view(tdt), sc, c, es, tdt)
                finally:
                    self._free.append(sc)
        else:
            mine = raw[b[r] * es:b[r + 1] * es]
            works = self._post([(k, mine) for k in range(w) if k != r],
                               [(k, raw[b[k] * es:b[k + 1] * es]) for k in range(w) if k != r])
        self._next_id += 1
        self._reqs[self._next_id] = (works, finish)
        return self._next_id

    def _scratch(self, nbytes):
        """A scratch byte buffer of at least nbytes, from those not in use."""
        for i, t in enumerate(self._free):
            if t.numel() >= nbytes:
                return self._free.pop(i)
        if self._free:
            self._free.pop(0)          # too small: replaced by a larger one
        return self._torch.empty(nbytes, dtype=self._torch.uint8)

    def _sum(self, mine, sc, c, es, tdt):
        """mine = the rank-order sum of the world copies of this rank's chunk
        (peer k's in sc's slot k, this rank's own in mine)."""
        r, w = self.rank, self.world
        xs = [mine if k == r else sc[k * c * es:(k + 1) * c * es].view(tdt) for k in range(w)]
        if tdt == self._torch.float32:
            if r >= 2:              # the sum overwrites `mine` before its turn: keep a copy
                xs[r] = sc[r * c * es:(r + 1) * c * es].view(tdt).copy_(mine)
            self._torch.add(xs[0], xs[1], out=mine)     # rank order, as the ordered MPI comm
            for k in range(2, w):
                mine.add_(xs[k])
        else:
            acc = xs[0].float()
            for k in range(1, w):
                acc.add_(xs[k])     # widened exactly to fp32, then added
            mine.copy_(acc)         # one rounding of the fp32 sum

    def _finish(self, rid):
        """Wait for request rid's transfers, then its sum; the request is
        gone afterwards whatever happens."""
        works, finish = self._reqs.pop(rid)
        ok = False
        try:
            for q in works:
                q.wait()
            ok = True
        finally:
            if finish is not None:
                finish(ok)

    def _sync(self, kind, buf, counts, dt):
        if self.world == 1:
            return 0
        return self._guard(lambda: self._finish(self._start(kind, buf, counts, dt)))

    def _async(self, kind, buf, counts, dt, req):
        def run():
            rid = self._start(kind, buf, counts, dt)
            req[0] = rid
        if self.world == 1:
            req[0] = None
            return 0
        return self._guard(run)

    def _reduce_scatter(self, user, buf, counts, dt):
        return self._sync("rs", buf, counts, dt)

    def _all_gather(self, user, buf, counts, dt):
        return self._sync("ag", buf, counts, dt)

    def _reduce_scatter_start(self, user, buf, counts, dt, req):
        return self._async("rs", buf, counts, dt, req)

    def _all_gather_start(self, user, buf, counts, dt, req):
        return self._async("ag", buf, counts, dt, req)

    def _wait(self, user, req):
        if req is None:                # world 1: nothing was started
            return 0
        if req not in self._reqs:
            self.error = RuntimeError("TorchComm.wait: request %r was not started or was waited already" % req)
            return -errno.EINVAL
        return self._guard(self._finish, req)

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


def global_rank(group, rank):
    """`rank` of torch.distributed group `group` (None: the world) as a rank
    of the default group (what isend, irecv and gather's dst take)."""
    import torch.distributed as dist
    if group is None or group is dist.group.WORLD:
        return rank
    f = getattr(dist, "get_global_rank", None)
    if f is None:
        from torch.distributed import distributed_c10d as c10d
        f = c10d._get_global_rank
    return f(group, rank)


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

    def wait(self):
        """Finish the update in flight (the template's `dpu`) and all-gather
        its params into every rank's tensors (zo_part_wait): collective
        with dpu, every rank calls it; without dpu nothing is in flight and
        it returns at once. Its result as step() gives it."""
        if not lib.has("zo_part_wait"):
            raise _lib._errors.LibraryNotFound("%s has no zo_part_wait (built before DPU per rank)" % lib.path)
        r = _optim._out(_optim.OptimStepResult)
        self._c(lib.zo_part_wait(self._live(), ctypes.byref(r)), "zo_part_wait")
        return _optim._result(r)

    def push_params(self):
        """Collective: the masters of this rank's shards (after imports into
        inner()) cast, all-gathered and copied into every rank's tensors."""
        if not lib.has("zo_part_push_params"):
            raise _lib._errors.LibraryNotFound("%s has no zo_part_push_params (built before it)" % lib.path)
        self._c(lib.zo_part_push_params(self._live()), "zo_part_push_params")

    def set_dev_param(self, i, addr):
        """Tensor i's params moved to `addr` (same numel and dtype): the
        gathers copy them there from now on (zo_part_set_dev_param; local)."""
        if not lib.has("zo_part_set_dev_param"):
            raise _lib._errors.LibraryNotFound("%s has no zo_part_set_dev_param (built before it)" % lib.path)
        self._c(lib.zo_part_set_dev_param(self._live(), int(i), c_void_p(int(addr))), "zo_part_set_dev_param")

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
