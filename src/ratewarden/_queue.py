"""`PacedQueue` and `AsyncPacedQueue`: a leaky bucket that really queues.

Callers of a key stand in one line that leaves at the rate, evenly spaced: one
request every ``period / limit`` seconds (a request of cost ``c`` takes ``c``
such slots). A caller learns on arrival when its slot falls due and sleeps
exactly until then; a full line turns it away at once (`QueueFull`, with the
time until the line has room for it), and so does a slot further away than the
caller's ``max_wait`` (`RateLimitTimeout`), without taking it.

The line is the store's leaky bucket (GCRA), ``size + 1`` requests deep: its
state is the moment the line is empty again, so handing out a slot is one
atomic step in any store (memory, Redis, Redis Cluster) and every process
sharing a Redis store shares one schedule: the slots are spaced on the store's
clock across the fleet, and each process sleeps on its own clock until its
callers' slots. What crosses processes is the schedule, not the waiting: each
process holds its own callers, and how exactly a release meets its slot is a
matter of that process's sleeping (see docs/shaping.md).

A caller whose ``max_wait`` is shorter than the whole line first looks (a peek)
and then takes a slot; within a process the two steps are one (a lock), but a
caller of another process may take the slot in between: the caller then finds
its slot too far, gives up, and that slot goes unused. The line can so release
less than its rate under such races, never more.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

from ._decision import Decision
from ._errors import ConfigurationError, RateLimitTimeout
from ._flow import Flow, adrive, drive
from ._limiter import AsyncLimiter, Limiter
from ._rate import Rate, parse_rate
from ._waiting import asleep_precisely, check_max_wait, check_spin
from .stores import AsyncStore, Store
from .stores.failure import OnFailure

__all__ = ["AsyncPacedQueue", "PacedQueue", "QueueFull"]

MAX_SIZE = 10_000_000


class QueueFull(RateLimitTimeout):
    """The line is full: ``retry_after`` is the time until it has room for this
    request. A `RateLimitTimeout`, so code that handles a missed deadline handles
    this too."""


L = TypeVar("L", Limiter, AsyncLimiter)
S = TypeVar("S", Store, AsyncStore)


class _Line(Generic[L, S]):
    """What the twins share: options, the slot arithmetic, the verdicts, the steps
    of entering the line (`_entering`). No I/O. The twins name their kinds of
    limiter and lock."""

    _limiter_class: type[L]
    _lock_class: Callable[[], Any]  # the lock that makes a look and a take one step
    _limiter: L
    store: S

    def __init__(
        self,
        rate: str | Rate,
        *,
        size: int,
        store: S | None = None,
        name: str | None = None,
        on_failure: OnFailure = "raise",
    ) -> None:
        if type(size) is not int or not 0 <= size <= MAX_SIZE:
            raise ConfigurationError(f"size is 0 to {MAX_SIZE} waiting requests, got {size!r}")
        self.size = size
        kind: Any = self._limiter_class  # of the store's kind, as the twin's type says
        self._limiter = limiter = kind(
            parse_rate(rate),
            store=store,
            algorithm="leaky_bucket",
            burst=size + 1,
            name=name,
            on_failure=on_failure,
        )
        self.store = limiter.store
        self._lock = self._lock_class()

    def _entering(self, key: str, max_wait: float, cost: int) -> Flow[float]:
        """Take the next slot of ``key``'s line: the seconds until it is due."""
        check_max_wait(max_wait)
        limiter = self._limiter
        if self._covers(max_wait, cost):
            return self._took(key, (yield partial(limiter.hit, key, cost)), cost, max_wait)
        yield self._lock.acquire
        try:
            self._looked(key, (yield partial(limiter.peek, key, cost)), max_wait)
            return self._took(key, (yield partial(limiter.hit, key, cost)), cost, max_wait)
        finally:
            self._lock.release()

    @property
    def rate(self) -> Rate:
        return self._limiter.rate

    @property
    def interval(self) -> float:
        """Seconds between two releases."""
        rate = self._limiter.rate
        return rate.period / rate.limit

    def _covers(self, max_wait: float, cost: int) -> bool:
        """Whether ``max_wait`` reaches past the end of a full line: then the
        bucket's own depth bounds the wait, and one step takes the slot."""
        rate = self._limiter.rate
        return max_wait * 1e9 * rate.limit >= (self.size + 1 - cost) * rate.period_ns

    def _wait(self, decision: Decision, cost: int) -> float:
        """Seconds until an admitted request's slot: the line is empty again at
        ``reset_after``, and this request's slot is the last ``cost`` of it."""
        rate = self._limiter.rate
        wait_ns = round(decision.reset_after * 1e9) - round(cost * rate.period_ns / rate.limit)
        return max(0, wait_ns) / 1e9

    def _full(self, key: str, decision: Decision) -> QueueFull:
        retry = decision.retry_after
        if math.isinf(retry):
            why = f"cost exceeds the line of {self.size}; it can never enter"
        else:
            why = f"the line of {self.size} is full; room in {retry:.6g}s"
        return QueueFull(f"{key!r}: {why}", key=key, retry_after=retry)

    def _too_far(self, key: str, wait: float, max_wait: float) -> RateLimitTimeout:
        return RateLimitTimeout(
            f"{key!r}: its slot is {wait:.6g}s away, past max_wait={max_wait}s",
            key=key,
            retry_after=wait,
        )

    def _looked(self, key: str, peeked: Decision, max_wait: float) -> None:
        """After a peek: raise if the request cannot have a slot in time."""
        if not peeked.allowed:
            raise self._full(key, peeked)
        if peeked.reset_after > max_wait:  # the line empties then: this slot's wait
            raise self._too_far(key, peeked.reset_after, max_wait)

    def _took(self, key: str, decision: Decision, cost: int, max_wait: float) -> float:
        """After taking a slot: its wait, or raise."""
        if not decision.allowed:
            raise self._full(key, decision)
        wait = self._wait(decision, cost)
        if wait > max_wait:  # another process took the slot we looked at
            raise self._too_far(key, wait, max_wait)
        return wait

    def __repr__(self) -> str:
        name = "" if self._limiter.name is None else f", name={self._limiter.name!r}"
        return (
            f"{type(self).__name__}({str(self.rate)!r}, size={self.size}{name},"
            f" store={self._limiter.store!r})"
        )


