"""``ratewarden serve`` as a real process on free loopback ports, for the tests
that need a real server (drain, workers, gateways in front)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.redis_server import free_port

RATEWARDEN = Path(sys.executable).parent / "ratewarden"


@dataclass
class Served:
    process: subprocess.Popen[str]
    http: int
    grpc: int
    stderr: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def terminate(self, timeout: float = 20) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


@contextmanager
def serving(*args: str, tmp: Path, ready: float = 30) -> Iterator[Served]:
    """Start the service; yield once it printed where it listens; stop it after.

    A free port can be taken by another process between the test's choice and
    the server's bind: then the start is tried again on new ports, up to three
    times, and any other failure to start fails the test with the server's stderr."""
    served = None
    for _ in range(3):
        served = _start(args, tmp, ready)
        if served is not None:
            break
    if served is None:
        pytest.fail("ratewarden serve found its ports taken three times")
    process = served.process
    try:
        yield served
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _start(args: tuple[str, ...], tmp: Path, ready: float) -> Served | None:
    """A started server, or None when one of its ports was taken meanwhile."""
    http, grpc = free_port(), free_port()
    while grpc == http:  # each is free when asked, so both can be the same port
        grpc = free_port()
    stderr = tmp / f"serve-{http}.log"
    command = [str(RATEWARDEN), "serve", "--http", f"127.0.0.1:{http}",
               "--grpc", f"127.0.0.1:{grpc}", *args]  # fmt: skip
    with stderr.open("w") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    started = time.monotonic()
    assert process.stdout is not None
    line = process.stdout.readline()
    if re.search(r"HTTP on http://", line):
        if time.monotonic() - started > ready:
            process.kill()
            process.wait()
            pytest.fail("ratewarden serve took too long to start")
        return Served(process, http, grpc, stderr)
    process.kill()
    process.wait()
    process.stdout.close()
    said = stderr.read_text()
    if "address already in use" in said.lower():
        return None
    pytest.fail(f"ratewarden serve did not start ({line!r}, exit {process.returncode}):\n{said}")


@contextmanager
def serving_rules(rules: str, token: str, *args: str, tmp: Path) -> Iterator[Served]:
    """`serving` a rule file of ``rules`` behind ``token`` (read from a file), HTTP only."""
    path = tmp / "rules.yaml"
    path.write_text(rules)
    token_file = tmp / "token"
    token_file.write_text(token)
    with serving("--config", str(path), "--grpc", "off", "--token-file", str(token_file),
                 *args, tmp=tmp) as served:  # fmt: skip
        yield served
