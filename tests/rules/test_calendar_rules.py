"""``calendar:`` in a rule file: a month, week, day or year of a time zone,
checked when the file loads and counted from local midnight."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from ratewarden import FakeClock, MemoryStore
from ratewarden.cli import main
from ratewarden.rules import RuleEngine, RuleFileError, loads
from tests.redis_server import LIVE, RedisServer

BERLIN = ZoneInfo("Europe/Berlin")


def test_a_monthly_quota_resets_at_local_midnight_on_the_first() -> None:
    rules = loads("""
        rules:
          - name: monthly
            rate: 3/month
            by: org
            calendar: {tz: Europe/Berlin}
    """)
    at = datetime(2024, 1, 31, 23, 0, tzinfo=BERLIN).timestamp()
    clock = FakeClock(at)
    engine = RuleEngine(rules, MemoryStore(clock=clock))
    assert [engine.check({"org": "acme"}).allowed for _ in range(4)] == [True] * 3 + [False]
    denied = engine.check({"org": "acme"})
    assert denied.retry_after == pytest.approx(3600)  # midnight in Berlin, not a rolling 30 days
    headers = dict(denied.headers())
    assert headers["Retry-After"] == "3600"
    assert headers["X-RateLimit-Reset"] == "3600"
    clock.advance(3600)
    fresh = engine.check({"org": "acme"})
    assert fresh.allowed
    assert fresh.decision is not None
    assert fresh.decision.reset_after == pytest.approx(29 * 86400)  # February 2024: 29 days


def test_every_problem_of_a_calendar_is_said_with_its_line() -> None:
    with pytest.raises(RuleFileError) as raised:
        loads("""
            rules:
              - name: zone
                rate: 3/month
                calendar: {tz: Europe/Berln}
              - name: hourly
                rate: 3/hour
                calendar: {tz: UTC}
              - name: bucket
                rate: 3/day
                algorithm: gcra
                calendar: {tz: UTC}
              - name: week
                rate: 3/week
                calendar: {tz: UTC, week_start: sonday}
        """)
    text = str(raised.value)
    assert "rule 'zone', field 'calendar': unknown time zone 'Europe/Berln';" in text
    assert "did you mean 'Europe/Berlin'?" in text
    assert "rule 'hourly', field 'rate': a calendar limit counts per day, week, month" in text
    assert "rule 'bucket', field 'calendar': a calendar counts in fixed windows" in text
    assert "rule 'week', field 'calendar': week_start is a weekday's name" in text
    assert "did you mean 'sunday'?" in text


def test_check_config_names_the_closest_zone(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path  # noqa: PLC0415

    assert isinstance(tmp_path, Path)
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: m, rate: 5/month, calendar: {tz: America/New_Yrok}}]\n")
    assert main(["check-config", str(path)]) == 1
    assert "did you mean 'America/New_York'?" in capsys.readouterr().err


def test_a_calendar_rule_on_redis_counts_to_local_midnight(redis_single: RedisServer) -> None:
    """The same rule on Redis: the server's time (here the explicit test clock)
    picks the period, the headers point at midnight in Berlin."""
    from ratewarden.stores.redis import RedisStore  # noqa: PLC0415

    rules = loads("""
        rules:
          - name: monthly
            rate: 3/month
            by: org
            calendar: {tz: Europe/Berlin}
    """)
    clock = FakeClock(datetime(2024, 1, 31, 23, 0, tzinfo=BERLIN).timestamp())
    with RedisStore(redis_single.url, timeout=LIVE, clock=clock) as store:
        engine = RuleEngine(rules, store)
        org = {"org": f"acme-{id(engine)}"}
        assert [engine.check(org).allowed for _ in range(4)] == [True] * 3 + [False]
        headers = dict(engine.check(org).headers())
        assert (headers["Retry-After"], headers["X-RateLimit-Reset"]) == ("3600", "3600")
        clock.advance(3600)
        fresh = engine.check(org)
        assert fresh.allowed
        assert fresh.decision is not None
        assert fresh.decision.reset_after == pytest.approx(29 * 86400)  # February 2024


def test_check_config_shows_the_calendar(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path  # noqa: PLC0415

    assert isinstance(tmp_path, Path)
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: m, rate: 5/month, calendar: {tz: Europe/Berlin}}]\n")
    assert main(["check-config", str(path)]) == 0
    assert "fixed_window calendar=Europe/Berlin" in capsys.readouterr().out
    assert main(["check-config", str(path), "--json"]) == 0
    shown = capsys.readouterr().out
    assert '"calendar": {' in shown
    assert '"tz": "Europe/Berlin"' in shown


def test_a_calendar_under_a_two_tier_default_is_refused_when_the_file_loads() -> None:
    with pytest.raises(RuleFileError, match="no adaptive, shards or two_tier"):
        loads("""
            defaults: {store: two_tier}
            rules: [{name: m, rate: 5/month, calendar: {tz: UTC}}]
        """)
