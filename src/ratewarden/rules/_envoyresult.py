"""What a check of envoy descriptors answers: per descriptor its limit
(`EnvoyLimit`) and, together, the request's answer (`EnvoyResult`), decided
from each limit's own status as envoyproxy/ratelimit decides it (`verdict`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .._decision import Decision
from .._errors import ConfigurationError
from .._rate import UNIT_SECONDS
from ..stores._base import pick

__all__ = ["OVERRIDE_UNITS", "EnvoyLimit", "EnvoyResult", "Override", "esc", "override_limit",
           "verdict"]  # fmt: skip

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
