"""examples/pack_ray.py end to end on a local Ray (4 parts as Ray tasks, then the merge),
with its output on disk and in object storage (the local S3 server): the merged shards
equal one `tlio tokens pack`, and a part run again finds itself complete."""

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


def test_ray_parts_merge_into_the_single_pack_on_shared_disk_and_in_object_storage(tmp_path, s3):
    tlio("--version")  # the binary exists (a missing one fails, never skips)
    inputs = _corpus(tmp_path)
    flags = ["--from", "jsonl", "--tokenizer", "gpt2", "--val-tokens", "2000", "--shard-tokens", "5000"]
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    tlio("-q", "tokens", "pack", *inputs, *flags, "-o", str(tmp_path / "one" / "fw"))
    # The s3 fixture has put the server's variables in this process's environment;
    # the workers Ray starts inherit them, as a cluster's nodes have their own.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        mod = _example()
        runs = {}
        for where, out in [("disk", str(tmp_path / "many" / "fw")), ("s3", s3.url("data/fw"))]:
            reports, merged = mod.pack(4, out, [*inputs, *flags], tlio=str(TLIO_BIN))
            assert [r["status"] for r in reports] == ["packed"] * 4, where
            runs[where] = merged
            # A part run again finds itself complete and redoes nothing.
            again = [mod.run_part(str(TLIO_BIN), k, 4, out, [*inputs, *flags], 1) for k in range(4)]
            assert [r["status"] for r in again] == ["complete"] * 4, where
    finally:
        ray.shutdown()
    want = sorted(p.name for p in (tmp_path / "one").iterdir() if p.is_file())
    assert len(want) >= 3
    got = sorted(p.name for p in (tmp_path / "many").iterdir() if p.is_file())
    assert got == want
    for name in want:
        assert (tmp_path / "many" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    # In storage: the same shards by name and bytes, and their manifest.
    merged = runs["s3"]
    assert merged["manifest"] == s3.url("data/fw.manifest.json")
    # The manifest lists the shards; each one's document sidecar (.docs) rides beside it.
    assert sorted(s["file"] for s in merged["shards"]) == [s3.url(f"data/{n}") for n in want if n.endswith(".bin")]
    assert [k for k in s3.keys("data/") if "/fw.parts/" not in k] == sorted(
        [f"data/{n}" for n in want] + ["data/fw.manifest.json"])
    for name in want:
        body = s3.client.get_object(Bucket=s3.name, Key=f"data/{name}")["Body"].read()
        assert body == (tmp_path / "one" / name).read_bytes(), name
