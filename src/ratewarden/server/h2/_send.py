"""What an HTTP/2 connection sends: each stream's queue of header blocks and
DATA, sent as the peer's windows allow, every frame of one loop turn in one
write, and the wait of a sender whose client does not read (`drained`).

A stream keeps its send window relative to the peer's INITIAL_WINDOW_SIZE
(``send_delta``), so a SETTINGS change moves every open stream's window at once
without touching any of them.
"""

from __future__ import annotations

import asyncio
from collections import deque

from .._connection_limits import ConnectionLimits
from ._frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    RST_STREAM,
    U32,
    Metadata,
    frame,
)

__all__ = ["CONNECTION_QUEUE", "DATA_OUT", "HEAD_OUT", "LAST_OUT", "STREAM_QUEUE", "H2Output",
           "H2Stream"]  # fmt: skip

# Answers queued for a client that does not read: past these a streaming call's
# `drained` waits (a stream's own, and the connection's total)
STREAM_QUEUE = 16 * 1024
CONNECTION_QUEUE = 256 * 1024
# what a stream's outbox holds
DATA_OUT, HEAD_OUT, LAST_OUT = 0, 1, 2


class H2Stream:
    """A stream's transport state; subclasses add what its request means."""

    __slots__ = (
        "consumed",
        "data",
        "ended",
        "header_size",
        "headers",
        "id",
        "opened",
        "outbox",
        "queued",
        "received",
        "send_delta",
        "started",
        "waiter",
    )  # fmt: skip

    def __init__(self, stream_id: int, headers: Metadata, header_size: int) -> None:
        self.id = stream_id
        self.headers = headers
        self.header_size = header_size  # counted against the connection's budget
        self.data = bytearray()  # request bytes not yet read
        self.ended = False  # the peer has sent END_STREAM
        self.opened = 0.0  # loop time; set for requests whose body has a deadline
        self.received = 0  # DATA the peer may not send again yet
        self.consumed = 0  # of that, read by a streaming call: given back at half
        self.started = False  # our response HEADERS have gone out (or are queued)
        # our send window minus the peer's INITIAL_WINDOW_SIZE: a SETTINGS change
        # then moves every stream's window without touching any of them
        self.send_delta = 0
        self.outbox: deque[tuple[int, bytes]] = deque()  # (DATA_OUT etc., bytes)
        self.queued = 0  # bytes of DATA in the outbox
        self.waiter: asyncio.Future[None] | None = None  # a sender waiting for room


class H2Output(asyncio.Protocol):
    """The sending half of a connection; `H2Control`, `H2Streams` and
    `H2Connection` build the rest on it."""

    limits: ConnectionLimits
    streams: dict[int, H2Stream]
    closed: bool

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()  # kept: get_running_loop() calls getpid()
        self.transport: asyncio.Transport | None = None
        self.send_window = 65_535
        self.peer_stream_window = 65_535
        self.peer_max_frame = 16_384
        self.blocked: dict[int, H2Stream] = {}  # streams waiting for window
        self.queued = 0  # bytes of DATA in every stream's outbox
        self.waiting: dict[int, H2Stream] = {}  # streams whose sender waits for room
        self.out: list[bytes] = []
        self.flushing = False
        self.table_update = b""  # a size update our next header block must start with

    def _forget(self, stream: H2Stream) -> None:
        raise NotImplementedError

    def _fail(self, code: int, reason: str) -> None:
        raise NotImplementedError

    # -- output ------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Queues bytes; everything queued in one loop turn goes out in one write."""
        self.out.append(data)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        if self.out and not self.closed and self.transport is not None:
            data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
            self.transport.write(data)
        self.out.clear()

    def _headers_frame(self, flags: int, stream_id: int, block: bytes) -> bytes:
        if self.table_update:  # the peer changed SETTINGS_HEADER_TABLE_SIZE: our
            block = self.table_update + block  # next block says so (RFC 7541 4.2)
            self.table_update = b""
        return frame(HEADERS, flags, stream_id, block)

    def _last_block(self, stream_id: int, block: bytes, ended: bool) -> None:
        """``block`` ends the stream; a request still coming is told to stop."""
        self._write(self._headers_frame(END_HEADERS | END_STREAM, stream_id, block))
        if not ended:
            self._write(frame(RST_STREAM, 0, stream_id, U32.pack(NO_ERROR)))

    def _queue(self, stream: H2Stream, kind: int, payload: bytes) -> None:
        """Queues a header block (`HEAD`, or `LAST` to end the stream) or `DATA`."""
        stream.outbox.append((kind, payload))
        if kind == DATA_OUT:
            stream.queued += len(payload)
            self.queued += len(payload)

    def _pump(self, stream: H2Stream) -> None:
        """Writes what the stream has queued, as far as the windows allow; after the
        LAST block the stream is done."""
        outbox, sid = stream.outbox, stream.id
        while outbox:
            kind, payload = outbox[0]
            if kind == HEAD_OUT:
                outbox.popleft()
                self._write(self._headers_frame(END_HEADERS, sid, payload))
                continue
            if kind == LAST_OUT:
                self._forget(stream)
                self._last_block(sid, payload, stream.ended)
                return
            window = self.peer_stream_window + stream.send_delta
            if window > MAX_WINDOW:  # a SETTINGS change took it there (RFC 9113 6.9.2)
                self._fail(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
                return
            room = min(self.send_window, window, self.peer_max_frame)
            if room <= 0:
                self.blocked[sid] = stream
                return
            chunk = payload[:room]
            sent = len(chunk)
            self.send_window -= sent
            stream.send_delta -= sent
            stream.queued -= sent
            self.queued -= sent
            self._write(frame(DATA, 0, sid, chunk))
            if sent == len(payload):
                outbox.popleft()
            else:
                outbox[0] = (DATA_OUT, payload[room:])
        self.blocked.pop(sid, None)
        if self.waiting:
            self._wake_waiting()

    def _pump_blocked(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                return
            self._pump(stream)

    async def drained(self, stream: H2Stream) -> bool:
        """Waits while the client leaves too much of our answers unread, up to
        ``idle_timeout``; False if it still had not read them then."""
        while self.streams.get(stream.id) is stream and (
            stream.queued > STREAM_QUEUE or self.queued > CONNECTION_QUEUE
        ):
            waiter = stream.waiter = self.loop.create_future()
            self.waiting[stream.id] = stream
            try:
                async with asyncio.timeout(
                    self.limits.idle_timeout
                ):  # not wait_for: see ratewarden._waiting
                    await waiter
            except TimeoutError:
                return False
            finally:
                self.waiting.pop(stream.id, None)
                stream.waiter = None
        return True

    def _wake(self, stream: H2Stream) -> None:
        waiter = stream.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_waiting(self) -> None:
        if self.queued > CONNECTION_QUEUE:
            return
        for stream in list(self.waiting.values()):
            if stream.queued <= STREAM_QUEUE:
                self._wake(stream)
