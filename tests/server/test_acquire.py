"""``POST /v1/acquire``, ``/v1/renew`` and ``/v1/release``: a concurrency rule's
slots over HTTP, refused at the limit with the rule's status and Retry-After, a
release or renew of what is not held answered 404 (unknown, released already)
or 409 (its lease had ended), never a 500; a renewed slot outlives its first
lease; and the slots in /metrics by rule, never by key."""

from __future__ import annotations

import asyncio
import base64
import textwrap
from pathlib import Path

import httpx
import pytest

from ratewarden import AsyncMemoryStore
from ratewarden.primitives import FakeClock
from ratewarden.server import App, Service, openapi
from tests.server.conftest import client_for
from tests.server.process import serving

RULES = textwrap.dedent("""
    rules:
      - name: reports
        concurrency: 2
        lease: 60
        by: user
        match: {paths: /reports/*}
      - name: exports
        concurrency: 1
        status: 503
        by: user
        match: {paths: /exports/*}
      - name: per-user
        rate: 100/minute
        by: user
""")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(tmp_path: Path, clock: FakeClock) -> App:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return App(Service(rules, AsyncMemoryStore(clock=clock)))


def acquire_body(user: str, path: str = "/reports/q3") -> dict[str, object]:
    return {"attributes": {"user": user, "path": path}}


def test_acquire_and_release_round_trip(app: App) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            answers = [await client.post("/v1/acquire", json=acquire_body("ann")) for _ in range(2)]
            for answer in answers:
                assert answer.status_code == 200, answer.text
                body = answer.json()
                assert body["allowed"] is True
                assert body["lease"] == 60.0
                assert body["holds"] == ["reports"]
                assert isinstance(body["lease_id"], str)
            full = await client.post("/v1/acquire", json=acquire_body("ann"))
            assert full.status_code == 429
            assert full.json()["allowed"] is False
            assert full.json()["rule"] == "reports"
            assert full.json()["lease_id"] is None
            assert full.headers["retry-after"] == "60"
            other = await client.post("/v1/acquire", json=acquire_body("bob"))
            assert other.status_code == 200  # another key
            lease_id = answers[0].json()["lease_id"]
            released = await client.post("/v1/release", json={"lease_id": lease_id})
            assert released.status_code == 200
            assert released.json() == {"released": 1, "rules": ["reports"]}
            again = await client.post("/v1/acquire", json=acquire_body("ann"))
            assert again.status_code == 200
            # a request no concurrency rule meets is a plain check: no lease
            plain = await client.post("/v1/acquire", json=acquire_body("ann", "/home"))
            assert plain.status_code == 200
            assert plain.json()["lease_id"] is None
            assert plain.json()["holds"] == []

    asyncio.run(main())


def test_a_rule_with_status_503_refuses_with_it(app: App) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            first = await client.post("/v1/acquire", json=acquire_body("ann", "/exports/a"))
            assert first.status_code == 200
            second = await client.post("/v1/acquire", json=acquire_body("ann", "/exports/b"))
            assert second.status_code == 503
            assert "retry-after" in second.headers

    asyncio.run(main())


def test_a_release_of_what_is_not_held_is_a_clear_4xx(app: App, clock: FakeClock) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            deep = "x." + base64.urlsafe_b64encode(b"[" * 12_000).decode()[:16_000]
            for lease_id in ("nope", "x.e30", "a" * 100, deep):
                unknown = await client.post("/v1/release", json={"lease_id": lease_id})
                assert unknown.status_code == 404, unknown.text
                assert "no such lease" in unknown.json()["error"]
            for body in ({}, {"lease_id": ""}, {"lease_id": 5}, {"lease_id": "a", "x": 1}):
                bad = await client.post("/v1/release", json=body)
                assert bad.status_code in (400, 422), (body, bad.text)
                assert "error" in bad.json()
            lease_id = (await client.post("/v1/acquire", json=acquire_body("ann"))).json()[
                "lease_id"
            ]
            assert (
                await client.post("/v1/release", json={"lease_id": lease_id})
            ).status_code == 200
            twice = await client.post("/v1/release", json={"lease_id": lease_id})
            assert twice.status_code == 404
            assert "released already" in twice.json()["error"]
            late = (await client.post("/v1/acquire", json=acquire_body("ann"))).json()["lease_id"]
            clock.advance(60.0)
            ended = await client.post("/v1/release", json={"lease_id": late})
            assert ended.status_code == 409
            assert "its lease had ended" in ended.json()["error"]

    asyncio.run(main())


def test_acquire_refuses_bad_input(app: App) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            for body in (
                {},
                {"attributes": {"user": {"a": "b"}}},
                {"attributes": {"user": "a"}, "cost": 1.5},
                {"attributes": {"user": "a"}, "domain": "x"},
            ):
                answer = await client.post("/v1/acquire", json=body)
                assert answer.status_code in (400, 422), (body, answer.text)
            twice = await client.post(
                "/v1/acquire", content=b'{"attributes": {"user": "a", "user": "b"}}'
            )
            assert twice.status_code == 400

    asyncio.run(main())


