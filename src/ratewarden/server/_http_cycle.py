"""One HTTP/1.1 request's exchange with the ASGI app: its ``receive`` and
``send``, and the framing of the answer.

The answer is framed as the app's headers say: with a Content-Length, the body
is sent as it is (and must be that long); without one, it is chunked (HTTP/1.1)
or ends with the connection (HTTP/1.0). A HEAD request, a 204 and a 304 get no
body. An answer begun before the request's body is all in says ``connection:
close``: the connection ends after it, the rest of the body unread. A header
whose name is not a token, or whose value holds CR, LF or another control
byte, is refused (RuntimeError in the app, so a 500 if nothing
was sent): the app must not be able to split an answer.

An answer with a Content-Length is held until its body comes, so that head and
body leave in one write (one segment for a check's answer); a streamed answer's
head leaves at once. An exception in the app is logged and answered 500 when
nothing was written yet; otherwise the connection is closed, since the client
could not tell a cut answer from a whole one.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from http import HTTPStatus
from typing import Any, Protocol

import msgspec

from ._shapes import Problem

__all__ = ["App", "Connection", "Cycle", "answer"]

log = logging.getLogger("ratewarden.server")

App = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]

# a header name is a token (RFC 9110 5.6.2); a value has no control byte but tab
_BAD_NAME = re.compile(rb'[\x00-\x20\x7f()<>@,;:\\"/\[\]?={}]|[^\x00-\x7f]')
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ERROR_500 = b"Internal Server Error"
_NO_BODY = frozenset((204, 304))
_PHRASES = {400: b"Bad Request", 408: b"Request Timeout", 413: b"Content Too Large",
            431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}  # fmt: skip


def answer(status: int, message: str, *extra: bytes) -> bytes:
    """An answer of the server's own, which closes the connection."""
    body = msgspec.json.encode(Problem(message))
    head = [b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES[status]),
            b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
            *extra, b"connection: close\r\n\r\n"]  # fmt: skip
    return b"".join(head) + body


