"""tlio.torch.load (python.md) checks the whole step before it applies anything: the
model's names, shapes and dtypes (never a silent cast), the optimizer's class, JSON,
hyper-parameters and state tensors, and the stream's cursor. A refused load raises
ValueError naming the file and the key, and leaves the model, the optimizer and the
stream exactly as they were. Param groups are matched by their sets of names."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt  # noqa: E402
from tlio.pcg import PCG32  # noqa: E402
from tlio.safetensors import load_safetensors, read_header, save_safetensors  # noqa: E402
from tlio.tokens import TokenStream  # noqa: E402
from _tokens_helpers import write_shard  # noqa: E402

torch.set_num_threads(1)


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


class Net(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.a = torch.nn.Linear(3, 4).to(dtype)
        self.b = torch.nn.Linear(4, 2).to(dtype)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def trained(seed: int, dtype=torch.float32, opt_cls=torch.optim.AdamW):
    torch.manual_seed(seed)
    m = Net(dtype)
    opt = opt_cls(m.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(5, 3, dtype=dtype)).square().sum().backward()
        opt.step()
    return m, opt


def snapshot(m, opt, stream):
    """Everything a load could change: each tensor's bytes, the Parameter objects, the
    optimizer's state and groups, the stream's cursor."""
    sd = opt.state_dict() if opt is not None else None
    return (
        {k: (t.dtype, tuple(t.shape), raw(t)) for k, t in m.state_dict().items()},
        [id(p) for p in m.parameters()],
        None if sd is None else {
            i: {k: raw(v) if isinstance(v, torch.Tensor) else v for k, v in s.items()} for i, s in sd["state"].items()
        },
        None if sd is None else sd["param_groups"],
        None if stream is None else stream.cursor(),
    )


@pytest.fixture
def shards(tmp_path):
    rnd = random.Random(5)
    return [write_shard(tmp_path / f"s{i}.bin", [rnd.randrange(50) for _ in range(600)], vocab=50) for i in range(2)]


def stream_of(paths, at=0):
    s = TokenStream([str(p) for p in paths], seq_len=8, batch=2, rng=PCG32(3))
    for _ in range(at):
        s.next_batch()
    return s


def saved(tmp_path, shards, with_stream=True, **kw):
    """A step saved from a trained model, AdamW and a stream that has moved on; returns
    the checkpoint directory and a different target (model, optimizer, stream)."""
    m, opt = trained(0, **kw)
    s = stream_of(shards, 40)
    assert s.cursor()["shard"] == 1
    ckpt = tmp_path / "ckpt"
    tt.save(ckpt, 1, m, opt, s if with_stream else None)
    tm, topt = trained(1, **kw)
    return ckpt, tm, topt, stream_of(shards, 3)


def refused(ckpt, m, opt, stream, match):
    before = snapshot(m, opt, stream)
    with pytest.raises(ValueError, match=match):
        tt.load(ckpt, m, opt, stream)
    assert snapshot(m, opt, stream) == before


def test_another_optimizer_class_changes_nothing(tmp_path, shards):
    ckpt, m, _, s = saved(tmp_path, shards)
    sgd = torch.optim.SGD(m.parameters(), lr=0.5)
    refused(ckpt, m, sgd, s, "'torch.AdamW' state, the optimizer is 'torch.SGD'")


def test_a_missing_cursor_changes_nothing(tmp_path, shards):
    ckpt, m, opt, s = saved(tmp_path, shards, with_stream=False)
    refused(ckpt, m, opt, s, "no data_cursor")


def test_a_cursor_the_stream_refuses_changes_nothing(tmp_path, shards):
    ckpt, m, opt, _ = saved(tmp_path, shards)
    one_shard = stream_of(shards[:1], 3)  # the saved cursor is in shard 1
    refused(ckpt, m, opt, one_shard, "shard")


class Wider(Net):
    def __init__(self):
        super().__init__()
        self.b = torch.nn.Linear(4, 3)


class Extra(Net):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Linear(2, 2)


@pytest.mark.parametrize("cls, match", [
    (Wider, r"'b\.weight' has shape \[2, 4\] in the checkpoint and \[3, 4\] in the model"),
    (Extra, r"missing \['c\.weight', 'c\.bias'\], unexpected \[\]"),
])
def test_a_state_dict_mismatch_is_a_value_error_and_changes_nothing(tmp_path, shards, cls, match):
    ckpt, _, _, s = saved(tmp_path, shards)
    m = cls()
    refused(ckpt, m, torch.optim.AdamW(m.parameters()), s, match)
    refused(ckpt, m, None, None, match)


class Holder(torch.nn.Module):
    def __init__(self, t):
        super().__init__()
        self.register_buffer("x", t)


@pytest.mark.parametrize("saved_t, target, names", [
    (torch.ones(3, dtype=torch.float32), torch.zeros(3, dtype=torch.bfloat16), "torch.float32.*torch.bfloat16"),
    (torch.ones(3, dtype=torch.complex64), torch.zeros(3, dtype=torch.float32), "torch.complex64.*torch.float32"),
    (torch.ones(3, dtype=torch.float16), torch.zeros(3, dtype=torch.float32), "torch.float16.*torch.float32"),
])
def test_another_dtype_is_refused_naming_both(tmp_path, saved_t, target, names):
    tt.save(tmp_path, 1, Holder(saved_t))
    m = Holder(target)
    refused(tmp_path, m, None, None, rf"tensor 'x' is {names}")


def test_a_model_of_another_dtype_is_refused_before_its_optimizer(tmp_path, shards):
    ckpt, _, _, s = saved(tmp_path, shards)
    m, opt = trained(1, dtype=torch.bfloat16)
    refused(ckpt, m, opt, s, r"'a\.weight' is torch\.float32 in the checkpoint and torch\.bfloat16 in the model")


# --- A step whose files verify (the manifest is resealed) but whose content is wrong.


def reseal(step: Path, name: str, tensors=None, meta=None) -> None:
    """Rewrite ``name`` of a step with other tensors or metadata, and its manifest entry
    to match, as a writer that gets the content wrong but the protocol right would."""
    path = step / name
    arrays, old_meta = load_safetensors(path)
    save_safetensors(path, tensors if tensors is not None else arrays, meta if meta is not None else old_meta)
    data = path.read_bytes()
    manifest = json.loads((step / "MANIFEST.json").read_text())
    old = next(f for f in manifest["files"] if f["name"] == name)
    text = (step / "MANIFEST.json").read_text()
    text = text.replace(f'"name":"{name}","size":{old["size"]},"sha256":"{old["sha256"]}"',
                        f'"name":"{name}","size":{len(data)},"sha256":"{hashlib.sha256(data).hexdigest()}"')
    (step / "MANIFEST.json").write_text(text)


def _state(meta):
    return json.loads(meta["state"])


def edit_json(edit):
    def apply(arrays, meta):
        doc = _state(meta)
        edit(doc)
        return arrays, {**meta, "state": json.dumps(doc)}
    return apply


def edit_tensor(name, make):
    def apply(arrays, meta):
        return {**arrays, name: make(arrays[name])}, meta
    return apply


OPTIMIZER_CASES = {
    "state entry not an object": (edit_json(lambda d: d["state"].update({"a.weight": 5})),
                                  r"`state` of metadata `state` is not an object of objects"),
    "string lr": (edit_json(lambda d: d["param_groups"][0].update(lr="0.01")),
                  r"`param_groups\[0\]\.lr` is '0\.01', where the optimizer has a number"),
    "bool weight decay": (edit_json(lambda d: d["param_groups"][0].update(weight_decay=True)),
                          r"`param_groups\[0\]\.weight_decay` is True"),
    "one beta": (edit_json(lambda d: d["param_groups"][0].update(betas=[0.9])),
                 r"`param_groups\[0\]\.betas` has 1 entries, the optimizer's 2"),
    "params twice": (edit_json(lambda d: d["param_groups"][0]["params"].append("a.bias")),
                     r"`param_groups\[0\]\.params` names a parameter twice"),
    "state shadows a tensor": (edit_json(lambda d: d["state"].update({"a.bias": {"exp_avg": 1}})),
                               r"'a\.bias\.exp_avg' is both a tensor and an entry of `state`"),
    "exp_avg of another shape": (edit_tensor("a.weight.exp_avg", lambda a: a[:2].copy()),
                                 r"'a\.weight\.exp_avg' has shape \[2, 3\], not the shape \[4, 3\]"),
    "exp_avg of another dtype": (edit_tensor("b.bias.exp_avg_sq", lambda a: a.astype(np.float16)),
                                 r"'b\.bias\.exp_avg_sq' is torch\.float16 in the checkpoint and torch\.float32"),
    "step not a number": (edit_tensor("b.bias.step", lambda a: np.zeros(3, np.float32)),
                          r"'b\.bias\.step' has shape \[3\], not (the shape \[\]|a single number)"),
}


@pytest.mark.parametrize("case", sorted(OPTIMIZER_CASES))
@pytest.mark.parametrize("fresh", [False, True], ids=["trained", "fresh"])
def test_a_wrong_optimizer_file_is_refused_at_load(tmp_path, shards, case, fresh):
    ckpt, m, opt, s = saved(tmp_path, shards)
    if fresh:  # an optimizer that holds no state yet: the rules come from the parameter
        opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    step = ckpt / "step-000001"
    edit, match = OPTIMIZER_CASES[case]
    if fresh and "shape" in case:
        match = match.replace("not the shape", "not (the parameter's shape|a single number)")
    arrays, meta = load_safetensors(step / "optimizer.safetensors")
    arrays, meta = edit(arrays, meta)
    reseal(step, "optimizer.safetensors", arrays, meta)
    assert tt.load(ckpt, Net(), None).step == 1  # the step verifies: only its content is wrong
    refused(ckpt, m, opt, s, rf"optimizer\.safetensors: .*{match}")


@pytest.mark.parametrize("tied", ['["a.weight"]', '{"x": 1}', "{not json", '{"a.bias": "a.weight"}'])
def test_a_wrong_tie_table_is_refused_at_load(tmp_path, shards, tied):
    ckpt, m, opt, s = saved(tmp_path, shards)
    step = ckpt / "step-000001"
    reseal(step, "model.safetensors", meta={**read_header(step / "model.safetensors")[1], "tied": tied})
    refused(ckpt, m, opt, s, r"model\.safetensors: ")


def test_a_hyper_parameter_the_file_lacks_keeps_the_optimizer_s(tmp_path, shards):
    ckpt, m, opt, s = saved(tmp_path, shards)
    step = ckpt / "step-000001"
    arrays, meta = load_safetensors(step / "optimizer.safetensors")
    reseal(step, "optimizer.safetensors", *edit_json(lambda d: d["param_groups"][0].pop("lr"))(arrays, meta))
    opt.param_groups[0]["lr"] = 0.25
    tt.load(ckpt, m, opt, s)
    assert opt.param_groups[0]["lr"] == 0.25
    opt.step()


# --- Param groups by names.


def test_param_order_inside_a_group_and_group_order_are_free(tmp_path):
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.AdamW([{"params": [m.a.weight, m.a.bias], "lr": 0.01},
                             {"params": [m.b.weight, m.b.bias], "lr": 0.02, "betas": (0.8, 0.9)}])
    m(torch.randn(5, 3)).square().sum().backward()
    opt.step()
    tt.save(tmp_path, 1, m, opt)
    m2 = Net()
    opt2 = torch.optim.AdamW([{"params": [m2.b.bias, m2.b.weight], "lr": 0.5},
                              {"params": [m2.a.bias, m2.a.weight], "lr": 0.5}])
    tt.load(tmp_path, m2, opt2)
    assert [g["lr"] for g in opt2.param_groups] == [0.02, 0.01]
    assert opt2.param_groups[0]["betas"] == (0.8, 0.9)
    assert [p is q for p, q in zip(opt2.param_groups[0]["params"], [m2.b.bias, m2.b.weight])] == [True, True]
    for name in ("a.weight", "a.bias", "b.weight", "b.bias"):
        p, p2 = m.get_parameter(name), m2.get_parameter(name)
        assert opt.state[p].keys() == opt2.state[p2].keys()
        for key in opt.state[p]:
            assert raw(opt.state[p][key]) == raw(opt2.state[p2][key]), (name, key)
    # Both train on identically.
    for model, o in ((m, opt), (m2, opt2)):
        o.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        o.step()
    assert all(raw(t) == raw(m2.state_dict()[k]) for k, t in m.state_dict().items())


def test_groups_of_other_sets_are_refused(tmp_path):
    m = Net()
    tt.save(tmp_path, 1, m, torch.optim.AdamW([{"params": [m.a.weight, m.b.weight]},
                                               {"params": [m.a.bias, m.b.bias]}]))
    opt = torch.optim.AdamW([{"params": [m.a.weight, m.a.bias]}, {"params": [m.b.weight, m.b.bias]}])
    refused(tmp_path, m, opt, None, "are not the saved ones")
