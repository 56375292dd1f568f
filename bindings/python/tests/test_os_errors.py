"""Operating-system failures of the package's writers and readers arrive as Python's own
I/O would raise them (python.md, errors): the ``OSError`` subclass of the errno, with
``.errno`` set, and a message naming the file: a full disk (EFBIG under RLIMIT_FSIZE, the
way to fill a disk without root), a directory the user may not write (EACCES), a path under
a regular file (ENOTDIR). A NUL byte in a path is a ``ValueError``, as in Python. Also: a
replaced file keeps its mode, and a strided array of ``save_checkpoint`` is copied with the
GIL released."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt
from tlio.checkpoint import load_checkpoint, save_checkpoint, verify_step_dir
from tlio.safetensors import load_safetensors, read_header, safe_open, save_safetensors
from tlio.tokens import TokenStream, open_tokens, read_tokens_header
from tlio.pcg import PCG32

#: Each writer as a snippet run in a child, writing into the directory ``D`` (a str).
WRITERS = {
    "save_safetensors": "save_safetensors(os.path.join(D, 'x.safetensors'), {'w': np.ones(1 << 18, np.float32)})",
    "save_checkpoint": "save_checkpoint(os.path.join(D, 'ck'), {'w': np.ones(1 << 18, np.float32)}, None, 1, None, {})",
    "tlio.torch.save": "tt.save(os.path.join(D, 'ck'), 1, torch.nn.Linear(512, 512))",
}

PRELUDE = """
import json, os, sys
import numpy as np
import torch
import tlio.torch as tt
from tlio.checkpoint import save_checkpoint
from tlio.safetensors import save_safetensors
D = sys.argv[1]
if sys.argv[2] == "drop-dac":
    # Root ignores file permissions through two capabilities; without them in its
    # effective set this process meets the mode bits as their owner does.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Sets(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    header, sets = Header(0x20080522, 0), (Sets * 2)()
    assert libc.capget(ctypes.byref(header), sets) == 0, ctypes.get_errno()
    sets[0].effective &= ~((1 << 1) | (1 << 2))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    assert libc.capset(ctypes.byref(header), sets) == 0, ctypes.get_errno()
try:
    {code}
except BaseException as e:
    print(json.dumps({{"type": type(e).__name__, "errno": getattr(e, "errno", None), "message": str(e),
                      "os_error": isinstance(e, OSError)}}))
else:
    print(json.dumps({{"type": None}}))
