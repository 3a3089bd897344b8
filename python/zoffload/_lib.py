# SPDX-License-Identifier: Apache-2.0
"""Finding and loading libzoffload, and calling it.

The library is looked up, first match wins, in:

1. ``ZOFFLOAD_LIB``: the path of the shared library, or a directory holding
   ``libzoffload.so*`` (a meson build directory works);
2. the package directory (a wheel may ship the library next to this file);
3. ``pkg-config --variable=libdir zoffload`` (an installed library);
4. a build directory of the source checkout this package sits in
   (``<checkout>/build*/``), so ``PYTHONPATH=python`` works in a checkout;
5. the system loader (``libzoffload.so.0`` on the default search path).

Every foreign function is declared here with its argument and result types
(ctypes checks the Python side of each call against them). The calls that
return an ``int`` error code go through :func:`check`, which turns a
negative code into a :class:`ZoError` carrying ``zo_strerror(code)`` and the
library's detail message.
"""

import ctypes
import ctypes.util
import errno as _errno
import glob
import os
import subprocess
import threading

from . import errors as _errors

#: The library major version these bindings were written against.
ABI_MAJOR = 0

c_int = ctypes.c_int
c_uint = ctypes.c_uint
c_size_t = ctypes.c_size_t
c_double = ctypes.c_double
c_float = ctypes.c_float
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
c_u64 = ctypes.c_uint64
c_i64 = ctypes.c_int64
c_u32 = ctypes.c_uint32
c_u16 = ctypes.c_uint16
P = ctypes.POINTER


def _lib_in_dir(d):
    """The shared library inside directory d (or None): the unversioned name
    first, then the soname, then any versioned file."""
    for pat in ("libzoffload.so", "libzoffload.so.%d" % ABI_MAJOR, "libzoffload.so.*"):
        hits = sorted(glob.glob(os.path.join(d, pat)))
        if hits:
            return hits[0]
    return None


def _pkgconfig_libdir():
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "zoffload"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    d = out.stdout.decode(errors="replace").strip()
    return d if out.returncode == 0 and d else None


def candidates():
    """The places searched, in order, as (origin, path) pairs; path may be
    None where that origin has nothing to offer."""
    out = []
    env = os.environ.get("ZOFFLOAD_LIB")
    if env:
        out.append(("ZOFFLOAD_LIB", _lib_in_dir(env) if os.path.isdir(env) else env))
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(("package directory", _lib_in_dir(here)))
    d = _pkgconfig_libdir()
    out.append(("pkg-config", _lib_in_dir(d) if d else None))
    checkout = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(checkout, "include", "zoffload", "zoffload.h")):
        for b in sorted(glob.glob(os.path.join(checkout, "build*"))):
            hit = _lib_in_dir(b)
            if hit:
                out.append(("source checkout", hit))
                break
    out.append(("system loader", ctypes.util.find_library("zoffload") or "libzoffload.so.%d" % ABI_MAJOR))
    return out


def _open():
    tried = []
    env_set = bool(os.environ.get("ZOFFLOAD_LIB"))
    for origin, path in candidates():
        if path is None:
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s (%s)" % (origin, path, e))
            if origin == "ZOFFLOAD_LIB":
                # An explicit choice that does not load is an error, not a
                # reason to pick some other copy silently.
                break
            continue
        return lib, path, origin
    hint = "" if env_set else "; set ZOFFLOAD_LIB to the library or its build directory"
    raise _errors.LibraryNotFound("libzoffload not found (tried: %s)%s"
                                  % ("; ".join(tried) or "nothing", hint))


class _Lib:
    """The loaded library with its functions declared; loaded on first use."""

    def __init__(self):
        self._lock = threading.Lock()
        self._dll = None
        self.path = None
        self.origin = None
        self.struct_sizes = {}

    def _load(self):
        with self._lock:
            if self._dll is not None:
                return
            dll, path, origin = _open()
            _declare(dll)
            ver = dll.zo_version()
            major = ver // 10000
            if major != ABI_MAJOR:
                raise _errors.LibraryNotFound(
                    "%s is libzoffload %s (major %d); these bindings need major %d"
                    % (path, dll.zo_version_string().decode(), major, ABI_MAJOR))
            self.path, self.origin = path, origin
            self._dll = dll

    def __getattr__(self, name):
        if name.startswith("zo_"):
            self._load()
            return getattr(self._dll, name)
        raise AttributeError(name)

    def declare(self, name, restype, argtypes):
        """Declare an optional function (one a module binds on first use);
        AttributeError if the loaded library lacks it."""
        self._load()
        _fn(self._dll, name, restype, argtypes)
        return getattr(self._dll, name)

    def has(self, name):
        """Whether the loaded library exports `name` (optional, newer calls)."""
        self._load()
        try:
            getattr(self._dll, name)
        except AttributeError:
            return False
        return True


