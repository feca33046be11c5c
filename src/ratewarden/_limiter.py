"""`Limiter` and `AsyncLimiter`: twins without copies.

Everything that does no I/O (validating options, naming keys, pricing an
adaptive limit, the steps of ``acquire``) lives once in `LimiterConfig`
(``_limiter_config``), `_Core` and `_waiting.acquiring`; the two classes only
call their store, wait for their turn and sleep their own way. ``hit`` and
``peek`` are the store's bound functions themselves, so a hit costs one Python
call into the store and no more.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncContextDecorator, ContextDecorator
from functools import partial
from typing import Any, NamedTuple, TypeVar, Unpack

from ._adaptive import UNITS, Scale, in_requests
from ._decision import Decision
from ._flow import Flow, adrive, drive
from ._limiter_config import LimiterConfig, LimiterOptions
from ._rate import Rate
from ._reservation import (
    AsyncReservation,
    Learned,
    Reservation,
    check_reservable,
    estimate_for,
)
from ._waiting import (
    Aside,
    AsyncTurns,
    Sleep,
    Turn,
    Turns,
    acquiring,
    asleep_precisely,
    check_max_wait,
    check_spin,
)
from .stores import AsyncMemoryStore, AsyncStore, MemoryStore, Store
from .stores.base import (
    AsyncHitFn,
    AsyncResetFn,
    Check,
    HitFn,
    ResetFn,
)
from .stores.reservations import areserver, reserver

__all__ = [
    "AsyncLimiter",
    "AsyncSlot",
    "Limiter",
    "LimiterOptions",
    "Slot",
    "Tier",
]

T = TypeVar("T")


class Tier(NamedTuple):
    """A limiter's part in a check of several limits in one store call (see
    `Limiter.tier`)."""

    check: Check  # (the store's handle for the limit, key, cost as the store counts it)
    sharded: bool  # True: the limit is split over shards, and `stores.shards` drives its store
    price: int | None  # what a request costs now in units, if adaptive; None for a plain limit
    limits: tuple[
        int, ...
    ]  # an adaptive limit's, in units, as its Decisions carry them: whole and per shard


class _Core:
    """What the twins share: configuration, names, repr, what a multi-limit
    check needs. No I/O here."""

    _config: LimiterConfig
    _limits: tuple[int, int]  # see `LimiterConfig.tier_parts`
    _sharded: bool
    _tier: Any  # the store's handle for this limit, in its checks of several limits
    _scale: Scale | None  # an adaptive limit's price; None for a plain one
    _reserver: Any = None  # the store's reservations of this limit, bound on first use
    # The store's handle when a check of several limits can hand this one to the
    # store as it is (no price to apply, no shards to drive); None otherwise.
    direct: Any
    store: Store | AsyncStore

    @property
    def rate(self) -> Rate:
        return self._config.rate

    @property
    def algorithm(self) -> str:
        return self._config.algorithm.name

    @property
    def name(self) -> str | None:
        """The limiter's name, which its Decisions carry as ``rule``."""
        return self._config.options["rule"]

    @property
    def scale(self) -> Scale | None:
        """An adaptive limit's `Scale` (its factor and price now); None otherwise."""
        return self._scale

    @property
    def effective_limit(self) -> int:
        """The limit in force now, in requests: the rate's limit (the burst for a
        bucket with one), times the load factor when adaptive (at least 1)."""
        scale = self._scale
        if scale is None:
            burst = self._config.options["burst"]
            return self.rate.limit if burst is None else burst
        return self._config.units // scale.unit()

    @property
    def learned(self) -> Learned | None:
        """What the limiter learned of its profiles' costs (``estimates=``); None
        without."""
        return self._config.learned

    def _reserving(
        self, key: str, cost: int | None, profile: str | None, bind: Any, kind: Callable[..., T]
    ) -> Flow[T]:
        """``reserve`` as a flow (see `_flow`): ``bind`` binds the store's
        reservations of this limit on first use, ``kind`` makes the reservation."""
        config = self._config
        estimate, profile = estimate_for(config.learned, cost, profile)
        held = self._reserver
        if held is None:
            check_reservable(config.shards, config.adaptive, config.options.get("two_tier", False))
            held = self._reserver = bind(self.store, self._tier)
        decision, mark = yield partial(held.reserve, key, estimate)
        return kind(held, key, estimate, decision, mark, profile=profile, learned=config.learned)

    @property
    def key_prefix(self) -> str:
        """What this limit puts before every key in its store (in Redis, the key is
        ``key_prefix + key``)."""
        return self._config.options["prefix"]

    def tier(self, key: str, cost: int = 1) -> Tier:
        """``(key, cost)`` as one tier of a check of several limits in one call to
        `store` (`hit_many`, `hit_tiers`): the store's check, at the price of
        the moment for an adaptive limit (then its Decision, in units, is told in
        requests by dividing by ``price``)."""
        scale = self._scale
        if scale is None:
            return Tier((self._tier, key, cost), self._sharded, None, self._limits)
        price = scale.unit()
        return Tier((self._tier, key, cost * price), self._sharded, price, self._limits)

    def __repr__(self) -> str:
        options = self._config.options
        burst_units = options["burst"]
        if burst_units is not None and self._scale is not None:
            burst_units //= UNITS
        burst = "" if burst_units is None else f", burst={burst_units}"
        name = "" if options["rule"] is None else f", name={options['rule']!r}"
        shards = "" if self._config.shards == 1 else f", shards={self._config.shards}"
        scale = "" if self._scale is None else f", effective_limit={self.effective_limit}"
        return (
            f"{type(self).__name__}({str(self.rate)!r}, algorithm={self.algorithm!r}{burst}"
            f"{name}{shards}{scale}, store={self.store!r})"
        )


