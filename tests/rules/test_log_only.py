"""``action: log_only`` logs what it would deny: one line per rule and key a
period, within a budget of lines, on ``ratewarden.rules`` at WARNING, from the
engine itself (so the middleware and the service log alike)."""

from __future__ import annotations

import asyncio
import logging
import textwrap

import httpx
import pytest

from ratewarden import AsyncMemoryStore, ConfigurationError, FakeClock, MemoryStore
from ratewarden.integrations.asgi import RateLimitMiddleware
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads
from ratewarden.rules._actions import ShadowLog

RULES = textwrap.dedent("""
    rules:
      - name: preview
        rate: 2/minute
        algorithm: fixed_window
        by: user
        action: log_only
      - name: per-user
        rate: 5/minute
        algorithm: fixed_window
        by: user
        match: {paths: /strict}
""")


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ratewarden.rules"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_040)  # the start of a minute: preview's window


@pytest.fixture
def engine(clock: FakeClock) -> RuleEngine:
    return RuleEngine(loads(RULES), MemoryStore(clock=clock))


def test_one_line_per_rule_and_key_a_period(
    engine: RuleEngine, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ratewarden.rules")
    for _ in range(10):
        for user in ("u1", "u2"):
            assert engine.check({"path": "/x", "user": user}).allowed
    records = lines(caplog)
    assert [r.fields["key"] for r in records] == ["u1", "u2"]  # type: ignore[attr-defined]
    first = records[0]
    assert first.levelno == logging.WARNING
    assert first.getMessage() == "log_only rule 'preview' would deny key 'u1' (preview)"
    assert first.fields == {  # type: ignore[attr-defined]
        "event": "log_only", "rule": "preview", "limit": "preview", "key": "u1", "cost": 1,
        "limit_size": 2, "retry_after": 60.0, "degraded": False,
    }  # fmt: skip
    clock.advance(59)  # still within the period: nothing more
    engine.check({"path": "/x", "user": "u1"})
    assert len(lines(caplog)) == 2
    clock.advance(1)  # a new window of the limit and a new period of the log
    for _ in range(3):
        engine.check({"path": "/x", "user": "u1"})
    assert [r.fields["key"] for r in lines(caplog)] == ["u1", "u2", "u1"]  # type: ignore[attr-defined]


def test_allowed_requests_and_enforced_denials_log_nothing(
    engine: RuleEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "ratewarden.rules")
    for user in ("a", "b", "c"):
        for _ in range(2):  # within preview's 2/minute
            assert engine.check({"path": "/x", "user": user}).shadow.allowed  # type: ignore[union-attr]
    assert lines(caplog) == []
    # per-user denies the sixth /strict request: the shadow rules do not count it
    engine2_key = {"path": "/strict", "user": "d"}
    outcomes = [engine.check(engine2_key) for _ in range(6)]
    assert outcomes[-1].allowed is False
    assert outcomes[-1].shadow is None
    assert [r.fields["key"] for r in lines(caplog)] == ["d"]  # type: ignore[attr-defined]


def test_a_flood_of_keys_is_bounded_in_lines_and_memory(
    engine: RuleEngine, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ratewarden.rules")
    engine.shadow_log = ShadowLog(clock, every=60, lines=50)
    for n in range(3000):  # 3000 keys, each over preview's limit
        for _ in range(3):
            engine.check({"path": "/x", "user": f"k{n}"})
    assert len(lines(caplog)) == 50
    assert len(engine.shadow_log) == 50
    clock.advance(60)
    engine.check({"path": "/x", "user": "k0"})  # k0 over its limit again, in a new period
    engine.check({"path": "/x", "user": "k0"})
    engine.check({"path": "/x", "user": "k0"})
    records = lines(caplog)[50:]
    assert [r.fields["event"] for r in records] == ["log_only_suppressed", "log_only"]  # type: ignore[attr-defined]
    assert records[0].fields["suppressed"] == 2950  # type: ignore[attr-defined]
    assert "2950 more" in records[0].getMessage()
    assert len(engine.shadow_log) == 1  # the last period's pairs are forgotten
    assert "1 remembered" in repr(engine.shadow_log)


def test_a_key_cannot_forge_a_line(engine: RuleEngine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ratewarden.rules")
    for _ in range(3):
        engine.check({"path": "/x", "user": "u\nERROR forged"})
    (record,) = lines(caplog)
    assert "\n" not in record.getMessage()


def test_the_async_engine_logs_the_same(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ratewarden.rules")
    engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))

    async def main() -> None:
        for _ in range(5):
            assert (await engine.acheck({"path": "/x", "user": "u1"})).allowed

    asyncio.run(main())
    assert [r.fields["key"] for r in lines(caplog)] == ["u1"]  # type: ignore[attr-defined]


def test_the_middleware_logs_through_the_engine(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ratewarden.rules")
    engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))

    async def app(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    wrapped = RateLimitMiddleware(app, engine, identify=lambda scope: {"user": "m1"})

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=wrapped)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [(await client.get("/x")).status_code for _ in range(4)]

    assert asyncio.run(main()) == [200] * 4
    assert [r.fields["key"] for r in lines(caplog)] == ["m1"]  # type: ignore[attr-defined]


def test_bad_settings_are_refused(clock: FakeClock) -> None:
    with pytest.raises(ConfigurationError, match="every"):
        ShadowLog(clock, every=0)
    with pytest.raises(ConfigurationError, match="lines"):
        ShadowLog(clock, lines=0)
