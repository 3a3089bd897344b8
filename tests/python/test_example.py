"""examples/finetune.py runs end to end at a tiny size (so the documented
example stays true): both optimizers train, and the report is complete."""
import os
import re
import subprocess
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
    assert re.search(r"\[zoffload\] optimizer per step \((zo_optim|kernels) engine\): .* "
                     r"pinned [0-9.]+ MiB", out), out
    assert "peak host memory" in out and "corpus:" in out
