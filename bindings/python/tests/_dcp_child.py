"""Rank processes of test_dcp.py, started by torchrun (2 ranks, gloo on CPU). Each rank
writes what it saw as JSON to REPORT.<rank>.

  save DIR   the net of _torch_shard_child under FSDP2 and AdamW, trained; its DCP state
             (model, optimizer, a dict of plain values DCP stores as bytes items) saved
             by DCP's FileSystemWriter to DIR/fs/step-1 and through tlio.dcp.Writer to
             DIR/run (step=1) and DIR/titan/step-1 (checkpoint_id), then trained and saved
             again as step 2 (fs and run); each written step loaded back into a fresh
             FSDP2 net (DCP's FileSystemReader and tlio.dcp.Reader), digests reported
  faults DIR a write_data raising on rank 1 alone: both ranks raise, nothing committed,
             then the same step saves; a second writer of a committed step refused on
             both ranks
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, os.path.dirname(__file__))
import _torch_shard_child as shard  # noqa: E402
import tlio.dcp  # noqa: E402

torch.set_num_threads(1)
REPORT = ""
EXTRA = {"epoch": 3, "note": "dataloader at 17", "lrs": [0.1, 0.01]}


def state(net, opt, extra=None) -> dict:
    """The state a framework hands to dcp.save: model and optimizer state dicts of
    DTensors (or tensors) and a dict of plain values."""
    msd, osd = get_state_dict(net, opt)
    return {"model": msd, "optim": osd, "extra": dict(extra if extra is not None else EXTRA)}


def fresh(layout="fsdp"):
    """A net of other values whose optimizer has state to be overwritten by a load."""
    net, opt = shard.build(layout, 7) if dist.is_initialized() else plain_net(7)
    shard.train(net, opt, 1)
    return net, opt


def plain_net(seed):
    torch.manual_seed(seed)
    net = shard.Net()
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)


def load_into(net, opt, **kw) -> dict:
    """dcp.load into (net, opt) and a blank extra: the extra loaded."""
    sd = state(net, opt, {"epoch": 0, "note": "", "lrs": [0.0, 0.0]})
    dcp.load(sd, **kw)
    set_state_dict(net, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return sd["extra"]


def loaded(**kw) -> dict:
    net, opt = fresh()
    extra = load_into(net, opt, **kw)
    return {"digests": shard.digests(net, opt), "extra": extra}


def report(out):
    with open(f"{REPORT}.{dist.get_rank()}", "w") as f:
        json.dump(out, f)


def save(dir):
    out = {}
    net, opt = shard.build("fsdp", 0)
    shard.train(net, opt, 2)
    sd = state(net, opt)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{dir}/fs/step-1", sync_files=True))
    w = tlio.dcp.Writer(f"{dir}/run", step=1)
    dcp.save(sd, storage_writer=w)
    out["committed"] = w.committed
    dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/ignored"), checkpoint_id=f"{dir}/titan/step-1")
    out["saved1"] = shard.digests(net, opt)
    shard.train(net, opt, 1)
    sd = state(net, opt, {**EXTRA, "epoch": 4})
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{dir}/fs/step-2", sync_files=True))
    dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/run", step=2))
    out["saved2"] = shard.digests(net, opt)
    out["fs"] = loaded(storage_reader=dcp.FileSystemReader(f"{dir}/fs/step-1"))
    out["tlio"] = loaded(storage_reader=tlio.dcp.Reader(f"{dir}/run", step=1))
    out["titan"] = loaded(storage_reader=tlio.dcp.Reader(f"{dir}/ignored"), checkpoint_id=f"{dir}/titan/step-1")
    latest = tlio.dcp.Reader(f"{dir}/run")
    out["latest"] = loaded(storage_reader=latest)
    out["latest_path"] = latest.path
    report(out)


class FailingWriter(tlio.dcp.Writer):
    """A tlio writer whose write_data raises on rank 1."""

    def write_data(self, plan, planner):
        if dist.get_rank() == 1:
            raise OSError("rank 1's disk is gone")
        return super().write_data(plan, planner)


def attempt(fn):
    try:
        fn()
        return ["ok", ""]
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException
        return [type(e).__name__, str(e)]


def faults(dir):
    out = {}
    net, opt = shard.build("fsdp", 0)
    shard.train(net, opt, 1)
    sd = state(net, opt)
    out["failed"] = attempt(lambda: dcp.save(sd, storage_writer=FailingWriter(f"{dir}/run", step=1)))
    dist.barrier()
    out["after_failure"] = sorted(os.listdir(f"{dir}/run"))
    # Nothing was committed; the next save of this thread removes what the failed one
    # left and saves the same step at once.
    dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/run", step=1))
    out["after_retry"] = sorted(os.listdir(f"{dir}/run"))
    out["second_writer"] = attempt(lambda: dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/run", step=1)))
    dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/titan/step-1"))
    out["second_named"] = attempt(lambda: dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/titan/step-1")))
    dist.barrier()
    out["after_refusal"] = sorted(os.listdir(f"{dir}/run"))
    out["saved"] = shard.digests(net, opt)
    out["loaded"] = loaded(storage_reader=tlio.dcp.Reader(f"{dir}/run"))["digests"]
    report(out)


def main():
    global REPORT
    mode, REPORT = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    try:
        {"save": save, "faults": faults}[mode](*sys.argv[3:])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
