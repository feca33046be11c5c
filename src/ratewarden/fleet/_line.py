"""The line a fleet quota's waiting callers stand in: priority classes, no I/O.

A caller that gets no permit at once joins one line per quota, kept in class
order (higher ``priority`` first) and, within a class, in arrival order; only
the head waits for the share (reserving its paced slot as before) and the next
takes over when it has its permit or gives up. A newcomer never takes a permit
while others wait: it joins them. The head keeps the turn while it waits (a
higher class that arrives meanwhile waits for that one permit, then goes before
every lower class), and every caller keeps its own deadline: one that cannot be
served in time is told as soon as the head's wait shows it (`_waiting`).

What `FleetQuota` and `AsyncFleetQuota` share: the member, its lock, acquire's
logic (a generator of the sleeps the twins take their own way), what a message
on the resource's channel means, and their reprs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Generator
from typing import Any

from ..kernel import check_max_wait
from ..primitives import Clock, ConfigurationError, RateLimitTimeout, default_clock
from .config import QuotaConfig
from .member import Member

__all__ = [
    "LINE",
    "POLL",
    "Line",
    "QuotaCore",
    "check_cost",
    "current_caller",
    "log",
]

LINE = "permits"  # one line per quota


class Line:
    """What the twins add for the line: deadlines, the head's fresh try, and
    counting a caller's demand once."""

    _member: Member
    _lock: threading.Lock
    name: str
    clock: Clock

    def _asked(self, max_wait: float, cost: int, caller: object) -> int:
        """A newcomer that joins the line: its demand counts, it takes nothing."""
        check_max_wait(max_wait)
        check_cost(cost)
        with self._lock:
            self._member.share.ask(self.clock.time_ns(), cost, caller)
        return 1

    def _done(self, caller: object) -> None:
        """A call that `_asked` or `_first` counted returned, served or not
        (None: counted without its caller, nothing to note)."""
        if caller is None:
            return
        with self._lock:
            self._member.share.done(self.clock.time_ns(), caller)

    def _deadline(self, max_wait: float, wait: int) -> float:
        now = self.clock.time_ns()
        if math.isinf(max_wait):
            return math.inf
        if max_wait == 0:
            raise _timeout(self._member, max_wait, wait)
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


log = logging.getLogger("ratewarden.fleet")

POLL = 0.1  # seconds the refresh loop waits on the channel at most, so close() is prompt


def _config(config: QuotaConfig | str | None) -> QuotaConfig | None:
    if config is None or isinstance(config, QuotaConfig):
        return config
    return QuotaConfig(config)


