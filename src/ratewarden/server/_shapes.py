"""What the HTTP API and the gRPC service share, without I/O: the request and
answer shapes, and the translations between them and the rule engine.

A check is either **attributes** (``{"attributes": {"path": ..., "ip": ...}}``,
matched by the YAML rules; every value a string, null for "not given", and
``headers`` an object of strings) or **descriptors** in envoy's shape (``{"domain": ...,
"descriptors": [{"entries": [{"key": ..., "value": ...}]}]}``). Descriptors of a
domain configured with ``--envoy-config`` follow envoyproxy/ratelimit's
semantics (`ratewarden.rules.EnvoyConfig`); descriptors of the rules' own domain
(``--domain``, "ratewarden" by default) are merged into attributes and matched
by the YAML rules, so Envoy can use the same rule file as everything else.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec

from .._decision import Decision
from .._headers import rate_limit_headers
from ..rules import EnvoyLimit, EnvoyResult, Outcome

__all__ = [
    "MAX_BATCH",
    "MAX_COST",
    "BatchRequest",
    "BatchResult",
    "CheckRequest",
    "CheckResult",
    "Descriptor",
    "DescriptorStatus",
    "Entry",
    "Problem",
    "attribute_problem",
    "descriptor_attributes",
    "envoy_result",
    "outcome_result",
]

# hits_addend is a uint32 on envoy's wire; a cost above it is surely a mistake.
MAX_COST = 2**32 - 1
MAX_BATCH = 1000
MAX_DESCRIPTORS = 64
MAX_ENTRIES = 64
# Envoy's descriptor keys for what the YAML rules call by other names: a
# `remote_address` action sends the client address, `request_headers` actions
# carry what their descriptor_key says (path, method, ... by convention).
ENVOY_ALIASES = {"remote_address": "ip", "source_cluster": "source", "destination_cluster": "dest"}

# A float type only so that 3.0 is read as 3, as JSON Schema's "integer" allows;
# the document says integer and `whole_cost` refuses 2.5.
Cost = Annotated[float, msgspec.Meta(ge=1, le=MAX_COST)]


# What an attribute holds. Only strings go into counter keys: a number or a list
# would be turned into text first, and then 42 and "42", or ["a"] and "['a']",
# would share a counter. Null is the same as leaving the attribute out; an
# object is allowed for ``headers`` alone (`attribute_problem` says so).
AttributeValue = str | dict[str, str] | None


class Entry(msgspec.Struct, forbid_unknown_fields=True):
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    value: Annotated[str, msgspec.Meta(max_length=8192)]


class LimitOverride(msgspec.Struct, forbid_unknown_fields=True):
    """A descriptor's own limit, as envoy's RateLimitOverride: it replaces what an
    envoy domain's config says for the descriptor (the rules' domain ignores it)."""

    # a float type only so that 3.0 is read as 3 (see Cost); `overrides_of` refuses 2.5
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


class BatchResult(msgspec.Struct):
    results: list[CheckResult]


class Problem(msgspec.Struct):
    """Every 4xx and 5xx answer: what was wrong, in words."""

    error: str


def attribute_problem(attributes: dict[str, AttributeValue]) -> str | None:
    """What the decoder's types cannot say: an object is ``headers``' value and
    no other attribute's. None when the attributes are fine."""
    for value in attributes.values():  # the usual case, all strings, in a few steps
        if type(value) is not str:
            break
    else:
        if "headers" not in attributes:
            return None
    for name, value in attributes.items():
        if type(value) is dict:
            if name != "headers":
                return f"attribute {name!r} must be a string (or null), not an object"
        elif name == "headers" and value is not None:
            return "attribute 'headers' must be an object of strings (lower-case names)"
    return None


def whole_cost(cost: float) -> int:
    if not float(cost).is_integer():
        raise ValueError(f"cost must be a whole number, got {cost!r}")
    return int(cost)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _counts(decision: Decision | None) -> tuple[int | None, int | None, float | None]:
    if decision is None or decision.degraded:
        return None, None, None
    return decision.limit, max(decision.remaining, 0), _finite(decision.reset_after)


def _shadow(decision: Decision | None) -> Shadow | None:
    return None if decision is None else Shadow(decision.allowed, decision.rule)


def outcome_result(outcome: Outcome) -> CheckResult:
    """The rule engine's `Outcome` as the API answers it."""
    decision = outcome.decision
    limit, remaining, reset = _counts(decision)
    rule = outcome.rule.name if outcome.rule is not None else None
    if rule is None and decision is not None and not decision.allowed:
        rule = decision.rule
    response = outcome.response
    headers = dict(outcome.headers())
    body = None
    if outcome.action == "shadow_ban" and response is not None:
        headers.update(response.headers)
        body = response.body
    return CheckResult(
        outcome.allowed, outcome.action, outcome.status, rule, limit, remaining, reset,
        _finite(outcome.retry_after), outcome.wait, decision is not None and decision.degraded,
        headers, _shadow(outcome.shadow), body=body, degrade=outcome.degrade,
    )  # fmt: skip


