"""A progress bar for the commands that may take more than a second.

Drawn on stderr, only when stderr is a terminal and the command does not print
JSON: a script reading stdout, or a log collecting stderr, never sees it.
Redrawn at most ten times a second, so that advancing it once per step of a
tight loop costs a clock read. ``spinning`` shows the time spent on one long
call that reports no progress (loading a large configuration), and only once
the call has lasted half a second.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["Progress", "spinning"]

WIDTH = 30
# Seconds before `spinning` draws anything: a quick call shows nothing.
SPIN_AFTER = 0.5


def _enabled(stream: TextIO, json: bool) -> bool:
    isatty = getattr(stream, "isatty", None)
    return not json and isatty is not None and bool(isatty())


class Progress:
    """``total`` units of work (checks, simulated seconds); `advance` by the units
    done, `close` to erase the bar. ``label`` is shown beside it."""

    def __init__(
        self, total: float, *, stream: TextIO | None = None, json: bool = False, label: str = ""
    ) -> None:
        self.total = max(total, 1e-9)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _enabled(self.stream, json)
        self.done = 0.0
        self.label = label
        self._drawn = 0.0
        self._width = 0

    def advance(self, amount: float) -> None:
        self.update(self.done + amount)

    def update(self, done: float) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn >= 0.1:
            self._drawn = now
            self._draw()

    def _draw(self) -> None:
        share = min(1.0, self.done / self.total)
        filled = int(WIDTH * share)
        text = f"\r[{'#' * filled}{'.' * (WIDTH - filled)}] {100 * share:3.0f}% {self.label[:40]}"
        self._width = max(self._width, len(text))
        self.stream.write(text.ljust(self._width))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def spinning(
    label: str, *, stream: TextIO | None = None, json: bool = False, after: float = SPIN_AFTER
) -> Iterator[None]:
    """While the block runs: ``label`` and the seconds spent, redrawn by a thread
    of its own, from ``after`` seconds on; erased when the block ends."""
    out = sys.stderr if stream is None else stream
    if not _enabled(out, json):
        yield
        return
    done = threading.Event()
    started = time.monotonic()
    drawn = [0]

    def draw() -> None:
        if done.wait(after):
            return
        while True:
            text = f"\r{label[:60]} {time.monotonic() - started:4.1f}s"
            drawn[0] = max(drawn[0], len(text))
            out.write(text)
            out.flush()
            if done.wait(0.1):
                return

    thread = threading.Thread(target=draw, name="ratewarden-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if drawn[0]:
            out.write("\r" + " " * drawn[0] + "\r")
            out.flush()
