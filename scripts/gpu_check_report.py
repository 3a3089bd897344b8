#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes gpu-check.sh's report: report.json (every step's command, exit
status and time, the key numbers of each tool's JSON) and report.md (rows
for docs/benchmarks.md). Reads the step records gpu-check.sh left in --work.
Standard library only: it runs on the GPU machine's python3."""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_jsonl_summary(path):
    """zo-train --json FILE: one line per step, then a summary line."""
    try:
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return None
    return next((x for x in reversed(lines) if x.get("type") == "summary"), None)


def read_steps(work):
    steps = []
    try:
        with open(os.path.join(work, "steps.tsv")) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) < 7:
                    continue
                steps.append(dict(name=p[0], status=p[1], rc=int(p[2]) if p[2] else None,
                                  seconds=float(p[3] or 0), cap_s=int(p[4] or 0), command=p[5], note=p[6]))
    except OSError:
        pass
    return steps


def git(root, *args):
    try:
        return subprocess.run(["git", "-C", root] + list(args), capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(work):
    m = dict(cpus=os.cpu_count(), kernel=platform.release(), arch=platform.machine())
    try:
        with open("/etc/os-release") as f:
            m["os"] = next((l.split("=", 1)[1].strip().strip('"') for l in f if l.startswith("PRETTY_NAME=")), "")
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(l.split()[1]) for l in f if l.startswith("MemTotal:"))
            m["ram_bytes"] = kb * 1024
    except (OSError, StopIteration, ValueError):
        pass
    dev = load_json(os.path.join(work, "device.json")) or {}
    m["device_check"] = dev
    smi = []
    try:
        with open(os.path.join(work, "nvidia-smi.csv")) as f:
            for line in f:
                p = [x.strip() for x in line.split(",")]
                if len(p) >= 4:
                    smi.append(dict(name=p[0], driver=p[1], memory=p[2], pci_bus_id=p[3]))
    except OSError:
        pass
    m["nvidia_smi"] = smi
    return m


def deps(work, build_dir):
    d = dict(source="system", fallback={}, resolved={})
    prefix = os.path.join(build_dir, "deps-prefix")
    try:
        with open(os.path.join(work, "fallback.tsv")) as f:
            d["fallback"] = dict(l.rstrip("\n").split("\t", 1) for l in f if "\t" in l)
        d["source"] = "prefix"
        d["prefix"] = prefix
    except OSError:
        pass
    wanted = ("liburing", "libnuma", "libhwloc", "libopenblas", "libgfortran", "libquadmath", "libudev")
    try:
        with open(os.path.join(work, "ldd.txt")) as f:
            for line in f:
                m = re.match(r"\S+: \s*(\S+) => (\S+)", line)
                if m and m.group(1).startswith(wanted):
                    d["resolved"][m.group(1)] = m.group(2)
    except OSError:
        pass
    if d["source"] == "prefix":
        carried = [k for k in d["resolved"] if not k.startswith(("libgfortran", "libquadmath", "libudev"))
                   or d["fallback"].get(k) == "carried"]
        d["all_from_prefix"] = bool(carried) and all(
            os.path.realpath(d["resolved"][k]).startswith(os.path.realpath(prefix) + "/") for k in carried)
    return d


def tests(work):
    out = []
    try:
        with open(os.path.join(work, "testlog.json")) as f:
            for line in f:
                try:
                    t = json.loads(line)
                except ValueError:
                    continue
                out.append(dict(name=t.get("name"), result=t.get("result"), seconds=round(t.get("duration", 0), 2),
                                returncode=t.get("returncode")))
    except OSError:
        pass
    return out


def pick(d, *keys):
    return {k: d[k] for k in keys if d and k in d}


