"""Waiting for a permit: the logic once, the sync and async shells only wait.

Callers of ``acquire`` on one key take turns in arrival order: only the head of a
key's queue tries the store; it sleeps exactly ``retry_after`` between tries (no
polling) and hands the turn to the next caller when it gets its permit or gives up.
A caller that can tell it will miss its deadline (the wait is longer than the time
left, or the cost can never be granted) gives up at once instead of sleeping.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from typing import Generic, TypeVar

from ._decision import Decision
from ._errors import ConfigurationError, RateLimitTimeout

__all__ = ["AsyncTurns", "Turns", "check_max_wait", "deadline_ns", "next_wait", "timed_out"]

W = TypeVar("W")


def check_max_wait(max_wait: float) -> None:
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float):
        raise ConfigurationError(f"max_wait must be a number of seconds, got {max_wait!r}")
    if not max_wait >= 0:  # also rejects NaN
        raise ConfigurationError(f"max_wait must be >= 0 seconds, got {max_wait!r}")


def deadline_ns(now_ns: int, max_wait: float) -> float:
    return math.inf if math.isinf(max_wait) else now_ns + round(max_wait * 1e9)


def next_wait(decision: Decision, key: str, now_ns: int, deadline: float, max_wait: float) -> float:
    """Seconds to sleep before the next try, or `RateLimitTimeout` if that is pointless."""
    retry = decision.retry_after
    if math.isinf(retry):
        raise RateLimitTimeout(
            f"{key!r}: {decision.reason}; waiting cannot help", key=key, retry_after=retry
        )
    if now_ns + round(retry * 1e9) > deadline:
        raise RateLimitTimeout(
            f"{key!r}: no permit within max_wait={max_wait}s (next in {retry:.6g}s)",
            key=key,
            retry_after=retry,
        )
    return retry


def timed_out(key: str, max_wait: float) -> RateLimitTimeout:
    return RateLimitTimeout(
        f"{key!r}: no turn within max_wait={max_wait}s (earlier callers still waiting)",
        key=key,
        retry_after=max_wait,
    )


class _Queues(Generic[W]):
    """Per-key FIFO queues; the head holds the turn. Its entry is ``None`` when it
    got the turn without waiting (no waiter object made on the uncontended path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, deque[W | None]] = {}

    def _join(self, key: str, waiter: W | None) -> bool:
        """Enqueue; True if the caller holds the turn at once."""
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                self._queues[key] = deque((None,))
                return True
            if waiter is not None:
                queue.append(waiter)
            return False

    def _give_up(self, key: str, waiter: W) -> bool:
        """Leave the queue; False if the turn has reached this waiter (it keeps it)."""
        with self._lock:
            queue = self._queues[key]
            if queue[0] is waiter:
                return False
            queue.remove(waiter)
            return True

    def _pass_on(self, key: str) -> W | None:
        """Leave the head; return the next waiter to wake, if any."""
        with self._lock:
            queue = self._queues[key]
            queue.popleft()
            if not queue:
                del self._queues[key]
                return None
            return queue[0]

    def __len__(self) -> int:
        return len(self._queues)


class Turns(_Queues[threading.Event]):
    def wait_turn(self, key: str, timeout: float) -> bool:
        if self._join(key, None):
            return True
        if timeout <= 0:
            return False
        event = threading.Event()
        if self._join(key, event):  # the queue emptied meanwhile
            return True
        # Event.wait overflows past threading.TIMEOUT_MAX: an infinite wait is None
        limit = None if timeout >= threading.TIMEOUT_MAX else timeout
        try:
            return event.wait(limit) or not self._give_up(key, event)
        except BaseException:  # interrupted (KeyboardInterrupt ...): never strand the turn
            if not self._give_up(key, event):
                self.leave(key)
            raise

    def leave(self, key: str) -> None:
        waiter = self._pass_on(key)
        if waiter is not None:
            waiter.set()


class AsyncTurns(_Queues["asyncio.Future[None]"]):
    async def wait_turn(self, key: str, timeout: float) -> bool:
        if self._join(key, None):
            return True
        if timeout <= 0:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._join(key, future):
            return True
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return not self._give_up(key, future)
        except BaseException:  # cancelled: never strand the turn
            if not self._give_up(key, future):
                self.leave(key)
            raise
        return True

    def leave(self, key: str) -> None:
        waiter = self._pass_on(key)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
