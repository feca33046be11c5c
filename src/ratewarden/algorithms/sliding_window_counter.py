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
        if now >= end:
            prev = curr if now < end + period else 0
            curr = 0
            end = now - now % period + period
    weighted = prev * (end - now)  # request-ticks of the previous window still in view
    if weighted + (curr + cost) * period <= limit * period:
        curr += cost
        full_at = end + period
        remaining = limit - curr + (-weighted // period)  # limit - curr - ceil(weighted/period)
        return (
            Decision(True, limit, remaining, (full_at - now) * p.tick, 0.0, p.rule),
            (full_at, prev, curr),
        )
    full_at = end + period if curr else end if prev else now  # nothing counted: full now
    remaining = limit - curr + (-weighted // period)
    retry = INF if cost > limit else (_first_pass(end, p, prev, curr, cost) - now) * p.tick
    reset = (full_at - now) * p.tick if prev or curr else 0.0
    return Decision(False, limit, remaining, reset, retry, p.rule), (full_at, prev, curr)


def _first_pass(end: int, p: Params, prev: int, curr: int, cost: int) -> int:
    """The earliest tick at which ``cost`` passes, when it does not pass now.

    Cases, in time order:
    - still in this window: only the previous window's weight can shrink enough,
      at ``t`` where ``prev * (end - t) <= (limit - curr - cost) * period``;
    - in the next window, ``curr`` becomes the weighted one:
      ``curr * (end + period - t) <= (limit - cost) * period``, from ``end`` on;
    - two windows on, everything has faded (cost <= limit holds here).
    """
    limit, period = p.limit, p.period
    room = limit - curr - cost
    if room >= 0 and prev:
        t = end - room * period // prev
        if t < end:
            return t
    if curr:
        return max(end, end + period - (limit - cost) * period // curr)
    return end
