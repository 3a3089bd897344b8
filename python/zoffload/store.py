# SPDX-License-Identifier: Apache-2.0
"""The tiered store (store.h, ``zo_store``) and the swap store it puts its
NVMe tier on (swap.h, ``zo_swap``), from Python.

A :class:`Store` keeps every registered tensor in a *home* tier (pinned
host memory or NVMe) and makes copies resident in the device or host tier
on :meth:`Store.acquire`, within each tier's byte budget, with
trace-driven prefetch (the order of the first iteration's acquires drives
loads ahead of need afterwards; :meth:`Store.step` marks iterations).
See docs/store.md for the semantics; this module is a thin layer: every
call is the C call, errors are :class:`zoffload.ZoError` subclasses
carrying the store's detail message.

Example (host backend as the device, NVMe home in a directory)::

    from zoffload.store import Store, Swap
    from zoffload.optim import Device
    import numpy as np
    dev, swap = Device("host"), Swap(["/tmp/zo"], arena_size=16 << 20)
    st = Store(device=dev, device_bytes=8 << 20, host_bytes=0, swap=swap)
    t = st.register("w", (1024,), "f32", home="nvme")
    st.write(t, np.arange(1024, dtype=np.float32))
    addr = st.acquire(t, "device").wait()     # device address (host memory here)
    st.release(t, "device")

Objects are released in the right order whatever the collector does: a
store keeps its device and swap store open until it is closed.
"""

import ctypes
import weakref

from . import _lib
from . import arrays
from ._lib import lib, check, c_int, c_uint, c_size_t, c_u64, c_void_p, c_char_p, P

TIER_DEVICE, TIER_HOST, TIER_NVME = 0, 1, 2
TIERS = {"device": TIER_DEVICE, "host": TIER_HOST, "nvme": TIER_NVME}
TIER_NAMES = {v: k for k, v in TIERS.items()}
TRACE_OFF, TRACE_AUTO = 0, 1
TRACES = {"off": TRACE_OFF, "auto": TRACE_AUTO}
ACQ_WRITE, ACQ_DISCARD = 1, 2
REL_WRITEBACK, REL_DROP = 1, 2
COPY_STATES = {0: "absent", 1: "inflight", 2: "resident"}
CSUM = {"none": 0, "crc32c": 1, "xxh3": 2}
PIN_HUGE, PIN_NO_LOCK, PIN_REQUIRE, PIN_NO_FAULT = 1, 2, 4, 8
ZO_PENDING = 1
MAX_DIMS = 8
NTIERS = 3

_DTYPES = {"f32": arrays.F32, "float32": arrays.F32, "f16": arrays.F16, "float16": arrays.F16,
           "bf16": arrays.BF16, "bfloat16": arrays.BF16, "f64": arrays.F64, "float64": arrays.F64,
           "u8": arrays.U8, "uint8": arrays.U8, "i32": arrays.I32, "int32": arrays.I32}


def dtype_id(x):
    """The zo_dtype of a name ("f32", "bfloat16"), a torch or numpy dtype, or an int."""
    if isinstance(x, int):
        if x not in arrays.DTYPE_NAMES:
            raise ValueError("dtype %d: not a zo_dtype" % x)
        return x
    s = str(getattr(x, "name", x)).replace("torch.", "")
    if s not in _DTYPES:
        raise TypeError("dtype %r: one of %s" % (x, ", ".join(sorted(_DTYPES))))
    return _DTYPES[s]


def tier_id(x):
    """The zo_tier of "device" / "host" / "nvme" (or an int)."""
    if isinstance(x, int):
        if x not in TIER_NAMES:
            raise ValueError("tier %d: 0 (device), 1 (host) or 2 (nvme)" % x)
        return x
    if x not in TIERS:
        raise ValueError("tier %r: 'device', 'host' or 'nvme'" % (x,))
    return TIERS[x]


# ---------------------------------------------------------------- structures
class SwapConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("dirs", P(c_char_p)), ("ndirs", c_uint),
                ("arena_size", c_u64), ("reserve", c_u64), ("max_bytes", c_u64),
                ("chunk_size", c_size_t), ("checksum", c_int), ("keep_files", c_int),
                ("buffered", c_int), ("aio", c_void_p), ("aio_cfg", c_void_p),
                ("csum_threads", c_uint)]


