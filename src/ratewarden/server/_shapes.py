"""The HTTP API's request and answer shapes (msgspec types: what the app
decodes and encodes, and what ``openapi()`` documents), and the bounds on a
request that the gRPC service holds its requests to as well.

A check is either **attributes** (``{"attributes": {"path": ..., "ip": ...}}``,
matched by the YAML rules; every value a string, null for "not given", and
``headers`` an object of strings) or **descriptors** in envoy's shape (``{"domain": ...,
"descriptors": [{"entries": [{"key": ..., "value": ...}]}]}``); `_checker` says how
each is decided. And how a bearer token is read from ``Authorization``, which
both listeners check.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Literal

import msgspec

__all__ = [
    "BAD_COST",
    "MAX_BATCH",
    "MAX_COST",
    "MAX_DESCRIPTORS",
    "MAX_ENTRIES",
    "AttributeValue",
    "BatchRequest",
    "BatchResult",
    "CheckRequest",
    "CheckResult",
    "Descriptor",
    "DescriptorStatus",
    "Entry",
    "LimitOverride",
    "Problem",
    "Shadow",
    "bearer_matches",
]

# hits_addend is a uint32 on envoy's wire; a cost above it is surely a mistake.
MAX_COST = 2**32 - 1
MAX_BATCH = 1000
MAX_DESCRIPTORS = 64
MAX_ENTRIES = 64

# A float type only so that 3.0 is read as 3, as JSON Schema's "integer" allows;
# the document says integer and `check_of` refuses 2.5. Every bad cost, whatever
# refuses it, is answered with this one message (`BAD_COST`).
Cost = Annotated[float, msgspec.Meta(ge=1, le=MAX_COST)]
BAD_COST = f"cost must be a whole number from 1 to {MAX_COST}"


# What an attribute holds. Only strings go into counter keys: a number or a list
# would be turned into text first, and then 42 and "42", or ["a"] and "['a']",
# would share a counter. Null is the same as leaving the attribute out; an
# object is allowed for ``headers`` alone (`check_of` says so).
AttributeValue = str | dict[str, str] | None


class Entry(msgspec.Struct, forbid_unknown_fields=True):
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    value: Annotated[str, msgspec.Meta(max_length=8192)]


class LimitOverride(msgspec.Struct, forbid_unknown_fields=True):
    """A descriptor's own limit, as envoy's RateLimitOverride: it replaces what an
    envoy domain's config says for the descriptor (the rules' domain ignores it)."""

    # a float type only so that 3.0 is read as 3 (see Cost); `check_of` refuses 2.5
    requests_per_unit: Annotated[float, msgspec.Meta(ge=0, le=2**32 - 1)]
    unit: Literal["second", "minute", "hour", "day", "week", "month", "year"]


class Descriptor(msgspec.Struct, forbid_unknown_fields=True):
    entries: Annotated[list[Entry], msgspec.Meta(min_length=1, max_length=MAX_ENTRIES)]
    limit: LimitOverride | None = None


class CheckRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Either ``attributes`` or ``domain`` + ``descriptors``; ``cost`` is how many
    requests this one counts as (every rule's own cost is multiplied by it)."""

    attributes: dict[str, AttributeValue] | None = None
    domain: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    descriptors: (
        Annotated[list[Descriptor], msgspec.Meta(min_length=1, max_length=MAX_DESCRIPTORS)] | None
    ) = None
    cost: Cost = 1


class BatchRequest(msgspec.Struct, forbid_unknown_fields=True):
    checks: Annotated[list[CheckRequest], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


class DescriptorStatus(msgspec.Struct, omit_defaults=True):
    """One descriptor's answer, as envoy's DescriptorStatus: ``limit`` and the
    counts are given for the descriptor whose limit spoke for the request."""

    code: Literal["OK", "OVER_LIMIT"]
    limit: str | None = None
    requests_per_unit: int | None = None
    unit_seconds: int | None = None
    remaining: int | None = None
    reset_after: float | None = None


class Shadow(msgspec.Struct):
    """What the ``log_only`` (or shadow_mode) limits would have said."""

    allowed: bool
    rule: str | None


class CheckResult(msgspec.Struct):
    """The answer to one check. ``allowed``: let it through; ``action`` what to do
    (allow, reject, delay (hold ``wait`` seconds, then check again), shadow_ban,
    queue (allowed: hold ``wait`` seconds, then let it through, without checking
    again), degrade (allowed: serve less, by ``degrade``, 0 to 1)); ``status``:
    the HTTP status to answer; ``headers``: the headers to send (X-RateLimit-*,
    RateLimit, RateLimit-Policy, Retry-After, a degrade rule's own)."""

    allowed: bool
    action: Literal["allow", "reject", "delay", "shadow_ban", "queue", "degrade"]
    status: int
    rule: str | None
    limit: int | None
    remaining: int | None
    reset_after: float | None
    retry_after: float | None  # null: no retry can ever pass (a cost above the limit)
    wait: float
    degraded: bool
    headers: dict[str, str]
    shadow: Shadow | None = None
    statuses: list[DescriptorStatus] | None = None
    body: str | None = None  # what a shadow-banned request is answered
    degrade: float = 0.0  # how much to degrade the response: 0 (not at all) to 1
    # allowed, with a rule that counts by response or settles its cost: the token
    # for /v1/settle once the request ran; absent otherwise, so that an answer
    # without such a rule reads as it always did
    settle: str | msgspec.UnsetType = msgspec.UNSET


class BatchResult(msgspec.Struct):
    results: list[CheckResult]


class Problem(msgspec.Struct):
    """Every 4xx and 5xx answer: what was wrong, in words."""

    error: str


def bearer_matches(header: bytes, token: bytes) -> bool:
    """An ``Authorization`` value carries ``token`` as a bearer token. The scheme
    is case-insensitive (RFC 7235); the token is compared in constant time."""
    scheme, _, sent = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(sent.strip(), token)
