"""One rule file for every framework's tests, engines on a FakeClock, and the
limiter state the headers must agree with."""

from __future__ import annotations

import math
import textwrap

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