lib = _Lib()


def detail():
    """The calling thread's last library detail message."""
    s = lib.zo_last_error_detail()
    return s.decode(errors="replace") if s else ""


def strerror(code):
    return lib.zo_strerror(int(code)).decode(errors="replace")


def check(rc, func, handle_msg=None):
    """Raise the ZoError for a negative return code; return rc otherwise.

    `func` names the C call for the message; `handle_msg` is a callable that
    returns the object's own detail, used when the thread's detail is empty.
    The thread-local detail is read in the same thread that made the call
    (ctypes releases the GIL during the call but does not switch threads).
    """
    if rc >= 0:
        return rc
    d = detail()
    if not d and handle_msg is not None:
        try:
            d = handle_msg() or ""
        except Exception:  # the handle's message is a courtesy, never a new failure
            d = ""
    raise _errors.from_code(rc, func, strerror(rc), d)


class Handle:
    """Base of the classes that own one library handle: `_destroy` names
    the C destroy function (it takes T ** and clears it), `_what` the object
    for messages. close() is idempotent; the handle is also destroyed when
    the object is collected, and `with` closes it."""

    _destroy = None
    _what = "object"
    _h = None

    def _live(self):
        if not self._h:
            raise ValueError("%s is closed" % self._what)
        return self._h

    def close(self):
        if self._h:
            getattr(lib, self._destroy)(ctypes.byref(self._h))
            self._h = c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SharedHandle(Handle):
    """A handle other handles build on (a device under an engine or a
    store, a swap store under a store): each user counts itself in `_users`
    and calls _release() when it closes; close() is deferred while users
    remain, because garbage collection may finalize this object before the
    ones over it, and closing it then would pull it out from under them."""

    _users = 0
    _close_pending = False

    def close(self):
        if self._users > 0:
            self._close_pending = True
            return
        super().close()

    def _release(self):
        self._users -= 1
        if self._users == 0 and self._close_pending:
            self._close_pending = False
            super().close()


# --------------------------------------------------------------------------
# Structures. Each starts with struct_size where the C one does; the test
# suite compares every size and field offset with the C compiler's
# (tests/python/abi_layout.c).

class PinOpts(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("numa_node", c_int), ("flags", c_uint),
                ("dev", c_void_p)]


class PinnedInfo(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("mapped", c_size_t), ("numa_node", c_int), ("flags", c_uint)]


class PinnedStats(ctypes.Structure):
    _fields_ = [("budget", c_size_t), ("locked_bytes", c_size_t), ("locked_peak", c_size_t),
                ("unlocked_bytes", c_size_t), ("allocations", c_size_t), ("fallbacks", c_size_t),
                ("memlock_limit", c_u64), ("can_lock_unlimited", c_int),
                ("last_fallback", ctypes.c_char * 160)]


class CpuadamHparams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("lr", c_double),
                ("beta1", c_double), ("beta2", c_double), ("eps", c_double),
                ("weight_decay", c_double), ("bias_correction", c_int), ("step", c_i64),
                ("grad_scale", c_double), ("clip_coef", c_double)]


class CpuadamTensors(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("n", c_size_t), ("param", c_void_p),
                ("grad", c_void_p), ("grad_dtype", c_int), ("exp_avg", c_void_p),
                ("exp_avg_sq", c_void_p), ("state_dtype", c_int), ("param_out", c_void_p),
                ("out_dtype", c_int)]


class GradStats(ctypes.Structure):
    _fields_ = [("sumsq", c_double), ("nonfinite", c_u64)]


class CpuadamTeamConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("nthreads", c_int), ("pin", c_int),
                ("numa_node", c_int), ("variant", c_char_p), ("nt_stores", c_int),
                ("tile_elems", c_size_t)]


class DevConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("ordinal", c_int),
                ("host_mem_limit", c_size_t)]


CKPT_MAX_DIMS = 8


class CkptEntry(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_uint),
                ("shape", c_u64 * CKPT_MAX_DIMS), ("bytes", c_u64)]


class CkptOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("chunk_size", c_size_t), ("keep_last", c_uint),
                ("user_json", c_char_p), ("aio", c_void_p), ("buffered", c_int)]


