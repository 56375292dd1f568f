#!/usr/bin/env python3
"""The cost of ``keep`` in a save: ``tlio.checkpoint.save_checkpoint`` of a model of
``--mb`` MB (F32) step after step with ``keep=K``, as a training loop saving every few
minutes does. Once K steps exist, every save must decide which older steps still count
toward K; a save that re-verified them would read and hash K-1 older steps each time.

Reports, for the saves made once K steps exist, the median seconds per save and the bytes
the process read during each save (the kernel's ``rchar``: reads of the older steps show
up there; the save's own writes do not), beside the same loop with ``keep=None``.

    python bench/ckpt_keep.py [--mb 256] [--keep 8] [--saves 16] [--dir DIR]

Run it with the build to measure (for a before/after, once with each). Never a timed
test: the numbers go to docs/checkpoints.md, nothing asserts on them.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from tlio.checkpoint import save_checkpoint


def bytes_read() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def loop(dir: str, model: dict, keep, saves: int, full_from: int):
    times, reads = [], []
    for step in range(1, saves + 1):
        model["w"][0] = step  # each step's bytes differ
        r0, t0 = bytes_read(), time.perf_counter()
        save_checkpoint(dir, model, None, step, None, {}, keep)
        dt, read = time.perf_counter() - t0, bytes_read() - r0
        if step > full_from:
            times.append(dt)
            reads.append(read)
    return statistics.median(times), statistics.median(reads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--keep", type=int, default=8)
    p.add_argument("--saves", type=int, default=16)
    p.add_argument("--dir")
    a = p.parse_args()
    base = a.dir or tempfile.mkdtemp(prefix="tlio-bench-keep-")
    model = {"w": np.random.default_rng(0).standard_normal(a.mb * (1 << 20) // 4, dtype=np.float32)}
    print(f"{a.mb} MB model, {a.saves} saves, load average {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} cores", flush=True)
    rows = []
    for keep in (None, a.keep):
        d = os.path.join(base, f"keep-{keep}")
        shutil.rmtree(d, ignore_errors=True)
        s, read = loop(d, model, keep, a.saves, a.keep)
        shutil.rmtree(d, ignore_errors=True)
        rows.append((keep, s, read))
        print(f"  keep={keep}: {s:.3f} s per save, {read / (1 << 20):.1f} MiB read per save", flush=True)
    (_, s0, _), (_, s1, r1) = rows
    print(f"keep={a.keep} costs {s1 - s0:+.3f} s per save over no keep; "
          f"reads {r1 / (a.mb << 20):.2f} model sizes per save")
    if not a.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
