"""A loop's other state in tlio.torch checkpoints (``state={"scheduler": sched, ...}``):
each named object's ``state_dict()`` stored as JSON and given back to its
``load_state_dict()`` on load, exactly (floats to the bit), by unsharded, async and
sharded saves; a value JSON cannot hold refused naming its key, with nothing written; a
load that cannot restore every named object changes none; the example with a cosine
schedule killed with SIGKILL resumes bitwise. Also: arguments of the wrong type are
TypeErrors naming the argument."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt
from _tokens_helpers import ROOT, tlio
from test_torch_dist import TIMEOUT, _env, _no_core_dumps

torch.set_num_threads(1)
EXAMPLE = ROOT / "examples" / "train_torch.py"


def setup(seed: int):
    """A tiny model, AdamW, a cosine schedule and a GradScaler."""
    torch.manual_seed(seed)
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 13, growth_interval=3)
    return m, opt, sched, scaler


def train(m, opt, sched, scaler, steps: int) -> None:
    for _ in range(steps):
        loss = m(torch.ones(4, 3)).square().sum()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()


class Custom:
    """A Stateful object of every JSON kind, floats that are not round in decimal."""

    def __init__(self, value=None):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, sd):
        if "value" not in sd:
            raise KeyError("value")
        self.value = sd["value"]


ODD = {"f": [0.1, 1 / 3, 2.0 ** -1074, -0.0, 1e308], "i": 2 ** 62 + 1, "b": [True, False], "n": None,
       "s": "caf\u00e9 \U0001f600", "nested": {"k": [[1, 2], {}]}}


@pytest.mark.parametrize("blocking", [True, False])
def test_states_round_trip_exactly(tmp_path, blocking):
    m, opt, sched, scaler = setup(0)
    train(m, opt, sched, scaler, 4)
    custom = Custom(ODD)
    p = tt.save(tmp_path, 4, m, opt, state={"scheduler": sched, "scaler": scaler, "custom": custom},
                blocking=blocking)
    if not blocking:
        custom.value = "changed after the save returned"  # the state at the call is saved
        p = p.wait()
    m2, opt2, sched2, scaler2 = setup(1)
    custom2 = Custom()
    ck = tt.load(tmp_path, m2, opt2, state={"scheduler": sched2, "scaler": scaler2, "custom": custom2})
    assert sched2.state_dict() == sched.state_dict() and scaler2.state_dict() == scaler.state_dict()
    assert scaler2.get_scale() == scaler.get_scale() != 2.0 ** 13
    assert json.dumps(custom2.value) == json.dumps(ODD)  # -0.0 and the float bits included
    assert set(ck.state) == {"scheduler", "scaler", "custom"} and ck.state["custom"] == {"value": ODD}
    # Training on from the loaded state is training on from the saved one.
    train(m, opt, sched, scaler, 3)
    train(m2, opt2, sched2, scaler2, 3)
    assert torch.equal(m.weight, m2.weight) and opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]
    # A load that names no state ignores the stored ones.
    assert tt.load(tmp_path, setup(2)[0]).state == ck.state
    tlio("ckpt", "verify", str(tmp_path))


class Holding(Custom):
    def state_dict(self):
        return {"ok": 1, "deep": [{"x": self.value}]}


@pytest.mark.parametrize("value, where", [
    (torch.ones(2), "Tensor"), (float("nan"), "nan"), (float("inf"), "inf"), ({1: 2}, "key 1"),
    ({3}, "set"), (object(), "object"), (b"raw", "bytes"),
])
def test_a_value_json_cannot_hold_is_refused_naming_its_key(tmp_path, value, where):
    m, opt, sched, _ = setup(0)
    for blocking in (True, False):
        with pytest.raises(ValueError) as info:
            tt.save(tmp_path, 1, m, opt, state={"sched": sched, "mine": Holding(value)}, blocking=blocking)
        assert "state['mine']['deep'][0]['x']" in str(info.value) and where in str(info.value), info.value
    assert not os.path.exists(tmp_path / "step-000001") and not os.path.exists(tmp_path / "LATEST")


def test_a_load_missing_a_state_or_failing_one_changes_nothing(tmp_path):
    m, opt, sched, scaler = setup(0)
    train(m, opt, sched, scaler, 2)
    tt.save(tmp_path, 2, m, opt, state={"scheduler": sched, "custom": Custom(5)})
    m2, opt2, sched2, scaler2 = setup(1)
    before = (m2.weight.clone(), sched2.state_dict(), scaler2.state_dict())
    with pytest.raises(ValueError, match=r"holds no state 'scaler' \(it holds: 'custom', 'scheduler'\)"):
        tt.load(tmp_path, m2, opt2, state={"scheduler": sched2, "scaler": scaler2})
    assert torch.equal(m2.weight, before[0]) and sched2.state_dict() == before[1]

    class Refusing(Custom):
        def load_state_dict(self, sd):
            raise RuntimeError("refused by the object itself")

    with pytest.raises(RuntimeError, match="refused by the object"):
        tt.load(tmp_path, m2, opt2, state={"scheduler": sched2, "custom": Refusing()})
    # The scheduler, loaded before the refusal, got its old state back; the model and
    # the optimizer are untouched.
    assert sched2.state_dict() == before[1] and torch.equal(m2.weight, before[0])
    assert opt2.param_groups[0]["lr"] == 0.1 and not opt2.state


def test_wrong_argument_types_are_type_errors_naming_the_argument(tmp_path):
    m, opt, sched, _ = setup(0)
    saves = {
        "optimizer": dict(optimizer={}), "stream": dict(stream=object()), "extra": dict(extra=5),
        "config": dict(config=[1]), "overwrite": dict(overwrite="yes"), "state": dict(state=5),
        "state['s']": dict(state={"s": 3}), "state names": dict(state={1: sched}),
    }
    for name, kw in saves.items():
        args = {"optimizer": opt, **kw}
        with pytest.raises(TypeError, match=name.split("[")[0]):
            tt.save(tmp_path, 1, m, args.pop("optimizer"), **args)
    for bad_model in (None, {"w": torch.ones(1)}):
        with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
            tt.save(tmp_path, 1, bad_model)
    with pytest.raises(TypeError, match="dir must be"):
        tt.save(3, 1, m)
    assert not os.listdir(tmp_path)
    tt.save(tmp_path, 1, m, opt)
    loads = {"optimizer": dict(optimizer={}), "stream": dict(stream=object()),
             "state": dict(state={"s": object()})}
    for name, kw in loads.items():
        with pytest.raises(TypeError, match=name):
            tt.load(tmp_path, m, **kw)
    with pytest.raises(TypeError, match="model must be"):
        tt.load(tmp_path, object())


SHARDED = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    import tlio.torch as tt
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)

    def setup(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        fully_shard(m)
        opt = torch.optim.AdamW(m.parameters(), lr=0.1)
        return m, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=9)

    m, opt, sched = setup(0)
    for _ in range(3):
        m(torch.ones(2, 4)).sum().backward()
        opt.step(); sched.step()
    out = sys.argv[1]
    tt.save(os.path.join(out, "blocking"), 3, m, opt, state={"sched": sched})
    tt.save(os.path.join(out, "async"), 3, m, opt, state={"sched": sched}, blocking=False).wait()
    report = {"saved": sched.state_dict()}
    for kind in ("blocking", "async"):
        m2, opt2, sched2 = setup(1)
        ck = tt.load(os.path.join(out, kind), m2, opt2, state={"sched": sched2})
        report[kind] = sched2.state_dict()
        report[kind + "_ck"] = ck.state
    json.dump(report, open(os.path.join(out, "report.json"), "w"))
    dist.destroy_process_group()
""")


