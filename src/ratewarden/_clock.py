"""Time, injected.

Every store reads time through a `Clock`: integer nanoseconds since the Unix epoch.
One clock domain for every algorithm keeps fixed windows aligned to the epoch (so
instances agree on window edges), matches the Redis store (which reads the Redis
server's TIME, also epoch time) and lets the memory store expire idle keys of any
algorithm with one comparison. Tests pass a `FakeClock` and never sleep.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "Clock",
    "FakeClock",
    "SystemClock",
    "TestSwitch",
    "default_clock",
    "install_test_switch",
    "test_switch",
]


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


class TestSwitch:
    """The default clock while ratewarden's pytest plugin is loaded, and what it
    switches for a test: the clock in force (the system's unless a test put a
    `FakeClock` in), limiting on or off, and the memory stores to reset.

    Outside pytest nothing installs one: `default_clock` is then a plain
    `SystemClock`, and a memory store's hot path is exactly as it is without
    the plugin. Under the plugin, a store reads time through this switch (one
    call more) so that a limiter built at import time, before any fixture ran,
    follows the test's fake clock too.
    """

    __test__ = False  # not a test class, whatever pytest's collection thinks of its name

    def __init__(self) -> None:
        self.clock: Clock = SystemClock()
        self.off = False
        # what a reset empties: each memory store, each engine's local overrides
        # (held weakly: a test's own stores go when the test drops them)
        self.resets: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # an application thread may build a store meanwhile

    def track(self, owner: object, method: str) -> None:
        """``owner.method()`` empties ``owner`` at every `reset`."""
        with self._lock:
            self.resets[owner] = method

    def reset(self) -> None:
        with self._lock:
            owners = list(self.resets.items())
        for owner, method in owners:
            getattr(owner, method)()

    def time_ns(self) -> int:
        return self.clock.time_ns()

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await self.clock.asleep(seconds)

    def switchable(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """An algorithm's step that, while limiting is off, admits every request
        and counts none: it answers as a fresh key would, and keeps the state.
        It keeps the step's name, by which reservations find its settle."""

        @functools.wraps(step)
        def switched(state: Any, now: int, cost: int, params: Any) -> Any:
            if not self.off:
                return step(state, now, cost, params)
            decision, fresh = step(None, now, 0, params)
            return decision, fresh if state is None else state

        return switched

    def __repr__(self) -> str:
        return f"TestSwitch(clock={self.clock!r}, off={self.off})"


# Set by ratewarden.testing's pytest plugin when pytest loads it; read when a
# store is built.
installed: TestSwitch | None = None


def default_clock() -> Clock:
    """The clock of a store or quota given none: the wall clock, or, under
    ratewarden's pytest plugin, the switch its fixtures turn."""
    return SystemClock() if installed is None else installed


def test_switch() -> TestSwitch | None:
    """The switch ratewarden's pytest plugin installed, or None (always, outside pytest)."""
    return installed


def install_test_switch() -> TestSwitch:
    """Install the switch (once: later calls give the same one). Stores built
    from now on read time through it; those built before keep their clocks."""
    global installed  # noqa: PLW0603 - one switch for the process, as pytest is one
    if installed is None:
        installed = TestSwitch()
    return installed
