"""``safe_open(path, framework=...)``: the ``safetensors`` package's reading interface
over tlio's core.

Arrays and tensors are zero-copy and writable, like the package's: each file is mapped
privately (copy-on-write), so a write to a tensor copies one page and never reaches the
file. ``get_slice(name)[...]`` asks the core for the read plan of the index and reads
only the bytes of the slice. Errors where the package raises its own are
``SafetensorError`` (a ``ValueError``).

The map is live, as the package's is: a file rewritten in place shows through pages
not yet written, and one truncated underneath faults (docs/python.md).
"""

from __future__ import annotations

import functools
import mmap
import os
from typing import Any, Dict, List, Optional

import numpy as np

from tlio._tlio import safetensors as _st
from tlio.safetensors import (
    _DECODED,
    _NATIVE,
    SafetensorError,
    SafetensorsFile,
    _check_unshrunk,
    _decode,
    _numel,
    _read_into,
)

_FRAMEWORKS = {"np": "numpy", "numpy": "numpy", "pt": "torch", "torch": "torch", "pytorch": "torch"}
#: Where tensor bytes come from: a private map of the file (zero-copy) or pread(2) into
#: fresh memory each tensor owns (nothing done to the file afterwards shows through).
BACKENDS = ("mmap", "pread")


def check_backend(backend: Any) -> str:
    """``backend`` as given, refused unless it is one of ``BACKENDS`` (the package's
    message for a bad name; a ``TypeError`` for a value that is not a str)."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str (\"mmap\" or \"pread\"), got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise SafetensorError(f'backend {backend!r} is invalid (expected one of: "mmap", "pread")')
    return backend


@functools.lru_cache(maxsize=None)
def torch_dtypes() -> Dict[str, Any]:
    """safetensors dtype name -> torch dtype, for those this torch has (built once)."""
    import torch

    names = {
        "F64": "float64",
        "F32": "float32",
        "F16": "float16",
        "BF16": "bfloat16",
        "C64": "complex64",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U64": "uint64",
        "U32": "uint32",
        "U16": "uint16",
        "U8": "uint8",
        "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E4M3FNUZ": "float8_e4m3fnuz",
        "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F8_E8M0": "float8_e8m0fnu",
        "F4": "float4_e2m1fn_x2",
    }
    return {st: getattr(torch, t) for st, t in names.items() if hasattr(torch, t)}


def _err(e: BaseException) -> SafetensorError:
    return SafetensorError(str(e))


def _key_text(key: tuple) -> str:
    """An index as the package shows it in its messages: ``[2:, 20]``."""

    def one(k: Any) -> str:
        if isinstance(k, slice):
            text = ("" if k.start is None else str(k.start)) + ":" + ("" if k.stop is None else str(k.stop))
            return text + ("" if k.step is None else f":{k.step}")
        if k is Ellipsis:
            return "..."
        return str(k)

    return "[" + ", ".join(one(k) for k in key) + "]"


def _index(k: Any) -> tuple:
    """One Python index as the binding's (kind, a, b, c)."""
    if k is Ellipsis:
        return ("ellipsis", None, None, None)
    if isinstance(k, slice):
        bounds = []
        for v in (k.start, k.stop, k.step):
            if v is not None and (isinstance(v, bool) or not hasattr(v, "__index__")):
                raise SafetensorError(f"slice bounds must be integers or None, got {v!r}")
            bounds.append(None if v is None else v.__index__())
        return ("range", *bounds)
    if isinstance(k, list):
        if k:
            raise SafetensorError("Non empty lists are not implemented")
        return ("range", 0, 0, None)
    if isinstance(k, bool) or not hasattr(k, "__index__"):
        raise SafetensorError(f"an index must be an integer, a slice, ... or [], got {type(k).__name__}")
    return ("at", k.__index__(), None, None)


