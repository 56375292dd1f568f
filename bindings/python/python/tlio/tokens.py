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


def _source_entries(shards: Any, j: int) -> Tuple[str, List[str]]:
    """One source's shards: a path, a ``*`` pattern, a manifest or an ``s3://`` URL, or
    a list of them; returns its name for messages and the entries."""
    if isinstance(shards, (str, os.PathLike)):
        entry = os.fspath(shards)
        return str(entry), [str(entry)]
    if isinstance(shards, bytes):
        raise TypeError(f"source {j}: shards must be str paths, not bytes")
    try:
        entries = [os.fspath(p) for p in shards]
    except TypeError:
        raise TypeError(
            f"source {j}: shards must be a path, a pattern or a list of paths, "
            f"got {type(shards).__name__}"
        ) from None
    if not entries:
        raise ValueError(f"source {j} has no shards: a source needs at least one")
    name = entries[0] if len(entries) == 1 else f"{entries[0]} and {len(entries) - 1} more"
    return str(name), [str(e) for e in entries]


def _weight(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{where} must be a number, got {type(value).__name__}")
    return float(value)


def _mixture_args(
    sources: Sequence[Any], stages: Optional[Sequence[Any]]
) -> Tuple[List[Tuple[str, List[str]]], List[Tuple[int, List[float]]]]:
    """``sources=[(shards, weight), ...]`` (or bare shards when ``stages`` gives every
    weight) and ``stages=[(batch, weights), ...]`` as the core's arguments. Weights
    given in both places must agree with the first stage; every rule on the values
    themselves (finite, > 0, summing to 1, stages increasing from 0) is core's."""
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence):
        raise TypeError("sources must be a list of (shards, weight) pairs")
    named: List[Tuple[str, List[str]]] = []
    weights: List[Optional[float]] = []
    for j, source in enumerate(sources):
        if isinstance(source, tuple) and len(source) == 2:
            shards, weight = source
            weights.append(_weight(weight, f"the weight of source {j}"))
        elif stages is not None:
            shards = source
            weights.append(None)
        else:
            raise TypeError(f"source {j} must be a (shards, weight) pair, got {source!r}")
        named.append(_source_entries(shards, j))
    if stages is None:
        return named, [(0, [w for w in weights if w is not None])]
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence):
        raise TypeError("stages must be a list of (global batch, weights) pairs")
    plan: List[Tuple[int, List[float]]] = []
    for k, stage in enumerate(stages):
        if not isinstance(stage, (tuple, list)) or len(stage) != 2:
            raise TypeError(f"stage {k} must be a (global batch, weights) pair, got {stage!r}")
        at, ws = stage
        if isinstance(at, bool) or not isinstance(at, (int, np.integer)):
            raise TypeError(f"stage {k}'s global batch must be an int, got {type(at).__name__}")
        plan.append((int(at), [_weight(w, f"stage {k}'s weight") for w in ws]))
    given = [w for w in weights if w is not None]
    if given and (len(given) != len(weights) or not plan or given != plan[0][1]):
        raise ValueError(
            f"the sources' weights {weights} differ from the first stage's "
            f"{plan[0][1] if plan else []}: give the weights in one place"
        )
    return named, plan


