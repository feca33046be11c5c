"""degrade and queue through the service: /v1/check's answer, /auth's headers
and hold, and the envoy descriptors of the rules' domain."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ratewarden import AsyncMemoryStore, FakeClock
from ratewarden.server import App, Service
from tests.server.conftest import client_for
from tests.shaping import SHAPING, START


def service(tmp_path: Path, clock: FakeClock) -> Service:
    path = tmp_path / "rules.yaml"
    path.write_text(SHAPING)
    return Service(path, AsyncMemoryStore(clock=clock))


def test_check_answers_the_level_and_the_wait(tmp_path: Path) -> None:
    clock = FakeClock(START)

    async def main() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        async with client_for(App(service(tmp_path, clock))) as client:
            video = {"attributes": {"path": "/video", "ip": "203.0.113.7"}}
            line = {"attributes": {"path": "/line"}}
            degraded = [(await client.post("/v1/check", json=video)).json() for _ in range(4)]
            queued = [(await client.post("/v1/check", json=line)).json() for _ in range(4)]
        return degraded, queued

    degraded, queued = asyncio.run(main())
    assert [(a["allowed"], a["action"], a["degrade"]) for a in degraded] == [
        (True, "allow", 0.0), (True, "allow", 0.0), (True, "degrade", 0.25),
        (True, "degrade", 0.5),
    ]  # fmt: skip
    assert degraded[3]["headers"] == {"X-RateLimit-Degraded": "0.50"}
    assert degraded[3]["rule"] == "video"
    # /v1/check does not hold: it says how long to, the slot being taken
    assert [(a["allowed"], a["action"], a["wait"]) for a in queued] == [
        (True, "allow", 0.0), (True, "queue", 0.5), (True, "queue", 1.0), (False, "reject", 0.0),
    ]  # fmt: skip
    assert queued[3]["status"] == 429
    assert queued[3]["retry_after"] == 0.5
    assert clock.time_ns() == round(START * 1e9)


def test_auth_holds_a_queued_request_and_sends_the_degrade_header(tmp_path: Path) -> None:
    clock = FakeClock(START)

    async def main() -> tuple[list[int], list[str | None], list[int]]:
        async with client_for(App(service(tmp_path, clock))) as client:
            released = []
            for _ in range(3):
                answer = await client.get("/auth", headers={"X-Original-URI": "/line"})
                assert answer.status_code == 200
                released.append(clock.time_ns())
            headers = {"X-Original-URI": "/video"}
            videos = [await client.get("/auth", headers=headers) for _ in range(4)]
        return (
            released,
            [v.headers.get("x-ratelimit-degraded") for v in videos],
            [v.status_code for v in videos],
        )

    released, levels, statuses = asyncio.run(main())
    assert [b - released[0] for b in released] == [0, 500_000_000, 1_000_000_000]
    assert levels == [None, None, "0.25", "0.50"]
    assert statuses == [200] * 4  # a gateway passes a degraded request on


def test_envoy_descriptors_carry_the_degrade_header(tmp_path: Path) -> None:
    svc = service(tmp_path, FakeClock(START))

    async def main() -> list[dict[str, str]]:
        descriptors = [[("path", "/video"), ("remote_address", "203.0.113.7")]]
        return [(await svc.check_descriptors("ratewarden", descriptors)).headers for _ in range(3)]

    assert asyncio.run(main())[2] == {"X-RateLimit-Degraded": "0.25"}


def test_the_rules_show_a_degrade_rule_s_own_rate(tmp_path: Path) -> None:
    # it counts up to 3x (6/minute) to grow its level; the file says 2/minute
    svc = service(tmp_path, FakeClock(START))
    rates = {r["name"]: r["rates"] for r in svc.describe()["rules"]}
    assert rates == {"video": ["2/minute"], "line": ["2/second"]}
