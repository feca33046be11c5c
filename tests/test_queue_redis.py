"""A `PacedQueue` on Redis: queues of several processes (here: several stores)
share one schedule, spaced on the store's clock."""

from __future__ import annotations

import pytest

from ratewarden import FakeClock, PacedQueue, QueueFull
from ratewarden.stores.redis import RedisStore
from tests.redis_server import LIVE, RedisServer


def test_processes_share_one_line(redis_single: RedisServer) -> None:
    clock = FakeClock()
    stores = [RedisStore(redis_single.url, clock=clock, timeout=LIVE) for _ in range(3)]
    try:
        queues = [PacedQueue("50/second", size=5, store=s, name="fleet-line") for s in stores]
        for queue in queues:
            queue.reset("k")
        waits = [queues[i % 3].enter("k") for i in range(6)]
        assert waits == [0.0, 0.02, 0.04, 0.06, 0.08, 0.1]  # one schedule, whoever asks
        with pytest.raises(QueueFull) as info:
            queues[1].enter("k")
        assert info.value.retry_after == 0.02
        clock.advance(0.05)
        assert queues[2].enter("k", max_wait=0.08) == 0.07
    finally:
        for store in stores:
            store.close()
