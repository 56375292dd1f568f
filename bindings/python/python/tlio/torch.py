"""Checkpoints of a PyTorch loop on tlio's atomic, verified protocol (python.md, ``tlio.torch``).

``save`` writes a model's ``state_dict()`` (parameters and buffers, every tensor in its
own dtype, bit for bit), an optimizer's state keyed by parameter *name* and a
``TokenStream``'s cursor as one checkpoint.md step, through the same core save as
``tlio ckpt save`` (fsyncs, renames, lock, failpoints, LATEST never backwards); ``load``
picks the step ``tlio ckpt latest`` picks, verified, and restores all three.

Invariants: no pickle anywhere; the rules (protocol, layout checks, the step choice)
are the core's, this module only converts between torch tensors and numpy arrays. A
tensor travels as its raw little-endian bytes (BF16 as uint16 bits, 8-bit floats as
uint8 codes), so what is loaded is the very bits that were saved. Tied tensors (one
storage through one view, and one Parameter, under several ``state_dict()`` names) are
stored once, under the first name, and the metadata key ``tied`` of model.safetensors
maps each other name to it. ``load`` checks the whole step against the model, the
optimizer (``tlio._torch_optim``) and the stream before it applies anything, so a
refused load changes nothing.
Under torch.distributed both are collectives (``tlio._torch_dist``): rank 0 writes,
every rank returns the same path, and every rank loads the step rank 0 chose, applied
on no rank unless every rank's check passed.
``save(..., blocking=False)`` stages the state into host buffers and writes it in the
background (``tlio._torch_async``): the same files, one save in flight per process.
torch's own generator state is not saved: a loop that needs bitwise dropout across a
resume seeds it from (seed, step).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np
try:
    import torch
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
    raise ModuleNotFoundError(
        "tlio.torch needs torch, which is not installed: pip install 'tlio[torch]' (or pip install torch)",
        name="torch",
    ) from None

from tlio._tlio import checkpoint as _core
from tlio import _torch_args, _torch_async, _torch_optim, _torch_state
from tlio._torch_dist import collective_load, collective_save
from tlio import _torch_shard
from tlio.checkpoint import EXTRA_KEYS, Checkpoint, _integer, _json, _rng
from tlio._torch_data import TokenDataset

from tlio._torch_async import PendingSave

__all__ = ["save", "load", "PendingSave", "TokenDataset"]

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
#: The metadata key of model.safetensors mapping each tied name to the stored one.
TIED_KEY = "tied"
#: The ``type`` of the optimizer JSON: this prefix and the optimizer's class name.
TYPE_PREFIX = "torch."

# torch dtype -> (safetensors dtype, the numpy dtype of its raw bits)
_DTYPES: Dict[torch.dtype, Tuple[str, Any]] = {
    torch.float64: ("F64", np.float64),
    torch.float32: ("F32", np.float32),
    torch.float16: ("F16", np.float16),
    torch.bfloat16: ("BF16", np.uint16),
    torch.int64: ("I64", np.int64),
    torch.int32: ("I32", np.int32),
    torch.int16: ("I16", np.int16),
    torch.int8: ("I8", np.int8),
    torch.uint8: ("U8", np.uint8),
    torch.bool: ("BOOL", np.bool_),
    torch.complex64: ("C64", np.complex64),
}
for _name, _st in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = (_st, np.uint8)
_FROM_ST = {st: (dt, raw) for dt, (st, raw) in _DTYPES.items()}



def _refuse_dtensor(name: str, t: torch.Tensor) -> None:
    """Refuse a DTensor (FSDP2, tensor parallel): its storage is one rank's local shard,
    not the tensor, and this module saves whole tensors from rank 0 only."""
    if type(t).__name__ == "DTensor":
        raise ValueError(
            f"tensor {name!r} is a DTensor (sharded by FSDP2 or tensor parallel): tlio.torch saves "
            "whole tensors only (gather the state to full tensors first)"
        )


def _refuse_kind(name: str, t: torch.Tensor, whose: str = "tensor") -> None:
    """Refuse a tensor that has no plain bytes to store or to load into, naming it and why:
    a DTensor, a meta tensor (no data), a nested tensor, a sparse or other non-strided
    layout. torch itself would fail later with an unrelated message ("invalid python
    storage", "cannot access storage"), or silently copy nothing into a meta tensor."""
    _refuse_dtensor(name, t)
    what = f"{whose} {name!r}"
    if t.is_nested:
        raise ValueError(f"{what} is a nested tensor: tlio.torch stores dense tensors only")
    if t.layout != torch.strided:
        raise ValueError(f"{what} has layout {t.layout}: tlio.torch stores dense (strided) tensors only")
    if t.is_meta:
        raise ValueError(f"{what} is on the meta device and holds no data (materialize it first)")


def _item(name: str, t: torch.Tensor, stage: Optional[_torch_async.Staging] = None,
          group: str = MODEL_FILE) -> Tuple[tuple, torch.Tensor]:
    """One tensor as a raw-bytes item for the core writer, and the CPU tensor whose
    memory it borrows (kept alive by the caller until the write returns). A conjugate
    or negative view is written as the values it shows (resolved), as torch.save does.
    With ``stage`` (an async save) the item borrows a staged copy, never ``t``'s memory."""
    _refuse_kind(name, t)
    try:
        st, raw = _DTYPES[t.dtype]
    except KeyError:
        raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which tlio.torch cannot store") from None
    if stage is not None:
        t = stage.copy((group, name), t)
    c = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    if raw is np.uint16 or raw is np.uint8 and t.dtype != torch.uint8:
        bits = c.view(torch.int16 if raw is np.uint16 else torch.uint8).numpy().view(raw)
    else:
        bits = c.numpy()
    flat = bits.reshape(-1).view(np.uint8)
    return (name, st, list(c.shape), flat, "raw"), c


def _tensor(name: str, buf: np.ndarray, st: str, shape: Tuple[int, ...], start: int, end: int) -> torch.Tensor:
    """One tensor of a loaded file as a torch tensor of its stored dtype, over the
    file's bytes in ``buf``: owned memory the core read and verified (never a map of
    the file, so nothing done to the file later reaches it), of which this tensor alone
    covers ``[start, end)``. A tensor whose start is not aligned for its dtype gets its
    own copy."""
    try:
        dtype, raw = _FROM_ST[st]
    except KeyError:
        raise ValueError(f"tensor {name!r} is {st}, which tlio.torch cannot load") from None
    raw = np.dtype(raw)
    a = buf[start:end]
    if a.ctypes.data % raw.itemsize:
        a = a.copy()
    t = torch.from_numpy(a.view(raw).reshape(shape))
    if dtype == torch.bfloat16:
        t = t.view(torch.int16).view(torch.bfloat16)
    elif raw == np.uint8 and dtype != torch.uint8:
        t = t.view(dtype)
    return t


def _storage_key(t: torch.Tensor, param: Optional[torch.nn.Parameter] = None) -> tuple:
    """What makes two state_dict entries the same tensor (a tie): the same storage (its
    identity, not its address: every empty storage has address 0) seen through the same
    view (offset, shape, strides, dtype, conjugate and negative bits), and, for
    parameters, the same Parameter. Two distinct Parameters over one storage are two
    parameters (each with its own optimizer state), so they are stored separately."""
    # ``_cdata`` is the address of the StorageImpl that every view of one storage
    # shares; it cannot be reused while the state_dict holds these tensors.
    return (
        t.device, t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()),
        t.dtype, t.is_conj(), t.is_neg(), None if param is None else id(param),
    )


