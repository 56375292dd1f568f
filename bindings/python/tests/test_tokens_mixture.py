"""Mixtures of sources (scale.md section 8): TokenStream(sources=..., stages=...) against
a plain-Python reference (tokens.md's stream per source, each from the documented
generator of its index, interleaved by the greedy rule), bitwise resume across a stage
boundary, ranks tiling one process, pickling, and the refusals of bad weights, empty
sources, mixed vocabularies and a cursor of another mixture."""

from __future__ import annotations

import copy
import functools
import operator
import pickle
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlio.tokens import TokenStream
from _tokens_helpers import MASK64, RefPCG32, RefStream, write_shard

GOLDEN = 0x9E3779B97F4A7C15


def source_generator(rng: RefPCG32, j: int) -> RefPCG32:
    """docs/tokens.md's rule: source j draws from seed(state ^ (j+1)*GOLDEN, (inc>>1)+j+1)."""
    s = rng.state()
    k = j + 1
    return RefPCG32((s["state"] ^ (k * GOLDEN)) & MASK64, ((s["inc"] >> 1) + k) & MASK64)


def greedy(stages: Sequence[Tuple[int, Sequence[float]]], global_batch: int, count: int) -> List[int]:
    """scale.md's rule, written from its words: window g comes from the j maximising
    w_j * (k + 1) - n_j (k its index in the stage), ties to the lowest j."""
    out: List[int] = []
    stage, start, counts = -1, 0, []
    for g in range(count):
        if g % global_batch == 0:
            now = max(k for k, (b, _) in enumerate(stages) if b <= g // global_batch)
            if now != stage:
                stage, start = now, g
                counts = [0] * len(stages[now][1])
        # Normalised by their sum, as the stream does (plain left-to-right addition, not Python's compensated sum; one division).
        raw = stages[stage][1]
        total = functools.reduce(operator.add, raw)
        w = [x / total for x in raw]
        lags = [w[j] * (g - start + 1) - counts[j] for j in range(len(w))]
        j = lags.index(max(lags))
        counts[j] += 1
        out.append(j)
    return out


def make_sources(tmp: Path, lens: Sequence[Sequence[int]]) -> Tuple[List[List[Path]], List[List[np.ndarray]]]:
    paths, arrays = [], []
    for s, shards in enumerate(lens):
        ps, arrs = [], []
        for k, n in enumerate(shards):
            ids = np.arange(n, dtype=np.int64) + s * 10_000 + k * 1000
            ps.append(write_shard(tmp / f"src{s}_{k}.bin", ids.tolist(), vocab=40_000))
            arrs.append(ids)
        paths.append(ps)
        arrays.append(arrs)
    return paths, arrays


class RefMixture:
    def __init__(self, arrays, stages, seq_len, batch, rng, rank=0, world=1):
        self.streams = [RefStream(a, seq_len, 1, source_generator(rng, j)) for j, a in enumerate(arrays)]
        self.stages, self.B, self.W, self.rank = stages, batch, world, rank
        self.g = 0
        self.T = seq_len

    def next_batch(self):
        G = self.B * self.W
        order = greedy(self.stages, G, self.g + G)[self.g :]
        rows, sources = [], []
        for i, j in enumerate(order):
            w = self.streams[j].window()
            if self.rank * self.B <= i < (self.rank + 1) * self.B:
                rows.append(w)
                sources.append(j)
        self.g += G
        ws = np.stack(rows)
        return ws[:, :-1], ws[:, 1:], np.array(sources, dtype=np.int32)


weights3 = st.lists(st.integers(1, 20), min_size=1, max_size=4).map(
    lambda raw: [r / sum(raw) for r in raw]
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(weights=weights3, seed=st.integers(0, 2**32), batch=st.integers(1, 5), world=st.integers(1, 3),
       seq_len=st.integers(1, 6), boundary=st.integers(1, 4))
def test_a_mixture_is_the_reference(tmp_path, weights, seed, batch, world, seq_len, boundary):
    lens = [[20 + 7 * j, 9 + j][: 1 + j % 2] for j in range(len(weights))]
    paths, arrays = make_sources(tmp_path, lens)
    later = list(reversed(weights))
    stages = [(0, weights), (boundary, later)]
    for rank in range(world):
        ts = TokenStream(sources=paths, stages=stages,
                         seq_len=seq_len, batch=batch, rng=RefPCG32(seed), rank=rank, world_size=world)
        ref = RefMixture(arrays, stages, seq_len, batch, RefPCG32(seed), rank, world)
        for _ in range(8):
            x, y, s = ts.next_batch_sources()
            rx, ry, rs = ref.next_batch()
            np.testing.assert_array_equal(x, rx)
            np.testing.assert_array_equal(y, ry)
            np.testing.assert_array_equal(s, rs)


def three(tmp: Path) -> List[Tuple[str, float]]:
    paths, _ = make_sources(tmp, [[23, 9, 40], [17], [12, 31]])
    # A '*' pattern, a list, and one path: every form a source takes.
    return [(str(tmp / "src0_*.bin"), 0.6), ([str(p) for p in paths[1]], 0.3), (str(paths[2][0]), 0.1)]


def test_resume_is_bitwise_at_every_batch_across_a_stage_boundary(tmp_path):
    srcs = three(tmp_path)
    stages = [(0, [0.6, 0.3, 0.1]), (4, [0.2, 0.2, 0.6])]
    for shuffle in (False, True):
        mk = lambda: TokenStream(sources=srcs, stages=stages, seq_len=3, batch=4,
                                 rng=RefPCG32(9), shuffle=shuffle)
        one = mk()
        all_ = [one.next_batch() for _ in range(10)]
        for k in range(10):
            a = mk()
            for _ in range(k):
                a.next_batch()
            b = mk()
            b.load_state_dict(a.state_dict())
            for want in all_[k:]:
                got = b.next_batch()
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])