def results(work):
    r = {}
    info = load_json(os.path.join(work, "zo-info.json"))
    if info:
        r["zo_info"] = dict(build=info.get("build"), cpu_level=info.get("cpu", {}).get("level"),
                            kernels=info.get("kernels"), aio=pick(info.get("aio"), "backend", "fallback"),
                            devices=info.get("devices"), pinned=info.get("pinned"))
    for name in ("optim-host", "optim-dpu", "optim-nvme"):
        o = load_json(os.path.join(work, name + ".json"))
        if o:
            r[name] = pick(o, "placement", "params", "dpu", "compute_ms", "mode", "runs", "step_s", "iter_s",
                           "bound_s", "ratio", "fio_read_bytes_per_s", "fio_write_bytes_per_s", "nvme_read_bytes",
                           "nvme_write_bytes", "pinned_bytes", "host_bytes", "peak_rss_bytes", "kernel")
            r[name]["ratios"] = [round(s["ratio"], 4) for s in o.get("steps", []) if "ratio" in s]
    for name in ("tile-a", "tile-b"):
        o = load_json(os.path.join(work, name + ".json"))
        if o:
            c = o.get("config", {})
            r[name] = dict(config=pick(c, "batch", "out", "in", "dtype", "device", "gemm", "weight_bytes", "budget"),
                           grid=o.get("grid"), grid_nvme=o.get("grid_nvme"),
                           **pick(o, "median_seconds", "ratio_host_to_untiled", "ratio_host_to_bound", "host_bound",
                                  "ratio_nvme_to_bound",
                                  "fio_read_bytes_per_s", "fio_skipped", "fetch_host", "fetch_nvme"))
    for name in ("train-host", "train-nvme"):
        s = load_jsonl_summary(os.path.join(work, name + ".jsonl"))
        if s:
            s.pop("type", None)
            r[name] = s
    return r


# ---- markdown ------------------------------------------------------------------------------------
def short_cmd(cmd, build_dir, work):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = cmd.replace(os.path.join(build_dir, "tools") + "/", "").replace(build_dir, "BUILD")
    cmd = cmd.replace(root + "/", "").replace(root, ".")
    cmd = cmd.replace(work + "/", "")
    cmd = re.sub(r"--fio \S+", "--fio FIO", cmd)
    cmd = cmd.replace("python3 -m mesonbuild.mesonmain", "meson")
    return cmd


def ms(s):
    return "%.1f ms" % (s * 1e3) if s is not None else "?"


def gb(b):
    return "%.2f GB/s" % (b * 1e-9) if b else "?"


