"""What a store does for a reservation (see `ratewarden.Limiter.reserve`): admit an
estimated cost as a hit does, telling which window it was counted in, and later
apply the difference between what was used and that estimate to the key's state
(`ratewarden.algorithms.settle`). One atomic store operation each.

``reserver(store, tier)`` gives a limit's `Reserver` (``tier`` is the `Bound`'s);
``areserver`` an `AsyncReserver`. The memory store applies the pure functions
under its lock; the Redis stores run one script call each
(`ratewarden.stores.redis.reservations`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..algorithms import State
from ..algorithms.settle import Change, settler
from ..primitives import ConfigurationError, Decision, test_switch
from .base import AsyncStore, Store, check_cost
from .memory import AsyncMemoryStore, MemoryStore

__all__ = ["AsyncReserver", "Reserver", "areserver", "reserver"]


class Reserver(Protocol):
    """A limit's reservations in a sync store."""

    def reserve(self, key: str, cost: int) -> tuple[Decision, int]:
        """A hit of ``cost``, and the mark of the window it was counted in."""
        ...

    def settle(self, key: str, delta: int, mark: int, estimate: int) -> None:
        """Apply ``delta`` (actual minus ``estimate``) to the reservation's window."""
        ...


class AsyncReserver(Protocol):
    """`Reserver`, awaited."""

    async def reserve(self, key: str, cost: int) -> tuple[Decision, int]: ...

    async def settle(self, key: str, delta: int, mark: int, estimate: int) -> None: ...


class MemoryReserver:
    """Reservations on the memory store: the pure functions under its lock."""

    def __init__(self, store: MemoryStore, tier: Any) -> None:
        self.store, self.tier = store, tier
        self.step, self.params = tier.step, tier.params
        self.settler = settler(tier.step)
        # under ratewarden's pytest plugin, a block with limiting off counts nothing
        self.switch = test_switch()

    def reserve(self, key: str, cost: int) -> tuple[Decision, int]:
        check_cost(cost)
        step, params, mark = self.step, self.params, self.settler.mark

        def admit(state: State | None, now: int) -> tuple[tuple[Decision, int], State | None]:
            decision, new = step(state, now, cost, params)
            return (decision, mark(new, now, params) if decision.allowed else 0), new

        return self.store.update(self.tier, key, admit)

    def settle(self, key: str, delta: int, mark: int, estimate: int) -> None:
        if self.switch is not None and self.switch.off:
            return
        settle, params = self.settler.settle, self.params
        change = Change(delta, mark, estimate)

        def apply(state: State | None, now: int) -> tuple[None, State | None]:
            return None, settle(state, now, change, params)

        self.store.update(self.tier, key, apply)


class AsyncMemoryReserver:
    """`MemoryReserver` for the asyncio memory store: its calls never block."""

    def __init__(self, store: AsyncMemoryStore, tier: Any) -> None:
        self.sync = MemoryReserver(store.sync, tier)

    async def reserve(self, key: str, cost: int) -> tuple[Decision, int]:
        return self.sync.reserve(key, cost)

    async def settle(self, key: str, delta: int, mark: int, estimate: int) -> None:
        self.sync.settle(key, delta, mark, estimate)


def _reserver(store: object, tier: Any, *, asynchronous: bool) -> Any:
    if isinstance(store, AsyncMemoryStore if asynchronous else MemoryStore):
        return (AsyncMemoryReserver if asynchronous else MemoryReserver)(store, tier)  # type: ignore[arg-type]
    if type(store).__module__.startswith("ratewarden.stores.redis"):
        from .redis import reservations  # noqa: PLC0415

        made = reservations.AsyncRedisReserver if asynchronous else reservations.RedisReserver
        return made(store, reservations.redis_limit(tier, store))
    raise ConfigurationError(
        f"reservations count on the memory store or a Redis store (one limit, no"
        f" two_tier), not {type(store).__name__}"
    )


def reserver(store: Store, tier: Any) -> Reserver:
    """The limit ``tier``'s reservations in ``store``."""
    made: Reserver = _reserver(store, tier, asynchronous=False)
    return made


def areserver(store: AsyncStore, tier: Any) -> AsyncReserver:
    """The limit ``tier``'s reservations in the asyncio ``store``."""
    made: AsyncReserver = _reserver(store, tier, asynchronous=True)
    return made