def _model_items(model: torch.nn.Module, stage: Optional[_torch_async.Staging] = None):
    sd = model.state_dict()
    params = dict(model.named_parameters(remove_duplicate=False))
    items, keep_alive, tied, first = [], [], {}, {}
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"state_dict entry {name!r} is {type(t).__name__}, not a tensor")
        _refuse_kind(name, t)
        key = _storage_key(t, params.get(name))
        if key in first:
            tied[name] = first[key]
            continue
        first[key] = name
        item, c = _item(name, t, stage)
        items.append(item)
        keep_alive.append(c)
    meta = {TIED_KEY: json.dumps(tied, separators=(",", ":"))} if tied else {}
    return items, meta, keep_alive


def _param_names(model: torch.nn.Module) -> Dict[int, str]:
    """id(parameter) -> its first name in the model."""
    names: Dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    return names


def _plain(value: Any, what: str) -> Any:
    """A hyper-parameter or state entry as JSON (tuples as lists)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v, what) for v in value]
    if isinstance(value, torch.Tensor):
        raise ValueError(f"{what} is a tensor where a number was expected")
    return value


def _optimizer_items(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     stage: Optional[_torch_async.Staging] = None):
    names = _param_names(model)
    groups, state, items, keep_alive = [], {}, [], []
    for g in optimizer.param_groups:
        group_names = []
        for p in g["params"]:
            name = names.get(id(p))
            if name is None:
                raise ValueError(
                    f"the optimizer holds a parameter of shape {tuple(p.shape)} that the model does not name"
                )
            group_names.append(name)
            entries = optimizer.state.get(p, {})
            for key, v in entries.items():
                if not isinstance(key, str) or "." in key:
                    raise ValueError(f"optimizer state key {key!r} of {name!r} is not a plain name")
                if isinstance(v, torch.Tensor):
                    item, c = _item(f"{name}.{key}", v, stage, OPTIMIZER_FILE)
                    items.append(item)
                    keep_alive.append(c)
                else:
                    state.setdefault(name, {})[key] = _plain(v, f"optimizer state {name}.{key}")
        hyper = {k: _plain(v, f"param group {k!r}") for k, v in g.items() if k != "params"}
        groups.append({**hyper, "params": group_names})
    doc = {"type": TYPE_PREFIX + type(optimizer).__name__, "param_groups": groups, "state": state}
    return items, _json("optimizer state", doc, separators=(",", ":")), keep_alive


def _stream_state(stream) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """The stream's cursor as trainer_state.json's ``data_cursor`` (everything but the
    generator, which is ``rng_state``) and the generator's position."""
    c = stream.cursor()
    # Every key but "rng": a shuffled stream's "epoch_rng" (the generator at its epoch's
    # start, from which that epoch's shard order was drawn) included, or a resumed
    # shuffled run would draw another order for the rest of its epoch.
    data = {k: v for k, v in c.items() if k != "rng"}
    rng = {k: int(c["rng"][k], 16) for k in ("state", "inc")}
    return data, rng


