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
