"""A process of the multi-process concurrency tests (run as ``python -m
tests.concurrency.worker MODE URL ...`` from the repository, src on the path).

- ``hammer URL LIMIT SECONDS THREADS``: threads take holds for SECONDS; inside
  each hold a Redis counter goes up, then down before the release: the most it
  reached is printed (JSON) with the number of holds.
- ``hold URL LIMIT LEASE``: take one hold, print ``held``, and keep it (renewing)
  until killed.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time

import redis

from ratewarden import ConcurrencyLimiter, RateLimitTimeout
from ratewarden.stores.redis import RedisStore
from tests.redis_server import LIVE


def hammer(url: str, limit: int, seconds: float, threads: int) -> None:
    counter = redis.Redis.from_url(url)
    limiter = ConcurrencyLimiter(
        limit, store=RedisStore(url, timeout=LIVE), lease=5.0, name="hammer"
    )
    most, holds = [0], [0]
    lock = threading.Lock()

    def work() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                with limiter.hold("k", max_wait=1.0):
                    inside = int(counter.incr("hammer:inside"))
                    time.sleep(random.random() * 0.002)
                    counter.decr("hammer:inside")
            except RateLimitTimeout:
                continue
            with lock:
                most[0] = max(most[0], inside)
                holds[0] += 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"most": most[0], "holds": holds[0]}), flush=True)


def hold(url: str, limit: int, lease: float) -> None:
    limiter = ConcurrencyLimiter(
        limit, store=RedisStore(url, timeout=LIVE), lease=lease, name="killed"
    )
    with limiter.hold("k", max_wait=5.0):
        print("held", flush=True)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    mode, url, *rest = sys.argv[1:]
    if mode == "hammer":
        hammer(url, int(rest[0]), float(rest[1]), int(rest[2]))
    else:
        hold(url, int(rest[0]), float(rest[1]))
