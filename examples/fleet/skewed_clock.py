"""A wall clock that is off by a fixed amount, as a machine whose NTP is off."""

from __future__ import annotations

import asyncio
import time

__all__ = ["SkewedClock", "offsets"]


class SkewedClock:
    """The machine's clock plus ``offset`` seconds; sleeping is real sleeping."""

    def __init__(self, offset: float) -> None:
        self.offset_ns = round(offset * 1e9)

    def time_ns(self) -> int:
        return time.time_ns() + self.offset_ns

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return f"SkewedClock(offset={self.offset_ns / 1e9:+.3f})"


def offsets(count: int, skew: float) -> list[float]:
    """``count`` offsets spread evenly over [-skew, +skew] seconds."""
    if count == 1:
        return [0.0]
    return [-skew + 2 * skew * i / (count - 1) for i in range(count)]
