"""Which ASGI server and app shape for the service's HTTP API: the raw app vs a
Starlette route, under uvicorn (httptools, uvloop) and granian, each pinned to
CPU 0 with the load generator of bench_service.py on CPU 1.

    .venv/bin/python bench/bench_asgi_servers.py [--seconds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_service import free_port, http_client, throughput

BIN = Path(sys.executable).parent
VARIANTS = {
    "uvicorn + raw app": ["uvicorn", "--http", "httptools", "--loop", "uvloop",
                          "--no-access-log", "--lifespan", "off", "_asgi_apps:raw"],
    "uvicorn + starlette": ["uvicorn", "--http", "httptools", "--loop", "uvloop",
                            "--no-access-log", "--lifespan", "off", "_asgi_apps:starlette"],
    "granian + raw app": ["granian", "--interface", "asgi", "--loop", "uvloop", "--workers", "1",
                          "--runtime-threads", "1", "--no-ws", "_asgi_apps:raw"],
    "granian + starlette": ["granian", "--interface", "asgi", "--loop", "uvloop", "--workers",
                            "1", "--runtime-threads", "1", "--no-ws", "_asgi_apps:starlette"],
}  # fmt: skip


async def measure(port: int, pid: int, seconds: float) -> tuple[float, float]:
    fire, close = await http_client(port, 32)
    try:
        rate, usage, _ = await throughput(fire, 32, seconds, pid)
    finally:
        close()
    return rate, usage.server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    for name, command in VARIANTS.items():
        port = free_port()
        process = subprocess.Popen(
            [str(BIN / command[0]), *command[1:], "--host", "127.0.0.1", "--port", str(port)],
            cwd=Path(__file__).parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: os.sched_setaffinity(0, {0}),  # noqa: PLW1509
        )  # fmt: skip
        try:
            time.sleep(2.5)
            # granian serves from a child process: measure the busiest of the tree
            pids = [process.pid, *_children(process.pid)]
            rate, cores = asyncio.run(measure(port, pids[-1], args.seconds))
            print(f"{name:<22} {rate:>8,.0f} checks/s, server {cores:.2f} cores = "
                  f"{rate / max(cores, 1e-9):>8,.0f} per server core", flush=True)  # fmt: skip
        finally:
            process.terminate()
            process.wait(20)


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        out += [int(c) for c in children]
    return out


if __name__ == "__main__":
    main()
