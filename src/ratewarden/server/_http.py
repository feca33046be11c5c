"""Our HTTP/1.1 server's connection: httptools parses, `Cycle` runs the app.

A server in front of clients must bound what a hostile one can hold:
connections (twenty thousand idle ones would use up the process's file
descriptors, and both listeners then refuse everyone), time (a head or a body
sent a byte a second, or a body shorter than its Content-Length, would be waited
on for ever) and the size of a request's head (httptools joins an unfinished
header in memory: a 20 MiB one would hold 257 MiB). `HttpConnection` does, with
these cases:

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
- **Pipelining**: requests that arrive while one is answered are answered in
  order, one at a time, and reading pauses meanwhile; but one read can hold
  thousands of small requests, so more than `MAX_PIPELINED` waiting closes the
  connection.
- **An answer sent before the body was in** (401, 404, 413): the connection
  closes after it rather than read the rest of a body nobody will use.
- **Malformed requests** are answered 400 and the connection closed: llhttp is
  strict, so Content-Length beside Transfer-Encoding, a Content-Length twice or
  not a number, a bad chunk size and bare LF line ends (the shapes of request
  smuggling) never reach the app. An Upgrade is answered as HTTP/1.1, then the
  connection closes.

A connection that ends with an answer of ours is shut for writing and what the
client still sends is read and dropped for up to `LINGER` seconds, so that the
kernel does not answer unread bytes with a reset that could reach the client
before the answer and hide it.

Keep-alive is HTTP/1.1's default and HTTP/1.0's when asked for; ``connection:
close`` from either side closes after the answer. `_http_cycle` frames answers;
`_http_server` holds what a listener's connections share and drains them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from typing import Any, cast
from urllib.parse import unquote

import httptools

from ._connection_limits import peer_of
from ._http_cycle import App, Cycle, answer
from ._http_listener import HttpListener

__all__ = ["LINGER", "MAX_PIPELINED", "HttpConnection"]

log = logging.getLogger("ratewarden.server")

LINGER = 2.0  # seconds a closing connection's late bytes are read and dropped
MAX_PIPELINED = 32  # requests a connection may have waiting behind the one answered

# where a connection is: what its deadline means
_IDLE, _HEAD, _BODY, _BUSY = 0, 1, 2, 3
_NEVER = math.inf
_ASGI = {"version": "3.0", "spec_version": "2.3"}


class _Refused(Exception):
    """Raised in a parser callback: the request ends with this answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Stop(Exception):
    """Raised in a parser callback: what follows on the connection is not read."""


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


