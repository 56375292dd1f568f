"""One host of test_hosts_without_shared_disk.py, run inside namespaces of its own
(``unshare --mount --pid``): a tmpfs of this host only is mounted over SCRATCH, a path
every host names but none sees of another; the host's marker is written there, the
temporary and cache directories of everything it runs point into it, then the command
(this host's torchrun of the job) runs. REPORT gets, as JSON, the command's exit status,
what SCRATCH held before the command, and every file under it after.

    python _host.py SCRATCH NAME REPORT COMMAND...

Killing the ``unshare`` that runs this (``--kill-child``) kills the whole host: this
process is the first of its pid namespace, so every process of the host goes with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def files_under(root: str) -> list:
    out = []
    for parent, _, names in os.walk(root):
        out.extend(os.path.relpath(os.path.join(parent, n), root) for n in names)
    return sorted(out)


def main() -> int:
    scratch, name, report, *command = sys.argv[1:]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", f"host-{name}", scratch], check=True)
    before = files_under(scratch)
    with open(os.path.join(scratch, f"host-{name}"), "w") as f:
        f.write(name)
    env = dict(os.environ)
    for sub in ("tmp", "cache"):
        os.makedirs(os.path.join(scratch, sub))
    env.update(TMPDIR=os.path.join(scratch, "tmp"), XDG_CACHE_HOME=os.path.join(scratch, "cache"))
    env.pop("TLIO_CACHE_DIR", None)
    rc = subprocess.call(command, env=env)
    with open(report, "w") as f:
        json.dump({"rc": rc, "before": before, "after": files_under(scratch)}, f)
    return rc


if __name__ == "__main__":
    sys.exit(main())
