"""The `Result` a run of `ratewarden simulate` fills in: what the provider
counted, window by window and per hundredth of a window, the largest ratios of
the grants' sum to the total, convergence, reclaims and reach, and the figures
drawn from them (`_measure` fills it in as a run goes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._scenarios import Scenario

__all__ = ["BINS", "Result"]

BINS = 100  # a window's hundredths: 10 ms of a second


@dataclass
class Result:
    """What one run measured (`_command`'s docstring says how)."""

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
    # members started before the coordinator answered: how soon after it
    # answered each held its share (seconds, refreshes; None: never)
    answered: list[dict[str, Any]] = field(default_factory=list)
    reclaims: list[dict[str, Any]] = field(default_factory=list)
    reaches: list[dict[str, Any]] = field(default_factory=list)
    grants: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    departed: dict[str, float] = field(default_factory=dict)  # member: left or died, seconds
    held: list[tuple[float, float]] = field(default_factory=list)  # per window: coord, local
    member_admitted: list[int] = field(default_factory=list)  # after the warm-up
    member_windows: list[list[int]] = field(default_factory=list)  # per member, per window
    times: list[int] = field(default_factory=list)  # each admission, ns from the start
    events: int = 0
    wall: float = 0.0

    @property
    def rolling_max(self) -> int:
        """The most admissions in any stretch of one window, wherever it starts
        (half open, on the provider's clock), after the warm-up."""
        window = self.scenario.window_ns
        start = self.warmup * window
        times = [t for t in self.times if t >= start]
        most = first = 0
        for last, t in enumerate(times):
            while times[first] <= t - window:
                first += 1
            most = max(most, last - first + 1)
        return most

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
    def answered_max(self) -> tuple[float, int] | None:
        """Seconds and refreshes from the coordinator answering until the slowest
        member started before it held its share (inf, -1: one never did); None:
        it answered from the start."""
        if not self.answered:
            return None
        if any(a["seconds"] is None for a in self.answered):
            return math.inf, -1
        return (
            max(a["seconds"] for a in self.answered),
            max(a["refreshes"] for a in self.answered),
        )

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

    def fairness(self, members: list[int], *, start: int | None = None) -> list[float]:
        """Each of ``members``' admitted a window from window ``start`` (the warm-up's
        end) on, over their mean: 1.0 each when they were served alike."""
        first = self.warmup if start is None else start
        rates = [sum(self.member_windows[i][first:]) for i in members]
        mean = sum(rates) / len(rates) if rates else 0.0
        return [r / mean if mean else 0.0 for r in rates]

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
            "rolling_max": self.rolling_max,
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
            "answered": self.answered,
            "reclaim_max_s": self.reclaim_max,
            "reclaims": self.reclaims,
            "reach": self.reaches,
            "admitted_per_window": self.admitted,
            "limit_per_window": self.limits,
            "events": self.events,
            "wall_s": self.wall,
        }
