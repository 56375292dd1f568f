"""Rank processes of test_dcp_resume.py, started by torchrun (2 ranks, gloo on CPU): a
training loop of the FSDP2 net of _torch_shard_child that saves every step through
``dcp.save`` or ``dcp.async_save`` into a tlio run directory and resumes from the step
``tlio.dcp.Reader(run_dir)`` picks.

  train RUN STEPS HOW KILL REPORT
      HOW    ``sync``, ``thread`` (async_save, thread checkpointer, DCP's default stager),
             ``pinned`` (thread checkpointer, a DefaultStager with pinned memory where CUDA is, shared
             memory and asynchronous staging) or ``process`` (the process checkpointer)
      KILL   ``none``, or ``STEP:RANK:WHERE``: rank RANK sends itself SIGKILL at step
             STEP, WHERE being ``write`` (in the middle of its write_data, after its
             first tensor) or ``pending`` (right after async_save returned, the write
             still running in the background); a kill inside ``finish`` comes from the
             FAILPOINTS the test sets (ckpt/fsync, ckpt/rename abort the process)

Each step trains on a batch that is a function of the step alone, so a resumed run is
bit for bit the uninterrupted one. Each rank writes {"start": step resumed from,
"digests": the gathered state's digests at the end} to REPORT.<rank>.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, os.path.dirname(__file__))
import _torch_shard_child as shard  # noqa: E402
import tlio.dcp  # noqa: E402

torch.set_num_threads(1)


def train_step(net, opt, step: int) -> None:
    x = torch.arange(2 * shard.SEQ).view(2, shard.SEQ) * (step + 3) % shard.VOCAB
    loss = F.cross_entropy(net(x).reshape(-1, shard.VOCAB), x.roll(-1, 1).reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


def state(net, opt, step: int) -> dict:
    msd, osd = get_state_dict(net, opt)
    return {"model": msd, "optim": osd, "extra": {"step": step}}


class KillingWriter(tlio.dcp.Writer):
    """A tlio writer whose rank ``rank`` kills itself inside write_data at ``step``,
    after the first of its tensors was written (DCP writes them in plan order)."""

    def __init__(self, *args, kill_rank: int = -1, **kw):
        super().__init__(*args, **kw)
        self.kill_rank = kill_rank

    def write_data(self, plan, planner):
        if dist.get_rank() == self.kill_rank:
            half = type(plan)(items=plan.items[: max(1, len(plan.items) // 2)], storage_data=plan.storage_data,
                              planner_data=plan.planner_data)
            super().write_data(half, planner).wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write_data(plan, planner)


def saver(how: str):
    """(save function, whether it is asynchronous) for HOW. An asynchronous save runs its
    collectives on a process group of its own, as torchtitan's do, so they never
    interleave with the training step's on the default group."""
    if how == "sync":
        return dcp.save, False
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    group = dist.new_group(backend="gloo")

    if how == "thread":
        return (lambda sd, **kw: dcp.async_save(sd, async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                                process_group=group, **kw)), True
    if how == "process":
        return (lambda sd, **kw: dcp.async_save(sd, async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                                                process_group=group, **kw)), True
    if how == "pinned":
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        stager = DefaultStager(StagingOptions(use_pinned_memory=torch.cuda.is_available(), use_shared_memory=True,
                                              use_async_staging=True, use_non_blocking_copy=False))
        return (lambda sd, **kw: dcp.async_save(sd, async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                                async_stager=stager, process_group=group, **kw)), True
    raise ValueError(how)


def wait(pending) -> None:
    """Wait for an async save: its upload future (a staged save gives a pair)."""
    if pending is None:
        return
    upload = getattr(pending, "upload_completion", pending)
    upload.result()


def train(run: str, steps: str, how: str, kill: str, report: str) -> None:
    total = int(steps)
    kill_step, kill_rank, where = (-1, -1, "")
    if kill != "none":
        s, r, where = kill.split(":")
        kill_step, kill_rank = int(s), int(r)
    net, opt = shard.build("fsdp", 0)
    start = 0
    if os.path.isdir(run) and tlio.dcp.latest(run) is not None:
        sd = state(net, opt, -1)
        dcp.load(sd, storage_reader=tlio.dcp.Reader(run))
        set_state_dict(net, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        start = sd["extra"]["step"] + 1
    save, is_async = saver(how)
    pending = None
    for step in range(start, total):
        train_step(net, opt, step)
        wait(pending)  # one save in flight at a time, as torchtitan does
        pending = None
        sd = state(net, opt, step)
        if step == kill_step and where == "write":
            dcp.save(sd, storage_writer=KillingWriter(run, step=step, kill_rank=kill_rank))
            continue
        out = save(sd, storage_writer=tlio.dcp.Writer(run, step=step))
        if is_async:
            pending = out
            if step == kill_step and where == "pending" and dist.get_rank() == kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
    wait(pending)
    digests = shard.digests(net, opt)
    with open(f"{report}.{dist.get_rank()}", "w") as f:
        json.dump({"start": start, "digests": digests}, f)


def main():
    dist.init_process_group("gloo")
    try:
        {"train": train}[sys.argv[1]](*sys.argv[2:])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
