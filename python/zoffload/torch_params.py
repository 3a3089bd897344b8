# SPDX-License-Identifier: Apache-2.0
"""Parameter offload for one device (ZeRO-3 style) through the tiered store.

    from zoffload.torch import offload_parameters
    off = offload_parameters(model, budget="256MiB", home="nvme", nvme_path="/mnt/nvme",
                             optimizer=opt)
    for batch in data:
        loss = model(batch)      # each module's params fetched before it runs, released after
        loss.backward()          # fetched again before the module's backward
        opt.step()               # inside off.updating(): the new values reach the store
        opt.zero_grad()

Every parameter is registered in a ``zo_store`` (store.h) with its home in
pinned host memory (``home="host"``) or on NVMe (``home="nvme"``). The
store's device tier, of ``budget`` bytes, is the only device memory the
parameters use: a module's parameters are acquired there before it runs
(forward pre-hook) and released after (forward hook); the store keeps
released copies cached while there is room and, once the first iteration
has recorded the order of the acquires (``zo_store_step()`` at each root
forward), loads the next modules' parameters ahead of need.

Backward needs the parameters again. torch 1.13 has no module backward
pre-hook, so (as DeepSpeed does) the module's outputs pass through an
autograd Function whose backward fetches the parameters, and its inputs
through one whose backward releases them; what is still held when backward
ends is released by a callback queued on the autograd engine. Tensors that
autograd saves for backward and that alias a fetched copy (``weight.t()``
saved by ``addmm``, the weight itself by ``layer_norm``) are packed as
(parameter, view geometry) by a saved-tensor hook and rebuilt from the
copy fetched at backward time, so no saved tensor points into device
memory the store may have given to another parameter meanwhile.
Activation checkpointing (``torch.utils.checkpoint``, reentrant) recomputes
the forward inside backward: the hooks fetch and release again.

Between uses a parameter's ``.data`` is:

* host home on a CPU device: a view of its home copy in the store's pinned
  host tier (zero copy); an optimizer writes the new values there;
* otherwise: a placeholder of the right shape, dtype and device, one NaN
  element broadcast (stride 0), so a use outside the module shows as NaN
  instead of reading freed memory, and autograd's gradient layout contract
  still holds. Reading or writing the values needs :meth:`updating`.

Optimizer steps and the home copy: :meth:`ParamOffload.updating` is a
context in which every parameter is an ordinary, writable host tensor
(the home copy itself for a host home, acquired for writing so cached
device copies are dropped; a tensor read from NVMe for an NVMe home,
written back when the context exits). ``optimizer=`` (or
:meth:`attach_optimizer`) wraps ``opt.step`` in it. Gradients keep the
normal ``.grad`` flow (OffloadAdamW takes them during backward).
"""

import contextlib
import ctypes
import functools
import os
import threading
import weakref

import torch

from . import errors as _errors
from . import store as _zs

__all__ = ["offload_parameters", "restore_parameters", "ParamOffload", "ParamBudgetError"]

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
           torch.float64: "f64"}


class ParamBudgetError(MemoryError):
    """The parameters a module needs at once do not fit the device budget."""


def _parse_bytes(x, what):
    if isinstance(x, str):
        from . import parse_size
        x = parse_size(x)
    if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
        raise ValueError("%s must be a positive byte count (or a size such as '64MiB'), got %r"
                         % (what, x))
    return x


class _Param:
    """One (unique) offloaded parameter."""

    __slots__ = ("name", "param", "t", "nbytes", "shape", "dtype", "refs", "bw_refs", "view",
                 "addr", "home_view", "buf")

    def __init__(self, name, param, t):
        self.name = name
        self.param = param
        self.t = t
        self.nbytes = t.nbytes
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.refs = 0        # fetches in force (forward stack + backward)
        self.bw_refs = 0     # of which taken during backward
        self.view = None     # the fetched device copy, while refs > 0
        self.addr = 0
        self.home_view = None
        self.buf = None      # the host tensor of updating() (NVMe home)


class _Module:
    __slots__ = ("name", "params", "need", "pushed")

    def __init__(self, name, params):
        self.name = name
        self.params = params
        self.need = 0
        self.pushed = 0


class _Saved:
    """A saved tensor that aliased a fetched copy: rebuilt at unpack."""

    __slots__ = ("rec", "size", "stride", "offset")

    def __init__(self, rec, t):
        self.rec = rec
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


