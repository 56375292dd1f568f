"""Rank processes of test_torch_dist.py, started by torchrun (gloo on CPU). Each rank
writes what it saw as JSON to REPORT.<rank> (the first argument; stdout would interleave
the ranks); the test compares the ranks.

  protocol DIR SHARD   the collective save/load protocol step by step: nothing to load,
                       a save, a refused overwrite on rank 0, ranks passing different
                       steps, a save with a stream, a load into rank-dependent models,
                       a load that fails on rank 1 only
  save DIR STEP        every rank saves STEP of the fixed small model (FAILPOINTS from
                       the environment fire on rank 0, the only writer)
  load DIR             every rank loads and reports the step and the model's digest
"""

import json
from datetime import timedelta
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import _torch_child as child  # noqa: E402

import tlio.torch as tt  # noqa: E402
from tlio.pcg import PCG32  # noqa: E402
from tlio.tokens import TokenStream  # noqa: E402

torch.set_num_threads(1)


REPORT = ""


def report(out):
    with open(f"{REPORT}.{dist.get_rank()}", "w") as f:
        json.dump(out, f)


def attempt(fn):
    """(exception type name, message) of what ``fn`` raised, or ("ok", its result)."""
    try:
        return ["ok", fn()]
    except Exception as e:
        return [type(e).__name__, str(e)]


def model_digest(model):
    return child.digest(model, torch.optim.SGD(model.parameters(), lr=0.1))


def protocol(dir, shard):
    rank = dist.get_rank()
    out = {"rank": rank, "world": dist.get_world_size()}
    model, opt = child.fresh(0)
    out["empty"] = attempt(lambda: tt.load(dir, model, opt).step)
    out["save1"] = attempt(lambda: tt.save(dir, 1, model, opt))
    # Only rank 0 writes, so only rank 0 can meet the refusal; every rank must raise it.
    out["again"] = attempt(lambda: tt.save(dir, 1, model, opt))
    out["drift"] = attempt(lambda: tt.save(dir, 2 + rank, model, opt))
    # Rank 0's state is what is written: train rank 0's model a step further than the others.
    if rank == 0:
        model(torch.arange(child.SEQ).view(1, -1)).sum().backward()
        opt.step()
    stream = TokenStream([shard], child.SEQ, child.BATCH, PCG32(3), rank=None, world_size=None)
    stream.next_batch()
    out["stream"] = [stream.rank, stream.world_size, stream.cursor()]
    out["save2"] = attempt(lambda: tt.save(dir, 2, model, opt, stream))
    out["saved_digest"] = child.digest(model, opt)
    fresh_model, fresh_opt = child.fresh(10 + rank)
    fresh_stream = TokenStream([shard], child.SEQ, child.BATCH, PCG32(99), rank=None, world_size=None)
    out["load"] = attempt(lambda: tt.load(dir, fresh_model, fresh_opt, fresh_stream).step)
    out["loaded_digest"] = child.digest(fresh_model, fresh_opt)
    out["loaded_cursor"] = fresh_stream.cursor()
    out["step1"] = attempt(lambda: tt.load(dir, fresh_model, fresh_opt, step=1).step)
    # A load that fails on rank 1 alone (an optimizer of another class) fails everywhere,
    # and changes nothing anywhere: every rank checks before any applies.
    before = child.digest(fresh_model, fresh_opt)
    other = torch.optim.SGD(fresh_model.parameters(), lr=0.1) if rank == 1 else fresh_opt
    out["rank1_fails"] = attempt(lambda: tt.load(dir, fresh_model, other).step)
    out["unchanged_after_rank1_fails"] = child.digest(fresh_model, fresh_opt) == before
    # The same with a model that does not match on rank 1 (DDP replicas built wrongly).
    mismatched = torch.nn.Linear(3, 2) if rank == 1 else fresh_model
    out["rank1_mismatch"] = attempt(lambda: tt.load(dir, mismatched).step)
    out["unchanged_after_rank1_mismatch"] = child.digest(fresh_model, fresh_opt) == before
    report(out)


def save(dir, step):
    model, opt = child.fresh(step)
    model(torch.arange(child.SEQ).view(1, -1)).sum().backward()
    opt.step()
    report({"rank": dist.get_rank(), "path": tt.save(dir, step, model, opt)})


def load(dir):
    model, opt = child.fresh(50 + dist.get_rank())
    step = tt.load(dir, model, opt).step
    report({"rank": dist.get_rank(), "step": step, "digest": child.digest(model, opt)})


if __name__ == "__main__":
    mode, REPORT, *args = sys.argv[1:]
    dist.init_process_group("gloo")
    try:
        if mode == "protocol":
            protocol(args[0], args[1])
        elif mode == "save":
            save(args[0], int(args[1]))
        else:
            load(args[0])
        # Every rank done before the group is torn down: a rank destroying it while the
        # other still talked to it made gloo abort ("terminate called without an active
        # exception") in runs that had succeeded. Not in `finally`: a rank that failed
        # must not wait for one that is gone, and the timeout bounds a wait for a rank
        # that died (rank 0 under a failpoint).
        dist.monitored_barrier(timeout=timedelta(seconds=60))
    finally:
        dist.destroy_process_group()
