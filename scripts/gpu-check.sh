#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check as one prepared command (issue 20).
#
# GPU machines are lent to few sessions, for minutes, without a network. So
# the work is split in two:
#
#   scripts/gpu-check.sh --prepare   here, with the network: downloads the
#       Debian packages the build needs into .gpu-deps/ and builds a static
#       fio from Debian's source (the NVMe bounds' reference).
#   scripts/gpu-check.sh             there: refuses at once without a CUDA
#       device; unpacks .gpu-deps/ into a private prefix (never into /),
#       builds with CUDA for sm_90 on every core, runs the CUDA test suites,
#       zo-info, zo-optim-bench, zo-tile-bench and zo-train on the GPU,
#       each under its own time cap inside one budget, and writes
#       report.json, report.md (rows for docs/benchmarks.md) and
#       gpu-check.log. A failing step does not stop the others.
#
# --help prints the exact device call. Exit status: 0 every step passed,
# 1 a step failed (the report says which and why), 2 bad usage, 3 no CUDA
# device or driver (refused before building anything), 4 a tool or the
# prepared bundle is missing (the message names it).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
self="scripts/gpu-check.sh"

EXIT_FAIL=1 EXIT_USAGE=2 EXIT_NODEV=3 EXIT_MISSING=4

# Debian packages carried to the GPU machine: the -dev packages of the
# optional features (all turned on there) and their libraries; pkgconf for
# an image without pkg-config.
build_debs=(liburing-dev liburing2 libnuma-dev libnuma1 libhwloc-dev libhwloc15 check libsubunit-dev
            libsubunit0 libcjson-dev libcjson1 libxxhash-dev libxxhash0 libopenblas-pthread-dev
            libopenblas0-pthread pkgconf-bin libpkgconf3)
# Runtime libraries most images have: unpacked only where the system lacks
# the soname, so that the system's own copy is never shadowed.
fallback_debs=(libgfortran5:libgfortran.so.5 libquadmath0:libquadmath.so.0 libudev1:libudev.so.1)
# The CUDA suites (tests/meson.build, zo-train's backend-cuda case).
cuda_tests=(dev-cuda store-cuda tiling-cuda example-platform-cuda example-optim-cuda zo-train-backend-cuda)

usage() {
    cat <<EOF
usage: $self --prepare [--deps DIR]
       $self [--out DIR] [--build-dir DIR] [--deps DIR] [--budget SECONDS] [--jobs N]
                 [--nvme-path DIR] [--system-deps] [--host-rehearsal] [--libcuda PATH]
                 [--only STEPS]
       $self --check-device [--libcuda PATH]

The GPU run as one prepared command (docs/benchmarks.md, "GPU check").

  --prepare         here, with a network (Debian 12): download the packages the
                    build needs into DIR (default .gpu-deps, git-ignored, about
                    16 MiB) and build a static fio there from Debian's source
  (no mode)         on the GPU machine: check the device, unpack DIR into a private
                    prefix, build with -Dcuda=enabled -Dsm_archs=90, then run and
                    time each step and write the report
  --check-device    only the device check: exit 0 with the GPUs found, 3 without

  --out DIR         report folder (default \$OUT/gpu-check when \$OUT is set, else
                    gpu-check-<UTC date>/ in the repository): report.json,
                    report.md, gpu-check.log
  --build-dir DIR   build folder (default build-gpu); the prefix is DIR/deps-prefix
  --budget S        wall-clock budget for all steps (default 540: the device
                    tool's commands stop at 600 s); each step is capped inside it
  --jobs N          build jobs (default: every CPU)
  --nvme-path DIR   where the NVMe runs put their files (default /var/tmp)
  --system-deps     build against the installed packages instead of the bundle
  --host-rehearsal  no GPU needed: the same build, steps and report, on the host
                    backend at small sizes (to test this script)
  --only STEPS      run only these steps (comma-separated: zo-info, tests, optim-host,
                    optim-dpu, tile-a, tile-b, train-host, optim-nvme, train-nvme) after
                    deps, setup and compile: a short rerun of what failed
  --libcuda PATH    driver library the device check loads (default libcuda.so.1;
                    the tests point it at a missing file)

Exit status: 0 every step passed, 1 a step failed (see the report), 2 bad
usage, 3 no CUDA device or driver (refused before building), 4 a tool or
the prepared bundle is missing.

The device call (device tool "run"; one command, its steps inside the budget):
  carry:     [".gpu-deps"]
  command:   bash scripts/gpu-check.sh
  timeout_s: 600
The report comes back under \$OUT/gpu-check/ (3 files).
EOF
}

say() { printf 'gpu-check: %s\n' "$*" >&2; }

# ---- arguments ---------------------------------------------------------------------------------
mode=run out="" build_dir="$root/build-gpu" deps_dir="$root/.gpu-deps" budget=540 jobs="" nvme_path=/var/tmp
system_deps=0 rehearsal=0 libcuda=libcuda.so.1 only=""
while [ $# -gt 0 ]; do
    case "$1" in
    --prepare) mode=prepare ;;
    --check-device) mode=check ;;
    --out) out=${2:?}; shift ;;
    --build-dir) build_dir=${2:?}; shift ;;
    --deps) deps_dir=${2:?}; shift ;;
    --budget) budget=${2:?}; shift ;;
    --jobs) jobs=${2:?}; shift ;;
    --nvme-path) nvme_path=${2:?}; shift ;;
    --system-deps) system_deps=1 ;;
    --host-rehearsal) rehearsal=1 ;;
    --libcuda) libcuda=${2:?}; shift ;;
    --only) only=,${2:?},; shift ;;
    -h|--help) usage; exit 0 ;;
    *) say "unknown option '$1' (see --help)"; exit $EXIT_USAGE ;;
    esac
    shift
