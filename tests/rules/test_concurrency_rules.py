"""Concurrency rules: ``concurrency: N`` beside or instead of a rate, keyed by
``by``; check-config explains the options that make no sense with it; the
engine's ``acquire`` takes a slot per rule and ``release`` gives it back, on the
memory store and on Redis."""

from __future__ import annotations

import asyncio
import base64
import textwrap
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden import AsyncConcurrencyLimiter, ConcurrencyLimiter
from ratewarden.primitives import ConfigurationError, FakeClock
from ratewarden.rules import (
    AsyncRuleEngine,
    BadToken,
    LeaseGone,
    Problem,
    RuleEngine,
    RuleFileError,
    loads,
)
from ratewarden.rules._holds import parse_token, token_of
from ratewarden.stores import AsyncMemoryStore, MemoryStore
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import RedisServer

RULES = """
rules:
  - name: in-flight
    concurrency: 2
    lease: 10
    by: user
    match: {paths: /api/*}
  - name: per-minute
    rate: 3/minute
    by: user
"""


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(RuleFileError) as info:
        loads(textwrap.dedent(text), "rules.yaml")
    return list(info.value.problems)


def reasons(text: str) -> dict[str, str]:
    return {str(p.field): p.reason for p in problems_of(text)}


@pytest.mark.parametrize("action", ["shadow_ban", "degrade", "queue", "log_only"])
def test_an_action_that_gives_no_slot_is_explained(action: str) -> None:
    said = reasons(f"""
        rules:
          - name: c
            concurrency: 5
            action: {action}
        """)
    assert said["action"].startswith(f"action {action!r} cannot go with 'concurrency'")
    assert "use 'reject'" in said["action"]


def test_the_options_of_a_concurrency_rule_are_checked() -> None:
    said = reasons("""
        rules:
          - name: c
            concurrency: 0
            lease: -1
            group: g
            algorithm: gcra
            cost: 3
          - name: d
            rate: 1/second
            lease: 5
        """)
    assert "1 to 1000000, got 0" in said["concurrency"]
    assert "0.001 to 86400" in said["lease"] or "'lease' goes with" in said["lease"]
    assert "does not compete in a group" in said["group"]
    assert "this rule has no rate" in said["algorithm"]
    assert "'cost' counts against a rate" in said["cost"]
    lease = list(problems_of("""
        rules:
          - name: d
            rate: 1/second
            lease: 5
        """))  # fmt: skip
    assert [(p.rule, p.field) for p in lease] == [("d", "lease")]
    assert "'lease' goes with 'concurrency'" in lease[0].reason


def test_a_rule_needs_a_rate_or_a_concurrency() -> None:
    said = reasons("""
        rules:
          - name: nothing
            by: user
        """)
    assert (
        said["rate"] == "no rate: give one like '100/minute' or a list of them (or 'concurrency')"
    )


def test_delay_waits_for_a_slot_and_needs_max_wait() -> None:
    said = reasons("""
        rules:
          - name: c
            concurrency: 5
            action: delay
            priority_from: {attribute: plan, order: [gold]}
        """)
    assert "needs 'max_wait'" in said["max_wait"]
    assert "priority_from" not in said  # waiters are served by class


def test_a_concurrency_rule_counts_no_rate() -> None:
    ruleset = loads(RULES)
    request = {"path": "/api/x", "user": "u1"}
    assert [a.rule.name for a in ruleset.evaluate(request)] == ["per-minute"]
    assert [(r.name, key, p) for r, key, p in ruleset.holds(request)] == [("in-flight", "u1", 0)]
    assert ruleset.holds({"path": "/other", "user": "u1"}) == []
    assert ruleset.holds({"path": "/api/x"}) == []  # no user: the rule does not apply
    verdicts = {e.rule.name: e.verdict for e in ruleset.explain(request)}
    assert verdicts == {"in-flight": "applies", "per-minute": "applies"}


@pytest.fixture
def engine(store: MemoryStore) -> RuleEngine:
    return RuleEngine(loads(RULES), store)


