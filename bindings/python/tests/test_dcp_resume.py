"""A 2-rank FSDP2 loop that checkpoints every step through ``dcp.save`` or
``dcp.async_save`` into ``tlio.dcp.Writer`` (torchrun, gloo on CPU), SIGKILLed at
seeded instants (inside a rank's write_data, inside the coordinator's commit in
``finish``, while an async save is still writing) and relaunched: every step left
behind is committed whole or not at all, and the resumed run ends bit for bit where the
uninterrupted one does. async_save runs with the thread checkpointer (DCP's default
stager, and a stager with shared memory and asynchronous staging) and with the process
checkpointer."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest

import tlio.dcp
from _tokens_helpers import tlio as cli
from test_torch_dist import TIMEOUT, _env, _no_core_dumps, torchrun

HERE = Path(__file__).parent
CHILD = HERE / "_dcp_resume_child.py"
STEPS = 5
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def launch(tmp: Path, run: Path, how: str, kill: str = "none", failpoints: str = "") -> tuple:
    """One torchrun of the loop: (return code, {rank: report} or None when killed)."""
    report = tmp / f"report-{time.monotonic_ns()}"
    env = _env(FAILPOINTS=failpoints) if failpoints else _env()
    out = subprocess.run(torchrun(2, str(CHILD), "train", str(run), str(STEPS), how, kill, str(report)),
                         capture_output=True, text=True, timeout=TIMEOUT, env=env, preexec_fn=_no_core_dumps)
    paths = [Path(f"{report}.{r}") for r in (0, 1)]
    (tmp / "last-stderr.txt").write_text(out.stderr)
    if out.returncode != 0:
        return out.returncode, None
    assert all(p.exists() for p in paths), out.stderr[-3000:]
    return 0, {r: json.loads(p.read_text()) for r, p in enumerate(paths)}


def committed_steps_verify(run: Path) -> list:
    """The steps of ``run`` declared done (up to the one LATEST names), each of which
    verifies, and that ``tlio.dcp.latest`` picks the newest of them. A kill between a
    step's rename and LATEST's may leave a newer directory: never declared done, it is
    ignored (checkpoint.md) and the next save of that step replaces it."""
    if not run.is_dir():
        return []
    latest = tlio.dcp.latest(run)
    if latest is None:
        return []
    assert (run / "LATEST").read_text() == Path(latest).name + "\n", latest
    steps = sorted(p.name for p in run.iterdir() if p.name.startswith("step-") and not p.name.endswith(".tmp"))
    steps = [name for name in steps if name <= Path(latest).name]
    for name in steps:
        out = cli("ckpt", "verify", str(run / name), check=False)
        assert out.returncode == 0, (name, out.stdout, out.stderr)
    return steps


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The digests at the end of an uninterrupted blocking run."""
    tmp = tmp_path_factory.mktemp("dcp-resume")
    code, ranks = launch(tmp, tmp / "run", "sync")
    assert code == 0, (tmp / "last-stderr.txt").read_text()[-3000:]
    assert ranks[0]["start"] == 0 and ranks[0]["digests"] == ranks[1]["digests"]
    return ranks[0]["digests"]


def test_a_blocking_save_killed_in_write_data_or_in_its_commit_resumes_bitwise(tmp_path, uninterrupted):
    rng = random.Random(20261207)
    run = tmp_path / "run"
    # Rank 1 dies halfway through its write_data: the step is never committed.
    kill_step = rng.randrange(1, STEPS - 2)
    code, _ = launch(tmp_path, run, "sync", kill=f"{kill_step}:1:write")
    assert code != 0
    assert committed_steps_verify(run) == [f"step-{s:06d}" for s in range(kill_step)]
    # The coordinator dies at a seeded rename of its commit (finish): the step it was
    # committing is there whole or not at all.
    nth = rng.randrange(0, 3)
    code, _ = launch(tmp_path, run, "sync", failpoints=f"ckpt/rename={nth}*off->return")
    assert code != 0
    steps = committed_steps_verify(run)
    assert steps[: kill_step] == [f"step-{s:06d}" for s in range(kill_step)] and len(steps) < STEPS
    code, ranks = launch(tmp_path, run, "sync")
    assert code == 0 and ranks[0]["start"] == len(steps)
    assert ranks[0]["digests"] == ranks[1]["digests"] == uninterrupted
    assert committed_steps_verify(run) == [f"step-{s:06d}" for s in range(STEPS)]


@pytest.mark.parametrize("how,fsync_kill", [("thread", True), ("process", False)])
def test_an_async_save_killed_while_it_writes_or_at_its_fsyncs_resumes_bitwise(tmp_path, uninterrupted, how,
                                                                               fsync_kill):
    rng = random.Random(f"async-{how}")
    run = tmp_path / "run"
    kill_step = rng.randrange(1, STEPS - 1)
    # Rank 0 (the coordinator) dies right after async_save handed the write to the
    # background: the step in flight is never committed half.
    code, _ = launch(tmp_path, run, how, kill=f"{kill_step}:0:pending")
    assert code != 0
    steps = committed_steps_verify(run)
    assert steps == [f"step-{s:06d}" for s in range(len(steps))] and len(steps) <= kill_step + 1
    if fsync_kill:
        # Then a seeded fsync of a save aborts whichever rank reaches it first.
        nth = rng.randrange(1, 6)
        code, _ = launch(tmp_path, run, how, failpoints=f"ckpt/fsync={nth}*off->return")
        assert code != 0
        steps = committed_steps_verify(run)
    code, ranks = launch(tmp_path, run, how)
    assert code == 0 and ranks[0]["start"] == len(steps)
    assert ranks[0]["digests"] == ranks[1]["digests"] == uninterrupted
    assert committed_steps_verify(run) == [f"step-{s:06d}" for s in range(STEPS)]


def test_an_async_save_through_a_stager_with_shared_memory_and_async_staging_saves_what_blocking_does(
        tmp_path, uninterrupted):
    # StagingOptions' pinned memory and non-blocking copy need an accelerator; on CPU
    # DCP stages through shared memory, asynchronously, and the steps are the same.
    run = tmp_path / "run"
    code, ranks = launch(tmp_path, run, "pinned")
    assert code == 0 and ranks[0]["digests"] == ranks[1]["digests"] == uninterrupted
    assert committed_steps_verify(run) == [f"step-{s:06d}" for s in range(STEPS)]
