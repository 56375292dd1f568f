"""tlio.checkpoint against checkpoint.md and the chapter's section-4 table
(test_checkpoint_roundtrip ... test_rejects_bad_state), cross-checked with the CLI's
`ckpt verify` and `ckpt latest`."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from tlio.checkpoint import (
    EXTRA_KEYS,
    Checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_name,
    verify_step_dir,
)
from tlio.tokens import TokenStream
from _ckpt_helpers import (
    adamw,
    adamw_step,
    bigram_grads,
    bits,
    flip,
    linear_grads,
    linear_model,
    same_bits,
    sgd,
    sgd_step,
    steps,
    tree,
)
from _tokens_helpers import RefPCG32, tlio, write_shard

F32 = np.float32
RNG = {"state": 0x185706B82C2E03F8, "inc": 0x6D}


def trained_linear():
    """Section 3's Linear(2, 1) after two AdamW steps."""
    model = linear_model()
    opt = adamw(model)
    x = np.array([[1.0, 2.0], [-1.0, 0.5], [0.25, -3.0]], F32)
    y = np.array([[1.0], [0.0], [-2.0]], F32)
    for _ in range(2):
        adamw_step(model, linear_grads(model, x, y), opt)
    return model, opt


def assert_opt_equal(a, b):
    assert {k: v for k, v in a.items() if k != "state"} == {k: v for k, v in b.items() if k != "state"}
    assert a["state"].keys() == b["state"].keys()
    for p in a["state"]:
        assert same_bits(a["state"][p], b["state"][p]), p


def test_checkpoint_roundtrip(tmp_path):
    model, opt = trained_linear()
    model["weight"][0, 1] = -0.0
    extra = {"tokens_seen": 1234, "data_cursor": {"shard": 0, "offset": 6}, "lr": 0.01}
    path = save_checkpoint(tmp_path, model, opt, 7, RNG, extra)
    assert path == str(tmp_path / "step-000007")
    assert sorted(os.listdir(path)) == [
        "MANIFEST.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"
    ]
    assert (tmp_path / "LATEST").read_bytes() == b"step-000007\n"
    assert sorted(safetensors.numpy.load_file(f"{path}/model.safetensors")) == ["bias", "weight"]
    assert sorted(safetensors.numpy.load_file(f"{path}/optimizer.safetensors")) == [
        "bias.exp_avg", "bias.exp_avg_sq", "weight.exp_avg", "weight.exp_avg_sq"
    ]
    ck = load_checkpoint(tmp_path)
    assert isinstance(ck, Checkpoint)
    assert (ck.path, ck.step) == (path, 7)
    assert same_bits(ck.model, model)
    assert all(a.dtype == np.float32 for a in ck.model.values())
    assert np.signbit(ck.model["weight"][0, 1])
    assert_opt_equal(ck.opt, opt)
    assert ck.opt["step"] == 2 and ck.opt["type"] == "adamw"
    assert ck.rng_state == RNG
    assert ck.extra == {**extra, "config_sha256": None, "git_sha": None}
    assert ck.config is None and ck.skipped == []
    # The loaded arrays are the caller's to train on.
    assert all(a.flags.writeable for a in ck.model.values())
    # Loading the step by number gives the same; step_name pads to six digits.
    assert load_checkpoint(tmp_path, step=7).path == path
    assert step_name(7) == "step-000007" and step_name(1234567) == "step-1234567"
    # The CLI picks the same directory and verifies it.
    assert tlio("ckpt", "latest", str(tmp_path)).stdout.strip() == path
    tlio("ckpt", "verify", str(tmp_path))
    # A PCG32-like generator is accepted for rng_state (its state is what is saved).
    p2 = save_checkpoint(tmp_path, model, opt, 8, RefPCG32(42), extra)
    assert load_checkpoint(tmp_path).rng_state == RNG and p2.endswith("step-000008")


