"""A third-party API with a hard limit, counting requests per second by its own clock.

    python examples/fleet/provider.py --limit 200 [--port 0]

It answers every request but ``GET /stats`` with 200 while the current second (of
this process's clock, aligned to the epoch) has seen fewer than ``--limit``
requests, and with 429 after that. ``GET /stats`` answers JSON: the limit, this
process's CPU seconds, and per second ``[answered 200, answered 429]``. It prints
``listening on HOST:PORT`` once it accepts connections, and stops on SIGTERM or
SIGINT.

Plain asyncio, HTTP/1.1 with keep-alive and pipelining, enough for ~10,000 small
requests a second on one core. Defences, since it faces clients: a request head
is at most 8 KiB and a body at most 64 KiB, anything else malformed closes the
connection, and a client that does not read its responses is disconnected once
1 MiB of them is queued.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections import defaultdict

MAX_HEAD = 8 * 1024
MAX_BODY = 64 * 1024
MAX_QUEUED = 1024 * 1024


class Counts:
    """Requests per aligned second of the provider's clock: [answered 200, answered 429]."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seconds: defaultdict[int, list[int]] = defaultdict(lambda: [0, 0])

    def admit(self) -> bool:
        counts = self.seconds[time.time_ns() // 1_000_000_000]
        if counts[0] < self.limit:
            counts[0] += 1
            return True
        counts[1] += 1
        return False

    def as_json(self) -> bytes:
        return json.dumps(
            {
                "limit": self.limit,
                "cpu": time.process_time(),
                "seconds": {str(s): c for s, c in sorted(self.seconds.items())},
            }
        ).encode()


def _response(status: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        b"Content-Type: " + (b"application/json" if body[:1] == b"{" else b"text/plain")
        + b"\r\n" + extra + b"\r\n" + body
    )  # fmt: skip


OK = _response(b"200 OK", b"ok")
REFUSED = _response(b"429 Too Many Requests", b"slow down", b"Retry-After: 1\r\n")
BAD = _response(b"400 Bad Request", b"bad request", b"Connection: close\r\n")


class Provider(asyncio.Protocol):
    """One client connection: parses pipelined requests as their bytes arrive."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        buffer = self.buffer + data
        out: list[bytes] = []
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    return self._fail(out)
                break
            if end > MAX_HEAD:
                return self._fail(out)
            head = buffer[:end].split(b"\r\n")
            parts = head[0].split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                return self._fail(out)
            length, close = 0, parts[2] == b"HTTP/1.0"
            for line in head[1:]:
                name, colon, value = line.partition(b":")
                if not colon:
                    return self._fail(out)
                name = name.strip().lower()
                if name == b"content-length":
                    try:
                        length = int(value)
                    except ValueError:
                        return self._fail(out)
                    if not 0 <= length <= MAX_BODY:
                        return self._fail(out)
                elif name == b"transfer-encoding":
                    return self._fail(out)  # chunked bodies: not needed, so refused
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
            if len(buffer) < end + 4 + length:
                break  # the body is still coming
            buffer = buffer[end + 4 + length :]
            if parts[0] == b"GET" and parts[1] == b"/stats":
                out.append(_response(b"200 OK", self.counts.as_json()))
            else:
                out.append(OK if self.counts.admit() else REFUSED)
            if close:
                transport.write(b"".join(out))
                transport.close()
                return None
        self.buffer = buffer
        if out:
            transport.write(b"".join(out))
            if transport.get_write_buffer_size() > MAX_QUEUED:
                transport.abort()  # a client that sends but never reads
        return None

    def _fail(self, out: list[bytes]) -> None:
        assert self.transport is not None
        out.append(BAD)
        self.transport.write(b"".join(out))
        self.transport.close()


async def serve(host: str, port: int, limit: int) -> None:
    loop = asyncio.get_running_loop()
    counts = Counts(limit)
    server = await loop.create_server(lambda: Provider(counts), host, port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--limit", type=int, required=True, help="requests a second")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.limit))


if __name__ == "__main__":
    main()
