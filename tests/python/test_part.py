# SPDX-License-Identifier: Apache-2.0
"""zoffload.part: the partitioned engine driven from Python over
torch.distributed (gloo), two real processes. Every rank feeds its own
gradients; after each clipped AdamW step its parameters must equal, bit for
bit, those of a single-rank zoffload.optim.Engine fed the ranks' mean
gradient (two ranks: a + b is exact in either order, and the engine
divides the sum by the world size in fp32 as the reference does)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import SRC, torch_or_skip

WORKER = r'''
import json, sys
import numpy as np
import torch, torch.distributed as dist
from zoffload import optim as zoptim, part as zpart
rank, world, init, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
numel = [1000, 70001, 33, 4099]
npdt = {"f32": np.float32, "bf16": np.uint16}[dtype]
def params():
    out = []
    for t, n in enumerate(numel):
        x = torch.tensor(0.1 * np.cos(0.007 * np.arange(n) + t), dtype=torch.float32)
        out.append(x if dtype == "f32" else x.to(torch.bfloat16))
    return out
def grad(r, s, t):
    n = numel[t]
    return torch.tensor(0.05 * np.sin(0.013 * np.arange(n) + s + 0.7 * r + t) + 0.01 * (r - 1), dtype=torch.float32)
def groups(ps):
    return [{"numel": numel[:3], "dev_params": [p.data_ptr() for p in ps[:3]]},
            {"numel": numel[3:], "dev_params": [ps[3].data_ptr()]}]
kw = dict(param_dtype=dtype, grad_dtype="f32", lr=1e-2, weight_decay=0.1, max_grad_norm=0.5,
          sub_group_size=16384, nthreads=1)
mine, ref = params(), params()
comm = zpart.TorchComm()
pe = zpart.PartEngine(groups(mine), comm, bucket_bytes=64 << 10, **kw)
pe.init_from_device()
re = zoptim.Engine(groups(ref), **kw)
re.init_from_device()
out = {"steps": []}
for s in range(1, 5):
    keep = []
    for t in reversed(range(len(numel))):
        g = grad(rank, s, t)
        m = sum(grad(r, s, t) for r in range(world)) / world     # the mean, summed in rank order
        keep += [g, m]
        pe.grad(t, g.data_ptr())
        re.grad_host(t, m.numpy())
    a, b = pe.step(), re.step()
    same = all(torch.equal(x.view(torch.int16) if dtype == "bf16" else x.view(torch.int32),
                           y.view(torch.int16) if dtype == "bf16" else y.view(torch.int32))
               for x, y in zip(mine, ref))
    out["steps"].append({"same": same, "norm": a["grad_norm"], "ref_norm": b["grad_norm"],
                         "clipped": bool(b["clipped"])})
i, ri = pe.info(), re.info()
out["info"] = {k: i[k] for k in ("shard_numel", "numel", "state_host_bytes", "reduce_scatters", "buckets_in_grad")}
out["ref_numel"] = ri["numel"]
pe.close()
re.close()
dist.destroy_process_group()
print(json.dumps(out))
'''


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_part_two_ranks_match_one(tmp_path, dtype):
    torch = torch_or_skip()
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    from zoffload import part as zpart
    if not zpart.available():
        pytest.skip("the library has no zo_part")
    init = "file://" + str(tmp_path / "rendezvous")
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), "2", init, dtype], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=300)
        assert p.returncode == 0, e[-3000:]
        outs.append(json.loads(o.strip().splitlines()[-1]))
    for r, o in enumerate(outs):
        for s, st in enumerate(o["steps"], 1):
            assert st["clipped"], "the reference did not clip: the global norm would go unchecked"
            assert st["same"], "rank %d step %d: parameters differ from the single-rank engine's" % (r, s)
            assert abs(st["norm"] - st["ref_norm"]) <= 1e-12 * st["ref_norm"], st
        i = o["info"]
        assert i["numel"] == o["ref_numel"] and abs(2 * i["shard_numel"] - i["numel"]) <= 4, i
        assert i["reduce_scatters"] > 0 and i["buckets_in_grad"] > 0, i
    assert outs[0]["info"]["state_host_bytes"] + outs[1]["info"]["state_host_bytes"] > 0


def test_torch_comm_needs_an_initialized_group():
    torch_or_skip()
    from zoffload import part as zpart
    with pytest.raises(RuntimeError, match="not initialized"):
        zpart.TorchComm()
