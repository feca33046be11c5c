"""Prometheus metrics of the service, in a registry of its own (one per app, so
tests and embedded apps never share counters).

Labels are bounded: ``rule`` takes rule names (or envoy config node paths), which
the rule files fix; ``endpoint`` takes route names; never a raw key or path;
envoy stats keys, which may hold request values, are capped (`ratewarden.envoy.shown`).
``resource`` takes fleet quota names, at most `MAX_SCRAPED` of them; ``member``
(member ids, which come and go with the fleet's instances) only when asked for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..rules import LATENCY_BUCKETS, Tally

if TYPE_CHECKING:
    from ..fleet import QuotaStatus
    from ..rlqs import Stats
    from ..rules import EnvoyStats, HoldStats

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# Latency of a check inside the server (the store call included), in seconds.
_BUCKETS = LATENCY_BUCKETS


class _RuleCounters:
    """The per-rule counters, plain ints in a `Tally`, made into metric families
    only when scraped: four prometheus-client ``inc()`` calls (a lock each) cost
    a fifth of a check's time in the server; dict increments on the event loop's
    one thread cost next to nothing. The OpenTelemetry instruments read the same
    tally (`ratewarden.otel`)."""

    _FAMILIES = (
        ("ratewarden_checks", "Requests a rule applied to", "checks"),
        ("ratewarden_over_limit", "Requests a rule denied", "over_limit"),
        ("ratewarden_near_limit", "Requests admitted with 80% or more of the closest limit used",
         "near_limit"),
        ("ratewarden_shadow_over_limit", "Requests a log_only (shadow) rule would have denied",
         "shadow_over_limit"),
        ("ratewarden_degraded", "Requests a degrade rule let through with a level above 0",
         "degraded"),
    )  # fmt: skip

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def collect(self) -> Iterator[CounterMetricFamily]:
        tally = self.tally
        for name, text, attribute in self._FAMILIES:
            family = CounterMetricFamily(name, text, labels=["rule"])
            counts: dict[str, int] = getattr(tally, attribute)
            for rule, value in list(counts.items()):
                family.add_metric([rule], value)
            yield family
        yield CounterMetricFamily(
            "ratewarden_store_errors",
            "Checks the store could not decide (answered by the failure policy)",
            value=tally.store_errors,
        )


class _Latency:
    """``ratewarden_request_duration_seconds`` by endpoint, kept as plain counts
    per bucket and made into a histogram family only when scraped: a
    prometheus-client ``observe`` (a lock, a bucket search in Python) costs a
    check about 3% of its time in the server; a bisect and two increments on
    the event loop's one thread cost next to nothing."""

    NAME = "ratewarden_request_duration_seconds"

    def __init__(self) -> None:
        # endpoint -> [count in each bucket (the last: above every bound), sum]
        self.by_endpoint: dict[str, tuple[list[int], list[float]]] = {}

    def observe(self, endpoint: str, seconds: float) -> None:
        figures = self.by_endpoint.get(endpoint)
        if figures is None:
            figures = self.by_endpoint[endpoint] = ([0] * (len(_BUCKETS) + 1), [0.0])
        figures[0][bisect_left(_BUCKETS, seconds)] += 1
        figures[1][0] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            self.NAME, "Time to answer a request, by endpoint", labels=["endpoint"]
        )
        for endpoint, (counts, total) in list(self.by_endpoint.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*map(_bound, _BUCKETS), "+Inf"), counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([endpoint], buckets, total[0])
        yield family


def _bound(value: float) -> str:
    return repr(float(value))


