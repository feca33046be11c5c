"""Lease tables: where a concurrency limit keeps the slots it has handed out.

A slot is a lease: an id with an expiry. Taking one first drops the leases that
have ended (their holders died or lost touch), then adds the caller's if fewer
than ``limit`` remain; renewing pushes a live lease's expiry on; releasing
removes it. A lease id names one slot, so releasing an id twice frees one slot
once: the second release finds nothing and says so.

`LeaseTable` is the table in Python with the time passed in: the memory stores
run it under a lock on their clock, and the Redis stores' ``_leases.lua`` does
exactly what it does (tests/parity holds them to that). Every operation answers
four integers, the same from both:

    status     TAKEN/RENEWED/RELEASED (1); BUSY, or UNKNOWN for renew/release (0);
               EXPIRED (2): the lease had ended before this call, which reclaimed it;
               DUPLICATE (-1): take of an id that is held already
    held       the leases held once the call is done
    reclaimed  ended leases this call dropped (the lease released or renewed
               too, when its own had ended)
    wait_us    a refused take: microseconds until the earliest lease ends (0 when
               none is held); else 0
    queued_at  a refused waiter's place in line: when it first asked (its ticket's
               arrival); else 0

**Waiters are served in order.** A take that may wait (its `Place`'s
``ticket_us`` > 0) and is
refused leaves a ticket: its rank is its ``priority`` (higher first), then when
it first asked, then its id. A take is granted only while the slots held plus
the live tickets ranked before it are fewer than ``limit``, so a freed slot goes
to the first in line, not to whoever asks next; a take that does not wait counts
every ticket as before it. The waiter asks again with its ``queued_at``, which
keeps its place even if its ticket ended meanwhile; a ticket ends ``ticket_us``
after the waiter last asked (a waiter that died holds its place no longer), when
its take is granted, and on ``leave`` (a waiter that gives up) or ``release``
given its id, priority and ``queued_at``: a ticket is named by its whole rank,
as the script's sorted set names it. Tickets are few: one per caller waiting now.

Times are integer microseconds (the Redis server's clock, or a store's clock).
A lease ends at its expiry: at ``now == expiry`` it is gone; so does a ticket.
"""

from __future__ import annotations

import threading
from typing import Literal, NamedTuple, Protocol, TypeAlias

from ..primitives import Clock

__all__ = [
    "BUSY",
    "DUPLICATE",
    "EXPIRED",
    "NO_PLACE",
    "OK",
    "TICKET_US",
    "UNKNOWN",
    "AsyncLeaseStore",
    "AsyncLeases",
    "AsyncMemoryLeases",
    "LeaseStore",
    "LeaseTable",
    "Leases",
    "MemoryLeases",
    "Op",
    "Outcome",
    "Place",
    "clamp_priority",
]

OK, BUSY, UNKNOWN, EXPIRED, DUPLICATE = 1, 0, 0, 2, -1
SWEEP_FLOOR = 1024
Op: TypeAlias = Literal["take", "renew", "release", "count", "leave"]
# a waiter's place in line outlives its last look by this (us): a waiter that died
# holds up the line this long at most; waiters look again every 50 ms at most
TICKET_US = 500_000
# priorities are clamped to what a ticket's rank holds (eight hex digits in Lua)
MIN_PRIORITY, MAX_PRIORITY = -(2**31) + 1, 2**31 - 1


class Outcome(NamedTuple):
    """What a lease operation answers (see the module's docstring)."""

    status: int
    held: int
    reclaimed: int
    wait_us: int
    queued_at: int = 0


class Place(NamedTuple):
    """A caller's place in line: its ``priority``, when it first asked
    (``queued_at``, the store's time in us; 0 before it has a ticket), and how
    long a ticket lasts after each ask (``ticket_us``; 0: a take that does not
    wait, and leaves no ticket)."""

    priority: int = 0
    queued_at: int = 0
    ticket_us: int = 0


NO_PLACE = Place()