@_torch_async.saving
@_torch_shard.dispatch_save
@collective_save
def save(
    dir: "os.PathLike[str] | str",
    step: int,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    stream=None,
    *,
    extra: Optional[Mapping[str, Any]] = None,
    keep: Optional[int] = None,
    config: Optional[Mapping[str, Any]] = None,
    overwrite: bool = False,
    blocking: bool = True,
    state: Optional[Mapping[str, Any]] = None,
) -> "str | _torch_async.PendingSave":
    """Save ``step`` of a torch loop in ``dir`` atomically; returns the step directory.

    ``model``'s ``state_dict()`` goes to model.safetensors in each tensor's own dtype
    (ties once, with metadata ``tied``); ``optimizer``'s state to optimizer.safetensors
    (every tensor as ``<param>.<key>``, the rest and the param groups in the JSON
    ``state``: ``{"type": "torch.<Class>", "param_groups": [...], "state": {...}}``);
    ``stream``'s cursor to ``data_cursor`` and ``rng_state``. ``extra`` holds any of
    ``tokens_seen``, ``lr``, ``config_sha256``, ``git_sha`` (and ``data_cursor`` when
    there is no stream); ``config`` becomes config.json; ``keep`` keeps the newest
    ``keep`` valid steps. ``state`` names other objects of the loop (an LR scheduler, a
    ``GradScaler``, anything with ``state_dict()`` and ``load_state_dict()``): each
    ``state_dict()`` is stored as JSON (``tlio._torch_state``: no pickle; a value JSON
    cannot hold, a tensor included, is a ``ValueError`` naming its key). Errors as
    ``tlio.checkpoint.save_checkpoint``; an argument of the wrong type is a
    ``TypeError`` naming it.

    Under torch.distributed (an initialized group of several ranks) every rank calls
    ``save`` with the same ``step``; rank 0 writes its own (replicated) state, the others
    wait, and all return the same path after rank 0 committed, LATEST included. An
    error on rank 0 is raised on every rank.

    When the model's or the optimizer's state holds DTensors (FSDP2, tensor parallel,
    2-D meshes, HSDP), the save is sharded (``tlio._torch_shard``): every rank writes
    its own chunks, replicated ones once, and rank 0 commits the chunk table.

    ``blocking=False`` returns a ``PendingSave`` as soon as the state is copied into
    host buffers tlio reuses from save to save (``tlio._torch_async``); the write, the
    hashes, the fsyncs and the commit run in the background. ``wait()`` gives the path
    or raises the save's error, which the next ``save`` or ``load`` raises otherwise.
    Every save and load first waits for the one in flight. The files are the same, byte
    for byte, as a blocking save's.
    """
    extra = _torch_args.save(model, optimizer, stream, extra, config, overwrite, state)
    dir = _torch_args.path(dir)
    unknown = [k for k in extra if k not in EXTRA_KEYS]
    if unknown:
        raise ValueError(f"extra has unknown key {unknown[0]!r} (allowed: {', '.join(EXTRA_KEYS)})")
    rng = None
    if stream is not None:
        if "data_cursor" in extra:
            raise ValueError("extra['data_cursor'] and stream both give the data position; pass one")
        extra["data_cursor"], rng = _stream_state(stream)
    state_json = _json("extra", {"step": _integer("step", step), **extra})
    config_bytes = None
    if config is not None:
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")
        config_bytes = (_json("config", config, indent=2) + "\n").encode()
    if keep is not None:
        keep = _integer("keep", keep)
    stage = None if blocking else _torch_async.stager()
    model_items, model_meta, alive = _model_items(model, stage)
    states = _torch_state.encode(state or {})
    if states is not None:
        model_meta[_torch_state.STATE_KEY] = states
    opt_items = opt_json = None
    if optimizer is not None:
        opt_items, opt_json, opt_alive = _optimizer_items(model, optimizer, stage)
        alive += opt_alive

    def write() -> str:
        return _core.save_tensors(
            dir, model_items, model_meta, opt_items, opt_json,
            state_json, _rng(rng), config_bytes, keep, bool(overwrite),
        )

    if stage is not None:
        stage.finish()
        return _torch_async.Deferred(write, step=step)  # ``write`` holds the staged items
    path = write()
    del alive
    return path


