"""examples/train_torch.py over a 3-source mixture (--mix) read through a StatefulDataLoader
with 4 workers (--num-workers 4): the run trains on the very batches of no workers (the same
digests), and a run SIGKILLed mid-way and resumed with --resume ends bitwise where an
uninterrupted one ends (the loader's state, each worker's cursor, is checkpointed)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _tokens_helpers import ROOT, tlio, write_shard  # noqa: E402
from test_torch_dist import TIMEOUT, _env, _no_core_dumps  # noqa: E402

from tlio.tokens import open_tokens  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_torch.py"


def test_example_mixture_with_workers_killed_resumes_bitwise(tmp_path):
    packed = tmp_path / "corpus.bin"
    tlio("tokens", "pack", str(ROOT / "assets" / "demo_corpus.txt"), "--tokenizer", "gpt2", "-o", str(packed))
    ids = open_tokens(packed)
    third = len(ids) // 3
    mix = []
    for j, weight in enumerate(("0.5", "0.3", "0.2")):
        part = write_shard(tmp_path / f"src{j}.bin", ids[j * third:(j + 1) * third].tolist(), vocab=50257)
        mix += ["--mix", f"{part}:{weight}"]
    base = [sys.executable, str(EXAMPLE), *mix, "--steps", "16", "--every", "8", "--batch", "2"]
    run = dict(capture_output=True, text=True, timeout=TIMEOUT, env=_env(), check=True)
    want = subprocess.run([*base, "--num-workers", "4", "--out", str(tmp_path / "full")], **run)
    want = want.stdout.splitlines()[-1]
    alone = subprocess.run([*base, "--num-workers", "0", "--out", str(tmp_path / "alone")], **run)
    assert want.startswith("sha256 state_dict=")
    assert alone.stdout.splitlines()[-1] == want, "4 workers train on the batches of none"

    out = tmp_path / "killed"
    p = subprocess.Popen([*base, "--num-workers", "4", "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=_env(), preexec_fn=_no_core_dumps)
    for line in p.stdout:
        if line.startswith("rank 0 step 11 "):  # after step 8's save, not on a worker boundary
            p.send_signal(signal.SIGKILL)
            break
    p.communicate(timeout=TIMEOUT)
    assert p.returncode == -signal.SIGKILL, p.returncode
    done = subprocess.run([*base, "--num-workers", "4", "--out", str(out), "--resume"], **run)
    assert done.stdout.splitlines()[0].split()[-1] == "8"
    assert done.stdout.splitlines()[-1] == want
    tlio("ckpt", "verify", str(out))