class _QuotaGauges:
    """Fleet quotas' figures (permits a window), made into gauges when scraped
    from the resources the scrape has just read (`Metrics.exposition`): one
    series a resource, and one a member only with ``members``."""

    _FAMILIES = (
        ("ratewarden_quota_total", "A fleet quota's effective total, permits a window",
         "effective_total"),
        ("ratewarden_quota_wants", "Permits a window a fleet quota's members want", "wants"),
        ("ratewarden_quota_granted", "Permits a window a fleet quota's members hold", "granted"),
        ("ratewarden_quota_used", "Permits a fleet quota's members used in their last window",
         "used"),
    )  # fmt: skip
    _MEMBER_FAMILIES = (
        ("ratewarden_quota_member_wants", "Permits a window a member wants", "wants"),
        ("ratewarden_quota_member_granted", "Permits a window a member holds", "has"),
        ("ratewarden_quota_member_used", "Permits a member used in its last window", "used"),
    )

    def __init__(self, *, members: bool) -> None:
        self.members = members
        self.statuses: Sequence[QuotaStatus] = ()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        statuses = self.statuses
        if not statuses:  # no Redis, no quotas, or Redis failed: no quota series at all
            return
        for name, text, attribute in self._FAMILIES:
            family = GaugeMetricFamily(name, text, labels=["resource"])
            for status in statuses:
                family.add_metric([status.name], getattr(status, attribute))
            yield family
        members = GaugeMetricFamily("ratewarden_quota_members", "A fleet quota's live members",
                                    labels=["resource"])  # fmt: skip
        for status in statuses:
            members.add_metric([status.name], len(status.members))
        yield members
        if self.members:
            for name, text, attribute in self._MEMBER_FAMILIES:
                family = GaugeMetricFamily(name, text, labels=["resource", "member"])
                for status in statuses:
                    for member in status.members:
                        family.add_metric([status.name, member.id], getattr(member, attribute))
                yield family


class _AdaptiveGauges:
    """Adaptive limits, read when scraped: each limit's effective size now
    (``ratewarden_effective_limit{rule}``, in requests; the rule's name, or
    ``name@rate`` for one rate of several) and the load signals fed to them."""

    def __init__(self) -> None:
        self.limits: Callable[[], dict[str, tuple[int, int]]] = dict
        self.signals: Callable[[], dict[str, float | None]] = dict

    def collect(self) -> Iterator[GaugeMetricFamily]:
        limits = self.limits()
        if limits:
            family = GaugeMetricFamily(
                "ratewarden_effective_limit",
                "An adaptive limit's size now, in requests, after its load signal",
                labels=["rule"],
            )
            for name, (_, effective) in sorted(limits.items()):
                family.add_metric([name], effective)
            yield family
        signals = {k: v for k, v in self.signals().items() if v is not None}
        if signals:
            family = GaugeMetricFamily(
                "ratewarden_load_signal", "A load signal's last value, as fed", labels=["signal"]
            )
            for name, value in signals.items():
                family.add_metric([name], value)
            yield family


class _QuotaStreamCounters:
    """Envoy's quota streams (``ratewarden.rlqs``), read when scraped: streams
    and buckets now, buckets pushed out or abandoned, reports of buckets no
    entry limits, and the requests the proxies reported, by ``rlqs`` entry
    name (never by bucket id or proxy). Each bucket's total and grants are the
    quota gauges, by resource."""

    def __init__(self) -> None:
        self.stats: Callable[[], Stats | None] = lambda: None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.stats()
        if stats is None:
            return
        yield GaugeMetricFamily("ratewarden_rlqs_streams", "Envoy quota streams open",
                                value=stats.streams)  # fmt: skip
        yield GaugeMetricFamily("ratewarden_rlqs_buckets", "Envoy quota buckets tracked here",
                                value=stats.buckets)  # fmt: skip
        yield CounterMetricFamily(
            "ratewarden_rlqs_buckets_evicted",
            "Buckets pushed out by newer ones past the bound (their proxies abandon them)",
            value=stats.evicted,
        )
        yield CounterMetricFamily(
            "ratewarden_rlqs_buckets_abandoned",
            "Buckets a proxy was told to forget after no request for abandon_after",
            value=stats.abandoned,
        )
        yield CounterMetricFamily(
            "ratewarden_rlqs_unmatched",
            "Bucket reports no rlqs entry limits (answered with allow-all)",
            value=stats.unmatched,
        )
        family = CounterMetricFamily(
            "ratewarden_rlqs_requests", "Requests the proxies reported, by rlqs entry and outcome",
            labels=["rule", "outcome"],
        )  # fmt: skip
        for outcome, counts in (("allowed", stats.allowed), ("denied", stats.denied)):
            for rule, value in list(counts.items()):
                family.add_metric([rule, outcome], value)
        yield family


class _HoldFigures:
    """The concurrency rules' slots, by rule name (never by key), read when
    scraped from the engine's `ratewarden.rules.HoldStats`: slots handed out here
    and neither released nor past their lease, requests waiting for one,
    ended leases reclaimed, requests refused for want of one. No series while
    no concurrency rule has handed out a slot."""

    def __init__(self) -> None:
        self.in_flight: Callable[[], dict[str, int]] = dict
        self.stats: Callable[[], HoldStats | None] = lambda: None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.stats()
        if stats is None:
            return
        in_flight = self.in_flight()
        if not (in_flight or stats.refused or stats.reclaimed):
            return
        for name, text, counts, kind in (
            ("ratewarden_concurrency_in_flight", "Slots of a concurrency rule held now",
             in_flight, GaugeMetricFamily),
            ("ratewarden_concurrency_waiting", "Requests waiting for a concurrency rule's slot",
             dict(stats.waiting), GaugeMetricFamily),
            ("ratewarden_concurrency_leases_reclaimed",
             "Ended leases of a concurrency rule dropped (their holders never released them)",
             dict(stats.reclaimed), CounterMetricFamily),
            ("ratewarden_concurrency_refused", "Requests a concurrency rule had no slot for",
             dict(stats.refused), CounterMetricFamily),
        ):  # fmt: skip
            family = kind(name, text, labels=["rule"])
            for rule, value in sorted(counts.items()):
                family.add_metric([rule], value)
            yield family


class Metrics:
    """``quota_members``: the fleet quotas' gauges per member too; ``envoy``:
    the envoy domains' per-descriptor statistics (`ratewarden.envoy.shown`)."""

    def __init__(self, *, quota_members: bool = False, envoy: EnvoyStats | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if envoy is not None:
            from ..envoy.shown import EnvoyCollector  # noqa: PLC0415 - imports rules

            r.register(EnvoyCollector(envoy))
        # every check is counted here once; /metrics and OpenTelemetry read it
        self.tally = Tally()
        r.register(_RuleCounters(self.tally))
        self._quotas = _QuotaGauges(members=quota_members)
        r.register(self._quotas)
        # the service points these at its engine: `ratewarden_effective_limit`
        self.adaptive = _AdaptiveGauges()
        r.register(self.adaptive)
        # the service points this at its quota streams' figures
        self.quota_streams = _QuotaStreamCounters()
        r.register(self.quota_streams)
        # the service points this at its engine's concurrency slots
        self.holds = _HoldFigures()
        r.register(self.holds)
        self._timings = _Latency()
        r.register(self._timings)
        self.observe = self._timings.observe  # one call a request, none of ours around it
        self.reloads = Counter(
            "ratewarden_config_reloads", "Rule reloads, by result", ["result"], registry=r
        )
        self.rules = Gauge("ratewarden_rules", "Rules in force", registry=r)

    def latency(self) -> list[tuple[str, list[int], float]]:
        """Each endpoint's request times so far: the count in each bucket of
        `LATENCY_BUCKETS` (the last: above them all) and their sum (for
        OpenTelemetry's histogram, `ratewarden.server._otel_latency`)."""
        figures = list(self._timings.by_endpoint.items())
        return [(endpoint, list(counts), total[0]) for endpoint, (counts, total) in figures]

    @property
    def rule_counts(self) -> tuple[dict[str, int], ...]:
        """The per-rule counters behind the rule families (checks, over limit, near
        limit, shadow denials), by rule name: live dicts, for the dashboard."""
        tally = self.tally
        return tally.checks, tally.over_limit, tally.near_limit, tally.shadow_over_limit

    def store_error_count(self) -> float:
        """Checks a failure policy answered so far."""
        return float(self.tally.store_errors)

    def exposition(self, quotas: Sequence[QuotaStatus] = ()) -> bytes:
        """The text format; ``quotas``: the fleet quotas the scrape read."""
        # no await between setting and reading: one scrape's quotas are its own
        self._quotas.statuses = quotas
        try:
            return generate_latest(self.registry)
        finally:
            self._quotas.statuses = ()
