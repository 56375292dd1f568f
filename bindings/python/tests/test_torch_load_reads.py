"""What ``tlio.torch.load`` reads (python.md, tlio.torch): a plain model loading a step saved
by a sharded run reads it once, by the sharded reader, never first through the unsharded
path's full read and hash as well. Counted with the kernel's per-process read counter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt

torch.set_num_threads(1)

#: A one-rank gloo group whose Linear holds DTensors: tlio.torch.save writes it sharded.
SHARDED_SAVE = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    import tlio.torch as tt
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        net = torch.nn.Linear(512, 1024)
        for name, p in list(net.named_parameters()):
            setattr(net, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))
        tt.save(sys.argv[1], 1, net)
    finally:
        dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bytes_read() -> int:
    """Bytes this process has read through read(2) and friends, every thread included."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_sharded_step_is_read_once_by_a_plain_load(tmp_path):
    dir = tmp_path / "ck"
    env = {k: v for k, v in os.environ.items() if k != "FAILPOINTS"}
    out = subprocess.run([sys.executable, "-c", SHARDED_SAVE, str(dir), str(_free_port())],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    step = dir / "step-000001"
    assert (step / "shards.json").exists(), sorted(os.listdir(step))
    size = sum(f.stat().st_size for f in step.iterdir())
    net = torch.nn.Linear(512, 1024)
    tt.load(dir, net)  # the first load also imports what the sharded reader uses
    before = _bytes_read()
    ck = tt.load(dir, torch.nn.Linear(512, 1024))
    read = _bytes_read() - before
    assert ck.step == 1
    # Once: the step's bytes and a little (LATEST, the listing); twice would be 2 x size.
    assert size <= read < size * 1.2, (read, size)
    torch.manual_seed(0)
    assert torch.equal(ck.model["weight"], torch.nn.Linear(512, 1024).weight.detach())
