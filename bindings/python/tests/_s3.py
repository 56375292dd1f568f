"""The local S3 server of the object-storage tests: ``tests/s3_server.py`` (moto on
127.0.0.1, on a port the system picks) run as a child process, so the server never
competes with the test for the interpreter, and a test can stop its own server in the
middle of a save. The server stops when its standard input closes.

Used through the ``s3`` fixture of conftest.py; ``start_server`` gives a test a server
of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Dict, Optional

import boto3

# The region the tests name (moto's default).
TEST_REGION = "us-east-1"
# The AWS variables a test environment sets or clears, so nothing of the caller's
# own configuration (a profile, a session token, a real endpoint) leaks in.
_CLEARED = ("AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


class _Child:
    """A helper process answering one line per request line on its standard input."""

    proc: subprocess.Popen
    _lock: threading.Lock

    def ask(self, request: str) -> str:
        """Send one request line; its ``ok`` value."""
        with self._lock:
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().rstrip("\n")
        if not answer.startswith("ok"):
            raise RuntimeError(f"{request}: {answer}")
        return answer[2:].strip()

    def stop(self) -> None:
        """Stop the process (closing its input ends it) and wait for it."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class Server(_Child):
    """One running ``tests/s3_server.py``: its endpoint and its request channel."""

    def __init__(self, root: Path, auth: bool = False):
        script = root / "tests" / "s3_server.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *(["--auth"] if auth else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        # The first line is ``URL KEY SECRET``: the endpoint and the credentials the
        # server accepts (with auth=False it checks no signature, any key works).
        line = self.proc.stdout.readline().strip()
        words = line.split()
        if len(words) != 3 or not words[0].startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"the local S3 server did not start (is moto installed?): {line!r}")
        self.endpoint, self.key, self.secret = words
        self._lock = threading.Lock()

    def new_bucket(self) -> str:
        """A fresh, empty bucket."""
        name = "tlio-py-" + uuid.uuid4().hex[:20]
        self.ask(f"bucket {name}")
        return name

    def env(self) -> Dict[str, str]:
        """The AWS variables that point a client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": TEST_REGION,
        }

    def client(self):
        """A boto3 client of this server (the reference the tests compare with)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=TEST_REGION,
        )



class FaultProxy(_Child):
    """``tests/fault_proxy.py`` in front of ``server``: give a client ``endpoint``, and
    add rules with ``ask`` (the proxy's docstring lists them)."""

    def __init__(self, root: Path, server: Server):
        script = root / "tests" / "fault_proxy.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), server.endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.endpoint = self.proc.stdout.readline().strip()
        self._lock = threading.Lock()
        if not self.endpoint.startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"the fault proxy did not start: {self.endpoint!r}")


def start_server(root: Path, auth: bool = False) -> Server:
    """A server of the caller's own (stop it with ``stop``); with ``auth`` it checks
    every request's signature against its one user's key."""
    return Server(root, auth)


def child_env(server: Server, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A copy of ``base`` (the process environment by default) pointing at ``server``,
    for a child process."""
    env = dict(os.environ if base is None else base)
    for name in _CLEARED:
        env.pop(name, None)
    env.update(server.env())
    return env


class Bucket:
    """A fresh bucket of the shared server, for one test."""

    def __init__(self, server: Server):
        self.server = server
        self.name = server.new_bucket()
        self.client = server.client()
        self.endpoint = server.endpoint

    def url(self, key: str = "") -> str:
        """``s3://bucket/key`` (the bucket's root for an empty key)."""
        return f"s3://{self.name}/{key}" if key else f"s3://{self.name}"

    def keys(self, prefix: str = "") -> list:
        """Every key under ``prefix``, sorted."""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix):
            out.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(out)

    def env(self) -> Dict[str, str]:
        """The environment of a child process that uses this bucket's server."""
        return child_env(self.server)