"""


def run_writer(code: str, directory: str, drop_dac: bool = False, **popen) -> dict:
    """``code`` in a child Python (the conditions set by ``popen``; ``drop_dac``: without
    the capabilities that let root ignore permissions): what it raised."""
    env = {k: v for k, v in os.environ.items() if k != "FAILPOINTS"}
    out = subprocess.run([sys.executable, "-c", PRELUDE.format(code=code), directory,
                          "drop-dac" if drop_dac else "-"], capture_output=True,
                         text=True, timeout=300, env=env, **popen)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cap_file_size(limit: int):
    def apply() -> None:
        # A write past the limit fails with EFBIG instead of killing the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_full_disk_is_an_oserror_with_its_errno_naming_the_file(tmp_path, writer):
    got = run_writer(WRITERS[writer], str(tmp_path), preexec_fn=_cap_file_size(64 * 1024))
    assert got["type"] == "OSError" and got["os_error"], got
    assert got["errno"] == errno.EFBIG, got
    assert str(tmp_path) in got["message"], got
    assert "tlio-tmp" not in got["message"]


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_directory_without_write_permission_is_a_permission_error(tmp_path, writer):
    # The tests may run as root, whom permissions do not stop: the child drops the
    # capabilities that make it so (harmless for another user, who lacks them anyway).
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        got = run_writer(WRITERS[writer], str(locked), drop_dac=True)
    finally:
        locked.chmod(0o755)
    assert got["type"] == "PermissionError", got
    assert got["errno"] == errno.EACCES, got
    assert str(locked) in got["message"], got
    assert os.listdir(locked) == []


def _under_a_file(tmp_path: Path) -> Path:
    f = tmp_path / "plain-file"
    f.write_bytes(b"x")
    return f


CALLS = {
    "save_safetensors": lambda d: save_safetensors(os.path.join(d, "x.safetensors"), {"w": np.ones(3, np.float32)}),
    "read_header": lambda d: read_header(os.path.join(d, "x.safetensors")),
    "load_safetensors": lambda d: load_safetensors(os.path.join(d, "x.safetensors")),
    "safe_open": lambda d: safe_open(os.path.join(d, "x.safetensors")),
    "save_checkpoint": lambda d: save_checkpoint(os.path.join(d, "ck"), {"w": np.ones(3, np.float32)}, None, 1,
                                                 None, {}),
    "load_checkpoint": lambda d: load_checkpoint(os.path.join(d, "ck")),
    "verify_step_dir": lambda d: verify_step_dir(os.path.join(d, "step-000001")),
    "tlio.torch.save": lambda d: tt.save(os.path.join(d, "ck"), 1, torch.nn.Linear(2, 1)),
    "tlio.torch.load": lambda d: tt.load(os.path.join(d, "ck"), torch.nn.Linear(2, 1)),
    "read_tokens_header": lambda d: read_tokens_header(os.path.join(d, "t.bin")),
    "open_tokens": lambda d: open_tokens(os.path.join(d, "t.bin")),
    "TokenStream": lambda d: TokenStream([os.path.join(d, "t.bin")], 4, 1, PCG32(1)),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_path_under_a_regular_file_is_not_a_directory_error(tmp_path, call):
    f = _under_a_file(tmp_path)
    with pytest.raises(NotADirectoryError) as e:
        CALLS[call](str(f))
    assert e.value.errno == errno.ENOTDIR
    assert str(f) in str(e.value)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_nul_byte_in_a_path_is_a_value_error_as_in_python(tmp_path, call):
    with pytest.raises(ValueError, match="null byte"):
        open(str(tmp_path / "a\0b"), "rb")  # the behaviour matched
    with pytest.raises(ValueError, match="null byte"):
        CALLS[call](str(tmp_path / "a\0b"))
    assert os.listdir(tmp_path) == []


def test_a_replaced_read_only_file_keeps_its_mode(tmp_path):
    path = tmp_path / "w.safetensors"
    for mode in (0o444, 0o640):
        save_safetensors(path, {"w": np.zeros(2, np.float32)})
        path.chmod(mode)
        save_safetensors(path, {"w": np.ones(2, np.float32)})
        assert stat.S_IMODE(path.stat().st_mode) == mode
        assert load_safetensors(path)[0]["w"].tolist() == [1.0, 1.0]
        path.chmod(0o644)


def test_a_strided_array_is_copied_with_the_gil_released(tmp_path):
    # With a switch interval of 100 s the watcher runs only when the saving thread lets go
    # of the GIL, and then holds the GIL for half a second. A saver that released it to
    # copy the strided array cannot go on to create the checkpoint directory (and its
    # .lock) until the watcher is done: that needs the GIL back. A saver whose first
    # release is the write itself creates them while the watcher spins.
    w = np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024).T
    assert not w.flags.c_contiguous
    ck = tmp_path / "ck"
    seen = {}
    go = threading.Event()

    def watcher() -> None:
        go.wait()
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            pass
        seen["done"] = time.time()

    interval = sys.getswitchinterval()
    t = threading.Thread(target=watcher)
    sys.setswitchinterval(100.0)
    try:
        t.start()
        go.set()
        # Hold the GIL until the watcher is surely waiting for it (it is handed over at
        # the next release, not before).
        until = time.monotonic() + 0.3
        while time.monotonic() < until:
            pass
        save_checkpoint(ck, {"w": w}, None, 1, None, {})
    finally:
        sys.setswitchinterval(interval)
        t.join(timeout=60)
    # The file system's clock may lag by a tick (10 ms at most): far less than the spin.
    created = (ck / ".lock").stat().st_mtime
    assert created > seen["done"] - 0.25, (created, seen["done"])
    assert np.array_equal(load_checkpoint(ck).model["w"], w)
