"""Async tlio.torch.save on one process (scale.md section 2): the files are a blocking
save's byte for byte, the state is really copied when save returns, a background error
is raised by wait() and otherwise by the next save or load (once), the interpreter's
exit completes a pending save, 50 saves keep the resident set flat, and the example
killed inside a background write resumes bitwise."""

from __future__ import annotations

import fcntl
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

import tlio.torch as tt
from tlio.pcg import PCG32
from tlio.tokens import TokenStream
from _tokens_helpers import ROOT, tlio, write_shard
from test_torch import assert_same, odd_setup, odd_step
from test_torch_dist import TIMEOUT, Launch, _env, _no_core_dumps, _written_since, torchrun

HERE = Path(__file__).parent
CHILD = HERE / "_torch_async_child.py"
EXAMPLE = ROOT / "examples" / "train_torch.py"

torch.set_num_threads(1)


def files(step_dir) -> dict:
    """{file name: bytes} of a step directory."""
    return {p.name: p.read_bytes() for p in sorted(Path(step_dir).iterdir())}


def snapshot(m, opt):
    return ({k: v.clone() for k, v in m.state_dict().items()},
            {k: v for k, v in opt.state_dict().items()})


def test_async_save_writes_the_files_a_blocking_save_writes(tmp_path):
    shard = write_shard(tmp_path / "shard.bin", [random.Random(3).randrange(10) for _ in range(500)], vocab=10)
    m, opt = odd_setup(0)
    stream = TokenStream([str(shard)], 4, 2, PCG32(5))
    for step in range(1, 5):
        odd_step(m, opt, step)
        stream.next_batch()
        kw = dict(extra={"tokens_seen": 8 * step, "lr": 0.01}, config={"n": step}, keep=2)
        want = tt.save(tmp_path / "blocking", step, m, opt, stream, **kw)
        p = tt.save(tmp_path / "async", step, m, opt, stream, blocking=False, **kw)
        assert isinstance(p, tt.PendingSave)
        got = p.wait()
        assert p.done() and p.wait() == got == str(tmp_path / "async" / f"step-{step:06d}")
        assert files(got) == files(want), step
    # The staged buffers were reused for steps 2..4 (the same tensors), and keep acted
    # after each commit: the same steps are left, LATEST names the same one.
    for d in ("blocking", "async"):
        assert sorted(os.listdir(tmp_path / d)) == [".lock", "LATEST", "step-000003", "step-000004"], d
    assert (tmp_path / "async" / "LATEST").read_bytes() == (tmp_path / "blocking" / "LATEST").read_bytes()
    tlio("ckpt", "verify", str(tmp_path / "async"))


def test_blocking_must_be_a_bool(tmp_path):
    m, opt = odd_setup(0)
    with pytest.raises(ValueError, match="blocking must be True or False"):
        tt.save(tmp_path, 1, m, opt, blocking=0)
    assert not tmp_path.joinpath("step-000001").exists()


class Held:
    """The checkpoint directory's lock held by this test (as another writer would hold
    it): a save waits for it, so its background write cannot start before release."""

    def __init__(self, dir: Path):
        dir.mkdir(parents=True, exist_ok=True)
        self.f = open(dir / ".lock", "a+")
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def release(self):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def test_staging_copies_so_later_updates_never_reach_the_files(tmp_path):
    m, opt = odd_setup(0)
    odd_step(m, opt, 1)
    want_model, want_opt = snapshot(m, opt)
    want_opt = {"state": {i: {k: v.clone() for k, v in s.items()} for i, s in want_opt["state"].items()},
                "param_groups": want_opt["param_groups"]}
    held = Held(tmp_path)
    try:
        p = tt.save(tmp_path, 1, m, opt, blocking=False)
        # Everything the save read is changed in place while its write waits: parameters,
        # buffers, the optimizer's moments and step counts (all CPU tensors).
        odd_step(m, opt, 2)
        with torch.no_grad():
            for t in list(m.state_dict().values()):
                if t.dtype != torch.bool and t.is_floating_point():
                    t.add_(1)
            for s in opt.state.values():
                for v in s.values():
                    if isinstance(v, torch.Tensor):
                        v.add_(7)
        time.sleep(0.1)
        assert not p.done()
    finally:
        held.release()
    path = p.wait()
    m2, opt2 = odd_setup(1)
    assert tt.load(tmp_path, m2, opt2).path == path
    assert_same(want_model, m2.state_dict(), "model")
    assert_same(want_opt, opt2.state_dict(), "optimizer")


