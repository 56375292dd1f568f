"""tlio.tokens against tokens.md and the chapter's section-4 table (test_hand_example_token_windows
... test_restore_rejects_bad_cursor), a plain-Python reference stream, and the CLI's
`tokens windows`."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlio.tokens import TokenStream, open_tokens, read_tokens_header
from _tokens_helpers import (
    LLAMA3_MAGIC,
    MAGIC,
    RefPCG32,
    RefStream,
    cli_windows,
    header_bytes,
    seed_drawing,
    write_shard,
)


def test_hand_example_token_windows(tmp_path):
    # The spec's generator: seed(42, 54) draws 0, 0, 2, 1, 1, 1, 2, 0, 0, 2 from below(3).
    r = RefPCG32(42)
    assert r.state() == {"state": 0x185706B82C2E03F8, "inc": 0x6D}
    assert [r.below(3) for _ in range(10)] == [0, 0, 2, 1, 1, 1, 2, 0, 0, 2]

    shard = write_shard(tmp_path / "hand.bin", range(10, 20))
    seed = seed_drawing([1, 0], 3)
    rng = RefPCG32(seed)
    s = TokenStream([shard], 3, 2, rng)
    x, y = s.next_batch()
    assert x.tolist() == [[11, 12, 13], [14, 15, 16]]
    assert y.tolist() == [[12, 13, 14], [15, 16, 17]]
    # The next window would start at 7 and need id 10: pass 2 starts at phase 0.
    x, y = s.next_batch()
    assert x.tolist() == [[10, 11, 12], [13, 14, 15]]
    assert y.tolist() == [[11, 12, 13], [14, 15, 16]]
    # The cursor names the NEXT window, offset 6, and the generator after two draws.
    after = RefPCG32(seed)
    after.below(3), after.below(3)
    st_ = after.state()
    assert s.cursor() == {
        "shard": 0,
        "offset": 6,
        "rng": {"state": f"{st_['state']:016x}", "inc": f"{st_['inc']:016x}"},
    }
    # The stream copied the generator: drawing from it changes nothing.
    rng.below(3)
    assert s.cursor()["rng"]["state"] == f"{st_['state']:016x}"
    # The CLI reads the same windows and prints the same cursor (its --seed S is seed(S, 54)).
    cli = cli_windows([shard], 3, 2, seed, 2)
    assert [b["inputs"] for b in cli] == [[[11, 12, 13], [14, 15, 16]], [[10, 11, 12], [13, 14, 15]]]
    assert cli[-1]["cursor"] == s.cursor()


def test_header_worked_example(tmp_path):
    expected = (
        bytes.fromhex("88d83401" "01000000" "03000000" "00010000")
        + bytes(1008)
        + bytes.fromhex("010002000300")
    )
    assert len(expected) == 1030
    path = write_shard(tmp_path / "ex.bin", [1, 2, 3], vocab=256)
    assert path.read_bytes() == expected
    assert read_tokens_header(path) == {"magic": 20240520, "version": 1, "n": 3, "vocab_size": 256}
    ids = open_tokens(path)
    assert ids.dtype == np.dtype("<u2") and ids.tolist() == [1, 2, 3]
    # A path-like works as well as a string.
    assert read_tokens_header(str(path))["n"] == 3


def test_version_2_reads_uint32(tmp_path):
    ids = [0, 65535, 65536, 100000, 128255]
    v2 = write_shard(tmp_path / "v2.bin", ids, vocab=128256, version=2)
    assert read_tokens_header(v2) == {"magic": MAGIC, "version": 2, "n": 5, "vocab_size": 128256}
    a = open_tokens(v2)
    assert a.dtype == np.dtype("<u4") and a.tolist() == ids
    # llm.c's Llama-3 layout: magic 20240801, version 7, uint32 ids.
    l3 = write_shard(tmp_path / "l3.bin", ids, vocab=128256, version=7, magic=LLAMA3_MAGIC)
    assert read_tokens_header(l3)["magic"] == LLAMA3_MAGIC
    assert open_tokens(l3).tolist() == ids
    # Read as uint16, these ids would be wrong: the stream gets them whole.
    s = TokenStream([v2], 2, 1, RefPCG32(0))
    x, y = s.next_batch()
    assert set(x.ravel().tolist()) | set(y.ravel().tolist()) <= set(ids)
    assert max(x.max(), y.max()) > 65535


def test_open_tokens_maps_the_file(tmp_path):
    n = 1_000_003
    ids = (np.arange(n, dtype=np.int64) * 7919 % 50257).astype("<u2")
    path = tmp_path / "big.bin"
    path.write_bytes(header_bytes(n, 50257) + ids.tobytes())
    a = open_tokens(path)
    assert isinstance(a, np.memmap)
    assert isinstance(a.base, mmap.mmap)
    assert not a.flags.writeable
    assert a.shape == (n,) and a.dtype == np.dtype("<u2")
    assert np.array_equal(a, ids)
    with pytest.raises(ValueError):
        a[0] = 1
    # The map is the file itself: no copy of the ids was made.
    assert a.offset == 1024
    assert not np.shares_memory(a, ids)


def _bad_files(tmp_path):
    good = header_bytes(3, 256) + np.array([1, 2, 3], "<u2").tobytes()
    cases = {
        "magic": (header_bytes(3, 256, magic=12345) + good[1024:], "bad magic"),
        "version": (header_bytes(3, 256, version=3) + good[1024:], "version"),
        "size": (good + b"\x00", "size"),
        "short": (good[:1000], "short"),
        "truncated ids": (good[:-2], "size"),
        "reserved": (good[:16] + b"\x01" + good[17:], "reserved"),
        "negative count": (header_bytes(-1, 256) + good[1024:], "negative"),
    }
    out = {}
    for name, (data, rule) in cases.items():
        p = tmp_path / (name.replace(" ", "_") + ".bin")
        p.write_bytes(data)
        out[name] = (p, rule)
    return out


def test_rejects_bad_files(tmp_path):
    for name, (path, rule) in _bad_files(tmp_path).items():
        for call in (read_tokens_header, open_tokens):
            with pytest.raises(ValueError) as e:
                call(path)
            msg = str(e.value)
            assert str(path) in msg and rule in msg.lower(), (name, msg)
    # An id at or above the vocabulary: found by open_tokens (read_tokens_header reads no id).
    oov = write_shard(tmp_path / "oov.bin", [1, 256, 3], vocab=256)
    assert read_tokens_header(oov)["n"] == 3
    with pytest.raises(ValueError, match=r"oov\.bin.*256"):
        open_tokens(oov)
    # A shard recording no vocabulary is checked against the one given.
    llmc = write_shard(tmp_path / "llmc.bin", [1, 300, 3], vocab=0)
    assert open_tokens(llmc).tolist() == [1, 300, 3]
    with pytest.raises(ValueError, match="llmc.bin"):
        open_tokens(llmc, vocab_size=256)
    # A given vocabulary must equal the recorded one.
    good = write_shard(tmp_path / "good.bin", [1, 2, 3], vocab=256)
    with pytest.raises(ValueError, match="good.bin"):
        open_tokens(good, vocab_size=512)
    with pytest.raises(FileNotFoundError):
        open_tokens(tmp_path / "missing.bin")
    with pytest.raises(FileNotFoundError):
        read_tokens_header(tmp_path / "missing.bin")
    # The CLI refuses each of them too.
    from _tokens_helpers import tlio

    for name, (path, _) in _bad_files(tmp_path).items():
        assert tlio("tokens", "header", str(path), check=False).returncode == 1, name


def _shards(tmp_path, lengths, vocab=1000, seed=0):
    rng = np.random.default_rng(seed)
    arrays, paths = [], []
    for i, n in enumerate(lengths):
        ids = rng.integers(0, vocab, n).astype(np.int64)
        arrays.append(ids)
        paths.append(write_shard(tmp_path / f"s{i}.bin", ids.tolist(), vocab=vocab))
    return arrays, paths


stream_configs = st.tuples(
    st.lists(st.integers(2, 60), min_size=1, max_size=4),  # shard lengths
    st.integers(1, 12),  # T
    st.integers(1, 5),  # B
    st.integers(0, 2**64 - 1),  # seed
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream_configs, st.integers(1, 12))
def test_windows_tile_each_pass(tmp_path_factory, config, batches):
    lengths, T, B, seed = config
    lengths = [max(n, T + 1) for n in lengths]
    arrays, paths = _shards(tmp_path_factory.mktemp("tile"), lengths)
    s = TokenStream(paths, T, B, RefPCG32(seed))
    ref = RefStream(arrays, T, B, RefPCG32(seed))
    for _ in range(batches):
        x, y = s.next_batch()
        rx, ry = ref.next_batch()
        assert np.array_equal(x, rx) and np.array_equal(y, ry)
    assert s.cursor() == ref.cursor()
    # Windows T apart within a pass; a pass ends exactly where the next window would not
    # fit; the next pass is on the next shard (wrapping) at a phase below min(T, n - T).
    ws = ref.windows
    for (s0, o0), (s1, o1) in zip(ws, ws[1:]):
        n = lengths[s0]
        if (s1, o1) == (s0, o0 + T):
            assert o1 + T + 1 <= lengths[s1]
        else:
            assert o0 + T + T + 1 > n, "a pass ended while a window still fitted"
            assert s1 == (s0 + 1) % len(lengths)
            assert 0 <= o1 < max(1, min(T, lengths[s1] - T))
    for shard, o in ws:
        assert o + T + 1 <= lengths[shard]


def test_cursor_restore_is_bitwise(tmp_path):
    arrays, paths = _shards(tmp_path, [50, 37, 81])
    one = TokenStream(paths, 5, 3, RefPCG32(7))
    whole = [one.next_batch() for _ in range(16)]
    a = TokenStream(paths, 5, 3, RefPCG32(7))
    for _ in range(7):
        a.next_batch()
    cursor = a.cursor()
    # A fresh stream from another seed, restored: the next 9 batches are the same bits.
    b = TokenStream(paths, 5, 3, RefPCG32(12345))
    b.restore(json.loads(json.dumps(cursor)))
    assert b.cursor() == cursor
    for i in range(9):
        x, y = b.next_batch()
        assert np.array_equal(x, whole[7 + i][0]) and np.array_equal(y, whole[7 + i][1])
    # state_dict / load_state_dict are the cursor, for torch's Stateful.
    c = TokenStream(paths, 5, 3, RefPCG32(99))
    c.load_state_dict(a.state_dict())
    assert np.array_equal(next(iter(c))[0], whole[7][0])
    # Without the generator the next pass would draw another phase: the cursor has it.
    assert set(cursor) == {"shard", "offset", "rng"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream_configs, st.integers(0, 15), st.integers(1, 10))
def test_restore_at_any_point_continues_bitwise(tmp_path_factory, config, n, m):
    lengths, T, B, seed = config
    lengths = [max(k, T + 1) for k in lengths]
    _, paths = _shards(tmp_path_factory.mktemp("restore"), lengths)
    one = TokenStream(paths, T, B, RefPCG32(seed))
    whole = [one.next_batch() for _ in range(n + m)]
    a = TokenStream(paths, T, B, RefPCG32(seed))
    for _ in range(n):
        a.next_batch()
    b = TokenStream(paths, T, B, RefPCG32(seed ^ 1))
    b.restore(a.cursor())
    for i in range(m):
        x, y = b.next_batch()
        assert np.array_equal(x, whole[n + i][0]) and np.array_equal(y, whole[n + i][1])
    assert b.cursor() == one.cursor()


def test_targets_are_inputs_shifted(tmp_path):
    _, paths = _shards(tmp_path, [40, 23])
    s = TokenStream(paths, 6, 4, RefPCG32(3))
    prev = None
    for _ in range(10):
        x, y = s.next_batch()
        assert x.dtype == np.int64 and y.dtype == np.int64
        assert x.shape == (4, 6) and y.shape == (4, 6)
        assert np.array_equal(y[:, :-1], x[:, 1:])
        assert x.flags.writeable and x.flags.c_contiguous and y.flags.c_contiguous
        assert not np.shares_memory(x, y)
        if prev is not None:
            assert not np.shares_memory(x, prev[0]) and not np.shares_memory(y, prev[1])
            # Changing a batch changes nothing else.
            keep = prev[0].copy()
            x[:] = -1
            assert np.array_equal(prev[0], keep)
        prev = (x, y)


def test_stream_rejects_bad_args(tmp_path):
    shard = write_shard(tmp_path / "a.bin", range(10, 20), vocab=256)
    rng = RefPCG32(0)
    with pytest.raises(ValueError, match="shard"):
        TokenStream([], 3, 2, rng)
    with pytest.raises(ValueError, match="list of paths"):
        TokenStream(str(shard), 3, 2, rng)
    with pytest.raises(ValueError, match="seq_len"):
        TokenStream([shard], 0, 2, rng)
    with pytest.raises(ValueError, match="batch"):
        TokenStream([shard], 3, 0, rng)
    with pytest.raises(ValueError, match="seq_len"):
        TokenStream([shard], -1, 2, rng)
    # T + 1 ids are needed: 10 ids hold one window of T = 9, none of T = 10.
    with pytest.raises(ValueError, match="a.bin"):
        TokenStream([shard], 10, 1, rng)
    one = TokenStream([shard], 9, 3, rng)
    x, _ = one.next_batch()
    assert x.tolist() == [list(range(10, 19))] * 3  # the one window, every pass at phase 0
    # A vocabulary that disagrees with the recorded one, naming the shard.
    with pytest.raises(ValueError, match="a.bin"):
        TokenStream([shard], 3, 2, rng, vocab_size=512)
    TokenStream([shard], 3, 2, rng, vocab_size=256)
    # Shards recording different vocabularies are never mixed.
    other = write_shard(tmp_path / "b.bin", range(10, 20), vocab=512)
    with pytest.raises(ValueError, match="b.bin"):
        TokenStream([shard, other], 3, 2, rng)
    with pytest.raises(FileNotFoundError):
        TokenStream([tmp_path / "missing.bin"], 3, 2, rng)
    # An even increment, or something that is not a generator.
    with pytest.raises(ValueError, match="even"):
        TokenStream([shard], 3, 2, {"state": 1, "inc": 2})
    with pytest.raises(TypeError):
        TokenStream([shard], 3, 2, 42)


def test_restore_rejects_bad_cursor(tmp_path):
    a = write_shard(tmp_path / "a.bin", range(10, 20))
    b = write_shard(tmp_path / "b.bin", range(100, 130))
    s = TokenStream([a, b], 3, 2, RefPCG32(5))
    s.next_batch()
    good = s.cursor()
    bad = [
        ({**good, "shard": 2}, "shard"),
        ({**good, "offset": 11}, "offset"),
        ({**good, "offset": -1}, "offset"),
        ({**good, "rng": {**good["rng"], "inc": "000000000000006c"}}, "even"),
        ({**good, "rng": {**good["rng"], "state": "ABC"}}, "hex"),
        ({**good, "extra": 1}, "extra"),
        ({k: v for k, v in good.items() if k != "rng"}, "rng"),
        ({**good, "offset": 1.5}, "offset"),
        ("not a dict", "dict"),
    ]
    for cursor, word in bad:
        with pytest.raises(ValueError, match=word):
            s.restore(cursor)
        assert s.cursor() == good, "a refused cursor changed the stream"
    # An offset at the shard's end is valid: no window fits, so the next read starts a
    # new pass on the next shard.
    s.restore({**good, "shard": 0, "offset": 10})
    x, _ = s.next_batch()
    assert 100 <= x.min() and x.max() < 130


def test_windows_match_the_cli_and_its_cursor(tmp_path):
    _, paths = _shards(tmp_path, [40, 29, 55], vocab=300)
    cli = cli_windows(paths, 4, 3, 11, 6)
    s = TokenStream(paths, 4, 3, RefPCG32(11))
    for line in cli:
        x, y = s.next_batch()
        assert x.tolist() == line["inputs"] and y.tolist() == line["targets"]
        assert s.cursor() == line["cursor"]
    # A cursor saved by Python resumes the CLI, and the CLI's resumes Python.
    cpath = tmp_path / "cursor.json"
    cpath.write_text(json.dumps(s.cursor()))
    resumed = cli_windows(paths, 4, 3, 0, 2, cursor=cpath)
    for line in resumed:
        x, _ = s.next_batch()
        assert x.tolist() == line["inputs"]
    t = TokenStream(paths, 4, 3, RefPCG32(0))
    t.restore(resumed[-1]["cursor"])
    assert t.cursor() == s.cursor()



# Ranks (python.md "Ranks"): the union of the ranks' batches is the single-process stream
# with the global batch; the cursor is global; elastic restore keeps the global batch.


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream_configs, st.integers(1, 4), st.integers(1, 6))
def test_rank_union_is_the_single_process_stream(tmp_path_factory, config, world, batches):
    lengths, T, B, seed = config
    lengths = [max(n, T + 1) for n in lengths]
    _, paths = _shards(tmp_path_factory.mktemp("ranks"), lengths)
    single = TokenStream(paths, T, B * world, RefPCG32(seed))
    ranks = [TokenStream(paths, T, B, RefPCG32(seed), rank=r, world_size=world) for r in range(world)]
    for _ in range(batches):
        gx, gy = single.next_batch()
        parts = [s.next_batch() for s in ranks]
        assert np.array_equal(np.concatenate([p[0] for p in parts]), gx)
        assert np.array_equal(np.concatenate([p[1] for p in parts]), gy)
        assert all(p[0].shape == (B, T) for p in parts)
    cursors = [s.cursor() for s in ranks]
    assert all(c == cursors[0] for c in cursors), "the cursor is global"
    expected = single.cursor()
    if world > 1:
        expected["global_batch"] = B * world
    assert cursors[0] == expected
    assert all((s.rank, s.world_size, s.global_batch) == (r, world, B * world) for r, s in enumerate(ranks))


def test_elastic_restore_keeps_the_global_batch(tmp_path):
    _, paths = _shards(tmp_path, [300, 170], vocab=500)
    single = TokenStream(paths, 4, 32, RefPCG32(8))
    whole = [single.next_batch()[0] for _ in range(6)]
    # 2 ranks of 16 for three global batches, then 4 ranks of 8 continue from the cursor.
    two = [TokenStream(paths, 4, 16, RefPCG32(8), rank=r, world_size=2) for r in range(2)]
    for i in range(3):
        assert np.array_equal(np.concatenate([s.next_batch()[0] for s in two]), whole[i])
    cursor = two[0].cursor()
    assert cursor["global_batch"] == 32
    four = [TokenStream(paths, 4, 8, RefPCG32(0), rank=r, world_size=4) for r in range(4)]
    for s in four:
        s.restore(cursor)
    for i in range(3, 6):
        assert np.array_equal(np.concatenate([s.next_batch()[0] for s in four]), whole[i])
    # Another global batch is refused, naming both numbers; the stream is unchanged.
    other = TokenStream(paths, 4, 8, RefPCG32(0), rank=0, world_size=2)
    before = other.cursor()
    with pytest.raises(ValueError, match=r"32.*16|16.*32"):
        other.restore(cursor)
    assert other.cursor() == before
    # A cursor without the key (the CLI's, a single process's) restores into any stream.
    plain = {k: v for k, v in cursor.items() if k != "global_batch"}
    other.restore(plain)
    assert {k: v for k, v in other.cursor().items() if k != "global_batch"} == plain
    single2 = TokenStream(paths, 4, 32, RefPCG32(0))
    single2.restore(plain)
    assert np.array_equal(single2.next_batch()[0], whole[3])
    # A single-process stream takes a global_batch equal to its batch.
    single2.restore({**plain, "global_batch": 32})
    with pytest.raises(ValueError, match="nonzero"):
        single2.restore({**plain, "global_batch": 0})


def test_ranks_come_from_torch_distributed_when_initialized(tmp_path, monkeypatch):
    import sys
    import types

    shard = write_shard(tmp_path / "a.bin", range(100))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    s = TokenStream([shard], 3, 2, RefPCG32(0), rank=None, world_size=None)
    assert (s.rank, s.world_size) == (0, 1)
    assert "torch" not in sys.modules, "tlio must never import torch"

    class Dist:
        initialized = False

        def is_available(self):
            return True

        def is_initialized(self):
            return self.initialized

        def get_rank(self):
            return 2

        def get_world_size(self):
            return 3

    dist = Dist()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(distributed=dist))
    s = TokenStream([shard], 3, 2, RefPCG32(0), rank=None, world_size=None)
    assert (s.rank, s.world_size) == (0, 1), "an uninitialized group is one process"
    dist.initialized = True
    s = TokenStream([shard], 3, 2, RefPCG32(0), rank=None, world_size=None)
    assert (s.rank, s.world_size, s.global_batch) == (2, 3, 6)
    # Given values win; the defaults are 0 and 1 whatever torch says.
    assert TokenStream([shard], 3, 2, RefPCG32(0), rank=1, world_size=None).rank == 1
    assert TokenStream([shard], 3, 2, RefPCG32(0)).world_size == 1


def test_stream_rejects_bad_ranks(tmp_path):
    shard = write_shard(tmp_path / "a.bin", range(100))
    for rank, world, word in [(2, 2, "rank"), (0, 0, "world_size"), (-1, 2, "rank"), (0, -3, "world_size")]:
        with pytest.raises(ValueError, match=word):
            TokenStream([shard], 3, 2, RefPCG32(0), rank=rank, world_size=world)


def test_rank_windows_match_the_cli(tmp_path):
    from _tokens_helpers import tlio

    _, paths = _shards(tmp_path, [90, 61], vocab=300)
    for world in (1, 3):
        for rank in range(world):
            out = tlio("tokens", "windows", *map(str, paths), "--seq-len", "5", "--batch", "2",
                       "--seed", "4", "--batches", "4", "--rank", str(rank), "--world-size", str(world))
            lines = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
            s = TokenStream(paths, 5, 2, RefPCG32(4), rank=rank, world_size=world)
            for line in lines:
                x, y = s.next_batch()
                assert x.tolist() == line["inputs"] and y.tolist() == line["targets"]
                assert s.cursor() == line["cursor"]


# Pickling and copying (python.md `TokenStream`): the construction's arguments and the
# cursor travel, never a token; the shards are re-opened and re-checked by core.


def _next(s, n):
    return [s.next_batch() for _ in range(n)]


def _same(got, want):
    return len(got) == len(want) and all(
        np.array_equal(gx, wx) and np.array_equal(gy, wy) for (gx, gy), (wx, wy) in zip(got, want)
    )


def test_pickle_mid_stream_continues_bitwise(tmp_path, monkeypatch):
    import pickle

    arrays, paths = _shards(tmp_path, [500, 373, 811])
    monkeypatch.chdir(tmp_path)
    relative = [p.name for p in paths]  # resolved against this cwd at construction
    whole = _next(TokenStream(paths, 5, 3, RefPCG32(7), vocab_size=1000), 40)
    s = TokenStream(relative, 5, 3, RefPCG32(7), vocab_size=1000)
    _next(s, 17)
    before = s.cursor()
    blobs = [pickle.dumps(s, protocol=p) for p in range(2, pickle.HIGHEST_PROTOCOL + 1)]
    assert s.cursor() == before, "pickling moved the stream"
    # No token data in the pickle: it is far smaller than the shards, and holds no run
    # of their ids.
    needle = arrays[1][100:116].astype("<u2").tobytes()
    for blob in blobs:
        assert len(blob) < 1024 and needle not in blob
    # Unpickled from another working directory: the shards were recorded absolute.
    monkeypatch.chdir(tmp_path.parent)
    copies = [pickle.loads(b) for b in blobs]
    for c in copies:
        assert type(c) is TokenStream and c.cursor() == before
        assert (c.seq_len, c.batch, c.rank, c.world_size) == (5, 3, 0, 1)
        assert c.shards == [str(p.resolve()) for p in paths]
    # Every copy and the original continue with the same bits, without affecting each
    # other (each is read to the end before the next one starts).
    for c in copies:
        assert _same(_next(c, 23), whole[17:])
    assert s.cursor() == before
    assert _same(_next(s, 23), whole[17:])


def test_unpickling_reopens_and_rechecks_the_shards(tmp_path):
    import pickle

    _, paths = _shards(tmp_path, [200, 90], vocab=300)
    s = TokenStream(paths, 4, 2, RefPCG32(1), vocab_size=300)
    _next(s, 30)
    cursor = s.cursor()
    blob = pickle.dumps(s)
    assert cursor["shard"] == 1 and cursor["offset"] > 20
    # A shard rewritten since with an id outside the vocabulary: core refuses it.
    write_shard(paths[0], [299] * 199 + [300])
    with pytest.raises(ValueError, match="s0.bin"):
        pickle.loads(blob)
    # A shard shorter than the cursor's offset: the restore refuses the cursor.
    write_shard(paths[0], [1] * 200, vocab=300)
    write_shard(paths[1], [1] * 20, vocab=300)
    with pytest.raises(ValueError, match="offset"):
        pickle.loads(blob)
    paths[1].unlink()
    with pytest.raises(FileNotFoundError):
        pickle.loads(blob)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream_configs, st.integers(1, 3), st.data(), st.integers(0, 15), st.integers(1, 10))
def test_pickle_at_any_point_continues_bitwise(tmp_path_factory, config, world, data, n, m):
    import pickle

    lengths, T, B, seed = config
    lengths = [max(k, T + 1) for k in lengths]
    rank = data.draw(st.integers(0, world - 1), label="rank")
    _, paths = _shards(tmp_path_factory.mktemp("pickle"), lengths)
    one = TokenStream(paths, T, B, RefPCG32(seed), rank=rank, world_size=world)
    whole = _next(one, n + m)
    a = TokenStream(paths, T, B, RefPCG32(seed), rank=rank, world_size=world)
    _next(a, n)
    b = pickle.loads(pickle.dumps(a))
    assert b.cursor() == a.cursor()
    assert _same(_next(b, m), whole[n:])
    assert b.cursor() == one.cursor()
    assert _same(_next(a, m), whole[n:]), "the original moved with its copy"


def test_copy_and_deepcopy_are_independent_streams(tmp_path):
    import copy

    _, paths = _shards(tmp_path, [120, 77])
    whole = _next(TokenStream(paths, 6, 2, RefPCG32(21)), 30)
    s = TokenStream(paths, 6, 2, RefPCG32(21))
    _next(s, 8)
    shallow, deep = copy.copy(s), copy.deepcopy(s)
    assert shallow.cursor() == deep.cursor() == s.cursor()
    # Reading one moves only that one.
    assert _same(_next(shallow, 22), whole[8:])
    assert deep.cursor() == s.cursor()
    assert _same(_next(deep, 22), whole[8:])
    assert _same(_next(s, 22), whole[8:])

    # A subclass keeps its class and its own attributes (shallow: shared; deep: copied).
    class Tagged(TokenStream):
        pass

    t = Tagged(paths, 6, 2, RefPCG32(21))
    t.tags = ["a"]
    _next(t, 3)
    tc, td = copy.copy(t), copy.deepcopy(t)
    assert type(tc) is type(td) is Tagged
    assert tc.tags is t.tags and td.tags == t.tags and td.tags is not t.tags
    assert _same(_next(td, 4), whole[3:7])


def test_pickle_keeps_rank_and_world_size(tmp_path, monkeypatch):
    import pickle
    import sys
    import types

    _, paths = _shards(tmp_path, [300, 170], vocab=500)
    single = TokenStream(paths, 4, 6, RefPCG32(8))
    whole = [single.next_batch()[0] for _ in range(8)]
    s = TokenStream(paths, 4, 2, RefPCG32(8), rank=1, world_size=3)
    _next(s, 3)
    c = pickle.loads(pickle.dumps(s))
    assert (c.rank, c.world_size, c.global_batch) == (1, 3, 6)
    assert c.cursor() == s.cursor() and c.cursor()["global_batch"] == 6
    for i in range(3, 8):
        assert np.array_equal(c.next_batch()[0], whole[i][2:4]), "rank 1's slice"

    # Rank and world size taken from torch.distributed are pickled as resolved numbers:
    # a process without the group (a spawned worker) unpickles rank 2 of 3.
    class Dist:
        def is_available(self):
            return True

        def is_initialized(self):
            return True

        def get_rank(self):
            return 2

        def get_world_size(self):
            return 3

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(distributed=Dist()))
    g = TokenStream(paths, 4, 2, RefPCG32(8), rank=None, world_size=None)
    blob = pickle.dumps(g)
    monkeypatch.delitem(sys.modules, "torch")
    u = pickle.loads(blob)
    assert (u.rank, u.world_size) == (2, 3)
    assert np.array_equal(u.next_batch()[0], whole[0][4:6])
