# SPDX-License-Identifier: Apache-2.0
"""zoffload: Python bindings over libzoffload's C ABI (ctypes, no compiled
extension).

Modules:
  zoffload.cpuadam  CPU optimizer kernels on numpy arrays / torch tensors
  zoffload.mem      pinned host memory as arrays and tensors
  zoffload.ckpt     crash-safe checkpoints of host arrays
  zoffload.optim    the offload optimizer engine (zo_optim), when the
                    library has it
  zoffload.torch    PyTorch integration: OffloadAdamW and friends

The library is found through ZOFFLOAD_LIB, the package directory,
pkg-config or the source checkout (see zoffload._lib). It is loaded on
first use, so ``import zoffload`` itself never fails for want of it.
"""

from . import errors
from .errors import (ZoError, InvalidArgument, NotSupported, NoDevice, CorruptError, BudgetError,
                     StateError, NonFiniteError, LibraryOSError, LibraryNotFound)
from . import _lib
from . import arrays

__version__ = "0.1.0"

__all__ = ["errors", "arrays", "ZoError", "InvalidArgument", "NotSupported", "NoDevice",
           "CorruptError", "BudgetError", "StateError", "NonFiniteError", "LibraryOSError",
           "LibraryNotFound", "library_path", "version", "build_features", "strerror",
           "set_log_level", "parse_size"]

BUILD_CUDA = 1 << 0
BUILD_NCCL = 1 << 1
BUILD_LIBURING = 1 << 2
BUILD_NUMA = 1 << 3
BUILD_HWLOC = 1 << 4
BUILD_OPENMP = 1 << 5
BUILD_CJSON = 1 << 6
BUILD_XXHASH = 1 << 7


def library_path():
    """Path of the loaded libzoffload (loads it)."""
    _lib.lib._load()
    return _lib.lib.path


def version():
    """The library's "major.minor.patch"."""
    return _lib.lib.zo_version_string().decode()


def build_features():
    """Dict feature -> bool of what the library was built with."""
    s = _lib.lib.zo_build_string().decode()
    out = {}
    for kv in s.split():
        k, _, v = kv.partition("=")
        out[k] = v == "yes"
    return out


def strerror(code):
    """zo_strerror(code)."""
    return _lib.strerror(code)


def set_log_level(level):
    """Set the library's log level: "off", "error", "warn", "info", "debug",
    "trace" or 0-5."""
    v = _lib.c_int()
    _lib.check(_lib.lib.zo_log_parse_level(str(level).encode(), _lib.ctypes.byref(v)),
               "zo_log_parse_level")
    _lib.lib.zo_log_set_level(v.value)


def parse_size(s):
    """Parse "64MiB", "1G", "13522" as zo_parse_size() does; ints pass through."""
    if isinstance(s, int):
        return s
    v = _lib.c_u64()
    _lib.check(_lib.lib.zo_parse_size(str(s).encode(), _lib.ctypes.byref(v)), "zo_parse_size")
    return v.value
