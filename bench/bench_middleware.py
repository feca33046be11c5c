"""Middleware overhead: a trivial endpoint with and without the rate limiter.

Run from the project root:

    .venv/bin/python bench/bench_middleware.py           # full run, about a minute
    .venv/bin/python bench/bench_middleware.py --quick   # smoke run, a few seconds

What it measures: microseconds per request of a trivial Starlette endpoint and a
trivial Flask view, each called in-process (the ASGI app awaited with a pre-built
scope; the WSGI app called with a fresh environ), so the difference is the
middleware's own cost and no network or server noise is in it. Candidates:

- ``starlette``: the bare app; ``starlette+ratewarden``: the same app with
  `RateLimitMiddleware` in its middleware list, an `AsyncRuleEngine` on an
  `AsyncMemoryStore`; ``...headers=none``: the same without rate-limit headers
  (the share of building them);
- ``flask``: the bare app; ``flask+extension``: with the `RateLimiter` extension;
  ``flask+wsgi``: with the WSGI `RateLimitMiddleware` around ``app.wsgi_app``.

The rule file is one rule counting per client ip at 10**9/minute with the default
sliding window counter, so every timed request is admitted and counted (the
common path), one key. Candidates of one framework run round robin, order
rotating each round; the table gives the minimum (what the target uses) and the
median over rounds of the mean us per request, and the overhead (minimum with
minus minimum without). Target: <= 30 us per request.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import io
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratewarden import AsyncMemoryStore, MemoryStore
from ratewarden.integrations.asgi import RateLimitMiddleware
from ratewarden.integrations.flask import RateLimiter
from ratewarden.integrations.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware
from ratewarden.rules import AsyncRuleEngine, RuleEngine, loads

RULES = "rules: [{name: per-ip, rate: 1000000000/minute, by: ip}]"
TARGET_US = 30.0


# --- Starlette, in-process ---------------------------------------------------


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


def starlette_app(*, limited: bool, headers: str = "all") -> Any:
    middleware = []
    if limited:
        engine = AsyncRuleEngine(loads(RULES), AsyncMemoryStore())
        middleware.append(Middleware(RateLimitMiddleware, engine=engine, headers=headers))
    return Starlette(routes=[Route("/hello", hello)], middleware=middleware)


SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "http_version": "1.1",
    "method": "GET",
    "scheme": "http",
    "path": "/hello",
    "raw_path": b"/hello",
    "root_path": "",
    "query_string": b"",
    "headers": [
        (b"host", b"api.example"),
        (b"user-agent", b"bench/1.0"),
        (b"accept", b"*/*"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"connection", b"keep-alive"),
    ],
    "client": ("203.0.113.7", 50000),
    "server": ("127.0.0.1", 8000),
}


def asgi_runner(app: Any, loop: asyncio.AbstractEventLoop) -> Callable[[int], float]:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def many(n: int) -> None:
        for _ in range(n):
            await app(dict(SCOPE), receive, send)

    def run(n: int) -> float:
        statuses.clear()
        gc.collect()
        start = time.perf_counter()
        loop.run_until_complete(many(n))
        elapsed = time.perf_counter() - start
        if statuses != [200] * n:
            raise RuntimeError(f"unexpected statuses: {sorted(set(statuses))}")
        return elapsed / n * 1e6

    return run


# --- Flask, in-process ---------------------------------------------------------


def flask_app(kind: str) -> Any:
    app = Flask("bench")

    @app.get("/hello")
    def hello_view() -> str:
        return "hello"

    engine = RuleEngine(loads(RULES), MemoryStore())
    if kind == "extension":
        RateLimiter(app, engine)
    elif kind == "wsgi":
        app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, engine)  # type: ignore[method-assign]
    return app


ENVIRON = {
    "REQUEST_METHOD": "GET",
    "SCRIPT_NAME": "",
    "PATH_INFO": "/hello",
    "QUERY_STRING": "",
    "SERVER_NAME": "api.example",
    "SERVER_PORT": "80",
    "SERVER_PROTOCOL": "HTTP/1.1",
    "REMOTE_ADDR": "203.0.113.7",
    "HTTP_HOST": "api.example",
    "HTTP_USER_AGENT": "bench/1.0",
    "HTTP_ACCEPT": "*/*",
    "HTTP_ACCEPT_ENCODING": "gzip, deflate",
    "HTTP_CONNECTION": "keep-alive",
    "wsgi.version": (1, 0),
    "wsgi.url_scheme": "http",
    "wsgi.multithread": False,
    "wsgi.multiprocess": False,
    "wsgi.run_once": False,
}


def wsgi_runner(app: Any) -> Callable[[int], float]:
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        statuses.append(status)
        return None

    def run(n: int) -> float:
        statuses.clear()
        gc.collect()
        start = time.perf_counter()
        for _ in range(n):
            environ = dict(ENVIRON)
            environ["wsgi.input"] = io.BytesIO(b"")
            environ["wsgi.errors"] = sys.stderr
            body: Iterable[bytes] = app(environ, start_response)
            for _chunk in body:
                pass
            close = getattr(body, "close", None)
            if close is not None:
                close()
        elapsed = time.perf_counter() - start
        if any(not s.startswith("200") for s in statuses):
            raise RuntimeError(f"unexpected statuses: {sorted(set(statuses))}")
        return elapsed / n * 1e6

    return run


# --- the run -----------------------------------------------------------------------


def rounds(
    candidates: dict[str, Callable[[int], float]], n: int, count: int
) -> dict[str, list[float]]:
    for run in candidates.values():  # warm up: imports, first-call caches, keys
        run(max(n // 10, 10))
    results: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for i in range(count):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            results[name].append(candidates[name](n))
    return results


def table(title: str, results: dict[str, list[float]], base: str) -> list[str]:
    floor = min(results[base])
    lines = [
        f"{title}",
        "",
        "| candidate | min us/req | median us/req | overhead (min) |",
        "|---|---:|---:|---:|",
    ]
    for name, times in results.items():
        over = "" if name == base else f"{min(times) - floor:+.1f} us"
        lines.append(f"| {name} | {min(times):.1f} | {statistics.median(times):.1f} | {over} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args()
    n, count = (500, 3) if args.quick else (5_000, 9)

    loop = asyncio.new_event_loop()
    try:
        asgi = {
            "starlette": asgi_runner(starlette_app(limited=False), loop),
            "starlette+ratewarden": asgi_runner(starlette_app(limited=True), loop),
            "starlette+ratewarden headers=none": asgi_runner(
                starlette_app(limited=True, headers="none"), loop
            ),
        }
        asgi_results = rounds(asgi, n, count)
    finally:
        loop.close()
    wsgi = {
        "flask": wsgi_runner(flask_app("bare")),
        "flask+extension": wsgi_runner(flask_app("extension")),
        "flask+wsgi": wsgi_runner(flask_app("wsgi")),
    }
    wsgi_results = rounds(wsgi, n, count)

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"# bench_middleware.py, {dt.date.today()}, commit {commit or '?'}")
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.machine()}")
    print(f"# {n} requests per candidate per round, {count} rounds, round robin")
    print()
    for line in table("Starlette (ASGI, in-process)", asgi_results, "starlette"):
        print(line)
    print()
    for line in table("Flask (WSGI, in-process)", wsgi_results, "flask"):
        print(line)
    print()
    worst = max(
        min(asgi_results["starlette+ratewarden"]) - min(asgi_results["starlette"]),
        min(wsgi_results["flask+extension"]) - min(wsgi_results["flask"]),
        min(wsgi_results["flask+wsgi"]) - min(wsgi_results["flask"]),
    )
    verdict = "meets" if worst <= TARGET_US else "MISSES"
    print(f"largest overhead {worst:.1f} us per request: {verdict} the target ({TARGET_US:.0f} us)")


if __name__ == "__main__":
    main()
