"""Shuffled shard order (scale.md section 5): TokenStream(shuffle=True) against a
plain-Python reference stream, cursor resumption, ranks tiling the single-process stream,
`tlio tokens windows --shuffle` giving the same batches, and tlio.torch checkpoints (and
the torch example's --shuffle) resuming a shuffled stream bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Dict, List, Tuple

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlio.tokens import TokenStream
from _tokens_helpers import ROOT, RefPCG32, tlio, write_shard


class RefShuffled:
    """The shuffled stream in plain Python: at each epoch's start a Fisher-Yates order
    of the shards from the generator, then each pass as tokens.md's."""

    def __init__(self, shards: List[np.ndarray], seq_len: int, batch: int, rng: RefPCG32) -> None:
        self.shards, self.T, self.B, self.rng = shards, seq_len, batch, rng.copy()
        self._epoch()
        self.offset = self._phase()

    def _epoch(self) -> None:
        order = list(range(len(self.shards)))
        for i in range(len(order) - 1, 0, -1):
            j = self.rng.below(i + 1)
            order[i], order[j] = order[j], order[i]
        self.order, self.pos = order, 0

    def _phase(self) -> int:
        n = len(self.shards[self.order[self.pos]])
        return self.rng.below(max(1, min(self.T, n - self.T)))

    def window(self) -> np.ndarray:
        shard = self.shards[self.order[self.pos]]
        if self.offset + self.T + 1 > len(shard):
            self.pos += 1
            if self.pos == len(self.shards):
                self._epoch()
            self.offset = self._phase()
            shard = self.shards[self.order[self.pos]]
        w = shard[self.offset : self.offset + self.T + 1].astype(np.int64)
        self.offset += self.T
        return w

    def next_batch(self) -> Tuple[np.ndarray, np.ndarray]:
        ws = np.stack([self.window() for _ in range(self.B)])
        return ws[:, :-1], ws[:, 1:]


def _shards(tmp_path, lens: List[int]):
    ids = [np.arange(k * 1000, k * 1000 + n) % 60000 for k, n in enumerate(lens)]
    paths = [write_shard(tmp_path / f"s{k}.bin", a, vocab=60000) for k, a in enumerate(ids)]
    return paths, ids


configs = st.integers(1, 5).flatmap(
    lambda t: st.tuples(
        st.lists(st.integers(t + 1, t + 30), min_size=1, max_size=5),
        st.just(t),
        st.integers(1, 4),
        st.integers(0, 2**64 - 1),
    )
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs, n=st.integers(0, 10), m=st.integers(1, 10))
def test_shuffled_stream_matches_the_reference_and_resumes_bit_for_bit(tmp_path, cfg, n, m):
    lens, t, b, seed = cfg
    paths, ids = _shards(tmp_path, lens)
    ref = RefShuffled(ids, t, b, RefPCG32(seed))
    s = TokenStream(paths, t, b, RefPCG32(seed), shuffle=True)
    batches = []
    for _ in range(n + m):
        x, y = s.next_batch()
        rx, ry = ref.next_batch()
        assert np.array_equal(x, rx) and np.array_equal(y, ry)
        batches.append(x)
    first = TokenStream(paths, t, b, RefPCG32(seed), shuffle=True)
    for _ in range(n):
        first.next_batch()
    cursor = json.loads(json.dumps(first.cursor()))
    assert "epoch_rng" in cursor
    resumed = TokenStream(paths, t, b, RefPCG32(0), shuffle=True)
    resumed.load_state_dict(cursor)
    for want in batches[n:]:
        assert np.array_equal(resumed.next_batch()[0], want)
    assert resumed.cursor() == s.cursor()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs, world=st.sampled_from([1, 2, 4]), n=st.integers(0, 5))
