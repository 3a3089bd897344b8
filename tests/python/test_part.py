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
rank, world, init, dtype, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
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
comm = zpart.TorchComm(asynchronous=mode == "async")
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


def _ranks(tmp_path, worker, world, *args):
    """Run `worker` as `world` processes over a gloo file rendezvous (argv:
    rank, world, init, args); each one's last stdout line as JSON, in rank
    order. Skips without torch.distributed or zo_part."""
    torch_or_skip()
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    from zoffload import part as zpart
    if not zpart.available():
        pytest.skip("the library has no zo_part")
    init = "file://" + str(tmp_path / "rendezvous")
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", worker, str(r), str(world), init] + list(args), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=300)
        assert p.returncode == 0, e[-3000:]
        outs.append(json.loads(o.strip().splitlines()[-1]))
    return outs


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_part_two_ranks_match_one(tmp_path, dtype, mode):
    outs = _ranks(tmp_path, WORKER, 2, dtype, mode)
    for r, o in enumerate(outs):
        for s, st in enumerate(o["steps"], 1):
            assert st["clipped"], "the reference did not clip: the global norm would go unchecked"
            assert st["same"], "rank %d step %d: parameters differ from the single-rank engine's" % (r, s)
            assert abs(st["norm"] - st["ref_norm"]) <= 1e-12 * st["ref_norm"], st
        i = o["info"]
        assert i["numel"] == o["ref_numel"] and abs(2 * i["shard_numel"] - i["numel"]) <= 4, i
        assert i["reduce_scatters"] > 0 and i["buckets_in_grad"] > 0, i
    assert outs[0]["info"]["state_host_bytes"] + outs[1]["info"]["state_host_bytes"] > 0


COMM_WORKER = r'''
import ctypes, json, sys
import torch, torch.distributed as dist
from zoffload import part as zpart
from zoffload.optim import arrays
rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
sub = dist.new_group([1, 2])          # ranks 1 and 2 of the world are 0 and 1 here: isend must map them
DT = {"f32": (arrays.F32, torch.float32), "bf16": (arrays.BF16, torch.bfloat16), "f16": (arrays.F16, torch.float16)}
def data(r, n, dt, s):
    g = torch.Generator().manual_seed(1000 * s + r)
    return (torch.randn(n, generator=g) * (1 + 1000 * r)).to(dt)   # magnitudes apart: the order shows
def coll(sync, start, bufs, cnt, zdt):
    """One buffer: the synchronous callback; more: all started, then waited in order. The return codes."""
    if len(bufs) == 1:
        return [sync(None, bufs[0].data_ptr(), cnt, zdt)]
    reqs = [ctypes.c_void_p() for _ in bufs]
    rcs = [start(None, x.data_ptr(), cnt, zdt, ctypes.pointer(q)) for x, q in zip(bufs, reqs)]
    return rcs + [comm._wait(None, q.value) for q in reqs]
out = {}
for gname, group, members in (("world", None, list(range(world))), ("sub", sub, [1, 2])):
    if rank not in members:
        continue
    comm = zpart.TorchComm(group)
    me, w = comm.rank, comm.world
    for counts in ([3, 0, 70001][:w], [40000, 40000, 39999][:w], [0] * (w - 1) + [5], [1] * w):
        b = [sum(counts[:k]) for k in range(w + 1)]
        cnt = (ctypes.c_uint64 * w)(*counts)
        for name, (zdt, tdt) in DT.items():
            for mode in ("sync", "async"):
                # async: two reduce-scatters in flight (as the engine's two buckets), then two all-gathers
                seeds = (0,) if mode == "sync" else (1, 2)
                bufs = [data(members[me], b[-1], tdt, s) for s in seeds]
                rcs = coll(comm._reduce_scatter, comm._reduce_scatter_start, bufs, cnt, zdt)
                ok_rs = rcs == [0] * len(rcs)
                for x, s in zip(bufs, seeds):
                    acc = data(members[0], b[-1], tdt, s)[b[me]:b[me + 1]].float()
                    for k in range(1, w):
                        acc += data(members[k], b[-1], tdt, s)[b[me]:b[me + 1]].float()
                    ok_rs = ok_rs and torch.equal(x[b[me]:b[me + 1]].view(torch.uint8), acc.to(tdt).view(torch.uint8))
                # the other chunks: sent, left as they were (the engine treats them as undefined)
                fulls, bufs = [], []
                for s in seeds:
                    full = torch.cat([data(members[k], b[-1], tdt, s + 7)[b[k]:b[k + 1]] for k in range(w)])
                    x = torch.full((b[-1],), -3.0).to(tdt)
                    x[b[me]:b[me + 1]] = full[b[me]:b[me + 1]]
                    fulls.append(full)
                    bufs.append(x)
                rcs = coll(comm._all_gather, comm._all_gather_start, bufs, cnt, zdt)
                ok_ag = rcs == [0] * len(rcs) and all(torch.equal(x.view(torch.uint8), f.view(torch.uint8))
                                                      for x, f in zip(bufs, fulls))
                out["%s %s %s %s" % (gname, counts, name, mode)] = [ok_rs, ok_ag, comm.error is None]
    # a request waited twice (or never started) is an error, not a hang
    out["bad wait"] = [comm._wait(None, 12345) < 0, True, comm.error is not None]
    comm.error = None
print(json.dumps(out))
'''


def test_torch_comm_collectives_three_ranks(tmp_path):
    """TorchComm's reduce-scatter sums in rank order in fp32 (one rounding
    for bf16 / fp16), the same bits as comm_mpi.h's ordered mode, and its
    all-gather fills every chunk: 3 ranks, uneven and empty chunks, the
    world and a sub-group (ranks named by their global rank on the wire),
    synchronous and through start / wait with two requests in flight."""
    for r, res in enumerate(_ranks(tmp_path, COMM_WORKER, 3)):
        assert len(res) == (1 if r == 0 else 2) * 4 * 3 * 2 + 1, sorted(res)
        bad = {k: v for k, v in res.items() if v != [True, True, True]}
        assert not bad, "rank %d: [reduce_scatter ok, all_gather ok, no error]: %s" % (r, bad)


def test_torch_comm_needs_an_initialized_group():
    torch_or_skip()
    from zoffload import part as zpart
    with pytest.raises(RuntimeError, match="not initialized"):
        zpart.TorchComm()
