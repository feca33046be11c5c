"""The two-tier store's I/O: the engine a Redis store keeps for its limits bound
with ``two_tier=True`` (the logic is in `_twotier` and `_twotier_core`). It syncs
every ``sync_interval``, and at once when a key's unsent hits pass ``flush_at``.

The asyncio engine (`_atwotier_io`, written by hand) syncs from a task, started
by the first check in a running loop, and runs on that loop's thread alone: it
takes no lock. Its sync twin (`_twotier_io`, written from it by
scripts/unasync.py) syncs from a daemon thread, and its checks take a lock.
"""

# unasync: twin _twotier_io.py
# unasync: rename asyncio.sleep -> time.sleep

from __future__ import annotations

import asyncio
import contextlib
import logging

# unasync: sync
# import threading
# unasync: end
import time

# unasync: sync
# import weakref
# unasync: end
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

from ...algorithms import Algorithm
from ...primitives import Clock, Decision, Rate, StoreError
from ..base import AsyncBound, BindOptions, Check, check_cost
from ..failure import Breaker, LocalFallback
from ._twotier import TwoTierSettings
from ._twotier_core import EXACT_TIERS, Engine, Step, peeked

__all__ = ["AsyncTwoTier"]

log = logging.getLogger("ratewarden.stores")
_ONE = 1
CLOSE_WAIT = 5.0  # seconds a closing store tries to send its last hits
CLOSE_RETRY = 0.05  # seconds between its tries

# unasync: async


