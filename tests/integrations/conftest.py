"""One rule file for every framework's tests, engines on a FakeClock, and the
limiter state the headers must agree with."""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Callable, Mapping

import pytest

from ratewarden import AsyncMemoryStore, Decision, FakeClock, Limiter, MemoryStore
from ratewarden.rules import AsyncRuleEngine, RuleEngine, RuleSet, loads

RULES = textwrap.dedent("""
    client_ip: {trusted_proxies: [10.0.0.0/8]}
    rules:
      - name: api
        rate: 3/minute
        algorithm: fixed_window
        by: ip
        match: {paths: "/api*"}
      - name: me
        rate: 2/minute
        algorithm: fixed_window
        by: user
        match: {paths: /me}
      - name: busy
        rate: 1/minute
        status: 503
        match: {paths: /busy}
      - name: slow
        rate: 1/second
        algorithm: gcra
        action: delay
        max_wait: 1.5
        match: {paths: /slow}
      - name: signup
        rate: 1/minute
        by: ip
        action: shadow_ban
        response: {status: 202, body: '{"status": "pending"}', headers: {X-Queue: signup}}
        match: {paths: /signup, methods: POST}
      - name: audit
        rate: 1/minute
        by: ip
        action: log_only
        match: {paths: /audit}
      - name: heavy
        rate: 10/minute
        algorithm: token_bucket
        cost: {attribute: body_size}
        match: {paths: /upload}
""")

# Not on a window edge: Reset and Retry-After have fractions to round.
START = 1_700_000_010.25


@pytest.fixture
def ruleset() -> RuleSet:
    return loads(RULES)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def astore(clock: FakeClock) -> AsyncMemoryStore:
    return AsyncMemoryStore(clock=clock)


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def aengine(ruleset: RuleSet, astore: AsyncMemoryStore) -> AsyncRuleEngine:
    return AsyncRuleEngine(ruleset, astore)


@pytest.fixture
def engine(ruleset: RuleSet, store: MemoryStore) -> RuleEngine:
    return RuleEngine(ruleset, store)


def state(store: MemoryStore | AsyncMemoryStore, ruleset: RuleSet, name: str, key: str) -> Decision:
    """What limit ``name`` holds for ``key`` now: a limiter with the same name and
    limit on the same store shares the rule's counters."""
    spec = ruleset.by_limit_name[name].limits[0]
    sync = store.sync if isinstance(store, AsyncMemoryStore) else store
    limiter = Limiter(
        spec.rate, store=sync, algorithm=spec.algorithm, burst=spec.burst,
        refill=spec.refill, name=spec.name,
    )  # fmt: skip
    return limiter.peek(key)


def expected_headers(decision: Decision, quota: int, window: int) -> dict[str, str]:
    """The rate-limit headers for ``decision``, written out by hand."""
    reset = math.ceil(decision.reset_after)
    name = decision.rule
    return {
        "x-ratelimit-limit": str(decision.limit),
        "x-ratelimit-remaining": str(decision.remaining),
        "x-ratelimit-reset": str(reset),
        "ratelimit-policy": f'"{name}";q={quota};w={window}',
        "ratelimit": f'"{name}";r={decision.remaining};t={reset}',
    }


RATE_HEADERS = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
                "ratelimit-policy", "ratelimit", "retry-after")  # fmt: skip


# For an identify that raises: a rule that needs the user and fails closed, one
# that fails open, and one by ip that needs no identity.
IDENTIFY_RULES = textwrap.dedent("""
    rules:
      - {name: private, rate: 5/minute, by: user, on_failure: fail_closed, status: 503,
         match: {paths: /private}}
      - {name: me, rate: 1/minute, by: user, on_failure: fail_open, match: {paths: /me}}
      - {name: api, rate: 2/minute, algorithm: fixed_window, by: ip, match: {paths: "/api*"}}
""")
IDENTIFY_PATHS = ("/private", "/me", "/api/items")


def broken_identify(request: object) -> Mapping[str, object]:
    raise LookupError("the session store is down")


def expect_unidentified(status_of: Callable[[str], int], caplog: pytest.LogCaptureFixture) -> None:
    """What a front end answers while ``identify`` raises (``status_of(path)`` sends a
    GET): the fail_closed rule refuses with its status, the fail_open one lets
    every request through, the ip rule counts as usual, never a 500; one log line
    with the traceback for the seven failures."""
    caplog.set_level(logging.ERROR, "ratewarden.integrations")
    assert status_of("/private") == 503
    assert [status_of("/me") for _ in range(3)] == [200, 200, 200]
    assert [status_of("/api/items") for _ in range(3)] == [200, 200, 429]
    lines = [r for r in caplog.records if "identify raised LookupError" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert lines[0].exc_info is not None
    assert "session store is down" in caplog.text
