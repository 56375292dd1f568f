"""``tlio ckpt import``: a checkpoint of DCP's ``FileSystemWriter`` (``.metadata`` and
``*.distcp``) turned into a verified tlio step, through ``tlio.dcp.Writer``.

The ``.metadata`` pickle is read by an unpickler that resolves no global outside an
allow-list (DCP's metadata classes, torch dtypes, ``torch.Size``, the layout and
memory-format decoders and ``pathlib`` paths): no code of the file runs. torch's
``weights_only`` unpickler would be the natural choice, but it stops at the protocol-4
opcodes DCP writes (``FRAME``, ``SHORT_BINUNICODE``), so it cannot read a ``.metadata``
file at all. Tensors are read with ``torch.load(weights_only=True)``, each chunk from the
byte range the metadata names; DCP's bytes items are copied as opaque bytes, never
unpickled. Every range is checked against its file before anything is written, and one
source file's tensors are held in memory at a time (one tlio rank file per source file).

    python -m tlio._dcp_import DCP_DIR RUN_DIR [--step N]

is what the CLI runs; ``tlio.dcp.import_checkpoint`` is the same from Python.
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import pickle
import re
import sys
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

import tlio.dcp

#: The largest ``.metadata`` file read (DCP's holds one entry per chunk: megabytes for
#: the largest models).
MAX_METADATA_BYTES = 1 << 30
_METADATA = ".metadata"
_TRAILING_DIGITS = re.compile(r"(\d+)$")
_ALLOWED = {
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "WindowsPath"): pathlib.PureWindowsPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
}
for _name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
              "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"):
    _ALLOWED[("torch.distributed.checkpoint.metadata", _name)] = getattr(_md, _name)


class _MetadataUnpickler(pickle.Unpickler):
    """A pickle reader that resolves only the allow-listed globals."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a DCP .metadata file never holds")
        return found


def read_metadata(dcp_dir: str) -> Metadata:
    """The ``Metadata`` of a FileSystemWriter checkpoint, read without running its code."""
    path = os.path.join(dcp_dir, _METADATA)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (a FileSystemWriter checkpoint has one)") from None
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"{path}: {size} bytes, more than the {MAX_METADATA_BYTES} a .metadata file may hold")
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, IndexError) as e:
            raise ValueError(f"{path}: not a DCP metadata pickle: {e}") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise ValueError(f"{path}: not a DCP Metadata object with storage data")
    return metadata


def _ranges(dcp_dir: str, metadata: Metadata) -> Dict[str, List[Tuple[MetadataIndex, _StorageInfo]]]:
    """{source file: [(index, storage info)]}, each range checked against its file."""
    sizes: Dict[str, int] = {}
    per_file: Dict[str, List[Tuple[MetadataIndex, _StorageInfo]]] = {}
    for index, info in metadata.storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise ValueError(f"{dcp_dir}/{_METADATA}: storage data of {index!r} is not a file range")
        name = str(info.relative_path)
        if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise ValueError(f"{dcp_dir}/{_METADATA}: {index.fqn!r} names the file {name!r}, not a plain file name")
        if info.transform_descriptors:
            raise ValueError(f"{dcp_dir}/{name}: {index.fqn!r} is stored through the transforms "
                             f"{list(info.transform_descriptors)}, which tlio ckpt import does not read")
        if name not in sizes:
            path = os.path.join(dcp_dir, name)
            try:
                sizes[name] = os.path.getsize(path)
            except FileNotFoundError:
                raise FileNotFoundError(f"{path}: no such file, which {_METADATA} names") from None
        offset, length = int(info.offset), int(info.length)
        if offset < 0 or length < 0 or offset + length > sizes[name]:
            raise ValueError(f"{dcp_dir}/{name}: {index.fqn!r} is at bytes {offset}..{offset + length}, "
                             f"past the file's {sizes[name]} bytes (truncated?)")
        per_file.setdefault(name, []).append((index, info))
    for items in per_file.values():
        items.sort(key=lambda x: int(x[1].offset))
    return per_file


