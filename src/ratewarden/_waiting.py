"""Waiting for a permit: the logic once, the sync and async shells only wait.

Callers of ``acquire`` on one key take turns: only the head of a key's line
tries the store; it sleeps exactly ``retry_after`` between tries (no polling)
and hands the turn to the next caller when it gets its permit or gives up. A
caller that can tell it will miss its deadline (the wait is longer than the time
left, or the cost can never be granted) gives up at once instead of sleeping.

Priority classes: a caller may say its class (an int, higher first). The line
is kept in order of class, then of arrival, so a higher class is served before
any lower one that arrived earlier. The head does not lose the turn while it
sleeps towards its permit; when it wakes and a higher class waits behind it, it
steps back into the line (keeping its place among its own class) and the higher
class tries at once, for the permit that has just fallen due. A higher class
so waits at most for the permit the head was sleeping towards, plus the permits
of the higher callers before it. Every caller keeps its own deadline: one that
a stream of higher classes keeps waiting is told at its deadline
(`RateLimitTimeout`), never later.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import threading
from collections.abc import Generator
from typing import Any, Generic, NamedTuple, TypeAlias, TypeVar

from ._clock import Clock, SystemClock
from ._decision import Decision
from ._errors import ConfigurationError, RateLimitTimeout

__all__ = [
    "HIT",
    "Aside",
    "AsyncTurns",
    "Hit",
    "Sleep",
    "Step",
    "Turn",
    "Turns",
    "acquiring",
    "asleep_precisely",
    "check_max_wait",
    "check_priority",
    "check_spin",
    "deadline_ns",
    "next_wait",
    "timed_out",
]

W = TypeVar("W")


def check_max_wait(max_wait: float) -> None:
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float):
        raise ConfigurationError(f"max_wait must be a number of seconds, got {max_wait!r}")
    if not max_wait >= 0:  # also rejects NaN
        raise ConfigurationError(f"max_wait must be >= 0 seconds, got {max_wait!r}")


def check_spin(spin: float) -> float:
    if isinstance(spin, bool) or not isinstance(spin, int | float) or not 0 <= spin <= 0.1:  # type: ignore[redundant-expr]
        raise ConfigurationError(f"spin is 0 to 0.1 seconds, got {spin!r}")
    return float(spin)


async def asleep_precisely(clock: Clock, seconds: float, spin: float) -> None:
    """Sleep ``seconds`` on ``clock``. On the system clock with ``spin`` > 0, sleep
    until ``spin`` before the end and then yield to the loop until it comes:
    the loop's timers wake up to a millisecond late (epoll counts whole
    milliseconds, rounded up), which a paced release or a permit due to a
    higher class would otherwise pay, at the cost of up to ``spin`` of CPU."""
    if spin <= 0 or not isinstance(clock, SystemClock):
        await clock.asleep(seconds)
        return
    loop = asyncio.get_running_loop()
    due = loop.time() + seconds
    if seconds > spin:
        await asyncio.sleep(seconds - spin)
    while loop.time() < due:
        await asyncio.sleep(0)


def check_priority(priority: int | str, classes: tuple[str, ...] = ()) -> int:
    """A caller's class as an int (higher first): an int as it is, or a name of
    ``classes`` (the first listed ranks highest, the last as the default 0)."""
    if type(priority) is int:
        return priority
    if isinstance(priority, str):
        if priority in classes:
            return len(classes) - 1 - classes.index(priority)
        known = ", ".join(classes) if classes else "none (pass classes=[...] to the limiter)"
        raise ConfigurationError(f"unknown priority class {priority!r}; classes: {known}")
    raise ConfigurationError(f"priority is an int or a class name, got {priority!r}")


def deadline_ns(now_ns: int, max_wait: float) -> float:
    return math.inf if math.isinf(max_wait) else now_ns + round(max_wait * 1e9)


def next_wait(decision: Decision, key: str, now_ns: int, deadline: float, max_wait: float) -> float:
    """Seconds to sleep before the next try, or `RateLimitTimeout` if that is pointless."""
    retry = decision.retry_after
    if math.isinf(retry):
        raise RateLimitTimeout(
            f"{key!r}: {decision.reason}; waiting cannot help", key=key, retry_after=retry
        )
    if now_ns + round(retry * 1e9) > deadline:
        raise RateLimitTimeout(
            f"{key!r}: no permit within max_wait={max_wait}s (next in {retry:.6g}s)",
            key=key,
            retry_after=retry,
        )
    return retry


def timed_out(key: str, max_wait: float) -> RateLimitTimeout:
    return RateLimitTimeout(
        f"{key!r}: no turn within max_wait={max_wait}s (earlier callers still waiting)",
        key=key,
        retry_after=max_wait,
    )


class _Queues(Generic[W]):
    """Per-key lines of waiters; the head holds the turn. The others stand in
    order of class (higher ``priority`` first) and, within a class, of arrival.
    An entry is ``[rank, seq, waiter, deadline]`` (rank = -priority; deadline in
    the clock's ns); its waiter is ``None`` while it has never had to wait (no
    waiter object made on the uncontended path).

    A waiter's deadline is watched by a timer of its own (real time), and on the
    line's clock: when the turn changes hands, every waiter whose deadline has
    passed is woken to give up, and when the head goes to sleep until its
    permit, so is every waiter whose deadline comes before that (nobody behind
    the head can be served sooner). So a fake clock's deadlines hold too, and a
    waiter overtaken by higher classes is told as soon as its deadline cannot be
    met, not when the line reaches it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._queues: dict[str, list[list[Any]]] = {}
        self._seq = itertools.count()
        self._expired: set[int] = set()  # ids of waiters told to give up

    def _join(self, key: str, waiter: W | None, priority: int, deadline: float) -> bool:
        """Enqueue; True if the caller holds the turn at once (then nothing is
        enqueued without a waiter)."""
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                self._queues[key] = [[-priority, next(self._seq), None, deadline]]
                return True
            if waiter is not None:
                _insert(queue, [-priority, next(self._seq), waiter, deadline])
            return False

    def _give_up(self, key: str, waiter: W) -> bool:
        """Leave the line; False if the turn has reached this waiter (it keeps it)."""
        with self._lock:
            if id(waiter) in self._expired:
                self._expired.discard(id(waiter))
                return True
            queue = self._queues[key]
            if queue[0][2] is waiter:
                return False
            for i, entry in enumerate(queue):
                if entry[2] is waiter:
                    del queue[i]
                    break
            return True

    def _pass_on(self, key: str) -> tuple[W | None, list[W]]:
        """Leave the head; the next waiter to wake, if any, and those to tell
        their time is up."""
        with self._lock:
            queue = self._queues[key]
            del queue[0]
            expired = self._reap(queue)
            if not queue:
                del self._queues[key]
                return None, expired
            return queue[0][2], expired

    def _reap(self, queue: list[list[Any]], until: float | None = None, start: int = 0) -> list[W]:
        """Take the waiters from ``start`` on whose deadline comes before
        ``until`` (now, unless given) out of the line (under the lock)."""
        until = self.clock.time_ns() if until is None else until
        if all(entry[3] >= until for entry in queue[start:]):
            return []
        expired = [entry[2] for entry in queue[start:] if entry[3] < until]
        queue[start:] = [entry for entry in queue[start:] if entry[3] >= until]
        self._expired.update(id(w) for w in expired)
        return expired

    def _doomed(self, key: str, until: float) -> list[W]:
        with self._lock:
            queue = self._queues.get(key)
            return [] if queue is None else self._reap(queue, until, 1)

    def busy(self, key: str) -> bool:
        """Whether someone holds ``key``'s turn (a newcomer would queue)."""
        return key in self._queues

    def outranked(self, key: str) -> bool:
        """Whether a caller of a higher class than the head waits behind it."""
        queue = self._queues.get(key)
        # a read without the lock: a join that races it is seen at the next look
        return queue is not None and len(queue) > 1 and queue[1][0] < queue[0][0]

    def _aside(self, key: str, waiter: W) -> tuple[W | None, list[W]]:
        """The head steps back into the line (keeping its class and its place in
        arrival order) behind the higher class that waits; the new head to wake
        and the waiters whose time is up."""
        with self._lock:
            queue = self._queues[key]
            head = queue.pop(0)
            head[2] = waiter
            expired = self._reap(queue)
            _insert(queue, head)
            return queue[0][2], expired

    def _expired_now(self, waiter: W) -> bool:
        with self._lock:
            if id(waiter) in self._expired:
                self._expired.discard(id(waiter))
                return True
            return False

    def _wake(self, waiter: W | None, expired: list[W]) -> None:  # the shells override
        raise NotImplementedError

    def leave(self, key: str) -> None:
        """Hand ``key``'s turn to the next caller in line."""
        self._wake(*self._pass_on(key))

    def expire_before(self, key: str, until: float) -> None:
        """The head sleeps until ``until`` (ns): tell every waiter whose
        deadline comes first that it cannot be served in time."""
        self._wake(None, self._doomed(key, until))

    def __len__(self) -> int:
        return len(self._queues)


