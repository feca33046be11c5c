"""Fixtures for the rule engine tests: an in-memory store on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ratewarden import ConfigurationError, Decision, FakeClock, MemoryStore


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)


def _install_stand_in() -> None:
    """Until ``hit_many`` lands from main, a test-only stand-in with its contract
    (peek every tier; count in all only if all pass). Never used once it exists."""
    from ratewarden import _limiter  # noqa: PLC0415 - this whole function goes with the merge

    if hasattr(_limiter, "hit_many"):
        return

    def pick(decisions: list[Decision]) -> Decision:
        denied = [d for d in decisions if not d.allowed]
        if denied:
            return max(denied, key=lambda d: d.retry_after)
        return min(decisions, key=lambda d: d.remaining / d.limit)

    def hit_many(checks: Sequence[tuple[Any, ...]]) -> Decision:
        if not checks:
            raise ConfigurationError("hit_many needs at least one (limiter, key) to check")
        peeks = [c[0].peek(c[1], *c[2:]) for c in checks]
        if not all(peeks):
            return pick(peeks)
        return pick([c[0].hit(c[1], *c[2:]) for c in checks])

    async def ahit_many(checks: Sequence[tuple[Any, ...]]) -> Decision:
        if not checks:
            raise ConfigurationError("hit_many needs at least one (limiter, key) to check")
        peeks = [await c[0].peek(c[1], *c[2:]) for c in checks]
        if not all(peeks):
            return pick(peeks)
        return pick([await c[0].hit(c[1], *c[2:]) for c in checks])

    _limiter.hit_many = hit_many  # type: ignore[attr-defined]
    _limiter.ahit_many = ahit_many  # type: ignore[attr-defined]


_install_stand_in()
