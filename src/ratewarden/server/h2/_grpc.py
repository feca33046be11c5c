"""gRPC over our HTTP/2 connection (`_connection`): what Envoy's rate limit filter and
gRPC clients need, and nothing else.

- gRPC's length-prefixed messages, identity or gzip, unary and streaming
  methods; a bearer token checked before a method runs (not for ``public``
  methods: health);
- trailers-only answers for calls that fail before a reply (unknown method,
  bad token, bad message), HTTP 405 / 415 for requests that are not gRPC;
- a streaming call's messages come as the handler reads them (the client's
  window comes back as it reads), and its answers wait for the client to read
  them (`Call.send`), so neither side of a stream can grow our memory;
- graceful stop: GOAWAY names the last stream we will answer, calls in flight
  finish within a grace period, then the connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from .._connection_limits import BodyBudget, ConnectionLimits, ServerLimits
from .._shapes import bearer_matches
from ._connection import (
    DATA_OUT,
    HEAD_OUT,
    LAST_OUT,
    H2Connection,
    H2Listener,
    H2Stream,
    Metadata,
    log,
)
from ._eager import start as start_eagerly
from ._frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    frame,
    header_int,
    literal,
    status_block,
)

__all__ = ["Call", "GrpcError", "H2Server", "Metadata", "Method", "Status"]

MAX_MESSAGE = 4 * 1024 * 1024  # gRPC's usual default for a received message
# Health/Watch and reflection are all our streaming methods: a client needs one
# or two at a time, and each open one is a task that runs with every message
MAX_STREAMING = 16
_MESSAGE = struct.Struct(">BI")  # gRPC: compressed flag, length
_GZIP_FLAG = 1


class Status:
    """gRPC status codes used here."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


NOT_READ = "the client reads no answers"


