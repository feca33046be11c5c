"""`Tally`: the checks an engine answered, counted by rule as plain ints.

It is the one place a check is counted. The service counts every check into its
tally, and both its Prometheus ``/metrics`` and its OpenTelemetry instruments read
that tally when they are collected (`ratewarden.otel`); a library's engine is
counted into one by `ratewarden.otel.instrument`. Counting is a dict increment
on the caller's thread: no lock, no metrics library on the request path.

Every count is labelled by a rule's name (or an envoy configuration's node path),
which the configuration fixes, never by a key: keys are unbounded and may be
personal data.
"""

from __future__ import annotations

from ..primitives import Decision
from ._actions import Outcome
from ._compile import RuleSet

__all__ = ["LATENCY_BUCKETS", "NEAR", "Tally"]

NEAR = 0.8  # "near the limit": 80% or more of it used

# The bounds of the latency histograms (seconds), /metrics' and OpenTelemetry's alike:
# a check on the memory store takes tens of microseconds, one on Redis a millisecond
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
                   2.5)  # fmt: skip


class Tally:
    """Counts by rule name: ``checks`` (requests a rule applied to),
    ``over_limit`` (requests a rule denied), ``near_limit`` (admitted with `NEAR`
    or more of the closest limit used), ``shadow_over_limit`` (requests a
    ``log_only`` rule would have denied), ``degraded`` (requests a degrade rule
    let through with a level above 0); ``store_errors``: checks the store could
    not decide (answered by the failure policy). Live dicts: readers copy what
    they need (``list(d.items())``) while the counting thread goes on."""

    __slots__ = ("checks", "degraded", "near_limit", "over_limit", "shadow_over_limit",
                 "store_errors")  # fmt: skip

    def __init__(self) -> None:
        self.checks: dict[str, int] = {}
        self.over_limit: dict[str, int] = {}
        self.near_limit: dict[str, int] = {}
        self.shadow_over_limit: dict[str, int] = {}
        self.degraded: dict[str, int] = {}
        self.store_errors = 0

    def count(
        self,
        rules: list[str],
        decision: Decision | None,
        denied_by: str | None,
        closest: str | None,
        shadow_denied_by: str | None,
    ) -> None:
        """One check: ``rules`` applied; ``decision`` is the enforced limits';
        ``denied_by`` the rule that denied, ``closest`` the rule whose limit spoke
        for the request, ``shadow_denied_by`` a log_only rule that would have denied."""
        checks = self.checks
        for rule in rules:
            checks[rule] = checks.get(rule, 0) + 1
        if decision is not None:
            if decision.degraded:
                self.store_errors += 1
            elif denied_by is not None:
                self.over_limit[denied_by] = self.over_limit.get(denied_by, 0) + 1
            elif closest is not None and decision.remaining <= decision.limit * (1 - NEAR):
                self.near_limit[closest] = self.near_limit.get(closest, 0) + 1
        if shadow_denied_by is not None:
            shadow = self.shadow_over_limit
            shadow[shadow_denied_by] = shadow.get(shadow_denied_by, 0) + 1

    def outcome(self, outcome: Outcome, ruleset: RuleSet) -> tuple[str | None, str | None]:
        """Count a check the rules of ``ruleset`` answered with ``outcome`` (one
        that met at least one limit); the rule that denied it and the log_only
        rule that would have, for callers that show them (the dashboard)."""
        rules: list[str] = []
        for applicable in outcome.limits:  # a loop: a generator costs a call a limit
            name = applicable.rule.name
            if name not in rules:
                rules.append(name)
        decision = outcome.decision
        by_limit = ruleset.by_limit_name
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
        # `count` written out: a call less on every check of the service
        checks = self.checks
        for name in rules:
            checks[name] = checks.get(name, 0) + 1
        if decision is not None:
            if decision.degraded:
                self.store_errors += 1
            elif denied is not None:
                self.over_limit[denied] = self.over_limit.get(denied, 0) + 1
            elif closest is not None and decision.remaining <= decision.limit * (1 - NEAR):
                self.near_limit[closest] = self.near_limit.get(closest, 0) + 1
        if shadow_denied is not None:
            shadows = self.shadow_over_limit
            shadows[shadow_denied] = shadows.get(shadow_denied, 0) + 1
        if outcome.degrade and outcome.rule is not None:
            name = outcome.rule.name
            self.degraded[name] = self.degraded.get(name, 0) + 1
        return denied, shadow_denied

    def __repr__(self) -> str:
        return (
            f"<Tally checks={sum(self.checks.values())} "
            f"over_limit={sum(self.over_limit.values())} store_errors={self.store_errors}>"
        )
