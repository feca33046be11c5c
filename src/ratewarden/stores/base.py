from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Literal, NamedTuple, NotRequired, Protocol, TypeAlias, TypedDict, Unpack

from .._clock import Clock
from .._decision import Decision
from .._errors import ConfigurationError
from .._rate import Rate
from ..algorithms import Algorithm

__all__ = [
    "AsyncBound",
    "AsyncStore",
    "BindOptions",
    "Bound",
    "Check",
    "Store",
    "check_cost",
    "pick",
]

# One tier of a multi-tier check: the tier handle a store's `bind` returned (what it
# is belongs to that store), the key, the cost.
Check: TypeAlias = tuple[Any, str, int]


def check_cost(cost: object) -> None:
    """Every store's check of a request's cost: a positive integer."""
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"cost must be a positive integer, got {cost!r}")


def pick(decisions: Sequence[Decision]) -> Decision:
    """The one Decision that speaks for a multi-tier check. Denied: the denying tier
    with the longest retry_after, since the request passes only once every tier does
    (and a tier that passes at some time passes at every later one, absent other
    traffic). Allowed: the tier with the least room left relative to its size, the
    one a client should pace itself by. Ties go to the earlier tier."""
    chosen = decisions[0]
    for decision in decisions[1:]:
        if chosen.allowed:
            if not decision.allowed or (
                decision.remaining * chosen.limit < chosen.remaining * decision.limit
            ):
                chosen = decision
        elif not decision.allowed and decision.retry_after > chosen.retry_after:
            chosen = decision
    return chosen


# What a limit does when its store cannot decide (see `ratewarden.stores.failure`).
OnFailure = Literal["raise", "fail_open", "fail_closed", "local_fallback"]


class BindOptions(TypedDict):
    """How a limit is bound to a store, beyond its algorithm and rate."""

    burst: int | None  # bucket capacity; None: the rate's limit
    prefix: str  # prepended to every key, so limits sharing a store keep apart
    rule: str | None  # the name Decisions carry
    on_failure: OnFailure  # what to answer when the store cannot decide
    # count locally and sync (the Redis stores; the memory store is local already)
    two_tier: NotRequired[bool]


class HitFn(Protocol):
    def __call__(self, key: str, cost: int = 1) -> Decision: ...


class ResetFn(Protocol):
    def __call__(self, key: str) -> None: ...


class AsyncHitFn(Protocol):
    def __call__(self, key: str, cost: int = 1) -> Awaitable[Decision]: ...


class AsyncResetFn(Protocol):
    def __call__(self, key: str) -> Awaitable[None]: ...


class Bound(NamedTuple):
    """One limit bound to a store: the functions a `Limiter` calls per request, and
    the handle that names the limit in the store's ``hit_many``."""

    hit: HitFn
    peek: HitFn
    reset: ResetFn
    tier: Any


class AsyncBound(NamedTuple):
    hit: AsyncHitFn
    peek: AsyncHitFn
    reset: AsyncResetFn
    tier: Any


class Store(Protocol):
    """A synchronous store. Distinct from `AsyncStore`, so a type checker rejects an
    async store in a sync `Limiter` and the reverse."""

    clock: Clock

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound: ...

    def hit_many(self, checks: Sequence[Check]) -> Decision:
        """Every tier passes and is counted, or none is counted (see `pick`)."""
        ...

    def hit_tiers(
        self, checks: Sequence[Check], shadow: Sequence[Check]
    ) -> tuple[Decision | None, Decision | None]:
        """``hit_many(checks)``, then, if it passed, ``hit_many(shadow)`` (tiers
        that never deny), in one go; None for a side not checked."""
        ...


class AsyncStore(Protocol):
    clock: Clock

    def bind(
        self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]
    ) -> AsyncBound: ...

    def hit_many(self, checks: Sequence[Check]) -> Awaitable[Decision]: ...

    def hit_tiers(
        self, checks: Sequence[Check], shadow: Sequence[Check]
    ) -> Awaitable[tuple[Decision | None, Decision | None]]: ...
