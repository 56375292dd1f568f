"""``safetensors.numpy``'s functions over tlio's core: one changed import.

``from tlio.safetensors.numpy import save_file, load_file, save, load`` behaves as the
``safetensors`` package's module of the same name: the same signatures and defaults,
``metadata=None`` writes no ``__metadata__`` and ``{}`` an empty one, float64 is saved
as F64, and the bytes are the package's for the same arrays (one metadata key; several
are sorted by key, where the package's order is arbitrary). Loaded arrays are writable
and owned. Stricter, by design: files with duplicate keys, unknown header fields or
``"__metadata__": null`` are refused with ``SafetensorError``.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Union

import numpy as np

from tlio._tlio import safetensors as _st
from tlio.safetensors import (
    _DECODED,
    _NATIVE,
    SafetensorError,
    _decode,
    _flat,
    _numel,
    _plan,
    _raw_only,
    load_safetensors,
)

__all__ = ["save", "save_file", "load", "load_file"]


def _items(tensor_dict: Dict[str, np.ndarray]) -> list:
    """The binding's items for a dict of arrays, refused as the package refuses them."""
    if not isinstance(tensor_dict, dict):
        raise SafetensorError(f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    items = []
    for name, a in tensor_dict.items():
        if not isinstance(name, str):
            raise SafetensorError(f"tensor names must be str, got {name!r}")
        if isinstance(a, np.generic):
            a = np.asarray(a)
        if not isinstance(a, np.ndarray):
            raise SafetensorError(f"Key `{name}` is invalid, expected np.ndarray but received {type(a)}")
        # float64 is F64 here, as in the package (the chapter's writer asks first).
        target = "F64" if a.dtype.kind == "f" and a.dtype.itemsize == 8 else None
        try:
            dtype, mode = _plan("<memory>", name, a, target)
        except ValueError as e:
            raise SafetensorError(str(e).split(": ", 1)[-1]) from None
        items.append((name, dtype, [int(n) for n in a.shape], _flat(a, mode), mode))
    return items


def _meta(metadata: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorError("metadata must be a dict of str to str")
    return dict(metadata)


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensor_dict`` and ``metadata``."""
    try:
        return _st.serialize(_items(tensor_dict), _meta(metadata))
    except SafetensorError:
        raise
    except ValueError as e:
        raise SafetensorError(str(e)) from None


def save_file(
    tensor_dict: Dict[str, np.ndarray],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Write ``tensor_dict`` to ``filename`` (under a temporary name, then renamed; no
    fsync, like the package; ``tlio.safetensors.save_safetensors`` adds them)."""
    path = os.fspath(filename)
    try:
        _st.save_file(path, _items(tensor_dict), _meta(metadata), False)
    except SafetensorError:
        raise
    except (FileNotFoundError, OSError):
        raise
    except ValueError as e:
        raise SafetensorError(str(e)) from None


def _arrays_from(buf: bytes, rows: list, where: str) -> Dict[str, np.ndarray]:
    """Writable, owned arrays of ``rows`` (name, dtype, shape, start, end) over ``buf``."""
    out: Dict[str, np.ndarray] = {}
    for name, dtype, shape, start, end in rows:
        shape = tuple(shape)
        codes = np.frombuffer(buf, np.uint8, end - start, start) if end > start else np.zeros(0, np.uint8)
        if dtype in _DECODED:
            out[name] = _decode(where, dtype, name, codes).reshape(shape)
            continue
        np_dtype = _NATIVE.get(dtype)
        if np_dtype is None:
            raise SafetensorError(str(_raw_only(where, name, dtype)))
        a = np.empty(shape, np_dtype)
        if _numel(shape):
            a.reshape(-1).view(np.uint8)[:] = codes
        out[name] = a
    return out


def load(data: bytes) -> Dict[str, np.ndarray]:
    """The arrays of a safetensors file given as bytes (writable copies)."""
    try:
        rows, _meta_, _size = _st.header_of_bytes(data)
    except ValueError as e:
        raise SafetensorError(str(e)) from None
    return _arrays_from(data, rows, "<bytes>")


def load_file(filename: Union[str, os.PathLike], *, backend: str = "mmap") -> Dict[str, np.ndarray]:
    """The arrays of ``filename`` (writable, in memory they own, whichever ``backend``:
    "mmap" or "pread", accepted for the package's signature, read the same way)."""
    from tlio.safetensors._compat import check_backend

    check_backend(backend)
    try:
        return load_safetensors(filename)[0]
    except (FileNotFoundError, OSError):
        raise
    except SafetensorError:
        raise
    except ValueError as e:
        raise SafetensorError(str(e)) from None
