"""What happens to loaded arrays and open views when the file changes underneath.

`load_safetensors` promises arrays that are the caller's: a file rewritten in place,
truncated or deleted afterwards changes nothing in them, and never kills the process.
`safe_open`'s views are a live map by design; a file that shrank since it was opened is
refused before a new view is made (a view past the end of a file faults with SIGBUS).
"""

import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tlio.safetensors import load_safetensors, safe_open, save_safetensors


def _tensors():
    return {
        "w": np.arange(64 * 1024, dtype=np.float32).reshape(256, 256),
        "b": np.arange(4096, dtype=np.int64),
        "h": np.float32([1.5, -2.0, 3.25]),
    }


def test_loaded_arrays_ignore_a_rewrite_in_place(tmp_path):
    p = tmp_path / "w.safetensors"
    want = _tensors()
    save_safetensors(p, want, {"k": "v"}, {"h": "BF16"})
    got, _ = load_safetensors(p)
    size = p.stat().st_size
    # Same size, other bytes, same inode: what `open(p, "r+b")` or a tool writing in
    # place does. Arrays over a private map of the file would show the new bytes.
    with open(p, "r+b") as f:
        f.seek(size - 64 * 1024 * 4 - 4096 * 8 - 8)
        f.write(b"\xff" * (size - f.tell()))
    np.testing.assert_array_equal(got["w"], want["w"])
    np.testing.assert_array_equal(got["b"], want["b"])
    np.testing.assert_array_equal(got["h"], want["h"])
    for a in got.values():
        base = a
        while isinstance(base, np.ndarray):
            base = base.base
        assert not isinstance(base, (memoryview, mmap.mmap)), "an array over a map of the file"


CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from tlio.safetensors import load_safetensors
    path = sys.argv[1]
    got, _ = load_safetensors(path)
    open(path, "wb").close()  # truncated underneath, as `open(p, "wb")` or `cp` does
    total = sum(float(a.astype(np.float64).sum()) for a in got.values())
    got["w"][0, 0] = 7  # still writable
    print(total)
    """
)


def test_loaded_arrays_survive_a_truncated_file(tmp_path):
    p = tmp_path / "w.safetensors"
    want = _tensors()
    save_safetensors(p, want)
    r = subprocess.run([sys.executable, "-c", CHILD, str(p)], capture_output=True, text=True, timeout=120)
    # A map of the file would die here with SIGBUS (returncode -7).
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert float(r.stdout) == sum(float(a.astype(np.float64).sum()) for a in want.values())


def test_safe_open_refuses_a_file_that_shrank(tmp_path):
    p = tmp_path / "w.safetensors"
    save_safetensors(p, _tensors())
    f = safe_open(p)
    np.testing.assert_array_equal(f.get_tensor("b"), _tensors()["b"])
    with open(p, "r+b") as g:
        g.truncate(os.path.getsize(p) // 2)
    with pytest.raises(ValueError, match="shrank") as e:
        f.get_tensor("w")
    assert str(p) in str(e.value)
    f.close()


def test_safe_open_keeps_the_old_file_when_it_is_replaced_by_rename(tmp_path):
    # Every tlio writer (and the package's) replaces by renaming: the open file and its
    # views keep the old inode, whole.
    p = tmp_path / "w.safetensors"
    want = _tensors()
    save_safetensors(p, want)
    with safe_open(p) as f:
        w = f.get_tensor("w")
        save_safetensors(p, {"x": np.zeros(1, np.float32)})
        np.testing.assert_array_equal(w, want["w"])
        np.testing.assert_array_equal(f.get_tensor("b"), want["b"])
