"""Runtime overrides on the memory store: what they replace, for how long, on
the engine's clock, and what they refuse."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ratewarden import ConfigurationError
from ratewarden._clock import FakeClock
from ratewarden.rules import AsyncRuleEngine, RuleEngine, RuntimeOverride, UnknownRule, loads
from ratewarden.rules.overrides import AUDIT_KEPT, parse_duration
from ratewarden.stores import AsyncMemoryStore, MemoryStore

RULES = """
rules:
  - name: api
    match: {paths: "/api/*"}
    rate: 2/minute
    algorithm: fixed_window
    by: user
  - name: tiers
    match: {paths: /t}
    rate: [1/second, 5/hour]
    algorithm: fixed_window
"""
API: dict[str, object] = {"path": "/api/x", "user": "u"}


def engine(clock: FakeClock | None = None) -> RuleEngine:
    # a minute boundary, so that fixed windows do not roll inside a test
    return RuleEngine(loads(RULES), MemoryStore(clock=clock or FakeClock(1_700_000_040.0)))


def admitted(e: RuleEngine, attributes: dict[str, object], n: int) -> int:
    return sum(e.check(attributes).allowed for _ in range(n))


def test_an_override_replaces_the_rate_until_it_expires() -> None:
    clock = FakeClock(1_700_000_040.0)  # 00:40 in a minute: the window ends at +20 s
    e = engine(clock)
    assert admitted(e, API, 5) == 2
    override = e.set_override("api", "5/minute", duration="10s", reason="incident 42", by="alice")
    assert override == RuntimeOverride(
        "api", ("5/minute",), ("2/minute",), "incident 42", "alice",
        1_700_000_040.0, 1_700_000_050.0, 10.0,
    )  # fmt: skip
    # the override counts afresh: five more in this window
    assert admitted(e, API, 8) == 5
    decision = e.check(API).decision
    assert decision is not None
    assert decision.limit == 5
    clock.advance(10)  # it ends: the rule's own counters, kept all along, apply again
    assert admitted(e, API, 3) == 0
    decision = e.check(API).decision
    assert decision is not None
    assert decision.limit == 2
    assert e.list_overrides() == []


def test_an_override_names_the_rule_in_decisions_and_keeps_its_action() -> None:
    e = engine()
    e.set_override("api", "1/minute", duration=60, reason="r")
    assert e.check(API).allowed
    outcome = e.check(API)
    assert not outcome.allowed
    assert outcome.rule is not None
    assert outcome.rule.name == "api"
    assert outcome.status == 429
    assert outcome.headers()


def test_one_tier_of_several_is_replaced_by_its_window() -> None:
    clock = FakeClock(1_700_000_040.0)
    e = engine(clock)
    t: dict[str, object] = {"path": "/t"}
    e.set_override("tiers", ["3/second"], duration=60, reason="r")
    assert admitted(e, t, 10) == 3  # the hourly tier (5) still counts under it
    clock.advance(1)
    assert admitted(e, t, 10) == 2  # 5/hour is what is left
    overrides = e.list_overrides()
    assert overrides[0].limits == ("3/second",)
    assert overrides[0].replaces == ("1/second", "5/hour")


@pytest.mark.parametrize(
    ("rule", "limits", "message"),
    [
        ("nope", "5/minute", "no rule named 'nope'"),
        ("tiers", "5/minute", "5/minute has none of their windows"),
        ("tiers", ["2/second", "3/second"], "two rates given for the window of 1/second"),
        ("api", ["1/second", "5/minute"], r"has one rate \(2/minute\): give one rate, not 2"),
        ("api", [], "at least one rate"),
        ("api", "five per minute", "rate"),
        ("api", [5], "a rate is text"),
        ("api", "0/minute", "limit"),
    ],
)
def test_an_override_that_cannot_apply_is_refused(rule: str, limits: object, message: str) -> None:
    e = engine()
    with pytest.raises(ConfigurationError, match=message) as caught:
        e.set_override(rule, limits, duration=60, reason="r")  # type: ignore[arg-type]
    assert isinstance(caught.value, UnknownRule) == (rule == "nope")
    assert e.list_overrides() == []
    assert e.override_audit() == []


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [(90, 90.0), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("1h30m", 5400.0), ("2d", 172800.0)],
)
def test_durations(duration: object, seconds: float) -> None:
    assert parse_duration(duration) == seconds


@pytest.mark.parametrize(
    "duration", [0, 0.5, "0s", "31d", "-5", "30 minutes", "m", True, None, "nan"]
)
def test_bad_durations_are_refused(duration: object) -> None:
    with pytest.raises(ConfigurationError, match=r"duration|lasts"):
        parse_duration(duration)


@pytest.mark.parametrize(
    ("reason", "by", "message"),
    [("", "", "reason is required"), ("  ", "", "reason is required"),
     ("x" * 501, "", "longer than 500"), ("two\nlines", "", "one line"),
     ("ok", "y" * 201, "by is longer"), ("ok", "\x1b[31m", "one line")],
)  # fmt: skip
def test_reason_and_author_are_checked(reason: str, by: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        engine().set_override("api", "5/minute", duration=60, reason=reason, by=by)


def test_clear_ends_an_override_now_and_the_audit_says_what_happened() -> None:
    clock = FakeClock(1_700_000_040.0)
    e = engine(clock)
    e.set_override("api", "5/minute", duration=600, reason="first", by="a")
    clock.advance(1)
    second = e.set_override("api", "7/minute", duration=600, reason="second", by="b")
    assert second.replaces == ("5/minute",)  # the override it replaced, not the file's rate
    clock.advance(1)
    assert e.clear_override("api", reason="over", by="c")
    assert not e.clear_override("api", reason="again")  # nothing in force: nothing recorded
    assert admitted(e, API, 5) == 2
    audit = e.override_audit()
    assert [(a.action, a.limits, a.replaces, a.reason, a.by) for a in audit] == [
        ("clear", ("2/minute",), ("7/minute",), "over", "c"),
        ("set", ("7/minute",), ("5/minute",), "second", "b"),
        ("set", ("5/minute",), ("2/minute",), "first", "a"),
    ]
    assert audit[0].at == 1_700_000_042.0


def test_the_audit_trail_is_bounded() -> None:
    e = engine()
    for n in range(AUDIT_KEPT + 20):
        e.set_override("api", f"{n + 1}/minute", duration=60, reason=f"r{n}")
    audit = e.override_audit(1000)
    assert len(audit) == AUDIT_KEPT
    assert audit[0].reason == f"r{AUDIT_KEPT + 19}"
    assert len(e.override_audit(3)) == 3
    with pytest.raises(ConfigurationError, match="count"):
        e.override_audit(0)


def test_a_reload_keeps_overrides_and_a_rule_that_goes_away_loses_its_own(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    e = RuleEngine(path, MemoryStore(clock=FakeClock(1_700_000_040.0)))
    e.set_override("api", "5/minute", duration=600, reason="r")
    path.write_text(RULES.replace("2/minute", "3/minute"))
    e.reload()
    assert admitted(e, API, 9) == 5  # the file changed under it: the override still rules
    path.write_text(
        RULES.split("  - name: tiers", maxsplit=1)[0].replace("name: api", "name: other")
    )
    e.reload()
    assert e._view.problems == ("override of 'api' ignored: no rule of that name here",)
    with pytest.raises(UnknownRule):
        e.set_override("api", "5/minute", duration=60, reason="r")


def test_overrides_can_be_turned_off() -> None:
    e = RuleEngine(loads(RULES), MemoryStore(), overrides=False)
    with pytest.raises(ConfigurationError, match="overrides=False"):
        e.set_override("api", "5/minute", duration=60, reason="r")


def test_the_async_engine_is_the_twin() -> None:
    async def main() -> None:
        clock = FakeClock(1_700_000_040.0)
        e = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))
        await e.astart()
        override = await e.aset_override("api", ["4/minute"], duration=5, reason="r", by="me")
        assert override.limits == ("4/minute",)
        assert sum([(await e.acheck(API)).allowed for _ in range(6)]) == 4
        assert [o.rule for o in await e.alist_overrides()] == ["api"]
        clock.advance(5)
        # 2/minute again, on the rule's own counters, which the override left alone
        assert sum([(await e.acheck(API)).allowed for _ in range(3)]) == 2
        assert await e.alist_overrides() == []
        assert not await e.aclear_override("api", reason="late")
        assert [a.action for a in await e.aoverride_audit()] == ["set"]
        await e.aclose()

    asyncio.run(main())


def test_the_headers_show_the_limit_in_force() -> None:
    e = engine()
    e.set_override("api", "5/minute", duration=60, reason="r")
    headers = dict(e.check(API).headers())
    assert headers["X-RateLimit-Limit"] == "5"
    assert headers["RateLimit-Policy"] == '"api";q=5;w=60'
    assert e.check(API).limits[0].limit.rate.limit == 5
    e.clear_override("api")
    assert dict(e.check(API).headers())["RateLimit-Policy"] == '"api";q=2;w=60'
