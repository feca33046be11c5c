# Generated from src/ratewarden/fleet/_aquota.py by scripts/unasync.py:
# edit that file, then run the script.
"""`FleetQuota`: a share of one provider's limit, spent locally.

The shell only does I/O: a refresh every interval on a thread of its own, the
resource's channel for changes of the total, and sleeping while a caller waits.
What to send and what a reply means is `member.Member`'s; spending permits is
`_share.Share`'s; the rest the twins share is `_line.QuotaCore`. ``acquire`` never
touches the network.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from contextlib import ContextDecorator, closing, suppress
from typing import Any

from ..kernel import Turns, check_max_wait, check_priority
from ..primitives import Clock, ConfigurationError, StoreUnavailable
from ..stores.redis.connection import connect
from ._line import LINE, POLL, Line, QuotaCore, check_cost, log
from .config import QuotaConfig
from .coordinator import Coordinator, QuotaStatus

__all__ = ["FleetQuota", "QuotaSlot"]


class FleetQuota(Line, QuotaCore):
    """This process's share of resource ``name``, coordinated in Redis.

    ``redis``: a URL (``redis://``, ``redis+cluster://``...) or a ``redis.Redis``
    client (``decode_responses=False``). ``config``: the resource's configuration
    (a `QuotaConfig` or a rate such as ``"2000/second"``), used only to create
    the resource if it does not exist when a refresh reaches Redis, at start or
    later (Redis may come up after the application); without it, the resource
    must have been created with ``ratewarden quota set``. ``pace``: spread the
    permits of each window evenly across it. ``clock``: the member's clock (tests and simulations).
    ``wants``: a function that gives this member's demand in permits a window,
    asked at each refresh (None from it: what the calls show); see also `demand`.
    ``replace_config``: when the stored configuration differs from ``config``,
    store ``config`` (else the stored one applies, with a warning).

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
        wants: Callable[[], float | None] | None = None,
        replace_config: bool = False,
    ) -> None:
        self._setup(
            name,
            redis,
            config=config,
            member_id=member_id,
            pace=pace,
            clock=clock,
            background=background,
            wants=wants,
            replace_config=replace_config,
        )
        self.client = (
            connect(redis, timeout, asynchronous=False) if isinstance(redis, str) else redis
        )
        self.coordinator = Coordinator(self.client, name, clock=coordinator_clock)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._line = Turns(self.clock)
        self._thread: threading.Thread | None = None

    # who calls, to see it come back (see `_share`): its asyncio thread, else its
    # thread; a sync quota's caller is its thread, which a call holds, and asking
    # asyncio for a thread where no loop runs costs a raised exception a call
    _caller = staticmethod(threading.current_thread)

    # -- membership -------------------------------------------------------------

    def start(self) -> FleetQuota:
        """Join: one refresh now (creating the resource from ``config`` if it does
        not exist), then the refresh thread. ConfigurationError if the resource
        does not exist and no ``config`` was given."""
        if self._started:
            return self
        self._started = True
        try:
            member = self._member
            # a missing resource is created from config= by the refresh itself,
            # now or at whichever later refresh first reaches Redis
            if self.refresh() and member.replace_config and member.config_differs():
                assert member.config is not None
                log.warning(
                    "quota %r: storing config= (%s) in place of the stored one (replace_config)",
                    self.name,
                    member.config.describe(),
                )
                self.coordinator.set(member.config)
                self.refresh()
            if self._member.known is not None:
                self.refresh()  # with an equal share's demand, until it is measured
        except StoreUnavailable:  # logged by the member; keep trying in the background
            pass
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
            report = member.report()
        sent_at = self.clock.time_ns()
        try:
            reply = self.coordinator.report(member.id, report)
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
        try:
            while not self._stop.is_set():
                if pubsub is None:
                    pubsub = self._subscribe()
                wait = min(max(0.0, due - time.monotonic()), POLL)
                asked = False
                try:
                    if pubsub is not None:
                        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
                        asked = self._heard(message)
                    else:
                        self._stop.wait(wait)
                except Exception as exc:  # a lost subscription: the next turn subscribes again
                    log.debug("quota %r: channel lost: %s", self.name, exc)
                    self._unsubscribe(pubsub)
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
        finally:
            self._unsubscribe(pubsub)

    def _subscribe(self) -> Any:
        try:
            pubsub = self.client.pubsub()
            pubsub.subscribe(self.coordinator.channel)
            return pubsub
        except Exception as exc:
            log.debug("quota %r: cannot subscribe: %s", self.name, exc)
            return None

    def _unsubscribe(self, pubsub: Any) -> None:
        if pubsub is not None:
            with suppress(Exception):
                pubsub.close()

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

    def acquire(self, max_wait: float | None, cost: int = 1, *, priority: int | str = 0) -> None:
        """A permit (``cost`` permits), waiting up to ``max_wait`` seconds, else
        `RateLimitTimeout` (its ``retry_after`` says when to ask again);
        ``max_wait=0`` tries once, ``None`` waits as long as it takes. ``priority``: the
        caller's class (an int, higher first): waiting callers stand in one line
        in class order, and only its head waits for the share (see `_line`)."""
        rank = check_priority(priority)
        max_wait = math.inf if max_wait is None else max_wait
        # a call that may not wait shows nothing by its caller coming back: it is
        # counted without its caller's bookkeeping, as `try_acquire`'s
        caller = self._caller() if max_wait else None
        line = self._line
        if line.busy(LINE):  # others wait already: join them in class order, never barge
            wait = self._asked(max_wait, cost, caller)
        else:
            wait = self._first(max_wait, cost, caller)
            if not wait:
                self._done(caller)
                return
        try:
            deadline = self._deadline(max_wait, wait)
            if not line.wait_turn(LINE, deadline, rank):
                raise self._no_turn(max_wait)
            try:
                wait = self._take(cost)
                if wait:
                    with closing(self._waits(wait, self._left(deadline), cost)) as waits:
                        for seconds in waits:
                            line.expire_before(LINE, self.clock.time_ns() + round(seconds * 1e9))
                            self.clock.sleep(seconds)
            finally:
                line.leave(LINE)
        finally:
            self._done(caller)

    def slot(self, max_wait: float | None, cost: int = 1) -> QuotaSlot:
        """`acquire` as a context manager or decorator."""
        max_wait = math.inf if max_wait is None else max_wait
        check_max_wait(max_wait)
        check_cost(cost)
        return QuotaSlot(self, max_wait, cost)

    def status(self) -> QuotaStatus | None:
        """The whole resource as the coordinator sees it (one round trip)."""
        return self.coordinator.show()


class QuotaSlot(ContextDecorator):
    """A permit from the quota on entering (see `FleetQuota.slot`)."""

    def __init__(self, quota: FleetQuota, max_wait: float, cost: int) -> None:
        self.quota, self.max_wait, self.cost = quota, max_wait, cost

    def __enter__(self) -> None:
        self.quota.acquire(self.max_wait, self.cost)

    def __exit__(self, *exc_info: object) -> None:
        return None
