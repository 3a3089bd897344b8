# SPDX-License-Identifier: Apache-2.0
"""Memory-centric tiling (tiling.h) from Python: the planner and the tiled
linear operator ``zo_tiled_linear`` over a :class:`zoffload.store.Store`.

    from zoffload import tiling
    g = tiling.plan(batch=16, out_features=4096, in_features=4096, dtype="f32",
                    budget=64 << 20)            # {'tile_out': ..., 'work_bytes': ...}

:class:`TiledLinear` is the thin handle ``zoffload.torch.TiledLinear`` is
built on; it takes raw addresses ("device memory": host memory on the host
backend). See docs/tiling.md for the mechanism and docs/pytorch.md for the
module.
"""

import ctypes

from . import _lib
from . import arrays
from . import store as _store
from ._lib import lib, check, c_int, c_uint, c_u32, c_u64, c_void_p, c_char_p, c_size_t, P

TILE_TRAIN, TILE_RESIDENT, TILE_IN_PLACE = 1, 2, 4
#: dtypes the tiled operators take (W, x and dy)
DTYPES = {"f32": arrays.F32, "bf16": arrays.BF16}


class TileGrid(ctypes.Structure):
    _fields_ = [("batch", c_u64), ("out_features", c_u64), ("in_features", c_u64),
                ("dtype", c_int), ("flags", c_uint), ("tile_out", c_u32), ("tile_in", c_u32),
                ("tiles_out", c_u32), ("tiles_in", c_u32), ("tile_bytes", c_u64),
                ("work_bytes", c_u64)]

    def as_dict(self):
        return {f: getattr(self, f) for f, _ in self._fields_}


class TiledLinearConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("in_features", c_u64),
                ("out_features", c_u64), ("max_batch", c_u64), ("dtype", c_int), ("home", c_int),
                ("budget", c_u64), ("tile_out", c_u32), ("tile_in", c_u32), ("train", c_int),
                ("dw_sink", c_void_p), ("dw_sink_ctx", c_void_p), ("copy_tiles", c_int),
                ("backward_in_order", c_int), ("keep_last", c_int), ("read_ahead", ctypes.c_uint)]


class TileHostSink(ctypes.Structure):
    _fields_ = [("dw", c_void_p), ("ld", c_u64), ("accumulate", c_int)]


class TileWalkStats(ctypes.Structure):
    _fields_ = [("tiles", c_u64), ("fetch_bytes", c_u64), ("fetch_ns", c_u64), ("wait_ns", c_u64),
                ("in_place_tiles", c_u64), ("runs", c_u64), ("reads", c_u64), ("reused", c_u64),
                ("prefetched", c_u64), ("prefetch_skipped", c_u64), ("first_ns", c_u64),
                ("ahead_peak", c_u64)]


class DevInfo(ctypes.Structure):
    """zo_dev_info (dev.h): mirrored here for the device's memory in use."""
    _fields_ = [("kind", c_int), ("ordinal", c_int), ("name", ctypes.c_char * 96),
                ("total_mem", c_size_t), ("free_mem", c_size_t), ("pci_bus_id", ctypes.c_char * 32),
                ("numa_node", c_int), ("cc_major", c_int), ("cc_minor", c_int),
                ("copy_engines", c_int)]


_lib.register_structs({"zo_tiled_linear_config": (TiledLinearConfig, "zo_tiled_linear_config_default", ())},
                      {"zo_tile_grid": TileGrid, "zo_tile_host_sink": TileHostSink,
                       "zo_tile_walk_stats": TileWalkStats, "zo_dev_info": DevInfo})

_declared = False


def _declare():
    global _declared
    if _declared:
        return
    _store._declare()
    d = lib.declare
    d("zo_tile_plan", c_int, [c_u64, c_u64, c_u64, c_int, c_u64, c_uint, P(TileGrid)])
    d("zo_tile_grid_make", c_int, [c_u64, c_u64, c_u64, c_int, c_u32, c_u32, c_uint, P(TileGrid)])
    d("zo_tiled_linear_config_default", None, [c_void_p])
    d("zo_tiled_linear_create", c_int, [P(c_void_p), c_void_p, c_void_p, P(TiledLinearConfig)])
    d("zo_tiled_linear_destroy", None, [P(c_void_p)])
    d("zo_tiled_linear_grid", c_int, [c_void_p, P(TileGrid)])
    d("zo_tiled_linear_errmsg", c_char_p, [c_void_p])
    d("zo_tiled_linear_set_weight", c_int, [c_void_p, c_void_p, c_u64])
    d("zo_tiled_linear_get_weight", c_int, [c_void_p, c_void_p, c_u64])
    d("zo_tiled_linear_forward", c_int, [c_void_p, c_void_p, c_u64, c_void_p, c_void_p])
    d("zo_tiled_linear_backward", c_int, [c_void_p, c_void_p, c_void_p, c_u64, c_void_p, c_void_p])
    d("zo_tiled_linear_get_stats", None, [c_void_p, P(TileWalkStats)])
    d("zo_tile_sink_host", c_int, [c_void_p, c_void_p])
    d("zo_dev_get_info", c_int, [c_void_p, P(DevInfo)])
    _declared = True


