"""Without a token, the admin endpoints answer only requests for a loopback
name: a web page in a browser on the same machine reaching the port through DNS
rebinding sends its own name as the Host, and is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import make_app

BODY = {"limits": ["5/minute"], "for": 60, "reason": "r"}


async def answer(
    rules: Path, host: str, method: str, path: str, *, token: str | None = None
) -> httpx.Response:
    app = make_app(rules, token=token)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    headers = {"host": host} | ({"authorization": f"Bearer {token}"} if token else {})
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        json = BODY if method == "PUT" else None
        return await client.request(method, path, headers=headers, json=json)


ADMIN = [("PUT", "/v1/overrides/search"), ("GET", "/v1/overrides"), ("POST", "/v1/reload"),
         ("DELETE", "/v1/keys/u1"), ("GET", "/v1/events")]  # fmt: skip


@pytest.mark.parametrize(("method", "path"), ADMIN)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "10.0.0.7:8080", ""])
def test_another_name_is_refused(rules_file: Path, host: str, method: str, path: str) -> None:
    got = asyncio.run(answer(rules_file, host, method, path))
    assert got.status_code == 403
    assert "--token-file" in got.json()["error"]


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080"])
def test_a_loopback_name_is_served(rules_file: Path, host: str) -> None:
    got = asyncio.run(answer(rules_file, host, "PUT", "/v1/overrides/search"))
    assert got.status_code == 200, got.text


def test_checks_and_a_token_do_not_look_at_the_name(rules_file: Path) -> None:
    check = asyncio.run(answer(rules_file, "evil.example", "GET", "/v1/rules"))
    assert check.status_code == 200
    admin = asyncio.run(answer(rules_file, "evil.example", "GET", "/v1/overrides", token="t"))
    assert admin.status_code == 200
