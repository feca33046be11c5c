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
    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def start(self) -> None:
        """Start (or start again, on the same port) and wait until it answers."""
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    text = self.log.read_text() if self.log.exists() else "(no log)"
                    self.stop()
                    pytest.fail(f"redis-server on port {self.port} did not start:\n{text[-2000:]}")
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no chance to say goodbye, as when a machine dies."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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
        args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", workdir, "--logfile", str(log), *extra]  # fmt: skip
        server = RedisServer(port, args, log)
        try:
            server.start()
            yield server
        finally:
            server.stop()  # whichever process is current, restarted ones included
