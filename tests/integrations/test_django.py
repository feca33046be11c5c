"""Django: the middleware (sync under WSGI, async under ASGI) and the view
decorator on sync and async views, with settings configured here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import django
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path

from ratewarden import AsyncMemoryStore, ConfigurationError, FakeClock, MemoryStore
from ratewarden.integrations.django import RateLimitMiddleware, limit
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

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="tests-only",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=[],
        USE_TZ=True,
    )
    django.setup()

CALLS: list[str] = []
ROUTE_RULES = """
rules:
  - {name: per-route, rate: 2/minute, by: route, match: {attributes: {route: "items/<int:id>"}}}
"""
ROUTE_ENGINES: dict[str, Any] = {}


def view(request: HttpRequest) -> HttpResponse:
    CALLS.append(request.path)
    return JsonResponse({"ok": True})


async def async_view(request: HttpRequest) -> HttpResponse:
    CALLS.append(request.path)
    return JsonResponse({"ok": True})


def sync_item(request: HttpRequest, id: int) -> HttpResponse:
    return ROUTE_ENGINES["sync"](request, id)  # type: ignore[no-any-return]


async def async_item(request: HttpRequest, id: int) -> HttpResponse:
    return await ROUTE_ENGINES["async"](request, id)  # type: ignore[no-any-return]


def degraded_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"level": request.ratewarden_degrade})  # type: ignore[attr-defined]


async def async_degraded_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"level": request.ratewarden_degrade})  # type: ignore[attr-defined]


def streamed(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"a", b"b"]))


async def astreamed(request: HttpRequest) -> StreamingHttpResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"a", b"b"):
            yield chunk

    return StreamingHttpResponse(chunks())


urlpatterns = [
    path("report", astreamed),
    path("video", degraded_view),
    path("avideo", async_degraded_view),
    path("api/items", view),
    path("api/async", async_view),
    path("busy", view),
    path("slow", async_view),
    path("signup", view),
    path("me", view),
    path("items/<int:id>", sync_item),
    path("aitems/<int:id>", async_item),
]

MIDDLEWARE = ["ratewarden.integrations.django.RateLimitMiddleware"]


def identify(request: HttpRequest) -> dict[str, object] | None:
    user = request.headers.get("X-User")
    return {"user": user} if user else None


def rate_headers(response: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers.items() if k.lower() in RATE_HEADERS}


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


@pytest.mark.parametrize("kind", ["sync engine", "async engine"])
def test_sync_middleware(
    kind: str, ruleset: RuleSet, clock: FakeClock, store: MemoryStore, astore: AsyncMemoryStore
) -> None:
    engine: Any = (
        RuleEngine(ruleset, store) if kind == "sync engine" else AsyncRuleEngine(ruleset, astore)
    )
    config = {"ENGINE": engine, "IDENTIFY": f"{__name__}.identify"}
    with override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN=config):
        client = Client(REMOTE_ADDR="203.0.113.7")
        for remaining in (2, 1, 0):
            response = client.get("/api/items")
            assert response.status_code == 200
            now = state(engine.store, ruleset, "api", "203.0.113.7")
            assert now.remaining == remaining
            assert rate_headers(response) == expected_headers(now, quota=3, window=60)
        refused = client.get("/api/items")
        assert refused.status_code == 429
        assert refused["Content-Type"] == "application/problem+json"
        assert refused.json()["violated-policies"] == ["api"]
        exact = state(engine.store, ruleset, "api", "203.0.113.7").retry_after
        header = int(refused["Retry-After"])
        start = clock.time_ns()
        clock.advance(exact - 0.001)
        assert client.get("/api/items").status_code == 429
        clock.now_ns = start + header * 1_000_000_000
        assert client.get("/api/items").status_code == 200
        assert [client.get("/busy").status_code for _ in range(2)] == [200, 503]
        assert [client.get("/me", HTTP_X_USER="al").status_code for _ in range(3)][-1] == 429
        client.post("/signup")
        banned = client.post("/signup")
        assert (banned.status_code, banned.json()) == (202, {"status": "pending"})
    assert CALLS.count("/api/items") == 4
    assert CALLS.count("/signup") == 1


@pytest.mark.parametrize("kind", ["sync engine", "async engine"])
def test_async_middleware(
    kind: str, ruleset: RuleSet, clock: FakeClock, store: MemoryStore, astore: AsyncMemoryStore
) -> None:
    engine: Any = (
        RuleEngine(ruleset, store) if kind == "sync engine" else AsyncRuleEngine(ruleset, astore)
    )

    async def scenario() -> list[Any]:
        client = AsyncClient(REMOTE_ADDR="203.0.113.7")
        return [await client.get("/api/async") for _ in range(4)] + [
            await client.get("/slow") for _ in range(2)
        ]

    with override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN={"ENGINE": engine}):
        start = clock.time_ns()
        responses = asyncio.run(scenario())
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 200, 200]
    assert rate_headers(responses[0])["x-ratelimit-remaining"] == "2"
    assert responses[3].json()["violated-policies"] == ["api"]
    assert clock.time_ns() - start == 1_000_000_000  # the second /slow was held 1 s
    assert CALLS == ["/api/async"] * 3 + ["/slow"] * 2


def test_view_decorator_on_sync_and_async_views(clock: FakeClock) -> None:
    sync_engine = RuleEngine(loads(ROUTE_RULES), MemoryStore(clock=clock))
    async_rules = loads(ROUTE_RULES.replace("items/", "aitems/"))
    async_engine = AsyncRuleEngine(async_rules, AsyncMemoryStore(clock=clock))

    @limit(sync_engine)
    def item(request: HttpRequest, id: int) -> HttpResponse:
        return JsonResponse({"id": id})

    @limit(async_engine)
    async def aitem(request: HttpRequest, id: int) -> HttpResponse:
        return JsonResponse({"id": id})

    ROUTE_ENGINES.update({"sync": item, "async": aitem})
    with override_settings(MIDDLEWARE=[]):
        client = Client()
        sync_statuses = [client.get(f"/items/{i}").status_code for i in range(3)]

        async def scenario() -> list[int]:
            aclient = AsyncClient()
            return [(await aclient.get(f"/aitems/{i}")).status_code for i in range(3)]

        async_statuses = asyncio.run(scenario())
    assert sync_statuses == [200, 200, 429]  # one counter for the route "items/<int:id>"
    assert async_statuses == [200, 200, 429]


def test_settings_are_checked() -> None:
    with (
        override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN={}),
        pytest.raises(ConfigurationError, match="ENGINE"),
    ):
        Client().get("/api/items")
    with (
        override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN={"ENGINE": object()}),
        pytest.raises(ConfigurationError, match="needs a RuleEngine or AsyncRuleEngine"),
    ):
        Client().get("/api/items")


def test_a_sync_view_refuses_an_async_engine_on_redis() -> None:
    """async_to_sync runs each request on a new loop; a Redis client belongs to its
    first one, and requests went through unchecked."""
    engine = AsyncRuleEngine(loads(ROUTE_RULES), AsyncRedisStore("redis://127.0.0.1:1/0"))

    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")  # pragma: no cover - never built

    with pytest.raises(ConfigurationError, match="cannot run an AsyncRuleEngine"):
        limit(engine)(view)


SHAPING = """
rules:
  - name: video
    rate: 2/minute
    algorithm: fixed_window
    by: ip
    action: degrade
    degrade: {header: true, full_at: 3}
    match: {paths: [/video, /avideo]}