def test_the_slots_are_in_metrics_by_rule_never_by_key(app: App, clock: FakeClock) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            before = (await client.get("/metrics")).text
            assert "ratewarden_concurrency_in_flight" not in before
            held = [
                (await client.post("/v1/acquire", json=acquire_body("secret-user"))).json()
                for _ in range(3)
            ]
            text = (await client.get("/metrics")).text
            assert 'ratewarden_concurrency_in_flight{rule="reports"} 2.0' in text
            assert 'ratewarden_concurrency_refused_total{rule="reports"} 1.0' in text
            assert 'ratewarden_concurrency_waiting{rule="reports"}' not in text  # none waited
            assert "secret-user" not in text
            await client.post("/v1/release", json={"lease_id": held[0]["lease_id"]})
            text = (await client.get("/metrics")).text
            assert 'ratewarden_concurrency_in_flight{rule="reports"} 1.0' in text
            clock.advance(60.0)  # the other lease ends; the next take reclaims it
            assert (await client.post("/v1/acquire", json=acquire_body("secret-user"))).is_success
            text = (await client.get("/metrics")).text
            assert 'ratewarden_concurrency_leases_reclaimed_total{rule="reports"} 1.0' in text

    asyncio.run(main())


def test_the_document_describes_the_endpoints() -> None:
    paths = openapi()["paths"]
    acquire = paths["/v1/acquire"]["post"]["responses"]
    assert {"200", "429"} <= set(acquire)
    release = paths["/v1/release"]["post"]["responses"]
    assert {"200", "404", "409"} <= set(release)
    renew = paths["/v1/renew"]["post"]
    assert {"200", "404", "409"} <= set(renew["responses"])
    assert renew["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ReleaseRequest"
    }
    schemas = openapi()["components"]["schemas"]
    assert {"lease_id", "lease", "holds"} <= set(schemas["AcquireResult"]["properties"])
    assert schemas["ReleaseRequest"]["required"] == ["lease_id"]


def test_a_renewed_lease_outlives_its_first_end(app: App, clock: FakeClock) -> None:
    async def main() -> None:
        async with client_for(app) as client:
            kept, lapsed = [
                (await client.post("/v1/acquire", json=acquire_body("ann"))).json()["lease_id"]
                for _ in range(2)
            ]
            clock.advance(45.0)
            renewed = await client.post("/v1/renew", json={"lease_id": kept})
            assert renewed.status_code == 200, renewed.text
            assert renewed.json() == {"lease": 60.0}
            clock.advance(30.0)  # 75 s: past the first end (60 s), before the renewed (105 s)
            text = (await client.get("/metrics")).text
            assert 'ratewarden_concurrency_in_flight{rule="reports"} 1.0' in text
            ended = await client.post("/v1/renew", json={"lease_id": lapsed})
            assert ended.status_code == 409
            assert (
                "of rule 'reports' key 'ann' is not held: its lease had ended"
                in (ended.json()["error"])
            )
            again = await client.post("/v1/acquire", json=acquire_body("ann"))
            assert again.status_code == 200  # the lapsed slot is back
            full = await client.post("/v1/acquire", json=acquire_body("ann"))
            assert full.status_code == 429  # the renewed one is held
            released = await client.post("/v1/release", json={"lease_id": kept})
            assert released.status_code == 200
            twice = await client.post("/v1/renew", json={"lease_id": kept})
            assert twice.status_code == 404
            for lease_id in ("nope", "x.e30"):
                unknown = await client.post("/v1/renew", json={"lease_id": lease_id})
                assert unknown.status_code == 404, unknown.text
                assert "no such lease" in unknown.json()["error"]
            for body in ({}, {"lease_id": ""}, {"lease_id": 5}, {"token": kept}):
                bad = await client.post("/v1/renew", json=body)
                assert bad.status_code in (400, 422), (body, bad.text)

    asyncio.run(main())


def test_renew_in_the_served_process(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    with (
        serving("--config", str(rules), "--grpc", "off", tmp=tmp_path) as served,
        httpx.Client(base_url=served.url) as client,
    ):
        lease_id = client.post("/v1/acquire", json=acquire_body("ann")).json()["lease_id"]
        renewed = client.post("/v1/renew", json={"lease_id": lease_id})
        assert renewed.status_code == 200, renewed.text
        assert renewed.json() == {"lease": 60.0}
        assert client.post("/v1/release", json={"lease_id": lease_id}).status_code == 200
        assert client.post("/v1/renew", json={"lease_id": lease_id}).status_code == 404
        assert client.post("/v1/renew", json={"lease_id": "nope"}).status_code == 404
