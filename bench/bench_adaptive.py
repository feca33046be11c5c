"""Adaptive limits: what one costs a check.

    .venv/bin/python bench/bench_adaptive.py [--rounds N]

``Limiter.hit`` and ``RuleEngine.check`` on the memory store, the same limit
plain and adaptive (its signal fed once; the limit at 60%, so every Decision is
turned into requests), minimum of interleaved rounds, in microseconds a check.
The adaptive check pays a clock read, the price's multiplication and a new
Decision; the engine's also the effective limit for its headers (cached).
"""

from __future__ import annotations

import argparse
import time

from ratewarden import Adaptive, Limiter, MemoryStore
from ratewarden.rules import RuleEngine, loads

PLAIN = """
rules:
  - name: api
    rate: 1000000/second
    by: user
"""
ADAPTIVE = PLAIN + "    adaptive: {signal: p99_ms, good: 200, bad: 1000, floor: 20%}\n"
N = 20_000


def per_check(run: object) -> float:
    began = time.perf_counter()
    for i in range(N):
        run(i)  # type: ignore[operator]
    return (time.perf_counter() - began) / N * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    plain_limiter = Limiter("1000000/second", store=MemoryStore())
    adaptive_limiter = Limiter(
        "1000000/second", store=MemoryStore(),
        adaptive=Adaptive(lambda: 600.0, good=200, bad=1000, floor=0.2),
    )  # fmt: skip
    plain_engine = RuleEngine(loads(PLAIN), MemoryStore())
    adaptive_engine = RuleEngine(loads(ADAPTIVE), MemoryStore())
    adaptive_engine.set_load("p99_ms", 600)
    users = [{"user": f"u{i % 100}"} for i in range(100)]
    runs = {
        "Limiter.hit, plain": lambda i: plain_limiter.hit("k"),
        "Limiter.hit, adaptive": lambda i: adaptive_limiter.hit("k"),
        "RuleEngine.check, plain": lambda i: plain_engine.check(users[i % 100]),
        "RuleEngine.check, adaptive": lambda i: adaptive_engine.check(users[i % 100]),
    }
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            best[name] = min(best[name], per_check(run))
    # a price is whole units: above 1000 a window the limit is within 0.1% of 60%
    full, effective = adaptive_engine.effective_limits()["api"]
    assert full == 1_000_000
    assert 600_000 <= effective <= 600_600
    for name, us in best.items():
        print(f"{name:<28} {us:6.2f} us")


if __name__ == "__main__":
    main()
