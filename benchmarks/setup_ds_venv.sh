#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Make the virtual environment the DeepSpeed comparisons run in
# (benchmarks/ds_cpuadam_bench.py, benchmarks/ds_aio_bench.py), from PyPI,
# the way a user would:
#
#   benchmarks/setup_ds_venv.sh [--system-torch] [VENV]
#
# VENV defaults to $ZO_DS_VENV, else ~/.cache/zoffload/venv-ds.
# Environment: DS_VERSION (DeepSpeed version), TORCH_INDEX_URL (a torch
# wheel index, e.g. PyTorch's CPU-only one; default: none, torch from PyPI),
# PYTHON (the interpreter the venv is made from; default /usr/bin/python3).
#
# Default: torch from PyPI (its CUDA build, used on the CPU only: PyTorch's
# own CPU wheel index is not reachable from every machine, this project's
# included; set TORCH_INDEX_URL to use it and skip the nvidia-* wheels). The
# pinned, verified peer set (torch 2.15 + DeepSpeed 0.19.8) is what
# ../shared/peers/setup_peer_venv.sh makes; this script's venv works for the
# same scripts. Then
# DeepSpeed ($DS_VERSION, default the newest 0.19.x) installed *without
# build isolation* (its setup.py imports torch, and in an isolated build
# environment it would fetch a second, CUDA torch just to read its version)
# and without letting pip resolve its torch requirement (see below).
# DS_BUILD_OPS=0: DeepSpeed's ops (cpu_adam, async_io) are JIT-built on
# first use by the benchmark scripts, with the compiler flags that fit this
# torch.
#
# --system-torch: a venv over Debian's python3-torch (1.13) instead, with
# DeepSpeed 0.14.4 (the combination the numbers in docs/benchmarks.md were
# measured with; DeepSpeed 0.19.8 also installs and imports over it), and
# libtorch-dev and pybind11-dev, whose headers the JIT-built ops compile
# against (torch's extension headers include pybind11).
#
# DeepSpeed's async_io op links libaio: libaio-dev is installed with apt
# when missing (sudo when not root). The script is idempotent: an existing
# VENV with deepspeed importable is left as it is.
set -eu

system_torch=0
if [ "${1:-}" = "--system-torch" ]; then
    system_torch=1
    shift
fi
venv=${1:-${ZO_DS_VENV:-$HOME/.cache/zoffload/venv-ds}}
python=${PYTHON:-/usr/bin/python3}
if [ $system_torch = 1 ]; then
    ds_version=${DS_VERSION:-0.14.4}
else
    ds_version=${DS_VERSION:-0.19.*}
fi

say() { printf 'setup_ds_venv: %s\n' "$*" >&2; }

# ---- libaio-dev (DeepSpeed's async_io op) --------------------------------
if [ ! -e /usr/include/libaio.h ]; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        [ "$(id -u)" = 0 ] || sudo=sudo
        say "installing libaio-dev"
        $sudo apt-get install -y -qq --no-install-recommends libaio-dev
    else
        say "libaio development headers are missing (libaio-dev / libaio-devel); DeepSpeed's async_io op needs them"
        exit 1
    fi
fi

# ---- --system-torch: Debian's torch headers (the JIT-built ops include torch/extension.h) ----
if [ $system_torch = 1 ] && { [ ! -e /usr/include/torch/extension.h ] || [ ! -e /usr/include/pybind11/pybind11.h ]; }; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        [ "$(id -u)" = 0 ] || sudo=sudo
        say "installing libtorch-dev and pybind11-dev (the headers DeepSpeed's JIT-built ops compile against)"
        $sudo apt-get install -y -qq --no-install-recommends libtorch-dev pybind11-dev
    else
        say "torch/extension.h is missing: install your distribution's libtorch development package"
        exit 1
    fi
fi

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import deepspeed' >/dev/null 2>&1; then
    say "$venv already has $("$venv/bin/python" -c 'import deepspeed, torch; print("deepspeed", deepspeed.__version__, "torch", torch.__version__)')"
    exit 0
fi

mkdir -p "$(dirname "$venv")"
if [ $system_torch = 1 ]; then
    say "creating $venv over the system's site packages (Debian's torch)"
    "$python" -m venv --system-site-packages "$venv"
    "$venv/bin/python" -c 'import torch' || { say "the system python has no torch (apt-get install python3-torch)"; exit 1; }
else
    say "creating $venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip setuptools wheel
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        say "installing torch from $TORCH_INDEX_URL"
        set -- --index-url "$TORCH_INDEX_URL"
    else
        say "installing torch from PyPI"
        set --
    fi
    "$venv/bin/pip" install -q "$@" torch || {
        say "could not install torch (from ${TORCH_INDEX_URL:-PyPI}; or use --system-torch);"
        say "removing the half-made $venv"
        rm -rf "$venv"
        exit 1
    }
fi
pip="$venv/bin/pip"
# DeepSpeed's requirements (requirements/requirements.txt) except torch, then
# DeepSpeed itself with --no-deps: left to resolve its torch requirement, pip
# would replace the torch above with PyPI's default one, a CUDA build that
# drags gigabytes of nvidia-* wheels (it does so for Debian's 1.13.0a0, a
# pre-release version that does not satisfy DeepSpeed 0.19's pin).
"$pip" install -q einops hjson msgpack ninja numpy 'packaging>=20.0' psutil py-cpuinfo 'pydantic>=2.0.0' tqdm
say "installing deepspeed==$ds_version without build isolation or dependencies (DS_BUILD_OPS=0: ops are JIT-built)"
DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$pip" install -q --no-build-isolation --no-deps "deepspeed==$ds_version"
"$venv/bin/python" -c 'import deepspeed, torch; print("deepspeed", deepspeed.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)'
say "done: $venv"
