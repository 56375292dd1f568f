"""Sharded checkpoints of ``tlio.torch`` (scale.md section 1): a model or optimizer whose
state holds ``DTensor``s (FSDP2 ``fully_shard``, ``parallelize_module``, 2-D meshes,
HSDP) is saved by every rank and loaded, resharded, into any layout.

Save, on every rank of the group: rank 0 ``begin``s the step (lock, refusals, a fresh
``step-N.tmp/`` holding a probe) and broadcasts its path and the probe's token; every
rank checks that it sees that probe (a directory local to rank 0's host fails the save
at once on every rank, naming it as not shared, before any file is written), extracts
its local chunks (global offsets and sizes from each DTensor's mesh and placements; a
plain tensor is a chunk covering the whole tensor) and all ranks exchange the small
chunk lists; every chunk is then given to exactly one of the ranks that hold it (a
replicated one to the least loaded of its holders, by bytes), and each rank writes its chunks into files of its own
(``model-rankNNNNN.safetensors``, ``optimizer-rankNNNNN.safetensors``), hashed while
written, by the core; rank 0 gathers the small tables and commits (coverage checked,
shards.json and MANIFEST.json written, renames, LATEST) or aborts. An async save
(``blocking=False``) extracts and stages every rank's chunks in the call and runs the
rest, from ``begin`` on, in the background on ``tlio._torch_async``'s own gloo group.

Load: rank 0 opens the step a load picks and broadcasts its number; every rank opens
that step, computes the regions its local shards need (the whole tensor for a plain
one), reads them into fresh tensors (the core reads only overlapping pieces and
verifies each), and all ranks agree before anything is applied: a digest mismatch on any
rank makes every rank fall back to the next older step (with ``step=None``; a named step
is raised as a ``FileNotFoundError`` naming it), any other failure is raised on every
rank. The optimizer follows parameter names (tlio.torch's own rules).

Invariants: the rules (chunk table, coverage, digests, read plans, commit) are the
core's (``tlio._tlio.sharded``); this module converts tensors to byte views and back and
runs the collectives. Every collective runs on gloo with a timeout (the default group's
when it includes gloo, else torch's default for a gloo group of its own), so a dead or
stuck rank ends in an exception, never a hang. An error on any rank is raised on every rank, naming the rank;
nothing is committed then. Only small tables travel between ranks, never tensor data.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

import numpy as np
import torch

F = TypeVar("F", bound=Callable[..., Any])

MODEL = "model"
OPTIMIZER = "optimizer"
#: The metadata key holding the optimizer JSON (as optimizer.safetensors' metadata).
STATE_KEY = "state"
#: Data files of rank r: ``<group>-rank<r, five digits>.safetensors``.
FILE_DIGITS = 5


def _sharded():
    from tlio._tlio import sharded

    return sharded


def _dtensor_type() -> Optional[type]:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


def _is_dtensor(t: Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def holds_dtensors(model: Any, optimizer: Any = None) -> bool:
    """Whether the model's parameters or buffers, or the optimizer's state, hold a DTensor."""
    if not isinstance(model, torch.nn.Module) or _dtensor_type() is None:
        return False
    if any(_is_dtensor(t) for t in model.parameters()) or any(_is_dtensor(t) for t in model.buffers()):
        return True
    if isinstance(optimizer, torch.optim.Optimizer):
        return any(_is_dtensor(v) for s in optimizer.state.values() for v in s.values())
    return False


# ---------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------

_GROUPS: Dict[int, Any] = {}


class Group:
    """The ranks of a sharded save or load: torch.distributed's default group seen through
    a gloo group (the default itself when it is gloo) whose timeout bounds every exchange;
    a single process (``dist`` None) is a group of one."""

    def __init__(self, solo: bool = False, pg: Any = None) -> None:
        dist = torch.distributed
        self.dist = dist if not solo and dist.is_available() and dist.is_initialized() else None
        if self.dist is None:
            self.rank, self.size, self.pg = 0, 1, None
            return
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        default = dist.distributed_c10d._get_default_group()
        if pg is not None:  # the async saves' own group (tlio._torch_async.group)
            self.pg = pg
        elif "gloo" in str(dist.get_backend()).lower():
            self.pg = default
        else:  # tables travel as CPU objects: a gloo group of its own (torch's default
            # timeout for gloo), created once per default group, by every rank alike
            key = id(default)
            if key not in _GROUPS:
                _GROUPS[key] = dist.new_group(backend="gloo")
            self.pg = _GROUPS[key]

    def all_gather(self, value: Any) -> List[Any]:
        if self.dist is None:
            return [value]
        out: List[Any] = [None] * self.size
        self.dist.all_gather_object(out, value, group=self.pg)
        return out

    def broadcast(self, value: Any) -> Any:
        if self.dist is None:
            return value
        box = [value]
        self.dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]


#: An outcome exchanged between ranks: ``None`` or a failure record (``tlio._torch_dist``).
Failure = Optional[str]


def _failure(e: BaseException) -> str:
    from tlio._torch_failure import record

    return record(e)


def _raise_first(outcomes: Sequence[Failure], rank: int, error: Optional[BaseException]) -> None:
    """Raise the first failure of ``outcomes`` (by rank): this rank's own exception when it
    is this rank's, else the other rank's, naming it (tlio._torch_dist's rules)."""
    from tlio._torch_failure import _raise

    for r, failure in enumerate(outcomes):
        if failure is None:
            continue
        if r == rank and error is not None:
            raise error
        _raise(r, failure)


# ---------------------------------------------------------------------------------------
# Local chunks
# ---------------------------------------------------------------------------------------


def _local_box(t: Any) -> Tuple[torch.Tensor, List[int], List[int]]:
    """(local tensor, global offsets, sizes) of this rank's chunk of ``t``; a plain tensor
    is its own whole chunk. A zero-element chunk of a non-empty tensor has sizes with a 0."""
    if not _is_dtensor(t):
        return t, [0] * t.dim(), list(t.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for p in t.placements:
        if p.is_partial():
            raise ValueError("a DTensor with a Partial placement holds no saved value; reduce it first")
    local = t.to_local()
    sizes, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if list(local.shape) != list(sizes):
        raise ValueError(f"local shard of shape {tuple(local.shape)} is not the {tuple(sizes)} its placements give")
    if t.numel() == 0:
        return local, [0] * t.dim(), list(t.shape)
    return local, list(offsets), list(sizes)


def _numel(sizes: Sequence[int]) -> int:
    n = 1
    for z in sizes:
        n *= z
    return n


def _bytes(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of a CPU tensor as a 1-D uint8 array sharing its memory when contiguous."""
    c = t.detach().cpu().contiguous()
    return c.reshape(-1).view(torch.uint8).numpy()


class Chunk:
    """One local chunk of one global tensor: its table entry and its tensor."""

    __slots__ = ("group", "name", "dtype", "shape", "offsets", "sizes", "tensor")

    def __init__(self, group: str, name: str, t: Any) -> None:
        from tlio.torch import _DTYPES

        try:
            self.dtype = _DTYPES[t.dtype][0]
        except KeyError:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which tlio.torch cannot store") from None
        self.group, self.name, self.shape = group, name, list(t.shape)
        try:
            self.tensor, self.offsets, self.sizes = _local_box(t)
        except ValueError as e:
            raise ValueError(f"tensor {name!r}: {e}") from None

    def id(self) -> Tuple[str, str, Tuple[int, ...], Tuple[int, ...]]:
        return self.group, self.name, tuple(self.offsets), tuple(self.sizes)

    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def key(self) -> str:
        """Its key in a data file: the name and the offsets (unique within a file)."""
        return f"{self.name}@{','.join(map(str, self.offsets))}"

    def entry(self) -> list:
        """What the other ranks learn of it."""
        return [self.group, self.name, self.dtype, self.shape, self.offsets, self.sizes, self.nbytes()]


def _model_chunks(model: torch.nn.Module) -> Tuple[List[Chunk], Dict[str, str]]:
    """Every distinct tensor of the state_dict as a chunk (ties once, under the first name)
    and the tie map {other name: stored name}."""
    from tlio.torch import _storage_key

    params = dict(model.named_parameters(remove_duplicate=False))
    chunks, tied, first = [], {}, {}
    for name, t in model.state_dict().items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"state_dict entry {name!r} is {type(t).__name__}, not a tensor")
        key = _storage_key(t.to_local() if _is_dtensor(t) else t, params.get(name))
        if key in first:
            tied[name] = first[key]
            continue
        first[key] = name
        chunks.append(Chunk(MODEL, name, t))
    return chunks, tied


def _optimizer_chunks(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Tuple[List[Chunk], str]:
    """Every tensor of the optimizer's state as a chunk ``<param>.<key>`` and the optimizer
    JSON (tlio.torch's: type, param groups by name, the non-tensor state)."""
    from tlio.checkpoint import _json
    from tlio.torch import TYPE_PREFIX, _param_names, _plain

    names = _param_names(model)
    groups, state, chunks = [], {}, []
    for g in optimizer.param_groups:
        group_names = []
        for p in g["params"]:
            name = names.get(id(p))
            if name is None:
                raise ValueError(
                    f"the optimizer holds a parameter of shape {tuple(p.shape)} that the model does not name"
                )
            group_names.append(name)
            for key, v in optimizer.state.get(p, {}).items():
                if not isinstance(key, str) or "." in key:
                    raise ValueError(f"optimizer state key {key!r} of {name!r} is not a plain name")
                if isinstance(v, torch.Tensor):
                    chunks.append(Chunk(OPTIMIZER, f"{name}.{key}", v))
                else:
                    state.setdefault(name, {})[key] = _plain(v, f"optimizer state {name}.{key}")
        hyper = {k: _plain(v, f"param group {k!r}") for k, v in g.items() if k != "params"}
        groups.append({**hyper, "params": group_names})
    doc = {"type": TYPE_PREFIX + type(optimizer).__name__, "param_groups": groups, "state": state}
    return chunks, _json("optimizer state", doc, separators=(",", ":"))


def assign_writers(entries: Sequence[Sequence[list]]) -> Dict[tuple, int]:
    """The rank that writes each chunk, from every rank's chunk entries (``Chunk.entry``):
    a chunk one rank holds is that rank's; a replicated one (several holders) goes, largest
    first, to the holder with the fewest bytes so far (ties: the lowest rank). Every rank
    computes the same answer from the same lists. A tensor whose dtype or global shape
    differs between ranks is a ValueError."""
    holders: Dict[tuple, List[int]] = {}
    size: Dict[tuple, int] = {}
    kind: Dict[Tuple[str, str], Tuple[str, list, int]] = {}
    for rank, mine in enumerate(entries):
        for group, name, dtype, shape, offsets, sizes, nbytes in mine:
            seen = kind.setdefault((group, name), (dtype, shape, rank))
            if seen[:2] != (dtype, shape):
                raise ValueError(
                    f"{group} tensor {name!r} is {seen[0]} {seen[1]} on rank {seen[2]} but {dtype} {shape} on rank {rank}"
                )
            cid = (group, name, tuple(offsets), tuple(sizes))
            holders.setdefault(cid, []).append(rank)
            size[cid] = nbytes
    load = [0] * len(entries)
    writer: Dict[tuple, int] = {}
    for cid, ranks in holders.items():
        if len(ranks) == 1:
            writer[cid] = ranks[0]
            load[ranks[0]] += size[cid]
    for cid in sorted((c for c, r in holders.items() if len(r) > 1), key=lambda c: (-size[c], c)):
        best = min(holders[cid], key=lambda r: (load[r], r))
        writer[cid] = best
        load[best] += size[cid]
    return writer


def file_name(group: str, rank: int) -> str:
    return f"{group}-rank{rank:0{FILE_DIGITS}d}.safetensors"


# ---------------------------------------------------------------------------------------
# Save
# ---------------------------------------------------------------------------------------


def _prepare(model, optimizer, stream, extra, config, keep, step, state=None) -> dict:
    """Everything this rank saves, checked: its chunks, the tie map, the optimizer JSON,
    the trainer state, rng, config and the ``state=`` states (tlio.torch.save's rules)."""
    from tlio import _torch_args, _torch_state
    from tlio.checkpoint import EXTRA_KEYS, _integer, _json, _rng
    from tlio.torch import TIED_KEY, _stream_state

    extra = _torch_args.save(model, optimizer, stream, extra, config, False, state)
    unknown = [k for k in extra if k not in EXTRA_KEYS]
    if unknown:
        raise ValueError(f"extra has unknown key {unknown[0]!r} (allowed: {', '.join(EXTRA_KEYS)})")
    rng = None
    if stream is not None:
        if "data_cursor" in extra:
            raise ValueError("extra['data_cursor'] and stream both give the data position; pass one")
        extra["data_cursor"], rng = _stream_state(stream)
    state_json = _json("extra", {"step": _integer("step", step), **extra})
    config_bytes = None
    if config is not None:
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")
        config_bytes = (_json("config", config, indent=2) + "\n").encode()
    chunks, tied = _model_chunks(model)
    meta: Dict[str, Dict[str, str]] = {MODEL: {TIED_KEY: json.dumps(tied, separators=(",", ":"))} if tied else {}}
    states = _torch_state.encode(state or {})
    if states is not None:
        meta[MODEL][_torch_state.STATE_KEY] = states
    if optimizer is not None:
        opt_chunks, opt_json = _optimizer_chunks(model, optimizer)
        chunks += opt_chunks
        meta[OPTIMIZER] = {STATE_KEY: opt_json}
    # A rank's empty share of a non-empty tensor (an uneven split) is no chunk at all; an
    # empty tensor is one empty chunk, held by every rank.
    chunks = [c for c in chunks if _numel(c.sizes) or not _numel(c.shape)]
    return {
        "chunks": chunks, "meta": meta, "state_json": state_json, "rng": _rng(rng),
        "config": config_bytes, "keep": None if keep is None else _integer("keep", keep),
    }


def _write(tmp_dir: str, rank: int, chunks: List[Chunk], writer: Dict[tuple, int]) -> List[dict]:
    """This rank's data files: the chunks assigned to it, one file per group."""
    core = _sharded()
    tables = []
    for group in (MODEL, OPTIMIZER):
        mine = [c for c in chunks if c.group == group and writer.get(c.id()) == rank]
        if not mine:
            continue
        items = [(c.key(), c.dtype, c.sizes, _bytes(c.tensor)) for c in mine]
        tables.append(core.write_rank_file(tmp_dir, file_name(group, rank), items))
    return tables


def _table(entries: Sequence[Sequence[list]], writer: Dict[tuple, int]) -> List[dict]:
    """The chunk table's tensors for commit: every global tensor, its chunks, where each lies."""
    tensors: Dict[Tuple[str, str], dict] = {}
    for mine in entries:
        for group, name, dtype, shape, offsets, sizes, _ in mine:
            t = tensors.setdefault((group, name), {"group": group, "name": name, "dtype": dtype,
                                                   "shape": shape, "chunks": {}})
            cid = (group, name, tuple(offsets), tuple(sizes))
            if cid in t["chunks"]:
                continue
            key = f"{name}@{','.join(map(str, offsets))}"
            t["chunks"][cid] = {"offsets": offsets, "sizes": sizes, "file": file_name(group, writer[cid]), "key": key}
    out = []
    for (group, name) in sorted(tensors):
        t = tensors[(group, name)]
        out.append({**t, "chunks": [t["chunks"][c] for c in sorted(t["chunks"])]})
    return out


def save(dir: Any, step: Any, model: Any, optimizer: Any = None, stream: Any = None, *,
         extra: Any = None, keep: Any = None, config: Any = None, overwrite: bool = False,
         blocking: bool = True, state: Any = None) -> Any:
    """tlio.torch.save for a state holding DTensors: the collective sharded save. With
    ``blocking=False`` this rank's chunks are staged now (``tlio._torch_async``) and the
    collective write and commit are returned as a ``Deferred`` for the background, on
    the async saves' own process group."""
    if blocking:
        return _commit(Group(), dir, step, overwrite,
                       lambda: _prepare(model, optimizer, stream, extra, config, keep, step, state))
    from tlio import _torch_async

    g = Group(pg=_torch_async.group())
    prepared: Optional[dict] = None
    error: Optional[BaseException] = None
    try:
        stage = _torch_async.stager()
        prepared = _prepare(model, optimizer, stream, extra, config, keep, step, state)
        for c in prepared["chunks"]:
            c.tensor = stage.copy((c.group, c.name), c.tensor)
        stage.finish()
    except BaseException as e:  # raised here at once, and by the other ranks' wait
        error = e

    def staged() -> dict:
        if error is not None:
            raise error
        assert prepared is not None
        return prepared

    return _torch_async.Deferred(lambda: _commit(g, dir, step, overwrite, staged), error, step)


def _commit(g: Group, dir: Any, step: Any, overwrite: bool, prepare: Callable[[], dict]) -> str:
    """The collective part of a sharded save on ``g``'s ranks; ``prepare`` gives this
    rank's checked state (``_prepare``) or raises why it has none."""
    # 1. rank 0 begins the step (lock, refusals, fresh tmp dir).
    handle = None
    error: Optional[BaseException] = None
    outcome: Any = None
    if g.rank == 0:
        try:
            from tlio.checkpoint import _integer

            handle = _sharded().begin(os.fspath(dir), _integer("step", step), bool(overwrite))
            outcome = ("ok", handle.tmp_dir, str(step), handle.probe)
        except BaseException as e:
            error, outcome = e, ("failed", _failure(e))
    outcome = g.broadcast(outcome)
    if outcome[0] != "ok":
        _raise_first([outcome[1]], 0, error)
    tmp_dir, probe = outcome[1], outcome[3]
    try:
        # 2. every rank sees rank 0's directory (not one of its host's own), extracts its
        # chunks; all learn every rank's chunks.
        prepared: Optional[dict] = None
        mine: Failure = None
        try:
            if probe is not None:
                _sharded().check_shared(tmp_dir, probe)
            if str(step) != outcome[2]:
                raise ValueError(f"tlio.torch.save: this rank saves step {step}, rank 0 step {outcome[2]}")
            prepared = prepare()
            entries_mine = [c.entry() for c in prepared["chunks"]]
        except BaseException as e:
            error, mine, entries_mine = e, _failure(e), []
        gathered = g.all_gather((mine, entries_mine))
        _raise_first([f for f, _ in gathered], g.rank, error)
        entries = [e for _, e in gathered]
        # 3. the writers, then every rank writes its files; rank 0 learns their tables.
        tables: List[dict] = []
        try:
            writer = assign_writers(entries)
            assert prepared is not None
            tables = _write(tmp_dir, g.rank, prepared["chunks"], writer)
        except BaseException as e:
            error, mine = e, _failure(e)
        gathered = g.all_gather((mine, tables))
        _raise_first([f for f, _ in gathered], g.rank, error)
        # 4. rank 0 commits; every rank learns the outcome.
        outcome = None
        if g.rank == 0:
            try:
                assert handle is not None and prepared is not None
                files = [t for _, ts in gathered for t in ts]
                path = handle.commit(files, _table(entries, writer), prepared["meta"], prepared["state_json"],
                                     prepared["rng"], prepared["config"], prepared["keep"])
                outcome = ("ok", path)
            except BaseException as e:
                error, outcome = e, ("failed", _failure(e))
        outcome = g.broadcast(outcome)
        if outcome[0] != "ok":
            _raise_first([outcome[1]], 0, error)
        return outcome[1]
    finally:
        if handle is not None:
            handle.abort()  # after a commit: nothing left to remove, the lock released


# ---------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------


class Corrupt(Exception):
    """A read whose bytes did not verify: with no named step the ranks fall back to an
    older one; a named step is refused."""


class Want:
    """A region this rank needs of one saved tensor, the fresh tensor it is read into, and
    how to make it the state's value (a DTensor like ``like``, or the tensor itself)."""

    __slots__ = ("group", "name", "offsets", "sizes", "out", "like")

    def __init__(self, group: str, name: str, dtype: str, shape: List[int], like: Any, what: str) -> None:
        from tlio.torch import _FROM_ST

        try:
            torch_dtype = _FROM_ST[dtype][0]
        except KeyError:
            raise ValueError(f"{what} is {dtype}, which tlio.torch cannot load") from None
        self.group, self.name = group, name
        self.like = like if _is_dtensor(like) else None
        if self.like is not None:
            _, self.offsets, self.sizes = _local_box(like)
            if list(like.shape) != list(shape):
                raise ValueError(f"{what} has shape {tuple(shape)}, the model's is {tuple(like.shape)}")
        else:
            if isinstance(like, torch.Tensor) and list(like.shape) != list(shape):
                raise ValueError(f"{what} has shape {tuple(shape)}, the model's is {tuple(like.shape)}")
            self.offsets, self.sizes = [0] * len(shape), list(shape)
        self.out = torch.empty(self.sizes, dtype=torch_dtype)

    def value(self) -> Any:
        if self.like is None:
            return self.out
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(self.out, self.like.device_mesh, self.like.placements, run_check=False,
                                  shape=self.like.shape, stride=self.like.stride())


def _plan(handle: Any, model: torch.nn.Module, optimizer: Any) -> Tuple[List[Want], Dict[str, str]]:
    """What to read for the model's state_dict (ties resolved) and the optimizer's state:
    the wants and the tie map. A state the step does not match (a missing or unexpected
    name, another shape, no optimizer state) is a ValueError."""
    from tlio.torch import TIED_KEY, _param_names

    path = handle.path
    saved = handle.tensors()
    meta = handle.meta
    try:
        tied = json.loads(meta.get(MODEL, {}).get(TIED_KEY, "{}"))
    except ValueError:
        raise ValueError(f"{path}: model metadata `{TIED_KEY}` is not JSON") from None
    sd = model.state_dict()
    stored = {n for (g, n) in saved if g == MODEL}
    wants: List[Want] = []
    for name, t in sd.items():
        if name in tied:
            continue
        if name not in stored:
            raise ValueError(f"{path}: the model's {name!r} is not in the checkpoint")
        dtype, shape = saved[(MODEL, name)]
        w = Want(MODEL, name, dtype, shape, t, f"{path}: tensor {name!r}")
        if w.out.dtype != t.dtype:
            raise ValueError(
                f"{path}: tensor {name!r} is {w.out.dtype} in the checkpoint and {t.dtype} in the model "
                "(tlio.torch never casts)"
            )
        wants.append(w)
    extra = sorted(stored - set(sd))
    if extra:
        raise ValueError(f"{path}: the checkpoint holds {extra[0]!r}, which the model does not have")
    if optimizer is not None:
        if OPTIMIZER not in meta or STATE_KEY not in meta[OPTIMIZER]:
            raise ValueError(f"{path} holds no optimizer state to restore the optimizer from")
        names = _param_names(model)
        params = {names[id(p)]: p for g in optimizer.param_groups for p in g["params"] if id(p) in names}
        for (group, full), (dtype, shape) in saved.items():
            if group != OPTIMIZER:
                continue
            pname = full.rpartition(".")[0]
            p = params.get(pname)
            if p is None:
                raise ValueError(f"{path}: tensor {full!r} is for a parameter the optimizer does not hold")
            # A state tensor shaped like its parameter is sharded like it; any other (a
            # step count) is whole on every rank.
            like = p if _is_dtensor(p) and list(shape) == list(p.shape) else None
            wants.append(Want(OPTIMIZER, full, dtype, shape, like, f"{path}: tensor {full!r}"))
    return wants, tied


def _read(handle: Any, wants: List[Want]) -> None:
    reads = [(w.group, w.name, w.offsets, w.sizes, w.out.reshape(-1).view(torch.uint8).numpy())
             for w in wants if w.out.numel()]
    try:
        handle.read_many(reads)
    except ValueError as e:
        raise Corrupt(str(e)) from None


def is_sharded_step(path: str) -> bool:
    """Whether a verified step directory holds a sharded save (its manifest lists the
    chunk table)."""
    try:
        name = _sharded().SHARDS_NAME
    except ImportError:  # an extension without sharded checkpoints picks no sharded step
        return False
    return os.path.exists(os.path.join(path, name))


def _open(dir: str, step: Optional[int], below: Optional[int] = None) -> Any:
    """The step ``load``'s rules pick (exactly ``step`` when it is given), or with
    ``below`` the one they pick among the steps older than ``below``."""
    if below is not None:
        return _sharded().open_step(dir, below=below)
    return _sharded().open_step(dir, step)


def load(dir: Any, model: Any, optimizer: Any = None, stream: Any = None, *, step: Any = None,
         state: Any = None) -> Any:
    """tlio.torch.load for a model or optimizer holding DTensors: every rank reads its
    regions of the step rank 0 picks and checks them against its state; only when every
    rank's check passed does any rank apply (a refusal on one rank changes nothing on
    any rank)."""
    g = Group()
    ck, apply = prepare_load(dir, model, optimizer, stream, step=step, group=g, state=state)
    mine: Failure = None
    error: Optional[BaseException] = None
    try:
        apply()
    except BaseException as e:
        error, mine = e, _failure(e)
    _raise_first(g.all_gather(mine), g.rank, error)
    return ck


def prepare_load(dir: Any, model: Any, optimizer: Any = None, stream: Any = None, *, step: Any = None,
                 group: Optional[Group] = None, state: Any = None) -> Tuple[Any, Callable[[], None]]:
    """Everything of a load but applying it: the step chosen (by rank 0), read and
    checked on every rank of ``group`` (``None``: this process alone, as for a plain
    model loading a sharded step, each rank for itself under tlio.torch's collective
    load), the outcome agreed on. Returns the Checkpoint and the function that applies
    it; raises on every rank when any rank failed."""
    from tlio import _torch_args
    from tlio.checkpoint import _integer, step_name

    _torch_args.load(model, optimizer, stream, state)
    if step is not None:
        step = _integer("step", step)
    g = group if group is not None else Group(solo=True)
    dir = os.fspath(dir)
    skipped: List[Tuple[str, str]] = []
    below: Optional[int] = None  # after a step failed on some rank: only older ones
    while True:
        handle, error, mine = None, None, None
        # Rank 0 picks the step; every rank opens exactly that one.
        chosen: Any = None
        if g.rank == 0:
            try:
                handle = _open(dir, step, below)
                chosen = ("ok", handle.step, [list(s) for s in handle.skipped])
            except BaseException as e:
                error, chosen = e, ("failed", _failure(e))
        chosen = g.broadcast(chosen)
        if chosen[0] != "ok":
            _raise_first([chosen[1]], 0, error)
        n = chosen[1]
        skipped += [tuple(s) for s in chosen[2]]
        kind = None
        try:
            if handle is None:
                try:
                    handle = _open(dir, n)
                except FileNotFoundError as e:  # step n fails this rank's check
                    raise Corrupt(f"step {n}, which rank 0 loaded, does not verify here ({e})") from e
            wants, tied = _plan(handle, model, optimizer)
            _read(handle, wants)
        except Corrupt as e:
            kind, error, mine = "corrupt", e, str(e)
        except BaseException as e:
            kind, error, mine = "error", e, _failure(e)
        outcomes = g.all_gather((kind, mine))
        if any(k == "error" for k, _ in outcomes):
            _raise_first([m if k == "error" else None for k, m in outcomes], g.rank, error)
        bad = [(r, m) for r, (k, m) in enumerate(outcomes) if k == "corrupt"]
        if not bad:
            break
        r, m = bad[0]
        # Which rank found it only matters when there are several.
        why = f"on rank {r}: {m}" if g.size > 1 else m
        if handle is not None:
            handle.close()
        if step is not None:  # a named step is that step or an error, never another
            raise FileNotFoundError(f"no loadable checkpoint in {dir} ({step_name(n)}: {why})")
        skipped.append((step_name(n), why))
        if n == 0:
            raise FileNotFoundError(f"{dir}: no step verifies on every rank")
        below = n
    # Checked on every rank or raised on every rank: no rank applies alone.
    ck = apply = None
    error, mine = None, None
    try:
        ck, apply = _checked(handle, model, optimizer, stream, wants, tied, skipped, state)
    except BaseException as e:
        error, mine = e, _failure(e)
    finally:
        handle.close()
    _raise_first(g.all_gather(mine), g.rank, error)
    return ck, apply


def _checked(handle, model, optimizer, stream, wants, tied, skipped, state=None):
    """The verified tensors checked whole against the state (the optimizer by
    tlio._torch_optim, the ``state=`` objects by tlio._torch_state): the Checkpoint and
    the function that applies it as tlio.torch applies an unsharded load."""
    from tlio import _torch_optim, _torch_state
    from tlio.checkpoint import EXTRA_KEYS, Checkpoint
    from tlio.torch import TYPE_PREFIX, _apply as apply_checked, _param_names

    objects = dict(state or {})  # ``state`` names the trainer state below

    path = handle.path
    state = json.loads(handle.state_json)
    rng = handle.rng
    if stream is not None and (state.get("data_cursor") is None or rng is None):
        raise ValueError(f"{path} holds no data_cursor and rng_state to restore the stream from")
    sd = {w.name: w.value() for w in wants if w.group == MODEL}
    for other, first in tied.items():
        if first not in sd:
            raise ValueError(f"{path}: {other!r} is tied to {first!r}, which is not stored")
        sd[other] = sd[first]
    opt = opt_state = cursor = None
    if optimizer is not None:
        tensors = {w.name: w.value() for w in wants if w.group == OPTIMIZER}
        want = TYPE_PREFIX + type(optimizer).__name__
        opt_state, opt = _torch_optim.plan(optimizer, _param_names(model), tensors, handle.meta[OPTIMIZER],
                                           path, want)
    if stream is not None:
        cursor = {**state["data_cursor"], "rng": {"state": f"{rng[0]:016x}", "inc": f"{rng[1]:016x}"}}
    saved_states = _torch_state.decode(handle.meta.get(MODEL, {}), path)
    states = _torch_state.plan(objects, saved_states, path)
    config = handle.config
    ck = Checkpoint(
        path=path, step=handle.step, model=sd, opt=opt,
        rng_state=None if rng is None else {"state": rng[0], "inc": rng[1]},
        extra={k: state.get(k) for k in EXTRA_KEYS},
        config=None if config is None else json.loads(config),
        skipped=skipped, state=saved_states,
    )
    return ck, lambda: apply_checked(model, sd, tied, optimizer, opt_state, stream, cursor, states)


def dispatch_save(whole: F) -> F:
    """Wrap tlio.torch's save: a state holding DTensors takes the sharded save."""

    @functools.wraps(whole)
    def wrapper(dir: Any, step: Any, model: Any, optimizer: Any = None, stream: Any = None, **kw: Any) -> Any:
        if holds_dtensors(model, optimizer):
            return save(dir, step, model, optimizer, stream, **kw)
        return whole(dir, step, model, optimizer, stream, **kw)

    return wrapper  # type: ignore[return-value]


def dispatch_load(whole: F) -> F:
    """Wrap tlio.torch's load: a model or optimizer holding DTensors takes the sharded load."""

    @functools.wraps(whole)
    def wrapper(dir: Any, model: Any, optimizer: Any = None, stream: Any = None, **kw: Any) -> Any:
        if holds_dtensors(model, optimizer):
            return load(dir, model, optimizer, stream, **kw)
        return whole(dir, model, optimizer, stream, **kw)

    return wrapper  # type: ignore[return-value]
