"""tlio.safetensors.numpy / .torch and safe_open(framework=...) against the safetensors
package, side by side: every check runs on both implementations (so the check itself is
proven against the package), and files cross both ways byte for byte."""

import subprocess
import sys

import numpy as np
import pytest
import safetensors
import safetensors.numpy as pkg_np
import safetensors.torch as pkg_pt
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tlio.safetensors as tst
import tlio.safetensors.numpy as tl_np
import tlio.safetensors.torch as tl_pt
from conftest import MODELS

IMPLS = {
    "tlio": (tst.safe_open, tl_np, tl_pt, tst.SafetensorError),
    "package": (safetensors.safe_open, pkg_np, pkg_pt, safetensors.SafetensorError),
}

TORCH_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]


def _random(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size(),), generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def _bytes(t):
    """``t``'s bytes in C order. ``contiguous()`` keeps the stride of a dimension of size 1
    (a tensor is "contiguous" whatever it is), and such a stride cannot be viewed as
    bytes, so the values are copied into fresh C-order memory first."""
    fresh = torch.empty(t.shape, dtype=t.dtype)
    fresh.copy_(t)
    return fresh.view(-1).view(torch.uint8)


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.numel() == 0:
        return True
    return torch.equal(_bytes(a), _bytes(b))


@pytest.mark.parametrize("impl", IMPLS)
def test_the_packages_serialization_bytes(impl, tmp_path):
    _, np_mod, pt_mod, _ = IMPLS[impl]
    want = (
        b'@\x00\x00\x00\x00\x00\x00\x00{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}   '
        b" \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"
    )
    data = np.zeros((2, 2), np.int32)
    data[1, 1] = 1
    assert np_mod.save({"test": data}) == want
    assert pt_mod.save({"test": torch.from_numpy(data)}) == want
    np_mod.save_file({"test": data}, tmp_path / "a.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == want
    # Big-endian arrays are written little-endian; float64 is F64; metadata None vs {}.
    assert np_mod.save({"test": data.astype(">i4")}) == want
    assert b'"F64"' in np_mod.save({"x": np.zeros(2)})
    assert b"__metadata__" not in np_mod.save({"x": data}, metadata=None)
    assert b'"__metadata__":{}' in np_mod.save({"x": data}, metadata={})


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_torch_dtype_crosses_both_ways_byte_for_byte(dtype, tmp_path):
    t = {"x": _random(dtype, (3, 4), 1), "y": _random(dtype, (0, 2), 2), "z": _random(dtype, (), 3)}
    assert tl_pt.save(t, {"k": "v"}) == pkg_pt.save(t, {"k": "v"})
    a, b = tmp_path / "tlio.safetensors", tmp_path / "pkg.safetensors"
    tl_pt.save_file(t, a)
    pkg_pt.save_file(t, b)
    assert a.read_bytes() == b.read_bytes()
    for loaded in (tl_pt.load_file(b), pkg_pt.load_file(a), tl_pt.load(b.read_bytes())):
        for k in t:
            assert _same(loaded[k], t[k]), k


NUMPY_DTYPES = [np.float64, np.float32, np.float16, np.complex64, np.int64, np.int32, np.int16,
                np.int8, np.uint64, np.uint32, np.uint16, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_numpy_dtype_crosses_both_ways_byte_for_byte(dtype, tmp_path):
    rng = np.random.default_rng(0)
    size = np.dtype(dtype).itemsize
    x = rng.integers(0, 256, 6 * size, dtype=np.uint8)
    x = (x % 2).astype(np.bool_) if dtype == np.bool_ else x.view(dtype)
    a = {"x": x.reshape(2, 3), "e": np.zeros((0, 3), dtype), "s": np.asarray(x[0])}
    assert tl_np.save(a, {"k": "v"}) == pkg_np.save(a, {"k": "v"})
    p, q = tmp_path / "tlio.safetensors", tmp_path / "pkg.safetensors"
    tl_np.save_file(a, p)
    pkg_np.save_file(a, q)
    assert p.read_bytes() == q.read_bytes()
    for loaded in (tl_np.load_file(q), pkg_np.load_file(p), tl_np.load(q.read_bytes())):
        for k in a:
            assert loaded[k].dtype == a[k].dtype and loaded[k].tobytes() == a[k].tobytes(), k


def test_float4_crosses_both_ways(tmp_path):
    t = {"p": torch.randint(0, 256, (2, 3), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)}
    assert tl_pt.save(t) == pkg_pt.save(t)
    p = tmp_path / "f4.safetensors"
    pkg_pt.save_file(t, p)
    got = tl_pt.load_file(p)["p"]
    assert got.dtype == torch.float4_e2m1fn_x2 and got.shape == (2, 3)
    assert torch.equal(got.view(torch.uint8), t["p"].view(torch.uint8))


@pytest.mark.parametrize("impl", IMPLS)
def test_safe_open_reads_as_the_package(impl, tmp_path):
    open_, _, pt_mod, err = IMPLS[impl]
    p = tmp_path / "m.safetensors"
    t = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(2, dtype=torch.bfloat16), "c": torch.zeros(3, dtype=torch.int64)}
    pt_mod.save_file(t, p)
    with open_(p, framework="pt") as f:
        assert f.keys() == ["a", "b", "c"]
        assert f.metadata() is None
        x = f.get_tensor("b")
        assert _same(x, t["b"])
        x[0, 0] = 42  # writable, and private: the file does not change
        with pytest.raises(err):
            f.get_tensor("nope")
    with pytest.raises(err):
        f.keys()
    assert _same(pt_mod.load_file(p)["b"], t["b"])
    pt_mod.save_file(t, p, metadata={"Something": "more"})
    with open_(p, framework="np") as f:
        assert f.metadata() == {"Something": "more"}
        a = f.get_tensor("c")
        a[0] = 1
        assert a.dtype == np.int64
    with pytest.raises(FileNotFoundError):
        open_(tmp_path / "missing", framework="pt")


@pytest.mark.parametrize("impl", IMPLS)
def test_shared_and_non_contiguous_tensors_are_refused_as_the_package_does(impl, tmp_path):
    _, _, pt_mod, _ = IMPLS[impl]
    a = torch.arange(6.0).reshape(2, 3)
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        pt_mod.save_file({"A": a, "B": a[:1]}, tmp_path / "s.safetensors")
    with pytest.raises(ValueError, match="non contiguous"):
        pt_mod.save_file({"t": a[:, 1]}, tmp_path / "s.safetensors")
    with pytest.raises(ValueError, match="sparse"):
        pt_mod.save_file({"t": torch.sparse_coo_tensor(size=(2, 3))}, tmp_path / "s.safetensors")
    assert not (tmp_path / "s.safetensors").exists()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = self.a


@pytest.mark.parametrize("impl", IMPLS)
def test_save_model_keeps_one_of_each_shared_tensor(impl, tmp_path):
    open_, _, pt_mod, _ = IMPLS[impl]
    m = Tied()
    p = tmp_path / "m.safetensors"
    pt_mod.save_model(m, p)
    with open_(p, framework="pt") as f:
        assert f.metadata() == {"b.bias": "a.bias", "b.weight": "a.weight"}
        assert f.keys() == ["a.bias", "a.weight"]
    m2 = Tied()
    assert pt_mod.load_model(m2, p) == (set(), [])
    assert m2.a.weight is m2.b.weight and torch.equal(m2.a.weight, m.a.weight)


def test_save_model_bytes_equal_the_packages(tmp_path):
    m = Tied()
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    tl_pt.save_model(m, a)
    pkg_pt.save_model(m, b)
    # Two metadata keys: the package's order is arbitrary, so compare from the data on.
    assert len(a.read_bytes()) == len(b.read_bytes())
    assert tl_pt.load_file(a).keys() == pkg_pt.load_file(b).keys()


# --- get_slice ------------------------------------------------------------------------

SHAPE = (5, 4, 3)
BASE = torch.arange(60, dtype=torch.float32).reshape(SHAPE)


def index_strategy():
    bound = st.one_of(st.none(), st.integers(-7, 5))
    sl = st.builds(slice, bound, st.one_of(st.none(), st.integers(-7, 5)), st.one_of(st.none(), st.integers(1, 3)))
    one = st.one_of(st.integers(-5, 4), sl)
    return st.lists(st.one_of(one, st.just(Ellipsis)), max_size=3).map(tuple)


def _numpy_clamps(key):
    """Whether numpy would accept `key` on SHAPE where the package refuses (a stop past
    the end, or an integer out of range), to know which answer to expect."""
    dims = [k for k in key if k is not Ellipsis]
    if len(dims) > len(SHAPE) or sum(k is Ellipsis for k in key) > 1:
        return None
    pos = []
    i = 0
    for k in key:
        if k is Ellipsis:
            i += len(SHAPE) - len(dims)
            continue
        pos.append((i, k))
        i += 1
    for d, k in pos:
        n = SHAPE[d]
        if isinstance(k, int) and not -n <= k < n:
            return None
        if isinstance(k, slice) and k.stop is not None and k.stop > n:
            return None
    return True


@pytest.fixture(scope="module")
def slice_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("slice") / "s.safetensors"
    tl_pt.save_file({"t": BASE, "h": BASE.to(torch.bfloat16)}, p)
    return p


@settings(max_examples=300, deadline=None)
@given(index_strategy())
def test_get_slice_equals_plain_indexing(slice_file, key):
    with tst.safe_open(slice_file, framework="pt") as f:
        for name in ("t", "h"):
            s = f.get_slice(name)
            if _numpy_clamps(key) is None:
                with pytest.raises(ValueError):
                    s[key]
                continue
            want = BASE.to(s[()].dtype)[key]
            got = s[key]
            assert got.shape == want.shape and torch.equal(got, want.contiguous()), key
    with tst.safe_open(slice_file, framework="np") as f:
        if _numpy_clamps(key) is not None:
            np.testing.assert_array_equal(f.get_slice("t")[key], BASE.numpy()[key])


@pytest.mark.parametrize("key", [(slice(None, 2),), (slice(2, None), -1), (slice(None), slice(1, 2)), (Ellipsis, 0), ([],), ()])
def test_get_slice_equals_the_packages(slice_file, key):
    with tst.safe_open(slice_file, framework="pt") as f, safetensors.safe_open(slice_file, framework="pt") as g:
        assert f.get_slice("t").get_shape() == g.get_slice("t").get_shape() == list(SHAPE)
        assert f.get_slice("t").get_dtype() == g.get_slice("t").get_dtype() == "F32"
        assert torch.equal(f.get_slice("t")[key], g.get_slice("t")[key])


def test_get_slice_errors_are_the_packages(slice_file):
    cases = [
        ((slice(2, None), -6), "Invalid index -6 for dimension 1 of size 4"),
        ((slice(None, 20),), "Error during slicing [:20] with shape [5, 4, 3]: "
         "index 19 out of bounds for tensor dimension #0 of size 5"),
        ((0, 7), "Error during slicing [0, 7] with shape [5, 4, 3]: "
         "index 7 out of bounds for tensor dimension #1 of size 4"),
        (([0, 1],), None),  # the package's wording changed after 0.8; the kind did not
    ]
    for open_, err in ((tst.safe_open, tst.SafetensorError), (safetensors.safe_open, safetensors.SafetensorError)):
        with open_(slice_file, framework="np") as f:
            s = f.get_slice("t")
            for key, message in cases:
                with pytest.raises(err) as e:
                    s[key]
                assert message is None or str(e.value) == message
    assert issubclass(tst.SafetensorError, ValueError)


@pytest.mark.parametrize("which", ["dir", "index"])
def test_get_slice_on_a_sharded_model(which):
    d = MODELS / "llama-sharded"
    index = d if which == "dir" else d / "model.safetensors.index.json"
    whole = tst.safe_open(index)
    with tst.safe_open(index, framework="np") as f:
        for name in f.keys():
            want = whole.get_tensor(name)
            if want.ndim:
                np.testing.assert_array_equal(f.get_slice(name)[-1], want[-1])


def test_safe_open_without_framework_keeps_the_chapters_views(slice_file):
    f = tst.safe_open(slice_file)
    assert isinstance(f, tst.SafetensorsFile) and not f.get_tensor("t").flags.writeable
    assert f.metadata() == {}


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.none(), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=1)))
def test_metadata_round_trip_as_the_package(meta):
    t = {"x": torch.zeros(2)}
    data = tl_pt.save(t, meta)
    assert data == pkg_pt.save(t, meta)
    assert safetensors.deserialize(data) is not None


