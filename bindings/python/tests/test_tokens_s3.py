"""Token shards and safetensors headers on object storage (scale.md section 3), against
the local S3 server of the ``s3`` fixture: ``TokenStream`` over ``s3://`` shards yields
the batches of the same stream over local copies, bit for bit (cursor resumption,
shuffled order, ranks, patterns, pickling included), fetching each shard once into a
verified local cache; ``read_tokens_header`` and ``read_header`` read objects' headers;
a missing object, a missing bucket and a server that is down each fail at once with one
error naming the URL."""

from __future__ import annotations

import json
import os
import pickle
import socket
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest

from tlio.pcg import PCG32
from tlio.safetensors import read_header, save_safetensors
from tlio.tokens import TokenStream, read_tokens_header
from _tokens_helpers import tlio, write_shard

VOCAB = 50257


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache directory of the test's own."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TLIO_CACHE_DIR", str(d))
    return d


def shards_here(tmp_path: Path, sizes: List[int]) -> List[Path]:
    rng = np.random.default_rng(5)
    out = []
    for i, n in enumerate(sizes):
        ids = rng.integers(0, VOCAB, size=n)
        out.append(write_shard(tmp_path / f"train_{i:06d}.bin", ids, vocab=VOCAB))
    return out


def upload(s3, paths: List[Path], prefix: str = "data") -> List[str]:
    urls = []
    for p in paths:
        s3.client.upload_file(str(p), s3.name, f"{prefix}/{p.name}")
        urls.append(s3.url(f"{prefix}/{p.name}"))
    return urls


def batches(stream: TokenStream, n: int):
    return [stream.next_batch() for _ in range(n)]


def assert_same(a, b):
    assert len(a) == len(b)
    for (x1, y1), (x2, y2) in zip(a, b):
        assert x1.dtype == x2.dtype and x1.shape == x2.shape
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


def cached_files(cache: Path):
    """The cached copies (each beside the .blake3 digest the cache wrote for it)."""
    d = cache / "s3"
    return sorted((p.name, p.stat().st_ino, p.stat().st_mtime_ns) for p in d.iterdir()
                  if p.suffix == ".bin") if d.is_dir() else []


@pytest.mark.parametrize("shuffle", [False, True])
def test_stream_over_objects_equals_the_local_stream_bit_for_bit(s3, cache, tmp_path, shuffle):
    local = shards_here(tmp_path, [3000, 1700, 2500])
    urls = upload(s3, local)
    kw = dict(seq_len=64, batch=4, rng=PCG32(11), shuffle=shuffle)
    want = batches(TokenStream(local, **kw), 120)
    remote = TokenStream(urls, **kw)
    assert remote.shards == urls
    got = batches(remote, 50)
    cursor = remote.cursor()
    # Resumed in a fresh stream over the objects (the cache is warm now).
    resumed = TokenStream(urls, **kw)
    resumed.restore(cursor)
    got += batches(resumed, 70)
    assert_same(got, want)
    # The cursor is the local stream's too: objects and local copies are interchangeable.
    local_stream = TokenStream(local, **kw)
    batches(local_stream, 50)
    assert local_stream.cursor() == cursor


def test_each_object_is_fetched_once_and_patterns_list_in_key_order(s3, cache, tmp_path):
    local = shards_here(tmp_path, [900, 800, 1000])
    urls = upload(s3, local)
    s3.client.put_object(Bucket=s3.name, Key="data/notes.txt", Body=b"not a shard")
    kw = dict(seq_len=16, batch=3, rng=PCG32(2))
    want = batches(TokenStream(local, **kw), 200)
    assert_same(batches(TokenStream(urls, **kw), 200), want)
    first = cached_files(cache)
    assert len(first) == 3
    # Opened again (by a pattern this time): the same cached copies, untouched.
    pattern = TokenStream([s3.url("data/train_*.bin")], **kw)
    assert pattern.shards == urls
    assert_same(batches(pattern, 200), want)
    assert cached_files(cache) == first


def test_ranks_and_pickling_keep_urls(s3, cache, tmp_path):
    local = shards_here(tmp_path, [1200, 1300])
    urls = upload(s3, local, prefix="r")
    kw = dict(seq_len=32, batch=2, rng=PCG32(9))
    single = batches(TokenStream(local, **{**kw, "batch": 4}), 30)
    ranks = [TokenStream(urls, **kw, rank=r, world_size=2) for r in range(2)]
    for x, y in single:
        got = [s.next_batch() for s in ranks]
        assert np.array_equal(np.concatenate([g[0] for g in got]), x)
        assert np.array_equal(np.concatenate([g[1] for g in got]), y)
    copy = pickle.loads(pickle.dumps(ranks[0]))
    assert copy.shards == urls
    assert_same(batches(copy, 10), batches(ranks[0], 10))


def test_headers_of_objects_equal_the_local_ones(s3, tmp_path):
    (shard,) = shards_here(tmp_path, [777])
    (url,) = upload(s3, [shard])
    assert read_tokens_header(url) == read_tokens_header(shard)
    assert read_tokens_header(url)["n"] == 777
    model = tmp_path / "m.safetensors"
    save_safetensors(model, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"k": "v"})
    s3.client.upload_file(str(model), s3.name, "m/m.safetensors")
    assert read_header(s3.url("m/m.safetensors")) == read_header(model)


