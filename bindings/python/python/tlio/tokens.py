"""llm.c-style token shards and the exactly resumable token stream (tokens.md).

``read_tokens_header`` reads a shard's header, ``open_tokens`` maps a validated shard
read-only, and ``TokenStream`` yields [batch, seq_len] windows whose ``cursor()`` is the
whole position: ``restore(cursor)`` on a fresh stream over the same shards continues bit
for bit. Every rule is tlio's core, the same code as ``tlio tokens header`` and
``tlio tokens windows``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from tlio._tlio import tokens as _core

__all__ = ["read_tokens_header", "open_tokens", "TokenStream"]

PathLike = Union[str, "os.PathLike[str]"]


def read_tokens_header(path: PathLike) -> Dict[str, int]:
    """Read and check a shard's header against its file size, reading 1024 bytes only.

    ``path`` may be an ``s3://bucket/key`` URL: one range request reads the header.
    Returns ``{"magic", "version", "n", "vocab_size"}`` (``vocab_size`` 0 when the file
    records none). A malformed header or a size that disagrees with it is a
    ``ValueError`` naming the file and the rule; a missing file ``FileNotFoundError``.
    """
    return _core.read_tokens_header(os.fspath(path))


def open_tokens(path: PathLike, vocab_size: Optional[int] = None) -> np.memmap:
    """Validate a whole shard and return its ids as a read-only array over the file's map.

    The header, the exact size and every id (below the recorded vocabulary, else below
    ``vocab_size`` when given; a given ``vocab_size`` must equal a recorded one) are
    checked in one pass first. The array is ``uint16`` for version 1 and ``uint32`` for
    version 2 and llm.c's Llama-3 layout; a shard larger than memory costs nothing until
    read.
    """
    path = os.fspath(path)
    itemsize, n, offset = _core.validate_shard(path, vocab_size)
    dtype = np.dtype("<u2") if itemsize == 2 else np.dtype("<u4")
    if n == 0:
        # mmap cannot map zero bytes: an empty shard is an empty read-only array.
        empty = np.zeros(0, dtype=dtype)
        empty.flags.writeable = False
        return empty  # type: ignore[return-value]
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(n,))


def _process_group() -> Tuple[int, int]:
    """(rank, world size) of torch.distributed's default process group when torch is
    already imported and the group initialized, else (0, 1). torch is never imported
    here: a program that does not use it pays nothing."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def _plain(value: Any) -> Any:
    """numpy scalars as the Python numbers JSON takes; anything else is refused."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    raise ValueError(f"{value!r} ({type(value).__name__}) is not a JSON value")


def _cursor_json(cursor: Any) -> str:
    if not isinstance(cursor, dict):
        raise ValueError(
            f"a cursor is a dict {{'shard', 'offset', 'rng'}}, got {type(cursor).__name__}"
        )
    try:
        return json.dumps(cursor, default=_plain, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"cursor: {e}") from None


class TokenStream:
    """Windows of ``seq_len + 1`` ids over ``shards``, ``batch`` windows per batch (tokens.md).

    ``shards`` is a sequence of paths (a bare string is a ``ValueError``); an entry may
    be an ``s3://bucket/key`` URL, a URL with ``*`` in its last segment (the objects it
    matches, in key order) or a pack's ``.manifest.json`` (the shards it lists). Each
    object is fetched once into a verified local cache (``TLIO_CACHE_DIR``, else
    ``~/.cache/tlio``) and read as a local shard, so the batches are those of local
    copies, bit for bit; errors name the URL. ``rng`` a
    ``tlio.pcg.PCG32`` (or ``{"state": int, "inc": int}``) whose state is copied, so the
    stream and the generator never affect each other afterwards. Each pass over a shard
    starts at a phase drawn from the generator; windows are ``seq_len`` apart, so every
    token after the phase is a target once per pass.

    Ranks (data-parallel training): the global stream is the single-process stream with
    batch ``batch * world_size``; rank ``r`` gets windows ``r*batch .. (r+1)*batch`` of
    each global batch and skips the others' without reading them. The cursor is global
    (the same on every rank) and carries ``"global_batch"`` when ``world_size > 1``; it
    restores into any stream with the same global batch (elastic resumption). ``rank``
    or ``world_size`` ``None`` takes it from torch.distributed when torch is imported and
    its process group initialized, else 0 and 1.

    Pickling (and ``copy.copy`` / ``copy.deepcopy``, which go through it) keeps the
    construction's arguments and the cursor, never a token: the shards as absolute paths
    (resolved against the working directory of the construction), ``seq_len``,
    ``batch``, the generator as given, ``vocab_size``, and the resolved ``rank`` and
    ``world_size``. Unpickling constructs a new stream from them, so core re-opens and
    re-validates every shard (a shard missing or changed since is an error then), and
    restores the cursor: the copy's next batches are the original's, bit for bit, and
    the two never affect each other. This is what lets a ``spawn`` or ``forkserver``
    DataLoader worker receive a stream.

    Shuffled shard order (``shuffle=True``): each epoch (one pass over every shard)
    visits the shards in a permutation drawn from the stream's generator at the
    epoch's start (Fisher-Yates, before that epoch's first phase); passes within a shard
    are unchanged. The cursor then also carries ``"epoch_rng"``, the generator at the
    epoch's start, so it still resumes bit for bit, on any world size with the same
    global batch. A cursor without it (an in-order stream's) loads too: its epoch
    finishes in file order and the next one is shuffled. An in-order stream refuses a
    shuffled cursor. Without ``shuffle`` every batch and cursor is as before.

    Thread safety: one stream may be shared by threads; ``cursor()`` or
    ``state_dict()`` called while another thread is in ``next_batch()`` waits for that
    batch and returns the position after it. A long batch stays interruptible: Ctrl-C
    raises ``KeyboardInterrupt`` and leaves the stream where it was. A shard truncated
    or rewritten after it was opened is a ``ValueError`` naming it at the next read
    (shards are read with positioned reads, never a memory map, so no SIGBUS).
    """

    def __init__(
        self,
        shards: Sequence[PathLike],
        seq_len: int,
        batch: int,
        rng: Any,
        vocab_size: Optional[int] = None,
        *,
        rank: Optional[int] = 0,
        world_size: Optional[int] = 1,
        shuffle: bool = False,
    ) -> None:
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__}")
        if isinstance(shards, (str, bytes)):
            raise ValueError(
                f"shards must be a list of paths, not one string ({shards!r}); "
                "pass [path] for a single shard"
            )
        if rank is None or world_size is None:
            group_rank, group_size = _process_group()
            rank = group_rank if rank is None else rank
            world_size = group_size if world_size is None else world_size
        self._stream = _core.Stream(
            [os.fspath(p) for p in shards], seq_len, batch, rng, vocab_size, rank, world_size, shuffle
        )

    def next_batch(self) -> Tuple[np.ndarray, np.ndarray]:
        """The next ``batch`` windows: fresh int64 (inputs, targets) of shape [batch, seq_len].

        ``targets[:, t] == inputs[:, t + 1]``; a batch may span passes and shards.
        """
        return self._stream.next_batch()

    def cursor(self) -> Dict[str, Any]:
        """The whole position, in the CLI's JSON form.

        ``{"shard": s, "offset": o, "rng": {"state": "<16 hex>", "inc": "<16 hex>"}}``,
        where ``o`` is the offset of the next window (never the one just read), plus
        ``"global_batch": batch * world_size`` when ``world_size > 1``.
        """
        return json.loads(self._stream.cursor_json())

    def restore(self, cursor: Dict[str, Any]) -> None:
        """Continue from ``cursor`` (as ``cursor()`` returns it, or ``tlio tokens windows``
        saves it).

        Checked strictly: exactly the keys shard, offset, rng (and optionally
        global_batch, which must equal ``batch * world_size``); shard below the number of
        shards; 0 <= offset <= the shard's length (an offset where no window fits starts
        a new pass at the next read); an odd increment. On error the stream is unchanged.
        """
        self._stream.restore_json(_cursor_json(cursor))

    def state_dict(self) -> Dict[str, Any]:
        """``cursor()``, for torch's ``Stateful`` protocol."""
        return self.cursor()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """``restore(state_dict)``, for torch's ``Stateful`` protocol."""
        self.restore(state_dict)

    def __getstate__(self) -> Dict[str, Any]:
        """The construction's arguments (``init_args``), the cursor (``state_dict()``)
        and any other instance attributes (a subclass's), as plain values."""
        state: Dict[str, Any] = {"args": self._stream.init_args(), "cursor": self.state_dict()}
        attrs = {k: v for k, v in self.__dict__.items() if k != "_stream"}
        if attrs:
            state["attrs"] = attrs
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # The constructor and restore are the only ways in: the shards are re-opened and
        # checked as at construction, and the cursor is checked as any restore's.
        TokenStream.__init__(self, **state["args"])
        self.load_state_dict(state["cursor"])
        self.__dict__.update(state.get("attrs", {}))

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """Endless batches (the stream wraps around its shards)."""
        return self

    def __next__(self) -> Tuple[np.ndarray, np.ndarray]:
        return self._stream.next_batch()

    @property
    def seq_len(self) -> int:
        """T, the inputs per window."""
        return self._stream.seq_len

    @property
    def batch(self) -> int:
        """B, this process's windows per batch."""
        return self._stream.batch

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._stream.rank

    @property
    def world_size(self) -> int:
        """The number of ranks sharing the global batch."""
        return self._stream.world_size

    @property
    def global_batch(self) -> int:
        """``batch * world_size``, the windows of one global batch."""
        return self._stream.global_batch

    @property
    def shuffle(self) -> bool:
        """Whether each epoch visits the shards in a drawn order."""
        return self._stream.shuffle

    @property
    def shards(self) -> List[str]:
        """The shards' paths, in stream order."""
        return [str(p) for p in self._stream.shards]

    def __repr__(self) -> str:
        return (
            f"TokenStream({self.shards!r}, seq_len={self.seq_len}, batch={self.batch}, "
            f"rank={self.rank}, world_size={self.world_size}, shuffle={self.shuffle})"
        )
