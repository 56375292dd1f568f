#!/usr/bin/env python3
"""tlio.safetensors.torch (the drop-in) against safetensors.torch, side by side in one run.

Each job runs in a fresh process (its peak RSS is its own), the jobs of a group
alternate run after run, and the figures are medians. The input is a 1 GiB F32 file
of 256 tensors of 1024 x 1024, written once by the package and read warm from the
page cache. Jobs, each against the package's function of the same name:

- ``load_file`` (then every tensor is summed, so the data is really read);
- ``safe_open(framework="pt")`` + ``get_tensor`` of every tensor (summed too);
- ``get_slice(name)[i]``: one row of each tensor;
- ``save_file`` of 1 GiB (neither writer fsyncs).

    python bench/python_st_dropin.py [--runs 5] [--dir DIR] [--only TITLE]

Never a timed test: the numbers go to docs/python.md, nothing asserts on them.
"""

import json
import os
import tempfile
import time

from _harness import parse_args, peak_rss, print_table, run_child

TENSORS = 256
ROWS = COLS = 1024  # 256 x 4 MiB = 1 GiB


def make_tensors():
    import torch

    base = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)
    return {f"layer.{i:03d}.weight": base + i for i in range(TENSORS)}


def _modules(name):
    if name.endswith("_tlio"):
        import tlio.safetensors as top
        import tlio.safetensors.torch as pt
    else:
        import safetensors as top
        import safetensors.torch as pt
    return top, pt


def job(name, path, out):
    """One measurement in this process: returns seconds."""
    top, pt = _modules(name)
    if name.startswith("save"):
        tensors = make_tensors()
        t0 = time.perf_counter()
        pt.save_file(tensors, out, metadata={"format": "pt"})
        dt = time.perf_counter() - t0
        os.unlink(out)
        return dt
    t0 = time.perf_counter()
    total = 0.0
    if name.startswith("load_file"):
        got = pt.load_file(path)
        total = sum(float(t.sum()) for t in got.values())
    elif name.startswith("get_tensor"):
        with top.safe_open(path, framework="pt") as f:
            total = sum(float(f.get_tensor(k).sum()) for k in f.keys())
    elif name.startswith("get_slice"):
        with top.safe_open(path, framework="pt") as f:
            rows = [f.get_slice(k)[7] for k in f.keys()]
        total = sum(float(r.sum()) for r in rows)
    else:
        raise SystemExit(f"unknown job {name}")
    dt = time.perf_counter() - t0
    assert total > 0
    return dt


def child(name, path, out):
    dt = job(name, path, out)
    print(json.dumps({"job": name, "s": dt, "rss": peak_rss()}))


GROUPS = [
    ("load_file, then sum every tensor", ["load_file_tlio", "load_file_lib"]),
    ('safe_open(framework="pt") + get_tensor of every tensor, summed', ["get_tensor_tlio", "get_tensor_lib"]),
    ("get_slice(name)[7] of every tensor", ["get_slice_tlio", "get_slice_lib"]),
    ("save_file 1 GiB", ["save_tlio", "save_lib"]),
]


def main():
    args = parse_args(child)
    if args is None:
        return
    d = args.dir or tempfile.mkdtemp(prefix="tlio-bench-")
    path = os.path.join(d, "bench_pt.safetensors")
    out = os.path.join(d, "bench_pt_out.safetensors")
    if not os.path.exists(path):
        import safetensors.torch

        safetensors.torch.save_file(make_tensors(), path, metadata={"format": "pt"})
    with open(path, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    print(f"file: {os.path.getsize(path)} bytes, {TENSORS} F32 tensors; {args.runs} alternating runs; "
          f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    results = {}
    groups = [g for g in GROUPS if args.only is None or args.only in g[0]]
    for run in range(args.runs):
        for _, jobs in groups:
            k = run % len(jobs)
            for j in jobs[k:] + jobs[:k]:
                results.setdefault(j, []).append(run_child(__file__, j, path, out))
                os.sync()
    print_table(groups, results, places=4)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
