"""Time, injected.

Every store reads time through a `Clock`: integer nanoseconds since the Unix epoch.
One clock domain for every algorithm keeps fixed windows aligned to the epoch (so
instances agree on window edges), matches the Redis store (which reads the Redis
server's TIME, also epoch time) and lets the memory store expire idle keys of any
algorithm with one comparison. Tests pass a `FakeClock` and never sleep.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "SystemClock"]


class Clock(Protocol):
    def time_ns(self) -> int:
        """Nanoseconds since the Unix epoch."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` without blocking the event loop."""
        ...


class SystemClock:
    """The machine's wall clock (``time.time_ns``).

    A forward step of the system clock (not NTP's gradual slewing) ends windows
    and refills buckets early; a backward step only delays them.
    """

    time_ns = staticmethod(time.time_ns)
    sleep = staticmethod(time.sleep)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


class FakeClock:
    """A clock that only moves when told to, or when something sleeps on it.

    ``sleep``/``asleep`` advance the clock to the sleeper's wake-up time (never
    backwards), so code that waits for a permit runs instantly in tests.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now_ns = round(start * 1e9)

    def time_ns(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a FakeClock does not go backwards")
        self.now_ns += round(seconds * 1e9)

    def set(self, seconds: float) -> None:
        self.now_ns = round(seconds * 1e9)

    def sleep(self, seconds: float) -> None:
        self.now_ns = max(self.now_ns, self.now_ns + round(seconds * 1e9))

    async def asleep(self, seconds: float) -> None:
        wake = self.now_ns + round(seconds * 1e9)
        await asyncio.sleep(0)  # let other tasks run, as a real sleep would
        self.now_ns = max(self.now_ns, wake)

    def __repr__(self) -> str:
        seconds, nanos = divmod(self.now_ns, 1_000_000_000)
        return f"FakeClock(now={seconds}.{nanos:09d})"
