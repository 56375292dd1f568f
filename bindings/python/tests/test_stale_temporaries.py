"""A write sweeps the temporaries that earlier writers left in its directory, judged by
the lock a live writer holds on its temporary (docs/architecture.md), never by the
process id in the name: a writer in another PID namespace or on another host sharing
the directory keeps its file, and a dead writer's file goes whatever its pid."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from tlio.safetensors import load_safetensors, save_safetensors

# Holds an exclusive flock on argv[1], as a live writer elsewhere does, until its input
# closes.
HOLDER = """
import fcntl, sys
f = open(sys.argv[1], "rb")
fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""

# Writes w.safetensors with x = [0, 1, 2, 3, 4] in a fresh process.
WRITER = """
import sys
import numpy as np
from tlio.safetensors import save_safetensors
save_safetensors(sys.argv[1], {"x": np.arange(5, dtype=np.float32)})
"""


def test_a_locked_temporary_is_kept_and_an_unlocked_one_removed_whatever_their_pids(tmp_path):
    # Names as tlio's writers make them: `.TARGET.tlio-tmp-PID-XXXXXX`.
    live_elsewhere = tmp_path / ".w.safetensors.tlio-tmp-2147483645-abcdef"  # pid dead here
    dead_unrelated_pid = tmp_path / ".w.safetensors.tlio-tmp-1-abcdef"  # pid 1 alive here
    dead = tmp_path / ".w.safetensors.tlio-tmp-2147483646-abcdef"
    for f in (live_elsewhere, dead_unrelated_pid, dead):
        f.write_bytes(b"partial" * 100)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(live_elsewhere)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        save_safetensors(tmp_path / "w.safetensors", {"x": np.arange(4, dtype=np.float32)})
        assert live_elsewhere.exists(), "a locked temporary is a live writer's"
        assert live_elsewhere.read_bytes() == b"partial" * 100
        assert not dead_unrelated_pid.exists(), "a pid alive here proves nothing"
        assert not dead.exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    # Once its writer is gone (its lock released), the next process that writes there
    # removes it (a process sweeps a directory once, at its first write there).
    subprocess.run(
        [sys.executable, "-c", WRITER, str(tmp_path / "w.safetensors")], check=True, timeout=60
    )
    assert not live_elsewhere.exists()
    tensors, _ = load_safetensors(tmp_path / "w.safetensors")
    assert tensors["x"].tolist() == [0, 1, 2, 3, 4]
