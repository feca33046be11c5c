"""Rate-limiting algorithms as pure step functions.

``step(state, now, cost, params) -> (Decision, new_state)``: no clock, no I/O, no
locks. Time is integer ticks (nanoseconds in the memory store). These functions are
the reference every store must agree with.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..primitives import ConfigurationError, Decision
from ._params import Algorithm, Params, State, Step
from .bucket import bucket, token_bucket_interval
from .windows import fixed_window, sliding_window_counter, sliding_window_log

__all__ = ["ALGORITHMS", "Algorithm", "Params", "State", "Step", "get_algorithm", "peek"]

Refill = Literal["continuous", "interval"]


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("fixed_window", fixed_window, uses_burst=False),
        Algorithm("sliding_window_log", sliding_window_log, uses_burst=False),
        Algorithm("sliding_window_counter", sliding_window_counter, uses_burst=False),
        Algorithm("token_bucket", bucket, uses_burst=True),
        Algorithm("leaky_bucket", bucket, uses_burst=True),
        Algorithm("gcra", bucket, uses_burst=True),
    )
}
_INTERVAL = Algorithm("token_bucket", token_bucket_interval, uses_burst=True)


def get_algorithm(name: str, *, refill: Refill = "continuous") -> Algorithm:
    """The algorithm called ``name``; ``refill="interval"`` selects the token bucket
    that refills once per period. Unknown names raise `ConfigurationError`."""
    algorithm = ALGORITHMS.get(name) if isinstance(name, str) else None  # type: ignore[redundant-expr]
    if algorithm is None:
        raise ConfigurationError(f"unknown algorithm {name!r}: use one of {', '.join(ALGORITHMS)}")
    if refill == "interval":
        if name != "token_bucket":
            raise ConfigurationError(
                f"refill='interval' is a token_bucket mode, not one of {name!r}"
            )
        return _INTERVAL
    if refill != "continuous":
        raise ConfigurationError(f"refill must be 'continuous' or 'interval', got {refill!r}")
    return algorithm


def peek(step: Step, state: State | None, now: int, cost: int, params: Params) -> Decision:
    """What a hit of ``cost`` would be told, counting nothing: ``allowed`` and
    ``retry_after`` for that cost, ``remaining`` and ``reset_after`` as they stand."""
    decision = step(state, now, cost, params)[0]
    if not decision.allowed:  # a denial already describes the state as it stands
        return decision
    # A cost no limit can hold is denied without counting and reports the state.
    current = step(state, now, max(params.limit, params.burst) + 1, params)[0]
    return msgspec.structs.replace(
        decision, remaining=current.remaining, reset_after=current.reset_after
    )
