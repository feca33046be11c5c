"""What `ratewarden simulate` runs and what it measures, without running it: a
`Scenario` (the fleet, its total, its demand and its clocks), the `Plan` a
pattern makes of it (who joins, leaves or dies when, each member's arrival rate
and clock offset, the total's changes), the `Result` a run fills in, and the
documented figures (`documented` runs, `check`) it is held to.

The demand patterns (``--pattern``), for N members and a run of S seconds; the
fleet's callers offer ``demand`` times the total, split among the members with
demand in proportion to their weights (``active``: only the first K have any):

- ``uniform``: every member weight 1;
- ``skewed``: 10:1: the first tenth of the members (at least one) weight 10, the
  rest 1 (8 members: member 0 offers 10/17 of the load, the 7 others 1/17 each);
- ``bursts``: every member on for 5 s and off for 5 s, the phases staggered
  evenly across the fleet; while on it offers twice its average;
- ``churn``: the last quarter of the members (at least one) join at S/4; at S/2
  the first eighth (at least one) leave cleanly and the next eighth die without
  leaving (their leases must expire). Rates are computed over all N members, so
  the offered load follows the membership;
- ``total-change``: the total is cut to half at S/3 and raised back at 2S/3
  (``quota set``: the coordinator scales the holdings and publishes);
- ``skew``: ``uniform`` with clocks ±100 ms apart (unless ``skew_ms`` says otherwise).

Clock offsets, for any pattern: spread evenly over ``[-skew_ms, +skew_ms]`` and
shuffled. Members start within the first refresh interval, in random order.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from .._errors import ConfigurationError
from .._rate import parse_rate
from ..fleet.alloc import ALLOCATORS
from ..fleet.config import QuotaConfig

__all__ = [
    "MAX_MEMBERS",
    "PATTERNS",
    "Check",
    "Plan",
    "Result",
    "Scenario",
    "check",
    "documented",
    "make_plan",
]

PATTERNS = ("uniform", "skewed", "bursts", "churn", "total-change", "skew")
MAX_MEMBERS = 200
BURST_ON, BURST_OFF = 5.0, 5.0  # seconds
SKEW_PATTERN_MS = 100.0
BINS = 100  # a window's hundredths: 10 ms of a second


@dataclass(frozen=True)
class Scenario:
    """One simulated run (see the module docstring for the patterns)."""

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
                f"seconds must cover two windows and at most an hour, got {self.seconds}"
            )
        if not 0 <= self.demand <= 100:
            raise ConfigurationError(f"demand must be 0-100 times the total, got {self.demand}")
        for name in ("skew_ms", "max_wait", "pubsub_ms", "warmup"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigurationError(f"{name} must be >= 0, got {value}")
        if self.active is not None and not 0 <= self.active <= self.members:
            raise ConfigurationError(f"active must be 0-{self.members}, got {self.active}")
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

    def config(self, total: int | None = None) -> QuotaConfig:
        rate = parse_rate(self.rate)
        cap = self.cap if self.cap is not None else max(1, rate.limit // self.members)
        return QuotaConfig(
            f"{rate.limit if total is None else total}/{rate.period}seconds",
            self.algorithm,
            refresh=self.refresh,
            lease=self.lease,
            cap=cap,
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
        }


@dataclass
class Plan:
    """What a scenario's pattern makes happen; times in seconds from the start."""

    rates: list[float]  # arrivals a second while on (bursts: while in an on phase)
    skews_ns: list[int]  # each member's clock minus the true time
    joins: list[float]
    leaves: dict[int, float] = field(default_factory=dict)  # member -> when it leaves
    deaths: dict[int, float] = field(default_factory=dict)  # member -> when it dies
    bursts: list[float] | None = None  # each member's phase; None: always on
    totals: list[tuple[float, int]] = field(default_factory=list)  # when, new total

    late: set[int] = field(default_factory=set)  # members that join after the start

    def role(self, member: int) -> str:
        """What the member does in the run: member, joins late, leaves, dies."""
        if member in self.leaves:
            return "leaves"
        if member in self.deaths:
            return "dies"
        return "joins late" if member in self.late else "member"