class Limiter(_Core):
    """Limits ``key``s to ``rate`` with ``algorithm`` (default ``sliding_window_counter``),
    in ``store`` (a fresh `MemoryStore` unless given).

    - ``hit(key, cost=1)`` counts the request if it fits and returns a `Decision`;
    - ``peek(key, cost=1)`` what such a hit would be told, counting nothing;
    - ``reset(key)`` forgets the key;
    - ``acquire(key, max_wait, cost=1)`` waits up to ``max_wait`` seconds for a
      permit, then raises `RateLimitTimeout`; ``max_wait=0`` tries once;
    - ``tier(key, cost=1)`` what a check of several limits in one store call
      (`hit_many`) needs of this one;
    - ``reserve(key, cost=estimate)`` holds a cost known only after the call, to
      ``settle(actual)`` or ``cancel()`` (``profile=`` with ``estimates=`` learns it).

    ``burst`` sets the bucket capacity of token_bucket, leaky_bucket and gcra (default:
    the rate's limit); ``refill="interval"`` makes token_bucket refill once per period.
    ``name`` names the limit in its Decisions and, with the limit itself, prefixes
    its keys in the store: limiters with the same name (or none) and the same limit
    share counters.
    ``on_failure`` says what to answer when the store cannot decide (Redis down):
    ``"raise"`` `StoreUnavailable` (the default), ``"fail_open"`` allow, or
    ``"fail_closed"`` deny, or ``"local_fallback"`` count here, against the limit
    divided by the store's ``instances`` (Redis stores); all but the first mark
    the Decision ``degraded``.
    ``two_tier=True`` (Redis stores) counts in this process and syncs with Redis
    every few milliseconds, asking Redis one check at a time only near the limit:
    far fewer round trips, at the price of a small, bounded over-admission (see
    docs/two-tier.md); the memory store is local already and ignores it.
    ``shards=N`` splits each key's limit into N exact parts in different Redis
    Cluster slots, so that a hot key spreads over the nodes; the key never admits
    more than its limit, and leaves less than N * cost unused (see docs/sharding.md).
    ``promote_at`` (with ``shards``) keeps a key on its own counter until this
    process checks it that many times a second.
    ``classes`` names ``acquire``'s priority classes, highest first
    (``["enterprise", "pro", "free"]``); the last is the default class.
    ``estimates=Estimates(ceiling=...)`` lets ``reserve(key, profile=...)`` reserve
    what that profile's settles used lately (see `Estimates`).
    A cost larger than the limit can ever grant is denied with ``retry_after=inf``.
    """

    hit: HitFn
    peek: HitFn
    reset: ResetFn
    store: Store

    def __init__(
        self, rate: str | Rate, *, store: Store | None = None, **options: Unpack[LimiterOptions]
    ) -> None:
        self._config = config = LimiterConfig.make(rate, **options)
        self.store = MemoryStore() if store is None else store
        self.hit, self.peek, self.reset, self._tier = config.bind(self.store)
        self._scale = scale = config.scale(self.store.clock)
        self._limits, self._sharded = config.tier_parts()
        self.direct = None if scale is not None or self._sharded else self._tier
        if scale is not None:
            self.hit, self.peek = _priced(self.hit, scale), _priced(self.peek, scale)
        self._turns = Turns(self.store.clock)

    def acquire(
        self, key: str, max_wait: float, cost: int = 1, *, priority: int | str = 0
    ) -> Decision:
        """Wait up to ``max_wait`` seconds for a permit; return its (allowed)
        Decision. ``priority``: the caller's class (an int, higher first, or a
        name of the limiter's ``classes``): a waiting caller of a higher class is
        served before lower ones that arrived earlier (see `_waiting`)."""
        turns = self._turns
        flow = acquiring(turns, key, max_wait, priority, self._config.classes)
        try:
            step = next(flow)
            while True:
                if isinstance(step, Turn):
                    step = flow.send(turns.wait_turn(key, step.deadline, step.rank))
                elif isinstance(step, Sleep):
                    self.store.clock.sleep(step.seconds)
                    step = flow.send(None)
                elif isinstance(step, Aside):
                    step = flow.send(turns.step_aside(key, step.deadline))
                else:
                    step = flow.send(self.hit(key, cost))
        except StopIteration as done:
            decision: Decision = done.value
            return decision
        finally:
            flow.close()  # a step that raised: the flow hands the turn on

    def reserve(
        self, key: str, cost: int | None = None, *, profile: str | None = None
    ) -> Reservation:
        """Hold ``cost`` (an estimate; or the learned estimate of ``profile``, see
        `Estimates`) as a hit would, admitted or denied as that hit; then
        ``settle(actual)`` or ``cancel()`` it (see `Reservation`)."""
        return drive(self._reserving(key, cost, profile, reserver, Reservation))

    def slot(self, key: str, max_wait: float, cost: int = 1) -> Slot:
        """`acquire` as a context manager or decorator: ``with limiter.slot(key,
        max_wait=1.0): call()``, or ``@limiter.slot(key, max_wait=1.0)`` on a
        function; every entry (every call) waits for a permit of its own."""
        check_max_wait(max_wait)
        return Slot(self, key, max_wait, cost)


