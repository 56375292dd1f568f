"""Shared fixtures of the Python package's tests: the repository root (found from this
file, so the tests run from any directory) and the committed safetensors references."""

import json
from pathlib import Path

import pytest


def _find_root() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "fixtures" / "safetensors" / "golden").is_dir() and (parent / "Cargo.toml").is_file():
            return parent
    raise RuntimeError("the repository root (with fixtures/ and Cargo.toml) is not above " + str(here))


ROOT = _find_root()
GOLDEN = ROOT / "fixtures" / "safetensors" / "golden"
MALFORMED = ROOT / "fixtures" / "safetensors" / "malformed"
MODELS = ROOT / "fixtures" / "models"


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def golden_manifest() -> dict:
    """golden/MANIFEST.json's files by name (fixtures/safetensors/README.md says what each holds)."""
    files = json.loads((GOLDEN / "MANIFEST.json").read_text())["files"]
    return {f["file"]: f for f in files}


@pytest.fixture(scope="session")
def s3_server():
    """The local S3 server (tests/s3_server.py, moto on 127.0.0.1), started once per
    session in a child process and stopped after the last test."""
    from _s3 import start_server

    server = start_server(ROOT)
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket of the local server, with the AWS variables of this process
    pointing at it (and every other AWS variable cleared) for the test's duration.
    ``s3.url(key)`` is ``s3://bucket/key``; ``s3.client`` is a boto3 client;
    ``s3.env()`` is the environment for a child process."""
    from _s3 import _CLEARED, Bucket

    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return Bucket(s3_server)
