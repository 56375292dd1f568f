"""safetensors files for every dtype of the safetensors library 0.8, over tlio's core.

Two interfaces over the same core:

- tlio's own names, below (``save_safetensors``, ``read_header``,
  ``load_safetensors``, ``safe_open(path)``);
- a drop-in for the ``safetensors`` package: ``tlio.safetensors.numpy`` and
  ``tlio.safetensors.torch`` (``save_file``, ``load_file``, ``save``, ``load``, and for
  torch ``save_model``, ``load_model``), ``safe_open(path, framework=..., device=...)``
  with ``get_slice``, and ``SafetensorError``. One changed import switches a program
  (``from tlio.safetensors.torch import save_file, load_file``).

The rules (dtype names, the five reader rules and the stricter ones, rounding to nearest
even, the F8_E4M3 range, the canonical writer, the model and index checks) are
tlio-core's; this module maps numpy dtypes to safetensors dtypes and builds arrays.

- ``save_safetensors`` writes canonically and atomically (fsyncs unless ``durable=False``).
- ``read_header`` reads the header and the file size only.
- ``load_safetensors`` returns writable, C-contiguous arrays, decoded exactly.
- ``safe_open`` returns read-only numpy views into the memory map (a decoded copy for
  BF16 and F8), on a file, a sharded index or a model directory.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Mapping
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from tlio._tlio import safetensors as _st

__all__ = [
    "DTYPE_SIZES",
    "DTYPE_BITS",
    "E4M3_MAX",
    "save_safetensors",
    "read_header",
    "load_safetensors",
    "safe_open",
    "SafetensorsFile",
    "SafetensorError",
]


class SafetensorError(ValueError):
    """A malformed file, a bad index or a misuse, where the ``safetensors`` package raises
    its own ``SafetensorError``. It is a ``ValueError``, so ``except ValueError`` (tlio's
    own interface raises ``ValueError``) catches it too."""

_DTYPES = _st.dtypes()  # (name, bits, size or None, encodable, decodable), rank order

#: Every whole-byte dtype, name -> bytes per element (writer-rank order).
DTYPE_SIZES: Dict[str, int] = {name: size for name, _, size, _, _ in _DTYPES if size is not None}
#: Every dtype, sub-byte ones (F4, F6_*) included, name -> bits per element.
DTYPE_BITS: Dict[str, int] = {name: bits for name, bits, _, _, _ in _DTYPES}
#: The largest finite F8_E4M3 magnitude; beyond it encoding is an error, never a clip.
E4M3_MAX = 448.0

# numpy's own types, as stored: the safetensors dtype a plain array is written as, and
# the numpy dtype a tensor of that safetensors dtype loads as.
_NATIVE: Dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "C64": np.dtype("<c8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_FROM_NUMPY: Dict[Tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in _NATIVE.items()
}
# Decoded to float32 unless raw=True, which gives their codes.
_DECODED = {"BF16": np.dtype("<u2"), "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1")}
# float32 values encoded (round to nearest even) to these; from uint16 / uint8 raw codes.
_FROM_F32 = ("BF16", "F16", "F8_E4M3", "F8_E5M2")
_F8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0")

# load_safetensors reads each tensor into memory it owns (one pread per tensor, the GIL
# released), never a private map of the file: a private map's untouched pages still
# show later writes to the file, and a file truncated underneath kills the process with
# SIGBUS. bench/python_safetensors.py measures it against the package's reader.


def _fail(path: Any, message: str) -> ValueError:
    return ValueError(f"{os.fspath(path)}: {message}")


def _empty(path: str, name: str, shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A fresh array for one tensor, its failures naming the file and the tensor.

    numpy refuses more than 64 dimensions and sizes past its index range with a bare
    ValueError; an allocation beyond the memory available (RAM, swap, a resource limit)
    is an OSError with errno ENOMEM, as the system reports it, but naming the file.
    """
    try:
        return np.empty(shape, dtype)
    except MemoryError:
        nbytes = _numel(shape) * dtype.itemsize
        raise OSError(
            errno.ENOMEM,
            f"{path}: tensor {name!r}: cannot allocate {nbytes} bytes to load it "
            f"({os.strerror(errno.ENOMEM)})",
        ) from None
    except ValueError as e:
        raise _fail(path, f"tensor {name!r}: shape {list(shape)} has no numpy array ({e})") from None


