"""tokens.md's PCG32 generator over tlio's core."""

from typing import Dict, Mapping, Union

DEFAULT_SEQ: int

_U64 = Union[int, str]

class PCG32:
    """PCG32 (XSH-RR, 64-bit state, 32-bit output), pcg_basic's ``seed(seed, seq)``."""

    def __init__(self, seed: int, seq: int = 54) -> None: ...
    @classmethod
    def from_state(cls, state: _U64, inc: _U64) -> "PCG32":
        """A generator at an exact saved position; an even ``inc`` is a ``ValueError``."""
    def next_u32(self) -> int:
        """The next 32-bit output."""
    def below(self, bound: int) -> int:
        """Uniform in ``[0, bound)`` without modulo bias; ``1 <= bound < 2**32``."""
    def state(self) -> Dict[str, int]:
        """The whole position: ``{"state": int, "inc": int}``."""
    def set_state(self, d: Mapping[str, _U64]) -> None:
        """Move to the position ``d`` (ints, or 16 hex digits as cursors store them)."""
    def __eq__(self, other: object) -> bool: ...
    def __copy__(self) -> "PCG32": ...
    def __deepcopy__(self, memo: object) -> "PCG32": ...
