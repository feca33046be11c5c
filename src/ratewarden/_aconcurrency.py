"""`AsyncConcurrencyLimiter`: at most ``limit`` holds of a key at once, each a
lease (see ``_concurrency_core`` for what leases and waiting mean).

This module is written by hand; its sync twin `ConcurrencyLimiter`
(``_concurrency``) is written from it by scripts/unasync.py: a thread renews
the sync holds, a task the async ones. An async hold gives its slot back when
its task is cancelled: inside the block, the release runs shielded, so a second
cancellation does not cut it short; while it waits for a slot or takes one, a
lease the store may have granted is released in the background. An async
limiter serves one event loop at a time.
"""

# unasync: twin _concurrency.py

from __future__ import annotations

import asyncio
import logging
import threading
import time
from types import TracebackType

from ._concurrency_core import (
    FIRST_POLL,
    HELD,
    LOST,
    POLL,
    RELEASED,
    TICKET_US,
    Core,
    HoldBase,
    check_priority,
)  # fmt: skip
from ._errors import ConfigurationError, StoreError
from ._waiting import check_max_wait
from .stores import AsyncMemoryStore
from .stores.leases import EXPIRED, NO_PLACE, OK, AsyncLeaseStore, Op, Outcome, Place

__all__ = ["AsyncConcurrencyLimiter", "AsyncHold"]

log = logging.getLogger("ratewarden.concurrency")


