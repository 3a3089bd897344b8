#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the Debian packages zoffload builds and tests with, if missing.
# The CUDA toolkit is expected in /usr/local/cuda (or $CUDA_PATH); without
# it the build simply has no CUDA backend. The python3-* packages are for the
# Python bindings' tests (they run with /usr/bin/python3); qemu-user runs the
# dispatch checks on CPUs this machine is not (scripts/emulated-check.sh).
# python3-venv makes the test venv of scripts/deps-python.sh. Open MPI is
# for the partitioned engine's test under mpirun (include/zoffload/comm_mpi.h;
# the library itself links no MPI).
set -euo pipefail
pkgs=(meson ninja-build pkg-config gcc g++ liburing-dev libnuma-dev libhwloc-dev check fio
      libcjson-dev libxxhash-dev util-linux binutils libopenblas-dev
      python3-numpy python3-torch python3-pytest python3-venv qemu-user libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
