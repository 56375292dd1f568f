"""keep and cleanup never lose the last loadable checkpoint: a save refuses, before
writing anything, a step a load would refuse; a cleanup problem after the commit is a
warning (the save succeeded) and the next save finishes the deletion."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np

from tlio.checkpoint import load_checkpoint, save_checkpoint, verify_step_dir

# The largest config.json a load parses (checkpoint.md: JSON files are read whole).
MAX_JSON_BYTES = 64 << 20


def _model(step: int):
    return {"w": np.full((4, 4), step, np.float32)}


def test_a_config_a_load_would_refuse_is_refused_before_anything_is_written(tmp_path):
    ck = tmp_path / "ck"
    save_checkpoint(ck, _model(1), None, 1, None, None, keep=1)
    big = {"notes": "x" * MAX_JSON_BYTES}
    try:
        save_checkpoint(ck, _model(2), None, 2, None, None, keep=1, config=big)
    except ValueError as e:
        assert str(MAX_JSON_BYTES) in str(e), e
    else:
        raise AssertionError("a config larger than a load reads was committed")
    assert sorted(os.listdir(ck)) == [".lock", "LATEST", "step-000001"]
    c = load_checkpoint(ck)
    assert c.step == 1 and c.model["w"][0, 0] == 1


CHILD = textwrap.dedent(
    """
    import sys, warnings
    import numpy as np
    from tlio.checkpoint import load_checkpoint, save_checkpoint
    ck = sys.argv[1]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        path = save_checkpoint(ck, {"w": np.full((4, 4), 2, np.float32)}, None, 2, None, None, keep=1)
    assert path.endswith("step-000002"), path
    assert load_checkpoint(ck).step == 2
    for w in seen:
        print("warning:", w.category.__name__, w.message)
    """
)


def test_a_cleanup_failure_after_the_commit_warns_and_the_next_save_finishes_it(tmp_path):
    ck = tmp_path / "ck"
    save_checkpoint(ck, _model(1), None, 1, None, None)
    # Every removal of the child's save fails (the failpoint), after its commit.
    env = {**os.environ, "FAILPOINTS": "ckpt/remove=return"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(ck)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("warning:")]
    assert len(lines) == 1 and "UserWarning" in lines[0] and "step-000001" in lines[0], r.stdout
    assert "the save succeeded" in lines[0]
    assert sorted(os.listdir(ck)) == [".lock", "LATEST", "step-000001", "step-000002"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_checkpoint(ck, _model(3), None, 3, None, None, keep=1)
    assert sorted(os.listdir(ck)) == [".lock", "LATEST", "step-000003"]
    assert verify_step_dir(ck / "step-000003") == []
    assert load_checkpoint(ck).step == 3


def _bytes_read() -> int:
    """What this process has read so far (the kernel's ``rchar``: every read call,
    page cache hits included)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar")


def test_keep_does_not_re_read_the_steps_it_already_verified(tmp_path):
    # keep=6 counts five older steps per save. Re-verifying them would read five steps'
    # data on every save; what this process already verified is trusted while its
    # files are unchanged. Only the newest older steps are read: a step is trusted once
    # a verification ran well after its files were last changed (checkpoints.md), and
    # saves this small and fast run within that margin, so a step is read by the next
    # two saves and never again.
    keep, saves = 6, 10
    ck = tmp_path / "ck"
    model = {"w": np.zeros(2 << 20, np.float32)}
    step_bytes = model["w"].nbytes
    reads = []
    for step in range(1, saves + 1):
        model["w"][0] = step
        before = _bytes_read()
        save_checkpoint(ck, model, None, step, None, None, keep=keep)
        reads.append(_bytes_read() - before)
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("step-")) == [
        f"step-{n:06d}" for n in range(saves - keep + 1, saves + 1)
    ]
    assert max(reads[keep:]) < 3 * step_bytes, reads
    # What was kept still verifies, and a load still checks every byte it returns.
    assert all(verify_step_dir(ck / f"step-{n:06d}") == [] for n in range(saves - keep + 1, saves + 1))
    before = _bytes_read()
    assert load_checkpoint(ck).model["w"][0] == saves
    assert _bytes_read() - before >= step_bytes
