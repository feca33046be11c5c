"""What `ratewarden simulate` runs: a `Scenario` (the fleet, its total, its
demand and its clocks, checked as it is made) and the runs behind
docs/fleet-simulation.md's figures (`documented`). What a scenario's pattern
makes happen is its `Plan` (`_plans`); what a run measures, its `Result`
(`_result`); the figures it is held to, `check` (`_checks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..fleet.alloc import ALLOCATORS
from ..fleet.config import QuotaConfig
from ..primitives import ConfigurationError, parse_rate

__all__ = ["MAX_MEMBERS", "PATTERNS", "SKEW_PATTERN_MS", "Scenario", "documented"]

PATTERNS = ("uniform", "skewed", "bursts", "churn", "total-change", "skew")  # `_plans` says what
MAX_MEMBERS = 200
SKEW_PATTERN_MS = 100.0


@dataclass(frozen=True)
class Scenario:
    """One simulated run (`_plans` says what each pattern makes happen)."""

    pattern: str = "uniform"
    members: int = 8
    rate: str = "2000/second"  # the provider's limit: the fleet's total
    algorithm: str = "fair_share"
    seconds: float = 60.0
    demand: float = 1.5  # offered load, as a multiple of the total
    pace: bool = True
    skew_ms: float | None = None  # None: 100 for the skew pattern, else 0
    seed: int = 1
    refresh: float = 1.0
    lease: float = 5.0
    max_wait: float | None = None  # a caller's max_wait, seconds; None: one window
    active: int | None = None  # only the first K members have demand; None: all
    pubsub: bool = True  # deliver the coordinator's messages (else: next refresh)
    pubsub_ms: float = 1.0  # their delay
    warmup: float = 5.0  # seconds left out of utilisation
    cap: int | None = None  # static's cap, permits a window; None: total / members
    arrivals: str = "poisson"  # or "even": evenly spaced, random phase
    workers: int = 0  # closed-loop callers per member with demand; 0: open-loop arrivals
    think_ms: float = 0.0  # a worker's time between being served and asking again
    closed: int | None = None  # only the first K members with demand have workers; None: all
    sliding: bool = False  # the resource's strict mode for rolling-window providers
    safe: str | int = "equal"  # the resource's safe share: "equal" or permits a window
    # seconds from the start in which the coordinator does not answer (its
    # backend raises StoreUnavailable): the members start before their Redis,
    # nobody ran `quota set`, and they create the resource from their config
    unreachable: float = 0.0

    def __post_init__(self) -> None:
        rate = parse_rate(self.rate)
        if self.pattern not in PATTERNS:
            raise ConfigurationError(
                f"unknown pattern {self.pattern!r}; expected one of {', '.join(PATTERNS)}"
            )
        if self.algorithm not in ALLOCATORS:
            raise ConfigurationError(
                f"unknown algorithm {self.algorithm!r}; expected one of {', '.join(ALLOCATORS)}"
            )
        if not 1 <= self.members <= MAX_MEMBERS:
            raise ConfigurationError(f"members must be 1-{MAX_MEMBERS}, got {self.members}")
        if self.pattern == "churn" and self.members < 4:
            raise ConfigurationError("the churn pattern needs at least 4 members")
        if not 0 < self.seconds <= 3600 or self.seconds < 2 * rate.period:
            raise ConfigurationError(
                f"seconds must cover two windows of {rate} and at most an hour:"
                f" {2 * rate.period:g} to 3600, got {self.seconds:g}"
            )
        if not 0 <= self.demand <= 100:
            raise ConfigurationError(f"demand must be 0-100 times the total, got {self.demand}")
        if not (math.isfinite(self.unreachable) and 0 <= self.unreachable <= self.seconds / 4):
            # answered in the run's first quarter: before churn's late joins, the
            # cuts of total-change and the departures
            raise ConfigurationError(
                f"unreachable must be 0 to a quarter of the run's seconds, got {self.unreachable}"
            )
        for name in ("skew_ms", "max_wait", "pubsub_ms", "warmup"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigurationError(f"{name} must be >= 0, got {value}")
        if self.active is not None and not 0 <= self.active <= self.members:
            raise ConfigurationError(f"active must be 0-{self.members}, got {self.active}")
        if not 0 <= self.workers <= 1000:
            raise ConfigurationError(f"workers must be 0-1000, got {self.workers}")
        if not (math.isfinite(self.think_ms) and self.think_ms >= 0):
            raise ConfigurationError(f"think_ms must be >= 0, got {self.think_ms}")
        if self.closed is not None and not 0 <= self.closed <= self.members:
            raise ConfigurationError(f"closed must be 0-{self.members}, got {self.closed}")
        if self.arrivals not in ("poisson", "even"):
            raise ConfigurationError(f"arrivals must be poisson or even, got {self.arrivals!r}")
        self.config()  # refresh, lease and cap checked as the coordinator would

    @property
    def total(self) -> int:
        """Permits a window."""
        return parse_rate(self.rate).limit

    @property
    def window_ns(self) -> int:
        return parse_rate(self.rate).period_ns

    @property
    def skew(self) -> float:
        """Milliseconds: the widest clock offset either way."""
        if self.skew_ms is not None:
            return self.skew_ms
        return SKEW_PATTERN_MS if self.pattern == "skew" else 0.0

    @property
    def wait(self) -> float:
        """A caller's max_wait, seconds."""
        return parse_rate(self.rate).period if self.max_wait is None else self.max_wait

    @property
    def closed_count(self) -> int:
        """How many members' callers are closed-loop workers (the first ones)."""
        if not self.workers:
            return 0
        return self.members if self.closed is None else self.closed

    def config(self, total: int | None = None) -> QuotaConfig:
        rate = parse_rate(self.rate)
        cap = self.cap if self.cap is not None else max(1, rate.limit // self.members)
        return QuotaConfig(
            f"{rate.limit if total is None else total}/{rate.period}seconds",
            self.algorithm,
            refresh=self.refresh,
            lease=self.lease,
            cap=cap,
            safe=self.safe,
            sliding=self.sliding,
        )

    def but(self, **changes: Any) -> Scenario:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "members": self.members,
            "rate": self.rate,
            "algorithm": self.algorithm,
            "seconds": self.seconds,
            "demand": self.demand,
            "pace": self.pace,
            "skew_ms": self.skew,
            "seed": self.seed,
            "refresh": self.refresh,
            "lease": self.lease,
            "max_wait": self.wait,
            "active": self.members if self.active is None else self.active,
            "pubsub": self.pubsub,
            "pubsub_ms": self.pubsub_ms,
            "warmup": self.warmup,
            "arrivals": self.arrivals,
            "workers": self.workers,
            "think_ms": self.think_ms,
            "closed": self.closed_count if self.workers else 0,
            "safe": self.safe,
            "unreachable": self.unreachable,
        }


