"""tlio.safetensors against the `safetensors` package and ml_dtypes, property tests of
encode/decode, the zero-copy rules of safe_open, models, and the error mapping."""

import gc
import mmap
import os

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as stnp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tlio._tlio
from conftest import GOLDEN, MALFORMED, MODELS
from tlio.safetensors import load_safetensors, read_header, safe_open, save_safetensors

NUMPY_TYPES = [np.float32, np.float16, np.bool_, np.int8, np.int16, np.int32, np.int64,
               np.uint8, np.uint16, np.uint32, np.uint64]
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8).filter(
    lambda s: s != "__metadata__"
)
arrays = st.sampled_from(NUMPY_TYPES).flatmap(
    lambda t: hnp.arrays(t, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
)
tensor_dicts = st.dictionaries(names, arrays, max_size=5)
one_key = st.one_of(st.none(), st.dictionaries(names, st.text(max_size=10), min_size=1, max_size=1))


def codes_of(path, name):
    return load_safetensors(path, raw=True)[0][name]


@settings(max_examples=60, deadline=None)
@given(tensor_dicts, one_key)
def test_bytes_equal_the_library(tmp_path_factory, tensors, meta):
    d = tmp_path_factory.mktemp("lib")
    ours, theirs = d / "ours.safetensors", d / "theirs.safetensors"
    save_safetensors(ours, tensors, meta, durable=False)
    stnp.save_file(tensors, str(theirs), metadata=meta)
    assert ours.read_bytes() == theirs.read_bytes()
    # ... and each side reads the other's file.
    back, m = load_safetensors(theirs)
    assert m == (meta or {})
    lib = stnp.load_file(str(ours))
    for k, a in tensors.items():
        np.testing.assert_array_equal(back[k], a)
        assert back[k].dtype == a.dtype
        np.testing.assert_array_equal(lib[k], a)


def test_bf16_and_f8_files_load_in_the_library(tmp_path):
    x = np.linspace(-300, 300, 97, dtype=np.float32)
    p = tmp_path / "q.safetensors"
    save_safetensors(p, {"b": x, "e4": x, "e5": x}, {"k": "v"}, {"b": "BF16", "e4": "F8_E4M3", "e5": "F8_E5M2"})
    lib = safetensors.deserialize(p.read_bytes())
    by_name = {name: t for name, t in lib}
    assert by_name["b"]["dtype"] == "BF16" and by_name["e4"]["dtype"] == "F8_E4M3"
    np.testing.assert_array_equal(np.frombuffer(bytes(by_name["b"]["data"]), np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(np.frombuffer(bytes(by_name["e4"]["data"]), np.uint8), x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
    np.testing.assert_array_equal(np.frombuffer(bytes(by_name["e5"]["data"]), np.uint8), x.astype(ml_dtypes.float8_e5m2).view(np.uint8))


def test_every_bf16_pattern_decodes_as_ml_dtypes(tmp_path):
    codes = np.arange(2**16, dtype=np.uint16)
    p = tmp_path / "all.safetensors"
    save_safetensors(p, {"c": codes}, None, {"c": "BF16"})
    ours = load_safetensors(p)[0]["c"]
    ref = codes.view(ml_dtypes.bfloat16).astype(np.float32)
    # Exact, NaN payloads included: BF16 is the top half of a float32.
    np.testing.assert_array_equal(ours.view(np.uint32), codes.astype(np.uint32) << 16)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32))


@pytest.mark.parametrize("dt, ref", [("F8_E4M3", ml_dtypes.float8_e4m3fn), ("F8_E5M2", ml_dtypes.float8_e5m2)])
def test_every_f8_code_decodes_as_ml_dtypes(tmp_path, dt, ref):
    codes = np.arange(256, dtype=np.uint8)
    p = tmp_path / "all.safetensors"
    save_safetensors(p, {"c": codes}, None, {"c": dt})
    with safe_open(p) as f:
        ours = f.get_tensor("c")
    want = codes.view(ref).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), want[~nan].view(np.uint32))


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64))
def test_bf16_encode_matches_ml_dtypes(tmp_path_factory, values):
    x = np.float32(values)
    p = tmp_path_factory.mktemp("e") / "b.safetensors"
    save_safetensors(p, {"x": x}, None, {"x": "BF16"})
    np.testing.assert_array_equal(codes_of(p, "x"), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    # Decoding then re-encoding is the identity on codes.
    back = load_safetensors(p)[0]["x"]
    q = p.with_name("c.safetensors")
    save_safetensors(q, {"x": back}, None, {"x": "BF16"})
    assert q.read_bytes() == p.read_bytes()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-448, max_value=448, width=32), min_size=1, max_size=64))
