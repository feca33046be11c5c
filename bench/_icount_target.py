"""One candidate's hit loop, run under callgrind by bench_instructions.py.

usage: _icount_target.py CANDIDATE PASSES
Builds the candidate, warms every key once, then makes PASSES passes over the keys.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from limits import parse, storage, strategies

from ratewarden import Limiter

KEYS = [f"user:{i}" for i in range(1000)]
BIG = 10**9  # per hour: never reached
LOG = 1000  # per hour for log-based candidates: each key's log stays small


def build(name: str) -> Callable[[str], object]:
    if name == "floor":
        counts: dict[str, int] = {}

        def floor(key: str) -> bool:
            value = counts.get(key, 0) + 1
            counts[key] = value
            return value <= BIG

        return floor
    if name.startswith("limits:"):
        store = storage.MemoryStorage()
        # Its expiry timer fires every 10 ms of wall time, so under callgrind's slowdown
        # how often it runs is arbitrary: switch it off. This favours the anchor.
        store.timer.cancel()
        store._MemoryStorage__schedule_expiry = lambda: None  # type: ignore[attr-defined]
        kind, limit = {
            "fixed_window": (strategies.FixedWindowRateLimiter, BIG),
            "moving_window": (strategies.MovingWindowRateLimiter, LOG),
            "sliding_window_counter": (strategies.SlidingWindowCounterRateLimiter, BIG),
        }[name.split(":", 1)[1]]
        item = parse(f"{limit}/hour")
        hit = kind(store).hit
        return lambda key: hit(item, key)
    algorithm, _, refill = name.partition(":")
    limit = LOG if algorithm == "sliding_window_log" else BIG
    return Limiter(f"{limit}/hour", algorithm=algorithm, refill=refill or "continuous").hit  # type: ignore[arg-type]


def main() -> None:
    name, passes = sys.argv[1], int(sys.argv[2])
    f = build(name)
    for key in KEYS:
        f(key)
    for _ in range(passes):
        for key in KEYS:
            f(key)


if __name__ == "__main__":
    main()
