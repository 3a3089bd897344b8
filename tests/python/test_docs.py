# SPDX-License-Identifier: Apache-2.0
"""The complete fine-tuning loop of docs/pytorch.md runs as written (its
/tmp paths moved into the test's directory)."""
import os
import re
import subprocess
import sys

from conftest import SRC, torch_or_skip


def doc_block(path, heading):
    text = open(path).read()
    sect = text.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", sect, re.S).group(1)


def test_pytorch_md_loop_runs(tmp_path):
    torch_or_skip()
    code = doc_block(os.path.join(SRC, "docs", "pytorch.md"), "## A complete fine-tuning loop")
    code = code.replace('"/tmp/', '"%s/' % tmp_path)
    script = tmp_path / "loop.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=300, cwd=str(tmp_path))
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert "step 30: loss" in out
    assert (tmp_path / "zo_ckpt.pt").exists() and os.listdir(tmp_path / "zo_opt_ckpt")
