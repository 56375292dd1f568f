"""The chapter's section-4 test catalogue for safetensors, by its names, against tlio.

Where python.md changed the chapter's interface (int64 and float64 with an override are
written, F64 and BOOL load), the test says so and checks python.md's rule instead.
"""

import json
import struct

import numpy as np
import pytest

from conftest import GOLDEN
from tlio.safetensors import (
    DTYPE_BITS,
    DTYPE_SIZES,
    E4M3_MAX,
    load_safetensors,
    read_header,
    save_safetensors,
)

W = np.array([[1, 2], [3, 4]], np.float32)
META = {"format": "tinyllm"}


def f32_of_bits(*bits):
    return np.array(bits, np.uint32).view(np.float32)


def stored(path, name):
    """The raw bytes of tensor `name` (raw=True: BF16 as uint16, F8 as uint8 codes)."""
    t, _ = load_safetensors(path, raw=True)
    return t[name]


def handmade(tmp_path, header: dict, data: bytes, name="x.safetensors"):
    """A file with exactly this header (compact JSON, space-padded to 8) and data."""
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    p = tmp_path / name
    p.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return p


def test_worked_example_bf16_bytes(tmp_path):
    p = tmp_path / "w.safetensors"
    save_safetensors(p, {"w": W}, META, {"w": "BF16"})
    header = b'{"__metadata__":{"format":"tinyllm"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}'
    assert len(header) == 93
    expected = bytes.fromhex("6000000000000000") + header + b"   " + bytes.fromhex("803f004040408040")
    assert len(expected) == 112
    assert p.read_bytes() == expected
    assert p.read_bytes() == (GOLDEN / "worked_example_bf16.safetensors").read_bytes()


def rebuild(entry):
    """The arrays and dtypes override that give a golden file's tensors from numbers:
    float32 values for every tensor the library got by casting float32, the native
    arrays for numpy's types, uint16 / uint8 codes for BF16 / F8 stored as codes."""
    tensors, dtypes = {}, {}
    for t in entry["tensors"]:
        name, dt, shape = t["name"], t["dtype"], tuple(t["shape"])
        data = bytes.fromhex(t["data_hex"])
        if "encoded_from_f32_bits" in t:
            tensors[name] = f32_of_bits(*[int(b, 16) for b in t["encoded_from_f32_bits"]]).reshape(shape)
            dtypes[name] = dt
            continue
        native = {
            "F64": "<f8", "F32": "<f4", "F16": "<f2", "C64": "<c8", "I64": "<i8", "I32": "<i4",
            "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
            "BF16": "<u2",
        }.get(dt, "u1" if dt.startswith("F8_") else None)
        if native is None:
            return None  # F4: no numpy type gives its shape
        tensors[name] = np.frombuffer(data, native).reshape(shape).copy()
        if dt in ("F64", "BF16") or dt.startswith("F8_"):
            dtypes[name] = dt
    return tensors, dtypes


def test_matches_library_bytes(tmp_path, golden_manifest):
    # The chapter's five library files, and every other golden file the canonical
    # writer reproduces: each dtype written from float32 values where the library cast
    # float32, from its numpy type or its codes otherwise.
    five = ["worked_example_f32.safetensors", "dtype_BF16.safetensors", "dtype_F8_E4M3.safetensors",
            "mixed_course.safetensors", "random_mixed.safetensors"]
    checked = 0
    for name, entry in golden_manifest.items():
        built = rebuild(entry)
        if built is None or not entry["writer_reproduces"]:
            assert name not in five
            continue
        tensors, dtypes = built
        out = tmp_path / name
        save_safetensors(out, tensors, entry["metadata"] or None, dtypes, durable=False)
        assert out.read_bytes() == (GOLDEN / name).read_bytes(), name
        checked += 1
    assert checked >= 40