def _read(parts: tuple) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Every tensor of a loaded checkpoint file (``_core.load_files``' bytes, rows and
    metadata) as torch tensors of their stored dtypes, sharing the verified bytes."""
    buf, rows, meta = parts
    return {n: _tensor(n, buf, st, tuple(shape), a, b) for n, st, shape, a, b in rows}, dict(meta)


def _retie(model: torch.nn.Module, tied: Mapping[str, str]) -> None:
    """Make each tied name the very Parameter of the name it was stored under."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for other, first in tied.items():
        if other in params and first in params and params[other] is not params[first]:
            owner, _, leaf = other.rpartition(".")
            setattr(model.get_submodule(owner) if owner else model, leaf, params[first])


def _model_state(path: str, sd: Dict[str, torch.Tensor], meta: Mapping[str, str]) -> Dict[str, str]:
    """Fill ``sd`` with the tied names of model.safetensors; returns the ties."""
    try:
        tied = json.loads(meta.get(TIED_KEY, "{}"))
    except ValueError:
        tied = None
    if not isinstance(tied, dict) or not all(isinstance(v, str) for v in tied.values()):
        raise ValueError(f"{path}: metadata `{TIED_KEY}` is not a JSON object of names")
    for other, first in tied.items():
        if first not in sd:
            raise ValueError(f"{path}: {other!r} is tied to {first!r}, which is not stored")
        if other in sd:
            raise ValueError(f"{path}: {other!r} is both stored and tied to {first!r}")
    for other, first in tied.items():
        sd[other] = sd[first]
    return tied


