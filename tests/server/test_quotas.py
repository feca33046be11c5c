"""The fleet quotas in the service: ``GET /v1/quotas``, ``GET /v1/quotas/{name}``
and the ``ratewarden_quota_*`` gauges of ``/metrics``, on a real Redis (a
database of its own, emptied for each test), in process and as ``ratewarden
serve``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import msgspec
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from ratewarden import AsyncMemoryStore
from ratewarden.fleet import Coordinator, QuotaConfig, QuotaStatus, set_quota, show_quota
from ratewarden.server import App, Service, openapi
from ratewarden.server._quotas import MAX_SCRAPED, Quota, QuotaList, QuotaSummary, summary
from ratewarden.stores.redis import AsyncRedisStore
from tests.redis_server import RedisServer, free_port
from tests.server.conftest import client_for
from tests.server.process import serving

DB = 9
TOKEN = "quota-token-7e1d"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAME = "push-api"
ODD_NAME = "api.example.com/v2:push"  # a name may hold / and :


def url_of(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/{DB}"


@pytest.fixture
def client(redis_single: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis(port=redis_single.port, db=DB) as c:
        c.flushdb()
        yield c


@asynccontextmanager
async def http_for(
    rules: Path, store_url: str | None, *, member_metrics: bool = False, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The app on a Redis store at ``store_url`` (the memory store for None)."""
    store = AsyncMemoryStore() if store_url is None else AsyncRedisStore(store_url, timeout=2.0)
    service = Service(rules, store, quota_member_metrics=member_metrics)
    try:
        async with client_for(App(service, **options)) as http:
            yield http
    finally:
        await service.aclose()


def fleet(client: redis.Redis) -> None:
    """``push-api``: 2000/second split equally, a wants 1200, holds 1000, used
    990; b wants 300, holds nothing yet, used 250. ``ODD_NAME``: adaptive, its
    one member refused by the provider, so its effective total is cut to 3.75;
    it wants 1 and holds 2.375: half the spare on top (the other half is kept
    for a member that joins)."""
    set_quota(client, NAME, QuotaConfig("2000/second", "equal", lease=30))
    coordinator = Coordinator(client, NAME)
    coordinator.refresh("host-a", wants=1_200_000, has=0, used=0)
    coordinator.refresh("host-b", wants=300_000, has=0, used=250_000)
    coordinator.refresh("host-a", wants=1_200_000, has=1_000_000, used=990_000)
    set_quota(client, ODD_NAME, QuotaConfig("5/minute", "fair_share", lease=30, adaptive=True))
    Coordinator(client, ODD_NAME).refresh("host-c", wants=1000, has=0, used=500, throttled=1)
    assert status_of(client, ODD_NAME).effective_total == 3.75


