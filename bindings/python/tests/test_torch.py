"""tlio.torch (python.md): odd state round-trips bit for bit, a loop resumes bitwise,
SIGKILL at random instants and every failpoint of the save leave a resumable run, and
the files are checkpoint.md's (the CLI verifies them)."""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt  # noqa: E402
from tlio.checkpoint import verify_step_dir  # noqa: E402
from tlio.safetensors import read_header  # noqa: E402
from _tokens_helpers import tlio, write_shard  # noqa: E402

HERE = Path(__file__).parent
CHILD = HERE / "_torch_child.py"
sys.path.insert(0, str(HERE))
import _torch_child as child  # noqa: E402

torch.set_num_threads(1)


def tbytes(t):
    return child.tbytes(t)


def assert_same(a, b, where=""):
    """Tensors, dicts, lists and plain values equal, tensors bit for bit with dtype and shape."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, tuple(a.shape)) == (b.dtype, tuple(b.shape)), where
        assert tbytes(a) == tbytes(b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, a.keys(), b.keys())
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


class Odd(torch.nn.Module):
    """Every awkward kind of state: bf16 and fp16 parameters, a non-contiguous buffer,
    BatchNorm running stats (and its int64 counter), a tied embedding and head, a
    parameter that never gets a gradient, a bool buffer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)
        self.bn = torch.nn.BatchNorm1d(6)
        self.fp16 = torch.nn.Linear(6, 6).to(torch.float16)
        self.brain = torch.nn.Linear(6, 6).to(torch.bfloat16)
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight
        self.unused = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("transposed", torch.randn(4, 5).t())
        self.register_buffer("mask", torch.rand(5) > 0.5)

    def forward(self, x):
        h = self.bn(self.emb(x))
        h = h + self.fp16(h.half()).float() + self.brain(h.bfloat16()).float()
        return self.head(h)


def odd_setup(seed, opt_kind="adamw"):
    torch.manual_seed(seed)
    m = Odd()
    body = [p for n, p in m.named_parameters() if not n.startswith("emb")]
    groups = [{"params": [m.emb.weight], "lr": 0.01}, {"params": body, "lr": 0.003}]
    if opt_kind == "adamw":
        opt = torch.optim.AdamW(groups, weight_decay=0.05)
    elif opt_kind == "adam":
        opt = torch.optim.Adam(groups, betas=(0.8, 0.9))
    elif opt_kind == "sgd":
        opt = torch.optim.SGD(groups, lr=0.1)
    else:
        opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True)
    return m, opt


def odd_step(m, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (8,), generator=g)
    loss = torch.nn.functional.cross_entropy(m(x), torch.randint(0, 10, (8,), generator=g))
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.mark.parametrize("opt_kind", ["adamw", "adam", "sgd", "sgd_momentum"])
def test_roundtrip_of_odd_state_is_bitwise(tmp_path, opt_kind):
    m, opt = odd_setup(0, opt_kind)
    for s in range(3):
        odd_step(m, opt, s)
    assert not m.transposed.is_contiguous()
    assert m.unused not in opt.state or not opt.state[m.unused]
    path = tt.save(tmp_path, 3, m, opt, extra={"tokens_seen": 24, "lr": 0.01})
    assert verify_step_dir(path) == []
    header, meta = read_header(Path(path) / "model.safetensors")
    assert header["brain.weight"][0] == "BF16" and header["fp16.weight"][0] == "F16"
    assert header["bn.num_batches_tracked"][0] == "I64" and header["mask"][0] == "BOOL"
    assert "head.weight" not in header and meta["tied"] == '{"head.weight":"emb.weight"}'

    m2, opt2 = odd_setup(1, opt_kind)
    for g in opt2.param_groups:
        g["lr"] = 0.5
    ck = tt.load(tmp_path, m2, opt2)
    assert ck.step == 3 and ck.extra["tokens_seen"] == 24
    assert m2.head.weight is m2.emb.weight
    assert_same(m.state_dict(), m2.state_dict(), "model")
    assert_same(opt.state_dict(), opt2.state_dict(), "optimizer")
    # The restored state trains on exactly as the original.
    odd_step(m, opt, 9)
    odd_step(m2, opt2, 9)
    assert_same(m.state_dict(), m2.state_dict(), "model after a step")
    assert_same(opt.state_dict(), opt2.state_dict(), "optimizer after a step")


def test_tie_is_restored_into_an_untied_model(tmp_path):
    m, opt = odd_setup(0)
    tt.save(tmp_path, 1, m, None)
    torch.manual_seed(3)
    m2 = Odd()
    m2.head.weight = torch.nn.Parameter(torch.zeros(10, 6))
    tt.load(tmp_path, m2)
    assert m2.head.weight is m2.emb.weight
    assert_same(m.state_dict(), m2.state_dict())


def test_optimizer_param_the_model_does_not_name(tmp_path):
    m, _ = odd_setup(0)
    stray = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([*m.parameters(), stray], lr=0.1)
    with pytest.raises(ValueError, match="does not name"):
        tt.save(tmp_path, 1, m, opt)
    assert not (tmp_path / "step-000001").exists()
    tt.save(tmp_path, 1, m, torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="does not name"):
        tt.load(tmp_path, m, opt)
    with pytest.raises(ValueError, match="torch.SGD"):
        tt.load(tmp_path, m, torch.optim.AdamW(m.parameters()))


