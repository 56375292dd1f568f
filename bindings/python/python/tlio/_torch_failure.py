"""The failure record that carries an exception from one rank to the others, shared by
the collective save and load (``tlio._torch_dist``), the background save
(``tlio._torch_async``) and the sharded collectives (``tlio._torch_shard``).

Invariants: only JSON text travels (class name, message, errno, strerror, file name),
never an exception object; a receiving rank recreates the class only when ``CARRIED``
names it, else raises a RuntimeError naming it. This module imports no other module
of tlio, so every collective can use it without a circle.
"""

from __future__ import annotations

import builtins
import json
import os
from typing import Any, Dict, Optional

#: An outcome exchanged between ranks: ``None`` (success) or a failure record, the JSON
#: text ``record`` writes.
Failure = Optional[str]

#: The exception classes a failure record may name and the receiving ranks recreate:
#: OSError and each of Python's own subclasses of it (their ``errno``, ``strerror`` and
#: ``filename`` carried), and the plain errors tlio raises. Any other class is raised as
#: a RuntimeError naming it: a name from another rank never selects anything else.
CARRIED: Dict[str, type] = {
    cls.__name__: cls
    for cls in (OSError, ValueError, TypeError, RuntimeError, KeyError, IndexError, NotImplementedError)
}
CARRIED.update((c.__name__, c) for c in vars(builtins).values()
               if isinstance(c, type) and issubclass(c, OSError))
#: The most characters of a message a failure record carries (the rest is cut, and said).
MESSAGE_LIMIT = 1 << 16


def _text(value: Any) -> Optional[str]:
    """An OSError attribute as a string for the record (a bytes or PathLike file name
    decoded as os.fsdecode does), or ``None``."""
    if value is None:
        return None
    try:
        return os.fsdecode(value)
    except TypeError:
        return str(value)


def _cut(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    return f"{message[:MESSAGE_LIMIT]}... ({len(message) - MESSAGE_LIMIT} more characters)"


def record(e: BaseException) -> str:
    """The failure record of ``e``: JSON text holding its class name, message, and for an
    OSError its ``errno``, ``strerror`` and ``filename``. Only this text travels, never
    the exception object (nothing from another rank is unpickled into a class)."""
    doc: Dict[str, Any] = {"type": type(e).__name__, "message": _cut(str(e))}
    if isinstance(e, OSError):
        doc["errno"] = e.errno if isinstance(e.errno, int) else None
        doc["strerror"] = _text(e.strerror)
        doc["filename"] = _text(e.filename)
    return json.dumps(doc)


def _read_record(failure: Any) -> Dict[str, Any]:
    """The fields of a failure record, checked; a malformed one reads as a RuntimeError."""
    try:
        doc = json.loads(failure) if isinstance(failure, str) else None
    except ValueError:
        doc = None
    if (not isinstance(doc, dict) or not isinstance(doc.get("type"), str)
            or not isinstance(doc.get("message"), str)):
        return {"type": "RuntimeError", "message": "it reported a failure this rank cannot read"}
    for key, kind in (("errno", int), ("strerror", str), ("filename", str)):
        if not isinstance(doc.get(key), kind) or isinstance(doc.get(key), bool):
            doc[key] = None
    return doc


def rebuild(rank: int, failure: Any) -> BaseException:
    """The exception this rank raises for the failure record another rank reported: the
    same class when ``CARRIED`` names it, else a RuntimeError naming the class. The
    message is the original one prefixed ``on rank R: ``; an OSError keeps that rank's
    ``errno`` and ``filename``, its ``strerror`` prefixed so (``[Errno 28] on rank 0:
    ...``: Python formats an OSError's message from its fields)."""
    doc = _read_record(failure)
    name, prefix = doc["type"], f"on rank {rank}: "
    cls = CARRIED.get(name)
    if cls is None:
        return RuntimeError(f"{prefix}{name}: {doc['message']}")
    if issubclass(cls, OSError) and doc["errno"] is not None and doc["strerror"] is not None:
        fields = (doc["errno"], prefix + doc["strerror"])
        # cls itself, not OSError(errno, ...): that would pick a subclass by the errno.
        return cls(*fields, doc["filename"]) if doc["filename"] is not None else cls(*fields)
    e = cls(prefix + doc["message"])
    if isinstance(e, OSError):
        e.errno = doc["errno"]  # alone it leaves the message as it is
    return e


def _raise(rank: int, failure: Any) -> None:
    """Raise on this rank the failure another rank reported (``rebuild``)."""
    raise rebuild(rank, failure)
