"""Token bucket, leaky bucket (as a meter) and GCRA.

The three are one algorithm seen from three sides: a token bucket of capacity
``burst`` refilled at ``limit/period``; a leaky bucket of the same size leaking at
that rate, whose level is the bucket's missing tokens; and GCRA's theoretical
arrival time (TAT), which is the moment the bucket is full again. They admit exactly
the same requests, so they share one step, written in GCRA's form because its state
is a single number. The tests check it against three separate naive models.

Integer arithmetic keeps it exact for any rate: time is counted in ``1/scale`` ticks
and a token costs ``unit`` of those, with ``unit/scale == period/limit`` reduced.
"""

from __future__ import annotations

from ..primitives import Decision
from ._params import INF, Params, State

__all__ = ["bucket", "token_bucket_interval"]


def bucket(state: State | None, now: int, cost: int, p: Params) -> tuple[Decision, State]:
    """Continuous bucket (token bucket = leaky bucket meter = GCRA): capacity ``burst``,
    refilled at ``limit`` per ``period``.

    State: ``(full_at, rem)``: the bucket is full again at the exact scaled tick
    ``full_at * scale - rem`` (``0 <= rem < scale``, so ``full_at`` is that rounded
    up to a whole tick). The step works on the debt (missing tokens, in scaled
    units) relative to ``now``: small numbers, not the epoch scaled up.
    """
    scale = p.scale
    debt = 0 if state is None or state[0] <= now else (state[0] - now) * scale - state[1]
    new_debt = debt + cost * p.unit
    if new_debt <= p.capacity:
        if scale == 1:  # the emission interval is whole ticks: no rounding to do
            wait, rem = new_debt, 0
        else:
            wait = -(-new_debt // scale)  # whole ticks until full again
            rem = wait * scale - new_debt
        return (
            Decision(True, p.burst, (p.capacity - new_debt) // p.unit, wait / p.hz, 0.0,
                     p.rule),
            (now + wait, rem),
        )  # fmt: skip
    # ceil((new_debt - capacity) / scale): when enough has drained for this cost
    retry = INF if cost > p.burst else -((p.capacity - new_debt) // scale) / p.hz
    if not debt:
        return Decision(False, p.burst, p.burst, 0.0, retry, p.rule), (now, 0)
    # A settled over-run can leave the bucket in debt (see settle): none remain.
    return (
        Decision(False, p.burst, max((p.capacity - debt) // p.unit, 0),
                 (state[0] - now) / p.hz, retry, p.rule),  # type: ignore[index]
        state,  # type: ignore[return-value]
    )  # fmt: skip


def token_bucket_interval(
    state: State | None, now: int, cost: int, p: Params
) -> tuple[Decision, State]:
    """Token bucket refilled to ``burst`` once per ``period``, and never more: the hard,
    burst-free quota of a paid API ("1000 per day").

    The period starts with the first take from a full bucket, so a bucket left alone
    until its refill is the same as a new one. State: ``(refill_at, left)``.
    """
    if state is None or now >= state[0]:
        refill_at, left = now + p.period, p.burst
    else:
        refill_at, left = state
    wait = (refill_at - now) / p.hz
    if cost <= left:
        return Decision(True, p.burst, left - cost, wait, 0.0, p.rule), (refill_at, left - cost)
    retry = wait if cost <= p.burst else INF
    if left == p.burst:  # untouched bucket: keep no timer running
        return Decision(False, p.burst, left, 0.0, retry, p.rule), (now, left)
    return Decision(False, p.burst, left, wait, retry, p.rule), (refill_at, left)
