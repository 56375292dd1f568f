"""A pytest plugin (``-p _safetensors_package_shim``) that runs the ``safetensors``
package's own test files against ``tlio.safetensors``: ``import safetensors``,
``safetensors.numpy`` and ``safetensors.torch`` give tlio's modules, so the package's
tests exercise the drop-in and never the package.

tests/run fetches the package's source distribution (the version
requirements-test.txt pins) and runs its test files through this plugin: test_simple.py,
test_pt_comparison.py, test_pt_model.py, test_pread_backend.py and
test_multithreaded.py. The others test what the drop-in does not offer: the
TensorFlow, Flax, MLX and Paddle modules, the low-level writer (test_threadable.py) and
opening file objects (test_handle.py). The package's
low-level writer (``TensorSpec``, ``serialize``, ``serialize_file``), which tlio does not
provide, is a name that raises when used, so that test_simple.py imports; the one test
of it, ``test_exception``, is marked as a strict expected failure: it runs, it must fail,
and pytest reports it as failing-as-expected, never as passed.
"""

import sys
import types

import pytest

import tlio.safetensors
import tlio.safetensors.numpy
import tlio.safetensors.torch

#: The package's names tlio does not provide (its low-level writer).
_ABSENT = ("TensorSpec", "serialize", "serialize_file")
#: The package's tests of those names: (file, test) -> why they cannot pass.
_EXPECTED_FAILURES = {
    ("test_simple.py", "test_exception"): "TensorSpec and serialize (the package's "
    "low-level writer) are not part of tlio's drop-in",
}


def _absent(name):
    def absent(*args, **kwargs):
        raise NotImplementedError(f"tlio.safetensors does not provide safetensors.{name}")

    absent.__name__ = name
    return absent


def _alias():
    top = types.ModuleType("safetensors", tlio.safetensors.__doc__)
    top.__dict__.update(
        {k: v for k, v in vars(tlio.safetensors).items() if not k.startswith("__")}
    )
    top.__path__ = []  # a package, so that `safetensors.torch` resolves to the alias
    for name in _ABSENT:
        setattr(top, name, _absent(name))
    top.numpy = tlio.safetensors.numpy
    top.torch = tlio.safetensors.torch
    sys.modules["safetensors"] = top
    sys.modules["safetensors.numpy"] = tlio.safetensors.numpy
    sys.modules["safetensors.torch"] = tlio.safetensors.torch


for _name in [m for m in sys.modules if m == "safetensors" or m.startswith("safetensors.")]:
    del sys.modules[_name]  # the real package, if something imported it first
_alias()


def pytest_sessionfinish(session):
    """Fail the run if the package itself was loaded: then its tests did not test tlio."""
    real = [m for m in sys.modules if m.startswith("safetensors._safetensors_rust")]
    if real:
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        raise RuntimeError(f"the safetensors package itself was imported ({real}): not a run against tlio")


def pytest_collection_modifyitems(items):
    for item in items:
        why = _EXPECTED_FAILURES.get((item.path.name, item.name))
        if why is not None:
            item.add_marker(pytest.mark.xfail(reason=why, strict=True))
