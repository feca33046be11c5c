"""A coroutine started where it is made, with a task only if it has to wait.

A task costs a unary call about 2 us (made, scheduled, stepped in a later turn of
the loop), a twentieth of a check on the memory store, which never waits: there
the call runs to its end in the read that completed it, and its answer goes out
with the others of that read. A coroutine that does wait goes on in a task from
where it stopped. asyncio has this as ``eager_task_factory`` from Python 3.12;
this is its part that 3.11 can run.

Its first step runs outside any task: ``asyncio.current_task()`` is None there,
and ``asyncio.timeout`` refuses to run. A handler is started so only when its
first step needs neither (`Method.eager`: the checks of the memory store).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["start"]

T = TypeVar("T")


def start(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]
) -> asyncio.Task[None] | None:
    """Run ``coro`` up to its first wait, now; None if it ended there, else the
    task that runs the rest (cancel it as the coroutine's own)."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return loop.create_task(_rest(coro, waiting))


@types.coroutine
def _rest(coro: Coroutine[Any, Any, T], waiting: Any) -> Generator[Any, Any, T]:
    """The rest of ``coro``, which stopped on ``waiting`` (a future, or None for a
    bare yield): the task waits on what it yields and sends its result or throws
    its exception (a cancellation among them) on into ``coro``."""
    while True:
        try:
            sent = yield waiting
        except BaseException as exc:  # thrown in by the task: handed on as it is
            try:
                waiting = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                waiting = coro.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
