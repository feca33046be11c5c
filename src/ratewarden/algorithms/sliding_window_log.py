from __future__ import annotations

from bisect import bisect_right

from .._decision import Decision
from ._params import INF, Params, State

__all__ = ["sliding_window_log"]


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
