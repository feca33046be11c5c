"""What the connections of one HTTP/2 listener share: the limits, the set of
open connections (capped), the sweep of their deadlines, and handing freed
memory back to the system after connections close."""

from __future__ import annotations

import asyncio
import ctypes
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from .._connection_limits import ConnectionLimits

if TYPE_CHECKING:
    from ._connection import H2Connection

__all__ = ["H2Listener"]


class H2Listener:
    """What a listener's connections share: the limits, the set of connections
    (capped at ``max_connections``) and the sweep of their deadlines."""

    def __init__(self, limits: ConnectionLimits | None) -> None:
        self.limits = limits or ConnectionLimits()
        self.connections: set[H2Connection] = set()
        self.stopping = False
        self.refused = 0  # connections closed at once: the cap was reached
        self.calmed = 0  # connections ended with ENHANCE_YOUR_CALM
        self._sweeper: asyncio.TimerHandle | None = None
        self._trim_at = 0.0
        self._trim_wanted = False

    def start_sweeping(self) -> None:
        limits = self.limits
        self._interval = min(1.0, limits.header_timeout / 4, limits.body_timeout / 4,
                             limits.idle_timeout / 4)  # fmt: skip
        self._sweeper = asyncio.get_running_loop().call_later(self._interval, self._sweep)

    def stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in list(self.connections):
            connection.sweep(now)
        if self._trim_wanted and now - self._trim_at > 5.0:
            self._trim_wanted = False
            self._trim_at = now
            _trim()
        self._sweeper = loop.call_later(self._interval, self._sweep)

    def lost(self) -> None:
        """A connection closed: what it held may go back to the system."""
        self._trim_wanted = True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return cast("Callable[[int], int]", ctypes.CDLL("libc.so.6").malloc_trim)
    except (OSError, AttributeError):  # not glibc
        return None


def _trim() -> None:
    """glibc keeps freed memory for reuse; after an attack that is the attack's
    peak, kept for good. malloc_trim hands the free pages back."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
