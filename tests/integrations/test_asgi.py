"""The ASGI middleware in a real Starlette app, through Starlette's TestClient."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket

from ratewarden import (
    AsyncLimiter,
    AsyncMemoryStore,
    ConfigurationError,
    FakeClock,
    Limiter,
    MemoryStore,
)
from ratewarden.integrations.asgi import RateLimitMiddleware, Scope
from ratewarden.integrations.asgi import scope_headers as headers_of
from ratewarden.rules import AsyncRuleEngine, RuleEngine, RuleSet, loads
from ratewarden.stores.redis import AsyncRedisStore

from .conftest import (
    IDENTIFY_RULES,
    RATE_HEADERS,
    broken_identify,
    expect_unidentified,
    expected_headers,
    state,
)

PROBLEM = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def identify(scope: Scope) -> Mapping[str, object] | None:
    user = headers_of(scope).get("x-user")
    return {"user": user} if user else None


def make_app(engine: AsyncRuleEngine, calls: list[str], **options: Any) -> Starlette:
    async def endpoint(request: Request) -> Response:
        calls.append(request.url.path)
        return JSONResponse({"ok": True})

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    paths = ["/api/items", "/me", "/busy", "/slow", "/audit", "/upload", "/free"]
    routes: list[Any] = [Route(p, endpoint, methods=["GET", "POST"]) for p in paths]
    routes += [Route("/signup", endpoint, methods=["POST"]), WebSocketRoute("/ws", ws)]
    options.setdefault("identify", identify)
    middleware = [Middleware(RateLimitMiddleware, engine=engine, **options)]
    return Starlette(routes=routes, middleware=middleware)


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def client(aengine: AsyncRuleEngine, calls: list[str]) -> Iterator[TestClient]:
    with TestClient(make_app(aengine, calls), client=("203.0.113.7", 5000)) as client:
        yield client


def rate_headers(response: Any) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k in RATE_HEADERS}


def test_headers_on_every_response_match_the_limiter_state(
    client: TestClient, astore: AsyncMemoryStore, ruleset: RuleSet
) -> None:
    for remaining in (2, 1, 0):
        response = client.get("/api/items")
        assert response.status_code == 200
        now = state(astore, ruleset, "api", "203.0.113.7")
        assert now.remaining == remaining
        assert rate_headers(response) == expected_headers(now, quota=3, window=60)


def test_a_rejection_is_a_problem_with_retry_after(
    client: TestClient, astore: AsyncMemoryStore, ruleset: RuleSet, calls: list[str]
) -> None:
    for _ in range(3):
        client.get("/api/items")
    response = client.get("/api/items")
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/problem+json"
    now = state(astore, ruleset, "api", "203.0.113.7")
    assert not now.allowed
    expected = expected_headers(now, quota=3, window=60)
    expected["retry-after"] = str(math.ceil(now.retry_after))
    assert rate_headers(response) == expected
    assert response.json() == {
        "type": PROBLEM,
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "detail": f"over the limit of 3; retry in {expected['retry-after']} s",
        "violated-policies": ["api"],
    }
    assert calls == ["/api/items"] * 3  # the app never saw the fourth


def test_retry_after_is_never_early(
    client: TestClient, clock: FakeClock, astore: AsyncMemoryStore, ruleset: RuleSet
) -> None:
    for _ in range(3):
        client.get("/api/items")
    denied = client.get("/api/items")
    exact = state(astore, ruleset, "api", "203.0.113.7").retry_after
    header = int(denied.headers["retry-after"])
    assert header - 1 < exact <= header  # whole seconds, rounded up
    start = clock.time_ns()
    clock.advance(exact - 0.001)
    assert client.get("/api/items").status_code == 429  # just before: still denied
    clock.now_ns = start + header * 1_000_000_000
    assert client.get("/api/items").status_code == 200  # at Retry-After: passes


def test_a_rule_may_answer_503(client: TestClient) -> None:
    assert client.get("/busy").status_code == 200
    response = client.get("/busy")
    assert response.status_code == 503
    assert response.json()["status"] == 503
    assert response.json()["violated-policies"] == ["busy"]


def test_identify_supplies_the_user(client: TestClient) -> None:
    alice, bob = {"x-user": "alice"}, {"x-user": "bob"}
    assert [client.get("/me", headers=alice).status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/me", headers=bob).status_code == 200
    assert "x-ratelimit-limit" not in client.get("/me").headers  # anonymous: no rule applies


def test_async_identify(aengine: AsyncRuleEngine, calls: list[str]) -> None:
    async def lookup(scope: Scope) -> Mapping[str, object]:
        return {"user": "carol"}

    with TestClient(make_app(aengine, calls, identify=lookup)) as client:
        statuses = [client.get("/me").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


def test_clients_behind_a_trusted_proxy_are_told_apart(
    aengine: AsyncRuleEngine, calls: list[str]
) -> None:
    with TestClient(make_app(aengine, calls), client=("10.0.0.1", 1234)) as proxy:
        one = {"x-forwarded-for": "198.51.100.1"}
        two = {"x-forwarded-for": "6.6.6.6, 198.51.100.2"}  # the left hop is the client's word
        assert [proxy.get("/api/items", headers=one).status_code for _ in range(4)][-1] == 429
        assert proxy.get("/api/items", headers=two).status_code == 200


def test_shadow_ban_answers_the_rule_response_without_the_app(
    client: TestClient, calls: list[str]
) -> None:
    assert client.post("/signup").status_code == 200
    banned = client.post("/signup")
    assert banned.status_code == 202
    assert banned.json() == {"status": "pending"}
    assert banned.headers["x-queue"] == "signup"
    assert banned.headers["content-type"] == "application/json"
    assert not set(rate_headers(banned))  # nothing tells the client it is limited
    assert calls == ["/signup"]


def test_log_only_counts_and_shows_nothing(
    client: TestClient, astore: AsyncMemoryStore, ruleset: RuleSet, calls: list[str]
) -> None:
    responses = [client.get("/audit") for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert all(not rate_headers(r) for r in responses)
    assert calls == ["/audit"] * 3
    assert state(astore, ruleset, "audit", "203.0.113.7").remaining == 0  # it counted


def test_delay_holds_the_request_on_the_clock_then_passes(
    client: TestClient, clock: FakeClock, calls: list[str]
) -> None:
    assert client.get("/slow").status_code == 200
    start = clock.time_ns()
    response = client.get("/slow")  # 1/second: held one second (FakeClock sleeps at once)
    assert response.status_code == 200
    assert (clock.time_ns() - start) / 1e9 == pytest.approx(1.0)
    assert calls == ["/slow", "/slow"]


def test_delay_longer_than_max_wait_is_rejected(
    aengine: AsyncRuleEngine, clock: FakeClock, calls: list[str]
) -> None:
    ruleset = loads("""
