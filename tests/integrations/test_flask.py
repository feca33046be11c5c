"""Flask: the extension and the view decorator; the WSGI middleware around Flask."""

from __future__ import annotations

import math
from typing import Any

import pytest
from flask import Flask, Request, jsonify, request
from flask.testing import FlaskClient

from ratewarden import AsyncMemoryStore, ConfigurationError, FakeClock, MemoryStore
from ratewarden.integrations.flask import RateLimiter, limit
from ratewarden.integrations.wsgi import RateLimitMiddleware
from ratewarden.rules import AsyncRuleEngine, RuleEngine, RuleSet, loads

from .conftest import (
    IDENTIFY_PATHS,
    IDENTIFY_RULES,
    RATE_HEADERS,
    broken_identify,
    expect_unidentified,
    expected_headers,
    state,
)

PEER = {"REMOTE_ADDR": "203.0.113.7"}


def identify(request: Request) -> dict[str, object] | None:
    user = request.headers.get("X-User")
    return {"user": user} if user else None


def make_app(calls: list[str]) -> Flask:
    app = Flask(__name__)

    @app.route("/api/items")
    @app.route("/me")
    @app.route("/busy")
    @app.route("/slow")
    @app.route("/audit")
    @app.route("/free")
    def endpoint() -> Any:
        calls.append(request.path)
        return jsonify(ok=True)

    @app.post("/signup")
    def signup() -> Any:
        calls.append("/signup")
        return jsonify(ok=True)

    return app


def rate_headers(response: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers.items() if k.lower() in RATE_HEADERS}


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def client(engine: RuleEngine, calls: list[str]) -> FlaskClient:
    app = make_app(calls)
    RateLimiter(app, engine, identify=identify)
    return app.test_client()


def test_headers_match_the_limiter_state(
    client: FlaskClient, store: MemoryStore, ruleset: RuleSet
) -> None:
    for remaining in (2, 1, 0):
        response = client.get("/api/items", environ_base=PEER)
        assert response.status_code == 200
        now = state(store, ruleset, "api", "203.0.113.7")
        assert now.remaining == remaining
        assert rate_headers(response) == expected_headers(now, quota=3, window=60)


def test_rejection_and_retry_after_never_early(
    client: FlaskClient, store: MemoryStore, ruleset: RuleSet, clock: FakeClock, calls: list[str]
) -> None:
    for _ in range(3):
        client.get("/api/items", environ_base=PEER)
    refused = client.get("/api/items", environ_base=PEER)
    assert refused.status_code == 429
    assert refused.headers["Content-Type"] == "application/problem+json"
    body = refused.get_json()
    assert body["violated-policies"] == ["api"]
    assert body["status"] == 429
    exact = state(store, ruleset, "api", "203.0.113.7").retry_after
    header = int(refused.headers["Retry-After"])
    assert header == math.ceil(exact)
    start = clock.time_ns()
    clock.advance(exact - 0.001)
    assert client.get("/api/items", environ_base=PEER).status_code == 429
    clock.now_ns = start + header * 1_000_000_000
    assert client.get("/api/items", environ_base=PEER).status_code == 200
    assert calls == ["/api/items"] * 4


def test_actions(client: FlaskClient, clock: FakeClock, calls: list[str]) -> None:
    assert [client.get("/busy").status_code for _ in range(2)] == [200, 503]
    assert client.post("/signup").status_code == 200
    banned = client.post("/signup")
    assert (banned.status_code, banned.get_json()) == (202, {"status": "pending"})
    assert not rate_headers(banned)
    audit = [client.get("/audit") for _ in range(3)]
    assert all(r.status_code == 200 and not rate_headers(r) for r in audit)
    start = clock.time_ns()
    assert [client.get("/slow").status_code for _ in range(2)] == [200, 200]
    assert clock.time_ns() - start == 1_000_000_000  # the second one was held 1 s
    assert calls.count("/signup") == 1