def _check_model(model: torch.nn.Module, sd: Mapping[str, torch.Tensor], path: str) -> None:
    """Everything a strict ``load_state_dict`` checks, and the dtype it does not (it casts
    silently), before anything is copied: the same names, and each tensor's shape and dtype."""
    want = model.state_dict()
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match the model's state_dict: missing {missing}, unexpected {unexpected}"
        )
    for name, t in want.items():
        _refuse_kind(name, t, "the model's tensor")
        got = sd[name]
        if got.dtype != t.dtype:
            raise ValueError(
                f"{path}: tensor {name!r} is {got.dtype} in the checkpoint and {t.dtype} in the model "
                "(tlio.torch never casts; convert the model to the saved dtype, or the state yourself)"
            )
        if got.shape != t.shape:
            raise ValueError(
                f"{path}: tensor {name!r} has shape {list(got.shape)} in the checkpoint "
                f"and {list(t.shape)} in the model"
            )


def _load_optimizer(model, optimizer, tensors, meta, path) -> Dict[str, Any]:
    """Check the optimizer file whole against ``optimizer`` (``tlio._torch_optim.plan``),
    then load it; returns the file's JSON. A refusal leaves the optimizer unchanged."""
    want = TYPE_PREFIX + type(optimizer).__name__
    opt_state, doc = _torch_optim.plan(optimizer, _param_names(model), tensors, meta, path, want)
    optimizer.load_state_dict(opt_state)
    return doc


def _apply(model, sd, tied, optimizer, opt_state, stream, cursor, states=()) -> None:
    """Apply a checked load: the stream first (its ``restore`` checks the cursor against
    the stream and changes nothing when it refuses), then the optimizer, the ``state=``
    objects (``states``: ``tlio._torch_state.plan``'s pairs), then the model. Should torch
    still fail (a module's own load hook), what was applied is put back."""
    old_cursor = stream.cursor() if stream is not None else None
    old_opt = optimizer.state_dict() if optimizer is not None else None
    undo_states = None
    if stream is not None:
        stream.restore(cursor)
    try:
        if optimizer is not None:
            optimizer.load_state_dict(opt_state)
        undo_states = _torch_state.apply(list(states))
        model.load_state_dict(sd)
    except BaseException:
        if undo_states is not None:
            undo_states()
        if optimizer is not None:
            optimizer.load_state_dict(old_opt)
        if stream is not None:
            stream.restore(old_cursor)
        raise
    _retie(model, tied)


