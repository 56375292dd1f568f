"""FAILPOINTS at ``import tlio`` (python.md, docs/cli.md): the fail crate's variable is shared
by every program built with it, so a value naming another program's points is ignored, while
a malformed entry or a misspelt name in tlio's groups still fails the import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _import(value: str, code: str = "import tlio") -> subprocess.CompletedProcess:
    env = {**os.environ, "FAILPOINTS": value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("value", ["raft/append=panic", "before_apply=bogus(;kv/commit=return"])
def test_another_programs_failpoints_do_not_break_the_import(value):
    out = _import(value)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


@pytest.mark.parametrize("value", ["garbage", "ckpt/fsnyc=return", "ckpt/fsync=bogus(",
                                   "raft/append=panic;train/after-stepp=return"])
def test_a_malformed_value_or_a_misspelt_tlio_failpoint_fails_the_import(value):
    out = _import(value)
    assert out.returncode != 0
    assert "ValueError" in out.stderr and "FAILPOINTS" in out.stderr, out.stderr


def test_tlios_failpoint_beside_another_programs_still_applies(tmp_path):
    # ckpt/rename=return aborts the process at the save's first rename: nothing committed.
    code = ("import numpy as np\n"
            "from tlio.checkpoint import save_checkpoint\n"
            f"save_checkpoint({str(tmp_path / 'ck')!r}, {{'w': np.ones(3, np.float32)}}, None, 1, None, {{}})\n")
    out = _import("raft/append=panic;ckpt/rename=return", code)
    assert out.returncode != 0
    assert not (tmp_path / "ck" / "step-000001").exists()
    assert (tmp_path / "ck" / "step-000001.tmp").exists()
