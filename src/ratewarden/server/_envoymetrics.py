"""Envoy domains' per-descriptor statistics on /metrics, under the names the
statsd exporter gives envoyproxy/ratelimit's stats with that project's default
mapping, so its dashboards keep working:

    ratelimit_service_rate_limit_total_hits{domain="d",key1="k_v",key2="k2",key="d.k_v.k2"}

and likewise ``over_limit``, ``near_limit``, ``within_limit``, ``shadow_mode``;
``domain``, ``key1`` and ``key2`` are the stats key's first three dot-separated
parts (as that mapping takes them), ``key`` the whole key, which tells apart
keys that share their first three parts. They are counters, exported untyped so
that the names stay as they are (a counter's name would gain ``_total``).

The series are bounded by `EnvoyStats.max_keys` (see `EnvoyStats`), and
``ratewarden_envoy_stats_folded`` says how many counts went to a config path
because that bound was reached.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric, UnknownMetricFamily

from ..rules import EnvoyStats
from ..rules._envoystats import STATS

__all__ = ["EnvoyCollector"]

_LABELS = ["domain", "key1", "key2", "key"]


class EnvoyCollector:
    def __init__(self, stats: EnvoyStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        families = [
            UnknownMetricFamily(
                f"ratelimit_service_rate_limit_{name}",
                f"envoy descriptors' {name} (envoyproxy/ratelimit's stat)",
                labels=_LABELS,
            )
            for name in STATS
        ]
        for key, row in list(stats.counts.items()):
            parts = key.split(".", 3)
            labels = [*parts[:3], *[""] * (3 - min(len(parts), 3)), key]
            for family, value in zip(families, row, strict=True):
                family.add_metric(labels, value)
        yield from families
        missing = UnknownMetricFamily(
            "ratelimit_service_rate_limit_domain_not_found",
            "descriptors of a domain no envoy config file names",
            labels=["domain"],
        )
        for domain, value in list(stats.not_found.items()):
            missing.add_metric([domain], value)
        yield missing
        folded = CounterMetricFamily(
            "ratewarden_envoy_stats_folded",
            "envoy stats counted under a config path: the bound on stats keys was reached",
        )
        folded.add_metric([], stats.folded)
        yield folded
