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
    wait_us    a refused take: microseconds until the earliest lease ends; else 0

Times are integer microseconds (the Redis server's clock, or a store's clock).
A lease ends at its expiry: at ``now == expiry`` it is gone.
"""

from __future__ import annotations

import threading
from typing import Literal, NamedTuple, Protocol, TypeAlias

from ..primitives import Clock

__all__ = [
    "BUSY",
    "DUPLICATE",
    "EXPIRED",
    "OK",
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
]

OK, BUSY, UNKNOWN, EXPIRED, DUPLICATE = 1, 0, 0, 2, -1
SWEEP_FLOOR = 1024
Op: TypeAlias = Literal["take", "renew", "release", "count"]


class Outcome(NamedTuple):
    """What a lease operation answers (see the module's docstring)."""

    status: int
    held: int
    reclaimed: int
    wait_us: int


class Leases(Protocol):
    """A store's lease table, as `ratewarden.ConcurrencyLimiter` calls it: one
    atomic call per operation. ``key`` is the whole key (the limiter's name in it);
    ``limit`` and ``lease_us`` are read by take and renew."""

    def call(self, op: Op, key: str, lease_id: str, limit: int, lease_us: int) -> Outcome: ...


class AsyncLeases(Protocol):
    """`Leases` for `ratewarden.AsyncConcurrencyLimiter`."""

    async def call(self, op: Op, key: str, lease_id: str, limit: int, lease_us: int) -> Outcome: ...


class LeaseStore(Protocol):
    """A store that keeps lease tables (`MemoryStore`, the Redis store)."""

    def leases(self) -> Leases: ...


class AsyncLeaseStore(Protocol):
    """An asyncio store that keeps lease tables."""

    def leases(self) -> AsyncLeases: ...


class LeaseTable:
    """The lease tables of many keys, time passed in, no lock (see the module's
    docstring). Memory stays bounded by the leases held: a key whose last lease
    goes is dropped, and whenever the number of keys has doubled since the last
    sweep (at least 1024 keys), every key's ended leases are swept (amortised
    O(1) a new key), so that the leases of dead holders on keys nobody touches
    again do not pile up: at most twice the keys with live leases, or 1024."""

    def __init__(self) -> None:
        self.keys: dict[str, dict[str, int]] = {}  # key -> lease id -> expiry (us)
        self._sweep_at = SWEEP_FLOOR

    def call(
        self, op: Op, key: str, lease_id: str, limit: int, lease_us: int, *, now: int
    ) -> Outcome:
        leases = self.keys.get(key)
        if leases is None:
            if op == "take":
                if len(self.keys) >= self._sweep_at:
                    self.sweep(now)
                self.keys[key] = {lease_id: now + lease_us}
                return Outcome(OK, 1, 0, 0)
            return Outcome(OK if op == "count" else UNKNOWN, 0, 0, 0)
        own = leases.get(lease_id) if op in ("renew", "release") else None
        ended = [lease for lease, expiry in leases.items() if expiry <= now]
        for lease in ended:
            del leases[lease]
        reclaimed = len(ended)
        if op == "take":
            held = len(leases)
            if held < limit:
                if lease_id in leases:
                    outcome = Outcome(DUPLICATE, held, reclaimed, 0)
                else:
                    leases[lease_id] = now + lease_us
                    outcome = Outcome(OK, held + 1, reclaimed, 0)
            else:
                outcome = Outcome(BUSY, held, reclaimed, min(leases.values()) - now)
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

    def sweep(self, now: int) -> int:
        """Drop every ended lease, and the keys left empty; how many leases went."""
        dropped = 0
        for key in list(self.keys):
            leases = self.keys[key]
            for lease in [lease for lease, expiry in leases.items() if expiry <= now]:
                del leases[lease]
                dropped += 1
            if not leases:
                del self.keys[key]
        self._sweep_at = max(SWEEP_FLOOR, 2 * len(self.keys))
        return dropped


class MemoryLeases:
    """`LeaseTable` on a clock, under a lock: the memory store's lease table
    (one process; its threads share the slots)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.table = LeaseTable()
        self._lock = threading.Lock()

    def call(self, op: Op, key: str, lease_id: str, limit: int, lease_us: int) -> Outcome:
        now = self.clock.time_ns() // 1000
        with self._lock:
            return self.table.call(op, key, lease_id, limit, lease_us, now=now)

    def clear(self) -> None:
        """Forget every lease (the store's `clear`: all its slots free)."""
        with self._lock:
            self.table.keys.clear()


class AsyncMemoryLeases:
    """`MemoryLeases` awaited; it never blocks the loop (the lock guards a dict
    update)."""

    def __init__(self, sync: MemoryLeases) -> None:
        self.sync = sync

    async def call(self, op: Op, key: str, lease_id: str, limit: int, lease_us: int) -> Outcome:
        return self.sync.call(op, key, lease_id, limit, lease_us)
