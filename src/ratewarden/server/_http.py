"""The HTTP listener: uvicorn's httptools protocol within `ConnectionLimits`.

uvicorn bounds none of what a hostile client can hold: connections (twenty
thousand idle ones used up the process's file descriptors, and both listeners
then refused everyone), time (a head or a body sent a byte a second, or a body
shorter than its Content-Length, was waited on for ever) and the size of a
request's head (httptools joins an unfinished header in memory: a 20 MiB one
held 257 MiB). `http_protocol` makes a protocol class for one listener that
does, with these cases:

- **Connections**: at ``max_connections``, or ``max_connections_per_peer``
  from one address, a new connection takes the place of the one idle longest
  (the address's own, at its limit), which is closed; with none idle it is
  answered 503 and closed before a byte of it is read.
- **Bodies still arriving**: their bytes are charged to the process's
  `BodyBudget`; when it is full, the body that has held bytes longest is
  answered 503 and its connection closed to make room.
- **Time**: each connection has one deadline, moved at a request's edges: when
  nothing is in flight, ``idle_timeout``; from a request's first byte,
  ``header_timeout``; from its last header, ``body_timeout``; while the app
  answers, none. A request still arriving when its time is up is answered 408;
  an idle connection is closed. One sweep a listener, every quarter of the
  shortest timeout (a second at most), looks at the deadlines: no timer per
  request, so the hot path pays a clock read and two stores per edge.
- **Head size**: the bytes of a request's head are counted before the parser
  sees them; more than ``max_header_bytes`` is a 431, held to one read past
  the limit. A body (chunked, trailers and all) longer than the app's body
  limit plus that is a 413, since the parser would keep trailers in memory.
- **A client that reads no answers**: once the transport stops taking writes,
  the connection has ``idle_timeout`` before it is dropped, since its answer
  (and so its request) would otherwise wait for ever.
- **Pipelining**: uvicorn queues every request that arrives while one is being
  answered (and goes on reading), so a client that sends requests without
  waiting could make it hold tens of thousands; more than `MAX_PIPELINED`
  waiting closes the connection.
- **An answer sent before the body was in** (401, 404, 413): the connection
  closes after it rather than read the rest of a body nobody will use.

A connection that ends with an answer of ours is shut for writing and what the
client still sends is read and dropped for up to `LINGER` seconds, so that the
kernel does not answer unread bytes with a reset that could reach the client
before the answer and hide it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, ClassVar, cast

import httptools
import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from ._connection_limits import (
    Admission,
    BodyBudget,
    ConnectionLimits,
    ServerLimits,
    peer_of,
    process_budget,
)
from ._shapes import Problem

__all__ = ["LINGER", "MAX_PIPELINED", "HttpListener", "LimitedHttpToolsProtocol", "http_protocol"]

log = logging.getLogger("ratewarden.server")

LINGER = 2.0  # seconds a closing connection's late bytes are read and dropped
MAX_PIPELINED = 32  # requests a connection may have waiting behind the one answered
WARN_EVERY = 60.0  # seconds between two warnings that connections are refused

# where a connection is: what its deadline means
_IDLE, _HEAD, _BODY, _BUSY = 0, 1, 2, 3
_NEVER = math.inf
_PHRASES = {408: b"Request Timeout", 413: b"Content Too Large",
            431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}  # fmt: skip


def _answer(status: int, message: str, *extra: bytes) -> bytes:
    body = msgspec.json.encode(Problem(message))
    head = [b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES[status]),
            b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
            *extra, b"connection: close\r\n\r\n"]  # fmt: skip
    return b"".join(head) + body


class _Refused(Exception):
    """Raised in a parser callback: the request ends with this answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpListener:
    """What one listener's connections share: the limits, counts of what was
    refused, and the sweep that closes connections past their deadline."""

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
        self.shed = 0  # bodies answered 503 to make room in the budget
        self.interval = min(1.0, limits.idle_timeout / 4, limits.header_timeout / 4,
                            limits.body_timeout / 4)  # fmt: skip
        self.refused = 0  # connections beyond max_connections
        self.timed_out = 0  # requests answered 408
        self.too_large = 0  # requests answered 431 or 413
        self.pipelined = 0  # connections closed for more than MAX_PIPELINED waiting
        self.idle_closed = 0
        self.evicted = 0  # idle connections closed to admit a new one
        self._refusal = _answer(503, "too many connections", b"retry-after: 1\r\n")
        self._warned = -_NEVER
        self._sweeping: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return (f"<HttpListener max {self.limits.max_connections}, refused {self.refused}, "
                f"timed out {self.timed_out}, too large {self.too_large}, "
                f"idle closed {self.idle_closed}>")  # fmt: skip

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

    def watch(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        if self._sweeping is None:
            self._sweeping = loop.call_later(self.interval, self._sweep, loop, connections)

    def _sweep(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        now = loop.time()
        for connection in [c for c in connections if min(c.deadline, c.write_deadline) <= now]:
            connection.expire()
        self._sweeping = None
        if connections:
            self._sweeping = loop.call_later(self.interval, self._sweep, loop, connections)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol with the bounds of the module docstring; made for a
    listener by `http_protocol`."""

    listener: ClassVar[HttpListener]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = self.listener.limits
        self.idle_timeout = limits.idle_timeout
        self.header_timeout = limits.header_timeout
        self.body_timeout = limits.body_timeout
        self.max_head = limits.max_header_bytes
        self.max_body = self.listener.max_body + limits.max_header_bytes
        self.deadline = _NEVER
        self.write_deadline = _NEVER  # set while the client takes none of our writes
        self.phase = _IDLE
        self.head_bytes = 0  # received towards the head of the request being read
        self.body_bytes = 0
        self.closing = False  # answered and shut for writing: late bytes are dropped
        # the request whose answer is being made (self.cycle is the last one read)
        self.answering: RequestResponseCycle | None = None

    # -- the connection ---------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.listener.admission.admit(self, peer_of(transport)):
            self.transport = transport  # for connection_lost, which follows
            self.listener.refuse(transport, self.loop)
            return
        super().connection_made(transport)
        self.deadline = self.loop.time() + self.idle_timeout
        self.listener.watch(self.loop, cast(set[Any], self.connections))

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.admission.left(self)
        self._abandon()
        super().connection_lost(exc)

    def evict(self) -> None:
        """Closed, idle, to admit a new connection (HTTP/1.1 lets a server close
        an idle keep-alive connection; clients open another)."""
        self.listener.evicted += 1
        self.closing = True
        self.transport.close()
        self.deadline = self.loop.time() + LINGER  # a close that cannot flush is aborted

    def _shed(self, _: object) -> None:
        self.listener.shed += 1
        self._end(503, "the server holds as many unfinished request bodies as it may")

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.phase == _BODY:
            self.body_bytes += len(data)
            if not self.listener.budget.take(self, len(data), self._shed):
                return
        else:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._end(refused.status, refused.message)
            else:
                self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserError:
            # not uvicorn's warning: a client could fill the log with one a request
            log.debug("HTTP: an invalid request from %s", self.client)
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            pass  # no websockets or h2c here: the request was answered as HTTP/1.1
        if self.phase == _BODY:
            if self.body_bytes > self.max_body:
                self.listener.too_large += 1
                self._end(413, f"the body is larger than {self.listener.max_body} bytes")
        elif self.head_bytes > self.max_head and self.phase == _HEAD:
            self.listener.too_large += 1
            self._end(431, f"the request's head is larger than {self.max_head} bytes")

    def pause_writing(self) -> None:
        super().pause_writing()
        self.write_deadline = self.loop.time() + self.idle_timeout

    def resume_writing(self) -> None:
        super().resume_writing()
        self.write_deadline = _NEVER

    # -- httptools callbacks ------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.listener.admission.busy(self)
        self.phase = _HEAD
        self.deadline = self.loop.time() + self.header_timeout

    def on_headers_complete(self) -> None:
        # the count includes whatever followed the head in the same read, so
        # only a count over the limit asks what the head itself came to
        if self.head_bytes > self.max_head:
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > self.max_head:
                self.listener.too_large += 1
                raise _Refused(431, f"the request's head is larger than {self.max_head} bytes")
        if len(self.pipeline) >= MAX_PIPELINED:
            self.listener.pipelined += 1
            raise _Refused(503, f"more than {MAX_PIPELINED} requests wait for an answer")
        self.head_bytes = self.body_bytes = 0
        self.phase = _BODY
        super().on_headers_complete()
        if self.pipeline and self.pipeline[0][0] is self.cycle:
            self.deadline = _NEVER  # queued behind an answer: its body may wait too
        else:
            self.answering = self.cycle
            self.deadline = self.loop.time() + self.body_timeout

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.listener.budget.drop(self)  # the body is the app's now
        # (an answer given before the body was in ended the connection already)
        self.phase = _BUSY
        self.deadline = _NEVER

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive timer replaced by the deadline
        self.server_state.total_requests += 1
        if self.transport.is_closing():  # the answer said "connection: close"
            self.closing = True  # and if it cannot be flushed, the sweep drops it
            self.deadline = self.loop.time() + LINGER
            return
        if self.phase == _BODY and self.cycle is self.answering:
            # answered before its body was in: the rest of it is of no use
            self._linger()
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self.answering = cycle
            task = self.loop.create_task(cycle.run_asgi(app))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
            if self.phase == _BODY and cycle is self.cycle:  # its body may come now
                self.deadline = self.loop.time() + self.body_timeout
        elif self.phase == _BUSY:
            self.phase = _IDLE
            self.deadline = self.loop.time() + self.idle_timeout
            self.listener.admission.idle(self)

    # -- the end of a connection ----------------------------------------------------

    def expire(self) -> None:
        """The deadline has passed: answer 408 if a request is arriving and no
        other answer is due first, else close (drop, if the client reads nothing)."""
        transport = self.transport
        if self.closing or transport.is_closing() or self.write_deadline <= self.loop.time():
            transport.abort()  # what it was sent it has not read: it would not read more
            self._abandon()
            return
        answering = self.answering
        free = not self.pipeline and (answering is None or answering.response_complete)
        if self.phase == _HEAD and free:
            what = "headers"
        elif self.phase == _BODY and answering is self.cycle and not self.cycle.response_started:
            what = "body"  # the app waits for it, and has not answered
        else:
            what = ""
        self._abandon()
        if what:
            self.listener.timed_out += 1
            self._end(408, f"the request's {what} did not arrive in time")
        elif transport.get_write_buffer_size():
            transport.abort()
        else:
            self.listener.idle_closed += 1
            transport.close()
            self.closing = True  # a close that cannot flush is aborted by the next sweep
            self.deadline = self.loop.time() + LINGER

    def _end(self, status: int, message: str) -> None:
        """Answer ``status`` and close, unless another answer is due first."""
        answering = self.answering
        due = bool(self.pipeline) or (
            answering is not None and answering.response_started and not answering.response_complete
        )
        self._abandon()
        if due:  # ours cannot come before the answers due: just close
            self.transport.close()
            return
        self.transport.write(_answer(status, message))
        self._linger()

    def _abandon(self) -> None:
        """The app's answers to this connection's requests go nowhere from now
        on (and one waiting for its body is told the client went away): a write
        to a closed transport raises under uvloop."""
        self.listener.budget.drop(self)
        cycles = [c for c, _ in self.pipeline]
        self.pipeline.clear()
        for cycle in (self.answering, self.cycle, *cycles):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def _linger(self) -> None:
        transport = self.transport
        self.closing = True
        self.deadline = self.loop.time() + LINGER
        if transport.can_write_eof():
            transport.write_eof()
            transport.resume_reading()
        else:
            transport.close()


def http_protocol(
    limits: ConnectionLimits,
    max_body: int,
    server_limits: ServerLimits | None = None,
    budget: BodyBudget | None = None,
) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for one uvicorn server (``uvicorn.Config(http=...)``),
    its connections sharing one `HttpListener` (the class's ``listener``).
    ``max_body``: the app's body limit, to bound what the parser holds;
    ``budget``: the bytes of bodies still arriving, shared by the process's
    listeners unless given."""

    class Protocol(LimitedHttpToolsProtocol):
        listener = HttpListener(limits, max_body, server_limits, budget)

    return Protocol