rules:
  - {name: slow, rate: 1/10s, algorithm: gcra, action: delay, max_wait: 1.5, match: {paths: /slow}}
""")
    engine = AsyncRuleEngine(ruleset, AsyncMemoryStore(clock=clock))
    with TestClient(make_app(engine, calls)) as client:
        assert client.get("/slow").status_code == 200
        response = client.get("/slow")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "10"
    assert calls == ["/slow"]


def test_cost_from_the_body_size(client: TestClient) -> None:
    assert client.post("/upload", content=b"x" * 8).status_code == 200
    response = client.post("/upload", content=b"x" * 3)
    assert response.status_code == 429  # 8 + 3 > 10
    assert client.post("/upload", content=b"x" * 2).status_code == 200


@pytest.mark.parametrize("mode", ["denied", "none"])
def test_header_modes(aengine: AsyncRuleEngine, calls: list[str], mode: str) -> None:
    with TestClient(make_app(aengine, calls, headers=mode)) as client:
        allowed = [client.get("/api/items") for _ in range(3)]
        denied = client.get("/api/items")
    assert all(not rate_headers(r) for r in allowed)
    shown = set(rate_headers(denied))
    assert shown == ({"retry-after"} if mode == "none" else set(RATE_HEADERS))


def test_legacy_and_ietf_fields_can_be_left_out(aengine: AsyncRuleEngine, calls: list[str]) -> None:
    with TestClient(make_app(aengine, calls, legacy=False)) as client:
        assert set(rate_headers(client.get("/api/items"))) == {"ratelimit", "ratelimit-policy"}
    with TestClient(make_app(aengine, calls, ietf=False)) as client:
        assert set(rate_headers(client.get("/api/items"))) == {
            "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
        }  # fmt: skip


def test_websockets_and_lifespan_pass_through(client: TestClient) -> None:
    for _ in range(5):
        with client.websocket_connect("/ws") as ws:
            assert ws.receive_text() == "hello"


def test_a_request_no_rule_applies_to_is_untouched(client: TestClient) -> None:
    response = client.get("/free")
    assert response.status_code == 200
    assert not rate_headers(response)


class BrokenStore(AsyncMemoryStore):
    async def hit_tiers(self, checks: Any, shadow: Any) -> Any:  # what the engine calls
        raise RuntimeError("the limiter broke")


def test_a_broken_limiter_never_becomes_a_500(
    ruleset: RuleSet, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    engine = AsyncRuleEngine(ruleset, BrokenStore(clock=FakeClock()))
    with (
        caplog.at_level(logging.ERROR, "ratewarden.integrations"),
        TestClient(make_app(engine, calls)) as client,
    ):
        response = client.get("/api/items")
    assert response.status_code == 200
    assert not rate_headers(response)
    assert "request goes through unchecked" in caplog.text


def test_a_sync_memory_engine_works_under_asgi(
    engine: RuleEngine, store: MemoryStore, ruleset: RuleSet, clock: FakeClock, calls: list[str]
) -> None:
    """Checked inline (a memory store never blocks); a delay sleeps on a worker thread."""
    app = make_app(engine, calls)  # type: ignore[arg-type]
    with TestClient(app, client=("203.0.113.7", 5000)) as client:
        responses = [client.get("/api/items") for _ in range(3)]
        now = state(store, ruleset, "api", "203.0.113.7")
        assert client.get("/api/items").status_code == 429
        start = clock.time_ns()
        slow = [client.get("/slow").status_code for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert rate_headers(responses[2]) == expected_headers(now, quota=3, window=60)
    assert slow == [200, 200]
    assert clock.time_ns() - start == 1_000_000_000


def test_anything_but_an_engine_is_refused(aengine: AsyncRuleEngine) -> None:
    async def app(scope: Scope, receive: Callable[[], Awaitable[Any]], send: Any) -> None:
        raise AssertionError

    with pytest.raises(ConfigurationError, match="needs a RuleEngine or AsyncRuleEngine"):
        RateLimitMiddleware(app, object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="headers must be one of"):
        RateLimitMiddleware(app, aengine, headers="x")  # type: ignore[arg-type]


def test_repr(aengine: AsyncRuleEngine) -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        raise AssertionError

    assert repr(RateLimitMiddleware(app, aengine)).startswith(
        "<RateLimitMiddleware <AsyncRuleEngine 7 rules"
    )


def test_route_middleware_sees_the_route_template(clock: FakeClock) -> None:
    """Starlette runs a Route's own middleware after routing: ``route`` is known."""
    ruleset = loads("""
rules:
  - {name: per-route, rate: 2/minute, by: route, match: {attributes: {route: "/items/{id}"}}}
""")
    engine = AsyncRuleEngine(ruleset, AsyncMemoryStore(clock=clock))

    async def endpoint(request: Request) -> Response:
        return JSONResponse({"id": request.path_params["id"]})

    limited = Middleware(RateLimitMiddleware, engine=engine)
    app = Starlette(routes=[Route("/items/{id}", endpoint, middleware=[limited])])
    with TestClient(app) as client:
        statuses = [client.get(f"/items/{i}").status_code for i in range(3)]
    assert statuses == [200, 200, 429]  # one counter for the route, whatever the id


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("policy", "status"), [("fail_open", 200), ("fail_closed", 429)])
def test_an_unreachable_store_follows_the_rule_policy(
    policy: str, status: int, calls: list[str]
) -> None:
    """Redis down (a loopback port nobody listens on): the rule's on_failure
    decides, and the answer is never a 500."""
    ruleset = loads(f"""
rules:
  - {{name: api, rate: 3/minute, by: ip, on_failure: {policy}, match: {{paths: "/api*"}}}}
""")
    store = AsyncRedisStore(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with TestClient(make_app(AsyncRuleEngine(ruleset, store), calls)) as client:
            responses = [client.get("/api/items") for _ in range(3)]
    finally:
        asyncio.run(store.aclose())
    assert [r.status_code for r in responses] == [status] * 3
    assert all(not r.headers.get("x-ratelimit-remaining") for r in responses)  # no counts
    if status == 429:
        body = responses[0].json()
        assert (
            body["detail"] == "the rate limiter cannot count right now and this limit fails closed"
        )
        assert int(responses[0].headers["retry-after"]) >= 1
    assert len(calls) == (3 if status == 200 else 0)


async def abroken_identify(scope: Scope) -> Mapping[str, object]:
    raise LookupError("the session store is down")


@pytest.mark.parametrize("kind", ["async engine, async identify", "sync engine, plain identify"])
def test_an_identify_that_raises_follows_the_rule_policy(
    kind: str, clock: FakeClock, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    ruleset = loads(IDENTIFY_RULES)
    engine: Any
    identify: Any
    if kind.startswith("async"):
        engine, identify = AsyncRuleEngine(ruleset, AsyncMemoryStore(clock=clock)), abroken_identify
    else:
        engine, identify = RuleEngine(ruleset, MemoryStore(clock=clock)), broken_identify
    app = make_app(engine, calls, identify=identify)
    with TestClient(app, raise_server_exceptions=False) as client:
        expect_unidentified(lambda path: client.get(path).status_code, caplog)
    assert "/private" not in calls


@pytest.mark.parametrize("limiter", [AsyncLimiter, Limiter])
def test_a_plain_limiter_counts_the_address_when_identify_raises(
    limiter: type[AsyncLimiter] | type[Limiter], calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(limiter("2/minute"), calls, identify=broken_identify)  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        statuses = [client.get("/api/items").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert "identify raised LookupError" in caplog.text


def test_an_identify_that_returns_no_mapping_is_logged_not_a_500(
    aengine: AsyncRuleEngine, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(aengine, calls, identify=lambda scope: "alice")
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/api/items").status_code == 200
    assert "identify must return a mapping of attributes or None, got 'alice'" in caplog.text
