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
