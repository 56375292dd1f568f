"""The token stream under attack: a shard shrinking underneath a reader, arguments far
beyond any real run, Ctrl-C during a long batch, and threads asking for the cursor while
another reads a batch."""

from __future__ import annotations

import _thread
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tlio.tokens import TokenStream
from _tokens_helpers import RefPCG32, write_shard


def test_a_shard_truncated_underneath_is_an_error_naming_it_never_a_signal(tmp_path):
    # In a child: before positioned reads, the mapped shard raised SIGBUS and killed it.
    shard = write_shard(tmp_path / "train.bin", np.arange(400_000) % 50_000, vocab=50_000)
    code = textwrap.dedent(f"""
        import sys
        from tlio.tokens import TokenStream
        from tlio.pcg import PCG32
        s = TokenStream([{str(shard)!r}], 1024, 64, PCG32(1))
        s.next_batch()
        open({str(shard)!r}, "wb").close()  # a tokenizer re-run rewriting it in place
        try:
            s.next_batch()
        except (ValueError, OSError) as e:
            print("refused:", e)
            sys.exit(0)
        sys.exit(3)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "train.bin" in r.stdout and "changed" in r.stdout, r.stdout


def test_a_shard_rewritten_in_place_is_refused_and_the_stream_stays_put(tmp_path):
    shard = write_shard(tmp_path / "s.bin", np.arange(5000) % 300, vocab=300)
    s = TokenStream([shard], 16, 4, RefPCG32(3))
    s.next_batch()
    before = s.cursor()
    data = bytearray(shard.read_bytes())
    data[1024:] = b"\x07" * (len(data) - 1024)
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="s.bin"):
        s.next_batch()
    assert s.cursor() == before


@pytest.mark.parametrize("world_size", [2**40, 2**21])
def test_world_sizes_beyond_the_limit_are_refused(tmp_path, world_size):
    shard = write_shard(tmp_path / "s.bin", range(100))
    with pytest.raises(ValueError, match="world_size"):
        TokenStream([shard], 3, 1, RefPCG32(1), rank=0, world_size=world_size)


def test_the_largest_world_walks_a_batch_quickly(tmp_path):
    shard = write_shard(tmp_path / "s.bin", range(200))
    s = TokenStream([shard], 3, 1, RefPCG32(1), rank=2**20 - 1, world_size=2**20)
    x, _ = s.next_batch()
    assert x.shape == (1, 3)


def test_ctrl_c_stops_a_long_batch_and_leaves_the_stream_where_it_was(tmp_path):
    shard = write_shard(tmp_path / "s.bin", np.arange(3_000_000) % 50_000, vocab=50_000)
    s = TokenStream([shard], 4096, 1024, RefPCG32(5))
    before = s.cursor()
    go = threading.Event()

    def ctrl_c():
        # Python code here runs only once the main thread lets go of the GIL: with a
        # long switch interval, that is inside next_batch, while the batch is read.
        go.wait()
        _thread.interrupt_main()  # as a SIGINT arriving then

    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    t = threading.Thread(target=ctrl_c)
    try:
        t.start()
        with pytest.raises(KeyboardInterrupt):
            go.set()
            s.next_batch()
    finally:
        sys.setswitchinterval(interval)
        t.join(timeout=60)
    assert s.cursor() == before
    reference = TokenStream([shard], 4096, 1024, RefPCG32(5))
    assert np.array_equal(s.next_batch()[0], reference.next_batch()[0])


def test_cursor_from_another_thread_during_next_batch_is_safe(tmp_path):
    shard = write_shard(tmp_path / "s.bin", np.arange(2_000_000) % 50_000, vocab=50_000)
    s = TokenStream([shard], 1024, 256, RefPCG32(9), shuffle=True)
    errors, cursors = [], []
    stop = threading.Event()

    def reader():
        try:
            for _ in range(30):
                s.next_batch()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        stop.set()

    def asker():
        try:
            while not stop.is_set():
                cursors.append(s.cursor())
                s.state_dict()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=reader), threading.Thread(target=asker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert cursors
    # Every cursor seen is a position between batches: it resumes to the stream's batches.
    last = cursors[-1]
    resumed = TokenStream([shard], 1024, 256, RefPCG32(0), shuffle=True)
    resumed.restore(last)
    assert resumed.cursor() == last
