"""The apps bench_asgi_servers.py serves: the service's own raw ASGI app, and the
same check behind a Starlette route (what the service would be on a framework)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ratewarden import AsyncMemoryStore
from ratewarden.server import App, CheckRequest, Service

RULES = Path(__file__).parent.parent / "examples" / "rules.yaml"
_service = Service(RULES, AsyncMemoryStore())
raw = App(_service)

_decode = msgspec.json.Decoder(CheckRequest).decode
_encode = msgspec.json.Encoder().encode


async def _check(request: Request) -> Response:
    result = await _service.check(_decode(await request.body()))
    return Response(_encode(result), media_type="application/json")


starlette = Starlette(routes=[Route("/v1/check", _check, methods=["POST"])])
