from typing import Any, List, Tuple

from torchtitan.components.checkpointer.dcp import AsyncMode
from torchtitan.components.checkpointer.dcp import CheckpointManager as _TitanManager

__all__ = ["CheckpointManager", "find_load_step"]

def find_load_step(folder: str) -> Tuple[int, List[Tuple[str, str]]]: ...

class CheckpointManager(_TitanManager):
    class Config(_TitanManager.Config): ...
    def dcp_save(self, state_dict: dict, checkpoint_id: str, async_mode: AsyncMode,
                 enable_garbage_collection: bool = ..., to_hf: bool = ...) -> Any: ...
    def dcp_load(self, state_dict: dict, checkpoint_id: str, from_hf: bool, from_quantized: bool) -> None: ...
