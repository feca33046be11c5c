"""Both sides of rate limiting in one script, on simulated time (runs in milliseconds).

Provider side: at most 5 login attempts per user per 15 minutes (a fixed window).
Consumer side: a partner API allows 2 calls per second with no bursts; our client waits
for a permit (up to a deadline) instead of being rejected.
"""

from __future__ import annotations

import math

from ratewarden import FakeClock, Limiter, MemoryStore, RateLimitTimeout

clock = FakeClock(1_700_000_000)  # remove `clock=` to run on the real clock
store = MemoryStore(max_keys=100_000, clock=clock)


def login(user: str, password: str, attempts: Limiter) -> str:
    decision = attempts.hit(f"user:{user}")
    if not decision.allowed:
        # Whole seconds, rounded up: a client told to retry early is refused again.
        return f"429 Too Many Requests, Retry-After: {math.ceil(decision.retry_after)}"
    return "200 OK" if password == "hunter2" else "401 wrong password"


def main() -> None:
    # Fixed windows align to the epoch: this 15-minute window started 800 s before the
    # clock's start and ends 100 s after it, whenever the first attempt comes.
    attempts = Limiter("5/15minutes", algorithm="fixed_window", store=store, name="login")
    for guess in ["a", "b", "c", "d", "e", "hunter2"]:
        print(f"login(alice, {guess!r}) -> {login('alice', guess, attempts)}")

    partner = Limiter("2/second", algorithm="gcra", burst=1, store=store, name="partner")
    start = clock.now_ns
    for call in range(4):
        partner.acquire("api.partner.example", max_wait=1.0)
        print(f"call {call} sent at t={(clock.now_ns - start) / 1e9:.1f}s")
    try:
        partner.acquire("api.partner.example", max_wait=0.1)
    except RateLimitTimeout as exc:
        print(f"gave up: {exc}")


if __name__ == "__main__":
    main()
