"""examples/pack_ray.py end to end on a local Ray (4 parts as Ray tasks, then the merge):
the merged shards equal one `tlio tokens pack`, and a second run finds every part
complete and redoes none."""

from __future__ import annotations

import importlib.util
import json
import os

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import ray  # noqa: E402  (after the variable: Ray reads it on import)

from _tokens_helpers import ROOT, TLIO_BIN, tlio  # noqa: E402


def _example():
    spec = importlib.util.spec_from_file_location("pack_ray", ROOT / "examples" / "pack_ray.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _corpus(tmp_path):
    lines = (ROOT / "fixtures" / "tokenizers" / "corpus.jsonl").read_text().split("\n")
    paths = []
    for i in range(3):
        p = tmp_path / f"c{i}.jsonl"
        p.write_text("\n".join(x for x in lines[i * 10:] + lines[: i * 10] if x) + "\n")
        paths.append(str(p))
    return paths


def test_ray_parts_merge_into_the_single_pack(tmp_path):
    tlio("--version")  # the binary exists (a missing one fails, never skips)
    inputs = _corpus(tmp_path)
    flags = ["--from", "jsonl", "--tokenizer", "gpt2", "--val-tokens", "2000", "--shard-tokens", "5000"]
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    tlio("-q", "tokens", "pack", *inputs, *flags, "-o", str(tmp_path / "one" / "fw"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        mod = _example()
        out = str(tmp_path / "many" / "fw")
        reports, merged = mod.pack(4, out, [*inputs, *flags], tlio=str(TLIO_BIN))
        assert [r["status"] for r in reports] == ["packed"] * 4
        again, _ = mod.pack(4, out, [*inputs, *flags], tlio=str(TLIO_BIN))
        assert [r["status"] for r in again] == ["complete"] * 4
    finally:
        ray.shutdown()
    want = sorted(p.name for p in (tmp_path / "one").iterdir() if p.is_file())
    got = sorted(p.name for p in (tmp_path / "many").iterdir() if p.is_file())
    assert got == want and len(want) >= 3
    assert [json.dumps(s["n"]) for s in merged["shards"]]
    for name in want:
        assert (tmp_path / "many" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
