""" """

from __future__ import annotations

from bisect import bisect_right

from ..primitives import Decision
from ._params import INF, Params, State

__all__ = [
    "fixed_window",
    "sliding_window_counter",
    "sliding_window_log",
]


def fixed_window(state: State | None, now: int, cost: int, p: Params) -> tuple[Decision, State]:
    """Fixed window aligned to the epoch: at most ``limit`` per ``[k*period, (k+1)*period)``.

    State: ``(window_end, used)``.
    """
    limit = p.limit
    if state is not None and now < state[0]:
        end, used = state
    else:
        end = now - now % p.period + p.period
        used = 0
    count = used + cost
    if count <= limit:
        return Decision(True, limit, limit - count, (end - now) / p.hz, 0.0, p.rule), (end, count)
    # The next window starts empty, so any cost the limit can hold passes at its edge.
    wait = (end - now) / p.hz
    return (
        Decision(False, limit, limit - used, wait if used else 0.0,
                 wait if cost <= limit else INF, p.rule),
        state if used else (now, 0),  # type: ignore[return-value]
    )  # fmt: skip


def sliding_window_log(
    state: State | None, now: int, cost: int, p: Params
) -> tuple[Decision, State]:
    """Sliding window log: at most ``limit`` in any ``period``-long window ``(t - period, t]``.

    Exact, and memory grows with the limit: one entry per admitted unit of cost.
    State: ``(full_at, e1, ..., en)`` where ``e`` are the ticks at which admitted units
    leave the window, ascending, and ``full_at == en``.
    """
    limit = p.limit
    cut = 1 if state is None else bisect_right(state, now, 1)  # units before cut have left
    live: State = () if state is None else state[cut:]
    count = len(live)
    if count + cost <= limit:
        expiry = now + p.period
        new = (expiry, *live, *((expiry,) * cost))
        return (
            Decision(True, limit, limit - count - cost, p.period / p.hz, 0.0, p.rule),
            new,
        )
    # Passes once the oldest ``count + cost - limit`` units have left the window.
    retry = INF if cost > limit else (live[count + cost - limit - 1] - now) / p.hz
    if count:
        return (
            Decision(False, limit, limit - count, (live[-1] - now) / p.hz, retry, p.rule),
            state if cut == 1 else (live[-1], *live),  # type: ignore[return-value]
        )
    return Decision(False, limit, limit, 0.0, retry, p.rule), (now,)


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