class PacedQueue(_Line[Limiter, Store]):
    """Requests of a key leave at ``rate``, evenly spaced, after waiting in a
    line of up to ``size`` (in ``store``, a fresh `MemoryStore` unless given).

    - ``enter(key, max_wait, cost=1)`` takes the next slot and returns the
      seconds until it is due (sleeping is the caller's);
    - ``wait(key, max_wait, cost=1)`` takes it and sleeps until it is due;
    - both raise `QueueFull` when the line is full and `RateLimitTimeout` when
      the slot is further away than ``max_wait``, taking no slot.

    ``name`` prefixes its keys as for `Limiter` (queues with the same name,
    rate and size share a line); ``on_failure`` is `Limiter`'s.
    """

    _limiter_class = Limiter
    _lock_class = threading.Lock

    def enter(self, key: str, max_wait: float = math.inf, cost: int = 1) -> float:
        """Take the next slot of ``key``'s line; the seconds until it is due."""
        return drive(self._entering(key, max_wait, cost))

    def wait(self, key: str, max_wait: float = math.inf, cost: int = 1) -> float:
        """`enter`, then sleep until the slot is due; the seconds waited."""
        seconds = self.enter(key, max_wait, cost)
        if seconds:
            self.store.clock.sleep(seconds)
        return seconds

    def reset(self, key: str) -> None:
        """Empty ``key``'s line (its waiting callers keep their slots)."""
        self._limiter.reset(key)


class AsyncPacedQueue(_Line[AsyncLimiter, AsyncStore]):
    """The asyncio twin of `PacedQueue`: ``await queue.wait(key, max_wait)``
    sleeps without blocking the event loop.

    ``spin``: on the system clock, ``wait`` sleeps until that many seconds
    before the slot and then yields to the loop until it is due, because the
    loop's timers wake up to a millisecond late; this costs up to ``spin`` of
    CPU per release (0 turns it off: releases then come up to about 1 ms late)."""

    _limiter_class = AsyncLimiter
    _lock_class = asyncio.Lock  # bound to the loop that first waits on it

    def __init__(
        self,
        rate: str | Rate,
        *,
        size: int,
        store: AsyncStore | None = None,
        name: str | None = None,
        on_failure: OnFailure = "raise",
        spin: float = 0.0015,
    ) -> None:
        self.spin = check_spin(spin)
        super().__init__(rate, size=size, store=store, name=name, on_failure=on_failure)

    async def enter(self, key: str, max_wait: float = math.inf, cost: int = 1) -> float:
        """`PacedQueue.enter`, awaited."""
        return await adrive(self._entering(key, max_wait, cost))

    async def wait(self, key: str, max_wait: float = math.inf, cost: int = 1) -> float:
        """`enter`, then sleep until the slot is due without blocking the loop."""
        seconds = await self.enter(key, max_wait, cost)
        if seconds:
            await asleep_precisely(self.store.clock, seconds, self.spin)
        return seconds

    async def reset(self, key: str) -> None:
        await self._limiter.reset(key)
