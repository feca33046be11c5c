"""A member without its coordinator: what it logs and admits, what a caller
that gives up is told, and a configuration that differs from the stored one."""

from __future__ import annotations

import logging
import math

import pytest
import redis

from ratewarden import FakeClock, RateLimitTimeout
from ratewarden._errors import StoreUnavailable
from ratewarden.fleet import FleetQuota, QuotaConfig
from ratewarden.fleet.coordinator import Coordinator
from ratewarden.fleet.member import Member
from tests.fleet.members import member
from tests.redis_server import free_port

START = 1_763_900_000.0


def nowhere() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


def quota(url: str, clock: FakeClock, **options: object) -> FleetQuota:
    return FleetQuota(
        "orders",
        url,
        clock=clock,
        background=False,
        timeout=0.2,
        **options,  # type: ignore[arg-type]
    )


def fleet_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ratewarden.fleet"]


def test_a_member_that_never_reached_redis_says_so_and_admits_its_safe_number(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "ratewarden.fleet")
    clock = FakeClock(START)
    config = QuotaConfig("100/second", safe=5)
    with quota(nowhere(), clock, config=config) as q:
        lines = fleet_lines(caplog)
        assert len(lines) == 1
        assert "cannot reach the coordinator" in lines[0]
        assert "safe share, 5 permits a window" in lines[0]
        assert sum(q.try_acquire() for _ in range(10)) == 5
        clock.advance(1.0)
        assert sum(q.try_acquire() for _ in range(10)) == 5


def test_with_an_equal_safe_share_it_admits_nothing_and_the_timeout_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "ratewarden.fleet")
    clock = FakeClock(START)
    with quota(nowhere(), clock, config=QuotaConfig("100/second", refresh=2.0, lease=5.0)) as q:
        assert "nothing is admitted until it answers" in fleet_lines(caplog)[0]
        assert not q.try_acquire()
        with pytest.raises(RateLimitTimeout) as caught:
            q.acquire(max_wait=0)
        message = str(caught.value)
        assert "unreachable since" in message
        assert "never joined" in message
        assert "next in" not in message  # no promise of a permit that is not coming
        assert 1.8 <= caught.value.retry_after <= 2.2  # its next refresh


def test_the_member_logs_once_a_minute_while_unreachable_and_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "ratewarden.fleet")
    clock = FakeClock(START)
    member = Member("orders", clock, member_id="m")
    for _ in range(150):  # 150 s of failed refreshes, one a second
        member.on_failure(StoreUnavailable("connection refused"))
        clock.advance(1.0)
    lines = fleet_lines(caplog)
    assert len(lines) == 3  # at once, after 60 s, after 120 s
    assert "still cannot reach the coordinator, for 60 s" in lines[1]


def test_a_timeout_past_the_deadline_carries_when_the_next_permit_is_due(
    client: redis.Redis, name: str
) -> None:
    clock = FakeClock(START)
    q = member(name, client, clock, "m", config=QuotaConfig("2/second")).start()
    try:
        assert q.try_acquire()
        assert q.try_acquire()
        with pytest.raises(RateLimitTimeout) as caught:
            q.acquire(max_wait=0.1)
        assert "past the deadline" in str(caught.value)
        assert caught.value.retry_after == pytest.approx(1.0)
    finally:
        q.close()


def test_max_wait_none_waits_as_long_as_it_takes(client: redis.Redis, name: str) -> None:
    clock = FakeClock(START)
    q = member(name, client, clock, "m", config=QuotaConfig("1/second")).start()
    try:
        q.acquire(max_wait=None)
        before = clock.time_ns()
        q.acquire(max_wait=None)  # the fake clock's sleep moves it on
        assert (clock.time_ns() - before) / 1e9 == pytest.approx(1.0)
        assert math.isinf(q.slot(None).max_wait)
    finally:
        q.close()


def test_a_config_that_differs_from_the_stored_one_is_said_and_can_win(
    client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "ratewarden.fleet")
    clock = FakeClock(START)
    Coordinator(client, name, clock=clock).set(QuotaConfig("100/second"))
    options = {"clock": clock, "coordinator_clock": clock, "background": False}
    with FleetQuota(name, client, config=QuotaConfig("200/second"), **options):  # type: ignore[arg-type]
        lines = [line for line in fleet_lines(caplog) if "differs" in line]
        assert len(lines) == 1
        assert "200/second" in lines[0]
        assert "100/second" in lines[0]
    assert Coordinator(client, name, clock=clock).show().config.rate.limit == 100  # type: ignore[union-attr]
    with FleetQuota(
        name,
        client,
        config=QuotaConfig("200/second"),
        replace_config=True,
        **options,  # type: ignore[arg-type]
    ):
        pass
    assert Coordinator(client, name, clock=clock).show().config.rate.limit == 200  # type: ignore[union-attr]
