"""What arrives on an HTTP/2 connection's streams: request header blocks
(HEADERS and CONTINUATION, decoded by `_frames`), DATA and the flow control of
what we receive, and the streams' state as they are opened, forgotten and reset.
What a request means is left to the hooks a subclass implements (`_grpc`).

What a client may make us hold here is bounded: the decoded header list of a
request (advertised as SETTINGS_MAX_HEADER_LIST_SIZE, enforced on the decoded
size), the header lists held by the open streams together (HEADER_BUDGET), the
streams open at once (MAX_STREAMS, refused past it), and request bytes, held
only within the connection's window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._control import H2Control
from ._frames import (
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    STREAM_CLOSED,
    U32,
    WINDOW_UPDATE,
    ConnectionError_,
    HeaderDecoder,
    Metadata,
    frame,
)
from ._send import H2Stream

if TYPE_CHECKING:
    from ._listen import H2Listener

__all__ = ["HEADER_BUDGET", "MAX_STREAMS", "H2Streams"]

MAX_STREAMS = 100  # as nghttp2, h2o and Apache advertise; Envoy opens another connection past it
# Header lists the open streams of one connection may hold, in max_header_bytes
HEADER_BUDGET = 64


class H2Streams(H2Control):
    """The streams of a connection and what arrives on them; `H2Connection`
    reads the frames and hands them here."""

    # H2Connection's
    going_away: bool
    listener: H2Listener[Any]

    def __init__(self) -> None:
        super().__init__()
        listener = self.listener
        self.budget = listener.budget
        self.admission = listener.admission
        self.stream_window = listener.stream_window  # a request's body, at most
        self.connection_window = listener.connection_window
        self.headers = HeaderDecoder(self.limits.max_header_bytes)
        self.streams: dict[int, H2Stream] = {}
        self.bodies: dict[int, H2Stream] = {}  # requests whose body has a deadline, oldest first
        self.header_bytes = 0  # decoded header lists held by open streams
        self.last_stream = 0  # the highest stream the peer opened
        self.continuing: tuple[int, int, bytearray] | None = None  # stream, flags, block
        self.block_started = 0.0
        self.received = 0  # DATA on the connection the peer may not send again yet
        self.consumed = 0  # of that, read (or dropped): given back at a quarter window

    def _close_soon(self) -> None:
        raise NotImplementedError  # H2Connection

    # -- header blocks and DATA ------------------------------------------------------

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & PADDED:
            if not payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "padded HEADERS without a length")
            end -= payload[0]
            start = 1
        if flags & PRIORITY_FLAG:
            start += 5
        if start > end:
            raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
        block = payload[start:end] if start or end != len(payload) else payload
        if not flags & END_HEADERS:
            if not block:
                self._spend("empty header frames")
            self.continuing = (stream_id, flags, bytearray(block))
            self.block_started = self.loop.time()
            return
        self._header_block(stream_id, flags, block)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[0] != stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        if not payload and not flags & END_HEADERS:
            self._spend("empty CONTINUATION frames")
        block = self.continuing[2]
        block += payload
        # encoded bytes never exceed what they decode to, less the 32 a field
        if len(block) > self.limits.max_header_bytes:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            first_flags = self.continuing[1]
            self.continuing = None
            self._header_block(stream_id, first_flags, bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers, size = self.headers.decode(block)  # always: the table must follow the peer's
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers of a request
            if not flags & END_STREAM:
                raise ConnectionError_(PROTOCOL_ERROR, "request trailers without END_STREAM")
            if stream.ended:  # a second end would run a unary call twice
                self._reset(stream, STREAM_CLOSED)
                return
            self._end(stream)
            return
        if stream_id % 2 == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "a client stream with an even number")
        if stream_id <= self.last_stream:
            self._spend("frames for closed streams")
            return  # a stream we closed or reset: late frames are dropped
        self.last_stream = stream_id
        if self.going_away:
            return  # past our GOAWAY's last stream: not processed, the client retries
        if (
            len(self.streams) >= MAX_STREAMS
            or self.header_bytes + size > HEADER_BUDGET * self.limits.max_header_bytes
        ):
            self._spend("streams refused")
            self._write(frame(RST_STREAM, 0, stream_id, U32.pack(REFUSED_STREAM)))
            return
        self._request(stream_id, bool(flags & END_STREAM), headers, size)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        """Flow control: a stream's window is what its request may hold, given
        back only as a streaming call reads its messages; the connection's
        comes back as requests are read (a unary request when it is complete),
        so what a client makes us hold is bounded by its windows, and what all
        clients make us hold by the process's `BodyBudget`."""
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.received += size
        if self.received > self.connection_window:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            if stream_id > self.last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on a stream never opened")
            self._spend("frames for closed streams")
            if stream is not None:  # after END_STREAM
                self._reset(stream, STREAM_CLOSED)
            self._consumed(None, size)
            return  # a stream we closed or reset: dropped
        if flags & PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
            payload = payload[1 : size - payload[0]]
        ended = bool(flags & END_STREAM)
        if not payload and not ended:
            self._spend("empty DATA frames")
        stream.received += size
        if stream.received > self.stream_window:
            self._consumed(None, size)
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        self._consumed(stream, size - len(payload))  # the padding
        if payload:
            if not self.budget.take(stream, len(payload), self._shed):
                self._consumed(None, len(payload))
                return  # it alone was more than the budget, and was shed
            stream.data += payload
        if not self._request_data(stream):
            return  # it failed
        if ended:
            self._end(stream)

    def _end(self, stream: H2Stream) -> None:
        stream.ended = True
        self.bodies.pop(stream.id, None)
        self._request_ended(stream)

    def _consumed(self, stream: H2Stream | None, size: int) -> None:
        """``size`` bytes of DATA were read or dropped: their window goes back to
        the client (in WINDOW_UPDATEs of part of a window, not one per frame)."""
        if size <= 0:
            return
        self.consumed += size
        if self.consumed >= self.connection_window // 4:
            self._write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.consumed)))
            self.received -= self.consumed
            self.consumed = 0
        if stream is None or stream.ended or not self._reads_as_it_goes(stream):
            return
        stream.consumed += size
        if stream.consumed >= self.stream_window // 2 and self.streams.get(stream.id) is stream:
            self._write(frame(WINDOW_UPDATE, 0, stream.id, U32.pack(stream.consumed)))
            stream.received -= stream.consumed
            stream.consumed = 0

    # -- what a subclass implements -----------------------------------------------

    def _request(self, stream_id: int, ended: bool, headers: Metadata, size: int) -> None:
        """New request headers: `_open` a stream, or answer at once."""
        raise NotImplementedError

    def _reads_as_it_goes(self, stream: H2Stream) -> bool:
        """Whether the stream's bytes are read as they come (its window then comes
        back as they are read) or held until the request ends."""
        raise NotImplementedError

    def _request_shed(self, stream: H2Stream) -> None:
        """The budget dropped the stream's bytes to make room: end its request."""
        raise NotImplementedError

    def _request_data(self, stream: H2Stream) -> bool:
        """More of the request is in ``stream.data``; False if the stream failed."""
        raise NotImplementedError

    def _request_ended(self, stream: H2Stream) -> None:
        raise NotImplementedError

    def _request_timed_out(self, stream: H2Stream) -> None:
        """The request's body did not arrive within ``body_timeout``."""
        raise NotImplementedError

    def _stream_gone(self, stream: H2Stream) -> None:
        """The client reset the stream or the connection is lost."""
        raise NotImplementedError

    # -- streams -------------------------------------------------------------------

    def _shed(self, holder: Any) -> None:
        stream: H2Stream = holder
        held = len(stream.data)
        stream.data.clear()
        self._consumed(None, held)
        self.listener.lost()
        if self.streams.get(stream.id) is stream:
            self._request_shed(stream)

    def _open(self, stream: H2Stream, *, body_deadline: bool) -> None:
        if not self.streams:
            self.admission.busy(self)
        self.streams[stream.id] = stream
        self.header_bytes += stream.header_size
        if body_deadline:
            stream.opened = self.loop.time()
            self.bodies[stream.id] = stream

    def _forget(self, stream: H2Stream) -> None:
        if self.streams.pop(stream.id, None) is None:
            return
        self.header_bytes -= stream.header_size
        self.bodies.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        stream.outbox.clear()
        self.queued -= stream.queued
        stream.queued = 0
        self._wake(stream)
        held = len(stream.data)  # bytes nobody will read: window back
        stream.data.clear()
        self.budget.drop(stream)
        self._consumed(None, held)
        if not self.streams:
            self.admission.idle(self)
            if self.going_away:
                self._close_soon()

    def _reset(self, stream: H2Stream, code: int) -> None:
        """Resets a stream the client made invalid: counted like a client's reset,
        or a client could make us reset streams without end for free."""
        self._forget(stream)
        self._stream_gone(stream)
        self._write(frame(RST_STREAM, 0, stream.id, U32.pack(code)))
        self._spend("streams reset")

    def _end_streams(self) -> None:
        """Every stream ends now: its handler is cancelled, and nothing it held
        is kept (a failed connection lingers, but its calls stop at once)."""
        streams = list(self.streams.values())
        self.streams.clear()
        self.blocked.clear()
        self.bodies.clear()
        self.waiting.clear()
        self.headers.forget()
        self.header_bytes = self.queued = 0
        for stream in streams:
            self.budget.drop(stream)
            stream.data.clear()
            stream.outbox.clear()
            self._wake(stream)
            self._stream_gone(stream)
