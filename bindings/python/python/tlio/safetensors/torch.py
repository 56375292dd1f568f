"""``safetensors.torch``'s functions over tlio's core: one changed import.

``from tlio.safetensors.torch import save_file, load_file`` behaves as the
``safetensors`` package's module: the same signatures and defaults, every torch dtype
safetensors names (bfloat16, the float8 family, float4, bool, complex64, the unsigned
ints), ``metadata=None`` against ``{}``, tensors sharing memory refused with the
package's ``RuntimeError`` (``save_model`` keeps one of each and records the others in
the metadata), non-contiguous and sparse tensors refused with its ``ValueError``, and
the bytes of the package's files. Loaded tensors are zero-copy and writable, over a
private copy-on-write map of the file.

The helpers the package's tests use (``storage_ptr``, ``storage_size``,
``_find_shared_tensors``, ``_remove_duplicate_names``, ``_is_complete``, ``_end_ptr``)
are here with the same meaning.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, List, Optional, Set, Tuple, Union

try:
    import torch
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
    raise ModuleNotFoundError(
        "tlio.safetensors.torch needs torch, which is not installed: pip install 'tlio[torch]' (or pip install torch)",
        name="torch",
    ) from None

from tlio._tlio import safetensors as _st
from tlio.safetensors import SafetensorError, safe_open
from tlio.safetensors._compat import _torch_of, torch_dtypes

__all__ = ["save", "save_file", "load", "load_file", "save_model", "load_model"]

_NAME_OF = {dt: name for name, dt in torch_dtypes().items()}


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the storage under ``tensor`` (0 when it has none)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The bytes of the storage under ``tensor``."""
    try:
        return tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the last byte of ``tensor``'s data (its start when it is empty)."""
    if tensor.nelement() == 0:
        return tensor.data_ptr()
    return tensor.view(-1)[-1].data_ptr() + tensor.element_size()


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` covers its whole storage, from its first byte."""
    return (
        tensor.data_ptr() == storage_ptr(tensor)
        and tensor.nelement() * tensor.element_size() == storage_size(tensor)
    )


def _split_overlapping(groups: List[Set[str]], state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Each group of names on one storage, split where their byte ranges do not overlap."""
    out: List[Set[str]] = []
    for names in groups:
        if len(names) < 2:
            out.append(names)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in names)
        current: Set[str] = set()
        reach = None
        for start, stop, name in spans:
            if reach is not None and start >= reach:
                out.append(current)
                current = set()
            current.add(name)
            reach = stop  # as the package: the previous span's end, not the furthest
        out.append(current)
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Sets of names whose tensors share memory (a set of one for the others)."""
    by_storage: Dict[Any, Set[str]] = defaultdict(set)
    for name, t in state_dict.items():
        if t.device.type == "meta":
            continue
        ptr, size = storage_ptr(t), storage_size(t)
        if ptr != 0 and size != 0:
            by_storage[(t.device, ptr, size)].add(name)
    # sorted() of disjoint sets keeps their order, as the package's does.
    return _split_overlapping(list(sorted(by_storage.values())), state_dict)


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[List[str]] = None,
    discard_names: Optional[List[str]] = None,
) -> Dict[str, List[str]]:
    """For each group of shared tensors, the name to keep -> the names to drop.

    The kept name covers the whole storage (a group where none does is a
    ``RuntimeError``): the first in sorted order, avoiding ``discard_names`` and
    preferring ``preferred_names``."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    to_remove: Dict[str, List[str]] = defaultdict(list)
    for shared in _find_shared_tensors(state_dict):
        complete = {n for n in shared if _is_complete(state_dict[n])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable name to keep"
                f" for saving amongst: {shared}. None is covering the entire storage.Refusing to save/load the model"
                " since you could be storing much more memory than needed. Please refer to"
                " https://huggingface.co/docs/safetensors/torch_shared_tensors for more information. Or open an"
                " issue."
            )
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        to_remove[keep].extend(n for n in sorted(shared) if n != keep)
    return to_remove


def _check(tensors: Any) -> None:
    """The package's refusals, in its words, before anything is written."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}")
        if t.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed."
        )
    shared = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if shared:
        raise RuntimeError(
            f"""
            Some tensors share memory, this will lead to duplicate memory on disk and potential differences when loading them again: {shared}.
            A potential way to correctly save your model is to use `save_model`.
            More information at https://huggingface.co/docs/safetensors/torch_shared_tensors
            """
        )


def _items(tensors: Dict[str, torch.Tensor]) -> list:
    """The binding's items (name, dtype, shape, uint8 bytes, "raw"); the arrays are views
    of the tensors' memory (a CPU copy for tensors on another device)."""
    _check(tensors)
    items = []
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means you"
                " are trying to save tensors which are reference of each other in which case it's recommended to save"
                " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
                " pack it before saving."
            )
        dtype = _NAME_OF.get(t.dtype)
        if dtype is None:
            raise SafetensorError(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors dtype")
        cpu = t.detach()
        if cpu.device.type != "cpu":
            cpu = cpu.to("cpu")
        shape = [int(n) for n in cpu.shape]
        if dtype == "F4" and shape:
            shape[-1] *= 2  # the file counts F4 values; torch packs two per element
        raw = cpu.reshape(-1).view(torch.uint8).numpy()
        items.append((name, dtype, shape, raw, "raw"))
    return items


def _meta(metadata: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorError("metadata must be a dict of str to str")
    return dict(metadata)


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` and ``metadata``."""
    items = _items(tensors)
    try:
        return _st.serialize(items, _meta(metadata))
    except SafetensorError:
        raise
    except ValueError as e:
        raise SafetensorError(str(e)) from None


def save_file(
    tensors: Dict[str, torch.Tensor],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Write ``tensors`` to ``filename``: canonical bytes, written under a temporary name
    and renamed (no fsync, like the package)."""
    items = _items(tensors)
    try:
        _st.save_file(os.fspath(filename), items, _meta(metadata), False)
    except SafetensorError:
        raise
    except OSError:
        raise
    except ValueError as e:
        raise SafetensorError(str(e)) from None


