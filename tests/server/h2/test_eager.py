"""A coroutine started eagerly: run to its end at once when it never waits, and
handed to a task, from where it stopped, when it does."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

import pytest

from ratewarden.server.h2._eager import start


def run(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())  # type: ignore[arg-type]

    return sync


@run
async def test_a_coroutine_that_never_waits_ends_at_once_without_a_task() -> None:
    seen: list[str] = []

    async def quick() -> None:
        seen.append("ran")

    assert start(asyncio.get_running_loop(), quick()) is None
    assert seen == ["ran"]  # before any turn of the loop


@run
async def test_a_coroutine_that_waits_goes_on_in_a_task_from_where_it_stopped() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    seen: list[object] = []

    async def waits() -> None:
        seen.append("first step")
        seen.append(await gate)
        await asyncio.sleep(0)  # a bare yield, too
        seen.append(asyncio.current_task() is not None)

    task = start(loop, waits())
    assert task is not None
    assert seen == ["first step"]
    gate.set_result(7)
    await task
    assert seen == ["first step", 7, True]


@run
async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def waits() -> None:
        try:
            await loop.create_future()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    task = start(loop, waits())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled", "finally"]
    assert task.cancelled()


@run
async def test_an_error_after_the_wait_is_the_task_s_and_a_result_is_kept() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()

    async def fails() -> None:
        await gate
        raise ValueError("after the wait")

    task = start(loop, fails())
    assert task is not None
    gate.set_result(None)
    with pytest.raises(ValueError, match="after the wait"):
        await task

    failing: asyncio.Future[None] = loop.create_future()

    async def caught() -> None:
        try:
            await failing
        except KeyError:
            return

    task = start(loop, caught())
    assert task is not None
    failing.set_exception(KeyError("thrown in"))
    await task  # thrown into the coroutine, which handled it
    assert task.exception() is None


@run
async def test_an_error_in_the_first_step_is_the_caller_s() -> None:
    async def broken() -> None:
        raise RuntimeError("at once")

    with pytest.raises(RuntimeError, match="at once"):
        start(asyncio.get_running_loop(), broken())


@run
async def test_a_cancellation_between_bare_yields_is_thrown_into_the_coroutine() -> None:
    seen: list[str] = []

    async def spins() -> None:
        try:
            for _ in range(1000):  # bounded: a lost cancellation fails, it does not hang
                await asyncio.sleep(0)  # a bare yield: no future for the task to cancel
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = start(asyncio.get_running_loop(), spins())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]
    assert task.cancelled()
