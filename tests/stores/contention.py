"""8 threads hit one key of one limiter at once, from a barrier, in each of several
processes: the contention tests of the memory and the Redis stores.

    python -m tests.stores.contention STORE NAME ALGORITHM

runs one process's share: STORE is ``memory`` (a `MemoryStore` of the process's
own, on a frozen clock) or a Redis URL; it prints how many hits were admitted.
ALGORITHM is a name of `ALGORITHMS`, ``token_bucket/interval`` for the bucket
that refills once per period.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from ratewarden import FakeClock, Limiter, MemoryStore
from ratewarden.algorithms import ALGORITHMS, Refill
from ratewarden.stores import Store

THREADS = 8
HITS = 150  # per thread: 1,200 a process, past the limit
LIMIT = 1000  # per year: nothing refills while they run
ALL = [*ALGORITHMS, "token_bucket/interval"]
ROOT = Path(__file__).resolve().parents[2]


def limiter(store: Store, name: str, algorithm: str) -> Limiter:
    algo, _, mode = algorithm.partition("/")
    refill: Refill = "interval" if mode == "interval" else "continuous"
    return Limiter(f"{LIMIT}/year", algorithm=algo, refill=refill, store=store, name=name)


@contextlib.contextmanager
def switching() -> Iterator[None]:
    """Threads switch every microsecond, not every 5 ms: a hit on the memory store
    takes about one, so at the default a race would hardly ever be tried."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def hammer(limit: Limiter, threads: int = THREADS, hits: int = HITS) -> int:
    """Hits admitted of ``threads`` x ``hits`` on one key, all threads let go at once."""
    start = threading.Barrier(threads)
    allowed = [0] * threads

    def work(i: int) -> None:
        start.wait()
        allowed[i] = sum(limit.hit("shared").allowed for _ in range(hits))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    with switching():
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return sum(allowed)


def admitted(store: str, algorithm: str, processes: int = 2) -> list[int]:
    """What each of ``processes`` processes admitted, all on one limiter name."""
    name = f"c{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "tests.stores.contention", store, name, algorithm]
    running = [
        subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    counts = []
    for process in running:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        counts.append(int(out))
    return counts


def main(store: str, name: str, algorithm: str) -> None:
    if store == "memory":
        print(hammer(limiter(MemoryStore(clock=FakeClock()), name, algorithm)))
        return
    from ratewarden.stores.redis import RedisStore  # noqa: PLC0415 - only with a URL

    with RedisStore(store, timeout=5.0) as redis:  # exactness, not the fault tests' bound
        print(hammer(limiter(redis, name, algorithm)))


if __name__ == "__main__":
    main(*sys.argv[1:4])