def test_acquire_holds_a_slot_until_release(engine: RuleEngine) -> None:
    request = {"path": "/api/x", "user": "u1"}
    first, second = engine.acquire(request), engine.acquire(request)
    assert first.allowed
    assert second.allowed
    assert first.token != second.token
    assert first.holds == (("in-flight", "u1"),)
    assert first.lease == 10.0
    third = engine.acquire(request)
    assert not third.allowed
    assert third.token is None
    assert (third.outcome.status, third.outcome.rule and third.outcome.rule.name) == (
        429,
        "in-flight",
    )
    assert third.outcome.retry_after == pytest.approx(10.0)
    assert dict(third.outcome.headers())["Retry-After"] == "10"
    assert engine.acquire({"path": "/api/x", "user": "u2"}).allowed  # another key
    assert first.token is not None
    assert engine.release(first.token) == (("in-flight", "u1"),)
    assert engine.holds.in_flight() == {"in-flight": 2}  # second, and u2's
    assert engine.acquire(request).allowed  # the slot came back (the rate's 3rd)
    assert engine.holds.stats.refused == {"in-flight": 1}


def test_a_refused_rate_gives_the_slot_back(engine: RuleEngine, store: MemoryStore) -> None:
    request = {"path": "/api/x", "user": "u1"}
    for _ in range(3):
        admission = engine.acquire(request)
        assert admission.allowed
        assert admission.token is not None
        engine.release(admission.token)
    over = engine.acquire(request)  # the rate says no: 3/minute
    assert not over.allowed
    assert over.outcome.rule is not None
    assert over.outcome.rule.name == "per-minute"
    assert engine.holds.in_flight() == {"in-flight": 0}
    assert ConcurrencyLimiter(2, store=store, name="in-flight").in_flight("u1") == 0


def test_a_release_of_what_is_not_held_is_said(engine: RuleEngine, clock: FakeClock) -> None:
    request = {"path": "/api/x", "user": "u1"}
    admission = engine.acquire(request)
    assert admission.token is not None
    engine.release(admission.token)
    with pytest.raises(LeaseGone, match="not held: released already") as twice:
        engine.release(admission.token)
    assert not twice.value.expired
    late = engine.acquire(request)
    assert late.token is not None
    clock.advance(10.0)  # the lease ends
    with pytest.raises(LeaseGone, match="its lease had ended") as ended:
        engine.release(late.token)
    assert ended.value.expired
    deep = "x." + base64.urlsafe_b64encode(b"[" * 12_000).decode()[:16_000]
    for bad in ("", "nope", "abc.!!!", "x." + "e30", 42, deep, "x" * 20_000):
        with pytest.raises(BadToken):
            engine.release(bad)  # type: ignore[arg-type]


def test_a_dead_holders_slot_comes_back_with_its_lease(
    engine: RuleEngine, clock: FakeClock
) -> None:
    request = {"path": "/api/x", "user": "u1"}
    engine.acquire(request), engine.acquire(request)
    assert not engine.acquire(request).allowed
    clock.advance(10.0)
    assert engine.acquire(request).allowed
    assert engine.holds.stats.reclaimed == {"in-flight": 2}


def test_delay_waits_for_a_slot_up_to_max_wait(clock: FakeClock) -> None:
    rules = loads("""
        rules:
          - name: c
            concurrency: 1
            lease: 1
            action: delay
            max_wait: 2
        """)
    engine = RuleEngine(rules, MemoryStore(clock=clock))
    assert engine.acquire({}).allowed
    assert not engine.acquire({}).allowed  # without wait: refused at once
    started = clock.time_ns()
    waited = engine.acquire({}, wait=True)  # the first lease ends within max_wait
    assert waited.allowed
    assert 1.0 <= (clock.time_ns() - started) / 1e9 < 1.1
    long = loads("""
        rules:
          - name: c
            concurrency: 1
            lease: 60
            action: delay
            max_wait: 2
        """)
    engine = RuleEngine(long, MemoryStore(clock=clock))
    engine.acquire({})
    started = clock.time_ns()
    refused = engine.acquire({}, wait=True)
    assert not refused.allowed
    assert refused.outcome.status == 429
    assert (clock.time_ns() - started) / 1e9 == pytest.approx(2.0, abs=0.06)
    assert engine.holds.stats.waiting == {"c": 0}


