"""The dashboard on a Redis store: the fleet quotas with their members' wants
and grants, and a Redis that does not answer shown as such, never as a failed
stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ratewarden.fleet import Coordinator, QuotaConfig, set_quota
from ratewarden.server import App, Service
from ratewarden.stores.redis import AsyncRedisStore
from tests.redis_server import RedisServer, free_port
from tests.server.test_dashboard import AUTH, TOKEN, stream

DB = 11


@pytest.fixture
def client(redis_single: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis(port=redis_single.port, db=DB) as c:
        c.flushdb()
        yield c


def app_on(rules: Path, url: str) -> App:
    service = Service(rules, AsyncRedisStore(url, timeout=0.5))
    service.dashboard.stop()
    service.dashboard.interval = 0.02
    return App(service, token=TOKEN)


def test_the_fleet_quotas_and_their_members(
    rules_file: Path, redis_single: RedisServer, client: redis.Redis
) -> None:
    set_quota(client, "push-api", QuotaConfig("2000/second", "equal", lease=30))
    coordinator = Coordinator(client, "push-api")
    coordinator.refresh("host-b", wants=300_000, has=0, used=250_000)
    coordinator.refresh("host-a", wants=1_200_000, has=0, used=0)

    async def main() -> None:
        app = app_on(rules_file, f"redis://127.0.0.1:{redis_single.port}/{DB}")
        try:
            async with stream(app, AUTH) as events:
                await events.start()
                snapshot = await events.event()
        finally:
            await app.service.aclose()
        assert snapshot["store"] == {"type": "AsyncRedisStore", "ok": True, "problem": None}
        (quota,) = snapshot["quotas"]["quotas"]
        assert quota["name"] == "push-api"
        assert quota["members"] == 2
        members = quota["members_shown"]
        assert [m["id"] for m in members] == ["host-a", "host-b"]  # by id
        assert [m["wants"] for m in members] == [1200.0, 300.0]  # permits a window
        assert all(m["has"] >= 0 for m in members)
        assert quota["granted"] == sum(m["has"] for m in members)
        assert snapshot["quotas"]["truncated"] is False

    asyncio.run(main())


def test_a_redis_that_does_not_answer_is_shown_not_fatal(rules_file: Path) -> None:
    async def main() -> None:
        app = app_on(rules_file, f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
        try:
            async with stream(app, AUTH) as events:
                await events.start()
                first = await events.event()
                second = await events.event()  # and the stream goes on
        finally:
            await app.service.aclose()
        assert first["store"]["ok"] is False
        assert "unreachable" in first["store"]["problem"]
        assert "error" in first["quotas"]
        assert second["store"]["ok"] is False

    asyncio.run(main())
