# SPDX-License-Identifier: Apache-2.0
"""The quantized-state code maps and quantizer (zo_cpuadam_quantize /
dequantize / qmap_values) against an independent numpy reference, bit for
bit: the tables are rebuilt here from their definition (bitsandbytes'
create_dynamic_map without its zero padding, the linear maps, and the
zero-free unsigned maps for v, in double, rounded once to fp32), and blocks are quantized by counting the
fp32 midpoints below x * fl(1 / absmax) (np.searchsorted), not by the library's
bucket lookup. Loads the library directly with ctypes."""
import ctypes
import os

import numpy as np
import pytest

DYN_S, DYN_U, LIN_S, LIN_U, DYN_U_NZ, LIN_U_NZ = range(6)
ALL_MAPS = [DYN_S, DYN_U, LIN_S, LIN_U, DYN_U_NZ, LIN_U_NZ]
UNSIGNED = (DYN_U, LIN_U, DYN_U_NZ, LIN_U_NZ)
P10 = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0]


@pytest.fixture(scope="module")
def lib():
    path = os.environ.get("ZOFFLOAD_LIB")
    if not path:
        pytest.skip("ZOFFLOAD_LIB is not set (run through tests/python/run.sh)")
    L = ctypes.CDLL(path)
    f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    u8p = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
    L.zo_cpuadam_quantize.argtypes = [f32p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_size_t, u8p, f32p]
    L.zo_cpuadam_dequantize.argtypes = [u8p, f32p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_size_t, f32p]
    L.zo_cpuadam_qmap_values.argtypes = [ctypes.c_int, ctypes.c_int, f32p]
    return L


def dynamic_map(signed, bits):
    meb = 7 if bits == 8 else 3  # max_exponent_bits: bitsandbytes' 8-bit default, torchao's 4-bit one
    nsb = bits - 1
    data = []
    for i in range(meb):
        items = 2 ** (i + nsb - meb) + 1 if signed else 2 ** (i + nsb - meb + 1) + 1
        step = (1.0 - 0.1) / (items - 1)  # numpy's linspace: start + k * step, the end exact
        scale = P10[6 - (meb - 1) + i]
        for k in range(items - 1):
            b0 = 0.1 + k * step
            b1 = 1.0 if k + 2 == items else 0.1 + (k + 1) * step
            mean = (b0 + b1) / 2.0
            data.append(scale * mean)
            if signed:
                data.append(-scale * mean)
    data += [0.0, 1.0]
    assert len(data) == 2 ** bits
    return np.sort(np.array(data, dtype=np.float64).astype(np.float32))


def linear_map(signed, bits):
    top = 2 ** bits - 1
    if signed:
        h = top // 2
        return np.array([(k - h) / h for k in range(2 * h + 1)], dtype=np.float64).astype(np.float32)
    return np.array([k / top for k in range(top + 1)], dtype=np.float64).astype(np.float32)


def ref_map(m, bits):
    if m == DYN_U_NZ:  # the unsigned dynamic map less its 0 (Li et al. 2023's zero-point fix)
        v = dynamic_map(False, bits)
        assert v[0] == 0
        return v[1:]
    if m == LIN_U_NZ:  # (k + 1) / 2^bits
        return np.array([(k + 1) / 2 ** bits for k in range(2 ** bits)], dtype=np.float64).astype(np.float32)
    return dynamic_map(m == DYN_S, bits) if m in (DYN_S, DYN_U) else linear_map(m == LIN_S, bits)


def ref_quantize(x, m, bits, block):
    v = ref_map(m, bits)
    mids = ((v[:-1].astype(np.float64) + v[1:].astype(np.float64)) * 0.5).astype(np.float32)
    zero = np.searchsorted(mids, np.float32(0), side="left")
    n = x.size
    codes = np.empty(n, dtype=np.uint8)
    scales = []
    for i0 in range(0, n, block):
        xb = x[i0:i0 + block]
        a = np.abs(xb)
        if not np.all(np.isfinite(xb)):
            scales.append(np.float32(np.nan))
            codes[i0:i0 + block] = zero
        elif a.max() == 0:
            scales.append(np.float32(0))
            codes[i0:i0 + block] = zero
        else:
            s = a.max()
            scales.append(s)
            # number of midpoints strictly below the quotient: the nearest code, ties down
            codes[i0:i0 + block] = np.searchsorted(mids, quotient(xb, s), side="left")
    return codes, np.array(scales, dtype=np.float32), v


def quotient(x, s):
    """x / s as the library takes it: x * fl(1 / s) in fp32 where 1 / s is a
    normal number (s in [2^-126, 2^125)), else the fp32 division."""
    s = np.float32(s)
    if np.float32(2.0 ** -126) <= s < np.float32(2.0 ** 125):
        return (x.astype(np.float32) * (np.float32(1) / s)).astype(np.float32)
    return (x.astype(np.float32) / s).astype(np.float32)


def pack(codes, bits):
    if bits == 8:
        return codes
    c = codes if codes.size % 2 == 0 else np.append(codes, np.uint8(0))
    return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)


