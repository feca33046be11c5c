"""What `ConcurrencyLimiter` and `AsyncConcurrencyLimiter` share, without I/O:
options, keys, lease ids, the errors, the statistics and the renewal schedule.

A hold takes a slot from the store's lease table (see `ratewarden.stores.leases`)
and gives it back on leaving its block, by an exception too. Each slot is a
lease with an id and an expiry ``lease`` seconds on: a holder that dies
(SIGKILL, a lost network) stops renewing, and the next call after its lease
ends reclaims the slot. A hold that lasts longer than a third of its lease is
renewed in the background (one thread, or one task, per limiter, running
while it has holds), so a live holder keeps its slot however long it works;
a hold never left is renewed while its process lives, as a lock never
released stays locked.

A caller that finds every slot taken waits up to ``max_wait``: it looks again
at once when a hold of this limiter is released, and otherwise at growing
intervals up to `POLL` (a slot freed by another process, or by a lease that
ended). Waiters are served in line, in every process sharing the store: the
store keeps a ticket for each (see `ratewarden.stores.leases`), ranked by
``priority`` (higher first), then by arrival, and a slot goes to the first in
line. A ticket ends `TICKET` seconds after its waiter last looked, so a waiter
that died holds up the line that long at most; one that gives up leaves it.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import time
import weakref
from typing import Final

from ._errors import ConfigurationError, LeaseNotHeld, RateLimitTimeout, StoreError
from .stores.leases import DUPLICATE, EXPIRED, MAX_PRIORITY, MIN_PRIORITY, TICKET_US, Outcome

__all__ = [
    "FIRST_POLL", "HELD", "LOST", "NEW", "POLL", "RELEASED", "TICKET", "TICKET_US",
    "ConcurrencyStats", "Core", "HoldBase", "check_priority",
]  # fmt: skip

POLL: Final = 0.05  # the longest a waiter goes without looking again (seconds)
TICKET: Final = TICKET_US / 1_000_000  # a waiter's place in line outlives its last look
FIRST_POLL: Final = 0.001
RENEW_AT: Final = 1 / 3  # a hold is renewed each time this part of its lease has passed
# The renewer stays this long with nothing held (and never past the first renewal a
# hold taken meanwhile falls due for): holds one after another would each start a
# thread otherwise, which cost a sync hold on Redis more than its two round trips' CPU
LINGER: Final = 1.0
MAX_LEASE: Final = 86_400.0  # a day: a longer lease outlives any holder worth waiting for

# a hold's states
NEW, HELD, RELEASED, LOST = "new", "held", "released", "lost"


_STATS = ("taken", "timeouts", "reclaimed", "lost", "waiting")  # as the repr says them


class ConcurrencyStats:
    """What a limiter has seen, for metrics: counters since it was made, and
    gauges of this process (``held``, ``waiting``)."""

    __slots__ = _STATS

    def __init__(self) -> None:
        self.taken = 0  # holds that got a slot
        self.timeouts = 0  # holds that got none within max_wait
        self.reclaimed = 0  # ended leases (of any process) this limiter's calls dropped
        self.lost = 0  # holds of this limiter whose lease ended before their release
        self.waiting = 0  # callers waiting for a slot now

    def __repr__(self) -> str:
        said = ", ".join(f"{name}={getattr(self, name)}" for name in self.__slots__)
        return f"ConcurrencyStats({said})"


class Core:
    """What the sync and asyncio limiters share: options, keys, lease ids, the
    errors and the statistics. No I/O."""

    def __init__(self, limit: int, lease: float, name: str | None) -> None:
        if type(limit) is not int or limit < 1:
            raise ConfigurationError(
                f"limit is how many holds of a key may run at once, an integer >= 1, got {limit!r}"
            )
        if isinstance(lease, bool) or not isinstance(lease, int | float):
            raise ConfigurationError(f"lease must be a number of seconds, got {lease!r}")
        if not 0.001 <= lease <= MAX_LEASE:  # also rejects NaN
            raise ConfigurationError(
                f"lease is how long a dead holder keeps its slot: 0.001 to {MAX_LEASE:.0f}"
                f" seconds, got {lease!r}"
            )
        if name is not None and (not isinstance(name, str) or not name):  # type: ignore[redundant-expr]
            raise ConfigurationError(f"name must be a non-empty string, got {name!r}")
        self.limit = limit
        self.lease = float(lease)
        self.lease_us = round(lease * 1_000_000)
        # limiters with one name share their slots; unnamed ones, those of one limit
        self.name = f"limit={limit}" if name is None else name
        self._prefix = f"rw:conc:{{{self.name}:"  # the whole key is the hash tag
        self._ids = itertools.count()
        self._id_head = secrets.token_hex(8)  # unique across processes
        self.stats = ConcurrencyStats()
        self._stats_lock = threading.Lock()
        self._live: dict[HoldBase, float] = {}  # held holds -> when last taken/renewed
        self._linger = min(LINGER, self.lease * RENEW_AT)
        self._idle_until: float | None = None  # the renewer ends then, if nothing is held
        _LIMITERS.add(self)

    def _forked(self) -> None:
        """In a child forked from this process: the parent's threads are gone, so a
        lock one of them held at the fork would stay held for ever, and the holds
        are the parent's to renew and release, not the child's."""
        self._stats_lock = threading.Lock()
        self._live.clear()
        self._idle_until = None

    def _store_key(self, key: str) -> str:
        if not isinstance(key, str):
            raise ConfigurationError(f"a hold's key must be a string, got {key!r}")
        return f"{self._prefix}{key}}}"

    def _new_id(self) -> str:
        return f"{self._id_head}-{next(self._ids):x}"

    def _count(self, field: str, n: int = 1) -> None:
        with self._stats_lock:
            setattr(self.stats, field, getattr(self.stats, field) + n)

    def _timeout(self, key: str, max_wait: float, outcome: Outcome) -> RateLimitTimeout:
        self._count("timeouts")
        return RateLimitTimeout(
            f"no slot of {self.name!r} for key {key!r} within {max_wait}s:"
            f" {outcome.held} of {self.limit} held",
            key=key,
            retry_after=outcome.wait_us / 1e6,
        )

    def _checked(self, hold: HoldBase, outcome: Outcome) -> Outcome:
        if outcome.reclaimed:
            self._count("reclaimed", outcome.reclaimed)
        if outcome.status == DUPLICATE:
            raise StoreError(f"lease id {hold.lease_id!r} is held already in the store")
        return outcome

    def _not_held(self, key: str, lease_id: str, status: int, what: str) -> LeaseNotHeld:
        if status == EXPIRED:
            why = (
                f"its lease ({self.lease}s) had ended before this {what}, its renewals"
                " missed, and its slot is reclaimed"
            )
        else:
            why = (
                "the store does not hold it: released already, or its lease ended and"
                " another call reclaimed its slot"
            )
        return LeaseNotHeld(
            f"{what} of lease {lease_id!r} of {self.name!r} key {key!r}: {why}",
            key=key,
            lease_id=lease_id,
        )

    def _released_twice(self, hold: HoldBase) -> LeaseNotHeld:
        return LeaseNotHeld(
            f"lease {hold.lease_id!r} of {self.name!r} key {hold.key!r} is {hold.state}:"
            " a hold releases its slot once",
            key=hold.key,
            lease_id=hold.lease_id,
        )

    def _first_entry(self, hold: HoldBase) -> None:
        if hold.state != NEW:
            raise ConfigurationError(
                f"this hold of key {hold.key!r} was entered already: call hold() again"
            )

    def _renewal_due(self) -> tuple[HoldBase | None, float]:
        """The hold to renew now, taken out of the live ones, or None and how long
        to wait before looking again; ``(None, -1)`` when the renewer ends: nothing
        has been held for `LINGER`. Holds sit in the order they were taken or
        renewed, which is the order they fall due (every hold of a limiter has one
        lease), so only the first is looked at."""
        now = time.monotonic()
        for hold, since in self._live.items():
            self._idle_until = None
            wait = since + self.lease * RENEW_AT - now
            if wait > 0:
                return None, wait
            del self._live[hold]
            return hold, 0.0
        if self._idle_until is None:
            self._idle_until = now + self._linger
        wait = self._idle_until - now
        if wait > 0:
            return None, wait
        self._idle_until = None
        return None, -1.0

    def in_flight_here(self) -> int:
        """Holds of this limiter held now, in this process."""
        return len(self._live)

    def __repr__(self) -> str:
        s = self.stats
        return (
            f"<{type(self).__name__} {self.name!r} limit={self.limit} lease={self.lease}s"
            f" held_here={len(self._live)} waiting={s.waiting} taken={s.taken}"
            f" timeouts={s.timeouts} reclaimed={s.reclaimed} lost={s.lost}>"
        )


def check_priority(priority: int) -> None:
    if type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigurationError(
            f"priority is an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (higher is served"
            f" first), got {priority!r}"
        )


class HoldBase:
    __slots__ = (
        "_limiter", "key", "lease_id", "max_wait", "priority", "queued_at", "state", "store_key"
    )  # fmt: skip

    def __init__(self, core: Core, key: str, max_wait: float, priority: int) -> None:
        self._limiter = core  # its limiter, which its subclass names more narrowly
        self.key = key
        self.store_key = core._store_key(key)
        self.lease_id = core._new_id()
        self.max_wait = max_wait
        self.priority = priority
        self.queued_at = 0  # its place in line while it waits (the store's time, us)
        self.state = NEW

    @property
    def held(self) -> bool:
        """Whether this hold has its slot (as far as this process knows)."""
        return self.state == HELD

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r} lease {self.lease_id} {self.state}>"


# Every limiter of this process, for the child of a fork (`Core._forked`).
_LIMITERS: weakref.WeakSet[Core] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for limiter in list(_LIMITERS):
        limiter._forked()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
