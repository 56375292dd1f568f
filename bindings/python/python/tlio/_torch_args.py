"""The arguments of ``tlio.torch.save`` and ``load``, checked before anything is read or
written: a wrong type is a ``TypeError`` and a wrong value a ``ValueError``, each naming
the argument (never an ``AttributeError`` from deep inside, as ``optimizer={}`` once
gave).

Invariants: these checks only look at the arguments (no file is touched); the unsharded
and the sharded paths call the same ones, so a call is refused alike on either path.
Imports nothing of tlio's torch modules (they all import this one).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

import torch


def path(dir: Any) -> str:
    """``dir`` as a str (a str or an ``os.PathLike``)."""
    try:
        return os.fspath(dir)
    except TypeError:
        raise TypeError(f"dir must be a str or an os.PathLike, got {type(dir).__name__}") from None


def model(model: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def optimizer(optimizer: Any) -> None:
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be None or a torch.optim.Optimizer, got {type(optimizer).__name__}")


def stream(stream: Any) -> None:
    """A stream is anything with ``cursor()`` and ``restore(cursor)`` (a
    ``tlio.tokens.TokenStream``)."""
    if stream is None:
        return
    if not all(callable(getattr(stream, m, None)) for m in ("cursor", "restore")):
        raise TypeError(
            f"stream must be None or a tlio.tokens.TokenStream (with cursor() and restore()), "
            f"got {type(stream).__name__}"
        )


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def mapping(name: str, value: Any) -> Dict[str, Any]:
    """``None`` or a mapping, as a fresh dict."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be None or a dict, got {type(value).__name__}")
    return dict(value)


def stateful(state: Any, method: str) -> Dict[str, Any]:
    """``state=``: ``None`` or a mapping of names to objects with ``method``
    (``state_dict`` to save, ``load_state_dict`` to load), as a fresh dict."""
    state = mapping("state", state)
    for name, obj in state.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"state names must be non-empty str, got {name!r}")
        if not callable(getattr(obj, method, None)):
            raise TypeError(
                f"state[{name!r}] is {type(obj).__name__}, which has no {method}() (state= takes "
                "objects with state_dict() and load_state_dict(), as an LR scheduler or a GradScaler)"
            )
    return state


def save(model_: Any, optimizer_: Any, stream_: Any, extra: Any, config: Any, overwrite: Any,
         state: Any) -> Dict[str, Any]:
    """Every argument of a save checked; returns ``extra`` as a fresh dict."""
    model(model_)
    optimizer(optimizer_)
    stream(stream_)
    extra = mapping("extra", extra)
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be None or a dict, got {type(config).__name__}")
    flag("overwrite", overwrite)
    stateful(state, "state_dict")
    return extra


def load(model_: Any, optimizer_: Any, stream_: Any, state: Optional[Any]) -> None:
    """Every argument of a load checked (``step`` is read by ``tlio.checkpoint._integer``)."""
    model(model_)
    optimizer(optimizer_)
    stream(stream_)
    stateful(state, "load_state_dict")
