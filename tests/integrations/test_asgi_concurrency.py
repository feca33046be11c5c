"""The ASGI middleware's ``concurrency`` option: a request holds a slot for its
whole duration, a streaming response's last chunk included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ratewarden import AsyncConcurrencyLimiter, AsyncLimiter
from ratewarden.integrations.asgi import RateLimitMiddleware, Scope

Message = dict[str, Any]


def scope(ip: str = "10.0.0.1") -> Scope:
    return {"type": "http", "method": "GET", "path": "/", "headers": [], "client": (ip, 1)}


class Streaming:
    """An app that streams three chunks, each sent when the test lets it go."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        self.started.set()
        for chunk in (b"a", b"b"):
            await self.go.wait()
            self.go.clear()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await self.go.wait()
        await send({"type": "http.response.body", "body": b"c"})


async def call(app: Any, request: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(request, receive, send)
    return sent


async def streaming_holds() -> None:
    inner = Streaming()
    limiter = AsyncConcurrencyLimiter(1, lease=5.0, name="asgi")
    app = RateLimitMiddleware(inner, AsyncLimiter("1000/second"), concurrency=limiter)
    first = asyncio.create_task(call(app, scope()))
    await inner.started.wait()
    for _ in range(2):  # while the body streams, the slot stays taken
        assert await limiter.in_flight("10.0.0.1") == 1
        refused = await call(app, scope())
        assert refused[0]["status"] == 429
        assert (b"retry-after", b"5") in refused[0]["headers"]
        assert json.loads(refused[1]["body"])["detail"].startswith("too many requests in flight")
        other = asyncio.create_task(call(app, scope("10.0.0.2")))  # another client's own slot
        await asyncio.sleep(0.01)
        assert await limiter.in_flight("10.0.0.2") == 1
        other.cancel()  # the slot comes back on cancellation too
        with pytest.raises(asyncio.CancelledError):
            await other
        assert await limiter.in_flight("10.0.0.2") == 0
        inner.go.set()
        await asyncio.sleep(0.01)
    assert await limiter.in_flight("10.0.0.1") == 1  # the last chunk is not sent yet
    inner.go.set()
    sent = await first
    assert [m.get("body") for m in sent[1:]] == [b"a", b"b", b"c"]
    assert await limiter.in_flight("10.0.0.1") == 0
    assert limiter.stats.timeouts == 2


def test_a_streaming_response_holds_its_slot_until_its_last_chunk() -> None:
    asyncio.run(streaming_holds())


async def waits_for_a_slot() -> int:
    inner = Streaming()
    limiter = AsyncConcurrencyLimiter(1, lease=5.0, name="asgi-wait")
    app = RateLimitMiddleware(
        inner, AsyncLimiter("1000/second"), concurrency=limiter,
        concurrency_key=lambda scope: "everyone", concurrency_wait=2.0,
    )  # fmt: skip
    first = asyncio.create_task(call(app, scope()))
    await inner.started.wait()
    second = asyncio.create_task(call(app, scope("10.0.0.9")))
    await asyncio.sleep(0.02)
    assert not second.done()  # waiting for the one slot
    for _ in range(3):
        inner.go.set()
        await asyncio.sleep(0.01)
    await first
    for _ in range(3):
        await asyncio.sleep(0.01)
        inner.go.set()
    sent = await second
    return int(sent[0]["status"])


def test_a_request_waits_up_to_concurrency_wait() -> None:
    assert asyncio.run(waits_for_a_slot()) == 200


def test_without_the_option_nothing_is_held() -> None:
    async def run() -> None:
        inner = Streaming()
        app = RateLimitMiddleware(inner, AsyncLimiter("1000/second"))
        first = asyncio.create_task(call(app, scope()))
        await inner.started.wait()
        second = asyncio.create_task(call(app, scope()))
        await asyncio.sleep(0.01)
        assert not second.done()  # the app runs for both: no 429
        for _ in range(6):
            inner.go.set()
            await asyncio.sleep(0.01)
        await asyncio.gather(first, second)

    asyncio.run(run())


def test_bad_options_are_refused() -> None:
    with pytest.raises(TypeError, match="AsyncConcurrencyLimiter"):
        RateLimitMiddleware(Streaming(), AsyncLimiter("1/second"), concurrency="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_wait must be >= 0"):
        RateLimitMiddleware(
            Streaming(), AsyncLimiter("1/second"),
            concurrency=AsyncConcurrencyLimiter(1), concurrency_wait=-1,
        )  # fmt: skip
