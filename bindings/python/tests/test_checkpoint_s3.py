"""tlio.checkpoint and tlio.torch on s3:// prefixes, against the local S3 server (the
``s3`` fixture): the same checkpoints, byte for byte, as in a local directory, round
trips bit for bit, a corrupted object that verification names and load skips, and
clear errors for a missing bucket, a server that is down and the loser of two
writers of one step."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tlio.torch as tt
from tlio.checkpoint import load_checkpoint, save_checkpoint, verify_step_dir

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _ckpt_helpers import adamw, linear_model  # noqa: E402
from test_torch import assert_same, odd_setup, odd_step  # noqa: E402

torch.set_num_threads(1)


def objects(s3, step_prefix):
    """{file name: bytes} of the attempt a step's manifest names."""
    import json

    manifest = json.loads(s3.client.get_object(Bucket=s3.name, Key=f"{step_prefix}/MANIFEST.json")["Body"].read())
    out = {}
    for f in manifest["files"]:
        key = f"{step_prefix}/{manifest['attempt']}/{f['name']}"
        out[f["name"]] = s3.client.get_object(Bucket=s3.name, Key=key)["Body"].read()
    return manifest, out


def local_files(step_dir):
    return {p.name: p.read_bytes() for p in Path(step_dir).iterdir() if p.name != "MANIFEST.json"}


def save_both(tmp_path, s3, step, model, opt, **kw):
    local = save_checkpoint(tmp_path / "ckpt", model, opt, step, None, {"tokens_seen": 7 * step}, **kw)
    remote = save_checkpoint(s3.url("run/ckpt"), model, opt, step, None, {"tokens_seen": 7 * step}, **kw)
    return local, remote


def test_save_and_load_checkpoint_on_s3_match_the_local_directory(tmp_path, s3):
    model = linear_model()
    opt = adamw(model)
    for step in (1, 2):
        local, remote = save_both(tmp_path, s3, step, model, opt, keep=1, config={"d": 2})
    assert remote == s3.url("run/ckpt/step-000002")
    # The same files, byte for byte; the manifest is the local one plus the attempt.
    manifest, files = objects(s3, "run/ckpt/step-000002")
    assert files == local_files(local)
    local_manifest = (Path(local) / "MANIFEST.json").read_bytes()
    attempt = f'"attempt":"{manifest["attempt"]}",'.encode()
    remote_manifest = s3.client.get_object(Bucket=s3.name, Key="run/ckpt/step-000002/MANIFEST.json")["Body"].read()
    assert remote_manifest.replace(attempt, b"") == local_manifest
    # keep=1 removed step 1 there too; LATEST names step 2.
    assert not [k for k in s3.keys("run/ckpt/") if k.startswith("run/ckpt/step-000001")]
    assert s3.client.get_object(Bucket=s3.name, Key="run/ckpt/LATEST")["Body"].read() == b"step-000002\n"

    ck, lk = load_checkpoint(s3.url("run/ckpt")), load_checkpoint(tmp_path / "ckpt")
    assert (ck.step, ck.path, ck.skipped) == (2, remote, [])
    assert ck.extra == lk.extra and ck.config == lk.config == {"d": 2}
    for name, a in model.items():
        assert ck.model[name].tobytes() == a.tobytes() == lk.model[name].tobytes()
    for param, entry in opt["state"].items():
        for key, a in entry.items():
            assert ck.opt["state"][param][key].tobytes() == a.tobytes()
    assert verify_step_dir(remote) == []


def test_a_large_object_is_uploaded_in_parts_each_named_with_its_sha256(s3):
    # tlio names SHA-256 for every upload, so S3 checks each part (and each small
    # object) against its digest as it arrives: bytes damaged on the way are refused
    # then, not found at the next verify. This server checks no request's checksum and
    # records one only for multipart uploads, where it is the digest of the parts'
    # digests; without a named algorithm it would hold a CRC of the whole object.
    import base64
    import hashlib

    big = np.arange(17 << 20, dtype=np.float32)  # 68 MiB: above the multipart threshold
    save_checkpoint(s3.url("sums"), {"w": big}, None, 1, None, None)
    manifest, files = objects(s3, "sums/step-000001")
    data = files["model.safetensors"]
    assert len(data) > 64 << 20
    key = f"sums/step-000001/{manifest['attempt']}/model.safetensors"
    head = s3.client.head_object(Bucket=s3.name, Key=key, ChecksumMode="ENABLED")
    part = 16 << 20
    digests = b"".join(hashlib.sha256(data[i : i + part]).digest() for i in range(0, len(data), part))
    composite = base64.b64encode(hashlib.sha256(digests).digest()).decode()
    assert head.get("ChecksumSHA256", "").split("-")[0] == composite, head
    assert load_checkpoint(s3.url("sums")).model["w"].tobytes() == big.tobytes()


