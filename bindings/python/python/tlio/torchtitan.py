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
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, List, Optional, Tuple

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

__all__ = ["CheckpointManager", "find_load_step"]

_TITAN_STEP = re.compile(r"^step-(\d+)$")


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
        writer = tlio.dcp.Writer(checkpoint_id)
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