class _SourcePlanner:
    """What ``tlio.dcp.Writer.write_data`` asks of a planner: the data of each write item,
    read from the source file's byte range. The file is opened once, for all its items
    (a context manager: closed on exit)."""

    def __init__(self, dcp_dir: str, name: str, infos: Dict[MetadataIndex, _StorageInfo]):
        self.path = os.path.join(dcp_dir, name)
        self.infos = infos
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "_SourcePlanner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _slice(self, index: MetadataIndex) -> bytes:
        info = self.infos[index]
        offset, length = int(info.offset), int(info.length)
        parts = []
        got = 0
        while got < length:
            # pread returns at most about 2 GiB at once on Linux; 0 is the file's end.
            part = os.pread(self._fd, length - got, offset + got)
            if not part:
                raise ValueError(f"{self.path}: {index.fqn!r} ends past the file (it shrank while read)")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def resolve_data(self, item: WriteItem) -> Any:
        data = self._slice(item.index)
        if item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(data)
        _check_crcs(self.path, item, data)
        try:
            tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # torch.load's errors are of many kinds
            raise ValueError(f"{self.path}: {item.index.fqn!r} at {list(item.index.offset or ())} "
                             f"is not a readable tensor: {e}") from None
        td = item.tensor_data
        if not isinstance(tensor, torch.Tensor) or list(tensor.shape) != list(td.chunk.sizes) \
                or tensor.dtype != td.properties.dtype:
            raise ValueError(f"{self.path}: {item.index.fqn!r} at {list(item.index.offset or ())} holds "
                             f"{getattr(tensor, 'dtype', type(tensor).__name__)} {list(getattr(tensor, 'shape', []))}, "
                             f"not the {td.properties.dtype} {list(td.chunk.sizes)} {_METADATA} names")
        return tensor


def _check_crcs(path: str, item: WriteItem, data: bytes) -> None:
    """Check each record of a ``torch.save`` archive against the CRC-32 its zip headers
    record (torch writes one unless ``set_crc32_options(False)``, which records 0, and
    its reader checks none): the one check DCP's files carry. zipfile checks the CRC as
    a record is read to its end."""
    where = f"{path}: {item.index.fqn!r} at {list(item.index.offset or ())}"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                if info.CRC == 0:
                    continue
                with z.open(info) as f:
                    while f.read(1 << 20):
                        pass
    except zipfile.BadZipFile as e:
        raise ValueError(f"{where}: the torch.save archive is damaged: {e}") from None


def _plans(metadata: Metadata, per_file: Dict[str, List[Tuple[MetadataIndex, _StorageInfo]]]) -> List[SavePlan]:
    plans = []
    for name in sorted(per_file):
        items = []
        for index, _ in per_file[name]:
            md = metadata.state_dict_metadata.get(index.fqn)
            if isinstance(md, BytesStorageMetadata):
                items.append(WriteItem(index=index, type=WriteItemType.BYTE_IO))
                continue
            if not isinstance(md, TensorStorageMetadata):
                raise ValueError(f"{_METADATA}: {index.fqn!r} has storage but no tensor or bytes entry")
            chunk = next((c for c in md.chunks if list(c.offsets) == list(index.offset or ())), None)
            if chunk is None:
                raise ValueError(f"{_METADATA}: {index.fqn!r} is stored at {list(index.offset or ())}, "
                                 "a chunk its entry does not list")
            items.append(WriteItem(index=index, type=WriteItemType.SHARD,
                                   tensor_data=TensorWriteData(chunk=chunk, properties=md.properties, size=md.size)))
        plans.append(SavePlan(items=items))
    return plans


def import_checkpoint(dcp_dir: tlio.dcp.PathLike, run_dir: tlio.dcp.PathLike, *, step: Optional[int] = None) -> str:
    """Convert the FileSystemWriter checkpoint ``dcp_dir`` into step ``step`` of the tlio
    run directory ``run_dir`` (by default the number that ends ``dcp_dir``'s name, else
    0): every range is checked, the step is written and committed by ``tlio.dcp.Writer``
    (refused when it exists). Returns the step directory."""
    src = os.fspath(dcp_dir)
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{src}: no such directory")
    if step is None:
        m = _TRAILING_DIGITS.search(os.path.basename(os.path.normpath(src)))
        step = int(m.group(1)) if m else 0
    metadata = read_metadata(src)
    per_file = _ranges(src, metadata)
    plans = _plans(metadata, per_file)
    writer = tlio.dcp.Writer(run_dir, step=step)
    writer.set_up_storage_writer(True, rank=0)
    try:
        plans = writer.prepare_global_plan([writer.prepare_local_plan(p) for p in plans])
        results = []
        for name, plan in zip(sorted(per_file), plans):
            with _SourcePlanner(src, name, dict(per_file[name])) as planner:
                results.append(writer.write_data(plan, planner).wait())
        target = Metadata(state_dict_metadata=metadata.state_dict_metadata, planner_data=metadata.planner_data)
        writer.finish(target, results)
    except BaseException:
        writer.abort()
        raise
    return writer.committed


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tlio ckpt import", description=__doc__.splitlines()[0])
    parser.add_argument("dcp_dir")
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        print(import_checkpoint(args.dcp_dir, args.run_dir, step=args.step))
    except FileNotFoundError as e:
        print(f"tlio: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"tlio: error: cannot import {args.dcp_dir}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
