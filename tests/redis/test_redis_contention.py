"""8 threads in each of 2 processes hammer one key: exactly the limit is admitted."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.redis_server import RedisCluster, RedisServer

WORKER = """
import sys, threading
from ratewarden import Limiter
from ratewarden.stores.redis import RedisStore

url, name, algorithm = sys.argv[1:4]
with RedisStore(url, timeout=5.0) as store:
    # 1000/year: nothing refills during the test
    limiter = Limiter("1000/year", algorithm=algorithm, store=store, name=name)
    start = threading.Barrier(8)
    allowed = [0] * 8

    def work(i):
        start.wait()
        allowed[i] = sum(limiter.hit("shared").allowed for _ in range(150))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sum(allowed))
"""


def admitted(url: str, algorithm: str) -> int:
    name = f"c{uuid.uuid4().hex[:8]}"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, name, algorithm],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    total = 0
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        total += int(out)
    return total


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter", "gcra"])
def test_two_processes_eight_threads_each_admit_exactly_the_limit(
    redis_single: RedisServer, algorithm: str
) -> None:
    assert admitted(redis_single.url, algorithm) == 1000  # of 2,400 attempts


@pytest.mark.slow
def test_the_same_on_the_cluster(redis_6_nodes: RedisCluster) -> None:
    assert admitted(redis_6_nodes.url, "token_bucket") == 1000
