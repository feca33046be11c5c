"""Every HTTP/2 attack class of tests/server/h2/h2_attacks.py against a real
`ratewarden serve` (memory store, gRPC listener only, a bearer token), each
for ``--seconds`` (15 by default), with a legitimate check on a new connection
every 20 ms meanwhile. Prints one Markdown row per attack: the server's RSS
(idle -> peak -> 6 s after), its CPU, the legitimate checks' latency, what the
attacker was told, and pass (p99 <= 50 ms, no check failed, peak within
100 MiB of idle) or FAIL.

    .venv/bin/python bench/bench_h2_attacks.py [--seconds 15] [--only a,b]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.server.h2 import h2_attacks

TOKEN = b"attack-bench-token"
RULES = "version: 1\nrules:\n  - name: all\n    rate: 1000000/second\n    by: user\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--only", default="", help="comma-separated attack names")
    parser.add_argument("--max-connections", type=int, default=10_000,
                        help="serve's cap (its default; idle-connections opens 3,000)")  # fmt: skip
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    chosen = {k: v for k, v in h2_attacks.attacks(TOKEN).items() if not names or k in names}
    exe = Path(sys.executable).parent / "ratewarden"
    port = free_port()
    request = h2_attacks.rls_request(b"ratewarden", b"user", b"legit")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "token").write_bytes(TOKEN)
        (Path(tmp) / "rules.yaml").write_text(RULES)
        command = [str(exe), "serve", "--http", "off", "--grpc", f"127.0.0.1:{port}",
                   "--config", f"{tmp}/rules.yaml", "--token-file", f"{tmp}/token",
                   "--max-connections", str(args.max_connections)]  # fmt: skip
        log = Path(tmp) / "serve.log"
        with log.open("w") as err:
            server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            if not re.search("gRPC on", line):
                print(f"the server did not start: {line!r}\n{log.read_text()}", file=sys.stderr)
                return 1
            print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
                  f"{args.seconds:g} s an attack\n")  # fmt: skip
            print("| attack | ran | server RSS (idle -> peak -> after) | server CPU | "
                  "legitimate checks on new connections | attacker | result |")  # fmt: skip
            print("|---|---|---|---|---|---|---|")
            failed = 0
            for name, attack in chosen.items():
                result = h2_attacks.measure(name, attack, server.pid, port, TOKEN,
                                            seconds=args.seconds, request=request)  # fmt: skip
                print(result.row(), flush=True)
                failed += not result.passed
                if server.poll() is not None:
                    print(f"the server died:\n{log.read_text()[-3000:]}", file=sys.stderr)
                    return 1
            return 1 if failed else 0
        finally:
            server.terminate()
            server.wait(20)


if __name__ == "__main__":
    sys.exit(main())
