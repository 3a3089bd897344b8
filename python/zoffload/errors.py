# SPDX-License-Identifier: Apache-2.0
"""Exceptions raised for library errors.

Every failing library call raises a :class:`ZoError` (or a subclass) whose
message is ``"<function>: <zo_strerror(code)>: <detail>"``; the pieces are
kept as attributes. Subclasses also derive from the matching built-in
exception, so ``except ValueError`` catches a bad argument and
``except MemoryError`` an exhausted budget, whichever layer raised it.
"""

import errno as _errno

# Library codes (common.h); already negative.
ZO_EINTERNAL = -10000
ZO_ENOTSUP = -10001
ZO_ENODEV = -10002
ZO_ECORRUPT = -10003
ZO_EBUDGET = -10004
ZO_ECONFIG = -10005
ZO_EFORMAT = -10006
ZO_EVERSION = -10007
ZO_ESTATE = -10008
ZO_ECUDA = -10009
ZO_ENONFINITE = -10010
ZO_ETRUNC = -10011

CODE_NAMES = {
    ZO_EINTERNAL: "ZO_EINTERNAL", ZO_ENOTSUP: "ZO_ENOTSUP", ZO_ENODEV: "ZO_ENODEV",
    ZO_ECORRUPT: "ZO_ECORRUPT", ZO_EBUDGET: "ZO_EBUDGET", ZO_ECONFIG: "ZO_ECONFIG",
    ZO_EFORMAT: "ZO_EFORMAT", ZO_EVERSION: "ZO_EVERSION", ZO_ESTATE: "ZO_ESTATE",
    ZO_ECUDA: "ZO_ECUDA", ZO_ENONFINITE: "ZO_ENONFINITE", ZO_ETRUNC: "ZO_ETRUNC",
}


class ZoError(Exception):
    """A libzoffload call failed.

    Attributes: ``code`` (the negative return code), ``name`` (``"ZO_ECONFIG"``
    or the errno name such as ``"EINVAL"``), ``func`` (the C function),
    ``strerror`` (``zo_strerror(code)``) and ``detail`` (the library's detail
    message, possibly empty).
    """

    def __init__(self, code, func, strerror, detail):
        self.code = code
        self.func = func
        self.strerror = strerror
        self.detail = detail
        if code in CODE_NAMES:
            self.name = CODE_NAMES[code]
        else:
            self.name = _errno.errorcode.get(-code, str(code))
        if detail and detail.startswith(func):
            # The library's details usually start with the function's name.
            msg = "%s (%s: %s)" % (detail, self.name, strerror)
        elif detail:
            msg = "%s: %s (%s: %s)" % (func, detail, self.name, strerror)
        else:
            msg = "%s: %s (%s)" % (func, strerror, self.name)
        super().__init__(msg)

    @property
    def errno(self):
        """The positive errno for OS errors, None for library codes."""
        return -self.code if -10000 < self.code < 0 else None


class InvalidArgument(ZoError, ValueError):
    """-EINVAL, or ZO_ECONFIG (a configuration value out of range)."""


class NotSupported(ZoError, NotImplementedError):
    """ZO_ENOTSUP: not built in or not supported by this machine."""


class NoDevice(ZoError, RuntimeError):
    """ZO_ENODEV: device or backend unavailable."""


class CorruptError(ZoError, OSError):
    """ZO_ECORRUPT / ZO_EFORMAT / ZO_ETRUNC / ZO_EVERSION: stored data bad."""


class BudgetError(ZoError, MemoryError):
    """ZO_EBUDGET or -ENOMEM: a byte budget or memory ran out."""


class StateError(ZoError, RuntimeError):
    """ZO_ESTATE / -EBUSY: not valid in the object's current state."""


class NonFiniteError(ZoError, ArithmeticError):
    """ZO_ENONFINITE: inf or NaN where finite values are required."""


class LibraryOSError(ZoError, OSError):
    """Any other -errno (I/O errors, missing files...)."""


class LibraryNotFound(ImportError):
    """libzoffload could not be loaded (or is of an incompatible version)."""


_MAP = {
    -_errno.EINVAL: InvalidArgument, ZO_ECONFIG: InvalidArgument,
    ZO_ENOTSUP: NotSupported, ZO_ENODEV: NoDevice,
    ZO_ECORRUPT: CorruptError, ZO_EFORMAT: CorruptError, ZO_ETRUNC: CorruptError,
    ZO_EVERSION: CorruptError,
    ZO_EBUDGET: BudgetError, -_errno.ENOMEM: BudgetError,
    ZO_ESTATE: StateError, -_errno.EBUSY: StateError,
    ZO_ENONFINITE: NonFiniteError,
}


def from_code(code, func, strerror, detail):
    """The exception for return code `code` of C function `func`."""
    cls = _MAP.get(code)
    if cls is None:
        cls = LibraryOSError if -10000 < code < 0 else ZoError
    e = cls(code, func, strerror, detail)
    if isinstance(e, OSError):
        # OSError's own attributes, so code that inspects e.errno works.
        e.args = (e.args[0],)
    return e
