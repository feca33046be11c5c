"""`AsyncFleetQuota`: the asyncio twin of `FleetQuota` (a task instead of a
thread; waiting never blocks the event loop)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncContextDecorator, closing, suppress
from typing import Any

from .._clock import Clock
from .._errors import ConfigurationError, StoreUnavailable
from .._waiting import AsyncTurns, check_max_wait, check_priority
from ..stores.redis.connection import connect
from ._shell import LINE, POLL, Line, Shell, check_cost, log
from .config import QuotaConfig
from .coordinator import AsyncCoordinator, QuotaStatus

__all__ = ["AsyncFleetQuota", "AsyncQuotaSlot"]


class AsyncFleetQuota(Line, Shell):
    """The asyncio twin of `FleetQuota`: the same options, a task instead of a
    thread, ``await quota.start()`` or ``async with``; ``acquire`` waits without
    blocking the event loop. ``redis``: a URL or a ``redis.asyncio`` client."""

    def __init__(
        self,
        name: str,
        redis: Any,
        *,
        config: QuotaConfig | str | None = None,
        member_id: str | None = None,
        pace: bool = False,
        clock: Clock | None = None,
        timeout: float = 0.5,
        coordinator_clock: Clock | None = None,
        background: bool = True,
    ) -> None:
        self._setup(
            name,
            redis,
            config=config,
            member_id=member_id,
            pace=pace,
            clock=clock,
            background=background,
        )
        self.client = (
            connect(redis, timeout, asynchronous=True) if isinstance(redis, str) else redis
        )
        self.coordinator = AsyncCoordinator(self.client, name, clock=coordinator_clock)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._line = AsyncTurns(self.clock)

    async def start(self) -> AsyncFleetQuota:
        if self._started:
            return self
        self._started = True
        try:
            if not await self.refresh() and self._member.config is not None:
                await self.coordinator.set(self._member.config)
                await self.refresh()
            if self._member.known is not None:
                await self.refresh()
        except StoreUnavailable as exc:
            log.warning("quota %r: cannot reach the coordinator yet: %s", self.name, exc)
        else:
            if self._member.known is None:
                raise ConfigurationError(
                    f"no quota named {self.name!r} in Redis: create it with"
                    f" `ratewarden quota set {self.name} RATE` or pass config="
                )
        if self.background:
            self._task = asyncio.create_task(self._run(), name=f"ratewarden-quota-{self.name}")
        return self

    async def refresh(self) -> bool:
        member = self._member
        with self._lock:
            wants, has, used, throttled, pieces, restore = member.report()
        sent_at = self.clock.time_ns()
        try:
            reply = await self.coordinator.refresh(
                member.id,
                wants=wants,
                has=has,
                used=used,
                throttled=throttled,
                pieces=pieces,
                restore=restore,
            )
        except StoreUnavailable as exc:
            with self._lock:
                member.on_failure(exc)
            raise
        if reply is None:
            return False
        with self._lock:
            member.on_reply(reply, sent_at)
        return True

    async def _run(self) -> None:
        pubsub = None
        loop = asyncio.get_running_loop()
        due = loop.time() + self._member.next_delay()
        while True:
            if pubsub is None:
                pubsub = await self._subscribe()
            wait = max(0.0, due - loop.time())
            asked = False
            try:
                if pubsub is not None:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=min(wait, POLL)
                    )
                    if message is not None and message.get("type") == "message":
                        with self._lock:
                            asked = self._member.on_message(message["data"])
                else:
                    await asyncio.sleep(min(wait, POLL))
            except asyncio.CancelledError:
                if pubsub is not None:
                    with suppress(Exception):
                        await pubsub.aclose()
                raise
            except Exception as exc:
                log.debug("quota %r: channel lost: %s", self.name, exc)
                with suppress(Exception):
                    await pubsub.aclose()
                pubsub = None
            if asked or loop.time() >= due or self._wake.is_set():
                self._wake.clear()
                try:
                    await self.refresh()
                except StoreUnavailable as exc:
                    log.debug("quota %r: refresh failed: %s", self.name, exc)
                except Exception:
                    log.exception("quota %r: refresh failed", self.name)
                due = loop.time() + self._member.next_delay()

    async def _subscribe(self) -> Any:
        try:
            pubsub = self.client.pubsub()
            await pubsub.subscribe(self.coordinator.channel)
            return pubsub
        except Exception as exc:
            log.debug("quota %r: cannot subscribe: %s", self.name, exc)
            return None

    async def aclose(self) -> None:
        """Leave the resource (its share is free at once) and stop refreshing."""
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with suppress(StoreUnavailable):
            await self.coordinator.leave(self._member.id)
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> AsyncFleetQuota:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def acquire(self, max_wait: float, cost: int = 1, *, priority: int | str = 0) -> None:
        """`FleetQuota.acquire` without blocking the event loop."""
        rank = check_priority(priority)
        line = self._line
        if line.busy(LINE):
            wait = self._asked(max_wait, cost)
        else:
            wait = self._first(max_wait, cost)
            if not wait:
                return
        deadline = self._deadline(max_wait, wait)
        if not await line.wait_turn(LINE, deadline, rank):
            raise self._no_turn(max_wait)
        try:
            wait = self._take(cost)
            if wait:
                with closing(self._waits(wait, self._left(deadline), cost)) as waits:
                    for seconds in waits:
                        line.expire_before(LINE, self.clock.time_ns() + round(seconds * 1e9))
                        await self.clock.asleep(seconds)
        finally:
            line.leave(LINE)

    def slot(self, max_wait: float, cost: int = 1) -> AsyncQuotaSlot:
        check_max_wait(max_wait)
        check_cost(cost)
        return AsyncQuotaSlot(self, max_wait, cost)

    async def status(self) -> QuotaStatus | None:
        return await self.coordinator.show()


class AsyncQuotaSlot(AsyncContextDecorator):
    """The asyncio twin of `QuotaSlot`."""

    def __init__(self, quota: AsyncFleetQuota, max_wait: float, cost: int) -> None:
        self.quota, self.max_wait, self.cost = quota, max_wait, cost

    async def __aenter__(self) -> None:
        await self.quota.acquire(self.max_wait, self.cost)

    async def __aexit__(self, *exc_info: object) -> None:
        return None