def step_result(name, res, tests_):
    o = res.get(name)
    if name == "tests" and tests_:
        n = {k: sum(1 for t in tests_ if t["result"] == k) for k in ("OK", "FAIL", "SKIP", "TIMEOUT")}
        return "%d passed, %d failed, %d skipped%s: %s" % (
            n["OK"], n["FAIL"] + n["TIMEOUT"], n["SKIP"], ", %d timed out" % n["TIMEOUT"] if n["TIMEOUT"] else "",
            ", ".join("%s %s" % (t["name"], t["result"]) for t in tests_))
    if name == "zo-info" and res.get("zo_info"):
        devs = [d for d in res["zo_info"].get("devices") or [] if d.get("backend") == "cuda"]
        if devs and devs[0].get("available"):
            i = (devs[0].get("info") or [{}])[0]
            return "cuda: %s, cc %s.%s, %.1f GiB" % (i.get("name"), i.get("cc_major"), i.get("cc_minor"),
                                                      i.get("total_mem", 0) / 2**30)
        return "cuda unavailable: %s" % (devs[0].get("reason") if devs else "no entry")
    if not o:
        return ""
    if name in ("optim-host", "optim-dpu", "optim-nvme"):
        t = "%s params, step %s" % (fmt_count(o.get("params")), ms(o.get("step_s")))
        if o.get("dpu"):
            t += ", iteration %s vs max(compute %.0f ms, step)" % (ms(o.get("iter_s")), o.get("compute_ms", 0))
        if "ratio" in o:
            ref = {"kernel": "bare fused kernel", "disk": "disk bound", "dpu": "ideal"}.get(o.get("mode"), "bound")
            t += ", %s %s: **%.3f**" % (ref, ms(o.get("bound_s")), o["ratio"])
        if o.get("fio_read_bytes_per_s"):
            t += " (fio read %s, write %s)" % (gb(o["fio_read_bytes_per_s"]), gb(o.get("fio_write_bytes_per_s")))
        if o.get("placement") == "nvme":
            t += ", NVMe %.2f GB each way" % (o.get("nvme_read_bytes", 0) * 1e-9)
            if "ratio" not in o:
                t += " (no fio: no bound)"
        t += ", pinned %.0f MiB" % (o.get("pinned_bytes", 0) / 2**20)
        return t
    if name in ("tile-a", "tile-b"):
        m = o.get("median_seconds", {})
        c = o.get("config", {})
        t = "x %s x %s, W %s x %s: untiled %s, pinned host %s (**%.3f**)" % (
            c.get("batch"), c.get("in"), c.get("out"), c.get("in"), ms(m.get("untiled")), ms(m.get("tiled_host")),
            o.get("ratio_host_to_untiled", 0))
        if m.get("h2d_twice") is not None:
            t += ", **%.3f** of max(GEMM, 2 W host->device %s)" % (o.get("ratio_host_to_bound", 0), ms(m["h2d_twice"]))
        if m.get("tiled_nvme") is not None:
            t += ", NVMe %s" % ms(m.get("tiled_nvme"))
            if o.get("ratio_nvme_to_bound"):
                t += " (**%.3f** of max(GEMM, 2 W / fio %s))" % (o["ratio_nvme_to_bound"],
                                                                gb(o.get("fio_read_bytes_per_s")))
        return t
    if name in ("train-host", "train-nvme"):
        return ("%s params, %s, %s steps: %.1f ms/step (compute %.1f), %.0f samples/s, loss %.3f -> %.3f, "
                "fp32 masters + AdamW states %s beside a device budget of %s" % (
                    fmt_count(o.get("params")), o.get("offload"), o.get("steps"), o.get("step_ms", 0),
                    o.get("compute_ms", 0), o.get("samples_per_s", 0), o.get("first_loss", 0),
                    o.get("last_loss", 0), fmt_bytes(o.get("params", 0) * 12), fmt_bytes(o.get("device_budget_bytes"))))
    return ""


def fmt_bytes(n):
    if not n:
        return "?"
    for div, suf in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= div:
            return "%.1f %s" % (n / div, suf)
    return "%d B" % n


def fmt_count(n):
    if not n:
        return "?"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return "%.3g%s" % (n / div, suf)
    return str(n)


