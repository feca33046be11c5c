"""RateLimitRequest bytes written by hand, so that a test can send what
protobuf's own classes refuse to build: keys and values that are not UTF-8,
fields the message does not have, truncated messages.

Field numbers are those of ``src/ratewarden/server/protos/``: RateLimitRequest
(1 domain, 2 descriptors, 3 hits_addend), RateLimitDescriptor (1 entries,
2 limit, 3 hits_addend as a google.protobuf.UInt64Value), Entry (1 key, 2 value).
"""

from __future__ import annotations

from dataclasses import dataclass, field

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return tag(number, LENGTH) + varint(len(payload)) + payload


def unsigned(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value)


@dataclass
class Descriptor:
    entries: list[tuple[bytes, bytes]]
    hits_addend: int | None = None  # the UInt64Value wrapper; None: not set
    override: tuple[int, int] | None = None  # (requests_per_unit, unit)

    def encode(self) -> bytes:
        parts = [length_delimited(1, length_delimited(1, k) + length_delimited(2, v))
                 for k, v in self.entries]  # fmt: skip
        if self.override is not None:
            per_unit, unit = self.override
            parts.append(length_delimited(2, unsigned(1, per_unit) + unsigned(2, unit)))
        if self.hits_addend is not None:
            parts.append(length_delimited(3, unsigned(1, self.hits_addend)))
        return b"".join(parts)


@dataclass
class Request:
    domain: bytes
    descriptors: list[Descriptor] = field(default_factory=list)
    hits_addend: int = 0
    extra: bytes = b""  # appended as is: unknown fields, garbage

    def encode(self) -> bytes:
        parts = [length_delimited(1, self.domain)]
        parts += [length_delimited(2, d.encode()) for d in self.descriptors]
        if self.hits_addend:
            parts.append(unsigned(3, self.hits_addend))
        return b"".join(parts) + self.extra


def fields(data: bytes) -> dict[int, list[int | bytes]]:
    """The top-level fields of a message: number -> values (varints as ints,
    length-delimited ones as bytes). Enough to read a RateLimitResponse without
    the server's own classes; raises ValueError on bytes that are no message."""
    out: dict[int, list[int | bytes]] = {}
    at = 0

    def read_varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            if at >= len(data):
                raise ValueError("truncated varint")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(data):
        key = read_varint()
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == VARINT:
            value = read_varint()
        elif wire == LENGTH:
            size = read_varint()
            value, at = data[at : at + size], at + size
            if at > len(data):
                raise ValueError("truncated field")
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            value, at = int.from_bytes(data[at : at + size], "little"), at + size
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out
