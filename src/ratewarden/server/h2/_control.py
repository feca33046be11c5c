"""The frames that steer an HTTP/2 connection rather than carry a request
(SETTINGS, WINDOW_UPDATE, PING, RST_STREAM, GOAWAY, PRIORITY), and the budget
every frame that makes no progress is charged to.

The budget bounds floods as nghttp2 and h2o do: PING, SETTINGS, PRIORITY,
unknown types, empty DATA or CONTINUATION, frames for closed streams, and
resets either way (the client's RST_STREAM, and the resets and refusals its
frames make us send) each cost credit from one bucket that refills at a steady
rate; an empty bucket ends the connection with GOAWAY ENHANCE_YOUR_CALM.
"""

from __future__ import annotations

from ._frames import (
    ACK,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_WINDOW,
    PING,
    PROTOCOL_ERROR,
    SETTING,
    SETTINGS,
    U32,
    ConnectionError_,
    frame,
)
from ._send import H2Output, H2Stream

__all__ = ["FLOOD_BURST", "FLOOD_RATE", "H2Control"]

# The budget: a burst, refilled at a steady rate. A well-behaved client spends
# almost none of it (a SETTINGS and a few PINGs a connection, a reset when a
# deadline passes).
FLOOD_BURST = 1_000.0
FLOOD_RATE = 1_000.0  # credit a second


class H2Control(H2Output):
    """A connection's control frames and its flood budget; `H2Streams` builds
    the streams on it, `H2Connection` the rest."""

    last_stream: int  # H2Streams keeps it

    def __init__(self) -> None:
        super().__init__()
        self.credit_at = self.loop.time()
        self.credit = FLOOD_BURST

    def _reset(self, stream: H2Stream, code: int) -> None:
        raise NotImplementedError  # H2Streams

    def _stream_gone(self, stream: H2Stream) -> None:
        raise NotImplementedError  # a hook of H2Streams

    # -- the budget ----------------------------------------------------------------

    def _refill(self, now: float) -> None:
        """Credit for the time since the last read, up to the burst."""
        credit = self.credit + (now - self.credit_at) * FLOOD_RATE
        self.credit = FLOOD_BURST if credit > FLOOD_BURST else credit
        self.credit_at = now

    def _spend(self, what: str, cost: float = 1.0) -> None:
        """A frame that makes no progress, or a reset: one credit of the budget."""
        self.credit -= cost
        if self.credit < 0.0:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"too many {what}")

    # -- control frames ------------------------------------------------------------

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

    def _priority(self, payload: bytes) -> None:
        # RFC 9113 deprecates priorities and we follow none: the frame is only checked
        if len(payload) != 5:
            raise ConnectionError_(FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
        self._spend("PRIORITY frames")
