"""A mutex whose uncontended path is one C call each way.

``threading.Lock.acquire`` parses keyword arguments on every call: about 1,000
machine instructions for an acquire/release pair on CPython 3.11, a sixth of a whole
memory-store hit. A deque holding one token is a mutex too: ``pop`` takes the token
and ``append`` gives it back, each a single atomic call (atomic under the GIL, and
under free-threaded builds, where deques lock themselves), about 400 instructions
for the pair.

The contended path yields and retries. Contention is rare by design: the critical
sections guarded here are a dict read, a pure step and a dict write, with no I/O
and no user code, so another thread finds the token taken only when the holder was
preempted inside that microsecond. A thread that waits gives up the GIL each time
it retries, so the holder runs.

The in-memory store: one process, no server, exact under threads.

Layout: one dict per limit (per key prefix), from the caller's key to the
algorithm's state tuple. Using the caller's string as it is, rather than a
``prefix + key`` copy, saves building and hashing a new string on every hit and
storing it. Memory stays bounded two ways:

- states that are "full" again (element 0, ``full_at``, has passed) mean the same
  as no state; a sweep drops them whenever the store has doubled since the last one
  (amortised O(1) per new key), and on `MemoryStore.sweep`;
- with ``max_keys``, each hit moves its key to the end of its dict (pop and
  re-insert), so each dict runs from least to most recently used; a new key that
  overflows the bound makes every limit give up its least recently used keys in
  proportion to its size, at least 1% of the bound in all, so that the scans over
  the dicts' fronts stay amortised O(1). An evicted key that was not full starts
  afresh: size ``max_keys`` above the number of keys active within one period.
  Without ``max_keys`` nothing is reordered.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from types import TracebackType
from typing import Any, TypeAlias, TypeVar, Unpack

from ..algorithms import Algorithm, Params, State, Step, peek
from ..primitives import Clock, ConfigurationError, Decision, Rate, default_clock, test_switch
from .base import AsyncBound, BindOptions, Bound, Check, check_cost, pick
from .leases import AsyncMemoryLeases, MemoryLeases

__all__ = [
    "AsyncMemoryStore",
    "MemoryStore",
    "TokenLock",
]


class TokenLock:
    def __init__(self) -> None:
        tokens: deque[int] = deque((1,))
        self.take = tokens.pop  # raises IndexError when another thread holds it
        self.give = tokens.append  # give(1) releases
        self._tokens = tokens

    def wait(self) -> None:
        """The contended path of ``take``: retry until the holder gives the token back."""
        delay = 0.0
        while True:
            time.sleep(delay)  # releases the GIL, so the holder can finish
            try:
                self.take()
            except IndexError:
                delay = min(delay * 2 or 1e-6, 1e-3)
            else:
                return

    def acquire(self) -> None:
        try:
            self.take()
        except IndexError:
            self.wait()

    def release(self) -> None:
        self.give(1)

    def locked(self) -> bool:
        return not self._tokens

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<TokenLock {'locked' if self.locked() else 'unlocked'}>"


T = TypeVar("T")
# `MemoryStore.update`'s change: (state, now) -> (its value, the new state or None)
Change: TypeAlias = Callable[[State | None, int], tuple[T, State | None]]

_MIN_SWEEP = 1024  # no sweep below this many keys: nothing worth reclaiming
_SWEEP_SHARE = 8  # at the bound, sweep when 1/8 of it has come in since the last sweep
_ONE = 1  # the default cost: one identity test skips validating it


@dataclass(frozen=True, slots=True)
class _Tier:
    """One limit in this store, as `MemoryStore.hit_many` steps it."""

    data: dict[str, State]
    step: Step
    params: Params


class MemoryStore:
    """Thread-safe in-process store. ``max_keys`` bounds the number of keys kept
    (least recently used evicted first); ``clock`` defaults to the wall clock."""

    calendars = True  # counts calendar periods (see Limiter's calendar=)

    def __init__(self, *, max_keys: int | None = None, clock: Clock | None = None) -> None:
        if max_keys is not None and (type(max_keys) is not int or max_keys < 1):
            raise ConfigurationError(f"max_keys must be a positive integer, got {max_keys!r}")
        self.clock: Clock = default_clock() if clock is None else clock
        self.max_keys = max_keys
        self._tables: dict[str, dict[str, State]] = {}  # key prefix -> key -> state
        self._lock = TokenLock()
        self._size = 0  # keys in all tables, kept under the lock
        self._swept_size = 0  # the size the last sweep left
        self._churn = 0  # keys evicted since the last sweep
        self._grow_at = self._next_grow_at()
        self.evicted = 0  # live keys dropped by the max_keys bound, for metrics
        self._leases = MemoryLeases(self.clock)

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        params = Params.build(
            rate.limit, rate.period_ns, burst=options["burst"], tick=1e-9, rule=options["rule"]
        )
        step = algorithm.step
        switch = test_switch()
        if switch is not None:  # under ratewarden's pytest plugin only: see TestSwitch
            step = switch.switchable(step)
            switch.track(self, "clear")
        with self._lock:
            data = self._tables.setdefault(options["prefix"], {})
        # With a bound, pop and re-insert keeps each dict in least-recently-used order;
        # without one, get and set in place is cheaper. Same call shape either way.
        fetch = data.get if self.max_keys is None else data.pop
        take, give, wait = self._lock.take, self._lock.give, self._lock.wait
        time_ns = self.clock.time_ns

        def hit(key: str, cost: int = 1) -> Decision:
            if cost is not _ONE:
                check_cost(cost)
            now = time_ns()
            try:
                take()
            except IndexError:  # another thread holds the store: rare, see TokenLock
                wait()
            try:
                state = fetch(key, None)
                decision, data[key] = step(state, now, cost, params)
                if state is None:
                    self._size += 1
                    if self._size > self._grow_at:
                        self._grow(now)
            finally:
                give(1)
            return decision

        def peek_(key: str, cost: int = 1) -> Decision:
            check_cost(cost)
            now = time_ns()
            return peek(step, data.get(key), now, cost, params)  # one atomic read, then pure

        def reset(key: str) -> None:
            with self._lock:  # not between another hit's read and its store
                if data.pop(key, None) is not None:
                    self._size -= 1

        return Bound(hit, peek_, reset, _Tier(data, step, params))

    def hit_many(self, checks: Sequence[Check]) -> Decision:
        """Step every tier under one hold of the lock; keep the new states only if
        every tier passed. A key that appears in two tiers steps twice, the second
        time from the state the first left."""
        for _, _, cost in checks:
            if cost is not _ONE:
                check_cost(cost)
        now = self.clock.time_ns()
        lock = self._lock
        try:  # the lock's fast path inline, as `bind`'s hit takes it
            lock.take()
        except IndexError:
            lock.wait()
        try:
            return self._step_all(checks, now)
        finally:
            lock.give(1)

    def hit_tiers(
        self, checks: Sequence[Check], shadow: Sequence[Check]
    ) -> tuple[Decision | None, Decision | None]:
        """`hit_many` of ``checks``, then, only if they passed (or there were none),
        of the ``shadow`` tiers, which never deny the request: both under one hold
        of the lock. Their Decisions (None for an empty side, or for shadow tiers
        not checked)."""
        for _, _, cost in (*checks, *shadow):
            if cost is not _ONE:
                check_cost(cost)
        now = self.clock.time_ns()
        lock = self._lock
        try:
            lock.take()
        except IndexError:
            lock.wait()
        try:
            decision = self._step_all(checks, now) if checks else None
            if shadow and (decision is None or decision.allowed):
                return decision, self._step_all(shadow, now)
            return decision, None
        finally:
            lock.give(1)

    def _step_all(self, checks: Sequence[Check], now: int) -> Decision:
        """hit_many's work, under the lock."""
        decisions: list[Decision] = []
        undo: list[tuple[dict[str, State], str, State | None]] = []
        bounded = self.max_keys is not None
        passed = True
        for tier, key, cost in checks:
            data = tier.data
            # popped and re-inserted under a bound, as hit does: most recent last
            state = data.pop(key, None) if bounded else data.get(key)
            decision, new = tier.step(state, now, cost, tier.params)
            decisions.append(decision)
            if decision.allowed:
                data[key] = new
                undo.append((data, key, state))
            else:
                passed = False
                if state is not None:
                    data[key] = state
        if passed:
            for _, _, state in undo:
                if state is None:
                    self._size += 1
            if self._size > self._grow_at:
                self._grow(now)
        else:
            for data, key, state in reversed(undo):  # reversed: a repeated key ends
                if state is None:  # where it started
                    del data[key]
                else:
                    data[key] = state
        return pick(decisions)

    def update(self, tier: Any, key: str, change: Change[T]) -> T:
        """``change(state, now)`` of one key of the limit ``tier`` (a `Bound`'s),
        under the lock, as a hit steps it: returns its value and stores its state
        (None: none). For changes that are not hits, as settling a reservation."""
        data: dict[str, State] = tier.data
        now = self.clock.time_ns()
        lock = self._lock
        try:  # the lock's fast path inline, as `bind`'s hit takes it
            lock.take()
        except IndexError:
            lock.wait()
        try:
            state = data.pop(key, None) if self.max_keys is not None else data.get(key)
            try:
                value, new = change(state, now)
            except BaseException:
                if state is not None:
                    data[key] = state  # a change that raised changes nothing
                raise
            if new is not None:
                data[key] = new
                if state is None:
                    self._size += 1
                    if self._size > self._grow_at:
                        self._grow(now)
            elif state is not None:
                data.pop(key, None)
                self._size -= 1
            return value
        finally:
            lock.give(1)

    def _sweep_at(self) -> int:
        """Sweep for growth once the store has doubled since the last sweep."""
        return max(2 * self._swept_size, _MIN_SWEEP)

    def _next_grow_at(self) -> int:
        sweep_at = self._sweep_at()
        return sweep_at if self.max_keys is None else min(sweep_at, self.max_keys)

    def _grow(self, now: int) -> None:
        """Called under the lock when a new key pushed the store past a threshold."""
        if self._size > self._sweep_at():
            self._drop_full(now)
        if self.max_keys is not None and self._size > self.max_keys:
            self._make_room(now, self.max_keys)
        self._grow_at = self._next_grow_at()

    def _make_room(self, now: int, bound: int) -> None:
        # At the bound the size stops growing, so sweeps keyed to growth stop too. Sweep
        # before evicting once an eighth of the bound has come in since the last sweep,
        # so that full keys go before live ones: at most 8 checks per new key, amortised.
        if self._size - self._swept_size + self._churn >= bound // _SWEEP_SHARE:
            self._drop_full(now)
        if self._size <= bound:
            return
        excess = max(self._size - bound, bound // 100)
        tables = list(self._tables.values())
        # Each table gives its share of the excess rounded down, and what rounding
        # left over comes from the largest tables, one key each: a small limit
        # (three users) keeps its keys while a flood in another limit is evicted,
        # instead of losing its least recent key every round. Each table keeps
        # its most recent key (the one just hit).
        counts = [len(data) * excess // self._size for data in tables]
        left = excess - sum(counts)
        for at in sorted(range(len(tables)), key=lambda i: -len(tables[i]))[:left]:
            counts[at] += 1
        for data, share in zip(tables, counts, strict=True):
            count = max(0, min(share, len(data) - 1))
            for key in list(islice(data, count)):  # the front is least recently used
                del data[key]
            self._size -= count
            self.evicted += count
            self._churn += count

    def _drop_full(self, now: int) -> int:
        """Drop every full state (under the lock); the sweep counters restart."""
        dropped = 0
        for data in self._tables.values():
            full = [key for key, state in data.items() if state[0] <= now]
            for key in full:
                del data[key]
            dropped += len(full)
        self._size -= dropped
        self._swept_size, self._churn = self._size, 0
        return dropped

    def leases(self) -> MemoryLeases:
        """The lease table of `ratewarden.ConcurrencyLimiter` on this store."""
        return self._leases

    def sweep(self) -> int:
        """Drop every key whose state is full again; return how many went."""
        now = self.clock.time_ns()
        with self._lock:
            dropped = self._drop_full(now)
            self._grow_at = self._next_grow_at()
        return dropped

    def clear(self) -> None:
        with self._lock:
            for data in self._tables.values():
                data.clear()
            self._size = 0
        self._leases.clear()

    def close(self) -> None:
        """Nothing to let go of: no connection, no thread. The store stays usable."""

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        bound = "" if self.max_keys is None else f", max_keys={self.max_keys}"
        return f"<MemoryStore keys={self._size}{bound}, clock={self.clock!r}>"


class AsyncMemoryStore:
    """The memory store for `AsyncLimiter`: the same core, awaited. Its calls never
    block the event loop (the lock is held only for a dict update)."""

    calendars = True  # counts calendar periods (see Limiter's calendar=)

    def __init__(self, *, max_keys: int | None = None, clock: Clock | None = None) -> None:
        self.sync = MemoryStore(max_keys=max_keys, clock=clock)
        self.clock = self.sync.clock
        self._leases = AsyncMemoryLeases(self.sync.leases())

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> AsyncBound:
        sync_hit, sync_peek, sync_reset, tier = self.sync.bind(algorithm, rate, **options)

        async def hit(key: str, cost: int = 1) -> Decision:
            return sync_hit(key, cost)

        async def peek(key: str, cost: int = 1) -> Decision:
            return sync_peek(key, cost)

        async def reset(key: str) -> None:
            sync_reset(key)

        return AsyncBound(hit, peek, reset, tier)

    async def hit_many(self, checks: Sequence[Check]) -> Decision:
        return self.sync.hit_many(checks)

    async def hit_tiers(
        self, checks: Sequence[Check], shadow: Sequence[Check]
    ) -> tuple[Decision | None, Decision | None]:
        return self.sync.hit_tiers(checks, shadow)

    def leases(self) -> AsyncMemoryLeases:
        """The sync store's lease table, awaited (for `ratewarden.AsyncConcurrencyLimiter`)."""
        return self._leases

    async def sweep(self) -> int:
        return self.sync.sweep()

    async def aclose(self) -> None:
        """Nothing to let go of (see `MemoryStore.close`)."""
        self.sync.close()

    def __len__(self) -> int:
        return len(self.sync)

    def __repr__(self) -> str:
        return "<Async" + repr(self.sync)[1:]
