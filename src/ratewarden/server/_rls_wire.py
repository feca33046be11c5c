"""A RateLimitResponse written straight to protobuf's wire format.

Building the response as protobuf objects (a status added, its limit's fields
set one by one, a header value added per header) costs a ShouldRateLimit about
a fifth of its time in the server; the same bytes joined here cost a few
microseconds. Only what the service sends is written: the overall code, the
descriptors' statuses and the headers to add. Dynamic metadata (a Struct) is
built by protobuf itself (`_rls`), and tests/server/test_rls_wire.py holds
every answer written here against protobuf's own reading of it.

The format (https://protobuf.dev/programming-guides/encoding/): each field is a
tag (its number << 3 | its wire type) and a value; a varint for numbers and
enums, a length-prefixed run of bytes for strings and messages. A field that
holds its default is left out, as protobuf leaves it out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ._shapes import DescriptorStatus

__all__ = ["response_bytes"]

UINT32 = 2**32 - 1
OK, OVER_LIMIT = 1, 2  # RateLimitResponse.Code
# envoy's RateLimit.Unit for a period in seconds (a period that is none of them: 0)
UNITS = {1: 1, 60: 2, 3600: 3, 86400: 4, 30 * 86400: 5, 365 * 86400: 6, 7 * 86400: 7}

# the one-byte varints, made once: most numbers the service writes are below 128
_SMALL = [bytes((n,)) for n in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:  # an int64's two's complement, ten bytes, as protobuf writes it
        n += 1 << 64
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or a message."""
    return tag + _varint(len(payload)) + payload


def _status(status: DescriptorStatus) -> bytes:
    """One DescriptorStatus message: code 1, current_limit 2 (requests_per_unit 1,
    unit 2, name 3), limit_remaining 3, duration_until_reset 4 (seconds 1). A
    length below 128 is one byte, written without a call."""
    small = _SMALL
    out = b"\x08" + small[OK if status.code == "OK" else OVER_LIMIT]
    per_unit = status.requests_per_unit
    if per_unit is not None:
        limit = b""
        if per_unit:
            limit = b"\x08" + _varint(min(per_unit, UINT32))
        unit = UNITS.get(status.unit_seconds or 0, 0)
        if unit:
            limit += b"\x10" + small[unit]
        if status.limit:
            name = status.limit.encode()
            size = len(name)
            limit += b"\x1a" + (small[size] if size < 128 else _varint(size)) + name
        size = len(limit)
        out += b"\x12" + (small[size] if size < 128 else _varint(size)) + limit
        remaining = min(status.remaining or 0, UINT32)
        if remaining:
            out += b"\x18" + _varint(remaining)
        if status.reset_after is not None:
            seconds = math.ceil(status.reset_after)
            out += _delimited(b"\x22", b"\x08" + _varint(seconds)) if seconds else b"\x22\x00"
    elif status.remaining:  # an unlimited limit
        out += b"\x18" + _varint(min(status.remaining, UINT32))
    return out


def response_bytes(
    allowed: bool,
    statuses: Sequence[DescriptorStatus],
    headers: Iterable[tuple[str, str]],
) -> bytes:
    """A serialised RateLimitResponse: overall_code 1, statuses 2, and the
    response_headers_to_add 3 (HeaderValue: key 1, value 2; keys lower-cased,
    as HTTP/2 carries them)."""
    small = _SMALL
    out = b"\x08" + small[OK if allowed else OVER_LIMIT]
    for status in statuses:
        one = _status(status)
        size = len(one)
        out += b"\x12" + (small[size] if size < 128 else _varint(size)) + one
    keys = _KEYS
    for name, value in headers:  # lengths below 128, the usual case, without a call
        key = keys.get(name) or _key(name)
        if value:
            data = value.encode()
            size = len(data)
            header = key + b"\x12" + (small[size] if size < 128 else _varint(size)) + data
        else:
            header = key
        size = len(header)
        out += b"\x1a" + (small[size] if size < 128 else _varint(size)) + header
    return out


# A header's name as a HeaderValue's key field (tag, length, lower-cased name): the
# service sends a handful of names, each made once; a bound keeps a rule file's
# own header names from growing it without end
_KEYS: dict[str, bytes] = {}
_MAX_KEYS = 256


def _key(name: str) -> bytes:
    key = name.lower().encode()
    field = _delimited(b"\x0a", key)
    if len(_KEYS) < _MAX_KEYS:
        _KEYS[name] = field
    return field
