# SPDX-License-Identifier: Apache-2.0
"""DeepSpeed ZeRO-Offload as the peer of examples/finetune.py (--compare deepspeed).

DeepSpeed is not a dependency of zoffload: it lives in the virtual
environment benchmarks/setup_ds_venv.sh makes (a venv over Debian's torch,
--system-torch, so both runs use the same torch build and the same oneDNN
bf16 matmuls). finetune.py re-runs itself with that venv's python for the
DeepSpeed half of the comparison; this module builds the engine there.

What runs is DeepSpeed's own ZeRO-Offload as a user configures it: ZeRO
stage 2 with `offload_optimizer.device = "cpu"` (DeepSpeedCPUAdam on fp32
masters and states in host memory, bf16 params) or, for --offload nvme,
stage 3 with `offload_optimizer.device = "nvme"` (its aio swapper; ZeRO-3
is the only stage DeepSpeed accepts NVMe with). Three adjustments let it run
on a CPU-only single-process machine, none of which changes the work
DeepSpeed does per step:

* its CPU ops are JIT-built with the C++ standard fix of
  benchmarks/_ds_common.py (DeepSpeed's sources need C++17; torch 1.13's
  cpp_extension passes c++14), and for NVMe its swappers get the libaio
  async_io builder (the CPU accelerator maps async_io to a builder that
  refuses to load, although the op is host code);
* the process group is gloo with one rank (DeepSpeed's CPU accelerator
  would ask for oneCCL, which is not packaged);
* gloo in torch 1.13 has no bf16 reductions ("Invalid scalar type"): a
  bf16 tensor handed to all_reduce / broadcast / reduce goes through an
  fp32 copy. With one rank these collectives are identities, so only the
  copy's time is added (a few ms per step at the sizes we run, counted
  against DeepSpeed).
"""

import contextlib
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(HERE), "benchmarks")


def available():
    """True when deepspeed imports in this interpreter."""
    try:
        importlib.import_module("deepspeed")
    except Exception:          # absent, or present but broken (its import runs op builders)
        return False
    return True


def _single_rank_env():
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(29500 + os.getpid() % 1000)),
                 ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)


@contextlib.contextmanager
def bf16_collectives(torch):
    """While open, bf16 tensors handed to torch.distributed's all_reduce,
    broadcast and reduce go through an fp32 copy (gloo in torch 1.13 has no
    bf16). The functions it replaced are kept here, in the context, and put
    back when it closes, error or not; nested contexts unwind in order."""
    import torch.distributed as td

    def via_fp32(fn):
        def w(tensor, *a, **k):
            if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bfloat16:
                t = tensor.float()
                r = fn(t, *a, **k)
                if r is not None and hasattr(r, "wait"):
                    r.wait()
                tensor.copy_(t)
                return None
            return fn(tensor, *a, **k)
        return w

    saved = {name: getattr(td, name) for name in ("all_reduce", "broadcast", "reduce")}
    for name, fn in saved.items():
        setattr(td, name, via_fp32(fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(td, name, fn)


def _fix_builders():
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    import _ds_common as c
    for cls in c.cpu_op_builder_classes():
        c.fix_cxx_std(cls)
    # the package-level name, as DeepSpeedCPUAdam imports it: 0.14 keeps the
    # class in op_builder/cpu_adam.py, 0.19 in op_builder/cpu/cpu_adam.py
    from deepspeed.ops.op_builder import CPUAdamBuilder
    c.fix_cxx_std(CPUAdamBuilder)
    # NVMe offload: DeepSpeed's CPU accelerator maps AsyncIOBuilder to a
    # builder that refuses to build on a CPU-only machine, although its libaio
    # op is host code.
    # Hand its swappers the libaio builder (with the same C++ fix).
    aio_cls = type(c.aio_builder())
    for mod in ("partitioned_optimizer_swapper", "pipelined_optimizer_swapper",
                "partitioned_param_swapper"):
        try:
            m = importlib.import_module("deepspeed.runtime.swap_tensor." + mod)
        except ImportError:
            continue
        if hasattr(m, "AsyncIOBuilder"):
            m.AsyncIOBuilder = aio_cls


def config(args):
    """The DeepSpeed config that matches finetune.py's OffloadAdamW run."""
    cfg = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                 "weight_decay": args.weight_decay}},
        "gradient_clipping": args.max_grad_norm or 0.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif args.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16}
    if args.offload == "nvme":
        if not args.nvme_path:
            raise SystemExit("--compare deepspeed with --offload nvme needs --nvme-path")
        cfg["zero_optimization"] = {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": args.nvme_path,
                                  "pin_memory": True, "buffer_count": 4},
            "sub_group_size": 1e9,
        }
        cfg["aio"] = {"block_size": 1 << 20, "queue_depth": 32, "single_submit": False,
                      "overlap_events": True, "thread_count": 1}
    else:
        cfg["zero_optimization"] = {"stage": 2,
                                    "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                    "contiguous_gradients": True, "overlap_comm": False}
    return cfg


class Engine:
    """DeepSpeed engine with the small interface finetune.run() drives."""

    def __init__(self, model, args):
        import torch
        _single_rank_env()
        import deepspeed
        _fix_builders()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="gloo")
        self.cfg = config(args)
        # the routing lives as long as the engine: close() (or a failed
        # initialize) gives torch.distributed its own functions back
        self._scope = contextlib.ExitStack()
        self._scope.enter_context(bf16_collectives(torch))
        try:
            self.engine, self.opt, _, _ = deepspeed.initialize(model=model,
                                                               model_parameters=model.parameters(),
                                                               config=self.cfg)
        except BaseException:
            self._scope.close()
            raise
        self.version = deepspeed.__version__
        self.torch_version = torch.__version__

    def __call__(self, x):
        return self.engine(x)

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.engine.step()

    def close(self):
        """Give torch.distributed its own collectives back (twice is fine)."""
        self._scope.close()

    def describe(self):
        z = self.cfg["zero_optimization"]
        return "DeepSpeed %s (torch %s), ZeRO stage %d, offload_optimizer %s, %s" % (
            self.version, self.torch_version, z["stage"], z["offload_optimizer"]["device"],
            type(self.opt).__name__)
