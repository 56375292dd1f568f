"""Child processes of test_torch.py, run as scripts so that a test can SIGKILL them or
let a failpoint abort them.

  train DIR SHARD STEPS K     a tiny tied-embedding model on a TokenStream, AdamW,
                              resumed from DIR when it holds a checkpoint, tlio.torch.save
                              every K steps; prints "start S" (the step it resumed from),
                              "step N" after each optimizer step (before that step's save,
                              so a parent can kill it at a chosen step or inside a save)
                              and the digest of the final state last
  save DIR STEP               tlio.torch.save of STEP of the fixed small model (for
                              the failpoint test; FAILPOINTS comes from the environment)
"""

import hashlib
import sys

import torch

import tlio.torch as tt
from tlio.pcg import PCG32
from tlio.tokens import TokenStream

torch.set_num_threads(1)
VOCAB, DIM, SEQ, BATCH = 64, 16, 8, 4


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.mix = torch.nn.Linear(DIM, DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.norm(torch.tanh(self.mix(self.emb(x)))))


def tbytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def digest(model, opt):
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(tbytes(v))
    sd = opt.state_dict()
    for i in sorted(sd["state"]):
        for k in sorted(sd["state"][i]):
            h.update(f"{i}.{k}".encode())
            v = sd["state"][i][k]
            h.update(tbytes(v) if isinstance(v, torch.Tensor) else repr(v).encode())
    h.update(repr(sd["param_groups"]).encode())
    return h.hexdigest()


def fresh(seed=0):
    torch.manual_seed(seed)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return model, opt


def train(dir, shard, steps, k):
    model, opt = fresh()
    stream = TokenStream([shard], SEQ, BATCH, PCG32(7))
    start = 0
    try:
        start = tt.load(dir, model, opt, stream).step
    except FileNotFoundError:
        pass
    print(f"start {start}", flush=True)
    for step in range(start + 1, steps + 1):
        x, y = stream.next_batch()
        logits = model(torch.from_numpy(x))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), torch.from_numpy(y).view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}", flush=True)
        if step % k == 0:
            tt.save(dir, step, model, opt, stream, extra={"tokens_seen": step * SEQ * BATCH})
    print(digest(model, opt), flush=True)


def save_once(dir, step):
    model, opt = fresh(step)
    model(torch.arange(SEQ).view(1, -1)).sum().backward()
    opt.step()
    tt.save(dir, step, model, opt, config={"run": "crash"})


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "train":
        train(args[0], args[1], int(args[2]), int(args[3]))
    else:
        save_once(args[0], int(args[1]))
