"""tlio.torch (python.md): which tensors a state_dict may hold and how they are stored.

A tie is one storage seen through one view (offset, shape, strides, dtype, conjugate
and negative bits) and, for parameters, one Parameter: it is stored once and restored
as the same object. Anything else that merely shares memory (a conjugate view, two
empty storages, two distinct Parameters over one storage) is stored separately and
comes back with the values it showed. Tensors without plain bytes (meta, sparse,
nested) are refused with a ValueError naming the tensor and why; a DTensor state takes
the sharded save."""

from __future__ import annotations

import json
import warnings

import pytest

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt  # noqa: E402
from tlio.safetensors import read_header  # noqa: E402

torch.set_num_threads(1)


def raw(t: torch.Tensor) -> bytes:
    """The values a tensor shows, as bytes (conjugate and negative bits resolved)."""
    c = t.detach().resolve_conj().resolve_neg().contiguous()
    return c.reshape(-1).view(torch.uint8).numpy().tobytes()


class Views(torch.nn.Module):
    """A complex buffer beside its conjugate view, its imaginary part beside the
    conjugate's (a negative view of the same bytes), and a plain alias (a real tie)."""

    def __init__(self, a: torch.Tensor):
        super().__init__()
        self.register_buffer("a", a)
        self.register_buffer("conj", a.conj())
        self.register_buffer("im", a.imag)
        self.register_buffer("neg_im", a.conj().imag)
        self.register_buffer("alias", a)


def test_conjugate_and_negative_views_keep_their_values(tmp_path):
    m = Views(torch.tensor([1 + 2j, -3 - 4j, 0.5 + 0j], dtype=torch.complex64))
    assert m.conj.is_conj() and m.neg_im.is_neg()
    path = tt.save(tmp_path, 1, m)
    header, meta = read_header(f"{path}/model.safetensors")
    assert set(header) == {"a", "conj", "im", "neg_im"}
    assert json.loads(meta["tied"]) == {"alias": "a"}
    m2 = Views(torch.zeros(3, dtype=torch.complex64))
    tt.load(tmp_path, m2)
    for name, t in m.state_dict().items():
        assert raw(m2.state_dict()[name]) == raw(t), name
    assert torch.equal(m2.conj.resolve_conj(), torch.tensor([1 - 2j, -3 + 4j, 0.5 - 0j]))


class Empties(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.empty(0))
        self.q = torch.nn.Parameter(torch.empty(0, 3))
        self.r = torch.nn.Parameter(torch.empty(0))
        self.w = torch.nn.Parameter(torch.ones(2))


def test_distinct_empty_parameters_stay_distinct(tmp_path):
    m = Empties()
    opt = torch.optim.AdamW(m.parameters())
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    path = tt.save(tmp_path, 1, m, opt)
    header, meta = read_header(f"{path}/model.safetensors")
    assert set(header) == {"p", "q", "r", "w"} and "tied" not in meta
    m2 = Empties()
    opt2 = torch.optim.AdamW(m2.parameters())
    tt.load(tmp_path, m2, opt2)
    assert len(list(m2.parameters())) == 4 and m2.p is not m2.r
    assert set(opt2.state) == set(m2.parameters())


class Shared(torch.nn.Module):
    """Two distinct Parameters over one storage: through one view, or through two."""

    def __init__(self, same_view: bool):
        super().__init__()
        base = torch.arange(12, dtype=torch.float32).view(4, 3)
        self.a = torch.nn.Parameter(base if same_view else base[:2])
        self.b = torch.nn.Parameter(base if same_view else base[2:])


@pytest.mark.parametrize("same_view", [True, False])
def test_distinct_parameters_over_one_storage_round_trip(tmp_path, same_view):
    m = Shared(same_view)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    (m.a.square().sum() + 3 * m.b.sum()).backward()
    opt.step()
    path = tt.save(tmp_path, 1, m, opt)
    assert set(read_header(f"{path}/model.safetensors")[0]) == {"a", "b"}
    m2 = Shared(same_view)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=0.1)
    tt.load(tmp_path, m2, opt2)
    assert m2.a is not m2.b
    assert raw(m2.a) == raw(m.a) and raw(m2.b) == raw(m.b)
    for p, p2 in ((m.a, m2.a), (m.b, m2.b)):
        for key, t in opt.state[p].items():
            assert raw(opt2.state[p2][key]) == raw(t), key


def _odd_tensors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR and nested tensors warn that they are beta
        return {
            "meta": (torch.empty(3, device="meta"), "meta device"),
            "sparse_coo": (torch.eye(3).to_sparse(), "sparse_coo"),
            "sparse_csr": (torch.eye(3).to_sparse_csr(), "sparse_csr"),
            "nested": (torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]), "nested"),
            "jagged": (torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged), "nested"),
        }


class Holder(torch.nn.Module):
    def __init__(self, odd: torch.Tensor):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.inner = torch.nn.Module()
        self.inner.register_buffer("odd", odd)


@pytest.mark.parametrize("kind", sorted(_odd_tensors()))
def test_tensors_without_plain_bytes_are_refused_by_name(tmp_path, kind):
    odd, why = _odd_tensors()[kind]
    with pytest.raises(ValueError, match=rf"'inner\.odd'.*{why}"):
        tt.save(tmp_path, 1, Holder(odd))
    assert not any(tmp_path.iterdir())
    # Loading into such a tensor is refused too, before anything is copied (torch would
    # copy nothing into a meta tensor and say nothing).
    tt.save(tmp_path, 1, Holder(torch.zeros(3)))
    target = Holder(odd)
    before = raw(target.lin.weight)
    with pytest.raises(ValueError, match=rf"'inner\.odd'.*{why}"):
        tt.load(tmp_path, target)
    assert raw(target.lin.weight) == before


def test_dtensor_state_takes_the_sharded_save(tmp_path):
    """A DTensor is not refused: the state goes the sharded way (a group of one here),
    and a plain module loads it back whole."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        m = torch.nn.Linear(4, 2)
        want = {k: v.clone() for k, v in m.state_dict().items()}
        m.weight = torch.nn.Parameter(distribute_tensor(m.weight.detach(), mesh, [Shard(0)]))
        step = tt.save(tmp_path, 1, m)
        assert (tmp_path / "step-000001" / "shards.json").is_file() and step.endswith("step-000001")
    finally:
        dist.destroy_process_group()
    plain = torch.nn.Linear(4, 2)
    assert tt.load(tmp_path, plain).step == 1
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in want.items())