class TokenStream:
    """Windows of ``seq_len + 1`` ids over ``shards``, ``batch`` windows per batch (tokens.md).

    ``shards`` is a sequence of paths (a bare string is a ``ValueError``); an entry may
    be an ``s3://bucket/key`` URL, a URL with ``*`` in its last segment (the objects it
    matches, in key order) or a pack's ``.manifest.json`` (the shards it lists). Each
    object is fetched once into a verified local cache (under ``s3/`` of
    ``TLIO_CACHE_DIR``, else of ``$XDG_CACHE_HOME/tlio``, else of ``~/.cache/tlio``)
    and read as a local shard, so the batches are those of local copies, bit for bit; errors name the URL. ``rng`` a
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

    Mixtures (``sources=[("web/*.bin", 0.6), ("code/*.bin", 0.3), ("math.bin", 0.1)]``,
    scale.md section 8): each source (a path, a ``*`` pattern in the last segment, a
    manifest, an ``s3://`` URL, or a list of them) is a stream of its own, with its own
    passes, phases, shuffle order and epochs, from its own generator derived from
    ``rng`` and the source's index (``docs/tokens.md`` gives the rule; appending a
    source never changes the others' draws). Window ``g`` of the run (numbered across
    global batches) comes from the source ``j`` maximising ``w_j * (k + 1) - n_j``
    (``k`` the window's index in its stage, ``n_j`` the stage's earlier windows from
    ``j``; ties to the lowest ``j``): no generator, so every global batch holds each
    source's share within two windows. Weights are finite and above 0, and must sum to 1
    within 1e-6 (never renormalised silently). ``stages=[(0, w0), (b1, w1), ...]``
    changes the weights at global batches (the counts restart at each stage's first
    window); with ``stages`` the sources may be bare shards. The cursor holds every
    source's cursor, the next global window, the stage and its counts, and the stages'
    weights with a digest of each source's shards: a cursor of another mixture is a
    ``ValueError`` naming the difference, unless ``allow_new_mixture=True`` (each source
    resumes where it was, a new stage of this mixture's weights starts at the next
    global batch). ``next_batch_sources()`` also returns each row's source.

    Document boundaries (packed attention, scale.md section 8):
    ``next_batch(boundaries=True)`` returns ``(inputs, targets, positions,
    cu_seqlens)``. ``positions`` (int32 [batch, seq_len]) is each input's distance from
    the start of its document, or from the window's start when the document began
    before the window: the ``position_ids`` of transformers'
    ``DataCollatorWithFlattening``. ``cu_seqlens`` (int32 [batch, seq_len + 1]) is row
    by row the cumulative lengths ``0, s1, ..., seq_len`` of the window's document
    pieces (``s_i`` the document starts inside it), padded with -1 to the fixed width
    ``seq_len + 1`` (a document at every input needs all of it). Documents start where
    each shard's sidecar ``X.docs`` (written by ``tlio tokens pack --tokenizer``) says,
    else at each id ``eot`` (the end-of-text id a pack writes before each document);
    a shard with neither is a ``ValueError`` naming it. Mixtures do not give boundaries
    yet (``ValueError``).

    Thread safety: one stream may be shared by threads; ``cursor()`` or
    ``state_dict()`` called while another thread is in ``next_batch()`` waits for that
    batch and returns the position after it. A long batch stays interruptible: Ctrl-C
    raises ``KeyboardInterrupt`` and leaves the stream where it was. A shard truncated
    or rewritten after it was opened is a ``ValueError`` naming it at the next read
    (shards are read with positioned reads, never a memory map, so no SIGBUS).
    """

    def __init__(
        self,
        shards: Optional[Sequence[PathLike]] = None,
        seq_len: Optional[int] = None,
        batch: Optional[int] = None,
        rng: Any = None,
        vocab_size: Optional[int] = None,
        *,
        sources: Optional[Sequence[Any]] = None,
        stages: Optional[Sequence[Tuple[int, Sequence[float]]]] = None,
        allow_new_mixture: bool = False,
        rank: Optional[int] = 0,
        world_size: Optional[int] = 1,
        shuffle: bool = False,
        eot: Optional[int] = None,
    ) -> None:
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__}")
        if not isinstance(allow_new_mixture, bool):
            raise TypeError(
                f"allow_new_mixture must be a bool, got {type(allow_new_mixture).__name__}"
            )
        for name, value in (("seq_len", seq_len), ("batch", batch), ("rng", rng)):
            if value is None:
                raise TypeError(f"TokenStream needs {name}")
        if rank is None or world_size is None:
            group_rank, group_size = _process_group()
            rank = group_rank if rank is None else rank
            world_size = group_size if world_size is None else world_size
        self._allow_new_mixture = allow_new_mixture
        if sources is not None or stages is not None:
            if shards is not None:
                raise ValueError("give shards or sources=[(shards, weight), ...], not both")
            if sources is None:
                raise ValueError("stages= needs sources=[(shards, weight), ...]")
            if eot is not None:
                raise ValueError("eot= is not available for mixtures (sources=) yet")
            named, plan = _mixture_args(sources, stages)
            self._stream = _core.Mixture(
                named, plan, seq_len, batch, rng, vocab_size, rank, world_size, shuffle
            )
            return
        if shards is None:
            raise TypeError("TokenStream needs shards (or sources=[(shards, weight), ...])")
        if isinstance(shards, (str, bytes)):
            raise ValueError(
                f"shards must be a list of paths, not one string ({shards!r}); "
                "pass [path] for a single shard"
            )
        self._stream = _core.Stream(
            [os.fspath(p) for p in shards],
            seq_len,
            batch,
            rng,
            vocab_size,
            rank,
            world_size,
            shuffle,
            eot,
        )

    @property
    def is_mixture(self) -> bool:
        """Whether the stream mixes several sources (``sources=``)."""
        return isinstance(self._stream, _core.Mixture)

    def next_batch_sources(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``next_batch()`` plus the int32 source index of each row (a single-source
        stream's rows are all source 0)."""
        if self.is_mixture:
            return self._stream.next_batch()
        inputs, targets = self._stream.next_batch()
        return inputs, targets, np.zeros(inputs.shape[0], dtype=np.int32)

    def next_batch(self, boundaries: bool = False) -> Any:
        """The next ``batch`` windows: fresh int64 (inputs, targets) of shape [batch, seq_len].

        ``targets[:, t] == inputs[:, t + 1]``; a batch may span passes and shards. With
        ``boundaries=True``, also the int32 ``positions`` [batch, seq_len] and
        ``cu_seqlens`` [batch, seq_len + 1] of the windows' documents (see the class).
        """
        if not isinstance(boundaries, bool):
            raise TypeError(f"boundaries must be a bool, got {type(boundaries).__name__}")
        if boundaries:
            if self.is_mixture:
                raise ValueError("boundaries=True is not available for mixtures (sources=) yet")
            return self._stream.next_batch_boundaries()
        if self.is_mixture:
            inputs, targets, _ = self._stream.next_batch()
            return inputs, targets
        return self._stream.next_batch()

    def skip_batches(self, n: int) -> None:
        """Move past the next ``n`` batches without reading a token: afterwards the
        cursor is the one ``n`` calls of ``next_batch()`` would leave (windows are a
        pure function of the position, so only the passes' phases are drawn). With
        ranks a batch is a global batch, skipped on every rank alike. A mixture walks
        its rule over the skipped windows (one step per window, still no token read).
        This is how ``tlio.torch.TokenDataset``'s worker ``k`` of ``N`` takes batches
        ``k, k + N, ...``. ``n`` is an int >= 0; Ctrl-C stops a long skip with
        ``KeyboardInterrupt`` and leaves the stream where it was."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"skip_batches takes an int, got {type(n).__name__}")
        if not 0 <= n < 2**64:
            raise ValueError(f"skip_batches takes 0 <= n < 2**64, got {n}")
        self._stream.skip_batches(int(n))

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
        if self.is_mixture:
            self._stream.restore_json(_cursor_json(cursor), self._allow_new_mixture)
        else:
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
        if self.is_mixture:
            args = state["args"]
            # Each source as its entries (absolute), its weights in the stages.
            args["sources"] = [list(paths) for _, paths in args["sources"]]
            args["stages"] = [(b, list(w)) for b, w in args["stages"]]
            args["allow_new_mixture"] = self._allow_new_mixture
        attrs = {
            k: v for k, v in self.__dict__.items() if k not in ("_stream", "_allow_new_mixture")
        }
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
        return self.next_batch()

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
        """The shards' paths, in stream order (a mixture's: every source's, in order)."""
        if self.is_mixture:
            return [str(p) for source in self._stream.source_shards for p in source]
        return [str(p) for p in self._stream.shards]

    @property
    def source_shards(self) -> List[List[str]]:
        """Each source's shards (a single-source stream is one source)."""
        if self.is_mixture:
            return [[str(p) for p in source] for source in self._stream.source_shards]
        return [self.shards]

    @property
    def stages(self) -> List[Tuple[int, List[float]]]:
        """The normalised stages ``[(global batch, [weights])]`` (``[(0, [1.0])]`` for a
        single-source stream)."""
        if self.is_mixture:
            return [(b, list(w)) for b, w in self._stream.stages]
        return [(0, [1.0])]

    def __repr__(self) -> str:
        if self.is_mixture:
            return (
                f"TokenStream(sources={self.source_shards!r}, stages={self.stages!r}, "
                f"seq_len={self.seq_len}, batch={self.batch}, rank={self.rank}, "
                f"world_size={self.world_size}, shuffle={self.shuffle})"
            )
        return (
            f"TokenStream({self.shards!r}, seq_len={self.seq_len}, batch={self.batch}, "
            f"rank={self.rank}, world_size={self.world_size}, shuffle={self.shuffle})"
        )
