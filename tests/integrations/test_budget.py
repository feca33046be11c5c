"""A provider's budget, read from its answers' headers, holds calls back until
its reset; a fake clock, so that no test sleeps to a boundary."""

from __future__ import annotations

import pytest

from ratewarden import FakeClock, Limiter, MemoryStore, RateLimitTimeout
from ratewarden.integrations._budget import Budget, read_budget
from ratewarden.integrations._consumer import Pauses

NOW = 1_700_000_000.0


def headers(**given: str) -> dict[str, str]:
    return {name.replace("_", "-").lower(): value for name, value in given.items()}


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ({"RateLimit": '"default";r=7;t=30'}, Budget(7, 30.0, None)),
        # several limits: the one with the least left counts; the policy says the quota
        ({"RateLimit": '"minute";r=7;t=30, "day";r=2;t=3600',
          "RateLimit-Policy": '"minute";q=10;w=60, "day";q=100;w=86400'},
         Budget(2, 3600.0, 10)),
        ({"RateLimit_Remaining": "4", "RateLimit_Reset": "12", "RateLimit_Limit": "50"},
         Budget(4, 12.0, 50)),
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": "5"}, Budget(0, 5.0, None)),
        # a Unix time (GitHub's reset), read as seconds from now
        ({"X_RateLimit_Remaining": "3", "X_RateLimit_Reset": str(int(NOW) + 40),
          "X_RateLimit_Limit": "5000"}, Budget(3, 40.0, 5000)),
        # a reset far away is held to a day
        ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": "999999999"},
         Budget(0, 86400.0, None)),
        ({"X_RateLimit_Remaining": "2", "X_RateLimit_Reset": "1.5"}, Budget(2, 1.5, None)),
        ({"X_RateLimit_Remaining": "lots"}, None),
        ({"X_RateLimit_Remaining": "-1"}, None),
        ({"RateLimit": "garbage;;;"}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_what_a_provider_says_remains(given: dict[str, str], read: Budget | None) -> None:
    assert read_budget(headers(**given).get, NOW) == read


def pauses(clock: FakeClock, max_wait: float = 60.0) -> Pauses:
    return Pauses(clock, max_wait=max_wait)


def test_a_spent_budget_holds_calls_back_until_its_reset_then_the_quota_goes() -> None:
    clock = FakeClock(NOW)
    limiter = Limiter("1000/second", store=MemoryStore(clock=clock))
    p = pauses(clock)
    p.permit(limiter, "api")
    answer = headers(RateLimit='"default";r=2;t=10', RateLimit_Policy='"default";q=3;w=10')
    p.after("api", 200, answer.get)
    p.permit(limiter, "api")
    p.permit(limiter, "api")
    assert clock.now_ns == NOW * 1e9  # two went at once: the two the provider said remain
    p.permit(limiter, "api")  # the third waits for the reset
    assert clock.now_ns / 1e9 - NOW == pytest.approx(10)
    # the new window: its quota, 3, less the 2 sent since the answer (a reset said
    # in whole seconds may come after the window's edge: they may be in the new one)
    p.max_wait = 1.0
    with pytest.raises(RateLimitTimeout, match="longer than max_wait"):
        p.permit(limiter, "api")  # and then the answers of the calls in flight decide


def test_calls_in_flight_count_against_what_an_answer_says() -> None:
    clock = FakeClock(NOW)
    limiter = Limiter("1000/second", store=MemoryStore(clock=clock))
    p = pauses(clock)
    for _ in range(3):
        p.permit(limiter, "api")  # three sent, none answered
    p.after("api", 200, headers(X_RateLimit_Remaining="3", X_RateLimit_Reset="10").get)
    p.permit(limiter, "api")  # 3 said, less the 2 still in flight: one may go
    p.max_wait = 1.0
    with pytest.raises(RateLimitTimeout, match="pause of 10s"):
        p.permit(limiter, "api")


def test_an_older_answer_never_raises_the_budget() -> None:
    clock = FakeClock(NOW)
    limiter = Limiter("1000/second", store=MemoryStore(clock=clock))
    p = pauses(clock, max_wait=0.0)
    p.permit(limiter, "api")
    p.permit(limiter, "api")
    # the second call's answer overtakes the first's
    p.after("api", 200, headers(X_RateLimit_Remaining="0", X_RateLimit_Reset="10").get)
    p.after("api", 200, headers(X_RateLimit_Remaining="1", X_RateLimit_Reset="10").get)
    with pytest.raises(RateLimitTimeout):
        p.permit(limiter, "api")


def test_the_next_windows_answer_replaces_the_budget() -> None:
    """Once the window the budget spoke of has ended, an answer is the new
    window's word: a budget that only ever went down would hold calls back the
    provider has room for."""
    clock = FakeClock(NOW)
    limiter = Limiter("1000/second", store=MemoryStore(clock=clock))
    p = pauses(clock, max_wait=0.0)
    p.permit(limiter, "api")
    p.after("api", 200, headers(X_RateLimit_Remaining="0", X_RateLimit_Reset="1").get)
    clock.advance(1.0)  # the window ended: its budget no longer holds
    p.permit(limiter, "api")
    p.after("api", 200, headers(X_RateLimit_Remaining="5", X_RateLimit_Reset="1").get)
    for _ in range(5):
        p.permit(limiter, "api")
    with pytest.raises(RateLimitTimeout):
        p.permit(limiter, "api")


def test_a_budget_without_a_reset_is_looked_at_again_after_default_pause() -> None:
    clock = FakeClock(NOW)
    limiter = Limiter("1000/second", store=MemoryStore(clock=clock))
    p = pauses(clock)
    p.permit(limiter, "api")
    p.after("api", 200, headers(X_RateLimit_Remaining="0").get)
    p.permit(limiter, "api")  # waits default_pause (1 s), not for good
    assert clock.now_ns / 1e9 - NOW == pytest.approx(1.0)


def test_a_call_that_gets_no_permit_gives_its_share_of_the_budget_back() -> None:
    clock = FakeClock(NOW)
    limiter = Limiter("1/minute", store=MemoryStore(clock=clock))
    p = pauses(clock, max_wait=0.0)
    p.permit(limiter, "api")
    p.after("api", 200, headers(X_RateLimit_Remaining="5", X_RateLimit_Reset="60").get)
    with pytest.raises(RateLimitTimeout):
        p.permit(limiter, "api")  # the local limit says no: nothing was sent
    assert p._left["api"].remaining == 5
    assert p._in_flight.get("api", 0) == 0


def test_the_local_limiter_stays_the_ceiling() -> None:
    clock = FakeClock(NOW)
    limiter = Limiter("2/minute", algorithm="fixed_window", store=MemoryStore(clock=clock))
    p = pauses(clock, max_wait=0.0)
    p.permit(limiter, "api")
    p.after("api", 200, headers(X_RateLimit_Remaining="500", X_RateLimit_Reset="60").get)
    p.permit(limiter, "api")
    with pytest.raises(RateLimitTimeout):
        p.permit(limiter, "api")


def test_a_call_that_fails_on_the_wire_is_no_longer_in_flight() -> None:
    """A transport error after the permit: the call is not left in flight, where
    it would lower every later answer's budget for good."""
    import httpx  # noqa: PLC0415

    from ratewarden.integrations.httpx import RateLimitTransport  # noqa: PLC0415

    def provider(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/down":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, headers={"x-ratelimit-remaining": "5",
                                            "x-ratelimit-reset": "60"})  # fmt: skip

    clock = FakeClock(NOW)
    transport = RateLimitTransport(Limiter("1000/second", store=MemoryStore(clock=clock)),
                                   httpx.MockTransport(provider), max_wait=0.0)  # fmt: skip
    with httpx.Client(transport=transport) as client:
        for _ in range(3):
            with pytest.raises(httpx.ConnectError):
                client.get("https://api.example/down")
        assert client.get("https://api.example/up").status_code == 200
    assert transport.pauses._in_flight.get("api.example", 0) == 0  # forgotten at none
    assert transport.pauses._left["api.example"].remaining == 5


def test_the_keys_kept_are_bounded_whatever_keys_the_calls_bring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ratewarden.integrations import _consumer  # noqa: PLC0415

    monkeypatch.setattr(_consumer, "MAX_KEYS", 50)
    clock = FakeClock(NOW)
    limiter = Limiter("1000000/second", store=MemoryStore(clock=clock))
    p = pauses(clock)
    answer = headers(X_RateLimit_Remaining="5", X_RateLimit_Reset="60", Retry_After="60")
    for i in range(500):  # a key per tenant, say
        p.permit(limiter, f"tenant-{i}")
        p.after(f"tenant-{i}", 429, answer.get)
    assert len(p._left) <= 50
    assert len(p._until) <= 50
    assert len(p._in_flight) == 0