class Connection(Protocol):
    """What a `Cycle` needs of the connection it answers on (`HttpConnection`)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    write_paused: bool

    def answered(self, cycle: Cycle) -> None: ...
    def app_done(self, cycle: Cycle) -> None: ...
    def want_body(self, cycle: Cycle) -> None: ...
    async def drain(self) -> None: ...


def _status_line(status: int) -> bytes:
    line = _STATUS.get(status)
    if line is None:
        if type(status) is not int or not 100 <= status <= 999:
            raise RuntimeError(f"invalid HTTP status {status!r}")
        line = b"HTTP/1.1 %d \r\n" % status
    return line


class Cycle:
    """A request read by an `HttpConnection`, and the app's answer to it.
    ``keep_alive``: the connection stays open after the answer."""

    __slots__ = (
        "body",
        "chunked",
        "conn",
        "continue_",
        "disconnected",
        "handed_last",
        "head",
        "held",
        "keep_alive",
        "more_body",
        "remaining",
        "response_complete",
        "response_started",
        "scope",
        "waiter",
        "wrote",
    )

    def __init__(
        self,
        conn: Connection,
        scope: dict[str, Any],
        *,
        keep_alive: bool,
        expect_continue: bool,
    ) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.continue_ = expect_continue  # a 100 Continue is due before the body is read
        self.head = scope["method"] == "HEAD"
        self.body = bytearray()  # received, not yet handed to the app
        self.more_body = True  # the request's body has not all arrived
        self.handed_last = False  # the app has the end of the body
        self.disconnected = False  # the connection went: nothing goes out any more
        self.response_started = False
        self.response_complete = False
        self.wrote = False  # a byte of the answer went to the transport
        self.held = b""  # a head held for the body that follows it
        self.chunked: bool | None = None  # None: no framing chosen yet
        self.remaining = 0  # bytes of a Content-Length still to send
        self.waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        state = ("done" if self.response_complete else "answering" if self.response_started
                 else "waiting")  # fmt: skip
        return f"<Cycle {self.scope['method']} {self.scope['raw_path']!r} {state}>"

    # -- what the connection tells it ---------------------------------------------

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def received(self, data: bytes) -> None:
        self.body += data
        self.wake()

    def ended(self) -> None:
        self.more_body = False
        self.wake()

    def gone(self) -> None:
        """The connection closed, or the request was answered by the server."""
        if not self.response_complete:
            self.disconnected = True
        self.wake()

    # -- ASGI ---------------------------------------------------------------------

    async def run(self, app: App) -> None:
        try:
            if not self.disconnected:  # else refused, or gone, before its turn came
                await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            self.conn.transport.close()  # the drain's time is up
            raise
        except Exception:
            log.exception("HTTP: the app raised on %s %s", self.scope["method"], self.scope["path"])
            if not self.wrote and not self.disconnected:
                await self._answer_500()
            else:
                self.conn.transport.close()
        else:
            if self.disconnected or self.response_complete:
                return
            if not self.wrote:
                log.error("HTTP: the app gave no whole answer to %s %s",
                          self.scope["method"], self.scope["path"])  # fmt: skip
                await self._answer_500()
            else:
                log.error("HTTP: the app left its answer to %s %s unfinished",
                          self.scope["method"], self.scope["path"])  # fmt: skip
                self.conn.transport.close()
        finally:
            self.conn.app_done(self)

    async def _answer_500(self) -> None:
        self.response_started = False
        self.chunked = None
        self.held = b""
        self.keep_alive = False
        headers = [(b"content-type", b"text/plain; charset=utf-8"),
                   (b"content-length", b"%d" % len(_ERROR_500))]  # fmt: skip
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": _ERROR_500})

    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        if self.continue_:
            self.continue_ = False
            if not (self.disconnected or self.response_started or conn.transport.is_closing()):
                conn.transport.write(_CONTINUE)
        while not (self.body or (not self.more_body and not self.handed_last)):
            if self.disconnected or self.response_complete:
                return {"type": "http.disconnect"}
            conn.want_body(self)
            self.waiter = conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if self.disconnected:
            return {"type": "http.disconnect"}
        body = bytes(self.body)
        self.body.clear()
        self.handed_last = not self.more_body
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected or conn.transport.is_closing():
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {kind!r}")
            self._start(message)
        elif self.response_complete:
            raise RuntimeError(f"{kind!r} sent after the answer was complete")
        elif kind != "http.response.body":
            raise RuntimeError(f"expected http.response.body, got {kind!r}")
        else:
            self._body(message.get("body", b""), message.get("more_body", False))

    # -- framing ------------------------------------------------------------------

    def _start(self, message: MutableMapping[str, Any]) -> None:
        status = message["status"]
        parts = [_status_line(status)]
        close = self._headers(message.get("headers", ()), parts)
        if status in _NO_BODY or status < 200:
            self.chunked = False
            self.remaining = 0
        elif self.head:
            self.chunked = False
        elif self.chunked is None:
            if self.scope["http_version"] == "1.1":
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:  # HTTP/1.0 knows no chunks: the end of the body is the end of the connection
                self.keep_alive = False
                self.remaining = -1
                self.chunked = False
        if self.more_body:  # answered before its body is in: the connection ends after it
            self.keep_alive = False
        if close:
            self.keep_alive = False
        elif not self.keep_alive:
            parts.append(b"connection: close\r\n")
        elif self.scope["http_version"] != "1.1":  # HTTP/1.0 that asked to keep it
            parts.append(b"connection: keep-alive\r\n")
        parts.append(b"\r\n")
        self.response_started = True
        self.continue_ = False
        if self.chunked is False and self.remaining >= 0:
            self.held = b"".join(parts)  # sent with the body, in one write
        else:
            self.wrote = True
            self.conn.transport.write(b"".join(parts))

    def _headers(self, headers: Iterable[tuple[bytes, bytes]], parts: list[bytes]) -> bool:
        """The app's headers checked and added to ``parts``; whether one says
        ``connection: close``."""
        close = False
        for raw_name, value in headers:
            if _BAD_NAME.search(raw_name):
                raise RuntimeError(f"invalid header name {raw_name!r}")
            if _BAD_VALUE.search(value):
                raise RuntimeError(f"invalid value of header {raw_name!r}: {value!r}")
            name = raw_name.lower()
            if name == b"content-length":
                if self.chunked is not None:
                    raise RuntimeError("two Content-Length headers, or one with chunking")
                if not value.isdigit():
                    raise RuntimeError(f"invalid Content-Length {value!r}")
                self.remaining = int(value)
                self.chunked = False
            elif name == b"transfer-encoding":
                if value.lower() != b"chunked" or self.chunked is not None:
                    raise RuntimeError(f"Transfer-Encoding {value!r}: only chunked, alone")
                self.chunked = True
            elif name == b"connection" and b"close" in value.lower():
                close = True
            parts += (name, b": ", value, b"\r\n")
        return close

    def _body(self, body: bytes, more_body: bool) -> None:
        transport = self.conn.transport
        if self.head:
            out = b""
        elif self.chunked:
            out = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more_body:
                out += b"0\r\n\r\n"
        elif self.remaining < 0:  # until the connection closes
            out = body
        else:
            self.remaining -= len(body)
            if self.remaining < 0:
                raise RuntimeError("the body is longer than its Content-Length")
            if not more_body and self.remaining:
                raise RuntimeError("the body is shorter than its Content-Length")
            out = body
        if self.held:
            out = self.held + out
            self.held = b""
        if out:
            self.wrote = True
            transport.write(out)
        if more_body:
            return
        self.response_complete = True
        self.wake()  # an app waiting in receive() is told the exchange is over
        self.conn.answered(self)
