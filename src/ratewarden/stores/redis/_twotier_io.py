# Generated from src/ratewarden/stores/redis/_atwotier_io.py by scripts/unasync.py:
# edit that file, then run the script.
"""The two-tier store's I/O: the engine a Redis store keeps for its limits bound
with ``two_tier=True`` (the logic is in `_twotier` and `_twotier_core`). It syncs
every ``sync_interval``, and at once when a key's unsent hits pass ``flush_at``.

The asyncio engine (`_atwotier_io`, written by hand) syncs from a task, started
by the first check in a running loop, and runs on that loop's thread alone: it
takes no lock. Its sync twin (`_twotier_io`, written from it by
scripts/unasync.py) syncs from a daemon thread, and its checks take a lock.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import Any

from ...algorithms import Algorithm
from ...primitives import Clock, Decision, Rate, StoreError
from ..base import BindOptions, Bound, Check, check_cost
from ..failure import Breaker, LocalFallback
from ._twotier import TwoTierSettings
from ._twotier_core import EXACT_TIERS, Engine, Step, peeked

__all__ = ["TwoTier"]

log = logging.getLogger("ratewarden.stores")
_ONE = 1
CLOSE_WAIT = 5.0  # seconds a closing store tries to send its last hits
CLOSE_RETRY = 0.05  # seconds between its tries


class TwoTier(Engine):
    """The two-tier engine that `RedisStore` keeps (see the module docstring)."""

    def __init__(
        self,
        call: Callable[[str, int, list[Any]], Any],
        settings: TwoTierSettings,
        breaker: Breaker,
        test_clock: Clock | None,
        keyslot: Callable[[str], int] | None,
        *,
        fallback: LocalFallback,
    ) -> None:
        super().__init__(settings, breaker, test_clock, keyslot, fallback=fallback)
        self.call = call  # a script call: name, numkeys, keys + arguments
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def bind(
        self,
        algorithm: Algorithm,
        rate: Rate,
        options: BindOptions,
        exact_many: Callable[[Sequence[Check]], Decision],
        delete: Callable[[str], None],
    ) -> Bound:
        limit = self.make(algorithm, rate, options)
        entries, lock, tick_us, now_us = limit.entries, self.lock, limit.tick_us, self.now_us
        decide, fast, flush_at = limit.decide, limit.fast(), limit.flush_at
        clock_ns = time.time_ns if self.test_clock is None else self.test_clock.time_ns
        wake = self.wake
        self.start()

        def hit(key: str, cost: int = 1) -> Decision:
            if cost is not _ONE:
                check_cost(cost)
            now = (clock_ns() // 1000 + self.offset_us) // tick_us
            with lock:
                entry = entries.get(key)
                if entry is not None:
                    decision = fast(entry, now, cost)
                    if decision is not None:
                        if entry.delta >= flush_at:
                            wake.set()
                        return decision
                else:
                    entry = self.entry(limit, key)
                decision = decide(entry, now, cost)
                if decision is not None:
                    return decision
            return self.drive(self.one(limit, entry, cost, lock), exact_many)

        def peek(key: str, cost: int = 1) -> Decision:
            check_cost(cost)
            now = now_us() // tick_us
            with lock:
                entry = self.entry(limit, key)
                if entry.synced >= 0 and now - entry.synced <= limit.stale:
                    return peeked(limit, entry, now, cost)
            self.sync()
            if entry.synced < 0:  # nothing unsent to sync it with: ask for it
                self.drive(self.fetch(limit, entry, lock), exact_many)
            with lock:
                return peeked(limit, entry, now_us() // tick_us, cost)

        def reset(key: str) -> None:
            delete(limit.prefix + key)
            with lock:
                entry = limit.entries.pop(key, None)
                if entry is not None:  # its hits waiting to be sent again are dropped too
                    self.forget(entry)

        limit.hit = hit
        return Bound(hit, peek, reset, limit)

    def hit_many(
        self, checks: Sequence[Check], exact_many: Callable[[Sequence[Check]], Decision]
    ) -> Decision:
        return self.drive(self.calls(checks, self.lock), exact_many)

    def drive(
        self,
        calls: Generator[Step, Any, Decision],
        exact_many: Callable[[Sequence[Check]], Decision],
    ) -> Decision:
        try:
            step = next(calls)
            while True:
                if step[0] == EXACT_TIERS:
                    step = calls.send(exact_many(step[1]))  # type: ignore[arg-type]
                    continue
                try:
                    result = self.call(*step)
                except StoreError as exc:
                    step = calls.throw(exc)
                else:
                    step = calls.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(
                target=_run,
                args=(weakref.ref(self), self.wake, self.settings.sync_interval),
                name="ratewarden-two-tier",
                daemon=True,
            )
            self.thread.start()

    def sync(self) -> None:
        """Sends every key's unsent hits now, and those of calls whose reply was
        lost again; a call that fails, in any way, keeps its hits to be sent again
        as they were (`Engine.lost`)."""
        for new in (False, True):  # the calls sent again first, then the new ones
            for batch in self.batches(self.lock, new=new):
                sent_at = time.time_ns()
                try:
                    reply = self.call(*batch[0])
                except Exception as exc:
                    reply = exc
                self.synced(batch, reply, self.lock, sent_at)
        self.trim(self.lock)

    def close(self) -> None:
        """Stops the syncing after a last sync. A sync under way is let finish (cut
        short, the hits it carries would be in flight for good), within a bound."""
        self.closed = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=CLOSE_WAIT)
        deadline = time.monotonic() + CLOSE_WAIT
        self.sync()
        while self.unsent()[0] and time.monotonic() < deadline:  # Redis slow, or down
            time.sleep(CLOSE_RETRY)
            self.sync()
        self.unsent_at_close()


def _run(engine_ref: weakref.ref[TwoTier], wake: threading.Event, interval: float) -> None:
    """The sync thread. It holds its engine only while syncing, so a store dropped
    without `close` is collected (its unsent hits with it) and the thread ends."""
    while True:
        wake.wait(interval)
        wake.clear()
        engine = engine_ref()
        if engine is None or engine.closed:
            return
        try:
            engine.sync()
        except Exception:  # the thread must live on; the next sync tries again
            log.exception("two-tier sync failed")
        del engine
