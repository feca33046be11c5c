"""``POST /v1/settle``: what a request counts, told after it ran.

A check whose request meets a rule that counts by response (``count``) or
settles its cost (``settle: true``) answers a ``settle`` token (see
`ratewarden.rules._settle`): its hits are taken already, so the request is
refused as usual when over the limit. Once the request ran, the caller posts
the token with the response's ``status`` and/or the actual ``cost``: the hits
a status does not count are given back, an estimate is corrected to what was
used. A token no check answered (garbled, or signed with another secret) is a
404, a settle that says nothing usable (no status where a rule needs one, a
negative cost) a 400; a token settled already or expired is a 409 (its hits
stay as they are).

The token carries everything a settle needs and is signed with the service's
secret (``RATEWARDEN_SETTLE_SECRET``, which every instance behind one load
balancer must share; without it each process makes its own, and its forked
workers share it). A settle is recorded in the store until the token expires,
so a second one is refused at every instance on that store.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..rules import AsyncRuleEngine, BadSettle, BadSettleToken, SettleRefused
from ._http_input import parse, scan_duplicates

__all__ = ["SettleError", "SettleRequest", "SettleResult", "settle", "settle_openapi_paths"]


class SettleRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The ``token`` a check answered, and what the request turned out to be:
    the response's ``status``, the actual ``cost`` (a whole number >= 0), or
    both, as the token's rules need."""

    token: str
    # float types only so that 403.0 is read as 403, as JSON Schema's integers allow
    status: float | None = None
    cost: float | None = None


class SettleResult(msgspec.Struct):
    """What the settle did: the hits it settled, the cost given back and the cost
    charged on top, and per hit its rule, key and change (< 0 given back)."""

    settled: int
    refunded: int
    charged: int
    changes: list[tuple[str, str, int]]


class SettleError(Exception):
    """A settle the service refuses: ``status`` (400, 404 or 409) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_decode = msgspec.json.Decoder(SettleRequest).decode
_encode = msgspec.json.Encoder().encode


async def settle(engine: AsyncRuleEngine, body: bytes) -> bytes:
    """The body of a settle; `SettleError` when it is refused."""
    request: SettleRequest = parse(_decode, body)
    scan_duplicates(body)
    status, cost = request.status, request.cost
    if status is not None and not float(status).is_integer():
        raise SettleError(400, f"status is the response's HTTP status, got {status!r}")
    if cost is not None and not float(cost).is_integer():
        raise SettleError(400, f"cost is the actual cost, a whole number >= 0, got {cost!r}")
    try:
        settled = await engine.asettle(
            request.token,
            status=None if status is None else int(status),
            cost=None if cost is None else int(cost),
        )
    except BadSettleToken as exc:
        raise SettleError(404, str(exc)) from None
    except BadSettle as exc:
        raise SettleError(400, str(exc)) from None
    except SettleRefused as exc:
        raise SettleError(409, str(exc)) from None
    changes = [list(change) for change in settled.changes]
    return _encode(
        SettleResult(len(changes), settled.refunded, settled.charged, changes)  # type: ignore[arg-type]
    )


def settle_openapi_paths(problem: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The path of this endpoint for the OpenAPI document, and its schemas."""
    (request, result), components = msgspec.json.schema_components(
        [SettleRequest, SettleResult], ref_template="#/components/schemas/{name}"
    )
    components["SettleRequest"]["properties"]["cost"]["anyOf"] = [
        {"type": "integer", "minimum": 0}, {"type": "null"},
    ]  # fmt: skip
    components["SettleRequest"]["properties"]["status"]["anyOf"] = [
        {"type": "integer", "minimum": 100, "maximum": 599}, {"type": "null"},
    ]  # fmt: skip

    def json_of(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {"application/json": {"schema": schema}}}

    error = json_of(problem)
    paths = {
        "/v1/settle": {
            "post": {
                "operationId": "settle",
                "summary": "Tell what a checked request counts once it ran: its response's"
                " status, its actual cost",
                "requestBody": {"required": True, **json_of(request)},
                "responses": {
                    "200": {"description": "Settled", **json_of(result)},
                    "400": {"description": "Malformed JSON; no status where a rule of the"
                            " token needs one; a status or cost that is not one", **error},
                    "401": {"description": "No valid bearer token", **error},
                    "404": {"description": "A token no check answered", **error},
                    "409": {"description": "Settled already, or the token expired", **error},
                    "413": {"description": "Body too large", **error},
                    "422": {"description": "Invalid request", **error},
                    "503": {"description": "The store is unavailable", **error},
                },
            }
        },
    }  # fmt: skip
    return paths, components
