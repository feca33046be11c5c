"""`ConcurrencyLimiter`: at most ``limit`` holds of a key at once, each a lease.

A hold takes a slot from the store's lease table (see `ratewarden.stores.leases`)
and gives it back on leaving its ``with`` block, by an exception too. Each slot
is a lease with an id and an expiry ``lease`` seconds on: a holder that dies
(SIGKILL, a lost network) stops renewing, and the next take after its lease
ends reclaims the slot. A hold that lasts longer than a third of its lease is
renewed in the background (one thread per limiter, running while it has
holds), so a live holder keeps its slot however long it works.

A caller that finds every slot taken waits up to ``max_wait``: it tries again
when a hold of this limiter is released (at once), and otherwise at growing
intervals up to `POLL` (a slot freed by another process, or by a lease that
ended). Waiters are not served in order of arrival.

What the sync and asyncio limiters share lives in `_Core`; the asyncio one is
in ``_aconcurrency``.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from types import TracebackType
from typing import Final

from ._errors import ConfigurationError, LeaseNotHeld, RateLimitTimeout, StoreError
from ._waiting import check_max_wait
from .stores import MemoryStore
from .stores.leases import DUPLICATE, EXPIRED, OK, LeaseStore, Op, Outcome

__all__ = ["POLL", "ConcurrencyLimiter", "ConcurrencyStats", "Hold"]

log = logging.getLogger("ratewarden.concurrency")

POLL: Final = 0.05  # the longest a waiter goes without looking again (seconds)
FIRST_POLL: Final = 0.001
RENEW_AT: Final = 1 / 3  # a hold is renewed each time this part of its lease has passed
MAX_LEASE: Final = 86_400.0  # a day: a longer lease outlives any holder worth waiting for

# a hold's states
NEW, HELD, RELEASED, LOST = "new", "held", "released", "lost"


class ConcurrencyStats:
    """What a limiter has seen, for metrics: counters since it was made, and
    gauges of this process (``held``, ``waiting``)."""

    __slots__ = ("lost", "reclaimed", "taken", "timeouts", "waiting")

    def __init__(self) -> None:
        self.taken = 0  # holds that got a slot
        self.timeouts = 0  # holds that got none within max_wait
        self.reclaimed = 0  # ended leases (of any process) this limiter's calls dropped
        self.lost = 0  # holds of this limiter whose lease ended before their release
        self.waiting = 0  # callers waiting for a slot now


class _Core:
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
        self._live: dict[_HoldBase, float] = {}  # held holds -> when last taken/renewed

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

    def _checked(self, hold: _HoldBase, outcome: Outcome) -> Outcome:
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

    def _released_twice(self, hold: _HoldBase) -> LeaseNotHeld:
        return LeaseNotHeld(
            f"lease {hold.lease_id!r} of {self.name!r} key {hold.key!r} is {hold.state}:"
            " a hold releases its slot once",
            key=hold.key,
            lease_id=hold.lease_id,
        )

    def _first_entry(self, hold: _HoldBase) -> None:
        if hold.state != NEW:
            raise ConfigurationError(
                f"this hold of key {hold.key!r} was entered already: call hold() again"
            )

    def _renewal_due(self) -> tuple[_HoldBase | None, float]:
        """The hold to renew now, taken out of the live ones, or None and how long
        until the first is due; ``(None, -1)`` when none is held. Holds sit in the
        order they were taken or renewed, which is the order they fall due (every
        hold of a limiter has one lease), so only the first is looked at."""
        for hold, since in self._live.items():
            wait = since + self.lease * RENEW_AT - time.monotonic()
            if wait > 0:
                return None, wait
            del self._live[hold]
            return hold, 0.0
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


class _HoldBase:
    __slots__ = ("key", "lease_id", "max_wait", "state", "store_key")

    def __init__(self, key: str, store_key: str, lease_id: str, max_wait: float) -> None:
        self.key = key
        self.store_key = store_key
        self.lease_id = lease_id
        self.max_wait = max_wait
        self.state = NEW

    @property
    def held(self) -> bool:
        """Whether this hold has its slot (as far as this process knows)."""
        return self.state == HELD

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r} lease {self.lease_id} {self.state}>"


class Hold(_HoldBase):
    """One hold of a slot: ``with limiter.hold(key) as hold``; ``hold.lease_id``
    names its lease. Leaving the block releases the slot; `release` does it
    earlier, once."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: ConcurrencyLimiter, key: str, max_wait: float) -> None:
        super().__init__(key, limiter._store_key(key), limiter._new_id(), max_wait)
        self._limiter = limiter

    def __enter__(self) -> Hold:
        self._limiter._take(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state == HELD:
            self._limiter._give(self, quiet=exc_type is not None)
        elif self.state == LOST and exc_type is None:
            raise self._limiter._not_held(self.key, self.lease_id, EXPIRED, "release")

    def release(self) -> None:
        """Give the slot back before the block ends; `LeaseNotHeld` if it is not held."""
        if self.state != HELD:
            raise self._limiter._released_twice(self)
        self._limiter._give(self, quiet=False)


class ConcurrencyLimiter(_Core):
    """At most ``limit`` holds of each key at once, across every process that
    shares the ``store`` (a `MemoryStore`: this process; the Redis store: all).

    ``lease``: seconds a holder that died keeps its slot; a live one renews its
    lease in the background. ``name``: limiters with one name share their slots
    (by default, limiters of one limit do). A store error raises `StoreError`:
    a concurrency limit does not fail open."""

    def __init__(
        self,
        limit: int,
        *,
        store: LeaseStore | None = None,
        lease: float = 30.0,
        name: str | None = None,
    ) -> None:
        super().__init__(limit, lease, name)
        self.store: LeaseStore = MemoryStore() if store is None else store
        self._leases = self.store.leases()
        self._lock = threading.Lock()  # guards _live and _renewer
        self._renewer: threading.Thread | None = None
        self._closed = threading.Event()
        self._wake = threading.Condition()
        self._released = 0  # releases so far, under _wake: a waiter's cue to look again

    def hold(self, key: str, max_wait: float = 0.0) -> Hold:
        """A hold of a slot of ``key``, taken on entering its ``with`` block: it waits
        up to ``max_wait`` seconds, then raises `RateLimitTimeout`."""
        check_max_wait(max_wait)
        return Hold(self, key, max_wait)

    def in_flight(self, key: str) -> int:
        """Holds of ``key`` the store counts now, of every process sharing it."""
        outcome = self._leases.call("count", self._store_key(key), "", self.limit, 0)
        if outcome.reclaimed:
            self._count("reclaimed", outcome.reclaimed)
        return outcome.held

    def release(self, key: str, lease_id: str) -> None:
        """Release a lease by its id (a hold's ``lease_id``), from anywhere that
        shares the store: `LeaseNotHeld` says why when it is not held."""
        outcome = self._leases.call("release", self._store_key(key), lease_id, self.limit, 0)
        if outcome.reclaimed:
            self._count("reclaimed", outcome.reclaimed)
        if outcome.status != OK:
            raise self._not_held(key, lease_id, outcome.status, "release")
        self._wake_waiters()

    def _take(self, hold: Hold) -> None:
        self._first_entry(hold)
        outcome = self._checked(hold, self._call("take", hold))
        if outcome.status != OK:
            self._wait(hold, outcome)
        with self._lock:
            hold.state = HELD
            self._live[hold] = time.monotonic()
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew, name=f"ratewarden-leases-{self.name}", daemon=True
                )
                self._renewer.start()
        self._count("taken")

    def _call(self, op: Op, hold: Hold) -> Outcome:
        return self._leases.call(op, hold.store_key, hold.lease_id, self.limit, self.lease_us)

    def _wait(self, hold: Hold, outcome: Outcome) -> None:
        if hold.max_wait <= 0:
            raise self._timeout(hold.key, hold.max_wait, outcome)
        deadline = time.monotonic() + hold.max_wait
        pause = FIRST_POLL
        with self._wake:
            self.stats.waiting += 1
        try:
            while True:
                released = self._released
                outcome = self._checked(hold, self._call("take", hold))
                if outcome.status == OK:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout(hold.key, hold.max_wait, outcome)
                nap = min(left, pause, max(outcome.wait_us / 1e6, FIRST_POLL))
                with self._wake:
                    if self._released == released:
                        self._wake.wait(nap)
                pause = min(pause * 2, POLL)
        finally:
            with self._wake:
                self.stats.waiting -= 1

    def _give(self, hold: Hold, *, quiet: bool) -> None:
        """Release ``hold``'s slot; raise `LeaseNotHeld` if its lease had ended,
        unless ``quiet`` (an exception is on its way out of the block already)."""
        with self._lock:
            self._live.pop(hold, None)
            hold.state = RELEASED
        outcome = self._checked(hold, self._call("release", hold))
        self._wake_waiters()
        if outcome.status != OK:
            self._count("lost")
            error = self._not_held(hold.key, hold.lease_id, outcome.status, "release")
            if not quiet:
                raise error
            log.warning("%s", error)

    def _wake_waiters(self) -> None:
        if self.stats.waiting:
            with self._wake:
                self._released += 1
                self._wake.notify_all()

    def _renew(self) -> None:
        """The renewing thread: renews each hold as it falls due; ends when the
        limiter holds nothing (the next hold starts another)."""
        while True:
            with self._lock:
                hold, wait = self._renewal_due()
                if hold is None and wait < 0:
                    self._renewer = None
                    return
            if hold is None:
                if self._closed.wait(wait):
                    return
                continue
            assert isinstance(hold, Hold)
            try:
                outcome = self._checked(hold, self._call("renew", hold))
            except StoreError as exc:  # try again a third of a lease on; two more tries
                log.warning("renewing lease %s of %r: %s", hold.lease_id, hold.key, exc)
                outcome = Outcome(OK, 0, 0, 0)
            with self._lock:
                if hold.state != HELD:
                    continue  # released meanwhile
                if outcome.status == OK:
                    self._live[hold] = time.monotonic()
                    continue
                hold.state = LOST
            self._count("lost")
            error = self._not_held(hold.key, hold.lease_id, outcome.status, "renewal")
            log.warning("%s", error)

    def close(self) -> None:
        """Stop renewing (the holds still held keep their slots until their leases end)."""
        self._closed.set()

    def __enter__(self) -> ConcurrencyLimiter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