def test_background_failure_is_raised_by_wait_then_by_the_next_save_or_load(tmp_path):
    m, opt = odd_setup(0)
    odd_step(m, opt, 1)
    (tmp_path / "file").write_bytes(b"not a directory")
    bad, good = tmp_path / "file" / "ckpt", tmp_path / "good"
    # The call stages and returns; the write fails in the background (the directory
    # cannot be made under a file).
    p = tt.save(bad, 1, m, opt, blocking=False)
    with pytest.raises(OSError, match="file"):
        p.wait()
    with pytest.raises(OSError):  # a PendingSave keeps its outcome
        p.wait()
    assert tt.save(good, 1, m, opt).endswith("step-000001")  # raised once: wait() saw it

    p = tt.save(bad, 2, m, opt, blocking=False)
    with pytest.raises(OSError, match="file"):
        tt.save(good, 2, m, opt, blocking=False)  # nothing is saved: the error comes first
    assert not (good / "step-000002").exists() and not (good / "step-000002.tmp").exists()
    assert tt.save(good, 2, m, opt, blocking=False).wait().endswith("step-000002")
    with pytest.raises(OSError):
        p.wait()

    p = tt.save(bad, 3, m, opt, blocking=False)
    with pytest.raises(OSError, match="file"):
        tt.load(good, *odd_setup(2))
    assert tt.load(good, *odd_setup(2)).step == 2
    assert p.done()


