"""A load that names its step gets that step or an error naming it and why, never another
step, for every load function and both kinds of step (checkpoint.md's loading rules);
with no step named, a damaged step is skipped for the newest older one that verifies and
``Checkpoint.skipped`` lists exactly the steps refused (none that never existed, no rank
in a load that is not distributed)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tlio.torch as tt
from tlio.checkpoint import load_checkpoint, save_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from test_sharded import flip_byte, row_chunks, save_sharded  # noqa: E402

torch.set_num_threads(1)


def _weights(step: int) -> np.ndarray:
    return np.arange(32, dtype=np.float32).reshape(8, 4) + step


def _net() -> torch.nn.Module:
    return torch.nn.Linear(4, 8, bias=False)


def _refused(call, step_dir: str, why: str) -> str:
    with pytest.raises(FileNotFoundError) as e:
        call()
    text = str(e.value)
    assert step_dir in text and why in text, text
    return text


def test_load_checkpoint_of_a_named_damaged_or_missing_step_raises(tmp_path):
    for n in (10, 20):
        save_checkpoint(tmp_path, {"w": _weights(n)}, None, n, None, {})
    flip_byte(tmp_path / "step-000020" / "model.safetensors", 100)
    _refused(lambda: load_checkpoint(tmp_path, step=20), "step-000020", "sha256")
    _refused(lambda: load_checkpoint(tmp_path, step=15), "step-000015", "does not exist")
    assert load_checkpoint(tmp_path, step=10).step == 10
    ck = load_checkpoint(tmp_path)
    assert ck.step == 10 and [s[0] for s in ck.skipped] == ["step-000020"]


def test_torch_load_of_a_named_damaged_unsharded_step_raises_and_changes_nothing(tmp_path):
    for n in (10, 20):
        net = _net()
        with torch.no_grad():
            net.weight.copy_(torch.from_numpy(_weights(n)))
        tt.save(tmp_path, n, net)
    victim = tmp_path / "step-000020" / "model.safetensors"
    flip_byte(victim, victim.stat().st_size - 3)
    fresh = _net()
    before = fresh.weight.detach().clone()
    _refused(lambda: tt.load(tmp_path, fresh, step=20), "step-000020", "sha256")
    assert torch.equal(fresh.weight, before)
    ck = tt.load(tmp_path, fresh)
    assert ck.step == 10 and [s[0] for s in ck.skipped] == ["step-000020"]
    assert torch.equal(fresh.weight, torch.from_numpy(_weights(10)))


def test_torch_load_of_a_named_sharded_step_whose_piece_fails_raises(tmp_path):
    for n in (10, 20):
        path = save_sharded(tmp_path, n, {("model", "weight"): _weights(n)}, ranks=2, split=row_chunks)
    victim = Path(path) / "model-rank00001.safetensors"
    flip_byte(victim, victim.stat().st_size - 3)  # a data byte: only the read finds it
    fresh = _net()
    before = fresh.weight.detach().clone()
    text = _refused(lambda: tt.load(tmp_path, fresh, step=20), "step-000020", "model-rank00001.safetensors")
    assert "on rank" not in text, text
    assert torch.equal(fresh.weight, before)
    # No step named: step 20 is skipped for step 10, and skipped says exactly that (no
    # step 19, which never existed; no rank, in a load that is not distributed).
    ck = tt.load(tmp_path, fresh)
    assert ck.step == 10
    assert [s[0] for s in ck.skipped] == ["step-000020"], ck.skipped
    assert "model-rank00001.safetensors" in ck.skipped[0][1] and "on rank" not in ck.skipped[0][1], ck.skipped
    assert torch.equal(fresh.weight, torch.from_numpy(_weights(10)))
