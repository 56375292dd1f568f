"""A small GPT-style model trained in plain PyTorch on a tlio token shard, checkpointed
with ``tlio.torch.save`` every K steps and resumable bit for bit with ``--resume``.

    tlio tokens pack assets/demo_corpus.txt --tokenizer gpt2 -o train.bin
    python examples/train_torch.py --shard train.bin --out run --steps 60 --every 10
    python examples/train_torch.py --shard train.bin --out run --steps 60 --every 10 --resume
    torchrun --nproc_per_node 2 examples/train_torch.py --shard train.bin --out run2 --steps 60
    python examples/train_torch.py --shard train.bin --out run3 --steps 60 --every 10 --async-save
    python examples/train_torch.py --shard train.bin --out run4 --steps 60 --lr-schedule cosine
    python examples/train_torch.py --mix web.bin:0.6 --mix code.bin:0.4 --num-workers 4 --out run5

The model: token and position embeddings, two pre-LayerNorm causal self-attention
blocks with an MLP, a final LayerNorm and a head tied to the token embedding; AdamW.
The data: a ``tlio.tokens.TokenStream`` whose rank and world size come from
torch.distributed under torchrun (each rank trains on its part of the global batch,
DDP over gloo averages the gradients). Only rank 0 writes checkpoints; every rank
calls ``save`` and ``load``.

Deterministic by construction: fixed seeds, ``torch.use_deterministic_algorithms(True)``,
one thread, no dropout. A run killed at any instant (SIGKILL, a crash inside a save)
and restarted with ``--resume`` loses at most ``--every`` steps and ends exactly where
an uninterrupted run with the same world size ends. With ``--async-save`` each save
returns once the state is copied to host memory and is written in the background
(``blocking=False``); a kill during that write costs the steps since the previous save.
With ``--lr-schedule cosine`` the learning rate follows a cosine decay over ``--steps``
(``torch.optim.lr_scheduler.CosineAnnealingLR``), whose state is saved and restored
through ``state={"scheduler": ...}``, so a resumed run stays on the same schedule.

``--mix SRC:W`` (repeated, instead of ``--shard``) trains on a mixture of sources at
weights ``W`` summing to 1 (``TokenStream(sources=...)``; ``SRC`` is anything a source
takes: a shard, a ``*`` pattern, a pack's manifest, an ``s3://`` URL). ``--num-workers
N`` reads the batches through torchdata's ``StatefulDataLoader(TokenDataset(stream),
num_workers=N)`` (worker processes started the platform's default way): the workers
split the stream, so the run trains on the very batches of ``--num-workers 0``, and the
loader's state_dict is saved as ``state={"loader": ...}``; resume with the same N.

Each step prints ``step N loss L``; the final line is
``sha256 state_dict=<hex> optimizer=<hex>``: the state_dict digest hashes, for each
entry in sorted name order, the name, dtype, shape and raw bytes of the tensor; the
optimizer digest does the same for every state entry as ``<param name>.<key>`` (tensors
as dtype, shape, raw bytes; numbers as JSON), then each param group's hyper-parameters
as JSON with the parameters by name.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tlio.torch as tt
from tlio.pcg import PCG32
from tlio.tokens import TokenStream, read_tokens_header


class Block(torch.nn.Module):
    """Pre-LN causal self-attention and MLP, each added to the residual stream."""

    def __init__(self, d: int, heads: int, seq_len: int):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq_len: int):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq_len, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, seq_len) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: saved once, restored as one Parameter
        for emb in (self.tok, self.pos):  # GPT-2's scale: unit-variance logits would start far off
            torch.nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _tensor_bytes(h, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{list(t.shape)}".encode())
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    h.update(t.numpy().tobytes())


def digests(model: torch.nn.Module, opt: torch.optim.Optimizer):
    """(state_dict sha256, optimizer sha256), as the module docstring says."""
    h = hashlib.sha256()
    sd = model.state_dict()
    for name in sorted(sd):
        h.update(name.encode())
        _tensor_bytes(h, sd[name])
    names = {id(p): n for n, p in model.named_parameters()}
    g = hashlib.sha256()
    entries = {}
    for p, state in opt.state.items():
        for key, value in state.items():
            entries[f"{names[id(p)]}.{key}"] = value
    for name in sorted(entries):
        g.update(name.encode())
        value = entries[name]
        if isinstance(value, torch.Tensor):
            _tensor_bytes(g, value)
        else:
            g.update(json.dumps(value).encode())
    for group in opt.param_groups:
        hyper = {k: v for k, v in group.items() if k != "params"}
        hyper["params"] = [names[id(p)] for p in group["params"]]
        g.update(json.dumps(hyper, sort_keys=True, default=str).encode())
    return h.hexdigest(), g.hexdigest()


def say(line: str) -> None:
    """One line in one write, so that the lines of two ranks sharing stdout never mix."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def mix_source(text: str):
    """``SRC:W`` as ``(SRC, W)``, split at the last colon (a URL holds colons too)."""
    src, sep, weight = text.rpartition(":")
    try:
        if not sep or not src:
            raise ValueError
        return src, float(weight)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SRC:WEIGHT, got {text!r}") from None


