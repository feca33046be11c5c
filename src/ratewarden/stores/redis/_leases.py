# Generated from src/ratewarden/stores/redis/_aleases.py by scripts/unasync.py:
# edit that file, then run the script.
"""`RedisLeases`: a concurrency limit's lease table in Redis, ``_leases.lua``.

One script call per operation, on one key and its waiters' two (a cluster keeps
them on one node: the lease key is a hash tag whole),
timed by the server's clock unless a test passes a `Clock`. The asyncio table
sends its calls through the store's pipelines (see ``_batcher``); the sync one
(``_leases``) is written from this module by scripts/unasync.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...primitives import Clock
from ..leases import NO_PLACE, Op, Outcome, Place, clamp_priority
from .scripts import LEASES

__all__ = ["RedisLeases"]

# the script's reply is always its five integers: made an Outcome without
# NamedTuple._make's count of them, which costs as much again
_outcome = tuple.__new__


class RedisLeases:
    """The Redis store's lease table: ``call`` is the store's script call (name,
    number of keys, keys then arguments)."""

    def __init__(self, call: Callable[[str, int, list[Any]], Any], clock: Clock | None) -> None:
        self._call = call
        self._clock = clock

    def call(
        self, op: Op, key: str, lease_id: str, limit: int, lease_us: int, *, place: Place = NO_PLACE
    ) -> Outcome:
        now: int | str = "" if self._clock is None else self._clock.time_ns() // 1000
        # the script's replies are its integers, as the client reads them
        if place is NO_PLACE and op != "take":  # no ticket to find: the lease key alone
            reply = self._call(LEASES, 1, [key, op, lease_id, limit, lease_us, now])
            return _outcome(Outcome, reply)
        # the waiters' two sets share the lease set's hash tag (the whole key is one);
        # a take that never waits has no place in line to send (the script reads it
        # as 0), but counts the tickets of those who wait
        keys_args = [key, f"{key}:w", f"{key}:e", op, lease_id, limit, lease_us, now]
        if place is not NO_PLACE:
            keys_args += (clamp_priority(place.priority), place.queued_at, place.ticket_us)
        return _outcome(Outcome, self._call(LEASES, 3, keys_args))
