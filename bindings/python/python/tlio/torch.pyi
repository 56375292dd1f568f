import os
from typing import Any, Dict, Iterator, Literal, Mapping, Optional, Protocol, Tuple, Union, overload

import torch
from torch.utils.data import IterableDataset

from tlio._torch_async import PendingSave as PendingSave
from tlio.checkpoint import Checkpoint
from tlio.tokens import Cursor, TokenStream

PathLike = Union[str, "os.PathLike[str]"]

class Stateful(Protocol):
    """What ``state=`` takes: an object whose ``state_dict()`` is JSON values."""

    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...

MODEL_FILE: str
OPTIMIZER_FILE: str
TIED_KEY: str
TYPE_PREFIX: str

@overload
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
    blocking: Literal[True] = ...,
    state: Optional[Mapping[str, Stateful]] = ...,
) -> str: ...
@overload
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
    blocking: Literal[False],
    state: Optional[Mapping[str, Stateful]] = ...,
) -> PendingSave: ...
def load(
    dir: PathLike,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = ...,
    stream: Optional[TokenStream] = ...,
    *,
    step: Optional[int] = ...,
    state: Optional[Mapping[str, Stateful]] = ...,
) -> Checkpoint: ...

class TokenDataset(IterableDataset):
    """A TokenStream as an endless IterableDataset of int64 (x, y) tensors [batch, seq_len],
    zero-copy from the stream's arrays; Stateful through the stream's cursor. Under N > 1
    DataLoader workers, worker k makes batches k, k + N, ... (the loader yields the
    batches of num_workers=0) and its state is {"cursor", "worker", "num_workers"}; a
    state of another num_workers is refused."""

    stream: TokenStream
    def __init__(self, stream: TokenStream) -> None: ...
    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]: ...
    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> Dict[str, Any]:
        """The cursor, or in worker k of N > 1 {"cursor", "worker", "num_workers"}."""
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore; a state of another num_workers is a ValueError naming both."""
