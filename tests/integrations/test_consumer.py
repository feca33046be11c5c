"""Consumer side: limiter.slot, the httpx transports and the aiohttp client
middleware, on a FakeClock."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from ratewarden import (
    AsyncLimiter,
    AsyncMemoryStore,
    FakeClock,
    Limiter,
    MemoryStore,
    RateLimitTimeout,
)
from ratewarden.integrations._consumer import MAX_PAUSE, retry_after_seconds
from ratewarden.integrations.aiohttp import RateLimitMiddleware
from ratewarden.integrations.httpx import AsyncRateLimitTransport, RateLimitTransport

SECOND = 1_000_000_000


def test_slot_as_context_manager_and_decorator(clock: FakeClock) -> None:
    limiter = Limiter("2/second", algorithm="gcra", burst=1, store=MemoryStore(clock=clock))
    start = clock.time_ns()
    with limiter.slot("api", max_wait=1.0) as permit:
        assert permit.allowed
    times = []

    @limiter.slot("api", max_wait=1.0)
    def call(n: int) -> int:
        times.append(clock.time_ns() - start)
        return n * 2

    assert [call(1), call(2)] == [2, 4]
    assert times == [SECOND // 2, SECOND]  # one permit per call, 0.5 s apart
    with pytest.raises(RateLimitTimeout), limiter.slot("api", max_wait=0):
        pass  # pragma: no cover


def test_async_slot(clock: FakeClock) -> None:
    limiter = AsyncLimiter(
        "2/second", algorithm="gcra", burst=1, store=AsyncMemoryStore(clock=clock)
    )
    start = clock.time_ns()

    @limiter.slot("api", max_wait=5)
    async def call() -> int:
        return clock.time_ns() - start

    async def main() -> list[int]:
        async with limiter.slot("api", max_wait=1.0) as permit:
            assert permit.remaining == 0
        return [await call(), await call()]

    assert asyncio.run(main()) == [SECOND // 2, SECOND]
    with pytest.raises(Exception, match="max_wait must be >= 0"):
        limiter.slot("api", max_wait=-1)


@pytest.mark.parametrize(
    ("algorithm", "burst", "expected"),
    [
        ("gcra", 1, 100),  # one every 20 ms: 0.00, 0.02, ..., 1.98 s
        ("token_bucket", 10, 109),  # 10 at once, then one every 20 ms from 0.02 s
        ("fixed_window", None, 100),  # 50 at the start of each of the two windows
    ],
)
def test_four_workers_share_50_per_second_for_2_seconds(
    algorithm: str, burst: int | None, expected: int
) -> None:
    clock = FakeClock(1_700_000_000)  # a window edge, so the fixed window splits evenly
    limiter = AsyncLimiter(
        "50/second", algorithm=algorithm, burst=burst, store=AsyncMemoryStore(clock=clock)
    )
    start = clock.time_ns()
    end = start + 2 * SECOND
    sent: list[tuple[int, int]] = []

    async def worker(n: int) -> None:
        while True:
            async with limiter.slot("downstream", max_wait=math.inf):
                now = clock.time_ns()
                if now >= end:
                    return
                sent.append((n, now - start))

    async def main() -> None:
        await asyncio.gather(*(worker(n) for n in range(4)))

    asyncio.run(main())
    assert len(sent) == expected
    times = sorted(t for _, t in sent)
    if algorithm == "gcra":
        assert times == [i * SECOND // 50 for i in range(100)]  # evenly spaced
    elif algorithm == "token_bucket":
        assert times[:10] == [0] * 10
        assert times[10:] == [i * SECOND // 50 for i in range(1, 100)]
    else:
        assert times.count(0) == 50
        assert times.count(SECOND) == 50
    assert {n for n, _ in sent} == {0, 1, 2, 3}  # every worker got permits


def provider(
    statuses: list[tuple[int, dict[str, str]]], seen: list[tuple[str, float]], clock: FakeClock
) -> Callable[[httpx.Request], httpx.Response]:
    """A mock provider answering ``statuses`` in turn, then 200; it notes when
    each request arrived (fake time) and for which host."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, clock.time_ns() / 1e9))
        status, headers = statuses.pop(0) if statuses else (200, {})
        return httpx.Response(status, headers=headers)

    return handle


