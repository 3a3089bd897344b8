# SPDX-License-Identifier: Apache-2.0
"""``zoffload.torch.TiledLinear``: a drop-in for ``torch.nn.Linear`` whose
forward and backward run through libzoffload's tiled linear
(``zo_tiled_linear``): the weight is kept in the tiered store as a grid of
tiles (pinned host memory or NVMe) and streamed through a device working
memory of at most `budget` bytes, tile k+1 fetched while tile k computes.

    from zoffload.torch import TiledLinear
    layer = TiledLinear(12288, 49152, bias=True, dtype=torch.bfloat16,
                        budget=256 << 20)            # or tile=(1024, 12288)
    y = layer(x)                                     # x [..., 12288]
    y.sum().backward()                               # layer.weight.grad, .bias.grad

It is an ``nn.Linear`` (a subclass): the same constructor arguments, the
same ``weight`` and ``bias`` Parameters, so ``state_dict`` is nn.Linear's
and torch.optim or ``zoffload.torch.OffloadAdamW`` update it as usual. The
store's tiles are refreshed from ``weight`` at the first forward after a
backward (an optimizer step may have written it, by whatever means), and
whenever its version counter moved (in-place updates, load_state_dict), so
a training step costs one copy of W into the store. A write that does
neither (``weight.data`` changed outside training) needs
:meth:`TiledLinear.weight_changed`.

Runs on the host backend (CPU tensors: libzoffload's "device memory" is
host memory there); the budget bounds the operator's working memory, which
is allocated once. See docs/pytorch.md (TiledLinear) and docs/tiling.md.
"""

import itertools
import threading

import torch

from . import tiling as _tiling
from . import store as _store

__all__ = ["TiledLinear", "DEFAULT_BUDGET"]

#: budget used when neither `budget` nor `tile` is given
DEFAULT_BUDGET = 64 << 20

_ZO_DT = {torch.float32: "f32", torch.bfloat16: "bf16"}
_ids = itertools.count()


def _addr(t):
    return t.data_ptr() if t is not None and t.numel() else 0


class _Backend:
    """The C side of one TiledLinear: its device, store (and swap store),
    and the zo_tiled_linear handle, closed in that reverse order."""

    def __init__(self, mod, dtype):
        self.dtype = dtype
        self.lock = threading.Lock()
        self.synced = None
        self.swap = None
        self.own_store = mod._zo_store is None
        dev = mod._zo_device
        self.own_dev = dev is None
        if dev is None:
            from .optim import Device
            dev = Device("host")
        self.dev = dev
        zdt = _ZO_DT[dtype]
        esz = 4 if zdt == "f32" else 2
        name = "%s%d" % (mod._zo_name, next(_ids))
        try:
            if self.own_store:
                self.store = self._make_store(mod, zdt, esz, name)
            else:
                self.store = mod._zo_store
            self.op = _tiling.TiledLinear(
                self.store, dev, name, mod.in_features, mod.out_features, mod.max_batch,
                dtype=zdt, home=mod.home, budget=mod.budget, tile=mod.tile,
                copy_tiles=mod.copy_tiles)
        except BaseException:
            self.close()
            raise

    def _make_store(self, mod, zdt, esz, name):
        in_place = not mod.copy_tiles
        if mod.home == "host":
            g = _tiling.plan(mod.max_batch, mod.out_features, mod.in_features, zdt,
                             budget=mod.budget, tile=mod.tile, in_place=in_place)
            # the host tier holds the tiles' home copies, nothing else
            shapes = []
            for r in range(g["tiles_out"]):
                rows = min(g["tile_out"], mod.out_features - r * g["tile_out"])
                for c in range(g["tiles_in"]):
                    cols = min(g["tile_in"], mod.in_features - c * g["tile_in"])
                    shapes.append(((rows, cols), zdt))
            exact, _ = _store.tier_bytes_needed("host", shapes)
            return _store.Store(device=self.dev, host_bytes=exact, slot_size=1 << 20, slots=4,
                                trace="off")
        # NVMe: a swap store in nvme_path; tiles stream through the pool
        # (room for W twice over: tiles round up to the swap chunk, and an
        # in-place grid is cut finer than the plan above)
        wbytes = mod.out_features * mod.in_features * esz
        chunk = 1 << 20
        arena = (2 * wbytes + (32 << 20) + chunk - 1) // chunk * chunk
        self.swap = _store.Swap([mod.nvme_path], arena_size=arena, chunk_size=chunk)
        return _store.Store(device=self.dev, swap=self.swap, slot_size=4 << 20, slots=8, trace="off")

    def sync_weight(self, w):
        """Write W into the tiles if it changed since the last time."""
        key = (w.data_ptr(), w._version, w.dtype)
        if key == self.synced:
            return
        wc = w.detach().contiguous()
        self.op.set_weight(wc.data_ptr(), self.op.in_features)
        self.synced = key

    def close(self):
        op = getattr(self, "op", None)
        if op is not None:
            op.close()
            self.op = None
        if self.own_store and getattr(self, "store", None) is not None:
            self.store.close()
        self.store = None
        if self.swap is not None:
            self.swap.close()
            self.swap = None
        if self.own_dev and getattr(self, "dev", None) is not None:
            self.dev.close()
        self.dev = None