def documented(seconds: float = 60.0, seed: int = 1) -> dict[str, Scenario]:
    """The runs behind docs/fleet-simulation.md's figures, by key:

    - ``a/ALG``: 10/second over 96 members, 5 of them with demand (1.5x the total),
      callers evenly spaced as in the judging run (bench/bench_fleet.py);
      ``a-poisson/ALG`` the same with callers arriving at random, and
      ``a-poisson/ideal`` a fixed split of the total among the 5 (``static``,
      every member capped at its fair share) for the bound any split reaches;
    - ``b/ALG``: 2,000/second over 8 members, 10:1 skewed demand, clocks ±100 ms,
      paced, as the judging run: evenly spaced callers offering 1.25x the total,
      each waiting at most 0.25 s; ``b-poisson/ALG`` with callers arriving at
      random, offering 1.5x, waiting up to a window;
    - ``c/paced``, ``c/unpaced``: 2,000/second over 8 members, saturated, twice;
    - ``d/...``: the invariant through cuts of the total (with and without pub/sub)
      and bursts, 96 members, clocks ±100 ms;
    - ``e/churn``: 96 members, a quarter joining late, an eighth leaving, an eighth
      dying (``e/churn-16``: the same with 16, for the plot of the grants);
    - ``f/pools``: 500/second over 4 members of 8 workers each, blocking in
      ``acquire(max_wait=5)`` and asking again at once, clocks ±100 ms;
      ``f/mixed``: 2 such members beside 2 whose callers arrive at 50/second;
    - ``g/low-rate``: 10/second over 48 members, 5 of them offering 10/second
      each, clocks ±100 ms, callers evenly spaced: the idle members' slivers
      leave the busy ones fragments whose permits move from window to window;
    - ``g/skewed-start``: ``b/fair_share`` for 20 s judged after a 3 s warm-up,
      as the judging run (bench/bench_fleet.py) is.
    """
    base = Scenario(seconds=seconds, seed=seed)
    runs: dict[str, Scenario] = {}
    for algorithm in ALLOCATORS:
        a = base.but(members=96, rate="10/second", algorithm=algorithm, demand=1.5, active=5)
        runs[f"a/{algorithm}"] = a.but(arrivals="even")
        if algorithm in ("fair_share", "proportional_share"):
            runs[f"a-poisson/{algorithm}"] = a
    runs["a-poisson/ideal"] = runs["a-poisson/fair_share"].but(algorithm="static", cap=2)
    for algorithm in ALLOCATORS:
        b = base.but(pattern="skewed", members=8, algorithm=algorithm, skew_ms=100.0)
        runs[f"b/{algorithm}"] = b.but(arrivals="even", demand=1.25, max_wait=0.25)
        if algorithm in ("fair_share", "proportional_share"):
            runs[f"b-poisson/{algorithm}"] = b.but(demand=1.5)
    runs["c/paced"] = base.but(members=8, demand=1.5)
    runs["c/unpaced"] = base.but(members=8, demand=1.5, pace=False)
    cut = base.but(pattern="total-change", members=96, demand=1.5, skew_ms=100.0)
    runs["d/cut"] = cut
    runs["d/cut-no-pubsub"] = cut.but(pubsub=False)
    runs["d/bursts"] = base.but(pattern="bursts", members=96, demand=1.0, skew_ms=100.0)
    runs["e/churn"] = base.but(pattern="churn", members=96, demand=1.5, skew_ms=100.0)
    runs["e/churn-16"] = runs["e/churn"].but(members=16)  # few enough lines to plot
    pools = base.but(members=4, rate="500/second", workers=8, max_wait=5.0, skew_ms=100.0)
    runs["f/pools"] = pools
    runs["f/mixed"] = pools.but(closed=2, demand=0.4)
    runs["g/low-rate"] = base.but(
        members=48, rate="10/second", active=5, demand=5.0, skew_ms=100.0, arrivals="even"
    )
    runs["g/skewed-start"] = runs["b/fair_share"].but(seconds=min(seconds, 20.0), warmup=3.0)
    return runs