def test_shuffled_ranks_tile_the_stream_and_resume_on_another_world_size(tmp_path, cfg, world, n):
    lens, t, _, seed = cfg
    paths, _ = _shards(tmp_path, lens)
    single = TokenStream(paths, t, 8, RefPCG32(seed), shuffle=True)
    ranks = [TokenStream(paths, t, 8 // world, RefPCG32(seed), rank=r, world_size=world, shuffle=True)
             for r in range(world)]
    want = [single.next_batch()[0] for _ in range(n + 3)]
    for w in want[:n]:
        got = np.concatenate([r.next_batch()[0] for r in ranks])
        assert np.array_equal(got, w)
    cursor = ranks[0].cursor()
    other = 2 if world != 2 else 4
    elastic = [TokenStream(paths, t, 8 // other, RefPCG32(1), rank=r, world_size=other, shuffle=True)
               for r in range(other)]
    for e in elastic:
        e.restore(cursor)
    for w in want[n:]:
        assert np.array_equal(np.concatenate([e.next_batch()[0] for e in elastic]), w)


def test_cli_shuffle_equals_python(tmp_path):
    paths, _ = _shards(tmp_path, [17, 23, 31, 12])
    out = tlio("tokens", "windows", *map(str, paths), "--seq-len", "3", "--batch", "4",
               "--seed", "11", "--batches", "12", "--shuffle")
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    s = TokenStream(paths, 3, 4, RefPCG32(11, 54), shuffle=True)
    for line in lines:
        x, y = s.next_batch()
        assert line["inputs"] == x.tolist() and line["targets"] == y.tolist()
        assert line["cursor"] == s.cursor()
    # Without shuffle the cursor carries no epoch generator, and the batches differ.
    plain = TokenStream(paths, 3, 4, RefPCG32(11, 54))
    xs = [plain.next_batch()[0].tolist() for _ in lines]
    assert "epoch_rng" not in plain.cursor()
    assert xs != [line["inputs"] for line in lines]
    # A shuffled cursor resumes in the CLI too, and an in-order stream refuses it.
    (tmp_path / "c.json").write_text(json.dumps(lines[4]["cursor"]))
    again = tlio("tokens", "windows", *map(str, paths), "--seq-len", "3", "--batch", "4",
                 "--cursor", str(tmp_path / "c.json"), "--batches", "7", "--shuffle")
    assert [json.loads(line) for line in again.stdout.splitlines()] == lines[5:]
    refused = tlio("tokens", "windows", *map(str, paths), "--seq-len", "3", "--batch", "4",
                   "--cursor", str(tmp_path / "c.json"), check=False)
    assert refused.returncode == 1 and "epoch_rng" in refused.stderr, refused.stderr


def test_the_torch_example_with_shuffle_resumes_bitwise_and_changes_the_order(tmp_path):
    """examples/train_torch.py --shuffle over four small shards (an epoch is about 18
    steps): a run stopped at step 24, in its second epoch, and resumed ends with the
    digests of an uninterrupted one (the cursor carries the epoch's generator), and the
    shuffled run trains on another order than the in-order one."""
    rng = np.random.default_rng(3)
    shards = []
    for i in range(4):
        ids = rng.integers(0, 50257, size=60 + 13 * i)
        shards.append(str(write_shard(tmp_path / f"train_{i:06d}.bin", ids, vocab=50257)))
    example = [sys.executable, str(ROOT / "examples" / "train_torch.py"), "--shard", *shards,
               "--every", "6", "--batch", "2", "--seq-len", "8"]

    def run(out: str, steps: int, *flags: str) -> str:
        done = subprocess.run([*example, "--out", str(tmp_path / out), "--steps", str(steps), *flags],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        last = done.stdout.splitlines()[-1]
        assert last.startswith("sha256 state_dict="), done.stdout
        return last

    whole = run("whole", 36, "--shuffle")
    run("resumed", 24, "--shuffle", "--resume")
    assert run("resumed", 36, "--shuffle", "--resume") == whole
    assert run("in-order", 36) != whole


def test_tlio_torch_checkpoints_keep_a_shuffled_streams_epoch_order(tmp_path):
    """tlio.torch.save stores the whole cursor of a shuffled stream (its epoch generator
    too), so the stream tlio.torch.load restores continues with the saved stream's
    batches, at every point of an epoch; an in-order stream's trainer_state.json carries
    no epoch_rng."""
    import torch  # only this test needs it

    import tlio.torch as tt
    from tlio.pcg import PCG32

    rng = np.random.default_rng(4)
    shards = [str(write_shard(tmp_path / f"s{i}.bin", rng.integers(0, 1000, size=50 + 11 * i), vocab=1000))
              for i in range(4)]
    for shuffle in (True, False):
        for k in (3, 9, 17, 26):
            saved = TokenStream(shards, 8, 2, PCG32(7), 1000, shuffle=shuffle)
            for _ in range(k):
                saved.next_batch()
            model = torch.nn.Linear(2, 2)
            out = tmp_path / f"ck-{shuffle}-{k}"
            tt.save(out, k, model, None, saved)
            state = json.loads((out / f"step-{k:06d}" / "trainer_state.json").read_text())
            assert ("epoch_rng" in state["data_cursor"]) == shuffle
            restored = TokenStream(shards, 8, 2, PCG32(0), 1000, shuffle=shuffle)
            tt.load(out, torch.nn.Linear(2, 2), None, restored)
            for _ in range(40):
                (x1, y1), (x2, y2) = saved.next_batch(), restored.next_batch()
                assert np.array_equal(x1, x2) and np.array_equal(y1, y2), (shuffle, k)