class SwapInfo(ctypes.Structure):
    _fields_ = [("chunk_size", c_size_t), ("ndirs", c_uint), ("checksum", c_int),
                ("io_align", ctypes.c_uint32), ("direct", c_int), ("fallback", ctypes.c_char * 128)]


class StoreConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("dev", c_void_p), ("device_bytes", c_u64),
                ("host_bytes", c_u64), ("swap", c_void_p), ("nvme_bytes", c_u64),
                ("slot_size", c_size_t), ("slots", c_uint), ("numa_node", c_int),
                ("pin_flags", c_uint), ("trace", c_int), ("lookahead", c_uint),
                ("prefetch_bytes", c_u64)]


class TensorDesc(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("dtype", c_int),
                ("ndim", c_uint), ("shape", c_u64 * MAX_DIMS), ("bytes", c_u64), ("home", c_int)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_uint),
                ("shape", c_u64 * MAX_DIMS), ("bytes", c_u64), ("home", c_int),
                ("state", c_int * NTIERS), ("refs", c_uint * NTIERS), ("dirty", c_int * NTIERS)]


class TierNeed(ctypes.Structure):
    _fields_ = [("exact", c_u64), ("any_layout", c_u64)]


class StoreStats(ctypes.Structure):
    _fields_ = [("budget", c_u64 * NTIERS), ("used", c_u64 * NTIERS), ("peak", c_u64 * NTIERS),
                ("moved", (c_u64 * NTIERS) * NTIERS), ("demand_bytes", c_u64),
                ("prefetch_bytes", c_u64), ("hits", c_u64), ("misses", c_u64),
                ("prefetch_issued", c_u64), ("prefetch_used", c_u64),
                ("prefetch_dropped", c_u64), ("prefetch_wasted", c_u64),
                ("evictions", c_u64), ("writebacks", c_u64), ("writeback_bytes", c_u64),
                ("stalls", c_u64), ("stall_ns", c_u64), ("trace_len", c_u64),
                ("trace_records", c_u64), ("trace_mismatches", c_u64),
                ("pool_slots", c_size_t), ("pool_slot_size", c_size_t),
                ("pool_in_use", c_size_t), ("pool_peak", c_size_t), ("pinned_bytes", c_u64),
                ("pool_locked", c_int), ("pool_aio_fixed", c_int),
                ("pool_dev_registered", c_int), ("frag_failures", c_u64)]


_SIZED = {
    "zo_swap_config": (SwapConfig, "zo_swap_config_default", ()),
    "zo_store_config": (StoreConfig, "zo_store_config_default", ()),
    "zo_tensor_desc": (TensorDesc, "zo_tensor_desc_default", ()),
}
# the store is in every library these bindings load
_lib.register_structs(_SIZED, {"zo_swap_info": SwapInfo, "zo_tensor_info": TensorInfo,
                               "zo_store_tier_need": TierNeed, "zo_store_stats": StoreStats})

_declared = False


