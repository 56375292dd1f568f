"""The example GPT of train_torch.py trained sharded under torchrun (FSDP2, tensor
parallel, or both on a 2-D mesh), checkpointed with ``tlio.torch.save`` every K steps by
every rank (each writes its own shards) and resumable bit for bit with ``--resume``.

    tlio tokens pack assets/demo_corpus.txt --tokenizer gpt2 -o train.bin
    torchrun --nproc_per_node 2 examples/train_fsdp.py --shard train.bin --out run --layout fsdp
    torchrun --nproc_per_node 2 examples/train_fsdp.py --shard train.bin --out run --layout fsdp --resume
    torchrun --nproc_per_node 4 examples/train_fsdp.py --shard train.bin --out run4 --layout fsdp_tp --tp 2
    torchrun --nproc_per_node 2 examples/train_fsdp.py --shard train.bin --out run5 --layout fsdp --async-save

Layouts (gloo on CPU; a mesh of every rank):
  fsdp     ``fully_shard`` of every block, then of the whole model: every parameter and
           its AdamW moments sharded on dim 0 across the ranks;
  tp       ``parallelize_module`` of every block's MLP (its first Linear column-wise, its
           second row-wise); the rest replicated as plain tensors; every rank sees the
           same batch;
  fsdp_tp  a 2-D mesh (dp = world / --tp, tp = --tp): the MLPs tensor parallel over tp,
           then everything FSDP2-sharded over dp; each dp rank sees its own batch.

Deterministic as train_torch.py (fixed seeds, deterministic algorithms, one thread, no
dropout): a run killed at any instant and restarted with ``--resume`` at the same world
size and layout ends exactly where an uninterrupted run ends. A checkpoint of one layout
loads into any other (``tlio.torch.load`` reshards), and into train_torch.py's plain model.
``--async-save`` saves with ``blocking=False``: every rank copies its shards to host
memory and writes them in the background, coordinated on a process group of tlio's own.

Each step prints ``rank R step N loss L``; a start prints ``rank R pid P start S``; the
final line (rank 0) is ``sha256 state_dict=<hex> optimizer=<hex>``, train_torch.py's
digests of the gathered (full) tensors.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import tlio.torch as tt
from tlio.pcg import PCG32
from tlio.tokens import TokenStream, read_tokens_header

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import GPT, digests, say  # noqa: E402


def shard(model: torch.nn.Module, layout: str, tp: int):
    """Apply ``layout`` to ``model`` in place; returns (data-parallel rank, its size)."""
    world = dist.get_world_size()
    if layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return dist.get_rank(), world
    if world % tp:
        raise SystemExit(f"--tp {tp} does not divide the world size {world}")
    if layout == "tp":
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            parallelize_module(block, mesh, {"fc": ColwiseParallel(), "out": RowwiseParallel()})
        return 0, 1
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"fc": ColwiseParallel(), "out": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return mesh["dp"].get_local_rank(), world // tp


class Gathered:
    """A model's and an optimizer's state with every DTensor gathered whole (a collective),
    shaped so that train_torch.digests hashes it as it hashes a plain model's."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer):
        full = {n: (t.full_tensor() if isinstance(t, DTensor) else t) for n, t in model.state_dict().items()}
        self._sd = full
        self._named = [(n, p) for n, p in model.named_parameters()]
        self.state = {p: {k: (v.full_tensor() if isinstance(v, DTensor) else v) for k, v in s.items()}
                      for p, s in opt.state.items()}
        self.param_groups = opt.param_groups

    def state_dict(self):
        return self._sd

    def named_parameters(self):
        return iter(self._named)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard", required=True, help="a token shard (tlio tokens pack --tokenizer gpt2)")
    ap.add_argument("--out", required=True, help="the checkpoint directory")
    ap.add_argument("--layout", choices=("fsdp", "tp", "fsdp_tp"), default="fsdp")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel size of fsdp_tp")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10, help="save every K steps")
    ap.add_argument("--batch", type=int, default=4, help="windows per data-parallel rank and step")
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in --out")
    ap.add_argument("--async-save", action="store_true",
                    help="save with blocking=False: the loop pays for a copy of the state, the write runs behind it")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    vocab = read_tokens_header(args.shard)["vocab_size"] or 50257
    torch.manual_seed(args.seed)
    model = GPT(vocab, args.d_model, 2, 2, args.seq_len)
    dp_rank, dp_size = shard(model, args.layout, args.tp)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    stream = TokenStream([args.shard], args.seq_len, args.batch, PCG32(args.seed), vocab,
                         rank=dp_rank, world_size=dp_size)
    start = 0
    if args.resume:
        try:
            start = tt.load(args.out, model, opt, stream).step
        except FileNotFoundError:
            pass
    say(f"rank {rank} pid {os.getpid()} start {start}")

    pending = None  # a path, or the PendingSave of the save in flight
    for step in range(start + 1, args.steps + 1):
        x, y = stream.next_batch()
        logits = model(torch.from_numpy(x))
        loss = F.cross_entropy(logits.view(-1, vocab), torch.from_numpy(y).view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        say(f"rank {rank} step {step} loss {loss.item():.4f}")
        if step % args.every == 0:
            tokens = step * stream.global_batch * args.seq_len
            pending = tt.save(args.out, step, model, opt, stream, extra={"tokens_seen": tokens}, keep=3,
                              blocking=not args.async_save)

    if isinstance(pending, tt.PendingSave):
        pending.wait()  # before the process group goes: the background commit uses it
    whole = Gathered(model, opt)
    s, o = digests(whole, whole)
    if rank == 0:
        say(f"sha256 state_dict={s} optimizer={o}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
