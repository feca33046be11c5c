"""The dynamic metadata envoyproxy/ratelimit adds to its answer when
RESPONSE_DYNAMIC_METADATA is on (``--envoy-dynamic-metadata``), in its shape:

    {"domain": ..., "descriptors": [{"entries": ["key=value", ...],
     "limit": "requests_per_unit:10 unit:MINUTE", "hitsAddend": 2}, ...],
     "hitsAddend": 3, "metadata": {...}}

``metadata`` merges the ``metadata`` of the limits of every descriptor that
passed (not over its limit, not unlimited): mappings merge key by key, and for
anything else the first descriptor's value stays.

Envoy domains' per-descriptor statistics on /metrics, under the names the
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

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, Metric, UnknownMetricFamily

from ._answer import STATS, EnvoyResult, EnvoyStats, Override

__all__ = [
    "EnvoyCollector",
    "dynamic_metadata",
]


def dynamic_metadata(
    domain: str,
    descriptors: Sequence[Sequence[tuple[str, str]]],
    overrides: Sequence[Override | None] | None,
    answer: EnvoyResult,
    *,
    addends: Sequence[int | None],
    hits_addend: int,
) -> dict[str, object]:
    described: list[object] = []
    for i, entries in enumerate(descriptors):
        one: dict[str, object] = {"entries": [f"{k}={v}" for k, v in entries]}
        override = overrides[i] if overrides is not None else None
        if override is not None:
            one["limit"] = f"requests_per_unit:{override[0]} unit:{override[1].upper()}"
        if addends[i] is not None:
            one["hitsAddend"] = addends[i]
        described.append(one)
    out: dict[str, object] = {"domain": domain, "descriptors": described}
    if hits_addend:
        out["hitsAddend"] = hits_addend
    merged: dict[str, object] = {}
    for limit, status in zip(answer.limits, answer.statuses or [None] * len(answer.limits),
                             strict=True):  # fmt: skip
        if limit is None or limit.unlimited or limit.metadata is None:
            continue
        if status is not None and not status.allowed and not limit.shadow:
            continue
        if status is None and not answer.overall_ok:
            continue  # counted at once and denied: no descriptor is known to have passed
        _merge(merged, limit.metadata)
    if merged:
        out["metadata"] = merged
    return out


def _merge(into: dict[str, object], source: dict[str, object]) -> None:
    for key, value in source.items():
        if key not in into:
            into[key] = value
            continue
        mine = into[key]
        if isinstance(mine, dict) and isinstance(value, dict):
            copy = dict(mine)
            _merge(copy, value)
            into[key] = copy


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
