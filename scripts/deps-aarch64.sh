#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install what the aarch64 cross build (cross/aarch64-linux-gnu.ini) and its
# tests under qemu-aarch64 need, if missing: the cross compiler, qemu-user,
# and the arm64 -dev packages through Debian multiarch. Idempotent.
#
# What is left out, and why:
#  - libhwloc-dev:arm64: hwloc is optional (the topology falls back to
#    sysfs), and libhwloc15:arm64 pulls libudev1:arm64, which multiarch ties
#    to the host's libudev1 and so to an upgrade of the host's systemd.
#  - fio, python3-*: the suites the cross script runs do not use them.
# The arm64 libraries are Multi-Arch: same, so apt may first bring a few
# host (amd64) packages to the same version (libssl3, libcom-err2, ...).
set -euo pipefail
host_pkgs=(meson ninja-build pkg-config gcc-aarch64-linux-gnu qemu-user)
# libgomp1: the OpenMP runtime the programs load under qemu (the cross
# toolchain's own copy sits beside its libc, which is not the one they run)
arm_pkgs=(liburing-dev libnuma-dev check libcjson-dev libxxhash-dev libopenblas-dev libgomp1)

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "adding the arm64 architecture to dpkg"
    $sudo dpkg --add-architecture arm64
    need_update=1
fi
missing=()
for p in "${host_pkgs[@]}"; do
    installed "$p" || missing+=("$p")
done
for p in "${arm_pkgs[@]}"; do
    installed "$p:arm64" || missing+=("$p:arm64")
done
if [ ${#missing[@]} -gt 0 ] || [ -n "${need_update:-}" ]; then
    $sudo apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
