"""`tlio st quantize --mx fp8|fp4` against torchao's `to_mx` (its default FLOOR rule, on
CPU): random weights and edge blocks (all zero, one huge value, f32 subnormals, values at
the element format's rounding midpoints, amax at a power of two, values that saturate,
the ends of f32's range) give the same scale bytes and element bytes, from F32 and BF16
sources."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from _tokens_helpers import tlio

mx_tensor = pytest.importorskip(
    "torchao.prototype.mx_formats.mx_tensor",
    reason="torchao (a test-only requirement) is not installed",
)

BLOCK = 32
# Positive E2M1 values and a sample of E4M3 ones, for midpoints between neighbours.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E4M3 = [0.0, 2.0**-9, 2.0**-6, 1.0, 1.125, 1.25, 15.0, 16.0, 18.0, 240.0, 256.0, 288.0, 416.0, 448.0]


def midpoints(values):
    return [(a + b) / 2 for a, b in zip(values, values[1:])]


def edge_blocks(fmt: str) -> np.ndarray:
    """Blocks of 32 values, one per row, that exercise each corner of the rule."""
    top = 6.0 if fmt == "fp4" else 448.0
    grid = E2M1 if fmt == "fp4" else E4M3
    rows = []

    def block(vals):
        vals = list(vals)[:BLOCK]
        vals += [0.0] * (BLOCK - len(vals))
        rows.append(np.array(vals, dtype=np.float32))

    block([])  # all zero
    block([-0.0] * BLOCK)  # negative zeros
    block([1e30] + [1.0] * 31)  # one huge value: the rest flush to zero
    block([3.0e38, -1.0e-3])  # near f32's largest
    block([1e-40, -3e-42, 1e-45])  # f32 subnormals only
    block([1.2e-38, 1e-40])  # smallest normal with a subnormal
    for mid in midpoints(grid):  # every midpoint, with the block's amax at `top` (X = 1)
        block([top, mid, -mid, mid * 2.0**-5])
    for p in (-20, -1, 0, 1, 2, 3, 8, 9, 60):  # amax at a power of two
        block([2.0**p, -(2.0**p) * 0.75, 2.0**p * 0.3])
    block([top * 1.3, top * 1.01, -top * 1.9])  # saturation below the next exponent
    block([7.99, -5.0, 0.26])  # rounds up to 8 and saturates at 6 (fp4)
    block([2.0**127, 2.0**-126])
    return np.stack(rows)


def random_weights(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    # A different magnitude every few rows, so scales spread over many exponents.
    w *= (2.0 ** rng.integers(-30, 30, size=(rows, 1))).astype(np.float32)
    return w


def write_f32(path: Path, name: str, arr: np.ndarray, dtype: str = "F32") -> None:
    """A safetensors file of one tensor (F32, or BF16 by truncating exact BF16 values)."""
    if dtype == "F32":
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
    else:
        data = (np.ascontiguousarray(arr, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
    header = {name: {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [0, len(data)]}}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def read_raw(path: Path) -> dict:
    """name -> (dtype, shape, bytes) of every tensor in a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], raw[8 + n + a : 8 + n + b])
    return out


def torchao_bytes(w: torch.Tensor, fmt: str):
    elem = torch.float8_e4m3fn if fmt == "fp8" else torch.float4_e2m1fn_x2
    scale, data = mx_tensor.to_mx(w.contiguous(), elem, BLOCK)
    return scale.view(torch.uint8).numpy().tobytes(), data.view(torch.uint8).numpy().tobytes()


CASES = [
    ("random", lambda fmt: random_weights(48, 256, 7)),
    ("edges", edge_blocks),
]


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
@pytest.mark.parametrize("source", ["F32", "BF16"])
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_st_quantize_mx_writes_torchaos_scale_and_element_bytes(tmp_path, fmt, source, case):
    w = dict(CASES)[case](fmt)
    if source == "BF16":
        # Values BF16 holds exactly (truncated), so both sides quantize the same numbers.
        w = (w.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    src = tmp_path / "w.safetensors"
    write_f32(src, "w.weight", w, source)
    out = tmp_path / "q.safetensors"
    tlio("st", "quantize", str(src), "-o", str(out), "--mx", fmt, "--only", "^w")
    got = read_raw(out)
    t = torch.from_numpy(w.copy())
    if source == "BF16":
        t = t.to(torch.bfloat16)
    want_scales, want_elems = torchao_bytes(t, fmt)
    rows, cols = w.shape
    if fmt == "fp8":
        assert got["w.weight"][:2] == ("F8_E4M3", [rows, cols])
        assert got["w.weight_scale"][:2] == ("F8_E8M0", [rows, cols // BLOCK])
        scales, elems = got["w.weight_scale"][2], got["w.weight"][2]
    else:
        assert got["w_blocks"][:2] == ("U8", [rows, cols // BLOCK, 16])
        assert got["w_scales"][:2] == ("U8", [rows, cols // BLOCK])
        scales, elems = got["w_scales"][2], got["w_blocks"][2]
    assert scales == want_scales, first_difference(scales, want_scales, 1)
    assert elems == want_elems, first_difference(elems, want_elems, 16 if fmt == "fp4" else BLOCK)


def first_difference(a: bytes, b: bytes, per_block: int) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"byte {i} (block {i // per_block}): tlio {x:#04x}, torchao {y:#04x}"
    return f"lengths {len(a)} and {len(b)}"
