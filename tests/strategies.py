"""Hypothesis generators, kept in one place."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st


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