def _shaped(path: str, name: str, a: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
    """``a`` reshaped to the tensor's shape, numpy's refusals naming the file and tensor."""
    try:
        return a.reshape(shape)
    except ValueError as e:
        raise _fail(path, f"tensor {name!r}: shape {list(shape)} has no numpy array ({e})") from None


def _numpy_source(path: Any, name: str, a: np.ndarray) -> Optional[str]:
    """The safetensors dtype an array is written as without an override."""
    if a.dtype.kind in "fiubc":
        return _FROM_NUMPY.get((a.dtype.kind, a.dtype.itemsize))
    return None


def _plan(path: Any, name: str, a: np.ndarray, target: Optional[str]) -> Tuple[str, str]:
    """(dtype, mode) for one tensor: mode "raw" writes its bytes, "f32"/"f64" encodes."""
    natural = _numpy_source(path, name, a)
    kind = str(a.dtype)
    if target is None:
        if kind == "float64":
            raise _fail(
                path,
                f"tensor {name!r}: float64 is never converted silently; "
                'pass dtypes={name: "F64"} to keep it or "F32" to round it once',
            )
        if natural is None:
            raise _fail(path, f"tensor {name!r}: numpy dtype {kind} has no safetensors dtype")
        return natural, "raw"
    if target not in DTYPE_BITS:
        raise _fail(
            path,
            f"tensor {name!r}: unknown dtype {target!r} "
            "(dtype names are exact and upper-case, e.g. BF16)",
        )
    if target == natural:
        return target, "raw"
    if kind == "float32" and target in _FROM_F32:
        return target, "f32"
    if kind == "float64" and target == "F32":
        return target, "f64"
    if kind == "uint16" and target == "BF16":
        return target, "raw"
    if kind == "uint8" and target in _F8:
        return target, "raw"
    raise _fail(
        path,
        f"tensor {name!r}: cannot write a {kind} array as {target} "
        "(allowed: the array's own dtype; BF16/F16/F8_E4M3/F8_E5M2 from float32; "
        "F32/F64 from float64; BF16 from uint16 bits; F8_* from uint8 codes)",
    )


def _flat(a: np.ndarray, mode: str) -> np.ndarray:
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not _LITTLE):
        a = a.astype(a.dtype.newbyteorder("<"))
    flat = np.ascontiguousarray(a).reshape(-1)
    if mode == "raw":
        return flat.view(np.uint8)
    return flat


_LITTLE = np.little_endian


def save_safetensors(
    path: "os.PathLike[str] | str",
    tensors: Mapping,
    meta: Optional[Mapping] = None,
    dtypes: Optional[Mapping] = None,
    *,
    durable: bool = True,
) -> None:
    """Write ``tensors`` (name -> numpy array) and ``meta`` (str -> str) to ``path``.

    The dtype comes from the array (float32 F32, float16 F16, bool BOOL, int8..int64
    I8..I64, uint8..uint64 U8..U64, complex64 C64); ``dtypes={name: DTYPE}`` overrides
    it: BF16, F16, F8_E4M3 or F8_E5M2 from float32 values (round to nearest, ties to
    even; F8_E4M3 beyond 448 is a ``ValueError``), F64 or F32 from float64 (F32 rounds
    once; overflow is an error), BF16 from uint16 bits and F8_* from uint8 codes
    (written untouched). float64 without an override is a ``ValueError``.

    The bytes are canonical (dtype rank, then name; compact JSON; space padding) and
    equal ``safetensors.numpy.save_file``'s for the same tensors and one metadata key.
    The file appears whole or not at all (temporary name, rename); ``durable=True``
    also fsyncs the file and its directory.
    """
    path = os.fspath(path)
    if not isinstance(tensors, Mapping):
        raise _fail(path, "tensors must be a mapping of names to numpy arrays")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        raise _fail(path, "meta must be a mapping of str to str")
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise _fail(path, f"metadata: key {k!r} has a non-string key or value {v!r}")
    dtypes = {} if dtypes is None else dtypes
    if not isinstance(dtypes, Mapping):
        raise _fail(path, "dtypes must be a mapping of tensor names to dtype names")
    for k in dtypes:
        if k not in tensors:
            raise _fail(path, f"dtypes: key {k!r} names no tensor")
    items = []
    for name, a in tensors.items():
        if not isinstance(name, str):
            raise _fail(path, f"tensor names must be str, got {name!r}")
        if isinstance(a, np.generic):
            a = np.asarray(a)  # a numpy scalar is a 0-d tensor
        if not isinstance(a, np.ndarray):
            raise _fail(path, f"tensor {name!r}: a numpy array is needed, got {type(a).__name__}")
        dtype, mode = _plan(path, name, a, dtypes.get(name))
        items.append((name, dtype, [int(n) for n in a.shape], _flat(a, mode), mode))
    # An empty mapping writes no __metadata__ (python.md), with or without fsyncs.
    _st.save_file(path, items, dict(meta) or None, bool(durable))


