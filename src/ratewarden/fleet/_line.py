"""The line a fleet quota's waiting callers stand in: priority classes, no I/O.

A caller that gets no permit at once joins one line per quota, kept in class
order (higher ``priority`` first) and, within a class, in arrival order; only
the head waits for the share (reserving its paced slot as before) and the next
takes over when it has its permit or gives up. A newcomer never takes a permit
while others wait: it joins them. The head keeps the turn while it waits (a
higher class that arrives meanwhile waits for that one permit, then goes before
every lower class), and every caller keeps its own deadline: one that cannot be
served in time is told as soon as the head's wait shows it (`_waiting`).
"""

from __future__ import annotations

import math
import threading

from .._clock import Clock
from .._errors import RateLimitTimeout
from .._waiting import check_max_wait
from ._member import Member
from ._shell import check_cost

__all__ = ["LINE", "Line"]

LINE = "permits"  # one line per quota


class Line:
    """What the twins add for the line: deadlines, the head's fresh try, and
    counting a caller's demand once."""

    _member: Member
    _lock: threading.Lock
    name: str
    clock: Clock

    def _asked(self, max_wait: float, cost: int) -> int:
        """A newcomer that joins the line: its demand counts, it takes nothing."""
        check_max_wait(max_wait)
        check_cost(cost)
        with self._lock:
            self._member.share.asked += cost
        return 1

    def _deadline(self, max_wait: float, wait: int) -> float:
        now = self.clock.time_ns()
        if math.isinf(max_wait):
            return math.inf
        if max_wait == 0:
            raise RateLimitTimeout(
                f"quota {self.name!r}: no permit now (next in {wait / 1e9:.6g}s)",
                key=self.name,
                retry_after=wait / 1e9,
            )
        return now + round(max_wait * 1e9)

    def _left(self, deadline: float) -> float:
        return math.inf if math.isinf(deadline) else (deadline - self.clock.time_ns()) / 1e9

    def _take(self, cost: int) -> int:
        """The head's try on its turn: 0 when it got the permit, else ns to wait."""
        share = self._member.share
        with self._lock:
            return share.take(self.clock.time_ns(), cost)

    def _no_turn(self, max_wait: float) -> RateLimitTimeout:
        return RateLimitTimeout(
            f"quota {self.name!r}: no permit within max_wait={max_wait}s"
            " (callers of the same or a higher class still waiting)",
            key=self.name,
            retry_after=max_wait,
        )
