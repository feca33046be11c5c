from __future__ import annotations

from collections.abc import Awaitable
from typing import NamedTuple, Protocol, TypedDict, Unpack

from .._clock import Clock
from .._decision import Decision
from .._errors import ConfigurationError
from .._rate import Rate
from ..algorithms import Algorithm
from ._failure import OnFailure

__all__ = ["AsyncBound", "AsyncStore", "BindOptions", "Bound", "Store", "check_cost"]


def check_cost(cost: object) -> None:
    """Every store's check of a request's cost: a positive integer."""
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"cost must be a positive integer, got {cost!r}")


class BindOptions(TypedDict):
    """How a limit is bound to a store, beyond its algorithm and rate."""

    burst: int | None  # bucket capacity; None: the rate's limit
    prefix: str  # prepended to every key, so limits sharing a store keep apart
    rule: str | None  # the name Decisions carry
    on_failure: OnFailure  # what to answer when the store cannot decide


class HitFn(Protocol):
    def __call__(self, key: str, cost: int = 1) -> Decision: ...


class ResetFn(Protocol):
    def __call__(self, key: str) -> None: ...


class AsyncHitFn(Protocol):
    def __call__(self, key: str, cost: int = 1) -> Awaitable[Decision]: ...


class AsyncResetFn(Protocol):
    def __call__(self, key: str) -> Awaitable[None]: ...


class Bound(NamedTuple):
    """One limit bound to a store: the functions a `Limiter` calls per request."""

    hit: HitFn
    peek: HitFn
    reset: ResetFn


class AsyncBound(NamedTuple):
    hit: AsyncHitFn
    peek: AsyncHitFn
    reset: AsyncResetFn


class Store(Protocol):
    """A synchronous store. Distinct from `AsyncStore`, so a type checker rejects an
    async store in a sync `Limiter` and the reverse."""

    clock: Clock

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound: ...


class AsyncStore(Protocol):
    clock: Clock

    def bind(
        self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]
    ) -> AsyncBound: ...