class _TiledLinearFn(torch.autograd.Function):
    """y = x W^T + b through zo_tiled_linear, in chunks of max_batch rows."""

    @staticmethod
    def forward(ctx, x2, weight, bias, be, max_batch):
        n = x2.shape[0]
        out = weight.shape[0]
        y = torch.empty((n, out), dtype=torch.float32)
        b32 = None
        if bias is not None:
            b32 = bias.detach().to(torch.float32).contiguous()
        with be.lock:
            be.sync_weight(weight)
            for c0 in range(0, n, max_batch):
                c1 = min(n, c0 + max_batch)
                be.op.forward(_addr(x2[c0:c1]), c1 - c0, _addr(b32), _addr(y[c0:c1]))
        ctx.be, ctx.max_batch = be, max_batch
        ctx.save_for_backward(x2, weight, bias)
        return y.to(weight.dtype)

    @staticmethod
    def backward(ctx, gy):
        x2, weight, bias = ctx.saved_tensors
        be, mb = ctx.be, ctx.max_batch
        if be.op is None:
            raise RuntimeError("TiledLinear: backward after the module was closed")
        n, inf = x2.shape
        out = weight.shape[0]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dy = gy.to(weight.dtype).contiguous()
        dx = torch.empty((n, inf), dtype=torch.float32) if need_x else None
        db = torch.zeros(out, dtype=torch.float32) if need_b and bias is not None else None
        db_k = torch.empty(out, dtype=torch.float32) if db is not None else None
        dw = torch.empty((out, inf), dtype=torch.float32)  # the sink always writes dW
        with be.lock:
            # the tiles still hold the W of forward: autograd has checked
            # weight's version against the saved one
            be.sync_weight(weight)
            for k, c0 in enumerate(range(0, n, mb)):
                c1 = min(n, c0 + mb)
                be.op.backward(_addr(x2[c0:c1]), _addr(dy[c0:c1]), c1 - c0,
                               dx=_addr(dx[c0:c1]) if dx is not None else 0,
                               db=_addr(db_k), dw=dw.data_ptr(), accumulate=k > 0)
                if db is not None:
                    db += db_k
            # an optimizer step may follow and write the weight by any
            # means (p.data.copy_ does not move the version counter):
            # the next forward refreshes the tiles
            be.synced = None
        gx = dx.to(x2.dtype) if dx is not None else None
        gw = dw.to(weight.dtype) if need_w else None
        gb = db.to(bias.dtype) if db is not None else None
        return gx, gw, gb, None, None


