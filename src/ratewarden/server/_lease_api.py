"""``POST /v1/acquire``, ``POST /v1/renew`` and ``POST /v1/release``: the
concurrency rules' slots over HTTP, for a caller that can say when its request
ends.

An acquire is a check (the same attributes, the rates counted the same way)
that also takes a slot of every concurrency rule the request meets. Allowed,
it answers the ``lease_id`` that gives the slots back and the ``lease``
(seconds until they end on their own); refused, the rule's status (429 unless
it says 503) with Retry-After. A release answers 404 for a lease id no
acquire handed out or one released already, and 409 for a lease that had
ended (its slots are reclaimed): the caller learns that its request outlived
the rule's ``lease``. A caller whose request may outlive the ``lease``
renews its lease id before it ends: each slot then ends a rule's ``lease``
after the renewal; a renew answers 404 and 409 as a release does.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ..rules import AsyncRuleEngine, BadToken, LeaseGone
from ._check_json import attribute_problem, outcome_result
from ._counters import Counters
from ._http_input import parse, scan_duplicates
from ._refusals import Unprocessable
from ._shapes import AttributeValue, CheckResult, Cost

__all__ = [
    "AcquireRequest",
    "AcquireResult",
    "ReleaseRequest",
    "ReleaseResult",
    "RenewResult",
    "acquire",
    "lease_openapi_paths",
    "release",
    "renew",
]

MAX_LEASE_ID = 16_384  # characters; an acquire's lease ids are far shorter


class AcquireRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The request's ``attributes`` (as a check's); ``cost`` multiplies what the
    rates charge (a request holds one slot whatever its cost); ``wait``: a
    ``delay`` rule's request waits here for a slot (up to its ``max_wait``)."""

    attributes: dict[str, AttributeValue]
    cost: Cost = 1
    wait: bool = False


class AcquireResult(CheckResult):
    """A check's answer, and when allowed with concurrency rules applying,
    ``lease_id`` (give it to ``/v1/release`` when the request ends), ``lease``
    (seconds until the slots end on their own) and the ``holds``' rule names."""

    lease_id: str | None = None
    lease: float | None = None
    holds: list[str] = msgspec.field(default_factory=list)


class ReleaseRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The ``lease_id`` an acquire answered."""

    lease_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LEASE_ID)]


class ReleaseResult(msgspec.Struct):
    """How many slots went back, and their rules."""

    released: int
    rules: list[str]


class RenewResult(msgspec.Struct):
    """``lease``: seconds until the first of the renewed slots ends (renew again
    before then)."""

    lease: float


_decode_acquire = msgspec.json.Decoder(AcquireRequest).decode
_decode_release = msgspec.json.Decoder(ReleaseRequest).decode
_encode = msgspec.json.Encoder().encode


class LeaseError(Exception):
    """A release or renew the service refuses: ``status`` (404 or 409) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def acquire(
    engine: AsyncRuleEngine, counters: Counters, body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """The status, the headers and the body of an acquire."""
    request: AcquireRequest = parse(_decode_acquire, body)
    scan_duplicates(body)
    if not float(request.cost).is_integer():
        raise Unprocessable(f"cost must be a whole number, got {request.cost!r}")
    problem = attribute_problem(request.attributes)
    if problem is not None:
        raise Unprocessable(problem)
    admission = await engine.aacquire(request.attributes, wait=request.wait, cost=int(request.cost))
    outcome = admission.outcome
    if outcome.limits:
        counters.rules(outcome, engine.ruleset)
    fields = msgspec.structs.asdict(outcome_result(outcome))
    result = AcquireResult(**fields, lease_id=admission.token, lease=admission.lease,
                           holds=[rule for rule, _ in admission.holds])  # fmt: skip
    # refused: the rule's status, so that a caller that reads only the status
    # cannot take a refusal for a slot
    status = 200 if outcome.allowed else (outcome.status if outcome.status >= 400 else 429)
    return status, outcome.header_fields(), _encode(result)


async def release(engine: AsyncRuleEngine, body: bytes) -> bytes:
    """The body of a release; `LeaseError` when its slots are not held."""
    request: ReleaseRequest = parse(_decode_release, body)
    scan_duplicates(body)
    try:
        holds = await engine.arelease(request.lease_id)
    except (BadToken, LeaseGone) as exc:
        raise _refused(exc) from None
    return _encode(ReleaseResult(len(holds), [rule for rule, _ in holds]))


async def renew(engine: AsyncRuleEngine, body: bytes) -> bytes:
    """The body of a renew; `LeaseError` when a slot is not held (the others
    are renewed)."""
    request: ReleaseRequest = parse(_decode_release, body)
    scan_duplicates(body)
    try:
        lease = await engine.arenew(request.lease_id)
    except (BadToken, LeaseGone) as exc:
        raise _refused(exc) from None
    return _encode(RenewResult(lease))


def _refused(exc: BadToken | LeaseGone) -> LeaseError:
    if isinstance(exc, BadToken):
        return LeaseError(404, "no such lease: give the lease_id /v1/acquire answered")
    return LeaseError(409 if exc.expired else 404, str(exc))


def lease_openapi_paths(problem: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The paths of these endpoints for the OpenAPI document, and their schemas."""
    (acquire_request, acquired, release_request, released, renewed), components = (
        msgspec.json.schema_components(
            [AcquireRequest, AcquireResult, ReleaseRequest, ReleaseResult, RenewResult],
            ref_template="#/components/schemas/{name}",
        )
    )
    components["AcquireRequest"]["properties"]["cost"]["type"] = "integer"

    def json_of(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {"application/json": {"schema": schema}}}

    error = json_of(problem)
    bad = {
        "400": {"description": "Malformed JSON", **error},
        "401": {"description": "No valid bearer token", **error},
        "413": {"description": "Body too large", **error},
        "422": {"description": "Invalid request", **error},
        "503": {"description": "The store is unavailable", **error},
    }
    paths = {
        "/v1/acquire": {
            "post": {
                "operationId": "acquire",
                "summary": "A check that also takes a slot of each concurrency rule the request"
                " meets: release it with the lease_id when the request ends",
                "requestBody": {"required": True, **json_of(acquire_request)},
                "responses": {
                    "200": {"description": "Allowed; lease_id names the slots",
                            **json_of(acquired)},
                    "429": {"description": "Refused (Retry-After says when to try again)",
                            **json_of(acquired)},
                    **bad,
                },
            }
        },
        "/v1/renew": {
            "post": {
                "operationId": "renew",
                "summary": "Push the slots of an acquire on: each ends its rule's lease after"
                " this (a request that may outlive the lease renews before it ends)",
                "requestBody": {"required": True, **json_of(release_request)},
                "responses": {
                    "200": {"description": "Renewed; lease is the seconds until the first"
                            " slot ends", **json_of(renewed)},
                    "404": {"description": "No such lease, released already, or a slot's"
                            " rule is no longer in force", **error},
                    "409": {"description": "A slot's lease had ended: its slot is reclaimed"
                            " (the detail says which; the others are renewed)", **error},
                    **bad,
                },
            }
        },
        "/v1/release": {
            "post": {
                "operationId": "release",
                "summary": "Give back the slots of an acquire",
                "requestBody": {"required": True, **json_of(release_request)},
                "responses": {
                    "200": {"description": "Released", **json_of(released)},
                    "404": {"description": "No such lease, or released already", **error},
                    "409": {"description": "The lease had ended: its slots are reclaimed",
                            **error},
                    **bad,
                },
            }
        },
    }  # fmt: skip
    return paths, components
