"""An HTTP/2 connection on asyncio (RFC 9113): the protocol's events, the
frames read off the buffer and handed to their handlers, the deadlines, and the
end. It is built in layers, each a module: `_send` (what we send), `_control`
(control frames and the flood budget), `_streams` (header blocks, DATA and the
streams' state); `_frames` is the wire and HPACK, `_listen` what a listener's
connections share. What a request means is left to a subclass (`_grpc` runs
gRPC calls on it).

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
  empty budget ends the connection with GOAWAY ENHANCE_YOUR_CALM (`_control`);
- **replies the client does not read**: when the transport's buffer is full we
  stop reading, so control frames cannot queue answers without end;
- **memory**: the decoded header list of a request is limited (advertised as
  SETTINGS_MAX_HEADER_LIST_SIZE, enforced on the decoded size), the header
  lists held by a connection's open streams have a budget, request bytes are
  held only within the connection window (`_streams`), and queued answers wait
  for the client (`drained`, `_send`); a streaming call whose client reads
  nothing for the idle timeout ends with RESOURCE_EXHAUSTED, its unsent answers
  dropped so that the status is not stuck behind them;
- **CPU**: SETTINGS_INITIAL_WINDOW_SIZE moves every stream's window in O(1)
  (a stream keeps its window relative to the initial size);
- **time**: the preface, an unfinished header block and a unary request's
  body each have a deadline, an idle connection is closed, and a listener
  keeps at most ``max_connections``, and ``max_connections_per_peer`` from one
  address, closing the connection idle longest to admit a new one (`H2Listener`);
- **memory across connections**: request bytes of unfinished requests are
  charged to the process's `BodyBudget`, which sheds the stream that has held
  bytes longest when it is full (`_streams`).

A protocol error closes the connection with GOAWAY and the error's code, as
the RFC asks; a bad stream is reset alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from .._connection_limits import peer_of
from ._frames import (
    ACK,
    CONTINUATION,
    DATA,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEAD,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTING,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    ConnectionError_,
    Metadata,
    frame,
)
from ._listen import H2Listener
from ._send import DATA_OUT, HEAD_OUT, LAST_OUT, H2Stream
from ._streams import MAX_STREAMS, H2Streams

__all__ = ["DATA_OUT", "HEAD_OUT", "LAST_OUT", "H2Connection", "H2Listener", "H2Stream", "Metadata"]

log = logging.getLogger("ratewarden.server")
# hpack logs every header block it decodes at debug, bearer tokens included
logging.getLogger("hpack").setLevel(logging.INFO)


MAX_FRAME = 16_384  # what we accept (the RFC's default; we do not raise it)
FRAMES_A_TURN = 128  # frames of one connection parsed before others get the loop
LINGER = 1.0  # seconds a failed connection is read and dropped before it is closed


_WRITING, _PARSING = 1, 2  # why reading is paused


class H2Connection(H2Streams):
    """What a connection reads, its deadlines and its end. A subclass implements
    the hooks of `H2Streams`: `_request` (new request headers), `_request_data`
    (more of its body), `_request_ended`, `_request_timed_out` and `_stream_gone`
    (reset or connection lost)."""

    def __init__(self, listener: H2Listener[Any]) -> None:
        self.listener = listener
        self.limits = listener.limits
        super().__init__()
        self.buffer = bytearray()
        self.preface = False
        self.partial_since = 0.0  # when the unfinished frame in the buffer began
        self.going_away = False
        self.goaway_last = MAX_WINDOW  # the last stream our GOAWAY promised to answer
        self.closed = False
        self.settings_seen = False
        self.made = self.active = self.credit_at
        self.paused = 0  # _WRITING | _PARSING

    # -- asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        listener = self.listener
        if not self.admission.admit(self, peer_of(self.transport)):
            # every slot busy: one more would cost a descriptor and memory, so
            # it is refused before a byte is read
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
                (0x4, self.stream_window),
                (0x6, self.limits.max_header_bytes),
            )
        )
        self._write(frame(SETTINGS, 0, 0, settings))
        if self.connection_window > 65_535:
            grow = U32.pack(self.connection_window - 65_535)
            self._write(frame(WINDOW_UPDATE, 0, 0, grow))
        if listener.stopping:
            self.goaway()

    def connection_lost(self, exc: Exception | None) -> None:
        was_open = self in self.listener.connections
        self.closed = True
        self.admission.left(self)
        self.listener.connections.discard(self)
        self._end_streams()
        if was_open:
            self.listener.lost()

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
        self._refill(now)
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
            self._priority(payload)
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client cannot push")
        else:  # an extension we do not know: ignored (RFC 9113 5.5), but not for free
            self._spend("frames of unknown types")

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

    def evict(self) -> None:
        """Closed (idle, no stream open) to admit a new connection: a GOAWAY
        that says no stream was processed, so a client retries elsewhere."""
        self.listener.evicted += 1
        self.goaway()

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