def test_small_loop_resumes_bitwise(tmp_path):
    shard = write_shard(tmp_path / "shard.bin", [random.Random(1).randrange(64) for _ in range(4000)], vocab=64)
    full = subprocess.run([sys.executable, str(CHILD), "train", str(tmp_path / "a"), str(shard), "12", "100"],
                          capture_output=True, text=True, timeout=300, check=True)
    first = subprocess.run([sys.executable, str(CHILD), "train", str(tmp_path / "b"), str(shard), "7", "7"],
                           capture_output=True, text=True, timeout=300, check=True)
    resumed = subprocess.run([sys.executable, str(CHILD), "train", str(tmp_path / "b"), str(shard), "12", "100"],
                             capture_output=True, text=True, timeout=300, check=True)
    assert first.stdout != full.stdout
    assert resumed.stdout.splitlines()[-1] == full.stdout.splitlines()[-1]


def _no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def test_sigkill_at_random_instants_resumes_bitwise(tmp_path):
    shard = write_shard(tmp_path / "shard.bin", [random.Random(2).randrange(64) for _ in range(20000)], vocab=64)
    steps, k = "400", "5"
    args = [sys.executable, str(CHILD), "train"]
    full = subprocess.run([*args, str(tmp_path / "full"), str(shard), steps, k],
                          capture_output=True, text=True, timeout=600, check=True)
    want = full.stdout.splitlines()[-1]
    dir = tmp_path / "killed"
    rnd = random.Random(20)
    kills = 0
    # Killed at chosen steps, not after chosen delays: a delay measures the machine's
    # speed (a fast one finishes before it), a step is the same everywhere. Every
    # other kill lands right after a multiple of K, inside that step's save.
    for i in range(6):
        p = subprocess.Popen([*args, str(dir), str(shard), steps, k], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_no_core_dumps)
        start = int(p.stdout.readline().split()[1])
        target = start + rnd.randint(1, 40)
        if i % 2 == 0:
            target += -target % int(k)
        for line in p.stdout:
            if line == f"step {target}\n":
                break
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=600)
        assert p.returncode == -signal.SIGKILL, f"the child ended before step {target}"
        kills += 1
    assert kills >= 5 and (dir / "LATEST").exists()
    done = subprocess.run([*args, str(dir), str(shard), steps, k], capture_output=True, text=True,
                          timeout=600, check=True)
    assert done.stdout.splitlines()[-1] == want
    tlio("ckpt", "verify", str(dir))


def test_every_failpoint_of_the_save_leaves_a_loadable_step(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FAILPOINTS"}
    expected = {}
    for step in (1, 2):
        m, opt = child.fresh(step)
        m(torch.arange(child.SEQ).view(1, -1)).sum().backward()
        opt.step()
        expected[step] = (m.state_dict(), opt.state_dict())
    finished = {}
    for point in ("ckpt/fsync", "ckpt/rename"):
        seen = set()
        for n in range(40):
            d = tmp_path / f"{point.replace('/', '_')}_{n}"
            subprocess.run([sys.executable, str(CHILD), "save", str(d), "1"], env=env, check=True,
                           capture_output=True, timeout=120)
            out = subprocess.run([sys.executable, str(CHILD), "save", str(d), "2"],
                                 env={**env, "FAILPOINTS": f"{point}={n}*off->return"},
                                 capture_output=True, text=True, timeout=120, preexec_fn=_no_core_dumps)
            m, opt = child.fresh(5)
            ck = tt.load(d, m, opt)
            assert_same(expected[ck.step][0], m.state_dict(), f"{point} {n}")
            assert_same(expected[ck.step][1], opt.state_dict(), f"{point} {n}")
            tlio("ckpt", "verify", str(d))
            if out.returncode == 0:
                assert ck.step == 2
                finished[point] = n
                break
            assert out.returncode == -signal.SIGABRT, out.stderr
            seen.add(ck.step)
        else:
            raise AssertionError(f"{point} never let the save finish")
        assert 1 in seen, (point, seen)
    assert finished["ckpt/fsync"] >= 8 and finished["ckpt/rename"] == 2, finished


def test_cli_verifies_and_picks_a_torch_checkpoint(tmp_path):
    m, opt = odd_setup(0)
    odd_step(m, opt, 0)
    tt.save(tmp_path, 1, m, opt, config={"model": "odd"})
    path = tt.save(tmp_path, 2, m, opt, config={"model": "odd"}, keep=1)
    tlio("ckpt", "verify", str(tmp_path))
    assert tlio("ckpt", "latest", str(tmp_path)).stdout.strip() == path
    assert not (tmp_path / "step-000001").exists()
    with pytest.raises(ValueError, match="overwrite=True"):
        tt.save(tmp_path, 2, m, opt)
    tt.save(tmp_path, 2, m, opt, overwrite=True, config={"model": "odd"})


def test_load_checkpoint_reads_a_torch_checkpoint_as_numpy(tmp_path):
    from tlio.checkpoint import load_checkpoint

    m, opt = odd_setup(0)
    odd_step(m, opt, 0)
    tt.save(tmp_path, 1, m, opt)
    ck = load_checkpoint(tmp_path)
    assert ck.step == 1 and ck.opt["type"] == "torch.AdamW"
    sd = m.state_dict()
    assert ck.model["fp16.weight"].dtype == np.float16
    assert np.array_equal(ck.model["fp16.weight"], sd["fp16.weight"].numpy())
    assert np.array_equal(ck.model["brain.weight"], sd["brain.weight"].float().numpy())
    assert np.array_equal(ck.model["bn.num_batches_tracked"], sd["bn.num_batches_tracked"].numpy())
    assert "head.weight" not in ck.model
    assert np.array_equal(ck.opt["state"]["emb.weight"]["exp_avg"], opt.state[m.emb.weight]["exp_avg"].numpy())
    assert [g["params"] for g in ck.opt["param_groups"]][0] == ["emb.weight"]
