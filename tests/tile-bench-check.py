# SPDX-License-Identifier: Apache-2.0
"""zo-tile-bench: fio's mode and file, and the automatic pool slot size.

Usage: tile-bench-check.py fio|slot TOOL

fio: the bench runs a fake fio (a script that records its arguments, checks
     the file it is given, and prints a terse v3 line with a known read
     bandwidth) in a fresh directory under /var/tmp:
       - --fio-iomem malloc: the fio line is io_uring, direct, fixedbufs,
         registerfiles, --iomem=malloc, bs 4 MiB, QD 8; the line the JSON
         prints is the one fio ran; fio's file exists (mode 0600) when fio
         runs, is max(512 MiB, 2 x W) by default, --fio-size when given, is
         the same file in every run (laid out once), and is gone at the end;
         the bandwidth is the fake's;
       - by default: --iomem=shmhuge exactly when fio_iomem says so, and
         otherwise fio's default with the reason given; never shmhuge with
         /proc/sys/vm/nr_hugepages 0; a fio that fails with shmhuge (the
         pages taken meanwhile) is run again with its default buffers.
slot: a small shape whose pinned-host tile (about 6 MB) is above the store's
     default 4 MiB slot: --slot-size auto picks 8 MiB, and the NVMe home then
     gets the pinned-host home's grid; --slot-size 4M cuts the NVMe tiles to
     one slot (more of them). The pool's bytes are reported.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

FAKE_FIO = """#!/bin/sh
# record the arguments, one a line, a blank line after each run
for a in "$@"; do printf '%s\\n' "$a"; done >> "$ZO_FAKE_FIO_LOG"
echo >> "$ZO_FAKE_FIO_LOG"
for a in "$@"; do
  case "$a" in
    --filename=*) f="${a#--filename=}";;
    --iomem=shmhuge) [ -n "$ZO_FAKE_FIO_FAIL_HUGE" ] && { echo "shmget: no huge pages" >&2; exit 1; };;
  esac
