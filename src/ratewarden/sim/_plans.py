"""The `Plan` a scenario's pattern makes: who joins, leaves or dies when, each
member's arrival rate and clock offset, the total's changes.

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

Closed-loop callers, for any pattern (``workers``): the first ``closed`` members
with demand (all, by default) have that many workers each instead of arrivals,
each blocking in ``acquire(max_wait)`` and asking again ``think_ms`` after it
was served or gave up. Such a member offers ``workers / think`` a second, or the
whole total when the workers never pause. They are never off in ``bursts``.

Clock offsets, for any pattern: spread evenly over ``[-skew_ms, +skew_ms]`` and
shuffled. Members start within the first refresh interval, in random order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ._scenarios import Scenario

__all__ = ["BURST_OFF", "BURST_ON", "Plan", "make_plan"]

BURST_ON, BURST_OFF = 5.0, 5.0  # seconds


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
    workers: list[int] = field(default_factory=list)  # closed-loop callers per member; 0: open

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
    plan.workers = [0] * n
    closed = scenario.closed_count
    for i in [i for i in range(n) if weights[i] > 0][:closed]:
        plan.workers[i] = scenario.workers
        think = scenario.think_ms / 1000
        rates[i] = scenario.workers / think if think else scenario.total / window
    if scenario.pattern == "bursts":
        period = BURST_ON + BURST_OFF
        plan.rates = [r if plan.workers[i] else r * period / BURST_ON for i, r in enumerate(rates)]
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
