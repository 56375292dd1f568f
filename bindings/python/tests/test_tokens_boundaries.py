"""Document boundaries of TokenStream.next_batch(boundaries=True): positions and
cu_seqlens equal transformers' DataCollatorWithFlattening fed each window's document
pieces, equal a plain-Python reference on random document lengths, and are the same
from a pack's .docs sidecars as from eot=; a shard with neither is a ValueError."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _tokens_helpers import tlio
from tlio.pcg import PCG32
from tlio.tokens import TokenStream

EOT = 0


def write_shard(path: Path, ids, vocab: int = 1000) -> Path:
    header = np.zeros(256, dtype="<i4")
    header[:4] = [20240520, 1, len(ids), vocab]
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype="<u2").tobytes())
    return path


def write_sidecar(shard: Path, starts, n: int) -> Path:
    """The documented sidecar format, written by the test itself."""
    head = b"TLIODOCS" + np.array([1, 0], "<u4").tobytes() + np.array([n, len(starts)], "<u8").tobytes()
    side = shard.with_suffix(".docs")
    side.write_bytes(head + np.asarray(starts, "<u8").tobytes())
    return side


def documents_ids(lengths, seed: int = 1):
    """Documents as a pack writes them: each an EOT then (length - 1) other ids."""
    rng = np.random.default_rng(seed)
    ids, starts = [], []
    for n in lengths:
        starts.append(len(ids))
        ids.append(EOT)
        ids.extend(rng.integers(1, 1000, size=n - 1).tolist())
    return ids, starts


def reference(window_starts, t: int):
    """positions and cu_seqlens of one window whose documents start at window_starts."""
    cuts = [0] + [s for s in window_starts if 0 < s < t] + [t]
    positions = []
    for a, b in zip(cuts, cuts[1:]):
        positions.extend(range(b - a))
    return positions, cuts + [-1] * (t + 1 - len(cuts))


def offset_of(ids, row) -> int:
    arr = np.asarray(ids)
    t = len(row)
    for o in range(len(arr) - t):
        if np.array_equal(arr[o : o + t], row):
            return o
    raise AssertionError("window not found")


def test_positions_and_cu_seqlens_equal_transformers_flattening_collator(tmp_path):
    from transformers import DataCollatorWithFlattening

    lengths = [5, 17, 3, 40, 9, 1, 26, 12, 8, 30, 2, 19]
    ids, starts = documents_ids(lengths)
    shard = write_shard(tmp_path / "s.bin", ids)
    write_sidecar(shard, starts, len(ids))
    t, b = 16, 3
    stream = TokenStream([shard], t, b, PCG32(7, 3))
    collator = DataCollatorWithFlattening(
        return_position_ids=True, return_flash_attn_kwargs=True, return_tensors="np"
    )
    checked = 0
    for _ in range(4):
        x, _, positions, cu = stream.next_batch(boundaries=True)
        assert positions.dtype == np.int32 and cu.dtype == np.int32
        assert positions.shape == (b, t) and cu.shape == (b, t + 1)
        for row in range(b):
            o = offset_of(ids, x[row])
            inside = [s - o for s in starts if o < s < o + t]
            cuts = [0] + inside + [t]
            pieces = [{"input_ids": x[row][a:z].tolist()} for a, z in zip(cuts, cuts[1:])]
            want = collator(pieces)
            np.testing.assert_array_equal(positions[row], want["position_ids"][0])
            width = len(cuts)
            np.testing.assert_array_equal(cu[row][:width], want["cu_seq_lens_q"])
            assert (cu[row][width:] == -1).all()
            checked += len(pieces)
    assert checked > 12


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=3, max_size=40),
    t=st.integers(1, 24),
    b=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_boundaries_equal_a_reference_and_the_sidecar_equals_eot(tmp_path_factory, lengths, t, b, seed):
    ids, starts = documents_ids(lengths, seed % 1000)
    if len(ids) < t + 1:
        return
    d = tmp_path_factory.mktemp("b")
    with_sidecar = write_shard(d / "a.bin", ids)
    write_sidecar(with_sidecar, starts, len(ids))
    bare = write_shard(d / "e.bin", ids)
    s1 = TokenStream([with_sidecar], t, b, PCG32(seed, 1))
    s2 = TokenStream([bare], t, b, PCG32(seed, 1), eot=EOT)
    for _ in range(3):
        got = s1.next_batch(boundaries=True)
        other = s2.next_batch(boundaries=True)
        for a, z in zip(got, other):
            np.testing.assert_array_equal(a, z)
        x, _, positions, cu = got
        for row in range(b):
            in_window = [i for i in range(t) if x[row][i] == EOT]
            want_p, want_c = reference(in_window, t)
            assert positions[row].tolist() == want_p
            assert cu[row].tolist() == want_c


def test_without_sidecar_or_eot_boundaries_are_a_value_error_naming_the_shard(tmp_path):
    shard = write_shard(tmp_path / "s.bin", list(range(1, 50)))
    stream = TokenStream([shard], 8, 2, PCG32(1, 1))
    with pytest.raises(ValueError, match=r"s\.bin: no document boundaries.*eot=ID"):
        stream.next_batch(boundaries=True)
    # The failed batch moved nothing: the next plain batch is the first one.
    fresh = TokenStream([shard], 8, 2, PCG32(1, 1))
    np.testing.assert_array_equal(stream.next_batch()[0], fresh.next_batch()[0])


def test_a_bad_sidecar_is_a_value_error_naming_it_and_its_rule(tmp_path):
    ids, starts = documents_ids([10, 10, 10])
    shard = write_shard(tmp_path / "s.bin", ids)
    write_sidecar(shard, [starts[1], starts[0]], len(ids))
    stream = TokenStream([shard], 8, 1, PCG32(1, 1), eot=EOT)
    with pytest.raises(ValueError, match=r"s\.docs: not a valid document sidecar: offsets must increase"):
        stream.next_batch(boundaries=True)
    side = write_sidecar(shard, starts, len(ids))
    side.write_bytes(side.read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"s\.docs.*truncated"):
        TokenStream([shard], 8, 1, PCG32(1, 1)).next_batch(boundaries=True)


def test_a_packed_corpus_gives_the_same_boundaries_from_its_sidecars_and_from_eot(tmp_path):
    lines = [f'{{"text": "document number {i} ' + "word " * (i % 7) + '"}' for i in range(60)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    tlio("-q", "tokens", "pack", "--from", "jsonl", "--tokenizer", "gpt2", str(corpus), "-o", str(tmp_path / "fw.bin"))
    assert (tmp_path / "fw.docs").exists()
    bare = tmp_path / "bare.bin"
    bare.write_bytes((tmp_path / "fw.bin").read_bytes())
    a = TokenStream([tmp_path / "fw.bin"], 16, 4, PCG32(5, 5))
    z = TokenStream([bare], 16, 4, PCG32(5, 5), eot=50256)
    for _ in range(5):
        for u, v in zip(a.next_batch(boundaries=True), z.next_batch(boundaries=True)):
            np.testing.assert_array_equal(u, v)