class TiledLinear(torch.nn.Linear):
    """``torch.nn.Linear(in_features, out_features, bias=True, device=None,
    dtype=None)`` computed by libzoffload's tiled linear.

    Extra keyword arguments:

    budget:     device working-memory budget in bytes: the tile grid is
                chosen from it (zo_tile_plan); default DEFAULT_BUDGET when
                no tile is given either;
    tile:       (rows, cols) of a weight tile instead of a budget;
    max_batch:  most rows of x per operator call (default 1024; larger
                inputs run in chunks of it); its ones vectors are part of
                the working memory;
    home:       "host" (pinned host memory, default) or "nvme": where the
                weight tiles live;
    nvme_path:  directory for the swap store with home "nvme";
    copy_tiles: copy each tile into the device buffers (the GPU's path)
                instead of reading it in place (the host backend's default);
    zo_store, zo_device: a :class:`zoffload.store.Store` and its
                :class:`zoffload.optim.Device` to share (default: the
                module makes its own; close the module before the store).

    ``weight`` and ``bias`` are ordinary Parameters (CPU tensors, float32
    or bfloat16); inputs are CPU tensors of the same dtype, of any shape
    [..., in_features].
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *,
                 budget=None, tile=None, max_batch=1024, home="host", nvme_path=None,
                 copy_tiles=False, zo_store=None, zo_device=None):
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError("TiledLinear: device %r: its parameters are CPU tensors (the host "
                             "backend computes on them)" % (device,))
        for nm, v in (("in_features", in_features), ("out_features", out_features),
                      ("max_batch", max_batch)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError("TiledLinear: %s must be a positive integer, got %r" % (nm, v))
        if dtype is not None and dtype not in _ZO_DT:
            raise TypeError("TiledLinear: dtype %s: float32 or bfloat16" % (dtype,))
        if budget is not None and tile is not None:
            raise ValueError("TiledLinear: give budget or tile, not both")
        if budget is None and tile is None:
            budget = DEFAULT_BUDGET
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or budget < 1):
            raise ValueError("TiledLinear: budget must be a positive number of bytes, got %r"
                             % (budget,))
        if tile is not None:
            _tiling._tile(tile)
            tile = tuple(tile)
        if home not in ("host", "nvme"):
            raise ValueError("TiledLinear: home %r: 'host' or 'nvme'" % (home,))
        if home == "nvme" and not nvme_path and zo_store is None:
            raise ValueError("TiledLinear: home 'nvme' needs nvme_path (a directory) or a zo_store")
        if (zo_store is None) != (zo_device is None):
            raise ValueError("TiledLinear: zo_store and zo_device go together (the store's device)")
        if zo_device is not None and str(getattr(zo_device, "kind", "host")) != "host":
            raise ValueError("TiledLinear: zo_device of kind %r: the module runs on the host "
                             "backend (CPU tensors)" % (zo_device.kind,))
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.budget, self.tile, self.max_batch = budget, tile, max_batch
        self.home, self.nvme_path, self.copy_tiles = home, nvme_path, bool(copy_tiles)
        self._zo_store, self._zo_device = zo_store, zo_device
        self._zo_name = "tiled"
        self._be = None
        # fail here, not at the first forward, for a budget that cannot plan
        _tiling.plan(max_batch, out_features, in_features, _ZO_DT[self.weight.dtype],
                     budget=budget, tile=tile, in_place=not copy_tiles and home == "host")
        self._backend()

    # ------------------------------------------------------------- C side
    def _backend(self):
        dt = self.weight.dtype
        if dt not in _ZO_DT:
            raise TypeError("TiledLinear: weight dtype %s: float32 or bfloat16 (convert the "
                            "module with .float() or .bfloat16())" % (dt,))
        if self.weight.device.type != "cpu":
            raise RuntimeError("TiledLinear: the weight is on %s: the module computes on CPU "
                               "tensors" % (self.weight.device,))
        if self._be is None or self._be.dtype != dt:
            self._close_backend()
            self._be = _Backend(self, dt)
        return self._be

    def _close_backend(self):
        if self._be is not None:
            self._be.close()
            self._be = None

    @property
    def grid(self):
        """The tile grid in use (dict: tile_out, tile_in, tiles_out,
        tiles_in, tile_bytes, work_bytes, flags...)."""
        return dict(self._backend().op.grid)

    @property
    def zo_device(self):
        """The :class:`zoffload.optim.Device` the operator allocates on."""
        return self._backend().dev

    def weight_changed(self):
        """Refresh the tiles from ``weight`` at the next forward (for a
        write the module cannot see: through ``weight.data`` or numpy,
        outside a training step)."""
        if self._be is not None:
            self._be.synced = None

    def tile_stats(self):
        """The walker's counters (tiles, fetch_bytes, in_place_tiles, ...)."""
        return self._backend().op.stats()

    def close(self):
        """Free the operator, its store and device (also done on collection)."""
        self._close_backend()

    def __del__(self):
        try:
            self._close_backend()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def __getstate__(self):
        st = self.__dict__.copy()
        st["_be"] = None    # C handles do not travel: rebuilt on first use
        return st

    def extra_repr(self):
        s = super().extra_repr()
        s += ", budget=%s" % self.budget if self.tile is None else ", tile=%s" % (self.tile,)
        return s + ", home=%s" % self.home

    # ------------------------------------------------------------ compute
    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError("TiledLinear: input must be a torch.Tensor, got %s" % type(x).__name__)
        if x.device.type != "cpu":
            raise RuntimeError("TiledLinear: input on %s: CPU tensors only" % (x.device,))
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise RuntimeError("TiledLinear: input of shape %s: the last dimension must be "
                               "in_features = %d" % (tuple(x.shape), self.in_features))
        if x.dtype != self.weight.dtype:
            raise RuntimeError("TiledLinear: input dtype %s differs from the weight's %s"
                               % (x.dtype, self.weight.dtype))
        if self.bias is not None and self.bias.dtype != self.weight.dtype:
            raise RuntimeError("TiledLinear: bias dtype %s differs from the weight's %s"
                               % (self.bias.dtype, self.weight.dtype))
        be = self._backend()
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()
        if x2.shape[0] == 0:
            # nothing to run; keep the graph (zero gradients) as nn.Linear does
            return torch.nn.functional.linear(x, self.weight, self.bias)
        y = _TiledLinearFn.apply(x2, self.weight, self.bias, be, self.max_batch)
        return y.reshape(*lead, self.out_features)
