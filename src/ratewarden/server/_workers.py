"""The workers of ``ratewarden serve --workers N``: processes forked from
``serve``, sharing its HTTP socket and, through SO_REUSEPORT, the gRPC port.

- SIGTERM and SIGINT sent to ``serve`` go on to every worker, which drains;
  SIGHUP goes on too, and each worker reloads its rules.
- A worker that dies after it began serving is replaced: a crash costs the
  service one process's share for a moment, not for good. Each worker's place
  backs off on its own: its first replacement starts at once, and each later
  one at least RESTART_GAP after the start before, then twice that, and so on
  up to RESTART_MAX, so that a worker that dies on every start (a poison
  request, a full disk) forks a few times a minute, not once a second for ever.
  A worker that lived STABLE seconds (from its fork) starts its place over. A
  signal to stop ends the waits at once.
- A worker of the first ones that dies before it served failed to start (its
  rules, its store, a port): the others are stopped and ``serve`` exits with that
  worker's code, as a single process that cannot start does. A replacement that
  cannot start (the rule file broken since, which the running workers' reloads
  refused) is tried again as a crash is, while the others serve on their rules.
- Each worker stops, as on SIGTERM, once the process that forked it is gone: a
  ``serve`` killed outright (SIGKILL, the OOM killer) forwards no signal, and
  workers left behind would go on serving its ports, on rules no one reloads,
  beside the next ``serve``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.context import ForkContext
from multiprocessing.synchronize import Event

from ..primitives import ConfigurationError, RatewardenError, StoreError

__all__ = ["PARENT_POLL", "RESTART_GAP", "RESTART_MAX", "STABLE", "Pace", "Ready", "supervise"]

log = logging.getLogger("ratewarden.server")

PARENT_POLL = 1.0  # seconds between a worker's looks for the process that forked it
RESTART_GAP = 1.0  # seconds between a place's first two replacements: no fork loop
RESTART_MAX = 30.0  # seconds: the longest a place waits for its next worker
STABLE = 60.0  # seconds a worker lives before its place's waits start again from the short one
_SLICE = 0.2  # seconds: how long a signal to stop may wait while a replacement is due

Ready = Callable[[], None]  # what a worker calls once it serves (its listeners open)
Target = Callable[[Ready], None]  # a worker's body: it serves until told to stop


class Pace:
    """When one worker's place may start its next replacement (the module's
    docstring says how it backs off). Times are ``time.monotonic()``'s."""

    def __init__(self) -> None:
        self.gap = RESTART_GAP
        self.free = -math.inf  # the earliest the next replacement may start

    def due(self, now: float, lived: float) -> float:
        """When to replace a worker that died at ``now``, ``lived`` seconds after
        it was forked."""
        if lived >= STABLE:
            self.gap = RESTART_GAP
            self.free = -math.inf
        at = max(now, self.free)
        self.free = at + self.gap
        self.gap = min(self.gap * 2, RESTART_MAX)
        return at


class _Worker:
    def __init__(
        self, context: ForkContext, target: Target, pace: Pace, *, replacement: bool = False
    ) -> None:
        self.pace = pace
        self.replacement = replacement
        self.started = time.monotonic()
        self.ready = context.Event()
        self.process = context.Process(
            target=_main, args=(target, os.getpid(), self.ready), daemon=False
        )
        self.process.start()

    def signal(self, number: int) -> None:
        if self.process.pid is not None and self.process.is_alive():
            os.kill(self.process.pid, number)


def _main(target: Target, parent: int, ready: Event) -> None:
    # A replacement is forked from a parent whose handlers forward signals to its
    # workers: run here, they would act on the parent's copies and fail. Until the
    # worker's event loop takes them over (before it calls ``ready``), a stop ends
    # a worker that serves nothing yet at once, with 0, and a reload is moot: its
    # rules are read as it starts.
    signal.signal(signal.SIGTERM, _stop_now)
    signal.signal(signal.SIGINT, _stop_now)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    threading.Thread(target=_stop_without, args=(parent,), name="ratewarden-parent",
                     daemon=True).start()  # fmt: skip
    try:
        target(ready.set)
    except (RatewardenError, OSError) as exc:  # said as `serve` alone says it
        print(f"ratewarden serve: {exc}", file=sys.stderr, flush=True)
        sys.exit(_code(exc))


