#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""zoffload's CPU optimizer against DeepSpeed's DeepSpeedCPUAdam, side by side.

Two comparisons, each on the same n and thread count, alternating
(A B A B ...), median of the per-pair ratios:

  fp32    DeepSpeedCPUAdam.step() on fp32 params/grads/states
          vs zo_cpuadam_step() on the same kind of arrays (28 B/param each).
  offload DeepSpeed's ZeRO-Offload CPU work for bf16 training, three passes:
          cast bf16 grads to fp32 (torch copy_), CPUAdam step, cast the fp32
          params to the bf16 copy for the GPU (torch copy_): ~40 B/param;
          vs zoffload's one fused pass (bf16 grads in, fp32 master and states
          updated, bf16 params out): 28 B/param.

The in-place streaming bound (zo_cpuadam_stream_bound, 28 B/param) is
measured in the same run for reference. zoffload is called through ctypes
on the built shared library, in the same process, on arrays of the same
size allocated the same way (torch tensors).

Setup: DeepSpeed lives in a virtual environment made by
benchmarks/setup_ds_venv.sh (a CPU-only torch and DeepSpeed 0.19 from PyPI;
--system-torch: Debian's torch 1.13 with DeepSpeed 0.14.4). When run with
a python that cannot import deepspeed, the script makes (or reuses) VENV
with it, under an flock on VENV.lock, and re-runs itself inside it.
DeepSpeed's CPU Adam is JIT-built on first use (-O3 -march=native -fopenmp
-D__AVX512__ on an AVX-512 machine) with the C++ standard this torch needs
(benchmarks/_ds_common.py: C++17 at least, newer where torch's headers ask
for it; forcing c++17 breaks newer torch, omitting it breaks torch 1.13).

Usage (from the repository root, after `meson compile -C build`):
  flock /work/.bench.lock /usr/bin/python3 benchmarks/ds_cpuadam_bench.py \
      --n 1e8 --threads 2 --pairs 7 [--venv VENV] [--system-torch]
"""
import argparse
import ctypes
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ds_common  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1e8", help="parameters (default 1e8)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--pairs", type=int, default=7, help="alternating pairs per comparison (>= 5 for a claim)")
    ap.add_argument("--lib", default=None, help="libzoffload.so (default: build/libzoffload.so next to this script)")
    ap.add_argument("--venv", default=_ds_common.DEFAULT_VENV)
    ap.add_argument("--system-torch", action="store_true",
                    help="make the venv over Debian's torch 1.13 (DeepSpeed 0.14.4) if it is missing")
    ap.add_argument("--deepspeed", default=None, help="DeepSpeed version to install if missing "
                    "(default: setup_ds_venv.sh's)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.n = int(float(a.n))
    if a.n < 1 or a.threads < 1 or a.pairs < 1:
        ap.error("--n, --threads and --pairs must be >= 1")
    return a


# ---- environment ---------------------------------------------------------------
def have_deepspeed(python):
    r = subprocess.run([python, "-c", "import deepspeed"], capture_output=True, text=True)
    return r.returncode == 0


def ensure_venv(a):
    """Create or reuse the venv (under its lock); return its python."""
    os.makedirs(os.path.dirname(os.path.abspath(a.venv)), exist_ok=True)
    with open(a.venv.rstrip("/") + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ds_common.ensure_venv(a.venv, a.system_torch, a.deepspeed)


def reexec(a):
    """Run the measurement in a python that has deepspeed (this one, or the
    venv's), with OMP_NUM_THREADS set before torch starts its pool."""
    py = sys.executable if have_deepspeed(sys.executable) else ensure_venv(a)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), DS_BUILD_OPS="0")
    os.execve(py, [py, os.path.abspath(__file__), "--in-venv"] + sys.argv[1:], env)


# ---- zoffload through ctypes -----------------------------------------------------
ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16 = 0, 1, 2
ZO_OPTIM_ADAMW = 0