def _weights(scenario: Scenario) -> list[float]:
    n = scenario.members
    weights = [1.0] * n
    if scenario.pattern == "skewed":
        for i in range(max(1, n // 10)):
            weights[i] = 10.0
    active = n if scenario.active is None else scenario.active
    return [w if i < active else 0.0 for i, w in enumerate(weights)]


def make_plan(scenario: Scenario, rng: random.Random) -> Plan:
    n, seconds = scenario.members, scenario.seconds
    window = scenario.window_ns / 1e9
    weights = _weights(scenario)
    offered = scenario.demand * scenario.total / window  # the fleet's callers, a second
    weight = sum(weights)
    rates = [offered * w / weight if weight else 0.0 for w in weights]
    skew = scenario.skew
    offsets = [(-skew + 2 * skew * i / (n - 1)) if n > 1 else 0.0 for i in range(n)]
    rng.shuffle(offsets)
    skews = [round(ms * 1e6) for ms in offsets]
    joins = [rng.uniform(0, scenario.refresh) for _ in range(n)]
    plan = Plan(rates, skews, joins)
    if scenario.pattern == "bursts":
        period = BURST_ON + BURST_OFF
        plan.rates = [r * period / BURST_ON for r in rates]
        plan.bursts = [period * i / n for i in range(n)]
    elif scenario.pattern == "churn":
        late, gone = max(1, n // 4), max(1, n // 8)
        for i in range(n - late, n):
            joins[i] = seconds / 4 + rng.uniform(0, scenario.refresh)
            plan.late.add(i)
        for i in range(gone):
            plan.leaves[i] = seconds / 2 + rng.uniform(0, scenario.refresh)
            plan.deaths[gone + i] = seconds / 2 + rng.uniform(0, scenario.refresh)
    elif scenario.pattern == "total-change":
        total = scenario.total
        plan.totals = [
            (round(seconds / 3 / window) * window, max(1, total // 2)),
            (round(2 * seconds / 3 / window) * window, total),
        ]
    return plan


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
      dying (``e/churn-16``: the same with 16, for the plot of the grants).
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
    return runs


# -- results ----------------------------------------------------------------------


@dataclass
class Result:
    """What one run measured (see the module docstring)."""

    scenario: Scenario
    backend: str
    admitted: list[int]  # per provider window
    limits: list[int]  # the provider's limit per window (the total at its start)
    offered: list[float]  # what the callers asked for per window (expected)
    bins: list[int]  # admitted per hundredth of a window, all windows end to end
    warmup: int  # windows left out of utilisation
    arrivals: int = 0
    waited: int = 0
    gave_up: int = 0
    waiting_at_end: int = 0  # callers still waiting when the run ended
    wait_ns: int = 0  # summed over the callers served after waiting
    refreshes: int = 0
    coord_max: float = 0.0  # largest held / total the coordinator reported
    coord_violations: int = 0
    local_max: float = 0.0  # largest sum of the members' grants / total, everyone informed
    local_violations: int = 0
    local_max_cut: float = 0.0  # ... while some member had not heard of a cut yet
    local_violations_cut: int = 0
    cut_unheard_ms: float = 0.0  # the longest such moment
    convergence: list[dict[str, Any]] = field(default_factory=list)
    reclaims: list[dict[str, Any]] = field(default_factory=list)
    reaches: list[dict[str, Any]] = field(default_factory=list)
    grants: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    departed: dict[str, float] = field(default_factory=dict)  # member: left or died, seconds
    held: list[tuple[float, float]] = field(default_factory=list)  # per window: coord, local
    member_admitted: list[int] = field(default_factory=list)  # after the warm-up
    events: int = 0
    wall: float = 0.0

    @property
    def over(self) -> list[tuple[int, int, int]]:
        """The provider windows over the limit: (index, admitted, limit)."""
        return [
            (k, a, lim)
            for k, (a, lim) in enumerate(zip(self.admitted, self.limits, strict=True))
            if a > lim
        ]

    @property
    def max_excess(self) -> float:
        """The worst window's excess over the limit, percent (0: none over)."""
        return max((100 * (a - lim) / lim for _, a, lim in self.over), default=0.0)

    @property
    def utilisation(self) -> float:
        """Admitted over min(limit, offered), summed over the windows after the warm-up."""
        span = range(self.warmup, len(self.admitted))
        room = sum(min(self.limits[k], self.offered[k]) for k in span)
        return sum(self.admitted[k] for k in span) / room if room > 0 else 0.0

    def _saturated(self) -> list[int]:
        return [
            k
            for k in range(self.warmup, len(self.admitted))
            if self.admitted[k] >= 0.9 * self.limits[k]
        ]

    def profile(self) -> list[float]:
        """Admitted per hundredth of a window, averaged over the saturated windows
        after the warm-up."""
        windows = self._saturated()
        out = [0.0] * BINS
        for k in windows:
            for b in range(BINS):
                out[b] += self.bins[k * BINS + b]
        return [x / len(windows) for x in out] if windows else out

    @property
    def bin_peak(self) -> float:
        """The fullest hundredth of any saturated window over that window's mean."""
        peak = 0.0
        for k in self._saturated():
            mean = self.admitted[k] / BINS
            peak = max(peak, max(self.bins[k * BINS : (k + 1) * BINS]) / mean)
        return peak

    @property
    def profile_peak(self) -> float:
        """The fullest hundredth of the averaged window over its mean."""
        profile = self.profile()
        mean = sum(profile) / BINS
        return max(profile) / mean if mean else 0.0

    @property
    def convergence_max(self) -> int | None:
        """Refreshes after joining until the slowest late joiner was within 5% of
        its target (-1: one never was); None: nobody joined late."""
        if not self.convergence:
            return None
        counts = [c["refreshes"] for c in self.convergence]
        return -1 if None in counts else max(counts)

    @property
    def reclaim_max(self) -> float | None:
        """Seconds from a death to the coordinator dropping the member, worst case."""
        times = [r["after_death"] for r in self.reclaims]
        if not times:
            return None
        return math.inf if None in times else max(times)

    @property
    def reach_max(self) -> tuple[float, int] | None:
        """The slowest change of the total to reach every member: seconds, refreshes."""
        if not self.reaches:
            return None
        return (
            max(r["seconds"] for r in self.reaches),
            max(r["refreshes"] for r in self.reaches),
        )

    @property
    def label(self) -> str:
        s = self.scenario
        return f"{s.pattern} {s.algorithm}{'' if s.pace else ' unpaced'}"

    def summary(self) -> dict[str, Any]:
        admitted = sum(self.admitted)
        return {
            "scenario": self.scenario.as_dict(),
            "backend": self.backend,
            "arrivals": self.arrivals,
            "admitted": admitted,
            "waited": self.waited,
            "gave_up": self.gave_up,
            "mean_wait_ms": self.wait_ns / 1e6 / max(1, self.waited),
            "refreshes": self.refreshes,
            "utilisation": self.utilisation,
            "windows_over": len(self.over),
            "max_excess_pct": self.max_excess,
            "grants_coordinator_max_ratio": self.coord_max,
            "grants_coordinator_violations": self.coord_violations,
            "grants_members_max_ratio": self.local_max,
            "grants_members_violations": self.local_violations,
            "grants_members_max_ratio_unheard_cut": self.local_max_cut,
            "grants_members_violations_unheard_cut": self.local_violations_cut,
            "cut_unheard_ms": self.cut_unheard_ms,
            "pacing_bin_peak": self.bin_peak,
            "pacing_profile_peak": self.profile_peak,
            "convergence_max_refreshes": self.convergence_max,
            "convergence": self.convergence,
            "reclaim_max_s": self.reclaim_max,
            "reclaims": self.reclaims,
            "reach": self.reaches,
            "admitted_per_window": self.admitted,
            "limit_per_window": self.limits,
            "events": self.events,
            "wall_s": self.wall,
        }


# -- the documented figures ---------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One figure of docs/fleet-simulation.md: measured, against its target
    (``ok`` None: shown beside the others, no target)."""

    figure: str
    what: str
    measured: str
    target: str
    ok: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "what": self.what,
            "measured": self.measured,
            "target": self.target,
            "ok": self.ok,
        }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def check(results: dict[str, Result]) -> list[Check]:
    """The figures (a)-(e) from the runs of `documented` (missing runs are skipped)."""
    out: list[Check] = []
    for key, r in results.items():
        if key.startswith(("a/", "b/", "a-poisson/", "b-poisson/")):
            figure, algorithm = key.split("/")
            # judged: the demand-based algorithms, callers as in the judging run
            strict = algorithm in ("fair_share", "proportional_share") and "-" not in figure
            worst = max(r.admitted)
            if figure.startswith("a"):
                out.append(
                    Check(figure, f"{algorithm}: busiest provider second", f"{worst}",
                          f"<= {r.limits[0]}", (worst <= r.limits[0]) if strict else None)
                )  # fmt: skip
                least = 0.95
            else:
                out.append(
                    Check("b", f"{algorithm}: worst provider second over the limit",
                          f"{r.max_excess:.2f}% ({worst}/{r.limits[0]})", "<= 1%",
                          (r.max_excess <= 1.0) if strict else None)
                )  # fmt: skip
                least = 0.97
            out.append(
                Check(figure, f"{algorithm}: utilisation", _pct(r.utilisation),
                      f">= {_pct(least)}", (r.utilisation >= least) if strict else None)
            )  # fmt: skip
    if "c/paced" in results:
        r = results["c/paced"]
        out.append(
            Check("c", "paced: fullest 10 ms over its second's mean (worst second)",
                  f"{r.bin_peak:.2f}x (averaged second: {r.profile_peak:.2f}x)", "<= 1.5x",
                  r.bin_peak <= 1.5)
        )  # fmt: skip
    if "c/unpaced" in results:
        r = results["c/unpaced"]
        out.append(
            Check("c", "unpaced: fullest 10 ms over its second's mean (worst second)",
                  f"{r.bin_peak:.1f}x (averaged second: {r.profile_peak:.1f}x)", "(spike)", None)
        )  # fmt: skip
    if results:
        coord = max(r.coord_max for r in results.values())
        local = max(r.local_max for r in results.values())
        over = sum(r.coord_violations + r.local_violations for r in results.values())
        out.append(
            Check("d", f"every run ({len(results)}): grants' sum / total, coordinator",
                  f"{coord:.4f}", "<= 1", coord <= 1)
        )  # fmt: skip
        out.append(
            Check("d", "every run: grants' sum / total, members (everyone informed)",
                  f"{local:.4f} ({over} steps over)", "<= 1", local <= 1 and over == 0)
        )  # fmt: skip
        for key in ("d/cut", "d/cut-no-pubsub"):
            if key in results:
                r = results[key]
                out.append(
                    Check("d", f"{key}: members' grants / new total before they heard",
                          f"{r.local_max_cut:.3f} for {r.cut_unheard_ms:.0f} ms",
                          "(reported)", None)
                )  # fmt: skip
                out.append(
                    Check("d", f"{key}: provider seconds over the limit",
                          f"{len(r.over)} (worst {r.max_excess:.2f}%)", "(reported)", None)
                )  # fmt: skip
    for key in ("e/churn", "e/churn-16"):
        if key not in results:
            continue
        r = results[key]
        conv = r.convergence_max
        slow = [c["refreshes"] for c in r.convergence]
        out.append(
            Check("e", f"{key}: refreshes until a new member is within 5% of its target"
                  f" ({len(slow)} joined)",
                  "never" if conv == -1 else f"{conv} (median {_median(slow)})", "<= 2",
                  conv is not None and 0 <= conv <= 2)
        )  # fmt: skip
        reclaim = r.reclaim_max
        past = max(
            (x["after_last_refresh"] - x["lease"] for x in r.reclaims if x["after_death"]),
            default=0.0,
        )
        out.append(
            Check("e", f"{key}: a dead member dropped, seconds after it died"
                  f" ({len(r.reclaims)} died)",
                  "never" if reclaim is None or math.isinf(reclaim)
                  else f"{reclaim:.2f} ({1000 * past:.0f} ms past its lease)",
                  f"<= lease ({r.scenario.lease:g})",
                  reclaim is not None and reclaim <= r.scenario.lease)
        )  # fmt: skip
    for key in ("d/cut", "d/cut-no-pubsub"):
        if key in results:
            r = results[key]
            reach = r.reach_max
            limit = "<= 1 refresh"
            ok = reach is not None and reach[1] <= 1
            if r.scenario.pubsub:  # by the message, unless the member's refresh came first
                limit += f", <= {r.scenario.pubsub_ms:g} ms"
                ok = ok and reach is not None and reach[0] * 1000 <= r.scenario.pubsub_ms + 1e-6
            out.append(
                Check("e", f"{key}: a change of the total reaches every member",
                      "never" if reach is None else f"{1000 * reach[0]:.0f} ms, {reach[1]} refresh",
                      limit, ok)
            )  # fmt: skip
    return out


def _median(values: list[Any]) -> str:
    known = sorted(v for v in values if v is not None)
    return str(known[len(known) // 2]) if known else "-"
