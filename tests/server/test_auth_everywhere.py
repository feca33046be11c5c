"""Every endpoint but health refuses a missing or wrong token, on both
listeners, and the token never shows in what the service says back (its
answers and /metrics). The endpoints come from the OpenAPI document and the
gRPC server's own method table, so a new one is covered the day it is added."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ratewarden import AsyncMemoryStore
from ratewarden.server import Service
from ratewarden.server._grpc_server import GrpcServer
from ratewarden.server._openapi import openapi
from ratewarden.server.h2._grpc import Status
from tests.server.conftest import client_for, make_app
from tests.server.h2.h2_attacks import message
from tests.server.h2.test_h2 import client

TOKEN = "tok-4f1c9e"
PUBLIC_HTTP = {"/healthz", "/readyz", "/"}  # "/": the dashboard's page, which holds no data
STREAMS = {"/v1/events"}  # answered with the token, it never ends: test_dashboard*.py read it
WRONG = [None, "Bearer nope", "Bearer " + TOKEN[:-1], "Basic " + TOKEN, TOKEN]


def _operations() -> list[tuple[str, str]]:
    document = openapi(secured=True)
    out = []
    for path, item in document["paths"].items():
        for method in item:
            concrete = path.replace("{key}", "k1")
            out.append((method.upper(), concrete))
    out.append(("GET", "/auth"))
    return sorted(set(out))


@pytest.mark.parametrize(("method", "path"), _operations())
def test_http_refuses_a_missing_or_wrong_token(rules_file: Path, method: str, path: str) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, token=TOKEN)) as http:
            for header in WRONG:
                headers = {} if header is None else {"Authorization": header}
                answer = await http.request(method, path, headers=headers, json={})
                if path in PUBLIC_HTTP:
                    assert answer.status_code in (200, 503), answer.text
                else:
                    assert answer.status_code == 401, (method, path, header, answer.text)
                assert TOKEN not in answer.text
            if path not in STREAMS:
                ok = await http.request(method, path, json={},
                                        headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
                assert ok.status_code != 401
            metrics = await http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            assert TOKEN not in metrics.text

    asyncio.run(main())


def test_grpc_refuses_a_missing_or_wrong_token_on_every_method_but_health(
    rules_file: Path,
) -> None:
    async def main() -> None:
        service = Service(rules_file, AsyncMemoryStore())
        server = GrpcServer(service, "127.0.0.1:0", token=TOKEN)
        await server.start()
        try:
            methods: dict[bytes, Any] = server.server.methods
            assert len(methods) >= 5
            async with client(server.port) as c:
                for path, method in methods.items():
                    if method.public and method.kind == "streaming":
                        continue  # Health/Watch: public, and it never ends by itself
                    for header in WRONG:
                        extra = () if header is None else ((b"authorization", header.encode()),)
                        answer = await c.call(path.decode(), message(b""), headers=extra)
                        if method.public:
                            assert answer.status != Status.UNAUTHENTICATED, path
                        else:
                            assert answer.status == Status.UNAUTHENTICATED, (path, header)
                        assert TOKEN.encode() not in answer.message
        finally:
            await server.stop(0)
            await service.aclose()

    asyncio.run(main())