class SafeSlice:
    """One tensor of an open file, read part by part: ``get_shape()``, ``get_dtype()``
    and ``[...]`` with integers (negative from the end), slices (with a step),
    ``...`` and ``[]``; only the bytes of the slice are read."""

    def __init__(self, owner: "CompatFile", name: str) -> None:
        self._owner = owner
        self._name = name
        (_, self._dtype, shape, self._start, self._end), self._shard = owner._find(name)
        self._shape = [int(n) for n in shape]

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __getitem__(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        indices = [_index(k) for k in key]
        owner = self._owner
        # The pread backend reads the whole tensor, as the package's does; the map is
        # touched only where the plan's runs lie.
        data = owner._bytes(self._shard, self._start, self._end)
        if data is None:
            data = np.zeros(0, np.uint8)
        try:
            shape, raw = _st.slice(self._dtype, self._name, self._shape, indices, data)
        except ValueError as e:
            message = str(e)
            if message.startswith("Invalid index"):
                raise SafetensorError(message) from None
            raise SafetensorError(
                f"Error during slicing {_key_text(key)} with shape {self._shape}: {message}"
            ) from None
        return owner._build(self._name, self._dtype, tuple(shape), raw)


class CompatFile:
    """The handle ``safe_open(path, framework=..., device=...)`` returns."""

    def __init__(self, path: Any, framework: str, device: Any = "cpu", backend: str = "mmap") -> None:
        fw = _FRAMEWORKS.get(framework) if isinstance(framework, str) else None
        if fw is None:
            raise SafetensorError(
                f"framework {framework!r} is not handled (np, numpy, pt, torch or pytorch)"
            )
        self._framework = fw
        self._pread = check_backend(backend) == "pread"
        self._path = os.fspath(path)
        if not os.path.exists(self._path):
            raise FileNotFoundError(f"No such file or directory: {self._path}")
        self._device = self._check_device(device)
        try:
            self._file = SafetensorsFile(self._path)
        except FileNotFoundError:
            raise
        except ValueError as e:
            raise _err(e) from None
        self._maps: List[Any] = [None] * len(self._file._shards)
        self._closed = False

    def _check_device(self, device: Any) -> Any:
        if self._framework == "numpy":
            if device != "cpu":
                raise SafetensorError(f"device {device!r}: numpy arrays live on the cpu")
            return None
        import torch

        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise SafetensorError(f"device {device!r} is invalid: {e}") from None

    def __enter__(self) -> "CompatFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _open(self) -> None:
        if self._closed:
            raise SafetensorError("File is closed")

    def keys(self) -> List[str]:
        """The tensor names, sorted (as the package sorts them)."""
        self._open()
        return sorted(self._file._entries)

    def offset_keys(self) -> List[str]:
        """The tensor names in the order of their data in the file."""
        self._open()
        return list(self._file._entries)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The ``__metadata__``, or ``None`` when the file has none."""
        self._open()
        return dict(self._file._meta) if self._file._has_meta else None

    def _find(self, name: str) -> Any:
        self._open()
        found = self._file._entries.get(name)
        if found is None:
            raise SafetensorError(f"File does not contain tensor {name}")
        return found

    def _read(self, shard: int, start: int, end: int) -> np.ndarray:
        """Bytes ``start..end`` of a shard, read with pread into a fresh uint8 array (the
        pread backend). The file stays open, as the package keeps it: a file renamed over
        the path later is not read. A file that shrank is a ``SafetensorError``."""
        f = self._maps[shard]
        path, size = self._file._shards[shard]
        if f is None:
            f = open(path, "rb")
            self._maps[shard] = f
        actual = os.fstat(f.fileno()).st_size
        if actual != size:
            raise SafetensorError(
                f"{path}: the file changed size since it was opened ({size} then {actual} bytes)"
            )
        out = np.empty(end - start, np.uint8)
        try:
            _read_into(f.fileno(), out, start, path)
        except ValueError as e:
            raise _err(e) from None
        return out

    def _bytes(self, shard: int, start: int, end: int) -> Optional[np.ndarray]:
        """A tensor's stored bytes as a uint8 array: a view of the private map, or with the
        pread backend a fresh array; ``None`` for a file with no data."""
        if self._pread:
            return self._read(shard, start, end)
        mm = self._map(shard)
        if mm is None or end == start:
            return None if mm is None else np.zeros(0, np.uint8)
        return np.frombuffer(mm, np.uint8, end - start, start)

    def _map(self, shard: int) -> Any:
        m = self._maps[shard]
        path, size = self._file._shards[shard]
        if m is None and size > 0:
            with open(path, "rb") as f:
                actual = os.fstat(f.fileno()).st_size
                if actual != size:
                    raise SafetensorError(
                        f"{path}: the file changed size since it was opened ({size} then {actual} bytes)"
                    )
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            self._maps[shard] = m
        try:
            _check_unshrunk(m, path, size)
        except ValueError as e:
            raise _err(e) from None
        return m

    def _build(self, name: str, dtype: str, shape: tuple, raw: np.ndarray) -> Any:
        """A fresh array or tensor of ``shape`` from the stored bytes ``raw`` (uint8)."""
        path = self._file._path
        if self._framework == "numpy":
            if dtype in _DECODED:
                return _decode(path, dtype, name, raw).reshape(shape)
            np_dtype = _NATIVE.get(dtype)
            if np_dtype is None:
                raise SafetensorError(f"tensor {name!r}: {dtype} has no numpy type")
            return raw.view(np_dtype).reshape(shape)
        import torch

        t = _torch_of(torch.from_numpy(raw), dtype, name, shape)
        return t if self._device.type == "cpu" else t.to(self._device)

    def get_tensor(self, name: str) -> Any:
        """Tensor ``name``: a writable zero-copy array (np) or tensor (pt) over the private
        map, or with ``backend="pread"`` one in memory of its own; BF16 and F8 decode to
        float32 copies for numpy, which has no such types."""
        (_, dtype, shape, start, end), shard = self._find(name)
        shape = tuple(int(n) for n in shape)
        if self._pread:
            return self._build(name, dtype, shape, self._read(shard, start, end))
        mm = self._map(shard)
        if end == start or mm is None:
            return self._build(name, dtype, shape, np.zeros(0, np.uint8))
        if self._framework == "numpy":
            np_dtype = _NATIVE.get(dtype)
            if np_dtype is not None and start % np_dtype.itemsize == 0:
                return np.frombuffer(mm, np_dtype, _numel(shape), start).reshape(shape)
            return self._build(name, dtype, shape, np.frombuffer(mm, np.uint8, end - start, start))
        import torch

        # Through numpy: its view holds a buffer export of the map, so close() cannot
        # unmap it under a live tensor (torch.frombuffer holds none).
        raw = torch.from_numpy(np.frombuffer(mm, np.uint8, end - start, start))
        t = _torch_of(raw, dtype, name, shape)
        return t if self._device.type == "cpu" else t.to(self._device)

    def get_slice(self, name: str) -> SafeSlice:
        """Tensor ``name`` to be read part by part (``[...]``)."""
        return SafeSlice(self, name)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, in the order of their data."""
        return {k: self.get_tensor(k) for k in self.offset_keys()}

    def close(self) -> None:
        """Refuse further use; tensors already made keep their map alive."""
        self._closed = True
        self._file.close()
        for m in self._maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass  # arrays still export it; it is unmapped when the last one dies
        self._maps = [None] * len(self._maps)


def _torch_of(raw: Any, dtype: str, name: str, shape: tuple) -> Any:
    """The uint8 tensor ``raw`` of stored bytes viewed as ``dtype`` with ``shape``."""
    import torch

    torch_dtype = torch_dtypes().get(dtype)
    if torch_dtype is None:
        raise SafetensorError(f"tensor {name!r}: {dtype} has no torch dtype in this torch")
    if dtype == "F4" and shape:
        # torch packs two F4 values per element; the file counts values.
        shape = shape[:-1] + (shape[-1] // 2,)
    if raw.numel() == 0:
        return torch.empty(shape, dtype=torch_dtype)
    return raw.view(torch_dtype).reshape(shape)

