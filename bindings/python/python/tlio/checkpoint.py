"""Atomic, verified training checkpoints (checkpoint.md), written and read by tlio's core.

``save_checkpoint`` commits a step with the same protocol and code as ``tlio ckpt save``
(every file fsynced in ``step-N.tmp/``, the manifest last, the directory renamed, then
``LATEST`` replaced by rename; an advisory lock; the ``FAILPOINTS`` failpoints; LATEST
never moves backwards). ``load_checkpoint`` picks exactly the step ``tlio ckpt latest``
picks and verifies every byte before returning it; ``verify_step_dir`` lists what is
wrong with one step directory.
"""

from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from tlio._tlio import checkpoint as _core

__all__ = [
    "Checkpoint",
    "EXTRA_KEYS",
    "step_name",
    "save_checkpoint",
    "verify_step_dir",
    "load_checkpoint",
]

PathLike = Union[str, "os.PathLike[str]"]

#: The keys ``extra`` may hold; ``load_checkpoint`` always returns all five.
EXTRA_KEYS = ("tokens_seen", "data_cursor", "lr", "config_sha256", "git_sha")

_U64 = 1 << 64


@dataclass
class Checkpoint:
    """A checkpoint that verified, as ``load_checkpoint`` returns it.

    ``model`` maps names to float32 arrays; ``opt`` is ``None`` or
    ``{"type": "adamw" | "sgd", <hyper-parameters>, "state": {param: {key: array}}}``;
    ``rng_state`` is ``{"state": int, "inc": int}`` or ``None``; ``extra`` holds all of
    ``EXTRA_KEYS`` with checkpoint.md's defaults; ``config`` is the config dict or
    ``None``; ``skipped`` lists ``(directory name, reason)`` for each step examined and
    rejected on the way to this one; ``state`` the ``state=`` states of a
    ``tlio.torch`` step by name (empty for any other step).
    """

    path: str
    step: int
    model: Dict[str, np.ndarray]
    opt: Optional[Dict[str, Any]]
    rng_state: Optional[Dict[str, int]]
    extra: Dict[str, Any]
    config: Optional[Dict[str, Any]] = None
    skipped: List[Tuple[str, str]] = field(default_factory=list)
    state: Dict[str, Any] = field(default_factory=dict)


def step_name(step: int) -> str:
    """``step-`` and ``step`` in at least six digits: ``step-000007``, ``step-1234567``."""
    return _core.step_name(step)


def _plain(value: Any) -> Any:
    """numpy scalars as the Python numbers JSON takes; anything else is refused."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    raise ValueError(f"{value!r} ({type(value).__name__}) is not a JSON value")


def _json(what: str, value: Any, **kw: Any) -> str:
    try:
        return json.dumps(value, default=_plain, allow_nan=False, **kw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: {e}") from None


def _integer(what: str, value: Any) -> int:
    """An int (a numpy integer too); a bool, a float or a string is a ValueError."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None


def _rng(rng_state: Any) -> Optional[Tuple[int, int]]:
    if rng_state is None:
        return None
    if not isinstance(rng_state, Mapping):
        state = getattr(rng_state, "state", None)
        if not callable(state):
            raise ValueError(
                "rng_state must be None, a tlio.pcg.PCG32 or {'state': int, 'inc': int}, "
                f"got {type(rng_state).__name__}"
            )
        rng_state = state()
    if set(rng_state) != {"state", "inc"}:
        raise ValueError(
            f"rng_state must have exactly the keys 'state' and 'inc', got {sorted(rng_state)}"
        )
    words = []
    for key in ("state", "inc"):
        v = _integer(f"rng_state[{key!r}]", rng_state[key])
        if not 0 <= v < _U64:
            raise ValueError(f"rng_state[{key!r}] = {v} is not a 64-bit unsigned integer")
        words.append(v)
    return words[0], words[1]


