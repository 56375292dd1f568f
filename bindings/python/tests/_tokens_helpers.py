"""Helpers of the token and checkpoint tests: a reference PCG32 and stream written from
tokens.md in plain Python (so the tests check tlio against the spec, not against itself),
a shard writer, and the CLI binary of this repository."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

MASK64 = (1 << 64) - 1
MULT = 6364136223846793005
MAGIC = 20240520
LLAMA3_MAGIC = 20240801


def _find_root() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "Cargo.toml").is_file() and (parent / "src" / "core" / "Cargo.toml").is_file():
            return parent
    raise RuntimeError(f"the repository root (Cargo.toml, src/core) is not above {here}")


ROOT = _find_root()
TLIO_BIN = ROOT / "target" / "release" / "tlio"


def tlio(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run this repository's release CLI; a missing binary fails the test (never a skip)."""
    if not TLIO_BIN.is_file():
        pytest.fail(
            f"{TLIO_BIN} is missing: run `cargo build --release` at the repository root "
            "first (the tests compare the Python package with the CLI)"
        )
    out = subprocess.run(
        [str(TLIO_BIN), *args], capture_output=True, text=True, timeout=120, **kw
    )
    if check and out.returncode != 0:
        raise AssertionError(f"tlio {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return out


class RefPCG32:
    """tokens.md's PCG32 (O'Neill's pcg_basic), in plain Python, duck-typed like
    tlio.pcg.PCG32: ``state()`` -> {"state": int, "inc": int}."""

    def __init__(self, initstate: int, initseq: int = 54) -> None:
        self._state = 0
        self._inc = ((initseq << 1) | 1) & MASK64
        self.next_u32()
        self._state = (self._state + initstate) & MASK64
        self.next_u32()

    @classmethod
    def from_state(cls, state: int, inc: int) -> "RefPCG32":
        r = cls.__new__(cls)
        r._state, r._inc = state, inc
        return r

    def next_u32(self) -> int:
        old = self._state
        self._state = (old * MULT + self._inc) & MASK64
        x = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        r = old >> 59
        return ((x >> r) | (x << ((-r) & 31))) & 0xFFFFFFFF

    def below(self, bound: int) -> int:
        threshold = ((-bound) & 0xFFFFFFFF) % bound
        while True:
            r = self.next_u32()
            if r >= threshold:
                return r % bound

    def state(self) -> Dict[str, int]:
        return {"state": self._state, "inc": self._inc}

    def set_state(self, d: Dict[str, int]) -> None:
        self._state, self._inc = d["state"], d["inc"]

    def copy(self) -> "RefPCG32":
        return RefPCG32.from_state(self._state, self._inc)


def seed_drawing(draws: Sequence[int], bound: int) -> int:
    """The first seed S whose PCG32 seed(S, 54) gives ``draws`` from below(bound)."""
    for s in range(100000):
        r = RefPCG32(s)
        if all(r.below(bound) == d for d in draws):
            return s
    raise AssertionError(f"no seed draws {draws}")


def header_bytes(n: int, vocab: int, version: int = 1, magic: int = MAGIC) -> bytes:
    words = [magic, version, n, vocab] + [0] * 252
    return struct.pack("<256i", *words)


def write_shard(
    path: Path, ids: Sequence[int], vocab: int = 256, version: int = 1, magic: int = MAGIC
) -> Path:
    """A shard of ``ids``: uint16 for version 1, uint32 otherwise."""
    dtype = "<u2" if version == 1 else "<u4"
    path.write_bytes(header_bytes(len(ids), vocab, version, magic) + np.asarray(ids, dtype).tobytes())
    return path


class RefStream:
    """tokens.md's stream in plain Python, recording where each window started."""

    def __init__(self, shards: List[np.ndarray], seq_len: int, batch: int, rng: RefPCG32) -> None:
        self.shards, self.T, self.B, self.rng = shards, seq_len, batch, rng.copy()
        self.shard = 0
        self.offset = self._phase(0)
        self.windows: List[Tuple[int, int]] = []

    def _phase(self, shard: int) -> int:
        n = len(self.shards[shard])
        return self.rng.below(max(1, min(self.T, n - self.T)))

    def window(self) -> np.ndarray:
        if self.offset + self.T + 1 > len(self.shards[self.shard]):
            self.shard = (self.shard + 1) % len(self.shards)
            self.offset = self._phase(self.shard)
        w = self.shards[self.shard][self.offset : self.offset + self.T + 1].astype(np.int64)
        self.windows.append((self.shard, self.offset))
        self.offset += self.T
        return w

    def next_batch(self) -> Tuple[np.ndarray, np.ndarray]:
        ws = np.stack([self.window() for _ in range(self.B)])
        return ws[:, :-1], ws[:, 1:]

    def cursor(self) -> Dict:
        st = self.rng.state()
        return {
            "shard": self.shard,
            "offset": self.offset,
            "rng": {"state": f"{st['state']:016x}", "inc": f"{st['inc']:016x}"},
        }


def cli_windows(
    shards: Sequence[Path], seq_len: int, batch: int, seed: int, batches: int,
    cursor: Optional[Path] = None,
) -> List[Dict]:
    """`tlio tokens windows`'s JSON lines; with `cursor`, `seed` is not passed (the
    cursor holds the generator's state, and the CLI refuses the two together)."""
    args = ["tokens", "windows", *map(str, shards), "--seq-len", str(seq_len),
            "--batch", str(batch), "--batches", str(batches)]
    args += ["--cursor", str(cursor)] if cursor is not None else ["--seed", str(seed)]
    out = tlio(*args)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
