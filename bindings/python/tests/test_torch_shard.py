"""Sharded checkpoints of tlio.torch (scale.md section 1) under torchrun with gloo on CPU:
a state of DTensors saved by every rank reloads bit for bit into other world sizes and
layouts (FSDP2 4 -> 2 ranks, FSDP2 -> tensor parallel, 1-D -> 2-D meshes, HSDP, sharded ->
one plain process, plain -> FSDP2); a flipped byte in one rank's file makes every rank
fall back to the older step; a save failing on one rank raises on every rank and commits
nothing, a full disk as an OSError with its errno on every rank (the failure travels as
a JSON record whose class names an allow-list); the optimizer's groups match by names; the FSDP2 example killed at any instant
(between saves, inside a rank's write, between the step's rename and LATEST) resumes
bitwise."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch  # in requirements-test.txt: a missing torch fails the run, never skips it
from hypothesis import given, settings
from hypothesis import strategies as st

import tlio.torch as tt
from tlio._torch_shard import assign_writers
from _tokens_helpers import ROOT, tlio
from test_torch_dist import RESTARTABLE, TIMEOUT, Launch, _env, _no_core_dumps, _written_since, torchrun

HERE = Path(__file__).parent
CHILD = HERE / "_torch_shard_child.py"
sys.path.insert(0, str(HERE))
import _torch_shard_child as child  # noqa: E402

torch.set_num_threads(1)


def run_ranks(tmp: Path, nproc: int, mode: str, *args: str) -> dict:
    """The child under torchrun with ``nproc`` ranks: {rank: its report}."""
    report = tmp / f"report-{mode}"
    out = subprocess.run(torchrun(nproc, str(CHILD), mode, str(report), *args), capture_output=True, text=True,
                         timeout=TIMEOUT, env=_env(), preexec_fn=_no_core_dumps)
    assert out.returncode == 0, out.stderr[-4000:]
    return {r: json.loads(Path(f"{report}.{r}").read_text()) for r in range(nproc)}


def plain(dir: Path, step=None):
    """A plain net and AdamW (no torch.distributed) loaded from ``dir``: (checkpoint, digests)."""
    net = child.Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    ck = tt.load(dir, net, opt, step=step)
    return ck, net, opt, child.digests(net, opt)


def test_sharded_checkpoint_reshards_into_every_layout_bitwise(tmp_path):
    sharded, resaved, unsharded = tmp_path / "fsdp4", tmp_path / "fsdp2", tmp_path / "plain"
    four = run_ranks(tmp_path, 4, "save4", str(sharded))
    saved = four[0]["saved"]
    assert len(saved) == 9 + 21 + 1  # 9 state_dict entries (the tie twice), 7 params x 3, 1 group
    for r in range(4):
        assert four[r]["path"] == str(sharded / "step-000001")
        assert four[r]["saved"] == saved
        # 1-D FSDP2 at 4 ranks -> 2-D meshes at 4 ranks: HSDP (2 x 2) and FSDP x TP (2 x 2).
        assert four[r]["hsdp_step"] == four[r]["fsdp_tp_step"] == 1
        assert four[r]["hsdp"] == saved and four[r]["fsdp_tp"] == saved, r
    step = sharded / "step-000001"
    names = sorted(os.listdir(step))
    # Every rank wrote files of its own; the small files are rank 0's.
    assert [n for n in names if n.startswith("model-")] == [f"model-rank0000{r}.safetensors" for r in range(4)]
    assert [n for n in names if n.startswith("optimizer-")] == [f"optimizer-rank0000{r}.safetensors" for r in range(4)]
    table = json.loads((step / "shards.json").read_text())
    chunks = {(t["group"], t["name"]): t["chunks"] for t in table["tensors"]}
    # A sharded tensor: one chunk per rank; a replicated one (the buffer, a step count):
    # one chunk, written once.
    assert len(chunks[("model", "up.weight")]) == 4 and len(chunks[("model", "scale")]) == 1
    assert len(chunks[("optimizer", "up.weight.step")]) == 1
    assert ("model", "head.weight") not in chunks  # tied: stored once
    tlio("ckpt", "verify", str(sharded))

    # Sharded (4 ranks) -> one plain process without torch.distributed, and saved plainly.
    ck, net, opt, got = plain(sharded)
    assert ck.step == 1 and ck.extra["tokens_seen"] == 7 and got == saved
    assert net.head.weight is net.emb.weight
    tt.save(unsharded, 1, net, opt, extra={"tokens_seen": 7})

    two = run_ranks(tmp_path, 2, "reshard", str(sharded), str(unsharded), str(resaved))
    for r in range(2):
        # FSDP2 4 -> 2 ranks, FSDP2 -> tensor parallel, 1-D -> a 1 x 2 FSDP x TP mesh,
        # plain -> FSDP2; then the 2-rank FSDP2 state saved and reloaded as tensor parallel.
        for layout in ("fsdp", "tp", "fsdp_tp", "plain_fsdp"):
            assert two[r][f"{layout}_step"] == [1, 7], layout
            assert two[r][layout] == saved, (r, layout)
        assert two[r]["tp_of_resaved"] == saved
    # Sharded (2 ranks) -> a plain process.
    assert plain(resaved)[3] == saved
    tlio("ckpt", "verify", str(resaved))


def test_sharded_faults_fall_back_or_raise_on_every_rank(tmp_path):
    dir = tmp_path / "ckpt"
    ranks = run_ranks(tmp_path, 2, "faults", str(dir))
    r0, r1 = ranks[0], ranks[1]
    # A byte flipped in step 2's rank-1 file: every rank loaded step 1, and its state.
    assert r0["flipped_load"] == r1["flipped_load"] == ["ok", 1]
    assert r0["flipped_state"] == r1["flipped_state"] == r0["step1"]
    # A save failing on rank 1 alone: both raise, rank 0 naming rank 1; nothing committed.
    assert r1["one_rank_fails"][0] == r0["one_rank_fails"][0] == "ValueError"
    assert "bad.key" in r1["one_rank_fails"][1]
    assert r0["one_rank_fails"][1] == "on rank 1: " + r1["one_rank_fails"][1]
    for r in (r0, r1):
        # (rank 0 removed step-000003.tmp; the core's removal is best effort, and the
        # next save of the step clears a leftover, checked below)
        assert "step-000003" not in r["after_failure"]
        # The lock was released: the same save then succeeds.
        assert r["save_again"] == ["ok", str(dir / "step-000003")]
        # Param groups listing their params in another order load by names.
        assert r["reordered"] == ["ok", 3] and r["reordered_state"] == r0["saved3"]
    assert not (dir / "step-000003.tmp").exists()
    bad = tlio("ckpt", "verify", str(dir / "step-000002"), check=False)
    assert bad.returncode == 1 and "model-rank00001.safetensors sha256 mismatch" in bad.stdout + bad.stderr


def test_a_full_disk_on_one_rank_raises_its_errno_on_every_rank(tmp_path):
    dir = tmp_path / "ckpt"
    ranks = run_ranks(tmp_path, 2, "full_disk", str(dir))
    mine, theirs = ranks[0]["save"], ranks[1]["save"]
    # Rank 0's own error: an OSError with the errno of the failed write, naming the file.
    assert mine["os_error"] and mine["errno"] == errno.EFBIG and "model-rank00000" in mine["message"], mine
    # Rank 1 raises the same class with the same errno and file name, its message
    # naming the rank that failed.
    assert theirs["os_error"] and theirs["type"] == mine["type"], theirs
    assert theirs["errno"] == mine["errno"] and theirs["filename"] == mine["filename"], (theirs, mine)
    assert theirs["strerror"] == "on rank 0: " + mine["strerror"]
    assert theirs["message"] == f"[Errno {errno.EFBIG}] on rank 0: {mine['strerror']}", theirs
    # Nothing committed.
    assert ranks[0]["after"] == ranks[1]["after"] and "step-000001" not in ranks[0]["after"]


class Unlisted(Exception):
    pass


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device", "/d/model-rank00000.safetensors"),
    FileNotFoundError(errno.ENOENT, "No such file or directory", "/d/x"),
    PermissionError(errno.EACCES, "Permission denied", b"/d/bytes-name"),
    IsADirectoryError(errno.EISDIR, "Is a directory"),
    OSError("no errno"),
    ValueError("bad value"),
    TypeError("bad type"),
], ids=lambda e: type(e).__name__)
def test_a_failure_record_rebuilds_the_class_and_errno_on_another_rank(error):
    from tlio._torch_dist import rebuild, record

    got = rebuild(3, record(error))
    assert type(got) is type(error)
    if isinstance(error, OSError) and error.errno is not None:
        assert got.errno == error.errno and got.strerror == f"on rank 3: {error.strerror}"
        assert got.filename == (None if error.filename is None else os.fsdecode(error.filename))
        assert str(got).startswith(f"[Errno {error.errno}] on rank 3: {error.strerror}")
    else:
        assert str(got) == f"on rank 3: {error}" and getattr(got, "errno", None) is None


def test_a_failure_of_another_class_is_a_runtime_error_naming_it():
    from tlio._torch_dist import rebuild, record

    got = rebuild(1, record(Unlisted("odd")))
    assert type(got) is RuntimeError and str(got) == "on rank 1: Unlisted: odd"
    # A name outside the allow-list never selects a class, builtin or not.
    got = rebuild(1, json.dumps({"type": "SystemExit", "message": "x"}))
    assert type(got) is RuntimeError and str(got) == "on rank 1: SystemExit: x"
    for bad in ("not json", json.dumps(["OSError"]), json.dumps({"type": 1, "message": "m"}), None):
        got = rebuild(2, bad)
        assert type(got) is RuntimeError and str(got).startswith("on rank 2: "), bad
    got = rebuild(0, json.dumps({"type": "OSError", "message": "m", "errno": "28", "filename": 5}))
    assert type(got) is OSError and got.errno is None and got.filename is None


@st.composite
def holdings(draw):
    """Every rank's chunk entries: chunks of random sizes, each held by a random non-empty
    set of ranks (a replica on each), listed in a random order per rank."""
    world = draw(st.integers(1, 5))
    chunks = draw(st.lists(st.tuples(st.integers(0, 1000), st.sets(st.integers(0, world - 1), min_size=1)),
                           min_size=1, max_size=12))
    entries = [[] for _ in range(world)]
    for i, (nbytes, holders) in enumerate(chunks):
        for r in holders:
            entries[r].append(["model", f"t{i}", "U8", [nbytes], [0], [nbytes], nbytes])
    for mine in entries:
        draw(st.randoms()).shuffle(mine)
    return world, chunks, entries


@given(holdings())
@settings(max_examples=200, deadline=None)
def test_every_chunk_has_one_writer_among_its_holders(case):
    world, chunks, entries = case
    writer = assign_writers(entries)
    assert len(writer) == len(chunks)
    load = [0] * world
    for i, (nbytes, holders) in enumerate(chunks):
        r = writer[("model", f"t{i}", (0,), (nbytes,))]
        assert r in holders
        load[r] += nbytes
    # The same answer whatever order each rank lists its chunks in.
    assert assign_writers([sorted(m) for m in entries]) == writer
    # Chunks every rank holds: no rank ends more than the largest of them above another.
    if all(len(h) == world for _, h in chunks):
        assert max(load) - min(load) <= max(n for n, _ in chunks)


def test_writers_refuse_ranks_disagreeing_on_a_tensor():
    a = ["model", "w", "F32", [4, 2], [0, 0], [2, 2], 16]
    b = ["model", "w", "F32", [4, 3], [2, 0], [2, 3], 24]
    with pytest.raises(ValueError, match=r"'w' is F32 \[4, 2\] on rank 0 but F32 \[4, 3\] on rank 1"):
        assign_writers([[a], [b]])


def test_param_group_order_does_not_matter(tmp_path):
    """An unsharded save loads into an optimizer whose groups list the same params in
    another order (each group matched by its set of names)."""
    torch.manual_seed(0)
    net = child.Net()
    params = dict(net.named_parameters())
    a, b = ["emb.weight", "up.weight", "up.bias"], ["down.weight", "down.bias", "norm.weight", "norm.bias"]
    opt = torch.optim.AdamW([{"params": [params[n] for n in a]}, {"params": [params[n] for n in b], "lr": 0.5}])
    child.train(net, opt)
    tt.save(tmp_path, 1, net, opt)
    want = child.digests(net, opt)
    torch.manual_seed(1)
    net2 = child.Net()
    p2 = dict(net2.named_parameters())
    opt2 = torch.optim.AdamW([{"params": [p2[n] for n in a[::-1]]}, {"params": [p2[n] for n in b[::-1]]}])
    assert tt.load(tmp_path, net2, opt2).step == 1
    assert child.digests(net2, opt2) == want
    assert opt2.param_groups[1]["lr"] == 0.5


EXAMPLE = ROOT / "examples" / "train_fsdp.py"


def test_fsdp_example_killed_anywhere_resumes_bitwise(tmp_path):
    """train_fsdp.py at 2 ranks: one rank SIGKILLed inside its own shard write (both ranks
    held at their first fsync of the save), rank 0 killed between the step's rename and
    LATEST's, then a kill between saves that torchrun answers by restarting both workers:
    every (re)start resumes both ranks from the same step, and the end is bitwise the
    uninterrupted run's."""
    shard = tmp_path / "train.bin"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", str(shard))
    every = 5
    base = ["--shard", str(shard), "--layout", "fsdp", "--steps", "20", "--every", str(every)]
    full = subprocess.run(torchrun(2, str(EXAMPLE), *base, "--out", str(tmp_path / "full")), capture_output=True,
                          text=True, timeout=TIMEOUT, env=_env())
    assert full.returncode == 0, full.stderr[-3000:]
    want = full.stdout.splitlines()[-1]
    assert want.startswith("sha256 state_dict=")
    out = tmp_path / "killed"
    args = [*base, "--out", str(out), "--resume"]

    def picked() -> int:
        got = tlio("ckpt", "latest", str(out), check=False)
        return int(Path(got.stdout.strip()).name.removeprefix("step-")) if got.returncode == 0 else 0

    rnd = random.Random(34)
    start = 0
    # (failpoint, the file whose appearance says the ranks are held, the rank to kill)
    pins = [
        # every rank's first fsync of the launch is inside its first save: rank 1's is its
        # model file's, written but not yet durable
        ("ckpt/fsync=0*off->1*sleep(600000)->off", lambda at: out / f"step-{at:06d}.tmp" / "model-rank00001.safetensors", 1),
        # rank 0's rename 1 of the launch is LATEST's: the step directory is renamed
        ("ckpt/rename=1*off->1*sleep(600000)->off", lambda at: out / f"step-{at:06d}", 0),
    ]
    for point, held_at, rank in pins:
        deadline = time.monotonic() + TIMEOUT
        t0 = time.time()
        run = Launch(tmp_path, args, _env(FAILPOINTS=point), script=EXAMPLE)
        try:
            assert run.start_of_both(deadline) == start
            at = start + every
            held = held_at(at)
            while not _written_since(held, t0):
                assert run.p.poll() is None and time.monotonic() < deadline, run.why()
                time.sleep(0.01)
            os.kill(run.pid(rank), signal.SIGKILL)
            assert run.finish(deadline) != 0, run.why()
        finally:
            run.close()
        # Killed inside the save: its step was never declared, so it is not resumed,
        # unless nothing was declared before and the step directory is whole.
        assert picked() == (at if point.startswith("ckpt/rename") and start == 0 else start), sorted(os.listdir(out))
        start = picked()

    deadline = time.monotonic() + TIMEOUT
    rank, at = rnd.randrange(2), rnd.choice([s for s in range(start + 1, 19) if s % every])
    run = Launch(tmp_path, args, _env(**RESTARTABLE), restarts=1, script=EXAMPLE)
    try:
        assert run.start_of_both(deadline) == start
        run.until(lambda line: line.startswith(f"rank {rank} step {at} "), f"step {at} on rank {rank}", deadline)
        os.kill(run.pid(rank), signal.SIGKILL)
        again = run.start_of_both(deadline)
        assert (at - 1) // every * every <= again <= at, (at, again)
        assert run.finish(deadline) == 0, run.why()
    finally:
        run.close()
    assert run.seen[-1] == want
    tlio("ckpt", "verify", str(out))
