"""``tlio.torch.save`` and ``load`` as collectives of torch.distributed (python.md, ``tlio.torch``).

Under an initialized process group of more than one rank (torchrun; gloo on CPU),
``save`` is called on every rank: rank 0 writes (its model and optimizer are the
replicated ones, its stream's cursor is the global one), the other ranks wait in a
broadcast of rank 0's outcome, and every rank returns the same path once rank 0 has
committed, LATEST included. ``load`` has rank 0 choose the step (LATEST, or the newest
that verifies) and broadcast it; every other rank reads and checks exactly that step;
an exchange then makes every rank raise when any rank's check failed, before any rank
applies anything, so no two ranks ever continue from different states.

Invariants: an exception on one rank becomes an exception on every rank, never a hang
in a collective: the same class when ``CARRIED`` names it (OSError and its subclasses
with the failing rank's ``errno`` and ``filename``; ValueError, TypeError, ...), else a
RuntimeError naming the class, the message prefixed with the failing rank.
A single process, or a group of one, runs the wrapped function untouched. What travels
between ranks is only strings and integers (step numbers, paths, and a failure as the
JSON text of ``record``: class name, message, errno, strerror, file name), through ``broadcast_object_list`` / ``all_gather_object``, so
any backend works; no tensor leaves rank 0 (every rank reads the checkpoint directory
itself, which must therefore be visible to all of them, as for torch's own distributed
checkpoint).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import torch

# The failure record, also at the names it had when it lived here.
from tlio._torch_failure import CARRIED, MESSAGE_LIMIT, Failure, _raise, rebuild, record  # noqa: F401

F = TypeVar("F", bound=Callable[..., Any])


def process_group() -> Optional[Any]:
    """``torch.distributed`` when its default group is initialized with more than one
    rank, else ``None`` (the single-process path)."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist


def _broadcast(dist: Any, value: Any) -> Any:
    box: List[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _first_failure(dist: Any, mine: Failure) -> Optional[Tuple[int, str]]:
    """Every rank's outcome to every rank; the first failure and its rank, or ``None``."""
    outcomes: List[Failure] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, mine)
    for rank, failure in enumerate(outcomes):
        if failure is not None:
            return rank, failure
    return None


def collective_save(save: F) -> F:
    """Wrap the single-process ``save`` as python.md's collective save."""

    @functools.wraps(save)
    def wrapper(dir: Any, step: Any, *args: Any, **kwargs: Any) -> str:
        dist = process_group()
        if dist is None:
            return save(dir, step, *args, **kwargs)
        if kwargs.get("blocking") is False:  # the same protocol in the background
            from tlio import _torch_async

            return _torch_async.collective(save, dist, dir, step, args, kwargs)
        rank = dist.get_rank()
        # Every rank must be saving the same step: a rank whose step counter drifted
        # would otherwise return a path that is not its state.
        steps: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(steps, str(step))
        if len(set(steps)) != 1:
            raise ValueError(f"tlio.torch.save: the ranks pass different steps {steps} (by rank)")
        outcome: Any = None
        error: Optional[BaseException] = None
        if rank == 0:
            try:
                outcome = ("ok", save(dir, step, *args, **kwargs))
            except BaseException as e:  # every rank must hear of it, KeyboardInterrupt included
                error = e
                outcome = ("failed", record(e))
        outcome = _broadcast(dist, outcome)
        if error is not None:
            raise error
        if outcome[0] != "ok":
            _raise(0, outcome[1])
        return outcome[1]

    return wrapper  # type: ignore[return-value]


def collective_load(prepare: Callable[..., Tuple[Any, Callable[[], None]]]) -> Callable[[F], F]:
    """Make the single-process ``load`` python.md's collective load. ``prepare`` does all
    of a load but applying it (same arguments; returns the Checkpoint and the function
    that applies it). Rank 0 prepares first (it chooses the step), every other rank then
    prepares exactly that step, and all agree on the outcome before any applies: a rank
    that refuses (a model that does not match, a step that does not verify there) leaves
    every rank's state untouched. The exchanges run on the default group, bounded by its
    timeout (``init_process_group(timeout=...)``)."""

    def decorate(load: F) -> F:
        @functools.wraps(load)
        def wrapper(dir: Any, *args: Any, step: Any = None, **kwargs: Any) -> Any:
            dist = process_group()
            if dist is None:
                return load(dir, *args, step=step, **kwargs)
            rank = dist.get_rank()
            ck: Any = None
            apply: Optional[Callable[[], None]] = None
            error: Optional[BaseException] = None
            if rank == 0:
                try:
                    ck, apply = prepare(dir, *args, step=step, **kwargs)
                    chosen: Any = ("ok", ck.step)
                except BaseException as e:
                    error = e
                    chosen = ("failed", record(e))
            else:
                chosen = None
            chosen = _broadcast(dist, chosen)
            if error is not None:
                raise error
            if chosen[0] != "ok":
                _raise(0, chosen[1])
            mine: Failure = None
            if rank != 0:
                try:
                    ck, apply = prepare(dir, *args, step=chosen[1], **kwargs)
                    if ck.step != chosen[1]:
                        mine = record(RuntimeError(f"step {chosen[1]}, which rank 0 loaded, does not verify "
                                                   f"here (this rank would have loaded step {ck.step})"))
                except BaseException as e:
                    error = e
                    mine = record(e)
            # Every rank has checked: apply only when all of them may.
            failed = _first_failure(dist, mine)
            if error is not None:
                raise error
            if failed is not None:
                _raise(*failed)
            assert apply is not None
            try:
                apply()
            except BaseException as e:  # torch's own hooks, after every check passed
                error = e
                mine = record(e)
            failed = _first_failure(dist, mine)
            if error is not None:
                raise error
            if failed is not None:
                _raise(*failed)
            return ck

        return wrapper  # type: ignore[return-value]

    return decorate