def test_raw_bits_are_written_as_is(tmp_path):
    bits = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7F81, 0x7FFF, 0xFFC1, 0x0001, 0x3F80], np.uint16)
    codes = np.arange(256, dtype=np.uint8)
    p = tmp_path / "raw.safetensors"
    save_safetensors(p, {"b": bits, "e4": codes, "e5": codes}, None, {"b": "BF16", "e4": "F8_E4M3", "e5": "F8_E5M2"})
    h, _ = read_header(p)
    assert h == {"b": ("BF16", (9,)), "e4": ("F8_E4M3", (256,)), "e5": ("F8_E5M2", (256,))}
    data = p.read_bytes()
    assert data.endswith(bits.tobytes() + codes.tobytes() + codes.tobytes())
    np.testing.assert_array_equal(stored(p, "b"), bits)
    np.testing.assert_array_equal(stored(p, "e4"), codes)


def bf16_codes(tmp_path, values):
    p = tmp_path / "r.safetensors"
    save_safetensors(p, {"x": np.asarray(values, np.float32)}, None, {"x": "BF16"})
    return [int(c) for c in stored(p, "x")]


def test_bf16_rounds_to_nearest_even(tmp_path):
    x = f32_of_bits(
        0x3F808000,  # 1 + 2^-8: halfway between 0x3F80 and 0x3F81, to the even 0x3F80
        0x3F818000,  # halfway between 0x3F81 and 0x3F82, to the even 0x3F82
        0x3F807FFF,  # just below half: down
        0x3F808001,  # just above half: up
        0xBF808000,  # the negative tie: to the even
        0x7F7FFFFF,  # float32 max rounds up to infinity
    )
    assert bf16_codes(tmp_path, x) == [0x3F80, 0x3F82, 0x3F80, 0x3F81, 0xBF80, 0x7F80]


def e4m3_codes(tmp_path, values):
    p = tmp_path / "e.safetensors"
    save_safetensors(p, {"x": np.asarray(values, np.float32)}, None, {"x": "F8_E4M3"})
    return [int(c) for c in stored(p, "x")], load_safetensors(p)[0]["x"]


def test_f8_e4m3_codes(tmp_path):
    values = [0.0, 2.0**-9, 2.0**-6, 1.0, 448.0, float("nan"), -0.0, -448.0]
    codes, decoded = e4m3_codes(tmp_path, values)
    assert codes == [0x00, 0x01, 0x08, 0x38, 0x7E, 0x7F, 0x80, 0xFE]
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded[[0, 1, 2, 3, 4, 7]], np.float32([0, 2**-9, 2**-6, 1, 448, -448]))
    assert np.isnan(decoded[5]) and decoded[6] == 0 and np.signbit(decoded[6])
    # Exponent 15 with mantissa 0..6 are numbers (256 ... 448), only m = 7 is NaN.
    p = tmp_path / "codes.safetensors"
    save_safetensors(p, {"c": np.arange(0x78, 0x80, dtype=np.uint8)}, None, {"c": "F8_E4M3"})
    top = load_safetensors(p)[0]["c"]
    np.testing.assert_array_equal(top[:7], np.float32([256, 288, 320, 352, 384, 416, 448]))
    assert np.isnan(top[7])
    assert E4M3_MAX == 448.0


def test_f8_rounds_to_nearest_even(tmp_path):
    values = [
        1.0625,  # halfway between 1.0 (0x38) and 1.125 (0x39): the even 0x38
        1.1875,  # halfway between 0x39 and 0x3A: the even 0x3A
        250.0,  # between 240 (0x77) and 256 (0x78), above the midpoint 248
        248.0,  # the midpoint itself: the even 0x78 (0x77 is odd)
        2.0**-10,  # halfway between 0 and 2^-9 (a subnormal tie): 0x00
        3 * 2.0**-10,  # halfway between 0x01 and 0x02: the even 0x02
        -0.0,  # keeps its sign: 0x80
        -1.0625,
    ]
    codes, _ = e4m3_codes(tmp_path, values)
    assert codes == [0x38, 0x3A, 0x78, 0x78, 0x00, 0x02, 0x80, 0xB8]