def _opt(opt: Any) -> Tuple[Optional[str], Optional[Dict[str, Dict[str, Any]]]]:
    if opt is None:
        return None, None
    if not isinstance(opt, Mapping):
        raise ValueError(f"opt must be None or a dict, got {type(opt).__name__}")
    hyper = {k: v for k, v in opt.items() if k != "state"}
    state = opt.get("state", {})
    if not isinstance(state, Mapping):
        raise ValueError("opt['state'] must be {param: {key: array}}")
    arrays: Dict[str, Dict[str, Any]] = {}
    for param, entry in state.items():
        if not isinstance(entry, Mapping):
            raise ValueError(f"opt['state'][{param!r}] must be a dict of arrays")
        arrays[param] = dict(entry)
    return _json("opt", hyper), arrays


def save_checkpoint(
    dir: PathLike,
    model: Mapping[str, np.ndarray],
    opt: Optional[Mapping[str, Any]],
    step: int,
    rng_state: Any,
    extra: Optional[Mapping[str, Any]],
    keep: Optional[int] = None,
    *,
    config: Optional[Mapping[str, Any]] = None,
    overwrite: bool = False,
) -> str:
    """Save ``step`` in ``dir`` atomically; returns the step directory's path.

    ``model`` maps parameter names to float32 arrays (model.safetensors, F32). ``opt`` is
    ``None`` (no optimizer.safetensors) or ``{"type": "adamw", "step", "lr", "betas",
    "eps", "weight_decay", "state": {param: {"exp_avg": a, "exp_avg_sq": a}}}`` or
    ``{"type": "sgd", "lr", "momentum", "dampening", "nesterov", "weight_decay",
    "state": {param: {"momentum_buffer": a}}}``. ``rng_state`` is ``None``, a ``PCG32`` or
    ``{"state": int, "inc": int}``. ``extra`` holds any of ``EXTRA_KEYS``
    (``data_cursor`` is ``{"shard", "offset"}``, plus ``"global_batch"`` for a stream
    with ranks; the generator goes in ``rng_state``). ``config`` becomes config.json and its
    sha256. ``keep`` keeps only the newest ``keep`` valid steps afterwards.

    Everything is checked before anything is written: a bad field is a ``ValueError``
    and leaves the disk untouched. An existing complete step is a ``ValueError`` unless
    ``overwrite=True``; a step older than the verified step LATEST names is a
    ``ValueError`` naming it; a lock held by another writer past the wait is an
    ``OSError``.
    """
    if not isinstance(model, Mapping):
        raise ValueError(f"model must be a dict of float32 arrays, got {type(model).__name__}")
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise ValueError(f"extra must be None or a dict, got {type(extra).__name__}")
    unknown = [k for k in extra if k not in EXTRA_KEYS]
    if unknown:
        raise ValueError(
            f"extra has unknown key {unknown[0]!r} (allowed: {', '.join(EXTRA_KEYS)})"
        )
    state = {"step": _integer("step", step), **extra}
    state_json = _json("extra", state)
    opt_json, opt_state = _opt(opt)
    config_bytes = None
    if config is not None:
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")
        config_bytes = (_json("config", config, indent=2) + "\n").encode()
    if keep is not None:
        keep = _integer("keep", keep)
    return _core.save(
        os.fspath(dir),
        dict(model),
        opt_json,
        opt_state,
        state_json,
        _rng(rng_state),
        config_bytes,
        keep,
        bool(overwrite),
    )


def verify_step_dir(path: PathLike) -> List[str]:
    """The problems of one step directory, one string each naming the file and the rule.

    An empty list means the directory verifies: every file the manifest lists present
    with its size and sha256, no unlisted file, every JSON and safetensors file valid. A
    missing directory is a ``FileNotFoundError``.
    """
    return _core.verify_step_dir(os.fspath(path))


