# SPDX-License-Identifier: Apache-2.0
"""zo-store-bench --optim --vs-fio and zo-tile-bench lay fio's file out
themselves before fio first runs, so that fio never lays it out with
buffered writes whose write-back would slow the next timed runs.

Usage: fio-file-prepared.py store|tile TOOL

A fake fio (a Python script, --fio PATH) records, on each run, whether the
file named by --filename already held --size bytes on disk (allocated, not
sparse, and not all zeros), then prints a terse v3 line. The tool must
succeed and every fake run must have found the file ready.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

FAKE_FIO = r'''#!/usr/bin/env python3
import os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
path, size = args["filename"], int(args["size"])
st = os.stat(path)
with open(path, "rb") as f:
    head = f.read(1 << 20)
ok = st.st_size == size and st.st_blocks * 512 >= size and any(head)
with open(os.environ["ZO_FAKE_FIO_LOG"], "a") as log:
    log.write("%s %d %d %d\n" % ("ready" if ok else "not-ready", st.st_size, st.st_blocks * 512, size))
f = ["0"] * 130
f[0], f[1], f[2] = "3", "fio-3.33", "zo-vs-fio"
f[5], f[8] = "1048576", "1000"    # 1 GiB read in 1 s
f[46], f[49] = "1048576", "1000"  # the same written
print(";".join(f))
'''


def main():
    kind, tool = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="zo-fio-prepared-", dir="/var/tmp")
    try:
        fake = os.path.join(tmp, "fio")
        with open(fake, "w") as f:
            f.write(FAKE_FIO.replace("/usr/bin/env python3", sys.executable, 1))
        os.chmod(fake, 0o755)
        log = os.path.join(tmp, "log")
        env = dict(os.environ, ZO_FAKE_FIO_LOG=log)
        if kind == "store":
            argv = [tool, "--optim", "--vs-fio", "--fio", fake, "--json", "--state", "6M",
                    "--group-elems", "100000", "--pairs", "2", "--path", tmp]
        else:
            argv = [tool, "--fio", fake, "--json", "--path", tmp, "--batch", "2", "--out", "64", "--in", "64",
                    "--pairs", "2", "--fio-size", "3M"]
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, (p.returncode, p.stderr)
        o = json.loads(p.stdout)
        if kind == "store":
            assert o["verified"] and len(o["ratios"]) == 2, o
        runs = open(log).read().split("\n")[:-1]
        assert len(runs) >= 1 and all(r.startswith("ready ") for r in runs), runs
        left = sorted(n for n in os.listdir(tmp) if n not in ("fio", "log"))
        assert not left, left  # the run directory, fio's file with it, is gone
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
