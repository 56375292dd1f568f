"""``safetensors.numpy``'s functions over tlio's core."""

import os
from typing import Dict, Optional, Union

import numpy as np

def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file (``metadata=None``: no ``__metadata__``)."""
def save_file(
    tensor_dict: Dict[str, np.ndarray],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Write a safetensors file (renamed into place; no fsync, like the package)."""
def load(data: bytes) -> Dict[str, np.ndarray]:
    """The arrays of a file given as bytes (writable copies)."""
def load_file(filename: Union[str, os.PathLike], *, backend: str = "mmap") -> Dict[str, np.ndarray]:
    """The arrays of a file, in memory they own."""