def descriptor_attributes(
    domain: str, descriptors: Sequence[Sequence[tuple[str, str]]]
) -> dict[str, object]:
    """Descriptors of the rules' own domain as attributes for the YAML rules:
    every entry of every descriptor, later ones winning, envoy's names aliased
    (``remote_address`` is ``ip``), and the domain itself as ``domain``."""
    attributes: dict[str, object] = {"domain": domain}
    for entries in descriptors:
        for key, value in entries:
            attributes[ENVOY_ALIASES.get(key, key)] = value
    return attributes


UNLIMITED_REMAINING = 2**32 - 1  # what envoy's service says is left of an unlimited limit


def envoy_statuses(result: EnvoyResult) -> list[DescriptorStatus]:
    """One status per descriptor, as envoy's service gives them: each limit's own
    code and counts (a shadow limit's code is OK; an unlimited one's remaining
    is the largest uint32). Counting a request's limits at once gives only the
    Decision of the limit that spoke for it: the others get their code only."""
    decision = result.decision
    statuses = result.statuses
    spoken = False
    out: list[DescriptorStatus] = []
    for i, limit in enumerate(result.limits):
        own = statuses[i] if statuses else None
        if limit is None:
            out.append(DescriptorStatus("OK"))
        elif limit.unlimited:
            out.append(DescriptorStatus("OK", remaining=UNLIMITED_REMAINING))
        elif own is not None:
            status = _status(limit, own)
            if limit.shadow:
                status.code = "OK"
            out.append(status)
        elif (
            not spoken and not limit.shadow and decision is not None
            and decision.rule == limit.path
        ):  # fmt: skip
            spoken = True
            out.append(_status(limit, decision))
        else:
            out.append(DescriptorStatus("OK"))
    return out


def _status(limit: EnvoyLimit, decision: Decision) -> DescriptorStatus:
    code: Literal["OK", "OVER_LIMIT"] = "OK" if decision.allowed else "OVER_LIMIT"
    per_unit = 0 if limit.blocked else decision.limit
    if decision.degraded:
        return DescriptorStatus(code, limit.name or limit.path)
    return DescriptorStatus(
        code, limit.name or limit.path, per_unit, limit.period, max(decision.remaining, 0),
        _finite(decision.reset_after),
    )  # fmt: skip


def envoy_result(result: EnvoyResult) -> CheckResult:
    """An envoy-style check's answer: 429 when over the limit."""
    decision = result.decision
    limit, remaining, reset = _counts(decision)
    headers: dict[str, str] = {}
    retry: float | None = 0.0
    if decision is not None:
        headers = dict(rate_limit_headers(decision, ietf=False))
        retry = _finite(decision.retry_after)
    allowed = result.overall_ok
    return CheckResult(
        allowed, "allow" if allowed else "reject", 200 if allowed else 429,
        None if allowed or decision is None else decision.rule, limit, remaining, reset,
        retry, 0.0, decision is not None and decision.degraded, headers,
        _shadow(result.shadow), envoy_statuses(result),
    )  # fmt: skip


def rule_statuses(outcome: Outcome, count: int) -> list[DescriptorStatus]:
    """Statuses for descriptors the YAML rules decided: they were checked as one
    request, so each carries that request's code, and the first its counts."""
    decision = outcome.decision
    code: Literal["OK", "OVER_LIMIT"] = "OK" if outcome.allowed else "OVER_LIMIT"
    out = [DescriptorStatus(code) for _ in range(count)]
    if out and decision is not None and not decision.degraded:
        rule = outcome.rule.name if outcome.rule is not None else decision.rule
        period = None
        for applicable in outcome.limits:
            if applicable.limit.name == decision.rule:
                period = applicable.limit.rate.period
                break
        out[0] = DescriptorStatus(
            code, rule, decision.limit, None if period is None else math.ceil(period),
            max(decision.remaining, 0), _finite(decision.reset_after),
        )  # fmt: skip
    return out


def overrides_of(descriptors: Sequence[Descriptor]) -> list[tuple[int, str] | None] | None:
    """The descriptors' limit overrides (None without any); `ValueError` for a
    requests_per_unit that is not a whole number."""
    if all(d.limit is None for d in descriptors):
        return None
    out: list[tuple[int, str] | None] = []
    for d in descriptors:
        if d.limit is None:
            out.append(None)
            continue
        per_unit = d.limit.requests_per_unit
        if not float(per_unit).is_integer():
            raise ValueError(f"requests_per_unit must be a whole number, got {per_unit!r}")
        out.append((int(per_unit), d.limit.unit))
    return out


def entries_of(descriptors: Sequence[Descriptor]) -> list[list[tuple[str, str]]]:
    return [[(e.key, e.value) for e in d.entries] for d in descriptors]


def bearer_matches(header: bytes, token: bytes) -> bool:
    """An ``Authorization`` value carries ``token`` as a bearer token. The scheme
    is case-insensitive (RFC 7235); the token is compared in constant time."""
    scheme, _, sent = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(sent.strip(), token)
