"""A mutex whose uncontended path is one C call each way.

``threading.Lock.acquire`` parses keyword arguments on every call: about 1,000
machine instructions for an acquire/release pair on CPython 3.11, a sixth of a whole
memory-store hit. A deque holding one token is a mutex too: ``pop`` takes the token
and ``append`` gives it back, each a single atomic call (atomic under the GIL, and
under free-threaded builds, where deques lock themselves), about 400 instructions
for the pair.

The contended path yields and retries. Contention is rare by design: the critical
sections guarded here are a dict read, a pure step and a dict write, with no I/O
and no user code, so another thread finds the token taken only when the holder was
preempted inside that microsecond. A thread that waits gives up the GIL each time
it retries, so the holder runs.
"""

from __future__ import annotations

import time
from collections import deque
from types import TracebackType

__all__ = ["TokenLock"]


class TokenLock:
    def __init__(self) -> None:
        tokens: deque[int] = deque((1,))
        self.take = tokens.pop  # raises IndexError when another thread holds it
        self.give = tokens.append  # give(1) releases
        self._tokens = tokens

    def wait(self) -> None:
        """The contended path of ``take``: retry until the holder gives the token back."""
        delay = 0.0
        while True:
            time.sleep(delay)  # releases the GIL, so the holder can finish
            try:
                self.take()
            except IndexError:
                delay = min(delay * 2 or 1e-6, 1e-3)
            else:
                return

    def acquire(self) -> None:
        try:
            self.take()
        except IndexError:
            self.wait()

    def release(self) -> None:
        self.give(1)

    def locked(self) -> bool:
        return not self._tokens

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<TokenLock {'locked' if self.locked() else 'unlocked'}>"
