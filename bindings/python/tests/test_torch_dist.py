"""tlio.torch under torch.distributed (python.md, ``tlio.torch``): the collective save and
load on 2 gloo ranks under torchrun, a rank 0 killed in the middle of a save, the
example's MS-L0 (SIGKILL at seeded instants, resumed: the same final digests) on one
process and on 2 ranks (one rank killed, torchrun relaunched, and once restarting its
workers itself), and the elastic resumption of a checkpointed stream."""

from __future__ import annotations

import json
import os
import queue
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt  # noqa: E402
from _tokens_helpers import ROOT, tlio, write_shard  # noqa: E402

HERE = Path(__file__).parent
CHILD = HERE / "_torch_dist_child.py"
sys.path.insert(0, str(HERE))
import _torch_child as child  # noqa: E402

torch.set_num_threads(1)
TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, *args: str, restarts: int = 0) -> list:
    """``python -m torch.distributed.run`` on this machine with a free port and, unless
    ``restarts`` says otherwise, no restart. With restarts the c10d rendezvous, to be run
    with ``RESTARTABLE`` in the environment: the static rendezvous (and c10d's store
    shared with the workers) keeps one store across restarts, from which a restarted gloo
    group can read a dead worker's address and fail to connect (torch issue 135712;
    here 1 static and 3 shared c10d restarts failed in 3 each, none of 3 unshared)."""
    if restarts:
        where = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    else:
        where = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), *where,
            "--max-restarts", str(restarts), *args]


#: The environment a restarting torchrun needs: a fresh store for every round.
RESTARTABLE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FAILPOINTS"}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_ranks(tmp: Path, mode: str, *args: str, env=None, check=True) -> tuple:
    """The child under torchrun with 2 ranks: (completed process, {rank: its report})."""
    report = tmp / f"report-{mode}-{time.monotonic_ns()}"
    out = subprocess.run(torchrun(2, str(CHILD), mode, str(report), *args), capture_output=True,
                         text=True, timeout=TIMEOUT, env=env or _env(), preexec_fn=_no_core_dumps)
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    ranks = {}
    for r in (0, 1):
        path = Path(f"{report}.{r}")
        if path.exists():
            ranks[r] = json.loads(path.read_text())
    return out, ranks


def test_collective_save_and_load_on_two_ranks(tmp_path):
    import random as _random

    shard = write_shard(tmp_path / "shard.bin", [_random.Random(4).randrange(64) for _ in range(3000)], vocab=64)
    dir = tmp_path / "ckpt"
    _, ranks = run_ranks(tmp_path, "protocol", str(dir), str(shard))
    assert sorted(ranks) == [0, 1]
    r0, r1 = ranks[0], ranks[1]
    assert r0["world"] == r1["world"] == 2
    # Nothing to load: FileNotFoundError on every rank.
    assert r0["empty"][0] == r1["empty"][0] == "FileNotFoundError"
    # The same path on both ranks, committed (LATEST included) before either returned.
    assert r0["save1"] == r1["save1"] == ["ok", str(dir / "step-000001")]
    # Rank 0's refusal reaches rank 1 as the same exception type.
    assert r0["again"][0] == r1["again"][0] == "ValueError"
    assert "overwrite=True" in r0["again"][1] and r1["again"][1].startswith("on rank 0: ")
    assert r0["again"][1] in r1["again"][1]
    # Ranks passing different steps are refused on every rank, naming the steps.
    for r in (r0, r1):
        assert r["drift"][0] == "ValueError" and "['2', '3']" in r["drift"][1]
    assert not (dir / "step-000003").exists()
    # The stream took its rank from the group; the cursor is global.
    assert (r0["stream"][:2], r1["stream"][:2]) == ([0, 2], [1, 2])
    assert r0["stream"][2] == r1["stream"][2] and r0["stream"][2]["global_batch"] == 2 * child.BATCH
    assert r0["save2"] == r1["save2"] == ["ok", str(dir / "step-000002")]
    assert (dir / "LATEST").read_text() == "step-000002\n"
    # Every rank loaded rank 0's state of step 2 into its own differently seeded model.
    assert r0["saved_digest"] != r1["saved_digest"], "rank 0 trained further than rank 1"
    assert r0["load"] == r1["load"] == ["ok", 2]
    assert r0["loaded_digest"] == r1["loaded_digest"] == r0["saved_digest"]
    assert r0["loaded_cursor"] == r1["loaded_cursor"] == r0["stream"][2]
    assert r0["step1"] == r1["step1"] == ["ok", 1]
    # A load that fails on rank 1 only raises on both ranks: rank 1 its own exception,
    # rank 0 the same type naming rank 1.
    assert r0["rank1_fails"][0] == r1["rank1_fails"][0] == "ValueError"
    assert "torch.SGD" in r1["rank1_fails"][1]
    assert r0["rank1_fails"][1] == "on rank 1: " + r1["rank1_fails"][1]
    # Rank 0 had read and checked the step too, but applied nothing: no rank applies
    # before every rank's check passed. The same when rank 1's model does not match.
    assert r0["unchanged_after_rank1_fails"] and r1["unchanged_after_rank1_fails"]
    assert r0["rank1_mismatch"][0] == r1["rank1_mismatch"][0] == "ValueError"
    assert "does not match the model" in r1["rank1_mismatch"][1]
    assert r0["rank1_mismatch"][1] == "on rank 1: " + r1["rank1_mismatch"][1]
    assert r0["unchanged_after_rank1_mismatch"] and r1["unchanged_after_rank1_mismatch"]
    tlio("ckpt", "verify", str(dir))


