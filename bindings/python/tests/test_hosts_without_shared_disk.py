"""Sharded checkpoints of a job on two hosts that share no disk (scale.md sections 1-3):
one torchrun job of 2 nodes x 2 ranks (static rendezvous on 127.0.0.1), each node a
process tree in namespaces of its own (``unshare --mount --pid``), whose scratch
directory (its temporary files, its cache of the token shard) is a tmpfs the other node
cannot see. Object storage (the local S3 server) is the only storage both see: the
FSDP2 example reads its shard there and saves there, async and blocking.

One node is SIGKILLed in the middle of a save (its ranks held by a failpoint before
their first upload, the other node's files already uploaded): that step is never
committed. The job restarted as 1 node x 4 ranks ends bitwise equal to an uninterrupted
run; restarted as 2 nodes x 1 rank (the same global batch) it ends bitwise equal to an
uninterrupted 2-rank run from the same step. The same job saving to a directory of each
node's own fails at once on every rank, naming the directory as not shared, and commits
nothing. A machine without mount namespaces skips these tests, saying why."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import torch  # noqa: F401  (in requirements-test.txt: a missing torch fails the run, never skips it)

from _tokens_helpers import ROOT, tlio
from test_torch_dist import TIMEOUT, _env, _no_core_dumps, free_port, torchrun
from test_torch_shard_s3 import objects

HERE = Path(__file__).parent
HOST = HERE / "_host.py"
EXAMPLE = ROOT / "examples" / "train_fsdp.py"
#: Windows per global batch: every layout of these tests sees the same batches.
GLOBAL_BATCH = 8
EVERY = 2
STEPS = 6


def unshare() -> list:
    """The command that runs a host in mount and pid namespaces of its own (a user
    namespace too when not root); killing it kills the whole host."""
    cmd = ["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc",
           "--propagation", "private"]
    if os.geteuid() != 0:
        cmd[1:1] = ["--user", "--map-root-user"]
    return cmd


@pytest.fixture
def hosts(tmp_path):
    """Skip, saying why, where a process cannot get a mount namespace of its own with
    a private tmpfs; else the scratch path every host names."""
    if shutil.which("unshare") is None:
        pytest.skip("no `unshare` on this machine: two hosts need mount namespaces of their own")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    try:
        probe = subprocess.run([*unshare(), "sh", "-c", f"mount -t tmpfs probe {scratch} && touch {scratch}/seen"],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"unshare could not run: {e}")
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace with a private tmpfs here: {probe.stderr.strip() or probe.returncode}")
    assert not (scratch / "seen").exists(), "a tmpfs mounted in a namespace of its own leaked out"
    return scratch


class Job:
    """One torchrun job of ``nodes`` hosts x ``nproc`` ranks, each host in namespaces of
    its own (``_host.py``), ``env[i]`` added to host i's environment."""

    def __init__(self, tmp: Path, scratch: Path, name: str, nodes: int, nproc: int, args: list, env=None):
        port = free_port()
        self.reports = [tmp / f"{name}-host{i}.json" for i in range(nodes)]
        self.logs = [tmp / f"{name}-host{i}.log" for i in range(nodes)]
        self.procs = []
        for i in range(nodes):
            run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(i),
                   "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
                   "--max-restarts", "0", str(EXAMPLE), *args, "--batch", str(GLOBAL_BATCH // (nodes * nproc))]
            with open(self.logs[i], "w") as log:
                self.procs.append(subprocess.Popen(
                    [*unshare(), sys.executable, str(HOST), str(scratch), str(i), str(self.reports[i]), *run],
                    stdout=log, stderr=subprocess.STDOUT, env=_env(**(env or {}).get(i, {})),
                    preexec_fn=_no_core_dumps))

    def kill(self, i: int) -> None:
        """SIGKILL host i: its first process, then (--kill-child) every process of it."""
        os.kill(self.procs[i].pid, signal.SIGKILL)

    def wait(self) -> list:
        """Every host's exit status (a host still running at the deadline is killed)."""
        deadline = time.monotonic() + TIMEOUT
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in self.procs:
                    q.kill()
                raise AssertionError(f"a host ran past {TIMEOUT} s:\n{self.why()}")
        return codes

    def why(self) -> str:
        return "\n".join(f"--- host {i}\n{log.read_text()[-3000:]}" for i, log in enumerate(self.logs))

    def last_line(self) -> str:
        lines = [line for line in self.logs[0].read_text().splitlines() if line.startswith("sha256 ")]
        return lines[-1] if lines else ""

    def starts(self) -> list:
        """(rank, step) of every rank's start line."""
        text = "".join(log.read_text() for log in self.logs)
        return sorted((int(w[1]), int(w[-1])) for w in (line.split() for line in text.splitlines())
                      if len(w) == 6 and w[0] == "rank" and w[2] == "pid" and w[4] == "start")

    def report(self, i: int) -> dict:
        return json.loads(self.reports[i].read_text())


def copy(s3, src: str, dst: str) -> None:
    """Copy every object under ``src/`` to ``dst/`` (a node-free backup of a prefix)."""
    for key in s3.keys(src + "/"):
        s3.client.copy_object(Bucket=s3.name, Key=dst + key[len(src):], CopySource={"Bucket": s3.name, "Key": key})


def own_scratch(report: dict, i: int) -> None:
    """A host's scratch held nothing when it came up and, at the end, its own marker and
    its own cache of the shard, never another host's marker."""
    assert report["before"] == [], report
    after = report["after"]
    assert f"host-{i}" in after and not [f for f in after if f.startswith("host-") and f != f"host-{i}"], after
    assert any(f.startswith("cache/tlio/") for f in after), after


def test_two_hosts_save_to_object_storage_and_resume_at_other_layouts(tmp_path, s3, hosts):
    shard = s3.url("data/train.bin")
    tlio("-q", "tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", shard)
    base = ["--shard", shard, "--layout", "fsdp", "--steps", str(STEPS), "--every", str(EVERY)]
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}

    # The uninterrupted run, on one host, 4 ranks.
    full = subprocess.run(torchrun(4, str(EXAMPLE), *base, "--batch", "2", "--out", s3.url("full")),
                          capture_output=True, text=True, timeout=TIMEOUT, env=_env(**cache))
    assert full.returncode == 0, full.stderr[-3000:]
    want = full.stdout.splitlines()[-1]
    assert want.startswith("sha256 state_dict=")

    # 2 hosts x 2 ranks, async saves; host 1's ranks pass their uploads of step 2 (two
    # files each) and are held at their first of step 4, when host 1 is killed.
    run = s3.url("run")
    held = {1: {"FAILPOINTS": "s3/rank-file=2*off->sleep(600000)"}}
    job = Job(tmp_path, hosts, "killed", 2, 2, [*base, "--out", run, "--async-save"], env=held)
    try:
        deadline = time.monotonic() + TIMEOUT
        mine = {f"{g}-rank0000{r}.safetensors" for g in ("model", "optimizer") for r in (0, 1)}
        while not mine <= {k.rsplit("/", 1)[1] for k in s3.keys("run/step-000004/")}:
            assert all(p.poll() is None for p in job.procs) and time.monotonic() < deadline, job.why()
            time.sleep(0.05)
        job.kill(1)
        codes = job.wait()
    finally:
        for p in job.procs:
            p.kill()
    assert codes[0] != 0 and codes[1] == -signal.SIGKILL, (codes, job.why())
    assert job.report(0)["rc"] != 0 and not job.reports[1].exists()
    # Step 4 was never committed: no manifest, none of host 1's files; step 2 is the
    # newest, and its objects are the uninterrupted run's (4 ranks' pieces each).
    step4 = {k.rsplit("/", 1)[1] for k in s3.keys("run/step-000004/")}
    assert "MANIFEST.json" not in step4 and not [n for n in step4 if "rank00002" in n or "rank00003" in n], step4
    assert tlio("ckpt", "latest", run).stdout.strip() == f"{run}/step-000002"
    step2 = objects(s3, "run/step-000002")
    assert [n for n in step2 if n.startswith("model-")] == [f"model-rank0000{r}.safetensors" for r in range(4)]
    assert step2 == objects(s3, "full/step-000002")
    copy(s3, "run", "run-1x4")
    copy(s3, "run", "run-2x1")

    # Resumed as 1 host x 4 ranks (blocking saves): the uninterrupted run's end.
    job = Job(tmp_path, hosts, "one-host", 1, 4, [*base, "--out", s3.url("run-1x4"), "--resume"])
    assert job.wait() == [0], job.why()
    assert job.starts() == [(r, 2) for r in range(4)] and job.last_line() == want, job.why()
    own_scratch(job.report(0), 0)
    tlio("ckpt", "verify", s3.url("run-1x4"))

    # Resumed as 2 hosts x 1 rank (blocking saves), against an uninterrupted 2-rank run
    # from the uninterrupted run's step 2.
    copy(s3, "full/step-000002", "ref-2x1/step-000002")
    ref = subprocess.run(torchrun(2, str(EXAMPLE), *base, "--batch", "4", "--out", s3.url("ref-2x1"), "--resume"),
                         capture_output=True, text=True, timeout=TIMEOUT, env=_env(**cache))
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert " start 2" in ref.stdout
    job = Job(tmp_path, hosts, "two-hosts", 2, 1, [*base, "--out", s3.url("run-2x1"), "--resume"])
    assert job.wait() == [0, 0], job.why()
    assert job.starts() == [(0, 2), (1, 2)] and job.last_line() == ref.stdout.splitlines()[-1], job.why()
    for i in (0, 1):
        own_scratch(job.report(i), i)
    tlio("ckpt", "verify", s3.url("run-2x1"))
    # Nothing of any host's scratch is seen here.
    assert list(hosts.iterdir()) == []


