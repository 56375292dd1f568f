"""Credentials on object storage, against a local S3 server that checks every request's
signature as AWS does (tests/s3_server.py --auth): the key the server knows works for
checkpoints, token shards and the CLI, and a wrong secret or an unknown key is refused
at once, with one error naming the URL, never retried into a hang, and nothing
written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tlio.checkpoint import load_checkpoint, save_checkpoint
from tlio.pcg import PCG32
from tlio.tokens import TokenStream, read_tokens_header

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _ckpt_helpers import linear_model  # noqa: E402
from _s3 import _CLEARED, Bucket, FaultProxy, start_server  # noqa: E402
from _tokens_helpers import TLIO_BIN, write_shard  # noqa: E402

# How long a refusal may take: one request, no retry loop (a retried 403 would take
# the client's whole retry budget).
PROMPT = 10.0


@pytest.fixture(scope="module")
def auth_server(root):
    server = start_server(root, auth=True)
    yield server
    server.stop()


@pytest.fixture
def bucket(auth_server, monkeypatch, tmp_path):
    """A fresh bucket of the signature-checking server, with this process's AWS
    variables set to the key it knows, a cache of the test's own, and one token shard
    uploaded as ``data/train_000000.bin``."""
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in auth_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TLIO_CACHE_DIR", str(tmp_path / "cache"))
    b = Bucket(auth_server)
    shard = write_shard(tmp_path / "train_000000.bin", np.arange(300) % 50257, vocab=50257)
    b.client.upload_file(str(shard), b.name, "data/train_000000.bin")
    return b


def test_the_key_the_server_knows_works_everywhere(bucket):
    model = linear_model()
    path = save_checkpoint(bucket.url("ckpt"), model, None, 3, None, {"tokens_seen": 21})
    assert path.startswith(bucket.url("ckpt"))
    loaded = load_checkpoint(bucket.url("ckpt"))
    assert loaded.step == 3
    header = read_tokens_header(bucket.url("data/train_000000.bin"))
    assert header["n"] == 300
    stream = TokenStream([bucket.url("data/train_000000.bin")], 4, 2, PCG32(0))
    x, _ = stream.next_batch()
    assert x.shape == (2, 4)
    out = subprocess.run(
        [str(TLIO_BIN), "ckpt", "latest", bucket.url("ckpt")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "step-000003" in out.stdout


@pytest.mark.parametrize("change", ["wrong secret", "unknown key"])
def test_bad_credentials_are_refused_at_once_naming_the_url(bucket, monkeypatch, change, tmp_path):
    # A committed step and the shard exist, so a refusal cannot be taken for a
    # missing object: the server refuses the signature itself.
    save_checkpoint(bucket.url("ckpt"), linear_model(), None, 1, None, None)
    before = bucket.keys()
    if change == "wrong secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", os.environ["AWS_SECRET_ACCESS_KEY"] + "x")
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNTLIOTEST0")
    shard = bucket.url("data/train_000000.bin")
    calls = [
        (bucket.url("ckpt"), lambda: save_checkpoint(bucket.url("ckpt"), linear_model(), None, 2, None, None)),
        (bucket.url("ckpt"), lambda: load_checkpoint(bucket.url("ckpt"))),
        (shard, lambda: read_tokens_header(shard)),
        (shard, lambda: TokenStream([shard], 4, 2, PCG32(0))),
    ]
    for url, call in calls:
        start = time.monotonic()
        with pytest.raises(PermissionError) as e:
            call()
        assert time.monotonic() - start < PROMPT, url
        text = str(e.value)
        assert url in text and "refused the request" in text, text
        assert text.count("refused the request") == 1 and "\n" not in text, text
    start = time.monotonic()
    out = subprocess.run(
        [str(TLIO_BIN), "ckpt", "latest", bucket.url("ckpt")], capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - start < PROMPT
    # Exit 2: an error (1 is a check that found problems).
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tlio: error: "), out.stderr
    assert bucket.url("ckpt") in lines[0] and "refused the request" in lines[0], out.stderr
    # Nothing was written with the bad key, and no local cache was filled.
    assert bucket.keys() == before
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


@pytest.mark.parametrize(
    "name", ["AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"]
)
@pytest.mark.parametrize("value", ["hunter2\r\nX-Injected: 1", "hunter2\n", "hunter2\x01"])
def test_a_variable_no_header_can_carry_is_a_value_error_naming_it_not_its_value(bucket, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    shard = bucket.url("data/train_000000.bin")
    calls = [
        lambda: read_tokens_header(shard),
        lambda: load_checkpoint(bucket.url("ckpt")),
        lambda: save_checkpoint(bucket.url("ckpt"), linear_model(), None, 1, None, None),
    ]
    for call in calls:
        with pytest.raises(ValueError) as e:
            call()
        text = str(e.value)
        assert name in text and "HTTP header" in text, text
        assert "hunter2" not in text and "\n" not in text, text
    assert bucket.keys("ckpt") == []


def test_an_endpoint_or_url_holding_a_secret_is_refused_without_printing_it(bucket, monkeypatch):
    good = os.environ["AWS_ENDPOINT_URL"]
    host = good.split("://", 1)[1]
    shard = bucket.url("data/train_000000.bin")
    for endpoint, rule in [
        (f"http://admin:hunter2@{host}", "user name or password"),
        (f"admin:hunter2@{host}", "user name or password"),
        (f"{good}/?X-Amz-Signature=hunter2&X-Amz-Security-Token=hunter3", "and nothing more"),
    ]:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        for call in (lambda: read_tokens_header(shard), lambda: load_checkpoint(bucket.url("ckpt"))):
            with pytest.raises(ValueError) as e:
                call()
            text = str(e.value)
            assert "AWS_ENDPOINT_URL" in text and rule in text, text
            assert "hunter" not in text, text
    monkeypatch.setenv("AWS_ENDPOINT_URL", good)
    presigned = shard + "?X-Amz-Signature=hunter2&X-Amz-Credential=hunter3"
    for call in (lambda: read_tokens_header(presigned), lambda: TokenStream([presigned], 4, 2, PCG32(0))):
        with pytest.raises(ValueError) as e:
            call()
        text = str(e.value)
        assert "not a valid s3://bucket/key URL" in text and "X-Amz-Signature=***" in text, text
        assert "hunter" not in text, text


@pytest.fixture
def proxy(root, auth_server):
    """The project's fault proxy in front of the signature-checking server."""
    p = FaultProxy(root, auth_server)
    yield p
    p.stop()


