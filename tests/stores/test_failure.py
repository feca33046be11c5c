from __future__ import annotations

import pytest

from ratewarden import ConfigurationError, Limiter, StoreError, StoreUnavailable
from ratewarden.stores.failure import Breaker, fallback


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_failures_in_a_row_and_probes_one_at_a_time() -> None:
    clock = Ticks()
    breaker = Breaker(threshold=2, cooldown=0.25, clock=clock)
    assert breaker.failures == 0
    breaker.failed()
    assert breaker.allow()  # one failure: still closed
    breaker.failed()
    assert not breaker.allow()  # open
    assert breaker.retry_after() == 0.25
    clock.now += 0.25
    assert breaker.allow()  # half-open: this caller probes
    assert not breaker.allow()  # and nobody else meanwhile
    breaker.failed()
    assert not breaker.allow()  # the probe failed: open again
    clock.now += 0.25
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.failures == 0
    assert repr(breaker) == "<Breaker closed, 0 failures in a row>"


def test_policies() -> None:
    error = StoreUnavailable("redis: down")
    opened = fallback("fail_open", 10, "api", 0.2, error)
    assert (opened.allowed, opened.degraded, opened.remaining) == (True, True, 10)
    closed = fallback("fail_closed", 10, "api", 0.2, error)
    assert (closed.allowed, closed.degraded, closed.retry_after) == (False, True, 0.2)
    assert closed.reason == "the store is unavailable and the limit fails closed"
    with pytest.raises(StoreUnavailable, match="down") as info:
        fallback("raise", 10, "api", 0.2, error)
    assert info.value is error
    assert isinstance(info.value, StoreError)


def test_bad_policy_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="on_failure must be one of"):
        Limiter("1/second", on_failure="shrug")  # type: ignore[arg-type]


def test_a_probe_that_never_reports_does_not_wedge_the_breaker() -> None:
    clock = Ticks()
    breaker = Breaker(threshold=2, cooldown=0.25, clock=clock)
    breaker.failed()
    breaker.failed()
    clock.now += 0.25
    assert breaker.allow()  # this probe's caller is cancelled: no succeeded/failed
    assert not breaker.allow()
    clock.now += 0.25
    assert breaker.allow()  # another probe may go
    breaker.succeeded()
    assert breaker.failures == 0
