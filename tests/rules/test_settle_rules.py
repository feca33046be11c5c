"""Hits settled after the request ran: ``count: {status: [...]}`` counts a request
only when its response's status says so, ``settle: true`` charges the actual cost
of an estimate; one token and one ``settle`` for both (`ratewarden.rules._settle`),
on the memory store and Redis, sync and async; check-config refuses what cannot
be settled."""

from __future__ import annotations

import asyncio
import textwrap
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratewarden import Limiter
from ratewarden.primitives import FakeClock
from ratewarden.rules import (
    AsyncRuleEngine,
    BadSettle,
    BadSettleToken,
    Problem,
    RuleEngine,
    RuleFileError,
    SettleRefused,
    loads,
)
from ratewarden.stores import AsyncMemoryStore, MemoryStore
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import RedisServer

LOGIN = """
rules:
  - name: login-failures
    rate: 5/minute
    algorithm: {algorithm}
    by: ip
    match: {{paths: /login}}
    count: {{status: [401, 403]}}
"""
ALGORITHMS = [
    "fixed_window", "sliding_window_counter", "sliding_window_log", "token_bucket",
    "leaky_bucket", "gcra",
]  # fmt: skip
REQUEST = {"path": "/login", "method": "POST", "ip": "192.0.2.7"}


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(RuleFileError) as info:
        loads(textwrap.dedent(text), "rules.yaml")
    return list(info.value.problems)


