# SPDX-License-Identifier: Apache-2.0
"""OffloadAdamW(process_group=...) when a rank stops answering: two real
processes over gloo. Rank 1 trains two steps and then hangs (it is alive,
so no launcher would notice: a deadlocked data loader, a stopped process).
Rank 0 must not hang in its next collective: the process group's
`timeout=` (here 6 s, on a group made for the optimizer once both ranks
are set up, so a slow start under a sanitizer is not mistaken for a
hang; the world group keeps torch's default) makes the collective fail, the
engine reports it as its own error naming the collective, and step()
raises within the timeout plus a few seconds. Then the optimizer refuses
further steps (the ranks are out of step) instead of computing with half
the gradients."""
import os
import subprocess
import sys
import time

import pytest

from conftest import SRC, torch_or_skip

TIMEOUT_S = 6

WORKER = r'''
import datetime, os, signal, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
from zoffload.torch import OffloadAdamW
rank, init, hang = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
dist.barrier()                                   # both ranks set up, under the default timeout
pg = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=%(timeout)d))
opt = OffloadAdamW(m.parameters(), lr=1e-3, process_group=pg, bucket_bytes=16 << 10)
g = torch.Generator().manual_seed(rank)
for s in range(6):
    if rank == 1 and s == 2:
        print("hanging", flush=True)
        if hang == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)
    x = torch.randn(8, 32, generator=g)
    loss = torch.nn.functional.mse_loss(m(x), torch.sin(x[:, :1]))
    t0 = time.monotonic()
    try:
        loss.backward()
        opt.step()
    except Exception as e:
        print("raised after %%.1f s at step %%d: %%s: %%s" %% (time.monotonic() - t0, s, type(e).__name__, e),
              flush=True)
        try:
            opt.step()
            print("second step did not raise", flush=True)
        except Exception as e2:
            print("then refused: %%s: %%s" %% (type(e2).__name__, e2), flush=True)
        os._exit(3)
    opt.zero_grad()
    print("step %%d done" %% s, flush=True)
print("finished", flush=True)
'''.replace("%(timeout)d", str(TIMEOUT_S)).replace("%%", "%")


def _env():
    return dict(os.environ, PYTHONPATH=os.path.join(SRC, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
                OMP_NUM_THREADS="1")


@pytest.mark.parametrize("hang", ["sleep", "stop"])
def test_hung_rank_fails_the_other_within_the_timeout(tmp_path, hang):
    torch = torch_or_skip()
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    from zoffload import part as zpart
    if not zpart.available():
        pytest.skip("the library has no zo_part")
    init = "file://" + str(tmp_path / "rv")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), init, hang], env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    t0 = time.monotonic()
    try:
        out, err = procs[0].communicate(timeout=600)   # generous: a sanitizer build is slow
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()    # SIGKILL ends a stopped process too
                p.communicate()
    assert procs[0].returncode == 3, (out, err[-3000:])
    assert "step 1 done" in out, out
    line = [l for l in out.splitlines() if l.startswith("raised")][0]
    secs = float(line.split()[2])
    # the collective gave up after the process group's timeout, not before and not much later
    assert TIMEOUT_S - 0.5 <= secs <= TIMEOUT_S + 60, line
    assert waited < 560
    # the engine names what failed; then it refuses to go on with the ranks out of step
    assert "reduce_scatter" in line or "all_gather" in line or "all_reduce" in line or "wait" in line, line
    refused = [l for l in out.splitlines() if l.startswith("then refused")]
    assert refused and "out of step" in refused[0] and "ProxyType" not in refused[0], out
