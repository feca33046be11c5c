"""`FleetQuota` and `AsyncFleetQuota`: a share of one provider's limit, spent locally.

The twins only do I/O: a refresh every interval (a thread, or a task), the
resource's channel for changes of the total, and sleeping while a caller waits.
What to send and what a reply means is `_member.Member`'s; spending permits is
`_share.Share`'s. ``acquire`` never touches the network.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from contextlib import AsyncContextDecorator, ContextDecorator, suppress
from typing import Any

from .._clock import Clock, SystemClock
from .._errors import ConfigurationError, RateLimitTimeout, StoreUnavailable
from .._waiting import check_max_wait
from ..stores.redis import connect
from ._config import QuotaConfig
from ._coord import AsyncCoordinator, Coordinator, QuotaStatus
from ._member import Member

__all__ = ["AsyncFleetQuota", "FleetQuota"]

log = logging.getLogger("ratewarden.fleet")

POLL = 0.1  # seconds the refresh loop waits on the channel at most, so close() is prompt


def _config(config: QuotaConfig | str | None) -> QuotaConfig | None:
    if config is None or isinstance(config, QuotaConfig):
        return config
    return QuotaConfig(config)


def _check_cost(cost: int) -> None:
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"cost must be a positive integer, got {cost!r}")


def _timeout(name: str, max_wait: float, wait_ns: int) -> RateLimitTimeout:
    return RateLimitTimeout(
        f"quota {name!r}: no permit within max_wait={max_wait}s (next in {wait_ns / 1e9:.6g}s)",
        key=name,
        retry_after=wait_ns / 1e9,
    )


class _Shell:
    """What the twins share: the member, its lock, and their reprs."""

    _member: Member
    _lock: threading.Lock
    name: str
    clock: Clock

    def try_acquire(self, cost: int = 1) -> bool:
        """One permit (or ``cost``) now, or False: never waits, never raises."""
        share = self._member.share
        with self._lock:
            share.asked += cost
            return not share.take(self.clock.time_ns(), cost)

    def observe(self, status: int) -> None:
        """Tell the quota what the provider answered: a 429 although the member
        kept its share lowers an adaptive total."""
        if status == 429:
            self._member.throttled += 1

    @property
    def grant(self) -> float:
        """Permits a window this member holds now."""
        return self._member.grant

    @property
    def member_id(self) -> str:
        return self._member.id

    def local_status(self) -> dict[str, Any]:
        """This member's view: grant, pending increase, window, permits left."""
        member = self._member
        share = member.share
        with self._lock:
            count, used = share.window_state(self.clock.time_ns())
            pending = share.pending
        return {
            "name": self.name,
            "member": member.id,
            "grant": member.grant,
            "pending": None if pending is None else pending / 1000,
            "window": share.window_ns / 1e9,
            "permits_this_window": count,
            "used_this_window": used,
            "members": member.members,
            "fallen_back": member.fallen_back,
            "refreshes": member.refreshes,
            "failures": member.failures,
            "pace": member.pace,
        }

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} member={self._member.id!r}"
            f" grant={self.grant:g}/window members={self._member.members}>"
        )


