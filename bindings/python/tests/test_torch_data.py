"""TokenStream and tlio.torch.TokenDataset where torch expects state (python.md, `tlio.tokens`
and `tlio.torch`): the Stateful protocol, a torch.distributed.checkpoint round trip, and
torchdata's StatefulDataLoader resuming mid-stream with 0 workers and with 1 worker started
by fork, spawn and forkserver (the last two receive the dataset pickled). Several workers:
test_token_dataset_workers.py."""

from __future__ import annotations

import multiprocessing
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful
from torchdata.stateful_dataloader import StatefulDataLoader

from tlio.pcg import PCG32
from tlio.tokens import TokenStream
from tlio.torch import TokenDataset

sys.path.insert(0, str(Path(__file__).parent))
from _tokens_helpers import write_shard  # noqa: E402

T, B = 8, 3


@pytest.fixture
def shards(tmp_path):
    """Two small shards of distinct ids (a batch spans passes and shards quickly)."""
    rng = np.random.default_rng(7)
    return [
        str(write_shard(tmp_path / f"s{i}.bin", rng.integers(0, 50000, n).tolist(), vocab=50257))
        for i, n in enumerate((257, 131))
    ]


def stream(shards, seed=1, **kw):
    return TokenStream(shards, T, B, PCG32(seed, 54), **kw)


def batches(it, n):
    """The next n batches of an iterator of (x, y) as numpy pairs."""
    out = []
    for _ in range(n):
        x, y = next(it)
        out.append((np.asarray(x).copy(), np.asarray(y).copy()))
    return out


def assert_batches_equal(got, want):
    assert len(got) == len(want)
    for i, ((gx, gy), (wx, wy)) in enumerate(zip(got, want)):
        assert np.array_equal(gx, wx) and np.array_equal(gy, wy), f"batch {i} differs"


def test_token_stream_and_dataset_are_torch_stateful(shards):
    assert getattr(Stateful, "_is_runtime_protocol", False), "Stateful is a runtime-checkable protocol"
    assert isinstance(stream(shards), Stateful)
    assert isinstance(TokenDataset(stream(shards)), Stateful)
    assert not isinstance(object(), Stateful)


def test_dcp_save_and_load_of_a_stream_resume_exactly(shards, tmp_path):
    s = stream(shards)
    batches(s, 5)
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dcp.save({"stream": s, "w": weight}, checkpoint_id=str(tmp_path / "dcp"))
    want = batches(s, 7)
    fresh = stream(shards, seed=99)  # another position and generator before the load
    target = {"stream": fresh, "w": torch.zeros(3, 4)}
    dcp.load(target, checkpoint_id=str(tmp_path / "dcp"))
    assert fresh.cursor() != stream(shards, seed=99).cursor()
    assert torch.equal(target["w"], weight)
    assert_batches_equal(batches(fresh, 7), want)


def test_dcp_round_trip_keeps_the_global_batch_of_a_ranked_stream(shards, tmp_path):
    s = stream(shards, rank=1, world_size=2)
    batches(s, 3)
    dcp.save({"stream": s}, checkpoint_id=str(tmp_path / "dcp"))
    want = batches(s, 4)
    fresh = stream(shards, rank=1, world_size=2)
    dcp.load({"stream": fresh}, checkpoint_id=str(tmp_path / "dcp"))
    assert fresh.cursor()["global_batch"] == 2 * B
    assert_batches_equal(batches(fresh, 4), want)
    other = stream(shards, rank=0, world_size=3)
    with pytest.raises(ValueError, match=str(3 * B)):
        dcp.load({"stream": other}, checkpoint_id=str(tmp_path / "dcp"))


def test_dataset_yields_the_streams_batches_as_int64_tensors(shards):
    ds = TokenDataset(stream(shards))
    twin = stream(shards)
    it = iter(ds)
    for _ in range(60):  # several passes over both shards: endless
        x, y = next(it)
        wx, wy = twin.next_batch()
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        assert x.dtype == y.dtype == torch.int64
        assert tuple(x.shape) == tuple(y.shape) == (B, T)
        assert np.array_equal(x.numpy(), wx) and np.array_equal(y.numpy(), wy)
        assert torch.equal(x[:, 1:], y[:, :-1])


