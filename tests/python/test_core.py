# SPDX-License-Identifier: Apache-2.0
"""The package core: library lookup, ABI layout, errors, array checks, and
the cpuadam / pinned memory / checkpoint bindings against references."""
import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import zoffload
from zoffload import _lib, arrays, ckpt, cpuadam as ca, mem
from zoffload import optim as zoptim  # noqa: F401  (registers its structs for the ABI test)
from conftest import SRC


def test_library_from_env_file():
    env = os.environ["ZOFFLOAD_LIB"]
    assert os.path.realpath(zoffload.library_path()) == os.path.realpath(env)
    assert _lib.lib.origin == "ZOFFLOAD_LIB"
    with open(os.path.join(SRC, "include", "zoffload", "version.h")) as f:
        ver = {}
        for line in f:
            w = line.split()
            if len(w) == 3 and w[0] == "#define" and w[1].startswith("ZO_VERSION_") and w[2].isdigit():
                ver[w[1]] = w[2]
    assert zoffload.version() == "%s.%s.%s" % (ver["ZO_VERSION_MAJOR"], ver["ZO_VERSION_MINOR"],
                                               ver["ZO_VERSION_PATCH"])


def _probe(env_lib):
    env = dict(os.environ)
    env["ZOFFLOAD_LIB"] = env_lib
    code = "import zoffload; print(zoffload.library_path())"
    return subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120)


def test_library_from_env_directory():
    d = os.path.dirname(os.environ["ZOFFLOAD_LIB"])
    r = _probe(d)
    assert r.returncode == 0, r.stderr.decode()
    assert os.path.dirname(os.path.realpath(r.stdout.decode().strip())) == os.path.realpath(d)


def test_library_explicit_path_that_fails_is_an_error(tmp_path):
    bad = str(tmp_path / "libzoffload.so.0")
    with open(bad, "w") as f:
        f.write("not an ELF file")
    r = _probe(bad)
    assert r.returncode != 0
    err = r.stderr.decode()
    assert "LibraryNotFound" in err and bad in err