def test_ranks_tile_one_process_and_resume_elastically(tmp_path):
    srcs = three(tmp_path)
    single = TokenStream(sources=srcs, seq_len=3, batch=6, rng=RefPCG32(4))
    want = [single.next_batch()[0] for _ in range(9)]
    cursor = None
    for phase, world in enumerate([2, 3, 1]):
        ranks = [TokenStream(sources=srcs, seq_len=3, batch=6 // world, rng=RefPCG32(4),
                             rank=r, world_size=world) for r in range(world)]
        if cursor is not None:
            for s in ranks:
                s.restore(cursor)
        for step in range(3):
            got = np.concatenate([s.next_batch()[0] for s in ranks])
            np.testing.assert_array_equal(got, want[phase * 3 + step])
        cursor = ranks[0].cursor()
        assert all(s.cursor() == cursor for s in ranks)


def test_pickle_and_copy_continue_bitwise(tmp_path):
    srcs = three(tmp_path)
    s = TokenStream(sources=[p for p, _ in srcs], stages=[(0, [0.5, 0.25, 0.25]), (2, [0.25, 0.25, 0.5])],
                    seq_len=4, batch=3, rng=RefPCG32(2), shuffle=True)
    s.next_batch()
    for how in (lambda x: pickle.loads(pickle.dumps(x)), copy.deepcopy):
        c = how(s)
        assert c.is_mixture and c.stages == s.stages
        for _ in range(4):
            np.testing.assert_array_equal(c.next_batch()[0], s.next_batch()[0])
        s = c


@pytest.mark.parametrize(
    "weights, needle",
    [
        ([0.7, -0.3, 0.6], "finite number above 0"),
        ([0.0, 0.5, 0.5], "finite number above 0"),
        ([float("nan"), 0.5, 0.5], "finite number above 0"),
        ([0.5, 0.3, 0.1], "sum to"),
    ],
)
def test_bad_weights_are_value_errors(tmp_path, weights, needle):
    srcs = [(p, w) for (p, _), w in zip(three(tmp_path), weights)]
    with pytest.raises(ValueError, match=needle):
        TokenStream(sources=srcs, seq_len=3, batch=2, rng=RefPCG32(1))


def test_bad_sources_are_refused(tmp_path):
    srcs = three(tmp_path)
    with pytest.raises(ValueError, match="matches no file"):
        TokenStream(sources=[(str(tmp_path / "none_*.bin"), 0.5), srcs[1][:1] + (0.5,)],
                    seq_len=3, batch=2, rng=RefPCG32(1))
    with pytest.raises(ValueError, match="no shards"):
        TokenStream(sources=[([], 0.5), (srcs[1][0], 0.5)], seq_len=3, batch=2, rng=RefPCG32(1))
    other = write_shard(tmp_path / "v.bin", list(range(40)), vocab=50_000)
    with pytest.raises(ValueError, match="different vocabularies"):
        TokenStream(sources=[(srcs[0][0], 0.5), (str(other), 0.5)], seq_len=3, batch=2, rng=RefPCG32(1))
    with pytest.raises(TypeError, match="weight of source 1"):
        TokenStream(sources=[(srcs[0][0], 0.5), (srcs[1][0], "0.5")], seq_len=3, batch=2, rng=RefPCG32(1))
    with pytest.raises(ValueError, match="not both"):
        TokenStream([srcs[2][0]], 3, 2, RefPCG32(1), sources=srcs)
    with pytest.raises(ValueError, match="differ from the first stage"):
        TokenStream(sources=srcs, stages=[(0, [0.2, 0.2, 0.6])], seq_len=3, batch=2, rng=RefPCG32(1))


def test_a_cursor_of_another_mixture_is_refused_unless_allowed(tmp_path):
    srcs = three(tmp_path)
    a = TokenStream(sources=srcs, seq_len=3, batch=4, rng=RefPCG32(3))
    for _ in range(3):
        a.next_batch()
    cursor = a.cursor()
    other = [(p, w) for (p, _), w in zip(srcs, [0.2, 0.3, 0.5])]
    b = TokenStream(sources=other, seq_len=3, batch=4, rng=RefPCG32(3))
    before = b.cursor()
    with pytest.raises(ValueError, match=r"\[0.6, 0.3, 0.1\] from batch 0.*\[0.2, 0.3, 0.5\]"):
        b.restore(cursor)
    assert b.cursor() == before
    single = TokenStream([srcs[2][0]], 3, 4, RefPCG32(3))
    with pytest.raises(ValueError):
        single.restore(cursor)
    with pytest.raises(ValueError):
        b.restore(single.cursor())
    c = TokenStream(sources=other, seq_len=3, batch=4, rng=RefPCG32(3), allow_new_mixture=True)
    c.restore(cursor)
    got = c.cursor()
    assert got["window"] == cursor["window"] and got["counts"] == [0, 0, 0]
    assert [s["cursor"] for s in got["sources"]] == [s["cursor"] for s in cursor["sources"]]
    _, _, s = c.next_batch_sources()
    assert list(s) == greedy([(0, [0.2, 0.3, 0.5])], 4, 4)
