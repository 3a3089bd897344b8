#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# An external C program against the *installed* library, as the README says
# a user builds one (issue 21):
#   shared:  cc app.c $(pkg-config --cflags --libs zoffload)
#   static:  cc app.c $(pkg-config --static --cflags --libs zoffload), with
#            only libzoffload.a in the library folder
# The library is installed with `meson install --destdir` into a scratch
# folder; pkg-config reads the installed .pc with its prefix moved there.
# The program (tests/external/app.c) checks that loading the library starts
# no thread and that OpenBLAS loads only at the first GEMM.
#
# usage: external_link.sh BUILD_DIR SOURCE_DIR [expect-openblas]
# exit 0 pass, 1 fail, 77 skip (no C compiler or pkg-config)
set -euo pipefail
build=$1 src=$2 expect=${3:-}
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "SKIP: no C compiler ($cc)"; exit 77; }
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest=$work/root
meson install -C "$build" --no-rebuild --destdir "$dest" --quiet >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; echo "FAIL: meson install"; exit 1; }
pc=$(find "$dest" -name zoffload.pc -path '*pkgconfig*' | head -1)
[ -n "$pc" ] || { echo "FAIL: no zoffload.pc installed"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
export PKG_CONFIG_PATH=$(dirname "$pc")
unset PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR
PC=(pkg-config --define-variable=prefix="$dest$prefix")
libdir=$("${PC[@]}" --variable=libdir zoffload)

# --cflags names our headers only (no cJSON / OpenBLAS include dirs)
cflags=$("${PC[@]}" --cflags zoffload)
echo "cflags: $cflags"
case "$cflags" in *cjson*|*openblas*|*blas*) echo "FAIL: --cflags leaks a dependency's include dir"; exit 1 ;; esac

# shared: the documented command, plus an rpath (the library is not in the
# loader's path here; an installed one in /usr/local needs ldconfig instead)
libs=$("${PC[@]}" --libs zoffload)
echo "shared: $cc app.c $cflags $libs"
"$cc" ${EXTRA_CFLAGS:-} -o "$work/app-shared" "$src/tests/external/app.c" $cflags $libs -Wl,-rpath,"$libdir"
"$work/app-shared" $expect

# static: libzoffload.a alone in the folder, so -lzoffload can only mean it
mkdir -p "$work/static"
cp "$libdir/libzoffload.a" "$work/static/"
slibs=$("${PC[@]}" --define-variable=libdir="$work/static" --static --libs zoffload)
echo "static: $cc app.c $cflags $slibs"
case "$slibs" in *-ludev*|*-lgfortran*|*libcudart_static.a*) echo "FAIL: --static asks for what is not ours: $slibs"; exit 1 ;; esac
"$cc" ${EXTRA_CFLAGS:-} -o "$work/app-static" "$src/tests/external/app.c" $cflags $slibs
if ldd "$work/app-static" | grep -q libzoffload; then
    echo "FAIL: the static build still needs libzoffload.so"; exit 1
fi
"$work/app-static" $expect
echo "external link: shared and static ok"