def load_file(
    filename: Union[str, os.PathLike], device: Union[str, int] = "cpu", *, backend: str = "mmap"
) -> Dict[str, torch.Tensor]:
    """The tensors of ``filename``: zero-copy and writable over a private map, or with
    ``backend="pread"`` read into memory of their own (moved to ``device`` when it is not
    the cpu)."""
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file given as bytes (writable copies)."""
    try:
        rows, _meta_, _size = _st.header_of_bytes(data)
    except ValueError as e:
        raise SafetensorError(str(e)) from None
    buf = bytearray(data)  # one writable copy the tensors share
    out = {}
    for name, dtype, shape, start, end in rows:
        raw = torch.frombuffer(buf, dtype=torch.uint8, count=end - start, offset=start) if end > start else torch.zeros(0, dtype=torch.uint8)
        out[name] = _torch_of(raw, dtype, name, tuple(shape))
    return out


def save_model(
    model: torch.nn.Module,
    filename: str,
    metadata: Optional[Dict[str, str]] = None,
    force_contiguous: bool = True,
) -> None:
    """Save ``model``'s state_dict with each shared tensor once: the other names are
    dropped and recorded in the metadata (dropped name -> kept name)."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(
            f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential caveats."
        ) from None


def load_model(
    model: torch.nn.Module,
    filename: Union[str, os.PathLike],
    strict: bool = True,
    device: Union[str, int] = "cpu",
    *,
    backend: str = "mmap",
) -> Tuple[List[str], List[str]]:
    """Load ``filename`` into ``model``, restoring shared tensors: returns (missing,
    unexpected) names; with ``strict`` either one is a ``RuntimeError``. ``backend`` as
    for ``load_file``."""
    state_dict = load_file(filename, device=device, backend=backend)
    shared = _remove_duplicate_names(model.state_dict(), preferred_names=list(state_dict))
    missing_list, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing_list)
    for dropped in shared.values():
        for name in dropped:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected
