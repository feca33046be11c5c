"""Prometheus metrics of the service, in a registry of its own (one per app, so
tests and embedded apps never share counters).

Labels are bounded: ``rule`` takes rule names (or envoy config node paths), which
the rule files fix; ``endpoint`` takes route names; never a raw key or path.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .._decision import Decision

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

NEAR = 0.8  # "near the limit": 80% or more of it used

# Latency of a check inside the server (the store call included), in seconds.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5)


class _RuleCounters:
    """The per-rule counters as plain ints, made into metric families only when
    scraped: four prometheus-client ``inc()`` calls (a lock each) cost a fifth of
    a check's time in the server; dict increments on the event loop's one thread
    cost next to nothing."""

    _FAMILIES = (
        ("ratewarden_checks", "Requests a rule applied to"),
        ("ratewarden_over_limit", "Requests a rule denied"),
        ("ratewarden_near_limit", "Requests admitted with 80% or more of the closest limit used"),
        ("ratewarden_shadow_over_limit", "Requests a log_only (shadow) rule would have denied"),
    )

    def __init__(self) -> None:
        self.counts: tuple[dict[str, int], ...] = tuple({} for _ in self._FAMILIES)

    def collect(self) -> Iterator[CounterMetricFamily]:
        for (name, text), counts in zip(self._FAMILIES, self.counts, strict=True):
            family = CounterMetricFamily(name, text, labels=["rule"])
            for rule, value in list(counts.items()):
                family.add_metric([rule], value)
            yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._rules = _RuleCounters()
        r.register(self._rules)
        self._checks, self._over, self._near, self._shadow = self._rules.counts
        self.latency = Histogram(
            "ratewarden_request_duration_seconds",
            "Time to answer a request, by endpoint",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.store_errors = Counter(
            "ratewarden_store_errors",
            "Checks the store could not decide (answered by the failure policy)",
            registry=r,
        )
        self.reloads = Counter(
            "ratewarden_config_reloads", "Rule reloads, by result", ["result"], registry=r
        )
        self.rules = Gauge("ratewarden_rules", "Rules in force", registry=r)
        # .labels() looks a child up under a lock; the hot path keeps its own dict
        self._latency: dict[str, Histogram] = {}

    def observe(self, endpoint: str, seconds: float) -> None:
        child = self._latency.get(endpoint)
        if child is None:
            child = self._latency[endpoint] = self.latency.labels(endpoint)
        child.observe(seconds)

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
        checks = self._checks
        for rule in rules:
            checks[rule] = checks.get(rule, 0) + 1
        if decision is not None:
            if decision.degraded:
                self.store_errors.inc()
            elif denied_by is not None:
                self._over[denied_by] = self._over.get(denied_by, 0) + 1
            elif closest is not None and decision.remaining <= decision.limit * (1 - NEAR):
                self._near[closest] = self._near.get(closest, 0) + 1
        if shadow_denied_by is not None:
            self._shadow[shadow_denied_by] = self._shadow.get(shadow_denied_by, 0) + 1

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