def test_a_directory_of_each_host_fails_the_save_at_once_naming_it(tmp_path, s3, hosts):
    """Both hosts name SCRATCH/ckpt, each its own: the first save fails on every rank of
    both hosts, the error naming the directory as not shared, and commits nothing."""
    shard = s3.url("data/train.bin")
    tlio("-q", "tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", shard)
    out = hosts / "ckpt"
    t0 = time.monotonic()
    job = Job(tmp_path, hosts, "unshared", 2, 2,
              ["--shard", shard, "--layout", "fsdp", "--steps", str(STEPS), "--every", str(EVERY), "--out", str(out)])
    codes = job.wait()
    assert codes[0] != 0 and codes[1] != 0, job.why()
    assert time.monotonic() - t0 < TIMEOUT
    logs = [log.read_text() for log in job.logs]
    said = f"{out} is not shared between the hosts of this save"
    for i, text in enumerate(logs):
        assert said in text, f"host {i}:\n{text[-3000:]}"
    # Rank 0's host: the lock and nothing else (no step, no LATEST, no leftover tmp).
    assert [f for f in job.report(0)["after"] if f.startswith("ckpt/")] == ["ckpt/.lock"], job.report(0)
    # The other host never had the directory.
    assert not [f for f in job.report(1)["after"] if f.startswith("ckpt/")], job.report(1)
    # No rank trained past the failed save.
    assert not [line for text in logs for line in text.splitlines() if f" step {EVERY + 1} " in line]
