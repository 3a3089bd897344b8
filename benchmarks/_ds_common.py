# SPDX-License-Identifier: Apache-2.0
"""What the DeepSpeed comparison scripts share: the virtual environment
(made by setup_ds_venv.sh) and the fixes that let DeepSpeed's CPU ops
JIT-build against the torch in it.

Two breakages this handles, for DeepSpeed 0.14 with torch 1.13 and for
DeepSpeed 0.19 with torch 2.x alike:

* the C++ standard: DeepSpeed's sources need C++17 (std::is_same_v in
  simd.h); torch 1.13's cpp_extension adds -std=c++14, and DeepSpeed 0.14's
  CPU builder passes none, so the build fails; newer torch headers need a
  newer standard than the -std=c++17 DeepSpeed's CPU builders pass, and
  forcing c++17 breaks those. `fix_cxx_std()` makes a builder pass the
  newest of C++17, the standard torch's cpp_extension asks for, and the
  builder's own.
* the async_io op: with DeepSpeed 0.19 `op_builder.async_io.AsyncIOBuilder`
  is the CUDA-side builder; on a CPU-only torch its op is built without
  -laio and fails to load (undefined symbol: io_submit). The CPU-side
  builder, `op_builder.cpu.async_io.AsyncIOBuilder`, links libaio.
  `aio_builder()` picks it where it exists.
"""

import inspect
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VENV = os.environ.get("ZO_DS_VENV", os.path.expanduser("~/.cache/zoffload/venv-ds"))


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def in_venv(venv):
    return os.path.realpath(sys.prefix) == os.path.realpath(venv)


def ensure_venv(venv, system_torch=False, ds_version=None):
    """Make VENV with setup_ds_venv.sh if it lacks deepspeed; return its python."""
    py = venv_python(venv)
    ok = os.path.exists(py) and subprocess.run([py, "-c", "import deepspeed"], stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL).returncode == 0
    if not ok:
        cmd = [os.path.join(HERE, "setup_ds_venv.sh")] + (["--system-torch"] if system_torch else []) + [venv]
        env = dict(os.environ)
        if ds_version:
            env["DS_VERSION"] = ds_version
        subprocess.run(cmd, check=True, env=env)
    return py


def torch_cxx_std():
    """The newest -std=c++NN torch's cpp_extension mentions (its default for
    extensions), as an int; 14 when none is found (torch 1.x)."""
    import torch.utils.cpp_extension as ce
    try:
        src = inspect.getsource(ce)
    except (OSError, TypeError):
        return 14
    found = [int(v) for v in re.findall(r"-std=c\+\+(\d+)", src)]
    return max(found) if found else 14


def _std_of(args):
    found = [int(m.group(1)) for a in args for m in [re.match(r"-std=c\+\+(\d+)$", a)] if m]
    return max(found) if found else 0


# each patched builder class's own cxx_args, as it was before fix_cxx_std
_orig_cxx_args = {}


def fix_cxx_std(builder_cls):
    """Patch builder_cls.cxx_args to pass exactly one -std=c++NN, the newest of
    17, torch's and the builder's own. The patch always wraps the class's
    saved original, so patching twice never stacks wrappers (and one inherited
    from a patched base only repeats the same rewrite)."""
    orig = _orig_cxx_args.setdefault(builder_cls, builder_cls.cxx_args)
    want = max(17, torch_cxx_std())

    def cxx_args(self):
        args = list(orig(self))
        std = max(want, _std_of(args))
        return [a for a in args if not a.startswith("-std=")] + ["-std=c++%d" % std]

    builder_cls.cxx_args = cxx_args


def cpu_op_builder_classes():
    """DeepSpeed's CPU op builder base classes present in this version."""
    out = []
    try:
        from deepspeed.ops.op_builder.cpu import builder as cpu_builder
        out.append(cpu_builder.CPUOpBuilder)
    except ImportError:
        pass
    try:
        from deepspeed.ops.op_builder import builder as gen_builder
        for name in ("TorchCPUOpBuilder", "CPUOpBuilder"):
            if hasattr(gen_builder, name):
                out.append(getattr(gen_builder, name))
    except ImportError:
        pass
    return out


def aio_builder():
    """DeepSpeed's libaio async_io builder: the CPU-side one where this
    DeepSpeed has it (0.19: op_builder/cpu/async_io.py), else the generic one
    (0.14, whose builder links -laio itself)."""
    try:
        from deepspeed.ops.op_builder.cpu.async_io import AsyncIOBuilder
    except ImportError:
        from deepspeed.ops.op_builder.async_io import AsyncIOBuilder
    # 0.19's CPU async_io also JIT-builds the pin_memory op first
    extra = []
    try:
        from deepspeed.ops.op_builder.pin_memory import PinMemoryBuilder
        extra.append(PinMemoryBuilder)
    except ImportError:
        pass
    for cls in cpu_op_builder_classes() + extra + [AsyncIOBuilder]:
        fix_cxx_std(cls)
    return AsyncIOBuilder()
