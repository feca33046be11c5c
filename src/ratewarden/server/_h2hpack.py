"""HPACK decoding for our HTTP/2 connections: hpack's decoder, and a cache of
decoded blocks. Envoy and gRPC clients send the same indexed header block for
every call; decoded once, it is found again by its bytes and the dynamic
table's version, so a steady stream of calls decodes nothing."""

from __future__ import annotations

from hpack import Decoder, HPACKError
from hpack.table import HeaderTable

from ._h2frames import COMPRESSION_ERROR, ConnectionError_, Metadata

__all__ = ["HeaderDecoder"]

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