def test_the_async_engine_acquires_and_releases(clock: FakeClock) -> None:
    async def main() -> None:
        engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))
        request = {"path": "/api/x", "user": "u1"}
        held = [await engine.aacquire(request) for _ in range(2)]
        assert all(h.allowed for h in held)
        assert not (await engine.aacquire(request)).allowed
        token = held[0].token
        assert token is not None
        assert await engine.arelease(token) == (("in-flight", "u1"),)
        with pytest.raises(LeaseGone):
            await engine.arelease(token)
        assert (await engine.aacquire(request)).allowed

    asyncio.run(main())


@pytest.fixture
def redis_url(redis_single: RedisServer) -> str:
    return redis_single.url


def test_holds_on_redis_are_shared_with_a_limiter_of_the_rules_name(redis_url: str) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_url) as store:
            engine = AsyncRuleEngine(loads(RULES), store, overrides=False)
            request = {"path": "/api/x", "user": f"redis-{uuid.uuid4().hex}"}
            first = await engine.aacquire(request)
            second = await engine.aacquire(request)
            assert first.allowed
            assert second.allowed
            assert not (await engine.aacquire(request)).allowed
            # the slots live in the store, where the library's limiter reads them
            limiter = AsyncConcurrencyLimiter(2, store=store, name="in-flight")
            assert await limiter.in_flight(request["user"]) == 2
            assert first.token is not None
            assert len(await engine.arelease(first.token)) == 1
            assert await limiter.in_flight(request["user"]) == 1
            with pytest.raises(LeaseGone):
                await engine.arelease(first.token)
            assert (await engine.aacquire(request)).allowed

    asyncio.run(main())


def test_a_rule_without_a_rate_has_none_to_override_or_refuse(store: MemoryStore) -> None:
    rules = loads("""
        rules:
          - name: c
            concurrency: 1
            by: user
            on_failure: fail_closed
        """)
    engine = RuleEngine(rules, store)
    with pytest.raises(ConfigurationError, match="no rate to override"):
        engine.set_override("c", "5/minute", duration=60, reason="test")
    assert engine.unidentified({"path": "/"}).allowed  # counts no rate: nothing to refuse


def test_the_sync_engine_holds_slots_on_redis(redis_url: str) -> None:
    with RedisStore(redis_url) as store:
        engine = RuleEngine(loads(RULES), store, overrides=False)
        request = {"path": "/api/x", "user": f"sync-{uuid.uuid4().hex}"}
        held = [engine.acquire(request) for _ in range(3)]
        assert [h.allowed for h in held] == [True, True, False]
        assert ConcurrencyLimiter(2, store=store, name="in-flight").in_flight(request["user"]) == 2
        for admission in held[:2]:
            assert admission.token is not None
            engine.release(admission.token)
        assert ConcurrencyLimiter(2, store=store, name="in-flight").in_flight(request["user"]) == 0


def test_in_flight_counts_each_slot_until_its_own_lease_ends(
    store: MemoryStore, clock: FakeClock
) -> None:
    rules = loads("""
        rules:
          - name: short
            concurrency: 5
            lease: 1
          - name: long
            concurrency: 5
            lease: 100
        """)
    engine = RuleEngine(rules, store)
    tokens = [engine.acquire({}).token for _ in range(3)]
    assert engine.holds.in_flight() == {"short": 3, "long": 3}
    clock.advance(1.0)
    assert engine.holds.in_flight() == {"short": 0, "long": 3}
    with pytest.raises(LeaseGone, match="short"):  # one slot had ended: said, the other released
        engine.release(tokens[0] or "")
    assert engine.holds.in_flight() == {"short": 0, "long": 2}
    assert ConcurrencyLimiter(5, store=store, name="long").in_flight("") == 2


@given(
    st.text(min_size=1, max_size=30).filter(lambda s: "." not in s),
    st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), min_size=1, max_size=8),
)
def test_a_token_gives_back_the_slots_it_names(lease_id: str, holds: list[tuple[str, str]]) -> None:
    assert parse_token(token_of(lease_id, tuple(holds))) == (lease_id, tuple(holds))


