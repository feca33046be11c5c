from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ratewarden import (
    AsyncLimiter,
    ConfigurationError,
    FakeClock,
    Limiter,
    RateLimitTimeout,
    StoreError,
    StoreUnavailable,
    hit_many,
)
from ratewarden.rules import RuleEngine, loads
from ratewarden.stores.failure import OnFailure
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import LIVE, RedisCluster, RedisServer, free_port, redis_sentinel


def name() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def record_script_calls(store: RedisStore) -> list[str]:
    """The names of the scripts the store runs from now on, in order."""
    calls: list[str] = []
    real_call = store.scripts.call

    def recording(name: str, numkeys: int, args: list[Any]) -> Any:
        calls.append(name)
        return real_call(name, numkeys, args)

    store.scripts.call = recording  # type: ignore[method-assign]
    return calls


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    """Everything a test opens (stores, clients) is closed when it ends: a socket left
    for the garbage collector warns at some later, random moment."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.mark.parametrize(
    "algorithm",
    ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket",
     "leaky_bucket", "gcra"],
)  # fmt: skip
def test_limits_with_server_time(
    redis_single: RedisServer, algorithm: str, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    limiter = Limiter("5/hour", algorithm=algorithm, store=store, name=name())
    decisions = [limiter.hit("user:1") for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert decisions[4].remaining == 0
    assert decisions[5].retry_after > 0
    assert limiter.peek("user:1").remaining == 0
    assert limiter.hit("user:2").allowed  # keys apart
    limiter.reset("user:1")
    assert limiter.hit("user:1").remaining == 4


def test_a_test_clock_drives_it_exactly(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    clock = FakeClock(1_700_000_000)
    store = RedisStore(closing.enter_context(redis_single.client()), clock=clock)
    limiter = Limiter("2/second", algorithm="token_bucket", store=store, name=name())
    assert limiter.hit("k", 2).allowed
    denied = limiter.hit("k")
    assert denied.retry_after == 0.5
    start = clock.now_ns
    assert limiter.acquire("k", max_wait=1.0).allowed
    assert clock.now_ns - start == 500_000_000
    with pytest.raises(RateLimitTimeout):
        limiter.acquire("k", max_wait=0.1)
    assert limiter.hit("k", 3).retry_after == math.inf


def test_keys_expire_once_full(redis_single: RedisServer, closing: contextlib.ExitStack) -> None:
    client = closing.enter_context(redis_single.client())
    tag = name()
    limiter = Limiter("10/minute", algorithm="fixed_window", store=RedisStore(client), name=tag)
    limiter.hit("k")
    ttl = client.pttl(limiter.key_prefix + "k")
    assert 0 < ttl <= 60_000 + 1  # the window's end, at most a minute away
    bucket = Limiter("10/second", algorithm="gcra", store=RedisStore(client), name=tag + "b")
    bucket.hit("k")
    assert 0 < client.pttl(bucket.key_prefix + "k") <= 100 + 1  # one token's worth: 100 ms


def test_scripts_reload_after_a_flush(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    client = closing.enter_context(redis_single.client())
    limiter = Limiter("5/hour", store=RedisStore(client), name=name())
    assert limiter.hit("k").allowed
    client.script_flush()
    assert limiter.hit("k").remaining == 3  # NOSCRIPT: loaded again, nothing lost


def dead_store() -> RedisStore:
    return RedisStore(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there


def test_errors_are_store_unavailable_by_default() -> None:
    limiter = Limiter("5/hour", store=dead_store())
    with pytest.raises(StoreUnavailable, match="redis") as info:
        limiter.hit("k")
    assert isinstance(info.value, StoreError)
    assert isinstance(info.value.__cause__, redis.RedisError)
    with pytest.raises(StoreUnavailable):
        limiter.reset("k")


@pytest.mark.parametrize("two_tier", [False, True], ids=["exact", "two_tier"])
def test_a_reset_the_socket_fails_is_store_unavailable_in_both_twins(two_tier: bool) -> None:
    """A reset's DEL goes through the client, not the scripts: a socket's own
    error (an OSError; asyncio's timeout is one too) is wrapped as every store
    error is, by the sync store as by the async one."""

    def refuse(*keys: Any) -> Any:
        raise ConnectionResetError(104, "Connection reset by peer")

    async def arefuse(*keys: Any) -> Any:
        raise ConnectionResetError(104, "Connection reset by peer")

    url = f"redis://127.0.0.1:{free_port()}/0"  # the DEL never gets that far
    with RedisStore(url) as store:
        store.client.delete = refuse
        limiter = Limiter("5/hour", store=store, name=name(), two_tier=two_tier)
        with pytest.raises(StoreUnavailable, match="reset by peer") as info:
            limiter.reset("k")
        assert isinstance(info.value.__cause__, ConnectionResetError)

    async def main() -> None:
        async with AsyncRedisStore(url) as store:
            store.client.delete = arefuse
            limiter = AsyncLimiter("5/hour", store=store, name=name(), two_tier=two_tier)
            with pytest.raises(StoreUnavailable, match="reset by peer") as info:
                await limiter.reset("k")
            assert isinstance(info.value.__cause__, ConnectionResetError)

    asyncio.run(main())


@pytest.mark.parametrize(("policy", "allowed"), [("fail_open", True), ("fail_closed", False)])
def test_policies_answer_degraded(policy: OnFailure, allowed: bool) -> None:
    store = dead_store()
    calls = record_script_calls(store)
    limiter = Limiter("5/hour", store=store, on_failure=policy)
    for _ in range(5):
        decision = limiter.hit("k")
        assert decision.allowed is allowed
        assert decision.degraded
    assert len(calls) == 2  # then the breaker stopped paying the timeout each call


def test_bad_input(redis_single: RedisServer, closing: contextlib.ExitStack) -> None:
    with pytest.raises(ConfigurationError, match="Redis URL"):
        RedisStore("http://nope")
    with pytest.raises(ConfigurationError, match="microseconds"):
        Limiter(
            "1/0.0000001s", store=closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
        )
    limiter = Limiter(
        "5/hour", store=closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    )
    with pytest.raises(ConfigurationError, match="cost"):
        limiter.hit("k", 0)


def test_cluster_by_url_with_hash_tags(
    redis_6_nodes: RedisCluster, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE))
    limiter = Limiter("3/hour", algorithm="gcra", store=store, name=name())
    users = [f"{{user-{i}}}" for i in range(30)]  # hash tags: one slot per user
    for user in users:
        assert [limiter.hit(user).allowed for _ in range(4)] == [True, True, True, False]
    masters = {
        store.client.get_node_from_key(f"x:{user}").name for user in users
    }  # the keys really spread over the masters
    assert len(masters) == 3


def test_cluster_url_errors() -> None:
    with pytest.raises(ConfigurationError, match="host:port"):
        RedisStore("redis+cluster://127.0.0.1")
    with pytest.raises(StoreUnavailable, match="cannot reach"):
        RedisStore(f"redis+cluster://127.0.0.1:{free_port()}")


def test_large_limits_count_in_coarser_ticks(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    daily = Limiter("1000000/day", algorithm="sliding_window_counter", store=store, name=name())
    first = daily.hit("k", 999_999)
    assert first.allowed
    assert first.remaining == 1
    assert not daily.hit("k", 2).allowed
    assert daily.hit("k").remaining == 0
    with pytest.raises(ConfigurationError, match="too large"):
        Limiter("100000000000/year", algorithm="sliding_window_counter", store=store)


def test_hit_many_is_one_script_call(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    calls = record_script_calls(store)
    tag = name()
    tiers = [
        Limiter("2/hour", algorithm="fixed_window", store=store, name=tag + "s"),
        Limiter("5/minute", algorithm="sliding_window_log", store=store, name=tag + "m"),
        Limiter("8/hour", algorithm="gcra", store=store, name=tag + "h"),
        Limiter(
            "100/day", algorithm="token_bucket", refill="interval", store=store, name=tag + "d"
        ),
    ]
    checks = [(limiter, "u") for limiter in tiers]
    assert [hit_many(checks).allowed for _ in range(3)] == [True, True, False]
    assert calls == ["_many"] * 3
    assert [limiter.peek("u").remaining for limiter in tiers] == [0, 3, 6, 98]


def test_hit_many_across_cluster_slots_refunds(
    redis_6_nodes: RedisCluster, closing: contextlib.ExitStack
) -> None:
    """Tiers in two slots: the first slot counts, the second denies, the first is
    refunded; unless another request counted on the key in between: then the
    refund is skipped (deny more, never admit more)."""
    store = closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE))
    tag = name()
    wide = Limiter("5/hour", store=store, name=tag + "-wide")
    narrow = Limiter("1/hour", store=store, name=tag + "-narrow")
    checks = [(wide, "{a}"), (narrow, "{b}")]
    client = store.client
    assert client.keyslot(wide.key_prefix + "{a}") != client.keyslot(narrow.key_prefix + "{b}")
    assert hit_many(checks).allowed
    denied = hit_many(checks)
    assert not denied.allowed
    assert denied.rule == tag + "-narrow"
    assert wide.peek("{a}").remaining == 4  # counted once, refunded once

    real_call = store.scripts.call

    def meddling(name: str, numkeys: int, args: list[Any]) -> Any:
        if name == "_refund":
            wide.hit("{a}")  # another request counts between the count and the refund
        return real_call(name, numkeys, args)

    store.scripts.call = meddling  # type: ignore[method-assign]
    assert not hit_many(checks).allowed
    assert wide.peek("{a}").remaining == 2  # the other hit, and the unrefunded one


@pytest.mark.parametrize(
    ("policies", "outcome"),
    [
        (("fail_open", "fail_open"), True),
        (("fail_open", "fail_closed"), False),
        (("fail_closed", "raise"), StoreUnavailable),
    ],
)
def test_hit_many_failure_policy(policies: tuple[OnFailure, OnFailure], outcome: object) -> None:
    store = dead_store()
    checks = [
        (Limiter("5/hour", store=store, on_failure=policy, name=f"t{i}"), "k")
        for i, policy in enumerate(policies)
    ]
    for _ in range(3):  # through the failures, then with the breaker open
        if outcome is StoreUnavailable:
            with pytest.raises(StoreUnavailable):
                hit_many(checks)
        else:
            decision = hit_many(checks)
            assert decision.allowed is outcome
            assert decision.degraded


def test_sentinel_url(closing: contextlib.ExitStack) -> None:
    master, sentinel = closing.enter_context(redis_sentinel())
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/rw-master/0"
    store = closing.enter_context(RedisStore(url, timeout=LIVE))
    limiter = Limiter("2/hour", store=store, name=name())
    assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]
    with master.client() as client:  # the Sentinel led us to the master
        assert client.exists(limiter.key_prefix + "k")

    async def main() -> list[bool]:
        async with AsyncRedisStore(url, timeout=LIVE) as astore:
            alimiter = AsyncLimiter("2/hour", store=astore, name=limiter.name)
            return [(await alimiter.hit("k")).allowed, (await alimiter.hit("j")).allowed]

    assert asyncio.run(main()) == [False, True]  # the same counters
    for bad in ("redis+sentinel://127.0.0.1:1", "redis+sentinel://127.0.0.1:1/m/x"):
        with pytest.raises(ConfigurationError, match="sentinel"):
            RedisStore(bad)


def test_rule_engine_checks_shadow_rules_in_the_same_call(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    calls = record_script_calls(store)
    tag = name()
    rules = loads(
        f"rules:\n"
        f"  - {{name: {tag}-user, rate: 2/minute, by: user}}\n"
        f"  - {{name: {tag}-all, rate: 3/minute, action: log_only}}\n"
    )
    engine = RuleEngine(rules, store)
    outcomes = [engine.check({"user": "u1"}) for _ in range(3)]
    assert [o.allowed for o in outcomes] == [True, True, False]
    assert [o.shadow is not None and o.shadow.remaining for o in outcomes] == [2, 1, False]
    assert calls == ["_many"] * 3  # enforced and shadow tiers: one script call each check


def test_clients_that_decode_replies_and_huge_costs(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    text_client = closing.enter_context(
        redis.Redis(host="127.0.0.1", port=redis_single.port, decode_responses=True)
    )
    with pytest.raises(ConfigurationError, match="decode_responses"):
        RedisStore(text_client)
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    a = Limiter("5/minute", store=store, name=name())
    b = Limiter("5/minute", store=store, name=name())
    denied = hit_many([(a, "k", 10**400), (b, "k")])  # a cost no double holds
    assert not denied.allowed
    assert math.isinf(denied.retry_after)

    async def main() -> bool:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as astore:
            limiter = AsyncLimiter("5/minute", store=astore, name=name())
            return (await limiter.hit("k", 10**400)).allowed

    assert asyncio.run(main()) is False


def test_across_slots_a_failure_keeps_a_known_denial_and_refunds_what_counted(
    redis_6_nodes: RedisCluster, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE))
    tag = name()
    wide = Limiter("5/hour", store=store, name=tag + "-wide", on_failure="fail_open")
    narrow = Limiter("1/hour", store=store, name=tag + "-narrow", on_failure="fail_open")
    checks = [(wide, "{a}"), (narrow, "{b}")]
    assert hit_many(checks).allowed
    real_call = store.scripts.call
    failing: set[str] = set()

    def flaky(name: str, numkeys: int, args: list[Any]) -> Any:
        if name in failing:
            raise StoreUnavailable("redis: injected")
        return real_call(name, numkeys, args)

    store.scripts.call = flaky  # type: ignore[method-assign]
    failing.add("_refund")  # the denial is known when the refund fails
    denied = hit_many(checks)
    assert not denied.allowed  # not fail_open's "allowed": a tier did deny
    assert not denied.degraded
    assert wide.peek("{a}").remaining == 3  # the failed refund left its count

    fresh = [(wide, "{c}"), (narrow, "{d}")]
    calls = {"n": 0}

    def second_slot_fails(name: str, numkeys: int, args: list[Any]) -> Any:
        calls["n"] += 1
        if name == "_many" and calls["n"] == 2:
            raise StoreUnavailable("redis: injected")
        return real_call(name, numkeys, args)

    store.scripts.call = second_slot_fails  # type: ignore[method-assign]
    degraded = hit_many(fresh)
    assert degraded.degraded  # no tier denied: the policy answers
    store.scripts.call = real_call  # type: ignore[method-assign]
    assert wide.peek("{c}").remaining == 5  # and the first slot's count was refunded