def test_failure_inside_a_background_write_is_raised_and_leaves_the_previous_step(tmp_path):
    dir = tmp_path / "ckpt"
    m, opt = odd_setup(0)
    tt.save(dir, 1, m, opt)
    want = snapshot(m, opt)[0]
    out = subprocess.run([sys.executable, str(CHILD), "fail", str(dir)], capture_output=True, text=True,
                         timeout=TIMEOUT, env=_env(FAILPOINTS="ckpt/fsync=1*sleep(6000)->off"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done before wait: False" in out.stdout, out.stdout
    assert "raised FileNotFoundError" in out.stdout and "step-000002.tmp" in out.stdout, out.stdout
    m2, opt2 = odd_setup(1)
    assert tt.load(dir, m2, opt2).step == 1
    assert_same(want, m2.state_dict())
    tlio("ckpt", "verify", str(dir))


def test_latest_and_keep_act_only_after_the_background_commit(tmp_path):
    """While an async save with keep=1 is held inside its write, LATEST names the previous
    step, which nothing removes, and gc cannot run (the save holds the lock); once the
    step is committed, LATEST names it and keep removes the older step."""
    dir = tmp_path / "ckpt"
    m, opt = odd_setup(0)
    tt.save(dir, 1, m, opt)
    t0 = time.time()
    p = subprocess.Popen([sys.executable, str(CHILD), "keep", str(dir)], stdout=subprocess.PIPE, text=True,
                         env=_env(FAILPOINTS="ckpt/fsync=1*sleep(6000)->off"))
    try:
        assert p.stdout.readline() == "staged\n"
        tmp = dir / "step-000002.tmp"
        deadline = time.monotonic() + TIMEOUT
        while not _written_since(tmp / "model.safetensors", t0):
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        gc = tlio("ckpt", "gc", "--keep", "1", str(dir), check=False)
        assert gc.returncode != 0 and "lock" in gc.stderr, gc.stderr
        assert tmp.is_dir() and (dir / "step-000001").is_dir()
        assert (dir / "LATEST").read_text().strip() == "step-000001"
        assert p.stdout.readline().strip() == str(dir / "step-000002")
        assert p.wait(timeout=TIMEOUT) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
    assert sorted(os.listdir(dir)) == [".lock", "LATEST", "step-000002"]
    assert (dir / "LATEST").read_text().strip() == "step-000002"


def test_interpreter_exit_completes_a_pending_save(tmp_path):
    dir = tmp_path / "ckpt"
    # The first fsync holds the write for a second: the interpreter reaches its exit
    # with the save in flight.
    out = subprocess.run([sys.executable, str(CHILD), "exit", str(dir)], capture_output=True, text=True,
                         timeout=TIMEOUT, env=_env(FAILPOINTS="ckpt/fsync=1*sleep(1000)->off"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "in flight at exit: True"
    assert (dir / "LATEST").read_text().strip() == "step-000001"
    tlio("ckpt", "verify", str(dir))


def test_fifty_async_saves_keep_the_resident_set_flat(tmp_path):
    out = subprocess.run([sys.executable, str(CHILD), "rss", str(tmp_path / "ckpt"), "50"], capture_output=True,
                         text=True, timeout=TIMEOUT, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    # The state: parameters and AdamW's two moments, 3 x 4 MiB. A staged copy kept per
    # save would add 49 states (600 MiB). The buffers are reused: what the first saves
    # add (the allocator's arenas of the writing threads, about 20 MiB here) stays, and
    # the second half of the loop adds nothing to the first half's (8 MiB of noise).
    mib = [r >> 20 for r in rss]
    assert max(mib[1:]) - mib[0] < 48, mib
    assert max(mib[25:]) - max(mib[1:25]) < 12, mib
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".lock", "LATEST", "step-000049", "step-000050"]


def test_example_killed_inside_a_background_write_resumes_bitwise(tmp_path):
    """train_torch.py --async-save on one process: killed while a failpoint holds a
    background write (step-N.tmp there, the previous step committed); the resumed run
    ends with the digests of an uninterrupted blocking run."""
    shard = tmp_path / "train.bin"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", str(shard))
    every = 10
    base = [sys.executable, str(EXAMPLE), "--shard", str(shard), "--steps", "30", "--every", str(every)]
    full = subprocess.run([*base, "--out", str(tmp_path / "full")], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env(), check=True)
    want = full.stdout.splitlines()[-1]
    assert want.startswith("sha256 state_dict=")
    out = tmp_path / "killed"
    args = [*base, "--out", str(out), "--resume", "--async-save"]
    first = subprocess.run([*args, "--steps", str(every)], capture_output=True, text=True, timeout=TIMEOUT,
                           env=_env(), check=True)
    assert first.stdout.splitlines()[0].endswith("start 0")
    assert (out / "LATEST").read_text().strip() == "step-000010"

    # The launch's first fsync is in its first save's background write (step 20).
    t0 = time.time()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_no_core_dumps,
                         env=_env(FAILPOINTS="ckpt/fsync=0*off->1*sleep(600000)->off"))
    try:
        assert p.stdout.readline().endswith("start 10\n")
        held = out / "step-000020.tmp" / "model.safetensors"
        deadline = time.monotonic() + TIMEOUT
        while not _written_since(held, t0):
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-3000:]
            time.sleep(0.01)
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=TIMEOUT)
    assert p.returncode == -signal.SIGKILL
    assert (out / "LATEST").read_text().strip() == "step-000010" and not (out / "step-000020").exists()

    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), check=True)
    assert done.stdout.splitlines()[-1] == want
    tlio("ckpt", "verify", str(out))


# --- torch.distributed: 2 gloo ranks under torchrun -------------------------------------

DIST_CHILD = HERE / "_torch_async_dist_child.py"
FSDP_EXAMPLE = ROOT / "examples" / "train_fsdp.py"


