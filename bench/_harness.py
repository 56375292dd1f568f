"""What the Python benchmarks share: each job runs in a child process of the script
(so its peak memory is its own), and the medians are printed as one table whose ratio
column compares each job with the last of its group (the tool a user would use
instead)."""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys


def peak_rss():
    """VmHWM: this process's peak resident set (reset by exec, unlike ru_maxrss, which
    Linux carries over from the parent across fork and exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_child(script, name, *args):
    """Run `script --child name args...` and return the JSON record its last line holds."""
    r = subprocess.run([sys.executable, script, "--child", name, *args],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def print_table(groups, results, places=4):
    """Medians of `results[job]` records ({"s": seconds, "rss": bytes}) per group, each
    job's time also as a ratio of the group's last job."""
    print(f"{'job':<40} {'median s':>10} {'ratio':>8} {'peak RSS MiB':>13}")
    for title, jobs in groups:
        print(f"-- {title}")
        ref = statistics.median(r["s"] for r in results[jobs[-1]])
        for j in jobs:
            s = statistics.median(r["s"] for r in results[j])
            rss = statistics.median(r["rss"] for r in results[j]) / (1 << 20)
            print(f"{j:<40} {s:>10.{places}f} {s / ref:>8.3f} {rss:>13.0f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def parse_args(child):
    """The options every Python benchmark takes; in a ``--child`` run, ``child`` is
    called with its three arguments and None is returned."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", nargs=3)
    ap.add_argument("--only", default=None, help="run only the groups whose title contains this")
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return None
    return args
