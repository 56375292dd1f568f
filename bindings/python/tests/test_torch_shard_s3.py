"""Sharded checkpoints of tlio.torch on object storage (scale.md sections 1 and 3), against
the suite's local S3 server, FSDP2 on 2 ranks under torchrun (gloo on CPU): a sharded
save to an s3:// prefix loads back bit for bit (model and optimizer), into FSDP2 and into
one plain process; its objects are the bytes of the same save to a local directory, and
an async save's are too; a flipped byte in one rank's object makes verify fail and every
rank's load fall back to the older step; `ckpt verify/latest/gc/export` and `st inspect`
of the prefix give what they give for the local directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch  # in requirements-test.txt: a missing torch fails the run, never skips it

import tlio.torch as tt
from _tokens_helpers import tlio
from test_torch_dist import TIMEOUT, _env, _no_core_dumps, torchrun
from test_torch_shard import CHILD, child

torch.set_num_threads(1)


def objects(s3, prefix: str) -> dict:
    """{name: bytes} of the objects of the attempt a step's manifest names, and the
    manifest without its attempt, as a local step directory would hold them."""
    manifest = json.loads(s3.client.get_object(Bucket=s3.name, Key=f"{prefix}/MANIFEST.json")["Body"].read())
    attempt = manifest.pop("attempt")
    out = {"MANIFEST.json": json.dumps(manifest, separators=(",", ":")).encode()}
    for key in s3.keys(f"{prefix}/{attempt}/"):
        out[key.rsplit("/", 1)[1]] = s3.client.get_object(Bucket=s3.name, Key=key)["Body"].read()
    return dict(sorted(out.items()))


def local_files(step_dir: Path) -> dict:
    out = {p.name: p.read_bytes() for p in sorted(step_dir.iterdir())}
    # The local manifest, compared as parsed JSON re-encoded like the remote one.
    out["MANIFEST.json"] = json.dumps(json.loads(out["MANIFEST.json"]), separators=(",", ":")).encode()
    return dict(sorted(out.items()))


def test_sharded_save_and_load_on_object_storage(tmp_path, s3):
    local, p, q = tmp_path / "local", s3.url("run/p"), s3.url("run/q")
    report = tmp_path / "report"
    out = subprocess.run(torchrun(2, str(CHILD), "s3", str(report), str(local), p, q), capture_output=True,
                         text=True, timeout=TIMEOUT, env=_env(), preexec_fn=_no_core_dumps)
    assert out.returncode == 0, out.stderr[-4000:]
    r0, r1 = (json.loads(Path(f"{report}.{r}").read_text()) for r in (0, 1))
    for r in (r0, r1):
        assert (r["p1"], r["p2"], r["q2"]) == (f"{p}/step-000001", f"{p}/step-000002", f"{q}/step-000002")
        assert r["q2_type"] == "PendingSave"
        # FSDP2 -> FSDP2 from the prefix: bitwise, model and optimizer.
        assert r["loaded"] == [2, 14, f"{p}/step-000002"]
        assert r["loaded_state"] == r0["step2"] and r["step2"] == r0["step2"]
        # The flipped byte: every rank fell back to step 1, and has its state.
        assert r["flipped_load"] == ["ok", 1]
        assert r["flipped_state"] == r0["step1"]

    # The async save's objects and the blocking save's are the local save's files.
    want = local_files(local / "step-000002")
    assert [n for n in want if "-rank" in n] == [
        f"{g}-rank0000{k}.safetensors" for g in ("model", "optimizer") for k in (0, 1)]
    assert objects(s3, "run/q/step-000002") == want
    blocking = objects(s3, "run/p/step-000002")
    assert blocking.keys() == want.keys()
    assert {n: b for n, b in blocking.items() if n != "model-rank00001.safetensors"} == {
        n: b for n, b in want.items() if n != "model-rank00001.safetensors"}
    assert blocking["model-rank00001.safetensors"] != want["model-rank00001.safetensors"]  # flipped

    # 2 ranks -> one plain process, from the async save's prefix.
    net = child.Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    ck = tt.load(q, net, opt)
    assert (ck.step, ck.path, ck.extra["tokens_seen"]) == (2, f"{q}/step-000002", 14)
    assert child.digests(net, opt) == r0["step2"]
    # And a plain process falls back past the flipped byte, naming it.
    ck = tt.load(p, net, opt)
    assert ck.step == 1 and child.digests(net, opt) == r0["step1"]
    assert any("model-rank00001.safetensors" in why for _, why in ck.skipped), ck.skipped

    # The CLI: verify, latest, st inspect and export as for the local directory.
    def same(*args):
        there = tlio(*[a.replace("DIR", q) for a in args]).stdout
        here = tlio(*[a.replace("DIR", str(local)) for a in args]).stdout
        assert there.replace(q, "DIR") == here.replace(str(local), "DIR"), args
        return there

    # verify: the same report, but for the size, which counts the remote manifest's
    # "attempt":"attempt-<32 hex>", (53 more bytes).
    for target in ("DIR", "DIR/step-000002"):
        there, here = (json.loads(tlio("ckpt", "verify", "--json", target.replace("DIR", d)).stdout)
                       for d in (q, str(local)))
        for report_ in (there, here):
            sized = report_.get("steps", [report_])
            for row in sized:
                row["size"] = row.pop("size") - (53 if report_ is there else 0)
        assert there == here, target
    assert same("ckpt", "latest", "DIR").strip() == f"{q}/step-000002"
    same("st", "inspect", "DIR/step-000002")
    same("st", "inspect", "--json", "DIR/step-000002")
    tlio("ckpt", "export", f"{q}/step-000002", "-o", str(tmp_path / "from-s3"))
    tlio("ckpt", "export", str(local / "step-000002"), "-o", str(tmp_path / "from-local"))
    exported = [{f.name: f.read_bytes() for f in sorted((tmp_path / d).iterdir())} for d in ("from-s3", "from-local")]
    assert exported[0] == exported[1] and "model.safetensors" in exported[0]

    bad = tlio("ckpt", "verify", p, check=False)
    assert bad.returncode == 1 and "model-rank00001.safetensors" in bad.stdout + bad.stderr
    assert tlio("ckpt", "latest", p).stdout.strip() == f"{p}/step-000001"
    # gc keeps the step load picks (1) and what is newer (the broken 2).
    tlio("ckpt", "gc", p, "--keep", "1")
    steps = {k.split("/")[2] for k in s3.keys("run/p/") if k.count("/") >= 3}
    assert steps == {"step-000001", "step-000002"}
