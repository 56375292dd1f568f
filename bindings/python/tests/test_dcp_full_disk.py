"""``dcp.save`` through ``tlio.dcp.Writer`` onto a disk that fills (a small tmpfs, mounted
in a private mount namespace around torchrun, 2 ranks, gloo on CPU): every rank raises,
each failed rank's error an ``OSError`` with errno ENOSPC; nothing is committed, the
previous step still loads, and the space of the failed save is given back, so the next
save fits.

What DCP's own ``FileSystemWriter`` does with the same save (torch 2.15, asserted below):
every rank raises DCP's ``CheckpointException``, but not every rank's cause is ENOSPC:
a rank whose write fails inside ``torch.save``'s zip writer reports (in some runs here)
``RuntimeError: [enforce fail at inline_container.cc:671] . unexpected pos 704 vs
598``, and the ENOSPC it does report names no file. The step directory stays behind with its
partial ``.distcp`` files and no ``.metadata`` (``FileSystemReader`` on it fails with an
``AssertionError``), and those files keep the disk full: the next save, of the small
state, fails with ENOSPC. Its previous step still loads.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_torch_dist import TIMEOUT, _env, _no_core_dumps, torchrun

HERE = Path(__file__).parent
CHILD = HERE / "_dcp_child.py"
sys.path.insert(0, str(HERE))
import _dcp_child as child  # noqa: E402

#: Size of each tmpfs.
TMPFS = "1m"
#: float32 elements of the big DTensor per rank: 2 MiB, more than a tmpfs holds.
BIG_PER_RANK = 1 << 19


def _unshare() -> list:
    """A private mount namespace: as root directly, otherwise in a user namespace where
    this user is root (tmpfs can be mounted there)."""
    return ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    disks = tmp / "disks"
    for name in ("tlio", "fs"):
        (disks / name).mkdir(parents=True)
    report = tmp / f"report-{time.monotonic_ns()}"
    mounts = " && ".join(f"mount -t tmpfs -o size={TMPFS} tmpfs {shlex.quote(str(disks / n))}" for n in ("tlio", "fs"))
    ranks = torchrun(2, str(CHILD), "full_disk", str(report), str(disks), str(2 * BIG_PER_RANK))
    script = f"{mounts} && exec {shlex.join(ranks)}"
    out = subprocess.run([*_unshare(), "sh", "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                         env=_env(), preexec_fn=_no_core_dumps)
    assert out.returncode == 0, out.stderr[-4000:]
    return {r: json.loads(Path(f"{report}.{r}").read_text()) for r in (0, 1)}


def _enospc(failure) -> bool:
    kind, code, _ = failure
    return (kind, code) == ("OSError", errno.ENOSPC)


def test_a_save_that_fills_the_disk_raises_enospc_on_every_rank_and_commits_nothing(full):
    for r in (0, 1):
        rep = full[r]
        failed = rep["tlio"]
        assert failed["raised"] == "CheckpointException" and sorted(failed["failures"]) == ["0", "1"], failed
        for rank, failure in failed["failures"].items():
            # Each rank's own error: ENOSPC, naming the file it was writing.
            assert _enospc(failure), failure
            assert f"step-000002.tmp/dcp-rank0000{rank}.safetensors" in failure[2], failure
        # Nothing of step 2 is left, committed or not; LATEST still names step 1.
        assert rep["tlio_listing"] == [".lock", "LATEST", "step-000001"], rep["tlio_listing"]
        # The previous step still loads, verified.
        assert rep["tlio_loaded"] == {"digests": rep["saved1"], "extra": child.EXTRA}
        # The space is given back: the next save of the small state fits and commits.
        assert rep["tlio_retry"] == {"raised": None}
        assert rep["tlio_after_retry"] == [".lock", "LATEST", "step-000001", "step-000002"]


def test_filesystem_writer_raises_too_but_leaves_its_partial_files_filling_the_disk(full):
    for r in (0, 1):
        rep = full[r]
        failed = rep["fs"]
        assert failed["raised"] == "CheckpointException" and sorted(failed["failures"]) == ["0", "1"], failed
        # Each cause is ENOSPC or torch.save's zip writer failing; none names its file.
        for failure in failed["failures"].values():
            assert _enospc(failure) or failure[0] == "RuntimeError", failure
            assert "step-2" not in failure[2], failure
        assert rep["fs_listing"] == ["step-1", "step-2"]
        assert rep["fs_step2"] and ".metadata" not in rep["fs_step2"], rep["fs_step2"]
        assert rep["fs_step2_load"]["raised"] is not None, rep["fs_step2_load"]
        assert rep["fs_loaded"] == {"digests": rep["saved1"], "extra": child.EXTRA}
        assert rep["fs_free"] < rep["tlio_free"], (rep["fs_free"], rep["tlio_free"])
        retry = rep["fs_retry"]
        assert retry["raised"] == "CheckpointException" and any(_enospc(f) for f in retry["failures"].values())
