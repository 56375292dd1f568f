import os
from typing import Any, Mapping, Optional, Union

import torch

from tlio.checkpoint import Checkpoint
from tlio.tokens import TokenStream

PathLike = Union[str, "os.PathLike[str]"]

MODEL_FILE: str
OPTIMIZER_FILE: str
TIED_KEY: str
TYPE_PREFIX: str

def save(
    dir: PathLike,
    step: int,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = ...,
    stream: Optional[TokenStream] = ...,
    *,
    extra: Optional[Mapping[str, Any]] = ...,
    keep: Optional[int] = ...,
    config: Optional[Mapping[str, Any]] = ...,
    overwrite: bool = ...,
) -> str: ...
def load(
    dir: PathLike,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = ...,
    stream: Optional[TokenStream] = ...,
    *,
    step: Optional[int] = ...,
) -> Checkpoint: ...