def make_stream(args):
    """The run's TokenStream (rank and world size from the process group under torchrun,
    else 0 and 1) and the model's vocabulary: the first shard's, else GPT-2's."""
    kw = dict(seq_len=args.seq_len, batch=args.batch, rng=PCG32(args.seed), rank=None, world_size=None,
              shuffle=args.shuffle)
    if args.shard:
        vocab = read_tokens_header(args.shard[0])["vocab_size"] or 50257
        return TokenStream(args.shard, vocab_size=vocab, **kw), vocab
    stream = TokenStream(sources=args.mix, **kw)
    recorded = read_tokens_header(stream.shards[0])["vocab_size"]
    if recorded:
        return stream, recorded
    # Shards that record no vocabulary: every id is checked against GPT-2's.
    return TokenStream(sources=args.mix, vocab_size=50257, **kw), 50257


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data = ap.add_mutually_exclusive_group(required=True)
    data.add_argument("--shard", nargs="+",
                      help="token shards (tlio tokens pack --tokenizer gpt2), read in this order")
    data.add_argument("--mix", action="append", metavar="SRC:W", type=mix_source,
                      help="a source of a mixture and its weight (repeat; the weights sum to 1)")
    ap.add_argument("--shuffle", action="store_true",
                    help="visit the shards in a new order each epoch (passes within a shard unchanged)")
    ap.add_argument("--out", required=True, help="the checkpoint directory")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10, help="save every K steps")
    ap.add_argument("--batch", type=int, default=4, help="windows per rank and step")
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in --out")
    ap.add_argument("--async-save", action="store_true",
                    help="save with blocking=False: the loop pays for a copy of the state, the write runs behind it")
    ap.add_argument("--num-workers", type=int, default=0,
                    help="read batches through a StatefulDataLoader with N worker processes (0: none)")
    ap.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                    help="cosine: decay the learning rate to 0 over --steps (its state is checkpointed)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0

    stream, vocab = make_stream(args)
    torch.manual_seed(args.seed)
    model = GPT(vocab, args.d_model, 2, 2, args.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    # The loop's other state, saved and loaded by name (as JSON) beside the model.
    state = {}
    if args.lr_schedule == "cosine":
        state["scheduler"] = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    loader = None
    if args.num_workers > 0:
        from torchdata.stateful_dataloader import StatefulDataLoader  # only a run with workers needs torchdata

        loader = StatefulDataLoader(tt.TokenDataset(stream), batch_size=None, num_workers=args.num_workers)
        # The loader's state holds the position (each worker's cursor); the stream of
        # this process never moves.
        state["loader"] = loader
    elif stream.is_mixture:
        # save's stream= records a single-source cursor; a mixture's goes by name.
        state["stream"] = stream
    saved = stream if not state.keys() & {"loader", "stream"} else None
    start = 0
    if args.resume:
        try:
            start = tt.load(args.out, model, opt, saved, state=state).step
        except FileNotFoundError:
            pass
    batches = iter(loader) if loader is not None else None
    say(f"rank {rank} pid {os.getpid()} start {start}")
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model

    pending = None  # a path, or the PendingSave of the save in flight
    for step in range(start + 1, args.steps + 1):
        if batches is not None:
            x, y = next(batches)
        else:
            x, y = (torch.from_numpy(a) for a in stream.next_batch())
        logits = net(x)
        loss = F.cross_entropy(logits.view(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if "scheduler" in state:
            state["scheduler"].step()
        say(f"rank {rank} step {step} loss {loss.item():.4f}")
        if step % args.every == 0:
            tokens = step * stream.global_batch * args.seq_len
            pending = tt.save(args.out, step, model, opt, saved,
                              extra={"tokens_seen": tokens}, keep=3,
                              blocking=not args.async_save, state=state)

    if isinstance(pending, tt.PendingSave):
        pending.wait()  # before the process group goes: the background commit uses it
    if rank == 0:
        s, o = digests(model, opt)
        say(f"sha256 state_dict={s} optimizer={o}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
