# SPDX-License-Identifier: Apache-2.0
"""The tiered store bindings (zoffload.store): exact bytes through host and
NVMe homes and the device tier (the host backend), trace-driven prefetch,
struct layouts, and clear errors for bad arguments."""
import ctypes
import errno
import os

import numpy as np
import pytest

import zoffload
from zoffload import store as zs
from zoffload.optim import Device
from test_core import test_abi_layout as _abi_layout

MiB = 1 << 20


def test_store_struct_layouts(tmp_path):
    """store.py's mirrors (registered on import) match the C compiler's."""
    assert "zo_store_config" in zoffload._lib.C_STRUCTS
    assert "zo_store_stats" in zoffload._lib.C_STRUCTS
    _abi_layout(tmp_path)
    for cname in ("zo_store_config", "zo_tensor_desc", "zo_swap_config"):
        assert zoffload._lib.c_struct_size(cname) == ctypes.sizeof(zs._SIZED[cname][0])


def _bytes_at(addr, n):
    return np.frombuffer(ctypes.string_at(addr, n), np.uint8)


def _store(tmp_path, home, device_bytes=8 * MiB, host_bytes=16 * MiB, **kw):
    dev = Device("host")
    swap = None
    if home == "nvme":
        swap = zs.Swap([str(tmp_path)], arena_size=32 * MiB, chunk_size=1 * MiB)
    st = zs.Store(device=dev, device_bytes=device_bytes, host_bytes=host_bytes, swap=swap,
                  slot_size=1 * MiB, slots=8, pin_flags=zs.PIN_NO_LOCK, **kw)
    return st


@pytest.mark.parametrize("home", ["host", "nvme"])
def test_exact_bytes_round_trip(tmp_path, home):
    rng = np.random.default_rng(7)
    st = _store(tmp_path, home)
    # odd sizes: one smaller than a slot, one streamed through several
    # slots with a ragged end
    sizes = [12345, 3 * MiB + 5]
    ts, data = [], []
    for i, n in enumerate(sizes):
        t = st.register("t%d" % i, (n,), "u8", home=home)
        assert t.nbytes == n and st.info(t)["home"] == home
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        st.write(t, buf)
        ts.append(t)
        data.append(buf)
    for t, buf in zip(ts, data):
        back = np.zeros_like(buf)
        st.read(t, back)
        assert np.array_equal(back, buf)
        # through the device tier: the exact bytes arrive
        addr = st.acquire(t, "device").wait()
        assert addr
        assert st.info(t)["refs"]["device"] == 1
        assert np.array_equal(_bytes_at(addr, t.nbytes), buf)
        st.release(t, "device")
    # modify on the device, write back, read from home
    t, buf = ts[1], data[1]
    addr = st.acquire(t, "device", write=True).wait()
    new = rng.integers(0, 256, t.nbytes, dtype=np.uint8)
    ctypes.memmove(addr, new.ctypes.data, t.nbytes)
    st.release(t, "device", writeback=True)
    st.flush(t)
    info = st.info(t)
    assert not info["dirty"]["device"]
    back = np.zeros_like(new)
    st.read(t, back)
    assert np.array_equal(back, new)
    # a partial write at an unaligned offset keeps the rest
    patch = np.full(1000, 0xAB, np.uint8)
    st.write(t, patch, off=MiB + 3)
    new[MiB + 3:MiB + 1003] = 0xAB
    st.read(t, back)
    assert np.array_equal(back, new)
    s = st.stats()
    assert s["peak"]["device"] <= s["budget"]["device"] == 8 * MiB
    st.close()
    with pytest.raises(ValueError, match="store is closed"):
        st.stats()


