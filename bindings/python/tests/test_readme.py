"""The README's quick starts that need Python run as written: the Python and PyTorch
examples, the FSDP2 -> tensor-parallel shell block under torchrun, and the object
storage block against a local S3 server (and docs/object-storage.md's quick start
likewise) (the shell quick start and the tour are run by
the CLI tests, tests/cli/readme.rs).

Each runs in a fresh directory that links the checkout's ``assets/``, ``fixtures/`` and
``examples/``, so the blocks' relative paths resolve as they do in a checkout, with this
repository's release binary first on ``PATH`` as ``tlio``."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from _tokens_helpers import ROOT, TLIO_BIN, tlio


def _section(title: str, page: str = "README.md") -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    head = f"\n## {title}\n"
    assert head in text, f"{page} has a section {title!r}"
    return text.split(head, 1)[1].split("\n## ", 1)[0]


def _blocks(title: str, lang: str, page: str = "README.md") -> list:
    return re.findall(rf"```{lang}\n(.*?)```", _section(title, page), flags=re.S)


def _checkout_like(tmp: Path) -> Path:
    """A directory whose assets/, fixtures/ and examples/ are the checkout's own."""
    for name in ("assets", "fixtures", "examples"):
        (tmp / name).symlink_to(ROOT / name)
    return tmp


def _env() -> dict:
    assert TLIO_BIN.is_file(), f"{TLIO_BIN} is missing: run `cargo build --release` first"
    env = dict(os.environ)
    # tlio and this interpreter's scripts (python, torchrun) first on PATH.
    env["PATH"] = os.pathsep.join([str(TLIO_BIN.parent), str(Path(sys.executable).parent), env["PATH"]])
    return env


def _run_block(block: str, cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"the block exited {out.returncode}:\n{block}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    return out


def _exec_in(block: str, cwd: Path) -> dict:
    """Run a README Python block in ``cwd``; the names it defined."""
    namespace: dict = {}
    before = os.getcwd()
    os.chdir(cwd)
    try:
        exec(compile(block, "README.md", "exec"), namespace)
    finally:
        os.chdir(before)
    return namespace


def test_the_python_quick_start_runs_as_written(tmp_path):
    blocks = _blocks("Quick start: Python", "python")
    assert len(blocks) == 1, "the Python quick start has one example"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "-o", str(tmp_path / "train.bin"))
    namespace = _exec_in(blocks[0], tmp_path)
    # What the example claims: a verified step, loaded back, and a batch of [8, 64].
    assert namespace["ckpt"].step == 7
    assert namespace["inputs"].shape == (8, 64) and namespace["inputs"].dtype == np.int64
    np.testing.assert_array_equal(namespace["inputs"][:, 1:], namespace["targets"][:, :-1])
    assert (tmp_path / "run" / "ckpt" / "LATEST").read_text() == "step-000007\n"


def test_the_pytorch_quick_start_runs_as_written(tmp_path):
    blocks = _blocks("Quick start: PyTorch", "python")
    assert len(blocks) == 1, "the PyTorch quick start has one Python example"
    namespace = _exec_in(blocks[0], tmp_path)
    assert namespace["ckpt"].step == 1
    # The step it wrote verifies through the CLI, as the README says.
    tlio("ckpt", "verify", str(tmp_path / "run" / "torch"))


def test_the_fsdp2_to_tensor_parallel_block_runs_as_written(tmp_path):
    blocks = _blocks("Quick start: PyTorch", "sh")
    assert len(blocks) == 1, "the PyTorch quick start has one shell block"
    out = _run_block(blocks[0], _checkout_like(tmp_path), _env(), timeout=600)
    # The resumed tensor-parallel run committed step 30 and the run verifies.
    assert (tmp_path / "tour" / "fsdp" / "run" / "LATEST").read_text() == "step-000030\n", out.stderr
    assert "step-000030" in out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_s3_block(block: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a block that starts a local S3 server on port 9000, on a free port instead."""
    # The block's one change: the server's port, so a test never meets another
    # server on 9000.
    assert block.count("9000") == 3, block
    # The server stops with the block, whatever happens in it.
    block = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + block.replace("9000", str(_free_port()))
    env = _env()
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_DEFAULT_REGION"):
        env.pop(name, None)
    # The page's objects are read through the cache: a fresh one, not the user's.
    env["TLIO_CACHE_DIR"] = str(cwd / ".cache")
    return _run_block(block, _checkout_like(cwd), env, timeout=300)


def test_the_object_storage_block_runs_as_written(tmp_path):
    blocks = _blocks("Quick start: object storage", "sh")
    assert len(blocks) == 1, "the object-storage quick start has one shell block"
    out = _run_s3_block(blocks[0], tmp_path)
    assert "step-000001" in out.stdout, out.stdout


def test_the_object_storage_page_quick_start_runs_as_written(tmp_path):
    blocks = _blocks("Quick start", "sh", page="docs/object-storage.md")
    assert len(blocks) == 1, "docs/object-storage.md's quick start has one shell block"
    out = _run_s3_block(blocks[0], tmp_path)
    # What it claims: a verified step, loaded back in Python, a shard in the bucket.
    assert "step-000001" in out.stdout, out.stdout
    assert "1 ['w']" in out.stdout, out.stdout
    assert "corpus.bin" in out.stdout and "61695" in out.stdout, out.stdout
