"""Type stubs of tlio.checkpoint: atomic, verified training checkpoints."""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple, Union

import numpy as np
import numpy.typing as npt

PathLike = Union[str, os.PathLike[str]]

class _Generator(Protocol):
    def state(self) -> Dict[str, int]: ...

EXTRA_KEYS: Tuple[str, ...]
__all__: List[str]

@dataclass
class Checkpoint:
    """A checkpoint that verified, as load_checkpoint returns it."""

    path: str
    step: int
    model: Dict[str, npt.NDArray[np.float32]]
    opt: Optional[Dict[str, Any]]
    rng_state: Optional[Dict[str, int]]
    extra: Dict[str, Any]
    config: Optional[Dict[str, Any]] = ...
    skipped: List[Tuple[str, str]] = ...
    state: Dict[str, Any] = ...

def step_name(step: int) -> str:
    """``step-`` and the step in at least six digits."""

def save_checkpoint(
    dir: PathLike,
    model: Mapping[str, npt.NDArray[np.float32]],
    opt: Optional[Mapping[str, Any]],
    step: int,
    rng_state: Union[None, _Generator, Mapping[str, int]],
    extra: Optional[Mapping[str, Any]],
    keep: Optional[int] = None,
    *,
    config: Optional[Mapping[str, Any]] = None,
    overwrite: bool = False,
) -> str:
    """Save a step atomically with tlio's protocol; returns the step directory."""

def verify_step_dir(path: PathLike) -> List[str]:
    """The problems of one step directory (empty when it verifies)."""

def load_checkpoint(dir: PathLike, step: Optional[int] = None) -> Checkpoint:
    """The checkpoint ``tlio ckpt latest`` picks, or exactly ``step`` (never another)."""