class Leases(Protocol):
    """A store's lease table, as `ratewarden.ConcurrencyLimiter` calls it: one
    atomic call per operation. ``key`` is the whole key (the limiter's name in it);
    ``limit`` and ``lease_us`` are read by take and renew, ``place`` by a take
    that may wait (and by leave and release, to find its ticket)."""

    def call(
        self, op: Op, key: str, lease_id: str, limit: int, lease_us: int, *, place: Place = NO_PLACE
    ) -> Outcome: ...


class AsyncLeases(Protocol):
    """`Leases` for `ratewarden.AsyncConcurrencyLimiter`."""

    async def call(
        self, op: Op, key: str, lease_id: str, limit: int, lease_us: int, *, place: Place = NO_PLACE
    ) -> Outcome: ...


class LeaseStore(Protocol):
    """A store that keeps lease tables (`MemoryStore`, the Redis store)."""

    def leases(self) -> Leases: ...


class AsyncLeaseStore(Protocol):
    """An asyncio store that keeps lease tables."""

    def leases(self) -> AsyncLeases: ...


Rank: TypeAlias = tuple[int, int, str]  # (-priority, first asked, id): lowest first


def clamp_priority(priority: int) -> int:
    return min(max(priority, MIN_PRIORITY), MAX_PRIORITY)


class LeaseTable:
    """The lease tables of many keys, time passed in, no lock (see the module's
    docstring). Memory stays bounded by the leases held: a key whose last lease
    goes is dropped, and whenever the number of keys has doubled since the last
    sweep (at least 1024 keys), every key's ended leases are swept (amortised
    O(1) a new key), so that the leases of dead holders on keys nobody touches
    again do not pile up: at most twice the keys with live leases, or 1024.
    Tickets go with their key's sweep the same way."""

    def __init__(self) -> None:
        self.keys: dict[str, dict[str, int]] = {}  # key -> lease id -> expiry (us)
        self.tickets: dict[str, dict[Rank, int]] = {}  # key -> rank -> when it ends (us)
        self._sweep_at = SWEEP_FLOOR

    def call(
        self, op: Op, key: str, lease_id: str, limit: int, lease_us: int,
        *, place: Place = NO_PLACE, now: int,
    ) -> Outcome:  # fmt: skip
        ticket_us = place.ticket_us
        rank: Rank | None = None
        tickets: dict[Rank, int] | None = None
        left = False
        if place is not NO_PLACE or key in self.tickets:  # else nobody is in line
            rank = (-clamp_priority(place.priority), place.queued_at or now, lease_id)
            tickets, left = self._line(op, key, rank if place.queued_at else None, now)
        if op == "leave":
            return Outcome(OK if left else UNKNOWN, self._live(key, now), 0, 0)
        leases = self.keys.get(key)
        if leases is None:
            if op == "take":
                ahead = 0 if tickets is None else _ahead(tickets, rank, ticket_us)
                if ahead < limit:
                    if len(self.keys) >= self._sweep_at:
                        self.sweep(now)
                    self.keys[key] = {lease_id: now + lease_us}
                    if tickets is not None:
                        self._drop_ticket(key, rank)
                    return Outcome(OK, 1, 0, 0)
                return self._queued(key, rank, ticket_us, Outcome(BUSY, 0, 0, 0), now)
            return Outcome(OK if op == "count" else UNKNOWN, 0, 0, 0)
        own = leases.get(lease_id) if op in ("renew", "release") else None
        ended = [lease for lease, expiry in leases.items() if expiry <= now]
        for lease in ended:
            del leases[lease]
        reclaimed = len(ended)
        if op == "take":
            held = len(leases)
            ahead = 0 if tickets is None else _ahead(tickets, rank, ticket_us)
            if held + ahead < limit:
                if lease_id in leases:
                    outcome = Outcome(DUPLICATE, held, reclaimed, 0)
                else:
                    leases[lease_id] = now + lease_us
                    if tickets is not None:
                        self._drop_ticket(key, rank)
                    outcome = Outcome(OK, held + 1, reclaimed, 0)
            else:
                wait = min(leases.values()) - now if leases else 0
                outcome = self._queued(
                    key, rank, ticket_us, Outcome(BUSY, held, reclaimed, wait), now
                )
        elif op == "count":
            outcome = Outcome(OK, len(leases), reclaimed, 0)
        elif own is None:
            outcome = Outcome(UNKNOWN, len(leases), reclaimed, 0)
        elif own <= now:
            outcome = Outcome(EXPIRED, len(leases), reclaimed, 0)
        elif op == "renew":
            leases[lease_id] = now + lease_us
            outcome = Outcome(OK, len(leases), reclaimed, 0)
        else:
            del leases[lease_id]
            outcome = Outcome(OK, len(leases), reclaimed, 0)
        if not leases:
            del self.keys[key]
        return outcome

    def _line(
        self, op: Op, key: str, rank: Rank | None, now: int
    ) -> tuple[dict[Rank, int] | None, bool]:
        """The live tickets of ``key`` (None: none), ended ones dropped, and whether
        a leave or release took the caller's own (``rank``, when it has a place
        in line) out of it."""
        tickets = self.tickets.get(key)
        if tickets is None:
            return None, False
        for gone in [t for t, end in tickets.items() if end <= now]:
            del tickets[gone]
        left = (
            op in ("leave", "release") and rank is not None and tickets.pop(rank, None) is not None
        )
        if not tickets:
            del self.tickets[key]
            return None, left
        return tickets, left

    def _live(self, key: str, now: int) -> int:
        """The leases of ``key`` held now, ended ones left for the next call to reclaim."""
        leases = self.keys.get(key)
        return 0 if leases is None else sum(1 for expiry in leases.values() if expiry > now)

    def _queued(
        self, key: str, rank: Rank | None, ticket_us: int, busy: Outcome, now: int
    ) -> Outcome:
        """A refused take: a waiter's ticket is left, or kept, at its rank."""
        if ticket_us <= 0 or rank is None:
            return busy
        self.tickets.setdefault(key, {})[rank] = now + ticket_us
        return busy._replace(queued_at=rank[1])

    def _drop_ticket(self, key: str, rank: Rank | None) -> None:
        tickets = self.tickets.get(key)
        if tickets is None or rank is None:
            return
        tickets.pop(rank, None)
        if not tickets:
            del self.tickets[key]

    def sweep(self, now: int) -> int:
        """Drop every ended lease and ticket, and the keys left empty; how many
        leases went."""
        dropped = 0
        for key in list(self.keys):
            leases = self.keys[key]
            for lease in [lease for lease, expiry in leases.items() if expiry <= now]:
                del leases[lease]
                dropped += 1
            if not leases:
                del self.keys[key]
        for key in list(self.tickets):
            tickets = self.tickets[key]
            for gone in [t for t, end in tickets.items() if end <= now]:
                del tickets[gone]
            if not tickets:
                del self.tickets[key]
        self._sweep_at = max(SWEEP_FLOOR, 2 * len(self.keys))
        return dropped


