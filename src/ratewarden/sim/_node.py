"""One simulated member of `ratewarden simulate` (`Node`): its `Member`, its
clock, its callers' state and its bookkeeping."""

from __future__ import annotations

from collections import deque

from ..fleet.member import Member
from ._backend import _MemberClock

__all__ = ["Node"]


class Node:
    """One simulated member. Its events carry the generation (``*_gen``) they
    were scheduled in: a change (a new rate, a departure) moves the generation,
    and an event of an older one is dropped when it comes due."""

    __slots__ = (
        "act_gen",
        "admitted",
        "arrive_gen",
        "clock",
        "due",
        "id",
        "index",
        "joined_at",
        "joined_refreshes",
        "last_refresh",
        "local",
        "member",
        "on",
        "queue",
        "rate",
        "refresh_gen",
        "refreshes",
        "serve_gen",
        "serving",
        "skew",
        "tracked",
    )

    def __init__(self, index: int, skew: int, clock: _MemberClock) -> None:
        self.index = index
        self.id = f"member-{index:03d}"
        self.skew = skew
        self.clock = clock
        self.member: Member | None = None
        self.rate = 0.0  # arrivals a second now
        self.on = True
        # waiting callers: deadline, since, and the worker (-1: an open-loop caller)
        self.queue: deque[tuple[int, int, int]] = deque()
        self.serving = False
        self.due = 0  # callers holding a reserved permit not yet due
        self.arrive_gen = self.refresh_gen = self.serve_gen = self.act_gen = 0
        self.local = 0  # the grant it spends now, millipermits
        self.refreshes = self.joined_refreshes = 0
        self.joined_at = self.last_refresh = 0
        self.admitted = 0
        self.tracked = False  # convergence measured for it

    @property
    def alive(self) -> bool:
        return self.member is not None
