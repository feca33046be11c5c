"""The rule actions that shape traffic instead of refusing it: degrade and queue."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.rules import AsyncRuleEngine, Outcome, RuleEngine, RuleFileError, loads

RULES = textwrap.dedent("""
    rules:
      - name: video
        rate: 2/minute
        algorithm: fixed_window
        by: ip
        action: degrade
        degrade: {header: true, full_at: 3}
        match: {paths: /video}
      - name: thumbs
        rate: 1/minute
        by: ip
        action: degrade
        match: {paths: /thumbs}
      - name: quiet
        rate: 1/minute
        action: degrade
        degrade: {header: X-Lower-Quality}
        match: {paths: /quiet}
      - name: line
        rate: 2/second
        action: queue
        queue: 2
        match: {paths: /line}
      - name: short-line
        rate: 10/second
        action: queue
        queue: 100
        max_wait: 0.25
        match: {paths: /short}
      - name: per-ip
        rate: 3/minute
        algorithm: fixed_window
        by: ip
        match: {paths: [/line, /guarded]}
      - name: guarded-line
        rate: 1/second
        action: queue
        queue: 5
        match: {paths: /guarded}
""")

START = 1_700_000_040.0  # a minute's edge: fixed windows start whole


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def engine(clock: FakeClock) -> RuleEngine:
    return RuleEngine(loads(RULES), MemoryStore(clock=clock))


def test_degrade_passes_and_the_level_grows_with_the_excess(engine: RuleEngine) -> None:
    request = {"path": "/video", "ip": "203.0.113.7"}
    outcomes = [engine.check(request) for _ in range(8)]
    assert all(o.allowed for o in outcomes)
    assert [o.action for o in outcomes] == ["allow"] * 2 + ["degrade"] * 6
    # from 0 at the limit (2) to 1 at full_at (3) times it (6), then 1 beyond
    assert [o.degrade for o in outcomes] == [0, 0, 0.25, 0.5, 0.75, 1, 1, 1]
    assert [o.headers() for o in outcomes[1:4]] == [
        [],
        [("X-RateLimit-Degraded", "0.25")],
        [("X-RateLimit-Degraded", "0.50")],
    ]
    assert outcomes[7].headers() == [("X-RateLimit-Degraded", "1")]
    assert outcomes[7].rule is not None
    assert outcomes[7].rule.name == "video"
    other = engine.check({"path": "/video", "ip": "198.51.100.1"})
    assert (other.action, other.degrade) == ("allow", 0.0)  # counted by ip


def test_degrade_without_levels_is_a_flag_and_the_header_is_optional(engine: RuleEngine) -> None:
    request = {"path": "/thumbs", "ip": "203.0.113.7"}
    first, second = engine.check(request), engine.check(request)
    assert (first.action, first.degrade) == ("allow", 0.0)
    assert (second.allowed, second.action, second.degrade) == (True, "degrade", 1.0)
    assert second.headers() == []  # the rule names no header
    engine.check({"path": "/quiet"})
    assert engine.check({"path": "/quiet"}).headers() == [("X-Lower-Quality", "1")]


def test_a_degrade_rule_never_blocks_nor_shows_in_the_rate_limit_headers(
    engine: RuleEngine,
) -> None:
    request = {"path": "/thumbs", "ip": "203.0.113.7"}
    for _ in range(50):
        assert engine.check(request).status == 200


def test_the_queue_hands_out_slots_evenly_spaced(engine: RuleEngine) -> None:
    outcomes = [engine.check({"path": "/short"}) for _ in range(4)]
    # 10/s: a slot every 0.1 s; max_wait 0.25 s caps the line at 2 waiting
    assert [(o.action, o.wait) for o in outcomes] == [
        ("allow", 0.0),
        ("queue", 0.1),
        ("queue", 0.2),
        ("reject", 0.0),
    ]
    assert all(o.allowed for o in outcomes[:3])
    full = outcomes[3]
    assert (full.allowed, full.status, full.retry_after) == (False, 429, 0.1)
    assert full.rule is not None
    assert full.rule.name == "short-line"
    assert ("Retry-After", "1") in full.headers()


def test_a_full_queue_counts_the_request_nowhere(engine: RuleEngine, clock: FakeClock) -> None:
    request = {"path": "/line", "ip": "203.0.113.7"}
    assert [engine.check(request).action for _ in range(3)] == ["allow", "queue", "queue"]
    other = {"path": "/line", "ip": "198.51.100.1"}
    refused = [engine.check(other) for _ in range(5)]  # the line (2) is full
    assert {(o.action, o.retry_after) for o in refused} == {("reject", 0.5)}
    clock.advance(0.5)
    admitted = engine.check(other)  # per-ip counted none of the five refusals
    assert (admitted.action, admitted.wait) == ("queue", 1.0)
    assert admitted.decision is not None
    assert admitted.decision.remaining == 2
    clock.advance(1.5)
    over = engine.check(request)  # per-ip's 3 are spent
    assert over.action == "reject"
    assert over.rule is not None
    assert over.rule.name == "per-ip"
    assert over.retry_after > 50


def test_a_request_another_rule_refuses_takes_no_slot(engine: RuleEngine) -> None:
    request = {"path": "/guarded", "ip": "203.0.113.7"}
    assert [engine.check(request).action for _ in range(5)] == ["allow", "queue", "queue",
                                                               "reject", "reject"]  # fmt: skip
    # per-ip refused the fourth and fifth: the line holds two waiting, as before
    stranger = engine.check({"path": "/guarded", "ip": "198.51.100.1"})
    assert (stranger.action, stranger.wait) == ("queue", 3.0)


def test_check_with_wait_holds_a_queued_request_until_its_slot(
    engine: RuleEngine, clock: FakeClock
) -> None:
    engine.check({"path": "/short"})
    engine.check({"path": "/short"}, wait=False)
    start = clock.time_ns()
    held = engine.check({"path": "/short"}, wait=True)
    assert (held.allowed, held.action, held.wait) == (True, "allow", 0.0)
    assert clock.time_ns() - start == 200_000_000  # its slot, two intervals on
    after = engine.check({"path": "/short"})  # holding took one slot: the next is 0.1 s on
    assert (after.action, after.wait) == ("queue", 0.1)


def test_the_async_engine_shapes_the_same(clock: FakeClock) -> None:
    engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))

    async def scenario() -> list[tuple[str, float, float]]:
        out: list[tuple[str, float, float]] = []
        for path in ("/video",) * 4 + ("/short",) * 4:
            o = await engine.acheck({"path": path, "ip": "203.0.113.7"})
            out.append((o.action, o.degrade, o.wait))
        start = clock.time_ns()
        clock.advance(0.3)
        await engine.acheck({"path": "/short"})
        held = await engine.acheck({"path": "/short"}, wait=True)
        out.append((held.action, 0.0, (clock.time_ns() - start) / 1e9))
        return out

    assert asyncio.run(scenario()) == [
        ("allow", 0, 0), ("allow", 0, 0), ("degrade", 0.25, 0), ("degrade", 0.5, 0),
        ("allow", 0, 0), ("queue", 0, 0.1), ("queue", 0, 0.2), ("reject", 0, 0),
        ("allow", 0, 0.4),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("rule", "field", "reason"),
    [
        ("{name: a, rate: 1/s, action: degrade, degrade: {full_at: 1}, algorithm: fixed_window}",
         "degrade", "full_at is a multiple"),
        ("{name: a, rate: 1/s, action: degrade, degrade: {full_at: 2}, algorithm: gcra}",
         "degrade", "use fixed_window"),
        ("{name: a, rate: 1/s, action: degrade, degrade: {header: 'bad header'}}", "degrade",
         "bad header name"),
        ("{name: a, rate: 1/s, degrade: {header: true}}", "degrade", "goes with action 'degrade'"),
        ("{name: a, rate: 1/s, action: queue}", "queue", "needs 'queue'"),
        ("{name: a, rate: 1/s, action: queue, queue: 0}", "queue", "queue is 1 to"),
        ("{name: a, rate: 1/s, action: queue, queue: 5, algorithm: fixed_window}", "algorithm",
         "leaky bucket's schedule"),
        ("{name: a, rate: 1/s, action: queue, queue: 5, burst: 3}", "burst", "give 'queue'"),
        ("{name: a, rate: 1/s, action: queue, queue: 5, store: two_tier}", "store", "exact"),
        ("{name: a, rate: 4/s, action: queue, queue: 5, shards: 2}", "shards", "one line"),
        ("{name: a, rate: 1/s, queue: 5}", "queue", "goes with action 'queue'"),
        ("{name: a, rate: 1/s, max_wait: 5}", "max_wait", "'delay' or 'queue'"),
        ("{name: a, rate: 1/s, action: queue, queue: 5, max_wait: 0}", "max_wait", "> 0"),
    ],
)  # fmt: skip
def test_bad_shaping_options_are_named(rule: str, field: str, reason: str) -> None:
    with pytest.raises(RuleFileError) as info:
        loads(f"rules: [{rule}]")
    problems = [(p.field, p.reason) for p in info.value.problems]
    assert any(f == field and reason in r for f, r in problems), problems


def test_a_queue_rule_is_a_leaky_bucket_one_deep_plus_its_line() -> None:
    rules = loads(RULES)
    line = rules.by_name["short-line"].limits[0]
    assert (line.algorithm, line.burst) == ("leaky_bucket", 3)  # max_wait 0.25 s at 10/s: 2
    video = rules.by_name["video"].limits[0]
    assert (str(video.rate), video.degrade_from) == ("6/minute", 2)


PRIORITY = textwrap.dedent("""
    rules:
      - name: export
        rate: 1/second
        algorithm: gcra
        action: delay
        max_wait: 2.5
        priority_from: {attribute: plan, order: [enterprise, pro, free]}
        match: {paths: /export}