def without_leases(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with its members' lease times checked and taken out (they tick)."""
    for member in document.get("members", ()):
        assert 0 < member.pop("expires_in") <= 30
    return document


def status_of(client: redis.Redis, name: str) -> QuotaStatus:
    status = show_quota(client, name)
    assert status is not None
    return status


def assert_documented(path: str, status: int, body: Any) -> None:
    """``body`` is what the OpenAPI document says ``GET path`` answers with ``status``."""
    document = openapi(secured=True)
    answer = document["paths"][path]["get"]["responses"][str(status)]
    schema = {**answer["content"]["application/json"]["schema"],
              "components": document["components"]}  # fmt: skip
    jsonschema_rs.validator_for(schema).validate(body)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every quota sample of a /metrics text, by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("ratewarden_quota_"):
                out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_list_and_show(rules_file: Path, redis_single: RedisServer, client: redis.Redis) -> None:
    fleet(client)

    async def main() -> None:
        async with http_for(rules_file, url_of(redis_single), token=TOKEN) as http:
            listed = await http.get("/v1/quotas", headers=AUTH)
            assert listed.status_code == 200, listed.text
            assert listed.json() == {
                "quotas": [summary(status_of(client, ODD_NAME)),
                           summary(status_of(client, NAME))],
                "truncated": False,
            }  # fmt: skip
            assert listed.json()["quotas"][0]["effective_total"] == 3.75
            assert_documented("/v1/quotas", 200, listed.json())
            push = listed.json()["quotas"][1]
            assert (push["members"], push["wants"], push["granted"], push["used"]) == (
                2, 1500, 1000, 1240)  # fmt: skip
            # used over the total, and over what the fleet could use (both at most 1);
            # utilisation as the first readers had it
            assert push["used_of_total"] == pytest.approx(1240 / 2000)
            assert push["demand_served"] == pytest.approx(1240 / 1500)
            assert push["utilisation"] == pytest.approx(1240 / 1500)
            shown = await http.get(f"/v1/quotas/{NAME}", headers=AUTH)
            assert shown.status_code == 200, shown.text
            assert shown.headers["content-type"] == "application/json"
            assert_documented("/v1/quotas/{name}", 200, shown.json())
            expected = without_leases(status_of(client, NAME).as_dict())
            assert without_leases(shown.json()) == expected
            assert [m["id"] for m in expected["members"]] == ["host-a", "host-b"]
            assert expected["utilisation"] == pytest.approx(1240 / 1500)
            # a name with / and :, sent as it is or %-escaped
            for path in (f"/v1/quotas/{ODD_NAME}", "/v1/quotas/api.example.com%2Fv2%3Apush"):
                odd = await http.get(path, headers=AUTH)
                assert odd.status_code == 200, (path, odd.text)
                expected = without_leases(status_of(client, ODD_NAME).as_dict())
                assert without_leases(odd.json()) == expected

    asyncio.run(main())


def test_the_answers_are_what_the_document_says(client: redis.Redis) -> None:
    """The structs the OpenAPI schemas come from have as_dict()'s keys, and its
    values validate against them: neither can drift from the other."""
    fleet(client)
    for name in (NAME, ODD_NAME):
        status = status_of(client, name)
        document = status.as_dict()
        assert set(Quota.__struct_fields__) == set(document)
        assert set(QuotaSummary.__struct_fields__) == set(summary(status))
        assert msgspec.to_builtins(msgspec.convert(document, Quota)) == document
        listed = {"quotas": [summary(status)], "truncated": False}
        assert msgspec.to_builtins(msgspec.convert(listed, QuotaList)) == listed


def test_unknown_and_bad_names(
    rules_file: Path, redis_single: RedisServer, client: redis.Redis
) -> None:
    async def main() -> None:
        async with http_for(rules_file, url_of(redis_single), token=TOKEN) as http:
            unknown = await http.get("/v1/quotas/nobody", headers=AUTH)
            assert unknown.status_code == 404
            assert unknown.json() == {"error": "no fleet quota named 'nobody'"}
            assert_documented("/v1/quotas/{name}", 404, unknown.json())
            for path in ("/v1/quotas/a%20b", "/v1/quotas/", "/v1/quotas/%7Brw%7D"):
                bad = await http.get(path, headers=AUTH)
                assert bad.status_code == 400, (path, bad.text)
                assert "a quota name is 1-200 characters" in bad.json()["error"]
                assert_documented("/v1/quotas/{name}", 400, bad.json())
            wrong = await http.post(f"/v1/quotas/{NAME}", headers=AUTH)
            assert wrong.status_code == 405
            assert wrong.headers["allow"] == "GET, HEAD"  # HEAD is served wherever GET is
            listing = await http.delete("/v1/quotas", headers=AUTH)
            assert listing.status_code == 405
            assert listing.headers["allow"] == "GET, HEAD"
            empty = await http.get("/v1/quotas", headers=AUTH)
            assert empty.json() == {"quotas": [], "truncated": False}

    asyncio.run(main())


def test_a_token_is_needed_as_for_the_rules(
    rules_file: Path, redis_single: RedisServer, client: redis.Redis
) -> None:
    fleet(client)

    async def main() -> None:
        async with http_for(rules_file, url_of(redis_single), token=TOKEN) as http:
            for path in ("/v1/quotas", f"/v1/quotas/{NAME}", "/v1/quotas/nobody", "/v1/rules"):
                for headers in ({}, {"Authorization": "Bearer nope"}):
                    refused = await http.get(path, headers=headers)
                    assert refused.status_code == 401, (path, refused.text)
                    assert NAME not in refused.text
        # --open-checks opens them as it opens /v1/rules
        async with http_for(rules_file, url_of(redis_single), token=TOKEN,
                            open_checks=True) as http:  # fmt: skip
            for path in ("/v1/quotas", f"/v1/quotas/{NAME}", "/v1/rules"):
                assert (await http.get(path)).status_code == 200, path

    asyncio.run(main())


def test_the_memory_store_has_no_quotas(rules_file: Path) -> None:
    async def main() -> None:
        async with http_for(rules_file, None) as http:
            for path in ("/v1/quotas", f"/v1/quotas/{NAME}", "/v1/quotas/a%20b"):
                answer = await http.get(path)
                assert answer.status_code == 404, path
                assert "no fleet quotas: they live in Redis" in answer.json()["error"]
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200
            assert "ratewarden_rules" in metrics.text
            assert "ratewarden_quota" not in metrics.text

    asyncio.run(main())


def test_redis_down(rules_file: Path) -> None:
    """/v1/quotas answers 503; /metrics leaves the quotas out and is still scraped."""
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there

    async def main() -> None:
        async with http_for(rules_file, down) as http:
            for path in ("/v1/quotas", f"/v1/quotas/{NAME}"):
                answer = await http.get(path)
                assert answer.status_code == 503, path
                assert answer.json()["error"].startswith("store unavailable: redis: ")
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200
            assert "ratewarden_rules 5.0" in metrics.text
            assert "ratewarden_quota" not in metrics.text
            assert "ratewarden_store_errors_total 0.0" in metrics.text  # no check failed

    asyncio.run(main())


def test_metrics_per_resource(
    rules_file: Path, redis_single: RedisServer, client: redis.Redis
) -> None:
    fleet(client)

    async def main() -> None:
        async with http_for(rules_file, url_of(redis_single)) as http:
            text = (await http.get("/metrics")).text
        push, odd = (("resource", NAME),), (("resource", ODD_NAME),)
        assert samples(text) == {
            ("ratewarden_quota_total", push): 2000.0,
            ("ratewarden_quota_wants", push): 1500.0,
            ("ratewarden_quota_granted", push): 1000.0,
            ("ratewarden_quota_used", push): 1240.0,
            ("ratewarden_quota_members", push): 2.0,
            ("ratewarden_quota_total", odd): 3.75,  # effective: the adaptive total was cut
            ("ratewarden_quota_wants", odd): 1.0,
            ("ratewarden_quota_granted", odd): 2.375,
            ("ratewarden_quota_used", odd): 0.5,
            ("ratewarden_quota_members", odd): 1.0,
        }
        assert "# TYPE ratewarden_quota_total gauge" in text
        assert "member=" not in text

    asyncio.run(main())


def test_metrics_per_member_when_asked(
    rules_file: Path, redis_single: RedisServer, client: redis.Redis
) -> None:
    fleet(client)

    async def main() -> None:
        async with http_for(rules_file, url_of(redis_single), member_metrics=True) as http:
            text = (await http.get("/metrics")).text
        found = samples(text)

        def member(name: str, who: str) -> float:
            return found[name, (("member", who), ("resource", NAME))]

        assert member("ratewarden_quota_member_wants", "host-a") == 1200.0
        assert member("ratewarden_quota_member_granted", "host-a") == 1000.0
        assert member("ratewarden_quota_member_used", "host-a") == 990.0
        assert member("ratewarden_quota_member_wants", "host-b") == 300.0
        assert member("ratewarden_quota_member_used", "host-b") == 250.0
        assert found["ratewarden_quota_members", (("resource", NAME),)] == 2.0
        # three members, three figures each
        assert len([key for key in found if key[0].startswith("ratewarden_quota_member_")]) == 9
        assert (
            found["ratewarden_quota_member_used", (("member", "host-c"), ("resource", ODD_NAME))]
            == 0.5
        )

    asyncio.run(main())


def test_metrics_export_a_bounded_number_of_resources(
    rules_file: Path, redis_single: RedisServer, client: redis.Redis
) -> None:
    for n in range(MAX_SCRAPED + 5):
        set_quota(client, f"q{n:03d}", QuotaConfig("10/second"))

    async def main() -> None:
        async with http_for(rules_file, url_of(redis_single)) as http:
            text = (await http.get("/metrics")).text
            listed = (await http.get("/v1/quotas")).json()
        totals = [key for key in samples(text) if key[0] == "ratewarden_quota_total"]
        assert len(totals) == MAX_SCRAPED
        assert len(listed["quotas"]) == MAX_SCRAPED + 5
        assert listed["truncated"] is False

    asyncio.run(main())


def test_a_listing_says_when_it_is_cut_short(
    rules_file: Path,
    redis_single: RedisServer,
    client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for n in range(5):
        set_quota(client, f"q{n}", QuotaConfig("10/second"))
    monkeypatch.setattr("ratewarden.server._app.MAX_LISTED", 3)

    async def main() -> None:
        async with http_for(rules_file, url_of(redis_single)) as http:
            listed = (await http.get("/v1/quotas")).json()
        assert len(listed["quotas"]) == 3
        assert listed["truncated"] is True

    asyncio.run(main())


def test_served_with_a_redis_store(
    rules_file: Path, redis_single: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    """``ratewarden serve --store redis://... --quota-member-metrics``, end to end."""
    fleet(client)
    args = ("--config", str(rules_file), "--grpc", "off", "--store", url_of(redis_single),
            "--store-timeout", "2", "--quota-member-metrics")  # fmt: skip
    with serving(*args, tmp=tmp_path) as served:
        shown = httpx.get(f"{served.url}/v1/quotas/{NAME}", timeout=10)
        assert shown.status_code == 200, shown.text
        assert without_leases(shown.json()) == without_leases(status_of(client, NAME).as_dict())
        found = samples(httpx.get(f"{served.url}/metrics", timeout=10).text)
        assert found["ratewarden_quota_total", (("resource", NAME),)] == 2000.0
        assert found["ratewarden_quota_member_granted",
                     (("member", "host-a"), ("resource", NAME))] == 1000.0  # fmt: skip
        assert served.terminate() == 0