done
case "$budget" in ''|*[!0-9]*) say "--budget '$budget': expected seconds"; exit $EXIT_USAGE ;; esac
case "$jobs" in *[!0-9]*) say "--jobs '$jobs': expected a count"; exit $EXIT_USAGE ;; esac
abspath() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "$1" ;; esac; }
build_dir=$(abspath "$build_dir") deps_dir=$(abspath "$deps_dir")
[ -n "$out" ] && out=$(abspath "$out")

# ---- --prepare: here, with a network --------------------------------------------------------------
prepare() {
    local missing=() t
    for t in apt-get dpkg-deb sha256sum cc make tar strip; do
        command -v "$t" >/dev/null || missing+=("$t")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "--prepare needs: ${missing[*]} (Debian: apt-get install apt dpkg coreutils gcc make tar binutils)"
        return $EXIT_MISSING
    fi
    local tmp
    tmp=$(mktemp -d) || return $EXIT_FAIL
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" RETURN
    # A private copy of this machine's apt sources, with deb-src added, and
    # private lists: the system's apt state is left as it is.
    mkdir -p "$tmp/parts" "$tmp/lists/partial" "$tmp/cache/archives/partial"
    local f n=0
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        sed 's/^Types:.*/Types: deb deb-src/' "$f" >"$tmp/parts/s$n.sources"; n=$((n + 1))
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        sed -n 's/^deb \(.*\)/deb \1\ndeb-src \1/p' "$f" >"$tmp/parts/l$n.list"; n=$((n + 1))
    done
    local apt=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$tmp/parts"
               -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o APT::Architecture=amd64
               -o APT::Architectures=amd64)
    [ "$(id -u)" = 0 ] && apt+=(-o APT::Sandbox::User=root)
    say "apt-get update (private lists in $tmp)"
    "${apt[@]}" update >"$tmp/update.log" 2>&1 || { cat "$tmp/update.log" >&2; return $EXIT_FAIL; }
    mkdir -p "$deps_dir" || return $EXIT_FAIL
    rm -f "$deps_dir"/*.deb "$deps_dir/fio" "$deps_dir/MANIFEST"
    local p pkgs=("${build_debs[@]}")
    for p in "${fallback_debs[@]}"; do pkgs+=("${p%%:*}"); done
    say "downloading ${#pkgs[@]} packages into $deps_dir"
    (cd "$deps_dir" && "${apt[@]}" download "${pkgs[@]/%/:amd64}") >"$tmp/download.log" 2>&1 ||
        { cat "$tmp/download.log" >&2; return $EXIT_FAIL; }
    # fio, static: Debian's fio links ceph, gluster, rdma and more. The
    # engines the tools use (io_uring, psync) are fio's own code.
    say "building a static fio from Debian's source"
    (cd "$tmp" && "${apt[@]}" source --download-only fio) >"$tmp/source.log" 2>&1 ||
        { cat "$tmp/source.log" >&2; return $EXIT_FAIL; }
    local orig
    orig=$(ls "$tmp"/fio_*.orig.tar.* 2>/dev/null | head -n1)
    [ -n "$orig" ] || { say "no fio source tarball was downloaded"; return $EXIT_FAIL; }
    mkdir "$tmp/fio" && tar -xf "$orig" -C "$tmp/fio" --strip-components=1 || return $EXIT_FAIL
    (cd "$tmp/fio" && ./configure --build-static --disable-native --disable-numa --disable-rdma \
        --disable-rados --disable-rbd --disable-http --disable-gfapi --disable-libnfs --disable-pmem \
        --disable-xnvme --disable-libzbc --disable-tcmalloc --disable-dfs --disable-lex &&
        make -j "$(nproc)" fio) >"$tmp/fio.log" 2>&1 || { tail -n 30 "$tmp/fio.log" >&2; return $EXIT_FAIL; }
    strip -o "$deps_dir/fio" "$tmp/fio/fio" || return $EXIT_FAIL
    grep -qw io_uring <<<"$("$deps_dir/fio" --enghelp 2>/dev/null)" ||
        { say "the fio built has no io_uring engine"; return $EXIT_FAIL; }
    {
        echo "# gpu-check bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release 2>/dev/null;
              echo "${PRETTY_NAME:-unknown}")"
        echo "# package version sha256"
        for f in "$deps_dir"/*.deb; do
            echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(sha256sum <"$f" | cut -d' ' -f1)"
        done
        echo "fio $("$deps_dir/fio" --version) $(sha256sum <"$deps_dir/fio" | cut -d' ' -f1)"
    } >"$deps_dir/MANIFEST"
    local bytes
    bytes=$(du -sb "$deps_dir" | cut -f1)
    say "bundle ready: $deps_dir, $(ls "$deps_dir"/*.deb | wc -l) packages + fio, $((bytes / 1048576)) MiB"
    if [ "$bytes" -gt $((48 << 20)) ]; then
        say "warning: over 48 MiB; the device tool carries 64 MiB with the working tree"
    fi
    return 0
}

if [ "$mode" = prepare ]; then
    prepare
    exit $?
fi

# ---- the device check: before anything costs time ----------------------------------------------
command -v python3 >/dev/null || { say "missing: python3 (the device check and the report need it)"; exit $EXIT_MISSING; }

# Prints one JSON line: {"ok": true, "driver_version": N, "devices": [...]} or
# {"ok": false, "reason": "..."}; exit 0 with a device, 3 without.
probe_device() {
    python3 - "$libcuda" <<'EOF'
import ctypes, json, sys
lib_name = sys.argv[1]
def out(ok, **kw):
    print(json.dumps(dict(ok=ok, libcuda=lib_name, **kw)))
    sys.exit(0 if ok else 3)
try:
    cu = ctypes.CDLL(lib_name)
except OSError as e:
    out(False, reason="no NVIDIA driver: %s cannot be loaded (%s)" % (lib_name, e))
def err(rc):
    s = ctypes.c_char_p()
    if hasattr(cu, "cuGetErrorName") and cu.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
        return "%s (%d)" % (s.value.decode(), rc)
    return "error %d" % rc
rc = cu.cuInit(0)
if rc:
    out(False, reason="the NVIDIA driver does not start: cuInit: %s" % err(rc))
ver, n = ctypes.c_int(0), ctypes.c_int(0)
cu.cuDriverGetVersion(ctypes.byref(ver))
rc = cu.cuDeviceGetCount(ctypes.byref(n))
if rc or n.value < 1:
    out(False, reason="no CUDA device: cuDeviceGetCount: %s" % (err(rc) if rc else "0 devices"))
devs = []
for i in range(n.value):
    d, name, mem = ctypes.c_int(0), ctypes.create_string_buffer(256), ctypes.c_size_t(0)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cu.cuDeviceGet(ctypes.byref(d), i)
    cu.cuDeviceGetName(name, 256, d)
    cu.cuDeviceTotalMem_v2(ctypes.byref(mem), d)
    cu.cuDeviceGetAttribute(ctypes.byref(major), 75, d)  # COMPUTE_CAPABILITY_MAJOR
    cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, d)
    devs.append(dict(name=name.value.decode(errors="replace"), total_mem=mem.value,
                     cc="%d.%d" % (major.value, minor.value)))
out(True, driver_version=ver.value, devices=devs)
EOF
}

device_json=$(probe_device)
device_rc=$?
device_reason=$(printf '%s' "$device_json" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("reason", ""))' 2>/dev/null)
if [ "$mode" = check ]; then
    if [ $device_rc -eq 0 ]; then
        printf '%s\n' "$device_json"
        exit 0
    fi
    say "no CUDA device or driver here: ${device_reason:-the probe failed}"
    exit $EXIT_NODEV
fi

if [ -z "$out" ]; then
    if [ -n "${OUT:-}" ]; then out="$OUT/gpu-check"; else out="$root/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"; fi
fi
mkdir -p "$out" || { say "cannot make the report folder $out"; exit $EXIT_USAGE; }
# Per-step raw output, outside the report folder: what the device tool
# brings back is the report folder's files, not this.
work=$(mktemp -d) || { say "cannot make a scratch folder"; exit $EXIT_FAIL; }
trap 'rm -rf "$work"' EXIT
: >"$work/steps.tsv"
printf '%s\n' "$device_json" >"$work/device.json"
start_s=$(date +%s)
deadline=$((start_s + budget))

report() {  # report STATUS [REASON]
    python3 "$root/scripts/gpu_check_report.py" --work "$work" --out "$out" --status "$1" \
        --reason "${2:-}" --build-dir "$build_dir" --budget "$budget" --rehearsal "$rehearsal" \
        --started "$start_s"
}

if [ $device_rc -ne 0 ] && [ $rehearsal -eq 0 ]; then
    say "refused: no CUDA device or driver here: ${device_reason:-the probe failed}"
    say "nothing was built; run this on a GPU machine (the device call: $self --help)"
    report refused "no CUDA device or driver: ${device_reason:-the probe failed}" >/dev/null
    exit $EXIT_NODEV
fi
[ $rehearsal -eq 1 ] && say "host rehearsal: no GPU is used (device check: ${device_reason:-a GPU is there})"

# ---- tools and the bundle -----------------------------------------------------------------------
missing=()
cuda_root=${CUDA_PATH:-${CUDA_HOME:-/usr/local/cuda}}
if [ ! -x "$cuda_root/bin/nvcc" ] && command -v nvcc >/dev/null; then
    cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
fi
[ -x "$cuda_root/bin/nvcc" ] || missing+=("nvcc (looked in \$CUDA_PATH, \$CUDA_HOME, /usr/local/cuda and PATH)")
for t in cc c++ timeout; do command -v $t >/dev/null || missing+=("$t"); done
# meson and ninja: commands, or the pip packages of this python3
meson_cmd=()
if command -v meson >/dev/null; then meson_cmd=(meson)
elif python3 -c 'import mesonbuild' 2>/dev/null; then meson_cmd=(python3 -m mesonbuild.mesonmain)
else missing+=("meson (command or python3's mesonbuild)"); fi
if ! command -v ninja >/dev/null; then
    nbin=$(python3 -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null)
    if [ -n "$nbin" ] && [ -x "$nbin/ninja" ]; then PATH="$nbin:$PATH"; else missing+=("ninja"); fi
fi
if [ $system_deps -eq 0 ]; then
    command -v dpkg-deb >/dev/null || command -v ar >/dev/null || missing+=("dpkg-deb or ar (to unpack .deb files)")
    for p in "${build_debs[@]}"; do
        ls "$deps_dir/${p}_"*.deb >/dev/null 2>&1 || missing+=("$deps_dir/${p}_*.deb")
    done
    for p in "${fallback_debs[@]}"; do
        ls "$deps_dir/${p%%:*}_"*.deb >/dev/null 2>&1 || missing+=("$deps_dir/${p%%:*}_*.deb")
    done
else
    pkg-config --version >/dev/null 2>&1 || missing+=("pkg-config")
fi
if [ ${#missing[@]} -gt 0 ]; then
    for m in "${missing[@]}"; do say "missing: $m"; done
    [ $system_deps -eq 0 ] && say "run '$self --prepare' on a machine with a network first, and carry $deps_dir"
    report missing "missing: ${missing[*]}" >/dev/null
    exit $EXIT_MISSING
fi
fio=""
if [ -x "$deps_dir/fio" ] && [ $system_deps -eq 0 ]; then fio="$deps_dir/fio"
elif command -v fio >/dev/null; then fio=$(command -v fio); fi
[ -z "$jobs" ] && jobs=$(nproc)
# Each step's cap is sized for the GPU machine's 16 cores; a rehearsal on a
# small machine gets four times as long.
cap_scale=1
[ $rehearsal -eq 1 ] && cap_scale=4

# ---- steps -------------------------------------------------------------------------------------
# step NAME CAP [--stdout FILE] -- COMMAND...: runs COMMAND under timeout,
# capped by what is left of the budget (15 s kept for the report); output
# into the combined log; one line into steps.tsv. Never stops the script.
log="$out/gpu-check.log"
: >"$log"
step() {
    local name=$1 cap=$2 stdout_file="" inline=0
    shift 2
    if [ "$1" = --stdout ]; then stdout_file=$2; shift 2; fi
    if [ "$1" = --inline ]; then inline=1; shift; fi  # a function of this shell, no timeout
    [ "$1" = -- ] && shift
    local now left cmd
    case "$name" in
    deps|setup|compile) ;;  # what every other step needs
    *) if [ -n "$only" ] && [[ "$only" != *",$name,"* ]]; then
           printf '%s\tskipped\t\t0\t0\t%s\tnot in --only\n' "$name" "$(printf '%q ' "$@")" >>"$work/steps.tsv"
           return 1
       fi ;;
    esac
    now=$(date +%s)
    left=$((deadline - now - 15))
    cmd=$(printf '%q ' "$@")
    if [ $left -lt 10 ]; then
        printf '%s\tskipped\t\t0\t0\t%s\tout of time: %ss of the %ss budget left\n' "$name" "${cmd% }" \
            $((deadline - now)) "$budget" >>"$work/steps.tsv"
        say "$name: skipped (out of time)"
        return 1
    fi
    cap=$((cap * cap_scale))
    [ "$cap" -gt "$left" ] && cap=$left
    say "$name: $cmd (cap ${cap}s)"
    {
        printf '\n===== %s: %s\n===== cap %ss, started %s\n' "$name" "${cmd% }" "$cap" "$(date -u +%H:%M:%SZ)"
    } >>"$log"
    local t0 t1 rc status note=""
    t0=$(date +%s.%N)
    if [ $inline -eq 1 ]; then
        "$@" >>"$log" 2>&1
    elif [ -n "$stdout_file" ]; then
        timeout --kill-after=10 "$cap" "$@" >"$stdout_file" 2>>"$log"
    else
        timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
    fi
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
    0) status=ok ;;
    124|137) status=timeout; note="stopped at its cap of ${cap}s" ;;
    *) status=failed; note="exit $rc" ;;
    esac
    local secs
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
    # the tool's JSON into the log too: the log comes back even if the
    # device tool stops this script before the report is written
    [ -n "$stdout_file" ] && cat "$stdout_file" >>"$log" 2>/dev/null
    printf '===== %s: %s, exit %s, %ss\n' "$name" "$status" "$rc" "$secs" >>"$log"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" "$cap" "${cmd% }" "$note" >>"$work/steps.tsv"
    say "$name: $status in ${secs}s"
    return $rc
}

# ---- the private prefix ------------------------------------------------------------------------
unpack_deb() {  # unpack_deb FILE DIR
    if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$1" "$2"
    else  # a .deb is an ar archive; tar finds the data member's compression itself
        local m d rc
        m=$(ar t "$1" | grep '^data\.tar') || return 1
        d=$(mktemp -d) || return 1
        (cd "$d" && ar x "$1" "$m") && tar -xf "$d/$m" -C "$2"
        rc=$?
        rm -rf "$d"
        return $rc
    fi
}

prefix="$build_dir/deps-prefix"
# the loader's cache, read once (grep -q on a pipe would kill ldconfig with
# SIGPIPE, which pipefail reports as "not found")
ldcache=$(ldconfig -p 2>/dev/null)
unpack_bundle() {
    local multiarch P L p soname f
    multiarch=$(cc -print-multiarch 2>/dev/null)
    multiarch=${multiarch:-x86_64-linux-gnu}
    rm -rf "$prefix" && mkdir -p "$prefix" || return 1
    P=$prefix L="$prefix/usr/lib/$multiarch"
    for p in "${build_debs[@]}"; do
        for f in "$deps_dir/${p}_"*.deb; do unpack_deb "$f" "$P" || { echo "cannot unpack $f"; return 1; }; done
    done
    : >"$work/fallback.tsv"
    for p in "${fallback_debs[@]}"; do
        soname=${p#*:}
        if grep -q "^[[:space:]]*$soname " <<<"$ldcache"; then
            printf '%s\tsystem\n' "$soname" >>"$work/fallback.tsv"
        else
            for f in "$deps_dir/${p%%:*}_"*.deb; do unpack_deb "$f" "$P" || return 1; done
            printf '%s\tcarried\n' "$soname" >>"$work/fallback.tsv"
        fi
    done
    # pkg-config sees the prefix alone (never the system's .pc files), and
    # the sysroot moves every -I and -L into it.
    export PKG_CONFIG_LIBDIR="$L/pkgconfig:$L/openblas-pthread/pkgconfig:$P/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$P"
    unset PKG_CONFIG_PATH
    # pkgconf drops -I and -L of the CPATH and LIBRARY_PATH folders (set
    # below as a backstop) as "system" ones: keep them in the flags
    export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
    # the multiarch folder too: Debian's hwloc.pc relies on the compiler's
    # default /usr/include/<multiarch> for hwloc/autogen/config.h
    export CPATH="$P/usr/include/$multiarch:$P/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$L:$L/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if ! pkg-config --version >/dev/null 2>&1; then  # absent, or not working
        mkdir -p "$P/bin"
        printf '#!/bin/sh\nexec "%s" "$@"\n' "$P/usr/bin/pkgconf" >"$P/bin/pkg-config"
        chmod +x "$P/bin/pkg-config"
        export PATH="$P/bin:$PATH"
        echo "pkg-config: the carried pkgconf"
    fi
    echo "prefix: $P"
    for p in liburing numa hwloc check libcjson libxxhash openblas; do
        echo "  $p: $(pkg-config --modversion $p 2>&1) $(pkg-config --cflags --libs $p 2>&1)"
    done
}

# cuBLAS is opened at run time (lib/dev/cuda_blas.c): make the toolkit's copy
# findable when the loader's paths do not have it.
cublas_dir=""
cublas_major=$(sed -n 's/^#define CUBLAS_VER_MAJOR[[:space:]]*\([0-9]*\).*/\1/p' "$cuda_root/include/cublas_api.h" 2>/dev/null)
if [ -n "$cublas_major" ] && ! grep -q "libcublas.so.$cublas_major " <<<"$ldcache"; then
    for d in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/x86_64-linux/lib"; do
        [ -e "$d/libcublas.so.$cublas_major" ] && { cublas_dir=$d; break; }
    done