class Hparams(ctypes.Structure):  # mirrors zo_cpuadam_hparams (include/zoffload/cpuadam.h)
    _fields_ = [("struct_size", ctypes.c_size_t), ("kind", ctypes.c_int), ("lr", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("bias_correction", ctypes.c_int), ("step", ctypes.c_int64),
                ("grad_scale", ctypes.c_double), ("clip_coef", ctypes.c_double)]


class Tensors(ctypes.Structure):  # mirrors zo_cpuadam_tensors
    _fields_ = [("struct_size", ctypes.c_size_t), ("n", ctypes.c_size_t), ("param", ctypes.c_void_p),
                ("grad", ctypes.c_void_p), ("grad_dtype", ctypes.c_int), ("exp_avg", ctypes.c_void_p),
                ("exp_avg_sq", ctypes.c_void_p), ("state_dtype", ctypes.c_int), ("param_out", ctypes.c_void_p),
                ("out_dtype", ctypes.c_int)]


class Zo:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.zo_cpuadam_hparams_default.argtypes = [ctypes.POINTER(Hparams), ctypes.c_int]
        L.zo_cpuadam_tensors_default.argtypes = [ctypes.POINTER(Tensors)]
        L.zo_cpuadam_step.argtypes = [ctypes.POINTER(Hparams), ctypes.POINTER(Tensors), ctypes.c_int]
        L.zo_cpuadam_stream_bound.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_float, ctypes.c_size_t, ctypes.c_int]
        L.zo_cpuadam_variant.restype = ctypes.c_char_p
        L.zo_strerror.restype = ctypes.c_char_p
        L.zo_last_error_detail.restype = ctypes.c_char_p
        h, t = Hparams(), Tensors()
        self.check(L.zo_cpuadam_hparams_default(ctypes.byref(h), ZO_OPTIM_ADAMW))
        self.check(L.zo_cpuadam_tensors_default(ctypes.byref(t)))
        if h.struct_size != ctypes.sizeof(Hparams) or t.struct_size != ctypes.sizeof(Tensors):
            raise SystemExit("ctypes mirrors of zo_cpuadam_hparams/zo_cpuadam_tensors do not match the library")

    def check(self, rc):
        if rc != 0:
            raise RuntimeError("zoffload: %s: %s" % (self.lib.zo_strerror(rc).decode(),
                                                     self.lib.zo_last_error_detail().decode()))

    def hparams(self, lr, betas, eps, wd):
        h = Hparams()
        self.check(self.lib.zo_cpuadam_hparams_default(ctypes.byref(h), ZO_OPTIM_ADAMW))
        h.lr, h.beta1, h.beta2, h.eps, h.weight_decay = lr, betas[0], betas[1], eps, wd
        return h

    def tensors(self, p, g, m, v, out=None):
        import torch
        dt = {torch.float32: ZO_DTYPE_F32, torch.bfloat16: ZO_DTYPE_BF16, torch.float16: ZO_DTYPE_F16}
        t = Tensors()
        self.check(self.lib.zo_cpuadam_tensors_default(ctypes.byref(t)))
        t.n, t.param, t.grad, t.grad_dtype = p.numel(), p.data_ptr(), g.data_ptr(), dt[g.dtype]
        t.exp_avg, t.exp_avg_sq, t.state_dtype = m.data_ptr(), v.data_ptr(), dt[m.dtype]
        if out is not None:
            t.param_out, t.out_dtype = out.data_ptr(), dt[out.dtype]
        return t

    def step(self, h, t, threads):
        self.check(self.lib.zo_cpuadam_step(ctypes.byref(h), ctypes.byref(t), threads))


# ---- the benchmark -----------------------------------------------------------------
def load_deepspeed():
    import deepspeed
    for cls in _ds_common.cpu_op_builder_classes():
        _ds_common.fix_cxx_std(cls)
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.op_builder import CPUAdamBuilder
    return deepspeed, DeepSpeedCPUAdam, CPUAdamBuilder


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def mem_gib():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(a_fn, b_fn, pairs):
    """Run A B A B ...; return the A times, the B times and the per-pair A/B ratios."""
    ta, tb = [], []
    for _ in range(pairs):
        ta.append(timed(a_fn))
        tb.append(timed(b_fn))
    return ta, tb, [x / y for x, y in zip(ta, tb)]


def agreement(zo, DeepSpeedCPUAdam, torch, threads):
    """Both optimizers on the same small problem for 3 steps: how far apart."""
    n = 100003
    gen = torch.Generator().manual_seed(3)
    p0 = torch.rand(n, generator=gen) * 2 - 1
    grads = [(torch.rand(n, generator=gen) * 2 - 1) * 1e-2 for _ in range(3)]
    p = torch.nn.Parameter(p0.clone())
    ds = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adamw_mode=True)
    zp, zm, zv = p0.clone(), torch.zeros(n), torch.zeros(n)
    h = zo.hparams(1e-3, (0.9, 0.999), 1e-8, 0.01)
    for s in range(3):
        p.grad = grads[s].clone()
        ds.step()
        h.step = s + 1
        zo.step(h, zo.tensors(zp, grads[s], zm, zv), threads)
    return float(((zp - p.detach()).abs() / (p.detach().abs() + 1e-3)).max())


def main_in_venv(a):
    # DeepSpeed's C++ code prints to file descriptor 1: send everything to
    # stderr while it runs, and print the results on the real stdout.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        res, info = measure(a)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    report(a, res, info)


