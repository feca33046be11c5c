"""The two-tier store's I/O: the sync and async engines a Redis store keeps for its
limits bound with ``two_tier=True`` (the logic is in `_twotier` and
`_twotierplan`). The sync engine syncs from a daemon thread, the async one from a
task; both sync every ``sync_interval``, and at once when a key's unsent hits
pass ``flush_at``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import Any

from ..._clock import Clock
from ..._decision import Decision
from ..._errors import StoreError
from ..._rate import Rate
from ...algorithms import Algorithm
from ..base import AsyncBound, BindOptions, Bound, Check, check_cost
from ..failure import Breaker, LocalFallback
from ._twotier import TwoTierSettings
from ._twotier_plan import EXACT_TIERS, Engine, Step, peeked

__all__ = ["AsyncTwoTier", "TwoTier"]

log = logging.getLogger("ratewarden.stores")
_ONE = 1
CLOSE_WAIT = 5.0  # seconds a closing store tries to send its last hits
CLOSE_RETRY = 0.05  # seconds between its tries


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


class TwoTier(Engine):
    """The sync engine of a `RedisStore`: a daemon thread syncs."""

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
        self.call = call
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
        decide, fast, wake, flush_at = limit.decide, limit.fast(), self.wake, limit.flush_at
        clock_ns = time.time_ns if self.test_clock is None else self.test_clock.time_ns
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
                limit.entries.pop(key, None)

        limit.hit = hit
        return Bound(hit, peek, reset, limit)

    def hit_many(
        self, checks: Sequence[Check], exact_many: Callable[[Sequence[Check]], Decision]
    ) -> Decision:
        return self.drive(self.plan(checks, self.lock), exact_many)

    def drive(
        self,
        plan: Generator[Step, Any, Decision],
        exact_many: Callable[[Sequence[Check]], Decision],
    ) -> Decision:
        try:
            step = next(plan)
            while True:
                if step[0] == EXACT_TIERS:
                    step = plan.send(exact_many(step[1]))  # type: ignore[arg-type]
                    continue
                try:
                    result = self.call(*step)
                except StoreError as exc:
                    step = plan.throw(exc)
                else:
                    step = plan.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(
                target=_run, args=(weakref.ref(self), self.wake, self.settings.sync_interval),
                name="ratewarden-two-tier", daemon=True,
            )  # fmt: skip
            self.thread.start()

    def sync(self) -> None:
        """Sends every key's unsent hits now."""
        for call, chunk in self.batches(self.lock):
            sent_at = time.time_ns()
            try:
                reply = self.call(*call)
            except Exception as exc:  # its hits go back, to be sent again
                reply = exc
            self.synced(chunk, reply, self.lock, sent_at)
        self.trim(self.lock)

    def close(self) -> None:
        """Stops the thread after a last sync."""
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


class AsyncTwoTier(Engine):
    """The asyncio engine of an `AsyncRedisStore`: a task syncs, started by the first
    check in a running loop."""

    def __init__(
        self,
        submit: Callable[[str, int, list[Any]], Any],
        settings: TwoTierSettings,
        breaker: Breaker,
        test_clock: Clock | None,
        keyslot: Callable[[str], int] | None,
        *,
        fallback: LocalFallback,
    ) -> None:
        super().__init__(settings, breaker, test_clock, keyslot, fallback=fallback)
        self.submit = submit
        self.lock = _NoLock()
        self.task: asyncio.Task[None] | None = None
        self.wake: asyncio.Event | None = None

    def bind(
        self,
        algorithm: Algorithm,
        rate: Rate,
        options: BindOptions,
        exact_many: Callable[[Sequence[Check]], Any],
        delete: Callable[[str], Any],
    ) -> AsyncBound:
        limit = self.make(algorithm, rate, options)
        entries, lock, tick_us, now_us = limit.entries, self.lock, limit.tick_us, self.now_us
        decide, fast, flush_at = limit.decide, limit.fast(), limit.flush_at
        clock_ns = time.time_ns if self.test_clock is None else self.test_clock.time_ns

        async def hit(key: str, cost: int = 1) -> Decision:
            if cost is not _ONE:
                check_cost(cost)
            now = (clock_ns() // 1000 + self.offset_us) // tick_us
            entry = entries.get(key)
            if entry is not None:
                decision = fast(entry, now, cost)
                if decision is not None:
                    if entry.delta >= flush_at and self.wake is not None:
                        self.wake.set()
                    return decision
            else:
                entry = self.entry(limit, key)
            self.running()
            decision = decide(entry, now, cost)
            if decision is not None:
                return decision
            return await self.drive(self.one(limit, entry, cost, lock), exact_many)

        async def peek(key: str, cost: int = 1) -> Decision:
            check_cost(cost)
            self.running()
            now = now_us() // tick_us
            entry = self.entry(limit, key)
            if entry.synced < 0 or now - entry.synced > limit.stale:
                await self.sync()
                if entry.synced < 0:  # nothing unsent to sync it with: ask for it
                    await self.drive(self.fetch(limit, entry, lock), exact_many)
                now = now_us() // tick_us
            return peeked(limit, entry, now, cost)

        async def reset(key: str) -> None:
            await delete(limit.prefix + key)
            limit.entries.pop(key, None)

        limit.hit = hit
        return AsyncBound(hit, peek, reset, limit)

    async def hit_many(
        self, checks: Sequence[Check], exact_many: Callable[[Sequence[Check]], Any]
    ) -> Decision:
        self.running()
        return await self.drive(self.plan(checks, self.lock), exact_many)

    async def drive(
        self,
        plan: Generator[Step, Any, Decision],
        exact_many: Callable[[Sequence[Check]], Any],
    ) -> Decision:
        try:
            step = next(plan)
            while True:
                if step[0] == EXACT_TIERS:
                    step = plan.send(await exact_many(step[1]))  # type: ignore[arg-type]
                    continue
                try:
                    result = await self.submit(*step)
                except StoreError as exc:
                    step = plan.throw(exc)
                else:
                    step = plan.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def running(self) -> None:
        """Starts the sync task in this loop, unless it runs there already (a check
        of another loop, or one after the last task ended, starts a new one)."""
        task = self.task
        if self.closed or (
            task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop()
        ):
            return
        self.wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        interval = self.settings.sync_interval
        assert self.wake is not None
        while not self.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), interval)
            self.wake.clear()
            try:
                await self.sync()
            except Exception:  # the task must live on; the next sync tries again
                log.exception("two-tier sync failed")

    async def sync(self) -> None:
        """Sends every key's unsent hits now, every call in one pipeline."""
        batches = self.batches(self.lock)
        if batches:
            sent_at = time.time_ns()
            replies = await asyncio.gather(
                *(self.submit(*call) for call, _ in batches), return_exceptions=True
            )
            for (_, chunk), reply in zip(batches, replies, strict=True):
                self.synced(chunk, reply, self.lock, sent_at)
        self.trim(self.lock)

    async def aclose(self) -> None:
        """Stops the task after a last sync. A sync under way is let finish (cut
        short, the hits it carries would be in flight for good), within a bound."""
        self.closed = True
        task = self.task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            if self.wake is not None:
                self.wake.set()
            await asyncio.wait({task}, timeout=CLOSE_WAIT)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        deadline = time.monotonic() + CLOSE_WAIT
        await self.sync()
        while self.unsent()[0] and time.monotonic() < deadline:  # Redis slow, or down
            await asyncio.sleep(CLOSE_RETRY)
            await self.sync()
        self.unsent_at_close()