def test_waiters_for_a_slot_are_served_by_their_class_then_first_come() -> None:
    """A holder, then waiters of the classes free, gold, free, gold: as the slot
    comes back it goes to the golds in their order, then the frees in theirs."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    engine = RuleEngine(loads("""
        rules:
          - name: one-at-a-time
            by: user
            concurrency: 1
            action: delay
            max_wait: 10
            priority_from: {attribute: plan, order: [gold, free]}
        """), MemoryStore())  # fmt: skip
    first = engine.acquire({"user": "u", "plan": "free"})
    order: list[int] = []

    def waiter(i: int, plan: str) -> None:
        admission = engine.acquire({"user": "u", "plan": plan}, wait=True)
        assert admission.allowed
        order.append(i)
        time.sleep(0.002)
        assert admission.token is not None
        engine.release(admission.token)

    plans = ["free", "gold", "free", "gold"]
    threads = []
    for i, plan in enumerate(plans):
        threads.append(threading.Thread(target=waiter, args=(i, plan)))
        threads[-1].start()
        deadline = time.monotonic() + 5
        while engine.holds.stats.waiting.get("one-at-a-time", 0) <= i:
            assert time.monotonic() < deadline
            time.sleep(0.001)  # in line before the next comes
    assert first.token is not None
    engine.release(first.token)
    for thread in threads:
        thread.join(20)
    assert order == [1, 3, 0, 2]


RENEWED = """
rules:
  - name: in-flight
    concurrency: 2
    lease: 10
    by: user
"""


async def renewal_story(engine: RuleEngine | AsyncRuleEngine, clock: FakeClock) -> None:
    """Two slots taken; one renewed at 6 s outlives its first lease end (10 s) to
    16 s, the other's ends at 10 s; a renew of an ended lease says so."""

    async def run(method: str, *args: object) -> Any:
        if isinstance(engine, AsyncRuleEngine):
            return await getattr(engine, "a" + method)(*args)
        return getattr(engine, method)(*args)

    request = {"user": f"u-{uuid.uuid4().hex}"}
    kept, lapsed = [await run("acquire", request) for _ in range(2)]
    assert kept.token is not None
    assert lapsed.token is not None
    clock.advance(6.0)
    assert await run("renew", kept.token) == 10.0
    assert engine.holds.in_flight() == {"in-flight": 2}
    clock.advance(5.0)  # 11 s: past the first lease end, before the renewed one
    assert engine.holds.in_flight() == {"in-flight": 1}  # the renewed slot still counts
    with pytest.raises(LeaseGone, match="its lease had ended") as ended:
        await run("renew", lapsed.token)
    assert ended.value.expired
    assert (await run("acquire", request)).allowed  # the lapsed slot is back
    assert not (await run("acquire", request)).allowed  # the renewed one is held
    clock.advance(4.0)  # 15 s: renewed again, pushed to 25 s
    assert await run("renew", kept.token) == 10.0
    clock.advance(9.0)  # 24 s
    assert engine.holds.in_flight() == {"in-flight": 1}
    assert await run("release", kept.token) == (("in-flight", request["user"]),)
    with pytest.raises(LeaseGone, match="released already") as twice:
        await run("renew", kept.token)
    assert not twice.value.expired
    with pytest.raises(BadToken):
        await run("renew", "nope")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_renewed_slot_outlives_its_first_lease(kind: str, clock: FakeClock) -> None:
    engine: RuleEngine | AsyncRuleEngine
    if kind == "sync":
        engine = RuleEngine(loads(RENEWED), MemoryStore(clock=clock))
    else:
        engine = AsyncRuleEngine(loads(RENEWED), AsyncMemoryStore(clock=clock))
    asyncio.run(renewal_story(engine, clock))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_renewed_slot_outlives_its_first_lease_on_redis(kind: str, redis_url: str) -> None:
    clock = FakeClock(1_700_000_000)
    if kind == "sync":
        with RedisStore(redis_url, clock=clock) as store:
            asyncio.run(renewal_story(RuleEngine(loads(RENEWED), store, overrides=False), clock))
        return

    async def main() -> None:
        async with AsyncRedisStore(redis_url, clock=clock) as store:
            await renewal_story(AsyncRuleEngine(loads(RENEWED), store, overrides=False), clock)

    asyncio.run(main())


def test_a_slot_whose_rule_is_gone_is_not_renewed(clock: FakeClock) -> None:
    engine = RuleEngine(loads(RENEWED), MemoryStore(clock=clock))
    token = engine.acquire({"user": "u"}).token
    assert token is not None
    engine.use(loads(RULES.replace("in-flight", "other")))
    with pytest.raises(LeaseGone, match="is not renewed: its rule is no longer in force"):
        engine.renew(token)
    assert engine.release(token) == (("in-flight", "u"),)  # still held: released