class AsyncLimiter(_Core):
    """The asyncio twin of `Limiter`: the same options, every call awaited, and
    ``acquire`` waits without blocking the event loop. ``spin`` (seconds, on the
    system clock): ``acquire`` sleeps until that long before a permit is due and
    then yields to the loop until it is, because the loop's timers wake up to a
    millisecond late; it costs up to ``spin`` of CPU a permit (0: off)."""

    hit: AsyncHitFn
    peek: AsyncHitFn
    reset: AsyncResetFn
    store: AsyncStore

    def __init__(
        self,
        rate: str | Rate,
        *,
        store: AsyncStore | None = None,
        spin: float = 0.0,
        **options: Unpack[LimiterOptions],
    ) -> None:
        self.spin = check_spin(spin)
        self._config = config = LimiterConfig.make(rate, **options)
        self.store = AsyncMemoryStore() if store is None else store
        self.hit, self.peek, self.reset, self._tier = config.abind(self.store)
        self._scale = scale = config.scale(self.store.clock)
        self._limits, self._sharded = config.tier_parts()
        self.direct = None if scale is not None or self._sharded else self._tier
        if scale is not None:
            self.hit, self.peek = _apriced(self.hit, scale), _apriced(self.peek, scale)
        self._turns = AsyncTurns(self.store.clock)

    async def acquire(
        self, key: str, max_wait: float, cost: int = 1, *, priority: int | str = 0
    ) -> Decision:
        """Wait up to ``max_wait`` seconds for a permit; return its (allowed)
        Decision. ``priority`` as for `Limiter.acquire`."""
        turns = self._turns
        flow = acquiring(turns, key, max_wait, priority, self._config.classes)
        try:
            step = next(flow)
            while True:
                if isinstance(step, Turn):
                    step = flow.send(await turns.wait_turn(key, step.deadline, step.rank))
                elif isinstance(step, Sleep):
                    await asleep_precisely(self.store.clock, step.seconds, self.spin)
                    step = flow.send(None)
                elif isinstance(step, Aside):
                    step = flow.send(await turns.step_aside(key, step.deadline))
                else:
                    step = flow.send(await self.hit(key, cost))
        except StopIteration as done:
            decision: Decision = done.value
            return decision
        finally:
            flow.close()  # a step that raised or was cancelled: the flow hands the turn on

    async def reserve(
        self, key: str, cost: int | None = None, *, profile: str | None = None
    ) -> AsyncReservation:
        """`Limiter.reserve`, awaited."""
        return await adrive(self._reserving(key, cost, profile, areserver, AsyncReservation))

    def slot(self, key: str, max_wait: float, cost: int = 1) -> AsyncSlot:
        """`acquire` as an async context manager or a decorator of coroutine
        functions: ``async with limiter.slot(key, max_wait=1.0): await call()``."""
        check_max_wait(max_wait)
        return AsyncSlot(self, key, max_wait, cost)


