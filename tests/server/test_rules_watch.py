"""``ratewarden serve --config FILE`` watches the file: an edit is in force within
2 s, a broken file leaves the rules in force and says why; and the service's
watcher, polled by hand, counts and logs what it did."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from ratewarden import AsyncMemoryStore
from ratewarden.server import Service
from tests.server.process import serving

# A sliding log, not a fixed window: a fixed window's edge falls on the wall
# clock's minute, and a key whose requests straddle it gets twice the limit, so a
# look at the 3/minute rules could pass for the 5/minute ones (and a fresh key
# could pass one request more than the rate). The log counts the last minute
# exactly, whenever the test runs.
LOGIN = (
    "rules:\n  - name: login\n    rate: {n}/minute\n    algorithm: sliding_window_log\n    by: ip\n"
)
EDGE = "domain: edge\ndescriptors: [{key: a, rate_limit: {unit: day, requests_per_unit: 1}}]\n"
BOUND = 2.0  # seconds from an edit to the new rules in force, with the default interval


def allowed(client: httpx.Client, ip: str) -> bool:
    answer = client.post("/v1/check", json={"attributes": {"ip": ip, "path": "/x"}})
    assert answer.status_code == 200, answer.text
    return bool(answer.json()["allowed"])


def until(condition: Callable[[], bool], seconds: float) -> float:
    """Poll ``condition`` (a look at the server, never a clock edge); the seconds it
    took to hold, failing past ``seconds``."""
    started = time.monotonic()
    while not condition():
        elapsed = time.monotonic() - started
        assert elapsed < seconds, f"not within {seconds}s"
        time.sleep(0.02)
    return time.monotonic() - started


def replace(path: Path, text: str) -> None:
    """Write as editors and ConfigMaps do: a new file renamed over the old."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


def test_an_edit_is_in_force_within_two_seconds_and_a_bad_one_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(LOGIN.format(n=1))
    fresh = iter(f"10.0.{n // 250}.{n % 250}" for n in range(100_000))
    with serving("--config", str(path), "--grpc", "off", tmp=tmp_path) as served:
        with httpx.Client(base_url=served.url) as client:
            assert [allowed(client, "10.9.9.9") for _ in range(2)] == [True, False]

            def admits(n: int) -> Callable[[], bool]:
                def look() -> bool:  # a fresh key each look: looking uses up no limit
                    ip = next(fresh)
                    return all(allowed(client, ip) for _ in range(n))

                return look

            path.write_text(LOGIN.format(n=3))  # in place, as some editors write
            first = until(admits(3), BOUND)
            assert [allowed(client, "10.9.9.8") for _ in range(4)] == [True] * 3 + [False]

            replace(path, "rules:\n  - name: login\n    rate: lots/minute\n")
            log = served.stderr
            until(lambda: "changed but not reloaded" in log.read_text(), BOUND)
            assert [allowed(client, "10.9.9.7") for _ in range(4)] == [True] * 3 + [False]

            replace(path, LOGIN.format(n=5))  # and the next good edit goes in force
            second = until(admits(5), BOUND)
            assert [allowed(client, "10.9.9.6") for _ in range(6)] == [True] * 5 + [False]
        assert served.terminate() == 0
    lines = [json.loads(line) for line in served.stderr.read_text().splitlines() if line]
    failed = [e for e in lines if "changed but not reloaded" in e["message"]]
    assert len(failed) == 1
    assert failed[0]["level"] == "error"
    assert str(path) in failed[0]["message"]
    assert "lots/minute" in failed[0]["message"]  # why: the value it could not read
    reloaded = [e for e in lines if e["message"] == f"rule file {path} changed: reloaded"]
    assert len(reloaded) == 2
    print(f"in force after {first:.2f}s and {second:.2f}s")


def test_no_watching_when_told_not_to(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(LOGIN.format(n=1))
    args = ("--config", str(path), "--grpc", "off", "--config-reload-interval", "0")
    with serving(*args, tmp=tmp_path) as served, httpx.Client(base_url=served.url) as client:
        replace(path, LOGIN.format(n=3))
        # SIGHUP still reloads: once it has, the watcher would have had its chance too
        served.process.send_signal(1)
        until(lambda: "rules reloaded" in served.stderr.read_text(), 10)
        assert "changed: reloaded" not in served.stderr.read_text()
        assert [allowed(client, "10.1.1.1") for _ in range(4)] == [True] * 3 + [False]


def test_the_services_watcher_reloads_the_rules_not_the_envoy_files(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(LOGIN.format(n=1))
    envoy = tmp_path / "edge.yaml"
    envoy.write_text(EDGE)

    def limit(service: Service) -> int:
        return service.engine.ruleset.limits[0].rate.limit

    async def main() -> None:
        service = Service(path, AsyncMemoryStore(), envoy_files=[envoy])
        watcher = service.engine.awatch(3600, reload=service.reload_rules)  # polled by hand
        reloads = service.metrics.reloads
        try:
            assert await watcher.apoll() is None
            envoy.write_text("domain: edge\ndescriptors: [oops]\n")  # not this watcher's
            replace(path, LOGIN.format(n=3))
            assert await watcher.apoll() is True
            assert limit(service) == 3
            assert reloads.labels("ok")._value.get() == 1
            assert service.dashboard.reloaded is not None
            assert service.dashboard.reloaded[1] is None
            replace(path, "rules: nonsense\n")
            assert await watcher.apoll() is False
            assert service.engine.last_error is not None
            assert reloads.labels("failed")._value.get() == 1
            path.unlink()
            assert await watcher.apoll() is False
            assert limit(service) == 3
            assert (watcher.reloads, watcher.failures) == (1, 2)
            assert "1 reloads" in repr(watcher)
        finally:
            await service.aclose()

    asyncio.run(main())
