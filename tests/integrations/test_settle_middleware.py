"""The ASGI and WSGI middleware settle a rule that counts by response with the
status the app answers: a login route that fails five times and then succeeds,
on a rule of six failures a minute, lets every success through (each is counted
when checked, then given back) until a sixth failure fills the limit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.integrations import asgi, wsgi
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads

RULES = """
rules:
  - name: login-failures
    rate: 6/minute
    algorithm: fixed_window
    by: ip
    match: {paths: /login}
    count: {status: [401, 403]}
"""
# the login answers 401 five times, then 200 ten times, then 401 again
SCRIPT = [401] * 5 + [200] * 10 + [401]
# and the caller sees that, then a refusal: six failures, and nothing else, counted
SEEN = [*SCRIPT, 429]


def login_app() -> Starlette:
    answers = iter(SCRIPT)

    async def login(request: Request) -> Response:
        return PlainTextResponse("", status_code=next(answers, 401))

    async def boom(request: Request) -> Response:
        raise RuntimeError("the app failed")

    return Starlette(routes=[Route("/login", login, methods=["POST"]),
                             Route("/boom", boom)])  # fmt: skip


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_asgi_counts_only_the_failed_logins(kind: str) -> None:
    clock = FakeClock()
    engine: AsyncRuleEngine | RuleEngine
    if kind == "async":
        engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))
    else:
        engine = RuleEngine(loads(RULES), MemoryStore(clock=clock))
    app = asgi.RateLimitMiddleware(login_app(), engine)
    client = TestClient(app)
    assert [client.post("/login").status_code for _ in SEEN] == SEEN


def test_asgi_a_sixth_failure_is_refused_before_the_app_runs() -> None:
    clock = FakeClock()
    engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore(clock=clock))
    calls: list[int] = []

    async def always_401(scope: Any, receive: Any, send: Any) -> None:
        calls.append(1)
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    client = TestClient(asgi.RateLimitMiddleware(always_401, engine))
    assert [client.post("/login").status_code for _ in range(8)] == [401] * 6 + [429] * 2
    assert len(calls) == 6


def test_asgi_an_app_that_raises_settles_as_a_500() -> None:
    clock = FakeClock()
    rules = RULES.replace("/login", "/boom")  # a 500 is no failed login: given back
    engine = AsyncRuleEngine(loads(rules), AsyncMemoryStore(clock=clock))
    app = asgi.RateLimitMiddleware(login_app(), engine)
    client = TestClient(app, raise_server_exceptions=False)  # Starlette answers the 500
    assert [client.get("/boom").status_code for _ in range(10)] == [500] * 10

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("the app failed before its response started")

    client = TestClient(asgi.RateLimitMiddleware(bare, engine), raise_server_exceptions=False)
    assert [client.get("/boom").status_code for _ in range(10)] == [500] * 10


def wsgi_login() -> Any:
    answers = iter(SCRIPT)

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        status = next(answers, 401)
        start_response(f"{status} {'OK' if status == 200 else 'Unauthorized'}", [])
        return [b""]

    return app


def wsgi_call(app: Any, path: str = "/login") -> tuple[int, dict[str, str]]:
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "REMOTE_ADDR": "203.0.113.9"}
    seen: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append((status, headers))

    b"".join(app(environ, start_response))
    status, headers = seen[0]
    return int(status.split()[0]), {k.lower(): v for k, v in headers}


def test_wsgi_counts_only_the_failed_logins() -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))
    app = wsgi.RateLimitMiddleware(wsgi_login(), engine)
    assert [wsgi_call(app)[0] for _ in SEEN] == SEEN


def test_wsgi_a_sixth_failure_is_refused_and_an_app_that_raises_is_a_500() -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))

    def broken(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        raise RuntimeError("the app failed")

    app = wsgi.RateLimitMiddleware(broken, RuleEngine(loads(RULES), MemoryStore()))
    for _ in range(10):  # a 500 is no failed login: each is given back
        with pytest.raises(RuntimeError):
            wsgi_call(app)
    always = wsgi.RateLimitMiddleware(lambda e, s: (s("401 Unauthorized", []), [b""])[1], engine)
    assert [wsgi_call(always)[0] for _ in range(8)] == [401] * 6 + [429] * 2


def test_a_settle_that_fails_leaves_the_response_alone(caplog: pytest.LogCaptureFixture) -> None:
    engine = RuleEngine(loads(RULES), MemoryStore(clock=FakeClock()))

    def failing(token: str, *, status: int) -> Any:
        raise ConnectionError("the store went away")

    engine.settle = failing  # type: ignore[method-assign,assignment]
    app = wsgi.RateLimitMiddleware(wsgi_login(), engine)
    assert wsgi_call(app)[0] == 401
    assert "settling the request's hits failed" in caplog.text