def _priced(check: HitFn, scale: Scale) -> HitFn:
    """``check`` (an adaptive limit's hit or peek) charging the price of the
    moment and answering in requests."""
    unit = scale.unit

    def in_units(key: str, cost: int = 1) -> Decision:
        price = unit()
        return in_requests(check(key, cost * price), price)

    return in_units


def _apriced(check: AsyncHitFn, scale: Scale) -> AsyncHitFn:
    """`_priced`, awaited."""
    unit = scale.unit

    async def in_units(key: str, cost: int = 1) -> Decision:
        price = unit()
        return in_requests(await check(key, cost * price), price)

    return in_units


class Slot(ContextDecorator):
    """A permit from a `Limiter` on entering (see `Limiter.slot`); the entry's
    value is the permit's Decision. Leaving gives nothing back: a rate counts
    starts, not calls in flight."""

    def __init__(self, limiter: Limiter, key: str, max_wait: float, cost: int) -> None:
        self.limiter, self.key, self.max_wait, self.cost = limiter, key, max_wait, cost

    def __enter__(self) -> Decision:
        return self.limiter.acquire(self.key, self.max_wait, self.cost)

    def __exit__(self, *exc_info: object) -> None:
        return None


class AsyncSlot(AsyncContextDecorator):
    """The asyncio twin of `Slot` (see `AsyncLimiter.slot`)."""

    def __init__(self, limiter: AsyncLimiter, key: str, max_wait: float, cost: int) -> None:
        self.limiter, self.key, self.max_wait, self.cost = limiter, key, max_wait, cost

    async def __aenter__(self) -> Decision:
        return await self.limiter.acquire(self.key, self.max_wait, self.cost)

    async def __aexit__(self, *exc_info: object) -> None:
        return None