@pytest.mark.parametrize("point", ["ckpt/fsync=3*off->return", "ckpt/rename=1*off->return"])
def test_rank_0_killed_mid_save_leaves_the_previous_step(tmp_path, point):
    # Step 1 as the 2-rank save writes it (the same files; one process is quicker).
    dir = tmp_path / "ckpt"
    m, opt = child.fresh(1)
    m(torch.arange(child.SEQ).view(1, -1)).sum().backward()
    opt.step()
    tt.save(dir, 1, m, opt)
    want = child.digest(m, opt)
    t0 = time.monotonic()
    # fsync 3 is inside the temporary step directory; rename 1 is LATEST's (rename 0 the
    # step directory's), so that abort leaves a complete step-000002 LATEST never named.
    out, ranks = run_ranks(tmp_path, "save", str(dir), "2", env=_env(FAILPOINTS=point), check=False)
    # Rank 0 aborted inside the save; rank 1 was waiting for it and must not hang, nor
    # report a path.
    assert out.returncode != 0 and ranks == {}, out.stdout
    assert time.monotonic() - t0 < TIMEOUT
    assert (dir / "LATEST").read_text() == "step-000001\n"
    assert (dir / "step-000002").is_dir() == point.startswith("ckpt/rename")
    m, opt = child.fresh(7)
    assert tt.load(dir, m, opt).step == 1
    assert child.digest(m, opt) == want
    _, after = run_ranks(tmp_path, "load", str(dir))
    assert after[0]["step"] == after[1]["step"] == 1
    assert after[0]["digest"] == after[1]["digest"] == want
    tlio("ckpt", "verify", str(dir))


def test_checkpointed_stream_resumes_on_another_world_size(tmp_path):
    """2 ranks x batch 8 saved through tlio.torch.save, resumed as 1 x 16 and 4 x 4: the
    global windows continue exactly as one stream of batch 16; 2 x 4 is refused."""
    from tlio.pcg import PCG32
    from tlio.tokens import TokenStream

    shard = write_shard(tmp_path / "s.bin", [random.Random(5).randrange(64) for _ in range(2000)], vocab=64)
    single = TokenStream([shard], 8, 16, PCG32(3))
    whole = [single.next_batch()[0] for _ in range(20)]
    two = [TokenStream([shard], 8, 8, PCG32(3), rank=r, world_size=2) for r in range(2)]
    for i in range(10):
        assert (torch.from_numpy(np.concatenate([s.next_batch()[0] for s in two])) == torch.from_numpy(whole[i])).all()
    m, _ = child.fresh(0)
    tt.save(tmp_path / "ck", 10, m, None, two[0])
    for world, batch in ((1, 16), (4, 4)):
        ranks = [TokenStream([shard], 8, batch, PCG32(0), rank=r, world_size=world) for r in range(world)]
        for s in ranks:
            assert tt.load(tmp_path / "ck", child.fresh(1)[0], None, s).step == 10
        for i in range(10, 20):
            assert np.array_equal(np.concatenate([s.next_batch()[0] for s in ranks]), whole[i]), (world, i)
    other = TokenStream([shard], 8, 4, PCG32(0), rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"16.*8|8.*16"):
        tt.load(tmp_path / "ck", child.fresh(1)[0], None, other)


EXAMPLE = ROOT / "examples" / "train_torch.py"


