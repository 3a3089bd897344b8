# SPDX-License-Identifier: Apache-2.0
"""Many ranks for zoffload.torch's optimizers: ``OffloadAdamW(params, ...,
process_group=...)`` backed by the partitioned engine (``zo_part``,
include/zoffload/part.h; bound in zoffload.part).

Each rank builds the optimizer over the whole model (not wrapped in DDP);
the engine keeps only this rank's shard of the fp32 masters and optimizer
states (DeepSpeed's ZeRO-1/2 layout: each param group laid end to end and
cut into world shards), in pinned host memory or on NVMe. Gradients are
averaged across the ranks by the engine: bucketed reduce-scatters as the
hooks hand them over during backward (or at step() with
grad_hooks="step"), the sum divided by the world size in fp32 as DDP and
DeepSpeed average. At step() the global norm and overflow are all-reduced,
each rank updates its shard, and the updated params are all-gathered into
every rank's tensors.

With delay_update (DPU) each rank's engine runs the single-rank delayed
schedule on its shard: step() of N+1 finishes update N, all-gathers it and
queues N+1 (zo_part_step); wait() is zo_part_wait, collective while an
update is in flight, and so is every call that fences first (state_dict,
consolidated_state_dict, save, load, load_state_dict, close). The ranks
agree on whether one is in flight: they made the same steps.

This module holds the backend OffloadOptimizer drives (_PartBackend, the
same methods as torch.py's _EngineBackend) and the layout arithmetic the
state dicts need; torch.py documents the user-facing side.
"""

import contextlib
import os

import torch

from . import part as _part
from .torch import _BackendCommon, _engine_kw, _engine_state, _state_elem_bytes

_STATE_FMT = "zoffload.torch.partition/1"