@pytest.mark.parametrize(
    "status,code",
    [
        (400, "InvalidToken"),
        (400, "ExpiredToken"),
        (403, "InvalidAccessKeyId"),
        (403, "SignatureDoesNotMatch"),
        (403, "AccessDenied"),
    ],
)
def test_a_refused_token_or_key_is_a_permission_error_naming_the_servers_code(
    bucket, proxy, monkeypatch, status, code
):
    save_checkpoint(bucket.url("ckpt"), linear_model(), None, 1, None, None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    proxy.ask(f"rule GET /{bucket.name} * answer {status} {code}")
    shard = bucket.url("data/train_000000.bin")
    for url, call in [
        (bucket.url("ckpt"), lambda: load_checkpoint(bucket.url("ckpt"))),
        (shard, lambda: read_tokens_header(shard)),
    ]:
        start = time.monotonic()
        with pytest.raises(PermissionError) as e:
            call()
        assert time.monotonic() - start < PROMPT, url
        text = str(e.value)
        assert url in text and code in text and str(status) in text, text
        assert text.count("refused the request") == 1 and "\n" not in text, text


def test_a_refused_head_says_403_once_and_what_was_asked(bucket, proxy, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    proxy.ask(f"rule HEAD /{bucket.name} * answer 403 AccessDenied")
    shard = bucket.url("data/train_000000.bin")
    with pytest.raises(PermissionError) as e:
        read_tokens_header(shard)
    text = str(e.value)
    assert shard in text and text.count("403 Forbidden") == 1 and "HEAD" in text, text
    assert not text.rstrip().endswith(":"), text