def _insert(queue: list[list[Any]], entry: list[Any]) -> None:
    """Into its place by (rank, seq), never before the head, which holds the turn."""
    bisect.insort(queue, entry, lo=1 if queue else 0, key=_order)


def _order(entry: list[Any]) -> tuple[int, int]:
    return entry[0], entry[1]


def _timeout(deadline: float, now: int) -> float:
    return (deadline - now) / 1e9


class Turns(_Queues[threading.Event]):
    def wait_turn(self, key: str, deadline: float, priority: int = 0) -> bool:
        """Wait for ``key``'s turn until ``deadline`` (the clock's ns, or inf);
        False when it passed first."""
        if self._join(key, None, priority, deadline):
            return True
        if _timeout(deadline, self.clock.time_ns()) <= 0:
            return False
        event = threading.Event()
        if self._join(key, event, priority, deadline):  # the queue emptied meanwhile
            return True
        return self._wait(key, event, deadline)

    def step_aside(self, key: str, deadline: float) -> bool:
        """The head lets a higher class go first and waits for the turn again
        until ``deadline``; False when that passed (the turn is not held then)."""
        event = threading.Event()
        woken, expired = self._aside(key, event)
        self._wake(woken, expired)
        return self._wait(key, event, deadline)

    def _wait(self, key: str, event: threading.Event, deadline: float) -> bool:
        timeout = _timeout(deadline, self.clock.time_ns())
        # Event.wait overflows past threading.TIMEOUT_MAX: an infinite wait is None
        limit = None if timeout >= threading.TIMEOUT_MAX else max(timeout, 0.0)
        try:
            if event.wait(limit):
                return not self._expired_now(event)
            return not self._give_up(key, event)
        except BaseException:  # interrupted (KeyboardInterrupt ...): never strand the turn
            if not self._give_up(key, event):
                self.leave(key)
            raise

    def _wake(self, waiter: threading.Event | None, expired: list[threading.Event]) -> None:
        for gone in expired:
            gone.set()
        if waiter is not None:
            waiter.set()


