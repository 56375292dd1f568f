"""Child processes of test_torch_async.py, run as scripts so that FAILPOINTS (read at
import) applies to them alone and their memory and exit are their own.

  fail DIR      save step 2 of the small model with blocking=False while a failpoint holds
                the background write at its first fsync; remove step-000002.tmp meanwhile
                (the directory vanishes under the write); prints the error wait() raised
  keep DIR      save step 2 of the small model with blocking=False and keep=1 (FAILPOINTS
                holds its write); prints "staged", then the path wait() returns
  exit DIR      save step 1 with blocking=False and leave the interpreter at once, without
                wait(); prints whether the save was still in flight
  rss DIR N     N async saves of a model of a few MiB with AdamW, a training step between
                saves, each waited for; prints a JSON list of the resident set after each
"""

import json
import os
import shutil
import sys
import time

import torch

import tlio.torch as tt

torch.set_num_threads(1)


def small(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    return model, opt


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def fail(dir):
    model, opt = small(2)
    p = tt.save(dir, 2, model, opt, blocking=False)
    tmp = os.path.join(dir, "step-000002.tmp")
    deadline = time.monotonic() + 60
    # The failpoint holds the write at its first fsync, that of model.safetensors: once
    # the file is there, the directory goes away under the held write.
    while not os.path.exists(os.path.join(tmp, "model.safetensors")):
        assert time.monotonic() < deadline and not p.done(), "the write was never held"
        time.sleep(0.005)
    shutil.rmtree(tmp)
    print(f"done before wait: {p.done()}", flush=True)
    try:
        p.wait()
    except OSError as e:
        print(f"raised {type(e).__name__}: {e}", flush=True)


def keep_one(dir):
    model, opt = small(2)
    p = tt.save(dir, 2, model, opt, keep=1, blocking=False)
    print("staged", flush=True)
    print(p.wait(), flush=True)


def exit_at_once(dir):
    model, opt = small(1)
    p = tt.save(dir, 1, model, opt, blocking=False)
    print(f"in flight at exit: {not p.done()}", flush=True)


def rss_loop(dir, n):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 512)
    out = []
    for step in range(1, n + 1):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        tt.save(dir, step, model, opt, keep=2, blocking=False).wait()
        out.append(rss())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "fail":
        fail(args[0])
    elif mode == "keep":
        keep_one(args[0])
    elif mode == "exit":
        exit_at_once(args[0])
    elif mode == "rss":
        rss_loop(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")
