from typing import List, Optional

from torch.distributed.checkpoint.metadata import Metadata

from tlio.dcp import PathLike

MAX_METADATA_BYTES: int

def read_metadata(dcp_dir: str) -> Metadata: ...
def import_checkpoint(dcp_dir: PathLike, run_dir: PathLike, *, step: Optional[int] = ...) -> str: ...
def main(argv: Optional[List[str]] = ...) -> int: ...
