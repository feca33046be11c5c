"""A rule file's concurrency rules in the ASGI and WSGI middleware: a request
holds a slot of each that applies for its whole duration (a streaming
response's last chunk included) and gives it back however it ends; a full
limit answers as the rule says, with Retry-After."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
import pytest

from ratewarden import AsyncConcurrencyLimiter, AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.integrations import asgi, wsgi
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads
from ratewarden.stores.redis import AsyncRedisStore
from tests.redis_server import RedisServer

RULES = """
rules:
  - name: in-flight
    concurrency: 2
    lease: 30
    by: ip
  - name: per-second
    rate: 1000/second
    by: ip
"""
Message = dict[str, Any]


def engine_of(kind: str, rules: str = RULES, clock: FakeClock | None = None) -> Any:
    clock = clock or FakeClock()
    if kind == "async":
        return AsyncRuleEngine(loads(rules), AsyncMemoryStore(clock=clock))
    return RuleEngine(loads(rules), MemoryStore(clock=clock))


def scope(ip: str = "10.0.0.1") -> asgi.Scope:
    return {"type": "http", "method": "GET", "path": "/", "headers": [], "client": (ip, 1)}


class Streaming:
    """An ASGI app that starts its response, then sends each of three chunks when
    the test lets it go."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.started = 0

    async def __call__(self, scope: asgi.Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        self.started += 1
        for chunk in (b"a", b"b"):
            await self.go.wait()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await self.go.wait()
        await send({"type": "http.response.body", "body": b"c"})


async def call(app: Any, request: asgi.Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        await asyncio.Event().wait()  # the client says nothing more
        raise AssertionError

    async def send(message: Message) -> None:
        sent.append(message)

    await app(request, receive, send)
    return sent


async def refused(app: Any, request: asgi.Scope) -> list[Message]:
    """A call the middleware answers at once (a refusal: the app never runs)."""
    return await asyncio.wait_for(call(app, request), 5)


async def until(condition: Any) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never came to pass")


def in_flight(engine: Any) -> int:
    return int(engine.holds.in_flight().get("in-flight", 0))


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_asgi_two_slots_hold_for_the_whole_streaming_response(kind: str) -> None:
    async def main() -> None:
        engine = engine_of(kind)
        inner = Streaming()
        app = asgi.RateLimitMiddleware(inner, engine)
        slow = [asyncio.create_task(call(app, scope())) for _ in range(2)]
        await until(lambda: inner.started == 2)
        third = await refused(app, scope())  # a third while two stream: refused
        assert third[0]["status"] == 429
        assert (b"retry-after", b"30") in third[0]["headers"]
        assert json.loads(third[1]["body"])["violated-policies"] == ["in-flight"]
        inner.go.set()  # the chunks go out; until the last one the slots are held
        sent = await asyncio.gather(*slow)
        assert [[m.get("body") for m in s[1:]] for s in sent] == [[b"a", b"b", b"c"]] * 2
        assert in_flight(engine) == 0
        inner.go = asyncio.Event()
        after = asyncio.create_task(call(app, scope()))
        await until(lambda: inner.started == 3)
        assert in_flight(engine) == 1
        inner.go.set()
        assert (await after)[0]["status"] == 200

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_asgi_the_slot_is_held_until_the_last_chunk(kind: str) -> None:
    async def main() -> None:
        engine = engine_of(kind, RULES.replace("concurrency: 2", "concurrency: 1"))
        app = asgi.RateLimitMiddleware(Stepped(), engine)
        first = asyncio.create_task(call(app, scope()))
        stepped = app.app
        assert isinstance(stepped, Stepped)
        for _ in range(3):  # before each chunk, and after two of them
            await until(lambda: stepped.waiting)
            assert in_flight(engine) == 1
            assert (await refused(app, scope()))[0]["status"] == 429
            stepped.step()
        await first  # the last chunk is sent: the slot is back
        assert in_flight(engine) == 0
        stepped.free = True
        assert (await call(app, scope()))[0]["status"] == 200

    asyncio.run(main())


class Stepped:
    """An ASGI app whose every chunk waits for `step`, unless ``free``."""

    def __init__(self) -> None:
        self.waiting = False
        self.free = False
        self._go = asyncio.Event()

    def step(self) -> None:
        self.waiting = False
        self._go.set()

    async def __call__(self, scope: asgi.Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for more in (True, True, False):
            if not self.free:
                self._go = asyncio.Event()
                self.waiting = True
                await self._go.wait()
            await send({"type": "http.response.body", "body": b"x", "more_body": more})


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_asgi_a_cancelled_or_failed_request_gives_its_slot_back(kind: str) -> None:
    async def main() -> None:
        engine = engine_of(kind)
        inner = Streaming()
        app = asgi.RateLimitMiddleware(inner, engine)
        held = [asyncio.create_task(call(app, scope())) for _ in range(2)]
        await until(lambda: inner.started == 2)
        assert in_flight(engine) == 2
        held[0].cancel()  # the client went away: the server cancels the request
        with pytest.raises(asyncio.CancelledError):
            await held[0]
        assert in_flight(engine) == 1

        async def boom(scope: asgi.Scope, receive: Any, send: Any) -> None:
            raise OSError("the client disconnected")

        with pytest.raises(OSError, match="disconnected"):
            await call(asgi.RateLimitMiddleware(boom, engine), scope())
        assert in_flight(engine) == 1
        inner.go.set()
        await held[1]
        assert in_flight(engine) == 0

    asyncio.run(main())


def test_asgi_a_rules_status_answers_a_refused_slot() -> None:
    async def main() -> None:
        engine = engine_of("async", RULES.replace("lease: 30", "lease: 30\n    status: 503"))
        inner = Streaming()
        app = asgi.RateLimitMiddleware(inner, engine)
        held = [asyncio.create_task(call(app, scope())) for _ in range(2)]
        await until(lambda: inner.started == 2)
        third = await refused(app, scope())
        assert third[0]["status"] == 503
        assert (b"retry-after", b"30") in third[0]["headers"]
        inner.go.set()
        await asyncio.gather(*held)

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_asgi_a_delay_rule_waits_for_a_slot(kind: str) -> None:
    rules = """
    rules:
      - name: in-flight
        concurrency: 1
        lease: 30
        action: delay
        max_wait: 10
    """

    async def main() -> None:
        engine = (AsyncRuleEngine(loads(rules), AsyncMemoryStore()) if kind == "async"
                  else RuleEngine(loads(rules), MemoryStore()))  # fmt: skip
        inner = Streaming()
        app = asgi.RateLimitMiddleware(inner, engine)
        first = asyncio.create_task(call(app, scope()))
        await until(lambda: inner.started == 1)
        second = asyncio.create_task(call(app, scope()))
        await until(lambda: engine.holds.stats.waiting.get("in-flight") == 1)
        assert inner.started == 1  # waiting, not refused, not run
        inner.go.set()
        await first
        assert (await second)[0]["status"] == 200
        assert inner.started == 2

    asyncio.run(main())


def test_asgi_settles_and_holds_one_request() -> None:
    rules = (
        RULES
        + """
  - name: failures
    rate: 2/minute
    by: ip
    count: {status: [401]}
"""
    )

    async def main() -> None:
        engine = engine_of("async", rules)

        async def ok(scope: asgi.Scope, receive: Any, send: Any) -> None:
            assert in_flight(engine) == 1  # held while the app runs
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        app = asgi.RateLimitMiddleware(ok, engine)
        for _ in range(5):  # a 200 is no failure: given back, never refused
            assert (await call(app, scope()))[0]["status"] == 200
        assert in_flight(engine) == 0

    asyncio.run(main())


# WSGI: each request on a thread of its own, as a server serves it


def environ(ip: str = "10.0.0.1") -> dict[str, Any]:
    return {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": ip}


class Blocking:
    """A WSGI app that streams three chunks, each when the test lets it go."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Semaphore(0)

    def __call__(self, environ: Any, start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        self.started.release()
        return self.chunks()

    def chunks(self) -> Iterator[bytes]:
        for chunk in (b"a", b"b", b"c"):
            assert self.go.wait(10)
            yield chunk


def unread(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
    """A start_response that keeps nothing."""
    return lambda data: None


def serve(app: Any, env: dict[str, Any]) -> tuple[str, dict[str, str], bytes]:
    """What a WSGI server does: call, iterate, close."""
    said: list[Any] = []
    body = app(env, lambda status, headers, exc_info=None: said.extend([status, headers]))
    try:
        data = b"".join(body)
    finally:
        getattr(body, "close", lambda: None)()
    return said[0], dict(said[1]), data


def test_wsgi_two_slots_hold_until_the_response_is_closed() -> None:
    engine = engine_of("sync")
    inner = Blocking()
    app = wsgi.RateLimitMiddleware(inner, engine)
    answers: list[tuple[str, dict[str, str], bytes]] = []
    threads = [threading.Thread(target=lambda: answers.append(serve(app, environ())))
               for _ in range(2)]  # fmt: skip
    for thread in threads:
        thread.start()
    for _ in threads:
        assert inner.started.acquire(timeout=10)
    status, headers, _ = serve(app, environ())  # a third while two stream: refused
    assert status.startswith("429")
    assert headers["Retry-After"] == "30"
    assert in_flight(engine) == 2
    inner.go.set()
    for thread in threads:
        thread.join(10)
    assert [(a[0], a[2]) for a in answers] == [("200 OK", b"abc")] * 2
    assert in_flight(engine) == 0
    assert serve(app, environ())[0] == "200 OK"


def test_wsgi_a_response_closed_early_or_an_app_that_raises_gives_the_slot_back() -> None:
    engine = engine_of("sync")
    inner = Blocking()
    inner.go.set()
    app = wsgi.RateLimitMiddleware(inner, engine)
    body = app(environ(), unread)
    assert next(iter(body)) == b"a"
    assert in_flight(engine) == 1  # iterating: held
    body.close()  # type: ignore[attr-defined]  # the client went away: the server closes
    assert in_flight(engine) == 0

    def boom(environ: Any, start_response: Any) -> Iterable[bytes]:
        raise RuntimeError("the app failed")

    with pytest.raises(RuntimeError):
        wsgi.RateLimitMiddleware(boom, engine)(environ(), unread)
    assert in_flight(engine) == 0


def test_wsgi_a_delay_rule_waits_for_a_slot() -> None:
    engine = RuleEngine(loads("""
        rules:
          - name: in-flight
            concurrency: 1
            lease: 30
            action: delay
            max_wait: 10
        """), MemoryStore())  # fmt: skip
    inner = Blocking()
    app = wsgi.RateLimitMiddleware(inner, engine)
    answers: list[str] = []
    first = threading.Thread(target=lambda: answers.append(serve(app, environ())[0]))
    first.start()
    assert inner.started.acquire(timeout=10)
    second = threading.Thread(target=lambda: answers.append(serve(app, environ())[0]))
    second.start()
    deadline = threading.Event()
    for _ in range(1000):
        if engine.holds.stats.waiting.get("in-flight") == 1:
            break
        deadline.wait(0.001)
    assert engine.holds.stats.waiting.get("in-flight") == 1  # waiting, not refused
    inner.go.set()
    first.join(10)
    second.join(10)
    assert answers == ["200 OK", "200 OK"]


# Flask: the extension checks in before_request, the slots go back on close


def flask_app(engine: RuleEngine, inner: Blocking, decorated: bool) -> Any:
    from flask import Flask, Response, stream_with_context  # noqa: PLC0415

    from ratewarden.integrations.flask import RateLimiter, limit  # noqa: PLC0415

    app = Flask(__name__)

    def stream() -> Any:
        inner.started.release()
        return Response(stream_with_context(inner.chunks()))

    if decorated:
        app.get("/")(limit(engine)(stream))
    else:
        app.get("/")(stream)
        RateLimiter(app, engine)
    return app


@pytest.mark.parametrize("decorated", [False, True], ids=["extension", "limit"])
def test_flask_holds_the_slot_until_the_response_is_closed(decorated: bool) -> None:
    engine = engine_of("sync", RULES.replace("concurrency: 2", "concurrency: 1"))
    inner = Blocking()
    app = flask_app(engine, inner, decorated)
    env = {**environ(), "SERVER_NAME": "x", "SERVER_PORT": "80", "wsgi.url_scheme": "http"}
    body = app(dict(env), unread)
    assert inner.started.acquire(timeout=10)
    inner.go.set()
    chunks = iter(body)
    assert next(chunks) == b"a"
    assert in_flight(engine) == 1  # streaming: held
    second: list[tuple[str, dict[str, str], bytes]] = []
    other = threading.Thread(target=lambda: second.append(serve(app, dict(env))))
    other.start()  # on a thread of its own, as a server serves it
    other.join(10)
    status, headers, _ = second[0]
    if not status.startswith("429"):
        body.close()  # the stream's context goes now, not when collected

    assert status.startswith("429")
    assert headers["Retry-After"] == "30"
    assert b"".join(chunks) == b"bc"
    assert in_flight(engine) == 1  # sent, not closed yet
    body.close()
    assert in_flight(engine) == 0
    assert serve(app, dict(env))[0] == "200 OK"


class SlowRelease(AsyncRuleEngine):
    """A release that takes a few turns of the loop, as over a slow network."""

    async def arelease(self, token: str) -> tuple[tuple[str, str], ...]:
        for _ in range(3):
            await asyncio.sleep(0.005)
        return await super().arelease(token)


def test_asgi_on_redis_a_cancelled_request_gives_its_slot_back(redis_single: RedisServer) -> None:
    """On Redis the release suspends: it runs in a task of its own, which the
    request's cancellation leaves to finish, also when the request runs in an
    anyio task group (as Starlette's streaming responses do) whose cancelled
    scope cancels every await inside it again."""

    async def main() -> None:
        async with AsyncRedisStore(redis_single.url) as store:
            engine = SlowRelease(loads(RULES), store, overrides=False)
            inner = Streaming()
            app = asgi.RateLimitMiddleware(inner, engine)
            ip = f"10.9.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"
            async with anyio.create_task_group() as group:
                for _ in range(2):
                    group.start_soon(call, app, scope(ip))
                await until(lambda: inner.started == 2)
                assert (await refused(app, scope(ip)))[0]["status"] == 429
                group.cancel_scope.cancel()  # the client went away
            await until(lambda: in_flight(engine) == 0)
            limiter = AsyncConcurrencyLimiter(2, store=store, name="in-flight")
            assert await limiter.in_flight(ip) == 0  # given back in the store
            inner.go.set()
            assert (await call(app, scope(ip)))[0]["status"] == 200

    asyncio.run(main())