def test_sharded_and_async_sharded_saves_keep_the_state(tmp_path):
    """FSDP2 on a group of one (the sharded save and load, blocking and async)."""
    out = subprocess.run([sys.executable, "-c", SHARDED, str(tmp_path), str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["saved"]["last_epoch"] == 3
    for kind in ("blocking", "async"):
        assert (tmp_path / kind / "step-000003" / "shards.json").exists(), kind
        assert report[kind] == report["saved"] and report[kind + "_ck"] == {"sched": report["saved"]}, kind
        tlio("ckpt", "verify", str(tmp_path / kind))


def test_example_with_a_cosine_schedule_killed_resumes_bitwise(tmp_path):
    """train_torch.py --lr-schedule cosine, SIGKILLed after its first save and again
    (saving async) after its second, each time resumed: the digests of an uninterrupted
    run, and not those of a run that resumes without the scheduler's state."""
    shard = tmp_path / "train.bin"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", str(shard))
    base = [sys.executable, str(EXAMPLE), "--shard", str(shard), "--steps", "30", "--every", "10",
            "--lr-schedule", "cosine"]
    run = dict(capture_output=True, text=True, timeout=TIMEOUT, env=_env(), check=True)
    want = subprocess.run([*base, "--out", str(tmp_path / "full")], **run).stdout.splitlines()[-1]
    constant = subprocess.run([*base[:-2], "--out", str(tmp_path / "constant")], **run).stdout.splitlines()[-1]
    assert want.startswith("sha256 state_dict=") and want != constant
    out = tmp_path / "killed"
    for n, (at, extra) in enumerate(((14, []), (26, ["--async-save"]))):
        p = subprocess.Popen([*base, "--out", str(out), *(["--resume"] if n else []), *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(),
                             preexec_fn=_no_core_dumps)
        for line in p.stdout:
            if line.startswith(f"rank 0 step {at} "):
                p.send_signal(signal.SIGKILL)
                break
        p.communicate(timeout=TIMEOUT)
        assert p.returncode == -signal.SIGKILL, (at, p.returncode)
    done = subprocess.run([*base, "--out", str(out), "--resume"], **run)
    # Step 20's async save had committed, or was lost with the process: either is sound.
    assert done.stdout.splitlines()[0].split()[-1] in ("10", "20")
    assert done.stdout.splitlines()[-1] == want
    tlio("ckpt", "verify", str(out))
