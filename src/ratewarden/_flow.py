"""Logic written once as a flow: a generator of the calls it needs, driven by a
sync or an async shell.

A flow yields each call as a callable without arguments (a bound method, a
`functools.partial`) and is sent what it answered; a flow that yields steps of
its own (a shard and its key) is driven with the ``ask`` that turns a step into
its call. `drive` makes the calls and
blocks; `adrive` makes them and awaits what they return. Which of the two a
flow suits is the choice of the objects its shell hands it (a `Limiter` or an
`AsyncLimiter`, ``clock.sleep`` or ``clock.asleep``); the flow cannot tell.

A call that raises, or a shell cancelled while it awaits, closes the flow: its
``finally`` clauses run at once, handing on whatever it holds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from contextlib import closing
from typing import Any, TypeAlias, TypeVar

__all__ = ["Call", "Flow", "adrive", "drive"]

T = TypeVar("T")
S = TypeVar("S")  # what a flow yields: a call, or a step its shell knows how to ask
Call: TypeAlias = Callable[[], Any]
Flow: TypeAlias = Generator[Call, Any, T]


def _made(call: Any) -> Any:
    return call()


def drive(flow: Generator[S, Any, T], ask: Callable[[S], Any] = _made) -> T:
    """Run ``flow`` to its end, asking ``ask`` (by default: making the call) for
    each step it yields; what it returns."""
    answer = None
    with closing(flow):
        while True:
            try:
                step = flow.send(answer)
            except StopIteration as done:  # the flow's end (a call's StopIteration is no end)
                result: T = done.value
                return result
            answer = ask(step)


async def adrive(flow: Generator[S, Any, T], ask: Callable[[S], Awaitable[Any]] = _made) -> T:
    """`drive`, awaiting what ``ask`` returns."""
    answer = None
    with closing(flow):
        while True:
            try:
                step = flow.send(answer)
            except StopIteration as done:
                result: T = done.value
                return result
            answer = await ask(step)
