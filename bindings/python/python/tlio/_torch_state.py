"""A loop's other state in a ``tlio.torch`` checkpoint: ``save(..., state={"scheduler":
sched, "scaler": scaler})`` stores each named object's ``state_dict()`` as JSON, and
``load(..., state={...})`` gives it back to the object's ``load_state_dict()``.

Where it lives: the metadata key ``stateful`` of model.safetensors (of the model group's
metadata in a sharded step's shards.json), one JSON object ``{name: state_dict}``, so the
step is covered by the manifest's digests like every other byte of it.

What a state_dict may hold: ``None``, bools, ints, finite floats, str, lists and tuples
(loaded as lists) and dicts with str keys, nested; numpy scalars as the Python numbers
they are. Anything else (a tensor, NaN, a set, an int dict key, an object) is refused
with a ``ValueError`` naming where it is (``state['scaler']['scale']``), before anything
is written: no pickle, ever. A float travels as its shortest repr, which JSON reads back
to the same bits.

Invariants: what is saved is the state at the ``save`` call (encoded then, also for an
async save); a load checks that every named object has its state in the step before
anything is applied, and when one ``load_state_dict`` fails the objects already loaded
get their old state back. Imports nothing of tlio's torch modules.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

#: The metadata key of the model file (or the model group) holding the states.
STATE_KEY = "stateful"


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON's own types, or a ValueError naming ``where``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value}, which JSON cannot hold")
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has the key {k!r} ({type(k).__name__}): JSON keys are str")
            out[k] = _plain(v, f"{where}[{k!r}]")
        return out
    kind = type(value).__name__
    hint = " (state= stores JSON: return .item() or .tolist() from state_dict)" if hasattr(value, "dtype") else ""
    raise ValueError(f"{where} is of type {kind}, which JSON cannot hold{hint}")


def encode(state: Mapping[str, Any]) -> Optional[str]:
    """The metadata value of ``state`` (names to objects with ``state_dict()``), or
    ``None`` when there is none."""
    if not state:
        return None
    doc = {name: _plain(obj.state_dict(), f"state[{name!r}]") for name, obj in state.items()}
    try:
        return json.dumps(doc, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:  # _plain has refused everything JSON refuses
        raise ValueError(f"state: {e}") from None


def decode(meta: Mapping[str, str], path: str) -> Dict[str, Any]:
    """The states stored in a model file's (or group's) metadata: ``{}`` when none."""
    text = meta.get(STATE_KEY)
    if text is None:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: metadata `{STATE_KEY}` is not a JSON object")
    return doc


def plan(state: Mapping[str, Any], saved: Mapping[str, Any], path: str) -> List[Tuple[Any, Any]]:
    """(object, its saved state) for each object of ``state``; a name the step does not
    hold is a ValueError (nothing is applied)."""
    missing = [name for name in state if name not in saved]
    if missing:
        held = ", ".join(repr(n) for n in sorted(saved)) or "none"
        raise ValueError(f"{path} holds no state {missing[0]!r} (it holds: {held})")
    return [(obj, saved[name]) for name, obj in state.items()]


def apply(plans: List[Tuple[Any, Any]]) -> Callable[[], None]:
    """Load each state into its object; returns the function that puts the old states
    back. When one ``load_state_dict`` raises, those already loaded are put back first."""
    done: List[Tuple[Any, Any]] = []

    def undo() -> None:
        for obj, old in reversed(done):
            obj.load_state_dict(old)

    for obj, saved in plans:
        old = copy.deepcopy(obj.state_dict())
        try:
            obj.load_state_dict(copy.deepcopy(saved))
        except BaseException:
            undo()
            raise
        done.append((obj, old))
    return undo