#: (struct, C default function, extra default arguments) for every struct
#: that carries struct_size; used by new_struct() and the ABI test.
SIZED_STRUCTS = {
    "zo_pin_opts": (PinOpts, "zo_pin_opts_default", ()),
    "zo_cpuadam_hparams": (CpuadamHparams, "zo_cpuadam_hparams_default", (0,)),
    "zo_cpuadam_tensors": (CpuadamTensors, "zo_cpuadam_tensors_default", ()),
    "zo_cpuadam_team_config": (CpuadamTeamConfig, "zo_cpuadam_team_config_default", ()),
    "zo_dev_config": (DevConfig, "zo_dev_config_default", ()),
    "zo_ckpt_options": (CkptOptions, "zo_ckpt_options_default", ()),
}

#: every struct the bindings mirror, by C name (the ABI test checks each
#: one's size and field offsets against the C compiler)
C_STRUCTS = {k: v[0] for k, v in SIZED_STRUCTS.items()}
C_STRUCTS.update({"zo_pinned_info": PinnedInfo, "zo_pinned_stats": PinnedStats,
                  "zo_grad_stats": GradStats, "zo_ckpt_entry": CkptEntry})



def register_structs(sized=None, plain=None):
    """Make a module's struct mirrors known: sized ({C name: (struct, C
    default function, extra default arguments)}, structs with struct_size)
    to new_struct() and both kinds to the ABI test (C_STRUCTS)."""
    sized = sized or {}
    SIZED_STRUCTS.update(sized)
    C_STRUCTS.update({k: v[0] for k, v in sized.items()})
    C_STRUCTS.update(plain or {})


_SCRATCH = 4096


def c_struct_size(cname):
    """sizeof() of a C config struct as the loaded library sees it: its
    default function writes it into struct_size (probed in a scratch buffer
    large enough for any later, longer version of the struct)."""
    if cname in lib.struct_sizes:
        return lib.struct_sizes[cname]
    cls, fn, extra = SIZED_STRUCTS[cname]
    buf = ctypes.create_string_buffer(_SCRATCH)
    getattr(lib, fn)(buf, *extra)
    size = c_size_t.from_buffer(buf).value
    lib.struct_sizes[cname] = size
    return size


_OUT_SLACK = 1024


def out_struct(cls):
    """An instance of an output struct (one the library fills and that has
    no struct_size) backed by at least 1 KiB: a newer library whose struct
    grew writes its extra fields into the slack instead of past our memory."""
    return cls.from_buffer(bytearray(max(ctypes.sizeof(cls), _OUT_SLACK)))


def new_struct(cname, *extra):
    """A struct filled by its C default function.

    When the library's struct is longer than ours (a newer library), its
    defaults for our fields are copied and struct_size says how much we
    know, which the library accepts. A shorter one (an older library) is
    an error: it would reject or misread the fields it lacks.
    """
    cls, fn, dflt = SIZED_STRUCTS[cname]
    args = extra if extra else dflt
    csize = c_struct_size(cname)
    ours = ctypes.sizeof(cls)
    if csize == ours:
        s = cls()
        rc = getattr(lib, fn)(ctypes.byref(s), *args)
        if isinstance(rc, int) and rc < 0:
            check(rc, fn)
        return s
    if csize < ours:
        raise _errors.LibraryNotFound(
            "%s: the library's struct %s has %d bytes, these bindings need %d: library too old"
            % (lib.path, cname, csize, ours))
    buf = ctypes.create_string_buffer(max(csize, _SCRATCH))
    rc = getattr(lib, fn)(buf, *args)
    if isinstance(rc, int) and rc < 0:
        check(rc, fn)
    s = cls.from_buffer_copy(buf.raw[:ours])
    s.struct_size = ours
    return s


def _fn(dll, name, restype, argtypes):
    f = getattr(dll, name)
    f.restype = restype
    f.argtypes = argtypes