def read_header(
    path: "os.PathLike[str] | str",
) -> Tuple[Dict[str, Tuple[str, Tuple[int, ...]]], Dict[str, str]]:
    """Each tensor's (dtype, shape) in file order, and the metadata.

    Reads the header and the file size only, and enforces all five reader rules. An
    ``s3://bucket/key`` URL is read by range requests (the header, never the data).
    """
    rows, meta, _size, _ = _st.header(os.fspath(path))
    return {name: (dtype, tuple(shape)) for name, dtype, shape, _, _ in rows}, dict(meta)


def _map(path: str, size: int, access: int) -> Optional[mmap.mmap]:
    """The file mapped whole, checked to have the size its header was validated for."""
    with open(path, "rb") as f:
        actual = os.fstat(f.fileno()).st_size
        if actual != size:
            raise _fail(path, f"the file changed size while being read ({size} then {actual} bytes)")
        if size == 0:
            return None
        return mmap.mmap(f.fileno(), 0, access=access)


def _read_into(fd: int, out: np.ndarray, offset: int, path: str) -> None:
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise _fail(path, "the file ended early while being read")
        done += n


def _raw_only(path: str, name: str, dtype: str) -> ValueError:
    return _fail(
        path,
        f"tensor {name!r}: {dtype} is stored as raw bytes only (no numpy type); "
        "pass raw=True for its bytes as a flat uint8 array",
    )


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _codes_view(mm: Any, name: str, dtype: str, start: int, end: int) -> np.ndarray:
    """The stored bytes of one tensor as a read-only flat uint8 view (no copy)."""
    if end == start:
        return np.zeros(0, np.uint8)
    return np.frombuffer(mm, np.uint8, end - start, start)


