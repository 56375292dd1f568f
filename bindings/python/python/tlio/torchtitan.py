"""tlio as torchtitan's checkpoint storage: a ``CheckpointManager`` whose steps are verified tlio steps.

torchtitan (0.3) builds its checkpoint manager from ``Trainer.Config.checkpoint``, so the
switch is one line in a torchtitan config::

    from tlio.torchtitan import CheckpointManager
    ...
    checkpoint=CheckpointManager.Config(interval=500),   # was torchtitan's CheckpointManager.Config

This manager is torchtitan's own DCP ``CheckpointManager`` (same config fields, same
``{folder}/step-{N}`` directories, same async modes, purge and HF export), with three
changes:

- every DCP save of training state goes through ``tlio.dcp.Writer`` (checksummed
  safetensors rank files, atomic commit, no pickle); saves in HF format stay torchtitan's;
- every load of a tlio step goes through ``tlio.dcp.Reader``, which verifies every byte it
  hands to DCP; a plain DCP directory (``.metadata``, e.g. an ``initial_load_path``) is
  still loaded by DCP's own reader;
- "find the latest step" takes the newest ``step-N`` directory that verifies whole
  (``tlio.checkpoint.verify_step_dir``), passing over damaged or uncommitted ones with a
  warning, instead of the newest one that merely holds a ``.metadata`` file.

``tlio ckpt export {folder}/step-N -o DIR`` writes a Hugging Face model directory from
such a step when the trainer's state dict adapter is torchtitan's llama3 one
(``Llama3StateDictAdapter``): each save records the export rule (``hf_export_rule``:
the adapter's own llama -> Hugging Face names, its weight tying, and its rotary reorder
of the query and key projections, which the CLI applies head by head) and the model's
``config.json`` from the adapter's ``hf_assets_path``, when it holds one. Other models'
steps save and load as before; their export is refused, saying why.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import StagingOptions  # noqa: F401  (torchtitan's stager)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from dataclasses import dataclass

from torchtitan.components.checkpointer import MODEL
from torchtitan.components.checkpointer.dcp import AsyncMode
from torchtitan.components.checkpointer.dcp import CheckpointManager as _TitanManager
from torchtitan.tools.utils import GarbageCollection

import tlio.dcp
from tlio.checkpoint import verify_step_dir

__all__ = ["CheckpointManager", "find_load_step", "hf_export_rule"]

_TITAN_STEP = re.compile(r"^step-(\d+)$")
#: The projections Llama3StateDictAdapter.to_hf reorders (its ``_permute``), and which of
#: the attention config's head counts each is reordered by.
_ROTARY = {"layers.{}.attention.qkv_linear.wq.weight": "n_heads",
           "layers.{}.attention.qkv_linear.wk.weight": "n_kv_heads"}


def hf_export_rule(sd_adapter: Any, model_state: dict) -> Optional[List[Tuple[str, str, Optional[int]]]]:
    """The ``hf_export`` rule of ``tlio.dcp.Writer`` for torchtitan's llama3 adapter, as
    (Hugging Face name, state-dict key, rotary heads or None) rows; ``None`` for any
    other adapter. The names are the adapter's own: its ``to_hf`` run on a meta tensor
    of each entry's shape (so weight tying drops ``lm_head.weight`` as it does there)."""
    try:
        from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
    except ImportError:  # pragma: no cover - torchtitan without its llama3 model
        return None
    if not isinstance(sd_adapter, Llama3StateDictAdapter):
        return None
    attn = sd_adapter.model_config.layers[0].attention
    heads = {"n_heads": attn.n_heads, "n_kv_heads": attn.n_kv_heads or attn.n_heads}
    rule = []
    for key, value in model_state.items():
        if not isinstance(value, torch.Tensor):
            continue
        abstract = re.sub(r"(\d+)", "{}", key, count=1)
        count = heads[_ROTARY[abstract]] if abstract in _ROTARY else None
        for name in sd_adapter.to_hf({key: torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")}):
            rule.append((name, key, count))
    return sorted(rule)


def _hf_config(sd_adapter: Any) -> Optional[bytes]:
    """The model's ``config.json`` from the adapter's ``hf_assets_path``, if it holds one."""
    assets = getattr(sd_adapter, "hf_assets_path", None)
    path = os.path.join(assets, "config.json") if assets else None
    if path is None or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def find_load_step(folder: str) -> Tuple[int, List[Tuple[str, str]]]:
    """The newest ``step-N`` directory of ``folder`` that verifies whole, as ``(N, skipped)``:
    ``N`` is -1 when none does; ``skipped`` lists the newer directories passed over, as
    ``(name, why)``."""
    if not os.path.isdir(folder):
        return -1, []
    steps = []
    for name in os.listdir(folder):
        m = _TITAN_STEP.match(name)
        if m is not None and os.path.isdir(os.path.join(folder, name)):
            steps.append((int(m.group(1)), name))
    skipped: List[Tuple[str, str]] = []
    for n, name in sorted(steps, reverse=True):
        path = os.path.join(folder, name)
        if not os.path.isfile(os.path.join(path, "MANIFEST.json")):
            skipped.append((name, "no MANIFEST.json (not a committed tlio step)"))
            continue
        problems = verify_step_dir(path)
        if not problems:
            return n, skipped
        skipped.append((name, "; ".join(problems)))
    return -1, skipped


class CheckpointManager(_TitanManager):
    """torchtitan's DCP ``CheckpointManager`` writing and reading verified tlio steps."""

    @dataclass(kw_only=True, slots=True)
    class Config(_TitanManager.Config):
        """torchtitan's checkpoint config, unchanged; selecting it selects tlio's storage."""

    def dcp_save(self, state_dict: dict, checkpoint_id: str, async_mode: AsyncMode,
                 enable_garbage_collection: bool = False, to_hf: bool = False) -> Any:
        if to_hf:
            return _TitanManager.dcp_save(self, state_dict, checkpoint_id, async_mode,
                                          enable_garbage_collection, to_hf)
        writer = tlio.dcp.Writer(checkpoint_id, **self._export_args())
        if async_mode == AsyncMode.ASYNC:
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg)
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg,
                                 async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                                 async_stager=self.stager)
        else:
            ret = dcp.save(state_dict, storage_writer=writer)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def _export_args(self) -> dict:
        """The export rule and config.json every save records (computed once)."""
        cached = getattr(self, "_tlio_export", None)
        if cached is None:
            rule = None
            if self.sd_adapter is not None and MODEL in self.states:
                rule = hf_export_rule(self.sd_adapter, self.states[MODEL].state_dict())
            cached = {"hf_export": rule, "config": _hf_config(self.sd_adapter) if rule else None}
            self._tlio_export = cached
        return cached

    def dcp_load(self, state_dict: dict, checkpoint_id: str, from_hf: bool, from_quantized: bool) -> None:
        plain_dcp = (os.path.isfile(os.path.join(checkpoint_id, ".metadata"))
                     and not os.path.isfile(os.path.join(checkpoint_id, "MANIFEST.json")))
        if from_hf or plain_dcp:
            return _TitanManager.dcp_load(self, state_dict, checkpoint_id, from_hf, from_quantized)
        dcp.load(state_dict, storage_reader=tlio.dcp.Reader(checkpoint_id))
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)

    def _find_load_step(self, folder: str = "") -> int:
        step, skipped = find_load_step(folder or self.folder)
        if skipped:
            warnings.warn("tlio.torchtitan: passing over {}".format(
                "; ".join(f"{n} ({why})" for n, why in skipped)), stacklevel=2)
        return step