def _stop_now(number: int, frame: object) -> None:
    # Not an exception: raised wherever the start has got to, inside an event
    # loop half made, it unwinds through the loop's shutdown, which waits for
    # every task to end and can wait for ever on one that a cancel does not end.
    # A worker that serves nothing yet has nothing to drain or flush.
    os._exit(0)


def _code(exc: BaseException) -> int:
    """The exit code `ratewarden serve` in one process gives the error (the CLI's
    codes, ratewarden.cli's main: the server does not import the CLI)."""
    if isinstance(exc, ConfigurationError | OSError):
        return 2  # a usage error, or a file or address that cannot be had
    if isinstance(exc, StoreError):
        return 3  # the store does not answer
    return 1


def _stop_without(parent: int) -> None:
    """Stop this worker as SIGTERM does (calls in flight finish) once ``parent`` is
    gone: the worker is then another process's child."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    log.warning("the parent process %d is gone: this worker stops", parent)
    os.kill(os.getpid(), signal.SIGTERM)


def supervise(count: int, target: Target, started: Callable[[], None] | None = None) -> int:
    """Run ``count`` workers of ``target`` until they stop (``started`` is called
    once they are forked); the exit code of the first that failed, 0 if none did.
    Call before anything starts a thread: the workers are forked."""
    context = multiprocessing.get_context("fork")
    workers = [_Worker(context, target, Pace()) for _ in range(count)]
    if started is not None:
        started()
    stopping = False

    def forward(number: int, frame: object) -> None:
        nonlocal stopping
        if number != signal.SIGHUP:
            stopping = True
        for worker in workers:
            worker.signal(number)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, forward)
    code = 0
    due: list[tuple[float, Pace]] = []  # replacements waiting for their time
    while True:
        if stopping:
            due.clear()
        now = time.monotonic()
        for entry in [entry for entry in due if entry[0] <= now]:
            due.remove(entry)
            worker = _Worker(context, target, entry[1], replacement=True)
            workers.append(worker)
            if stopping:  # a stop came while it was forked, maybe before the list had it
                worker.signal(signal.SIGTERM)
        if not workers and not due:
            return code
        # a replacement due later is waited for in slices: a signal to stop
        # (which retries the wait rather than ending it) is seen within one
        timeout = min(_SLICE, min(at for at, _ in due) - now) if due else None
        ended = wait([worker.process.sentinel for worker in workers], timeout)
        for worker in [w for w in workers if w.process.sentinel in ended]:
            worker.process.join()
            workers.remove(worker)
            exitcode = worker.process.exitcode or 0
            if stopping:
                code = code or exitcode
            elif not worker.ready.is_set() and not worker.replacement:
                log.error("a worker (pid %s) ended (%s) before it served: stopping the "
                          "others", worker.process.pid, _how(exitcode))  # fmt: skip
                code = code or exitcode or 1
                stopping = True
                for other in workers:
                    other.signal(signal.SIGTERM)
            else:
                now = time.monotonic()
                at = worker.pace.due(now, now - worker.started)
                wait_ = f" in {at - now:.1f} s" if at > now else ""
                if worker.ready.is_set():
                    log.error("a worker (pid %s) died (%s): starting another%s",
                              worker.process.pid, _how(exitcode), wait_)  # fmt: skip
                else:  # the rule file broken since, say: the others serve on meanwhile
                    log.error("a replacement worker (pid %s) ended (%s) before it served: "
                              "starting another%s", worker.process.pid, _how(exitcode),
                              wait_)  # fmt: skip
                due.append((at, worker.pace))


def _how(exitcode: int) -> str:
    """How a process ended, as an operator reads it: its code, or the signal."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        return f"killed by {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"killed by signal {-exitcode}"
