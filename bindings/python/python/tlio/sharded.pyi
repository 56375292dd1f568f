"""Type stubs of tlio.sharded: sharded checkpoints (rank files, chunk table, verified region reads)."""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

PathLike = Union[str, os.PathLike[str]]

FORMAT: str
VERSION: int
SHARDS_NAME: str
PIECE_BYTES: int
DIGEST: str
GROUPS: Tuple[str, str]
DTYPES: List[str]
__all__: List[str]

#: What write_rank_file returns and commit takes back:
#: {"name", "size", "sha256", "tensors": {key: {"dtype", "shape", "begin", "end", "pieces"}}}
RankFileTable = Dict[str, Any]
#: {"group", "name", "dtype", "shape", "chunks": [{"offsets", "sizes", "file", "key"}]}
TensorEntry = Mapping[str, Any]
Chunk = Tuple[str, str, Sequence[int], npt.NDArray[np.uint8]]
Read = Tuple[str, str, Sequence[int], Sequence[int], npt.NDArray[np.uint8]]

class ShardedSave:
    """A sharded save in progress on rank 0: the lock held, ``tmp_dir`` created."""

    @property
    def tmp_dir(self) -> str:
        """``step-N.tmp`` (on object storage the attempt's URL), where every rank writes its files."""
    @property
    def probe(self) -> Optional[str]:
        """The token of the probe in a local ``tmp_dir`` that every rank checks with
        ``check_shared`` before writing; None on object storage."""
    @property
    def step(self) -> int:
        """The step being saved."""
    def commit(
        self,
        files: List[RankFileTable],
        tensors: List[TensorEntry],
        meta: Mapping[str, Mapping[str, str]],
        state_json: str,
        rng: Optional[Tuple[int, int]],
        config: Optional[bytes],
        keep: Optional[int],
    ) -> str:
        """Check the chunk table and commit; returns the step directory."""
    def abort(self) -> None:
        """Remove the tmp directory and release the lock; nothing is committed."""

def begin(dir: PathLike, step: int, overwrite: bool = False) -> ShardedSave:
    """Start a sharded save (rank 0 only): lock, refusals, a fresh ``step-N.tmp`` (on an
    ``s3://`` prefix: refusals from one listing, a fresh attempt)."""

def check_shared(tmp_dir: PathLike, token: str) -> None:
    """Check (any rank, before writing) that ``tmp_dir`` is the directory rank 0 began,
    holding its probe ``token``; a directory this host sees on its own raises a
    ``ValueError`` naming the checkpoint directory as not shared between the hosts."""

def write_rank_file(
    tmp_dir: PathLike, file_name: str, chunks: Sequence[Chunk], durable: bool = True
) -> RankFileTable:
    """Write one rank's chunks as one canonical safetensors file; returns its table."""

class ShardedStep:
    """A step opened for verified region reads."""

    @property
    def path(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def sharded(self) -> bool:
        """False for an unsharded (model.safetensors) step."""
    @property
    def state_json(self) -> str: ...
    @property
    def rng(self) -> Optional[Tuple[int, int]]: ...
    @property
    def config(self) -> Optional[bytes]: ...
    @property
    def skipped(self) -> List[Tuple[str, str]]: ...
    @property
    def meta(self) -> Dict[str, Dict[str, str]]: ...
    def tensors(self) -> Dict[Tuple[str, str], Tuple[str, List[int]]]:
        """``{(group, name): (dtype, global shape)}``."""
    def read(
        self,
        group: str,
        name: str,
        offsets: Sequence[int],
        sizes: Sequence[int],
        out: npt.NDArray[np.uint8],
    ) -> None:
        """Fill ``out`` with the region ``[offsets, offsets + sizes)``, verified."""
    def read_many(self, reads: Sequence[Read]) -> None:
        """``read`` of many regions in one call, all pieces in parallel."""
    def close(self) -> None:
        """Close the data files."""

def open_step(dir: PathLike, step: Optional[int] = None, *, below: Optional[int] = None) -> ShardedStep:
    """Open the step ``tlio ckpt latest`` picks, or exactly ``step`` (never another); with
    ``below``, the one it picks among the steps older than ``below``."""
