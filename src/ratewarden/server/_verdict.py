"""What the service decided on one check, and what every front end reads off it.

A `Verdict` is the YAML rules' answer (`RulesVerdict`: the engine's `Outcome`,
and how many descriptors asked when Envoy's descriptors were matched against the
rules) or an envoy domain's `EnvoyResult`. Both envoy-shaped answers, the HTTP
API's ``statuses`` and ``headers`` and gRPC's DescriptorStatus list and
response_headers_to_add, are read here once (`descriptor_statuses`,
`answer_headers`), so that each front end writes its own answer from the
verdict and none goes through another's shape.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from ..envoy import EnvoyLimit, EnvoyResult
from ..kernel import rate_limit_headers
from ..primitives import Decision
from ..rules import Outcome
from ._shapes import DescriptorStatus

__all__ = [
    "UNLIMITED_REMAINING",
    "RulesVerdict",
    "Verdict",
    "allowed",
    "answer_headers",
    "descriptor_statuses",
    "finite",
]

UNLIMITED_REMAINING = 2**32 - 1  # what envoy's service says is left of an unlimited limit
Code = Literal["OK", "OVER_LIMIT"]  # a DescriptorStatus's


# msgspec structs, as the checks are: made for every request, and cheap to make
class RulesVerdict(msgspec.Struct, frozen=True):
    """The YAML rules' outcome; ``descriptors``: how many Envoy descriptors of
    the rules' own domain asked (each gets a status), None for attributes."""

    outcome: Outcome
    descriptors: int | None = None


Verdict = RulesVerdict | EnvoyResult


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def allowed(verdict: Verdict) -> bool:
    if isinstance(verdict, RulesVerdict):
        return verdict.outcome.allowed
    return verdict.overall_ok


def answer_headers(verdict: Verdict) -> dict[str, str]:
    """The headers to send (X-RateLimit-*, Retry-After, a rule's own)."""
    if isinstance(verdict, RulesVerdict):
        return verdict.outcome.header_fields()
    decision = verdict.decision
    return {} if decision is None else dict(rate_limit_headers(decision, ietf=False))


def descriptor_statuses(verdict: Verdict) -> list[DescriptorStatus] | None:
    """One status per descriptor asked about (None for attributes)."""
    if isinstance(verdict, RulesVerdict):
        if verdict.descriptors is None:
            return None
        return _rule_statuses(verdict.outcome, verdict.descriptors)
    return _envoy_statuses(verdict)


def _rule_statuses(outcome: Outcome, count: int) -> list[DescriptorStatus]:
    """Descriptors the YAML rules decided were checked as one request: each
    carries that request's code, and the first its counts."""
    decision = outcome.decision
    code: Code = "OK" if outcome.allowed else "OVER_LIMIT"
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
            max(decision.remaining, 0), finite(decision.reset_after),
        )  # fmt: skip
    return out


def _envoy_statuses(result: EnvoyResult) -> list[DescriptorStatus]:
    """As envoy's service gives them: each limit's own code and counts (a shadow
    limit's code is OK; an unlimited one's remaining is the largest uint32).
    Counting a request's limits at once gives only the Decision of the limit
    that spoke for it: the others get their code only."""
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
            out.append(_status(limit, own))
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
    code: Code = "OK" if decision.allowed or limit.shadow else "OVER_LIMIT"
    name = limit.name or limit.path
    if decision.degraded:
        return DescriptorStatus(code, name)
    per_unit = 0 if limit.blocked else decision.limit
    return DescriptorStatus(
        code, name, per_unit, limit.period, max(decision.remaining, 0),
        finite(decision.reset_after),
    )  # fmt: skip
