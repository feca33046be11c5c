"""Runtime overrides attacked: rules whose limits are not their plain rates
(degrade, queue), rates no parser should choke on, foreign values in the Redis
hash, a flood on the channel, a follower's read that is older than a change,
engines dropped without close, a read that swallows the follower's cancellation,
and text that would spoof a table or a log."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import uuid
import weakref
from collections.abc import Iterator

import pytest

from ratewarden import ConfigurationError
from ratewarden._clock import FakeClock
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads
from ratewarden.rules._override_stores import Snapshot
from ratewarden.rules._override_view import OverrideView, follow_async
from ratewarden.rules.overrides import OverrideRecord, check_text
from ratewarden.stores import MemoryStore
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.engines import limit_of, within
from tests.redis_server import LIVE, RedisServer

SHAPED = loads("""
rules:
  - name: deg
    match: {paths: /d}
    rate: 100/minute
    algorithm: fixed_window
    action: degrade
    degrade: {full_at: 2}
  - name: q
    match: {paths: /q}
    rate: 10/second
    action: queue
    queue: 100
    max_wait: 1
  - name: plain
    match: {paths: /p}
    rate: 2/minute
    algorithm: fixed_window
""")

API = loads("""
rules:
  - name: api
    match: {paths: "/api/*"}
    rate: 2/hour
    algorithm: fixed_window
    by: user
