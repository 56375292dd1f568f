"""Async saves of ``tlio.torch`` (scale.md section 2): ``save(..., blocking=False)`` returns
a ``PendingSave`` once the state is copied ("staged") into host buffers this module keeps
and reuses from save to save; writing, hashing, fsyncs and the commit then run in a
background thread, inside the core's calls, which release the GIL.

How a save splits: the layers of ``tlio.torch.save`` (``saving`` here, then the sharded
dispatch, then the DDP collective, then the single-process save) each return, when
``blocking`` is false, a ``Deferred``: the staged state and the job that writes it. The
outermost layer starts that job in a thread and hands back its ``PendingSave``. Under
torch.distributed the job coordinates the ranks on a gloo process group of its own
(``group()``, created collectively by the first async save, with a timeout), so the
background commit never enters a collective of the training loop's groups.

Invariants:
- Staged buffers belong to tlio: never a view of a live parameter, buffer or optimizer
  state (CPU tensors are copied too), pinned when the source is a CUDA tensor, reused by
  the next save of the same tensor (same key, shape and dtype) and dropped when a save
  no longer has that tensor: the memory cost is one host copy of what this rank saves.
- At most one save is in flight per process: every ``save`` (blocking or not) and every
  ``load`` first waits for the previous one (``settle``), so no save reads a staged buffer
  the next staging overwrites, and no load reads a directory a save is still writing.
- An error of a background save is raised exactly once by whichever comes first: its
  ``wait()``, the next ``save`` or the next ``load``; ``wait()`` raises it every time it is
  called. An error found while staging is raised by that ``save`` at once (after the job
  has told the other ranks, which raise it from their ``PendingSave``).
- The background thread is not a daemon: at normal interpreter exit Python joins it, so
  a pending save completes (an error nobody saw is then printed to stderr).
- The files are the blocking save's, byte for byte: the same items, from the same values.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import os
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Optional, Set, Tuple, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

#: The timeout of every collective of the background commit (on its own gloo group): a
#: rank waits for the others' writes and for rank 0's commit, at most this long.
TIMEOUT = datetime.timedelta(minutes=30)
#: The name of the background threads.
THREAD_NAME = "tlio-async-save"
#: A CPU tensor at least this large is staged with torch's intra-op threads raised for
#: the copy, when the loop runs torch on one thread (``torch.get_num_threads() == 1``).
PARALLEL_COPY_BYTES = 4 << 20
#: At most this many threads copy one tensor.
MAX_COPY_THREADS = 4


# ---------------------------------------------------------------------------------------
# Staging
# ---------------------------------------------------------------------------------------


class Staging:
    """The host buffers of this process's async saves, keyed by (file group, tensor name).

    ``begin`` starts a save's staging, ``copy`` stages one tensor and returns its buffer,
    ``finish`` waits for the device copies and drops the buffers this save did not use."""

    def __init__(self) -> None:
        self._buffers: Dict[Tuple[str, str], torch.Tensor] = {}
        self._used: Set[Tuple[str, str]] = set()
        self._devices: Set[torch.device] = set()

    def begin(self) -> "Staging":
        self._used = set()
        self._devices = set()
        return self

    def copy(self, key: Tuple[str, str], t: torch.Tensor) -> torch.Tensor:
        """``t``'s values in this key's buffer (allocated on first use or when the shape or
        dtype changed): a contiguous CPU tensor that owns its memory. A conjugate or
        negative view is stored as the values it shows, as the blocking save does."""
        if key in self._used:
            raise ValueError(f"tensor {key[1]!r} is staged twice in one save")
        src = t.detach()
        pin = src.is_cuda
        buf = self._buffers.get(key)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or (pin and not buf.is_pinned()):
            self._buffers.pop(key, None)  # the old buffer goes before the new one is made
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        self._used.add(key)
        if pin:
            buf.copy_(src, non_blocking=True)
            self._devices.add(src.device)
        else:
            _copy(buf, src)
        return buf

    def finish(self) -> None:
        for device in self._devices:
            torch.cuda.synchronize(device)
        for key in [k for k in self._buffers if k not in self._used]:
            del self._buffers[key]

    def nbytes(self) -> int:
        """The bytes of every buffer held."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