"""
LEVELS = [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
LEVEL_HEADERS = [None, None, "0.25", "0.50", "0.75", "1", "1"]


@pytest.mark.parametrize("kind", ["sync engine", "async engine"])
def test_degrade_is_on_the_request_sync_and_async(kind: str, clock: FakeClock) -> None:
    engine: Any = (
        RuleEngine(loads(SHAPING), MemoryStore(clock=clock))
        if kind == "sync engine"
        else AsyncRuleEngine(loads(SHAPING), AsyncMemoryStore(clock=clock))
    )

    async def scenario() -> list[Any]:
        client = AsyncClient(REMOTE_ADDR="198.51.100.9")
        return [await client.get("/avideo") for _ in LEVELS]

    with override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN={"ENGINE": engine}):
        sync = [Client(REMOTE_ADDR="203.0.113.7").get("/video") for _ in LEVELS]
        asynchronous = asyncio.run(scenario())
    for responses in (sync, asynchronous):
        assert [r.json()["level"] for r in responses] == LEVELS
        assert [r.headers.get("X-RateLimit-Degraded") for r in responses] == LEVEL_HEADERS


def test_the_view_decorator_and_the_middleware_keep_the_stronger_level(clock: FakeClock) -> None:
    engine = RuleEngine(loads(SHAPING), MemoryStore(clock=clock))
    strict = RuleEngine(loads(SHAPING.replace("2/minute", "1/minute")), MemoryStore(clock=clock))
    own = limit(strict)(degraded_view)
    with override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN={"ENGINE": engine}):
        request = Client(REMOTE_ADDR="203.0.113.7").get("/video").wsgi_request
    setattr(request, "ratewarden_degrade", 0.75)  # noqa: B010  (as the middleware left it)
    levels = [own(request).content for _ in range(3)]  # the view's own: 0, 0.5, 1
    assert levels == [b'{"level": 0.75}', b'{"level": 0.75}', b'{"level": 1.0}']


ADAPTIVE = """
rules:
  - name: api
    rate: 10/minute
    algorithm: fixed_window
    adaptive: {signal: p99_ms, good: 200, bad: 1000, floor: 20%}
