"""A TCP proxy on loopback that puts network faults between a client and a server.

netem needs privileges the tests do not have, so the faults are made here, in a
process of their own (its sockets and memory stay out of the counts the tests take
of their own process). Modes, switched at any moment:

- ``pass``: bytes go through as they come;
- ``latency``: each chunk goes on ``delay`` seconds after it arrived, in order,
  both ways (a round trip costs twice the delay);
- ``blackhole``: connections are accepted and read, nothing is forwarded and
  nothing answered; a connection that lost bytes this way stays dark after the
  mode changes back, since its byte stream can never be whole again (a client
  that keeps using it hangs, which is what the tests must see);
- ``reset``: every open connection, and each new one on arrival, is reset (RST:
  ``SO_LINGER`` 0, then close).

`Proxy` starts it and drives it over the child's stdin and stdout, one line each
way per command; ``stats`` reports the connections open now and accepted so far.

    python tests/faults/proxy.py UPSTREAM_PORT   # prints the port it listens on
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MODES = ("pass", "latency", "blackhole", "reset")
_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends RST, not FIN


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    writer.transport.abort()


class _Link:
    """One client connection and its upstream: two pumps, each with a queue so
    that delayed chunks keep their order."""

    def __init__(self, server: _Server, client: asyncio.StreamWriter) -> None:
        self.server, self.client = server, client
        self.upstream: asyncio.StreamWriter | None = None
        self.dark = False  # bytes were dropped: never forward again
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self, reader: asyncio.StreamReader) -> None:
        pumps = [self._pump(reader, lambda: self.upstream)]
        if self.server.mode == "blackhole":
            self.dark = True
        else:
            try:
                up_reader, self.upstream = await asyncio.open_connection(
                    "127.0.0.1", self.server.upstream
                )
            except OSError:  # the server is down: so is this connection
                pumps[0].close()
                _reset(self.client)
                return
            pumps.append(self._pump(up_reader, lambda: self.client))
        self.tasks = [asyncio.ensure_future(pump) for pump in pumps]
        try:
            await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.close()

    async def _pump(self, reader: asyncio.StreamReader, target: Any) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        writer = asyncio.ensure_future(self._write(queue, target))
        try:
            while data := await reader.read(65536):
                mode = self.server.mode
                if mode == "blackhole" or self.dark or target() is None:
                    self.dark = True
                    continue
                delay = self.server.delay if mode == "latency" else 0.0
                queue.put_nowait((time.monotonic() + delay, data))
        except OSError:
            pass
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(OSError):
                await writer

    async def _write(self, queue: asyncio.Queue[tuple[float, bytes] | None], target: Any) -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.dark:  # the mode went dark while this chunk waited
                continue
            out: asyncio.StreamWriter = target()
            out.write(data)
            await out.drain()

    def reset(self) -> None:
        _reset(self.client)
        if self.upstream is not None:
            self.upstream.transport.abort()

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.client.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()


class _Server:
    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.mode = "pass"
        self.delay = 0.0
        self.links: set[_Link] = set()
        self.accepted = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "reset":
            _reset(writer)
            return
        link = _Link(self, writer)
        self.links.add(link)
        try:
            await link.run(reader)
        except asyncio.CancelledError:  # the proxy is stopping
            link.close()
        finally:
            self.links.discard(link)

    def command(self, line: str) -> dict[str, Any]:
        words = line.split()
        if words and words[0] in MODES:
            self.mode = words[0]
            self.delay = float(words[1]) if len(words) > 1 else 0.0
            if self.mode == "reset":
                for link in list(self.links):
                    link.reset()
        elif words != ["stats"]:
            return {"error": f"unknown command {line!r}"}
        return {"mode": self.mode, "open": len(self.links), "accepted": self.accepted}


async def _serve(upstream: int) -> None:
    server = _Server(upstream)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    print(port, flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        print(json.dumps(server.command(line.decode())), flush=True)
    listener.close()


@dataclass
class Proxy:
    """The proxy process, from the test's side."""

    process: subprocess.Popen[str]
    port: int
    upstream: int

    def set(self, mode: str, delay: float = 0.0) -> dict[str, Any]:
        """Switch to ``mode`` (see the module docstring); its stats once it has."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        return self._ask(f"{mode} {delay}")

    def stats(self) -> dict[str, Any]:
        return self._ask("stats")

    def _ask(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        if "error" in answer:
            raise ValueError(answer["error"])
        return answer

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@contextlib.contextmanager
def proxy(upstream: int) -> Iterator[Proxy]:
    """A proxy to ``127.0.0.1:upstream`` in a process of its own, stopped after."""
    process = subprocess.Popen(
        [sys.executable, __file__, str(upstream)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the fault proxy did not start: {line!r}")
        yield Proxy(process, int(line), upstream)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
