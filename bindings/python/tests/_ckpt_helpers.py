"""Helpers of the checkpoint tests: a tiny numpy model and a numpy AdamW and SGD with
torch's update rules (float32 throughout, so a resumed run can be compared bit for bit),
and small file-system utilities."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List

import numpy as np

F32 = np.float32


def linear_model() -> Dict[str, np.ndarray]:
    """Section 3's Linear(2, 1), with awkward bits: a negative zero and a subnormal."""
    return {
        "weight": np.array([[0.1, -0.0]], F32),
        "bias": np.array([np.float32(1e-45)], F32),
    }


def adamw(params: Dict[str, np.ndarray], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """An AdamW state at step 0 in the dict form of tlio.checkpoint."""
    return {
        "type": "adamw",
        "step": 0,
        "lr": lr,
        "betas": list(betas),
        "eps": eps,
        "weight_decay": weight_decay,
        "state": {
            k: {"exp_avg": np.zeros_like(v), "exp_avg_sq": np.zeros_like(v)} for k, v in params.items()
        },
    }


def adamw_step(params: Dict[str, np.ndarray], grads: Dict[str, np.ndarray], opt: dict) -> None:
    """torch.optim.AdamW's update (decoupled weight decay, bias corrections), in float32."""
    opt["step"] += 1
    t = opt["step"]
    lr, (b1, b2), eps, wd = F32(opt["lr"]), map(F32, opt["betas"]), F32(opt["eps"]), F32(opt["weight_decay"])
    bc1 = F32(1) - b1 ** F32(t)
    bc2 = F32(1) - b2 ** F32(t)
    for name, p in params.items():
        g = grads[name]
        s = opt["state"][name]
        p *= F32(1) - lr * wd
        s["exp_avg"] *= b1
        s["exp_avg"] += (F32(1) - b1) * g
        s["exp_avg_sq"] *= b2
        s["exp_avg_sq"] += (F32(1) - b2) * g * g
        denom = np.sqrt(s["exp_avg_sq"]) / np.sqrt(bc2) + eps
        p -= (lr / bc1) * s["exp_avg"] / denom


def sgd(params: Dict[str, np.ndarray], lr=0.1, momentum=0.9):
    return {
        "type": "sgd",
        "lr": lr,
        "momentum": momentum,
        "dampening": 0.0,
        "nesterov": False,
        "weight_decay": 0.0,
        "state": {k: {"momentum_buffer": np.zeros_like(v)} for k, v in params.items()} if momentum else {},
    }


def sgd_step(params, grads, opt) -> None:
    """torch.optim.SGD with momentum (first step copies the gradient into the buffer)."""
    lr, mu = F32(opt["lr"]), F32(opt["momentum"])
    for name, p in params.items():
        g = grads[name]
        if mu:
            buf = opt["state"][name]["momentum_buffer"]
            buf *= mu
            buf += g
            g = buf
        p -= lr * g


def linear_grads(params, x: np.ndarray, y: np.ndarray) -> Dict[str, np.ndarray]:
    """Gradients of the mean squared error of Linear(2, 1) on (x, y)."""
    pred = x @ params["weight"].T + params["bias"]
    err = (pred - y) * F32(2.0 / len(x))
    return {"weight": err.T @ x, "bias": err.sum(axis=0)}


def bigram_grads(w: np.ndarray, inputs: np.ndarray, targets: np.ndarray):
    """Mean cross-entropy of the bigram logits w[input] against the targets, and its
    gradient, in float32."""
    x, y = inputs.ravel(), targets.ravel()
    logits = w[x]
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    p = e / e.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    p[np.arange(len(y)), y] -= F32(1)
    g = np.zeros_like(w)
    np.add.at(g, x, p / F32(len(y)))
    return loss, g


def bits(a: np.ndarray) -> bytes:
    """The exact bytes of an array (NaN payloads and signed zeros included)."""
    return np.ascontiguousarray(a).tobytes()


def same_bits(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and bits(a[k]) == bits(b[k]) for k in a
    )


def tree(path: Path) -> Dict[str, bytes]:
    """Every file under ``path`` with its bytes (directories as None), for "nothing
    changed" checks."""
    out = {}
    if not path.exists():
        return out
    for root, dirs, files in os.walk(path):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), path) + "/"] = None
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = Path(p).read_bytes()
    return out


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def steps(dir: Path) -> List[str]:
    return sorted(p.name for p in dir.iterdir() if p.name.startswith("step-") and not p.name.endswith(".tmp"))
