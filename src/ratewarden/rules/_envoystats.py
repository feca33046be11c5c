"""Per-descriptor statistics of envoy domains, named as envoyproxy/ratelimit
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

__all__ = ["MAX_KEYS", "STATS", "EnvoyStats", "sanitize"]

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
