"""The attributes of a request a gateway (nginx ``auth_request``, Traefik
``forwardAuth``) asks ``/auth`` about, read from the headers it forwards."""

from __future__ import annotations

from ._service import InvalidRequest

__all__ = ["AUTH_METHODS", "auth_attributes"]

Headers = list[tuple[bytes, bytes]]

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
