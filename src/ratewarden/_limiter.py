"""`Limiter` and `AsyncLimiter`: twins without copies.

Everything that does no I/O (validating options, naming keys, planning waits)
lives once in `_Config` and `_waiting`; the two classes only call their store and
sleep their own way. ``hit`` and ``peek`` are the store's bound functions
themselves, so a hit costs one Python call into the store and no more.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._decision import Decision
from ._errors import ConfigurationError
from ._rate import Rate, parse_rate
from ._waiting import AsyncTurns, Turns, check_max_wait, deadline_ns, next_wait, timed_out
from .algorithms import Algorithm, Refill, get_algorithm
from .stores import AsyncMemoryStore, AsyncStore, MemoryStore, Store
from .stores._base import AsyncHitFn, AsyncResetFn, HitFn, ResetFn

__all__ = ["AsyncLimiter", "Limiter"]

DEFAULT_ALGORITHM = "sliding_window_counter"


@dataclass(frozen=True, slots=True)
class _Config:
    rate: Rate
    algorithm: Algorithm
    burst: int | None
    name: str | None
    prefix: str

    @classmethod
    def make(
        cls,
        rate: str | Rate,
        algorithm: str,
        burst: int | None,
        refill: Refill,
        name: str | None,
    ) -> _Config:
        parsed = parse_rate(rate)
        algo = get_algorithm(algorithm, refill=refill)
        if burst is not None:
            if not algo.uses_burst:
                raise ConfigurationError(
                    f"burst applies to token_bucket, leaky_bucket and gcra, not {algorithm!r}"
                )
            if type(burst) is not int or burst < 1:
                raise ConfigurationError(f"burst must be a positive integer, got {burst!r}")
        if name is not None and not isinstance(name, str):
            raise ConfigurationError(f"name must be a string, got {name!r}")
        if name is None:
            # Limiters sharing a store keep apart unless they are the same limit.
            mode = "" if refill == "continuous" else f"/{refill}"
            tag = f"{algo.name}{mode}/{parsed}" + ("" if burst is None else f"/burst={burst}")
            prefix = tag + ":"
        else:
            prefix = f"{name}:" if name else ""
        return cls(parsed, algo, burst, name, prefix)

    def describe(self, cls: str, store: object) -> str:
        burst = "" if self.burst is None else f", burst={self.burst}"
        name = "" if self.name is None else f", name={self.name!r}"
        return (
            f"{cls}({str(self.rate)!r}, algorithm={self.algorithm.name!r}{burst}{name},"
            f" store={store!r})"
        )


class Limiter:
    """Limits ``key``s to ``rate`` with ``algorithm``, in ``store`` (a fresh
    `MemoryStore` unless given).

    - ``hit(key, cost=1)`` counts the request if it fits and returns a `Decision`;
    - ``peek(key, cost=1)`` returns the Decision such a hit would get, counting nothing;
    - ``reset(key)`` forgets the key;
    - ``acquire(key, max_wait, cost=1)`` waits up to ``max_wait`` seconds for a
      permit, then raises `RateLimitTimeout`; ``max_wait=0`` tries once.

    ``burst`` sets the bucket capacity of token_bucket, leaky_bucket and gcra (default:
    the rate's limit); ``refill="interval"`` makes token_bucket refill once per period.
    ``name`` prefixes the keys in the store (default: derived from the limit).
    A cost larger than the limit can ever grant is denied with ``retry_after=inf``.
    """

    hit: HitFn
    peek: HitFn
    reset: ResetFn

    def __init__(
        self,
        rate: str | Rate,
        *,
        algorithm: str = DEFAULT_ALGORITHM,
        burst: int | None = None,
        refill: Refill = "continuous",
        store: Store | None = None,
        name: str | None = None,
    ) -> None:
        self._config = config = _Config.make(rate, algorithm, burst, refill, name)
        self.store: Store = MemoryStore() if store is None else store
        self.hit, self.peek, self.reset = self.store.bind(
            config.algorithm, config.rate, burst=burst, prefix=config.prefix, rule=name
        )
        self._turns = Turns()

    @property
    def rate(self) -> Rate:
        return self._config.rate

    @property
    def algorithm(self) -> str:
        return self._config.algorithm.name

    def acquire(self, key: str, max_wait: float, cost: int = 1) -> Decision:
        """Wait up to ``max_wait`` seconds for a permit; return its (allowed) Decision."""
        check_max_wait(max_wait)
        clock = self.store.clock
        deadline = deadline_ns(clock.time_ns(), max_wait)
        if not self._turns.wait_turn(key, _seconds_left(deadline, clock.time_ns())):
            raise timed_out(key, max_wait)
        try:
            while True:
                decision = self.hit(key, cost)
                if decision.allowed:
                    return decision
                clock.sleep(next_wait(decision, key, clock.time_ns(), deadline, max_wait))
        finally:
            self._turns.leave(key)

    def __repr__(self) -> str:
        return self._config.describe("Limiter", self.store)


class AsyncLimiter:
    """The asyncio twin of `Limiter`: the same options, every call awaited, and
    ``acquire`` waits without blocking the event loop."""

    hit: AsyncHitFn
    peek: AsyncHitFn
    reset: AsyncResetFn

    def __init__(
        self,
        rate: str | Rate,
        *,
        algorithm: str = DEFAULT_ALGORITHM,
        burst: int | None = None,
        refill: Refill = "continuous",
        store: AsyncStore | None = None,
        name: str | None = None,
    ) -> None:
        self._config = config = _Config.make(rate, algorithm, burst, refill, name)
        self.store: AsyncStore = AsyncMemoryStore() if store is None else store
        self.hit, self.peek, self.reset = self.store.bind(
            config.algorithm, config.rate, burst=burst, prefix=config.prefix, rule=name
        )
        self._turns = AsyncTurns()

    @property
    def rate(self) -> Rate:
        return self._config.rate

    @property
    def algorithm(self) -> str:
        return self._config.algorithm.name

    async def acquire(self, key: str, max_wait: float, cost: int = 1) -> Decision:
        """Wait up to ``max_wait`` seconds for a permit; return its (allowed) Decision."""
        check_max_wait(max_wait)
        clock = self.store.clock
        deadline = deadline_ns(clock.time_ns(), max_wait)
        if not await self._turns.wait_turn(key, _seconds_left(deadline, clock.time_ns())):
            raise timed_out(key, max_wait)
        try:
            while True:
                decision = await self.hit(key, cost)
                if decision.allowed:
                    return decision
                await clock.asleep(next_wait(decision, key, clock.time_ns(), deadline, max_wait))
        finally:
            self._turns.leave(key)

    def __repr__(self) -> str:
        return self._config.describe("AsyncLimiter", self.store)


def _seconds_left(deadline: float, now_ns: int) -> float:
    return (deadline - now_ns) / 1e9