class _NoLock:
    """The lock of an engine that one thread runs: the checks' calls take it, as the
    sync engine's take a real one."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


# unasync: end


class AsyncTwoTier(Engine):
    """The two-tier engine that `AsyncRedisStore` keeps (see the module docstring)."""

    def __init__(
        self,
        call: Callable[[str, int, list[Any]], Awaitable[Any]],
        settings: TwoTierSettings,
        breaker: Breaker,
        test_clock: Clock | None,
        keyslot: Callable[[str], int] | None,
        *,
        fallback: LocalFallback,
    ) -> None:
        super().__init__(settings, breaker, test_clock, keyslot, fallback=fallback)
        self.call = call  # a script call: name, numkeys, keys + arguments
        # unasync: async
        self.lock = _NoLock()
        # the task syncing in the loop of the latest check, and its wake-up
        self.task: asyncio.Task[None] | None = None
        self.wake: asyncio.Event | None = None
        # unasync: sync
        # self.lock = threading.Lock()
        # self.wake = threading.Event()
        # self.thread: threading.Thread | None = None
        # unasync: end

    def bind(
        self,
        algorithm: Algorithm,
        rate: Rate,
        options: BindOptions,
        exact_many: Callable[[Sequence[Check]], Awaitable[Decision]],
        delete: Callable[[str], Awaitable[None]],
    ) -> AsyncBound:
        limit = self.make(algorithm, rate, options)
        entries, lock, tick_us, now_us = limit.entries, self.lock, limit.tick_us, self.now_us
        decide, fast, flush_at = limit.decide, limit.fast(), limit.flush_at
        clock_ns = time.time_ns if self.test_clock is None else self.test_clock.time_ns
        # unasync: sync
        # wake = self.wake
        # self.start()
        # unasync: end

        async def hit(key: str, cost: int = 1) -> Decision:
            if cost is not _ONE:
                check_cost(cost)
            now = (clock_ns() // 1000 + self.offset_us) // tick_us
            # unasync: async
            # one thread: no lock to take (one would add some 40% to this check)
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
            # unasync: sync
            # with lock:
            #     entry = entries.get(key)
            #     if entry is not None:
            #         decision = fast(entry, now, cost)
            #         if decision is not None:
            #             if entry.delta >= flush_at:
            #                 wake.set()
            #             return decision
            #     else:
            #         entry = self.entry(limit, key)
            #     decision = decide(entry, now, cost)
            #     if decision is not None:
            #         return decision
            # unasync: end
            return await self.drive(self.one(limit, entry, cost, lock), exact_many)

        async def peek(key: str, cost: int = 1) -> Decision:
            check_cost(cost)
            # unasync: async
            self.running()
            # unasync: end
            now = now_us() // tick_us
            with lock:
                entry = self.entry(limit, key)
                if entry.synced >= 0 and now - entry.synced <= limit.stale:
                    return peeked(limit, entry, now, cost)
            await self.sync()
            if entry.synced < 0:  # nothing unsent to sync it with: ask for it
                await self.drive(self.fetch(limit, entry, lock), exact_many)
            with lock:
                return peeked(limit, entry, now_us() // tick_us, cost)

        async def reset(key: str) -> None:
            await delete(limit.prefix + key)
            with lock:
                entry = limit.entries.pop(key, None)
                if entry is not None:  # its hits waiting to be sent again are dropped too
                    self.forget(entry)

        limit.hit = hit
        return AsyncBound(hit, peek, reset, limit)

    async def hit_many(
        self, checks: Sequence[Check], exact_many: Callable[[Sequence[Check]], Awaitable[Decision]]
    ) -> Decision:
        # unasync: async
        self.running()
        # unasync: end
        return await self.drive(self.calls(checks, self.lock), exact_many)

    async def drive(
        self,
        calls: Generator[Step, Any, Decision],
        exact_many: Callable[[Sequence[Check]], Awaitable[Decision]],
    ) -> Decision:
        try:
            step = next(calls)
            while True:
                if step[0] == EXACT_TIERS:
                    step = calls.send(await exact_many(step[1]))  # type: ignore[arg-type]
                    continue
                try:
                    result = await self.call(*step)
                except StoreError as exc:
                    step = calls.throw(exc)
                else:
                    step = calls.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    # unasync: async
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
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for can swallow a
            # cancellation that arrives as the wake-up does, and the task lives on
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.wake.wait()
            self.wake.clear()
            try:
                await self.sync()
            except Exception:  # the task must live on; the next sync tries again
                log.exception("two-tier sync failed")

    # unasync: sync
    # def start(self) -> None:
    #     if self.thread is None:
    #         self.thread = threading.Thread(
    #             target=_run,
    #             args=(weakref.ref(self), self.wake, self.settings.sync_interval),
    #             name="ratewarden-two-tier",
    #             daemon=True,
    #         )
    #         self.thread.start()
    # unasync: end

    async def sync(self) -> None:
        """Sends every key's unsent hits now, and those of calls whose reply was
        lost again; a call that fails, in any way, keeps its hits to be sent again
        as they were (`Engine.lost`)."""
        for new in (False, True):  # the calls sent again first, then the new ones
            # unasync: async
            batches = self.batches(self.lock, new=new)
            if not batches:
                continue
            sent_at = time.time_ns()
            try:  # every call in one pipeline
                replies = await asyncio.gather(
                    *(self.call(*batch[0]) for batch in batches), return_exceptions=True
                )
            except asyncio.CancelledError as exc:  # cut short: the calls' replies are lost
                for batch in batches:
                    self.synced(batch, exc, self.lock, sent_at)
                raise
            for batch, reply in zip(batches, replies, strict=True):
                self.synced(batch, reply, self.lock, sent_at)
            # unasync: sync
            # for batch in self.batches(self.lock, new=new):
            #     sent_at = time.time_ns()
            #     try:
            #         reply = self.call(*batch[0])
            #     except Exception as exc:
            #         reply = exc
            #     self.synced(batch, reply, self.lock, sent_at)
            # unasync: end
        self.trim(self.lock)

    async def aclose(self) -> None:
        """Stops the syncing after a last sync. A sync under way is let finish (cut
        short, the hits it carries would be in flight for good), within a bound."""
        self.closed = True
        # unasync: async
        task = self.task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            if self.wake is not None:
                self.wake.set()
            await asyncio.wait({task}, timeout=CLOSE_WAIT)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # unasync: sync
        # self.wake.set()
        # if self.thread is not None:
        #     self.thread.join(timeout=CLOSE_WAIT)
        # unasync: end
        deadline = time.monotonic() + CLOSE_WAIT
        await self.sync()
        while self.unsent()[0] and time.monotonic() < deadline:  # Redis slow, or down
            await asyncio.sleep(CLOSE_RETRY)
            await self.sync()
        self.unsent_at_close()


# unasync: sync
# def _run(engine_ref: weakref.ref[TwoTier], wake: threading.Event, interval: float) -> None:
#     """The sync thread. It holds its engine only while syncing, so a store dropped
#     without `close` is collected (its unsent hits with it) and the thread ends."""
#     while True:
#         wake.wait(interval)
#         wake.clear()
#         engine = engine_ref()
#         if engine is None or engine.closed:
#             return
#         try:
#             engine.sync()
#         except Exception:  # the thread must live on; the next sync tries again
#             log.exception("two-tier sync failed")
#         del engine
# unasync: end