def _ahead(tickets: dict[Rank, int], rank: Rank | None, ticket_us: int) -> int:
    """The live tickets before ``rank``: all of them for a take that does not wait."""
    if ticket_us <= 0 or rank is None:
        return len(tickets)
    return sum(1 for other in tickets if other < rank)


class MemoryLeases:
    """`LeaseTable` on a clock, under a lock: the memory store's lease table
    (one process; its threads share the slots)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.table = LeaseTable()
        self._lock = threading.Lock()

    def call(
        self, op: Op, key: str, lease_id: str, limit: int, lease_us: int, *, place: Place = NO_PLACE
    ) -> Outcome:
        now = self.clock.time_ns() // 1000
        with self._lock:
            return self.table.call(op, key, lease_id, limit, lease_us, place=place, now=now)

    def clear(self) -> None:
        """Forget every lease (the store's `clear`: all its slots free)."""
        with self._lock:
            self.table.keys.clear()
            self.table.tickets.clear()


class AsyncMemoryLeases:
    """`MemoryLeases` awaited; it never blocks the loop (the lock guards a dict
    update)."""

    def __init__(self, sync: MemoryLeases) -> None:
        self.sync = sync

    async def call(
        self, op: Op, key: str, lease_id: str, limit: int, lease_us: int, *, place: Place = NO_PLACE
    ) -> Outcome:
        return self.sync.call(op, key, lease_id, limit, lease_us, place=place)
