"""Reading a request's body for the HTTP API: strict JSON (UTF-8, no name twice
in one object), errors that say what is wrong, and the key in a path.

The attributes of a request a gateway (nginx ``auth_request``, Traefik
``forwardAuth``) asks ``/auth`` about, read from the headers it forwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import unquote_to_bytes

import msgspec

from ._refusals import InvalidRequest
from ._shapes import BAD_COST, CheckRequest

__all__ = [
    "AUTH_METHODS",
    "HTTPError",
    "auth_attributes",
    "least_members",
    "parse",
    "refuse_duplicates",
    "scan_duplicates",
    "tail",
]

Headers = list[tuple[bytes, bytes]]
Scope = MutableMapping[str, Any]


class HTTPError(Exception):
    """An answer other than 200: its status, message (``{"error": ...}``) and headers."""

    def __init__(self, status: int, message: str, headers: Headers | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


def tail(scope: Scope, prefix: bytes) -> str:
    """The rest of the path after ``prefix``, %-decoded, as UTF-8 (raw_path:
    scope["path"] is decoded already, and a key may hold %-escapes; a key is
    UTF-8, as the checks that made it were). UnicodeDecodeError if it is not."""
    raw = scope.get("raw_path")
    if raw is None or not raw.startswith(prefix):  # no raw path, or its prefix %-escaped
        path: str = scope["path"]
        return path[len(prefix) :]
    return unquote_to_bytes(raw.partition(b"?")[0][len(prefix) :]).decode()


def parse(decode: Callable[[bytes], Any], body: bytes) -> Any:
    if not body:
        raise HTTPError(400, "the request needs a JSON body")
    try:
        return decode(body)
    except msgspec.ValidationError as exc:
        raise HTTPError(422, _explain(exc, body)) from None
    except msgspec.DecodeError as exc:
        raise HTTPError(400, f"malformed JSON: {exc}") from None
    except UnicodeDecodeError as exc:  # msgspec checks UTF-8 and raises this
        raise HTTPError(400, f"malformed JSON: not UTF-8 ({exc.reason})") from None
    except RecursionError:  # the types stop at a few levels; this is the backstop
        raise HTTPError(400, "malformed JSON: nested too deeply") from None


# msgspec names a dict's member `[...]`: the attribute is found again for the message
_ATTRIBUTE_AT = re.compile(r"at `\$(?:\.checks\[(\d+)\])?\.attributes\[\.\.\.\]")


# and a cost's place, where the decoder's words give way to the one message for a bad cost
_COST_AT = re.compile(r"at `\$(?:\.checks\[(\d+)\])?\.cost`$")


def _explain(exc: msgspec.ValidationError, body: bytes) -> str:
    message = str(exc)
    cost = _COST_AT.search(message)
    if cost is not None:
        return _bad_cost(body, cost[1])
    return f"invalid request: {_typed(message, body)}"


def _typed(message: str, body: bytes) -> str:
    """The decoder's ``message``, or what an attribute of the wrong type should be."""
    where = _ATTRIBUTE_AT.search(message)
    if where is None:
        return message
    try:  # the error path only: this body is refused whatever happens here
        document = msgspec.json.decode(body)
        check = document if where[1] is None else document["checks"][int(where[1])]
        problem = _attribute_type(check["attributes"])
    except (RecursionError, msgspec.DecodeError, LookupError, TypeError, ValueError):
        return message
    if problem is None:
        return message
    return problem if where[1] is None else f"checks[{where[1]}]: {problem}"


def _bad_cost(body: bytes, index: str | None) -> str:
    """`BAD_COST`, with the cost as it was sent when the body can say it."""
    said = BAD_COST if index is None else f"checks[{index}]: {BAD_COST}"
    try:  # the error path only: this body is refused whatever happens here
        document = msgspec.json.decode(body)
        check = document if index is None else document["checks"][int(index)]
        return f"{said}, got {json.dumps(check['cost'])[:40]}"
    except (RecursionError, msgspec.DecodeError, LookupError, TypeError, ValueError):
        return said


def _attribute_type(attributes: dict[str, Any]) -> str | None:
    for name, value in attributes.items():
        if value is None or type(value) is str:
            continue
        if type(value) is dict and name == "headers":
            for header, text in value.items():
                if type(text) is not str:
                    kind = _json_type(text)
                    return f"attribute 'headers': {header!r} must be a string, got {kind}"
            continue
        return f"attribute {name!r} must be a string (or null), got {_json_type(value)}"
    return None


def _json_type(value: object) -> str:
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", dict: "an object"}  # fmt: skip
    return kinds.get(type(value), "null")