def test_httpx_transport_paces_and_pauses_on_429(clock: FakeClock) -> None:
    limiter = Limiter("10/second", algorithm="gcra", burst=1, store=MemoryStore(clock=clock))
    seen: list[tuple[str, float]] = []
    mock = httpx.MockTransport(provider([(429, {"Retry-After": "5"})], seen, clock))
    t0 = clock.time_ns() / 1e9
    with httpx.Client(transport=RateLimitTransport(limiter, mock, max_wait=10)) as client:
        assert client.get("https://a.example/x").status_code == 429  # returned as it came
        assert client.get("https://b.example/x").status_code == 200  # another key: no pause
        assert client.get("https://a.example/x").status_code == 200  # waited for the pause
        assert client.get("https://a.example/x").status_code == 200
    hosts = [h for h, _ in seen]
    times = [round(t - t0, 6) for _, t in seen]
    assert hosts == ["a.example", "b.example", "a.example", "a.example"]
    assert times == [0.0, 0.0, 5.0, 5.1]  # the pause, then the limit's 100 ms spacing


def test_httpx_transport_max_wait(clock: FakeClock) -> None:
    limiter = Limiter("1/second", algorithm="gcra", burst=1, store=MemoryStore(clock=clock))
    seen: list[tuple[str, float]] = []
    mock = httpx.MockTransport(provider([(429, {"Retry-After": "30"})], seen, clock))
    with httpx.Client(transport=RateLimitTransport(limiter, mock, max_wait=0)) as client:
        client.get("https://a.example/")
        with pytest.raises(RateLimitTimeout, match="pause of 30s"):
            client.get("https://a.example/")  # the pause alone is longer than max_wait
        client.get("https://b.example/")
        with pytest.raises(RateLimitTimeout, match="no permit"):
            client.get("https://b.example/")  # max_wait=0: one try, no permit yet
    assert len(seen) == 2


def test_httpx_transport_with_a_key_function_and_an_http_date(clock: FakeClock) -> None:
    limiter = Limiter("100/second", store=MemoryStore(clock=clock))
    seen: list[tuple[str, float]] = []
    later = datetime.fromtimestamp(clock.time_ns() / 1e9 + 7, UTC)
    mock = httpx.MockTransport(
        provider([(503, {"Retry-After": format_datetime(later, usegmt=True)})], seen, clock)
    )
    transport = RateLimitTransport(limiter, mock, max_wait=60, key=lambda request: "one key")
    t0 = clock.time_ns() / 1e9
    with httpx.Client(transport=transport) as client:
        client.get("https://a.example/")
        client.get("https://b.example/")  # same key: paused too
    assert [round(t - t0) for _, t in seen] == [0, 7]


def test_async_httpx_transport(clock: FakeClock) -> None:
    limiter = AsyncLimiter(
        "10/second", algorithm="gcra", burst=1, store=AsyncMemoryStore(clock=clock)
    )
    seen: list[tuple[str, float]] = []
    mock = httpx.MockTransport(provider([(429, {"Retry-After": "2"})], seen, clock))

    async def main() -> list[int]:
        transport = AsyncRateLimitTransport(limiter, mock, max_wait=10)
        async with httpx.AsyncClient(transport=transport) as client:
            return [(await client.get("https://a.example/")).status_code for _ in range(3)]

    t0 = clock.time_ns() / 1e9
    assert asyncio.run(main()) == [429, 200, 200]
    assert [round(t - t0, 6) for _, t in seen] == [0.0, 2.0, 2.1]


def test_aiohttp_middleware_against_a_real_server(clock: FakeClock) -> None:
    limiter = AsyncLimiter(
        "10/second", algorithm="gcra", burst=1, store=AsyncMemoryStore(clock=clock)
    )
    arrivals: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        arrivals.append(clock.time_ns() / 1e9)
        if len(arrivals) == 1:
            return web.Response(status=429, headers={"Retry-After": "3"})
        return web.Response(text="ok")

    async def main() -> list[int]:
        app = web.Application()
        app.router.add_get("/", handle)
        async with TestServer(app, host="127.0.0.1") as server:
            middleware = RateLimitMiddleware(limiter, max_wait=10)
            async with aiohttp.ClientSession(middlewares=[middleware]) as session:
                statuses = []
                for _ in range(3):
                    async with session.get(server.make_url("/")) as response:
                        statuses.append(response.status)
                return statuses

    t0 = clock.time_ns() / 1e9
    assert asyncio.run(main()) == [429, 200, 200]
    assert [round(t - t0, 6) for t in arrivals] == [0.0, 3.0, 3.1]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 3 ", 3.0),
        (None, None),
        ("soon", None),
        ("-1", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_retry_after_values(value: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(value, 1_700_000_000 * SECOND) == seconds


def test_retry_after_is_ascii_seconds_capped_at_a_day() -> None:
    assert retry_after_seconds("\xb2", 0) is None  # "²": isdigit() but no number
    assert retry_after_seconds("99999999999999", 0) == MAX_PAUSE
    assert retry_after_seconds(" 7 ", 0) == 7.0
