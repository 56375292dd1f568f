"""What a checkpoint load returns is the bytes it verified, read once into owned
memory: a save deleting the step meanwhile (keep) never makes a load fail while a
verified step exists, and a checkpoint file truncated or rewritten in place after the
load never reaches the loaded arrays, tensors or optimizer state (no SIGBUS)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tlio.checkpoint import load_checkpoint, save_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _ckpt_helpers import adamw  # noqa: E402

F32 = np.float32

# Saves the racing saver makes; every load made meanwhile must succeed.
RACE_SAVES = 300


def _model(step: int):
    return {"w": np.full((64, 64), step, F32), "b": np.arange(64, dtype=F32) + step}


def test_a_loader_racing_a_saver_with_keep_1_never_fails(tmp_path):
    """keep=1 deletes the previous step right after LATEST moves; a load that chose
    that step must start over from the new one, never report "no loadable checkpoint"
    (a verified step existed at every instant)."""
    ck = tmp_path / "ck"
    save_checkpoint(ck, _model(0), None, 0, None, None, keep=1)
    done = threading.Event()
    errors = []

    def saver():
        try:
            for step in range(1, RACE_SAVES + 1):
                save_checkpoint(ck, _model(step), None, step, None, None, keep=1)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=saver)
    t.start()
    loads, failures, last = 0, [], -1
    while not done.is_set():
        try:
            c = load_checkpoint(ck)
        except (FileNotFoundError, ValueError, OSError) as e:
            failures.append(repr(e))
            continue
        loads += 1
        # The arrays are the step's own bytes, and steps never go backwards.
        assert c.model["w"][0, 0] == c.step and c.model["b"][0] == c.step
        assert c.step >= last
        last = c.step
    t.join()
    assert not errors, errors
    assert failures == [], f"{len(failures)} of {loads + len(failures)} loads failed: {failures[:3]}"
    assert loads > 0


CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import torch
    import tlio.torch
    from tlio.checkpoint import load_checkpoint

    ck, what = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 256)).sum().backward()
    opt.step()
    path = tlio.torch.save(ck, 1, model, opt)
    if what == "torch":
        model2 = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
        c = tlio.torch.load(ck, model2, opt2)
    else:
        c = load_checkpoint(ck)
    # Every file of the step rewritten in place, shorter (as `open(p, "wb")` does).
    for name in os.listdir(path):
        with open(os.path.join(path, name), "wb") as f:
            f.write(b"x")
    if what == "torch":
        model2(torch.randn(8, 256)).sum().backward()
        opt2.step()  # writes the loaded exp_avg / exp_avg_sq in place
        total = sum(float(s["exp_avg"].sum()) for s in opt2.state.values())
        # The returned state dict too (it is what was loaded, not a view of the file).
        total += sum(float(t.double().sum()) for t in c.model.values())
    else:
        arrays = list(c.model.values()) + [a for e in c.opt["state"].values() for a in e.values() if isinstance(a, np.ndarray)]
        total = sum(float(np.asarray(a, np.float64).sum()) for a in arrays)
    print("ok", np.isfinite(total))
    """
)


@pytest.mark.parametrize("what", ["torch", "load_checkpoint"])
def test_a_checkpoint_rewritten_in_place_after_a_load_never_reaches_what_was_loaded(tmp_path, what):
    """tlio.torch.load's model and optimizer state, and load_checkpoint's arrays of a
    torch checkpoint, are owned memory: truncating the files afterwards changes nothing
    (a memory map of them would die of SIGBUS at the next access)."""
    pytest.importorskip("torch")
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "ck"), what],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["ok", "True"]


PEAK_CHILD = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    sys.path.insert(0, sys.argv[3])
    from _ckpt_helpers import adamw
    from tlio.checkpoint import load_checkpoint, save_checkpoint

    ck, what = sys.argv[1], sys.argv[2]
    if what == "save":
        rng = np.random.default_rng(0)
        model = {f"layer{i}.weight": rng.standard_normal((1024, 8192), dtype=np.float32) for i in range(4)}
        opt = adamw(model)
        for s in opt["state"].values():
            s["exp_avg"][:] = 0.5
            s["exp_avg_sq"][:] = 0.25
        save_checkpoint(ck, model, opt, 1, None, None)
        sys.exit(0)
    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    before = peak()
    c = load_checkpoint(ck)
    print(peak() - before)
    """
)


def test_a_load_holds_the_state_once_as_writable_views_of_the_verified_bytes(tmp_path):
    """load_checkpoint's float32 arrays are views of the very buffers it read and
    hashed: the load's peak is one copy of the state (not the bytes and a decoded copy
    beside them), and each array is still writable and independent of the others."""
    ck = tmp_path / "ck"
    state_bytes = 3 * 4 * 1024 * 8192 * 4  # model + exp_avg + exp_avg_sq: 384 MiB
    for what in ("save", "load"):
        r = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(ck), what, HERE],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    grown = int(r.stdout.split()[-1])
    assert grown < 1.25 * state_bytes, f"the load grew the peak by {grown >> 20} MiB for a {state_bytes >> 20} MiB state"

    small = tmp_path / "small"
    model = {"w": np.arange(12, dtype=F32).reshape(3, 4), "b": np.ones(3, F32)}
    save_checkpoint(small, model, adamw(model), 1, None, None)
    c = load_checkpoint(small)
    w, b = c.model["w"], c.model["b"]
    assert w.dtype == F32 and w.shape == (3, 4) and w.flags.writeable and w.flags.aligned
    w[:] = -1  # writing one array leaves its neighbours as loaded
    assert (b == 1).all() and (c.opt["state"]["w"]["exp_avg"] == 0).all()
    assert load_checkpoint(small).model["w"].tobytes() == model["w"].tobytes()
