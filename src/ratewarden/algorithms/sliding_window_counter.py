from __future__ import annotations

from .._decision import Decision
from ._params import INF, Params, State

__all__ = ["sliding_window_counter"]


def sliding_window_counter(
    state: State | None, now: int, cost: int, p: Params
) -> tuple[Decision, State]:
    """Sliding window counter: the current epoch-aligned window's count plus the previous
    window's count weighted by how much of it the sliding window still overlaps.

    Exact integer form of ``prev * (end - now) / period + curr + cost <= limit``.
    It never admits more than ``limit`` in one aligned window.
    State: ``(full_at, prev, curr)``; the current window ends at ``full_at - period``
    when ``curr > 0``, else at ``full_at`` (a state is full once both counts fade).
    """
    limit, period = p.limit, p.period
    if state is None:
        end = now - now % period + period
        prev = curr = 0
    else:
        full_at, prev, curr = state
        end = full_at - period if curr else full_at
        if now >= end:  # roll to the window holding now
            prev = curr if now < end + period else 0
            curr = 0
            end = now - now % period + period
    weighted = prev * (end - now)  # request-ticks of the previous window still in view
    # limit - curr - ceil(weighted / period): what cost-1 requests could still pass
    remaining = limit - curr + (-weighted // period) if weighted else limit - curr
    if weighted + (curr + cost) * period <= p.span:
        curr += cost
        full_at = end + period
        return (
            Decision(True, limit, remaining - cost, (full_at - now) / p.hz, 0.0, p.rule),
            (full_at, prev, curr),
        )
    if cost > limit:
        retry = INF
    else:
        # The earliest tick this cost passes, by cases in time order:
        # - still in this window, only the previous window's weight can shrink enough,
        #   at t where prev * (end - t) <= (limit - curr - cost) * period;
        # - in the next window curr is the weighted one, from end on:
        #   curr * (end + period - t) <= (limit - cost) * period;
        # - two windows on, everything has faded (and cost <= limit).
        room = limit - curr - cost
        t = end - room * period // prev if room >= 0 and prev else end
        if t >= end:
            t = max(end, end + period - (limit - cost) * period // curr) if curr else end
        retry = (t - now) / p.hz
    full_at = end + period if curr else end if prev else now  # nothing counted: full now
    reset = (full_at - now) / p.hz if prev or curr else 0.0
    return Decision(False, limit, remaining, reset, retry, p.rule), (full_at, prev, curr)
