"""tokens.md's PCG32 generator (O'Neill's pcg_basic: XSH-RR, 64-bit state, 32-bit output).

``PCG32(seed, seq=54)`` is ``seed(initstate=seed, initseq=seq)``; the CLI's ``--seed S``
means ``PCG32(S)``. ``PCG32.from_state(state, inc)`` resumes an exact position;
``.state()`` returns ``{"state": int, "inc": int}`` and ``.set_state(d)`` restores it. An
even increment is a ``ValueError`` everywhere. The generator is tlio-core's, the same code
the CLI's token stream draws its phases from.
"""

from tlio._tlio.pcg import DEFAULT_SEQ, PCG32

__all__ = ["PCG32", "DEFAULT_SEQ"]
