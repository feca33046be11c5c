"""Fixtures for the rule engine tests: an in-memory store on a fake clock."""

from __future__ import annotations

import pytest

from ratewarden import FakeClock, MemoryStore


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)