def test_abi_layout(tmp_path):
    """Every ctypes mirror has the C struct's size and field offsets (the C
    compiler says, on a program generated from the ctypes definitions)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to check the struct layouts with")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include <zoffload/zoffload.h>',
             'int main(void) {']
    expect = {}
    for cname, cls in sorted(_lib.C_STRUCTS.items()):
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (cname, cname))
        expect[cname] = ctypes.sizeof(cls)
        for fname, _ in cls._fields_:
            key = "%s.%s" % (cname, fname)
            lines.append('printf("%s %%zu\\n", offsetof(%s, %s));' % (key, cname, fname))
            expect[key] = getattr(cls, fname).offset
    lines.append("return 0; }")
    c = tmp_path / "abi.c"
    c.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "abi"
    build_inc = os.path.dirname(os.environ["ZOFFLOAD_LIB"])
    r = subprocess.run([cc, "-std=c11", "-I", os.path.join(SRC, "include"), "-I", build_inc,
                        str(c), "-o", str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.returncode == 0, r.stdout.decode()
    out = subprocess.run([str(exe)], stdout=subprocess.PIPE, check=True).stdout.decode()
    got = dict((k, int(v)) for k, v in (ln.split() for ln in out.splitlines()))
    bad = {k: (expect[k], got[k]) for k in expect if expect[k] != got[k]}
    assert not bad, "ctypes (ours, C's) differ: %s" % bad
    # and the library itself reports the same sizes through struct_size
    for cname in _lib.SIZED_STRUCTS:
        if cname.startswith("zo_optim") and not zoptim.available():
            continue
        assert _lib.c_struct_size(cname) == got[cname], cname


def test_error_carries_library_detail():
    p = np.zeros(8, np.float32)
    with pytest.raises(zoffload.InvalidArgument) as ei:
        ca.step(p, np.ones_like(p), np.zeros_like(p), np.zeros_like(p), lr=-1.0, step=1)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.name == "ZO_ECONFIG" and e.code == -10005
    assert e.func == "zo_cpuadam_step"
    assert "lr" in e.detail and "-1" in e.detail
    assert e.detail in str(e) and e.strerror in str(e)
    with pytest.raises(zoffload.InvalidArgument) as ei:
        zoffload.parse_size("12 furlongs")
    assert ei.value.errno == 22 and ei.value.name == "EINVAL"
    assert zoffload.parse_size("64MiB") == 64 << 20
    assert "Invalid argument" in zoffload.strerror(-22)


def test_array_checks():
    p = np.zeros(16, np.float32)
    g = np.ones(16, np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    with pytest.raises(TypeError, match="param.*float64"):
        ca.step(p.astype(np.float64), g, m, v, step=1)
    with pytest.raises(ValueError, match="grad: array is not C-contiguous"):
        ca.step(p[:8], np.ones(16, np.float32)[::2], m[:8], v[:8], step=1)
    ro = p.copy()
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="param: array is read-only"):
        ca.step(ro, g, m, v, step=1)
    with pytest.raises(ValueError, match="length mismatch"):
        ca.step(p, g[:15], m, v, step=1)
    with pytest.raises(TypeError, match="expected a numpy.ndarray or torch.Tensor, got list"):
        ca.step([0.0] * 16, g, m, v, step=1)
    with pytest.raises(TypeError, match="exp_avg.*int32"):
        ca.step(p, g, m.astype(np.int32), v, step=1)
    with pytest.raises(ValueError, match="at least 1"):
        ca.grad_stats(np.zeros(0, np.float32))
    # a uint16 array passes as bf16 only when asked
    with pytest.raises(TypeError):
        ca.grad_stats(np.zeros(4, np.uint16))
    assert ca.grad_stats(np.zeros(4, np.uint16), grad_dtype=arrays.BF16) == (0.0, 0)
    assert np.all(p == 0)  # nothing was touched by the refused calls


def _ref(kind, p, g, m, v, t, lr, b1, b2, eps, wd):
    """The optimizers in double precision (docs/cpuadam.md formulas)."""
    p, g, m, v = (x.astype(np.float64) for x in (p, g, m, v))
    if kind == "adamw":
        p = p * (1 - lr * wd)
    if kind in ("adam", "adagrad"):
        g = g + wd * p
    if kind in ("adamw", "adam"):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - (lr / (1 - b1 ** t)) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
    elif kind == "adagrad":
        v = v + g * g
        p = p - lr * g / (np.sqrt(v) + eps)
    elif kind == "lion":
        c = b1 * m + (1 - b1) * g
        p = p * (1 - lr * wd) - lr * np.sign(c)
        m = b2 * m + (1 - b2) * g
    return p, m, v


@pytest.mark.parametrize("kind", ["adamw", "adam", "adagrad", "lion"])
def test_cpuadam_matches_double_reference(kind):
    rng = np.random.default_rng(1)
    n = 1031
    p = rng.standard_normal(n).astype(np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    rp, rm, rv = p.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.99 if kind == "lion" else 0.999, eps=1e-8,
              weight_decay=0.1)
    for t in range(1, 4):
        g = rng.standard_normal(n).astype(np.float32)
        ca.step(p, g, m, v, kind=kind, step=t, nthreads=2, **hp)
        rp, rm, rv = _ref(kind, rp, g, rm, rv, t, hp["lr"], hp["beta1"], hp["beta2"], hp["eps"],
                          hp["weight_decay"])
        np.testing.assert_allclose(p, rp, rtol=2e-6, atol=2e-7)
        if kind != "adagrad":
            np.testing.assert_allclose(m, rm, rtol=2e-6, atol=1e-7)
        if kind != "lion":
            np.testing.assert_allclose(v, rv, rtol=2e-6, atol=1e-9)


def test_cpuadam_team_equals_plain_call():
    rng = np.random.default_rng(2)
    p1 = rng.standard_normal(5000).astype(np.float32)
    g = rng.standard_normal(5000).astype(np.float32)
    p2, m1, v1 = p1.copy(), np.zeros_like(p1), np.zeros_like(p1)
    m2, v2 = m1.copy(), v1.copy()
    with ca.Team(nthreads=2) as team:
        assert team.nthreads == 2
        assert team.variant in ("scalar", "avx2", "avx512", "avx512bf16")
        ca.step(p1, g, m1, v1, step=1, team=team)
        assert ca.grad_stats(g, team=team)[0] == pytest.approx(float(np.sum(g.astype(np.float64) ** 2)))
    ca.step(p2, g, m2, v2, step=1, nthreads=1)
    assert np.array_equal(p1, p2) and np.array_equal(m1, m2) and np.array_equal(v1, v2)
    with pytest.raises(ValueError, match="closed"):
        team.nthreads


def test_grad_stats():
    g = np.linspace(-3, 3, 1001).astype(np.float32)
    s, nf = ca.grad_stats(g, nthreads=2)
    assert nf == 0
    assert s == pytest.approx(float(np.sum(g.astype(np.float64) ** 2)), rel=1e-12)
    g[10], g[500] = np.inf, np.nan
    assert ca.grad_stats(g)[1] == 2


def test_pinned_arrays():
    before = mem.pinned_stats()["allocations"]
    a = mem.pinned_empty((3, 1000), "float32")
    assert a.shape == (3, 1000) and a.dtype == np.float32 and not a.any()
    info = mem.pinned_info(a)
    assert info.size == 3 * 1000 * 4 and info.mapped >= info.size
    assert mem.pinned_stats()["allocations"] == before + 1
    a[:] = 7
    b = a[1]            # a view keeps the memory alive
    del a
    assert mem.pinned_stats()["allocations"] == before + 1 and np.all(b == 7)
    del b
    assert mem.pinned_stats()["allocations"] == before
    with pytest.raises(ValueError, match="not a live pinned allocation"):
        mem.pinned_info(np.zeros(4, np.float32))
    with pytest.raises(ValueError):
        mem.pinned_buffer(0)


def test_checkpoint_roundtrip_and_corruption(tmp_path):
    rng = np.random.default_rng(3)
    t = {"w": rng.standard_normal((64, 33)).astype(np.float32),
         "b": np.arange(7, dtype=np.int32), "h": np.arange(5000, dtype=np.uint16)}
    with pytest.raises(TypeError):
        ckpt.save(tmp_path, "c0", t)                # uint16 is not a library element type
    t["h"] = rng.standard_normal(5000).astype(np.float16)
    ckpt.save(tmp_path, "c1", t, user={"step": 12, "note": "x"})
    assert ckpt.latest(tmp_path) == "c1"
    got, user = ckpt.load(tmp_path)
    assert user == {"step": 12, "note": "x"}
    assert set(got) == set(t)
    for k in t:
        assert got[k].dtype == t[k].dtype and got[k].shape == t[k].shape
        assert np.array_equal(got[k], t[k])
    with pytest.raises(zoffload.LibraryOSError) as ei:
        ckpt.save(tmp_path, "c1", t)
    assert ei.value.errno == 17                     # EEXIST: never overwritten
    # one flipped bit in the data file is found and named
    data = [f for f in os.listdir(tmp_path / "c1") if f != "manifest.json"]
    assert len(data) == 1
    path = tmp_path / "c1" / data[0]
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(zoffload.CorruptError) as ei:
        ckpt.load(tmp_path, "c1")
    assert ei.value.name == "ZO_ECORRUPT" and ei.value.detail
    with pytest.raises(zoffload.LibraryOSError):
        ckpt.load(tmp_path, "nonexistent")


def test_optim_estimate_is_what_the_engine_allocates(tmp_path):
    """zoffload.optim.estimate() (zo_optim_estimate) gives the pinned and
    pageable bytes that the engine then reports, refuses what create
    refuses, and plans for a GPU without one."""
    from zoffload import optim as zoptim
    from zoffload.errors import InvalidArgument, BudgetError
    groups = [{"numel": [1000, 70000, 3]}, {"numel": [130001], "state_dtype": "bf16"}]
    cases = [dict(param_dtype="bf16"), dict(param_dtype="f32", dpu=1),
             dict(param_dtype="bf16", grad_accum_steps=4, sub_group_size=4096),
             dict(param_dtype="bf16", placement="nvme", nvme_path=str(tmp_path))]
    for kw in cases:
        est = zoptim.estimate(groups, **kw)
        e = zoptim.Engine(groups, **kw)
        try:
            info = e.info()
        finally:
            e.close()
        assert (est["pinned_bytes"], est["host_bytes"]) == (info["pinned_bytes"], info["host_bytes"]), (kw, est, info)
        assert est["nsubgroups"] == info["nsubgroups"] and est["numel"] == 201004, (est, info)
        assert est["grad_window_bytes"] == info["grad_buffer_bytes"], (est, info)
    # a GPU's copy paths, planned here: staging, a parameter buffer, windows pinned
    g = zoptim.estimate(groups, backend="cuda", param_dtype="bf16")
    assert g["staging_bytes"] == 32 << 20 and g["param_buffer_bytes"] == 2 * 201004, g
    assert g["host_bytes"] == 0 and g["grad_window_dtype"] == "bf16", g
    with pytest.raises(InvalidArgument, match="buffer_count"):
        zoptim.estimate(groups, param_dtype="bf16", buffer_count=2)
    with pytest.raises(TypeError, match="param_dtype is required"):
        zoptim.estimate(groups)
    with pytest.raises(BudgetError):
        zoptim.estimate(groups, param_dtype="bf16", pinned_bytes=1 << 20)
    with pytest.raises(ValueError):
        zoptim.estimate(groups, backend="tpu", param_dtype="bf16")