def test_identify_and_forwarded_clients(client: FlaskClient) -> None:
    alice = {"X-User": "alice"}
    assert [client.get("/me", headers=alice).status_code for _ in range(3)] == [200, 200, 429]
    proxy = {"REMOTE_ADDR": "10.0.0.1"}
    one = {"X-Forwarded-For": "198.51.100.1"}
    assert [client.get("/api/items", headers=one, environ_base=proxy).status_code
            for _ in range(4)][-1] == 429  # fmt: skip
    two = {"X-Forwarded-For": "198.51.100.2"}
    assert client.get("/api/items", headers=two, environ_base=proxy).status_code == 200


def test_view_decorator_sees_the_route(clock: FakeClock) -> None:
    ruleset = loads("""
rules:
  - {name: per-route, rate: 2/minute, by: route, match: {attributes: {route: "/items/<int:id>"}}}
""")
    engine = RuleEngine(ruleset, MemoryStore(clock=clock))
    app = Flask(__name__)

    @app.get("/items/<int:id>")
    @limit(engine)
    def item(id: int) -> Any:
        return {"id": id}

    client = app.test_client()
    responses = [client.get(f"/items/{i}") for i in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0].headers["X-RateLimit-Remaining"] == "1"


def test_app_factory_and_checks(engine: RuleEngine, calls: list[str]) -> None:
    limiter = RateLimiter(identify=identify)
    app = make_app(calls)
    limiter.init_app(app, engine)
    assert app.extensions["ratewarden"] is limiter
    with pytest.raises(TypeError, match="needs an engine"):
        RateLimiter(make_app(calls))
    aengine = AsyncRuleEngine(engine.ruleset, AsyncMemoryStore())
    with pytest.raises(ConfigurationError, match="needs a RuleEngine"):
        RateLimiter(make_app(calls), aengine)  # type: ignore[arg-type]


def test_wsgi_middleware_around_flask(
    engine: RuleEngine, store: MemoryStore, ruleset: RuleSet, calls: list[str]
) -> None:
    app = make_app(calls)
    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, engine)  # type: ignore[method-assign]
    client = app.test_client()
    for remaining in (2, 1, 0):
        response = client.get("/api/items", environ_base=PEER)
        now = state(store, ruleset, "api", "203.0.113.7")
        assert now.remaining == remaining
        assert rate_headers(response) == expected_headers(now, quota=3, window=60)
    refused = client.get("/api/items", environ_base=PEER)
    assert refused.status_code == 429
    assert refused.status == "429 Too Many Requests"
    assert refused.get_json()["violated-policies"] == ["api"]
    assert int(refused.headers["Content-Length"]) == len(refused.data)
    assert calls == ["/api/items"] * 3


def test_extension_and_decorator_send_each_header_once(clock: FakeClock) -> None:
    app_rules = loads("rules:\n  - {name: app, rate: 100/minute}\n")
    route_rules = loads("rules:\n  - {name: route, rate: 2/minute}\n")
    store = MemoryStore(clock=clock)
    app = Flask(__name__)
    RateLimiter(app, RuleEngine(app_rules, store))

    @app.get("/x")
    @limit(RuleEngine(route_rules, store))
    def x() -> Any:
        return {"ok": True}

    client = app.test_client()
    for response in [client.get("/x") for _ in range(3)]:  # 200, 200, then the route's 429
        assert response.headers.getlist("X-RateLimit-Limit") == ["2"]  # the route's, once
        assert len(response.headers.getlist("RateLimit")) == 1
    assert response.status_code == 429


@pytest.mark.parametrize("where", ["extension", "decorator"])
def test_an_identify_that_raises_follows_the_rule_policy(
    where: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = RuleEngine(loads(IDENTIFY_RULES), MemoryStore(clock=clock))
    app = Flask(__name__)

    def endpoint() -> Any:
        return jsonify(ok=True)

    if where == "decorator":
        endpoint = limit(engine, identify=broken_identify)(endpoint)
    else:
        RateLimiter(app, engine, identify=broken_identify)
    for path in IDENTIFY_PATHS:
        app.add_url_rule(path, path, endpoint)
    client = app.test_client()
    expect_unidentified(lambda path: client.get(path, environ_base=PEER).status_code, caplog)