class AsyncTurns(_Queues["asyncio.Future[None]"]):
    async def wait_turn(self, key: str, deadline: float, priority: int = 0) -> bool:
        """`Turns.wait_turn` without blocking the event loop."""
        if self._join(key, None, priority, deadline):
            return True
        if _timeout(deadline, self.clock.time_ns()) <= 0:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._join(key, future, priority, deadline):
            return True
        return await self._wait(key, future, deadline)

    async def step_aside(self, key: str, deadline: float) -> bool:
        """`Turns.step_aside` without blocking the event loop."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wake(*self._aside(key, future))
        return await self._wait(key, future, deadline)

    async def _wait(self, key: str, future: asyncio.Future[None], deadline: float) -> bool:
        timeout = max(_timeout(deadline, self.clock.time_ns()), 0.0)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for returns as if
            # nothing happened when the caller is cancelled in the loop turn its
            # future completes, and the cancelled caller would go on with the turn
            async with asyncio.timeout(None if math.isinf(timeout) else timeout):
                await asyncio.shield(future)
        except TimeoutError:
            return not self._give_up(key, future)
        except BaseException:  # cancelled: never strand the turn
            if not self._give_up(key, future):
                self.leave(key)
            raise
        return not self._expired_now(future)

    def _wake(
        self, waiter: asyncio.Future[None] | None, expired: list[asyncio.Future[None]]
    ) -> None:
        for gone in expired:
            if not gone.done():
                gone.set_result(None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


# The steps of an ``acquire`` that its shell does its own way (see `acquiring`).


class Turn(NamedTuple):
    """Wait for the key's turn, in class ``rank``, until ``deadline`` (the clock's
    ns); answer whether it came."""

    deadline: float
    rank: int


class Hit(NamedTuple):
    """Try the store for the permit; answer its Decision."""


class Sleep(NamedTuple):
    """Sleep ``seconds`` towards the next permit, holding the turn; answer None."""

    seconds: float


class Aside(NamedTuple):
    """Let the higher class behind go first, then wait for the turn again until
    ``deadline``; answer whether it came back (if not, it is not held)."""

    deadline: float


HIT = Hit()
Step: TypeAlias = Turn | Hit | Sleep | Aside


def acquiring(
    turns: _Queues[Any], key: str, max_wait: float, priority: int | str, classes: tuple[str, ...]
) -> Generator[Step, Any, Decision]:
    """One ``acquire`` of ``key``, written once for `Limiter` and `AsyncLimiter`:
    it yields each step that waits or calls the store, is sent that step's
    answer, and returns the permit's Decision or raises `RateLimitTimeout`.
    Closed while it holds the turn (its shell's step raised, or was cancelled),
    it hands the turn on; while stepping aside it holds none, so it leaves
    nobody else's."""
    check_max_wait(max_wait)
    rank = check_priority(priority, classes)
    clock = turns.clock
    deadline = deadline_ns(clock.time_ns(), max_wait)
    if not (yield Turn(deadline, rank)):
        raise timed_out(key, max_wait)
    holding = True
    try:
        while True:
            # its turn came, but late (a slow wake); max_wait=0 tries once, never late
            if max_wait and clock.time_ns() > deadline:
                raise timed_out(key, max_wait)
            decision: Decision = yield HIT
            if decision.allowed:
                return decision
            now = clock.time_ns()
            wait = next_wait(decision, key, now, deadline, max_wait)
            turns.expire_before(key, now + round(wait * 1e9))
            yield Sleep(wait)
            if turns.outranked(key):
                holding = False  # a step aside that raises has given the turn up already
                holding = yield Aside(deadline)
                if not holding:
                    raise timed_out(key, max_wait)
    finally:
        if holding:
            turns.leave(key)