def test_example_killed_at_seeded_instants_resumes_bitwise(tmp_path):
    """MS-L0 in torch on one process: SIGKILL at 5 seeded steps and one abort inside a
    save (a failpoint), each followed by --resume, end with the uninterrupted digests."""
    shard = tmp_path / "train.bin"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", str(shard))
    base = [sys.executable, str(EXAMPLE), "--shard", str(shard), "--steps", "60", "--every", "10"]
    full = subprocess.run([*base, "--out", str(tmp_path / "full")], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env(), check=True)
    want = full.stdout.splitlines()[-1]
    assert want.startswith("sha256 state_dict=")
    out = tmp_path / "killed"
    rnd = random.Random(21)
    kills = sorted(rnd.sample(range(3, 58), 5))
    for n, at in enumerate(kills):
        p = subprocess.Popen([*base, "--out", str(out), *(["--resume"] if n else [])], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=_env(), preexec_fn=_no_core_dumps)
        for line in p.stdout:
            if line.startswith(f"rank 0 step {at} "):
                p.send_signal(signal.SIGKILL)
                break
        p.communicate(timeout=TIMEOUT)
        assert p.returncode == -signal.SIGKILL, (at, p.returncode)
    crash = subprocess.run([*base, "--out", str(out), "--resume"], capture_output=True, text=True, timeout=TIMEOUT,
                           env=_env(FAILPOINTS=f"ckpt/fsync={rnd.randrange(3, 12)}*off->return"),
                           preexec_fn=_no_core_dumps)
    assert crash.returncode == -signal.SIGABRT, crash.stderr[-2000:]
    done = subprocess.run([*base, "--out", str(out), "--resume"], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env(), check=True)
    assert done.stdout.splitlines()[-1] == want
    tlio("ckpt", "verify", str(out))


START = re.compile(r"rank (\d) pid (\d+) start (\d+)$")


class Launch:
    """One torchrun of an example (``script``) with 2 ranks, in a session of its own. A thread reads
    its stdout (the ranks share it) so that every wait below has a deadline; ``starts``
    collects each worker's ``rank R pid P start S`` line, a restart's included."""

    def __init__(self, tmp: Path, args: list, env: dict, restarts: int = 0, script: Path = EXAMPLE):
        self.script = script
        self.err_path = tmp / f"torchrun-{time.monotonic_ns()}.err"
        with open(self.err_path, "w") as err:
            # No preexec_fn (reader threads run): SIGKILL and SIGTERM dump no core anyway.
            self.p = subprocess.Popen(torchrun(2, str(script), *args, restarts=restarts), stdout=subprocess.PIPE,
                                      stderr=err, text=True, env=env, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list = []
        self.starts: list = []  # (rank, pid, start step), in the order printed
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def why(self) -> str:
        return "\n".join(self.seen[-5:]) + "\n" + self.err_path.read_text()[-3000:]

    def _next(self, deadline: float, what: str):
        """The next line, ``None`` at the end of the output (every writer gone)."""
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {what} before the deadline\n{self.why()}") from None
        if line is not None:
            self.seen.append(line)
            m = START.match(line)
            if m:
                self.starts.append(tuple(map(int, m.groups())))
        return line

    def until(self, pred, what: str, deadline: float) -> str:
        """The first further line for which ``pred`` holds."""
        while (line := self._next(deadline, what)) is not None:
            if pred(line):
                return line
        raise AssertionError(f"torchrun ended ({self.p.wait(TIMEOUT)}) before {what}\n{self.why()}")

    def start_of_both(self, deadline: float) -> int:
        """The step both ranks of the latest (re)start resume from: they must agree."""
        first = len(self.starts)
        self.until(lambda _: len(self.starts) == first + 2, "the start line of both ranks", deadline)
        (ra, _, a), (rb, _, b) = self.starts[-2:]
        assert {ra, rb} == {0, 1} and a == b, f"the ranks resumed from different steps: {self.starts[-2:]}"
        return a

    def pid(self, rank: int) -> int:
        return [p for r, p, _ in self.starts if r == rank][-1]

    def finish(self, deadline: float) -> int:
        """torchrun's exit code, after the rest of its output."""
        while self._next(deadline, "end of torchrun's output") is not None:
            pass
        try:
            return self.p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"torchrun did not exit before the deadline\n{self.why()}") from None

    def close(self) -> None:
        """Nothing of this launch survives: torchrun's session, then the workers, which
        torch starts in sessions of their own."""
        workers = {p for _, p, _ in self.starts}
        try:
            for task in Path(f"/proc/{self.p.pid}/task").iterdir():
                workers.update(int(c) for c in (task / "children").read_text().split())
        except OSError:  # torchrun is gone, and its workers with it or among ``starts``
            pass
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        for pid in workers:
            try:
                if self.script.name in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.p.wait(timeout=TIMEOUT)


def _written_since(path: Path, t0: float) -> bool:
    try:
        return path.stat().st_mtime >= t0
    except FileNotFoundError:
        return False