def test_layout_matches_the_formats(tmp_path):
    model, opt = trained_linear()
    git = "0123456789abcdef0123456789abcdef01234567"
    extra = {"tokens_seen": 102400, "data_cursor": {"shard": 0, "offset": 1234}, "lr": 0.01, "git_sha": git}
    path = Path(save_checkpoint(tmp_path, model, opt, 50, RNG, extra, config={"vocab": 16}))
    state_bytes = (path / "trainer_state.json").read_bytes()
    state = json.loads(state_bytes)
    assert list(state) == [
        "step", "tokens_seen", "data_cursor", "rng_state", "lr", "config_sha256", "git_sha"
    ]
    config_sha = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()
    assert state == {
        "step": 50,
        "tokens_seen": 102400,
        "data_cursor": {"shard": 0, "offset": 1234},
        "rng_state": {"state": "185706b82c2e03f8", "inc": "000000000000006d"},
        "lr": 0.01,
        "config_sha256": config_sha,
        "git_sha": git,
    }
    manifest = json.loads((path / "MANIFEST.json").read_bytes())
    assert (manifest["format"], manifest["version"], manifest["step"]) == ("tlio-manifest", 1, 50)
    names = [f["name"] for f in manifest["files"]]
    assert names == sorted(names, key=lambda n: n.encode())
    assert set(names) == set(os.listdir(path)) - {"MANIFEST.json"}
    for f in manifest["files"]:
        data = (path / f["name"]).read_bytes()
        assert f["size"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    # The safetensors files: F32, metadata {"format": "tinyllm"} (+ the compact state).
    for name in ("model.safetensors", "optimizer.safetensors"):
        raw = (path / name).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        meta = header.pop("__metadata__")
        assert meta["format"] == "tinyllm"
        assert {t["dtype"] for t in header.values()} == {"F32"}
    opt_meta = safetensors.safe_open(str(path / "optimizer.safetensors"), "np").metadata()
    assert opt_meta["state"] == (
        '{"type":"adamw","step":2,"lr":0.01,"betas":[0.9,0.999],"eps":1e-8,"weight_decay":0.01}'
    )
    assert verify_step_dir(path) == []
    tlio("ckpt", "verify", str(path))
    # An unlisted file makes the directory fail, naming it; so does a changed byte.
    (path / "notes.txt").write_text("hi")
    problems = verify_step_dir(path)
    assert problems == ["unlisted file notes.txt"]
    assert tlio("ckpt", "verify", str(path), check=False).returncode == 1
    os.remove(path / "notes.txt")
    flip(path / "trainer_state.json", 3)
    assert any("trainer_state.json" in p and "sha256" in p for p in verify_step_dir(path))
    with pytest.raises(FileNotFoundError):
        verify_step_dir(tmp_path / "step-000099")


def test_config_and_defaults(tmp_path):
    model = linear_model()
    config = {"model": {"vocab": 16, "dim": 2}, "lr": 0.01, "name": "tiny"}
    p = Path(save_checkpoint(tmp_path, model, None, 3, None, None, config=config))
    assert not (p / "optimizer.safetensors").exists()
    sha = hashlib.sha256((p / "config.json").read_bytes()).hexdigest()
    ck = load_checkpoint(tmp_path)
    assert ck.config == config and ck.opt is None and ck.rng_state is None
    assert ck.extra == {
        "tokens_seen": 0, "data_cursor": None, "lr": None, "config_sha256": sha, "git_sha": None
    }
    assert set(ck.extra) == set(EXTRA_KEYS)
    # Without a config, every default is null (or 0), and every key is still written.
    q = Path(save_checkpoint(tmp_path, model, None, 4, None, {}))
    assert json.loads((q / "trainer_state.json").read_bytes()) == {
        "step": 4, "tokens_seen": 0, "data_cursor": None, "rng_state": None, "lr": None,
        "config_sha256": None, "git_sha": None,
    }
    assert not (q / "config.json").exists()
    # A config_sha256 that agrees with the config is fine, one that disagrees is refused.
    save_checkpoint(tmp_path, model, None, 5, None, {"config_sha256": sha}, config=config)
    before = tree(tmp_path)
    with pytest.raises(ValueError, match="config_sha256"):
        save_checkpoint(tmp_path, model, None, 6, None, {"config_sha256": "0" * 64}, config=config)
    assert tree(tmp_path) == before


def test_sgd_momentum_names(tmp_path):
    model = linear_model()
    opt = sgd(model, lr=0.1, momentum=0.9)
    x = np.array([[1.0, -1.0], [2.0, 0.5]], F32)
    y = np.array([[0.5], [1.0]], F32)
    for _ in range(2):
        sgd_step(model, linear_grads(model, x, y), opt)
    p = save_checkpoint(tmp_path, model, opt, 2, None, None)
    assert sorted(safetensors.numpy.load_file(f"{p}/optimizer.safetensors")) == [
        "bias.momentum_buffer", "weight.momentum_buffer"
    ]
    meta = safetensors.safe_open(f"{p}/optimizer.safetensors", "np").metadata()
    assert meta["state"] == (
        '{"type":"sgd","lr":0.1,"momentum":0.9,"dampening":0.0,"nesterov":false,"weight_decay":0.0}'
    )
    ck = load_checkpoint(tmp_path)
    assert_opt_equal(ck.opt, opt)
    assert same_bits(ck.model, model)
    # Momentum 0 stores no arrays at all.
    plain = sgd(model, momentum=0.0)
    p = save_checkpoint(tmp_path, model, plain, 3, None, None)
    assert safetensors.numpy.load_file(f"{p}/optimizer.safetensors") == {}
    assert load_checkpoint(tmp_path).opt == {**plain, "momentum": 0.0}
    # An AdamW key under SGD, or a parameter the model lacks, is refused.
    with pytest.raises(ValueError, match="exp_avg"):
        bad = sgd(model)
        bad["state"]["weight"] = {"exp_avg": model["weight"]}
        save_checkpoint(tmp_path, model, bad, 4, None, None)
    with pytest.raises(ValueError, match="ghost"):
        bad = sgd(model)
        bad["state"]["ghost"] = {"momentum_buffer": np.zeros(1, F32)}
        save_checkpoint(tmp_path, model, bad, 4, None, None)
    assert steps(tmp_path) == ["step-000002", "step-000003"]


def test_resume_is_bitwise(tmp_path):
    """3 steps, save, load into a fresh model and a fresh stream, 3 steps == 6 steps."""
    V, T, B = 16, 8, 4
    rng = np.random.default_rng(0)
    shard = write_shard(tmp_path / "train.bin", rng.integers(0, V, 300).tolist(), vocab=V)

    def fresh():
        model = {"w": (np.random.default_rng(1).standard_normal((V, V)) * 0.1).astype(F32)}
        return model, adamw(model, lr=0.05)

    def train(model, opt, stream, n):
        for _ in range(n):
            x, y = stream.next_batch()
            _, g = bigram_grads(model["w"], x, y)
            adamw_step(model, {"w": g}, opt)

    model, opt = fresh()
    stream = TokenStream([shard], T, B, RefPCG32(5))
    train(model, opt, stream, 6)
    final_model, final_opt, final_cursor = model, opt, stream.cursor()

    model, opt = fresh()
    stream = TokenStream([shard], T, B, RefPCG32(5))
    train(model, opt, stream, 3)
    c = stream.cursor()
    save_checkpoint(
        tmp_path / "ckpt", model, opt, 3,
        {"state": int(c["rng"]["state"], 16), "inc": int(c["rng"]["inc"], 16)},
        {"tokens_seen": 3 * B * T, "data_cursor": {"shard": c["shard"], "offset": c["offset"]}, "lr": 0.05},
    )
    del model, opt, stream

    ck = load_checkpoint(tmp_path / "ckpt")
    model, opt = ck.model, ck.opt
    stream = TokenStream([shard], T, B, RefPCG32(999))
    r = ck.rng_state
    stream.restore({**ck.extra["data_cursor"], "rng": {"state": f"{r['state']:016x}", "inc": f"{r['inc']:016x}"}})
    train(model, opt, stream, 3)
    assert same_bits(model, final_model)
    assert_opt_equal(opt, final_opt)
    assert stream.cursor() == final_cursor


CRASH_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from tlio.checkpoint import save_checkpoint
    sys.path.insert(0, sys.argv[2])
    from _ckpt_helpers import linear_model, adamw
    m = linear_model()
    m["bias"][0] = 2.0
    save_checkpoint(sys.argv[1], m, adamw(m), 2, {"state": 9, "inc": 11},
                    {"tokens_seen": 2}, config={"run": "crash"})
    """
)


def _no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _assert_consistent(dir: Path):
    """Every step directory complete, LATEST naming one that verifies, load and the CLI
    agreeing."""
    for name in steps(dir):
        assert verify_step_dir(dir / name) == [], name
    latest = (dir / "LATEST").read_text()
    assert latest in ("step-000001\n", "step-000002\n")
    ck = load_checkpoint(dir)
    assert ck.path == str(dir / latest.strip())
    assert tlio("ckpt", "latest", str(dir)).stdout.strip() == ck.path
    tlio("ckpt", "verify", str(dir))
    return ck.step


def test_crash_at_every_write_keeps_a_valid_checkpoint(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CRASH_CHILD)
    helpers = str(Path(__file__).parent)
    env = {k: v for k, v in os.environ.items() if k != "FAILPOINTS"}
    counts = {}
    for point in ("ckpt/fsync", "ckpt/rename"):
        seen = set()
        for k in range(40):
            d = tmp_path / f"{point.replace('/', '_')}_{k}"
            m = linear_model()
            save_checkpoint(d, m, adamw(m), 1, None, None, config={"run": "crash"})
            out = subprocess.run(
                [sys.executable, str(script), str(d), helpers],
                env={**env, "FAILPOINTS": f"{point}={k}*off->return"},
                capture_output=True, text=True, timeout=120, preexec_fn=_no_core_dumps,
            )
            if out.returncode == 0:
                counts[point] = k
                assert _assert_consistent(d) == 2
                break
            # The failpoint aborts the process, as a crash would.
            assert out.returncode == -signal.SIGABRT, out.stderr
            loaded = _assert_consistent(d)
            seen.add(loaded)
            # The next save (without failpoints) repairs whatever the crash left: when
            # the crash came after LATEST's rename, step 2 is already declared.
            m2 = linear_model()
            m2["bias"][0] = 2.0
            save_checkpoint(
                d, m2, adamw(m2), 2, None, None, config={"run": "crash"}, overwrite=loaded == 2
            )
            assert load_checkpoint(d).step == 2
            assert not any(p.name.endswith(".tmp") for p in d.iterdir())
        else:
            raise AssertionError(f"{point} never let the save finish")
        # Before LATEST's rename the old step is loaded; after it (the last fsync), the new.
        assert seen == ({1, 2} if point == "ckpt/fsync" else {1}), (point, seen)
    # model, optimizer, state, config, manifest, the tmp directory, the parent after the
    # rename, LATEST.tmp, the parent after LATEST's rename.
    assert counts["ckpt/fsync"] >= 8, counts
    assert counts["ckpt/rename"] == 2, counts


def _save_steps(dir, ns):
    for n in ns:
        m = linear_model()
        m["bias"][0] = float(n)
        save_checkpoint(dir, m, adamw(m), n, None, {"tokens_seen": n})


def test_load_skips_incomplete_and_corrupt(tmp_path):
    _save_steps(tmp_path, [1, 2, 3])
    cli = lambda: tlio("ckpt", "latest", str(tmp_path), check=False)  # noqa: E731
    # A flipped byte in the newest: the one before it, saying why.
    flip(tmp_path / "step-000003" / "model.safetensors", 100)
    ck = load_checkpoint(tmp_path)
    assert ck.step == 2 and ck.model["bias"][0] == 2.0
    assert [s[0] for s in ck.skipped] == ["step-000003"]
    assert "model.safetensors" in ck.skipped[0][1] and "sha256" in ck.skipped[0][1]
    assert cli().stdout.strip() == ck.path
    # A missing manifest (a crash inside the save's step 2): skipped too.
    os.remove(tmp_path / "step-000002" / "MANIFEST.json")
    ck = load_checkpoint(tmp_path)
    assert ck.step == 1
    assert [s[0] for s in ck.skipped] == ["step-000003", "step-000002"]
    assert "MANIFEST.json" in ck.skipped[1][1]
    assert cli().stdout.strip() == ck.path
    # With a step: that one, or an error naming why (never another step).
    with pytest.raises(FileNotFoundError, match=r"step-000003: model\.safetensors"):
        load_checkpoint(tmp_path, step=3)
    assert load_checkpoint(tmp_path, step=1).skipped == []
    # A stale LATEST naming a step that does not exist: the newest complete one.
    (tmp_path / "LATEST").write_text("step-000009\n")
    assert load_checkpoint(tmp_path).step == 1
    # Nothing valid: FileNotFoundError naming each directory and why.
    flip(tmp_path / "step-000001" / "trainer_state.json", 2)
    with pytest.raises(FileNotFoundError) as e:
        load_checkpoint(tmp_path)
    for name in ("step-000001", "step-000002", "step-000003"):
        assert name in str(e.value)
    assert cli().returncode == 1
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nowhere")


def test_newer_than_latest_is_ignored(tmp_path):
    _save_steps(tmp_path, [5, 7, 9])
    # A crash between step 9's rename and LATEST: 9 is complete but was never declared.
    (tmp_path / "LATEST").write_text("step-000007\n")
    ck = load_checkpoint(tmp_path)
    assert ck.step == 7 and ck.skipped == []
    assert tlio("ckpt", "latest", str(tmp_path)).stdout.strip() == ck.path
    # Without LATEST, the newest complete directory wins.
    os.remove(tmp_path / "LATEST")
    assert load_checkpoint(tmp_path).step == 9
    assert tlio("ckpt", "latest", str(tmp_path)).stdout.strip().endswith("step-000009")
    # A save of the undeclared step replaces it without overwrite=True.
    (tmp_path / "LATEST").write_text("step-000007\n")
    m = linear_model()
    save_checkpoint(tmp_path, m, None, 9, None, {"tokens_seen": 99})
    assert load_checkpoint(tmp_path).extra["tokens_seen"] == 99
    # LATEST never moves backwards: an older step is refused naming LATEST's step, and
    # LATEST's own step needs overwrite=True.
    before = tree(tmp_path)
    with pytest.raises(ValueError, match="step-000009"):
        save_checkpoint(tmp_path, m, None, 8, None, None)
    with pytest.raises(ValueError, match="overwrite=True"):
        save_checkpoint(tmp_path, m, None, 9, None, None)
    assert tree(tmp_path) == before
    save_checkpoint(tmp_path, m, None, 9, None, {"tokens_seen": 100}, overwrite=True)
    assert load_checkpoint(tmp_path).extra["tokens_seen"] == 100


def test_keep_and_stale_tmp(tmp_path):
    (tmp_path / "step-000099.tmp").mkdir(parents=True)
    (tmp_path / "step-000099.tmp" / "model.safetensors").write_bytes(b"half")
    (tmp_path / "LATEST.tmp").write_text("step-000099\n")
    m = linear_model()
    for n in range(1, 6):
        save_checkpoint(tmp_path, m, None, n, None, None, keep=2)
        assert steps(tmp_path) == [step_name(k) for k in range(max(1, n - 1), n + 1)]
    assert not (tmp_path / "step-000099.tmp").exists() and not (tmp_path / "LATEST.tmp").exists()
    assert sorted(os.listdir(tmp_path)) == [".lock", "LATEST", "step-000004", "step-000005"]
    assert load_checkpoint(tmp_path).step == 5
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, m, None, 6, None, None, keep=0)


def test_rejects_bad_state(tmp_path):
    model, opt = trained_linear()
    d = tmp_path / "ckpt"
    fresh = tmp_path / "fresh"
    save_checkpoint(d, model, opt, 1, RNG, None)
    ok_extra = {"tokens_seen": 5}
    bad = [
        (dict(extra={"epoch": 1}), "epoch"),
        (dict(extra={"step": 2}), "step"),
        (dict(extra={"rng_state": None}), "rng_state"),
        (dict(rng_state={"state": 1, "inc": 2}), "even"),
        (dict(rng_state={"state": -1, "inc": 3}), "rng_state"),
        (dict(rng_state={"state": 1, "inc": 3, "x": 0}), "rng_state"),
        (dict(extra={"data_cursor": {"shard": 0, "offset": -1}}), "offset|invalid"),
        (dict(extra={"data_cursor": {"shard": 0, "offset": 1, "rng": {}}}), "rng"),
        (dict(extra={"git_sha": "abc123"}), "git_sha"),
        (dict(extra={"tokens_seen": -5}), "tokens_seen|invalid"),
        (dict(extra={"lr": float("nan")}), "lr|NaN|nan|float"),
        (dict(step=-1), "step|invalid"),
        (dict(step=1.5), "step"),
        (dict(step=True), "step"),
        (dict(model={**model, "weight": model["weight"].astype(np.float64)}), "weight.*float64"),
        (dict(model={"weight": [1.0]}), "weight"),
        (dict(opt={**opt, "type": "adam"}), "optimizer|adam"),
        (dict(opt={**opt, "state": {**opt["state"], "ghost": opt["state"]["bias"]}}), "ghost"),
        (dict(opt={**opt, "state": {"weight": opt["state"]["weight"]}}), "bias"),
        (dict(config={"x": float("inf")}), "config"),
        (dict(keep=-1), "keep"),
    ]
    for kw, word in bad:
        args = dict(model=model, opt=opt, step=2, rng_state=RNG, extra=ok_extra)
        args.update(kw)
        for target in (d, fresh):
            before = tree(d)
            with pytest.raises(ValueError, match=word):
                save_checkpoint(target, **args)
            assert tree(d) == before, kw
            assert not fresh.exists(), kw
    # The same arguments with the bad field fixed save fine.
    save_checkpoint(d, model, opt, 2, RNG, ok_extra)
    assert load_checkpoint(d).step == 2


def test_held_lock_is_an_oserror(tmp_path):
    m = linear_model()
    save_checkpoint(tmp_path, m, None, 1, None, None)
    with open(tmp_path / ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        start = time.monotonic()
        with pytest.raises(OSError) as e:
            save_checkpoint(tmp_path, m, None, 2, None, None)
        assert time.monotonic() - start >= 25  # it waited for the other writer first
    assert e.value.errno is not None and "locked" in str(e.value)
    assert not isinstance(e.value, FileNotFoundError)
    assert steps(tmp_path) == ["step-000001"]
    save_checkpoint(tmp_path, m, None, 2, None, None)


def test_ranked_cursor_roundtrips_through_a_checkpoint(tmp_path):
    shard = write_shard(tmp_path / "a.bin", list(range(200)), vocab=256)
    streams = [TokenStream([shard], 4, 3, RefPCG32(2), rank=r, world_size=2) for r in range(2)]
    for s in streams:
        s.next_batch()
    c = streams[0].cursor()
    data = {k: c[k] for k in ("shard", "offset", "global_batch")}
    rng = {k: int(c["rng"][k], 16) for k in ("state", "inc")}
    save_checkpoint(tmp_path / "ck", linear_model(), None, 1, rng, {"data_cursor": data})
    ck = load_checkpoint(tmp_path / "ck")
    assert ck.extra["data_cursor"] == data and ck.rng_state == rng
    hexed = {k: f"{v:016x}" for k, v in ck.rng_state.items()}
    # Elastic: three ranks of two continue the global batch of six.
    three = [TokenStream([shard], 4, 2, RefPCG32(0), rank=r, world_size=3) for r in range(3)]
    for s in three:
        s.restore({**ck.extra["data_cursor"], "rng": hexed})
    union = np.concatenate([s.next_batch()[0] for s in three])
    assert np.array_equal(union, np.concatenate([s.next_batch()[0] for s in streams]))
    # A global batch of zero is refused before anything is written.
    before = tree(tmp_path / "ck")
    with pytest.raises(ValueError):
        save_checkpoint(tmp_path / "ck", linear_model(), None, 2, rng,
                        {"data_cursor": {**data, "global_batch": 0}})
    assert tree(tmp_path / "ck") == before


def test_a_fifo_where_the_checkpoint_directory_should_be_is_named(tmp_path):
    """A FIFO given as the run directory, or as its parent, is NotADirectoryError naming
    what it is (never the system's "File exists"), and saving waits on nothing."""
    model, opt = trained_linear()
    extra = {"tokens_seen": 0, "lr": 0.01}
    fifo = tmp_path / "run"
    os.mkfifo(fifo)
    for where, named in ((fifo, "not a directory but a FIFO"), (fifo / "sub", f"{fifo} is not a directory but a FIFO")):
        with pytest.raises(NotADirectoryError, match=named):
            save_checkpoint(where, model, opt, 1, RNG, extra)
        with pytest.raises(NotADirectoryError, match="FIFO"):
            load_checkpoint(where)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
