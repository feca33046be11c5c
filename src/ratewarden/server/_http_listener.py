"""What one HTTP listener's connections share: the limits, the counts of what
was refused, and the one sweep that closes connections past their deadline
(no timer per request: each connection keeps a deadline the sweep reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Protocol

from ._connection_limits import (
    Admission,
    BodyBudget,
    ConnectionLimits,
    ServerLimits,
    process_budget,
)
from ._http_cycle import answer

__all__ = ["HttpListener", "Listened"]

log = logging.getLogger("ratewarden.server")

WARN_EVERY = 60.0  # seconds between two warnings that connections are refused
_NEVER = math.inf


class Listened(Protocol):
    """What the listener needs of one of its connections (`HttpConnection`)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    task: asyncio.Task[None] | None
    deadline: float
    write_deadline: float

    def expire(self) -> None: ...
    def shutdown(self) -> None: ...


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
        self.admission = Admission(
            limits.max_connections, shared.max_connections_per_peer, limits.partial_grace
        )
        self.connections: set[Listened] = set()
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

    def joined(self, connection: Listened) -> None:
        self.connections.add(connection)
        if self._sweeping is None:
            self._sweeping = connection.loop.call_later(self.interval, self._sweep, connection.loop)

    def left(self, connection: Listened) -> None:
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
                async with asyncio.timeout(timeout):  # not wait_for: see ratewarden._waiting
                    await self._empty.wait()
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