class GrpcError(Exception):
    """Ends a call with a gRPC status other than OK."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _too_large(limit: int = MAX_MESSAGE) -> str:
    return f"a message larger than the server takes ({limit} bytes)"


SHED = "the server holds as many unfinished requests as it may; this one waited longest"


_STATUS_200 = b"\x88"  # static table entry 8
# content-type is static entry 31: literal without indexing, indexed name
_GRPC_TYPE = header_int(31, 4) + header_int(len(b"application/grpc"), 7) + b"application/grpc"
RESPONSE_HEADERS = _STATUS_200 + _GRPC_TYPE
TRAILERS_OK = literal(b"grpc-status", b"0")


def _percent(message: str) -> bytes:
    """grpc-message: UTF-8, bytes outside printable ASCII and '%' percent-encoded."""
    out = bytearray()
    for byte in message.encode()[:2048]:
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def trailers(code: int, message: str = "") -> bytes:
    block = literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", _percent(message))
    return block


class Call:
    """One streaming call: the request's metadata, its messages as they come
    (`recv` says None at the end of the request), and `send` for replies."""

    def __init__(self, connection: _GrpcConnection, stream: _GrpcStream) -> None:
        self._connection = connection
        self._stream = stream
        self.metadata: Metadata = stream.headers  # shared with other calls: read only
        # set when more of the request came (or it ended): its bytes stay in the
        # stream's buffer, as they arrived, until `recv` cuts a message from them
        self._more = asyncio.Event()

    async def recv(self) -> bytes | None:
        """The next request message, None at the end of the request. Reading it
        gives its bytes of window back to the client: a client that sends faster
        than the call reads waits on flow control, not on our memory (and what it
        sent is held as the bytes it sent, not as one object a message)."""
        connection, stream = self._connection, self._stream
        data = stream.data
        yielded = False
        while True:
            if len(data) >= 5:
                flag, length = _MESSAGE.unpack_from(data)
                # the window comes back as messages are read: one must fit in it
                limit = min(MAX_MESSAGE, connection.stream_window - 5)
                if length > limit:
                    raise GrpcError(Status.RESOURCE_EXHAUSTED, _too_large(limit))
                if len(data) >= 5 + length:
                    if not yielded:  # one message a turn: a client that sends a
                        yielded = True  # lot waits its turn like everyone else
                        await asyncio.sleep(0)
                        continue
                    message = bytes(data[5 : 5 + length])
                    del data[: 5 + length]
                    connection.budget.give_back(stream, 5 + length)
                    connection._consumed(stream, 5 + length)
                    return connection._uncompressed(stream, flag, message)
            if stream.ended:
                if data:
                    raise GrpcError(Status.INVALID_ARGUMENT, "the request ended inside a message")
                return None
            self._more.clear()
            await self._more.wait()

    async def send(self, message: bytes) -> None:
        """Queues a reply (sent as the client's window allows) and waits while the
        client leaves too much unread; raises `GrpcError` when it reads nothing
        for ``idle_timeout``."""
        connection, stream = self._connection, self._stream
        connection._send_message(stream, message)
        if not await connection.drained(stream):
            # the answers queued so far would never go out, and trailers queued
            # behind them neither: drop them, and end the call now
            connection._fail_call(stream, Status.RESOURCE_EXHAUSTED, NOT_READ)
            raise GrpcError(Status.RESOURCE_EXHAUSTED, NOT_READ)


Unary = Callable[[bytes, Metadata], Awaitable[bytes]]
Streaming = Callable[[Call], Awaitable[None]]


@dataclass(frozen=True)
class Method:
    """A method's handler: ``unary(request, metadata) -> reply`` or
    ``streaming(call)``; ``public`` methods need no token. An ``eager`` unary
    handler starts in the read that completed its request, and gets a task only
    if it has to wait (see `_eager`): it must not need a task before its first
    wait (no ``asyncio.timeout``, no ``current_task``)."""

    kind: Literal["unary", "streaming"]
    handler: Unary | Streaming
    public: bool = False
    eager: bool = False


class _GrpcStream(H2Stream):
    __slots__ = ("call", "method", "task")

    def __init__(self, stream_id: int, headers: Metadata, size: int, method: Method) -> None:
        super().__init__(stream_id, headers, size)
        self.method = method
        self.task: asyncio.Task[None] | None = None
        self.call: Call | None = None


class _GrpcConnection(H2Connection):
    listener: H2Server
    streaming = 0  # streaming calls open

    def _forget(self, stream: H2Stream) -> None:
        if stream.call is not None and stream.id in self.streams:  # type: ignore[attr-defined]
            self.streaming -= 1
        super()._forget(stream)

    def _end_streams(self) -> None:
        self.streaming = 0
        super()._end_streams()

    # -- requests (the hooks of H2Connection) ---------------------------------------

    def _request(self, stream_id: int, ended: bool, headers: Metadata, size: int) -> None:
        if headers.get(b":method") != b"POST":
            self._refuse(stream_id, b"405", ended)
            return
        content_type = headers.get(b"content-type", b"")
        if content_type != b"application/grpc" and not content_type.startswith(
            (b"application/grpc+", b"application/grpc;")
        ):  # not application/grpc-web, whose framing differs
            self._refuse(stream_id, b"415", ended)
            return
        server = self.listener
        path = headers.get(b":path", b"")
        method = server.methods.get(path)
        if method is None:
            name = path.decode(errors="replace")
            self._answer(stream_id, Status.UNIMPLEMENTED, f"unknown method {name}", ended)
            return
        if not method.public and not server.authorized(headers):
            self._answer(stream_id, Status.UNAUTHENTICATED, "a valid bearer token is needed", ended)
            return
        encoding = headers.get(b"grpc-encoding", b"identity")
        if encoding not in (b"identity", b"gzip"):
            self._answer(stream_id, Status.UNIMPLEMENTED,
                         f"grpc-encoding {encoding.decode(errors='replace')} (identity or gzip)",
                         ended)  # fmt: skip
            return
        streaming = method.kind == "streaming"
        if streaming:
            if self.streaming >= MAX_STREAMING:
                self._answer(stream_id, Status.RESOURCE_EXHAUSTED,
                             f"more than {MAX_STREAMING} streaming calls on one connection",
                             ended)  # fmt: skip
                return
            self.streaming += 1
        stream = _GrpcStream(stream_id, headers, size, method)
        # a unary request is held until it ends: its body has a deadline; a
        # streaming one is read as it comes, for as long as the call lasts
        self._open(stream, body_deadline=not streaming and not ended)
        if streaming:
            call = stream.call = Call(self, stream)
            stream.task = self.loop.create_task(self._streaming(stream, call))
        if ended:
            self._end(stream)

    def _reads_as_it_goes(self, stream: H2Stream) -> bool:
        return stream.call is not None  # type: ignore[attr-defined]

    def _request_data(self, stream: H2Stream) -> bool:
        assert isinstance(stream, _GrpcStream)
        if stream.call is not None:
            stream.call._more.set()
            return True
        data = stream.data
        if len(data) >= 5 and 5 + _MESSAGE.unpack_from(data)[1] > self.stream_window:
            # it would not fit in the window: said at once, not at the body timeout
            self._fail_call(stream, Status.RESOURCE_EXHAUSTED, _too_large(self.stream_window - 5))
            return False
        return True

    def _request_shed(self, stream: H2Stream) -> None:
        assert isinstance(stream, _GrpcStream)
        self._fail_call(stream, Status.RESOURCE_EXHAUSTED, SHED)

    def _request_ended(self, stream: H2Stream) -> None:
        assert isinstance(stream, _GrpcStream)
        if stream.call is not None:
            stream.call._more.set()
            return
        self.budget.drop(stream)
        self._consumed(None, len(stream.data))  # unary: the request is read now
        try:
            message = self._one_message(stream)
        except GrpcError as exc:
            self._fail_call(stream, exc.code, exc.message)
            return
        finally:
            stream.data.clear()
        if stream.method.eager:
            stream.task = start_eagerly(self.loop, self._unary(stream, message))
        else:
            stream.task = self.loop.create_task(self._unary(stream, message))

    def _request_timed_out(self, stream: H2Stream) -> None:
        assert isinstance(stream, _GrpcStream)
        self._fail_call(stream, Status.DEADLINE_EXCEEDED, "the request did not arrive in time")

    def _stream_gone(self, stream: H2Stream) -> None:
        assert isinstance(stream, _GrpcStream)
        task = stream.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    # -- messages ---------------------------------------------------------------------

    def _one_message(self, stream: _GrpcStream) -> bytes:
        data = stream.data
        if len(data) < 5:
            raise GrpcError(Status.INVALID_ARGUMENT, "a unary call needs one request message")
        compressed, length = _MESSAGE.unpack_from(data)
        if len(data) != 5 + length:
            raise GrpcError(Status.INVALID_ARGUMENT, "a unary call takes exactly one message")
        return self._uncompressed(stream, compressed, bytes(data[5:]))

    def _uncompressed(self, stream: _GrpcStream, flag: int, message: bytes) -> bytes:
        if not flag:
            return message
        if flag != _GZIP_FLAG or stream.headers.get(b"grpc-encoding") != b"gzip":
            raise GrpcError(Status.INTERNAL, "a compressed message without grpc-encoding: gzip")
        try:
            inflate = zlib.decompressobj(wbits=31)
            out = inflate.decompress(message, MAX_MESSAGE + 1)
        except zlib.error as exc:
            raise GrpcError(Status.INTERNAL, f"bad gzip message: {exc}") from None
        if len(out) > MAX_MESSAGE or inflate.unconsumed_tail:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, _too_large())
        if not inflate.eof or inflate.unused_data:
            raise GrpcError(Status.INTERNAL, "a gzip message cut short or with bytes after it")
        return out

    # -- calls ------------------------------------------------------------------------

    async def _unary(self, stream: _GrpcStream, message: bytes) -> None:
        handler: Unary = stream.method.handler  # type: ignore[assignment]
        try:
            reply = await handler(message, stream.headers)
        except GrpcError as exc:
            self._fail_call(stream, exc.code, exc.message)
            return
        except Exception:
            log.exception("gRPC method %s failed", stream.headers.get(b":path", b"").decode())
            self._fail_call(stream, Status.INTERNAL, "internal error")
            return
        if self.closed or self.streams.get(stream.id) is not stream:
            return  # reset meanwhile
        body = _MESSAGE.pack(0, len(reply)) + reply
        sid = stream.id
        if not stream.outbox and len(body) <= min(
            self.send_window, self.peer_stream_window + stream.send_delta, self.peer_max_frame
        ):  # the usual case: three frames in one write, the stream done
            self.send_window -= len(body)
            self._forget(stream)
            self._write(
                self._headers_frame(END_HEADERS, sid, RESPONSE_HEADERS)
                + frame(DATA, 0, sid, body)
                + frame(HEADERS, END_HEADERS | END_STREAM, sid, TRAILERS_OK)
            )
            return
        stream.started = True
        self._queue(stream, HEAD_OUT, RESPONSE_HEADERS)
        self._queue(stream, DATA_OUT, body)
        self._queue(stream, LAST_OUT, TRAILERS_OK)
        self._pump(stream)

    async def _streaming(self, stream: _GrpcStream, call: Call) -> None:
        handler: Streaming = stream.method.handler  # type: ignore[assignment]
        try:
            await handler(call)
        except GrpcError as exc:
            block = trailers(exc.code, exc.message)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gRPC method %s failed", stream.headers.get(b":path", b"").decode())
            block = trailers(Status.INTERNAL, "internal error")
        else:
            block = TRAILERS_OK
        if self.closed or self.streams.get(stream.id) is not stream:
            return
        if not stream.started:  # nothing was sent: a trailers-only answer
            stream.started = True
            block = RESPONSE_HEADERS + block
        self._queue(stream, LAST_OUT, block)
        self._pump(stream)

    def _send_message(self, stream: _GrpcStream, message: bytes) -> None:
        if self.closed or self.streams.get(stream.id) is not stream:
            return
        if not stream.started:
            stream.started = True
            self._queue(stream, HEAD_OUT, RESPONSE_HEADERS)
        self._queue(stream, DATA_OUT, _MESSAGE.pack(0, len(message)) + message)
        self._pump(stream)

    def _refuse(self, stream_id: int, status: bytes, ended: bool) -> None:
        """Not a gRPC request: an HTTP status and nothing else. Refusals cost the
        client as resets do: each is cheap to ask for and not free to answer."""
        self._spend("requests refused")
        self._last_block(stream_id, status_block(status), ended)

    def _answer(self, stream_id: int, code: int, message: str, ended: bool) -> None:
        """A trailers-only answer to a call that did not start."""
        self._spend("calls refused")
        self._last_block(stream_id, RESPONSE_HEADERS + trailers(code, message), ended)

    def _fail_call(self, stream: _GrpcStream, code: int, message: str) -> None:
        if self.closed or self.streams.get(stream.id) is not stream:
            return
        self._forget(stream)
        self._stream_gone(stream)
        if stream.started:  # a streaming call that already sent HEADERS: trailers alone
            self._last_block(stream.id, trailers(code, message), stream.ended)
        else:
            self._last_block(stream.id, RESPONSE_HEADERS + trailers(code, message), stream.ended)


class H2Server(H2Listener[H2Connection]):
    """Serves ``methods`` (by path, ``/package.Service/Method``) over HTTP/2
    with prior knowledge, or over TLS with ALPN ``h2``, within ``limits`` and
    ``server_limits``; ``budget``: the bytes of unfinished requests, shared by
    the process's listeners unless given."""

    def __init__(
        self,
        methods: Mapping[str, Method],
        *,
        token: bytes | None = None,
        ssl_context: ssl.SSLContext | None = None,
        limits: ConnectionLimits | None = None,
        server_limits: ServerLimits | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        super().__init__(limits, server_limits, budget)
        self.methods = {path.encode(): method for path, method in methods.items()}
        self._token = token
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._idle = asyncio.Event()

    def authorized(self, headers: Metadata) -> bool:
        if self._token is None:
            return True
        return bearer_matches(headers.get(b"authorization", b""), self._token)

    async def listen(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _GrpcConnection(self), host, port, ssl=self._ssl, reuse_port=reuse_port,
            backlog=2048,
        )  # fmt: skip
        self.start_sweeping()
        return int(self._server.sockets[0].getsockname()[1])

    def lost(self) -> None:
        super().lost()
        if not self.connections:
            self._idle.set()

    async def stop(self, grace: float) -> None:
        """GOAWAY to every connection; calls in flight get ``grace`` seconds."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.goaway()
        if self.connections:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):  # not wait_for: see ratewarden._waiting
                    await self._idle.wait()
        cancelled = [
            stream.task
            for connection in self.connections
            for stream in connection.streams.values()
            if isinstance(stream, _GrpcStream) and stream.task is not None
        ]
        for connection in list(self.connections):
            connection._abort(now=True)
            connection.connection_lost(None)
        if cancelled:  # let them unwind before the loop goes, or asyncio says they leaked
            await asyncio.wait(cancelled, timeout=1.0)
        self.stop_sweeping()
        if self._server is not None:
            await self._server.wait_closed()
