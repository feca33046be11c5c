"""What the outgoing-call integrations share (httpx, aiohttp): the pauses, and
the waits for a permit, written once for sync and async.

Before a call: a permit from the limiter for the call's key, after any pause a
provider asked for on that key and once the provider's budget has room, all
within ``max_wait`` (`Pauses.permit` and `Pauses.apermit` wait: the limiter's
``acquire`` and the clock's sleep). After a call: what the provider says
remains, and when it resets (`_budget`), is the key's budget, less the calls
still in flight; none goes while it is spent, until the reset. A 429 (or 503)
with ``Retry-After`` pauses the key until then, so the next calls wait instead
of collecting more refusals. The limiter stays the ceiling: the provider's
budget only ever holds calls back. The client integrations only hook these into
the request and send.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Awaitable, Collection, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Protocol

from ..kernel import AsyncLimiter, Limiter, check_max_wait
from ..primitives import Clock, ConfigurationError, RateLimitTimeout
from ._budget import Header, read_budget

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


# Seconds between looks at a key whose budget is spent, while the answers of its
# calls in flight have not said when it comes back.
POLL = 0.05
# Keys whose budget or pause is kept at most: past it, the ones whose reset or
# pause has passed are dropped (they say nothing any more), then the oldest.
MAX_KEYS = 10_000


@dataclass(slots=True)
class _Left:
    """What a provider said remains on a key, less the calls sent since."""

    remaining: int
    reset_at: int | None  # ns on the clock; None: a new window, its end not said yet
    limit: int | None  # a window's quota, for the window after reset_at
    since: int = 0  # calls in flight when it was said, and sent since


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
        self._left: dict[str, _Left] = {}  # what each key's provider says remains
        self._in_flight: dict[str, int] = {}  # calls sent, not answered yet
        self._lock = threading.Lock()

    def _wait(self, key: str) -> float:
        """Seconds ``key`` must wait before a call may go, for a pause or for the
        provider's budget; 0 when it may go now, the call then counted as sent."""
        now = self.clock.time_ns()
        with self._lock:
            until = self._until.get(key)
            if until is not None:
                if until > now:
                    return (until - now) / 1e9
                del self._until[key]
            left = self._left.get(key)
            if left is not None and left.reset_at is not None and now >= left.reset_at:
                if left.limit is None:  # a new window, of a size not said: not guessed
                    del self._left[key]
                    left = None
                else:
                    # a new window: the provider's quota, until its next answer, less
                    # every call since the last answer and those it found in flight:
                    # a reset rounded up to whole seconds comes after the window's
                    # real edge, and they may have landed in the new window already
                    left.remaining = max(0, left.limit - left.since)
                    left.reset_at = None
            in_flight = self._in_flight.get(key, 0)
            if left is not None and left.remaining <= 0:
                if left.reset_at is not None:
                    return (left.reset_at - now) / 1e9
                if in_flight:  # their answers will say
                    return POLL
                del self._left[key]  # nothing will say: unknown again, the limiter decides
                left = None
            if left is not None:
                left.remaining -= 1
                left.since += 1
            self._in_flight[key] = in_flight + 1
            return 0.0

    def _unsent(self, key: str) -> None:
        """A call counted as sent that did not go (no permit in time)."""
        with self._lock:
            self._landed(key)
            left = self._left.get(key)
            if left is not None:
                left.remaining += 1
                left.since -= 1

    @contextlib.contextmanager
    def sending(self, key: str) -> Iterator[None]:
        """Around a call's sending: one that raises got no answer (`unanswered`)."""
        try:
            yield
        except BaseException:
            self.unanswered(key)
            raise

    def unanswered(self, key: str) -> None:
        """A call sent that got no answer (a transport error, a cancel): no longer
        in flight. Its share of the budget stays spent: the provider may have
        counted it."""
        with self._lock:
            self._landed(key)

    def _landed(self, key: str) -> int:
        """One call of ``key`` no longer in flight; how many still are. Held under
        the lock; a key with none is forgotten, so keys come and go."""
        left = self._in_flight.get(key, 0) - 1
        if left > 0:
            self._in_flight[key] = left
            return left
        self._in_flight.pop(key, None)
        return 0

    def _waited(self, key: str, deadline: float, wait: float) -> None:
        """`RateLimitTimeout` when waiting ``wait`` more seconds passes ``deadline``."""
        now = self.clock.time_ns() / 1e9
        if now + wait > deadline:
            raise RateLimitTimeout(
                f"{key!r}: the provider asked for a pause of {wait:.6g}s more (a Retry-After,"
                f" or its budget spent until a reset), longer than max_wait={self.max_wait}s"
                " allows",
                key=key,
                retry_after=wait,
            )

    def permit(self, limiter: Limiter | Quota, key: str) -> None:
        """Sit out a pause on ``key`` and wait for the provider's budget, then
        take a permit: all within ``max_wait``. A fleet quota has one permit pool
        for every key."""
        deadline = self.clock.time_ns() / 1e9 + self.max_wait
        while wait := self._wait(key):
            self._waited(key, deadline, wait)
            self.clock.sleep(wait)
        left = max(0.0, deadline - self.clock.time_ns() / 1e9)
        try:
            if isinstance(limiter, Limiter):
                limiter.acquire(key, left)
            else:
                limiter.acquire(left)
        except BaseException:
            self._unsent(key)
            raise

    async def apermit(self, limiter: AsyncLimiter | AsyncQuota, key: str) -> None:
        """`permit` without blocking the event loop."""
        deadline = self.clock.time_ns() / 1e9 + self.max_wait
        while wait := self._wait(key):
            self._waited(key, deadline, wait)
            await self.clock.asleep(wait)
        left = max(0.0, deadline - self.clock.time_ns() / 1e9)
        try:
            if isinstance(limiter, AsyncLimiter):
                await limiter.acquire(key, left)
            else:
                await limiter.acquire(left)
        except BaseException:
            self._unsent(key)
            raise

    def after(self, key: str, status: int, header: Header) -> float | None:
        """Note an answer, whose headers ``header`` reads by lower-case name: the
        provider's budget for ``key``, and the pause it starts, in seconds, if any."""
        now = self.clock.time_ns()
        budget = read_budget(header, now / 1e9)
        with self._lock:
            in_flight = self._landed(key)
            if budget is not None:
                # the calls still in flight may not be in the provider's count yet
                remaining = max(0, budget.remaining - in_flight)
                known = self._left.get(key)
                if known is not None and (known.reset_at is None or known.reset_at > now):
                    # in one window an answer can only say less is left: calls from
                    # several threads reach the provider in another order than they
                    # were sent, and an answer counted before a call already
                    # answered (so no longer in flight) says one too many
                    known.remaining = min(known.remaining, remaining)
                else:
                    # no reset said: look again after default_pause, the limiter
                    # deciding alone from then until an answer says more
                    reset = budget.reset if budget.reset > 0 else self.default_pause
                    self._left[key] = _Left(remaining, now + round(reset * 1e9),
                                            budget.limit, in_flight)  # fmt: skip
                    if len(self._left) > MAX_KEYS:
                        self._bound(now)
        if status not in self.pause_on:
            return None
        seconds = retry_after_seconds(header("retry-after"), now)
        if seconds is None:
            if status != 429:
                return None  # a 503 without Retry-After need not be about rate
            seconds = self.default_pause
        if not math.isfinite(seconds) or seconds <= 0:
            return None
        with self._lock:
            until = now + round(seconds * 1e9)
            self._until[key] = max(until, self._until.get(key, 0))
            if len(self._until) > MAX_KEYS:
                self._bound(now)
        return seconds

    def _bound(self, now: int) -> None:
        """Hold the keys kept to `MAX_KEYS`, whatever keys the calls bring: what
        has ended goes first, then the oldest kept. Held under the lock."""
        for key in [k for k, until in self._until.items() if until <= now]:
            del self._until[key]
        for key in [k for k, left in self._left.items()
                    if left.reset_at is not None and left.reset_at <= now]:  # fmt: skip
            del self._left[key]
        for kept in (self._until, self._left):
            while len(kept) > MAX_KEYS:  # dicts keep their order: the oldest first
                del kept[next(iter(kept))]

    def __len__(self) -> int:
        return len(self._until)
