"""Rank processes of test_torch_shard.py, started by torchrun (gloo on CPU). Each rank
writes what it saw as JSON to REPORT.<rank>; the test compares the ranks and the layouts.

  save4 DIR             4 ranks: the net under FSDP2 trained two steps and saved at step 1
                        (sharded); reports the gathered state's digests; then loads DIR into
                        a 2-D mesh (HSDP 2x2 and FSDP x TP 2x2), reporting their digests
  reshard DIR PLAIN OUT 2 ranks: loads DIR (saved by 4 ranks) into FSDP2, tensor parallel
                        and a 1x2 FSDP x TP mesh, and PLAIN (an unsharded step) into FSDP2;
                        reports each layout's digests; saves the FSDP2 state to OUT
  faults DIR            2 ranks: two saves; a byte flipped in step 2's file of rank 1 makes
                        every rank load step 1; a save failing on rank 1 alone raises on
                        both and commits nothing; a param group listing its params in
                        another order loads
  full_disk DIR         2 ranks: a save whose rank-0 writes fail (a file size limit on rank 0
                        alone, EFBIG: a full disk without root); reports each rank's
                        exception (class, errno, strerror, filename, message)
  s3 LOCAL P Q          2 ranks, on object storage (the AWS variables point at the test's
                        server): steps 1 and 2 saved to the s3:// prefix P, step 2 also to
                        the local LOCAL and with blocking=False to the prefix Q; P loaded
                        back into FSDP2; then a byte of step 2's rank-1 model object in P
                        flipped (by rank 0, with boto3) makes every rank load step 1

Digests: for every entry of the model's state_dict and the optimizer's state (keyed by
parameter name), the sha256 of dtype, global shape and the bytes of the gathered tensor
(``full_tensor()``), so layouts compare entry by entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import tlio.torch as tt

torch.set_num_threads(1)
VOCAB, DIM, SEQ = 37, 8, 6
REPORT = ""


class Net(torch.nn.Module):
    """Embedding tied to the head, an MLP (the tensor-parallel part), a LayerNorm and a
    persistent buffer: odd sizes, so that shards are uneven."""

    def __init__(self, hidden=3 * DIM + 1):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.up = torch.nn.Linear(DIM, hidden)
        self.down = torch.nn.Linear(hidden, DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, DIM))

    def forward(self, x):
        h = self.emb(x)
        h = h + self.down(F.gelu(self.up(h)))
        return self.head(self.norm(h) * self.scale)


def _replicated_norm(norm, mesh):
    """The LayerNorm's parameters as Replicate() DTensors (its input and output plain)."""
    distribute_module(
        norm, mesh,
        input_fn=lambda mod, inputs, mesh: tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                                                 for x in inputs),
        output_fn=lambda mod, out, mesh: out.to_local(),
    )


