"""A limit that gives way under load: 100 requests a second while the service's
p99 latency is good (200 ms or less), down to a floor of 20 when it is bad
(1 s or more), linear in between.

    .venv/bin/python examples/adaptive_limit.py

The application feeds the signal: here a callable the limiter reads once a
second (a rule file names the signal instead, and the application sets it with
``engine.set_load("p99_ms", value)`` or the service's ``PUT /v1/load/p99_ms``).
The signal is smoothed, so the limit eases down and up over a few seconds rather
than following every spike. A fake clock plays fourteen seconds around a latency spike.
"""

from __future__ import annotations

from ratewarden import Adaptive, FakeClock, Limiter, MemoryStore

clock = FakeClock(1_700_000_000.0)
p99_ms = [150.0]  # what the application measured last: a moving p99 of its handlers

limiter = Limiter(
    "100/second",
    store=MemoryStore(clock=clock),
    algorithm="sliding_window_counter",
    adaptive=Adaptive(lambda: p99_ms[0], good=200, bad=1000, floor="20%"),
)

LATENCY = [150] * 2 + [1200] * 4 + [150] * 8  # a spike at t=2..5 s
admitted = []
for second, latency in enumerate(LATENCY):
    p99_ms[0] = latency
    limit = limiter.effective_limit  # read at the start of the second
    count = 0
    for _ in range(150):  # 150 requests a second arrive, evenly
        count += limiter.hit("api").allowed
        clock.advance(1 / 150)
    admitted.append(count)
    print(f"t={second}s p99={latency:>4}ms limit={limit:>3} admitted={count}")

assert max(admitted[:2]) <= 100
assert admitted[5] < 50  # under the spike, the limit has come down towards its floor
assert admitted[-1] >= 95  # and back up once the latency is good again
