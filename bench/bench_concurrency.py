"""Concurrency limits: what a hold and its release cost, beside one bare
`Limiter.hit` on the same store, and beside redis-rate-limiters' semaphore.

    .venv/bin/python bench/bench_concurrency.py [--rounds N] [--ops N] [--peer SITE]

``--peer SITE``: a site-packages directory holding redis-rate-limiters (its
``limiters`` package), e.g. a throwaway venv's; it is put last on the path, so
that our redis-py serves both. Without it the peer is left out.

Starts its own redis-server on a free loopback port. Single thread, sync, one
key, a free slot every time (the cost of taking and giving back, not of
waiting). Candidates run interleaved in rounds; per candidate the minimum over
the rounds of the wall time and of the process's CPU time (user + system,
``time.process_time``) per operation, and each as a ratio to the bare hit on
the same store. The target: a Redis hold plus its release costs at most 2x one
Redis hit (wall), marked met or missed.

What each does per operation:

- hit: one check of a fixed window (memory: a dict step; Redis: one EVALSHA);
- hold: ``with limiter.hold(key): pass``: a take and a release, one script
  call each on Redis (two round trips), each a lease with an id and an expiry;
- peer semaphore: ``with SyncSemaphore(...)``: a script, BLPOP, and a pipeline
  of two EXPIREs to enter, a pipeline of LPUSH and two EXPIREs to leave (four
  round trips); its tokens are no leases: a holder that dies keeps its token
  until the whole semaphore's keys expire unused.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.redis_server import redis_server

from ratewarden import ConcurrencyLimiter, Limiter, MemoryStore
from ratewarden.stores.redis import RedisStore

Op = Callable[[], None]


def candidates(url: str, peer: str | None) -> tuple[dict[str, Op], list[object]]:
    closing: list[object] = []
    memory = MemoryStore()
    redis_store = RedisStore(url)
    closing.append(redis_store)
    big = 1_000_000_000
    mem_hit = Limiter(f"{big}/minute", store=memory, algorithm="fixed_window").hit
    redis_hit = Limiter(f"{big}/minute", store=redis_store, algorithm="fixed_window").hit
    mem_hold = ConcurrencyLimiter(1000, store=memory, name="bench").hold
    redis_hold = ConcurrencyLimiter(1000, store=redis_store, name="bench").hold

    def memory_hit() -> None:
        mem_hit("k")

    def memory_hold() -> None:
        with mem_hold("k"):
            pass

    def on_redis_hit() -> None:
        redis_hit("k")

    def on_redis_hold() -> None:
        with redis_hold("k"):
            pass

    ops: dict[str, Op] = {
        "memory hit": memory_hit,
        "memory hold": memory_hold,
        "redis hit": on_redis_hit,
        "redis hold": on_redis_hold,
    }
    if peer is not None:
        sys.path.append(peer)
        import redis  # noqa: PLC0415
        from limiters import SyncSemaphore  # type: ignore[import-not-found]  # noqa: PLC0415

        client = redis.Redis.from_url(url)
        closing.append(client)
        semaphore = SyncSemaphore(
            connection=client, name="bench", capacity=64, max_sleep=1.0, expiry=30
        )

        def peer_semaphore() -> None:
            with semaphore:
                pass

        ops["redis peer semaphore"] = peer_semaphore
    return ops, closing


def measure(ops: dict[str, Op], rounds: int, n: int) -> dict[str, tuple[float, float]]:
    """Per candidate, the minima over interleaved rounds: (wall, CPU) seconds per op."""
    best = {name: (float("inf"), float("inf")) for name in ops}
    for op in ops.values():  # warm: scripts loaded, connections open
        for _ in range(200):
            op()
    for _ in range(rounds):
        for name, op in ops.items():
            gc.collect()
            gc.disable()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                op()
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            gc.enable()
            best[name] = (min(best[name][0], wall / n), min(best[name][1], cpu / n))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--peer", help="site-packages with redis-rate-limiters")
    args = parser.parse_args()
    with redis_server() as server:
        ops, closing = candidates(server.url, args.peer)
        try:
            best = measure(ops, args.rounds, args.ops)
        finally:
            for thing in closing:
                thing.close()  # type: ignore[attr-defined]
    print(f"{args.rounds} interleaved rounds of {args.ops} ops; minima per op")
    print(f"{'candidate':24} {'wall us':>8} {'CPU us':>8} {'wall/hit':>9} {'CPU/hit':>8}")
    for name, (wall, cpu) in best.items():
        base = best["memory hit" if name.startswith("memory") else "redis hit"]
        print(f"{name:24} {wall * 1e6:8.2f} {cpu * 1e6:8.2f} {wall / base[0]:9.2f}"
              f" {cpu / base[1]:8.2f}")  # fmt: skip
    ratio = best["redis hold"][0] / best["redis hit"][0]
    verdict = "met" if ratio <= 2.0 else "MISSED"
    print(f"target: a Redis hold + release <= 2x one Redis hit (wall): {ratio:.2f}x, {verdict}")
    if "redis peer semaphore" in best:
        peer = best["redis peer semaphore"]
        print(f"ours against the peer's semaphore: wall {best['redis hold'][0] / peer[0]:.2f}x,"
              f" CPU {best['redis hold'][1] / peer[1]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
