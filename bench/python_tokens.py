#!/usr/bin/env python3
"""tlio.tokens.TokenStream.next_batch against the same stream written in numpy over
np.memmap, side by side in one run (python.md's performance table).

B = 64 windows of T = 1024 from one 100M-token uint16 shard (the size llm.c writes), read
from the page cache (warm) by both. The numpy stream is tokens.md's, phases drawn from
the same PCG32 (in Python: it runs once per pass), each batch one contiguous slice of
the memmap converted to int64 with inputs and targets as views of it, llm.c's
DataLoader's way and the fastest a careful numpy user would write (a batch across a
pass boundary gathers its windows); its first batches are checked equal to tlio's before timing.
Rounds alternate (tlio, numpy, tlio, numpy, ...) so drift on a shared machine hits both;
the figures are medians per batch. Peak RSS is measured in a fresh process per stream.

    python bench/python_tokens.py [--rounds 7] [--batches 50] [--dir DIR]

Never a timed test: the numbers go to docs/python.md, nothing asserts on them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

N_TOKENS = 100_000_000
VOCAB = 50257
B, T = 64, 1024
SEED = 1337
MASK64 = (1 << 64) - 1
LABELS = {
    "tlio": "tlio.tokens.TokenStream        ",
    "numpy": "numpy, one contiguous slice    ",
    "numpy_gather": "numpy, fancy-index gather      ",
}
KINDS = list(LABELS)


class PCG32:
    """tokens.md's generator (pcg_basic), for the numpy stream's phases."""

    def __init__(self, initstate, initseq=54):
        self.state, self.inc = 0, ((initseq << 1) | 1) & MASK64
        self.next_u32()
        self.state = (self.state + initstate) & MASK64
        self.next_u32()

    def next_u32(self):
        old = self.state
        self.state = (old * 6364136223846793005 + self.inc) & MASK64
        x = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        r = old >> 59
        return ((x >> r) | (x << ((-r) & 31))) & 0xFFFFFFFF

    def below(self, bound):
        threshold = ((-bound) & 0xFFFFFFFF) % bound
        while True:
            r = self.next_u32()
            if r >= threshold:
                return r % bound


class NumpyStream:
    """The token stream of tokens.md over np.memmap shards."""

    def __init__(self, paths, seq_len, batch, rng, contiguous=True):
        self.contiguous = contiguous
        self.maps = []
        for p in paths:
            header = np.fromfile(p, dtype="<i4", count=256)
            assert header[0] == 20240520 and header[1] == 1
            self.maps.append(np.memmap(p, dtype="<u2", mode="r", offset=1024, shape=(int(header[2]),)))
        self.T, self.B, self.rng = seq_len, batch, rng
        self.shard = 0
        self.offset = self._phase()

    def _phase(self):
        n = len(self.maps[self.shard])
        return self.rng.below(max(1, min(self.T, n - self.T)))

    def next_batch(self):
        T = self.T
        starts = np.empty(self.B, dtype=np.int64)
        shards = []
        for b in range(self.B):
            if self.offset + T + 1 > len(self.maps[self.shard]):
                self.shard = (self.shard + 1) % len(self.maps)
                self.offset = self._phase()
            starts[b] = self.offset
            shards.append(self.shard)
            self.offset += T
        first = int(starts[0])
        one_pass = shards.count(shards[0]) == self.B and int(starts[-1]) == first + (self.B - 1) * T
        if self.contiguous and one_pass:
            # One pass, windows T apart: one contiguous read of B*T + 1 ids, as llm.c's
            # DataLoader does (x and y are views of one fresh int64 buffer).
            buf = self.maps[shards[0]][first : first + self.B * T + 1].astype(np.int64)
            return buf[:-1].reshape(self.B, T), buf[1:].reshape(self.B, T)
        if one_pass:
            # The general stream: gather the B windows with one fancy index.
            w = self.maps[shards[0]][starts[:, None] + np.arange(T + 1)].astype(np.int64)
        else:
            # A batch across passes or shards: window by window.
            w = np.stack([self.maps[s][o : o + T + 1] for s, o in zip(shards, starts)]).astype(np.int64)
        return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


def make_shard(path):
    """A 100M-token shard, written in 10M-token chunks (bounded memory)."""
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        header = np.zeros(256, dtype="<i4")
        header[:4] = [20240520, 1, N_TOKENS, VOCAB]
        f.write(header.tobytes())
        for _ in range(N_TOKENS // 10_000_000):
            f.write(rng.integers(0, VOCAB, 10_000_000, dtype=np.uint16).astype("<u2").tobytes())


def make_stream(kind, path):
    if kind == "tlio":
        from tlio.tokens import TokenStream

        g = PCG32(SEED)
        return TokenStream([path], T, B, {"state": g.state, "inc": g.inc})
    return NumpyStream([path], T, B, PCG32(SEED), contiguous=kind == "numpy")


def time_batches(stream, n):
    stream.next_batch()  # warm
    t0 = time.perf_counter()
    for _ in range(n):
        stream.next_batch()
    return (time.perf_counter() - t0) / n


def peak_rss_child(kind, path, batches):
    """Peak RSS (MiB) of a fresh process that builds the stream and reads `batches`.

    VmHWM, the high-water mark of the process's own memory (ru_maxrss would include
    the parent's RSS at the fork, which execve carries over)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import python_tokens as b;"
        "s = b.make_stream(sys.argv[2], sys.argv[3]);"
        "[s.next_batch() for _ in range(int(sys.argv[4]))];"
        "st = {l.split(':')[0]: int(l.split()[1]) for l in open('/proc/self/status') if l[:5] in ('VmHWM', 'RssFi')};"
        "print(st['VmHWM'], st['RssFile'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)), kind, path, str(batches)],
        capture_output=True, text=True, check=True,
    )
    hwm, file_backed = (int(v) / 1024 for v in out.stdout.split())
    return hwm, file_backed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, default=50, help="batches per round")
    ap.add_argument("--dir", default=None, help="where the 200 MB shard is written")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = os.path.join(d, "train_000001.bin")
        t0 = time.perf_counter()
        make_shard(path)
        print(f"shard: {N_TOKENS:,} tokens, {os.path.getsize(path) / 1e6:.0f} MB, "
              f"written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        from tlio.tokens import open_tokens

        t0 = time.perf_counter()
        open_tokens(path)  # validates every id once, warms the page cache
        validate_s = time.perf_counter() - t0

        streams = {k: make_stream(k, path) for k in KINDS}
        for _ in range(3):
            a = streams["tlio"].next_batch()
            for k in KINDS[1:]:
                b = streams[k].next_batch()
                assert all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b)), k
        times = {k: [] for k in streams}
        for _ in range(args.rounds):
            for k, s in streams.items():
                times[k].append(time_batches(s, args.batches))
        med = {k: statistics.median(v) for k, v in times.items()}
        rss = {k: peak_rss_child(k, path, args.batches) for k in streams}

    ratio = med["tlio"] / med["numpy"]
    ratio_gather = med["tlio"] / med["numpy_gather"]
    print(f"TokenStream.next_batch B={B} T={T}, 100M-token shard (warm), median of {args.rounds} "
          f"rounds x {args.batches} batches:")
    for k, label in LABELS.items():
        print(f"  {label}  {med[k] * 1e6:9.1f} us/batch   peak RSS {rss[k][0]:6.0f} MiB "
              f"({rss[k][1]:.0f} MiB of it the shard's mapped page cache)")
    print(f"  ratio tlio/numpy (contiguous)  {ratio:5.2f}x  (goal <= 0.5x)")
    print(f"  ratio tlio/numpy (gather)      {ratio_gather:5.2f}x  (goal <= 0.5x)")
    print(f"  open_tokens (validates 100M ids): {validate_s * 1e3:.0f} ms")
    print(json.dumps({
        "tlio_us": round(med["tlio"] * 1e6, 1),
        "numpy_us": round(med["numpy"] * 1e6, 1),
        "numpy_gather_us": round(med["numpy_gather"] * 1e6, 1),
        "ratio": round(ratio, 3),
        "ratio_gather": round(ratio_gather, 3),
        "tlio_peak_rss_mib": round(rss["tlio"][0]),
        "tlio_file_backed_mib": round(rss["tlio"][1]),
        "numpy_peak_rss_mib": round(rss["numpy"][0]),
        "numpy_file_backed_mib": round(rss["numpy"][1]),
        "numpy_gather_peak_rss_mib": round(rss["numpy_gather"][0]),
        "open_tokens_ms": round(validate_s * 1e3),
    }))


if __name__ == "__main__":
    main()
