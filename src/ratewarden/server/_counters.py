"""What the service counts as it answers: the Prometheus metrics, the
dashboard's figures and envoy's statistics, one set for the process, and the
ways a check and a reload are counted in them. A reload keeps them counting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..envoy import EnvoyResult, EnvoyStats
from ._dashstats import DashboardStats
from ._metrics import Metrics

if TYPE_CHECKING:
    from ..rules import Outcome, RuleSet

__all__ = ["Counters"]


class Counters:
    """The service's counters. ``near_limit_ratio``: envoy's near-limit mark;
    ``quota_members``: the fleet quotas' gauges per member too."""

    def __init__(self, *, near_limit_ratio: float, quota_members: bool = False) -> None:
        self.envoy_stats = EnvoyStats(near_limit_ratio=near_limit_ratio)
        self.metrics = Metrics(quota_members=quota_members, envoy=self.envoy_stats)
        self.dashboard = DashboardStats.for_metrics(self.metrics)
        # where every check is counted, once: /metrics and OpenTelemetry read it
        self.tally = self.metrics.tally

    def rules(self, outcome: Outcome, ruleset: RuleSet) -> None:
        """A check the YAML rules of ``ruleset`` answered with ``outcome``."""
        if not outcome.limits:
            return
        denied, shadow_denied = self.tally.outcome(outcome, ruleset)
        dashboard = self.dashboard
        dashboard.requests += 1
        if denied is not None or shadow_denied is not None:
            dashboard.limited(outcome, denied, shadow_denied)

    def envoy(self, answer: EnvoyResult) -> None:
        """A check an envoy domain answered."""
        rules = [limit.path for limit in answer.limits if limit is not None]
        decision = answer.decision
        denied = decision.rule if decision is not None and not answer.overall_ok else None
        closest = decision.rule if decision is not None else None
        shadow = answer.shadow
        shadow_denied = shadow.rule if shadow is not None and not shadow.allowed else None
        self.tally.count(rules, decision, denied, closest, shadow_denied)
        if rules:
            self.dashboard.requests += 1
            if denied is not None or shadow_denied is not None:
                self.dashboard.limited_envoy(answer, denied, shadow_denied)

    def unknown_domain(self, domain: str, descriptors: int) -> None:
        """A check of a domain no configuration names: envoy counts each descriptor."""
        for _ in range(descriptors):
            self.envoy_stats.domain_not_found(domain)

    def reloaded(self, rules: int | None, *, shown: bool = True) -> None:
        """A reload put its files in force; ``rules``: how many rules, if the
        rule file was among them; ``shown``: on the dashboard too (which shows
        the rule file's reloads, not the envoy files' watcher's)."""
        if rules is not None:
            self.metrics.rules.set(rules)
        self.metrics.reloads.labels("ok").inc()
        if shown:
            self.dashboard.reload_done(None)

    def reload_failed(self, error: str, *, shown: bool = True) -> None:
        """A reload that put nothing in force; ``shown`` as for `reloaded`."""
        self.metrics.reloads.labels("failed").inc()
        if shown:
            self.dashboard.reload_done(error)
