"""Runtime overrides: how soon another process applies one, and what one costs
a check.

    .venv/bin/python bench/bench_overrides.py [--rounds N]

Starts its own redis-server on a free loopback port.

- Reach: engine A sets an override (a new rate each round, 100 ms apart) and a
  thread polls engine B's limit in force every 0.1 ms; the time from A's
  ``set_override`` returning to B applying it. Two engines in one process, each
  with its own store, connections and follower, as two processes would have.
- Cost: ``RuleEngine.check`` on the memory store with no override, with an
  override of another rule, and with the request's own rule overridden; minimum
  of interleaved rounds, in microseconds a check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_server import redis_server

from ratewarden import MemoryStore
from ratewarden.rules import RuleEngine, loads
from ratewarden.stores.redis import RedisStore

RULES = loads("""
rules:
  - name: api
    rate: 1000000/second
    by: user
  - name: other
    match: {paths: /other}
    rate: 10/second
""")


def reach(rounds: int) -> list[float]:
    took = []
    with redis_server() as server:
        a = RuleEngine(RULES, RedisStore(server.url))
        b = RuleEngine(RULES, RedisStore(server.url))
        for n in range(rounds):
            time.sleep(0.1)
            a.set_override("api", f"{2_000_000 + n}/second", duration=600, reason="bench")
            began = time.perf_counter()
            while b._bound.specs[0].rate.limit != 2_000_000 + n:
                time.sleep(0.0001)
            took.append((time.perf_counter() - began) * 1000)
        a.close()
        b.close()
    return took


def cost(rounds: int, checks: int) -> dict[str, float]:
    attributes = {"path": "/x", "user": "u"}
    engines = {}
    for case in ("none", "another rule", "its own rule"):
        engine = RuleEngine(RULES, MemoryStore())
        if case == "another rule":
            engine.set_override("other", "20/second", duration=3600, reason="bench")
        elif case == "its own rule":
            engine.set_override("api", "2000000/second", duration=3600, reason="bench")
        engines[case] = engine
    best = dict.fromkeys(engines, float("inf"))
    for _ in range(rounds):
        for case, engine in engines.items():
            check = engine.check
            began = time.perf_counter()
            for _ in range(checks):
                check(attributes)
            best[case] = min(best[case], (time.perf_counter() - began) / checks * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    took = sorted(reach(args.rounds))
    p99 = took[min(len(took) - 1, round(0.99 * (len(took) - 1)))]
    print(f"reach over {len(took)} changes: median {statistics.median(took):.2f} ms, "
          f"p99 {p99:.2f} ms, max {took[-1]:.2f} ms")  # fmt: skip
    for case, us in cost(7, 20_000).items():
        print(f"check, override of {case:<13}: {us:.2f} us")


if __name__ == "__main__":
    main()
