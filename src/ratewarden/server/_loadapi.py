"""The HTTP API's load signals, which adaptive rules scale their limits by:

    PUT /v1/load/{signal}   {"value": 850}  (admin)

A value set here is this process's alone: the load an adaptive limit follows
is the load of the process that serves the requests (its latency, its queue),
and each instance is fed its own. The counters stay shared in the store; an
instance under load charges its requests more of them (see `ratewarden._adaptive`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ._body import HTTPError, parse, scan_duplicates, tail

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["LoadRequest", "LoadSet", "openapi_paths", "set_load"]

PREFIX = b"/v1/load/"


class LoadRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A load signal's new value: a finite number (milliseconds, a queue's length...)."""

    value: float


class EffectiveLimit(msgspec.Struct):
    limit: int  # without the load: the rule's (or its override's), in requests
    effective_limit: int  # what the load leaves of it now


class LoadSet(msgspec.Struct):
    signal: str
    value: float
    limits: dict[str, EffectiveLimit]  # every limit that reads the signal, by name
    shared: bool  # always false: each instance is fed its own load


_decode = msgspec.json.Decoder(LoadRequest).decode
_encode = msgspec.json.Encoder().encode


async def set_load(service: Service, scope: Any, body: bytes) -> bytes:
    try:
        signal = tail(scope, PREFIX)
    except UnicodeDecodeError:
        raise HTTPError(400, "a signal name must be UTF-8 once %-decoded") from None
    if not signal:
        raise HTTPError(400, "no signal named: PUT /v1/load/{signal}")
    request: LoadRequest = parse(_decode, body)
    scan_duplicates(body)
    return _encode(service.set_load(signal, request.value))


def openapi_paths(problem: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The path of this API for the OpenAPI document, and the schemas it uses."""
    (request, done), components = msgspec.json.schema_components(
        [LoadRequest, LoadSet], ref_template="#/components/schemas/{name}"
    )

    def json_of(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {"application/json": {"schema": schema}}}

    error = json_of(problem)
    signal = {"name": "signal", "in": "path", "required": True, "schema": {"type": "string"}}
    paths = {
        "/v1/load/{signal}": {
            "put": {
                "operationId": "setLoad",
                "summary": "Feed a load signal that adaptive rules scale their limits by"
                " (this instance only)",
                "parameters": [signal],
                "requestBody": {"required": True, **json_of(request)},
                "responses": {
                    "200": {"description": "The limits that read the signal, now", **json_of(done)},
                    "400": {"description": "Malformed JSON or signal name", **error},
                    "401": {"description": "No valid bearer token", **error},
                    "404": {"description": "No rule reads this signal", **error},
                    "413": {"description": "Body too large", **error},
                    "422": {"description": "The value is not a finite number", **error},
                },
            }
        }
    }
    return paths, components
