"""A global limit split across regions, each with its own Redis: no I/O here.

Each region enforces its *regional limit* exactly on its own Redis (the Redis
store's fixed window or sliding window counter). The regional limits come either
from configured shares (static), or from the fleet coordinator (dynamic): each
region is one member of a fleet resource on a *home* Redis, reports its region's
measured demand, and its grant becomes the regional limit. The coordinator's
invariant (a member gets at most the total minus what the others hold now) keeps
the sum of regional limits within the global limit, also while shares move.

What crosses between the region's processes lives in the regional Redis under
one hash tag:

- ``{rw:region:NAME}:limit``, written by the region's rebalancer after each
  refresh: ``limit`` (permits a window in force now), ``next`` and ``next_ms``
  (a larger limit and when it applies), ``until_ms`` (when the grant's lease
  ends) and ``lease_ms``; times on the regional Redis's clock;
- ``{rw:region:NAME}:demand``, a hash that the region's limiters add their
  ``asked`` and ``used`` permits to at each poll, and that the rebalancer reads
  and clears at each refresh.

The cases of a regional limit (`limit_at`):

- a smaller grant applies at once (the rebalancer writes it as soon as the reply
  comes; the limiters see it within one poll);
- a larger one applies from the first window edge after one poll (plus a margin)
  has passed: by then every region that gave up the space has its limiters on
  its smaller limit, so no window counts both;
- until every region is a live member, none is granted more than its static
  share (a region the coordinator does not know may be spending that);
- past the lease (the home unreachable, or the rebalancer dead), no more than
  the last grant or the static share, for one more lease while the coordinator
  expires the region and the others learn that it is gone (they are then held
  to their static shares); then the static share, from a window edge.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..primitives import ConfigurationError, Rate, parse_rate
from .alloc import MILLI
from .config import QuotaConfig, check_name

__all__ = [
    "Demand",
    "Record",
    "RegionSplit",
    "limit_at",
    "next_limits",
    "parse_record",
    "record_fields",
    "text",
]

COUNTING = ("fixed_window", "sliding_window_counter")  # state in counts: carries over a change
SAMPLE = 20  # calls a demand estimate wants at least (else earlier periods join in)
HISTORY = 4  # periods that may join in
STEADY = 0.02  # a demand that moves less than this (or one permit) has not moved


@dataclass(frozen=True, init=False)
class RegionSplit:
    """A global ``rate`` split across ``regions`` (name -> static weight).

    ``dynamic``: rebalance by measured demand through the fleet coordinator, with
    ``allocation`` (``fair_share``, ``proportional_share``, ``equal``) every
    ``refresh`` seconds; a grant outlives its last refresh by ``lease`` seconds.
    Without it, each region's limit is its static share:
    ``floor(limit * weight / sum of weights)``. ``poll``: seconds between a
    limiter's reads of its regional limit (and writes of its demand). ``margin``:
    seconds added to ``poll`` before a larger limit applies, for the writes in
    flight and the regional Redis clocks' disagreement. ``algorithm``: the exact
    limit each region applies, ``fixed_window`` or ``sliding_window_counter``.
    """

    name: str
    rate: Rate
    regions: Mapping[str, float]
    dynamic: bool = True
    allocation: str = "fair_share"
    refresh: float = 1.0
    lease: float = 5.0
    poll: float = 0.1
    margin: float = 0.05
    algorithm: str = "fixed_window"
    static: Mapping[str, int] = field(default_factory=dict)

    def __init__(
        self,
        name: str,
        rate: str | Rate,
        regions: Mapping[str, float],
        *,
        dynamic: bool = True,
        allocation: str = "fair_share",
        refresh: float = 1.0,
        lease: float = 5.0,
        poll: float = 0.1,
        margin: float = 0.05,
        algorithm: str = "fixed_window",
    ) -> None:
        values: dict[str, Any] = {
            "name": check_name(name),
            "rate": parse_rate(rate),
            "regions": dict(regions),
            "dynamic": dynamic,
            "allocation": allocation,
            "refresh": refresh,
            "lease": lease,
            "poll": poll,
            "margin": margin,
            "algorithm": algorithm,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)
        self._check()
        total, weights = self.rate.limit, self.regions
        whole = sum(weights.values())
        shares = {r: math.floor(total * w / whole) for r, w in weights.items()}
        object.__setattr__(self, "static", shares)

    def _check(self) -> None:
        if not self.regions:
            raise ConfigurationError(f"region split {self.name!r} names no regions")
        for region, weight in self.regions.items():
            check_name(region)
            if type(weight) not in (int, float) or not 0 <= weight < math.inf:
                raise ConfigurationError(
                    f"region split {self.name!r}: region {region!r} has weight {weight!r};"
                    " a weight is a number >= 0"
                )
        if sum(self.regions.values()) <= 0:
            raise ConfigurationError(f"region split {self.name!r}: the weights sum to 0")
        if self.allocation not in ("fair_share", "proportional_share", "equal"):
            raise ConfigurationError(
                f"region split {self.name!r}: allocation is fair_share, proportional_share"
                f" or equal, got {self.allocation!r}"
            )
        if self.algorithm not in COUNTING:
            raise ConfigurationError(
                f"region split {self.name!r}: algorithm is one of {', '.join(COUNTING)}"
                f" (their counts carry over a change of the limit), got {self.algorithm!r}"
            )
        for what in ("poll", "margin"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"{what} must be seconds >= 0, got {value!r}")
        if self.poll <= 0:
            raise ConfigurationError(f"poll must be seconds > 0, got {self.poll!r}")
        self.quota_config()  # refresh, lease and the window, checked as a fleet quota's

    def quota_config(self) -> QuotaConfig:
        """The fleet resource on the home Redis: the regions are its members."""
        return QuotaConfig(
            self.rate, self.allocation, refresh=self.refresh, lease=self.lease, safe=0
        )

    def check_region(self, region: str) -> str:
        if region not in self.regions:
            raise ConfigurationError(
                f"region split {self.name!r} has no region {region!r}"
                f" (it has {', '.join(self.regions)})"
            )
        return region

    @property
    def window_ms(self) -> int:
        return self.rate.period_ns // 1_000_000

    def keys(self) -> tuple[str, str]:
        """The regional Redis's keys: the limit record and the demand counts."""
        tag = f"{{rw:region:{self.name}}}"
        return f"{tag}:limit", f"{tag}:demand"

    def prefix(self) -> str:
        """Before every limited key in the regional Redis: the same for every
        regional limit, so that counts carry over when the limit changes."""
        return f"{self.name}:region:{self.algorithm}/{self.window_ms}ms:"


