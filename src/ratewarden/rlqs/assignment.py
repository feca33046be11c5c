"""A proxy's grant as Envoy enforces it, no I/O.

Envoy 1.40's filter enforces two of the protocol's strategies: a blanket rule and
a token bucket (``requests_per_time_unit`` is logged as unsupported and
ignored). Its token bucket refills continuously at ``tokens_per_fill`` over
``fill_interval`` *in whole seconds* (the nanos are dropped: a fraction of a
second reads as no limit at all). A bucket's first assignment starts full; a
changed one keeps the fill fraction of the one before. So:

- the rate is sent as tokens per ``FILL`` seconds, a tenth of a request a second
  fine, rounded down so that the proxies' rates never sum past their grants;
- the bucket holds little (``max_tokens``): what a proxy can spend at once,
  above its pace, when its bucket is new;
- an assignment changes only when the grant falls, or rises by a step worth it:
  a grant that wavers with measured demand would otherwise change the proxy's
  bucket at every report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["FILL", "Assignment", "assign", "steady"]

FILL = 10  # seconds of a token bucket's fill interval: rates in tenths of a request
BURST = 0.02  # of a second's rate: what a proxy's bucket holds beyond its pace
UINT32 = 2**32 - 1  # the token bucket's fields are 32-bit
STEP = 0.05  # of the rate: the least rise that changes an assignment


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a proxy is told for one bucket: ``deny`` (a grant below a tenth of a
    request a second), ``allow`` (a bucket no rule limits), or ``tokens``."""

    kind: Literal["tokens", "deny", "allow"]
    tokens_per_fill: int = 0  # over FILL seconds
    max_tokens: int = 0

    @property
    def per_second(self) -> float:
        return self.tokens_per_fill / FILL


def assign(per_second: float) -> Assignment:
    """The token bucket for a grant of ``per_second`` requests a second."""
    tokens = min(UINT32, math.floor(per_second * FILL + 1e-9))
    if tokens <= 0:
        return Assignment("deny")
    burst = min(UINT32, max(2, math.ceil(per_second * BURST)))
    return Assignment("tokens", tokens, burst)


def steady(current: Assignment | None, new: Assignment) -> Assignment:
    """``new``, or ``current`` when the change is a rise too small to be worth a
    fresh bucket: under ``STEP`` of the rate, or a request a second."""
    if current is None or current.kind != "tokens" or new.kind != "tokens":
        return new
    rise = new.per_second - current.per_second
    if 0 <= rise < max(STEP * current.per_second, 1.0):
        return current
    return new