def test_an_existing_step_needs_overwrite_and_a_corrupted_object_is_skipped(tmp_path, s3):
    model = linear_model()
    root = s3.url("c")
    save_checkpoint(root, model, None, 1, None, None)
    save_checkpoint(root, model, None, 2, None, None)
    with pytest.raises(ValueError, match="overwrite=True"):
        save_checkpoint(root, model, None, 2, None, None)
    model["bias"] = model["bias"] + np.float32(1)
    save_checkpoint(root, model, None, 2, None, None, overwrite=True)
    assert load_checkpoint(root).model["bias"].tobytes() == model["bias"].tobytes()

    manifest, files = objects(s3, "c/step-000002")
    key = f"c/step-000002/{manifest['attempt']}/model.safetensors"
    flipped = bytearray(files["model.safetensors"])
    flipped[-1] ^= 1
    s3.client.put_object(Bucket=s3.name, Key=key, Body=bytes(flipped))
    problems = verify_step_dir(s3.url("c/step-000002"))
    assert len(problems) == 1 and "model.safetensors sha256 mismatch" in problems[0]
    ck = load_checkpoint(root)
    assert ck.step == 1
    assert ck.skipped == [("step-000002", problems[0])]


def test_a_named_step_that_fails_is_an_error_naming_it_never_another_step(s3):
    import tlio.sharded as sh

    m, opt = odd_setup(0)
    root = s3.url("named")
    for step in (1, 2, 3):
        odd_step(m, opt, step)
        tt.save(root, step, m, opt)
    # Step 2's trainer state changed behind its manifest (same size, one byte).
    manifest, files = objects(s3, "named/step-000002")
    key = f"named/step-000002/{manifest['attempt']}/trainer_state.json"
    flipped = bytearray(files["trainer_state.json"])
    flipped[-1] ^= 1
    s3.client.put_object(Bucket=s3.name, Key=key, Body=bytes(flipped))
    why = r"step-000002: trainer_state\.json sha256 mismatch"
    m2, opt2 = odd_setup(1)
    for call in (
        lambda: load_checkpoint(root, step=2),
        lambda: tt.load(root, m2, opt2, step=2),
        lambda: sh.open_step(root, step=2),
    ):
        with pytest.raises(FileNotFoundError, match=why):
            call()
    # A step that does not exist is named as such, not answered with step 1.
    with pytest.raises(FileNotFoundError, match="step-000009: does not exist"):
        load_checkpoint(root, step=9)
    assert load_checkpoint(root, step=1).step == 1
    # Below step 3 (another rank found it damaged): past step 2 to step 1.
    assert sh.open_step(root, below=3).step == 1
    # No named step: the fallback past damaged steps still works.
    assert load_checkpoint(root).step == 3
    manifest, files = objects(s3, "named/step-000003")
    key = f"named/step-000003/{manifest['attempt']}/model.safetensors"
    flipped = bytearray(files["model.safetensors"])
    flipped[-1] ^= 1
    s3.client.put_object(Bucket=s3.name, Key=key, Body=bytes(flipped))
    ck = load_checkpoint(root)
    assert ck.step == 1 and [s[0] for s in ck.skipped] == ["step-000003", "step-000002"]
    assert tt.load(root, m2, opt2).step == 1


def test_torch_save_and_load_on_s3_round_trip_bit_for_bit(tmp_path, s3):
    m, opt = odd_setup(0)
    for s in range(3):
        odd_step(m, opt, s)
    path = tt.save(s3.url("torch/ckpt"), 3, m, opt, extra={"tokens_seen": 24})
    local = tt.save(tmp_path, 3, m, opt, extra={"tokens_seen": 24})
    assert path == s3.url("torch/ckpt/step-000003")
    _, files = objects(s3, "torch/ckpt/step-000003")
    assert files == local_files(local)

    m2, opt2 = odd_setup(1)
    ck = tt.load(s3.url("torch/ckpt"), m2, opt2)
    assert ck.step == 3 and ck.extra["tokens_seen"] == 24
    assert m2.head.weight is m2.emb.weight
    assert_same(m.state_dict(), m2.state_dict(), "model")
    assert_same(opt.state_dict(), opt2.state_dict(), "optimizer")
    odd_step(m, opt, 9)
    odd_step(m2, opt2, 9)
    assert_same(m.state_dict(), m2.state_dict(), "model after a step")
    # The numpy view of the same torch checkpoint.
    assert load_checkpoint(s3.url("torch/ckpt")).step == 3


