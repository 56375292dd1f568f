"""``tlio.torch.TokenDataset``: a ``TokenStream`` as a torch ``IterableDataset``.

It yields the stream's batches as int64 torch tensors that share the memory of the
stream's fresh numpy arrays (``torch.from_numpy``: no copy), endlessly, and is a
``Stateful`` whose state is the stream's cursor, so torchdata's ``StatefulDataLoader``
(and torch's distributed checkpoint) resume it exactly.

Under a ``DataLoader`` with ``N > 1`` workers the stream is split among them: worker
``k`` reads batches ``k, k + N, k + 2N, ...`` of the stream and skips the others'
without reading them (``TokenStream.skip_batches``), so a loader that takes one batch
from each worker in turn (torch's in-order round robin) yields exactly the batches of
``num_workers=0``, in the same order.

Invariants: the position is the stream's and only the stream's (this class holds no
counter of its own); a worker's stream is always at that worker's next batch (the
other workers' batches are skipped right after each read, never before the next one),
so a worker's state is its cursor; a state names the split it was taken under, and a
state of another split is refused, never resumed into other batches.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch.utils.data import IterableDataset, get_worker_info

from tlio.tokens import TokenStream

__all__ = ["TokenDataset"]

# The keys of a worker's state (num_workers > 1): its cursor and the split it was under.
_CURSOR, _WORKER, _NUM_WORKERS = "cursor", "worker", "num_workers"


def _current_split() -> Tuple[int, int]:
    """(worker id, number of workers) of the DataLoader worker this runs in; (0, 1) in
    the main process or the single worker of ``num_workers=1`` (both read every batch)."""
    info = get_worker_info()
    if info is None or info.num_workers <= 1:
        return 0, 1
    return info.id, info.num_workers


def _split_of(state: Dict[str, Any]) -> Tuple[int, int]:
    """The split a state was taken under: a bare cursor is (0, 1)."""
    if _NUM_WORKERS not in state:
        return 0, 1
    worker, workers = state.get(_WORKER), state.get(_NUM_WORKERS)
    for name, value in ((_WORKER, worker), (_NUM_WORKERS, workers)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"TokenDataset state: {name!r} must be an int, got {value!r}")
    if set(state) != {_CURSOR, _WORKER, _NUM_WORKERS} or not (0 <= worker < workers):
        raise ValueError(
            "TokenDataset state of a worker holds exactly 'cursor', 'worker' and "
            f"'num_workers' with 0 <= worker < num_workers, got keys {sorted(state)} "
            f"and worker {worker} of {workers}"
        )
    return worker, workers


def _shown(split: Tuple[int, int]) -> str:
    worker, workers = split
    if workers == 1:
        return "num_workers=0 or 1"
    return f"num_workers={workers} (worker {worker})"


class TokenDataset(IterableDataset):
    """The batches of ``stream`` as torch tensors: endless ``(x, y)`` int64 pairs of
    shape ``[batch, seq_len]`` with ``y[:, t] == x[:, t + 1]``.

    The stream already batches, so give it to a loader with ``batch_size=None``:
    ``StatefulDataLoader(TokenDataset(stream), batch_size=None, num_workers=4)``.
    Any ``num_workers``: with ``N > 1`` worker ``k`` makes batches ``k, k + N, ...``
    of the stream (it skips the other workers' batches without reading them), so the
    loader yields exactly the batches of ``num_workers=0``, in order, from the stream's
    position when the workers started. For data-parallel training give each rank its
    own stream (``TokenStream(..., rank=r, world_size=n)``): the workers split that
    rank's batches.

    ``state_dict()`` and ``load_state_dict()``: in the main process and with one
    worker, the stream's cursor (``TokenStream.cursor()``); in worker ``k`` of ``N >
    1``, ``{"cursor": the cursor of that worker's next batch, "worker": k,
    "num_workers": N}``. ``StatefulDataLoader``'s own state_dict (which keeps each
    worker's state and which worker comes next) then resumes bit for bit with the same
    ``num_workers``. A state taken under another number of workers is refused with a
    ``ValueError`` naming both: the saved workers' positions do not tell which batches
    another split would owe (torchdata itself refuses a state of 0 workers in a loader
    with workers, and the reverse, with an ``AssertionError``).

    Iterating twice continues the same stream (there are no epochs to restart). A
    loader's worker is a copy of the dataset: while it runs, the position lives in the
    loader's ``state_dict()``, not in the ``stream`` object of this process.
    """

    def __init__(self, stream: TokenStream) -> None:
        if not isinstance(stream, TokenStream):
            raise TypeError(f"TokenDataset wraps a tlio.tokens.TokenStream, got {type(stream).__name__}")
        self.stream = stream
        # The split the stream is positioned for, (worker, workers); None until the
        # first iteration or load in this process.
        self._split: Optional[Tuple[int, int]] = None

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        split = _current_split()
        if self._split != split:
            # A fresh worker's copy starts at the main process's position, the stream's
            # batch 0 for the loader: worker k's first batch is k.
            self._split = split
            self.stream.skip_batches(split[0])
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        x, y = self.stream.next_batch()
        workers = (self._split or (0, 1))[1]
        if workers > 1:
            self.stream.skip_batches(workers - 1)
        return torch.from_numpy(x), torch.from_numpy(y)

    def state_dict(self) -> Dict[str, Any]:
        """The stream's cursor; in worker ``k`` of ``N > 1`` with the split:
        ``{"cursor", "worker", "num_workers"}``."""
        worker, workers = self._split or _current_split()
        if workers == 1:
            return self.stream.state_dict()
        return {_CURSOR: self.stream.state_dict(), _WORKER: worker, _NUM_WORKERS: workers}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the stream's cursor (checked strictly; unchanged on error). A state
        of another split (another ``num_workers``) is a ``ValueError`` naming both."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"TokenDataset state is a dict, got {type(state_dict).__name__}")
        saved, ours = _split_of(state_dict), _current_split()
        if saved != ours:
            raise ValueError(
                f"this TokenDataset state was saved under {_shown(saved)}, but it is "
                f"loaded under {_shown(ours)}: resume with the same num_workers (each "
                "worker's state holds only its own batches' position)"
            )
        self.stream.load_state_dict(state_dict[_CURSOR] if ours[1] > 1 else state_dict)
        self._split = ours

    def __repr__(self) -> str:
        return f"TokenDataset({self.stream!r})"
