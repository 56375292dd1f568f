"""tlio: safetensors, atomic checkpoints and resumable token streams over tlio's Rust core.

Modules: ``tlio.safetensors`` (read, write, zero-copy open), ``tlio.pcg`` (the stream's
generator), ``tlio.tokens`` (token shards and the resumable stream), ``tlio.checkpoint``
(the atomic checkpoint protocol), ``tlio.sharded`` (sharded checkpoints: rank files,
the chunk table, verified region reads). ``tlio.torch`` adapts checkpoints and streams to
PyTorch and imports torch only when used.

``import tlio`` loads the extension module only; each submodule is imported on first
use (``tlio.safetensors`` or ``import tlio.safetensors``), so torch is never imported
by accident.
"""

import importlib as _importlib

from tlio._tlio import __version__

_SUBMODULES = ("safetensors", "pcg", "tokens", "checkpoint", "sharded", "torch")

__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return _importlib.import_module(f"tlio.{name}")
    raise AttributeError(f"module 'tlio' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