def load_checkpoint(dir: PathLike, step: Optional[int] = None) -> Checkpoint:
    """Load the checkpoint ``tlio ckpt latest`` picks from ``dir``, verified.

    ``LATEST`` first; when the step it names fails, the newest older step that verifies;
    steps newer than ``LATEST`` are ignored (never declared done). With ``step``, exactly
    that step: missing or failing, it is a ``FileNotFoundError`` naming why, never
    another step (the fallback is for ``step=None``). Nothing valid:
    ``FileNotFoundError`` listing each directory and why.
    """
    if step is not None:
        step = _integer("step", step)
    try:
        path, n, model, opt, state_json, rng, config, skipped = _core.load(os.fspath(dir), step)
    except ValueError:
        # A checkpoint of tlio.torch (tensors in their own dtypes, python.md's torch
        # optimizer JSON) is refused by the F32 decoder; it is read as load_safetensors
        # reads files instead. Anything else re-raises the decoder's error.
        torch_form = _torch_form(dir, step)
        if torch_form is None:
            raise
        path, n, model, opt, state_json, rng, config, skipped = torch_form
    else:
        if opt is not None:
            opt_json, arrays = opt
            opt = json.loads(opt_json)
            opt["state"] = arrays
    state = json.loads(state_json)
    return Checkpoint(
        path=path,
        step=n,
        model=model,
        opt=opt,
        rng_state=None if rng is None else {"state": rng[0], "inc": rng[1]},
        extra={k: state[k] for k in EXTRA_KEYS},
        config=None if config is None else json.loads(config),
        skipped=[tuple(s) for s in skipped],
    )


def _arrays(path: str, parts: tuple) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Every tensor of a loaded file (``_core.load_files``' owned bytes, rows and
    metadata) decoded as ``load_safetensors`` decodes: numpy-native dtypes as writable
    views of the verified bytes (a copy when a tensor's start is not aligned for its
    dtype), BF16 and F8 decoded to float32."""
    from tlio.safetensors import _DECODED, _NATIVE, _raw_only, _st

    buf, rows, meta = parts
    out: Dict[str, np.ndarray] = {}
    for name, dtype, shape, start, end in rows:
        shape = tuple(shape)
        if dtype in _DECODED:
            out[name] = _st.decode(dtype, name, buf[start:end]).reshape(shape)
            continue
        np_dtype = _NATIVE.get(dtype)
        if np_dtype is None:
            raise _raw_only(path, name, dtype)
        a = buf[start:end]
        if a.ctypes.data % np_dtype.itemsize:
            a = a.copy()
        out[name] = a.view(np_dtype).reshape(shape)
    return out, dict(meta)


def _torch_form(dir: PathLike, step: Optional[int]) -> Optional[tuple]:
    """The checkpoint ``load`` picks, decoded as ``load_safetensors`` decodes (any
    dtype) from the bytes the core verified, when its optimizer state is python.md's
    torch form; else ``None``."""
    path, n, state_json, rng, config, skipped, files = _core.load_files(os.fspath(dir), step)
    model, _ = _arrays(os.path.join(path, "model.safetensors"), files["model.safetensors"])
    opt = None
    if "optimizer.safetensors" in files:
        arrays, meta = _arrays(os.path.join(path, "optimizer.safetensors"), files["optimizer.safetensors"])
        doc = json.loads(meta.get("state", "{}"))
        if not str(doc.get("type", "")).startswith("torch."):
            return None
        by_param: Dict[str, Dict[str, Any]] = {}
        for full, a in arrays.items():
            name, _, key = full.rpartition(".")
            by_param.setdefault(name, {})[key] = a
        opt = {k: v for k, v in doc.items() if k != "state"}
        opt["state"] = {p: {**doc["state"].get(p, {}), **t} for p, t in by_param.items()}
        for p, entries in doc["state"].items():
            opt["state"].setdefault(p, dict(entries))
    return path, n, model, opt, state_json, rng, config, skipped
