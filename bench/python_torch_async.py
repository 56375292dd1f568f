#!/usr/bin/env python3
"""tlio.torch.save(blocking=False) against blocking=True and against no saves, in a
training loop, side by side in one run: one process, and 2 ranks under torchrun (FSDP2,
gloo, the sharded save).

The model is GPT-2 small's (bench/python_torch.py's: 124M F32 parameters, the embedding
tied with the head; at 2 ranks built on the meta device and sharded by ``fully_shard``
of every block and of the model, as bench/python_torch_shard.py does) with AdamW, about
1.5 GB of state. A forward pass (causal attention over the real shapes) and AdamW's step
on one short fixed batch make a training step. The loop runs ``--steps`` steps and saves
every ``--every`` steps with ``keep=1``, then waits for the last save: its time is that of
all its steps with every save durable. Each job is one fresh process (or torchrun
launch) that builds the state first, untimed; the jobs alternate run after run and the
figures are medians.

Per job: the loop's steps per second (durable saves included), the time ``save`` held
the loop (the first save, which at blocking=False also allocates the staging buffers,
and the median of the others, which reuse them), and the peak resident set (the largest
rank's at 2 ranks). torch computes on one thread per process; the background write
takes the machine's other cores.

    python bench/python_torch_async.py [--runs 2] [--steps 16] [--every 4] [--dir DIR] [--only 1|2]

Never a timed test: the numbers go to docs/python.md, nothing asserts on them.
"""

import argparse
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
from python_torch import CTX, D, VOCAB, build  # noqa: E402

MODES = ["async", "blocking", "none"]
HEADS, BATCH, SEQ = 12, 1, 32


def add_forward(model):
    """GPT-2's forward on bench/python_torch.py's modules (which define none): pre-LN
    causal self-attention and a GELU MLP per block, the tied head."""
    import torch
    import torch.nn.functional as F

    block_type = type(model.h[0])

    def block_forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    def gpt_forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    block_type.forward = block_forward
    type(model).forward = gpt_forward


def child(mode, steps, every, dir):
    """One job in this process (or torchrun worker); prints its JSON record (rank 0)."""
    import torch
    import torch.nn.functional as F

    import tlio.torch as tt

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist = None
    if world > 1:
        import torch.distributed as dist

        from python_torch_shard import shard_state

        dist.init_process_group("gloo")
        model, opt = shard_state(step=True)
    else:
        model, opt = build()
    add_forward(model)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    assert SEQ <= CTX and D % HEADS == 0

    def train_step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    train_step()  # the first step allocates what every later one reuses
    if dist is not None:
        dist.barrier()
    held, pending = [], None
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        train_step()
        if mode != "none" and step % every == 0:
            s0 = time.perf_counter()
            pending = tt.save(dir, step, model, opt, keep=1, blocking=mode == "blocking")
            held.append(time.perf_counter() - s0)
    w0 = time.perf_counter()
    if isinstance(pending, tt.PendingSave):
        pending.wait()
    last_wait = time.perf_counter() - w0
    total = time.perf_counter() - t0
    mine = {"s": total, "held": held, "last_wait": last_wait, "rss": peak_rss()}
    records = [mine]
    if dist is not None:
        records = [None] * world
        dist.all_gather_object(records, mine)
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({
            "s": max(r["s"] for r in records),
            "held": [max(r["held"][i] for r in records) for i in range(len(held))],
            "last_wait": max(r["last_wait"] for r in records),
            "rss": max(r["rss"] for r in records),
        }))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, mode, steps, every, dir):
    me = [os.path.abspath(__file__), "--child", mode, str(steps), str(every), dir]
    if world == 1:
        cmd = [sys.executable, *me]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *me]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--only", type=int, default=None, help="1 (one process) or 2 (ranks)")
    ap.add_argument("--child", nargs=4)
    args = ap.parse_args()
    if args.child:
        mode, steps, every, dir = args.child
        child(mode, int(steps), int(every), dir)
        return
    worlds = [w for w in (1, 2) if args.only in (None, w)]
    base = tempfile.mkdtemp(prefix="tlio-async-bench-", dir=args.dir)
    print(f"GPT-2 small + AdamW, {args.steps} steps, a save every {args.every} (keep=1); {args.runs} "
          f"alternating runs; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", flush=True)
    results = {}
    try:
        for run in range(args.runs):
            for world in worlds:
                k = run % len(MODES)
                for mode in MODES[k:] + MODES[:k]:
                    dir = os.path.join(base, "ckpt")
                    shutil.rmtree(dir, ignore_errors=True)
                    subprocess.run(["sync"], check=True)
                    rec = launch(world, mode, args.steps, args.every, dir)
                    results.setdefault((world, mode), []).append(rec)
                    print(f"  run {run} world {world} {mode}: {rec['s']:.2f} s, held "
                          f"{' '.join(f'{h:.3f}' for h in rec['held'])}, last wait {rec['last_wait']:.2f}, "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = statistics.median
    print(f"{'job':<28} {'steps/s':>8} {'vs none':>8} {'held: 1st s':>12} {'held: rest s':>13} "
          f"{'vs blocking':>12} {'peak RSS MiB':>13}")
    for world in worlds:
        print(f"-- {'one process' if world == 1 else f'{world} ranks, FSDP2 (sharded save)'}")
        none = med(args.steps / r["s"] for r in results[(world, "none")])
        blocking_rest = med(med(r["held"][1:]) for r in results[(world, "blocking")])
        for mode in MODES:
            rs = results[(world, mode)]
            sps = med(args.steps / r["s"] for r in rs)
            rss = med(r["rss"] for r in rs) / (1 << 20)
            if mode == "none":
                print(f"{'no saves':<28} {sps:>8.3f} {sps / none:>8.2f} {'':>12} {'':>13} {'':>12} {rss:>13.0f}")
                continue
            first = med(r["held"][0] for r in rs)
            rest = med(med(r["held"][1:]) for r in rs)
            name = f"save(blocking={mode == 'blocking'})"
            print(f"{name:<28} {sps:>8.3f} {sps / none:>8.2f} {first:>12.3f} {rest:>13.3f} "
                  f"{rest / blocking_rest:>12.3f} {rss:>13.0f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
