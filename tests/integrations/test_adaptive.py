"""Adaptive limits through every framework front end: with the load signal at
its bad value, a rule of 10/minute admits its floor (2) and says so in its
headers; at a good value, all 10. (Django: tests/integrations/test_django.py.)"""

from __future__ import annotations

import textwrap
from typing import Any

import flask
import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient
from werkzeug.test import Client as WerkzeugClient

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.integrations import flask as flask_limits
from ratewarden.integrations.asgi import RateLimitMiddleware as ASGIMiddleware
from ratewarden.integrations.fastapi import RateLimit
from ratewarden.integrations.wsgi import RateLimitMiddleware as WSGIMiddleware
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads

ADAPTIVE = textwrap.dedent("""
    rules:
      - name: api
        rate: 10/minute
        algorithm: fixed_window
        adaptive: {signal: p99_ms, good: 200, bad: 1000, floor: 20%}
""")
START = 1_700_000_040.0
LOADED = [200, 200, 429]  # at the floor: 2 of 10
LIMITS = ["2", "2", "2"]


def engines(clock: FakeClock, load: float) -> tuple[RuleEngine, AsyncRuleEngine]:
    sync = RuleEngine(loads(ADAPTIVE), MemoryStore(clock=clock))
    asynchronous = AsyncRuleEngine(loads(ADAPTIVE), AsyncMemoryStore(clock=clock))
    sync.set_load("p99_ms", load)
    asynchronous.set_load("p99_ms", load)
    return sync, asynchronous


@pytest.mark.parametrize("kind", ["async engine", "sync engine"])
def test_asgi_applies_the_effective_limit(kind: str) -> None:
    clock = FakeClock(START)
    sync, asynchronous = engines(clock, 1000)

    async def endpoint(request: Request) -> Response:
        return PlainTextResponse("ok")

    engine: Any = asynchronous if kind == "async engine" else sync
    app = Starlette(routes=[Route("/", endpoint)],
                    middleware=[Middleware(ASGIMiddleware, engine=engine)])  # fmt: skip
    client = TestClient(app)
    responses = [client.get("/") for _ in LOADED]
    assert [r.status_code for r in responses] == LOADED
    assert [r.headers["x-ratelimit-limit"] for r in responses] == LIMITS
    assert responses[0].headers["ratelimit-policy"] == '"api";q=2;w=60'


def test_fastapi_dependency_applies_the_effective_limit() -> None:
    clock = FakeClock(START)
    _, engine = engines(clock, 1000)
    app = FastAPI()

    @app.get("/", dependencies=[Depends(RateLimit(engine))])
    async def root() -> dict[str, bool]:
        return {"ok": True}

    client = TestClient(app)
    responses = [client.get("/") for _ in LOADED]
    assert [r.status_code for r in responses] == LOADED
    assert [r.headers["x-ratelimit-limit"] for r in responses] == LIMITS


def test_wsgi_applies_the_effective_limit_and_follows_the_signal() -> None:
    clock = FakeClock(START)
    engine, _ = engines(clock, 1000)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    client = WerkzeugClient(WSGIMiddleware(app, engine))
    responses = [client.get("/") for _ in LOADED]
    assert [r.status_code for r in responses] == LOADED
    assert [r.headers["X-RateLimit-Limit"] for r in responses] == LIMITS
    # the load eases: the limit rises a reading a second (smoothed: 1000 -> 700 ->
    # 490 -> 343 ms), but the two requests admitted at the floor used this whole
    # window (each was priced at a fifth of it), so the window stays closed
    engine.set_load("p99_ms", 0)
    eased = []
    for _ in range(3):
        clock.advance(1)
        eased.append(client.get("/"))
    assert [r.headers["X-RateLimit-Limit"] for r in eased] == ["5", "7", "8"]
    assert [r.status_code for r in eased] == [429] * 3
    clock.advance(60)  # the next window: 8 of the limit, then 9 as the average nears 0
    assert client.get("/").headers["X-RateLimit-Remaining"] == "8"


def test_flask_applies_the_effective_limit() -> None:
    clock = FakeClock(START)
    engine, _ = engines(clock, 1000)
    app = flask.Flask(__name__)
    flask_limits.RateLimiter(app, engine)

    @app.get("/")
    def root() -> str:
        return "ok"

    client = app.test_client()
    responses = [client.get("/") for _ in LOADED]
    assert [r.status_code for r in responses] == LOADED
    assert [r.headers["X-RateLimit-Limit"] for r in responses] == LIMITS


def test_at_a_good_load_the_full_limit_applies() -> None:
    clock = FakeClock(START)
    engine, _ = engines(clock, 150)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    client = WerkzeugClient(WSGIMiddleware(app, engine))
    responses = [client.get("/") for _ in range(11)]
    assert [r.status_code for r in responses] == [200] * 10 + [429]
    assert responses[0].headers["X-RateLimit-Limit"] == "10"