def test_an_async_torch_save_to_s3_writes_the_blocking_bytes_and_loads_bit_for_bit(s3):
    m, opt = _replay()
    pending = tt.save(s3.url("async/ckpt"), 2, m, opt, extra={"tokens_seen": 16}, blocking=False)
    # The state was staged: a step taken before the write finished changes nothing in it.
    expected_model = {k: v.clone() for k, v in m.state_dict().items()}
    odd_step(m, opt, 5)
    path = pending.wait()
    assert path == s3.url("async/ckpt/step-000002") and pending.done()
    blocking = tt.save(s3.url("blocking/ckpt"), 2, *_replay(), extra={"tokens_seen": 16})
    _, async_files = objects(s3, "async/ckpt/step-000002")
    _, blocking_files = objects(s3, "blocking/ckpt/step-000002")
    assert async_files == blocking_files and blocking.endswith("step-000002")

    m2, opt2 = odd_setup(1)
    ck = tt.load(s3.url("async/ckpt"), m2, opt2)
    assert ck.step == 2 and ck.extra["tokens_seen"] == 16
    assert_same(expected_model, m2.state_dict(), "model")
    m3, opt3 = _replay()
    odd_step(m2, opt2, 9)
    odd_step(m3, opt3, 9)
    assert_same(m3.state_dict(), m2.state_dict(), "model after a step")
    assert_same(opt3.state_dict(), opt2.state_dict(), "optimizer after a step")


def _replay():
    """The model and optimizer of the async test after its two steps (rebuilt the same,
    bit for bit, each time)."""
    m, opt = odd_setup(0)
    for s in range(2):
        odd_step(m, opt, s)
    return m, opt


def test_of_two_threads_saving_one_step_exactly_one_commits(s3):
    model = linear_model()
    root = s3.url("race")
    results = []

    def writer(bias):
        mine = dict(model, bias=np.array([bias], np.float32))
        try:
            results.append(("ok", save_checkpoint(root, mine, None, 5, None, None)))
        except (FileExistsError, ValueError) as e:
            results.append((type(e).__name__, str(e)))

    threads = [threading.Thread(target=writer, args=(float(i),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r[0] for r in results].count("ok") == 1, results
    for kind, text in results:
        if kind == "FileExistsError":
            assert "was committed by another writer" in text
        elif kind == "ValueError":
            assert "pass overwrite=True" in text
    ck = load_checkpoint(root)
    assert ck.step == 5 and verify_step_dir(s3.url("race/step-000005")) == []
    # Losers removed their attempts: only the winner's objects remain.
    manifest, _ = objects(s3, "race/step-000005")
    attempts = {k.split("/")[2] for k in s3.keys("race/step-000005/") if k.count("/") == 3}
    assert attempts == {manifest["attempt"]}


def test_missing_bucket_and_unreachable_server_are_clear_errors(s3, monkeypatch):
    model = linear_model()
    with pytest.raises(FileNotFoundError, match="no such bucket no-such-bucket-py"):
        save_checkpoint("s3://no-such-bucket-py/ckpt", model, None, 1, None, None)
    with pytest.raises(FileNotFoundError, match="no loadable checkpoint in s3://"):
        load_checkpoint(s3.url("empty"))
    with pytest.raises(ValueError, match="not a valid s3://bucket/key URL"):
        load_checkpoint("s3://Bad_Bucket/x")
    # A port nothing listens on.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(OSError, match="cannot reach the server"):
        save_checkpoint(s3.url("down"), model, None, 1, None, None)
    with pytest.raises(OSError, match="cannot reach the server"):
        tt.load(s3.url("down"), torch.nn.Linear(2, 1))
    assert time.monotonic() - start < 30
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(OSError, match="AWS_ACCESS_KEY_ID"):
        load_checkpoint(s3.url("down"))


def test_a_newest_step_that_cannot_be_reached_is_a_connection_error_not_an_older_step(s3, monkeypatch):
    from _s3 import FaultProxy

    model = linear_model()
    root = s3.url("reach")
    save_checkpoint(root, model, None, 10, None, None)
    model["bias"] = model["bias"] + np.float32(1)
    save_checkpoint(root, model, None, 20, None, None)
    proxy = FaultProxy(HERE.parents[2], s3.server)
    try:
        # Every read of step 20's objects is dropped; the listing still shows the step.
        proxy.ask(f"rule GET ^/{s3.name}/reach/step-000020/ * drop")
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(ConnectionError, match="step-000020.*cannot reach the server|cannot reach the server.*step-000020"):
            load_checkpoint(root)
        with pytest.raises(ConnectionError, match="cannot reach the server"):
            tt.load(root, torch.nn.Linear(2, 1))
        # A step that verifies but is damaged would still fall back; unreachable is not damaged.
        assert load_checkpoint(root, step=10).step == 10
    finally:
        proxy.stop()