def _declare(dll):
    d = dll
    # common.h
    _fn(d, "zo_strerror", c_char_p, [c_int])
    _fn(d, "zo_last_error_detail", c_char_p, [])
    _fn(d, "zo_log_set_level", None, [c_int])
    _fn(d, "zo_log_get_level", c_int, [])
    _fn(d, "zo_log_parse_level", c_int, [c_char_p, P(c_int)])
    _fn(d, "zo_dtype_size", c_size_t, [c_int])
    _fn(d, "zo_dtype_name", c_char_p, [c_int])
    _fn(d, "zo_dtype_parse", c_int, [c_char_p, P(c_int)])
    _fn(d, "zo_parse_size", c_int, [c_char_p, P(c_u64)])
    _fn(d, "zo_version", c_uint, [])
    _fn(d, "zo_version_string", c_char_p, [])
    _fn(d, "zo_build_features", c_uint, [])
    _fn(d, "zo_build_string", c_char_p, [])
    # cpu.h / vec.h
    _fn(d, "zo_cpu_flags", c_uint, [])
    _fn(d, "zo_cpu_level_name", c_char_p, [c_uint])
    _fn(d, "zo_cpu_model", c_char_p, [])
    _fn(d, "zo_vec_cast", c_int, [c_void_p, c_int, c_void_p, c_int, c_size_t])
    _fn(d, "zo_vec_sumsq", c_int, [c_void_p, c_int, c_size_t, P(c_double)])
    _fn(d, "zo_vec_nonfinite", c_int, [c_void_p, c_int, c_size_t, P(c_size_t)])
    # mem.h
    _fn(d, "zo_pin_opts_default", None, [c_void_p])
    _fn(d, "zo_pinned_alloc", c_int, [P(c_void_p), c_size_t, c_void_p])
    _fn(d, "zo_pinned_free", None, [c_void_p])
    _fn(d, "zo_pinned_query", c_int, [c_void_p, P(PinnedInfo)])
    _fn(d, "zo_pinned_stats_get", None, [P(PinnedStats)])
    _fn(d, "zo_pinned_set_budget", c_size_t, [c_size_t])
    _fn(d, "zo_page_size", c_size_t, [])
    # cpuadam.h
    _fn(d, "zo_cpuadam_hparams_default", c_int, [c_void_p, c_int])
    _fn(d, "zo_cpuadam_tensors_default", c_int, [c_void_p])
    _fn(d, "zo_cpuadam_step", c_int, [P(CpuadamHparams), P(CpuadamTensors), c_int])
    _fn(d, "zo_cpuadam_rollback", c_int, [P(CpuadamHparams), P(CpuadamTensors), c_int])
    _fn(d, "zo_cpuadam_grad_stats", c_int, [c_void_p, c_int, c_size_t, c_int, P(GradStats)])
    _fn(d, "zo_cpuadam_variant", c_char_p, [])
    _fn(d, "zo_cpuadam_variant_available", c_int, [c_char_p])
    _fn(d, "zo_cpuadam_team_config_default", c_int, [c_void_p])
    _fn(d, "zo_cpuadam_team_create", c_int, [P(c_void_p), P(CpuadamTeamConfig)])
    _fn(d, "zo_cpuadam_team_destroy", None, [P(c_void_p)])
    _fn(d, "zo_cpuadam_team_step", c_int, [c_void_p, P(CpuadamHparams), P(CpuadamTensors)])
    _fn(d, "zo_cpuadam_team_rollback", c_int, [c_void_p, P(CpuadamHparams), P(CpuadamTensors)])
    _fn(d, "zo_cpuadam_team_grad_stats", c_int, [c_void_p, c_void_p, c_int, c_size_t, P(GradStats)])
    _fn(d, "zo_cpuadam_team_variant", c_char_p, [c_void_p])
    _fn(d, "zo_cpuadam_team_threads", c_int, [c_void_p])
    _fn(d, "zo_cpuadam_team_errmsg", c_char_p, [c_void_p])
    # dev.h
    _fn(d, "zo_dev_kind_parse", c_int, [c_char_p, P(c_int)])
    _fn(d, "zo_dev_probe", c_int, [c_int, P(c_int), ctypes.c_char_p, c_size_t])
    _fn(d, "zo_dev_config_default", None, [c_void_p])
    _fn(d, "zo_dev_open", c_int, [P(c_void_p), P(DevConfig)])
    _fn(d, "zo_dev_close", None, [P(c_void_p)])
    _fn(d, "zo_dev_errmsg", c_char_p, [c_void_p])
    # swap.h: checkpoints
    _fn(d, "zo_ckpt_options_default", None, [c_void_p])
    _fn(d, "zo_ckpt_save", c_int, [c_char_p, c_char_p, P(CkptEntry), P(c_void_p), c_uint,
                                   P(CkptOptions)])
    _fn(d, "zo_ckpt_latest", c_int, [c_char_p, ctypes.c_char_p, c_size_t])
    _fn(d, "zo_ckpt_open", c_int, [P(c_void_p), c_char_p, c_char_p])
    _fn(d, "zo_ckpt_close", None, [P(c_void_p)])
    _fn(d, "zo_ckpt_count", c_uint, [c_void_p])
    _fn(d, "zo_ckpt_get_entry", c_int, [c_void_p, c_uint, P(CkptEntry)])
    _fn(d, "zo_ckpt_find", c_int, [c_void_p, c_char_p, P(c_uint)])
    _fn(d, "zo_ckpt_name", c_char_p, [c_void_p])
    _fn(d, "zo_ckpt_user_json", c_char_p, [c_void_p])
    _fn(d, "zo_ckpt_chunk_size", c_size_t, [c_void_p])
    _fn(d, "zo_ckpt_read", c_int, [c_void_p, c_uint, c_u64, c_void_p, c_size_t])


EINVAL = -_errno.EINVAL
