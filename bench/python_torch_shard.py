#!/usr/bin/env python3
"""Sharded tlio.torch.save/load against torch's distributed checkpoint (DCP) under
torchrun with gloo on this machine's CPUs, side by side in one run.

The state is GPT-2 small's (bench/python_torch.py's model: 124M F32 parameters, the
embedding tied with the head) under FSDP2 (``fully_shard`` of every block, then of the
model) with AdamW after one step: every parameter and both moments sharded on dim 0,
about 1.5 GB in all, built on the meta device and materialized shard by shard (no rank
ever holds the whole model). Each measurement is one torchrun launch of its own (fresh
processes: the peak RSS is the job's), which builds and shards the state first
(untimed); the jobs alternate run after run and the figures are medians.

  save      4 ranks: ``tlio.torch.save`` (every rank writes its shards, hashing them;
            rank 0 commits) against ``dcp.save`` of the model's and the optimizer's
            state dicts (``get_state_dict``), both into a fresh directory;
  load      4 ranks, from the page cache: ``tlio.torch.load`` (every piece it uses
            verified) against ``dcp.load`` + ``set_state_dict``;
  reshard   the 4-rank checkpoints loaded by 2 ranks (FSDP2 over 2): the same two;
  export    ``tlio ckpt export`` of the 4-rank step into a model directory: its time
            and the CLI's peak resident set (goal: at most 256 MiB).

A job's time is the slowest rank's, between two barriers; its memory the largest
``VmHWM`` of its ranks (building the state included), their sum, and the most any rank's
peak grew during the job itself.

    python bench/python_torch_shard.py [--runs 3] [--dir DIR] [--only save|load|reshard|export]

Never a timed test: the numbers go to docs/python.md, nothing asserts on them.
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import peak_rss  # noqa: E402
from python_torch import build  # noqa: E402

JOBS = {
    "save": (4, ["tlio.torch.save (sharded)", "dcp.save"]),
    "load": (4, ["tlio.torch.load (sharded)", "dcp.load + set_state_dict"]),
    "reshard": (2, ["tlio.torch.load 4 -> 2 ranks", "dcp.load 4 -> 2 ranks"]),
}


def shard_state(step=True):
    """GPT-2 small under FSDP2 over every rank and its AdamW (after one step when ``step``)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):  # no rank ever holds the whole model
        model, _ = build(step=False)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().copy_(torch.randn(p.to_local().shape, generator=g) * 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if step:
        for p in model.parameters():
            p.grad = torch.distributed.tensor.DTensor.from_local(
                torch.randn(p.to_local().shape, generator=g) * 1e-3, p.device_mesh, p.placements,
                shape=p.shape, stride=p.stride())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def child(group, index, dir):
    """One job in this torchrun worker; rank 0 prints its JSON record."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import tlio.torch as tt

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    name = JOBS[group][1][int(index)]
    model, opt = shard_state(step=group == "save")
    dist.barrier()
    before = peak_rss()
    t0 = time.perf_counter()
    if group == "save" and name.startswith("tlio"):
        tt.save(os.path.join(dir, "tlio-new"), 1, model, opt)
    elif group == "save":
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(dir, "dcp-new"))
    elif name.startswith("tlio"):
        tt.load(os.path.join(dir, "tlio"), model, opt)
    else:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=os.path.join(dir, "dcp"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = time.perf_counter() - t0
    dist.barrier()
    records = [None] * dist.get_world_size()
    dist.all_gather_object(records, {"s": mine, "rss": peak_rss(), "before": before})
    if dist.get_rank() == 0:
        print(json.dumps({"s": max(r["s"] for r in records), "rss": max(r["rss"] for r in records),
                          "rss_sum": sum(r["rss"] for r in records),
                          "added": max(r["rss"] - r["before"] for r in records)}))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(group, index, dir):
    nproc = JOBS[group][0]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                        os.path.abspath(__file__), "--child", group, str(index), dir],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        # The ranks' own words, not only torchrun's exit status.
        raise SystemExit(f"{group} launch {index} failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def export_figures(dir, runs):
    """`tlio ckpt export` of the 4-rank tlio step into a Hugging Face model directory:
    the CLI's time and peak resident set (measured by a child Python whose only child
    is the export, so its RUSAGE_CHILDREN peak is the CLI's)."""
    tlio = os.path.join(os.path.dirname(HERE), "target", "release", "tlio")
    step = os.path.join(dir, "tlio", "step-000001")
    measure = ("import resource, subprocess, sys, time\n"
               "t = time.perf_counter(); subprocess.run(sys.argv[1:], check=True, capture_output=True)\n"
               "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    times, peaks = [], []
    for _ in range(runs):
        out = os.path.join(dir, "exported")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["sync"], check=True)
        r = subprocess.run([sys.executable, "-c", measure, tlio, "ckpt", "export", step, "-o", out],
                           check=True, capture_output=True, text=True)
        s, kib = r.stdout.split()
        times.append(float(s))
        peaks.append(int(kib) * 1024)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"-- export (the 4-rank step -> a model directory, {size / 1e6:.0f} MB written)")
    print(f"{'tlio ckpt export':<36} {statistics.median(times):>9.3f} {'':>7} "
          f"{statistics.median(peaks) / (1 << 20):>18.0f}")


def main():
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--child", nargs=3)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    dir = tempfile.mkdtemp(prefix="tlio-shard-bench-", dir=args.dir)
    try:
        # The checkpoints the loads read: one save of each, by 4 ranks.
        for i, kind in enumerate(("tlio", "dcp")):
            launch("save", i, dir)
            os.rename(os.path.join(dir, f"{kind}-new"), os.path.join(dir, kind))
        results = {}
        groups = [g for g in JOBS if not args.only or args.only in g]
        for run in range(args.runs):
            for group in groups:
                order = [0, 1] if run % 2 == 0 else [1, 0]
                for i in order:
                    for kind in ("tlio-new", "dcp-new"):
                        shutil.rmtree(os.path.join(dir, kind), ignore_errors=True)
                    subprocess.run(["sync"], check=True)
                    results.setdefault((group, i), []).append(launch(group, i, dir))
        print(f"{'job':<36} {'median s':>9} {'ratio':>7} {'peak RSS/rank MiB':>18} {'sum MiB':>8} {'job adds MiB':>13}")
        for group in groups:
            print(f"-- {group} ({JOBS[group][0]} ranks)")
            ref = statistics.median(r["s"] for r in results[(group, 1)])
            for i, name in enumerate(JOBS[group][1]):
                rs = results[(group, i)]
                s = statistics.median(r["s"] for r in rs)
                rss = statistics.median(r["rss"] for r in rs) / (1 << 20)
                total = statistics.median(r["rss_sum"] for r in rs) / (1 << 20)
                added = statistics.median(r["added"] for r in rs) / (1 << 20)
                print(f"{name:<36} {s:>9.3f} {s / ref:>7.2f} {rss:>18.0f} {total:>8.0f} {added:>13.0f}")
        if not args.only or args.only in "export":
            export_figures(dir, args.runs)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(dir, ignore_errors=True)


if __name__ == "__main__":
    main()