""")


def shaped() -> RuleEngine:
    return RuleEngine(SHAPED, MemoryStore(clock=FakeClock(1_700_000_040.0)))


def who() -> dict[str, object]:
    return {"path": "/api/x", "user": uuid.uuid4().hex}


# -- what an override replaces -------------------------------------------------


def test_a_degrade_rule_is_overridden_by_its_own_rate_not_its_ceiling() -> None:
    e = shaped()
    override = e.set_override("deg", "500/minute", duration=60, reason="r")
    assert override.replaces == ("100/minute",)  # the file's rate, not the 2x ceiling
    outcomes = [e.check({"path": "/d"}) for _ in range(1000)]
    # degraded from 500 on, fully at full_at 2 x 500, not from the file's 100 up to 500
    assert [o.degrade for o in outcomes[:500]] == [0.0] * 500
    assert outcomes[749].degrade == 0.5
    assert outcomes[999].degrade == 1.0
    assert outcomes[998].degrade < 1.0


def test_a_queue_rule_keeps_its_max_wait_under_an_override() -> None:
    e = shaped()
    e.set_override("q", "1/second", duration=60, reason="r")
    waits = [e.check({"path": "/q"}) for _ in range(5)]
    # max_wait 1 s at 1/second: one passes, one waits a second, the rest are refused
    assert [o.action for o in waits] == ["allow", "queue", "reject", "reject", "reject"]
    assert max(o.wait for o in waits) <= 1.0


ARABIC_TEN = "\u0661\u0660"


@pytest.mark.parametrize("rate", ["²/minute", f"{ARABIC_TEN}/minute", "五/minute"])
def test_a_rate_no_integer_parser_takes_is_refused_clearly(rate: str) -> None:
    e = shaped()
    with pytest.raises(ConfigurationError):
        e.set_override("plain", rate, duration=60, reason="r")
    assert e.list_overrides() == []


def test_a_stored_override_with_a_bad_rate_is_ignored_and_reloads_go_on() -> None:
    e = shaped()
    source = e.overrides_source
    assert source is not None
    bad = OverrideRecord("plain", ("²/minute",), ("2/minute",), "r", "x", 0, 10**15)
    e._take_overrides((1, {"plain": bad}))  # what another process may have written
    assert limit_of(e, {"path": "/p"}) == 2
    e.use(SHAPED)  # a reload under it
    e.set_override("q", "5/second", duration=60, reason="r")
    assert limit_of(e, {"path": "/p"}) == 2


# -- text that reaches tables and logs -------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["a\x85b", "a\x9b31mb", "a\x7fb", "a\u2028b", "a\u2029b", "a\u202eb", "a\u2066b", "a\ufeffb"],
)
def test_reasons_and_names_refuse_controls_that_spoof_a_line(text: str) -> None:
    with pytest.raises(ConfigurationError, match="one line of printable text"):
        check_text("reason", text, 500, required=True)


def test_plain_unicode_in_a_reason_is_kept() -> None:
    assert check_text("reason", "  Störung 🚒 東京 ", 500, required=True) == "Störung 🚒 東京"


# -- the view's clock -----------------------------------------------------------


def test_the_next_expiry_follows_the_deadlines_when_a_read_moves_them() -> None:
    clock = FakeClock(1_000.0)
    view = OverrideView(clock)
    record = OverrideRecord("api", ("5/hour",), ("2/hour",), "r", "", 0, 60_000)
    assert view.take((0, {"api": record}))
    assert view.next_expiry == min(view.deadlines.values())
    # the same override read again, the local clock stepped back by 30 s
    assert not view.take((-30_000, {"api": record}))
    assert view.next_expiry == min(view.deadlines.values())
    clock.advance(61)  # past the first deadline, before the moved one
    assert not view.expire()
    assert view.next_expiry == min(view.deadlines.values())


# -- Redis -----------------------------------------------------------------------


@pytest.fixture
def namespace() -> str:
    return f"attack-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store(redis_single: RedisServer) -> Iterator[RedisStore]:
    with RedisStore(redis_single.url, timeout=LIVE) as s:
        yield s


def test_a_foreign_value_in_the_hash_does_not_break_a_change_or_the_audit(
    redis_single: RedisServer, store: RedisStore, namespace: str
) -> None:
    client = redis_single.client()
    active = f"{{{namespace}:overrides}}:active"
    client.hset(active, "api", '{"expires_at":99999999999999}')  # JSON, but not ours
    client.hset(active, "other", "not json at all")
    e = RuleEngine(API, store, overrides_namespace=namespace)
    try:
        assert e.list_overrides() == []
        override = e.set_override("api", "5/hour", duration=60, reason="r", by="a")
        assert override.replaces == ("2/hour",)
        assert [(x.action, x.replaces) for x in e.override_audit()] == [("set", ("2/hour",))]
        assert [o.rule for o in e.list_overrides()] == ["api"]
    finally:
        e.close()


def test_a_foreign_record_with_a_bad_rate_leaves_every_engine_working(
    redis_single: RedisServer, store: RedisStore, namespace: str
) -> None:
    e = RuleEngine(API, store, overrides_namespace=namespace)
    try:
        record = {"set_at": 1, "expires_at": 99_999_999_999_999, "rule": "api",
                  "limits": ["²/hour"], "file_limits": ["2/hour"], "reason": "x",
                  "by": "y"}  # fmt: skip
        redis_single.client().hset(f"{{{namespace}:overrides}}:active", "api", json.dumps(record))
        assert e.overrides_source is not None
        e._take_overrides(e.overrides_source.read())
        assert limit_of(e, who()) == 2
        e.use(API)  # reloads go on
        e.set_override("api", "5/hour", duration=60, reason="r")
        assert limit_of(e, who()) == 5
    finally:
        e.close()


def test_a_read_older_than_a_change_does_not_undo_it(store: RedisStore, namespace: str) -> None:
    e = RuleEngine(API, store, overrides_namespace=namespace)
    try:
        assert e.overrides_source is not None
        before = e.overrides_source.read()  # the follower's read, in flight
        e.set_override("api", "5/hour", duration=60, reason="r")
        e._take_overrides(before)  # ... lands after the change
        assert limit_of(e, who()) == 5
        e._take_overrides(e.overrides_source.read())  # the next read is in force as ever
        assert limit_of(e, who()) == 5
        stale = e.overrides_source.read()
        assert e.clear_override("api", reason="r")
        e._take_overrides(stale)
        assert limit_of(e, who()) == 2
    finally:
        e.close()


def test_a_flood_on_the_channel_does_not_stop_the_reads(
    redis_single: RedisServer, namespace: str
) -> None:
    with (
        RedisStore(redis_single.url, timeout=LIVE) as one,
        RedisStore(redis_single.url, timeout=LIVE) as two,
    ):
        a = RuleEngine(API, one, overrides_namespace=namespace)
        b = RuleEngine(API, two, overrides_namespace=namespace)
        stop = threading.Event()

        def flood() -> None:
            client = redis_single.client()
            while not stop.is_set():
                pipe = client.pipeline(transaction=False)
                for _ in range(1000):
                    pipe.publish(f"{namespace}:overrides", "api")
                pipe.execute()

        threads = [threading.Thread(target=flood, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)  # the flood is on before the change
            a.set_override("api", "7/hour", duration=60, reason="r")
            within(3.0, lambda: limit_of(b, who()) == 7)
        finally:
            stop.set()
            for t in threads:
                t.join()
            a.close()
            b.close()


def test_a_dropped_async_engine_is_collected_and_its_follower_ends(
    redis_single: RedisServer, namespace: str
) -> None:
    def followers() -> int:
        return sum(t.get_name() == "ratewarden-overrides" for t in asyncio.all_tasks())

    async def main() -> None:
        store = AsyncRedisStore(redis_single.url, timeout=LIVE)
        engine = AsyncRuleEngine(API, store, overrides_namespace=namespace)
        await engine.acheck(who())
        assert followers() == 1
        ref = weakref.ref(engine)
        del engine
        gc.collect()
        assert ref() is None, "the follower task keeps its engine alive"
        began = time.monotonic()
        while followers():  # it wakes at least every 2 s and sees its engine gone
            assert time.monotonic() - began < 3.0
            await asyncio.sleep(0.01)
        await store.aclose()

    asyncio.run(main())


class SwallowingSource:
    """A source whose read answers through the first cancellation, as Python 3.11's
    `asyncio.wait_for` (redis-py's, on a send) does when the call it waits for ends
    in the loop's turn that brings the cancel. Later cancellations end the read."""

    def __init__(self) -> None:
        self.reads = 0
        self.swallowed = False

    async def subscribe(self) -> None:
        raise ConnectionError("no channel here")  # the follower polls instead

    async def read(self) -> Snapshot:
        self.reads += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed = True
        return 0, {}


def test_an_async_follower_ends_when_a_read_swallows_its_cancellation() -> None:
    taken: list[Snapshot] = []

    class Engine:
        def take(self, snapshot: Snapshot) -> None:
            taken.append(snapshot)

    async def main() -> None:
        engine, source = Engine(), SwallowingSource()
        task = asyncio.create_task(follow_async(weakref.WeakMethod(engine.take), source))
        while not source.reads:
            await asyncio.sleep(0.01)
        task.cancel()  # as AsyncRuleEngine.aclose does, and then awaits the task
        done, _ = await asyncio.wait({task}, timeout=3.0)
        assert source.swallowed
        assert task in done, "the follower reads on after its cancellation: aclose hangs"
        assert task.cancelled()

    asyncio.run(main())
