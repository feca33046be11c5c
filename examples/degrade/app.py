"""Serve less instead of refusing: a Starlette app whose pictures get smaller as a
caller goes over its limit.

    .venv/bin/python examples/degrade/app.py          # a short run, printed
    uvicorn examples.degrade.app:app                  # the app itself

The rule (``rules.yaml`` beside this file) lets each client have 10 full-size
pictures a minute; past that, ``action: degrade`` lets the requests through
and says how far over the caller is: 0 at the limit, 1 at three times it. The
middleware leaves that level in ``request.state.ratewarden_degrade``, and the
endpoint picks a smaller picture for a higher level; the client also sees
``X-RateLimit-Degraded``.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratewarden import AsyncMemoryStore, FakeClock
from ratewarden.integrations.asgi import RateLimitMiddleware
from ratewarden.rules import AsyncRuleEngine

RULES = Path(__file__).with_name("rules.yaml")
SIZES = [(1.0, 240), (0.6, 480), (0.3, 720), (0.01, 900), (0.0, 1080)]  # level at least -> height


async def picture(request: Request) -> JSONResponse:
    level = getattr(request.state, "ratewarden_degrade", 0.0)
    height = next(h for at_least, h in SIZES if level >= at_least)
    return JSONResponse({"picture": request.path_params["name"], "height": height})


def make_app(store: AsyncMemoryStore | None = None) -> Starlette:
    engine = AsyncRuleEngine(RULES, AsyncMemoryStore() if store is None else store)
    middleware = [Middleware(RateLimitMiddleware, engine=engine)]
    return Starlette(routes=[Route("/pictures/{name}", picture)], middleware=middleware)


app = make_app()


def main() -> None:
    from starlette.testclient import TestClient  # noqa: PLC0415 - the demo only

    clock = FakeClock(1_700_000_040.0)  # a minute's edge: the window starts whole
    client = TestClient(make_app(AsyncMemoryStore(clock=clock)), client=("203.0.113.7", 4000))
    for n in range(1, 33):
        response = client.get(f"/pictures/cat-{n}.jpg")
        level = response.headers.get("x-ratelimit-degraded", "-")
        print(f"request {n:2}: {response.status_code} height {response.json()['height']:4}"
              f"  X-RateLimit-Degraded: {level}")  # fmt: skip


if __name__ == "__main__":
    main()
