"""What the Redis benchmarks share: redis-server's CPU, and a ratio judged
round by round.

This machine's speed moves within seconds, so one candidate's minimum over the
rounds may come from a quick moment that another never met. The candidates of
one round ran a moment apart: the median over rounds of their ratio in each
round compares them on the same machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

__all__ = ["per_round", "server_cpu_ns"]


def server_cpu_ns(pid: int) -> int:
    """redis-server's main thread's time on a CPU so far, in nanoseconds."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def per_round(a: Sequence[float], b: Sequence[float]) -> float:
    """The median over rounds of ``a``'s figure over ``b``'s in the same round."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))
