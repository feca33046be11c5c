"""The checks: `decide` turns a parsed request (a `Check`, from whichever front
end: the HTTP API's JSON, a gateway's ``/auth``, gRPC) into a `Verdict`, and
counts it in the metrics and on the dashboard.

A check is either **attributes**, matched by the YAML rules, or a **domain and
Envoy's descriptors**. Descriptors of the rules' own domain (``--domain``,
"ratewarden" by default) are merged into attributes and matched by the YAML
rules, so Envoy can use the same rule file as everything else; those of a
domain configured with ``--envoy-config`` follow envoyproxy/ratelimit's
semantics (`ratewarden.rules.EnvoyConfig`); any other domain has no limits
(envoy's answer for a domain it does not know). Each check is one engine call.

A front end validates what it parsed, the cost among it, where it parses it,
and hands over a `Check` that is valid: nothing here checks it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, overload

import msgspec

from .._errors import ConfigurationError
from ..envoy import EnvoyResult, Override
from ._refusals import InvalidRequest
from ._verdict import RulesVerdict, Verdict

if TYPE_CHECKING:
    from ..rules import Outcome
    from ._service import Service

__all__ = [
    "ENVOY_ALIASES",
    "AttributesCheck",
    "Check",
    "DescriptorsCheck",
    "check_attributes",
    "decide",
    "descriptor_attributes",
    "descriptors_check",
]

# Envoy's descriptor keys for what the YAML rules call by other names: a
# `remote_address` action sends the client address, `request_headers` actions
# carry what their descriptor_key says (path, method, ... by convention).
ENVOY_ALIASES = {"remote_address": "ip", "source_cluster": "source", "destination_cluster": "dest"}


# msgspec structs, not dataclasses: one is made for every request, and a struct
# costs a quarter of what a frozen dataclass does to make
class AttributesCheck(msgspec.Struct, frozen=True):
    """Attributes for the YAML rules; ``cost``: how many requests this one
    counts as, a whole number >= 1."""

    attributes: Mapping[str, object]
    cost: int = 1


class DescriptorsCheck(msgspec.Struct, frozen=True):
    """A ``domain`` and its ``descriptors`` (each a list of (key, value)
    entries), with each descriptor's limit override if any; ``cost`` as above."""

    domain: str
    descriptors: Sequence[Sequence[tuple[str, str]]]
    cost: int = 1
    overrides: Sequence[Override | None] | None = None


Check = AttributesCheck | DescriptorsCheck


@overload
async def decide(
    service: Service, check: AttributesCheck, *, wait: bool = False
) -> RulesVerdict: ...
@overload
async def decide(service: Service, check: Check, *, wait: bool = False) -> Verdict: ...
async def decide(service: Service, check: Check, *, wait: bool = False) -> Verdict:
    """What the service says to ``check``, counted. ``wait``: a delay rule's
    wait is taken here (for a gateway, which cannot wait itself)."""
    # the rules are asked through the service's method, not its engine: one
    # place every attribute check passes, for a Service subclass to wrap
    if isinstance(check, AttributesCheck):
        outcome = await service.check_attributes(check.attributes, check.cost, wait=wait)
        return RulesVerdict(outcome)
    domain, descriptors = check.domain, check.descriptors
    if domain == service.domain:
        attributes = descriptor_attributes(domain, descriptors)
        outcome = await service.check_attributes(attributes, check.cost)
        return RulesVerdict(outcome, len(descriptors))
    envoy = service.envoy
    if envoy is None:  # no envoy files: every other domain is unknown, so OK
        for _ in descriptors:
            service.envoy_stats.domain_not_found(domain)
        return EnvoyResult(True, None, [None] * len(descriptors))
    try:
        answer = await envoy.acheck(domain, descriptors, check.cost, check.overrides)
    except ConfigurationError as exc:
        raise InvalidRequest(str(exc)) from None
    _count_envoy(service, answer)
    return answer


def descriptors_check(
    domain: str,
    descriptors: Sequence[Sequence[tuple[str, str]]],
    cost: int,
    overrides: Sequence[Override | None] | None,
    *,
    rules_domain: str,
) -> DescriptorsCheck:
    """A check of Envoy's descriptors as its protocol may send them: at least
    one descriptor, and in the rules' domain none empty (an envoy domain's
    empty descriptor has no limit, OK, as in envoy's service; the rules would
    read it as a request without attributes). `InvalidRequest` otherwise."""
    if not descriptors:
        raise InvalidRequest("a check needs at least one descriptor")
    if domain == rules_domain and any(not entries for entries in descriptors):
        raise InvalidRequest("every descriptor needs at least one entry")
    return DescriptorsCheck(domain, descriptors, cost, overrides)


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


async def check_attributes(
    service: Service, attributes: Mapping[str, object], cost: int = 1, *, wait: bool = False
) -> Outcome:
    """The YAML rules' answer to ``attributes``, counted: one engine call."""
    outcome = await service.engine.acheck(attributes, cost=cost, wait=wait)
    _count_rules(service, outcome)
    return outcome


def _count_rules(service: Service, outcome: Outcome) -> None:
    if not outcome.limits:
        return
    rules = list(dict.fromkeys(a.rule.name for a in outcome.limits))
    decision = outcome.decision
    by_limit = service.engine.ruleset.by_limit_name
    closest = None
    if decision is not None and decision.rule is not None:
        rule = by_limit.get(decision.rule)
        closest = None if rule is None else rule.name
    denied = None
    if not outcome.allowed:
        denied = outcome.rule.name if outcome.rule is not None else closest
    shadow = outcome.shadow
    shadow_denied = None
    if shadow is not None and not shadow.allowed and shadow.rule is not None:
        rule = by_limit.get(shadow.rule)
        shadow_denied = shadow.rule if rule is None else rule.name
    service.metrics.count(rules, decision, denied, closest, shadow_denied)
    if outcome.degrade and outcome.rule is not None:
        service.metrics.degraded(outcome.rule.name)
    service.dashboard.requests += 1
    if denied is not None or shadow_denied is not None:
        service.dashboard.limited(outcome, denied, shadow_denied)


def _count_envoy(service: Service, answer: EnvoyResult) -> None:
    rules = [limit.path for limit in answer.limits if limit is not None]
    decision = answer.decision
    denied = decision.rule if decision is not None and not answer.overall_ok else None
    closest = decision.rule if decision is not None else None
    shadow = answer.shadow
    shadow_denied = shadow.rule if shadow is not None and not shadow.allowed else None
    service.metrics.count(rules, decision, denied, closest, shadow_denied)
    if rules:
        service.dashboard.requests += 1
        if denied is not None or shadow_denied is not None:
            service.dashboard.limited_envoy(answer, denied, shadow_denied)
