from __future__ import annotations

from .._decision import Decision
from ._params import INF, Params, State

__all__ = ["fixed_window"]


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
