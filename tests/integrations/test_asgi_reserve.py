"""The ASGI middleware's ``reserve`` option: a request reserves its estimate of
a token budget before the app runs and settles what the response says after."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ratewarden import AsyncLimiter, AsyncMemoryStore, Estimates, FakeClock
from ratewarden.integrations.asgi import RateLimitMiddleware, Reserved


def app_using(tokens: dict[str, int], *, via: str) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        used = tokens[scope["path"].strip("/")]
        headers = [(b"content-type", b"text/plain")]
        if via == "header":
            headers.append((b"x-tokens-used", str(used).encode()))
        else:
            scope.setdefault("state", {})["ratewarden_cost"] = used
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def client(middleware: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=middleware, client=("127.0.0.1", 5000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def budget(clock: FakeClock, **options: Any) -> AsyncLimiter:
    store = AsyncMemoryStore(clock=clock)
    return AsyncLimiter("1000/minute", store=store, algorithm="fixed_window", **options)


def test_the_actual_cost_from_a_header_or_the_state_is_what_the_budget_is_charged() -> None:
    for via in ("header", "state"):
        clock = FakeClock()
        limiter = budget(clock)
        reserved = Reserved(limiter, lambda s: "team", estimate=lambda s: 400,
                            actual_header="x-tokens-used")  # fmt: skip
        # the engine admits everything: the reservation is the budget that matters
        everyone = AsyncLimiter("1000000/second", store=AsyncMemoryStore(clock=clock))
        middleware = RateLimitMiddleware(app_using({"a": 150, "b": 300}, via=via), everyone,
                                         reserve=reserved)  # fmt: skip

        async def main(
            middleware: Any = middleware, limiter: Any = limiter
        ) -> tuple[list[int], int]:
            async with client(middleware) as http:
                codes = [(await http.get(p)).status_code for p in ("/a", "/b", "/a", "/b")]
            remaining = (await limiter.peek("team")).remaining
            return codes, remaining

        codes, remaining = asyncio.run(main())
        # 150 + 300 + 150 settled: 600 used; the fourth's estimate of 400 still fits
        assert codes == [200, 200, 200, 200], via
        assert remaining == 1000 - (150 + 300 + 150 + 300), via


def test_a_request_whose_estimate_does_not_fit_is_refused_before_the_app_runs() -> None:
    clock = FakeClock()
    limiter = budget(clock)
    ran: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    everyone = AsyncLimiter("1000000/second", store=AsyncMemoryStore(clock=clock))
    middleware = RateLimitMiddleware(
        app, everyone, reserve=Reserved(limiter, lambda s: "team", estimate=lambda s: 600)
    )

    async def main() -> list[httpx.Response]:
        async with client(middleware) as http:
            return [await http.get("/x"), await http.get("/y")]

    first, second = asyncio.run(main())
    assert first.status_code == 200
    # no actual said: the estimate stays charged, and the next 600 does not fit
    assert second.status_code == 429
    assert int(second.headers["retry-after"]) >= 1
    assert ran == ["/x"]


def test_a_learned_estimate_follows_what_the_responses_said() -> None:
    clock = FakeClock()
    limiter = budget(clock, estimates=Estimates(ceiling=900))
    reserved = Reserved(limiter, lambda s: "team", profile=lambda s: "chat",
                        actual_header="x-tokens-used")  # fmt: skip
    everyone = AsyncLimiter("1000000/second", store=AsyncMemoryStore(clock=clock))
    middleware = RateLimitMiddleware(app_using({"c": 50}, via="header"), everyone, reserve=reserved)

    async def main() -> list[int]:
        async with client(middleware) as http:
            return [(await http.get("/c")).status_code for _ in range(12)]

    # with no history the ceiling (900) is reserved, then the learned 50: twelve
    # calls fit in 1000 only because the estimate learned
    assert asyncio.run(main()) == [200] * 12


def test_a_key_an_estimate_or_a_profile_may_be_a_plain_value_and_anything_else_is_refused() -> None:
    clock = FakeClock()
    limiter = budget(clock)
    everyone = AsyncLimiter("1000000/second", store=AsyncMemoryStore(clock=clock))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = RateLimitMiddleware(
        app, everyone, reserve=Reserved(limiter, "team-a", estimate=600)
    )

    async def main() -> tuple[list[int], int]:
        async with client(middleware) as http:
            codes = [(await http.get("/")).status_code for _ in range(2)]
        return codes, (await limiter.peek("team-a")).remaining

    assert asyncio.run(main()) == ([200, 429], 400)
    for wrong in ({"key": 7}, {"estimate": "600"}, {"estimate": True}, {"profile": 3}):
        options: dict[str, Any] = {"key": "k", "estimate": 1, **wrong}
        key = options.pop("key")
        with pytest.raises(TypeError, match="function of the request's scope"):
            Reserved(limiter, key, **options)
