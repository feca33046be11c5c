"""Concurrency limits: what a hold and its release cost, beside one bare
`Limiter.hit` on the same store, and beside redis-rate-limiters' semaphore.

    .venv/bin/python bench/bench_concurrency.py [--rounds N] [--ops N] [--peer SITE]

``--peer SITE``: a site-packages directory holding redis-rate-limiters (its
``limiters`` package), e.g. a throwaway venv's; it is put last on the path, so
that our redis-py serves both. Without it the peer is left out.

Starts its own redis-server on a free loopback port. Single thread, sync, one
key, a free slot every time (the cost of taking and giving back, not of
waiting). Candidates run interleaved in rounds, the order turned each round;
per candidate the minimum over the rounds of the wall time, of the process's CPU
time (user + system, ``time.process_time``) and, on Redis, of that plus
redis-server's (its main thread's ``/proc/<pid>/schedstat``), per operation, and
each as a ratio to the bare hit on the same store. Beside the minima, the median
over rounds of a round's hold-to-hit ratio: this machine's speed moves within
seconds, and two minima may come from different moments. The target: a Redis
hold plus its release costs at most 2x one Redis hit (wall), by both, marked met
or missed.

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

from _rounds import per_round, server_cpu_ns
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


class Figures:
    """One candidate's figures per op: each round's wall, client CPU and
    redis-server CPU, seconds."""

    def __init__(self) -> None:
        self.rounds: list[tuple[float, float, float]] = []

    def best(self, field: int) -> float:
        return min(r[field] for r in self.rounds)

    def total_cpu(self) -> float:
        return min(r[1] + r[2] for r in self.rounds)


def measure(ops: dict[str, Op], rounds: int, n: int, pid: int) -> dict[str, Figures]:
    """Interleaved rounds, the order turned each round so that none always
    follows another; per candidate and round, per op: wall, client CPU
    (``time.process_time``) and redis-server's CPU."""
    found = {name: Figures() for name in ops}
    for op in ops.values():  # warm: scripts loaded, connections open
        for _ in range(200):
            op()
    names = list(ops)
    for r in range(rounds):
        turn = r % len(names)
        for name in names[turn:] + names[:turn]:
            op = ops[name]
            gc.collect()
            gc.disable()
            server0 = server_cpu_ns(pid)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                op()
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            server = (server_cpu_ns(pid) - server0) / 1e9
            gc.enable()
            found[name].rounds.append((wall / n, cpu / n, server / n))
    return found


def paired(
    hold: Figures, hit: Figures, figure: Callable[[tuple[float, float, float]], float]
) -> float:
    """A hold's ``figure`` over the hit's, judged round by round (see `_rounds`)."""
    return per_round([figure(r) for r in hold.rounds], [figure(r) for r in hit.rounds])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--ops", type=int, default=1500)
    parser.add_argument("--peer", help="site-packages with redis-rate-limiters")
    args = parser.parse_args()
    with redis_server() as server:
        assert server.process is not None
        ops, closing = candidates(server.url, args.peer)
        try:
            found = measure(ops, args.rounds, args.ops, server.process.pid)
        finally:
            for thing in closing:
                thing.close()  # type: ignore[attr-defined]
    print(f"{args.rounds} interleaved rounds of {args.ops} ops; minima per op over the rounds")
    print(f"{'candidate':24} {'wall us':>8} {'CPU us':>8} {'+server':>8} {'wall/hit':>9}"
          f" {'CPU/hit':>8}")  # fmt: skip
    for name, f in found.items():
        base = found["memory hit" if name.startswith("memory") else "redis hit"]
        wall, cpu, total = f.best(0), f.best(1), f.total_cpu()
        server = "" if name.startswith("memory") else f"{total * 1e6:8.2f}"
        print(f"{name:24} {wall * 1e6:8.2f} {cpu * 1e6:8.2f} {server:>8}"
              f" {wall / base.best(0):9.2f} {cpu / base.best(1):8.2f}")  # fmt: skip
    hold, hit = found["redis hold"], found["redis hit"]
    ratio = hold.best(0) / hit.best(0)
    pair_wall = paired(hold, hit, lambda r: r[0])
    pair_cpu = paired(hold, hit, lambda r: r[1] + r[2])
    print(f"redis hold over redis hit, the median of each round's ratio: wall {pair_wall:.2f}x,"
          f" CPU (client + redis-server) {pair_cpu:.2f}x")  # fmt: skip
    verdict = "met" if max(ratio, pair_wall) <= 2.0 else "MISSED"
    print(f"target: a Redis hold + release <= 2x one Redis hit (wall): minima {ratio:.2f}x,"
          f" paired {pair_wall:.2f}x, {verdict}")  # fmt: skip
    if "redis peer semaphore" in found:
        peer = found["redis peer semaphore"]
        print(f"ours against the peer's semaphore: wall {hold.best(0) / peer.best(0):.2f}x,"
              f" CPU {hold.best(1) / peer.best(1):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