def _prepare_load(
    dir: "os.PathLike[str] | str",
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    stream=None,
    *,
    step: Optional[int] = None,
    state: Optional[Mapping[str, Any]] = None,
) -> Tuple[Checkpoint, Callable[[], None]]:
    """All of ``load`` but applying it: the step chosen, read, verified and checked whole
    against the model, the optimizer and the stream. Returns the Checkpoint and the
    function that applies it (under torch.distributed, called only once every rank's
    check passed)."""
    _torch_args.load(model, optimizer, stream, state)
    dir = _torch_args.path(dir)
    objects = dict(state or {})  # ``state`` names the trainer state below
    if step is not None:
        step = _integer("step", step)
    # Every file read once into owned memory while it is hashed: what is decoded is
    # what was verified, and nothing maps the files (a file replaced or truncated later
    # cannot reach the model or the optimizer's state). A step saved by a sharded run is
    # recognised by its manifest before any of it is read, and read (whole tensors) by
    # the sharded reader alone, never twice.
    got = _core.load_files(dir, step, True)
    if got is None:
        return _torch_shard.prepare_load(dir, model, optimizer, stream, step=step, state=state)
    path, n, state_json, rng, config, skipped, files = got
    state = json.loads(state_json)
    model_path = os.path.join(path, MODEL_FILE)
    sd, meta = _read(files[MODEL_FILE])
    tied = _model_state(model_path, sd, meta)
    # Everything is checked before anything is applied: a failed load changes nothing.
    _check_model(model, sd, model_path)
    saved_states = _torch_state.decode(meta, model_path)
    states = _torch_state.plan(objects, saved_states, path)
    opt = opt_state = None
    if optimizer is not None:
        opt_path = os.path.join(path, OPTIMIZER_FILE)
        if OPTIMIZER_FILE not in files:
            raise ValueError(f"{path} has no {OPTIMIZER_FILE} to restore the optimizer from")
        tensors, ometa = _read(files[OPTIMIZER_FILE])
        want = TYPE_PREFIX + type(optimizer).__name__
        opt_state, opt = _torch_optim.plan(optimizer, _param_names(model), tensors, ometa, opt_path, want)
    cursor = None
    if stream is not None:
        cursor = state.get("data_cursor")
        if cursor is None or rng is None:
            raise ValueError(f"{path} holds no data_cursor and rng_state to restore the stream from")
        cursor = {**cursor, "rng": {"state": f"{rng[0]:016x}", "inc": f"{rng[1]:016x}"}}
    ck = Checkpoint(
        path=path,
        step=n,
        model=sd,
        opt=opt,
        rng_state=None if rng is None else {"state": rng[0], "inc": rng[1]},
        extra={k: state[k] for k in EXTRA_KEYS},
        config=None if config is None else json.loads(config),
        skipped=[tuple(s) for s in skipped],
        state=saved_states,
    )
    return ck, lambda: _apply(model, sd, tied, optimizer, opt_state, stream, cursor, states)


@_torch_async.settled
@_torch_shard.dispatch_load
@collective_load(_prepare_load)
def load(
    dir: "os.PathLike[str] | str",
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    stream=None,
    *,
    step: Optional[int] = None,
    state: Optional[Mapping[str, Any]] = None,
) -> Checkpoint:
    """Restore the checkpoint ``tlio ckpt latest`` picks (or exactly step ``step``) into
    ``model``, ``optimizer`` and ``stream``.

    The model gets ``load_state_dict`` (strict) with every tensor in its saved dtype and
    its ties restored as the same Parameter; the optimizer gets its state and param
    groups matched by parameter name (a group by its set of names); the stream its
    cursor. Everything is checked first (names, shapes, dtypes, never a cast; the
    optimizer's class, JSON, hyper-parameters and state tensors; the cursor): a refused
    load raises ``ValueError`` and changes nothing. Returns a
    ``tlio.checkpoint.Checkpoint`` whose ``model`` is the loaded state dict (torch
    tensors), ``opt`` the optimizer JSON (or ``None``) and ``state`` every ``state=``
    state the step holds. Each object of ``state`` gets its saved state through
    ``load_state_dict`` (a name the step does not hold is refused before anything is
    applied). With ``step=None`` a step that fails verification is skipped for the
    newest older one that verifies (``Checkpoint.skipped`` says why); a named ``step``
    is that step or a ``FileNotFoundError`` naming it and why it failed, never another
    step. Nothing valid: ``FileNotFoundError``.

    Under torch.distributed every rank calls ``load``: rank 0 chooses the step (its
    ``step`` argument counts) and every rank reads and checks exactly that one; only
    when every rank's check passed does any rank apply it, so a refusal on one rank (a
    model that does not match there) is raised on every rank and changes nothing on any.

    A model or optimizer holding DTensors is loaded sharded (``tlio._torch_shard``):
    every rank reads and verifies only the regions its shards cover, from a sharded or
    an unsharded step, whatever layout saved it. A plain model loads a sharded step
    whole.
    """
    ck, apply = _prepare_load(dir, model, optimizer, stream, step=step, state=state)
    apply()
    return ck