def _declare():
    global _declared
    if _declared:
        return
    d = lib.declare
    d("zo_swap_config_default", None, [c_void_p])
    d("zo_swap_create", c_int, [P(c_void_p), P(SwapConfig)])
    d("zo_swap_destroy", None, [P(c_void_p)])
    d("zo_swap_errmsg", c_char_p, [c_void_p])
    d("zo_swap_get_info", c_int, [c_void_p, P(SwapInfo)])
    d("zo_tier_name", c_char_p, [c_int])
    d("zo_tier_parse", c_int, [c_char_p, P(c_int)])
    d("zo_store_config_default", None, [c_void_p])
    d("zo_store_create", c_int, [P(c_void_p), P(StoreConfig)])
    d("zo_store_destroy", None, [P(c_void_p)])
    d("zo_store_errmsg", c_char_p, [c_void_p])
    d("zo_tensor_desc_default", None, [c_void_p])
    d("zo_store_register", c_int, [c_void_p, P(TensorDesc), P(c_void_p)])
    d("zo_store_unregister", c_int, [c_void_p, P(c_void_p)])
    d("zo_store_find", c_int, [c_void_p, c_char_p, P(c_void_p)])
    d("zo_store_tensor_info", c_int, [c_void_p, c_void_p, P(TensorInfo)])
    d("zo_store_acquire", c_int, [c_void_p, c_void_p, c_int, c_uint, P(c_void_p)])
    d("zo_store_wait", c_int, [c_void_p, c_void_p, P(c_void_p)])
    d("zo_store_test", c_int, [c_void_p, c_void_p, P(c_void_p)])
    d("zo_store_release", c_int, [c_void_p, c_void_p, c_int, c_uint])
    d("zo_store_prefetch", c_int, [c_void_p, c_void_p, c_int])
    d("zo_store_flush", c_int, [c_void_p, c_void_p])
    d("zo_store_step", c_int, [c_void_p])
    d("zo_store_set_trace", c_int, [c_void_p, c_int])
    d("zo_store_tier_bytes_needed", c_int, [c_void_p, c_int, P(P(TensorDesc)), c_size_t,
                                            P(TierNeed)])
    d("zo_store_read", c_int, [c_void_p, c_void_p, c_u64, c_void_p, c_size_t])
    d("zo_store_write", c_int, [c_void_p, c_void_p, c_u64, c_void_p, c_size_t])
    d("zo_store_checkpoint", c_int, [c_void_p, c_char_p, c_char_p, P(c_void_p), c_uint, c_uint,
                                     c_char_p])
    d("zo_store_restore", c_int, [c_void_p, c_char_p, c_char_p])
    d("zo_store_get_stats", None, [c_void_p, P(StoreStats)])
    d("zo_store_reset_stats", None, [c_void_p])
    _declared = True


def _set_fields(cfg, kw, what, forbidden=()):
    for k, v in kw.items():
        if k.startswith("_") or k == "struct_size" or k in forbidden or not hasattr(cfg, k):
            raise TypeError("%s: unknown or reserved config field %r" % (what, k))
        if v is None:
            continue
        if isinstance(v, bool):
            v = int(v)
        if not isinstance(v, int):
            raise TypeError("%s: %s must be an integer, got %r" % (what, k, v))
        if v < 0 and k not in ("numa_node",):
            raise ValueError("%s: %s must not be negative (%d)" % (what, k, v))
        setattr(cfg, k, v)


class Swap(_lib.SharedHandle):
    """A ``zo_swap``: arena files in `dirs` (existing real directories, not
    symbolic links), the NVMe tier of a :class:`Store`.

    Keywords are zo_swap_config fields: arena_size, reserve, max_bytes,
    chunk_size, checksum ("crc32c", "xxh3", "none"), keep_files, buffered,
    csum_threads. A small arena_size keeps tests from reserving 1 GiB."""

    _destroy = "zo_swap_destroy"
    _what = "swap store"

    def __init__(self, dirs, **kw):
        _declare()
        if isinstance(dirs, (str, bytes)) or hasattr(dirs, "__fspath__"):
            dirs = [dirs]
        enc = [(d if isinstance(d, bytes) else str(d).encode()) for d in dirs]
        if not enc:
            raise ValueError("Swap: no directory given")
        cfg = _lib.new_struct("zo_swap_config")
        cs = kw.pop("checksum", None)
        if cs is not None:
            if cs not in CSUM:
                raise ValueError("Swap: checksum %r: one of %s" % (cs, ", ".join(CSUM)))
            cfg.checksum = CSUM[cs]
        _set_fields(cfg, kw, "Swap", forbidden=("dirs", "ndirs", "aio", "aio_cfg"))
        arr = (c_char_p * len(enc))(*enc)
        cfg.dirs = arr
        cfg.ndirs = len(enc)
        self._h = c_void_p()
        check(lib.zo_swap_create(ctypes.byref(self._h), ctypes.byref(cfg)), "zo_swap_create")
        self.dirs = [e.decode() for e in enc]

    @property
    def handle(self):
        return self._live()

    def info(self):
        i = _lib.out_struct(SwapInfo)
        check(lib.zo_swap_get_info(self._live(), ctypes.byref(i)), "zo_swap_get_info")
        return {"chunk_size": i.chunk_size, "ndirs": i.ndirs, "checksum": i.checksum,
                "io_align": i.io_align, "direct": bool(i.direct),
                "fallback": i.fallback.decode(errors="replace")}