def reasons(text: str) -> list[str]:
    return [f"{p.rule}.{p.field}: {p.reason}" for p in problems_of(text)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


def login_engine(clock: FakeClock, algorithm: str = "fixed_window") -> RuleEngine:
    return RuleEngine(loads(LOGIN.format(algorithm=algorithm)), MemoryStore(clock=clock))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_only_the_failures_count_on_every_algorithm(clock: FakeClock, algorithm: str) -> None:
    engine = login_engine(clock, algorithm)
    for _ in range(20):  # twenty good logins: each given back once its 200 is known
        outcome = engine.check(REQUEST)
        assert outcome.allowed
        assert outcome.settle is not None
        settled = engine.settle(outcome.settle, status=200)
        assert settled.changes == (("login-failures", "192.0.2.7", -1),)
    for _ in range(5):
        outcome = engine.check(REQUEST)
        assert outcome.allowed
        assert outcome.settle is not None
        assert engine.settle(outcome.settle, status=401).changes[0][2] == 0
    refused = engine.check(REQUEST)  # refused before it runs: the limit is full
    assert not refused.allowed
    assert refused.status == 429
    assert refused.settle is None


def test_an_unsettled_request_stays_counted(clock: FakeClock) -> None:
    engine = login_engine(clock)
    for _ in range(5):
        assert engine.check(REQUEST).allowed  # never settled: the response is unknown
    assert not engine.check(REQUEST).allowed


def test_not_status_and_ranges_count_all_but_the_listed(clock: FakeClock) -> None:
    engine = RuleEngine(
        loads("""
            rules:
              - name: errors
                rate: 3/minute
                algorithm: fixed_window
                count: {not_status: ["200-299", 304]}
            """),
        MemoryStore(clock=clock),
    )
    for status in (200, 204, 299, 304, 200):
        outcome = engine.check({"path": "/"})
        assert outcome.settle is not None
        assert engine.settle(outcome.settle, status=status).refunded == 1
    for status in (500, 404, 301):
        outcome = engine.check({"path": "/"})
        assert outcome.settle is not None
        assert engine.settle(outcome.settle, status=status).refunded == 0
    assert not engine.check({"path": "/"}).allowed


def test_a_request_refused_by_another_rule_counts_nowhere(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    engine = RuleEngine(
        loads("""
            rules:
              - name: failures
                rate: 5/minute
                algorithm: fixed_window
                count: {status: [401]}
              - name: all
                rate: 2/minute
                algorithm: fixed_window
            """),
        store,
    )
    failures = Limiter("5/minute", store=store, algorithm="fixed_window", name="failures")
    assert engine.check({"path": "/"}).allowed
    assert engine.check({"path": "/"}).allowed
    for _ in range(10):  # refused by "all": the failure it reserved goes back each time
        refused = engine.check({"path": "/"})
        assert not refused.allowed
        assert refused.decision is not None
        assert refused.decision.rule == "all"
        assert refused.settle is None
    assert failures.peek("").remaining == 3  # the two allowed, never settled


def test_a_full_settled_rule_counts_nothing_in_the_others(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    engine = RuleEngine(
        loads("""
            rules:
              - name: failures
                rate: 1/minute
                algorithm: fixed_window
                count: {status: [401]}
              - name: all
                rate: 100/minute
                algorithm: fixed_window
            """),
        store,
    )
    assert engine.check({"path": "/"}).allowed  # never settled: the failure stays
    for _ in range(5):
        refused = engine.check({"path": "/"})
        assert not refused.allowed
        assert refused.decision is not None
        assert refused.decision.rule == "failures"
    every = Limiter("100/minute", store=store, algorithm="fixed_window", name="all")
    assert every.peek("").remaining == 99  # the first request only


def test_settle_corrects_an_estimate_to_the_actual_cost(clock: FakeClock) -> None:
    engine = RuleEngine(
        loads("""
            rules:
              - name: tokens
                rate: 1000/minute
                algorithm: fixed_window
                by: user
                cost: 2
                settle: true
            """),
        MemoryStore(clock=clock),
    )
    request = {"path": "/chat", "user": "ann"}
    outcome = engine.check(request, cost=100)  # an estimate of 100, twice: 200
    assert outcome.decision is not None
    assert outcome.decision.remaining == 800
    assert outcome.settle is not None
    settled = engine.settle(outcome.settle, cost=30)
    assert settled.changes == (("tokens", "ann", -140),)
    outcome = engine.check(request, cost=10)
    assert outcome.decision is not None
    assert outcome.decision.remaining == 1000 - 60 - 20
    assert outcome.settle is not None
    assert engine.settle(outcome.settle, cost=300).charged == 580
    assert engine.check(request).decision.remaining == 1000 - 60 - 600 - 2  # type: ignore[union-attr]


def test_a_token_settles_once(clock: FakeClock) -> None:
    engine = login_engine(clock)
    token = engine.check(REQUEST).settle
    assert token is not None
    engine.settle(token, status=200)
    with pytest.raises(SettleRefused, match="settled already") as info:
        engine.settle(token, status=200)
    assert info.value.reason == "settled"
    assert engine.check(REQUEST).decision.remaining == 4  # type: ignore[union-attr]


def test_a_token_expires_and_its_hits_stay(clock: FakeClock) -> None:
    engine = login_engine(clock)
    engine.settles.within = 30
    token = engine.check(REQUEST).settle
    clock.advance(31)
    with pytest.raises(SettleRefused, match="expired") as info:
        engine.settle(token, status=200)  # type: ignore[arg-type]
    assert info.value.reason == "expired"


def test_tokens_that_were_never_handed_out_are_refused(clock: FakeClock) -> None:
    engine = login_engine(clock)
    token = engine.check(REQUEST).settle
    assert token is not None
    other = login_engine(clock)  # its own secret
    with pytest.raises(BadSettleToken, match="not one a check here answered"):
        other.settle(token, status=200)
    body, _, signature = token.partition(".")
    forged = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + signature
    for bad in (forged, "", "x" * 20_000, "no-dot", "a.b", 42):
        with pytest.raises(BadSettleToken):
            engine.settle(bad, status=200)  # type: ignore[arg-type]
    other.settles.secret = engine.settles.secret  # processes given one secret share tokens
    assert other.settle(token, status=200).refunded == 1


def test_what_a_settle_says_is_checked(clock: FakeClock) -> None:
    engine = login_engine(clock)
    token = engine.check(REQUEST).settle
    assert token is not None
    for kwargs, match in (
        ({}, "status"),
        ({"status": 99}, "100 to 599"),
        ({"status": True}, "100 to 599"),
        ({"cost": -1}, ">= 0"),
        ({"status": 200, "cost": 3}, "settle: true"),
    ):
        with pytest.raises(BadSettle, match=match):
            engine.settle(token, **kwargs)
    assert engine.settle(token, status=403).changes[0][2] == 0  # nothing was spent by those


def test_a_rule_that_does_not_settle_hands_out_no_token(clock: FakeClock) -> None:
    engine = RuleEngine(loads("rules: [{name: r, rate: 5/minute}]"), MemoryStore(clock=clock))
    assert engine.check({"path": "/"}).settle is None


def test_a_token_outlives_a_reload_that_removed_its_rule(clock: FakeClock) -> None:
    engine = login_engine(clock)
    token = engine.check(REQUEST).settle
    engine.use(loads("rules: [{name: other, rate: 5/minute}]"))
    assert engine.settle(token, status=200).changes == ()  # type: ignore[arg-type]


def test_the_async_engine_settles_the_same_way(clock: FakeClock) -> None:
    async def main() -> None:
        rules = loads(LOGIN.format(algorithm="sliding_window_log"))
        engine = AsyncRuleEngine(rules, AsyncMemoryStore(clock=clock))
        for status in [200] * 7 + [401] * 5:
            outcome = await engine.acheck(REQUEST)
            assert outcome.allowed
            assert outcome.settle is not None
            await engine.asettle(outcome.settle, status=status)
            last = outcome.settle
        assert not (await engine.acheck(REQUEST)).allowed
        with pytest.raises(SettleRefused):
            await engine.asettle(last, status=200)

    asyncio.run(main())


@pytest.fixture
def redis_url(redis_single: RedisServer) -> str:
    return redis_single.url


def test_the_sync_engine_settles_on_redis(redis_url: str) -> None:
    with RedisStore(redis_url) as store:
        engine = RuleEngine(loads(LOGIN.format(algorithm="sliding_window_log")), store,
                            overrides=False)  # fmt: skip
        request = {**REQUEST, "ip": f"sync-{uuid.uuid4().hex}"}
        tokens = []
        for status in [200] * 6 + [401] * 5:
            outcome = engine.check(request)
            assert outcome.allowed
            assert outcome.settle is not None
            engine.settle(outcome.settle, status=status)
            tokens.append(outcome.settle)
        assert not engine.check(request).allowed
        # another process on the store, given the same secret: the settle is known there
        other = RuleEngine(engine.ruleset, store, overrides=False)
        other.settles.secret = engine.settles.secret
        with pytest.raises(SettleRefused, match="settled already"):
            other.settle(tokens[0], status=200)


@pytest.mark.parametrize("algorithm", ["fixed_window", "gcra", "sliding_window_counter"])
def test_the_async_engine_settles_on_redis(redis_url: str, algorithm: str) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_url) as store:
            rules = loads(LOGIN.format(algorithm=algorithm))
            engine = AsyncRuleEngine(rules, store, overrides=False)
            request = {**REQUEST, "ip": f"async-{uuid.uuid4().hex}"}
            for status in [200] * 6 + [401] * 5:
                outcome = await engine.acheck(request)
                assert outcome.allowed
                assert outcome.settle is not None
                await engine.asettle(outcome.settle, status=status)
                last = outcome.settle
            assert not (await engine.acheck(request)).allowed
            with pytest.raises(SettleRefused):
                await engine.asettle(last, status=200)

    asyncio.run(main())


# -- check-config -----------------------------------------------------------------


@pytest.mark.parametrize("action", ["log_only", "queue", "degrade"])
def test_an_action_whose_hit_is_no_count_cannot_settle(action: str) -> None:
    said = reasons(f"""
        rules:
          - name: r
            rate: 5/minute
            action: {action}
            count: {{status: [401]}}
        """)
    assert any(f"cannot have action {action!r}" in r and r.startswith("r.count") for r in said)


@pytest.mark.parametrize(
    ("option", "named"),
    [("shards: 4", "shards"), ("store: two_tier", "store: two_tier"),
     ("adaptive: {signal: cpu, good: 0.5, bad: 0.9}", "adaptive")],
)  # fmt: skip
def test_a_limit_that_is_not_one_state_cannot_settle(option: str, named: str) -> None:
    said = reasons(f"""
        rules:
          - name: r
            rate: 5/minute
            algorithm: fixed_window
            {option}
            settle: true
        """)
    assert (
        f"r.settle: a rule that settles a request's cost after it ran gives hits back in one"
        f" key's state, in one store call; {named} cannot: leave it out, or the settle out" in said
    )


def test_the_statuses_of_count_are_checked() -> None:
    said = reasons("""
        rules:
          - name: a
            rate: 5/minute
            count: {status: [401], not_status: [200]}
          - name: b
            rate: 5/minute
            count: {}
          - name: c
            rate: 5/minute
            count: {status: [700]}
          - name: d
            rate: 5/minute
            count: {status: ["5xx"]}
          - name: e
            concurrency: 5
            count: {status: [401]}
        """)
    assert [r.split(":")[0] for r in said] == ["a.count", "b.count", "c.count", "d.count",
                                               "e.count"]  # fmt: skip
    assert said[0].startswith("a.count: 'count' takes one of 'status'")
    assert (
        said[2] == "c.count: count.status: 700 is not a status from 100 to 599 (a range low-high)"
    )
    assert "'5xx' is not a status or a range" in said[3]
    assert (
        said[4]
        == "e.count: this rule counts a request by its response, and has no rate to count it in"
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 7.0, 31.0, 60.0]),
                  st.sampled_from([200, 204, 401, 403, 500])),
        max_size=60,
    )
)  # fmt: skip
def test_the_engine_counts_failures_as_a_naive_model_does(
    steps: list[tuple[float, int]],
) -> None:
    """Fixed windows of a minute, each request settled at once: allowed while the
    window's failures (and nothing else) are under the limit."""
    clock = FakeClock(1_000_020.0)
    engine = login_engine(clock)
    failures: dict[int, int] = {}
    for pause, status in steps:
        clock.advance(pause)
        window = clock.time_ns() // 60_000_000_000
        outcome = engine.check(REQUEST)
        assert outcome.allowed == (failures.get(window, 0) < 5)
        if outcome.allowed:
            assert outcome.settle is not None
            engine.settle(outcome.settle, status=status)
            if status in (401, 403):
                failures[window] = failures.get(window, 0) + 1