def current_caller() -> object:
    """Who calls: its asyncio task, else its thread; a caller that comes back
    shows how much its waiting held it back (see `_share`). The object itself,
    not its number: a thread made for each call may get a finished one's
    number, and would read as that one coming back."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        task = None
    return threading.current_thread() if task is None else task


def check_cost(cost: int) -> None:
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"cost must be a positive integer, got {cost!r}")


def _timeout(member: Member, max_wait: float, wait_ns: int) -> RateLimitTimeout:
    """Why a caller gave up, and when to ask again: when the next permit falls
    due, or, for a member that holds no permits at all, at its next refresh."""
    within = "now" if max_wait == 0 else f"within max_wait={max_wait:g}s"
    share = member.share
    if share.grant == 0 and share.pending is None:
        retry = member.next_delay()
        return RateLimitTimeout(
            f"quota {member.name!r}: no permit {within}: {member.why_nothing()};"
            f" retry_after={retry:.3g}s (its next refresh)",
            key=member.name,
            retry_after=retry,
        )
    return RateLimitTimeout(
        f"quota {member.name!r}: no permit {within}: the next one is due in"
        f" {wait_ns / 1e9:.3g}s, past the deadline (this member holds {member.grant:.6g}"
        " permits a window); retry_after is when it falls due",
        key=member.name,
        retry_after=wait_ns / 1e9,
    )


class QuotaCore:
    """What the twins share: the member, its lock, acquire's logic, the channel's
    messages, their reprs."""

    _member: Member
    _lock: threading.Lock
    name: str
    clock: Clock
    _caller: Callable[[], object]  # who calls: the twin says (see `current_caller`)

    def _setup(
        self,
        name: str,
        redis: Any,
        *,
        config: QuotaConfig | str | None,
        member_id: str | None,
        pace: bool,
        clock: Clock | None,
        background: bool,
        wants: Callable[[], float | None] | None = None,
        replace_config: bool = False,
    ) -> None:
        self.background = background
        self.clock = default_clock() if clock is None else clock
        self._member = Member(
            name,
            self.clock,
            member_id=member_id,
            pace=pace,
            config=_config(config),
            wants=wants,
            replace_config=replace_config,
        )
        if replace_config and config is None:
            raise ConfigurationError("replace_config=True needs config=, the one to store")
        self.name = self._member.name
        self._owns_client = isinstance(redis, str)
        self._lock = threading.Lock()  # held for microseconds, never across an await
        self._started = False

    def _first(self, max_wait: float, cost: int, caller: object) -> int:
        """acquire's first try: 0 when granted, else the nanoseconds to wait."""
        check_max_wait(max_wait)
        check_cost(cost)
        share = self._member.share
        with self._lock:
            now = self.clock.time_ns()
            share.ask(now, cost, caller)
            return share.take(now, cost)

    def _waits(self, wait: int, max_wait: float, cost: int) -> Generator[float, None, None]:
        """acquire's waiting, for the twins to sleep through: the seconds of each
        sleep; `RateLimitTimeout` once the deadline cannot be met. A caller
        reserves its permit as soon as one can be (see `Share.reserve`) and
        then only sleeps until it falls due."""
        clock, lock = self.clock, self._lock
        now = clock.time_ns()
        deadline = math.inf if math.isinf(max_wait) else now + round(max_wait * 1e9)
        if now + wait > deadline:
            raise _timeout(self._member, max_wait, wait)
        while True:
            share = self._member.share  # a new window length replaces it
            with lock:
                held, wait = share.reserve(now, cost, deadline - now)
            if held:
                if not wait:
                    return
                end = share.end(now + wait)
                yield wait / 1e9
                now = clock.time_ns()
                if now < end:
                    return
                with lock:  # woke too late: its permit would reach the next window
                    share.forfeit(cost)
                continue
            if now + wait > deadline:
                raise _timeout(self._member, max_wait, wait)
            yield wait / 1e9
            now = clock.time_ns()

    def _heard(self, message: Any) -> bool:
        """Read what the resource's channel brought (None: nothing in time);
        True if it asks for a refresh now."""
        if message is None or message.get("type") != "message":
            return False
        with self._lock:
            return self._member.on_message(message["data"])

    def try_acquire(self, cost: int = 1) -> bool:
        """One permit (or ``cost``) now, or False: never waits, never raises."""
        share = self._member.share
        with self._lock:
            now = self.clock.time_ns()
            # counted without its caller: a call that never waits shows
            # nothing by its caller coming back (see `Share.ask`)
            share.ask(now, cost)
            return not share.take(now, cost)

    def demand(self, permits: float | None) -> None:
        """Report ``permits`` a window as this member's demand from the next
        refresh on, rather than what its calls show (a queue consumer that knows
        its lag); None: measure it again. A ``wants`` function, if given, comes first."""
        with self._lock:
            self._member.state_demand(permits)

    def observe(self, status: int) -> None:
        """Tell the quota what the provider answered: a 429 although the member
        kept its share lowers an adaptive total."""
        if status == 429:
            self._member.throttled += 1

    @property
    def grant(self) -> float:
        """Permits a window this member holds now."""
        return self._member.grant

    @property
    def member_id(self) -> str:
        return self._member.id

    def local_status(self) -> dict[str, Any]:
        """This member's view: grant, pending increase, window, permits left."""
        member = self._member
        share = member.share
        with self._lock:
            count, used = share.window_state(self.clock.time_ns())
            pending = share.pending
        return {
            "name": self.name,
            "member": member.id,
            "grant": member.grant,
            "pending": None if pending is None else pending / 1000,
            "window": share.window_ns / 1e9,
            "permits_this_window": count,
            "used_this_window": used,
            "members": member.members,
            "fallen_back": member.fallen_back,
            "refreshes": member.refreshes,
            "failures": member.failures,
            "pace": member.pace,
        }

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} member={self._member.id!r}"
            f" grant={self.grant:g}/window members={self._member.members}>"
        )