class _Marker(torch.autograd.Function):
    """Identity on some tensors of a module (ctx keeps the offload and the
    module); subclasses act in backward."""

    @staticmethod
    def forward(ctx, off, mod, *xs):
        ctx.off, ctx.mod = off, mod
        return tuple(x.detach() for x in xs)


class _PreBackward(_Marker):
    """On a module's outputs: its backward fetches the module's parameters
    before the module's own backward runs."""

    @staticmethod
    def backward(ctx, *grads):
        ctx.off._pre_backward(ctx.mod)
        return (None, None) + grads


class _PostBackward(_Marker):
    """On a module's inputs: its backward runs once the gradients of the
    inputs are computed, i.e. after the module's backward: release."""

    @staticmethod
    def backward(ctx, *grads):
        ctx.off._post_backward(ctx.mod)
        return (None, None) + grads


def _wrap(fn, off, mod, obj):
    """Pass the float tensors that require grad in obj (a tensor, or a
    tuple/list/dict of them, one level) through autograd Function fn."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            return fn.apply(off, mod, obj)[0]
        return obj
    if isinstance(obj, (tuple, list)):
        idx = [i for i, x in enumerate(obj) if isinstance(x, torch.Tensor) and x.requires_grad]
        if not idx:
            return obj
        out = fn.apply(off, mod, *[obj[i] for i in idx])
        new = list(obj)
        for i, y in zip(idx, out):
            new[i] = y
        if isinstance(obj, tuple):
            return type(obj)(*new) if hasattr(obj, "_fields") else tuple(new)
        return new
    if isinstance(obj, dict):
        keys = [k for k, x in obj.items() if isinstance(x, torch.Tensor) and x.requires_grad]
        if not keys:
            return obj
        out = fn.apply(off, mod, *[obj[k] for k in keys])
        new = type(obj)(obj) if type(obj) is not dict else dict(obj)
        for k, y in zip(keys, out):
            new[k] = y
        return new
    return obj


class _CudaMem:
    """__cuda_array_interface__ of a device address (torch.as_tensor takes it)."""

    def __init__(self, addr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (addr, False),
                                         "strides": None, "version": 2}


class ParamOffload:
    """The parameter offload of one model (see the module documentation).
    Made by :func:`offload_parameters`; :meth:`restore` undoes it."""

    def __init__(self, model, budget, home="host", nvme_path=None, optimizer=None,
                 lookahead=None, prefetch_bytes=None, slot_size=None, slots=None,
                 pin_flags=None, numa_node=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError("offload_parameters: expected a torch.nn.Module, got %s"
                            % type(model).__name__)
        if getattr(model, "_zo_param_offload", None) is not None:
            raise ValueError("offload_parameters: the model's parameters are already offloaded "
                             "(restore_parameters() first)")
        if home not in ("host", "nvme"):
            raise ValueError("offload_parameters: home %r: 'host' (pinned host memory) or 'nvme'"
                             % (home,))
        self.budget = _parse_bytes(budget, "offload_parameters: budget")
        self.home = home
        self.model = model
        self._lock = threading.RLock()
        named = self._check_params(model)
        self.device = named[0][1].device if named else torch.device("cpu")
        if not named:
            raise ValueError("offload_parameters: the model has no parameters to offload")
        if home == "nvme":
            if nvme_path is None:
                raise ValueError("offload_parameters: home='nvme' needs nvme_path (a directory)")
            if not os.path.isdir(nvme_path):
                raise ValueError("offload_parameters: nvme_path %r is not a directory" % (nvme_path,))
        # the modules that own parameters, each with the unique params it owns
        pid = {id(p): n for n, p in named}
        self._mods = {}
        for mname, m in model.named_modules():
            ps = [pid[id(p)] for p in m._parameters.values() if p is not None and id(p) in pid]
            if ps:
                self._mods[m] = _Module(mname or "<root>", list(dict.fromkeys(ps)))
        sk = dict(slot_size=slot_size, slots=slots, pin_flags=pin_flags, numa_node=numa_node)
        sk = {k: v for k, v in sk.items() if v is not None}
        self._check_budget(model, named, sk)

        # the store: device tier = budget, home tier sized for every parameter
        from .optim import Device
        if self.device.type == "cuda":
            self._dev = Device("cuda", self.device.index or 0)
        else:
            self._dev = Device("host")
        self._swap = None
        descs = [(tuple(p.shape), _DTYPES[p.dtype]) for _, p in named]
        total = sum(p.numel() * p.element_size() for _, p in named)
        if home == "nvme":
            chunk = 1 << 20
            arena = max(chunk, total + len(named) * 4096)
            self._swap = _zs.Swap([os.path.realpath(nvme_path)], arena_size=min(arena, 1 << 30))
            host_bytes = 0
        else:
            host_bytes = _zs.tier_bytes_needed("host", descs, **sk)[1]
        kw = dict(sk)
        if lookahead is not None:
            kw["lookahead"] = int(lookahead)
        if prefetch_bytes is not None:
            kw["prefetch_bytes"] = _parse_bytes(prefetch_bytes, "prefetch_bytes")
        self.store = _zs.Store(device=self._dev, device_bytes=self.budget, host_bytes=host_bytes,
                               swap=self._swap, trace="auto", **kw)
        self.params = {}
        self._by_addr = {}
        self.total_bytes = total
        self.held_bytes = 0
        self.held_peak = 0
        self.iterations = 0
        self._upd_depth = 0
        self.saved_rebuilt = 0   # saved tensors rebuilt from the copy fetched at backward
        self._synced = True
        self._cb_queued = False
        self._hooks_ctx = []
        self._handles = []
        self._optimizers = []
        self._closed = False
        self._outside_is_home = home == "host" and self.device.type == "cpu"
        try:
            with torch.no_grad():
                for i, (n, p) in enumerate(named):
                    self._register(i, n, p)
        except BaseException:
            self._put_back()
            self.store.close()
            raise
        # the acquires above (home addresses) are no part of an iteration
        self.store.set_trace("auto")
        self._install_hooks(model)
        model._zo_param_offload = self
        if optimizer is not None:
            self.attach_optimizer(optimizer)

    # ------------------------------------------------------------ setup
    @staticmethod
    def _check_params(model):
        named, dev = [], None
        for n, p in model.named_parameters():
            if p.dtype not in _DTYPES:
                raise TypeError("offload_parameters: parameter %r is %s: float32, float16, "
                                "bfloat16 or float64 parameters can be offloaded" % (n, p.dtype))
            if p.layout != torch.strided:
                raise ValueError("offload_parameters: parameter %r is sparse" % n)
            if not p.is_contiguous():
                raise ValueError("offload_parameters: parameter %r of shape %s is not contiguous "
                                 "(strides %s)" % (n, tuple(p.shape), p.stride()))
            if dev is None:
                dev = p.device
            elif p.device != dev:
                raise ValueError("offload_parameters: parameters on two devices (%s and %r on %s): "
                                 "one offload serves the parameters of one device" % (dev, n, p.device))
            if dev.type not in ("cpu", "cuda"):
                raise ValueError("offload_parameters: parameters on %s: cpu or cuda" % dev)
            if p.numel():
                named.append((n, p))
        return named

    def _check_budget(self, model, named, sk):
        """The parameters held at once while a module runs are its own and
        those of the modules around it (their forward is still running): the
        budget must hold them in any layout, else no schedule can run."""
        shapes = {n: (tuple(p.shape), _DTYPES[p.dtype]) for n, p in named}
        worst = (0, None, 0)

        def walk(m, held):
            nonlocal worst
            rec = self._mods.get(m)
            mine = held + ([x for x in rec.params if x not in held] if rec else [])
            if rec:
                rec.need = _zs.tier_bytes_needed("device", [shapes[x] for x in mine], **sk)[1]
                if rec.need > worst[0]:
                    worst = (rec.need, rec.name, len(mine))
            for c in m.children():
                walk(c, mine)

        walk(model, [])
        if worst[0] > self.budget:
            raise ValueError(
                "offload_parameters: budget %d bytes is smaller than module %r needs: %d bytes for "
                "the %d parameters held while it runs (its own and those of the modules it runs "
                "inside); raise the budget to at least %d" % (self.budget, worst[1], worst[0],
                                                              worst[2], worst[0]))
        self.min_budget = worst[0]

    def _register(self, i, name, p):
        t = self.store.register(("p%d:%s" % (i, name))[:255], tuple(p.shape), _DTYPES[p.dtype],
                                home=self.home)
        rec = _Param(name, p, t)
        src = p.detach()
        if src.device.type != "cpu":
            src = src.to("cpu")
        self.store.write(t, src.contiguous().reshape(-1))
        if self.home == "host":
            # the home copy's address never changes while registered
            addr = self.store.acquire(t, "host").wait()
            self.store.release(t, "host")
            rec.home_view = self._host_view(addr, rec)
        # only now: a failure above leaves p with its own data (the caller
        # puts back the ones in self.params and closes the store)
        self.params[name] = rec
        p._zo_offloaded = True     # an OffloadAdamW made from now on never writes it in place
        p.data = self._outside(rec)

    def _host_view(self, addr, rec):
        buf = (ctypes.c_uint8 * rec.nbytes).from_address(addr)
        return torch.frombuffer(buf, dtype=torch.uint8).view(rec.dtype).view(rec.shape)

    def _device_view(self, addr, rec):
        if self.device.type == "cuda":
            raw = torch.as_tensor(_CudaMem(addr, rec.nbytes), device=self.device)
            return raw.view(rec.dtype).view(rec.shape)
        return self._host_view(addr, rec)

    def _outside(self, rec):
        if self._outside_is_home:
            return rec.home_view
        nan = torch.full((1,), float("nan"), dtype=rec.dtype, device=self.device)
        return nan.expand(rec.shape) if rec.shape else nan.view(())

    def _install_hooks(self, model):
        h = self._handles
        h.append(model.register_forward_pre_hook(self._root_pre))
        for m, rec in self._mods.items():
            h.append(m.register_forward_pre_hook(functools.partial(ParamOffload._pre, self, rec)))
            h.append(m.register_forward_hook(functools.partial(ParamOffload._post, self, rec)))

    # ------------------------------------------------------------ fetch / release
    def _fetch(self, recs, why, bw=False):
        """Acquire the device copies of recs not yet fetched; one more
        reference on each. On failure no reference is left taken."""
        with self._lock:
            new = [r for r in dict.fromkeys(recs) if r.refs == 0]
            reqs = []
            try:
                for r in new:
                    reqs.append((r, self.store.acquire(r.t, "device")))
                for r, q in reqs:
                    r.addr = q.wait()
            except _errors.BudgetError as e:
                self._undo_reqs(reqs)
                raise ParamBudgetError(
                    "%s: the parameters of %s do not fit the device budget of %d bytes next to the "
                    "%d bytes of parameters already fetched (%s): %s"
                    % (why, ", ".join(repr(r.name) for r in new), self.budget, self.held_bytes,
                       ", ".join(x.name for x in self.params.values() if x.refs) or "none",
                       e.detail or e)) from e
            except BaseException:
                self._undo_reqs(reqs)
                raise
            for r in new:
                r.view = self._device_view(r.addr, r)
                self._by_addr[r.addr] = r
                r.param.data = r.view
                self.held_bytes += r.nbytes
            if self.held_bytes > self.held_peak:
                self.held_peak = self.held_bytes
            for r in dict.fromkeys(recs):
                r.refs += 1
                if bw:
                    r.bw_refs += 1

    def _undo_reqs(self, reqs):
        for r, q in reqs:
            try:
                if not q.done:
                    q.wait()
                self.store.release(r.t, "device")
            except _errors.ZoError:
                pass   # that acquire failed: it holds no reference
            r.addr = 0

    def _release(self, recs, bw=False):
        with self._lock:
            drop = []
            for r in dict.fromkeys(recs):
                if r.refs == 0 or (bw and r.bw_refs == 0):
                    continue
                r.refs -= 1
                if bw:
                    r.bw_refs -= 1
                if r.refs == 0:
                    drop.append(r)
            if not drop:
                return
            if self.device.type == "cuda":
                # kernels queued on torch's stream may still read the copies
                torch.cuda.current_stream(self.device).synchronize()
            for r in drop:
                r.param.data = self._outside(r)
                self._by_addr.pop(r.addr, None)
                r.view = None
                r.addr = 0
                self.held_bytes -= r.nbytes
                self.store.release(r.t, "device")

    def _recs(self, mod):
        return [self.params[n] for n in mod.params]

    # ------------------------------------------------------------ hooks
    def _root_pre(self, module, args):
        """A new forward of the whole model: an iteration boundary for the
        store's trace; drops device copies an optimizer may have made stale."""
        with self._lock:
            held = [r for r in self.params.values() if r.refs]
            for r in held:
                # an earlier forward raised half-way: its fetches are void
                r.refs = r.bw_refs = 1
                self._release([r], bw=True)
            while self._hooks_ctx:
                self._hooks_ctx.pop()[1].__exit__(None, None, None)
            if self.iterations:
                self.store.step()
            self.iterations += 1
            if not self._synced:
                self._invalidate()
            self._synced = False

    def _invalidate(self):
        """The home copies may have been written (an optimizer step outside
        updating()): acquire them for writing, which drops the cached device
        copies (host home; an NVMe home is only written by updating())."""
        if self.home != "host":
            return
        for r in self.params.values():
            self.store.acquire(r.t, "host", write=True).wait()
            self.store.release(r.t, "host")

    def _pre(self, mod, module, args):
        self._fetch(self._recs(mod), "forward of %r" % mod.name)
        if not self._hooks_ctx:
            ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            ctx.__enter__()
            self._hooks_ctx.append((mod, ctx))
            mod.pushed += 1
        if torch.is_grad_enabled():
            return _wrap(_PostBackward, self, mod, args)
        return None

    def _post(self, mod, module, args, output):
        self._release(self._recs(mod))
        if mod.pushed and self._hooks_ctx and self._hooks_ctx[-1][0] is mod:
            mod.pushed -= 1
            self._hooks_ctx.pop()[1].__exit__(None, None, None)
        if torch.is_grad_enabled():
            return _wrap(_PreBackward, self, mod, output)
        return None

    def _pre_backward(self, mod):
        if not self._cb_queued:
            self._cb_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        self._fetch(self._recs(mod), "backward of %r" % mod.name, bw=True)

    def _post_backward(self, mod):
        self._release(self._recs(mod), bw=True)

    def _backward_done(self):
        with self._lock:
            self._cb_queued = False
            for r in self.params.values():
                while r.bw_refs:
                    self._release([r], bw=True)

    def _pack(self, t):
        if t.layout != torch.strided or t.device != self.device or not self._by_addr:
            return t
        base = t.data_ptr() - t.storage_offset() * t.element_size()
        rec = self._by_addr.get(base)
        if rec is None:
            return t
        if t.dtype != rec.dtype:
            raise RuntimeError("zoffload parameter offload: a %s view of parameter %r is saved for "
                               "backward; only views of the parameter's own dtype can be rebuilt"
                               % (t.dtype, rec.name))
        return _Saved(rec, t)

    def _unpack(self, x):
        if not isinstance(x, _Saved):
            return x
        rec = x.rec
        if rec.view is None:
            # needed outside the module's own backward: held until backward ends
            if not self._cb_queued:
                self._cb_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._fetch([rec], "backward (saved tensor of %r)" % rec.name, bw=True)
        self.saved_rebuilt += 1
        return rec.view.as_strided(x.size, x.stride, x.offset)

    # ------------------------------------------------------------ optimizer side
    def _check_idle(self, what):
        held = [r.name for r in self.params.values() if r.refs]
        if held:
            raise RuntimeError("%s: parameters are fetched for a forward or backward in progress "
                               "(%s)" % (what, ", ".join(held[:5])))

    @contextlib.contextmanager
    def updating(self, write_back=True):
        """Every parameter as a writable host tensor for the duration (an
        optimizer step, loading or saving a state dict); with write_back,
        what was written reaches the home copy when the context exits."""
        self._live()
        if self._upd_depth:
            # nested (an optimizer's step calling its own fence): the outer
            # context already handed out the host tensors
            self._upd_depth += 1
            try:
                yield self
            finally:
                self._upd_depth -= 1
            return
        with self._lock:
            self._check_idle("updating()")
            for r in self.params.values():
                if self.home == "host":
                    # acquired for writing: cached device copies become stale and are dropped
                    if write_back:
                        self.store.acquire(r.t, "host", write=True).wait()
                    r.param.data = r.home_view
                else:
                    r.buf = torch.empty(r.shape, dtype=r.dtype)
                    self.store.read(r.t, r.buf.view(-1))
                    r.param.data = r.buf
        self._upd_depth = 1
        try:
            yield self
        finally:
            self._upd_depth = 0
            with self._lock:
                for r in self.params.values():
                    if self.home == "host":
                        if write_back:
                            self.store.release(r.t, "host")
                    else:
                        if write_back:
                            self.store.write(r.t, r.buf.reshape(-1))
                        r.buf = None
                    r.param.data = self._outside(r)
                if write_back:
                    self._synced = True

    def gathered(self):
        """updating(write_back=False): read the values (state_dict, evaluation
        code that bypasses forward); writes are not kept for an NVMe home."""
        return self.updating(write_back=False)

    def attach_optimizer(self, opt):
        """Run opt.step() inside updating(); for zoffload's OffloadOptimizer
        also the calls that copy parameters in or out (wait, the DPU fence;
        close and state_dict, which fence; save; load and load_state_dict,
        which set the parameters)."""
        if any(o() is opt for o in self._optimizers):
            return
        from .torch import OffloadOptimizer
        meths = ["step"]
        if isinstance(opt, OffloadOptimizer):
            meths += ["wait", "close", "state_dict", "load_state_dict", "save", "load"]
            # its engine must not write the parameters at fixed addresses
            # (they move between store copies): remake it, reading the
            # parameters' values where they are now
            with self.gathered():
                opt._no_direct()
        ref = weakref.ref(self)
        for meth in meths:
            orig = getattr(opt, meth, None)
            if orig is None:
                continue

            def wrapped(*a, _orig=orig, **k):
                off = ref()
                if off is None or off._closed:
                    return _orig(*a, **k)
                with off.updating():
                    return _orig(*a, **k)
            functools.update_wrapper(wrapped, orig)
            setattr(opt, meth, wrapped)
        self._optimizers.append(weakref.ref(opt))

    # ------------------------------------------------------------ reporting
    def stats(self):
        """held_bytes / held_peak: parameter bytes referenced on the device
        now / at most (this module's accounting); device_used / device_peak:
        the store's device tier (cached and prefetched copies included), never
        above budget; the store's fetch counters."""
        s = self.store.stats()
        return {"budget": self.budget, "min_budget": self.min_budget,
                "total_bytes": self.total_bytes, "held_bytes": self.held_bytes,
                "held_peak": self.held_peak, "device_used": s["used"]["device"],
                "device_peak": s["peak"]["device"], "iterations": self.iterations,
                "hits": s["hits"], "misses": s["misses"], "prefetch_issued": s["prefetch_issued"],
                "prefetch_used": s["prefetch_used"], "prefetch_wasted": s["prefetch_wasted"],
                "demand_bytes": s["demand_bytes"], "prefetch_bytes": s["prefetch_bytes"],
                "evictions": s["evictions"], "stall_s": s["stall_ns"] * 1e-9,
                "trace_len": s["trace_len"], "trace_mismatches": s["trace_mismatches"]}

    def reset_stats(self):
        self.held_peak = self.held_bytes
        self.store.reset_stats()

    # ------------------------------------------------------------ undo
    def _live(self):
        if self._closed:
            raise ValueError("parameter offload was restored (closed)")

    def _put_back(self):
        with torch.no_grad():
            for r in self.params.values():
                host = torch.empty(r.shape, dtype=r.dtype)
                self.store.read(r.t, host.view(-1))
                r.param.data = host.to(self.device) if self.device.type != "cpu" else host
                r.param.__dict__.pop("_zo_offloaded", None)

    def restore(self):
        """Bring every parameter back as an ordinary tensor on its device with
        its current values; remove the hooks; close the store."""
        if self._closed:
            return self.model
        with self._lock:
            self._check_idle("restore_parameters()")
            for h in self._handles:
                h.remove()
            self._handles = []
            self._put_back()
            self._closed = True
            self.store.close()
            if getattr(self.model, "_zo_param_offload", None) is self:
                del self.model._zo_param_offload
        return self.model

    close = restore


def offload_parameters(model, budget, home="host", nvme_path=None, optimizer=None, **store_options):
    """Offload `model`'s parameters into a tiered store; returns the
    :class:`ParamOffload`.

    budget:     device bytes for parameters (int or "256MiB"); at least what
                the largest module needs with the modules around it
                (ValueError naming the module otherwise);
    home:       "host" (pinned host memory) or "nvme" (swap files in nvme_path);
    optimizer:  an optimizer whose step() runs inside updating() (also
                attach_optimizer());
    store_options: lookahead, prefetch_bytes, slot_size, slots, pin_flags,
                numa_node of the store.
    """
    return ParamOffload(model, budget, home=home, nvme_path=nvme_path, optimizer=optimizer,
                        **store_options)


def restore_parameters(model):
    """Undo offload_parameters(model): ordinary parameters again."""
    off = getattr(model, "_zo_param_offload", None)
    if off is None:
        raise ValueError("restore_parameters: the model's parameters are not offloaded")
    return off.restore()
