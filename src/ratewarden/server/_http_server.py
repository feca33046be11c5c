"""The HTTP listener: what its connections share, and its start and drain.

`HttpListener` holds the limits, the counts of what was refused and the one
sweep that closes connections past their deadline; `HttpServer` serves an ASGI
app on a listening socket with `HttpConnection`s and drains it: the socket
closes, idle keep-alive connections close at once, the others after the answers
to what they have read, and whatever still runs when the drain's time is up is
cancelled and its connection dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket

from ._connection_limits import (
    Admission,
    BodyBudget,
    ConnectionLimits,
    ServerLimits,
    process_budget,
)
from ._http import HttpConnection, answer
from ._http_cycle import App

__all__ = ["HttpListener", "HttpServer"]

log = logging.getLogger("ratewarden.server")

WARN_EVERY = 60.0  # seconds between two warnings that connections are refused
_NEVER = math.inf


class HttpListener:
    """What one listener's connections share: the limits, counts of what was
    refused, and the sweep that closes connections past their deadline.
    ``max_body``: the app's body limit, to bound what the parser holds;
    ``budget``: the bytes of bodies still arriving, shared by the process's
    listeners unless given."""

    def __init__(
        self,
        limits: ConnectionLimits,
        max_body: int,
        server_limits: ServerLimits | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        self.limits = limits
        self.max_body = max_body
        shared = server_limits or ServerLimits()
        self.budget = budget or process_budget(shared.max_buffered_bytes)
        self.admission = Admission(limits.max_connections, shared.max_connections_per_peer)
        self.connections: set[HttpConnection] = set()
        self.draining = False
        self.requests = 0  # answered
        self.shed = 0  # bodies answered 503 to make room in the budget
        self.interval = min(1.0, limits.idle_timeout / 4, limits.header_timeout / 4,
                            limits.body_timeout / 4)  # fmt: skip
        self.refused = 0  # connections beyond max_connections
        self.timed_out = 0  # requests answered 408
        self.too_large = 0  # requests answered 431 or 413
        self.pipelined = 0  # connections closed for more than MAX_PIPELINED waiting
        self.idle_closed = 0
        self.evicted = 0  # idle connections closed to admit a new one
        self._refusal = answer(503, "too many connections", b"retry-after: 1\r\n")
        self._warned = -_NEVER
        self._sweeping: asyncio.TimerHandle | None = None
        self._empty: asyncio.Event | None = None  # set when the last connection has gone

    def __repr__(self) -> str:
        return (f"<HttpListener {len(self.connections)} of {self.limits.max_connections}, "
                f"refused {self.refused}, timed out {self.timed_out}, "
                f"too large {self.too_large}, idle closed {self.idle_closed}>")  # fmt: skip

    def refuse(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.refused += 1
        transport.write(self._refusal)
        transport.close()
        now = loop.time()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.warning("HTTP: %d connections open, none idle, as many as the limits allow "
                        "(--max-connections, or per peer); refusing more (%d so far)",
                        self.admission.count, self.refused)  # fmt: skip

    def joined(self, connection: HttpConnection) -> None:
        self.connections.add(connection)
        if self._sweeping is None:
            self._sweeping = connection.loop.call_later(self.interval, self._sweep, connection.loop)

    def left(self, connection: HttpConnection) -> None:
        self.connections.discard(connection)
        if not self.connections and self._empty is not None:
            self._empty.set()

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for connection in [c for c in self.connections
                           if min(c.deadline, c.write_deadline) <= now]:  # fmt: skip
            connection.expire()
        self._sweeping = None
        if self.connections:
            self._sweeping = loop.call_later(self.interval, self._sweep, loop)

    async def drain(self, timeout: float) -> int:
        """Close idle connections now and the others after their answers, for
        up to ``timeout`` seconds; then drop what is left. How many were dropped."""
        self.draining = True
        for connection in list(self.connections):
            connection.shutdown()
        if self.connections:
            self._empty = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), timeout)
        left = list(self.connections)
        for connection in left:
            if connection.task is not None:
                connection.task.cancel()
            connection.transport.abort()
        if left:
            log.warning("HTTP: %d connections still busy after the drain's %gs, dropped",
                        len(left), timeout)  # fmt: skip
            await asyncio.sleep(0)  # their connection_lost, and the cancelled tasks' ends
        return len(left)


class HttpServer:
    """``app`` served over HTTP/1.1 on a listening socket, within ``limits``."""

    def __init__(
        self,
        app: App,
        sock: socket.socket,
        limits: ConnectionLimits,
        max_body: int,
        server_limits: ServerLimits | None = None,
    ) -> None:
        self.app = app
        self.sock = sock
        self.address = sock.getsockname()  # the socket is closed with the server
        self.listener = HttpListener(limits, max_body, server_limits)
        self._server: asyncio.AbstractServer | None = None

    def __repr__(self) -> str:
        return f"<HttpServer {self.address!r} {self.listener!r}>"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listener, app = self.listener, self.app

        def connection() -> HttpConnection:
            return HttpConnection(listener, app)

        self._server = await loop.create_server(connection, sock=self.sock, backlog=2048)

    async def drain(self, timeout: float) -> None:
        """Stop accepting, then let the connections finish (`HttpListener.drain`)."""
        if self._server is not None:
            self._server.close()
        await self.listener.drain(timeout)

    def close(self) -> None:
        """Drop every connection at once (after a drain, there are none)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.listener.connections):
            if connection.task is not None:
                connection.task.cancel()
            connection.transport.abort()

    @property
    def port(self) -> int:
        return int(self.address[1])
