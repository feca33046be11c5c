"""Redis servers the tests start themselves, on free loopback ports, and stop.

Never a server the tests did not start (the machine's shared one on 6379 included).
A test that cannot get its server fails with the reason; it never skips.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)


@contextmanager
def redis_server(*extra: str) -> Iterator[RedisServer]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail(
            "redis-server is not installed; ./dev test installs it (apt-get install redis-server)"
        )
    with tempfile.TemporaryDirectory(prefix="rw-redis-") as workdir:
        port = free_port()
        log = Path(workdir) / "redis.log"
        process = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", workdir, "--logfile", str(log), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        server = RedisServer(port, process, log)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    server.client().ping()
                    break
                except redis.ConnectionError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        text = log.read_text() if log.exists() else "(no log)"
                        pytest.fail(f"redis-server on port {port} did not start:\n{text[-2000:]}")
                    time.sleep(0.02)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
