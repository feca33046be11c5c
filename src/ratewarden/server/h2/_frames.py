"""HTTP/2's wire (RFC 9113) and the little of HPACK (RFC 7541) our answers need:
frame types, flags, error codes, one frame's bytes, and header fields encoded as
literals that never touch the peer's dynamic table, so that one encoder serves
every connection and a precomputed block can be written as it is.

HPACK decoding for our HTTP/2 connections: hpack's decoder, and a cache of
decoded blocks. Envoy and gRPC clients send the same indexed header block for
every call; decoded once, it is found again by its bytes and the dynamic
table's version, so a steady stream of calls decodes nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from hpack import Decoder, HPACKError
from hpack.table import HeaderTable

__all__ = [
    "ACK",
    "END_HEADERS",
    "END_STREAM",
    "PREFACE",
    "ConnectionError_",
    "HeaderDecoder",
    "Metadata",
    "frame",
    "header_int",
    "literal",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
# settings
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = 2**31 - 1

Metadata = Mapping[bytes, bytes]


class ConnectionError_(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


HEAD = struct.Struct(">HBBBI")  # a frame's 24-bit length read as H + B, type, flags, stream
SETTING = struct.Struct(">HI")
U32 = struct.Struct(">I")


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    length = len(payload)
    return HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream) + payload


def header_int(value: int, prefix: int, first: int = 0) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 5.1)."""
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field literal, not indexed, new name, no Huffman."""
    return b"\x00" + header_int(len(name), 7) + name + header_int(len(value), 7) + value


def status_block(status: bytes) -> bytes:
    """``:status`` alone: a literal without indexing whose name is static entry 8."""
    return header_int(8, 4) + header_int(len(status), 7) + status


MAX_CACHED_BLOCK = 512  # header blocks longer than this are decoded every time
CACHED_BLOCKS = 64


class _Table(HeaderTable):
    """hpack's dynamic table with a version that moves whenever it changes, so a
    decoded header block can be reused for the same bytes and the same table."""

    version = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.version += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, newmax: int) -> None:
        self.version += 1
        HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]


class HeaderDecoder:
    """Decodes a connection's header blocks, each to its header list and the
    list's size as RFC 9113 counts it (name + value + 32 a field); a list over
    ``max_size`` is a connection error (the table may be half updated)."""

    def __init__(self, max_size: int) -> None:
        self.table = _Table()
        self.decoder = Decoder(max_header_list_size=max_size)
        self.decoder.header_table = self.table
        self.known: dict[bytes, tuple[int, Metadata, int]] = {}

    def decode(self, block: bytes) -> tuple[Metadata, int]:
        table = self.table
        version = table.version
        known = self.known.get(block)
        if known is not None and known[0] == version:
            return known[1], known[2]
        try:
            fields = self.decoder.decode(block, raw=True)
        except (HPACKError, ValueError, IndexError) as exc:
            raise ConnectionError_(COMPRESSION_ERROR, f"bad header block: {exc!r}") from None
        headers: dict[bytes, bytes] = {}
        size = 0
        for name, value in fields:
            size += len(name) + len(value) + 32
            # gRPC metadata may repeat a name: the values join as HTTP's do
            old = headers.get(name)
            headers[name] = value if old is None else old + b"," + value
        # decoding it changed nothing: the same bytes will mean the same next time
        if table.version == version and len(block) <= MAX_CACHED_BLOCK:
            if len(self.known) >= CACHED_BLOCKS:
                self.known.clear()
            self.known[block] = (version, headers, size)
        return headers, size

    def forget(self) -> None:
        self.known.clear()
