"""What the ``ratewarden`` fixture gives a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..primitives import FakeClock, SystemClock, TestSwitch, install_test_switch

__all__ = ["RateLimits", "install"]


def install() -> None:
    """Make the stores built from now on follow `RateLimits` (pytest's plugin
    does this as pytest starts). Another test runner calls it before the
    application under test is imported: a store built earlier keeps its clock."""
    install_test_switch()


class RateLimits:
    """The limits of the code under test: its time, its counters, and whether
    they limit at all. Built by the ``ratewarden`` fixture (the pytest plugin);
    ``RateLimits.start()`` builds one outside pytest, and ``stop()`` undoes it."""

    def __init__(self, switch: TestSwitch, clock: FakeClock) -> None:
        self._switch = switch
        self.clock = clock

    @classmethod
    def start(cls, clock: FakeClock | None = None) -> RateLimits:
        """The fake clock in force and the memory stores emptied."""
        switch = install_test_switch()
        limits = cls(switch, FakeClock() if clock is None else clock)
        switch.clock = limits.clock  # limiting on or off stays as a marker or fixture set it
        limits.reset()
        return limits

    def stop(self) -> None:
        """The system clock back, the memory stores emptied."""
        self._switch.clock = SystemClock()
        self.reset()

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``: windows end, buckets refill."""
        self.clock.advance(seconds)

    def reset(self) -> None:
        """Forget every count of every memory store (each key starts afresh), and
        end every runtime override an engine on one holds."""
        self._switch.reset()

    @property
    def limiting(self) -> bool:
        return not self._switch.off

    @limiting.setter
    def limiting(self, on: bool) -> None:
        self._switch.off = not on

    @contextmanager
    def off(self) -> Iterator[None]:
        """Within the block every limit admits every request, and counts none."""
        was = self._switch.off
        self._switch.off = True
        try:
            yield
        finally:
            self._switch.off = was
