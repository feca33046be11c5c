"""FastAPI: the app-wide ASGI middleware and the per-route dependency."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.testclient import TestClient

from ratewarden import AsyncMemoryStore, FakeClock
from ratewarden.integrations.asgi import RateLimitMiddleware
from ratewarden.integrations.fastapi import RateLimit, install
from ratewarden.rules import AsyncRuleEngine, RuleSet, loads

from .conftest import IDENTIFY_PATHS, IDENTIFY_RULES, expect_unidentified, expected_headers, state

ROUTE_RULES = """
rules:
  - name: item-reads
    rate: 2/minute
    algorithm: fixed_window
    by: [route, user]
    match: {attributes: {route: "/items/{item_id}"}}
"""


def test_middleware_on_a_fastapi_app(aengine: AsyncRuleEngine) -> None:
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, engine=aengine)

    @app.get("/api/items")
    async def items() -> list[int]:
        return [1, 2]

    with TestClient(app) as client:
        statuses = [client.get("/api/items").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


@pytest.fixture
def route_engine(clock: FakeClock) -> AsyncRuleEngine:
    return AsyncRuleEngine(loads(ROUTE_RULES), AsyncMemoryStore(clock=clock))


@pytest.fixture
def route_client(route_engine: AsyncRuleEngine) -> Iterator[TestClient]:
    async def user(request: Request) -> dict[str, object]:
        return {"user": request.headers.get("x-user", "anonymous")}

    limit = RateLimit(route_engine, identify=user)
    app = FastAPI()
    install(app)
    seen: list[int] = []

    @app.get("/items/{item_id}", dependencies=[Depends(limit)])
    async def read(item_id: int) -> dict[str, int]:
        seen.append(item_id)
        return {"item": item_id}

    @app.get("/other")
    async def other() -> dict[str, bool]:
        return {"ok": True}

    with TestClient(app) as client:
        yield client
    assert len(seen) <= 4


def test_dependency_limits_one_route_by_its_template(
    route_client: TestClient, route_engine: AsyncRuleEngine
) -> None:
    # /items/1 and /items/2 share the route's counter: the template is the key
    first = route_client.get("/items/1")
    assert first.status_code == 200
    key = "%2Fitems%2F{item_id}/anonymous"  # by: [route, user], '/' escaped in each part
    now = state(route_engine.store, route_engine.ruleset, "item-reads", key)  # type: ignore[arg-type]
    assert now.remaining == 1
    assert expected_headers(now, 2, 60).items() <= dict(first.headers).items()
    assert route_client.get("/items/2").status_code == 200
    refused = route_client.get("/items/3")
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["violated-policies"] == ["item-reads"]
    assert "retry-after" in refused.headers
    assert route_client.get("/items/3", headers={"x-user": "bob"}).status_code == 200
    assert route_client.get("/other").status_code == 200  # no dependency, no limit


def test_dependency_without_install_still_answers_429(route_engine: AsyncRuleEngine) -> None:
    app = FastAPI()

    def user(request: Request) -> dict[str, object]:
        return {"user": "u1"}

    limit = RateLimit(route_engine, identify=user)

    @app.get("/items/{item_id}", dependencies=[Depends(limit)])
    async def read(item_id: int) -> int:
        return item_id

    with TestClient(app) as client:
        statuses = [client.get(f"/items/{i}").status_code for i in range(3)]
    assert statuses == [200, 200, 429]
    refused = client.get("/items/9")
    assert refused.status_code == 429
    assert refused.json()["detail"]["type"].endswith("#quota-exceeded")
    assert "retry-after" in refused.headers


def test_ruleset_fixture_is_untouched(ruleset: RuleSet) -> None:
    assert len(ruleset) == 7


def test_middleware_and_dependency_together_send_each_header_once(
    aengine: AsyncRuleEngine, clock: FakeClock
) -> None:
    # the app-wide "api" limit (3/minute) and the route's "item-reads" (2/minute):
    # the route's check spoke last and closest, its headers are the ones sent
    def user(request: Request) -> dict[str, object]:
        return {"user": "u1"}

    rules = ROUTE_RULES.replace('"/items/{item_id}"', '"/api/items/{item_id}"')
    route_engine = AsyncRuleEngine(loads(rules), AsyncMemoryStore(clock=clock))
    app = FastAPI()
    install(app)
    app.add_middleware(RateLimitMiddleware, engine=aengine)

    @app.get("/api/items/{item_id}", dependencies=[Depends(RateLimit(route_engine, identify=user))])
    async def read(item_id: int) -> int:
        return item_id

    @app.get("/api/plain")
    async def plain() -> int:
        return 0

    with TestClient(app) as client:
        first = client.get("/api/items/1")
        other = client.get("/api/plain")
    for name in ("x-ratelimit-limit", "x-ratelimit-remaining", "ratelimit", "ratelimit-policy"):
        assert len(first.headers.get_list(name)) == 1, name
    assert first.headers["x-ratelimit-limit"] == "2"  # the route's limit, not the app's 3
    assert other.headers["x-ratelimit-limit"] == "3"  # no dependency: the middleware's


def test_an_identify_that_raises_follows_the_rule_policy(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: Request) -> Mapping[str, object]:
        raise LookupError("the session store is down")

    limit = RateLimit(AsyncRuleEngine(loads(IDENTIFY_RULES), AsyncMemoryStore(clock=clock)),
                      identify=broken)  # fmt: skip
    app = FastAPI()
    install(app)

    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    for path in IDENTIFY_PATHS:
        app.add_api_route(path, endpoint, dependencies=[Depends(limit)])
    with TestClient(app, raise_server_exceptions=False) as client:
        expect_unidentified(lambda path: client.get(path).status_code, caplog)
