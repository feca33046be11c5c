"""The engine: one hit_many per request, actions, shadow rules, and reloads."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ratewarden import AsyncMemoryStore, ConfigurationError, FakeClock, MemoryStore
from ratewarden.rules import AsyncRuleEngine, RuleEngine, RuleFileError, loads

RULES = textwrap.dedent("""
    rules:
      - name: per-endpoint
        rate: 3/minute
        algorithm: fixed_window
        by: user
        match: {paths: /api/orders}
      - name: per-user
        rate: [5/minute, 8/hour]
        algorithm: fixed_window
        by: user
      - name: search
        rate: 2/minute
        algorithm: fixed_window
        by: user
        action: reject
        status: 503
        match: {paths: /api/search}
      - name: export
        rate: 1/second
        algorithm: gcra
        by: user
        action: delay
        max_wait: 2.5
        match: {paths: /api/export}
      - name: spam
        rate: 1/hour
        algorithm: fixed_window
        by: user
        action: shadow_ban
        response: {status: 202, body: queued}
        match: {paths: /api/comments, methods: POST}
      - name: preview
        rate: 2/minute
        algorithm: fixed_window
        by: user
        action: log_only
        match: {paths: /api/preview*}
""")


def orders(user: str = "u1") -> dict[str, object]:
    return {"method": "GET", "path": "/api/orders", "user": user}


@pytest.fixture
def engine(store: MemoryStore) -> RuleEngine:
    return RuleEngine(loads(RULES), store)


def test_every_tier_must_pass_and_a_denial_consumes_nothing(engine: RuleEngine) -> None:
    results = [engine.check(orders()) for _ in range(4)]
    assert [r.allowed for r in results] == [True, True, True, False]
    assert results[0].action == "allow"
    assert results[0].status == 200
    assert {a.rule.name for a in results[0].limits} == {"per-endpoint", "per-user"}
    denied = results[3]
    assert denied.action == "reject"
    assert denied.status == 429
    assert denied.rule is not None
    assert denied.rule.name == "per-endpoint"
    assert denied.retry_after > 0
    # per-user counted 3 (not 4): two more requests elsewhere pass, the third does not
    other = {"method": "GET", "path": "/elsewhere", "user": "u1"}
    assert [engine.check(other).allowed for _ in range(3)] == [True, True, False]
    assert engine.check(other).decision.rule == "per-user@5/minute"  # type: ignore[union-attr]
    assert engine.check(orders("u2")).allowed  # another user, other counters


def test_the_tiers_of_one_rule_count_apart(engine: RuleEngine, clock: FakeClock) -> None:
    path = {"path": "/elsewhere", "user": "u1"}
    allowed = 0
    for _ in range(4):  # 4 minutes: 5/minute would allow 20, 8/hour allows 8
        allowed += sum(engine.check(path).allowed for _ in range(6))
        clock.advance(60)
    assert allowed == 8
    assert engine.check(path).decision.rule == "per-user@8/hour"  # type: ignore[union-attr]


def test_no_rule_applies(store: MemoryStore) -> None:
    engine = RuleEngine(loads("rules: [{name: a, rate: 1/s, by: user}]"), store)
    outcome = engine.check({"path": "/"})  # no user: rule a does not apply
    assert outcome.allowed
    assert outcome.decision is None
    assert outcome.limits == ()


def test_reject_with_503(engine: RuleEngine) -> None:
    search = {"path": "/api/search", "user": "u1"}
    assert [engine.check(search).status for _ in range(3)] == [200, 200, 503]


def test_delay_waits_within_max_wait(engine: RuleEngine, clock: FakeClock) -> None:
    export = {"path": "/api/export", "user": "u1"}
    assert engine.check(export).allowed
    outcome = engine.check(export)
    assert outcome.action == "delay"
    assert outcome.wait == pytest.approx(1.0)
    assert not outcome.allowed
    start = clock.time_ns()
    waited = engine.check(export, wait=True)
    assert waited.allowed
    assert clock.time_ns() - start == pytest.approx(1e9, rel=1e-6)


def test_a_delay_longer_than_max_wait_is_rejected(store: MemoryStore) -> None:
    rules = "rules: [{name: slow, rate: 1/10s, algorithm: gcra, action: delay, max_wait: 2}]"
    engine = RuleEngine(loads(rules), store)
    assert engine.check({}).allowed
    outcome = engine.check({}, wait=True)
    assert (outcome.action, outcome.status, outcome.wait) == ("reject", 429, 0.0)
    assert outcome.retry_after == pytest.approx(10)


def test_shadow_ban_answers_its_response(engine: RuleEngine) -> None:
    comment = {"method": "POST", "path": "/api/comments", "user": "troll"}
    assert engine.check(comment).allowed
    outcome = engine.check(comment)
    assert outcome.action == "shadow_ban"
    assert not outcome.allowed
    assert outcome.status == 202
    assert outcome.response is not None
    assert outcome.response.body == "queued"


def test_log_only_reports_and_never_blocks(engine: RuleEngine) -> None:
    preview = {"path": "/api/preview/1", "user": "u9"}
    outcomes = [engine.check(preview) for _ in range(7)]
    # per-user (5/minute) is enforced; preview (2/minute) only reports
    assert [o.allowed for o in outcomes] == [True] * 5 + [False] * 2
    shadows = [o.shadow for o in outcomes]
    assert [s is not None and s.allowed for s in shadows[:5]] == [True, True, False, False, False]
    assert shadows[2] is not None
    assert shadows[2].rule == "preview"
    # a request the enforced limits deny is not counted by the shadow ones
    assert shadows[5] is None


def test_reload_keeps_counters_of_unchanged_rules(tmp_path: Path, store: MemoryStore) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - {name: kept, rate: 3/minute, algorithm: fixed_window, by: user}\n"
        "  - {name: changed, rate: 3/minute, algorithm: fixed_window, by: org}\n"
    )
    engine = RuleEngine(path, store)
    for _ in range(3):
        assert engine.check({"user": "u", "org": "o"}).allowed
    assert not engine.check({"user": "u"}).allowed
    assert not engine.check({"org": "o"}).allowed
    path.write_text(
        "rules:\n"
        "  - {name: kept, rate: 3/minute, algorithm: fixed_window, by: user}\n"
        "  - {name: changed, rate: 4/minute, algorithm: fixed_window, by: org}\n"
        "  - {name: added, rate: 1/minute, by: ip}\n"
    )
    engine.reload()
    assert len(engine.ruleset) == 3
    assert not engine.check({"user": "u"}).allowed  # still counted: 3 of 3
    # a changed limit starts afresh: all 4 of its new limit
    assert [engine.check({"org": "o"}).allowed for _ in range(5)] == [True] * 4 + [False]


def test_a_rule_that_gains_or_loses_a_rate_keeps_its_counters(
    tmp_path: Path, store: MemoryStore
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: r, rate: 3/minute, algorithm: fixed_window, by: user}]\n")
    engine = RuleEngine(path, store)
    assert [engine.check({"user": "u"}).allowed for _ in range(2)] == [True, True]
    # a second tier: the rule's limiters become r@3/minute and r@100/hour
    path.write_text(
        "rules: [{name: r, rate: [3/minute, 100/hour], algorithm: fixed_window, by: user}]\n"
    )
    engine.reload()
    assert [engine.check({"user": "u"}).allowed for _ in range(2)] == [True, False]
    denied = engine.check({"user": "u"})
    assert denied.decision is not None
    assert denied.decision.rule == "r@3/minute"  # the tier that spoke, by its rate
    # and back to one rate: still the same counter
    path.write_text("rules: [{name: r, rate: 3/minute, algorithm: fixed_window, by: user}]\n")
    engine.reload()
    assert not engine.check({"user": "u"}).allowed


def test_a_bad_reload_keeps_the_old_rules(tmp_path: Path, store: MemoryStore) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: a, rate: 1/minute, by: user}]\n")
    engine = RuleEngine(path, store)
    old = engine.ruleset
    assert engine.check({"user": "u"}).allowed
    path.write_text("rules: [{name: a, rate: 1/minute, by: user}, {name: b, rate: lots}]\n")
    with pytest.raises(RuleFileError, match=r"rules\.yaml:1: rule 'b', field 'rate'"):
        engine.reload()
    assert engine.ruleset is old
    assert isinstance(engine.last_error, RuleFileError)
    assert not engine.check({"user": "u"}).allowed  # still limited, still counting
    assert engine.try_reload() is False
    path.unlink()
    assert engine.try_reload() is False
    assert engine.ruleset is old


def test_an_engine_from_text_cannot_reload(store: MemoryStore) -> None:
    engine = RuleEngine(loads("rules: [{name: a, rate: 1/s}]"), store)
    with pytest.raises(ConfigurationError, match="no file"):
        engine.reload()
    with pytest.raises(ConfigurationError, match="no file"):
        engine.watch()


def test_the_watcher_reloads_on_change_and_survives_bad_files(
    tmp_path: Path, store: MemoryStore
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: a, rate: 1/minute}]\n")
    engine = RuleEngine(path, store)
    watcher = engine.watch(interval=3600)  # its thread stays idle: we poll by hand
    try:
        assert watcher.poll() is None
        path.write_text("rules: [{name: a, rate: 1/minute}, {name: b, rate: 2/minute}]\n")
        assert watcher.poll() is True
        assert len(engine.ruleset) == 2
        path.write_text("rules: [{name: a, rate: 1/minute}, {name: b, rate: 2/minute}]  # ]{\n[")
        assert watcher.poll() is False
        assert len(engine.ruleset) == 2
        assert (watcher.reloads, watcher.failures) == (1, 1)
        assert "1 reloads" in repr(watcher)
    finally:
        watcher.stop()


def test_the_watcher_thread_reloads(tmp_path: Path, store: MemoryStore) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: a, rate: 1/minute}]\n")
    engine = RuleEngine(path, store)
    watcher = engine.watch(interval=0.01)
    try:
        path.write_text("rules: [{name: a, rate: 1/minute}, {name: b, rate: 9/minute}]\n")
        done = threading.Event()
        for _ in range(500):  # up to 5 s on a slow machine; usually 10-20 ms
            if len(engine.ruleset) == 2:
                done.set()
                break
            threading.Event().wait(0.01)
        assert done.is_set()
    finally:
        watcher.stop()


def test_the_async_watcher_reloads_on_change_and_survives_bad_files(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: a, rate: 1/minute}]\n")
    engine = AsyncRuleEngine(path, AsyncMemoryStore(clock=clock))
    watcher = engine.awatch(3600)  # never run: polled by hand

    async def main() -> list[bool | None]:
        found = [await watcher.apoll()]
        path.write_text("rules: [{name: a, rate: 1/minute}, {name: b, rate: 2/minute}]\n")
        found.append(await watcher.apoll())
        path.write_text("rules: [{name: a, rate: 1/minute}, {name: b, rate: 2/minute}]  # ]{\n[")
        found.append(await watcher.apoll())
        return found

    assert asyncio.run(main()) == [None, True, False]
    assert len(engine.ruleset) == 2
    assert (watcher.reloads, watcher.failures) == (1, 1)
    assert repr(watcher).startswith("<AsyncWatcher ")
    with pytest.raises(ConfigurationError, match="interval"):
        engine.awatch(0)


def eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll a condition another thread will make true (never a fixed sleep)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_sighup_reloads(tmp_path: Path, store: MemoryStore) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: a, rate: 1/minute}]\n")
    engine = RuleEngine(path, store)
    before = signal.getsignal(signal.SIGHUP)  # SIG_IGN under nohup, else SIG_DFL
    restore = engine.reload_on_sighup()
    try:
        path.write_text("rules: [{name: a, rate: 1/minute}, {name: b, rate: 9/minute}]\n")
        # As if the signal landed inside a hit: a handler that reloaded right
        # there would wait forever on the store's lock to bind the new limiters.
        with store._lock:
            os.kill(os.getpid(), signal.SIGHUP)  # the handler starts a reloading thread
        assert eventually(lambda: len(engine.ruleset) == 2)
        path.write_text("rules: nonsense\n")
        os.kill(os.getpid(), signal.SIGHUP)
        assert eventually(lambda: engine.last_error is not None)
        assert len(engine.ruleset) == 2
    finally:
        restore()
    assert signal.getsignal(signal.SIGHUP) is before


def test_the_async_engine_is_the_same(clock: FakeClock) -> None:
    async def main() -> None:
        engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))
        results = [await engine.acheck(orders()) for _ in range(4)]
        assert [r.allowed for r in results] == [True, True, True, False]
        export = {"path": "/api/export", "user": "u1"}
        assert (await engine.acheck(export)).allowed
        assert (await engine.acheck(export)).action == "delay"
        assert (await engine.acheck(export, wait=True)).allowed
        preview = {"path": "/api/preview", "user": "u7"}
        shadows = [(await engine.acheck(preview)).shadow for _ in range(3)]
        assert [s is not None and s.allowed for s in shadows] == [True, True, False]

    asyncio.run(main())


def test_reprs_show_what_is_in_force(tmp_path: Path, store: MemoryStore) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: a, rate: [1/s, 9/minute]}, {name: b, rate: 1/s}]\n")
    engine = RuleEngine(path, store)
    assert repr(engine.ruleset) == f"<RuleSet 2 rules, 3 limits from {str(path)!r}>"
    assert repr(engine) == f"<RuleEngine 2 rules from {str(path)!r} on {store!r}>"
    assert repr(engine.ruleset.rules[0]) == "<CompiledRule 'a' group=None rank=0>"


def test_use_puts_a_compiled_rule_set_in_force(store: MemoryStore) -> None:
    engine = RuleEngine(loads("rules: [{name: a, rate: 1/minute, by: user}]"), store)
    assert engine.check({"user": "u"}).allowed
    engine.use(loads("rules: [{name: a, rate: 1/minute, by: user}, {name: b, rate: 5/s}]"))
    assert len(engine.ruleset) == 2
    assert not engine.check({"user": "u"}).allowed  # rule a unchanged: still counted


def test_outcome_headers_name_every_enforced_limit() -> None:
    clock = FakeClock(1_700_000_040)  # on a minute's edge
    engine = RuleEngine(loads(RULES), MemoryStore(clock=clock))
    first = dict(engine.check(orders()).headers())
    policies = first.pop("RateLimit-Policy").split(", ")
    assert sorted(policies) == [
        '"per-endpoint";q=3;w=60',
        '"per-user@5/minute";q=5;w=60',
        '"per-user@8/hour";q=8;w=3600',
    ]
    assert first == {
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "2",
        "X-RateLimit-Reset": "60",
        "RateLimit": '"per-endpoint";r=2;t=60',
    }
    engine.check(orders())
    engine.check(orders())
    clock.advance(0.5)
    denied = engine.check(orders())
    assert ("Retry-After", "60") in denied.headers()  # 59.5 s, rounded up
    preview = engine.check({"method": "GET", "path": "/api/preview/1", "user": "u2"})
    assert "per-user" in dict(preview.headers())["RateLimit-Policy"]
    assert "preview" not in dict(preview.headers())["RateLimit-Policy"]  # log_only: never shown


def test_cost_multiplies_what_every_rule_charges() -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    request = {"path": "/api/orders", "user": "u"}
    outcome = engine.check(request, cost=3)  # per-endpoint 3/minute: exactly full
    assert outcome.allowed
    assert outcome.decision is not None
    assert outcome.decision.remaining == 0
    assert not engine.check(request).allowed
    with pytest.raises(ConfigurationError, match="cost must be an integer >= 1"):
        engine.check(request, cost=0)


def test_async_cost_is_the_same() -> None:
    async def main() -> None:
        engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=FakeClock()))
        request = {"path": "/api/orders", "user": "u"}
        assert not (await engine.acheck(request, cost=4)).allowed  # more than 3 at once
        assert (await engine.acheck(request, cost=3)).allowed

    asyncio.run(main())