# -- the record in the regional Redis ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    limit: int
    next: int  # 0: no larger limit pending
    next_ms: int
    until_ms: int
    lease_ms: int


def parse_record(raw: Mapping[Any, Any] | None) -> Record | None:
    """The limit record as HGETALL returns it; None when absent or unreadable."""
    if not raw:
        return None
    try:
        fields = {text(k): int(text(v)) for k, v in raw.items()}
        return Record(
            fields["limit"],
            fields.get("next", 0),
            fields.get("next_ms", 0),
            fields["until_ms"],
            fields["lease_ms"],
        )
    except (KeyError, ValueError):
        return None


def limit_at(
    record: Record | None, now_ms: int, static: int, window_ms: int
) -> tuple[int, int | None]:
    """The regional limit in force at ``now_ms`` (regional clock), and when it
    changes next by time alone (None: never). A limit only grows at a window
    edge: a pending raise at its time, the static share after the lapse."""
    if record is None:
        return static, None
    until = record.until_ms
    raised = bool(record.next) and record.next_ms <= until
    if now_ms < until:
        if raised and now_ms < record.next_ms:
            return record.limit, record.next_ms
        return (record.next if raised else record.limit), until
    last = record.next if raised else record.limit
    free = -(-(until + record.lease_ms) // window_ms) * window_ms
    if now_ms < free:
        return min(static, last), free
    return static, None


def next_limits(
    split: RegionSplit,
    region: str,
    *,
    before: Record | None,
    grant_m: int,
    members: int,
    now_ms: int,
    sent_ms: int,
) -> Record:
    """The record a rebalancer writes after a refresh that granted ``grant_m``
    millipermits a window to ``region``, at ``now_ms`` (regional clock; the
    refresh was sent at ``sent_ms``): see the module docstring."""
    limit = grant_m // MILLI  # whole permits: the floors sum to at most the total
    if members < len(split.regions):
        limit = min(limit, split.static[region])
    window = split.window_ms
    current, _ = limit_at(before, now_ms, split.static[region], window)
    lease_ms = round(split.lease * 1000)
    until = sent_ms + lease_ms
    if limit <= current:
        return Record(limit, 0, 0, until, lease_ms)
    ready = now_ms + round((split.poll + split.margin) * 1000)
    edge = -(-ready // window) * window  # the first window edge at or after it
    if before is not None and before.next and now_ms < before.next_ms < edge:
        # a raise already pending keeps its time; the rest waits for the next refresh
        return Record(current, min(limit, before.next), before.next_ms, until, lease_ms)
    return Record(current, limit, edge, until, lease_ms)


def record_fields(record: Record) -> dict[str, int]:
    return {
        "limit": record.limit,
        "next": record.next,
        "next_ms": record.next_ms,
        "until_ms": record.until_ms,
        "lease_ms": record.lease_ms,
    }


# -- measured demand ----------------------------------------------------------------


class Demand:
    """A region's demand, in millipermits a window, from the counts its limiters
    wrote: each period's asked permits over its length, with earlier periods
    (up to four) joining in until the estimate rests on at least 20 calls; a
    change of less than 2% (or one permit) is no change, so that shares do not
    move for nothing."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self.periods: deque[tuple[int, int]] = deque(maxlen=HISTORY)  # (asked, ms)
        self.wants: int | None = None  # None: not measured yet

    def add(self, asked: int, elapsed_ms: int) -> int | None:
        if elapsed_ms <= 0:
            return self.wants
        self.periods.appendleft((asked, elapsed_ms))
        calls = span = 0
        for count, ms in self.periods:
            calls += count
            span += ms
            if calls >= SAMPLE:
                break
        rate = calls * self.window_ms * MILLI // span
        last = self.wants
        if last is None or abs(rate - last) > max(MILLI, last * STEADY):
            self.wants = rate
        return self.wants


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
