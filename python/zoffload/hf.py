# SPDX-License-Identifier: Apache-2.0
"""Hugging Face Trainer checkpoints for zoffload.torch's optimizers.

The Trainer saves ``optimizer.state_dict()`` on rank 0 only and, on resume,
loads that one file on every rank. That is right for a replicated
optimizer and wrong for a partitioned one: with ``process_group`` each
rank holds only its shard, so the file would hold rank 0's shard alone
(load_state_dict() on another rank refuses it). ``attach(trainer)`` makes
the Trainer save and load the optimizer through the engine instead:

    from zoffload.hf import attach
    trainer = transformers.Trainer(model=model, args=args, optimizers=(opt, sched), ...)
    attach(trainer)                     # before trainer.train()
    trainer.train(resume_from_checkpoint=...)

- Save: every rank (not only rank 0) writes its part with ``opt.save()``
  into ``<checkpoint>/zoffload_optimizer``: the engine's crash-safe commit,
  one world manifest after every rank's shard (a kill -9 of any rank
  leaves the previous checkpoint loadable); the NVMe / quantized states go
  as they are. Rank 0's ``optimizer.pt`` becomes a small stub that names
  that directory (the scheduler, scaler and RNG files are the Trainer's,
  unchanged).
- Resume: when the checkpoint has that directory, every rank calls
  ``opt.load()`` (collective; a different world size reshards at load)
  and the stub is checked instead of loaded. A checkpoint without it (saved
  before attach, or by torch.optim) loads as the Trainer always did.

It works without ``process_group`` too (each rank, or the only one, saves
its engine's checkpoint; nothing is converted to torch's format and back).
The optimizer is found through accelerate's wrapper (``.optimizer``). It
replaces the Trainer's ``_save_optimizer_and_scheduler`` and
``_load_optimizer_and_scheduler`` on this one instance (the Trainer
offers no public hook for the optimizer's checkpoint; both have had this
name and signature from transformers 4.3x to 5.x); a Trainer whose
optimizer is not zoffload's is left as it was.
"""

import contextlib
import os
import time

DIRNAME = "zoffload_optimizer"
_STUB = "zoffload.hf.stub/1"


def _offload_opt(opt):
    """The OffloadOptimizer under accelerate's AcceleratedOptimizer (and any
    wrapper that keeps it as .optimizer), or None."""
    from .torch import OffloadOptimizer
    seen = 0
    while opt is not None and not isinstance(opt, OffloadOptimizer) and seen < 8:
        opt = getattr(opt, "optimizer", None)
        seen += 1
    return opt if isinstance(opt, OffloadOptimizer) else None


def _global_rank0(group):
    """Rank 0 of `group` as the default group numbers it."""
    from .part import global_rank
    return global_rank(group, 0)


def stub_state_dict(opt, dirname=DIRNAME):
    """What the Trainer's optimizer.pt holds under attach(): where the
    engine's checkpoint is, and no "param_groups" on purpose: a torch
    optimizer given this file (the run switched optimizers) fails on the
    missing key instead of loading an empty state and starting its moments
    afresh without a word; OffloadOptimizer.load_state_dict() names
    attach."""
    return {"state": {},
            "zoffload": {"format": _STUB, "checkpoint_dir": dirname, "kind": opt._kind,
                         "partition": None if not getattr(opt._eb, "partitioned", False)
                         else {"world": opt._eb.world}}}


def is_stub(state_dict):
    z = state_dict.get("zoffload") if isinstance(state_dict, dict) else None
    return isinstance(z, dict) and z.get("format") == _STUB


@contextlib.contextmanager
def _swap(opt, name, fn):
    """opt.<name> is `fn` inside (an instance attribute over the method, so
    every wrapper that calls opt.<name>() reaches it)."""
    had = name in vars(opt)
    old = vars(opt).get(name)
    setattr(opt, name, fn)
    try:
        yield
    finally:
        if had:
            setattr(opt, name, old)
        else:
            delattr(opt, name)


def attach(trainer, dirname=DIRNAME):
    """Make `trainer` save and resume its zoffload optimizer through the
    engine's checkpoints (module docstring). Call before train(). Returns
    the trainer. Calling it twice is harmless."""
    if getattr(trainer, "_zoffload_attached", False):
        return trainer
    for m in ("_save_optimizer_and_scheduler", "_load_optimizer_and_scheduler"):
        if not callable(getattr(trainer, m, None)):
            raise TypeError("zoffload.hf.attach: %s has no %s (not a transformers Trainer, or a version whose "
                            "checkpoint methods changed)" % (type(trainer).__name__, m))
    orig_save = trainer._save_optimizer_and_scheduler
    orig_load = trainer._load_optimizer_and_scheduler

    def save(output_dir):
        opt = _offload_opt(trainer.optimizer)
        if opt is None:
            return orig_save(output_dir)
        # Before the Trainer's files, the engine's commit: with process_group
        # on every rank (each writes its shard, then one world manifest);
        # without, the ranks' optimizers are replicas and the Trainer's saving
        # rank(s) write one copy (two ranks writing one directory would race).
        #
        # A name of its own each time (rank 0's, broadcast): a run resumed into
        # the same output_dir saves checkpoint-N again, and the engine never
        # overwrites a checkpoint; keep_last=2 keeps at most the previous one
        # beside it (zo_part_save refuses 1: a crash could leave no whole one).
        name = "opt-%d" % time.time_ns()
        if getattr(opt._eb, "partitioned", False):
            import torch.distributed as dist
            box = [name]
            dist.broadcast_object_list(box, src=_global_rank0(opt._eb.group), group=opt._eb.group)
            opt.save(os.path.join(output_dir, dirname), name=box[0], keep_last=2)
        elif trainer.args.should_save:
            opt.save(os.path.join(output_dir, dirname), name=name, keep_last=2)
        with _swap(opt, "state_dict", lambda *a, **k: stub_state_dict(opt, dirname)):
            return orig_save(output_dir)

    def load(checkpoint):
        opt = _offload_opt(trainer.optimizer)
        if opt is None or checkpoint is None or not os.path.isdir(os.path.join(checkpoint, dirname)):
            return orig_load(checkpoint)
        opt.load(os.path.join(checkpoint, dirname))        # its latest
        real = opt.load_state_dict

        def check(state_dict):
            if not is_stub(state_dict):
                # not the stub beside this directory: a full state dict wins as before
                return real(state_dict)
            if state_dict["zoffload"].get("kind") != opt._kind:
                raise ValueError("zoffload.hf: %s's optimizer.pt was written for %s, this optimizer is %s"
                                 % (checkpoint, state_dict["zoffload"].get("kind"), opt._kind))
        with _swap(opt, "load_state_dict", check):
            return orig_load(checkpoint)

    trainer._save_optimizer_and_scheduler = save
    trainer._load_optimizer_and_scheduler = load
    trainer._zoffload_attached = True
    return trainer
