"""Hypothesis generators, kept in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from ratewarden import Limiter, Rate


@dataclass(frozen=True)
class Scenario:
    limit: int
    period: int  # ticks
    burst: int
    start: int  # first tick
    events: tuple[tuple[int, int], ...]  # (ticks since the previous event, cost)


@st.composite
def scenarios(draw: st.DrawFn, *, max_events: int = 30) -> Scenario:
    limit = draw(st.integers(1, 6))
    period = draw(st.integers(1, 30))
    burst = draw(st.one_of(st.just(limit), st.integers(1, 8)))
    start = draw(st.integers(0, 10**6))
    # Many zero gaps (bursts at one tick), small gaps near window edges, some long idles.
    gap = st.one_of(st.just(0), st.integers(0, period), st.integers(0, 3 * period + 5))
    cost = st.one_of(st.just(1), st.integers(1, max(limit, burst) + 2))
    events = draw(st.lists(st.tuples(gap, cost), min_size=1, max_size=max_events))
    return Scenario(limit, period, burst, start, tuple(events))


@dataclass(frozen=True)
class TierSpec:
    algorithm: str
    limit: int
    period_ms: int
    burst: int | None
    key: str  # the tier's key: few choices, so tiers of one limit share keys

    def limiter(self, store: Any, run: str = "t", kind: Any = Limiter) -> Any:
        """The tier as a ``kind`` (Limiter or AsyncLimiter) on ``store``, named so
        that equal specs in one ``run`` share counters."""
        algorithm, _, refill = self.algorithm.partition("/")
        return kind(
            Rate(self.limit, self.period_ms / 1000),
            algorithm=algorithm,
            refill="interval" if refill else "continuous",
            burst=self.burst,
            name=f"{run}-{self.algorithm}-{self.limit}-{self.period_ms}-{self.burst}",
            store=store,
        )


@dataclass(frozen=True)
class TiersScenario:
    tiers: tuple[TierSpec, ...]
    events: tuple[tuple[int, tuple[int, ...]], ...]  # (ms since the previous, cost per tier)


ALGORITHM_NAMES = (
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "leaky_bucket",
    "gcra",
    "token_bucket/interval",
)


@st.composite
def tier_scenarios(draw: st.DrawFn, *, max_events: int = 25) -> TiersScenario:
    """1-4 tiers of mixed algorithms and rates; a tier may repeat an earlier one (the
    same limit and key, checked twice in one request)."""
    tiers: list[TierSpec] = []
    for _ in range(draw(st.integers(1, 4))):
        if tiers and draw(st.integers(0, 4)) == 0:
            tiers.append(draw(st.sampled_from(tiers)))
            continue
        algorithm = draw(st.sampled_from(ALGORITHM_NAMES))
        limit = draw(st.integers(1, 6))
        burst = (
            draw(st.none() | st.integers(1, 8))
            if "bucket" in algorithm or algorithm == "gcra"
            else None
        )
        tiers.append(
            TierSpec(algorithm, limit, draw(st.integers(1, 40)), burst, draw(st.sampled_from("ab")))
        )
    most = max(max(t.limit, t.burst or 0) for t in tiers)
    cost = st.one_of(st.just(1), st.integers(1, most + 1))
    gap = st.one_of(st.just(0), st.integers(0, 50), st.integers(0, 200))
    events = draw(
        st.lists(st.tuples(gap, st.tuples(*[cost] * len(tiers))), min_size=1, max_size=max_events)
    )
    return TiersScenario(tuple(tiers), tuple(events))


@dataclass(frozen=True)
class SettleScenario:
    """Reservations on one key: ``ops`` are (ticks since the previous op, what,
    amount, pick): ``"reserve"`` an estimate of ``amount``; ``"settle"`` the
    ``pick``-th open reservation (modulo how many) at ``amount`` actual;
    ``"cancel"`` it."""

    limit: int
    period: int  # ticks
    burst: int
    start: int
    ops: tuple[tuple[int, str, int, int], ...]


@st.composite
def settle_scenarios(
    draw: st.DrawFn, *, max_ops: int = 30, same_tick: bool = False, big: bool = False
) -> SettleScenario:
    """``same_tick``: every op at the start tick (no refill, no window passes);
    ``big``: a limit no run can reach, so that no clamp applies."""
    limit = draw(st.integers(1, 8)) * (1000 if big else 1)
    period = draw(st.integers(1, 40))
    burst = limit if big else draw(st.one_of(st.just(limit), st.integers(1, 10)))
    start = draw(st.integers(0, 10**6))
    gap = (
        st.just(0)
        if same_tick
        else st.one_of(st.just(0), st.integers(0, period), st.integers(0, 3 * period + 5))
    )
    top = 12 if big else max(limit, burst) + 3
    op = st.tuples(
        gap,
        st.sampled_from(("reserve", "reserve", "settle", "settle", "cancel")),
        st.integers(0, top),
        st.integers(0, 50),
    )
    ops = draw(st.lists(op, min_size=1, max_size=max_ops))
    return SettleScenario(limit, period, burst, start, tuple(ops))
