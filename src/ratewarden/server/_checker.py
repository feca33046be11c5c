"""The checks: a `Checker` turns a parsed request (a `Check`, from whichever
front end: the HTTP API's JSON, a gateway's ``/auth``, gRPC) into a `Verdict`,
and counts it in the metrics and on the dashboard.

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
from typing import overload

import msgspec

from ..envoy import EnvoyResult, Override
from ..primitives import ConfigurationError
from ..rules import Outcome
from ._counters import Counters
from ._refusals import InvalidRequest
from ._rules_in_force import RulesInForce
from ._verdict import RulesVerdict, Verdict

__all__ = [
    "ENVOY_ALIASES",
    "AttributesCheck",
    "Check",
    "Checker",
    "DescriptorsCheck",
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


class Checker:
    """Takes a typed `Check` and gives a `Verdict`, counted in ``counters``:
    what both front ends call. ``rules``: the rules in force, read at each
    check (a reload swaps them while the service answers)."""

    def __init__(self, rules: RulesInForce, counters: Counters) -> None:
        self.rules = rules
        self.counters = counters
        self._engine = rules.engine  # one engine for the service's life: reloads swap its rules

    @overload
    async def decide(self, check: AttributesCheck, *, wait: bool = False) -> RulesVerdict: ...
    @overload
    async def decide(self, check: Check, *, wait: bool = False) -> Verdict: ...
    async def decide(self, check: Check, *, wait: bool = False) -> Verdict:
        """What the service says to ``check``, counted. ``wait``: a delay rule's
        wait is taken here (for a gateway, which cannot wait itself)."""
        if type(check) is AttributesCheck:
            outcome = await self.check_attributes(check.attributes, check.cost, wait=wait)
            return RulesVerdict(outcome)
        assert isinstance(check, DescriptorsCheck)
        rules = self.rules
        domain, descriptors = check.domain, check.descriptors
        if domain == rules.domain:
            attributes = descriptor_attributes(domain, descriptors)
            outcome = await self.check_attributes(attributes, check.cost)
            return RulesVerdict(outcome, len(descriptors))
        envoy = rules.envoy
        if envoy is None:  # no envoy files: every other domain is unknown, so OK
            self.counters.unknown_domain(domain, len(descriptors))
            return EnvoyResult(True, None, [None] * len(descriptors))
        try:
            answer = await envoy.acheck(domain, descriptors, check.cost, check.overrides)
        except ConfigurationError as exc:
            raise InvalidRequest(str(exc)) from None
        self.counters.envoy(answer)
        return answer

    async def check_attributes(
        self, attributes: Mapping[str, object], cost: int = 1, *, wait: bool = False
    ) -> Outcome:
        """The YAML rules' answer to ``attributes``, counted: one engine call."""
        engine = self._engine
        outcome = await engine.acheck(attributes, cost=cost, wait=wait)
        if outcome.limits:
            self.counters.rules(outcome, engine.ruleset)
        return outcome


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
