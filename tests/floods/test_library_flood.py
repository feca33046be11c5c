"""A flood of distinct keys at ``MemoryStore(max_keys=N)`` through `Limiter`:
the store never holds more than N keys, the process stops growing once the
bound is reached, and a legitimate key asked between the flood's keys is
admitted exactly its limit, although least recently used keys are being
evicted all the while. The same at 10 million keys: ``bench/flood.py library``.

Time is a fake clock that never moves: every key's limit is whole for the whole
flood, so nothing is reclaimed as expired and the bound alone keeps memory in
check, and "exactly 5" cannot be blurred by a refill.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ratewarden import FakeClock, Limiter, MemoryStore
from ratewarden.algorithms import ALGORITHMS

N = 20_000
FLOOD = 20 * N
LIMIT = 5
RATE = f"{LIMIT}/minute"
# A store without a bound grows by some 300 bytes a key (bench/flood.py); this
# is well below that, so that the test cannot pass on a store that keeps growing.
UNBOUNDED_BYTES_PER_KEY = 100


def rss() -> int:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    if match is None:
        pytest.fail("no VmRSS in /proc/self/status: these tests need Linux's /proc")
    return int(match[1]) * 1024


def flood(store: MemoryStore, flood_limiter: Limiter, legit: list[tuple[Limiter, str]],
          every: int, total: int = FLOOD) -> tuple[list[int], list[int]]:  # fmt: skip
    """Hit ``total`` new keys; every ``every`` keys, each legitimate (limiter,
    key) asks once. The legitimate keys' admissions, and the RSS after each
    round of asks."""
    admitted = [0] * len(legit)
    sizes = []
    hit = flood_limiter.hit
    for start in range(0, total, every):
        for n, (limiter, key) in enumerate(legit):
            admitted[n] += limiter.hit(key).allowed
        for i in range(start, min(start + every, total)):
            assert hit(f"flood-{i}").allowed  # every flood key is new, or forgotten
        assert len(store) <= N, len(store)
        sizes.append(rss())
    return admitted, sizes


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_recent_key_stays_exact_under_the_flood(algorithm: str) -> None:
    store = MemoryStore(max_keys=N, clock=FakeClock(1_700_000_000))
    limiter = Limiter(RATE, store=store, algorithm=algorithm)
    # asked every N/10 keys: always among the most recent tenth when eviction runs
    admitted, _ = flood(store, limiter, [(limiter, "legit")], every=N // 10, total=10 * N)
    assert admitted == [LIMIT]
    assert store.evicted >= 9 * N  # the bound really was at work
    assert limiter.peek("flood-0").remaining == LIMIT  # the oldest key is forgotten


def test_memory_stops_growing_at_the_bound() -> None:
    store = MemoryStore(max_keys=N, clock=FakeClock(1_700_000_000))
    limiter = Limiter(RATE, store=store, algorithm="token_bucket")
    every = N // 10
    _, sizes = flood(store, limiter, [(limiter, "legit")], every=every)
    # from 3 N keys on the store is full and its dicts have reached their size
    settled = sizes[3 * N // every :]
    keys_after = FLOOD - 3 * N
    growth = max(settled) - settled[0]
    assert growth < keys_after * UNBOUNDED_BYTES_PER_KEY / 10, (
        f"RSS grew {growth / 2**20:.1f} MB over the last {keys_after:,} keys at the bound"
    )
    assert len(store) <= N


def test_recent_keys_of_another_limit_stay_exact() -> None:
    """Three users of a login limit in the same store as the flooded one, each
    asking every N/40 flood keys: far more recent than nearly every flood key."""
    store = MemoryStore(max_keys=N, clock=FakeClock(1_700_000_000))
    flooded = Limiter(RATE, store=store, algorithm="token_bucket", name="per-user")
    login = Limiter(RATE, store=store, algorithm="token_bucket", name="login")
    ips = ["203.0.113.1", "203.0.113.2", "203.0.113.3"]
    admitted, _ = flood(store, flooded, [(login, ip) for ip in ips], every=N // 40, total=4 * N)
    assert admitted == [LIMIT] * len(ips)