def load_safetensors(
    path: "os.PathLike[str] | str", *, raw: bool = False
) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Every tensor (name -> writable C-contiguous array, in file order) and the metadata.

    BF16, F8_E4M3 and F8_E5M2 decode exactly to float32, F16 to float16, C64 to
    complex64, the rest to their numpy type. ``raw=True`` gives BF16 as uint16 bits and
    8-bit floats as uint8 codes, so re-saving writes the same bytes; the raw-only dtypes
    (FNUZ, E8M0, F6, F4) load only with ``raw=True``, as a flat uint8 array of their bytes.

    The arrays own their memory: nothing that happens to the file afterwards (rewritten
    in place, truncated, deleted) changes them.
    """
    path = os.fspath(path)
    rows, meta, size, _ = _st.header(path)
    out: Dict[str, np.ndarray] = {}
    with open(path, "rb") as f:
        fd = f.fileno()
        actual = os.fstat(fd).st_size
        if actual != size:
            raise _fail(path, f"the file changed size while being read ({size} then {actual} bytes)")
        for name, dtype, shape, start, end in rows:
            shape = tuple(shape)
            if dtype in _DECODED and not raw:
                codes = _empty(path, name, (end - start,), np.dtype("u1"))
                _read_into(fd, codes, start, path)
                out[name] = _shaped(path, name, _decode(path, dtype, name, codes), shape)
                continue
            np_dtype = _NATIVE.get(dtype) or (_DECODED.get(dtype) if raw else None)
            if np_dtype is None:
                if not raw:
                    raise _raw_only(path, name, dtype)
                np_dtype, shape = np.dtype("u1"), (end - start,)
            a = _empty(path, name, shape, np_dtype)
            _read_into(fd, a, start, path)
            out[name] = a
    return out, dict(meta)


def _decode(path: str, dtype: str, name: str, codes: np.ndarray) -> np.ndarray:
    """BF16/F8 codes decoded to float32 (a fresh array), failures naming the file."""
    try:
        return _st.decode(dtype, name, codes)
    except MemoryError:
        raise OSError(
            errno.ENOMEM,
            f"{path}: tensor {name!r}: cannot allocate {codes.size * 4} bytes to decode it "
            f"({os.strerror(errno.ENOMEM)})",
        ) from None


def _check_unshrunk(mm: Any, path: str, size: int) -> None:
    """Refuse to hand out a view of a file that is now shorter than when it was opened.

    The views are a live map of the file: a page past the file's new end faults
    (SIGBUS), so a file truncated or rewritten in place underneath (``open(p, "wb")``,
    ``cp`` over it) is refused here, with the file named, before a new view is made.
    Views made earlier cannot be guarded: docs/python.md says so.
    """
    if mm is None:
        return
    now = mm.size()  # fstat of the mapped file itself, not of whatever the path names now
    if now < size:
        raise _fail(
            path,
            f"the file shrank from {size} to {now} bytes since it was opened (it was "
            "rewritten in place); open it again",
        )


class SafetensorsFile:
    """A safetensors file, sharded index or model directory opened for zero-copy reads.

    ``get_tensor`` returns read-only numpy views into the memory map (their ``base`` is
    the map, which they keep alive), or a decoded float32 copy for BF16 and F8. Use it
    as a context manager, or call ``close()``; a closed file refuses new reads.

    The views are a live map of the file, by design (that is what makes them free):
    a file replaced by renaming (every tlio writer, ``safetensors``' own) leaves them
    intact, but one rewritten in place shows through them, and one truncated
    underneath makes a read of a view past the new end a SIGBUS. ``get_tensor``
    refuses a file that shrank since it was opened with ``ValueError``.
    """

    def __init__(self, path: "os.PathLike[str] | str") -> None:
        self._path = os.fspath(path)
        p = self._path
        if os.path.isdir(p) or p.endswith(".index.json"):
            shards, entries, meta = _st.model(p)
            self._has_meta = bool(meta)
            self._shards = [(sp, sz) for sp, sz in shards]
            self._entries = {row[0]: (row, shard) for row, shard in entries}
        else:
            rows, meta, size, has_meta = _st.header(p)
            self._has_meta = has_meta
            self._shards = [(p, size)]
            self._entries = {row[0]: (row, 0) for row in rows}
        self._meta = dict(meta)
        self._maps: list = [None] * len(self._shards)
        self._closed = False

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._entries)} tensors"
        return f"<tlio.safetensors.SafetensorsFile {self._path!r} ({state})>"

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list:
        """The tensor names, in file order (shard by shard for a model)."""
        return list(self._entries)

    def metadata(self) -> Dict[str, str]:
        """The ``__metadata__`` (for a sharded model: the entries every shard shares)."""
        return dict(self._meta)

    def header(self) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
        """name -> (dtype, shape) for every tensor."""
        return {n: (row[1], tuple(row[2])) for n, (row, _) in self._entries.items()}

    def _shard_map(self, i: int) -> Any:
        m = self._maps[i]
        if m is None:
            path, size = self._shards[i]
            m = _map(path, size, mmap.ACCESS_READ)
            self._maps[i] = m
        return m

    def get_tensor(self, name: str, *, raw: bool = False) -> np.ndarray:
        """Tensor ``name``: a read-only view into the map for every dtype numpy has, a
        fresh float32 array for BF16 and F8 (``raw=True``: their codes, as views)."""
        if self._closed:
            raise ValueError(f"{self._path}: the file is closed")
        found = self._entries.get(name)
        if found is None:
            raise ValueError(f"{self._path}: no tensor named {name!r}")
        (_, dtype, shape, start, end), shard = found
        shape = tuple(shape)
        path = self._shards[shard][0]
        mm = self._shard_map(shard)
        _check_unshrunk(mm, path, self._shards[shard][1])
        if dtype in _DECODED and not raw:
            codes = _codes_view(mm, name, dtype, start, end)
            return _shaped(path, name, _decode(path, dtype, name, codes), shape)
        np_dtype = _NATIVE.get(dtype) or (_DECODED.get(dtype) if raw else None)
        if np_dtype is None:
            if not raw:
                raise _raw_only(path, name, dtype)
            np_dtype, shape = np.dtype("u1"), (end - start,)
        if end == start:
            a = _empty(path, name, shape, np_dtype)
            a.flags.writeable = False
            return a
        return _shaped(path, name, np.frombuffer(mm, np_dtype, _numel(shape), start), shape)

    def close(self) -> None:
        """Refuse further reads; the map lives on while views of it do."""
        self._closed = True
        for m in self._maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass  # views still export it; it is unmapped when the last one dies
        self._maps = [None] * len(self._shards)


def safe_open(
    path: "os.PathLike[str] | str",
    framework: Optional[str] = None,
    device: Any = "cpu",
    *,
    backend: str = "mmap",
) -> Any:
    """Open a safetensors file, a ``model.safetensors.index.json`` or a model directory.

    The index is checked against its shards as ``tlio model`` checks it; a shard that is
    missing or invalid is a ``ValueError`` naming it.

    Without ``framework``: tlio's own ``SafetensorsFile`` (read-only numpy views).
    With ``framework="np"|"numpy"|"pt"|"torch"|"pytorch"``: the ``safetensors``
    package's interface (sorted ``keys()``, ``metadata()`` that is ``None`` without
    metadata, writable zero-copy ``get_tensor``, ``get_slice``, ``get_tensors()``),
    raising ``SafetensorError``. ``backend="pread"`` (keyword-only, as in the package)
    reads each tensor with pread(2) into memory it owns instead of mapping the file.
    """
    from tlio.safetensors._compat import CompatFile, check_backend

    if framework is None:
        if device != "cpu" or check_backend(backend) != "mmap":
            what = f"device={device!r}" if device != "cpu" else f"backend={backend!r}"
            raise ValueError(f"{os.fspath(path)}: {what} needs a framework (pt or np)")
        return SafetensorsFile(path)
    return CompatFile(path, framework, device, backend)