def resolve_group(process_group):
    """The torch.distributed group `process_group` names: True for the
    default (world) group, or a ProcessGroup. torch.distributed must be
    initialized."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("process_group=%r: torch.distributed is not initialized (call "
                           "torch.distributed.init_process_group first, e.g. under torchrun)" % (process_group,))
    if process_group is True:
        return dist.group.WORLD
    if process_group is False:
        raise ValueError("process_group=False: leave it out (None) for one rank")
    return process_group


def layout(numels, world, rank):
    """The partitioned engine's layout of one group (part.h): the shard size
    S (ceil(N / world) rounded up to even), this rank's [lo, hi)."""
    n = sum(numels)
    s = -(-n // world)
    s += s & 1
    return n, s, min(rank * s, n), min((rank + 1) * s, n)


class _PartBackend(_BackendCommon):
    """OffloadOptimizer's state in a zo_part engine (one parameter dtype,
    CPU parameters, gloo). The inner engine's tensor k is this rank's shard
    of group k' (the k-th group of which it owns a piece)."""

    partitioned = True
    direct = False

    def __init__(self, opt, *, process_group, bucket_bytes, state_dtype, nthreads, numa_node, offload_device,
                 nvme_path, sub_group_size, pinned_bytes, pin_memory, buffer_count, clip_mode, no_grad,
                 state_block=None):
        import weakref
        self.opt = weakref.proxy(opt)
        name = self._name = type(opt).__name__   # (type() of the proxy would say ProxyType)
        # delay_update (DPU): the inner engine's update of step N runs while
        # forward/backward of N+1 do; zo_part_step() of N+1 finishes it and
        # all-gathers its params, zo_part_wait() (collective) on demand
        self.dpu = bool(opt.delay_update)
        self._in_flight = False     # a delayed update queued and not yet collected (the same on every rank)
        if self.dpu and not _part.lib.has("zo_part_wait"):
            raise NotImplementedError("%s(process_group=..., delay_update=True): %s has no zo_part_wait (built "
                                      "before DPU per rank)" % (name, _part.lib.path))
        if clip_mode != "two_pass":
            raise ValueError("%s(process_group=...): clip_mode=%r: the partitioned engine needs 'two_pass' (the "
                             "global norm is known only after every rank's gradients)" % (name, clip_mode))
        if no_grad != "zero":
            raise ValueError("%s(process_group=...): no_grad=%r is not supported: a rank's shard holds pieces of "
                             "many parameters, updated together, so a parameter without a gradient is updated with "
                             "a zero one (no_grad='zero', DeepSpeed's rule, the default with process_group)"
                             % (name, no_grad))
        dtypes = sorted({p.dtype for _, p in opt._plist}, key=str)
        if len(dtypes) > 1:
            raise ValueError("%s(process_group=...): one parameter dtype (the partitioned engine has one), got %s"
                             % (name, ", ".join(str(d).replace("torch.", "") for d in dtypes)))
        if opt.device.type != "cpu":
            raise NotImplementedError(
                "%s(process_group=...): parameters on %s: the partitioned engine runs from Python on CPU "
                "parameters over gloo; CUDA parameters with NCCL are not wired up from Python yet (C has "
                "<zoffload/comm_nccl.h>)" % (name, opt.device))
        self.group = resolve_group(process_group)
        self.comm = _part.TorchComm(self.group)
        self.rank, self.world = self.comm.rank, self.comm.world
        self.dtype = dtypes[0]
        self.kw = dict(process_group=process_group, bucket_bytes=bucket_bytes, state_dtype=state_dtype,
                       nthreads=nthreads, numa_node=numa_node, offload_device=offload_device, nvme_path=nvme_path,
                       sub_group_size=sub_group_size, pinned_bytes=pinned_bytes, pin_memory=pin_memory,
                       buffer_count=buffer_count, clip_mode=clip_mode, no_grad=no_grad,
                       state_block=state_block)
        groups = []
        self.glayout = []          # per torch group: (N, S, lo, hi, inner index or None)
        self.toff = [0] * len(opt._plist)
        k = 0
        for gi, g in enumerate(opt.param_groups):
            mine = [i for i, (pg, _) in enumerate(opt._plist) if pg == gi]
            off = 0
            for i in mine:
                self.toff[i] = off
                off += opt._plist[i][1].numel()
            numels = [opt._plist[i][1].numel() for i in mine]
            n, s, lo, hi = layout(numels, self.world, self.rank)
            self.glayout.append((n, s, lo, hi, k if hi > lo else None))
            k += hi > lo
            grp = {"numel": numels, "names": ["p%d" % i for i in mine],
                   "dev_params": [opt._plist[i][1].data_ptr() for i in mine]}
            grp.update(_engine_state(state_dtype, state_block))
            groups.append(grp)
        self._ptrs = [(i, p.data_ptr()) for i, (_, p) in enumerate(opt._plist)]
        self._pmeta = {i: (p.numel(), p.dtype) for i, (_, p) in enumerate(opt._plist)}
        kw = _engine_kw(opt, self.dtype, offload_device=offload_device, nthreads=nthreads, numa_node=numa_node,
                        pin_memory=pin_memory, no_grad="zero", nvme_path=nvme_path, sub_group_size=sub_group_size,
                        pinned_bytes=pinned_bytes, buffer_count=buffer_count)
        # as _EngineBackend: the warm-up steps run undelayed (dpu_double_buffer is not offered here,
        # and zo_part_create refuses it by name)
        kw.update(dpu=self.dpu, dpu_warmup_steps=opt._dpu_warmup_left)
        self.pe = _part.PartEngine(groups, self.comm, kind=opt._zo_kind_id(), bucket_bytes=bucket_bytes, **kw)
        self.inner = self.pe.inner()
        self.timings = {"launch": 0.0, "update": 0.0, "copy_back": 0.0, "fence": 0.0}
        self.last = None
        self.steps_skipped = 0
        self.tsteps = [0] * len(opt._plist)
        self.handed = 0
        self.handed_idx = set()    # params whose .grad was freed by a hook
        self._in = set()           # params handed over in this micro-step
        self._held = []            # the gradient tensors the engine may still read
        self.pe.init_from_device()
        self._set_hparams()

    # OffloadOptimizer reads engines for timeline(), scaler states, close()
    @property
    def engines(self):
        return [(self.dtype, self.inner, None, list(range(len(self.opt._plist))))] if self.pe._h else []

    # -- helpers
    def owned(self, i):
        """(inner tensor, offset in it, offset in the parameter, count) of the
        piece of parameter i this rank owns, or None."""
        gi, p = self.opt._plist[i]
        n, s, lo, hi, k = self.glayout[gi]
        a, e = max(lo, self.toff[i]), min(hi, self.toff[i] + p.numel())
        if k is None or e <= a:
            return None
        return k, a - lo, a - self.toff[i], e - a

    def _set_hparams(self):
        opt = self.opt
        for gi, g in enumerate(opt.param_groups):
            opt._check_group_flags(g)
            k = self.glayout[gi][4]
            if k is None:
                continue
            h = opt._hparams(g, g.get("step", 0) + 1)
            h.step = 1  # the engine counts its updates itself
            self.inner.set_hparams(k, h)

    def follow_params(self):
        """The engine all-gathers the updated params into the tensors'
        addresses; one that moved (p.data replaced: module.to(), Hugging
        Face's Trainer under torchrun) is re-pointed first (local, each rank
        its own; _follow_params). offload_parameters() is not supported
        with process_group."""
        self._follow_params(self.pe.set_dev_param)

    def copy_back(self, only=None):
        """Every rank's params from the masters (collective)."""
        self.follow_params()
        t0 = _now()
        self.pe.push_params()
        self.timings["copy_back"] += _now() - t0

    # -- gradients
    def take_grad(self, i, p, free):
        if i in self._in:
            raise RuntimeError(
                "%s(process_group=...): parameter %d's gradient was already handed to the partitioned engine "
                "in this step (its bucket may be averaged across the ranks already): a second backward before "
                "step() needs `with opt.no_sync():` around all but the last backward (as DDP's no_sync), or "
                "grad_hooks='step'. A model wrapped in DistributedDataParallel (Hugging Face's Trainer wraps it "
                "under torchrun) does this too: DDP writes its averaged .grad after the hook took the gradient; "
                "with process_group the optimizer averages the gradients itself, so leave the model unwrapped, "
                "or use grad_hooks='step'" % (self._name, i))
        g = p.grad.detach()
        if g.device.type != "cpu":
            raise RuntimeError("gradient on %s: the partitioned engine takes CPU gradients" % g.device)
        if g.dtype != p.dtype or not g.is_contiguous():
            g = g.to(p.dtype).contiguous()
        if self.opt.param_groups[self.opt._plist[i][0]].get("maximize"):
            g = torch.neg(g)       # torch's maximize: the update follows -grad
        # the engine reads it when its bucket is reduced (now or later): kept
        # alive and unchanged until step() returns
        self._held.append(g)
        self._in.add(i)
        try:
            self.pe.grad(i, g.data_ptr())
        except BaseException:
            # a collective failed (a rank died or hangs: the process group's
            # timeout): this step's hand-overs are void, and the engine
            # refuses every gradient and step until a load, saying why
            self._forget_step()
            raise
        self._handed_over(i, p, free)

    def _forget_step(self):
        self._held = []
        self._in.clear()
        self.handed = 0
        self.handed_idx.clear()

    def discard(self):
        if not self.handed:
            return
        raise RuntimeError(
            "zero_grad(): %d gradients were already handed to the partitioned engine during backward "
            "(grad_hooks='backward'), and their buckets may be averaged across the ranks: they cannot be "
            "dropped. Call zero_grad() after step() (or before backward), or use grad_hooks='step'" % self.handed)

    # -- step
    def step(self):
        opt = self.opt
        self.follow_params()
        self._set_hparams()
        t0 = _now()
        had = self._in_flight
        # this call collects the update in flight, or fails (then the engine
        # refuses until a load, which finishes it itself)
        self._in_flight = False
        try:
            res = self.pe.step()
        finally:
            self._forget_step()
        self.timings["update"] += _now() - t0
        if self.dpu and self.inner.info()["dpu_active"]:
            # delayed: this update runs on while the next forward/backward
            # do. The call finished the previous one (res is its result,
            # accounted here as the single-rank fence accounts it) and
            # gathered its params; like the single-rank path, nothing is
            # returned for this one, and the groups count it already.
            self._in_flight = True
            if had:
                self._account(res)
            for g in opt.param_groups:
                g["step"] = g.get("step", 0) + 1
            self.refresh_steps()
            return None
        self._account(res)
        self.refresh_steps()
        return res

    def refresh_steps(self):
        s = self.inner.info()["step"]
        moved = [i for i in range(len(self.tsteps)) if self.tsteps[i] != s]
        self.tsteps = [s] * len(self.tsteps)
        return moved

    def set_steps(self, steps, top=None):
        if top is None:
            top = max(steps) if steps else 0
        self.inner.set_step(top)
        self.refresh_steps()

    def wait(self):
        """The DPU fence: finish the update in flight and all-gather its
        params into every rank's tensors (zo_part_wait). Collective when an
        update is in flight: every rank calls it at the same point (the
        ranks agree on that, having made the same steps); a no-op without
        one, and always without delay_update."""
        if not self._in_flight:
            return None
        self.follow_params()        # the gather writes the params
        self._in_flight = False     # collected, or failed (the engine then refuses until a load)
        t0 = _now()
        res = self.pe.wait()
        self.timings["fence"] += _now() - t0
        self.refresh_steps()
        if res.get("boundary"):
            self._account(res)
        return res

    @property
    def loss_scale(self):
        return self.pe.loss_scale()

    def scaler_states(self):
        return [self.inner.scaler_state()]

    def set_scaler_states(self, states):
        self.inner.set_scaler_state(states[0])

    def memory(self):
        inf, pi = self.inner.info(), self.pe.info()
        sb = _state_elem_bytes(self.opt.state_format, self.opt.state_block)
        return {"grad_buffer_bytes": inf["grad_buffer_bytes"], "pinned_bytes": pi["pinned_bytes"],
                "host_bytes": pi["host_bytes"], "numel": pi["shard_numel"],
                "state_bytes": int(pi["shard_numel"] * (4 + sb * len(self.opt._state_names))),
                "state_host_bytes": pi["state_host_bytes"], "state_nvme_bytes": pi["state_nvme_bytes"],
                "nvme_read_bytes_total": inf["nvme_read_bytes_total"],
                "nvme_write_bytes_total": inf["nvme_write_bytes_total"],
                "rank": pi["rank"], "world": pi["world"], "model_numel": pi["numel"],
                "reduce_scatters": pi["reduce_scatters"], "buckets_in_grad": pi["buckets_in_grad"],
                "all_gathers": pi["all_gathers"], "device_bytes": pi["device_bytes"]}

    # -- state of one parameter: only this rank's piece is here
    def _not_here(self, what):
        raise NotImplementedError(
            "%s with process_group: this rank holds only its shard of the states; use "
            "opt.consolidated_state_dict() (torch's format, on one rank) or opt.state_dict() (this rank's "
            "shard)" % what)

    def export_state(self, i, name, out):
        self._not_here("optimizer.state[p][%r]" % name)

    def import_live(self, i, name, value):
        self._not_here("optimizer.state[p][%r] = ..." % name)

    def export_param(self, i):
        self._not_here("the state of one parameter")

    def import_param(self, i, s, p):
        """This rank's piece of a torch-format entry (states and master)."""
        own = self.owned(i)
        if own is None:
            return
        k, ioff, poff, n = own
        for nm in self.opt._state_names:
            if nm in s:
                v = torch.as_tensor(s[nm]).detach().to("cpu")
                if v.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    v = v.float()
                self.inner.import_state(k, nm, v.reshape(-1)[poff:poff + n].contiguous(), ioff)
        m = s.get("master_param")
        m = (m if m is not None else p).detach().to("cpu", torch.float32).reshape(-1)[poff:poff + n]
        self.inner.import_state(k, "master", m.contiguous(), ioff)

    def fill_state(self, i, name, value):
        own = self.owned(i)
        if own is not None:
            k, ioff, _, n = own
            self.inner.import_state(k, name, torch.full((n,), float(value)), ioff)

    # -- state dicts
    def rank_state(self, quantized=False):
        """This rank's shards: [{group, lo, master, <states>}] (fp32 copies;
        states in state_dtype). quantized: the moments as stored instead,
        per sub-group of the inner engine ("qsub": [{group, offset, numel,
        <state>_codes, <state>_absmax}]), the shards' masters only."""
        out = []
        for gi, (n, s, lo, hi, k) in enumerate(self.glayout):
            if k is None:
                continue
            e = {"group": gi, "lo": lo, "master": self.inner.export_state(k, "master", torch.empty(hi - lo))}
            if not quantized:
                for nm in self.opt._state_names:
                    e[nm] = self.inner.export_state(k, nm, torch.empty(hi - lo, dtype=self.opt.state_dtype))
            out.append(e)
        st = {"format": _STATE_FMT, "rank": self.rank, "world": self.world,
              "group_numel": [g[0] for g in self.glayout], "step": self.inner.info()["step"], "shards": out}
        if quantized:
            st["qsub"] = [self._qsub(k) for k in range(self.inner.info()["nsubgroups"])]
        return st

    def _qsub(self, k):
        qi = self.inner.qstate_info(k)
        e = {"group": qi["group"], "offset": qi["offset"], "numel": qi["numel"]}
        for nm in self.opt._state_names:
            e[nm + "_codes"], e[nm + "_absmax"] = self.inner.qstate_export(
                k, nm, torch.empty(qi["code_bytes"], dtype=torch.uint8), torch.empty(qi["nscales"], dtype=torch.float32))
        return e

    def qstate_meta(self):
        """state_dict(quantized=True)'s "qstate" record (torch.py's), from
        this rank's engine."""
        from .torch import _qstate_record
        return _qstate_record(self.opt, self.inner.qstate_info(0) if self.inner.info()["nsubgroups"] else None)

    def load_rank_state(self, part):
        if part.get("format") != _STATE_FMT:
            raise ValueError("not a partitioned optimizer state (format %r)" % (part.get("format"),))
        if part["world"] != self.world or part["rank"] != self.rank:
            raise ValueError("this state dict is rank %d of %d's shard; this optimizer is rank %d of %d (load a "
                             "consolidated_state_dict() to change the world size). A framework that saves "
                             "optimizer.state_dict() on rank 0 only and loads that file on every rank (Hugging "
                             "Face's Trainer does) keeps rank 0's shard alone: with process_group save with "
                             "opt.save(root) on every rank (or consolidated_state_dict()); under the Trainer "
                             "call zoffload.hf.attach(trainer) before train() (docs/pytorch.md, \"Many ranks\")"
                             % (part["rank"], part["world"], self.rank, self.world))
        if list(part["group_numel"]) != [g[0] for g in self.glayout]:
            raise ValueError("this state dict holds another model (group sizes %s, this optimizer's %s)"
                             % (list(part["group_numel"]), [g[0] for g in self.glayout]))
        shards = {e["group"]: e for e in part["shards"]}
        for gi, (n, s, lo, hi, k) in enumerate(self.glayout):
            if k is None:
                continue
            e = shards[gi]
            if e["lo"] != lo or e["master"].numel() != hi - lo:
                raise ValueError("group %d's shard is [%d, %d) here, the state dict's starts at %d with %d elements"
                                 % (gi, lo, hi, e["lo"], e["master"].numel()))
        qsub = part.get("qsub")
        if qsub is not None:
            # raw codes: the same engine layout, sub-group by sub-group
            nsg = self.inner.info()["nsubgroups"]
            if len(qsub) != nsg:
                raise ValueError("this state dict's raw states have %d sub-groups, this rank's engine %d (the same "
                                 "state_dtype, state_block and sub_group_size are needed; or load a state_dict() "
                                 "saved without quantized=True)" % (len(qsub), nsg))
            need = ["group", "offset", "numel"] + [nm + k for nm in self.opt._state_names
                                                   for k in ("_codes", "_absmax")]
            for k, e in enumerate(qsub):
                miss = [key for key in need if key not in e]
                if miss:
                    raise ValueError("raw states: sub-group %d lacks %s (state_dict(quantized=True) with "
                                     "process_group gives %s)" % (k, ", ".join(miss), ", ".join(need)))
                qi = self.inner.qstate_info(k)
                for key in ("group", "offset", "numel"):
                    if int(e[key]) != qi[key]:
                        raise ValueError("raw states: sub-group %d's %s is %d here, %d in the state dict (another "
                                         "sub_group_size or layout)" % (k, key, qi[key], int(e[key])))
                for nm in self.opt._state_names:
                    c, a = e[nm + "_codes"], e[nm + "_absmax"]
                    if c.numel() != qi["code_bytes"] or a.numel() != qi["nscales"]:
                        raise ValueError("raw states: sub-group %d's %s has %d code bytes and %d scales, this "
                                         "engine stores %d and %d (another state_dtype or state_block)"
                                         % (k, nm, c.numel(), a.numel(), qi["code_bytes"], qi["nscales"]))
        for gi, (n, s, lo, hi, k) in enumerate(self.glayout):
            if k is None:
                continue
            e = shards[gi]
            if qsub is None:
                for nm in self.opt._state_names:
                    self.inner.import_state(k, nm, e[nm].contiguous())
            self.inner.import_state(k, "master", e["master"].float().contiguous())
        for k, e in enumerate(qsub or ()):
            for nm in self.opt._state_names:
                self.inner.qstate_import(k, nm, e[nm + "_codes"].contiguous(), e[nm + "_absmax"].contiguous())
        self.set_steps([int(part["step"])] * len(self.tsteps))

    def consolidated(self, to_rank):
        """Collective: every group's flat masters and states gathered on
        `to_rank` (fp32); {(group, name): flat tensor} there, None elsewhere."""
        import torch.distributed as dist
        dst = _part.global_rank(self.group, to_rank)
        names = ("master",) + tuple(self.opt._state_names)
        out = {} if self.rank == to_rank else None
        for gi, (n, s, lo, hi, k) in enumerate(self.glayout):
            for nm in names:
                mine = torch.zeros(s)
                if k is not None:
                    self.inner.export_state(k, nm, mine[:hi - lo])
                parts = [torch.empty(s) for _ in range(self.world)] if out is not None else None
                dist.gather(mine, parts, dst=dst, group=self.group)
                if out is not None:
                    out[(gi, nm)] = torch.cat(parts)[:n]
        return out

    # -- checkpoints (every rank its own shard, part.h)
    def save(self, root, name, keep_last, user):
        import json
        self.follow_params()        # a save fences an update in flight: its gather writes the params
        self.pe.save(root, name, keep_last, json.dumps(user))

    def load(self, root, name):
        import json
        self.follow_params()        # the load gathers the loaded params
        txt = self.pe.load(root, name)
        return json.loads(txt) if txt else None

    def latest(self, root):
        from . import ckpt as _ckpt
        return _ckpt.latest(os.path.join(str(root), "rank%d" % self.rank))

    def close(self):
        self.inner = None
        self._in_flight = False     # an update in flight goes with the engine (zo_part_destroy)
        self.pe.close()


@contextlib.contextmanager
def no_sync(opt):
    """Gradients of the backward passes inside stay in .grad (torch adds
    them up) instead of going to the engine; the next backward outside (or
    step()) hands the sums over."""
    prev = opt._no_sync
    opt._no_sync = True
    try:
        yield
    finally:
        opt._no_sync = prev


def _now():
    import time
    return time.perf_counter()