@pytest.mark.parametrize("bad", [449.0, 448.5, float("inf"), -float("inf"), -449.0, 1e30])
def test_f8_rejects_out_of_range(tmp_path, bad):
    p = tmp_path / "oor.safetensors"
    with pytest.raises(ValueError) as e:
        save_safetensors(p, {"q": np.float32([1.0, 2.0, bad])}, None, {"q": "F8_E4M3"})
    msg = str(e.value)
    assert '"q"' in msg and "index 2" in msg and "448" in msg and str(p) in msg
    assert not p.exists() and list(tmp_path.iterdir()) == []
    codes, _ = e4m3_codes(tmp_path, [float("nan"), -float("nan")])
    assert codes == [0x7F, 0xFF]


def test_dtype_order_then_name(tmp_path, golden_manifest):
    p = tmp_path / "o.safetensors"
    save_safetensors(p, {"a": np.uint8([1, 2]), "b": np.int32([3]), "c": np.float32([4])}, None)
    n = struct.unpack("<Q", p.read_bytes()[:8])[0]
    header = json.loads(p.read_bytes()[8 : 8 + n])
    assert list(header) == ["c", "b", "a"]
    assert [header[k]["data_offsets"] for k in "cba"] == [[0, 4], [4, 8], [8, 10]]
    assert list(read_header(p)[0]) == ["c", "b", "a"]
    assert list(load_safetensors(p)[0]) == ["c", "b", "a"]
    tensors, _ = rebuild(golden_manifest["mixed_f32_i32_u8.safetensors"])
    q = tmp_path / "lib.safetensors"
    save_safetensors(q, dict(sorted(tensors.items())), None)
    assert q.read_bytes() == (GOLDEN / "mixed_f32_i32_u8.safetensors").read_bytes()


@pytest.mark.parametrize(
    "tensors, dtypes, words",
    [
        ({"w": np.float64([1.0])}, None, "float64 is never converted silently"),
        # python.md: int64 is written as I64 now; an integer target from float32 is refused.
        ({"w": np.float32([1.0])}, {"w": "I32"}, "cannot write a float32 array as I32"),
        ({"w": np.float32([1.0])}, {"w": "bf16"}, "unknown dtype 'bf16'"),
        ({"w": np.float32([1.0])}, {"w": "F64 "}, "unknown dtype"),
        ({"w": np.float32([1.0])}, {"w": "FLOAT"}, "unknown dtype"),
        ({"w": np.float32([1.0])}, {"v": "BF16"}, "names no tensor"),
        ({"w": np.float16([1.0])}, {"w": "BF16"}, "cannot write a float16 array as BF16"),
        ({"w": np.float64([1.0])}, {"w": "BF16"}, "cannot write a float64 array as BF16"),
        ({"w": np.array(["a"])}, None, "no safetensors dtype"),
        ({"w": [1.0, 2.0]}, None, "a numpy array is needed"),
        ({"__metadata__": np.float32([1.0])}, None, "reserved"),
    ],
)
def test_save_rejects_bad_dtypes(tmp_path, tensors, dtypes, words):
    p = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError) as e:
        save_safetensors(p, tensors, None, dtypes)
    assert words in str(e.value) and str(p) in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_save_rejects_bad_metadata_and_f64_overflow(tmp_path):
    p = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match="non-string"):
        save_safetensors(p, {"w": np.float32([1])}, {"n": 1})
    with pytest.raises(ValueError, match=r'"w".*index 1.*F32') as e:
        save_safetensors(p, {"w": np.float64([1.0, 1e39])}, None, {"w": "F32"})
    assert str(p) in str(e.value)
    assert list(tmp_path.iterdir()) == []
    # In range, F64 to F32 rounds once, to nearest even; F64 keeps the values.
    save_safetensors(p, {"w": np.float64([1 + 2.0**-24, 0.1]), "k": np.float64([0.1])}, None, {"w": "F32", "k": "F64"})
    t, _ = load_safetensors(p)
    assert t["w"].dtype == np.float32 and t["w"][0] == 1.0 and t["w"][1] == np.float32(0.1)
    assert t["k"].dtype == np.float64 and t["k"][0] == 0.1


