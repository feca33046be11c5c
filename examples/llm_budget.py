"""Tokens per minute and per day for an LLM API, when a call's cost is known only
from its answer.

    python examples/llm_budget.py

A fake OpenAI-style provider allows 40,000 tokens a minute (its minutes aligned
to the epoch) and answers 429 to a call that would go past that; every answer
tells its ``usage.total_tokens``. 32 workers send chat calls that take 20 s
each; a call's prompt is 200-400 tokens and its completion mostly short, but up
to ``max_tokens=4096``. The client limits itself to 36,000 tokens a minute (a
tenth below the provider: room for the few calls that use more than they
reserved) and 10 million a day: each call reserves before it is sent and
settles with what the answer says it used.

Reserving the worst case (prompt + max_tokens) holds so much while calls are in
flight that few run at once; reserving what the profile learned (the p95 of
what its calls used) keeps the minute busy. Both runs send an hour of calls on
a fake clock in well under a second, and neither meets a 429.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from ratewarden import Estimates, FakeClock, Limiter, MemoryStore, Reservation

PROVIDER_TPM = 40_000
CLIENT_TPM, CLIENT_TPD = 36_000, 10_000_000
WORKERS, LATENCY, MAX_TOKENS, PROMPT_MAX = 32, 20.0, 4096, 400
MINUTES = 60
START = 1_700_000_040.0  # a minute's start


@dataclass
class Usage:
    total_tokens: int


class Provider:
    """The provider: each call's tokens count in the minute it arrives."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.minutes: dict[int, int] = {}  # minute -> tokens
        self.rejected = 0

    def chat(self, prompt_tokens: int, completion_tokens: int) -> tuple[int, Usage | None]:
        minute = int(self.clock.time_ns() // 60_000_000_000)
        total = prompt_tokens + completion_tokens
        used = self.minutes.get(minute, 0)
        if used + total > PROVIDER_TPM:
            self.rejected += 1
            return 429, None
        self.minutes[minute] = used + total
        return 200, Usage(total)


def run(learned: bool) -> tuple[float, int, int, int]:
    """An hour of calls; returns tokens a minute served after the first
    minute, the 429s, the estimate reserved last, and the tokens of the day."""
    clock = FakeClock(START)
    store = MemoryStore(clock=clock)
    estimates = Estimates(ceiling=PROMPT_MAX + MAX_TOKENS, floor=PROMPT_MAX) if learned else None
    minute = Limiter(f"{CLIENT_TPM}/minute", algorithm="fixed_window", store=store,
                     estimates=estimates)  # fmt: skip
    day = Limiter(f"{CLIENT_TPD}/day", algorithm="fixed_window", store=store)
    provider = Provider(clock)
    rng = random.Random(7)
    in_flight: list[tuple[int, int, Reservation, Reservation, int, int]] = []  # a heap
    calls, last_estimate = 0, 0
    end = clock.time_ns() + MINUTES * 60_000_000_000
    while clock.time_ns() < end:
        # start calls while a worker is free and both limits admit one
        while len(in_flight) < WORKERS:
            prompt = rng.randint(200, PROMPT_MAX)
            if learned:
                held = minute.reserve("api", profile="chat")
            else:
                held = minute.reserve("api", cost=prompt + MAX_TOKENS)
            if not held:
                wait = held.retry_after
                break
            daily = day.reserve("api", cost=held.estimate)
            if not daily:
                held.cancel()
                wait = daily.retry_after
                break
            last_estimate = held.estimate
            completion = min(MAX_TOKENS, int(rng.expovariate(1 / 300)))
            done = clock.time_ns() + int(LATENCY * 1e9)
            heapq.heappush(in_flight, (done, calls, held, daily, prompt, completion))
            calls += 1
        else:
            wait = float("inf")
        # the next event: a call's answer, or the limit's retry_after
        next_ns = in_flight[0][0] if in_flight else end
        if wait != float("inf"):
            next_ns = min(next_ns, clock.time_ns() + int(wait * 1e9))
        clock.now_ns = max(next_ns, clock.now_ns)
        while in_flight and in_flight[0][0] <= clock.time_ns():
            _, _, held, daily, prompt, completion = heapq.heappop(in_flight)
            status, usage = provider.chat(prompt, completion)
            if status == 429 or usage is None:  # nothing was used
                held.cancel()
                daily.cancel()
            else:
                held.settle(usage.total_tokens)
                daily.settle(usage.total_tokens)
    first = int(START // 60)
    served = [tokens for m, tokens in provider.minutes.items() if m > first]
    today = CLIENT_TPD - day.peek("api").remaining
    return sum(served) / max(len(served), 1), provider.rejected, last_estimate, today


def main() -> None:
    for learned in (False, True):
        rate, rejected, estimate, today = run(learned)
        how = "learned p95" if learned else "static worst case"
        print(
            f"{how} ({estimate} tokens a call): {rate:,.0f} tokens/min sustained of"
            f" {PROVIDER_TPM:,}, {rejected} answered 429, {today:,} tokens today"
        )


if __name__ == "__main__":
    main()
