"""tlio: safetensors, atomic checkpoints and resumable token streams over tlio's Rust core.

Modules: ``tlio.safetensors`` (read, write, zero-copy open), ``tlio.pcg`` (the stream's
generator), ``tlio.tokens`` (token shards and the resumable stream), ``tlio.checkpoint``
(the atomic checkpoint protocol). ``tlio.torch`` adapts checkpoints and streams to
PyTorch and imports torch only when used.
"""

from tlio._tlio import __version__

__all__ = ["__version__"]
