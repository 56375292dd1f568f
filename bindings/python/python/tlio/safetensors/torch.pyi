"""``safetensors.torch``'s functions over tlio's core."""

import os
from typing import Dict, List, Optional, Set, Tuple, Union

import torch

def storage_ptr(tensor: torch.Tensor) -> int: ...
def storage_size(tensor: torch.Tensor) -> int: ...
def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file (``metadata=None``: no ``__metadata__``)."""
def save_file(
    tensors: Dict[str, torch.Tensor],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Write a safetensors file; shared tensors are a RuntimeError (use save_model)."""
def load(data: bytes) -> Dict[str, torch.Tensor]:
    """The tensors of a file given as bytes."""
def load_file(
    filename: Union[str, os.PathLike], device: Union[str, int] = "cpu", *, backend: str = "mmap"
) -> Dict[str, torch.Tensor]:
    """The tensors of a file: zero-copy and writable over a private map ("mmap"), or
    read into memory of their own ("pread")."""
def save_model(
    model: torch.nn.Module,
    filename: str,
    metadata: Optional[Dict[str, str]] = None,
    force_contiguous: bool = True,
) -> None:
    """Save a model's state_dict with each shared tensor once."""
def load_model(
    model: torch.nn.Module,
    filename: Union[str, os.PathLike],
    strict: bool = True,
    device: Union[str, int] = "cpu",
    *,
    backend: str = "mmap",
) -> Tuple[Set[str], List[str]]:
    """Load into ``model``, restoring shared tensors: (missing, unexpected)."""
