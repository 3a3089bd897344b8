# SPDX-License-Identifier: Apache-2.0
"""Passing numpy arrays and torch tensors to the library by pointer.

No copy is ever made: :func:`view` checks that an array is of an accepted
element type, C-contiguous, on the expected device and (for outputs)
writable, and returns its address with the matching ``zo_dtype``. Anything
else raises ``TypeError`` (wrong kind of object or element type) or
``ValueError`` (layout, device, size), naming the argument.

numpy has no bfloat16: a ``uint16`` array passes as bf16 (or fp16) only
where the caller says so with ``as_dtype``.
"""

import sys

F32, F16, BF16, F64, U8, I32 = 0, 1, 2, 3, 4, 5
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16", F64: "f64", U8: "u8", I32: "i32"}
DTYPE_SIZES = {F32: 4, F16: 2, BF16: 2, F64: 8, U8: 1, I32: 4}

_NP = {"float32": F32, "float16": F16, "float64": F64, "uint8": U8, "int32": I32}
_TORCH = {"torch.float32": F32, "torch.float16": F16, "torch.bfloat16": BF16,
          "torch.float64": F64, "torch.uint8": U8, "torch.int32": I32}


class ArrayView:
    """What the library needs of an array: address, element count, type.
    Keeps a reference to the array so it outlives the view."""

    __slots__ = ("ptr", "n", "dtype", "nbytes", "device", "obj")

    def __init__(self, ptr, n, dtype, device, obj):
        self.ptr = ptr
        self.n = n
        self.dtype = dtype
        self.nbytes = n * DTYPE_SIZES[dtype]
        self.device = device
        self.obj = obj

    def __repr__(self):
        return "ArrayView(ptr=0x%x, n=%d, dtype=%s, device=%s)" % (
            self.ptr, self.n, DTYPE_NAMES[self.dtype], self.device)


def _is_torch(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _is_numpy(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def dtype_of(x):
    """The zo_dtype of a numpy array or torch tensor, or None."""
    if _is_torch(x):
        return _TORCH.get(str(x.dtype))
    if _is_numpy(x):
        return _NP.get(x.dtype.name)
    return None


def view(x, name="array", dtypes=None, as_dtype=None, writable=False, device="cpu",
         min_elems=1):
    """Check `x` and describe it for a library call.

    dtypes:   accepted zo_dtypes (None: any the library knows);
    as_dtype: reinterpret a numpy uint16 array as BF16/F16 (and accept it);
    writable: the library writes into it;
    device:   "cpu" (host memory), "any", or a torch device string such as
              "cuda:0": where the memory must be;
    min_elems: fewest elements accepted.
    """
    if _is_torch(x):
        dt = _TORCH.get(str(x.dtype))
        if x.layout != sys.modules["torch"].strided:
            raise ValueError("%s: a %s tensor is not a dense strided tensor" % (name, x.layout))
        if not x.is_contiguous():
            raise ValueError("%s: tensor is not contiguous (shape %s, strides %s); "
                             "pass x.contiguous()" % (name, tuple(x.shape), x.stride()))
        if x.is_conj() if hasattr(x, "is_conj") else False:
            raise ValueError("%s: tensor has an unresolved conjugate bit" % name)
        dev = str(x.device)
        if device == "cpu" and x.device.type != "cpu":
            raise ValueError("%s: tensor is on %s; host memory (a CPU tensor) is required"
                             % (name, dev))
        if device not in ("cpu", "any") and dev != device and not (
                device.startswith("cuda") and dev == device + ":0"):
            raise ValueError("%s: tensor is on %s; expected %s" % (name, dev, device))
        n = x.numel()
        ptr = x.data_ptr()
        obj = x
    elif _is_numpy(x):
        dt = _NP.get(x.dtype.name)
        if as_dtype in (BF16, F16) and x.dtype.name == "uint16":
            dt = as_dtype
        if not x.flags["C_CONTIGUOUS"]:
            raise ValueError("%s: array is not C-contiguous (strides %s); pass "
                             "numpy.ascontiguousarray(x)" % (name, x.strides))
        if writable and not x.flags["WRITEABLE"]:
            raise ValueError("%s: array is read-only" % name)
        if x.dtype.byteorder == ">" or (x.dtype.byteorder == "=" and sys.byteorder == "big"):
            raise ValueError("%s: big-endian arrays are not supported" % name)
        if device not in ("cpu", "any"):
            raise ValueError("%s: a numpy array is host memory; expected %s" % (name, device))
        dev = "cpu"
        n = x.size
        ptr = x.ctypes.data
        obj = x
    else:
        raise TypeError("%s: expected a numpy.ndarray or torch.Tensor, got %s"
                        % (name, type(x).__name__))
    if dt is None:
        raise TypeError("%s: element type %s is not supported" % (name, x.dtype))
    if as_dtype is not None and dt != as_dtype:
        raise TypeError("%s: element type %s, expected %s" % (name, x.dtype, DTYPE_NAMES[as_dtype]))
    if dtypes is not None and dt not in dtypes:
        raise TypeError("%s: element type %s, expected one of %s"
                        % (name, x.dtype, ", ".join(DTYPE_NAMES[d] for d in dtypes)))
    if n < min_elems:
        raise ValueError("%s: %d elements, at least %d needed" % (name, n, min_elems))
    return ArrayView(ptr, n, dt, dev, obj)


def same_length(*views):
    """ValueError unless all views have the same element count."""
    n = views[0].n
    for v in views[1:]:
        if v.n != n:
            raise ValueError("length mismatch: %s has %d elements, %s has %d"
                             % (views[0], n, v, v.n))
    return n
