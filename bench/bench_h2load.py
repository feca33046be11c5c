"""Checks per second of ``ratewarden serve`` under h2load (nghttp2's load tool),
the server pinned to CPU 0 and h2load to CPU 1: HTTP ``POST /v1/check`` over
HTTP/1.1 and gRPC ``ShouldRateLimit`` over HTTP/2, on the memory store.

    .venv/bin/python bench/bench_h2load.py [--requests N] [--rounds R]
        [--other /path/to/other/checkout/src]

With ``--other``, the server of that tree (run with ``PYTHONPATH=`` it) and this
checkout's take turns, round by round, so both meet the same machine. Each line
gives the checks/s h2load saw and the checks per second of the server's own CPU
time (checks/s over the CPU fraction it used: the figure that compares on a shared
machine). The rules (below) give every check three tiers of large limits, so
that every answer is an allowed one and walks the whole path, the store included.
h2load sends the same body each time: one key per tier.

h2load comes from Debian's nghttp2-client (``./dev bench`` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

RULES = """
rules:
  - name: per-ip
    rate: 1000000000/second
    algorithm: sliding_window_counter
    by: ip
  - name: per-user
    rate: 1000000000/minute
    algorithm: fixed_window
    by: user
  - name: per-org
    rate: 1000000000/hour
    algorithm: token_bucket
    by: org
"""
ATTRIBUTES = {"ip": "10.0.0.7", "user": "user-7", "org": "org-7", "path": "/api/v1/orders/7"}
RATEWARDEN = Path(sys.executable).parent / "ratewarden"
GRPC_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def grpc_body() -> bytes:
    from ratewarden.server._protos import messages  # noqa: PLC0415 - this checkout's

    request = messages()["RateLimitRequest"](domain="ratewarden")
    descriptor = request.descriptors.add()
    for key, value in (("remote_address", ATTRIBUTES["ip"]), *list(ATTRIBUTES.items())[1:]):
        descriptor.entries.add(key=key, value=value)
    message: bytes = request.SerializeToString()
    return struct.pack(">BI", 0, len(message)) + message


def serve(folder: Path, pythonpath: str | None) -> tuple[subprocess.Popen[bytes], int, int]:
    http, grpc = free_port(), free_port()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    command = ["taskset", "-c", "0", str(RATEWARDEN), "serve",
               "--config", str(folder / "rules.yaml"),
               "--http", f"127.0.0.1:{http}", "--grpc", f"127.0.0.1:{grpc}"]  # fmt: skip
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", http), timeout=0.2).close()
            socket.create_connection(("127.0.0.1", grpc), timeout=0.2).close()
            return server, http, grpc
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit(f"the server did not start: {server.communicate()[0].decode()[-2000:]}")


def h2load(args: list[str]) -> float:
    out = subprocess.run(["taskset", "-c", "1", "h2load", *args], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    if done is None or done.group(1) != done.group(2):
        raise SystemExit(f"h2load: not every request succeeded:\n{out}")
    status = re.search(r"status codes: (\d+) 2xx", out)
    if status is None or status.group(1) != done.group(1):
        raise SystemExit(f"h2load: answers other than 2xx:\n{out}")
    return float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out).group(1))  # type: ignore[union-attr]


def one(folder: Path, pythonpath: str | None, requests: int) -> dict[str, tuple[float, float]]:
    server, http, grpc = serve(folder, pythonpath)
    try:
        cases = {
            "http": ["--h1", "-c", "16", "-m", "1", "-d", str(folder / "check.json"),
                     "-H", "content-type: application/json",
                     f"http://127.0.0.1:{http}/v1/check"],
            "grpc": ["-c", "4", "-m", "32", "-d", str(folder / "check.grpc"),
                     "-H", "content-type: application/grpc", "-H", "te: trailers",
                     f"http://127.0.0.1:{grpc}{GRPC_PATH}"],
        }  # fmt: skip
        out = {}
        for name, args in cases.items():
            h2load(["-n", str(requests // 10), *args])  # warm up
            cpu, wall = cpu_seconds(server.pid), time.monotonic()
            rate = h2load(["-n", str(requests), *args])
            cpu, wall = cpu_seconds(server.pid) - cpu, time.monotonic() - wall
            out[name] = (rate, requests / cpu if cpu else float("inf"))
        return out
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--other", help="another checkout's src, run in turn with this one")
    options = parser.parse_args()
    if shutil.which("h2load") is None:
        raise SystemExit("h2load is not installed: ./dev bench installs it (nghttp2-client)")
    trees = [("this", None)] + ([("other", options.other)] if options.other else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "rules.yaml").write_text(RULES)
        (folder / "check.json").write_text(json.dumps({"attributes": ATTRIBUTES}))
        (folder / "check.grpc").write_bytes(grpc_body())
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, {options.requests} requests a case")
        for round_ in range(1, options.rounds + 1):
            for label, pythonpath in trees if round_ % 2 else trees[::-1]:
                figures = one(folder, pythonpath, options.requests)
                said = ", ".join(f"{name} {rate:,.0f}/s ({per_core:,.0f} per server CPU s)"
                                 for name, (rate, per_core) in figures.items())  # fmt: skip
                print(f"round {round_} {label:5}: {said}", flush=True)


if __name__ == "__main__":
    main()