def test_trace_prefetch_after_first_iteration(tmp_path):
    """The order of the first iteration drives prefetch: later iterations
    find copies loaded ahead (prefetch_used), the device budget holds."""
    st = _store(tmp_path, "nvme", device_bytes=4 * MiB, lookahead=2)
    ts = []
    for i in range(6):
        t = st.register("layer%d" % i, (MiB // 4,), "f32", home="nvme")
        st.write(t, np.full(MiB // 4, i, np.float32))
        ts.append(t)
    for it in range(4):
        for i, t in enumerate(ts):
            addr = st.acquire(t, "device").wait()
            v = np.frombuffer(ctypes.string_at(addr, 16), np.float32)
            assert (v == i).all()
            st.release(t, "device")
        if it == 0:
            first = st.stats()
            assert first["prefetch_used"] == 0
        st.step()
    s = st.stats()
    assert s["trace_len"] == 6
    assert s["prefetch_used"] > 0 and s["prefetch_issued"] >= s["prefetch_used"]
    assert s["peak"]["device"] <= 4 * MiB
    st.close()


def test_tier_bytes_needed():
    exact, anyl = zs.tier_bytes_needed("device", [((1000,), "f32"), ((3, 5), "bf16")])
    assert exact >= 4000 + 30 and anyl >= exact
    with pytest.raises(ValueError, match="tier 'gpu'"):
        zs.tier_bytes_needed("gpu", [((4,), "f32")])
    with pytest.raises(zoffload.InvalidArgument):
        zs.tier_bytes_needed("nvme", [((4,), "f32")])


def test_bad_arguments(tmp_path):
    with pytest.raises(zoffload.InvalidArgument) as ei:
        zs.Store(device_bytes=MiB, host_bytes=MiB)      # a device tier without a device
    assert ei.value.name == "ZO_ECONFIG" and "dev" in str(ei.value)
    with pytest.raises(zoffload.ZoError) as ei:
        zs.Swap([str(tmp_path / "missing")], arena_size=MiB)
    assert isinstance(ei.value, OSError) and ei.value.errno == errno.ENOENT
    assert "missing" in str(ei.value)
    with pytest.raises(ValueError, match="no directory"):
        zs.Swap([])
    with pytest.raises(TypeError, match="unknown or reserved config field 'bogus'"):
        zs.Store(host_bytes=MiB, bogus=1)
    with pytest.raises(ValueError, match="trace"):
        zs.Store(host_bytes=MiB, trace="sometimes")

    st = _store(tmp_path, "host", device_bytes=2 * MiB, host_bytes=4 * MiB)
    t = st.register("w", (256,), "f32", home="host")
    with pytest.raises(zoffload.ZoError) as ei:
        st.register("w", (256,), "f32", home="host")
    assert ei.value.errno == errno.EEXIST and "w" in str(ei.value)
    with pytest.raises(zoffload.InvalidArgument) as ei:
        st.register("n", (4,), "f32", home="nvme")       # no NVMe tier configured
    assert "nvme" in ei.value.detail
    with pytest.raises(zoffload.InvalidArgument):
        st.register("", (4,), "f32", home="host")
    with pytest.raises(TypeError, match="dtype"):
        st.register("x", (4,), "complex64", home="host")
    with pytest.raises(ValueError, match="tier 'gpu'"):
        st.acquire(t, "gpu")
    with pytest.raises(zoffload.InvalidArgument):
        st.acquire(t, "nvme")                           # NVMe has no address
    big = st.register("big", (3 * MiB,), "u8", home="host")
    with pytest.raises(zoffload.BudgetError) as ei:
        st.acquire(big, "device")                       # larger than the device budget
    assert "big" in str(ei.value) and "device" in str(ei.value)
    with pytest.raises(zoffload.StateError):
        st.release(t, "device")                         # no reference held
    with pytest.raises(ValueError, match="past its"):
        st.read(t, np.zeros(300, np.float32))
    with pytest.raises(ValueError, match="not contiguous|C-contiguous"):
        st.write(t, np.zeros(512, np.float32)[::2])
    # a reference blocks unregistering; a writer in another tier is refused
    st.acquire(t, "device").wait()
    with pytest.raises(zoffload.StateError):
        st.unregister(t)
    with pytest.raises(zoffload.StateError) as ei:
        st.acquire(t, "host", write=True)
    assert "references" in str(ei.value)
    st.release(t, "device")
    st.unregister(t)
    with pytest.raises(ValueError, match="not registered"):
        st.acquire(t, "device")
    with pytest.raises(KeyError):
        st.find("w")
    other = _store(tmp_path, "host", device_bytes=MiB, host_bytes=MiB)
    with pytest.raises(ValueError, match="not registered in this store"):
        other.acquire(big, "device")
    other.close()
    st.close()


def test_close_order_any(tmp_path):
    """A device and swap store closed (or collected) before the store over
    them stay open until the store is closed."""
    dev = Device("host")
    swap = zs.Swap([str(tmp_path)], arena_size=4 * MiB)
    st = zs.Store(device=dev, device_bytes=MiB, swap=swap, slot_size=MiB, slots=4,
                  pin_flags=zs.PIN_NO_LOCK)
    t = st.register("a", (1000,), "f32")
    dev.close()
    swap.close()
    x = np.arange(1000, dtype=np.float32)
    st.write(t, x)
    req = st.acquire(t, "device")
    st.close()      # waits for the pending request, then closes all three
    assert req.done
    assert not swap._h and not dev._h
    assert not os.listdir(str(tmp_path))