""")


def test_delayed_requests_wait_in_priority_classes(clock: FakeClock) -> None:
    engine = AsyncRuleEngine(loads(PRIORITY), AsyncMemoryStore(clock=clock))
    start = clock.time_ns()
    served: list[tuple[str, str, float]] = []

    async def request(name: str, plan: str | None) -> None:
        attributes = {"path": "/export", **({} if plan is None else {"plan": plan})}
        outcome = await engine.acheck(attributes, wait=True)
        served.append((name, outcome.action, (clock.time_ns() - start) / 1e9))

    async def scenario() -> None:
        await engine.acheck({"path": "/export"})  # the permit of t=0
        await asyncio.gather(request("anon", None), request("free", "free"),
                             request("pro", "pro"), request("ent", "enterprise"))  # fmt: skip

    asyncio.run(scenario())
    # enterprise and pro overtake; free and the anonymous caller (below every
    # class listed) cannot be served within max_wait (2.5 s) and are told so
    by_name = {name: (action, t) for name, action, t in served}
    assert by_name["ent"] == ("allow", 1.0)
    assert by_name["pro"] == ("allow", 2.0)
    assert by_name["free"][0] == "reject"
    assert by_name["anon"][0] == "reject"


def test_a_request_cancelled_while_stepping_aside_leaves_the_line_to_its_head(
    clock: FakeClock,
) -> None:
    wake = asyncio.Event()
    asleep = clock.asleep

    async def held_sleep(seconds: float) -> None:  # the head sleeps until told
        await wake.wait()
        await asleep(seconds)

    clock.asleep = held_sleep  # type: ignore[method-assign]
    engine = AsyncRuleEngine(loads(PRIORITY), AsyncMemoryStore(clock=clock))

    def check(plan: str) -> asyncio.Task[Outcome]:
        return asyncio.create_task(engine.acheck({"path": "/export", "plan": plan}, wait=True))

    def free_waits_behind_pro() -> bool:
        return [[e[0] for e in line] for line in engine._lines._queues.values()] == [[-1, 0]]

    async def scenario() -> tuple[Outcome | BaseException, ...]:
        await engine.acheck({"path": "/export"})  # the permit of t=0
        free = check("free")
        await asyncio.sleep(0)  # free holds the line, asleep towards its permit
        pro = check("pro")
        await asyncio.sleep(0)  # pro stands in line behind it
        wake.set()
        while not free_waits_behind_pro():  # free has stepped aside for pro
            await asyncio.sleep(0)
        free.cancel()
        later = check("free")
        return await asyncio.gather(free, pro, later, return_exceptions=True)

    free, pro, later = asyncio.run(scenario())
    assert isinstance(free, asyncio.CancelledError)
    # the line stays pro's until it leaves it: nobody else's turn is torn down
    assert isinstance(pro, Outcome)
    assert pro.action == "allow"
    assert isinstance(later, Outcome)
    assert len(engine._lines) == 0


def test_priority_from_goes_with_delay_and_names_values() -> None:
    for rule, reason in [
        ("{name: a, rate: 1/s, priority_from: {attribute: plan, order: [a]}}", "action 'delay'"),
        ("{name: a, rate: 1/s, action: delay, max_wait: 1,"
         " priority_from: {attribute: plan, order: []}}", "an empty order"),
        ("{name: a, rate: 1/s, action: delay, max_wait: 1,"
         " priority_from: {attribute: plan, order: [a, a]}}", "listed twice"),
    ]:  # fmt: skip
        with pytest.raises(RuleFileError) as info:
            loads(f"rules: [{rule}]")
        assert any(reason in p.reason for p in info.value.problems), info.value.problems
    ranks = loads(PRIORITY).by_name["export"]
    assert [ranks.priority_of({"plan": p}) for p in ("enterprise", "pro", "free", "x")] == [
        2, 1, 0, -1,
    ]  # fmt: skip
    assert ranks.priority_of({}) == -1


def test_the_level_follows_the_limit_in_force() -> None:
    """The level starts where the limiter in force says (its ceiling over full_at),
    so a limit changed at runtime moves it; 1.1 x 100 is a ceiling of 110."""
    rules = loads("rules: [{name: d, rate: 100/minute, algorithm: fixed_window,"
                  " action: degrade, degrade: {full_at: 1.1}}]")  # fmt: skip
    assert str(rules.by_name["d"].limits[0].rate) == "110/minute"
    engine = RuleEngine(rules, MemoryStore(clock=FakeClock(START)))
    levels = [engine.check({}).degrade for _ in range(111)]
    assert levels[99] == 0.0
    assert levels[100] == 0.1
    assert levels[109] == 1.0
    assert levels[110] == 1.0  # beyond the ceiling: still served, fully degraded
