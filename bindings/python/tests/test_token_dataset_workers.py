"""tlio.torch.TokenDataset under DataLoader workers (python.md, scale.md section 8): with
N workers, worker k makes batches k, k + N, ... of the stream, so the loader yields exactly
the batches of num_workers=0 in order; StatefulDataLoader's state_dict resumes bit for bit
with the same N from any batch; a state of another N is refused naming both. Also
TokenStream.skip_batches, which the split rests on: skipping n batches is reading them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import torch  # noqa: F401  (in requirements-test.txt: a missing torch fails the run)
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from tlio.pcg import PCG32
from tlio.tokens import TokenStream
from tlio.torch import TokenDataset

sys.path.insert(0, str(Path(__file__).parent))
from _tokens_helpers import write_shard  # noqa: E402

T, B = 4, 2
# Batches each check reads: enough to cross several passes of the small shards.
TOTAL = 14


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """Five small shards of distinct ids: two for the plain stream, three sources."""
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(3)
    for i, n in enumerate((57, 31, 23, 40, 19)):
        write_shard(root / f"s{i}.bin", rng.integers(0, 60000, n).tolist(), vocab=65536)
    return root


def plain(shard_dir, seed=1, **kw):
    return TokenStream([str(shard_dir / "s0.bin"), str(shard_dir / "s1.bin")], T, B, PCG32(seed, 54), **kw)


def mixture(shard_dir, seed=1, **kw):
    sources = [(str(shard_dir / "s2.bin"), 0.5), (str(shard_dir / "s3.bin"), 0.3), (str(shard_dir / "s4.bin"), 0.2)]
    return TokenStream(sources=sources, seq_len=T, batch=B, rng=PCG32(seed, 54), **kw)


STREAMS = {"plain": plain, "mixture": mixture}


def reference(make, shard_dir, n):
    """The first n batches of the stream itself (what num_workers=0 yields)."""
    s = make(shard_dir)
    return [tuple(a.copy() for a in s.next_batch()) for _ in range(n)]


def take(it, n):
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in (next(it) for _ in range(n))]


def assert_same(got, want, what):
    assert len(got) == len(want), what
    for i, ((gx, gy), (wx, wy)) in enumerate(zip(got, want)):
        assert np.array_equal(gx, wx) and np.array_equal(gy, wy), f"{what}: batch {i} differs"


def loader(stream, num_workers, context="fork"):
    kw = {"multiprocessing_context": context} if num_workers else {}
    return StatefulDataLoader(TokenDataset(stream), batch_size=None, num_workers=num_workers, **kw)


@pytest.mark.parametrize("kind", sorted(STREAMS))
@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
def test_workers_yield_the_batches_of_no_workers_and_resume_bitwise(shard_dir, kind, num_workers):
    make = STREAMS[kind]
    want = reference(make, shard_dir, TOTAL)
    run = loader(make(shard_dir), num_workers)
    it = iter(run)
    states, got = {}, []
    # States before any batch, at a multiple of N and not (4 and 7 for the mixture).
    for at in (0, 5) if kind == "plain" else (4, 7):
        got += take(it, at - len(got))
        states[at] = run.state_dict()
    got += take(it, TOTAL - len(got))
    del it
    assert_same(got, want, f"{kind}, {num_workers} workers")
    for at, state in states.items():
        # A loader over a stream at another position: the state replaces it.
        resumed = loader(make(shard_dir, seed=77), num_workers)
        resumed.load_state_dict(state)
        assert_same(take(iter(resumed), TOTAL - at), want[at:], f"{kind}, {num_workers} workers, resumed at {at}")


def test_spawned_workers_receive_the_stream_pickled_and_split_it(shard_dir):
    # One loader only: each spawned worker imports torch again (resuming is the same
    # load_state_dict under every start method, tested with fork above and with one
    # spawned worker in test_torch_data.py).
    want = reference(mixture, shard_dir, 7)
    it = iter(loader(mixture(shard_dir), 2, context="spawn"))
    assert_same(take(it, 7), want, "spawn")


def test_a_plain_dataloader_with_workers_yields_the_stream_in_order(shard_dir):
    want = reference(plain, shard_dir, 9)
    run = DataLoader(TokenDataset(plain(shard_dir)), batch_size=None, num_workers=3, multiprocessing_context="fork")
    it = iter(run)
    assert_same(take(it, 9), want, "DataLoader, 3 workers")


def test_workers_split_one_ranks_batches(shard_dir):
    # Rank 1 of 2: the workers split that rank's batches, in order.
    want = reference(lambda d: plain(d, rank=1, world_size=2), shard_dir, 7)
    it = iter(loader(plain(shard_dir, rank=1, world_size=2), 2))
    assert_same(take(it, 7), want, "rank 1 of 2, 2 workers")


def test_a_workers_state_is_the_cursor_of_its_next_batch(shard_dir):
    run = loader(plain(shard_dir), 2)
    it = iter(run)
    take(it, 5)  # batches 0..4: worker 0 made 0, 2, 4; worker 1 made 1, 3
    snapshots = run.state_dict()["_snapshot"]["_worker_snapshots"]
    twin = plain(shard_dir)
    for worker, next_batch in ((0, 6), (1, 5)):
        state = snapshots[f"worker_{worker}"]["fetcher_state"]["dataset_iter_state"]
        at = plain(shard_dir)
        at.skip_batches(next_batch)
        assert state == {"cursor": at.cursor(), "worker": worker, "num_workers": 2}
    assert twin.cursor() == plain(shard_dir).cursor(), "the main process's stream never moved"


@pytest.mark.parametrize("saved,loaded", [(2, 4), (1, 2), (2, 1)])
def test_a_state_of_another_number_of_workers_is_refused_naming_both(shard_dir, saved, loaded):
    run = loader(plain(shard_dir), saved)
    it = iter(run)
    take(it, 3)
    state = run.state_dict()
    del it
    resumed = loader(plain(shard_dir), loaded)
    resumed.load_state_dict(state)
    shown = {1: "num_workers=0 or 1"}
    with pytest.raises(ValueError) as caught:
        next(iter(resumed))
    message = str(caught.value)
    for n in (saved, loaded):
        assert shown.get(n, f"num_workers={n}") in message, message
    assert "same num_workers" in message


def test_the_main_process_refuses_a_workers_state_and_keeps_its_position(shard_dir):
    ds = TokenDataset(plain(shard_dir))
    before = ds.state_dict()
    worker_state = {"cursor": plain(shard_dir).cursor(), "worker": 1, "num_workers": 4}
    with pytest.raises(ValueError, match=r"num_workers=4 \(worker 1\).*num_workers=0 or 1"):
        ds.load_state_dict(worker_state)
    for bad in ({**worker_state, "extra": 1}, {**worker_state, "worker": 4}, {**worker_state, "num_workers": "4"}):
        with pytest.raises(ValueError, match="TokenDataset state"):
            ds.load_state_dict(bad)
    with pytest.raises(ValueError, match="is a dict"):
        ds.load_state_dict([1, 2])
    assert ds.state_dict() == before


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(sorted(STREAMS)), before=st.integers(0, 6), n=st.integers(0, 12),
       world=st.integers(1, 3), shuffle=st.booleans())
def test_skipping_batches_is_reading_them(shard_dir, kind, before, n, world, shuffle):
    for rank in range(world):
        read = STREAMS[kind](shard_dir, rank=rank, world_size=world, shuffle=shuffle)
        skipped = STREAMS[kind](shard_dir, rank=rank, world_size=world, shuffle=shuffle)
        for s in (read, skipped):
            for _ in range(before):
                s.next_batch()
        for _ in range(n):
            read.next_batch()
        skipped.skip_batches(n)
        assert skipped.cursor() == read.cursor()
        assert all(np.array_equal(a, b) for a, b in zip(skipped.next_batch(), read.next_batch()))


def test_skip_batches_refuses_bad_counts(shard_dir):
    s = plain(shard_dir)
    at = s.cursor()
    for bad, error in ((-1, ValueError), (2**64, ValueError), (1.0, TypeError), (True, TypeError), ("3", TypeError)):
        with pytest.raises(error, match="skip_batches"):
            s.skip_batches(bad)
    with pytest.raises(ValueError, match="batches to skip"):
        s.skip_batches(2**64 - 1)
    assert s.cursor() == at
