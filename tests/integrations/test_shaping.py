"""degrade and queue through every framework front end: the application learns
how much to degrade, the client gets the rule's header, a queued request is
held until its slot (on the fake clock) and a full line is a 429."""

from __future__ import annotations

import itertools
from typing import Any

import flask
import pytest
from fastapi import Depends, FastAPI
from fastapi import Request as FastAPIRequest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient
from werkzeug.test import Client as WerkzeugClient

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.integrations import flask as flask_limits
from ratewarden.integrations.asgi import RateLimitMiddleware as ASGIMiddleware
from ratewarden.integrations.fastapi import RateLimit
from ratewarden.integrations.wsgi import RateLimitMiddleware as WSGIMiddleware
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads
from tests.shaping import LEVELS, SHAPING, START

HEADERS = [None, None, "0.25", "0.50", "0.75", "1", "1"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def starlette_app(engine: Any, seen: list[float]) -> Starlette:
    async def endpoint(request: Request) -> Response:
        level = request.state.ratewarden_degrade
        seen.append(level)
        return JSONResponse({"quality": "low" if level >= 0.5 else "high"})

    routes = [Route("/video", endpoint), Route("/line", endpoint)]
    return Starlette(routes=routes, middleware=[Middleware(ASGIMiddleware, engine=engine)])


@pytest.mark.parametrize("kind", ["async engine", "sync engine"])
def test_asgi_tells_the_app_how_much_to_degrade(kind: str, clock: FakeClock) -> None:
    engine: Any = (
        AsyncRuleEngine(loads(SHAPING), AsyncMemoryStore(clock=clock))
        if kind == "async engine"
        else RuleEngine(loads(SHAPING), MemoryStore(clock=clock))
    )
    seen: list[float] = []
    client = TestClient(starlette_app(engine, seen), client=("203.0.113.7", 5000))
    responses = [client.get("/video") for _ in LEVELS]
    assert [r.status_code for r in responses] == [200] * len(LEVELS)
    assert seen == LEVELS
    assert [r.headers.get("x-ratelimit-degraded") for r in responses] == HEADERS
    assert responses[-1].json() == {"quality": "low"}
    assert "x-ratelimit-limit" not in responses[-1].headers  # degrade limits never show


@pytest.mark.parametrize("kind", ["async engine", "sync engine"])
def test_asgi_holds_a_queued_request_until_its_slot(kind: str, clock: FakeClock) -> None:
    engine: Any = (
        AsyncRuleEngine(loads(SHAPING), AsyncMemoryStore(clock=clock))
        if kind == "async engine"
        else RuleEngine(loads(SHAPING), MemoryStore(clock=clock))
    )
    seen: list[float] = []
    client = TestClient(starlette_app(engine, seen))
    released = []
    for _ in range(4):
        assert client.get("/line").status_code == 200
        released.append(clock.time_ns())
    # one every 0.5 s (2/second), each held on the store's clock until due
    assert [b - a for a, b in itertools.pairwise(released)] == [500_000_000] * 3
    sync = (
        engine if isinstance(engine, RuleEngine) else RuleEngine(engine.ruleset, engine.store.sync)
    )
    for _ in range(3):  # fill the line (one released now, two waiting)
        sync.check({"path": "/line"})
    refused = client.get("/line")
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["violated-policies"] == ["line"]


def test_fastapi_dependency_sets_request_state(clock: FakeClock) -> None:
    engine = AsyncRuleEngine(loads(SHAPING), AsyncMemoryStore(clock=clock))
    app = FastAPI()

    @app.get("/video", dependencies=[Depends(RateLimit(engine))])
    async def video(request: FastAPIRequest) -> dict[str, float]:
        return {"level": request.state.ratewarden_degrade}

    client = TestClient(app, client=("203.0.113.7", 5000))
    responses = [client.get("/video") for _ in LEVELS]
    assert [r.json()["level"] for r in responses] == LEVELS
    assert [r.headers.get("x-ratelimit-degraded") for r in responses] == HEADERS


def test_wsgi_leaves_the_level_in_the_environ(clock: FakeClock) -> None:
    seen: list[float] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(environ["ratewarden.degrade"])
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    engine = RuleEngine(loads(SHAPING), MemoryStore(clock=clock))
    client = WerkzeugClient(WSGIMiddleware(app, engine))
    responses = [client.get("/video", environ_base={"REMOTE_ADDR": "203.0.113.7"}) for _ in LEVELS]
    assert seen == LEVELS
    assert [r.headers.get("X-RateLimit-Degraded") for r in responses] == HEADERS
    start = clock.time_ns()
    assert [client.get("/line").status_code for _ in range(3)] == [200] * 3
    assert clock.time_ns() - start == 1_000_000_000  # the 2nd and 3rd held 0.5 s each


def test_flask_views_ask_degrade_level(clock: FakeClock) -> None:
    app = flask.Flask(__name__)
    engine = RuleEngine(loads(SHAPING), MemoryStore(clock=clock))
    flask_limits.RateLimiter(app, engine)

    @app.get("/video")
    def video() -> dict[str, float]:
        return {"level": flask_limits.degrade_level()}

    view_engine = RuleEngine(loads(SHAPING.replace("/video", "/own")), MemoryStore(clock=clock))

    @app.get("/own")
    @flask_limits.limit(view_engine)
    def own() -> dict[str, float]:
        return {"level": flask_limits.degrade_level()}

    client = app.test_client()
    responses = [client.get("/video", environ_base={"REMOTE_ADDR": "203.0.113.7"}) for _ in LEVELS]
    assert [r.json["level"] for r in responses] == LEVELS  # type: ignore[index]
    assert [r.headers.get("X-RateLimit-Degraded") for r in responses] == HEADERS
    owned = [client.get("/own", environ_base={"REMOTE_ADDR": "203.0.113.7"}) for _ in LEVELS]
    assert [r.json["level"] for r in owned] == LEVELS  # type: ignore[index]
    assert [r.headers.get("X-RateLimit-Degraded") for r in owned] == HEADERS