class AsyncHold(HoldBase):
    """One hold of a slot: ``async with limiter.hold(key) as hold``;
    ``hold.lease_id`` names its lease. Leaving the block releases the slot;
    `release` does it earlier, once."""

    __slots__ = ()
    _limiter: AsyncConcurrencyLimiter

    async def __aenter__(self) -> AsyncHold:
        await self._limiter._take(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state == HELD:
            await self._limiter._give(self, quiet=exc_type is not None)
        elif self.state == LOST and exc_type is None:
            raise self._limiter._not_held(self.key, self.lease_id, EXPIRED, "release")

    async def release(self) -> None:
        """Give the slot back before the block ends; `LeaseNotHeld` if it is not held."""
        if self.state == LOST:  # its lease ended unrenewed (a stalled process): said once
            self.state = RELEASED
            raise self._limiter._not_held(self.key, self.lease_id, EXPIRED, "release")
        if self.state != HELD:
            raise self._limiter._released_twice(self)
        await self._limiter._give(self, quiet=False)


class AsyncConcurrencyLimiter(Core):
    """At most ``limit`` holds of each key at once, across every process that
    shares the ``store`` (a memory store: this process; the Redis store: all).

    ``lease``: seconds a holder that died keeps its slot; a live one renews its
    lease in the background. ``name``: limiters with one name share their slots
    (by default, limiters of one limit do). A store error raises `StoreError`:
    a concurrency limit does not fail open."""

    def __init__(
        self,
        limit: int,
        *,
        store: AsyncLeaseStore | None = None,
        lease: float = 30.0,
        name: str | None = None,
    ) -> None:
        super().__init__(limit, lease, name)
        self.store: AsyncLeaseStore = AsyncMemoryStore() if store is None else store
        if not callable(getattr(self.store, "leases", None)):
            raise ConfigurationError(
                f"{type(self.store).__name__} keeps no lease tables: a concurrency limit needs a"
                " store with leases(), such as the memory or the Redis store"
            )
        self._leases = self.store.leases()
        self._released = 0  # releases so far: a waiter's cue to look again
        # unasync: sync
        # self._closed = threading.Event()
        # unasync: end
        self._per_process()

    def _per_process(self) -> None:
        """What this process's threads and event loop own: made at the start, and
        made anew in a child forked from it (`Core._forked`)."""
        self._lock = threading.Lock()  # guards _live and _renewer (a thread's)
        # unasync: async
        self._renewer: asyncio.Task[None] | None = None
        self._wakers: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[None]] = set()  # releases of abandoned takes
        # unasync: sync
        # self._renewer: threading.Thread | None = None
        # self._wake = threading.Condition()
        # unasync: end

    def _forked(self) -> None:
        super()._forked()
        self._per_process()

    def hold(self, key: str, max_wait: float = 0.0, *, priority: int = 0) -> AsyncHold:
        """A hold of a slot of ``key``, taken on entering its block: it waits up to
        ``max_wait`` seconds, then raises `RateLimitTimeout`. Waiters are served in
        line, across every process sharing the store: higher ``priority`` first,
        then first come."""
        if max_wait or type(max_wait) is not float:  # the default needs no check
            check_max_wait(max_wait)
        if priority:
            check_priority(priority)
        return AsyncHold(self, key, max_wait, priority)

    async def in_flight(self, key: str) -> int:
        """Holds of ``key`` the store counts now, of every process sharing it."""
        outcome = await self._leases.call("count", self._store_key(key), "", self.limit, 0)
        if outcome.reclaimed:
            self._count("reclaimed", outcome.reclaimed)
        return outcome.held

    async def release(self, key: str, lease_id: str) -> None:
        """Release a lease by its id (a hold's ``lease_id``), from anywhere that
        shares the store: `LeaseNotHeld` says why when it is not held."""
        outcome = await self._leases.call("release", self._store_key(key), lease_id, self.limit, 0)
        if outcome.reclaimed:
            self._count("reclaimed", outcome.reclaimed)
        if outcome.status != OK:
            raise self._not_held(key, lease_id, outcome.status, "release")
        self._wake_waiters()

    async def _call(self, op: Op, hold: AsyncHold) -> Outcome:
        place = (
            Place(hold.priority, hold.queued_at, TICKET_US)
            if hold.max_wait > 0
            else NO_PLACE  # it never waits, so it never has a place in line
        )
        return await self._leases.call(
            op, hold.store_key, hold.lease_id, self.limit, self.lease_us, place=place
        )

    async def _take(self, hold: AsyncHold) -> None:
        self._first_entry(hold)
        # unasync: async
        try:
            outcome = self._checked(hold, await self._call("take", hold))
            if outcome.status != OK:
                await self._wait(hold, outcome)
        except asyncio.CancelledError:
            self._abandon(hold)  # the store may have granted it as the task was cancelled
            raise
        # unasync: sync
        # outcome = self._checked(hold, self._call("take", hold))
        # if outcome.status != OK:
        #     self._wait(hold, outcome)
        # unasync: end
        with self._lock:
            hold.state = HELD
            self._live[hold] = time.monotonic()
            # unasync: async
            loop = asyncio.get_running_loop()
            renewer = self._renewer
            # a renewer of a loop that ended (one closed without ending its tasks)
            # renews nothing: this loop gets its own
            if renewer is None or renewer.done() or renewer.get_loop() is not loop:
                self._renewer = loop.create_task(self._renew())
            # unasync: sync
            # # a renewer that ended drops its handle, however it ended (see
            # # _renewing); a forked child's limiters start with none (Core._forked).
            # # The handle is kept once the thread runs: one that failed to start
            # # leaves none, and the next take tries again
            # if self._renewer is None:
            #     renewer = threading.Thread(
            #         target=self._renewing, name=f"ratewarden-leases-{self.name}", daemon=True
            #     )
            #     renewer.start()  # it waits for this lock before it reads the handle
            #     self._renewer = renewer
            # unasync: end
            self.stats.taken += 1

    async def _wait(self, hold: AsyncHold, outcome: Outcome) -> None:
        if hold.max_wait <= 0:
            raise self._timeout(hold.key, hold.max_wait, outcome)
        deadline = time.monotonic() + hold.max_wait
        pause = FIRST_POLL
        with self._lock:
            self.stats.waiting += 1
        try:
            while True:
                hold.queued_at = outcome.queued_at  # its place in line, asking again
                released = self._released
                outcome = self._checked(hold, await self._call("take", hold))
                if outcome.status == OK:
                    hold.queued_at = 0
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    hold.queued_at = outcome.queued_at
                    await self._leave(hold)
                    raise self._timeout(hold.key, hold.max_wait, outcome)
                nap = min(left, pause, max(outcome.wait_us / 1e6, FIRST_POLL))
                await self._nap(released, nap)
                pause = min(pause * 2, POLL)
        finally:
            with self._lock:
                self.stats.waiting -= 1

    async def _leave(self, hold: AsyncHold) -> None:
        """A waiter that gives up takes its ticket out of the line (else the line
        holds its place until the ticket ends)."""
        try:
            await self._call("leave", hold)
        except StoreError as exc:
            log.warning("leaving the line for %r: %s", hold.key, exc)
        self._wake_waiters()  # the next in line may go now

    async def _nap(self, released: int, nap: float) -> None:
        """Sleep ``nap`` seconds, or until a release, unless one came after the
        count ``released`` was read (a slot came back while the take was on its way)."""
        # unasync: async
        if self._released != released:
            return
        loop = asyncio.get_running_loop()
        waker = loop.create_future()
        self._wakers.add(waker)
        timer = loop.call_later(nap, _wake, waker)
        try:
            await waker
        finally:
            timer.cancel()
            self._wakers.discard(waker)
        # unasync: sync
        # with self._wake:
        #     if self._released == released:
        #         self._wake.wait(nap)
        # unasync: end

    async def _give(self, hold: AsyncHold, *, quiet: bool) -> None:
        """Release ``hold``'s slot; raise `LeaseNotHeld` if its lease had ended,
        unless ``quiet`` (an exception is on its way out of the block already)."""
        with self._lock:
            self._live.pop(hold, None)
            hold.state = RELEASED
        # unasync: async
        # shielded: a cancellation while the release is on its way leaves it to finish
        outcome = self._checked(hold, await asyncio.shield(self._call("release", hold)))
        # unasync: sync
        # outcome = self._checked(hold, self._call("release", hold))
        # unasync: end
        self._wake_waiters()
        if outcome.status != OK:
            self._count("lost")
            error = self._not_held(hold.key, hold.lease_id, outcome.status, "release")
            if not quiet:
                raise error
            log.warning("%s", error)

    # unasync: async
    def _abandon(self, hold: AsyncHold) -> None:
        async def release() -> None:
            try:
                await self._call("release", hold)
            except StoreError as exc:  # the lease ends on its own
                log.warning("releasing abandoned lease %s: %s", hold.lease_id, exc)
            self._wake_waiters()

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # unasync: end

    def _wake_waiters(self) -> None:
        if not self.stats.waiting:
            return
        # unasync: async
        self._released += 1
        for waker in self._wakers:
            _wake(waker)
        # unasync: sync
        # with self._wake:
        #     self._released += 1
        #     self._wake.notify_all()
        # unasync: end

    # unasync: sync
    # def _renewing(self) -> None:
    #     """The renewer's thread. Its handle goes as it ends, by an unforeseen
    #     error or `close` too, so that the next hold starts another; a take asks
    #     no more than that, which is cheaper than asking the thread if it lives."""
    #     try:
    #         self._renew()
    #     finally:
    #         with self._lock:
    #             if self._renewer is threading.current_thread():
    #                 self._renewer = None
    # unasync: end

    async def _renew(self) -> None:
        """The renewer: renews each hold as it falls due; ends when the limiter
        has held nothing for `LINGER` (the next hold starts another)."""
        while True:
            with self._lock:
                hold, wait = self._renewal_due()
                if hold is None and wait < 0:
                    self._renewer = None
                    return
            if hold is None:
                # unasync: async
                await asyncio.sleep(wait)
                # unasync: sync
                # if self._closed.wait(wait):
                #     return
                # unasync: end
                continue
            assert isinstance(hold, AsyncHold)
            try:
                outcome = self._checked(hold, await self._call("renew", hold))
            except StoreError as exc:  # tried again a third of a lease on, twice more
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
            log.warning("%s", self._not_held(hold.key, hold.lease_id, outcome.status, "renewal"))

    async def aclose(self) -> None:
        """Stop renewing (holds still held keep their slots until their leases end)."""
        # unasync: async
        if self._renewer is not None:
            self._renewer.cancel()
        # unasync: sync
        # self._closed.set()
        # unasync: end

    async def __aenter__(self) -> AsyncConcurrencyLimiter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


# unasync: async
def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


# unasync: end