NUMPY_OF = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.float32, "F8_E4M3": np.float32,
    "F8_E5M2": np.float32, "C64": np.complex64, "I64": np.int64, "I32": np.int32, "I16": np.int16,
    "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
RAW_ONLY = {"F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"}


def check_values(t, a):
    assert a.dtype == NUMPY_OF[t["dtype"]], t["name"]
    assert a.shape == tuple(t["shape"])
    assert a.flags.writeable and a.flags.c_contiguous
    if "f64_values" in t:
        with np.errstate(invalid="ignore"):
            wide = a.reshape(-1).astype(np.float64)
        for got, want in zip(wide, t["f64_values"]):
            if want == "nan":
                assert np.isnan(got)
            else:
                w = struct.unpack(">d", bytes.fromhex(want))[0]
                assert got == w and np.signbit(got) == np.signbit(w), (t["name"], got, w)
    elif "ints" in t:
        assert [int(v) for v in a.reshape(-1)] == t["ints"]
    else:
        assert a.tobytes() == bytes.fromhex(t["data_hex"])


def test_load_decodes_every_dtype(golden_manifest):
    seen = set()
    for name, entry in golden_manifest.items():
        path = GOLDEN / name
        kinds = {t["dtype"] for t in entry["tensors"]}
        if kinds & RAW_ONLY:
            with pytest.raises(ValueError, match="raw=True"):
                load_safetensors(path)
            tensors, meta = load_safetensors(path, raw=True)
            for t in entry["tensors"]:
                a = tensors[t["name"]]
                if t["dtype"] in RAW_ONLY:
                    assert a.dtype == np.uint8 and a.ndim == 1
                    assert a.tobytes() == bytes.fromhex(t["data_hex"])
                elif t["dtype"] in ("BF16", "F8_E4M3", "F8_E5M2"):
                    assert a.dtype == (np.uint16 if t["dtype"] == "BF16" else np.uint8)
                    assert a.shape == tuple(t["shape"]) and a.tobytes() == bytes.fromhex(t["data_hex"])
                else:
                    check_values(t, a)
            seen |= kinds
            continue
        tensors, meta = load_safetensors(path)
        assert meta == entry["metadata"]
        assert list(tensors) == [t["name"] for t in entry["tensors"]]
        for t in entry["tensors"]:
            check_values(t, tensors[t["name"]])
            # NaN payloads survive F32 loading (the raw bits are the file's).
            if t["dtype"] in ("F32", "F64", "F16"):
                assert tensors[t["name"]].tobytes() == bytes.fromhex(t["data_hex"])
        seen |= kinds
    assert seen >= set(NUMPY_OF) | {"F4"}
    # Arrays are the caller's: writing one changes neither the file nor another load.
    a, _ = load_safetensors(GOLDEN / "worked_example_f32.safetensors")
    a["w"][0, 0] = 9
    b, _ = load_safetensors(GOLDEN / "worked_example_f32.safetensors")
    assert b["w"][0, 0] == 1


def test_read_header_checks_without_reading(tmp_path, golden_manifest):
    h, meta = read_header(GOLDEN / "mixed_course.safetensors")
    assert h == {t["name"]: (t["dtype"], tuple(t["shape"])) for t in golden_manifest["mixed_course.safetensors"]["tensors"]}
    assert meta == {"format": "tinyllm"}
    # Trailing bytes after the last tensor break the tiling (rule 5).
    p = tmp_path / "trailing.safetensors"
    p.write_bytes((GOLDEN / "worked_example_f32.safetensors").read_bytes() + b"\0")
    with pytest.raises(ValueError, match="rule 5") as e:
        read_header(p)
    assert str(p) in str(e.value)
    # A huge header length is refused from the 8 bytes and the file size alone.
    p = tmp_path / "huge.safetensors"
    p.write_bytes(struct.pack("<Q", 2**63) + b"{}      ")
    with pytest.raises(ValueError, match="rule 1"):
        read_header(p)
    # A 64 GiB sparse file: its header is checked without reading (or mapping) the data.
    p = handmade(tmp_path, {"big": {"dtype": "F32", "shape": [2**34], "data_offsets": [0, 2**36]}}, b"", "big.safetensors")
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size + 2**36)
    assert read_header(p) == ({"big": ("F32", (2**34,))}, {})