def dtype_id(x):
    """The zo_dtype of "f32"/"bf16" (or torch.float32/torch.bfloat16, numpy
    float32); TypeError for any other type: the tiled operators take these two."""
    t = _store.dtype_id(x)
    if t not in DTYPES.values():
        raise TypeError("dtype %r: the tiled linear takes float32 or bfloat16" % (x,))
    return t


def _dims(batch, out_features, in_features):
    vals = []
    for name, v in (("batch", batch), ("out_features", out_features), ("in_features", in_features)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError("%s must be an integer, got %r" % (name, v))
        if v < 1:
            raise ValueError("%s must be at least 1, got %d" % (name, v))
        vals.append(v)
    return vals


def plan(batch, out_features, in_features, dtype="f32", budget=None, tile=None, train=True,
         in_place=False, resident=False):
    """The tile grid zo_tile_plan() (budget in bytes) or zo_tile_grid_make()
    (tile = (rows, cols)) gives, as a dict (tile_out, tile_in, tiles_out,
    tiles_in, tile_bytes, work_bytes, ...). in_place: the host backend's
    in-place fetch (no staging buffers). Raises BudgetError (ZO_EBUDGET) when
    the budget is below the smallest plan, InvalidArgument for bad shapes."""
    _declare()
    b, o, i = _dims(batch, out_features, in_features)
    t = dtype_id(dtype)
    flags = (TILE_TRAIN if train else 0) | (TILE_IN_PLACE if in_place else 0) | \
        (TILE_RESIDENT if resident else 0)
    g = TileGrid()
    if (budget is None) == (tile is None):
        raise ValueError("plan: give a budget (bytes) or a tile (rows, cols), one of them")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError("plan: budget must be a positive number of bytes, got %r" % (budget,))
        check(lib.zo_tile_plan(b, o, i, t, budget, flags, ctypes.byref(g)), "zo_tile_plan")
    else:
        rows, cols = _tile(tile)
        check(lib.zo_tile_grid_make(b, o, i, t, rows, cols, flags, ctypes.byref(g)),
              "zo_tile_grid_make")
    return g.as_dict()


def _tile(tile):
    try:
        rows, cols = tile
    except (TypeError, ValueError):
        raise ValueError("tile must be a pair (rows, cols), got %r" % (tile,)) from None
    for v in (rows, cols):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 1 << 32:
            raise ValueError("tile must be two integers in 1..2^32-1, got %r" % (tile,))
    return rows, cols


def device_bytes_in_use(device):
    """Bytes allocated on a :class:`zoffload.optim.Device` now (total - free:
    exact on the host backend, which counts its allocations)."""
    _declare()
    info = _lib.out_struct(DevInfo)
    check(lib.zo_dev_get_info(device.handle, ctypes.byref(info)), "zo_dev_get_info")
    return info.total_mem - info.free_mem


class TiledLinear(_lib.Handle):
    """A ``zo_tiled_linear``: y = x W^T + b with W a grid of tiles in `store`.

    store:      a :class:`zoffload.store.Store` over `device` (kept open by
                this object: close this one first);
    device:     the store's :class:`zoffload.optim.Device`;
    name:       store tensor prefix (tiles are "<name>.w.<r>.<c>");
    dtype:      "f32" or "bf16" (W, x and dy; y, dx, db and dW are f32);
    home:       "host" (pinned) or "nvme" (or "device");
    budget / tile: device working-memory budget in bytes, or (rows, cols);
    copy_tiles: copy every tile into the device buffers (on the host
                backend tiles in host memory are otherwise read in place).

    The addresses the calls take are device memory: host memory on the host
    backend. dW goes to a host matrix set with :meth:`backward`'s `dw`.
    """

    _destroy = "zo_tiled_linear_destroy"
    _what = "tiled linear"

    def __init__(self, store, device, name, in_features, out_features, max_batch, dtype="f32",
                 home="host", budget=None, tile=None, train=True, copy_tiles=False):
        _declare()
        b, o, i = _dims(max_batch, out_features, in_features)
        cfg = _lib.new_struct("zo_tiled_linear_config")
        self._name = str(name).encode()
        cfg.name = self._name
        cfg.in_features, cfg.out_features, cfg.max_batch = i, o, b
        cfg.dtype = dtype_id(dtype)
        cfg.home = _store.tier_id(home)
        if (budget is None) == (tile is None):
            raise ValueError("TiledLinear: give a budget (bytes) or a tile (rows, cols), one of them")
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise ValueError("TiledLinear: budget must be a positive number of bytes, got %r"
                                 % (budget,))
            cfg.budget = budget
        else:
            cfg.tile_out, cfg.tile_in = _tile(tile)
        cfg.train = 1 if train else 0
        cfg.copy_tiles = 1 if copy_tiles else 0
        # the ready-made host sink: dW tiles into a dense f32 host matrix
        # whose address backward() sets (the struct lives as long as we do)
        self._sink = TileHostSink()
        if train:
            cfg.dw_sink = ctypes.cast(lib.zo_tile_sink_host, c_void_p).value
            cfg.dw_sink_ctx = ctypes.addressof(self._sink)
        self._store = store
        self._dev = device
        self.in_features, self.out_features, self.max_batch = i, o, b
        self.dtype = cfg.dtype
        self.train = bool(train)
        self._h = c_void_p()
        check(lib.zo_tiled_linear_create(ctypes.byref(self._h), store._live(), device.handle,
                                         ctypes.byref(cfg)), "zo_tiled_linear_create")
        g = TileGrid()
        check(lib.zo_tiled_linear_grid(self._h, ctypes.byref(g)), "zo_tiled_linear_grid")
        self.grid = g.as_dict()

    def close(self):
        # The tiles are the store's tensors: once the store is gone they are
        # too, and destroying would unregister freed memory; leave it then.
        if self._h and self._store is not None and not self._store._h:
            self._h = c_void_p()
            return
        super().close()

    def _msg(self):
        return lib.zo_tiled_linear_errmsg(self._h).decode(errors="replace") if self._h else ""

    def _c(self, rc, fn):
        return check(rc, fn, self._msg)

    @property
    def in_place(self):
        """Whether tiles are read in place (host backend, copy_tiles False)."""
        return bool(self.grid["flags"] & TILE_IN_PLACE)

    def set_weight(self, addr, ld=None):
        """Store W (out x in, the dtype, row stride ld elements) from host memory."""
        self._c(lib.zo_tiled_linear_set_weight(self._live(), addr, ld or self.in_features),
                "zo_tiled_linear_set_weight")

    def get_weight(self, addr, ld=None):
        self._c(lib.zo_tiled_linear_get_weight(self._live(), addr, ld or self.in_features),
                "zo_tiled_linear_get_weight")

    def forward(self, x, batch, bias, y):
        """y (f32, batch x out) = x (dtype) W^T + bias (f32 or 0: none)."""
        self._c(lib.zo_tiled_linear_forward(self._live(), x, batch, bias or None, y),
                "zo_tiled_linear_forward")

    def backward(self, x, dy, batch, dx=None, db=None, dw=None, accumulate=False):
        """dx (f32, batch x in) = dy W, db (f32, out) = column sums of dy,
        dW (f32, out x in, at host address dw) = dy^T x, added to what is
        there with accumulate. Each output optional (0/None: not wanted)."""
        h = self._live()
        if dw and not self.train:
            raise ValueError("TiledLinear.backward: dW asked of an operator created with train=False")
        self._sink.dw = dw or None
        self._sink.ld = self.in_features
        self._sink.accumulate = 1 if accumulate else 0
        if self.train and not dw:
            raise ValueError("TiledLinear.backward: dw (an out x in f32 host matrix) is required "
                             "with train=True (its sink writes every dW tile)")
        self._c(lib.zo_tiled_linear_backward(h, x, dy, batch, dx or None, db or None),
                "zo_tiled_linear_backward")

    def stats(self):
        st = _lib.out_struct(TileWalkStats)
        lib.zo_tiled_linear_get_stats(self._live(), ctypes.byref(st))
        return {f: getattr(st, f) for f, _ in TileWalkStats._fields_}
