"""``POST /v1/settle``: a check of a rule that counts by response answers a
``settle`` token, and the settle gives back what the response's status does not
count, or corrects an estimate to the actual cost; a token no check answered is
a 404, a second settle a 409, a negative cost a 400, never a 500."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from ratewarden import AsyncMemoryStore
from ratewarden.primitives import FakeClock
from ratewarden.server import App, Service, openapi
from tests.server.conftest import client_for

RULES = textwrap.dedent("""
    rules:
      - name: login-failures
        rate: 5/minute
        algorithm: fixed_window
        by: ip
        match: {paths: /login}
        count: {status: [401, 403]}
      - name: llm-tokens
        rate: 1000/hour
        algorithm: fixed_window
        by: user
        match: {paths: /v1/chat}
        settle: true
      - name: everything
        rate: 100000/minute
""")


@pytest.fixture
def app(tmp_path: Path) -> App:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return App(Service(rules, AsyncMemoryStore(clock=FakeClock())))


LOGIN = {"attributes": {"path": "/login", "ip": "198.51.100.9", "method": "POST"}}


def test_only_the_failed_logins_count(app: App) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            for status in [200] * 10 + [401] * 5:
                answer = await client.post("/v1/check", json=LOGIN)
                assert answer.status_code == 200, answer.text
                body = answer.json()
                assert body["allowed"]
                settled = await client.post(
                    "/v1/settle", json={"token": body["settle"], "status": status}
                )
                assert settled.status_code == 200, settled.text
                assert settled.json()["refunded"] == (1 if status == 200 else 0)
                assert settled.json()["changes"][0][:2] == ["login-failures", "198.51.100.9"]
            refused = (await client.post("/v1/check", json=LOGIN)).json()
            assert not refused["allowed"]
            assert refused["rule"] == "login-failures"
            assert "settle" not in refused
            other = (await client.post("/v1/check", json={"attributes": {"path": "/"}})).json()
            assert "settle" not in other  # no rule of it settles: the answer as it always was

    asyncio.run(main())


def test_a_token_settles_once_and_a_made_up_one_not_at_all(app: App) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            token = (await client.post("/v1/check", json=LOGIN)).json()["settle"]
            first = await client.post("/v1/settle", json={"token": token, "status": 200})
            assert first.status_code == 200
            again = await client.post("/v1/settle", json={"token": token, "status": 200})
            assert again.status_code == 409
            assert "settled already" in again.json()["error"]
            for bad in ("nonsense", token[:-3] + "AAA", "x" * 20_000):
                answer = await client.post("/v1/settle", json={"token": bad, "status": 200})
                assert answer.status_code == 404, answer.text
                assert "not one a check" in answer.json()["error"] or "string" in answer.text

    asyncio.run(main())


def test_an_estimate_is_settled_at_the_actual_cost(app: App) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            chat = {"attributes": {"path": "/v1/chat", "user": "ann"}, "cost": 500}
            body = (await client.post("/v1/check", json=chat)).json()
            assert body["allowed"]
            assert body["remaining"] == 500
            token = body["settle"]
            negative = await client.post("/v1/settle", json={"token": token, "cost": -1})
            assert negative.status_code == 400
            assert ">= 0" in negative.json()["error"]
            fraction = await client.post("/v1/settle", json={"token": token, "cost": 2.5})
            assert fraction.status_code == 400
            settled = await client.post("/v1/settle", json={"token": token, "cost": 120})
            assert settled.status_code == 200, settled.text
            assert settled.json()["refunded"] == 380
            after = (await client.post("/v1/check", json={**chat, "cost": 1})).json()
            assert after["remaining"] == 1000 - 120 - 1
            twice = await client.post("/v1/settle", json={"token": token, "cost": 1})
            assert twice.status_code == 409

    asyncio.run(main())


def test_a_settle_without_what_the_rule_needs_is_a_400(app: App) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            token = (await client.post("/v1/check", json=LOGIN)).json()["settle"]
            for body in ({"token": token}, {"token": token, "cost": 3},
                         {"token": token, "status": 1000}):  # fmt: skip
                answer = await client.post("/v1/settle", json=body)
                assert answer.status_code == 400, answer.text
            unknown = await client.post("/v1/settle", json={"token": token, "state": 1})
            assert unknown.status_code == 422
            # refused settles left it open
            done = await client.post("/v1/settle", json={"token": token, "status": 403})
            assert done.status_code == 200

    asyncio.run(main())


def test_the_settle_endpoint_is_in_the_openapi_document() -> None:
    document = openapi()
    post = document["paths"]["/v1/settle"]["post"]
    assert set(post["responses"]) >= {"200", "400", "404", "409"}
    schemas = document["components"]["schemas"]
    assert set(schemas["SettleRequest"]["properties"]) == {"token", "status", "cost"}
    assert "settle" in schemas["CheckResult"]["properties"]


def test_auth_hands_the_token_to_the_gateway_in_a_header(app: App) -> None:
    """A gateway sees only the request: /auth answers the token in
    X-Ratewarden-Settle, for the gateway to pass on to the backend, which settles."""

    async def main() -> None:
        async with client_for(app) as client:
            headers = {"X-Original-URI": "/login", "X-Original-Method": "POST",
                       "X-Forwarded-For": "198.51.100.10"}  # fmt: skip
            for _ in range(8):
                answer = await client.get("/auth", headers=headers)
                assert answer.status_code == 200
                token = answer.headers["x-ratewarden-settle"]
                settled = await client.post("/v1/settle", json={"token": token, "status": 200})
                assert settled.json()["refunded"] == 1
            plain = await client.get("/auth", headers={"X-Original-URI": "/"})
            assert "x-ratewarden-settle" not in plain.headers

    asyncio.run(main())