class FleetQuota(_Shell):
    """This process's share of resource ``name``, coordinated in Redis.

    ``redis``: a URL (``redis://``, ``redis+cluster://``...) or a ``redis.Redis``
    client (``decode_responses=False``). ``config``: the resource's configuration
    (a `QuotaConfig` or a rate such as ``"2000/second"``), used only if the
    resource does not exist yet; otherwise it must have been created with
    ``ratewarden quota set``. ``pace``: spread the permits of each window evenly
    across it. ``clock``: the member's clock (tests and simulations).

    Joining makes a first refresh at once (`start`, or entering ``with``), then a
    thread refreshes every interval and listens for changes of the total.
    ``acquire`` and ``try_acquire`` decide locally, with no network call.
    """

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
        self.background = background
        self.clock = SystemClock() if clock is None else clock
        self._member = Member(
            name, self.clock, member_id=member_id, pace=pace, config=_config(config)
        )
        self.name = self._member.name
        self._owns_client = isinstance(redis, str)
        self.client = connect(redis, timeout) if isinstance(redis, str) else redis
        self.coordinator = Coordinator(self.client, name, clock=coordinator_clock)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False

    # -- membership -------------------------------------------------------------

    def start(self) -> FleetQuota:
        """Join: one refresh now (creating the resource from ``config`` if it does
        not exist), then the refresh thread. ConfigurationError if the resource
        does not exist and no ``config`` was given."""
        if self._started:
            return self
        self._started = True
        try:
            if not self.refresh() and self._member.config is not None:
                self.coordinator.set(self._member.config)
                self.refresh()
            if self._member.known is not None:
                self.refresh()  # with an equal share's demand, until it is measured
        except StoreUnavailable as exc:  # keep trying in the background
            log.warning("quota %r: cannot reach the coordinator yet: %s", self.name, exc)
        else:
            if self._member.known is None:
                raise ConfigurationError(
                    f"no quota named {self.name!r} in Redis: create it with"
                    f" `ratewarden quota set {self.name} RATE` or pass config="
                )
        if self.background:
            self._thread = threading.Thread(
                target=self._run, name=f"ratewarden-quota-{self.name}", daemon=True
            )
            self._thread.start()
        return self

    def refresh(self) -> bool:
        """Report and take the coordinator's grant now; False if the resource does
        not exist. Raises `StoreUnavailable` when Redis cannot be reached."""
        member = self._member
        with self._lock:
            wants, has, used, throttled, restore = member.report()
        sent_at = self.clock.time_ns()
        try:
            reply = self.coordinator.refresh(
                member.id, wants=wants, has=has, used=used, throttled=throttled, restore=restore
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

    def _run(self) -> None:
        pubsub = None
        due = time.monotonic() + self._member.next_delay()  # start() refreshed already
        while not self._stop.is_set():
            if pubsub is None:
                pubsub = self._subscribe()
            wait = max(0.0, due - time.monotonic())
            asked = False
            try:
                if pubsub is not None:
                    message = pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=min(wait, POLL)
                    )
                    if message is not None and message.get("type") == "message":
                        with self._lock:
                            asked = self._member.on_message(message["data"])
                else:
                    self._stop.wait(min(wait, POLL))
            except Exception as exc:  # a lost subscription: the next turn subscribes again
                log.debug("quota %r: channel lost: %s", self.name, exc)
                with suppress(Exception):
                    pubsub.close()
                pubsub = None
            if self._stop.is_set():
                break
            if asked or time.monotonic() >= due or self._wake.is_set():
                self._wake.clear()
                try:
                    self.refresh()
                except StoreUnavailable as exc:
                    log.debug("quota %r: refresh failed: %s", self.name, exc)
                except Exception:  # never let the thread die: the share would freeze
                    log.exception("quota %r: refresh failed", self.name)
                due = time.monotonic() + self._member.next_delay()
        if pubsub is not None:
            with suppress(Exception):
                pubsub.close()

    def _subscribe(self) -> Any:
        try:
            pubsub = self.client.pubsub()
            pubsub.subscribe(self.coordinator.channel)
            return pubsub
        except Exception as exc:
            log.debug("quota %r: cannot subscribe: %s", self.name, exc)
            return None

    def close(self) -> None:
        """Leave the resource (its share is free at once) and stop refreshing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with suppress(StoreUnavailable):
            self.coordinator.leave(self._member.id)
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> FleetQuota:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- permits ----------------------------------------------------------------

    def acquire(self, max_wait: float, cost: int = 1) -> None:
        """A permit (``cost`` permits), waiting up to ``max_wait`` seconds, else
        `RateLimitTimeout`; ``max_wait=0`` tries once."""
        check_max_wait(max_wait)
        _check_cost(cost)
        clock, share, lock = self.clock, self._member.share, self._lock
        now = clock.time_ns()
        with lock:
            share.asked += cost
            wait = share.take(now, cost)
        if not wait:
            return
        deadline = math.inf if math.isinf(max_wait) else now + round(max_wait * 1e9)
        if now + wait > deadline:
            raise _timeout(self.name, max_wait, wait)
        waiting = share
        with lock:
            waiting.begin_wait(now)
        try:
            while True:
                clock.sleep(wait / 1e9)
                now = clock.time_ns()
                share = self._member.share  # a new window length replaces it
                with lock:
                    wait = share.take(now, cost)
                if not wait:
                    return
                if now + wait > deadline:
                    raise _timeout(self.name, max_wait, wait)
        finally:
            with lock:
                waiting.end_wait(clock.time_ns())

    def slot(self, max_wait: float, cost: int = 1) -> QuotaSlot:
        """`acquire` as a context manager or decorator."""
        check_max_wait(max_wait)
        _check_cost(cost)
        return QuotaSlot(self, max_wait, cost)

    def status(self) -> QuotaStatus | None:
        """The whole resource as the coordinator sees it (one round trip)."""
        return self.coordinator.show()


class AsyncFleetQuota(_Shell):
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
        self.background = background
        self.clock = SystemClock() if clock is None else clock
        self._member = Member(
            name, self.clock, member_id=member_id, pace=pace, config=_config(config)
        )
        self.name = self._member.name
        self._owns_client = isinstance(redis, str)
        self.client = (
            connect(redis, timeout, asynchronous=True) if isinstance(redis, str) else redis
        )
        self.coordinator = AsyncCoordinator(self.client, name, clock=coordinator_clock)
        self._lock = threading.Lock()  # held for microseconds, never across an await
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._wake = asyncio.Event()

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
            wants, has, used, throttled, restore = member.report()
        sent_at = self.clock.time_ns()
        try:
            reply = await self.coordinator.refresh(
                member.id, wants=wants, has=has, used=used, throttled=throttled, restore=restore
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

    async def acquire(self, max_wait: float, cost: int = 1) -> None:
        """`FleetQuota.acquire` without blocking the event loop."""
        check_max_wait(max_wait)
        _check_cost(cost)
        clock, lock = self.clock, self._lock
        now = clock.time_ns()
        share = self._member.share
        with lock:
            share.asked += cost
            wait = share.take(now, cost)
        if not wait:
            return
        deadline = math.inf if math.isinf(max_wait) else now + round(max_wait * 1e9)
        if now + wait > deadline:
            raise _timeout(self.name, max_wait, wait)
        waiting = share
        with lock:
            waiting.begin_wait(now)
        try:
            while True:
                await clock.asleep(wait / 1e9)
                now = clock.time_ns()
                share = self._member.share
                with lock:
                    wait = share.take(now, cost)
                if not wait:
                    return
                if now + wait > deadline:
                    raise _timeout(self.name, max_wait, wait)
        finally:
            with lock:
                waiting.end_wait(clock.time_ns())

    def slot(self, max_wait: float, cost: int = 1) -> AsyncQuotaSlot:
        check_max_wait(max_wait)
        _check_cost(cost)
        return AsyncQuotaSlot(self, max_wait, cost)

    async def status(self) -> QuotaStatus | None:
        return await self.coordinator.show()


class QuotaSlot(ContextDecorator):
    """A permit from a `FleetQuota` on entering (see `FleetQuota.slot`)."""

    def __init__(self, quota: FleetQuota, max_wait: float, cost: int) -> None:
        self.quota, self.max_wait, self.cost = quota, max_wait, cost

    def __enter__(self) -> None:
        self.quota.acquire(self.max_wait, self.cost)

    def __exit__(self, *exc_info: object) -> None:
        return None


class AsyncQuotaSlot(AsyncContextDecorator):
    """The asyncio twin of `QuotaSlot`."""

    def __init__(self, quota: AsyncFleetQuota, max_wait: float, cost: int) -> None:
        self.quota, self.max_wait, self.cost = quota, max_wait, cost

    async def __aenter__(self) -> None:
        await self.quota.acquire(self.max_wait, self.cost)

    async def __aexit__(self, *exc_info: object) -> None:
        return None
