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

from .._decision import Decision
from ._params import INF, Params, State

__all__ = ["bucket", "token_bucket_interval"]


def bucket(state: State | None, now: int, cost: int, p: Params) -> tuple[Decision, State]:
    """Continuous bucket (token bucket = leaky bucket meter = GCRA): capacity ``burst``,
    refilled at ``limit`` per ``period``.

    State: ``(full_at, tat)`` where ``tat`` is the scaled tick at which the bucket is
    full again and ``full_at = ceil(tat / scale)``.
    """
    scale = p.scale
    now_s = now * scale
    tat = now_s if state is None or state[1] <= now_s else state[1]
    new_tat = tat + cost * p.unit
    if new_tat - now_s <= p.capacity:
        full_at = -(-new_tat // scale)
        return (
            Decision(True, p.burst, (p.capacity - new_tat + now_s) // p.unit,
                     (full_at - now) * p.tick, 0.0, p.rule),
            (full_at, new_tat),
        )  # fmt: skip
    # ceil((new_tat - capacity) / scale): when enough has drained for this cost
    retry = INF if cost > p.burst else (-((p.capacity - new_tat) // scale) - now) * p.tick
    if state is None or tat == now_s:
        return Decision(False, p.burst, p.burst, 0.0, retry, p.rule), (now, now_s)
    return (
        Decision(False, p.burst, (p.capacity - tat + now_s) // p.unit,
                 (state[0] - now) * p.tick, retry, p.rule),
        state,
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
    wait = (refill_at - now) * p.tick
    if cost <= left:
        return Decision(True, p.burst, left - cost, wait, 0.0, p.rule), (refill_at, left - cost)
    retry = wait if cost <= p.burst else INF
    if left == p.burst:  # untouched bucket: keep no timer running
        return Decision(False, p.burst, left, 0.0, retry, p.rule), (now, left)
    return Decision(False, p.burst, left, wait, retry, p.rule), (refill_at, left)
