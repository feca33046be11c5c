"""examples/fleet/run.py: worker processes, one fleet quota, one provider that counts.

The example runs as a script, on a redis-server of the test's own: 4 workers drain
1,000 jobs into a provider that allows 200 a second by its own clock, each
worker's clock off by up to 100 ms. Paced, no second of the provider's may see
more than the limit plus one permit per worker (docs/fleet.md: none sees more
than the limit while requests reach it within 20 ms of their permits; the permit
per worker is for a busy machine's delays). The same run with a resource per
worker shows that the check has teeth.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import RedisServer, redis_server

RUN = Path(__file__).resolve().parents[2] / "examples" / "fleet" / "run.py"
WORKERS, LIMIT, JOBS = 4, 200, 1000
TIMEOUT = 12.0  # seconds the workers drain for at most; at the limit it takes 5


def run_example(server: RedisServer, *extra: str) -> dict[str, Any]:
    args = [sys.executable, str(RUN), "--redis", server.url, "--workers", str(WORKERS),
            "--limit", str(LIMIT), "--jobs", str(JOBS), "--skew-ms", "100",
            "--timeout", str(TIMEOUT), "--json", *extra]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT + 30, check=False)
    assert done.stdout, f"the example printed nothing:\n{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def shared(server: RedisServer) -> dict[str, Any]:
    return run_example(server)


def test_the_run_leaves_nothing_in_redis(shared: dict[str, Any], server: RedisServer) -> None:
    with server.client() as client:
        assert client.keys("*") == []


def test_no_provider_second_goes_over_the_limit(shared: dict[str, Any]) -> None:
    assert shared["shared"]
    assert shared["pace"]
    assert shared["tolerance"] == WORKERS
    assert shared["seconds"], "the provider counted nothing"
    assert shared["busiest_second"] <= LIMIT + WORKERS, shared["seconds"]
    assert shared["within_limit"]


def test_the_queue_drains_at_the_providers_limit(shared: dict[str, Any]) -> None:
    assert shared["drained"], f"{shared['done']} of {JOBS} jobs done in {TIMEOUT} s"
    # 5 s at the limit; 1.5 s for joining and the first refreshes, a quarter for pacing
    assert shared["drain_seconds"] <= 1.5 + 1.25 * JOBS / LIMIT, shared["seconds"]


def test_without_a_shared_quota_the_provider_is_overrun(server: RedisServer) -> None:
    result = run_example(server, "--unshared")
    assert result["drained"]
    with server.client() as client:  # the run deletes the quotas it made, these too
        assert client.keys("*") == []
    assert result["busiest_second"] > LIMIT + WORKERS
    assert result["refused_429"] > 0
    assert not result["within_limit"]