class Tensor:
    """A tensor registered in a :class:`Store` (a ``zo_tensor *``). Valid
    until unregistered or the store is closed; using it afterwards raises
    ValueError instead of touching freed memory."""

    __slots__ = ("_h", "_store", "name", "shape", "dtype", "nbytes", "home", "__weakref__")

    def __init__(self, h, store, name, shape, dtype, nbytes, home):
        self._h = h
        self._store = weakref.ref(store)
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self.nbytes = nbytes
        self.home = home

    def _live(self, store):
        if not self._h or self._store() is not store:
            raise ValueError("tensor %r is not registered in this store (unregistered, closed, "
                             "or another store's)" % self.name)
        return self._h

    def __repr__(self):
        return "Tensor(%r, shape=%s, dtype=%s, %d bytes, home=%s)" % (
            self.name, self.shape, arrays.DTYPE_NAMES.get(self.dtype), self.nbytes,
            TIER_NAMES.get(self.home))


class Request:
    """A pending acquire (a ``zo_store_req``): :meth:`wait` blocks and
    returns the copy's address (an int; a device pointer for the device
    tier), :meth:`test` polls. Either consumes the request once it is done."""

    __slots__ = ("_r", "_store", "tensor", "tier")

    def __init__(self, r, store, tensor, tier):
        self._r = r
        self._store = store
        self.tensor = tensor
        self.tier = tier

    def wait(self):
        if not self._r:
            raise ValueError("request already completed")
        st = self._store
        ptr = c_void_p()
        r, self._r = self._r, c_void_p()
        st._pending.pop(id(self), None)
        st._c(lib.zo_store_wait(st._live(), r, ctypes.byref(ptr)), "zo_store_wait")
        return ptr.value or 0

    def test(self):
        """The address once done (the request is then consumed), None while pending."""
        if not self._r:
            raise ValueError("request already completed")
        st = self._store
        ptr = c_void_p()
        rc = lib.zo_store_test(st._live(), self._r, ctypes.byref(ptr))
        if rc == ZO_PENDING:
            return None
        self._r = c_void_p()
        st._pending.pop(id(self), None)
        st._c(rc, "zo_store_test")
        return ptr.value or 0

    @property
    def done(self):
        return not self._r


def _desc(name, shape, dtype, nbytes=None, home="nvme"):
    _declare()
    d = _lib.new_struct("zo_tensor_desc")
    enc = str(name).encode()
    d.name = enc
    d.dtype = dtype_id(dtype)
    shape = tuple(int(x) for x in shape)
    if len(shape) > MAX_DIMS:
        raise ValueError("tensor %r: %d dimensions, at most %d" % (name, len(shape), MAX_DIMS))
    d.ndim = len(shape)
    for i, n in enumerate(shape):
        if n < 0:
            raise ValueError("tensor %r: negative dimension %d" % (name, n))
        d.shape[i] = n
    d.bytes = int(nbytes or 0)
    d.home = tier_id(home)
    return d, enc