def test_async_saves_on_two_ranks_write_the_blocking_files_and_fail_on_every_rank(tmp_path):
    """FSDP2 (the sharded save) and a plain replicated net (the DDP path, rank 0 writes),
    2 ranks: async files == blocking files, also for a save whose commit waited while the
    loop trained on with its own collectives; a background failure raised by every rank's
    wait(); the next save works."""
    report, dir = tmp_path / "report", tmp_path / "ck"
    out = subprocess.run(torchrun(2, str(DIST_CHILD), "ranks", str(report), str(dir)), capture_output=True,
                         text=True, timeout=TIMEOUT, env=_env(), preexec_fn=_no_core_dumps)
    assert out.returncode == 0, out.stderr[-4000:]
    r0, r1 = (json.loads(Path(f"{report}.{r}").read_text()) for r in (0, 1))
    for kind in ("fsdp", "plain"):
        for r in (r0, r1):
            assert r[f"{kind}_async_type"] == "PendingSave"
            for what in ("blocking", "async", "held"):
                assert r[f"{kind}_{what}"] == str(dir / f"{kind}-{what}" / "step-000001")
            assert r[f"{kind}_held_done_while_held"] is False
            assert r[f"{kind}_saved"] == r0[f"{kind}_saved"]
            assert r[f"{kind}_again"] == ["ok", str(dir / f"{kind}-async" / "step-000002")]
        want = files(dir / f"{kind}-blocking" / "step-000001")
        assert files(dir / f"{kind}-async" / "step-000001") == want, kind
        assert files(dir / f"{kind}-held" / "step-000001") == want, kind
        sharded = [n for n in want if n.startswith("model-rank")]
        assert sharded == (["model-rank00000.safetensors", "model-rank00001.safetensors"] if kind == "fsdp" else [])
        kind0, message0 = r0[f"{kind}_failed"]
        assert kind0 in ("NotADirectoryError", "FileExistsError", "OSError") and "file" in message0, r0
        # The same class and errno on rank 1: Python formats the message from the fields,
        # the rank before the strerror.
        assert message0.startswith("[Errno "), message0
        assert r1[f"{kind}_failed"] == [kind0, message0.replace("] ", "] on rank 0: ", 1)]
        tlio("ckpt", "verify", str(dir / f"{kind}-async"))


def test_fsdp_example_killed_inside_a_background_write_resumes_bitwise(tmp_path):
    """train_fsdp.py --async-save at 2 ranks: rank 1 SIGKILLed while a failpoint holds both
    ranks' background writes of a save (step-N.tmp holding rank 1's file), the previous
    step committed; the relaunch resumes both ranks from that step and ends with the
    digests of an uninterrupted blocking run."""
    shard = tmp_path / "train.bin"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", str(shard))
    every = 5
    base = ["--shard", str(shard), "--layout", "fsdp", "--steps", "15", "--every", str(every)]
    full = subprocess.run(torchrun(2, str(FSDP_EXAMPLE), *base, "--out", str(tmp_path / "full")),
                          capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert full.returncode == 0, full.stderr[-3000:]
    want = full.stdout.splitlines()[-1]
    assert want.startswith("sha256 state_dict=")
    out = tmp_path / "killed"
    args = [*base, "--out", str(out), "--resume", "--async-save"]
    first = subprocess.run(torchrun(2, str(FSDP_EXAMPLE), *args, "--steps", str(every)),
                           capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert first.returncode == 0, first.stderr[-3000:]
    assert (out / "LATEST").read_text().strip() == "step-000005"

    # Every rank's first fsync of the launch is in its first save's background write.
    deadline = time.monotonic() + TIMEOUT
    t0 = time.time()
    run = Launch(tmp_path, args, _env(FAILPOINTS="ckpt/fsync=0*off->1*sleep(600000)->off"), script=FSDP_EXAMPLE)
    try:
        assert run.start_of_both(deadline) == every
        held = out / "step-000010.tmp" / "model-rank00001.safetensors"
        while not _written_since(held, t0):
            assert run.p.poll() is None and time.monotonic() < deadline, run.why()
            time.sleep(0.01)
        os.kill(run.pid(1), signal.SIGKILL)
        assert run.finish(deadline) != 0, run.why()
    finally:
        run.close()
    assert (out / "LATEST").read_text().strip() == "step-000005" and not (out / "step-000010").exists()

    done = subprocess.run(torchrun(2, str(FSDP_EXAMPLE), *args), capture_output=True, text=True, timeout=TIMEOUT,
                          env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    starts = sorted((line.split()[1], line.split()[-1]) for line in lines if " start " in line)
    assert starts == [("0", "5"), ("1", "5")], starts
    assert lines[-1] == want
    tlio("ckpt", "verify", str(out))
