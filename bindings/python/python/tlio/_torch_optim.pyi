from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple

import torch

SCALAR_KEYS: FrozenSet[str]
ELEMENTWISE_KEYS: FrozenSet[str]
OWN_KEYS: Tuple[str, ...]

def document(text: Optional[str], path: str) -> Dict[str, Any]: ...
def live_groups(optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> List[List[str]]: ...
def plan(
    optimizer: torch.optim.Optimizer,
    names: Mapping[int, str],
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, str],
    path: str,
    want_type: str,
) -> Tuple[Dict[str, Any], Dict[str, Any]]: ...