def test_example_on_two_ranks_killed_and_relaunched_resumes_bitwise(tmp_path):
    """MS-L0 in torch on 2 ranks under torchrun: one rank SIGKILLed at 5 seeded instants
    (at steps, as a save begins, and twice pinned inside a save: the step directory
    written but not renamed, and renamed but LATEST not yet), torchrun relaunched with
    --resume after each; then a kill that torchrun answers by restarting both workers.
    Every (re)start has both ranks resume from the same step, the one a load picks, and
    the last run ends with the uninterrupted run's digests."""
    shard = tmp_path / "train.bin"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", str(shard))
    every = 10
    base = ["--shard", str(shard), "--steps", "60", "--every", str(every)]
    full = subprocess.run(torchrun(2, str(EXAMPLE), *base, "--out", str(tmp_path / "full")), capture_output=True,
                          text=True, timeout=TIMEOUT, env=_env())
    assert full.returncode == 0, full.stderr[-3000:]
    want = full.stdout.splitlines()[-1]
    assert want.startswith("sha256 state_dict=")
    out = tmp_path / "killed"
    args = [*base, "--out", str(out), "--resume"]  # --resume with nothing saved yet starts at 0

    rnd = random.Random(22)
    # Five kills in a seeded order, each of a seeded rank and placed after the step its
    # launch resumes from (a pinned kill may or may not advance it): "between" at a step
    # between saves, twice; "begin" as the line of a save step appears, so as the ranks
    # enter tlio.torch.save; ("save", n) inside the launch's first save, where a failpoint
    # holds rank 0 (the writer) before its rename n, the step directory's (0) or LATEST's
    # (1), until the kill.
    kills: list = ["between", "between", "begin", ("save", 0), ("save", 1)]
    rnd.shuffle(kills)
    ranks = [0, 1, 0, 1, rnd.randrange(2)]
    rnd.shuffle(ranks)

    def picked() -> int:
        """The step a load picks (checkpoints.md, Loading), by the CLI; 0 before any."""
        got = tlio("ckpt", "latest", str(out), check=False)
        return int(Path(got.stdout.strip()).name.removeprefix("step-")) if got.returncode == 0 else 0

    start = 0  # where the next launch must resume
    for kill, rank in zip(kills, ranks):
        deadline = time.monotonic() + TIMEOUT
        point = kill[1] if isinstance(kill, tuple) else None
        env = _env() if point is None else _env(FAILPOINTS=f"ckpt/rename={point}*off->1*sleep(600000)->off")
        t0 = time.time()
        run = Launch(tmp_path, args, env)
        try:
            got = run.start_of_both(deadline)
            assert got == start, (got, start)
            if point is None:
                # At most 2 * every past the resume: 5 kills leave steps for the last launch.
                at = start + (rnd.choice([s for s in range(1, 2 * every) if s % every]) if kill == "between"
                              else every * rnd.randrange(1, 3))
                run.until(lambda line: line.startswith(f"rank {rank} step {at} "), f"step {at} on rank {rank}",
                          deadline)
            else:
                at = start + every
                step_dir = out / f"step-{at:06d}"
                held = step_dir.with_name(step_dir.name + ".tmp") / "MANIFEST.json" if point == 0 else step_dir
                # Written by this launch, not left by an earlier kill (which the save may be
                # deleting right now): then rank 0 is at the failpoint.
                while not _written_since(held, t0):
                    assert run.p.poll() is None and time.monotonic() < deadline, run.why()
                    time.sleep(0.01)
            os.kill(run.pid(rank), signal.SIGKILL)
            # torchrun (no restart) tears the other rank down and fails.
            assert run.finish(deadline) != 0, run.why()
        finally:
            run.close()
        if point is None:
            # A kill costs at most the steps since the last save; one as a save begins
            # may or may not let that save commit.
            assert (at - 1) // every * every <= picked() <= at, (at, picked())
        else:
            # Killed inside the save: its step was never declared, so it is not resumed,
            # unless nothing was ever declared and the step directory is whole.
            assert held.exists() and (out / "LATEST").exists() == (start > 0), sorted(os.listdir(out))
            assert picked() == (at if point == 1 and start == 0 else start), sorted(os.listdir(out))
        start = picked()

    # The last launch may restart its workers once: a rank killed past the last resume,
    # torchrun restarts both with the same arguments, and they resume from the newest save.
    deadline = time.monotonic() + TIMEOUT
    rank, at = rnd.randrange(2), rnd.randrange(start + 1, 59)
    run = Launch(tmp_path, args, _env(**RESTARTABLE), restarts=1)
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