fi
[ -n "$cublas_dir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cublas_dir"

{
    echo "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${budget}s, ${jobs} jobs, rehearsal $rehearsal"
    echo "repository: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
         "$([ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ] && echo '(with local changes)')"
    echo "device: $device_json"
    echo "cuda: $cuda_root ($("$cuda_root/bin/nvcc" --version | tail -n1)); cublas ${cublas_major:-?}: ${cublas_dir:-loader paths}"
    echo "meson: $("${meson_cmd[@]}" --version), ninja: $(ninja --version), cc: $(cc --version | head -n1)"
    echo "fio: ${fio:-none}"
    command -v nvidia-smi >/dev/null && nvidia-smi 2>&1
} >>"$log"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader \
        >"$work/nvidia-smi.csv" 2>/dev/null
fi

# ---- 1. build ----------------------------------------------------------------------------------
if [ $system_deps -eq 0 ]; then
    step deps 60 --inline -- unpack_bundle || { report failed "the bundle could not be unpacked"; exit $EXIT_FAIL; }
fi
setup_opts=(-Dcuda=enabled -Dsm_archs=90 "-Dcudatoolkit=$cuda_root" -Dliburing=enabled -Dnuma=enabled
            -Dhwloc=enabled -Dtests=enabled -Dopenblas=enabled)
# A build folder set up otherwise (other options, or the other source of
# dependencies) is set up afresh: meson keeps what it found.
stamp="setup ${setup_opts[*]} deps=$([ $system_deps -eq 0 ] && echo "$prefix" || echo system)"
setup_how=()
if [ -f "$build_dir/build.ninja" ]; then
    if [ "$(cat "$build_dir/gpu-check.stamp" 2>/dev/null)" = "$stamp" ]; then setup_how=(--reconfigure)
    else setup_how=(--wipe); fi
fi
rm -f "$build_dir/gpu-check.stamp"
if ! step setup 60 -- "${meson_cmd[@]}" setup "${setup_how[@]}" "$build_dir" "$root" "${setup_opts[@]}"; then
    report failed "meson setup failed (see gpu-check.log)"
    exit $EXIT_FAIL
fi
printf '%s\n' "$stamp" >"$build_dir/gpu-check.stamp"
if ! step compile 300 -- "${meson_cmd[@]}" compile -C "$build_dir" -j "$jobs"; then
    report failed "the build failed (see gpu-check.log)"
    exit $EXIT_FAIL
fi
# where the loader takes each carried library from: the prefix, or not
for b in "$build_dir/libzoffload.so" "$build_dir/tools/zo-train"; do
    [ -e "$b" ] && ldd "$b" | sed "s|^|$(basename "$b"): |" >>"$work/ldd.txt"
done

# ---- 2. zo-info: the GPU as the library sees it --------------------------------------------------
tools="$build_dir/tools"
step zo-info 30 --stdout "$work/zo-info.json" -- "$tools/zo-info" --json --path "$nvme_path"
cuda_ok=$(python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(next((1 for b in d["devices"] if b["backend"] == "cuda" and b["available"]), 0))
except Exception:
    print(0)' "$work/zo-info.json")
if [ "$cuda_ok" != 1 ] && [ $rehearsal -eq 0 ]; then
    why=$(python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(next((b.get("reason", "") for b in d["devices"] if b["backend"] == "cuda"), "no cuda entry"))
except Exception as e:
    print("zo-info gave no JSON: %s" % e)' "$work/zo-info.json")
    say "refused: the CUDA backend is unavailable: $why"
    report refused "the CUDA backend is unavailable in zo-info: $why"
    exit $EXIT_NODEV
fi

# ---- 3. the CUDA test suites ---------------------------------------------------------------------
step tests 150 -- "${meson_cmd[@]}" test -C "$build_dir" --no-rebuild --print-errorlogs "${cuda_tests[@]}"
cp "$build_dir/meson-logs/testlog.json" "$work/testlog.json" 2>/dev/null

# ---- 4-6. the benchmarks -------------------------------------------------------------------------
fio_opt=(--no-fio) bench_fio=()
if [ -n "$fio" ]; then fio_opt=(--fio "$fio"); bench_fio=(--fio "$fio"); fi
# fio's huge-page buffers (its best mode) where free huge pages hold them
# (this script reserves none: the machine's settings are left alone)
hp_free=$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo 2>/dev/null)
[ -n "$fio" ] && [ "${hp_free:-0}" -ge 64 ] && bench_fio+=(--fio-iomem shmhuge)
nvme_dir="$nvme_path"
if [ $rehearsal -eq 1 ]; then
    be=host
    optim_host=(--params 16M --tensor-elems 4M --vs-bound --pairs 2)
    optim_dpu=(--params 16M --tensor-elems 4M --dpu --compute-ms 20 --vs-bound --pairs 2)
    optim_nvme=(--placement nvme --params 16M --tensor-elems 4M --pairs 2 --fio-runtime once)
    tile_a=(--batch 16 --out 512 --in 512 --pairs 2 --fio-size 8M)
    tile_b=(--batch 4 --out 1024 --in 1024 --pairs 2 --fio-size 8M)
    train_host=(--layers 3 --width 256 --batch 16 --steps 4 --offload host --dpu on)
    train_nvme=(--layers 3 --width 256 --batch 16 --steps 4 --offload nvme)
else
    be=cuda
    # 1G parameters: 12 GiB of fp32 masters and AdamW states in pinned
    # host memory, a 2 GiB bf16 gradient window; bound: the bare fused kernel
    optim_host=(--params 1G --vs-bound --pairs 5)
    # DPU: the update of 1G runs under 300 ms of device work per iteration
    optim_dpu=(--params 1G --dpu --compute-ms 300 --vs-bound --pairs 5)
    # NVMe: 256M parameters, 3 GiB of state read and written per step,
    # against fio on the same disk (4 GiB cap on fio's file)
    optim_nvme=(--placement nvme --params 256M --pairs 3 --fio-runtime once)
    # issue 13's shapes (docs/benchmarks.md): tiles copied to the GPU
    tile_a=(--batch 512 --out 4096 --in 4096 --pairs 5)
    tile_b=(--batch 16 --out 8192 --in 8192 --pairs 5)
    # 1.07B parameters (16 layers of 8192); the device budget holds the bf16
    # parameters, gradients and activations, not the 12.9 GB of fp32 masters
    # and AdamW states, which go to pinned host memory
    train_host=(--layers 16 --width 8192 --batch 64 --steps 12 --offload host --dpu on)
    # 268M parameters (4 layers of 8192), states (3.2 GB) on NVMe
    train_nvme=(--layers 4 --width 8192 --batch 64 --steps 8 --offload nvme)
fi
[ -n "$fio" ] && optim_nvme+=(--vs-bound)
[ -n "$fio" ] || say "no fio: the NVMe runs have no disk bound"

step optim-host 90 --stdout "$work/optim-host.json" -- "$tools/zo-optim-bench" --backend $be --json --no-progress \
    "${optim_host[@]}"
step optim-dpu 90 --stdout "$work/optim-dpu.json" -- "$tools/zo-optim-bench" --backend $be --json --no-progress \
    "${optim_dpu[@]}"
step tile-a 60 --stdout "$work/tile-a.json" -- "$tools/zo-tile-bench" --device $be --json --path "$nvme_dir" \
    "${fio_opt[@]}" "${tile_a[@]}"
step tile-b 60 --stdout "$work/tile-b.json" -- "$tools/zo-tile-bench" --device $be --json --path "$nvme_dir" \
    "${fio_opt[@]}" "${tile_b[@]}"
if [ -x "$tools/zo-train" ]; then
    rm -f "$work/train-host.jsonl" "$work/train-nvme.jsonl"
    step train-host 90 -- "$tools/zo-train" --backend $be --json "$work/train-host.jsonl" "${train_host[@]}"
else
    printf 'train-host\tfailed\t\t0\t0\tzo-train\tzo-train was not built (OpenBLAS missing)\n' >>"$work/steps.tsv"
fi
step optim-nvme 120 --stdout "$work/optim-nvme.json" -- "$tools/zo-optim-bench" --backend $be --json --no-progress \
    --nvme-path "$nvme_dir" "${bench_fio[@]}" "${optim_nvme[@]}"
if [ -x "$tools/zo-train" ]; then
    step train-nvme 120 -- "$tools/zo-train" --backend $be --json "$work/train-nvme.jsonl" --nvme-path "$nvme_dir" \
        "${train_nvme[@]}"
fi

# ---- the report: its verdict is the exit status (0 ok, 1 a step not ok) ----------------------------
if awk -F'\t' '$2 != "ok" {bad = 1} END {exit !bad}' "$work/steps.tsv"; then
    report failed ""
else
    report ok ""  # still 1 where a CUDA suite skipped on the GPU
fi
exit $?
