"""tlio as the storage of PyTorch's distributed checkpoint (DCP, ``torch.distributed.checkpoint``).

``Writer`` and ``Reader`` are real ``StorageWriter`` / ``StorageReader`` subclasses, so
``dcp.save``, ``dcp.async_save`` and ``dcp.load`` work unchanged, with DCP's own planner,
resharding and staging; only what lands on disk and how it is committed and read change::

    import torch.distributed.checkpoint as dcp
    import tlio.dcp

    dcp.save(state, storage_writer=tlio.dcp.Writer("ckpt/step-100"))   # was FileSystemWriter(...)
    dcp.load(state, storage_reader=tlio.dcp.Reader("ckpt/step-100"))   # was FileSystemReader(...)

    dcp.save(state, storage_writer=tlio.dcp.Writer("run/ckpt", step=100, keep=3))
    dcp.load(state, storage_reader=tlio.dcp.Reader("run/ckpt"))        # LATEST, else the newest that verifies

What is written is a tlio sharded step (docs/checkpoints.md): one canonical safetensors
file per rank (``dcp-rank00000.safetensors``...) whose chunks carry BLAKE3 digests of
their 1 MiB pieces in ``shards.json``, ``trainer_state.json``, and ``MANIFEST.json`` last
with every file's size and sha256. Every DCP item lives in the table's ``dcp`` group
under its flattened key: tensors with their chunks, DCP's bytes items (its planner's
serialized non-tensor state) as ``U8`` vectors, opaque to tlio, which never unpickles
them. DCP's ``Metadata`` is rebuilt on load from the table and a small JSON document
(which keys are bytes, each tensor's properties, the planner's key mapping); no pickle
is stored. ``tlio ckpt verify / latest / gc``, ``tlio st inspect`` and
``tlio.sharded.open_step`` read these steps as any sharded step.

Save: the coordinator begins the step in DCP's global planning step (the checkpoint lock
of the parent directory, the refusals of a save, a fresh ``<name>.tmp/``), every rank
writes its file in ``write_data`` (hashed while written, fsynced), and ``finish`` commits
with checkpoint.md's protocol (the chunk table checked, the manifest last, one rename, the
parent fsynced, LATEST for a run directory; on ``s3://`` the manifest's conditional
put). An exception on any rank is raised on every rank by DCP and nothing is committed;
the abandoned ``.tmp`` directory is removed when this writer is reset, set up again,
aborted or collected (or by the next save or ``tlio ckpt gc``).

Load: every rank opens the step (its table and headers checked), DCP plans the reads,
and ``read_data`` reads only the byte ranges of its plan, verifying every piece it hands
to DCP; a mismatch raises a ``ValueError`` naming the file, the tensor, the chunk and the
piece.

Supported torch: the StorageWriter / StorageReader interface with ``storage_meta`` and
keyword arguments to ``set_up_storage_writer`` (torch 2.4 and later); tested with the
installed torch. ``use_collectives=False`` (rank-local metadata) and the save planner's
plan caching are refused or unsupported: one coordinator commits each step.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import threading
import uuid
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from tlio._tlio import sharded as _core

__all__ = ["Writer", "Reader", "latest", "import_checkpoint", "GROUP", "FORMAT"]

PathLike = Union[str, "os.PathLike[str]"]

#: The chunk-table group that holds a DCP state dict.
GROUP = "dcp"
#: ``format`` of the JSON document in the table's ``dcp`` metadata (its rules are
#: tlio-core's, checked on commit and on open).
FORMAT = _core.DCP_FORMAT
#: The document's version.
VERSION = _core.DCP_DOC_VERSION
#: The key of that document in ``meta["dcp"]``.
META_KEY = _core.DCP_META_KEY
#: The DCP metadata version a step is rebuilt with when its document names none.
DCP_VERSION = "1.0.0"
#: Data file of rank r: ``dcp-rank<r, five digits>.safetensors``.
FILE_DIGITS = 5
_STEP_NAME = re.compile(r"^step-(\d{6,})$")
_TRAILING_DIGITS = re.compile(r"(\d+)$")
_BYTES_SUFFIX = "@bytes"


#: The save this thread's coordinator began and has not finished. DCP calls no method of
#: the writer when a rank fails after planning, so that save's ``.tmp`` directory and lock
#: stay until the writer is collected; a thread runs one ``dcp.save`` at a time, so a save
#: still pending when the same thread begins the next one was abandoned, and is aborted
#: then (an async save runs in a thread of its own and is never aborted by another).
_THREAD = threading.local()


def _abandon_pending() -> None:
    pending, _THREAD.pending = getattr(_THREAD, "pending", None), None
    if pending is not None:
        pending.abort()


def _dtypes() -> Dict[torch.dtype, str]:
    from tlio.torch import _DTYPES

    return {t: v[0] for t, v in _DTYPES.items()}


def _file_name(rank: int) -> str:
    return f"dcp-rank{rank:0{FILE_DIGITS}d}.safetensors"


def _path_arg(value: Any, what: str) -> str:
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str) and text:
            return text
    raise TypeError(f"{what} must be a non-empty str or os.PathLike, got {type(value).__name__}")


def _count_arg(value: Any, what: str, minimum: int = 0) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return value


def _is_url(path: str) -> bool:
    return path.startswith("s3://")


def _split(path: str) -> Tuple[str, str]:
    """(parent, last component) of a path or URL, trailing slashes ignored."""
    stripped = path.rstrip("/") or path
    parent, _, name = stripped.rpartition("/")
    return (parent or "."), name


def _canonical_step(name: str) -> Optional[int]:
    m = _STEP_NAME.match(name)
    if m is None:
        return None
    n = int(m.group(1))
    return n if f"step-{n:06d}" == name else None


# ---------------------------------------------------------------------------------------
# The JSON document that replaces DCP's pickled Metadata
# ---------------------------------------------------------------------------------------


def _path_elem(x: Any, fqn: str) -> Any:
    if isinstance(x, bool) or not isinstance(x, (str, int)):
        raise ValueError(f"the planner's path of {fqn!r} holds {x!r}; tlio.dcp stores str and int path elements only")
    return x


def _planner_data_json(planner_data: Any) -> Any:
    """DCP's planner data as JSON: the default planner's {flattened key: path tuple}
    mapping as ``{"mappings": [[fqn, [elements]]]}``; ``None`` stays ``null``."""
    if planner_data is None:
        return None
    if isinstance(planner_data, dict) and all(isinstance(k, str) and isinstance(v, (tuple, list))
                                              for k, v in planner_data.items()):
        return {"mappings": [[k, [_path_elem(x, k) for x in v]] for k, v in sorted(planner_data.items())]}
    raise ValueError(
        f"the save planner's data is a {type(planner_data).__name__} that tlio.dcp cannot store as JSON "
        "(the default planner's key mapping is supported)"
    )


def _planner_data_from_json(doc: Any) -> Any:
    if doc is None:
        return None
    return {key: tuple(path) for key, path in doc["mappings"]}


def _properties_json(p: TensorProperties) -> dict:
    strides = getattr(p, "strides", None)
    return {
        "dtype": str(p.dtype).removeprefix("torch."),
        "requires_grad": bool(p.requires_grad),
        "strides": None if strides is None else [int(s) for s in strides],
    }


def _properties_from_json(doc: dict) -> TensorProperties:
    props = TensorProperties(dtype=getattr(torch, doc["dtype"]), requires_grad=doc["requires_grad"])
    if doc["strides"] is not None and hasattr(props, "strides"):
        props.strides = tuple(doc["strides"])
    return props


def _document(metadata: Metadata, bytes_names: Sequence[str]) -> str:
    tensors = {
        fqn: _properties_json(md.properties)
        for fqn, md in sorted(metadata.state_dict_metadata.items())
        if isinstance(md, TensorStorageMetadata)
    }
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "dcp_version": metadata.version or DCP_VERSION,
        "bytes": sorted(bytes_names),
        "tensors": tensors,
        "planner_data": _planner_data_json(metadata.planner_data),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _parse_document(text: str) -> dict:
    """The document of an opened step (tlio-core checked it against the table on open)."""
    return json.loads(text)


# ---------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Target:
    """What the coordinator scatters to every rank with the plan."""

    tmp_dir: str
    file: str
    step: int
    #: The token of the probe a local tmp_dir holds (None on object storage): every rank
    #: checks it before writing, so a directory not shared between hosts fails at once.
    probe: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class _Stored:
    """A WriteResult's storage data: where the item lies, and (on a rank's first result)
    the table of the file it wrote, which the coordinator commits."""

    file: str
    key: str
    table: Optional[dict] = None


class Writer(StorageWriter):
    """A ``torch.distributed.checkpoint.StorageWriter`` that writes a verified tlio sharded step.

    ``Writer(step_dir)`` writes the step directory ``step_dir`` (any name, e.g.
    torchtitan's ``{folder}/step-100``; its number is the name's trailing digits, else 0);
    ``Writer(run_dir, step=N, keep=K)`` writes ``run_dir/step-NNNNNN`` and moves LATEST,
    then keeps the newest ``K`` valid steps. ``dcp.save(..., checkpoint_id=D)`` points the
    writer at the step directory ``D``, as for FileSystemWriter. A step directory that
    already holds a complete step is refused unless ``overwrite=True``.

    ``s3://bucket/prefix`` works for a run directory with ``step=``, or a step URL with a
    canonical ``step-NNNNNN`` name (docs/object-storage.md).
    """

    def __init__(self, path_or_url: PathLike, *, step: Optional[int] = None, keep: Optional[int] = None,
                 overwrite: bool = False) -> None:
        super().__init__()
        self._path = _path_arg(path_or_url, "path_or_url")
        self._step = _count_arg(step, "step")
        self._keep = _count_arg(keep, "keep", 1)
        if not isinstance(overwrite, bool):
            raise TypeError(f"overwrite must be a bool, got {type(overwrite).__name__}")
        self._overwrite = overwrite
        if self._keep is not None and self._step is None and _canonical_step(_split(self._path)[1]) is None:
            raise ValueError("keep needs a run directory and step= (retention counts tlio's step-NNNNNN steps)")
        self._save_id = str(uuid.uuid4())
        self._pending: Any = None
        self._rank = 0
        self.committed: Optional[str] = None

    # Pickling (DCP's process-based async checkpointer sends the writer to its process):
    # the configuration only, never a save in progress.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pending"] = None
        return state

    def __del__(self) -> None:
        try:
            self.abort()
        except Exception:
            pass

    def abort(self) -> None:
        """Abandon the save this writer's coordinator began, if any: its ``.tmp`` directory is
        removed and the lock released; nothing is committed."""
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is not None:
            pending.abort()

    @property
    def checkpoint_id(self) -> str:
        """The step directory (or run directory) this writer writes."""
        return self._path

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self._path, save_id=self._save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and bool(os.fspath(checkpoint_id))

    def reset(self, checkpoint_id: Any = None) -> None:
        self.abort()
        if checkpoint_id:
            self._path = _path_arg(checkpoint_id, "checkpoint_id")
            self._step = None
        self._save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.abort()
        self.committed = None
        if kwargs.get("use_collectives", True) is False:
            raise ValueError("tlio.dcp.Writer needs DCP's collectives (use_collectives=True): "
                             "one coordinator commits each step")
        self._rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        known = _dtypes()
        for item in plan.items:
            if item.type != WriteItemType.BYTE_IO and item.tensor_data is not None:
                dtype = item.tensor_data.properties.dtype
                if dtype not in known:
                    raise ValueError(f"tensor {item.index.fqn!r} has dtype {dtype}, which tlio.dcp cannot store")
        return plan

    def _begin(self) -> Any:
        """The coordinator's start of the step: lock, refusals, a fresh tmp directory."""
        if self._step is not None:
            return _core.begin(self._path, self._step, self._overwrite)
        parent, name = _split(self._path)
        n = _canonical_step(name)
        if n is not None:
            return _core.begin(parent, n, self._overwrite)
        if self._keep is not None:
            raise ValueError(f"{self._path}: keep needs a run directory and step=, not a step directory")
        m = _TRAILING_DIGITS.search(name)
        return _core.begin_named(self._path, int(m.group(1)) if m else 0, self._overwrite)

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        self.abort()
        _abandon_pending()
        self._pending = _THREAD.pending = self._begin()
        tmp, step, probe = self._pending.tmp_dir, self._pending.step, self._pending.probe
        return [dataclasses.replace(p, storage_data=_Target(tmp, _file_name(i), step, probe))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        target = plan.storage_data
        if not isinstance(target, _Target):
            raise ValueError("the save plan carries no tlio target (was the plan cached by the planner?)")
        if target.probe is not None:
            _core.check_shared(target.tmp_dir, target.probe)
        known = _dtypes()
        chunks: List[tuple] = []
        keep_alive: List[Any] = []
        results: List[Tuple[Any, int, Optional[str]]] = []
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                buf = np.frombuffer(data.getbuffer(), dtype=np.uint8) if data.getbuffer().nbytes else np.zeros(0, np.uint8)
                key = fqn + _BYTES_SUFFIX
                keep_alive.append(data)
                chunks.append((key, "U8", [int(buf.size)], buf))
                results.append((item.index, int(buf.size), key))
                continue
            td = item.tensor_data
            sizes = [int(s) for s in td.chunk.sizes]
            offsets = [int(o) for o in td.chunk.offsets]
            shape = [int(s) for s in td.size]
            numel = _numel(sizes)
            if numel == 0 and (_numel(shape) != 0 or any(offsets) or sizes != shape):
                # An empty share of a non-empty tensor holds nothing: no chunk at all.
                results.append((item.index, 0, None))
                continue
            t = planner.resolve_data(item).detach()
            dtype = known.get(t.dtype)
            if dtype is None or t.dtype != td.properties.dtype:
                raise ValueError(f"tensor {fqn!r} resolved to dtype {t.dtype}, not the planned {td.properties.dtype}")
            if list(t.shape) != sizes:
                raise ValueError(f"tensor {fqn!r} at {offsets} resolved to shape {list(t.shape)}, not {sizes}")
            c = t.cpu().contiguous()
            keep_alive.append(c)
            arr = c.reshape(-1).view(torch.uint8).numpy() if c.numel() else np.zeros(0, np.uint8)
            key = f"{fqn}@{','.join(map(str, offsets))}"
            chunks.append((key, dtype, sizes, arr))
            results.append((item.index, int(arr.size), key))
        table = _core.write_rank_file(target.tmp_dir, target.file, chunks) if chunks else None
        out: List[WriteResult] = []
        first = True
        for index, size, key in results:
            stored = None
            if key is not None:
                stored = _Stored(target.file, key, table if first else None)
                first = False
            out.append(WriteResult(index=index, size_in_bytes=size, storage_data=stored))
        del keep_alive
        fut: Future = Future()
        fut.set_result(out)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        save, self._pending = self._pending, None
        if getattr(_THREAD, "pending", None) is save:
            _THREAD.pending = None
        if save is None:
            raise ValueError("tlio.dcp.Writer.finish: no save in progress on this coordinator")
        try:
            files, tensors, bytes_names = _commit_tables(metadata, results)
            doc = _document(metadata, bytes_names)
            state_json = json.dumps({"step": save.step})
            path = save.commit(files, tensors, {GROUP: {META_KEY: doc}}, state_json, None, None, self._keep)
        except BaseException:
            save.abort()
            raise
        metadata.storage_data = {wr.index: wr.storage_data for rank in results for wr in rank
                                 if wr.storage_data is not None}
        metadata.storage_data = {i: (s.file, s.key) for i, s in metadata.storage_data.items()}
        metadata.storage_meta = self.storage_meta()
        self.committed = path


def _numel(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def _commit_tables(metadata: Metadata, results: List[List[WriteResult]]) -> Tuple[List[dict], List[dict], List[str]]:
    """The rank files' tables and the chunk table's tensors from DCP's metadata and every
    rank's write results."""
    files: Dict[str, dict] = {}
    chunks: Dict[str, Dict[tuple, dict]] = {}
    bytes_len: Dict[str, int] = {}
    for rank_results in results:
        for wr in rank_results:
            s = wr.storage_data
            if s is None:
                continue
            if not isinstance(s, _Stored):
                raise ValueError(f"write result of {wr.index.fqn!r} was not written by tlio.dcp.Writer")
            if s.table is not None:
                files[s.table["name"]] = s.table
            md = metadata.state_dict_metadata.get(wr.index.fqn)
            if isinstance(md, BytesStorageMetadata):
                if wr.index.fqn not in bytes_len:  # a replica written twice keeps the first
                    bytes_len[wr.index.fqn] = wr.size_in_bytes
                    chunks.setdefault(wr.index.fqn, {})[()] = {"offsets": [0], "sizes": [wr.size_in_bytes],
                                                               "file": s.file, "key": s.key}
                continue
            if not isinstance(md, TensorStorageMetadata):
                raise ValueError(f"write result of {wr.index.fqn!r}, which DCP's metadata does not hold")
            offsets = tuple(int(o) for o in (wr.index.offset or ()))
            sizes = next((list(map(int, c.sizes)) for c in md.chunks if tuple(map(int, c.offsets)) == offsets), None)
            if sizes is None:
                raise ValueError(f"write result of {wr.index.fqn!r} at {list(offsets)}, a chunk DCP's metadata lacks")
            chunks.setdefault(wr.index.fqn, {}).setdefault(
                offsets, {"offsets": list(offsets), "sizes": sizes, "file": s.file, "key": s.key})
    known = _dtypes()
    tensors = []
    for fqn, md in sorted(metadata.state_dict_metadata.items()):
        mine = chunks.get(fqn, {})
        if isinstance(md, BytesStorageMetadata):
            n = bytes_len.get(fqn)
            if n is None:
                raise ValueError(f"bytes item {fqn!r} was written by no rank")
            tensors.append({"group": GROUP, "name": fqn, "dtype": "U8", "shape": [n], "chunks": list(mine.values())})
            continue
        tensors.append({"group": GROUP, "name": fqn, "dtype": known[md.properties.dtype],
                        "shape": [int(s) for s in md.size], "chunks": [mine[k] for k in sorted(mine)]})
    files_sorted = [files[n] for n in sorted(files)]
    # Only the files' own tables travel: the pieces were computed by the ranks as they wrote.
    return files_sorted, tensors, sorted(bytes_len)


# ---------------------------------------------------------------------------------------
# Reader
# ---------------------------------------------------------------------------------------


def _looks_like_step_dir(path: str) -> bool:
    if _is_url(path):
        return _canonical_step(_split(path)[1]) is not None
    return (os.path.isfile(os.path.join(path, "MANIFEST.json"))
            or os.path.isfile(os.path.join(path, _core.SHARDS_NAME))
            or _canonical_step(os.path.basename(os.path.normpath(path))) is not None)


class Reader(StorageReader):
    """A ``torch.distributed.checkpoint.StorageReader`` of tlio steps, verifying every byte it reads.

    ``Reader(step_dir)`` loads that step directory (any name); ``Reader(run_dir, step=N)``
    loads ``step-NNNNNN`` of a run directory exactly (an error, never another step, when it
    fails); ``Reader(run_dir)`` loads the step ``tlio ckpt latest`` picks (LATEST, else the
    newest older step that verifies whole) and lists what it passed over in ``skipped``
    (also issued as a warning). ``dcp.load(..., checkpoint_id=D)`` points it at ``D``.
    """

    def __init__(self, path_or_url: PathLike, *, step: Optional[int] = None) -> None:
        super().__init__()
        self._path = _path_arg(path_or_url, "path_or_url")
        self._step = _count_arg(step, "step")
        self._opened: Any = None
        self._load_id = str(uuid.uuid4())
        #: The step directory loaded (after ``read_metadata``).
        self.path: Optional[str] = None
        #: The steps passed over on the way, as (name, why).
        self.skipped: List[Tuple[str, str]] = []
        self._bytes: Dict[str, int] = {}
        self._dtypes: Dict[str, torch.dtype] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_opened"] = None
        return state

    @property
    def checkpoint_id(self) -> str:
        return self._path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and bool(os.fspath(checkpoint_id))

    def reset(self, checkpoint_id: Any = None) -> None:
        self._close()
        if checkpoint_id:
            self._path = _path_arg(checkpoint_id, "checkpoint_id")
            self._step = None
        self._load_id = str(uuid.uuid4())

    def _close(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            opened.close()

    def _open(self) -> Any:
        if self._step is not None:
            opened = _core.open_step(self._path, self._step)
            if opened.step != self._step:
                opened.close()
                why = "; ".join(f"{n}: {r}" for n, r in opened.skipped) or "it does not verify"
                raise ValueError(f"{self._path}: step {self._step} cannot be loaded ({why})")
            return opened
        if _looks_like_step_dir(self._path):
            if _is_url(self._path):
                parent, name = _split(self._path)
                n = _canonical_step(name)
                opened = _core.open_step(parent, n)
                if opened.step != n:
                    opened.close()
                    raise ValueError(f"{self._path} cannot be loaded: {opened.skipped}")
                return opened
            return _core.open_step_dir(self._path)
        path, step, skipped = _core.pick(self._path)
        opened = _core.open_step(self._path, step)
        if opened.step != step:
            opened.close()
            raise ValueError(f"{path} verified whole but then failed to open: {opened.skipped}")
        self.skipped = list(skipped)
        if skipped:
            warnings.warn("tlio.dcp.Reader: loading {} after passing over {}".format(
                path, "; ".join(f"{n} ({r})" for n, r in skipped)), stacklevel=3)
        return opened

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            # DCP asks again for rank-local metadata only after the global one failed.
            raise ValueError("tlio steps hold one global metadata; see the first error")
        self._close()
        self.skipped = []
        self._opened = self._open()
        self.path = self._opened.path
        return self._metadata(self._opened)

    def _metadata(self, opened: Any) -> Metadata:
        where = opened.path
        meta = opened.meta.get(GROUP, {})
        if META_KEY not in meta:
            raise ValueError(f"{where} was not saved through tlio.dcp (no dcp metadata in its chunk table); "
                             "a tlio.torch step loads with tlio.torch.load")
        doc = _parse_document(meta[META_KEY])
        bytes_names = set(doc["bytes"])
        sd_md: Dict[str, Any] = {}
        self._bytes, self._dtypes = {}, {}
        for (group, name), (_, shape) in opened.tensors().items():
            if group != GROUP:
                raise ValueError(f"{where}: tensor {group}/{name} lies outside the dcp group")
            if name in bytes_names:
                sd_md[name] = BytesStorageMetadata()
                self._bytes[name] = int(shape[0])
                continue
            props = _properties_from_json(doc["tensors"][name])
            self._dtypes[name] = props.dtype
            chunks = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s))
                      for o, s in opened.chunks(GROUP, name)]
            sd_md[name] = TensorStorageMetadata(properties=props, size=torch.Size(shape), chunks=chunks)
        return Metadata(
            state_dict_metadata=sd_md,
            planner_data=_planner_data_from_json(doc.get("planner_data")),
            storage_data={},
            storage_meta=StorageMeta(checkpoint_id=where, load_id=self._load_id),
            version=str(doc.get("dcp_version") or DCP_VERSION),
        )

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self._opened is None:
            raise ValueError("tlio.dcp.Reader: set up before read_metadata")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        # Every rank names the step it opened; the coordinator checks that they agree.
        return dataclasses.replace(plan, storage_data=(self.path, self._opened.step if self._opened else None))

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        chosen = {p.storage_data for p in plans}
        if len(chosen) > 1:
            raise ValueError("the ranks opened different steps: " + ", ".join(
                f"rank {i}: {p.storage_data[0]}" for i, p in enumerate(plans)))
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        opened = self._opened
        if opened is None:
            raise ValueError("tlio.dcp.Reader: read_data before read_metadata")
        reads: List[tuple] = []
        after: List[tuple] = []
        known = _dtypes()
        for item in plan.items:
            fqn = item.storage_index.fqn
            if item.type == LoadItemType.BYTE_IO:
                n = self._bytes.get(fqn)
                if n is None:
                    raise ValueError(f"{opened.path}: the load plan asks for bytes item {fqn!r}, which the step lacks")
                buf = np.empty(n, dtype=np.uint8)
                if n:
                    reads.append((GROUP, fqn, [0], [n], buf))
                after.append((item, buf, None, None))
                continue
            stored = self._dtypes.get(fqn)
            if stored is None:
                raise ValueError(f"{opened.path}: the load plan asks for tensor {fqn!r}, which the step lacks")
            base = [int(o) for o in (item.storage_index.offset or ())]
            offsets = [b + int(s) for b, s in zip(base, item.storage_offsets)]
            sizes = [int(s) for s in item.lengths]
            target = planner.resolve_tensor(item).detach()
            if list(target.shape) != sizes:
                raise ValueError(f"the load plan's target of {fqn!r} has shape {list(target.shape)}, not {sizes}")
            direct = (target.device.type == "cpu" and target.dtype == stored and target.is_contiguous()
                      and target.dtype in known)
            dest = target if direct else torch.empty(sizes, dtype=stored)
            if _numel(sizes):
                reads.append((GROUP, fqn, offsets, sizes, dest.reshape(-1).view(torch.uint8).numpy()))
            after.append((item, None, target, None if direct else dest))
        if reads:
            opened.read_many(reads)  # every piece verified before it is handed on
        for item, buf, target, staged in after:
            if buf is not None:
                planner.load_bytes(item, io.BytesIO(buf.tobytes()))
                continue
            if staged is not None:
                target.copy_(staged)
            planner.commit_tensor(item, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut


# ---------------------------------------------------------------------------------------
# Choosing a step
# ---------------------------------------------------------------------------------------


def latest(run_dir: PathLike) -> Optional[str]:
    """The step directory ``Reader(run_dir)`` would load: the one ``tlio ckpt latest`` picks
    (LATEST when it verifies, else the newest older step that verifies whole), or ``None``
    when no step of ``run_dir`` verifies. A missing ``run_dir`` is a ``FileNotFoundError``."""
    path = _path_arg(run_dir, "run_dir")
    if not _is_url(path) and not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory")
    try:
        chosen, _, _ = _core.pick(path)
    except FileNotFoundError:
        return None
    return chosen


def import_checkpoint(dcp_dir: PathLike, run_dir: PathLike, *, step: Optional[int] = None) -> str:
    """Convert a checkpoint of DCP's ``FileSystemWriter`` (``.metadata`` and ``*.distcp``)
    into step ``step`` of the tlio run directory ``run_dir`` (by default the number ending
    ``dcp_dir``'s name, else 0), as ``tlio ckpt import`` does: the pickled ``.metadata``
    is read resolving no global outside DCP's metadata classes, tensors with
    ``torch.load(weights_only=True)``, bytes items copied unread; every byte range is
    checked against its file first. Returns the committed step directory."""
    from tlio._dcp_import import import_checkpoint as _import

    return _import(dcp_dir, run_dir, step=step)
