"""What the connections of one HTTP/2 listener share: the limits, the set of
open connections and which are kept (`Admission`: capped in all and per peer,
the one idle longest closed to admit a new one), the process's budget of
unfinished request bytes, the sweep of their deadlines, and handing freed
memory back to the system after connections close or bodies are shed."""

from __future__ import annotations

import asyncio
import ctypes
import functools
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar, cast

from .._connection_limits import (
    Admission,
    BodyBudget,
    ConnectionLimits,
    ServerLimits,
    process_budget,
)

__all__ = ["CONNECTION_WINDOW", "H2Listener", "Swept"]

# The most a connection may have in flight to us (its window); no more than the
# budget either
CONNECTION_WINDOW = 1 << 20


class Swept(Protocol):
    """What the listener needs of one of its connections (`H2Connection`)."""

    def sweep(self, now: float) -> None: ...


C = TypeVar("C", bound=Swept)


class H2Listener(Generic[C]):
    """What a listener's connections share: the limits, the set of connections
    (capped at ``max_connections``) and the sweep of their deadlines."""

    def __init__(
        self,
        limits: ConnectionLimits | None,
        server_limits: ServerLimits | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        self.limits = limits = limits or ConnectionLimits()
        self.server_limits = shared = server_limits or ServerLimits()
        self.budget = budget or process_budget(shared.max_buffered_bytes)
        self.stream_window = shared.max_stream_bytes
        self.connection_window = max(65_535, min(CONNECTION_WINDOW, self.budget.max_bytes))
        self.admission = Admission(limits.max_connections, shared.max_connections_per_peer)
        self.connections: set[C] = set()
        self.stopping = False
        self.refused = 0  # connections closed at once: the cap was reached, none idle
        self.evicted = 0  # idle connections closed to admit a new one
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
        """A connection closed or a body was shed: what it held may go back to
        the system."""
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
