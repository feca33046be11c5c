"""What a check of envoy descriptors answers: per descriptor its limit
(`EnvoyLimit`) and, together, the request's answer (`EnvoyResult`), decided
from each limit's own status as envoyproxy/ratelimit decides it (`verdict`).

Per-descriptor statistics of envoy domains, named as envoyproxy/ratelimit
names them: ``<stats key>.total_hits``, ``.over_limit``, ``.near_limit``,
``.within_limit``, ``.shadow_mode``, and ``<domain>.domain_not_found``.

The stats key is the matched node's config path (``domain.key_value.key``), or,
with ``detailed_metric`` and ``value_to_metric``, one that holds the request's
own values: as many keys as clients send values. So the keys are bounded:
after `MAX_KEYS` distinct ones, a new key's counts go to the node's config path
instead (a bounded set, fixed by the files), and ``folded`` counts how often
that happened. Unknown domains are what a client says too: after `MAX_KEYS` of
them, they count under ``"<other>"``.

Counts are plain ints on the event loop's thread, read by a Prometheus scrape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import msgspec

from ..primitives import UNIT_SECONDS, ConfigurationError, Decision
from ..stores.base import pick

__all__ = [
    "MAX_KEYS",
    "OVERRIDE_UNITS",
    "STATS",
    "EnvoyLimit",
    "EnvoyResult",
    "EnvoyStats",
    "Override",
    "esc",
    "override_limit",
    "sanitize",
    "verdict",
]

# RateLimitUnit of envoy's override (0 is UNKNOWN)
OVERRIDE_UNITS = ("", "second", "minute", "hour", "day", "month", "year", "week")

Override = tuple[int, str]  # a descriptor's limit: requests per unit, unit name


class EnvoyLimit(msgspec.Struct, frozen=True):
    """The limit one descriptor of a request gets: ``path`` names its node (or,
    for an override, ``<domain>.override``); ``key`` is its counter key; ``stats_key``
    its name in the statistics; ``metadata`` the file's, handed back."""

    descriptor: int
    path: str
    key: str
    stats_key: str
    requests_per_unit: int
    unit: str
    period: int
    name: str | None = None
    shadow: bool = False
    quota: bool = False
    unlimited: bool = False
    override: bool = False
    metadata: dict[str, object] | None = None

    @property
    def blocked(self) -> bool:
        return not self.unlimited and self.requests_per_unit == 0


class EnvoyResult(msgspec.Struct, frozen=True):
    """``overall_ok``: the request may pass (envoy's OK / OVER_LIMIT);
    ``decision``: the enforced limits' Decision (None if none counted);
    ``limits``: per descriptor, its limit or None (no limit: OK);
    ``shadow``: the Decision of the shadow-mode limits, reported, never denying;
    ``statuses``: per descriptor, its own limit's Decision where known (None: no
    limit, unlimited, or, counting atomically, a limit that did not speak)."""

    overall_ok: bool
    decision: Decision | None
    limits: list[EnvoyLimit | None]
    shadow: Decision | None = None
    statuses: list[Decision | None] = []


def verdict(
    limits: list[EnvoyLimit | None], statuses: list[Decision | None], *, shadow_mode: bool
) -> EnvoyResult:
    enforced: list[Decision] = []
    shadow: list[Decision] = []
    failed = quota_total = quota_failed = 0
    for limit, status in zip(limits, statuses, strict=True):
        if limit is None or status is None:
            continue
        (shadow if limit.shadow else enforced).append(status)
        if limit.shadow:
            continue
        if limit.quota:
            quota_total += 1
            quota_failed += not status.allowed
        elif not status.allowed:
            failed += 1
    ok = not failed and not (quota_total and quota_total == quota_failed)
    return EnvoyResult(
        ok or shadow_mode,
        pick(enforced) if enforced else None,
        limits,
        pick(shadow) if shadow else None,
        statuses,
    )


