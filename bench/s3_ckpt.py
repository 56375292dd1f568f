#!/usr/bin/env python3
"""Checkpoints on object storage against boto3 moving the same bytes: a save of a
``--mb`` MB state (one F32 model file) to a local S3 server (moto on 127.0.0.1, started
here and stopped at the end), and its verified load, side by side with boto3's
``upload_file`` and ``download_file`` of the same file. The bytes cross loopback, so the
ratio measures each client's own overhead: tlio's save also hashes every byte, checks
the safetensors header and commits with a conditional manifest; its load hashes every
byte and checks it against the manifest before returning it.

    python bench/s3_ckpt.py [--mb 1536] [--runs 3]

Jobs (each in a child process, so its peak memory is its own):
- ``tlio.checkpoint.save_checkpoint`` to ``s3://`` against ``boto3 upload_file`` (and,
  to show what a checksum-less upload costs this server, boto3 asked for none);
- ``tlio.checkpoint.load_checkpoint`` from ``s3://`` (into memory, verified) and
  ``tlio ckpt latest`` (verified by streaming, nothing kept) against ``boto3
  download_file`` (to a local file) and one streamed ``get_object`` into a file.

Never a timed test: the figures go to docs/object-storage.md.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import parse_args, peak_rss, print_table, run_child  # noqa: E402

ROOT = os.path.dirname(HERE)
TLIO = os.path.join(ROOT, "target", "release", "tlio")
KEY = "testing"


def env_for(url: str) -> dict:
    return {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": KEY,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
    }


def boto(url: str, config=None):
    import boto3

    return boto3.client("s3", endpoint_url=url, aws_access_key_id=KEY,
                        aws_secret_access_key=KEY, region_name="us-east-1", config=config)


def child(name: str, work: str, arg: str) -> None:
    """One job; ``arg`` is ``URL|RUN`` (the server and a run number for fresh keys)."""
    url, run = arg.split("|")
    os.environ.update(env_for(url))
    model = os.path.join(work, "model.safetensors")
    t0 = time.perf_counter()
    if name == "tlio save_checkpoint s3://":
        import numpy as np
        from tlio.safetensors.numpy import load_file

        from tlio.checkpoint import save_checkpoint

        tensors = load_file(model)
        t0 = time.perf_counter()
        save_checkpoint(f"s3://bench/run{run}", tensors, None, 1, None, {}, None)
        del np
    elif name == "boto3 upload_file":
        boto(url).upload_file(model, "bench", f"boto{run}/model.safetensors")
    elif name == "boto3 upload_file, no checksum":
        # boto3 names a CRC32 checksum for every part by default, tlio a SHA-256 (the
        # digest it computes to sign each request anyway). Without one, this server
        # computes a checksum of the whole object when the upload completes (it copies
        # every part into one buffer for it): this job shows what that costs.
        from botocore.config import Config

        client = boto(url, Config(request_checksum_calculation="when_required"))
        client.upload_file(model, "bench", f"botonc{run}/model.safetensors")
    elif name == "tlio load_checkpoint s3://":
        from tlio.checkpoint import load_checkpoint

        loaded = load_checkpoint(f"s3://bench/run{run}")
        assert loaded.step == 1
    elif name == "tlio ckpt latest s3://":
        subprocess.run([TLIO, "ckpt", "latest", f"s3://bench/run{run}"], check=True,
                       capture_output=True)
    elif name == "boto3 download_file":
        out = os.path.join(work, f"down{run}.safetensors")
        boto(url).download_file("bench", f"boto{run}/model.safetensors", out)
        os.remove(out)
    elif name == "boto3 get_object (one GET)":
        # One streamed GET into a file: download_file's concurrent ranged GETs are slow
        # against this server (it copies the whole stored object to answer each range), so
        # this is the fair floor of a download here.
        out = os.path.join(work, f"down{run}.safetensors")
        body = boto(url).get_object(Bucket="bench", Key=f"boto{run}/model.safetensors")["Body"]
        with open(out, "wb") as f:
            for chunk in body.iter_chunks(4 << 20):
                f.write(chunk)
        os.remove(out)
    else:
        raise SystemExit(f"unknown job {name}")
    s = time.perf_counter() - t0
    import json

    print(json.dumps({"s": s, "rss": peak_rss()}))


def main() -> None:
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--mb", type=int, default=1536)
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(child)
    if args is None:
        return
    import numpy as np

    from tlio.safetensors.numpy import save_file

    work = args.dir or tempfile.mkdtemp(prefix="tlio-bench-s3-")
    server = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "s3_server.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        # The first line is ``URL KEY SECRET``; this server checks no signature.
        url = server.stdout.readline().split()[0]
        server.stdin.write("bucket bench\n")
        server.stdin.flush()
        assert server.stdout.readline().startswith("ok"), "cannot create the bucket"
        # Several tensors, as a model has: 64 MiB each.
        n = known.mb * (1 << 20) // 4
        per = 16 << 20
        rng = np.random.default_rng(0)
        tensors = {f"layer{i:03d}.weight": rng.standard_normal(min(per, n - i * per), dtype=np.float32)
                   for i in range((n + per - 1) // per)}
        save_file(tensors, os.path.join(work, "model.safetensors"))
        del tensors
        size = os.path.getsize(os.path.join(work, "model.safetensors"))
        print(f"{size / 1e9:.2f} GB state, {args.runs} runs, load average "
              f"{os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
        groups = [
            # The ratio is against the last job of each group.
            ("save to the local S3 server", ["tlio save_checkpoint s3://",
                                             "boto3 upload_file, no checksum",
                                             "boto3 upload_file"]),
            ("load from the local S3 server", ["tlio load_checkpoint s3://",
                                               "tlio ckpt latest s3://", "boto3 download_file",
                                               "boto3 get_object (one GET)"]),
        ]
        groups = [g for g in groups if not args.only or args.only in g[0]]
        results = {j: [] for _, jobs in groups for j in jobs}
        for run in range(args.runs):
            if not any(g[0].startswith("save") for g in groups):
                # The loads read what the saves wrote: write it, untimed.
                for j in ("tlio save_checkpoint s3://", "boto3 upload_file"):
                    run_child(__file__, j, work, f"{url}|{run}")
            for _, jobs in groups:
                for j in jobs:
                    results[j].append(run_child(__file__, j, work, f"{url}|{run}"))
            # The server keeps objects in memory: drop this run's before the next.
            for prefix in (f"run{run}/", f"boto{run}/", f"botonc{run}/"):
                server.stdin.write(f"keys bench {prefix}\n")
                server.stdin.flush()
                keys = server.stdout.readline().split()[1:]
                for key in keys:
                    server.stdin.write(f"delete bench {key}\n")
                    server.stdin.flush()
                    server.stdout.readline()
        print_table(groups, results, places=3)
    finally:
        server.stdin.close()
        server.wait(timeout=60)
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