class HttpConnection(asyncio.Protocol):
    """One client connection of an `HttpListener`, within the bounds of the
    module docstring; its requests are answered by ``app``, one at a time."""

    def __init__(self, listener: HttpListener, app: App) -> None:
        self.listener = listener
        self.app = app
        self.loop = asyncio.get_running_loop()
        limits = listener.limits
        self.idle_timeout = limits.idle_timeout
        self.header_timeout = limits.header_timeout
        self.body_timeout = limits.body_timeout
        self.max_head = limits.max_header_bytes
        self.max_body = listener.max_body + limits.max_header_bytes
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made's
        self.parser = httptools.HttpRequestParser(self)
        # a request after one that closes the connection is refused by our callback, not llhttp
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.deadline = _NEVER
        self.write_deadline = _NEVER  # set while the client takes none of our writes
        self.phase = _IDLE
        self.head_bytes = 0  # received towards the head of the request being read
        self.began = 0.0  # when the request being read began (the loop's clock)
        self.body_bytes = 0
        self.closing = False  # answered and shut for writing: late bytes are dropped
        self.last_read = False  # a request that closes the connection was read
        self.stopped = False  # past the last request: what follows is dropped unread
        self.draining = False
        self.read_paused = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        # the request being read: its target and headers until its head is in
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.cycle: Cycle | None = None  # the last request read
        self.answering: Cycle | None = None  # the request whose answer is being made
        self.pipeline: deque[Cycle] = deque()  # read, waiting for the one answered
        self.task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        phase = ("idle", "head", "body", "busy")[self.phase]
        return f"<HttpConnection {self.client} {phase}, {len(self.pipeline)} waiting>"

    # -- the connection ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        listener = self.listener
        if not listener.admission.admit(self, peer_of(transport), self.loop.time()):
            listener.refuse(transport, self.loop)
            return
        self.client = _address(transport.get_extra_info("peername"))
        self.server = _address(transport.get_extra_info("sockname"))
        self.deadline = self.loop.time() + self.idle_timeout
        listener.joined(self)
        if listener.draining:  # accepted just before the listener closed
            self.shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.admission.left(self)
        self._abandon()
        self.write_paused = False
        self._wake_writers()
        self.listener.left(self)
        # the parser and the requests refer back to the connection: without these
        # cycles, reference counting frees a closed connection, not the collector
        self.parser = None  # type: ignore[assignment]
        self.cycle = self.answering = None

    def evict(self) -> None:
        """Closed to admit a new connection: idle (HTTP/1.1 lets a server close
        an idle keep-alive connection; clients open another), or with a request
        that has been arriving for longer than a sound client takes."""
        self.listener.evicted += 1
        self.closing = True
        self.transport.close()
        self.deadline = self.loop.time() + LINGER  # a close that cannot flush is aborted

    def shutdown(self) -> None:
        """The server drains: an idle connection closes now, a busy one after
        the answers to what it has read."""
        self.draining = True
        if self.closing:
            return
        answering = self.answering
        if self.phase == _IDLE and (answering is None or answering.response_complete):
            self.closing = True
            self.transport.close()
            self.deadline = self.loop.time() + LINGER
            return
        last = self.cycle
        if last is not None and not last.response_started:
            last.keep_alive = False

    def _shed(self, _: object) -> None:
        self.listener.shed += 1
        self._end(503, "the server holds as many unfinished request bodies as it may")

    def data_received(self, data: bytes) -> None:
        if self.closing or self.stopped:
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
            if isinstance(refused, _Stop):
                self.stopped = True
            elif isinstance(refused, _Refused):
                self._end(refused.status, refused.message)
            else:
                log.error("HTTP: a request from %s could not be read", self.client,
                          exc_info=refused)  # fmt: skip
                self._end(400, "the request could not be read")
            return
        except httptools.HttpParserUpgrade:
            # no websockets or h2c here: the request is answered as HTTP/1.1, and
            # the connection closes after it, what follows being another protocol
            self._last()
            self.stopped = True
        except httptools.HttpParserError as exc:
            # debug: a client could fill the log with a line a request
            log.debug("HTTP: an invalid request from %s: %s", self.client, exc)
            self._end(400, f"invalid HTTP request: {exc}")
            return
        if self.phase == _BODY:
            if self.body_bytes > self.max_body:
                self.listener.too_large += 1
                self._end(413, f"the body is larger than {self.listener.max_body} bytes")
        elif self.head_bytes > self.max_head and self.phase == _HEAD:
            self.listener.too_large += 1
            self._end(431, f"the request's head is larger than {self.max_head} bytes")

    def pause_writing(self) -> None:
        self.write_paused = True
        self.write_deadline = self.loop.time() + self.idle_timeout

    def resume_writing(self) -> None:
        self.write_paused = False
        self.write_deadline = _NEVER
        self._wake_writers()

    async def drain(self) -> None:
        """Until the transport takes writes again (or the connection is gone)."""
        if self._writable is None or self._writable.done():
            self._writable = self.loop.create_future()
        await self._writable

    def _wake_writers(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def _last(self) -> None:
        """No request after the ones read: the last one closes the connection."""
        self.last_read = True
        if self.cycle is not None and not self.cycle.response_started:
            self.cycle.keep_alive = False

    # -- httptools callbacks ------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.last_read:
            raise _Stop
        now = self.loop.time()
        answering = self.answering
        if answering is None or answering.response_complete:
            self.listener.admission.reading(self, now)  # a slow one may make room
        else:  # pipelined behind an answer in the making: never closed for another
            self.listener.admission.busy(self)
        self.began = now
        self.phase = _HEAD
        self.deadline = now + self.header_timeout
        self.url = b""
        self.headers = []
        self.expect_continue = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        self.headers.append((name, value))

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
        cycle = self.cycle = Cycle(self, self._scope(), keep_alive=self._keep_alive(),
                                   expect_continue=self.expect_continue)  # fmt: skip
        if not cycle.keep_alive:
            self.last_read = True
        answering = self.answering
        if answering is not None and not answering.response_complete:
            self.pipeline.append(cycle)  # queued behind an answer: its body may wait too
            self.deadline = _NEVER
            self._pause_reading()
        else:
            self._answer(cycle)
            self.deadline = self.loop.time() + self.body_timeout

    def _scope(self) -> dict[str, Any]:
        parser = self.parser
        try:
            url = httptools.parse_url(self.url)
            raw_path: bytes = url.path
            path = raw_path.decode("ascii")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError, AttributeError):
            raise _Refused(400, "the request's target is not a valid URL") from None
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": parser.get_http_version(),
            "method": parser.get_method().decode("ascii"),
            "scheme": "http",
            "path": unquote(path) if "%" in path else path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "root_path": "",
            "headers": self.headers,
            "client": self.client,
            "server": self.server,
        }

    def _keep_alive(self) -> bool:
        # llhttp's answer: HTTP/1.1 unless "close", HTTP/1.0 only with "keep-alive"
        return not self.draining and self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.received(body)

    def on_message_complete(self) -> None:
        self.listener.budget.drop(self)  # the body is the app's now
        self.listener.admission.busy(self)  # and the answer is in the making
        # (an answer given before the body was in ended the connection already)
        self.phase = _BUSY
        self.deadline = _NEVER
        cycle = self.cycle
        if cycle is not None:
            cycle.ended()

    # -- answers ------------------------------------------------------------------

    def _answer(self, cycle: Cycle) -> None:
        self.answering = cycle
        self.task = self.loop.create_task(cycle.run(self.app))

    def app_done(self, cycle: Cycle) -> None:
        if self.answering is cycle or self.answering is None:
            self.task = None

    def want_body(self, cycle: Cycle) -> None:
        if self.read_paused and cycle is self.answering:
            self.read_paused = False
            self.transport.resume_reading()

    def _pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def answered(self, cycle: Cycle) -> None:
        """``cycle``'s answer is complete: the connection closes if it ends
        it, else the next request's turn."""
        self.listener.requests += 1
        if self.transport.is_closing():
            self.closing = True  # and if the close cannot flush, the sweep drops it
            self.deadline = self.loop.time() + LINGER
            return
        if self.phase == _BODY and cycle is self.cycle:
            # answered before its body was in: the rest of it is of no use
            self._linger()
            return
        if not cycle.keep_alive:
            self.closing = True  # and if the close cannot flush, the sweep drops it
            self.transport.close()
            self.deadline = self.loop.time() + LINGER
            return
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        if self.pipeline:
            following = self.pipeline.popleft()
            self._answer(following)
            if self.phase == _BODY and following is self.cycle:  # its body may come now
                self.deadline = self.loop.time() + self.body_timeout
        elif self.last_read:  # nothing more is read: an upgrade's answer was the last
            self.closing = True
            self.transport.close()
            self.deadline = self.loop.time() + LINGER
        elif self.phase == _BUSY:
            self.phase = _IDLE
            self.cycle = self.answering = None  # an idle connection holds no request
            self.deadline = self.loop.time() + self.idle_timeout
            self.listener.admission.idle(self)
            if self.draining:
                self.shutdown()
        else:  # the next request is arriving, and nothing is answered now
            self.listener.admission.reading(self, self.began)

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
        elif (
            self.phase == _BODY
            and answering is not None
            and answering is self.cycle
            and (not answering.response_started)
        ):
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
        if self.transport.is_closing():
            return
        if due:  # ours cannot come before the answers due: just close
            self.transport.close()
            return
        self.transport.write(answer(status, message))
        self._linger()

    def _abandon(self) -> None:
        """The app's answers to this connection's requests go nowhere from now
        on (and one waiting for its body is told the client went away): a write
        to a closed transport raises under uvloop."""
        self.listener.budget.drop(self)
        pipeline = list(self.pipeline)
        self.pipeline.clear()
        for cycle in (self.answering, self.cycle, *pipeline):
            if cycle is not None:
                cycle.gone()

    def _linger(self) -> None:
        transport = self.transport
        self.closing = True
        self.deadline = self.loop.time() + LINGER
        if transport.can_write_eof():
            transport.write_eof()
            transport.resume_reading()
        else:
            transport.close()
