"""A request whose caller could not be identified: each rule that needs the
identity answers as its on_failure says, the others apply as usual."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.rules import AsyncRuleEngine, Outcome, RuleEngine, loads

RULES = textwrap.dedent("""
    rules:
      - name: private
        rate: 5/minute
        by: user
        on_failure: fail_closed
        status: 503
        match: {paths: /private*}
      - name: me
        rate: 1/minute
        by: user
        on_failure: fail_open
        match: {paths: /me}
      - name: api
        rate: 2/minute
        algorithm: fixed_window
        by: ip
        match: {paths: "/api*"}
      - name: paid
        rate: 5/minute
        by: ip
        on_failure: fail_closed
        match: {paths: /paid, attributes: {plan: pro}}
      - name: writes
        rate: 5/minute
        by: user
        on_failure: fail_closed
        match: {paths: /items, methods: POST}
      - name: keyed
        rate: 5/minute
        by: header:x-api-key
        on_failure: fail_closed
        match: {paths: /keyed}
      - name: signup
        rate: 1/minute
        by: user
        action: shadow_ban
        on_failure: fail_closed
        response: {status: 202, body: '{"status": "pending"}'}
        match: {paths: /signup}
      - name: slow
        rate: 1/second
        algorithm: gcra
        by: user
        action: delay
        max_wait: 5
        on_failure: fail_closed
        match: {paths: /slow}
      - name: audit
        rate: 1/minute
        by: user
        action: log_only
        on_failure: fail_closed
        match: {paths: /audit}
      - name: secret
        rate: 5/minute
        by: user
        on_failure: fail_closed
        match: {paths: /api/secret}
      - name: admin-by-ip
        group: admin
        priority: 10
        rate: 5/minute
        by: ip
        match: {paths: /admin}
      - name: admin-by-user
        group: admin
        rate: 5/minute
        by: user
        on_failure: fail_closed
        match: {paths: /admin}
""")


def request(path: str, method: str = "GET") -> dict[str, object]:
    return {"method": method, "path": path, "ip": "203.0.113.7", "headers": {}}


@pytest.fixture
def engine() -> RuleEngine:
    return RuleEngine(loads(RULES), MemoryStore(clock=FakeClock(1_700_000_000.0)))


def test_a_fail_closed_rule_that_needs_the_user_refuses_with_its_status(
    engine: RuleEngine,
) -> None:
    outcome = engine.unidentified(request("/private/report"))
    assert (outcome.allowed, outcome.action, outcome.status) == (False, "reject", 503)
    assert outcome.rule is not None
    assert outcome.rule.name == "private"
    assert outcome.decision is not None
    assert outcome.decision.degraded
    assert outcome.decision.rule == "private"
    assert outcome.retry_after == 1.0
    # degraded, as when the store cannot count: no counts to show, a retry soon
    assert outcome.headers() == [("Retry-After", "1")]


def test_a_fail_open_rule_lets_it_through_and_the_others_still_count(
    engine: RuleEngine,
) -> None:
    assert all(engine.unidentified(request("/me")).allowed for _ in range(3))
    statuses = [engine.unidentified(request("/api/items")).status for _ in range(3)]
    assert statuses == [200, 200, 429]  # by ip: no identity needed


def test_a_refusal_counts_nowhere(engine: RuleEngine) -> None:
    # /api/secret is under the api rule too, which a refused request leaves alone
    assert not engine.unidentified(request("/api/secret")).allowed
    decision = engine.check(request("/api/a")).decision
    assert decision is not None
    assert decision.remaining == 1


@pytest.mark.parametrize(
    ("path", "method", "refused_by"),
    [
        ("/paid", "GET", "paid"),  # matches on the plan: it might apply
        ("/items", "POST", "writes"),
        ("/items", "GET", None),  # its method does not match
        ("/public", "GET", None),  # no path of a fail_closed rule
        ("/keyed", "GET", None),  # a header is the request's own: applies as usual
        ("/audit", "GET", None),  # log_only never refuses
        ("/admin", "GET", None),  # the by-ip rule ranks first in the group, and applies
    ],
)
def test_only_the_rules_that_could_apply_refuse(
    engine: RuleEngine, path: str, method: str, refused_by: str | None
) -> None:
    outcome = engine.unidentified(request(path, method))
    assert outcome.allowed is (refused_by is None)
    assert (outcome.rule.name if outcome.rule and not outcome.allowed else None) == refused_by


def test_a_shadow_ban_rule_answers_with_its_response(engine: RuleEngine) -> None:
    outcome = engine.unidentified(request("/signup"))
    assert (outcome.action, outcome.status) == ("shadow_ban", 202)
    assert outcome.response is not None
    assert outcome.response.body == '{"status": "pending"}'


def test_a_delay_rule_refuses_at_once_instead_of_holding(engine: RuleEngine) -> None:
    outcome = engine.unidentified(request("/slow"), wait=True)
    assert (outcome.allowed, outcome.action, outcome.status) == (False, "reject", 429)
    assert engine.store.clock.time_ns() == 1_700_000_000 * 10**9  # nothing waited


def test_check_still_skips_a_rule_without_its_attribute(engine: RuleEngine) -> None:
    # an anonymous caller (identify said None) is not a failure
    assert engine.check(request("/private/report")).allowed


def test_a_reload_is_seen(engine: RuleEngine) -> None:
    assert not engine.unidentified(request("/private")).allowed
    engine.use(loads(RULES.replace("on_failure: fail_closed\n    status: 503", "status: 503")))
    assert engine.unidentified(request("/private")).allowed


def test_the_async_engine_answers_alike() -> None:
    engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=FakeClock(1_700_000_000.0)))

    async def run() -> list[Outcome]:
        return [await engine.aunidentified(request(p), wait=True) for p in ("/private", "/me")]

    private, me = asyncio.run(run())
    assert (private.allowed, private.status, me.allowed) == (False, 503, True)
