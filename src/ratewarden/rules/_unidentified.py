"""What the rule engine answers for a request whose caller could not be
identified (the application's ``identify`` raised). No I/O.

A rule *needs the identity* when its ``by`` or its ``match.attributes`` read an
attribute that the request itself does not give (`REQUEST_ATTRIBUTES`; a
``header:...`` is the request's): ``user``, ``plan``, ``api_key``, ... Without
the identity such a rule has no key to count, so it answers as its
``on_failure`` says, as it does when its store cannot decide:

- ``fail_closed``: the request is refused as the rule refuses (its status, or a
  ``shadow_ban``'s response), marked degraded and counted nowhere;
- ``fail_open``, ``local_fallback`` (no key to count by locally either) and
  ``raise`` (a front end lets a request through when the limiter raises): the
  rule lets the request through.

Only rules that could apply to the request take part: their paths, methods and
conditions on request attributes hold (a condition on an identity attribute
might), and no rule of their group that does apply ranks first. ``log_only``
and ``degrade`` rules never refuse a request and take no part. Every other rule
applies as usual to the attributes the request has, so a ``by: ip`` fallback in
a user rule's group still counts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..primitives import Decision
from ._actions import Outcome
from ._compile import Applicable, CompiledRule, LimitSpec, RuleSet
from ._paths import normalize_path
from ._rule import as_text, normal_method

__all__ = ["REQUEST_ATTRIBUTES", "RETRY_AFTER", "IdentityRules", "needs_identity", "refusal"]

# What a front end reads from the request itself, identity or not.
REQUEST_ATTRIBUTES = frozenset(("method", "path", "ip", "headers", "body_size", "route"))

# Seconds a refused client is told to wait: ``identify`` may work again soon.
RETRY_AFTER = 1.0

_NEVER_REFUSE = ("log_only", "degrade")


def _of_request(name: str) -> bool:
    return name in REQUEST_ATTRIBUTES or name.startswith("header:")


def needs_identity(rule: CompiledRule) -> bool:
    """Whether the rule's key or its match reads an attribute the request lacks
    without its identity."""
    read = [*rule.by, *(name for name, _ in rule.attributes)]
    return not all(_of_request(name) for name in read)


class IdentityRules:
    """The ``fail_closed`` rules of ``ruleset`` that need the identity, in rank
    order, each ready to be matched without it."""

    __slots__ = ("_rules", "ruleset")

    def __init__(self, ruleset: RuleSet) -> None:
        self.ruleset = ruleset
        rules = sorted(
            (
                rule
                for rule in ruleset.rules
                if rule.action not in _NEVER_REFUSE
                and rule.limits  # a concurrency rule without a rate counts nothing here
                and rule.limits[0].on_failure == "fail_closed"
                and needs_identity(rule)
            ),
            key=lambda rule: rule.rank,
        )
        self._rules = tuple(
            (
                rule,
                tuple(re.compile(pattern.regex) for pattern in rule.paths),
                tuple((n, values) for n, values in rule.attributes if _of_request(n)),
            )
            for rule in rules
        )

    def __len__(self) -> int:
        return len(self._rules)

    def refusing(
        self, attributes: Mapping[str, object], applicable: Sequence[Applicable]
    ) -> CompiledRule | None:
        """The first-ranked rule that would refuse the request (``attributes``
        without its identity; ``applicable``, what applies to them), or None."""
        if not self._rules:
            return None
        path = attributes.get("path")
        path = normalize_path(path) if isinstance(path, str) else None
        method = normal_method(attributes.get("method"))
        for rule, patterns, conditions in self._rules:
            if patterns and (path is None or not any(p.fullmatch(path[1:]) for p in patterns)):
                continue
            if rule.methods is not None and method not in rule.methods:
                continue
            if any(as_text(attributes.get(n)) not in values for n, values in conditions):
                continue
            group = rule.group_key
            if any(a.rule.group_key == group and a.rule.rank < rule.rank for a in applicable):
                continue  # its group goes to a rule that applies and ranks first
            return rule
        return None


def refusal(rule: CompiledRule, specs: Sequence[LimitSpec]) -> Outcome:
    """How ``rule`` refuses a request it cannot count: its action's answer, with
    a degraded Decision of its first limit (as in force: ``specs`` by slot)."""
    slot = rule.slots[0]
    spec = specs[slot]
    size = spec.rate.limit if spec.burst is None else spec.burst
    decision = Decision(False, size, 0, RETRY_AFTER, RETRY_AFTER, spec.name, True)
    limit = Applicable(rule, slot, "", rule.cost, spec)
    if rule.action == "shadow_ban":
        response = rule.response
        return Outcome(
            False, "shadow_ban", decision, rule, response.status, RETRY_AFTER, 0.0, response,
            limits=(limit,),
        )  # fmt: skip
    return Outcome(False, "reject", decision, rule, rule.status, RETRY_AFTER, limits=(limit,))