def measure(a):
    import torch
    torch.set_num_threads(a.threads)
    deepspeed, DeepSpeedCPUAdam, CPUAdamBuilder = load_deepspeed()
    here = os.path.dirname(os.path.abspath(__file__))
    lib = a.lib or os.path.join(here, "..", "build", "libzoffload.so")
    zo = Zo(lib)
    n, T = a.n, a.threads
    lr, betas, eps, wd = 1e-3, (0.9, 0.999), 1e-8, 0.01

    gen = torch.Generator().manual_seed(1)
    # DeepSpeed: fp32 master param with fp32 grad, its states are created on the first step
    p_ds = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
    g32 = (torch.rand(n, generator=gen) * 2 - 1) * 1e-2
    p_ds.grad = g32
    g_bf16 = g32.to(torch.bfloat16)          # the gradient as it arrives from a bf16 model
    out_ds = torch.empty(n, dtype=torch.bfloat16)
    ds = DeepSpeedCPUAdam([p_ds], lr=lr, betas=betas, eps=eps, weight_decay=wd, adamw_mode=True)
    # zoffload: its own master and states, the same gradients, its own bf16 out
    p_zo = p_ds.detach().clone()
    m_zo, v_zo = torch.zeros(n), torch.zeros(n)
    out_zo = torch.empty(n, dtype=torch.bfloat16)
    h = zo.hparams(lr, betas, eps, wd)
    t_fp32 = zo.tensors(p_zo, g32, m_zo, v_zo)
    t_fused = zo.tensors(p_zo, g_bf16, m_zo, v_zo, out_zo)

    zo_step = [0]

    def zo_fp32():
        zo_step[0] += 1
        h.step = zo_step[0]
        zo.step(h, t_fp32, T)

    def zo_fused():
        zo_step[0] += 1
        h.step = zo_step[0]
        zo.step(h, t_fused, T)

    def ds_fp32():
        ds.step()

    def ds_three_pass():
        p_ds.grad.copy_(g_bf16)   # 1: bf16 grads -> fp32 (torch, T threads)
        ds.step()                 # 2: DeepSpeed CPUAdam
        out_ds.copy_(p_ds.data)   # 3: fp32 params -> bf16 copy for the GPU

    def bound():
        zo.check(zo.lib.zo_cpuadam_stream_bound(p_zo.data_ptr(), m_zo.data_ptr(), v_zo.data_ptr(),
                                                g32.data_ptr(), ctypes.c_float(0.0), n, T))

    # warm up: DeepSpeed creates its states on the first step; page faults everywhere
    for f in (ds_fp32, ds_three_pass, zo_fp32, zo_fused, bound):
        f()

    res = {}
    ta, tb, r = alternate(ds_fp32, zo_fp32, a.pairs)
    res["fp32"] = dict(deepspeed_s=statistics.median(ta), zoffload_s=statistics.median(tb),
                       speedup=statistics.median(r), pairs=a.pairs)
    ta, tb, r = alternate(ds_three_pass, zo_fused, a.pairs)
    res["offload_bf16"] = dict(deepspeed_s=statistics.median(ta), zoffload_s=statistics.median(tb),
                               speedup=statistics.median(r), pairs=a.pairs)
    ta, tb, r = alternate(bound, zo_fp32, a.pairs)
    res["bound"] = dict(bound_s=statistics.median(ta), zoffload_fp32_s=statistics.median(tb),
                        zoffload_ratio_to_bound=statistics.median(r))
    res["agreement_max_rel_diff_3_steps"] = agreement(zo, DeepSpeedCPUAdam, torch, T)

    b = CPUAdamBuilder()
    info = dict(n=n, threads=T, deepspeed=deepspeed.__version__, torch=torch.__version__,
                deepspeed_cxx_flags=" ".join(b.cxx_args()), zoffload_variant=zo.lib.zo_cpuadam_variant().decode(),
                machine="%s, %d CPUs, %.1f GiB RAM, Linux %s" % (cpu_model(), os.cpu_count(), mem_gib(),
                                                                 platform.release()))
    return res, info


def report(a, res, info):
    n, T = info["n"], info["threads"]
    if a.json:
        print(json.dumps(dict(info, results=res), indent=2))
        return
    print("n %d, %d threads, DeepSpeed %s (flags: %s), torch %s, zoffload variant %s" %
          (n, T, info["deepspeed"], info["deepspeed_cxx_flags"], info["torch"], info["zoffload_variant"]))
    print("machine: %s" % info["machine"])
    f = res["fp32"]
    print("fp32 AdamW step:        DeepSpeedCPUAdam %8.2f ms  zoffload %8.2f ms  speedup %.2fx (median of %d pairs)" %
          (f["deepspeed_s"] * 1e3, f["zoffload_s"] * 1e3, f["speedup"], a.pairs))
    f = res["offload_bf16"]
    print("bf16 offload step:      DeepSpeed 3-pass %8.2f ms  zoffload fused %8.2f ms  speedup %.2fx" %
          (f["deepspeed_s"] * 1e3, f["zoffload_s"] * 1e3, f["speedup"]))
    f = res["bound"]
    print("in-place bound (28 B):  %8.2f ms; zoffload fp32 step at %.3f of the bound" %
          (f["bound_s"] * 1e3, f["zoffload_ratio_to_bound"]))
    print("agreement after 3 steps (n=100003): max |zo - ds| / (|ds| + 1e-3) = %.2e" %
          res["agreement_max_rel_diff_3_steps"])


def main():
    a = parse_args()
    if a.in_venv:
        main_in_venv(a)
    else:
        reexec(a)


if __name__ == "__main__":
    main()