_STAGING = Staging()


def _copy_threads() -> int:
    """The threads one rank may copy with: its share of the cores this process may run
    on (torchrun's ``LOCAL_WORLD_SIZE`` ranks share them), at most ``MAX_COPY_THREADS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return min(cores // local, MAX_COPY_THREADS)


def _copy(buf: torch.Tensor, src: torch.Tensor) -> None:
    """``buf.copy_(src)`` for CPU tensors; a large one with torch's own intra-op threads
    raised to this rank's share of the cores (``_copy_threads``) for the copy when the
    loop runs torch on one thread (the copy is all the loop waits for, and one thread
    does not reach the memory's bandwidth; more threads than cores would spin against
    each other). The values are the same either way."""
    before = torch.get_num_threads()
    threads = 1 if before > 1 or src.numel() * src.element_size() < PARALLEL_COPY_BYTES else _copy_threads()
    if threads < 2:
        buf.copy_(src)
        return
    torch.set_num_threads(threads)
    try:
        buf.copy_(src)
    finally:
        torch.set_num_threads(before)


def stager() -> Staging:
    """The process's staging buffers, ready for one save (the previous save is done: the
    caller runs inside ``saving``, after ``settle``)."""
    return _STAGING.begin()


# ---------------------------------------------------------------------------------------
# Pending saves
# ---------------------------------------------------------------------------------------


class Deferred:
    """The background half of a staged save: ``job()`` writes and commits, returning the
    step's path. ``error``: a failure of the staging already known in the foreground
    (raised by ``save`` once the job, which tells the other ranks, is started)."""

    __slots__ = ("job", "error", "step")

    def __init__(self, job: Callable[[], str], error: Optional[BaseException] = None, step: Any = None) -> None:
        self.job, self.error, self.step = job, error, step


class PendingSave:
    """A save running in the background. ``wait()`` returns the step directory's path or
    raises the save's error; ``done()`` tells whether it has finished (either way)."""

    def __init__(self, step: Any = None) -> None:
        self.step = step
        self._finished = threading.Event()
        self._path: Optional[str] = None
        self._error: Optional[BaseException] = None
        self._reported = False

    def done(self) -> bool:
        """Whether the save has finished, committed or failed (``wait`` says which)."""
        return self._finished.is_set()

    def wait(self) -> str:
        """Block until the save has finished; its step directory, or its error raised."""
        self._finished.wait()
        if self._error is not None:
            self._reported = True
            raise self._error
        assert self._path is not None
        return self._path

    def _run(self, job: Callable[[], str]) -> None:
        try:
            self._path = job()
        except BaseException as e:  # every failure is kept for wait/save/load
            self._error = e
        finally:
            self._finished.set()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error is not None else self._path)
        return f"PendingSave(step={self.step!r}, {state})"


_LOCK = threading.RLock()  # one save at a time in this process, staging included
_inflight: Optional[PendingSave] = None


def settle() -> None:
    """Wait for the save in flight, if any; raise its error unless it was raised already."""
    global _inflight
    p = _inflight
    if p is None:
        return
    p._finished.wait()
    _inflight = None
    if p._error is not None and not p._reported:
        p._reported = True
        raise p._error


def pending() -> Optional[PendingSave]:
    """The save in flight (or finished but not yet settled), if any."""
    return _inflight


def _start(d: Deferred) -> PendingSave:
    global _inflight
    p = PendingSave(d.step)
    if d.error is not None:
        p._reported = True  # raised by save itself, right after this
    _inflight = p
    threading.Thread(target=p._run, args=(d.job,), name=THREAD_NAME, daemon=False).start()
    return p


