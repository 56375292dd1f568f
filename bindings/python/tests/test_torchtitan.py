"""tlio.torchtitan.CheckpointManager inside torchtitan: resume bitwise after a SIGKILL
between steps, and a damaged newest step passed over for the previous one."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
import torch  # noqa: E402

import tlio.torchtitan  # noqa: E402

CHILD = Path(__file__).with_name("torchtitan_child.py")


def run(folder, total, kill_after, out):
    return subprocess.run([sys.executable, str(CHILD), str(folder), str(total), str(kill_after), str(out)],
                          capture_output=True, text=True, timeout=120)


def assert_equal_states(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if k == "_opt":
            continue
        assert torch.equal(a[k], b[k]), k
    flat_a, flat_b = a["_opt"], b["_opt"]
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        va, vb = flat_a[k], flat_b[k]
        assert (torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb), k


def test_a_killed_torchtitan_run_resumes_bitwise_and_a_damaged_step_is_passed_over(tmp_path):
    full = run(tmp_path / "full" / "ckpt", 4, -1, tmp_path / "full.pt")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run(tmp_path / "resumed" / "ckpt", 4, 2, tmp_path / "unused.pt")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    folder = tmp_path / "resumed" / "ckpt"
    assert sorted(n for n in os.listdir(folder) if n.startswith("step-")) == ["step-1", "step-2"]
    assert tlio.torchtitan.find_load_step(str(folder)) == (2, [])
    resumed = run(folder, 4, -1, tmp_path / "resumed.pt")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_equal_states(torch.load(tmp_path / "full.pt"), torch.load(tmp_path / "resumed.pt"))

    # Damage the newest step: one byte of its rank file flipped; the step before is chosen.
    rank_file = folder / "step-4" / "dcp-rank00000.safetensors"
    data = bytearray(rank_file.read_bytes())
    data[-1] ^= 0xFF
    rank_file.write_bytes(bytes(data))
    step, skipped = tlio.torchtitan.find_load_step(str(folder))
    assert step == 3
    assert [name for name, _ in skipped] == ["step-4"] and "dcp-rank00000.safetensors" in skipped[0][1]
    # torchtitan's own rule would still take step-4 (it only looks for .metadata / an HF index,
    # and a tlio step has neither): tlio's manager is what makes the choice verified.
