"""A torch optimizer's saved state, checked whole against the live optimizer before
``tlio.torch.load`` applies anything (python.md, ``tlio.torch``).

optimizer.safetensors holds the state by parameter *name*: every tensor as
``<param>.<key>``, and the JSON metadata ``state``
``{"type": "torch.<Class>", "param_groups": [{<hyper-parameters>, "params": [names]}],
"state": {name: {<non-tensor entries>}}}``. ``plan`` turns that into the state dict
``torch.optim.Optimizer.load_state_dict`` takes, matching each live param group to the
saved group with the same *set* of names (the order inside a group is free), and
refuses with ``ValueError`` (naming the file and the key) whatever would otherwise fail
later, in the middle of the load or at the next ``opt.step()``: malformed JSON, a
hyper-parameter of another kind than the optimizer's (a string ``lr``), a state tensor
whose shape cannot be the parameter's state, or whose dtype torch would silently cast.

Invariant: ``plan`` reads the optimizer and never changes it.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

#: State keys that are one number per parameter in torch's optimizers (Adam's step,
#: NAdam's mu_product, ASGD's eta and mu): a 0-d tensor.
SCALAR_KEYS = frozenset({"step", "mu_product", "eta", "mu"})
#: State keys that hold one value per element of the parameter in torch's optimizers:
#: exactly the parameter's shape.
ELEMENTWISE_KEYS = frozenset({
    "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "exp_inf", "sum",
    "square_avg", "acc_delta", "grad_avg", "prev", "step_size", "ax", "variance",
})
#: Param group entries that are not hyper-parameters: the live optimizer's are kept.
OWN_KEYS = ("params", "param_names")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _hyper(saved: Any, live: Any, where: str) -> Any:
    """The saved value of a hyper-parameter when it is of the live value's kind (tuples
    come back as tuples; ``None`` on either side is an optional setting and fits any
    kind), else ``ValueError``."""
    if saved is None or live is None:
        return saved
    if _kind(saved) != _kind(live):
        raise ValueError(f"{where} is {saved!r}, where the optimizer has {_kind(live)} ({live!r})")
    if isinstance(live, (list, tuple)):
        if len(saved) != len(live):
            raise ValueError(f"{where} has {len(saved)} entries, the optimizer's {len(live)}")
        out = [_hyper(s, v, f"{where}[{i}]") for i, (s, v) in enumerate(zip(saved, live))]
        return tuple(out) if isinstance(live, tuple) else out
    return saved


def document(text: Optional[str], path: str) -> Dict[str, Any]:
    """The metadata ``state`` as a checked JSON document: ``type`` a string,
    ``param_groups`` a list of objects whose ``params`` are lists of names, ``state`` an
    object of objects."""
    try:
        doc = json.loads(text) if text is not None else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: metadata `state` is missing or not a JSON object")
    if not isinstance(doc.get("type"), str):
        raise ValueError(f"{path}: `type` of metadata `state` is not a string")
    groups = doc.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ValueError(f"{path}: `param_groups` of metadata `state` is not a list of objects")
    for i, g in enumerate(groups):
        names = g.get("params")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{path}: `param_groups[{i}].params` is not a list of parameter names")
        if len(set(names)) != len(names):
            raise ValueError(f"{path}: `param_groups[{i}].params` names a parameter twice")
    state = doc.get("state")
    if not isinstance(state, dict) or not all(isinstance(e, dict) for e in state.values()):
        raise ValueError(f"{path}: `state` of metadata `state` is not an object of objects")
    return doc


def live_groups(optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> List[List[str]]:
    """The names of each live param group's parameters, in the optimizer's order."""
    out = []
    for g in optimizer.param_groups:
        group = []
        for p in g["params"]:
            name = names.get(id(p))
            if name is None:
                raise ValueError(
                    f"the optimizer holds a parameter of shape {tuple(p.shape)} that the model does not name"
                )
            group.append(name)
        out.append(group)
    return out


def _match_groups(saved: List[Dict[str, Any]], current: List[List[str]], path: str) -> List[Dict[str, Any]]:
    """For each live group, the saved group with the same set of names."""
    unused = list(range(len(saved)))
    out = []
    for names in current:
        found = next((i for i in unused if set(saved[i]["params"]) == set(names)), None)
        if found is None or len(saved) != len(current):
            raise ValueError(
                f"{path}: the optimizer's param groups {current} are not the saved ones "
                f"{[g['params'] for g in saved]} (matched by their sets of names)"
            )
        unused.remove(found)
        out.append(saved[found])
    return out


def _check_tensor(full: str, key: str, t: torch.Tensor, param: torch.Tensor,
                  held: Optional[torch.Tensor], path: str) -> None:
    """A state tensor that the optimizer can step with: the shape and dtype of the state
    it already holds under that key, if any; else a 0-d tensor for a scalar key, the
    parameter's shape for an elementwise key, and for any other key a 0-d tensor or the
    parameter's shape with some dimensions 1 (factored state, Adafactor's row_var);
    and, where torch would cast it to the parameter's dtype (a floating parameter, any
    key but ``step``), that dtype already."""
    shape, pshape = tuple(t.shape), tuple(param.shape)
    if held is not None:
        ok = shape == tuple(held.shape)
        rule = f"the shape {list(held.shape)} of the state the optimizer holds"
    elif key in SCALAR_KEYS:
        ok, rule = shape == (), "a single number (shape [])"
    elif key in ELEMENTWISE_KEYS:
        ok, rule = shape == pshape, f"the parameter's shape {list(pshape)}"
    else:
        ok = shape == () or (len(shape) == len(pshape) and all(s in (1, p) for s, p in zip(shape, pshape)))
        rule = f"[] or the parameter's shape {list(pshape)} (or with dimensions of 1)"
    if not ok:
        raise ValueError(f"{path}: tensor {full!r} has shape {list(shape)}, not {rule}")
    want = held.dtype if held is not None else param.dtype if param.is_floating_point() and key != "step" else None
    if want is not None and t.dtype != want:
        raise ValueError(
            f"{path}: tensor {full!r} is {t.dtype} in the checkpoint and {want} in the optimizer "
            "(tlio.torch never casts)"
        )


def plan(optimizer: torch.optim.Optimizer, names: Mapping[int, str], tensors: Mapping[str, torch.Tensor],
         meta: Mapping[str, str], path: str, want_type: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The state dict for ``optimizer.load_state_dict`` and the saved JSON document,
    both checked (see the module); ``names`` maps id(parameter) to its model name."""
    doc = document(meta.get("state"), path)
    if doc["type"] != want_type:
        raise ValueError(f"{path}: the checkpoint holds a {doc['type']!r} state, the optimizer is {want_type!r}")
    current = live_groups(optimizer, names)
    saved = _match_groups(doc["param_groups"], current, path)
    params: Dict[str, torch.Tensor] = {}
    index: Dict[str, int] = {}
    groups = []
    for gi, (live, names_here, g) in enumerate(zip(optimizer.param_groups, current, saved)):
        hyper = {k: _hyper(g.get(k, v), v, f"{path}: `param_groups[{gi}].{k}`")
                 for k, v in live.items() if k not in OWN_KEYS}
        extra = {k: v for k, v in g.items() if k not in live and k not in OWN_KEYS}
        for p, name in zip(live["params"], names_here):
            index[name] = len(index)
            params[name] = p
        own = {k: live[k] for k in OWN_KEYS if k in live and k != "params"}
        groups.append({**extra, **hyper, **own, "params": [index[n] for n in names_here]})
    state: Dict[int, Dict[str, Any]] = {}
    for name, entries in doc["state"].items():
        if name not in index:
            raise ValueError(f"{path}: `state` has entries for {name!r}, a parameter the optimizer does not hold")
        state.setdefault(index[name], {}).update(entries)
    for full, t in tensors.items():
        name, _, key = full.rpartition(".")
        if name not in index:
            raise ValueError(f"{path}: tensor {full!r} is for a parameter the optimizer does not hold")
        entries = state.setdefault(index[name], {})
        if key in entries:
            raise ValueError(f"{path}: {full!r} is both a tensor and an entry of `state`")
        held = optimizer.state.get(params[name], {}).get(key)
        _check_tensor(full, key, t, params[name], held if isinstance(held, torch.Tensor) else None, path)
        entries[key] = t
    return {"state": state, "param_groups": groups}, doc