"""


@pytest.mark.parametrize("kind", ["sync engine", "async engine"])
def test_adaptive_limit_applies_sync_and_async(kind: str, clock: FakeClock) -> None:
    engine: Any = (
        RuleEngine(loads(ADAPTIVE), MemoryStore(clock=clock))
        if kind == "sync engine"
        else AsyncRuleEngine(loads(ADAPTIVE), AsyncMemoryStore(clock=clock))
    )
    engine.set_load("p99_ms", 1000)  # at the floor: 2 of 10

    async def scenario() -> list[Any]:
        client = AsyncClient(REMOTE_ADDR="198.51.100.9")
        return [await client.get("/api/async") for _ in range(2)]

    with override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN={"ENGINE": engine}):
        sync = [Client(REMOTE_ADDR="203.0.113.7").get("/api/items") for _ in range(2)]
        asynchronous = asyncio.run(scenario())
    responses = sync + asynchronous
    assert [r.status_code for r in responses] == [200, 200, 429, 429]
    assert {r.headers["X-RateLimit-Limit"] for r in responses} == {"2"}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_identify_that_raises_follows_the_rule_policy(
    mode: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    ruleset = loads(IDENTIFY_RULES)
    engine: Any = (
        RuleEngine(ruleset, MemoryStore(clock=clock))
        if mode == "sync"
        else AsyncRuleEngine(ruleset, AsyncMemoryStore(clock=clock))
    )
    config = {"ENGINE": engine, "IDENTIFY": broken_identify}
    with override_settings(
        MIDDLEWARE=MIDDLEWARE, RATEWARDEN=config, DEBUG_PROPAGATE_EXCEPTIONS=False
    ):
        if mode == "sync":
            client = Client(REMOTE_ADDR="203.0.113.7", raise_request_exception=False)
            expect_unidentified(lambda path: client.get(path).status_code, caplog)
        else:
            aclient = AsyncClient(REMOTE_ADDR="203.0.113.7", raise_request_exception=False)
            expect_unidentified(
                lambda path: asyncio.run(aclient.get(path)).status_code,
                caplog,
            )


def test_the_view_decorator_follows_the_rule_policy_when_identify_raises(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = RuleEngine(loads(IDENTIFY_RULES), MemoryStore(clock=clock))
    limited = limit(engine, identify=broken_identify)(view)
    factory = RequestFactory(REMOTE_ADDR="203.0.113.7")
    expect_unidentified(lambda path: limited(factory.get(path)).status_code, caplog)


SLOT_RULES = """
rules:
  - {name: in-flight, concurrency: 1, lease: 30, by: ip}
