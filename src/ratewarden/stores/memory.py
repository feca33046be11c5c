"""The in-memory store: one process, no server, exact under threads.

Layout: one dict from ``prefix + key`` to the algorithm's state tuple. A hit pops
the key and inserts it again, so the dict's order is least- to most-recently used
at the price of a plain get/set. Memory stays bounded two ways:

- states that are "full" again (element 0, ``full_at``, has passed) mean the same
  as no state; a sweep drops them whenever the dict has doubled since the last one
  (amortised O(1) per new key), and on `MemoryStore.sweep`;
- with ``max_keys``, a new key that overflows the bound evicts the least recently
  used keys, at least 1% of the bound at a time so that the scan over the dict's
  front stays amortised O(1). An evicted key that was not full starts afresh:
  size ``max_keys`` above the number of keys active within one period.
"""

from __future__ import annotations

import threading
from itertools import islice
from typing import Unpack

from .._clock import Clock, SystemClock
from .._decision import Decision
from .._errors import ConfigurationError
from .._rate import Rate
from ..algorithms import Algorithm, Params, State, peek
from ._base import AsyncBound, BindOptions, Bound

__all__ = ["AsyncMemoryStore", "MemoryStore"]

_MIN_SWEEP = 1024  # no sweep below this many keys: nothing worth reclaiming


def check_cost(cost: object) -> None:
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"cost must be a positive integer, got {cost!r}")


class MemoryStore:
    """Thread-safe in-process store. ``max_keys`` bounds the number of keys kept
    (least recently used evicted first); ``clock`` defaults to the wall clock."""

    def __init__(self, *, max_keys: int | None = None, clock: Clock | None = None) -> None:
        if max_keys is not None and (type(max_keys) is not int or max_keys < 1):
            raise ConfigurationError(f"max_keys must be a positive integer, got {max_keys!r}")
        self.clock: Clock = SystemClock() if clock is None else clock
        self.max_keys = max_keys
        self._data: dict[str, State] = {}
        self._lock = threading.Lock()
        self._sweep_at = _MIN_SWEEP
        self._grow_at = self._next_grow_at()
        self.evicted = 0  # live keys dropped by the max_keys bound, for metrics

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        params = Params.build(
            rate.limit, rate.period_ns, burst=options["burst"], tick=1e-9, rule=options["rule"]
        )
        prefix = options["prefix"]
        step = algorithm.step
        data = self._data
        pop, get = data.pop, data.get
        acquire, release = self._lock.acquire, self._lock.release
        time_ns = self.clock.time_ns

        def hit(key: str, cost: int = 1) -> Decision:
            if cost.__class__ is not int or cost < 1:
                check_cost(cost)
            k = prefix + key
            now = time_ns()
            acquire()
            try:
                state = pop(k, None)  # re-inserted below: most recently used goes last
                decision, data[k] = step(state, now, cost, params)
                if state is None and len(data) > self._grow_at:
                    self._grow(now)
            finally:
                release()
            return decision

        def peek_(key: str, cost: int = 1) -> Decision:
            check_cost(cost)
            now = time_ns()
            return peek(step, get(prefix + key), now, cost, params)  # one atomic read, then pure

        def reset(key: str) -> None:
            k = prefix + key
            with self._lock:  # not between another hit's pop and its store
                pop(k, None)

        return Bound(hit, peek_, reset)

    def _next_grow_at(self) -> int:
        return self._sweep_at if self.max_keys is None else min(self._sweep_at, self.max_keys)

    def _grow(self, now: int) -> None:
        """Called under the lock when a new key pushed the dict past a threshold."""
        data = self._data
        if len(data) > self._sweep_at:
            self._drop_full(now)
            self._sweep_at = max(2 * len(data), _MIN_SWEEP)
        if self.max_keys is not None and len(data) > self.max_keys:
            excess = max(len(data) - self.max_keys, self.max_keys // 100)
            for key in list(islice(data, excess)):  # the front is least recently used
                del data[key]
            self.evicted += excess
        self._grow_at = self._next_grow_at()

    def _drop_full(self, now: int) -> int:
        data = self._data
        full = [key for key, state in data.items() if state[0] <= now]
        for key in full:
            del data[key]
        return len(full)

    def sweep(self) -> int:
        """Drop every key whose state is full again; return how many went."""
        now = self.clock.time_ns()
        with self._lock:
            dropped = self._drop_full(now)
            self._sweep_at = max(2 * len(self._data), _MIN_SWEEP)
            self._grow_at = self._next_grow_at()
        return dropped

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        bound = "" if self.max_keys is None else f", max_keys={self.max_keys}"
        return f"<MemoryStore keys={len(self._data)}{bound}, clock={self.clock!r}>"


class AsyncMemoryStore:
    """The memory store for `AsyncLimiter`: the same core, awaited. Its calls never
    block the event loop (the lock is held only for a dict update)."""

    def __init__(self, *, max_keys: int | None = None, clock: Clock | None = None) -> None:
        self.sync = MemoryStore(max_keys=max_keys, clock=clock)
        self.clock = self.sync.clock

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> AsyncBound:
        sync_hit, sync_peek, sync_reset = self.sync.bind(algorithm, rate, **options)

        async def hit(key: str, cost: int = 1) -> Decision:
            return sync_hit(key, cost)

        async def peek(key: str, cost: int = 1) -> Decision:
            return sync_peek(key, cost)

        async def reset(key: str) -> None:
            sync_reset(key)

        return AsyncBound(hit, peek, reset)

    async def sweep(self) -> int:
        return self.sync.sweep()

    def __len__(self) -> int:
        return len(self.sync)

    def __repr__(self) -> str:
        return "<Async" + repr(self.sync)[1:]
