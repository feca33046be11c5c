"""How an engine holds a request its rules delay or queue: written once (a
generator) for the blocking and the asyncio engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator

import msgspec

from .._clock import Clock
from ._outcome import Outcome, Verdict

__all__ = ["wait_out", "wait_out_sync"]


def _waits(outcome: Outcome, clock: Clock) -> Generator[float, Outcome, Outcome]:
    """How a ``delay`` outcome is held, written once for both engines: yields the
    seconds to sleep and is sent the outcome of checking again, until it passes,
    is rejected, or would wait past the rule's ``max_wait`` counted from now. Any
    other outcome is returned as it is."""
    if outcome.action != "delay" or outcome.rule is None:
        return outcome
    deadline = clock.time_ns() + round((outcome.rule.max_wait or 0) * 1e9)
    while True:
        if clock.time_ns() + round(outcome.wait * 1e9) > deadline:
            return _too_long(outcome)
        outcome = yield outcome.wait
        if outcome.action != "delay":
            return outcome


def wait_out_sync(outcome: Outcome, check_again: Callable[[], Outcome], clock: Clock) -> Outcome:
    """`_waits` on a blocking clock; a queued request sleeps until its slot."""
    if outcome.action == "queue":  # its slot is taken: hold it until due, then go
        clock.sleep(outcome.wait)
        return _released(outcome)
    waits = _waits(outcome, clock)
    try:
        seconds = next(waits)
        while True:
            clock.sleep(seconds)
            seconds = waits.send(check_again())
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def wait_out(
    outcome: Outcome, check_again: Callable[[], Awaitable[Outcome]], clock: Clock
) -> Outcome:
    """`_waits` without blocking the event loop; a queued request sleeps until
    its slot (it is counted: no second check)."""
    if outcome.action == "queue":
        await clock.asleep(outcome.wait)
        return _released(outcome)
    waits = _waits(outcome, clock)
    try:
        seconds = next(waits)
        while True:
            await clock.asleep(seconds)
            seconds = waits.send(await check_again())
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _released(outcome: Outcome) -> Outcome:
    """A queued request whose slot has come: it goes (degraded, if it was)."""
    action: Verdict = "degrade" if outcome.degrade else "allow"
    return msgspec.structs.replace(outcome, action=action, wait=0.0)


def _too_long(outcome: Outcome) -> Outcome:
    """A delay that would run past the rule's ``max_wait``: rejected after all."""
    return msgspec.structs.replace(outcome, action="reject", wait=0.0, status=429)
