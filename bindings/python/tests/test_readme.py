"""The README's Python example runs as written, in a fresh directory that holds only
the shard it names (packed from the repository's corpus by the tlio binary)."""

import os
import re

import numpy as np

from _tokens_helpers import ROOT, tlio


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the README's Python section has one example"
    return blocks[0]


def test_readme_python_example_runs(tmp_path):
    corpus = ROOT / "assets" / "demo_corpus.txt"
    tlio("tokens", "pack", str(corpus), "-o", str(tmp_path / "train.bin"))
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(_readme_example(), "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    # What the example claims: a verified step, loaded back, and a batch of [8, 64].
    assert namespace["ckpt"].step == 7
    assert namespace["inputs"].shape == (8, 64) and namespace["inputs"].dtype == np.int64
    np.testing.assert_array_equal(namespace["inputs"][:, 1:], namespace["targets"][:, :-1])
    assert (tmp_path / "run" / "ckpt" / "LATEST").read_text() == "step-000007\n"