def test_dataset_tensors_share_memory_with_the_streams_arrays(shards):
    s = stream(shards)
    seen = []
    real = s.next_batch

    def recording():
        pair = real()
        seen.append(pair)
        return pair

    s.next_batch = recording
    x, y = next(iter(TokenDataset(s)))
    ax, ay = seen[0]
    assert x.data_ptr() == ax.ctypes.data and y.data_ptr() == ay.ctypes.data


def test_dataset_state_dict_is_the_streams_cursor(shards):
    s = stream(shards)
    ds = TokenDataset(s)
    batches(iter(ds), 4)
    assert ds.state_dict() == s.cursor()
    other = TokenDataset(stream(shards, seed=5))
    other.load_state_dict(ds.state_dict())
    assert_batches_equal(batches(iter(other), 3), batches(iter(ds), 3))


def test_dataset_refuses_a_bad_state_and_keeps_its_position(shards):
    ds = TokenDataset(stream(shards))
    batches(iter(ds), 2)
    before = ds.state_dict()
    with pytest.raises(ValueError):
        ds.load_state_dict({**before, "shard": 2})
    assert ds.state_dict() == before


def test_dataset_wraps_only_a_token_stream():
    with pytest.raises(TypeError, match="TokenStream"):
        TokenDataset([1, 2, 3])


def test_dataset_pickles_with_its_streams_position(shards):
    s = stream(shards, rank=1, world_size=2)
    ds = TokenDataset(s)
    batches(iter(ds), 5)
    copy = pickle.loads(pickle.dumps(ds))
    assert type(copy) is TokenDataset and copy.stream is not s
    assert copy.state_dict() == ds.state_dict()
    assert (copy.stream.rank, copy.stream.world_size) == (1, 2)
    assert_batches_equal(batches(iter(copy), 6), batches(iter(ds), 6))


# Every start method this platform has: spawn and forkserver send the dataset to the
# worker pickled (forkserver is Linux's default from Python 3.14, spawn macOS's). Each
# spawned worker imports torch again, so only this test starts them.
START_METHODS = [m for m in ("fork", "spawn", "forkserver") if m in multiprocessing.get_all_start_methods()]


@pytest.mark.parametrize("num_workers,context", [(0, None)] + [(1, m) for m in START_METHODS])
def test_stateful_dataloader_resumes_mid_stream_exactly(shards, num_workers, context):
    kw = {"multiprocessing_context": context} if num_workers else {}
    want_all = batches(stream(shards), 15)
    loader = StatefulDataLoader(TokenDataset(stream(shards)), batch_size=None, num_workers=num_workers, **kw)
    it = iter(loader)
    assert_batches_equal(batches(it, 6), want_all[:6])
    state = loader.state_dict()
    assert_batches_equal(batches(it, 9), want_all[6:])
    del it
    # A new loader over a stream at another position continues from the saved state.
    resumed = StatefulDataLoader(
        TokenDataset(stream(shards, seed=42)), batch_size=None, num_workers=num_workers, **kw
    )
    resumed.load_state_dict(state)
    assert_batches_equal(batches(iter(resumed), 9), want_all[6:])


def test_stateful_dataloader_state_of_a_worker_is_the_cursor(shards):
    """With one worker the position lives in the loader's state (the worker's copy of
    the stream), as TokenDataset's docstring says; it is the cursor after the batches
    handed out, whatever the worker read ahead."""
    loader = StatefulDataLoader(
        TokenDataset(stream(shards)), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    it = iter(loader)
    batches(it, 4)
    twin = stream(shards)
    batches(twin, 4)
    state = loader.state_dict()
    worker = state["_snapshot"]["_worker_snapshots"]["worker_0"]
    assert worker["fetcher_state"]["dataset_iter_state"] == twin.cursor()
