"""The HTTP API's checks in JSON: a decoded `CheckRequest` read into a `Check`
(`check_of`, where everything about it that can be wrong is refused), and a
`Verdict` written as a `CheckResult` (`check_result`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..envoy import EnvoyResult
from ..primitives import Decision
from ..rules import Outcome
from ._checker import AttributesCheck, Check, DescriptorsCheck
from ._refusals import InvalidRequest, Unprocessable
from ._shapes import BAD_COST, AttributeValue, CheckRequest, CheckResult, Descriptor, Shadow
from ._verdict import (
    RulesVerdict,
    Verdict,
    answer_headers,
    descriptor_statuses,
    finite,
)

_INF = float("inf")  # `finite`'s bound, compared inline: below it, a number

__all__ = ["attribute_problem", "check_of", "check_result", "envoy_result", "outcome_result"]


# -- the request ---------------------------------------------------------------------


def check_of(request: CheckRequest) -> Check:
    """The check a decoded request asks for; `InvalidRequest` (or `Unprocessable`)
    for what its types could not refuse. A batch reads every check before
    counting any."""
    cost = request.cost
    if not float(cost).is_integer():  # the decoder has held it to 1..MAX_COST
        raise Unprocessable(f"{BAD_COST}, got {cost!r}")
    if request.attributes is not None:
        if request.domain is not None or request.descriptors is not None:
            raise InvalidRequest("give either attributes or domain + descriptors, not both")
        problem = attribute_problem(request.attributes)
        if problem is not None:
            raise Unprocessable(problem)
        return AttributesCheck(request.attributes, int(cost))
    if request.domain is None or request.descriptors is None:
        raise InvalidRequest("give attributes, or a domain and at least one descriptor")
    entries = [[(e.key, e.value) for e in d.entries] for d in request.descriptors]
    if not entries or any(not e for e in entries):
        raise InvalidRequest("a check needs descriptors, each with at least one entry")
    overrides = _overrides(request.descriptors)
    return DescriptorsCheck(request.domain, entries, int(cost), overrides)


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


def _overrides(descriptors: Sequence[Descriptor]) -> list[tuple[int, str] | None] | None:
    """The descriptors' limit overrides (None without any)."""
    if all(d.limit is None for d in descriptors):
        return None
    out: list[tuple[int, str] | None] = []
    for d in descriptors:
        if d.limit is None:
            out.append(None)
            continue
        per_unit = d.limit.requests_per_unit
        if not float(per_unit).is_integer():
            raise InvalidRequest(f"requests_per_unit must be a whole number, got {per_unit!r}")
        out.append((int(per_unit), d.limit.unit))
    return out


# -- the answer ----------------------------------------------------------------------


def check_result(verdict: Verdict) -> CheckResult:
    """The verdict as the API answers it."""
    if not isinstance(verdict, RulesVerdict):
        return envoy_result(verdict)
    result = outcome_result(verdict.outcome)
    statuses = descriptor_statuses(verdict)
    if statuses is not None:
        result.statuses = statuses
    return result


def outcome_result(outcome: Outcome) -> CheckResult:
    """The rule engine's `Outcome` as the API answers it."""
    decision = outcome.decision
    if decision is None or decision.degraded:  # `_counts`, without a call on the hot path
        limit = remaining = reset = None
    else:
        limit, remaining, reset = decision.limit, max(decision.remaining, 0), None
        if decision.reset_after < _INF:
            reset = decision.reset_after
    retry = outcome.retry_after
    # the rule that denied, or, allowed, the one whose limit the numbers and the
    # headers describe (the closest to its limit). A rule of several rates names
    # each of its limits "name@rate", and a rule's own name has no "@" (_schema_checks)
    rule = outcome.rule.name if outcome.rule is not None else None
    if rule is None and decision is not None and decision.rule is not None:
        rule = decision.rule.partition("@")[0]
    response = outcome.response
    body = response.body if outcome.action == "shadow_ban" and response is not None else None
    shadow = outcome.shadow
    return CheckResult(
        outcome.allowed, outcome.action, outcome.status, rule, limit, remaining, reset,
        retry if retry < _INF else None, outcome.wait, decision is not None and decision.degraded,
        outcome.header_fields(), None if shadow is None else Shadow(shadow.allowed, shadow.rule),
        body=body, degrade=outcome.degrade,
        settle=msgspec.UNSET if outcome.settle is None else outcome.settle,
    )  # fmt: skip


def envoy_result(result: EnvoyResult) -> CheckResult:
    """An envoy domain's answer: 429 when over the limit."""
    decision = result.decision
    limit, remaining, reset = _counts(decision)
    retry = 0.0 if decision is None else finite(decision.retry_after)
    allowed = result.overall_ok
    shadow = result.shadow
    return CheckResult(
        allowed, "allow" if allowed else "reject", 200 if allowed else 429,
        None if decision is None else decision.rule, limit, remaining, reset,
        retry, 0.0, decision is not None and decision.degraded, answer_headers(result),
        None if shadow is None else Shadow(shadow.allowed, shadow.rule),
        descriptor_statuses(result) or [],
    )  # fmt: skip


def _counts(decision: Decision | None) -> tuple[int | None, int | None, float | None]:
    if decision is None or decision.degraded:
        return None, None, None
    return decision.limit, max(decision.remaining, 0), finite(decision.reset_after)
