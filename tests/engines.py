"""What the override tests share: the limit an engine's check meets, and a
poll for a condition with a deadline (no sleeping to a boundary)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from ratewarden.rules import RuleEngine


def limit_of(engine: RuleEngine, attributes: dict[str, object]) -> int:
    """The limit in force for a request, as its check's Decision says."""
    decision = engine.check(attributes).decision
    assert decision is not None
    return decision.limit


def within(seconds: float, condition: Callable[[], bool]) -> float:
    """Seconds until ``condition`` held, checked every 5 ms; fails after ``seconds``."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > seconds:
            pytest.fail(f"not within {seconds} s")
        time.sleep(0.005)
    return time.monotonic() - began
