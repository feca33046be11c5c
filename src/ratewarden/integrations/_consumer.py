"""What the outgoing-call integrations share (httpx, aiohttp): the pauses, and
the waits for a permit, written once for sync and async.

Before a call: a permit from the limiter for the call's key, after any pause a
provider asked for on that key, all within ``max_wait`` (`Pauses.permit` and
`Pauses.apermit` wait: the limiter's ``acquire`` and the clock's sleep). After a
call: a 429 (or 503) with ``Retry-After`` pauses the key until then, so the next
calls wait instead of collecting more refusals. The client integrations only
hook these into the request and send.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Collection
from email.utils import parsedate_to_datetime
from typing import Protocol

from ..kernel import AsyncLimiter, Limiter, check_max_wait
from ..primitives import Clock, ConfigurationError, RateLimitTimeout

__all__ = ["AsyncQuota", "Pauses", "Quota", "clock_of", "observe", "retry_after_seconds"]


class Quota(Protocol):
    """A fleet quota (`ratewarden.fleet.FleetQuota`) as the integrations use it:
    one resource, no key. Named by shape so that these modules import no Redis."""

    @property
    def clock(self) -> Clock: ...

    def acquire(self, max_wait: float, cost: int = 1) -> None: ...

    def observe(self, status: int) -> None: ...


class AsyncQuota(Protocol):
    """The asyncio twin of `Quota` (`ratewarden.fleet.AsyncFleetQuota`)."""

    @property
    def clock(self) -> Clock: ...

    def acquire(self, max_wait: float, cost: int = 1) -> Awaitable[None]: ...

    def observe(self, status: int) -> None: ...


def observe(limiter: Limiter | AsyncLimiter | Quota | AsyncQuota, status: int) -> None:
    """Tell a fleet quota what the provider answered (a 429 lowers an adaptive total)."""
    if not isinstance(limiter, Limiter | AsyncLimiter):
        limiter.observe(status)


def clock_of(limiter: Limiter | AsyncLimiter | Quota | AsyncQuota) -> Clock:
    if isinstance(limiter, Limiter | AsyncLimiter):
        return limiter.store.clock
    return limiter.clock


# A provider's Retry-After is capped at a day: a bogus 99999999999 would pause a key
# for millennia (and overflow a sleep).
MAX_PAUSE = 86_400.0


def retry_after_seconds(value: str | None, now_ns: int) -> float | None:
    """A ``Retry-After`` value in seconds from now: delta-seconds or an HTTP-date;
    None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # not "²", which isdigit() also takes
        return min(float(value), MAX_PAUSE)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT; a sloppy one without a zone too
        return None
    return min(max(0.0, when.timestamp() - now_ns / 1e9), MAX_PAUSE)


class Pauses:
    """The keys providers told to wait, and until when (on ``clock``).

    ``max_wait`` bounds each call's wait for pause and permit together (``inf``:
    wait as long as it takes, ``0``: fail at once); ``pause_on`` the statuses
    whose ``Retry-After`` pauses the key; a 429 without one pauses
    ``default_pause`` seconds.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        max_wait: float,
        pause_on: Collection[int] = (429, 503),
        default_pause: float = 1.0,
    ) -> None:
        check_max_wait(max_wait)
        if not default_pause >= 0:  # also NaN
            raise ConfigurationError(f"default_pause must be >= 0 seconds, got {default_pause!r}")
        self.clock = clock
        self.max_wait = max_wait
        self.pause_on = frozenset(pause_on)
        self.default_pause = float(default_pause)
        self._until: dict[str, int] = {}
        self._lock = threading.Lock()

    def before(self, key: str) -> tuple[float, float]:
        """Seconds to sleep for a pause on ``key``, and the ``max_wait`` left for
        the permit after it; `RateLimitTimeout` when the pause alone is too long."""
        with self._lock:
            until = self._until.get(key)
            if until is None:
                return 0.0, self.max_wait
            left = (until - self.clock.time_ns()) / 1e9
            if left <= 0:
                del self._until[key]
                return 0.0, self.max_wait
        if left > self.max_wait:
            raise RateLimitTimeout(
                f"{key!r}: the provider asked for a pause of {left:.6g}s,"
                f" more than max_wait={self.max_wait}s",
                key=key,
                retry_after=left,
            )
        return left, self.max_wait - left

    def permit(self, limiter: Limiter | Quota, key: str) -> None:
        """Sit out a pause on ``key``, then take a permit: all within ``max_wait``.
        A fleet quota has one permit pool for every key."""
        pause, left = self.before(key)
        if pause:
            self.clock.sleep(pause)
        if isinstance(limiter, Limiter):
            limiter.acquire(key, left)
        else:
            limiter.acquire(left)

    async def apermit(self, limiter: AsyncLimiter | AsyncQuota, key: str) -> None:
        """`permit` without blocking the event loop."""
        pause, left = self.before(key)
        if pause:
            await self.clock.asleep(pause)
        if isinstance(limiter, AsyncLimiter):
            await limiter.acquire(key, left)
        else:
            await limiter.acquire(left)

    def after(self, key: str, status: int, retry_after: str | None) -> float | None:
        """Note a response; the pause it starts on ``key`` in seconds, if any."""
        if status not in self.pause_on:
            return None
        now = self.clock.time_ns()
        seconds = retry_after_seconds(retry_after, now)
        if seconds is None:
            if status != 429:
                return None  # a 503 without Retry-After need not be about rate
            seconds = self.default_pause
        if not math.isfinite(seconds) or seconds <= 0:
            return None
        with self._lock:
            until = now + round(seconds * 1e9)
            self._until[key] = max(until, self._until.get(key, 0))
        return seconds

    def __len__(self) -> int:
        return len(self._until)
