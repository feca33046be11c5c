"""The HTTP API's runtime overrides: set, list, clear, what is refused and
how; and two service processes on one Redis, where an override set on one is
in force on the other within a second."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.redis_server import RedisServer
from tests.server.conftest import client_for, make_app
from tests.server.process import serving

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
BODY = {"limits": ["5/minute"], "for": "30m", "reason": "incident 7", "by": "alice"}


def check_body(user: str) -> dict[str, Any]:
    return {"attributes": {"path": "/api/search", "user": user}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_set_list_and_clear(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, token=TOKEN)) as client:
            listed = (await client.get("/v1/overrides", headers=AUTH)).json()
            assert listed == {"overrides": [], "audit": [], "shared": False}
            answer = await client.put("/v1/overrides/search", json=BODY, headers=AUTH)
            assert answer.status_code == 200, answer.text
            override = answer.json()["override"]
            assert override["limits"] == ["5/minute"]
            assert override["replaces"] == ["2/minute"]
            assert override["by"] == "alice (from 127.0.0.1)"
            assert override["expires_in"] == 1800
            statuses = [
                (await client.post("/v1/check", json=check_body("u1"), headers=AUTH)).json()
                for _ in range(6)
            ]
            assert [s["allowed"] for s in statuses] == [True] * 5 + [False]
            assert statuses[0]["limit"] == 5
            listed = (await client.get("/v1/overrides", headers=AUTH)).json()
            assert [o["rule"] for o in listed["overrides"]] == ["search"]
            gone = await client.delete("/v1/overrides/search?reason=fixed&by=bob", headers=AUTH)
            assert gone.json() == {"rule": "search", "removed": True, "shared": False}
            again = await client.delete("/v1/overrides/search", headers=AUTH)
            assert again.json()["removed"] is False
            audit = (await client.get("/v1/overrides", headers=AUTH)).json()["audit"]
            assert [(a["action"], a["by"], a["reason"]) for a in audit] == [
                ("clear", "bob (from 127.0.0.1)", "fixed"),
                ("set", "alice (from 127.0.0.1)", "incident 7"),
            ]
            status = (await client.post("/v1/check", json=check_body("u2"), headers=AUTH)).json()
            assert status["limit"] == 2

    run(main())


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        ("PUT", "/v1/overrides/nope", BODY, 404, "no rule named 'nope'"),
        ("PUT", "/v1/overrides/search", {**BODY, "limits": "5/fortnight"}, 422, "fortnight"),
        ("PUT", "/v1/overrides/search", {**BODY, "for": "forever"}, 422, "bad duration"),
        ("PUT", "/v1/overrides/search", {**BODY, "for": 0}, 422, "from 1 second"),
        ("PUT", "/v1/overrides/search", {**BODY, "reason": " "}, 422, "reason is required"),
        ("PUT", "/v1/overrides/search", {"limits": "5/minute", "for": 60}, 422, "reason"),
        ("PUT", "/v1/overrides/search", {**BODY, "extra": 1}, 422, "unknown field"),
        (
            "PUT",
            "/v1/overrides/search",
            b'{"limits": "5/minute", "limits": "9/minute", "for": 60, "reason": "r"}',
            400,
            "appears twice",
        ),
        ("PUT", "/v1/overrides/search", b"{", 400, "malformed JSON"),
        ("PUT", "/v1/overrides/search", b"", 400, "needs a JSON body"),
        ("PUT", "/v1/overrides/", BODY, 400, "no rule given"),
        ("POST", "/v1/overrides/search", BODY, 405, "POST is not allowed"),
        ("DELETE", "/v1/overrides", None, 405, "DELETE is not allowed"),
    ],
)
def test_bad_requests_get_a_clear_4xx(  # noqa: PLR0917 - the cases' fields
    rules_file: Path, method: str, path: str, body: object, status: int, error: str
) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, token=TOKEN)) as client:
            content = body if isinstance(body, bytes) or body is None else None
            answer = await client.request(method, path, headers=AUTH, content=content,
                                          json=None if content is not None or body is None
                                          else body)  # fmt: skip
            assert answer.status_code == status, answer.text
            assert error in answer.json()["error"]
            if status == 405:
                assert answer.headers["allow"] in ("DELETE, PUT", "GET, HEAD")
            listed = (await client.get("/v1/overrides", headers=AUTH)).json()
            assert listed["overrides"] == []
            assert listed["audit"] == []

    run(main())


def test_changes_need_the_admin_token_even_with_open_checks(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, token=TOKEN, open_checks=True)) as client:
            # reading too: the audit trail names people and their addresses
            assert (await client.get("/v1/overrides")).status_code == 401
            assert (await client.put("/v1/overrides/search", json=BODY)).status_code == 401
            assert (await client.delete("/v1/overrides/search")).status_code == 401
            wrong = {"authorization": "Bearer nope"}
            assert (
                await client.put("/v1/overrides/search", json=BODY, headers=wrong)
            ).status_code == 401
            assert (await client.get("/v1/overrides", headers=AUTH)).json()["audit"] == []

    run(main())


def test_an_override_on_one_instance_rules_the_other_within_a_second(
    rules_file: Path, redis_single: RedisServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    store = ["--store", redis_single.url, "--token-file", str(token)]
    with (
        serving("--config", str(rules_file), *store, tmp=tmp_path) as one,
        serving("--config", str(rules_file), *store, tmp=tmp_path) as two,
    ):
        user = uuid.uuid4().hex
        with httpx.Client(headers=AUTH, timeout=5) as client:

            def limit_on(url: str) -> int:
                answer = client.post(f"{url}/v1/check", json=check_body(user))
                return int(answer.json()["limit"])

            assert limit_on(two.url) == 2
            try:
                answer = client.put(f"{one.url}/v1/overrides/search", json={**BODY, "for": 60})
                assert answer.status_code == 200, answer.text
                assert answer.json()["shared"] is True
                began = time.monotonic()
                while limit_on(two.url) != 5:
                    assert time.monotonic() - began < 1.0, "not in force on the other within 1 s"
                    time.sleep(0.005)
                listed = client.get(f"{two.url}/v1/overrides").json()
                assert [o["rule"] for o in listed["overrides"]] == ["search"]
            finally:  # the session's Redis: leave nothing behind for other tests
                client.delete(f"{one.url}/v1/overrides/search")
            began = time.monotonic()
            while limit_on(two.url) != 2:
                assert time.monotonic() - began < 1.0
                time.sleep(0.005)
