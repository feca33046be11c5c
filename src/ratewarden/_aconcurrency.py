"""`AsyncConcurrencyLimiter`: `ConcurrencyLimiter` for asyncio (see ``_concurrency``).

Its holds are renewed by one task per limiter, running while it has holds. A
hold gives its slot back when its task is cancelled: inside the block, the
release runs shielded, so a second cancellation does not cut it short; while
it waits for a slot or takes one, a lease the store may have granted is
released in the background. A limiter serves one event loop at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType

from ._concurrency import FIRST_POLL, HELD, LOST, POLL, RELEASED, _Core, _HoldBase
from ._errors import StoreError
from ._waiting import check_max_wait
from .stores import AsyncMemoryStore
from .stores.leases import EXPIRED, OK, AsyncLeaseStore, Op, Outcome

__all__ = ["AsyncConcurrencyLimiter", "AsyncHold"]

log = logging.getLogger("ratewarden.concurrency")


class AsyncHold(_HoldBase):
    """One hold of a slot: ``async with limiter.hold(key) as hold``."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: AsyncConcurrencyLimiter, key: str, max_wait: float) -> None:
        super().__init__(key, limiter._store_key(key), limiter._new_id(), max_wait)
        self._limiter = limiter

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
        if self.state != HELD:
            raise self._limiter._released_twice(self)
        await self._limiter._give(self, quiet=False)


class AsyncConcurrencyLimiter(_Core):
    """`ConcurrencyLimiter` for asyncio: the same options, on an asyncio store."""

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
        self._leases = self.store.leases()
        self._renewer: asyncio.Task[None] | None = None
        self._wakers: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[None]] = set()  # releases of abandoned takes
        self._released = 0  # releases so far: a waiter's cue to look again

    def hold(self, key: str, max_wait: float = 0.0) -> AsyncHold:
        """A hold of a slot of ``key``, taken on entering its ``async with`` block: it
        waits up to ``max_wait`` seconds, then raises `RateLimitTimeout`."""
        check_max_wait(max_wait)
        return AsyncHold(self, key, max_wait)

    async def in_flight(self, key: str) -> int:
        """Holds of ``key`` the store counts now, of every process sharing it."""
        outcome = await self._leases.call("count", self._store_key(key), "", self.limit, 0)
        if outcome.reclaimed:
            self._count("reclaimed", outcome.reclaimed)
        return outcome.held

    async def release(self, key: str, lease_id: str) -> None:
        """Release a lease by its id: `LeaseNotHeld` says why when it is not held."""
        outcome = await self._leases.call("release", self._store_key(key), lease_id, self.limit, 0)
        if outcome.reclaimed:
            self._count("reclaimed", outcome.reclaimed)
        if outcome.status != OK:
            raise self._not_held(key, lease_id, outcome.status, "release")
        self._wake_waiters()

    async def _take(self, hold: AsyncHold) -> None:
        self._first_entry(hold)
        try:
            outcome = self._checked(hold, await self._call("take", hold))
            if outcome.status != OK:
                await self._wait(hold, outcome)
        except asyncio.CancelledError:
            self._abandon(hold)  # the store may have granted it as the task was cancelled
            raise
        hold.state = HELD
        self._live[hold] = time.monotonic()
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())
        self._count("taken")

    async def _call(self, op: Op, hold: AsyncHold) -> Outcome:
        return await self._leases.call(op, hold.store_key, hold.lease_id, self.limit, self.lease_us)

    async def _wait(self, hold: AsyncHold, outcome: Outcome) -> None:
        if hold.max_wait <= 0:
            raise self._timeout(hold.key, hold.max_wait, outcome)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold.max_wait
        pause = FIRST_POLL
        self.stats.waiting += 1
        try:
            while True:
                released = self._released
                outcome = self._checked(hold, await self._call("take", hold))
                if outcome.status == OK:
                    return
                left = deadline - loop.time()
                if left <= 0:
                    raise self._timeout(hold.key, hold.max_wait, outcome)
                if self._released != released:
                    continue  # a slot came back while the take was on its way
                nap = min(left, pause, max(outcome.wait_us / 1e6, FIRST_POLL))
                waker = loop.create_future()
                self._wakers.add(waker)
                timer = loop.call_later(nap, _wake, waker)
                try:
                    await waker
                finally:
                    timer.cancel()
                    self._wakers.discard(waker)
                pause = min(pause * 2, POLL)
        finally:
            self.stats.waiting -= 1

    async def _give(self, hold: AsyncHold, *, quiet: bool) -> None:
        self._live.pop(hold, None)
        hold.state = RELEASED
        # shielded: a cancellation while the release is on its way leaves it to finish
        outcome = await asyncio.shield(self._call("release", hold))
        self._checked(hold, outcome)
        self._wake_waiters()
        if outcome.status != OK:
            self._count("lost")
            error = self._not_held(hold.key, hold.lease_id, outcome.status, "release")
            if not quiet:
                raise error
            log.warning("%s", error)

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

    def _wake_waiters(self) -> None:
        self._released += 1
        for waker in self._wakers:
            _wake(waker)

    async def _renew(self) -> None:
        """The renewing task: renews each hold as it falls due; ends when the
        limiter holds nothing (the next hold starts another)."""
        while True:
            hold, wait = self._renewal_due()
            if hold is None:
                if wait < 0:
                    return
                await asyncio.sleep(wait)
                continue
            assert isinstance(hold, AsyncHold)
            try:
                outcome = self._checked(hold, await self._call("renew", hold))
            except StoreError as exc:  # try again a third of a lease on; two more tries
                log.warning("renewing lease %s of %r: %s", hold.lease_id, hold.key, exc)
                outcome = Outcome(OK, 0, 0, 0)
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
        if self._renewer is not None:
            self._renewer.cancel()

    async def __aenter__(self) -> AsyncConcurrencyLimiter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)
