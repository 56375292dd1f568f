"""``tlio.torch.TokenDataset``: a ``TokenStream`` as a torch ``IterableDataset``.

It yields the stream's batches as int64 torch tensors that share the memory of the
stream's fresh numpy arrays (``torch.from_numpy``: no copy), endlessly, and is a
``Stateful`` whose state is the stream's cursor, so torchdata's ``StatefulDataLoader``
(and torch's distributed checkpoint) resume it exactly.

Invariants: the position is the stream's and only the stream's (this class holds no
counter of its own); a ``DataLoader`` with more than one worker is refused, because
every worker would iterate its own copy of the same stream and the loader would yield
each batch once per worker.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

import torch
from torch.utils.data import IterableDataset, get_worker_info

from tlio.tokens import TokenStream

__all__ = ["TokenDataset"]


class TokenDataset(IterableDataset):
    """The batches of ``stream`` as torch tensors: endless ``(x, y)`` int64 pairs of
    shape ``[batch, seq_len]`` with ``y[:, t] == x[:, t + 1]``.

    The stream already batches, so give it to a loader with ``batch_size=None``:
    ``StatefulDataLoader(TokenDataset(stream), batch_size=None)``. ``state_dict()`` and
    ``load_state_dict()`` are the stream's cursor and ``restore``; the loader's own
    state_dict then resumes the very next batch. ``num_workers`` 0 or 1 (the single
    worker reads ahead; the loader keeps the state of the batch it last handed out);
    more workers raise ``ValueError`` when iteration starts, since each would read the
    same stream and repeat every batch. For data-parallel training give each rank its
    own stream (``TokenStream(..., rank=r, world_size=n)``) instead.

    Iterating twice continues the same stream (there are no epochs to restart). The
    loader's worker is a copy of the dataset: while it runs, the position lives in the
    loader's ``state_dict()``, not in the ``stream`` object of this process.
    """

    def __init__(self, stream: TokenStream) -> None:
        if not isinstance(stream, TokenStream):
            raise TypeError(f"TokenDataset wraps a tlio.tokens.TokenStream, got {type(stream).__name__}")
        self.stream = stream

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ValueError(
                f"TokenDataset in a DataLoader with num_workers={info.num_workers}: every worker "
                "would read the same stream and each batch would come out "
                f"{info.num_workers} times; use num_workers=0 or 1 (one stream per rank for "
                "data parallelism)"
            )
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        x, y = self.stream.next_batch()
        return torch.from_numpy(x), torch.from_numpy(y)

    def state_dict(self) -> Dict[str, Any]:
        """The stream's cursor (``TokenStream.cursor()``)."""
        return self.stream.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the stream's cursor (checked strictly; unchanged on error)."""
        self.stream.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"TokenDataset({self.stream!r})"