def saving(save: F) -> F:
    """Wrap ``tlio.torch.save``: wait for the save in flight first, then save blocking
    (a path) or stage and start the background job (a ``PendingSave``)."""

    @functools.wraps(save)
    def wrapper(*args: Any, blocking: bool = True, **kw: Any) -> Any:
        if not isinstance(blocking, bool):
            raise ValueError(f"blocking must be True or False, got {blocking!r}")
        with _LOCK:
            settle()
            if blocking:
                return save(*args, blocking=True, **kw)
            d = save(*args, blocking=False, **kw)
            assert isinstance(d, Deferred), "every layer of an async save returns its Deferred"
            p = _start(d)
            if d.error is not None:
                raise d.error
            return p

    return wrapper  # type: ignore[return-value]


def settled(load: F) -> F:
    """Wrap ``tlio.torch.load``: the save in flight finishes (its error raised) first."""

    @functools.wraps(load)
    def wrapper(*args: Any, **kw: Any) -> Any:
        with _LOCK:
            settle()
        return load(*args, **kw)

    return wrapper  # type: ignore[return-value]


def _at_exit() -> None:
    """At interpreter exit (after Python joined the save's thread): an error nobody saw
    goes to stderr, never lost silently."""
    p = _inflight
    if p is None or not p._finished.is_set() or p._error is None or p._reported:
        return
    p._reported = True
    sys.stderr.write(f"tlio: the async save of step {p.step} failed:\n")
    traceback.print_exception(type(p._error), p._error, p._error.__traceback__, file=sys.stderr)


atexit.register(_at_exit)


# ---------------------------------------------------------------------------------------
# torch.distributed
# ---------------------------------------------------------------------------------------

_GROUP: Optional[Tuple[Any, Any]] = None  # (the default group it was made beside, the group)


def group() -> Any:
    """The gloo process group of the background commits, beside torch.distributed's
    default group: created on first use by every rank (the first async save, which every
    rank reaches in the same order), with ``TIMEOUT`` on each of its collectives."""
    global _GROUP
    dist = torch.distributed
    default = dist.distributed_c10d._get_default_group()
    if _GROUP is None or _GROUP[0] is not default:
        _GROUP = (default, dist.new_group(backend="gloo", timeout=TIMEOUT))
    return _GROUP[1]


def collective(save: Callable[..., Any], dist: Any, dir: Any, step: Any, args: tuple, kwargs: dict) -> Deferred:
    """The DDP collective save (``tlio._torch_dist``), async: rank 0 stages its replicated
    state in the foreground; in the background every rank checks that all save the same
    step, rank 0 writes and commits, and every rank learns the outcome, all on ``group()``."""
    from tlio._torch_failure import _raise, record

    pg = group()
    rank, size = dist.get_rank(), dist.get_world_size()
    staged: Optional[Deferred] = None
    error: Optional[BaseException] = None
    if rank == 0:
        try:
            staged = save(dir, step, *args, **kwargs)
        except BaseException as e:  # the other ranks hear of it from the job
            error = e

    def job() -> str:
        steps: list = [None] * size
        dist.all_gather_object(steps, str(step), group=pg)
        if len(set(steps)) != 1:
            raise ValueError(f"tlio.torch.save: the ranks pass different steps {steps} (by rank)")
        outcome: Any = None
        mine = error
        if rank == 0:
            if mine is None:
                try:
                    assert isinstance(staged, Deferred)
                    outcome = ("ok", staged.job())
                except BaseException as e:
                    mine = e
            if mine is not None:
                outcome = ("failed", record(mine))
        box = [outcome]
        dist.broadcast_object_list(box, src=0, group=pg)
        if mine is not None:
            raise mine
        if box[0][0] != "ok":
            _raise(0, box[0][1])
        return box[0][1]

    return Deferred(job, error, step)