# -- duplicate names ------------------------------------------------------------
#
# msgspec keeps the last of two equal names in an object and says nothing. Each
# name in a JSON text is followed by one colon outside strings, so a text with
# no more colons outside strings than the decoded request has names cannot have
# had a name twice. Counting costs well under a microsecond: all the colons, or
# when some are inside strings and no backslash escapes a quote, all of them
# less those between quotes. Only a body neither count settles (a repeated
# name, an escaped string with a colon, an explicit default such as "cost": 1)
# is scanned again by the standard library's decoder, which reports every
# object's names in order.


def refuse_duplicates(body: bytes, checks: Sequence[CheckRequest], members: int) -> None:
    colons = body.count(b":")
    least = members
    for check in checks:
        least += least_members(check)
    if colons == least:
        return
    # with no backslash, no quote is escaped: the split's odd parts are the strings
    if b"\\" not in body and colons - b"".join(body.split(b'"')[1::2]).count(b":") == least:
        return
    scan_duplicates(body)


def scan_duplicates(body: bytes) -> None:
    """Refuse a JSON body with a name twice in one object: every body the counts
    above do not settle, and the admin endpoints' small ones."""
    try:
        _scan(body.decode())
    except _Duplicate as exc:
        message = f"malformed JSON: the name {exc.args[0]!r} appears twice in one object"
        raise HTTPError(400, message) from None
    except (ValueError, RecursionError) as exc:  # msgspec took it; should not happen
        raise HTTPError(400, f"malformed JSON: {exc}") from None


def least_members(check: CheckRequest) -> int:
    """Names the request's JSON had at least: a field holding its default (cost
    1, domain null) may have been sent or not, and is not counted."""
    count = 0
    attributes = check.attributes
    if attributes is not None:
        headers = attributes.get("headers")
        count = 1 + len(attributes) + (len(headers) if type(headers) is dict else 0)
    if check.domain is not None:
        count += 1
    if check.descriptors is not None:
        count += 1
        for descriptor in check.descriptors:
            count += 1 + 2 * len(descriptor.entries)
    if check.cost != 1:
        count += 1
    return count


class _Duplicate(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1:
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _Duplicate(name)
            seen.add(name)


_scan = json.JSONDecoder(object_pairs_hook=_pairs).decode


# Headers a gateway forwards about the original request, and the attribute each
# becomes (nginx sets the X-Original-* ones in its auth_request location;
# Traefik's forwardAuth sends the X-Forwarded-* ones).
_AUTH_HEADERS = {
    b"x-original-uri": "path",
    b"x-forwarded-uri": "path",
    b"x-original-method": "method",
    b"x-forwarded-method": "method",
    b"x-api-key": "api_key",
    b"x-user": "user",
    b"x-org": "org",
    b"x-plan": "plan",
    b"x-forwarded-host": "host",
}


# The methods a gateway's subrequest may carry (nginx's is the original one's).
AUTH_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


def auth_attributes(headers: Headers, peer: str | None) -> dict[str, object]:
    """The attributes of the request a gateway asks about, from its headers.

    ``ip`` is the peer (the gateway) and every header goes into ``headers``, so
    the rule file's ``client_ip.trusted_proxies`` decides whether X-Forwarded-For
    is believed, as for any other front end.

    Values are UTF-8, as JSON sent to ``/v1/check`` is, so that one name counts
    under one key whichever way it comes. A header that becomes an attribute
    (X-User, X-Api-Key, ...) must be valid UTF-8 and come once: otherwise
    `InvalidRequest`, since there is no telling which value the gateway meant.
    Other headers keep their bytes as Latin-1 when they are not UTF-8, and a
    header sent on several lines is one comma-separated value (RFC 9110 5.3),
    so that X-Forwarded-For holds every hop."""
    attributes: dict[str, object] = {}
    header_map: dict[str, str] = {}
    mapped: set[bytes] = set()
    for raw_name, raw_value in headers:
        name = _AUTH_HEADERS.get(raw_name)
        try:
            value = raw_value.decode()
        except UnicodeDecodeError:
            if name is not None:
                raise InvalidRequest(f"{_title(raw_name)} is not valid UTF-8") from None
            value = raw_value.decode("latin-1")
        if name is not None:
            if raw_name in mapped:
                raise InvalidRequest(f"{_title(raw_name)} is given more than once")
            mapped.add(raw_name)
            if name not in attributes:  # X-Original-URI and X-Forwarded-Uri: the first
                attributes[name] = value
        key = raw_name.decode("latin-1")
        previous = header_map.get(key)
        header_map[key] = value if previous is None else f"{previous}, {value}"
    path = attributes.get("path")
    if isinstance(path, str) and "?" in path:
        attributes["path"] = path.partition("?")[0]
    attributes.setdefault("method", "GET")
    if peer is not None:
        attributes["ip"] = peer
    attributes["headers"] = header_map
    return attributes


def _title(raw_name: bytes) -> str:
    return "-".join(part.capitalize() for part in raw_name.decode("latin-1").split("-"))
