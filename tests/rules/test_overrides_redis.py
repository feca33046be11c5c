"""Runtime overrides in Redis: set in one process's engine, in force in every
engine on the store within a second; expiry on Redis's clock; the audit trail;
what happens when Redis goes away."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from ratewarden import StoreUnavailable
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.engines import limit_of, within
from tests.redis_server import LIVE, RedisCluster, RedisServer, redis_server

RULES = loads("""
rules:
  - name: api
    match: {paths: "/api/*"}
    rate: 2/hour
    algorithm: fixed_window
    by: user
""")


def attributes() -> dict[str, object]:
    return {"path": "/api/x", "user": uuid.uuid4().hex}  # a key of this test's own


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"  # the server is the session's: keep apart


@pytest.fixture
def pair(redis_single: RedisServer, namespace: str) -> Iterator[tuple[RuleEngine, RuleEngine]]:
    stores = [RedisStore(redis_single.url, timeout=LIVE) for _ in range(2)]
    engines = [RuleEngine(RULES, s, overrides_namespace=namespace) for s in stores]
    yield engines[0], engines[1]
    for e, s in zip(engines, stores, strict=True):
        e.close()
        s.close()


def test_an_override_set_in_one_engine_rules_the_other_within_a_second(
    pair: tuple[RuleEngine, RuleEngine],
) -> None:
    a, b = pair
    who = attributes()
    assert limit_of(b, who) == 2
    a.set_override("api", "50/hour", duration="10m", reason="incident", by="alice")
    assert limit_of(a, who) == 50  # where it was set: at once
    took = within(1.0, lambda: limit_of(b, who) == 50)
    assert took < 1.0
    assert [(o.rule, o.limits, o.by) for o in b.list_overrides()] == [
        ("api", ("50/hour",), "alice")
    ]
    assert b.clear_override("api", reason="done", by="bob")
    within(1.0, lambda: limit_of(a, who) == 2)
    audit = a.override_audit()
    assert [(x.action, x.by, x.reason) for x in audit] == [
        ("clear", "bob", "done"), ("set", "alice", "incident"),
    ]  # fmt: skip


def test_expiry_is_on_redis_s_clock(pair: tuple[RuleEngine, RuleEngine]) -> None:
    a, b = pair
    who = attributes()
    override = a.set_override("api", "50/hour", duration=1, reason="short")
    within(1.0, lambda: limit_of(b, who) == 50)
    assert 0.5 < override.expires_in <= 1.0
    assert override.expires_at - override.set_at == 1.0
    # each engine ends it on its own, with no message: by its deadline
    within(1.5, lambda: limit_of(a, who) == 2 and limit_of(b, who) == 2)
    assert a.list_overrides() == [] == b.list_overrides()


def test_an_engine_that_starts_later_finds_the_override(
    redis_single: RedisServer, pair: tuple[RuleEngine, RuleEngine], namespace: str
) -> None:
    a, _ = pair
    a.set_override("api", "40/hour", duration=600, reason="r")
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        late = RuleEngine(RULES, store, overrides_namespace=namespace)
        assert limit_of(late, attributes()) == 40  # in force from its first check
        late.close()


def test_namespaces_keep_overrides_apart(redis_single: RedisServer, namespace: str) -> None:
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        mine = RuleEngine(RULES, store, overrides_namespace=namespace)
        other = RuleEngine(RULES, store, overrides_namespace=namespace + "-other")
        mine.set_override("api", "40/hour", duration=600, reason="r")
        time.sleep(0.2)  # time for a message that must not come
        assert limit_of(other, attributes()) == 2
        assert other.list_overrides() == []
        mine.close()
        other.close()


def test_without_redis_a_change_fails_loudly_and_checks_go_on(namespace: str) -> None:
    with redis_server() as server:
        store = RedisStore(server.url, timeout=LIVE)
        engine = RuleEngine(RULES, store, overrides_namespace=namespace)
        engine.set_override("api", "40/hour", duration=600, reason="r")
        who = attributes()
        assert limit_of(engine, who) == 40
        server.kill()
        with pytest.raises(StoreUnavailable):
            engine.set_override("api", "30/hour", duration=600, reason="r")
        with pytest.raises(StoreUnavailable):
            engine.list_overrides()
        outcome = engine.check(who)  # the rule's on_failure decides, as for any check
        assert outcome.allowed
        server.start()
        engine.set_override("api", "30/hour", duration=600, reason="back")
        assert limit_of(engine, attributes()) == 30
        engine.close()
        store.close()


def test_the_follower_ends_with_its_engine(redis_single: RedisServer, namespace: str) -> None:
    def followers() -> int:
        return sum(t.name == "ratewarden-overrides" for t in threading.enumerate())

    before = followers()
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        engine = RuleEngine(RULES, store, overrides_namespace=namespace)
        assert followers() == before + 1
        engine.close()
        assert followers() == before
        engine = RuleEngine(RULES, store, overrides_namespace=namespace)
        del engine
        gc.collect()
        # it wakes at least every 2 s; 10 for a busy machine (seen: past 3 in the Valkey pass)
        within(10.0, lambda: followers() == before)


def test_the_async_engine_follows_too(redis_single: RedisServer, namespace: str) -> None:
    async def main() -> None:
        stores = [AsyncRedisStore(redis_single.url, timeout=LIVE) for _ in range(2)]
        a, b = (AsyncRuleEngine(RULES, s, overrides_namespace=namespace) for s in stores)
        await a.astart()
        who = attributes()
        assert (await b.acheck(who)).decision.limit == 2  # type: ignore[union-attr]
        await a.aset_override("api", "60/hour", duration=600, reason="r")
        began = time.monotonic()
        while (await b.acheck(who)).decision.limit != 60:  # type: ignore[union-attr]
            assert time.monotonic() - began < 1.0
            await asyncio.sleep(0.005)
        assert [x.action for x in await b.aoverride_audit()] == ["set"]
        assert await b.aclear_override("api", reason="done")
        await a.aclose()
        await b.aclose()
        for s in stores:
            await s.aclose()

    asyncio.run(main())


def test_a_cluster_carries_them(redis_6_nodes: RedisCluster, namespace: str) -> None:
    with (
        RedisStore(redis_6_nodes.url, timeout=LIVE) as one,
        RedisStore(redis_6_nodes.url, timeout=LIVE) as two,
    ):
        a = RuleEngine(RULES, one, overrides_namespace=namespace)
        b = RuleEngine(RULES, two, overrides_namespace=namespace)
        who = attributes()
        a.set_override("api", "70/hour", duration=600, reason="r")
        assert within(1.0, lambda: limit_of(b, who) == 70) < 1.0
        assert [o.limits for o in b.list_overrides()] == [("70/hour",)]
        a.close()
        b.close()