def build(layout: str, seed: int, mesh_shape=None, hidden=3 * DIM + 1):
    """The net in ``layout`` over the default group and an AdamW over its parameters."""
    torch.manual_seed(seed)
    net = Net(hidden)
    world = dist.get_world_size()
    if layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        fully_shard(net.up, mesh=mesh)
        fully_shard(net.down, mesh=mesh)
        fully_shard(net, mesh=mesh)
    elif layout == "tp":
        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(net, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        _replicated_norm(net.norm, mesh)
    elif layout == "hsdp":
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
        fully_shard(net, mesh=mesh)
    elif layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "tp"))
        parallelize_module(net, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(net.up, mesh=mesh["dp"])
        fully_shard(net.down, mesh=mesh["dp"])
        fully_shard(net, mesh=mesh["dp"])
    else:
        raise ValueError(layout)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    return net, opt


def train(net, opt, steps=2):
    for i in range(steps):
        x = torch.arange(2 * SEQ).view(2, SEQ) * (i + 3) % VOCAB
        loss = F.cross_entropy(net(x).reshape(-1, VOCAB), x.roll(-1, 1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _sha(t) -> str:
    t = _full(t).detach().contiguous()
    h = hashlib.sha256(f"{t.dtype}{list(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def digests(net, opt) -> dict:
    """{entry: sha256} of the gathered model and optimizer state (a collective)."""
    out = {f"model/{k}": _sha(v) for k, v in net.state_dict().items()}
    names = {id(p): n for n, p in net.named_parameters()}
    for p, state in opt.state.items():
        for key, v in state.items():
            out[f"opt/{names[id(p)]}.{key}"] = _sha(v) if isinstance(v, torch.Tensor) else repr(v)
    for i, g in enumerate(opt.param_groups):
        out[f"group/{i}"] = json.dumps({**{k: v for k, v in g.items() if k != "params"},
                                        "params": sorted(names[id(p)] for p in g["params"])}, default=str)
    return out


def report(out):
    with open(f"{REPORT}.{dist.get_rank()}", "w") as f:
        json.dump(out, f)


def attempt(fn):
    try:
        return ["ok", fn()]
    except Exception as e:
        return [type(e).__name__, str(e)]


def save4(dir):
    out = {}
    net, opt = build("fsdp", 0)
    train(net, opt)
    out["path"] = tt.save(dir, 1, net, opt, extra={"tokens_seen": 7})
    out["saved"] = digests(net, opt)
    for layout in ("hsdp", "fsdp_tp"):
        net, opt = build(layout, 5, (2, 2))
        out[f"{layout}_step"] = tt.load(dir, net, opt).step
        out[layout] = digests(net, opt)
    report(out)


def reshard(dir, plain, dest):
    out = {}
    for layout, src in (("fsdp", dir), ("tp", dir), ("fsdp_tp", dir), ("plain_fsdp", plain)):
        net, opt = build(layout.removeprefix("plain_"), 9, (1, 2))
        ck = tt.load(src, net, opt)
        out[f"{layout}_step"] = [ck.step, ck.extra["tokens_seen"]]
        out[layout] = digests(net, opt)
        if layout == "fsdp":
            out["saved_path"] = tt.save(dest, 3, net, opt)
            # A save at another layout of the state just loaded: the same global state.
            net2, opt2 = build("tp", 11)
            tt.load(dest, net2, opt2)
            out["tp_of_resaved"] = digests(net2, opt2)
    report(out)


def faults(dir):
    rank = dist.get_rank()
    out = {}
    net, opt = build("fsdp", 0)
    train(net, opt, 1)
    tt.save(dir, 1, net, opt)
    out["step1"] = digests(net, opt)
    train(net, opt, 1)
    tt.save(dir, 2, net, opt)
    # A byte of step 2's rank-1 model file flipped (its last byte: tensor data).
    dist.barrier()
    if rank == 0:
        path = os.path.join(dir, "step-000002", "model-rank00001.safetensors")
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x10]))
    dist.barrier()
    fresh, fresh_opt = build("fsdp", 3)
    ck = attempt(lambda: tt.load(dir, fresh, fresh_opt).step)
    out["flipped_load"] = ck
    out["flipped_state"] = digests(fresh, fresh_opt)
    # A save that fails on rank 1 alone (a state key tlio cannot name), after rank 0 began it.
    if rank == 1:
        p = next(iter(opt.state))
        opt.state[p]["bad.key"] = 1
    out["one_rank_fails"] = attempt(lambda: tt.save(dir, 3, net, opt))
    dist.barrier()  # rank 0 has removed the temporary directory when its save returned
    out["after_failure"] = sorted(os.listdir(dir))
    if rank == 1:
        del opt.state[p]["bad.key"]
    out["save_again"] = attempt(lambda: tt.save(dir, 3, net, opt))
    out["saved3"] = digests(net, opt)
    # The optimizer's group lists the params in another order: matched by names.
    net3, _ = build("fsdp", 4)
    opt3 = torch.optim.AdamW(list(net3.parameters())[::-1], lr=1e-2, weight_decay=0.1)
    out["reordered"] = attempt(lambda: tt.load(dir, net3, opt3).step)
    out["reordered_state"] = digests(net3, opt3)
    report(out)


def _caught(fn) -> dict:
    """What ``fn`` raised: its class, OSError fields and message (``None`` if nothing)."""
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "os_error": isinstance(e, OSError), "message": str(e),
                **{k: getattr(e, k, None) for k in ("errno", "strerror", "filename")}}
    return {"type": None}


def full_disk(dir):
    import resource
    import signal

    net, opt = build("fsdp", 5)
    train(net, opt, 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if dist.get_rank() == 0:
        # A write past the limit fails with EFBIG instead of killing the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, hard))
    try:
        out = {"save": _caught(lambda: tt.save(dir, 1, net, opt))}
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    dist.barrier()
    out["after"] = sorted(os.listdir(dir))
    report(out)


def _flip_last_byte(url):
    """Flip the last byte of the object at ``url`` (s3://bucket/key) in place, with boto3."""
    import boto3

    bucket, key = url[len("s3://"):].split("/", 1)
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[-1] ^= 0x10
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))


def s3(local, p, q):
    rank = dist.get_rank()
    out = {}
    net, opt = build("fsdp", 0)
    train(net, opt, 1)
    out["p1"] = tt.save(p, 1, net, opt, extra={"tokens_seen": 7})
    out["step1"] = digests(net, opt)
    train(net, opt, 1)
    out["p2"] = tt.save(p, 2, net, opt, extra={"tokens_seen": 14})
    out["local2"] = tt.save(local, 2, net, opt, extra={"tokens_seen": 14})
    pending = tt.save(q, 2, net, opt, extra={"tokens_seen": 14}, blocking=False)
    out["q2_type"] = type(pending).__name__
    out["q2"] = pending.wait()
    out["step2"] = digests(net, opt)
    fresh, fresh_opt = build("fsdp", 3)
    ck = tt.load(p, fresh, fresh_opt)
    out["loaded"] = [ck.step, ck.extra["tokens_seen"], ck.path]
    out["loaded_state"] = digests(fresh, fresh_opt)
    dist.barrier()
    if rank == 0:
        _flip_last_byte(f"{p}/step-000002/{_attempt_of(p + '/step-000002')}/model-rank00001.safetensors")
    dist.barrier()
    fresh, fresh_opt = build("fsdp", 4)
    out["flipped_load"] = attempt(lambda: tt.load(p, fresh, fresh_opt).step)
    out["flipped_state"] = digests(fresh, fresh_opt)
    report(out)


def _attempt_of(step_url):
    """The attempt the manifest of the step at ``step_url`` names (read with boto3)."""
    import boto3

    bucket, key = step_url[len("s3://"):].split("/", 1)
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    body = client.get_object(Bucket=bucket, Key=key + "/MANIFEST.json")["Body"].read()
    return json.loads(body)["attempt"]


if __name__ == "__main__":
    mode, REPORT, *args = sys.argv[1:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        {"save4": save4, "reshard": reshard, "faults": faults, "full_disk": full_disk, "s3": s3}[mode](*args)
        dist.monitored_barrier(timeout=timedelta(seconds=60))
    finally:
        dist.destroy_process_group()
