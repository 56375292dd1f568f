"""Rank processes of test_torch_async.py's 2-rank test, started by torchrun (gloo on CPU).
Each rank writes what it saw as JSON to REPORT.<rank>.

  ranks REPORT DIR   for the FSDP2 net (sharded save) and for the plain net every rank
                     holds whole (the DDP path, rank 0 writes): the same step saved
                     blocking into DIR/<kind>-blocking and with blocking=False into
                     DIR/<kind>-async; then an async save held by rank 0 holding the
                     directory's lock while every rank trains on (the loop's own
                     collectives run meanwhile) into DIR/<kind>-held; then an async save
                     into a directory under a regular file, whose error every rank's
                     wait() raises; then a save that works again
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import tlio.torch as tt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _torch_shard_child import build, digests, train  # noqa: E402

torch.set_num_threads(1)


def attempt(fn):
    try:
        return ["ok", fn()]
    except Exception as e:
        return [type(e).__name__, str(e)]


def plain(seed):
    from _torch_shard_child import Net

    torch.manual_seed(seed)
    net = Net()
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)


def plain_train(net, opt):
    """A DDP step in effect: every rank computes the same gradients, averaged by all_reduce
    on the default group (the training loop's collectives)."""
    train(net, opt, 1)
    for p in net.parameters():
        t = p.detach().clone()
        dist.all_reduce(t)
        with torch.no_grad():
            p.copy_(t / dist.get_world_size())


def ranks(dir):
    rank = dist.get_rank()
    out = {}
    for kind in ("fsdp", "plain"):
        net, opt = build("fsdp", 0) if kind == "fsdp" else plain(0)
        step_fn = (lambda: train(net, opt, 1)) if kind == "fsdp" else (lambda: plain_train(net, opt))
        step_fn()
        kw = dict(extra={"tokens_seen": 12}, config={"kind": kind}, keep=2)
        out[f"{kind}_blocking"] = tt.save(os.path.join(dir, f"{kind}-blocking"), 1, net, opt, **kw)
        p = tt.save(os.path.join(dir, f"{kind}-async"), 1, net, opt, blocking=False, **kw)
        out[f"{kind}_async_type"] = type(p).__name__
        out[f"{kind}_async"] = p.wait()
        out[f"{kind}_saved"] = digests(net, opt)

        # Held: the background commit cannot finish while rank 0 holds the lock (rank 0's
        # core waits for it), yet the loop trains on, its collectives included.
        held = os.path.join(dir, f"{kind}-held")
        lock = None
        if rank == 0:
            os.makedirs(held, exist_ok=True)
            lock = open(os.path.join(held, ".lock"), "a+")
            fcntl.flock(lock, fcntl.LOCK_EX)
        dist.barrier()
        p = tt.save(held, 1, net, opt, blocking=False, **kw)
        for _ in range(3):
            step_fn()
        dist.barrier()
        out[f"{kind}_held_done_while_held"] = p.done()
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        out[f"{kind}_held"] = p.wait()

        # A background failure (the directory cannot be made under a file): every rank's
        # wait raises it; then a save works again.
        bad = os.path.join(dir, "file")
        if rank == 0:
            with open(bad, "w") as f:
                f.write("not a directory")
        dist.barrier()
        p = tt.save(os.path.join(bad, kind), 2, net, opt, blocking=False)
        out[f"{kind}_failed"] = attempt(p.wait)
        out[f"{kind}_again"] = attempt(
            lambda: tt.save(os.path.join(dir, f"{kind}-async"), 2, net, opt, blocking=False).wait())
    with open(f"{REPORT}.{rank}", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    mode, REPORT, *args = sys.argv[1:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        {"ranks": ranks}[mode](*args)
        dist.monitored_barrier(timeout=timedelta(seconds=60))
    finally:
        dist.destroy_process_group()
