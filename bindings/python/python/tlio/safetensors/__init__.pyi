"""safetensors files for every dtype of the safetensors library 0.8, over tlio's core."""

import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union, overload

import numpy as np
from numpy.typing import NDArray

_Path = Union[str, "os.PathLike[str]"]
_Header = Dict[str, Tuple[str, Tuple[int, ...]]]

DTYPE_SIZES: Dict[str, int]
"""Every whole-byte dtype, name -> bytes per element."""
DTYPE_BITS: Dict[str, int]
"""Every dtype (F4 and F6_* included), name -> bits per element."""
E4M3_MAX: float
"""448.0, the largest finite F8_E4M3 magnitude."""

def save_safetensors(
    path: _Path,
    tensors: Mapping[str, NDArray[np.generic]],
    meta: Optional[Mapping[str, str]] = None,
    dtypes: Optional[Mapping[str, str]] = None,
    *,
    durable: bool = True,
) -> None:
    """Write ``tensors`` canonically and atomically; ``dtypes`` overrides (BF16, F16,
    F8_E4M3, F8_E5M2 from float32; F32/F64 from float64; BF16 from uint16 bits; F8_* from
    uint8 codes). float64 without an override, unknown names and other conversions are a
    ``ValueError``; ``durable=False`` skips the fsyncs."""

def read_header(path: _Path) -> Tuple[_Header, Dict[str, str]]:
    """Each tensor's (dtype, shape) in file order and the metadata; reads the header only."""

def load_safetensors(path: _Path, *, raw: bool = False) -> Tuple[Dict[str, NDArray[np.generic]], Dict[str, str]]:
    """Every tensor as a writable C-contiguous array (BF16/F8 decoded to float32), and the
    metadata; ``raw=True`` gives BF16 as uint16, 8-bit floats as uint8 codes, and the
    raw-only dtypes as flat uint8 arrays of their bytes."""

class SafetensorsFile:
    """A file, sharded index or model directory opened for zero-copy reads."""

    def __init__(self, path: _Path) -> None: ...
    def __enter__(self) -> "SafetensorsFile": ...
    def __exit__(self, *exc: object) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, name: object) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def keys(self) -> List[str]:
        """The tensor names in file order."""
    def metadata(self) -> Dict[str, str]:
        """The metadata (for a sharded model, the entries every shard shares)."""
    def header(self) -> _Header:
        """name -> (dtype, shape)."""
    def get_tensor(self, name: str, *, raw: bool = False) -> NDArray[np.generic]:
        """A read-only view into the map (a decoded float32 copy for BF16 and F8)."""
    def close(self) -> None:
        """Refuse further reads; existing views keep the map alive."""

@overload
def safe_open(path: _Path) -> SafetensorsFile:
    """Open a safetensors file, a ``model.safetensors.index.json`` or a model directory."""
@overload
def safe_open(
    path: _Path, framework: str, device: Any = "cpu", *, backend: str = "mmap"
) -> "CompatFile":
    """The ``safetensors`` package's handle (framework "np", "numpy", "pt", "torch" or
    "pytorch"; backend "mmap", a private map, or "pread", tensors in memory of their own)."""

class SafeSlice:
    """Part of one tensor, read on indexing: only the bytes of the slice."""

    def get_shape(self) -> List[int]: ...
    def get_dtype(self) -> str: ...
    def __getitem__(self, key: Any) -> Any: ...

class CompatFile:
    """``safe_open(path, framework=...)``: the ``safetensors`` package's interface."""

    def __enter__(self) -> "CompatFile": ...
    def __exit__(self, *exc: object) -> None: ...
    def keys(self) -> List[str]:
        """The tensor names, sorted."""
    def offset_keys(self) -> List[str]:
        """The tensor names in the order of their data."""
    def metadata(self) -> Optional[Dict[str, str]]:
        """The metadata, or ``None`` when the file has no ``__metadata__``."""
    def get_tensor(self, name: str) -> Any:
        """A writable zero-copy array or tensor over a private copy-on-write map (with
        ``backend="pread"``, in memory of its own)."""
    def get_slice(self, name: str) -> SafeSlice: ...
    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, in the order of their data."""
    def close(self) -> None: ...

class SafetensorError(ValueError):
    """Where the ``safetensors`` package raises its own error; a ``ValueError``."""
