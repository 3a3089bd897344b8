# SPDX-License-Identifier: Apache-2.0
"""examples/finetune.py runs end to end at a tiny size (so the documented
example stays true): both optimizers train, and the report is complete."""
import os
import re
import subprocess
import time
import sys

from conftest import SRC, torch_or_skip


def test_finetune_example_runs():
    torch_or_skip()
    cmd = [sys.executable, os.path.join(SRC, "examples", "finetune.py"), "--dim", "32",
           "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "2", "--steps", "8",
           "--warmup", "2", "--threads", "1", "--compare", "torch", "--lr", "3e-3"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    for which in ("zoffload", "torch"):
        m = re.search(r"\[%s\] loss ([0-9.]+) -> ([0-9.]+) \| ([0-9]+) tokens/s \| step ([0-9.]+) ms"
                      % which, out)
        assert m, out
        assert float(m.group(2)) < float(m.group(1)), out       # it learned something
        assert int(m.group(3)) > 0
    assert re.search(r"\[zoffload\] optimizer per step: .* "
                     r"pinned [0-9.]+ MiB", out), out
    assert "peak host memory" in out and "corpus:" in out


def test_finetune_weights_round_trip(tmp_path):
    """--save-weights writes the trained model as safetensors; --weights
    starts a run from it (same first loss as the saved model's next step
    would see: here, checked by reading the file back tensor for tensor);
    a file that does not match the model, or is not safetensors, is a clear
    error (exit 2), and an existing weights file survives a failed save."""
    torch = torch_or_skip()
    sys.path.insert(0, os.path.join(SRC, "examples"))
    import finetune
    base = [sys.executable, os.path.join(SRC, "examples", "finetune.py"), "--dim", "32", "--layers", "1",
            "--heads", "2", "--seq", "16", "--batch", "2", "--steps", "2", "--warmup", "1", "--threads", "1"]
    w1 = str(tmp_path / "w1.safetensors")
    r = subprocess.run(base + ["--save-weights", w1], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert r.returncode == 0, r.stdout.decode()
    saved = finetune.load_safetensors(w1)
    model = finetune.Decoder(256, 32, 1, 2, 16)
    assert set(saved) == {n for n, _ in model.named_parameters()}
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    # start from them: the weights loaded equal the file's, and training goes on
    w2 = str(tmp_path / "w2.safetensors")
    r = subprocess.run(base + ["--weights", w1, "--steps", "1", "--warmup", "0", "--lr", "0",
                               "--weight-decay", "0", "--max-grad-norm", "0", "--save-weights", w2],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert "weights: %d tensors from %s" % (len(saved), w1) in out, out
    again = finetune.load_safetensors(w2)      # lr 0: unchanged by the step
    for n, t in saved.items():
        assert torch.equal(t, again[n]), n
    # the reader's own checks
    m = finetune.Decoder(256, 32, 1, 2, 16)
    assert finetune.load_weights(m, w1) == len(saved)
    for n, p in m.named_parameters():
        assert torch.equal(p.detach().to(torch.bfloat16), saved[n]), n
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    other = str(tmp_path / "other.safetensors")
    finetune.save_safetensors(other, {"x": torch.zeros(3)})
    for path, msg in ((str(bad), "not JSON"), (other, "does not match the model"),
                      (str(tmp_path / "missing.safetensors"), "no such file")):
        r = subprocess.run(base + ["--weights", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        assert r.returncode == 2 and msg in r.stdout.decode(), (path, r.stdout.decode())
    # a save that cannot complete leaves the earlier file whole
    before = open(w1, "rb").read()
    try:
        finetune.save_safetensors(w1, {"x": torch.zeros(3, dtype=torch.int64)})
    except finetune.WeightsError as e:
        assert "F32, F16, BF16 only" in str(e)
    else:
        raise AssertionError("an int64 tensor was written")
    assert open(w1, "rb").read() == before
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]


def test_finetune_malformed_safetensors_headers(tmp_path):
    """Each malformed header the issue found (AttributeError, RecursionError,
    TypeError, OverflowError, RuntimeError on negative dims before) is a
    WeightsError, which main() turns into exit 2 with the message."""
    torch_or_skip()
    sys.path.insert(0, os.path.join(SRC, "examples"))
    import finetune

    def file_with(header_bytes, data=b"\0" * 16):
        p = tmp_path / ("h%d.safetensors" % len(os.listdir(tmp_path)))
        p.write_bytes(len(header_bytes).to_bytes(8, "little") + header_bytes + data)
        return str(p)

    cases = [
        b"[1, 2, 3]",                                               # not an object
        b"[" * 100000 + b"]" * 100000,                              # deeper than the parser's stack
        b'{"x": 5}',                                                # entry not an object
        b'{"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}',   # unhashable dtype
        b'{"x": {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]}}',  # negative dims
        b'{"x": {"dtype": "F32", "shape": [1e300], "data_offsets": [0, 4]}}',  # float dim
        b'{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1e400]}}',  # inf offset
        b'{"x": {"dtype": "F32", "shape": [99999999999999999999], "data_offsets": [0, 4]}}',
        b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [8]}}',          # one offset
        b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 99]}}',      # past the data
        b'{"x": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}',      # unsupported dtype
    ]
    for h in cases:
        try:
            finetune.load_safetensors(file_with(h))
        except finetune.WeightsError:
            pass
        else:
            raise AssertionError("accepted: %r" % h[:80])
    good = finetune.load_safetensors(file_with(b'{"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}'))
    assert tuple(good["x"].shape) == (2, 2)


