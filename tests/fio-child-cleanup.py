# SPDX-License-Identifier: Apache-2.0
"""A tool killed while fio runs must not leave fio running, nor its files.

Usage: fio-child-cleanup.py store|aio|tile TOOL

Real processes: the tool runs with --vs-fio and --fio pointing at a fake fio
(a shell script that writes its pid and sleeps), in a fresh directory under
/var/tmp. Once the fake fio runs, the tool gets SIGINT, SIGTERM or SIGKILL.
Then:
  - the fake fio is gone within two seconds (the handler kills its process
    group; after SIGKILL the death signal does);
  - after SIGINT/SIGTERM the tool died of that signal and the files it made
    (zo-store-bench's and zo-tile-bench's run directory with its arenas and
    fio's file, zo-aio-bench's data file) are gone;
  - fio ran in its own process group.
First, --fio naming a missing or non-executable file: exit 1 with "cannot
run PATH: reason", no files left.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FAKE_FIO = """#!/bin/sh
echo $$ > "$ZO_FAKE_FIO_PIDFILE"
exec sleep 60
"""


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def pgid_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[2])


def wait_for(cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def run_case(kind, tool, sig):
    tmp = tempfile.mkdtemp(prefix="zo-fio-cleanup-", dir="/var/tmp")
    try:
        fake = os.path.join(tmp, "fio")
        with open(fake, "w") as f:
            f.write(FAKE_FIO)
        os.chmod(fake, 0o700)
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        pidfile = os.path.join(tmp, "fio.pid")
        if kind == "store":
            argv = [tool, "--optim", "--vs-fio", "--fio", fake, "--path", work, "--state", "3M",
                    "--group-elems", "100000", "--pairs", "1"]
        elif kind == "tile":
            argv = [tool, "--fio", fake, "--path", work, "--batch", "2", "--out", "64", "--in", "64", "--pairs", "1",
                    "--fio-size", "1M"]
        else:
            argv = [tool, "--vs-fio", "--fio", fake, "--path", work, "--size", "2M", "--pairs", "1",
                    "--no-progress"]
        env = dict(os.environ, ZO_FAKE_FIO_PIDFILE=pidfile)

        # zo-store-bench: a directory named like the tool's run directories
        # (zo-store-bench-XXXXXX) but not marked as one (no owner file),
        # holding a file: someone else's. The tool's reclaim of stale run
        # directories must neither use it nor remove what is in it.
        def foreign_name(pid):
            return "zo-store-bench-p%05d" % (pid % 100000)

        def default_signals():
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_DFL)
            if kind == "store":
                d = os.path.join(work, foreign_name(os.getpid()))
                os.mkdir(d, 0o700)
                with open(os.path.join(d, "other-run.dat"), "w") as f:
                    f.write("not yours")

        # stderr to a file: a pipe would stay open as long as a surviving
        # fio holds it, and reading it would wait for fio to end
        errf = open(os.path.join(tmp, "stderr"), "w+")
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=errf, preexec_fn=default_signals)

        def errtext():
            errf.seek(0)
            return errf.read()

        started = wait_for(lambda: p.poll() is not None or
                           (os.path.exists(pidfile) and os.path.getsize(pidfile) > 0), 120)
        if not started or p.poll() is not None:
            p.kill()
            p.wait()
            err = errtext()
            raise AssertionError(f"{kind}: fake fio never started (tool rc {p.returncode}): {err}")
        with open(pidfile) as f:
            fio_pid = int(f.read())
        assert alive(fio_pid), "fake fio is not running"
        fio_pgid, tool_pgid = pgid_of(fio_pid), pgid_of(p.pid)
        planted = [foreign_name(p.pid)] if kind == "store" else []
        made = [n for n in os.listdir(work) if n not in planted]
        assert made, f"{kind}: the tool made no files in {work}"

        os.kill(p.pid, sig)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError(f"{kind}: the tool did not end on signal {sig}")
        err = errtext()
        assert p.returncode == -sig, f"{kind}: tool ended with {p.returncode}, not signal {sig}: {err}"
        assert wait_for(lambda: not alive(fio_pid), 2.0), f"{kind}: fio (pid {fio_pid}) still runs after signal {sig}"
        if sig != signal.SIGKILL:
            left = [n for n in os.listdir(work) if n not in planted]
            assert not left, f"{kind}: signal {sig} left {left} (made {made})"
        for d in planted:
            kept = os.listdir(os.path.join(work, d))
            assert kept == ["other-run.dat"], f"{kind}: the directory {d} of another run now holds {kept}"
        assert fio_pgid == fio_pid and fio_pgid != tool_pgid, "fio did not run in its own process group"
        print(f"{kind}: signal {sig}: fio gone, files {'removed' if sig != signal.SIGKILL else 'left (SIGKILL)'}")
    finally:
        try:
            with open(os.path.join(tmp, "fio.pid")) as f:
                pid = int(f.read())
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        shutil.rmtree(tmp, ignore_errors=True)


def missing_fio_case(kind, tool):
    """--fio naming nothing, or a file that is not executable: exit 1 with
    "cannot run PATH: <why>" (the child reports exec's errno through a
    pipe; it used to print from the forked child of a threaded process),
    and the files the tool made are removed."""
    tmp = tempfile.mkdtemp(prefix="zo-fio-missing-", dir="/var/tmp")
    try:
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        noexec = os.path.join(tmp, "fio-noexec")
        with open(noexec, "w") as f:
            f.write(FAKE_FIO)
        os.chmod(noexec, 0o600)
        for fio, why in ((os.path.join(tmp, "no-such-fio"), "No such file or directory"),
                         (noexec, "Permission denied")):
            if kind == "store":
                argv = [tool, "--optim", "--vs-fio", "--fio", fio, "--path", work, "--state", "3M",
                        "--group-elems", "100000", "--pairs", "1"]
            elif kind == "aio":
                argv = [tool, "--vs-fio", "--fio", fio, "--path", work, "--size", "2M", "--pairs", "1",
                        "--no-progress"]
            else:
                return
            r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
            want = f"cannot run {fio}: {why}"
            assert r.returncode == 1 and want in r.stderr, f"{kind}: --fio {fio}: rc {r.returncode}, {r.stderr!r}"
            left = os.listdir(work)
            assert not left, f"{kind}: --fio {fio} left {left}"
            print(f"{kind}: --fio {fio}: {want}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    kind, tool = sys.argv[1], sys.argv[2]
    missing_fio_case(kind, tool)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        run_case(kind, tool, sig)


if __name__ == "__main__":
    main()