done
# the bench made the file (0600) before running fio
[ -f "$f" ] || { echo "no file $f" >&2; exit 3; }
[ "$(stat -c %a "$f")" = 600 ] || { echo "mode of $f" >&2; exit 3; }
cat "$ZO_FAKE_FIO_TERSE"
"""

KB, MS = 1048576, 500  # 1 GiB read in 0.5 s
BW = KB * 1024 / (MS / 1000)


def terse_line():
    f = ["0"] * 130
    f[0], f[1], f[2] = "3", "fio-3.36", "zo-vs-fio"
    f[5], f[6], f[8] = str(KB), str(int(KB / (MS / 1000))), str(MS)
    return ";".join(f) + "\n"


def runs_of(log):
    with open(log) as fh:
        text = fh.read()
    return [r.split("\n") for r in text.split("\n\n") if r.strip()]


def bench(tool, tmp, extra, env_extra=None):
    work = os.path.join(tmp, "work")
    os.makedirs(work, exist_ok=True)
    log = os.path.join(tmp, "fio.log")
    if os.path.exists(log):
        os.unlink(log)
    env = dict(os.environ, ZO_FAKE_FIO_LOG=log, ZO_FAKE_FIO_TERSE=os.path.join(tmp, "terse"), **(env_extra or {}))
    argv = [tool, "--json", "--fio", os.path.join(tmp, "fio"), "--path", work, "--batch", "2", "--out", "64",
            "--in", "96", "--pairs", "2"] + extra
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert p.returncode == 0, (argv, p.returncode, p.stderr)
    o = json.loads(p.stdout)
    assert os.listdir(work) == [], f"left in {work}: {os.listdir(work)}"
    return o, runs_of(log)


def check_fio(tool):
    tmp = tempfile.mkdtemp(prefix="zo-tile-fio-", dir="/var/tmp")
    try:
        with open(os.path.join(tmp, "fio"), "w") as fh:
            fh.write(FAKE_FIO)
        os.chmod(os.path.join(tmp, "fio"), 0o700)
        with open(os.path.join(tmp, "terse"), "w") as fh:
            fh.write(terse_line())

        o, runs = bench(tool, tmp, ["--fio-iomem", "malloc"])
        assert len(runs) == 3, runs  # warm-up (lays the file out) + one per pair
        args = runs[0]
        for want in ("--rw=read", "--direct=1", "--ioengine=io_uring", "--fixedbufs", "--registerfiles",
                     "--iomem=malloc", "--bs=4194304", "--iodepth=8", "--size=536870912"):
            assert want in args, (want, args)
        assert all(r == args for r in runs), runs  # the same file, the same job, every time
        assert o["fio_cmdline"] == " ".join([os.path.join(tmp, "fio")] + args), (o["fio_cmdline"], args)
        assert o["fio_iomem"] == "malloc" and "fio_iomem_note" not in o, o
        assert o["fio_file_bytes"] == 512 << 20 and o["fio_bs"] == 4 << 20 and o["fio_iodepth"] == 8, o
        assert abs(o["fio_read_bytes_per_s"] - BW) < 1e-5 * BW, (o["fio_read_bytes_per_s"], BW)
        assert [a for a in args if a.startswith("--filename=")][0].startswith("--filename=" + tmp), args

        o, runs = bench(tool, tmp, ["--fio-size", "3M"])
        args = runs[0]
        assert "--size=4194304" in args, args  # whole blocks of 4 MiB
        with open("/proc/sys/vm/nr_hugepages") as fh:
            nr = int(fh.read())
        if o["fio_iomem"] == "shmhuge":
            assert "--iomem=shmhuge" in args and "fio_iomem_note" not in o and nr > 0, (o, args)
        else:
            assert not any(a.startswith("--iomem") for a in args), args
            assert "huge pages" in o["fio_iomem_note"], o
        if nr == 0:
            assert o["fio_iomem"] != "shmhuge", o
        if o["fio_iomem"] == "shmhuge":
            # the pages taken between the check and fio's start: fio fails
            # with shmhuge, the bench runs it with its default buffers, said
            f, runs = bench(tool, tmp, ["--fio-size", "3M"], {"ZO_FAKE_FIO_FAIL_HUGE": "1"})
            assert "--iomem=shmhuge" in runs[0] and len(runs) == 4, runs
            assert all(not any(a.startswith("--iomem") for a in r) for r in runs[1:]), runs
            assert f["fio_iomem"].startswith("malloc") and "shmhuge failed" in f["fio_iomem_note"], f
            assert "--iomem" not in f["fio_cmdline"] and f["fio_read_bytes_per_s"] > 0, f
            print("fio: shmhuge failing, the bench fell back to fio's default buffers")
        print("fio: mode, line, file and bandwidth as expected; default iomem", o["fio_iomem"], o.get("fio_iomem_note", ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_json(argv):
    """The tool's --json output; on failure its exit status and stderr, not just a traceback."""
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("%s exited %d:\n%s" % (" ".join(argv), p.returncode, p.stderr + p.stdout))
    return json.loads(p.stdout)


def check_slot(tool):
    base = [tool, "--json", "--no-fio", "--batch", "2", "--out", "3000", "--in", "1000", "--budget", "12M",
            "--pairs", "1", "--path", "/var/tmp"]
    o = run_json(base)
    sp, g, gn = o["store_pool"], o["grid"], o["grid_nvme"]
    assert sp["slot_size_auto"] is True, sp
    s = sp["slot_size"]
    assert s % (1 << 20) == 0 and (s >> 20) & ((s >> 20) - 1) == 0, sp  # a power of two MiB
    assert s >= g["tile_bytes"] > s // 2 and s == 8 << 20, (sp, g)
    assert gn == g, (g, gn)  # the NVMe home walks the pinned-host home's grid
    assert sp["pool_bytes"] == sp["slots"] * s and sp["pinned_bytes"] >= sp["pool_bytes"], sp
    o4 = run_json(base + ["--slot-size", "4M"])
    sp4, g4, gn4 = o4["store_pool"], o4["grid"], o4["grid_nvme"]
    assert sp4["slot_size_auto"] is False and sp4["slot_size"] == 4 << 20, sp4
    assert g4 == g and gn4["tile_bytes"] <= 4 << 20 and gn4["tiles_out"] > g4["tiles_out"], (g4, gn4)
    print(f"slot: auto {s >> 20} MiB for a {g['tile_bytes']}-byte tile, {g['tiles_out']} NVMe tiles; "
          f"4 MiB slots: {gn4['tiles_out']}")


def main():
    what, tool = sys.argv[1], sys.argv[2]
    {"fio": check_fio, "slot": check_slot}[what](tool)


if __name__ == "__main__":
    main()
