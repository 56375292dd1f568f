#!/usr/bin/env python3
"""tlio.safetensors against the safetensors package, side by side in one run.

Each measurement runs in a fresh process (so its peak RSS is its own), the jobs
alternate (a, b, c, then b, c, a, ...) so that drift on a shared machine hits all of them,
and the figures are medians. The 1 GiB F32 file (256 tensors of 1 Mi floats) is written
once by the library and read from the page cache (warm) by every job.

    python bench/python_safetensors.py [--runs 5] [--dir DIR]

Never a timed test: the numbers go to docs/python.md, nothing asserts on them.
"""

import json
import os
import tempfile
import time

from _harness import peak_rss, print_table, run_child, parse_args

TENSORS = 256
ELEMS = 1 << 20  # 256 x 4 MiB = 1 GiB


def make_tensors():
    import numpy as np

    base = np.arange(ELEMS, dtype=np.float32)
    return {f"layer.{i:03d}.weight": base + i for i in range(TENSORS)}


def job(name, path, out):
    """One measurement in this process: returns seconds; the peak RSS is read after."""
    import numpy as np

    if name.startswith("save"):
        tensors = make_tensors()
        t0 = time.perf_counter()
        if name == "save_tlio_fast":
            from tlio.safetensors import save_safetensors

            save_safetensors(out, tensors, {"format": "pt"}, durable=False)
        elif name == "save_tlio_durable":
            from tlio.safetensors import save_safetensors

            save_safetensors(out, tensors, {"format": "pt"})
        else:
            import safetensors.numpy

            safetensors.numpy.save_file(tensors, out, metadata={"format": "pt"})
        dt = time.perf_counter() - t0
        os.unlink(out)
        return dt
    t0 = time.perf_counter()
    if name == "open_tlio":
        from tlio.safetensors import safe_open

        with safe_open(path) as f:
            got = {k: f.get_tensor(k) for k in f.keys()}
    elif name == "open_lib":
        import safetensors

        with safetensors.safe_open(path, framework="np") as f:
            got = {k: f.get_tensor(k) for k in f.keys()}
    elif name.startswith("load_tlio"):
        import tlio.safetensors as ts

        got, _ = ts.load_safetensors(path)
    elif name.startswith("load_lib"):
        import safetensors.numpy

        got = safetensors.numpy.load_file(path)
    else:
        raise SystemExit(f"unknown job {name}")
    if name.endswith("+sum"):
        for a in got.values():
            a += 1  # touch and write every page, as a training step would
    dt = time.perf_counter() - t0
    assert len(got) == TENSORS
    return dt


def child(name, path, out):
    dt = job(name, path, out)
    rss = peak_rss()
    print(json.dumps({"job": name, "s": dt, "rss": rss}))


GROUPS = [
    ("safe_open().get_tensor, every tensor", ["open_tlio", "open_lib"]),
    ("load", ["load_tlio", "load_lib"]),
    ("load, then write every element", ["load_tlio+sum", "load_lib+sum"]),
    ("save 1 GiB", ["save_tlio_fast", "save_tlio_durable", "save_lib"]),
]


def main():
    args = parse_args(child)
    if args is None:
        return
    d = args.dir or tempfile.mkdtemp(prefix="tlio-bench-")
    path = os.path.join(d, "bench_f32.safetensors")
    out = os.path.join(d, "bench_out.safetensors")
    if not os.path.exists(path):
        import safetensors.numpy

        safetensors.numpy.save_file(make_tensors(), path, metadata={"format": "pt"})
    with open(path, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    print(f"file: {os.path.getsize(path)} bytes, {TENSORS} F32 tensors; {args.runs} alternating runs; "
          f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    results = {}
    groups = [g for g in GROUPS if args.only is None or args.only in g[0]]
    for run in range(args.runs):
        for _, jobs in groups:
            # Each run starts the group at another job, so that no job always runs
            # first (the first large write after a pause is often the slow one).
            k = run % len(jobs)
            for j in jobs[k:] + jobs[:k]:
                rec = run_child(__file__, j, path, out)
                results.setdefault(j, []).append(rec)
                os.sync()  # a save's dirty pages must not be written back during the next job
    print_table(groups, results, places=4)


if __name__ == "__main__":
    main()