def sample(rng, n, nonneg):
    x = (10.0 ** rng.uniform(-9, 1, n)).astype(np.float32)
    if not nonneg:
        x *= rng.choice(np.array([-1, 1], dtype=np.float32), n)
    return x


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", ALL_MAPS)
def test_tables(lib, m, bits):
    got = np.zeros(2 ** bits, dtype=np.float32)
    assert lib.zo_cpuadam_qmap_values(m, bits, got) == 2 ** bits
    want = ref_map(m, bits)
    # entries past the codes in use (signed linear: one) read as the largest
    want = np.concatenate([want, np.full(2 ** bits - want.size, want[-1], dtype=np.float32)])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", ALL_MAPS)
@pytest.mark.parametrize("n,block", [(1, 64), (255, 64), (1000, 256), (4097, 128), (20001, 2048)])
def test_quantize_dequantize(lib, m, bits, n, block):
    rng = np.random.default_rng(n * 31 + m * 7 + bits)
    x = sample(rng, n, m in UNSIGNED)
    if n > 3 * block:  # an all-zero block and a block with a NaN and an inf
        x[:block] = 0
        x[block + 5] = np.nan
        x[block + 9] = np.inf
    nb = (n - 1) // block + 1
    codes = np.zeros(n if bits == 8 else (n + 1) // 2, dtype=np.uint8)
    scales = np.zeros(nb, dtype=np.float32)
    assert lib.zo_cpuadam_quantize(x, n, m, bits, block, codes, scales) == 0
    wc, ws, v = ref_quantize(x, m, bits, block)
    assert np.array_equal(scales.view(np.uint32), ws.view(np.uint32))
    assert np.array_equal(codes, pack(wc, bits))
    y = np.zeros(n, dtype=np.float32)
    assert lib.zo_cpuadam_dequantize(codes, scales, n, m, bits, block, y) == 0
    wy = v[wc] * np.repeat(ws, block)[:n]
    assert np.array_equal(np.isnan(y), np.isnan(wy))
    ok = ~np.isnan(wy)
    assert np.array_equal(y[ok].view(np.uint32), wy[ok].view(np.uint32))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", ALL_MAPS)
def test_midpoints(lib, m, bits):
    """x / absmax exactly on every midpoint (ties take the lower code), one
    ulp above and below it, and on every value, in blocks whose absmax is
    1 (so the quotient is x itself) and 0.75 (quotients rounded); and with
    absmax at the edges of the reciprocal's range (2^-126 and just under
    2^125 multiply by 1 / absmax; 2^125, 3e38 and a subnormal 1e-39
    divide)."""
    v = ref_map(m, bits)
    mids = ((v[:-1].astype(np.float64) + v[1:].astype(np.float64)) * 0.5).astype(np.float32)
    pts = np.concatenate([mids, np.nextafter(mids, np.float32(2)), np.nextafter(mids, np.float32(-2)), v])
    pts = pts[(pts >= (0 if m in UNSIGNED else -1)) & (pts <= 1)]
    if m not in UNSIGNED:
        pts = np.concatenate([pts, -pts])
    block = 64
    edges = [2.0 ** -126, np.nextafter(np.float32(2.0 ** 125), np.float32(0)), 2.0 ** 125, 3e38, 1e-39]
    for s in [np.float32(1), np.float32(0.75)] + [np.float32(e) for e in edges]:
        x = (pts * s).astype(np.float32)
        pad = (-x.size) % block + block
        x = np.concatenate([x, np.full(pad, s, dtype=np.float32)])  # every block holds its absmax s
        n = x.size
        codes = np.zeros(n if bits == 8 else (n + 1) // 2, dtype=np.uint8)
        scales = np.zeros(n // block, dtype=np.float32)
        assert lib.zo_cpuadam_quantize(x, n, m, bits, block, codes, scales) == 0
        wc, ws, _ = ref_quantize(x, m, bits, block)
        assert np.array_equal(scales.view(np.uint32), ws.view(np.uint32))
        assert np.array_equal(codes, pack(wc, bits))


@pytest.mark.parametrize("bits", [8, 4])
def test_zero_free(lib, bits):
    """The zero-free maps: no 0 among the codes in use; a 0 in a block with a
    positive absmax reads as the smallest entry times absmax, a block of
    zeros still reads 0."""
    for m in (DYN_U_NZ, LIN_U_NZ):
        got = np.zeros(2 ** bits, dtype=np.float32)
        assert lib.zo_cpuadam_qmap_values(m, bits, got) == 2 ** bits
        assert got.min() > 0 and got.max() == 1
        x = np.zeros(128, dtype=np.float32)
        x[64] = 3.0
        codes = np.zeros(128 if bits == 8 else 64, dtype=np.uint8)
        scales = np.zeros(2, dtype=np.float32)
        assert lib.zo_cpuadam_quantize(x, 128, m, bits, 64, codes, scales) == 0
        y = np.zeros(128, dtype=np.float32)
        assert lib.zo_cpuadam_dequantize(codes, scales, 128, m, bits, 64, y) == 0
        assert np.all(y[:64] == 0)
        assert y[64] == 3.0 and np.all(y[65:] == np.float32(got[0] * np.float32(3.0)))