"""


def test_sync_middleware_holds_a_slot_until_the_response_is_closed(clock: FakeClock) -> None:
    engine = RuleEngine(loads(SLOT_RULES), MemoryStore(clock=clock))
    factory = RequestFactory(REMOTE_ADDR="192.0.2.7")
    with override_settings(RATEWARDEN={"ENGINE": engine}):
        middleware = RateLimitMiddleware(streamed)
    first = middleware(factory.get("/report"))
    assert first.status_code == 200
    assert engine.holds.in_flight() == {"in-flight": 1}  # streaming: held
    refused = middleware(factory.get("/report"))
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "30"
    assert b"".join(first.streaming_content) == b"ab"
    assert engine.holds.in_flight() == {"in-flight": 1}  # sent, not closed yet
    first.close()  # as the WSGI server does once the response is done
    assert engine.holds.in_flight() == {"in-flight": 0}
    assert middleware(factory.get("/report")).status_code == 200


def test_async_middleware_holds_a_slot_until_the_response_is_closed(clock: FakeClock) -> None:
    engine = AsyncRuleEngine(loads(SLOT_RULES), AsyncMemoryStore(clock=clock))
    factory = RequestFactory(REMOTE_ADDR="192.0.2.8")

    async def boom(request: HttpRequest) -> HttpResponse:
        raise RuntimeError("the view failed")

    async def main() -> None:
        with override_settings(RATEWARDEN={"ENGINE": engine}):
            middleware = RateLimitMiddleware(astreamed)
            failing = RateLimitMiddleware(boom)
        first = await middleware(factory.get("/report"))
        assert first.status_code == 200
        assert engine.holds.in_flight() == {"in-flight": 1}
        refused = await middleware(factory.get("/report"))
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "30"
        await sync_to_async(first.close)()  # as Django's ASGI handler does once it is sent
        assert engine.holds.in_flight() == {"in-flight": 0}
        with pytest.raises(RuntimeError):
            await failing(factory.get("/report"))
        assert engine.holds.in_flight() == {"in-flight": 0}
        assert (await middleware(factory.get("/report"))).status_code == 200

    asyncio.run(main())


def test_under_django_asgi_the_slot_is_held_until_the_stream_is_sent(clock: FakeClock) -> None:
    from django.core.handlers.asgi import ASGIHandler  # noqa: PLC0415

    engine = AsyncRuleEngine(loads(SLOT_RULES), AsyncMemoryStore(clock=clock))

    async def request(go: asyncio.Event) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        asked = [False]

        async def receive() -> dict[str, Any]:
            if not asked[0]:
                asked[0] = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client stays
            raise AssertionError

        async def send(message: Mapping[str, Any]) -> None:
            sent.append(dict(message))
            if message["type"] == "http.response.body":
                await go.wait()

        scope = {"type": "http", "method": "GET", "path": "/report", "query_string": b"",
                 "headers": [], "client": ("192.0.2.9", 1), "server": ("x", 80)}  # fmt: skip
        await ASGIHandler()(scope, receive, send)
        return sent

    async def main() -> None:
        go = asyncio.Event()
        first = asyncio.create_task(request(go))
        for _ in range(500):  # until the first chunk is on its way
            if engine.holds.in_flight().get("in-flight"):
                break
            await asyncio.sleep(0.002)
        free = asyncio.Event()
        free.set()
        refused = await asyncio.wait_for(request(free), 10)
        assert refused[0]["status"] == 429
        assert engine.holds.in_flight() == {"in-flight": 1}
        go.set()
        assert (await first)[0]["status"] == 200
        assert engine.holds.in_flight() == {"in-flight": 0}

    with override_settings(MIDDLEWARE=MIDDLEWARE, RATEWARDEN={"ENGINE": engine}):
        asyncio.run(main())
