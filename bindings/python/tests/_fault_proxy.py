"""The project's fault-injecting proxy (tests/fault_proxy.py) for the Python tests: a
child process between tlio and the local S3 server that loses replies, fails, drops or
holds the requests a rule matches. ``FaultProxy(s3).endpoint`` is what to give
``AWS_ENDPOINT_URL``; ``rule(...)`` adds a rule as the proxy's own request line does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


class FaultProxy:
    """One running tests/fault_proxy.py in front of ``upstream`` (an endpoint URL)."""

    def __init__(self, upstream: str):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "fault_proxy.py"), upstream],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"the fault proxy did not start: {self.endpoint!r}")

    def ask(self, request: str) -> str:
        """Send one request line; its ``ok`` value."""
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().rstrip("\n")
        if not answer.startswith("ok"):
            raise RuntimeError(f"{request}: {answer}")
        return answer[2:].strip()

    def rule(self, method: str, pattern: str, nth: str, action: str) -> str:
        """Add a rule (see tests/fault_proxy.py); its id."""
        return self.ask(f"rule {method} {pattern} {nth} {action}")

    def hits(self, rule_id: str) -> int:
        """How many requests rule ``rule_id`` acted on so far."""
        return int(self.ask(f"hits {rule_id}"))

    def stop(self) -> None:
        """Stop the proxy (closing its input ends it)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
