"""Type stubs of tlio.tokens: llm.c-style token shards and the resumable token stream."""

import os
from typing import (
    Any,
    Dict,
    Iterator,
    List,
    Literal,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    overload,
)

import numpy as np
import numpy.typing as npt

PathLike = Union[str, os.PathLike[str]]

class _Generator(Protocol):
    """A PCG32 as tlio.pcg.PCG32: its ``state()`` is copied by the stream."""

    def state(self) -> Dict[str, int]: ...

Cursor = Dict[str, Any]
"""``{"shard": int, "offset": int, "rng": {"state": "<16 hex>", "inc": "<16 hex>"}}``,
plus ``"global_batch": int`` when the stream has ranks and ``"epoch_rng"`` (the
generator at the epoch's start) when its shard order is shuffled."""

Batch = Tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
BoundaryBatch = Tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32]
]

__all__: List[str]

def read_tokens_header(path: PathLike) -> Dict[str, int]:
    """``{"magic", "version", "n", "vocab_size"}``, checked against the file size."""

def open_tokens(path: PathLike, vocab_size: Optional[int] = None) -> np.memmap:
    """The validated ids as a read-only array over the file's map (uint16 or uint32)."""

class TokenStream:
    """tokens.md's stream: windows of seq_len + 1 ids, batch windows per batch."""

    def __init__(
        self,
        shards: Optional[Sequence[PathLike]] = None,
        seq_len: Optional[int] = None,
        batch: Optional[int] = None,
        rng: Union[_Generator, Dict[str, int], None] = None,
        vocab_size: Optional[int] = None,
        *,
        sources: Optional[Sequence[Union[Tuple[Union[PathLike, Sequence[PathLike]], float], PathLike, Sequence[PathLike]]]] = None,
        stages: Optional[Sequence[Tuple[int, Sequence[float]]]] = None,
        allow_new_mixture: bool = False,
        rank: Optional[int] = 0,
        world_size: Optional[int] = 1,
        shuffle: bool = False,
        eot: Optional[int] = None,
    ) -> None: ...
    @overload
    def next_batch(self, boundaries: Literal[False] = False) -> Batch:
        """Fresh int64 (inputs, targets) of shape [batch, seq_len]."""
    @overload
    def next_batch(self, boundaries: Literal[True]) -> BoundaryBatch:
        """(inputs, targets, positions int32 [B, T], cu_seqlens int32 [B, T + 1], -1 padded)."""
    def next_batch_sources(
        self,
    ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """``next_batch()`` plus each row's int32 source index."""
    @property
    def is_mixture(self) -> bool: ...
    @property
    def source_shards(self) -> List[List[str]]: ...
    @property
    def stages(self) -> List[Tuple[int, List[float]]]: ...
    def skip_batches(self, n: int) -> None:
        """Move past the next n batches without reading them (as n next_batch() calls)."""
    def cursor(self) -> Cursor:
        """The whole position, in the CLI's JSON form."""
    def restore(self, cursor: Cursor) -> None:
        """Continue from a cursor (checked strictly; unchanged on error)."""
    def state_dict(self) -> Cursor:
        """``cursor()``, for torch's Stateful protocol."""
    def load_state_dict(self, state_dict: Cursor) -> None:
        """``restore(state_dict)``, for torch's Stateful protocol."""
    def __getstate__(self) -> Dict[str, Any]:
        """The construction's arguments and the cursor (pickle, copy); never a token."""
    def __setstate__(self, state: Dict[str, Any]) -> None:
        """Re-open and re-check the shards, then restore the cursor."""
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def global_batch(self) -> int: ...
    @property
    def shuffle(self) -> bool: ...
    @property
    def shards(self) -> List[str]: ...
