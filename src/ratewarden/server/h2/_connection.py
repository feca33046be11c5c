"""An HTTP/2 connection on asyncio (RFC 9113): reading frames, the streams'
state, flow control of what we receive, and the defences a server facing
clients needs. Beside it: `_h2out` (what we send), `_h2hpack` (header
decoding), `_h2listen` (what a listener's connections share), `_h2frames`
(the wire). What a request means is left to a subclass (`_h2grpc` runs gRPC
calls on it).

Why our own: a check must cost under 100 us all told, and h2's state machine
alone costs ~95 us a call (bench/RESULTS.md). Frames are parsed by hand (one
``struct`` unpack per frame header); a request's HPACK block is decoded once per
connection and then found in a cache (Envoy and gRPC clients send the same
indexed block again and again); everything one loop turn produces goes out in
one write.

What a client may make us spend is bounded, as in nghttp2 and h2o:

- **frames that make no progress** (PING, SETTINGS, PRIORITY, unknown types,
  empty DATA or CONTINUATION, frames for closed streams), **resets** either
  way (the client's RST_STREAM, and the resets and refusals its frames make
  us send), cost from one budget of credit that refills at a steady rate; an
  empty budget ends the connection with GOAWAY ENHANCE_YOUR_CALM;
- **replies the client does not read**: when the transport's buffer is full we
  stop reading, so control frames cannot queue answers without end;
- **memory**: the decoded header list of a request is limited (advertised as
  SETTINGS_MAX_HEADER_LIST_SIZE, enforced on the decoded size), the header
  lists held by a connection's open streams have a budget, request bytes are
  held only within the connection window, and queued answers wait for the
  client (`drained`); a streaming call whose client reads nothing for the idle
  timeout ends with RESOURCE_EXHAUSTED, its unsent answers dropped so that
  the status is not stuck behind them;
- **CPU**: SETTINGS_INITIAL_WINDOW_SIZE moves every stream's window in O(1)
  (a stream keeps its window relative to the initial size);
- **time**: the preface, an unfinished header block and a unary request's
  body each have a deadline, an idle connection is closed, and a listener
  keeps at most ``max_connections`` (`H2Listener`).

A protocol error closes the connection with GOAWAY and the error's code, as
the RFC asks; a bad stream is reset alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from ._frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEAD,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTING,
    SETTINGS,
    STREAM_CLOSED,
    U32,
    WINDOW_UPDATE,
    ConnectionError_,
    HeaderDecoder,
    Metadata,
    frame,
)
from ._listen import H2Listener
from ._send import DATA_OUT, HEAD_OUT, LAST_OUT, H2Output, H2Stream

__all__ = ["DATA_OUT", "HEAD_OUT", "LAST_OUT", "H2Connection", "H2Listener", "H2Stream", "Metadata"]

log = logging.getLogger("ratewarden.server")
# hpack logs every header block it decodes at debug, bearer tokens included
logging.getLogger("hpack").setLevel(logging.INFO)


MAX_FRAME = 16_384  # what we accept (the RFC's default; we do not raise it)
STREAM_WINDOW = 1 << 20  # what each stream may send us before we give it back
CONNECTION_WINDOW = 1 << 24
MAX_STREAMS = 100  # as nghttp2, h2o and Apache advertise; Envoy opens another connection past it
MAX_CACHED_BLOCK = 512  # header blocks longer than this are decoded every time
# The budget of frames that make no progress and of resets: a burst, refilled
# at a steady rate. A well-behaved client spends almost none of it (a SETTINGS
# and a few PINGs a connection, a reset when a deadline passes).
FLOOD_BURST = 1_000.0
FLOOD_RATE = 1_000.0  # credit a second
# Header lists the open streams of one connection may hold, in max_header_bytes
HEADER_BUDGET = 64
FRAMES_A_TURN = 128  # frames of one connection parsed before others get the loop
LINGER = 1.0  # seconds a failed connection is read and dropped before it is closed


_WRITING, _PARSING = 1, 2  # why reading is paused


class H2Connection(H2Output):
    """What a connection reads and its streams' state. A subclass implements `_request`
    (new request headers), `_request_data` (more of its body), `_request_ended`,
    `_request_timed_out` and `_stream_gone` (reset or connection lost)."""

    def __init__(self, listener: H2Listener) -> None:
        self.listener = listener
        limits = listener.limits
        self.limits = limits
        super().__init__()
        self.buffer = bytearray()
        self.preface = False
        self.headers = HeaderDecoder(limits.max_header_bytes)
        self.streams: dict[int, H2Stream] = {}
        self.bodies: dict[int, H2Stream] = {}  # requests whose body has a deadline, oldest first
        self.header_bytes = 0  # decoded header lists held by open streams
        self.last_stream = 0  # the highest stream the peer opened
        self.continuing: tuple[int, int, bytearray] | None = None  # stream, flags, block
        self.block_started = 0.0
        self.partial_since = 0.0  # when the unfinished frame in the buffer began
        self.received = 0  # DATA on the connection the peer may not send again yet
        self.consumed = 0  # of that, read (or dropped): given back at a quarter window
        self.going_away = False
        self.goaway_last = MAX_WINDOW  # the last stream our GOAWAY promised to answer
        self.closed = False
        self.settings_seen = False
        now = self.loop.time()
        self.made = self.active = self.credit_at = now
        self.credit = FLOOD_BURST
        self.paused = 0  # _WRITING | _PARSING

    # -- asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        listener = self.listener
        if len(listener.connections) >= self.limits.max_connections:
            # one more would cost a descriptor and memory: refused before a byte is read
            self.closed = True
            self.transport.abort()
            listener.refused += 1
            return
        listener.connections.add(self)
        settings = b"".join(
            SETTING.pack(key, value)
            for key, value in (
                (0x2, 0),  # ENABLE_PUSH: servers do not receive pushes, said for clarity
                (0x3, MAX_STREAMS),
                (0x4, STREAM_WINDOW),
                (0x6, self.limits.max_header_bytes),
            )
        )
        self._write(frame(SETTINGS, 0, 0, settings))
        self._write(frame(WINDOW_UPDATE, 0, 0, U32.pack(CONNECTION_WINDOW - 65_535)))
        if listener.stopping:
            self.goaway()

    def connection_lost(self, exc: Exception | None) -> None:
        was_open = self in self.listener.connections
        self.closed = True
        self.listener.connections.discard(self)
        self._end_streams()
        if was_open:
            self.listener.lost()

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
            stream.data.clear()
            stream.outbox.clear()
            self._wake(stream)
            self._stream_gone(stream)

    def pause_writing(self) -> None:  # the peer is not reading: stop reading it
        self._pause(_WRITING)

    def resume_writing(self) -> None:
        self._resume(_WRITING)

    def _pause(self, why: int) -> None:
        if not self.paused and self.transport is not None:
            self.transport.pause_reading()
        self.paused |= why

    def _resume(self, why: int) -> None:
        self.paused &= ~why
        if not self.paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        now = self.loop.time()
        self.active = now
        credit = self.credit + (now - self.credit_at) * FLOOD_RATE
        self.credit = FLOOD_BURST if credit > FLOOD_BURST else credit
        self.credit_at = now
        buffer = self.buffer
        buffer += data
        if not self.preface:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    self._abort()
                return
            if buffer[: len(PREFACE)] != PREFACE:
                self._abort()  # not HTTP/2 with prior knowledge: nothing to say
                return
            del buffer[: len(PREFACE)]
            self.preface = True
        if not self.paused & _PARSING:
            self._parse()

    def _parse(self) -> None:
        """The frames in the buffer, FRAMES_A_TURN at most: one client's read of
        many small frames waits its turn instead of holding the loop, and its
        socket is not read meanwhile."""
        buffer = self.buffer
        pos, size = 0, len(buffer)
        turn = FRAMES_A_TURN
        try:
            while size - pos >= 9:
                high, low, kind, flags, stream = HEAD.unpack_from(buffer, pos)
                length = high << 8 | low
                if length > MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "frame larger than MAX_FRAME_SIZE")
                end = pos + 9 + length
                if end > size:
                    break
                payload = bytes(buffer[pos + 9 : end])
                pos = end
                stream &= 0x7FFFFFFF
                self._frame(kind, flags, stream, payload)
                if self.transport is None or self.transport.is_closing():
                    return
                turn -= 1
                if not turn and size - pos >= 9:
                    self._pause(_PARSING)
                    self.loop.call_soon(self._parse_more)
                    break
        except ConnectionError_ as exc:
            self._fail(exc.code, str(exc))
            return
        del buffer[:pos]
        if not buffer:
            self.partial_since = 0.0
        elif not self.partial_since:  # a frame begun: the rest has header_timeout to come
            self.partial_since = self.active

    def _parse_more(self) -> None:
        if self.closed:
            return
        self._resume(_PARSING)
        self._parse()

    def _spend(self, what: str, cost: float = 1.0) -> None:
        """A frame that makes no progress, or a reset: one credit of the budget."""
        self.credit -= cost
        if self.credit < 0.0:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"too many {what}")

    # -- frames ------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if not self.settings_seen:
            if kind != SETTINGS or flags & ACK:
                raise ConnectionError_(PROTOCOL_ERROR, "the preface must end with SETTINGS")
            self.settings_seen = True
        if self.continuing is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream, payload)
        elif kind == HEADERS:
            self._headers(flags, stream, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == PING:
            self._ping(flags, stream, payload)
        elif kind == RST_STREAM:
            self._rst_stream(stream, payload)
        elif kind == GOAWAY:
            self._goaway(stream, payload)
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
            self._spend("PRIORITY frames")
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client cannot push")
        else:  # an extension we do not know: ignored (RFC 9113 5.5), but not for free
            self._spend("frames of unknown types")

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
        """Flow control: the connection's window comes back only as requests are
        read (a unary request when it is complete, a streaming call's messages as
        the call takes them), so what a client makes us hold is bounded by
        CONNECTION_WINDOW; a stream that is not read as it comes has its own window
        given back as its bytes arrive (a message may be larger than a stream
        window), one that is (`H2Stream.consumed`) as it is read."""
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.received += size
        if self.received > CONNECTION_WINDOW:
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
        if stream.received > STREAM_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        stream.data += payload
        self._consumed(stream, size - len(payload))  # the padding
        if not self._request_data(stream):
            return  # it failed
        if ended:
            self._end(stream)
            return
        if not self._reads_as_it_goes(stream) and stream.received >= STREAM_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, stream_id, U32.pack(stream.received)))
            stream.received = 0

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
        if self.consumed >= CONNECTION_WINDOW // 4:
            self._write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.consumed)))
            self.received -= self.consumed
            self.consumed = 0
        if stream is None or stream.ended or not self._reads_as_it_goes(stream):
            return
        stream.consumed += size
        if stream.consumed >= STREAM_WINDOW // 2 and self.streams.get(stream.id) is stream:
            self._write(frame(WINDOW_UPDATE, 0, stream.id, U32.pack(stream.consumed)))
            stream.received -= stream.consumed
            stream.consumed = 0

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        # each entry is work: a frame of 2,730 of them costs what 342 empty ones do
        self._spend("SETTINGS frames", 1.0 + len(payload) / 48)
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        for at in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, at)
            if key == 0x1:  # our encoder never uses the table: tell the peer it is 0
                self.table_update = b"\x20"
            if key == 0x2 and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
            if key == 0x4:  # INITIAL_WINDOW_SIZE: moves every stream's window at once
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                self.peer_stream_window = value
            elif key == 0x5:
                if not 16_384 <= value <= 2**24 - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            # the rest say nothing a server must act on
        self._write(frame(SETTINGS, ACK, 0, b""))
        self._pump_blocked()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
            self._pump_blocked()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            self._spend("frames for closed streams")
            return
        if increment == 0:
            self._reset(stream, PROTOCOL_ERROR)
            return
        stream.send_delta += increment
        if self.peer_stream_window + stream.send_delta > MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if stream.outbox:
            self._pump(stream)

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionError_(FRAME_SIZE_ERROR, "PING of the wrong size")
        self._spend("PING frames")
        if not flags & ACK:
            self._write(frame(PING, ACK, 0, payload))

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if stream_id == 0 or stream_id > self.last_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0 or an idle stream")
        self._spend("streams reset")  # CVE-2023-44487, "rapid reset"
        stream = self.streams.get(stream_id)
        if stream is not None:  # the client gave up on the request
            self._forget(stream)
            self._stream_gone(stream)

    def _goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(PROTOCOL_ERROR, "GOAWAY on a stream")
        # the peer opens no more streams; those in flight are still answered, and
        # the peer closes the connection when it has its answers

    # -- what a subclass implements -----------------------------------------------

    def _request(self, stream_id: int, ended: bool, headers: Metadata, size: int) -> None:
        """New request headers: `_open` a stream, or answer at once."""
        raise NotImplementedError

    def _reads_as_it_goes(self, stream: H2Stream) -> bool:
        """Whether the stream's bytes are read as they come (its window then comes
        back as they are read) or held until the request ends."""
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

    def _open(self, stream: H2Stream, *, body_deadline: bool) -> None:
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
        self._consumed(None, held)
        if self.going_away and not self.streams:
            self._close_soon()

    def _reset(self, stream: H2Stream, code: int) -> None:
        """Resets a stream the client made invalid: counted like a client's reset,
        or a client could make us reset streams without end for free."""
        self._forget(stream)
        self._stream_gone(stream)
        self._write(frame(RST_STREAM, 0, stream.id, U32.pack(code)))
        self._spend("streams reset")

    # -- time ------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Called about once a second: deadlines of the preface, of a header block,
        of request bodies, and of an idle connection."""
        if self.closed:
            return
        limits = self.limits
        if not self.settings_seen:
            if now - self.made > limits.header_timeout:
                self._fail(PROTOCOL_ERROR, "no preface and SETTINGS in time")
            return
        if self.continuing is not None and now - self.block_started > limits.header_timeout:
            self._fail(ENHANCE_YOUR_CALM, "a header block not finished in time")
            return
        if self.partial_since and now - self.partial_since > limits.header_timeout:
            self._fail(ENHANCE_YOUR_CALM, "a frame not finished in time")
            return
        while self.bodies:
            stream = next(iter(self.bodies.values()))
            if now - stream.opened <= limits.body_timeout:
                break
            del self.bodies[stream.id]
            self._request_timed_out(stream)
        if not self.streams and now - self.active > limits.idle_timeout:
            self.goaway()

    # -- the end ---------------------------------------------------------------------

    def goaway(self) -> None:
        """Graceful: no new streams; those already open are answered, then close."""
        if self.going_away or self.closed:
            return
        self.going_away = True
        self.goaway_last = self.last_stream
        payload = U32.pack(self.last_stream) + U32.pack(NO_ERROR)
        self._write(frame(GOAWAY, 0, 0, payload))
        if not self.streams:
            self._close_soon()

    def _close_soon(self) -> None:
        def close() -> None:
            self._flush()
            if self.transport is not None and not self.closed:
                self.transport.close()

        self.loop.call_soon(close)

    def _fail(self, code: int, reason: str) -> None:
        """GOAWAY, then a lingering close: our side is shut for writing and what the
        client still sends is read and dropped for up to LINGER seconds, so that
        the kernel does not answer unread bytes with a reset that could reach the
        client before our GOAWAY does and hide why it was closed."""
        log.debug("HTTP/2 connection error %#x: %s", code, reason)
        if code == ENHANCE_YOUR_CALM:
            self.listener.calmed += 1
        last = min(self.last_stream, self.goaway_last)  # never above a GOAWAY sent before
        payload = U32.pack(last) + U32.pack(code) + reason.encode()[:256]
        self._write(frame(GOAWAY, 0, 0, payload))
        self._flush()
        transport = self.transport
        if transport is None or self.closed or not transport.can_write_eof():
            self._abort()
            return
        self.closed = True  # data_received drops everything from now on
        self._end_streams()
        transport.write_eof()
        self.loop.call_later(LINGER, transport.abort)

    def _abort(self, *, now: bool = False) -> None:
        if self.transport is not None and not self.closed:
            if now:  # the grace is over: a client that does not read waits no more
                self.transport.abort()
            else:
                self.transport.close()  # flushes what was written, then closes
        self.closed = True
