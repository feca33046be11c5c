from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from ..primitives import Decision

__all__ = ["INF", "Algorithm", "Params", "State", "Step"]

INF = math.inf

# A state is a tuple whose element 0 is ``full_at``: the tick from which the state
# means the same as no state at all. Stores rely on that to expire idle keys
# without knowing the algorithm.
State: TypeAlias = tuple[int, ...]
Step: TypeAlias = Callable[[State | None, int, int, "Params"], tuple[Decision, State]]


@dataclass(frozen=True, slots=True)
class Params:
    """A limit compiled for integer ticks (nanoseconds in the memory store).

    ``scale``/``unit`` express the emission interval ``period/limit`` exactly:
    the buckets count time in units of ``1/scale`` tick and a token costs
    ``unit`` of them, where ``unit/scale == period/limit`` in lowest terms.
    """

    limit: int
    period: int  # ticks
    burst: int  # bucket capacity; equals limit unless set
    tick: float  # seconds per tick
    hz: float  # ticks per second: durations are ticks / hz, correctly rounded
    rule: str | None
    scale: int
    unit: int
    capacity: int  # burst * unit: the bucket's size in scaled units
    span: int  # limit * period: a window's size in request-ticks

    @classmethod
    def build(
        cls, limit: int, period: int, *, burst: int | None = None, tick: float = 1e-9,
        rule: str | None = None,
    ) -> Params:  # fmt: skip
        g = math.gcd(period, limit)
        burst = limit if burst is None else burst
        unit = period // g
        # Dividing by a whole number of ticks per second rounds once, to the nearest
        # double: 60 s of nanoseconds is exactly 60.0, where ticks * 1e-9 gives
        # 60.00000000000001 and a header rounded up would say 61.
        hz = float(round(1 / tick)) if tick <= 1 else 1 / tick
        return cls(
            limit, period, burst, tick, hz, rule, limit // g, unit, burst * unit, limit * period
        )


@dataclass(frozen=True, slots=True)
class Algorithm:
    """A named pure step function: ``step(state, now, cost, params) -> (Decision, state)``."""

    name: str
    step: Step
    uses_burst: bool

    def __repr__(self) -> str:
        return f"<Algorithm {self.name}>"
