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
  layouts4 DIR  4 ranks: the net trained under FSDP2 and FSDP x TP (a 2x2 mesh), each
             state saved by FileSystemWriter to DIR/fs/<name> and through tlio.dcp.Writer
             to DIR/tlio/<name>; each loaded back at its layout by both readers, and the
             FSDP2 steps loaded into FSDP x TP
  full_disk DIR BIG  2 ranks, DIR/tlio and DIR/fs each a small tmpfs: step 1 of the
             net saved to both (tlio run directory, FileSystemWriter step-1), then step 2
             with a DTensor of BIG float32 per rank more than the tmpfs holds: each rank's
             exception, the directories and free bytes after it, what loads after it, and
             whether a small save succeeds after it
  reshard2 DIR  2 ranks: the net trained under tensor parallel, saved and loaded as in
             layouts4; the 4-rank steps of layouts4 loaded by both readers into FSDP2 and
             tensor parallel at 2 ranks (4 -> 2, FSDP2 -> TP, FSDP x TP -> TP and FSDP2)
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


#: The MLP width of the layouts4 and reshard2 nets: even, as torch's tensor parallel
#: training needs (the default net's odd 25 fails in its sharded matmul under FSDP x TP).
EVEN_HIDDEN = 4 * shard.DIM
#: The MLP width of this process's nets.
HIDDEN = 3 * shard.DIM + 1


def fresh(layout="fsdp", mesh_shape=None):
    """A net of other values whose optimizer has state to be overwritten by a load."""
    net, opt = shard.build(layout, 7, mesh_shape, HIDDEN) if dist.is_initialized() else plain_net(7)
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


def loaded(layout="fsdp", mesh_shape=None, **kw) -> dict:
    net, opt = fresh(layout, mesh_shape)
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


def both_readers(dir, name, layout, mesh_shape=None) -> dict:
    """The step DIR/*/name loaded into ``layout`` by FileSystemReader and by tlio.dcp.Reader."""
    return {"fs": loaded(layout, mesh_shape, storage_reader=dcp.FileSystemReader(f"{dir}/fs/{name}")),
            "tlio": loaded(layout, mesh_shape, storage_reader=tlio.dcp.Reader(f"{dir}/tlio/{name}"))}


def save_both(dir, name, layout, mesh_shape=None) -> dict:
    """The net trained in ``layout``, its state saved by FileSystemWriter to DIR/fs/name and
    through tlio.dcp.Writer to DIR/tlio/name: {saved: digests, same layout: both loads}."""
    net, opt = shard.build(layout, 0, mesh_shape, HIDDEN)
    shard.train(net, opt, 2)
    sd = state(net, opt)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{dir}/fs/{name}", sync_files=True))
    dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/tlio/{name}"))
    return {"saved": shard.digests(net, opt), "same": both_readers(dir, name, layout, mesh_shape)}


def layouts4(dir):
    global HIDDEN
    HIDDEN = EVEN_HIDDEN
    report({"fsdp4": save_both(dir, "fsdp4", "fsdp"),
            "fsdp_tp4": save_both(dir, "fsdp_tp4", "fsdp_tp", (2, 2)),
            "fsdp4_to_fsdp_tp4": both_readers(dir, "fsdp4", "fsdp_tp", (2, 2))})


def reshard2(dir):
    global HIDDEN
    HIDDEN = EVEN_HIDDEN
    report({"tp2": save_both(dir, "tp2", "tp"),
            "fsdp4_to_fsdp2": both_readers(dir, "fsdp4", "fsdp"),
            "fsdp4_to_tp2": both_readers(dir, "fsdp4", "tp"),
            "fsdp_tp4_to_tp2": both_readers(dir, "fsdp_tp4", "tp"),
            "fsdp_tp4_to_fsdp2": both_readers(dir, "fsdp_tp4", "fsdp")})


def _failure(fn) -> dict:
    """What ``fn`` raised: its class, and for DCP's CheckpointException each failed rank's
    exception (class, errno)."""
    try:
        fn()
        return {"raised": None}
    except CheckpointException as e:
        return {"raised": "CheckpointException",
                "failures": {str(r): [type(exc).__name__, getattr(exc, "errno", None), str(exc)]
                             for r, (exc, _) in sorted(e.failures.items())}}
    except Exception as e:
        return {"raised": type(e).__name__, "errno": getattr(e, "errno", None), "message": str(e)}


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def full_disk(dir, big):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    out = {}
    net, opt = shard.build("fsdp", 0)
    shard.train(net, opt, 1)
    sd = state(net, opt)
    dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/tlio", step=1))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{dir}/fs/step-1", sync_files=True))
    out["saved1"] = shard.digests(net, opt)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    big_sd = {**sd, "big": DTensor.from_local(torch.ones(int(big)), mesh, [Shard(0)])}
    for name, make in (("tlio", lambda: tlio.dcp.Writer(f"{dir}/tlio", step=2)),
                       ("fs", lambda: dcp.FileSystemWriter(f"{dir}/fs/step-2", sync_files=True))):
        writer = make()
        out[name] = _failure(lambda: dcp.save(big_sd, storage_writer=writer))
        dist.barrier()
        if name == "tlio":
            writer.abort()  # what the next save, a reset or collecting the writer does
            dist.barrier()
        out[f"{name}_listing"] = sorted(os.listdir(f"{dir}/{name}"))
        if name == "fs":
            out["fs_step2"] = sorted(os.listdir(f"{dir}/fs/step-2"))
        out[f"{name}_free"] = _free(f"{dir}/{name}")
        dist.barrier()
    out["tlio_loaded"] = loaded(storage_reader=tlio.dcp.Reader(f"{dir}/tlio"))
    out["fs_loaded"] = loaded(storage_reader=dcp.FileSystemReader(f"{dir}/fs/step-1"))
    out["fs_step2_load"] = _failure(lambda: loaded(storage_reader=dcp.FileSystemReader(f"{dir}/fs/step-2")))
    # The disk the failed save filled is usable again: the same state without the big
    # tensor saves as step 2 (with FileSystemWriter, its partial files stay and fill it).
    out["tlio_retry"] = _failure(lambda: dcp.save(sd, storage_writer=tlio.dcp.Writer(f"{dir}/tlio", step=2)))
    out["fs_retry"] = _failure(lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{dir}/fs/step-3",
                                                                                         sync_files=True)))
    dist.barrier()
    out["tlio_after_retry"] = sorted(os.listdir(f"{dir}/tlio"))
    report(out)


def main():
    global REPORT
    mode, REPORT = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    try:
        {"save": save, "faults": faults, "layouts4": layouts4, "full_disk": full_disk, "reshard2": reshard2}[mode](*sys.argv[3:])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
