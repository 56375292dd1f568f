"""Errors of the safetensors and checkpoint writers and readers are the kind python.md
names, raised before anything is written, and name the file and the tensor."""

import errno
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tlio.checkpoint import save_checkpoint
from tlio.safetensors import load_safetensors, read_header, safe_open, save_safetensors


def _raw_file(path, header: dict, data_len: int) -> None:
    """A safetensors file with `header` and `data_len` zero bytes (sparse: no disk used)."""
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        f.truncate(8 + len(js) + data_len)


def test_a_tensor_named_metadata_is_refused_before_a_checkpoint_is_written(tmp_path):
    d = tmp_path / "ck"
    with pytest.raises(ValueError, match="__metadata__ is reserved") as e:
        save_checkpoint(d, {"__metadata__": np.zeros(2, np.float32)}, None, 0, None, {})
    assert "model.safetensors" in str(e.value)
    assert not d.exists()


def test_a_tensor_named_metadata_is_refused_by_the_file_writer(tmp_path):
    p = tmp_path / "x.safetensors"
    with pytest.raises(ValueError, match="__metadata__ is reserved"):
        save_safetensors(p, {"__metadata__": np.zeros(2, np.float32)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "value, said",
    [
        (np.float32(1.0), "a float32"),  # a numpy scalar: its type, not its dtype
        (np.zeros(2, ">f4"), ">f4"),
        (np.zeros(2, np.float64), "float64"),
        ([1.0, 2.0], "a list"),
    ],
)
def test_a_checkpoint_array_of_the_wrong_kind_says_what_it_is(tmp_path, value, said):
    with pytest.raises(ValueError) as e:
        save_checkpoint(tmp_path / "ck", {"w": value}, None, 0, None, {})
    message = str(e.value)
    assert said in message and "not a float32 numpy array" in message
    assert "is float32, not float32" not in message


@pytest.mark.parametrize(
    "shape, numpy_says",
    [([0, 2**40, 2**40], "too big"), ([0] * 65, "dimension"), ([1] * 65, "dimension")],
)
def test_a_shape_numpy_cannot_hold_names_the_file_and_tensor(tmp_path, shape, numpy_says):
    p = tmp_path / "odd.safetensors"
    n = 0 if 0 in shape else 4
    _raw_file(p, {"odd": {"dtype": "F32", "shape": shape, "data_offsets": [0, n]}}, n)
    assert read_header(p)[0]["odd"] == ("F32", tuple(shape))  # a valid file
    for load in (lambda: load_safetensors(p), lambda: safe_open(p).get_tensor("odd")):
        with pytest.raises(ValueError, match=numpy_says) as e:
            load()
        assert str(p) in str(e.value) and "'odd'" in str(e.value)


CHILD = textwrap.dedent(
    """
    import resource, sys
    from tlio.safetensors import load_safetensors
    page = resource.getpagesize()
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * page
    limit = vm + (256 << 20)  # this process as it is, plus 256 MiB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        load_safetensors(sys.argv[1])
    except OSError as e:
        print(e.errno)
        print(e)
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc to size the limit")
def test_a_file_larger_than_the_memory_names_the_file(tmp_path):
    p = tmp_path / "big.safetensors"
    n = 1 << 30  # 1 GiB of F32, sparse on disk, four times the memory the child may use
    _raw_file(p, {"big": {"dtype": "F32", "shape": [n // 4], "data_offsets": [0, n]}}, n)
    r = subprocess.run([sys.executable, "-c", CHILD, str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    code, message = r.stdout.split("\n", 1)
    assert int(code) == errno.ENOMEM
    assert str(p) in message and "'big'" in message


def test_f16_overflow_becomes_infinity_as_numpy_and_torch_make_it(tmp_path):
    # safetensors.md's decision: F16 has an infinity, so a value beyond 65504 rounds to
    # it (IEEE round to nearest), as numpy's and torch's casts do; only F8_E4M3, which
    # has none, refuses.
    x = np.float32([65504.0, 65519.99, 65520.0, 1e6, -1e6, np.inf])
    p = tmp_path / "h.safetensors"
    save_safetensors(p, {"h": x}, None, {"h": "F16"})
    got = load_safetensors(p)[0]["h"]
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert list(np.isinf(got)) == [False, False, True, True, True, True]
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(got, torch.from_numpy(x).to(torch.float16).numpy())