def test_load_rejects_unknown_dtypes(tmp_path):
    # python.md changed the chapter's row: F64 and BOOL are dtypes tlio loads (to
    # float64 and bool). What stays refused: names no library knows, lower-case or
    # padded names (they are exact), and a byte count that does not match the shape.
    entry = lambda dt, end=4: {"x": {"dtype": dt, "shape": [1], "data_offsets": [0, end]}}
    for dt in ["FLOAT", "bf16", "f32", "F64 ", "F8_E4M3FN", ""]:
        p = handmade(tmp_path, entry(dt), b"\0" * 4)
        with pytest.raises(ValueError, match="rule 4 .dtype.") as e:
            load_safetensors(p)
        assert '"x"' in str(e.value) and str(p) in str(e.value)
    p = handmade(tmp_path, entry("F32", 2), b"\0" * 2)
    with pytest.raises(ValueError, match="rule 4 .byte count."):
        load_safetensors(p)
    p = handmade(tmp_path, {"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]},
                            "y": {"dtype": "BOOL", "shape": [2], "data_offsets": [8, 10]}}, struct.pack("<d", 2.5) + b"\1\0")
    t, _ = load_safetensors(p)
    assert t["x"].dtype == np.float64 and t["x"][0] == 2.5
    assert t["y"].dtype == np.bool_ and t["y"].tolist() == [True, False]


def test_raw_codes_roundtrip(tmp_path):
    # Through values: every code that is not a NaN (NaNs encode to the canonical NaN
    # with their sign, so only canonical NaN codes come back as themselves).
    cases = {
        "BF16": (np.arange(2**16, dtype=np.uint16), {0x7FC0, 0xFFC0}),
        "F8_E4M3": (np.arange(256, dtype=np.uint8), {0x7F, 0xFF}),
        "F8_E5M2": (np.arange(256, dtype=np.uint8), {0x7E, 0xFE}),
    }
    for dt, (codes, canonical_nan) in cases.items():
        a = tmp_path / "a.safetensors"
        save_safetensors(a, {"c": codes}, None, {"c": dt})
        values = load_safetensors(a)[0]["c"]
        keep = ~np.isnan(values) | np.isin(codes, list(canonical_nan))
        b = tmp_path / "b.safetensors"
        save_safetensors(b, {"c": values[keep]}, None, {"c": dt})
        np.testing.assert_array_equal(stored(b, "c"), codes[keep])
        # Through raw=True: every code, the same file.
        c = tmp_path / "c.safetensors"
        save_safetensors(c, load_safetensors(a, raw=True)[0], None, {"c": dt})
        assert c.read_bytes() == a.read_bytes()


def test_v0_calls_still_work(tmp_path):
    p = tmp_path / "v0.safetensors"
    save_safetensors(str(p), {"w": W}, {"format": "tinyllm"})
    assert p.read_bytes() == (GOLDEN / "worked_example_f32.safetensors").read_bytes()
    assert read_header(str(p)) == ({"w": ("F32", (2, 2))}, {"format": "tinyllm"})
    t, meta = load_safetensors(str(p))
    np.testing.assert_array_equal(t["w"], W)
    assert meta == {"format": "tinyllm"}
    assert DTYPE_SIZES["F32"] == 4 and DTYPE_SIZES["BF16"] == 2 and DTYPE_SIZES["F8_E4M3"] == 1
    assert "F4" not in DTYPE_SIZES and DTYPE_BITS["F4"] == 4 and DTYPE_BITS["F6_E3M2"] == 6
    assert len(DTYPE_BITS) == 22