def test_e4m3_encode_matches_ml_dtypes_in_range(tmp_path_factory, values):
    x = np.float32(values)
    p = tmp_path_factory.mktemp("e") / "e.safetensors"
    save_safetensors(p, {"x": x}, None, {"x": "F8_E4M3"})
    np.testing.assert_array_equal(codes_of(p, "x"), x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


@settings(max_examples=200, deadline=None)
@given(st.lists(finite32, min_size=1, max_size=64))
def test_e5m2_and_f16_encode_match_the_references(tmp_path_factory, values):
    x = np.float32(values)
    p = tmp_path_factory.mktemp("e") / "e.safetensors"
    save_safetensors(p, {"x": x, "h": x}, None, {"x": "F8_E5M2", "h": "F16"})
    np.testing.assert_array_equal(codes_of(p, "x"), x.astype(ml_dtypes.float8_e5m2).view(np.uint8))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(codes_of(p, "h").view(np.uint16), x.astype(np.float16).view(np.uint16))


@settings(max_examples=100, deadline=None)
@given(st.floats(width=32, allow_nan=False).filter(lambda v: abs(v) > 448))
def test_e4m3_out_of_range_is_always_an_error(tmp_path_factory, v):
    p = tmp_path_factory.mktemp("e") / "e.safetensors"
    with pytest.raises(ValueError, match="index 1"):
        save_safetensors(p, {"x": np.float32([0, v])}, None, {"x": "F8_E4M3"})
    assert not p.exists()


# --- safe_open: zero copy -------------------------------------------------------------


def test_safe_open_views_share_the_map(tmp_path):
    p = tmp_path / "v.safetensors"
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_safetensors(p, {"w": w, "i": np.int64([1, 2]), "h": np.float16([1.5])}, {"k": "v"})
    f = safe_open(p)
    a, b = f.get_tensor("w"), f.get_tensor("w")
    assert not a.flags.writeable and not a.flags.owndata
    with pytest.raises(ValueError):
        a[0, 0] = 1
    np.testing.assert_array_equal(a, w)
    assert np.shares_memory(a, b)
    base = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    # numpy holds the map through a memoryview of it (the buffer it exported).
    assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)
    assert f.get_tensor("i").dtype == np.int64 and f.get_tensor("h").dtype == np.float16
    assert f.keys() == ["i", "w", "h"] and f.metadata() == {"k": "v"}
    assert f.header() == {"w": ("F32", (3, 4)), "i": ("I64", (2,)), "h": ("F16", (1,))}
    # The view keeps the mapping alive after close; the closed file refuses reads.
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("w")
    del b, f
    gc.collect()
    np.testing.assert_array_equal(a, w)


def test_safe_open_decodes_bf16_and_f8_to_copies(tmp_path):
    p = tmp_path / "d.safetensors"
    x = np.float32([1, 2, 3, 4])
    save_safetensors(p, {"b": x, "e": x}, None, {"b": "BF16", "e": "F8_E4M3"})
    with safe_open(p) as f:
        b = f.get_tensor("b")
        assert b.dtype == np.float32 and b.flags.writeable
        np.testing.assert_array_equal(b, x)
        np.testing.assert_array_equal(f.get_tensor("e"), x)
        codes = f.get_tensor("b", raw=True)
        assert not codes.flags.writeable and codes.dtype == np.uint16
        assert not np.shares_memory(b, codes)