def markdown(rep, build_dir, work):
    m = rep["machine"]
    gpu = (m.get("nvidia_smi") or [{}])[0]
    devs = (m.get("device_check") or {}).get("devices") or []
    gpu_name = gpu.get("name") or (devs[0]["name"] if devs else "no GPU")
    driver = gpu.get("driver") or str((m.get("device_check") or {}).get("driver_version", "?"))
    day = rep["started_utc"][:10]
    lines = []
    title = "GPU check, %s" % day + (" (host rehearsal: no GPU)" if rep["rehearsal"] else "")
    lines += ["### " + title, ""]
    lines += ["%s, driver %s; %s CPUs, %.0f GiB RAM, %s, Linux %s. Code: `%s`%s. `bash scripts/gpu-check.sh` "
              "(device tool, carry `.gpu-deps`): %s in %.0f s of a %d s budget%s." % (
                  gpu_name, driver, m.get("cpus"), m.get("ram_bytes", 0) / 2**30, m.get("os", "?"),
                  m.get("kernel"), rep["repository"].get("commit", "?"),
                  " with local changes" if rep["repository"].get("dirty") else "", rep["status"],
                  rep["seconds"], rep["budget_s"], ": " + rep["reason"] if rep["reason"] else ""), ""]
    if rep["steps"]:
        lines += ["| step | command | status | seconds | result |", "| --- | --- | --- | --- | --- |"]
    for s in rep["steps"]:
        res = step_result(s["name"], rep["results"], rep["tests"])
        if s["status"] != "ok":
            res = (s["note"] + ("; " + res if res else "")) if s["note"] else res
        lines.append("| %s | `%s` | %s | %.1f | %s |" % (s["name"], short_cmd(s["command"], build_dir, work),
                                                       s["status"], s["seconds"], res.replace("|", "/")))
    lines += [""]
    # rows for the summary table at the top of docs/benchmarks.md
    res = rep["results"]
    rows = []
    if rep["tests"]:
        ok = sum(1 for t in rep["tests"] if t["result"] == "OK")
        rows.append("| platform | CUDA suite on a GPU | %d of %d passed (%s, driver %s) | %s |" % (
            ok, len(rep["tests"]), gpu_name, driver, title))
    backend = "host backend" if rep["rehearsal"] else "CUDA backend"
    bars = (("optim-host", "optim (10)", "host placement step <= 1.05x the bare fused kernel"),
            ("optim-nvme", "optim (10)", "NVMe step <= 1.10x disk bound"),
            ("optim-dpu", "optim (10)", "DPU: iteration <= 1.10x max(compute, step)"))
    for key, issue, bar in bars:
        o = res.get(key)
        if o and "ratio" in o:
            rows.append("| %s | %s, %s, %s params | **%.3f** | %s |" % (
                issue, bar, backend, fmt_count(o.get("params")), o["ratio"], title))
    for key in ("tile-a", "tile-b"):
        o = res.get(key)
        if o:
            c = o.get("config", {})
            copied = o.get("host_bound", "untiled") != "untiled"
            rows.append("| tiling (13) | tiled fwd+bwd on %s, x %s x %s, W %s x %s: <= 1.10x %s (pinned host) / "
                        "max(GEMM, 2 W / fio) (NVMe) | **%.3f** / %s | %s |" % (
                            c.get("device", "?"), c.get("batch"), c.get("in"), c.get("out"), c.get("in"),
                            "max(GEMM, 2 W host->device)" if copied else "untiled",
                            o.get("ratio_host_to_bound", o.get("ratio_host_to_untiled", 0)),
                            "**%.3f**" % o["ratio_nvme_to_bound"] if o.get("ratio_nvme_to_bound") else "no bound",
                            title))
    if rows:
        lines += ["Rows for the summary table:", "", "| issue | bar | measured | section |",
                  "| --- | --- | --- | --- |"] + rows + [""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--status", required=True)
    ap.add_argument("--reason", default="")
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--rehearsal", type=int, default=0)
    ap.add_argument("--started", type=float, required=True)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    now = datetime.datetime.now(datetime.timezone.utc)
    steps = read_steps(a.work)
    tests_ = tests(a.work)
    res = results(a.work)
    status = a.status
    reason = a.reason
    # a step left out by --only is not a failure
    failed = [s["name"] for s in steps if s["status"] != "ok" and s.get("note") != "not in --only"]
    if not a.rehearsal and tests_ and any(t["result"] == "SKIP" for t in tests_):
        # on a GPU a CUDA suite that skips did not test anything
        skipped = [t["name"] for t in tests_ if t["result"] == "SKIP"]
        for s in steps:
            if s["name"] == "tests" and s["status"] == "ok":
                s["status"] = "failed"
                s["note"] = "skipped on a GPU: " + ", ".join(skipped)
                failed.append("tests")
    if failed and status == "ok":
        status = "failed"
    if failed and not reason:
        reason = "not ok: " + ", ".join(failed)
    rep = dict(tool="gpu-check", status=status, reason=reason, rehearsal=bool(a.rehearsal),
               started_utc=datetime.datetime.fromtimestamp(a.started, datetime.timezone.utc).strftime(
                   "%Y-%m-%dT%H:%M:%SZ"),
               seconds=round(now.timestamp() - a.started, 1), budget_s=a.budget,
               repository=dict(commit=git(root, "rev-parse", "--short", "HEAD") or "unknown",
                               dirty=bool(git(root, "status", "--porcelain", "--untracked-files=no"))),
               machine=machine(a.work), deps=deps(a.work, a.build_dir), steps=steps, tests=tests_, results=res)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    md = markdown(rep, a.build_dir, a.work)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(md + "\n")
    # the end of the output is what the device tool shows: the table last
    print(md)
    print("report: %s (report.json, report.md, gpu-check.log)" % a.out)
    # gpu-check.sh's exit status is the report's verdict
    return {"ok": 0, "refused": 3, "missing": 4}.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())
