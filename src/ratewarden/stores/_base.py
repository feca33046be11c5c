from __future__ import annotations

from collections.abc import Awaitable
from typing import NamedTuple, Protocol

from .._clock import Clock
from .._decision import Decision
from .._rate import Rate
from ..algorithms import Algorithm

__all__ = ["AsyncBound", "AsyncStore", "Bound", "Store"]


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

    def bind(
        self, algorithm: Algorithm, rate: Rate, *, burst: int | None, prefix: str, rule: str | None
    ) -> Bound: ...


class AsyncStore(Protocol):
    clock: Clock

    def bind(
        self, algorithm: Algorithm, rate: Rate, *, burst: int | None, prefix: str, rule: str | None
    ) -> AsyncBound: ...