def test_finetune_refuses_what_cannot_fit(tmp_path):
    """The zoffload run checks its memory need against MemAvailable before
    anything is allocated: the 3B fp32 NVMe run that was OOM-killed at 24.3
    GB (leaving 37 GB of swap files) now exits 2 at once with the figures and
    what would fit, and leaves nothing in --nvme-path. MemAvailable is set
    low through a copy of /proc/meminfo so the test does the same on any
    machine."""
    torch_or_skip()
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:       25165824 kB\nMemAvailable:   20971520 kB\n")
    nv = tmp_path / "nvme"
    nv.mkdir()
    code = ("import sys; sys.argv = sys.argv[1:]; sys.path.insert(0, %r); import finetune; "
            "orig = finetune._meminfo; "
            "finetune._meminfo = lambda k, path='/proc/meminfo': orig(k, %r if k == 'MemAvailable' else path); "
            "finetune.cli()" % (os.path.join(SRC, "examples"), str(fake)))
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", code, "finetune.py", "--preset", "3b", "--dtype", "fp32",
                        "--offload", "nvme", "--nvme-path", str(nv), "--steps", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 2, out
    assert "MemAvailable is 20.0 GiB" in out and "nothing was allocated" in out and "--dtype bf16 needs" in out, out
    assert time.time() - t0 < 60, "took %.0f s: something was built first" % (time.time() - t0)
    assert os.listdir(nv) == []


def test_finetune_compare_all_warmup():
    """--steps no larger than --warmup times nothing: the comparison says so
    instead of dividing by zero."""
    torch_or_skip()
    cmd = [sys.executable, os.path.join(SRC, "examples", "finetune.py"), "--dim", "32",
           "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "2", "--steps", "2",
           "--warmup", "2", "--threads", "1", "--compare", "torch"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert "no speed comparison: --steps 2 leaves no step after --warmup 2" in out, out


def test_ds_offload_bf16_collectives(tmp_path):
    """examples/ds_offload.py routes bf16 collectives through fp32 for gloo
    while its context (DeepSpeed's engine) lives, unwinds nested routing in
    order, and gives torch.distributed its own functions back, also when the
    body raises."""
    torch = torch_or_skip()
    import torch.distributed as td
    sys.path.insert(0, os.path.join(SRC, "examples"))
    import ds_offload
    mine = not td.is_initialized()
    if mine:
        td.init_process_group("gloo", init_method="file://%s" % (tmp_path / "pg"), rank=0, world_size=1)
    own = {n: getattr(td, n) for n in ("all_reduce", "broadcast", "reduce")}
    try:
        with ds_offload.bf16_collectives(torch):
            outer = {n: getattr(td, n) for n in own}
            assert all(outer[n] is not own[n] for n in own)
            with ds_offload.bf16_collectives(torch):     # twice: each wraps what it found
                t = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
                td.all_reduce(t)
                td.broadcast(t, src=0)
                assert t.dtype == torch.bfloat16 and t.tolist() == [1.5, -2.25]
            assert all(getattr(td, n) is outer[n] for n in own)
            t = torch.tensor([3.0], dtype=torch.bfloat16)
            td.reduce(t, dst=0)
            assert t.tolist() == [3.0]
        assert all(getattr(td, n) is own[n] for n in own)
        try:
            with ds_offload.bf16_collectives(torch):
                raise KeyError("body fails")
        except KeyError:
            pass
    finally:
        if mine:
            td.destroy_process_group()
    assert all(getattr(td, n) is own[n] for n in own)