def override_limit(
    domain: str, index: int, entries: Sequence[tuple[str, str]], override: Override
) -> EnvoyLimit:
    per_unit, unit = override
    if unit not in UNIT_SECONDS:
        raise ConfigurationError(f"descriptor {index}: limit override has no valid unit")
    stats_key = ".".join([domain, *(f"{k}_{v}" if v else k for k, v in entries)])
    key = "|".join([domain, *(f"{esc(k)}={esc(v)}" for k, v in entries)])
    period = UNIT_SECONDS[unit]
    # the path names the limit in Decisions and metric labels: not the request's
    # values, which are as many as clients send (the stats key is bounded apart)
    path = f"{domain}.override"
    return EnvoyLimit(index, path, key, stats_key, per_unit, unit, period, override=True)


def esc(text: str) -> str:
    return text.replace("%", "%25").replace("|", "%7C").replace("=", "%3D")


MAX_KEYS = 10_000
STATS = ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode")
_IPV4 = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}")


def sanitize(key: str) -> str:
    """A stats key as that service writes it to statsd: ``:`` and ``|`` as ``_``,
    and the dots of an IPv4 address as ``_`` (they would split the name)."""
    key = key.replace(":", "_").replace("|", "_")
    return _IPV4.sub(lambda m: m.group(0).replace(".", "_"), key)


class EnvoyStats:
    """The counters, by sanitized stats key. ``near_limit_ratio`` is that
    service's NEAR_LIMIT_RATIO (0.8 by default)."""

    def __init__(self, *, near_limit_ratio: float = 0.8, max_keys: int = MAX_KEYS) -> None:
        if not 0 <= near_limit_ratio <= 1:
            raise ValueError(f"near_limit_ratio must be from 0 to 1, got {near_limit_ratio!r}")
        self.near_limit_ratio = near_limit_ratio
        self.max_keys = max_keys
        self.counts: dict[str, list[int]] = {}  # key -> one count per STATS
        self.not_found: dict[str, int] = {}
        self.folded = 0

    def _row(self, key: str, fallback: str) -> list[int]:
        key = sanitize(key)
        row = self.counts.get(key)
        if row is None:
            if len(self.counts) >= self.max_keys:
                self.folded += 1
                key = sanitize(fallback)
                row = self.counts.get(key)
            if row is None:
                row = self.counts[key] = [0] * len(STATS)
        return row

    def record(  # noqa: PLR0917 - one call site, each argument named by its role
        self, key: str, fallback: str, per_unit: int, before: int, cost: int, shadow: bool
    ) -> None:
        """One limit's part in one request, as that service counts it: the
        counter held ``before`` and the request added ``cost``. ``fallback``
        names the row when ``key`` would be one too many."""
        row = self._row(key, fallback)
        row[0] += cost
        after = before + cost
        near = math.floor(per_unit * self.near_limit_ratio)
        if after > per_unit:
            if before >= per_unit:
                over = cost
            else:
                over = after - per_unit
                row[2] += per_unit - max(near, before)
            row[1] += over
            if shadow:
                row[4] += over
        else:
            if after > near:
                row[2] += cost if before >= near else after - near
            row[3] += cost

    def record_outcome(
        self, key: str, fallback: str, cost: int, outcome: str, shadow: bool
    ) -> None:
        """A limit's part when its count is not known: ``outcome`` "within",
        "over", or "uncounted" (a request another limit denied)."""
        row = self._row(key, fallback)
        row[0] += cost
        if outcome == "within":
            row[3] += cost
        elif outcome == "over":
            row[1] += cost
            if shadow:
                row[4] += cost

    def domain_not_found(self, domain: str) -> None:
        key = sanitize(domain)
        if key not in self.not_found and len(self.not_found) >= self.max_keys:
            key = "<other>"
        self.not_found[key] = self.not_found.get(key, 0) + 1

    def value(self, key: str, stat: str) -> int:
        """One counter by its full name's parts, 0 if never counted."""
        row = self.counts.get(key)
        return 0 if row is None else row[STATS.index(stat)]