class Store(_lib.Handle):
    """A ``zo_store``.

    device:       a :class:`zoffload.optim.Device` (None: no device tier);
    device_bytes, host_bytes, nvme_bytes: tier budgets (0: no such tier;
                  nvme_bytes 0: what the swap store gives);
    swap:         a :class:`Swap` (None: no NVMe tier);
    trace:        "auto" (record the first iteration, prefetch after) or "off";
    other keywords: zo_store_config fields (slot_size, slots, numa_node,
                  pin_flags, lookahead, prefetch_bytes).
    """

    _destroy = "zo_store_destroy"
    _what = "store"

    def __init__(self, device=None, device_bytes=0, host_bytes=0, swap=None, nvme_bytes=0,
                 trace="auto", **kw):
        _declare()
        cfg = self._config(device, device_bytes, host_bytes, swap, nvme_bytes, trace, kw)
        self._pending = {}
        self._tensors = {}
        self._h = c_void_p()
        check(lib.zo_store_create(ctypes.byref(self._h), ctypes.byref(cfg)), "zo_store_create")
        self._dev, self._swap = device, swap
        for o in (device, swap):
            if o is not None:
                o._users += 1
        self.config = {k: getattr(cfg, k) for k, _ in StoreConfig._fields_
                       if k not in ("struct_size", "dev", "swap")}

    @staticmethod
    def _config(device, device_bytes, host_bytes, swap, nvme_bytes, trace, kw):
        _declare()
        cfg = _lib.new_struct("zo_store_config")
        if trace not in TRACES:
            raise ValueError("Store: trace %r: 'auto' or 'off'" % (trace,))
        cfg.trace = TRACES[trace]
        if device is not None:
            cfg.dev = device.handle
        if swap is not None:
            cfg.swap = swap.handle
        _set_fields(cfg, dict(kw, device_bytes=device_bytes, host_bytes=host_bytes,
                              nvme_bytes=nvme_bytes), "Store", forbidden=("dev", "swap", "trace"))
        return cfg

    def _msg(self):
        return lib.zo_store_errmsg(self._h).decode(errors="replace") if self._h else ""

    def _c(self, rc, fn):
        return check(rc, fn, self._msg)

    def close(self):
        """Destroy the store (every tensor handle becomes invalid; dirty
        copies are not written back: flush() first), then let go of its
        device and swap store. Requests not yet waited for are waited."""
        if not self._h:
            return
        for req in list(self._pending.values()):
            try:
                req.wait()
            except Exception:  # closing: the failure of an abandoned load is moot
                pass
        for t in list(self._tensors.values()):
            t._h = None
        self._tensors.clear()
        super().close()
        for o in (self._dev, self._swap):
            if o is not None:
                o._release()
        self._dev = self._swap = None

    # ---------------------------------------------------------- tensors
    def register(self, name, shape, dtype="f32", home="nvme", nbytes=None):
        """Register a tensor (contents zero) and return its :class:`Tensor`."""
        d, enc = _desc(name, shape, dtype, nbytes, home)
        h = c_void_p()
        self._c(lib.zo_store_register(self._live(), ctypes.byref(d), ctypes.byref(h)),
                "zo_store_register")
        info = self._info_h(h)
        t = Tensor(h, self, str(name), shape, d.dtype, info.bytes, d.home)
        self._tensors[t.name] = t
        return t

    def unregister(self, t):
        h = t._live(self)
        self._c(lib.zo_store_unregister(self._live(), ctypes.byref(h)), "zo_store_unregister")
        t._h = None
        self._tensors.pop(t.name, None)

    def find(self, name):
        """The Tensor registered under name; KeyError if none."""
        t = self._tensors.get(str(name))
        if t is None:
            raise KeyError("no tensor %r in the store" % (name,))
        return t

    def __contains__(self, name):
        return str(name) in self._tensors

    def _info_h(self, h):
        i = _lib.out_struct(TensorInfo)
        self._c(lib.zo_store_tensor_info(self._live(), h, ctypes.byref(i)), "zo_store_tensor_info")
        return i

    def info(self, t):
        """A dict: name, bytes, home, and per tier ("device", "host", "nvme")
        the copy's state ("absent", "inflight", "resident"), refs and dirty."""
        i = self._info_h(t._live(self))
        return {"name": i.name.decode(), "dtype": i.dtype, "bytes": i.bytes,
                "shape": tuple(i.shape[k] for k in range(i.ndim)),
                "home": TIER_NAMES.get(i.home),
                "state": {TIER_NAMES[x]: COPY_STATES.get(i.state[x], i.state[x]) for x in range(NTIERS)},
                "refs": {TIER_NAMES[x]: i.refs[x] for x in range(NTIERS)},
                "dirty": {TIER_NAMES[x]: bool(i.dirty[x]) for x in range(NTIERS)}}

    # ---------------------------------------------------------- access
    def acquire(self, t, tier, write=False, discard=False):
        """Start making t resident in `tier` ("device" or "host") and take a
        reference; returns a :class:`Request` (wait() gives the address)."""
        flags = (ACQ_WRITE if write else 0) | (ACQ_DISCARD if discard else 0)
        r = c_void_p()
        self._c(lib.zo_store_acquire(self._live(), t._live(self), tier_id(tier), flags,
                                     ctypes.byref(r)), "zo_store_acquire")
        req = Request(r, self, t, tier)
        self._pending[id(req)] = req
        return req

    def release(self, t, tier, writeback=False, drop=False):
        flags = (REL_WRITEBACK if writeback else 0) | (REL_DROP if drop else 0)
        self._c(lib.zo_store_release(self._live(), t._live(self), tier_id(tier), flags),
                "zo_store_release")

    def prefetch(self, t, tier):
        self._c(lib.zo_store_prefetch(self._live(), t._live(self), tier_id(tier)), "zo_store_prefetch")

    def flush(self, t=None):
        self._c(lib.zo_store_flush(self._live(), t._live(self) if t is not None else None),
                "zo_store_flush")

    def step(self):
        """Mark an iteration boundary (ends the trace recording the first time)."""
        self._c(lib.zo_store_step(self._live()), "zo_store_step")

    def set_trace(self, mode):
        if mode not in TRACES:
            raise ValueError("trace %r: 'auto' or 'off'" % (mode,))
        self._c(lib.zo_store_set_trace(self._live(), TRACES[mode]), "zo_store_set_trace")

    def _range(self, t, off, x, writable):
        v = arrays.view(x, "dst" if writable else "src", writable=writable)
        off = int(off)
        if off < 0:
            raise ValueError("offset %d is negative" % off)
        if off + v.nbytes > t.nbytes:
            raise ValueError("tensor %r: bytes [%d, %d) are past its %d bytes"
                             % (t.name, off, off + v.nbytes, t.nbytes))
        return v

    def read(self, t, dst, off=0):
        """Copy t's current contents at byte offset `off` into host array dst."""
        v = self._range(t, off, dst, True)
        self._c(lib.zo_store_read(self._live(), t._live(self), off, v.ptr, v.nbytes), "zo_store_read")
        return dst

    def write(self, t, src, off=0):
        """Write host array src into t's home copy at byte offset `off`."""
        v = self._range(t, off, src, False)
        self._c(lib.zo_store_write(self._live(), t._live(self), off, v.ptr, v.nbytes), "zo_store_write")

    def checkpoint(self, root, name, tensors=None, keep_last=0, user_json=None):
        ts = list(tensors) if tensors else []
        arr = (c_void_p * max(1, len(ts)))(*[x._live(self) for x in ts])
        self._c(lib.zo_store_checkpoint(self._live(), str(root).encode(), str(name).encode(),
                                        arr if ts else None, len(ts), int(keep_last),
                                        None if user_json is None else str(user_json).encode()),
                "zo_store_checkpoint")

    def restore(self, root, name=None):
        self._c(lib.zo_store_restore(self._live(), str(root).encode(),
                                     None if name is None else str(name).encode()),
                "zo_store_restore")

    # ---------------------------------------------------------- statistics
    def stats(self):
        """The counters of zo_store_stats as a dict; per-tier arrays become
        {"device": .., "host": .., "nvme": ..} and moved a dict of (from, to)."""
        s = _lib.out_struct(StoreStats)
        lib.zo_store_get_stats(self._live(), ctypes.byref(s))
        out = {}
        for k, _ in StoreStats._fields_:
            v = getattr(s, k)
            if k in ("budget", "used", "peak"):
                v = {TIER_NAMES[x]: v[x] for x in range(NTIERS)}
            elif k == "moved":
                v = {(TIER_NAMES[a], TIER_NAMES[b]): v[a][b] for a in range(NTIERS) for b in range(NTIERS)}
            out[k] = v
        return out

    def reset_stats(self):
        lib.zo_store_reset_stats(self._live())


def tier_bytes_needed(tier, tensors, **config):
    """(exact, any_layout): the device or host tier budget that holds the
    tensors described, each a (shape, dtype) pair or a dict with shape,
    dtype and optionally nbytes; `config` as :class:`Store` (budgets aside,
    it sets the tier's allocation granule; device and swap are not needed)."""
    _declare()
    descs, keep = [], []
    for i, x in enumerate(tensors):
        if isinstance(x, dict):
            d, enc = _desc("t%d" % i, x["shape"], x.get("dtype", "f32"), x.get("nbytes"), "host")
        else:
            d, enc = _desc("t%d" % i, x[0], x[1], None, "host")
        descs.append(d)
        keep.append(enc)
    cfg = Store._config(None, 0, 0, None, 0, config.pop("trace", "auto"), config)
    arr = (P(TensorDesc) * max(1, len(descs)))(*[ctypes.pointer(d) for d in descs])
    need = TierNeed()
    check(lib.zo_store_tier_bytes_needed(ctypes.byref(cfg), tier_id(tier), arr, len(descs),
                                         ctypes.byref(need)), "zo_store_tier_bytes_needed")
    return need.exact, need.any_layout
