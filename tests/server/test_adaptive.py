"""Adaptive limits through the service: PUT /v1/load/{signal} (admin, its
refusals), the effective limit in /v1/check's answer, in /auth's headers, in
/metrics, and the route in the OpenAPI document."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

from ratewarden import AsyncMemoryStore, FakeClock
from ratewarden.server import App, Service
from tests.server.conftest import client_for

RULES = textwrap.dedent("""
    rules:
      - name: api
        rate: 10/minute
        algorithm: fixed_window
        by: ip
        adaptive: {signal: p99_ms, good: 200, bad: 1000, floor: 20%}
      - name: plain
        rate: 5/minute
        match: {paths: /plain}
""")
START = 1_700_000_040.0
TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def app(tmp_path: Path, clock: FakeClock, **options: Any) -> App:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return App(Service(path, AsyncMemoryStore(clock=clock)), **options)


def test_a_load_set_through_the_api_applies_to_checks_and_auth(tmp_path: Path) -> None:
    clock = FakeClock(START)

    async def main() -> tuple[Any, list[dict[str, Any]], list[Any], str]:
        async with client_for(app(tmp_path, clock, token=TOKEN)) as client:
            load = await client.put("/v1/load/p99_ms", json={"value": 1000}, headers=AUTH)
            check = {"attributes": {"ip": "203.0.113.7"}}
            checks = [
                (await client.post("/v1/check", json=check, headers=AUTH)).json() for _ in range(3)
            ]
            auth = [await client.get("/auth", headers=AUTH) for _ in range(3)]
            metrics = (await client.get("/metrics", headers=AUTH)).text
        return load, checks, auth, metrics

    load, checks, auth, metrics = asyncio.run(main())
    assert load.status_code == 200
    assert load.json() == {
        "signal": "p99_ms", "value": 1000.0, "shared": False,
        "limits": {"api": {"limit": 10, "effective_limit": 2}},
    }  # fmt: skip
    assert [c["allowed"] for c in checks] == [True, True, False]
    assert checks[0]["limit"] == 2
    # /auth's requests come from the test client's address, a key of their own
    assert [a.status_code for a in auth] == [200, 200, 429]
    assert auth[0].headers["x-ratelimit-limit"] == "2"
    assert 'ratewarden_effective_limit{rule="api"} 2.0' in metrics
    assert 'ratewarden_load_signal{signal="p99_ms"} 1000.0' in metrics


def test_load_refusals_are_clear(tmp_path: Path) -> None:
    clock = FakeClock(START)

    async def main() -> list[tuple[int, str]]:
        async with client_for(app(tmp_path, clock, token=TOKEN, open_checks=True)) as client:
            answers = [
                await client.put("/v1/load/p99_ms", json={"value": 5}),  # no token
                await client.put("/v1/load/nope", json={"value": 5}, headers=AUTH),
                await client.put("/v1/load/p99_ms", json={"value": "high"}, headers=AUTH),
                await client.put("/v1/load/p99_ms", json={"value": True}, headers=AUTH),
                await client.put("/v1/load/p99_ms", content=b'{"value": 1e999}', headers=AUTH),
                await client.put("/v1/load/p99_ms", json={"value": 5, "x": 1}, headers=AUTH),
                await client.put("/v1/load/p99_ms", content=b"{", headers=AUTH),
                await client.put(
                    "/v1/load/p99_ms", content=b'{"value": 1, "value": 2}', headers=AUTH
                ),
                await client.put("/v1/load/", json={"value": 5}, headers=AUTH),
                await client.get("/v1/load/p99_ms", headers=AUTH),
            ]
        return [(a.status_code, a.json()["error"]) for a in answers]

    answers = asyncio.run(main())
    assert [status for status, _ in answers] == [401, 404, 422, 422, 422, 422, 400, 400, 400, 405]
    assert "no rule reads the load signal 'nope' (the rules read: p99_ms)" in answers[1][1]
    assert "out of range" in answers[4][1]


def test_the_openapi_document_has_the_route(tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        async with client_for(app(tmp_path, FakeClock(START))) as client:
            return (await client.get("/openapi.json")).json()  # type: ignore[no-any-return]

    document = asyncio.run(main())
    put = document["paths"]["/v1/load/{signal}"]["put"]
    assert put["operationId"] == "setLoad"
    assert set(put["responses"]) >= {"200", "404", "422"}
    assert "LoadRequest" in document["components"]["schemas"]


def test_envoy_descriptors_meet_the_effective_limit(tmp_path: Path) -> None:
    # the gRPC service (Envoy RLS) asks with descriptors, through the same engine
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    svc = Service(path, AsyncMemoryStore(clock=FakeClock(START)))
    svc.engine.set_load("p99_ms", 1000)

    async def main() -> list[Any]:
        descriptors = [[("remote_address", "203.0.113.8")]]
        return [await svc.check_descriptors("ratewarden", descriptors) for _ in range(3)]

    answers = asyncio.run(main())
    assert [a.allowed for a in answers] == [True, True, False]
    assert answers[0].limit == 2
    assert answers[0].headers["X-RateLimit-Limit"] == "2"
