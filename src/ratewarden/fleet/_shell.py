"""What `FleetQuota` and `AsyncFleetQuota` share: the member, its lock, acquire's
logic (a generator of the sleeps the twins take their own way), and their reprs."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Generator
from typing import Any

from .._clock import Clock, SystemClock
from .._errors import ConfigurationError, RateLimitTimeout
from .._waiting import check_max_wait
from ._config import QuotaConfig
from ._member import Member

__all__ = ["POLL", "Shell", "check_cost", "log"]

log = logging.getLogger("ratewarden.fleet")

POLL = 0.1  # seconds the refresh loop waits on the channel at most, so close() is prompt


def _config(config: QuotaConfig | str | None) -> QuotaConfig | None:
    if config is None or isinstance(config, QuotaConfig):
        return config
    return QuotaConfig(config)


def check_cost(cost: int) -> None:
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"cost must be a positive integer, got {cost!r}")


def _timeout(name: str, max_wait: float, wait_ns: int) -> RateLimitTimeout:
    return RateLimitTimeout(
        f"quota {name!r}: no permit within max_wait={max_wait}s (next in {wait_ns / 1e9:.6g}s)",
        key=name,
        retry_after=wait_ns / 1e9,
    )


class Shell:
    """What the twins share: the member, its lock, acquire's logic, their reprs."""

    _member: Member
    _lock: threading.Lock
    name: str
    clock: Clock

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
    ) -> None:
        self.background = background
        self.clock = SystemClock() if clock is None else clock
        self._member = Member(
            name, self.clock, member_id=member_id, pace=pace, config=_config(config)
        )
        self.name = self._member.name
        self._owns_client = isinstance(redis, str)
        self._lock = threading.Lock()  # held for microseconds, never across an await
        self._started = False

    def _first(self, max_wait: float, cost: int) -> int:
        """acquire's first try: 0 when granted, else the nanoseconds to wait."""
        check_max_wait(max_wait)
        check_cost(cost)
        share = self._member.share
        with self._lock:
            share.asked += cost
            return share.take(self.clock.time_ns(), cost)

    def _waits(self, wait: int, max_wait: float, cost: int) -> Generator[float, None, None]:
        """acquire's waiting, for the twins to sleep through: the seconds of each
        sleep; `RateLimitTimeout` once the deadline cannot be met. A caller
        reserves its permit as soon as one can be (see `Share.reserve`) and
        then only sleeps until it falls due."""
        clock, lock = self.clock, self._lock
        now = clock.time_ns()
        deadline = math.inf if math.isinf(max_wait) else now + round(max_wait * 1e9)
        if now + wait > deadline:
            raise _timeout(self.name, max_wait, wait)
        waiting = self._member.share
        with lock:
            waiting.begin_wait(now)
        try:
            while True:
                share = self._member.share  # a new window length replaces it
                with lock:
                    held, wait = share.reserve(now, cost, deadline - now)
                if held:
                    if wait:
                        yield wait / 1e9
                    return
                if now + wait > deadline:
                    raise _timeout(self.name, max_wait, wait)
                yield wait / 1e9
                now = clock.time_ns()
        finally:
            with lock:
                waiting.end_wait(clock.time_ns())

    def try_acquire(self, cost: int = 1) -> bool:
        """One permit (or ``cost``) now, or False: never waits, never raises."""
        share = self._member.share
        with self._lock:
            share.asked += cost
            return not share.take(self.clock.time_ns(), cost)

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
