"""Machine instructions per HTTP ``POST /v1/check`` in ``ratewarden serve``,
counted by callgrind: the server's whole path (HTTP parsing, the app, the rules,
the memory store, the answer) without the noise of a shared machine.

    .venv/bin/python bench/bench_service_instructions.py [--checks N] [--rounds R]
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python bench/bench_service_instructions.py

Each line names the package the server ran (a PYTHONPATH that does not hold one
falls back to this checkout's).

The server runs under ``valgrind --tool=callgrind`` on examples/rules.yaml and the
memory store, twice: once answering nothing and once answering N checks (the
requests of bench_service.py: 10,000 users, one keep-alive connection, one request
at a time, from this process outside valgrind); the difference divided by N is one
check. What runs by the second (the sweep, the dashboard's sampling) adds a little
per second of the run, so figures within a percent or so are the same.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_service import RULES, free_port, http_requests

RATEWARDEN = Path(sys.executable).parent / "ratewarden"


def read_answer(sock: socket.socket, buffer: bytearray) -> int:
    """One answer with a Content-Length; its status."""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            at = buffer.find(b"content-length:", 0, end)
            total = end + 4 + int(buffer[at + 15 : buffer.find(b"\r\n", at)])
            if len(buffer) >= total:
                status = int(buffer[9:12])
                del buffer[:total]
                return status
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buffer += chunk


def count(checks: int) -> int:
    """Instructions the server ran, started, answering ``checks`` and stopped."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rw-callgrind-") as directory:
        out, err = Path(directory) / "callgrind.out", Path(directory) / "stderr"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                   str(RATEWARDEN), "serve", "--config", str(RULES), "--http",
                   f"127.0.0.1:{port}", "--grpc", "off", "--log-level", "warning",
                   "--config-reload-interval", "0"]  # fmt: skip
        with err.open("w") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        assert process.stdout is not None
        line = process.stdout.readline()
        if "HTTP on" not in line:
            process.kill()
            raise SystemExit(f"ratewarden serve did not start: {line!r}")
        requests = http_requests(port)
        if checks:
            with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
                buffer = bytearray()
                for i in range(checks):
                    sock.sendall(requests[i % len(requests)])
                    status = read_answer(sock, buffer)
                    if status != 200:
                        raise SystemExit(f"check {i} answered {status}")
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=300)
        report = err.read_text()
    match = re.search(r"Collected : (\d+)", report)
    if match is None:
        raise SystemExit(f"callgrind printed no count:\n{report[-2000:]}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    # the package the server imports: a PYTHONPATH that is gone falls back to this checkout
    where = subprocess.run(
        [sys.executable, "-c", "import ratewarden; print(ratewarden.__path__[0])"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout.strip()  # fmt: skip
    for _ in range(args.rounds):
        started = time.monotonic()
        base = count(0)
        loaded = count(args.checks)
        print(f"{(loaded - base) / args.checks:,.0f} instructions per check ({where}; "
              f"{args.checks} checks, {time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