def test_safe_open_raw_only_needs_raw(tmp_path):
    with safe_open(GOLDEN / "dtype_F4.safetensors") as f:
        with pytest.raises(ValueError, match="F4"):
            f.get_tensor("packed")
        assert f.get_tensor("packed", raw=True).dtype == np.uint8


@pytest.mark.parametrize("which", ["dir", "index"])
def test_safe_open_a_sharded_model(which):
    d = MODELS / "llama-sharded"
    path = d if which == "dir" else d / "model.safetensors.index.json"
    shards = sorted(d.glob("*.safetensors"))
    want = {}
    for s in shards:
        want.update(stnp.load_file(str(s)))
    with safe_open(path) as f:
        assert sorted(f.keys()) == sorted(want)
        for k, v in want.items():
            got = f.get_tensor(k)
            np.testing.assert_array_equal(got, v)
            assert not got.flags.writeable
        common = None
        for s in shards:
            with safe_open(s) as one:
                m = one.metadata()
            common = m if common is None else {k: v for k, v in common.items() if m.get(k) == v}
        assert f.metadata() == common


def test_safe_open_single_and_bf16_model_dirs():
    for name in ["llama-single", "llama-bf16"]:
        with safe_open(MODELS / name) as f:
            assert len(f.keys()) > 0
            for k in f.keys():
                assert f.get_tensor(k).shape == f.header()[k][1]


def test_a_bad_shard_is_a_value_error_naming_it():
    d = MODELS / "index-variants"
    with pytest.raises(ValueError, match="model-00009-of-00009"):
        safe_open(d / "missing_shard.index.json")
    with pytest.raises(FileNotFoundError):
        safe_open(d / "no-such.index.json")


# --- errors ---------------------------------------------------------------------------


def malformed_cases():
    for line in (MALFORMED / "MANIFEST.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            name, rule = line.split("\t")[:2]
            if not rule.startswith("valid"):
                yield name, rule


@pytest.mark.parametrize("name, rule", list(malformed_cases()))
def test_malformed_files_are_value_errors_naming_file_and_rule(name, rule):
    path = MALFORMED / name
    parts = rule.split("-")
    words = " ".join(parts[:2]) if parts[0] == "rule" else parts[0]
    for call in (read_header, load_safetensors, safe_open):
        with pytest.raises(ValueError) as e:
            call(path)
        msg = str(e.value)
        assert str(path) in msg, msg
        assert words in msg, (rule, msg)


def test_missing_file_is_file_not_found(tmp_path):
    for call in (read_header, load_safetensors, safe_open):
        with pytest.raises(FileNotFoundError):
            call(tmp_path / "nope.safetensors")


def test_a_rust_panic_becomes_runtime_error():
    # tlio._tlio._panic_for_tests is a hidden hook that panics inside the guard every
    # entry point uses; pyo3's own PanicException would not be an Exception.
    with pytest.raises(RuntimeError, match="internal error in tlio"):
        tlio._tlio._panic_for_tests()


def test_save_over_a_directory_is_an_error_and_leaves_no_temp(tmp_path):
    d = tmp_path / "dir.safetensors"
    d.mkdir()
    with pytest.raises((ValueError, OSError)):
        save_safetensors(d, {"w": np.float32([1])})
    assert sorted(os.listdir(tmp_path)) == ["dir.safetensors"]


def test_any_memory_order_and_byte_order_is_written_little_endian_c_order(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ref, other = tmp_path / "ref.safetensors", tmp_path / "other.safetensors"
    save_safetensors(ref, {"a": a, "s": np.float32(2.5), "b": np.array([True, False])})
    save_safetensors(other, {"a": np.asfortranarray(a).astype(">f4"), "s": np.array(2.5, ">f4"), "b": np.array([True, False])})
    assert ref.read_bytes() == other.read_bytes()
    t, _ = load_safetensors(ref)
    assert t["s"].shape == () and t["s"] == 2.5 and t["b"].dtype == np.bool_
    save_safetensors(other, {"a": a.T}, durable=False)
    np.testing.assert_array_equal(load_safetensors(other)[0]["a"], a.T)
