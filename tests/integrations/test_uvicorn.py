"""The ASGI middleware under a real uvicorn on a free loopback port, hit over HTTP."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ratewarden import AsyncMemoryStore
from ratewarden.integrations.asgi import RateLimitMiddleware
from ratewarden.rules import AsyncRuleEngine, RuleSet, loads

from .conftest import RATE_HEADERS, expected_headers, state


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


def app_for(engine: AsyncRuleEngine) -> Starlette:
    routes = [Route(p, hello) for p in ("/api/items", "/slow", "/free")]
    return Starlette(routes=routes, middleware=[Middleware(RateLimitMiddleware, engine=engine)])


@contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """uvicorn serving ``app`` on a loopback socket bound to a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_headers_and_rejection_over_real_http(
    aengine: AsyncRuleEngine, astore: AsyncMemoryStore, ruleset: RuleSet
) -> None:
    with serving(app_for(aengine)) as url, httpx.Client(base_url=url) as client:
        for remaining in (2, 1, 0):
            response = client.get("/api/items")
            assert response.status_code == 200
            now = state(astore, ruleset, "api", "127.0.0.1")
            assert now.remaining == remaining
            shown = {k: v for k, v in response.headers.items() if k in RATE_HEADERS}
            assert shown == expected_headers(now, quota=3, window=60)
        refused = client.get("/api/items")
        assert refused.status_code == 429
        assert refused.headers["content-type"] == "application/problem+json"
        assert (
            int(refused.headers["retry-after"])
            >= state(astore, ruleset, "api", "127.0.0.1").retry_after
        )
        assert refused.json()["violated-policies"] == ["api"]


def test_a_delayed_request_does_not_block_the_server() -> None:
    """With the wall clock: the held request sleeps on the event loop, and a
    request arriving meanwhile is served at once."""
    ruleset = loads("""
rules:
  - {name: slow, rate: 4/second, algorithm: gcra, burst: 1, action: delay, max_wait: 2,
     match: {paths: /slow}}
""")
    engine = AsyncRuleEngine(ruleset, AsyncMemoryStore())  # the wall clock

    async def scenario(url: str) -> tuple[float, float, int]:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/slow")).status_code == 200
            start = time.monotonic()
            held = asyncio.create_task(client.get("/slow"))  # waits ~0.25 s
            await asyncio.sleep(0.02)
            assert (await client.get("/free")).status_code == 200
            free_done = time.monotonic() - start
            response = await held
            return free_done, time.monotonic() - start, response.status_code

    with serving(app_for(engine)) as url:
        free_done, held_done, status = asyncio.run(scenario(url))
    assert status == 200
    assert held_done >= 0.2  # it was held about one emission interval (0.25 s)
    assert free_done < held_done  # ...while the other request went through


def test_a_client_that_goes_away_mid_stream_gives_its_slot_back() -> None:
    """A concurrency rule's slot, held while Starlette streams a response, comes
    back when the client closes the connection mid-stream (Starlette cancels the
    stream when it hears the disconnect)."""
    engine = AsyncRuleEngine(loads("""
        rules:
          - {name: in-flight, concurrency: 1, lease: 60, by: ip}
        """), AsyncMemoryStore())  # fmt: skip

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"x" * 1024
            await asyncio.sleep(0.01)

    async def stream(request: Request) -> Response:
        return StreamingResponse(endless())

    app = Starlette(routes=[Route("/stream", stream), Route("/free", hello)],
                    middleware=[Middleware(RateLimitMiddleware, engine=engine)])  # fmt: skip
    with serving(app) as url, httpx.Client(base_url=url) as client:
        with client.stream("GET", "/stream") as streaming:
            assert streaming.status_code == 200
            chunks = streaming.iter_bytes()  # kept: a dropped one closes the response
            next(chunks)  # the stream is flowing: the slot is held
            assert engine.holds.in_flight() == {"in-flight": 1}
            assert client.get("/free").status_code == 429
        with httpx.Client(base_url=url) as other:  # the first connection is closed
            deadline = time.monotonic() + 10  # for the server to hear it, not a clock edge
            while engine.holds.in_flight() != {"in-flight": 0}:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert other.get("/free").status_code == 200
