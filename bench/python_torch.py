#!/usr/bin/env python3
"""tlio.torch.save/load against torch.save(+fsync), torch.load(mmap=True) and torch's
distributed checkpoint, side by side in one run.

The state is GPT-2 small's: 124M F32 parameters (a 50257x768 embedding tied with the
head, 1024x768 positions, 12 blocks of the real shapes) and AdamW's two moments after
one step, about 1.5 GB. Each measurement runs in a fresh process that builds the state
first (untimed), so its peak RSS is its own; the jobs alternate (a, b, c, then b, c, a,
...) so drift on a shared machine hits all of them; the figures are medians.

Saves: ``tlio.torch.save`` (atomic step, sha256 of every file, fsyncs, LATEST),
``torch.save`` of {model, optimizer} state dicts then ``os.fsync`` of the file (the
durable equivalent, no checksum), ``torch.distributed.checkpoint.save`` on one process.
Loads (from the page cache): ``tlio.torch.load`` (verifies every checksum) into a fresh
model and AdamW, vs ``torch.load(mmap=True)`` + ``load_state_dict`` of both.

    python bench/python_torch.py [--runs 5] [--dir DIR] [--only save|load]

Never a timed test: the numbers go to docs/python.md, nothing asserts on them.
"""

import json
import os
import shutil
import tempfile
import time

import _harness
from _harness import peak_rss, print_table, parse_args

VOCAB, CTX, D, LAYERS = 50257, 1024, 768, 12


def build(step=True):
    """GPT-2 small and an AdamW that took one step (moments filled), deterministic."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(D)
            self.c_attn = nn.Linear(D, 3 * D)
            self.attn_proj = nn.Linear(D, D)
            self.ln_2 = nn.LayerNorm(D)
            self.c_fc = nn.Linear(D, 4 * D)
            self.mlp_proj = nn.Linear(4 * D, D)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(VOCAB, D)
            self.wpe = nn.Embedding(CTX, D)
            self.h = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(D)
            self.lm_head = nn.Linear(D, VOCAB, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT-2's

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if step:
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g) * 1e-3
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def torch_state(model, opt):
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def job(name, src, out):
    """One measurement in this process: returns seconds; the peak RSS is read after."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if name.startswith("save") or name == "prepare":
        model, opt = build()
        t0 = time.perf_counter()
        if name in ("save_tlio", "prepare"):
            import tlio.torch

            tlio.torch.save(out if name != "prepare" else os.path.join(src, "tlio"), 1, model, opt)
        if name in ("save_torch+fsync", "prepare"):
            path = out if name != "prepare" else os.path.join(src, "torch.pt")
            with open(path, "wb") as f:
                torch.save(torch_state(model, opt), f)
                f.flush()
                os.fsync(f.fileno())
        if name in ("save_dcp", "prepare"):
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict

            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optimizer": osd},
                     checkpoint_id=out if name != "prepare" else os.path.join(src, "dcp"))
        return time.perf_counter() - t0
    model, opt = build(step=False)
    t0 = time.perf_counter()
    if name == "load_tlio":
        import tlio.torch

        tlio.torch.load(os.path.join(src, "tlio"), model, opt)
    elif name == "load_torch_mmap":
        sd = torch.load(os.path.join(src, "torch.pt"), mmap=True, weights_only=True)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optimizer"])
    elif name == "load_dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        # dcp loads in place: the optimizer needs its state allocated first (torchtitan's way).
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optimizer": osd}
        dcp.load(sd, checkpoint_id=os.path.join(src, "dcp"))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
    else:
        raise SystemExit(f"unknown job {name}")
    dt = time.perf_counter() - t0
    assert len(opt.state) == len(list(model.parameters()))
    return dt


def child(name, src, out):
    dt = job(name, src, out)
    print(json.dumps({"job": name, "s": dt, "rss": peak_rss()}))


GROUPS = [
    ("save GPT-2 small + AdamW (durable)", ["save_tlio", "save_dcp", "save_torch+fsync"]),
    ("load into a fresh model + AdamW", ["load_tlio", "load_dcp", "load_torch_mmap"]),
]


def run_child(name, src, out):
    return _harness.run_child(__file__, name, src, out)


def warm(path):
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                while fh.read(64 << 20):
                    pass


def main():
    args = parse_args(child)
    if args is None:
        return
    d = args.dir or tempfile.mkdtemp(prefix="tlio-bench-torch-")
    src = os.path.join(d, "src")
    if not os.path.isdir(src):
        os.makedirs(src)
        run_child("prepare", src, "-")
    warm(src)
    sizes = {k: sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(src, k)) for f in fs)
             if os.path.isdir(os.path.join(src, k)) else os.path.getsize(os.path.join(src, k))
             for k in ("tlio", "torch.pt", "dcp")}
    print(f"state on disk: {sizes} bytes; {args.runs} alternating runs; "
          f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    results = {}
    groups = [g for g in GROUPS if args.only is None or args.only in g[0]]
    for run in range(args.runs):
        for _, jobs in groups:
            k = run % len(jobs)
            for j in jobs[k:] + jobs[:k]:
                out = os.path.join(d, "out")
                rec = run_child(j, src, out)
                rec["load"] = os.getloadavg()[0]
                results.setdefault(j, []).append(rec)
                if os.path.isdir(out):
                    shutil.rmtree(out)
                elif os.path.exists(out):
                    os.unlink(out)
                os.sync()  # a save's dirty pages must not be written back during the next job
                print(f"  run {run} {j}: {rec['s']:.3f} s, load {rec['load']:.2f}", flush=True)
    print_table(groups, results, places=3)


if __name__ == "__main__":
    main()