def test_an_invalid_object_is_a_value_error_naming_the_url(s3, cache, tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x00" * 1030)
    s3.client.upload_file(str(bad), s3.name, "bad.bin")
    url = s3.url("bad.bin")
    with pytest.raises(ValueError, match="bad magic") as e:
        read_tokens_header(url)
    assert url in str(e.value)
    with pytest.raises(ValueError, match="bad magic") as e:
        TokenStream([url], seq_len=4, batch=1, rng=PCG32(0))
    assert url in str(e.value)


def one_line_error(exc_type, fn, url: str) -> str:
    start = time.monotonic()
    with pytest.raises(exc_type) as e:
        fn()
    assert time.monotonic() - start < 20
    text = str(e.value)
    assert url in text and "\n" not in text, text
    return text


def test_missing_objects_buckets_and_servers_fail_at_once_naming_the_url(s3, cache, monkeypatch):
    url = s3.url("data/absent.bin")
    for fn in (lambda: read_tokens_header(url), lambda: TokenStream([url], 4, 1, PCG32(0))):
        assert "no such object" in one_line_error(FileNotFoundError, fn, url)
    pattern = s3.url("data/none_*.bin")
    text = one_line_error(FileNotFoundError, lambda: TokenStream([pattern], 4, 1, PCG32(0)), pattern)
    assert "no object matches" in text
    nobucket = "s3://no-such-bucket-of-tlio/x.bin"
    for fn in (lambda: read_tokens_header(nobucket), lambda: TokenStream([nobucket], 4, 1, PCG32(0))):
        assert "no such bucket" in one_line_error(FileNotFoundError, fn, nobucket)
    # A server that is down: a port nothing listens on.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    for fn in (lambda: read_tokens_header(url), lambda: TokenStream([url], 4, 1, PCG32(0))):
        text = one_line_error(OSError, fn, url)
        assert "cannot reach the server" in text
    assert not os.path.exists(cache / "s3") or not any((cache / "s3").iterdir())


def test_a_packs_manifest_trains_on_its_train_shards_only(s3, cache, tmp_path):
    """A pack with a validation split lists its val shard first in its manifest; named as
    a source (in storage or copied to disk), the manifest stands for its training shards,
    and ``#val`` / ``#all`` choose the others explicitly."""
    text = tmp_path / "docs.txt"
    text.write_text("Once upon a time there was a shard. " * 60)
    flags = ["--tokenizer", "gpt2", "--val-tokens", "60", "--shard-tokens", "150"]
    tlio("-q", "tokens", "pack", *flags, "-o", str(tmp_path / "fw"), str(text))
    tlio("-q", "tokens", "pack", *flags, "-o", s3.url("m/fw"), str(text))
    val = tmp_path / "fw_val_000000.bin"
    train = sorted(tmp_path.glob("fw_train_*.bin"))
    assert val.is_file() and len(train) >= 2
    kw = dict(seq_len=8, batch=2, rng=PCG32(3))
    manifest = s3.url("m/fw.manifest.json")
    stream = TokenStream([manifest], **kw)
    assert stream.shards == [s3.url(f"m/{p.name}") for p in train]
    assert_same(batches(stream, 40), batches(TokenStream(train, **kw), 40))
    assert TokenStream([manifest + "#train"], **kw).shards == stream.shards
    assert TokenStream([manifest + "#val"], **kw).shards == [s3.url(f"m/{val.name}")]
    assert TokenStream([manifest + "#all"], **kw).shards == [s3.url(f"m/{p.name}") for p in [val, *train]]
    with pytest.raises(ValueError, match='unknown split "test"'):
        TokenStream([manifest + "#test"], **kw)
    # A copy of the pack on disk (synced from storage): the same rule.
    copy = tmp_path / "copy"
    copy.mkdir()
    for key in s3.keys("m/"):
        s3.client.download_file(s3.name, key, str(copy / key.rsplit("/", 1)[1]))
    local = TokenStream([copy / "fw.manifest.json"], **kw)
    assert [Path(p).name for p in local.shards] == [p.name for p in train]
    assert_same(batches(local, 40), batches(TokenStream(train, **kw), 40))
    assert [Path(p).name for p in TokenStream([f"{copy}/fw.manifest.json#val"], **kw).shards] == [val.name]
    # A manifest whose training shards were removed from it cannot be trained on.
    m = json.loads((copy / "fw.manifest.json").read_text())
    (copy / "val_val_000000.bin").write_bytes(val.read_bytes())
    only_val = {**m, "shards": [{**m["shards"][0], "name": "val_val_000000.bin"}]}
    (copy / "val.manifest.json").write_text(json.dumps(only_val))
    with pytest.raises(ValueError, match="lists no train shard: 0 training and 1 validation"):
        TokenStream([copy / "val.manifest.json"], **kw)
    # A copied shard that is not the one the manifest records (a valid shard, but
    # another) is refused, naming both.
    (copy / train[0].name).write_bytes(val.read_bytes())
    with pytest.raises(ValueError, match="the manifest records"):
        TokenStream([copy / "fw.manifest.json"], **kw)
