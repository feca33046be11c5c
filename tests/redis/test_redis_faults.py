"""Redis killed or hung under load: the policy holds, every decision stays within the
timeout (plus scheduling slack on this shared machine), nothing escapes, and normal
limiting resumes within a second of the server's return."""

from __future__ import annotations

import os
import signal
import time

import pytest

from ratewarden import Limiter
from ratewarden.stores.redis import RedisStore
from tests.redis_server import redis_server

TIMEOUT = 0.05
SLACK = 0.15  # a noisy 2-core VM: thread scheduling, GC


def drive(limiter: Limiter, seconds: float) -> list[tuple[float, float, bool, bool]]:
    """(start, latency, allowed, degraded) for back-to-back hits over ``seconds``."""
    out = []
    end = time.monotonic() + seconds
    while (start := time.monotonic()) < end:
        decision = limiter.hit("user:1")
        out.append((start, time.monotonic() - start, decision.allowed, decision.degraded))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_redis_fault_under_load(fault: str) -> None:
    with redis_server() as server:
        store = RedisStore(server.url, timeout=TIMEOUT)
        limiter = Limiter("1000000/hour", store=store, on_failure="fail_closed", name=fault)
        assert not drive(limiter, 0.3)[-1][3]  # healthy
        assert server.process is not None
        if fault == "kill":
            server.kill()
        else:
            os.kill(server.process.pid, signal.SIGSTOP)
        during = drive(limiter, 1.0)
        if fault == "kill":
            server.start()  # the same port again, as a supervisor would restart it
        else:
            os.kill(server.process.pid, signal.SIGCONT)
        back = time.monotonic()
        after = drive(limiter, 1.5)
        store.close()
    assert during, "no decisions while redis was down"
    assert all(degraded and not allowed for _, _, allowed, degraded in during)
    worst = max(latency for _, latency, _, _ in during + after)
    assert worst <= TIMEOUT + SLACK, f"a decision took {worst:.3f}s"
    recovered = next(start for start, _, _, degraded in after if not degraded)
    assert recovered - back <= 1.0, f"limiting resumed {recovered - back:.3f}s after return"
    assert not after[-1][3]