def test_save_file_into_a_missing_directory_is_file_not_found(tmp_path):
    for save in (
        lambda p: tl_np.save_file({"x": np.zeros(2, np.float32)}, p),
        lambda p: tst.save_safetensors(p, {"x": np.zeros(2, np.float32)}),
        lambda p: tst.save_safetensors(p, {"x": np.zeros(2, np.float32)}, durable=False),
    ):
        with pytest.raises(FileNotFoundError):
            save(tmp_path / "nope" / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_import_without_torch_says_how_to_get_it():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "for m in ('tlio.torch', 'tlio.safetensors.torch'):\n"
        "    try:\n        __import__(m)\n    except ModuleNotFoundError as e:\n        print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all("pip install 'tlio[torch]'" in line for line in lines), r


def _raw_file(header: str) -> bytes:
    """A file of one F32 tensor `x` of 2 values under `header` (JSON text as given,
    padded to 8 bytes with spaces, as the format allows)."""
    h = header.encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + np.arange(2, dtype="<f4").tobytes()


X = '"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
STRICTER = {
    "a duplicate key": "{" + X + "," + X + "}",
    "an unknown field": '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}}',
    "null metadata": '{"__metadata__":null,' + X + "}",
}


@pytest.mark.parametrize("case", sorted(STRICTER))
def test_the_stricter_files_are_refused_with_safetensor_error_where_the_package_reads_them(case, tmp_path):
    path = tmp_path / "m.safetensors"
    data = _raw_file(STRICTER[case])
    path.write_bytes(data)
    # The package reads each of them (the difference the docs list).
    with safetensors.safe_open(str(path), framework="np") as f:
        assert f.get_tensor("x").tolist() == [0.0, 1.0]
    calls = {
        "safe_open np": lambda: tst.safe_open(path, framework="np"),
        "safe_open pt": lambda: tst.safe_open(path, framework="pt"),
        "numpy.load_file": lambda: tl_np.load_file(path),
        "numpy.load": lambda: tl_np.load(data),
        "torch.load_file": lambda: tl_pt.load_file(path),
        "torch.load": lambda: tl_pt.load(data),
    }
    for what, call in calls.items():
        with pytest.raises(tst.SafetensorError) as e:
            call()
        assert isinstance(e.value, ValueError), what
        assert str(e.value), what


@pytest.fixture(scope="module")
def every_dtype_file(tmp_path_factory):
    """One (5, 4, 3) tensor of random bytes per torch dtype, written by the package."""
    p = tmp_path_factory.mktemp("dtypes") / "d.safetensors"
    tensors = {str(d).removeprefix("torch."): _random(d, SHAPE, i) for i, d in enumerate(TORCH_DTYPES)}
    pkg_pt.save_file(tensors, str(p))
    return p, tensors


@settings(max_examples=60, deadline=None)
@given(index_strategy())
def test_get_slice_of_every_dtype_is_the_bytes_of_plain_indexing(every_dtype_file, key):
    path, tensors = every_dtype_file
    assume(_numpy_clamps(key) is not None)
    with tst.safe_open(path, framework="pt") as f:
        for name, whole in tensors.items():
            got = f.get_slice(name)[key]
            assert _same(got, whole[key]), (name, key)


NUMPY_NAMES = {"float64", "float32", "float16", "complex64", "int64", "int32", "int16",
               "int8", "uint8", "bool", "uint16", "uint32", "uint64"}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("framework", ["pt", "torch", "pytorch", "np", "numpy"])
def test_both_backends_read_what_the_package_reads(impl, framework, every_dtype_file):
    """``backend="mmap"`` and ``"pread"`` give the same tensors, slices and metadata, on
    tlio and on the package, under every framework name the package accepts."""
    open_, _, _, _ = IMPLS[impl]
    path, tensors = every_dtype_file
    if framework in ("np", "numpy"):  # the dtypes numpy has (the package refuses the rest)
        tensors = {n: t for n, t in tensors.items() if n in NUMPY_NAMES}
        path = path.with_name(f"numpy-{impl}.safetensors")
        pkg_pt.save_file(tensors, str(path))
    names = sorted(tensors)
    got = {}
    for backend in ("mmap", "pread"):
        with open_(path, framework=framework, backend=backend) as f:
            everything = f.get_tensors()
            got[backend] = {n: (f.get_tensor(n), everything[n], f.get_slice(n)[1:3, ..., -1]) for n in names}
    for n in names:
        whole = tensors[n] if framework in ("pt", "torch", "pytorch") else tensors[n].numpy()
        for backend in ("mmap", "pread"):
            one, from_all, part = got[backend][n]
            if isinstance(whole, np.ndarray):
                assert one.dtype == whole.dtype and one.tobytes() == whole.tobytes(), (n, backend)
                assert from_all.tobytes() == whole.tobytes() and part.tobytes() == whole[1:3, ..., -1].tobytes()
            else:
                assert _same(one, whole) and _same(from_all, whole), (n, backend)
                assert _same(part, whole[1:3, ..., -1]), (n, backend)


@pytest.mark.parametrize("impl", IMPLS)
def test_pread_tensors_own_their_memory(impl, tmp_path):
    """A tensor read with the pread backend is not over the file: rewriting the file in
    place afterwards leaves it as it was, where the map's tensor shows the new bytes."""
    open_, _, pt_mod, _ = IMPLS[impl]
    p = tmp_path / "w.safetensors"
    pt_mod.save_file({"w": torch.zeros(4096, dtype=torch.int32)}, p)
    with open_(p, framework="pt", backend="pread") as f:
        owned = f.get_tensor("w")
    with open_(p, framework="pt") as f:
        mapped = f.get_tensor("w")
        data = bytearray(p.read_bytes())
        data[-4:] = (7).to_bytes(4, "little")
        with open(p, "r+b") as out:  # in place, the same size
            out.write(data)
        assert int(mapped[-1]) == 7
    assert int(owned[-1]) == 0
    assert pt_mod.load_file(p, backend="pread")["w"][-1] == 7


@pytest.mark.parametrize("impl", IMPLS)
def test_backend_is_keyword_only_and_checked_as_the_package_does(impl, tmp_path):
    open_, np_mod, pt_mod, err = IMPLS[impl]
    p = tmp_path / "t.safetensors"
    pt_mod.save_file({"x": torch.arange(3)}, p)
    for bad in ("not_a_backend", "MMAP", ""):
        with pytest.raises(err, match="backend"):
            open_(p, framework="pt", backend=bad)
        with pytest.raises(err, match="backend"):
            pt_mod.load_file(p, backend=bad)
        with pytest.raises(err, match="backend"):
            np_mod.load_file(p, backend=bad)
    with pytest.raises(TypeError):
        open_(p, framework="pt", backend=1)
    with pytest.raises(TypeError):
        open_(p, "pt", "cpu", "pread")  # keyword-only in the package
    model = torch.nn.Linear(3, 1)
    pt_mod.save_model(model, tmp_path / "m.safetensors")
    other = torch.nn.Linear(3, 1)
    missing, unexpected = pt_mod.load_model(other, tmp_path / "m.safetensors", backend="pread")
    assert not missing and not unexpected
    assert torch.equal(other.weight, model.weight)
    assert np_mod.load_file(p, backend="pread")["x"].tolist() == [0, 1, 2]
