"""Pack a corpus with Ray: each part of `tlio tokens pack --part K/N` as a Ray task, then
`tlio tokens merge`, whose shards are byte-identical to one `tlio tokens pack`.

    python examples/pack_ray.py --parts 64 --out /shared/fw -- data/*.jsonl --from jsonl --tokenizer gpt2

    python examples/pack_ray.py --parts 64 --out s3://bucket/data/fw -- data/*.jsonl --from jsonl --tokenizer gpt2

Everything after ``--`` is given to every part: the inputs and the pack flags. The
inputs must be on storage every node sees, and ``--out`` too: a shared directory, or an
``s3://`` prefix (then every node needs the AWS variables). Each task runs the CLI
(the tokenizers live in the ``tlio`` binary; the Python package is built without
them), so ``tlio`` must be on every node's PATH (or ``--tlio PATH``). A part that
completed in an earlier run is skipped by the CLI itself, so rerunning the driver
after a failure redoes only the missing parts; Ray's own retries of a lost node's task
do the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Sequence


def run_part(tlio: str, index: int, parts: int, out: str, pack_args: Sequence[str], threads: int) -> dict[str, Any]:
    """Run part ``index`` of ``parts``; returns the CLI's JSON report (``status`` is
    ``packed`` or ``complete``). Raises RuntimeError with the CLI's message on failure."""
    cmd = [tlio, "--json", "tokens", "pack", *pack_args, "-o", out,
           "--part", f"{index}/{parts}", "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"part {index}/{parts} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def merge(tlio: str, out: str) -> dict[str, Any]:
    """Run ``tlio tokens merge OUT``; returns its JSON report (the shards written)."""
    proc = subprocess.run([tlio, "--json", "tokens", "merge", out], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"merge failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def pack(parts: int, out: str, pack_args: Sequence[str], tlio: str = "tlio",
         cpus_per_part: int = 1) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every part as a Ray task (Ray must be initialised), then the merge, in this
    process. Returns the parts' reports (in part order) and the merge's."""
    import ray

    task = ray.remote(num_cpus=cpus_per_part, max_retries=2)(run_part)
    refs = [task.remote(tlio, k, parts, out, list(pack_args), cpus_per_part) for k in range(parts)]
    reports = ray.get(refs)
    return reports, merge(tlio, out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: pack_ray.py --parts N --out PREFIX [--address A] -- INPUT... PACK_FLAGS...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", type=int, required=True, help="N, the number of parts (Ray tasks)")
    ap.add_argument("--out", required=True, help="the -o of the pack: a shared directory or s3://bucket/prefix")
    ap.add_argument("--tlio", default="tlio", help="the tlio binary on every node")
    ap.add_argument("--cpus-per-part", type=int, default=1, help="CPUs reserved per task (its --threads)")
    ap.add_argument("--address", default=None, help="the Ray cluster (default: start a local one)")
    args = ap.parse_args(argv[:cut])
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(address=args.address)
    try:
        reports, merged = pack(args.parts, args.out, argv[cut + 1:], args.tlio, args.cpus_per_part)
    finally:
        ray.shutdown()
    done = sum(r["status"] == "complete" for r in reports)
    print(f"{len(reports)} parts ({done} complete already), {merged['tokens']} tokens, "
          f"{len(merged['shards'])} shards", file=sys.stderr)
    for shard in merged["shards"]:
        print(shard["file"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
